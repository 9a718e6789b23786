//! Ruri v3 embeddings for JavaScript: ruri's native engine (int8, exact integer sums with the
//! simd128 kernel) compiled to WebAssembly and bound with wasm-bindgen.
//!
//! ```js
//! import { Embedder } from "./pkg/node/ruri_wasm.js";
//! // config.json's text, tokenizer.json's text, model.safetensors' bytes (a Uint8Array).
//! const embedder = new Embedder(configJson, tokenizerJson, weights);
//! const query = embedder.embedQuery("瑠璃色はどんな色？"); // Float32Array, unit norm
//! const docs = embedder.embedDocuments(["瑠璃色は紫みを帯びた濃い青。"]); // Float32Array[]
//! ```
//!
//! * **No file system, no threads.** Everything is passed in as text or bytes; the engine runs
//!   on the caller's thread (`wasm32-unknown-unknown` has no threads, so no pool is started).
//! * **The same vectors as the native engine on x86**: the int8 scheme is the same and every
//!   float step is plain IEEE arithmetic in the same order (ruri-native's crate docs), so a
//!   text's int8 vector has the same bits here (`tests/parity.mjs` checks it).
//! * **The file never whole in linear memory**: the safetensors bytes are read a slice
//!   at a time and each tensor is prepared as soon as its bytes are in ([`EmbedderLoader`]
//!   takes them as a stream, e.g. a `fetch` body; [`Embedder::new`] from one array). The
//!   token-embedding table is held in int8 per row by default (`embeddingTable: "int8"`,
//!   26 MB for Ruri v3 instead of 105): the x86 engine gives the same bits with
//!   `ruri_native::builder().embedding_table(EmbeddingTable::Int8)`.
//! * **ruri's int8 file** (`model.ruri-int8.safetensors`, written by `ruri quantize` or by
//!   [`quantize`] here) is taken wherever `model.safetensors` is, told apart by its header:
//!   a quarter of the bytes to fetch, nothing to quantize, the same vectors bit for bit.
//!   Its options must agree with the embedder's (`embeddingTable` is `"int8"` by default,
//!   as `ruri quantize`'s): another is a `RuriError` of kind `WeightsMismatch`.
//! * **Errors** are JavaScript `Error`s named `RuriError`, with ruri's message (the cause chain
//!   included) and the variant of `ruri_core::Error` in `kind`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use ruri_core::{Error, ModelConfig, Prompts, TextEmbedder, Tokenizer};
use ruri_native::{AttentionPrecision, EmbeddingTable, Kernel, NativeBuilder, Precision};
use wasm_bindgen::prelude::*;

/// A Ruri v3 embedder on ruri's native engine (int8 by default).
#[wasm_bindgen]
pub struct Embedder {
    inner: TextEmbedder,
    kernel: Option<Kernel>,
    attention: AttentionPrecision,
}

#[wasm_bindgen]
impl Embedder {
    /// `configJson`: the text of `config.json`; `tokenizerJson`: the text of
    /// `tokenizer.json`; `weights`: the bytes of `model.safetensors` or of ruri's int8 file
    /// `model.ruri-int8.safetensors` (a `Uint8Array`, or an `ArrayBuffer`). Options (all
    /// optional):
    /// `kernel` (`"simd128"` or `"scalar"`; default simd128), `precision` (`"int8"` or
    /// `"fp32"`; default int8), `embeddingTable` (`"int8"`: each row of the token-embedding
    /// table quantized at load, 8-bit per row, dequantized per token; `"f32"`: held as the
    /// checkpoint's values, 4× the memory; default int8), `attention` (how attention's two
    /// products are computed: `"int13"`, 13-bit integers with exact sums, int8's default,
    /// 0.29× f32's time on a long text with simd128's `i32x4.dot_i16x8_s` and as fast on
    /// short ones; `"f32"`, fp32's default; `"bf16"`; the same bits as the x86 engine's with
    /// the same attention, ruri-native's `AttentionPrecision`),
    /// `maxLength` (tokens, special ones
    /// included; default the model's `max_position_embeddings`, as sentence-transformers'
    /// 8192 for Ruri v3). The bytes are read a slice at a time, as [`EmbedderLoader`]
    /// reads them: drop your array after the constructor returns.
    #[wasm_bindgen(constructor)]
    pub fn new(
        config_json: &str,
        tokenizer_json: &str,
        weights: JsValue,
        options: Option<js_sys::Object>,
    ) -> Result<Embedder, JsValue> {
        let mut loader = EmbedderLoader::new(config_json, tokenizer_json, options)?;
        loader.push(weights)?;
        loader.finish()
    }

    /// A search query (prefixed `"検索クエリ: "`), L2-normalized.
    #[wasm_bindgen(js_name = embedQuery)]
    pub fn embed_query(&self, text: &str) -> Result<Vec<f32>, JsValue> {
        self.inner.embed_query(text).map_err(to_js)
    }

    /// Documents (prefixed `"検索文書: "`), one `Float32Array` each, in input order.
    #[wasm_bindgen(js_name = embedDocuments)]
    pub fn embed_documents(
        &self,
        texts: Vec<String>,
    ) -> Result<Vec<js_sys::Float32Array>, JsValue> {
        let embeddings = self.inner.embed_documents(&texts).map_err(to_js)?;
        Ok(embeddings.iter().map(js_sys::Float32Array::from).collect())
    }

    /// Texts with the prompt of `task`: `"query"` (`"検索クエリ: "`), `"document"`
    /// (`"検索文書: "`), `"topic"` (`"トピック: "`) or `""` / omitted (no prompt, the
    /// similarity task); one `Float32Array` each, in input order.
    pub fn embed(
        &self,
        texts: Vec<String>,
        task: Option<String>,
    ) -> Result<Vec<js_sys::Float32Array>, JsValue> {
        let task = parse_task(task.as_deref()).map_err(to_js)?;
        let embeddings = self.inner.embed(&texts, task).map_err(to_js)?;
        Ok(embeddings.iter().map(js_sys::Float32Array::from).collect())
    }

    /// One request of a server (the example Worker's `POST /v1/embeddings`): texts with the
    /// prompt of `task` (as [`embed`](Self::embed)); over-long texts are refused with
    /// `InputTooLong` unless `truncate`. Answers `{ vectors: Float32Array[], tokens }`,
    /// `tokens` counting every text's tokens (special ones included).
    #[wasm_bindgen(js_name = embedRequest)]
    pub fn embed_request(
        &self,
        texts: Vec<String>,
        task: Option<String>,
        truncate: bool,
    ) -> Result<js_sys::Object, JsValue> {
        let task = parse_task(task.as_deref()).map_err(to_js)?;
        let truncation = if truncate {
            ruri_core::Truncation::Truncate
        } else {
            ruri_core::Truncation::Error
        };
        let options = ruri_core::EmbedOptions::new(task).truncation(truncation);
        let embeddings = self.inner.embed_with(&texts, &options).map_err(to_js)?;
        let vectors: js_sys::Array = embeddings
            .iter()
            .map(|v| JsValue::from(js_sys::Float32Array::from(v)))
            .collect();
        let tokens: usize = embeddings.token_counts().iter().sum();
        let out = js_sys::Object::new();
        // Setting properties on a fresh plain object cannot fail.
        let _ = js_sys::Reflect::set(&out, &"vectors".into(), &vectors);
        let _ = js_sys::Reflect::set(&out, &"tokens".into(), &(tokens as f64).into());
        Ok(out)
    }

    /// Width of the vectors.
    #[wasm_bindgen(getter)]
    pub fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// The int8 kernel in use (`"simd128"`, `"scalar"`), or `undefined` at fp32.
    #[wasm_bindgen(getter)]
    pub fn kernel(&self) -> Option<String> {
        self.kernel.map(|k| k.name().to_owned())
    }

    /// How attention's products are computed: `"f32"`, `"bf16"` or `"int13"` (the
    /// `attention` option, else int8's `"int13"` or fp32's `"f32"`).
    #[wasm_bindgen(getter)]
    pub fn attention(&self) -> String {
        self.attention.to_string()
    }
}

/// An [`Embedder`] made from `model.safetensors` (or ruri's int8 file) fed in order, in
/// chunks of any size (a `fetch` body or an R2 object read as a stream): each tensor is
/// prepared as soon as its bytes are in, so the file never sits whole in linear memory.
///
/// ```js
/// const loader = new EmbedderLoader(configJson, tokenizerJson, options);
/// for await (const chunk of response.body) loader.push(chunk);
/// const embedder = loader.finish();
/// ```
#[wasm_bindgen]
pub struct EmbedderLoader {
    /// `None` once finished.
    loader: Option<(ruri_native::Loader, Tokenizer)>,
    hidden: usize,
}

#[wasm_bindgen]
impl EmbedderLoader {
    /// The arguments of [`Embedder::new`] but the weights; the same options.
    #[wasm_bindgen(constructor)]
    pub fn new(
        config_json: &str,
        tokenizer_json: &str,
        options: Option<js_sys::Object>,
    ) -> Result<EmbedderLoader, JsValue> {
        let options = Options::read(options.as_ref()).map_err(to_js)?;
        let mut builder = NativeBuilder::default()
            .precision(options.precision)
            .embedding_table(options.table)
            .threads(1);
        if let Some(attention) = options.attention {
            builder = builder.attention(attention);
        }
        if let Some(kernel) = options.kernel {
            builder = builder.kernel(kernel);
        }
        let config = ModelConfig::from_json_str(config_json, "config.json").map_err(to_js)?;
        let max_length = options.max_length.unwrap_or(config.max_position_embeddings);
        let tokenizer = Tokenizer::from_json(tokenizer_json.as_bytes(), max_length, None)
            .map_err(|source| match source {
                ruri_core::tokenize::TokenizeError::InvalidTokenizer { .. } => {
                    Error::InvalidTokenizer {
                        path: "tokenizer.json".into(),
                        source,
                    }
                }
                other => Error::Tokenizer(other),
            })
            .map_err(to_js)?;
        if tokenizer.pad_id() != config.pad_token_id {
            return Err(to_js(Error::InvalidConfig {
                path: "config.json".into(),
                reason: format!(
                    "pad_token_id is {} but the tokenizer pads with id {} (<pad>)",
                    config.pad_token_id,
                    tokenizer.pad_id()
                ),
            }));
        }
        let loader = ruri_native::NativeBackend::loader(&builder, config_json).map_err(to_js)?;
        Ok(EmbedderLoader {
            loader: Some((loader, tokenizer)),
            hidden: config.hidden_size,
        })
    }

    /// The next bytes of `model.safetensors` (a `Uint8Array` or an `ArrayBuffer`), copied
    /// into linear memory a slice at a time.
    pub fn push(&mut self, chunk: JsValue) -> Result<(), JsValue> {
        let chunk = if let Some(buffer) = chunk.dyn_ref::<js_sys::ArrayBuffer>() {
            js_sys::Uint8Array::new(buffer)
        } else {
            chunk
                .dyn_into::<js_sys::Uint8Array>()
                .map_err(|_| Error::InvalidOption {
                    name: "weights",
                    value: "not a Uint8Array or ArrayBuffer".into(),
                    reason: "pass the bytes of model.safetensors",
                })
                .map_err(to_js)?
        };
        let (loader, _) = self.loader.as_mut().ok_or_else(|| to_js(finished()))?;
        // A large chunk (a whole file) is copied in slices: only one slice is in linear
        // memory at a time.
        const SLICE: u32 = 1 << 20;
        let mut buf = vec![0u8; chunk.length().min(SLICE) as usize];
        let mut at = 0;
        while at < chunk.length() {
            let end = chunk.length().min(at + SLICE);
            let part = &mut buf[..(end - at) as usize];
            chunk.subarray(at, end).copy_to(part);
            loader.push(part).map_err(to_js)?;
            at = end;
        }
        Ok(())
    }

    /// The embedder, once the whole file was pushed (a file cut short is
    /// `InvalidConfig`, as for [`Embedder::new`]). The loader is spent after it.
    pub fn finish(&mut self) -> Result<Embedder, JsValue> {
        let (loader, tokenizer) = self.loader.take().ok_or_else(|| to_js(finished()))?;
        let backend = loader.finish().map_err(to_js)?;
        let (kernel, attention) = (backend.kernel(), backend.attention());
        if backend_dim(&backend) != self.hidden {
            return Err(to_js(Error::InvalidConfig {
                path: "config.json".into(),
                reason: format!(
                    "hidden_size {} but the model's vectors have {} dimensions",
                    self.hidden,
                    backend_dim(&backend)
                ),
            }));
        }
        let inner =
            TextEmbedder::new(tokenizer, Prompts::default(), backend, None).map_err(to_js)?;
        Ok(Embedder {
            inner,
            kernel,
            attention,
        })
    }
}

/// ruri's int8 weights file (`model.ruri-int8.safetensors`, what `ruri quantize` writes, byte
/// for byte) from the text of `config.json` and the bytes of `model.safetensors` (copied
/// into linear memory whole: a tool for node, not for a Worker). Options: `embeddingTable`
/// (`"int8"`, the default, or `"f32"`), `outlierChannels` (default `true`). Give the result
/// to [`Embedder::new`] or an [`EmbedderLoader`] with the same `embeddingTable`.
#[wasm_bindgen]
pub fn quantize(
    config_json: &str,
    weights: Vec<u8>,
    options: Option<js_sys::Object>,
) -> Result<Vec<u8>, JsValue> {
    let read = Options::read(options.as_ref()).map_err(to_js)?;
    let mut builder = NativeBuilder::default()
        .embedding_table(read.table)
        .threads(1);
    if let Some(object) = &options {
        let value = get(object, "outlierChannels");
        if !value.is_undefined() {
            let enabled = value.as_bool().ok_or_else(|| {
                to_js(Error::InvalidOption {
                    name: "outlierChannels",
                    value: format!("{value:?}"),
                    reason: "needs true or false",
                })
            })?;
            builder = builder.outlier_channels(enabled);
        }
    }
    builder.int8_file_bytes(config_json, weights).map_err(to_js)
}

fn finished() -> Error {
    Error::InvalidOption {
        name: "EmbedderLoader",
        value: "finished".into(),
        reason: "finish() was called already, or a push failed",
    }
}

/// `C = A · Wᵀ` on the named int8 kernel (`a`: `m × k`, `w`: `n × k`, row-major), for the
/// test that checks each kernel against a sum computed in JavaScript. Not a stable API.
#[doc(hidden)]
#[wasm_bindgen(js_name = int8Gemm)]
pub fn int8_gemm(
    kernel: &str,
    a: &[i8],
    w: &[i8],
    m: usize,
    n: usize,
    k: usize,
) -> Result<Vec<i32>, JsValue> {
    let kernel: Kernel = kernel.parse().map_err(to_js)?;
    ruri_native::bench::int8_gemm(kernel, a, w, m, n, k).ok_or_else(|| {
        to_js(Error::InvalidOption {
            name: "int8Gemm",
            value: format!(
                "a: {} bytes, w: {} bytes, {m} × {n} × {k}",
                a.len(),
                w.len()
            ),
            reason: "the lengths do not match the shape",
        })
    })
}

/// int13 attention's two products of one head on `products` (`"simd128"`, this build's
/// tiles, or `"portable"`, the loops other machines run), for the kernel test
/// (`tests/kernel.mjs`), which checks them against sums computed in JavaScript: `q`
/// (`rows × d`), `k` and `v` (`keys × d`) in rows whose largest magnitude is 4,095 (so that
/// their integer values are kept), `p` the weights (`rows × keys`, at most 4,095). Returns
/// `[scores, sums]`: a `Float32Array` of `rows × keys` scores and a `BigInt64Array` of the
/// `rows × d` exact sums `Σ_j p[r][j] · v[j][c]`. Not a stable API.
#[wasm_bindgen(js_name = int13Products)]
#[allow(clippy::too_many_arguments)]
pub fn int13_products(
    products: &str,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    p: &[u16],
    rows: usize,
    keys: usize,
    d: usize,
) -> Result<js_sys::Array, JsValue> {
    let (scores, sums) = ruri_native::bench::int13_products(products, q, k, v, p, rows, keys, d)
        .ok_or_else(|| {
            to_js(Error::InvalidOption {
                name: "int13Products",
                value: format!("{products}: {rows} × {keys} × {d}"),
                reason: "an unknown variant, or lengths that do not match the shape",
            })
        })?;
    let out = js_sys::Array::new();
    out.push(&js_sys::Float32Array::from(&scores[..]));
    out.push(&js_sys::BigInt64Array::from(&sums[..]));
    Ok(out)
}

/// Bytes of this module's linear memory (it only grows): with the JavaScript heap, what a
/// Cloudflare Worker's memory limit counts.
#[wasm_bindgen(js_name = wasmMemoryBytes)]
pub fn wasm_memory_bytes() -> f64 {
    #[cfg(target_arch = "wasm32")]
    let pages = std::arch::wasm32::memory_size(0);
    #[cfg(not(target_arch = "wasm32"))]
    let pages = 0;
    (pages * 65536) as f64
}

/// A task by its prompt name, as ruri-server's `prompt_name`.
fn parse_task(name: Option<&str>) -> ruri_core::Result<ruri_core::Task> {
    Ok(match name.unwrap_or("") {
        "" => ruri_core::Task::None,
        "query" => ruri_core::Task::Query,
        "document" => ruri_core::Task::Document,
        "topic" => ruri_core::Task::Topic,
        other => {
            return Err(Error::InvalidOption {
                name: "task",
                value: other.to_owned(),
                reason: "known: query, document, topic, or \"\" (no prompt)",
            });
        }
    })
}

/// Options of [`Embedder::new`], from a plain JavaScript object.
struct Options {
    kernel: Option<Kernel>,
    precision: Precision,
    table: EmbeddingTable,
    /// `None`: ruri-native's default (int13 at int8, f32 at fp32).
    attention: Option<AttentionPrecision>,
    max_length: Option<usize>,
}

impl Options {
    fn read(object: Option<&js_sys::Object>) -> ruri_core::Result<Self> {
        let mut options = Options {
            kernel: None,
            precision: Precision::Int8,
            // 26 MB instead of 105 for Ruri v3, and nothing to read rows from.
            table: EmbeddingTable::Int8,
            attention: None,
            max_length: None,
        };
        let Some(object) = object else {
            return Ok(options);
        };
        options.kernel = parsed(object, "kernel")?;
        if let Some(precision) = parsed(object, "precision")? {
            options.precision = precision;
        }
        if let Some(table) = parsed(object, "embeddingTable")? {
            options.table = table;
        }
        options.attention = parsed(object, "attention")?;
        let value = get(object, "maxLength");
        if !value.is_undefined() {
            let max = value
                .as_f64()
                .filter(|v| v.fract() == 0.0 && *v >= 1.0 && *v <= 1e9)
                .ok_or_else(|| Error::InvalidOption {
                    name: "maxLength",
                    value: format!("{value:?}"),
                    reason: "needs a whole number of tokens, at least 1",
                })?;
            options.max_length = Some(max as usize);
        }
        Ok(options)
    }
}

fn get(object: &js_sys::Object, key: &str) -> JsValue {
    js_sys::Reflect::get(object, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

fn string_option(object: &js_sys::Object, key: &'static str) -> ruri_core::Result<Option<String>> {
    let value = get(object, key);
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    value
        .as_string()
        .map(Some)
        .ok_or_else(|| Error::InvalidOption {
            name: key,
            value: format!("{value:?}"),
            reason: "needs a string",
        })
}

/// The string option `key` by ruri-native's names for it (its `FromStr`: `kernel`,
/// `precision`, `embeddingTable`, `attention`), an unknown name an `InvalidOption` under
/// JavaScript's name for the option.
fn parsed<T: std::str::FromStr<Err = Error>>(
    object: &js_sys::Object,
    key: &'static str,
) -> ruri_core::Result<Option<T>> {
    let Some(name) = string_option(object, key)? else {
        return Ok(None);
    };
    name.parse().map(Some).map_err(|error| match error {
        Error::InvalidOption { value, reason, .. } => Error::InvalidOption {
            name: key,
            value,
            reason,
        },
        other => other,
    })
}

fn backend_dim(backend: &ruri_native::NativeBackend) -> usize {
    ruri_core::Backend::dim(backend)
}

/// A ruri error as a JavaScript `Error` named `RuriError`: the message with its causes, and
/// the variant's name in `kind`.
fn to_js(error: Error) -> JsValue {
    let kind = format!("{error:?}");
    let kind = kind
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned();
    let js = js_sys::Error::new(&ruri_core::error_chain(&error).to_string());
    js.set_name("RuriError");
    // Setting a property on a fresh Error object cannot fail.
    let _ = js_sys::Reflect::set(&js, &JsValue::from_str("kind"), &JsValue::from_str(&kind));
    js.into()
}
