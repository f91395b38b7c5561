//! Property tests of the scheduler and KV block pool over random workloads:
//! random prompt and output lengths, shared prefixes, aborts at random steps,
//! and pools small enough to force preemption.
//!
//! A checking executor stands in for the device: it keeps, for every KV slot,
//! the token written there, its position and a hash of the whole sequence
//! before it, and verifies on every read (positions below `start_pos`) that
//! all three are the reading sequence's own — so a prefix-cache hit on a
//! block with the same tokens at another position or after another prefix
//! fails the test, not only a block with other tokens — and that no step
//! writes to a block another sequence holds. Prompts are built from a small
//! alphabet of block-aligned blocks, so the same block content recurs at
//! different offsets and after different prefixes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use inferscope_engine::output_channel::{OutputReceiver, channel};
use inferscope_engine::scheduler::Scheduler;
use inferscope_engine::{
    EngineConfig, EngineRequest, FinishReason, SamplingParams, ScheduledBatch, SchedulingPolicy,
    StepOutput,
};
use proptest::prelude::*;

use crate::common::request;

const EOS: u32 = 99;

#[derive(Debug, Clone)]
struct Req {
    prefix: usize,
    prompt_len: usize,
    max_tokens: usize,
    min_tokens: usize,
    ignore_eos: bool,
    abort_at_step: Option<usize>,
}

fn req_strategy() -> impl Strategy<Value = Req> {
    (
        0usize..3,
        1usize..80,
        1usize..40,
        0usize..5,
        any::<bool>(),
        prop::option::weighted(0.2, 0usize..60),
    )
        .prop_map(
            |(prefix, prompt_len, max_tokens, min_tokens, ignore_eos, abort_at_step)| Req {
                prefix,
                prompt_len,
                max_tokens,
                min_tokens,
                ignore_eos,
                abort_at_step,
            },
        )
}

/// What a KV slot holds: the token, its position, and a hash of every
/// token before it (what a real model's keys and values depend on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    token: u32,
    pos: usize,
    prefix: u64,
}

/// `h[i]`: hash of `tokens[..i]`, for every `i` up to the length.
fn prefix_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut h = Vec::with_capacity(tokens.len() + 1);
    let mut x: u64 = 0xcbf2_9ce4_8422_2325;
    h.push(x);
    for &t in tokens {
        x = (x ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3);
        x ^= x >> 29;
        h.push(x);
    }
    h
}

/// The device stand-in: what each KV slot holds.
struct CheckingDevice {
    kv: Vec<Option<Slot>>,
    block_size: usize,
}

impl CheckingDevice {
    fn step(
        &mut self,
        batch: &ScheduledBatch,
        tokens_of: &HashMap<u64, Vec<u32>>,
        ref_count: impl Fn(u32) -> u32,
        out: &mut StepOutput,
    ) -> Result<(), String> {
        let bs = self.block_size;
        let mut written: HashSet<u32> = HashSet::new();
        out.sampled.clear();
        for s in &batch.seqs {
            let table = batch.block_table(s);
            let all = tokens_of
                .get(&s.seq_id)
                .ok_or_else(|| format!("unknown seq {}", s.seq_id))?;
            let prefix = prefix_hashes(all);
            let expect = |pos: usize| Slot {
                token: all[pos],
                pos,
                prefix: prefix[pos],
            };
            // Everything before start_pos must already be this sequence's KV:
            // its token, at this position, after this very prefix.
            for pos in 0..s.start_pos {
                let slot = table[pos / bs] as usize * bs + pos % bs;
                if self.kv[slot] != Some(expect(pos)) {
                    return Err(format!(
                        "seq {} reads position {pos} from block {} holding {:?}, expected {:?}",
                        s.seq_id,
                        table[pos / bs],
                        self.kv[slot],
                        expect(pos)
                    ));
                }
            }
            // New tokens go to blocks this sequence alone holds.
            for (i, &t) in batch.tokens(s).iter().enumerate() {
                let pos = s.start_pos + i;
                if t != all[pos] {
                    return Err(format!(
                        "seq {} token at {pos} is {t}, expected {}",
                        s.seq_id, all[pos]
                    ));
                }
                let block = table[pos / bs];
                if ref_count(block) != 1 {
                    return Err(format!("seq {} writes shared block {block}", s.seq_id));
                }
                self.kv[block as usize * bs + pos % bs] = Some(expect(pos));
            }
            for b in table[s.start_pos / bs..].iter() {
                if !written.insert(*b) {
                    return Err(format!("block {b} written by two sequences in one step"));
                }
            }
            out.sampled.push(s.sample.then(|| {
                let x = (s.seed ^ (s.num_generated as u64 * 0x9e37_79b9))
                    .wrapping_mul(0x2545_f491_4f6c_dd1d);
                let t = (x >> 40) as u32 % 8;
                if !s.mask_stop_tokens() && t == 0 {
                    EOS
                } else {
                    t
                }
            }));
        }
        Ok(())
    }
}

/// Three 48-token shared prefixes, each a sequence of blocks drawn from an
/// alphabet of three: the same block content recurs at other block offsets
/// of the same prefix and of the others, after different preceding tokens.
/// A block hash that ignored its parent would make those collide.
fn block_prefixes(block_size: usize) -> Vec<Vec<u32>> {
    (0..3usize)
        .map(|p| {
            (0..48usize)
                .map(|i| {
                    let k = i / block_size;
                    let letter = (k * k + p * k + p) % 3;
                    10 + (letter * block_size + i % block_size) as u32
                })
                .collect()
        })
        .collect()
}

/// Request `i`'s prompt: a shared prefix, then tokens of its own.
fn prompt_of(r: &Req, i: usize, prefixes: &[Vec<u32>]) -> Vec<u32> {
    let mut prompt: Vec<u32> = prefixes[r.prefix]
        .iter()
        .copied()
        .take(r.prompt_len)
        .collect();
    while prompt.len() < r.prompt_len {
        prompt.push(60 + (prompt.len() as u32 * 31 + i as u32) % 30);
    }
    prompt
}

fn run_workload(
    reqs: &[Req],
    num_blocks: usize,
    block_size: usize,
    budget: usize,
    max_seqs: usize,
    caching: bool,
) -> Result<(), TestCaseError> {
    let config = EngineConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: max_seqs,
        block_size,
        enable_prefix_caching: caching,
        max_model_len: 10_000,
        ..Default::default()
    };
    let mut sched = Scheduler::new(config, num_blocks, vec![EOS]);
    let mut device = CheckingDevice {
        kv: vec![None; num_blocks * block_size],
        block_size,
    };
    let prefixes = block_prefixes(block_size);
    let mut rxs: Vec<OutputReceiver> = Vec::new();
    let mut tokens_of: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut seq_of_req: HashMap<String, u64> = HashMap::new();
    for (i, r) in reqs.iter().enumerate() {
        let prompt = prompt_of(r, i, &prefixes);
        let (tx, rx) = channel(0);
        rxs.push(rx);
        sched.add_request(
            EngineRequest {
                request_id: format!("r{i}").into(),
                prompt_token_ids: prompt,
                params: Arc::new(SamplingParams {
                    max_tokens: r.max_tokens,
                    min_tokens: r.min_tokens.min(r.max_tokens),
                    ignore_eos: r.ignore_eos,
                    seed: Some(i as u64),
                    // Every other request counts tokens (a penalty): the
                    // history it is handed is checked below.
                    presence_penalty: if i % 2 == 0 { 0.5 } else { 0.0 },
                    ..Default::default()
                }),
                seed_offset: 0,
                arrival: Instant::now(),
                trace_id: None,
                tenant: None,
                tenant_label: 0,
                grammar: None,
            },
            tx,
        );
    }
    let mut streamed = vec![0usize; reqs.len()];
    let mut finishes: Vec<Vec<(FinishReason, usize)>> = vec![Vec::new(); reqs.len()];
    let mut cached: Vec<usize> = vec![0; reqs.len()];
    let mut out = StepOutput::default();
    let mut step = 0;
    let mut total_hits = 0u64;
    // What an executor that counts tokens has seen of each sequence.
    let mut executor_view: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut unsent_finished: Vec<u64> = Vec::new();
    while sched.has_work() {
        prop_assert!(step < 20_000, "no progress: livelock");
        for v in sched.sequences() {
            seq_of_req.insert(v.request_id.clone(), v.seq_id);
            prop_assert!(v.blocks.len() * block_size >= v.num_computed);
        }
        for (i, r) in reqs.iter().enumerate() {
            if r.abort_at_step == Some(step) {
                sched.finish_request(&format!("r{i}"), FinishReason::Abort);
            }
        }
        // The tokens each live sequence is known to have.
        for (i, rx) in rxs.iter_mut().enumerate() {
            while let Ok(o) = rx.try_recv() {
                let seq = seq_of_req[&format!("r{i}")];
                prop_assert!(finishes[i].is_empty(), "output after finish for r{}", i);
                if let Some(t) = o.token_id {
                    streamed[i] += 1;
                    tokens_of.entry(seq).or_default().push(t);
                }
                if let Some(f) = o.finished {
                    finishes[i].push((f.reason, f.num_generation_tokens));
                    cached[i] = f.num_cached_tokens;
                    tokens_of.remove(&seq);
                }
            }
        }
        sched.schedule();
        let batch = sched.batch().clone();
        // The engine core runs no empty batch: the ids of sequences that
        // ended must come again with the next one (the executor frees their
        // state by them).
        for id in &unsent_finished {
            prop_assert!(
                batch.finished_seq_ids.contains(id),
                "ended seq {} never reaches the executor",
                id
            );
        }
        unsent_finished.clear();
        if batch.seqs.is_empty() {
            unsent_finished.extend_from_slice(&batch.finished_seq_ids);
        }
        prop_assert!(batch.num_tokens() <= budget, "token budget exceeded");
        prop_assert!(batch.seqs.len() <= max_seqs, "running cap exceeded");
        prop_assert!(sched.num_running() <= max_seqs);
        // Full token lists: prompt (from the request) + outputs so far.
        let mut full: HashMap<u64, Vec<u32>> = HashMap::new();
        for s in &batch.seqs {
            let req_idx: usize = seq_of_req
                .iter()
                .find(|(_, v)| **v == s.seq_id)
                .and_then(|(k, _)| k[1..].parse().ok())
                .ok_or_else(|| TestCaseError::fail("seq without request"))?;
            let mut prompt = prompt_of(&reqs[req_idx], req_idx, &prefixes);
            let prompt_len = prompt.len();
            prompt.extend(tokens_of.get(&s.seq_id).cloned().unwrap_or_default());
            // Batch by batch, an executor that counts tokens sees every
            // position of the sequence exactly as it is, without gaps,
            // whatever prefix hits and preemptions happened; the others
            // are handed no history.
            let history = batch.history(s);
            if s.params.uses_token_counts() {
                prop_assert_eq!(s.history.num_prompt_tokens, prompt_len);
                let seen = executor_view.entry(s.seq_id).or_default();
                let first = s.start_pos - history.len();
                prop_assert!(
                    first <= seen.len(),
                    "gap before {} in seq {}",
                    first,
                    s.seq_id
                );
                for (pos, &t) in (first..).zip(history.iter().chain(batch.tokens(s))) {
                    if pos == seen.len() {
                        seen.push(t);
                    }
                }
                let end = s.start_pos + s.num_tokens;
                prop_assert!(seen.len() >= end);
                prop_assert_eq!(&seen[..], &prompt[..seen.len()]);
            } else {
                prop_assert!(history.is_empty());
            }
            full.insert(s.seq_id, prompt);
        }
        let pool = sched.pool();
        device
            .step(&batch, &full, |b| pool.ref_count(b), &mut out)
            .map_err(TestCaseError::fail)?;
        sched.update(&out);
        let snap = sched.snapshot();
        prop_assert!(snap.prefix_cache_hits <= snap.prefix_cache_queries);
        total_hits += snap.prefix_cache_hits;
        sched.clear_stats();
        step += 1;
    }
    // Ids an empty last batch carried wait for the next batch.
    if !unsent_finished.is_empty() {
        sched.schedule();
        for id in &unsent_finished {
            prop_assert!(
                sched.batch().finished_seq_ids.contains(id),
                "ended seq {} never reaches the executor",
                id
            );
        }
    }
    // Everything ended: every block is free, no reference is left.
    prop_assert_eq!(sched.pool().num_free(), num_blocks);
    for b in 0..num_blocks as u32 {
        prop_assert_eq!(sched.pool().ref_count(b), 0);
    }
    if !caching {
        prop_assert_eq!(total_hits, 0);
    }
    // Drain what the last step sent.
    for (i, rx) in rxs.iter_mut().enumerate() {
        while let Ok(o) = rx.try_recv() {
            prop_assert!(finishes[i].is_empty(), "output after finish for r{}", i);
            streamed[i] += usize::from(o.token_id.is_some());
            if let Some(f) = o.finished {
                finishes[i].push((f.reason, f.num_generation_tokens));
                cached[i] = f.num_cached_tokens;
            }
        }
    }
    // Every request finished exactly once, with the right reason.
    for (i, r) in reqs.iter().enumerate() {
        prop_assert_eq!(
            finishes[i].len(),
            1,
            "r{} finished {} times",
            i,
            finishes[i].len()
        );
        let (reason, generated) = finishes[i][0];
        // Whole blocks, from the prompt, leaving one token to compute.
        prop_assert_eq!(cached[i] % block_size, 0, "r{} cached {}", i, cached[i]);
        prop_assert!(
            cached[i] < r.prompt_len.max(1),
            "r{} cached {}",
            i,
            cached[i]
        );
        if !caching {
            prop_assert_eq!(cached[i], 0);
        }
        prop_assert_eq!(streamed[i], generated, "r{} streamed a different count", i);
        match reason {
            FinishReason::Abort => prop_assert!(r.abort_at_step.is_some()),
            FinishReason::Length => prop_assert_eq!(generated, r.max_tokens),
            FinishReason::Stop => {
                prop_assert!(!r.ignore_eos, "ignore_eos request stopped at EOS");
                prop_assert!(generated >= r.min_tokens.min(r.max_tokens));
            }
            FinishReason::Error => prop_assert!(false, "unexpected error finish"),
        }
        if r.ignore_eos && reason != FinishReason::Abort {
            prop_assert_eq!(
                generated,
                r.max_tokens,
                "ignore_eos must give exactly max_tokens"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Roomy pool: no preemption, prefix caching on.
    #[test]
    fn random_workloads_roomy(reqs in prop::collection::vec(req_strategy(), 1..24),
                              budget in 8usize..128, max_seqs in 1usize..16) {
        run_workload(&reqs, 256, 4, budget, max_seqs, true)?;
    }

    /// Pool just big enough for the largest request: preemption happens.
    #[test]
    fn random_workloads_tight_pool(reqs in prop::collection::vec(req_strategy(), 1..24),
                                   budget in 8usize..128, max_seqs in 1usize..16,
                                   caching in any::<bool>()) {
        let need = reqs.iter().map(|r| (r.prompt_len + r.max_tokens).div_ceil(4)).max().unwrap_or(1);
        run_workload(&reqs, need + 2, 4, budget, max_seqs, caching)?;
    }
}

#[test]
fn shared_prefixes_hit_the_cache() {
    let reqs: Vec<Req> = (0..6)
        .map(|_| Req {
            prefix: 1,
            prompt_len: 40,
            max_tokens: 4,
            min_tokens: 0,
            ignore_eos: true,
            abort_at_step: None,
        })
        .collect();
    let config = EngineConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 1,
        block_size: 4,
        enable_prefix_caching: true,
        max_model_len: 1000,
        ..Default::default()
    };
    // Run one after another (max_num_seqs 1): all but the first hit.
    let mut sched = Scheduler::new(config, 64, vec![EOS]);
    let mut rxs = Vec::new();
    for (i, _) in reqs.iter().enumerate() {
        let (tx, rx) = channel(0);
        rxs.push(rx);
        sched.add_request(request(&format!("r{i}"), (1..=40).collect(), 4), tx);
    }
    let mut out = StepOutput::default();
    let (mut queries, mut hits) = (0, 0);
    while sched.has_work() {
        step_sampling_7(&mut sched, &mut out);
        let snap = sched.snapshot();
        queries += snap.prefix_cache_queries;
        hits += snap.prefix_cache_hits;
    }
    assert_eq!(queries, 6 * 40);
    // 40 tokens = 10 blocks; one token must be computed, so 9 blocks hit.
    assert_eq!(hits, 5 * 36);
    for (i, mut rx) in rxs.into_iter().enumerate() {
        let mut got = None;
        while let Ok(o) = rx.try_recv() {
            if let Some(f) = o.finished {
                got = Some(f.num_cached_tokens);
            }
        }
        // The first computes everything; each later one finds 9 blocks.
        assert_eq!(got, Some(if i == 0 { 0 } else { 36 }), "r{i}");
    }
}

/// One step in which every sequence that samples gets token 7.
fn step_sampling_7(sched: &mut Scheduler, out: &mut StepOutput) {
    sched.schedule();
    out.sampled = sched
        .batch()
        .seqs
        .iter()
        .map(|s| s.sample.then_some(7))
        .collect();
    sched.update(out);
}

/// Tenant `a` holds every slot (`kv_bound`: every KV block, with slots to
/// spare) and has more waiting; tenant `b` arrives with one request (with
/// `b_running`, after one of its own that holds a slot). Returns, per step
/// after `b` arrived, whether `b` was in the batch, and the preemptions
/// counted over those steps.
fn light_tenant_behind_a_full_house(
    policy: SchedulingPolicy,
    kv_bound: bool,
    b_running: bool,
) -> (Vec<bool>, u64) {
    // Each request (8 prompt tokens, 7 generated) fits in one 16-token
    // block: 4 blocks hold a's first four, and nothing else.
    let (max_num_seqs, num_blocks) = if kv_bound { (64, 4) } else { (4, 256) };
    let config = EngineConfig {
        max_num_batched_tokens: 1000,
        max_num_seqs,
        block_size: 16,
        enable_prefix_caching: true,
        max_model_len: 1000,
        scheduling_policy: policy,
        ..Default::default()
    };
    let mut sched = Scheduler::new(config, num_blocks, vec![EOS]);
    let mut rxs = Vec::new();
    let mut add = |sched: &mut Scheduler, id: &str, tenant: &str| {
        let (tx, rx) = channel(0);
        rxs.push(rx);
        sched.add_request(
            EngineRequest {
                tenant: Some(Arc::from(tenant)),
                ..request(id, (1..=8).collect(), 7)
            },
            tx,
        );
    };
    if b_running {
        add(&mut sched, "b0", "b");
    }
    for i in 0..6 {
        add(&mut sched, &format!("a{i}"), "a");
    }
    let mut out = StepOutput::default();
    let mut step = |sched: &mut Scheduler| {
        step_sampling_7(sched, &mut out);
        sched
            .batch()
            .seqs
            .iter()
            .map(|s| s.seq_id)
            .collect::<Vec<_>>()
    };
    step(&mut sched);
    assert_eq!(sched.snapshot().num_running, 4, "a holds the house");
    add(&mut sched, "b", "b");
    // Sequence ids are given in arrival order.
    let b = if b_running { 7 } else { 6 };
    let total = if b_running { 8 } else { 7 };
    let mut seen = Vec::new();
    let mut preemptions = 0;
    for _ in 0..4 {
        let ids = step(&mut sched);
        seen.push(ids.contains(&b));
        let snap = sched.snapshot();
        assert_eq!(snap.num_running + snap.num_waiting, total, "nothing lost");
        preemptions += snap.num_preemptions;
    }
    (seen, preemptions)
}

#[test]
fn a_tenant_holding_two_fewer_slots_gets_room_within_two_steps() {
    // b_running: b holds one slot and a three, still two apart.
    for (kv_bound, b_running) in [(false, false), (true, false), (false, true)] {
        // Fair: one of a's requests yields its slot or blocks, and only one.
        // On arrival b is lifted to a's served count (no credit for idle
        // time) and the tie goes to a, so b is first in line from the step
        // after.
        let (seen, preemptions) =
            light_tenant_behind_a_full_house(SchedulingPolicy::Fair, kv_bound, b_running);
        assert_eq!(
            seen[1..],
            [true, true, true],
            "kv_bound {kv_bound}: {seen:?}"
        );
        assert_eq!(preemptions, 1, "kv_bound {kv_bound}");
        // FCFS: b waits until one of a's requests finishes.
        let (seen, preemptions) =
            light_tenant_behind_a_full_house(SchedulingPolicy::Fcfs, kv_bound, b_running);
        assert_eq!(seen, [false, false, false, false], "kv_bound {kv_bound}");
        assert_eq!(preemptions, 0, "kv_bound {kv_bound}");
    }
}
