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
/// v3 defaults (`query`, `document`, `topic`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompts {
    by_name: BTreeMap<String, String>,
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
        Self { by_name }
    }
}

impl Prompts {
    /// The prompt registered under `name`, if any.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.by_name.get(name).map(String::as_str)
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

/// Refuses pipelines with modules the shared pipeline does not run (Dense, Normalize, …):
/// better an error than vectors that silently differ from sentence-transformers'. Ruri v3 is
/// Transformer + Pooling.
fn check_modules(path: &Path) -> Result<()> {
    let modules: Vec<Module> = crate::config::read_json(path)?;
    for module in &modules {
        // Legacy `sentence_transformers.models.Pooling` and the 5.x module paths alike.
        let name = module.kind.rsplit('.').next().unwrap_or_default();
        if !matches!(name, "Transformer" | "Pooling") {
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: format!("sentence-transformers module {:?}", module.kind),
            });
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct SentenceTransformersConfig {
    #[serde(default)]
    prompts: BTreeMap<String, String>,
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
}

impl ModelDir {
    /// Opens a folder in either layout and parses `config.json`, `1_Pooling/config.json` and
    /// `config_sentence_transformers.json`. Weight files are not touched here.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        if !root.is_dir() {
            return Err(Error::MissingFile { path: root });
        }
        let config = ModelConfig::from_file(root.join("config.json"))?;
        let modules_path = root.join("modules.json");
        let layout = if modules_path.is_file() {
            check_modules(&modules_path)?;
            Layout::SentenceTransformers
        } else {
            Layout::OnnxPort
        };
        let pooling_path = root.join("1_Pooling").join("config.json");
        let pooling = if pooling_path.is_file() {
            Pooling::from_file(&pooling_path)?
        } else {
            Pooling::Mean
        };
        let mut prompts = Prompts::default();
        let st: Option<SentenceTransformersConfig> =
            read_optional_json(&root.join("config_sentence_transformers.json"))?;
        if let Some(st) = st {
            prompts.by_name.extend(st.prompts);
        }
        Ok(Self {
            root,
            layout,
            config,
            pooling,
            prompts,
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
    /// `ruri-tokenize`), and no token id outside the embedding matrix.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let tokenizer = Tokenizer::from_dir(&self.root)?;
        if tokenizer.vocab_size() > self.config.vocab_size {
            return Err(Error::InvalidConfig {
                path: self.root.join("tokenizer.json"),
                reason: format!(
                    "the tokenizer has {} pieces but config.json's vocab_size is {}",
                    tokenizer.vocab_size(),
                    self.config.vocab_size
                ),
            });
        }
        Ok(tokenizer)
    }
}
