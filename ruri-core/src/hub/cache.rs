//! The cache side: `huggingface_hub`'s layout (`refs/`, `snapshots/<commit>/`, relative links
//! into `blobs/`), read offline and written after each download.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::download::Session;
use super::{RemoteFiles, is_commit};
use crate::{Error, Result};

impl Session<'_> {
    /// `$HF_HUB_CACHE/models--org--name`: the repository's folder in the cache.
    pub(super) fn storage(&self) -> PathBuf {
        self.cache_dir.join(&self.folder)
    }

    /// The snapshot a cached ref (or the commit itself) names, with `choose` picking from
    /// its files; everything chosen is there by construction.
    pub(super) fn serve_from_cache(
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
        // huggingface_hub's `.no_exist/<commit>/<path>` markers: files the Hub answered it
        // does not have at this commit (written by either side).
        let mut absent = Vec::new();
        list_files(
            &storage.join(".no_exist").join(&listing.commit),
            "",
            &mut absent,
        );
        match choose(&listing) {
            Ok(_) => Ok(snapshot),
            // Known absent: the Hub's answer, not a gap in the cache.
            Err(e @ Error::RemoteFileNotFound { .. }) if matches!(&e, Error::RemoteFileNotFound { wanted, .. } if absent.contains(wanted)) => {
                Err(e)
            }
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

/// Records that the Hub has no `path` at `commit`, as huggingface_hub does after a 404: an
/// empty `.no_exist/<commit>/<path>` file. Best effort: a marker only saves a later offline
/// run (ruri's or Python's) from taking the file for one not yet downloaded.
pub(super) fn mark_absent(storage: &Path, commit: &str, path: &str) {
    let marker = storage.join(".no_exist").join(commit).join(path);
    if marker.is_file() {
        return;
    }
    if let Some(parent) = marker.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let _ = std::fs::File::create(&marker);
}

/// `refs/<revision>` = `commit`, replaced atomically (a concurrent reader never sees it
/// empty).
pub(super) fn write_ref(storage: &Path, revision: &str, commit: &str) -> Result<()> {
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
    // One temporary file per writer: threads of one process share the pid, and two writers
    // renaming the same temporary file make the second rename fail (it is gone).
    static WRITERS: AtomicU64 = AtomicU64::new(0);
    let temporary = parent.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id(),
        WRITERS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&temporary, commit).map_err(io)?;
    std::fs::rename(&temporary, &path).map_err(io)
}

/// The snapshot entry for `path`: a relative symbolic link to the blob, as huggingface_hub
/// makes (`../../blobs/<etag>` for a top-level file); a copy where links are unavailable.
pub(super) fn link(blob: &Path, pointer: &Path, path: &str) -> std::io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_ref_writers_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path();
        let writers: Vec<_> = (0..4u8)
            .map(|w| {
                let storage = storage.to_path_buf();
                std::thread::spawn(move || {
                    for round in 0..50u8 {
                        // Distinct commits, so that no write is skipped as already done.
                        let commit = format!("{w:02x}{round:02x}").repeat(10);
                        write_ref(&storage, "main", &commit).unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let commit = std::fs::read_to_string(storage.join("refs").join("main")).unwrap();
        assert_eq!(commit.len(), 40, "{commit:?}");
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
}
