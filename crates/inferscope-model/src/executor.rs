//! The `cpu` executor: runs scheduled steps through the model over its own
//! paged KV pool and samples one token per sampling sequence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inferscope_engine::{Executor, ExecutorError, ScheduledBatch, StepOutput};

use crate::attention::TokenCtx;
use crate::kv_storage::KvStorage;
use crate::llama::{LlamaModel, Scratch, StepTokens};
use crate::sampler::{sample, token_rng};

/// Where the KV pool's size comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// Exactly this many bytes.
    Bytes(u64),
    /// This fraction of the memory available when the pool is allocated.
    FractionOfAvailable(f64),
}

/// Runs a [`LlamaModel`] on the CPU for the engine.
pub struct CpuExecutor {
    name: String,
    model: Arc<LlamaModel>,
    budget: KvBudget,
    eos: Vec<u32>,
    pool: Option<KvStorage>,
    threads: Option<rayon::ThreadPool>,
    // Reused between steps.
    ctx: Vec<TokenCtx>,
    rows: Vec<usize>,
    scratch: Scratch,
    masked: Vec<u32>,
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
    /// An executor sharing `model`; the pool is allocated by `init_kv_cache`.
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
        Ok(Self {
            name,
            model,
            budget,
            eos,
            pool: None,
            threads,
            ctx: Vec::new(),
            rows: Vec::new(),
            scratch: Scratch::default(),
            masked: Vec::new(),
            last_forward: Duration::ZERO,
            #[cfg(test)]
            host_pause: Duration::ZERO,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.model
    }

    /// Bytes of one KV block of `block_size` tokens.
    pub fn block_bytes(&self, block_size: usize) -> u64 {
        (self.model.cfg.kv_bytes_per_token() * block_size) as u64
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
            {
                return bad(format!("sequence {} has inconsistent offsets", s.seq_id));
            }
            if s.sample && s.num_tokens == 0 {
                return bad(format!("sequence {} samples without new tokens", s.seq_id));
            }
        }
        Ok(())
    }

    /// Runs the step and returns the logits (`[vocab]`) of each sequence that
    /// samples, in batch order. `execute` is this plus sampling; tests compare
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
        self.pool = Some(KvStorage::new(
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
            kv_cache_bytes = num_blocks as u64 * per_block,
            "allocated KV cache"
        );
        Ok(num_blocks)
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn execute(
        &mut self,
        batch: &ScheduledBatch,
        out: &mut StepOutput,
    ) -> Result<(), ExecutorError> {
        self.last_forward = Duration::ZERO;
        self.forward(batch)?;
        out.sampled.clear();
        #[cfg(test)]
        std::thread::sleep(self.host_pause);
        let vocab = self.model.cfg.vocab_size;
        let mut rows = self.scratch.logits.chunks_exact_mut(vocab);
        let masked = &mut self.masked;
        for s in &batch.seqs {
            if !s.sample {
                out.sampled.push(None);
                continue;
            }
            let Some(l) = rows.next() else {
                return Err(ExecutorError::Step("missing logits row".into()));
            };
            masked.clear();
            if s.mask_stop_tokens() {
                masked.extend_from_slice(&self.eos);
                masked.extend_from_slice(&s.params.stop_token_ids);
            }
            let mut rng = token_rng(s.seed, s.num_generated);
            out.sampled
                .push(Some(sample(l, &s.params, masked, &mut rng)));
        }
        out.device_time = self.last_forward;
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
}
