//! Quantized vectors for smaller indexes, byte for byte as sentence-transformers'
//! `quantize_embeddings` makes them (`sentence_transformers.quantization`):
//!
//! * [`Quantization::Int8`] / [`Quantization::Uint8`]: per dimension, the range
//!   `[min, max]` ([`QuantizationRanges`]: from a calibration set, or from the vectors
//!   themselves) cut into 255 steps, `q = clamp(floor((x − min) / step), 0, 255)`, minus 128
//!   for int8 (all in f32, as NumPy computes it; a zero-width range has step 1);
//! * [`Quantization::Binary`] / [`Quantization::Ubinary`]: one bit per dimension,
//!   `x > 0`, packed eight to a byte, first dimension in the high bit (NumPy's
//!   `packbits`), the last byte zero-padded; binary stores each byte minus 128 as int8.
//!
//! ```
//! use ruri_core::{Embeddings, Quantization, QuantizationRanges};
//!
//! let e = Embeddings::from_parts(
//!     vec![0.5, -0.25, 0.0, 1.0, -1.0, 0.25, 0.75, -0.5],
//!     4,
//!     vec![3, 3],
//!     vec![false, false],
//! )?;
//! let bits = e.quantize(Quantization::Ubinary, None)?;
//! assert_eq!(bits.row(0), Some(&[0b1001_0000][..]));
//! // int8 with ranges from a calibration set (here: the vectors themselves).
//! let ranges = QuantizationRanges::from_embeddings(&e)?;
//! let q = e.quantize(Quantization::Int8, Some(&ranges))?;
//! assert_eq!(q.to_i8().unwrap()[..4], [127, -128, -128, 127]);
//! # Ok::<(), ruri_core::Error>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::{Embeddings, Error, Result};

/// A precision of [`Embeddings::quantize`], named as sentence-transformers names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Quantization {
    /// One signed byte per dimension (range-based, minus 128).
    Int8,
    /// One unsigned byte per dimension (range-based).
    Uint8,
    /// One bit per dimension, bytes stored minus 128 as signed bytes.
    Binary,
    /// One bit per dimension, bytes as they are.
    Ubinary,
}

impl Quantization {
    /// Every precision.
    pub const ALL: [Quantization; 4] = [
        Quantization::Int8,
        Quantization::Uint8,
        Quantization::Binary,
        Quantization::Ubinary,
    ];

    /// sentence-transformers' name (`"int8"`, `"uint8"`, `"binary"`, `"ubinary"`).
    pub fn name(self) -> &'static str {
        match self {
            Quantization::Int8 => "int8",
            Quantization::Uint8 => "uint8",
            Quantization::Binary => "binary",
            Quantization::Ubinary => "ubinary",
        }
    }

    /// Whether the bytes are signed (int8, binary).
    pub fn is_signed(self) -> bool {
        matches!(self, Quantization::Int8 | Quantization::Binary)
    }

    /// Whether it needs [`QuantizationRanges`] (int8, uint8).
    pub fn uses_ranges(self) -> bool {
        matches!(self, Quantization::Int8 | Quantization::Uint8)
    }

    /// Bytes of one quantized vector of `dim` dimensions.
    pub fn bytes_per_vector(self, dim: usize) -> usize {
        if self.uses_ranges() {
            dim
        } else {
            dim.div_ceil(8)
        }
    }
}

impl fmt::Display for Quantization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Quantization {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Quantization::ALL
            .into_iter()
            .find(|q| q.name() == s)
            .ok_or_else(|| Error::InvalidOption {
                name: "precision",
                value: s.to_owned(),
                reason: "expected int8, uint8, binary or ubinary",
            })
    }
}

/// Per-dimension `[min, max]` of int8 and uint8 quantization: sentence-transformers'
/// `ranges` (shape `(2, dim)`), or what it computes from `calibration_embeddings`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizationRanges {
    min: Vec<f32>,
    max: Vec<f32>,
}

impl QuantizationRanges {
    /// Explicit ranges; refused unless both have the same non-zero length and every bound is
    /// finite with `min ≤ max`.
    pub fn new(min: Vec<f32>, max: Vec<f32>) -> Result<Self> {
        let refuse = |reason| Error::InvalidOption {
            name: "ranges",
            value: format!("{} minimums, {} maximums", min.len(), max.len()),
            reason,
        };
        if min.is_empty() || min.len() != max.len() {
            return Err(refuse("needs one minimum and one maximum per dimension"));
        }
        if !min.iter().chain(&max).all(|v| v.is_finite()) {
            return Err(refuse("every bound must be finite"));
        }
        if min.iter().zip(&max).any(|(a, b)| a > b) {
            return Err(refuse("a minimum is above its maximum"));
        }
        Ok(Self { min, max })
    }

    /// The per-dimension minimum and maximum of `vectors` (`len × dim`, row-major), as
    /// sentence-transformers computes them from calibration embeddings. At least two
    /// vectors, all finite (sentence-transformers refuses one as well).
    pub fn from_vectors(vectors: &[f32], dim: usize) -> Result<Self> {
        if dim == 0 || !vectors.len().is_multiple_of(dim) || vectors.len() / dim < 2 {
            return Err(Error::InvalidOption {
                name: "calibration",
                value: format!("{} values of width {dim}", vectors.len()),
                reason: "ranges need at least two vectors of the embedding's width",
            });
        }
        let mut min = vectors[..dim].to_vec();
        let mut max = min.clone();
        for row in vectors.chunks_exact(dim).skip(1) {
            for ((lo, hi), &v) in min.iter_mut().zip(max.iter_mut()).zip(row) {
                *lo = lo.min(v);
                *hi = hi.max(v);
            }
        }
        if !vectors.iter().all(|v| v.is_finite()) {
            return Err(Error::InvalidOption {
                name: "calibration",
                value: format!("{} values of width {dim}", vectors.len()),
                reason: "a calibration vector has a value that is not finite",
            });
        }
        Self::new(min, max)
    }

    /// [`from_vectors`](Self::from_vectors) of an embedder's result.
    pub fn from_embeddings(embeddings: &Embeddings) -> Result<Self> {
        Self::from_vectors(embeddings.as_slice(), embeddings.dim())
    }

    /// The minimum of each dimension.
    pub fn min(&self) -> &[f32] {
        &self.min
    }

    /// The maximum of each dimension.
    pub fn max(&self) -> &[f32] {
        &self.max
    }

    /// The number of dimensions.
    pub fn dim(&self) -> usize {
        self.min.len()
    }
}

/// Quantized vectors: [`len`](Self::len) rows of
/// [`Quantization::bytes_per_vector`] bytes each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizedEmbeddings {
    precision: Quantization,
    dim: usize,
    row_bytes: usize,
    data: Vec<u8>,
}

impl QuantizedEmbeddings {
    /// The precision.
    pub fn precision(&self) -> Quantization {
        self.precision
    }

    /// The number of vectors.
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.row_bytes).unwrap_or(0)
    }

    /// Whether there are no vectors.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Dimensions of the vectors before quantization.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bytes per vector.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Vector `i`'s bytes (a signed precision's values as their two's-complement bytes).
    pub fn row(&self, i: usize) -> Option<&[u8]> {
        self.data
            .get(i * self.row_bytes..(i + 1) * self.row_bytes)
            .filter(|_| i < self.len())
    }

    /// Every byte, row-major: what a `.npy` of the precision's dtype holds.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    /// The values as signed bytes (int8 and binary; `None` for the unsigned precisions).
    pub fn to_i8(&self) -> Option<Vec<i8>> {
        self.precision
            .is_signed()
            .then(|| self.data.iter().map(|&b| b as i8).collect())
    }

    /// The bytes, row-major.
    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }
}

impl Embeddings {
    /// Quantizes every vector as sentence-transformers' `quantize_embeddings` does (see
    /// [the module](crate::quantize)). int8 and uint8 take `ranges` (from a calibration set:
    /// recommended), or compute them from these vectors when `None` (at least two needed,
    /// as sentence-transformers requires); binary and ubinary ignore `ranges`.
    ///
    /// Errors ([`Error::InvalidOption`]): ranges of another width, too few vectors to
    /// compute ranges from, or a value that is not finite (int8 and uint8).
    pub fn quantize(
        &self,
        precision: Quantization,
        ranges: Option<&QuantizationRanges>,
    ) -> Result<QuantizedEmbeddings> {
        let dim = self.dim();
        let row_bytes = precision.bytes_per_vector(dim);
        let mut data = Vec::with_capacity(self.len() * row_bytes);
        if precision.uses_ranges() {
            let own;
            let ranges = match ranges {
                Some(r) => r,
                None => {
                    own = QuantizationRanges::from_embeddings(self)?;
                    &own
                }
            };
            if ranges.dim() != dim {
                return Err(Error::InvalidOption {
                    name: "ranges",
                    value: format!("{} dimensions", ranges.dim()),
                    reason: "the ranges have another width than the vectors",
                });
            }
            if !self.as_slice().iter().all(|v| v.is_finite()) {
                return Err(Error::InvalidOption {
                    name: "embeddings",
                    value: format!("{} vectors", self.len()),
                    reason: "a vector has a value that is not finite",
                });
            }
            // NumPy, in f32: steps = (max − min) / 255, 1 where 0; floor((x − min) / step).
            let steps: Vec<f32> = ranges
                .min
                .iter()
                .zip(&ranges.max)
                .map(|(&lo, &hi)| match (hi - lo) / 255.0 {
                    0.0 => 1.0,
                    s => s,
                })
                .collect();
            let offset = if precision == Quantization::Int8 {
                128.0
            } else {
                0.0
            };
            for row in self.iter() {
                for ((&x, &lo), &step) in row.iter().zip(&ranges.min).zip(&steps) {
                    let q = ((x - lo) / step).floor().clamp(0.0, 255.0) - offset;
                    // An integer in [−128, 255]: exact; int8 as its two's-complement byte.
                    data.push(q as i16 as u8);
                }
            }
        } else {
            let flip = if precision == Quantization::Binary {
                0x80
            } else {
                0
            };
            for row in self.iter() {
                for chunk in row.chunks(8) {
                    let byte = chunk
                        .iter()
                        .enumerate()
                        .fold(0u8, |b, (i, &x)| b | (u8::from(x > 0.0) << (7 - i)));
                    // packbits(x > 0) − 128 as int8 is the byte with its high bit flipped.
                    data.push(byte ^ flip);
                }
            }
        }
        Ok(QuantizedEmbeddings {
            precision,
            dim,
            row_bytes,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn embeddings(data: Vec<f32>, dim: usize) -> Embeddings {
        let n = data.len() / dim;
        Embeddings::from_parts(data, dim, vec![1; n], vec![false; n]).unwrap()
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for q in Quantization::ALL {
            assert_eq!(q.name().parse::<Quantization>().unwrap(), q);
            assert_eq!(q.to_string(), q.name());
        }
        let err = "int4".parse::<Quantization>().unwrap_err();
        assert!(err.to_string().contains("int4"), "{err}");
    }

    #[test]
    fn bad_ranges_and_inputs_are_typed_errors() {
        let e = embeddings(vec![0.1, 0.2, 0.3, 0.4], 2);
        assert!(QuantizationRanges::new(vec![], vec![]).is_err());
        assert!(QuantizationRanges::new(vec![0.0], vec![1.0, 2.0]).is_err());
        assert!(QuantizationRanges::new(vec![1.0], vec![0.0]).is_err());
        assert!(QuantizationRanges::new(vec![f32::NAN], vec![0.0]).is_err());
        let narrow = QuantizationRanges::new(vec![0.0], vec![1.0]).unwrap();
        assert!(matches!(
            e.quantize(Quantization::Int8, Some(&narrow)),
            Err(Error::InvalidOption { name: "ranges", .. })
        ));
        // One vector: no ranges to compute (sentence-transformers refuses it too), but
        // binary needs none.
        let one = embeddings(vec![0.5, -0.5], 2);
        assert!(one.quantize(Quantization::Uint8, None).is_err());
        assert_eq!(
            one.quantize(Quantization::Binary, None).unwrap().to_i8(),
            Some(vec![(0b1000_0000u8 ^ 0x80) as i8])
        );
        let nan = embeddings(vec![0.5, f32::NAN, 0.1, 0.2], 2);
        let ranges = QuantizationRanges::new(vec![0.0, 0.0], vec![1.0, 1.0]).unwrap();
        assert!(nan.quantize(Quantization::Uint8, Some(&ranges)).is_err());
    }

    #[test]
    fn uint8_steps_clamp_and_zero_width_ranges() {
        // Range [0, 2.55] in dimension 0 (step 0.01), a zero-width range in dimension 1.
        let ranges = QuantizationRanges::new(vec![0.0, 0.5], vec![2.55, 0.5]).unwrap();
        let e = embeddings(vec![-1.0, 0.5, 0.015, 0.7, 9.0, 0.2], 2);
        let q = e.quantize(Quantization::Uint8, Some(&ranges)).unwrap();
        // Below the range: 0; 0.015 / 0.01 floors to 1; above: 255. Dimension 1 with step
        // 1: floor(0.0) = 0, floor(0.2) = 0, floor(−0.3) clamps to 0.
        assert_eq!(q.as_bytes(), &[0, 0, 1, 0, 255, 0]);
        let q = e.quantize(Quantization::Int8, Some(&ranges)).unwrap();
        assert_eq!(q.to_i8().unwrap(), vec![-128, -128, -127, -128, 127, -128]);
        assert_eq!(q.row(2), Some(&[127u8, 128][..]));
        assert_eq!(q.row(3), None);
    }
}
