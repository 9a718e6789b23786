//! The queue: concurrent clients, requests merged into one backend call, a full queue,
//! abandoned requests.

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use hyper::header;
use ruri_server::Config;
use serde_json::json;

use crate::support::{
    SAME_MODEL, assert_close, client_texts, gated, library_vectors, one_running_one_queued,
    openai_vectors, ready_server, spawn, tei_vectors, tiny, wait_calls,
};

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
    refused.tei_error(StatusCode::TOO_MANY_REQUESTS, "Overloaded");
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

/// Requests that do not fit the current merge wait for the next call, and are answered: with
/// a merge budget of one request and a token, every waiting request after the first is held
/// over to the next call. (Holding a request used to mark it taken, so the next call skipped
/// it: a 500 "dropped the request", and its tokens never left the queue; the load benchmark
/// found it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_held_over_to_the_next_call_are_answered() {
    let text = |i: usize| format!("{i}番目の依頼");
    let tokens = tiny()
        .tokenizer()
        .encode("", &text(0), ruri::Truncation::Truncate)
        .unwrap()
        .len();
    for i in 1..4 {
        let other = tiny()
            .tokenizer()
            .encode("", &text(i), ruri::Truncation::Truncate)
            .unwrap()
            .len();
        assert_eq!(other, tokens, "the waiting texts have one length");
    }
    let (load, gate, calls) = gated();
    let server = spawn(
        Config {
            max_merge_tokens: tokens + 1,
            ..Config::default()
        },
        load,
    )
    .await;
    server.wait_ready().await;
    gate.set(true);
    let running = server
        .client
        .post_in_background("/embed", json!({"inputs": "走っている"}));
    wait_calls(&calls, 2).await;
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            server
                .client
                .post_in_background("/embed", json!({"inputs": text(i)}))
        })
        .collect();
    server.wait_queue_depth(4).await;
    gate.set(false);
    assert_eq!(running.await.unwrap().status, StatusCode::OK);
    for request in waiting {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    server.wait_queue_depth(0).await;
    let metrics = server.metrics().await;
    assert!(metrics.contains("ruri_queue_tokens 0\n"), "{metrics}");
    // Warm-up, the running one, then one call per waiting request.
    assert_eq!(*calls.lock().unwrap(), vec![1; 6]);
}
