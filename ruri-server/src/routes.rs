//! The routes: the router, its middleware (metrics, API key) and the handlers, which
//! validate, tokenize, queue for the model thread and answer in each API's shape.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use ruri::{Encoding, Error, Prompts, Task, TextEmbedder, Truncation};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::api::{self, ApiError, EncodingFormat, ErrorKind, Flavor, OpenAiRequest, TeiRequest};
use crate::queue::{Admission, Job};
use crate::{App, Shared, describe};

pub(crate) fn router(app: App) -> Router {
    let body_limit = app.shared.config.max_body_bytes;
    // Layers run outside in: the key is checked first, then the timeout covers the rest.
    // TEI's routes as TEI routes them for an embedding model: `POST /` is `/embed`, and
    // `/info` and `/tokenize` need the key too; `GET /` is its health check.
    let embedding = Router::new()
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/embed", post(tei_embed))
        .route("/", post(tei_embed))
        .route("/tokenize", post(tei_tokenize))
        .route("/info", get(tei_info))
        .route_layer(middleware::from_fn_with_state(app.clone(), request_timeout))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_api_key));
    Router::new()
        .merge(embedding)
        .route("/", get(health))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(app.clone(), track))
        .with_state(app)
}

fn prompt_names(prompts: &Prompts) -> String {
    prompts
        .iter()
        .map(|(name, _)| format!("{name:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn resolve_prompt(prompts: &Prompts, name: &str) -> Result<String, ApiError> {
    // `""` is sentence-transformers' name for no prompt, whatever the config lists.
    let task = if name.is_empty() {
        Task::None
    } else {
        Task::Named(name.to_owned())
    };
    prompts.resolve(&task).map(str::to_owned).map_err(|_| {
        ApiError::new(
            ErrorKind::Invalid,
            format!(
                "unknown prompt_name {name:?}; this model has {}",
                prompt_names(prompts)
            ),
        )
        .param("prompt_name")
    })
}

/// Counts every answer by route and status, with its latency.
async fn track(State(app): State<App>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let response = next.run(request).await;
    app.shared
        .metrics
        .observe_request(&route, response.status().as_u16(), started.elapsed());
    response
}

/// The whole request (its body, the tokenizing slot, the queue, the answer) within
/// [`Config::request_timeout`](crate::Config::request_timeout). Dropping the handler's future
/// drops its place in the queue ([`crate::queue::Admission`]), so the model never runs it.
async fn request_timeout(State(app): State<App>, request: Request, next: Next) -> Response {
    let limit = app.shared.config.request_timeout;
    let flavor = Flavor::of_path(request.uri().path());
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            app.shared.metrics.timeouts.inc();
            ApiError::new(
                ErrorKind::Timeout,
                format!(
                    "the request did not finish within this server's request timeout ({:.3} s): \
                     the model is busy or the body came too slowly; retry shortly",
                    limit.as_secs_f64()
                ),
            )
            .into_response(flavor)
        }
    }
}

async fn require_api_key(State(app): State<App>, request: Request, next: Next) -> Response {
    if let Some(key) = &app.shared.api_key_digest {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        if !given.is_some_and(|given| same_digest(&digest(given), key)) {
            let flavor = Flavor::of_path(request.uri().path());
            return ApiError::new(
                ErrorKind::Unauthorized,
                "missing or wrong API key: send \"Authorization: Bearer <key>\"",
            )
            .into_response(flavor);
        }
    }
    next.run(request).await
}

/// SHA-256 of a key: what is compared, so that the comparison always covers 32 bytes
/// whatever the lengths of the key and of the guess (comparing the keys themselves would
/// stop at a length difference, and so tell the key's length).
pub(crate) fn digest(key: &str) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(key.as_bytes()).into()
}

/// Equality of two digests whose time does not depend on where the first difference is.
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    // `black_box`: keeps the optimizer from turning the fold into an early-exit comparison.
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

async fn health() -> Response {
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn ready(State(app): State<App>) -> Response {
    match app.shared.model.get() {
        None => {
            let mut response = (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({"status": "loading"})),
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1u32));
            response
        }
        Some(Ok(engine)) => axum::Json(serde_json::json!({
            "status": "ready",
            "model": app.shared.config.model_name,
            "dimensions": engine.dim(),
            "max_input_tokens": engine.max_length(),
        }))
        .into_response(),
        Some(Err(message)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(serde_json::json!({"status": "failed", "error": message})),
        )
            .into_response(),
    }
}

async fn metrics_text(State(app): State<App>) -> Response {
    let shared = &app.shared;
    let depth = &shared.depth;
    let as_gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    shared
        .metrics
        .queue_requests
        .set(as_gauge(depth.requests.load(Ordering::Acquire)));
    shared
        .metrics
        .queue_tokens
        .set(as_gauge(depth.tokens.load(Ordering::Acquire)));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.render(),
    )
        .into_response()
}

async fn not_found(request: Request) -> Response {
    ApiError::new(
        ErrorKind::NotFound,
        format!(
            "no route {} {}; routes: POST /v1/embeddings, POST /embed (also POST /), \
             POST /tokenize, GET /info, GET /health (also GET /), GET /ready, GET /metrics",
            request.method(),
            request.uri().path()
        ),
    )
    .into_response(Flavor::Tei)
}

/// Requests with at most this much text (all inputs together, in bytes) are tokenized on the
/// async worker that parsed them, since the hop to the blocking pool and back (two thread
/// wake-ups) costs more than the work: with the 102,400-piece tokenizer, a 22-token query
/// (111 bytes) takes 13 µs and 1 KiB 74 µs (4 KiB: 264 µs). Larger requests go to the blocking
/// pool, so that no worker stalls on them.
const INLINE_TEXT_BYTES: usize = 1024;

/// Answers of at most this many values (8 vectors of 256 dimensions) are cut, normalized and
/// serialized on the async worker, for the same reason: JSON float formatting of 2,048 values
/// takes 55 µs (256: 6 µs). Larger ones go to the blocking pool.
const INLINE_VALUES: usize = 2 * 1024;

/// One embedding request, whichever API it came through.
struct Work {
    texts: Vec<String>,
    prompt_name: Option<String>,
    truncate: bool,
    normalize: bool,
    dimensions: Option<usize>,
}

/// A request's raw rows back from the model thread (`n × full_dim`), with what the answer
/// needs done to them.
struct Embedded {
    raw: Vec<f32>,
    full_dim: usize,
    dim: usize,
    normalize: bool,
    tokens: usize,
}

impl Embedded {
    /// Whether finishing and serializing this answer is small work, for the async worker.
    fn is_small(&self) -> bool {
        self.raw.len() <= INLINE_VALUES
    }

    /// Rows ready to serialize: cut to `dim` values, then normalized if asked (so a cut
    /// vector is unit length again, as OpenAI's `dimensions`).
    fn finish(self) -> Done {
        let Embedded {
            raw,
            full_dim,
            dim,
            normalize,
            tokens,
        } = self;
        let mut rows = if dim == full_dim {
            raw
        } else {
            raw.chunks_exact(full_dim)
                .flat_map(|row| &row[..dim])
                .copied()
                .collect()
        };
        if normalize {
            rows.chunks_exact_mut(dim).for_each(ruri::l2_normalize);
        }
        Done { rows, dim, tokens }
    }
}

/// Vectors ready to serialize: `rows` is `n × dim`, normalized if asked.
struct Done {
    rows: Vec<f32>,
    dim: usize,
    tokens: usize,
}

async fn openai_embeddings(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    openai_inner(&app, body)
        .await
        .unwrap_or_else(|e| e.into_response(Flavor::OpenAi))
}

async fn openai_inner(
    app: &App,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: OpenAiRequest = api::parse_json(body)?;
    let format = request.encoding_format.unwrap_or_default();
    let work = Work {
        texts: request.input.0,
        prompt_name: request.prompt_name,
        truncate: request.truncate,
        normalize: true,
        dimensions: request.dimensions,
    };
    let embedded = embed(app, work).await?;
    let model = app.shared.config.model_name.clone();
    run_cpu(embedded.is_small(), move || {
        let done = embedded.finish();
        let data = done
            .rows
            .chunks_exact(done.dim)
            .enumerate()
            .map(|(index, row)| api::OpenAiEmbedding {
                object: "embedding",
                index,
                embedding: match format {
                    EncodingFormat::Float => api::EmbeddingValue::Float(row),
                    EncodingFormat::Base64 => api::EmbeddingValue::Base64(base64_f32_le(row)),
                },
            })
            .collect();
        json_response(&api::OpenAiResponse {
            object: "list",
            data,
            model: &model,
            usage: api::Usage {
                prompt_tokens: done.tokens,
                total_tokens: done.tokens,
            },
        })
    })
    .await
}

async fn tei_embed(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    tei_inner(&app, body)
        .await
        .unwrap_or_else(|e| e.into_response(Flavor::Tei))
}

async fn tei_inner(app: &App, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let request: TeiRequest = api::parse_json(body)?;
    if request.truncation_direction == Some(api::TruncationDirection::Left) {
        return Err(ApiError::new(
            ErrorKind::Invalid,
            "truncation_direction \"Left\" is not supported: Ruri keeps the start of a text",
        ));
    }
    let work = Work {
        texts: request.inputs.0,
        prompt_name: request.prompt_name,
        truncate: request.truncate.unwrap_or(false),
        normalize: request.normalize,
        dimensions: request.dimensions,
    };
    let embedded = embed(app, work).await?;
    run_cpu(embedded.is_small(), move || {
        let done = embedded.finish();
        let rows: Vec<&[f32]> = done.rows.chunks_exact(done.dim).collect();
        json_response(&rows)
    })
    .await
}

async fn tei_tokenize(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    tokenize_inner(&app, body)
        .await
        .unwrap_or_else(|e| e.into_response(Flavor::Tei))
}

/// TEI's `/tokenize`: every token of prompt + text, none truncated (as TEI, a text over the
/// model's maximum is shown whole, not refused).
async fn tokenize_inner(
    app: &App,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: api::TeiTokenizeRequest = api::parse_json(body)?;
    let shared = &app.shared;
    let engine = loaded_model(shared)?;
    let config = &shared.config;
    let texts = request.inputs.0;
    check_input_count(texts.len(), config)?;
    let prompt = request_prompt(request.prompt_name.as_deref(), config, &engine)?;
    let add_special_tokens = request.add_special_tokens;
    let slot = tokenizing_slot(shared).await?;
    let small = texts.iter().map(String::len).sum::<usize>() <= INLINE_TEXT_BYTES;
    run_cpu(small, move || {
        let _slot = slot;
        let (tokenizer, whitespace) = (engine.tokenizer(), engine.whitespace());
        let mut joined = Vec::with_capacity(texts.len());
        let mut tokens = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            joined.push([prompt.as_str(), text].concat());
            tokens.push(
                tokenizer
                    .tokens_with(i, &prompt, text, add_special_tokens, whitespace)
                    .map_err(|e| {
                        ApiError::new(ErrorKind::Tokenizer, describe(&Error::from(e)))
                            .param("input")
                    })?,
            );
        }
        let answer = joined
            .iter()
            .zip(&tokens)
            .map(|(joined, tokens)| {
                tokens
                    .iter()
                    .map(|token| api::TeiToken::new(joined, token))
                    .collect::<Option<Vec<_>>>()
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::Backend,
                    "the tokenizer reported offsets outside the text",
                )
            })?;
        json_response(&answer)
    })
    .await
}

async fn tei_info(State(app): State<App>) -> Response {
    info_inner(&app).unwrap_or_else(|e| e.into_response(Flavor::Tei))
}

/// TEI's `/info`, once the model is loaded (its length and width are the model's).
fn info_inner(app: &App) -> Result<Response, ApiError> {
    let shared = &app.shared;
    let engine = loaded_model(shared)?;
    let config = &shared.config;
    json_response(&api::TeiInfo {
        model_id: config.model_id.as_deref().unwrap_or(&config.model_name),
        model_sha: None,
        model_dtype: config.model_dtype.as_deref(),
        served_model_name: &config.model_name,
        // ruri-core pools by mean only (its `Pooling` has no other mode).
        model_type: api::TeiModelType::Embedding { pooling: "mean" },
        max_input_length: engine.max_length(),
        max_batch_tokens: config.max_merge_tokens,
        max_batch_requests: None,
        max_client_batch_size: config.max_inputs,
        // `truncate` defaults to false on every route.
        auto_truncate: false,
        tokenization_workers: config.max_tokenizing.max(1),
        version: env!("CARGO_PKG_VERSION"),
        sha: None,
        docker_label: None,
        dimensions: engine.dim(),
        backend: config.backend.as_deref(),
        prompts: engine.prompts().iter().collect(),
        default_prompt_name: config.default_prompt_name.as_deref(),
    })
}

fn json_response(value: &impl serde::Serialize) -> Result<Response, ApiError> {
    let body = serde_json::to_vec(value)
        .map_err(|e| ApiError::new(ErrorKind::Backend, format!("serializing the answer: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// OpenAI's base64 format: the f32 values' little-endian bytes.
fn base64_f32_le(row: &[f32]) -> String {
    let bytes: Vec<u8> = row.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Runs CPU work here when it is `small`, else on the blocking pool, off the async workers.
async fn run_cpu<T: Send + 'static>(
    small: bool,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    if small {
        return work();
    }
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(ApiError::new(
            ErrorKind::Backend,
            format!("internal task failed: {e}"),
        ))
    })
}

/// The model, once loaded; 503 while loading or after a failed load.
fn loaded_model(shared: &Shared) -> Result<Arc<TextEmbedder>, ApiError> {
    match shared.model.get() {
        None => Err(ApiError::new(
            ErrorKind::Loading,
            "the model is loading; retry shortly (GET /ready says when)",
        )),
        Some(Err(message)) => Err(ApiError::new(
            ErrorKind::LoadFailed,
            format!("the model failed to load: {message}"),
        )),
        Some(Ok(engine)) => Ok(Arc::clone(engine)),
    }
}

/// Refuses an empty request and one with more than [`Config::max_inputs`](crate::Config)
/// texts.
fn check_input_count(n: usize, config: &crate::Config) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::new(
            ErrorKind::Invalid,
            "no input: send a string or a non-empty array of strings",
        )
        .param("input"));
    }
    if n > config.max_inputs {
        return Err(ApiError::new(
            ErrorKind::TooLarge,
            format!(
                "{n} inputs in one request, more than this server's maximum of {}",
                config.max_inputs
            ),
        )
        .param("input"));
    }
    Ok(())
}

/// The prompt text for a request's `prompt_name`, else the server's default prompt, else none.
fn request_prompt(
    prompt_name: Option<&str>,
    config: &crate::Config,
    engine: &TextEmbedder,
) -> Result<String, ApiError> {
    match prompt_name.or(config.default_prompt_name.as_deref()) {
        Some(name) => resolve_prompt(engine.prompts(), name),
        None => Ok(String::new()),
    }
}

/// A slot for tokenizing: at most `max_tokenizing` requests do it at once (the rest wait
/// here, within their request timeout), whatever the number of connections. The slot moves
/// into the work, so a request that times out while the blocking pool tokenizes it still
/// holds its slot until that work ends.
async fn tokenizing_slot(shared: &Shared) -> Result<OwnedSemaphorePermit, ApiError> {
    Arc::clone(&shared.tokenizing)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::new(ErrorKind::Backend, "the server is shutting down"))
}

/// Validates, tokenizes, queues and waits for the model thread's rows.
async fn embed(app: &App, work: Work) -> Result<Embedded, ApiError> {
    let shared = &app.shared;
    let engine = loaded_model(shared)?;
    let config = &shared.config;
    check_input_count(work.texts.len(), config)?;
    let full_dim = engine.dim();
    let dim = match work.dimensions {
        None => full_dim,
        Some(d) if (1..=full_dim).contains(&d) => d,
        Some(d) => {
            return Err(ApiError::new(
                ErrorKind::Invalid,
                format!("dimensions must be between 1 and {full_dim}, got {d}"),
            )
            .param("dimensions"));
        }
    };
    let prompt = request_prompt(work.prompt_name.as_deref(), config, &engine)?;

    let truncation = if work.truncate {
        Truncation::Truncate
    } else {
        Truncation::Error
    };
    if !work.normalize && !crate::raw_available(&engine) {
        return Err(ApiError::new(
            ErrorKind::Invalid,
            "\"normalize\": false is not available: this model's ONNX file only outputs \
             L2-normalized vectors",
        )
        .param("normalize"));
    }
    let texts = work.texts;
    let slot = tokenizing_slot(shared).await?;
    let small = texts.iter().map(String::len).sum::<usize>() <= INLINE_TEXT_BYTES;
    let tokenizer_engine = Arc::clone(&engine);
    let encodings = run_cpu(small, move || {
        let _slot = slot;
        let (tokenizer, whitespace) = (tokenizer_engine.tokenizer(), tokenizer_engine.whitespace());
        texts
            .iter()
            .enumerate()
            .map(|(i, text)| tokenizer.encode_with(i, &prompt, text, truncation, whitespace))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| match Error::from(e) {
                Error::InputTooLong { index, tokens, max } => ApiError::new(
                    ErrorKind::TooLarge,
                    format!(
                        "input {index} has {tokens} tokens (prompt and special tokens included), more than the model's maximum of {max}; shorten it or send \"truncate\": true"
                    ),
                )
                .param("input"),
                other => ApiError::new(ErrorKind::Tokenizer, describe(&other)).param("input"),
            })
    })
    .await?;
    let tokens: usize = encodings.iter().map(Encoding::len).sum();

    if !shared.depth.try_admit(tokens, config.max_queue_tokens) {
        return Err(ApiError::new(
            ErrorKind::Overloaded,
            "the server is busy (queue full); retry shortly",
        ));
    }
    // Releases the request's place in the queue if this future is dropped (a timeout, a
    // client gone) before the model thread takes it.
    let admission = Admission::new(Arc::clone(shared), tokens);
    let (reply, answer) = oneshot::channel();
    let job = Job {
        encodings,
        tokens,
        enqueued: Instant::now(),
        reply,
        claim: admission.claim(),
    };
    if app.jobs.send(job).is_err() {
        return Err(ApiError::new(
            ErrorKind::Backend,
            "the model worker has stopped",
        ));
    }
    let raw = answer
        .await
        .map_err(|_| ApiError::new(ErrorKind::Backend, "the model worker dropped the request"))?
        .map_err(|message| ApiError::new(ErrorKind::Backend, message))?;
    Ok(Embedded {
        raw,
        full_dim,
        dim,
        normalize: work.normalize,
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key is compared as digests: equal keys match; a prefix, an extension, another key
    /// of the same length and the empty string do not (and every comparison covers 32 bytes,
    /// whatever the guess's length).
    #[test]
    fn api_keys_compare_through_their_digests() {
        let key = digest("s3cret-key");
        assert!(same_digest(&digest("s3cret-key"), &key));
        for guess in [
            "s3cret",
            "s3cret-key-and-more",
            "s3cret-kez",
            "",
            "S3CRET-KEY",
        ] {
            assert!(!same_digest(&digest(guess), &key), "{guess:?} matched");
        }
        // SHA-256 of "abc" (FIPS 180-2, appendix B.1): the digest is the standard one.
        assert_eq!(
            digest("abc")[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "SHA-256(\"abc\") starts ba7816bf"
        );
    }
}
