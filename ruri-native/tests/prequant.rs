//! ruri's int8 file (`model.ruri-int8.safetensors`): written from `model.safetensors`, it
//! loads (from a folder, from bytes, streamed) to the same vectors, bit for bit, as
//! quantizing `model.safetensors` at load with the same options, on every kernel; a file
//! that does not match the options or the config, or is broken, is a typed error.
//!
//! On the committed tiny model, and on the 30m shape when `testdata/generated/` has it
//! (`tools/testdata/generate.sh 30m`; not in CI: skipped with a note otherwise).

use std::path::Path;

use ruri_core::{Backend, BackendOutput, Error, ModelDir, PaddedBatch, TextEmbedder};
use ruri_native::{EmbeddingTable, INT8_FILE, Kernel, NativeBackend, NativeBuilder, Precision};
use ruri_testkit::{Reference, copy_model, tiny_model_dir};

fn texts() -> Vec<String> {
    Reference::tiny()
        .items
        .iter()
        .map(|i| format!("{}{}", i.prompt, i.text))
        .collect()
}

fn bits(e: &TextEmbedder, texts: &[String]) -> Vec<Vec<u32>> {
    let out = e.embed(texts, ruri_core::Task::None).unwrap();
    (0..texts.len())
        .map(|i| out.get(i).unwrap().iter().map(|v| v.to_bits()).collect())
        .collect()
}

fn builder(kernel: Kernel, table: EmbeddingTable, outliers: bool) -> NativeBuilder {
    ruri_native::builder()
        .precision(Precision::Int8)
        .kernel(kernel)
        .threads(2)
        .embedding_table(table)
        .outlier_channels(outliers)
}

/// A copy of `dir` (its small files, `model.safetensors` too) with the int8 file written
/// into it by `writer`.
fn with_int8_file(dir: &Path, writer: &NativeBuilder) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    copy_model(dir, copy.path(), &|name| !name.starts_with("onnx/"));
    let size = writer
        .write_int8_file(copy.path(), copy.path().join(INT8_FILE))
        .unwrap();
    assert_eq!(
        size,
        std::fs::metadata(copy.path().join(INT8_FILE))
            .unwrap()
            .len()
    );
    copy
}

/// The folder's pipeline (its tokenizer and maximum length) around `backend`.
fn text_embedder(dir: &Path, backend: NativeBackend) -> TextEmbedder {
    TextEmbedder::load(&ModelDir::open(dir).unwrap(), None, || Ok(backend)).unwrap()
}

/// Bits compared without printing thousands of them.
#[track_caller]
fn assert_same(got: &[Vec<u32>], want: &[Vec<u32>], what: &str) {
    let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
    assert!(
        got.len() == want.len() && differ == 0,
        "{what}: {differ} of {} vectors differ",
        want.len()
    );
}

/// Every way in: the folder, the bytes, the stream (in chunks of an odd size), against
/// quantizing `model.safetensors` at load, for each option in `combos` and every kernel.
fn check_model(dir: &Path, combos: &[(EmbeddingTable, bool)], texts: &[String]) {
    let config_json = std::fs::read_to_string(dir.join("config.json")).unwrap();
    for &(table, outliers) in combos {
        let folder = with_int8_file(dir, &builder(Kernel::Scalar, table, outliers));
        let file = std::fs::read(folder.path().join(INT8_FILE)).unwrap();
        for kernel in Kernel::available() {
            let options = builder(kernel, table, outliers);
            let want = bits(&options.clone().build_from_dir(dir).unwrap(), texts);
            let from_dir = options.clone().prequantized(true);
            let e = from_dir.build_from_dir(folder.path()).unwrap();
            let backend = e.backend_as::<NativeBackend>().unwrap();
            assert_eq!(backend.weights_file(), folder.path().join(INT8_FILE));
            assert_eq!(backend.kernel(), Some(kernel));
            let what = format!("{table:?} outliers {outliers} {kernel:?}");
            assert_same(&bits(&e, texts), &want, &format!("{what}: folder"));
            // The file's options apply when the builder leaves them unset.
            let unset = ruri_native::builder().kernel(kernel).prequantized(true);
            let e = unset.build_from_dir(folder.path()).unwrap();
            assert_same(&bits(&e, texts), &want, &format!("{what}: options unset"));
            let backend = NativeBackend::from_bytes(&options, &config_json, file.clone()).unwrap();
            assert_eq!(backend.weights_file(), Path::new(INT8_FILE));
            assert_same(
                &bits(&text_embedder(dir, backend), texts),
                &want,
                &format!("{what}: bytes"),
            );
            let mut loader = NativeBackend::loader(&options, &config_json).unwrap();
            for chunk in file.chunks(65_537) {
                loader.push(chunk).unwrap();
            }
            let backend = loader.finish().unwrap();
            assert_eq!(backend.weights_file(), Path::new(INT8_FILE));
            assert_same(
                &bits(&text_embedder(dir, backend), texts),
                &want,
                &format!("{what}: stream"),
            );
        }
    }
}

#[test]
fn the_int8_file_gives_the_same_bits_on_the_tiny_model() {
    let combos = [
        (EmbeddingTable::Int8, true),
        (EmbeddingTable::F32, true),
        (EmbeddingTable::Int8, false),
        (EmbeddingTable::F32, false),
    ];
    check_model(&tiny_model_dir(), &combos, &texts());
}

#[test]
fn the_int8_file_gives_the_same_bits_at_the_30m_shape() {
    let dir = ruri_testkit::testdata_dir().join("generated/ruri-v3-30m-shape");
    if !dir.join("model.safetensors").exists() {
        eprintln!(
            "skipped: {} is absent (tools/testdata/generate.sh 30m makes it)",
            dir.display()
        );
        return;
    }
    // The shipped options only, and the first texts: 2 shared cores run it in minutes.
    let texts: Vec<String> = texts().into_iter().take(8).collect();
    check_model(&dir, &[(EmbeddingTable::Int8, true)], &texts);
}

/// The tiny model's int8 file (int8 table, outlier channels), as bytes.
fn tiny_file() -> (String, Vec<u8>) {
    let dir = tiny_model_dir();
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
    let file = ruri_native::builder()
        .embedding_table(EmbeddingTable::Int8)
        .int8_file_bytes(&config, weights)
        .unwrap();
    (config, file)
}

/// The header JSON and where the data starts.
fn header(file: &[u8]) -> (serde_json::Value, usize) {
    let len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&file[8..8 + len]).unwrap(), 8 + len)
}

/// The file with its header replaced by `edit`'s (the data as it was).
fn with_header(file: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let (mut json, start) = header(file);
    edit(&mut json);
    let text = serde_json::to_vec(&json).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&file[start..]);
    out
}

fn pooled(backend: &NativeBackend) -> Vec<u32> {
    let batch = PaddedBatch::new([&[1u32, 40, 41, 42, 2][..]], 3);
    match backend.forward(&batch).unwrap() {
        BackendOutput::Pooled(p) => p.iter().map(|v| v.to_bits()).collect(),
        other => panic!("{other:?}"),
    }
}

fn load(config: &str, file: Vec<u8>, builder: &NativeBuilder) -> ruri_core::Result<NativeBackend> {
    let from_bytes = NativeBackend::from_bytes(builder, config, file.clone());
    // The stream gives the same outcome, byte by byte where it fails.
    let mut loader = NativeBackend::loader(builder, config)?;
    let streamed = file
        .chunks(4093)
        .try_for_each(|c| loader.push(c))
        .and_then(|()| loader.finish());
    match (&from_bytes, &streamed) {
        (Ok(a), Ok(b)) => assert_eq!(pooled(a), pooled(b)),
        // The same kind (which of several broken entries a message names may differ: the
        // header's entries are checked in no fixed order).
        (Err(a), Err(b)) => assert_eq!(
            std::mem::discriminant(a),
            std::mem::discriminant(b),
            "bytes: {a}; stream: {b}"
        ),
        (a, b) => panic!("bytes {a:?} but stream {b:?}"),
    }
    from_bytes
}

/// The tests above can fail: a weight scale of the file changed by 0.1 %, or one int8
/// weight, changes the vector.
#[test]
fn a_perturbed_file_changes_the_bits() {
    let (config, file) = tiny_file();
    let b = ruri_native::builder().threads(1);
    let want = pooled(&load(&config, file.clone(), &b).unwrap());
    let (json, start) = header(&file);
    let offset = |name: &str| start + json[name]["data_offsets"][0].as_u64().unwrap() as usize;
    let mut scaled = file.clone();
    let at = offset("layers.1.attn.Wqkv.weight_scale") + 4 * 70;
    let scale = f32::from_le_bytes(scaled[at..at + 4].try_into().unwrap());
    scaled[at..at + 4].copy_from_slice(&(scale * 1.001).to_le_bytes());
    assert!(
        pooled(&load(&config, scaled, &b).unwrap()) != want,
        "a scale changed nothing"
    );
    let mut stepped = file.clone();
    // Row 5, input channel 10: not an outlier channel (whose weights are 0 and unread).
    let outliers = offset("layers.0.mlp.Wi.outlier_channels");
    let m = json["layers.0.mlp.Wi.outlier_channels"]["shape"][0]
        .as_u64()
        .unwrap() as usize;
    let channels: Vec<i32> = file[outliers..outliers + 4 * m]
        .chunks(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert!(!channels.contains(&10), "{channels:?}");
    let at = offset("layers.0.mlp.Wi.weight") + 5 * 64 + 10;
    // By 64 steps: the next layer's int8 activations absorb a change of one.
    let q = stepped[at] as i8;
    stepped[at] = (if q > 0 { q - 64 } else { q + 64 }) as u8;
    assert!(
        pooled(&load(&config, stepped, &b).unwrap()) != want,
        "a weight changed nothing"
    );
    // And the unperturbed file gives the same bits as quantizing at load.
    let weights = std::fs::read(tiny_model_dir().join("model.safetensors")).unwrap();
    let at_load = b.clone().embedding_table(EmbeddingTable::Int8);
    let at_load = NativeBackend::from_bytes(&at_load, &config, weights).unwrap();
    assert!(pooled(&at_load) == want, "quantized at load: other bits");
}

#[test]
fn options_other_than_the_files_are_refused() {
    let (config, file) = tiny_file();
    let mismatch =
        |builder: NativeBuilder, what_wanted: &str, in_file: &str, wanted: &str| match load(
            &config,
            file.clone(),
            &builder.threads(1),
        ) {
            Err(Error::WeightsMismatch {
                what,
                in_file: f,
                wanted: w,
                wanted_by,
                ..
            }) => {
                assert_eq!(
                    (what, f.as_str(), w.as_str()),
                    (what_wanted, in_file, wanted)
                );
                assert_eq!(wanted_by, "the builder");
            }
            other => panic!("{what_wanted}: {other:?}"),
        };
    let b = ruri_native::builder;
    mismatch(b().precision(Precision::Fp32), "precision", "int8", "fp32");
    mismatch(
        b().embedding_table(EmbeddingTable::F32),
        "embedding_table",
        "int8",
        "f32",
    );
    mismatch(
        b().outlier_channels(false),
        "outlier_channels",
        "true",
        "false",
    );
    // Refused for its options before its tensors are checked: a file cut short gets the
    // same answer from bytes as from a stream (which cannot know the length yet).
    let cut = file[..file.len() / 2].to_vec();
    let f32_table = b().embedding_table(EmbeddingTable::F32).threads(1);
    assert!(matches!(
        load(&config, cut, &f32_table),
        Err(Error::WeightsMismatch {
            what: "embedding_table",
            ..
        })
    ));
    // The same options, set: loads.
    let same = b()
        .embedding_table(EmbeddingTable::Int8)
        .outlier_channels(true)
        .threads(1);
    load(&config, file.clone(), &same).unwrap();
    // A config.json of another shape: both values named.
    let other = config.replace("\"intermediate_size\": 128", "\"intermediate_size\": 96");
    assert_ne!(other, config, "the tiny config's intermediate_size");
    match load(&other, file.clone(), &b().threads(1)) {
        Err(
            e @ Error::WeightsMismatch {
                what: "intermediate_size",
                ..
            },
        ) => {
            let message = e.to_string();
            assert!(
                message.contains("= 128") && message.contains("96"),
                "{message}"
            );
            assert!(message.contains("config.json"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn prequantized_needs_the_int8_file() {
    // A folder without one: the missing file by name.
    match ruri_native::builder()
        .prequantized(true)
        .build_from_dir(tiny_model_dir())
    {
        Err(Error::MissingFile { path }) => assert!(path.ends_with(INT8_FILE)),
        other => panic!("{other:?}"),
    }
    // A checkpoint under the int8 file's name: refused, not quantized.
    let copy = tempfile::tempdir().unwrap();
    copy_model(&tiny_model_dir(), copy.path(), &|n| !n.starts_with("onnx/"));
    std::fs::copy(
        copy.path().join("model.safetensors"),
        copy.path().join(INT8_FILE),
    )
    .unwrap();
    match ruri_native::builder()
        .prequantized(true)
        .build_from_dir(copy.path())
    {
        Err(Error::InvalidConfig { reason, .. }) => {
            assert!(reason.contains("not ruri's int8 file"))
        }
        other => panic!("{other:?}"),
    }
    // Writing needs int8, and a checkpoint.
    let (config, file) = tiny_file();
    let fp32 = ruri_native::builder().precision(Precision::Fp32);
    let weights = std::fs::read(tiny_model_dir().join("model.safetensors")).unwrap();
    assert!(matches!(
        fp32.int8_file_bytes(&config, weights),
        Err(Error::InvalidOption {
            name: "precision",
            ..
        })
    ));
    match ruri_native::builder().int8_file_bytes(&config, file) {
        Err(Error::InvalidConfig { reason, .. }) => assert!(reason.contains("already")),
        other => panic!("{other:?}"),
    }
}

/// Broken files: each a typed error (the same from bytes and streamed), never a panic.
#[test]
fn broken_int8_files_are_typed_errors() {
    let (config, file) = tiny_file();
    let b = ruri_native::builder().threads(1);
    let reason = |file: Vec<u8>| match load(&config, file, &b) {
        Err(Error::InvalidConfig { reason, .. }) => reason,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    // Another version.
    let v2 = with_header(&file, |h| h["__metadata__"]["format_version"] = "2".into());
    match load(&config, v2, &b) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("version \"2\""), "{what}"),
        other => panic!("{other:?}"),
    }
    // A metadata field missing, or of an unknown value.
    let r = reason(with_header(&file, |h| {
        h["__metadata__"]
            .as_object_mut()
            .unwrap()
            .remove("hidden_size");
    }));
    assert!(r.contains("no hidden_size"), "{r}");
    let r = reason(with_header(&file, |h| {
        h["__metadata__"]["embedding_table"] = "f16".into()
    }));
    assert!(r.contains("embedding_table"), "{r}");
    // A tensor missing, of another dtype, of another shape.
    let r = reason(with_header(&file, |h| {
        h.as_object_mut()
            .unwrap()
            .remove("layers.0.mlp.Wi.weight_scale");
    }));
    assert!(r.contains("layers.0.mlp.Wi.weight_scale is missing"), "{r}");
    let r = reason(with_header(&file, |h| {
        h["layers.0.attn.Wqkv.weight"]["dtype"] = "U8".into();
    }));
    assert!(r.contains("layers.0.attn.Wqkv.weight is missing"), "{r}");
    let r = reason(with_header(&file, |h| {
        h["final_norm.weight"]["dtype"] = "I32".into();
    }));
    assert!(r.contains("final_norm.weight is I32"), "{r}");
    let r = reason(with_header(&file, |h| {
        let t = &mut h["embeddings.tok_embeddings.weight_scale"];
        let end = t["data_offsets"][0].as_u64().unwrap() + 8;
        t["shape"] = serde_json::json!([2]);
        t["data_offsets"][1] = end.into();
    }));
    assert!(r.contains("was expected"), "{r}");
    // Outlier channels out of order (the values, once read).
    let (json, start) = header(&file);
    let entry = json
        .as_object()
        .unwrap()
        .iter()
        .find(|(name, e)| name.ends_with(".outlier_channels") && e["shape"][0].as_u64() > Some(0))
        .map(|(name, e)| {
            (
                name.clone(),
                e["data_offsets"][0].as_u64().unwrap() as usize,
            )
        })
        .expect("the tiny model has a planted outlier channel");
    let mut broken = file.clone();
    broken[start + entry.1..start + entry.1 + 4].copy_from_slice(&(-1i32).to_le_bytes());
    let r = reason(broken.clone());
    assert!(r.contains("negative"), "{}: {r}", entry.0);
    broken[start + entry.1..start + entry.1 + 4].copy_from_slice(&100_000i32.to_le_bytes());
    let r = reason(broken);
    assert!(r.contains("outlier channels"), "{}: {r}", entry.0);
    // Cut short anywhere: the header, the data.
    for cut in [
        0,
        5,
        8,
        100,
        start - 1,
        start + 3,
        file.len() / 2,
        file.len() - 1,
    ] {
        let got = load(&config, file[..cut].to_vec(), &b);
        assert!(
            matches!(got, Err(Error::InvalidConfig { .. })),
            "cut at {cut}: {got:?}"
        );
    }
}

/// The facade's folder check has nothing to do with the int8 file: a folder with only the
/// int8 file (no `model.safetensors`) loads with `prequantized`.
#[test]
fn a_folder_needs_only_the_int8_file() {
    let folder = with_int8_file(&tiny_model_dir(), &ruri_native::builder());
    std::fs::remove_file(folder.path().join("model.safetensors")).unwrap();
    ModelDir::open(folder.path()).unwrap();
    let e = ruri_native::builder()
        .prequantized(true)
        .build_from_dir(folder.path())
        .unwrap();
    let texts = texts();
    let want = bits(
        &ruri_native::builder()
            .build_from_dir(tiny_model_dir())
            .unwrap(),
        &texts,
    );
    assert_same(&bits(&e, &texts), &want, "the int8 file alone");
    let backend = e.backend_as::<NativeBackend>().unwrap();
    assert_eq!(backend.weights_file(), folder.path().join(INT8_FILE));
}
