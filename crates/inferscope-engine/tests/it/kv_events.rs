//! KV-cache events from real engine cores (sim executor, small KV caches):
//! the events rebuild each engine's cached block set exactly, every batch
//! names its engine, a reset clears, and a sink that refuses is counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use inferscope_engine::sim::SimTokens;
use inferscope_engine::{
    Coordinator, EngineConfig, EngineRequest, Executor, ExecutorError, KvEvent, KvEventBatch,
    KvEventSink, SamplingParams, SimExecutor, SimProfile,
};
use inferscope_schema::{
    EngineFailure, FinishedRequestStats, IterationStats, SchedulerStats, StatsRecorder,
};
use parking_lot::Mutex;

#[derive(Default)]
struct Collect(Mutex<Vec<KvEventBatch>>);

impl KvEventSink for Collect {
    fn try_publish(&self, batch: KvEventBatch) -> bool {
        self.0.lock().push(batch);
        true
    }
}

struct Refuse;

impl KvEventSink for Refuse {
    fn try_publish(&self, _: KvEventBatch) -> bool {
        false
    }
}

#[derive(Default)]
struct Dropped(AtomicU64);

impl StatsRecorder for Dropped {
    fn record_step(&self, _: usize, _: &SchedulerStats, _: &IterationStats) {}
    fn record_finished(&self, _: usize, _: &[FinishedRequestStats]) {}
    fn record_idle(&self, _: usize, _: &SchedulerStats, _: Duration) {}
    fn record_engine_failure(&self, _: usize, _: EngineFailure) {}
    fn record_kv_events_dropped(&self, _: usize, batches: u64) {
        self.0.fetch_add(batches, Ordering::Relaxed);
    }
}

fn tiny(kv_tokens: usize) -> impl FnMut(usize) -> Result<Box<dyn Executor>, ExecutorError> {
    move |_| {
        let mut p = SimProfile::builtin("tiny").expect("tiny profile");
        p.kv_capacity_tokens = kv_tokens;
        Ok(Box::new(SimExecutor::new(p, SimTokens::default())) as Box<dyn Executor>)
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        block_size: 4,
        max_model_len: 256,
        ..EngineConfig::default()
    }
}

/// Shared prefixes, exact repeats and distinct prompts: more blocks than the
/// caches hold, so blocks are stored, hit, duplicated and evicted.
async fn workload(c: &Coordinator, round: u32) {
    let mut handles = Vec::new();
    for i in 0..24u32 {
        let prompt: Vec<u32> = match i % 3 {
            0 => (0..40).chain(1000 + i * 50..1000 + i * 50 + 9).collect(),
            1 => (0..45).collect(),
            _ => (0..60)
                .map(|t| 10_000 + round * 5000 + i * 100 + t)
                .collect(),
        };
        let req = EngineRequest {
            request_id: format!("r{round}-{i}").into(),
            prompt_token_ids: prompt,
            params: Arc::new(SamplingParams {
                max_tokens: 6,
                ignore_eos: true,
                ..SamplingParams::default()
            }),
            seed_offset: 0,
            arrival: Instant::now(),
            trace_id: None,
            tenant: None,
            tenant_label: 0,
            grammar: None,
        };
        handles.push(c.add_request(req).expect("admitted"));
    }
    for mut h in handles {
        while tokio::time::timeout(Duration::from_secs(20), h.recv())
            .await
            .expect("the request finishes")
            .is_some()
        {}
    }
}

/// Applies batches to per-engine sets as a router would.
fn rebuild(batches: &[KvEventBatch], sets: &mut BTreeMap<usize, BTreeSet<u64>>) -> (u64, u64) {
    let (mut stored, mut removed) = (0, 0);
    for b in batches {
        let set = sets.entry(b.engine).or_default();
        for e in &b.events {
            match e {
                KvEvent::BlockStored {
                    block_hashes,
                    token_ids,
                    block_size,
                    ..
                } => {
                    assert_eq!(*block_size, 4);
                    assert_eq!(token_ids.len(), 4 * block_hashes.len());
                    for h in block_hashes {
                        assert!(set.insert(*h), "stored twice without a removal");
                        stored += 1;
                    }
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    for h in block_hashes {
                        assert!(set.remove(h), "removed a block never stored");
                        removed += 1;
                    }
                }
                KvEvent::AllBlocksCleared => set.clear(),
            }
        }
    }
    (stored, removed)
}

fn engine_sets(c: &Coordinator) -> BTreeMap<usize, BTreeSet<u64>> {
    c.cached_block_hashes(Duration::from_secs(5))
        .into_iter()
        .map(|(e, h)| (e, h.expect("engine answers").into_iter().collect()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_rebuild_every_engines_cached_blocks() {
    let sink = Arc::new(Collect::default());
    let recorder = Arc::new(Dropped::default());
    let c = Coordinator::start_with_kv_events(
        config(),
        2,
        5,
        tiny(256),
        recorder.clone(),
        Some(sink.clone() as Arc<dyn KvEventSink>),
    )
    .expect("engines start");
    workload(&c, 0).await;
    let batches = std::mem::take(&mut *sink.0.lock());
    assert!(batches.iter().all(|b| b.engine == 5 || b.engine == 6));
    assert!(batches.iter().all(|b| !b.events.is_empty() && b.ts > 1e9));
    let mut sets = BTreeMap::new();
    let (stored, removed) = rebuild(&batches, &mut sets);
    assert!(
        stored > 128,
        "more blocks stored ({stored}) than both caches hold"
    );
    assert!(removed > 0, "the workload evicts");
    let truth = engine_sets(&c);
    assert_eq!(truth.keys().copied().collect::<Vec<_>>(), vec![5, 6]);
    for (engine, set) in &truth {
        assert!(!set.is_empty());
        assert_eq!(
            sets.get(engine).cloned().unwrap_or_default(),
            *set,
            "engine {engine}"
        );
    }

    assert!(
        c.reset_prefix_cache(Duration::from_secs(5)),
        "idle engines reset"
    );
    let batches = std::mem::take(&mut *sink.0.lock());
    assert_eq!(batches.len(), 2, "one AllBlocksCleared batch per engine");
    assert!(
        batches
            .iter()
            .all(|b| b.events == vec![KvEvent::AllBlocksCleared])
    );
    rebuild(&batches, &mut sets);
    assert!(engine_sets(&c).values().all(BTreeSet::is_empty));
    assert!(sets.values().all(BTreeSet::is_empty));
    assert_eq!(recorder.0.load(Ordering::Relaxed), 0);
    c.shutdown(Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_sink_costs_a_count_per_batch() {
    let recorder = Arc::new(Dropped::default());
    let c = Coordinator::start_with_kv_events(
        config(),
        1,
        0,
        tiny(256),
        recorder.clone(),
        Some(Arc::new(Refuse) as Arc<dyn KvEventSink>),
    )
    .expect("engine starts");
    workload(&c, 1).await;
    let dropped = recorder.0.load(Ordering::Relaxed);
    assert!(
        dropped > 10,
        "every step with events is a dropped batch: {dropped}"
    );
    c.shutdown(Duration::from_secs(5));
}
