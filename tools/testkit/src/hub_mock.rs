//! A loopback stand-in for the Hugging Face Hub's download routes, for tests (the Hub itself
//! is unreachable from CI), started per test on an ephemeral port: [`MockHub::start`].
//!
//! It answers what `huggingface_hub` (2.x, `file_download.py` / `hf_api.py`) and hf-hub
//! (0.5, `api/sync.rs`) send, the way the real Hub does:
//!
//! * `GET /api/models/{repo}` and `GET /api/models/{repo}/revision/{revision}` (revision
//!   percent-encoded, `refs%2Fpr%2F1`): the model's JSON with `sha` (the commit) and `siblings`
//!   (`[{"rfilename": …}]`), `private` and `gated`.
//! * `GET /api/models/{repo}/tree/{revision}[/{path}]?recursive=…`: the file and folder
//!   entries (`oid`, `size`, `lfs`) that `huggingface_hub`'s `snapshot_download` lists with.
//! * `HEAD` / `GET /{repo}/resolve/{revision}/{path}`: a small (git) file answers 200 with
//!   `ETag`, `X-Repo-Commit`, `Content-Length` and `Accept-Ranges`; a large (LFS) file —
//!   `*.safetensors`, `*.onnx`, ONNX external data — answers 302 to an absolute CDN address
//!   with `X-Linked-Etag` (its SHA-256, quoted), `X-Linked-Size` and `X-Repo-Commit`.
//! * `GET` / `HEAD /cdn/{sha256}`, on a second port (the CDN is another origin): the bytes; `Range: bytes=a-` or `a-b` answers 206 with
//!   `Content-Range`, everywhere ranges make sense.
//! * Errors carry the Hub's `X-Error-Code`: `RepoNotFound` (401 without a token, 404 with
//!   one, as the Hub hides private repositories), `RevisionNotFound` (404), `EntryNotFound`
//!   (404), `GatedRepo` (401 without a token, 403 with one that has no access).
//!
//! Faults ([`Fault`]) make the CDN drop a connection mid-body, stall in the middle of one,
//! send short, corrupt or oversized bodies, or ignore `Range`; [`MockHub::throttle`] slows bodies down so downloads overlap. Every
//! request is logged ([`MockHub::requests`]).
//!
//! [`tiny_repos`] serves `testdata/tiny` under two ids at two commits. Run it standalone with
//! `cargo run -p ruri-testkit --bin hub-mock`.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// Token that opens [`GATED_REPO`] and [`PRIVATE_REPO`].
pub const GOOD_TOKEN: &str = "hf_mock_token_with_access";
/// The tiny test model at two commits (`main` and the tag `v1`).
pub const TINY_REPO: &str = "ruri-test/tiny";
/// The same files under a second id.
pub const TINY_MIRROR_REPO: &str = "ruri-test/tiny-mirror";
/// The tiny model, gated: listed to anyone, files only with [`GOOD_TOKEN`].
pub const GATED_REPO: &str = "ruri-test/tiny-gated";
/// The tiny model, private: invisible without [`GOOD_TOKEN`].
pub const PRIVATE_REPO: &str = "ruri-test/tiny-private";
/// `max_seq_length` of [`TINY_REPO`]'s older commit (tag `v1`), which differs from the
/// current one only there (512 in `testdata/tiny`).
pub const V1_MAX_SEQ_LENGTH: usize = 16;

/// Repository path → bytes.
pub type Files = BTreeMap<String, Arc<Vec<u8>>>;

/// One commit of a repository: its id and files.
#[derive(Debug, Clone)]
pub struct MockCommit {
    /// 40 hex digits.
    pub sha: String,
    /// Repository path → bytes.
    pub files: BTreeMap<String, Arc<Vec<u8>>>,
}

/// Who may see a repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone.
    Public,
    /// Listed to anyone; files only with [`GOOD_TOKEN`].
    Gated,
    /// Nothing without [`GOOD_TOKEN`].
    Private,
}

/// A repository: commits, branches and tags.
#[derive(Debug, Clone)]
pub struct MockRepo {
    /// `org/name`.
    pub id: String,
    /// Its commits.
    pub commits: Vec<MockCommit>,
    /// Branch or tag → commit id.
    pub refs: BTreeMap<String, String>,
    /// Who may see it.
    pub access: Access,
}

/// What the CDN does wrong with one file (by repository path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next body stops halfway and the connection closes (then the fault is gone).
    DropOnce,
    /// Every body stops halfway.
    DropAlways,
    /// The body is whole but its last byte is changed.
    Corrupt,
    /// A complete-looking response with half the bytes (`Content-Length` of the half).
    Truncate,
    /// `Range` is ignored: 200 and the whole file.
    IgnoreRange,
    /// The next body stops halfway and the connection stays open, silent, for
    /// [`STALL`] (then the fault is gone): a client without a read timeout hangs that long.
    StallOnce,
    /// The body is the file followed by as many bytes again (`Content-Length` of the
    /// whole): more than the size the Hub announced.
    Oversize,
}

/// How long [`Fault::StallOnce`] holds a connection silent.
pub const STALL: Duration = Duration::from_secs(20);

/// One request as the mock saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    /// `GET`, `HEAD`.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The `Range` header.
    pub range: Option<String>,
    /// The `Authorization` header.
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    repos: Vec<MockRepo>,
    /// SHA-256 → (repository path, bytes).
    blobs: HashMap<String, (String, Arc<Vec<u8>>)>,
    faults: HashMap<String, Fault>,
    throttle: Option<Duration>,
    log: Vec<Logged>,
}

/// A running mock Hub; it stops with the process (its threads are detached).
pub struct MockHub {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

/// Deterministic fake ids: the SHA-256 of `seed`, cut to `len` hex digits.
fn fake_id(seed: &str, len: usize) -> String {
    hex(&Sha256::digest(seed.as_bytes()))[..len].to_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of `bytes`, hex: an LFS file's ETag on the Hub.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Every file of `dir`, by `/`-separated relative path.
pub fn read_tree(dir: &Path) -> BTreeMap<String, Arc<Vec<u8>>> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, Arc<Vec<u8>>>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let path = entry.path();
            if path.is_dir() {
                walk(&path, &rel, out);
            } else {
                let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
                out.insert(rel, Arc::new(bytes));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

/// `testdata/tiny` as four repositories: [`TINY_REPO`] (whose tag `v1` is an older commit with
/// `max_seq_length` [`V1_MAX_SEQ_LENGTH`] and no int8 file; `main` is `testdata/tiny`
/// itself), [`TINY_MIRROR_REPO`] (one commit), [`GATED_REPO`] and [`PRIVATE_REPO`].
pub fn tiny_repos() -> Vec<MockRepo> {
    let current = read_tree(&crate::tiny_model_dir());
    let mut old = current.clone();
    old.insert(
        "sentence_bert_config.json".into(),
        Arc::new(
            format!(
                "{{\n  \"max_seq_length\": {V1_MAX_SEQ_LENGTH},\n  \"do_lower_case\": false\n}}\n"
            )
            .into_bytes(),
        ),
    );
    old.remove("onnx/model_quantized.onnx");
    let repo = |id: &str, commits: Vec<(&str, Files)>, access| {
        let commits: Vec<MockCommit> = commits
            .into_iter()
            .map(|(name, files)| MockCommit {
                sha: fake_id(&format!("{id}@{name}"), 40),
                files,
            })
            .collect();
        let mut refs = BTreeMap::new();
        refs.insert(
            "main".to_owned(),
            commits.last().expect("a commit").sha.clone(),
        );
        if commits.len() > 1 {
            refs.insert("v1".to_owned(), commits[0].sha.clone());
        }
        MockRepo {
            id: id.to_owned(),
            commits,
            refs,
            access,
        }
    };
    vec![
        repo(
            TINY_REPO,
            vec![("v1", old), ("v2", current.clone())],
            Access::Public,
        ),
        repo(
            TINY_MIRROR_REPO,
            vec![("v2", current.clone())],
            Access::Public,
        ),
        repo(GATED_REPO, vec![("v2", current.clone())], Access::Gated),
        repo(PRIVATE_REPO, vec![("v2", current)], Access::Private),
    ]
}

/// Whether the Hub stores `path` with LFS (and so redirects it to the CDN).
fn is_lfs(path: &str) -> bool {
    [
        ".safetensors",
        ".onnx",
        ".onnx_data",
        ".data",
        ".bin",
        ".model",
    ]
    .iter()
    .any(|ext| path.ends_with(ext))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| u8::from_str_radix(&s[i + 1..i + 3], 16).ok())
            .flatten();
        if let Some(b) = decoded {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Request {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Stop after this many body bytes and close (a dropped connection).
    cut: Option<usize>,
    /// Before closing after `cut`, stay silent for [`STALL`].
    stall: bool,
}

impl Response {
    fn new(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            cut: None,
            stall: false,
        }
    }
    fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }
    fn json(self, value: &serde_json::Value) -> Self {
        let mut r = self.header("Content-Type", "application/json");
        r.body = serde_json::to_vec(value).expect("JSON");
        r
    }
    fn error(status: u16, code: &str, message: &str) -> Self {
        Response::new(status)
            .header("X-Error-Code", code)
            .header("X-Error-Message", message)
            .json(&serde_json::json!({ "error": message }))
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Error",
    }
}

/// `bytes=a-` or `bytes=a-b` against `len`: the half-open byte range, or `None` if
/// unsatisfiable.
fn parse_range(range: &str, len: usize) -> Option<(usize, usize)> {
    let spec = range.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: usize = a.trim().parse().ok()?;
    let end = if b.trim().is_empty() {
        len
    } else {
        (b.trim().parse::<usize>().ok()? + 1).min(len)
    };
    (start < len && start < end).then_some((start, end))
}

impl MockHub {
    /// Serves `repos` on `127.0.0.1` at an ephemeral port.
    pub fn start(repos: Vec<MockRepo>) -> Self {
        Self::start_on(repos, 0)
    }

    /// Serves `repos` on `127.0.0.1:port` (0: any free port).
    pub fn start_on(repos: Vec<MockRepo>, port: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind a loopback port");
        let addr = listener.local_addr().expect("the bound address");
        // The CDN is another origin, as on the real Hub: clients stop following redirects
        // there (huggingface_hub reads the file's metadata from the redirect itself).
        let cdn = TcpListener::bind(("127.0.0.1", 0)).expect("bind a loopback port");
        let cdn_addr = cdn.local_addr().expect("the bound address");
        let mut state = State::default();
        for repo in &repos {
            for commit in &repo.commits {
                for (path, bytes) in &commit.files {
                    state
                        .blobs
                        .insert(sha256_hex(bytes), (path.clone(), bytes.clone()));
                }
            }
        }
        state.repos = repos;
        let state = Arc::new(Mutex::new(state));
        for listener in [listener, cdn] {
            let shared = state.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let state = shared.clone();
                    std::thread::spawn(move || {
                        let _ = serve(stream, cdn_addr, &state);
                    });
                }
            });
        }
        Self { addr, state }
    }

    /// `http://127.0.0.1:port`, for `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The commit `reference` (branch or tag) of `repo` names.
    pub fn commit(&self, repo: &str, reference: &str) -> String {
        let state = self.state.lock().expect("mock state");
        let repo = state
            .repos
            .iter()
            .find(|r| r.id == repo)
            .expect("a served repository");
        repo.refs[reference].clone()
    }

    /// Makes the CDN misbehave on the file at repository path `path` (any repository).
    pub fn set_fault(&self, path: &str, fault: Fault) {
        self.state
            .lock()
            .expect("mock state")
            .faults
            .insert(path.to_owned(), fault);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.state.lock().expect("mock state").faults.clear();
    }

    /// Sleeps this long after each 16 KiB of a CDN body.
    pub fn throttle(&self, pause: Option<Duration>) {
        self.state.lock().expect("mock state").throttle = pause;
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Logged> {
        self.state.lock().expect("mock state").log.clone()
    }

    /// The `GET`s the CDN answered for the file at repository path `path`, with their `Range`
    /// headers.
    pub fn cdn_gets(&self, path: &str) -> Vec<Option<String>> {
        let state = self.state.lock().expect("mock state");
        state
            .log
            .iter()
            .filter(|r| r.method == "GET")
            .filter_map(|r| {
                let sha = r.path.strip_prefix("/cdn/")?.split('?').next()?;
                let (p, _) = state.blobs.get(sha)?;
                (p == path).then(|| r.range.clone())
            })
            .collect()
    }

    /// Forgets the logged requests.
    pub fn clear_log(&self) {
        self.state.lock().expect("mock state").log.clear();
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 {
            break;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    Ok(Some(Request {
        method,
        path,
        headers,
    }))
}

fn serve(stream: TcpStream, cdn: SocketAddr, state: &Mutex<State>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut stream = stream;
    // One request per connection (`Connection: close`): clients reconnect.
    let Some(request) = read_request(&mut reader)? else {
        return Ok(());
    };
    let (response, throttle) = {
        let mut state = state.lock().expect("mock state");
        state.log.push(Logged {
            method: request.method.clone(),
            path: request.path.clone(),
            range: request.headers.get("range").cloned(),
            authorization: request.headers.get("authorization").cloned(),
        });
        (route(&request, cdn, &mut state), state.throttle)
    };
    let head = request.method == "HEAD";
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        response.status,
        reason(response.status)
    );
    for (k, v) in &response.headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    let has_length = response
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    if !has_length {
        out.push_str(&format!("Content-Length: {}\r\n", response.body.len()));
    }
    out.push_str("Connection: close\r\n\r\n");
    stream.write_all(out.as_bytes())?;
    if head {
        return stream.flush();
    }
    let body = match response.cut {
        Some(cut) => &response.body[..cut],
        None => &response.body[..],
    };
    for chunk in body.chunks(16 * 1024) {
        stream.write_all(chunk)?;
        if let Some(pause) = throttle {
            stream.flush()?;
            std::thread::sleep(pause);
        }
    }
    stream.flush()?;
    if response.stall {
        std::thread::sleep(STALL);
    }
    if response.cut.is_some() {
        // An abrupt close, as a dropped connection.
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }
    Ok(())
}

/// `Bearer X` → `X`.
fn token(request: &Request) -> Option<&str> {
    request
        .headers
        .get("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
}

fn route(request: &Request, cdn_addr: SocketAddr, state: &mut State) -> Response {
    if request.method != "GET" && request.method != "HEAD" {
        return Response::new(405);
    }
    let path = request.path.split('?').next().unwrap_or_default();
    if let Some(sha) = path.strip_prefix("/cdn/") {
        return cdn(request, sha, state);
    }
    let token = token(request);
    if let Some(rest) = path.strip_prefix("/api/models/") {
        if let Some((repo_id, rest)) = rest.split_once("/tree/") {
            return tree(request, state, repo_id, rest, token);
        }
        let (repo_id, revision) = match rest.split_once("/revision/") {
            Some((repo, revision)) => (repo.to_owned(), percent_decode(revision)),
            None => (rest.trim_end_matches('/').to_owned(), "main".to_owned()),
        };
        let repo = match find_repo(state, &repo_id, token, false) {
            Ok(repo) => repo,
            Err(response) => return response,
        };
        let Some(commit) = resolve(repo, &revision) else {
            return Response::error(
                404,
                "RevisionNotFound",
                &format!("Invalid rev id: {revision}"),
            );
        };
        let siblings: Vec<_> = commit
            .files
            .keys()
            .map(|f| serde_json::json!({ "rfilename": f }))
            .collect();
        let gated = match repo.access {
            Access::Gated => serde_json::json!("manual"),
            _ => serde_json::json!(false),
        };
        return Response::new(200).json(&serde_json::json!({
            "_id": fake_id(&repo.id, 24),
            "id": repo.id,
            "modelId": repo.id,
            "author": repo.id.split('/').next(),
            "sha": commit.sha,
            "lastModified": "2025-01-01T00:00:00.000Z",
            "private": repo.access == Access::Private,
            "gated": gated,
            "disabled": false,
            "downloads": 0,
            "likes": 0,
            "library_name": "sentence-transformers",
            "tags": ["sentence-transformers", "ja"],
            "siblings": siblings,
        }));
    }
    // /{org}/{name}/resolve/{revision}/{path...}
    let segments: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if segments.len() == 5 && segments[2] == "resolve" {
        let repo_id = format!("{}/{}", segments[0], segments[1]);
        let revision = percent_decode(segments[3]);
        let file = percent_decode(segments[4]);
        let repo = match find_repo(state, &repo_id, token, true) {
            Ok(repo) => repo,
            Err(response) => return response,
        };
        let Some(commit) = resolve(repo, &revision) else {
            return Response::error(
                404,
                "RevisionNotFound",
                &format!("Invalid rev id: {revision}"),
            );
        };
        let Some(bytes) = commit.files.get(&file) else {
            return Response::error(404, "EntryNotFound", &format!("{file} does not exist"))
                .header("X-Repo-Commit", commit.sha.clone());
        };
        let sha = sha256_hex(bytes);
        if is_lfs(&file) {
            // The real Hub stores these with LFS: the resolve route redirects to its CDN.
            return Response::new(302)
                .header(
                    "Location",
                    format!("http://{cdn_addr}/cdn/{sha}?filename={file}"),
                )
                .header("X-Repo-Commit", commit.sha.clone())
                .header("X-Linked-Etag", format!("\"{sha}\""))
                .header("X-Linked-Size", bytes.len().to_string())
                // The ETag of the LFS pointer file, as the Hub sends beside the linked one.
                .header(
                    "ETag",
                    format!("\"{}\"", fake_id(&format!("pointer {sha}"), 40)),
                )
                .header("Content-Type", "text/plain; charset=utf-8");
        }
        let bytes = bytes.clone();
        let etag = git_etag(&sha);
        return ranged(request, &bytes, None)
            .header("ETag", format!("\"{etag}\""))
            .header("X-Repo-Commit", commit.sha.clone());
    }
    Response::error(404, "", "Not Found")
}

/// The (fake) git blob id of a small file: its `ETag` and its `oid` in tree listings.
fn git_etag(sha256: &str) -> String {
    fake_id(&format!("git blob {sha256}"), 40)
}

/// `GET /api/models/{repo}/tree/{revision}[/{path}]?recursive=…`: `huggingface_hub`'s
/// `list_repo_tree` (what its `snapshot_download` lists with), in one page (no `Link`
/// header).
fn tree(
    request: &Request,
    state: &State,
    repo_id: &str,
    rest: &str,
    token: Option<&str>,
) -> Response {
    let repo = match find_repo(state, repo_id, token, false) {
        Ok(repo) => repo,
        Err(response) => return response,
    };
    let (revision, prefix) = match rest.split_once('/') {
        Some((revision, prefix)) => (percent_decode(revision), percent_decode(prefix)),
        None => (percent_decode(rest), String::new()),
    };
    let Some(commit) = resolve(repo, &revision) else {
        return Response::error(
            404,
            "RevisionNotFound",
            &format!("Invalid rev id: {revision}"),
        );
    };
    let recursive =
        request.path.contains("recursive=True") || request.path.contains("recursive=true");
    let base = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    let mut entries = Vec::new();
    let mut folders = std::collections::BTreeSet::new();
    for (path, bytes) in &commit.files {
        let Some(inner) = path.strip_prefix(&base) else {
            continue;
        };
        let parts: Vec<&str> = inner.split('/').collect();
        for depth in 1..parts.len() {
            if recursive || depth == 1 {
                folders.insert(format!("{base}{}", parts[..depth].join("/")));
            }
        }
        if !recursive && parts.len() > 1 {
            continue;
        }
        let sha = sha256_hex(bytes);
        let mut entry = serde_json::json!({
            "type": "file",
            "oid": git_etag(&sha),
            "size": bytes.len(),
            "path": path,
        });
        if is_lfs(path) {
            entry["lfs"] =
                serde_json::json!({ "oid": sha, "size": bytes.len(), "pointerSize": 134 });
        }
        entries.push(entry);
    }
    for folder in folders {
        entries.push(serde_json::json!({
            "type": "directory",
            "oid": fake_id(&format!("tree {folder}"), 40),
            "size": 0,
            "path": folder,
        }));
    }
    Response::new(200).json(&serde_json::Value::Array(entries))
}

/// The repository, or the Hub's answer for one the caller may not see.
fn find_repo<'s>(
    state: &'s State,
    id: &str,
    token: Option<&str>,
    files: bool,
) -> Result<&'s MockRepo, Response> {
    let not_found = || {
        // The Hub answers 401 without credentials, 404 with them, for both.
        let status = if token.is_some() { 404 } else { 401 };
        Response::error(status, "RepoNotFound", "Repository Not Found")
    };
    let repo = state
        .repos
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(not_found)?;
    let authorized = token == Some(GOOD_TOKEN);
    match repo.access {
        Access::Private if !authorized => Err(not_found()),
        Access::Gated if files && !authorized => {
            let status = if token.is_some() { 403 } else { 401 };
            Err(Response::error(
                status,
                "GatedRepo",
                "Access to model is restricted and you are not in the authorized list.",
            ))
        }
        _ => Ok(repo),
    }
}

fn resolve<'r>(repo: &'r MockRepo, revision: &str) -> Option<&'r MockCommit> {
    let sha = repo
        .refs
        .get(revision)
        .map(String::as_str)
        .unwrap_or(revision);
    repo.commits.iter().find(|c| c.sha == sha)
}

/// 200 or 206 for `bytes`, honouring `Range` unless the fault says otherwise.
fn ranged(request: &Request, bytes: &[u8], fault: Option<Fault>) -> Response {
    let len = bytes.len();
    let range = request
        .headers
        .get("range")
        .filter(|_| fault != Some(Fault::IgnoreRange));
    let (mut response, start, end) = match range {
        Some(range) => match parse_range(range, len) {
            Some((start, end)) => (
                Response::new(206)
                    .header("Content-Range", format!("bytes {start}-{}/{len}", end - 1)),
                start,
                end,
            ),
            None => {
                return Response::new(416).header("Content-Range", format!("bytes */{len}"));
            }
        },
        None => (Response::new(200), 0, len),
    };
    let mut body = bytes[start..end].to_vec();
    match fault {
        Some(Fault::Corrupt) if end == len => {
            if let Some(last) = body.last_mut() {
                *last ^= 0xff;
            }
        }
        Some(Fault::Truncate) => body.truncate(body.len() / 2),
        Some(Fault::DropOnce | Fault::DropAlways | Fault::StallOnce) => {
            // Announce everything, send half (then, for a stall, wait before closing).
            response.cut = Some(body.len() / 2);
            response.stall = fault == Some(Fault::StallOnce);
            response = response.header("Content-Length", body.len().to_string());
        }
        Some(Fault::Oversize) => {
            let again = body.clone();
            body.extend_from_slice(&again);
        }
        _ => {}
    }
    response.body = body;
    response
        .header("Accept-Ranges", "bytes")
        .header("Content-Type", "application/octet-stream")
}

fn cdn(request: &Request, sha: &str, state: &mut State) -> Response {
    let Some((path, bytes)) = state.blobs.get(sha).cloned() else {
        return Response::new(404);
    };
    let fault = if request.method == "GET" {
        state.faults.get(&path).copied()
    } else {
        None
    };
    // hf-hub probes with `Range: bytes=0-0`; faults hit real transfers only.
    let fault =
        fault.filter(|_| request.headers.get("range").map(String::as_str) != Some("bytes=0-0"));
    if matches!(fault, Some(Fault::DropOnce | Fault::StallOnce)) {
        state.faults.remove(&path);
    }
    ranged(request, &bytes, fault).header("ETag", format!("\"{sha}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-0", 10), Some((0, 1)));
        assert_eq!(parse_range("bytes=4-", 10), Some((4, 10)));
        assert_eq!(parse_range("bytes=4-100", 10), Some((4, 10)));
        assert_eq!(parse_range("bytes=10-", 10), None);
        assert_eq!(percent_decode("refs%2Fpr%2F1"), "refs/pr/1");
        assert_eq!(percent_decode("a%"), "a%");
    }
}
