//! `model.safetensors` received as a stream ([`NativeBackend::loader`]): the header is
//! parsed with the checks of [`crate::weights`], then each tensor the model reads is
//! buffered alone (the embedding table a row at a time), handed to the [`Assembler`] as
//! soon as its bytes are in, and dropped. The file is never held whole. ruri's int8 file
//! (told apart by its header's metadata) is streamed alike, its tensors handed to an
//! [`Int8Reader`].

use std::path::{Path, PathBuf};

use ruri_core::{Error, ModelConfig, Result};

use crate::model::{Assembler, EMBEDDINGS, LoadOptions};
use crate::prequant::{self, Int8Reader, Plan, Role, Want};
use crate::weights::{self, Dtype, Entry, Header};
use crate::{EmbeddingTable, NativeBackend, Precision};

/// How a tensor's bytes are decoded and to whom they go.
#[derive(Debug)]
enum Kind {
    /// A checkpoint's float tensor, to the [`Assembler`].
    Checkpoint(Dtype),
    /// A tensor of ruri's int8 file, to the [`Int8Reader`].
    Int8(Box<Want>),
}

/// Who prepares the tensors.
#[derive(Debug)]
enum Sink {
    Checkpoint {
        assembler: Box<Assembler>,
        /// One tensor in f32 while it is prepared.
        scratch: Vec<f32>,
    },
    Int8(Box<Int8Reader>),
}

/// A tensor the model reads, and its bytes received so far.
#[derive(Debug)]
struct Pending {
    /// Without the checkpoint's prefix.
    name: String,
    kind: Kind,
    /// Absolute byte range in the file.
    start: u64,
    end: u64,
    /// Bytes handed on together: the whole tensor, or one row of the embedding table.
    unit: usize,
    buf: Vec<u8>,
    /// Bytes received (handed on or in `buf`).
    received: u64,
}

impl Pending {
    fn done(&self) -> bool {
        self.received == self.end - self.start
    }
}

#[derive(Debug)]
enum State {
    /// The 8-byte length and the JSON header, as received.
    Header(Vec<u8>),
    Data {
        header: Vec<u8>,
        data_start: u64,
        /// Sorted by `start`; `first`: the first not done.
        pending: Vec<Pending>,
        first: usize,
        sink: Sink,
        /// ruri's int8 file: its options resolved against the builder's.
        int8: bool,
    },
    /// An earlier [`Loader::push`] failed.
    Failed,
}

/// Prepares a [`NativeBackend`] from the bytes of `model.safetensors` fed in order
/// ([`NativeBackend::loader`]).
#[derive(Debug)]
pub struct Loader {
    config: ModelConfig,
    options: LoadOptions,
    threads: usize,
    precision: Precision,
    /// What the builder set itself (an int8 file's own options apply where it did not).
    table: Option<EmbeddingTable>,
    outliers: Option<bool>,
    /// Bytes received so far.
    received: u64,
    state: State,
}

const LABEL: &str = "model.safetensors";

fn invalid(reason: String) -> Error {
    Error::InvalidConfig {
        path: PathBuf::from(LABEL),
        reason,
    }
}

fn too_large(name: &str, bytes: u64) -> Error {
    invalid(format!(
        "the tensor {name} ({bytes} bytes) does not fit in memory"
    ))
}

impl Loader {
    pub(crate) fn new(
        config: ModelConfig,
        options: LoadOptions,
        threads: usize,
        precision: Precision,
        table: Option<EmbeddingTable>,
        outliers: Option<bool>,
    ) -> Self {
        Self {
            config,
            options,
            threads,
            precision,
            table,
            outliers,
            received: 0,
            state: State::Header(Vec::new()),
        }
    }

    /// The next bytes of the file. An error (a broken header, a tensor of the wrong
    /// shape) is the one [`NativeBackend::from_bytes`] gives; the loader refuses
    /// everything after it.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        let result = self.push_inner(chunk);
        if result.is_err() {
            self.state = State::Failed;
        }
        result
    }

    fn push_inner(&mut self, mut chunk: &[u8]) -> Result<()> {
        while let State::Header(buf) = &mut self.state {
            let need = match buf.get(..8) {
                Some(len) => {
                    let header_len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
                    // Checked against the file's length in `finish`, once it is known.
                    if header_len > weights::MAX_HEADER {
                        return Err(invalid(format!(
                            "a safetensors header of {header_len} bytes (at most {})",
                            weights::MAX_HEADER
                        )));
                    }
                    8 + header_len as usize
                }
                None => 8,
            };
            let take = (need - buf.len()).min(chunk.len());
            buf.extend_from_slice(&chunk[..take]);
            self.received += take as u64;
            chunk = &chunk[take..];
            if buf.len() < need {
                return Ok(());
            }
            if need == 8 && buf[..8] != [0; 8] {
                // The length is in: now the header itself.
                continue;
            }
            let header = std::mem::take(buf);
            self.state = self.start_data(header)?;
        }
        match &mut self.state {
            State::Header(_) => {
                debug_assert!(chunk.is_empty());
                Ok(())
            }
            State::Failed => Err(Error::InvalidOption {
                name: "weights",
                value: "a chunk".into(),
                reason: "the loader failed on an earlier chunk",
            }),
            State::Data {
                pending,
                first,
                sink,
                ..
            } => {
                let at = self.received;
                self.received += chunk.len() as u64;
                feed(pending, first, sink, at, chunk)
            }
        }
    }

    /// The header is in: the tensors to expect.
    fn start_data(&self, header: Vec<u8>) -> Result<State> {
        let data_start = header.len() as u64;
        let path = Path::new(LABEL);
        // Offsets are checked against the file's length in `finish`, once it is known.
        let parsed = Header {
            json: header[8..].to_vec(),
            data_start,
            file_len: u64::MAX,
        };
        if prequant::is_int8_file(path, &parsed)? {
            let path = Path::new(prequant::INT8_FILE);
            let file = prequant::file_options(path, &parsed, &self.config)?;
            let options = file.resolve(path, self.options, self.table, self.outliers)?;
            let plan = Plan::new(path, &parsed, &self.config, file)?;
            let row = self.config.hidden_size;
            let mut reader = Int8Reader::new(path.into(), &plan, &self.config, options);
            let mut pending = Vec::with_capacity(plan.wants.len());
            for want in &plan.wants {
                let bytes = want.end - want.start;
                if bytes == 0 {
                    // No bytes will come for it (a layer without outlier channels).
                    reader.tensor(want, &[])?;
                    continue;
                }
                let unit = match want.role {
                    Role::TableF32 | Role::TableI8 => Ok(row * want.dtype.width()),
                    _ => usize::try_from(bytes),
                }
                .map_err(|_| too_large(&want.name, bytes))?;
                pending.push(Pending {
                    name: want.name.clone(),
                    kind: Kind::Int8(Box::new(want.clone())),
                    start: want.start,
                    end: want.end,
                    unit,
                    buf: Vec::new(),
                    received: 0,
                });
            }
            return Ok(State::Data {
                header,
                data_start,
                pending,
                first: 0,
                sink: Sink::Int8(Box::new(reader)),
                int8: true,
            });
        }
        // Offsets are checked against the file's length in `finish`, once it is known.
        let (entries, prefix) = weights::parse_header_for(
            Path::new(LABEL),
            &header[8..],
            data_start,
            u64::MAX,
            &self.config,
        )?;
        let mut pending = Vec::new();
        for (name, _) in self.config.checkpoint_tensors() {
            let Entry {
                dtype,
                shape,
                start,
            } = entries
                .get(&format!("{prefix}{name}"))
                .cloned()
                .expect("parse_header_for checked every tensor is present");
            let width = dtype.width() as u64;
            // The header's sizes were checked (ruri-core's `safetensors::parse_header`, which
            // also requires them to fit this platform's usize); saturating all the same.
            let bytes = shape.iter().fold(width, |n, &d| n.saturating_mul(d as u64));
            let row = (self.config.hidden_size as u64).saturating_mul(width);
            let unit = usize::try_from(if name == EMBEDDINGS { row } else { bytes })
                .map_err(|_| too_large(&name, bytes))?;
            pending.push(Pending {
                name,
                kind: Kind::Checkpoint(dtype),
                start,
                end: start + bytes,
                unit,
                buf: Vec::new(),
                received: 0,
            });
        }
        pending.sort_by_key(|p| p.start);
        Ok(State::Data {
            header,
            data_start,
            pending,
            first: 0,
            sink: Sink::Checkpoint {
                assembler: Box::new(Assembler::new(&self.config, self.options)),
                scratch: Vec::new(),
            },
            int8: false,
        })
    }

    /// The backend, once the whole file was pushed. A file cut short is the error
    /// [`NativeBackend::from_bytes`] gives for the same bytes.
    pub fn finish(self) -> Result<NativeBackend> {
        let received = self.received;
        match self.state {
            State::Header(buf) if buf.len() < 8 => {
                Err(invalid("shorter than a safetensors header".into()))
            }
            State::Header(buf) => {
                let header_len = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
                // Fewer bytes than the header: the error `from_bytes` gives.
                Err(weights::data_start(Path::new(LABEL), header_len, received)
                    .err()
                    .unwrap_or_else(|| invalid("the safetensors header was cut short".into())))
            }
            State::Failed => Err(Error::InvalidOption {
                name: "weights",
                value: "finish".into(),
                reason: "the loader failed on an earlier chunk",
            }),
            State::Data {
                header,
                data_start,
                pending,
                sink,
                int8,
                ..
            } => {
                // Every offset again, against the length now known.
                let label = if int8 { prequant::INT8_FILE } else { LABEL };
                let path = Path::new(label);
                if int8 {
                    let parsed = Header {
                        json: header[8..].to_vec(),
                        data_start,
                        file_len: received,
                    };
                    let file = prequant::file_options(path, &parsed, &self.config)?;
                    Plan::new(path, &parsed, &self.config, file)?;
                } else {
                    weights::parse_header_for(
                        path,
                        &header[8..],
                        data_start,
                        received,
                        &self.config,
                    )?;
                }
                if let Some(p) = pending.iter().find(|p| !p.done()) {
                    return Err(Error::InvalidConfig {
                        path: path.into(),
                        reason: format!("the data of {} was cut short", p.name),
                    });
                }
                let (model, precision) = match sink {
                    Sink::Checkpoint { assembler, .. } => (assembler.finish(None)?, self.precision),
                    Sink::Int8(reader) => (reader.finish(None)?, Precision::Int8),
                };
                NativeBackend::with_model(model, self.threads, label.into(), precision)
            }
        }
    }
}

/// Hands the bytes `at .. at + chunk.len()` of the file to the tensors they belong to.
fn feed(
    pending: &mut [Pending],
    first: &mut usize,
    sink: &mut Sink,
    at: u64,
    chunk: &[u8],
) -> Result<()> {
    let end = at + chunk.len() as u64;
    for p in pending[*first..].iter_mut() {
        if p.start >= end {
            break;
        }
        if p.done() || p.end <= at {
            continue;
        }
        // The part of the chunk inside this tensor, from where it stopped.
        let from = (p.start + p.received).max(at);
        let to = p.end.min(end);
        let mut bytes = &chunk[(from - at) as usize..(to - at) as usize];
        while !bytes.is_empty() {
            if p.buf.is_empty() {
                // Its final size at once: no copy as it grows over many chunks. (Fallible:
                // a header may claim more than the memory there is.)
                p.buf
                    .try_reserve_exact(p.unit)
                    .map_err(|_| too_large(&p.name, p.end - p.start))?;
            }
            let take = (p.unit - p.buf.len()).min(bytes.len());
            p.buf.extend_from_slice(&bytes[..take]);
            p.received += take as u64;
            bytes = &bytes[take..];
            if p.buf.len() == p.unit {
                let row = p.name == EMBEDDINGS;
                match (&p.kind, &mut *sink) {
                    (Kind::Checkpoint(dtype), Sink::Checkpoint { assembler, scratch }) => {
                        scratch.clear();
                        dtype.decode_into(&p.buf, scratch);
                        if row {
                            assembler.embedding_rows(scratch)?;
                        } else {
                            assembler.tensor(&p.name, scratch)?;
                        }
                    }
                    (Kind::Int8(want), Sink::Int8(reader)) => reader.tensor(want, &p.buf)?,
                    _ => unreachable!("start_data gives every tensor its sink's kind"),
                }
                p.buf.clear();
                if !row {
                    p.buf = Vec::new();
                }
            }
        }
    }
    while pending.get(*first).is_some_and(Pending::done) {
        *first += 1;
    }
    Ok(())
}
