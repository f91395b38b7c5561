//! The data-parallel coordinator: N engine cores in one process, requests
//! routed to the least-loaded core, aborts by request id, graceful shutdown.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::output_channel::{OutputReceiver, TryRecvError};
use inferscope_schema::{FinishReason, StatsRecorder};
use parking_lot::Mutex;

use crate::block_pool::BlockHash;
use crate::config::EngineConfig;
use crate::engine_core::{CoreHandle, CoreMessage, CoreState, spawn_core};
use crate::executor::{Executor, ExecutorError};
use crate::kv_events::KvEventSink;
use crate::request::{EngineRequest, RequestOutput};
use crate::step_trace::EngineProfile;

/// Why the coordinator refused a request or could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An executor could not be created or initialised.
    #[error("engine {engine}: {source}")]
    Executor {
        /// Global index of the engine.
        engine: usize,
        /// The executor's error.
        source: ExecutorError,
    },
    /// A request with this id is already in flight.
    #[error("a request with id `{0}` is already in flight")]
    DuplicateRequestId(String),
    /// The server is shutting down.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// No engine core can serve.
    #[error("no engine core is available: {0}")]
    NoEngine(String),
    /// The configuration is unusable.
    #[error("invalid engine configuration: {0}")]
    Config(String),
}

/// Shared between the coordinator and the request handles.
struct Shared {
    cores: Vec<CoreHandle>,
    /// Request id → index of the core serving it.
    routes: Mutex<HashMap<Arc<str>, usize, foldhash::fast::RandomState>>,
    shutting_down: AtomicBool,
}

impl Shared {
    fn send(&self, core: usize, msg: CoreMessage) {
        // A core that has exited drops messages; its requests are already ended.
        let _ = self.cores[core].tx.send(msg);
    }
}

/// N engine cores behind one front door.
pub struct Coordinator {
    shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    config: EngineConfig,
}

/// One request in flight: its output stream, and an abort on drop.
pub struct RequestHandle {
    /// Global index of the engine serving it.
    pub engine: usize,
    /// The request id.
    pub request_id: Arc<str>,
    /// Token and finish events.
    pub outputs: OutputReceiver,
    core: usize,
    shared: Arc<Shared>,
    finished: bool,
}

impl RequestHandle {
    /// Receives the next output; `None` after the final one.
    pub async fn recv(&mut self) -> Option<RequestOutput> {
        if self.finished {
            return None;
        }
        let out = self.outputs.recv().await;
        self.received(out)
    }

    /// The next output if one is already there: `Some(None)` after the
    /// final one, `None` when it has yet to come (`recv` would wait).
    pub fn recv_ready(&mut self) -> Option<Option<RequestOutput>> {
        if self.finished {
            return Some(None);
        }
        let out = match self.outputs.try_recv() {
            Ok(out) => Some(out),
            Err(TryRecvError::Empty) => return None,
            Err(TryRecvError::Disconnected) => None,
        };
        Some(self.received(out))
    }

    /// `out` as received: the final output, or the stream's end, finishes
    /// the handle.
    fn received(&mut self, out: Option<RequestOutput>) -> Option<RequestOutput> {
        if out.as_ref().is_none_or(|o| o.finished.is_some()) {
            self.mark_finished();
        }
        out
    }

    /// Ends the request early with `reason` (e.g. `Stop` for a stop string).
    pub fn finish(&mut self, reason: FinishReason) {
        if !self.finished {
            self.shared.send(
                self.core,
                CoreMessage::Finish(self.request_id.to_string(), reason),
            );
        }
    }

    fn mark_finished(&mut self) {
        self.finished = true;
        self.shared.routes.lock().remove(&*self.request_id);
    }
}

impl Drop for RequestHandle {
    /// A handle dropped before the request finished (the client went away)
    /// aborts it, so its blocks are freed.
    fn drop(&mut self) {
        if !self.finished {
            self.shared.send(
                self.core,
                CoreMessage::Finish(self.request_id.to_string(), FinishReason::Abort),
            );
            self.shared.routes.lock().remove(&*self.request_id);
        }
    }
}

impl Coordinator {
    /// Starts `data_parallel_size` cores. Engine indices are global ranks:
    /// `data_parallel_rank + i`. `make_executor(global_index)` builds each
    /// core's executor.
    pub fn start<F>(
        config: EngineConfig,
        data_parallel_size: usize,
        data_parallel_rank: usize,
        make_executor: F,
        recorder: Arc<dyn StatsRecorder>,
    ) -> Result<Self, EngineError>
    where
        F: FnMut(usize) -> Result<Box<dyn Executor>, ExecutorError>,
    {
        Self::start_with_kv_events(
            config,
            data_parallel_size,
            data_parallel_rank,
            make_executor,
            recorder,
            None,
        )
    }

    /// [`Coordinator::start`], with every core handing its KV-cache events
    /// to `kv_events` once per step (each batch names its engine).
    pub fn start_with_kv_events<F>(
        config: EngineConfig,
        data_parallel_size: usize,
        data_parallel_rank: usize,
        mut make_executor: F,
        recorder: Arc<dyn StatsRecorder>,
        kv_events: Option<Arc<dyn KvEventSink>>,
    ) -> Result<Self, EngineError>
    where
        F: FnMut(usize) -> Result<Box<dyn Executor>, ExecutorError>,
    {
        validate(&config, data_parallel_size)?;
        let mut cores = Vec::with_capacity(data_parallel_size);
        let mut threads = Vec::with_capacity(data_parallel_size);
        for i in 0..data_parallel_size {
            let engine = data_parallel_rank + i;
            let (core, thread) = make_executor(engine)
                .and_then(|ex| {
                    spawn_core(
                        engine,
                        config.clone(),
                        ex,
                        Arc::clone(&recorder),
                        kv_events.clone(),
                    )
                })
                .map_err(|source| EngineError::Executor { engine, source })?;
            cores.push(core);
            threads.push(thread);
        }
        Ok(Self {
            shared: Arc::new(Shared {
                cores,
                routes: Mutex::new(HashMap::default()),
                shutting_down: AtomicBool::new(false),
            }),
            threads: Mutex::new(threads),
            config,
        })
    }

    /// The configuration every core runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The cores' live state, in engine order.
    pub fn engines(&self) -> impl Iterator<Item = &CoreState> {
        self.shared.cores.iter().map(|c| c.state.as_ref())
    }

    /// Global indices of the engines.
    pub fn engine_indices(&self) -> Vec<usize> {
        self.engines().map(|s| s.engine_index).collect()
    }

    /// Largest sequence (prompt plus output) one engine's KV cache can hold.
    pub fn max_sequence_tokens(&self) -> usize {
        self.engines()
            .map(|s| s.num_blocks * s.block_size)
            .min()
            .unwrap_or(0)
    }

    /// Whether every core can serve.
    pub fn is_healthy(&self) -> bool {
        !self.shared.shutting_down.load(Ordering::Acquire) && self.engines().all(|s| s.is_alive())
    }

    /// Requests waiting over all cores (admission control reads it).
    pub fn num_waiting(&self) -> usize {
        self.engines().map(CoreState::num_waiting).sum()
    }

    /// Routes a request to the least-loaded live core.
    pub fn add_request(&self, req: EngineRequest) -> Result<RequestHandle, EngineError> {
        if self.shared.shutting_down.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        // The core is chosen and counted as sent under the routes' lock:
        // requests routed at once from several threads (the validation
        // workers) each see the ones before them, instead of all reading the
        // same scores and piling onto one core.
        let mut routes = self.shared.routes.lock();
        let core = self
            .shared
            .cores
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state.is_alive())
            .min_by_key(|(_, c)| c.state.load_score())
            .map(|(i, _)| i)
            .ok_or_else(|| {
                let why = self
                    .engines()
                    .filter_map(|s| s.dead_reason())
                    .next()
                    .unwrap_or_else(|| "all engine cores have stopped".into());
                EngineError::NoEngine(why)
            })?;
        // One lookup: the id is refused if taken, else recorded.
        match routes.entry(Arc::clone(&req.request_id)) {
            Entry::Occupied(_) => {
                return Err(EngineError::DuplicateRequestId(req.request_id.to_string()));
            }
            Entry::Vacant(slot) => {
                slot.insert(core);
            }
        }
        let state = &self.shared.cores[core].state;
        state.note_sent();
        drop(routes);
        // Room for a short answer's outputs, all of which may be queued
        // before its task runs; a longer one's queue grows.
        let (tx, rx) = crate::output_channel::channel(req.params.max_tokens.min(16));
        let request_id = Arc::clone(&req.request_id);
        self.shared.send(core, CoreMessage::Add(req, tx));
        Ok(RequestHandle {
            engine: state.engine_index,
            request_id,
            outputs: rx,
            core,
            shared: Arc::clone(&self.shared),
            finished: false,
        })
    }

    /// Aborts a request by id; false when no such request is in flight.
    pub fn abort(&self, request_id: &str) -> bool {
        let core = self.shared.routes.lock().get(request_id).copied();
        match core {
            Some(core) => {
                self.shared.send(
                    core,
                    CoreMessage::Finish(request_id.to_owned(), FinishReason::Abort),
                );
                true
            }
            None => false,
        }
    }

    /// Drops every engine's prefix cache (vLLM's `reset_prefix_cache`);
    /// false when some engine could not, because requests hold blocks, or
    /// did not answer within `timeout`.
    pub fn reset_prefix_cache(&self, timeout: Duration) -> bool {
        let replies: Vec<_> = (0..self.shared.cores.len())
            .map(|i| {
                let (tx, rx) = std::sync::mpsc::channel();
                self.shared.send(i, CoreMessage::ResetPrefixCache(tx));
                rx
            })
            .collect();
        let deadline = Instant::now() + timeout;
        replies.into_iter().fold(true, |ok, rx| {
            let left = deadline.saturating_duration_since(Instant::now());
            rx.recv_timeout(left).unwrap_or(false) && ok
        })
    }

    /// Each engine's cached block hashes, sorted, by global engine index;
    /// `None` for an engine that did not answer within `timeout`. Blocks
    /// the engine thread for a moment: debugging and tests only.
    pub fn cached_block_hashes(&self, timeout: Duration) -> Vec<(usize, Option<Vec<BlockHash>>)> {
        self.ask_every_core(CoreMessage::CachedBlocks, timeout)
            .into_iter()
            .map(|(engine, hashes)| {
                let hashes = hashes.map(|mut h| {
                    h.sort_unstable();
                    h
                });
                (engine, hashes)
            })
            .collect()
    }

    /// Sends every core the message `ask` makes around a reply channel, then
    /// collects each core's reply by global engine index; `None` for a core
    /// that did not answer within `timeout` (all share one deadline).
    fn ask_every_core<T>(
        &self,
        ask: impl Fn(std::sync::mpsc::Sender<T>) -> CoreMessage,
        timeout: Duration,
    ) -> Vec<(usize, Option<T>)> {
        let replies: Vec<_> = self
            .shared
            .cores
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (tx, rx) = std::sync::mpsc::channel();
                self.shared.send(i, ask(tx));
                (c.state.engine_index, rx)
            })
            .collect();
        let deadline = Instant::now() + timeout;
        replies
            .into_iter()
            .map(|(engine, rx)| {
                let left = deadline.saturating_duration_since(Instant::now());
                (engine, rx.recv_timeout(left).ok())
            })
            .collect()
    }

    /// Every engine starts recording a profile: its steps and the timelines
    /// of its requests (a profile already running starts over).
    pub fn start_profile(&self) {
        for i in 0..self.shared.cores.len() {
            self.shared.send(i, CoreMessage::StartProfile);
        }
    }

    /// Every engine stops recording and hands over its profile, by global
    /// engine index; `None` for an engine that recorded none or did not
    /// answer within `timeout`. Blocks until they answer.
    pub fn stop_profile(&self, timeout: Duration) -> Vec<(usize, Option<EngineProfile>)> {
        self.ask_every_core(CoreMessage::StopProfile, timeout)
            .into_iter()
            .map(|(engine, profile)| (engine, profile.flatten()))
            .collect()
    }

    /// Stops taking requests, lets in-flight ones finish for up to
    /// `timeout`, aborts the rest, and joins the cores.
    pub fn shutdown(&self, timeout: Duration) {
        self.shared.shutting_down.store(true, Ordering::Release);
        let deadline = Instant::now() + timeout;
        for i in 0..self.shared.cores.len() {
            self.shared.send(i, CoreMessage::Shutdown(deadline));
        }
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        if !self.shared.shutting_down.load(Ordering::Acquire) {
            self.shutdown(Duration::ZERO);
        }
    }
}

fn validate(config: &EngineConfig, data_parallel_size: usize) -> Result<(), EngineError> {
    let bad = |m: &str| Err(EngineError::Config(m.to_owned()));
    if data_parallel_size == 0 {
        return bad("data_parallel_size must be at least 1");
    }
    if config.block_size == 0 {
        return bad("block_size must be at least 1");
    }
    if config.max_num_seqs == 0 {
        return bad("max_num_seqs must be at least 1");
    }
    if config.max_num_batched_tokens == 0 {
        return bad("max_num_batched_tokens must be at least 1");
    }
    if config.max_model_len == 0 {
        return bad("max_model_len must be at least 1");
    }
    Ok(())
}
