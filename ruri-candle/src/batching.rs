//! The batch limits each device runs best with (TEI's backends advise theirs the same way:
//! `max_batch_size()` is `Some(4)` on CPU and `None` on GPU).
//!
//! On CPU the pipeline's defaults hold (8,192 padded tokens, 32 texts: small batches stay in
//! cache). A GPU wants far larger batches: a 30m-shaped layer on 8,192 tokens is a few
//! microseconds of arithmetic on an H100-class chip, so kernel launches and the host's
//! tokenizing dominate until batches hold tens of thousands of tokens.

use ruri_core::BatchOptions;

use crate::Device;

/// Padded tokens per batch advised on CUDA devices.
///
/// Measured on an NVIDIA H200 (2026-12-04, `tools/cuda/run-gpu-check.sh`, one run of 5 s a
/// point, 4,096 texts of 16–512 tokens): on the 30m shape 32,768 was the fastest budget at
/// bf16 (4,635 texts/s against 4,424 at 16k, 4,525 at 64k, 4,173 at 128k) and at f16; at
/// f32, 32k and 64k tied (3,574 and 3,576). On the 310m shape 32k beat 128k at bf16 (783
/// against 662 texts/s) and at f32. Peak GPU memory at 32k: 827 MiB (30m, bf16), 2.8 GiB
/// (310m, bf16). BENCHMARKS.md has the tables.
pub const GPU_MAX_BATCH_TOKENS: usize = 32_768;

/// Batch limits for a GPU around a padded-token budget: the token budget binds, not the
/// text count (up to one text per 16 tokens), and the attention-cell cap lets texts of up to
/// 512 tokens fill the budget. Longer texts go fewer to a batch (candle's global attention
/// also runs in query chunks, so the cap bounds time more than memory).
pub fn gpu_batching(max_batch_tokens: usize) -> BatchOptions {
    let tokens = max_batch_tokens.max(1);
    BatchOptions::default()
        .max_batch_tokens(tokens)
        .max_batch_size(tokens.div_ceil(16))
        .max_batch_attention(tokens.saturating_mul(512))
}

impl Device {
    /// The batch limits this device runs best with, used by
    /// [`CandleBuilder`](crate::CandleBuilder) unless
    /// [`batching`](crate::CandleBuilder::batching) sets others: the pipeline's
    /// defaults on CPU, [`gpu_batching`]`(`[`GPU_MAX_BATCH_TOKENS`]`)` on CUDA.
    pub fn advised_batching(self) -> BatchOptions {
        match self {
            Device::Cpu => BatchOptions::default(),
            Device::Cuda(_) => gpu_batching(GPU_MAX_BATCH_TOKENS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruri_core::plan_batches;

    #[test]
    fn cpu_keeps_the_pipeline_defaults() {
        assert_eq!(Device::Cpu.advised_batching(), BatchOptions::default());
    }

    /// On a GPU the token budget binds for texts up to 512 tokens, however short they are
    /// (down to 16), and longer texts still fit under the attention cap a few at a time.
    #[test]
    fn gpu_budget_binds() {
        let options = Device::Cuda(0).advised_batching();
        let budget = options.get_max_batch_tokens();
        assert_eq!(budget, GPU_MAX_BATCH_TOKENS);
        for len in [16, 64, 256, 512] {
            let lengths = vec![len; 4 * budget / len];
            let batches = plan_batches(&lengths, &options);
            assert_eq!(batches[0].len(), budget / len, "length {len}");
        }
        let long = plan_batches(&[2048; 64], &options);
        assert_eq!(long[0].len(), budget * 512 / (2048 * 2048));
    }
}
