//! text-embeddings-inference's other routes: `POST /` (its compatibility route, `/embed` for an
//! embedding model), `GET /` (its health check), `GET /info`, `POST /tokenize`; and
//! huggingface_hub's `InferenceClient(model=URL).feature_extraction(...)`, the client
//! LangChain, LlamaIndex and Haystack use for a TEI endpoint, against the server.
//!
//! Expected values: vectors from the library called directly and from the Python references
//! (`testdata/reference/tiny.json`); tokens from Python's `tokenizers`
//! (`testdata/reference/tiny_tokens.json`); the model's width and length from the reference.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use hyper::StatusCode;
use hyper::header;
use ruri::{EmbedOptions, Task, Truncation};
use ruri_server::Config;
use ruri_testkit::{Reference, testdata_dir};
use serde_json::{Value, json};

use crate::support::{
    Gate, SAME_MODEL, VS_PYTHON, assert_close, floats, load_tiny, norm, ready_server, spawn, task,
    tei_vectors, tiny,
};

/// `POST /` answers what `POST /embed` answers, for every committed input (both normalized
/// and raw), and both equal the library and Python.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_root_is_embed() {
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
        let expected = library
            .embed_with(&texts, &EmbedOptions::new(task(prompt_name)))
            .unwrap();
        for normalize in [true, false] {
            let body = json!({
                "inputs": texts, "prompt_name": prompt_name, "truncate": true,
                "normalize": normalize,
            });
            let root = tei_vectors(&server.post("/", &body).await);
            let embed = tei_vectors(&server.post("/embed", &body).await);
            assert_eq!(root.len(), items.len());
            for (i, item) in items.iter().enumerate() {
                let what = format!("{} ({prompt_name:?}, normalize {normalize})", item.id);
                assert_close(&root[i], &embed[i], SAME_MODEL, &what);
                if normalize {
                    assert_close(&root[i], expected.get(i).unwrap(), SAME_MODEL, &what);
                    assert_close(&root[i], &item.st_fp32.normalized, VS_PYTHON, &what);
                } else {
                    let scale = norm(&item.st_fp32.mean);
                    assert_close(&root[i], &item.st_fp32.mean, VS_PYTHON * scale, &what);
                }
            }
        }
    }
    // One string, and `dimensions`, as on /embed.
    let one = tei_vectors(
        &server
            .post("/", &json!({"inputs": "瑠璃色はどんな色？"}))
            .await,
    );
    assert_eq!((one.len(), one[0].len()), (1, 64));
    let cut = tei_vectors(
        &server
            .post(
                "/",
                &json!({"inputs": "瑠璃色はどんな色？", "dimensions": 8}),
            )
            .await,
    );
    let head: Vec<f32> = one[0][..8].iter().map(|x| x / norm(&one[0][..8])).collect();
    assert_close(&cut[0], &head, SAME_MODEL, "dimensions 8 on POST /");
}

/// Refusals on `POST /` come in TEI's error shape, as on `/embed`; `GET /` is TEI's health
/// check, open without the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_root_refuses_as_embed_and_get_root_is_health() {
    let server = ready_server(Config::default()).await;
    let reference = Reference::tiny();
    let over = &reference.item("over_max_seq_len_700").text;
    let message = server
        .post("/", &json!({"inputs": over}))
        .await
        .tei_error(StatusCode::PAYLOAD_TOO_LARGE, "Validation");
    assert!(message.contains("752 tokens"), "{message}");
    let message = server
        .post("/", &json!({"inputs": "猫", "prompt_name": "nope"}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");
    assert!(
        message.contains("unknown prompt_name \"nope\""),
        "{message}"
    );
    server
        .post(
            "/",
            &json!({"inputs": "猫", "truncation_direction": "left"}),
        )
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");
    server
        .post_raw("/", b"{")
        .await
        .tei_error(StatusCode::BAD_REQUEST, "Validation");
    server
        .post("/", &json!({"inputs": []}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");

    let health = server.get("/").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json()["status"], "ok");
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("ruri_http_requests_total{route=\"/\",status=\"413\"} 1\n"),
        "{metrics}"
    );

    // Other methods and paths still get TEI's 404, which names the new routes.
    let missing = server.get("/embed_all").await;
    let message = missing.tei_error(StatusCode::NOT_FOUND, "Validation");
    for route in ["POST /tokenize", "GET /info", "POST /"] {
        assert!(message.contains(route), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_describes_the_model_in_teis_fields() {
    let server = ready_server(Config {
        model_name: "ruri-v3-tiny".to_owned(),
        model_id: Some("testdata/tiny".to_owned()),
        model_dtype: Some("float32".to_owned()),
        backend: Some("ort".to_owned()),
        default_prompt_name: Some("query".to_owned()),
        max_inputs: 100,
        max_merge_tokens: 4096,
        max_tokenizing: 3,
        ..Config::default()
    })
    .await;
    let reply = server.get("/info").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.headers[header::CONTENT_TYPE], "application/json");
    let info = reply.json();
    let reference = Reference::tiny();
    let expected = json!({
        "model_id": "testdata/tiny",
        "model_sha": null,
        "model_dtype": "float32",
        "served_model_name": "ruri-v3-tiny",
        "model_type": {"embedding": {"pooling": "mean"}},
        "max_input_length": reference.max_seq_length,
        "max_batch_tokens": 4096,
        "max_batch_requests": null,
        "max_client_batch_size": 100,
        "auto_truncate": false,
        "tokenization_workers": 3,
        "version": env!("CARGO_PKG_VERSION"),
        "sha": null,
        "docker_label": null,
        "dimensions": reference.dim,
        "backend": "ort",
        "prompts": {"": "", "query": "検索クエリ: ", "document": "検索文書: ", "topic": "トピック: "},
        "default_prompt_name": "query",
    });
    assert_eq!(info, expected);

    // A library user who sets none of the descriptive fields: the name stands in for the
    // id, and what is unknown is null.
    let server = ready_server(Config::default()).await;
    let info = server.get("/info").await.json();
    assert_eq!(info["model_id"], "ruri");
    assert_eq!(info["served_model_name"], "ruri");
    assert_eq!(info["model_dtype"], Value::Null);
    assert_eq!(info["backend"], Value::Null);
    assert_eq!(info["default_prompt_name"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_and_tokenize_wait_for_the_model() {
    let gate = Gate::closed();
    let loading = std::sync::Arc::clone(&gate);
    let server = spawn(Config::default(), move || {
        loading.wait();
        load_tiny()
    })
    .await;
    let info = server.get("/info").await;
    info.tei_error(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy");
    assert_eq!(info.headers[header::RETRY_AFTER], "1");
    server
        .post("/tokenize", &json!({"inputs": "猫"}))
        .await
        .tei_error(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy");
    assert_eq!(server.get("/").await.status, StatusCode::OK);
    gate.set(false);
    server.wait_ready().await;
    assert_eq!(server.get("/info").await.status, StatusCode::OK);
}

/// Every committed input up to 300 characters, in batches of one prompt and one
/// `add_special_tokens`: the answer is exactly what TEI computes (Python's `tokenizers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_answers_as_tei() {
    let server = ready_server(Config::default()).await;
    let path = testdata_dir().join("reference/tiny_tokens.json");
    let reference: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let items = reference["items"].as_array().unwrap();
    assert!(items.len() >= 60, "{} items", items.len());
    let mut checked = 0;
    for prompt_name in ["", "query", "document", "topic"] {
        for add_special_tokens in [true, false] {
            let group: Vec<&Value> = items
                .iter()
                .filter(|item| {
                    item["prompt_name"] == prompt_name
                        && item["add_special_tokens"] == add_special_tokens
                })
                .collect();
            let texts: Vec<&Value> = group.iter().map(|item| &item["text"]).collect();
            let mut body = json!({"inputs": texts, "add_special_tokens": add_special_tokens});
            if !prompt_name.is_empty() {
                body["prompt_name"] = json!(prompt_name);
            }
            let reply = server.post("/tokenize", &body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
            let expected: Vec<&Value> = group.iter().map(|item| &item["tokens"]).collect();
            let answer = reply.json();
            let answer = answer.as_array().unwrap();
            assert_eq!(answer.len(), expected.len());
            for ((item, ours), python) in group.iter().zip(answer).zip(&expected) {
                assert_eq!(
                    ours, *python,
                    "{} ({prompt_name:?}, special tokens {add_special_tokens})",
                    item["id"]
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, items.len());

    // One string gives a list of one list; no `add_special_tokens` means true.
    let reply = server.post("/tokenize", &json!({"inputs": "瑠璃色"})).await;
    let answer = reply.json();
    let tokens = answer[0].as_array().unwrap();
    assert_eq!(answer.as_array().unwrap().len(), 1);
    assert_eq!(
        tokens[0],
        json!({"id": 1, "text": "<s>", "special": true, "start": null, "stop": null})
    );
    assert_eq!(tokens.last().unwrap()["text"], "</s>");
}

/// Nothing is truncated: a text past the model's maximum is shown whole (as TEI), with the
/// ids of Python's untruncated encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_shows_long_texts_whole() {
    let server = ready_server(Config::default()).await;
    let item = Reference::tiny().item("over_max_seq_len_1500").clone();
    let reply = server
        .post(
            "/tokenize",
            &json!({"inputs": [item.text], "prompt_name": "query"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let ids: Vec<u64> = reply.json()[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|token| token["id"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = item
        .untruncated_token_ids
        .iter()
        .map(|&id| u64::from(id))
        .collect();
    assert_eq!(ids.len(), 1667);
    assert_eq!(ids, expected);
}

/// A server that strips whitespace (`--whitespace strip`) tokenizes the stripped text, but its
/// offsets still index prompt + text as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_offsets_index_the_text_as_sent_under_strip() {
    let server = spawn(Config::default(), || {
        Ok(tiny().with_whitespace(ruri::Whitespace::Strip))
    })
    .await;
    server.wait_ready().await;
    let text = "  \u{3000}瑠璃色の石\n";
    let reply = server
        .post(
            "/tokenize",
            &json!({"inputs": text, "prompt_name": "document"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let joined = format!("検索文書: {text}");
    let mut covered = String::new();
    let mut last = None;
    for token in reply.json()[0].as_array().unwrap() {
        if token["special"] == true {
            continue;
        }
        let range = (
            token["start"].as_u64().unwrap() as usize,
            token["stop"].as_u64().unwrap() as usize,
        );
        assert_eq!(token["text"], joined[range.0..range.1], "{token}");
        if last != Some(range) {
            covered.push_str(&joined[range.0..range.1]);
            last = Some(range);
        }
    }
    assert_eq!(covered, joined.trim_end());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_refuses_as_tei() {
    let server = ready_server(Config {
        max_inputs: 3,
        default_prompt_name: Some("query".to_owned()),
        ..Config::default()
    })
    .await;
    let message = server
        .post("/tokenize", &json!({"inputs": ["a", "b", "c", "d"]}))
        .await
        .tei_error(StatusCode::PAYLOAD_TOO_LARGE, "Validation");
    assert!(
        message.contains("more than this server's maximum of 3"),
        "{message}"
    );
    server
        .post("/tokenize", &json!({"inputs": []}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");
    server
        .post("/tokenize", &json!({"inputs": [1, 2]}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");
    let message = server
        .post("/tokenize", &json!({"inputs": "猫", "prompt_name": "nope"}))
        .await
        .tei_error(StatusCode::UNPROCESSABLE_ENTITY, "Validation");
    assert!(message.contains("unknown prompt_name"), "{message}");

    // Without `prompt_name` the server's default prompt applies, as on /embed; `""` is none.
    let first_text = |reply: &crate::support::Reply| reply.json()[0][1]["text"].clone();
    let default = server.post("/tokenize", &json!({"inputs": "猫"})).await;
    assert_eq!(default.status, StatusCode::OK, "{}", default.text());
    let library = tiny();
    let query = library
        .tokenizer()
        .encode("検索クエリ: ", "猫", Truncation::Error)
        .unwrap();
    let ids: Vec<u64> = default.json()[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids,
        query
            .ids()
            .iter()
            .map(|&i| u64::from(i))
            .collect::<Vec<_>>()
    );
    assert_eq!(default.json()[0][1]["start"], 0);
    let none = server
        .post("/tokenize", &json!({"inputs": "猫", "prompt_name": ""}))
        .await;
    assert_eq!(first_text(&none), "猫");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_the_tei_routes_as_tei() {
    let server = ready_server(Config {
        api_key: Some("s3cret".to_owned()),
        ..Config::default()
    })
    .await;
    let key = [("authorization", "Bearer s3cret")];
    for (path, body) in [
        ("/", json!({"inputs": "猫"})),
        ("/tokenize", json!({"inputs": "猫"})),
    ] {
        server
            .post(path, &body)
            .await
            .tei_error(StatusCode::UNAUTHORIZED, "Unauthorized");
        let ok = server.post_with(path, &key, &body).await;
        assert_eq!(ok.status, StatusCode::OK, "{path}: {}", ok.text());
    }
    server
        .get("/info")
        .await
        .tei_error(StatusCode::UNAUTHORIZED, "Unauthorized");
    let ok = server
        .request(hyper::Method::GET, "/info", &key, Vec::new())
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    // TEI's health check stays open.
    assert_eq!(server.get("/").await.status, StatusCode::OK);
}

/// Runs `hf_client.py` on `cases` against `url`, off the async workers (the server under
/// test runs on them).
async fn run_client(python: PathBuf, url: String, token: Option<&str>, cases: Value) -> Vec<Value> {
    let input = json!({"url": url, "token": token, "cases": cases}).to_string();
    let home = tempfile_dir();
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/server/hf_client.py");
        let mut child = Command::new(&python)
            .arg(&script)
            // No token of the machine's user, no telemetry, nothing but loopback.
            .env_remove("HF_TOKEN")
            .env_remove("HF_API_TOKEN")
            .env("HF_HOME", &home)
            .env("HF_HUB_OFFLINE", "0")
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        let _ = std::fs::remove_dir_all(&home);
        output
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "hf_client.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("hf_client.py printed no JSON ({e}): {stdout}"));
    assert_eq!(answer["huggingface_hub"], "2.4.0", "the pinned client");
    answer["answers"].as_array().unwrap().clone()
}

/// An empty folder for the client's `HF_HOME` (so it finds no saved token).
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ruri-hf-client-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The vectors of one client answer, after checking its shape and dtype.
fn client_vectors(answer: &Value, n: usize, dim: usize, what: &str) -> Vec<Vec<f32>> {
    assert_eq!(answer["shape"], json!([n, dim]), "{what}: {answer}");
    assert_eq!(answer["dtype"], "float32", "{what}");
    answer["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect()
}

/// `InferenceClient(model=URL).feature_extraction(...)`: one text, a batch, `prompt_name`,
/// `normalize`, `truncate`, `dimensions`, and the errors the client raises; vectors equal to
/// the library's and Python's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huggingface_hub_inference_client_feature_extraction() {
    let Some(python) =
        ruri_testkit::hub_python("huggingface_hub's InferenceClient against the server")
    else {
        return;
    };
    let server = ready_server(Config::default()).await;
    let url = format!("http://{}", server.addr);
    let library = tiny();
    let reference = Reference::tiny();
    let by_prompt = |name: &str| -> Vec<&ruri_testkit::Item> {
        reference
            .items
            .iter()
            .filter(|item| item.prompt_name == name && !item.truncated)
            .collect()
    };
    let queries = by_prompt("query");
    let documents = by_prompt("document");
    let topics = by_prompt("topic");
    let texts = |items: &[&ruri_testkit::Item]| -> Vec<String> {
        items.iter().map(|item| item.text.clone()).collect()
    };
    let single = "瑠璃色はどんな色？";
    let long = reference.item("over_max_seq_len_700");
    let cases = json!([
        {"text": single, "kwargs": {}},
        {"text": texts(&queries), "kwargs": {"prompt_name": "query"}},
        {"text": texts(&documents), "kwargs": {"prompt_name": "document", "normalize": false}},
        {"text": texts(&topics), "kwargs": {"prompt_name": "topic", "normalize": true}},
        {"text": [long.text], "kwargs": {"truncate": true}},
        {"text": [long.text], "kwargs": {"truncate": true, "truncation_direction": "right"}},
        {"text": [long.text], "kwargs": {}},
        {"text": single, "kwargs": {"prompt_name": "nope"}},
        {"text": single, "kwargs": {"dimensions": 16}},
    ]);
    let answers = run_client(python.clone(), url.clone(), None, cases).await;
    assert_eq!(answers.len(), 9);

    // One text: a (1, 64) array, the library's vector (no prompt, unit length).
    let expected = plain_vector(&library, single);
    let one = client_vectors(&answers[0], 1, 64, "single");
    assert_close(&one[0], &expected, SAME_MODEL, "single text");

    // Batches under each prompt, normalized or raw: the library's and Python's vectors.
    for (answer, items, prompt_name, normalize) in [
        (&answers[1], &queries, "query", true),
        (&answers[2], &documents, "document", false),
        (&answers[3], &topics, "topic", true),
    ] {
        let what = format!("batch {prompt_name:?} normalize {normalize}");
        let vectors = client_vectors(answer, items.len(), 64, &what);
        let refs: Vec<&str> = items.iter().map(|item| item.text.as_str()).collect();
        let expected = library
            .embed_with(
                &refs,
                &EmbedOptions::new(task(prompt_name)).normalize(normalize),
            )
            .unwrap();
        for (i, item) in items.iter().enumerate() {
            let what = format!("{what}: {}", item.id);
            if normalize {
                assert_close(&vectors[i], expected.get(i).unwrap(), SAME_MODEL, &what);
                assert_close(&vectors[i], &item.st_fp32.normalized, VS_PYTHON, &what);
            } else {
                let scale = norm(&item.st_fp32.mean);
                assert_close(
                    &vectors[i],
                    expected.get(i).unwrap(),
                    SAME_MODEL * scale,
                    &what,
                );
                assert_close(&vectors[i], &item.st_fp32.mean, VS_PYTHON * scale, &what);
            }
        }
    }

    // truncate: sentence-transformers' truncated vector (it truncates at 512 tokens).
    assert!(long.truncated);
    for answer in [&answers[4], &answers[5]] {
        let vectors = client_vectors(answer, 1, 64, "truncate");
        assert_close(
            &vectors[0],
            &long.st_fp32.normalized,
            VS_PYTHON,
            "truncated",
        );
    }
    // Without truncate the client raises the server's 413, TEI's error body inside.
    assert_eq!(answers[6]["status"], 413, "{}", answers[6]);
    assert_eq!(answers[6]["body"]["error_type"], "Validation");
    assert!(
        answers[6]["body"]["error"]
            .as_str()
            .unwrap()
            .contains("752 tokens"),
        "{}",
        answers[6]
    );
    assert_eq!(answers[7]["status"], 422, "{}", answers[7]);
    assert_eq!(answers[7]["body"]["error_type"], "Validation");

    // dimensions: the first 16 values, renormalized.
    let cut = client_vectors(&answers[8], 1, 16, "dimensions");
    let head: Vec<f32> = expected[..16]
        .iter()
        .map(|x| x / norm(&expected[..16]))
        .collect();
    assert_close(&cut[0], &head, SAME_MODEL, "dimensions 16");

    // The client's token is the server's API key.
    let guarded = ready_server(Config {
        api_key: Some("s3cret".to_owned()),
        ..Config::default()
    })
    .await;
    let url = format!("http://{}", guarded.addr);
    let cases = json!([{"text": single, "kwargs": {}}]);
    let answers = run_client(python.clone(), url.clone(), Some("s3cret"), cases.clone()).await;
    let one = client_vectors(&answers[0], 1, 64, "with the key");
    assert_close(&one[0], &expected, SAME_MODEL, "with the key");
    let answers = run_client(python, url, Some("wrong"), cases).await;
    assert_eq!(answers[0]["status"], 401, "{}", answers[0]);
}

/// What the library gives one text with no prompt, unit length.
fn plain_vector(library: &ruri::TextEmbedder, text: &str) -> Vec<f32> {
    library
        .embed_with(&[text], &EmbedOptions::new(Task::None))
        .unwrap()
        .get(0)
        .unwrap()
        .to_vec()
}
