//! Cost of one engine step on the host with 256 running decode sequences:
//! what the engine-core loop does around the executor call.
//!
//! - `decode_step/*`: `schedule()` + `update(&out)` (one sampled token per
//!   sequence) + `snapshot()` + `clear_stats()`, with prefix caching on and off;
//! - `schedule/*`: `schedule()` alone;
//! - `update/*`: `update(&out)` + `snapshot()` + `clear_stats()` alone;
//! - `decode_step/long_context`: the full step with 4096-token prompts;
//! - `decode_step/kv_cache_metrics_*`: the full step with KV block residency
//!   sampling on (`--kv-cache-metrics`) at 1% (the default) and 100%, against
//!   `decode_step/prefix_caching_on` in the same run;
//! - `scheduler_tenants/step/{1_tenant,50_tenants}`: the full step with
//!   256 running and 1,000 waiting requests, in steady state (one request
//!   finishes and one is admitted per step), the requests spread over one
//!   tenant or over 50 under fair admission: what per-tenant queues and
//!   counters cost (issue #39: within 20%);
//! - `step_ring/record_256`: what an engine core adds to a step while the
//!   console's step timeline is on: copying the 256-sequence batch into a
//!   step record and pushing it into a full `StepRing` (against
//!   `decode_step/prefix_caching_on`, the step's host cost);
//! - `block_pool_churn/*`: the block pool alone under prefix-cache churn
//!   (allocate and evict, cache, hit, release: every residency hook), with
//!   sampling off, at 1% and at 100%.
//!
//! Steady state: every sequence has a distinct 512-token prompt that is
//! prefilled before any timing, then decodes with `ignore_eos` and no length
//! limit. Two things would otherwise drift as criterion runs millions of
//! steps, and both are handled outside the timed region:
//!
//! - the output receivers, which grow by one message per sequence per step,
//!   are drained with `try_recv` after every step (as the server's per-request
//!   tasks would drain them), so the channels recycle their blocks;
//! - the context grows by one token per step, and the block tables the batch
//!   copies grow with it, so after [`DECODE_WINDOW`] steps the scheduler is
//!   rebuilt and re-prefilled: every timed step has a context between 513 and
//!   1024 tokens (32–64 blocks per sequence).
//!
//! Each step is timed on its own with `iter_custom` (two `Instant::now()`
//! calls, ~tens of ns, against a step of tens of µs) so that draining and
//! rebuilding stay out of the figure.
//!
//! After criterion, a second pass prints the per-step distribution (p50,
//! p90, p99) of the full step, `schedule` and `update` measured on the same
//! steps: on a shared machine the median is the robust figure.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use inferscope_engine::output_channel::{OutputReceiver, channel};
use inferscope_engine::scheduler::Scheduler;
use inferscope_engine::{
    EngineConfig, EngineRequest, SamplingParams, StepOutput, StepRecord, StepRing,
};

/// Running decode sequences (the default `max_num_seqs`).
const NUM_SEQS: usize = 256;
/// Prompt tokens per sequence.
const PROMPT_LEN: usize = 512;
/// Prompt tokens per sequence in the long-context variant.
const LONG_PROMPT_LEN: usize = 4096;
/// Decode steps before the scheduler is rebuilt, bounding the context.
const DECODE_WINDOW: usize = 512;
/// The EOS token id; the sampled tokens never equal it.
const EOS: u32 = 2;

/// A scheduler with [`NUM_SEQS`] prefilled sequences and their receivers.
struct Fixture {
    prefix_caching: bool,
    /// `--kv-cache-metrics-sample`, when residency sampling is on.
    kv_sample: Option<f64>,
    prompt_len: usize,
    scheduler: Scheduler,
    receivers: Vec<OutputReceiver>,
    /// What the executor returns for a full decode batch.
    out: StepOutput,
    /// Decode steps since the last rebuild.
    steps: usize,
    /// Distinguishes the prompts of successive rebuilds, so no rebuild is
    /// ever served from an earlier one's prefix cache (each is a new pool
    /// anyway, but this keeps the prompts honest if that changes).
    generation: u32,
}

impl Fixture {
    fn new(prefix_caching: bool, prompt_len: usize, kv_sample: Option<f64>) -> Self {
        let mut f = Self {
            prefix_caching,
            kv_sample,
            prompt_len,
            scheduler: Scheduler::new(EngineConfig::default(), 1, vec![EOS]),
            receivers: Vec::new(),
            out: StepOutput::default(),
            steps: 0,
            generation: 0,
        };
        f.rebuild();
        f
    }

    /// A fresh scheduler whose sequences have all finished their prefill and
    /// sampled their first token, so the next step is a pure decode step.
    fn rebuild(&mut self) {
        let config = EngineConfig {
            enable_prefix_caching: self.prefix_caching,
            kv_cache_metrics_sample: self.kv_sample,
            // No sequence may stop on length while it is measured.
            max_model_len: 1 << 20,
            ..EngineConfig::default()
        };
        // Room for every sequence at its longest (prompt plus the window)
        // several times over, so nothing is ever preempted.
        let blocks_per_seq = (self.prompt_len + DECODE_WINDOW + 1).div_ceil(config.block_size);
        let num_blocks = (NUM_SEQS * blocks_per_seq * 4).max(1 << 17);
        let mut scheduler = Scheduler::new(config, num_blocks, vec![EOS]);
        let now = Instant::now();
        self.generation += 1;
        self.receivers.clear();
        for i in 0..NUM_SEQS {
            let (tx, rx) = channel(0);
            // Distinct prompts: no prefix is shared between sequences.
            let base = (self.generation << 22) | ((i as u32) << 13);
            let prompt = (0..self.prompt_len as u32)
                .map(|t| 1000 + base + t)
                .collect();
            scheduler.add_request(
                EngineRequest {
                    request_id: format!("bench-{}-{i}", self.generation).into(),
                    prompt_token_ids: prompt,
                    // One allocation per request, as the server makes:
                    // the batch clones each sequence's `Arc` every step, and
                    // a single shared one would serialise those atomic
                    // increments on one cache line.
                    params: Arc::new(SamplingParams {
                        max_tokens: 1 << 19,
                        ignore_eos: true,
                        ..SamplingParams::default()
                    }),
                    seed_offset: 0,
                    arrival: now,
                    trace_id: None,
                    tenant: None,
                    tenant_label: 0,
                    grammar: None,
                },
                tx,
            );
            self.receivers.push(rx);
        }
        // Prefill in chunks under the token budget until every sequence has
        // its first token.
        let mut out = StepOutput::default();
        while scheduler.num_waiting() > 0
            || scheduler.batch().seqs.iter().any(|s| s.is_prefill)
            || scheduler.batch().seqs.is_empty()
        {
            scheduler.schedule();
            fill_output(&scheduler, &mut out);
            scheduler.update(&out);
            scheduler.snapshot();
            scheduler.clear_stats();
        }
        self.scheduler = scheduler;
        self.drain();
        // Check once, outside timing, that the next step is what we mean to
        // measure: all sequences decoding, one token each.
        self.scheduler.schedule();
        let batch = self.scheduler.batch();
        assert_eq!(batch.seqs.len(), NUM_SEQS, "all sequences scheduled");
        assert!(
            batch
                .seqs
                .iter()
                .all(|s| !s.is_prefill && s.num_tokens == 1),
            "pure decode batch"
        );
        fill_output(&self.scheduler, &mut self.out);
        self.scheduler.update(&self.out);
        self.scheduler.snapshot();
        self.scheduler.clear_stats();
        self.drain();
        self.steps = 0;
    }

    /// Empties the output channels (untimed), as the server's tasks would.
    fn drain(&mut self) {
        for rx in &mut self.receivers {
            while rx.try_recv().is_ok() {}
        }
    }

    /// Keeps the context bounded: rebuilds after [`DECODE_WINDOW`] steps.
    fn maybe_rebuild(&mut self) {
        self.steps += 1;
        if self.steps >= DECODE_WINDOW {
            self.rebuild();
        }
    }
}

/// One sampled token per scheduled sequence, as an executor would return.
/// The tokens never equal EOS and depend on the step, so block hashes vary.
fn fill_output(scheduler: &Scheduler, out: &mut StepOutput) {
    let batch = scheduler.batch();
    out.sampled.clear();
    out.sampled.extend(batch.seqs.iter().map(|s| {
        s.sample
            .then_some(100 + (s.seq_id as u32 + s.num_generated as u32) % 30_000)
    }));
    out.device_time = Duration::ZERO;
}

/// Which part of the step is timed.
#[derive(Clone, Copy)]
enum Timed {
    /// schedule + update + snapshot + clear_stats.
    FullStep,
    /// schedule alone.
    Schedule,
    /// update + snapshot + clear_stats.
    Update,
}

/// Runs `iters` decode steps, timing only the `timed` part of each.
fn run_steps(f: &mut Fixture, iters: u64, timed: Timed) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        // Between the two timed parts, untimed, the executor's part: one
        // sampled token per sequence of the batch just built.
        let t0 = Instant::now();
        f.scheduler.schedule();
        let t1 = Instant::now();
        fill_output(&f.scheduler, &mut f.out);
        let t2 = Instant::now();
        f.scheduler.update(black_box(&f.out));
        black_box(f.scheduler.snapshot());
        f.scheduler.clear_stats();
        let t3 = Instant::now();
        total += match timed {
            Timed::FullStep => (t1 - t0) + (t3 - t2),
            Timed::Schedule => t1 - t0,
            Timed::Update => t3 - t2,
        };
        f.drain();
        f.maybe_rebuild();
    }
    total
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group(format!("scheduler_{NUM_SEQS}_decodes"));
    // One element = one sequence's decode: ns/elem is the per-sequence cost.
    g.throughput(Throughput::Elements(NUM_SEQS as u64));
    g.measurement_time(Duration::from_secs(5));

    for (name, caching, prompt_len, timed, kv_sample) in [
        (
            "decode_step/prefix_caching_on",
            true,
            PROMPT_LEN,
            Timed::FullStep,
            None,
        ),
        (
            "decode_step/prefix_caching_off",
            false,
            PROMPT_LEN,
            Timed::FullStep,
            None,
        ),
        (
            "schedule/prefix_caching_on",
            true,
            PROMPT_LEN,
            Timed::Schedule,
            None,
        ),
        (
            "update/prefix_caching_on",
            true,
            PROMPT_LEN,
            Timed::Update,
            None,
        ),
        // Context 4097–4608 tokens: how the per-step block-table copy scales.
        (
            "decode_step/long_context",
            true,
            LONG_PROMPT_LEN,
            Timed::FullStep,
            None,
        ),
        (
            "decode_step/kv_cache_metrics_1pct",
            true,
            PROMPT_LEN,
            Timed::FullStep,
            Some(0.01),
        ),
        (
            "decode_step/kv_cache_metrics_all",
            true,
            PROMPT_LEN,
            Timed::FullStep,
            Some(1.0),
        ),
    ] {
        let mut f = Fixture::new(caching, prompt_len, kv_sample);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| run_steps(&mut f, iters, timed))
        });
    }
    g.finish();
}

/// Requests waiting in the tenant groups.
const TENANT_WAITING: usize = 1000;
/// Generated tokens per request in the tenant groups: with 256 running, one
/// request finishes (and one is admitted) per step on average.
const TENANT_LIFESPAN: usize = NUM_SEQS;
/// Prompt tokens per request in the tenant groups.
const TENANT_PROMPT_LEN: usize = 128;

/// A scheduler in steady state with [`NUM_SEQS`] running and
/// [`TENANT_WAITING`] waiting requests spread round robin over `tenants`
/// tenants (fair admission), topped up between steps.
struct TenantFixture {
    scheduler: Scheduler,
    names: Vec<Arc<str>>,
    receivers: Vec<OutputReceiver>,
    out: StepOutput,
    /// Requests made so far: numbers ids, tenants and prompts.
    made: usize,
}

impl TenantFixture {
    fn new(tenants: usize) -> Self {
        let config = EngineConfig {
            max_model_len: 1 << 20,
            ..EngineConfig::default()
        };
        // Every running request at its longest, twice over: no preemption.
        let per_seq = (TENANT_PROMPT_LEN + TENANT_LIFESPAN).div_ceil(config.block_size);
        let num_blocks = NUM_SEQS * per_seq * 2;
        let mut f = Self {
            scheduler: Scheduler::new(config, num_blocks, vec![EOS]),
            names: (0..tenants).map(|t| format!("tenant-{t}").into()).collect(),
            receivers: Vec::new(),
            out: StepOutput::default(),
            made: 0,
        };
        // The first running set finishes staggered (request i after i + 1
        // tokens), so finishing is spread over steps from the start.
        for i in 0..NUM_SEQS {
            f.add(i + 1);
        }
        f.top_up();
        // Run well past the staggered start into the steady state, untimed.
        for _ in 0..2 * TENANT_LIFESPAN {
            f.step();
            f.drain();
            f.top_up();
        }
        // Checked once, outside timing: the shape meant to be measured.
        assert_eq!(f.scheduler.batch().seqs.len(), NUM_SEQS, "a full batch");
        assert_eq!(f.scheduler.num_waiting(), TENANT_WAITING);
        f
    }

    /// Queues one request of the next tenant in turn.
    fn add(&mut self, max_tokens: usize) {
        let n = self.made;
        self.made += 1;
        let tenant = n % self.names.len();
        let (tx, rx) = channel(0);
        // Distinct prompts: nothing is served from the prefix cache.
        let prompt = (0..TENANT_PROMPT_LEN as u32)
            .map(|t| ((n as u32) << 8).wrapping_add(1000 + t))
            .collect();
        self.scheduler.add_request(
            EngineRequest {
                request_id: format!("tenant-bench-{n}").into(),
                prompt_token_ids: prompt,
                params: Arc::new(SamplingParams {
                    max_tokens,
                    ignore_eos: true,
                    ..SamplingParams::default()
                }),
                seed_offset: 0,
                arrival: Instant::now(),
                trace_id: None,
                tenant: Some(Arc::clone(&self.names[tenant])),
                // Label 0 is the fold-over ("other"); each tenant has its own.
                tenant_label: tenant as u32 + 1,
                grammar: None,
            },
            tx,
        );
        self.receivers.push(rx);
    }

    /// Keeps [`TENANT_WAITING`] requests waiting (untimed).
    fn top_up(&mut self) {
        while self.scheduler.num_waiting() < TENANT_WAITING {
            self.add(TENANT_LIFESPAN);
        }
    }

    /// One untimed step (warm-up).
    fn step(&mut self) {
        self.scheduler.schedule();
        fill_output(&self.scheduler, &mut self.out);
        self.scheduler.update(&self.out);
        self.scheduler.snapshot();
        self.scheduler.clear_stats();
    }

    /// Empties the output channels and drops those of finished requests.
    fn drain(&mut self) {
        use inferscope_engine::output_channel::TryRecvError;
        self.receivers.retain_mut(|rx| {
            loop {
                match rx.try_recv() {
                    Ok(_) => {}
                    Err(TryRecvError::Empty) => break true,
                    Err(TryRecvError::Disconnected) => break false,
                }
            }
        });
    }

    /// Runs `iters` steps, timing schedule + update + snapshot + clear_stats
    /// (each step's admission and finishing included), as [`run_steps`].
    fn run(&mut self, iters: u64) -> Duration {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            total += self.timed_step();
            self.drain();
            self.top_up();
        }
        total
    }

    /// One step, timed without the executor's part.
    fn timed_step(&mut self) -> Duration {
        let t0 = Instant::now();
        self.scheduler.schedule();
        let t1 = Instant::now();
        fill_output(&self.scheduler, &mut self.out);
        let t2 = Instant::now();
        self.scheduler.update(black_box(&self.out));
        black_box(self.scheduler.snapshot());
        self.scheduler.clear_stats();
        let t3 = Instant::now();
        (t1 - t0) + (t3 - t2)
    }
}

/// Tenant counts of the tenant groups: one against 50, same shapes.
const TENANT_COUNTS: [usize; 2] = [1, 50];

fn tenant_name(tenants: usize) -> String {
    if tenants == 1 {
        "step/1_tenant".into()
    } else {
        format!("step/{tenants}_tenants")
    }
}

/// The full step with 256 running and 1,000 waiting, one tenant against 50.
fn tenants(c: &mut Criterion) {
    let mut g = c.benchmark_group("scheduler_tenants");
    g.throughput(Throughput::Elements(NUM_SEQS as u64));
    g.measurement_time(Duration::from_secs(5));
    for tenants in TENANT_COUNTS {
        let mut f = TenantFixture::new(tenants);
        g.bench_function(tenant_name(tenants), |b| {
            b.iter_custom(|iters| f.run(iters))
        });
    }
    g.finish();
}

/// The per-step medians of the tenant groups, interleaved (one step of each
/// in turn) so that load from other processes hits both alike, and their
/// ratio: the acceptance figure.
fn print_tenant_medians() {
    let mut fixtures: Vec<TenantFixture> = TENANT_COUNTS
        .iter()
        .map(|&t| TenantFixture::new(t))
        .collect();
    let mut times: Vec<Vec<Duration>> = TENANT_COUNTS
        .iter()
        .map(|_| Vec::with_capacity(DISTRIBUTION_STEPS))
        .collect();
    for _ in 0..DISTRIBUTION_STEPS {
        for (f, t) in fixtures.iter_mut().zip(&mut times) {
            t.push(f.timed_step());
            f.drain();
            f.top_up();
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2].as_secs_f64() * 1e6
    };
    let medians: Vec<f64> = times.iter_mut().map(median).collect();
    println!();
    println!(
        "scheduler_tenants: per-step median over {DISTRIBUTION_STEPS} interleaved steps, \
         {NUM_SEQS} running, {TENANT_WAITING} waiting"
    );
    for (t, m) in TENANT_COUNTS.iter().zip(&medians) {
        println!("  {:<16} {m:>9.1} µs", tenant_name(*t));
    }
    println!("  ratio 50/1       {:>9.3}", medians[1] / medians[0]);
}

/// Blocks per churned prompt.
const CHURN_BLOCKS: usize = 16;
/// Distinct prompts the churn cycles through: more than the pool holds, so
/// allocations evict cached blocks.
const CHURN_PROMPTS: usize = 512;

/// The block pool under prefix-cache churn: each iteration looks a prompt up
/// (hits where its blocks survived), allocates the rest (evicting the oldest
/// cached blocks), caches them, releases all, and drains the residency
/// samples as the scheduler's snapshot does each step.
fn block_pool_churn(c: &mut Criterion) {
    use inferscope_engine::block_pool::{BlockHash, BlockPool, hash_block};
    use inferscope_schema::KvBlockResidency;
    let hashes: Vec<Vec<BlockHash>> = (0..CHURN_PROMPTS as u32)
        .map(|p| {
            let mut parent = None;
            (0..CHURN_BLOCKS as u32)
                .map(|b| {
                    let h = hash_block(parent, &[p, b]);
                    parent = Some(h);
                    h
                })
                .collect()
        })
        .collect();
    let mut g = c.benchmark_group("block_pool_churn");
    g.throughput(Throughput::Elements(CHURN_BLOCKS as u64));
    g.measurement_time(Duration::from_secs(5));
    for (name, sample) in [
        ("off", None),
        ("sample_1pct", Some(0.01)),
        ("sample_all", Some(1.0)),
    ] {
        // Room for a quarter of the prompts: about 3 in 4 lookups miss.
        let mut pool = BlockPool::new(CHURN_PROMPTS * CHURN_BLOCKS / 4, true);
        if let Some(f) = sample {
            pool = pool.with_residency_sampling(f, 1);
        }
        let mut blocks = Vec::with_capacity(CHURN_BLOCKS);
        let mut samples = KvBlockResidency::default();
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                // A skewed mix: every other iteration reuses one of 32 hot prompts.
                let p = if i.is_multiple_of(2) {
                    (i / 2) % 32
                } else {
                    i % CHURN_PROMPTS
                };
                i = i.wrapping_add(7);
                let h = &hashes[p];
                blocks.clear();
                pool.take_cached_prefix(h, &mut blocks);
                let hit = blocks.len();
                assert!(pool.allocate(CHURN_BLOCKS - hit, &mut blocks));
                for (k, &blk) in blocks.iter().enumerate().skip(hit) {
                    let parent = k.checked_sub(1).map(|j| h[j]);
                    pool.cache_block(blk, h[k], parent, &[]);
                }
                pool.free(&blocks);
                if let Some(r) = pool.residency_mut() {
                    r.take_samples(&mut samples);
                }
                black_box(&samples);
            })
        });
    }
    g.finish();
}

/// Steps in the per-step distribution pass.
const DISTRIBUTION_STEPS: usize = 20_000;

/// The per-step cost distribution, from one run per configuration, with the
/// schedule and update parts of the same steps side by side. Criterion's
/// figures are means over samples of many steps, which one preemption of the
/// bench thread by another process inflates; the median step is robust to
/// that on a shared machine.
fn print_distributions() {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let q = |v: &mut Vec<Duration>, p: f64| {
        v.sort_unstable();
        v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
    };
    println!();
    println!(
        "per-step distribution over {DISTRIBUTION_STEPS} steps, {NUM_SEQS} decoding sequences \
         (µs; full = schedule + update + snapshot + clear_stats)"
    );
    println!(
        "{:<16} | {:>9} | {:>9} {:>9} {:>9} {:>9} {:>7} | {:>9} {:>9} | {:>9} {:>9}",
        "config",
        "context",
        "full mean",
        "full p50",
        "full p90",
        "full p99",
        ">1 ms",
        "sched p50",
        "sched p90",
        "upd p50",
        "upd p90"
    );
    for (name, caching, prompt_len) in [
        ("caching on", true, PROMPT_LEN),
        ("caching off", false, PROMPT_LEN),
        ("long context", true, LONG_PROMPT_LEN),
    ] {
        let mut f = Fixture::new(caching, prompt_len, None);
        let mut sched = Vec::with_capacity(DISTRIBUTION_STEPS);
        let mut upd = Vec::with_capacity(DISTRIBUTION_STEPS);
        let mut full = Vec::with_capacity(DISTRIBUTION_STEPS);
        for _ in 0..DISTRIBUTION_STEPS {
            let t0 = Instant::now();
            f.scheduler.schedule();
            let t1 = Instant::now();
            fill_output(&f.scheduler, &mut f.out);
            let t2 = Instant::now();
            f.scheduler.update(black_box(&f.out));
            black_box(f.scheduler.snapshot());
            f.scheduler.clear_stats();
            let t3 = Instant::now();
            sched.push(t1 - t0);
            upd.push(t3 - t2);
            full.push((t1 - t0) + (t3 - t2));
            f.drain();
            f.maybe_rebuild();
        }
        // The mean carries the tail: steps during which another process
        // took the CPU. `>1 ms` counts them.
        let mean = full.iter().sum::<Duration>() / DISTRIBUTION_STEPS as u32;
        let slow = full
            .iter()
            .filter(|d| **d > Duration::from_millis(1))
            .count();
        println!(
            "{:<16} | {:>9} | {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7} | {:>9.1} {:>9.1} | {:>9.1} {:>9.1}",
            name,
            format!("{}-{}", prompt_len + 1, prompt_len + DECODE_WINDOW),
            us(mean),
            us(q(&mut full, 0.5)),
            us(q(&mut full, 0.9)),
            us(q(&mut full, 0.99)),
            slow,
            us(q(&mut sched, 0.5)),
            us(q(&mut sched, 0.9)),
            us(q(&mut upd, 0.5)),
            us(q(&mut upd, 0.9)),
        );
    }
    println!();
}

/// The step ring's cost per step: the batch copied into a record and pushed
/// into a full ring (the oldest record dropped), timed alone; the step
/// itself runs untimed around it.
fn step_ring(c: &mut Criterion) {
    let mut g = c.benchmark_group(format!("scheduler_{NUM_SEQS}_decodes"));
    g.throughput(Throughput::Elements(NUM_SEQS as u64));
    g.measurement_time(Duration::from_secs(5));
    let mut f = Fixture::new(true, PROMPT_LEN, None);
    let ring = StepRing::default();
    ring.set_enabled(true);
    g.bench_function("step_ring/record_256", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                f.scheduler.schedule();
                let t0 = Instant::now();
                let mut batch = Vec::new();
                f.scheduler.record_batch(&mut batch);
                ring.push(StepRecord {
                    start: t0,
                    schedule: Duration::ZERO,
                    execute: Duration::ZERO,
                    postprocess: Duration::ZERO,
                    device_time: Duration::ZERO,
                    batch,
                });
                total += t0.elapsed();
                fill_output(&f.scheduler, &mut f.out);
                f.scheduler.update(&f.out);
                black_box(f.scheduler.snapshot());
                f.scheduler.clear_stats();
                f.drain();
                f.maybe_rebuild();
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench, tenants, block_pool_churn, step_ring);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // Only under `cargo bench`, which passes `--bench`: `cargo test
    // --benches` (or `--all-targets`) runs each benchmark once as a smoke
    // test, in a debug build, and `--list` only lists them.
    let args: Vec<String> = std::env::args().collect();
    let measuring = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--list");
    // A filter naming the tenant groups prints only their medians.
    let tenants_only = args
        .iter()
        .skip(1)
        .any(|a| !a.starts_with('-') && a.contains("tenant"));
    if measuring {
        if !tenants_only {
            print_distributions();
        }
        print_tenant_medians();
    }
}
