//! The output encoders: JSON lines, `.npy`, Parquet. Each takes the embedded rows a chunk at
//! a time, as float32 vectors, and quantizes them first when `--quantize` asks.

use std::io::Write;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, FixedSizeListBuilder, Int32Builder, Int64Builder, PrimitiveBuilder,
    StringBuilder,
};
use arrow_array::types::{Float32Type, Int8Type, UInt8Type};
use arrow_array::{ArrayRef, ArrowPrimitiveType, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use ruri::{Embeddings, Quantization, QuantizationRanges};

use crate::input::Id;
use crate::npy;

/// `--output-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// A JSON object a line: `id` (with `--id-field`), `embedding`, `tokens`, `truncated`.
    Jsonl,
    /// A NumPy array, `rows × dim` (float32, or the quantized type); vectors only.
    Npy,
    /// Apache Parquet (Snappy): `row`, `id` (with `--id-field`), `tokens`, `truncated`,
    /// `embedding` as a fixed-size list.
    Parquet,
}

impl OutputFormat {
    /// The format an output file's extension names.
    pub fn from_extension(ext: &str) -> Option<Self> {
        Some(match ext.to_ascii_lowercase().as_str() {
            "jsonl" | "ndjson" => OutputFormat::Jsonl,
            "npy" => OutputFormat::Npy,
            "parquet" | "pq" => OutputFormat::Parquet,
            _ => return None,
        })
    }
}

/// What is known of each embedded row besides its vector.
#[derive(Debug, Clone, PartialEq)]
pub struct RowMeta {
    /// The input record's 0-based index (the Parquet output's `row`).
    pub row: u64,
    /// Its id, with `--id-field`.
    pub id: Option<Id>,
    /// Tokens fed to the model.
    pub tokens: u32,
    /// Whether the text was cut to the model's maximum length.
    pub truncated: bool,
}

/// How vectors are stored.
#[derive(Debug, Clone)]
pub struct Storage {
    /// The embedding width.
    pub dim: usize,
    /// `--quantize`, with the ranges int8 and uint8 use (a calibration file's, or the
    /// corpus's own once it is all embedded).
    pub quantize: Option<(Quantization, Option<QuantizationRanges>)>,
}

impl Storage {
    fn width(&self) -> usize {
        match &self.quantize {
            Some((q, _)) => q.bytes_per_vector(self.dim),
            None => self.dim,
        }
    }
}

/// The stored values of a chunk: the vectors themselves, or their quantized bytes.
enum Values<'a> {
    F32(&'a [f32]),
    I8(Vec<i8>),
    U8(Vec<u8>),
}

fn values<'a>(
    storage: &Storage,
    meta: &[RowMeta],
    vectors: &'a [f32],
) -> Result<Values<'a>, String> {
    let Some((precision, ranges)) = &storage.quantize else {
        return Ok(Values::F32(vectors));
    };
    let embeddings = Embeddings::from_parts(
        vectors.to_vec(),
        storage.dim,
        meta.iter().map(|m| m.tokens as usize).collect(),
        meta.iter().map(|m| m.truncated).collect(),
    )
    .map_err(|e| ruri::error_chain(&e).to_string())?;
    let quantized = embeddings
        .quantize(*precision, ranges.as_ref())
        .map_err(|e| format!("--quantize {precision}: {}", ruri::error_chain(&e)))?;
    Ok(if precision.is_signed() {
        Values::I8(quantized.to_i8().expect("a signed precision"))
    } else {
        Values::U8(quantized.into_bytes())
    })
}

/// An output being written.
pub enum Encoder<W: Write + Send> {
    /// JSON lines.
    Jsonl(W),
    /// `.npy`: the header is written at the start (the row count is known).
    Npy(W),
    /// Parquet: made at the first chunk (the id column takes the first id's type).
    Parquet {
        /// The writer, once made.
        writer: Option<Box<ArrowWriter<W>>>,
        /// Where it goes until then.
        out: Option<W>,
        /// Rows per row group.
        row_group: usize,
    },
}

impl<W: Write + Send> Encoder<W> {
    /// Starts `format` on `out`; `rows` is the row count, which `.npy` needs up front.
    pub fn new(
        format: OutputFormat,
        mut out: W,
        storage: &Storage,
        rows: Option<u64>,
    ) -> Result<Self, String> {
        Ok(match format {
            OutputFormat::Jsonl => Encoder::Jsonl(out),
            OutputFormat::Npy => {
                let rows = rows.expect("the .npy output is assembled from the spool");
                let dtype = match &storage.quantize {
                    None => npy::Dtype::F32,
                    Some((q, _)) if q.is_signed() => npy::Dtype::I8,
                    Some(_) => npy::Dtype::U8,
                };
                npy::write_header(&mut out, dtype, rows, storage.width()).map_err(write_error)?;
                Encoder::Npy(out)
            }
            OutputFormat::Parquet => Encoder::Parquet {
                writer: None,
                out: Some(out),
                // Row groups of ≈ 64 MiB of vectors (at least 1,024 rows): bounded memory,
                // and a footer that stays small for millions of rows.
                row_group: ((64 << 20) / (storage.width() * 4).max(1)).max(1024),
            },
        })
    }

    /// Writes one chunk's rows: `meta[i]` with `vectors[i * dim..]`.
    pub fn write(
        &mut self,
        storage: &Storage,
        meta: &[RowMeta],
        vectors: &[f32],
    ) -> Result<(), String> {
        if meta.is_empty() {
            return Ok(());
        }
        let values = values(storage, meta, vectors)?;
        let width = storage.width();
        match self {
            Encoder::Jsonl(out) => {
                for (i, m) in meta.iter().enumerate() {
                    let row = i * width..(i + 1) * width;
                    let written = match &values {
                        Values::F32(v) => json_line(out, m, &v[row]),
                        Values::I8(v) => json_line(out, m, &v[row]),
                        Values::U8(v) => json_line(out, m, &v[row]),
                    };
                    written.map_err(write_error)?;
                }
                Ok(())
            }
            Encoder::Npy(out) => {
                let mut bytes = Vec::with_capacity(meta.len() * width * 4);
                match &values {
                    Values::F32(v) => v
                        .iter()
                        .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
                    Values::I8(v) => bytes.extend(v.iter().map(|&x| x as u8)),
                    Values::U8(v) => bytes.extend_from_slice(v),
                }
                out.write_all(&bytes).map_err(write_error)
            }
            Encoder::Parquet {
                writer,
                out,
                row_group,
            } => {
                let batch = record_batch(meta, &values, width)?;
                if writer.is_none() {
                    let props = WriterProperties::builder()
                        .set_compression(Compression::SNAPPY)
                        .set_max_row_group_row_count(Some(*row_group))
                        .build();
                    let sink = out.take().expect("the writer is made once");
                    *writer = Some(Box::new(
                        ArrowWriter::try_new(sink, batch.schema(), Some(props))
                            .map_err(|e| format!("writing Parquet: {e}"))?,
                    ));
                }
                let writer = writer.as_mut().expect("made above");
                writer
                    .write(&batch)
                    .map_err(|e| format!("writing Parquet: {e}"))
            }
        }
    }

    /// Ends the output (Parquet's footer) and returns the writer, flushed.
    pub fn finish(self, storage: &Storage, with_ids: bool) -> Result<W, String> {
        let mut out = match self {
            Encoder::Jsonl(out) | Encoder::Npy(out) => out,
            Encoder::Parquet { writer, out, .. } => match writer {
                Some(writer) => writer
                    .into_inner()
                    .map_err(|e| format!("writing Parquet: {e}"))?,
                None => {
                    // No row at all: a file with the schema and no rows.
                    let out = out.expect("no writer was made");
                    let empty = RecordBatch::new_empty(Arc::new(schema(
                        with_ids.then_some(false),
                        storage_type(storage),
                        storage.width(),
                    )));
                    let mut writer = ArrowWriter::try_new(out, empty.schema(), None)
                        .map_err(|e| format!("writing Parquet: {e}"))?;
                    writer
                        .write(&empty)
                        .map_err(|e| format!("writing Parquet: {e}"))?;
                    writer
                        .into_inner()
                        .map_err(|e| format!("writing Parquet: {e}"))?
                }
            },
        };
        out.flush().map_err(write_error)?;
        Ok(out)
    }
}

fn write_error(e: std::io::Error) -> String {
    format!("writing the output: {e}")
}

#[derive(serde::Serialize)]
struct JsonRow<'a, T> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<JsonId<'a>>,
    embedding: &'a [T],
    tokens: u32,
    truncated: bool,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum JsonId<'a> {
    Int(i64),
    Str(&'a str),
}

fn json_line<T: serde::Serialize>(
    out: &mut impl Write,
    meta: &RowMeta,
    embedding: &[T],
) -> std::io::Result<()> {
    let row = JsonRow {
        id: meta.id.as_ref().map(|id| match id {
            Id::Int(n) => JsonId::Int(*n),
            Id::Str(s) => JsonId::Str(s),
        }),
        embedding,
        tokens: meta.tokens,
        truncated: meta.truncated,
    };
    serde_json::to_writer(&mut *out, &row)?;
    out.write_all(b"\n")
}

fn storage_type(storage: &Storage) -> DataType {
    match &storage.quantize {
        None => DataType::Float32,
        Some((q, _)) if q.is_signed() => DataType::Int8,
        Some(_) => DataType::UInt8,
    }
}

/// The Parquet schema: `row`, `id` (`Some(true)`: integers, `Some(false)`: strings),
/// `tokens`, `truncated`, `embedding`.
fn schema(id: Option<bool>, item: DataType, width: usize) -> Schema {
    let mut fields = vec![Field::new("row", DataType::Int64, false)];
    if let Some(int) = id {
        let kind = if int { DataType::Int64 } else { DataType::Utf8 };
        fields.push(Field::new("id", kind, false));
    }
    fields.push(Field::new("tokens", DataType::Int32, false));
    fields.push(Field::new("truncated", DataType::Boolean, false));
    fields.push(Field::new(
        "embedding",
        DataType::FixedSizeList(Arc::new(Field::new("item", item, false)), width as i32),
        false,
    ));
    Schema::new(fields)
}

fn record_batch(meta: &[RowMeta], values: &Values, width: usize) -> Result<RecordBatch, String> {
    let mut columns: Vec<ArrayRef> = Vec::new();
    let mut rows = Int64Builder::with_capacity(meta.len());
    meta.iter()
        .for_each(|m| rows.append_value(i64::try_from(m.row).unwrap_or(i64::MAX)));
    columns.push(Arc::new(rows.finish()));
    let id = match meta[0].id {
        None => None,
        Some(Id::Int(_)) => Some(true),
        Some(Id::Str(_)) => Some(false),
    };
    match id {
        Some(true) => {
            let mut ids = Int64Builder::with_capacity(meta.len());
            for m in meta {
                match &m.id {
                    Some(Id::Int(n)) => ids.append_value(*n),
                    _ => return Err("ids are all strings or all integers".into()),
                }
            }
            columns.push(Arc::new(ids.finish()));
        }
        Some(false) => {
            let mut ids = StringBuilder::new();
            for m in meta {
                match &m.id {
                    Some(Id::Str(s)) => ids.append_value(s),
                    _ => return Err("ids are all strings or all integers".into()),
                }
            }
            columns.push(Arc::new(ids.finish()));
        }
        None => {}
    }
    let mut tokens = Int32Builder::with_capacity(meta.len());
    meta.iter()
        .for_each(|m| tokens.append_value(i32::try_from(m.tokens).unwrap_or(i32::MAX)));
    columns.push(Arc::new(tokens.finish()));
    let mut truncated = BooleanBuilder::with_capacity(meta.len());
    meta.iter()
        .for_each(|m| truncated.append_value(m.truncated));
    columns.push(Arc::new(truncated.finish()));
    let (item, list): (DataType, ArrayRef) = match values {
        Values::F32(v) => (DataType::Float32, fixed_size_list::<Float32Type>(v, width)),
        Values::I8(v) => (DataType::Int8, fixed_size_list::<Int8Type>(v, width)),
        Values::U8(v) => (DataType::UInt8, fixed_size_list::<UInt8Type>(v, width)),
    };
    columns.push(list);
    RecordBatch::try_new(Arc::new(schema(id, item, width)), columns)
        .map_err(|e| format!("writing Parquet: {e}"))
}

/// `values` (rows × `width`) as a list column of `width` non-null items a row.
fn fixed_size_list<T: ArrowPrimitiveType>(values: &[T::Native], width: usize) -> ArrayRef {
    let items = PrimitiveBuilder::<T>::with_capacity(values.len());
    let mut list = FixedSizeListBuilder::new(items, width as i32).with_field(Field::new(
        "item",
        T::DATA_TYPE,
        false,
    ));
    for row in values.chunks_exact(width) {
        list.values().append_slice(row);
        list.append(true);
    }
    Arc::new(list.finish())
}
