//! The corpus readers: plain text (a text a line), JSON lines, CSV/TSV with a header, Parquet.
//! Each yields [`Record`]s in input order, a bounded number at a time; what is wrong with one
//! record is that record's error (`--on-error` decides), what makes the rest unreadable is the
//! reader's.

use std::fmt;
use std::fs::File;
use std::io::BufRead;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, cast::AsArray};
use arrow_schema::DataType;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

/// `--input-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InputFormat {
    /// A text a line (UTF-8; `\n` or `\r\n` ends a line).
    Txt,
    /// A JSON object a line, the text in `--text-field`.
    Jsonl,
    /// Comma-separated, with a header row naming the columns.
    Csv,
    /// Tab-separated, with a header row naming the columns.
    Tsv,
    /// Apache Parquet; `--text-field` names a string column.
    Parquet,
}

impl InputFormat {
    /// The format an input file's extension names.
    pub fn from_extension(ext: &str) -> Option<Self> {
        Some(match ext.to_ascii_lowercase().as_str() {
            "txt" | "text" => InputFormat::Txt,
            "jsonl" | "ndjson" => InputFormat::Jsonl,
            "csv" => InputFormat::Csv,
            "tsv" | "tab" => InputFormat::Tsv,
            "parquet" | "pq" => InputFormat::Parquet,
            _ => return None,
        })
    }
}

/// A record's id (`--id-field`), as the input typed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Id {
    /// An integer id.
    Int(i64),
    /// A string id.
    Str(String),
}

/// Where a record is, for messages: a 1-based line of a text format (as editors number
/// them), or a 0-based row of a Parquet file (as pandas and pyarrow number them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Line `n` (1-based).
    Line(u64),
    /// Row `n` (0-based).
    Row(u64),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Line(n) => write!(f, "line {n}"),
            Location::Row(n) => write!(f, "row {n}"),
        }
    }
}

/// One record of the input: its text and id, or why it has none.
#[derive(Debug)]
pub struct Record {
    /// Its 0-based index among the input's records.
    pub index: u64,
    /// Where it is.
    pub location: Location,
    /// The text and the id (`None` without `--id-field`), or what is wrong with the record.
    pub content: Result<(String, Option<Id>), String>,
}

/// What a reader needs to know.
#[derive(Debug, Clone)]
pub struct Fields {
    /// The text's field or column.
    pub text: String,
    /// The id's field or column, if any.
    pub id: Option<String>,
}

/// A reader of records.
pub trait Source {
    /// Appends up to `max` records to `out` (none at the end of the input).
    fn read(&mut self, max: usize, out: &mut Vec<Record>) -> Result<(), String>;
    /// How far the reader is: bytes read of a text format, rows of a Parquet file.
    fn position(&self) -> u64;
    /// The whole input in the same unit, when known (a file, not a pipe).
    fn total(&self) -> Option<u64>;
}

/// Opens `format` on `reader` (`file` when the input is a file: Parquet needs one), skipping
/// the first `skip` records (`--resume`).
pub fn open(
    format: InputFormat,
    reader: Box<dyn BufRead + Send>,
    file: Option<File>,
    total_bytes: Option<u64>,
    fields: &Fields,
    batch: usize,
    skip: u64,
) -> Result<Box<dyn Source + Send>, String> {
    let mut source: Box<dyn Source + Send> = match format {
        InputFormat::Txt => Box::new(Lines::new(reader, total_bytes, None)),
        InputFormat::Jsonl => Box::new(Lines::new(reader, total_bytes, Some(fields.clone()))),
        InputFormat::Csv => Box::new(Delimited::new(reader, b',', total_bytes, fields)?),
        InputFormat::Tsv => Box::new(Delimited::new(reader, b'\t', total_bytes, fields)?),
        InputFormat::Parquet => {
            let file = file.ok_or("Parquet input needs a file (--input FILE), not a pipe")?;
            return Ok(Box::new(Parquet::new(file, fields, batch, skip)?));
        }
    };
    // The text formats skip by reading: records have no fixed size.
    let mut skipped = Vec::new();
    let mut left = skip;
    while left > 0 {
        skipped.clear();
        let step = left.min(batch as u64) as usize;
        source.read(step, &mut skipped)?;
        if skipped.len() < step {
            return Err(format!(
                "the input has fewer records than the {skip} the partial output holds: \
                 it changed since the interrupted run"
            ));
        }
        left -= step as u64;
    }
    Ok(source)
}

/// Plain text and JSON lines.
struct Lines {
    reader: Box<dyn BufRead + Send>,
    line: u64,
    bytes: u64,
    total: Option<u64>,
    json: Option<Fields>,
    /// Whether ids so far were integers (JSON ids must be all one kind).
    int_ids: Option<bool>,
    buf: Vec<u8>,
}

impl Lines {
    fn new(reader: Box<dyn BufRead + Send>, total: Option<u64>, json: Option<Fields>) -> Self {
        Lines {
            reader,
            line: 0,
            bytes: 0,
            total,
            json,
            int_ids: None,
            buf: Vec::new(),
        }
    }

    fn parse(&mut self, line: Vec<u8>) -> Result<(String, Option<Id>), String> {
        let text = String::from_utf8(line).map_err(|e| {
            format!(
                "is not valid UTF-8 (at byte {} of the line)",
                e.utf8_error().valid_up_to()
            )
        })?;
        let Some(fields) = &self.json else {
            return Ok((text, None));
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("is not JSON: {e}"))?;
        let serde_json::Value::Object(mut object) = value else {
            return Err(format!("is JSON {}, not an object", kind(&value)));
        };
        let text = match object.remove(&fields.text) {
            Some(serde_json::Value::String(text)) => text,
            Some(other) => {
                return Err(format!(
                    "has \"{}\" as {}, not a string",
                    fields.text,
                    kind(&other)
                ));
            }
            None => return Err(format!("has no \"{}\" field", fields.text)),
        };
        let Some(id_field) = &fields.id else {
            return Ok((text, None));
        };
        let id = match object.remove(id_field) {
            Some(serde_json::Value::String(s)) => Id::Str(s),
            Some(serde_json::Value::Number(n)) if n.is_i64() => {
                Id::Int(n.as_i64().expect("checked: an i64"))
            }
            Some(other) => {
                return Err(format!(
                    "has \"{id_field}\" as {}, not a string or an integer (64-bit)",
                    kind(&other)
                ));
            }
            None => return Err(format!("has no \"{id_field}\" field")),
        };
        let is_int = matches!(id, Id::Int(_));
        match self.int_ids {
            Some(before) if before != is_int => Err(format!(
                "has an {} \"{id_field}\", but the earlier ids are {}: ids are all strings or \
                 all integers",
                if is_int { "integer" } else { "string" },
                if before { "integers" } else { "strings" }
            )),
            _ => {
                self.int_ids = Some(is_int);
                Ok((text, Some(id)))
            }
        }
    }
}

fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl Source for Lines {
    fn read(&mut self, max: usize, out: &mut Vec<Record>) -> Result<(), String> {
        for _ in 0..max {
            self.buf.clear();
            let n = self
                .reader
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| format!("reading line {}: {e}", self.line + 1))?;
            if n == 0 {
                break;
            }
            self.bytes += n as u64;
            self.line += 1;
            // As `BufRead::lines`: the line ends at `\n` or `\r\n`, which are not part of it.
            if self.buf.last() == Some(&b'\n') {
                self.buf.pop();
                if self.buf.last() == Some(&b'\r') {
                    self.buf.pop();
                }
            }
            let line = std::mem::take(&mut self.buf);
            let content = self.parse(line);
            out.push(Record {
                index: self.line - 1,
                location: Location::Line(self.line),
                content,
            });
        }
        Ok(())
    }

    fn position(&self) -> u64 {
        self.bytes
    }

    fn total(&self) -> Option<u64> {
        self.total
    }
}

/// CSV and TSV, with a header row (quoted fields as the `csv` crate reads them, RFC 4180).
struct Delimited {
    reader: csv::Reader<Box<dyn BufRead + Send>>,
    text: usize,
    id: Option<usize>,
    record: csv::ByteRecord,
    /// Records read so far.
    index: u64,
    total: Option<u64>,
}

impl Delimited {
    fn new(
        reader: Box<dyn BufRead + Send>,
        delimiter: u8,
        total: Option<u64>,
        fields: &Fields,
    ) -> Result<Self, String> {
        let mut reader = csv::ReaderBuilder::new()
            .delimiter(delimiter)
            .flexible(true)
            .from_reader(reader);
        let header = reader
            .byte_headers()
            .map_err(|e| format!("reading the header row: {e}"))?
            .clone();
        let names: Vec<String> = header
            .iter()
            .map(|h| String::from_utf8_lossy(h).into_owned())
            .collect();
        let find = |name: &str, flag: &str| {
            names.iter().position(|n| n == name).ok_or_else(|| {
                format!(
                    "the header row has no column \"{name}\" (its columns: {}); name the column \
                     with {flag}",
                    names.join(", ")
                )
            })
        };
        let text = find(&fields.text, "--text-field")?;
        let id = fields
            .id
            .as_deref()
            .map(|name| find(name, "--id-field"))
            .transpose()?;
        Ok(Delimited {
            reader,
            text,
            id,
            record: csv::ByteRecord::new(),
            index: 0,
            total,
        })
    }

    fn field(&self, index: usize, name: &str) -> Result<String, String> {
        let bytes = self.record.get(index).ok_or_else(|| {
            format!(
                "has {} fields, and the column \"{name}\" is field {}",
                self.record.len(),
                index + 1
            )
        })?;
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            format!(
                "has \"{name}\" that is not valid UTF-8 (at byte {})",
                e.utf8_error().valid_up_to()
            )
        })
    }
}

impl Source for Delimited {
    fn read(&mut self, max: usize, out: &mut Vec<Record>) -> Result<(), String> {
        for _ in 0..max {
            let more = self
                .reader
                .read_byte_record(&mut self.record)
                .map_err(|e| {
                    let line = e.position().map_or(0, |p| p.line());
                    format!("reading line {line}: {e}")
                })?;
            if !more {
                break;
            }
            let line = self.record.position().map_or(0, |p| p.line());
            let content = self.field(self.text, "text").and_then(|text| {
                let id = self
                    .id
                    .map(|index| self.field(index, "id").map(Id::Str))
                    .transpose()?;
                Ok((text, id))
            });
            out.push(Record {
                index: self.index,
                location: Location::Line(line),
                content,
            });
            self.index += 1;
        }
        Ok(())
    }

    fn position(&self) -> u64 {
        self.reader.position().byte()
    }

    fn total(&self) -> Option<u64> {
        self.total
    }
}

/// Whether a column of this type holds strings.
fn is_string(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// The type of a column's values: a dictionary's value type (a categorical column, as
/// pandas and Arrow writers store it), else the type itself.
fn value_type(data_type: &DataType) -> &DataType {
    match data_type {
        DataType::Dictionary(_, values) => values,
        other => other,
    }
}

/// One column of a batch; a dictionary-encoded column's keys are resolved once a batch.
struct BatchColumn<'a> {
    rows: &'a ArrayRef,
    /// A dictionary's values and each row's index into them.
    dictionary: Option<(&'a ArrayRef, Vec<usize>)>,
}

impl<'a> BatchColumn<'a> {
    fn new(rows: &'a ArrayRef) -> Self {
        let dictionary = rows
            .as_any_dictionary_opt()
            .map(|d| (d.values(), d.normalized_keys()));
        BatchColumn { rows, dictionary }
    }

    /// The array and index that hold row `i`'s value, or `None` for a null (in the rows or
    /// in the dictionary's values).
    fn row(&self, i: usize) -> Option<(&'a ArrayRef, usize)> {
        if self.rows.is_null(i) {
            return None;
        }
        let (array, at) = match &self.dictionary {
            Some((values, keys)) => (*values, keys[i]),
            None => (self.rows, i),
        };
        (!array.is_null(at)).then_some((array, at))
    }
}

/// A Parquet file, read a batch of rows at a time (only the text and id columns).
struct Parquet {
    reader: ParquetRecordBatchReader,
    fields: Fields,
    batch: Option<RecordBatch>,
    /// The next row of `batch` to read.
    offset: usize,
    /// The file's row of `batch`'s first row.
    batch_start: u64,
    next_row: u64,
    total: u64,
}

impl Parquet {
    fn new(file: File, fields: &Fields, batch: usize, skip: u64) -> Result<Self, String> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| format!("not a readable Parquet file: {e}"))?;
        let total = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
        if skip > total {
            return Err(format!(
                "the input has {total} rows, fewer than the {skip} the partial output holds: it \
                 changed since the interrupted run"
            ));
        }
        let schema = Arc::clone(builder.schema());
        let column = |name: &str, flag: &str| {
            schema.index_of(name).map_err(|_| {
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                format!(
                    "the Parquet file has no column \"{name}\" (its columns: {}); name the column \
                     with {flag}",
                    names.join(", ")
                )
            })
        };
        let text = column(&fields.text, "--text-field")?;
        let text_type = schema.field(text).data_type();
        if !is_string(value_type(text_type)) {
            return Err(format!(
                "the Parquet column \"{}\" holds {text_type}, not strings",
                fields.text
            ));
        }
        let mut roots = vec![text];
        if let Some(id_name) = &fields.id {
            let id = column(id_name, "--id-field")?;
            let id_type = schema.field(id).data_type();
            if !(value_type(id_type).is_integer() || is_string(value_type(id_type))) {
                return Err(format!(
                    "the Parquet column \"{id_name}\" holds {id_type}, not integers or strings"
                ));
            }
            roots.push(id);
        }
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(batch.max(1))
            .with_offset(usize::try_from(skip).map_err(|_| "too many rows to skip")?)
            .build()
            .map_err(|e| format!("reading the Parquet file: {e}"))?;
        Ok(Parquet {
            reader,
            fields: fields.clone(),
            batch: None,
            offset: 0,
            batch_start: skip,
            next_row: skip,
            total,
        })
    }

    /// Row `i` of `column` (named `name`, for messages): a string, or an integer id.
    fn value(column: &BatchColumn, name: &str, i: usize, id: bool) -> Result<Option<Id>, String> {
        let Some((column, i)) = column.row(i) else {
            return Err(format!("has a null \"{name}\""));
        };
        let string = match column.data_type() {
            DataType::Utf8 => Some(column.as_string::<i32>().value(i).to_owned()),
            DataType::LargeUtf8 => Some(column.as_string::<i64>().value(i).to_owned()),
            DataType::Utf8View => Some(column.as_string_view().value(i).to_owned()),
            _ => None,
        };
        if let Some(s) = string {
            return Ok(Some(Id::Str(s)));
        }
        debug_assert!(id, "the text column's type was checked");
        use arrow_array::types::*;
        let int = match column.data_type() {
            DataType::Int8 => Some(i64::from(column.as_primitive::<Int8Type>().value(i))),
            DataType::Int16 => Some(i64::from(column.as_primitive::<Int16Type>().value(i))),
            DataType::Int32 => Some(i64::from(column.as_primitive::<Int32Type>().value(i))),
            DataType::Int64 => Some(column.as_primitive::<Int64Type>().value(i)),
            DataType::UInt8 => Some(i64::from(column.as_primitive::<UInt8Type>().value(i))),
            DataType::UInt16 => Some(i64::from(column.as_primitive::<UInt16Type>().value(i))),
            DataType::UInt32 => Some(i64::from(column.as_primitive::<UInt32Type>().value(i))),
            DataType::UInt64 => i64::try_from(column.as_primitive::<UInt64Type>().value(i)).ok(),
            _ => None,
        };
        int.map(|v| Some(Id::Int(v)))
            .ok_or_else(|| format!("has an id \"{name}\" past the 64-bit signed integers"))
    }
}

impl Source for Parquet {
    fn read(&mut self, max: usize, out: &mut Vec<Record>) -> Result<(), String> {
        let mut taken = 0;
        while taken < max {
            let batch = match &self.batch {
                Some(batch) if self.offset < batch.num_rows() => batch.clone(),
                _ => match self.reader.next() {
                    None => break,
                    Some(Err(e)) => {
                        return Err(format!(
                            "reading the Parquet file at row {}: {e}",
                            self.next_row
                        ));
                    }
                    Some(Ok(batch)) => {
                        self.batch_start = self.next_row;
                        self.offset = 0;
                        self.batch = Some(batch.clone());
                        batch
                    }
                },
            };
            let end = batch.num_rows().min(self.offset + (max - taken));
            // The columns are looked up once a batch, not once a row.
            let column = |name: &str| {
                BatchColumn::new(
                    batch
                        .column_by_name(name)
                        .expect("the projection holds the column"),
                )
            };
            let text_column = column(&self.fields.text);
            let id_column = self.fields.id.as_deref().map(|name| (name, column(name)));
            for i in self.offset..end {
                let row = self.batch_start + i as u64;
                let text =
                    Self::value(&text_column, &self.fields.text, i, false).map(|t| match t {
                        Some(Id::Str(s)) => s,
                        _ => unreachable!("the text column holds strings"),
                    });
                let content = text.and_then(|text| {
                    let id = match &id_column {
                        Some((name, column)) => Self::value(column, name, i, true)?,
                        None => None,
                    };
                    Ok((text, id))
                });
                out.push(Record {
                    index: row,
                    location: Location::Row(row),
                    content,
                });
            }
            taken += end - self.offset;
            self.next_row += (end - self.offset) as u64;
            self.offset = end;
        }
        Ok(())
    }

    fn position(&self) -> u64 {
        self.next_row
    }

    fn total(&self) -> Option<u64> {
        Some(self.total)
    }
}

/// Reads all of a small reader (tests).
#[cfg(test)]
fn read_all(source: &mut dyn Source) -> Vec<Record> {
    let mut out = Vec::new();
    loop {
        let before = out.len();
        source.read(3, &mut out).unwrap();
        if out.len() == before {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(id: Option<&str>) -> Fields {
        Fields {
            text: "text".into(),
            id: id.map(str::to_owned),
        }
    }

    fn lines(
        format: InputFormat,
        input: &'static [u8],
        id: Option<&str>,
        skip: u64,
    ) -> Vec<Record> {
        let reader: Box<dyn BufRead + Send> = Box::new(std::io::Cursor::new(input));
        let mut source = open(format, reader, None, None, &fields(id), 2, skip).unwrap();
        read_all(source.as_mut())
    }

    fn texts(records: &[Record]) -> Vec<Result<String, String>> {
        records
            .iter()
            .map(|r| r.content.clone().map(|(t, _)| t))
            .collect()
    }

    #[test]
    fn text_lines_end_at_newlines_and_keep_everything_else() {
        let records = lines(InputFormat::Txt, b"a\r\n b \n\n\xff\nlast\r", None, 0);
        let got = texts(&records);
        assert_eq!(got[0], Ok("a".into()));
        assert_eq!(got[1], Ok(" b ".into()));
        assert_eq!(got[2], Ok(String::new()));
        assert!(got[3].as_ref().unwrap_err().contains("not valid UTF-8"));
        assert_eq!(got[4], Ok("last\r".into()));
        assert_eq!(records[4].location, Location::Line(5));
    }

    #[test]
    fn json_lines_name_what_is_wrong() {
        let input = b"{\"text\":\"a\",\"id\":1}\nnot json\n[1]\n{\"id\":2}\n{\"text\":3,\"id\":3}\n{\"text\":\"b\",\"id\":\"x\"}\n{\"text\":\"c\",\"id\":4.5}\n{\"text\":\"d\",\"id\":5}\n";
        let records = lines(InputFormat::Jsonl, input, Some("id"), 0);
        assert_eq!(records[0].content, Ok(("a".into(), Some(Id::Int(1)))));
        let err = |i: usize| records[i].content.clone().unwrap_err();
        assert!(err(1).starts_with("is not JSON"), "{}", err(1));
        assert_eq!(err(2), "is JSON an array, not an object");
        assert_eq!(err(3), "has no \"text\" field");
        assert_eq!(err(4), "has \"text\" as a number, not a string");
        assert!(err(5).contains("earlier ids are integers"), "{}", err(5));
        assert!(err(6).contains("not a string or an integer"), "{}", err(6));
        assert_eq!(records[7].content, Ok(("d".into(), Some(Id::Int(5)))));
        assert_eq!(records[7].location, Location::Line(8));
    }

    #[test]
    fn csv_and_tsv_read_quoted_fields_by_the_header() {
        let records = lines(
            InputFormat::Csv,
            b"id,text\n1,\"a, \"\"quoted\"\"\nline\"\n2\n3,\xfe\n",
            Some("id"),
            0,
        );
        assert_eq!(
            records[0].content,
            Ok(("a, \"quoted\"\nline".into(), Some(Id::Str("1".into()))))
        );
        assert_eq!(records[1].location, Location::Line(4));
        assert!(
            records[1]
                .content
                .clone()
                .unwrap_err()
                .contains("has 1 fields")
        );
        assert!(
            records[2]
                .content
                .clone()
                .unwrap_err()
                .contains("not valid UTF-8")
        );
        let records = lines(InputFormat::Tsv, b"text\tn\nx y\t1\n", None, 0);
        assert_eq!(texts(&records), [Ok("x y".to_owned())]);
        let reader: Box<dyn BufRead + Send> = Box::new(std::io::Cursor::new(&b"body\nx\n"[..]));
        let err = open(InputFormat::Csv, reader, None, None, &fields(None), 2, 0)
            .err()
            .unwrap();
        assert!(
            err.contains("no column \"text\" (its columns: body)"),
            "{err}"
        );
    }

    #[test]
    fn skipping_continues_at_the_same_record() {
        let records = lines(InputFormat::Txt, b"a\nb\nc\nd\ne\n", None, 3);
        assert_eq!(texts(&records), [Ok("d".to_owned()), Ok("e".to_owned())]);
        assert_eq!(records[0].location, Location::Line(4));
        let reader: Box<dyn BufRead + Send> = Box::new(std::io::Cursor::new(&b"a\n"[..]));
        assert!(
            open(InputFormat::Txt, reader, None, None, &fields(None), 2, 2)
                .err()
                .unwrap()
                .contains("fewer records")
        );
    }

    #[test]
    fn a_byte_count_for_progress() {
        let reader: Box<dyn BufRead + Send> = Box::new(std::io::Cursor::new(&b"ab\ncd\n"[..]));
        let mut source =
            open(InputFormat::Txt, reader, None, Some(6), &fields(None), 8, 0).unwrap();
        let mut out = Vec::new();
        source.read(1, &mut out).unwrap();
        assert_eq!((source.position(), source.total()), (3, Some(6)));
    }
}
