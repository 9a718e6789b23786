//! The fused ModernBERT graph, built in process with ONNX Runtime's Model Editor API
//! (`ort::editor`) from `model.safetensors`: 15 nodes a layer at fp32 (about 50 with
//! per-row int8), where the TorchScript export has over 150, half of them shape arithmetic.
//!
//! Two variants share the layer code:
//!
//! * **Batch** (`embeddings: f32[B, S, H]`, `attention_mask: i64[B, S]`): every attention is
//!   `com.microsoft.MultiHeadAttention` with one additive bias per layer kind, built once per
//!   call: padding for global layers, padding plus the `|i − j| ≤ local_attention / 2` band
//!   for local ones.
//! * **Long** (`embeddings: f32[1, S, H]`, one text, no padding): global layers run
//!   `MultiHeadAttention` without any bias, which ONNX Runtime computes with its blocked
//!   (flash) kernel in memory linear in `S`; local layers attend block by block (blocks of
//!   `local_attention / 2` queries against the three blocks around them), also linear in `S`.
//!   Nothing `S × S` is materialized.
//!
//! Both take the token embeddings (the table lookup happens in Rust, so the
//! `vocab × hidden` table exists once whatever the number of sessions) and give the mean
//! pooled, unnormalized `sentence_embedding: f32[B, H]`.

use ort::editor::{Graph, Model, Node, ONNX_DOMAIN, Opset};
use ort::memory::Allocator;
use ort::operator::Attribute;
use ort::value::{Outlet, Shape, SymbolicDimensions, Tensor, TensorElementType, ValueType};
use ruri_core::{AttentionKind, ModelConfig, Result};

use super::weights::{Safetensors, quantize_columns, smoothing, transpose};

const MS_DOMAIN: &str = "com.microsoft";
/// A finite "minus infinity" for additive masks: two of them still add up to a finite value
/// (two −3.4e38 make −inf, and −inf − −inf is NaN).
const MASKED: f32 = -1e30;

/// ONNX TensorProto element type codes (`Cast`'s `to`).
const FLOAT: i64 = 1;
const UINT8: i64 = 2;

/// How linears run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Linears {
    /// fp32 `MatMul`.
    Fp32,
    /// int8 weights per output channel, u8 activations per token row: `scale = max|x| / 127`
    /// and `q = round(x / scale) + 128` (symmetric, zero point 128; ties round up), then
    /// `com.microsoft.MatMulIntegerToFloat` and a multiplication by the row scales.
    Int8PerRow,
    /// int8 weights per output channel, activations per tensor
    /// (`com.microsoft.DynamicQuantizeMatMul`): a text's result depends on its batch.
    Int8PerTensor,
}

/// Which graph to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    Batch,
    Long,
}

pub(crate) struct Shapes {
    hidden: usize,
    heads: usize,
    head_dim: usize,
    intermediate: usize,
    half_window: usize,
    eps: f32,
    kinds: Vec<AttentionKind>,
    max_positions: usize,
    global_theta: f64,
    local_theta: f64,
}

impl Shapes {
    pub(crate) fn new(c: &ModelConfig) -> Self {
        Self {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            head_dim: c.head_dim(),
            intermediate: c.intermediate_size,
            half_window: c.local_attention / 2,
            eps: c.norm_eps as f32,
            kinds: c.layer_types.clone(),
            max_positions: c.max_position_embeddings.max(1),
            global_theta: c.global_rope_theta,
            local_theta: c.local_rope_theta,
        }
    }
}

/// Accumulates nodes and initializers under unique names.
struct Builder {
    graph: Graph,
    next: usize,
}

fn attr(name: &str, value: impl ort::operator::ToAttribute) -> ort::Result<Attribute> {
    Attribute::new(name, value)
}

impl Builder {
    fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("{stem}_{}", self.next)
    }

    fn op(
        &mut self,
        op: &str,
        domain: &str,
        inputs: &[&str],
        outputs: usize,
        attrs: Vec<Attribute>,
    ) -> ort::Result<Vec<String>> {
        let outs: Vec<String> = (0..outputs).map(|_| self.fresh(op)).collect();
        let name = self.fresh(&format!("n_{op}"));
        self.graph
            .add_node(Node::new(op, domain, name, inputs, &outs, attrs)?)?;
        Ok(outs)
    }

    /// One-output ONNX operator.
    fn one(&mut self, op: &str, inputs: &[&str], attrs: Vec<Attribute>) -> ort::Result<String> {
        Ok(self.op(op, ONNX_DOMAIN, inputs, 1, attrs)?.remove(0))
    }

    fn init<T: ort::value::PrimitiveTensorElementType + Copy + std::fmt::Debug>(
        &mut self,
        stem: &str,
        shape: &[i64],
        data: &[T],
    ) -> ort::Result<String> {
        let name = self.fresh(stem);
        let mut tensor = Tensor::<T>::new(&Allocator::default(), shape.to_vec())?;
        tensor.extract_tensor_mut().1.copy_from_slice(data);
        // Large tensors are used in place (no copy into a TensorProto); ONNX Runtime takes
        // small ones (< 128 bytes) only by copy.
        let external = std::mem::size_of_val(data) >= 128;
        self.graph.add_initializer(&name, tensor, external)?;
        Ok(name)
    }

    fn i64s(&mut self, stem: &str, values: &[i64]) -> ort::Result<String> {
        self.init(stem, &[values.len() as i64], values)
    }

    fn scalar_i64(&mut self, stem: &str, value: i64) -> ort::Result<String> {
        self.init(stem, &[], &[value])
    }

    fn scalar_f32(&mut self, stem: &str, value: f32) -> ort::Result<String> {
        self.init(stem, &[], &[value])
    }

    fn layer_norm(&mut self, x: &str, gamma: &str, eps: f32) -> ort::Result<String> {
        self.one(
            "LayerNormalization",
            &[x, gamma],
            vec![attr("axis", -1i64)?, attr("epsilon", eps)?],
        )
    }
}

/// A linear's weights as initializers, in the form its [`Linears`] mode runs.
enum Weight {
    Fp32(String),
    Int8 { q: String, scale: String },
}

/// Per-layer quantized-activation cache: one `RowQuantize` (or none) per distinct input.
struct Quantized {
    q: String,
    scale: String,
}

/// What every layer shares in one graph.
struct Shared {
    linears: Linears,
    /// Int8 per row: the u8 activations' zero point (128), the scale 1 of `MatMulIntegerToFloat`
    /// (row scales are applied after), `1 / 127`, a tiny floor for all-zero rows, and `128.5`.
    row_quant: Option<RowQuant>,
    positions: String,
    rope_global: (String, String),
    rope_local: (String, String),
    /// Batch variant: the additive biases `[B, 1, S, S]`.
    global_bias: Option<String>,
    local_bias: Option<String>,
    /// Long variant: local attention by blocks.
    blocks: Option<Blocks>,
}

struct RowQuant {
    zero_point: String,
    unit: String,
    inv_levels: String,
    floor: String,
    offset: String,
    last_axis: String,
}

struct Blocks {
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

fn rope(theta: f64, positions: usize, head_dim: usize) -> (Vec<f32>, Vec<f32>) {
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

/// Builds the graph of `variant` from the checkpoint (weights are read now, tensor by
/// tensor, straight into ONNX Runtime's memory).
pub(crate) fn build(
    st: &mut Safetensors,
    shapes: &Shapes,
    linears: Linears,
    variant: Variant,
) -> Result<Model> {
    let path = st.path().to_path_buf();
    let fail = |e: ort::Error| ruri_core::Error::Backend {
        backend: "ort",
        context: format!("building the fused graph from {}", path.display()),
        source: Box::new(e),
    };
    build_inner(st, shapes, linears, variant, &fail)
}

fn build_inner(
    st: &mut Safetensors,
    shapes: &Shapes,
    linears: Linears,
    variant: Variant,
    fail: &dyn Fn(ort::Error) -> ruri_core::Error,
) -> Result<Model> {
    let h = shapes.hidden as i64;
    let graph = Graph::new().map_err(fail)?;
    let mut b = Builder { graph, next: 0 };
    let f32_tensor = |dims: Vec<i64>, names: Vec<String>| ValueType::Tensor {
        ty: TensorElementType::Float32,
        shape: Shape::new(dims),
        dimension_symbols: SymbolicDimensions::new(names),
    };
    let mut inputs = vec![Outlet::new(
        "embeddings",
        f32_tensor(
            vec![-1, -1, h],
            vec!["batch".into(), "sequence".into(), String::new()],
        ),
    )];
    if variant == Variant::Batch {
        inputs.push(Outlet::new(
            "attention_mask",
            ValueType::Tensor {
                ty: TensorElementType::Int64,
                shape: Shape::new([-1, -1]),
                dimension_symbols: SymbolicDimensions::new(["batch".into(), "sequence".into()]),
            },
        ));
    }
    b.graph.set_inputs(inputs).map_err(fail)?;
    b.graph
        .set_outputs([Outlet::new(
            "sentence_embedding",
            f32_tensor(vec![-1, h], vec!["batch".into(), String::new()]),
        )])
        .map_err(fail)?;

    let shared = shared_nodes(&mut b, shapes, linears, variant).map_err(fail)?;

    // Embedding LayerNorm (the lookup happened in Rust).
    let gamma = st.read("embeddings.norm.weight")?;
    let gamma = b.init("emb_norm", &[h], &gamma).map_err(fail)?;
    let mut x = b
        .layer_norm("embeddings", &gamma, shapes.eps)
        .map_err(fail)?;

    for (n, &kind) in shapes.kinds.iter().enumerate() {
        x = layer(&mut b, st, shapes, &shared, n, kind, &x, fail)?;
    }

    let gamma = st.read("final_norm.weight")?;
    let gamma = b.init("final_norm", &[h], &gamma).map_err(fail)?;
    let y = b.layer_norm(&x, &gamma, shapes.eps).map_err(fail)?;
    pooling(&mut b, &y, variant).map_err(fail)?;

    let opsets = [
        Opset::new(ONNX_DOMAIN, 21).map_err(fail)?,
        Opset::new(MS_DOMAIN, 1).map_err(fail)?,
    ];
    let mut model = Model::new(opsets).map_err(fail)?;
    model.set_graph(b.graph).map_err(fail)?;
    Ok(model)
}

/// Mean pooling into the graph output `sentence_embedding`.
fn pooling(b: &mut Builder, y: &str, variant: Variant) -> ort::Result<()> {
    let axis1 = b.i64s("axis1", &[1])?;
    let name = "sentence_embedding";
    match variant {
        Variant::Long => {
            let node = b.fresh("n_pool");
            b.graph.add_node(Node::new(
                "ReduceMean",
                ONNX_DOMAIN,
                node,
                [y, axis1.as_str()],
                [name],
                [attr("keepdims", 0i64)?],
            )?)?;
        }
        Variant::Batch => {
            // sentence-transformers: sum(h · mask) / clamp(sum(mask), 1e-9).
            let mask = b.one("Cast", &["attention_mask"], vec![attr("to", FLOAT)?])?;
            let axis2 = b.i64s("axis2", &[2])?;
            let mask3 = b.one("Unsqueeze", &[&mask, &axis2], vec![])?;
            let weighted = b.one("Mul", &[y, &mask3], vec![])?;
            let sum = b.one(
                "ReduceSum",
                &[&weighted, &axis1],
                vec![attr("keepdims", 0i64)?],
            )?;
            let count = b.one("ReduceSum", &[&mask, &axis1], vec![attr("keepdims", 1i64)?])?;
            let tiny = b.scalar_f32("tiny", 1e-9)?;
            let count = b.one("Max", &[&count, &tiny], vec![])?;
            let node = b.fresh("n_pool");
            b.graph.add_node(Node::new(
                "Div",
                ONNX_DOMAIN,
                node,
                [sum.as_str(), count.as_str()],
                [name],
                [],
            )?)?;
        }
    }
    Ok(())
}

/// Rotary tables, masks and block indices: computed once per call, shared by the layers.
fn shared_nodes(
    b: &mut Builder,
    s: &Shapes,
    linears: Linears,
    variant: Variant,
) -> ort::Result<Shared> {
    let half = (s.head_dim / 2) as i64;
    let positions = s.max_positions as i64;
    let (cos, sin) = rope(s.global_theta, s.max_positions, s.head_dim);
    let rope_global = (
        b.init("cos_global", &[positions, half], &cos)?,
        b.init("sin_global", &[positions, half], &sin)?,
    );
    let (cos, sin) = rope(s.local_theta, s.max_positions, s.head_dim);
    let rope_local = (
        b.init("cos_local", &[positions, half], &cos)?,
        b.init("sin_local", &[positions, half], &sin)?,
    );
    // Position ids `[1]`: every sequence starts at position 0.
    let position_start = b.i64s("position_start", &[0])?;
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
    let has_local = s.kinds.contains(&AttentionKind::Local);
    let mut shared = Shared {
        linears,
        row_quant,
        positions: position_start,
        rope_global,
        rope_local,
        global_bias: None,
        local_bias: None,
        blocks: None,
    };
    let masked = b.scalar_f32("masked", MASKED)?;
    let zero_f = b.scalar_f32("zero", 0.0)?;
    match variant {
        Variant::Batch => {
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
            if has_local {
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
                let band = b.one("Where", &[&far, &masked, &zero_f], vec![])?;
                shared.local_bias = Some(b.one("Add", &[&global, &band], vec![])?);
            }
            shared.global_bias = Some(global);
        }
        Variant::Long if has_local => {
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
            let ends = b.one("Where", &[&outside, &masked, &zero_f], vec![])?;
            let shape_ends = b.i64s("shape_ends", &[-1, 1, 1, 3 * c])?;
            let ends = b.one("Reshape", &[&ends, &shape_ends], vec![])?;
            // The band inside a window, the same for every block: query c (at n·C + c)
            // sees window position t (at n·C − C + t) iff |t − C − c| ≤ half_window.
            let hw = s.half_window as i64;
            let band: Vec<f32> = (0..c)
                .flat_map(|q| {
                    (0..3 * c).map(move |t| if (t - c - q).abs() <= hw { 0.0 } else { MASKED })
                })
                .collect();
            let band = b.init("band", &[c, 3 * c], &band)?;
            let bias = b.one("Add", &[&ends, &band], vec![])?;
            let clamped = b.one("Max", &[&window, &zero_i], vec![])?;
            let clamped = b.one("Min", &[&clamped, &last], vec![])?;
            let flat = b.i64s("flat", &[-1])?;
            let key_index = b.one("Reshape", &[&clamped, &flat], vec![])?;
            let hidden = s.hidden as i64;
            shared.blocks = Some(Blocks {
                query_index,
                key_index,
                bias,
                query_shape: b.i64s("query_shape", &[-1, c, hidden])?,
                key_shape: b.i64s("key_shape", &[-1, 3 * c, hidden])?,
                back_shape: b.i64s("back_shape", &[1, -1, hidden])?,
                zero: b.i64s("zero1", &[0])?,
                length,
                axis1: b.i64s("axis1", &[1])?,
            });
        }
        Variant::Long => {}
    }
    Ok(shared)
}

/// Adds `w` (`out × cols` rows of an `nn.Linear` weight) with its input rows scaled by
/// `smooth` (int8 only), in the form `linears` runs.
fn weight(
    b: &mut Builder,
    linears: Linears,
    w: &[f32],
    cols: usize,
    smooth: Option<&[f32]>,
    fail: &dyn Fn(ort::Error) -> ruri_core::Error,
) -> Result<Weight> {
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
    match linears {
        Linears::Fp32 => Ok(Weight::Fp32(b.init("w", &[k, n], &t).map_err(fail)?)),
        Linears::Int8PerRow | Linears::Int8PerTensor => {
            let qw = quantize_columns(&t, cols, out);
            drop(t);
            Ok(Weight::Int8 {
                q: b.init("wq", &[k, n], &qw.q).map_err(fail)?,
                scale: b.init("ws", &[n], &qw.scale).map_err(fail)?,
            })
        }
    }
}

/// `x · W`, in the graph's mode; `cache` holds `x`'s row quantization when several linears
/// read the same `x`.
fn linear(
    b: &mut Builder,
    shared: &Shared,
    x: &str,
    w: &Weight,
    cache: &mut Option<Quantized>,
) -> ort::Result<String> {
    match (w, shared.linears) {
        (Weight::Fp32(w), _) => b.one("MatMul", &[x, w], vec![]),
        (Weight::Int8 { q, scale }, Linears::Int8PerTensor) => Ok(b
            .op(
                "DynamicQuantizeMatMul",
                MS_DOMAIN,
                &[x, q, scale],
                1,
                vec![],
            )?
            .remove(0)),
        (Weight::Int8 { q, scale }, _) => {
            let rq = shared.row_quant.as_ref().expect("per-row graphs have one");
            if cache.is_none() {
                // scale = max(max|x_row| / 127, floor); q = u8(round(x / scale) + 128), the
                // rounding done by the cast's truncation of x / scale + 128.5 (in [1.5, 255.5]).
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
                *cache = Some(Quantized {
                    q: xq,
                    scale: row_scale,
                });
            }
            let qx = cache.as_ref().expect("set above");
            let y = b
                .op(
                    "MatMulIntegerToFloat",
                    MS_DOMAIN,
                    &[&qx.q, q, &rq.unit, scale, &rq.zero_point],
                    1,
                    vec![],
                )?
                .remove(0);
            b.one("Mul", &[&y, &qx.scale], vec![])
        }
    }
}

/// One ModernBERT encoder layer; returns the new residual stream.
#[allow(clippy::too_many_arguments)]
fn layer(
    b: &mut Builder,
    st: &mut Safetensors,
    s: &Shapes,
    shared: &Shared,
    n: usize,
    kind: AttentionKind,
    x: &str,
    fail: &dyn Fn(ort::Error) -> ruri_core::Error,
) -> Result<String> {
    let (h, i) = (s.hidden, s.intermediate);
    let int8 = shared.linears != Linears::Fp32;
    let p = format!("layers.{n}");

    // Attention input: layer 0 reads the embedding norm's output directly (its attn_norm is
    // an identity). Smoothing folds into a norm's weight, so only where the norm's output
    // feeds nothing but linears (not layer 0: there it is also the residual stream).
    // Each weight is read once, for its smoothing factors and for its initializers.
    let wqkv = st.read(&format!("{p}.attn.Wqkv.weight"))?;
    let (normed, smooth_attn) = if n == 0 {
        (x.to_owned(), None)
    } else {
        let mut gamma = st.read(&format!("{p}.attn_norm.weight"))?;
        let smooth = int8.then(|| smoothing(&wqkv, h));
        if let Some(sm) = &smooth {
            gamma.iter_mut().zip(sm).for_each(|(g, s)| *g /= s);
        }
        let gamma = b.init("attn_norm", &[h as i64], &gamma).map_err(fail)?;
        (b.layer_norm(x, &gamma, s.eps).map_err(fail)?, smooth)
    };
    let qkv_w = weight(b, shared.linears, &wqkv, h, smooth_attn.as_deref(), fail)?;
    drop(wqkv);
    let attn_out = (|| -> ort::Result<String> {
        let qkv = linear(b, shared, &normed, &qkv_w, &mut None)?;
        let mut parts = b.op(
            "Split",
            ONNX_DOMAIN,
            &[&qkv],
            3,
            vec![attr("axis", -1i64)?, attr("num_outputs", 3i64)?],
        )?;
        let v = parts.pop().expect("three outputs");
        let k = parts.pop().expect("three outputs");
        let q = parts.pop().expect("three outputs");
        let (cos, sin) = match kind {
            AttentionKind::Global => &shared.rope_global,
            AttentionKind::Local => &shared.rope_local,
        };
        let rotary = |b: &mut Builder, t: &str| -> ort::Result<String> {
            Ok(b.op(
                "RotaryEmbedding",
                MS_DOMAIN,
                &[t, &shared.positions, cos, sin],
                1,
                vec![attr("interleaved", 0i64)?],
            )?
            .remove(0))
        };
        let q = rotary(b, &q)?;
        let k = rotary(b, &k)?;
        let mha_attrs = || -> ort::Result<Vec<Attribute>> {
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
                // Blocks of C queries against their 3C-key windows (clamped indices; the
                // bias masks positions outside the sequence and outside the band).
                let gather = |b: &mut Builder, t: &str, idx: &str, shape: &str| {
                    let g = b.one("Gather", &[t, idx], vec![attr("axis", 1i64)?])?;
                    b.one("Reshape", &[&g, shape], vec![])
                };
                let qb = gather(b, &q, &bl.query_index, &bl.query_shape)?;
                let kb = gather(b, &k, &bl.key_index, &bl.key_shape)?;
                let vb = gather(b, &v, &bl.key_index, &bl.key_shape)?;
                let out = b
                    .op(
                        "MultiHeadAttention",
                        MS_DOMAIN,
                        &[&qb, &kb, &vb, "", "", &bl.bias],
                        1,
                        mha_attrs()?,
                    )?
                    .remove(0);
                let out = b.one("Reshape", &[&out, &bl.back_shape], vec![])?;
                b.one("Slice", &[&out, &bl.zero, &bl.length, &bl.axis1], vec![])
            }
            _ => {
                let inputs: Vec<&str> = match bias {
                    Some(bias) => vec![&q, &k, &v, "", "", bias],
                    None => vec![&q, &k, &v],
                };
                Ok(
                    b.op("MultiHeadAttention", MS_DOMAIN, &inputs, 1, mha_attrs()?)?
                        .remove(0),
                )
            }
        }
    })()
    .map_err(fail)?;
    let wo = st.read(&format!("{p}.attn.Wo.weight"))?;
    let wo = weight(b, shared.linears, &wo, h, None, fail)?;
    let x = (|| -> ort::Result<String> {
        let o = linear(b, shared, &attn_out, &wo, &mut None)?;
        b.one("Add", &[x, &o], vec![])
    })()
    .map_err(fail)?;

    let wi = st.read(&format!("{p}.mlp.Wi.weight"))?;
    let mut gamma = st.read(&format!("{p}.mlp_norm.weight"))?;
    let smooth_mlp = int8.then(|| smoothing(&wi, h));
    if let Some(sm) = &smooth_mlp {
        gamma.iter_mut().zip(sm).for_each(|(g, s)| *g /= s);
    }
    let gamma = b.init("mlp_norm", &[h as i64], &gamma).map_err(fail)?;
    // Wi's rows: the GELU input, then the gate.
    let (wi_in, wi_gate) = wi.split_at(i * h);
    let wi_in = weight(b, shared.linears, wi_in, h, smooth_mlp.as_deref(), fail)?;
    let wi_gate = weight(b, shared.linears, wi_gate, h, smooth_mlp.as_deref(), fail)?;
    drop(wi);
    let wo = st.read(&format!("{p}.mlp.Wo.weight"))?;
    let wo = weight(b, shared.linears, &wo, i, None, fail)?;
    (|| -> ort::Result<String> {
        let normed = b.layer_norm(&x, &gamma, s.eps)?;
        let mut cache = None;
        let input = linear(b, shared, &normed, &wi_in, &mut cache)?;
        let gate = linear(b, shared, &normed, &wi_gate, &mut cache)?;
        // transformers' "gelu": the exact erf GELU.
        let act = b.one("Gelu", &[&input], vec![])?;
        let act = b.one("Mul", &[&act, &gate], vec![])?;
        let m = linear(b, shared, &act, &wo, &mut None)?;
        b.one("Add", &[&x, &m], vec![])
    })()
    .map_err(fail)
}
