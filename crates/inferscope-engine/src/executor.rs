//! The seam between the scheduler and the device.
//!
//! A step's batch is flattened: every sequence's new tokens sit back to back
//! in [`ScheduledBatch::token_ids`] and its block table in
//! [`ScheduledBatch::block_tables`], so the scheduler can reuse the buffers
//! from step to step without allocating.

use std::sync::Arc;
use std::time::Duration;

use crate::request::{PositionLogprobs, SamplingParams};
use crate::structured::StepMasks;

/// Estimated work of one step (`--enable-mfu-metrics`), from an executor's
/// cost model ([`crate::cost::ModelCost`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepCost {
    /// Model FLOPs.
    pub flops: f64,
    /// Bytes read from device memory.
    pub read_bytes: f64,
    /// Bytes written to device memory.
    pub write_bytes: f64,
}

/// One sequence's part of a step.
#[derive(Debug, Clone)]
pub struct ScheduledSeq {
    /// Engine-internal id, stable for the request's whole life.
    pub seq_id: u64,
    /// Offset of this sequence's new tokens in [`ScheduledBatch::token_ids`].
    pub token_offset: usize,
    /// Number of new tokens this step.
    pub num_tokens: usize,
    /// Position (in the sequence) of the first new token; positions before
    /// it are already in the KV cache.
    pub start_pos: usize,
    /// Offset of the block table in [`ScheduledBatch::block_tables`].
    pub block_table_offset: usize,
    /// Number of blocks in the block table (covers `start_pos + num_tokens`).
    pub block_table_len: usize,
    /// The new tokens are prompt tokens (a prefill chunk or a recompute).
    pub is_prefill: bool,
    /// Sample a token after this chunk: the prompt is complete or it decodes.
    pub sample: bool,
    /// Tokens generated so far; with the seed it makes sampling repeatable
    /// across a preemption and recompute.
    pub num_generated: usize,
    /// The seed of this request's sampler.
    pub seed: u64,
    /// The request's parameters.
    pub params: Arc<SamplingParams>,
    /// What an executor that keeps per-sequence token counts needs beyond
    /// the new tokens (only filled when `params` use them), and where the
    /// latest generated tokens that `bad_words` read are.
    pub history: SeqHistory,
    /// Where this sequence's grammar mask is in [`ScheduledBatch::masks`]
    /// (structured outputs); `None`: it samples unconstrained.
    pub mask_slot: Option<u32>,
    /// The positions of this step whose rows give prompt log-probabilities
    /// (only for requests with `prompt_logprobs`).
    pub prompt_rows: Option<PromptRows>,
}

/// Positions `start..end` of a prefill chunk whose logits give the
/// log-probability of the next prompt token (`prompt_logprobs`). The target
/// of the row at position `p` is the batch's token at `p + 1`, or
/// `next_token` for the chunk's last position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptRows {
    /// First position.
    pub start: usize,
    /// One past the last position.
    pub end: usize,
    /// The prompt token after the chunk's last new token.
    pub next_token: u32,
}

impl ScheduledSeq {
    /// The prompt token whose log-probability the row at `pos` gives.
    pub fn prompt_target(&self, batch: &ScheduledBatch, pos: usize) -> Option<u32> {
        let rows = self.prompt_rows?;
        if pos < rows.start || pos >= rows.end {
            return None;
        }
        let next = pos + 1 - self.start_pos;
        if next < self.num_tokens {
            batch.tokens(self).get(next).copied()
        } else {
            Some(rows.next_token)
        }
    }
}

/// The token history a sequence's step carries for executors that keep
/// per-sequence token counts (penalties, [`SamplingParams::uses_token_counts`]),
/// and the latest generated tokens that `bad_words` read.
///
/// An executor that counts the tokens of every batch sees each position once,
/// except those a prefix-cache hit skips: the scheduler hands those over in
/// [`ScheduledBatch::history_token_ids`], once, on the step that skips them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqHistory {
    /// Prompt length: positions from here on are generated tokens.
    pub num_prompt_tokens: usize,
    /// Offset of the skipped tokens in [`ScheduledBatch::history_token_ids`].
    pub offset: usize,
    /// Number of skipped tokens: positions `start_pos - len .. start_pos`.
    pub len: usize,
    /// Offset of the latest generated tokens in
    /// [`ScheduledBatch::output_tail_ids`] (requests with `bad_words`).
    pub output_tail_offset: usize,
    /// Number of them: at most [`SamplingParams::bad_words`]'s context, on
    /// steps that sample.
    pub output_tail_len: usize,
}

impl ScheduledSeq {
    /// `num_tokens` new tokens at `start_pos`, at `token_offset` in their
    /// batch, with no block table, sampled with default parameters: the
    /// sequence the cost model's and executors' tests build steps from.
    #[cfg(any(test, feature = "test-support"))]
    pub fn for_test(seq_id: u64, start_pos: usize, num_tokens: usize, token_offset: usize) -> Self {
        Self {
            seq_id,
            token_offset,
            num_tokens,
            start_pos,
            block_table_offset: 0,
            block_table_len: 0,
            is_prefill: num_tokens > 1,
            sample: true,
            num_generated: 0,
            seed: 0,
            params: Arc::new(SamplingParams::default()),
            history: SeqHistory::default(),
            mask_slot: None,
            prompt_rows: None,
        }
    }

    /// EOS and stop token ids must not be sampled yet (`min_tokens`).
    pub fn mask_stop_tokens(&self) -> bool {
        self.num_generated < self.params.min_tokens
    }
}

/// One step's work for the executor.
#[derive(Debug, Clone, Default)]
pub struct ScheduledBatch {
    /// The sequences, in the order their tokens appear.
    pub seqs: Vec<ScheduledSeq>,
    /// All new tokens of the step, flattened.
    pub token_ids: Vec<u32>,
    /// All block tables of the step, flattened.
    pub block_tables: Vec<u32>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Sequences that ended since the previous batch the executor ran (the
    /// executor may drop per-sequence state; an empty batch, which is not
    /// run, passes them on to the next).
    pub finished_seq_ids: Vec<u64>,
    /// Tokens before a sequence's `start_pos` that no earlier batch carried
    /// (see [`SeqHistory`]), flattened.
    pub history_token_ids: Vec<u32>,
    /// The latest generated tokens of the sampling sequences with
    /// `bad_words` (see [`ScheduledBatch::output_tail`]), flattened.
    pub output_tail_ids: Vec<u32>,
    /// The grammar masks of the sequences with a
    /// [`ScheduledSeq::mask_slot`], computed while the step runs: an
    /// executor calls [`StepMasks::wait`] only when it samples.
    pub masks: Option<Arc<StepMasks>>,
}

impl ScheduledBatch {
    /// The new tokens of `seq`.
    pub fn tokens(&self, seq: &ScheduledSeq) -> &[u32] {
        &self.token_ids[seq.token_offset..seq.token_offset + seq.num_tokens]
    }

    /// The tokens of `seq` that precede its new ones and that no earlier
    /// batch carried (empty unless its parameters use token counts).
    pub fn history(&self, seq: &ScheduledSeq) -> &[u32] {
        &self.history_token_ids[seq.history.offset..seq.history.offset + seq.history.len]
    }

    /// The last generated tokens of `seq` that its `bad_words` read before
    /// the token this step samples (empty unless it has them).
    pub fn output_tail(&self, seq: &ScheduledSeq) -> &[u32] {
        let h = &seq.history;
        &self.output_tail_ids[h.output_tail_offset..h.output_tail_offset + h.output_tail_len]
    }

    /// Adds the latest generated tokens of a sequence that samples after
    /// `tokens` (its prompt, then its output), as many as its `bad_words`
    /// read, and records where in `history` (whose `num_prompt_tokens` is
    /// set): a copy of a few ids, so that no executor keeps state for them.
    pub fn push_output_tail(
        &mut self,
        history: &mut SeqHistory,
        tokens: &[u32],
        params: &SamplingParams,
    ) {
        let context = params.bad_words.context_len();
        let end = tokens.len();
        let from = history
            .num_prompt_tokens
            .max(end.saturating_sub(context))
            .min(end);
        history.output_tail_offset = self.output_tail_ids.len();
        history.output_tail_len = end - from;
        self.output_tail_ids.extend_from_slice(&tokens[from..]);
    }

    /// The block table of `seq`.
    pub fn block_table(&self, seq: &ScheduledSeq) -> &[u32] {
        &self.block_tables[seq.block_table_offset..seq.block_table_offset + seq.block_table_len]
    }

    /// Tokens in the step.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Tokens whose attention reads the KV cache: sum of `start_pos + num_tokens`.
    pub fn num_context_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.start_pos + s.num_tokens).sum()
    }

    /// Resets for reuse without freeing the buffers.
    pub fn clear(&mut self) {
        self.seqs.clear();
        self.token_ids.clear();
        self.block_tables.clear();
        self.finished_seq_ids.clear();
        self.history_token_ids.clear();
        self.output_tail_ids.clear();
        self.masks = None;
    }
}

/// What one step produced.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// One entry per sequence of the batch, in order: the sampled token where
    /// [`ScheduledSeq::sample`] was set, `None` otherwise.
    pub sampled: Vec<Option<u32>>,
    /// Time the device was busy with the step.
    pub device_time: Duration,
    /// Log-probabilities, only for sequences whose parameters ask for them,
    /// in batch order (a sequence's prompt rows, then its sampled token's);
    /// empty (no allocation) otherwise.
    pub logprobs: Vec<LogprobRow>,
}

/// One position's log-probabilities in a step's output.
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobRow {
    /// Index of the sequence in the batch.
    pub seq_index: usize,
    /// The position in the sequence whose logits these are; for a prompt
    /// row the chosen token is the prompt token at `position + 1`.
    pub position: usize,
    /// A prompt row (`prompt_logprobs`) or the sampled token's.
    pub prompt: bool,
    /// The values.
    pub logprobs: PositionLogprobs,
}

/// A device failure while executing a step.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The step failed; the engine fails the step's requests and goes on.
    #[error("step failed: {0}")]
    Step(String),
    /// The executor cannot run any more steps; the engine core stops.
    #[error("executor is dead: {0}")]
    Fatal(String),
    /// The executor could not be set up.
    #[error("executor initialisation failed: {0}")]
    Init(String),
}

/// A device that runs model steps over a paged KV cache.
pub trait Executor: Send + 'static {
    /// A short name for logs (`sim:h100-llama3-8b`, `cpu:demo`).
    fn name(&self) -> String;

    /// Allocates the KV cache for blocks of `block_size` tokens and returns
    /// how many blocks fit. Called once, before the first step.
    fn init_kv_cache(&mut self, block_size: usize) -> Result<usize, ExecutorError>;

    /// Token ids that end generation (EOS), unless `ignore_eos`.
    fn eos_token_ids(&self) -> Vec<u32>;

    /// Runs one step. `out.sampled` must end with one entry per sequence.
    fn execute(
        &mut self,
        batch: &ScheduledBatch,
        out: &mut StepOutput,
    ) -> Result<(), ExecutorError>;

    /// The estimated FLOPs and bytes of `batch` from the executor's own cost
    /// model (`--enable-mfu-metrics`); `None` when it has none.
    fn step_cost(&self, _batch: &ScheduledBatch) -> Option<StepCost> {
        None
    }

    /// Moves the tokens routed to each expert since the last call (summed
    /// over a mixture of experts' layers) into `out`, one entry per expert,
    /// and restarts the count (`--expert-metrics`); leaves `out` empty for a
    /// model without experts.
    fn take_expert_tokens(&mut self, _out: &mut Vec<u64>) {}
}
