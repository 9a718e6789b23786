//! What the tests share: the tiny model (plain or behind a gate), a server on a loopback
//! port, a client that opens one connection per request, and checks of the answers' shapes.

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{self, HeaderMap};
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use ruri::backend::{Backend, BackendOutput, PaddedBatch};
use ruri::{EmbedOptions, Task, TextEmbedder};
use ruri_server::{Config, Connections, LoadResult};
use ruri_testkit::tiny_model_dir;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Vectors that went through the same fp32 model but possibly in other batches: only
/// summation order differs (the parity test measures 2.1e-7 against sentence-transformers).
pub(crate) const SAME_MODEL: f32 = 1e-6;
/// Against the Python references: the parity test's fp32 tolerance.
pub(crate) const VS_PYTHON: f32 = 1e-5;

pub(crate) fn tiny() -> TextEmbedder {
    ruri::ort::builder()
        .build_from_dir(tiny_model_dir())
        .unwrap_or_else(|e| panic!("building the tiny ort fp32 model: {e:?}"))
}

pub(crate) fn load_tiny() -> LoadResult {
    Ok(tiny())
}

/// A door a thread waits at while it is closed.
#[derive(Default)]
pub(crate) struct Gate {
    closed: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    pub(crate) fn closed() -> Arc<Self> {
        let gate = Self::default();
        *gate.closed.lock().unwrap() = true;
        Arc::new(gate)
    }
    pub(crate) fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.changed.notify_all();
    }
    pub(crate) fn wait(&self) {
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.changed.wait(closed).unwrap();
        }
    }
}

/// The tiny model's backend with a gate before each batch, recording each batch's text count.
/// Every batch here is small enough to be one backend call's only batch, so the log also
/// counts the server's backend calls.
pub(crate) struct Gated {
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
pub(crate) fn gated() -> (
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
pub(crate) struct TestServer {
    pub(crate) client: Client,
    pub(crate) stop: Option<oneshot::Sender<()>>,
    pub(crate) task: JoinHandle<std::io::Result<()>>,
    pub(crate) worker: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Waits (10 s at most) for the model thread to end, as `main` does after serving.
    pub(crate) async fn join_worker(&mut self) {
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
pub(crate) struct Client {
    pub(crate) addr: SocketAddr,
}

pub(crate) async fn spawn(
    config: Config,
    load: impl FnOnce() -> LoadResult + Send + 'static,
) -> TestServer {
    spawn_with(config, Connections::default(), load).await
}

/// [`spawn`] with these connection limits.
pub(crate) async fn spawn_with(
    config: Config,
    connections: Connections,
    load: impl FnOnce() -> LoadResult + Send + 'static,
) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (router, worker) = ruri_server::start(config, load).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(ruri_server::serve_with(
        listener,
        router,
        async {
            let _ = stopped.await;
        },
        connections,
    ));
    TestServer {
        client: Client { addr },
        stop: Some(stop),
        task,
        worker: Some(worker),
    }
}

/// A server with the tiny model, ready.
pub(crate) async fn ready_server(config: Config) -> TestServer {
    let server = spawn(config, load_tiny).await;
    server.wait_ready().await;
    server
}

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} answered a body that is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The OpenAI error's message, after checking the error shape.
    pub(crate) fn openai_error(&self, status: StatusCode, code: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "{body}");
        assert!(body["error"]["type"].is_string(), "{body}");
        body["error"]["message"].as_str().unwrap().to_owned()
    }

    /// The TEI error's message, after checking the error shape.
    pub(crate) fn tei_error(&self, status: StatusCode, error_type: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        let body = self.json();
        assert_eq!(body["error_type"], error_type, "{body}");
        body["error"].as_str().unwrap().to_owned()
    }
}

impl Client {
    pub(crate) async fn request(
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

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, &[], Vec::new()).await
    }

    /// [`Client::post`] on a task of its own, to be awaited later.
    pub(crate) fn post_in_background(
        self,
        path: &'static str,
        body: Value,
    ) -> tokio::task::JoinHandle<Reply> {
        tokio::spawn(async move { self.post(path, &body).await })
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_with(path, &[], body).await
    }

    pub(crate) async fn post_with(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Reply {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.request(Method::POST, path, &all, serde_json::to_vec(body).unwrap())
            .await
    }

    pub(crate) async fn post_raw(&self, path: &str, body: &[u8]) -> Reply {
        self.request(
            Method::POST,
            path,
            &[("content-type", "application/json")],
            body.to_vec(),
        )
        .await
    }

    pub(crate) async fn wait_ready(&self) {
        eventually("/ready to answer 200", || async {
            self.get("/ready").await.status == StatusCode::OK
        })
        .await;
    }

    pub(crate) async fn metrics(&self) -> String {
        let reply = self.get("/metrics").await;
        assert_eq!(reply.status, StatusCode::OK);
        reply.text()
    }

    pub(crate) async fn wait_queue_depth(&self, requests: usize) {
        let line = format!("ruri_queue_requests {requests}\n");
        eventually(&format!("{requests} requests queued"), || async {
            self.metrics().await.contains(&line)
        })
        .await;
    }
}

/// Polls `check` until it holds; fails after 20 s.
pub(crate) async fn eventually<F: std::future::Future<Output = bool>>(
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
pub(crate) async fn one_running_one_queued(
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

pub(crate) async fn wait_calls(calls: &Mutex<Vec<usize>>, n: usize) {
    eventually(&format!("{n} backend calls"), || async {
        calls.lock().unwrap().len() >= n
    })
    .await;
}

pub(crate) fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// `data[*].embedding` of an OpenAI answer, after checking its envelope.
pub(crate) fn openai_vectors(reply: &Reply) -> Vec<Vec<f32>> {
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

pub(crate) fn tei_vectors(reply: &Reply) -> Vec<Vec<f32>> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect()
}

pub(crate) fn assert_close(actual: &[f32], expected: &[f32], tolerance: f32, what: &str) {
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

pub(crate) fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// Distinct short texts: `n` per client.
pub(crate) fn client_texts(client: usize, request: usize, n: usize) -> Vec<String> {
    (0..n)
        .map(|k| {
            format!("利用者{client}の{request}番目の質問、その{k}: 瑠璃色の石はどこで採れますか？")
        })
        .collect()
}

/// What the library itself gives for `texts` (no prompt, unit length), one call.
pub(crate) fn library_vectors(embedder: &TextEmbedder, texts: &[String]) -> Vec<Vec<f32>> {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    embedder
        .embed_with(&refs, &EmbedOptions::new(Task::None))
        .unwrap()
        .to_vecs()
}

/// The task a reference item's `prompt_name` names (`""`: no prompt).
pub fn task(prompt_name: &str) -> Task {
    match prompt_name {
        "" => Task::None,
        name => Task::Named(name.to_owned()),
    }
}
