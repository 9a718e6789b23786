//! The `ruri-server` binary's command line, run as a process: `--help` documents every flag
//! with its environment variable, and bad start-ups fail at once with a message, before the
//! server listens.

use std::process::{Command, Output};

fn ruri_server(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ruri-server"));
    command.args(args);
    // The caller's environment must not leak settings into these tests.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RURI_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("running ruri-server")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn help_lists_every_flag_with_its_environment_variable() {
    let output = ruri_server(&["--help"], &[]);
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for (flag, env) in [
        ("--addr", "RURI_ADDR"),
        ("--model", "RURI_MODEL"),
        ("--backend", "RURI_BACKEND"),
        ("--precision", "RURI_PRECISION"),
        ("--onnx-file", "RURI_ONNX_FILE"),
        ("--whitespace", "RURI_WHITESPACE"),
        ("--threads", "RURI_THREADS"),
        ("--sessions", "RURI_SESSIONS"),
        ("--model-name", "RURI_MODEL_NAME"),
        ("--default-prompt-name", "RURI_DEFAULT_PROMPT_NAME"),
        ("--max-body-bytes", "RURI_MAX_BODY_BYTES"),
        ("--max-inputs", "RURI_MAX_INPUTS"),
        ("--max-queue-tokens", "RURI_MAX_QUEUE_TOKENS"),
        ("--max-merge-tokens", "RURI_MAX_MERGE_TOKENS"),
    ] {
        assert!(help.contains(flag), "{flag} not in\n{help}");
        assert!(
            help.contains(&format!("[env: {env}=")),
            "{env} not in\n{help}"
        );
    }
    assert!(help.contains("RURI_API_KEY"), "{help}");
    // The default backend, as --help shows it.
    let backend = help
        .split("--backend <BACKEND>")
        .nth(1)
        .and_then(|rest| rest.split("--precision <PRECISION>").next())
        .expect("--backend's help");
    assert!(
        backend.contains("[default: native]") && backend.contains("[env: RURI_BACKEND="),
        "{backend}"
    );
}

#[test]
fn without_a_model_it_says_how_to_give_one() {
    let output = ruri_server(&[], &[]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(message.contains("--model"), "{message}");
}

#[test]
fn flags_come_from_the_environment() {
    // RURI_MODEL satisfies the required flag; RURI_PRECISION's impossible value then fails
    // before anything loads or listens, on the default backend (native) and on RURI_BACKEND.
    let output = ruri_server(&[], &[("RURI_MODEL", "m"), ("RURI_PRECISION", "bf16")]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("error: invalid option precision = bf16: ")
            && message.contains("the native engine runs fp32 and int8"),
        "{message}"
    );
    let output = ruri_server(
        &[],
        &[
            ("RURI_MODEL", "m"),
            ("RURI_PRECISION", "bf16"),
            ("RURI_BACKEND", "ort"),
        ],
    );
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("error: invalid option precision = bf16: ")
            && message.contains("ONNX Runtime runs fp32, int8 and fp16; bf16 needs backend candle"),
        "{message}"
    );
    // A flag on the command line wins over its variable.
    let output = ruri_server(
        &[
            "--precision",
            "bf16",
            "--backend",
            "candle",
            "--threads",
            "2",
        ],
        &[("RURI_MODEL", "m"), ("RURI_BACKEND", "ort")],
    );
    let message = stderr(&output);
    assert!(message.contains("ONNX Runtime options"), "{message}");
}

#[test]
fn an_empty_api_key_is_refused() {
    let output = ruri_server(&["--model", "m"], &[("RURI_API_KEY", "")]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("RURI_API_KEY is set but empty"),
        "{message}"
    );
}

#[test]
fn a_busy_port_fails_at_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let output = ruri_server(&["--model", "m", "--addr", &addr], &[]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains(&format!("cannot listen on {addr}")),
        "{message}"
    );
}
