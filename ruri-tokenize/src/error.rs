/// `Result` with [`TokenizeError`] as the default error.
pub type Result<T, E = TokenizeError> = std::result::Result<T, E>;

/// Why a tokenizer could not be loaded or a text could not be tokenized.
///
/// `ruri-core` wraps it in its `Error` (adding the file's path where one was read).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizeError {
    /// `tokenizer.json` could not be loaded by the `tokenizers` crate.
    #[error("the tokenizers crate cannot load this tokenizer.json")]
    InvalidTokenizer {
        /// The error reported by `tokenizers`.
        #[source]
        source: tokenizers::Error,
    },
    /// A token the model needs (e.g. the pad token) is not in the vocabulary.
    #[error("token {token:?} is not in the tokenizer's vocabulary")]
    MissingToken {
        /// The token's text.
        token: String,
    },
    /// The maximum length leaves no room for text between the special tokens.
    #[error("maximum length {max_length} must exceed the {special_tokens} special tokens")]
    InvalidMaxLength {
        /// The requested maximum length.
        max_length: usize,
        /// Special tokens added to every text.
        special_tokens: usize,
    },
    /// A text has more tokens than the model accepts and truncation was not allowed.
    #[error("text {index} has {tokens} tokens, more than the maximum of {max}")]
    InputTooLong {
        /// Position of the text in the request.
        index: usize,
        /// Its token count, special tokens included.
        tokens: usize,
        /// The maximum length.
        max: usize,
    },
    /// The `tokenizers` crate failed on a text.
    #[error("tokenizing text {index} failed")]
    Tokenizer {
        /// Position of the text in the request.
        index: usize,
        /// The error reported by `tokenizers`.
        #[source]
        source: tokenizers::Error,
    },
}
