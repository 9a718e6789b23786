//! The native engine on arbitrary `model.safetensors` bytes and token ids: loading either
//! succeeds or returns a typed error (crafted headers: offsets that wrap or run past the end,
//! shapes whose product overflows, wrong dtypes or shapes), and a loaded model either embeds
//! the ids or refuses an id outside the vocabulary by name — never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ruri_core::{Backend, BackendOutput, Error, PaddedBatch};

/// A model small enough that a fuzzer can write all of its tensors (8 wide, one layer).
const CONFIG: &str = r#"{"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 64}"#;
const VOCAB: u32 = 10;

fuzz_target!(|data: &[u8]| {
    // The first byte says how many trailing bytes are token ids; the rest is the file.
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n).min(rest.len()).min(64);
    let (file, id_bytes) = rest.split_at(rest.len() - n);
    let builder = ruri_native::builder().threads(1);
    let backend = match ruri_native::NativeBackend::from_bytes(&builder, CONFIG, file.to_vec()) {
        Ok(backend) => backend,
        Err(Error::InvalidConfig { .. } | Error::Io { .. }) => return,
        Err(other) => panic!("unexpected error kind for a broken file: {other}"),
    };
    // Ids 0..16: some outside the vocabulary.
    let ids: Vec<u32> = id_bytes.iter().map(|&b| u32::from(b % 16)).collect();
    let batch = PaddedBatch::new([ids.as_slice()], 3);
    match backend.forward(&batch) {
        Ok(BackendOutput::Pooled(p)) => {
            assert!(ids.iter().all(|&id| id < VOCAB), "an id past the vocabulary was embedded");
            assert_eq!(p.dim(), (1, 8));
        }
        Ok(other) => panic!("the native engine pools: {other:?}"),
        Err(Error::InvalidOption { name, .. }) => {
            assert_eq!(name, "input_ids");
            assert!(ids.iter().any(|&id| id >= VOCAB), "a valid id was refused");
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
});
