//! The partial output: a folder beside the output file (`OUTPUT.ruri-partial/`) that holds a
//! manifest (what the run was asked) and the embedded chunks, each made visible by a rename
//! once complete. At the end the chunks are assembled into the output, which appears by a
//! rename too, and the folder goes. `--resume` keeps the complete chunks and continues after
//! them; since the output is assembled from the same chunks either way, a resumed run's file
//! equals an uninterrupted one's byte for byte.
//!
//! A chunk file (`chunk-00000000.bin`), little-endian: the magic `RURICHK1`; the input
//! records it covers (u64); rows (u32); width (u32); each row's index (u64), tokens (u32),
//! truncated (u8), id (u8 tag: 0 none, 1 integer then i64, 2 string then u32 length and the
//! bytes); the vectors (f32, rows × width); the skipped records (u32 count; each: tag 0 line
//! or 1 row, the u64 position, u32 length and the message).

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::input::{Id, Location};
use crate::output::RowMeta;

const MAGIC: &[u8; 8] = b"RURICHK1";

/// One chunk: the input records it covers and what became of them.
#[derive(Debug, Default, PartialEq)]
pub struct Chunk {
    /// Input records read (embedded or skipped).
    pub records: u64,
    /// The embedded rows.
    pub meta: Vec<RowMeta>,
    /// Their vectors, `meta.len() × width`.
    pub vectors: Vec<f32>,
    /// The records skipped (`--on-error skip`), with why.
    pub skipped: Vec<(Location, String)>,
}

/// The partial output folder.
pub struct Spool {
    dir: PathBuf,
    /// Chunks complete so far.
    chunks: u64,
    width: usize,
}

/// What the manifest says the run is; a resumed run must be asked the same.
pub type Manifest = serde_json::Map<String, serde_json::Value>;

impl Spool {
    /// Makes a fresh partial folder (refusing one left by an interrupted run, unless
    /// `resume`), or opens the one there to resume: returns the spool and the complete
    /// chunks.
    pub fn open(
        dir: PathBuf,
        manifest: &Manifest,
        width: usize,
        resume: bool,
    ) -> Result<(Self, Vec<PathBuf>), String> {
        let manifest_path = dir.join("manifest.json");
        let shown = dir.display();
        if dir.exists() {
            if !resume {
                return Err(format!(
                    "{shown} exists: the partial output of an interrupted run. Pass --resume to \
                     continue it, or remove it to start over"
                ));
            }
            let text = fs::read_to_string(&manifest_path).map_err(|e| {
                format!("{shown}: no readable manifest.json ({e}); remove the folder to start over")
            })?;
            let before: Manifest = serde_json::from_str(&text).map_err(|e| {
                format!("{shown}/manifest.json: {e}; remove the folder to start over")
            })?;
            let differ: Vec<&str> = manifest
                .iter()
                .filter(|(k, v)| before.get(*k) != Some(*v))
                .map(|(k, _)| k.as_str())
                .chain(
                    before
                        .keys()
                        .filter(|k| !manifest.contains_key(*k))
                        .map(String::as_str),
                )
                .collect();
            if !differ.is_empty() {
                return Err(format!(
                    "--resume: the interrupted run in {shown} was asked otherwise ({} differ); \
                     run with the same options and input, or remove the folder to start over",
                    differ.join(", ")
                ));
            }
            // The complete chunks, in order; anything after a gap, and files being written
            // when the run stopped, go.
            let mut chunks = Vec::new();
            while dir.join(chunk_name(chunks.len() as u64)).is_file() {
                chunks.push(dir.join(chunk_name(chunks.len() as u64)));
            }
            for entry in fs::read_dir(&dir).map_err(|e| format!("{shown}: {e}"))? {
                let path = entry.map_err(|e| format!("{shown}: {e}"))?.path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name != "manifest.json" && !chunks.contains(&path) {
                    fs::remove_file(&path)
                        .map_err(|e| format!("removing {}: {e}", path.display()))?;
                }
            }
            let spool = Spool {
                dir,
                chunks: chunks.len() as u64,
                width,
            };
            return Ok((spool, chunks));
        }
        // `--resume` without a partial output starts one: a retried command line works
        // whether or not the first try got anywhere.
        fs::create_dir_all(&dir).map_err(|e| format!("creating {shown}: {e}"))?;
        let text = serde_json::to_string_pretty(manifest).expect("a JSON map serializes");
        write_atomically(&manifest_path, text.as_bytes())?;
        Ok((
            Spool {
                dir,
                chunks: 0,
                width,
            },
            Vec::new(),
        ))
    }

    /// A spool in a temporary folder (output to a pipe that must wait for the whole corpus).
    pub fn temporary(dir: &Path, width: usize) -> Self {
        Spool {
            dir: dir.to_owned(),
            chunks: 0,
            width,
        }
    }

    /// Stores the next chunk (complete once this returns).
    pub fn push(&mut self, chunk: &Chunk) -> Result<(), String> {
        let mut bytes = Vec::with_capacity(64 + chunk.vectors.len() * 4 + chunk.meta.len() * 24);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&chunk.records.to_le_bytes());
        bytes.extend_from_slice(&(chunk.meta.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(self.width as u32).to_le_bytes());
        for m in &chunk.meta {
            bytes.extend_from_slice(&m.row.to_le_bytes());
            bytes.extend_from_slice(&m.tokens.to_le_bytes());
            bytes.push(u8::from(m.truncated));
            match &m.id {
                None => bytes.push(0),
                Some(Id::Int(n)) => {
                    bytes.push(1);
                    bytes.extend_from_slice(&n.to_le_bytes());
                }
                Some(Id::Str(s)) => {
                    bytes.push(2);
                    put_str(&mut bytes, s);
                }
            }
        }
        for v in &chunk.vectors {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes.extend_from_slice(&(chunk.skipped.len() as u32).to_le_bytes());
        for (location, message) in &chunk.skipped {
            let (tag, n) = match location {
                Location::Line(n) => (0, *n),
                Location::Row(n) => (1, *n),
            };
            bytes.push(tag);
            bytes.extend_from_slice(&n.to_le_bytes());
            put_str(&mut bytes, message);
        }
        write_atomically(&self.dir.join(chunk_name(self.chunks)), &bytes)?;
        self.chunks += 1;
        Ok(())
    }

    /// The chunk files, in order.
    pub fn chunk_paths(&self) -> Vec<PathBuf> {
        (0..self.chunks)
            .map(|i| self.dir.join(chunk_name(i)))
            .collect()
    }

    /// Chunks stored.
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.chunks
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn chunk_name(i: u64) -> String {
    format!("chunk-{i:08}.bin")
}

fn put_str(bytes: &mut Vec<u8>, s: &str) {
    bytes.extend_from_slice(&(s.len() as u32).to_le_bytes());
    bytes.extend_from_slice(s.as_bytes());
}

/// Writes `path` through a temporary sibling, synced, then renamed: it exists complete or
/// not at all.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = tmp_sibling(path);
    let fail = |e: std::io::Error| format!("writing {}: {e}", path.display());
    let mut file = BufWriter::new(File::create(&tmp).map_err(fail)?);
    file.write_all(bytes).map_err(fail)?;
    file.into_inner()
        .map_err(|e| fail(e.into_error()))?
        .sync_all()
        .map_err(fail)?;
    fs::rename(&tmp, path).map_err(fail)
}

/// `dir/.name.tmp` for `dir/name`.
pub fn tmp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Reads a chunk file back.
pub fn read_chunk(path: &Path) -> Result<Chunk, String> {
    let corrupt = |what: &str| {
        format!(
            "{}: {what}; remove the partial output folder to start over",
            path.display()
        )
    };
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut r = Cursor {
        bytes: &bytes,
        at: 0,
    };
    if r.take(8) != Some(&MAGIC[..]) {
        return Err(corrupt("not a ruri chunk"));
    }
    let cut = || corrupt("cut short");
    let records = r.u64().ok_or_else(cut)?;
    let rows = r.u32().ok_or_else(cut)? as usize;
    let width = r.u32().ok_or_else(cut)? as usize;
    let mut meta = Vec::with_capacity(rows.min(1 << 20));
    for _ in 0..rows {
        let row = r.u64().ok_or_else(cut)?;
        let tokens = r.u32().ok_or_else(cut)?;
        let truncated = r.u8().ok_or_else(cut)? != 0;
        let id = match r.u8().ok_or_else(cut)? {
            0 => None,
            1 => Some(Id::Int(r.u64().ok_or_else(cut)? as i64)),
            2 => Some(Id::Str(r.string().ok_or_else(cut)?)),
            _ => return Err(corrupt("an unknown id tag")),
        };
        meta.push(RowMeta {
            row,
            id,
            tokens,
            truncated,
        });
    }
    let data = r
        .take(
            rows.checked_mul(width)
                .and_then(|n| n.checked_mul(4))
                .ok_or_else(cut)?,
        )
        .ok_or_else(cut)?;
    let vectors = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let count = r.u32().ok_or_else(cut)?;
    let mut skipped = Vec::new();
    for _ in 0..count {
        let tag = r.u8().ok_or_else(cut)?;
        let n = r.u64().ok_or_else(cut)?;
        let location = if tag == 0 {
            Location::Line(n)
        } else {
            Location::Row(n)
        };
        skipped.push((location, r.string().ok_or_else(cut)?));
    }
    if r.at != bytes.len() {
        return Err(corrupt("trailing bytes"));
    }
    Ok(Chunk {
        records,
        meta,
        vectors,
        skipped,
    })
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::temporary(dir.path(), 2);
        let chunk = Chunk {
            records: 4,
            meta: vec![
                RowMeta {
                    row: 0,
                    id: Some(Id::Str("あ".into())),
                    tokens: 5,
                    truncated: false,
                },
                RowMeta {
                    row: 2,
                    id: Some(Id::Int(-7)),
                    tokens: 9,
                    truncated: true,
                },
            ],
            vectors: vec![0.5, -1.0, 3.25, f32::MIN_POSITIVE],
            skipped: vec![
                (Location::Line(2), "is not JSON".into()),
                (Location::Row(3), "x".into()),
            ],
        };
        spool.push(&chunk).unwrap();
        let paths = spool.chunk_paths();
        assert_eq!(read_chunk(&paths[0]).unwrap(), chunk);
        // A cut chunk is refused, not misread.
        let bytes = fs::read(&paths[0]).unwrap();
        fs::write(&paths[0], &bytes[..bytes.len() - 1]).unwrap();
        assert!(read_chunk(&paths[0]).unwrap_err().contains("cut short"));
    }

    #[test]
    fn resuming_needs_the_same_manifest_and_drops_unfinished_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("out.jsonl.ruri-partial");
        let mut manifest = Manifest::new();
        manifest.insert("chunk".into(), 4.into());
        let (mut spool, done) = Spool::open(dir.clone(), &manifest, 2, true).unwrap();
        assert!(done.is_empty());
        spool.push(&Chunk::default()).unwrap();
        spool.push(&Chunk::default()).unwrap();
        fs::write(dir.join(".chunk-00000002.bin.tmp"), b"half").unwrap();
        assert!(
            Spool::open(dir.clone(), &manifest, 2, false)
                .err()
                .unwrap()
                .contains("--resume")
        );
        let mut other = manifest.clone();
        other.insert("chunk".into(), 8.into());
        let err = Spool::open(dir.clone(), &other, 2, true).err().unwrap();
        assert!(err.contains("(chunk differ)"), "{err}");
        let (spool, done) = Spool::open(dir.clone(), &manifest, 2, true).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(spool.len(), 2);
        assert!(!dir.join(".chunk-00000002.bin.tmp").exists());
    }
}
