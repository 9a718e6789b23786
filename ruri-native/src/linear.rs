//! The linear layers (no bias in ModernBERT): fp32 through the `gemm` crate, or int8 through
//! this crate's exact kernels with the quantization and dequantization around them.
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
const PARALLEL_MIN_ROWS: usize = 4;
/// Rows are split evenly (the microkernels take tiles of any height up to theirs; a query
/// of 10 tokens splits 5 + 5 rather than 6 + 4).
const ROW_GRAIN: usize = 1;

/// How a layer's weights are held.
#[derive(Debug)]
pub(crate) enum Linear {
    Fp32 {
        /// Packed by `simd_f32::pack_fp32`.
        w: Vec<f32>,
        n: usize,
        k: usize,
    },
    Int8 {
        packed: PackedWeights,
        /// Input channels computed in f32, ascending.
        outliers: Vec<usize>,
        /// `outliers.len() × n`: their weights, one row per outlier channel.
        outlier_w: Vec<f32>,
        /// The input channels this product reads (`packed.k` of the `k_in` of x).
        columns: Columns,
        /// Width of the input rows.
        k_in: usize,
    },
    /// Two int8 products over disjoint column groups (see [`detect_writers`]), each
    /// quantized on its own; `main` is added first.
    Split {
        main: Box<Linear>,
        side: Box<Linear>,
    },
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
/// row, NaN for a row that is not finite).
pub(crate) fn quantize_row(x: &[f32], out: &mut [i8]) -> f32 {
    let max = simd_f32::quantize_row(x, out);
    if max == 0.0 {
        0.0
    } else if !max.is_finite() {
        f32::NAN
    } else {
        max / 127.0
    }
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

impl Linear {
    /// An fp32 layer from `n × k` weights.
    pub(crate) fn fp32(w: &[f32], n: usize, k: usize) -> Self {
        Linear::Fp32 {
            w: simd_f32::pack_fp32(w, n, k),
            n,
            k,
        }
    }

    /// An int8 layer from `n × k` fp32 weights (their outlier columns are zeroed in place);
    /// `outliers` as [`detect_outliers`] gives. `q` is scratch, reused from layer to layer.
    pub(crate) fn int8(
        kernel: Kernel,
        w: &mut [f32],
        n: usize,
        k: usize,
        outliers: Vec<usize>,
        q: &mut Vec<i8>,
    ) -> Self {
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
            .map(|(row, out)| quantize_row(row, out))
            .collect();
        Linear::Int8 {
            packed: PackedWeights::pack(kernel, q, n, k, scales),
            outliers,
            outlier_w,
            columns: Columns::All,
            k_in: k,
        }
    }

    /// Two int8 products from `n × k` fp32 weights: the columns `side` (ascending, as
    /// [`detect_writers`] gives) and the others, each quantized on its own. Contiguous
    /// groups are read in place (the loader permutes the MLP's units so that they are).
    pub(crate) fn int8_split(
        kernel: Kernel,
        w: &[f32],
        n: usize,
        k: usize,
        side: Vec<usize>,
        q: &mut Vec<i8>,
    ) -> Self {
        let mut is_side = vec![false; k];
        side.iter().for_each(|&c| is_side[c] = true);
        let main: Vec<usize> = (0..k).filter(|&c| !is_side[c]).collect();
        let part = |columns: Vec<usize>, q: &mut Vec<i8>| {
            let mut sub: Vec<f32> = w
                .chunks_exact(k)
                .take(n)
                .flat_map(|row| columns.iter().map(move |&c| row[c]))
                .collect();
            let mut linear = Linear::int8(kernel, &mut sub, n, columns.len(), Vec::new(), q);
            if let Linear::Int8 {
                columns: c, k_in, ..
            } = &mut linear
            {
                *c = Columns::from_sorted(columns);
                *k_in = k;
            }
            Box::new(linear)
        };
        Linear::Split {
            main: part(main, q),
            side: part(side, q),
        }
    }

    pub(crate) fn out_features(&self) -> usize {
        match self {
            Linear::Fp32 { n, .. } => *n,
            Linear::Int8 { packed, .. } => packed.n,
            Linear::Split { main, .. } => main.out_features(),
        }
    }

    fn in_features(&self) -> usize {
        match self {
            Linear::Fp32 { k, .. } => *k,
            Linear::Int8 { k_in, .. } => *k_in,
            Linear::Split { main, .. } => main.in_features(),
        }
    }

    /// Bytes of weights held.
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Linear::Fp32 { w, .. } => 4 * w.len(),
            Linear::Int8 {
                packed, outlier_w, ..
            } => packed.heap_bytes() + 4 * outlier_w.len(),
            Linear::Split { main, side } => main.heap_bytes() + side.heap_bytes(),
        }
    }

    /// [`Linear::forward`], with the rows split among the workers of `pool` (each row's
    /// result is the same however the rows are split).
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
        let workers = pool.map_or(1, |p| p.current_num_threads());
        match pool {
            Some(pool) if workers > 1 && rows >= PARALLEL_MIN_ROWS => {
                let per = rows.div_ceil(workers).div_ceil(ROW_GRAIN) * ROW_GRAIN;
                pool.scope(|s| {
                    for (i, o) in out[..rows * n].chunks_mut(per * n).enumerate() {
                        let part = o.len() / n;
                        let xs = &x[i * per * k..(i * per + part) * k];
                        s.spawn(move |_| {
                            self.forward(xs, part, o, accumulate, &mut LinearScratch::default())
                        });
                    }
                });
            }
            _ => self.forward(x, rows, out, accumulate, scratch),
        }
    }

    /// `out = x · Wᵀ` (or `out += x · Wᵀ` with `accumulate`) for `rows` rows of `x`.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        rows: usize,
        out: &mut [f32],
        accumulate: bool,
        scratch: &mut LinearScratch,
    ) {
        let (n, k) = (self.out_features(), self.in_features());
        assert!(
            x.len() >= rows * k && out.len() >= rows * n,
            "linear buffers too small"
        );
        if rows == 0 {
            return;
        }
        match self {
            Linear::Fp32 { w, .. } => simd_f32::fp32_gemm(x, rows, k, w, n, out, accumulate),
            Linear::Split { main, side } => {
                main.forward(x, rows, out, accumulate, scratch);
                side.forward(x, rows, out, true, scratch);
            }
            Linear::Int8 {
                packed,
                outliers,
                outlier_w,
                columns,
                ..
            } => {
                let LinearScratch { qa, c, masked, row } = scratch;
                let kq = packed.k;
                qa.reset(rows, kq);
                masked.resize(k, 0.0);
                for r in 0..rows {
                    let row = &x[r * k..(r + 1) * k];
                    // Outlier channels come only with all columns (a split has none).
                    let src = match columns {
                        _ if !outliers.is_empty() => {
                            masked.copy_from_slice(row);
                            for &ch in outliers {
                                masked[ch] = 0.0;
                            }
                            &masked[..]
                        }
                        Columns::All => row,
                        Columns::Range(range) => &row[range.clone()],
                        Columns::Pick(columns) => {
                            for (m, &ch) in masked.iter_mut().zip(columns) {
                                *m = row[ch];
                            }
                            &masked[..kq]
                        }
                    };
                    let q = qa.row_mut(r);
                    let scale = quantize_row(src, &mut q[..kq]);
                    qa.sums[r] = q.iter().map(|&v| i32::from(v)).sum();
                    qa.scales[r] = scale;
                }
                let np = packed.n_padded;
                c.clear();
                c.resize(rows * np, 0);
                packed.gemm(qa, c);
                for r in 0..rows {
                    let (acc, sa) = (&c[r * np..r * np + n], qa.scales[r]);
                    let xr = &x[r * k..(r + 1) * k];
                    let o = &mut out[r * n..(r + 1) * n];
                    dequantize(
                        acc,
                        sa,
                        &packed.scales,
                        xr,
                        outliers,
                        outlier_w,
                        o,
                        accumulate,
                        row,
                    );
                }
            }
        }
    }
}

/// Buffers of one [`Linear::forward`] call, kept between calls.
#[derive(Debug, Default)]
pub(crate) struct LinearScratch {
    qa: QuantRows,
    c: Vec<i32>,
    masked: Vec<f32>,
    row: Vec<f32>,
}

/// One output row: `y = (f32(acc) · s_x) · s_w`, then `y += x_c · w_c` for each outlier
/// channel in order, stored or added to `out` (one pass per step, each vectorizable).
#[allow(clippy::too_many_arguments)]
#[inline]
fn dequantize(
    acc: &[i32],
    sa: f32,
    sw: &[f32],
    x: &[f32],
    outliers: &[usize],
    outlier_w: &[f32],
    out: &mut [f32],
    accumulate: bool,
    tmp: &mut Vec<f32>,
) {
    let n = out.len();
    if outliers.is_empty() {
        simd_f32::dequantize_row(acc, sa, sw, out, accumulate);
        return;
    }
    // With outliers the row is built in `out` first when storing, or in `tmp` (the call's
    // scratch) when adding: the outlier terms join y before y joins the residual.
    let target: &mut [f32] = if accumulate {
        tmp.resize(n, 0.0);
        tmp
    } else {
        out
    };
    simd_f32::dequantize_row(acc, sa, sw, target, false);
    for (i, &ch) in outliers.iter().enumerate() {
        let xc = x[ch];
        for (t, &w) in target.iter_mut().zip(&outlier_w[i * n..(i + 1) * n]) {
            *t += xc * w;
        }
    }
    if accumulate {
        for (o, &t) in out.iter_mut().zip(tmp.iter()) {
            *o += t;
        }
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
        assert!((s - 0.01).abs() < 1e-9);
        assert_eq!(quantize_row(&[0.0, 0.0], &mut q[..2]), 0.0);
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
