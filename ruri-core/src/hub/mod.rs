//! Models by id from the Hugging Face Hub, through its standard cache (the `hub` feature).
//!
//! [`HubRepo::snapshot`] turns a model id (`cl-nagoya/ruri-v3-30m`), a revision (branch, tag
//! or commit; default `main`) and a choice of files into a local folder that
//! [`ModelDir::open`](crate::ModelDir::open) reads: the snapshot folder of that commit in the
//! cache. The backends' `build_from_hub` and `build` call it with the files they read (the
//! configs, the tokenizer, and `model.safetensors` or one ONNX file), so nothing else is
//! downloaded.
//!
//! # The cache is Python's
//!
//! The layout is `huggingface_hub`'s, so each side uses what the other downloaded:
//! `$HF_HUB_CACHE/models--org--name/` holds `blobs/<etag>` (the files' bytes, named by their
//! ETag: the SHA-256 for LFS files), `snapshots/<commit>/<path>` (relative symbolic links to
//! the blobs) and `refs/<branch or tag>` (the commit it pointed at when last resolved).
//! Downloads in progress are `blobs/<etag>.incomplete` under the lock file
//! `.locks/models--org--name/<etag>.lock`, the same names and the same `flock` as Python, so a
//! download interrupted on either side is resumed by the other and two processes never write
//! the same blob at once.
//!
//! # Environment
//!
//! [`Hub::from_env`] reads what `huggingface_hub` reads: `HF_HOME` (default
//! `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`), `HF_HUB_CACHE` (default
//! `$HF_HOME/hub`), `HF_ENDPOINT` (default `https://huggingface.co`), `HF_TOKEN`, else the
//! token file (`HF_TOKEN_PATH`, default `$HF_HOME/token`, written by `hf auth login`), and
//! `HF_HUB_OFFLINE=1` (use the cache only).
//!
//! # Never a corrupt model
//!
//! A file enters `blobs/` only by a rename of its `.incomplete` file once its size equals the
//! announced size and, for LFS files, its SHA-256 equals the ETag; the snapshot link is made
//! after that. A dropped connection is resumed with a `Range` request (a server that ignores
//! the range restarts the file from zero rather than appending to it), up to
//! [`Hub::retries`] times, and a later run resumes what an interrupted process left.
//!
//! # Online and offline
//!
//! Online, one listing request (`/api/models/{id}/revision/{revision}`) resolves the revision
//! to a commit and lists its files; only the files missing from that commit's snapshot are
//! fetched. When the Hub cannot be reached (a network failure, not an HTTP error), or with
//! `HF_HUB_OFFLINE=1`, the cache answers: `refs/<revision>` (or the commit itself) names the
//! snapshot, and the files the backend needs must be in it, else
//! [`Error::NotCached`](crate::Error::NotCached).
//!
//! # Errors
//!
//! [`Error::RepoNotFound`](crate::Error::RepoNotFound),
//! [`Error::RevisionNotFound`](crate::Error::RevisionNotFound),
//! [`Error::RemoteFileNotFound`](crate::Error::RemoteFileNotFound) (listing the repository's
//! files), [`Error::AccessDenied`](crate::Error::AccessDenied) (401/403, gated or private,
//! naming the [`TokenSource`] used, never the token), [`Error::Network`](crate::Error::Network),
//! [`Error::HttpStatus`](crate::Error::HttpStatus), [`Error::Download`](crate::Error::Download)
//! and [`Error::NotCached`](crate::Error::NotCached).
//!
//! ```no_run
//! use ruri_core::hub::{Hub, HubRepo};
//!
//! // The files a backend needs, chosen from the repository's listing.
//! let folder = HubRepo::new("cl-nagoya/ruri-v3-30m")
//!     .revision("main")
//!     .hub(Hub::from_env())
//!     .snapshot(|files| {
//!         let mut wanted = files.config_files()?;
//!         wanted.push(files.require("model.safetensors")?);
//!         Ok(wanted)
//!     })?;
//! let dir = ruri_core::ModelDir::open(&folder)?;
//! # Ok::<(), ruri_core::Error>(())
//! ```

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::{Error, Result, TokenSource};

/// The public Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The files [`ModelDir::open`](crate::ModelDir::open) and
/// [`ModelDir::tokenizer`](crate::ModelDir::tokenizer) read, and whether a folder must have
/// them. Weight files are the backends' choice.
const FOLDER_FILES: &[(&str, bool)] = &[
    ("config.json", true),
    ("tokenizer.json", true),
    ("tokenizer_config.json", false),
    ("modules.json", false),
    ("1_Pooling/config.json", false),
    ("config_sentence_transformers.json", false),
    ("sentence_bert_config.json", false),
];

/// Where and how to reach the Hub and its cache. Setters never fail; [`Hub::from_env`] reads
/// the same environment variables as Python's `huggingface_hub`.
#[derive(Clone)]
#[must_use]
pub struct Hub {
    endpoint: String,
    cache_dir: Option<PathBuf>,
    token: Option<String>,
    token_source: TokenSource,
    offline: bool,
    progress: Option<bool>,
    retries: u32,
}

impl std::fmt::Debug for Hub {
    /// Everything but the token's value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("endpoint", &self.endpoint)
            .field("cache_dir", &self.cache_dir)
            .field("token", &self.token_source)
            .field("offline", &self.offline)
            .field("progress", &self.progress)
            .field("retries", &self.retries)
            .finish()
    }
}

impl Default for Hub {
    /// [`Hub::from_env`].
    fn default() -> Self {
        Self::from_env()
    }
}

/// An environment variable's value, unset when empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `huggingface_hub`'s `_is_true`.
fn env_true(name: &str) -> bool {
    env(name).is_some_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

/// `HF_HOME`, as `huggingface_hub/constants.py` resolves it.
fn hf_home() -> Option<PathBuf> {
    if let Some(home) = env("HF_HOME") {
        return Some(PathBuf::from(home));
    }
    let cache = env("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(cache.join("huggingface"))
}

impl Hub {
    /// The configuration `huggingface_hub` would use here: `HF_ENDPOINT`, `HF_HUB_CACHE` /
    /// `HF_HOME`, `HF_TOKEN` else the token file (`HF_TOKEN_PATH`, default `$HF_HOME/token`),
    /// `HF_HUB_OFFLINE`. A progress bar is drawn when stderr is a terminal.
    pub fn from_env() -> Self {
        let home = hf_home();
        let cache_dir = env("HF_HUB_CACHE")
            .or_else(|| env("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join("hub")));
        let endpoint = env("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let (token, token_source) = if let Some(token) = env("HF_TOKEN") {
            (Some(token.trim().to_owned()), TokenSource::Env)
        } else {
            let path = env("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join("token")));
            match path.and_then(|p| Some((std::fs::read_to_string(&p).ok()?, p))) {
                Some((token, path)) if !token.trim().is_empty() => {
                    (Some(token.trim().to_owned()), TokenSource::File(path))
                }
                _ => (None, TokenSource::None),
            }
        };
        Self {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            cache_dir,
            token,
            token_source,
            offline: env_true("HF_HUB_OFFLINE"),
            progress: None,
            retries: 3,
        }
    }

    /// The Hub's address (`HF_ENDPOINT`), e.g. a mirror.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = endpoint.into().trim_end_matches('/').to_owned();
        self
    }

    /// The cache folder (`HF_HUB_CACHE`), holding `models--org--name/` folders.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Sends this token (instead of `HF_TOKEN` or the token file).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self.token_source = TokenSource::Explicit;
        self
    }

    /// Sends no token at all.
    pub fn no_token(mut self) -> Self {
        self.token = None;
        self.token_source = TokenSource::None;
        self
    }

    /// Uses the cache only, as `HF_HUB_OFFLINE=1`.
    pub fn offline(mut self, offline: bool) -> Self {
        self.offline = offline;
        self
    }

    /// Draws a progress bar on stderr for each file fetched (default: when stderr is a
    /// terminal).
    pub fn progress(mut self, progress: bool) -> Self {
        self.progress = Some(progress);
        self
    }

    /// How many times a dropped transfer is resumed before [`Error::Network`] (default 3).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The Hub's address.
    pub fn endpoint_url(&self) -> &str {
        &self.endpoint
    }

    /// The cache folder, if one is known (`HF_HUB_CACHE`, `HF_HOME` or `HOME` gave one).
    pub fn cache_path(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// Which token is sent.
    pub fn token_source(&self) -> &TokenSource {
        &self.token_source
    }

    /// Whether only the cache is used.
    pub fn is_offline(&self) -> bool {
        self.offline
    }
}

/// A model repository on the Hub, at a revision: what [`HubRepo::snapshot`] resolves, and
/// what the backends' `build_from_hub` take (a `&str` converts into one at `main` with
/// [`Hub::from_env`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct HubRepo {
    id: String,
    revision: Option<String>,
    hub: Option<Hub>,
}

impl From<&str> for HubRepo {
    fn from(id: &str) -> Self {
        HubRepo::new(id)
    }
}

impl From<String> for HubRepo {
    fn from(id: String) -> Self {
        HubRepo::new(id)
    }
}

impl From<&String> for HubRepo {
    fn from(id: &String) -> Self {
        HubRepo::new(id.as_str())
    }
}

/// Whether `id` is a valid Hub repository id, by `huggingface_hub`'s `validate_repo_id`:
/// `name` or `namespace/name`, each of letters, digits, `-`, `_` and `.`, at most 96
/// characters, without `--` or `..`, not ending in `.git`.
pub fn is_repo_id(id: &str) -> bool {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
    };
    let parts: Vec<&str> = id.split('/').collect();
    id.len() <= 96
        && (1..=2).contains(&parts.len())
        && parts.iter().all(|p| part_ok(p))
        && !id.contains("--")
        && !id.contains("..")
        && !id.ends_with(".git")
}

/// Whether `revision` is a full commit id (40 hex digits), as `huggingface_hub`'s
/// `REGEX_COMMIT_HASH`.
fn is_commit(revision: &str) -> bool {
    revision.len() == 40
        && revision
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl HubRepo {
    /// The repository `id` (`org/name`) at `main`, with [`Hub::from_env`].
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            revision: None,
            hub: None,
        }
    }

    /// A branch, tag or full commit id (default `main`).
    pub fn revision(mut self, revision: impl Into<String>) -> Self {
        self.revision = Some(revision.into());
        self
    }

    /// The Hub and cache to use (default [`Hub::from_env`]).
    pub fn hub(mut self, hub: Hub) -> Self {
        self.hub = Some(hub);
        self
    }

    /// The repository id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The revision asked for (`main` unless set).
    pub fn revision_name(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// Resolves the revision, lets `choose` pick the files to use from the repository's
    /// listing, fetches those not yet in the cache, and returns the snapshot folder (which
    /// holds them, under their repository paths).
    ///
    /// Online, the listing is the Hub's; offline (or with the Hub unreachable) it is the cached
    /// snapshot's, and a file `choose` needs that is not cached is [`Error::NotCached`].
    pub fn snapshot(
        &self,
        choose: impl FnOnce(&RemoteFiles) -> Result<Vec<String>>,
    ) -> Result<PathBuf> {
        if !is_repo_id(&self.id) {
            return Err(Error::InvalidOption {
                name: "model id",
                value: self.id.clone(),
                reason: "a Hub model id is `name` or `org/name` of letters, digits, `-`, `_` \
                         and `.` (and no such local folder exists)",
            });
        }
        let revision = self.revision_name();
        if revision.is_empty() || revision.contains("..") || revision.starts_with('/') {
            return Err(Error::InvalidOption {
                name: "revision",
                value: revision.to_owned(),
                reason: "a branch, tag or commit id",
            });
        }
        let hub = self.hub.clone().unwrap_or_else(Hub::from_env);
        let cache_dir = hub.cache_dir.clone().ok_or_else(|| Error::InvalidOption {
            name: "HF_HUB_CACHE",
            value: String::new(),
            reason: "no cache folder: set HF_HUB_CACHE, HF_HOME or HOME",
        })?;
        let session = Session::new(&hub, &self.id, revision, cache_dir)?;
        if hub.offline {
            return session.serve_from_cache(choose, "HF_HUB_OFFLINE is set".to_owned());
        }
        let listing = match session.list() {
            Ok(listing) => listing,
            Err(network @ Error::Network { .. }) => {
                // As huggingface_hub: an unreachable Hub falls back on the cache.
                let why = format!("the Hub is unreachable: {}", describe_chain(&network));
                return match session.serve_from_cache(choose, why) {
                    Ok(dir) => Ok(dir),
                    Err(Error::NotCached { .. }) => Err(network),
                    Err(other) => Err(other),
                };
            }
            Err(e) => return Err(e),
        };
        let files = RemoteFiles {
            repo: self.id.clone(),
            revision: revision.to_owned(),
            commit: listing.sha.clone(),
            files: listing.siblings.into_iter().map(|s| s.rfilename).collect(),
        };
        let wanted = choose(&files)?;
        session.fetch(&files, &wanted, listing.gated)
    }
}

/// `a: b: c` for an error and its sources.
fn describe_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The files of a repository at one commit, as the Hub lists them (or as the cached snapshot
/// holds them offline), for a backend to choose from.
#[derive(Debug, Clone)]
pub struct RemoteFiles {
    repo: String,
    revision: String,
    commit: String,
    files: Vec<String>,
}

impl RemoteFiles {
    /// Every file path, `/`-separated, relative to the repository root.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// The commit the revision resolved to.
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// Whether the repository has `path`.
    pub fn contains(&self, path: &str) -> bool {
        self.files.iter().any(|f| f == path)
    }

    /// `path`, or [`Error::RemoteFileNotFound`] listing the repository's files.
    pub fn require(&self, path: &str) -> Result<String> {
        if self.contains(path) {
            Ok(path.to_owned())
        } else {
            Err(self.missing(path))
        }
    }

    /// [`Error::RemoteFileNotFound`] for `wanted` (a file name, or a description such as
    /// "int8 ONNX file (onnx/model_quantized.onnx, …)").
    pub fn missing(&self, wanted: impl Into<String>) -> Error {
        Error::RemoteFileNotFound {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            wanted: wanted.into(),
            files: self.files.clone(),
        }
    }

    /// The configuration and tokenizer files a model folder is read from, those the
    /// repository has: `config.json` and `tokenizer.json` (required), `tokenizer_config.json`,
    /// `modules.json`, `1_Pooling/config.json`, `config_sentence_transformers.json`,
    /// `sentence_bert_config.json`.
    pub fn config_files(&self) -> Result<Vec<String>> {
        let mut wanted = Vec::new();
        for (name, required) in FOLDER_FILES {
            if self.contains(name) {
                wanted.push((*name).to_owned());
            } else if *required {
                return Err(self.missing(*name));
            }
        }
        Ok(wanted)
    }
}

/// Where a model comes from: a local folder, or a repository on the Hub.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// A model folder on disk.
    Dir(PathBuf),
    /// A Hub repository (through the cache).
    Hub(HubRepo),
}

impl ModelSource {
    /// `model` as a command line gives it, a folder or a model id: an existing folder always
    /// wins over an id of the same spelling. A `revision` with a folder is refused
    /// ([`Error::InvalidOption`]); neither a folder nor a valid id is
    /// [`Error::MissingFile`].
    pub fn parse(model: impl AsRef<Path>, revision: Option<&str>) -> Result<Self> {
        let path = model.as_ref();
        if path.is_dir() {
            if let Some(revision) = revision {
                return Err(Error::InvalidOption {
                    name: "revision",
                    value: revision.to_owned(),
                    reason: "the model is a local folder, which has no revisions (an existing \
                             folder wins over a Hub id of the same spelling)",
                });
            }
            return Ok(ModelSource::Dir(path.to_path_buf()));
        }
        match path.to_str() {
            Some(id) if is_repo_id(id) => {
                let repo = HubRepo::new(id);
                Ok(ModelSource::Hub(match revision {
                    Some(r) => repo.revision(r),
                    None => repo,
                }))
            }
            _ => Err(Error::MissingFile {
                path: path.to_path_buf(),
            }),
        }
    }
}

impl From<HubRepo> for ModelSource {
    fn from(repo: HubRepo) -> Self {
        ModelSource::Hub(repo)
    }
}

impl From<PathBuf> for ModelSource {
    fn from(dir: PathBuf) -> Self {
        ModelSource::Dir(dir)
    }
}

impl From<&Path> for ModelSource {
    fn from(dir: &Path) -> Self {
        ModelSource::Dir(dir.to_path_buf())
    }
}

/// The listing's fields ruri reads (hf-hub's `RepoInfo` has no `gated`).
#[derive(Deserialize)]
struct Listing {
    sha: String,
    siblings: Vec<hf_hub::api::Siblings>,
    #[serde(default)]
    gated: Gated,
}

/// `false`, `"auto"` or `"manual"`.
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum Gated {
    #[default]
    No,
    Flag(bool),
    Mode(String),
}

impl Gated {
    fn is_gated(&self) -> bool {
        match self {
            Gated::No => false,
            Gated::Flag(flag) => *flag,
            Gated::Mode(mode) => !mode.is_empty(),
        }
    }
}

/// One resolution: the Hub client, the repository's cache folder.
struct Session<'a> {
    hub: &'a Hub,
    repo: &'a str,
    revision: &'a str,
    api: Api,
    agent: ureq::Agent,
    cache_dir: PathBuf,
    /// `models--org--name`.
    folder: String,
}

impl<'a> Session<'a> {
    fn new(hub: &'a Hub, repo: &'a str, revision: &'a str, cache_dir: PathBuf) -> Result<Self> {
        let api = ApiBuilder::from_cache(Cache::new(cache_dir.clone()))
            .with_endpoint(hub.endpoint.clone())
            .with_token(hub.token.clone())
            .with_progress(false)
            .with_user_agent("ruri", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| Error::Network {
                url: hub.endpoint.clone(),
                source: Box::new(e),
            })?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_recv_body(None)
            .user_agent(format!("ruri/{}; hf-hub/0.5", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let folder = Repo::new(repo.to_owned(), RepoType::Model).folder_name();
        Ok(Self {
            hub,
            repo,
            revision,
            api,
            agent,
            cache_dir,
            folder,
        })
    }

    fn storage(&self) -> PathBuf {
        self.cache_dir.join(&self.folder)
    }

    fn hub_repo(&self, revision: &str) -> hf_hub::api::sync::ApiRepo {
        self.api.repo(Repo::with_revision(
            self.repo.to_owned(),
            RepoType::Model,
            revision.to_owned(),
        ))
    }

    /// `GET /api/models/{repo}/revision/{revision}`: the commit and the files.
    fn list(&self) -> Result<Listing> {
        let request = self.hub_repo(self.revision).info_request();
        let url = format!(
            "{}/api/models/{}/revision/{}",
            self.hub.endpoint, self.repo, self.revision
        );
        let mut response = request
            .config()
            .http_status_as_error(false)
            .build()
            .call()
            .map_err(|e| Error::Network {
                url: url.clone(),
                source: Box::new(e),
            })?;
        let status = response.status().as_u16();
        if status != 200 {
            let code = response
                .headers()
                .get("x-error-code")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            return Err(self.status_error(&url, status, &code, false));
        }
        response
            .body_mut()
            .read_json::<Listing>()
            .map_err(|e| Error::Download {
                url,
                reason: format!("the listing is not the Hub's JSON: {e}"),
            })
    }

    /// The typed error for an HTTP error status, by the Hub's `X-Error-Code` as
    /// `huggingface_hub`'s `hf_raise_for_status` reads it.
    fn status_error(&self, url: &str, status: u16, code: &str, gated: bool) -> Error {
        let token = self.hub.token_source.clone();
        match (code, status) {
            ("RevisionNotFound", _) => Error::RevisionNotFound {
                repo: self.repo.to_owned(),
                revision: self.revision.to_owned(),
            },
            ("GatedRepo", _) => Error::AccessDenied {
                repo: self.repo.to_owned(),
                status,
                gated: true,
                token,
            },
            ("RepoNotFound", _) | ("", 404) => Error::RepoNotFound {
                repo: self.repo.to_owned(),
                endpoint: self.hub.endpoint.clone(),
                token,
            },
            (_, 401 | 403) => Error::AccessDenied {
                repo: self.repo.to_owned(),
                status,
                gated,
                token,
            },
            _ => Error::HttpStatus {
                url: url.to_owned(),
                status,
            },
        }
    }

    /// The snapshot a cached ref (or the commit itself) names, with `choose` picking from
    /// its files; everything chosen is there by construction.
    fn serve_from_cache(
        &self,
        choose: impl FnOnce(&RemoteFiles) -> Result<Vec<String>>,
        why: String,
    ) -> Result<PathBuf> {
        let not_cached = |reason: String| Error::NotCached {
            repo: self.repo.to_owned(),
            revision: self.revision.to_owned(),
            cache: self.cache_dir.clone(),
            why: why.clone(),
            reason,
        };
        let storage = self.storage();
        let commit = if is_commit(self.revision) {
            self.revision.to_owned()
        } else {
            let ref_path = storage.join("refs").join(self.revision);
            match std::fs::read_to_string(&ref_path) {
                Ok(commit) if is_commit(commit.trim()) => commit.trim().to_owned(),
                _ => {
                    return Err(not_cached(format!(
                        "no ref {} (the model was never downloaded at this revision)",
                        ref_path.display()
                    )));
                }
            }
        };
        let snapshot = storage.join("snapshots").join(&commit);
        if !snapshot.is_dir() {
            return Err(not_cached(format!(
                "no snapshot folder {}",
                snapshot.display()
            )));
        }
        let mut files = Vec::new();
        list_files(&snapshot, "", &mut files);
        files.sort();
        let listing = RemoteFiles {
            repo: self.repo.to_owned(),
            revision: self.revision.to_owned(),
            commit,
            files,
        };
        match choose(&listing) {
            Ok(_) => Ok(snapshot),
            Err(Error::RemoteFileNotFound { wanted, files, .. }) => Err(not_cached(format!(
                "the cached snapshot {} has no {wanted} (it has {})",
                snapshot.display(),
                if files.is_empty() {
                    "no files".to_owned()
                } else {
                    files.join(", ")
                }
            ))),
            Err(other) => Err(other),
        }
    }

    /// Fetches the `wanted` files missing from the commit's snapshot; then points the ref at
    /// the commit (as huggingface_hub, only for a branch or tag).
    fn fetch(&self, files: &RemoteFiles, wanted: &[String], gated: Gated) -> Result<PathBuf> {
        let storage = self.storage();
        let snapshot = storage.join("snapshots").join(&files.commit);
        if !is_commit(&files.commit) {
            return Err(Error::Download {
                url: format!("{}/api/models/{}", self.hub.endpoint, self.repo),
                reason: format!("the listing's sha {:?} is not a commit id", files.commit),
            });
        }
        for path in wanted {
            if !safe_repo_path(path) {
                return Err(Error::Download {
                    url: format!("{}/api/models/{}", self.hub.endpoint, self.repo),
                    reason: format!("refusing the file path {path:?}"),
                });
            }
            if !files.contains(path) {
                return Err(files.missing(path.as_str()));
            }
            let pointer = snapshot.join(path);
            if pointer.is_file() {
                continue;
            }
            self.fetch_file(&files.commit, path, &pointer, gated.is_gated())?;
        }
        if self.revision != files.commit {
            write_ref(&storage, self.revision, &files.commit)?;
        }
        Ok(snapshot)
    }

    /// One file: its metadata (hf-hub), the blob if not cached (under the lock), the link.
    fn fetch_file(&self, commit: &str, path: &str, pointer: &Path, gated: bool) -> Result<()> {
        let url = self.hub_repo(commit).url(path);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        let metadata = self
            .api
            .metadata(&url)
            .map_err(|e| self.api_error(&url, e, gated))?;
        let etag = metadata.etag().to_owned();
        if !safe_etag(&etag) {
            return Err(Error::Download {
                url,
                reason: format!("refusing the ETag {etag:?} as a file name"),
            });
        }
        let storage = self.storage();
        let blob = storage.join("blobs").join(&etag);
        if !blob.is_file() {
            let locks = self.cache_dir.join(".locks").join(&self.folder);
            std::fs::create_dir_all(&locks).map_err(io(&locks))?;
            std::fs::create_dir_all(blob.parent().expect("blobs/ is the blob's parent"))
                .map_err(io(&blob))?;
            let lock_path = locks.join(format!("{etag}.lock"));
            let lock = File::create(&lock_path).map_err(io(&lock_path))?;
            // Exclusive flock, as Python's filelock: one writer per blob across processes.
            lock.lock().map_err(io(&lock_path))?;
            // Another process may have finished it while we waited.
            if !blob.is_file() {
                let incomplete = storage.join("blobs").join(format!("{etag}.incomplete"));
                self.download(&url, metadata.size() as u64, &etag, &incomplete, path)?;
                std::fs::rename(&incomplete, &blob).map_err(io(&blob))?;
            }
            drop(lock);
        }
        let parent = pointer.parent().expect("a snapshot file has a parent");
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        link(&blob, pointer, path).map_err(io(pointer))
    }

    /// hf-hub's error, typed.
    fn api_error(&self, url: &str, e: ApiError, gated: bool) -> Error {
        match e {
            ApiError::RequestError(e) => match *e {
                ureq::Error::StatusCode(status) => self.status_error(url, status, "", gated),
                other => Error::Network {
                    url: url.to_owned(),
                    source: Box::new(other),
                },
            },
            ApiError::MissingHeader(h) | ApiError::InvalidHeader(h) => Error::Download {
                url: url.to_owned(),
                reason: format!("the Hub's answer lacks a valid {h} header"),
            },
            other => Error::Download {
                url: url.to_owned(),
                reason: other.to_string(),
            },
        }
    }

    /// Fills `incomplete` up to `size` bytes, resuming what is there, then checks it: size,
    /// and SHA-256 when the ETag is one (LFS files). A file that fails a check is removed.
    fn download(
        &self,
        url: &str,
        size: u64,
        etag: &str,
        incomplete: &Path,
        label: &str,
    ) -> Result<()> {
        let progress = self.progress_bar(size, label);
        let mut attempt = 0;
        loop {
            match self.transfer(url, size, incomplete, &progress) {
                Ok(()) => break,
                Err(Transfer::Retry(source)) if attempt < self.hub.retries => {
                    attempt += 1;
                    progress.println(format!(
                        "{label}: {} (resuming, attempt {attempt} of {})",
                        describe_chain(source.as_ref()),
                        self.hub.retries
                    ));
                    std::thread::sleep(Duration::from_millis(200 << attempt.min(5)));
                }
                Err(Transfer::Retry(source)) => {
                    progress.abandon();
                    return Err(Error::Network {
                        url: url.to_owned(),
                        source,
                    });
                }
                Err(Transfer::Fail(e)) => {
                    progress.abandon();
                    return Err(e);
                }
            }
        }
        progress.finish_and_clear();
        let fail = |reason: String| {
            let _ = std::fs::remove_file(incomplete);
            Err(Error::Download {
                url: url.to_owned(),
                reason,
            })
        };
        let got = std::fs::metadata(incomplete)
            .map_err(|source| Error::Io {
                path: incomplete.to_path_buf(),
                source,
            })?
            .len();
        if got != size {
            return fail(format!("{got} bytes received, {size} announced"));
        }
        if etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit()) {
            let digest = sha256_file(incomplete).map_err(|source| Error::Io {
                path: incomplete.to_path_buf(),
                source,
            })?;
            if !digest.eq_ignore_ascii_case(etag) {
                return fail(format!(
                    "SHA-256 {digest} of the bytes received, {etag} announced"
                ));
            }
        }
        Ok(())
    }

    /// One request: from the end of what `incomplete` holds to `size`.
    fn transfer(
        &self,
        url: &str,
        size: u64,
        incomplete: &Path,
        progress: &indicatif::ProgressBar,
    ) -> std::result::Result<(), Transfer> {
        let io = |source| {
            Transfer::Fail(Error::Io {
                path: incomplete.to_path_buf(),
                source,
            })
        };
        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(incomplete)
            .map_err(io)?;
        let mut start = file.metadata().map_err(io)?.len();
        if start > size {
            file.set_len(0).map_err(io)?;
            start = 0;
        }
        progress.set_position(start);
        if start == size {
            return Ok(());
        }
        let mut request = self.agent.get(url).header("Accept-Encoding", "identity");
        if let Some(token) = &self.hub.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        if start > 0 {
            request = request.header("Range", format!("bytes={start}-"));
        }
        let response = request.call().map_err(|e| match e {
            ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Protocol(_) => Transfer::Retry(Box::new(e)),
            other => Transfer::Fail(Error::Network {
                url: url.to_owned(),
                source: Box::new(other),
            }),
        })?;
        let status = response.status().as_u16();
        match status {
            206 => {
                let range = response
                    .headers()
                    .get("content-range")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                if !range.starts_with(&format!("bytes {start}-")) {
                    return Err(Transfer::Fail(Error::Download {
                        url: url.to_owned(),
                        reason: format!("asked for bytes {start}- and got Content-Range {range:?}"),
                    }));
                }
            }
            200 => {
                // The server ignored the range: start over rather than append the whole file.
                file.set_len(0).map_err(io)?;
                start = 0;
                progress.set_position(0);
            }
            500..=599 | 429 => {
                return Err(Transfer::Retry(Box::new(HttpStatusError(status))));
            }
            _ => {
                return Err(Transfer::Fail(self.status_error(url, status, "", false)));
            }
        }
        file.seek(SeekFrom::Start(start)).map_err(io)?;
        let mut body = response.into_body().into_reader();
        let mut buffer = vec![0; 256 * 1024];
        let mut written = start;
        loop {
            let n = match body.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    file.flush().map_err(io)?;
                    return Err(Transfer::Retry(Box::new(e)));
                }
            };
            if written + n as u64 > size {
                file.set_len(0).map_err(io)?;
                return Err(Transfer::Fail(Error::Download {
                    url: url.to_owned(),
                    reason: format!("more than the {size} bytes announced"),
                }));
            }
            file.write_all(&buffer[..n]).map_err(io)?;
            written += n as u64;
            progress.set_position(written);
        }
        file.sync_all().map_err(io)?;
        if written < size {
            // The body ended early without an error: resume from here.
            return Err(Transfer::Retry(Box::new(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the body ended after {written} of {size} bytes"),
            ))));
        }
        Ok(())
    }

    fn progress_bar(&self, size: u64, label: &str) -> indicatif::ProgressBar {
        let show = self
            .hub
            .progress
            .unwrap_or_else(|| std::io::stderr().is_terminal());
        if !show {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::new(size);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg:30} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
        ) {
            bar.set_style(style);
        }
        bar.set_message(label.to_owned());
        bar
    }
}

/// How one transfer failed: worth resuming, or not.
enum Transfer {
    Retry(Box<dyn std::error::Error + Send + Sync>),
    Fail(Error),
}

#[derive(Debug)]
struct HttpStatusError(u16);

impl std::fmt::Display for HttpStatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {}", self.0)
    }
}

impl std::error::Error for HttpStatusError {}

/// A repository path that stays inside the snapshot folder.
fn safe_repo_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// An ETag usable as a blob file name.
fn safe_etag(etag: &str) -> bool {
    !etag.is_empty()
        && !etag.starts_with('.')
        && etag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Every file under `dir`, relative, `/`-separated (symbolic links followed, as the snapshot
/// is made of them).
fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let path = entry.path();
        if path.is_dir() {
            list_files(&path, &relative, out);
        } else if path.is_file() {
            out.push(relative);
        }
    }
}

/// `refs/<revision>` = `commit`, replaced atomically (a concurrent reader never sees it
/// empty).
fn write_ref(storage: &Path, revision: &str, commit: &str) -> Result<()> {
    let path = storage.join("refs").join(revision);
    if std::fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
        return Ok(());
    }
    let io = |source| Error::Io {
        path: path.clone(),
        source,
    };
    let parent = path.parent().expect("refs/ is above the ref");
    std::fs::create_dir_all(parent).map_err(io)?;
    let temporary = parent.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&temporary, commit).map_err(io)?;
    std::fs::rename(&temporary, &path).map_err(io)
}

/// The snapshot entry for `path`: a relative symbolic link to the blob, as huggingface_hub
/// makes (`../../blobs/<etag>` for a top-level file); a copy where links are unavailable.
fn link(blob: &Path, pointer: &Path, path: &str) -> std::io::Result<()> {
    if pointer.is_file() {
        return Ok(());
    }
    // snapshots/<commit>/<path>: one `..` per component of the path, one for the commit.
    let depth = path.split('/').count() + 1;
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(blob.file_name().expect("a blob has a name"));
    #[cfg(unix)]
    let made = std::os::unix::fs::symlink(&target, pointer);
    #[cfg(not(unix))]
    let made = std::fs::copy(blob, pointer).map(|_| ());
    match made {
        // Another process linked it first.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && pointer.is_file() => Ok(()),
        other => other,
    }
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_follow_huggingface_hub() {
        for id in [
            "cl-nagoya/ruri-v3-30m",
            "sirasagi62/ruri-v3-30m-ONNX",
            "gpt2",
            "a.b/c_d",
        ] {
            assert!(is_repo_id(id), "{id}");
        }
        for id in [
            "", "a/b/c", "/abs", "./x", "a--b/c", "a/b..c", "a/b.git", "a b/c", "org/", "~/models",
            "../x",
        ] {
            assert!(!is_repo_id(id), "{id}");
        }
    }

    #[test]
    fn snapshot_links_are_relative_to_the_blob() {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path();
        let blob = storage.join("blobs").join("abc");
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        std::fs::write(&blob, b"x").unwrap();
        for path in ["config.json", "1_Pooling/config.json", "onnx/a/b.onnx"] {
            let pointer = storage.join("snapshots").join("c0ffee").join(path);
            std::fs::create_dir_all(pointer.parent().unwrap()).unwrap();
            link(&blob, &pointer, path).unwrap();
            assert_eq!(std::fs::read(&pointer).unwrap(), b"x", "{path}");
            #[cfg(unix)]
            assert!(
                std::fs::read_link(&pointer).unwrap().is_relative(),
                "{path}"
            );
        }
    }

    #[test]
    fn unsafe_paths_and_etags_are_refused() {
        for p in ["../x", "a/../b", "/etc/passwd", "a//b", "", "a\\b", "./a"] {
            assert!(!safe_repo_path(p), "{p}");
        }
        assert!(safe_repo_path("1_Pooling/config.json"));
        for e in ["", "../x", "a/b", ".lock"] {
            assert!(!safe_etag(e), "{e}");
        }
        assert!(safe_etag("0123abcd"));
    }

    #[test]
    fn sha256_of_a_known_input() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        // FIPS 180-2's example.
        assert_eq!(
            sha256_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
