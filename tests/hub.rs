//! Loading by model id, against a loopback mock of the Hugging Face Hub
//! (`ruri_testkit::hub_mock`, started by each test on its own port, with its own cache folder):
//! downloads equal to the committed files, vectors equal to the local folder's, revisions,
//! offline use, interruption and resume, every typed error, concurrent downloads (threads and
//! processes), and Python's `huggingface_hub` reading what ruri cached and the reverse.
//!
//! Expected bytes, hashes, commits and `max_seq_length` come from `testdata/tiny` and the
//! mock's data, never from the code under test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ruri::hub::{Hub, HubRepo, ModelSource};
use ruri::ort::{Graph, Precision};
use ruri::{Error, TextEmbedder, TokenSource};
use ruri_testkit::hub_mock::{
    self, Fault, GATED_REPO, GOOD_TOKEN, MockHub, PRIVATE_REPO, TINY_MIRROR_REPO, TINY_REPO,
    V1_MAX_SEQ_LENGTH, sha256_hex,
};
use ruri_testkit::{TempDir, repo_root, tiny_model_dir};

mod support;
use support::hub;

const TEXTS: &[&str] = &[
    "瑠璃色はどんな色？",
    "瑠璃は青い宝石です。",
    "今日は晴れです。今日は晴れです。今日は晴れです。今日は晴れです。今日は晴れです。",
];

fn start() -> (MockHub, TempDir) {
    (
        MockHub::start(hub_mock::tiny_repos()),
        TempDir::new().unwrap(),
    )
}

fn vectors(embedder: &TextEmbedder) -> Vec<Vec<f32>> {
    let embeddings = embedder.embed_documents(TEXTS).unwrap();
    embeddings.iter().map(<[f32]>::to_vec).collect()
}

fn ort_onnx(precision: Precision) -> ruri::ort::OrtBuilder {
    ruri::ort::builder()
        .graph(Graph::OnnxFile)
        .precision(precision)
}

/// `models--org--name` under `cache`.
fn storage(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// The files of a snapshot folder, relative, sorted.
fn snapshot_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = hub_mock::read_tree(dir).into_keys().collect();
    files.sort();
    files
}

fn tiny_bytes(path: &str) -> Vec<u8> {
    std::fs::read(tiny_model_dir().join(path)).unwrap()
}

/// The snapshot folder `repo` at `commit`.
fn snapshot(cache: &Path, repo: &str, commit: &str) -> PathBuf {
    storage(cache, repo).join("snapshots").join(commit)
}

/// GETs of `path`'s bytes that were transfers, not hf-hub's one-byte probes.
fn transfers(mock: &MockHub, path: &str) -> Vec<Option<String>> {
    mock.cdn_gets(path)
        .into_iter()
        .filter(|range| range.as_deref() != Some("bytes=0-0"))
        .collect()
}

const CONFIG_FILES: &[&str] = &[
    "1_Pooling/config.json",
    "config.json",
    "config_sentence_transformers.json",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

fn with_config(weights: &[&str]) -> Vec<String> {
    let mut files: Vec<String> = CONFIG_FILES
        .iter()
        .chain(weights)
        .map(|s| (*s).to_owned())
        .collect();
    files.sort();
    files
}

#[test]
fn an_id_gives_the_folders_vectors_and_downloads_only_what_runs() {
    let (mock, cache) = start();
    let main = mock.commit(TINY_REPO, "main");
    let repo = || HubRepo::new(TINY_REPO).hub(hub(&mock, cache.path()));

    // candle: the configs and model.safetensors.
    let from_hub = ruri::candle::builder().build_from_hub(repo()).unwrap();
    let local = ruri::candle::builder()
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&from_hub), vectors(&local));
    let snap = snapshot(cache.path(), TINY_REPO, &main);
    assert_eq!(snapshot_files(&snap), with_config(&["model.safetensors"]));

    // ort int8 ONNX: adds exactly that file.
    let from_hub = ort_onnx(Precision::Int8).build_from_hub(repo()).unwrap();
    let local = ort_onnx(Precision::Int8)
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&from_hub), vectors(&local));
    assert_eq!(
        snapshot_files(&snap),
        with_config(&["model.safetensors", "onnx/model_quantized.onnx"])
    );

    // ort fp32 ONNX.
    let from_hub = ort_onnx(Precision::Fp32).build_from_hub(repo()).unwrap();
    let local = ort_onnx(Precision::Fp32)
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&from_hub), vectors(&local));

    // Every cached file is byte for byte the committed one.
    for path in snapshot_files(&snap) {
        assert_eq!(
            std::fs::read(snap.join(&path)).unwrap(),
            tiny_bytes(&path),
            "{path}"
        );
    }

    // Python's layout: LFS blobs named by their SHA-256, snapshot entries relative links,
    // refs/main holding the commit.
    let store = storage(cache.path(), TINY_REPO);
    let sha = sha256_hex(&tiny_bytes("model.safetensors"));
    assert!(store.join("blobs").join(&sha).is_file());
    let link = std::fs::read_link(snap.join("model.safetensors")).unwrap();
    assert_eq!(link, Path::new("../../blobs").join(&sha));
    let link = std::fs::read_link(snap.join("1_Pooling/config.json")).unwrap();
    assert!(link.starts_with("../../../blobs"), "{}", link.display());
    assert_eq!(
        std::fs::read_to_string(store.join("refs/main")).unwrap(),
        main
    );
    let leftovers: Vec<_> = std::fs::read_dir(store.join("blobs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A second id is a second cache folder with the same vectors.
    let mirror = ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_MIRROR_REPO).hub(hub(&mock, cache.path())))
        .unwrap();
    assert_eq!(
        vectors(&mirror),
        vectors(&from_hub_candle(&mock, cache.path()))
    );
    assert!(
        storage(cache.path(), TINY_MIRROR_REPO)
            .join("refs/main")
            .is_file()
    );

    // Cached files are not fetched again: one listing request, nothing else.
    mock.clear_log();
    ruri::candle::builder().build_from_hub(repo()).unwrap();
    let requests = mock.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert!(requests[0].path.starts_with("/api/models/"), "{requests:?}");
}

fn from_hub_candle(mock: &MockHub, cache: &Path) -> TextEmbedder {
    ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(hub(mock, cache)))
        .unwrap()
}

#[test]
fn the_default_ort_graph_follows_the_folder_rule() {
    // Graph::Auto runs the fused graph when the folder has model.safetensors: from the Hub
    // that is the file fetched, and no ONNX file.
    let (mock, cache) = start();
    let embedder = ruri::ort::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(hub(&mock, cache.path())))
        .unwrap();
    let local = ruri::ort::builder()
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&embedder), vectors(&local));
    let snap = snapshot(cache.path(), TINY_REPO, &mock.commit(TINY_REPO, "main"));
    assert_eq!(snapshot_files(&snap), with_config(&["model.safetensors"]));
}

#[test]
fn a_commit_or_a_tag_pins_the_revision() {
    let (mock, cache) = start();
    let v1 = mock.commit(TINY_REPO, "v1");
    let main = mock.commit(TINY_REPO, "main");
    assert_ne!(v1, main);
    let at = |revision: &str| {
        HubRepo::new(TINY_REPO)
            .revision(revision)
            .hub(hub(&mock, cache.path()))
    };
    let pinned = ort_onnx(Precision::Fp32).build_from_hub(at(&v1)).unwrap();
    assert_eq!(pinned.max_length(), V1_MAX_SEQ_LENGTH);
    let current = ort_onnx(Precision::Fp32)
        .build_from_hub(at("main"))
        .unwrap();
    assert_eq!(current.max_length(), 512);
    // The long text is cut at v1 only.
    let long = [TEXTS[2]];
    assert_eq!(
        pinned.embed_documents(&long).unwrap().truncated(0),
        Some(true)
    );
    assert_eq!(
        current.embed_documents(&long).unwrap().truncated(0),
        Some(false)
    );
    let store = storage(cache.path(), TINY_REPO);
    assert!(store.join("snapshots").join(&v1).is_dir());
    // A commit gets no ref (as huggingface_hub); a tag does.
    assert!(!store.join("refs").join(&v1).exists());
    ort_onnx(Precision::Fp32).build_from_hub(at("v1")).unwrap();
    assert_eq!(std::fs::read_to_string(store.join("refs/v1")).unwrap(), v1);

    // v1 has no int8 file: the error lists what it has.
    match ort_onnx(Precision::Int8).build_from_hub(at(&v1)) {
        Err(Error::RemoteFileNotFound {
            repo,
            revision,
            wanted,
            files,
        }) => {
            assert_eq!(repo, TINY_REPO);
            assert_eq!(revision, v1);
            assert!(wanted.contains("int8 ONNX file"), "{wanted}");
            assert!(wanted.contains("onnx/model_quantized.onnx"), "{wanted}");
            assert!(files.contains(&"onnx/model.onnx".to_owned()), "{files:?}");
        }
        other => panic!("{:?}", other.err()),
    }
}

#[test]
fn offline_the_cache_serves_and_a_miss_is_typed() {
    let (mock, cache) = start();
    let online = from_hub_candle(&mock, cache.path());
    let expected = vectors(&online);
    let requests = mock.requests().len();
    // HF_HUB_OFFLINE: no request at all, same vectors.
    let offline = hub(&mock, cache.path()).offline(true);
    let embedder = ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(offline.clone()))
        .unwrap();
    assert_eq!(vectors(&embedder), expected);
    assert_eq!(mock.requests().len(), requests);

    // Offline, a file never fetched (the int8 ONNX file) is a miss, not a download.
    match ort_onnx(Precision::Int8).build_from_hub(HubRepo::new(TINY_REPO).hub(offline.clone())) {
        Err(Error::NotCached {
            repo, reason, why, ..
        }) => {
            assert_eq!(repo, TINY_REPO);
            assert!(reason.contains("int8 ONNX file"), "{reason}");
            assert!(why.contains("HF_HUB_OFFLINE"), "{why}");
        }
        other => panic!("{:?}", other.err()),
    }
    // A model never downloaded, and a revision never resolved.
    let empty = TempDir::new().unwrap();
    let miss = ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_MIRROR_REPO).hub(hub(&mock, empty.path()).offline(true)));
    assert!(
        matches!(miss, Err(Error::NotCached { .. })),
        "{:?}",
        miss.err()
    );
    let miss =
        ruri::candle::builder().build_from_hub(HubRepo::new(TINY_REPO).revision("v1").hub(offline));
    assert!(
        matches!(miss, Err(Error::NotCached { .. })),
        "{:?}",
        miss.err()
    );
    assert_eq!(mock.requests().len(), requests);

    // An unreachable Hub falls back on the cache, as huggingface_hub does.
    let dead = dead_endpoint();
    let unreachable = hub(&mock, cache.path()).endpoint(dead.url.clone());
    let embedder = ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(unreachable))
        .unwrap();
    assert_eq!(vectors(&embedder), expected);
    // ... and without a cached copy it is a network error.
    let empty = TempDir::new().unwrap();
    let failed = ruri::candle::builder().build_from_hub(
        HubRepo::new(TINY_REPO).hub(hub(&mock, empty.path()).endpoint(dead.url.clone())),
    );
    match failed {
        Err(e @ Error::Network { .. }) => assert!(e.to_string().contains("127.0.0.1"), "{e}"),
        other => panic!("{:?}", other.err()),
    }
}

/// An address nothing listens on, for as long as it lives: a socket bound to a free port
/// without listening, so that a connection is refused and no other test's server can take the
/// port meanwhile. (A port freed at once was once taken by a concurrent test's mock Hub, and
/// the "dead" endpoint answered.)
struct DeadEndpoint {
    _socket: socket2::Socket,
    url: String,
}

fn dead_endpoint() -> DeadEndpoint {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let any_port = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    socket.bind(&any_port.into()).unwrap();
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    DeadEndpoint {
        _socket: socket,
        url: format!("http://127.0.0.1:{port}"),
    }
}

/// A bound port that does not listen refuses connections.
#[test]
fn the_dead_endpoint_refuses_connections() {
    let dead = dead_endpoint();
    let address = dead.url.trim_start_matches("http://");
    let err = std::net::TcpStream::connect(address).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
}

#[test]
fn a_dropped_connection_is_resumed_with_a_range_request() {
    let (mock, cache) = start();
    mock.set_fault("model.safetensors", Fault::DropOnce);
    let embedder = from_hub_candle(&mock, cache.path());
    let local = ruri::candle::builder()
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&embedder), vectors(&local));
    let gets = transfers(&mock, "model.safetensors");
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0], None);
    let size = tiny_bytes("model.safetensors").len();
    let resumed_at: usize = gets[1]
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("{gets:?}"));
    assert!(
        resumed_at > 0 && resumed_at < size,
        "{resumed_at} of {size}"
    );
}

#[test]
fn an_interrupted_download_leaves_nothing_that_loads_and_the_next_run_resumes_it() {
    let (mock, cache) = start();
    mock.set_fault("model.safetensors", Fault::DropAlways);
    let failed = ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(hub(&mock, cache.path()).retries(1)));
    assert!(
        matches!(failed, Err(Error::Network { .. })),
        "{:?}",
        failed.err()
    );
    let main = mock.commit(TINY_REPO, "main");
    let snap = snapshot(cache.path(), TINY_REPO, &main);
    assert!(!snap.join("model.safetensors").exists());
    let sha = sha256_hex(&tiny_bytes("model.safetensors"));
    let blobs = storage(cache.path(), TINY_REPO).join("blobs");
    assert!(!blobs.join(&sha).exists());
    let partial = std::fs::metadata(blobs.join(format!("{sha}.incomplete")))
        .unwrap()
        .len();
    let size = tiny_bytes("model.safetensors").len() as u64;
    assert!(partial > 0 && partial < size, "{partial} of {size}");
    // The folder does not load as a model.
    assert!(ruri::candle::builder().build_from_dir(&snap).is_err());

    mock.clear_faults();
    mock.clear_log();
    let embedder = from_hub_candle(&mock, cache.path());
    assert_eq!(
        transfers(&mock, "model.safetensors"),
        vec![Some(format!("bytes={partial}-"))]
    );
    let local = ruri::candle::builder()
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&embedder), vectors(&local));
    assert!(!blobs.join(format!("{sha}.incomplete")).exists());
}

#[test]
fn corrupt_short_or_unranged_answers_never_enter_the_cache() {
    let (mock, cache) = start();
    let sha = sha256_hex(&tiny_bytes("model.safetensors"));
    let blobs = storage(cache.path(), TINY_REPO).join("blobs");
    let snap = snapshot(cache.path(), TINY_REPO, &mock.commit(TINY_REPO, "main"));

    mock.set_fault("model.safetensors", Fault::Corrupt);
    match ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(hub(&mock, cache.path())))
    {
        Err(Error::Download { reason, .. }) => assert!(reason.contains("SHA-256"), "{reason}"),
        other => panic!("{:?}", other.err()),
    }
    assert!(!blobs.join(&sha).exists());
    assert!(!blobs.join(format!("{sha}.incomplete")).exists());
    assert!(!snap.join("model.safetensors").exists());

    // A body that ends cleanly but short is resumed, and refused once the retries are spent.
    mock.set_fault("model.safetensors", Fault::Truncate);
    let short = ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(hub(&mock, cache.path()).retries(1)));
    assert!(short.is_err());
    assert!(!blobs.join(&sha).exists());
    assert!(!snap.join("model.safetensors").exists());

    // A server that ignores Range answers 200 with everything: the partial file restarts
    // from zero instead of growing by a whole copy.
    mock.set_fault("model.safetensors", Fault::IgnoreRange);
    let bytes = tiny_bytes("model.safetensors");
    std::fs::write(
        blobs.join(format!("{sha}.incomplete")),
        &bytes[..bytes.len() / 3],
    )
    .unwrap();
    from_hub_candle(&mock, cache.path());
    assert_eq!(std::fs::read(blobs.join(&sha)).unwrap(), bytes);
}

/// A body that stalls (half sent, then silence for [`hub_mock::STALL`]) counts as a dropped
/// connection once a read waits past the read timeout: the retry fires and resumes it, long
/// before the stall would have ended.
#[test]
fn a_stalled_body_times_out_and_the_retry_resumes_it() {
    let (mock, cache) = start();
    mock.set_fault("model.safetensors", Fault::StallOnce);
    let started = std::time::Instant::now();
    let embedder = ruri::candle::builder()
        .build_from_hub(
            HubRepo::new(TINY_REPO)
                .hub(hub(&mock, cache.path()).read_timeout(Duration::from_millis(500))),
        )
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < hub_mock::STALL / 2,
        "took {took:?}: the stall ({:?}) was waited out",
        hub_mock::STALL
    );
    let local = ruri::candle::builder()
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&embedder), vectors(&local));
    let gets = transfers(&mock, "model.safetensors");
    assert_eq!(gets.len(), 2, "{gets:?}");
    let half = tiny_bytes("model.safetensors").len() / 2;
    assert_eq!(gets[1], Some(format!("bytes={half}-")), "{gets:?}");
}

/// The size cap: a file announced over it is refused before any byte moves, and a body
/// longer than announced is cut at the announced size and refused; neither enters the cache.
#[test]
fn oversized_files_are_refused_before_and_during_the_transfer() {
    let (mock, cache) = start();
    let bytes = tiny_bytes("model.safetensors");
    let sha = sha256_hex(&bytes);
    let blobs = storage(cache.path(), TINY_REPO).join("blobs");
    let snap = snapshot(cache.path(), TINY_REPO, &mock.commit(TINY_REPO, "main"));

    let capped = hub(&mock, cache.path()).max_file_bytes(bytes.len() as u64 - 1);
    match ruri::candle::builder().build_from_hub(HubRepo::new(TINY_REPO).hub(capped)) {
        Err(Error::Download { reason, .. }) => {
            assert!(
                reason.contains(&format!("announces {} bytes", bytes.len()))
                    && reason.contains("max_file_bytes"),
                "{reason}"
            );
        }
        other => panic!("{:?}", other.err()),
    }
    assert!(transfers(&mock, "model.safetensors").is_empty());
    assert!(!blobs.join(format!("{sha}.incomplete")).exists());
    assert!(!snap.join("model.safetensors").exists());
    // At exactly its size the same file passes the cap.
    let exact = hub(&mock, cache.path()).max_file_bytes(bytes.len() as u64);
    ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(exact))
        .unwrap();
    assert_eq!(std::fs::read(blobs.join(&sha)).unwrap(), bytes);

    // A CDN that sends twice the announced bytes.
    let (mock, cache) = start();
    let blobs = storage(cache.path(), TINY_REPO).join("blobs");
    let snap = snapshot(cache.path(), TINY_REPO, &mock.commit(TINY_REPO, "main"));
    mock.set_fault("model.safetensors", Fault::Oversize);
    match ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_REPO).hub(hub(&mock, cache.path())))
    {
        Err(Error::Download { reason, .. }) => {
            assert!(
                reason.contains(&format!("more than the {} bytes announced", bytes.len())),
                "{reason}"
            );
        }
        other => panic!("{:?}", other.err()),
    }
    assert!(!blobs.join(&sha).exists());
    let partial = std::fs::metadata(blobs.join(format!("{sha}.incomplete"))).map_or(0, |m| m.len());
    assert_eq!(partial, 0, "the oversized body was kept");
    assert!(!snap.join("model.safetensors").exists());
}

/// The token goes to the Hub's origin and never to the CDN's (another origin, reached by the
/// resolve route's redirect), for LFS files fetched by ruri's own transfer and by hf-hub's
/// probes alike.
#[test]
fn the_token_never_reaches_the_cdn() {
    let (mock, cache) = start();
    let hub = hub(&mock, cache.path()).token(GOOD_TOKEN);
    ort_onnx(Precision::Int8)
        .build_from_hub(HubRepo::new(TINY_REPO).hub(hub))
        .unwrap();
    let requests = mock.requests();
    let (cdn, origin): (Vec<_>, Vec<_>) =
        requests.iter().partition(|r| r.path.starts_with("/cdn/"));
    assert!(!cdn.is_empty(), "no request reached the CDN: {requests:?}");
    for request in &cdn {
        assert_eq!(request.authorization, None, "{request:?}");
    }
    // The Hub itself did get the token (else this test would pass with no token at all).
    let bearer = format!("Bearer {GOOD_TOKEN}");
    assert!(
        origin
            .iter()
            .filter(|r| r.path.contains("/resolve/"))
            .all(|r| r.authorization.as_deref() == Some(bearer.as_str())),
        "{origin:?}"
    );
}

/// `.no_exist/<commit>/<path>`, huggingface_hub's record of a file the Hub does not have:
/// written for the folder files a listing lacks, and read offline, where a file it names is
/// the Hub's `RemoteFileNotFound`, not a gap in the cache (`NotCached`).
#[test]
fn no_exist_markers_are_written_and_honoured() {
    // The tiny model without config_sentence_transformers.json (an optional folder file).
    const REPO: &str = "ruri-test/no-st-config";
    let commit = "0123456789abcdef0123456789abcdef01234567".to_owned();
    let mut files = hub_mock::read_tree(&tiny_model_dir());
    assert!(files.remove("config_sentence_transformers.json").is_some());
    let mock = MockHub::start(vec![hub_mock::MockRepo {
        id: REPO.to_owned(),
        commits: vec![hub_mock::MockCommit {
            sha: commit.clone(),
            files,
        }],
        refs: [("main".to_owned(), commit.clone())].into(),
        access: hub_mock::Access::Public,
    }]);
    let cache = TempDir::new().unwrap();
    let markers = storage(cache.path(), REPO).join(".no_exist").join(&commit);
    ort_onnx(Precision::Int8)
        .build_from_hub(HubRepo::new(REPO).hub(hub(&mock, cache.path())))
        .unwrap();
    let marker = markers.join("config_sentence_transformers.json");
    assert_eq!(std::fs::metadata(&marker).map(|m| m.len()).ok(), Some(0));
    assert!(!markers.join("config.json").exists());
    assert!(!markers.join("model.safetensors").exists());

    // Offline, model.safetensors was never downloaded: not cached...
    let offline = || HubRepo::new(REPO).hub(hub(&mock, cache.path()).offline(true));
    match ruri::candle::builder().build_from_hub(offline()) {
        Err(Error::NotCached { .. }) => {}
        other => panic!("expected NotCached, got {:?}", other.err()),
    }
    // ... unless a marker (as Python writes after a 404) says the Hub has none.
    std::fs::write(markers.join("model.safetensors"), b"").unwrap();
    match ruri::candle::builder().build_from_hub(offline()) {
        Err(Error::RemoteFileNotFound { wanted, .. }) => assert_eq!(wanted, "model.safetensors"),
        other => panic!("expected RemoteFileNotFound, got {:?}", other.err()),
    }
}

#[test]
fn hub_errors_are_typed() {
    let (mock, cache) = start();
    let on = |repo: &str| HubRepo::new(repo).hub(hub(&mock, cache.path()));

    match ruri::candle::builder().build_from_hub(on("ruri-test/no-such-model")) {
        Err(e @ Error::RepoNotFound { .. }) => {
            let message = e.to_string();
            assert!(message.contains("ruri-test/no-such-model"), "{message}");
            assert!(message.contains("no token"), "{message}");
        }
        other => panic!("{:?}", other.err()),
    }
    match ruri::candle::builder().build_from_hub(on(TINY_REPO).revision("no-such-branch")) {
        Err(Error::RevisionNotFound { repo, revision }) => {
            assert_eq!(
                (repo.as_str(), revision.as_str()),
                (TINY_REPO, "no-such-branch")
            );
        }
        other => panic!("{:?}", other.err()),
    }
    match ort_onnx(Precision::Fp32)
        .onnx_file("onnx/model_o4.onnx")
        .build_from_hub(on(TINY_REPO))
    {
        Err(e @ Error::RemoteFileNotFound { .. }) => {
            let message = e.to_string();
            assert!(message.contains("onnx/model_o4.onnx"), "{message}");
            assert!(message.contains("tokenizer.json"), "{message}");
        }
        other => panic!("{:?}", other.err()),
    }

    // Gated: no token → 401; a token without access → 403; neither is ever printed.
    match ruri::candle::builder().build_from_hub(on(GATED_REPO)) {
        Err(e @ Error::AccessDenied { .. }) => {
            assert!(matches!(
                e,
                Error::AccessDenied {
                    status: 401,
                    gated: true,
                    token: TokenSource::None,
                    ..
                }
            ));
            assert!(e.to_string().contains("gated"), "{e}");
        }
        other => panic!("{:?}", other.err()),
    }
    let wrong = "hf_wrong_token_1234";
    let denied = ruri::candle::builder()
        .build_from_hub(HubRepo::new(GATED_REPO).hub(hub(&mock, cache.path()).token(wrong)));
    match denied {
        Err(e @ Error::AccessDenied { .. }) => {
            assert!(matches!(
                e,
                Error::AccessDenied {
                    status: 403,
                    gated: true,
                    token: TokenSource::Explicit,
                    ..
                }
            ));
            assert!(!format!("{e} {e:?}").contains(wrong), "{e:?}");
        }
        other => panic!("{:?}", other.err()),
    }
    let with_access = HubRepo::new(GATED_REPO).hub(hub(&mock, cache.path()).token(GOOD_TOKEN));
    ruri::candle::builder().build_from_hub(with_access).unwrap();

    // Private: invisible without the token.
    let hidden = ruri::candle::builder().build_from_hub(on(PRIVATE_REPO));
    assert!(
        matches!(hidden, Err(Error::RepoNotFound { .. })),
        "{:?}",
        hidden.err()
    );
    let with_access = HubRepo::new(PRIVATE_REPO).hub(hub(&mock, cache.path()).token(GOOD_TOKEN));
    ruri::candle::builder().build_from_hub(with_access).unwrap();

    // Not an id, and not a folder either.
    let bad = ruri::candle::builder().build_from_hub(on("not an id"));
    assert!(
        matches!(bad, Err(Error::InvalidOption { .. })),
        "{:?}",
        bad.err()
    );
}

#[test]
fn an_existing_folder_wins_over_an_id() {
    let root = repo_root();
    // `testdata/tiny` is also a valid id spelling; the folder (relative to the package root,
    // cargo test's working directory) is taken.
    let tiny = root.join("testdata/tiny");
    assert!(matches!(
        ModelSource::parse("testdata/tiny", None).unwrap(),
        ModelSource::Dir(dir) if dir == Path::new("testdata/tiny")
    ));
    assert!(matches!(
        ModelSource::parse(&tiny, Some("main")),
        Err(Error::InvalidOption {
            name: "revision",
            ..
        })
    ));
    match ModelSource::parse("org/name", Some("v1")).unwrap() {
        ModelSource::Hub(repo) => {
            assert_eq!((repo.id(), repo.revision_name()), ("org/name", "v1"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ModelSource::parse("./no/such/folder", None),
        Err(Error::MissingFile { .. })
    ));
    // `build` takes either.
    let (mock, cache) = start();
    let from_dir = ort_onnx(Precision::Fp32).build(tiny.as_path()).unwrap();
    let from_id = ort_onnx(Precision::Fp32)
        .build(HubRepo::new(TINY_REPO).hub(hub(&mock, cache.path())))
        .unwrap();
    assert_eq!(vectors(&from_dir), vectors(&from_id));
}

#[test]
fn concurrent_downloads_share_one_transfer_and_both_succeed() {
    let (mock, cache) = start();
    // Slow bodies, so that the two downloads overlap.
    mock.throttle(Some(Duration::from_millis(15)));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let hub = hub(&mock, cache.path());
            std::thread::spawn(move || {
                ruri::candle::builder()
                    .build_from_hub(HubRepo::new(TINY_REPO).hub(hub))
                    .map(|e| vectors(&e))
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let local = vectors(
        &ruri::candle::builder()
            .build_from_dir(tiny_model_dir())
            .unwrap(),
    );
    for result in results {
        assert_eq!(result.unwrap(), local);
    }
    // The lock made the second wait for the first's blob instead of fetching it again.
    assert_eq!(transfers(&mock, "model.safetensors").len(), 1);
}

/// Run as a child process by the next test: loads `TINY_REPO` with the environment's Hub
/// configuration (HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN_PATH), as a user's process would.
#[test]
#[ignore = "a child of concurrent_processes_and_the_environment; run by it"]
fn child_process_loads_from_the_environment() {
    let hub = Hub::from_env();
    if let Ok(expected) = std::env::var("RURI_TEST_EXPECT_TOKEN_FILE") {
        assert_eq!(
            hub.token_source(),
            &TokenSource::File(PathBuf::from(expected))
        );
    }
    let repo = std::env::var("RURI_TEST_REPO").unwrap();
    match ruri::candle::builder().build_from_hub(HubRepo::new(repo).hub(hub.progress(false))) {
        Ok(embedder) => println!("CHILD-OK {}", embedder.dim()),
        Err(e) => println!("CHILD-ERR {e}"),
    }
}

fn child(mock: &MockHub, cache: &Path, repo: &str, token_file: Option<&Path>) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "child_process_loads_from_the_environment",
            "--ignored",
            "--nocapture",
        ])
        .env("HF_ENDPOINT", mock.endpoint())
        .env("HF_HUB_CACHE", cache)
        .env("HF_HOME", cache.join("home"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env("RURI_TEST_REPO", repo);
    match token_file {
        Some(path) => {
            command
                .env("HF_TOKEN_PATH", path)
                .env("RURI_TEST_EXPECT_TOKEN_FILE", path);
        }
        None => {
            command.env_remove("HF_TOKEN_PATH");
        }
    }
    command
}

#[test]
fn concurrent_processes_and_the_environment() {
    let (mock, cache) = start();
    mock.throttle(Some(Duration::from_millis(15)));
    let children: Vec<_> = (0..2)
        .map(|_| {
            child(&mock, cache.path(), TINY_REPO, None)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("CHILD-OK 64"), "{stdout}");
    }
    assert_eq!(transfers(&mock, "model.safetensors").len(), 1);
    mock.throttle(None);

    // The token file: a wrong token is named by its path, and never printed.
    let token_file = cache.path().join("token");
    std::fs::write(&token_file, "hf_wrong_token_from_file\n").unwrap();
    let output = child(&mock, cache.path(), GATED_REPO, Some(&token_file))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("CHILD-ERR access to"), "{stdout}");
    assert!(
        stdout.contains(&token_file.display().to_string()),
        "{stdout}"
    );
    assert!(!stdout.contains("hf_wrong_token_from_file"), "{stdout}");
    std::fs::write(&token_file, GOOD_TOKEN).unwrap();
    let output = child(&mock, cache.path(), GATED_REPO, Some(&token_file))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("CHILD-OK 64"), "{stdout}");
}

fn run_python(python: &Path, script: &str, envs: &[(&str, &str)]) -> String {
    let mut command = Command::new(python);
    command
        .args(["-c", script])
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_XET", "1");
    for (k, v) in envs {
        command.env(k, v);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "python failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn python_huggingface_hub_reads_what_ruri_cached_and_the_reverse() {
    let Some(python) = ruri_testkit::hub_python("Python's huggingface_hub check") else {
        return;
    };
    let (mock, cache) = start();
    ruri::candle::builder()
        .build_from_hub(
            HubRepo::new(TINY_REPO)
                .revision("v1")
                .hub(hub(&mock, cache.path())),
        )
        .unwrap();
    ort_onnx(Precision::Int8)
        .build_from_hub(HubRepo::new(TINY_REPO).hub(hub(&mock, cache.path())))
        .unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    // Offline and with a dead endpoint: Python can only use the cache.
    let script = format!(
        r#"
import hashlib
from huggingface_hub import hf_hub_download, snapshot_download
cache, repo = {cache_dir:?}, {TINY_REPO:?}
def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()
for rev in ("main", "v1"):
    print("snapshot", rev, snapshot_download(repo, revision=rev, cache_dir=cache, local_files_only=True))
print("file onnx/model_quantized.onnx", sha(hf_hub_download(repo, "onnx/model_quantized.onnx", cache_dir=cache, local_files_only=True)))
print("file v1 model.safetensors", sha(hf_hub_download(repo, "model.safetensors", revision="v1", cache_dir=cache, local_files_only=True)))
print("file v1 sentence_bert_config.json", open(hf_hub_download(repo, "sentence_bert_config.json", revision="v1", cache_dir=cache, local_files_only=True)).read().replace("\n", " "))
"#
    );
    let dead = dead_endpoint();
    let stdout = run_python(
        &python,
        &script,
        &[("HF_HUB_OFFLINE", "1"), ("HF_ENDPOINT", &dead.url)],
    );
    for (rev, commit) in [
        ("main", mock.commit(TINY_REPO, "main")),
        ("v1", mock.commit(TINY_REPO, "v1")),
    ] {
        let expected = format!(
            "snapshot {rev} {}",
            snapshot(cache.path(), TINY_REPO, &commit).display()
        );
        assert!(stdout.contains(&expected), "{expected} not in\n{stdout}");
    }
    let expected = format!(
        "file onnx/model_quantized.onnx {}",
        sha256_hex(&tiny_bytes("onnx/model_quantized.onnx"))
    );
    assert!(stdout.contains(&expected), "{expected} not in\n{stdout}");
    let expected = format!(
        "file v1 model.safetensors {}",
        sha256_hex(&tiny_bytes("model.safetensors"))
    );
    assert!(stdout.contains(&expected), "{expected} not in\n{stdout}");
    assert!(
        stdout.contains(&format!("\"max_seq_length\": {V1_MAX_SEQ_LENGTH}")),
        "{stdout}"
    );

    // The reverse: Python downloads from the mock, ruri loads it offline.
    let python_cache = TempDir::new().unwrap();
    let script = format!(
        r#"
from huggingface_hub import snapshot_download
print("snapshot", snapshot_download({TINY_MIRROR_REPO:?}, cache_dir={:?}, allow_patterns=["*.json", "model.safetensors", "1_Pooling/*"]))
"#,
        python_cache.path().to_str().unwrap()
    );
    let stdout = run_python(&python, &script, &[("HF_ENDPOINT", &mock.endpoint())]);
    assert!(stdout.contains("snapshot "), "{stdout}");
    let offline = hub(&mock, python_cache.path()).offline(true);
    let embedder = ruri::candle::builder()
        .build_from_hub(HubRepo::new(TINY_MIRROR_REPO).hub(offline))
        .unwrap();
    let local = ruri::candle::builder()
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&embedder), vectors(&local));
}
