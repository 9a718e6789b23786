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
//! * **The one loader.** The options become a [`ruri::EmbedderConfig`] (backend native,
//!   int8 and the int8 embedding table unless named, one thread), the two texts a
//!   [`ruri::ModelTexts`] (the tokenizer checked against `config.json` as a folder's is),
//!   and the bytes go to [`ruri::EmbedderConfig::loader`]: the loader the command lines, the
//!   server and Python use, with the same refusals and errors (an error's option name is
//!   JavaScript's).
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
//!   included) and the variant of `ruri::Error` in `kind`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use ruri::native::{EmbeddingTable, Kernel, NativeBackend, NativeBuilder};
use ruri::{
    AttentionPrecision, BackendKind, EmbedderConfig, Error, ModelTexts, Precision, TextEmbedder,
};
use wasm_bindgen::prelude::*;

/// A Ruri v3 embedder on ruri's native engine (int8 by default).
#[wasm_bindgen]
pub struct Embedder {
    inner: TextEmbedder,
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
            ruri::Truncation::Truncate
        } else {
            ruri::Truncation::Error
        };
        let options = ruri::EmbedOptions::new(task).truncation(truncation);
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
        self.engine().kernel().map(|k| k.name().to_owned())
    }

    /// How attention's products are computed: `"f32"`, `"bf16"` or `"int13"` (the
    /// `attention` option, else int8's `"int13"` or fp32's `"f32"`).
    #[wasm_bindgen(getter)]
    pub fn attention(&self) -> String {
        self.engine().attention().to_string()
    }
}

impl Embedder {
    fn engine(&self) -> &NativeBackend {
        self.inner
            .backend_as()
            .expect("EmbedderConfig::loader loads the native engine only")
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
    loader: Option<ruri::WeightsLoader>,
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
        // The facade's one loader, as every front end: the tokenizer is checked against
        // config.json there, as a folder's is.
        let model =
            ModelTexts::new(config_json, tokenizer_json, options.max_length).map_err(to_js)?;
        let loader = options.config.loader(model).map_err(to_js)?;
        Ok(EmbedderLoader {
            loader: Some(loader),
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
        let loader = self.loader.as_mut().ok_or_else(|| to_js(finished()))?;
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
        let loader = self.loader.take().ok_or_else(|| to_js(finished()))?;
        let inner = loader.finish().map_err(to_js)?;
        Ok(Embedder { inner })
    }
}

/// ruri's int8 weights file (`model.ruri-int8.safetensors`, what `ruri quantize` writes, byte
/// for byte) from the text of `config.json` and the bytes of `model.safetensors` (copied
/// into linear memory whole: a tool for node, not for a Worker). Options: `embeddingTable`
/// (`"int8"`, the default, or `"f32"`), `outlierChannels` (default `true`); the embedder's
/// other options change no byte of the file and are not read. Give the result
/// to [`Embedder::new`] or an [`EmbedderLoader`] with the same `embeddingTable`.
#[wasm_bindgen]
pub fn quantize(
    config_json: &str,
    weights: Vec<u8>,
    options: Option<js_sys::Object>,
) -> Result<Vec<u8>, JsValue> {
    let table = match &options {
        Some(object) => parsed(object, "embeddingTable").map_err(to_js)?,
        None => None,
    };
    let mut builder = NativeBuilder::default()
        .embedding_table(table.unwrap_or(EmbeddingTable::Int8))
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
    ruri::native::bench::int8_gemm(kernel, a, w, m, n, k).ok_or_else(|| {
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
    let (scores, sums) = ruri::native::bench::int13_products(products, q, k, v, p, rows, keys, d)
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
fn parse_task(name: Option<&str>) -> ruri::Result<ruri::Task> {
    Ok(match name.unwrap_or("") {
        "" => ruri::Task::None,
        "query" => ruri::Task::Query,
        "document" => ruri::Task::Document,
        "topic" => ruri::Task::Topic,
        other => {
            return Err(Error::InvalidOption {
                name: "task",
                value: other.to_owned(),
                reason: "known: query, document, topic, or \"\" (no prompt)",
            });
        }
    })
}

/// Options of [`Embedder::new`], from a plain JavaScript object: the loader's
/// configuration and the maximum length.
struct Options {
    config: EmbedderConfig,
    max_length: Option<usize>,
}

impl Options {
    fn read(object: Option<&js_sys::Object>) -> ruri::Result<Self> {
        // int8 with the int8 table (26 MB instead of 105 for Ruri v3, and no file to read
        // rows from), on the caller's thread (wasm32 has no threads).
        let mut config = EmbedderConfig::new()
            .backend(BackendKind::Native)
            .precision(Precision::Int8)
            .embedding_table(EmbeddingTable::Int8)
            .threads(1);
        let mut max_length = None;
        if let Some(object) = object {
            if let Some(kernel) = parsed::<Kernel>(object, "kernel")? {
                config = config.kernel(kernel);
            }
            // The engine's own names (fp32, int8), as before the facade: the facade's
            // precisions include fp16 and bf16, which no backend runs here.
            if let Some(precision) = parsed::<ruri::native::Precision>(object, "precision")? {
                config = config.precision(match precision {
                    ruri::native::Precision::Fp32 => Precision::Fp32,
                    ruri::native::Precision::Int8 => Precision::Int8,
                    other => {
                        return Err(Error::InvalidOption {
                            name: "precision",
                            value: other.to_string(),
                            reason: "known: int8, fp32",
                        });
                    }
                });
            }
            if let Some(table) = parsed::<EmbeddingTable>(object, "embeddingTable")? {
                config = config.embedding_table(table);
            }
            if let Some(attention) = parsed::<AttentionPrecision>(object, "attention")? {
                config = config.attention(attention);
            }
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
                max_length = Some(max as usize);
            }
        }
        // Refused here, before config.json is parsed, as every option above.
        config.validate()?;
        Ok(Options { config, max_length })
    }
}

fn get(object: &js_sys::Object, key: &str) -> JsValue {
    js_sys::Reflect::get(object, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

fn string_option(object: &js_sys::Object, key: &'static str) -> ruri::Result<Option<String>> {
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

/// The string option `key` by ruri's names for it (their `FromStr`: `kernel`,
/// `precision`, `embeddingTable`, `attention`), an unknown name an `InvalidOption` under
/// JavaScript's name for the option.
fn parsed<T: std::str::FromStr<Err = Error>>(
    object: &js_sys::Object,
    key: &'static str,
) -> ruri::Result<Option<T>> {
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

/// A ruri error as a JavaScript `Error` named `RuriError`: the message with its causes, and
/// the variant's name in `kind`.
fn to_js(error: Error) -> JsValue {
    let kind = format!("{error:?}");
    let kind = kind
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned();
    let js = js_sys::Error::new(&ruri::error_chain(&error).to_string());
    js.set_name("RuriError");
    // Setting a property on a fresh Error object cannot fail.
    let _ = js_sys::Reflect::set(&js, &JsValue::from_str("kind"), &JsValue::from_str(&kind));
    js.into()
}
