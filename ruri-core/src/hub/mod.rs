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
//! token file (`HF_TOKEN_PATH`, default `$HF_HOME/token`, written by `hf auth login`) unless
//! `HF_HUB_DISABLE_IMPLICIT_TOKEN` is true, and `HF_HUB_OFFLINE=1` (use the cache only). The
//! token is sent to the Hub's origin only, never along a redirect (the CDN that serves LFS
//! files is another origin).
//!
//! # Never a corrupt model
//!
//! A file enters `blobs/` only by a rename of its `.incomplete` file once its size equals the
//! announced size and, for LFS files, its SHA-256 equals the ETag; the snapshot link is made
//! after that. Small (git) files have a git blob id as their ETag, not a SHA-256: they are
//! checked by size only. A file announced over [`Hub::max_file_bytes`] is refused before the
//! transfer, a body is never written past the announced size, and a read that waits past
//! [`Hub::read_timeout`] counts as a dropped connection. A dropped connection is resumed with a `Range` request (a server that ignores
//! the range restarts the file from zero rather than appending to it), up to
//! [`Hub::retries`] times, and a later run resumes what an interrupted process left.
//!
//! # Online and offline
//!
//! Online, one listing request (`/api/models/{id}/revision/{revision}`) resolves the revision
//! to a commit and lists its files; only the files missing from that commit's snapshot are
//! fetched. When the Hub cannot be reached (a network failure, not an HTTP error), or with
//! `HF_HUB_OFFLINE=1`, the cache answers: `refs/<revision>` (or the commit itself) names the
//! snapshot, and the files the backend needs must be in it, else [`Error::NotCached`] — or
//! [`Error::RemoteFileNotFound`] when a `.no_exist/<commit>/<path>` marker records that the
//! Hub has no such file. Online, such a marker is written (as `huggingface_hub` does after a
//! 404) for each folder file (`config_sentence_transformers.json`, …) the listing lacks.
//!
//! # Errors
//!
//! [`Error::RepoNotFound`], [`Error::RevisionNotFound`], [`Error::RemoteFileNotFound`]
//! (listing the repository's files), [`Error::AccessDenied`] (401/403, gated or private,
//! naming the [`TokenSource`] used, never the token), [`Error::Network`],
//! [`Error::HttpStatus`], [`Error::Download`] and [`Error::NotCached`].
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

mod cache;
mod download;

use std::path::{Path, PathBuf};

use crate::{Error, Result, TokenSource};
use download::Session;

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
    read_timeout: std::time::Duration,
    max_file_bytes: u64,
}

/// [`Hub::read_timeout`]'s default.
pub const DEFAULT_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// [`Hub::max_file_bytes`]'s default: 16 GiB, over ten times the largest Ruri v3 file (the
/// 310m model's fp32 weights, 1.2 GB), far under a disk that a lying server would fill.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 16 << 30;

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
            .field("read_timeout", &self.read_timeout)
            .field("max_file_bytes", &self.max_file_bytes)
            .finish()
    }
}

impl Default for Hub {
    /// [`Hub::from_env`].
    fn default() -> Self {
        Self::from_env()
    }
}

/// The environment, as [`Hub::from_env`] reads it: a variable's value, unset when empty.
struct Vars<F: Fn(&str) -> Option<String>>(F);

impl<F: Fn(&str) -> Option<String>> Vars<F> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
    }

    /// `huggingface_hub`'s `_is_true`.
    fn is_true(&self, name: &str) -> bool {
        self.get(name).is_some_and(|v| {
            matches!(
                v.trim().to_ascii_uppercase().as_str(),
                "1" | "ON" | "YES" | "TRUE"
            )
        })
    }

    /// `HF_HOME`, as `huggingface_hub/constants.py` resolves it.
    fn hf_home(&self) -> Option<PathBuf> {
        if let Some(home) = self.get("HF_HOME") {
            return Some(PathBuf::from(home));
        }
        let cache = self
            .get("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| self.get("HOME").map(|h| Path::new(&h).join(".cache")))?;
        Some(cache.join("huggingface"))
    }
}

impl Hub {
    /// The configuration `huggingface_hub` would use here: `HF_ENDPOINT`, `HF_HUB_CACHE` /
    /// `HF_HOME`, `HF_TOKEN` else the token file (`HF_TOKEN_PATH`, default `$HF_HOME/token`),
    /// `HF_HUB_OFFLINE`, and `HF_HUB_DISABLE_IMPLICIT_TOKEN` (then neither `HF_TOKEN` nor the
    /// file is sent; only a token given with [`Hub::token`]). A progress bar is drawn when
    /// stderr is a terminal.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Hub::from_env`] on any source of variables.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let vars = Vars(var);
        let env = |name: &str| vars.get(name);
        let home = vars.hf_home();
        let cache_dir = env("HF_HUB_CACHE")
            .or_else(|| env("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join("hub")));
        let endpoint = env("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let (token, token_source) = if vars.is_true("HF_HUB_DISABLE_IMPLICIT_TOKEN") {
            // huggingface_hub's `get_token_to_send`: no implicit token at all.
            (None, TokenSource::None)
        } else if let Some(token) = env("HF_TOKEN") {
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
            offline: vars.is_true("HF_HUB_OFFLINE"),
            progress: None,
            retries: 3,
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
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

    /// The longest wait for any one read of an answer (default [`DEFAULT_READ_TIMEOUT`]): a
    /// body that stalls this long counts as a dropped connection, and is resumed (up to
    /// [`Hub::retries`] times) rather than waited on forever.
    pub fn read_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// The largest file downloaded (default [`DEFAULT_MAX_FILE_BYTES`]): a file announced
    /// larger is refused before any byte is transferred, and no transfer writes more bytes
    /// than were announced.
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
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
                let why = format!("the Hub is unreachable: {}", crate::error_chain(&network));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `from_vars` on a fixed set of variables.
    fn hub_with(vars: &[(&str, &str)]) -> Hub {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Hub::from_vars(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    /// `HF_HUB_DISABLE_IMPLICIT_TOKEN` as huggingface_hub's `get_token_to_send`: neither
    /// `HF_TOKEN` nor the token file is sent; a token given in code still is.
    #[test]
    fn implicit_tokens_can_be_disabled() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "hf_from_file\n").unwrap();
        let file_var = file.to_str().unwrap();
        let from_env = hub_with(&[("HF_TOKEN", "hf_from_env")]);
        assert_eq!(from_env.token.as_deref(), Some("hf_from_env"));
        assert_eq!(from_env.token_source(), &TokenSource::Env);
        let from_file = hub_with(&[("HF_TOKEN_PATH", file_var)]);
        assert_eq!(from_file.token.as_deref(), Some("hf_from_file"));
        for on in ["1", "true", "YES"] {
            for vars in [
                &[
                    ("HF_TOKEN", "hf_from_env"),
                    ("HF_HUB_DISABLE_IMPLICIT_TOKEN", on),
                ][..],
                &[
                    ("HF_TOKEN_PATH", file_var),
                    ("HF_HUB_DISABLE_IMPLICIT_TOKEN", on),
                ][..],
            ] {
                let hub = hub_with(vars);
                assert_eq!(hub.token, None, "{vars:?}");
                assert_eq!(hub.token_source(), &TokenSource::None, "{vars:?}");
                let explicit = hub.token("hf_explicit");
                assert_eq!(explicit.token.as_deref(), Some("hf_explicit"));
            }
        }
        // Not true: the token is sent.
        let off = hub_with(&[
            ("HF_TOKEN", "hf_from_env"),
            ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "0"),
        ]);
        assert_eq!(off.token.as_deref(), Some("hf_from_env"));
    }

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
}
