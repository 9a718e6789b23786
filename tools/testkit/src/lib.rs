//! Test support shared by the ruri crates' integration tests: where the committed test model
//! is, and its reference outputs from Python (`testdata/reference/*.json`, written by
//! `tools/testdata/generate.sh`; see `testdata/README.md`).
//!
//! Expected values only ever come from these files, never from the code under test.

#![deny(missing_docs)]

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde::Deserialize;

pub mod hub_mock;
pub mod shapes;

/// proptest, for test crates that do not depend on it themselves (the root package).
pub use proptest;
/// The temporary folder [`tiny_model_copy`] returns.
pub use tempfile::TempDir;

/// Whether `CI` (the variable CI services set) says this is a CI run: set, and not "0" or
/// "false".
pub fn in_ci(ci: Option<&str>) -> bool {
    ci.is_some_and(|v| {
        let v = v.trim();
        !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false")
    })
}

/// The Python with `huggingface_hub` that the tests driving Python's Hub client run:
/// `RURI_TEST_PYTHON` (tools/test.sh sets it), else the test-data venv, else `None` after a
/// notice that the check named `what` is skipped. Under CI a missing Python fails the test
/// instead of passing it silently.
pub fn hub_python(what: &str) -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("RURI_TEST_PYTHON") {
        return Some(PathBuf::from(python));
    }
    let venv = repo_root().join(".venv-testdata/bin/python");
    if venv.is_file() {
        return Some(venv);
    }
    let how = "set RURI_TEST_PYTHON to a Python with huggingface_hub (or create .venv-testdata)";
    assert!(
        !in_ci(std::env::var("CI").ok().as_deref()),
        "CI is set but no Python for {what}: {how}"
    );
    eprintln!("SKIPPED: {what}: {how}");
    None
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tools/testkit sits two levels below the workspace root")
        .to_path_buf()
}

/// `testdata/`: `RURI_TESTDATA` when set (a test binary carried to another machine, e.g. a
/// lent GPU), else the workspace's.
pub fn testdata_dir() -> PathBuf {
    std::env::var_os("RURI_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("testdata"))
}

/// The committed tiny random-weight model (`testdata/tiny`).
pub fn tiny_model_dir() -> PathBuf {
    testdata_dir().join("tiny")
}

/// A raw and a normalized vector of one input, from one reference implementation.
#[derive(Debug, Clone, Deserialize)]
pub struct Vectors {
    /// Mean-pooled, not normalized.
    pub mean: Vec<f32>,
    /// L2-normalized.
    pub normalized: Vec<f32>,
}

/// One committed input and what Python made of it.
#[derive(Debug, Clone, Deserialize)]
pub struct Item {
    /// Short name.
    pub id: String,
    /// sentence-transformers prompt name (`""` for none).
    pub prompt_name: String,
    /// The prompt text prepended.
    pub prompt: String,
    /// The text.
    pub text: String,
    /// Token ids sentence-transformers fed the model (truncated to `max_seq_length`).
    pub token_ids: Vec<u32>,
    /// Token ids without truncation.
    pub untruncated_token_ids: Vec<u32>,
    /// Whether sentence-transformers truncated it.
    pub truncated: bool,
    /// sentence-transformers, torch fp32 on CPU.
    pub st_fp32: Vectors,
    /// onnxruntime-Python on `onnx/model.onnx`, batch of one.
    pub ort_fp32: Vectors,
    /// onnxruntime-Python on `onnx/model_quantized.onnx`, batch of one.
    pub ort_int8: Vectors,
    /// onnxruntime-Python on `testdata/onnx_variants/tiny_fp16.onnx` (float16 weights and
    /// outputs), batch of one; only in `tiny.json`.
    #[serde(default)]
    pub ort_fp16: Option<Vectors>,
}

/// The x86 instruction sets that choose ONNX Runtime's int8 GEMM kernels (MLAS dispatches on
/// them), as recorded by the machine that made a reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Int8Isa {
    /// AVX-512 VNNI.
    pub avx512_vnni: bool,
    /// AVX-512 (F, BW, DQ, VL).
    pub avx512: bool,
    /// AVX-VNNI (the 256-bit VNNI of client CPUs).
    pub avx_vnni: bool,
    /// AVX2.
    pub avx2: bool,
}

impl Int8Isa {
    /// This machine's.
    pub fn this_machine() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            Self {
                avx512_vnni: std::arch::is_x86_feature_detected!("avx512vnni"),
                avx512: std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vl"),
                avx_vnni: std::arch::is_x86_feature_detected!("avxvnni"),
                avx2: std::arch::is_x86_feature_detected!("avx2"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Self {
                avx512_vnni: false,
                avx512: false,
                avx_vnni: false,
                avx2: false,
            }
        }
    }
}

/// A reference file.
#[derive(Debug, Clone, Deserialize)]
pub struct Reference {
    /// The massive-activation channel the generator planted (about 0.8 of each pooled unit
    /// vector lies in it, as in the real ruri-v3-30m), if any.
    #[serde(default)]
    pub outlier_channel: Option<usize>,
    /// The instruction sets of the machine that ran onnxruntime-Python for the int8
    /// references; absent in references made before it was recorded.
    #[serde(default)]
    pub int8_isa: Option<Int8Isa>,
    /// `max_seq_length` of the model.
    pub max_seq_length: usize,
    /// Vector width.
    pub dim: usize,
    /// The inputs, in file order.
    pub items: Vec<Item>,
}

impl Reference {
    /// `testdata/reference/tiny.json`.
    pub fn tiny() -> Self {
        Self::read("tiny.json")
    }

    /// `testdata/reference/tiny_hostile.json`: the tiny model on `testdata/hostile_inputs.json`
    /// (NUL bytes, control and invisible characters, lone combining marks, whitespace past the
    /// maximum length; see docs/hostile-inputs.md).
    pub fn tiny_hostile() -> Self {
        Self::read("tiny_hostile.json")
    }

    fn read(file: &str) -> Self {
        read_reference(file)
    }

    /// Whether this machine runs the same int8 GEMM kernels as the one that made the int8
    /// references: ONNX Runtime picks them by instruction set, and the kernels round
    /// differently (AVX2's `vpmaddubsw` saturates 16-bit sums, VNNI does not), so int8 vectors
    /// only agree to float summation order when the instruction sets match.
    pub fn int8_kernels_match(&self) -> bool {
        self.int8_isa == Some(Int8Isa::this_machine())
    }

    /// The item with this id; panics if there is none (a test naming a missing input is wrong).
    pub fn item(&self, id: &str) -> &Item {
        self.items
            .iter()
            .find(|i| i.id == id)
            .unwrap_or_else(|| panic!("no reference item {id:?}"))
    }
}

/// One input of a whitespace-policy reference and what one sentence-transformers version
/// made of it.
#[derive(Debug, Clone, Deserialize)]
pub struct PolicyItem {
    /// Short name.
    pub id: String,
    /// The prompt text prepended.
    pub prompt: String,
    /// The text.
    pub text: String,
    /// The exact string sentence-transformers gave the tokenizer (prompt + text, stripped or
    /// not).
    pub tokenized_text: String,
    /// Token ids sentence-transformers fed the model.
    pub token_ids: Vec<u32>,
    /// sentence-transformers, torch fp32 on CPU.
    pub st_fp32: Vectors,
}

/// `testdata/reference/tiny_whitespace_{keep,strip}.json`: the tiny model on
/// `testdata/whitespace_inputs.json` under sentence-transformers 6.2 (keeps whitespace) or
/// 5.3 (strips prompt + text), made by `tools/testdata/generate_whitespace.sh`.
#[derive(Debug, Clone, Deserialize)]
pub struct PolicyReference {
    /// `"keep"` or `"strip"`, as checked on the sentence-transformers version that made it.
    pub behaviour: String,
    /// Every code point Python's `str.strip()` removes, in the interpreter that made it.
    pub python_whitespace: Vec<u32>,
    /// The inputs, in file order.
    pub items: Vec<PolicyItem>,
}

impl PolicyReference {
    /// sentence-transformers 6.2: prompt + text as given.
    pub fn keep() -> Self {
        read_reference("tiny_whitespace_keep.json")
    }

    /// sentence-transformers 5.3: prompt + text stripped.
    pub fn strip() -> Self {
        read_reference("tiny_whitespace_strip.json")
    }
}

fn read_reference<T: serde::de::DeserializeOwned>(file: &str) -> T {
    let path = testdata_dir().join("reference").join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Cosine similarity computed in f64, so the measurement adds no error of its own.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "vectors of different lengths");
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Largest elementwise absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "vectors of different lengths");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs())
        .fold(0.0, f64::max)
}

/// Worst agreement over a set of vector pairs.
#[derive(Debug, Clone, Copy)]
pub struct Agreement {
    /// Smallest cosine.
    pub min_cosine: f64,
    /// Largest elementwise |Δ|.
    pub max_abs_diff: f64,
    /// Smallest cosine over the other channels, when an outlier channel is set: a channel
    /// holding most of every vector inflates the full cosine, so this is the one that shows
    /// errors in the rest.
    pub min_cosine_without_outlier: Option<f64>,
    outlier: Option<usize>,
}

impl Agreement {
    /// Starts with perfect agreement.
    pub fn new() -> Self {
        Self {
            min_cosine: 1.0,
            max_abs_diff: 0.0,
            min_cosine_without_outlier: None,
            outlier: None,
        }
    }

    /// Starts with perfect agreement, also measuring the cosine without `channel` (when
    /// given).
    pub fn without_outlier(channel: Option<usize>) -> Self {
        Self {
            min_cosine_without_outlier: channel.map(|_| 1.0),
            outlier: channel,
            ..Self::new()
        }
    }

    /// Adds one pair. Non-finite values, or a zero vector where the reference is not, fail
    /// at once: `f64::min`/`max` would silently skip the NaN they produce.
    pub fn add(&mut self, actual: &[f32], expected: &[f32]) {
        assert!(
            actual.iter().all(|x| x.is_finite()),
            "non-finite value in {actual:?}"
        );
        let full = cosine(actual, expected);
        assert!(
            full.is_finite(),
            "undefined cosine (zero vector?) for {actual:?}"
        );
        self.min_cosine = self.min_cosine.min(full);
        self.max_abs_diff = self.max_abs_diff.max(max_abs_diff(actual, expected));
        if let (Some(channel), Some(min)) = (self.outlier, &mut self.min_cosine_without_outlier) {
            let drop = |v: &[f32]| -> Vec<f32> {
                let mut v = v.to_vec();
                v[channel] = 0.0;
                v
            };
            *min = min.min(cosine(&drop(actual), &drop(expected)));
        }
    }
}

impl Default for Agreement {
    fn default() -> Self {
        Self::new()
    }
}

/// Copies a model folder (recursively) into `dest`, keeping only the entries `keep` accepts
/// (paths relative to `src`, `/`-separated). For tests that break or rearrange a model.
pub fn copy_model(src: &Path, dest: &Path, keep: &dyn Fn(&str) -> bool) {
    fn walk(root: &Path, dir: &Path, dest: &Path, keep: &dyn Fn(&str) -> bool) {
        for entry in std::fs::read_dir(dir).expect("readable model folder") {
            let path = entry.expect("readable entry").path();
            let relative = path
                .strip_prefix(root)
                .expect("inside root")
                .to_string_lossy()
                .replace('\\', "/");
            if path.is_dir() {
                walk(root, &path, dest, keep);
            } else if keep(&relative) {
                let target = dest.join(&relative);
                std::fs::create_dir_all(target.parent().expect("has a parent")).expect("mkdir");
                std::fs::copy(&path, &target).expect("copy");
            }
        }
    }
    walk(src, src, dest, keep);
}

/// A temporary copy of the tiny model with the files `keep` accepts (see [`copy_model`]),
/// deleted when dropped.
pub fn tiny_model_copy(keep: &dyn Fn(&str) -> bool) -> TempDir {
    let dir = tempfile::tempdir().expect("a temporary folder");
    copy_model(&tiny_model_dir(), dir.path(), keep);
    dir
}

/// `testdata/reference/tiny_long.json` (`tools/testdata/make_long_reference.py`): one text
/// of 1,709 tokens, past the 512 tokens of `tiny.json` and the 1,024 rotary angles the
/// engines cache, with sentence-transformers' vector for `max_seq_length` 2,048.
#[derive(Debug, Clone, Deserialize)]
pub struct LongItem {
    /// Short name (`long_<tokens>`).
    pub id: String,
    /// The text (no prompt).
    pub text: String,
    /// Token ids sentence-transformers fed the model (not truncated).
    pub token_ids: Vec<u32>,
    /// sentence-transformers, torch fp32 on CPU.
    pub st_fp32: Vectors,
}

impl LongItem {
    /// The committed long item.
    pub fn tiny() -> Self {
        #[derive(Deserialize)]
        struct File {
            max_seq_length: usize,
            items: Vec<LongItem>,
        }
        let path = testdata_dir().join("reference").join("tiny_long.json");
        let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut file: File = serde_json::from_slice(&text).expect("tiny_long.json parses");
        assert_eq!(file.max_seq_length, LONG_MAX_SEQ_LENGTH);
        assert_eq!(file.items.len(), 1, "one long item");
        file.items.remove(0)
    }

    /// A temporary copy of the tiny model (every file) whose `max_seq_length` is the one
    /// the long item was made with, deleted when dropped.
    pub fn model() -> TempDir {
        let dir = tiny_model_copy(&|_| true);
        edit_file(
            &dir.path().join("sentence_bert_config.json"),
            "\"max_seq_length\": 512",
            &format!("\"max_seq_length\": {LONG_MAX_SEQ_LENGTH}"),
        );
        dir
    }
}

/// `max_seq_length` of [`LongItem`]'s reference (the tiny model's positions go to 8,192).
pub const LONG_MAX_SEQ_LENGTH: usize = 2048;

/// Replaces `from` with `to` in a text file, asserting that something changed (so a test that
/// breaks a file cannot silently test the unbroken one).
pub fn edit_file(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let edited = text.replace(from, to);
    assert_ne!(text, edited, "{from:?} not found in {}", path.display());
    std::fs::write(path, edited).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Pieces of hostile text: any Unicode scalar value (NUL and other controls included), kana
/// and kanji, every kind of space, lone combining marks, invisible characters and literal
/// special tokens.
fn hostile_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<char>().prop_map(String::from),
        3 => proptest::char::range('\u{3041}', '\u{30ff}').prop_map(String::from),
        3 => proptest::char::range('\u{4e00}', '\u{9fff}').prop_map(String::from),
        2 => proptest::sample::select(&[
            " ", "\u{3000}", "\t", "\n", "\r\n", "\0", "\u{301}", "\u{3099}", "\u{200d}",
            "\u{feff}", "\u{202e}", "\u{fffd}", "\u{e0100}", "😀", "<s>", "</s>", "<pad>",
            "<unk>", "<mask>",
        ][..])
        .prop_map(str::to_owned),
    ]
}

/// Random texts that stress a tokenizer: mostly short, sometimes long enough (hundreds of
/// pieces, many of them byte-fallback tokens) to pass a 512-token maximum.
pub fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::collection::vec(hostile_piece(), 0..40),
        1 => proptest::collection::vec(hostile_piece(), 150..400),
    ]
    .prop_map(|pieces| pieces.concat())
}

/// What a fake ONNX Runtime library made by [`fake_onnxruntime`] does.
#[derive(Debug, Clone, Copy)]
pub enum FakeOrt {
    /// A shared library without `OrtGetApiBase`: not ONNX Runtime at all.
    NotOnnxRuntime,
    /// `OrtGetApiBase()` returns NULL.
    NullApiBase,
    /// Reports this version and offers no API (`GetApi` returns NULL for every version), as
    /// an ONNX Runtime older than the API level asked for does.
    Version(&'static str),
}

/// Builds a fake ONNX Runtime shared library in `dir` with the system C compiler (`cc`, which
/// Rust itself links with on Linux) and returns its path. For tests of the runtime loader.
pub fn fake_onnxruntime(dir: &Path, fake: FakeOrt) -> PathBuf {
    let (defines, name) = match fake {
        FakeOrt::NotOnnxRuntime => (vec!["-DNOT_ONNXRUNTIME".to_owned()], "not-ort".to_owned()),
        FakeOrt::NullApiBase => (vec!["-DNULL_API_BASE".to_owned()], "null-base".to_owned()),
        FakeOrt::Version(v) => (vec![format!("-DFAKE_VERSION=\"{v}\"")], format!("v{v}")),
    };
    let source = dir.join(format!("fake-onnxruntime-{name}.c"));
    let library = dir.join(format!("libonnxruntime-fake-{name}.so"));
    std::fs::write(&source, FAKE_ONNXRUNTIME_C).expect("writing the C source");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .args(&defines)
        .status()
        .unwrap_or_else(|e| panic!("running cc to build a fake ONNX Runtime: {e}"));
    assert!(status.success(), "cc failed building {}", library.display());
    library
}

/// ONNX Runtime's entry point as `ort` reads it: `OrtGetApiBase()` → `{GetApi,
/// GetVersionString}`.
const FAKE_ONNXRUNTIME_C: &str = r#"
#include <stddef.h>
#ifdef NOT_ONNXRUNTIME
int not_onnxruntime(void) { return 0; }
#else
#ifndef FAKE_VERSION
#define FAKE_VERSION "1.31.1"
#endif
typedef struct {
    const void *(*GetApi)(unsigned int version);
    const char *(*GetVersionString)(void);
} OrtApiBase;
static const void *get_api(unsigned int version) { (void)version; return NULL; }
static const char *version_string(void) { return FAKE_VERSION; }
static const OrtApiBase base = {get_api, version_string};
const OrtApiBase *OrtGetApiBase(void) {
#ifdef NULL_API_BASE
    return NULL;
#else
    return &base;
#endif
}
#endif
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_is_read_as_ci_services_set_it() {
        for on in ["true", "1", "yes"] {
            assert!(in_ci(Some(on)), "{on}");
        }
        for off in [None, Some(""), Some("0"), Some("false"), Some("FALSE")] {
            assert!(!in_ci(off), "{off:?}");
        }
    }
}
