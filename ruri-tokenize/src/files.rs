//! Reading the JSON files of a model folder (shared with `ruri-core`, which maps the errors
//! into its own).

use std::fs;
use std::path::Path;

use crate::{Result, TokenizeError};

/// Reads and parses an optional JSON file: `Ok(None)` when it does not exist.
pub fn read_optional_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizeError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| TokenizeError::InvalidJson {
            path: path.to_path_buf(),
            source,
        })
}
