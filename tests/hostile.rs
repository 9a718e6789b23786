//! Hostile inputs on every graph and backend a user can get by default or by one option
//! (ort's ONNX files fp32 and int8, ort's fused graph fp32 and int8 — ort's default graph —,
//! candle f32, native fp32 and int8 — the default backend):
//! each test is a row of docs/hostile-inputs.md. A text gets a typed error or a correct
//! vector, never a panic, never a dropped or reordered item. "Correct" means equal to
//! Python: the expected token ids and vectors come from testdata/reference/tiny.json and
//! tiny_hostile.json (made by sentence-transformers and onnxruntime-Python, see
//! testdata/README.md), never from ruri.

use std::sync::OnceLock;

use ruri::ort::Precision;
use ruri::{EmbedOptions, Embedder, Embeddings, Error, Task, Truncation};
use ruri_testkit::{Item, Reference, Vectors, cosine, max_abs_diff, tiny_model_dir};

/// The tiny model's maximum length (`sentence_bert_config.json`).
const MAX: usize = 512;

/// One backend × precision and how close it must come to Python (the tolerances of
/// tests/parity.rs, which explains them).
struct Backend {
    name: &'static str,
    embedder: Box<dyn Embedder>,
    /// The Python vector of a text embedded alone.
    reference: fn(&Item) -> &Vectors,
    /// Largest |Δ| of a normalized vector embedded alone.
    alone_max_abs_diff: f64,
    /// Smallest cosine to `reference` inside a mixed-length batch: int8 vectors depend on
    /// their batch neighbours (dynamic quantization), fp32 ones do not.
    in_batch_min_cosine: f64,
}

fn backends() -> &'static [Backend] {
    static BACKENDS: OnceLock<Vec<Backend>> = OnceLock::new();
    BACKENDS.get_or_init(|| {
        let ort = |precision| -> Box<dyn Embedder> {
            Box::new(
                ruri::ort::builder()
                    .graph(ruri::ort::Graph::OnnxFile)
                    .precision(precision)
                    .build_from_dir(tiny_model_dir())
                    .unwrap(),
            )
        };
        let fused = |precision| -> Box<dyn Embedder> {
            Box::new(
                ruri::ort::builder()
                    .graph(ruri::ort::Graph::Fused)
                    .precision(precision)
                    .build_from_dir(tiny_model_dir())
                    .unwrap(),
            )
        };
        let native = |precision| -> Box<dyn Embedder> {
            Box::new(
                ruri::native::builder()
                    .precision(precision)
                    .build_from_dir(tiny_model_dir())
                    .unwrap(),
            )
        };
        vec![
            Backend {
                name: "ort fp32",
                embedder: ort(Precision::Fp32),
                reference: |i| &i.st_fp32,
                alone_max_abs_diff: 1e-5,
                in_batch_min_cosine: 0.99999,
            },
            Backend {
                name: "ort int8",
                embedder: ort(Precision::Int8),
                reference: |i| &i.ort_int8,
                // Equal to onnxruntime-Python where the int8 kernels are the reference
                // machine's; elsewhere within the quantization error (tests/parity.rs).
                alone_max_abs_diff: if Reference::tiny().int8_kernels_match() {
                    1e-5
                } else {
                    5e-2
                },
                in_batch_min_cosine: 0.995,
            },
            Backend {
                name: "ort fused fp32",
                embedder: fused(Precision::Fp32),
                reference: |i| &i.st_fp32,
                alone_max_abs_diff: 1e-5,
                in_batch_min_cosine: 0.99999,
            },
            Backend {
                name: "ort fused int8",
                embedder: fused(Precision::Int8),
                // The quantization error against fp32 (tests/parity.rs, FUSED_INT8_VS_ST:
                // max |Δ| 2.5e-2, min cosine 0.99792 measured); per-row activation scales, so
                // a batch changes the vector by float summation order only.
                reference: |i| &i.st_fp32,
                alone_max_abs_diff: 5e-2,
                in_batch_min_cosine: 0.995,
            },
            Backend {
                name: "candle f32",
                embedder: Box::new(
                    ruri::candle::builder()
                        .build_from_dir(tiny_model_dir())
                        .unwrap(),
                ),
                reference: |i| &i.st_fp32,
                alone_max_abs_diff: 1e-5,
                in_batch_min_cosine: 0.99999,
            },
            Backend {
                name: "native fp32",
                embedder: native(ruri::native::Precision::Fp32),
                reference: |i| &i.st_fp32,
                alone_max_abs_diff: 1e-5,
                in_batch_min_cosine: 0.99999,
            },
            Backend {
                name: "native int8",
                embedder: native(ruri::native::Precision::Int8),
                // The quantization error against fp32 (ruri-native/tests/parity.rs measures
                // max |Δ| 1.1e-2 on the committed inputs); batches change no bit.
                reference: |i| &i.st_fp32,
                alone_max_abs_diff: 5e-2,
                in_batch_min_cosine: 0.995,
            },
        ]
    })
}

/// The item's prompt, as its text (equal to the named task: ruri-core/tests/pipeline.rs).
fn task_of(item: &Item) -> Task {
    Task::Prompt(item.prompt.clone())
}

/// The reference items with these ids, from either reference file.
fn items(ids: &[&str]) -> Vec<Item> {
    let (tiny, hostile) = (Reference::tiny(), Reference::tiny_hostile());
    ids.iter()
        .map(|id| {
            tiny.items
                .iter()
                .chain(&hostile.items)
                .find(|i| i.id == *id)
                .unwrap_or_else(|| panic!("no reference item {id:?}"))
                .clone()
        })
        .collect()
}

/// Python's token count and truncation flag for `item` at row `i` of `e`, and a finite unit
/// vector; returns the vector.
fn checked_row<'e>(e: &'e Embeddings, i: usize, item: &Item, at: &str) -> &'e [f32] {
    assert_eq!(e.tokens(i), Some(item.token_ids.len()), "{at}");
    assert_eq!(e.truncated(i), Some(item.truncated), "{at}");
    let v = e.get(i).unwrap();
    assert!(v.iter().all(|x| x.is_finite()), "{at}: {v:?}");
    let norm = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{at}: norm {norm}");
    v
}

/// Each item alone and all of them in one call (between ordinary sentences, so batches mix
/// lengths) on every backend: Python's token count, truncation flag and vector, in order.
fn check_against_python(ids: &[&str]) {
    let items = items(ids);
    for b in backends() {
        for item in &items {
            let at = format!("{} {}", b.name, item.id);
            let e = b.embedder.embed(&[&item.text], task_of(item)).unwrap();
            assert_eq!(e.len(), 1, "{at}");
            let v = checked_row(&e, 0, item, &at);
            let diff = max_abs_diff(v, &(b.reference)(item).normalized);
            assert!(
                diff <= b.alone_max_abs_diff,
                "{at}: max |Δ| {diff} to Python"
            );
        }

        // The prompt written into the text, so one call can mix every prompt.
        let filler = "瑠璃色はどんな色？";
        let mut texts = Vec::new();
        for item in &items {
            texts.push(filler.to_owned());
            texts.push(format!("{}{}", item.prompt, item.text));
        }
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let all = b.embedder.embed(&refs, Task::None).unwrap();
        assert_eq!(all.len(), texts.len(), "{}", b.name);
        for (k, item) in items.iter().enumerate() {
            let at = format!("{} {} in a batch", b.name, item.id);
            let v = checked_row(&all, 2 * k + 1, item, &at);
            let c = cosine(v, &(b.reference)(item).normalized);
            assert!(c >= b.in_batch_min_cosine, "{at}: cosine {c} to Python");
        }
    }
}

#[test]
fn empty_batch_gives_an_empty_result() {
    for b in backends() {
        for options in [
            EmbedOptions::new(Task::Query),
            EmbedOptions::new(Task::None)
                .truncation(Truncation::Error)
                .normalize(false),
        ] {
            let e = b.embedder.embed_with(&[], &options).unwrap();
            assert!(e.is_empty(), "{}", b.name);
            assert_eq!(e.dim(), 64, "{}", b.name);
            assert!(e.as_slice().is_empty() && e.token_counts().is_empty());
            assert_eq!(e.iter().count(), 0);
        }
    }
}

/// `""` is `<s></s>` (with a prompt, `<s>` prompt `</s>`): a normal unit vector, as in Python.
#[test]
fn empty_string_is_a_normal_vector() {
    check_against_python(&["empty", "empty_with_query_prompt"]);
    assert_eq!(items(&["empty"])[0].token_ids, [1, 2]);
}

#[test]
fn whitespace_only_is_a_normal_vector() {
    check_against_python(&[
        "single_space",
        "whitespace_only",
        "newline_only",
        "crlf_only",
    ]);
}

#[test]
fn nul_bytes_are_ordinary_byte_tokens() {
    check_against_python(&[
        "nul_only",
        "nul_between_words",
        "nul_run",
        "nul_with_query_prompt",
    ]);
}

#[test]
fn control_and_invisible_characters_are_kept() {
    check_against_python(&[
        "c0_and_del_controls",
        "bom_and_zero_widths",
        "variation_selectors",
        "noncharacters_and_private_use",
        "replacement_characters",
        "bidi_and_line_separators",
        "literal_special_tokens",
    ]);
}

#[test]
fn lone_combining_marks_are_kept() {
    check_against_python(&[
        "combining_acute_alone",
        "combining_marks_alone",
        "combining_kana_marks_alone",
        "combining_mark_first",
    ]);
}

/// Under the default policy: Python's truncated ids and vectors, flagged; under
/// `Truncation::Error`: the first text over the maximum is named and nothing is returned.
#[test]
fn over_the_maximum_length_under_each_policy() {
    check_against_python(&[
        "over_max_seq_len_700",
        "over_max_seq_len_1500",
        "repeated_char",
        "ideographic_spaces_over_max",
        "combining_marks_over_max",
    ]);

    // Exactly at the limit is accepted; one token more is refused. "あ" is one token per
    // character (Python: 600 × "あ" has 602 tokens with <s> and </s>).
    let [repeated, short] = &items(&["repeated_char", "plain_sentence"])[..] else {
        unreachable!()
    };
    assert_eq!(repeated.untruncated_token_ids.len(), 602);
    let at_limit = "あ".repeat(MAX - 2);
    let over = "あ".repeat(MAX - 1);
    let refuse = EmbedOptions::new(Task::None).truncation(Truncation::Error);
    for b in backends() {
        let e = b.embedder.embed_with(&[&at_limit], &refuse).unwrap();
        assert_eq!((e.tokens(0), e.truncated(0)), (Some(MAX), Some(false)));

        let texts = [short.text.as_str(), &over, &at_limit, &over];
        match b.embedder.embed_with(&texts, &refuse) {
            Err(Error::InputTooLong { index, tokens, max }) => {
                assert_eq!((index, tokens, max), (1, MAX + 1, MAX), "{}", b.name);
            }
            other => panic!("{}: expected InputTooLong, got {other:?}", b.name),
        }
        let e = b.embedder.embed(&texts, Task::None).unwrap();
        assert_eq!(
            e.truncated_flags(),
            [false, true, false, true],
            "{}",
            b.name
        );
        let short_len = short.token_ids.len();
        assert_eq!(e.token_counts(), [short_len, MAX, MAX, MAX], "{}", b.name);
        // The prompt counts towards the maximum.
        match b
            .embedder
            .embed_with(&[&at_limit], &refuse.clone().task(Task::Query))
        {
            Err(Error::InputTooLong { index: 0, .. }) => {}
            other => panic!("{}: expected InputTooLong, got {other:?}", b.name),
        }
    }
}

/// A 1 MiB text is tokenized whole (to report its length) and truncated to Python's first
/// 511 tokens + `</s>`; under `Truncation::Error` it is refused with its full token count.
#[test]
fn one_megabyte_text_is_truncated_like_python() {
    let [repeated, mixed] = &items(&["repeated_char", "over_max_seq_len_1500"])[..] else {
        unreachable!()
    };
    // A run of "あ" (one token each) truncates to exactly the ids of Python's 600-character
    // run; the mixed text repeated keeps the segmentation of its first 511 tokens.
    let run = "あ".repeat((1 << 20) / "あ".len() + 1);
    let mixed_text = mixed.text.repeat((1 << 20) / mixed.text.len() + 1);
    assert!(run.len() >= 1 << 20 && mixed_text.len() >= 1 << 20);
    for b in backends() {
        for (item, text) in [(repeated, &run), (mixed, &mixed_text)] {
            let e = b
                .embedder
                .embed(&["短い文", text, "短い文"], task_of(item))
                .unwrap();
            let at = format!("{} {} × {} bytes", b.name, item.id, text.len());
            assert_eq!(e.len(), 3, "{at}");
            assert_eq!(e.truncated_flags(), [false, true, false], "{at}");
            let twins = max_abs_diff(e.get(0).unwrap(), e.get(2).unwrap());
            assert!(twins <= 1e-6, "{at}: the same short text, |Δ| {twins}");
            let v = checked_row(&e, 1, item, &at);
            let c = cosine(v, &(b.reference)(item).normalized);
            assert!(c >= b.in_batch_min_cosine, "{at}: cosine {c} to Python");
        }
    }
    // The policy is applied before any backend runs: one backend shows it.
    let refuse = EmbedOptions::new(Task::None).truncation(Truncation::Error);
    match backends()[0]
        .embedder
        .embed_with(&["短い文", &run], &refuse)
    {
        Err(Error::InputTooLong { index, tokens, max }) => {
            assert_eq!((index, tokens, max), (1, run.chars().count() + 2, MAX));
        }
        other => panic!("expected InputTooLong, got {other:?}"),
    }
}

/// 100,000 texts in one call (ort fp32; about 20 s in a debug build on 2 cores): every one
/// comes back, in its place, equal to the same text embedded alone.
#[test]
fn hundred_thousand_texts_in_one_call() {
    let distinct: Vec<String> = (0..64)
        .map(|k| format!("{k}番目{}", "の瑠璃".repeat(k % 4)))
        .collect();
    // A scrambled but known order, so a swap between different texts shows.
    let pick = |i: usize| (i.wrapping_mul(2_654_435_761) >> 7) % distinct.len();
    let texts: Vec<&str> = (0..100_000).map(|i| distinct[pick(i)].as_str()).collect();
    let embedder = &backends()[0].embedder;
    let alone: Vec<_> = distinct
        .iter()
        .map(|t| embedder.embed(&[t.as_str()], Task::None).unwrap())
        .collect();
    let all = embedder.embed(&texts, Task::None).unwrap();
    assert_eq!(all.len(), texts.len());
    for (i, v) in all.iter().enumerate() {
        let expected = &alone[pick(i)];
        assert_eq!(all.tokens(i), expected.tokens(0), "text {i}");
        let diff = max_abs_diff(v, expected.get(0).unwrap());
        assert!(
            diff <= 1e-6,
            "text {i}: max |Δ| {diff} to the same text alone"
        );
    }
}
