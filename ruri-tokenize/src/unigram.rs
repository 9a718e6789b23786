//! A compact SentencePiece **Unigram** model for the `tokenizers` pipeline.
//!
//! `tokenizers::models::unigram::Unigram` keeps its pieces in a trie of hash maps, one map per
//! node. For Ruri's 102,400-piece vocabulary that trie takes most of a Rust process's cold start
//! and resident set to build (figures in the repository's BENCHMARKS.md). [`CompactUnigram`]
//! keeps all pieces in one string and indexes every piece *prefix* (at character boundaries)
//! in open-addressing hash tables, one per first character, each built the first time a text
//! needs it: a load only groups the pieces by first character (a few milliseconds, a few MB).
//! It implements [`tokenizers::Model`] with the same Viterbi search, so normalizer,
//! pre-tokenizer, added tokens and post-processor stay those of the `tokenizers` crate.
//!
//! The search decides exactly as the crate's Unigram (its `encode_optimized`) does, so the ids
//! are identical (tested against it on every committed input and on random Unicode):
//!
//! * at each character boundary, every piece that is a prefix of the rest of the text is a
//!   candidate, shortest first; a candidate replaces the best path to its end only when its
//!   score is strictly higher;
//! * when no piece covers exactly the next character, that character becomes `<unk>` with the
//!   lowest piece score minus 10;
//! * consecutive `<unk>` characters are fused into one piece; with byte fallback, a piece that
//!   is not in the vocabulary becomes its `<0xXX>` byte pieces when all of them exist,
//!   otherwise `<unk>`;
//! * a piece spelled more than once in the vocabulary resolves to its last id.
//!
//! Sampling (`alpha`, `nbest_size`) is not supported; `tokenizer.json` files do not set it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};
use tokenizers::models::unigram::UnigramTrainer;
use tokenizers::{Model, Token};

use crate::prefix_index::{Pieces, PrefixIndex, SPLIT_ABOVE, WHOLE};

/// The score given to an unknown character: the lowest piece score minus this (as
/// SentencePiece and `tokenizers` do).
const UNK_PENALTY: f64 = 10.0;

/// Errors of the Unigram model, reported through `tokenizers`' boxed errors.
#[derive(Debug, thiserror::Error)]
enum UnigramError {
    #[error("the Unigram vocabulary is empty")]
    EmptyVocabulary,
    #[error("the Unigram unk_id {unk_id} is not in the vocabulary of {len} pieces")]
    UnkIdOutOfRange { unk_id: usize, len: usize },
    #[error("the Unigram vocabulary has {0} pieces; ids must fit in 32 bits")]
    TooManyPieces(usize),
    #[error("the text has a character that no piece covers and the model has no unk_id")]
    MissingUnkId,
}

/// A SentencePiece Unigram model whose pieces live in one string and prefix hash tables.
#[derive(Clone)]
pub struct CompactUnigram {
    /// Every piece prefix at a character boundary, with the piece it spells if any.
    prefixes: PrefixIndex,
    /// Length in bytes of the longest piece.
    max_piece_len: usize,
    /// The (last) id of the empty piece, if the vocabulary spells one; it never matches text.
    empty_id: Option<u32>,
    /// All pieces, concatenated; piece `i` is `text[bounds[i]..bounds[i + 1]]`.
    text: String,
    bounds: Vec<u32>,
    scores: Vec<f64>,
    unk_id: Option<u32>,
    unk_score: f64,
    byte_fallback: bool,
}

impl fmt::Debug for CompactUnigram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactUnigram")
            .field("pieces", &self.scores.len())
            .field("unk_id", &self.unk_id)
            .field("byte_fallback", &self.byte_fallback)
            .finish()
    }
}

/// One cell of the Viterbi table: the best path ending at this byte offset.
#[derive(Clone, Copy)]
struct Best {
    score: f64,
    /// Where the last piece of that path starts; `usize::MAX` while unreached.
    start: usize,
    id: u32,
}

impl CompactUnigram {
    /// Builds the model from `(piece, score)` pairs in id order, as `tokenizer.json` lists them.
    pub fn new<'a, I>(
        pieces: I,
        unk_id: Option<usize>,
        byte_fallback: bool,
    ) -> tokenizers::Result<Self>
    where
        I: IntoIterator<Item = (&'a str, f64)>,
    {
        let mut builder = Builder::default();
        for (piece, score) in pieces {
            builder.push(piece, score);
        }
        builder.build(unk_id, byte_fallback)
    }

    /// [`new`](Self::new) with the prefix index's groups split above `split_above` pieces
    /// instead of [`SPLIT_ABOVE`], so that small test vocabularies take the split path.
    #[cfg(test)]
    fn with_split_above<'a>(
        pieces: impl IntoIterator<Item = (&'a str, f64)>,
        unk_id: Option<usize>,
        byte_fallback: bool,
        split_above: u32,
    ) -> tokenizers::Result<Self> {
        let mut builder = Builder::default();
        for (piece, score) in pieces {
            builder.push(piece, score);
        }
        builder.build_split(unk_id, byte_fallback, split_above)
    }

    /// Number of pieces.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// Whether there are no pieces (never true for a built model).
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// Piece `id`.
    fn piece(&self, id: usize) -> &str {
        &self.text[self.bounds[id] as usize..self.bounds[id + 1] as usize]
    }

    /// The pieces as the prefix index reads them.
    fn pieces(&self) -> Pieces<'_> {
        Pieces {
            text: &self.text,
            bounds: &self.bounds,
        }
    }

    /// The id of the piece spelled `piece`, if any.
    fn id_of(&self, piece: &str) -> Option<u32> {
        if piece.is_empty() {
            return self.empty_id;
        }
        self.prefixes
            .at(piece, self.pieces())?
            .find(piece.as_bytes())?
            .id()
    }

    /// Whether byte fallback is on.
    pub fn byte_fallback(&self) -> bool {
        self.byte_fallback
    }

    /// The id of unknown pieces, if any.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }

    /// The best segmentation of `text` as `(start, end, id)` byte ranges, `<unk>` runs fused.
    fn segment(&self, text: &str) -> tokenizers::Result<Vec<(usize, usize, u32)>> {
        let bytes = text.as_bytes();
        let unreached = Best {
            score: 0.0,
            start: usize::MAX,
            id: 0,
        };
        let mut best = vec![unreached; bytes.len() + 1];
        best[0].start = 0;
        let relax = |cell: &mut Best, score: f64, start: usize, id: u32| {
            if cell.start == usize::MAX || score > cell.score {
                *cell = Best { score, start, id };
            }
        };
        for (start, ch) in text.char_indices() {
            let base = best[start].score;
            let char_len = ch.len_utf8();
            let mut covers_char = false;
            // Longer and longer prefixes of the rest, at character boundaries, while some
            // piece still starts with them.
            let rest = &text[start..];
            let ends = rest
                .char_indices()
                .map(|(i, c)| i + c.len_utf8())
                .take_while(|&len| len <= self.max_piece_len);
            // The pieces that start here; none: only `<unk>` below.
            let at = self.prefixes.at(rest, self.pieces());
            for len in ends {
                let Some(prefix) = at
                    .as_ref()
                    .and_then(|at| at.find(&bytes[start..start + len]))
                else {
                    break;
                };
                if let Some(id) = prefix.id() {
                    let score = base + self.scores[id as usize];
                    relax(&mut best[start + len], score, start, id);
                    covers_char |= len == char_len;
                }
            }
            if !covers_char {
                // The character as `<unk>` — an error without an unk id, but only when that
                // path would be taken (a longer piece may already reach further), as in
                // `tokenizers`.
                let cell = &mut best[start + char_len];
                let score = base + self.unk_score;
                if cell.start == usize::MAX || score > cell.score {
                    let unk = self.unk_id.ok_or(UnigramError::MissingUnkId)?;
                    *cell = Best {
                        score,
                        start,
                        id: unk,
                    };
                }
            }
        }

        let mut pieces = Vec::new();
        let mut end = bytes.len();
        while end > 0 {
            let cell = best[end];
            let fuse = Some(cell.id) == self.unk_id
                && pieces
                    .last()
                    .is_some_and(|&(_, _, id)| Some(id) == self.unk_id);
            if fuse {
                // Pieces are collected back to front: extend the fused run leftwards.
                if let Some(last) = pieces.last_mut() {
                    last.0 = cell.start;
                }
            } else {
                pieces.push((cell.start, end, cell.id));
            }
            end = cell.start;
        }
        pieces.reverse();
        Ok(pieces)
    }
}

impl Model for CompactUnigram {
    type Trainer = UnigramTrainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        let pieces = self.segment(sequence)?;
        let mut tokens = Vec::with_capacity(pieces.len());
        for (start, end, _) in pieces {
            let piece = &sequence[start..end];
            let offsets = (start, end);
            // As `tokenizers` does: the piece's own id when the (possibly fused) string is in
            // the vocabulary, else its bytes, else `<unk>`.
            if let Some(id) = self.id_of(piece) {
                tokens.push(Token::new(id, piece.to_owned(), offsets));
                continue;
            }
            if self.byte_fallback {
                let byte_ids: Option<Vec<(u32, String)>> = piece
                    .bytes()
                    .map(|b| {
                        let name = format!("<0x{b:02X}>");
                        self.id_of(&name).map(|id| (id, name))
                    })
                    .collect();
                if let Some(byte_ids) = byte_ids {
                    tokens.extend(
                        byte_ids
                            .into_iter()
                            .map(|(id, name)| Token::new(id, name, offsets)),
                    );
                    continue;
                }
            }
            let unk = self.unk_id.ok_or(UnigramError::MissingUnkId)?;
            tokens.push(Token::new(unk, piece.to_owned(), offsets));
        }
        Ok(tokens)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.id_of(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        let id = id as usize;
        (id < self.len()).then(|| self.piece(id).to_owned())
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        // Later spellings overwrite earlier ones, as the index does.
        (0..self.len())
            .map(|id| (self.piece(id).to_owned(), id as u32))
            .collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.len()
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        let name = match prefix {
            Some(prefix) => format!("{prefix}-unigram.json"),
            None => "unigram.json".to_owned(),
        };
        let path = folder.join(name);
        std::fs::write(&path, serde_json::to_string_pretty(self)?)?;
        Ok(vec![path])
    }

    fn get_trainer(&self) -> UnigramTrainer {
        UnigramTrainer::default()
    }
}

/// Collects pieces in id order, then builds the index.
#[derive(Default)]
struct Builder {
    text: String,
    bounds: Vec<u32>,
    scores: Vec<f64>,
}

impl Builder {
    fn push(&mut self, piece: &str, score: f64) {
        if self.bounds.is_empty() {
            self.bounds.push(0);
        }
        self.text.push_str(piece);
        // Overflow is caught in `build` (the text length is checked there).
        self.bounds.push(self.text.len() as u32);
        self.scores.push(score);
    }

    fn build(
        self,
        unk_id: Option<usize>,
        byte_fallback: bool,
    ) -> tokenizers::Result<CompactUnigram> {
        self.build_split(unk_id, byte_fallback, SPLIT_ABOVE)
    }

    fn build_split(
        self,
        unk_id: Option<usize>,
        byte_fallback: bool,
        split_above: u32,
    ) -> tokenizers::Result<CompactUnigram> {
        let Builder {
            text,
            mut bounds,
            scores,
        } = self;
        let len = scores.len();
        if len == 0 {
            // `tokenizers` only refuses an empty vocabulary when it has an unk id; such a
            // model could not encode anything, so it is refused here either way.
            return Err(Box::new(UnigramError::EmptyVocabulary));
        }
        if text.len() >= WHOLE as usize || u32::try_from(len).is_err() {
            return Err(Box::new(UnigramError::TooManyPieces(len)));
        }
        if let Some(unk_id) = unk_id.filter(|&u| u >= len) {
            return Err(Box::new(UnigramError::UnkIdOutOfRange { unk_id, len }));
        }
        bounds.shrink_to_fit();
        let pieces = Pieces {
            text: &text,
            bounds: &bounds,
        };
        // The empty piece is not indexed, so it can never match (every match consumes a
        // character), as in `tokenizers`.
        let prefixes = PrefixIndex::new(pieces, split_above);
        let empty_id = (0..len).rev().find(|&id| pieces.get(id).is_empty());
        let max_piece_len = (0..len).map(|id| pieces.get(id).len()).max().unwrap_or(0);
        let min_score = scores.iter().copied().fold(f64::INFINITY, f64::min);
        Ok(CompactUnigram {
            prefixes,
            max_piece_len,
            empty_id: empty_id.map(|id| id as u32),
            text,
            bounds,
            scores,
            unk_id: unk_id.map(|u| u as u32),
            unk_score: min_score - UNK_PENALTY,
            byte_fallback,
        })
    }
}

/// `[piece, score]`, borrowing the piece from the JSON text when it has no escapes.
#[derive(Deserialize)]
struct Piece<'a>(#[serde(borrow)] Cow<'a, str>, f64);

/// Deserializes the `vocab` array straight into a [`Builder`], without a `String` per piece.
struct VocabSeed<'b>(&'b mut Builder);

impl<'de> DeserializeSeed<'de> for VocabSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for VocabSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of [piece, score] pairs")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(Piece(piece, score)) = seq.next_element::<Piece<'de>>()? {
            self.0.push(&piece, score);
        }
        Ok(())
    }
}

/// The `model` object of `tokenizer.json` with `"type": "Unigram"`.
impl<'de> Deserialize<'de> for CompactUnigram {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ModelVisitor;

        impl<'de> Visitor<'de> for ModelVisitor {
            type Value = CompactUnigram;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Unigram model object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CompactUnigram, A::Error> {
                let mut builder = Builder::default();
                let mut has_vocab = false;
                let mut unk_id = None;
                let mut byte_fallback = false;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "type" => {
                            let kind: Cow<'de, str> = map.next_value()?;
                            if kind != "Unigram" {
                                return Err(de::Error::invalid_value(
                                    de::Unexpected::Str(&kind),
                                    &"Unigram",
                                ));
                            }
                        }
                        "unk_id" => unk_id = map.next_value()?,
                        "byte_fallback" => byte_fallback = map.next_value()?,
                        "vocab" => {
                            map.next_value_seed(VocabSeed(&mut builder))?;
                            has_vocab = true;
                        }
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                if !has_vocab {
                    return Err(de::Error::missing_field("vocab"));
                }
                builder
                    .build(unk_id, byte_fallback)
                    .map_err(|e| de::Error::custom(format!("invalid Unigram model: {e}")))
            }
        }

        deserializer.deserialize_map(ModelVisitor)
    }
}

/// The same JSON as `tokenizers`' Unigram writes.
impl Serialize for CompactUnigram {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Vocab<'m>(&'m CompactUnigram);
        impl Serialize for Vocab<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
                for id in 0..self.0.len() {
                    seq.serialize_element(&(self.0.piece(id), self.0.scores[id]))?;
                }
                seq.end()
            }
        }
        let mut model = serializer.serialize_struct("Unigram", 4)?;
        model.serialize_field("type", "Unigram")?;
        model.serialize_field("unk_id", &self.unk_id)?;
        model.serialize_field("vocab", &Vocab(self))?;
        model.serialize_field("byte_fallback", &self.byte_fallback)?;
        model.end()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tokenizers::Model;
    use tokenizers::models::unigram::Unigram;

    use super::CompactUnigram;

    /// Pieces over few characters, so that one first character starts many of them.
    fn piece() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![Just('a'), Just('▁'), Just('あ'), Just('😀')],
            0..4,
        )
        .prop_map(|chars| chars.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Groups split by second character (here from 0 or 1 pieces up) index the same
        /// prefixes as the crate's trie: the same tokens and ids.
        #[test]
        fn split_groups_get_the_same_tokens(
            pieces in proptest::collection::vec(
                (piece(), prop_oneof![Just(-1.0), Just(-2.0), -8.0f64..0.0]),
                1..24,
            ),
            texts in proptest::collection::vec(
                proptest::collection::vec(
                    prop_oneof![Just('a'), Just('▁'), Just('あ'), Just('😀'), Just('x')],
                    0..16,
                ),
                1..6,
            ),
            split_above in 0u32..3,
        ) {
            let mut pieces = pieces;
            pieces.insert(0, ("<unk>".to_owned(), 0.0));
            let stock = Unigram::from(pieces.clone(), Some(0), false).unwrap();
            let compact = CompactUnigram::with_split_above(
                pieces.iter().map(|(p, s)| (p.as_str(), *s)),
                Some(0),
                false,
                split_above,
            )
            .unwrap();
            for text in texts {
                let text: String = text.into_iter().collect();
                let tokens = |m: &dyn Fn(&str) -> tokenizers::Result<Vec<tokenizers::Token>>| {
                    m(&text).map(|t| {
                        t.into_iter()
                            .map(|t| (t.id, t.value, t.offsets))
                            .collect::<Vec<_>>()
                    })
                    .map_err(|_| ())
                };
                prop_assert_eq!(
                    tokens(&|t| compact.tokenize(t)),
                    tokens(&|t| stock.tokenize(t)),
                    "text {:?}",
                    text
                );
            }
            for (piece, _) in &pieces {
                prop_assert_eq!(compact.token_to_id(piece), stock.token_to_id(piece));
                for (at, _) in piece.char_indices().skip(1) {
                    prop_assert_eq!(
                        compact.token_to_id(&piece[..at]),
                        stock.token_to_id(&piece[..at])
                    );
                }
            }
        }
    }
}
