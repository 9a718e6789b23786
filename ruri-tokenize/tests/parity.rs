//! Token-for-token parity with Python (sentence-transformers 6.2 over `tokenizers` 0.23) on
//! every committed input of `testdata/inputs.json`; expected ids come from
//! `testdata/reference/tiny.json`.

use ruri_testkit::{Reference, tiny_model_dir};
use ruri_tokenize::{PaddedBatch, TokenizeError, Tokenizer, Truncation};

fn tokenizer() -> Tokenizer {
    static TOKENIZER: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let json = std::fs::read(tiny_model_dir().join("tokenizer.json")).unwrap();
            Tokenizer::from_json(&json, Reference::tiny().max_seq_length, None)
                .expect("the committed tiny model loads")
        })
        .clone()
}

#[test]
fn reads_max_length_and_pad_id_from_the_folder() {
    let reference = Reference::tiny();
    let tok = tokenizer();
    assert_eq!(tok.max_length(), reference.max_seq_length);
    assert_eq!(tok.pad_id(), 3);
}

#[test]
fn ids_equal_python_for_every_input() {
    let reference = Reference::tiny();
    let tok = tokenizer();
    let mut mismatches = Vec::new();
    for item in &reference.items {
        let enc = tok
            .encode(&item.prompt, &item.text, Truncation::Truncate)
            .unwrap();
        if enc.ids() != item.token_ids.as_slice() {
            mismatches.push(format!(
                "{}: rust {:?}\n   python {:?}",
                item.id,
                enc.ids(),
                item.token_ids
            ));
        }
        assert_eq!(enc.truncated(), item.truncated, "{}", item.id);
        assert_eq!(
            enc.untruncated_len(),
            item.untruncated_token_ids.len(),
            "{}",
            item.id
        );
    }
    assert!(
        mismatches.is_empty(),
        "token ids differ:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn untruncated_ids_equal_python() {
    let reference = Reference::tiny();
    let tok = tokenizer().with_max_length(1_000_000).unwrap();
    for item in &reference.items {
        let enc = tok
            .encode(&item.prompt, &item.text, Truncation::Error)
            .unwrap();
        assert_eq!(
            enc.ids(),
            item.untruncated_token_ids.as_slice(),
            "{}",
            item.id
        );
        assert!(!enc.truncated());
    }
}

#[test]
fn the_reference_covers_truncation() {
    // Guards the tests above: without long inputs they would not test truncation at all.
    let reference = Reference::tiny();
    assert!(reference.items.iter().filter(|i| i.truncated).count() >= 2);
    let truncated = reference.items.iter().find(|i| i.truncated).unwrap();
    assert_eq!(truncated.token_ids.last(), Some(&2), "</s> is kept");
}

#[test]
fn error_policy_refuses_exactly_the_long_inputs() {
    let reference = Reference::tiny();
    let tok = tokenizer();
    for item in &reference.items {
        match tok.encode(&item.prompt, &item.text, Truncation::Error) {
            Ok(enc) => {
                assert!(!item.truncated, "{} should have been refused", item.id);
                assert_eq!(enc.ids(), item.token_ids.as_slice());
            }
            Err(TokenizeError::InputTooLong { index, tokens, max }) => {
                assert!(item.truncated, "{} refused but fits", item.id);
                assert_eq!(index, 0);
                assert_eq!(tokens, item.untruncated_token_ids.len());
                assert_eq!(max, reference.max_seq_length);
            }
            Err(e) => panic!("{}: unexpected error {e}", item.id),
        }
    }
}

#[test]
fn batch_encoding_names_the_failing_index_and_matches_single() {
    let reference = Reference::tiny();
    let tok = tokenizer();
    let texts: Vec<&str> = reference.items.iter().map(|i| i.text.as_str()).collect();
    // The prompt is written into the texts, so one batch call covers every reference item.
    let prompted: Vec<String> = reference
        .items
        .iter()
        .map(|i| format!("{}{}", i.prompt, i.text))
        .collect();
    let batch = tok
        .encode_batch("", &prompted, Truncation::Truncate)
        .unwrap();
    for (enc, item) in batch.iter().zip(&reference.items) {
        assert_eq!(enc.ids(), item.token_ids.as_slice(), "{}", item.id);
    }
    let first_long = batch.iter().position(|e| e.truncated()).unwrap();
    match tok.encode_batch("", &texts, Truncation::Error) {
        Err(TokenizeError::InputTooLong { index, .. }) => assert_eq!(index, first_long),
        other => panic!("expected InputTooLong, got {other:?}"),
    }
}

#[test]
fn padded_batch_of_reference_ids() {
    let reference = Reference::tiny();
    let tok = tokenizer();
    let seqs: Vec<&[u32]> = reference
        .items
        .iter()
        .map(|i| i.token_ids.as_slice())
        .collect();
    let batch = PaddedBatch::new(seqs.iter().copied(), tok.pad_id());
    let longest = seqs.iter().map(|s| s.len()).max().unwrap();
    assert_eq!((batch.batch_size(), batch.seq_len()), (seqs.len(), longest));
    for (row, seq) in seqs.iter().enumerate() {
        let ids = &batch.input_ids()[row * longest..(row + 1) * longest];
        let mask = &batch.attention_mask()[row * longest..(row + 1) * longest];
        for (j, (&id, &m)) in ids.iter().zip(mask).enumerate() {
            if j < seq.len() {
                assert_eq!((id, m), (i64::from(seq[j]), 1));
            } else {
                assert_eq!((id, m), (3, 0));
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Any Unicode text: no panic; `<s> … </s>` within the limit; the untruncated count is
    /// what truncation reports; the error policy refuses exactly the truncated ones.
    #[test]
    fn any_text_encodes_within_limits(text in "\\PC{0,400}", max in 3usize..64) {
        let tok = tokenizer().with_max_length(max).unwrap();
        let enc = tok.encode("検索クエリ: ", &text, Truncation::Truncate).unwrap();
        proptest::prop_assert!(enc.len() <= max);
        proptest::prop_assert_eq!(enc.ids().first(), Some(&1));
        proptest::prop_assert_eq!(enc.ids().last(), Some(&2));
        if enc.truncated() {
            proptest::prop_assert_eq!(enc.len(), max);
        } else {
            proptest::prop_assert_eq!(enc.len(), enc.untruncated_len());
        }
        let refused = tok.encode("検索クエリ: ", &text, Truncation::Error);
        proptest::prop_assert_eq!(refused.is_err(), enc.truncated());
    }
}
