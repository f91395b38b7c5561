//! Cost of KV-cache events on the engine thread: one decode step of 256
//! sequences (`schedule` + `update` + `snapshot` + `clear_stats`), without
//! events and with events handed to the real ZeroMQ publisher (bound on
//! 127.0.0.1, no subscriber: encoding and sending happen on its thread; what
//! the step pays is recording the events and one `try_publish`).
//!
//! With 16-token blocks every sequence fills a block every 16 decode steps,
//! and the sequences are staggered so that each step stores about 16 blocks
//! (one `BlockStored` per sequence that filled one). Both variants run in the
//! same process, one after the other, so they share the machine's state; a
//! third variant records the events and hands them to a sink that drops
//! them, which isolates the engine thread's cost from the publisher thread's
//! (which competes for the cores on a small machine).
//!
//! Run: `cargo bench -p inferscope-kv-events --bench publish_step`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use inferscope_engine::output_channel::{OutputReceiver, channel};
use inferscope_engine::scheduler::Scheduler;
use inferscope_engine::{
    EngineConfig, EngineRequest, KvEventBatch, KvEventSink, SamplingParams, StepOutput,
};
use inferscope_kv_events::{KvEventPublisher, KvEventsConfig};

const NUM_SEQS: usize = 256;
const EOS: u32 = 2;
/// Decode steps before the fixture is rebuilt (bounds the context).
const WINDOW: usize = 512;

struct Fixture {
    scheduler: Scheduler,
    receivers: Vec<OutputReceiver>,
    out: StepOutput,
    steps: usize,
    generation: u32,
    events: bool,
    published: u64,
}

fn fill(scheduler: &Scheduler, out: &mut StepOutput) {
    out.sampled.clear();
    out.sampled.extend(scheduler.batch().seqs.iter().map(|s| {
        s.sample
            .then_some(100 + (s.seq_id as u32 + s.num_generated as u32) % 30_000)
    }));
    out.device_time = Duration::ZERO;
}

impl Fixture {
    fn new(events: bool) -> Self {
        let mut f = Self {
            scheduler: Scheduler::new(EngineConfig::default(), 1, vec![EOS]),
            receivers: Vec::new(),
            out: StepOutput::default(),
            steps: 0,
            generation: 0,
            events,
            published: 0,
        };
        f.rebuild();
        f
    }

    fn rebuild(&mut self) {
        let config = EngineConfig {
            max_model_len: 1 << 20,
            ..EngineConfig::default()
        };
        let mut s = Scheduler::new(config, 1 << 17, vec![EOS]);
        if self.events {
            s.enable_kv_events();
        }
        self.generation += 1;
        self.receivers.clear();
        let now = Instant::now();
        for i in 0..NUM_SEQS {
            let (tx, rx) = channel(0);
            // 512 + (i % 16) tokens: block boundaries are staggered.
            let len = 512 + (i % 16) as u32;
            let base = (self.generation << 22) | ((i as u32) << 13);
            s.add_request(
                EngineRequest {
                    request_id: format!("b-{}-{i}", self.generation).into(),
                    prompt_token_ids: (0..len).map(|t| 1000 + base + t).collect(),
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
        let mut out = StepOutput::default();
        while s.num_waiting() > 0
            || s.batch().seqs.iter().any(|q| q.is_prefill)
            || s.batch().seqs.is_empty()
        {
            s.schedule();
            fill(&s, &mut out);
            s.update(&out);
            s.snapshot();
            s.clear_stats();
        }
        let _ = s.take_kv_events();
        self.scheduler = s;
        self.drain();
        self.steps = 0;
    }

    fn drain(&mut self) {
        for rx in &mut self.receivers {
            while rx.try_recv().is_ok() {}
        }
    }

    /// One step as the engine core runs it, events included when on.
    fn step(&mut self, sink: &dyn KvEventSink) {
        let s = &mut self.scheduler;
        s.schedule();
        fill(s, &mut self.out);
        s.update(&self.out);
        black_box(s.snapshot());
        s.clear_stats();
        if self.events {
            let events = s.take_kv_events();
            if !events.is_empty() {
                self.published += 1;
                let ts = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                black_box(sink.try_publish(KvEventBatch {
                    ts,
                    engine: 0,
                    events,
                }));
            }
        }
    }

    fn run(&mut self, iters: u64, sink: &dyn KvEventSink, clock: Clock) -> Duration {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let t = clock.now();
            self.step(sink);
            total += clock.now().saturating_sub(t);
            self.drain();
            self.steps += 1;
            if self.steps >= WINDOW {
                self.rebuild();
            }
        }
        total
    }
}

/// What a step's time is measured on.
#[derive(Clone, Copy)]
enum Clock {
    /// Wall time: what the engine loop waits, other threads' competition for
    /// the cores included.
    Wall,
    /// The calling thread's CPU time: what the step itself executes (the
    /// wake-up of the publisher thread included), steady on a shared machine.
    ThreadCpu,
}

impl Clock {
    fn now(self) -> Duration {
        match self {
            // Any fixed origin works: only differences are used.
            Clock::Wall => {
                static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
                ORIGIN.get_or_init(Instant::now).elapsed()
            }
            Clock::ThreadCpu => {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: `ts` is a valid, writable timespec for the call.
                let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
                assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID");
                Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
            }
        }
    }
}

/// A sink that takes every batch and drops it.
struct Discard;

impl KvEventSink for Discard {
    fn try_publish(&self, batch: KvEventBatch) -> bool {
        black_box(batch);
        true
    }
}

fn bench(c: &mut Criterion) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let config = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:{port}"}}"#
    ))
    .expect("config");
    // A named host connects: nobody listens, so the socket never delivers,
    // but the publisher thread still encodes every batch (the real cost).
    let publisher = KvEventPublisher::start(&config, &[0]).expect("publisher");
    let mut off = Fixture::new(false);
    let mut recorded = Fixture::new(true);
    let mut on = Fixture::new(true);
    for (group, clock) in [
        ("decode_step_256", Clock::Wall),
        ("decode_step_256_thread_cpu", Clock::ThreadCpu),
    ] {
        let mut g = c.benchmark_group(group);
        g.bench_function("kv_events_off", |b| {
            b.iter_custom(|n| off.run(n, &publisher, clock))
        });
        // Events recorded and batched, handed to a sink that drops them: the
        // engine thread's own cost without a publisher thread competing for
        // the cores (on a 2-core machine that competition shows in `on`).
        g.bench_function("kv_events_recorded_dropped", |b| {
            b.iter_custom(|n| recorded.run(n, &Discard, clock))
        });
        g.bench_function("kv_events_on", |b| {
            b.iter_custom(|n| on.run(n, &publisher, clock))
        });
        g.finish();
    }
    assert!(on.published > 0, "the events variant published batches");
}

criterion_group!(benches, bench);
criterion_main!(benches);
