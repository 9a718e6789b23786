//! Attention: the rotary tables, the additive biases of the batch graph, the blocks of the
//! long graph's local layers, and one layer's attention on its `Wqkv` projection.

use ruri_core::AttentionKind;

use super::ops::{Builder, FLOAT, attr};
use super::{Shapes, Shared};

/// A finite "minus infinity" for additive masks: two of them still add up to a finite value
/// (two −3.4e38 make −inf, and −inf − −inf is NaN).
pub(super) const MASKED: f32 = -1e30;

/// The long graph's local attention by blocks of `C = local_attention / 2` queries.
pub(super) struct Blocks {
    /// Flat indices of the (clamped) query rows of each block, `nb · C`.
    query_index: String,
    /// Flat indices of the (clamped) key rows of each block's window, `nb · 3C`.
    key_index: String,
    /// `[nb, 1, C, 3C]` additive bias: the band and the sequence's ends.
    bias: String,
    /// `[-1, C, H]` and `[-1, 3C, H]` reshape targets, `[1, -1, H]` back.
    query_shape: String,
    key_shape: String,
    back_shape: String,
    /// `[0]`, `[S]` and `[1]` for slicing the padded blocks back to `S` rows.
    zero: String,
    length: String,
    axis1: String,
}

/// The `positions × head_dim / 2` cosine and sine tables of rotary embeddings.
pub(super) fn rope(theta: f64, positions: usize, head_dim: usize) -> (Vec<f32>, Vec<f32>) {
    // As transformers computes it: inv_freq in f32, angles = position · inv_freq in f32.
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
        .collect();
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for &f in &inv {
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// The batch graph's biases `[B, 1, S, S]` from `attention_mask`: padding for global layers,
/// and (when the model has local layers) padding plus the `|i − j| ≤ half_window` band.
pub(super) fn batch_biases(
    b: &mut Builder,
    s: &Shapes,
    masked: &str,
    zero_f: &str,
) -> ort::Result<(String, Option<String>)> {
    // Padding: (mask − 1) · 1e30 → 0 or −1e30, as [B, 1, 1, S], expanded to [B, 1, S, S].
    let mask = b.one("Cast", &["attention_mask"], vec![attr("to", FLOAT)?])?;
    let one = b.scalar_f32("one", 1.0)?;
    let big = b.scalar_f32("big", -MASKED)?;
    let minus = b.one("Sub", &[&mask, &one], vec![])?;
    let pad = b.one("Mul", &[&minus, &big], vec![])?;
    let axes = b.i64s("axes12", &[1, 2])?;
    let pad4 = b.one("Unsqueeze", &[&pad, &axes], vec![])?;
    let shape = b.one("Shape", &["attention_mask"], vec![])?;
    let (s0, s1, s2) = (
        b.i64s("s0", &[0])?,
        b.i64s("s1", &[1])?,
        b.i64s("s2", &[2])?,
    );
    let batch = b.one("Slice", &[&shape, &s0, &s1], vec![])?;
    let seq = b.one("Slice", &[&shape, &s1, &s2], vec![])?;
    let one_i = b.i64s("one_i", &[1])?;
    let shape4 = b.one(
        "Concat",
        &[&batch, &one_i, &seq, &seq],
        vec![attr("axis", 0i64)?],
    )?;
    let global = b.one("Expand", &[&pad4, &shape4], vec![])?;
    if !s.kinds.contains(&AttentionKind::Local) {
        return Ok((global, None));
    }
    let zero_i = b.scalar_i64("zero_i", 0)?;
    let one_s = b.scalar_i64("one_s", 1)?;
    let seq_scalar = b.one("Squeeze", &[&seq], vec![])?;
    let range = b.one("Range", &[&zero_i, &seq_scalar, &one_s], vec![])?;
    let a1 = b.i64s("a1", &[1])?;
    let a0 = b.i64s("a0", &[0])?;
    let rows = b.one("Unsqueeze", &[&range, &a1], vec![])?;
    let cols = b.one("Unsqueeze", &[&range, &a0], vec![])?;
    let diff = b.one("Sub", &[&rows, &cols], vec![])?;
    let dist = b.one("Abs", &[&diff], vec![])?;
    let window = b.scalar_i64("half_window", s.half_window as i64)?;
    let far = b.one("Greater", &[&dist, &window], vec![])?;
    let band = b.one("Where", &[&far, masked, zero_f], vec![])?;
    let local = b.one("Add", &[&global, &band], vec![])?;
    Ok((global, Some(local)))
}

/// The long graph's blocks, from the length of `embeddings` (`[1, S, H]`).
pub(super) fn long_blocks(
    b: &mut Builder,
    s: &Shapes,
    masked: &str,
    zero_f: &str,
) -> ort::Result<Blocks> {
    let c = s.half_window.max(1) as i64;
    let shape = b.one("Shape", &["embeddings"], vec![])?;
    let (s1, s2) = (b.i64s("s1", &[1])?, b.i64s("s2", &[2])?);
    let length = b.one("Slice", &[&shape, &s1, &s2], vec![])?;
    let seq = b.one("Squeeze", &[&length], vec![])?;
    let zero_i = b.scalar_i64("zero_i", 0)?;
    let one_s = b.scalar_i64("one_s", 1)?;
    let c_s = b.scalar_i64("block", c)?;
    let c_minus = b.scalar_i64("block_minus_1", c - 1)?;
    // nb = ceil(S / C); padded length nb · C.
    let plus = b.one("Add", &[&seq, &c_minus], vec![])?;
    let nb = b.one("Div", &[&plus, &c_s], vec![])?;
    let padded = b.one("Mul", &[&nb, &c_s], vec![])?;
    let last = b.one("Sub", &[&seq, &one_s], vec![])?;
    let range = b.one("Range", &[&zero_i, &padded, &one_s], vec![])?;
    let query_index = b.one("Min", &[&range, &last], vec![])?;
    // Window of block n: positions n·C − C + t, t < 3C.
    let blocks = b.one("Range", &[&zero_i, &nb, &one_s], vec![])?;
    let starts = b.one("Mul", &[&blocks, &c_s], vec![])?;
    let starts = b.one("Sub", &[&starts, &c_s], vec![])?;
    let a1 = b.i64s("a1", &[1])?;
    let starts = b.one("Unsqueeze", &[&starts, &a1], vec![])?;
    let offsets: Vec<i64> = (0..3 * c).collect();
    let offsets = b.init("window_offsets", &[1, 3 * c], &offsets)?;
    let window = b.one("Add", &[&starts, &offsets], vec![])?; // [nb, 3C]
    let below = b.one("Less", &[&window, &zero_i], vec![])?;
    let above = b.one("Greater", &[&window, &last], vec![])?;
    let outside = b.one("Or", &[&below, &above], vec![])?;
    let ends = b.one("Where", &[&outside, masked, zero_f], vec![])?;
    let shape_ends = b.i64s("shape_ends", &[-1, 1, 1, 3 * c])?;
    let ends = b.one("Reshape", &[&ends, &shape_ends], vec![])?;
    // The band inside a window, the same for every block: query c (at n·C + c)
    // sees window position t (at n·C − C + t) iff |t − C − c| ≤ half_window.
    let hw = s.half_window as i64;
    let band: Vec<f32> = (0..c)
        .flat_map(|q| (0..3 * c).map(move |t| if (t - c - q).abs() <= hw { 0.0 } else { MASKED }))
        .collect();
    let band = b.init("band", &[c, 3 * c], &band)?;
    let bias = b.one("Add", &[&ends, &band], vec![])?;
    let clamped = b.one("Max", &[&window, &zero_i], vec![])?;
    let clamped = b.one("Min", &[&clamped, &last], vec![])?;
    let flat = b.i64s("flat", &[-1])?;
    let key_index = b.one("Reshape", &[&clamped, &flat], vec![])?;
    let hidden = s.hidden as i64;
    Ok(Blocks {
        query_index,
        key_index,
        bias,
        query_shape: b.i64s("query_shape", &[-1, c, hidden])?,
        key_shape: b.i64s("key_shape", &[-1, 3 * c, hidden])?,
        back_shape: b.i64s("back_shape", &[1, -1, hidden])?,
        zero: b.i64s("zero1", &[0])?,
        length,
        axis1: b.i64s("axis1", &[1])?,
    })
}

/// Rotary embeddings (not interleaved: transformers' `rotate_half`) on `t` (`[B, S, H]`),
/// every sequence starting at `positions`.
fn rotary(
    b: &mut Builder,
    t: &str,
    positions: &str,
    (cos, sin): &(String, String),
) -> ort::Result<String> {
    b.contrib(
        "RotaryEmbedding",
        &[t, positions, cos, sin],
        vec![attr("interleaved", 0i64)?],
    )
}

/// One layer's attention on its `qkv` projection (`[B, S, 3H]`): split, rotary embeddings
/// with the layer kind's θ, then [`attend`].
pub(super) fn attention(
    b: &mut Builder,
    s: &Shapes,
    shared: &Shared,
    kind: AttentionKind,
    qkv: &str,
) -> ort::Result<String> {
    let mut parts = b.op(
        "Split",
        ort::editor::ONNX_DOMAIN,
        &[qkv],
        3,
        vec![attr("axis", -1i64)?, attr("num_outputs", 3i64)?],
    )?;
    let v = parts.pop().expect("three outputs");
    let k = parts.pop().expect("three outputs");
    let q = parts.pop().expect("three outputs");
    let tables = match kind {
        AttentionKind::Global => &shared.rope_global,
        AttentionKind::Local => &shared.rope_local,
    };
    let q = rotary(b, &q, &shared.positions, tables)?;
    let k = rotary(b, &k, &shared.positions, tables)?;
    attend(b, s, shared, kind, &q, &k, &v)
}

/// `MultiHeadAttention` of `q`, `k`, `v` (`[B, S, H]`): with the kind's bias (batch graph),
/// without a bias (long graph, global layers), or by blocks (long graph, local layers).
fn attend(
    b: &mut Builder,
    s: &Shapes,
    shared: &Shared,
    kind: AttentionKind,
    q: &str,
    k: &str,
    v: &str,
) -> ort::Result<String> {
    let mha_attrs = || -> ort::Result<Vec<_>> {
        Ok(vec![
            attr("num_heads", s.heads as i64)?,
            attr("scale", (s.head_dim as f32).powf(-0.5))?,
        ])
    };
    let bias = match kind {
        AttentionKind::Global => shared.global_bias.as_deref(),
        AttentionKind::Local => shared.local_bias.as_deref(),
    };
    match (kind, &shared.blocks) {
        (AttentionKind::Local, Some(bl)) => {
            // Blocks of C queries against their 3C-key windows (clamped indices; the bias
            // masks positions outside the sequence and outside the band).
            let gather = |b: &mut Builder, t: &str, idx: &str, shape: &str| {
                let g = b.one("Gather", &[t, idx], vec![attr("axis", 1i64)?])?;
                b.one("Reshape", &[&g, shape], vec![])
            };
            let qb = gather(b, q, &bl.query_index, &bl.query_shape)?;
            let kb = gather(b, k, &bl.key_index, &bl.key_shape)?;
            let vb = gather(b, v, &bl.key_index, &bl.key_shape)?;
            let out = b.contrib(
                "MultiHeadAttention",
                &[&qb, &kb, &vb, "", "", &bl.bias],
                mha_attrs()?,
            )?;
            let out = b.one("Reshape", &[&out, &bl.back_shape], vec![])?;
            b.one("Slice", &[&out, &bl.zero, &bl.length, &bl.axis1], vec![])
        }
        _ => {
            let inputs: Vec<&str> = match bias {
                Some(bias) => vec![q, k, v, "", "", bias],
                None => vec![q, k, v],
            };
            b.contrib("MultiHeadAttention", &inputs, mha_attrs()?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ops::testing::{Input, builder, max_diff, run, values};
    use super::super::{Linears, Variant, shared_nodes};
    use super::*;

    /// Two heads of 4, a window of |i − j| ≤ 2 (local blocks of 2 queries), one global layer
    /// and one local layer.
    fn shapes() -> Shapes {
        Shapes {
            hidden: 8,
            heads: 2,
            head_dim: 4,
            intermediate: 16,
            half_window: 2,
            eps: 1e-5,
            kinds: vec![AttentionKind::Global, AttentionKind::Local],
            max_positions: 16,
            global_theta: 160_000.0,
            local_theta: 10_000.0,
        }
    }

    /// Softmax attention in f64, head by head, over the keys `visible(row, i, j)` allows.
    fn plain_attention(
        s: &Shapes,
        (batch, seq): (usize, usize),
        (q, k, v): (&[f32], &[f32], &[f32]),
        visible: impl Fn(usize, usize, usize) -> bool,
    ) -> Vec<f32> {
        let (h, d) = (s.hidden, s.head_dim);
        let at = |t: &[f32], r: usize, i: usize, c: usize| f64::from(t[(r * seq + i) * h + c]);
        let mut out = vec![0f32; batch * seq * h];
        for r in 0..batch {
            for head in 0..s.heads {
                let cols = head * d..(head + 1) * d;
                for i in 0..seq {
                    let scores: Vec<Option<f64>> = (0..seq)
                        .map(|j| {
                            visible(r, i, j).then(|| {
                                cols.clone()
                                    .map(|c| at(q, r, i, c) * at(k, r, j, c))
                                    .sum::<f64>()
                                    / (d as f64).sqrt()
                            })
                        })
                        .collect();
                    let max = scores.iter().flatten().fold(f64::MIN, |m, &x| m.max(x));
                    let weights: Vec<f64> = scores
                        .iter()
                        .map(|x| x.map_or(0.0, |x| (x - max).exp()))
                        .collect();
                    let total: f64 = weights.iter().sum();
                    for c in cols.clone() {
                        let y: f64 = (0..seq).map(|j| weights[j] * at(v, r, j, c)).sum();
                        out[(r * seq + i) * h + c] = (y / total) as f32;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn batch_attention_masks_padding_and_the_local_band() {
        let s = shapes();
        let (batch, seq) = (2, 7);
        let n = batch * seq * s.hidden;
        let (q, k, v) = (values(n, 11), values(n, 12), values(n, 13));
        // The second text is two tokens shorter.
        let mask: Vec<i64> = (0..batch * seq)
            .map(|t| i64::from(t / seq == 0 || t % seq < seq - 2))
            .collect();
        for kind in [AttentionKind::Global, AttentionKind::Local] {
            let inputs = [
                Input::F32("q", vec![batch, seq, s.hidden], q.clone()),
                Input::F32("k", vec![batch, seq, s.hidden], k.clone()),
                Input::F32("v", vec![batch, seq, s.hidden], v.clone()),
                Input::I64("attention_mask", vec![batch, seq], mask.clone()),
            ];
            let mut b = builder(&inputs);
            let shared = shared_nodes(&mut b, &s, Linears::Fp32, Variant::Batch).unwrap();
            let y = attend(&mut b, &s, &shared, kind, "q", "k", "v").unwrap();
            let got = run(b, &inputs, &y, 3);
            let want = plain_attention(&s, (batch, seq), (&q, &k, &v), |r, i, j| {
                mask[r * seq + j] == 1
                    && (kind == AttentionKind::Global || i.abs_diff(j) <= s.half_window)
            });
            assert!(
                max_diff(&got, &want) < 1e-5,
                "{kind:?}: {got:?} vs {want:?}"
            );
        }
    }

    #[test]
    fn long_attention_by_blocks_equals_the_banded_attention() {
        let s = shapes();
        // Lengths below, at and between multiples of the block (2): the last block is
        // padded and its clamped rows must not leak into the output.
        for seq in [1, 2, 5, 7] {
            let n = seq * s.hidden;
            let (q, k, v) = (values(n, 21), values(n, 22), values(n, 23));
            for kind in [AttentionKind::Global, AttentionKind::Local] {
                // The long graph reads its length from `embeddings`: here the queries.
                let inputs = [
                    Input::F32("embeddings", vec![1, seq, s.hidden], q.clone()),
                    Input::F32("k", vec![1, seq, s.hidden], k.clone()),
                    Input::F32("v", vec![1, seq, s.hidden], v.clone()),
                ];
                let mut b = builder(&inputs);
                let shared = shared_nodes(&mut b, &s, Linears::Fp32, Variant::Long).unwrap();
                let y = attend(&mut b, &s, &shared, kind, "embeddings", "k", "v").unwrap();
                let got = run(b, &inputs, &y, 3);
                let want = plain_attention(&s, (1, seq), (&q, &k, &v), |_, i, j| {
                    kind == AttentionKind::Global || i.abs_diff(j) <= s.half_window
                });
                assert!(
                    max_diff(&got, &want) < 1e-5,
                    "{kind:?}, {seq} tokens: {got:?} vs {want:?}"
                );
            }
        }
    }

    #[test]
    fn rotary_embeddings_rotate_halves_by_position_angles() {
        let s = shapes();
        let (seq, theta) = (6, 10_000.0);
        let x = values(seq * s.hidden, 31);
        let inputs = [Input::F32("x", vec![1, seq, s.hidden], x.clone())];
        let mut b = builder(&inputs);
        let half = (s.head_dim / 2) as i64;
        let (cos, sin) = rope(theta, s.max_positions, s.head_dim);
        let tables = (
            b.init("cos", &[s.max_positions as i64, half], &cos)
                .unwrap(),
            b.init("sin", &[s.max_positions as i64, half], &sin)
                .unwrap(),
        );
        let start = b.i64s("start", &[0]).unwrap();
        let y = rotary(&mut b, "x", &start, &tables).unwrap();
        let got = run(b, &inputs, &y, 3);
        // transformers' apply_rotary_pos_emb: x · cos + rotate_half(x) · sin per head, with
        // the angle p / θ^(2i / d) for pair i at position p.
        let d = s.head_dim;
        let mut want = vec![0f32; x.len()];
        for p in 0..seq {
            for head in 0..s.heads {
                let base = p * s.hidden + head * d;
                for i in 0..d / 2 {
                    let angle = p as f64 / theta.powf((2 * i) as f64 / d as f64);
                    let (a, c) = (f64::from(x[base + i]), f64::from(x[base + i + d / 2]));
                    want[base + i] = (a * angle.cos() - c * angle.sin()) as f32;
                    want[base + i + d / 2] = (c * angle.cos() + a * angle.sin()) as f32;
                }
            }
        }
        assert!(max_diff(&got, &want) < 1e-5, "{got:?} vs {want:?}");
    }
}
