use std::path::PathBuf;

/// `Result` with [`TokenizeError`] as the default error.
pub type Result<T, E = TokenizeError> = std::result::Result<T, E>;

/// Why a tokenizer could not be loaded or a text could not be tokenized.
///
/// `ruri-core` turns each variant into its own `Error`, keeping the fields and the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizeError {
    /// A required file is absent.
    #[error("missing file {path}")]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// A file exists but could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON configuration file is not valid JSON of the expected shape.
    #[error("invalid JSON in {path}")]
    InvalidJson {
        /// The file.
        path: PathBuf,
        /// The parse error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// `tokenizer.json` could not be loaded by the `tokenizers` crate.
    #[error("invalid tokenizer file {path}")]
    InvalidTokenizer {
        /// The file.
        path: PathBuf,
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
    /// The tokenizer's pad token and `config.json`'s `pad_token_id` disagree.
    #[error("the tokenizer pads with id {tokenizer} but config.json says pad_token_id {config}")]
    PadIdMismatch {
        /// Pad id from the tokenizer files.
        tokenizer: u32,
        /// `pad_token_id` from `config.json`.
        config: u32,
    },
    /// No file in the folder states a maximum sequence length.
    #[error(
        "no maximum length in {dir}: expected sentence_bert_config.json (max_seq_length), \
         tokenizer_config.json (model_max_length) or config.json (max_position_embeddings)"
    )]
    UnknownMaxLength {
        /// The model folder.
        dir: PathBuf,
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
