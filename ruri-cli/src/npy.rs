//! NumPy's `.npy` format, version 1.0, for C-ordered 2-D arrays: the header `ruri embed`
//! writes, and the float32 calibration files it reads (`np.save("calib.npy", x)`).

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The element types ruri writes, by their NumPy `descr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// `<f4`
    F32,
    /// `|i1`
    I8,
    /// `|u1`
    U8,
}

impl Dtype {
    fn descr(self) -> &'static str {
        match self {
            Dtype::F32 => "<f4",
            Dtype::I8 => "|i1",
            Dtype::U8 => "|u1",
        }
    }
}

/// Writes the header of a `rows × cols` array; the rows follow, row-major, little-endian.
pub fn write_header(
    out: &mut impl Write,
    dtype: Dtype,
    rows: u64,
    cols: usize,
) -> std::io::Result<()> {
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': ({rows}, {cols}), }}",
        dtype.descr()
    );
    // Magic, version, header length, then the dict padded with spaces and ended by a newline
    // so that the data starts at a multiple of 64 bytes (what NumPy writes).
    let unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
    let padding = unpadded.next_multiple_of(64) - unpadded;
    let header_len = u16::try_from(dict.len() + padding + 1).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "npy header over 64 KiB")
    })?;
    out.write_all(MAGIC)?;
    out.write_all(&[1, 0])?;
    out.write_all(&header_len.to_le_bytes())?;
    out.write_all(dict.as_bytes())?;
    out.write_all(&vec![b' '; padding])?;
    out.write_all(b"\n")
}

/// A float32 matrix read from a `.npy` file: `rows × cols`, row-major.
#[derive(Debug)]
pub struct Matrix {
    /// The values.
    pub data: Vec<f32>,
    /// Columns (the embedding width).
    pub cols: usize,
}

/// Reads a 2-D float32 (`<f4`), C-ordered `.npy` file (version 1, 2 or 3).
pub fn read_f32(path: &Path) -> Result<Matrix, String> {
    let context = |what: String| format!("calibration file {}: {what}", path.display());
    let file = File::open(path).map_err(|e| context(e.to_string()))?;
    let mut reader = BufReader::new(file);
    let mut magic = [0u8; 8];
    reader
        .read_exact(&mut magic)
        .map_err(|_| context("not a .npy file (too short)".into()))?;
    if &magic[..6] != MAGIC {
        return Err(context("not a .npy file (no \\x93NUMPY magic)".into()));
    }
    let header_len = match magic[6] {
        1 => {
            let mut len = [0u8; 2];
            reader
                .read_exact(&mut len)
                .map_err(|e| context(e.to_string()))?;
            usize::from(u16::from_le_bytes(len))
        }
        2 | 3 => {
            let mut len = [0u8; 4];
            reader
                .read_exact(&mut len)
                .map_err(|e| context(e.to_string()))?;
            u32::from_le_bytes(len) as usize
        }
        v => return Err(context(format!(".npy version {v} is not one of 1, 2, 3"))),
    };
    if header_len > 1 << 20 {
        return Err(context(format!("a header of {header_len} bytes")));
    }
    let mut header = vec![0u8; header_len];
    reader
        .read_exact(&mut header)
        .map_err(|_| context("the header is cut short".into()))?;
    let header = String::from_utf8_lossy(&header);
    let field = |key: &str| -> Option<String> {
        let start = header.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = header[start..].trim_start().strip_prefix(':')?.trim_start();
        let end = if rest.starts_with('(') {
            rest.find(')')? + 1
        } else {
            rest.find([',', '}'])?
        };
        Some(rest[..end].trim().to_owned())
    };
    let descr = field("descr").ok_or_else(|| context("the header has no 'descr'".into()))?;
    if descr.trim_matches('\'') != "<f4" {
        return Err(context(format!(
            "dtype {descr}, not float32 ('<f4'): save it with np.save(path, x.astype(np.float32))"
        )));
    }
    if field("fortran_order").as_deref() != Some("False") {
        return Err(context(
            "a Fortran-ordered array (save a C-ordered one)".into(),
        ));
    }
    let shape = field("shape").ok_or_else(|| context("the header has no 'shape'".into()))?;
    let dims: Vec<usize> = shape
        .trim_matches(['(', ')'])
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| context(format!("shape {shape} is not a tuple of sizes")))?;
    let [rows, cols] = dims[..] else {
        return Err(context(format!(
            "shape {shape}: a calibration set is 2-D (vectors × dimensions)"
        )));
    };
    let values = rows
        .checked_mul(cols)
        .filter(|&n| n <= 1 << 30)
        .ok_or_else(|| context(format!("shape {shape} is too large")))?;
    let mut bytes = Vec::with_capacity(values * 4);
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| context(e.to_string()))?;
    if bytes.len() != values * 4 {
        return Err(context(format!(
            "shape {shape} needs {} data bytes, the file has {}",
            values * 4,
            bytes.len()
        )));
    }
    let data = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(Matrix { data, cols })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_starts_at_a_multiple_of_64() {
        for rows in [0u64, 7, 123_456_789_012] {
            let mut out = Vec::new();
            write_header(&mut out, Dtype::F32, rows, 256).unwrap();
            assert_eq!(out.len() % 64, 0);
            assert_eq!(out.last(), Some(&b'\n'));
            let len = u16::from_le_bytes([out[8], out[9]]) as usize;
            assert_eq!(10 + len, out.len());
        }
    }

    #[test]
    fn a_written_matrix_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.npy");
        let mut out = Vec::new();
        write_header(&mut out, Dtype::F32, 2, 3).unwrap();
        for v in [1.0f32, -2.5, 3.0, 0.0, 0.25, -1.0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        std::fs::write(&path, &out).unwrap();
        let m = read_f32(&path).unwrap();
        assert_eq!(m.cols, 3);
        assert_eq!(m.data, [1.0, -2.5, 3.0, 0.0, 0.25, -1.0]);
        // A cut file and a wrong dtype are refused with the reason.
        std::fs::write(&path, &out[..out.len() - 1]).unwrap();
        assert!(read_f32(&path).unwrap_err().contains("needs 24 data bytes"));
        let mut ints = Vec::new();
        write_header(&mut ints, Dtype::I8, 1, 1).unwrap();
        ints.push(3);
        std::fs::write(&path, &ints).unwrap();
        assert!(read_f32(&path).unwrap_err().contains("not float32"));
    }
}
