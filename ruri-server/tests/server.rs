//! The server over real HTTP: its router on an ephemeral loopback port, around the committed
//! tiny model on ONNX Runtime fp32, called with a plain hyper client. Inference can be held at
//! a gate (a [`Backend`] wrapping the model's own), and loading too, so "not ready yet",
//! "requests wait in the queue and merge" and "queue full" are states the tests reach on
//! purpose, not by timing.
//!
//! Expected vectors come from the library called directly (the server must not change them)
//! and from the Python references (`testdata/reference/tiny.json`).

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use ruri::backend::{Backend, BackendOutput, PaddedBatch};
use ruri::{EmbedOptions, Task, TextEmbedder};
use ruri_server::{Config, LoadResult};
use ruri_testkit::{Reference, tiny_model_dir};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Vectors that went through the same fp32 model but possibly in other batches: only
/// summation order differs (the parity test measures 2.1e-7 against sentence-transformers).
const SAME_MODEL: f32 = 1e-6;
/// Against the Python references: the parity test's fp32 tolerance.
const VS_PYTHON: f32 = 1e-5;

fn tiny() -> TextEmbedder {
    ruri::ort::builder()
        .build_from_dir(tiny_model_dir())
        .unwrap_or_else(|e| panic!("building the tiny ort fp32 model: {e:?}"))
}

fn load_tiny() -> LoadResult {
    Ok(tiny())
}

/// A door a thread waits at while it is closed.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    fn closed() -> Arc<Self> {
        let gate = Self::default();
        *gate.closed.lock().unwrap() = true;
        Arc::new(gate)
    }
    fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.changed.notify_all();
    }
    fn wait(&self) {
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.changed.wait(closed).unwrap();
        }
    }
}

/// The tiny model's backend with a gate before each batch, recording each batch's text count.
/// Every batch here is small enough to be one backend call's only batch, so the log also
/// counts the server's backend calls.
struct Gated {
    inner: TextEmbedder,
    gate: Arc<Gate>,
    calls: Arc<Mutex<Vec<usize>>>,
}

impl Backend for Gated {
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn forward(&self, batch: &PaddedBatch) -> ruri::Result<BackendOutput> {
        self.calls.lock().unwrap().push(batch.batch_size());
        self.gate.wait();
        self.inner.backend().forward(batch)
    }
    fn output_is_normalized(&self) -> bool {
        self.inner.backend().output_is_normalized()
    }
}

/// A gated model (gate open) and handles to its gate and call log.
fn gated() -> (
    impl FnOnce() -> LoadResult + Send + 'static,
    Arc<Gate>,
    Arc<Mutex<Vec<usize>>>,
) {
    let gate = Arc::new(Gate::default());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (g, c) = (Arc::clone(&gate), Arc::clone(&calls));
    let load = move || -> LoadResult {
        let inner = tiny();
        let (tokenizer, prompts, batching) = (
            inner.tokenizer().clone(),
            inner.prompts().clone(),
            inner.batching(),
        );
        let gated = Gated {
            inner,
            gate: g,
            calls: c,
        };
        TextEmbedder::new(tokenizer, prompts, gated, Some(batching)).map_err(|e| e.to_string())
    };
    (load, gate, calls)
}

/// A running server: its address (and a client for it, through `Deref`), the switch that
/// starts its graceful shutdown, and its task.
struct TestServer {
    client: Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Waits (10 s at most) for the model thread to end, as `main` does after serving.
    async fn join_worker(&mut self) {
        let worker = self.worker.take().expect("joined once");
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::task::spawn_blocking(move || worker.join()),
        )
        .await
        .expect("the model thread ends once the server is gone")
        .unwrap()
        .expect("the model thread did not panic");
    }
}

impl std::ops::Deref for TestServer {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

/// One connection per request, so concurrent requests are concurrent connections.
#[derive(Debug, Clone, Copy)]
struct Client {
    addr: SocketAddr,
}

async fn spawn(config: Config, load: impl FnOnce() -> LoadResult + Send + 'static) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (router, worker) = ruri_server::start(config, load).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(ruri_server::serve(listener, router, async {
        let _ = stopped.await;
    }));
    TestServer {
        client: Client { addr },
        stop: Some(stop),
        task,
        worker: Some(worker),
    }
}

/// A server with the tiny model, ready.
async fn ready_server(config: Config) -> TestServer {
    let server = spawn(config, load_tiny).await;
    server.wait_ready().await;
    server
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} answered a body that is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The OpenAI error's message, after checking the error shape.
    fn openai_error(&self, status: StatusCode, code: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "{body}");
        assert!(body["error"]["type"].is_string(), "{body}");
        body["error"]["message"].as_str().unwrap().to_owned()
    }

    /// The TEI error's message, after checking the error shape.
    fn tei_error(&self, status: StatusCode, error_type: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        let body = self.json();
        assert_eq!(body["error_type"], error_type, "{body}");
        body["error"].as_str().unwrap().to_owned()
    }
}

impl Client {
    async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Reply {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.addr.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::from(body))).unwrap();
        let response = sender.send_request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, &[], Vec::new()).await
    }

    /// [`Client::post`] on a task of its own, to be awaited later.
    fn post_in_background(self, path: &'static str, body: Value) -> tokio::task::JoinHandle<Reply> {
        tokio::spawn(async move { self.post(path, &body).await })
    }

    async fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_with(path, &[], body).await
    }

    async fn post_with(&self, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.request(Method::POST, path, &all, serde_json::to_vec(body).unwrap())
            .await
    }

    async fn post_raw(&self, path: &str, body: &[u8]) -> Reply {
        self.request(
            Method::POST,
            path,
            &[("content-type", "application/json")],
            body.to_vec(),
        )
        .await
    }

    async fn wait_ready(&self) {
        eventually("/ready to answer 200", || async {
            self.get("/ready").await.status == StatusCode::OK
        })
        .await;
    }

    async fn metrics(&self) -> String {
        let reply = self.get("/metrics").await;
        assert_eq!(reply.status, StatusCode::OK);
        reply.text()
    }

    async fn wait_queue_depth(&self, requests: usize) {
        let line = format!("ruri_queue_requests {requests}\n");
        eventually(&format!("{requests} requests queued"), || async {
            self.metrics().await.contains(&line)
        })
        .await;
    }
}

/// Polls `check` until it holds; fails after 20 s.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    for _ in 0..2000 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// With the model ready and the gate closed: one request held inside the backend, and one
/// (`text`) waiting in the queue behind it.
async fn one_running_one_queued(
    server: &TestServer,
    gate: &Gate,
    calls: &Mutex<Vec<usize>>,
    text: &str,
) -> (
    tokio::task::JoinHandle<Reply>,
    tokio::task::JoinHandle<Reply>,
) {
    server.wait_ready().await;
    gate.set(true);
    let running = server
        .client
        .post_in_background("/embed", json!({"inputs": "走っている"}));
    wait_calls(calls, 2).await;
    let queued = server
        .client
        .post_in_background("/embed", json!({"inputs": text}));
    server.wait_queue_depth(1).await;
    (running, queued)
}

async fn wait_calls(calls: &Mutex<Vec<usize>>, n: usize) {
    eventually(&format!("{n} backend calls"), || async {
        calls.lock().unwrap().len() >= n
    })
    .await;
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// `data[*].embedding` of an OpenAI answer, after checking its envelope.
fn openai_vectors(reply: &Reply) -> Vec<Vec<f32>> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().unwrap();
    data.iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["object"], "embedding");
            assert_eq!(item["index"], i);
            floats(&item["embedding"])
        })
        .collect()
}

fn tei_vectors(reply: &Reply) -> Vec<Vec<f32>> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect()
}

fn assert_close(actual: &[f32], expected: &[f32], tolerance: f32, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    let worst = actual
        .iter()
        .zip(expected)
        .map(|(a, e)| (a - e).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= tolerance,
        "{what}: max |Δ| {worst:e} > {tolerance:e}"
    );
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// Distinct short texts: `n` per client.
fn client_texts(client: usize, request: usize, n: usize) -> Vec<String> {
    (0..n)
        .map(|k| {
            format!("利用者{client}の{request}番目の質問、その{k}: 瑠璃色の石はどこで採れますか？")
        })
        .collect()
}

/// What the library itself gives for `texts` (no prompt, unit length), one call.
fn library_vectors(embedder: &TextEmbedder, texts: &[String]) -> Vec<Vec<f32>> {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    embedder
        .embed_with(&refs, &EmbedOptions::new(Task::None))
        .unwrap()
        .to_vecs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_health_at_once_and_embeds_only_once_ready() {
    let gate = Gate::closed();
    let loading = Arc::clone(&gate);
    let server = spawn(Config::default(), move || {
        loading.wait();
        load_tiny()
    })
    .await;

    assert_eq!(server.get("/health").await.status, StatusCode::OK);
    let ready = server.get("/ready").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.json()["status"], "loading");
    assert!(ready.headers.contains_key(header::RETRY_AFTER));

    let openai = server.post("/v1/embeddings", &json!({"input": "猫"})).await;
    openai.openai_error(StatusCode::SERVICE_UNAVAILABLE, "model_loading");
    assert_eq!(openai.headers[header::RETRY_AFTER], "1");
    let tei = server.post("/embed", &json!({"inputs": "猫"})).await;
    tei.tei_error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy");
    assert!(server.metrics().await.contains("ruri_model_ready 0\n"));

    gate.set(false);
    server.wait_ready().await;
    let ready = server.get("/ready").await.json();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["dimensions"], 64);
    assert_eq!(ready["max_input_tokens"], 512);
    assert_eq!(
        openai_vectors(&server.post("/v1/embeddings", &json!({"input": "猫"})).await).len(),
        1
    );
    assert!(server.metrics().await.contains("ruri_model_ready 1\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_is_reported_by_ready_and_embedding_routes() {
    let server = spawn(Config::default(), || {
        Err("missing file /nowhere/config.json".to_owned())
    })
    .await;
    eventually("/ready to report the failure", || async {
        server.get("/ready").await.status == StatusCode::INTERNAL_SERVER_ERROR
    })
    .await;
    let ready = server.get("/ready").await.json();
    assert_eq!(ready["status"], "failed");
    assert!(
        ready["error"]
            .as_str()
            .unwrap()
            .contains("/nowhere/config.json")
    );
    let message = server
        .post("/embed", &json!({"inputs": "猫"}))
        .await
        .tei_error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy");
    assert!(message.contains("/nowhere/config.json"), "{message}");
    assert_eq!(server.get("/health").await.status, StatusCode::OK);

    // A panicking loader is a failed load too, not a dead server.
    let server = spawn(Config::default(), || panic!("weights are corrupt")).await;
    eventually("/ready to report the panic", || async {
        server.get("/ready").await.status == StatusCode::INTERNAL_SERVER_ERROR
    })
    .await;
    let error = server.get("/ready").await.json()["error"].clone();
    assert!(
        error.as_str().unwrap().contains("weights are corrupt"),
        "{error}"
    );
}

/// Every committed input, grouped by prompt, through both routes: the vectors are the
/// library's and Python's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_equal_the_library_and_python_on_both_routes() {
    let server = ready_server(Config::default()).await;
    let library = tiny();
    let reference = Reference::tiny();
    for prompt_name in ["", "query", "document", "topic"] {
        let items: Vec<_> = reference
            .items
            .iter()
            .filter(|item| item.prompt_name == prompt_name)
            .collect();
        let texts: Vec<&str> = items.iter().map(|item| item.text.as_str()).collect();
        let task = match prompt_name {
            "" => Task::None,
            name => Task::Named(name.to_owned()),
        };
        let expected = library
            .embed_with(&texts, &EmbedOptions::new(task.clone()))
            .unwrap();
        let expected_raw = library
            .embed_with(&texts, &EmbedOptions::new(task).normalize(false))
            .unwrap();

        let reply = server
            .post(
                "/v1/embeddings",
                &json!({"input": texts, "model": "anything", "prompt_name": prompt_name, "truncate": true}),
            )
            .await;
        let body = reply.json();
        assert_eq!(body["model"], "ruri");
        let tokens: usize = expected.token_counts().iter().sum();
        assert_eq!(body["usage"]["prompt_tokens"], tokens);
        assert_eq!(body["usage"]["total_tokens"], tokens);
        let openai = openai_vectors(&reply);

        let tei = tei_vectors(
            &server
                .post(
                    "/embed",
                    &json!({"inputs": texts, "prompt_name": prompt_name, "truncate": true}),
                )
                .await,
        );
        let tei_raw = tei_vectors(
            &server
                .post(
                    "/embed",
                    &json!({"inputs": texts, "prompt_name": prompt_name, "truncate": true, "normalize": false}),
                )
                .await,
        );
        assert_eq!(openai.len(), items.len());
        for (i, item) in items.iter().enumerate() {
            let what = format!("{} ({prompt_name:?})", item.id);
            assert_close(&openai[i], expected.get(i).unwrap(), SAME_MODEL, &what);
            assert_close(&tei[i], expected.get(i).unwrap(), SAME_MODEL, &what);
            assert_close(&openai[i], &item.st_fp32.normalized, VS_PYTHON, &what);
            // Raw means are not unit length: compare relative to their size.
            let scale = norm(&item.st_fp32.mean);
            assert_close(
                &tei_raw[i],
                expected_raw.get(i).unwrap(),
                SAME_MODEL * scale,
                &what,
            );
            assert_close(&tei_raw[i], &item.st_fp32.mean, VS_PYTHON * scale, &what);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base64_is_the_little_endian_f32_bytes() {
    let server = ready_server(Config::default()).await;
    let input = json!(["瑠璃色はどんな色？", "今日は晴れです。"]);
    let float = openai_vectors(
        &server
            .post("/v1/embeddings", &json!({"input": input}))
            .await,
    );
    let reply = server
        .post(
            "/v1/embeddings",
            &json!({"input": input, "encoding_format": "base64"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    for (i, expected) in float.iter().enumerate() {
        let text = body["data"][i]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        assert_eq!(bytes.len(), 64 * 4);
        let decoded: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_close(&decoded, expected, SAME_MODEL, "base64 vs float");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dimensions_keep_the_first_values_renormalized() {
    let server = ready_server(Config::default()).await;
    let text = "瑠璃色はどんな色？";
    let full = &openai_vectors(&server.post("/v1/embeddings", &json!({"input": text})).await)[0];
    let cut = &openai_vectors(
        &server
            .post("/v1/embeddings", &json!({"input": text, "dimensions": 16}))
            .await,
    )[0];
    let head = &full[..16];
    let expected: Vec<f32> = head.iter().map(|x| x / norm(head)).collect();
    assert_close(cut, &expected, SAME_MODEL, "dimensions 16");
    assert!((norm(cut) - 1.0).abs() < 1e-6);

    // TEI with normalize false: the raw values themselves.
    let raw = &tei_vectors(
        &server
            .post("/embed", &json!({"inputs": text, "normalize": false}))
            .await,
    )[0];
    let raw_cut = &tei_vectors(
        &server
            .post(
                "/embed",
                &json!({"inputs": text, "normalize": false, "dimensions": 8}),
            )
            .await,
    )[0];
    assert_close(
        raw_cut,
        &raw[..8],
        SAME_MODEL * norm(raw),
        "raw dimensions 8",
    );

    for bad in [0, 65] {
        let reply = server
            .post("/v1/embeddings", &json!({"input": text, "dimensions": bad}))
            .await;
        let message = reply.openai_error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
        assert!(message.contains("between 1 and 64"), "{message}");
        assert_eq!(reply.json()["error"]["param"], "dimensions");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_413() {
    let server = ready_server(Config {
        max_body_bytes: 1024,
        ..Config::default()
    })
    .await;
    let big = json!({"input": "猫".repeat(1000)});
    let message = server
        .post("/v1/embeddings", &big)
        .await
        .openai_error(StatusCode::PAYLOAD_TOO_LARGE, "too_large");
    assert!(!message.is_empty());
    let big = json!({"inputs": "猫".repeat(1000)});
    server
        .post("/embed", &big)
        .await
        .tei_error(StatusCode::PAYLOAD_TOO_LARGE, "validation");
    // Under the limit still works.
    assert_eq!(
        server.post("/embed", &json!({"inputs": "猫"})).await.status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_over_the_model_maximum_is_413_unless_truncation_is_asked() {
    let server = ready_server(Config::default()).await;
    let reference = Reference::tiny();
    let long = reference
        .items
        .iter()
        .find(|item| item.id == "over_max_seq_len_700")
        .unwrap();
    let tokens = long.untruncated_token_ids.len();
    let inputs = json!(["短い文。", long.text]);

    let message = server
        .post("/embed", &json!({"inputs": inputs}))
        .await
        .tei_error(StatusCode::PAYLOAD_TOO_LARGE, "validation");
    assert!(
        message.contains("input 1")
            && message.contains(&format!("{tokens} tokens"))
            && message.contains("512"),
        "{message}"
    );
    let message = server
        .post("/v1/embeddings", &json!({"input": inputs}))
        .await
        .openai_error(StatusCode::PAYLOAD_TOO_LARGE, "too_large");
    assert!(message.contains("input 1"), "{message}");

    let truncated = tei_vectors(
        &server
            .post("/embed", &json!({"inputs": inputs, "truncate": true}))
            .await,
    );
    assert_close(
        &truncated[1],
        &long.st_fp32.normalized,
        VS_PYTHON,
        long.id.as_str(),
    );
    let truncated = openai_vectors(
        &server
            .post(
                "/v1/embeddings",
                &json!({"input": inputs, "truncate": true}),
            )
            .await,
    );
    assert_close(
        &truncated[1],
        &long.st_fp32.normalized,
        VS_PYTHON,
        long.id.as_str(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_json_errors() {
    let server = ready_server(Config {
        max_inputs: 4,
        ..Config::default()
    })
    .await;

    let message = server
        .post_raw("/v1/embeddings", b"{\"input\": ")
        .await
        .openai_error(StatusCode::BAD_REQUEST, "invalid_json");
    assert!(message.contains("line 1"), "{message}");
    server
        .post_raw("/embed", b"not json")
        .await
        .tei_error(StatusCode::BAD_REQUEST, "validation");
    server
        .post_raw("/embed", b"\xff\xfe")
        .await
        .tei_error(StatusCode::BAD_REQUEST, "validation");

    let message = server
        .post("/v1/embeddings", &json!({"input": 5}))
        .await
        .openai_error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
    assert!(
        message.contains("a string or an array of strings"),
        "{message}"
    );
    let message = server
        .post("/v1/embeddings", &json!({"input": [[1, 2, 3]]}))
        .await
        .openai_error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
    assert!(message.contains("expected a string"), "{message}");
    let message = server
        .post("/embed", &json!({"text": "猫"}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(message.contains("inputs"), "{message}");
    let message = server
        .post("/embed", &json!({"inputs": []}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(message.contains("no input"), "{message}");
    server
        .post(
            "/v1/embeddings",
            &json!({"input": "猫", "encoding_format": "int8"}),
        )
        .await
        .openai_error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
    let message = server
        .post("/embed", &json!({"inputs": "猫", "prompt_name": "passage"}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(message.contains("\"query\""), "{message}");
    server
        .post(
            "/embed",
            &json!({"inputs": "猫", "truncate": true, "truncation_direction": "Left"}),
        )
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "validation");

    let message = server
        .post("/embed", &json!({"inputs": ["a", "b", "c", "d", "e"]}))
        .await
        .tei_error(StatusCode::PAYLOAD_TOO_LARGE, "validation");
    assert!(
        message.contains("5 inputs") && message.contains("4"),
        "{message}"
    );
    assert_eq!(
        server
            .post("/embed", &json!({"inputs": ["a", "b", "c", "d"]}))
            .await
            .status,
        StatusCode::OK
    );

    let reply = server.get("/v2/nothing").await;
    reply.tei_error(StatusCode::NOT_FOUND, "validation");
    // The server is still fine.
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
}

/// Small requests are tokenized and answered on the async worker, large ones on the blocking
/// pool (past 1 KiB of text, past 2,048 values in the answer): both give the library's vectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_give_the_same_vectors_as_small_ones() {
    let server = ready_server(Config::default()).await;
    let library = tiny();
    // 100 texts, ≈ 9 KB of text and 6,400 values in the answer.
    let texts = client_texts(7, 0, 100);
    assert!(texts.iter().map(String::len).sum::<usize>() > 1024);
    let expected = library_vectors(&library, &texts);
    let openai = openai_vectors(
        &server
            .post("/v1/embeddings", &json!({"input": texts}))
            .await,
    );
    let tei = tei_vectors(&server.post("/embed", &json!({"inputs": texts})).await);
    assert_eq!((openai.len(), tei.len()), (100, 100));
    for (k, e) in expected.iter().enumerate() {
        assert_close(&openai[k], e, SAME_MODEL, &format!("OpenAI text {k}"));
        assert_close(&tei[k], e, SAME_MODEL, &format!("TEI text {k}"));
        // The same text alone takes the small path.
        let alone = &openai_vectors(
            &server
                .post("/v1/embeddings", &json!({"input": texts[k]}))
                .await,
        )[0];
        assert_close(alone, e, SAME_MODEL, &format!("text {k} alone"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_each_get_the_vectors_of_their_own_inputs() {
    const CLIENTS: usize = 32;
    const REQUESTS: usize = 4;
    let server = ready_server(Config::default()).await;
    let library = Arc::new(tiny());
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let (server, library) = (server.client, Arc::clone(&library));
        clients.push(tokio::spawn(async move {
            for request in 0..REQUESTS {
                // 1 to 3 texts per request, alternating routes.
                let texts = client_texts(client, request, 1 + (client + request) % 3);
                let got = if (client + request) % 2 == 0 {
                    openai_vectors(
                        &server
                            .post("/v1/embeddings", &json!({"input": texts}))
                            .await,
                    )
                } else {
                    tei_vectors(&server.post("/embed", &json!({"inputs": texts})).await)
                };
                let expected = {
                    let (library, texts) = (Arc::clone(&library), texts.clone());
                    tokio::task::spawn_blocking(move || library_vectors(&library, &texts))
                        .await
                        .unwrap()
                };
                assert_eq!(got.len(), texts.len());
                for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
                    assert_close(
                        g,
                        e,
                        SAME_MODEL,
                        &format!("client {client} request {request} text {k}"),
                    );
                }
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    let metrics = server.metrics().await;
    let answered = (CLIENTS * REQUESTS) / 2;
    assert!(
        metrics.contains(&format!(
            "ruri_http_requests_total{{route=\"/v1/embeddings\",status=\"200\"}} {answered}\n"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("ruri_queue_requests 0\n"), "{metrics}");
}

/// Requests that arrive while the model is busy wait in the queue and then go to the backend
/// together, in one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_are_merged_into_one_backend_call() {
    let (load, gate, calls) = gated();
    let server = spawn(Config::default(), load).await;
    server.wait_ready().await;
    assert_eq!(*calls.lock().unwrap(), vec![1], "the warm-up call");
    let library = tiny();

    gate.set(true);
    let first = server
        .client
        .post_in_background("/embed", json!({"inputs": "最初の依頼"}));
    wait_calls(&calls, 2).await;
    let waiting: Vec<_> = (0..6)
        .map(|client| {
            let server = server.client;
            let texts = client_texts(client, 0, 2);
            tokio::spawn(async move {
                let reply = server.post("/embed", &json!({"inputs": texts})).await;
                (texts, reply)
            })
        })
        .collect();
    server.wait_queue_depth(6).await;
    gate.set(false);

    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    for request in waiting {
        let (texts, reply) = request.await.unwrap();
        let got = tei_vectors(&reply);
        for (g, e) in got.iter().zip(library_vectors(&library, &texts)) {
            assert_close(g, &e, SAME_MODEL, &texts[0]);
        }
    }
    assert_eq!(
        *calls.lock().unwrap(),
        vec![1, 1, 12],
        "warm-up, first, the six merged"
    );
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("ruri_batch_requests_count 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ruri_embedded_texts_total 13\n"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_recovers() {
    let (load, gate, calls) = gated();
    // A queue of one token: the first waiting request is admitted (an empty queue admits
    // anything), the next is not.
    let server = spawn(
        Config {
            max_queue_tokens: 1,
            ..Config::default()
        },
        load,
    )
    .await;
    let (running, queued) = one_running_one_queued(&server, &gate, &calls, "待っている").await;

    let refused = server.post("/embed", &json!({"inputs": "断られる"})).await;
    refused.tei_error(StatusCode::TOO_MANY_REQUESTS, "overloaded");
    assert_eq!(refused.headers[header::RETRY_AFTER], "1");
    server
        .post("/v1/embeddings", &json!({"input": "断られる"}))
        .await
        .openai_error(StatusCode::TOO_MANY_REQUESTS, "overloaded");

    gate.set(false);
    assert_eq!(running.await.unwrap().status, StatusCode::OK);
    assert_eq!(queued.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        server
            .post("/embed", &json!({"inputs": "断られる"}))
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_requests_in_flight() {
    let (load, gate, calls) = gated();
    let mut server = spawn(Config::default(), load).await;
    server.wait_ready().await;
    gate.set(true);
    let client = server.client;
    let in_flight = tokio::spawn(async move {
        client
            .post("/embed", &json!({"inputs": "終わらせてから止まる"}))
            .await
    });
    wait_calls(&calls, 2).await;
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !server.task.is_finished(),
        "it must wait for the request in flight"
    );
    gate.set(false);
    assert_eq!(in_flight.await.unwrap().status, StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .expect("the server stops once the request is answered")
        .unwrap()
        .unwrap();
    server.join_worker().await;
}

/// Stopping while the model loads: the server stops at once; the model thread ends when the
/// load does (what `main` waits for before exiting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_loading_ends_the_model_thread_after_the_load() {
    let gate = Gate::closed();
    let loading = Arc::clone(&gate);
    let mut server = spawn(Config::default(), move || {
        loading.wait();
        load_tiny()
    })
    .await;
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .expect("nothing in flight: the server stops at once")
        .unwrap()
        .unwrap();
    let worker = server.worker.take().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!worker.is_finished(), "still loading");
    gate.set(false);
    server.worker = Some(worker);
    server.join_worker().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_guards_the_embedding_routes_only() {
    let server = ready_server(Config {
        api_key: Some("s3cret".to_owned()),
        ..Config::default()
    })
    .await;
    let body = json!({"input": "猫"});
    let reply = server.post("/v1/embeddings", &body).await;
    reply.openai_error(StatusCode::UNAUTHORIZED, "invalid_api_key");
    assert_eq!(reply.headers[header::WWW_AUTHENTICATE], "Bearer");
    server
        .post_with(
            "/v1/embeddings",
            &[("authorization", "Bearer wrong")],
            &body,
        )
        .await
        .openai_error(StatusCode::UNAUTHORIZED, "invalid_api_key");
    server
        .post_with("/v1/embeddings", &[("authorization", "s3cret")], &body)
        .await
        .openai_error(StatusCode::UNAUTHORIZED, "invalid_api_key");
    server
        .post("/embed", &json!({"inputs": "猫"}))
        .await
        .tei_error(StatusCode::UNAUTHORIZED, "unauthorized");

    let ok = server
        .post_with(
            "/v1/embeddings",
            &[("authorization", "Bearer s3cret")],
            &body,
        )
        .await;
    assert_eq!(openai_vectors(&ok).len(), 1);
    let ok = server
        .post_with(
            "/embed",
            &[("authorization", "Bearer s3cret")],
            &json!({"inputs": "猫"}),
        )
        .await;
    assert_eq!(tei_vectors(&ok).len(), 1);
    for open in ["/health", "/ready", "/metrics"] {
        assert_eq!(server.get(open).await.status, StatusCode::OK, "{open}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_tokens_and_batches() {
    let server = ready_server(Config::default()).await;
    let library = tiny();
    let texts = ["瑠璃色はどんな色？", "今日は晴れです。"];
    let tokens: usize = library
        .embed_with(&texts, &EmbedOptions::new(Task::None))
        .unwrap()
        .token_counts()
        .iter()
        .sum();
    openai_vectors(
        &server
            .post("/v1/embeddings", &json!({"input": texts}))
            .await,
    );
    server.post_raw("/v1/embeddings", b"{").await;

    let reply = server.get("/metrics").await;
    assert_eq!(
        reply.headers[header::CONTENT_TYPE],
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let metrics = reply.text();
    for line in [
        "ruri_http_requests_total{route=\"/v1/embeddings\",status=\"200\"} 1\n".to_owned(),
        "ruri_http_requests_total{route=\"/v1/embeddings\",status=\"400\"} 1\n".to_owned(),
        "ruri_http_request_duration_seconds_count{route=\"/v1/embeddings\"} 2\n".to_owned(),
        "ruri_embedded_texts_total 2\n".to_owned(),
        format!("ruri_embedded_tokens_total {tokens}\n"),
        "ruri_batch_requests_count 1\n".to_owned(),
        "ruri_batch_texts_sum 2.0\n".to_owned(),
        "ruri_queue_requests 0\n".to_owned(),
        "ruri_model_ready 1\n".to_owned(),
        "ruri_inference_duration_seconds_count 1\n".to_owned(),
    ] {
        assert!(metrics.contains(&line), "no {line:?} in\n{metrics}");
    }
}

/// A client that gives up while its request waits costs no inference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_abandoned_in_the_queue_is_skipped() {
    let (load, gate, calls) = gated();
    let server = spawn(Config::default(), load).await;
    let (running, abandoned) = one_running_one_queued(&server, &gate, &calls, "諦められる").await;
    abandoned.abort();
    let _ = abandoned.await;
    // The connection is closed; the server notices at its next read of the socket, at once in
    // practice. 200 ms is plenty.
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.set(false);
    assert_eq!(running.await.unwrap().status, StatusCode::OK);
    server.wait_queue_depth(0).await;
    assert_eq!(
        server
            .post("/embed", &json!({"inputs": "次の依頼"}))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        *calls.lock().unwrap(),
        vec![1, 1, 1],
        "warm-up, running, next: none for the abandoned one"
    );
    assert!(
        server
            .metrics()
            .await
            .contains("ruri_abandoned_requests_total 1\n")
    );
}
