/// Token ids of several texts padded to one length, as flat row-major buffers.
///
/// `input_ids` and `attention_mask` are `batch_size × seq_len`, `i64` as ONNX models and
/// torch take them; padding is on the right with the model's pad id and mask 0, as
/// transformers pads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaddedBatch {
    input_ids: Vec<i64>,
    attention_mask: Vec<i64>,
    batch_size: usize,
    seq_len: usize,
}

impl PaddedBatch {
    /// Pads `sequences` to the longest of them.
    pub fn new<'a, I>(sequences: I, pad_id: u32) -> Self
    where
        I: IntoIterator<Item = &'a [u32]>,
        I::IntoIter: Clone,
    {
        let mut batch = Self::default();
        batch.refill(sequences, pad_id);
        batch
    }

    /// Replaces the contents with `sequences`, reusing the buffers' memory.
    pub fn refill<'a, I>(&mut self, sequences: I, pad_id: u32)
    where
        I: IntoIterator<Item = &'a [u32]>,
        I::IntoIter: Clone,
    {
        let iter = sequences.into_iter();
        let (batch_size, seq_len) = iter
            .clone()
            .fold((0, 0), |(n, len), s| (n + 1, len.max(s.len())));
        self.input_ids.clear();
        self.attention_mask.clear();
        self.input_ids.reserve(batch_size * seq_len);
        self.attention_mask.reserve(batch_size * seq_len);
        for seq in iter {
            self.input_ids.extend(seq.iter().map(|&id| i64::from(id)));
            self.input_ids
                .extend(std::iter::repeat_n(i64::from(pad_id), seq_len - seq.len()));
            self.attention_mask
                .extend(std::iter::repeat_n(1, seq.len()));
            self.attention_mask
                .extend(std::iter::repeat_n(0, seq_len - seq.len()));
        }
        self.batch_size = batch_size;
        self.seq_len = seq_len;
    }

    /// Number of texts.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Length every row is padded to.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// `batch_size × seq_len` token ids, row-major.
    pub fn input_ids(&self) -> &[i64] {
        &self.input_ids
    }

    /// `batch_size × seq_len` mask: 1 for a real token, 0 for padding.
    pub fn attention_mask(&self) -> &[i64] {
        &self.attention_mask
    }

    /// Real (unpadded) tokens in the batch.
    pub fn real_tokens(&self) -> usize {
        self.attention_mask.iter().filter(|&&m| m != 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_right_with_pad_id_and_zero_mask() {
        let a: &[u32] = &[1, 10, 11, 2];
        let b: &[u32] = &[1, 2];
        let batch = PaddedBatch::new([a, b], 3);
        assert_eq!(batch.batch_size(), 2);
        assert_eq!(batch.seq_len(), 4);
        assert_eq!(batch.input_ids(), &[1, 10, 11, 2, 1, 2, 3, 3]);
        assert_eq!(batch.attention_mask(), &[1, 1, 1, 1, 1, 1, 0, 0]);
        assert_eq!(batch.real_tokens(), 6);
    }

    #[test]
    fn refill_reuses_and_resets() {
        let long: &[u32] = &[1, 5, 5, 5, 5, 2];
        let short: &[u32] = &[1, 2];
        let mut batch = PaddedBatch::new([long, long], 3);
        batch.refill([short], 0);
        assert_eq!(batch.batch_size(), 1);
        assert_eq!(batch.seq_len(), 2);
        assert_eq!(batch.input_ids(), &[1, 2]);
        assert_eq!(batch.attention_mask(), &[1, 1]);
    }

    #[test]
    fn empty_batch_is_empty() {
        let batch = PaddedBatch::new(std::iter::empty::<&[u32]>(), 3);
        assert_eq!((batch.batch_size(), batch.seq_len()), (0, 0));
        assert!(batch.input_ids().is_empty());
    }
}
