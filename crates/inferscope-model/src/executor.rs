//! The `cpu` executor: runs scheduled steps through the model over its own
//! paged KV pool and samples one token per sampling sequence.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferscope_engine::{
    Executor, ExecutorError, LogprobRow, ScheduledBatch, StepCost, StepOutput,
};

use crate::attention::TokenCtx;
use crate::kv_storage::{KvDtype, KvStorage};
use crate::llama::{LlamaModel, Part, Scratch, StepProfile, StepTokens};
use crate::logprobs::{LogprobsMode, position_logprobs};
use crate::sampler::{Sampler, token_rng};
use crate::token_counts::TokenCounts;

/// Where the KV pool's size comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// Exactly this many bytes.
    Bytes(u64),
    /// This fraction of the memory available when the pool is allocated.
    FractionOfAvailable(f64),
}

/// Estimated work per token of a model on the cpu executor, the terms of
/// its step cost (`--enable-mfu-metrics`): an estimate from the shapes and
/// the stored weights, not a measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuCost {
    /// FLOPs per token through the projections and the LM head: 2 × m × n
    /// per `[m, n]` weight (one multiply and one add per weight).
    pub linear_flops_per_token: f64,
    /// FLOPs per (query token, attended position) pair: QKᵀ and PV,
    /// 2 × 2 × layers × heads × head_dim.
    pub attn_flops_per_pair: f64,
    /// Bytes of the projection and LM-head weights as stored (f32, bf16 or
    /// quantized blocks, panel padding included), read once per step.
    pub weight_bytes: f64,
    /// Key and value bytes of one token over all layers, in the pool's type.
    pub kv_bytes_per_token: f64,
    /// Positions a token attends to, itself included (sliding window).
    pub window: Option<usize>,
}

impl CpuCost {
    /// The cost terms of `model` over a KV cache of `kv_dtype`. A quantized
    /// weight costs the same FLOPs as a dense one (the kernels widen it to
    /// f32) and reads its stored bytes.
    pub fn of(model: &LlamaModel, kv_dtype: KvDtype) -> Self {
        let c = &model.cfg;
        let (h, q, kv) = (
            c.hidden_size as f64,
            (c.num_heads * c.head_dim) as f64,
            (c.num_kv_heads * c.head_dim) as f64,
        );
        let attn = h * q + 2.0 * h * kv + q * h;
        let linear =
            attn * c.num_layers as f64 + c.mlp_macs_per_token() as f64 + h * c.vocab_size as f64;
        Self {
            linear_flops_per_token: 2.0 * linear,
            attn_flops_per_pair: 4.0 * c.num_layers as f64 * q,
            weight_bytes: model.weight_bytes() as f64,
            kv_bytes_per_token: c.kv_bytes_per_token(kv_dtype) as f64,
            // Gemma's global layers attend to everything: only a window on
            // every layer (Mistral's) bounds the attention cost.
            window: c
                .sliding_window
                .filter(|_| c.arch.sliding_window_pattern.is_none()),
        }
    }

    /// The estimated work of `batch`: every new token goes through the
    /// projections and attends to its window of the context; the step reads
    /// the weights once and the KV of the positions its tokens attend to,
    /// and writes the KV of the new tokens.
    pub fn step_cost(&self, batch: &ScheduledBatch) -> StepCost {
        if batch.seqs.is_empty() {
            return StepCost::default();
        }
        let (mut pairs, mut kv_read, mut tokens) = (0u64, 0u64, 0u64);
        for s in &batch.seqs {
            let (start, n) = (s.start_pos as u64, s.num_tokens as u64);
            let end = start + n;
            // The token at position p attends to min(p + 1, window) positions.
            pairs += attended_pairs(start, end, self.window.map(|w| w as u64));
            // The earliest position any of them sees, to the last.
            let first = self
                .window
                .map_or(0, |w| (start + 1).saturating_sub(w as u64));
            kv_read += if n == 0 { 0 } else { end - first };
            tokens += n;
        }
        StepCost {
            flops: tokens as f64 * self.linear_flops_per_token
                + pairs as f64 * self.attn_flops_per_pair,
            read_bytes: self.weight_bytes + kv_read as f64 * self.kv_bytes_per_token,
            write_bytes: tokens as f64 * self.kv_bytes_per_token,
        }
    }
}

/// Σ min(p + 1, window) over the positions `start..end`.
fn attended_pairs(start: u64, end: u64, window: Option<u64>) -> u64 {
    if end <= start {
        return 0;
    }
    // Sum of v for v in lo..=hi.
    let sum = |lo: u64, hi: u64| {
        if hi < lo {
            0
        } else {
            (lo + hi) * (hi - lo + 1) / 2
        }
    };
    let (a, b) = (start + 1, end);
    match window {
        None => sum(a, b),
        Some(w) => {
            let capped = b.saturating_sub(w.max(a - 1));
            sum(a, b.min(w)) + capped * w
        }
    }
}

/// Runs a [`LlamaModel`] on the CPU for the engine.
pub struct CpuExecutor {
    name: String,
    model: Arc<LlamaModel>,
    budget: KvBudget,
    kv_dtype: KvDtype,
    eos: Vec<u32>,
    pool: Option<KvStorage>,
    threads: Option<rayon::ThreadPool>,
    // Reused between steps.
    ctx: Vec<TokenCtx>,
    rows: Vec<usize>,
    scratch: Scratch,
    masked: Vec<u32>,
    sampler: Sampler,
    // `--logprobs-mode`.
    logprobs_mode: LogprobsMode,
    // The raw logits of a row whose log-probabilities are asked for, kept
    // while sampling changes the row in place (reused, never per token).
    raw_row: Vec<f32>,
    // Token counts of the live sequences whose parameters use them
    // (penalties), kept as their tokens pass through the batches.
    counts: HashMap<u64, TokenCounts>,
    // `--enable-mfu-metrics`: the step cost's terms.
    cost: CpuCost,
    // The last step's forward pass (the device time it reports).
    last_forward: Duration,
    // Tests: a sleep in input preparation and one in sampling, host work
    // that must not count as device time.
    #[cfg(test)]
    host_pause: Duration,
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl CpuExecutor {
    /// An executor sharing `model` with a KV cache of the default type
    /// (f16; [`CpuExecutor::with_kv_dtype`] changes it); the pool is
    /// allocated by `init_kv_cache`.
    pub fn new(
        name: String,
        model: Arc<LlamaModel>,
        budget: KvBudget,
        eos: Vec<u32>,
        num_threads: Option<usize>,
    ) -> Result<Self, ExecutorError> {
        let threads = match num_threads {
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .map_err(|e| ExecutorError::Init(format!("thread pool: {e}")))?,
            ),
            None => None,
        };
        let kv_dtype = KvDtype::default();
        let cost = CpuCost::of(&model, kv_dtype);
        let scratch = Scratch::for_model(&model.cfg);
        Ok(Self {
            name,
            model,
            budget,
            kv_dtype,
            eos,
            pool: None,
            threads,
            ctx: Vec::new(),
            rows: Vec::new(),
            scratch,
            masked: Vec::new(),
            sampler: Sampler::default(),
            logprobs_mode: LogprobsMode::default(),
            raw_row: Vec::new(),
            counts: HashMap::new(),
            cost,
            last_forward: Duration::ZERO,
            #[cfg(test)]
            host_pause: Duration::ZERO,
        })
    }

    /// The same executor with a KV cache of `dtype` (before `init_kv_cache`).
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = dtype;
        self.cost = CpuCost::of(&self.model, dtype);
        self
    }

    /// The KV cache's element type.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// Reports log-probabilities from `mode`'s logits (`--logprobs-mode`).
    pub fn with_logprobs_mode(mut self, mode: LogprobsMode) -> Self {
        self.logprobs_mode = mode;
        self
    }

    /// The model.
    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.model
    }

    /// Bytes of one KV block of `block_size` tokens.
    pub fn block_bytes(&self, block_size: usize) -> u64 {
        (self.model.cfg.kv_bytes_per_token(self.kv_dtype) * block_size) as u64
    }

    fn check(&self, batch: &ScheduledBatch, pool: &KvStorage) -> Result<(), ExecutorError> {
        let bad = |m: String| Err(ExecutorError::Step(m));
        if batch.block_size != pool.block_size() {
            return bad(format!(
                "batch block size {} != KV pool block size {}",
                batch.block_size,
                pool.block_size()
            ));
        }
        let vocab = self.model.cfg.vocab_size;
        if let Some(&t) = batch.token_ids.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!(
                "token id {t} is outside the vocabulary (size {vocab})"
            ));
        }
        if let Some(&b) = batch
            .block_tables
            .iter()
            .find(|&&b| b as usize >= pool.num_blocks())
        {
            return bad(format!(
                "block {b} is outside the KV pool ({} blocks)",
                pool.num_blocks()
            ));
        }
        for s in &batch.seqs {
            let end = s.start_pos + s.num_tokens;
            if s.token_offset + s.num_tokens > batch.token_ids.len()
                || s.block_table_offset + s.block_table_len > batch.block_tables.len()
                || s.block_table_len * batch.block_size < end
                || s.history.offset + s.history.len > batch.history_token_ids.len()
                || s.history.len > s.start_pos
            {
                return bad(format!("sequence {} has inconsistent offsets", s.seq_id));
            }
            if s.sample && s.num_tokens == 0 {
                return bad(format!("sequence {} samples without new tokens", s.seq_id));
            }
        }
        Ok(())
    }

    /// Adds the tokens `batch` carries to the counts of the sequences whose
    /// parameters use them; the others cost one check each.
    fn count_tokens(&mut self, batch: &ScheduledBatch) -> Result<(), ExecutorError> {
        for s in &batch.seqs {
            if !s.params.uses_token_counts() {
                continue;
            }
            let counts = self
                .counts
                .entry(s.seq_id)
                .or_insert_with(|| TokenCounts::new(s.history.num_prompt_tokens));
            counts
                .extend_from_batch(batch, s)
                .map_err(|e| ExecutorError::Step(format!("sequence {}: {e}", s.seq_id)))?;
        }
        Ok(())
    }

    /// The token counts kept for a live sequence whose parameters use them.
    pub fn token_counts(&self, seq_id: u64) -> Option<&TokenCounts> {
        self.counts.get(&seq_id)
    }

    /// Writes pseudo-random K/V in [-1, 1] into every slot of the pool, as a
    /// prefill of every block would (benches: the cost of attention over a
    /// long context without the cost of computing it).
    #[doc(hidden)]
    pub fn fill_kv_cache(&mut self, seed: u64) -> Result<(), ExecutorError> {
        let pool = self
            .pool
            .as_mut()
            .ok_or_else(|| ExecutorError::Fatal("fill before init_kv_cache".into()))?;
        let cfg = &self.model.cfg;
        let dim = cfg.num_kv_heads * cfg.head_dim;
        let mut rng = crate::demo::SplitMix64::new(seed);
        let mut row = || -> Vec<f32> {
            (0..dim)
                .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        for layer in 0..cfg.num_layers {
            for block in 0..pool.num_blocks() {
                for slot in 0..pool.block_size() {
                    let (k, v) = (row(), row());
                    pool.write(layer, block, slot, &k, &v);
                }
            }
        }
        Ok(())
    }

    /// Turns the per-part step profile on (cleared) or off.
    #[doc(hidden)]
    pub fn set_profile(&mut self, on: bool) {
        self.scratch.laps.set(on);
    }

    /// The per-part times of the steps since [`CpuExecutor::set_profile`].
    #[doc(hidden)]
    pub fn profile(&self) -> Option<&StepProfile> {
        self.scratch.laps.profile()
    }

    /// Runs the step and returns the logits (`[vocab]`) of each row the
    /// step computes, in batch order: per sequence its prompt rows
    /// (`prompt_logprobs`), then its sampling row. `execute` is this plus sampling; tests compare
    /// these logits with a reference implementation.
    pub fn forward_logits(
        &mut self,
        batch: &ScheduledBatch,
    ) -> Result<Vec<Vec<f32>>, ExecutorError> {
        self.forward(batch)?;
        let vocab = self.model.cfg.vocab_size;
        Ok(self
            .scratch
            .logits
            .chunks_exact(vocab)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// Runs the step, leaving the logits in `self.scratch.logits`.
    fn forward(&mut self, batch: &ScheduledBatch) -> Result<(), ExecutorError> {
        let mut pool = self
            .pool
            .take()
            .ok_or_else(|| ExecutorError::Fatal("execute before init_kv_cache".into()))?;
        let result = self.forward_with_pool(batch, &mut pool);
        self.pool = Some(pool);
        result
    }

    fn forward_with_pool(
        &mut self,
        batch: &ScheduledBatch,
        pool: &mut KvStorage,
    ) -> Result<(), ExecutorError> {
        self.scratch.laps.start();
        self.check(batch, pool)?;
        #[cfg(test)]
        std::thread::sleep(self.host_pause);
        self.ctx.clear();
        self.rows.clear();
        for s in &batch.seqs {
            for j in 0..s.num_tokens {
                self.ctx.push(TokenCtx {
                    pos: s.start_pos + j,
                    table_offset: s.block_table_offset,
                });
            }
            // Prompt rows before the sampling row, as `execute` reads them.
            if let Some(r) = s.prompt_rows {
                let first = s.token_offset + r.start.saturating_sub(s.start_pos);
                let last = s.token_offset + r.end.saturating_sub(s.start_pos);
                self.rows
                    .extend(first..last.min(s.token_offset + s.num_tokens));
            }
            if s.sample {
                self.rows.push(s.token_offset + s.num_tokens - 1);
            }
        }
        // Tokens are laid out in `token_ids` in sequence order; `ctx` must
        // follow the same order.
        let step = StepTokens {
            ids: &batch.token_ids,
            ctx: &self.ctx,
            block_tables: &batch.block_tables,
        };
        if step.ctx.len() != step.ids.len() {
            return Err(ExecutorError::Step(format!(
                "sequences cover {} tokens but the batch has {}",
                step.ctx.len(),
                step.ids.len()
            )));
        }
        self.scratch.laps.lap(Part::Prepare);
        let model = &self.model;
        let rows = &self.rows;
        let scratch = &mut self.scratch;
        let mut run = || model.forward(&step, pool, rows, scratch);
        // A step whose products go parallel runs on a worker of the pool, so
        // that each parallel section wakes one other thread; called from
        // outside the pool, every section would wake two and put this one
        // to sleep.
        let parallel = model.parallel_step(step.ids.len());
        // Only the forward pass is device time: building `ctx` and `rows`
        // above and sampling afterwards are host work of the execute phase.
        let start = Instant::now();
        let result = match &self.threads {
            Some(tp) => tp.install(run),
            None if parallel => rayon::scope(|_| run()),
            None => run(),
        };
        self.last_forward = start.elapsed();
        result.map_err(|e| ExecutorError::Step(e.to_string()))
    }
}

impl Executor for CpuExecutor {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn init_kv_cache(&mut self, block_size: usize) -> Result<usize, ExecutorError> {
        if block_size == 0 {
            return Err(ExecutorError::Init("block size must be positive".into()));
        }
        let budget = match self.budget {
            KvBudget::Bytes(b) => b,
            KvBudget::FractionOfAvailable(f) => {
                let avail = available_memory().ok_or_else(|| {
                    ExecutorError::Init(
                        "cannot read MemAvailable from /proc/meminfo; set --kv-cache-memory".into(),
                    )
                })?;
                (avail as f64 * f.clamp(0.0, 1.0)) as u64
            }
        };
        let per_block = self.block_bytes(block_size);
        let num_blocks = (budget / per_block).min(u64::from(u32::MAX)) as usize;
        if num_blocks == 0 {
            return Err(ExecutorError::Init(format!(
                "KV cache budget of {budget} bytes is smaller than one block ({per_block} bytes)"
            )));
        }
        let cfg = &self.model.cfg;
        self.pool = Some(KvStorage::with_dtype(
            self.kv_dtype,
            cfg.num_layers,
            num_blocks,
            block_size,
            cfg.num_kv_heads,
            cfg.head_dim,
        ));
        tracing::info!(
            executor = %self.name,
            num_blocks,
            block_size,
            kv_cache_dtype = self.kv_dtype.name(),
            kv_cache_tokens = num_blocks * block_size,
            kv_cache_bytes = num_blocks as u64 * per_block,
            "allocated KV cache"
        );
        Ok(num_blocks)
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn step_cost(&self, batch: &ScheduledBatch) -> Option<StepCost> {
        Some(self.cost.step_cost(batch))
    }

    fn take_expert_tokens(&mut self, out: &mut Vec<u64>) {
        self.scratch.take_expert_tokens(out);
    }

    fn execute(
        &mut self,
        batch: &ScheduledBatch,
        out: &mut StepOutput,
    ) -> Result<(), ExecutorError> {
        self.last_forward = Duration::ZERO;
        for id in &batch.finished_seq_ids {
            self.counts.remove(id);
        }
        // After the forward pass, which checks the batch's offsets.
        self.forward(batch)?;
        self.count_tokens(batch)?;
        out.sampled.clear();
        #[cfg(test)]
        std::thread::sleep(self.host_pause);
        let vocab = self.model.cfg.vocab_size;
        out.logprobs.clear();
        let mut rows = self.scratch.logits.chunks_exact_mut(vocab);
        let masked = &mut self.masked;
        // Computed on the grammar thread during the forward pass: waiting
        // here, not before it, is what overlaps the two.
        let grammar = batch.masks.as_ref().map(|m| m.wait());
        let missing = || ExecutorError::Step("missing logits row".into());
        for (k, s) in batch.seqs.iter().enumerate() {
            if let Some(r) = s.prompt_rows {
                let n = s.params.prompt_logprobs.unwrap_or(0);
                let last = r.end.min(s.start_pos + s.num_tokens);
                for pos in r.start.max(s.start_pos)..last {
                    let l = rows.next().ok_or_else(missing)?;
                    let target = s.prompt_target(batch, pos).ok_or_else(missing)?;
                    // Prompt rows are never sampled: raw and processed agree
                    // (vLLM's prompt log-probabilities are raw in both modes).
                    out.logprobs.push(LogprobRow {
                        seq_index: k,
                        position: pos,
                        prompt: true,
                        logprobs: position_logprobs(l, target, n),
                    });
                }
            }
            if !s.sample {
                out.sampled.push(None);
                continue;
            }
            let l = rows.next().ok_or_else(missing)?;
            masked.clear();
            if s.mask_stop_tokens() {
                masked.extend_from_slice(&self.eos);
                masked.extend(s.params.stop_token_ids.iter());
            }
            // Masked with the stop tokens, before `logit_bias`, as vLLM
            // masks them with `allowed_token_ids`.
            masked.extend(s.params.bad_words.banned(batch.output_tail(s)));
            if let (Some(slot), Some(ready)) = (s.mask_slot, &grammar)
                && let Some(mask) = ready.get(slot as usize)
            {
                mask.apply(l);
            }
            let mut rng = token_rng(s.seed, s.num_generated);
            let counts = self.counts.get(&s.seq_id);
            let raw =
                s.params.logprobs.is_some() && self.logprobs_mode == LogprobsMode::RawLogprobs;
            if raw {
                // Sampling changes the row in place: keep the raw logits.
                self.raw_row.clear();
                self.raw_row.extend_from_slice(l);
            }
            let token = self.sampler.sample(l, &s.params, masked, counts, &mut rng);
            out.sampled.push(Some(token));
            if let Some(n) = s.params.logprobs {
                let logprobs = if raw {
                    position_logprobs(&self.raw_row, token, n)
                } else {
                    self.sampler.processed_logprobs(l, token, n)
                };
                out.logprobs.push(LogprobRow {
                    seq_index: k,
                    position: s.start_pos + s.num_tokens - 1,
                    prompt: false,
                    logprobs,
                });
            }
        }
        out.device_time = self.last_forward;
        self.scratch.laps.lap(Part::Sample);
        self.scratch.laps.step_done();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LoadedModel, ModelOptions};
    use inferscope_engine::{SamplingParams, ScheduledSeq};

    /// Device time is the forward pass only: host pauses planted in input
    /// preparation and in sampling stay outside it, whatever the load.
    #[test]
    fn device_time_excludes_input_preparation_and_sampling() {
        let opts = ModelOptions {
            kv_cache_memory: Some(8 << 20),
            ..ModelOptions::default()
        };
        let m = LoadedModel::load("demo", &opts).unwrap();
        let mut e = m.cpu_executor().unwrap();
        e.init_kv_cache(16).unwrap();
        let pause = Duration::from_millis(50);
        e.host_pause = pause;
        let batch = ScheduledBatch {
            block_size: 16,
            token_ids: vec![1, 2, 3, 4],
            block_tables: vec![0],
            seqs: vec![ScheduledSeq {
                seq_id: 1,
                token_offset: 0,
                num_tokens: 4,
                start_pos: 0,
                block_table_offset: 0,
                block_table_len: 1,
                is_prefill: true,
                sample: true,
                num_generated: 0,
                seed: 7,
                params: Arc::new(SamplingParams::default()),
                history: Default::default(),
                mask_slot: None,
                prompt_rows: None,
            }],
            ..ScheduledBatch::default()
        };
        let mut out = StepOutput::default();
        let start = Instant::now();
        e.execute(&batch, &mut out).unwrap();
        let wall = start.elapsed();
        assert_eq!(out.sampled.len(), 1);
        assert!(out.device_time > Duration::ZERO);
        // Sleeps last at least their duration, so this holds on any machine.
        assert!(
            wall - out.device_time >= 2 * pause,
            "wall {wall:?}, device {:?}",
            out.device_time
        );
    }

    fn seq(seq_id: u64, start_pos: usize, num_tokens: usize, token_offset: usize) -> ScheduledSeq {
        ScheduledSeq::for_test(seq_id, start_pos, num_tokens, token_offset)
    }

    /// A model whose output dims are all multiples of the 16-row panels, so
    /// the stored weights have no padding and the bytes are m × n × 4.
    fn small_model(window: Option<usize>) -> LlamaModel {
        let cfg = crate::ModelConfig {
            vocab_size: 64,
            hidden_size: 32,
            intermediate_size: 48,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            sliding_window: window,
            ..crate::demo::demo_config()
        };
        let w = crate::demo::random_weights(&cfg, 1).unwrap();
        crate::loader::model_from_tensors(cfg, w).unwrap()
    }

    /// The step cost against a hand computation for a 2-layer model.
    #[test]
    fn step_cost_matches_a_hand_computation() {
        // Per layer: q 32·32 + k 32·16 + v 32·16 + o 32·32 + gate, up, down
        // 3 · 32·48 = 7680 weights; 2 layers + LM head 64·32 = 17408.
        let linear = 17_408.0;
        let model = small_model(None);
        let c = CpuCost::of(&model, KvDtype::F32);
        assert_eq!(c.linear_flops_per_token, 2.0 * linear);
        // QKᵀ and PV: 2 · 2 · 2 layers · 32 query dims.
        assert_eq!(c.attn_flops_per_pair, 256.0);
        assert_eq!(c.weight_bytes, 4.0 * linear);
        // K and V: 2 · 2 layers · 16 dims · 4 bytes.
        assert_eq!(c.kv_bytes_per_token, 256.0);

        // A 4-token chunk after 3 cached tokens and a decode at position 9.
        let batch = ScheduledBatch {
            seqs: vec![seq(1, 3, 4, 0), seq(2, 9, 1, 4)],
            token_ids: vec![0; 5],
            ..ScheduledBatch::default()
        };
        let cost = c.step_cost(&batch);
        // Pairs: 4 + 5 + 6 + 7 = 22 for the chunk, 10 for the decode.
        assert_eq!(cost.flops, 5.0 * 34_816.0 + 32.0 * 256.0);
        // KV read: 7 + 10 positions; written: the 5 new tokens.
        assert_eq!(cost.read_bytes, 69_632.0 + 17.0 * 256.0);
        assert_eq!(cost.write_bytes, 5.0 * 256.0);
        assert_eq!(c.step_cost(&ScheduledBatch::default()), StepCost::default());

        // bf16 storage halves the weight bytes and nothing else.
        let bf16 = CpuCost::of(
            &small_model(None).with_weight_dtype(crate::packed::WeightDtype::Bf16),
            KvDtype::F32,
        );
        assert_eq!(bf16.weight_bytes, 2.0 * linear);
        assert_eq!(bf16.step_cost(&batch).flops, cost.flops);

        // A 4-position window: the chunk's tokens see 4 each, the decode 4;
        // the chunk reads positions 0..7, the decode 6..10.
        let w = CpuCost::of(&small_model(Some(4)), KvDtype::F32);
        let cost = w.step_cost(&batch);
        assert_eq!(cost.flops, 5.0 * 34_816.0 + 20.0 * 256.0);
        assert_eq!(cost.read_bytes, 69_632.0 + 11.0 * 256.0);
    }

    /// The executor hands the engine its step cost (the demo model is dense).
    #[test]
    fn cpu_executor_reports_its_step_cost() {
        let m = LoadedModel::load("demo-random", &ModelOptions::default()).unwrap();
        let e = m.cpu_executor().unwrap();
        let batch = ScheduledBatch {
            seqs: vec![seq(1, 0, 2, 0)],
            token_ids: vec![0; 2],
            ..ScheduledBatch::default()
        };
        let cost = e.step_cost(&batch).expect("a cost for a dense model");
        let expected = CpuCost::of(m.model(), e.kv_dtype()).step_cost(&batch);
        assert_eq!(cost, expected);
        assert!(cost.flops > 0.0 && cost.read_bytes >= m.model().weight_bytes() as f64);
    }

    #[test]
    fn attended_pairs_sums_capped_positions() {
        for (start, end, w) in [(0, 10, 3), (5, 6, 3), (2, 9, 100), (0, 1, 1), (7, 20, 7)] {
            let brute: u64 = (start..end).map(|p: u64| (p + 1).min(w)).sum();
            assert_eq!(
                attended_pairs(start, end, Some(w)),
                brute,
                "{start}..{end} w {w}"
            );
            let full: u64 = (start..end).map(|p: u64| p + 1).sum();
            assert_eq!(attended_pairs(start, end, None), full);
        }
    }
}
