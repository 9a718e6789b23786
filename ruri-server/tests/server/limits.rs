//! Requests the server refuses: bodies and inputs over the limits, malformed requests.

use hyper::StatusCode;
use ruri_server::Config;
use ruri_testkit::Reference;
use serde_json::json;

use crate::support::{VS_PYTHON, assert_close, openai_vectors, ready_server, tei_vectors};

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
        .tei_error(StatusCode::PAYLOAD_TOO_LARGE, "Validation");
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
        .tei_error(StatusCode::PAYLOAD_TOO_LARGE, "Validation");
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
        .tei_error(StatusCode::BAD_REQUEST, "Validation");
    server
        .post_raw("/embed", b"\xff\xfe")
        .await
        .tei_error(StatusCode::BAD_REQUEST, "Validation");

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
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");
    assert!(message.contains("inputs"), "{message}");
    let message = server
        .post("/embed", &json!({"inputs": []}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");
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
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");
    assert!(message.contains("\"query\""), "{message}");
    server
        .post(
            "/embed",
            &json!({"inputs": "猫", "truncate": true, "truncation_direction": "Left"}),
        )
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");

    let message = server
        .post("/embed", &json!({"inputs": ["a", "b", "c", "d", "e"]}))
        .await
        .tei_error(StatusCode::PAYLOAD_TOO_LARGE, "Validation");
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
    reply.tei_error(StatusCode::NOT_FOUND, "Validation");
    // The server is still fine.
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
}
