//! Ruri v3 embeddings in pure Rust: ruri's own ModernBERT engine, with no C or C++ runtime
//! underneath, at fp32 and at int8 with exact integer kernels.
//!
//! [`builder()`] makes a [`ruri_core::TextEmbedder`] (the shared pipeline: prompts,
//! whitespace and truncation policies, length-sorted batches, normalization) around a
//! [`NativeBackend`], which reads `config.json` + `model.safetensors` (the official
//! cl-nagoya folders as they are) and turns a padded batch into mean-pooled vectors.
//!
//! ```
//! use ruri_native::Precision;
//!
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! // `folder`: a Ruri v3 sentence-transformers folder (here the repository's tiny test model).
//! let embedder = ruri_native::builder()
//!     .precision(Precision::Int8)
//!     .build_from_dir(folder)?;
//! let query = embedder.embed_query("瑠璃色はどんな色？")?;
//! assert_eq!(query.len(), embedder.dim());
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # The engine
//!
//! * **Packed tokens.** The texts of a batch are laid end to end: no padding token reaches
//!   a linear layer. Attention runs text by text (a local layer only over its keys
//!   `|i − j| ≤ local_attention / 2`, never a `seq × seq` matrix); mean pooling is
//!   accumulated while the final norm is applied.
//! * **int8** ([`Precision::Int8`]): weights quantized at load per output channel
//!   (symmetric, 8-bit), activations per token row (symmetric, 8-bit), products summed
//!   exactly in i32 by one of the [`Kernel`]s, then `f32(Σ) · s_x · s_w`. Input channels
//!   that carry a massive activation (found from the weights: columns read by tiny
//!   weights) are left out of the int8 product and added in f32 (LLM.int8()'s
//!   decomposition), so one huge channel does not coarsen the quantization of the row. In
//!   the layers not fed by a norm (the two `Wo`s), input channels that write (almost) only
//!   one output channel are a second int8 product with scales of their own. Attention's
//!   two products are exact integer sums too, of 13-bit operands ([int13
//!   attention](#int13-attention-int8s-default), unless told otherwise).
//!   `tools/testdata/int8_reference.py` implements the same scheme in NumPy.
//! * **fp32** ([`Precision::Fp32`]): the same layout with this crate's fp32 GEMM (weights
//!   packed once at load into 64-column panels; FMA where the CPU has it).
//!
//! # The same vector everywhere (int8)
//!
//! Integer sums are exact on every kernel, and every float step (norms, softmax, GELU,
//! rotary tables, pooling) is plain IEEE arithmetic in a fixed order with this crate's own
//! `exp` and `erf` and libm's pure-Rust `sin`/`cos`, so a text's int8 vector has the same
//! bits alone or in any batch, on every kernel, on every CPU. Force a kernel with
//! [`NativeBuilder::kernel`] or
//! `RURI_KERNEL=scalar|avx2|avxvnni|avx512vnni256|avx512vnni|amx|simd128|dotprod|i8mm` (an unknown
//! name, or one this CPU or build target cannot run, is [`ruri_core::Error::InvalidOption`];
//! `amx` runs on Linux on CPUs with AMX-INT8 (Intel since Sapphire Rapids), the fastest where
//! it runs; `simd128` in `wasm32` builds with the `simd128` target feature, `dotprod` and
//! `i8mm` on aarch64 CPUs with FEAT_DotProd and FEAT_I8MM; `avxvnni` on CPUs with AVX-VNNI,
//! and its EVEX twin `avx512vnni256`, the same source, on AVX-512 VNNI ones).
//! fp32 vectors depend on the CPU's instructions (FMA or not), within 1e-5 of
//! sentence-transformers.
//!
//! # bf16 attention (opt-in)
//!
//! Attention's two products run over every pair of positions a layer lets see each other:
//! on a long text they are most of the time (66 % of an 8,192-token text at int8 on Zen 4),
//! where the linears are most of it on short ones. [`AttentionPrecision::Bf16`]
//! ([`NativeBuilder::attention`], `--attention bf16` in the front ends) rounds q, k, v and
//! the softmax's weights to bfloat16 and sums their products in f32, two at a time, as
//! AVX-512 BF16's `vdpbf16ps` does: about half the time of an 8,192-token text on a CPU
//! with that instruction (BENCHMARKS.md). Its arithmetic is defined exactly (the module
//! `kernels::bf16`; the softmax is normalized after the weighted sum, as flash attention
//! does) and written twice: AVX-512 BF16 tiles, and portable loops that every other CPU
//! runs, more slowly than f32 attention. The tiles are run against the portable loops at
//! first use and kept only if every bit agrees, so the "same vector everywhere" rule holds
//! at either attention precision (`tools/testdata/int8_reference.py --attention bf16`
//! writes the same definition in NumPy; the engine matches it bit for bit). What it costs
//! in accuracy: min cosine 0.99999 to f32 attention on the tiny model's texts over 128
//! tokens, 0.99981 (against 0.99983) to sentence-transformers fp32 at the 30m shape.
//!
//! ```
//! use ruri_native::{AttentionPrecision, Precision};
//!
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! let exact = ruri_native::builder()
//!     .precision(Precision::Int8)
//!     .attention(AttentionPrecision::F32)
//!     .build_from_dir(folder)?;
//! let fast = ruri_native::builder()
//!     .precision(Precision::Int8)
//!     .attention(AttentionPrecision::Bf16)
//!     .build_from_dir(folder)?;
//! let text = "瑠璃色は紫みを帯びた濃い青。".repeat(20);
//! let (a, b) = (exact.embed_query(&text)?, fast.embed_query(&text)?);
//! let cosine: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
//! assert!(a != b && cosine > 0.999);
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # int13 attention (int8's default)
//!
//! [`AttentionPrecision::Int13`] (`--attention int13` in the front ends, and int8's
//! attention unless told otherwise) quantizes attention's
//! operands to 13-bit integers (±4,095) and sums their products exactly in integers, as
//! AVX-512 VNNI's `vpdpwssd` does, 32 multiply-adds an instruction: twice FMA's rate on the
//! Intel Xeon measured, so the fastest attention on a long text there, and closer to f32
//! attention than bf16's (BENCHMARKS.md, twenty-first step). Per head of a text:
//!
//! * q and k are quantized per row (a position), v per channel over the text: with `m` the
//!   largest magnitude, a value is `rint(x · (4095 / m))` and the scale `m / 4095` (f32);
//! * a score is the exact integer dot product, as f32, times the key's scale, times the
//!   query's; the softmax is bf16 attention's (its exps, totals and `1 / total`), each
//!   weight the integer `rint(4095 · e)`;
//! * an output is the exact integer sum of weight × value over the keys, as f32, times the
//!   channel's scale (divided by 4,095 once more), times `1 / total`.
//!
//! Every sum is an integer computed exactly, so the order of the sums does not matter: the
//! tiles (AVX-512 VNNI's, AVX2's `vpmaddwd`, aarch64 NEON's `smlal`, WebAssembly simd128's
//! `i32x4.dot_i16x8_s`) and the portable loops (the scalar kernel) give the same bits, and a
//! text's vector is the same alone, in any batch, on any thread count
//! (`tools/testdata/int8_reference.py --attention int13` writes the definition in NumPy; the
//! engine matches it bit for bit). What it costs in accuracy: min cosine 0.9999994 to f32
//! attention on the tiny model's texts over 128 tokens at int8 (bf16: 0.9999965),
//! 0.99982 to sentence-transformers fp32 at the 30m shape (bf16 0.99981, f32 0.99983).
//!
//! It is int8's default because it changes int8's vectors by less than int8's linears do
//! (above), keeps every property of int8's (integer sums, one NumPy definition, the same
//! bits everywhere), runs short texts at f32 attention's speed and a long one in half its
//! time (BENCHMARKS.md, twenty-fourth step). fp32 keeps f32 attention, and with it its
//! parity with sentence-transformers; `.attention(AttentionPrecision::F32)` gives int8 the
//! f32 attention of earlier versions.
//!
//! ```
//! use ruri_native::{AttentionPrecision, Precision};
//!
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! let int8 = ruri_native::builder().precision(Precision::Int8).build_from_dir(folder)?;
//! let engine = int8.backend_as::<ruri_native::NativeBackend>().unwrap();
//! assert_eq!(engine.attention(), AttentionPrecision::Int13);
//! let f32_attention = ruri_native::builder()
//!     .precision(Precision::Int8)
//!     .attention(AttentionPrecision::F32)
//!     .build_from_dir(folder)?;
//! let text = "瑠璃色は紫みを帯びた濃い青。".repeat(20);
//! let (a, b) = (int8.embed_query(&text)?, f32_attention.embed_query(&text)?);
//! let cosine: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
//! assert!(a != b && cosine > 0.9999);
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # ruri's int8 file
//!
//! [`NativeBuilder::write_int8_file`] (the command `ruri quantize MODEL_DIR`) writes what an
//! int8 load makes from `model.safetensors` into [`INT8_FILE`], `model.ruri-int8.safetensors`
//! (≈ 36 MiB for Ruri v3 30m with the int8 table, against 147 MB of fp32);
//! [`NativeBuilder::prequantized`] reads it instead of quantizing, to the same vectors, bit
//! for bit, on every kernel (`tests/prequant.rs`). A load then decodes no fp32 and
//! quantizes nothing: it reads the int8 rows and packs them for the kernel.
//!
//! * **A plain safetensors file**, so that any safetensors reader opens it: tensors I8, F32
//!   and I32; `__metadata__` = `format: "ruri-int8"`, `format_version: "1"` ([`INT8_FORMAT`],
//!   [`INT8_FORMAT_VERSION`]), the options that change the numbers (`embedding_table`:
//!   `int8`|`f32`, `outlier_channels`: `true`|`false`), the model's shape (`hidden_size`,
//!   `intermediate_size`, `num_hidden_layers`, `num_attention_heads`, `vocab_size`) and
//!   `writer`. The kernel and the threads are not recorded: they change no bit.
//! * **What quantization produced, in the natural order**, not a kernel's packed layout
//!   (packing is per kernel and cheap): per linear layer `L` (`layers.N.attn.Wqkv`, …) the
//!   weights `L.weight` (I8 `[n, k]`, outlier channels 0), `L.weight_scale` (F32 `[n]`),
//!   `L.outlier_channels` (I32 `[m]`, ascending) and `L.outlier_weight` (F32 `[m, n]`); a
//!   layer split into two int8 products has `L.main.*` and `L.side.*` instead (`weight`,
//!   `weight_scale`, and `columns`, I32: the input channels each reads). The norms as F32
//!   under the checkpoint's names; the table as I8 rows + `…tok_embeddings.weight_scale`, or
//!   F32. The MLP's units are in the loader's order (writer units last; `mlp.Wi`'s rows and
//!   `mlp.Wo`'s columns permuted alike: the same function).
//! * **Never used with other options or another model**: the options the builder leaves
//!   unset follow the file; one set to another value, [`Precision::Fp32`], or a
//!   `config.json` of another shape is [`Error::WeightsMismatch`],
//!   naming both values; another `format_version` is
//!   [`Error::Unsupported`]; a missing tensor, a wrong dtype or
//!   shape, channel indices out of order, a file cut short is
//!   [`Error::InvalidConfig`].
//! * **Chosen explicitly from a folder** ([`NativeBuilder::prequantized`], the facade's
//!   `EmbedderConfig::prequantized`, `--prequantized`); never picked up by itself, and
//!   [`NativeBackend::weights_file`] names the file read. Bytes ([`NativeBackend::from_bytes`],
//!   a [`Loader`]: WebAssembly) are recognized by their header's `format`.
//!
//! ```
//! # let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! # let folder = tempfile::tempdir().unwrap();
//! # let keep = |f: &str| f != "model.safetensors" && !f.starts_with("onnx/");
//! # ruri_testkit::copy_model(tiny.as_ref(), folder.path(), &keep);
//! use ruri_native::{EmbeddingTable, INT8_FILE};
//!
//! // Once: model.safetensors → model.ruri-int8.safetensors (`ruri quantize` does the same).
//! let writer = ruri_native::builder().embedding_table(EmbeddingTable::Int8);
//! writer.write_int8_file(tiny, folder.path().join(INT8_FILE))?;
//! // Every load after: the int8 file alone (this folder has no model.safetensors).
//! let embedder = ruri_native::builder().prequantized(true).build_from_dir(folder.path())?;
//! let at_load = writer.build_from_dir(tiny)?;
//! assert_eq!(embedder.embed_query("瑠璃色")?, at_load.embed_query("瑠璃色")?);
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # Threads
//!
//! A batch with several texts is split into groups of whole texts, one per thread, each
//! running the whole model: no thread joins inside a layer. A call of several batches keeps
//! one batch per thread in flight ([`ruri_core::Backend::parallelism`]), so that no worker
//! waits for the slower group of a batch. A pool of
//! [`NativeBuilder::threads`] workers (default: the machine's available parallelism) is
//! owned by the backend; idle workers spin briefly, then sleep. Where the platform reports
//! no parallelism (`wasm32-unknown-unknown`, which has no threads) the default is one thread
//! and no pool is started.
//!
//! One text alone runs on the caller's thread (a pool's wake-ups cost a short text more than
//! they save) up to 127 tokens, and on the pool from 128. With more than one thread, such a
//! text shares the columns of each product with one helper thread, when no other call is
//! running on the backend: every such text, except that with the AMX kernel only a text of
//! at most 32 tokens (a query; AMX's products are so fast that longer texts lost). The
//! helper is started on the first such text; it spins for 200 µs after each product, then
//! parks. While more than one call runs on the backend, and for 2 ms after, texts run on
//! their callers alone and the helper parks at once: two threads sending queries to one
//! embedder on a 2-core Zen 4 got 3,103 queries/s at a p99 of 0.97 ms this way, against
//! 2,650 at 1.78 ms when a helper woken between their calls took a core from one of them
//! (medians of 6 alternated rounds, BENCHMARKS.md, eleventh step). Each column is still
//! computed whole by one kernel, so the vectors keep their bits. On a 2-core Xeon with AMX
//! the helper took an int8 query's p50 from 0.72 to 0.62 ms, an fp32 query's from 5.9 to
//! 2.5 ms and a 123-token fp32 text from 39 to 27 ms; with the AVX-512 VNNI kernel a
//! 76-token int8 text from 6.7 to 6.1 ms, with AVX2 from 16.9 to 11.2 ms (BENCHMARKS.md).
//!
//! # Memory
//!
//! Weights are held once (the backend is `Send + Sync`; share it behind the embedder). The
//! token-embedding table is read row by row from the file the first time each token
//! appears, so rows a workload never uses take no memory.

#![deny(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod attention;
mod helper;
#[cfg(feature = "hub")]
mod hub;
mod kernels;
mod linear;
mod math;
mod model;
mod prequant;
mod stream;
mod weights;

pub use kernels::Kernel;
pub use prequant::{FORMAT as INT8_FORMAT, INT8_FILE, VERSION as INT8_FORMAT_VERSION};
pub use stream::Loader;

/// The int8 GEMM alone (and the fp32 GEMM, the GeGLU), for the kernel benchmarks
/// (`benches/kernels.rs`); not a stable API.
#[doc(hidden)]
pub mod bench {
    use crate::kernels::{Kernel, PackedWeights, QuantRows};

    /// An `n × k` weight matrix packed for a kernel, and `m` activation rows for it.
    pub struct Gemm {
        weights: PackedWeights,
        a: QuantRows,
        c: Vec<i32>,
        scratch: crate::kernels::aligned::Aligned<u8>,
    }

    impl Gemm {
        /// Deterministic pseudo-random operands of the given shape.
        pub fn new(kernel: Kernel, m: usize, n: usize, k: usize) -> Self {
            let byte = |i: usize| ((i.wrapping_mul(2_654_435_761) >> 7) % 255) as i32 - 127;
            let w: Vec<i8> = (0..n * k).map(|i| byte(i) as i8).collect();
            let weights = PackedWeights::pack(kernel, &w, n, k, vec![1.0; n]);
            let mut a = QuantRows::default();
            a.reset(m, k);
            for r in 0..m {
                let row = a.row_mut(r);
                for (j, v) in row[..k].iter_mut().enumerate() {
                    *v = byte(r * 7919 + j) as i8;
                }
                a.sums[r] = row.iter().map(|&v| i32::from(v)).sum();
            }
            let c = vec![0; m * weights.n_padded];
            Self {
                weights,
                a,
                c,
                scratch: Default::default(),
            }
        }

        /// One multiplication; returns a checksum so that it cannot be optimized away.
        pub fn run(&mut self) -> i64 {
            self.weights.gemm(&self.a, &mut self.c, &mut self.scratch);
            self.c.iter().step_by(61).map(|&v| i64::from(v)).sum()
        }
    }

    /// An `n × k` fp32 weight matrix packed as the fp32 linears hold it, and `m` rows for it.
    pub struct Fp32Gemm {
        packed: crate::kernels::aligned::Aligned<f32>,
        x: Vec<f32>,
        out: Vec<f32>,
        shape: (usize, usize, usize),
    }

    impl Fp32Gemm {
        /// Deterministic pseudo-random operands of the given shape.
        pub fn new(m: usize, n: usize, k: usize) -> Self {
            let value =
                |i: usize| ((i.wrapping_mul(2_654_435_761) >> 7) % 255) as f32 / 127.0 - 1.0;
            let w: Vec<f32> = (0..n * k).map(value).collect();
            let x = (0..m * k).map(|i| value(i * 7919 + 3)).collect();
            Self {
                packed: crate::kernels::simd_f32::pack_fp32(&w, n, k),
                x,
                out: vec![0.0; m * n],
                shape: (m, n, k),
            }
        }

        /// One multiplication (the widest version this CPU runs); returns a checksum.
        pub fn run(&mut self) -> f32 {
            let (m, n, k) = self.shape;
            crate::kernels::simd_f32::fp32_gemm(
                &self.x,
                m,
                k,
                &self.packed,
                n,
                &mut self.out,
                false,
                false,
            );
            self.out.iter().step_by(61).sum()
        }

        /// [`Fp32Gemm::run`] compiled for `isa` (`avx512`, `avx2` or `base`), or `None`
        /// where this CPU lacks it (or the name is not one of these).
        pub fn run_isa(&mut self, isa: &str) -> Option<f32> {
            use crate::kernels::simd_f32::Fp32Isa;
            let isa = match isa {
                "avx512" => Fp32Isa::Avx512,
                "avx2" => Fp32Isa::Avx2,
                "base" => Fp32Isa::Base,
                _ => return None,
            };
            let (m, n, k) = self.shape;
            let call = crate::kernels::simd_f32::Fp32Call {
                x: &self.x,
                rows: m,
                k,
                packed: &self.packed,
                n,
                out: &mut self.out,
                accumulate: false,
                gated: false,
            };
            call.on(isa)?;
            Some(self.out.iter().step_by(61).sum())
        }
    }

    /// The MLP's GeGLU, `out[j] = gelu(input[j]) · gate[j]` (the widest version this CPU
    /// runs), for the benchmark of its erf.
    pub fn geglu(input: &[f32], gate: &[f32], out: &mut [f32]) {
        crate::kernels::simd_f32::geglu(input, gate, out);
    }

    /// One text's attention, every head, as the engine runs a short text: q, k and v read in
    /// place from rows of `3 · heads · d` (Wqkv's output), the window covering the text.
    pub struct Attention {
        qkv: Vec<f32>,
        positions: Vec<u32>,
        heads: usize,
        d: usize,
        arithmetic: crate::attention::Arithmetic,
        scratch: crate::attention::AttentionScratch,
        out: Vec<f32>,
    }

    impl Attention {
        /// Deterministic pseudo-random q, k and v for a text of `len` tokens, attention in
        /// f32.
        pub fn new(len: usize, heads: usize, d: usize) -> Self {
            Self::with_precision(len, heads, d, crate::AttentionPrecision::F32)
        }

        /// [`new`](Self::new) with attention's products in `precision` (bf16 and int13:
        /// where this CPU runs them fastest).
        pub fn with_precision(
            len: usize,
            heads: usize,
            d: usize,
            precision: crate::AttentionPrecision,
        ) -> Self {
            use crate::attention::Arithmetic;
            use crate::kernels::{bf16, int13};
            let arithmetic = match precision {
                crate::AttentionPrecision::F32 => Arithmetic::F32,
                crate::AttentionPrecision::Bf16 => Arithmetic::Bf16(bf16::Products::detect()),
                crate::AttentionPrecision::Int13 => Arithmetic::Int13(int13::Products::detect()),
            };
            Self::with_products(len, heads, d, arithmetic)
        }

        /// [`new`](Self::new) with int13 attention in each place this CPU can run its
        /// products (the same bits in each), named: `portable` (the loops every CPU runs),
        /// `avx512vnni` (AVX-512 VNNI's `vpdpwssd` tiles).
        pub fn int13_variants(len: usize, heads: usize, d: usize) -> Vec<(&'static str, Self)> {
            crate::kernels::int13::Products::all()
                .into_iter()
                .map(|p| {
                    let arithmetic = crate::attention::Arithmetic::Int13(p);
                    (p.name(), Self::with_products(len, heads, d, arithmetic))
                })
                .collect()
        }

        /// [`new`](Self::new) with bf16 attention in each place this CPU can run its
        /// products (the same bits in each), named: `portable` (the loops every CPU runs),
        /// `vdpbf16ps` (AVX-512 BF16's tiles), `fma` (AVX-512F's FMA tiles), `avx2_fma`
        /// (AVX2's).
        pub fn bf16_variants(len: usize, heads: usize, d: usize) -> Vec<(&'static str, Self)> {
            crate::kernels::bf16::Products::all()
                .into_iter()
                .map(|p| {
                    let arithmetic = crate::attention::Arithmetic::Bf16(p);
                    (p.name(), Self::with_products(len, heads, d, arithmetic))
                })
                .collect()
        }

        fn with_products(
            len: usize,
            heads: usize,
            d: usize,
            arithmetic: crate::attention::Arithmetic,
        ) -> Self {
            let value =
                |i: usize| ((i.wrapping_mul(2_654_435_761) >> 7) % 4001) as f32 / 1000.0 - 2.0;
            Self {
                qkv: (0..len * 3 * heads * d).map(value).collect(),
                positions: (0..len as u32).collect(),
                heads,
                d,
                arithmetic,
                scratch: Default::default(),
                out: vec![0.0; len * heads * d],
            }
        }

        /// Every head once; returns a checksum.
        pub fn run(&mut self) -> f32 {
            let (heads, d) = (self.heads, self.d);
            let h = heads * d;
            let scale = 1.0 / (d as f32).sqrt();
            for head in 0..heads {
                let view = crate::attention::Head {
                    q: &self.qkv[head * d..],
                    k: &self.qkv[h + head * d..],
                    v: &self.qkv[2 * h + head * d..],
                    stride: 3 * h,
                    d,
                };
                let out = &mut self.out[head * d..];
                crate::attention::attend_head(
                    &view,
                    &self.positions,
                    usize::MAX / 2,
                    scale,
                    self.arithmetic,
                    &mut self.scratch,
                    out,
                    h,
                );
            }
            self.out.iter().step_by(61).sum()
        }
    }

    /// Quantizes `x` (rows of `k`) as the int8 linears stage their inputs, into `out`;
    /// returns a checksum (0 for rows of no values).
    pub fn quantize_rows(x: &[f32], k: usize, out: &mut [i8]) -> i32 {
        if k == 0 {
            return 0;
        }
        x.chunks_exact(k)
            .zip(out.chunks_exact_mut(k))
            .map(|(x, o)| crate::linear::quantize_row(x, o).1)
            .sum()
    }

    /// LayerNorm of each row of `x` (rows of `weight.len()`) as the engine norms a layer's
    /// input, into `out`; returns a checksum (0 for rows of no values).
    pub fn layer_norm_rows(x: &[f32], weight: &[f32], out: &mut [f32]) -> f32 {
        let k = weight.len();
        if k == 0 {
            return 0.0;
        }
        for (x, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(k)) {
            crate::kernels::simd_f32::layer_norm(x, weight, 1e-5, o);
        }
        out.iter().step_by(61).sum()
    }

    /// `C = A · Wᵀ` (`a`: `m × k`, `w`: `n × k`, row-major; C `m × n`) on `kernel`, for tests
    /// that check a kernel against a sum computed elsewhere (ruri-wasm's node test). `None`
    /// when the kernel does not run here or a length does not match its shape.
    pub fn int8_gemm(
        kernel: Kernel,
        a: &[i8],
        w: &[i8],
        m: usize,
        n: usize,
        k: usize,
    ) -> Option<Vec<i32>> {
        if !kernel.is_available() || a.len() != m.checked_mul(k)? || w.len() != n.checked_mul(k)? {
            return None;
        }
        let weights = PackedWeights::pack(kernel, w, n, k, vec![1.0; n]);
        let mut rows = QuantRows::default();
        rows.reset(m, k);
        for r in 0..m {
            let row = &a[r * k..(r + 1) * k];
            rows.row_mut(r)[..k].copy_from_slice(row);
            rows.sums[r] = row.iter().map(|&v| i32::from(v)).sum();
        }
        let mut c = vec![0; m * weights.n_padded];
        weights.gemm(&rows, &mut c, &mut Default::default());
        Some(
            c.chunks_exact(weights.n_padded.max(1))
                .take(m)
                .flat_map(|row| row[..n].iter().copied())
                .collect(),
        )
    }

    /// int13 attention's two products ([`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13))
    /// of one head, on the variant named `products` (`portable`, `avx2`, `avx512vnni`,
    /// `simd128`), for tests that check them against sums computed elsewhere (ruri-wasm's
    /// node test). `q` (`rows × d`), `k` and `v` (`keys × d`, row-major) are quantized as
    /// attention quantizes them: a row of q or k, or a channel of v, whose largest magnitude
    /// is 4,095 keeps integer values as they are, with the scale 1. Returns every query's
    /// scores against every key (`rows × keys`) and the exact sums `Σ_j p[r][j] · v[j][c]`
    /// (`rows × d`; `p`: `rows × keys` weights of at most 4,095). `None` when the variant
    /// does not run here, `d` is odd or 0, a weight is over 4,095, or a length does not
    /// match the shape.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub fn int13_products(
        products: &str,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        p: &[u16],
        rows: usize,
        keys: usize,
        d: usize,
    ) -> Option<(Vec<f32>, Vec<i64>)> {
        use crate::kernels::{aligned::Aligned, bf16::LANES, int13};
        let products = int13::Products::all()
            .into_iter()
            .find(|x| x.name() == products)?;
        let fits = d > 0
            && d.is_multiple_of(2)
            && q.len() == rows.checked_mul(d)?
            && k.len() == keys.checked_mul(d)?
            && v.len() == k.len()
            && p.len() == rows.checked_mul(keys)?
            && p.iter().all(|&w| i32::from(w) <= int13::LEVELS);
        if !fits {
            return None;
        }
        let (mut qp, mut sq) = (Vec::new(), Vec::new());
        int13::pack_queries(q, d, rows, d, &mut qp, &mut sq);
        let (mut kt, mut sk) = (Aligned::default(), Aligned::default());
        int13::pack_keys(k, d, keys, d, &mut kt, &mut sk);
        let (mut vp, mut sv) = (Aligned::default(), Vec::new());
        int13::pack_values(v, d, keys, d, &mut vp, &mut sv);
        let groups = keys.div_ceil(LANES);
        let width = groups * LANES;
        let mut scores = vec![0.0; rows * width];
        products.scores(
            (&qp, &sq),
            rows,
            d,
            (&kt, &sk),
            (0, groups),
            &mut scores,
            None,
        );
        // The weights in rows of whole pairs (a zero after an odd count).
        let pairs = keys.div_ceil(2);
        let mut weights = vec![0u16; rows * 2 * pairs];
        for (w, p) in weights
            .chunks_exact_mut(2 * pairs)
            .zip(p.chunks_exact(keys.max(1)))
        {
            w[..keys].copy_from_slice(p);
        }
        let mut sums = vec![0i64; rows * d];
        products.weighted_sum(&weights, rows, 2 * pairs, &vp, (0, pairs), d, &mut sums);
        let scores = scores
            .chunks_exact(width.max(1))
            .flat_map(|row| row[..keys].iter().copied());
        Some((scores.collect(), sums))
    }

    #[cfg(test)]
    mod tests {
        /// Rows of no values are nothing to do, not a panic (`chunks_exact(0)` panics).
        #[test]
        fn empty_rows_are_nothing_to_do() {
            assert_eq!(super::quantize_rows(&[], 0, &mut []), 0);
            assert_eq!(super::layer_norm_rows(&[], &[], &mut []), 0.0);
            // And a real row still gets its norm: mean 0, unit variance, times the weights.
            let mut out = [0.0f32; 2];
            super::layer_norm_rows(&[1.0, 3.0], &[2.0, 1.0], &mut out);
            assert!(
                (out[0] + 2.0).abs() < 1e-4 && (out[1] - 1.0).abs() < 1e-4,
                "{out:?}"
            );
        }

        /// `int13_products` (what ruri-wasm's kernel test calls) keeps integer rows whose
        /// largest magnitude is 4,095 and gives the exact sums, on every variant this CPU
        /// runs; it refuses unknown variants and shapes that do not match.
        #[test]
        fn int13_products_are_the_exact_sums() {
            let (rows, keys, d) = (3, 37, 24);
            let mut state = 0x2545_f491u32;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                state
            };
            let mut value = || (next() % 8191) as f32 - 4095.0;
            let mut q: Vec<f32> = (0..rows * d).map(|_| value()).collect();
            let mut k: Vec<f32> = (0..keys * d).map(|_| value()).collect();
            let mut v: Vec<f32> = (0..keys * d).map(|_| value()).collect();
            // Each row of q and k, and each channel of v, reaches 4,095.
            (0..rows).for_each(|r| q[r * d + r % d] = -4095.0);
            (0..keys).for_each(|j| k[j * d + j % d] = 4095.0);
            (0..d).for_each(|c| v[(c % keys) * d + c] = 4095.0);
            let p: Vec<u16> = (0..rows * keys).map(|i| (i * 977 % 4096) as u16).collect();
            for products in crate::kernels::int13::Products::all() {
                let name = products.name();
                let (scores, sums) =
                    super::int13_products(name, &q, &k, &v, &p, rows, keys, d).expect(name);
                for r in 0..rows {
                    for j in 0..keys {
                        let dot: f64 = (0..d).map(|c| f64::from(q[r * d + c] * k[j * d + c])).sum();
                        assert_eq!(scores[r * keys + j], dot as f32, "{name} {r} {j}");
                    }
                    for c in 0..d {
                        let sum: i64 = (0..keys)
                            .map(|j| i64::from(p[r * keys + j]) * v[j * d + c] as i64)
                            .sum();
                        assert_eq!(sums[r * d + c], sum, "{name} {r} {c}");
                    }
                }
            }
            let call = |name: &str, p: &[u16], d: usize| {
                super::int13_products(name, &q, &k, &v, p, rows, keys, d)
            };
            assert!(call("simd9", &p, d).is_none());
            assert!(call("portable", &p[1..], d).is_none());
            assert!(call("portable", &p, d + 1).is_none());
            let mut heavy = p.clone();
            heavy[5] = 4096;
            assert!(call("portable", &heavy, d).is_none());
        }
    }
}

use std::path::{Path, PathBuf};

use ndarray::Array2;
use ruri_core::{
    Backend, BackendOutput, BatchOptions, Error, ModelDir, PaddedBatch, Result, TextEmbedder,
    Whitespace,
};

use model::LoadOptions;
use model::{EMBEDDINGS, Model, Packed, bad_id};
use weights::{Header, Safetensors, Source};

/// A lone text (or batch of one group) splits its rows and heads over the workers from this
/// many tokens on.
const INTRA_TEXT_MIN_TOKENS: usize = 128;

/// The precision the encoder runs in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Precision {
    /// 32-bit floats: equal to sentence-transformers within 1e-5.
    Fp32,
    /// int8 weights and activations, exact i32 sums (default).
    #[default]
    Int8,
}

impl Named for Precision {
    const ALL: &[Self] = &[Precision::Int8, Precision::Fp32];
    const OPTION: &str = "precision";
    const KNOWN: &str = "known: int8, fp32";

    fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Int8 => "int8",
        }
    }
}

/// An option whose values go by names: those [`Display`](std::fmt::Display) writes and
/// `FromStr` reads (through [`by_name`]).
trait Named: Copy + 'static {
    /// Every value.
    const ALL: &[Self];
    /// The option's name in [`Error::InvalidOption`].
    const OPTION: &str;
    /// The reason given for an unknown name: the known ones.
    const KNOWN: &str;
    fn name(self) -> &'static str;
}

/// The value named `name` (exactly), or [`Error::InvalidOption`].
fn by_name<T: Named>(name: &str) -> Result<T> {
    T::ALL
        .iter()
        .copied()
        .find(|v| v.name() == name)
        .ok_or_else(|| Error::InvalidOption {
            name: T::OPTION,
            value: name.to_owned(),
            reason: T::KNOWN,
        })
}

/// How attention's two products (each query against the keys, the probabilities against
/// the values) are computed. Everything else (the linears, the softmax's arithmetic, the
/// norms) is the same either way.
///
/// The default follows the precision ([`AttentionPrecision::default_for`]): f32 at fp32,
/// which keeps its parity with sentence-transformers (1e-5), and int13 at int8, whose
/// linears are already integer products, the same bits on every CPU, and which takes half
/// f32's time on a long text at the same speed on short ones (BENCHMARKS.md, twenty-fourth
/// step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttentionPrecision {
    /// In f32 (fp32's default): each product a multiply and an add, in a fixed order. fp32
    /// keeps its parity with sentence-transformers (1e-5).
    F32,
    /// q, k, v and the probabilities rounded to bfloat16 (to nearest even), their products
    /// summed in f32 in pairs, as AVX-512 BF16's `vdpbf16ps` does: about half the time of
    /// [`F32`](Self::F32) on a long text where the CPU has that instruction, for vectors a
    /// little further from sentence-transformers'. The bits are the same on every CPU: one
    /// without the instruction (or whose instruction fails a check against the definition
    /// at first use) computes the same sums in portable code, more slowly than `F32`. Every
    /// text takes it, short or long. See the crate's documentation for the exact
    /// definition.
    Bf16,
    /// q and k quantized per row, v per channel, and the softmax's weights on a fixed
    /// scale, all to 13-bit integers (±4,095), their products summed exactly in integers,
    /// as AVX-512 VNNI's `vpdpwssd` does (twice FMA's multiply-adds a cycle): the fastest
    /// attention on a long text where the CPU has that instruction, and closer to f32
    /// attention than [`Bf16`](Self::Bf16) (BENCHMARKS.md, twenty-first step). The sums are
    /// exact integers, so the bits are the same on every CPU and in any order of the sums;
    /// other CPUs run the same exact products with AVX2's `vpmaddwd`, NEON's `smlal` or
    /// simd128's `i32x4.dot_i16x8_s`. Every text takes it, short or long.
    /// int8's default. See the crate's documentation for the exact definition.
    Int13,
}

impl AttentionPrecision {
    /// The attention a builder that is not told one runs at `precision`: [`F32`](Self::F32)
    /// at fp32, [`Int13`](Self::Int13) at int8.
    ///
    /// ```
    /// use ruri_native::{AttentionPrecision, Precision};
    ///
    /// assert_eq!(AttentionPrecision::default_for(Precision::Fp32), AttentionPrecision::F32);
    /// assert_eq!(AttentionPrecision::default_for(Precision::Int8), AttentionPrecision::Int13);
    /// ```
    pub const fn default_for(precision: Precision) -> Self {
        match precision {
            Precision::Fp32 => AttentionPrecision::F32,
            Precision::Int8 => AttentionPrecision::Int13,
        }
    }
}

impl Named for AttentionPrecision {
    const ALL: &[Self] = &[
        AttentionPrecision::F32,
        AttentionPrecision::Bf16,
        AttentionPrecision::Int13,
    ];
    const OPTION: &str = "attention";
    const KNOWN: &str = "known: f32, bf16, int13";

    fn name(self) -> &'static str {
        match self {
            AttentionPrecision::F32 => "f32",
            AttentionPrecision::Bf16 => "bf16",
            AttentionPrecision::Int13 => "int13",
        }
    }
}

/// How the token-embedding table is held (102,400 × 256 for Ruri v3: 105 MB in f32).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EmbeddingTable {
    /// The checkpoint's rows as they are, in f32 (default): read a row per token from the
    /// file when loaded from a folder or from bytes (the table is not held), held whole when
    /// streamed with [`NativeBackend::loader`].
    #[default]
    F32,
    /// Each row quantized at load, symmetric 8-bit per row (`s = max|row| / 127`, rounded
    /// as the int8 activations are), and dequantized (`q · s`, in f32) when a token is
    /// embedded: held as `vocab × hidden` bytes and one scale a row (26 MB for Ruri v3),
    /// with no file to read. The same bits on every platform. Its cost against
    /// sentence-transformers fp32 at the four Ruri v3 shapes (`tests/shapes.rs`): min
    /// cosine 0.99998 with the fp32 encoder, 0.99970 with the int8 one (0.99975 with the
    /// f32 table); on the 30m-shape benchmark model, int8, 0.99794 (0.99935 with the f32
    /// table; BENCHMARKS.md). ruri-wasm's default.
    Int8,
}

/// The names are also those of ruri's int8 file's `embedding_table`.
impl Named for EmbeddingTable {
    const ALL: &[Self] = &[EmbeddingTable::F32, EmbeddingTable::Int8];
    const OPTION: &str = "embedding_table";
    const KNOWN: &str = "known: f32, int8";

    fn name(self) -> &'static str {
        match self {
            EmbeddingTable::F32 => "f32",
            EmbeddingTable::Int8 => "int8",
        }
    }
}

/// `Display` and `FromStr` of [`Named`] types: the names of [`Named::ALL`]; another name is
/// [`Error::InvalidOption`] (option [`Named::OPTION`]).
macro_rules! named_options {
    ($($ty:ty),*) => {$(
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = Error;

            fn from_str(name: &str) -> Result<Self> {
                by_name(name)
            }
        }
    )*};
}

named_options!(Precision, AttentionPrecision, EmbeddingTable);

/// Starts a builder of a [`TextEmbedder`] on the native engine (`ruri::native::builder()`).
pub fn builder() -> NativeBuilder {
    NativeBuilder::default()
}

/// Builds a [`TextEmbedder`] on the native engine. Setters never fail; everything is
/// checked in [`build_from_dir`](NativeBuilder::build_from_dir).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct NativeBuilder {
    precision: Precision,
    kernel: Option<Kernel>,
    threads: Option<usize>,
    outliers: Option<bool>,
    batching: Option<BatchOptions>,
    whitespace: Whitespace,
    /// `None`: [`EmbeddingTable::F32`], or what ruri's int8 file holds.
    table: Option<EmbeddingTable>,
    prequantized: bool,
    /// `None`: [`AttentionPrecision::default_for`] the precision.
    attention: Option<AttentionPrecision>,
}

impl NativeBuilder {
    /// fp32 or int8 (default [`Precision::Int8`]).
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The int8 kernel (default: `RURI_KERNEL` if set, else the fastest this CPU runs).
    pub fn kernel(mut self, kernel: Kernel) -> Self {
        self.kernel = Some(kernel);
        self
    }

    /// How attention's products are computed, at either precision (default
    /// [`AttentionPrecision::default_for`] the precision: f32 at fp32, int13 at int8).
    pub fn attention(mut self, attention: AttentionPrecision) -> Self {
        self.attention = Some(attention);
        self
    }

    /// Worker threads (default: the machine's available parallelism; 1 runs on the
    /// caller's thread).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// Whether int8 treats massive activations apart (default `true`): the norm-fed layers
    /// compute their outlier input channels in f32, and the other layers give the input
    /// channels that write one output channel an int8 product of their own.
    pub fn outlier_channels(mut self, enabled: bool) -> Self {
        self.outliers = Some(enabled);
        self
    }

    /// Batch limits of the pipeline (default: [`BatchOptions::default`]).
    pub fn batching(mut self, batching: BatchOptions) -> Self {
        self.batching = Some(batching);
        self
    }

    /// How the token-embedding table is held (default [`EmbeddingTable::F32`]; from ruri's
    /// int8 file, what the file holds).
    pub fn embedding_table(mut self, table: EmbeddingTable) -> Self {
        self.table = Some(table);
        self
    }

    /// Load ruri's int8 file, [`INT8_FILE`] (`model.ruri-int8.safetensors`, written by
    /// [`write_int8_file`](Self::write_int8_file) or `ruri quantize`), instead of quantizing
    /// `model.safetensors` (default `false`): the same vectors, bit for bit, with no fp32
    /// to read or quantize. The file's options (embedding table, outlier channels) apply; one
    /// set here to another value, or [`Precision::Fp32`], is
    /// [`Error::WeightsMismatch`], and a file made for
    /// another `config.json` too. [`NativeBackend::weights_file`] says which file was read.
    /// (Bytes given to [`NativeBackend::from_bytes`] or a [`Loader`] are recognized by their
    /// header: either kind is read, with the same checks.)
    pub fn prequantized(mut self, enabled: bool) -> Self {
        self.prequantized = enabled;
        self
    }

    /// Whitespace policy for prompt + text (default [`Whitespace::Keep`]).
    pub fn whitespace(mut self, whitespace: Whitespace) -> Self {
        self.whitespace = whitespace;
        self
    }

    /// Writes ruri's int8 file of the model folder `dir` (its `config.json` and
    /// `model.safetensors`) to `out` (in the folder, name it [`INT8_FILE`] so that
    /// [`prequantized`](Self::prequantized) finds it): the int8 weights a load with this
    /// builder's options would make. The file appears whole or not at all (written beside
    /// `out`, then renamed). Returns its size in bytes. Only the options that change the
    /// numbers are recorded (embedding table, outlier channels); the precision must be
    /// int8.
    pub fn write_int8_file(&self, dir: impl AsRef<Path>, out: impl AsRef<Path>) -> Result<u64> {
        let dir = ModelDir::open(dir)?;
        let config = dir.config();
        config.check_supported(&dir.path().join("config.json"))?;
        let path = dir.file("model.safetensors")?;
        let bytes = self.quantize(config, path.clone(), weights::open_file(&path)?)?;
        let out = out.as_ref();
        let mut partial = out.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        std::fs::write(&partial, &bytes).map_err(io(&partial))?;
        std::fs::rename(&partial, out).map_err(io(out))?;
        Ok(bytes.len() as u64)
    }

    /// ruri's int8 file, as bytes, from a `config.json` text and the bytes of
    /// `model.safetensors` ([`write_int8_file`](Self::write_int8_file) without a file
    /// system).
    pub fn int8_file_bytes(
        &self,
        config_json: &str,
        safetensors: impl Into<std::sync::Arc<[u8]>>,
    ) -> Result<Vec<u8>> {
        let config = ruri_core::ModelConfig::from_json_str(config_json, "config.json")?;
        config.check_supported(Path::new("config.json"))?;
        let source = Source::Bytes(safetensors.into());
        self.quantize(&config, PathBuf::from("model.safetensors"), source)
    }

    fn quantize(
        &self,
        config: &ruri_core::ModelConfig,
        path: PathBuf,
        source: Source,
    ) -> Result<Vec<u8>> {
        if self.precision != Precision::Int8 {
            return Err(Error::InvalidOption {
                name: "precision",
                value: self.precision.to_string(),
                reason: "ruri's int8 file holds int8 weights: quantize at int8",
            });
        }
        let header = Header::read(&path, &source)?;
        if prequant::is_int8_file(&path, &header)? {
            return Err(Error::InvalidConfig {
                path,
                reason: "already ruri's int8 file; quantize model.safetensors".into(),
            });
        }
        let weights = Safetensors::from_header(path, source, &header, config)?;
        let (options, threads) = NativeBackend::options(self)?;
        let quantized = Model::quantize(config, &weights, options, threads)?;
        let table = match options.table {
            EmbeddingTable::Int8 => None,
            EmbeddingTable::F32 => {
                let mut rows = Vec::new();
                weights.read_rows_into(EMBEDDINGS, 0, config.vocab_size, &mut rows)?;
                Some(rows)
            }
        };
        Ok(prequant::write(config, &options, quantized, table))
    }

    /// The weights file this builder reads from a folder.
    fn weights_name(&self) -> &'static str {
        if self.prequantized {
            INT8_FILE
        } else {
            "model.safetensors"
        }
    }

    /// Opens the model folder and prepares the weights of `model.safetensors` (or, with
    /// [`prequantized`](Self::prequantized), reads ruri's int8 file).
    pub fn build_from_dir(self, dir: impl AsRef<Path>) -> Result<TextEmbedder> {
        let dir = ModelDir::open(dir)?;
        let embedder =
            TextEmbedder::load(&dir, self.batching, || NativeBackend::load(&dir, &self))?
                .with_whitespace(self.whitespace);
        Ok(embedder)
    }
}

/// The native [`Backend`]: ModernBERT weights prepared for one precision and kernel.
#[derive(Debug)]
pub struct NativeBackend {
    model: Model,
    pool: Option<rayon::ThreadPool>,
    /// With more than one thread: a helper for short texts' products
    /// (`helper.rs`), started on first use; `None` inside if it could not start.
    helper: std::sync::OnceLock<Option<std::sync::Arc<helper::Helper>>>,
    /// Calls of `forward` running now, shared with the helper: it serves only a call that
    /// runs alone, and parks instead of spinning while others run (under concurrent calls
    /// its work and its spinning would take a core another call could use).
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    weights: PathBuf,
    precision: Precision,
}

impl NativeBackend {
    /// Loads `model.safetensors` of `dir` as `builder` says (or [`INT8_FILE`] with
    /// [`NativeBuilder::prequantized`]).
    pub fn load(dir: &ModelDir, builder: &NativeBuilder) -> Result<Self> {
        let weights = dir.file(builder.weights_name())?;
        let config_path = dir.path().join("config.json");
        dir.config().check_supported(&config_path)?;
        let source = weights::open_file(&weights)?;
        Self::open(dir.config(), source, builder, weights)
    }

    /// A backend from a `config.json` text and the bytes of `model.safetensors` or of
    /// ruri's int8 file (told apart by the header's metadata), with no file system
    /// (WebAssembly hosts pass both in): hand it to
    /// [`TextEmbedder::from_texts`](ruri_core::TextEmbedder::from_texts) with the model's
    /// [`ModelTexts`](ruri_core::ModelTexts), which checks the tokenizer against
    /// `config.json` (the facade's `EmbedderConfig::loader` does this for the streamed
    /// [`loader`](Self::loader)). Errors as
    /// [`load`](Self::load)'s; the bytes are read in place, not copied.
    pub fn from_bytes(
        builder: &NativeBuilder,
        config_json: &str,
        safetensors: impl Into<std::sync::Arc<[u8]>>,
    ) -> Result<Self> {
        let config = ruri_core::ModelConfig::from_json_str(config_json, "config.json")?;
        config.check_supported(Path::new("config.json"))?;
        let label = PathBuf::from("model.safetensors");
        Self::open(&config, Source::Bytes(safetensors.into()), builder, label)
    }

    /// Starts a backend from a `config.json` text, to be fed the bytes of
    /// `model.safetensors` (or of ruri's int8 file, told apart by its header) in order, in chunks of any size ([`Loader::push`]), and made by
    /// [`Loader::finish`]: each tensor is prepared as soon as its bytes are in and then
    /// dropped, so the file is never held whole (WebAssembly hosts stream it). The same
    /// prepared weights, and the same errors, as [`from_bytes`](Self::from_bytes) with the
    /// same builder.
    pub fn loader(builder: &NativeBuilder, config_json: &str) -> Result<Loader> {
        let config = ruri_core::ModelConfig::from_json_str(config_json, "config.json")?;
        config.check_supported(Path::new("config.json"))?;
        let (options, threads) = Self::options(builder)?;
        Ok(Loader::new(
            config,
            options,
            threads,
            builder.precision,
            builder.table,
            builder.outliers,
        ))
    }

    /// The builder's options, checked, and its worker threads.
    fn options(builder: &NativeBuilder) -> Result<(LoadOptions, usize)> {
        let kernel = match builder.kernel {
            Some(kernel) => {
                kernel.ensure_available("kernel")?;
                kernel
            }
            None => Kernel::from_env()?,
        };
        let threads = match builder.threads {
            Some(0) => {
                return Err(Error::InvalidOption {
                    name: "threads",
                    value: "0".into(),
                    reason: "needs at least one thread",
                });
            }
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let options = LoadOptions {
            precision: builder.precision,
            kernel,
            outliers: builder.outliers.unwrap_or(true),
            table: builder.table.unwrap_or_default(),
            attention: builder
                .attention
                .unwrap_or(AttentionPrecision::default_for(builder.precision)),
        };
        Ok((options, threads))
    }

    /// The weights of `source` (`path` names it): a checkpoint, quantized as `builder`
    /// says, or ruri's int8 file, read (its header says which).
    fn open(
        config: &ruri_core::ModelConfig,
        source: Source,
        builder: &NativeBuilder,
        path: PathBuf,
    ) -> Result<Self> {
        let header = Header::read(&path, &source)?;
        let (options, threads) = Self::options(builder)?;
        if prequant::is_int8_file(&path, &header)? {
            // Bytes are named by what they are, in errors and `weights_file`.
            let path = match source {
                Source::Bytes(_) => PathBuf::from(INT8_FILE),
                Source::File(_) => path,
            };
            let file = prequant::file_options(&path, &header, config)?;
            let options = file.resolve(&path, options, builder.table, builder.outliers)?;
            let plan = prequant::Plan::new(&path, &header, config, file)?;
            let model = prequant::load(path.clone(), source, &plan, config, options, threads)?;
            return Self::with_model(model, threads, path, Precision::Int8);
        }
        if builder.prequantized {
            return Err(Error::InvalidConfig {
                path,
                reason: format!(
                    "not ruri's int8 file (its __metadata__ has no format = {}; \
                     `ruri quantize` writes one)",
                    prequant::FORMAT
                ),
            });
        }
        let safetensors = Safetensors::from_header(path.clone(), source, &header, config)?;
        let model = Model::load(config, safetensors, options, threads)?;
        Self::with_model(model, threads, path, builder.precision)
    }

    fn with_model(
        model: Model,
        threads: usize,
        weights: PathBuf,
        precision: Precision,
    ) -> Result<Self> {
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("ruri-native-{i}"))
                    .build()
                    .map_err(|e| Error::Backend {
                        backend: "native",
                        context: format!("starting {threads} worker threads"),
                        source: Box::new(e),
                    })?,
            )
        } else {
            None
        };
        Ok(Self {
            model,
            pool,
            helper: std::sync::OnceLock::new(),
            in_flight: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            weights,
            precision,
        })
    }

    /// The helper for a short text's products: with more than one thread on a machine with
    /// more than one core, and no other call running; started on first use. A thread that cannot start leaves the text on the caller's thread alone
    /// (the same vectors, only slower).
    fn helper(&self) -> Option<std::sync::Arc<helper::Helper>> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if self.pool.is_none()
            || cores < 2
            || self.in_flight.load(std::sync::atomic::Ordering::Relaxed) > 1
        {
            return None;
        }
        self.helper
            .get_or_init(|| {
                helper::Helper::start(std::sync::Arc::clone(&self.in_flight))
                    .ok()
                    .map(std::sync::Arc::new)
            })
            .clone()
    }

    /// The precision the encoder runs in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// How attention's products are computed.
    pub fn attention(&self) -> AttentionPrecision {
        self.model.attention()
    }

    /// The int8 kernel in use (`None` at fp32).
    pub fn kernel(&self) -> Option<Kernel> {
        self.model.kernel()
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or(1, |p| p.current_num_threads())
    }

    /// The safetensors file the weights came from.
    pub fn weights_file(&self) -> &Path {
        &self.weights
    }

    /// Bytes of prepared layer weights held (the embedding table is read per token, not
    /// held).
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }
}

/// Counts a call of `forward` while it runs.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Backend for NativeBackend {
    fn dim(&self) -> usize {
        self.model.hidden()
    }

    /// One batch per worker at a time: the pipeline keeps as many batches in flight as the
    /// pool has workers, so while one batch's groups finish (they are split by token count,
    /// not by time) or the pipeline pads the next one, the other batch's groups keep the
    /// idle worker busy. Each batch still splits into groups on the same pool, so the work
    /// never exceeds the pool's threads; vectors do not depend on the batch (see the crate's
    /// docs). Measured on a 2-core Zen 4: +4 % documents/s at int8 and fp32, ≈ 4 MB more peak RSS
    /// (BENCHMARKS.md, ninth step).
    fn parallelism(&self) -> usize {
        self.threads()
    }

    fn forward(&self, batch: &PaddedBatch) -> Result<BackendOutput> {
        let _in_flight = InFlight::enter(&self.in_flight);
        let (rows, seq) = (batch.batch_size(), batch.seq_len());
        let (ids_in, mask) = (batch.input_ids(), batch.attention_mask());
        if seq > self.model.max_positions() {
            return Err(Error::InvalidOption {
                name: "input_ids",
                value: format!("{seq} positions"),
                reason: "longer than the model's max_position_embeddings",
            });
        }
        // Pack the tokens under the mask; positions stay their column (transformers'
        // position_ids = arange(seq) with the padding masked out).
        let mut ids = Vec::with_capacity(ids_in.len());
        let mut positions = Vec::with_capacity(ids_in.len());
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        for r in 0..rows {
            for c in 0..seq {
                if mask[r * seq + c] != 0 {
                    let id = ids_in[r * seq + c];
                    let id = u32::try_from(id)
                        .ok()
                        .filter(|&v| (v as usize) < self.model.vocab())
                        .ok_or_else(|| bad_id(id))?;
                    ids.push(id);
                    positions.push(c as u32);
                }
            }
            offsets.push(ids.len());
        }
        let h = self.dim();
        let mut out = vec![0.0f32; rows * h];
        let groups = self.groups(&offsets);
        match (&self.pool, groups.len()) {
            (Some(pool), n) if n > 1 => {
                // One result slot per group, written by its task (a blocking wait inside the
                // scope would hold a worker and serialize the groups).
                let mut results: Vec<Result<()>> = (0..n).map(|_| Ok(())).collect();
                let mut chunks = Vec::with_capacity(n);
                let mut rest = out.as_mut_slice();
                for g in &groups {
                    let (head, tail) = rest.split_at_mut(g.len() * h);
                    chunks.push(head);
                    rest = tail;
                }
                pool.scope(|s| {
                    for ((g, chunk), result) in groups.iter().zip(chunks).zip(&mut results) {
                        let (ids, positions, offsets) = (&ids, &positions, &offsets);
                        s.spawn(move |_| {
                            let base = offsets[g.start];
                            let local: Vec<usize> =
                                offsets[g.start..=g.end].iter().map(|o| o - base).collect();
                            let end = offsets[g.end];
                            let packed = Packed {
                                ids: &ids[base..end],
                                positions: &positions[base..end],
                                offsets: &local,
                            };
                            *result = self.model.embed(&packed, chunk, None, None);
                        });
                    }
                });
                results.into_iter().collect::<Result<()>>()?;
            }
            _ => {
                let packed = Packed {
                    ids: &ids,
                    positions: &positions,
                    offsets: &offsets,
                };
                // Splitting one short text's layers over the workers costs a wake-up per
                // layer step (measured: a 10-token query took 1.7 ms on two workers, 0.9 ms
                // on one); long texts gain from it. A shorter one shares its products'
                // columns with the helper thread instead: any, except with AMX only a
                // query-sized one (see `linear::helper_max_rows`).
                if ids.len() >= INTRA_TEXT_MIN_TOKENS {
                    self.model
                        .embed(&packed, &mut out, self.pool.as_ref(), None)?;
                } else {
                    let limit = linear::helper_max_rows(self.model.kernel());
                    let helper = (ids.len() <= limit).then(|| self.helper()).flatten();
                    self.model.embed(&packed, &mut out, None, helper)?;
                }
            }
        }
        let pooled = Array2::from_shape_vec((rows, h), out).map_err(|e| Error::ModelOutput {
            reason: format!("pooled output of unexpected size: {e}"),
        })?;
        Ok(BackendOutput::Pooled(pooled))
    }
}

impl NativeBackend {
    /// Contiguous groups of whole texts with about equal token counts, one per worker
    /// (fewer when there are fewer texts).
    fn groups(&self, offsets: &[usize]) -> Vec<std::ops::Range<usize>> {
        let texts = offsets.len() - 1;
        let workers = self.threads().min(texts).max(1);
        let total = offsets[texts];
        let mut groups = Vec::with_capacity(workers);
        let mut start = 0;
        for w in 1..=workers {
            let target = total * w / workers;
            let mut end = start;
            while end < texts && (offsets[end + 1] <= target || end == start) {
                end += 1;
            }
            if w == workers {
                end = texts;
            }
            if end > start {
                groups.push(start..end);
            }
            start = end;
        }
        groups
    }
}

#[cfg(test)]
mod names {
    use super::*;

    /// The option names a configuration, a command line or JavaScript gives (written out
    /// here, not taken from the code): each parses to its value and is what it displays.
    #[test]
    fn option_names_parse_to_their_values_and_back() {
        for (name, value) in [("int8", Precision::Int8), ("fp32", Precision::Fp32)] {
            assert_eq!(name.parse::<Precision>().unwrap(), value);
            assert_eq!(value.to_string(), name);
        }
        for (name, value) in [
            ("f32", AttentionPrecision::F32),
            ("bf16", AttentionPrecision::Bf16),
            ("int13", AttentionPrecision::Int13),
        ] {
            assert_eq!(name.parse::<AttentionPrecision>().unwrap(), value);
            assert_eq!(value.to_string(), name);
        }
        for (name, value) in [("f32", EmbeddingTable::F32), ("int8", EmbeddingTable::Int8)] {
            assert_eq!(name.parse::<EmbeddingTable>().unwrap(), value);
            assert_eq!(value.to_string(), name);
        }
    }

    /// Each option's error lists exactly its names, in `ALL`'s order: `KNOWN` is written
    /// beside the names, and must not drift from them.
    #[test]
    fn the_known_names_are_every_name() {
        fn listed<T: Named>() -> String {
            let names: Vec<_> = T::ALL.iter().map(|v| v.name()).collect();
            format!("known: {}", names.join(", "))
        }
        assert_eq!(listed::<Precision>(), Precision::KNOWN);
        assert_eq!(listed::<AttentionPrecision>(), AttentionPrecision::KNOWN);
        assert_eq!(listed::<EmbeddingTable>(), EmbeddingTable::KNOWN);
    }

    /// Another name (exact, case and all) is a typed error naming the option and the value.
    #[test]
    fn unknown_names_are_invalid_options() {
        let refused = [
            ("precision", "fp16", "fp16".parse::<Precision>().err()),
            ("precision", "INT8", "INT8".parse::<Precision>().err()),
            (
                "attention",
                "int8",
                "int8".parse::<AttentionPrecision>().err(),
            ),
            ("attention", "", "".parse::<AttentionPrecision>().err()),
            (
                "embedding_table",
                "bf16",
                "bf16".parse::<EmbeddingTable>().err(),
            ),
        ];
        for (option, given, error) in refused {
            match error {
                Some(Error::InvalidOption {
                    name,
                    value,
                    reason,
                }) => {
                    assert_eq!((name, value.as_str()), (option, given));
                    assert!(reason.starts_with("known: "), "{reason}");
                }
                other => panic!("{option} {given:?}: expected InvalidOption, got {other:?}"),
            }
        }
    }
}
