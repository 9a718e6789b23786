//! A model folder on disk: which files it has and what they say.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ruri_tokenize::Tokenizer;
use serde::Deserialize;

use crate::config::{ModelConfig, Pooling, read_optional_json};
use crate::{Error, Result, Task};

/// The Ruri v3 prompts, as published (ASCII colon and one ASCII space).
pub mod prompts {
    /// Prefix for search queries.
    pub const QUERY: &str = "検索クエリ: ";
    /// Prefix for documents to be searched.
    pub const DOCUMENT: &str = "検索文書: ";
    /// Prefix for classification and clustering.
    pub const TOPIC: &str = "トピック: ";
}

/// How the folder is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// A sentence-transformers folder (`modules.json`, `1_Pooling/`, `model.safetensors`, …),
    /// as the published Ruri v3 models.
    SentenceTransformers,
    /// An ONNX port (`config.json`, `tokenizer*.json`, `onnx/*.onnx`, no `modules.json`), as
    /// sirasagi62/ruri-v3-30m-ONNX. Mean pooling is assumed.
    OnnxPort,
}

/// The named prompts of a model: `config_sentence_transformers.json`'s `prompts` over the Ruri
/// v3 defaults (`query`, `document`, `topic`), and its `default_prompt_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompts {
    by_name: BTreeMap<String, String>,
    default_name: Option<String>,
}

impl Default for Prompts {
    fn default() -> Self {
        let by_name = [
            ("query", prompts::QUERY),
            ("document", prompts::DOCUMENT),
            ("topic", prompts::TOPIC),
            ("", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        Self {
            by_name,
            default_name: None,
        }
    }
}

impl Prompts {
    /// The prompt registered under `name`, if any.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.by_name.get(name).map(String::as_str)
    }

    /// `config_sentence_transformers.json`'s `default_prompt_name`: the prompt
    /// sentence-transformers' `encode` applies when a call names none (`None` for Ruri v3).
    /// ruri's own calls name their task ([`Task`]), so only callers that mirror `encode` (the
    /// Python package) use it.
    pub fn default_name(&self) -> Option<&str> {
        self.default_name.as_deref()
    }

    /// All prompt names and texts, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_name.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The text to prepend for `task`.
    pub fn resolve<'a>(&'a self, task: &'a Task) -> Result<&'a str> {
        let name = match task {
            Task::None => return Ok(""),
            Task::Prompt(text) => return Ok(text),
            Task::Query => "query",
            Task::Document => "document",
            Task::Topic => "topic",
            Task::Named(name) => name,
        };
        self.get(name).ok_or_else(|| Error::InvalidOption {
            name: "prompt_name",
            value: name.to_owned(),
            reason: "no prompt of that name in config_sentence_transformers.json",
        })
    }
}

/// One entry of `modules.json`.
#[derive(Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
}

/// Refuses pipelines with modules the shared pipeline does not run (Dense, a second
/// Transformer, …): better an error than vectors that silently differ from
/// sentence-transformers'. Ruri v3 is Transformer + Pooling; a trailing `Normalize` is
/// accepted (the pipeline normalizes by default) and reported.
fn check_modules(path: &Path) -> Result<bool> {
    let modules: Vec<Module> = crate::config::read_json(path)?;
    // Legacy `sentence_transformers.models.Pooling` and the 5.x module paths alike.
    let names: Vec<&str> = modules
        .iter()
        .map(|m| m.kind.rsplit('.').next().unwrap_or_default())
        .collect();
    let unsupported = |what: String| Error::Unsupported {
        path: path.to_path_buf(),
        what,
    };
    for (module, name) in modules.iter().zip(&names) {
        if !matches!(*name, "Transformer" | "Pooling" | "Normalize") {
            return Err(unsupported(format!(
                "sentence-transformers module {:?}",
                module.kind
            )));
        }
    }
    match names.as_slice() {
        ["Transformer", "Pooling"] => Ok(false),
        ["Transformer", "Pooling", "Normalize"] => Ok(true),
        other => Err(unsupported(format!(
            "the module sequence {other:?} (ruri runs Transformer, Pooling and an optional \
             Normalize, in that order)"
        ))),
    }
}

#[derive(Deserialize)]
struct SentenceTransformersConfig {
    #[serde(default)]
    prompts: BTreeMap<String, String>,
    default_prompt_name: Option<String>,
    /// sentence-transformers ≥ 4 writes the model class: `SentenceTransformer`,
    /// `CrossEncoder` (rerankers) or `SparseEncoder`.
    model_type: Option<String>,
}

/// `sentence_bert_config.json`, only the key we need.
#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

/// `tokenizer_config.json`, only the keys we need. Tokens may be plain strings or
/// `{"content": …}` objects depending on the transformers version that wrote the file.
#[derive(Deserialize)]
struct TokenizerConfig {
    model_max_length: Option<f64>,
    pad_token: Option<TokenSpelling>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TokenSpelling {
    Plain(String),
    Object { content: String },
}

impl TokenSpelling {
    fn into_string(self) -> String {
        match self {
            TokenSpelling::Plain(s) | TokenSpelling::Object { content: s } => s,
        }
    }
}

/// The maximum length as sentence-transformers resolves it: `max_seq_length` when configured,
/// otherwise the smaller of the tokenizer's `model_max_length` and the model's
/// `max_position_embeddings`. transformers writes a huge sentinel (1e30) for "no limit"; it
/// is ignored.
fn resolve_max_length(
    st: Option<SentenceBertConfig>,
    tokenizer: Option<&TokenizerConfig>,
    config: &ModelConfig,
) -> usize {
    if let Some(max) = st.and_then(|c| c.max_seq_length) {
        return max;
    }
    let tokenizer_max = tokenizer
        .and_then(|c| c.model_max_length)
        .filter(|m| (1.0..1e9).contains(m))
        .map(|m| m as usize);
    tokenizer_max.map_or(config.max_position_embeddings, |m| {
        m.min(config.max_position_embeddings)
    })
}

/// An opened model folder: its layout and parsed configuration. Backends find their weight
/// files through it; the tokenizer and prompts come from it.
#[derive(Debug, Clone)]
pub struct ModelDir {
    root: PathBuf,
    layout: Layout,
    config: ModelConfig,
    pooling: Pooling,
    prompts: Prompts,
    normalize_module: bool,
    max_length: usize,
    pad_token: Option<String>,
}

impl ModelDir {
    /// Opens a folder in either layout and parses `config.json`, `modules.json`,
    /// `1_Pooling/config.json`, `config_sentence_transformers.json`,
    /// `sentence_bert_config.json` and `tokenizer_config.json`. Weight files and
    /// `tokenizer.json` are not touched here.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        if !root.is_dir() {
            return Err(Error::MissingFile { path: root });
        }
        let config = ModelConfig::from_file(root.join("config.json"))?;
        let modules_path = root.join("modules.json");
        let (layout, normalize_module) = if modules_path.is_file() {
            (Layout::SentenceTransformers, check_modules(&modules_path)?)
        } else {
            (Layout::OnnxPort, false)
        };
        let pooling_path = root.join("1_Pooling").join("config.json");
        let pooling = if pooling_path.is_file() {
            Pooling::from_file(&pooling_path)?
        } else {
            Pooling::Mean
        };
        let mut prompts = Prompts::default();
        let st_path = root.join("config_sentence_transformers.json");
        let st: Option<SentenceTransformersConfig> = read_optional_json(&st_path)?;
        if let Some(st) = st {
            if let Some(kind) = st.model_type.filter(|k| k != "SentenceTransformer") {
                return Err(Error::Unsupported {
                    path: st_path,
                    what: format!(
                        "a sentence-transformers {kind} (ruri embeds with SentenceTransformer \
                         models; a CrossEncoder is a reranker)"
                    ),
                });
            }
            prompts.by_name.extend(st.prompts);
            prompts.default_name = st.default_prompt_name;
        }
        let sentence_bert: Option<SentenceBertConfig> =
            read_optional_json(&root.join("sentence_bert_config.json"))?;
        let tokenizer_config: Option<TokenizerConfig> =
            read_optional_json(&root.join("tokenizer_config.json"))?;
        let max_length = resolve_max_length(sentence_bert, tokenizer_config.as_ref(), &config);
        let pad_token = tokenizer_config
            .and_then(|c| c.pad_token)
            .map(TokenSpelling::into_string);
        Ok(Self {
            root,
            layout,
            config,
            pooling,
            prompts,
            normalize_module,
            max_length,
            pad_token,
        })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Its layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// `config.json`.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The pooling the model was trained with.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether `modules.json` ends with a `Normalize` module. Its output is what the pipeline
    /// returns by default (unit vectors); with `normalize(false)` ruri returns the mean-pooled
    /// vectors before it.
    pub fn has_normalize_module(&self) -> bool {
        self.normalize_module
    }

    /// The longest input in tokens, special tokens included, as sentence-transformers
    /// resolves it (`sentence_bert_config.json`'s `max_seq_length`, else the smaller of
    /// `tokenizer_config.json`'s `model_max_length` and `config.json`'s
    /// `max_position_embeddings`).
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// `tokenizer_config.json`'s `pad_token`, if it names one (else `<pad>` is used).
    pub fn pad_token(&self) -> Option<&str> {
        self.pad_token.as_deref()
    }

    /// Named prompts.
    pub fn prompts(&self) -> &Prompts {
        &self.prompts
    }

    /// `relative` inside the folder, or [`Error::MissingFile`] if it is not a file.
    pub fn file(&self, relative: impl AsRef<Path>) -> Result<PathBuf> {
        let path = self.root.join(relative);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::MissingFile { path })
        }
    }

    /// Loads the tokenizer and checks it against `config.json`: same pad id (checked by
    /// `ruri-tokenize`), no token id outside the embedding matrix, and a template that frames
    /// a text as `<s> … </s>` with the config's `bos_token_id` / `eos_token_id` (a tokenizer
    /// with another post-processor would feed the model sequences it was never trained on).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let path = self.file("tokenizer.json")?;
        let json = std::fs::read(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        checked_tokenizer(
            &json,
            &self.config,
            self.max_length,
            self.pad_token(),
            &self.root,
        )
    }
}

/// A model described by the texts of its `config.json` and `tokenizer.json`, where there is
/// no folder to open (a WebAssembly host passes them in): what [`ModelDir`] reads from those
/// two files, with the same checks. The prompts are Ruri v3's ([`Prompts::default`]) and the
/// pooling mean; the maximum length is the one given, else `config.json`'s
/// `max_position_embeddings` (8,192 for Ruri v3, what sentence-transformers resolves for
/// the published folders). Errors name `config.json` and `tokenizer.json`.
///
/// ```
/// # let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/tiny");
/// use ruri_core::ModelTexts;
///
/// let config = std::fs::read_to_string(folder.join("config.json"))?;
/// let tokenizer = std::fs::read_to_string(folder.join("tokenizer.json"))?;
/// let model = ModelTexts::new(&config, &tokenizer, Some(128))?;
/// assert_eq!(model.tokenizer().max_length(), 128);
/// assert_eq!(ModelTexts::new(&config, &tokenizer, None)?.tokenizer().max_length(), 8192);
///
/// // The tokenizer is checked against config.json as a folder's is.
/// let other = config.replace("\"pad_token_id\": 3", "\"pad_token_id\": 0");
/// assert_ne!(other, config);
/// assert!(matches!(
///     ModelTexts::new(&other, &tokenizer, None),
///     Err(ruri_core::Error::InvalidConfig { .. })
/// ));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ModelTexts {
    config_json: String,
    config: ModelConfig,
    tokenizer: Tokenizer,
}

impl ModelTexts {
    /// Parses `config.json`'s text and builds the tokenizer from `tokenizer.json`'s, with
    /// inputs of at most `max_length` tokens (special ones included; `None`: the model's
    /// `max_position_embeddings`). A `config.json` that is not JSON is
    /// [`Error::InvalidJson`] (one that is, but not a ModernBERT config ruri reads,
    /// [`Error::InvalidConfig`] or [`Error::Unsupported`], as from a folder); a
    /// `tokenizer.json` ruri cannot run, JSON or not, [`Error::InvalidTokenizer`]; a
    /// tokenizer that disagrees with `config.json` (pad id, `<s> … </s>` ids, more pieces
    /// than `vocab_size`) [`Error::InvalidConfig`]; a `max_length` of 0 [`Error::Tokenizer`].
    pub fn new(config_json: &str, tokenizer_json: &str, max_length: Option<usize>) -> Result<Self> {
        let config = ModelConfig::from_json_str(config_json, "config.json")?;
        let max_length = max_length.unwrap_or(config.max_position_embeddings);
        let tokenizer = checked_tokenizer(
            tokenizer_json.as_bytes(),
            &config,
            max_length,
            None,
            Path::new(""),
        )?;
        Ok(Self {
            config_json: config_json.to_owned(),
            config,
            tokenizer,
        })
    }

    /// `config.json`, parsed.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// `config.json`'s text, as given.
    pub fn config_json(&self) -> &str {
        &self.config_json
    }

    /// The tokenizer, checked against `config.json`.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The tokenizer and `config.json`, parsed.
    pub fn into_parts(self) -> (Tokenizer, ModelConfig) {
        (self.tokenizer, self.config)
    }
}

/// The tokenizer of `json` (`tokenizer.json` in `root`), checked against `config`: same pad
/// id (checked by `ruri-tokenize`), no token id outside the embedding matrix, and a template
/// that frames a text as `<s> … </s>` with the config's `bos_token_id` / `eos_token_id` (a
/// tokenizer with another post-processor would feed the model sequences it was never trained
/// on).
fn checked_tokenizer(
    json: &[u8],
    config: &ModelConfig,
    max_length: usize,
    pad_token: Option<&str>,
    root: &Path,
) -> Result<Tokenizer> {
    let path = root.join("tokenizer.json");
    let tokenizer =
        Tokenizer::from_json(json, max_length, pad_token).map_err(|source| match source {
            ruri_tokenize::TokenizeError::InvalidTokenizer { .. } => Error::InvalidTokenizer {
                path: path.clone(),
                source,
            },
            // A pad token or maximum length the folder's configs ask for.
            other => Error::Tokenizer(other),
        })?;
    if tokenizer.pad_id() != config.pad_token_id {
        return Err(Error::InvalidConfig {
            path: root.join("config.json"),
            reason: format!(
                "pad_token_id is {} but the tokenizer pads with id {} ({})",
                config.pad_token_id,
                tokenizer.pad_id(),
                pad_token.unwrap_or("<pad>")
            ),
        });
    }
    let framed = tokenizer.encode("", "", ruri_tokenize::Truncation::Truncate)?;
    let expected = [config.bos_token_id, config.eos_token_id];
    if framed.ids() != expected {
        return Err(Error::InvalidConfig {
            path: path.clone(),
            reason: format!(
                "its post-processor frames an empty text as {:?}, but config.json's \
                 bos_token_id and eos_token_id are {expected:?}: ruri needs the template \
                 `<s> $A </s>` with those ids",
                framed.ids()
            ),
        });
    }
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(Error::InvalidConfig {
            path,
            reason: format!(
                "the tokenizer has {} pieces but config.json's vocab_size is {}",
                tokenizer.vocab_size(),
                config.vocab_size
            ),
        });
    }
    Ok(tokenizer)
}
