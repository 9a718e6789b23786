//! Every front end reaches the same loader configuration (`ruri::EmbedderConfig`) and the
//! same refusal for every backend × precision × graph: the examples' flags
//! (`ruri::cli::ModelArgs`), ruri-server's flags and its `RURI_*` variables, and the names
//! ruri-python's constructor parses (`EmbedderConfig::from_names`, which `ruri._ruri.Engine`
//! calls). Front ends choose the graph only through `--onnx-file` (an ONNX file, or the
//! automatic choice); the fused-graph combinations are checked on the config itself in the
//! facade's unit tests. With nothing named, every front end gets the default: the native
//! engine at fp32.
//!
//! One test in this binary: it sets `RURI_*` variables of the process, which no other test
//! may read meanwhile.

use std::ffi::OsString;

use clap::Parser;
use ruri::{AttentionPrecision, BackendKind, EmbedderConfig, Error, Precision, Whitespace};

/// The examples' command line: the facade's model flags, as `examples/embed.rs` flattens them.
#[derive(Parser)]
struct ExampleArgs {
    #[command(flatten)]
    model: ruri::cli::ModelArgs,
}

/// The refusal the loader owes each combination, as (option, value): written from the
/// backends' documented precisions (ort: fp32, int8, fp16; candle: fp32, bf16, fp16, and no
/// ONNX files; native: fp32, int8, and no ONNX files), not computed by the loader.
fn refusal(
    backend: &str,
    precision: &str,
    onnx_file: bool,
) -> Option<(&'static str, &'static str)> {
    match (backend, precision, onnx_file) {
        ("ort", "bf16", _) => Some(("precision", "bf16")),
        ("candle", "int8", _) => Some(("precision", "int8")),
        ("candle", _, true) => Some(("onnx_file", "model.onnx")),
        ("native", "fp16" | "bf16", _) => Some((
            "precision",
            if precision == "fp16" { "fp16" } else { "bf16" },
        )),
        ("native", _, true) => Some(("onnx_file", "model.onnx")),
        _ => None,
    }
}

/// An `InvalidOption`'s option and value, with its whole message.
fn refused(result: ruri::Result<()>) -> Option<(&'static str, String, String)> {
    let error = result.err()?;
    let message = ruri::error_chain(&error).to_string();
    match error {
        Error::InvalidOption { name, value, .. } => Some((name, value, message)),
        other => panic!("not an InvalidOption: {other}"),
    }
}

/// Makes `vars` the process's only `RURI_*` variables: a variable left by an earlier case
/// would otherwise stand in for a flag the next case leaves out.
fn set_ruri_env(vars: &[(&str, &str)]) {
    let names: Vec<OsString> = std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| name.to_string_lossy().starts_with("RURI_"))
        .collect();
    // SAFETY: this binary's only test runs on one thread, and nothing else reads the
    // environment meanwhile (see the module docs).
    unsafe {
        for name in names {
            std::env::remove_var(name);
        }
        for (name, value) in vars {
            std::env::set_var(name, value);
        }
    }
}

/// ruri-server's command line with `flags` and no `RURI_*` variable.
fn server_from_flags(flags: &[&str]) -> ruri_server::cli::Args {
    set_ruri_env(&[]);
    ruri_server::cli::Args::try_parse_from(flags).expect("parsing the flags")
}

/// ruri-server's command line with no flag and the `RURI_*` variables `vars`.
fn server_from_env(vars: &[(&str, &str)]) -> ruri_server::cli::Args {
    set_ruri_env(vars);
    ruri_server::cli::Args::try_parse_from(["ruri-server"]).expect("parsing the environment")
}

/// `--model m --backend B --precision P`.
fn model_flags<'a>(backend: &'a str, precision: &'a str) -> Vec<&'a str> {
    vec![
        "--model",
        "m",
        "--backend",
        backend,
        "--precision",
        precision,
    ]
}

#[test]
fn every_front_end_reaches_the_same_config_and_the_same_refusal() {
    let mut checked = 0;
    for backend in ["ort", "candle", "native"] {
        for precision in ["fp32", "int8", "fp16", "bf16"] {
            for whitespace in ["keep", "strip"] {
                for onnx_file in [false, true] {
                    let case = format!("{backend} {precision} {whitespace} onnx_file={onnx_file}");
                    let mut flags = model_flags(backend, precision);
                    flags.extend(["--whitespace", whitespace]);
                    let mut vars = vec![
                        ("RURI_MODEL", "m"),
                        ("RURI_BACKEND", backend),
                        ("RURI_PRECISION", precision),
                        ("RURI_WHITESPACE", whitespace),
                    ];
                    if onnx_file {
                        flags.extend(["--onnx-file", "model.onnx"]);
                        vars.push(("RURI_ONNX_FILE", "model.onnx"));
                    }

                    // The configuration each flag documents, spelled with the setters.
                    let mut wanted = EmbedderConfig::new()
                        .backend(match backend {
                            "ort" => BackendKind::Ort,
                            "candle" => BackendKind::Candle,
                            _ => BackendKind::Native,
                        })
                        .precision(match precision {
                            "fp32" => Precision::Fp32,
                            "int8" => Precision::Int8,
                            "fp16" => Precision::Fp16,
                            _ => Precision::Bf16,
                        })
                        .whitespace(match whitespace {
                            "keep" => Whitespace::Keep,
                            _ => Whitespace::Strip,
                        });
                    if onnx_file {
                        wanted = wanted.onnx_file("model.onnx");
                    }

                    let mut argv = vec!["prog"];
                    argv.extend(&flags);
                    let example = ExampleArgs::try_parse_from(&argv).unwrap().model.config();
                    let server = server_from_flags(&argv).embedder_config();
                    let server_env = server_from_env(&vars).embedder_config();
                    let mut front_ends = vec![
                        ("examples", example),
                        ("server flags", server),
                        ("server environment", server_env),
                    ];
                    // ruri-python has no onnx_file argument.
                    if !onnx_file {
                        let python =
                            EmbedderConfig::from_names(backend, precision, whitespace).unwrap();
                        front_ends.push(("python", python));
                    }

                    let expected = refusal(backend, precision, onnx_file);
                    let mut messages = Vec::new();
                    for (front_end, config) in &front_ends {
                        assert_eq!(config, &wanted, "{front_end}: {case}");
                        let got = refused(config.validate());
                        assert_eq!(
                            got.as_ref().map(|(name, value, _)| (*name, value.as_str())),
                            expected,
                            "{front_end}: {case}"
                        );
                        messages.push(got.map(|(_, _, message)| message));
                    }
                    assert!(
                        messages.windows(2).all(|pair| pair[0] == pair[1]),
                        "{case}: {messages:?}"
                    );
                    // The server refuses before listening with that same message.
                    let server = server_from_flags(&argv);
                    match (server.config(), &messages[0]) {
                        (Ok(_), None) => {}
                        (Err(message), Some(expected)) => assert_eq!(&message, expected, "{case}"),
                        (got, expected) => {
                            panic!("{case}: config() gave {got:?}, wanted {expected:?}")
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 3 * 4 * 2 * 2);

    // Nothing named: every front end gets the loader's defaults, the native engine at fp32
    // (Python's `backend=None` is `ruri._ruri.DEFAULT_BACKEND`, `BackendKind::best()`; its
    // precision default, int8, is the Python package's own and tested in its pytest suite).
    let defaults = [
        (
            "examples",
            ExampleArgs::try_parse_from(["prog"])
                .unwrap()
                .model
                .config(),
        ),
        (
            "server flags",
            server_from_flags(&["ruri-server", "--model", "m"]).embedder_config(),
        ),
        (
            "server environment",
            server_from_env(&[("RURI_MODEL", "m")]).embedder_config(),
        ),
        (
            "python",
            EmbedderConfig::from_names(BackendKind::best().name(), "fp32", "keep").unwrap(),
        ),
    ];
    for (front_end, config) in &defaults {
        assert_eq!(config, &EmbedderConfig::new(), "{front_end}");
        assert_eq!(config.get_backend(), BackendKind::Native, "{front_end}");
        assert_eq!(config.get_precision(), Precision::Fp32, "{front_end}");
        assert!(config.validate().is_ok(), "{front_end}");
    }
    // The server's GET /info reports it.
    let info = server_from_flags(&["ruri-server", "--model", "m"])
        .config()
        .unwrap();
    assert_eq!(info.backend.as_deref(), Some("native"));

    // ONNX Runtime's options with candle: the server's flags, its variables and Python's
    // keyword get one refusal (ruri's Python package raises UnsupportedArgumentError before
    // the engine sees them; the engine would give this same error).
    let flags = server_from_flags(&[
        "ruri-server",
        "--model",
        "m",
        "--backend",
        "candle",
        "--threads",
        "2",
    ])
    .embedder_config();
    let env = server_from_env(&[
        ("RURI_MODEL", "m"),
        ("RURI_BACKEND", "candle"),
        ("RURI_THREADS", "2"),
    ])
    .embedder_config();
    let python = EmbedderConfig::from_names("candle", "fp32", "keep")
        .unwrap()
        .threads(2);
    for config in [&flags, &env, &python] {
        assert_eq!(config, &python);
        let (name, value, message) = refused(config.validate()).expect("refused");
        assert_eq!((name, value.as_str()), ("threads", "2"));
        assert!(message.contains("ONNX Runtime options"), "{message}");
    }

    // ruri's int8 file: `--prequantized`, `RURI_PREQUANTIZED=true` and Python's
    // `prequantized=True` (ruri-python passes it to `EmbedderConfig::prequantized`) reach one
    // config: accepted on native at int8, refused with one message on native at fp32 and on
    // ort.
    for (backend, precision, accepted) in [
        ("native", "int8", true),
        ("native", "fp32", false),
        ("ort", "int8", false),
    ] {
        let mut argv = vec!["ruri-server"];
        argv.extend(model_flags(backend, precision));
        argv.push("--prequantized");
        let example = ExampleArgs::try_parse_from(&argv).unwrap().model.config();
        let flags = server_from_flags(&argv).embedder_config();
        let env = server_from_env(&[
            ("RURI_MODEL", "m"),
            ("RURI_BACKEND", backend),
            ("RURI_PRECISION", precision),
            ("RURI_PREQUANTIZED", "true"),
        ])
        .embedder_config();
        let python = EmbedderConfig::from_names(backend, precision, "keep")
            .unwrap()
            .prequantized(true);
        let mut messages = Vec::new();
        for config in [&example, &flags, &env] {
            assert_eq!(config, &python, "{backend} {precision}");
            let got = refused(config.validate());
            assert_eq!(got.is_none(), accepted, "{backend} {precision}: {got:?}");
            if let Some((name, value, message)) = got {
                assert_eq!((name, value.as_str()), ("prequantized", "true"));
                messages.push(message);
            }
        }
        assert!(messages.windows(2).all(|pair| pair[0] == pair[1]));
        // Without the flag the server's config does not ask for the file.
        let plain = server_from_flags(&argv[..argv.len() - 1]).embedder_config();
        assert_ne!(plain, python, "{backend} {precision}");
    }

    // bf16 and int13 attention: `--attention NAME`, `RURI_ATTENTION=NAME` and Python's
    // `attention="NAME"` (ruri-python parses it with `AttentionPrecision::from_str` and passes
    // it to `EmbedderConfig::attention`) reach one config: accepted on native at fp32 and
    // int8, refused with one message on ort and candle.
    let cases = [
        ("native", "int8", true),
        ("native", "fp32", true),
        ("ort", "int8", false),
        ("candle", "fp32", false),
    ];
    let attentions = [
        ("bf16", AttentionPrecision::Bf16),
        ("int13", AttentionPrecision::Int13),
    ];
    for ((backend, precision, accepted), (attention, wanted)) in cases
        .into_iter()
        .flat_map(|case| attentions.map(|a| (case, a)))
    {
        let mut argv = vec!["ruri-server"];
        argv.extend(model_flags(backend, precision));
        argv.extend(["--attention", attention]);
        let example = ExampleArgs::try_parse_from(&argv).unwrap().model.config();
        let flags = server_from_flags(&argv).embedder_config();
        let env = server_from_env(&[
            ("RURI_MODEL", "m"),
            ("RURI_BACKEND", backend),
            ("RURI_PRECISION", precision),
            ("RURI_ATTENTION", attention),
        ])
        .embedder_config();
        let python = EmbedderConfig::from_names(backend, precision, "keep")
            .unwrap()
            .attention(attention.parse::<AttentionPrecision>().unwrap());
        assert_eq!(python.get_attention(), wanted);
        let mut messages = Vec::new();
        for config in [&example, &flags, &env] {
            assert_eq!(config, &python, "{backend} {precision}");
            match (accepted, refused(config.validate())) {
                // A build without native refuses it by its feature.
                (true, got) => assert_eq!(
                    got.is_none(),
                    BackendKind::Native.is_compiled(),
                    "{backend} {precision}: {got:?}"
                ),
                (false, Some((name, value, message))) => {
                    assert_eq!((name, value.as_str()), ("attention", attention));
                    messages.push(message);
                }
                (false, None) => panic!("{backend} {precision}: {attention} attention accepted"),
            }
        }
        assert!(messages.windows(2).all(|pair| pair[0] == pair[1]));
        // Without the flag the config is the default's: int13 at native int8, else f32.
        let plain = server_from_flags(&argv[..argv.len() - 2]).embedder_config();
        let default = match (backend, precision) {
            ("native", "int8") => AttentionPrecision::Int13,
            _ => AttentionPrecision::F32,
        };
        assert_eq!(plain.get_attention(), default, "{backend} {precision}");
        assert_ne!(plain, python, "{backend} {precision}");
    }
    set_ruri_env(&[]);
}
