//! The f32 loops around the GEMMs, each compiled three times (baseline, AVX2, AVX-512F) from
//! one generic body and chosen at run time. Each SIMD lane is a different output (a key, a
//! channel, an element) and each output's terms are combined in one fixed order with
//! separate multiplies and adds, so every version gives the same bits (tested below): the
//! wider ones are only faster.

/// Defines `pub(crate) fn $name` that runs `$body` compiled for the widest of AVX-512F,
/// AVX2 or the baseline that this CPU has. The body is safe Rust; only the call into a
/// `#[target_feature]` copy needs `unsafe`, after the feature was detected.
macro_rules! multiversion {
    ($(#[$meta:meta])* fn $name:ident / $body:ident ($($arg:ident : $ty:ty),*) $(-> $ret:ty)?) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[allow(clippy::too_many_arguments)]
                #[target_feature(enable = "avx512f")]
                fn wide($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                #[allow(clippy::too_many_arguments)]
                #[target_feature(enable = "avx2")]
                fn narrow($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (checked); the body is safe Rust.
                    return unsafe { wide($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (checked); the body is safe Rust.
                    return unsafe { narrow($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

pub(crate) use multiversion;

/// Keys per group of the transposed keys that [`scores`] reads.
pub(crate) const KEY_GROUP: usize = VEC;

/// Whether `len` floats hold `rows` rows of `d` at a stride of `stride` (row `r` is
/// `[r·stride, r·stride + d)`, rows apart: `stride ≥ d`), without overflow.
pub(crate) fn holds_rows(len: usize, rows: usize, stride: usize, d: usize) -> bool {
    rows == 0
        || (stride >= d
            && (rows - 1)
                .checked_mul(stride)
                .and_then(|start| start.checked_add(d))
                .is_some_and(|end| end <= len))
}

/// Whether `len` floats hold `rows × keys` probabilities, value `j` of row `r` at `r · p_row
/// + j · p_key`, without overflow.
pub(crate) fn holds_probabilities(
    len: usize,
    rows: usize,
    p_row: usize,
    p_key: usize,
    keys: usize,
) -> bool {
    rows == 0
        || keys == 0
        || (rows - 1)
            .checked_mul(p_row)
            .zip((keys - 1).checked_mul(p_key))
            .and_then(|(a, b)| a.checked_add(b))
            .is_some_and(|last| last < len)
}

/// `out[r][16·g + i] = Σ_c q[r][c] · kt[g_lo + g][c][i]` (c in order) for `rows` queries and
/// `groups` groups of [`KEY_GROUP`] keys; `q` holds `rows` rows of `d` at a stride of
/// `q_stride` (a head's columns read in place from Wqkv's output), `kt` is
/// `[group][d][KEY_GROUP]` (keys transposed group by group), `out` holds
/// `rows × groups·KEY_GROUP`. On AVX-512 the register-blocked tiles of `x86_f32` (the same
/// bits).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    d: usize,
    kt: &[f32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::x86_f32::available() {
        return super::x86_f32::scores(q, q_stride, rows, d, kt, g_lo, groups, out);
    }
    scores_portable(q, q_stride, rows, d, kt, g_lo, groups, out)
}

multiversion! {
    /// [`scores`] without the AVX-512 tiles.
    fn scores_portable / scores_body(q: &[f32], q_stride: usize, rows: usize, d: usize, kt: &[f32], g_lo: usize, groups: usize, out: &mut [f32])
}

/// Keys transposed group by group, as [`scores`] reads them: `kt[g][c][i] = k[16·g + i][c]`
/// for the `len` rows of `k` (row `j` is `d` values at `j · stride`), 0 in the lanes past
/// the last key; `kt` holds `⌈len / 16⌉ · d · 16` values. On AVX-512 with `d` a multiple of
/// 16, register transposes of `x86_f32` (the same values: nothing is computed).
pub(crate) fn transpose_keys(k: &[f32], stride: usize, len: usize, d: usize, kt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(VEC) && super::x86_f32::available() {
        return super::x86_f32::transpose_keys(k, stride, len, d, kt);
    }
    transpose_keys_portable(k, stride, len, d, kt)
}

/// [`transpose_keys`] a value at a time.
pub(crate) fn transpose_keys_portable(
    k: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    kt: &mut [f32],
) {
    assert!(holds_rows(k.len(), len, stride, d));
    let groups = len.div_ceil(VEC);
    let kt = &mut kt[..groups * d * VEC];
    for j in 0..len {
        let key = &k[j * stride..j * stride + d];
        let (g, jj) = (j / VEC, j % VEC);
        for (c, &x) in key.iter().enumerate() {
            kt[(g * d + c) * VEC + jj] = x;
        }
    }
    let real = len - groups.saturating_sub(1) * VEC;
    for lanes in kt[groups.saturating_sub(1) * d * VEC..].chunks_exact_mut(VEC) {
        lanes[real..].fill(0.0);
    }
}

/// `out[r][c] += Σ_j p[r][j] · v[j][c]` for `j < keys` in order, for `rows` rows; `p[r][j]`
/// is `p[r · p_row + j · p_key]`: rows of probabilities (`p_key` = 1) or their columns, as
/// [`softmax_columns`] leaves them (`p_row` = 1, `p_key` = 16); `v` holds `keys` rows of `d`
/// at a stride of `v_stride`, `out` `rows` rows of `d` at a stride of `out_stride` (in place:
/// a head's columns of Wqkv's output and of the context rows). On AVX-512 with `d` a
/// multiple of 16, the register-blocked tiles of `x86_f32` (the same bits).
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted_sum_rows(
    p: &[f32],
    rows: usize,
    p_row: usize,
    p_key: usize,
    v: &[f32],
    v_stride: usize,
    keys: usize,
    d: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(VEC) && super::x86_f32::available() {
        return super::x86_f32::weighted_sum_rows(
            p, rows, p_row, p_key, v, v_stride, keys, d, out, out_stride,
        );
    }
    weighted_sum_rows_portable(p, rows, p_row, p_key, v, v_stride, keys, d, out, out_stride)
}

multiversion! {
    /// [`weighted_sum_rows`] without the AVX-512 tiles.
    fn weighted_sum_rows_portable / weighted_sum_rows_body(p: &[f32], rows: usize, p_row: usize, p_key: usize, v: &[f32], v_stride: usize, keys: usize, d: usize, out: &mut [f32], out_stride: usize)
}

multiversion! {
    /// The softmax of each column of `s` (`keys` rows of [`KEY_GROUP`] scores: column `i` is
    /// one query's scores against every key, as [`scores`] computes them with the keys as
    /// its rows and the queries transposed), over all `keys` rows after scaling by `scale`.
    /// The same bits as [`softmax_rows`] gives the query's row when all its keys are its own
    /// (a text within the window): max, `exp(x − max)`, the total of key `j` in partial sum
    /// `j mod 8` as [`crate::math::sum`] adds a row, the partial sums in order, then each
    /// divided by it. Every step runs down the columns, so every lane is a query: no sum or
    /// max across the lanes of a vector.
    fn softmax_columns / softmax_columns_body(s: &mut [f32], keys: usize, scale: f32)
}

multiversion! {
    /// The softmax of each of a block's rows (`s` is `own.len()` rows of `width`): of row
    /// `r`'s scores `row[own[r].0..own[r].1]` (its query's keys) after scaling by `scale`:
    /// max, `exp(x − max)` ([`crate::math::exp`]), the total in [`crate::math::sum`]'s
    /// lanes, then each divided by it. The rest of the row is set to zero, so that the block
    /// can sum over the union of its queries' keys. Rows whose keys start the row (every row
    /// of a text within the window) go through each step together, with the same bits as
    /// one at a time: one row's steps are a chain (max, exp, total, division), and rows one
    /// after another left most of each chain's latency exposed.
    fn softmax_rows / softmax_rows_body(s: &mut [f32], width: usize, own: &[(usize, usize)], scale: f32)
}

multiversion! {
    /// `out[j] = gelu(input[j]) · gate[j]` (ModernBERT's GeGLU), with `crate::math::gelu`.
    fn geglu / geglu_body(input: &[f32], gate: &[f32], out: &mut [f32])
}

multiversion! {
    /// Rotary embedding of each head of `x` (heads of `d`, `d / 2` angles): for each pair
    /// `(a, b) = (x[j], x[j + d/2])`, `(a·cos − b·sin, b·cos + a·sin)` as
    /// `x·cos + rotate_half(x)·sin` computes it.
    fn rotate_heads / rotate_heads_body(x: &mut [f32], d: usize, sin: &[f32], cos: &[f32])
}

multiversion! {
    /// `crate::math::layer_norm` of one row.
    fn layer_norm / layer_norm_body(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32])
}

multiversion! {
    /// Quantizes a row to symmetric 8-bit: returns `max |x|` (the caller derives the
    /// scale) and `Σ out[i]`; `out[i] = rint(x[i] · 127 / max)`, or 0 where `max` is 0 or
    /// not finite.
    fn quantize_row / quantize_row_body(x: &[f32], out: &mut [i8]) -> (f32, i32)
}

multiversion! {
    /// `out[j] (+)= (f32(acc[j]) · sa) · sw[j]`.
    fn dequantize_row / dequantize_row_body(acc: &[i32], sa: f32, sw: &[f32], out: &mut [f32], accumulate: bool)
}

multiversion! {
    /// `t[j] = (f32(acc[j]) · sa) · sw[j]`, then `t[j] += xo[c] · ow[c][j]` for each outlier
    /// channel `c` in order (`ow` is `xo.len() × out.len()`), then `out[j] (+)= t[j]`: the
    /// steps of a row with outlier channels, in one pass.
    fn dequantize_outliers / dequantize_outliers_body(acc: &[i32], sa: f32, sw: &[f32], xo: &[f32], ow: &[f32], out: &mut [f32], accumulate: bool)
}

multiversion! {
    /// `out[j] = gelu(u[j]) · g[j]` where `u` and `g` are the two halves (`out.len()` wide
    /// each) of a row that [`dequantize_outliers`] would store from `acc`, `sw` and `ow`
    /// (each `2 · out.len()` wide): the dequantization and ModernBERT's GeGLU in one pass,
    /// with the bits of the two steps one after the other (`out` never holds the row).
    fn dequantize_geglu / dequantize_geglu_body(acc: &[i32], sa: f32, sw: &[f32], xo: &[f32], ow: &[f32], out: &mut [f32])
}

/// Outputs per accumulator: one AVX-512 vector (two AVX2 ones, four SSE ones).
const VEC: usize = 16;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_body(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    d: usize,
    kt: &[f32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
) {
    let width = groups * VEC;
    assert!(holds_rows(q.len(), rows, q_stride, d) && kt.len() >= (g_lo + groups) * d * VEC);
    assert!(out.len() >= rows * width);
    for r in 0..rows {
        let qr = &q[r * q_stride..r * q_stride + d];
        for g in 0..groups {
            let group = &kt[(g_lo + g) * d * VEC..(g_lo + g + 1) * d * VEC];
            // One accumulator in registers over all of d, one channel after another.
            let mut acc = [0.0f32; VEC];
            for (&qc, keys) in qr.iter().zip(group.chunks_exact(VEC)) {
                for (a, &k) in acc.iter_mut().zip(keys) {
                    *a += qc * k;
                }
            }
            out[r * width + g * VEC..r * width + (g + 1) * VEC].copy_from_slice(&acc);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weighted_sum_rows_body(
    p: &[f32],
    rows: usize,
    p_row: usize,
    p_key: usize,
    v: &[f32],
    v_stride: usize,
    keys: usize,
    d: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(holds_probabilities(p.len(), rows, p_row, p_key, keys));
    assert!(holds_rows(v.len(), keys, v_stride, d));
    assert!(holds_rows(out.len(), rows, out_stride, d));
    for r in 0..rows {
        let o = &mut out[r * out_stride..r * out_stride + d];
        weighted_sum_body(&p[r * p_row..], p_key, keys, v, v_stride, d, o);
    }
}

#[inline(always)]
fn softmax_columns_body(s: &mut [f32], keys: usize, scale: f32) {
    // Rows as fixed-size arrays, so that each step is one vector operation a row (a slice
    // loop was vectorized across rows, with gathers).
    let (rows, _) = s[..keys * VEC].as_chunks_mut::<VEC>();
    let mut max = [f32::NEG_INFINITY; VEC];
    for row in rows.iter_mut() {
        for i in 0..VEC {
            row[i] *= scale;
            max[i] = max[i].max(row[i]);
        }
    }
    // `crate::math::sum`'s partial sums, each a vector of the columns' (key `j` is in lane
    // `j mod LANES` of its row's sum): whole rounds of LANES keys, then the rest.
    const LANES: usize = crate::math::LANES;
    let mut partial = [[0.0f32; VEC]; LANES];
    let (rounds, rest) = rows.as_chunks_mut::<LANES>();
    for round in rounds.iter_mut() {
        for (row, acc) in round.iter_mut().zip(partial.iter_mut()) {
            for i in 0..VEC {
                row[i] = crate::math::exp(row[i] - max[i]);
                acc[i] += row[i];
            }
        }
    }
    for (row, acc) in rest.iter_mut().zip(partial.iter_mut()) {
        for i in 0..VEC {
            row[i] = crate::math::exp(row[i] - max[i]);
            acc[i] += row[i];
        }
    }
    let mut total = [0.0f32; VEC];
    for acc in &partial {
        for i in 0..VEC {
            total[i] += acc[i];
        }
    }
    for row in rows.iter_mut() {
        // An opaque address a row: otherwise the AVX-512 copy divides across rows, with a
        // gather and a scatter each (a row is one vector division).
        let row = std::hint::black_box(row);
        for i in 0..VEC {
            row[i] /= total[i];
        }
    }
}

#[inline(always)]
fn softmax_row_body(s: &mut [f32], own_lo: usize, own_hi: usize, scale: f32) {
    let padded = own_hi.div_ceil(VEC) * VEC;
    if own_lo == 0 && padded <= s.len() {
        let (row, rest) = s.split_at_mut(padded);
        rest.fill(0.0);
        return softmax_row_from_zero(row, own_hi, scale);
    }
    let (head, rest) = s.split_at_mut(own_lo);
    let (own, tail) = rest.split_at_mut(own_hi - own_lo);
    head.fill(0.0);
    tail.fill(0.0);
    // The max in lanes: a max is exact, so its order does not matter.
    let mut lanes = [f32::NEG_INFINITY; VEC];
    let mut chunks = own.chunks_exact_mut(VEC);
    for c in &mut chunks {
        for (m, v) in lanes.iter_mut().zip(c) {
            *v *= scale;
            *m = m.max(*v);
        }
    }
    let mut max = f32::NEG_INFINITY;
    for v in chunks.into_remainder() {
        *v *= scale;
        max = max.max(*v);
    }
    let max = lanes.iter().fold(max, |m, &l| m.max(l));
    for v in own.iter_mut() {
        *v = crate::math::exp(*v - max);
    }
    let total = crate::math::sum(own);
    for v in own.iter_mut() {
        *v /= total;
    }
}

/// Rows softmaxed step by step together in [`softmax_rows_body`].
const SOFTMAX_GROUP: usize = 16;

#[inline(always)]
fn softmax_rows_body(s: &mut [f32], width: usize, own: &[(usize, usize)], scale: f32) {
    assert!(s.len() >= own.len() * width);
    let mut first = 0;
    for group in own.chunks(SOFTMAX_GROUP) {
        let rows = &mut s[first * width..(first + group.len()) * width];
        first += group.len();
        // A row's keys rounded up to whole blocks of VEC (`softmax_row_from_zero`'s run).
        let padded = |hi: usize| hi.div_ceil(VEC) * VEC;
        if group
            .iter()
            .any(|&(lo, hi)| lo != 0 || hi == 0 || padded(hi) > width)
        {
            for (row, &(lo, hi)) in rows.chunks_exact_mut(width).zip(group) {
                softmax_row_body(row, lo, hi, scale);
            }
            continue;
        }
        // The steps of `softmax_row_from_zero`, each over every row of the group before the
        // next: the same operations on each value, the same order in each total.
        let mut max = [f32::NEG_INFINITY; SOFTMAX_GROUP];
        for ((row, &(_, hi)), m) in rows.chunks_exact_mut(width).zip(group).zip(&mut max) {
            let (row, rest) = row.split_at_mut(padded(hi));
            rest.fill(0.0);
            *m = scaled_max(row, hi, scale);
        }
        let mut total = [0.0f32; SOFTMAX_GROUP];
        for (((row, &(_, hi)), &m), t) in rows
            .chunks_exact_mut(width)
            .zip(group)
            .zip(&max)
            .zip(&mut total)
        {
            *t = exp_from_zero(&mut row[..padded(hi)], hi, m);
        }
        for ((row, &(_, hi)), &t) in rows.chunks_exact_mut(width).zip(group).zip(&total) {
            for v in &mut row[..padded(hi)] {
                *v /= t;
            }
        }
    }
}

/// [`softmax_row_body`] where the query's keys start the row (`own_lo` = 0: every query of
/// a text within the window, as the workload's are), over whole blocks of [`VEC`] (`s` is
/// the row up to `own_hi` rounded up to a block): the lanes past `own_hi` are computed and
/// then set to zero, so no value is left to a one-at-a-time tail. The same bits: max and
/// exp are per value, and [`crate::math::sum`] over the zero-padded run puts each value in
/// the lane it has in `sum(&s[..own_hi])`, in the same order, followed only by `+ 0.0`
/// (exps are positive, so no `−0.0` turns into `+0.0`).
#[inline(always)]
fn softmax_row_from_zero(s: &mut [f32], own_hi: usize, scale: f32) {
    let max = scaled_max(s, own_hi, scale);
    let total = exp_from_zero(s, own_hi, max);
    for v in s.iter_mut() {
        *v /= total;
    }
}

/// Scales `s` (whole blocks of [`VEC`], `own_hi` of them the query's keys) by `scale`, and
/// returns the max of the query's keys.
#[inline(always)]
fn scaled_max(s: &mut [f32], own_hi: usize, scale: f32) -> f32 {
    // Whole blocks of the query's keys, then the block it ends in (if any), whose lanes
    // past `own_hi` are left out of the max.
    let full = own_hi / VEC * VEC;
    let rest = own_hi - full;
    let (body, last) = s.split_at_mut(full);
    let mut lanes = [f32::NEG_INFINITY; VEC];
    for c in body.chunks_exact_mut(VEC) {
        let c: &mut [f32; VEC] = c.try_into().expect("a block");
        for (m, v) in lanes.iter_mut().zip(c.iter_mut()) {
            *v *= scale;
            *m = m.max(*v);
        }
    }
    if let Ok(c) = <&mut [f32; VEC]>::try_from(last) {
        for (i, (m, v)) in lanes.iter_mut().zip(c.iter_mut()).enumerate() {
            *v *= scale;
            *m = m.max(if i < rest { *v } else { f32::NEG_INFINITY });
        }
    }
    // Halves folded onto halves: a max is exact, so this is the lanes' max in any order
    // (and a lane of only NaNs yields to the others, as in a fold), in 4 steps instead of a
    // chain of 16.
    let mut width = VEC;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] = lanes[i].max(lanes[i + width]);
        }
    }
    lanes[0].max(f32::NEG_INFINITY)
}

/// `s[j] = exp(s[j] − max)` for the query's keys (`j < own_hi`), 0 for the lanes past them
/// in the last block of [`VEC`]; returns [`crate::math::sum`] of the result (`s`: whole
/// blocks of VEC), added up block by block as the exps are written ([`crate::math::Partials`]).
#[inline(always)]
fn exp_from_zero(s: &mut [f32], own_hi: usize, max: f32) -> f32 {
    // Every block a whole number of `sum`'s chunks: the pieces give `sum`'s bits.
    const _: () = assert!(VEC.is_multiple_of(crate::math::LANES));
    debug_assert_eq!(
        s.len(),
        own_hi.div_ceil(VEC) * VEC,
        "the keys' whole blocks"
    );
    let full = own_hi / VEC * VEC;
    let rest = own_hi - full;
    let (body, last) = s.split_at_mut(full);
    let mut partials = crate::math::Partials::new();
    // Blocks in turn: the partial sums' chains (one add per `math::LANES` values) hide
    // behind the exps' independent ones.
    for block in body.as_chunks_mut::<VEC>().0 {
        for v in block.iter_mut() {
            *v = crate::math::exp(*v - max);
        }
        partials.add(block);
    }
    if let Ok(c) = <&mut [f32; VEC]>::try_from(last) {
        for (i, v) in c.iter_mut().enumerate() {
            let e = crate::math::exp(*v - max);
            *v = if i < rest { e } else { 0.0 };
        }
        partials.add(c);
    }
    partials.total()
}

/// `out[c] += Σ_j p[j · p_key] · v[j][c]` over `keys` keys in order; row `j` of `v` starts
/// at `j · v_stride`.
#[inline(always)]
fn weighted_sum_body(
    p: &[f32],
    p_key: usize,
    keys: usize,
    v: &[f32],
    v_stride: usize,
    d: usize,
    out: &mut [f32],
) {
    let p = p.iter().step_by(p_key.max(1)).take(keys);
    let out = &mut out[..d];
    let mut c0 = 0;
    while c0 < d {
        let w = VEC.min(d - c0);
        // Accumulators in registers over all keys, one key after another.
        let mut acc = [0.0f32; VEC];
        acc[..w].copy_from_slice(&out[c0..c0 + w]);
        if w == VEC {
            for (&pj, vj) in p.clone().zip(v.chunks(v_stride.max(1))) {
                let vj: &[f32; VEC] = vj[c0..c0 + VEC].try_into().expect("VEC values");
                for (a, &x) in acc.iter_mut().zip(vj) {
                    *a += pj * x;
                }
            }
        } else {
            for (&pj, vj) in p.clone().zip(v.chunks(v_stride.max(1))) {
                for (a, &x) in acc.iter_mut().zip(&vj[c0..c0 + w]) {
                    *a += pj * x;
                }
            }
        }
        out[c0..c0 + w].copy_from_slice(&acc[..w]);
        c0 += w;
    }
}

#[inline(always)]
fn geglu_body(input: &[f32], gate: &[f32], out: &mut [f32]) {
    let n = out.len().min(input.len()).min(gate.len());
    let full = n / GELU_BLOCK * GELU_BLOCK;
    let blocks = out[..full].chunks_exact_mut(GELU_BLOCK).zip(
        input
            .chunks_exact(GELU_BLOCK)
            .zip(gate.chunks_exact(GELU_BLOCK)),
    );
    for (o, (u, g)) in blocks {
        let (o, u, g) = (o.try_into(), u.try_into(), g.try_into());
        crate::math::gelu_gated::<GELU_BLOCK>(
            u.expect("a block"),
            g.expect("a block"),
            o.expect("a block"),
        );
    }
    for ((o, &u), &g) in out[full..n]
        .iter_mut()
        .zip(&input[full..])
        .zip(&gate[full..])
    {
        *o = crate::math::gelu(u) * g;
    }
}

/// Values of the GeGLU computed step by step together ([`crate::math::gelu_gated`]): eight
/// AVX-512 vectors (sixteen AVX2 ones). The GeGLU bench (64 × 1,024 values, Zen 4) did
/// 2.34 G values/s one value at a time, 2.49 / 2.64 / 2.86 / 2.70 / 1.12 with blocks of 2 /
/// 4 / 8 / 16 / 32 vectors; this CPU's AVX2 copy 1.43, and 1.94 / 1.55–2.00 / 1.76–2.10 with
/// 2 / 4 / 8.
const GELU_BLOCK: usize = 8 * VEC;

#[inline(always)]
fn rotate_heads_body(x: &mut [f32], d: usize, sin: &[f32], cos: &[f32]) {
    let half = d / 2;
    for head in x.chunks_exact_mut(d) {
        let (lo, hi) = head.split_at_mut(half);
        for (((a, b), &s), &c) in lo.iter_mut().zip(hi.iter_mut()).zip(sin).zip(cos) {
            let (x0, x1) = (*a, *b);
            *a = x0 * c + (-x1) * s;
            *b = x1 * c + x0 * s;
        }
    }
}

#[inline(always)]
fn layer_norm_body(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    crate::math::layer_norm(x, weight, eps, out);
}

#[inline(always)]
fn quantize_row_body(x: &[f32], out: &mut [i8]) -> (f32, i32) {
    // max |x| on the bit patterns: for non-negative floats their order is the integers'
    // (and an integer max vectorizes; a NaN, above infinity, is caught below).
    let max = f32::from_bits(
        x.iter()
            .fold(0u32, |m, &v| m.max(v.to_bits() & 0x7fff_ffff)),
    );
    if max == 0.0 || !max.is_finite() {
        out.iter_mut().for_each(|o| *o = 0);
        return (max, 0);
    }
    let inv = 127.0 / max;
    // Σ of the bit patterns below, wrapping: each is ROUND_MAGIC's plus the integer.
    let mut bits = 0u32;
    for (o, &v) in out.iter_mut().zip(x) {
        // Clamped to ±127 (|v · inv| ≤ 127 up to rounding), then rounded to the nearest
        // integer, ties to even, by the 1.5 · 2²³ addition: t = 1.5 · 2²³ + q exactly, in
        // the binade of 2²³ whose ulp is 1, so t's bits are ROUND_MAGIC's plus q, and their
        // low byte (ROUND_MAGIC's is 0) is q in two's complement: no saturating float-to-int
        // conversion, and q's sum is the bits' sum less ROUND_MAGIC's times the count.
        let t = (v * inv).clamp(-127.0, 127.0) + crate::math::ROUND_MAGIC;
        *o = t.to_bits() as u8 as i8;
        bits = bits.wrapping_add(t.to_bits());
    }
    let magic = crate::math::ROUND_MAGIC
        .to_bits()
        .wrapping_mul(out.len().min(x.len()) as u32);
    (max, bits.wrapping_sub(magic) as i32)
}

#[inline(always)]
fn dequantize_row_body(acc: &[i32], sa: f32, sw: &[f32], out: &mut [f32], accumulate: bool) {
    if accumulate {
        for ((o, &a), &s) in out.iter_mut().zip(acc).zip(sw) {
            *o += (a as f32) * sa * s;
        }
    } else {
        for ((o, &a), &s) in out.iter_mut().zip(acc).zip(sw) {
            *o = (a as f32) * sa * s;
        }
    }
}

/// A row's integer products and what dequantizes them: `acc`, `sw` and each outlier
/// channel's row of `ow` (`xo.len() × n`) are `n` wide.
struct Dequant<'a> {
    acc: &'a [i32],
    sa: f32,
    sw: &'a [f32],
    xo: &'a [f32],
    ow: &'a [f32],
    n: usize,
}

impl<'a> Dequant<'a> {
    /// The first `n` products and scales of a row, and its outlier channels' `n`-wide rows.
    #[inline(always)]
    fn new(acc: &'a [i32], sa: f32, sw: &'a [f32], xo: &'a [f32], ow: &'a [f32], n: usize) -> Self {
        let (acc, sw, ow) = (&acc[..n], &sw[..n], &ow[..xo.len() * n]);
        Dequant {
            acc,
            sa,
            sw,
            xo,
            ow,
            n,
        }
    }

    /// Outputs `j..j + VEC`: `(f32(acc) · sa) · sw`, then `+= xo[c] · ow[c]` for each
    /// outlier channel `c` in order.
    #[inline(always)]
    fn block(&self, j: usize) -> [f32; VEC] {
        let mut t = [0.0f32; VEC];
        self.blocks(j, &mut t);
        t
    }

    /// [`Dequant::block`] over `W` outputs from `j` into `t`, each step over all of them
    /// before the next (the same operations on each output, in the same order).
    #[inline(always)]
    fn blocks<const W: usize>(&self, j: usize, t: &mut [f32; W]) {
        let (acc, sa, sw, xo, ow, n) = (self.acc, self.sa, self.sw, self.xo, self.ow, self.n);
        let a: &[i32; W] = acc[j..j + W].try_into().expect("a block");
        let s: &[f32; W] = sw[j..j + W].try_into().expect("a block");
        for i in 0..W {
            t[i] = (a[i] as f32) * sa * s[i];
        }
        for (c, &x) in xo.iter().enumerate() {
            let w: &[f32; W] = ow[c * n + j..c * n + j + W].try_into().expect("a block");
            for i in 0..W {
                t[i] += x * w[i];
            }
        }
    }

    /// Output `j`, through [`Dequant::block`]'s steps.
    #[inline(always)]
    fn one(&self, j: usize) -> f32 {
        let (acc, sa, sw, xo, ow, n) = (self.acc, self.sa, self.sw, self.xo, self.ow, self.n);
        let mut t = (acc[j] as f32) * sa * sw[j];
        for (c, &x) in xo.iter().enumerate() {
            t += x * ow[c * n + j];
        }
        t
    }
}

#[inline(always)]
fn dequantize_outliers_body(
    acc: &[i32],
    sa: f32,
    sw: &[f32],
    xo: &[f32],
    ow: &[f32],
    out: &mut [f32],
    accumulate: bool,
) {
    let n = out.len();
    let row = Dequant::new(acc, sa, sw, xo, ow, n);
    // Whole blocks of outputs in fixed-size arrays (registers), then the tail one output
    // at a time through the same steps.
    let full = n / VEC * VEC;
    for j in (0..full).step_by(VEC) {
        let t = row.block(j);
        let o: &mut [f32; VEC] = (&mut out[j..j + VEC]).try_into().expect("a block");
        for i in 0..VEC {
            o[i] = if accumulate { o[i] + t[i] } else { t[i] };
        }
    }
    for (j, o) in out.iter_mut().enumerate().skip(full) {
        let t = row.one(j);
        *o = if accumulate { *o + t } else { t };
    }
}

#[inline(always)]
fn dequantize_geglu_body(
    acc: &[i32],
    sa: f32,
    sw: &[f32],
    xo: &[f32],
    ow: &[f32],
    out: &mut [f32],
) {
    let (h, n) = (out.len(), 2 * out.len());
    let row = Dequant::new(acc, sa, sw, xo, ow, n);
    // Blocks of GELU_BLOCK outputs: both halves dequantized, then the GeGLU step by step
    // over the block; then whole vectors; then the tail one output at a time.
    let blocks = h / GELU_BLOCK * GELU_BLOCK;
    let (mut u, mut g) = ([0.0f32; GELU_BLOCK], [0.0f32; GELU_BLOCK]);
    for j in (0..blocks).step_by(GELU_BLOCK) {
        row.blocks(j, &mut u);
        row.blocks(h + j, &mut g);
        let o: &mut [f32; GELU_BLOCK] = (&mut out[j..j + GELU_BLOCK]).try_into().expect("a block");
        crate::math::gelu_gated(&u, &g, o);
    }
    let full = h / VEC * VEC;
    for j in (blocks..full).step_by(VEC) {
        let (u, g) = (row.block(j), row.block(h + j));
        let o: &mut [f32; VEC] = (&mut out[j..j + VEC]).try_into().expect("a block");
        crate::math::gelu_gated(&u, &g, o);
    }
    for (j, o) in out.iter_mut().enumerate().skip(full) {
        let (u, g) = (row.one(j), row.one(h + j));
        *o = crate::math::gelu(u) * g;
    }
}

/// Columns of a packed fp32 weight panel (four AVX-512 vectors).
pub(crate) const FP32_PANEL: usize = 64;
/// Rows of one fp32 tile, and rows per block: a block of x stays in cache while every
/// panel of W streams by, so W streams once per block. 96 rows hold the engine's largest
/// call (`linear::ROW_CHUNK`) in one block; blocks of 48 made its 64-row MLP calls stream
/// W twice (BENCHMARKS.md, nineteenth step).
const FP32_MR: usize = 6;
const FP32_ROW_BLOCK: usize = 16 * FP32_MR;
/// Columns of one fp32 tile, for each instruction set: a tile's `FP32_MR ×` this many
/// accumulators must stay in registers over all of k, with room for a row of weights and
/// a broadcast. AVX-512 has 32 zmm (6 × 4 accumulators), AVX2 16 ymm (6 × 2), SSE2 16 xmm
/// (6 × 2), NEON 32 q (6 × 4). A 6 × 64 tile on AVX2 needed 48 ymm and spilled: the AVX2
/// GEMM ran at a third of MLAS's (BENCHMARKS.md).
#[cfg(target_arch = "x86_64")]
const FP32_NC_AVX512: usize = FP32_PANEL;
#[cfg(target_arch = "x86_64")]
const FP32_NC_AVX2: usize = 16;
#[cfg(target_arch = "aarch64")]
const FP32_NC_BASE: usize = 16;
#[cfg(not(target_arch = "aarch64"))]
const FP32_NC_BASE: usize = 8;

use super::aligned::Aligned;

/// Packs `w` (`n × k`, one row per output channel) into panels of [`FP32_PANEL`] columns,
/// each `k × FP32_PANEL` (k-major), zero-padded past `n`, from a cache line (so every row
/// of a panel, 256 bytes, starts one: no load of the tiles splits two).
pub(crate) fn pack_fp32(w: &[f32], n: usize, k: usize) -> Aligned<f32> {
    let panels = n.div_ceil(FP32_PANEL);
    let mut packed = Aligned::zeroed(panels * k * FP32_PANEL);
    for (col, row) in w.chunks_exact(k).enumerate().take(n) {
        let (p, j) = (col / FP32_PANEL, col % FP32_PANEL);
        for (kk, &v) in row.iter().enumerate() {
            packed[(p * k + kk) * FP32_PANEL + j] = v;
        }
    }
    packed
}

/// Outputs of one panel of a gated product ([`pack_fp32_gated`]): half its columns.
pub(crate) const FP32_GATED: usize = FP32_PANEL / 2;

/// Packs a gated layer's `w` (`2n × k`: the `n` rows of the input half, then the `n` of the
/// gate half, as ModernBERT's Wi holds them) into panels of [`FP32_PANEL`] columns as
/// [`pack_fp32`] does, each panel holding [`FP32_GATED`] outputs' input rows and then their
/// gate rows (a last panel of `m < FP32_GATED` outputs: `m` input rows, `m` gate rows, then
/// zeros). A tile then holds both halves of its outputs, and the GEMM applies the GeGLU
/// before anything is stored ([`Fp32Call::gated`]).
pub(crate) fn pack_fp32_gated(w: &[f32], n: usize, k: usize) -> Aligned<f32> {
    assert!(w.len() >= 2 * n * k, "a gated layer's weights are 2n × k");
    let panels = n.div_ceil(FP32_GATED);
    let mut packed = Aligned::zeroed(panels * k * FP32_PANEL);
    for p in 0..panels {
        let first = p * FP32_GATED;
        let outs = FP32_GATED.min(n - first);
        let sources = (first..first + outs).chain(n + first..n + first + outs);
        for (j, src) in sources.enumerate() {
            for (kk, &v) in w[src * k..(src + 1) * k].iter().enumerate() {
                packed[(p * k + kk) * FP32_PANEL + j] = v;
            }
        }
    }
    packed
}

/// The instruction sets the fp32 GEMM is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fp32Isa {
    /// AVX-512F with FMA, 6 × 64 tiles.
    Avx512,
    /// AVX2 with FMA, 6 × 16 tiles.
    Avx2,
    /// The target's baseline (SSE2 on x86-64, NEON on aarch64, simd128 on wasm), no FMA.
    Base,
}

impl Fp32Isa {
    /// Every variant, widest first.
    pub(crate) const ALL: [Fp32Isa; 3] = [Fp32Isa::Avx512, Fp32Isa::Avx2, Fp32Isa::Base];

    /// Whether this CPU runs it.
    pub(crate) fn available(self) -> bool {
        match self {
            Fp32Isa::Base => true,
            #[cfg(target_arch = "x86_64")]
            Fp32Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Fp32Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest this CPU runs.
    pub(crate) fn detect() -> Self {
        Self::ALL
            .into_iter()
            .find(|isa| isa.available())
            .unwrap_or(Fp32Isa::Base)
    }
}

/// `out (+)= x · Wᵀ` for `rows` rows of `x` (`rows × k`) with W packed by [`pack_fp32`];
/// `out` is `rows × n`. With `gated`, W is packed by [`pack_fp32_gated`] (`2n × k`) and
/// `out (+)= gelu(y[.., ..n]) · y[.., n..]` for `y = x · Wᵀ`, with the bits of the product
/// and then [`geglu`], but y is never stored. fp32 is not promised the same bits
/// everywhere: the AVX2 and AVX-512 versions fuse multiply and add (FMA), the baseline does
/// not.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fp32_gemm(
    x: &[f32],
    rows: usize,
    k: usize,
    packed: &[f32],
    n: usize,
    out: &mut [f32],
    accumulate: bool,
    gated: bool,
) {
    let call = Fp32Call {
        x,
        rows,
        k,
        packed,
        n,
        out,
        accumulate,
        gated,
    };
    call.on(Fp32Isa::detect());
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn fp32_gemm_avx512(c: Fp32Call<'_>) {
    c.run::<true, FP32_NC_AVX512>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fp32_gemm_avx2(c: Fp32Call<'_>) {
    c.run::<true, FP32_NC_AVX2>()
}

/// One [`fp32_gemm`] call's operands.
pub(crate) struct Fp32Call<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) rows: usize,
    pub(crate) k: usize,
    pub(crate) packed: &'a [f32],
    pub(crate) n: usize,
    pub(crate) out: &'a mut [f32],
    pub(crate) accumulate: bool,
    /// W packed by [`pack_fp32_gated`]: `out` gets the GeGLU of the product ([`fp32_gemm`]).
    pub(crate) gated: bool,
}

impl Fp32Call<'_> {
    /// [`fp32_gemm`] compiled for `isa`, or `None` (nothing written) where this CPU lacks it.
    pub(crate) fn on(self, isa: Fp32Isa) -> Option<()> {
        let (rows, k, n) = (self.rows, self.k, self.n);
        assert!(self.x.len() >= rows * k && self.out.len() >= rows * n);
        let per_panel = if self.gated { FP32_GATED } else { FP32_PANEL };
        assert!(self.packed.len() >= n.div_ceil(per_panel) * k * FP32_PANEL);
        if !isa.available() {
            return None;
        }
        match isa {
            // SAFETY: the CPU has AVX-512F and FMA (`available`); the body is safe Rust.
            #[cfg(target_arch = "x86_64")]
            Fp32Isa::Avx512 => unsafe { fp32_gemm_avx512(self) },
            // SAFETY: the CPU has AVX2 and FMA (`available`); the body is safe Rust.
            #[cfg(target_arch = "x86_64")]
            Fp32Isa::Avx2 => unsafe { fp32_gemm_avx2(self) },
            _ => self.run::<false, FP32_NC_BASE>(),
        }
        Some(())
    }

    /// [`fp32_gemm_body`] with FMA or not, tiles `NC` wide.
    #[inline(always)]
    fn run<const FMA: bool, const NC: usize>(self) {
        let Fp32Call {
            x,
            rows,
            k,
            packed,
            n,
            out,
            accumulate,
            gated,
        } = self;
        fp32_gemm_body::<FMA, NC>(x, rows, k, packed, n, out, accumulate, gated)
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fp32_gemm_body<const FMA: bool, const NC: usize>(
    x: &[f32],
    rows: usize,
    k: usize,
    packed: &[f32],
    n: usize,
    out: &mut [f32],
    accumulate: bool,
    gated: bool,
) {
    // Outputs of one panel.
    let per_panel = if gated { FP32_GATED } else { FP32_PANEL };
    let panels = n.div_ceil(per_panel);
    let quarter = k * FP32_PANEL / 4;
    // A gated tile's products: every value its GeGLU reads is written first.
    let mut y = [[0.0f32; FP32_PANEL]; FP32_MR];
    // Blocks of rows: each block's rows stay in cache while every panel of W streams by.
    for row0 in (0..rows).step_by(FP32_ROW_BLOCK) {
        let row_end = (row0 + FP32_ROW_BLOCK).min(rows);
        for p in 0..panels {
            let panel = &packed[p * k * FP32_PANEL..(p + 1) * k * FP32_PANEL];
            let next =
                (p + 1 < panels).then(|| &packed[(p + 1) * k * FP32_PANEL..][..k * FP32_PANEL]);
            let outs = per_panel.min(n - p * per_panel);
            // The panel's columns of W.
            let cols = if gated { 2 * outs } else { outs };
            // The next panel's lines are fetched by the first four tiles, a quarter each,
            // one a step, while this one is multiplied.
            let mut tile = 0;
            let mut ahead = || {
                tile += 1;
                next.filter(|_| tile <= 4)
                    .map(|next| &next[(tile - 1) * quarter..][..quarter])
            };
            if gated {
                // Every strip of a tile's rows, then their GeGLU while the products are in
                // registers or L1.
                for r in (row0..row_end).step_by(FP32_MR) {
                    let mut mr = 0;
                    for c0 in (0..cols).step_by(NC) {
                        let acc;
                        (acc, mr) = fp32_rows::<FMA, NC>(x, k, r, row_end, panel, c0, ahead());
                        for (y, acc) in y.iter_mut().zip(&acc) {
                            *strip::<NC>(y, c0) = *acc;
                        }
                    }
                    for (i, y) in y.iter().enumerate().take(mr) {
                        let at = (r + i) * n + p * FP32_GATED;
                        geglu_panel(y, &mut out[at..at + outs], accumulate);
                    }
                }
                continue;
            }
            // A strip of NC columns against every tile of the block.
            for c0 in (0..cols).step_by(NC) {
                let width = NC.min(cols - c0);
                for r in (row0..row_end).step_by(FP32_MR) {
                    let (acc, mr) = fp32_rows::<FMA, NC>(x, k, r, row_end, panel, c0, ahead());
                    for (i, acc) in acc.iter().enumerate().take(mr) {
                        let at = (r + i) * n + p * FP32_PANEL + c0;
                        let o = &mut out[at..at + width];
                        if accumulate {
                            for (o, &a) in o.iter_mut().zip(acc) {
                                *o += a;
                            }
                        } else if width == NC {
                            // A whole strip: a copy of known length, in registers (a copy
                            // of `width` values was a call to memcpy a row).
                            *strip::<NC>(o, 0) = *acc;
                        } else {
                            o.copy_from_slice(&acc[..width]);
                        }
                    }
                }
            }
        }
    }
}

/// The `NC` values of `row` from `c0`, as an array (so that copies into it have a known
/// length).
#[inline(always)]
fn strip<const NC: usize>(row: &mut [f32], c0: usize) -> &mut [f32; NC] {
    (&mut row[c0..c0 + NC]).try_into().expect("NC values")
}

/// Rows `r..row_end` of `x` (at most [`FP32_MR`] of them: the tile's rows, how many) times
/// the strip of the panel at column `c0`, fetching `ahead`'s lines if any. A function, not
/// a closure: a closure is compiled without its caller's target features, and FMA became a
/// call to `fmaf`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fp32_rows<const FMA: bool, const NC: usize>(
    x: &[f32],
    k: usize,
    r: usize,
    row_end: usize,
    panel: &[f32],
    c0: usize,
    ahead: Option<&[f32]>,
) -> ([[f32; NC]; FP32_MR], usize) {
    let mr = (row_end - r).min(FP32_MR);
    // A short tile repeats its last row; those accumulators are dropped.
    // Written out, not `array::from_fn`: that was a call per tile (0.85 % of an fp32 run's
    // samples on Zen 4).
    let row = |i: usize| {
        let row = r + i.min(mr - 1);
        &x[row * k..(row + 1) * k]
    };
    let tile_rows: [&[f32]; FP32_MR] = [row(0), row(1), row(2), row(3), row(4), row(5)];
    let acc = match ahead {
        Some(ahead) => fp32_tile::<FMA, NC, true>(tile_rows, panel, c0, ahead),
        None => fp32_tile::<FMA, NC, false>(tile_rows, panel, c0, &[]),
    };
    (acc, mr)
}

/// `out[j] (+)= gelu(y[j]) · y[m + j]` for the `m = out.len()` outputs of one row of a
/// gated panel (inputs first, then gates: [`pack_fp32_gated`]), with [`geglu`]'s bits.
#[inline(always)]
fn geglu_panel(y: &[f32; FP32_PANEL], out: &mut [f32], accumulate: bool) {
    let m = out.len();
    let mut g = [0.0f32; FP32_GATED];
    if m == FP32_GATED {
        let (input, gate) = y.split_at(FP32_GATED);
        let (input, gate) = (input.try_into(), gate.try_into());
        crate::math::gelu_gated::<FP32_GATED>(
            input.expect("half a panel"),
            gate.expect("half a panel"),
            &mut g,
        );
    } else {
        for (j, g) in g.iter_mut().enumerate().take(m) {
            *g = crate::math::gelu(y[j]) * y[m + j];
        }
    }
    if accumulate {
        out.iter_mut().zip(&g).for_each(|(o, &g)| *o += g);
    } else {
        out.copy_from_slice(&g[..m]);
    }
}

/// f32 values in a cache line.
const LINE: usize = 16;

/// Asks for the cache line that holds `line` to be brought into L2, ahead of its use.
#[inline(always)]
pub(crate) fn prefetch(line: &[f32]) {
    // SAFETY: SSE, which `_mm_prefetch` needs, is part of x86-64's baseline; a prefetch
    // reads nothing into registers and never faults (the address is a live slice's anyway).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr().cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// One tile: `FP32_MR × NC` accumulators, columns `c0..c0 + NC` of the panel, held in
/// registers over all of k. Each of `rows` (of x, `k` values each) is read in place, one
/// broadcast a step: the rows are walked side by side with the panel's rows (zipped
/// iterators, no index, so no bounds check keeps the accumulators out of registers).
/// With `PREFETCH`, `ahead` holds `k` cache lines of the next panel, one prefetched a step:
/// a weight matrix larger than L2 (the 30m shape's Wi, 2 MB) otherwise reaches the first
/// tile of each panel from L3 (BENCHMARKS.md, nineteenth step).
#[inline(always)]
fn fp32_tile<const FMA: bool, const NC: usize, const PREFETCH: bool>(
    rows: [&[f32]; FP32_MR],
    panel: &[f32],
    c0: usize,
    ahead: &[f32],
) -> [[f32; NC]; FP32_MR] {
    const { assert!(FP32_PANEL.is_multiple_of(NC) && FP32_MR == 6) };
    let mut acc = [[0.0f32; NC]; FP32_MR];
    let mut step = |w: &[f32], xk: [f32; FP32_MR]| {
        let w: &[f32; NC] = w[c0..c0 + NC].try_into().expect("a strip of a panel row");
        for (acc, &xv) in acc.iter_mut().zip(&xk) {
            for (a, &wv) in acc.iter_mut().zip(w) {
                *a = if FMA {
                    xv.mul_add(wv, *a)
                } else {
                    *a + xv * wv
                };
            }
        }
    };
    let [r0, r1, r2, r3, r4, r5] = rows;
    let steps = panel
        .chunks_exact(FP32_PANEL)
        .zip(r0)
        .zip(r1)
        .zip(r2)
        .zip(r3)
        .zip(r4)
        .zip(r5);
    if PREFETCH {
        for (((((((w, &a0), &a1), &a2), &a3), &a4), &a5), line) in
            steps.zip(ahead.chunks_exact(LINE))
        {
            prefetch(line);
            step(w, [a0, a1, a2, a3, a4, a5]);
        }
    } else {
        for ((((((w, &a0), &a1), &a2), &a3), &a4), &a5) in steps {
            step(w, [a0, a1, a2, a3, a4, a5]);
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// The dispatched version (the widest this CPU runs) gives the baseline's bits.
        #[test]
        fn every_width_gives_the_same_bits(
            (rows, d, groups, g_lo, seed) in (1usize..20, prop_oneof![1usize..70, (1usize..6).prop_map(|m| m * VEC)], 1usize..40)
                .prop_flat_map(|(rows, d, groups)| (Just(rows), Just(d), Just(groups), 0..groups, any::<u32>()))
        ) {
            let value = |i: usize| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5;
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let q: Vec<f32> = (0..rows * d).map(value).collect();
            let kt: Vec<f32> = (0..groups * d * VEC).map(|i| value(i + 7)).collect();
            let used = groups - g_lo;
            let width = used * VEC;
            let (mut a, mut b) = (vec![0.0; rows * width], vec![0.0; rows * width]);
            scores(&q, d, rows, d, &kt, g_lo, used, &mut a);
            scores_body(&q, d, rows, d, &kt, g_lo, used, &mut b);
            prop_assert_eq!(bits(&a), bits(&b));
            let raw_scores = a.clone();
            // q read in place, rows `stride` apart (a head's columns of Wqkv's rows): the same
            // bits, on every version.
            let stride = d + 1 + seed as usize % 40;
            let spread = |x: &[f32], rows: usize| {
                let mut wide = vec![f32::NAN; rows * stride];
                for (r, row) in x.chunks_exact(d).take(rows).enumerate() {
                    wide[r * stride..r * stride + d].copy_from_slice(row);
                }
                wide.truncate((rows - 1) * stride + d);
                wide
            };
            let q_wide = spread(&q, rows);
            let (mut c, mut e) = (vec![0.0; rows * width], vec![0.0; rows * width]);
            scores(&q_wide, stride, rows, d, &kt, g_lo, used, &mut c);
            scores_body(&q_wide, stride, rows, d, &kt, g_lo, used, &mut e);
            prop_assert_eq!(bits(&c), bits(&a));
            prop_assert_eq!(bits(&e), bits(&a));
            // Against the definition: key j of group g is kt[g][c][j].
            for r in 0..rows {
                for j in 0..width {
                    let (g, i) = (g_lo + j / VEC, j % VEC);
                    let want = (0..d).fold(0.0f32, |s, c| s + q[r * d + c] * kt[(g * d + c) * VEC + i]);
                    prop_assert_eq!(a[r * width + j].to_bits(), want.to_bits());
                }
            }
            // Each row's softmax over a window of its own (scores scaled up, so that exp
            // sees large and tiny arguments), zero elsewhere.
            let keys = width - (seed as usize % VEC).min(width - 1);
            let own = |r: usize| {
                let lo = (r * 7 + seed as usize) % keys;
                (lo, lo + 1 + (r * 13 + seed as usize / 7) % (keys - lo))
            };
            let mut p = a.iter().map(|x| x * 30.0).collect::<Vec<_>>();
            let mut p_body = p.clone();
            let owns: Vec<_> = (0..rows).map(own).collect();
            softmax_rows(&mut p, width, &owns, 0.125);
            for r in 0..rows {
                let (own_lo, own_hi) = own(r);
                softmax_row_body(&mut p_body[r * width..(r + 1) * width], own_lo, own_hi, 0.125);
                let row = &p[r * width..(r + 1) * width];
                prop_assert!(row[..own_lo].iter().chain(&row[own_hi..]).all(|&x| x == 0.0));
                let total: f64 = row.iter().map(|&x| f64::from(x)).sum();
                prop_assert!((total - 1.0).abs() < 1e-5, "softmax total {}", total);
            }
            prop_assert_eq!(bits(&p), bits(&p_body));
            // The blocked weighted sum over the union of windows equals each row's sum over
            // its own window alone, bit for bit (the zeros outside change nothing).
            let v: Vec<f32> = (0..keys * d).map(|i| value(i + 11)).collect();
            let (mut a, mut b) = (vec![0.25; rows * d], vec![0.25; rows * d]);
            weighted_sum_rows(&p, rows, width, 1, &v, d, keys, d, &mut a, d);
            weighted_sum_rows_body(&p, rows, width, 1, &v, d, keys, d, &mut b, d);
            prop_assert_eq!(bits(&a), bits(&b));
            for r in 0..rows {
                let (own_lo, own_hi) = own(r);
                let mut alone = vec![0.25; d];
                weighted_sum_body(&p[r * width + own_lo..r * width + own_hi], 1, own_hi - own_lo, &v[own_lo * d..own_hi * d], d, d, &mut alone);
                prop_assert_eq!(bits(&a[r * d..(r + 1) * d]), bits(&alone));
            }
            // v read and out written in place, rows `stride` apart: the same bits, and the
            // values between the rows untouched.
            let v_wide = spread(&v, keys);
            let start = spread(&vec![0.25; rows * d], rows);
            let (mut c, mut e) = (start.clone(), start.clone());
            weighted_sum_rows(&p, rows, width, 1, &v_wide, stride, keys, d, &mut c, stride);
            weighted_sum_rows_body(&p, rows, width, 1, &v_wide, stride, keys, d, &mut e, stride);
            prop_assert_eq!(bits(&c), bits(&spread(&a, rows)));
            prop_assert_eq!(bits(&e), bits(&spread(&a, rows)));
            // By column, as a text within the window runs: the first rows' scores against
            // every key, transposed into `keys × VEC` (the lanes past them zero), softmaxed
            // down the columns, give each row's bits softmaxed over all its keys, and the
            // weighted sums reading them by column give the rows' bits.
            let n = rows.min(VEC);
            let mut cols = vec![0.0f32; keys * VEC];
            for r in 0..n {
                for j in 0..keys {
                    cols[j * VEC + r] = raw_scores[r * width + j] * 30.0;
                }
            }
            let mut cols_body = cols.clone();
            softmax_columns(&mut cols, keys, 0.125);
            softmax_columns_body(&mut cols_body, keys, 0.125);
            prop_assert_eq!(bits(&cols), bits(&cols_body));
            let mut by_rows: Vec<f32> = raw_scores[..n * width].iter().map(|x| x * 30.0).collect();
            softmax_rows(&mut by_rows, width, &vec![(0, keys); n], 0.125);
            for r in 0..n {
                for j in 0..keys {
                    prop_assert_eq!(cols[j * VEC + r].to_bits(), by_rows[r * width + j].to_bits());
                }
            }
            let (mut f, mut g, mut h) = (vec![0.25; n * d], vec![0.25; n * d], vec![0.25; n * d]);
            weighted_sum_rows(&cols, n, 1, VEC, &v, d, keys, d, &mut f, d);
            weighted_sum_rows_body(&cols, n, 1, VEC, &v, d, keys, d, &mut g, d);
            weighted_sum_rows(&by_rows, n, width, 1, &v, d, keys, d, &mut h, d);
            prop_assert_eq!(bits(&f), bits(&h));
            prop_assert_eq!(bits(&g), bits(&h));
            let p: Vec<f32> = (0..width).map(|i| value(i + 3)).collect();
            let u: Vec<f32> = (0..width).map(|i| value(i + 5) * 40.0).collect();
            let (mut a, mut b) = (vec![0.0; width], vec![0.0; width]);
            geglu(&u, &p, &mut a);
            geglu_body(&u, &p, &mut b);
            prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            let want: Vec<f32> = u.iter().zip(&p).map(|(&u, &g)| crate::math::gelu(u) * g).collect();
            prop_assert_eq!(bits(&a), bits(&want));
            // Rotary: heads of 8 over the first 8·⌊width/8⌋ values; against the pairs written out.
            let d = 8;
            let heads = width / d;
            let (sin, cos): (Vec<f32>, Vec<f32>) = (0..d / 2).map(|j| (value(j + 17), value(j + 19))).unzip();
            let mut r = u[..heads * d].to_vec();
            rotate_heads(&mut r, d, &sin, &cos);
            for (head, orig) in r.chunks_exact(d).zip(u.chunks_exact(d)) {
                for j in 0..d / 2 {
                    let (x0, x1) = (orig[j], orig[j + d / 2]);
                    prop_assert_eq!(head[j].to_bits(), (x0 * cos[j] - x1 * sin[j]).to_bits());
                    prop_assert_eq!(head[j + d / 2].to_bits(), (x1 * cos[j] + x0 * sin[j]).to_bits());
                }
            }
            let w: Vec<f32> = (0..width).map(|i| 1.0 + value(i + 9)).collect();
            layer_norm(&u, &w, 1e-5, &mut a);
            layer_norm_body(&u, &w, 1e-5, &mut b);
            prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            let (mut qa, mut qb) = (vec![0i8; width], vec![0i8; width]);
            let ((max_a, sum_a), (max_b, sum_b)) = (quantize_row(&u, &mut qa), quantize_row_body(&u, &mut qb));
            prop_assert_eq!((max_a.to_bits(), sum_a), (max_b.to_bits(), sum_b));
            prop_assert_eq!(&qa, &qb);
            // The sum is the bytes' own.
            prop_assert_eq!(sum_a, qa.iter().map(|&q| i32::from(q)).sum::<i32>());
            // And the magic-number rounding is rint: ties to even, clamped.
            let max = u.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
            for (&q, &v) in qa.iter().zip(&u) {
                let want = if max == 0.0 { 0.0 } else { (v * (127.0 / max)).round_ties_even().clamp(-127.0, 127.0) };
                prop_assert_eq!(f32::from(q), want);
            }
            let acc: Vec<i32> = (0..width).map(|i| (value(i + 13) * 1e6) as i32).collect();
            for accumulate in [false, true] {
                let (mut a, mut b) = (vec![0.5; width], vec![0.5; width]);
                dequantize_row(&acc, 0.003, &w, &mut a, accumulate);
                dequantize_row_body(&acc, 0.003, &w, &mut b, accumulate);
                prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                // With two outlier channels: the steps written out one after another.
                let xo = [value(23) * 30.0, value(29)];
                let ow: Vec<f32> = (0..2 * width).map(|i| value(i + 31) * 0.01).collect();
                let mut want = vec![0.5f32; width];
                for (j, o) in want.iter_mut().enumerate() {
                    let mut t = (acc[j] as f32) * 0.003 * w[j];
                    t += xo[0] * ow[j];
                    t += xo[1] * ow[width + j];
                    *o = if accumulate { *o + t } else { t };
                }
                let (mut a, mut b) = (vec![0.5; width], vec![0.5; width]);
                dequantize_outliers(&acc, 0.003, &w, &xo, &ow, &mut a, accumulate);
                dequantize_outliers_body(&acc, 0.003, &w, &xo, &ow, &mut b, accumulate);
                prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                prop_assert_eq!(b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            // Dequantization and GeGLU in one pass: a row of 2·width, with and without
            // outlier channels, against the two steps one after the other.
            let acc2: Vec<i32> = (0..2 * width).map(|i| (value(i + 37) * 1e6) as i32).collect();
            let w2: Vec<f32> = (0..2 * width).map(|i| 1.0 + value(i + 41)).collect();
            let ow2: Vec<f32> = (0..4 * width).map(|i| value(i + 43) * 0.01).collect();
            for xo in [&[][..], &[value(47) * 30.0, value(53)][..]] {
                let mut row = vec![0.0f32; 2 * width];
                dequantize_outliers_body(&acc2, 0.0007, &w2, xo, &ow2[..xo.len() * 2 * width], &mut row, false);
                // GELU value by value (the blocks' steps are another order of its operations).
                let want: Vec<f32> = (0..width).map(|j| crate::math::gelu(row[j]) * row[width + j]).collect();
                let (mut a, mut b) = (vec![0.5; width], vec![0.5; width]);
                dequantize_geglu(&acc2, 0.0007, &w2, xo, &ow2[..xo.len() * 2 * width], &mut a);
                dequantize_geglu_body(&acc2, 0.0007, &w2, xo, &ow2[..xo.len() * 2 * width], &mut b);
                prop_assert_eq!(bits(&a), bits(&want));
                prop_assert_eq!(bits(&b), bits(&want));
            }
        }
    }

    /// `len` values in [−1, 1): `(i · step) mod period`, scaled (operands of the GEMM tests).
    fn sawtooth(len: usize, step: usize, period: usize) -> Vec<f32> {
        let half = (period / 2) as f32;
        (0..len)
            .map(|i| ((i * step) % period) as f32 / half - 1.0)
            .collect()
    }

    /// The packed fp32 GEMM, every version this CPU runs, against an f64 sum, on shapes
    /// with every kind of tail (rows, panels, strips), storing and accumulating.
    #[test]
    fn fp32_gemm_matches_f64() {
        for (rows, n, k) in [
            (1, 1, 1),
            (7, 65, 33),
            (5, 40, 20),
            (13, 130, 257),
            (49, 64, 16),
            // Past one block of rows (`FP32_ROW_BLOCK`), with a short tile after it.
            (FP32_ROW_BLOCK + 5, 70, 9),
        ] {
            let x = sawtooth(rows * k, 37, 23);
            let w = sawtooth(n * k, 53, 29);
            let packed = pack_fp32(&w, n, k);
            let runs = Fp32Isa::ALL.into_iter().filter(|isa| isa.available());
            for (isa, accumulate) in runs.flat_map(|isa| [(isa, false), (isa, true)]) {
                let mut out = vec![0.5f32; rows * n];
                let call = Fp32Call {
                    x: &x,
                    rows,
                    k,
                    packed: &packed,
                    n,
                    out: &mut out,
                    accumulate,
                    gated: false,
                };
                call.on(isa);
                for r in 0..rows {
                    for c in 0..n {
                        let want: f64 = (0..k)
                            .map(|kk| x[r * k + kk] as f64 * w[c * k + kk] as f64)
                            .sum::<f64>()
                            + if accumulate { 0.5 } else { 0.0 };
                        let got = out[r * n + c] as f64;
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{isa:?} {rows}×{n}×{k} [{r}][{c}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The gated GEMM, every version this CPU runs, gives the bits of the plain GEMM of the
    /// same version followed by the GeGLU value by value: with a last part panel, one part
    /// panel alone, more than one block of rows and a short tile, stored and added.
    #[test]
    fn gated_fp32_gemm_is_the_product_then_the_geglu() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (rows, n, k) in [
            (1, 1, 1),
            (7, 70, 33),
            (5, 32, 20),
            (13, 5, 64),
            (FP32_ROW_BLOCK + 5, 100, 9),
        ] {
            let x = sawtooth(rows * k, 37, 23);
            let w = sawtooth(2 * n * k, 53, 29);
            let (plain, gated) = (pack_fp32(&w, 2 * n, k), pack_fp32_gated(&w, n, k));
            let runs = Fp32Isa::ALL.into_iter().filter(|isa| isa.available());
            for (isa, accumulate) in runs.flat_map(|isa| [(isa, false), (isa, true)]) {
                let mut y = vec![0.0f32; rows * 2 * n];
                let call = Fp32Call {
                    x: &x,
                    rows,
                    k,
                    packed: &plain,
                    n: 2 * n,
                    out: &mut y,
                    accumulate: false,
                    gated: false,
                };
                call.on(isa);
                let start = |i: usize| (i % 7) as f32 - 3.0;
                let want: Vec<f32> = y
                    .chunks_exact(2 * n)
                    .flat_map(|y| (0..n).map(|j| crate::math::gelu(y[j]) * y[n + j]))
                    .enumerate()
                    .map(|(i, g)| if accumulate { start(i) + g } else { g })
                    .collect();
                let mut out: Vec<f32> = (0..rows * n).map(start).collect();
                let call = Fp32Call {
                    x: &x,
                    rows,
                    k,
                    packed: &gated,
                    n,
                    out: &mut out,
                    accumulate,
                    gated: true,
                };
                call.on(isa);
                assert_eq!(bits(&out), bits(&want), "{isa:?} {rows}×{n}×{k}");
            }
        }
    }

    proptest! {
        /// The register transposes give the value-at-a-time transpose, padding lanes zero
        /// (the buffer starts full of NaNs), on every length around a group, at strides
        /// wider than a row.
        #[test]
        fn transposed_keys_are_the_keys(len in 1usize..70, blocks in 1usize..5, pad in 0usize..40, seed in any::<u32>()) {
            let d = blocks * VEC;
            let stride = d + pad;
            let k: Vec<f32> = (0..len * stride)
                .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
                .collect();
            let size = len.div_ceil(VEC) * d * VEC;
            let (mut a, mut b) = (vec![f32::NAN; size], vec![f32::NAN; size]);
            transpose_keys(&k, stride, len, d, &mut a);
            transpose_keys_portable(&k, stride, len, d, &mut b);
            for (g, group) in b.chunks_exact(d * VEC).enumerate() {
                for (c, lanes) in group.chunks_exact(VEC).enumerate() {
                    for (i, &x) in lanes.iter().enumerate() {
                        let j = g * VEC + i;
                        let want = if j < len { k[j * stride + c] } else { 0.0 };
                        prop_assert_eq!(x.to_bits(), want.to_bits());
                    }
                }
            }
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&a), bits(&b));
        }
    }

    /// The softmax one value at a time, as written before the whole-block path: scale, the
    /// max of the query's keys, exp(x − max), `math::sum` over exactly those keys, divide.
    fn softmax_one_at_a_time(s: &mut [f32], own_lo: usize, own_hi: usize, scale: f32) {
        let own = &mut s[own_lo..own_hi];
        own.iter_mut().for_each(|v| *v *= scale);
        let max = own.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        own.iter_mut().for_each(|v| *v = crate::math::exp(*v - max));
        let total = crate::math::sum(own);
        own.iter_mut().for_each(|v| *v /= total);
        s[..own_lo].fill(0.0);
        s[own_hi..].fill(0.0);
    }

    proptest! {
        /// Both paths of the softmax (keys from the row's start over whole blocks, and keys
        /// from anywhere) give the bits of the one-value-at-a-time definition, on every row
        /// length around the block and lane sizes, in the dispatched and baseline versions.
        #[test]
        fn softmax_paths_give_the_definitions_bits(
            (width, own_lo, own_len, seed) in (1usize..6)
                .prop_flat_map(|blocks| (Just(blocks * VEC), 0..blocks * VEC))
                .prop_flat_map(|(width, lo)| (Just(width), prop_oneof![Just(0), Just(lo)], 1..=width, any::<u32>()))
        ) {
            let own_hi = (own_lo + own_len).min(width);
            let own_lo = own_lo.min(own_hi - 1);
            let value = |i: usize| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 * 40.0 - 20.0;
            let row: Vec<f32> = (0..width).map(value).collect();
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut want = row.clone();
            softmax_one_at_a_time(&mut want, own_lo, own_hi, 0.125);
            let (mut a, mut b) = (row.clone(), row);
            softmax_rows(&mut a, width, &[(own_lo, own_hi)], 0.125);
            softmax_row_body(&mut b, own_lo, own_hi, 0.125);
            prop_assert_eq!(bits(&a), bits(&want));
            prop_assert_eq!(bits(&b), bits(&want));
        }

        /// A block's rows softmaxed together (keys from each row's start, ends of their own,
        /// more rows than one group) give each row's bits alone, as do blocks with one row
        /// whose keys start later (the rows one at a time), in both versions.
        #[test]
        fn softmax_rows_give_each_rows_bits(
            (blocks, rows, seed, late) in (1usize..4, 1usize..40, any::<u32>(), any::<bool>())
        ) {
            let width = blocks * VEC;
            let own: Vec<(usize, usize)> = (0..rows)
                .map(|r| {
                    let hi = 1 + (r.wrapping_mul(2_654_435_761) ^ seed as usize) % width;
                    (if late && r == rows / 2 { hi - 1 } else { 0 }, hi)
                })
                .collect();
            let value = |i: usize| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 * 40.0 - 20.0;
            let block: Vec<f32> = (0..rows * width).map(value).collect();
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut want = block.clone();
            for (row, &(lo, hi)) in want.chunks_exact_mut(width).zip(&own) {
                softmax_one_at_a_time(row, lo, hi, 0.125);
            }
            let (mut a, mut b) = (block.clone(), block);
            softmax_rows(&mut a, width, &own, 0.125);
            softmax_rows_body(&mut b, width, &own, 0.125);
            prop_assert_eq!(bits(&a), bits(&want));
            prop_assert_eq!(bits(&b), bits(&want));
        }
    }
}
