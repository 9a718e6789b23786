//! Reading ModernBERT weights from `model.safetensors` for the fused graph, and preparing
//! them: transposed for `MatMul`, optionally smoothed (an exact fp32 rescaling that moves an
//! activation outlier channel into the weights) and quantized to int8 per output channel.
//!
//! The file is read with plain reads, tensor by tensor (no memory map): a mapped file counts
//! in the process's resident memory for every page touched, and every page is touched.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use ruri_core::safetensors::{
    Dtype, TensorEntry as Entry, check_tensors, data_start, parse_header,
};
use ruri_core::{Error, ModelConfig, Result};

/// An open `model.safetensors`: its header, and the file to read tensors from.
pub(crate) struct Safetensors {
    path: PathBuf,
    file: File,
    data_start: u64,
    entries: HashMap<String, Entry>,
    prefix: &'static str,
}

impl std::fmt::Debug for Safetensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Safetensors")
            .field("path", &self.path)
            .field("tensors", &self.entries.len())
            .finish()
    }
}

impl Safetensors {
    /// Opens the file and checks every tensor ModernBERT needs against `config`: a mismatch
    /// is [`Error::InvalidConfig`] naming the tensor.
    pub(crate) fn open(path: &Path, config: &ModelConfig) -> Result<Self> {
        let io = |source: std::io::Error| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let mut file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut len = [0u8; 8];
        file.read_exact(&mut len)
            .map_err(|_| invalid("shorter than a safetensors header".into()))?;
        let header_len = u64::from_le_bytes(len);
        let data_start = data_start(path, header_len, file_len)?;
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header).map_err(io)?;
        let entries = parse_header(path, &header, data_start, file_len)?;
        let prefix = ruri_core::checkpoint_prefix(path, |name| entries.contains_key(name))?;
        check_tensors(path, &entries, prefix, config)?;
        let this = Self {
            path: path.to_path_buf(),
            file,
            data_start,
            entries,
            prefix,
        };
        Ok(this)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A 2-D tensor's entry and shape.
    fn matrix(&self, name: &str) -> Result<(&Entry, usize, usize)> {
        let full = format!("{}{name}", self.prefix);
        let entry = self
            .entries
            .get(&full)
            .ok_or_else(|| Error::InvalidConfig {
                path: self.path.clone(),
                reason: format!("the tensor {full} is missing"),
            })?;
        let [rows, cols] = entry.shape[..] else {
            return Err(Error::InvalidConfig {
                path: self.path.clone(),
                reason: format!("the tensor {full} is not 2-D: {:?}", entry.shape),
            });
        };
        Ok((entry, rows, cols))
    }

    /// A 2-D tensor (name without prefix) whose rows are read when asked for.
    pub(crate) fn file_rows(&self, name: &str) -> Result<FileRows> {
        let (entry, rows, cols) = self.matrix(name)?;
        let file = self.file.try_clone().map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(FileRows {
            path: self.path.clone(),
            file,
            start: self.data_start + entry.start,
            dtype: entry.dtype,
            rows,
            cols,
        })
    }

    /// A 2-D tensor (name without prefix) mapped in place: nothing is read now, and only the
    /// pages of the rows used become resident.
    pub(crate) fn map(&self, name: &str) -> Result<MappedRows> {
        let (entry, rows, cols) = self.matrix(name)?;
        // SAFETY: the file is mapped read-only. Like every user of a memory map (candle and
        // safetensors included) this relies on nobody truncating or rewriting the file while
        // the embedder lives; the offsets were checked against the file's length at open.
        let map = unsafe { memmap2::Mmap::map(&self.file) }.map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        // The file may have shrunk since it was opened: the tensor must lie in the mapping.
        let start = usize::try_from(self.data_start + entry.start)
            .ok()
            .filter(|&s| s.checked_add(entry.bytes()).is_some_and(|e| e <= map.len()))
            .ok_or_else(|| Error::InvalidConfig {
                path: self.path.clone(),
                reason: format!("the data of {name} is past the end of the file"),
            })?;
        Ok(MappedRows {
            map,
            start,
            dtype: entry.dtype,
            rows,
            cols,
        })
    }

    /// Reads a tensor (name without prefix) as f32, row-major.
    pub(crate) fn read(&mut self, name: &str) -> Result<Vec<f32>> {
        let full = format!("{}{name}", self.prefix);
        let entry = self
            .entries
            .get(&full)
            .cloned()
            .ok_or_else(|| Error::InvalidConfig {
                path: self.path.clone(),
                reason: format!("the tensor {full} is missing"),
            })?;
        let io = |source: std::io::Error| Error::Io {
            path: self.path.clone(),
            source,
        };
        self.file
            .seek(SeekFrom::Start(self.data_start + entry.start))
            .map_err(io)?;
        let mut out = Vec::with_capacity(entry.count());
        // In chunks, so that no second full-size byte buffer exists.
        let mut buf = vec![0u8; entry.bytes().clamp(4, 1 << 20)];
        let width = entry.dtype.width();
        let mut left = entry.bytes();
        while left > 0 {
            let n = left.min(buf.len() / width * width);
            self.file.read_exact(&mut buf[..n]).map_err(io)?;
            entry.dtype.decode_into(&buf[..n], &mut out);
            left -= n;
        }
        Ok(out)
    }
}

/// A row-major 2-D tensor whose rows are read from the file one at a time, when asked for
/// (positional reads: no memory map, so nothing of the file counts as this process's memory).
pub(crate) struct FileRows {
    path: PathBuf,
    file: File,
    start: u64,
    dtype: Dtype,
    rows: usize,
    cols: usize,
}

impl FileRows {
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r` (< `rows()`) as f32, into `out` (cleared first).
    pub(crate) fn read_row(&self, r: usize, out: &mut Vec<f32>) -> Result<()> {
        if r >= self.rows {
            return Err(Error::ModelOutput {
                reason: format!("row {r} of a table of {} rows", self.rows),
            });
        }
        // No overflow: r · cols · width < rows · cols · width, the tensor's checked length.
        let width = self.dtype.width();
        let mut bytes = vec![0u8; self.cols * width];
        let offset = self.start + (r * self.cols * width) as u64;
        read_at(&self.file, &mut bytes, offset).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        out.clear();
        self.dtype.decode_into(&bytes, out);
        Ok(())
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// A row-major 2-D tensor read in place from the mapped file.
pub(crate) struct MappedRows {
    map: memmap2::Mmap,
    start: usize,
    dtype: Dtype,
    rows: usize,
    cols: usize,
}

impl MappedRows {
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Appends row `r` (< `rows()`, which the caller checks) as f32.
    pub(crate) fn push_row(&self, r: usize, out: &mut Vec<f32>) {
        // In bounds: r < rows, and `map` checked that the whole tensor lies in the mapping.
        let width = self.dtype.width();
        let begin = self.start + r * self.cols * width;
        self.dtype
            .decode_into(&self.map[begin..begin + self.cols * width], out);
    }
}

/// `w` (`rows × cols`, row-major; rows are output channels as in `nn.Linear`) transposed to
/// `cols × rows`, the `K × N` layout `MatMul` takes.
pub(crate) fn transpose(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = w[r * cols + c];
        }
    }
    out
}

/// The largest magnitude of an int8 weight. 63, not 127: x86's fast u8 × s8 instruction
/// (`vpmaddubsw`, what ONNX Runtime's MLAS uses without VNNI) adds two u8 · s8 products in
/// 16 bits and saturates above 32,767; with |w| ≤ 63, 2 · 255 · 63 = 32,130 never does, so
/// the integer result is exact, and the same on every x86 CPU.
pub(crate) const WEIGHT_LEVELS: f32 = 63.0;

/// A `K × N` weight quantized per output column: `w[k][n] ≈ q[k][n] · scale[n]`.
pub(crate) struct QuantizedWeight {
    pub(crate) q: Vec<i8>,
    pub(crate) scale: Vec<f32>,
}

/// Symmetric per-column quantization of a `K × N` row-major matrix.
pub(crate) fn quantize_columns(w: &[f32], k: usize, n: usize) -> QuantizedWeight {
    let mut max = vec![0f32; n];
    for row in w.chunks_exact(n) {
        for (m, &x) in max.iter_mut().zip(row) {
            *m = m.max(x.abs());
        }
    }
    let scale: Vec<f32> = max
        .iter()
        .map(|&m| if m > 0.0 { m / WEIGHT_LEVELS } else { 1.0 })
        .collect();
    let inv: Vec<f32> = scale.iter().map(|s| 1.0 / s).collect();
    let mut q = Vec::with_capacity(k * n);
    for row in w.chunks_exact(n) {
        q.extend(
            row.iter()
                .zip(&inv)
                .map(|(&x, &i)| (x * i).round().clamp(-WEIGHT_LEVELS, WEIGHT_LEVELS) as i8),
        );
    }
    QuantizedWeight { q, scale }
}

/// Smoothing factors for the input channels of a linear that reads a LayerNorm's output
/// (`weight`: its `nn.Linear` matrix, `out × inp`).
///
/// Trained transformers keep small the weights that read a massive-activation channel, and
/// such a channel takes a per-row int8 scale for itself alone. So an input channel whose
/// largest weight is under a quarter of the typical (median) one is divided by
/// `s = sqrt(median / largest)` in the norm's weight, and its weight rows are multiplied by
/// `s`: exact in fp32 (the product is unchanged), and the scaled rows stay under the typical
/// largest weight, so the per-column weight scales do not grow.
pub(crate) fn smoothing(weight: &[f32], inp: usize) -> Vec<f32> {
    let mut largest = vec![0f32; inp];
    for row in weight.chunks_exact(inp) {
        for (m, &x) in largest.iter_mut().zip(row) {
            *m = m.max(x.abs());
        }
    }
    let mut sorted = largest.clone();
    sorted.sort_by(f32::total_cmp);
    let median = sorted[inp / 2];
    largest
        .iter()
        .map(|&m| {
            if m > 0.0 && m < median / 4.0 {
                (median / m).sqrt()
            } else {
                1.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_moves_every_element() {
        let w: Vec<f32> = (0..6).map(|x| x as f32).collect(); // 2 × 3
        assert_eq!(transpose(&w, 2, 3), vec![0., 3., 1., 4., 2., 5.]);
    }

    #[test]
    fn quantized_columns_reconstruct_within_half_a_step() {
        let (k, n) = (5, 3);
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.01 * (1 + i % n) as f32)
            .collect();
        let qw = quantize_columns(&w, k, n);
        for r in 0..k {
            for c in 0..n {
                let back = f32::from(qw.q[r * n + c]) * qw.scale[c];
                assert!((back - w[r * n + c]).abs() <= qw.scale[c] / 2.0 + 1e-7);
                assert!(qw.q[r * n + c].unsigned_abs() <= 63);
            }
        }
        // Each column's largest magnitude maps to ±63.
        for c in 0..n {
            assert!((0..k).any(|r| qw.q[r * n + c].unsigned_abs() == 63));
        }
    }

    #[test]
    fn smoothing_lifts_only_weakly_read_channels() {
        // A 5 × 8 linear reading 8 channels; channel 3 is read with weights 1/36 of the
        // others, channel 5 with half.
        let mut w: Vec<f32> = (0..5 * 8)
            .map(|i| if i < 24 { 1.0 } else { -1.0 })
            .collect();
        for row in w.chunks_exact_mut(8) {
            row[3] /= 36.0;
            row[5] /= 2.0;
        }
        let s = smoothing(&w, 8);
        assert!((s[3] - 6.0).abs() < 1e-5, "{s:?}");
        assert!(
            s.iter().enumerate().all(|(i, &v)| i == 3 || v == 1.0),
            "{s:?}"
        );
    }
}
