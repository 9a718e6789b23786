//! The benchmark model, workload and systems.

use std::path::PathBuf;
use std::sync::OnceLock;

use ruri::Embedder;
use ruri::candle::DType;
use ruri::ort::Precision;

/// The workload: documents (with the document prompt) and short queries (query prompt).
pub struct Workload {
    pub documents: Vec<String>,
    pub queries: Vec<String>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn model_dir() -> PathBuf {
    std::env::var_os("RURI_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("testdata/generated/ruri-v3-30m-shape"))
}

fn workload_dir() -> PathBuf {
    std::env::var_os("RURI_BENCH_WORKLOAD")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("testdata/generated/bench"))
}

fn read_jsonl(path: &std::path::Path) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Line {
        text: String,
    }
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .map(|l| serde_json::from_str::<Line>(l).ok().map(|l| l.text))
        .collect()
}

/// The workload and model, or `None` (after saying how to make them) when absent.
pub fn workload() -> Option<&'static Workload> {
    static WORKLOAD: OnceLock<Option<Workload>> = OnceLock::new();
    WORKLOAD
        .get_or_init(|| {
            let model = model_dir();
            let dir = workload_dir();
            let documents = read_jsonl(&dir.join("documents.jsonl"));
            let queries = read_jsonl(&dir.join("queries.jsonl"));
            match (model.join("config.json").is_file(), documents, queries) {
                (true, Some(documents), Some(queries)) => Some(Workload { documents, queries }),
                _ => {
                    eprintln!(
                        "ruri benches skipped: need the model {} (tools/testdata/generate.sh 30m) \
                         and the workload {} (python tools/bench/make_workload.py)",
                        model.display(),
                        dir.display()
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// A backend × precision under test.
pub struct System {
    pub name: &'static str,
    pub build: fn() -> Box<dyn Embedder>,
}

fn ort(precision: Precision) -> Box<dyn Embedder> {
    Box::new(
        ruri::ort::builder()
            .precision(precision)
            .build_from_dir(model_dir())
            .unwrap_or_else(|e| panic!("building ort {precision:?}: {e:?}")),
    )
}

fn candle(dtype: DType) -> Box<dyn Embedder> {
    Box::new(
        ruri::candle::builder()
            .dtype(dtype)
            .build_from_dir(model_dir())
            .unwrap_or_else(|e| panic!("building candle {dtype:?}: {e:?}")),
    )
}

pub const SYSTEMS: &[System] = &[
    System {
        name: "ort_fp32",
        build: || ort(Precision::Fp32),
    },
    System {
        name: "ort_int8",
        build: || ort(Precision::Int8),
    },
    System {
        name: "candle_f32",
        build: || candle(DType::F32),
    },
    System {
        name: "candle_bf16",
        build: || candle(DType::BF16),
    },
];
