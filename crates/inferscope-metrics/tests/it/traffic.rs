//! A metrics manager with known traffic on each engine, for the exposition
//! tests and the `sample_exposition` example.

use std::time::Duration;

use inferscope_metrics::{CacheConfig, MetricsConfig, OptionalMetrics, StatLoggerManager};
use inferscope_schema::{
    FinishReason, FinishedRequestStats, FrontendRequestStats, FrontendStats, IterationStats,
    SchedulerStats, StatsRecorder,
};

/// A configuration of `engines` with every metric of the schema on.
pub fn config(namespace: &str, engines: &[usize]) -> MetricsConfig {
    MetricsConfig {
        namespace: namespace.into(),
        model_name: "demo".into(),
        engine_indices: engines.to_vec(),
        max_model_len: 100,
        cache_configs: vec![CacheConfig {
            block_size: 16,
            num_gpu_blocks: 512,
            enable_prefix_caching: true,
            cache_dtype: "auto".into(),
        }],
        // Every metric of the schema, those behind a flag included.
        optional_metrics: OptionalMetrics {
            kv_cache_metrics: true,
            mfu_metrics: true,
            expert_metrics: true,
        },
        ..Default::default()
    }
}

pub fn finished(reason: FinishReason) -> FinishedRequestStats {
    FinishedRequestStats {
        request: inferscope_schema::RequestRef::new("req-1", None),
        finish_reason: reason,
        num_prompt_tokens: 40,
        num_generation_tokens: 7,
        num_cached_tokens: 16,
        max_tokens_param: 64,
        n: 1,
        num_preemptions: 1,
        queue_time: Duration::from_millis(400),
        prefill_time: Duration::from_millis(50),
        decode_time: Duration::from_millis(900),
        inference_time: Duration::from_millis(950),
    }
}

pub fn step(prompt: u64, generation: u64) -> IterationStats {
    IterationStats {
        num_prompt_tokens: prompt,
        num_scheduled_tokens: prompt + generation,
        num_generation_tokens: generation,
        num_prompt_tokens_cached: 16,
        batch_size: 3,
        schedule_time: Duration::from_micros(80),
        execute_time: Duration::from_millis(6),
        postprocess_time: Duration::from_micros(120),
        device_time: Duration::from_millis(5),
        finished_requests: vec![finished(FinishReason::Stop)],
        // A mixture of three experts: the first and the last chosen.
        expert_tokens: vec![3, 0, 5],
        ..Default::default()
    }
}

pub fn sched(running: usize) -> SchedulerStats {
    SchedulerStats {
        num_running: running,
        num_waiting: 2,
        kv_cache_usage: 0.25,
        prefix_cache_queries: 40,
        prefix_cache_hits: 16,
        num_preemptions: 1,
        ..Default::default()
    }
}

/// A manager with some traffic on every engine, each engine distinguishable.
pub fn busy_manager(namespace: &str, engines: &[usize]) -> StatLoggerManager {
    let m = StatLoggerManager::new(config(namespace, engines)).unwrap();
    for (k, &e) in engines.iter().enumerate() {
        let k = k as u64 + 1;
        for _ in 0..k {
            m.record_step(e, &sched(10 * k as usize), &step(40, 3));
        }
        m.record_idle(e, &sched(0), Duration::from_millis(250));
        m.record_finished(e, &[finished(FinishReason::Abort)]);
        let h = m.frontend(e).unwrap();
        h.record(&FrontendStats::FirstToken {
            ttft: Duration::from_millis(120),
        });
        for _ in 0..6 {
            h.record(&FrontendStats::NextToken {
                count: 1,
                itl: Duration::from_millis(30),
            });
        }
        h.record(&FrontendStats::Finished(FrontendRequestStats {
            ttft: Some(Duration::from_millis(120)),
            e2e: Duration::from_millis(300),
            num_generation_tokens: 7,
        }));
    }
    m.record_admission_rejection("queue_full");
    m
}
