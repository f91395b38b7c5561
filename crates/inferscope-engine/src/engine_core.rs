//! One engine core: an OS thread that runs schedule → execute → postprocess
//! over its own scheduler, KV pool and executor.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inferscope_schema::{EngineFailure, FinishReason, StatsRecorder};

use crate::block_pool::BlockHash;
use crate::config::EngineConfig;
use crate::executor::{Executor, ExecutorError, StepOutput};
use crate::inbox;
use crate::kv_events::{KvEventBatch, KvEventSink};
use crate::request::{EngineRequest, RequestOutput};
use crate::scheduler::{OutputSink, Scheduler};
use crate::step_trace::{EngineProfile, StepRecord, StepRing};
use crate::thread_policy;

/// A message to an engine core.
#[derive(Debug)]
pub(crate) enum CoreMessage {
    /// Queue a request; its outputs go to the sink.
    Add(EngineRequest, OutputSink),
    /// End a request (abort, or stop for a stop string).
    Finish(String, FinishReason),
    /// Stop taking requests; finish the running ones until the deadline,
    /// then abort what is left and exit.
    Shutdown(Instant),
    /// Drop the prefix cache if no request holds blocks; answers whether it did.
    ResetPrefixCache(Sender<bool>),
    /// Answers the hashes of the blocks in the prefix cache.
    CachedBlocks(Sender<Vec<BlockHash>>),
    /// Start recording a profile (a running one starts over).
    StartProfile,
    /// Stop recording; answers what was recorded (`None`: no profile ran).
    StopProfile(Sender<Option<EngineProfile>>),
}

/// State of a core that other threads read without locking.
#[derive(Debug)]
pub struct CoreState {
    /// Global engine index (data-parallel rank).
    pub engine_index: usize,
    /// KV blocks in the pool.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Executor name.
    pub executor_name: String,
    /// The core's counts after its last step or message, one [`Counts`] in
    /// one word, so that a reader never sees a request that moved from one
    /// count to another in neither.
    counts: AtomicU64,
    /// Requests sent to the core that it has not picked up yet.
    pending: AtomicUsize,
    /// The running batch's bound (`max_num_seqs`).
    max_num_seqs: usize,
    kv_usage_bits: AtomicU64,
    alive: AtomicBool,
    dead_reason: parking_lot::Mutex<Option<String>>,
    /// The last steps, while the console watches.
    steps: StepRing,
}

impl CoreState {
    fn new(
        engine_index: usize,
        num_blocks: usize,
        config: &EngineConfig,
        executor_name: String,
    ) -> Self {
        Self {
            engine_index,
            num_blocks,
            block_size: config.block_size,
            executor_name,
            counts: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            max_num_seqs: config.max_num_seqs,
            kv_usage_bits: AtomicU64::new(0f64.to_bits()),
            alive: AtomicBool::new(true),
            dead_reason: parking_lot::Mutex::new(None),
            steps: StepRing::default(),
        }
    }

    /// Requests waiting in the core's queue (sent and not yet scheduled
    /// included).
    pub fn num_waiting(&self) -> usize {
        let (unplaced, c) = self.load();
        c.waiting + unplaced
    }

    /// Requests in the core's running batch.
    pub fn num_running(&self) -> usize {
        self.load().1.running
    }

    /// The requests not placed by a step yet (sent, or picked up since the
    /// core's last step), and the counts. Each request is counted at least
    /// once: the core stores its counts before it lowers `pending`
    /// (Release), and `pending` is read first (Acquire), so a request it
    /// has just picked up is seen in `pending` or in the counts, perhaps
    /// both, never neither.
    fn load(&self) -> (usize, Counts) {
        let pending = self.pending.load(Ordering::Acquire);
        let c = Counts::unpack(self.counts.load(Ordering::Relaxed));
        (pending + c.arrived, c)
    }

    /// Publishes the core's counts (the core's thread).
    fn store_counts(&self, c: Counts) {
        self.counts.store(c.pack(), Ordering::Relaxed);
    }

    /// Notes that the core took in a request sent to it, after
    /// [`CoreState::store_counts`] counted it as arrived (the core's thread).
    fn picked_up(&self) {
        self.pending.fetch_sub(1, Ordering::Release);
    }

    /// KV-cache usage after the last step.
    pub fn kv_usage(&self) -> f64 {
        f64::from_bits(self.kv_usage_bits.load(Ordering::Relaxed))
    }

    /// Whether the core can still serve.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Why the core stopped, if it died.
    pub fn dead_reason(&self) -> Option<String> {
        self.dead_reason.lock().clone()
    }

    /// Routing score, `4 × waiting + running` (vLLM's): a request queued
    /// behind others waits for a whole prefill, so it weighs more. Requests
    /// no step has placed yet (sent, or picked up since the last step) are
    /// counted as the core will place them: running while its batch has
    /// room and nothing waits, else waiting. So a request weighs the same
    /// sent, picked up and scheduled, and a core is not taken for busier
    /// for being slower or quicker to pick up: counting them all as
    /// waiting split a burst of 6 over two cores of 2 slots 4 and 2, for
    /// as long as the requests ran.
    pub fn load_score(&self) -> usize {
        let (unplaced, c) = self.load();
        let starting = if c.waiting == 0 {
            unplaced.min(self.max_num_seqs.saturating_sub(c.running))
        } else {
            0
        };
        4 * (c.waiting + unplaced - starting) + c.running + starting
    }

    /// The core's ring of its last steps (empty unless enabled).
    pub fn step_ring(&self) -> &StepRing {
        &self.steps
    }

    pub(crate) fn note_sent(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
    }
}

/// A core's published counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    /// Requests the last step left waiting.
    waiting: usize,
    /// Requests in the running batch.
    running: usize,
    /// Requests picked up since the last step, not yet scheduled.
    arrived: usize,
}

impl Counts {
    const BITS: u32 = 21;
    const MAX: usize = (1 << Self::BITS) - 1;

    fn pack(self) -> u64 {
        let field = |n: usize| n.min(Self::MAX) as u64;
        (field(self.waiting) << (2 * Self::BITS))
            | (field(self.running) << Self::BITS)
            | field(self.arrived)
    }

    fn unpack(word: u64) -> Self {
        let field = |shift: u32| (word >> shift) as usize & Self::MAX;
        Self {
            waiting: field(2 * Self::BITS),
            running: field(Self::BITS),
            arrived: field(0),
        }
    }
}

/// The coordinator's end of a running engine core.
pub(crate) struct CoreHandle {
    pub(crate) tx: inbox::Sender<CoreMessage>,
    pub(crate) state: Arc<CoreState>,
}

/// A step's outputs up to this many are delivered on the engine thread;
/// more (a large batch of streamed requests, each wake-up a few µs) go to
/// the output thread, so that they overlap the next step instead of delaying
/// it.
const INLINE_OUTPUTS: usize = 8;

/// What waking one request's task costs, roughly: a step shorter than its
/// outputs' delivery would not hide that delivery anyway, so its outputs are
/// delivered inline whatever their number (a hand-over to the output thread
/// is a context switch more on a busy core, and nothing gained).
const DELIVERY_PER_OUTPUT: Duration = Duration::from_micros(1);

/// Starts a core on its own thread. The KV cache is allocated here, so a
/// failure is reported before any request is accepted.
pub(crate) fn spawn_core(
    engine_index: usize,
    config: EngineConfig,
    mut executor: Box<dyn Executor>,
    recorder: Arc<dyn StatsRecorder>,
    kv_events: Option<Arc<dyn KvEventSink>>,
) -> Result<(CoreHandle, JoinHandle<()>), ExecutorError> {
    let num_blocks = executor.init_kv_cache(config.block_size)?;
    if num_blocks == 0 {
        return Err(ExecutorError::Init(
            "the KV cache has room for no block; give it more memory".into(),
        ));
    }
    let state = Arc::new(CoreState::new(
        engine_index,
        num_blocks,
        &config,
        executor.name(),
    ));
    let (tx, rx) = inbox::channel();
    let mut scheduler = Scheduler::new(config, num_blocks, executor.eos_token_ids());
    scheduler.defer_outputs();
    if kv_events.is_some() {
        scheduler.enable_kv_events();
    }
    // Delivering a large batch of outputs wakes one task per request: done
    // on its own thread, it overlaps the next device step instead of
    // delaying it (see `ship_outputs`).
    let (out_tx, out_rx) = inbox::channel::<Vec<(OutputSink, RequestOutput)>>();
    let outputs_in_flight = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::clone(&outputs_in_flight);
    std::thread::Builder::new()
        .name(format!("engine-output-{engine_index}"))
        .spawn(move || {
            for batch in out_rx {
                for (sink, out) in batch {
                    // A closed sink means the client left; the abort follows.
                    let _ = sink.send(out);
                }
                // After the sends: the engine thread may deliver inline again.
                in_flight.fetch_sub(1, Ordering::Release);
            }
        })
        .map_err(|e| ExecutorError::Init(format!("cannot start the output thread: {e}")))?;
    let core = EngineCore {
        state: Arc::clone(&state),
        scheduler,
        executor,
        recorder,
        rx,
        outputs: out_tx,
        outputs_in_flight,
        kv_events,
        shutdown_deadline: None,
        accounted_until: Instant::now(),
        arrived: 0,
        profile: None,
        sleeps_as_batch: false,
    };
    let thread = std::thread::Builder::new()
        .name(format!("engine-core-{engine_index}"))
        .spawn(move || core.run())
        .map_err(|e| ExecutorError::Init(format!("cannot start the engine thread: {e}")))?;
    Ok((CoreHandle { tx, state }, thread))
}

struct EngineCore {
    state: Arc<CoreState>,
    scheduler: Scheduler,
    executor: Box<dyn Executor>,
    recorder: Arc<dyn StatsRecorder>,
    rx: inbox::Receiver<CoreMessage>,
    outputs: inbox::Sender<Vec<(OutputSink, RequestOutput)>>,
    /// Batches handed to the output thread and not yet delivered.
    outputs_in_flight: Arc<AtomicUsize>,
    /// Where each step's KV-cache events go (none: events are off).
    kv_events: Option<Arc<dyn KvEventSink>>,
    shutdown_deadline: Option<Instant>,
    /// Where the loop's accounted time ends: the last step's end or the last
    /// idle period's end. The next step's schedule phase starts here, so that
    /// schedule + execute + postprocess + idle covers the loop's wall time.
    accounted_until: Instant,
    /// Requests picked up since the last step (published apart, see
    /// `CoreState::load_score`).
    arrived: usize,
    /// The profile being recorded, between its start and stop messages.
    profile: Option<EngineProfile>,
    /// Whether this thread sleeps under `SCHED_BATCH` ([`thread_policy`]; set in `run`).
    sleeps_as_batch: bool,
}

impl EngineCore {
    /// The thread's body: the step loop, with a panic anywhere in it (the
    /// executor, the scheduler, a stats recorder) turned into a dead core
    /// whose requests end with an error, instead of a silent thread exit
    /// that leaves requests hanging and the router sending more.
    fn run(mut self) {
        let engine = self.state.engine_index;
        // A property of this thread, so asked on it.
        self.sleeps_as_batch = thread_policy::is_normal();
        // AssertUnwindSafe is sound here: after a panic the step loop never
        // resumes and the executor is never called again. What is touched
        // afterwards is the scheduler, only to end requests and free their
        // blocks, and the channels; that cleanup is itself guarded, in case
        // the panic left the scheduler inconsistent.
        let outcome = catch_unwind(AssertUnwindSafe(|| self.run_loop()));
        if let Err(payload) = outcome {
            let msg = format!("engine core panicked: {}", panic_message(payload.as_ref()));
            tracing::error!(engine, error = %msg, "engine core panicked; failing its requests");
            self.die(&msg, EngineFailure::Panic);
        }
        self.state.alive.store(false, Ordering::Release);
    }

    fn run_loop(&mut self) {
        let engine = self.state.engine_index;
        let mut out = StepOutput::default();
        loop {
            let had_work = self.scheduler.has_work();
            if !self.drain_messages() {
                self.shutdown_deadline.get_or_insert_with(Instant::now);
            }
            if !had_work && self.scheduler.has_work() {
                // Work came in without a wait: the core had none since its
                // last step, so that time is idle, as in `wait_idle`, not
                // the next step's schedule phase; else a thread descheduled
                // after a step gave the next step a start before its
                // requests arrived (and the console's `since_us` left it out).
                self.end_idle();
            }
            if !self.scheduler.has_work() {
                if self.shutdown_deadline.is_some() {
                    // Requests refused during shutdown still get their finish.
                    self.flush_outside_step();
                    break;
                }
                if !self.wait_idle() {
                    break;
                }
                continue;
            }
            if self.shutdown_deadline.is_some_and(|d| Instant::now() >= d) {
                self.scheduler
                    .finish_all(FinishReason::Abort, Some("the server is shutting down"));
                self.flush_outside_step();
                break;
            }

            // The schedule phase also holds the host work between steps:
            // taking in messages, recording the previous step's stats and
            // shipping its outputs.
            let t0 = self.accounted_until;
            self.scheduler.schedule();
            // Profile or console: the batch is copied before the update can
            // remove its requests (the copy counts as schedule time).
            let ring_on = self.state.steps.is_enabled();
            let mut traced_batch = Vec::new();
            if self.profile.is_some() || ring_on {
                self.scheduler.record_batch(&mut traced_batch);
            }
            let t1 = Instant::now();
            if self.scheduler.batch().seqs.is_empty() {
                // Nothing fits this step (e.g. all budget went to nobody):
                // wait briefly for a message instead of spinning.
                match self.rx.recv_timeout(Duration::from_millis(1)) {
                    Ok(m) => self.handle(m),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => {
                        self.shutdown_deadline.get_or_insert_with(Instant::now);
                    }
                }
                continue;
            }
            let result = self.executor.execute(self.scheduler.batch(), &mut out);
            let t2 = Instant::now();
            match result {
                Ok(()) => {
                    if self.scheduler.config().enable_mfu_metrics
                        && let Some(cost) = self.executor.step_cost(self.scheduler.batch())
                    {
                        let stats = self.scheduler.stats_mut();
                        stats.estimated_flops = cost.flops as u64;
                        stats.estimated_read_bytes = cost.read_bytes as u64;
                        stats.estimated_write_bytes = cost.write_bytes as u64;
                    }
                    if self.scheduler.config().enable_expert_metrics {
                        let stats = self.scheduler.stats_mut();
                        self.executor.take_expert_tokens(&mut stats.expert_tokens);
                    }
                    self.scheduler.update(&out)
                }
                Err(ExecutorError::Step(msg)) => {
                    tracing::error!(engine, error = %msg, "engine step failed; failing its requests");
                    out.device_time = Duration::ZERO;
                    self.scheduler.fail_batch(&msg);
                }
                Err(e) => {
                    let msg = e.to_string();
                    tracing::error!(engine, error = %msg, "engine core cannot continue");
                    self.die(&msg, EngineFailure::ExecutorError);
                    return;
                }
            }
            let t3 = Instant::now();
            self.accounted_until = t3;
            let stats = self.scheduler.stats_mut();
            stats.schedule_time = t1 - t0;
            stats.execute_time = t2 - t1;
            stats.postprocess_time = t3 - t2;
            stats.device_time = out.device_time;
            if self.profile.is_some() || ring_on {
                let step = StepRecord {
                    start: t0,
                    schedule: t1 - t0,
                    execute: t2 - t1,
                    postprocess: t3 - t2,
                    device_time: out.device_time,
                    batch: traced_batch,
                };
                match &mut self.profile {
                    Some(p) if ring_on => {
                        self.state.steps.push(step.clone());
                        p.push(step);
                    }
                    Some(p) => p.push(step),
                    None => self.state.steps.push(step),
                }
            }
            let snapshot = self.scheduler.snapshot();
            self.publish(&snapshot);
            self.recorder
                .record_step(engine, &snapshot, self.scheduler.stats());
            self.scheduler.clear_stats();
            self.emit_kv_events();
            // Recorded first, delivered second: a client that has its final
            // output already finds it counted in /metrics.
            self.ship_outputs(t2 - t1);
        }
    }

    /// Marks the core dead with `reason`, ends every request it holds with
    /// an error (freeing their blocks), then fails whatever still arrives
    /// until the coordinator shuts down.
    fn die(&mut self, reason: &str, cause: EngineFailure) {
        // Dead first: from here on /health names it and routing skips it,
        // even if the cleanup below were to fail.
        *self.state.dead_reason.lock() = Some(reason.to_owned());
        self.state.alive.store(false, Ordering::Release);
        let engine = self.state.engine_index;
        let cleanup = catch_unwind(AssertUnwindSafe(|| {
            // Counted before the requests fail, so a client that sees its
            // error already finds the failure in /metrics.
            self.recorder.record_engine_failure(engine, cause);
            self.scheduler.finish_all(FinishReason::Error, Some(reason));
            self.flush_outside_step();
        }));
        if cleanup.is_err() {
            // The scheduler is broken: dropping the core drops every
            // request's sink, so each client sees its stream end at once.
            tracing::error!(engine, "ending the requests of a dead engine core failed");
            return;
        }
        if self.shutdown_deadline.is_some() {
            // The coordinator already asked to stop and is joining us.
            return;
        }
        while let Ok(m) = self.rx.recv() {
            if matches!(m, CoreMessage::Shutdown(_)) {
                return;
            }
            let failed = catch_unwind(AssertUnwindSafe(|| {
                self.handle(m);
                self.scheduler.finish_all(FinishReason::Error, Some(reason));
                self.flush_outside_step();
            }));
            if failed.is_err() {
                return;
            }
        }
    }

    /// Handles every queued message; false when the coordinator is gone.
    fn drain_messages(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(m) => self.handle(m),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// Blocks until a message arrives; false when the coordinator is gone.
    fn wait_idle(&mut self) -> bool {
        self.flush_outside_step();
        // Idle starts where the accounted time ends, so it also holds the
        // flush above (host work of no step, short).
        let msg = if self.sleeps_as_batch {
            thread_policy::set_batch(true);
            let msg = self.rx.recv();
            thread_policy::set_batch(false);
            msg
        } else {
            self.rx.recv()
        };
        self.end_idle();
        match msg {
            Ok(m) => {
                self.handle(m);
                true
            }
            Err(_) => false,
        }
    }

    /// Ends an idle period now: records it from where the accounted time
    /// ended, and the next step's time starts here.
    fn end_idle(&mut self) {
        let now = Instant::now();
        let idle = now.saturating_duration_since(self.accounted_until);
        self.accounted_until = now;
        let snapshot = self.scheduler.snapshot();
        self.recorder
            .record_idle(self.state.engine_index, &snapshot, idle);
    }

    /// Delivers the outputs collected so far: a few (or those of a step that
    /// took `step_time`, shorter than their delivery) here, more through the
    /// output thread.
    fn ship_outputs(&mut self, step_time: Duration) {
        let n = self.scheduler.num_outputs();
        if n == 0 {
            return;
        }
        // Inline only when the output thread has delivered everything handed
        // to it: a request's outputs must arrive in order.
        if (n <= INLINE_OUTPUTS || step_time < DELIVERY_PER_OUTPUT * n as u32)
            && self.outputs_in_flight.load(Ordering::Acquire) == 0
        {
            // Waking this many tasks costs less than waking the output
            // thread and switching to it (on a busy core, that switch was the
            // larger part of a small request's engine-side cost).
            self.scheduler.send_outputs();
        } else {
            let batch = self.scheduler.take_outputs();
            self.outputs_in_flight.fetch_add(1, Ordering::AcqRel);
            // The output thread lives as long as this sender.
            let _ = self.outputs.send(batch);
        }
    }

    /// Reports requests that ended between steps and the resulting state.
    fn flush_outside_step(&mut self) {
        let engine = self.state.engine_index;
        let snapshot = self.scheduler.snapshot();
        self.publish(&snapshot);
        let finished = &self.scheduler.stats().finished_requests;
        if !finished.is_empty() {
            self.recorder.record_finished(engine, finished);
        }
        self.recorder.record_idle(engine, &snapshot, Duration::ZERO);
        self.scheduler.clear_stats();
        self.emit_kv_events();
        // No step to overlap with: all inline.
        self.ship_outputs(Duration::ZERO);
    }

    /// Hands the step's KV-cache events to the sink as one batch; a sink
    /// that cannot take it (full queue) costs a count, never a wait.
    fn emit_kv_events(&mut self) {
        let Some(sink) = &self.kv_events else { return };
        let events = self.scheduler.take_kv_events();
        if events.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let engine = self.state.engine_index;
        if !sink.try_publish(KvEventBatch { ts, engine, events }) {
            self.recorder.record_kv_events_dropped(engine, 1);
        }
    }

    fn handle(&mut self, msg: CoreMessage) {
        let picked_up = matches!(msg, CoreMessage::Add(..));
        if picked_up {
            self.arrived += 1;
        }
        match msg {
            CoreMessage::Add(req, sink) => {
                // A dead core's loop fails new arrivals with its reason.
                if self.shutdown_deadline.is_some() {
                    let id = req.request_id.clone();
                    self.scheduler.add_request(req, sink);
                    self.scheduler.finish_request(&id, FinishReason::Abort);
                } else {
                    self.scheduler.add_request(req, sink);
                }
            }
            CoreMessage::Finish(id, reason) => {
                self.scheduler.finish_request(&id, reason);
            }
            CoreMessage::Shutdown(deadline) => {
                self.shutdown_deadline = Some(deadline);
            }
            CoreMessage::ResetPrefixCache(reply) => {
                let done = self.scheduler.reset_prefix_cache();
                // Published before the answer, so a caller that then reads
                // the events finds the clear already sent.
                self.emit_kv_events();
                let _ = reply.send(done);
            }
            CoreMessage::CachedBlocks(reply) => {
                let _ = reply.send(self.scheduler.pool().cached_hashes());
            }
            CoreMessage::StartProfile => {
                self.profile = Some(EngineProfile::start(self.state.engine_index));
                self.scheduler.trace_requests(true);
            }
            CoreMessage::StopProfile(reply) => {
                let profile = self.profile.take().map(|mut p| {
                    p.stopped = Instant::now();
                    p.requests = self.scheduler.take_traced();
                    p.requests.extend(self.scheduler.in_flight_traces());
                    p
                });
                self.scheduler.trace_requests(false);
                let _ = reply.send(profile);
            }
        }
        // Final outputs of aborts and refusals go out after the next step
        // (or idle flush) has recorded them.
        // The requests picked up since the last step wait in the scheduler's
        // queue until it runs; they are counted apart (see `load_score`).
        self.state.store_counts(Counts {
            waiting: self.scheduler.num_waiting().saturating_sub(self.arrived),
            running: self.scheduler.num_running(),
            arrived: self.arrived,
        });
        if picked_up {
            self.state.picked_up();
        }
    }

    /// Publishes the counts after a step (or outside one, the scheduler
    /// holding no request it has not tried to schedule).
    fn publish(&mut self, snapshot: &inferscope_schema::SchedulerStats) {
        self.arrived = 0;
        self.state.store_counts(Counts {
            waiting: snapshot.num_waiting,
            running: snapshot.num_running,
            arrived: 0,
        });
        self.state
            .kv_usage_bits
            .store(snapshot.kv_cache_usage.to_bits(), Ordering::Relaxed);
    }
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core(max_num_seqs: usize) -> CoreState {
        let config = EngineConfig {
            max_num_seqs,
            ..EngineConfig::default()
        };
        CoreState::new(0, 100, &config, "test".into())
    }

    /// What the core's thread publishes on taking in a sent request: one
    /// more arrived, then one fewer pending (`EngineCore::handle`).
    fn take_in(core: &CoreState) {
        let c = core.load().1;
        core.store_counts(Counts {
            arrived: c.arrived + 1,
            ..c
        });
        core.picked_up();
    }

    /// What it publishes after a step whose scheduler admitted the arrived
    /// requests up to `max_num_seqs`, behind none that waited.
    fn step(core: &CoreState) {
        let c = core.load().1;
        let total = c.waiting + c.running + c.arrived;
        let running = total.min(core.max_num_seqs);
        core.store_counts(Counts {
            waiting: total - running,
            running,
            arrived: 0,
        });
    }

    #[test]
    fn a_request_weighs_the_same_sent_taken_in_and_scheduled() {
        for sent in 0..6 {
            let c = core(2);
            for _ in 0..sent {
                c.note_sent();
            }
            let score = c.load_score();
            for _ in 0..sent {
                take_in(&c);
                assert_eq!(c.load_score(), score, "{sent} sent to 2 slots, taken in");
            }
            step(&c);
            assert_eq!(c.load_score(), score, "{sent} sent to 2 slots, scheduled");
            assert_eq!(c.num_running() + c.num_waiting(), sent);
        }
        // Behind a request the core could not start (the KV cache is full),
        // a sent one waits too, whatever the free slots.
        let c = core(4);
        c.store_counts(Counts {
            waiting: 1,
            running: 1,
            arrived: 0,
        });
        c.note_sent();
        assert_eq!(c.load_score(), 4 * 2 + 1);
    }

    /// Routes 6 requests over two cores of 2 slots as the coordinator does
    /// (ties to the first); `quick` handles each request it gets with
    /// `on_arrival`, the other never picks any up.
    fn burst(on_arrival: fn(&CoreState)) -> (usize, usize) {
        let (quick, slow) = (core(2), core(2));
        for _ in 0..6 {
            if slow.load_score() < quick.load_score() {
                slow.note_sent();
            } else {
                quick.note_sent();
                on_arrival(&quick);
            }
        }
        let total = |c: &CoreState| c.num_running() + c.num_waiting();
        (total(&quick), total(&slow))
    }

    #[test]
    fn a_burst_is_shared_evenly_however_quickly_each_core_takes_it_in() {
        // Taken in and scheduled at once.
        assert_eq!(
            burst(|c| {
                take_in(c);
                step(c);
            }),
            (3, 3)
        );
        // Taken in at once, no step yet (a core between two steps).
        assert_eq!(burst(take_in), (3, 3));
        // Neither core picks up.
        assert_eq!(burst(|_| {}), (3, 3));
    }

    #[test]
    fn counts_round_trip_through_their_word() {
        let c = Counts {
            waiting: 3,
            running: Counts::MAX,
            arrived: 7,
        };
        assert_eq!(Counts::unpack(c.pack()), c);
        let over = Counts {
            waiting: usize::MAX,
            ..c
        };
        assert_eq!(
            Counts::unpack(over.pack()).waiting,
            Counts::MAX,
            "clamped, not wrapped"
        );
    }
}
