//! The fused backend: ruri's own ModernBERT graph, built in process from `config.json` +
//! `model.safetensors` (no ONNX file, no Python), run by ONNX Runtime.
//!
//! * The token-embedding table (70 % of ruri-v3-30m's weights) is never read at load, and
//!   the lookup happens here, so it exists once whatever the number of sessions: fp32 reads
//!   it in place from the memory-mapped checkpoint; int8 quantizes each row (a scale per
//!   row) the first time its token is seen, so only the rows used take memory, a quarter
//!   of fp32's.
//! * Every other weight goes straight from the file into ONNX Runtime's memory as an
//!   initializer: one copy.
//! * Batches whose longest text is over [`OrtBuilder::long_text_tokens`](crate::OrtBuilder::long_text_tokens)
//!   run text by text on a second graph whose attention is linear in length (built on first
//!   use), so an 8,192-token text never materializes `8,192²` scores.

pub(crate) mod graph;
mod weights;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock};

use ndarray::Array2;
use ort::session::{RunOptions, Session, SessionOutputs};
use ort::value::TensorRef;
use ruri_core::{Backend, BackendOutput, Error, ModelConfig, PaddedBatch, Result};

use crate::pool::Pool;
pub(crate) use graph::Linears;
use graph::{Shapes, Variant};
use weights::Safetensors;

/// The token-embedding table.
enum Table {
    /// fp32: rows read in place from the memory-mapped checkpoint.
    Mapped(weights::MappedRows),
    /// int8: each row quantized (symmetric, a scale per row) the first time its token is
    /// seen, read from the file then. Rows never used take no memory (the buffer is
    /// allocated zeroed, so its pages exist only once written).
    Int8 {
        file: weights::FileRows,
        rows: RwLock<Int8Rows>,
    },
}

struct Int8Rows {
    q: Vec<i8>,
    /// 0 until the row is read.
    scale: Vec<f32>,
}

impl Table {
    fn new(st: &Safetensors, int8: bool) -> Result<Self> {
        const NAME: &str = "embeddings.tok_embeddings.weight";
        if !int8 {
            return Ok(Table::Mapped(st.map(NAME)?));
        }
        let file = st.file_rows(NAME)?;
        let (rows, cols) = (file.rows(), file.cols());
        Ok(Table::Int8 {
            file,
            rows: RwLock::new(Int8Rows {
                q: vec![0; rows * cols],
                scale: vec![0.0; rows],
            }),
        })
    }

    fn rows(&self) -> usize {
        match self {
            Table::Mapped(m) => m.rows(),
            Table::Int8 { file, .. } => file.rows(),
        }
    }

    /// Appends the rows of `ids` to `out`; an id outside the table is an error.
    fn lookup(&self, ids: &[i64], hidden: usize, out: &mut Vec<f32>) -> Result<()> {
        let rows = self.rows();
        let index = |id: i64| {
            usize::try_from(id)
                .ok()
                .filter(|&r| r < rows)
                .ok_or_else(|| Error::ModelOutput {
                    reason: format!("token id {id} is outside the embedding table ({rows} rows)"),
                })
        };
        let indices = ids
            .iter()
            .map(|&id| index(id))
            .collect::<Result<Vec<_>>>()?;
        out.reserve(ids.len() * hidden);
        match self {
            Table::Mapped(m) => indices.iter().for_each(|&r| m.push_row(r, out)),
            Table::Int8 { file, rows } => {
                let read = || rows.read().unwrap_or_else(PoisonError::into_inner);
                let missing = {
                    let cache = read();
                    indices.iter().any(|&r| cache.scale[r] == 0.0)
                };
                if missing {
                    let mut cache = rows.write().unwrap_or_else(PoisonError::into_inner);
                    let mut row = Vec::with_capacity(hidden);
                    for &r in &indices {
                        if cache.scale[r] != 0.0 {
                            continue;
                        }
                        file.read_row(r, &mut row)?;
                        let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let s = if max > 0.0 {
                            max / 127.0
                        } else {
                            f32::MIN_POSITIVE
                        };
                        let q = &mut cache.q[r * hidden..(r + 1) * hidden];
                        for (q, v) in q.iter_mut().zip(&row) {
                            *q = (v / s).round().clamp(-127.0, 127.0) as i8;
                        }
                        cache.scale[r] = s;
                    }
                }
                let cache = read();
                for &r in &indices {
                    let s = cache.scale[r];
                    let q = &cache.q[r * hidden..(r + 1) * hidden];
                    out.extend(q.iter().map(|&v| f32::from(v) * s));
                }
            }
        }
        Ok(())
    }
}

/// Opens `path` as the checkpoint of `config` and reads what the fused graph reads from it
/// (every tensor but the embedding table whole; the table's first and last rows, mapped and
/// by positional reads), with no ONNX Runtime: the `fused_weights` fuzz target's entry point.
/// Returns the number of values read, or the typed error the loader would return.
#[doc(hidden)]
pub fn read_checkpoint(path: &Path, config: &ModelConfig) -> Result<usize> {
    const TABLE: &str = "embeddings.tok_embeddings.weight";
    let mut st = Safetensors::open(path, config)?;
    let mut values = 0;
    for (name, _) in config.checkpoint_tensors() {
        if name != TABLE {
            values += st.read(&name)?.len();
        }
    }
    let mapped = st.map(TABLE)?;
    let file = st.file_rows(TABLE)?;
    let mut row = Vec::new();
    for r in [0, file.rows().saturating_sub(1)]
        .into_iter()
        .filter(|&r| r < file.rows())
    {
        mapped.push_row(r, &mut row);
        file.read_row(r, &mut row)?;
        values += 2 * row.len();
    }
    Ok(values)
}

/// How the fused sessions are made: the checkpoint, the mode, and the session options.
pub(crate) struct Recipe {
    pub(crate) safetensors: PathBuf,
    pub(crate) config: ModelConfig,
    pub(crate) linears: Linears,
    pub(crate) sessions: usize,
    pub(crate) long_text_tokens: usize,
    /// Makes a configured session builder (threads, spinning, prepacked weights, the custom
    /// operators) and commits a model with it.
    pub(crate) commit: Box<dyn Fn(ort::editor::Model) -> Result<Session> + Send + Sync>,
}

struct Lane {
    session: Session,
    run_options: RunOptions,
}

/// The ONNX Runtime backend on ruri's own fused graph (see the crate docs, "Graphs"). Reach
/// it from a [`TextEmbedder`](ruri_core::TextEmbedder) with
/// `embedder.backend_as::<FusedBackend>()`.
pub struct FusedBackend {
    table: Table,
    hidden: usize,
    lanes: Pool<Lane>,
    long: Mutex<Option<Lane>>,
    recipe: Recipe,
}

impl std::fmt::Debug for FusedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedBackend")
            .field("safetensors", &self.recipe.safetensors)
            .field("linears", &self.recipe.linears)
            .field("sessions", &self.lanes.size())
            .finish()
    }
}

fn lane(session: Session) -> Result<Lane> {
    let run_options = RunOptions::new().map_err(|e| Error::Backend {
        backend: "ort",
        context: "creating run options".into(),
        source: Box::new(e),
    })?;
    Ok(Lane {
        session,
        run_options,
    })
}

impl FusedBackend {
    pub(crate) fn load(recipe: Recipe) -> Result<Self> {
        let mut st = Safetensors::open(&recipe.safetensors, &recipe.config)?;
        let table = Table::new(&st, recipe.linears != Linears::Fp32)?;
        let shapes = Shapes::new(&recipe.config);
        let mut lanes = Vec::with_capacity(recipe.sessions);
        for _ in 0..recipe.sessions {
            let model = graph::build(&mut st, &shapes, recipe.linears, Variant::Batch)?;
            lanes.push(lane((recipe.commit)(model)?)?);
        }
        Ok(Self {
            table,
            hidden: recipe.config.hidden_size,
            lanes: Pool::new(lanes),
            long: Mutex::new(None),
            recipe,
        })
    }

    /// The checkpoint the graph was built from.
    pub fn safetensors_file(&self) -> &Path {
        &self.recipe.safetensors
    }

    /// Whether linears run in int8.
    pub fn is_int8(&self) -> bool {
        self.recipe.linears != Linears::Fp32
    }

    fn run_error(&self, e: ort::Error) -> Error {
        Error::Backend {
            backend: "ort",
            context: format!(
                "running the fused graph of {}",
                self.recipe.safetensors.display()
            ),
            source: Box::new(e),
        }
    }

    fn pooled(&self, outputs: &SessionOutputs<'_>, rows: usize) -> Result<Array2<f32>> {
        let (_, data) = outputs["sentence_embedding"]
            .try_extract_tensor::<f32>()
            .map_err(|e| self.run_error(e))?;
        Array2::from_shape_vec((rows, self.hidden), data.to_vec()).map_err(|e| Error::ModelOutput {
            reason: format!("the fused graph gave an output of unexpected shape: {e}"),
        })
    }

    /// One text of `ids` on the long-text graph (built on first use).
    fn forward_long(&self, ids: &[i64], out: &mut [f32]) -> Result<()> {
        let mut embeddings = Vec::new();
        self.table.lookup(ids, self.hidden, &mut embeddings)?;
        let mut long = self.long.lock().unwrap_or_else(PoisonError::into_inner);
        if long.is_none() {
            let mut st = Safetensors::open(&self.recipe.safetensors, &self.recipe.config)?;
            let shapes = Shapes::new(&self.recipe.config);
            let model = graph::build(&mut st, &shapes, self.recipe.linears, Variant::Long)?;
            *long = Some(lane((self.recipe.commit)(model)?)?);
        }
        let lane = long.as_mut().expect("built above");
        let input =
            TensorRef::from_array_view(([1, ids.len(), self.hidden], embeddings.as_slice()))
                .map_err(|e| self.run_error(e))?;
        let outputs = lane
            .session
            .run_with_options(ort::inputs!["embeddings" => input], &lane.run_options)
            .map_err(|e| self.run_error(e))?;
        let pooled = self.pooled(&outputs, 1)?;
        out.copy_from_slice(pooled.as_slice().expect("standard layout"));
        Ok(())
    }
}

impl Backend for FusedBackend {
    fn dim(&self) -> usize {
        self.hidden
    }

    fn parallelism(&self) -> usize {
        self.lanes.size()
    }

    fn forward(&self, batch: &PaddedBatch) -> Result<BackendOutput> {
        let (rows, seq) = (batch.batch_size(), batch.seq_len());
        if seq > self.recipe.long_text_tokens {
            let mut pooled = Array2::zeros((rows, self.hidden));
            for (r, mut out) in pooled.outer_iter_mut().enumerate() {
                let ids = &batch.input_ids()[r * seq..(r + 1) * seq];
                let mask = &batch.attention_mask()[r * seq..(r + 1) * seq];
                // Right-padded: the text is the prefix the mask covers.
                let len = mask.iter().take_while(|&&m| m != 0).count();
                self.forward_long(
                    &ids[..len.max(1)],
                    out.as_slice_mut().expect("rows of a standard array"),
                )?;
            }
            return Ok(BackendOutput::Pooled(pooled));
        }
        let mut embeddings = Vec::new();
        self.table
            .lookup(batch.input_ids(), self.hidden, &mut embeddings)?;
        let input = TensorRef::from_array_view(([rows, seq, self.hidden], embeddings.as_slice()))
            .map_err(|e| self.run_error(e))?;
        let mask = TensorRef::from_array_view(([rows, seq], batch.attention_mask()))
            .map_err(|e| self.run_error(e))?;
        self.lanes.with(|lane| {
            let outputs = lane
                .session
                .run_with_options(
                    ort::inputs!["embeddings" => input, "attention_mask" => mask],
                    &lane.run_options,
                )
                .map_err(|e| self.run_error(e))?;
            Ok(BackendOutput::Pooled(self.pooled(&outputs, rows)?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz target's seeds (written by hand-rolled Python, `fuzz/make_weight_seeds.py`)
    /// load, so the fuzzer starts from files that reach past the header checks. Values read:
    /// every tensor but the 10 × 8 table (8 + 8 + 24·8 + 8·8 + 8 + 32·8 + 8·16 = 664), and the
    /// table's first and last rows, each read twice (4 · 8 = 32).
    #[test]
    fn the_fuzz_seeds_are_checkpoints_that_load() {
        let config = ModelConfig::from_json_str(
            r#"{"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 64}"#,
            "config.json",
        )
        .unwrap();
        let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds_weights");
        for seed in [
            "plain.f32.safetensors",
            "model.bf16.safetensors",
            "plain.f16.safetensors",
        ] {
            assert_eq!(
                read_checkpoint(&seeds.join(seed), &config).unwrap(),
                664 + 32,
                "{seed}"
            );
        }
    }
}
