//! `model.safetensors`, read tensor by tensor (no memory map: a mapped file counts in the
//! resident memory for every page touched, and quantizing touches every page), from a file
//! or from bytes already in memory (WebAssembly has no file system).
//!
//! Every offset and size in the header is checked with checked arithmetic before it is
//! used: a crafted header is a typed error, never an overflow or an out-of-bounds slice.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ruri_core::{Error, ModelConfig, Result};

// The checked header parsing is ruri-core's, shared with ruri-ort's fused graph.
use ruri_core::safetensors::{self, check_tensors};
pub(crate) use ruri_core::safetensors::{Dtype, MAX_HEADER, data_start};

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    pub(crate) start: u64,
}

/// Where the bytes come from.
#[derive(Debug)]
pub(crate) enum Source {
    File(File),
    /// Bytes already in memory (`NativeBackend::from_bytes`).
    Bytes(Arc<[u8]>),
}

impl Source {
    pub(crate) fn len(&self) -> std::io::Result<u64> {
        match self {
            Source::File(f) => Ok(f.metadata()?.len()),
            Source::Bytes(b) => Ok(b.len() as u64),
        }
    }

    /// Fills `buf` from `offset` (positional: shared by threads without a lock).
    pub(crate) fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        match self {
            #[cfg(unix)]
            Source::File(f) => std::os::unix::fs::FileExt::read_exact_at(f, buf, offset),
            #[cfg(windows)]
            Source::File(f) => {
                let mut done = 0;
                while done < buf.len() {
                    let n = std::os::windows::fs::FileExt::seek_read(
                        f,
                        &mut buf[done..],
                        offset + done as u64,
                    )?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    done += n;
                }
                Ok(())
            }
            #[cfg(not(any(unix, windows)))]
            Source::File(_) => Err(std::io::ErrorKind::Unsupported.into()),
            Source::Bytes(b) => {
                let start = usize::try_from(offset)
                    .ok()
                    .filter(|&s| s.checked_add(buf.len()).is_some_and(|e| e <= b.len()))
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                buf.copy_from_slice(&b[start..start + buf.len()]);
                Ok(())
            }
        }
    }
}

/// An open `model.safetensors` whose ModernBERT tensors were all checked against
/// `config.json`.
#[derive(Debug)]
pub(crate) struct Safetensors {
    path: PathBuf,
    source: Source,
    entries: HashMap<String, Entry>,
    prefix: &'static str,
}

/// A safetensors file's header, read and its length checked.
#[derive(Debug)]
pub(crate) struct Header {
    /// The JSON text.
    pub(crate) json: Vec<u8>,
    /// Where the data starts (8 + the JSON's length).
    pub(crate) data_start: u64,
    pub(crate) file_len: u64,
}

impl Header {
    /// The header of `source` (`path` names it in errors).
    pub(crate) fn read(path: &Path, source: &Source) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let file_len = source.len().map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut len = [0u8; 8];
        source
            .read_at(0, &mut len)
            .map_err(|_| invalid("shorter than a safetensors header".into()))?;
        let header_len = u64::from_le_bytes(len);
        let data_start = data_start(path, header_len, file_len)?;
        let mut json = vec![0u8; header_len as usize];
        source.read_at(8, &mut json).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            json,
            data_start,
            file_len,
        })
    }
}

/// Opens a file as a [`Source`].
pub(crate) fn open_file(path: &Path) -> Result<Source> {
    let file = File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Source::File(file))
}

impl Safetensors {
    /// Bytes already in memory; `label` names them in errors.
    #[cfg(test)]
    pub(crate) fn from_bytes(
        label: PathBuf,
        bytes: Arc<[u8]>,
        config: &ModelConfig,
    ) -> Result<Self> {
        let source = Source::Bytes(bytes);
        let header = Header::read(&label, &source)?;
        Self::from_header(label, source, &header, config)
    }

    /// A checkpoint whose header was read from `source`.
    pub(crate) fn from_header(
        path: PathBuf,
        source: Source,
        header: &Header,
        config: &ModelConfig,
    ) -> Result<Self> {
        let (entries, prefix) = parse_header_for(
            &path,
            &header.json,
            header.data_start,
            header.file_len,
            config,
        )?;
        Ok(Self {
            path,
            source,
            entries,
            prefix,
        })
    }

    /// Tensors already checked (ruri's int8 file's f32 embedding table), read from `source`.
    pub(crate) fn from_checked(
        path: PathBuf,
        source: Source,
        entries: HashMap<String, Entry>,
    ) -> Self {
        Self {
            path,
            source,
            entries,
            prefix: "",
        }
    }

    fn invalid(&self, reason: String) -> Error {
        Error::InvalidConfig {
            path: self.path.clone(),
            reason,
        }
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        let full = format!("{}{name}", self.prefix);
        self.entries.get(&full).ok_or_else(|| {
            self.invalid(format!(
                "the tensor {full} is missing (or not a float tensor)"
            ))
        })
    }

    /// A whole tensor as f32, row-major, into `out` (cleared first): a loader that reads
    /// many tensors reuses one buffer instead of freeing one per tensor.
    pub(crate) fn read_into(&self, name: &str, out: &mut Vec<f32>) -> Result<()> {
        let entry = self.entry(name)?;
        // Shapes were checked against the file's length when the header was parsed.
        let count: usize = entry.shape.iter().product();
        out.clear();
        self.read_elements_into(entry, 0, count, out)
    }

    /// Rows `first .. first + rows` of a 2-D tensor as f32, into `out` (cleared first).
    pub(crate) fn read_rows_into(
        &self,
        name: &str,
        first: usize,
        rows: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let entry = self.entry(name)?;
        let [height, cols] = entry.shape[..] else {
            return Err(self.invalid(format!("the tensor {name} is not 2-D: {:?}", entry.shape)));
        };
        if first.checked_add(rows).is_none_or(|end| end > height) {
            return Err(self.invalid(format!(
                "rows {first}..{} of {name}, which has {height}",
                first.saturating_add(rows)
            )));
        }
        out.clear();
        self.read_elements_into(entry, first * cols, rows * cols, out)
    }

    fn read_elements_into(
        &self,
        entry: &Entry,
        skip: usize,
        count: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let width = entry.dtype.width();
        out.reserve(count);
        // In chunks of at most 64 KiB, so that no second full-size byte buffer exists (and
        // the chunk stays below the allocator's default threshold for a mapping of its own).
        let mut buf = vec![0u8; (count * width).clamp(4, 1 << 16)];
        let mut offset = entry.start + (skip * width) as u64;
        let mut left = count * width;
        while left > 0 {
            let n = left.min(buf.len() / width * width);
            self.source
                .read_at(offset, &mut buf[..n])
                .map_err(|source| Error::Io {
                    path: self.path.clone(),
                    source,
                })?;
            entry.dtype.decode_into(&buf[..n], out);
            offset += n as u64;
            left -= n;
        }
        Ok(())
    }
}

/// The header's float tensors (each checked to fit a file of `file_len` bytes), the
/// checkpoint's prefix, and every ModernBERT tensor checked against `config`; entries with
/// absolute offsets. For [`Safetensors`] and for the loader that receives the file as a stream.
pub(crate) fn parse_header_for(
    path: &Path,
    header: &[u8],
    data_start: u64,
    file_len: u64,
    config: &ModelConfig,
) -> Result<(HashMap<String, Entry>, &'static str)> {
    let entries = safetensors::parse_header(path, header, data_start, file_len)?;
    let prefix = ruri_core::checkpoint_prefix(path, |name| entries.contains_key(name))?;
    check_tensors(path, &entries, prefix, config)?;
    let entries = entries
        .into_iter()
        .map(|(name, e)| {
            // `data_start + end` was checked to be within the file.
            let start = data_start + e.start;
            let (dtype, shape) = (e.dtype, e.shape);
            (
                name,
                Entry {
                    dtype,
                    shape,
                    start,
                },
            )
        })
        .collect();
    Ok((entries, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Arc<[u8]> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + data, 0);
        bytes.into()
    }

    fn open(bytes: Arc<[u8]>) -> Result<Safetensors> {
        let config = ModelConfig::from_json_str(
            r#"{"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 16, "vocab_size": 10}"#,
            "config.json",
        )
        .unwrap();
        Safetensors::from_bytes("model.safetensors".into(), bytes, &config)
    }

    /// Whole files with broken headers: each a typed error naming the problem.
    #[test]
    fn broken_files_are_typed_errors() {
        let reason = |bytes: Arc<[u8]>| match open(bytes) {
            Err(Error::InvalidConfig { reason, .. }) => reason,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        assert!(reason(Arc::from(&[1u8, 2][..])).contains("shorter than"));
        // A header length past the end of the file, and one that overflows with its prefix.
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(reason(huge.into()).contains("header of"));
        assert!(reason(file("{nope", 0)).contains("not JSON"));
        assert!(reason(file("{}", 0)).contains("not a ModernBERT checkpoint"));
        let only_embeddings = r#"{"embeddings.tok_embeddings.weight":{"dtype":"F32","shape":[10,8],"data_offsets":[0,320]}}"#;
        assert!(reason(file(only_embeddings, 320)).contains("embeddings.norm.weight is missing"));
        let wrong_shape = r#"{"model.embeddings.tok_embeddings.weight":{"dtype":"F32","shape":[10,4],"data_offsets":[0,160]}}"#;
        assert!(reason(file(wrong_shape, 160)).contains("has shape [10, 4]"));
        // The data of a tensor past the end of the bytes.
        assert!(reason(file(only_embeddings, 100)).contains("does not fit"));
    }
}
