//! The engine cores and the data-parallel coordinator, driven end to end with
//! the simulated accelerator on the fast `tiny` profile.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferscope_engine::sim::{SimFaults, SimTokens};
use inferscope_engine::{
    Coordinator, EngineConfig, EngineError, EngineRequest, Executor, ExecutorError, FinishReason,
    FinishedOutput, RequestHandle, SamplingParams, SimExecutor, SimProfile,
};
use inferscope_schema::{
    EngineFailure, FinishedRequestStats, IterationStats, SchedulerStats, StatsRecorder,
};
use parking_lot::Mutex;

/// Collects what the engines report, per engine.
#[derive(Default)]
struct Recorded {
    steps: BTreeMap<usize, u64>,
    preemptions: u64,
    finished: Vec<(usize, FinishReason)>,
    generation_tokens: u64,
    max_batch: usize,
    last: BTreeMap<usize, SchedulerStats>,
    failures: Vec<(usize, EngineFailure)>,
}

#[derive(Default)]
struct TestRecorder(Mutex<Recorded>);

impl TestRecorder {
    fn finished_with(&self, reason: FinishReason) -> usize {
        self.0
            .lock()
            .finished
            .iter()
            .filter(|f| f.1 == reason)
            .count()
    }
}

impl StatsRecorder for TestRecorder {
    fn record_step(&self, engine: usize, s: &SchedulerStats, it: &IterationStats) {
        let mut r = self.0.lock();
        *r.steps.entry(engine).or_default() += 1;
        r.preemptions += s.num_preemptions;
        r.generation_tokens += it.num_generation_tokens;
        r.max_batch = r.max_batch.max(it.batch_size);
        r.finished.extend(
            it.finished_requests
                .iter()
                .map(|f| (engine, f.finish_reason)),
        );
        r.last.insert(engine, s.clone());
    }
    fn record_finished(&self, engine: usize, finished: &[FinishedRequestStats]) {
        let mut r = self.0.lock();
        r.finished
            .extend(finished.iter().map(|f| (engine, f.finish_reason)));
    }
    fn record_engine_failure(&self, engine: usize, cause: EngineFailure) {
        self.0.lock().failures.push((engine, cause));
    }
    fn record_idle(&self, engine: usize, s: &SchedulerStats, _idle: Duration) {
        self.0.lock().last.insert(engine, s.clone());
    }
}

fn tiny(
    kv_tokens: usize,
    faults: SimFaults,
) -> impl FnMut(usize) -> Result<Box<dyn Executor>, ExecutorError> {
    move |_| {
        let mut p =
            SimProfile::builtin("tiny").ok_or_else(|| ExecutorError::Init("no tiny".into()))?;
        p.kv_capacity_tokens = kv_tokens;
        Ok(Box::new(
            SimExecutor::new(p, SimTokens::default()).with_faults(faults.clone()),
        ))
    }
}

/// Tiny profiles where engine `victim` panics inside `execute` after `steps` steps.
fn tiny_panicking(
    victim: usize,
    steps: u64,
) -> impl FnMut(usize) -> Result<Box<dyn Executor>, ExecutorError> {
    move |engine| {
        let mut p = profile("tiny,die_by_panic=1")?;
        p.kv_capacity_tokens = 65_536;
        let mut sim = SimExecutor::new(p, SimTokens::default());
        if engine == victim {
            sim = sim.with_faults(SimFaults {
                fail_every_n_steps: 0,
                die_after_steps: steps,
            });
        }
        Ok(Box::new(sim))
    }
}

fn request(id: &str, prompt_len: usize, max_tokens: usize) -> EngineRequest {
    EngineRequest {
        request_id: id.into(),
        prompt_token_ids: (0..prompt_len as u32).map(|t| 40 + t % 50).collect(),
        params: Arc::new(SamplingParams {
            max_tokens,
            ignore_eos: true,
            seed: Some(id.len() as u64 * 7919 + prompt_len as u64),
            ..Default::default()
        }),
        seed_offset: 0,
        arrival: Instant::now(),
        trace_id: None,
        tenant: None,
        tenant_label: 0,
        grammar: None,
    }
}

/// Drains a request to its end: (tokens, finish reason, error).
fn drain(
    rt: &tokio::runtime::Runtime,
    mut h: RequestHandle,
) -> (Vec<u32>, FinishReason, Option<String>) {
    rt.block_on(async move {
        let mut tokens = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(20), h.recv()).await {
                Ok(Some(o)) => {
                    tokens.extend(o.token_id);
                    if let Some(f) = o.finished {
                        return (tokens, f.reason, f.error);
                    }
                }
                Ok(None) => panic!("stream ended without a finish event"),
                Err(_) => panic!("request stuck"),
            }
        }
    })
}

/// Polls `done` every 5 ms until it holds, failing with `what` after `timeout`.
fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A sim profile from its spec (`tiny,key=value,…`).
fn profile(spec: &str) -> Result<SimProfile, ExecutorError> {
    spec.parse()
        .map_err(|e| ExecutorError::Init(format!("{e}")))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

#[test]
fn two_cores_spread_load_and_honour_rank_offset() {
    let rt = runtime();
    let rec = Arc::new(TestRecorder::default());
    let c = Coordinator::start(
        EngineConfig::default(),
        2,
        4,
        tiny(65_536, SimFaults::default()),
        rec.clone(),
    )
    .expect("start");
    assert_eq!(c.engine_indices(), vec![4, 5]);
    let handles: Vec<RequestHandle> = (0..40)
        .map(|i| {
            c.add_request(request(&format!("req-{i}"), 20, 8))
                .expect("add")
        })
        .collect();
    let mut per_engine: HashMap<usize, usize> = HashMap::new();
    for h in &handles {
        *per_engine.entry(h.engine).or_default() += 1;
    }
    assert_eq!(
        per_engine.len(),
        2,
        "both engines get requests: {per_engine:?}"
    );
    for (&e, &n) in &per_engine {
        assert!((4..=5).contains(&e));
        assert!(n >= 10, "load is spread: {per_engine:?}");
    }
    for h in handles {
        let (tokens, reason, _) = drain(&rt, h);
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(tokens.len(), 8, "ignore_eos gives exactly max_tokens");
    }
    c.shutdown(Duration::from_secs(5));
    let r = rec.0.lock();
    assert_eq!(r.steps.keys().copied().collect::<Vec<_>>(), vec![4, 5]);
    assert_eq!(r.generation_tokens, 40 * 8);
    assert_eq!(r.finished.len(), 40);
}

/// A step's outputs go out on the engine thread when they are few or the
/// step was quick, else through the output thread: both ways, every
/// request gets the same tokens, in order, then its finish.
#[test]
fn outputs_shipped_inline_and_by_the_output_thread_are_the_same() {
    let rt = runtime();
    let run = |spec: &'static str| {
        let c = Coordinator::start(
            EngineConfig::default(),
            1,
            0,
            move |_| {
                let mut p = profile(spec)?;
                p.kv_capacity_tokens = 65_536;
                Ok(Box::new(SimExecutor::new(p, SimTokens::default())) as Box<dyn Executor>)
            },
            Arc::new(TestRecorder::default()),
        )
        .expect("start");
        // 20 requests in one step: more outputs than go out inline.
        let handles: Vec<(String, RequestHandle)> = (0..20)
            .map(|i| {
                let id = format!("req-{i}");
                let h = c.add_request(request(&id, 20, 12)).expect("add");
                (id, h)
            })
            .collect();
        let tokens: BTreeMap<String, Vec<u32>> = handles
            .into_iter()
            .map(|(id, h)| {
                let (tokens, reason, _) = drain(&rt, h);
                assert_eq!(reason, FinishReason::Length, "{spec} {id}");
                (id, tokens)
            })
            .collect();
        c.shutdown(Duration::from_secs(5));
        tokens
    };
    // A zero-time device: 20 outputs take longer to send than the step.
    let inline = run("tiny,t_fixed_ms=0,t_prefill_us=0,t_weights_ms=0,t_kv_ns=0");
    // 2 ms steps: the output thread sends them.
    let threaded = run("tiny,t_fixed_ms=2");
    assert!(
        inline.values().all(|t| t.len() == 12),
        "every token arrives inline: {inline:?}"
    );
    assert_eq!(inline, threaded);
}

#[test]
fn duplicate_ids_are_refused() {
    let c = Coordinator::start(
        EngineConfig::default(),
        1,
        0,
        tiny(65_536, SimFaults::default()),
        Arc::new(TestRecorder::default()),
    )
    .expect("start");
    let _h = c.add_request(request("same", 10, 1000)).expect("first");
    assert!(matches!(
        c.add_request(request("same", 10, 4)),
        Err(EngineError::DuplicateRequestId(_))
    ));
}

#[test]
fn dropping_a_handle_aborts_and_frees_blocks() {
    let rt = runtime();
    let rec = Arc::new(TestRecorder::default());
    let c = Coordinator::start(
        EngineConfig::default(),
        1,
        0,
        tiny(65_536, SimFaults::default()),
        rec.clone(),
    )
    .expect("start");
    let mut h = c.add_request(request("long", 100, 100_000)).expect("add");
    rt.block_on(async {
        for _ in 0..5 {
            h.recv().await;
        }
    });
    drop(h);
    wait_for("abort never recorded", Duration::from_secs(10), || {
        rec.finished_with(FinishReason::Abort) != 0
    });
    let state = c.engines().next().expect("engine");
    wait_for("blocks not freed", Duration::from_secs(5), || {
        state.num_running() == 0 && state.kv_usage() == 0.0
    });
    let last = rec.0.lock().last.get(&0).cloned().expect("state reported");
    assert_eq!(last.num_running, 0);
    assert_eq!(last.kv_cache_usage, 0.0);
    assert!(!c.abort("long"), "the id is gone once aborted");
    c.shutdown(Duration::from_secs(1));
}

#[test]
fn preemption_by_recompute_is_transparent() {
    let rt = runtime();
    // Room for ~3 of the 6 sequences at full length: forces preemption.
    let config = EngineConfig {
        block_size: 16,
        ..Default::default()
    };
    let rec = Arc::new(TestRecorder::default());
    let c = Coordinator::start(
        config.clone(),
        1,
        0,
        tiny(16 * 30, SimFaults::default()),
        rec.clone(),
    )
    .expect("start");
    let handles: Vec<_> = (0..6)
        .map(|i| {
            c.add_request(request(&format!("p{i}"), 60, 90))
                .expect("add")
        })
        .collect();
    let crowded: Vec<Vec<u32>> = handles.into_iter().map(|h| drain(&rt, h).0).collect();
    c.shutdown(Duration::from_secs(1));
    assert!(rec.0.lock().preemptions > 0, "the workload must preempt");

    // The same requests alone on a roomy engine give the same tokens.
    let alone = Coordinator::start(
        config,
        1,
        0,
        tiny(65_536, SimFaults::default()),
        Arc::new(TestRecorder::default()),
    )
    .expect("start");
    for (i, want) in crowded.iter().enumerate() {
        let h = alone
            .add_request(request(&format!("p{i}"), 60, 90))
            .expect("add");
        let (got, reason, _) = drain(&rt, h);
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(&got, want, "request p{i} differs after preemption");
    }
    alone.shutdown(Duration::from_secs(1));
}

#[test]
fn step_faults_fail_their_requests_and_the_core_keeps_serving() {
    let rt = runtime();
    let rec = Arc::new(TestRecorder::default());
    let faults = SimFaults {
        fail_every_n_steps: 7,
        die_after_steps: 0,
    };
    let c = Coordinator::start(
        EngineConfig::default(),
        1,
        0,
        tiny(65_536, faults),
        rec.clone(),
    )
    .expect("start");
    let mut errors = 0;
    let mut ok = 0;
    for i in 0..12 {
        let h = c.add_request(request(&format!("f{i}"), 8, 3)).expect("add");
        let (_, reason, error) = drain(&rt, h);
        match reason {
            FinishReason::Error => {
                errors += 1;
                assert!(error.is_some_and(|e| e.contains("simulated fault")));
            }
            FinishReason::Length => ok += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert!(errors > 0 && ok > 0, "errors {errors}, ok {ok}");
    assert!(c.is_healthy());
    let state = c.engines().next().expect("engine");
    assert_eq!(state.kv_usage(), 0.0);
    c.shutdown(Duration::from_secs(1));
}

#[test]
fn a_dead_core_is_reported_and_skipped() {
    let rt = runtime();
    let faults = SimFaults {
        fail_every_n_steps: 0,
        die_after_steps: 3,
    };
    let rec = Arc::new(TestRecorder::default());
    let c = Coordinator::start(
        EngineConfig::default(),
        1,
        0,
        tiny(65_536, faults),
        Arc::clone(&rec) as Arc<dyn StatsRecorder>,
    )
    .expect("start");
    let h = c.add_request(request("d", 8, 50)).expect("add");
    let (_, reason, error) = drain(&rt, h);
    assert_eq!(reason, FinishReason::Error);
    assert!(error.is_some_and(|e| e.contains("device lost")));
    assert_eq!(rec.0.lock().failures, [(0, EngineFailure::ExecutorError)]);
    assert!(!c.is_healthy());
    wait_for("a core is still alive", Duration::from_secs(5), || {
        !c.engines().any(|s| s.is_alive())
    });
    assert!(
        matches!(c.add_request(request("e", 8, 5)), Err(EngineError::NoEngine(m)) if m.contains("device lost"))
    );
}

#[test]
fn shutdown_drains_in_flight_requests() {
    let rt = runtime();
    let c = Coordinator::start(
        EngineConfig::default(),
        2,
        0,
        tiny(65_536, SimFaults::default()),
        Arc::new(TestRecorder::default()),
    )
    .expect("start");
    let handles: Vec<_> = (0..10)
        .map(|i| {
            c.add_request(request(&format!("s{i}"), 10, 20))
                .expect("add")
        })
        .collect();
    c.shutdown(Duration::from_secs(10));
    assert!(matches!(
        c.add_request(request("late", 4, 4)),
        Err(EngineError::ShuttingDown)
    ));
    for h in handles {
        let (tokens, reason, _) = drain(&rt, h);
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(tokens.len(), 20);
    }
}

#[test]
fn shutdown_timeout_aborts_the_rest() {
    let rt = runtime();
    let c = Coordinator::start(
        EngineConfig::default(),
        1,
        0,
        tiny(65_536, SimFaults::default()),
        Arc::new(TestRecorder::default()),
    )
    .expect("start");
    let h = c
        .add_request(request("endless", 10, 1_000_000))
        .expect("add");
    c.shutdown(Duration::from_millis(50));
    let (_, reason, error) = drain(&rt, h);
    assert_eq!(reason, FinishReason::Abort);
    assert!(error.is_some_and(|e| e.contains("shutting down")));
}

/// Engine 0 panics inside `execute` under load: its in-flight requests end
/// at once with an error naming the panic (not a hang, not a dropped
/// stream), its blocks are freed, it is reported dead, and every later
/// request goes to engine 1, which serves the whole time.
#[test]
fn a_panicking_core_fails_its_requests_and_is_skipped() {
    let rt = runtime();
    let rec = Arc::new(TestRecorder::default());
    let c = Coordinator::start(
        EngineConfig::default(),
        2,
        0,
        tiny_panicking(0, 5),
        Arc::clone(&rec) as Arc<dyn StatsRecorder>,
    )
    .expect("start");
    let start = Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            c.add_request(request(&format!("p{i}"), 12, 2_000))
                .expect("add")
        })
        .collect();
    let on_engine0 = handles.iter().filter(|h| h.engine == 0).count();
    assert!(on_engine0 > 0 && on_engine0 < 8, "load spread over both");
    let (mut errors, mut ok) = (0, 0);
    for h in handles {
        let engine = h.engine;
        let (tokens, reason, error) = drain(&rt, h);
        if engine == 0 {
            assert_eq!(reason, FinishReason::Error);
            assert!(
                error
                    .as_deref()
                    .is_some_and(|e| e.contains("engine core panicked")
                        && e.contains("simulated device panic")),
                "{error:?}"
            );
            // Ended where the panic struck, not after its 2000 tokens.
            assert!(tokens.len() < 10, "{} tokens", tokens.len());
            errors += 1;
        } else {
            assert_eq!((reason, tokens.len()), (FinishReason::Length, 2_000));
            ok += 1;
        }
    }
    assert_eq!((errors, ok), (on_engine0, 8 - on_engine0));
    assert!(start.elapsed() < Duration::from_secs(15));
    assert!(!c.is_healthy());
    let dead: Vec<_> = c.engines().filter(|s| !s.is_alive()).collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].engine_index, 0);
    assert!(
        dead[0]
            .dead_reason()
            .is_some_and(|r| r.contains("engine core panicked"))
    );
    // Its KV blocks were given back and its gauges show it empty.
    assert_eq!(dead[0].kv_usage(), 0.0);
    assert_eq!(dead[0].num_running() + dead[0].num_waiting(), 0);
    assert_eq!(
        rec.0
            .lock()
            .finished
            .iter()
            .filter(|f| **f == (0, FinishReason::Error))
            .count(),
        on_engine0,
        "each failed request is counted as an error of engine 0"
    );
    assert_eq!(rec.0.lock().failures, [(0, EngineFailure::Panic)]);
    for i in 0..6 {
        let h = c
            .add_request(request(&format!("later{i}"), 8, 5))
            .expect("add");
        assert_eq!(h.engine, 1, "the dead core gets nothing");
        let (tokens, reason, _) = drain(&rt, h);
        assert_eq!((reason, tokens.len()), (FinishReason::Length, 5));
    }
    c.shutdown(Duration::from_secs(5));
}

/// Stop token ids sent many times over, in another order, stop generation
/// exactly as the plain list does: same tokens, same finish, same stop
/// token, with `min_tokens` masking them in the sim for the first tokens.
#[test]
fn duplicate_stop_token_ids_change_nothing() {
    let rt = runtime();
    let c = Coordinator::start(
        EngineConfig::default(),
        1,
        0,
        tiny(65_536, SimFaults::default()),
        Arc::new(TestRecorder::default()),
    )
    .expect("start");
    let plain: Vec<u32> = (32..70).collect();
    let repeated: Vec<u32> = (0..500).flat_map(|_| plain.iter().rev().copied()).collect();
    let mut runs = Vec::new();
    for (i, ids) in [plain, repeated].into_iter().enumerate() {
        for seed in 0..8u64 {
            let mut req = request(&format!("dup{i}-{seed}"), 6, 64);
            req.params = Arc::new(SamplingParams {
                max_tokens: 64,
                min_tokens: 3,
                seed: Some(seed),
                stop_token_ids: ids.clone().into(),
                ..Default::default()
            });
            let h = c.add_request(req).expect("add");
            let mut h = h;
            let (tokens, reason, stop) = rt.block_on(async move {
                let mut tokens = Vec::new();
                while let Some(o) = h.recv().await {
                    tokens.extend(o.token_id);
                    if let Some(f) = o.finished {
                        return (tokens, f.reason, f.stop_token_id);
                    }
                }
                panic!("no finish");
            });
            assert!(tokens.len() >= 3, "min_tokens masks the stop ids");
            runs.push((i, seed, tokens, reason, stop));
        }
    }
    let (a, b) = runs.split_at(8);
    for (x, y) in a.iter().zip(b) {
        assert_eq!((&x.2, x.3, x.4), (&y.2, y.3, y.4), "seed {}", x.1);
    }
    // The list is long enough that most runs stop on it, not on length.
    assert!(
        a.iter()
            .filter(|r| r.3 == FinishReason::Stop && r.4.is_some())
            .count()
            >= 6
    );
    c.shutdown(Duration::from_secs(5));
}

/// Adds up what the engine reports as schedule, execute, postprocess and idle,
/// between the first and the last report, and sleeps in every step report:
/// host work between steps that the phases must still cover.
#[derive(Default)]
struct TimeRecorder(Mutex<TimeAccount>);

#[derive(Default)]
struct TimeAccount {
    first: Option<Instant>,
    last: Option<Instant>,
    accounted: Duration,
}

impl TimeAccount {
    fn report(&mut self, at: Instant, d: Duration) {
        if self.first.is_none() {
            self.first = Some(at);
        } else {
            self.accounted += d;
        }
        self.last = Some(at);
    }
}

impl StatsRecorder for TimeRecorder {
    fn record_step(&self, _: usize, _: &SchedulerStats, it: &IterationStats) {
        let at = Instant::now();
        let d = it.schedule_time + it.execute_time + it.postprocess_time;
        assert!(it.device_time <= it.execute_time, "device busy ⊆ execute");
        self.0.lock().report(at, d);
        std::thread::sleep(Duration::from_millis(2));
    }
    fn record_finished(&self, _: usize, _: &[FinishedRequestStats]) {}
    fn record_engine_failure(&self, _: usize, _: EngineFailure) {}
    fn record_idle(&self, _: usize, _: &SchedulerStats, idle: Duration) {
        // Zero: going idle, not a wake-up; no time passes in the account.
        if !idle.is_zero() {
            self.0.lock().report(Instant::now(), idle);
        }
    }
}

#[test]
fn phases_plus_idle_add_up_to_the_loop_wall_time() {
    let rt = runtime();
    let rec = Arc::new(TimeRecorder::default());
    let c = Coordinator::start(
        EngineConfig::default(),
        1,
        0,
        tiny(65_536, SimFaults::default()),
        rec.clone(),
    )
    .expect("start");
    for round in 0..4 {
        let handles: Vec<RequestHandle> = (0..3)
            .map(|i| {
                c.add_request(request(&format!("r{round}-{i}"), 20, 8))
                    .expect("add")
            })
            .collect();
        for h in handles {
            drain(&rt, h);
        }
        // Idle time between the rounds.
        std::thread::sleep(Duration::from_millis(20));
    }
    c.shutdown(Duration::from_secs(5));
    let a = rec.0.lock();
    let wall = a.last.expect("reports") - a.first.expect("reports");
    // The account runs from boundary to boundary; each report comes a few
    // microseconds after its boundary, so only those offsets differ.
    let diff = wall.abs_diff(a.accounted);
    assert!(diff <= wall / 20, "accounted {:?} of {wall:?}", a.accounted);
}

/// Drains a request to its end and returns its final output.
fn drain_finished(rt: &tokio::runtime::Runtime, mut h: RequestHandle) -> FinishedOutput {
    rt.block_on(async move {
        loop {
            match tokio::time::timeout(Duration::from_secs(20), h.recv()).await {
                Ok(Some(o)) => {
                    if let Some(f) = o.finished {
                        return *f;
                    }
                }
                Ok(None) => panic!("stream ended without a finish event"),
                Err(_) => panic!("request stuck"),
            }
        }
    })
}

#[test]
fn the_timeline_records_each_prefill_chunk() {
    let rt = runtime();
    let config = EngineConfig {
        max_num_batched_tokens: 32,
        ..Default::default()
    };
    let c = Coordinator::start(
        config,
        1,
        0,
        tiny(65_536, SimFaults::default()),
        Arc::new(TestRecorder::default()),
    )
    .expect("start");
    let f = drain_finished(&rt, c.add_request(request("chunky", 100, 5)).expect("add"));
    c.shutdown(Duration::from_secs(1));
    let t = &f.timeline;
    let sizes: Vec<usize> = t.prefill_chunks.iter().map(|p| p.num_tokens).collect();
    assert_eq!(
        sizes,
        [32, 32, 32, 4],
        "a 100-token prompt under a 32-token budget"
    );
    assert!(t.preemptions.is_empty());
    let first = t.prefill_chunks[0];
    let last = t.prefill_chunks[3];
    assert_eq!(Some(first.start), t.first_scheduled);
    assert_eq!(
        Some(last.end),
        t.first_token,
        "the last chunk samples the first token"
    );
    for w in t.prefill_chunks.windows(2) {
        assert!(w[0].start <= w[0].end && w[0].end <= w[1].start, "{w:?}");
    }
}

#[test]
fn the_timeline_records_preemptions_and_recomputed_prefills() {
    let rt = runtime();
    let rec = Arc::new(TestRecorder::default());
    let c = Coordinator::start(
        EngineConfig {
            // Each recompute then prefills everything again, in one step.
            enable_prefix_caching: false,
            ..Default::default()
        },
        1,
        0,
        tiny(16 * 30, SimFaults::default()),
        rec.clone(),
    )
    .expect("start");
    let handles: Vec<_> = (0..6)
        .map(|i| {
            c.add_request(request(&format!("q{i}"), 60, 90))
                .expect("add")
        })
        .collect();
    let done: Vec<FinishedOutput> = handles
        .into_iter()
        .map(|h| drain_finished(&rt, h))
        .collect();
    c.shutdown(Duration::from_secs(1));
    let total = rec.0.lock().preemptions;
    assert!(total > 0, "the workload must preempt");
    let recorded: usize = done.iter().map(|f| f.timeline.preemptions.len()).sum();
    assert_eq!(recorded as u64, total, "one instant per preemption");
    for f in &done {
        let t = &f.timeline;
        let prefilled: usize = t.prefill_chunks.iter().map(|p| p.num_tokens).sum();
        if t.preemptions.is_empty() {
            assert_eq!(prefilled, 60, "one prefill of the prompt");
        } else {
            // Each recompute prefills the prompt plus the tokens generated so far.
            assert!(prefilled > 60, "recompute prefills again: {prefilled}");
            assert_eq!(
                t.prefill_chunks.len(),
                1 + t.preemptions.len(),
                "one prefill per admission"
            );
            for (chunk, p) in t.prefill_chunks[1..].iter().zip(&t.preemptions) {
                assert!(chunk.start >= *p, "each recompute follows its preemption");
            }
        }
    }
}

/// `(request, prefill tokens, decode tokens)` of each sequence of a step.
type StepLog = Vec<(String, u32, u32)>;

/// A sim executor that logs each batch it runs: what a profile's steps are
/// checked against (seq ids name requests `q{seq_id}`, added in order).
struct LoggingExecutor {
    inner: SimExecutor,
    log: Arc<Mutex<Vec<StepLog>>>,
}

impl Executor for LoggingExecutor {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn init_kv_cache(&mut self, block_size: usize) -> Result<usize, ExecutorError> {
        self.inner.init_kv_cache(block_size)
    }
    fn eos_token_ids(&self) -> Vec<u32> {
        self.inner.eos_token_ids()
    }
    fn execute(
        &mut self,
        batch: &inferscope_engine::ScheduledBatch,
        out: &mut inferscope_engine::StepOutput,
    ) -> Result<(), ExecutorError> {
        let step = batch
            .seqs
            .iter()
            .map(|s| {
                let n = s.num_tokens as u32;
                let (p, d) = if s.is_prefill { (n, 0) } else { (0, n) };
                (format!("q{}", s.seq_id), p, d)
            })
            .collect();
        self.log.lock().push(step);
        self.inner.execute(batch, out)
    }
}

/// The profile's step slices list exactly the batches the executor ran, in
/// order, and its request timelines are the ones the requests finished with
/// (chunked prefill and preemptions included).
#[test]
fn a_profile_records_every_step_as_the_executor_ran_it() {
    let rt = runtime();
    let log = Arc::new(Mutex::new(Vec::new()));
    let executor_log = Arc::clone(&log);
    let rec = Arc::new(TestRecorder::default());
    let c = Coordinator::start(
        EngineConfig {
            max_num_batched_tokens: 32,
            enable_prefix_caching: false,
            ..Default::default()
        },
        1,
        0,
        move |_| {
            let mut p = SimProfile::builtin("tiny").expect("tiny");
            p.kv_capacity_tokens = 16 * 30;
            Ok(Box::new(LoggingExecutor {
                inner: SimExecutor::new(p, SimTokens::default()),
                log: Arc::clone(&executor_log),
            }) as Box<dyn Executor>)
        },
        rec.clone(),
    )
    .expect("start");
    assert!(
        c.stop_profile(Duration::from_secs(5))[0].1.is_none(),
        "no profile before a start"
    );
    c.start_profile();
    let handles: Vec<_> = (0..6)
        .map(|i| {
            c.add_request(request(&format!("q{i}"), 60, 60))
                .expect("add")
        })
        .collect();
    let done: Vec<FinishedOutput> = handles
        .into_iter()
        .map(|h| drain_finished(&rt, h))
        .collect();
    let mut profiles = c.stop_profile(Duration::from_secs(5));
    c.shutdown(Duration::from_secs(1));
    let (engine, profile) = profiles.pop().expect("one engine");
    let profile = profile.expect("a profile");
    assert_eq!(engine, 0);
    assert!(rec.0.lock().preemptions > 0, "the workload must preempt");

    let ran = log.lock().clone();
    let recorded: Vec<StepLog> = profile
        .steps
        .iter()
        .map(|s| {
            s.batch
                .iter()
                .map(|q| (q.request_id.to_string(), q.prefill_tokens, q.decode_tokens))
                .collect()
        })
        .collect();
    assert_eq!(
        recorded.len(),
        ran.len(),
        "one step slice per executed step"
    );
    for (k, (r, e)) in recorded.iter().zip(&ran).enumerate() {
        assert_eq!(r, e, "step {k}");
    }
    for w in profile.steps.windows(2) {
        assert!(w[0].start + w[0].wall() <= w[1].start, "steps in order");
    }
    assert!(profile.steps.iter().all(|s| s.device_time > Duration::ZERO));
    assert_eq!(profile.dropped_steps, 0);

    assert_eq!(profile.requests.len(), 6, "each request once");
    for (i, f) in done.iter().enumerate() {
        let t = profile
            .requests
            .iter()
            .find(|r| *r.request_id == *format!("q{i}"))
            .expect("traced");
        assert_eq!(t.timeline, f.timeline, "q{i}");
    }
}

/// Two requests routed at the same moment from two threads go to the two
/// cores, round after round: with both cores inside a long step (so neither
/// takes anything off its queue meanwhile) the scores are equal before each
/// round. A coordinator that reads the scores and counts its choice apart
/// lets both threads read the same scores and pick the same core (6 long
/// requests over two engines then split 4/2, as a console test once saw).
#[test]
fn concurrent_routing_keeps_the_cores_even() {
    let c = Coordinator::start(
        EngineConfig::default(),
        2,
        0,
        |_| {
            let p = profile("tiny,t_fixed_ms=1500")?;
            Ok(Box::new(SimExecutor::new(p, SimTokens::default())) as Box<dyn Executor>)
        },
        Arc::new(TestRecorder::default()),
    )
    .expect("start");
    // One long request per core, so both are inside a 1.5 s step.
    let _first: Vec<RequestHandle> = (0..2)
        .map(|i| {
            c.add_request(request(&format!("busy-{i}"), 8, 1000))
                .expect("add")
        })
        .collect();
    wait_for("the cores never started", Duration::from_secs(10), || {
        c.engines().all(|e| e.num_running() == 1)
    });
    // Into the second step, which takes nothing off the queues for 1.5 s.
    std::thread::sleep(Duration::from_millis(50));
    let rounds = 300;
    let barrier = std::sync::Barrier::new(2);
    let started = Instant::now();
    let picks: Vec<Vec<usize>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (c, barrier) = (&c, &barrier);
                s.spawn(move || {
                    (0..rounds)
                        .map(|i| {
                            barrier.wait();
                            let h = c
                                .add_request(request(&format!("r-{t}-{i}"), 8, 1))
                                .expect("add");
                            let engine = h.engine;
                            // Dropping the handle would abort the request;
                            // its routing is what is checked.
                            std::mem::forget(h);
                            engine
                        })
                        .collect()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("thread"))
            .collect()
    });
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "the rounds outlasted the cores' step: the scores may have moved"
    );
    let same: Vec<usize> = (0..rounds)
        .filter(|&i| picks[0][i] == picks[1][i])
        .collect();
    assert!(
        same.is_empty(),
        "rounds whose two requests went to one core: {same:?}"
    );
    c.shutdown(Duration::from_millis(100));
}

/// Stalls the engine thread after the step that finishes a request, as a
/// busy machine may deschedule it there, and says when it stalls.
struct StallAfterFinish {
    stalled: std::sync::mpsc::Sender<()>,
}

impl StatsRecorder for StallAfterFinish {
    fn record_step(&self, _: usize, _: &SchedulerStats, it: &IterationStats) {
        if !it.finished_requests.is_empty() {
            let _ = self.stalled.send(());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    fn record_finished(&self, _: usize, _: &[FinishedRequestStats]) {}
    fn record_engine_failure(&self, _: usize, _: EngineFailure) {}
    fn record_idle(&self, _: usize, _: &SchedulerStats, _: Duration) {}
}

/// A core that ran out of work and takes a request in without waiting (it
/// was still busy after its last step when the request came) starts the
/// request's step when it takes it in, not at the end of its last step: the
/// time between is idle. Else the step seems to start before its request
/// arrived, and the console's `since_us` leaves it out.
#[test]
fn a_step_starts_no_earlier_than_the_request_it_takes_in() {
    let rt = runtime();
    let (stalled, stall) = std::sync::mpsc::channel();
    let c = Coordinator::start(
        EngineConfig::default(),
        1,
        0,
        tiny(65_536, SimFaults::default()),
        Arc::new(StallAfterFinish { stalled }),
    )
    .expect("start");
    let ring = c.engines().next().expect("one core").step_ring();
    ring.set_enabled(true);
    let first = c.add_request(request("first", 8, 1)).expect("add");
    stall
        .recv_timeout(Duration::from_secs(10))
        .expect("the first request's last step");
    // The core is stalled after that step, its work all done.
    let sent = Instant::now();
    let second = c.add_request(request("second", 8, 2)).expect("add");
    drain(&rt, first);
    drain(&rt, second);
    let steps = ring.steps_since(None);
    let takes_in = steps
        .iter()
        .find(|s| s.batch.iter().any(|q| &*q.request_id == "second"))
        .expect("the second request's steps are recorded");
    assert!(
        takes_in.start >= sent,
        "its first step starts {:?} before it was sent",
        sent - takes_in.start
    );
    c.shutdown(Duration::from_secs(5));
}
