//! `CompactUnigram` against the `tokenizers` crate's own Unigram model: the same tokens (id,
//! string, offsets) or the same failure, on random vocabularies built to provoke every rule of
//! the search (ties, duplicate spellings, unknown characters, byte fallback, no unk id, the
//! empty piece), and on the committed tiny model with random Unicode text.

use proptest::prelude::*;
use ruri_testkit::{Reference, tiny_model_dir};
use ruri_tokenize::{CompactUnigram, Tokenizer, Truncation};
use tokenizers::Model;
use tokenizers::models::unigram::Unigram;

/// Characters of 1, 2, 3 and 4 bytes; the vocabularies are built from the first five, texts
/// also use the last two, which no piece spells.
const ALPHABET: [char; 7] = ['a', 'b', 'é', 'あ', '😀', 'x', 'ん'];

fn piece() -> impl Strategy<Value = String> {
    proptest::collection::vec(0usize..5, 0..4)
        .prop_map(|ix| ix.into_iter().map(|i| ALPHABET[i]).collect())
}

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(0usize..ALPHABET.len(), 0..24)
        .prop_map(|ix| ix.into_iter().map(|i| ALPHABET[i]).collect())
}

/// Few distinct scores, so equal-score paths (ties) are common.
fn score() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(-1.0), Just(-2.0), Just(-2.5), -8.0f64..0.0]
}

#[derive(Debug, Clone)]
struct Vocab {
    pieces: Vec<(String, f64)>,
    unk_id: Option<usize>,
    byte_fallback: bool,
}

fn vocab() -> impl Strategy<Value = Vocab> {
    (
        proptest::collection::vec((piece(), score()), 1..24),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(mut pieces, has_unk, byte_fallback, byte_pieces, at)| {
            if byte_pieces {
                // The byte pieces of 'x' (one byte) and 'ん' (three bytes), but not all of
                // the latter's: 'ん' then falls back to <unk>.
                pieces.push(("<0x78>".to_owned(), -5.0));
                pieces.push(("<0xE3>".to_owned(), -5.0));
                pieces.push(("<0x82>".to_owned(), -5.0));
            }
            let unk_id = has_unk.then(|| {
                let id = at.index(pieces.len() + 1);
                pieces.insert(id, ("<unk>".to_owned(), 0.0));
                id
            });
            Vocab {
                pieces,
                unk_id,
                byte_fallback,
            }
        })
}

/// A token as a comparable tuple: id, string, byte offsets.
type Tok = (u32, String, (usize, usize));

/// Tokens as comparable tuples, or the failure.
fn run<M: Model>(model: &M, text: &str) -> Result<Vec<Tok>, ()> {
    model
        .tokenize(text)
        .map(|tokens| {
            tokens
                .into_iter()
                .map(|t| (t.id, t.value, t.offsets))
                .collect()
        })
        .map_err(|_| ())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn same_tokens_as_the_tokenizers_unigram(v in vocab(), texts in proptest::collection::vec(text(), 1..8)) {
        let stock = Unigram::from(v.pieces.clone(), v.unk_id, v.byte_fallback).unwrap();
        let compact = CompactUnigram::new(
            v.pieces.iter().map(|(p, s)| (p.as_str(), *s)),
            v.unk_id,
            v.byte_fallback,
        )
        .unwrap();
        for text in &texts {
            prop_assert_eq!(run(&compact, text), run(&stock, text), "text {:?}", text);
        }
        for (piece, _) in &v.pieces {
            prop_assert_eq!(compact.token_to_id(piece), stock.token_to_id(piece));
        }
        for id in 0..=v.pieces.len() as u32 {
            prop_assert_eq!(compact.id_to_token(id), stock.id_to_token(id));
        }
        prop_assert_eq!(compact.get_vocab(), stock.get_vocab());
        prop_assert_eq!(compact.get_vocab_size(), stock.get_vocab_size());
    }
}

/// Stems of 7 to 9 bytes put in front of pieces, so that many pieces share their first 8
/// bytes (the index visits pieces in the order of those bytes and skips what each shares
/// with the one before): ties, pieces that are prefixes of the next, equal spellings, and
/// shared bytes that stop inside a character ('あ' and 'ん' share their first byte).
const STEMS: [&str; 5] = ["", "ああa", "aaaaaaaa", "😀😀b", "ん"];

fn stemmed_piece() -> impl Strategy<Value = String> {
    (0usize..STEMS.len(), piece()).prop_map(|(stem, piece)| format!("{}{piece}", STEMS[stem]))
}

fn stemmed_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            (0usize..STEMS.len()).prop_map(|i| STEMS[i].to_owned()),
            (0usize..ALPHABET.len()).prop_map(|i| ALPHABET[i].to_string()),
        ],
        0..16,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn long_shared_prefixes_get_the_same_tokens(
        pieces in proptest::collection::vec((stemmed_piece(), score()), 1..32),
        texts in proptest::collection::vec(stemmed_text(), 1..8),
    ) {
        let mut pieces = pieces;
        pieces.insert(0, ("<unk>".to_owned(), 0.0));
        let stock = Unigram::from(pieces.clone(), Some(0), false).unwrap();
        let compact =
            CompactUnigram::new(pieces.iter().map(|(p, s)| (p.as_str(), *s)), Some(0), false)
                .unwrap();
        for text in &texts {
            prop_assert_eq!(run(&compact, text), run(&stock, text), "text {:?}", text);
        }
        for (piece, _) in &pieces {
            prop_assert_eq!(compact.token_to_id(piece), stock.token_to_id(piece));
            // Every prefix, pieces or not, as the stock model sees it.
            for (at, _) in piece.char_indices().skip(1) {
                prop_assert_eq!(compact.token_to_id(&piece[..at]), stock.token_to_id(&piece[..at]));
            }
        }
    }
}

#[test]
fn refuses_what_cannot_work() {
    let err = CompactUnigram::new([], None, false).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let err = CompactUnigram::new([("a", -1.0)], Some(1), false).unwrap_err();
    assert!(err.to_string().contains("unk_id 1"), "{err}");
    // A character no piece covers, without an unk id: an error, as in `tokenizers`.
    let model = CompactUnigram::new([("a", -1.0)], None, false).unwrap();
    assert!(model.tokenize("ab").is_err());
    assert_eq!(model.tokenize("aa").unwrap().len(), 2);
}

#[test]
fn serializes_like_the_tokenizers_unigram() {
    let pieces = [("<unk>", 0.0), ("a", -1.5), ("あい", -2.0)];
    let compact = CompactUnigram::new(pieces, Some(0), true).unwrap();
    let stock = Unigram::from(
        pieces.iter().map(|&(p, s)| (p.to_owned(), s)).collect(),
        Some(0),
        true,
    )
    .unwrap();
    let json = serde_json::to_value(&compact).unwrap();
    assert_eq!(json, serde_json::to_value(&stock).unwrap());
    let back: CompactUnigram = serde_json::from_value(json).unwrap();
    assert_eq!(run(&back, "aあいa"), run(&stock, "aあいa"));
}

fn tiny_pair() -> (Tokenizer, tokenizers::Tokenizer) {
    let json = std::fs::read(tiny_model_dir().join("tokenizer.json")).unwrap();
    let ours = Tokenizer::from_json(&json, Reference::tiny().max_seq_length, None).unwrap();
    let mut stock = tokenizers::Tokenizer::from_file(tiny_model_dir().join("tokenizer.json"))
        .expect("the committed tiny tokenizer loads with the tokenizers crate");
    stock.with_truncation(None).unwrap();
    stock.with_padding(None);
    (ours, stock)
}

#[test]
fn the_ruri_tokenizer_runs_on_the_compact_model_with_the_same_ids() {
    let (ours, stock) = tiny_pair();
    assert!(ours.uses_compact_unigram());
    let ours = ours.with_max_length(1_000_000).unwrap();
    for item in Reference::tiny().items {
        let input = format!("{}{}", item.prompt, item.text);
        let expected = stock.encode(input.as_str(), true).unwrap();
        let got = ours
            .encode(&item.prompt, &item.text, Truncation::Error)
            .unwrap();
        assert_eq!(got.ids(), expected.get_ids(), "{}", item.id);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_unicode_gets_the_same_ids(text in "\\PC{0,300}") {
        static PAIR: std::sync::OnceLock<(Tokenizer, tokenizers::Tokenizer)> =
            std::sync::OnceLock::new();
        let (ours, stock) = PAIR.get_or_init(|| {
            let (ours, stock) = tiny_pair();
            (ours.with_max_length(1_000_000).unwrap(), stock)
        });
        let got = ours.encode("", &text, Truncation::Error).unwrap();
        let expected = stock.encode(text.as_str(), true).unwrap();
        prop_assert_eq!(got.ids(), expected.get_ids());
    }
}

#[test]
fn other_model_types_load_with_the_tokenizers_crate() {
    // The tiny tokenizer with its model replaced by a WordLevel one.
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tiny_model_dir().join("tokenizer.json")).unwrap())
            .unwrap();
    json["model"] = serde_json::json!({
        "type": "WordLevel",
        "vocab": {"<s>": 1, "</s>": 2, "<pad>": 3, "<unk>": 0, "▁a": 4},
        "unk_token": "<unk>"
    });
    let tok = Tokenizer::from_json(&serde_json::to_vec(&json).unwrap(), 16, None).unwrap();
    assert!(!tok.uses_compact_unigram());
    assert_eq!(tok.token_to_id("<pad>"), Some(3));
    let enc = tok.encode("", "b", Truncation::Error).unwrap();
    assert_eq!(enc.ids(), &[1, 0, 2]);
}
