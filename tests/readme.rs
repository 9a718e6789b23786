//! The README's library example, as a user outside this repository would run it: the Rust
//! block after the `readme-example` marker in README.md becomes the `main.rs` of a throwaway
//! crate in a temporary folder, which depends on the facade by path (ONNX Runtime backend
//! only), is built with the workspace's lock file and run. Only the model path is replaced,
//! by the committed tiny test model; the test fails if the README's code stops compiling or
//! stops producing a vector.
//!
//! The crate's build folder is `target/readme-crate/` (kept, so reruns are incremental).

use std::path::Path;
use std::process::Command;

use ruri_testkit::{repo_root, tiny_model_dir};

/// The model path the README's example names.
const README_MODEL: &str = "path/to/ruri-v3-30m-ONNX";

fn readme_example(readme: &str) -> String {
    let marker = readme
        .find("<!-- readme-example")
        .expect("README.md has a readme-example marker");
    let rest = &readme[marker..];
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

#[test]
fn the_readme_example_runs_in_a_crate_outside_the_workspace() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let code = readme_example(&readme);
    assert!(
        code.contains(README_MODEL),
        "the example names {README_MODEL}"
    );
    let code = code.replace(README_MODEL, &toml_path(&tiny_model_dir()));

    let krate = ruri_testkit::TempDir::new().unwrap();
    std::fs::create_dir(krate.path().join("src")).unwrap();
    std::fs::write(krate.path().join("src/main.rs"), code).unwrap();
    std::fs::write(
        krate.path().join("Cargo.toml"),
        format!(
            r#"[package]
name = "readme-example"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
ruri = {{ path = "{}", default-features = false, features = ["ort"] }}

[workspace]
"#,
            toml_path(&root)
        ),
    )
    .unwrap();
    // The workspace's versions of every dependency, and no network.
    std::fs::copy(root.join("Cargo.lock"), krate.path().join("Cargo.lock")).unwrap();

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["run", "--quiet", "--offline"])
        .current_dir(krate.path())
        .env("CARGO_TARGET_DIR", root.join("target").join("readme-crate"))
        .output()
        .expect("cargo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the README example failed:\n{stdout}\n{stderr}"
    );
    // The tiny model has 64 dimensions; the example prints them and its best match.
    assert!(
        stdout.contains("64 dimensions, best match: [("),
        "unexpected output: {stdout}"
    );
}
