//! Tokenization for the Ruri v3 embedding models, token-for-token equal to Python.
//!
//! Ruri v3 models ship a Hugging Face `tokenizer.json` (SentencePiece Unigram with byte
//! fallback, `Metaspace` with `prepend_scheme: "never"`, post-processor `<s> $A </s>`).
//! This crate loads it with the [`tokenizers`] crate, the same engine Python's
//! `transformers` uses, and adds what sentence-transformers does around it:
//!
//! * a **compact Unigram model** ([`CompactUnigram`]) in place of the crate's own: the same
//!   segmentation (ids equal, tested), but loading Ruri's 102,400 pieces takes milliseconds and
//!   a few MB instead of most of a cold start (figures in the repository's BENCHMARKS.md).
//!   Normalizer,
//!   pre-tokenizer, added tokens and post-processor remain the `tokenizers` crate's; a
//!   `tokenizer.json` with another model type (BPE, WordPiece) loads with the crate's model;
//! * the **prompt** (`"検索クエリ: "`, `"検索文書: "`, …) is prepended to the text as plain
//!   text before tokenizing, exactly as `SentenceTransformer.encode(prompt=…)` does;
//! * the **maximum length** (counting the special tokens) and the pad token are given by the
//!   caller: this crate reads `tokenizer.json`'s bytes and no file at all (`ruri-core`'s
//!   `ModelDir` resolves the length from the folder's configs as sentence-transformers does);
//! * **whitespace is an explicit policy** ([`Whitespace`]): prompt + text as given (the
//!   default, as sentence-transformers ≥ 5.4), or stripped exactly as Python's `str.strip()`
//!   (as sentence-transformers 2.x–5.3, which Ruri v3 was trained and evaluated with);
//! * **truncation is an explicit policy** ([`Truncation`]): either an error, or keep the first
//!   tokens and still end with `</s>` (what sentence-transformers does). Every
//!   [`Encoding`] reports whether it was truncated and how long it was before;
//! * **padding** into the flat `input_ids` / `attention_mask` buffers a backend consumes
//!   ([`PaddedBatch`]), with the model's pad id.
//!
//! ```
//! use ruri_tokenize::{Tokenizer, Truncation};
//!
//! # let json = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny/tokenizer.json")).unwrap();
//! // `json`: the bytes of a Ruri model's tokenizer.json.
//! let tokenizer = Tokenizer::from_json(&json, 512, None)?;
//! let query = tokenizer.encode("検索クエリ: ", "瑠璃色はどんな色？", Truncation::Truncate)?;
//! assert_eq!(query.ids().first(), Some(&1)); // <s>
//! assert!(!query.truncated());
//! # Ok::<(), ruri_tokenize::TokenizeError>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod batch;
mod error;
mod prefix_index;
mod unigram;
mod whitespace;

use tokenizers::{
    DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, TokenizerImpl,
    TruncationDirection,
};

pub use batch::PaddedBatch;
pub use error::{Result, TokenizeError};
pub use unigram::CompactUnigram;
pub use whitespace::{Whitespace, is_python_whitespace, strip_python};

/// A `tokenizers` pipeline around [`CompactUnigram`].
type CompactTokenizer = TokenizerImpl<
    CompactUnigram,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// The `tokenizers` pipeline: with the compact Unigram model (Ruri's case) or with any model
/// the crate knows.
#[derive(Debug, Clone)]
enum Engine {
    Compact(Box<CompactTokenizer>),
    Generic(Box<tokenizers::Tokenizer>),
}

/// Calls the same `TokenizerImpl` method whichever model the engine holds.
macro_rules! with_engine {
    ($engine:expr, $t:ident => $body:expr) => {
        match $engine {
            Engine::Compact($t) => $body,
            Engine::Generic($t) => $body,
        }
    };
}

impl Engine {
    /// Parses `tokenizer.json`: with the compact model when it is a Unigram model the compact
    /// one accepts, else with the crate's own model (whose error is reported if both fail).
    fn from_json(json: &[u8]) -> tokenizers::Result<Self> {
        match serde_json::from_slice::<CompactTokenizer>(json) {
            Ok(compact) => Ok(Engine::Compact(Box::new(compact))),
            Err(_) => Ok(Engine::Generic(Box::new(
                tokenizers::Tokenizer::from_bytes(json)?,
            ))),
        }
    }

    /// Whether the compact Unigram model is in use.
    fn is_compact(&self) -> bool {
        matches!(self, Engine::Compact(_))
    }
}

/// What to do with a text whose tokens (special tokens included) exceed the maximum length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Truncation {
    /// Keep the first `max_length - 2` tokens of prompt + text and end with `</s>`, as
    /// sentence-transformers does. The [`Encoding`] reports [`Encoding::truncated`].
    #[default]
    Truncate,
    /// Refuse the text with [`TokenizeError::InputTooLong`].
    Error,
}

/// The token ids of one text, as the model sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoding {
    ids: Vec<u32>,
    untruncated_len: usize,
}

impl Encoding {
    /// Token ids including `<s>` and `</s>`, after truncation.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Consumes the encoding, returning its ids.
    pub fn into_ids(self) -> Vec<u32> {
        self.ids
    }

    /// Number of tokens fed to the model (special tokens included).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no tokens at all (never true for a Ruri tokenizer, which always adds
    /// `<s>` and `</s>`).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Number of tokens the text would have had without truncation (special tokens included).
    pub fn untruncated_len(&self) -> usize {
        self.untruncated_len
    }

    /// Whether tokens were dropped to fit the maximum length.
    pub fn truncated(&self) -> bool {
        self.untruncated_len > self.ids.len()
    }
}

/// One token of a text as a tokenize endpoint shows it ([`Tokenizer::tokens_with`]): its id,
/// its vocabulary piece, whether the post-processor added it, and the bytes of prompt + text
/// it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    id: u32,
    piece: String,
    special: bool,
    offsets: Option<(usize, usize)>,
}

impl Token {
    /// The token id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The vocabulary's string for this id (`"<s>"`, `"▁猫"`, a byte piece `"<0xE7>"`).
    pub fn piece(&self) -> &str {
        &self.piece
    }

    /// Whether the post-processor added this token (`<s>`, `</s>`): the `tokenizers` crate's
    /// special-tokens mask. A special token written in the text itself is not one.
    pub fn is_special(&self) -> bool {
        self.special
    }

    /// The UTF-8 byte range of `prompt + text` (as given, before any whitespace policy) this
    /// token came from; `None` for a [special](Token::is_special) token. The byte pieces of
    /// one character (byte fallback) share that character's range.
    pub fn offsets(&self) -> Option<std::ops::Range<usize>> {
        self.offsets.map(|(start, stop)| start..stop)
    }
}

/// A Ruri tokenizer: `tokenizer.json` plus the model's maximum length and pad id.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    engine: Engine,
    max_length: usize,
    pad_id: u32,
    /// Special tokens the post-processor adds to one sequence (2 for `<s> $A </s>`).
    added_specials: usize,
}

impl Tokenizer {
    /// Parses the bytes of a `tokenizer.json` with an explicit maximum length (special tokens
    /// included). The pad id is that of `pad_token` when given, else of `<pad>`.
    ///
    /// This crate reads no files: the maximum length and the pad token are the model folder's
    /// to state (`ruri-core`'s `ModelDir` resolves them as sentence-transformers does).
    pub fn from_json(json: &[u8], max_length: usize, pad_token: Option<&str>) -> Result<Self> {
        let invalid = |source| TokenizeError::InvalidTokenizer { source };
        let mut engine = Engine::from_json(json).map_err(invalid)?;
        // Truncation and padding are ours to apply (per item, reported); a tokenizer.json that
        // carries its own settings must not apply them a second time.
        with_engine!(&mut engine, t => {
            t.with_truncation(None).map_err(invalid)?;
            t.with_padding(None);
        });

        let pad_token = pad_token.unwrap_or("<pad>");
        let pad_id = with_engine!(&engine, t => t.token_to_id(pad_token)).ok_or_else(|| {
            TokenizeError::MissingToken {
                token: pad_token.to_owned(),
            }
        })?;
        let added_specials = with_engine!(&engine, t => t
            .get_post_processor()
            .map(|p| tokenizers::PostProcessor::added_tokens(p, false))
            .unwrap_or(0));
        Self::check_max_length(max_length, added_specials)?;
        Ok(Self {
            engine,
            max_length,
            pad_id,
            added_specials,
        })
    }

    fn check_max_length(max_length: usize, added_specials: usize) -> Result<()> {
        if max_length <= added_specials {
            return Err(TokenizeError::InvalidMaxLength {
                max_length,
                special_tokens: added_specials,
            });
        }
        Ok(())
    }

    /// Returns this tokenizer with another maximum length (special tokens included), e.g. to
    /// embed shorter windows than the model allows.
    pub fn with_max_length(mut self, max_length: usize) -> Result<Self> {
        Self::check_max_length(max_length, self.added_specials)?;
        self.max_length = max_length;
        Ok(self)
    }

    /// Maximum number of tokens per text, special tokens included.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// The id used to pad batches (`<pad>`, 3 in Ruri v3).
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Number of pieces in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        with_engine!(&self.engine, t => t.get_vocab_size(true))
    }

    /// Whether this tokenizer runs on [`CompactUnigram`] (true for Ruri's `tokenizer.json`)
    /// rather than on the `tokenizers` crate's own model.
    pub fn uses_compact_unigram(&self) -> bool {
        self.engine.is_compact()
    }

    /// The id of a piece or added token, if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        with_engine!(&self.engine, t => t.token_to_id(token))
    }

    /// Tokenizes `prompt + text` (the prompt as plain text, as sentence-transformers does),
    /// adds `<s>`/`</s>`, and applies the truncation policy.
    ///
    /// With [`Truncation::Error`], a text that is too long fails with
    /// [`TokenizeError::InputTooLong`] whose `index` is 0.
    pub fn encode(&self, prompt: &str, text: &str, truncation: Truncation) -> Result<Encoding> {
        self.encode_at(0, prompt, text, truncation)
    }

    /// Tokenizes many texts with the same prompt; see [`Tokenizer::encode`]. An error names the
    /// index of the text that caused it.
    pub fn encode_batch<S: AsRef<str>>(
        &self,
        prompt: &str,
        texts: &[S],
        truncation: Truncation,
    ) -> Result<Vec<Encoding>> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| self.encode_at(i, prompt, t.as_ref(), truncation))
            .collect()
    }

    /// [`Tokenizer::encode`] for the text at `index` of a larger request (the index only
    /// labels errors).
    pub fn encode_at(
        &self,
        index: usize,
        prompt: &str,
        text: &str,
        truncation: Truncation,
    ) -> Result<Encoding> {
        self.encode_with(index, prompt, text, truncation, Whitespace::Keep)
    }

    /// [`Tokenizer::encode_at`] under a [`Whitespace`] policy: with [`Whitespace::Strip`],
    /// prompt + text lose their leading and trailing whitespace first, as
    /// sentence-transformers 2.x–5.3 do.
    pub fn encode_with(
        &self,
        index: usize,
        prompt: &str,
        text: &str,
        truncation: Truncation,
        whitespace: Whitespace,
    ) -> Result<Encoding> {
        let input = whitespace.apply(prompt, text);
        // Encode without special tokens, truncate, then post-process: the same order as
        // `TokenizerImpl::post_process` with truncation set (what transformers calls), so the
        // kept tokens and the final `</s>` are identical to Python's.
        let mut raw = with_engine!(&self.engine, t => t.encode_fast(input.as_ref(), false))
            .map_err(|source| TokenizeError::Tokenizer { index, source })?;
        let untruncated_len = raw.len() + self.added_specials;
        if untruncated_len > self.max_length {
            match truncation {
                Truncation::Error => {
                    return Err(TokenizeError::InputTooLong {
                        index,
                        tokens: untruncated_len,
                        max: self.max_length,
                    });
                }
                Truncation::Truncate => {
                    raw.truncate(
                        self.max_length - self.added_specials,
                        0,
                        TruncationDirection::Right,
                    );
                    // The dropped tail is kept by `truncate` as "overflowing" encodings; we
                    // never use it, and post-processing would copy it again.
                    drop(raw.take_overflowing());
                }
            }
        }
        let encoding = with_engine!(&self.engine, t => t.post_process(raw, None, true))
            .map_err(|source| TokenizeError::Tokenizer { index, source })?;
        Ok(Encoding {
            ids: encoding.get_ids().to_vec(),
            untruncated_len,
        })
    }

    /// Every token of `prompt + text` with its piece and byte offsets, under a [`Whitespace`]
    /// policy, with `<s>`/`</s>` when `add_special_tokens`: what text-embeddings-inference's
    /// `/tokenize` shows. Nothing is truncated, whatever the maximum length; with special
    /// tokens the ids are those [`Tokenizer::encode_with`] gives an untruncated text. The
    /// `index` only labels errors.
    ///
    /// Offsets count bytes of `prompt + text` as given: under [`Whitespace::Strip`] they skip
    /// the leading whitespace the tokenizer did not see.
    ///
    /// ```
    /// use ruri_tokenize::{Tokenizer, Whitespace};
    ///
    /// # let json = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny/tokenizer.json")).unwrap();
    /// let tokenizer = Tokenizer::from_json(&json, 512, None)?;
    /// let tokens = tokenizer.tokens_with(0, "", "瑠璃色", true, Whitespace::Keep)?;
    /// assert_eq!(tokens.first().map(|t| t.piece()), Some("<s>"));
    /// assert!(tokens[0].is_special() && tokens[0].offsets().is_none());
    /// assert_eq!(tokens[1].offsets().map(|r| r.start), Some(0));
    /// # Ok::<(), ruri_tokenize::TokenizeError>(())
    /// ```
    pub fn tokens_with(
        &self,
        index: usize,
        prompt: &str,
        text: &str,
        add_special_tokens: bool,
        whitespace: Whitespace,
    ) -> Result<Vec<Token>> {
        let input = whitespace.apply(prompt, text);
        // What the policy removed from the front of prompt + text: the tokenizer's offsets
        // start after it.
        let leading = |s: &str| s.len() - s.trim_start_matches(is_python_whitespace).len();
        let shift = match whitespace {
            Whitespace::Keep => 0,
            Whitespace::Strip if leading(prompt) == prompt.len() => prompt.len() + leading(text),
            Whitespace::Strip => leading(prompt),
        };
        // `encode` (not `encode_fast`) tracks byte offsets; the tokenizer carries no
        // truncation (`from_json` removed it), so every token is kept.
        let encoding =
            with_engine!(&self.engine, t => t.encode(input.as_ref(), add_special_tokens))
                .map_err(|source| TokenizeError::Tokenizer { index, source })?;
        let tokens = encoding
            .get_ids()
            .iter()
            .zip(encoding.get_tokens())
            .zip(encoding.get_special_tokens_mask())
            .zip(encoding.get_offsets())
            .map(|(((&id, piece), &mask), &(start, stop))| {
                let special = mask == 1;
                Token {
                    id,
                    piece: piece.clone(),
                    special,
                    offsets: (!special).then_some((start + shift, stop + shift)),
                }
            })
            .collect();
        Ok(tokens)
    }
}
