//! The server's timers: clients that send slowly or not at all, requests that wait too long
//! for the model, and a shutdown with work in flight. Each limit is set small here so the
//! tests run in seconds; the defaults are the flags' (`cli.rs`).

use std::time::{Duration, Instant};

use hyper::StatusCode;
use hyper::header;
use ruri_server::{Config, Connections};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{gated, load_tiny, spawn, spawn_with, wait_calls};

/// Writes a request's headers one byte per `pace` until the server closes the connection;
/// returns how long that took (or `None` if it was still open after `give_up`).
async fn slowloris(
    addr: std::net::SocketAddr,
    pace: Duration,
    give_up: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let headers = b"POST /embed HTTP/1.1\r\nhost: ruri\r\ncontent-type: application/json\r\n";
    let mut filler = headers.iter().copied().chain(std::iter::repeat(b'a'));
    let mut buf = [0u8; 256];
    while started.elapsed() < give_up {
        // The server closing shows as a read of 0 bytes (or an error), or a failed write.
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => return Some(started.elapsed()),
                // An answer (408 or 400) before closing is fine too: keep reading.
                Ok(_) => continue,
            },
            () = tokio::time::sleep(pace) => {
                let byte = [filler.next().unwrap()];
                if stream.write_all(&byte).await.is_err() {
                    return Some(started.elapsed());
                }
            }
        }
    }
    None
}

/// A slowloris client (headers one byte every 100 ms) is cut at the header timeout, while
/// ordinary clients are served at their usual speed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_is_cut_at_the_header_timeout() {
    let timeout = Duration::from_millis(1000);
    let server = spawn_with(
        Config::default(),
        Connections {
            header_read_timeout: timeout,
            ..Connections::default()
        },
        load_tiny,
    )
    .await;
    server.wait_ready().await;
    let addr = server.client.addr;
    let slow: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(slowloris(
                addr,
                Duration::from_millis(100),
                Duration::from_secs(10),
            ))
        })
        .collect();
    // Ordinary requests while the slow clients hold their connections.
    for _ in 0..5 {
        let started = Instant::now();
        let reply = server
            .post("/embed", &json!({"inputs": "普通の依頼"}))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "an ordinary request took {:?} beside slow clients",
            started.elapsed()
        );
    }
    for client in slow {
        let cut = client
            .await
            .unwrap()
            .expect("the slow client was never cut off");
        // Not before the timeout; not long after it (hyper checks it on its timer).
        assert!(
            cut >= timeout - Duration::from_millis(50) && cut <= timeout * 3,
            "cut after {cut:?} with a {timeout:?} header timeout"
        );
    }
}

/// A request stuck behind a busy model gets a 503 `timeout` at the request timeout and
/// leaves the queue (its tokens are free at once, and the model never runs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_too_long_gets_a_timeout_and_leaves_the_queue() {
    let (load, gate, calls) = gated();
    let timeout = Duration::from_millis(700);
    let server = spawn(
        Config {
            request_timeout: timeout,
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
    let started = Instant::now();
    let queued = server
        .post("/v1/embeddings", &json!({"input": "待ちすぎる"}))
        .await;
    let waited = started.elapsed();
    let message = queued.openai_error(StatusCode::SERVICE_UNAVAILABLE, "timeout");
    assert!(message.contains("request timeout"), "{message}");
    assert_eq!(queued.headers[header::RETRY_AFTER], "1");
    assert!(
        waited >= timeout && waited < timeout * 3,
        "answered after {waited:?} with a {timeout:?} timeout"
    );
    // The running one times out too (TEI's shape), and the queue is empty again.
    let running = running.await.unwrap();
    running.tei_error(StatusCode::SERVICE_UNAVAILABLE, "Overloaded");
    let metrics = server.metrics().await;
    assert!(metrics.contains("ruri_queue_requests 0\n"), "{metrics}");
    assert!(metrics.contains("ruri_queue_tokens 0\n"), "{metrics}");
    assert!(
        metrics.contains("ruri_request_timeouts_total 2\n"),
        "{metrics}"
    );

    gate.set(false);
    let next = server.post("/embed", &json!({"inputs": "次の依頼"})).await;
    assert_eq!(next.status, StatusCode::OK, "{}", next.text());
    assert_eq!(
        *calls.lock().unwrap(),
        vec![1, 1, 1],
        "warm-up, the running one, the next: none for the one that timed out"
    );
}

/// After the shutdown signal, a request held inside the model keeps the server only until
/// the shutdown deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_within_its_deadline_with_work_in_flight() {
    let (load, gate, calls) = gated();
    let deadline = Duration::from_millis(500);
    let mut server = spawn_with(
        Config::default(),
        Connections {
            shutdown_timeout: deadline,
            ..Connections::default()
        },
        load,
    )
    .await;
    server.wait_ready().await;
    gate.set(true);
    let in_flight = server
        .client
        .post_in_background("/embed", json!({"inputs": "終わらない"}));
    wait_calls(&calls, 2).await;
    let started = Instant::now();
    server.stop.take().unwrap().send(()).unwrap();
    let served = tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .expect("serve_with returned after its shutdown deadline");
    served.unwrap().unwrap();
    let took = started.elapsed();
    assert!(
        took >= deadline && took < deadline * 4,
        "shutdown took {took:?} with a {deadline:?} deadline"
    );
    // The connection in flight was closed, not answered.
    assert!(
        in_flight.await.is_err(),
        "the request in flight was answered"
    );
    gate.set(false);
    server.join_worker().await;
}

/// The connection cap: with two connections open (idle clients), a third waits in the
/// backlog, unanswered, until one of them closes; then it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_wait_until_one_closes() {
    let server = spawn_with(
        Config::default(),
        Connections {
            max_connections: 2,
            ..Connections::default()
        },
        load_tiny,
    )
    .await;
    server.wait_ready().await;
    let addr = server.client.addr;
    let idle = [
        TcpStream::connect(addr).await.unwrap(),
        TcpStream::connect(addr).await.unwrap(),
    ];
    // Let the server accept both (it accepts while under the cap).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = server
        .client
        .post_in_background("/embed", json!({"inputs": "三番目"}));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "a connection over the cap was served"
    );
    drop(idle);
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once a connection closed")
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}
