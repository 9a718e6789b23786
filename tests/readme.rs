//! The README's library examples, as a user outside this repository would run them: the Rust
//! block after each `readme-example` marker in README.md becomes the `main.rs` of a throwaway
//! crate in a temporary folder, which depends on the facade by path (ONNX Runtime backend and
//! `hub`), is built with the workspace's lock file and run.
//!
//! * `readme-example`: the folder example. Only the model path is replaced, by the committed
//!   tiny test model.
//! * `readme-example-hub`: the model-id example, run verbatim against the loopback mock Hub
//!   (`HF_ENDPOINT`), which serves the tiny test model under the README's id, into an empty
//!   cache (`HF_HUB_CACHE`); then again with `HF_HUB_OFFLINE=1`, from that cache.
//!
//! Each test fails if the README's code stops compiling or stops producing a vector.
//!
//! The crates' build folder is `target/readme-crate/` (kept, so reruns are incremental).

use std::path::Path;
use std::process::Command;

use ruri_testkit::{repo_root, tiny_model_dir};

/// The model path the README's example names.
const README_MODEL: &str = "path/to/ruri-v3-30m-ONNX";

/// The Rust block after `marker` (the whole marker word, so `readme-example` does not match
/// `readme-example-hub`).
fn readme_example(readme: &str, marker: &str) -> String {
    let marker = format!("<!-- {marker}:");
    let at = readme
        .find(&marker)
        .unwrap_or_else(|| panic!("README.md has a {marker} marker"));
    let rest = &readme[at..];
    let start = rest
        .find("```rust\n")
        .expect("a rust block after the marker")
        + 8;
    let end = rest[start..].find("```").expect("the block ends");
    rest[start..start + end].to_owned()
}

fn toml_path(path: &Path) -> String {
    path.display().to_string().replace('\\', "/")
}

/// Builds `code` as the `main.rs` of the crate `name` outside the workspace and runs it with
/// `envs` (a `None` value removes the variable), returning its stdout.
fn run_outside(name: &str, code: &str, envs: &[(&str, Option<&str>)]) -> String {
    let root = repo_root();
    let krate = ruri_testkit::TempDir::new().unwrap();
    std::fs::create_dir(krate.path().join("src")).unwrap();
    std::fs::write(krate.path().join("src/main.rs"), code).unwrap();
    std::fs::write(
        krate.path().join("Cargo.toml"),
        format!(
            r#"[package]
name = "{name}"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
ruri = {{ path = "{}", default-features = false, features = ["native", "ort", "hub"] }}

[workspace]
"#,
            toml_path(&root)
        ),
    )
    .unwrap();
    // The workspace's versions of every dependency, and no network.
    std::fs::copy(root.join("Cargo.lock"), krate.path().join("Cargo.lock")).unwrap();

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["run", "--quiet", "--offline"])
        .current_dir(krate.path())
        .env("CARGO_TARGET_DIR", root.join("target").join("readme-crate"));
    for (key, value) in envs {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let output = command.output().expect("cargo runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the README example {name} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

#[test]
fn the_readme_example_runs_in_a_crate_outside_the_workspace() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let code = readme_example(&readme, "readme-example");
    assert!(
        code.contains(README_MODEL),
        "the example names {README_MODEL}"
    );
    let code = code.replace(README_MODEL, &toml_path(&tiny_model_dir()));
    let stdout = run_outside("readme-example", &code, &[]);
    // The tiny model has 64 dimensions; the example prints them and its best match.
    assert!(
        stdout.contains("64 dimensions, best match: [("),
        "unexpected output: {stdout}"
    );
}

#[test]
fn the_readme_model_id_example_runs_against_the_mock_hub_then_offline() {
    use ruri_testkit::hub_mock::{self, MockHub, TINY_MIRROR_REPO};

    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let code = readme_example(&readme, "readme-example-hub");
    let id = code
        .split("build_from_hub(\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the example calls build_from_hub with a model id")
        .to_owned();
    // The tiny test model, served under the README's id.
    let mut repo = hub_mock::tiny_repos()
        .into_iter()
        .find(|r| r.id == TINY_MIRROR_REPO)
        .expect("the mirror repository");
    repo.id = id.clone();
    let mock = MockHub::start(vec![repo]);
    let cache = ruri_testkit::TempDir::new().unwrap();
    let endpoint = mock.endpoint();
    let cache_dir = cache.path().to_str().unwrap();
    let online = [
        ("HF_ENDPOINT", Some(endpoint.as_str())),
        ("HF_HUB_CACHE", Some(cache_dir)),
        ("HF_TOKEN", None),
        ("HF_HUB_OFFLINE", None),
    ];
    let stdout = run_outside("readme-example-hub", &code, &online);
    assert!(
        stdout.contains("64 dimensions"),
        "unexpected output: {stdout}"
    );
    let folder = cache
        .path()
        .join(format!("models--{}", id.replace('/', "--")));
    assert!(folder.join("refs/main").is_file(), "{}", folder.display());

    let requests = mock.requests().len();
    let offline = [
        ("HF_ENDPOINT", Some(endpoint.as_str())),
        ("HF_HUB_CACHE", Some(cache_dir)),
        ("HF_TOKEN", None),
        ("HF_HUB_OFFLINE", Some("1")),
    ];
    let stdout = run_outside("readme-example-hub", &code, &offline);
    assert!(
        stdout.contains("64 dimensions"),
        "unexpected output: {stdout}"
    );
    assert_eq!(mock.requests().len(), requests, "offline asked the Hub");
}
