//! Cost of the recording hot paths: the per-token path (one ITL sample
//! through a resolved front-end recorder), one `record_step`, and a scrape; and
//! what the native namespace's finer request latency buckets cost a scrape
//! against vLLM's (body size printed, render time measured), 1 and 64 engines;
//! and the console's once-a-second read of every engine's values.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use inferscope_metrics::{Format, MetricsConfig, StatLoggerManager};
use inferscope_schema::schema::{BucketGroup, REQUEST_LATENCY_BUCKETS};
use inferscope_schema::{
    FinishReason, FinishedRequestStats, FrontendRequestStats, FrontendStats, IterationStats,
    SchedulerStats, StatsRecorder,
};

fn manager() -> StatLoggerManager {
    StatLoggerManager::new(MetricsConfig {
        model_name: "bench".into(),
        engine_indices: vec![0, 1],
        max_model_len: 8192,
        ..Default::default()
    })
    .expect("valid config")
}

fn finished() -> FinishedRequestStats {
    FinishedRequestStats {
        request: inferscope_schema::RequestRef::new("bench-req-0", None),
        finish_reason: FinishReason::Stop,
        num_prompt_tokens: 512,
        num_generation_tokens: 128,
        num_cached_tokens: 64,
        max_tokens_param: 256,
        n: 1,
        num_preemptions: 0,
        queue_time: Duration::from_millis(20),
        prefill_time: Duration::from_millis(40),
        decode_time: Duration::from_millis(1500),
        inference_time: Duration::from_millis(1540),
    }
}

fn bench(c: &mut Criterion) {
    let m = manager();
    let engine = m.frontend(1).expect("engine 1");
    let itl = |nanos: u64| FrontendStats::NextToken {
        itl: Duration::from_nanos(nanos),
        count: 1,
    };

    let mut g = c.benchmark_group("per_token");
    g.throughput(Throughput::Elements(1));
    // Nanoseconds, as a front end measures a gap.
    let mut x = 0_u64;
    let next = |x: u64| {
        if x > 2_000_000_000 {
            1_000_000
        } else {
            x * 17 / 10 + 3_000_000
        }
    };
    g.bench_function("observe_itl", |b| {
        b.iter(|| {
            // Vary the value so the bucket search isn't a constant.
            x = next(x);
            engine.record(&itl(black_box(x)));
        })
    });
    // The same observation keeping the request as its bucket's exemplar:
    // A/B against `observe_itl` in one run (names kept from before the
    // recorder, for comparison with earlier runs).
    let request = inferscope_schema::RequestRef::new("bench-req-0-1f", None);
    g.bench_function("observe_itl_with_exemplar", |b| {
        b.iter(|| {
            x = next(x);
            engine.record_for(&itl(black_box(x)), black_box(&request));
        })
    });
    // Resolving the recorder (once per request) and one sample.
    g.bench_function("engine_lookup_and_observe_itl", |b| {
        b.iter(|| {
            if let Some(e) = m.frontend(black_box(1)) {
                e.record(&itl(black_box(21_000_000)));
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("per_request");
    let fe = FrontendStats::Finished(FrontendRequestStats {
        ttft: Some(Duration::from_millis(80)),
        e2e: Duration::from_millis(1600),
        num_generation_tokens: 128,
    });
    g.bench_function("record_frontend", |b| {
        b.iter(|| engine.record(black_box(&fe)))
    });
    g.bench_function("record_frontend_with_exemplars", |b| {
        b.iter(|| engine.record_for(black_box(&fe), black_box(&request)))
    });
    g.finish();

    let sched = SchedulerStats {
        num_running: 64,
        num_waiting: 3,
        kv_cache_usage: 0.42,
        prefix_cache_queries: 512,
        prefix_cache_hits: 64,
        num_preemptions: 0,
        ..Default::default()
    };
    let mut iter = IterationStats {
        num_prompt_tokens: 512,
        num_scheduled_tokens: 576,
        num_generation_tokens: 64,
        num_prompt_tokens_cached: 64,
        batch_size: 65,
        schedule_time: Duration::from_micros(90),
        execute_time: Duration::from_millis(12),
        postprocess_time: Duration::from_micros(150),
        device_time: Duration::from_millis(11),
        finished_requests: Vec::new(),
        ..Default::default()
    };
    let mut g = c.benchmark_group("record_step");
    g.bench_function("no_finished", |b| {
        b.iter(|| m.record_step(black_box(0), black_box(&sched), black_box(&iter)))
    });
    iter.finished_requests = vec![finished(), finished()];
    g.bench_function("two_finished", |b| {
        b.iter(|| m.record_step(black_box(0), black_box(&sched), black_box(&iter)))
    });
    g.finish();

    let mut g = c.benchmark_group("scrape");
    g.bench_function("render_prometheus_2_engines", |b| {
        b.iter(|| black_box(m.render(Format::Prometheus)))
    });
    g.bench_function("render_openmetrics_2_engines", |b| {
        b.iter(|| black_box(m.render(Format::OpenMetrics)))
    });
    // The console's once-a-second sample (server/src/console/history.rs):
    // every engine's gauges, counters and latency bucket counts, read.
    g.bench_function("console_read_engines_2_engines", |b| {
        b.iter(|| black_box(m.read_engines()))
    });
    g.finish();
}

/// A native-namespace manager over `engines` engines with one finished
/// request recorded per engine; `vllm_buckets` sets the request latency
/// group to vLLM's edges (what the native namespace had before).
fn bucket_manager(engines: usize, vllm_buckets: bool) -> StatLoggerManager {
    let mut config = MetricsConfig {
        model_name: "bench".into(),
        engine_indices: (0..engines).collect(),
        max_model_len: 8192,
        ..Default::default()
    };
    if vllm_buckets {
        config
            .buckets
            .set(
                BucketGroup::RequestLatency,
                REQUEST_LATENCY_BUCKETS.to_vec(),
            )
            .expect("valid buckets");
    }
    let m = StatLoggerManager::new(config).expect("valid config");
    let sched = SchedulerStats::default();
    let iter = IterationStats {
        finished_requests: vec![finished()],
        ..Default::default()
    };
    for e in 0..engines {
        m.record_step(e, &sched, &iter);
    }
    m
}

fn buckets(c: &mut Criterion) {
    let mut g = c.benchmark_group("latency_buckets");
    for engines in [1, 64] {
        for (label, vllm) in [("vllm_buckets", true), ("finer_buckets", false)] {
            let m = bucket_manager(engines, vllm);
            let size = m.render(Format::Prometheus).1.len();
            // Criterion measures time only; the size goes to stderr, next to it.
            eprintln!("latency_buckets/{engines}_engines/{label}: /metrics body {size} bytes");
            g.bench_function(format!("{engines}_engines/{label}"), |b| {
                b.iter(|| black_box(m.render(Format::Prometheus)))
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench, buckets
}
criterion_main!(benches);
