//! The linear layers (no bias in ModernBERT): fp32 through this crate's packed FMA GEMM
//! (`simd_f32::fp32_gemm`), or int8 through its exact kernels with the quantization and
//! dequantization around them.
//!
//! A call runs in three steps so that the steps around a layer fuse with it: each input row
//! is *staged* as the step before writes it ([`Linear::stage_row`]: a LayerNorm or the GeGLU
//! fills a row buffer that is quantized at once), the products of all staged rows are
//! computed ([`Linear::run`]), and each output row is dequantized into its destination
//! ([`Linear::row_out`]), or handed on while it is in cache ([`geglu_mlp`]).
//!
//! int8, step by step (`tools/testdata/int8_reference.py` implements the same in NumPy):
//! * weights: per output channel, symmetric, 8-bit: `s_w = max|w| / 127`,
//!   `q = rint(w · (127 / max|w|))`;
//! * activations: per token row, symmetric, 8-bit, the same formula over the row;
//! * `y = (f32(Σ q_x · q_w) · s_x) · s_w`, exact integers in between;
//! * outlier input channels (see [`detect_outliers`]) are left out of the int8 product and
//!   added in f32, LLM.int8()'s decomposition: `y += Σ_c x_c · w_c` in channel order;
//! * where some input channels write (almost) only one output channel (see
//!   [`detect_writers`]: the GeGLU units that feed a massive-activation channel), those
//!   columns and the others are two int8 products, each with its own per-row activation
//!   scale and per-output weight scales, added in that order: `out (+)= y_others`, then
//!   `out += y_writers`. One group's large values no longer set the other's step.

use std::sync::{Arc, Mutex, PoisonError};

use crate::helper::{Helper, Pieces};
use crate::kernels::aligned::Aligned;
use crate::kernels::{Kernel, PackedWeights, QuantRows, simd_f32};

/// An input channel is an outlier when its weight column's norm is below this fraction of
/// the median column norm: a channel that carries a massive activation is read by tiny
/// weights (what the model learned to do with it; the planted outlier of the test models
/// and the one real Ruri v3 models have, see testdata/README.md).
const OUTLIER_NORM_RATIO: f32 = 0.25;
/// At most this many outlier channels per layer (the rest of the columns stay int8).
const MAX_OUTLIERS: usize = 8;
/// An input channel is a writer when one output channel holds at least this share of its
/// weight column's squared norm.
const WRITER_SHARE: f64 = 0.5;

/// Below this many rows a layer runs on one thread: splitting costs more than it saves.
pub(crate) const PARALLEL_MIN_ROWS: usize = 4;
/// Rows staged and multiplied together: their products (`ROW_CHUNK × n` i32) stay in L2
/// for the epilogue (two of the microkernels' row blocks).
const ROW_CHUNK: usize = 96;
/// Products of at most this many rows share their columns with a helper thread, when the
/// call has one (a lone text the pool leaves to the caller's thread: see
/// [`crate::helper`]): at fp32 and with every int8 kernel but AMX. Halving the products paid
/// at every length measured (BENCHMARKS.md, seventh and eighth steps: 76 and 123 tokens, fp32
/// and the AVX-512 VNNI kernel).
pub(crate) const HELPER_MAX_ROWS: usize = 127;
/// With AMX only a query-sized product is shared: its products are so fast that splitting a
/// 76- or 123-token text's cost more than they saved (9–14 % slower: eighth step).
pub(crate) const HELPER_MAX_ROWS_AMX: usize = 32;

/// The most rows a product with `kernel` (`None`: fp32) shares with a helper.
pub(crate) fn helper_max_rows(kernel: Option<Kernel>) -> usize {
    match kernel {
        Some(Kernel::Amx) => HELPER_MAX_ROWS_AMX,
        _ => HELPER_MAX_ROWS,
    }
}
/// Rows are split evenly (the microkernels take tiles of any height up to theirs; a query
/// of 10 tokens splits 5 + 5 rather than 6 + 4).
const ROW_GRAIN: usize = 1;

/// How a layer's weights are held.
// A model holds a few of these (one per product of a layer): their size does not matter,
// and boxing `Split`'s halves would only add a pointer to follow.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Linear {
    Fp32 {
        /// Packed by `simd_f32::pack_fp32`, or by `simd_f32::pack_fp32_gated` (`2n × k`)
        /// when `gated`.
        w: Aligned<f32>,
        n: usize,
        k: usize,
        /// ModernBERT's Wi: the output is the GeGLU of the product, `n` wide (see
        /// [`Linear::fp32_gated`]).
        gated: bool,
    },
    Int8(Int8),
    /// Two int8 products over disjoint column groups (see [`detect_writers`]), each
    /// quantized on its own; `main` is added first.
    Split {
        main: Int8,
        side: Int8,
    },
}

/// One int8 product.
#[derive(Debug)]
pub(crate) struct Int8 {
    packed: PackedWeights,
    /// Input channels computed in f32, ascending (only with [`Columns::All`]).
    outliers: Vec<usize>,
    /// `outliers.len() × n`: their weights, one row per outlier channel.
    outlier_w: Vec<f32>,
    /// The input channels this product reads (`packed.k` of the `k_in` of x).
    columns: Columns,
    /// Width of the input rows.
    k_in: usize,
}

/// The input channels an int8 product reads.
#[derive(Debug)]
pub(crate) enum Columns {
    All,
    /// A contiguous run: read in place.
    Range(std::ops::Range<usize>),
    /// Ascending, gathered row by row.
    Pick(Vec<usize>),
}

impl Columns {
    fn from_sorted(columns: Vec<usize>) -> Self {
        match (columns.first(), columns.last()) {
            (Some(&a), Some(&b)) if b - a + 1 == columns.len() => Columns::Range(a..b + 1),
            _ => Columns::Pick(columns),
        }
    }
}

/// Quantizes `x` to `out` (symmetric 8-bit); returns the dequantization scale (0 for a zero
/// row, NaN for a row that is not finite) and the sum of the bytes written.
pub(crate) fn quantize_row(x: &[f32], out: &mut [i8]) -> (f32, i32) {
    let (max, sum) = simd_f32::quantize_row(x, out);
    let scale = if max == 0.0 {
        0.0
    } else if !max.is_finite() {
        f32::NAN
    } else {
        max / 127.0
    };
    (scale, sum)
}

/// Input channels that write one output channel: where that channel holds at least
/// [`WRITER_SHARE`] of the column's squared norm (zero columns excluded), ascending; empty
/// when none or all are.
pub(crate) fn detect_writers(w: &[f32], n: usize, k: usize) -> Vec<usize> {
    let mut total = vec![0.0f64; k];
    let mut max = vec![0.0f64; k];
    for row in w.chunks_exact(k).take(n) {
        for ((t, m), &v) in total.iter_mut().zip(max.iter_mut()).zip(row) {
            let e = f64::from(v) * f64::from(v);
            *t += e;
            *m = m.max(e);
        }
    }
    let found: Vec<usize> = (0..k)
        .filter(|&c| total[c] > 0.0 && max[c] / total[c] >= WRITER_SHARE)
        .collect();
    if found.len() == k { Vec::new() } else { found }
}

/// Input channels whose weight column norm is below [`OUTLIER_NORM_RATIO`] of the median
/// (at most [`MAX_OUTLIERS`], the smallest first chosen), ascending.
pub(crate) fn detect_outliers(w: &[f32], n: usize, k: usize) -> Vec<usize> {
    let mut norms = vec![0.0f64; k];
    for row in w.chunks_exact(k).take(n) {
        for (s, &v) in norms.iter_mut().zip(row) {
            *s += f64::from(v) * f64::from(v);
        }
    }
    let mut sorted = norms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[k / 2];
    let limit = median * f64::from(OUTLIER_NORM_RATIO * OUTLIER_NORM_RATIO);
    let mut found: Vec<usize> = (0..k).filter(|&c| norms[c] < limit).collect();
    found.sort_by(|&a, &b| norms[a].total_cmp(&norms[b]));
    found.truncate(MAX_OUTLIERS);
    found.sort_unstable();
    found
}

/// Grows `v` to at least `len` (new values `T::default()`); what it held is not cleared:
/// the callers overwrite what they read.
fn grow<T: Copy + Default>(v: &mut Aligned<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

/// One int8 product as quantization made it, in the weights' natural order: what ruri's int8
/// file stores (the kernel's packed layout is made from it at load, per kernel).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Int8Parts {
    /// Output channels.
    pub(crate) n: usize,
    /// Input channels of the product (`columns.len()` when `columns` is given).
    pub(crate) k: usize,
    /// `n × k`, row-major; outlier channels zero.
    pub(crate) q: Vec<i8>,
    /// One per output channel: `w ≈ q · s`.
    pub(crate) scales: Vec<f32>,
    /// Input channels computed in f32, ascending (only when `columns` is `None`).
    pub(crate) outliers: Vec<usize>,
    /// `outliers.len() × n`: their f32 weights, one row per outlier channel.
    pub(crate) outlier_w: Vec<f32>,
    /// The input channels read, ascending (a split's group); `None`: all `k`.
    pub(crate) columns: Option<Vec<usize>>,
}

/// A linear layer's int8 weights before packing: one product, or a split's two.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LinearParts {
    Int8(Int8Parts),
    Split { main: Int8Parts, side: Int8Parts },
}

/// `values` strictly ascending and below `limit`.
fn ascending_below(values: &[usize], limit: usize) -> bool {
    values.windows(2).all(|p| p[0] < p[1]) && values.last().is_none_or(|&v| v < limit)
}

impl Int8Parts {
    /// From `n × k` fp32 weights (their outlier columns are zeroed in place); `q` becomes
    /// the quantized weights (a buffer reused from layer to layer).
    fn quantize(w: &mut [f32], n: usize, k: usize, outliers: Vec<usize>, mut q: Vec<i8>) -> Self {
        let mut outlier_w = vec![0.0f32; outliers.len() * n];
        for (j, row) in w.chunks_exact_mut(k).enumerate() {
            for (i, &c) in outliers.iter().enumerate() {
                outlier_w[i * n + j] = row[c];
                row[c] = 0.0;
            }
        }
        q.clear();
        q.resize(n * k, 0);
        let scales = w
            .chunks_exact(k)
            .zip(q.chunks_exact_mut(k))
            .map(|(row, out)| quantize_row(row, out).0)
            .collect();
        Int8Parts {
            n,
            k,
            q,
            scales,
            outliers,
            outlier_w,
            columns: None,
        }
    }

    /// Why these parts (read from a file) cannot be a product over `k_in` input channels.
    fn check(&self, k_in: usize) -> Result<(), String> {
        let (n, k) = (self.n, self.k);
        if n.checked_mul(k) != Some(self.q.len()) || self.scales.len() != n {
            return Err(format!(
                "{} weights and {} scales for {n} × {k}",
                self.q.len(),
                self.scales.len()
            ));
        }
        if !ascending_below(&self.outliers, k)
            || self.outliers.len().checked_mul(n) != Some(self.outlier_w.len())
        {
            return Err(format!(
                "outlier channels {:?} (not ascending below {k}, or not one weight row each)",
                self.outliers
            ));
        }
        match &self.columns {
            None if k == k_in => Ok(()),
            Some(c) if c.len() == k && ascending_below(c, k_in) && self.outliers.is_empty() => {
                Ok(())
            }
            _ => Err(format!(
                "{k} input channels of {k_in} without their columns"
            )),
        }
    }
}

impl Int8 {
    /// Packs `parts` (checked) for `kernel`, over input rows `k_in` wide; their weight
    /// buffer goes back to `spare`.
    fn from_parts(
        kernel: Kernel,
        parts: Int8Parts,
        k_in: usize,
        spare: &mut Vec<i8>,
    ) -> Result<Self, String> {
        parts.check(k_in)?;
        let Int8Parts {
            n,
            k,
            q,
            scales,
            outliers,
            outlier_w,
            columns,
        } = parts;
        let packed = PackedWeights::pack(kernel, &q, n, k, scales);
        *spare = q;
        Ok(Int8 {
            packed,
            outliers,
            outlier_w,
            columns: columns.map_or(Columns::All, Columns::from_sorted),
            k_in,
        })
    }

    fn heap_bytes(&self) -> usize {
        self.packed.heap_bytes() + 4 * self.outlier_w.len()
    }

    /// Quantizes input row `r` (`k_in` wide, the call's own copy: its outlier channels are
    /// moved to `outlier_x`, `outliers.len()` values, and zeroed) into `q`.
    fn stage(
        &self,
        r: usize,
        row: &mut [f32],
        q: &mut QuantRows,
        outlier_x: &mut [f32],
        gather: &mut Vec<f32>,
    ) {
        for (o, &ch) in outlier_x.iter_mut().zip(&self.outliers) {
            *o = row[ch];
            row[ch] = 0.0;
        }
        let src: &[f32] = match &self.columns {
            Columns::All => row,
            Columns::Range(range) => &row[range.clone()],
            Columns::Pick(columns) => {
                gather.clear();
                gather.extend(columns.iter().map(|&ch| row[ch]));
                gather
            }
        };
        let kq = self.packed.k;
        let (scale, sum) = quantize_row(src, &mut q.row_mut(r)[..kq]);
        q.scales[r] = scale;
        q.sums[r] = sum;
    }

    /// The integer products of every staged row; with a helper, a few rows' columns are
    /// shared with it (see [`crate::helper`]), with the same values.
    fn run(
        &self,
        q: &QuantRows,
        acc: &mut Aligned<i32>,
        scratch: &mut Aligned<u8>,
        helper: Option<(&Helper, &mut Aligned<i32>)>,
    ) {
        let (rows, np) = (q.rows(), self.packed.n_padded);
        grow(acc, rows * np);
        const PIECE: usize = PackedWeights::COLUMN_PIECE;
        match helper {
            Some((helper, split))
                if rows <= helper_max_rows(Some(self.packed.kernel)) && np >= 2 * PIECE =>
            {
                // Two halves of whole PIECEs of columns (the second what is left), each a
                // block of `rows × width` in `split`, then put back in rows. Halves, because
                // each piece costs a kernel call (and AMX a tile configuration and a copy of
                // A): with pieces of 64 columns a query took 18 % longer on AMX than with no
                // helper at all, with quarters ≈ 10 % longer than with halves (BENCHMARKS.md,
                // sixth step).
                let half = np.div_ceil(2 * PIECE) * PIECE;
                let columns = [0, half, np];
                let bounds = columns.map(|c| c * rows);
                grow(split, rows * np);
                {
                    let pieces = Pieces::new(&mut split[..rows * np], &bounds);
                    let mine = Mutex::new(scratch);
                    helper.run(columns.len() - 1, &|i, worker| {
                        let out = pieces.take(i).expect("each piece is run once");
                        let cols = columns[i]..columns[i + 1];
                        let run = |s: &mut Aligned<u8>| self.packed.gemm_columns(q, cols, out, s);
                        match worker {
                            0 => run(&mut mine.lock().unwrap_or_else(PoisonError::into_inner)),
                            _ => run(&mut helper
                                .scratch
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)),
                        }
                    });
                }
                for (w, piece) in columns.windows(2).zip(bounds.windows(2)) {
                    let width = w[1] - w[0];
                    let block = &split[piece[0]..piece[1]];
                    for (r, src) in block.chunks_exact(width).enumerate() {
                        acc[r * np + w[0]..r * np + w[1]].copy_from_slice(src);
                    }
                }
            }
            _ => self.packed.gemm(q, acc, scratch),
        }
    }

    /// Row `r` of the output: `y = (f32(acc) · s_x) · s_w`, then `y += x_c · w_c` for each
    /// outlier channel in order, stored in or added to `out` (the outlier terms join y
    /// before y joins the residual). `xo`: row `r`'s outlier inputs.
    fn row_out(
        &self,
        r: usize,
        q: &QuantRows,
        acc: &[i32],
        xo: &[f32],
        out: &mut [f32],
        accumulate: bool,
    ) {
        let (n, np) = (self.packed.n, self.packed.n_padded);
        let (acc, sa, sw) = (&acc[r * np..r * np + n], q.scales[r], &self.packed.scales);
        if self.outliers.is_empty() {
            simd_f32::dequantize_row(acc, sa, sw, out, accumulate);
        } else {
            simd_f32::dequantize_outliers(acc, sa, sw, xo, &self.outlier_w, out, accumulate);
        }
    }
}

impl Int8 {
    /// Row `r` of `GeGLU(output)` into `out` (half the output's width): the two halves of
    /// the row that [`Int8::row_out`] would store, dequantized and put through the GeGLU in
    /// one pass, with the same bits.
    fn geglu_row(&self, r: usize, s: &LinearScratch, out: &mut [f32]) {
        let (n, np) = (self.packed.n, self.packed.n_padded);
        let no = self.outliers.len();
        let acc = &s.acc_main[r * np..r * np + n];
        let xo = &s.outlier_x[r * no..(r + 1) * no];
        let sa = s.main.scales[r];
        simd_f32::dequantize_geglu(acc, sa, &self.packed.scales, xo, &self.outlier_w, out);
    }
}

impl Linear {
    /// An fp32 layer from `n × k` weights.
    pub(crate) fn fp32(w: &[f32], n: usize, k: usize) -> Self {
        Linear::Fp32 {
            w: simd_f32::pack_fp32(w, n, k),
            n,
            k,
            gated: false,
        }
    }

    /// An fp32 gated layer from `2n × k` weights (ModernBERT's Wi: the input half's rows,
    /// then the gate half's): its output is `gelu(input) · gate`, `n` wide, with the bits of
    /// [`Linear::fp32`] followed by the GeGLU, but the product is never stored: the GEMM
    /// applies the GeGLU in its tiles.
    pub(crate) fn fp32_gated(w: &[f32], n: usize, k: usize) -> Self {
        Linear::Fp32 {
            w: simd_f32::pack_fp32_gated(w, n, k),
            n,
            k,
            gated: true,
        }
    }

    /// An int8 layer from `n × k` fp32 weights (their outlier columns are zeroed in place);
    /// `outliers` as [`detect_outliers`] gives. `q` is scratch, reused from layer to layer.
    #[cfg(test)]
    pub(crate) fn int8(
        kernel: Kernel,
        w: &mut [f32],
        n: usize,
        k: usize,
        outliers: Vec<usize>,
        q: &mut Vec<i8>,
    ) -> Self {
        let parts = Self::quantize_int8(w, n, k, outliers, q);
        Self::from_parts(kernel, parts, q).expect("quantize_int8 makes consistent parts")
    }

    /// An int8 layer's weights from `n × k` fp32 weights (their outlier columns are zeroed
    /// in place; `outliers` as [`detect_outliers`] gives), before packing.
    pub(crate) fn quantize_int8(
        w: &mut [f32],
        n: usize,
        k: usize,
        outliers: Vec<usize>,
        q: &mut Vec<i8>,
    ) -> LinearParts {
        LinearParts::Int8(Int8Parts::quantize(w, n, k, outliers, std::mem::take(q)))
    }

    /// Two int8 products from `n × k` fp32 weights: the columns `side` (ascending, as
    /// [`detect_writers`] gives) and the others, each quantized on its own. Contiguous
    /// groups are read in place (the loader permutes the MLP's units so that they are).
    #[cfg(test)]
    pub(crate) fn int8_split(
        kernel: Kernel,
        w: &[f32],
        n: usize,
        k: usize,
        side: Vec<usize>,
        q: &mut Vec<i8>,
    ) -> Self {
        let parts = Self::quantize_split(w, n, k, side, q);
        Self::from_parts(kernel, parts, q).expect("quantize_split makes consistent parts")
    }

    /// The weights of two int8 products from `n × k` fp32 weights (the columns `side`,
    /// ascending, and the others, each quantized on its own), before packing.
    pub(crate) fn quantize_split(
        w: &[f32],
        n: usize,
        k: usize,
        side: Vec<usize>,
        q: &mut Vec<i8>,
    ) -> LinearParts {
        let mut is_side = vec![false; k];
        side.iter().for_each(|&c| is_side[c] = true);
        let main: Vec<usize> = (0..k).filter(|&c| !is_side[c]).collect();
        let part = |columns: Vec<usize>, q: &mut Vec<i8>| {
            let mut sub = Vec::with_capacity(n * columns.len());
            for row in w.chunks_exact(k).take(n) {
                sub.extend(columns.iter().map(|&c| row[c]));
            }
            let mut part =
                Int8Parts::quantize(&mut sub, n, columns.len(), Vec::new(), std::mem::take(q));
            part.columns = Some(columns);
            part
        };
        LinearParts::Split {
            main: part(main, q),
            side: part(side, q),
        }
    }

    /// The layer `parts` make, packed for `kernel` (weight buffers back to `spare`); an
    /// error says why parts read from a file do not make one.
    pub(crate) fn from_parts(
        kernel: Kernel,
        parts: LinearParts,
        spare: &mut Vec<i8>,
    ) -> Result<Self, String> {
        match parts {
            LinearParts::Int8(p) => {
                let k = p.k;
                Ok(Linear::Int8(Int8::from_parts(kernel, p, k, spare)?))
            }
            LinearParts::Split { main, side } => {
                // The two groups partition the input channels.
                let k_in = main
                    .k
                    .checked_add(side.k)
                    .ok_or("too many input channels")?;
                let mut seen = vec![false; k_in];
                for &c in main.columns.iter().chain(&side.columns).flatten() {
                    if c >= k_in || std::mem::replace(&mut seen[c], true) {
                        return Err(format!(
                            "the two column groups do not partition 0..{k_in} (column {c})"
                        ));
                    }
                }
                if main.columns.is_none() || side.columns.is_none() || main.k == 0 || side.k == 0 {
                    return Err("a split's group without columns".into());
                }
                Ok(Linear::Split {
                    main: Int8::from_parts(kernel, main, k_in, spare)?,
                    side: Int8::from_parts(kernel, side, k_in, spare)?,
                })
            }
        }
    }

    pub(crate) fn out_features(&self) -> usize {
        match self {
            Linear::Fp32 { n, .. } => *n,
            Linear::Int8(p) | Linear::Split { main: p, .. } => p.packed.n,
        }
    }

    fn in_features(&self) -> usize {
        match self {
            Linear::Fp32 { k, .. } => *k,
            Linear::Int8(p) | Linear::Split { main: p, .. } => p.k_in,
        }
    }

    /// Bytes of weights held.
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Linear::Fp32 { w, .. } => 4 * w.len(),
            Linear::Int8(p) => p.heap_bytes(),
            Linear::Split { main, side } => main.heap_bytes() + side.heap_bytes(),
        }
    }

    /// Starts a call over `rows` input rows: [`Linear::stage_row`] each, then
    /// [`Linear::run`], then [`Linear::row_out`] each.
    pub(crate) fn begin(&self, rows: usize, s: &mut LinearScratch) {
        s.rows = rows;
        match self {
            Linear::Fp32 { k, .. } => grow(&mut s.x, rows * k),
            Linear::Int8(p) => {
                s.main.reset(rows, p.packed.k);
                grow(&mut s.outlier_x, rows * p.outliers.len());
            }
            Linear::Split { main, side } => {
                s.main.reset(rows, main.packed.k);
                s.side.reset(rows, side.packed.k);
            }
        }
        s.row.resize(self.in_features(), 0.0);
    }

    /// Input row `r` as `fill` writes it (into a row of `k` values, whatever they held), in
    /// f32 or quantized as the product reads it: the steps that make a layer's input (a
    /// LayerNorm, the GeGLU) hand their row over while it is in cache.
    pub(crate) fn stage_row(&self, r: usize, s: &mut LinearScratch, fill: impl FnOnce(&mut [f32])) {
        let k = self.in_features();
        match self {
            Linear::Fp32 { .. } => fill(&mut s.x[r * k..(r + 1) * k]),
            Linear::Int8(p) => {
                fill(&mut s.row);
                let no = p.outliers.len();
                let xo = &mut s.outlier_x[r * no..(r + 1) * no];
                p.stage(r, &mut s.row, &mut s.main, xo, &mut s.gather);
            }
            Linear::Split { main, side } => {
                fill(&mut s.row);
                main.stage(r, &mut s.row, &mut s.main, &mut [], &mut s.gather);
                side.stage(r, &mut s.row, &mut s.side, &mut [], &mut s.gather);
            }
        }
    }

    /// The products of every staged row.
    pub(crate) fn run(&self, s: &mut LinearScratch) {
        match self {
            &Linear::Fp32 { ref w, n, k, gated } => {
                grow(&mut s.y, s.rows * n);
                let helper = s.helper.as_deref().map(|h| (h, &mut s.split_f32));
                let y = &mut s.y;
                fp32_product(w, n, k, gated, &s.x, s.rows, y, false, helper);
            }
            Linear::Int8(p) => {
                let helper = s.helper.as_deref().map(|h| (h, &mut s.split));
                p.run(&s.main, &mut s.acc_main, &mut s.kernel, helper);
            }
            Linear::Split { main, side } => {
                let helper = s.helper.as_deref().map(|h| (h, &mut s.split));
                main.run(&s.main, &mut s.acc_main, &mut s.kernel, helper);
                let helper = s.helper.as_deref().map(|h| (h, &mut s.split));
                side.run(&s.side, &mut s.acc_side, &mut s.kernel, helper);
            }
        }
    }

    /// [`Linear::run`], then every row stored in `out` (`rows × n`) or added to it: fp32
    /// adds in its tiles, with no output buffer between.
    pub(crate) fn finish(&self, s: &mut LinearScratch, out: &mut [f32], accumulate: bool) {
        match self {
            &Linear::Fp32 { ref w, n, k, gated } => {
                let helper = s.helper.as_deref().map(|h| (h, &mut s.split_f32));
                fp32_product(w, n, k, gated, &s.x, s.rows, out, accumulate, helper)
            }
            _ => {
                self.run(s);
                let n = self.out_features();
                for (r, o) in out.chunks_exact_mut(n).take(s.rows).enumerate() {
                    self.row_out(r, s, o, accumulate);
                }
            }
        }
    }

    /// Output row `r` after [`Linear::run`] where it is held as it is (fp32), else `None`.
    pub(crate) fn stored_row<'s>(&self, r: usize, s: &'s LinearScratch) -> Option<&'s [f32]> {
        match self {
            Linear::Fp32 { n, .. } => Some(&s.y[r * n..(r + 1) * n]),
            _ => None,
        }
    }

    /// Output row `r` (`n` values) stored in `out`, or added to it with `accumulate`.
    pub(crate) fn row_out(
        &self,
        r: usize,
        s: &mut LinearScratch,
        out: &mut [f32],
        accumulate: bool,
    ) {
        match self {
            Linear::Fp32 { n, .. } => {
                let y = &s.y[r * n..(r + 1) * n];
                if accumulate {
                    out.iter_mut().zip(y).for_each(|(o, &y)| *o += y);
                } else {
                    out.copy_from_slice(y);
                }
            }
            Linear::Int8(p) => {
                let no = p.outliers.len();
                let xo = &s.outlier_x[r * no..(r + 1) * no];
                p.row_out(r, &s.main, &s.acc_main, xo, out, accumulate);
            }
            Linear::Split { main, side } => {
                main.row_out(r, &s.main, &s.acc_main, &[], out, accumulate);
                side.row_out(r, &s.side, &s.acc_side, &[], out, true);
            }
        }
    }

    /// `out (+)= f(r) · Wᵀ` for `rows` rows whose inputs `fill(r, row)` writes, the rows
    /// split among the workers of `pool` (each row's result is the same however the rows
    /// are split). After each chunk of output rows is stored, `then(first, chunk)` gets them
    /// (`chunk`: rows `first..` of `out`, whole rows) while they are still in cache: the
    /// step that reads them next in place (RoPE on Wqkv's) does not fetch them again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_rows_on(
        &self,
        pool: Option<&rayon::ThreadPool>,
        rows: usize,
        out: &mut [f32],
        accumulate: bool,
        scratch: &mut LinearScratch,
        fill: impl Fn(usize, &mut [f32]) + Sync,
        then: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        let n = self.out_features();
        on_rows(pool, rows, n, out, scratch, |first, rows, out, s| {
            let fill = |r: usize, row: &mut [f32]| fill(first + r, row);
            let then = |r: usize, chunk: &mut [f32]| then(first + r, chunk);
            self.forward_rows(rows, out, accumulate, s, fill, then)
        });
    }

    /// [`Linear::forward_rows_on`] on the caller's thread, [`ROW_CHUNK`] rows at a time.
    pub(crate) fn forward_rows(
        &self,
        rows: usize,
        out: &mut [f32],
        accumulate: bool,
        s: &mut LinearScratch,
        fill: impl Fn(usize, &mut [f32]),
        then: impl Fn(usize, &mut [f32]),
    ) {
        let n = self.out_features();
        for (c, out) in out[..rows * n].chunks_mut(ROW_CHUNK * n).enumerate() {
            let (first, rows) = (c * ROW_CHUNK, out.len() / n);
            self.begin(rows, s);
            for r in 0..rows {
                self.stage_row(r, s, |row| fill(first + r, row));
            }
            self.finish(s, out, accumulate);
            then(first, out);
        }
    }

    /// `out = x · Wᵀ` (or `out += x · Wᵀ` with `accumulate`) for `rows` rows of `x`, the
    /// rows split among the workers of `pool`.
    pub(crate) fn forward_on(
        &self,
        pool: Option<&rayon::ThreadPool>,
        x: &[f32],
        rows: usize,
        out: &mut [f32],
        accumulate: bool,
        scratch: &mut LinearScratch,
    ) {
        let (n, k) = (self.out_features(), self.in_features());
        assert!(x.len() >= rows * k, "linear input too small");
        match self {
            // fp32 reads x in place and adds to `out` in its tiles: nothing to stage.
            &Linear::Fp32 { ref w, gated, .. } => {
                on_rows(pool, rows, n, out, scratch, |first, rows, out, s| {
                    let x = &x[first * k..(first + rows) * k];
                    let helper = s.helper.as_deref().map(|h| (h, &mut s.split_f32));
                    fp32_product(w, n, k, gated, x, rows, out, accumulate, helper)
                })
            }
            _ => {
                let copy = |r: usize, row: &mut [f32]| row.copy_from_slice(&x[r * k..(r + 1) * k]);
                self.forward_rows_on(pool, rows, out, accumulate, scratch, copy, |_, _| {});
            }
        }
    }

    /// [`Linear::forward_on`] on the caller's thread.
    #[cfg(test)]
    pub(crate) fn forward(
        &self,
        x: &[f32],
        rows: usize,
        out: &mut [f32],
        accumulate: bool,
        scratch: &mut LinearScratch,
    ) {
        self.forward_on(None, x, rows, out, accumulate, scratch);
    }
}

/// `out (+)= x · Wᵀ` for `rows` rows of `x` with fp32 weights `w` (`n × k`, packed), or its
/// GeGLU (`gated`: `simd_f32::fp32_gemm`). With a helper and at most [`HELPER_MAX_ROWS`]
/// rows, W's panels are cut in two halves of whole panels, one for the caller's thread and
/// one for the helper, each multiplied into a block of `split` and then stored in (or added
/// to) `out`'s rows: each output is still one tile's sum, added to `out` once, so the bits
/// are those of one call.
#[allow(clippy::too_many_arguments)]
fn fp32_product(
    w: &[f32],
    n: usize,
    k: usize,
    gated: bool,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
    accumulate: bool,
    helper: Option<(&Helper, &mut Aligned<f32>)>,
) {
    const PANEL: usize = simd_f32::FP32_PANEL;
    // Outputs of one panel.
    let per_panel = if gated { simd_f32::FP32_GATED } else { PANEL };
    let panels = n.div_ceil(per_panel);
    let Some((helper, split)) = helper.filter(|_| rows <= helper_max_rows(None) && panels >= 2)
    else {
        return simd_f32::fp32_gemm(x, rows, k, w, n, out, accumulate, gated);
    };
    let columns = [0, panels.div_ceil(2) * per_panel, n];
    let bounds = columns.map(|c| c * rows);
    grow(split, rows * n);
    {
        let pieces = Pieces::new(&mut split[..rows * n], &bounds);
        helper.run(columns.len() - 1, &|i, _worker| {
            let piece = pieces.take(i).expect("each piece is run once");
            let (c0, width) = (columns[i], columns[i + 1] - columns[i]);
            let w = &w[c0 / per_panel * k * PANEL..];
            simd_f32::fp32_gemm(x, rows, k, w, width, piece, false, gated);
        });
    }
    for (c, piece) in columns.windows(2).zip(bounds.windows(2)) {
        let width = c[1] - c[0];
        for (r, src) in split[piece[0]..piece[1]].chunks_exact(width).enumerate() {
            let o = &mut out[r * n + c[0]..r * n + c[1]];
            if accumulate {
                o.iter_mut().zip(src).for_each(|(o, &v)| *o += v);
            } else {
                o.copy_from_slice(src);
            }
        }
    }
}

/// Runs `work(first, rows, out, scratch)` over `rows` rows of `out` (`n` wide): on the
/// caller's thread with `scratch`, or split evenly among the workers of `pool`, each with
/// scratch of its own.
fn on_rows(
    pool: Option<&rayon::ThreadPool>,
    rows: usize,
    n: usize,
    out: &mut [f32],
    scratch: &mut LinearScratch,
    work: impl Fn(usize, usize, &mut [f32], &mut LinearScratch) + Sync,
) {
    assert!(out.len() >= rows * n, "linear output too small");
    if rows == 0 {
        return;
    }
    let workers = pool.map_or(1, |p| p.current_num_threads());
    match pool {
        Some(pool) if workers > 1 && rows >= PARALLEL_MIN_ROWS => {
            let per = rows.div_ceil(workers).div_ceil(ROW_GRAIN) * ROW_GRAIN;
            let work = &work;
            pool.scope(|s| {
                for (i, o) in out[..rows * n].chunks_mut(per * n).enumerate() {
                    s.spawn(move |_| work(i * per, o.len() / n, o, &mut LinearScratch::default()));
                }
            });
        }
        _ => work(0, rows, &mut out[..rows * n], scratch),
    }
}

/// Buffers of one layer's call, kept between calls: the staged input rows and the
/// products, each from a cache line (rows of whole lines then never split a load).
#[derive(Debug, Default)]
pub(crate) struct LinearScratch {
    rows: usize,
    /// fp32: `rows × k` inputs and `rows × n` outputs.
    x: Aligned<f32>,
    y: Aligned<f32>,
    /// int8: the (main) product's quantized rows and integer products, a split's side
    /// product's, and `rows × outliers` f32 inputs of the outlier channels.
    main: QuantRows,
    side: QuantRows,
    acc_main: Aligned<i32>,
    acc_side: Aligned<i32>,
    /// The kernel's own copy of the staged rows (see `PackedWeights::gemm`).
    kernel: Aligned<u8>,
    /// A helper thread for short calls' products (int8 and fp32), and their pieces' products.
    pub(crate) helper: Option<Arc<Helper>>,
    split: Aligned<i32>,
    split_f32: Aligned<f32>,
    outlier_x: Aligned<f32>,
    /// One input row while it is quantized, a split's gathered columns.
    row: Aligned<f32>,
    gather: Vec<f32>,
}

/// Buffers of [`geglu_mlp`], kept between calls.
#[derive(Debug, Default)]
pub(crate) struct MlpScratch {
    wi: LinearScratch,
    wo: LinearScratch,
    /// One row of Wi's output.
    y: Aligned<f32>,
}

impl MlpScratch {
    /// Scratch whose products share their columns with `helper` (see [`LinearScratch`]).
    pub(crate) fn with_helper(helper: Option<Arc<Helper>>) -> Self {
        let mut s = Self::default();
        s.wi.helper = helper.clone();
        s.wo.helper = helper;
        s
    }
}

/// Rows of the MLP computed together: Wi's output for them (`MLP_CHUNK × 2·intermediate`)
/// stays in L2.
const MLP_CHUNK: usize = 64;
/// The same with a gated fp32 Wi, which stores no such output: its GeGLU goes straight into
/// Wo's inputs (`rows × intermediate`). 96 rows are 16 whole tiles of the fp32 GEMM (64
/// are 10 and a short one), and Wi and Wo (3 MB at fp32 for the 30m shape, more than L2)
/// stream once per 96 rows. End to end 1.016× and 1.027× the 64-row calls on an Intel Xeon
/// (9 and 7 rounds); int8 was 0.97× with 96 (BENCHMARKS.md, twentieth step).
const MLP_CHUNK_GATED: usize = 96;

/// ModernBERT's MLP with its residual, `x += Wo(GeGLU(Wi(LayerNorm(x))))`, over the rows
/// of `x` (`rows × hidden`), [`MLP_CHUNK`] rows at a time ([`MLP_CHUNK_GATED`] with a
/// gated fp32 Wi): each row's LayerNorm is staged (quantized) for Wi as it is made, and Wi's
/// output goes through the GeGLU into Wo's staged input at once (int8: row by row as it is
/// dequantized; a gated fp32 Wi: tile by tile in its GEMM), so no `rows × 2·intermediate`
/// buffer is written or read. The same bits as the steps one after another over whole
/// buffers.
pub(crate) fn geglu_mlp(
    wi: &Linear,
    wo: &Linear,
    norm: &[f32],
    eps: f32,
    x: &mut [f32],
    s: &mut MlpScratch,
) {
    let h = norm.len();
    let i = wo.in_features();
    let MlpScratch { wi: si, wo: so, y } = s;
    y.resize(2 * i, 0.0);
    let chunk = match wi {
        Linear::Fp32 { gated: true, .. } => MLP_CHUNK_GATED,
        _ => MLP_CHUNK,
    };
    for xs in x.chunks_mut(chunk * h) {
        let rows = xs.len() / h;
        wi.begin(rows, si);
        for (r, row) in xs.chunks_exact(h).enumerate() {
            wi.stage_row(r, si, |o| simd_f32::layer_norm(row, norm, eps, o));
        }
        if let Linear::Fp32 { gated: true, .. } = wi {
            wo.begin(rows, so);
            match wo {
                // Wi's products go through the GeGLU in its tiles, straight into Wo's inputs.
                Linear::Fp32 { .. } => wi.finish(si, &mut so.x[..rows * i], false),
                _ => {
                    wi.run(si);
                    for r in 0..rows {
                        wo.stage_row(r, so, |a| wi.row_out(r, si, a, false));
                    }
                }
            }
            wo.finish(so, xs, true);
            continue;
        }
        wi.run(si);
        wo.begin(rows, so);
        for r in 0..rows {
            if let Linear::Int8(p) = wi {
                // Wi's row is never stored: dequantized straight into the GeGLU.
                wo.stage_row(r, so, |a| p.geglu_row(r, si, a));
                continue;
            }
            let y: &[f32] = match wi.stored_row(r, si) {
                Some(row) => row,
                None => {
                    wi.row_out(r, si, y, false);
                    y
                }
            };
            // ModernBertMLP: Wi's output chunked into (input, gate); GELU(input) · gate.
            let (input, gate) = y.split_at(i);
            wo.stage_row(r, so, |a| simd_f32::geglu(input, gate, a));
        }
        wo.finish(so, xs, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_row_rounds_half_to_even_and_keeps_the_sign() {
        let mut q = [0i8; 5];
        let s = quantize_row(&[1.27, -1.27, 0.005, 0.015, 0.0], &mut q);
        assert_eq!(q, [127, -127, 0, 2, 0]);
        assert!((s.0 - 0.01).abs() < 1e-9);
        // 127 − 127 + 0 + 2 + 0
        assert_eq!(s.1, 2);
        assert_eq!(quantize_row(&[0.0, 0.0], &mut q[..2]), (0.0, 0));
    }

    #[test]
    fn outliers_are_the_weakly_read_channels() {
        // 8 input channels; channel 5 is read by weights 1/10 of the others.
        let (n, k) = (16, 8);
        let w: Vec<f32> = (0..n * k)
            .map(|i| {
                let v = if i % 2 == 0 { 1.0 } else { -0.9 };
                if i % k == 5 { v * 0.1 } else { v }
            })
            .collect();
        assert_eq!(detect_outliers(&w, n, k), vec![5]);
        let flat = vec![1.0f32; n * k];
        assert!(detect_outliers(&flat, n, k).is_empty());
    }

    /// int8 with the outlier channel in f32 is close to fp32, much closer than without.
    #[test]
    fn decomposition_keeps_a_massive_channel_exact() {
        let (n, k, rows) = (32, 64, 3);
        let w: Vec<f32> = (0..n * k)
            .map(|i| {
                let v = (((i * 7919) % 211) as f32 / 105.0 - 1.0) * 0.2;
                if i % k == 7 { v * 0.05 } else { v }
            })
            .collect();
        let x: Vec<f32> = (0..rows * k)
            .map(|i| {
                if i % k == 7 {
                    40.0
                } else {
                    ((i * 31) % 17) as f32 / 8.0 - 1.0
                }
            })
            .collect();
        let mut exact = vec![0.0; rows * n];
        Linear::fp32(&w, n, k).forward(&x, rows, &mut exact, false, &mut LinearScratch::default());
        let err = |outliers: Vec<usize>| {
            let mut y = vec![0.0; rows * n];
            Linear::int8(
                Kernel::Scalar,
                &mut w.clone(),
                n,
                k,
                outliers,
                &mut Vec::new(),
            )
            .forward(&x, rows, &mut y, false, &mut LinearScratch::default());
            y.iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        let found = detect_outliers(&w, n, k);
        assert_eq!(found, vec![7]);
        // Adding to a residual gives the stored row added to it, bit for bit (the outlier
        // terms join y before y joins the residual).
        let layer = Linear::int8(
            Kernel::Scalar,
            &mut w.clone(),
            n,
            k,
            found.clone(),
            &mut Vec::new(),
        );
        let mut scratch = LinearScratch::default();
        let mut stored = vec![0.0; rows * n];
        layer.forward(&x, rows, &mut stored, false, &mut scratch);
        let residual: Vec<f32> = (0..rows * n).map(|i| i as f32 * 0.01 - 0.3).collect();
        let mut added = residual.clone();
        layer.forward(&x, rows, &mut added, true, &mut scratch);
        let want: Vec<f32> = residual.iter().zip(&stored).map(|(r, y)| r + y).collect();
        assert_eq!(added, want);
        let (with, without) = (err(found), err(vec![]));
        assert!(with * 4.0 < without, "with {with}, without {without}");
    }

    /// The fused MLP (LayerNorm staged for Wi row by row, Wi's rows through the GeGLU into
    /// Wo's staged input) gives the bits of the steps one after another over whole buffers,
    /// across chunk boundaries, at fp32 and int8 (Wi with an outlier channel, Wo split), on
    /// every kernel this CPU runs.
    /// A deterministic value in [−1, 1).
    fn value(i: usize) -> f32 {
        ((i * 7919) % 211) as f32 / 105.0 - 1.0
    }

    /// `n × k` weights whose input channel `outlier` is read by tiny ones.
    fn weights_with_outlier(n: usize, k: usize, outlier: usize) -> Vec<f32> {
        (0..n * k)
            .map(|i| {
                if i % k == outlier {
                    value(i) * 0.01
                } else {
                    value(i)
                }
            })
            .collect()
    }

    #[test]
    fn fused_mlp_equals_the_steps_in_turn() {
        let (h, u, rows) = (16usize, 24usize, 2 * MLP_CHUNK + 5);
        // Wi's input channel 3 is read by tiny weights (an outlier); Wo's units 5 and 6
        // write only output 2 (writers: a split).
        let wi = weights_with_outlier(2 * u, h, 3);
        let wo: Vec<f32> = (0..h * u)
            .map(|i| match (i % u, i / u) {
                (5 | 6, 2) => 0.07,
                (5 | 6, _) => 0.0,
                _ => value(i + 3) * 0.3,
            })
            .collect();
        let norm: Vec<f32> = (0..h).map(|i| 1.0 + value(i + 7) * 0.1).collect();
        let x: Vec<f32> = (0..rows * h)
            .map(|i| if i % h == 3 { 30.0 } else { value(i + 11) })
            .collect();
        let outliers = detect_outliers(&wi, 2 * u, h);
        assert_eq!(outliers, vec![3]);
        let writers = detect_writers(&wo, h, u);
        assert_eq!(writers, vec![5, 6]);
        let mut layers = vec![(Linear::fp32(&wi, 2 * u, h), Linear::fp32(&wo, h, u))];
        for kernel in Kernel::available() {
            let q = &mut Vec::new();
            layers.push((
                Linear::int8(kernel, &mut wi.clone(), 2 * u, h, outliers.clone(), q),
                Linear::int8_split(kernel, &wo, h, u, writers.clone(), q),
            ));
        }
        for (wi, wo) in &layers {
            let mut normed = vec![0.0; rows * h];
            for (o, row) in normed.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
                simd_f32::layer_norm(row, &norm, 1e-5, o);
            }
            let mut scratch = LinearScratch::default();
            let mut y = vec![0.0; rows * 2 * u];
            wi.forward(&normed, rows, &mut y, false, &mut scratch);
            let mut act = vec![0.0; rows * u];
            for (a, y) in act.chunks_exact_mut(u).zip(y.chunks_exact(2 * u)) {
                let (input, gate) = y.split_at(u);
                simd_f32::geglu(input, gate, a);
            }
            let mut want = x.clone();
            wo.forward(&act, rows, &mut want, true, &mut scratch);
            let mut got = x.clone();
            geglu_mlp(wi, wo, &norm, 1e-5, &mut got, &mut MlpScratch::default());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{wi:?}");
            assert_ne!(got, x);
        }
    }

    /// A short call's products shared with a helper thread, column piece by piece, give
    /// the same bits as on one thread, on every kernel: a product with an outlier channel
    /// (its last piece narrower than the others), a split one, and the fused MLP.
    #[test]
    fn a_helper_takes_columns_with_the_same_bits() {
        let helper = Some(Arc::new(
            Helper::start(Default::default()).expect("a thread"),
        ));
        let (n, k) = (200usize, 100usize);
        let w = weights_with_outlier(n, k, 9);
        let outliers = detect_outliers(&w, n, k);
        assert_eq!(outliers, vec![9]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for kernel in Kernel::available() {
            let q = &mut Vec::new();
            let layers = [
                Linear::int8(kernel, &mut w.clone(), n, k, outliers.clone(), q),
                Linear::int8_split(kernel, &w, n, k, vec![1, 50, 51], q),
            ];
            for layer in &layers {
                let limit = helper_max_rows(Some(kernel));
                for rows in [1, 2, 7, 40, limit, limit + 1] {
                    let x: Vec<f32> = (0..rows * k)
                        .map(|i| if i % k == 9 { 40.0 } else { value(i + rows) })
                        .collect();
                    let (mut alone, mut shared) = (vec![0.0; rows * n], vec![0.0; rows * n]);
                    layer.forward(&x, rows, &mut alone, false, &mut LinearScratch::default());
                    let mut scratch = LinearScratch {
                        helper: helper.clone(),
                        ..LinearScratch::default()
                    };
                    layer.forward(&x, rows, &mut shared, false, &mut scratch);
                    assert_eq!(bits(&shared), bits(&alone), "{kernel:?}, {rows} rows");
                }
            }
            let int8 = |w: &[f32], n, k| Linear::int8(kernel, &mut w.to_vec(), n, k, Vec::new(), q);
            mlp_keeps_its_bits_with(&helper, int8, &format!("{kernel:?}"));
        }
    }

    /// The fused MLP (Wi 2 × 96 units wide, Wo back to 128) with layers `make` builds, alone
    /// and with `helper`: the same bits.
    fn mlp_keeps_its_bits_with(
        helper: &Option<Arc<Helper>>,
        mut make: impl FnMut(&[f32], usize, usize) -> Linear,
        what: &str,
    ) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (h, u, rows) = (128usize, 96usize, 9usize);
        let wi: Vec<f32> = (0..2 * u * h).map(|i| value(i + 5)).collect();
        let wo: Vec<f32> = (0..h * u).map(|i| value(i + 9) * 0.3).collect();
        let (wi, wo) = (make(&wi, 2 * u, h), make(&wo, h, u));
        let norm = vec![1.0f32; h];
        let x: Vec<f32> = (0..rows * h).map(|i| value(i + 1)).collect();
        let (mut alone, mut shared) = (x.clone(), x.clone());
        let mut s = MlpScratch::default();
        geglu_mlp(&wi, &wo, &norm, 1e-5, &mut alone, &mut s);
        let mut s = MlpScratch::with_helper(helper.clone());
        geglu_mlp(&wi, &wo, &norm, 1e-5, &mut shared, &mut s);
        assert_eq!(bits(&shared), bits(&alone), "{what}, the MLP");
        assert_ne!(alone, x);
    }

    /// Wi as a gated fp32 layer (the GeGLU applied in the GEMM's tiles) gives the bits of
    /// the plain fp32 layer followed by the GeGLU: through `forward` (stored and added), and
    /// in the MLP beside an fp32 and an int8 Wo, alone and with a helper (halves of whole
    /// panels), with a part panel and with one panel, over more than one chunk of rows.
    #[test]
    fn a_gated_fp32_wi_gives_the_plain_layers_bits() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let helper = Some(Arc::new(
            Helper::start(Default::default()).expect("a thread"),
        ));
        for (h, u) in [(128usize, 96usize), (48, 70), (16, 5)] {
            let wi: Vec<f32> = (0..2 * u * h).map(|i| value(i + 5)).collect();
            let wo: Vec<f32> = (0..h * u).map(|i| value(i + 9) * 0.3).collect();
            let (plain, gated) = (Linear::fp32(&wi, 2 * u, h), Linear::fp32_gated(&wi, u, h));
            assert_eq!((gated.out_features(), gated.in_features()), (u, h));
            for rows in [1, 9, MLP_CHUNK + 7, MLP_CHUNK_GATED + 7] {
                let x: Vec<f32> = (0..rows * h).map(|i| value(i + rows)).collect();
                // The layer alone: the plain product, then the GeGLU value by value.
                let mut y = vec![0.0; rows * 2 * u];
                plain.forward(&x, rows, &mut y, false, &mut LinearScratch::default());
                let geglu: Vec<f32> = y
                    .chunks_exact(2 * u)
                    .flat_map(|y| (0..u).map(|j| crate::math::gelu(y[j]) * y[u + j]))
                    .collect();
                for accumulate in [false, true] {
                    let start: Vec<f32> = (0..rows * u).map(|i| value(i + 11)).collect();
                    let want: Vec<f32> = if accumulate {
                        start.iter().zip(&geglu).map(|(&s, &g)| s + g).collect()
                    } else {
                        geglu.clone()
                    };
                    for helper in [None, helper.clone()] {
                        let mut got = start.clone();
                        let mut s = LinearScratch {
                            helper,
                            ..LinearScratch::default()
                        };
                        gated.forward(&x, rows, &mut got, accumulate, &mut s);
                        assert_eq!(bits(&got), bits(&want), "{h}×{u}, {rows} rows");
                    }
                }
                // The MLP, with Wo at fp32 (the GeGLU written into its inputs) and at int8.
                let wos = [
                    Linear::fp32(&wo, h, u),
                    Linear::int8(Kernel::Scalar, &mut wo.clone(), h, u, vec![], &mut vec![]),
                ];
                for (wo, helper) in wos.iter().flat_map(|wo| [(wo, None), (wo, helper.clone())]) {
                    let norm = vec![1.0f32; h];
                    let (mut want, mut got) = (x.clone(), x.clone());
                    let mut s = MlpScratch::with_helper(helper);
                    geglu_mlp(&plain, wo, &norm, 1e-5, &mut want, &mut s);
                    geglu_mlp(&gated, wo, &norm, 1e-5, &mut got, &mut s);
                    assert_eq!(bits(&got), bits(&want), "{h}×{u}, {rows} rows, the MLP");
                    assert_ne!(got, x);
                }
            }
        }
    }

    /// fp32 products shared with a helper (halves of whole panels) give the bits of one
    /// call: stored and added to `out`, with an odd panel count and a last partial panel,
    /// and in the fused MLP (Wi's rows held, Wo added to the residual).
    #[test]
    fn fp32_products_shared_with_a_helper_keep_their_bits() {
        let helper = Some(Arc::new(
            Helper::start(Default::default()).expect("a thread"),
        ));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let shared_scratch = || LinearScratch {
            helper: helper.clone(),
            ..LinearScratch::default()
        };
        for (n, k) in [(200usize, 100usize), (128, 33), (150, 64)] {
            let w: Vec<f32> = (0..n * k).map(|i| value(i + 3)).collect();
            let layer = Linear::fp32(&w, n, k);
            let limit = helper_max_rows(None);
            for rows in [1, 2, 7, 40, limit, limit + 1] {
                let x: Vec<f32> = (0..rows * k).map(|i| value(i + rows)).collect();
                for accumulate in [false, true] {
                    let start: Vec<f32> = (0..rows * n).map(|i| value(i + 11)).collect();
                    let (mut alone, mut shared) = (start.clone(), start.clone());
                    let mut s = LinearScratch::default();
                    layer.forward(&x, rows, &mut alone, accumulate, &mut s);
                    layer.forward(&x, rows, &mut shared, accumulate, &mut shared_scratch());
                    assert_eq!(bits(&shared), bits(&alone), "{n}×{k}, {rows} rows");
                    assert_ne!(alone, start);
                }
            }
        }
        mlp_keeps_its_bits_with(&helper, Linear::fp32, "fp32");
    }

    /// Columns that write only output 0 (and carry large activations) are found, and their
    /// own int8 product keeps the other columns' resolution: the split's error is a fraction
    /// of one product's, and it equals the two products added in order, bit for bit.
    #[test]
    fn writer_columns_get_a_product_of_their_own() {
        let (n, k, rows) = (24, 48, 5);
        let writers: Vec<usize> = vec![3, 17, 40];
        let w: Vec<f32> = (0..n * k)
            .map(|i| {
                let (j, c) = (i / k, i % k);
                let v = (((i * 7919) % 211) as f32 / 105.0 - 1.0) * 0.2;
                match (writers.contains(&c), j) {
                    (true, 0) => 0.01 * (1.0 + c as f32 / 50.0),
                    (true, _) => 0.0,
                    (false, _) => v,
                }
            })
            .collect();
        let x: Vec<f32> = (0..rows * k)
            .map(|i| {
                if writers.contains(&(i % k)) {
                    60.0 + (i % 7) as f32
                } else {
                    ((i * 31) % 17) as f32 / 8.0 - 1.0
                }
            })
            .collect();
        assert_eq!(detect_writers(&w, n, k), writers);
        // A column writing every output alike is no writer; all columns writers: no split.
        assert!(detect_writers(&vec![0.5f32; n * k], n, k).is_empty());
        let mut exact = vec![0.0; rows * n];
        Linear::fp32(&w, n, k).forward(&x, rows, &mut exact, false, &mut LinearScratch::default());
        let err = |y: &[f32]| {
            y.iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        let split = Linear::int8_split(Kernel::Scalar, &w, n, k, writers.clone(), &mut Vec::new());
        let plain = Linear::int8(
            Kernel::Scalar,
            &mut w.clone(),
            n,
            k,
            vec![],
            &mut Vec::new(),
        );
        let mut scratch = LinearScratch::default();
        let (mut ys, mut yp) = (vec![0.0; rows * n], vec![0.0; rows * n]);
        split.forward(&x, rows, &mut ys, false, &mut scratch);
        plain.forward(&x, rows, &mut yp, false, &mut scratch);
        assert!(
            err(&ys) * 4.0 < err(&yp),
            "split {}, one product {}",
            err(&ys),
            err(&yp)
        );
        // The same as the two groups' products, each on its own columns, added in order.
        let gather = |cols: &[usize], m: &[f32], width: usize| -> Vec<f32> {
            m.chunks_exact(width)
                .flat_map(|row| cols.iter().map(move |&c| row[c]))
                .collect()
        };
        let others: Vec<usize> = (0..k).filter(|c| !writers.contains(c)).collect();
        let mut want: Vec<f32> = (0..rows * n).map(|i| i as f32 * 0.01).collect();
        let mut got = want.clone();
        for cols in [&others, &writers] {
            let part = Linear::int8(
                Kernel::Scalar,
                &mut gather(cols, &w, k),
                n,
                cols.len(),
                vec![],
                &mut Vec::new(),
            );
            part.forward(&gather(cols, &x, k), rows, &mut want, true, &mut scratch);
        }
        split.forward(&x, rows, &mut got, true, &mut scratch);
        assert_eq!(got, want);
        // Every kernel this CPU runs gives the same bits.
        for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            let layer = Linear::int8_split(kernel, &w, n, k, writers.clone(), &mut Vec::new());
            let mut y = vec![0.0; rows * n];
            layer.forward(&x, rows, &mut y, false, &mut scratch);
            assert_eq!(y, ys, "{kernel:?}");
        }
    }
}
