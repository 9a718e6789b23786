//! `ruri quantize` as a user runs it: the binary writes ruri's int8 file into a copy of the
//! committed tiny model, and `ruri embed --prequantized` then prints the same vectors, byte
//! for byte, as quantizing `model.safetensors` at load.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use ruri_testkit::{copy_model, tiny_model_dir};

fn ruri(args: &[&str], dir: Option<&Path>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ruri"));
    command.args(args);
    if let Some(dir) = dir {
        command.arg(dir);
    }
    command.env_remove("RURI_CLI_TEST_STOP_AFTER_CHUNKS");
    command
}

fn run(mut command: Command, stdin: &[u8]) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the ruri binary runs");
    match child.stdin.take().unwrap().write_all(stdin) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `ruri embed` at int8 on `dir`, three texts on stdin, plus `args`.
fn embed(dir: &Path, args: &[&str]) -> Output {
    let mut command = ruri(
        &["embed", "--backend", "native", "--precision", "int8"],
        None,
    );
    command.arg("--model").arg(dir).args(args);
    run(
        command,
        "瑠璃色はどんな色？\n検索文書: 瑠璃色は紫みを帯びた濃い青。\n空\n".as_bytes(),
    )
}

fn tiny_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_model(&tiny_model_dir(), dir.path(), &|n| !n.starts_with("onnx/"));
    dir
}

#[test]
fn the_help_names_the_file_and_the_options() {
    let out = run(ruri(&["quantize", "--help"], None), b"");
    assert!(out.status.success(), "{}", stderr(&out));
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "model.ruri-int8.safetensors",
        "--embedding-table",
        "--out",
        "--no-outlier-channels",
        "--prequantized",
    ] {
        assert!(help.contains(needle), "{needle} not in:\n{help}");
    }
    let out = run(ruri(&["--help"], None), b"");
    assert!(String::from_utf8_lossy(&out.stdout).contains("quantize"));
}

#[test]
fn prequantized_embeds_the_same_vectors() {
    let dir = tiny_copy();
    let out = run(
        ruri(&["quantize", "--embedding-table", "f32"], Some(dir.path())),
        b"",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("wrote"), "{}", stderr(&out));
    let file = dir.path().join("model.ruri-int8.safetensors");
    assert!(file.is_file());
    let want = embed(&tiny_model_dir(), &[]);
    assert!(want.status.success(), "{}", stderr(&want));
    let got = embed(dir.path(), &["--prequantized"]);
    assert!(got.status.success(), "{}", stderr(&got));
    assert_eq!(String::from_utf8_lossy(&got.stdout).lines().count(), 3);
    assert_eq!(got.stdout, want.stdout);
    // Without model.safetensors too: only the int8 file is read.
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let got = embed(dir.path(), &["--prequantized"]);
    assert!(got.status.success(), "{}", stderr(&got));
    assert_eq!(got.stdout, want.stdout);
}

#[test]
fn an_int8_table_file_is_smaller_and_loads() {
    let dir = tiny_copy();
    let out_file = dir.path().join("other.safetensors");
    let mut command = ruri(&["quantize"], Some(dir.path()));
    command.arg("--out").arg(&out_file);
    let out = run(command, b"");
    assert!(out.status.success(), "{}", stderr(&out));
    let int8 = std::fs::metadata(&out_file).unwrap().len();
    let fp32 = std::fs::metadata(dir.path().join("model.safetensors"))
        .unwrap()
        .len();
    assert!(int8 * 3 < fp32, "{int8} bytes against {fp32}");
    std::fs::rename(&out_file, dir.path().join("model.ruri-int8.safetensors")).unwrap();
    let got = embed(dir.path(), &["--prequantized"]);
    assert!(got.status.success(), "{}", stderr(&got));
    assert_eq!(String::from_utf8_lossy(&got.stdout).lines().count(), 3);
}

#[test]
fn mistakes_are_named() {
    // No file to read.
    let out = embed(&tiny_model_dir(), &["--prequantized"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("model.ruri-int8.safetensors"),
        "{}",
        stderr(&out)
    );
    // fp32 cannot read int8 weights.
    let mut command = ruri(&["embed", "--backend", "native", "--prequantized"], None);
    command.arg("--model").arg(tiny_model_dir());
    let out = run(command, b"a\n");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("prequantized"), "{}", stderr(&out));
    // A folder that is not a model.
    let empty = tempfile::tempdir().unwrap();
    let out = run(ruri(&["quantize"], Some(empty.path())), b"");
    assert!(!out.status.success());
    assert!(stderr(&out).starts_with("error: "), "{}", stderr(&out));
}
