//! The embedding routes (OpenAI and TEI): vectors, encodings, dimensions, large requests,
//! the API key, metrics.

use base64::Engine as _;
use hyper::StatusCode;
use hyper::header;
use hyper::header::HeaderValue;
use ruri::EmbedOptions;
use ruri::Task;
use ruri_server::Config;
use ruri_testkit::Reference;
use serde_json::json;

use crate::support::{
    SAME_MODEL, VS_PYTHON, assert_close, client_texts, library_vectors, norm, openai_vectors,
    ready_server, task, tei_vectors, tiny,
};

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
        let task = task(prompt_name);
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
        .tei_error(StatusCode::UNAUTHORIZED, "Unauthorized");

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
