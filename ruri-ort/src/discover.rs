//! Which ONNX file of a model folder runs a precision: the names real Ruri ports use, in one
//! fixed order of preference.

use std::path::{Path, PathBuf};

use ruri_core::{Error, Result};

use crate::Precision;

/// int8 files, most preferred first: sirasagi62's ports (`model_quantized.onnx`, the name
/// optimum and transformers.js write), the 310m port's `model_int8.onnx`, then the files
/// sentence-transformers' `export_dynamic_quantized_onnx_model` writes (the one tuned for this
/// CPU family first; each runs on any CPU), then the same names at the folder root.
#[cfg(target_arch = "aarch64")]
const INT8: &[&str] = &[
    "onnx/model_quantized.onnx",
    "onnx/model_int8.onnx",
    "onnx/model_qint8_arm64.onnx",
    "onnx/model_qint8_avx512_vnni.onnx",
    "onnx/model_qint8_avx512.onnx",
    "onnx/model_qint8_avx2.onnx",
    "model_quantized.onnx",
    "model_int8.onnx",
];
#[cfg(not(target_arch = "aarch64"))]
const INT8: &[&str] = &[
    "onnx/model_quantized.onnx",
    "onnx/model_int8.onnx",
    "onnx/model_qint8_avx512_vnni.onnx",
    "onnx/model_qint8_avx512.onnx",
    "onnx/model_qint8_avx2.onnx",
    "onnx/model_qint8_arm64.onnx",
    "model_quantized.onnx",
    "model_int8.onnx",
];

/// fp32: the `onnx/` subfolder (sentence-transformers' and optimum's exports, sirasagi62's
/// ports), else the folder root (keitokei1994/ruri-v3-310m-onnx).
const FP32: &[&str] = &["onnx/model.onnx", "model.onnx"];

/// fp16: optimum's and transformers.js' name.
const FP16: &[&str] = &["onnx/model_fp16.onnx", "model_fp16.onnx"];

/// The file names a precision is looked for under, most preferred first (relative to the
/// model folder).
pub(crate) fn candidates(precision: Precision) -> &'static [&'static str] {
    match precision {
        Precision::Fp32 => FP32,
        Precision::Int8 => INT8,
        Precision::Fp16 => FP16,
    }
}

/// The first candidate of `precision` that exists in `dir`, or [`Error::NoModelFile`] naming
/// every candidate and every ONNX file the folder does have.
pub(crate) fn find(dir: &Path, precision: Precision) -> Result<PathBuf> {
    let names = candidates(precision);
    if let Some(found) = names.iter().map(|n| dir.join(n)).find(|p| p.is_file()) {
        return Ok(found);
    }
    Err(Error::NoModelFile {
        dir: dir.to_path_buf(),
        wanted: format!("{precision} ONNX file"),
        looked_for: names.iter().map(|n| (*n).to_owned()).collect(),
        found: onnx_files(dir),
    })
}

/// Every `*.onnx` at the root of `dir` and in `dir/onnx/`, relative to `dir`, sorted.
pub(crate) fn onnx_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for sub in ["", "onnx"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".onnx") && entry.path().is_file() {
                found.push(if sub.is_empty() {
                    name.into_owned()
                } else {
                    format!("{sub}/{name}")
                });
            }
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_precision_prefers_the_onnx_subfolder() {
        for precision in [Precision::Fp32, Precision::Int8, Precision::Fp16] {
            let names = candidates(precision);
            assert!(names[0].starts_with("onnx/"), "{names:?}");
            let mut unique = names.to_vec();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), names.len(), "{names:?}");
        }
    }
}
