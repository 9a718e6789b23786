//! The one loader without a folder (`EmbedderConfig::loader`, what ruri-wasm loads through):
//! a model given as the texts of its `config.json` and `tokenizer.json` and its weights fed
//! as bytes gives the folder's vectors bit for bit, with every native option reaching the
//! engine, and everything a folder would refuse is refused the same way.

use std::path::Path;

use ruri::native::{EmbeddingTable, Kernel, NativeBackend};
use ruri::{
    AttentionPrecision, BackendKind, BatchOptions, EmbedderConfig, Error, ModelTexts, Precision,
    Task, TextEmbedder, Whitespace,
};
use ruri_testkit::{tiny_model_copy, tiny_model_dir};

const TEXTS: [&str; 4] = [
    "瑠璃色はどんな色？",
    "瑠璃色は紫みを帯びた濃い青。",
    "  空白で始まる文  ",
    "",
];

fn read(name: &str) -> String {
    std::fs::read_to_string(tiny_model_dir().join(name)).expect("the tiny model's file")
}

/// The tiny model as texts, with the folder's maximum length (its
/// `sentence_bert_config.json` says 512), so that both ways truncate alike.
fn texts() -> ModelTexts {
    ModelTexts::new(&read("config.json"), &read("tokenizer.json"), Some(512)).expect("texts")
}

/// `file`'s bytes through `config`'s loader, in chunks of `chunk` bytes.
fn from_bytes(config: &EmbedderConfig, file: &Path, chunk: usize) -> ruri::Result<TextEmbedder> {
    let bytes = std::fs::read(file).expect("the weights file");
    let mut loader = config.loader(texts())?;
    for part in bytes.chunks(chunk) {
        loader.push(part)?;
    }
    loader.finish()
}

fn bits(embedder: &TextEmbedder) -> Vec<Vec<u32>> {
    [Task::Query, Task::Document, Task::None]
        .into_iter()
        .flat_map(|task| {
            let embeddings = embedder.embed(&TEXTS, task).expect("embed");
            let rows: Vec<Vec<u32>> = embeddings
                .iter()
                .map(|v| v.iter().map(|x| x.to_bits()).collect())
                .collect();
            rows
        })
        .collect()
}

fn native(embedder: &TextEmbedder) -> &NativeBackend {
    embedder.backend_as().expect("the native engine")
}

#[test]
fn bytes_give_the_folders_vectors_bit_for_bit() {
    let weights = tiny_model_dir().join("model.safetensors");
    for precision in [Precision::Fp32, Precision::Int8] {
        for whitespace in [Whitespace::Keep, Whitespace::Strip] {
            let config = EmbedderConfig::new()
                .backend(BackendKind::Native)
                .precision(precision)
                .whitespace(whitespace)
                .threads(1);
            let folder = config.build_from_dir(tiny_model_dir()).expect("folder");
            let want = bits(&folder);
            // Chunks that split the header's length, the header and the tensors anywhere.
            for chunk in [1 << 20, 4_099, 7] {
                let embedder = from_bytes(&config, &weights, chunk).expect("bytes");
                assert_eq!(bits(&embedder), want, "{precision} {whitespace:?} {chunk}");
                assert_eq!(embedder.whitespace(), whitespace);
                assert_eq!(
                    native(&embedder).precision().to_string(),
                    precision.to_string()
                );
            }
        }
    }
}

#[test]
fn the_native_options_reach_the_engine() {
    let weights = tiny_model_dir().join("model.safetensors");
    let int8 = EmbedderConfig::new()
        .backend(BackendKind::Native)
        .precision(Precision::Int8)
        .threads(1);
    let default = bits(&from_bytes(&int8, &weights, 1 << 16).expect("default"));
    // Every kernel this CPU runs is taken, and gives the same bits.
    for kernel in Kernel::available() {
        let embedder = from_bytes(&int8.clone().kernel(kernel), &weights, 1 << 16).expect("kernel");
        assert_eq!(native(&embedder).kernel(), Some(kernel));
        assert_eq!(bits(&embedder), default, "{kernel}");
    }
    // The int8 table moves the vectors (slightly), and as it does from a folder.
    let table = int8.clone().embedding_table(EmbeddingTable::Int8);
    let streamed = bits(&from_bytes(&table, &weights, 1 << 16).expect("int8 table"));
    assert_ne!(
        streamed, default,
        "the int8 table changed nothing: not applied"
    );
    let folder = table
        .build_from_dir(tiny_model_dir())
        .expect("folder, int8 table");
    assert_eq!(streamed, bits(&folder));
    // Attention other than the precision's default, and the pipeline's batch limits.
    let batching = BatchOptions::default().max_batch_size(3);
    let embedder = from_bytes(
        &int8.attention(AttentionPrecision::F32).batching(batching),
        &weights,
        1 << 16,
    )
    .expect("f32 attention");
    assert_eq!(
        native(&embedder).attention(),
        ruri::native::AttentionPrecision::F32
    );
    assert_eq!(embedder.batching(), batching);
    assert_ne!(
        bits(&embedder),
        default,
        "f32 attention changed nothing at int8"
    );
}

#[test]
fn ruris_int8_file_as_bytes_is_the_prequantized_folder() {
    // The folder without model.safetensors: the prequantized load reads the int8 file only.
    let dir = tiny_model_copy(&|name| !name.ends_with(".safetensors") && !name.contains("onnx"));
    let file = dir.path().join(ruri::native::INT8_FILE);
    ruri::native::builder()
        .threads(1)
        .write_int8_file(tiny_model_dir(), &file)
        .expect("the int8 file");
    let int8 = EmbedderConfig::new()
        .backend(BackendKind::Native)
        .precision(Precision::Int8)
        .threads(1);
    let folder = int8
        .clone()
        .prequantized(true)
        .build_from_dir(dir.path())
        .expect("prequantized folder");
    let streamed = from_bytes(&int8, &file, 10_007).expect("the int8 file as bytes");
    assert_eq!(bits(&streamed), bits(&folder));
    // At fp32, or with another embedding table than the file's, the file is refused, as
    // from a folder.
    let table = int8.clone().embedding_table(EmbeddingTable::Int8);
    assert!(matches!(
        from_bytes(&table, &file, 1 << 16),
        Err(Error::WeightsMismatch { .. })
    ));
    let fp32 = int8.precision(Precision::Fp32);
    assert!(matches!(
        from_bytes(&fp32, &file, 1 << 16),
        Err(Error::WeightsMismatch { .. })
    ));
}

#[test]
fn what_bytes_cannot_run_is_refused_before_any_byte() {
    let refused = |config: EmbedderConfig, option: &str| match config.loader(texts()) {
        Err(Error::InvalidOption { name, .. }) => assert_eq!(name, option, "{config:?}"),
        other => panic!("{config:?}: {other:?}"),
    };
    refused(EmbedderConfig::new().backend(BackendKind::Ort), "backend");
    refused(
        EmbedderConfig::new().backend(BackendKind::Candle),
        "backend",
    );
    refused(
        EmbedderConfig::new()
            .precision(Precision::Int8)
            .prequantized(true),
        "prequantized",
    );
    refused(
        EmbedderConfig::new().precision(Precision::Fp16),
        "precision",
    );
    // The native options are refused for the other backends, from a folder as well.
    let ort_kernel = EmbedderConfig::new()
        .backend(BackendKind::Ort)
        .kernel(Kernel::Scalar);
    assert!(matches!(
        ort_kernel.validate(),
        Err(Error::InvalidOption { name: "kernel", .. })
    ));
    let candle_table = EmbedderConfig::new()
        .backend(BackendKind::Candle)
        .embedding_table(EmbeddingTable::Int8);
    assert!(matches!(
        candle_table.build_from_dir(tiny_model_dir()),
        Err(Error::InvalidOption {
            name: "embedding_table",
            ..
        })
    ));
}

#[test]
fn broken_weights_are_typed_errors_naming_the_file() {
    let config = EmbedderConfig::new().threads(1);
    let bytes = std::fs::read(tiny_model_dir().join("model.safetensors")).expect("weights");
    // Cut short: finish() says so.
    let mut loader = config.loader(texts()).expect("loader");
    loader
        .push(&bytes[..bytes.len() - 1])
        .expect("a prefix is fine");
    match loader.finish() {
        Err(Error::InvalidConfig { path, .. }) => assert!(path.ends_with("model.safetensors")),
        other => panic!("{other:?}"),
    }
    // A header that is not JSON: refused as soon as it is in.
    let mut loader = config.loader(texts()).expect("loader");
    let mut junk = 4u64.to_le_bytes().to_vec();
    junk.extend_from_slice(b"{no!");
    match loader.push(&junk) {
        Err(Error::InvalidConfig { path, .. }) => assert!(path.ends_with("model.safetensors")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_tokenizer_is_checked_against_the_config_as_a_folders_is() {
    let (config, tokenizer) = (read("config.json"), read("tokenizer.json"));
    let with = |from: &str, to: &str| {
        let changed = config.replace(from, to);
        assert_ne!(changed, config, "{from} is not in config.json");
        ModelTexts::new(&changed, &tokenizer, None)
    };
    // Fewer embedding rows than the tokenizer has pieces: ids would index past the table.
    match with("\"vocab_size\": 8000", "\"vocab_size\": 100") {
        Err(Error::InvalidConfig { path, reason }) => {
            assert_eq!(path, Path::new("tokenizer.json"));
            assert!(reason.contains("vocab_size is 100"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // `<s> … </s>` with other ids than config.json's.
    match with("\"bos_token_id\": 1", "\"bos_token_id\": 5") {
        Err(Error::InvalidConfig { path, reason }) => {
            assert_eq!(path, Path::new("tokenizer.json"));
            assert!(reason.contains("bos_token_id"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match with("\"pad_token_id\": 3", "\"pad_token_id\": 0") {
        Err(Error::InvalidConfig { path, .. }) => assert_eq!(path, Path::new("config.json")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ModelTexts::new("{", &tokenizer, None),
        Err(Error::InvalidJson { .. })
    ));
    assert!(matches!(
        ModelTexts::new(&config, "{}", None),
        Err(Error::InvalidTokenizer { .. })
    ));
    assert!(matches!(
        ModelTexts::new(&config, &tokenizer, Some(0)),
        Err(Error::Tokenizer(_))
    ));
    // Unset, the maximum length is the model's max_position_embeddings.
    let model = ModelTexts::new(&config, &tokenizer, None).expect("texts");
    assert_eq!(model.tokenizer().max_length(), 8192);
}
