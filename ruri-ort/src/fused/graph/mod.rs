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

mod attention;
mod int8;
mod ops;

use ort::editor::{Model, ONNX_DOMAIN, Opset};
use ort::value::{Outlet, Shape, SymbolicDimensions, TensorElementType, ValueType};
use ruri_core::{AttentionKind, ModelConfig, Result};

use super::weights::{Safetensors, smoothing};
use attention::{Blocks, MASKED, attention, rope};
use int8::LinearMode;
use ops::{Builder, FLOAT, MS_DOMAIN, attr};

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

/// What every layer shares in one graph.
struct Shared {
    linear: LinearMode,
    positions: String,
    rope_global: (String, String),
    rope_local: (String, String),
    /// Batch variant: the additive biases `[B, 1, S, S]`.
    global_bias: Option<String>,
    local_bias: Option<String>,
    /// Long variant: local attention by blocks.
    blocks: Option<Blocks>,
}

/// Why a graph could not be built: ONNX Runtime refused a node or an initializer, or the
/// checkpoint could not be read. Every part returns it with `?`; [`build`] maps it once.
enum BuildError {
    Ort(ort::Error),
    Checkpoint(ruri_core::Error),
}

impl From<ort::Error> for BuildError {
    fn from(e: ort::Error) -> Self {
        BuildError::Ort(e)
    }
}

impl From<ruri_core::Error> for BuildError {
    fn from(e: ruri_core::Error) -> Self {
        BuildError::Checkpoint(e)
    }
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
    build_graph(st, shapes, linears, variant).map_err(|e| match e {
        BuildError::Ort(e) => ruri_core::Error::Backend {
            backend: "ort",
            context: format!("building the fused graph from {}", path.display()),
            source: Box::new(e),
        },
        BuildError::Checkpoint(e) => e,
    })
}

fn build_graph(
    st: &mut Safetensors,
    shapes: &Shapes,
    linears: Linears,
    variant: Variant,
) -> std::result::Result<Model, BuildError> {
    let h = shapes.hidden as i64;
    let mut b = Builder::new()?;
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
    b.graph.set_inputs(inputs)?;
    b.graph.set_outputs([Outlet::new(
        "sentence_embedding",
        f32_tensor(vec![-1, h], vec!["batch".into(), String::new()]),
    )])?;

    let shared = shared_nodes(&mut b, shapes, linears, variant)?;

    // Embedding LayerNorm (the lookup happened in Rust).
    let gamma = st.read("embeddings.norm.weight")?;
    let gamma = b.init("emb_norm", &[h], &gamma)?;
    let mut x = b.layer_norm("embeddings", &gamma, shapes.eps)?;

    let mut layers = LayerContext {
        b: &mut b,
        st,
        s: shapes,
        shared: &shared,
    };
    for (n, &kind) in shapes.kinds.iter().enumerate() {
        x = layers.layer(n, kind, &x)?;
    }

    let gamma = layers.st.read("final_norm.weight")?;
    let gamma = b.init("final_norm", &[h], &gamma)?;
    let y = b.layer_norm(&x, &gamma, shapes.eps)?;
    pooling(&mut b, &y, variant)?;

    let opsets = [Opset::new(ONNX_DOMAIN, 21)?, Opset::new(MS_DOMAIN, 1)?];
    let mut model = Model::new(opsets)?;
    model.set_graph(b.graph)?;
    Ok(model)
}

/// Mean pooling into the graph output `sentence_embedding`.
fn pooling(b: &mut Builder, y: &str, variant: Variant) -> ort::Result<()> {
    let axis1 = b.i64s("axis1", &[1])?;
    let name = "sentence_embedding";
    match variant {
        Variant::Long => {
            let node = b.fresh("n_pool");
            b.graph.add_node(ort::editor::Node::new(
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
            b.graph.add_node(ort::editor::Node::new(
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
    let linear = LinearMode::new(b, linears)?;
    let has_local = s.kinds.contains(&AttentionKind::Local);
    let mut shared = Shared {
        linear,
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
            let (global, local) = attention::batch_biases(b, s, &masked, &zero_f)?;
            shared.global_bias = Some(global);
            shared.local_bias = local;
        }
        Variant::Long if has_local => {
            shared.blocks = Some(attention::long_blocks(b, s, &masked, &zero_f)?);
        }
        Variant::Long => {}
    }
    Ok(shared)
}

/// What one layer is built from: the graph so far, the checkpoint its weights come from (each
/// read once, for its smoothing factors and for its initializers), the model's shapes, and
/// the nodes every layer shares.
struct LayerContext<'a> {
    b: &'a mut Builder,
    st: &'a mut Safetensors,
    s: &'a Shapes,
    shared: &'a Shared,
}

impl LayerContext<'_> {
    /// A LayerNorm weight divided by the smoothing factors of the linears it feeds (see
    /// `smoothing`), as an initializer.
    fn norm_weight(
        &mut self,
        name: &str,
        stem: &str,
        smooth: Option<&[f32]>,
    ) -> std::result::Result<String, BuildError> {
        let mut gamma = self.st.read(name)?;
        if let Some(sm) = smooth {
            gamma.iter_mut().zip(sm).for_each(|(g, s)| *g /= s);
        }
        Ok(self.b.init(stem, &[self.s.hidden as i64], &gamma)?)
    }

    /// One ModernBERT encoder layer; returns the new residual stream.
    fn layer(
        &mut self,
        n: usize,
        kind: AttentionKind,
        x: &str,
    ) -> std::result::Result<String, BuildError> {
        let (h, i) = (self.s.hidden, self.s.intermediate);
        let shared = self.shared;
        let linear = &shared.linear;
        let int8 = linear.linears != Linears::Fp32;
        let p = format!("layers.{n}");

        // Attention input: layer 0 reads the embedding norm's output directly (its attn_norm
        // is an identity). Smoothing folds into a norm's weight, so only where the norm's
        // output feeds nothing but linears (not layer 0: there it is also the residual
        // stream).
        let wqkv = self.st.read(&format!("{p}.attn.Wqkv.weight"))?;
        let (normed, smooth_attn) = if n == 0 {
            (x.to_owned(), None)
        } else {
            let smooth = int8.then(|| smoothing(&wqkv, h));
            let gamma = self.norm_weight(
                &format!("{p}.attn_norm.weight"),
                "attn_norm",
                smooth.as_deref(),
            )?;
            (self.b.layer_norm(x, &gamma, self.s.eps)?, smooth)
        };
        let qkv_w = linear.weight(self.b, &wqkv, h, smooth_attn.as_deref())?;
        drop(wqkv);
        let qkv = linear.apply(self.b, &normed, &qkv_w, &mut None)?;
        let attn_out = attention(self.b, self.s, shared, kind, &qkv)?;
        let wo = self.st.read(&format!("{p}.attn.Wo.weight"))?;
        let wo = linear.weight(self.b, &wo, h, None)?;
        let o = linear.apply(self.b, &attn_out, &wo, &mut None)?;
        let x = self.b.one("Add", &[x, &o], vec![])?;

        let wi = self.st.read(&format!("{p}.mlp.Wi.weight"))?;
        let smooth_mlp = int8.then(|| smoothing(&wi, h));
        let gamma = self.norm_weight(
            &format!("{p}.mlp_norm.weight"),
            "mlp_norm",
            smooth_mlp.as_deref(),
        )?;
        // Wi's rows: the GELU input, then the gate.
        let (wi_in, wi_gate) = wi.split_at(i * h);
        let wi_in = linear.weight(self.b, wi_in, h, smooth_mlp.as_deref())?;
        let wi_gate = linear.weight(self.b, wi_gate, h, smooth_mlp.as_deref())?;
        drop(wi);
        let wo = self.st.read(&format!("{p}.mlp.Wo.weight"))?;
        let wo = linear.weight(self.b, &wo, i, None)?;
        let normed = self.b.layer_norm(&x, &gamma, self.s.eps)?;
        let mut cache = None;
        let input = linear.apply(self.b, &normed, &wi_in, &mut cache)?;
        let gate = linear.apply(self.b, &normed, &wi_gate, &mut cache)?;
        // transformers' "gelu": the exact erf GELU.
        let act = self.b.one("Gelu", &[&input], vec![])?;
        let act = self.b.one("Mul", &[&act, &gate], vec![])?;
        let m = linear.apply(self.b, &act, &wo, &mut None)?;
        Ok(self.b.one("Add", &[&x, &m], vec![])?)
    }
}

#[cfg(test)]
mod tests {
    use super::ops::testing::{Input, builder, max_diff, run, values};
    use super::*;

    #[test]
    fn batch_pooling_is_the_mean_over_the_mask() {
        let (batch, seq, h) = (2, 4, 3);
        let y = values(batch * seq * h, 41);
        let mask = vec![1i64, 1, 1, 1, 1, 1, 0, 0];
        let inputs = [
            Input::F32("hidden", vec![batch, seq, h], y.clone()),
            Input::I64("attention_mask", vec![batch, seq], mask.clone()),
        ];
        let mut b = builder(&inputs);
        pooling(&mut b, "hidden", Variant::Batch).unwrap();
        let got = run(b, &inputs, "sentence_embedding", 2);
        let mut want = Vec::new();
        for r in 0..batch {
            let tokens: Vec<usize> = (0..seq).filter(|&t| mask[r * seq + t] == 1).collect();
            for c in 0..h {
                let sum: f32 = tokens.iter().map(|&t| y[(r * seq + t) * h + c]).sum();
                want.push(sum / tokens.len() as f32);
            }
        }
        assert!(max_diff(&got, &want) < 1e-6, "{got:?} vs {want:?}");
    }
}
