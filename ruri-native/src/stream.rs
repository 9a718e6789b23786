//! `model.safetensors` received as a stream ([`NativeBackend::loader`]): the header is
//! parsed with the checks of [`crate::weights`], then each tensor the model reads is
//! buffered alone (the embedding table a row at a time), handed to the [`Assembler`] as
//! soon as its bytes are in, and dropped. The file is never held whole.

use std::path::{Path, PathBuf};

use ruri_core::{Error, ModelConfig, Result};

use crate::model::{Assembler, EMBEDDINGS, LoadOptions};
use crate::weights::{self, Dtype, Entry};
use crate::{NativeBackend, Precision};

/// A tensor the model reads, and its bytes received so far.
#[derive(Debug)]
struct Pending {
    /// Without the checkpoint's prefix.
    name: String,
    dtype: Dtype,
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
        assembler: Box<Assembler>,
        /// One tensor in f32 while it is prepared.
        scratch: Vec<f32>,
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
    ) -> Self {
        Self {
            config,
            options,
            threads,
            precision,
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
                assembler,
                scratch,
                ..
            } => {
                let at = self.received;
                self.received += chunk.len() as u64;
                feed(pending, first, assembler, scratch, at, chunk)
            }
        }
    }

    /// The header is in: the tensors to expect.
    fn start_data(&self, header: Vec<u8>) -> Result<State> {
        let data_start = header.len() as u64;
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
                dtype,
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
            assembler: Box::new(Assembler::new(&self.config, self.options)),
            scratch: Vec::new(),
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
                assembler,
                ..
            } => {
                // Every offset again, against the length now known.
                weights::parse_header_for(
                    Path::new(LABEL),
                    &header[8..],
                    data_start,
                    received,
                    &self.config,
                )?;
                if let Some(p) = pending.iter().find(|p| !p.done()) {
                    return Err(invalid(format!("the data of {} was cut short", p.name)));
                }
                let model = assembler.finish(None)?;
                NativeBackend::with_model(model, self.threads, LABEL.into(), self.precision)
            }
        }
    }
}

/// Hands the bytes `at .. at + chunk.len()` of the file to the tensors they belong to.
fn feed(
    pending: &mut [Pending],
    first: &mut usize,
    assembler: &mut Assembler,
    scratch: &mut Vec<f32>,
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
                scratch.clear();
                p.dtype.decode_into(&p.buf, scratch);
                p.buf.clear();
                if p.name == EMBEDDINGS {
                    assembler.embedding_rows(scratch)?;
                } else {
                    assembler.tensor(&p.name, scratch)?;
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
