//! What a request is, what it asks for, and what comes back.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferscope_schema::FinishReason;

use crate::bad_words::BadWords;

/// Per-request generation parameters the engine and the executor honour.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Stop after this many generated tokens (`finish_reason = length`).
    pub max_tokens: usize,
    /// EOS and stop token ids are masked until this many tokens exist.
    pub min_tokens: usize,
    /// Do not stop at EOS (load tests: exactly `max_tokens` tokens).
    pub ignore_eos: bool,
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass; 1 disables it.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Seed of the request's sampler; `None` draws one from the request id.
    pub seed: Option<u64>,
    /// Extra token ids that stop generation like EOS does, deduplicated:
    /// built once per API request (the server builds it in validation, off
    /// the engine thread), shared by its choices through the `Arc` of these
    /// parameters.
    pub stop_token_ids: StopTokenIds,
    /// The request's `n` (the server fans out; recorded for metrics only).
    pub n: usize,
    /// Subtracted once from the logit of every token the output already
    /// holds (OpenAI's and vLLM's `presence_penalty`); 0 disables it.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the output holds it
    /// (`frequency_penalty`); 0 disables it.
    pub frequency_penalty: f32,
    /// vLLM's `repetition_penalty` over prompt and output tokens: a seen
    /// token's positive logit is divided by it, a negative one multiplied;
    /// 1 disables it.
    pub repetition_penalty: f32,
    /// Drop tokens whose probability (after temperature) is below this
    /// fraction of the most likely token's; 0 disables it.
    pub min_p: f32,
    /// Added to the logits of these token ids before anything else changes
    /// them (`logit_bias`): ids checked against the vocabulary, each once.
    pub logit_bias: Vec<(u32, f32)>,
    /// Only these token ids may be sampled (vLLM's `allowed_token_ids`),
    /// sorted and each once; empty: any.
    pub allowed_token_ids: Vec<u32>,
    /// Token sequences the output must not contain (vLLM's `bad_words`,
    /// tokenized by the server); empty: none.
    pub bad_words: BadWords,
    /// Log-probabilities of each sampled token plus this many of the most
    /// likely ones (`logprobs`, `top_logprobs`); `None`: none computed.
    pub logprobs: Option<usize>,
    /// Log-probabilities of each prompt token (but the first) plus this many
    /// of the most likely at its position (vLLM's `prompt_logprobs`, and
    /// `echo` with `logprobs`); `None`: none computed.
    pub prompt_logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            min_tokens: 0,
            ignore_eos: false,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            stop_token_ids: StopTokenIds::default(),
            n: 1,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            min_p: 0.0,
            logit_bias: Vec::new(),
            allowed_token_ids: Vec::new(),
            bad_words: BadWords::default(),
            logprobs: None,
            prompt_logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Whether sampling reads the sequence's token counts (a presence,
    /// frequency or repetition penalty): only then does the scheduler hand
    /// the executor the tokens it would otherwise never see, and the
    /// executor keep counts.
    pub fn uses_token_counts(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// The seed the sampler uses. Greedy (`temperature` 0): a hash of the
    /// prompt, so a sampler that draws from its seed (the sim) gives the same
    /// tokens for the same prompt, as a model's argmax does, whatever the seed
    /// or choice. Otherwise the given seed plus `offset` (the choice's index),
    /// else a hash of the request id.
    pub fn effective_seed(&self, request_id: &str, prompt: &[u32], offset: u64) -> u64 {
        if self.temperature == 0.0 {
            return fnv1a(prompt.iter().flat_map(|t| t.to_le_bytes()));
        }
        self.seed
            .map(|seed| seed.wrapping_add(offset))
            .unwrap_or_else(|| fnv1a(request_id.bytes()))
    }
}

/// The log-probabilities at one position: the chosen token's (sampled, or
/// the prompt's next token) and the most likely tokens'.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PositionLogprobs {
    /// The chosen token.
    pub token_id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// Its rank: 1 for the most likely token, plus one per token more likely.
    pub rank: u32,
    /// The most likely tokens, most likely first (ties: lower id first);
    /// may include the chosen one.
    pub top: Vec<(u32, f32)>,
}

/// A request's stop token ids, deduplicated, with O(1) lookup.
///
/// The engine builds one per request when it is queued, so the per-token stop
/// check on the engine thread costs the same whatever list the client sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopTokenIds {
    /// Empty for the common case of no stop ids: no allocation, no hashing.
    ids: HashSet<u32>,
}

impl StopTokenIds {
    /// Whether `token` stops generation.
    #[inline]
    pub fn contains(&self, token: u32) -> bool {
        !self.ids.is_empty() && self.ids.contains(&token)
    }

    /// Distinct ids.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The ids, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied()
    }
}

impl From<&[u32]> for StopTokenIds {
    fn from(ids: &[u32]) -> Self {
        ids.iter().copied().collect()
    }
}

impl From<Vec<u32>> for StopTokenIds {
    fn from(ids: Vec<u32>) -> Self {
        ids.into_iter().collect()
    }
}

impl FromIterator<u32> for StopTokenIds {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self {
            ids: iter.into_iter().collect(),
        }
    }
}

/// FNV-1a, a stable hash for deriving seeds from ids.
pub(crate) fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A request handed to the engine: already tokenized and validated.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Unique id (the server uses `x-request-id` when given); shared, not
    /// copied, by the handle, the scheduler and every observation.
    pub request_id: Arc<str>,
    /// The prompt, tokenized.
    pub prompt_token_ids: Vec<u32>,
    /// Generation parameters, shared by the choices of one API request.
    pub params: Arc<SamplingParams>,
    /// Added to `params.seed`: the choices of a seeded request differ only
    /// in this, so they can share one `params` (and its stop-id set).
    pub seed_offset: u64,
    /// When the request arrived at the server (monotonic).
    pub arrival: Instant,
    /// W3C trace id when the request is traced.
    pub trace_id: Option<[u8; 16]>,
    /// Who sent it (an authenticated tenant); `None`: anonymous. Fair
    /// admission shares the engine across tenants.
    pub tenant: Option<Arc<str>>,
    /// The tenant's metrics label slot (0: `anonymous`), carried into the
    /// stats so a token is attributed by index, not by name.
    pub tenant_label: inferscope_schema::TenantLabel,
    /// The constraint the output must match (structured outputs), compiled
    /// by the server; `None`: free text.
    pub grammar: Option<crate::structured::CompiledGrammar>,
}

/// Output tokens a sequence's token vector has room for from the start
/// (bounded: a huge `max_tokens` is rarely reached).
pub(crate) const OUTPUT_RESERVE: usize = 1024;

impl EngineRequest {
    /// `prompt` in a vector with room for `max_tokens` more (up to a
    /// bound): the engine appends the output to it, so made here, by the
    /// sender, it is the request's one token allocation, where one made
    /// short would be copied into a longer one on the engine's thread.
    pub fn token_buffer(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
        let mut tokens = Vec::with_capacity(prompt.len() + max_tokens.min(OUTPUT_RESERVE));
        tokens.extend_from_slice(prompt);
        tokens
    }
}

/// Monotonic timestamps of one request's life, from which latencies derive.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestTimeline {
    /// Arrival at the server.
    pub arrival: Instant,
    /// First time the scheduler put it in a batch.
    pub first_scheduled: Option<Instant>,
    /// The engine produced the first token.
    pub first_token: Option<Instant>,
    /// The engine produced the latest token.
    pub last_token: Option<Instant>,
    /// The request finished.
    pub finished: Option<Instant>,
    /// Every prefill step, in order: one per chunk when chunked prefill splits
    /// the prompt, and again after each preemption (recompute). One push per
    /// chunk, never per token; empty (no allocation) until the first one.
    pub prefill_chunks: Vec<PrefillChunk>,
    /// When each preemption happened, in order (rare: no allocation without one).
    pub preemptions: Vec<Instant>,
}

/// One engine step that computed part of a request's prompt (or, after a
/// preemption, its recomputed tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillChunk {
    /// When the step that ran the chunk was scheduled.
    pub start: Instant,
    /// When that step's output was applied.
    pub end: Instant,
    /// Tokens the chunk computed.
    pub num_tokens: usize,
}

impl RequestTimeline {
    /// A timeline that starts at `arrival`.
    pub fn new(arrival: Instant) -> Self {
        Self {
            arrival,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            finished: None,
            prefill_chunks: Vec::new(),
            preemptions: Vec::new(),
        }
    }

    /// Arrival to first scheduled (to finished when never scheduled): the
    /// `request_queue_time_seconds` sample.
    pub fn queue_time(&self) -> Duration {
        since(self.first_scheduled.or(self.finished), Some(self.arrival))
    }

    /// First scheduled to first token (zero without both).
    pub fn prefill_time(&self) -> Duration {
        since(self.first_token, self.first_scheduled)
    }

    /// First token to last token (zero without both).
    pub fn decode_time(&self) -> Duration {
        since(self.last_token, self.first_token)
    }

    /// First scheduled to finished (zero without both).
    pub fn inference_time(&self) -> Duration {
        since(self.finished, self.first_scheduled)
    }
}

fn since(later: Option<Instant>, earlier: Option<Instant>) -> Duration {
    match (later, earlier) {
        (Some(l), Some(e)) => l.saturating_duration_since(e),
        _ => Duration::ZERO,
    }
}

/// One message on a request's output stream: a new token, the end, or both.
///
/// The last token and the finish travel together so that a front end can
/// put the finish reason on the same chunk as the last text.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    /// The newly generated token; `None` on a finish without one (abort).
    pub token_id: Option<u32>,
    /// When the engine produced this output.
    pub at: Instant,
    /// Set on the final output; nothing follows it.
    pub finished: Option<Box<FinishedOutput>>,
    /// The log-probabilities of `token_id`, when the request asked for them.
    pub logprobs: Option<Box<PositionLogprobs>>,
    /// The prompt's log-probabilities, positions 1.. (position 0 has none),
    /// on the first token's output when the request asked for them (boxed:
    /// the per-token message stays one pointer wide for the rest).
    #[allow(clippy::box_collection)]
    pub prompt_logprobs: Option<Box<Vec<PositionLogprobs>>>,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedOutput {
    /// Why it finished.
    pub reason: FinishReason,
    /// The token id that stopped it, when EOS or a stop token did.
    pub stop_token_id: Option<u32>,
    /// Prompt length.
    pub num_prompt_tokens: usize,
    /// Tokens generated.
    pub num_generation_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub num_cached_tokens: usize,
    /// Times the request was preempted.
    pub num_preemptions: u64,
    /// The full timeline.
    pub timeline: RequestTimeline,
    /// An error message when `reason` is `Error`.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_token_ids_are_deduplicated() {
        let p = SamplingParams {
            stop_token_ids: vec![7, 3, 7, 7, 3, 9].into(),
            ..Default::default()
        };
        let set = &p.stop_token_ids;
        assert_eq!(set.len(), 3);
        assert!(set.contains(7) && set.contains(3) && set.contains(9));
        assert!(!set.contains(8));
        assert!(SamplingParams::default().stop_token_ids.is_empty());
        assert!(!StopTokenIds::default().contains(0));
    }
}
