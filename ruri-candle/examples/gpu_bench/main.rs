//! The candle backend's GPU check in one command (`tools/cuda/README.md`): parity, throughput
//! at several batch budgets, single-query latency, peak memory and the copy share of a
//! batch, written as `results.json` and `results.md` into the folder named first.
//!
//! ```sh
//! gpu_bench OUT_DIR [--device cuda:0|cpu] [--dtypes bf16,f16,f32] [--budgets 16384,32768]
//!           [--texts N] [--seconds S] [--shape 30m|70m|130m|310m] [--model DIR]
//!           [--parity PATH|none]
//! ```
//!
//! * Parity: runs the parity test binary (`tests/parity.rs` built with `--features cuda`;
//!   default: `parity` next to this binary) on this device's cases — `cuda_` on a GPU,
//!   `candle_cpu_` on CPU — and collects the figures it prints. Needs `RURI_TESTDATA` when
//!   the binary runs away from its checkout.
//! * Throughput: a model of the Ruri v3 shape (30m by default) with random weights made on
//!   the spot (`--model` takes a folder instead), on a workload of texts from 16 to 512
//!   tokens, for each dtype and each padded-token budget (`ruri_candle::gpu_batching`).
//! * Latency: one query at a time, with the device's advised batching.
//! * Peak memory: the CUDA memory pool's high-water mark (candle's tensors) per budget; on
//!   CPU the process's peak resident set.
//!
//! Builds without the `cuda` feature too (then only `--device cpu` runs); in a default build:
//! `cargo run --release -p ruri-candle --example gpu_bench -- /tmp/out --device cpu`.

mod measure;
mod memory;
mod model;
mod parity;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ruri_candle::{CandleBackend, DType, Device, GPU_MAX_BATCH_TOKENS, LocalAttention};
use ruri_core::{BatchOptions, ModelDir, TextEmbedder};
use serde_json::{Value, json};

use measure::Shared;
use memory::Probe;

/// Errors of any part, reported at the end with their cause.
pub type Failure = Box<dyn std::error::Error>;

struct Args {
    out: PathBuf,
    device: Device,
    dtypes: Vec<DType>,
    budgets: Vec<usize>,
    texts: usize,
    seconds: f64,
    shape: model::Shape,
    model: Option<PathBuf>,
    /// `None`: `--parity none`.
    parity: Option<PathBuf>,
}

const USAGE: &str = "usage: gpu_bench OUT_DIR [--device cuda:0|cpu] [--dtypes bf16,f16,f32] \
    [--budgets 16384,32768,65536,131072] [--texts N] [--seconds S] \
    [--shape 30m|70m|130m|310m] [--model DIR] [--parity PATH|none]";

fn parse_list<T>(value: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    value
        .split(',')
        .map(|item| parse(item.trim()).ok_or_else(|| format!("cannot read {item:?}")))
        .collect()
}

fn parse_dtype(name: &str) -> Option<DType> {
    match name {
        "f32" => Some(DType::F32),
        "bf16" => Some(DType::BF16),
        "f16" => Some(DType::F16),
        _ => None,
    }
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    }
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut out = None;
    let mut device = Device::Cuda(0);
    let (mut dtypes, mut budgets, mut texts, mut seconds) = (None, None, None, None);
    let (mut shape, mut model, mut parity) = (model::SHAPES[0], None, Some(None));
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--device" => {
                let v = value()?;
                device = match v.as_str() {
                    "cpu" => Device::Cpu,
                    other => other
                        .strip_prefix("cuda:")
                        .and_then(|n| n.parse().ok())
                        .map(Device::Cuda)
                        .ok_or_else(|| format!("--device {other}: expected cpu or cuda:N"))?,
                }
            }
            "--dtypes" => dtypes = Some(parse_list(&value()?, parse_dtype)?),
            "--budgets" => budgets = Some(parse_list(&value()?, |b| b.parse().ok())?),
            "--texts" => texts = Some(value()?.parse().map_err(|e| format!("--texts: {e}"))?),
            "--seconds" => seconds = Some(value()?.parse().map_err(|e| format!("--seconds: {e}"))?),
            "--shape" => {
                let v = value()?;
                shape = *model::SHAPES
                    .iter()
                    .find(|s| s.name == v)
                    .ok_or_else(|| format!("--shape {v}: expected 30m, 70m, 130m or 310m"))?;
            }
            "--model" => model = Some(PathBuf::from(value()?)),
            "--parity" => {
                let v = value()?;
                parity = (v != "none").then(|| Some(PathBuf::from(v)));
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            other if out.is_none() => out = Some(PathBuf::from(other)),
            other => return Err(format!("unexpected argument {other}")),
        }
    }
    let gpu = matches!(device, Device::Cuda(_));
    // A GPU sweeps the 16k–128k budgets on 4,096 texts for 5 s each; the CPU (2 shared
    // cores here) runs the same steps on a workload it finishes in about a minute.
    let parity = match parity {
        Some(Some(path)) => Some(path),
        Some(None) => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("parity")))
            .filter(|path| path.is_file()),
        None => None,
    };
    Ok(Args {
        out: out.ok_or(USAGE)?,
        device,
        dtypes: dtypes.unwrap_or_else(|| {
            if gpu {
                vec![DType::BF16, DType::F16, DType::F32]
            } else {
                vec![DType::F32]
            }
        }),
        budgets: budgets.unwrap_or_else(|| {
            if gpu {
                vec![16_384, 32_768, 65_536, 131_072]
            } else {
                vec![2_048, 8_192]
            }
        }),
        texts: texts.unwrap_or(if gpu { 4096 } else { 48 }),
        seconds: seconds.unwrap_or(if gpu { 5.0 } else { 0.0 }),
        shape,
        model,
        parity,
    })
}

fn candle_device(device: Device) -> Result<candle_core::Device, Failure> {
    match device {
        Device::Cuda(ordinal) if cfg!(feature = "cuda") => {
            Ok(candle_core::Device::new_cuda(ordinal)?)
        }
        Device::Cuda(_) => Err("this gpu_bench was built without the `cuda` feature".into()),
        _ => Ok(candle_core::Device::Cpu),
    }
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    match run(&args) {
        Ok(all_passed) => std::process::exit(if all_passed { 0 } else { 1 }),
        Err(e) => {
            // One cause a line: a CUDA failure's chain is long.
            eprintln!("gpu_bench: {:#}", ruri_core::error_chain(&*e));
            std::process::exit(1);
        }
    }
}

/// Everything, in order; returns whether the parity tests passed (or were not asked for).
fn run(args: &Args) -> Result<bool, Failure> {
    let started = Instant::now();
    std::fs::create_dir_all(&args.out)?;
    let device = candle_device(args.device)?;
    let probe = Probe::new(&device)?;
    eprintln!("device: {}", probe.describe());

    let parity = match &args.parity {
        Some(binary) => {
            let filter = match args.device {
                Device::Cpu => "candle_cpu_",
                _ => "cuda_",
            };
            eprintln!("parity: {} {filter}", binary.display());
            let run = parity::run(binary, filter, &args.out.join("parity.log"))?;
            eprintln!(
                "parity: {} in {:.1} s",
                run.summary.as_deref().unwrap_or("no summary"),
                run.seconds
            );
            Some(run)
        }
        None => {
            eprintln!("parity: skipped (no parity binary next to gpu_bench, or --parity none)");
            None
        }
    };

    let scratch = tempfile::tempdir()?;
    let (model_dir, params) = match &args.model {
        Some(dir) => (dir.clone(), None),
        None => {
            let made = Instant::now();
            let dir = scratch
                .path()
                .join(format!("ruri-v3-{}-shape", args.shape.name));
            let params =
                model::write_random_model(&args.shape, &ruri_testkit::tiny_model_dir(), &dir)?;
            eprintln!(
                "model: {} shape, {params} parameters, random weights written in {:.1} s",
                args.shape.name,
                made.elapsed().as_secs_f64()
            );
            (dir, Some(params))
        }
    };
    let dir = ModelDir::open(&model_dir)?;

    let mut throughput = Vec::new();
    let mut latency = Vec::new();
    for &dtype in &args.dtypes {
        probe.reset_peak();
        let loading = Instant::now();
        let backend = Arc::new(CandleBackend::load(
            &dir,
            args.device,
            dtype,
            LocalAttention::Auto,
        )?);
        let load_s = loading.elapsed().as_secs_f64();
        // On CUDA the weights (the pool's tensors); on CPU the resident set after loading.
        let loaded_bytes = probe.current_bytes();
        // `None`: the backend's advice (Backend::advised_batching).
        let embedder = |batching: Option<BatchOptions>| {
            TextEmbedder::new(
                dir.tokenizer()?,
                dir.prompts().clone(),
                Shared(Arc::clone(&backend)),
                batching,
            )
        };
        let texts = measure::workload(embedder(None)?.tokenizer(), args.texts);
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        for &budget in &args.budgets {
            let batching = ruri_candle::gpu_batching(budget);
            let embedder = embedder(Some(batching))?;
            let mut point =
                measure::throughput(&embedder, &batching, &texts, args.seconds, &probe)?;
            let copy =
                measure::copy_share(&backend, &device, &batching, embedder.tokenizer().pad_id())?;
            point["dtype"] = dtype_name(dtype).into();
            point["load_seconds"] = load_s.into();
            point["memory_after_load_bytes"] = loaded_bytes.into();
            point["copy"] = copy;
            eprintln!("throughput: {point}");
            throughput.push(point);
        }
        let embedder = embedder(None)?;
        let mut point = measure::latency(&embedder, args.seconds.max(2.0))?;
        point["dtype"] = dtype_name(dtype).into();
        eprintln!("latency: {point}");
        latency.push(point);
    }

    let report = json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "device": probe.describe(),
        "model": {
            "dir": model_dir.display().to_string(),
            "shape": args.model.is_none().then_some(args.shape.name),
            "parameters": params,
            "hidden_size": dir.config().hidden_size,
            "layers": dir.config().num_hidden_layers,
        },
        "workload": {
            "texts": args.texts,
            "lengths": format!("{} steps from 16 to 512 tokens, log-spaced", measure::LENGTHS),
            "seconds_per_point": args.seconds,
        },
        "advised_gpu_max_batch_tokens": GPU_MAX_BATCH_TOKENS,
        "fastest_budget": fastest_budgets(&throughput),
        "parity": parity.as_ref().map(parity::ParityRun::to_json),
        "throughput": throughput,
        "latency": latency,
        "wall_seconds": started.elapsed().as_secs_f64(),
    });
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    let markdown = markdown(&report);
    std::fs::write(args.out.join("results.md"), &markdown)?;
    println!("{markdown}");
    eprintln!(
        "wrote {} and results.md in {:.0} s",
        args.out.join("results.json").display(),
        started.elapsed().as_secs_f64()
    );
    Ok(parity.as_ref().is_none_or(parity::ParityRun::passed))
}

/// Per dtype, the budget with the most texts per second.
fn fastest_budgets(points: &[Value]) -> Value {
    let mut best: Vec<(String, u64, f64)> = Vec::new();
    for p in points {
        let (Some(dtype), Some(budget), Some(rate)) = (
            p["dtype"].as_str(),
            p["max_batch_tokens"].as_u64(),
            p["texts_per_s"].as_f64(),
        ) else {
            continue;
        };
        match best.iter_mut().find(|b| b.0 == dtype) {
            Some(b) if b.2 >= rate => {}
            Some(b) => *b = (dtype.to_owned(), budget, rate),
            None => best.push((dtype.to_owned(), budget, rate)),
        }
    }
    best.into_iter()
        .map(|(dtype, budget, rate)| {
            (
                dtype,
                json!({"max_batch_tokens": budget, "texts_per_s": rate}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn figure(value: &Value, digits: usize) -> String {
    value
        .as_f64()
        .map_or("–".into(), |v| format!("{v:.digits$}"))
}

fn mib(value: &Value) -> String {
    value
        .as_f64()
        .map_or("–".into(), |v| format!("{:.0}", v / (1024.0 * 1024.0)))
}

/// The figures as Markdown tables.
fn markdown(report: &Value) -> String {
    let device = &report["device"];
    let mut md = String::new();
    let name = device["name"].as_str().unwrap_or("CPU");
    md.push_str(&format!(
        "# candle backend on {name} ({})\n\n",
        device["kind"].as_str().unwrap_or("?")
    ));
    if device["kind"] == "cuda" {
        md.push_str(&format!(
            "Compute capability {}, driver CUDA {}, {} MiB. ",
            device["compute_capability"].as_str().unwrap_or("?"),
            device["driver_cuda_version"].as_str().unwrap_or("?"),
            mib(&device["total_memory_bytes"])
        ));
    } else {
        md.push_str(&format!("{} threads. ", device["threads"]));
    }
    md.push_str(&format!(
        "Model: {} shape ({} parameters, random weights). Workload: {} texts, {}. \
         Memory: {}. Wall time {:.0} s.\n\n",
        report["model"]["shape"].as_str().unwrap_or("given"),
        report["model"]["parameters"],
        report["workload"]["texts"],
        report["workload"]["lengths"].as_str().unwrap_or(""),
        device["memory_measure"].as_str().unwrap_or("?"),
        report["wall_seconds"].as_f64().unwrap_or(0.0),
    ));

    md.push_str("## Parity (tests/parity.rs, CPU tolerances)\n\n");
    match report["parity"].as_object() {
        None => md.push_str("Not run.\n\n"),
        Some(parity) => {
            md.push_str(&format!(
                "`{} {}`: {} (exit {}).\n\n",
                parity["binary"].as_str().unwrap_or(""),
                parity["filter"].as_str().unwrap_or(""),
                parity["summary"].as_str().unwrap_or("no summary"),
                parity["exit_code"],
            ));
            md.push_str("| test | result |\n| --- | --- |\n");
            for test in parity["tests"].as_array().into_iter().flatten() {
                md.push_str(&format!(
                    "| {} | {} |\n",
                    test["name"].as_str().unwrap_or(""),
                    test["result"].as_str().unwrap_or("")
                ));
            }
            md.push_str(
                "\n| case | against | checks | min cosine | max abs diff | min cosine without the outlier |\n\
                 | --- | --- | ---: | ---: | ---: | ---: |\n",
            );
            for case in parity["cases"].as_array().into_iter().flatten() {
                md.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} |\n",
                    case["case"].as_str().unwrap_or(""),
                    case["against"].as_str().unwrap_or(""),
                    case["checks"],
                    figure(&case["min_cosine"], 7),
                    case["max_abs_diff"]
                        .as_f64()
                        .map_or("–".into(), |v| format!("{v:.2e}")),
                    figure(&case["min_cosine_without_outlier"], 7),
                ));
            }
            md.push('\n');
        }
    }

    md.push_str(
        "## Throughput by padded-token budget\n\n\
         | dtype | budget (tokens) | batches/call | texts/s | tokens/s | peak MiB | after load MiB | copy share of a batch | batch (texts × 256) forward ms |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for p in report["throughput"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) |\n",
            p["dtype"].as_str().unwrap_or(""),
            p["max_batch_tokens"],
            p["batches_per_call"],
            figure(&p["texts_per_s"], 1),
            figure(&p["tokens_per_s"], 0),
            mib(&p["peak_memory_bytes"]),
            mib(&p["memory_after_load_bytes"]),
            p["copy"]["copy_share"]
                .as_f64()
                .map_or("–".into(), |v| format!("{:.2} %", v * 100.0)),
            figure(&p["copy"]["forward_ms"], 2),
            p["copy"]["batch_texts"],
        ));
    }
    md.push_str(&format!(
        "\nFastest budget per dtype: {}. Advised on CUDA now: {} tokens \
         (`ruri_candle::GPU_MAX_BATCH_TOKENS`).\n\n",
        report["fastest_budget"]
            .as_object()
            .map(|m| m
                .iter()
                .map(|(dtype, b)| format!("{dtype} {}", b["max_batch_tokens"]))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        report["advised_gpu_max_batch_tokens"],
    ));

    md.push_str(
        "## Single-query latency (batch of one, advised batching)\n\n\
         | dtype | query tokens | calls | p50 ms | p90 ms | p99 ms |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for p in report["latency"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            p["dtype"].as_str().unwrap_or(""),
            p["query_tokens"],
            p["calls"],
            figure(&p["p50_ms"], 3),
            figure(&p["p90_ms"], 3),
            figure(&p["p99_ms"], 3),
        ));
    }
    md
}
