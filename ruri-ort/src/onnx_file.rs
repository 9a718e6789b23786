//! The ONNX-file backend: a pool of sessions over one ONNX file, its signature checked at
//! load (inputs, the output read, whether that output is already normalized).

use std::path::{Path, PathBuf};

use ndarray::{Ix2, Ix3};
use ort::session::{HasSelectedOutputs, OutputSelector, RunOptions, Session};
use ort::value::TensorRef;
use ruri_core::{Backend, BackendOutput, Error, ModelConfig, PaddedBatch, Result};

use crate::pool::Pool;

/// Which output of the ONNX model carries the vectors.
#[derive(Debug, Clone)]
enum OutputKind {
    /// `batch × dim`, already pooled.
    Pooled(String),
    /// `batch × seq × dim`, pooled by the pipeline.
    Tokens(String),
}

impl OutputKind {
    fn name(&self) -> &str {
        match self {
            OutputKind::Pooled(n) | OutputKind::Tokens(n) => n,
        }
    }
}

/// The element type of the output read: float32, or float16 widened to f32 on the way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    F32,
    F16,
}

#[derive(Debug, Clone)]
struct Signature {
    output: OutputKind,
    element: Element,
    /// A token-level output, when the model has one besides the pooled one.
    tokens_fallback: Option<(String, Element)>,
    /// The pooled output is L2-normalized and no token-level output exists.
    normalized: bool,
    dim: usize,
}

impl Signature {
    /// Checks the model's inputs and picks its output, preferring the pooled one (no
    /// `batch × seq × dim` copy out of ONNX Runtime).
    fn inspect(session: &Session, onnx: &Path, hidden_size: usize) -> Result<Self> {
        let unsupported = |what: String| Error::Unsupported {
            path: onnx.to_path_buf(),
            what,
        };
        let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        for needed in ["input_ids", "attention_mask"] {
            if !inputs.contains(&needed) {
                return Err(unsupported(format!(
                    "an ONNX model without a {needed:?} input (inputs: {inputs:?})"
                )));
            }
        }
        if let Some(extra) = inputs
            .iter()
            .find(|n| !matches!(**n, "input_ids" | "attention_mask"))
        {
            return Err(unsupported(format!(
                "an ONNX model with the extra input {extra:?} (inputs: {inputs:?})"
            )));
        }
        let outputs: Vec<&str> = session.outputs().iter().map(|o| o.name()).collect();
        let tokens = ["token_embeddings", "last_hidden_state"]
            .into_iter()
            .find(|n| outputs.contains(n));
        let output = if outputs.contains(&"sentence_embedding") {
            OutputKind::Pooled("sentence_embedding".into())
        } else if let Some(name) = tokens {
            OutputKind::Tokens(name.into())
        } else {
            return Err(unsupported(format!(
                "an ONNX model without sentence_embedding, token_embeddings or \
                 last_hidden_state outputs (outputs: {outputs:?})"
            )));
        };
        let describe = |name: &str| -> Result<(Element, Option<i64>)> {
            let outlet = session
                .outputs()
                .iter()
                .find(|o| o.name() == name)
                .expect("the name was taken from the session's outputs");
            match outlet.dtype() {
                ort::value::ValueType::Tensor { ty, shape, .. } => {
                    let element = match ty {
                        ort::value::TensorElementType::Float32 => Element::F32,
                        ort::value::TensorElementType::Float16 => Element::F16,
                        other => {
                            return Err(unsupported(format!(
                                "the output {name} of element type {other:?} (ruri reads \
                                 float32 and float16 outputs)"
                            )));
                        }
                    };
                    Ok((element, shape.last().copied()))
                }
                other => Err(unsupported(format!(
                    "the output {name} of type {other:?} (ruri reads tensors)"
                ))),
            }
        };
        let (element, declared) = describe(output.name())?;
        // A static last dimension that disagrees with config.json means the wrong folder.
        if let Some(d) = declared.filter(|&d| d > 0 && d as usize != hidden_size) {
            return Err(Error::InvalidConfig {
                path: onnx.to_path_buf(),
                reason: format!(
                    "the ONNX output {} has {d} dimensions but config.json's hidden_size is {hidden_size}",
                    output.name()
                ),
            });
        }
        let tokens_fallback = match (&output, tokens) {
            (OutputKind::Pooled(_), Some(name)) => Some((name.to_owned(), describe(name)?.0)),
            _ => None,
        };
        Ok(Self {
            output,
            element,
            tokens_fallback,
            normalized: false,
            dim: hidden_size,
        })
    }

    /// Some ports bake L2 normalization into `sentence_embedding`. Raw means raw: such a
    /// pooled output is replaced by the token-level one when the model has it (the pipeline
    /// then pools, and normalizes only when asked), else marked so that raw vectors are
    /// refused. Found by running two short texts: a mean-pooled vector of unit length by
    /// chance, twice, is not a risk worth a wrong answer.
    fn check_normalized(
        &mut self,
        session: &mut Session,
        onnx: &Path,
        probe: [i64; 4],
    ) -> Result<()> {
        if !matches!(self.output, OutputKind::Pooled(_)) {
            return Ok(());
        }
        let [bos, eos, pad, word] = probe;
        let fail = |e: ort::Error| Error::Backend {
            backend: "ort",
            context: format!("probing the output of {}", onnx.display()),
            source: Box::new(e),
        };
        let ids = ndarray::arr2(&[[bos, eos, pad], [bos, word, eos]]);
        let mask = ndarray::arr2(&[[1i64, 1, 0], [1, 1, 1]]);
        let ids = TensorRef::from_array_view(ids.view()).map_err(fail)?;
        let mask = TensorRef::from_array_view(mask.view()).map_err(fail)?;
        let outputs = session
            .run(ort::inputs!["input_ids" => ids, "attention_mask" => mask])
            .map_err(fail)?;
        let pooled = extract(&outputs[self.output.name()], self.element).map_err(fail)?;
        // float16 outputs carry ~3 decimal digits.
        let tolerance = match self.element {
            Element::F32 => 1e-4,
            Element::F16 => 1e-2,
        };
        let unit = pooled.outer_iter().all(|row| {
            let norm = row
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                .sqrt();
            (norm - 1.0).abs() < tolerance
        });
        if unit {
            match self.tokens_fallback.take() {
                Some((name, element)) => {
                    self.output = OutputKind::Tokens(name);
                    self.element = element;
                }
                None => self.normalized = true,
            }
        }
        Ok(())
    }
}

/// An output as an owned f32 array: float32 copied, float16 widened.
fn extract(
    value: &ort::value::DynValue,
    element: Element,
) -> std::result::Result<ndarray::ArrayD<f32>, ort::Error> {
    Ok(match element {
        Element::F32 => value.try_extract_array::<f32>()?.to_owned(),
        Element::F16 => value.try_extract_array::<half::f16>()?.mapv(f32::from),
    })
}

/// The ONNX Runtime [`Backend`]: a pool of sessions over one ONNX file. Reach it from a
/// [`TextEmbedder`](ruri_core::TextEmbedder) with `embedder.backend_as::<OrtBackend>()`.
#[derive(Debug)]
pub struct OrtBackend {
    pool: Pool<Lane>,
    signature: Signature,
    onnx: PathBuf,
}

/// A session with its run options (which are not `Sync`, so they travel with the session).
struct Lane {
    session: Session,
    run_options: RunOptions<HasSelectedOutputs>,
}

impl OrtBackend {
    /// `sessions` sessions of `onnx`, each made by `session`: the first is inspected (the
    /// inputs, the output read, whether it is normalized) before the others are made.
    pub(crate) fn load(
        onnx: PathBuf,
        config: &ModelConfig,
        sessions: usize,
        mut session: impl FnMut(&Path) -> Result<Session>,
    ) -> Result<Self> {
        let mut first = session(&onnx)?;
        let mut signature = Signature::inspect(&first, &onnx, config.hidden_size)?;
        let word = 7.min(config.vocab_size.saturating_sub(1)) as i64;
        signature.check_normalized(
            &mut first,
            &onnx,
            [
                i64::from(config.bos_token_id),
                i64::from(config.eos_token_id),
                i64::from(config.pad_token_id),
                word,
            ],
        )?;
        let mut all = vec![first];
        for _ in 1..sessions {
            all.push(session(&onnx)?);
        }
        // Fetch only the output we use: a model with both outputs would otherwise copy out
        // `batch × seq × dim` token embeddings on every run.
        let output_name = signature.output.name().to_owned();
        let lanes = all
            .into_iter()
            .map(|session| {
                let run_options = RunOptions::new()
                    .map_err(|e| Error::Backend {
                        backend: "ort",
                        context: "creating run options".into(),
                        source: Box::new(e),
                    })?
                    .with_outputs(OutputSelector::no_default().with(output_name.clone()));
                Ok(Lane {
                    session,
                    run_options,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(OrtBackend {
            pool: Pool::new(lanes),
            signature,
            onnx,
        })
    }

    /// The ONNX file the sessions run.
    pub fn onnx_file(&self) -> &Path {
        &self.onnx
    }

    fn run_error(&self, e: ort::Error) -> Error {
        Error::Backend {
            backend: "ort",
            context: format!("running {}", self.onnx.display()),
            source: Box::new(e),
        }
    }
}

impl Backend for OrtBackend {
    fn dim(&self) -> usize {
        self.signature.dim
    }

    /// One batch per session at a time.
    fn parallelism(&self) -> usize {
        self.pool.size()
    }

    fn forward(&self, batch: &PaddedBatch) -> Result<BackendOutput> {
        let shape = [batch.batch_size(), batch.seq_len()];
        let ids = TensorRef::from_array_view((shape, batch.input_ids()))
            .map_err(|e| self.run_error(e))?;
        let mask = TensorRef::from_array_view((shape, batch.attention_mask()))
            .map_err(|e| self.run_error(e))?;
        let shape_error = |e: ndarray::ShapeError| Error::ModelOutput {
            reason: format!(
                "{} gave an output of unexpected rank: {e}",
                self.onnx.display()
            ),
        };
        self.pool.with(|lane| {
            let outputs = lane
                .session
                .run_with_options(
                    ort::inputs!["input_ids" => ids, "attention_mask" => mask],
                    &lane.run_options,
                )
                .map_err(|e| self.run_error(e))?;
            // Copy out while the session is held: the output lives in ONNX Runtime's memory.
            let array = extract(
                &outputs[self.signature.output.name()],
                self.signature.element,
            )
            .map_err(|e| self.run_error(e))?;
            Ok(match &self.signature.output {
                OutputKind::Pooled(_) => {
                    BackendOutput::Pooled(array.into_dimensionality::<Ix2>().map_err(shape_error)?)
                }
                OutputKind::Tokens(_) => BackendOutput::TokenEmbeddings(
                    array.into_dimensionality::<Ix3>().map_err(shape_error)?,
                ),
            })
        })
    }

    fn output_is_normalized(&self) -> bool {
        self.signature.normalized
    }
}
