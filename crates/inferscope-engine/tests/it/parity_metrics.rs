//! The figures behind vLLM's 2025–2026 metrics, checked on the scheduler and
//! block pool with a scripted device: prompt tokens by source, KV tokens
//! computed per request, waiting requests by reason, KV block residency.

use std::time::Duration;

use inferscope_engine::block_pool::{BlockPool, hash_block};
use inferscope_engine::output_channel::channel;
use inferscope_engine::scheduler::Scheduler;
use inferscope_engine::{EngineConfig, StepOutput};
use inferscope_schema::{IterationStats, SchedulerStats};

use crate::common::request;

/// One step with a device that samples token 7 for every sequence.
fn step(sched: &mut Scheduler) -> (SchedulerStats, IterationStats) {
    sched.schedule();
    let out = StepOutput {
        sampled: sched
            .batch()
            .seqs
            .iter()
            .map(|s| s.sample.then_some(7))
            .collect(),
        device_time: Duration::ZERO,
        logprobs: Vec::new(),
    };
    sched.update(&out);
    let snap = sched.snapshot();
    let iter = sched.stats().clone();
    sched.clear_stats();
    (snap, iter)
}

fn run_to_completion(sched: &mut Scheduler) -> Vec<(SchedulerStats, IterationStats)> {
    let mut steps = Vec::new();
    while sched.has_work() {
        steps.push(step(sched));
        assert!(steps.len() < 1000, "the workload does not finish");
    }
    steps
}

#[test]
fn prompt_tokens_split_by_source_and_kv_computed_per_request() {
    let config = EngineConfig {
        block_size: 4,
        ..Default::default()
    };
    let mut sched = Scheduler::new(config, 64, vec![]);
    let prompt: Vec<u32> = (1..=12).collect();
    let (tx, _rx) = channel(0);
    sched.add_request(request("a", prompt.clone(), 2), tx.clone());
    let mut steps = run_to_completion(&mut sched);
    // The same 12 tokens then 4 more: the 3 full blocks come from the cache.
    let mut longer = prompt.clone();
    longer.extend([50, 51, 52, 53]);
    sched.add_request(request("b", longer, 2), tx);
    steps.extend(run_to_completion(&mut sched));

    let total = |f: fn(&IterationStats) -> u64| steps.iter().map(|(_, i)| f(i)).sum::<u64>();
    let prompt_tokens = total(|i| i.num_prompt_tokens);
    let cached = total(|i| i.num_prompt_tokens_cached);
    assert_eq!(prompt_tokens, 12 + 16);
    assert_eq!(cached, 12, "local_cache_hit");
    assert_eq!(prompt_tokens - cached, 16, "local_compute");
    // Cached tokens are counted in the step that counts the prompt.
    for (_, i) in &steps {
        assert!(i.num_prompt_tokens_cached <= i.num_prompt_tokens, "{i:?}");
    }
    let finished: Vec<_> = steps
        .iter()
        .flat_map(|(_, i)| i.finished_requests.iter())
        .map(|f| f.num_prompt_tokens - f.num_cached_tokens)
        .collect();
    assert_eq!(
        finished,
        vec![12, 4],
        "prefill KV computed tokens per request"
    );
}

#[test]
fn waiting_requests_are_deferred_only_on_a_step_that_preempted() {
    // 4 blocks of 4 tokens; three 4-token prompts fit at first, then each
    // needs a second block: the youngest is preempted.
    let config = EngineConfig {
        block_size: 4,
        max_num_seqs: 8,
        enable_prefix_caching: false,
        ..Default::default()
    };
    let mut sched = Scheduler::new(config, 4, vec![]);
    let (tx, _rx) = channel(0);
    for i in 0..3 {
        sched.add_request(request(&format!("r{i}"), vec![i + 1; 4], 6), tx.clone());
    }
    let steps = run_to_completion(&mut sched);
    let mut deferred_steps = 0;
    let mut capacity_steps = 0;
    for (snap, _) in &steps {
        assert!(snap.num_waiting_deferred <= snap.num_waiting, "{snap:?}");
        if snap.num_preemptions > 0 {
            assert!(snap.num_waiting > 0);
            assert_eq!(snap.num_waiting_deferred, snap.num_waiting, "{snap:?}");
            deferred_steps += 1;
        } else {
            assert_eq!(snap.num_waiting_deferred, 0, "{snap:?}");
            if snap.num_waiting > 0 {
                capacity_steps += 1;
            }
        }
    }
    assert!(deferred_steps > 0, "the workload preempts");
    assert!(capacity_steps > 0, "and then waits for capacity");
}

#[test]
fn residency_times_lifetime_idle_and_reuse_gap() {
    let mut pool = BlockPool::new(2, true).with_residency_sampling(1.0, 1);
    let h1 = hash_block(None, &[1, 2]);
    let h2 = hash_block(Some(h1), &[3, 4]);
    let mut a = Vec::new();
    assert!(pool.allocate(2, &mut a));
    pool.cache_block(a[0], h1, None, &[1, 2]);
    pool.cache_block(a[1], h2, Some(h1), &[3, 4]);
    std::thread::sleep(Duration::from_millis(30));
    pool.free(&a);
    std::thread::sleep(Duration::from_millis(20));
    // A hit on the first block, 20 ms after its release.
    let mut hit = Vec::new();
    pool.take_cached_prefix(&[h1], &mut hit);
    assert_eq!(hit, vec![a[0]]);
    pool.free(&hit);
    std::thread::sleep(Duration::from_millis(10));
    // New content evicts both.
    let mut fresh = Vec::new();
    assert!(pool.allocate(2, &mut fresh));

    let mut samples = Default::default();
    pool.residency_mut()
        .expect("sampling on")
        .take_samples(&mut samples);
    let inferscope_schema::KvBlockResidency {
        lifetime,
        idle_before_evict,
        reuse_gap,
    } = samples;
    assert_eq!(reuse_gap.len(), 1);
    assert!((0.020..0.5).contains(&reuse_gap[0]), "{reuse_gap:?}");
    assert_eq!(lifetime.len(), 2, "both cached blocks evicted");
    assert_eq!(idle_before_evict.len(), 2);
    for (&l, &i) in lifetime.iter().zip(&idle_before_evict) {
        // Alive ≥ 60 ms in all; idle since the last release (≥ 10 ms).
        assert!((0.060..1.0).contains(&l), "{lifetime:?}");
        assert!(i >= 0.010 && i < l, "{idle_before_evict:?} {lifetime:?}");
    }
    // The hit block was used last: it idled less than the other.
    let idle_of = |b: u32| {
        // Eviction order follows the free list: a[1] (never hit) first.
        if b == a[1] {
            idle_before_evict[0]
        } else {
            idle_before_evict[1]
        }
    };
    assert!(idle_of(a[0]) < idle_of(a[1]), "{idle_before_evict:?}");
}

#[test]
fn residency_samples_the_requested_fraction() {
    let mut pool = BlockPool::new(20_000, true).with_residency_sampling(0.1, 7);
    let mut got = Vec::new();
    assert!(pool.allocate(20_000, &mut got));
    let tracked = pool.residency_mut().expect("on").num_tracked();
    assert!(
        (1_600..2_400).contains(&tracked),
        "{tracked} of 20000 at 10%"
    );
    // An uncached block's reuse is no eviction: nothing is recorded.
    pool.free(&got);
    got.clear();
    assert!(pool.allocate(20_000, &mut got));
    let mut samples = Default::default();
    pool.residency_mut().expect("on").take_samples(&mut samples);
    assert!(samples.is_empty(), "{samples:?}");
}
