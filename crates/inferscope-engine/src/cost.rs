//! Estimated work of a step (`--enable-mfu-metrics`): model FLOPs and the
//! bytes moved, from a dense decoder's shapes. These are estimates (the
//! roofline's terms), not measurements: the rate of FLOPs over the device's
//! peak is the model FLOPs utilisation.

use serde::{Deserialize, Serialize};

use crate::executor::{ScheduledBatch, StepCost};

/// Shapes of a Llama-family decoder, the inputs of [`ModelCost::llama`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaShape {
    /// Decoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention).
    pub kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// MLP inner size (SwiGLU: three matrices).
    pub intermediate: usize,
    /// Vocabulary size (the LM head).
    pub vocab: usize,
    /// Bytes per weight and per KV element.
    pub dtype_bytes: usize,
}

/// Per-token costs of a model on a device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelCost {
    /// FLOPs per token through the linear layers: 2 × their parameters.
    pub linear_flops_per_token: f64,
    /// Attention FLOPs per (query token, context token) pair: QKᵀ and PV,
    /// 4 × layers × heads × head_dim.
    pub attn_flops_per_pair: f64,
    /// Weight bytes, read once per step.
    pub weight_bytes: f64,
    /// Key and value bytes of one token over all layers.
    pub kv_bytes_per_token: f64,
    /// The device's peak dense FLOP/s, the denominator of MFU.
    pub peak_flops: f64,
}

impl ModelCost {
    /// The costs of a Llama-family model with `shape` on a device of `peak_flops`.
    pub fn llama(shape: &LlamaShape, peak_flops: f64) -> Self {
        let h = shape.hidden as f64;
        let q = (shape.heads * shape.head_dim) as f64;
        let kv = (shape.kv_heads * shape.head_dim) as f64;
        let per_layer = h * q + 2.0 * h * kv + q * h + 3.0 * h * shape.intermediate as f64;
        let linear = per_layer * shape.layers as f64 + h * shape.vocab as f64;
        let bytes = shape.dtype_bytes as f64;
        Self {
            linear_flops_per_token: 2.0 * linear,
            attn_flops_per_pair: 4.0 * (shape.layers as f64) * q,
            // The embedding table is read one row per token: left out.
            weight_bytes: linear * bytes,
            kv_bytes_per_token: 2.0 * (shape.layers as f64) * kv * bytes,
            peak_flops,
        }
    }

    /// Llama-3-8B in bf16 on a device of `peak_flops`.
    pub fn llama3_8b(peak_flops: f64) -> Self {
        Self::llama(
            &LlamaShape {
                layers: 32,
                hidden: 4096,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                intermediate: 14336,
                vocab: 128_256,
                dtype_bytes: 2,
            },
            peak_flops,
        )
    }

    /// The estimated work of `batch`: every new token goes through the linear
    /// layers and attends causally to its context; the step reads the
    /// weights once and the KV of each sequence's context, and writes the KV
    /// of the new tokens.
    pub fn step_cost(&self, batch: &ScheduledBatch) -> StepCost {
        let mut pairs = 0.0;
        for s in &batch.seqs {
            let n = s.num_tokens as f64;
            // Token j of the chunk attends to start_pos + j + 1 positions.
            pairs += n * s.start_pos as f64 + n * (n + 1.0) / 2.0;
        }
        let tokens = batch.num_tokens() as f64;
        if batch.seqs.is_empty() {
            return StepCost::default();
        }
        StepCost {
            flops: tokens * self.linear_flops_per_token + pairs * self.attn_flops_per_pair,
            read_bytes: self.weight_bytes
                + batch.num_context_tokens() as f64 * self.kv_bytes_per_token,
            write_bytes: tokens * self.kv_bytes_per_token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::ScheduledSeq;

    fn seq(start_pos: usize, num_tokens: usize, offset: usize) -> ScheduledSeq {
        ScheduledSeq::for_test(0, start_pos, num_tokens, offset)
    }

    #[test]
    fn llama3_8b_matches_the_published_shapes() {
        let c = ModelCost::llama3_8b(989e12);
        // ~7.5 B parameters in matmuls (8.03 B less the 0.53 B embedding table).
        let params = c.linear_flops_per_token / 2.0;
        assert!((params - 7.50e9).abs() < 0.01e9, "{params}");
        // 2 · 32 layers · 8 heads · 128 dims · 2 B = 128 KiB per token.
        assert_eq!(c.kv_bytes_per_token, 131_072.0);
        assert_eq!(c.attn_flops_per_pair, 4.0 * 32.0 * 4096.0);
    }

    #[test]
    fn step_cost_counts_tokens_and_causal_pairs() {
        let c = ModelCost {
            linear_flops_per_token: 10.0,
            attn_flops_per_pair: 1.0,
            weight_bytes: 1000.0,
            kv_bytes_per_token: 2.0,
            peak_flops: 1.0,
        };
        // A 4-token prefill chunk after 2 cached tokens, and one decode at position 9.
        let batch = ScheduledBatch {
            seqs: vec![seq(2, 4, 0), seq(9, 1, 4)],
            token_ids: vec![0; 5],
            ..Default::default()
        };
        let cost = c.step_cost(&batch);
        // Pairs: 3+4+5+6 = 18 for the chunk, 10 for the decode.
        assert_eq!(cost.flops, 5.0 * 10.0 + 28.0);
        // Context: (2+4) + (9+1) = 16 tokens of KV read, 5 written.
        assert_eq!(cost.read_bytes, 1000.0 + 16.0 * 2.0);
        assert_eq!(cost.write_bytes, 10.0);
        assert_eq!(c.step_cost(&ScheduledBatch::default()), StepCost::default());
    }
}
