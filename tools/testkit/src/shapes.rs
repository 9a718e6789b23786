//! Random-weight models at the four real Ruri v3 shapes (30m, 70m, 130m, 310m), rebuilt from a
//! recipe instead of committed weight files (`testdata/shapes/`, made by
//! `tools/testdata/shapes.py`; see `testdata/shapes/README.md`).
//!
//! Each `testdata/shapes/<size>/` holds the small files of a model folder (configs, the ONNX
//! graph without its parameters) and `weights.json`: the tensor list with one PRNG stream and
//! one checksum per tensor, and where each ONNX parameter lies in `onnx/model.onnx.data`.
//! [`ShapeSet::materialize`] writes the complete folder into a temporary directory:
//! `model.safetensors` and `onnx/model.onnx.data` from the same PRNG as the Python generator,
//! bit for bit (every tensor's checksum is compared with the one Python recorded).
//!
//! # The PRNG (`splitmix64-counter-v1`)
//!
//! * `splitmix64(seed, i)` = output `i` (0-based) of Vigna's SplitMix64 seeded with `seed`:
//!   `mix(seed + (i + 1)·0x9E3779B97F4A7C15 mod 2⁶⁴)`.
//! * Tensor `k` (its index in the fixed tensor order, [`tensor_specs`]) uses the stream seeded
//!   with `splitmix64(20241130, k)`; element `i` (row-major) draws `x = splitmix64(seed_k, i)`,
//!   `u = (x >> 40) as f32 · 2⁻²⁴` and `v = 2u − 1` (both exact in f32).
//! * Token embeddings `v · f32(√3)`; Linear weights `v · f32(√(3 / fan_in))` (fan_in = columns);
//!   LayerNorm weights `1 + f32(0.1·√3) · v` (product and sum rounded separately). The scales
//!   are computed in f64 and rounded to f32 once.
//! * Checksum of a tensor: `Σ bits(wᵢ) · splitmix64(0, i) mod 2⁶⁴` over the f32 bit patterns.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Deserialize;

use crate::{TempDir, Vectors, copy_model, repo_root, testdata_dir};

/// The four sizes, smallest first.
pub const SIZES: [&str; 4] = ["30m", "70m", "130m", "310m"];

/// The generator's base seed.
pub const BASE_SEED: u64 = 20_241_130;

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Output `i` (0-based) of SplitMix64 seeded with `seed`.
pub fn splitmix64(seed: u64, i: u64) -> u64 {
    mix(seed.wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// The seed of tensor `k`'s stream.
pub fn stream_seed(k: u64) -> u64 {
    splitmix64(BASE_SEED, k)
}

/// How a tensor is initialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Init {
    /// Token embeddings: `v · f32(√3)` (variance 1).
    Embedding,
    /// Linear weight `[out, in]`: `v · f32(√(3 / in))` (variance 1/fan_in).
    Linear,
    /// LayerNorm weight: `1 + f32(0.1·√3) · v`.
    Norm,
}

/// Element values of one tensor: `v ↦ scale · v` or `v ↦ 1 + scale · v`.
#[derive(Clone, Copy)]
struct Recipe {
    seed: u64,
    scale: f32,
    plus_one: bool,
}

impl Recipe {
    fn new(init: Init, shape: &[usize], stream: u64) -> Self {
        let (scale, plus_one) = match init {
            Init::Embedding => (3f64.sqrt() as f32, false),
            Init::Linear => ((3.0 / shape[1] as f64).sqrt() as f32, false),
            Init::Norm => ((0.1 * 3f64.sqrt()) as f32, true),
        };
        Self {
            seed: stream_seed(stream),
            scale,
            plus_one,
        }
    }

    /// Calls `f(i, value)` for every element in order (the PRNG stream walked with one
    /// addition per element, as `splitmix64(seed, i)` defines it).
    #[inline]
    fn for_each(self, n: usize, mut f: impl FnMut(u64, f32)) {
        let step = 1.0 / (1u32 << 24) as f32;
        let mut z = self.seed;
        for i in 0..n as u64 {
            z = z.wrapping_add(GAMMA);
            let u = (mix(z) >> 40) as f32 * step;
            let v = 2.0 * u - 1.0;
            // Two roundings (product, then sum): Rust never fuses them into an FMA.
            let w = if self.plus_one {
                1.0 + self.scale * v
            } else {
                self.scale * v
            };
            f(i, w);
        }
    }
}

/// The values of one tensor (row-major).
pub fn make_tensor(init: Init, shape: &[usize], stream: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    Recipe::new(init, shape, stream).for_each(n, |_, w| out.push(w));
    out
}

/// One tensor as little-endian f32 bytes, with its [`checksum`], in one pass.
fn tensor_bytes(init: Init, shape: &[usize], stream: u64) -> (Vec<u8>, u64) {
    let n: usize = shape.iter().product();
    let mut bytes = Vec::with_capacity(n * 4);
    let mut sum = 0u64;
    let mut z = 0u64;
    Recipe::new(init, shape, stream).for_each(n, |_, w| {
        z = z.wrapping_add(GAMMA);
        sum = sum.wrapping_add(u64::from(w.to_bits()).wrapping_mul(mix(z)));
        bytes.extend_from_slice(&w.to_le_bytes());
    });
    (bytes, sum)
}

/// `Σ bits(wᵢ) · splitmix64(0, i) mod 2⁶⁴`.
pub fn checksum(values: &[f32]) -> u64 {
    let mut z = 0u64;
    values.iter().fold(0u64, |acc, x| {
        z = z.wrapping_add(GAMMA);
        acc.wrapping_add(u64::from(x.to_bits()).wrapping_mul(mix(z)))
    })
}

/// One tensor of the recipe.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TensorSpec {
    /// safetensors name (no `model.` prefix).
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Initialization.
    pub init: Init,
    /// PRNG stream index.
    pub stream: u64,
    /// Checksum Python recorded (`0x…`); absent in [`tensor_specs`]' output.
    #[serde(default)]
    pub checksum: Option<String>,
}

/// One ONNX parameter initializer stored in `onnx/model.onnx.data`.
#[derive(Debug, Clone, Deserialize)]
pub struct OnnxInitializer {
    /// Initializer name in the graph.
    pub name: String,
    /// The tensor (a [`TensorSpec::name`]) whose values it holds.
    pub source: String,
    /// Whether it holds the transpose of the source.
    pub transpose: bool,
    /// Byte offset in the data file.
    pub offset: u64,
    /// Byte length.
    pub length: u64,
    /// Its dimensions.
    pub dims: Vec<usize>,
}

/// Where the ONNX graph finds its parameters.
#[derive(Debug, Clone, Deserialize)]
pub struct OnnxManifest {
    /// The graph file, relative to the folder.
    pub graph: String,
    /// The external data file, relative to the folder.
    pub data: String,
    /// Length of the data file.
    pub data_length: u64,
    /// The parameters.
    pub initializers: Vec<OnnxInitializer>,
}

/// The PRNG named by a recipe.
#[derive(Debug, Clone, Deserialize)]
pub struct PrngSpec {
    /// Always `splitmix64-counter-v1`.
    pub algorithm: String,
    /// Always [`BASE_SEED`].
    pub base_seed: u64,
}

/// `weights.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// `30m`, …
    pub size: String,
    /// The PRNG.
    pub prng: PrngSpec,
    /// The tensors, in stream order.
    pub tensors: Vec<TensorSpec>,
    /// The ONNX parameters.
    pub onnx: OnnxManifest,
}

/// The tensor list of a ModernBERT `config.json` (`ModernBertModel`'s state-dict order, which
/// `shapes.py` asserts); the stream index is the position in this list.
pub fn tensor_specs(config: &serde_json::Value) -> Vec<TensorSpec> {
    let get = |key: &str| {
        config[key]
            .as_u64()
            .unwrap_or_else(|| panic!("config.json: no integer {key}")) as usize
    };
    let (h, i, layers, vocab) = (
        get("hidden_size"),
        get("intermediate_size"),
        get("num_hidden_layers"),
        get("vocab_size"),
    );
    let mut all = vec![
        (
            "embeddings.tok_embeddings.weight".to_owned(),
            vec![vocab, h],
            Init::Embedding,
        ),
        ("embeddings.norm.weight".to_owned(), vec![h], Init::Norm),
    ];
    for n in 0..layers {
        if n > 0 {
            all.push((format!("layers.{n}.attn_norm.weight"), vec![h], Init::Norm));
        }
        all.push((
            format!("layers.{n}.attn.Wqkv.weight"),
            vec![3 * h, h],
            Init::Linear,
        ));
        all.push((
            format!("layers.{n}.attn.Wo.weight"),
            vec![h, h],
            Init::Linear,
        ));
        all.push((format!("layers.{n}.mlp_norm.weight"), vec![h], Init::Norm));
        all.push((
            format!("layers.{n}.mlp.Wi.weight"),
            vec![2 * i, h],
            Init::Linear,
        ));
        all.push((
            format!("layers.{n}.mlp.Wo.weight"),
            vec![h, i],
            Init::Linear,
        ));
    }
    all.push(("final_norm.weight".to_owned(), vec![h], Init::Norm));
    all.into_iter()
        .enumerate()
        .map(|(k, (name, shape, init))| TensorSpec {
            name,
            shape,
            init,
            stream: k as u64,
            checksum: None,
        })
        .collect()
}

/// One input and what sentence-transformers made of it.
#[derive(Debug, Clone, Deserialize)]
pub struct ShapeItem {
    /// Id in `testdata/inputs.json`.
    pub id: String,
    /// Prompt name (`""` for none).
    pub prompt_name: String,
    /// Prompt text.
    pub prompt: String,
    /// The text.
    pub text: String,
    /// Token ids sentence-transformers fed the model.
    pub token_ids: Vec<u32>,
    /// Whether it was truncated (never: `max_seq_length` is 8192).
    pub truncated: bool,
    /// sentence-transformers, torch fp32, batch of one.
    pub st_fp32: Vectors,
}

/// `reference/shapes/<size>.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct ShapeReference {
    /// `30m`, …
    pub size: String,
    /// Layers of the model the references came from.
    pub num_hidden_layers: usize,
    /// `max_seq_length`.
    pub max_seq_length: usize,
    /// Vector width.
    pub dim: usize,
    /// What the generator measured (ONNX vs torch, window matters, …), as written.
    pub checks: serde_json::Value,
    /// The inputs.
    pub items: Vec<ShapeItem>,
}

/// A set of shape models: the committed CI-depth one or a generated full-depth one.
#[derive(Debug, Clone)]
pub struct ShapeSet {
    /// Folder holding `<size>/` recipes.
    pub models: PathBuf,
    /// Folder holding `<size>.json` references.
    pub references: PathBuf,
    /// Folder with the shared tokenizer files.
    pub tokenizer: PathBuf,
    /// Whether this is a full-depth set (from `RURI_SHAPES_FULL`).
    pub full: bool,
}

/// The files of `testdata/shapes/tokenizer/`.
const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

impl ShapeSet {
    /// The committed CI-depth set (4 layers): `testdata/shapes/`, `testdata/reference/shapes/`.
    pub fn committed() -> Self {
        let testdata = testdata_dir();
        Self {
            models: testdata.join("shapes"),
            references: testdata.join("reference").join("shapes"),
            tokenizer: testdata.join("shapes").join("tokenizer"),
            full: false,
        }
    }

    /// A set made by `tools/testdata/generate_shapes.sh --full`: `<dir>/<size>/`,
    /// `<dir>/reference/<size>.json`, `<dir>/tokenizer/`. A relative `dir` is taken relative
    /// to the workspace root.
    pub fn generated(dir: impl AsRef<Path>) -> Self {
        let dir = repo_root().join(dir);
        Self {
            models: dir.clone(),
            references: dir.join("reference"),
            tokenizer: dir.join("tokenizer"),
            full: true,
        }
    }

    /// `RURI_SHAPES_FULL` when set (see [`ShapeSet::generated`]), else [`ShapeSet::committed`].
    pub fn from_env() -> Self {
        match std::env::var_os("RURI_SHAPES_FULL") {
            Some(dir) if !dir.is_empty() => Self::generated(PathBuf::from(dir)),
            _ => Self::committed(),
        }
    }

    /// The reference vectors of `size`.
    pub fn reference(&self, size: &str) -> ShapeReference {
        let path = self.references.join(format!("{size}.json"));
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
    }

    /// The folder of the tokenizer files every shape uses.
    pub fn tokenizer_dir(&self) -> &Path {
        &self.tokenizer
    }

    /// The recipe folder of `size`.
    pub fn recipe_dir(&self, size: &str) -> PathBuf {
        self.models.join(size)
    }

    /// Writes the complete model folder of `size` (configs, tokenizer, `model.safetensors`,
    /// `onnx/model.onnx`, `onnx/model.onnx.data`) into a new temporary directory.
    pub fn materialize(&self, size: &str) -> TempDir {
        let dir = tempfile::tempdir().expect("a temporary folder");
        materialize_into(&self.recipe_dir(size), &self.tokenizer, dir.path());
        dir
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn io<T>(path: &Path) -> impl FnOnce(std::io::Error) -> T {
    let path = path.to_path_buf();
    move |e| panic!("{}: {e}", path.display())
}

/// The bytes of a row-major `rows × cols` f32 matrix, transposed.
fn transpose_bytes(bytes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let mut t = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = (4 * (r * cols + c), 4 * (c * rows + r));
            t[to..to + 4].copy_from_slice(&bytes[from..from + 4]);
        }
    }
    t
}

/// Writes the complete model folder of the recipe `recipe` (a `testdata/shapes/<size>/`) with
/// the tokenizer files of `tokenizer` into `dest`. Panics on any disagreement between the
/// recipe, `config.json` and the PRNG (every tensor's checksum is compared with Python's).
pub fn materialize_into(recipe: &Path, tokenizer: &Path, dest: &Path) {
    let manifest: Manifest = read_json(&recipe.join("weights.json"));
    assert_eq!(manifest.prng.algorithm, "splitmix64-counter-v1");
    assert_eq!(manifest.prng.base_seed, BASE_SEED);
    let config: serde_json::Value = read_json(&recipe.join("config.json"));
    let derived = tensor_specs(&config);
    let recorded: Vec<TensorSpec> = manifest
        .tensors
        .iter()
        .map(|t| TensorSpec {
            checksum: None,
            ..t.clone()
        })
        .collect();
    assert_eq!(
        derived,
        recorded,
        "{}: weights.json lists other tensors than config.json implies",
        recipe.display()
    );

    copy_model(recipe, dest, &|p| p != "weights.json");
    for file in TOKENIZER_FILES {
        std::fs::copy(tokenizer.join(file), dest.join(file))
            .unwrap_or_else(io(&tokenizer.join(file)));
    }

    // model.safetensors: 8-byte header length, the JSON header padded with spaces to a
    // multiple of 8, then the tensors back to back in recipe order.
    let mut header = String::from(r#"{"__metadata__":{"format":"pt"}"#);
    let mut offsets = Vec::with_capacity(manifest.tensors.len());
    let mut end = 0u64;
    for t in &manifest.tensors {
        let bytes = t.shape.iter().product::<usize>() as u64 * 4;
        header.push_str(&format!(
            r#",{}:{{"dtype":"F32","shape":{},"data_offsets":[{end},{}]}}"#,
            serde_json::to_string(&t.name).expect("a string"),
            serde_json::to_string(&t.shape).expect("a list"),
            end + bytes
        ));
        offsets.push(end);
        end += bytes;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let data_start = 8 + header.len() as u64;
    let st_path = dest.join("model.safetensors");
    let mut st = File::create(&st_path).unwrap_or_else(io(&st_path));
    st.write_all(&(header.len() as u64).to_le_bytes())
        .and_then(|()| st.write_all(header.as_bytes()))
        .and_then(|()| st.set_len(data_start + end))
        .unwrap_or_else(io(&st_path));

    let onnx = &manifest.onnx;
    let data_path = dest.join(&onnx.data);
    let data = File::create(&data_path).unwrap_or_else(io(&data_path));
    data.set_len(onnx.data_length)
        .unwrap_or_else(io(&data_path));
    for init in &onnx.initializers {
        assert!(
            manifest.tensors.iter().any(|t| t.name == init.source),
            "{}: ONNX initializer {} has no source tensor {}",
            recipe.display(),
            init.name,
            init.source
        );
    }

    // Tensors are independent streams: generate them on every core, write under a lock.
    let files = Mutex::new((st, data));
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(t) = manifest.tensors.get(k) else {
                        break;
                    };
                    let (bytes, sum) = tensor_bytes(t.init, &t.shape, t.stream);
                    assert_eq!(
                        Some(&format!("{sum:#018x}")),
                        t.checksum.as_ref(),
                        "{}: tensor {} differs from what Python generated",
                        recipe.display(),
                        t.name
                    );
                    let onnx_parts: Vec<(u64, Option<Vec<u8>>)> = onnx
                        .initializers
                        .iter()
                        .filter(|init| init.source == t.name)
                        .map(|init| {
                            assert_eq!(init.length, bytes.len() as u64, "{}: length", init.name);
                            if init.transpose {
                                assert_eq!(t.shape.len(), 2, "{}: transposing a vector", init.name);
                                let (rows, cols) = (t.shape[0], t.shape[1]);
                                assert_eq!(init.dims, [cols, rows], "{}: dims", init.name);
                                (init.offset, Some(transpose_bytes(&bytes, rows, cols)))
                            } else {
                                assert_eq!(init.dims, t.shape, "{}: dims", init.name);
                                (init.offset, None)
                            }
                        })
                        .collect();
                    let mut guard = files.lock().unwrap_or_else(|e| e.into_inner());
                    let (st, data) = &mut *guard;
                    st.seek(SeekFrom::Start(data_start + offsets[k]))
                        .and_then(|_| st.write_all(&bytes))
                        .unwrap_or_else(io(&st_path));
                    for (offset, transposed) in &onnx_parts {
                        let part = transposed.as_ref().unwrap_or(&bytes);
                        data.seek(SeekFrom::Start(*offset))
                            .and_then(|_| data.write_all(part))
                            .unwrap_or_else(io(&data_path));
                    }
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every expected value below was printed by `tools/testdata/shapes.py` (its "PRNG pins"),
    // never computed by this code.

    #[test]
    fn splitmix64_is_vignas() {
        assert_eq!(splitmix64(0, 0), 0xe220a8397b1dcdaf);
        assert_eq!(splitmix64(0, 1), 0x6e789e6aa1b965f4);
    }

    #[test]
    fn streams_match_python() {
        assert_eq!(stream_seed(0), 0xd8b4a05f8044607f);
        assert_eq!(stream_seed(1), 0x08a127b4992a8b07);
        assert_eq!(stream_seed(2), 0xb274f1ac3f6a69a1);
        let s = stream_seed(0);
        let first: Vec<u64> = (0..4).map(|i| splitmix64(s, i)).collect();
        assert_eq!(
            first,
            [
                0x2732651b262c12a6,
                0xb4d9597362b33d5c,
                0x58b51ebbf1d9fa12,
                0xfb6bdfbc6a0832dd
            ]
        );
    }

    /// init, shape, stream, bits of the first four values, checksum.
    type Pin = (Init, &'static [usize], u64, [u32; 4], u64);

    #[test]
    fn tensors_match_python() {
        let cases: [Pin; 4] = [
            (
                Init::Embedding,
                &[2, 3],
                0,
                [0xbf99cfc2, 0x3f371309, 0xbf081cfe, 0x3fd5c5a7],
                0x13b2e4fca556c7f4,
            ),
            (
                Init::Norm,
                &[4],
                1,
                [0x3f88fbd0, 0x3f6d1664, 0x3f5651da, 0x3f6cf3eb],
                0xcf62155d4667ca6a,
            ),
            (
                Init::Linear,
                &[2, 3],
                2,
                [0xbd988c80, 0xbdfd8000, 0xbf5a68d4, 0xbf070768],
                0xeb075197386bdf00,
            ),
            (
                Init::Linear,
                &[1, 1024],
                5,
                [0xbd26c6c3, 0x3d0b653b, 0x3bbd6c55, 0x3cb6a417],
                0x9bcb171fd2234d84,
            ),
        ];
        for (init, shape, stream, bits, sum) in cases {
            let values = make_tensor(init, shape, stream);
            let got: Vec<u32> = values[..4].iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, bits, "{init:?} {shape:?} stream {stream}");
            assert_eq!(checksum(&values), sum, "{init:?} {shape:?} stream {stream}");
        }
    }

    /// The committed recipes list exactly the tensors their config.json implies (the full
    /// check, with every tensor's checksum, runs when a folder is materialized).
    #[test]
    fn committed_recipes_match_their_configs() {
        let set = ShapeSet::committed();
        for size in SIZES {
            let dir = set.recipe_dir(size);
            let manifest: Manifest = read_json(&dir.join("weights.json"));
            let config: serde_json::Value = read_json(&dir.join("config.json"));
            let derived = tensor_specs(&config);
            assert_eq!(manifest.size, size);
            assert_eq!(derived.len(), manifest.tensors.len(), "{size}");
            for (d, m) in derived.iter().zip(&manifest.tensors) {
                assert_eq!(
                    (&d.name, &d.shape, d.init, d.stream),
                    (&m.name, &m.shape, m.init, m.stream)
                );
            }
        }
    }
}
