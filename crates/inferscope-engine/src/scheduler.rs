//! The continuous-batching scheduler of one engine core.
//!
//! Each step it builds a batch under a token budget: running requests first
//! (decodes, and the next chunk of a prompt being prefilled), then waiting
//! requests in the order of the admission policy (fair across tenants, FCFS
//! within one; see `waiting_queue`), their prompts split into chunks when
//! the budget runs short. When KV blocks run out it preempts by recompute: the most
//! recently admitted running request gives its blocks up and goes back to
//! the front of the queue. After the executor ran, [`Scheduler::update`]
//! appends the sampled tokens, applies the stop conditions, frees the blocks
//! of finished requests and emits their outputs.

use std::sync::Arc;
use std::time::Instant;

use inferscope_schema::{
    FinishReason, FinishedRequestStats, IterationStats, RequestRef, SchedulerStats,
};

use crate::block_pool::{BlockHash, BlockPool, hash_block};
use crate::config::EngineConfig;
use crate::executor::{PromptRows, ScheduledBatch, ScheduledSeq, SeqHistory, StepOutput};
use crate::request::{
    EngineRequest, FinishedOutput, OUTPUT_RESERVE, PositionLogprobs, PrefillChunk, RequestOutput,
    RequestTimeline, SamplingParams,
};
use crate::step_trace::{RequestTrace, StepSeq};
use crate::structured::{
    Advance, CompiledGrammar, GrammarWorker, SeqGrammar, default_grammar_threads,
};
use crate::waiting_queue::WaitingQueue;

/// Where a request's outputs go.
pub type OutputSink = crate::output_channel::OutputSender;

/// Requests one step may preempt so that a tenant with nothing running can
/// start (fair admission): a bound on the work one arrival can undo.
pub const MAX_YIELDS_PER_STEP: usize = 4;

/// A request inside the scheduler.
#[derive(Debug)]
struct Sequence {
    seq_id: u64,
    /// The request id and trace id, shared with the finished stats
    /// (exemplars) without a copy.
    request: RequestRef,
    params: Arc<SamplingParams>,
    seed: u64,
    /// Prompt followed by the generated tokens.
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
    /// Tokens some batch has carried to the executor (new or history), so
    /// a prefix-cache hit past them hands the executor the rest once.
    num_delivered: usize,
    /// Tokens whose keys and values are in the KV cache.
    num_computed: usize,
    blocks: Vec<u32>,
    /// Hash of each full block of `tokens` (prefix caching only).
    block_hashes: Vec<BlockHash>,
    /// Leading blocks already entered in (or taken from) the prefix cache.
    num_cached_blocks: usize,
    /// Prompt tokens served from the prefix cache at first scheduling.
    num_cached_tokens: usize,
    num_preemptions: u64,
    timeline: RequestTimeline,
    sink: OutputSink,
    /// This step's output, held in deferred mode until it is shipped (one
    /// per step at most): sent through `sink` in place, no clone of it.
    pending: Option<RequestOutput>,
    /// Its tenant's slot in the waiting queue.
    tenant_slot: usize,
    /// Its matcher, when the output is constrained (structured outputs).
    grammar: Option<SeqGrammar>,
    /// `prompt_logprobs`: positions whose row has been received (a
    /// recompute after preemption does not send them again) and the values,
    /// handed over with the first token. Empty without `prompt_logprobs`.
    prompt_rows_done: usize,
    prompt_logprobs: Vec<PositionLogprobs>,
    /// The log-probabilities of the token just sampled, until it is sent.
    token_logprobs: Option<Box<PositionLogprobs>>,
}

impl Sequence {
    /// The sampled token's log-probabilities, and the prompt's with the
    /// first token: what the output carrying that token takes along.
    #[allow(clippy::type_complexity, clippy::box_collection)]
    fn take_logprobs(
        &mut self,
    ) -> (
        Option<Box<PositionLogprobs>>,
        Option<Box<Vec<PositionLogprobs>>>,
    ) {
        let prompt = (self.params.prompt_logprobs.is_some() && self.num_generated() == 1)
            .then(|| Box::new(std::mem::take(&mut self.prompt_logprobs)));
        (self.token_logprobs.take(), prompt)
    }

    fn num_generated(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    /// Extends `block_hashes` over every full block of `tokens`.
    fn hash_full_blocks(&mut self, block_size: usize) {
        while (self.block_hashes.len() + 1) * block_size <= self.tokens.len() {
            let k = self.block_hashes.len();
            let parent = k.checked_sub(1).map(|p| self.block_hashes[p]);
            let h = hash_block(parent, &self.tokens[k * block_size..(k + 1) * block_size]);
            self.block_hashes.push(h);
        }
    }
}

/// Snapshot of one sequence for invariant checks in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceView {
    /// The engine-internal id the batch carries.
    pub seq_id: u64,
    /// The request id.
    pub request_id: String,
    /// Blocks held.
    pub blocks: Vec<u32>,
    /// Tokens in the KV cache.
    pub num_computed: usize,
    /// Prompt plus generated tokens.
    pub num_tokens: usize,
    /// Whether it is in the running batch.
    pub running: bool,
}

/// The scheduler and KV block pool of one engine core.
#[derive(Debug)]
pub struct Scheduler {
    config: EngineConfig,
    pool: BlockPool,
    eos_token_ids: Vec<u32>,
    waiting: WaitingQueue<Sequence>,
    /// In admission order: the last one is the first to be preempted.
    running: Vec<Sequence>,
    next_seq_id: u64,
    batch: ScheduledBatch,
    /// For each sequence of `batch`, its index in `running`.
    batch_running_idx: Vec<usize>,
    /// When `batch` was built: the start of its prefill chunks' spans.
    batch_scheduled_at: Instant,
    /// Indices in `running` of sequences that finish this update.
    finishing: Vec<(usize, FinishReason, Option<u32>)>,
    preemptions_since_snapshot: u64,
    /// The last [`Scheduler::schedule`] preempted, so it admitted nobody:
    /// the waiting requests are `deferred` rather than waiting for capacity.
    admission_deferred: bool,
    stats: IterationStats,
    /// Sequences that ended since the last batch was built.
    ended_seq_ids: Vec<u64>,
    /// When set, outputs are collected here instead of sent (see
    /// [`Scheduler::defer_outputs`]).
    outbox: Option<Vec<(OutputSink, RequestOutput)>>,
    /// Running sequences holding an output (`Sequence::pending`).
    pending_outputs: usize,
    /// Computes grammar masks while a step runs; started at the first
    /// constrained request.
    grammar_worker: Option<GrammarWorker>,
    /// Sequences of this update whose token broke their grammar, and why.
    grammar_errors: Vec<(usize, String)>,
    /// Sequences of this update whose previous token completed their
    /// grammar (found by the grammar worker): they end without this step's.
    grammar_done: Vec<usize>,
    /// Running sequences per tenant slot, counted when fair admission must
    /// find a slot for a tenant with none (kept to count without allocating).
    running_per_tenant: Vec<usize>,
    /// While a profile runs: the timelines of the requests that ended.
    traced: Option<Vec<RequestTrace>>,
}

impl Scheduler {
    /// A scheduler over a pool of `num_blocks` KV blocks.
    pub fn new(config: EngineConfig, num_blocks: usize, eos_token_ids: Vec<u32>) -> Self {
        let mut pool = BlockPool::new(num_blocks, config.enable_prefix_caching);
        if let Some(fraction) = config.kv_cache_metrics_sample {
            // A fixed seed: which blocks are sampled does not matter, and
            // runs stay reproducible.
            pool = pool.with_residency_sampling(fraction, 0x5eed_b10c);
        }
        let waiting = WaitingQueue::new(config.scheduling_policy, config.tenant_weights.clone());
        let batch = ScheduledBatch {
            block_size: config.block_size,
            ..Default::default()
        };
        Self {
            config,
            pool,
            eos_token_ids,
            waiting,
            running: Vec::new(),
            next_seq_id: 0,
            batch,
            batch_running_idx: Vec::new(),
            batch_scheduled_at: Instant::now(),
            finishing: Vec::new(),
            preemptions_since_snapshot: 0,
            admission_deferred: false,
            stats: IterationStats::default(),
            ended_seq_ids: Vec::new(),
            outbox: None,
            pending_outputs: 0,
            grammar_worker: None,
            grammar_errors: Vec::new(),
            grammar_done: Vec::new(),
            running_per_tenant: Vec::new(),
            traced: None,
        }
    }

    /// Keeps the timeline of each request that ends from now on (a profile
    /// started), or stops keeping them.
    pub fn trace_requests(&mut self, on: bool) {
        self.traced = on.then(Vec::new);
    }

    /// The timelines kept since the last call (see [`Self::trace_requests`]).
    pub fn take_traced(&mut self) -> Vec<RequestTrace> {
        self.traced.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The timelines of the requests running or waiting now.
    pub fn in_flight_traces(&self) -> impl Iterator<Item = RequestTrace> + '_ {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| RequestTrace {
                request_id: Arc::clone(&s.request.request_id),
                timeline: s.timeline.clone(),
            })
    }

    /// Appends the requests of the batch built by the last
    /// [`Self::schedule`] to `into`, in batch order, with their prompt and
    /// decode tokens. Valid until [`Self::update`] (which may remove them).
    pub fn record_batch(&self, into: &mut Vec<StepSeq>) {
        into.extend(
            self.batch
                .seqs
                .iter()
                .zip(&self.batch_running_idx)
                .map(|(sseq, &idx)| {
                    let n = sseq.num_tokens as u32;
                    let (prefill_tokens, decode_tokens) =
                        if sseq.is_prefill { (n, 0) } else { (0, n) };
                    StepSeq {
                        request_id: Arc::clone(&self.running[idx].request.request_id),
                        prefill_tokens,
                        decode_tokens,
                    }
                }),
        );
    }

    /// Collects outputs for [`Scheduler::take_outputs`] instead of sending
    /// them, so that the engine thread hands a whole step's outputs to
    /// another thread in one message.
    pub fn defer_outputs(&mut self) {
        self.outbox.get_or_insert_with(Vec::new);
    }

    /// How many outputs are collected (deferred mode).
    pub fn num_outputs(&self) -> usize {
        self.pending_outputs + self.outbox.as_ref().map_or(0, Vec::len)
    }

    /// The outputs collected since the last call, with their sinks (a
    /// running request's sink cloned), for delivery on another thread. A
    /// request's outputs keep their order.
    pub fn take_outputs(&mut self) -> Vec<(OutputSink, RequestOutput)> {
        let mut batch = Vec::with_capacity(self.num_outputs());
        self.drain_pending(|sink, out| batch.push((sink.clone(), out)));
        if let Some(outbox) = &mut self.outbox {
            batch.append(outbox);
        }
        batch
    }

    /// Sends the outputs collected since the last call, here: a running
    /// request's through its own sink, no clone of it.
    pub fn send_outputs(&mut self) {
        // A closed sink means the client left; the abort follows.
        self.drain_pending(|sink, out| {
            let _ = sink.send(out);
        });
        if let Some(outbox) = &mut self.outbox {
            for (sink, out) in outbox.drain(..) {
                let _ = sink.send(out);
            }
        }
    }

    /// Hands each running request's held output to `f`, with its sink.
    fn drain_pending(&mut self, mut f: impl FnMut(&OutputSink, RequestOutput)) {
        if self.pending_outputs == 0 {
            return;
        }
        self.pending_outputs = 0;
        for seq in &mut self.running {
            if let Some(out) = seq.pending.take() {
                f(&seq.sink, out);
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The KV block pool.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Records KV-cache events from now on.
    pub fn enable_kv_events(&mut self) {
        self.pool.enable_events();
    }

    /// The KV-cache events since the last call.
    pub fn take_kv_events(&mut self) -> Vec<crate::kv_events::KvEvent> {
        self.pool.take_events()
    }

    /// Drops the prefix cache when no request holds blocks; false otherwise.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset_prefix_cache()
    }

    /// Requests running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting (preempted ones included).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// The batch built by the last [`Scheduler::schedule`].
    pub fn batch(&self) -> &ScheduledBatch {
        &self.batch
    }

    /// Stats accumulated since the last [`Scheduler::clear_stats`].
    pub fn stats(&self) -> &IterationStats {
        &self.stats
    }

    /// Mutable access for the core to fill in phase timings.
    pub fn stats_mut(&mut self) -> &mut IterationStats {
        &mut self.stats
    }

    /// Running and waiting sequences (tests and invariant checks).
    pub fn sequences(&self) -> impl Iterator<Item = SequenceView> + '_ {
        let running = self.running.iter().map(|s| (s, true));
        let waiting = self.waiting.iter().map(|s| (s, false));
        running.chain(waiting).map(|(s, running)| SequenceView {
            seq_id: s.seq_id,
            request_id: s.request.request_id.to_string(),
            blocks: s.blocks.clone(),
            num_computed: s.num_computed,
            num_tokens: s.tokens.len(),
            running,
        })
    }

    /// Queues a request. Its outputs go to `sink`.
    pub fn add_request(&mut self, req: EngineRequest, sink: OutputSink) {
        let seq_id = self.next_seq_id;
        self.next_seq_id += 1;
        let seed =
            req.params
                .effective_seed(&req.request_id, &req.prompt_token_ids, req.seed_offset);
        let num_prompt_tokens = req.prompt_token_ids.len();
        // One allocation per request; every finished-stats clone shares it.
        let request =
            RequestRef::shared(req.request_id, req.trace_id).with_tenant(req.tenant_label);
        let tenant_slot = self.waiting.slot(req.tenant.as_ref());
        // Room for the output up front, unless the sender made it
        // (`EngineRequest::token_buffer`): no reallocations while it is generated.
        let mut tokens = req.prompt_token_ids;
        tokens.reserve(req.params.max_tokens.min(OUTPUT_RESERVE));
        let mut seq = Sequence {
            seq_id,
            request,
            params: req.params,
            seed,
            tokens,
            num_prompt_tokens,
            num_delivered: 0,
            num_computed: 0,
            blocks: Vec::new(),
            block_hashes: Vec::new(),
            num_cached_blocks: 0,
            num_cached_tokens: 0,
            num_preemptions: 0,
            timeline: RequestTimeline::new(req.arrival),
            sink,
            pending: None,
            tenant_slot,
            grammar: req.grammar.as_ref().map(CompiledGrammar::start),
            prompt_rows_done: 0,
            prompt_logprobs: Vec::new(),
            token_logprobs: None,
        };
        // A request that could never fit, even alone, would be preempted
        // forever: refuse it now.
        let bs = self.config.block_size;
        let max_len = (num_prompt_tokens + seq.params.max_tokens).min(self.config.max_model_len);
        let blocks_needed = max_len.max(num_prompt_tokens).div_ceil(bs);
        if num_prompt_tokens == 0 || blocks_needed > self.pool.num_blocks() {
            let msg = if num_prompt_tokens == 0 {
                "the prompt is empty".to_owned()
            } else {
                format!(
                    "the request needs {blocks_needed} KV blocks of {bs} tokens but the cache holds {}",
                    self.pool.num_blocks()
                )
            };
            self.finish(seq, FinishReason::Error, None, Some(msg), Instant::now());
            return;
        }
        if self.pool.prefix_caching() {
            seq.hash_full_blocks(bs);
        }
        self.waiting.push_back(seq.tenant_slot, seq);
    }

    /// Ends a request wherever it is, with `reason` (abort, or stop for a
    /// stop string the server found). Returns false when it is not here.
    pub fn finish_request(&mut self, request_id: &str, reason: FinishReason) -> bool {
        let now = Instant::now();
        if let Some(i) = self
            .running
            .iter()
            .position(|s| *s.request.request_id == *request_id)
        {
            let seq = self.running.remove(i);
            self.finish(seq, reason, None, None, now);
            true
        } else if let Some(seq) = self
            .waiting
            .remove_where(|s| *s.request.request_id == *request_id)
        {
            self.finish(seq, reason, None, None, now);
            true
        } else {
            false
        }
    }

    /// Ends every request with `reason` (shutdown, or a dead executor).
    pub fn finish_all(&mut self, reason: FinishReason, error: Option<&str>) {
        let now = Instant::now();
        let seqs: Vec<Sequence> = self
            .running
            .drain(..)
            .chain(self.waiting.drain_all())
            .collect();
        for seq in seqs {
            self.finish(seq, reason, None, error.map(str::to_owned), now);
        }
    }

    /// Scheduler state after the last step; counters since the last snapshot.
    pub fn snapshot(&mut self) -> SchedulerStats {
        let counts = self.pool.take_counts();
        let mut stats = SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_waiting_deferred: if self.admission_deferred {
                self.waiting.len()
            } else {
                0
            },
            kv_cache_usage: self.pool.usage(),
            prefix_cache_queries: counts.queries,
            prefix_cache_hits: counts.hits,
            num_preemptions: std::mem::take(&mut self.preemptions_since_snapshot),
            kv_block_residency: Default::default(),
        };
        if let Some(r) = self.pool.residency_mut() {
            r.take_samples(&mut stats.kv_block_residency);
        }
        stats
    }

    /// Clears the accumulated iteration stats for the next step.
    pub fn clear_stats(&mut self) {
        self.stats.clear();
    }

    /// Builds the next batch; [`Scheduler::batch`] returns it.
    pub fn schedule(&mut self) {
        let now = Instant::now();
        self.batch_scheduled_at = now;
        // A batch without sequences never reaches the executor (the engine
        // core skips it): the ids of the sequences that ended stay for the
        // next one, so the executor can still drop their state.
        let unsent = self.batch.seqs.is_empty();
        let mut finished = std::mem::take(&mut self.batch.finished_seq_ids);
        if !unsent {
            finished.clear();
        }
        self.batch.clear();
        self.batch.finished_seq_ids = finished;
        self.batch_running_idx.clear();
        self.batch.finished_seq_ids.append(&mut self.ended_seq_ids);
        let bs = self.config.block_size;
        let mut budget = self.config.max_num_batched_tokens;
        let mut preempted = false;
        self.yield_to_a_starved_tenant();

        // Running requests first: decodes and continuing prefill chunks.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let num_new = (seq.tokens.len() - seq.num_computed).min(budget);
            if num_new == 0 {
                i += 1;
                continue;
            }
            let target = seq.num_computed + num_new;
            let mut scheduled_self = true;
            loop {
                let seq = &mut self.running[i];
                let needed = target.div_ceil(bs).saturating_sub(seq.blocks.len());
                if self.pool.allocate(needed, &mut seq.blocks) {
                    break;
                }
                // Out of blocks: the most recently admitted request yields.
                preempted = true;
                let victim_is_self = i + 1 == self.running.len();
                if let Some(victim) = self.running.pop() {
                    self.preempt(victim);
                }
                if victim_is_self {
                    scheduled_self = false;
                    break;
                }
            }
            if !scheduled_self {
                break;
            }
            self.push_scheduled(i, num_new);
            budget -= num_new;
            i += 1;
        }

        // Then waiting requests, in the policy's order, unless this step had
        // to preempt.
        while !preempted
            && budget > 0
            && self.running.len() < self.config.max_num_seqs
            && !self.waiting.is_empty()
        {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            let mut hit_tokens = 0;
            // A prompt served from the cache has no logits: requests that
            // want the prompt's log-probabilities compute it all (as vLLM).
            if seq.blocks.is_empty()
                && self.pool.prefix_caching()
                && seq.params.prompt_logprobs.is_none()
            {
                // Leave at least one token to compute so a token is sampled.
                let max_hit_blocks = (seq.tokens.len() - 1) / bs;
                let n = seq.block_hashes.len().min(max_hit_blocks);
                self.pool
                    .take_cached_prefix(&seq.block_hashes[..n], &mut seq.blocks);
                hit_tokens = seq.blocks.len() * bs;
                seq.num_computed = hit_tokens;
                seq.num_cached_blocks = seq.blocks.len();
            }
            // Fair admission charges the tenant the tokens to compute.
            let cost = seq.tokens.len() - seq.num_computed;
            let num_new = cost.min(budget);
            let needed = (seq.num_computed + num_new)
                .div_ceil(bs)
                .saturating_sub(seq.blocks.len());
            if !self.pool.allocate(needed, &mut seq.blocks) {
                // Does not fit now: give the prefix hits back and wait.
                self.pool.free(&seq.blocks);
                seq.blocks.clear();
                seq.num_computed = 0;
                seq.num_cached_blocks = 0;
                break;
            }
            self.pool.record_lookup(seq.tokens.len(), hit_tokens);
            if seq.timeline.first_scheduled.is_none() {
                seq.timeline.first_scheduled = Some(now);
                seq.num_cached_tokens = hit_tokens;
            }
            if let Some(seq) = self.waiting.pop_front(cost) {
                self.running.push(seq);
                self.push_scheduled(self.running.len() - 1, num_new);
                budget -= num_new;
            }
        }
        self.submit_masks();
        self.admission_deferred = preempted && !self.waiting.is_empty();
        self.stats.batch_size = self.batch.seqs.len();
        self.stats.num_scheduled_tokens = self.batch.token_ids.len() as u64;
    }

    fn push_scheduled(&mut self, running_idx: usize, num_new: usize) {
        let seq = &mut self.running[running_idx];
        let start = seq.num_computed;
        let end = start + num_new;
        let sample = end == seq.tokens.len();
        let mut history = SeqHistory {
            num_prompt_tokens: seq.num_prompt_tokens,
            offset: self.batch.history_token_ids.len(),
            ..SeqHistory::default()
        };
        if sample && !seq.params.bad_words.is_empty() {
            self.batch
                .push_output_tail(&mut history, &seq.tokens, &seq.params);
        }
        // Only a prefix-cache hit skips tokens, and only executors that
        // count tokens need them: the common case copies nothing.
        if seq.params.uses_token_counts() && start > seq.num_delivered {
            self.batch
                .history_token_ids
                .extend_from_slice(&seq.tokens[seq.num_delivered..start]);
            history.len = start - seq.num_delivered;
        }
        seq.num_delivered = seq.num_delivered.max(end);
        // Rows of positions whose next token is a prompt token, once each.
        let prompt_rows = seq.params.prompt_logprobs.and_then(|_| {
            let lo = start.max(seq.prompt_rows_done);
            let hi = end.min(seq.num_prompt_tokens.saturating_sub(1));
            (lo < hi).then(|| PromptRows {
                start: lo,
                end: hi,
                next_token: seq.tokens[hi],
            })
        });
        let token_offset = self.batch.token_ids.len();
        // A decode's one token is pushed: a slice copy is a `memcpy` call,
        // and this runs for every sequence of every step.
        match &seq.tokens[start..end] {
            &[token] => self.batch.token_ids.push(token),
            tokens => self.batch.token_ids.extend_from_slice(tokens),
        }
        let block_table_offset = self.batch.block_tables.len();
        let block_table_len = end.div_ceil(self.config.block_size);
        self.batch
            .block_tables
            .extend_from_slice(&seq.blocks[..block_table_len]);
        self.batch.seqs.push(ScheduledSeq {
            seq_id: seq.seq_id,
            token_offset,
            num_tokens: num_new,
            start_pos: start,
            block_table_offset,
            block_table_len,
            // A decode computes just the latest generated token.
            is_prefill: !(num_new == 1 && sample && seq.num_generated() > 0),
            sample,
            num_generated: seq.num_generated(),
            seed: seq.seed,
            params: Arc::clone(&seq.params),
            history,
            mask_slot: None,
            prompt_rows,
        });
        self.batch_running_idx.push(running_idx);
    }

    /// Hands the matchers of the constrained sequences that sample this
    /// step to the grammar worker, which computes their masks while the
    /// executor runs the forward pass. Nothing happens (no allocation) in a
    /// batch without constrained sequences.
    fn submit_masks(&mut self) {
        let mut grammars = Vec::new();
        for (k, sseq) in self.batch.seqs.iter_mut().enumerate() {
            if !sseq.sample {
                continue;
            }
            if let Some(g) = &self.running[self.batch_running_idx[k]].grammar {
                sseq.mask_slot = Some(grammars.len() as u32);
                grammars.push(g.clone());
            }
        }
        if grammars.is_empty() {
            return;
        }
        if self.grammar_worker.is_none() {
            let threads = self
                .config
                .grammar_threads
                .unwrap_or_else(default_grammar_threads);
            match GrammarWorker::with_threads("engine-grammar".into(), threads) {
                Ok(w) => self.grammar_worker = Some(w),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the grammar thread; masks are computed inline")
                }
            }
        }
        self.batch.masks = Some(match &self.grammar_worker {
            Some(w) => w.submit(grammars),
            None => GrammarWorker::compute_now(grammars),
        });
    }

    fn preempt(&mut self, mut seq: Sequence) {
        self.release(&mut seq);
        self.waiting.push_front(seq);
    }

    /// Frees a preempted sequence's blocks and counts the preemption; its
    /// tokens stay, to be computed again when it is admitted again.
    fn release(&mut self, seq: &mut Sequence) {
        self.pool.free(&seq.blocks);
        seq.blocks.clear();
        seq.num_computed = 0;
        seq.num_cached_blocks = 0;
        seq.num_preemptions += 1;
        seq.timeline.preemptions.push(Instant::now());
        self.preemptions_since_snapshot += 1;
    }

    /// Fair admission when the request admitted next cannot start (every
    /// slot, `max_num_seqs`, taken, or too few free KV blocks for its prompt
    /// beside what the running requests need): the newest requests of the
    /// tenant holding the most slots yield theirs while it holds at least two
    /// more than the next request's tenant, up to [`MAX_YIELDS_PER_STEP`],
    /// and wait at the head of their own tenant's queue (weights are not
    /// considered here, only in the admission order). Without this, a light tenant waits
    /// behind a flooding tenant until enough of the flood's requests finish
    /// (a second or more in `scripts/tenants-fairness.sh`). Their blocks stay
    /// in the prefix cache, so computing them again is mostly hits when
    /// prefix caching is on. Run before the running requests are scheduled,
    /// so no victim is in the batch.
    fn yield_to_a_starved_tenant(&mut self) {
        let Some(next) = self.waiting.next_fair_slot() else {
            return;
        };
        let bs = self.config.block_size;
        // Its whole prompt, before prefix hits: an upper bound.
        let Some(wanted) = self
            .waiting
            .front_mut()
            .map(|s| s.tokens.len().div_ceil(bs))
        else {
            return;
        };
        let counts = &mut self.running_per_tenant;
        counts.clear();
        let mut running_needs = 0;
        for seq in &self.running {
            if seq.tenant_slot >= counts.len() {
                counts.resize(seq.tenant_slot + 1, 0);
            }
            counts[seq.tenant_slot] += 1;
            running_needs += seq
                .tokens
                .len()
                .div_ceil(bs)
                .saturating_sub(seq.blocks.len());
        }
        let next_holds = counts.get(next).copied().unwrap_or(0);
        // The heaviest tenant; on a tie the lowest slot.
        let Some((heavy, &held)) = counts.iter().enumerate().rev().max_by_key(|&(_, n)| *n) else {
            return;
        };
        let mut held = held;
        for _ in 0..MAX_YIELDS_PER_STEP {
            let fits = self.running.len() < self.config.max_num_seqs
                && self.pool.num_free() >= running_needs + wanted;
            // Only toward balance: the heaviest keeps at least one more.
            if fits || held < next_holds + 2 {
                return;
            }
            let Some(idx) = self.running.iter().rposition(|s| s.tenant_slot == heavy) else {
                return;
            };
            let mut seq = self.running.remove(idx);
            running_needs -= seq
                .tokens
                .len()
                .div_ceil(bs)
                .saturating_sub(seq.blocks.len());
            self.release(&mut seq);
            self.waiting.push_front_of(heavy, seq);
            held -= 1;
        }
    }

    /// Applies a step's output: appends sampled tokens, checks stop
    /// conditions, caches full blocks, frees finished requests.
    pub fn update(&mut self, out: &StepOutput) {
        let now = Instant::now();
        let bs = self.config.block_size;
        let caching = self.pool.prefix_caching();
        self.finishing.clear();
        self.grammar_errors.clear();
        self.grammar_done.clear();
        let masks = self.batch.masks.as_ref().map(|m| m.wait());
        if let Some(ready) = &masks {
            self.stats.grammar_mask_time = Some(ready.compute_time());
        }
        // Rows are in batch order: one cursor walks them beside the batch.
        let mut rows = out.logprobs.iter().peekable();
        for (k, sseq) in self.batch.seqs.iter().enumerate() {
            let idx = self.batch_running_idx[k];
            let seq = &mut self.running[idx];
            seq.num_computed += sseq.num_tokens;
            while let Some(row) = rows.next_if(|r| r.seq_index <= k) {
                if row.seq_index < k {
                    continue;
                }
                if row.prompt {
                    if row.position >= seq.prompt_rows_done {
                        seq.prompt_rows_done = row.position + 1;
                        seq.prompt_logprobs.push(row.logprobs.clone());
                    }
                } else {
                    seq.token_logprobs = Some(Box::new(row.logprobs.clone()));
                }
            }
            if sseq.is_prefill {
                seq.timeline.prefill_chunks.push(PrefillChunk {
                    start: self.batch_scheduled_at,
                    end: now,
                    num_tokens: sseq.num_tokens,
                });
            }
            if sseq.sample {
                let Some(token) = out.sampled.get(k).copied().flatten() else {
                    self.finishing.push((idx, FinishReason::Error, None));
                    continue;
                };
                // The grammar worker consumed the previous token while this
                // step ran: where that completed or broke the grammar, the
                // sequence ends here, without this step's token.
                let ended = match (sseq.mask_slot, &masks) {
                    (Some(slot), Some(ready)) => ready.advance(slot as usize),
                    _ => Advance::Continue,
                };
                match ended {
                    Advance::Continue => {}
                    Advance::Finished => {
                        self.grammar_done.push(idx);
                        self.finishing.push((idx, FinishReason::Stop, None));
                        continue;
                    }
                    Advance::Error(e) => {
                        self.grammar_errors.push((idx, e));
                        self.finishing.push((idx, FinishReason::Error, None));
                        continue;
                    }
                }
                seq.tokens.push(token);
                self.waiting.charge(seq.tenant_slot, 1);
                if caching {
                    seq.hash_full_blocks(bs);
                }
                if seq.timeline.first_token.is_none() {
                    seq.timeline.first_token = Some(now);
                    self.stats.num_prompt_tokens += seq.num_prompt_tokens as u64;
                    // Counted with prompt_tokens, so the sources sum to it.
                    self.stats.num_prompt_tokens_cached += seq.num_cached_tokens as u64;
                    let t = self.stats.tenant_entry(seq.request.tenant);
                    t.prompt += seq.num_prompt_tokens as u64;
                    t.prompt_cached += seq.num_cached_tokens as u64;
                }
                seq.timeline.last_token = Some(now);
                self.stats.num_generation_tokens += 1;
                self.stats.tenant_entry(seq.request.tenant).generation += 1;
                let mut stopped =
                    check_stop(seq, token, &self.eos_token_ids, self.config.max_model_len);
                if let Some(g) = &seq.grammar {
                    let advance = match stopped {
                        // Ending here anyway: what matters is whether this
                        // token completes the grammar (then it is a stop).
                        Some((FinishReason::Length, _)) => g.advance(token),
                        Some(_) => Advance::Continue,
                        // Consumed by the grammar worker with the next mask.
                        None => g.defer(token),
                    };
                    match advance {
                        Advance::Continue => {}
                        // A complete grammar ends the output, as EOS would.
                        Advance::Finished => {
                            if stopped.is_none_or(|(r, _)| r == FinishReason::Length) {
                                stopped = Some((FinishReason::Stop, None));
                            }
                        }
                        Advance::Error(e) => {
                            // A token deferred earlier broke the grammar.
                            if stopped.is_none() {
                                self.grammar_errors.push((idx, e));
                                stopped = Some((FinishReason::Error, None));
                            }
                        }
                    }
                }
                if let Some((reason, stop)) = stopped {
                    // The token goes out with the finish.
                    self.finishing.push((idx, reason, stop));
                } else {
                    let (logprobs, prompt_logprobs) = seq.take_logprobs();
                    let out = RequestOutput {
                        token_id: Some(token),
                        at: now,
                        finished: None,
                        logprobs,
                        prompt_logprobs,
                    };
                    if self.outbox.is_some() {
                        // Held until the step's outputs are shipped (see
                        // `send_outputs` and `take_outputs`).
                        debug_assert!(seq.pending.is_none(), "two outputs in one step");
                        seq.pending = Some(out);
                        self.pending_outputs += 1;
                    } else {
                        // A closed sink means the client left; the abort follows.
                        let _ = seq.sink.send(out);
                    }
                }
            }
            if caching {
                let computed_full = seq.num_computed / bs;
                while seq.num_cached_blocks < computed_full.min(seq.block_hashes.len()) {
                    let k = seq.num_cached_blocks;
                    let parent = k.checked_sub(1).map(|p| seq.block_hashes[p]);
                    let tokens = &seq.tokens[k * bs..(k + 1) * bs];
                    self.pool
                        .cache_block(seq.blocks[k], seq.block_hashes[k], parent, tokens);
                    seq.num_cached_blocks += 1;
                }
            }
        }
        drop(masks);
        if self.finishing.is_empty() {
            return;
        }
        // Remove from the highest index down so the others stay valid.
        let mut finishing = std::mem::take(&mut self.finishing);
        finishing.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        for &(idx, reason, stop) in &finishing {
            let seq = self.running.remove(idx);
            if reason == FinishReason::Error {
                let error = match self.grammar_errors.iter().position(|e| e.0 == idx) {
                    Some(i) => Some(self.grammar_errors.swap_remove(i).1),
                    None => Some("the executor returned no token".to_owned()),
                };
                self.end(seq, reason, None, None, error, now);
            } else if self.grammar_done.contains(&idx) {
                // Its last token went out with the previous step.
                self.end(seq, reason, None, None, None, now);
            } else {
                // Finished by the token just sampled: it travels with the finish.
                let last = seq.tokens.last().copied();
                self.end(seq, reason, stop, last, None, now);
            }
        }
        self.finishing = finishing;
    }

    /// Fails every sequence of the current batch (an executor step error).
    pub fn fail_batch(&mut self, message: &str) {
        let now = Instant::now();
        let mut idx: Vec<usize> = self.batch_running_idx.clone();
        idx.sort_unstable_by_key(|&i| std::cmp::Reverse(i));
        idx.dedup();
        for i in idx {
            let seq = self.running.remove(i);
            self.finish(
                seq,
                FinishReason::Error,
                None,
                Some(message.to_owned()),
                now,
            );
        }
        self.batch.clear();
        self.batch_running_idx.clear();
    }

    fn finish(
        &mut self,
        seq: Sequence,
        reason: FinishReason,
        stop_token_id: Option<u32>,
        error: Option<String>,
        now: Instant,
    ) {
        self.end(seq, reason, stop_token_id, None, error, now);
    }

    /// Frees the request's blocks, records its stats and sends its final
    /// output, carrying `token` when the last sampled token ended it.
    fn end(
        &mut self,
        mut seq: Sequence,
        reason: FinishReason,
        stop_token_id: Option<u32>,
        token: Option<u32>,
        error: Option<String>,
        now: Instant,
    ) {
        self.pool.free(&seq.blocks);
        seq.blocks.clear();
        self.ended_seq_ids.push(seq.seq_id);
        seq.timeline.finished = Some(now);
        let t = &seq.timeline;
        self.stats.finished_requests.push(FinishedRequestStats {
            request: seq.request.clone(),
            finish_reason: reason,
            num_prompt_tokens: seq.num_prompt_tokens,
            num_generation_tokens: seq.num_generated(),
            num_cached_tokens: seq.num_cached_tokens,
            max_tokens_param: seq.params.max_tokens,
            n: seq.params.n,
            num_preemptions: seq.num_preemptions,
            queue_time: t.queue_time(),
            prefill_time: t.prefill_time(),
            decode_time: t.decode_time(),
            inference_time: t.inference_time(),
        });
        let num_generation_tokens = seq.num_generated();
        let (logprobs, prompt_logprobs) = if token.is_some() {
            seq.take_logprobs()
        } else {
            (None, None)
        };
        if let Some(traced) = &mut self.traced {
            traced.push(RequestTrace {
                request_id: Arc::clone(&seq.request.request_id),
                timeline: seq.timeline.clone(),
            });
        }
        let out = RequestOutput {
            token_id: token,
            at: now,
            logprobs,
            prompt_logprobs,
            finished: Some(Box::new(FinishedOutput {
                reason,
                stop_token_id,
                num_prompt_tokens: seq.num_prompt_tokens,
                num_generation_tokens,
                num_cached_tokens: seq.num_cached_tokens,
                num_preemptions: seq.num_preemptions,
                timeline: seq.timeline,
                error,
            })),
        };
        match &mut self.outbox {
            Some(outbox) => outbox.push((seq.sink, out)),
            None => {
                let _ = seq.sink.send(out);
            }
        }
    }
}

/// The stop condition a new token triggers, if any.
fn check_stop(
    seq: &Sequence,
    token: u32,
    eos_token_ids: &[u32],
    max_model_len: usize,
) -> Option<(FinishReason, Option<u32>)> {
    let p = &seq.params;
    let generated = seq.num_generated();
    if generated >= p.min_tokens {
        if !p.ignore_eos && eos_token_ids.contains(&token) {
            return Some((FinishReason::Stop, Some(token)));
        }
        if seq.params.stop_token_ids.contains(token) {
            return Some((FinishReason::Stop, Some(token)));
        }
    }
    if generated >= p.max_tokens || seq.tokens.len() >= max_model_len {
        return Some((FinishReason::Length, None));
    }
    None
}
