//! What the fuzz targets share: the tiny test model, and how an input's bytes become a
//! request.
//!
//! Input format: byte 0 holds the options (bits 0–1 the task, bit 2 the `Truncation::Error`
//! policy, bits 4–7 a small maximum length for the tokenizer target); the rest are up to 16
//! texts separated by 0xFF (a byte UTF-8 never uses), each decoded as lossy UTF-8, so every
//! valid text but no invalid one reaches the library (`&str` cannot hold invalid UTF-8).
//! No text at all is an empty batch.

use std::path::PathBuf;

use ruri_core::{Task, Truncation, prompts};

/// The committed tiny random-weight model.
pub fn tiny_model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tiny")
}

/// A request decoded from fuzzer bytes.
#[derive(Debug)]
pub struct Request {
    /// The task.
    pub task: Task,
    /// Its prompt text.
    pub prompt: &'static str,
    /// The truncation policy.
    pub truncation: Truncation,
    /// A maximum length from 3 to 48 for tests of the tokenizer alone.
    pub small_max_length: usize,
    /// The texts.
    pub texts: Vec<String>,
}

impl Request {
    /// Decodes `data` (see the crate docs); `None` for an empty input.
    pub fn decode(data: &[u8]) -> Option<Self> {
        let (&options, rest) = data.split_first()?;
        let (task, prompt) = match options & 3 {
            0 => (Task::None, ""),
            1 => (Task::Query, prompts::QUERY),
            2 => (Task::Document, prompts::DOCUMENT),
            _ => (Task::Topic, prompts::TOPIC),
        };
        let truncation = if options & 4 == 0 {
            Truncation::Truncate
        } else {
            Truncation::Error
        };
        let texts = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split(|&b| b == 0xFF)
                .take(16)
                .map(|t| String::from_utf8_lossy(t).into_owned())
                .collect()
        };
        Some(Self {
            task,
            prompt,
            truncation,
            small_max_length: 3 + usize::from(options >> 4) * 3,
            texts,
        })
    }

    /// The texts as `&str`.
    pub fn text_refs(&self) -> Vec<&str> {
        self.texts.iter().map(String::as_str).collect()
    }
}
