//! The native engine's reader of ruri's int8 file (`model.ruri-int8.safetensors`) on files
//! that start out valid and are then patched and cut by the fuzzer: from bytes and streamed,
//! loading either succeeds or returns a typed error (the same kind both ways), and a loaded
//! model embeds, never a panic. Patches reach what a header-only fuzzer rarely does: the
//! metadata, channel indices, columns, scales, cut points inside the data.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use ruri_core::{Backend, BackendOutput, Error, ModelConfig, PaddedBatch};
use ruri_native::{EmbeddingTable, NativeBackend};

/// One layer, 8 wide: small enough for many runs a second.
const CONFIG: &str = r#"{"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 64}"#;

/// A checkpoint of deterministic weights with a planted outlier channel (so the file has
/// outlier channels and split products), and its int8 file (int8 table).
fn int8_file() -> &'static [u8] {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| {
        let config = ModelConfig::from_json_str(CONFIG, "config.json").expect("a valid config");
        let mut header = String::from("{");
        let mut data = Vec::new();
        for (n, (name, shape)) in config.checkpoint_tensors().into_iter().enumerate() {
            let count: usize = shape.iter().product();
            let cols = *shape.last().expect("no scalars");
            let start = data.len();
            for i in 0..count {
                let mut v = ((i * 7919 + n * 104_729) % 211) as f32 / 105.0 - 1.0;
                if name.ends_with("norm.weight") {
                    v = 1.0 + 0.1 * v;
                } else if i % cols == 3 && shape.len() == 2 && cols == 8 {
                    // Input channel 3 read by tiny weights: an outlier channel.
                    v *= 0.01;
                }
                data.extend_from_slice(&v.to_le_bytes());
            }
            let comma = if n == 0 { "" } else { "," };
            header += &format!(
                r#"{comma}"{name}":{{"dtype":"F32","shape":{shape:?},"data_offsets":[{start},{}]}}"#,
                data.len()
            );
        }
        header.push('}');
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend_from_slice(&data);
        ruri_native::builder()
            .embedding_table(EmbeddingTable::Int8)
            .int8_file_bytes(CONFIG, file)
            .expect("a checkpoint the writer takes")
    })
}

fuzz_target!(|data: &[u8]| {
    // data: 2 bytes of cut point (0xffff: none), then patches of 3 bytes (position, 2 bytes
    // little-endian, scaled over the file; the value).
    let Some((cut, patches)) = data.split_first_chunk::<2>() else {
        return;
    };
    let mut file = int8_file().to_vec();
    for patch in patches.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([patch[0], patch[1]])) * file.len() / 65_536;
        file[at] = patch[2];
    }
    let cut = u16::from_le_bytes(*cut);
    if cut != u16::MAX {
        file.truncate(usize::from(cut) * file.len() / 65_535);
    }
    let builder = ruri_native::builder().threads(1);
    let from_bytes = NativeBackend::from_bytes(&builder, CONFIG, file.clone());
    let streamed = NativeBackend::loader(&builder, CONFIG).and_then(|mut loader| {
        file.chunks(97).try_for_each(|c| loader.push(c))?;
        loader.finish()
    });
    match (&from_bytes, &streamed) {
        (Ok(_), Ok(_)) => {}
        (Err(a), Err(b)) => assert_eq!(
            std::mem::discriminant(a),
            std::mem::discriminant(b),
            "bytes: {a}; stream: {b}"
        ),
        (a, b) => panic!("bytes {a:?} but stream {b:?}"),
    }
    let backend = match from_bytes {
        Ok(backend) => backend,
        Err(
            Error::InvalidConfig { .. }
            | Error::Io { .. }
            | Error::Unsupported { .. }
            | Error::WeightsMismatch { .. },
        ) => return,
        Err(other) => panic!("unexpected error kind for a broken file: {other}"),
    };
    let batch = PaddedBatch::new([&[1u32, 4, 5, 2][..]], 3);
    match backend.forward(&batch) {
        Ok(BackendOutput::Pooled(p)) => assert_eq!(p.dim(), (1, 8)),
        Ok(other) => panic!("the native engine pools: {other:?}"),
        Err(other) => panic!("unexpected error: {other}"),
    }
});
