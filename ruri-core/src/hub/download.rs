//! The HTTP side of a resolution: the Hub's listing, each file's metadata (hf-hub), and the
//! resumable, checked transfer of its bytes into `blobs/<etag>.incomplete`.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hf_hub::api::sync::{Api, ApiBuilder};
use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::cache::{link, mark_absent, write_ref};
use super::{Hub, RemoteFiles, is_commit};
use crate::{Error, Result};

/// The listing's fields ruri reads (hf-hub's `RepoInfo` has no `gated`).
#[derive(Deserialize)]
pub(super) struct Listing {
    pub(super) sha: String,
    pub(super) siblings: Vec<hf_hub::api::Siblings>,
    #[serde(default)]
    pub(super) gated: Gated,
}

/// `false`, `"auto"` or `"manual"`.
#[derive(Deserialize, Default)]
#[serde(untagged)]
pub(super) enum Gated {
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
pub(super) struct Session<'a> {
    pub(super) hub: &'a Hub,
    pub(super) repo: &'a str,
    pub(super) revision: &'a str,
    api: Api,
    agent: ureq::Agent,
    /// The same, following no redirect: the metadata request reads the resolve route's own
    /// answer (a redirect to the CDN carries the LFS file's hash and size).
    no_redirect: ureq::Agent,
    pub(super) cache_dir: PathBuf,
    /// `models--org--name`.
    pub(super) folder: String,
}

impl<'a> Session<'a> {
    pub(super) fn new(
        hub: &'a Hub,
        repo: &'a str,
        revision: &'a str,
        cache_dir: PathBuf,
    ) -> Result<Self> {
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
        let config = || {
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_connect(Some(Duration::from_secs(10)))
                .timeout_recv_response(Some(Duration::from_secs(60)))
                // No limit on a whole body (a large file on a slow link takes its time), but each
                // read has one: a stalled body is a dropped connection, and is resumed.
                .timeout_recv_body(None)
                .timeout_per_read(Some(hub.read_timeout))
                // The token goes to the Hub only, never along a redirect (the resolve route sends
                // LFS files to a CDN, another origin): ureq's default, stated rather than relied
                // on (tests/hub.rs checks that no CDN request carries it).
                .redirect_auth_headers(ureq::config::RedirectAuthHeaders::Never)
                .user_agent(format!("ruri/{}; hf-hub/0.5", env!("CARGO_PKG_VERSION")))
        };
        let agent: ureq::Agent = config().build().into();
        let no_redirect: ureq::Agent = config().max_redirects(0).build().into();
        let folder = Repo::new(repo.to_owned(), RepoType::Model).folder_name();
        Ok(Self {
            hub,
            repo,
            revision,
            api,
            agent,
            no_redirect,
            cache_dir,
            folder,
        })
    }

    fn hub_repo(&self, revision: &str) -> hf_hub::api::sync::ApiRepo {
        self.api.repo(Repo::with_revision(
            self.repo.to_owned(),
            RepoType::Model,
            revision.to_owned(),
        ))
    }

    /// `GET /api/models/{repo}/revision/{revision}`: the commit and the files.
    pub(super) fn list(&self) -> Result<Listing> {
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

    /// Fetches the `wanted` files missing from the commit's snapshot; then points the ref at
    /// the commit (as huggingface_hub, only for a branch or tag).
    pub(super) fn fetch(
        &self,
        files: &RemoteFiles,
        wanted: &[String],
        gated: Gated,
    ) -> Result<PathBuf> {
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
        // The folder files this commit lacks, for offline runs (ruri's and Python's).
        for (path, _) in super::FOLDER_FILES {
            if !files.contains(path) {
                mark_absent(&storage, &files.commit, path);
            }
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
        let (etag, size) = self.metadata(&url, gated)?;
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
                if size > self.hub.max_file_bytes {
                    return Err(Error::Download {
                        url,
                        reason: format!(
                            "the Hub announces {size} bytes, more than the largest file this \
                             client downloads ({} bytes, Hub::max_file_bytes)",
                            self.hub.max_file_bytes
                        ),
                    });
                }
                let incomplete = storage.join("blobs").join(format!("{etag}.incomplete"));
                self.download(&url, size, &etag, &incomplete, path)?;
                std::fs::rename(&incomplete, &blob).map_err(io(&blob))?;
            }
            drop(lock);
        }
        let parent = pointer.parent().expect("a snapshot file has a parent");
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        link(&blob, pointer, path).map_err(io(pointer))
    }

    /// A file's ETag (its SHA-256 for LFS files, a git blob id otherwise) and size, from a
    /// `HEAD` of its resolve URL, as `huggingface_hub`'s `get_hf_file_metadata`: redirects
    /// are not followed (an LFS file's answer is a redirect to the CDN whose `X-Linked-Etag`
    /// and `X-Linked-Size` describe it), so the token, sent to the Hub, never goes to the
    /// CDN. (hf-hub's own `metadata` follows the redirect with the token: the CDN saw it.)
    /// A relative redirect (a renamed repository) stays on the Hub and is followed.
    fn metadata(&self, url: &str, gated: bool) -> Result<(String, u64)> {
        let mut url = url.to_owned();
        for _ in 0..5 {
            let mut request = self
                .no_redirect
                .head(&url)
                .header("Accept-Encoding", "identity");
            if let Some(token) = &self.hub.token {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            let response = request.call().map_err(|e| Error::Network {
                url: url.clone(),
                source: Box::new(e),
            })?;
            let status = response.status().as_u16();
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let linked = header("x-linked-etag").is_some();
            if (300..400).contains(&status) && !linked {
                match header("location") {
                    Some(location) if location.starts_with('/') => {
                        url = format!("{}{location}", self.hub.endpoint);
                        continue;
                    }
                    _ => {
                        return Err(Error::Download {
                            url,
                            reason: format!("HTTP {status} without X-Linked-Etag"),
                        });
                    }
                }
            }
            if !(200..400).contains(&status) {
                return Err(self.status_error(&url, status, "", gated));
            }
            let missing = |what: &str| Error::Download {
                url: url.clone(),
                reason: format!("the Hub's answer lacks a valid {what} header"),
            };
            // huggingface_hub's `_normalize_etag`: no weak marker, no quotes.
            let etag = header("x-linked-etag")
                .or_else(|| header("etag"))
                .map(|e| e.trim().trim_start_matches("W/").replace('"', ""))
                .filter(|e| !e.is_empty())
                .ok_or_else(|| missing("ETag"))?;
            let size = header("x-linked-size")
                .or_else(|| header("content-length"))
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| missing("size (X-Linked-Size or Content-Length)"))?;
            return Ok((etag, size));
        }
        Err(Error::Download {
            url,
            reason: "more than 5 redirects within the Hub".into(),
        })
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
                        crate::error_chain(source.as_ref()),
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
