//! Loading, readiness and shutdown: what the server answers before, during and after the
//! model is there.

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use hyper::header;
use ruri_server::Config;
use serde_json::json;

use crate::support::{Gate, eventually, gated, load_tiny, openai_vectors, spawn, wait_calls};

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
    tei.tei_error(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy");
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
        .tei_error(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy");
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
