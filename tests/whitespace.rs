//! The whitespace policy against two sentence-transformers versions: 6.2 keeps prompt + text
//! as given ([`Whitespace::Keep`]), 5.3 strips them with Python's `str.strip()`
//! ([`Whitespace::Strip`]). Expected ids and vectors come from
//! `testdata/reference/tiny_whitespace_{keep,strip}.json` (tools/testdata/generate_whitespace.sh,
//! two pinned Python environments), on `testdata/whitespace_inputs.json`: every character
//! Python strips, leading and trailing, look-alikes it keeps, and empty and whitespace-only
//! texts with each prompt.

use ruri::{EmbedOptions, Embedder, Task, Truncation, Whitespace};
use ruri_testkit::{Agreement, PolicyReference, tiny_model_dir};

/// The parity test's fp32 tolerance (tests/parity.rs): only summation order differs.
const FP32_MAX_ABS_DIFF: f64 = 1e-5;

fn references() -> [(Whitespace, PolicyReference); 2] {
    [
        (Whitespace::Keep, PolicyReference::keep()),
        (Whitespace::Strip, PolicyReference::strip()),
    ]
}

#[test]
fn the_references_are_what_their_names_say() {
    let [(_, keep), (_, strip)] = references();
    assert_eq!(keep.behaviour, "keep");
    assert_eq!(strip.behaviour, "strip");
    // Most inputs must differ between the versions, or the inputs test nothing.
    let differ = keep
        .items
        .iter()
        .zip(&strip.items)
        .filter(|(k, s)| {
            assert_eq!(k.id, s.id);
            k.token_ids != s.token_ids
        })
        .count();
    assert!(differ * 2 > keep.items.len(), "{differ} differ");
}

/// Python's whitespace is Unicode's White_Space plus U+001C–U+001F; every code point is
/// checked against the set the Python interpreters reported.
#[test]
fn python_whitespace_is_exactly_pythons() {
    for (_, reference) in references() {
        let python: std::collections::BTreeSet<u32> =
            reference.python_whitespace.iter().copied().collect();
        assert!(python.contains(&0x1c) && python.contains(&0x3000));
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            assert_eq!(
                ruri::tokenize::is_python_whitespace(c),
                python.contains(&u32::from(c)),
                "U+{:04X}",
                u32::from(c)
            );
        }
    }
}

#[test]
fn the_tokenizer_sees_what_sentence_transformers_fed_its_tokenizer() {
    let tokenizer = ruri::ModelDir::open(tiny_model_dir())
        .unwrap()
        .tokenizer()
        .unwrap();
    for (policy, reference) in references() {
        for item in &reference.items {
            assert_eq!(
                policy.apply(&item.prompt, &item.text),
                item.tokenized_text,
                "{policy:?} {}",
                item.id
            );
            let encoding = tokenizer
                .encode_with(0, &item.prompt, &item.text, Truncation::Truncate, policy)
                .unwrap();
            assert_eq!(encoding.ids(), item.token_ids, "{policy:?} {}", item.id);
        }
    }
}

fn backends(policy: Whitespace) -> Vec<(&'static str, Box<dyn Embedder>)> {
    vec![
        (
            "ort fp32",
            Box::new(
                ruri::ort::builder()
                    .whitespace(policy)
                    .build_from_dir(tiny_model_dir())
                    .unwrap(),
            ),
        ),
        (
            "candle f32",
            Box::new(
                ruri::candle::builder()
                    .whitespace(policy)
                    .build_from_dir(tiny_model_dir())
                    .unwrap(),
            ),
        ),
        (
            "native fp32",
            Box::new(
                ruri::native::builder()
                    .precision(ruri::native::Precision::Fp32)
                    .whitespace(policy)
                    .build_from_dir(tiny_model_dir())
                    .unwrap(),
            ),
        ),
    ]
}

/// The builder's policy applies to every call, and a call's own policy overrides it: each
/// backend is built with the *other* policy and overridden per call, then used as built.
#[test]
fn vectors_match_each_version_under_its_policy() {
    for (policy, reference) in references() {
        let other = match policy {
            Whitespace::Keep => Whitespace::Strip,
            _ => Whitespace::Keep,
        };
        for ((name, overridden), (_, as_built)) in backends(other).into_iter().zip(backends(policy))
        {
            let mut per_call = Agreement::new();
            let mut by_builder = Agreement::new();
            for item in &reference.items {
                let task = Task::Prompt(item.prompt.clone());
                let e = overridden
                    .embed_with(
                        &[&item.text],
                        &EmbedOptions::new(task.clone()).whitespace(policy),
                    )
                    .unwrap();
                assert_eq!(
                    e.tokens(0),
                    Some(item.token_ids.len()),
                    "{name} {}",
                    item.id
                );
                per_call.add(e.get(0).unwrap(), &item.st_fp32.normalized);
                let e = as_built.embed(&[&item.text], task).unwrap();
                by_builder.add(e.get(0).unwrap(), &item.st_fp32.normalized);
            }
            println!(
                "{name} {policy:?}: per call {per_call:?}, by builder {by_builder:?} ({} inputs)",
                reference.items.len()
            );
            for agreement in [per_call, by_builder] {
                assert!(
                    agreement.max_abs_diff <= FP32_MAX_ABS_DIFF,
                    "{name} {policy:?}: {agreement:?}"
                );
            }
        }
    }
}
