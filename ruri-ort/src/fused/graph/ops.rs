//! The graph under construction: nodes and initializers under unique names, and the few
//! operators every part uses.

use ort::editor::{Graph, Node, ONNX_DOMAIN};
use ort::memory::Allocator;
use ort::operator::Attribute;
use ort::value::Tensor;

/// The domain of ONNX Runtime's contrib operators (`MultiHeadAttention`, `RotaryEmbedding`,
/// `MatMulIntegerToFloat`, `DynamicQuantizeMatMul`).
pub(super) const MS_DOMAIN: &str = "com.microsoft";

/// ONNX TensorProto element type codes (`Cast`'s `to`).
pub(super) const FLOAT: i64 = 1;
pub(super) const UINT8: i64 = 2;

pub(super) fn attr(name: &str, value: impl ort::operator::ToAttribute) -> ort::Result<Attribute> {
    Attribute::new(name, value)
}

/// Accumulates nodes and initializers under unique names.
pub(super) struct Builder {
    pub(super) graph: Graph,
    next: usize,
}

impl Builder {
    pub(super) fn new() -> ort::Result<Self> {
        Ok(Self {
            graph: Graph::new()?,
            next: 0,
        })
    }

    pub(super) fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("{stem}_{}", self.next)
    }

    pub(super) fn op(
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
    pub(super) fn one(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: Vec<Attribute>,
    ) -> ort::Result<String> {
        Ok(self.op(op, ONNX_DOMAIN, inputs, 1, attrs)?.remove(0))
    }

    /// One-output contrib operator.
    pub(super) fn contrib(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: Vec<Attribute>,
    ) -> ort::Result<String> {
        Ok(self.op(op, MS_DOMAIN, inputs, 1, attrs)?.remove(0))
    }

    pub(super) fn init<T: ort::value::PrimitiveTensorElementType + Copy + std::fmt::Debug>(
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

    pub(super) fn i64s(&mut self, stem: &str, values: &[i64]) -> ort::Result<String> {
        self.init(stem, &[values.len() as i64], values)
    }

    pub(super) fn scalar_i64(&mut self, stem: &str, value: i64) -> ort::Result<String> {
        self.init(stem, &[], &[value])
    }

    pub(super) fn scalar_f32(&mut self, stem: &str, value: f32) -> ort::Result<String> {
        self.init(stem, &[], &[value])
    }

    /// LayerNorm without bias (ModernBERT's `nn.LayerNorm(bias=False)`).
    pub(super) fn layer_norm(&mut self, x: &str, gamma: &str, eps: f32) -> ort::Result<String> {
        self.one(
            "LayerNormalization",
            &[x, gamma],
            vec![attr("axis", -1i64)?, attr("epsilon", eps)?],
        )
    }
}

/// Runs a part of the graph on its own: the parts' unit tests build a few nodes on
/// [`Builder`], then compare one of their outputs with a plain Rust computation.
#[cfg(test)]
pub(super) mod testing {
    use ort::editor::{Model, ONNX_DOMAIN, Opset};
    use ort::session::{Session, SessionInputValue};
    use ort::value::{Outlet, Shape, SymbolicDimensions, Tensor, TensorElementType, ValueType};

    use super::{Builder, MS_DOMAIN};

    /// A graph input: its name, its (fixed) shape and its values.
    pub(in crate::fused::graph) enum Input {
        F32(&'static str, Vec<usize>, Vec<f32>),
        I64(&'static str, Vec<usize>, Vec<i64>),
    }

    impl Input {
        fn outlet(&self) -> Outlet {
            let (name, ty, shape) = match self {
                Input::F32(name, shape, _) => (name, TensorElementType::Float32, shape),
                Input::I64(name, shape, _) => (name, TensorElementType::Int64, shape),
            };
            let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            Outlet::new(
                *name,
                ValueType::Tensor {
                    ty,
                    shape: Shape::new(dims),
                    dimension_symbols: SymbolicDimensions::new(vec![String::new(); shape.len()]),
                },
            )
        }

        fn value(&self) -> (&'static str, SessionInputValue<'static>) {
            match self {
                Input::F32(name, shape, data) => (
                    name,
                    Tensor::from_array((shape.clone(), data.clone()))
                        .expect("a test input's shape matches its data")
                        .into(),
                ),
                Input::I64(name, shape, data) => (
                    name,
                    Tensor::from_array((shape.clone(), data.clone()))
                        .expect("a test input's shape matches its data")
                        .into(),
                ),
            }
        }
    }

    /// A builder whose graph reads `inputs` (declare them before adding nodes that use them).
    pub(in crate::fused::graph) fn builder(inputs: &[Input]) -> Builder {
        // The Model Editor API is ONNX Runtime's: load the library first.
        environment();
        let mut b = Builder::new().expect("ONNX Runtime makes an empty graph");
        b.graph
            .set_inputs(inputs.iter().map(Input::outlet))
            .expect("the test inputs are valid outlets");
        b
    }

    /// Makes `output` (a float tensor of rank `rank`) the graph's output, runs the graph on
    /// `inputs` (the same as given to [`builder`]) with ONNX Runtime, and returns it flat.
    pub(in crate::fused::graph) fn run(
        mut b: Builder,
        inputs: &[Input],
        output: &str,
        rank: usize,
    ) -> Vec<f32> {
        let node = b.fresh("n_out");
        b.graph
            .add_node(
                ort::editor::Node::new("Identity", ONNX_DOMAIN, node, [output], ["y"], [])
                    .expect("an Identity node"),
            )
            .expect("the output node is added");
        let symbols = (0..rank).map(|d| format!("y{d}")).collect::<Vec<_>>();
        b.graph
            .set_outputs([Outlet::new(
                "y",
                ValueType::Tensor {
                    ty: TensorElementType::Float32,
                    shape: Shape::new(vec![-1; rank]),
                    dimension_symbols: SymbolicDimensions::new(symbols),
                },
            )])
            .expect("the output outlet is valid");
        let opsets = [
            Opset::new(ONNX_DOMAIN, 21).expect("ONNX opset 21"),
            Opset::new(MS_DOMAIN, 1).expect("contrib opset 1"),
        ];
        let mut model = Model::new(opsets).expect("an empty model");
        model.set_graph(b.graph).expect("the graph is set");
        let options = Session::builder(&environment()).expect("session options");
        let mut session = model
            .into_session(&options)
            .expect("ONNX Runtime accepts the graph");
        let values: Vec<_> = inputs.iter().map(Input::value).collect();
        let outputs = session.run(values).expect("the graph runs");
        let (_, data) = outputs["y"]
            .try_extract_tensor::<f32>()
            .expect("a float output");
        data.to_vec()
    }

    fn environment() -> ort::environment::Environment {
        crate::runtime::environment(None)
            .expect("ONNX Runtime is installed (tools/fetch-onnxruntime.sh)")
    }

    /// Deterministic pseudo-random values in [-1, 1) (a fixed LCG: the tests need varied
    /// inputs, not a random crate).
    pub(in crate::fused::graph) fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The largest absolute difference.
    pub(in crate::fused::graph) fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "output lengths");
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{Input, builder, max_diff, run, values};

    #[test]
    fn layer_norm_without_bias_matches_its_definition() {
        let (rows, h) = (3, 8);
        let x = values(rows * h, 1);
        let gamma: Vec<f32> = values(h, 2).iter().map(|v| 1.0 + 0.5 * v).collect();
        let eps = 1e-5;
        let inputs = [Input::F32("x", vec![rows, h], x.clone())];
        let mut b = builder(&inputs);
        let g = b.init("gamma", &[h as i64], &gamma).unwrap();
        let y = b.layer_norm("x", &g, eps).unwrap();
        let got = run(b, &inputs, &y, 2);
        let mut want = Vec::new();
        for row in x.chunks(h) {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / h as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / h as f64;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            want.extend(
                row.iter()
                    .zip(&gamma)
                    .map(|(&v, &g)| ((f64::from(v) - mean) * inv * f64::from(g)) as f32),
            );
        }
        assert!(max_diff(&got, &want) < 1e-5, "{got:?} vs {want:?}");
    }
}
