//! Wire formats: the OpenAI and TEI request bodies, and errors in each route's own shape.

use std::borrow::Cow;
use std::fmt;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// `input` / `inputs`: one string or an array of strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs(pub Vec<String>);

impl<'de> Deserialize<'de> for Inputs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InputsVisitor;
        impl<'de> Visitor<'de> for InputsVisitor {
            type Value = Inputs;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings (token arrays are not accepted)")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Inputs, E> {
                Ok(Inputs(vec![text.to_owned()]))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Inputs, E> {
                Ok(Inputs(vec![text]))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Inputs, A::Error> {
                // The size hint comes from the client: cap the preallocation.
                let mut texts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(text) = seq.next_element::<String>()? {
                    texts.push(text);
                }
                Ok(Inputs(texts))
            }
        }
        deserializer.deserialize_any(InputsVisitor)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    /// Little-endian f32 bytes, base64 (what the OpenAI Python client asks for by default).
    Base64,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub struct OpenAiRequest {
    pub input: Inputs,
    /// Accepted and ignored: the server has one model and answers with its name.
    #[serde(default)]
    #[allow(dead_code)]
    pub model: Option<String>,
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    #[serde(default)]
    pub dimensions: Option<usize>,
    /// Extension: a Ruri prompt (`query`, `document`, `topic`, `""`); default: the server's
    /// `--default-prompt-name`, else none.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// Extension: truncate over-long inputs instead of refusing them (default false).
    #[serde(default)]
    pub truncate: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum TruncationDirection {
    #[serde(alias = "left", alias = "LEFT")]
    Left,
    #[serde(alias = "right", alias = "RIGHT")]
    Right,
}

fn yes() -> bool {
    true
}

/// `POST /embed`, as text-embeddings-inference.
#[derive(Debug, Deserialize)]
pub struct TeiRequest {
    pub inputs: Inputs,
    #[serde(default = "yes")]
    pub normalize: bool,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: Option<TruncationDirection>,
    #[serde(default)]
    pub prompt_name: Option<String>,
    #[serde(default)]
    pub dimensions: Option<usize>,
}

/// `POST /tokenize`, as text-embeddings-inference.
#[derive(Debug, Deserialize)]
pub struct TeiTokenizeRequest {
    pub inputs: Inputs,
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub prompt_name: Option<String>,
}

/// One token of a `/tokenize` answer (TEI's `SimpleToken`): a special token shows its piece
/// and no offsets; any other token the bytes of prompt + text it came from and their range.
#[derive(Debug, Serialize)]
pub struct TeiToken<'a> {
    pub id: u32,
    pub text: Cow<'a, str>,
    pub special: bool,
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

impl<'a> TeiToken<'a> {
    /// `token` of `joined` (prompt + text, as the request gave them); `None` if its offsets
    /// do not lie within `joined`.
    pub fn new(joined: &'a str, token: &'a ruri::tokenize::Token) -> Option<Self> {
        let (text, start, stop) = match token.offsets() {
            None => (Cow::Borrowed(token.piece()), None, None),
            // Byte-fallback pieces of one character share its range, so a range always
            // spans whole characters here; lossy decoding (as TEI) covers any other case.
            Some(range) => (
                String::from_utf8_lossy(joined.as_bytes().get(range.clone())?),
                Some(range.start),
                Some(range.end),
            ),
        };
        Some(Self {
            id: token.id(),
            text,
            special: token.is_special(),
            start,
            stop,
        })
    }
}

/// `GET /info`: TEI's `Info` where ruri has the value, plus ruri's own fields (see the
/// README's route list).
#[derive(Debug, Serialize)]
pub struct TeiInfo<'a> {
    pub model_id: &'a str,
    /// TEI: the Hub revision's commit. ruri does not report it.
    pub model_sha: Option<&'a str>,
    pub model_dtype: Option<&'a str>,
    pub served_model_name: &'a str,
    pub model_type: TeiModelType,
    pub max_input_length: usize,
    pub max_batch_tokens: usize,
    /// No limit on the requests merged into one backend call.
    pub max_batch_requests: Option<usize>,
    pub max_client_batch_size: usize,
    pub auto_truncate: bool,
    pub tokenization_workers: usize,
    pub version: &'static str,
    /// TEI: the git commit it was built from. ruri does not record it.
    pub sha: Option<&'static str>,
    pub docker_label: Option<&'static str>,
    // ruri's own.
    pub dimensions: usize,
    pub backend: Option<&'a str>,
    pub prompts: std::collections::BTreeMap<&'a str, &'a str>,
    pub default_prompt_name: Option<&'a str>,
}

/// TEI's `model_type`: `{"embedding": {"pooling": "mean"}}`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TeiModelType {
    Embedding { pooling: &'static str },
}

#[derive(Serialize)]
pub struct OpenAiResponse<'a> {
    pub object: &'static str,
    pub data: Vec<OpenAiEmbedding<'a>>,
    pub model: &'a str,
    pub usage: Usage,
}

#[derive(Serialize)]
pub struct OpenAiEmbedding<'a> {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingValue<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
pub enum EmbeddingValue<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// Which API's error shape to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// `{"error": "...", "error_type": "..."}`.
    Tei,
}

impl Flavor {
    /// OpenAI routes live under `/v1/`.
    pub fn of_path(path: &str) -> Self {
        if path.starts_with("/v1/") {
            Flavor::OpenAi
        } else {
            Flavor::Tei
        }
    }
}

/// What went wrong, which decides the status and the error type in both shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not JSON, or not valid UTF-8 (400).
    InvalidJson,
    /// Well-formed but refused: wrong field types, empty input, bad `dimensions`, unknown
    /// prompt (422).
    Invalid,
    /// A size limit: body, inputs per request, tokens per input (413).
    TooLarge,
    /// Missing or wrong API key (401).
    Unauthorized,
    NotFound,
    /// The queue is full (429, `Retry-After`).
    Overloaded,
    /// The model is still loading (503, `Retry-After`).
    Loading,
    /// The model failed to load (503).
    LoadFailed,
    /// The tokenizer failed on an input (422).
    Tokenizer,
    /// The backend failed (500).
    Backend,
    /// The request did not finish within the server's request timeout (503, `Retry-After`):
    /// it waited too long for the model, or its body came too slowly.
    Timeout,
}

impl ErrorKind {
    fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidJson => StatusCode::BAD_REQUEST,
            ErrorKind::Invalid | ErrorKind::Tokenizer => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Loading | ErrorKind::LoadFailed | ErrorKind::Timeout => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorKind::Backend => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// TEI's `error_type` values, spelled as TEI serializes its `ErrorType` enum (the
    /// variant names: `Validation`, `Overloaded`, …). TEI has no variant for a refused API
    /// key; `Unauthorized` follows the same spelling.
    fn tei_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidJson
            | ErrorKind::Invalid
            | ErrorKind::TooLarge
            | ErrorKind::NotFound => "Validation",
            ErrorKind::Unauthorized => "Unauthorized",
            ErrorKind::Overloaded | ErrorKind::Timeout => "Overloaded",
            ErrorKind::Loading | ErrorKind::LoadFailed => "Unhealthy",
            ErrorKind::Tokenizer => "Tokenizer",
            ErrorKind::Backend => "Backend",
        }
    }

    fn openai_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidJson
            | ErrorKind::Invalid
            | ErrorKind::TooLarge
            | ErrorKind::NotFound
            | ErrorKind::Tokenizer => "invalid_request_error",
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::Overloaded => "rate_limit_error",
            ErrorKind::Loading
            | ErrorKind::LoadFailed
            | ErrorKind::Backend
            | ErrorKind::Timeout => "server_error",
        }
    }

    fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidJson => "invalid_json",
            ErrorKind::Invalid => "invalid_request",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Unauthorized => "invalid_api_key",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Loading => "model_loading",
            ErrorKind::LoadFailed => "model_failed",
            ErrorKind::Tokenizer => "tokenizer_error",
            ErrorKind::Backend => "backend_error",
            ErrorKind::Timeout => "timeout",
        }
    }

    /// Seconds a client should wait before retrying, for the transient kinds.
    fn retry_after(self) -> Option<u32> {
        matches!(
            self,
            ErrorKind::Overloaded | ErrorKind::Loading | ErrorKind::Timeout
        )
        .then_some(1)
    }
}

/// An error answer: rendered as JSON in the shape of the route that produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault, when there is one (OpenAI's `param`).
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            param: None,
        }
    }

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn into_response(self, flavor: Flavor) -> Response {
        let mut response = match flavor {
            Flavor::OpenAi => (
                self.kind.status(),
                axum::Json(OpenAiError {
                    error: OpenAiErrorBody {
                        message: &self.message,
                        kind: self.kind.openai_type(),
                        param: self.param,
                        code: self.kind.code(),
                    },
                }),
            )
                .into_response(),
            Flavor::Tei => (
                self.kind.status(),
                axum::Json(TeiError {
                    error: &self.message,
                    error_type: self.kind.tei_type(),
                }),
            )
                .into_response(),
        };
        let headers = response.headers_mut();
        if let Some(seconds) = self.kind.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.kind == ErrorKind::Unauthorized {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[derive(Serialize)]
struct OpenAiError<'a> {
    error: OpenAiErrorBody<'a>,
}

#[derive(Serialize)]
struct OpenAiErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'static str>,
    code: &'static str,
}

#[derive(Serialize)]
struct TeiError<'a> {
    error: &'a str,
    error_type: &'static str,
}

/// Parses a JSON body; the body itself may already have been refused (too large, unreadable).
pub fn parse_json<T: de::DeserializeOwned>(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let kind = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ErrorKind::TooLarge
        } else {
            ErrorKind::InvalidJson
        };
        ApiError::new(kind, rejection.body_text())
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        if e.is_data() {
            ApiError::new(ErrorKind::Invalid, format!("invalid request body: {e}"))
        } else {
            ApiError::new(
                ErrorKind::InvalidJson,
                format!("body is not valid JSON: {e}"),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_accept_string_and_array_only() {
        let one: Inputs = serde_json::from_str(r#""猫""#).unwrap();
        assert_eq!(one.0, vec!["猫"]);
        let many: Inputs = serde_json::from_str(r#"["a", "b"]"#).unwrap();
        assert_eq!(many.0, vec!["a", "b"]);
        assert!(serde_json::from_str::<Inputs>("[1, 2]").is_err());
        assert!(serde_json::from_str::<Inputs>("5").is_err());
    }
}
