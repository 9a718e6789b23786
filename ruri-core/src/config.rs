//! Model-folder configuration, keyed like the files it reads.
//!
//! Published Ruri v3 folders were written by transformers 4.x / sentence-transformers 3–4
//! (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`, …); transformers 5
//! writes `layer_types` and `rope_parameters` instead. Both spellings are accepted and turned
//! into one [`ModelConfig`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{Error, Result};

/// Reads and parses a JSON file that must exist.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    read_optional_json(path)?.ok_or_else(|| Error::MissingFile {
        path: path.to_path_buf(),
    })
}

/// Reads and parses a JSON file; `Ok(None)` when it does not exist.
pub(crate) fn read_optional_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| Error::InvalidJson {
            path: path.to_path_buf(),
            source,
        })
}

/// Attention kind of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Every token attends to every token.
    Global,
    /// Tokens attend only within `|i − j| ≤ local_attention / 2`.
    Local,
}

/// The ModernBERT configuration of a Ruri v3 model (`config.json`), in one spelling.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ModelConfig {
    /// Width of the hidden states and of the output embedding.
    pub hidden_size: usize,
    /// Number of transformer layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer.
    pub num_attention_heads: usize,
    /// Width of the GeGLU MLP (each of its two halves).
    pub intermediate_size: usize,
    /// Vocabulary size of the embedding matrix.
    pub vocab_size: usize,
    /// Longest sequence the position encoding is meant for.
    pub max_position_embeddings: usize,
    /// Id of `<pad>`.
    pub pad_token_id: u32,
    /// Id of `<s>`, which opens every sequence (1 in Ruri v3).
    pub bos_token_id: u32,
    /// Id of `</s>`, which closes every sequence (2 in Ruri v3).
    pub eos_token_id: u32,
    /// LayerNorm epsilon.
    pub norm_eps: f64,
    /// Total width of the local attention window (128 in Ruri v3: `|i − j| ≤ 64`).
    pub local_attention: usize,
    /// Attention kind of each layer, `num_hidden_layers` long.
    pub layer_types: Vec<AttentionKind>,
    /// RoPE θ of global layers.
    pub global_rope_theta: f64,
    /// RoPE θ of local layers.
    pub local_rope_theta: f64,
    /// MLP activation (`"gelu"`: exact erf GELU).
    pub hidden_activation: String,
}

/// `config.json` as written by either transformers 4.x or 5.x.
#[derive(Deserialize)]
struct RawModelConfig {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    vocab_size: usize,
    max_position_embeddings: Option<usize>,
    pad_token_id: Option<u32>,
    norm_eps: Option<f64>,
    layer_norm_eps: Option<f64>,
    local_attention: Option<usize>,
    /// transformers 5 derives the half window from `local_attention`, but write it too.
    sliding_window: Option<usize>,
    // transformers 4.x spelling
    global_attn_every_n_layers: Option<usize>,
    global_rope_theta: Option<f64>,
    local_rope_theta: Option<f64>,
    // transformers 5.x spelling
    layer_types: Option<Vec<String>>,
    rope_parameters: Option<BTreeMap<String, RopeParameters>>,
    hidden_activation: Option<String>,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
}

// transformers' ModernBertConfig defaults, used when a key is absent.
const DEFAULT_GLOBAL_EVERY: usize = 3;
const DEFAULT_GLOBAL_THETA: f64 = 160_000.0;
const DEFAULT_LOCAL_THETA: f64 = 10_000.0;
const DEFAULT_LOCAL_ATTENTION: usize = 128;
const DEFAULT_NORM_EPS: f64 = 1e-5;
const DEFAULT_MAX_POSITIONS: usize = 8192;
const DEFAULT_PAD_ID: u32 = 3;
const DEFAULT_BOS_ID: u32 = 1;
const DEFAULT_EOS_ID: u32 = 2;

/// Checkpoint classes whose encoder is the plain ModernBERT stack a sentence-transformers
/// `Transformer` module runs (`AutoModel` loads the encoder of either; a masked-LM checkpoint
/// keeps it under `model.`).
const ENCODER_ARCHITECTURES: &[&str] = &["ModernBertModel", "ModernBertForMaskedLM"];

impl ModelConfig {
    /// What every engine of this workspace refuses in a `config.json` that parsed: an
    /// activation other than `"gelu"` (the erf GELU Ruri v3 uses; [`Error::Unsupported`]),
    /// and an odd head dimension (rotary embeddings rotate pairs; [`Error::InvalidConfig`]).
    /// `config_path` names the file in the error.
    pub fn check_supported(&self, config_path: &Path) -> Result<()> {
        if self.hidden_activation != "gelu" {
            return Err(Error::Unsupported {
                path: config_path.to_path_buf(),
                what: format!(
                    "hidden_activation {:?} (Ruri v3 uses \"gelu\", the erf GELU)",
                    self.hidden_activation
                ),
            });
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(Error::InvalidConfig {
                path: config_path.to_path_buf(),
                reason: format!(
                    "head dimension {} is odd: RoPE needs pairs",
                    self.head_dim()
                ),
            });
        }
        Ok(())
    }

    /// Reads `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let raw: RawModelConfig = read_json(path)?;
        Self::from_raw(raw, path)
    }

    /// Parses the text of a `config.json`; `origin` names it in errors.
    pub fn from_json_str(json: &str, origin: impl Into<PathBuf>) -> Result<Self> {
        let origin = origin.into();
        let raw: RawModelConfig =
            serde_json::from_str(json).map_err(|source| Error::InvalidJson {
                path: origin.clone(),
                source,
            })?;
        Self::from_raw(raw, &origin)
    }

    fn from_raw(raw: RawModelConfig, path: &Path) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        if let Some(model_type) = raw.model_type.as_deref().filter(|t| *t != "modernbert") {
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: format!("model_type {model_type:?} (Ruri v3 is \"modernbert\")"),
            });
        }
        // A reranker or classifier (ModernBertForSequenceClassification, …) has the same
        // encoder shapes and loads without complaint, but its mean-pooled hidden states are not
        // embeddings anything was trained for: refuse it by name.
        if let Some(other) = raw
            .architectures
            .iter()
            .flatten()
            .find(|a| !ENCODER_ARCHITECTURES.contains(&a.as_str()))
        {
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: format!(
                    "architecture {other:?}: not a plain encoder (a reranker, classifier or \
                     other task head); ruri embeds with {} checkpoints, as the Ruri v3 \
                     sentence-transformers folders are",
                    ENCODER_ARCHITECTURES.join(" or ")
                ),
            });
        }
        if raw.hidden_size == 0 || raw.num_attention_heads == 0 {
            return Err(invalid(
                "hidden_size and num_attention_heads must be positive".into(),
            ));
        }
        if !raw.hidden_size.is_multiple_of(raw.num_attention_heads) {
            return Err(invalid(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                raw.hidden_size, raw.num_attention_heads
            )));
        }

        let layer_types = match (&raw.layer_types, raw.global_attn_every_n_layers) {
            (Some(types), _) => types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(AttentionKind::Global),
                    "sliding_attention" => Ok(AttentionKind::Local),
                    other => Err(invalid(format!("unknown layer type {other:?}"))),
                })
                .collect::<Result<Vec<_>>>()?,
            (None, every) => {
                let every = every.unwrap_or(DEFAULT_GLOBAL_EVERY);
                if every == 0 {
                    return Err(invalid(
                        "global_attn_every_n_layers must be positive".into(),
                    ));
                }
                // As transformers' ModernBERT: layer i is global when i % every == 0.
                (0..raw.num_hidden_layers)
                    .map(|i| {
                        if i % every == 0 {
                            AttentionKind::Global
                        } else {
                            AttentionKind::Local
                        }
                    })
                    .collect()
            }
        };
        if layer_types.len() != raw.num_hidden_layers {
            return Err(invalid(format!(
                "layer_types has {} entries for {} layers",
                layer_types.len(),
                raw.num_hidden_layers
            )));
        }

        let theta_of = |key: &str| -> Result<Option<f64>> {
            let Some(params) = raw.rope_parameters.as_ref().and_then(|p| p.get(key)) else {
                return Ok(None);
            };
            match params.rope_type.as_deref() {
                None | Some("default") => Ok(params.rope_theta),
                Some(other) => Err(Error::Unsupported {
                    path: path.to_path_buf(),
                    what: format!("rope_type {other:?} for {key}"),
                }),
            }
        };
        let global_rope_theta = theta_of("full_attention")?
            .or(raw.global_rope_theta)
            .unwrap_or(DEFAULT_GLOBAL_THETA);
        let local_rope_theta = theta_of("sliding_attention")?
            .or(raw.local_rope_theta)
            .unwrap_or(DEFAULT_LOCAL_THETA);

        let local_attention = raw
            .local_attention
            .or(raw.sliding_window.map(|half| half * 2))
            .unwrap_or(DEFAULT_LOCAL_ATTENTION);

        Ok(Self {
            hidden_size: raw.hidden_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            intermediate_size: raw.intermediate_size,
            vocab_size: raw.vocab_size,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(DEFAULT_MAX_POSITIONS),
            pad_token_id: raw.pad_token_id.unwrap_or(DEFAULT_PAD_ID),
            bos_token_id: raw.bos_token_id.unwrap_or(DEFAULT_BOS_ID),
            eos_token_id: raw.eos_token_id.unwrap_or(DEFAULT_EOS_ID),
            norm_eps: raw
                .norm_eps
                .or(raw.layer_norm_eps)
                .unwrap_or(DEFAULT_NORM_EPS),
            local_attention,
            layer_types,
            global_rope_theta,
            local_rope_theta,
            hidden_activation: raw.hidden_activation.unwrap_or_else(|| "gelu".into()),
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// The tensors a ModernBERT checkpoint (`model.safetensors`) of this configuration must
    /// hold, with their shapes: names without the `model.` prefix, `nn.Linear` weights as
    /// `out × in`, and no `attn_norm` in layer 0 (transformers makes it an identity).
    pub fn checkpoint_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let mut all = vec![
            (
                "embeddings.tok_embeddings.weight".to_owned(),
                vec![self.vocab_size, h],
            ),
            ("embeddings.norm.weight".to_owned(), vec![h]),
            ("final_norm.weight".to_owned(), vec![h]),
        ];
        for n in 0..self.num_hidden_layers {
            if n > 0 {
                all.push((format!("layers.{n}.attn_norm.weight"), vec![h]));
            }
            all.push((format!("layers.{n}.attn.Wqkv.weight"), vec![3 * h, h]));
            all.push((format!("layers.{n}.attn.Wo.weight"), vec![h, h]));
            all.push((format!("layers.{n}.mlp_norm.weight"), vec![h]));
            all.push((format!("layers.{n}.mlp.Wi.weight"), vec![2 * i, h]));
            all.push((format!("layers.{n}.mlp.Wo.weight"), vec![h, i]));
        }
        all
    }
}

/// The prefix a ModernBERT checkpoint puts before the names of
/// [`ModelConfig::checkpoint_tensors`]: `""` for sentence-transformers checkpoints (the
/// transformer saved alone) or `"model."` for transformers' `ModernBertForMaskedLM` and
/// candle-transformers' layout. `has` says whether the file at `weights` holds a tensor of
/// that name; a file with the embedding matrix under neither name is
/// [`Error::InvalidConfig`]. Both backends that read `model.safetensors` ask here, so they
/// accept the same files.
///
/// ```
/// let names = ["model.embeddings.tok_embeddings.weight", "model.final_norm.weight"];
/// let prefix = ruri_core::checkpoint_prefix("model.safetensors".as_ref(), |n| names.contains(&n))?;
/// assert_eq!(prefix, "model.");
/// # Ok::<(), ruri_core::Error>(())
/// ```
pub fn checkpoint_prefix(weights: &Path, has: impl Fn(&str) -> bool) -> Result<&'static str> {
    // The first tensor of every checkpoint, and the one both layouts name alike otherwise.
    const PROBE: &str = "embeddings.tok_embeddings.weight";
    if has(PROBE) {
        Ok("")
    } else if has(&format!("model.{PROBE}")) {
        Ok("model.")
    } else {
        Err(Error::InvalidConfig {
            path: weights.to_path_buf(),
            reason: format!(
                "no {PROBE} tensor, with or without a `model.` prefix: not a ModernBERT checkpoint"
            ),
        })
    }
}

/// Pooling mode of `1_Pooling/config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pooling {
    /// Mean of the token embeddings under the attention mask (Ruri v3).
    Mean,
}

#[derive(Deserialize)]
struct RawPoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    /// Whether prompt tokens count in the mean (sentence-transformers' default: yes).
    #[serde(default = "default_true")]
    include_prompt: bool,
    /// sentence-transformers ≥ 5 spelling.
    pooling_mode: Option<String>,
}

fn default_true() -> bool {
    true
}

impl Pooling {
    /// Reads `1_Pooling/config.json`; only mean pooling (what every Ruri v3 model uses) is
    /// accepted, anything else is [`Error::Unsupported`] rather than silently wrong vectors.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let raw: RawPoolingConfig = read_json(path)?;
        let unsupported = |what: &str| Error::Unsupported {
            path: path.to_path_buf(),
            what: format!("pooling {what} (only mean pooling is implemented)"),
        };
        if !raw.include_prompt {
            return Err(unsupported("without prompt tokens (include_prompt: false)"));
        }
        if let Some(mode) = raw.pooling_mode.as_deref() {
            return match mode {
                "mean" => Ok(Pooling::Mean),
                other => Err(unsupported(other)),
            };
        }
        let others = [
            ("cls", raw.pooling_mode_cls_token),
            ("max", raw.pooling_mode_max_tokens),
            ("mean_sqrt_len", raw.pooling_mode_mean_sqrt_len_tokens),
            ("weightedmean", raw.pooling_mode_weightedmean_tokens),
            ("lasttoken", raw.pooling_mode_lasttoken),
        ];
        if let Some((name, _)) = others.iter().find(|(_, on)| *on) {
            return Err(unsupported(name));
        }
        if !raw.pooling_mode_mean_tokens {
            return Err(unsupported("with no mode enabled"));
        }
        Ok(Pooling::Mean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE_T5: &str = include_str!("../tests/fixtures/transformers5-config.json");

    #[test]
    fn transformers5_spelling() {
        let c = ModelConfig::from_json_str(FIXTURE_T5, "t5.json").unwrap();
        assert_eq!(c.hidden_size, 64);
        assert_eq!(c.head_dim(), 16);
        assert_eq!(c.pad_token_id, 3);
        assert_eq!(c.local_attention, 128);
        assert_eq!(c.global_rope_theta, 160_000.0);
        assert_eq!(c.local_rope_theta, 10_000.0);
        use AttentionKind::*;
        assert_eq!(c.layer_types, vec![Global, Local, Local, Global]);
    }

    #[test]
    fn legacy_spelling_matches_transformers5() {
        let legacy = r#"{"model_type": "modernbert", "hidden_size": 64, "num_hidden_layers": 4,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 8000,
            "max_position_embeddings": 8192, "pad_token_id": 3, "norm_eps": 1e-05,
            "layer_norm_eps": 1e-05, "local_attention": 128, "global_attn_every_n_layers": 3,
            "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
            "hidden_activation": "gelu"}"#;
        let a = ModelConfig::from_json_str(legacy, "legacy.json").unwrap();
        let b = ModelConfig::from_json_str(FIXTURE_T5, "t5.json").unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn refuses_task_heads_by_name_and_accepts_encoders() {
        let with = |arch: &str| {
            format!(
                r#"{{"model_type": "modernbert", "architectures": ["{arch}"], "hidden_size": 64,
                "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 8,
                "vocab_size": 10}}"#
            )
        };
        for arch in [
            "ModernBertForSequenceClassification",
            "ModernBertForTokenClassification",
            "ModernBertForQuestionAnswering",
        ] {
            match ModelConfig::from_json_str(&with(arch), "c.json") {
                Err(Error::Unsupported { what, .. }) => assert!(what.contains(arch), "{what}"),
                other => panic!("{arch}: {other:?}"),
            }
        }
        for arch in ["ModernBertModel", "ModernBertForMaskedLM"] {
            let c = ModelConfig::from_json_str(&with(arch), "c.json").unwrap();
            assert_eq!((c.bos_token_id, c.eos_token_id), (1, 2));
        }
    }

    #[test]
    fn rejects_other_architectures_and_bad_shapes() {
        let bert = r#"{"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 10}"#;
        assert!(matches!(
            ModelConfig::from_json_str(bert, "c.json"),
            Err(Error::Unsupported { .. })
        ));
        let odd = r#"{"hidden_size": 65, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 10}"#;
        assert!(matches!(
            ModelConfig::from_json_str(odd, "c.json"),
            Err(Error::InvalidConfig { .. })
        ));
        let types = r#"{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 8, "vocab_size": 10, "layer_types": ["full_attention"]}"#;
        assert!(matches!(
            ModelConfig::from_json_str(types, "c.json"),
            Err(Error::InvalidConfig { .. })
        ));
        assert!(matches!(
            ModelConfig::from_json_str("{", "c.json"),
            Err(Error::InvalidJson { .. })
        ));
    }
}
