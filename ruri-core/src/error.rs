use std::path::PathBuf;

use ruri_tokenize::TokenizeError;

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in ruri, for every backend.
///
/// Variants are structured so callers can react (e.g. [`Error::InputTooLong`] carries the
/// index of the offending text); wrapped causes are kept as [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A required file is absent from the model folder.
    #[error("missing file {path}")]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// No file of the kind needed (e.g. an int8 ONNX file) is in the model folder under any of
    /// the names looked for.
    #[error(
        "no {wanted} in {dir}: looked for {}; {}",
        looked_for.join(", "),
        describe_found(found)
    )]
    NoModelFile {
        /// The model folder.
        dir: PathBuf,
        /// What was looked for (e.g. `"int8 ONNX file"`).
        wanted: String,
        /// The names tried, relative to `dir`, most preferred first.
        looked_for: Vec<String>,
        /// The files of that kind the folder does have, relative to `dir`.
        found: Vec<String>,
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
    /// A JSON file is not valid JSON of the expected shape.
    #[error("invalid JSON in {path}")]
    InvalidJson {
        /// The file.
        path: PathBuf,
        /// The parse error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A configuration file parses but its content is unusable.
    #[error("invalid configuration in {path}: {reason}")]
    InvalidConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The model folder asks for something ruri does not implement (e.g. CLS pooling).
    #[error("unsupported model feature in {path}: {what}")]
    Unsupported {
        /// The file that asks for it.
        path: PathBuf,
        /// The feature.
        what: String,
    },
    /// A weights file made for another model or with other options than the ones asked for
    /// (ruri's int8 file, `model.ruri-int8.safetensors`, records both): never loaded as if
    /// it matched.
    #[error("{path} was made with {what} = {in_file}, but {wanted_by} asks for {wanted}")]
    WeightsMismatch {
        /// The weights file.
        path: PathBuf,
        /// What differs (`"hidden_size"`, `"embedding_table"`, `"precision"`, …).
        what: &'static str,
        /// Its value in the file.
        in_file: String,
        /// The value asked for.
        wanted: String,
        /// Who asks for it (`"config.json"`, `"the builder"`).
        wanted_by: &'static str,
    },
    /// `tokenizer.json` exists but cannot be loaded.
    #[error("invalid tokenizer file {path}")]
    InvalidTokenizer {
        /// The file.
        path: PathBuf,
        /// Why `ruri-tokenize` refused it.
        #[source]
        source: TokenizeError,
    },
    /// The tokenizer failed on a text.
    #[error(transparent)]
    Tokenizer(TokenizeError),
    /// A text has more tokens than the model accepts and the truncation policy is
    /// [`Truncation::Error`](crate::Truncation::Error).
    #[error("text {index} has {tokens} tokens, more than the model's maximum of {max}")]
    InputTooLong {
        /// Position of the text in the request.
        index: usize,
        /// Its token count, special tokens included.
        tokens: usize,
        /// The model's maximum length.
        max: usize,
    },
    /// An option passed to a builder or a call is out of range.
    #[error("invalid option {name} = {value}: {reason}")]
    InvalidOption {
        /// The option.
        name: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The inference runtime library (e.g. ONNX Runtime) could not be found or loaded.
    #[error("{runtime} could not be loaded: {reason}\n{help}")]
    RuntimeUnavailable {
        /// Which runtime.
        runtime: &'static str,
        /// What went wrong.
        reason: String,
        /// How to install or point to a working one.
        help: String,
        /// The loader's error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Two vectors compared by [`dot`](crate::dot), [`cosine`](crate::cosine) or
    /// [`top_k`](crate::top_k) have different lengths (vectors of two models, or of one model
    /// and something else): there is no score to give.
    #[error("cannot compare vectors of different lengths: {left} and {right}")]
    DimensionMismatch {
        /// The first vector's length (the query's, for `top_k`).
        left: usize,
        /// The second vector's length (the corpus's dimension, for `top_k`).
        right: usize,
    },
    /// The backend's model returned something of the wrong shape or kind.
    #[error("unexpected model output: {reason}")]
    ModelOutput {
        /// What was expected and what came.
        reason: String,
    },
    /// The backend failed while loading or running the model.
    #[error("{backend} backend error: {context}")]
    Backend {
        /// The backend (`"ort"`, `"candle"`).
        backend: &'static str,
        /// What it was doing.
        context: String,
        /// The backend library's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A Hugging Face Hub repository does not exist, or is private and the token sent (if any)
    /// cannot see it: the Hub answers both alike.
    #[error(
        "repository {repo} not found on {endpoint} (a private repository looks the same to a \
         token without access; sent {token})"
    )]
    RepoNotFound {
        /// The model id (`org/name`).
        repo: String,
        /// The Hub's address.
        endpoint: String,
        /// Which token was sent.
        token: TokenSource,
    },
    /// The repository exists but has no such branch, tag or commit.
    #[error("repository {repo} has no revision {revision:?} (a branch, tag or commit)")]
    RevisionNotFound {
        /// The model id.
        repo: String,
        /// The revision asked for.
        revision: String,
    },
    /// The repository lacks a file the chosen backend and precision need.
    #[error("{repo} at {revision} has no {wanted}; its files: {}", files.join(", "))]
    RemoteFileNotFound {
        /// The model id.
        repo: String,
        /// The revision (or commit) looked at.
        revision: String,
        /// What was needed (a file name, or e.g. "int8 ONNX file (onnx/model_quantized.onnx, …)").
        wanted: String,
        /// Every file the repository has at that revision.
        files: Vec<String>,
    },
    /// The Hub refused access (HTTP 401 or 403): a gated model whose conditions the token's
    /// owner has not accepted, or a token that is invalid or lacks the right.
    #[error(
        "access to {repo} refused (HTTP {status}{}); sent {token}",
        if *gated { ", a gated model: accept its conditions on the Hub page, then use a token of that account" } else { "" }
    )]
    AccessDenied {
        /// The model id.
        repo: String,
        /// 401 or 403.
        status: u16,
        /// Whether the Hub said the model is gated.
        gated: bool,
        /// Which token was sent (never the token itself).
        token: TokenSource,
    },
    /// The Hub could not be reached (connection refused, DNS, TLS, timeout, a connection
    /// dropped and not resumable within the retries).
    #[error("cannot reach {url}")]
    Network {
        /// The address asked.
        url: String,
        /// The transport's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The Hub answered with a status ruri does not expect (e.g. 500, 429).
    #[error("{url} answered HTTP {status}")]
    HttpStatus {
        /// The address asked.
        url: String,
        /// The status code.
        status: u16,
    },
    /// A download did not match what the Hub announced (size, SHA-256, headers); nothing was
    /// added to the cache.
    #[error("download of {url} failed: {reason}")]
    Download {
        /// The address downloaded.
        url: String,
        /// What did not match.
        reason: String,
    },
    /// Offline (`HF_HUB_OFFLINE=1`, or the Hub unreachable) and the cache cannot serve the
    /// model.
    #[error(
        "{repo} at {revision} is not in the cache {cache} and the Hub is not used ({why}): {reason}"
    )]
    NotCached {
        /// The model id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The cache folder looked in (`HF_HUB_CACHE`).
        cache: PathBuf,
        /// Why the Hub was not asked (`HF_HUB_OFFLINE` is set, or it was unreachable).
        why: String,
        /// What is missing.
        reason: String,
    },
}

/// Which Hugging Face token a request carried, for error messages: never the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenSource {
    /// No token was sent.
    None,
    /// The `HF_TOKEN` environment variable.
    Env,
    /// A token file (`$HF_HOME/token`, or `HF_TOKEN_PATH`).
    File(PathBuf),
    /// A token given in code (`Hub::token`).
    Explicit,
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::None => f.write_str(
                "no token (set HF_TOKEN, or log in with `hf auth login`, which writes \
                 $HF_HOME/token)",
            ),
            TokenSource::Env => f.write_str("the token in the HF_TOKEN environment variable"),
            TokenSource::File(path) => write!(f, "the token in the file {}", path.display()),
            TokenSource::Explicit => f.write_str("the token given to Hub::token"),
        }
    }
}

fn describe_found(found: &[String]) -> String {
    if found.is_empty() {
        "the folder has none".to_owned()
    } else {
        format!(
            "the folder has {} (a backend option such as ruri-ort's onnx_file runs one of them)",
            found.join(", ")
        )
    }
}

impl From<TokenizeError> for Error {
    /// Keeps one enum for callers: an over-long input maps to [`Error::InputTooLong`]; the
    /// rest stay wrapped.
    fn from(e: TokenizeError) -> Self {
        match e {
            TokenizeError::InputTooLong { index, tokens, max } => {
                Error::InputTooLong { index, tokens, max }
            }
            other => Error::Tokenizer(other),
        }
    }
}

/// An error followed by its chain of causes ([`std::error::Error::source`]), for people to
/// read: `{}` writes `error: cause: root cause` on one line (command lines, logs); `{:#}`
/// writes each cause on a line of its own, `\ncaused by: cause` (Python exception messages,
/// long reports). ruri's variants keep their causes as sources rather than in their own
/// text, so printing only `to_string()` would lose the reason (e.g. which I/O error).
///
/// ```
/// use ruri_core::{Error, error_chain};
///
/// let error = Error::Io {
///     path: "config.json".into(),
///     source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied"),
/// };
/// assert_eq!(error_chain(&error).to_string(), "cannot read config.json: permission denied");
/// assert_eq!(
///     format!("{:#}", error_chain(&error)),
///     "cannot read config.json\ncaused by: permission denied"
/// );
/// ```
pub fn error_chain<'a>(error: &'a (dyn std::error::Error + 'static)) -> ErrorChain<'a> {
    ErrorChain(error)
}

/// The [`Display`](std::fmt::Display) of an error and its causes: see [`error_chain`].
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let separator = if f.alternate() { "\ncaused by: " } else { ": " };
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, "{separator}{cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_lists_every_cause_in_order() {
        let root = std::io::Error::other("disk on fire");
        let middle = Error::Io {
            path: "model.safetensors".into(),
            source: root,
        };
        let outer = Error::Backend {
            backend: "candle",
            context: "loading the weights".into(),
            source: Box::new(middle),
        };
        assert_eq!(
            error_chain(&outer).to_string(),
            "candle backend error: loading the weights: cannot read model.safetensors: disk on fire"
        );
        assert_eq!(
            format!("{:#}", error_chain(&outer)),
            "candle backend error: loading the weights\ncaused by: cannot read \
             model.safetensors\ncaused by: disk on fire"
        );
        // No cause: the message alone, in both forms.
        let alone = Error::HttpStatus {
            url: "u".into(),
            status: 500,
        };
        assert_eq!(error_chain(&alone).to_string(), "u answered HTTP 500");
        assert_eq!(format!("{:#}", error_chain(&alone)), "u answered HTTP 500");
    }
}
