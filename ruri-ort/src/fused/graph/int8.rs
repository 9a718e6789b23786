//! Linears in the graph's mode: fp32 `MatMul`, or int8 weights per output channel with
//! activations quantized per token row or per tensor.

use ort::operator::Attribute;

use super::Linears;
use super::ops::{Builder, UINT8, attr};
use crate::fused::weights::{quantize_columns, transpose};

/// A linear's weights as initializers, in the form its [`Linears`] mode runs.
pub(super) enum Weight {
    Fp32(String),
    Int8 { q: String, scale: String },
}

/// Per-layer quantized-activation cache: one row quantization (or none) per distinct input.
pub(super) struct Quantized {
    q: String,
    scale: String,
}

/// How one graph's linears run, with the constants the per-row mode shares.
pub(super) struct LinearMode {
    pub(super) linears: Linears,
    /// Int8 per row: the u8 activations' zero point (128), the scale 1 of
    /// `MatMulIntegerToFloat` (row scales are applied after), `1 / 127`, a tiny floor for
    /// all-zero rows, and `128.5`.
    row_quant: Option<RowQuant>,
}

struct RowQuant {
    zero_point: String,
    unit: String,
    inv_levels: String,
    floor: String,
    offset: String,
    last_axis: String,
}

impl LinearMode {
    pub(super) fn new(b: &mut Builder, linears: Linears) -> ort::Result<Self> {
        let row_quant = match linears {
            Linears::Int8PerRow => Some(RowQuant {
                zero_point: b.init::<u8>("zero_point", &[], &[128])?,
                unit: b.scalar_f32("unit", 1.0)?,
                inv_levels: b.scalar_f32("inv_levels", 1.0 / 127.0)?,
                floor: b.scalar_f32("floor", f32::MIN_POSITIVE)?,
                offset: b.scalar_f32("offset", 128.5)?,
                last_axis: b.i64s("last_axis", &[-1])?,
            }),
            _ => None,
        };
        Ok(Self { linears, row_quant })
    }

    /// Adds `w` (`out × cols` rows of an `nn.Linear` weight) with its input rows scaled by
    /// `smooth` (int8 only), in the form this mode runs.
    pub(super) fn weight(
        &self,
        b: &mut Builder,
        w: &[f32],
        cols: usize,
        smooth: Option<&[f32]>,
    ) -> ort::Result<Weight> {
        let out = w.len() / cols;
        let mut t = transpose(w, out, cols); // cols × out = K × N
        if let Some(s) = smooth {
            for (row, &s) in t.chunks_exact_mut(out).zip(s) {
                if s != 1.0 {
                    row.iter_mut().for_each(|v| *v *= s);
                }
            }
        }
        let (k, n) = (cols as i64, out as i64);
        match self.linears {
            Linears::Fp32 => Ok(Weight::Fp32(b.init("w", &[k, n], &t)?)),
            Linears::Int8PerRow | Linears::Int8PerTensor => {
                let qw = quantize_columns(&t, cols, out);
                drop(t);
                Ok(Weight::Int8 {
                    q: b.init("wq", &[k, n], &qw.q)?,
                    scale: b.init("ws", &[n], &qw.scale)?,
                })
            }
        }
    }

    /// `x · W`; `cache` holds `x`'s row quantization when several linears read the same `x`.
    pub(super) fn apply(
        &self,
        b: &mut Builder,
        x: &str,
        w: &Weight,
        cache: &mut Option<Quantized>,
    ) -> ort::Result<String> {
        let no_attrs = Vec::<Attribute>::new;
        match (w, &self.row_quant) {
            (Weight::Fp32(w), _) => b.one("MatMul", &[x, w], no_attrs()),
            (Weight::Int8 { q, scale }, None) => {
                b.contrib("DynamicQuantizeMatMul", &[x, q, scale], no_attrs())
            }
            (Weight::Int8 { q, scale }, Some(rq)) => {
                if cache.is_none() {
                    *cache = Some(quantize_rows(b, rq, x)?);
                }
                let qx = cache.as_ref().expect("set above");
                let y = b.contrib(
                    "MatMulIntegerToFloat",
                    &[&qx.q, q, &rq.unit, scale, &rq.zero_point],
                    no_attrs(),
                )?;
                b.one("Mul", &[&y, &qx.scale], no_attrs())
            }
        }
    }
}

/// scale = max(max|x_row| / 127, floor); q = u8(round(x / scale) + 128), the rounding done
/// by the cast's truncation of x / scale + 128.5 (in [1.5, 255.5]).
fn quantize_rows(b: &mut Builder, rq: &RowQuant, x: &str) -> ort::Result<Quantized> {
    let abs = b.one("Abs", &[x], vec![])?;
    let max = b.one(
        "ReduceMax",
        &[&abs, &rq.last_axis],
        vec![attr("keepdims", 1i64)?],
    )?;
    let row_scale = b.one("Mul", &[&max, &rq.inv_levels], vec![])?;
    let row_scale = b.one("Max", &[&row_scale, &rq.floor], vec![])?;
    let scaled = b.one("Div", &[x, &row_scale], vec![])?;
    let shifted = b.one("Add", &[&scaled, &rq.offset], vec![])?;
    let xq = b.one("Cast", &[&shifted], vec![attr("to", UINT8)?])?;
    Ok(Quantized {
        q: xq,
        scale: row_scale,
    })
}

#[cfg(test)]
mod tests {
    use super::super::ops::testing::{Input, builder, max_diff, run, values};
    use super::*;

    const ROWS: usize = 3;
    const COLS: usize = 16;
    const OUT: usize = 5;

    /// `x · Wᵀ` with `x`'s columns scaled by `smooth`, in f64: `W` is `out × cols`, as
    /// `nn.Linear` stores it.
    fn plain_linear(x: &[f32], w: &[f32], smooth: &[f32]) -> Vec<f32> {
        let mut y = Vec::new();
        for row in x.chunks(COLS) {
            for wrow in w.chunks(COLS) {
                let dot: f64 = (0..COLS)
                    .map(|k| f64::from(row[k]) * f64::from(smooth[k]) * f64::from(wrow[k]))
                    .sum();
                y.push(dot as f32);
            }
        }
        y
    }

    /// One linear of `mode` on `x`, run by ONNX Runtime.
    fn graph_linear(linears: Linears, x: &[f32], w: &[f32], smooth: Option<&[f32]>) -> Vec<f32> {
        let inputs = [Input::F32("x", vec![ROWS, COLS], x.to_vec())];
        let mut b = builder(&inputs);
        let mode = LinearMode::new(&mut b, linears).unwrap();
        let weight = mode.weight(&mut b, w, COLS, smooth).unwrap();
        let y = mode.apply(&mut b, "x", &weight, &mut None).unwrap();
        run(b, &inputs, &y, 2)
    }

    fn example() -> (Vec<f32>, Vec<f32>) {
        let mut x = values(ROWS * COLS, 3);
        // One outlier channel, as trained transformers have.
        x[COLS + 4] = 9.0;
        (x, values(OUT * COLS, 4))
    }

    #[test]
    fn fp32_linears_multiply_by_the_transposed_weight_and_its_smoothing() {
        let (x, w) = example();
        let ones = vec![1.0; COLS];
        let got = graph_linear(Linears::Fp32, &x, &w, None);
        assert!(max_diff(&got, &plain_linear(&x, &w, &ones)) < 1e-5);
        let smooth: Vec<f32> = (0..COLS).map(|k| 1.0 + k as f32 / 8.0).collect();
        let got = graph_linear(Linears::Fp32, &x, &w, Some(&smooth));
        assert!(max_diff(&got, &plain_linear(&x, &w, &smooth)) < 1e-5);
    }

    #[test]
    fn int8_per_row_linears_compute_the_integer_product_exactly() {
        let (x, w) = example();
        let got = graph_linear(Linears::Int8PerRow, &x, &w, None);
        // The scheme written out: weights symmetric per output channel on 63 levels,
        // activations symmetric per row on 127 levels around the zero point 128.
        let mut want = Vec::new();
        let w_scale: Vec<f32> = w
            .chunks(COLS)
            .map(|row| row.iter().fold(0f32, |m, v| m.max(v.abs())) / 63.0)
            .collect();
        for row in x.chunks(COLS) {
            let x_scale = row.iter().fold(0f32, |m, v| m.max(v.abs())) * (1.0 / 127.0);
            let qx: Vec<i32> = row
                .iter()
                .map(|&v| ((v / x_scale) + 128.5).floor() as i32 - 128)
                .collect();
            for (n, wrow) in w.chunks(COLS).enumerate() {
                let dot: i32 = (0..COLS)
                    .map(|k| qx[k] * (wrow[k] / w_scale[n]).round() as i32)
                    .sum();
                want.push(dot as f32 * w_scale[n] * x_scale);
            }
        }
        let largest = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            max_diff(&got, &want) < 1e-5 * largest,
            "{got:?} vs {want:?}"
        );
        // And the scheme is a fair approximation of the fp32 product.
        let fp32 = plain_linear(&x, &w, &[1.0; COLS]);
        assert!(
            max_diff(&got, &fp32) < 0.05 * largest,
            "{got:?} vs {fp32:?}"
        );
    }

    #[test]
    fn int8_per_tensor_linears_approximate_the_fp32_product() {
        let (x, w) = example();
        let got = graph_linear(Linears::Int8PerTensor, &x, &w, None);
        let fp32 = plain_linear(&x, &w, &[1.0; COLS]);
        let largest = fp32.iter().fold(0f32, |m, v| m.max(v.abs()));
        // One scale for the whole tensor, set by the outlier: coarser than per row.
        assert!(max_diff(&got, &fp32) < 0.1 * largest, "{got:?} vs {fp32:?}");
    }

    #[test]
    fn linears_of_one_input_share_its_row_quantization() {
        let inputs = [Input::F32("x", vec![ROWS, COLS], example().0)];
        let mut b = builder(&inputs);
        let mode = LinearMode::new(&mut b, Linears::Int8PerRow).unwrap();
        let w = values(OUT * COLS, 5);
        let first = mode.weight(&mut b, &w, COLS, None).unwrap();
        let second = mode.weight(&mut b, &w, COLS, None).unwrap();
        let mut cache = None;
        let a = mode.apply(&mut b, "x", &first, &mut cache).unwrap();
        let quantized = cache.as_ref().map(|q| q.q.clone());
        let c = mode.apply(&mut b, "x", &second, &mut cache).unwrap();
        assert!(a != c && quantized.is_some());
        assert_eq!(
            cache.map(|q| q.q),
            quantized,
            "the second linear reuses the first's"
        );
    }
}
