//! The ONNX Runtime backend's own safetensors reader (the fused graph's, `ruri-ort/src/fused/
//! weights.rs`) on arbitrary `model.safetensors` bytes: opening the file and reading every
//! tensor the graph reads either succeeds or returns a typed error naming the file (crafted
//! headers: offsets that wrap or run past the end, shapes whose product overflows or wraps
//! to the data's length, wrong dtypes or shapes) — never a panic. No ONNX Runtime needed.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use ruri_core::{Error, ModelConfig};

/// A model small enough that a fuzzer can write all of its tensors (8 wide, one layer).
const CONFIG: &str = r#"{"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 64}"#;

fn config() -> &'static ModelConfig {
    static CONFIG_: OnceLock<ModelConfig> = OnceLock::new();
    CONFIG_.get_or_init(|| ModelConfig::from_json_str(CONFIG, "config.json").expect("valid"))
}

fuzz_target!(|data: &[u8]| {
    // The reader takes a file (positional reads and a memory map): one per process.
    let path = std::env::temp_dir().join(format!(
        "ruri-fuzz-fused-weights-{}.safetensors",
        std::process::id()
    ));
    std::fs::write(&path, data).expect("writing the input to the temporary folder");
    match ruri_ort::__fuzz::read_checkpoint(&path, config()) {
        Ok(values) => assert!(values > 0, "a loaded checkpoint has values"),
        Err(Error::InvalidConfig { path: p, .. }) => assert_eq!(p, path),
        Err(Error::Io { .. }) => {}
        Err(other) => panic!("unexpected error kind for a broken file: {other}"),
    }
});
