//! A Ruri v3-shaped model folder with random weights, made where it runs: the 30m shape is
//! 147 MB in f32, more than a lent GPU machine can be carried, and speed does not depend on
//! weight values.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::Failure;

/// The published Ruri v3 sizes (config.json of each, `testdata/README.md`).
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub name: &'static str,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
}

pub const SHAPES: [Shape; 4] = [
    Shape {
        name: "30m",
        hidden: 256,
        layers: 10,
        heads: 4,
        intermediate: 1024,
        vocab: 102_400,
    },
    Shape {
        name: "70m",
        hidden: 384,
        layers: 13,
        heads: 6,
        intermediate: 1536,
        vocab: 102_400,
    },
    Shape {
        name: "130m",
        hidden: 512,
        layers: 19,
        heads: 8,
        intermediate: 2048,
        vocab: 102_400,
    },
    Shape {
        name: "310m",
        hidden: 768,
        layers: 25,
        heads: 12,
        intermediate: 3072,
        vocab: 102_400,
    },
];

/// SplitMix64: deterministic, fast, no dependency.
struct Rng(u64);

impl Rng {
    /// Uniform in [-1, 1).
    fn next_unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    fn tensor(&mut self, shape: &[usize], scale: f32, offset: f32) -> candle_core::Result<Tensor> {
        let n = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|_| offset + scale * self.next_unit()).collect();
        Tensor::from_vec(data, shape, &Device::Cpu)
    }
}

/// Writes `dir` as a sentence-transformers folder of `shape`: the tokenizer and module files
/// of `template` (the committed tiny model), its config.json with the shape's sizes, and
/// random f32 weights (std 1/√fan-in for matrices, so activations keep their scale through
/// the layers; norm weights 1 ± 0.1). Returns the parameter count.
pub fn write_random_model(shape: &Shape, template: &Path, dir: &Path) -> Result<usize, Failure> {
    fs::create_dir_all(dir.join("1_Pooling"))?;
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "modules.json",
        "config_sentence_transformers.json",
        "1_Pooling/config.json",
    ] {
        if template.join(file).is_file() {
            fs::copy(template.join(file), dir.join(file))?;
        }
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&fs::read(template.join("config.json"))?)?;
    for (key, value) in [
        ("hidden_size", shape.hidden),
        ("num_hidden_layers", shape.layers),
        ("num_attention_heads", shape.heads),
        ("intermediate_size", shape.intermediate),
        ("vocab_size", shape.vocab),
    ] {
        config[key] = value.into();
    }
    fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    // The published folders' maximum length.
    fs::write(
        dir.join("sentence_bert_config.json"),
        r#"{"max_seq_length": 8192, "do_lower_case": false}"#,
    )?;

    let (h, i) = (shape.hidden, shape.intermediate);
    let mut rng = Rng(0x5275_7269_3330_6d00 ^ h as u64);
    let sqrt3 = 3f32.sqrt();
    let matrix = |rng: &mut Rng, rows: usize, cols: usize| {
        rng.tensor(&[rows, cols], sqrt3 / (cols as f32).sqrt(), 0.0)
    };
    let norm = |rng: &mut Rng| rng.tensor(&[h], 0.1 * sqrt3, 1.0);
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    tensors.insert(
        "embeddings.tok_embeddings.weight".into(),
        rng.tensor(&[shape.vocab, h], sqrt3, 0.0)?,
    );
    tensors.insert("embeddings.norm.weight".into(), norm(&mut rng)?);
    tensors.insert("final_norm.weight".into(), norm(&mut rng)?);
    for n in 0..shape.layers {
        // transformers' ModernBERT has no attention norm on layer 0.
        if n > 0 {
            tensors.insert(format!("layers.{n}.attn_norm.weight"), norm(&mut rng)?);
        }
        tensors.insert(
            format!("layers.{n}.attn.Wqkv.weight"),
            matrix(&mut rng, 3 * h, h)?,
        );
        tensors.insert(
            format!("layers.{n}.attn.Wo.weight"),
            matrix(&mut rng, h, h)?,
        );
        tensors.insert(format!("layers.{n}.mlp_norm.weight"), norm(&mut rng)?);
        tensors.insert(
            format!("layers.{n}.mlp.Wi.weight"),
            matrix(&mut rng, 2 * i, h)?,
        );
        tensors.insert(format!("layers.{n}.mlp.Wo.weight"), matrix(&mut rng, h, i)?);
    }
    let params = tensors.values().map(Tensor::elem_count).sum();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    Ok(params)
}
