//! ruri's int8 weights file (`model.ruri-int8.safetensors`): the int8 weights the loader
//! would make from `model.safetensors`, written once ([`crate::NativeBuilder::write_int8_file`],
//! `ruri quantize`) so that a load reads them instead of decoding and quantizing fp32.
//!
//! A plain safetensors file (any safetensors reader opens it) whose `__metadata__` says what
//! it is ([`FORMAT`], [`VERSION`]), every option that changes its numbers, and the shape of
//! the model it was made from; its tensors are what quantization produced, in the weights'
//! natural `n × k` order (packing for a kernel is cheap and per kernel, so it is not stored):
//!
//! | tensor | dtype, shape |
//! |---|---|
//! | `embeddings.norm.weight`, `final_norm.weight`, `layers.N.attn_norm.weight` (N ≥ 1), `layers.N.mlp_norm.weight` | F32 `[hidden]` |
//! | `embeddings.tok_embeddings.weight` | I8 `[vocab, hidden]` with `embedding_table = int8`, else F32 |
//! | `embeddings.tok_embeddings.weight_scale` | F32 `[vocab]` (int8 table only): row `r` is `q[r] · s[r]` |
//! | `L.weight` (L: `layers.N.attn.Wqkv`, `.attn.Wo`, `.mlp.Wi`, `.mlp.Wo`) | I8 `[n, k]`: `w ≈ q · s` per output channel, outlier channels 0 |
//! | `L.weight_scale` | F32 `[n]` |
//! | `L.outlier_channels` | I32 `[m]`: the input channels computed in f32, ascending (m may be 0) |
//! | `L.outlier_weight` | F32 `[m, n]`: their weights, a row per channel |
//! | or, for a layer split in two int8 products: `L.main.weight`, `L.side.weight` | I8 `[n, k₁]`, `[n, k₂]` |
//! | `L.main.weight_scale`, `L.side.weight_scale` | F32 `[n]` |
//! | `L.main.columns`, `L.side.columns` | I32 `[k₁]`, `[k₂]`: the input channels each reads, ascending, together `0..k` |
//!
//! The MLP's intermediate units are in the loader's order (writer units last): `mlp.Wi`'s
//! rows (both halves) and `mlp.Wo`'s columns are the checkpoint's, permuted alike, so the
//! MLP computes the same function. Tensors of 4-byte dtypes come first, so every one starts
//! at a multiple of 4.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use ruri_core::safetensors::{self, TensorEntry};
use ruri_core::{Error, ModelConfig, Result};

use crate::linear::{Int8Parts, LinearParts};
use crate::model::{Assembler, EMBEDDINGS, LoadOptions, Quantized};
use crate::weights::{Dtype, Entry, Header, Safetensors, Source};
use crate::{EmbeddingTable, Named};

/// The file's name in a model folder: `.safetensors`, so that tools open it, and not
/// `model.safetensors`, so that transformers and sentence-transformers never take it for
/// the checkpoint (and the two can sit side by side).
pub const INT8_FILE: &str = "model.ruri-int8.safetensors";
/// `__metadata__["format"]`.
pub const FORMAT: &str = "ruri-int8";
/// `__metadata__["format_version"]`: the version this build writes and reads.
pub const VERSION: u32 = 1;

/// The scales of the int8 embedding table.
const TABLE_SCALES: &str = "embeddings.tok_embeddings.weight_scale";

/// The config.json fields the file records (the shapes follow from them).
fn identity(config: &ModelConfig) -> [(&'static str, usize); 5] {
    [
        ("hidden_size", config.hidden_size),
        ("intermediate_size", config.intermediate_size),
        ("num_hidden_layers", config.num_hidden_layers),
        ("num_attention_heads", config.num_attention_heads),
        ("vocab_size", config.vocab_size),
    ]
}

/// The dtypes the file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    F32,
    I8,
    I32,
}

impl Stored {
    fn name(self) -> &'static str {
        match self {
            Stored::F32 => "F32",
            Stored::I8 => "I8",
            Stored::I32 => "I32",
        }
    }

    pub(crate) fn width(self) -> usize {
        match self {
            Stored::I8 => 1,
            Stored::F32 | Stored::I32 => 4,
        }
    }

    fn from_name(name: &str) -> Option<(Self, usize)> {
        let d = match name {
            "F32" => Stored::F32,
            "I8" => Stored::I8,
            "I32" => Stored::I32,
            _ => return None,
        };
        Some((d, d.width()))
    }
}

/// The options a file was made with, from its `__metadata__`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileOptions {
    pub(crate) table: EmbeddingTable,
    pub(crate) outliers: bool,
}

/// Whether the header `header` is ruri's int8 file: its `__metadata__` says
/// `format = ruri-int8` (any other safetensors file is a checkpoint).
pub(crate) fn is_int8_file(path: &Path, header: &Header) -> Result<bool> {
    let (_, metadata) = safetensors::parse_header_with(
        path,
        &header.json,
        header.data_start,
        header.file_len,
        |_| None::<((), usize)>,
    )?;
    Ok(metadata.get("format").map(String::as_str) == Some(FORMAT))
}

/// What a tensor of the file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A LayerNorm's weights, handed to [`Assembler::tensor`] by name.
    Norm,
    /// Rows of the f32 table (a row at a time when streamed).
    TableF32,
    /// Rows of the int8 table.
    TableI8,
    TableScales,
    /// A piece of linear layer `linear` (an index into [`Plan::linears`]).
    Linear {
        linear: usize,
        piece: Piece,
    },
}

/// The pieces of a linear layer: product 0 (the only one, or a split's main) and 1 (a
/// split's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece {
    Weight(usize),
    Scale(usize),
    /// A plain product's outlier channels, or a split group's columns.
    Indices(usize),
    OutlierWeight,
}

/// One tensor the file must hold.
#[derive(Debug, Clone)]
pub(crate) struct Want {
    pub(crate) name: String,
    pub(crate) dtype: Stored,
    pub(crate) shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) role: Role,
}

/// A linear layer as the file holds it.
#[derive(Debug, Clone)]
pub(crate) struct PlannedLinear {
    /// Without `.weight`: `layers.0.attn.Wqkv`.
    name: String,
    split: bool,
    n: usize,
}

/// The checked header of an int8 file: every tensor to read.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) wants: Vec<Want>,
    linears: Vec<PlannedLinear>,
}

/// The options a file records, and its model's shape checked against `config`: its
/// `__metadata__` alone, before any tensor, so that a file is refused for the same reason
/// whether its length is known yet (bytes) or not (a stream).
pub(crate) fn file_options(
    path: &Path,
    header: &Header,
    config: &ModelConfig,
) -> Result<FileOptions> {
    let invalid = |reason: String| Error::InvalidConfig {
        path: path.to_path_buf(),
        reason,
    };
    let (_, meta) = safetensors::parse_header_with(
        path,
        &header.json,
        header.data_start,
        header.file_len,
        |_| None::<((), usize)>,
    )?;
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(invalid(format!(
            "not ruri's int8 file (its __metadata__ has no format = {FORMAT}; \
             `ruri quantize` writes one)"
        )));
    }
    let field = |key: &str| {
        meta.get(key)
            .ok_or_else(|| invalid(format!("__metadata__ has no {key}")))
    };
    let version = field("format_version")?;
    if version.parse::<u32>().ok() != Some(VERSION) {
        return Err(Error::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "{FORMAT} format version {version:?} (this build reads version {VERSION}; \
                 write the file again with this build's `ruri quantize`)"
            ),
        });
    }
    for (key, value) in identity(config) {
        let in_file = field(key)?;
        if in_file.parse::<usize>().ok() != Some(value) {
            return Err(Error::WeightsMismatch {
                path: path.to_path_buf(),
                what: key,
                in_file: in_file.clone(),
                wanted: value.to_string(),
                wanted_by: "config.json",
            });
        }
    }
    let table = field("embedding_table")?;
    let table: EmbeddingTable = table.parse().map_err(|_| {
        invalid(format!(
            "embedding_table = {table:?} ({})",
            EmbeddingTable::KNOWN
        ))
    })?;
    let outliers = match field("outlier_channels")?.as_str() {
        "true" => true,
        "false" => false,
        other => {
            return Err(invalid(format!(
                "outlier_channels = {other:?} (true or false)"
            )));
        }
    };
    Ok(FileOptions { table, outliers })
}

impl Plan {
    /// The tensors of the header `header` (whose [`file_options`] are `options`) checked
    /// against `config`: every tensor's dtype and shape, and that it fits the file.
    pub(crate) fn new(
        path: &Path,
        header: &Header,
        config: &ModelConfig,
        options: FileOptions,
    ) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let (entries, _) = safetensors::parse_header_with(
            path,
            &header.json,
            header.data_start,
            header.file_len,
            Stored::from_name,
        )?;
        let FileOptions { table, outliers } = options;
        let (mut wants, mut linears) = (Vec::new(), Vec::new());
        let mut want = |name: String, dtype: Stored, shape: Vec<usize>, role: Role| {
            let entry: &TensorEntry<Stored> = entries
                .get(&name)
                .ok_or_else(|| invalid(format!("the tensor {name} is missing")))?;
            if entry.dtype != dtype || entry.shape != shape {
                return Err(invalid(format!(
                    "the tensor {name} is {} {:?}, but {} {shape:?} was expected",
                    entry.dtype.name(),
                    entry.shape,
                    dtype.name()
                )));
            }
            // `data_start + end` was checked to be within the file.
            wants.push(Want {
                name,
                dtype,
                shape,
                start: header.data_start + entry.start,
                end: header.data_start + entry.end,
                role,
            });
            Ok(())
        };
        let (h, i, vocab) = (
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
        );
        for name in ["embeddings.norm.weight", "final_norm.weight"] {
            want(name.into(), Stored::F32, vec![h], Role::Norm)?;
        }
        match table {
            EmbeddingTable::F32 => want(
                EMBEDDINGS.into(),
                Stored::F32,
                vec![vocab, h],
                Role::TableF32,
            )?,
            EmbeddingTable::Int8 => {
                want(EMBEDDINGS.into(), Stored::I8, vec![vocab, h], Role::TableI8)?;
                want(
                    TABLE_SCALES.into(),
                    Stored::F32,
                    vec![vocab],
                    Role::TableScales,
                )?;
            }
        }
        for layer in 0..config.num_hidden_layers {
            if layer > 0 {
                let name = format!("layers.{layer}.attn_norm.weight");
                want(name, Stored::F32, vec![h], Role::Norm)?;
            }
            want(
                format!("layers.{layer}.mlp_norm.weight"),
                Stored::F32,
                vec![h],
                Role::Norm,
            )?;
            for (which, n, k) in [
                ("attn.Wqkv", 3 * h, h),
                ("attn.Wo", h, h),
                ("mlp.Wi", 2 * i, h),
                ("mlp.Wo", h, i),
            ] {
                let name = format!("layers.{layer}.{which}");
                let linear = linears.len();
                let split = !entries.contains_key(&format!("{name}.weight"))
                    && entries.contains_key(&format!("{name}.main.weight"));
                let role = |piece| Role::Linear { linear, piece };
                // The number of entries of an I32 tensor of one dimension, else `usize::MAX`.
                let len = |t: &str| match entries.get(t) {
                    Some(e) if e.shape.len() == 1 => e.shape[0],
                    _ => usize::MAX,
                };
                if split {
                    let mut columns = 0usize;
                    for (p, group) in ["main", "side"].into_iter().enumerate() {
                        let g = format!("{name}.{group}");
                        let kg = len(&format!("{g}.columns"));
                        if kg > k {
                            return Err(invalid(format!(
                                "the tensor {g}.columns is missing or longer than {k}"
                            )));
                        }
                        columns += kg;
                        want(
                            format!("{g}.weight"),
                            Stored::I8,
                            vec![n, kg],
                            role(Piece::Weight(p)),
                        )?;
                        want(
                            format!("{g}.weight_scale"),
                            Stored::F32,
                            vec![n],
                            role(Piece::Scale(p)),
                        )?;
                        want(
                            format!("{g}.columns"),
                            Stored::I32,
                            vec![kg],
                            role(Piece::Indices(p)),
                        )?;
                    }
                    if columns != k {
                        return Err(invalid(format!(
                            "{name}'s two groups read {columns} input channels of {k}"
                        )));
                    }
                } else {
                    let m = len(&format!("{name}.outlier_channels"));
                    if m > k {
                        return Err(invalid(format!(
                            "the tensor {name}.outlier_channels is missing or longer than {k}"
                        )));
                    }
                    if m > 0 && !outliers {
                        return Err(invalid(format!(
                            "{name} has outlier channels, but outlier_channels = false"
                        )));
                    }
                    want(
                        format!("{name}.weight"),
                        Stored::I8,
                        vec![n, k],
                        role(Piece::Weight(0)),
                    )?;
                    want(
                        format!("{name}.weight_scale"),
                        Stored::F32,
                        vec![n],
                        role(Piece::Scale(0)),
                    )?;
                    want(
                        format!("{name}.outlier_channels"),
                        Stored::I32,
                        vec![m],
                        role(Piece::Indices(0)),
                    )?;
                    want(
                        format!("{name}.outlier_weight"),
                        Stored::F32,
                        vec![m, n],
                        role(Piece::OutlierWeight),
                    )?;
                }
                if split && !outliers {
                    return Err(invalid(format!(
                        "{name} is split in two products, but outlier_channels = false"
                    )));
                }
                linears.push(PlannedLinear { name, split, n });
            }
        }
        wants.sort_by_key(|w| w.start);
        Ok(Plan { wants, linears })
    }
}

impl FileOptions {
    /// The options `requested` (the builder's) resolved against the file's: an option the
    /// builder left unset follows the file; one set to another value is
    /// [`Error::WeightsMismatch`].
    pub(crate) fn resolve(
        self,
        path: &Path,
        mut requested: LoadOptions,
        table: Option<EmbeddingTable>,
        outliers: Option<bool>,
    ) -> Result<LoadOptions> {
        let mismatch = |what, in_file: String, wanted: String| Error::WeightsMismatch {
            path: path.to_path_buf(),
            what,
            in_file,
            wanted,
            wanted_by: "the builder",
        };
        if requested.precision != crate::Precision::Int8 {
            return Err(mismatch(
                "precision",
                "int8".into(),
                requested.precision.to_string(),
            ));
        }
        let file = self;
        if let Some(table) = table.filter(|&t| t != file.table) {
            return Err(mismatch(
                "embedding_table",
                file.table.to_string(),
                table.to_string(),
            ));
        }
        if let Some(outliers) = outliers.filter(|&o| o != file.outliers) {
            return Err(mismatch(
                "outlier_channels",
                file.outliers.to_string(),
                outliers.to_string(),
            ));
        }
        requested.table = file.table;
        requested.outliers = file.outliers;
        Ok(requested)
    }
}

/// The decoded data of one tensor.
#[derive(Debug)]
enum Data {
    F32(Vec<f32>),
    I8(Vec<i8>),
    I32(Vec<i32>),
}

fn decode(dtype: Stored, bytes: &[u8]) -> Data {
    match dtype {
        Stored::I8 => Data::I8(bytes.iter().map(|&b| b as i8).collect()),
        Stored::F32 => {
            let mut out = Vec::with_capacity(bytes.len() / 4);
            Dtype::F32.decode_into(bytes, &mut out);
            Data::F32(out)
        }
        Stored::I32 => Data::I32(
            bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
    }
}

/// One linear layer's pieces received so far.
#[derive(Debug, Default)]
struct Pieces {
    weight: [Option<Vec<i8>>; 2],
    scale: [Option<Vec<f32>>; 2],
    indices: [Option<Vec<i32>>; 2],
    outlier_w: Option<Vec<f32>>,
    received: usize,
}

/// Prepares a model from an int8 file's tensors, in any order: each linear layer is packed
/// as soon as its last piece is in (so a whole file, or a stream, in any order).
#[derive(Debug)]
pub(crate) struct Int8Reader {
    path: PathBuf,
    assembler: Assembler,
    linears: Vec<PlannedLinear>,
    pieces: Vec<Pieces>,
}

impl Int8Reader {
    /// `plan`'s linear layers; `options` as [`FileOptions::resolve`] gave.
    pub(crate) fn new(
        path: PathBuf,
        plan: &Plan,
        config: &ModelConfig,
        options: LoadOptions,
    ) -> Self {
        Self {
            path,
            assembler: Assembler::new(config, options),
            linears: plan.linears.clone(),
            pieces: plan.linears.iter().map(|_| Pieces::default()).collect(),
        }
    }

    fn invalid(&self, reason: String) -> Error {
        Error::InvalidConfig {
            path: self.path.clone(),
            reason,
        }
    }

    /// A whole tensor's bytes (or, for the table, whole rows of it, in order).
    pub(crate) fn tensor(&mut self, want: &Want, bytes: &[u8]) -> Result<()> {
        let data = decode(want.dtype, bytes);
        match (want.role, data) {
            (Role::Norm, Data::F32(mut w)) => self.assembler.tensor(&want.name, &mut w),
            (Role::TableF32, Data::F32(rows)) => self.assembler.embedding_rows(&rows),
            (Role::TableI8, Data::I8(rows)) => self.assembler.embedding_rows_int8(&rows),
            (Role::TableScales, Data::F32(s)) => {
                self.assembler.embedding_scales(s);
                Ok(())
            }
            (Role::Linear { linear, piece }, data) => self.piece(linear, piece, data),
            _ => unreachable!("the plan gives every role its dtype"),
        }
    }

    fn piece(&mut self, linear: usize, piece: Piece, data: Data) -> Result<()> {
        let p = &mut self.pieces[linear];
        match (piece, data) {
            (Piece::Weight(g), Data::I8(v)) => p.weight[g] = Some(v),
            (Piece::Scale(g), Data::F32(v)) => p.scale[g] = Some(v),
            (Piece::Indices(g), Data::I32(v)) => p.indices[g] = Some(v),
            (Piece::OutlierWeight, Data::F32(v)) => p.outlier_w = Some(v),
            _ => unreachable!("the plan gives every piece its dtype"),
        }
        p.received += 1;
        let planned = &self.linears[linear];
        let needed = if planned.split { 6 } else { 4 };
        if p.received < needed {
            return Ok(());
        }
        let p = std::mem::take(&mut self.pieces[linear]);
        let name = planned.name.clone();
        let n = planned.n;
        let indices = |v: Option<Vec<i32>>| -> Result<Vec<usize>> {
            v.unwrap_or_default()
                .into_iter()
                .map(usize::try_from)
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| self.invalid(format!("{name} has a negative channel index")))
        };
        let [w0, w1] = p.weight;
        let [s0, s1] = p.scale;
        let [i0, i1] = p.indices;
        let product = |q: Option<Vec<i8>>, scales: Option<Vec<f32>>| {
            let q = q.unwrap_or_default();
            let k = q.len().checked_div(n).unwrap_or(0);
            Int8Parts {
                n,
                k,
                q,
                scales: scales.unwrap_or_default(),
                outliers: Vec::new(),
                outlier_w: Vec::new(),
                columns: None,
            }
        };
        let parts = if planned.split {
            let mut main = product(w0, s0);
            main.columns = Some(indices(i0)?);
            let mut side = product(w1, s1);
            side.columns = Some(indices(i1)?);
            LinearParts::Split { main, side }
        } else {
            let mut one = product(w0, s0);
            one.outliers = indices(i0)?;
            one.outlier_w = p.outlier_w.unwrap_or_default();
            LinearParts::Int8(one)
        };
        self.assembler.quantized(&name, parts)
    }

    /// Takes the layers `other` prepared (other layers than this reader's).
    fn absorb(&mut self, other: Int8Reader) {
        self.assembler.absorb(other.assembler);
    }

    /// The model, every tensor received; `source`: the f32 table's file to read rows from.
    pub(crate) fn finish(self, source: Option<Safetensors>) -> Result<crate::model::Model> {
        self.assembler.finish(source)
    }
}

/// The int8 file of `quantized` (and, for an f32 table, `table_f32`: its rows in order),
/// whole.
pub(crate) fn write(
    config: &ModelConfig,
    options: &LoadOptions,
    quantized: Quantized,
    table_f32: Option<Vec<f32>>,
) -> Vec<u8> {
    let (h, vocab) = (config.hidden_size, config.vocab_size);
    type Tensor = (String, Stored, Vec<usize>, Vec<u8>);
    let mut tensors: Vec<Tensor> = Vec::new();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let i32s = |v: &[usize]| {
        v.iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let i8s = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
    fn put(
        tensors: &mut Vec<Tensor>,
        name: String,
        dtype: Stored,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    ) {
        tensors.push((name, dtype, shape, bytes));
    }
    let t = &mut tensors;
    put(
        t,
        "embeddings.norm.weight".into(),
        Stored::F32,
        vec![h],
        f32s(&quantized.emb_norm),
    );
    put(
        t,
        "final_norm.weight".into(),
        Stored::F32,
        vec![h],
        f32s(&quantized.final_norm),
    );
    match table_f32 {
        Some(rows) => put(
            t,
            EMBEDDINGS.into(),
            Stored::F32,
            vec![vocab, h],
            f32s(&rows),
        ),
        None => {
            put(
                t,
                EMBEDDINGS.into(),
                Stored::I8,
                vec![vocab, h],
                i8s(&quantized.table_q),
            );
            put(
                t,
                TABLE_SCALES.into(),
                Stored::F32,
                vec![vocab],
                f32s(&quantized.table_scales),
            );
        }
    }
    for (n, layer) in quantized.layers.iter().enumerate() {
        if let Some(w) = &layer.attn_norm {
            put(
                t,
                format!("layers.{n}.attn_norm.weight"),
                Stored::F32,
                vec![h],
                f32s(w),
            );
        }
        put(
            t,
            format!("layers.{n}.mlp_norm.weight"),
            Stored::F32,
            vec![h],
            f32s(&layer.mlp_norm),
        );
        for (which, parts) in [
            ("attn.Wqkv", &layer.wqkv),
            ("attn.Wo", &layer.wo),
            ("mlp.Wi", &layer.wi),
            ("mlp.Wo", &layer.mlp_wo),
        ] {
            let name = format!("layers.{n}.{which}");
            let product = |t: &mut Vec<Tensor>, prefix: &str, p: &Int8Parts| {
                put(
                    t,
                    format!("{prefix}.weight"),
                    Stored::I8,
                    vec![p.n, p.k],
                    i8s(&p.q),
                );
                put(
                    t,
                    format!("{prefix}.weight_scale"),
                    Stored::F32,
                    vec![p.n],
                    f32s(&p.scales),
                );
            };
            match parts {
                LinearParts::Int8(p) => {
                    product(t, &name, p);
                    let m = p.outliers.len();
                    put(
                        t,
                        format!("{name}.outlier_channels"),
                        Stored::I32,
                        vec![m],
                        i32s(&p.outliers),
                    );
                    put(
                        t,
                        format!("{name}.outlier_weight"),
                        Stored::F32,
                        vec![m, p.n],
                        f32s(&p.outlier_w),
                    );
                }
                LinearParts::Split { main, side } => {
                    for (group, p) in [("main", main), ("side", side)] {
                        let prefix = format!("{name}.{group}");
                        product(t, &prefix, p);
                        let columns = p.columns.as_deref().unwrap_or_default();
                        put(
                            t,
                            format!("{prefix}.columns"),
                            Stored::I32,
                            vec![columns.len()],
                            i32s(columns),
                        );
                    }
                }
            }
        }
    }
    // 4-byte dtypes first: each then starts at a multiple of 4 (the header is padded to 8).
    tensors.sort_by_key(|t| t.1.width() == 1);
    let mut header = serde_json::Map::new();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_owned(), FORMAT.to_owned());
    meta.insert("format_version".to_owned(), VERSION.to_string());
    meta.insert("embedding_table".to_owned(), options.table.to_string());
    meta.insert("outlier_channels".to_owned(), options.outliers.to_string());
    for (key, value) in identity(config) {
        meta.insert(key.to_owned(), value.to_string());
    }
    meta.insert(
        "writer".to_owned(),
        format!("ruri-native {}", env!("CARGO_PKG_VERSION")),
    );
    header.insert("__metadata__".into(), serde_json::json!(meta));
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in &tensors {
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": dtype.name(),
                "shape": shape,
                "data_offsets": [offset, offset + bytes.len()],
            }),
        );
        offset += bytes.len();
    }
    let mut json = serde_json::to_vec(&header).expect("a map of strings and numbers");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut file = Vec::with_capacity(8 + json.len() + offset);
    file.extend_from_slice(&(json.len() as u64).to_le_bytes());
    file.extend_from_slice(&json);
    for (_, _, _, bytes) in &tensors {
        file.extend_from_slice(bytes);
    }
    file
}

/// The f32 table's entry, for [`crate::weights::Safetensors::from_checked`].
pub(crate) fn table_entry(want: &Want) -> HashMap<String, Entry> {
    HashMap::from([(
        EMBEDDINGS.to_owned(),
        Entry {
            dtype: Dtype::F32,
            shape: want.shape.clone(),
            start: want.start,
        },
    )])
}

/// The model of the int8 file `source` (its header `header`, `plan` made from it): every
/// tensor read in the file's order (the table in runs of rows), but the f32 table, which
/// is read a row per token from the file as a checkpoint's is. With `threads` > 1 the layers
/// are split into that many runs, each read and packed on a thread of its own (as
/// [`crate::model::Model::load`] does).
pub(crate) fn load(
    path: PathBuf,
    source: Source,
    plan: &Plan,
    config: &ModelConfig,
    options: LoadOptions,
    threads: usize,
) -> Result<crate::model::Model> {
    let layers = config.num_hidden_layers;
    let runs = threads.clamp(1, layers.max(1));
    let layer_of = |name: &str| {
        name.strip_prefix("layers.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(n, _)| n.parse::<usize>().ok())
    };
    // Run `r` reads the tensors of its layers; run 0 the others too (norms, table).
    let read_run = |r: usize| -> Result<(Int8Reader, Option<HashMap<String, Entry>>)> {
        let range = (r * layers / runs)..((r + 1) * layers / runs);
        let mut reader = Int8Reader::new(path.clone(), plan, config, options);
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let mut buf = Vec::new();
        let mut table_f32 = None;
        for want in &plan.wants {
            let mine = layer_of(&want.name).map_or(r == 0, |n| range.contains(&n));
            if !mine {
                continue;
            }
            match want.role {
                Role::TableF32 => table_f32 = Some(table_entry(want)),
                Role::TableI8 => {
                    const ROWS: u64 = 256;
                    let row = config.hidden_size as u64;
                    let mut at = want.start;
                    while at < want.end {
                        let n = (ROWS * row).min(want.end - at);
                        buf.resize(n as usize, 0);
                        source.read_at(at, &mut buf).map_err(io)?;
                        reader.tensor(want, &buf)?;
                        at += n;
                    }
                }
                _ => {
                    // The plan's ranges were checked to fit the file (and usize).
                    buf.resize((want.end - want.start) as usize, 0);
                    source.read_at(want.start, &mut buf).map_err(io)?;
                    reader.tensor(want, &buf)?;
                }
            }
        }
        Ok((reader, table_f32))
    };
    let (reader, table_f32) = std::thread::scope(|scope| -> Result<_> {
        let read_run = &read_run;
        let others: Vec<_> = (1..runs)
            .map(|r| scope.spawn(move || read_run(r)))
            .collect();
        let (mut reader, table_f32) = read_run(0)?;
        for other in others {
            let (other, _) = other
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            reader.absorb(other);
        }
        Ok((reader, table_f32))
    })?;
    let source = table_f32.map(|entries| Safetensors::from_checked(path, source, entries));
    reader.finish(source)
}
