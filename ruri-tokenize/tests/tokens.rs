//! `Tokenizer::tokens_with` (what a `/tokenize` endpoint shows) against Python's `tokenizers`
//! 0.23.3: ids, special-token mask and byte offsets of every committed input up to 300
//! characters, with and without special tokens. Expected values come from
//! `testdata/reference/tiny_tokens.json` (`tools/testdata/make_token_references.py`).

use ruri_testkit::{Reference, testdata_dir, tiny_model_dir};
use ruri_tokenize::{Token, Tokenizer, Truncation, Whitespace, strip_python};
use serde_json::Value;

fn tokenizer() -> Tokenizer {
    let json = std::fs::read(tiny_model_dir().join("tokenizer.json")).unwrap();
    Tokenizer::from_json(&json, Reference::tiny().max_seq_length, None)
        .expect("the committed tiny model loads")
}

fn token_reference() -> Value {
    let path = testdata_dir().join("reference/tiny_tokens.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A token as text-embeddings-inference answers it: `(id, text, special, start, stop)`, where
/// a special token's text is its piece and any other's the bytes of its range.
fn tei_view(joined: &str, token: &Token) -> (u64, String, bool, Option<u64>, Option<u64>) {
    let id = u64::from(token.id());
    match token.offsets() {
        None => (id, token.piece().to_owned(), token.is_special(), None, None),
        Some(range) => (
            id,
            String::from_utf8_lossy(&joined.as_bytes()[range.clone()]).into_owned(),
            token.is_special(),
            Some(range.start as u64),
            Some(range.end as u64),
        ),
    }
}

fn python_view(token: &Value) -> (u64, String, bool, Option<u64>, Option<u64>) {
    (
        token["id"].as_u64().unwrap(),
        token["text"].as_str().unwrap().to_owned(),
        token["special"].as_bool().unwrap(),
        token["start"].as_u64(),
        token["stop"].as_u64(),
    )
}

#[test]
fn tokens_equal_python_for_every_input() {
    let tok = tokenizer();
    let reference = token_reference();
    let items = reference["items"].as_array().unwrap();
    assert!(items.len() >= 60, "{} items", items.len());
    let mut mismatches = Vec::new();
    for item in items {
        let (prompt, text) = (
            item["prompt"].as_str().unwrap(),
            item["text"].as_str().unwrap(),
        );
        let add_special_tokens = item["add_special_tokens"].as_bool().unwrap();
        let joined = format!("{prompt}{text}");
        let ours: Vec<_> = tok
            .tokens_with(0, prompt, text, add_special_tokens, Whitespace::Keep)
            .unwrap()
            .iter()
            .map(|t| tei_view(&joined, t))
            .collect();
        let python: Vec<_> = item["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(python_view)
            .collect();
        if ours != python {
            mismatches.push(format!(
                "{} (special tokens {add_special_tokens}):\n  rust   {ours:?}\n  python {python:?}",
                item["id"]
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// With special tokens, the ids are the model's (`encode_with`, which the parity test checks
/// against sentence-transformers) for every text that fits; nothing is truncated past it.
#[test]
fn ids_are_the_models_and_nothing_is_truncated() {
    let tok = tokenizer();
    for item in &Reference::tiny().items {
        let tokens = tok
            .tokens_with(0, &item.prompt, &item.text, true, Whitespace::Keep)
            .unwrap();
        let ids: Vec<u32> = tokens.iter().map(Token::id).collect();
        assert_eq!(ids, item.untruncated_token_ids, "{}", item.id);
        if !item.truncated {
            let encoding = tok
                .encode(&item.prompt, &item.text, Truncation::Error)
                .unwrap();
            assert_eq!(ids, encoding.ids(), "{}", item.id);
        }
    }
}

/// Under `Whitespace::Strip` the offsets still index prompt + text as given: the ranges of
/// the non-special tokens, in order and without repeats (byte pieces share one), cover
/// exactly the stripped string.
#[test]
fn stripped_offsets_index_the_text_as_given() {
    let tok = tokenizer();
    for (prompt, text) in [
        ("", "   前後に空白があります   "),
        ("検索クエリ: ", ""),
        ("検索文書: ", "\u{3000}瑠璃色の石\n"),
        ("", " \t\n  \u{3000} "),
        ("", "\u{1c}猫😀"),
        ("", "猫"),
    ] {
        let joined = format!("{prompt}{text}");
        let tokens = tok
            .tokens_with(0, prompt, text, true, Whitespace::Strip)
            .unwrap();
        let mut covered = String::new();
        let mut last = None;
        for range in tokens.iter().filter_map(Token::offsets) {
            if last.as_ref() != Some(&range) {
                covered.push_str(&joined[range.clone()]);
                last = Some(range);
            }
        }
        assert_eq!(covered, strip_python(&joined), "{joined:?}");
        assert_eq!(tokens.first().map(Token::piece), Some("<s>"), "{joined:?}");
        assert_eq!(tokens.last().map(Token::piece), Some("</s>"), "{joined:?}");
    }
}
