//! A minimal stand-in for the scheduler: sequences with block tables
//! allocated from a free counter, turned into `ScheduledBatch`es.
#![allow(dead_code)]

use std::sync::Arc;

use inferscope_engine::{SamplingParams, ScheduledBatch, ScheduledSeq, SeqHistory};

pub const BLOCK_SIZE: usize = 4;

/// One sequence as the scheduler sees it.
pub struct Seq {
    pub id: u64,
    /// Every token known so far (prompt + generated).
    pub tokens: Vec<u32>,
    /// Length of the prompt at the head of `tokens`.
    pub prompt_len: usize,
    /// Positions already in the KV cache.
    pub cached: usize,
    pub blocks: Vec<u32>,
    pub num_generated: usize,
    pub seed: u64,
    pub params: Arc<SamplingParams>,
}

impl Seq {
    pub fn new(id: u64, prompt: &[u32], params: SamplingParams) -> Self {
        Self {
            id,
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            cached: 0,
            blocks: Vec::new(),
            num_generated: 0,
            seed: id * 1000 + 7,
            params: Arc::new(params),
        }
    }

    /// Forgets the KV cache (preemption by recompute) and moves to fresh blocks.
    pub fn preempt(&mut self) {
        self.cached = 0;
        self.blocks.clear();
    }
}

pub fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    }
}

/// Allocates blocks of `block_size` tokens from a bump counter.
pub struct Alloc {
    next: u32,
    block_size: usize,
}

impl Alloc {
    /// Blocks of [`BLOCK_SIZE`] from `first` on.
    pub fn new(first: u32) -> Self {
        Self {
            next: first,
            block_size: BLOCK_SIZE,
        }
    }

    /// The same with another block size.
    pub fn with_block_size(mut self, block_size: usize) -> Self {
        self.block_size = block_size;
        self
    }
}

/// A batch with each sequence's uncached tokens (at most `chunk` of them);
/// a sequence samples once all its tokens are in.
pub fn build_batch(seqs: &mut [&mut Seq], alloc: &mut Alloc, chunk: usize) -> ScheduledBatch {
    let mut b = ScheduledBatch {
        block_size: alloc.block_size,
        ..ScheduledBatch::default()
    };
    for s in seqs.iter_mut() {
        let n = (s.tokens.len() - s.cached).min(chunk);
        let end = s.cached + n;
        while s.blocks.len() * alloc.block_size < end {
            s.blocks.push(alloc.next);
            alloc.next += 1;
        }
        let sample = end == s.tokens.len();
        let mut history = SeqHistory {
            num_prompt_tokens: s.prompt_len,
            ..SeqHistory::default()
        };
        if sample {
            b.push_output_tail(&mut history, &s.tokens, &s.params);
        }
        b.seqs.push(ScheduledSeq {
            seq_id: s.id,
            token_offset: b.token_ids.len(),
            num_tokens: n,
            start_pos: s.cached,
            block_table_offset: b.block_tables.len(),
            block_table_len: s.blocks.len(),
            is_prefill: s.num_generated == 0 || n > 1,
            sample,
            num_generated: s.num_generated,
            seed: s.seed,
            params: s.params.clone(),
            history,
            mask_slot: None,
            prompt_rows: None,
        });
        b.token_ids.extend_from_slice(&s.tokens[s.cached..end]);
        b.block_tables.extend_from_slice(&s.blocks);
        s.cached = end;
    }
    b
}

/// Appends sampled tokens to the sequences that sampled.
pub fn append(seqs: &mut [&mut Seq], batch: &ScheduledBatch, sampled: &[Option<u32>]) {
    for (s, (sched, tok)) in seqs.iter_mut().zip(batch.seqs.iter().zip(sampled)) {
        assert_eq!(sched.sample, tok.is_some());
        if let Some(t) = tok {
            s.tokens.push(*t);
            s.num_generated += 1;
        }
    }
}
