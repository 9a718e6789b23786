//! The tokenizer alone, against the `tokenizers` crate's own Unigram model (the engine
//! Python's transformers runs): the same ids for prompt + text, truncation as
//! sentence-transformers does it (the first `max − 1` ids, then `</s>`), at the model's
//! maximum length and at a small one; `Truncation::Error` refusing exactly the long texts.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use ruri_fuzz::{Request, tiny_model_dir};
use ruri_tokenize::{TokenizeError, Tokenizer, Truncation};

fn ruri() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        ruri_core::ModelDir::open(tiny_model_dir())
            .and_then(|dir| dir.tokenizer())
            .expect("the tiny model")
    })
}

/// Tokenizers with the small maximum lengths `Request` can ask for, made once.
fn with_max_length(max: usize) -> &'static Tokenizer {
    static SMALL: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    let small = SMALL.get_or_init(|| {
        (0..16)
            .map(|k| ruri().clone().with_max_length(3 + k * 3).expect("above 2"))
            .collect()
    });
    &small[(max - 3) / 3]
}

fn reference() -> &'static tokenizers::Tokenizer {
    static TOKENIZER: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        tokenizers::Tokenizer::from_file(tiny_model_dir().join("tokenizer.json"))
            .expect("the tiny model's tokenizer.json")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some(request) = Request::decode(data) else {
        return;
    };
    for tokenizer in [ruri(), with_max_length(request.small_max_length)] {
        let max = tokenizer.max_length();
        for (index, text) in request.texts.iter().enumerate() {
            let expected = reference()
                .encode(format!("{}{text}", request.prompt), true)
                .expect("tokenizers encodes any text");
            let expected = expected.get_ids();
            let encoding = tokenizer
                .encode(request.prompt, text, Truncation::Truncate)
                .expect("truncating never fails");
            assert_eq!(encoding.untruncated_len(), expected.len(), "text {index}");
            if expected.len() <= max {
                assert_eq!(encoding.ids(), expected, "text {index}");
            } else {
                assert!(encoding.truncated());
                assert_eq!(encoding.len(), max);
                assert_eq!(&encoding.ids()[..max - 1], &expected[..max - 1]);
                assert_eq!(encoding.ids()[max - 1], 2, "ends with </s>");
            }
            match tokenizer.encode_at(index, request.prompt, text, Truncation::Error) {
                Ok(e) => assert_eq!(e.ids(), expected),
                Err(TokenizeError::InputTooLong {
                    index: i,
                    tokens,
                    max: m,
                }) => assert_eq!((i, tokens, m), (index, expected.len(), max)),
                Err(e) => panic!("unexpected error: {e:?}"),
            }
        }
    }
});
