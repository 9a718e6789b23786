//! The native engine against Python on the committed tiny model (`testdata/reference/tiny.json`,
//! made by `tools/testdata/generate.sh`; the planted outlier channel included): fp32 against
//! sentence-transformers, int8 against sentence-transformers fp32 within the quantization
//! error, and int8's promise: the same bits on every kernel, alone or in any batch, on any
//! number of threads. Print the figures with `cargo test -p ruri-native --test parity --
//! --nocapture`.

use ruri_core::{BatchOptions, EmbedOptions, Task, TextEmbedder};
use ruri_native::{AttentionPrecision, Kernel, Precision};
use ruri_testkit::{Agreement, Item, LongItem, Reference, tiny_model_dir};

/// fp32 runs the same math as torch; only summation order differs.
const FP32_MAX_ABS_DIFF: f64 = 1e-5;
const FP32_MIN_COSINE: f64 = 0.99999;
/// int8 against fp32 sentence-transformers, with the outlier channel in f32. Measured on the
/// tiny model: see the printed figures (the bound leaves room only for other inputs).
const INT8_MIN_COSINE: f64 = 0.998;
const INT8_MIN_COSINE_WITHOUT_OUTLIER: f64 = 0.995;

fn task_of(item: &Item) -> Task {
    match item.prompt_name.as_str() {
        "" => Task::None,
        "query" => Task::Query,
        "document" => Task::Document,
        "topic" => Task::Topic,
        other => Task::Named(other.to_owned()),
    }
}

fn one_batch() -> BatchOptions {
    BatchOptions::default()
        .max_batch_tokens(usize::MAX / 2)
        .max_batch_size(usize::MAX / 2)
        .max_batch_attention(usize::MAX / 2)
}

fn embedder(precision: Precision, kernel: Option<Kernel>, threads: usize) -> TextEmbedder {
    embedder_with(precision, kernel, threads, AttentionPrecision::F32)
}

fn embedder_with(
    precision: Precision,
    kernel: Option<Kernel>,
    threads: usize,
    attention: AttentionPrecision,
) -> TextEmbedder {
    let mut b = ruri_native::builder()
        .precision(precision)
        .threads(threads)
        .attention(attention)
        .batching(one_batch());
    if let Some(k) = kernel {
        b = b.kernel(k);
    }
    b.build_from_dir(tiny_model_dir()).unwrap()
}

/// Each item alone, with its task.
fn alone(e: &TextEmbedder, items: &[Item]) -> Vec<Vec<f32>> {
    items
        .iter()
        .map(|item| {
            let out = e
                .embed_with(&[item.text.as_str()], &EmbedOptions::new(task_of(item)))
                .unwrap();
            out.get(0).unwrap().to_vec()
        })
        .collect()
}

/// All items in one padded batch (prompts written into the texts).
fn batched(e: &TextEmbedder, items: &[Item]) -> Vec<Vec<f32>> {
    let texts: Vec<String> = items
        .iter()
        .map(|i| format!("{}{}", i.prompt, i.text))
        .collect();
    let out = e
        .embed_with(&texts, &EmbedOptions::new(Task::None))
        .unwrap();
    (0..texts.len())
        .map(|i| out.get(i).unwrap().to_vec())
        .collect()
}

fn agreement(reference: &Reference, got: &[Vec<f32>]) -> (Agreement, Agreement) {
    let mut all = Agreement::new();
    let mut without = Agreement::without_outlier(reference.outlier_channel);
    for (item, v) in reference.items.iter().zip(got) {
        all.add(v, &item.st_fp32.normalized);
        without.add(v, &item.st_fp32.normalized);
    }
    (all, without)
}

#[test]
fn fp32_matches_sentence_transformers_alone_and_batched() {
    let reference = Reference::tiny();
    for threads in [1, 2] {
        let e = embedder(Precision::Fp32, None, threads);
        for (how, got) in [
            ("alone", alone(&e, &reference.items)),
            ("batched", batched(&e, &reference.items)),
        ] {
            let (all, without) = agreement(&reference, &got);
            println!("fp32 {how}, {threads} threads: {all:?}; without the outlier {without:?}");
            assert!(all.max_abs_diff <= FP32_MAX_ABS_DIFF, "{how}: {all:?}");
            assert!(all.min_cosine >= FP32_MIN_COSINE, "{how}: {all:?}");
            assert!(without.min_cosine >= FP32_MIN_COSINE, "{how}: {without:?}");
        }
    }
}

/// At f32 attention and at int8's default, int13.
#[test]
fn int8_is_within_the_quantization_error_of_sentence_transformers() {
    let reference = Reference::tiny();
    for attention in [AttentionPrecision::F32, AttentionPrecision::Int13] {
        let e = embedder_with(Precision::Int8, None, 1, attention);
        let (all, without) = agreement(&reference, &alone(&e, &reference.items));
        println!("int8 alone, {attention} attention: {all:?}; without the outlier {without:?}");
        assert!(all.min_cosine >= INT8_MIN_COSINE, "{attention}: {all:?}");
        assert!(
            without.min_cosine >= INT8_MIN_COSINE_WITHOUT_OUTLIER,
            "{attention}: {without:?}"
        );
    }
}

/// The decomposition earns its place: without it, int8 is measurably further from fp32.
#[test]
fn outlier_channels_in_f32_beat_plain_int8() {
    let reference = Reference::tiny();
    let plain = ruri_native::builder()
        .precision(Precision::Int8)
        .threads(1)
        .outlier_channels(false)
        .build_from_dir(tiny_model_dir())
        .unwrap();
    let with = embedder(Precision::Int8, None, 1);
    let (_, plain) = agreement(&reference, &alone(&plain, &reference.items));
    let (_, with) = agreement(&reference, &alone(&with, &reference.items));
    println!("int8 without the outlier channel, plain {plain:?}; decomposed {with:?}");
    assert!(
        with.min_cosine > plain.min_cosine,
        "plain {plain:?}, decomposed {with:?}"
    );
}

/// Every kernel this CPU runs gives the scalar kernel's bits; so do batches and threads.
#[test]
fn int8_bits_are_the_same_on_every_kernel_batch_and_thread_count() {
    let reference = Reference::tiny();
    let scalar = embedder(Precision::Int8, Some(Kernel::Scalar), 1);
    let expected = alone(&scalar, &reference.items);
    assert_eq!(
        batched(&scalar, &reference.items),
        expected,
        "scalar batched vs alone"
    );
    for kernel in Kernel::available() {
        for threads in [1, 2, 3] {
            let e = embedder(Precision::Int8, Some(kernel), threads);
            assert_eq!(
                alone(&e, &reference.items),
                expected,
                "{kernel}, {threads} threads, alone"
            );
            assert_eq!(
                batched(&e, &reference.items),
                expected,
                "{kernel}, {threads} threads, batched"
            );
        }
    }
}

/// `tools/testdata/int8_reference.py`'s vectors (NumPy, the same integer scheme written
/// independently, exact erf), by item id: (raw mean, normalized).
fn numpy_int8(file: &str) -> std::collections::HashMap<String, (Vec<f32>, Vec<f32>)> {
    let path = ruri_testkit::testdata_dir().join("reference").join(file);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["id"].as_str().unwrap().to_owned(),
                (floats(&i["mean"]), floats(&i["normalized"])),
            )
        })
        .collect()
}

/// Each item alone, raw and normalized, against the NumPy vectors of `file`.
fn against_numpy(e: &TextEmbedder, items: &[Item], file: &str) -> (Agreement, Agreement) {
    let numpy = numpy_int8(file);
    let (mut raw, mut normalized) = (Agreement::new(), Agreement::new());
    for item in items {
        let (mean, unit) = &numpy[&item.id];
        let out = e
            .embed_with(
                &[item.text.as_str()],
                &EmbedOptions::new(task_of(item)).normalize(false),
            )
            .unwrap();
        raw.add(out.get(0).unwrap(), mean);
        let out = e
            .embed_with(&[item.text.as_str()], &EmbedOptions::new(task_of(item)))
            .unwrap();
        normalized.add(out.get(0).unwrap(), unit);
    }
    (raw, normalized)
}

/// The engine's int8 against the NumPy implementation of its scheme, raw and normalized.
/// Measured: see the printed figures; 1e-5 is the bound.
#[test]
fn int8_matches_the_numpy_reference() {
    let reference = Reference::tiny();
    let e = embedder(Precision::Int8, None, 1);
    let (raw, normalized) = against_numpy(&e, &reference.items, "tiny_native_int8.json");
    println!("int8 vs NumPy: raw {raw:?}; normalized {normalized:?}");
    assert!(normalized.max_abs_diff <= 1e-5, "{normalized:?}");
    assert!(raw.max_abs_diff <= 1e-5, "{raw:?}");
}

/// A builder told no attention runs int13 at int8 (its NumPy reference, bit for bit within
/// the same bound) and f32 at fp32 (sentence-transformers' parity).
#[test]
fn the_default_attention_is_int13_at_int8_and_f32_at_fp32() {
    let reference = Reference::tiny();
    let build = |precision| {
        ruri_native::builder()
            .precision(precision)
            .threads(1)
            .batching(one_batch())
            .build_from_dir(tiny_model_dir())
            .unwrap()
    };
    let int8 = build(Precision::Int8);
    let (raw, normalized) = against_numpy(&int8, &reference.items, "tiny_native_int8_int13.json");
    println!("int8, default attention, vs NumPy int13: raw {raw:?}; normalized {normalized:?}");
    assert!(normalized.max_abs_diff <= 1e-5, "{normalized:?}");
    assert!(raw.max_abs_diff <= 1e-5, "{raw:?}");
    let fp32 = build(Precision::Fp32);
    let stated = embedder(Precision::Fp32, None, 1);
    let texts: Vec<&str> = reference.items.iter().map(|i| i.text.as_str()).collect();
    assert_eq!(
        fp32.embed_documents(&texts).unwrap().to_vecs(),
        stated.embed_documents(&texts).unwrap().to_vecs(),
        "fp32's default attention is f32"
    );
}

/// The quantized attentions against `int8_reference.py --attention bf16` and `--attention
/// int13`, which write their definitions in NumPy (`tiny_native_int8_bf16.json`,
/// `tiny_native_int8_int13.json`), raw and normalized, with the default kernel and with each
/// int8 kernel this CPU runs (`Kernel::Scalar` runs attention's portable loops too). 1e-5 is
/// the bound of the f32-attention reference above.
#[test]
fn int8_bf16_and_int13_attention_match_the_numpy_references() {
    let reference = Reference::tiny();
    for (attention, file) in QUANTIZED_ATTENTION {
        let kernels = std::iter::once(None).chain(Kernel::available().into_iter().map(Some));
        for kernel in kernels {
            let e = embedder_with(Precision::Int8, kernel, 1, attention);
            let (raw, normalized) = against_numpy(&e, &reference.items, file);
            let name = kernel.map_or("default".to_owned(), |k| k.to_string());
            println!(
                "int8, {attention} attention, {name} kernel, vs NumPy: raw {raw:?}; normalized \
                 {normalized:?}"
            );
            assert!(
                normalized.max_abs_diff <= 1e-5,
                "{attention} {name}: {normalized:?}"
            );
            assert!(raw.max_abs_diff <= 1e-5, "{attention} {name}: {raw:?}");
        }
    }
}

/// The quantized attention precisions and their NumPy references for the tiny model.
const QUANTIZED_ATTENTION: [(AttentionPrecision, &str); 2] = [
    (AttentionPrecision::Bf16, "tiny_native_int8_bf16.json"),
    (AttentionPrecision::Int13, "tiny_native_int8_int13.json"),
];

/// A text of 1,709 tokens (`testdata/reference/tiny_long.json`, from
/// `tools/testdata/make_long_reference.py`): past the 512 tokens of the other items, and past
/// the 1,024 rotary angles the engine caches (those beyond are computed per call, on the
/// workers from 512 new positions on), where no other test compares it with Python. fp32
/// against sentence-transformers, int8 against the NumPy references with f32, bf16 and int13
/// attention; on one thread and on three, the same bits.
#[test]
fn a_text_past_the_rotary_cache_matches_python() {
    let item = LongItem::tiny();
    let (id, text, ids) = (item.id.as_str(), item.text.as_str(), &item.token_ids);
    assert!(ids.len() >= 1024 + 512, "{} tokens", ids.len());
    let st = (item.st_fp32.mean.clone(), item.st_fp32.normalized.clone());
    let int8 = |file: &str| numpy_int8(file).remove(id).unwrap();
    let cases = [
        (
            Precision::Fp32,
            AttentionPrecision::F32,
            st,
            "sentence-transformers fp32",
        ),
        (
            Precision::Int8,
            AttentionPrecision::F32,
            int8("tiny_long_native_int8.json"),
            "NumPy int8",
        ),
        (
            Precision::Int8,
            AttentionPrecision::Bf16,
            int8("tiny_long_native_int8_bf16.json"),
            "NumPy int8, bf16 attention",
        ),
        (
            Precision::Int8,
            AttentionPrecision::Int13,
            int8("tiny_long_native_int8_int13.json"),
            "NumPy int8, int13 attention",
        ),
    ];
    let folder = LongItem::model();
    for (precision, attention, (mean, unit), against) in cases {
        let mut first: Option<Vec<f32>> = None;
        for threads in [1, 3] {
            let e = ruri_native::builder()
                .precision(precision)
                .threads(threads)
                .attention(attention)
                .batching(one_batch())
                .build_from_dir(folder.path())
                .unwrap();
            let raw = EmbedOptions::new(Task::None).normalize(false);
            let encodings = e.tokenize(&[text], &raw).unwrap();
            assert_eq!(
                encodings[0].ids(),
                &ids[..],
                "the tokens sentence-transformers fed"
            );
            let out = e
                .embed_with(&[text], &raw)
                .unwrap()
                .get(0)
                .unwrap()
                .to_vec();
            let normalized = e
                .embed_with(&[text], &EmbedOptions::new(Task::None))
                .unwrap();
            let (mut a_raw, mut a_unit) = (Agreement::new(), Agreement::new());
            a_raw.add(&out, &mean);
            a_unit.add(normalized.get(0).unwrap(), &unit);
            println!(
                "{id}, {precision} ({attention:?} attention), {threads} threads, vs {against}: \
                 raw {a_raw:?}; normalized {a_unit:?}"
            );
            assert!(
                a_raw.max_abs_diff <= 1e-5,
                "{precision} {attention:?}: {a_raw:?}"
            );
            assert!(
                a_unit.max_abs_diff <= 1e-5,
                "{precision} {attention:?}: {a_unit:?}"
            );
            match &first {
                None => first = Some(out),
                Some(f) => assert_eq!(&out, f, "{precision} {attention:?}: {threads} threads"),
            }
        }
    }
}

/// bf16 and int13 attention keep int8's promise: a text's bits do not depend on the batch it
/// is in or on the number of threads.
#[test]
fn int8_bf16_and_int13_attention_bits_are_the_same_alone_batched_and_threaded() {
    let reference = Reference::tiny();
    for (attention, _) in QUANTIZED_ATTENTION {
        let one = embedder_with(Precision::Int8, None, 1, attention);
        let expected = alone(&one, &reference.items);
        for threads in [1, 3] {
            let e = embedder_with(Precision::Int8, None, threads, attention);
            assert_eq!(
                alone(&e, &reference.items),
                expected,
                "{attention}, {threads} threads, alone"
            );
            assert_eq!(
                batched(&e, &reference.items),
                expected,
                "{attention}, {threads} threads, batched"
            );
        }
    }
}

/// bf16 and int13 attention are other computations (the long items, over two local windows,
/// differ from f32 attention's) and close ones: min cosine ≥ 0.999 to f32 attention, at each
/// precision. Measured: see the printed figures (the NumPy references: 0.9999998 at int8 on
/// the long items with bf16 attention).
#[test]
fn quantized_attention_differs_from_f32_on_long_items_but_stays_close() {
    let reference = Reference::tiny();
    let long: Vec<Item> = reference
        .items
        .iter()
        .filter(|i| i.token_ids.len() > 128)
        .cloned()
        .collect();
    assert!(long.len() >= 3, "{} long items", long.len());
    for precision in [Precision::Int8, Precision::Fp32] {
        let f32_attention = alone(&embedder(precision, None, 1), &long);
        for (attention, _) in QUANTIZED_ATTENTION {
            let quantized = alone(&embedder_with(precision, None, 1, attention), &long);
            let mut agreement = Agreement::new();
            for ((item, a), b) in long.iter().zip(&f32_attention).zip(&quantized) {
                assert_ne!(
                    a, b,
                    "{precision}: {} is the same with {attention} attention",
                    item.id
                );
                agreement.add(b, a);
            }
            println!(
                "{precision}, {attention} vs f32 attention, {} items over 128 tokens: \
                 {agreement:?}",
                long.len()
            );
            assert!(
                agreement.min_cosine >= 0.999,
                "{precision} {attention}: {agreement:?}"
            );
        }
    }
}

/// The file-system-free constructor (WebAssembly's) reads the same bytes the same way.
#[test]
fn from_bytes_gives_the_bits_of_from_dir() {
    let dir = tiny_model_dir();
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let builder = ruri_native::builder().threads(1);
    let backend = ruri_native::NativeBackend::from_bytes(&builder, &config, bytes).unwrap();
    let folder = ruri_core::ModelDir::open(&dir).unwrap();
    let e = TextEmbedder::new(
        folder.tokenizer().unwrap(),
        folder.prompts().clone(),
        backend,
        None,
    )
    .unwrap();
    let reference = Reference::tiny();
    let expected = alone(&builder.build_from_dir(&dir).unwrap(), &reference.items);
    assert_eq!(alone(&e, &reference.items), expected);
}

/// A row without tokens (all padding), which the pipeline never sends but the `Backend`
/// trait lets a caller build, is no panic, and the rows beside it keep the bits they have
/// alone; a batch of one such row is no panic either.
#[test]
fn a_row_without_tokens_changes_no_other_row() {
    use ruri_core::{Backend, BackendOutput, PaddedBatch};
    let folder = ruri_core::ModelDir::open(tiny_model_dir()).unwrap();
    let text = [1u32, 40, 41, 42, 43, 44, 45, 46, 47, 2];
    for precision in [Precision::Int8, Precision::Fp32] {
        for threads in [1, 2] {
            let builder = ruri_native::builder().precision(precision).threads(threads);
            let backend = ruri_native::NativeBackend::load(&folder, &builder).unwrap();
            let pooled = |rows: &[&[u32]]| match backend
                .forward(&PaddedBatch::new(rows.iter().copied(), 3))
            {
                Ok(BackendOutput::Pooled(p)) => p,
                other => panic!("{precision:?}: {other:?}"),
            };
            let bits =
                |v: ndarray::ArrayView1<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let alone = pooled(&[&text]);
            let mixed = pooled(&[&[], &text, &[]]);
            assert_eq!(mixed.nrows(), 3);
            assert_eq!(
                bits(mixed.row(1)),
                bits(alone.row(0)),
                "{precision:?}, {threads} threads"
            );
            assert_eq!(pooled(&[&[]]).nrows(), 1);
        }
    }
}

/// A call of many small batches keeps one batch per worker in flight (the backend's
/// `parallelism` is its thread count): every vector comes back in input order with the bits
/// it has alone, int8 and fp32, on 1, 2 and 3 threads.
#[test]
fn batches_in_flight_keep_the_order_and_the_bits() {
    use ruri_core::Backend;
    let reference = Reference::tiny();
    // Texts in input order, each with its prompt written in, and three copies of the list:
    // 2 texts a batch gives many batches, sorted by length, so that the batches finish out of
    // input order.
    let texts: Vec<String> = (0..3)
        .flat_map(|_| &reference.items)
        .map(|i| format!("{}{}", i.prompt, i.text))
        .collect();
    for precision in [Precision::Int8, Precision::Fp32] {
        for threads in [1, 2, 3] {
            let e = ruri_native::builder()
                .precision(precision)
                .threads(threads)
                .batching(BatchOptions::default().max_batch_size(2))
                .build_from_dir(tiny_model_dir())
                .unwrap();
            let backend = e.backend_as::<ruri_native::NativeBackend>().unwrap();
            assert_eq!(backend.parallelism(), threads, "{precision:?}");
            let all = e
                .embed_with(&texts, &EmbedOptions::new(Task::None))
                .unwrap();
            for (i, text) in texts.iter().enumerate() {
                let one = e
                    .embed_with(&[text.as_str()], &EmbedOptions::new(Task::None))
                    .unwrap();
                assert_eq!(
                    all.get(i).unwrap(),
                    one.get(0).unwrap(),
                    "{precision:?}, {threads} threads, text {i}"
                );
            }
        }
    }
}
