//! The checked parts of a `model.safetensors` reader, shared by the backends that read the
//! file themselves (ruri-ort's fused graph, ruri-native): the header's length, its entries
//! and the float dtypes. Every offset and size is computed in checked arithmetic, so a
//! crafted header (offsets that wrap, a start past the end, a shape whose product overflows
//! or wraps to exactly the data's length) is a typed error in debug builds as in release,
//! never an overflow or an out-of-bounds slice later.

use std::collections::HashMap;
use std::path::Path;

use crate::{Error, ModelConfig, Result};

/// Headers larger than this are refused (the 310m model's is 16 KB).
pub const MAX_HEADER: u64 = 100 << 20;

/// The float dtypes a ModernBERT checkpoint stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dtype {
    /// `F32`.
    F32,
    /// `F16`.
    F16,
    /// `BF16`.
    Bf16,
}

impl Dtype {
    /// Bytes per element.
    pub fn width(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// Appends the elements of `bytes` (whole elements, little-endian) to `out` as f32.
    pub fn decode_into(self, bytes: &[u8], out: &mut Vec<f32>) {
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

/// One float tensor of the header. Its invariant, checked by [`parse_header`]: the element
/// count times the width is `end − start` and fits in `usize`, and `data_start + end` is
/// within the file. So every product of its dimensions, and every offset inside it, can be
/// computed later without overflow.
/// `D`: the dtypes the reader knows ([`Dtype`] for a checkpoint's floats;
/// [`parse_header_with`] takes others).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry<D = Dtype> {
    /// The dtype.
    pub dtype: D,
    /// The shape.
    pub shape: Vec<usize>,
    /// First byte, relative to the start of the data.
    pub start: u64,
    /// One past the last byte, relative to the start of the data.
    pub end: u64,
}

impl<D> TensorEntry<D> {
    /// The element count (cannot overflow: checked at parse).
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The byte length (cannot overflow: checked at parse).
    pub fn bytes(&self) -> usize {
        (self.end - self.start) as usize
    }
}

/// Where the data starts after a header of `header_len` bytes (the file's first 8 bytes, as
/// little-endian), in a file of `file_len` bytes: refused when the header is longer than
/// [`MAX_HEADER`] or than the file.
pub fn data_start(path: &Path, header_len: u64, file_len: u64) -> Result<u64> {
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

/// The float tensors of the header JSON `header`, each checked to fit a file of `file_len`
/// bytes whose data starts at `data_start`. Tensors of other dtypes (none in ModernBERT) are
/// left out: fine as long as they are not read.
pub fn parse_header(
    path: &Path,
    header: &[u8],
    data_start: u64,
    file_len: u64,
) -> Result<HashMap<String, TensorEntry>> {
    let float = |name: &str| {
        let dtype = match name {
            "F32" => Dtype::F32,
            "F16" => Dtype::F16,
            "BF16" => Dtype::Bf16,
            _ => return None,
        };
        Some((dtype, dtype.width()))
    };
    Ok(parse_header_with(path, header, data_start, file_len, float)?.0)
}

/// A header's `__metadata__`: string keys and values.
pub type Metadata = HashMap<String, String>;

/// The tensors of the header JSON `header` whose dtype `dtype` knows (it maps the header's
/// name, e.g. `"I8"`, to a dtype and its width in bytes; others are left out), each checked
/// as [`parse_header`] checks them, and the string entries of its `__metadata__` (empty when
/// it has none; values that are not strings are left out).
pub fn parse_header_with<D>(
    path: &Path,
    header: &[u8],
    data_start: u64,
    file_len: u64,
    dtype: impl Fn(&str) -> Option<(D, usize)>,
) -> Result<(HashMap<String, TensorEntry<D>>, Metadata)> {
    let invalid = |reason: String| Error::InvalidConfig {
        path: path.to_path_buf(),
        reason,
    };
    let header: HashMap<String, serde_json::Value> = serde_json::from_slice(header)
        .map_err(|e| invalid(format!("the safetensors header is not JSON: {e}")))?;
    let mut entries = HashMap::new();
    let mut metadata = HashMap::new();
    for (name, value) in header {
        if name == "__metadata__" {
            if let Some(object) = value.as_object() {
                for (key, value) in object {
                    if let Some(value) = value.as_str() {
                        metadata.insert(key.clone(), value.to_owned());
                    }
                }
            }
            continue;
        }
        let entry = parse_entry(&name, &value, data_start, file_len, &dtype).map_err(invalid)?;
        if let Some(entry) = entry {
            entries.insert(name, entry);
        }
    }
    Ok((entries, metadata))
}

/// Every tensor `config` implies is in `entries` (under `prefix`) with its shape, else
/// [`Error::InvalidConfig`] naming the tensor.
pub fn check_tensors(
    path: &Path,
    entries: &HashMap<String, TensorEntry>,
    prefix: &str,
    config: &ModelConfig,
) -> Result<()> {
    let invalid = |reason: String| Error::InvalidConfig {
        path: path.to_path_buf(),
        reason,
    };
    for (name, shape) in config.checkpoint_tensors() {
        let full = format!("{prefix}{name}");
        let entry = entries.get(&full).ok_or_else(|| {
            invalid(format!(
                "the tensor {full} is missing (or not a float tensor)"
            ))
        })?;
        if entry.shape != shape {
            return Err(invalid(format!(
                "the tensor {full} has shape {:?} but config.json implies {shape:?}",
                entry.shape
            )));
        }
    }
    Ok(())
}

/// One header entry: `None` for a tensor of a dtype `dtype` does not know; an error when it
/// is malformed or its offsets or shape do not fit the file.
fn parse_entry<D>(
    name: &str,
    value: &serde_json::Value,
    data_start: u64,
    file_len: u64,
    dtype: impl Fn(&str) -> Option<(D, usize)>,
) -> std::result::Result<Option<TensorEntry<D>>, String> {
    let bad = || format!("the header entry of {name} is malformed");
    let Some((dtype, width)) = dtype(
        value
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(bad)?,
    ) else {
        return Ok(None);
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
    // In usize: the count and the byte length are later used as `usize` (allocations,
    // slices), so they must fit there, not only in u64.
    let bytes = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_mul(width))
        .ok_or_else(misfit)?;
    let fits = end
        .checked_sub(start)
        .is_some_and(|len| u64::try_from(bytes).is_ok_and(|b| b == len))
        && data_start.checked_add(end).is_some_and(|e| e <= file_len);
    if !fits {
        return Err(misfit());
    }
    Ok(Some(TensorEntry {
        dtype,
        shape,
        start,
        end,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        json: &str,
        data_start: u64,
        file_len: u64,
    ) -> std::result::Result<Option<TensorEntry>, String> {
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        let float = |name: &str| match name {
            "F32" => Some((Dtype::F32, 4)),
            "F16" => Some((Dtype::F16, 2)),
            "BF16" => Some((Dtype::Bf16, 2)),
            _ => None,
        };
        parse_entry("t", &value, data_start, file_len, float)
    }

    #[test]
    fn well_formed_entries_parse() {
        let e = entry(
            r#"{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]}"#,
            100,
            116,
        )
        .unwrap()
        .unwrap();
        assert_eq!((e.shape.clone(), e.start, e.end), (vec![2, 3], 4, 16));
        assert_eq!((e.count(), e.bytes(), e.dtype), (6, 12, Dtype::Bf16));
        // A tensor of a dtype ModernBERT never has is skipped, not refused.
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

    /// One case per way a header's arithmetic can go wrong: each is refused with the
    /// "does not fit" message, in a debug build too (these overflowed, and panicked, before
    /// the arithmetic was checked).
    #[test]
    fn crafted_entries_are_refused_without_overflow() {
        let misfit = |json: &str| match entry(json, 8, 1008) {
            Err(reason) => assert!(reason.contains("does not fit"), "{json}: {reason}"),
            Ok(e) => panic!("accepted {json}: {e:?}"),
        };
        // Offsets that wrap: `data_start + end` overflows u64.
        misfit(
            r#"{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}"#,
        );
        misfit(r#"{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551615,3]}"#);
        // A start past the end (the range runs backwards).
        misfit(r#"{"dtype":"F32","shape":[1],"data_offsets":[12,8]}"#);
        // Past the end of the file (truncated after the header).
        misfit(r#"{"dtype":"F32","shape":[300],"data_offsets":[0,1200]}"#);
        // A shape whose element count overflows.
        misfit(r#"{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,0]}"#);
        misfit(r#"{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,8]}"#);
        // A count that fits but whose byte length overflows.
        misfit(r#"{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}"#);
        // A product that wraps to exactly the data's length: 2^62 · 4 + 8 ≡ 8 (mod 2^64), so
        // wrapping arithmetic would have accepted an 8-byte range for 2^62 + 2 elements.
        misfit(r#"{"dtype":"F32","shape":[4611686018427387906],"data_offsets":[0,8]}"#);
        misfit(r#"{"dtype":"BF16","shape":[9223372036854775812],"data_offsets":[0,8]}"#);
        // Not the size the shape says.
        misfit(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,4]}"#);
        // Malformed entries.
        for json in [
            r#"{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}"#,
            r#"{"dtype":"F32","shape":[1],"data_offsets":[0]}"#,
            r#"{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}"#,
            r#"{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551616]}"#,
            r#"{"shape":[1],"data_offsets":[0,4]}"#,
        ] {
            match entry(json, 8, 1008) {
                Err(reason) => assert!(reason.contains("malformed"), "{json}: {reason}"),
                Ok(e) => panic!("accepted {json}: {e:?}"),
            }
        }
    }

    #[test]
    fn other_dtypes_and_the_metadata_parse_on_request() {
        let header = br#"{"__metadata__":{"format":"x","n":3},
            "a":{"dtype":"I8","shape":[3],"data_offsets":[0,3]},
            "b":{"dtype":"F32","shape":[1],"data_offsets":[3,7]}}"#;
        let path = Path::new("f.safetensors");
        let int8 = |name: &str| (name == "I8").then_some(((), 1));
        let (entries, metadata) = parse_header_with(path, header, 8, 15, int8).unwrap();
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(entries["a"].bytes(), 3);
        // Non-string values are left out.
        assert_eq!(metadata, Metadata::from([("format".into(), "x".into())]));
        // The same checks: an I8 tensor past the end of the file.
        assert!(parse_header_with(path, header, 8, 10, int8).is_err());
        // The float reader skips the I8 tensor.
        assert_eq!(parse_header(path, header, 8, 15).unwrap().len(), 1);
    }

    #[test]
    fn header_lengths_are_checked() {
        let path = Path::new("model.safetensors");
        assert_eq!(data_start(path, 16, 100).unwrap(), 24);
        assert!(data_start(path, 93, 100).is_err());
        assert!(data_start(path, u64::MAX, u64::MAX).is_err());
        assert!(data_start(path, MAX_HEADER + 1, u64::MAX).is_err());
        let err = parse_header(path, b"{nope", 8, 8).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
    }

    #[test]
    fn the_float_dtypes_decode() {
        let mut out = Vec::new();
        Dtype::F32.decode_into(&1.5f32.to_le_bytes(), &mut out);
        Dtype::F16.decode_into(&half::f16::from_f32(-2.0).to_le_bytes(), &mut out);
        Dtype::Bf16.decode_into(&half::bf16::from_f32(0.25).to_le_bytes(), &mut out);
        assert_eq!(out, vec![1.5, -2.0, 0.25]);
    }
}
