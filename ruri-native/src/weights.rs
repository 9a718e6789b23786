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

/// The tensor that tells whether a checkpoint stores its tensors under `model.`.
const PROBE: &str = "embeddings.tok_embeddings.weight";
/// Headers larger than this are refused (the 310m model's is 16 KB).
pub(crate) const MAX_HEADER: u64 = 100 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    pub(crate) fn width(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// Appends the elements of `bytes` (whole elements, little-endian) to `out` as f32.
    pub(crate) fn decode_into(self, bytes: &[u8], out: &mut Vec<f32>) {
        match self {
            Dtype::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            Dtype::F16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            Dtype::Bf16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
        }
    }
}

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
    fn len(&self) -> std::io::Result<u64> {
        match self {
            Source::File(f) => Ok(f.metadata()?.len()),
            Source::Bytes(b) => Ok(b.len() as u64),
        }
    }

    /// Fills `buf` from `offset` (positional: shared by threads without a lock).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
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

impl Safetensors {
    /// Opens a file.
    pub(crate) fn open(path: &Path, config: &ModelConfig) -> Result<Self> {
        let file = File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_source(path.to_path_buf(), Source::File(file), config)
    }

    /// Bytes already in memory; `label` names them in errors.
    pub(crate) fn from_bytes(
        label: PathBuf,
        bytes: Arc<[u8]>,
        config: &ModelConfig,
    ) -> Result<Self> {
        Self::from_source(label, Source::Bytes(bytes), config)
    }

    fn from_source(path: PathBuf, source: Source, config: &ModelConfig) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidConfig {
            path: path.clone(),
            reason,
        };
        let file_len = source.len().map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let mut len = [0u8; 8];
        source
            .read_at(0, &mut len)
            .map_err(|_| invalid("shorter than a safetensors header".into()))?;
        let header_len = u64::from_le_bytes(len);
        let data_start = data_start(&path, header_len, file_len)?;
        let mut header = vec![0u8; header_len as usize];
        source.read_at(8, &mut header).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let (entries, prefix) = parse_header(&path, &header, data_start, file_len)?;
        let this = Self {
            path,
            source,
            entries,
            prefix,
        };
        this.check_shapes(config)?;
        Ok(this)
    }

    /// Every ModernBERT tensor present, with the shape `config` implies.
    fn check_shapes(&self, config: &ModelConfig) -> Result<()> {
        for (name, shape) in config.checkpoint_tensors() {
            let entry = self.entry(&name)?;
            if entry.shape != shape {
                return Err(self.invalid(format!(
                    "the tensor {}{name} has shape {:?} but config.json implies {shape:?}",
                    self.prefix, entry.shape
                )));
            }
        }
        Ok(())
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
        let width = entry.dtype.width() as usize;
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

/// Where the data starts after a header of `header_len` bytes, in a file of `file_len`.
pub(crate) fn data_start(path: &Path, header_len: u64, file_len: u64) -> Result<u64> {
    header_len
        .checked_add(8)
        .filter(|&end| header_len <= MAX_HEADER && end <= file_len)
        .ok_or_else(|| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason: format!(
                "a safetensors header of {header_len} bytes in a file of {file_len} bytes"
            ),
        })
}

/// The header's float tensors (each checked to fit a file of `file_len` bytes), the
/// checkpoint's prefix, and every ModernBERT tensor checked against `config`: the checks
/// [`Safetensors`] makes, for a loader that receives the file as a stream.
pub(crate) fn parse_header_for(
    path: &Path,
    header: &[u8],
    data_start: u64,
    file_len: u64,
    config: &ModelConfig,
) -> Result<(HashMap<String, Entry>, &'static str)> {
    let (entries, prefix) = parse_header(path, header, data_start, file_len)?;
    let this = Safetensors {
        path: path.to_path_buf(),
        source: Source::Bytes(Arc::from(&[][..])),
        entries,
        prefix,
    };
    this.check_shapes(config)?;
    Ok((this.entries, this.prefix))
}

fn parse_header(
    path: &Path,
    header: &[u8],
    data_start: u64,
    file_len: u64,
) -> Result<(HashMap<String, Entry>, &'static str)> {
    let invalid = |reason: String| Error::InvalidConfig {
        path: path.to_path_buf(),
        reason,
    };
    let header: HashMap<String, serde_json::Value> = serde_json::from_slice(header)
        .map_err(|e| invalid(format!("the safetensors header is not JSON: {e}")))?;
    let mut entries = HashMap::new();
    for (name, value) in header {
        if name == "__metadata__" {
            continue;
        }
        let entry = parse_entry(&name, &value, data_start, file_len).map_err(invalid)?;
        if let Some(entry) = entry {
            entries.insert(name, entry);
        }
    }
    let prefix = if entries.contains_key(PROBE) {
        ""
    } else if entries.contains_key(&format!("model.{PROBE}")) {
        "model."
    } else {
        return Err(invalid(format!(
            "no {PROBE} tensor, with or without a `model.` prefix: not a ModernBERT checkpoint"
        )));
    };
    Ok((entries, prefix))
}

/// One header entry: `None` for a tensor of a dtype ModernBERT never has (fine as long as
/// it is not read); an error when its offsets or shape do not fit the file.
fn parse_entry(
    name: &str,
    value: &serde_json::Value,
    data_start: u64,
    file_len: u64,
) -> std::result::Result<Option<Entry>, String> {
    let bad = || format!("the header entry of {name} is malformed");
    let dtype = match value
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(bad)?
    {
        "F32" => Dtype::F32,
        "F16" => Dtype::F16,
        "BF16" => Dtype::Bf16,
        _ => return Ok(None),
    };
    let shape = value
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or_else(bad)?
        .iter()
        .map(|d| {
            d.as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(bad)
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let offsets = value
        .get("data_offsets")
        .and_then(|s| s.as_array())
        .filter(|o| o.len() == 2)
        .ok_or_else(bad)?;
    let (start, end) = (
        offsets[0].as_u64().ok_or_else(bad)?,
        offsets[1].as_u64().ok_or_else(bad)?,
    );
    let misfit = || {
        format!("the data of {name} ({start}..{end}) does not fit its shape {shape:?} or the file")
    };
    let bytes = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .and_then(|n| n.checked_mul(dtype.width()))
        .ok_or_else(misfit)?;
    let fits = end.checked_sub(start).is_some_and(|len| len == bytes)
        && data_start.checked_add(end).is_some_and(|e| e <= file_len);
    if !fits {
        return Err(misfit());
    }
    Ok(Some(Entry {
        dtype,
        shape,
        start: data_start + start,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        json: &str,
        data_start: u64,
        file_len: u64,
    ) -> std::result::Result<Option<Entry>, String> {
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        parse_entry("t", &value, data_start, file_len)
    }

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

    #[test]
    fn well_formed_entries_parse() {
        let e = entry(
            r#"{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}"#,
            100,
            124,
        )
        .unwrap()
        .unwrap();
        assert_eq!((e.shape, e.start), (vec![2, 3], 100));
        assert!(
            entry(
                r#"{"dtype":"I64","shape":[2],"data_offsets":[0,16]}"#,
                8,
                24
            )
            .unwrap()
            .is_none()
        );
    }

    /// Each crafted header is refused with a message, in debug builds too (no overflow
    /// panic) and whatever a wrapped product would have made of it.
    #[test]
    fn crafted_entries_are_refused() {
        let cases = [
            // A shape whose product overflows u64 and wraps to a small number.
            r#"{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}"#,
            r#"{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,8]}"#,
            // Offsets that wrap, or run backwards.
            r#"{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551615,3]}"#,
            r#"{"dtype":"F32","shape":[1],"data_offsets":[8,4]}"#,
            // The end past the file.
            r#"{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551616]}"#,
            r#"{"dtype":"F32","shape":[4],"data_offsets":[0,16]}"#,
            // Not the size the shape says.
            r#"{"dtype":"F32","shape":[2],"data_offsets":[0,4]}"#,
            // Malformed.
            r#"{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}"#,
            r#"{"dtype":"F32","shape":[1],"data_offsets":[0]}"#,
            r#"{"shape":[1],"data_offsets":[0,4]}"#,
        ];
        for json in cases {
            assert!(entry(json, 8, 20).is_err(), "accepted {json}");
        }
    }
}
