//! Plain stats structs the engine produces each step and the server produces
//! per request. They carry no Prometheus types: the engine never touches a
//! metric handle, it hands these to a [`StatsRecorder`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Why a request finished; the `finished_reason` label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` reached (or the model's length limit).
    Length,
    /// Aborted: client disconnect, shutdown, or an explicit abort.
    Abort,
    /// The executor failed while running the request.
    Error,
}

impl FinishReason {
    /// Every reason, in label order.
    pub const ALL: [FinishReason; 4] = [Self::Stop, Self::Length, Self::Abort, Self::Error];

    /// The label value, as in vLLM and in the OpenAI `finish_reason` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
        }
    }

    /// Index into [`FinishReason::ALL`], for per-reason handle arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Snapshot of one engine's scheduler after a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerStats {
    /// Requests in the running batch.
    pub num_running: usize,
    /// Requests waiting, preempted ones included.
    pub num_waiting: usize,
    /// Of those, requests held back by the scheduler's no-admission-after-
    /// preemption rule (the `deferred` reason); the rest wait for capacity.
    pub num_waiting_deferred: usize,
    /// Fraction 0..1 of KV blocks referenced by live requests.
    pub kv_cache_usage: f64,
    /// Prompt tokens looked up in the prefix cache since the last snapshot.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found in the cache.
    pub prefix_cache_hits: u64,
    /// Preemptions since the last snapshot.
    pub num_preemptions: u64,
    /// KV block residency samples since the last snapshot (empty unless
    /// `--kv-cache-metrics` is on).
    pub kv_block_residency: KvBlockResidency,
}

/// Seconds samples of the sampled KV blocks' residency, since the last snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvBlockResidency {
    /// Allocation to eviction of the cached content.
    pub lifetime: Vec<f64>,
    /// Last use to eviction.
    pub idle_before_evict: Vec<f64>,
    /// Last use to the next prefix-cache hit.
    pub reuse_gap: Vec<f64>,
}

impl KvBlockResidency {
    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.lifetime.is_empty() && self.idle_before_evict.is_empty() && self.reuse_gap.is_empty()
    }
}

/// Which request an observation belongs to: what an exemplar names.
///
/// Built once per request; cloning it is a reference-count increment, so
/// observations that carry it allocate nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestRef {
    /// The engine request id (the client's `x-request-id` plus a suffix).
    pub request_id: Arc<str>,
    /// W3C trace id when the request is traced.
    pub trace_id: Option<[u8; 16]>,
    /// Its tenant's label slot (see [`TenantLabel`]).
    pub tenant: TenantLabel,
}

/// A tenant's slot among the bounded `tenant` label values, assigned by the
/// metrics side once per request; the engine only carries it, so attributing
/// a token is an index, never a name lookup. Slot 0 is `anonymous`.
pub type TenantLabel = u32;

impl RequestRef {
    /// A reference to request `request_id`, traced under `trace_id` if set,
    /// of the anonymous tenant.
    pub fn new(request_id: &str, trace_id: Option<[u8; 16]>) -> Self {
        Self::shared(Arc::from(request_id), trace_id)
    }

    /// A reference to request `request_id`, an id already shared (made
    /// once for the request by whoever names it; not copied here).
    pub fn shared(request_id: Arc<str>, trace_id: Option<[u8; 16]>) -> Self {
        Self {
            request_id,
            trace_id,
            tenant: 0,
        }
    }

    /// The same reference, attributed to tenant label slot `tenant`.
    pub fn with_tenant(mut self, tenant: TenantLabel) -> Self {
        self.tenant = tenant;
        self
    }

    /// The trace id as 32 lowercase hex digits, when traced.
    pub fn trace_id_hex(&self) -> Option<String> {
        self.trace_id
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// Engine-side figures of one request that finished during a step.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRequestStats {
    /// The request (exemplars name it).
    pub request: RequestRef,
    /// Why it finished.
    pub finish_reason: FinishReason,
    /// Prompt length in tokens.
    pub num_prompt_tokens: usize,
    /// Tokens generated.
    pub num_generation_tokens: usize,
    /// Prompt tokens served from the prefix cache at first scheduling.
    pub num_cached_tokens: usize,
    /// The request's `max_tokens` parameter.
    pub max_tokens_param: usize,
    /// The request's `n` parameter (the server's fan-out). Not observed per
    /// engine request: the front end observes it once per prompt
    /// ([`FrontendStats::ParentFinished`]).
    pub n: usize,
    /// Times the request was preempted.
    pub num_preemptions: u64,
    /// Time spent WAITING before first being scheduled.
    pub queue_time: Duration,
    /// First scheduled to first token.
    pub prefill_time: Duration,
    /// First token to last token.
    pub decode_time: Duration,
    /// First scheduled to finished (time in RUNNING, preemptions included).
    pub inference_time: Duration,
}

/// What one engine step did and where its time went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IterationStats {
    /// Prompt lengths of the requests that got their first token this step
    /// (as vLLM counts `prompt_tokens`: cached tokens included, recompute not
    /// counted twice).
    pub num_prompt_tokens: u64,
    /// Tokens the step actually ran through the model (prefill chunks,
    /// recomputes and decodes): the `iteration_tokens` sample.
    pub num_scheduled_tokens: u64,
    /// Tokens generated this step.
    pub num_generation_tokens: u64,
    /// Of `num_prompt_tokens`, the tokens served from the prefix cache (at
    /// the request's first scheduling); the rest were computed.
    pub num_prompt_tokens_cached: u64,
    /// Estimated model FLOPs of the step (`--enable-mfu-metrics`, else 0).
    pub estimated_flops: u64,
    /// Estimated bytes the step read from device memory.
    pub estimated_read_bytes: u64,
    /// Estimated bytes the step wrote to device memory.
    pub estimated_write_bytes: u64,
    /// Tokens the step routed to each expert of a mixture of experts,
    /// summed over its MoE layers (`--expert-metrics`; reused buffer, empty
    /// when off or for a dense model).
    pub expert_tokens: Vec<u64>,
    /// Sequences in the step's batch.
    pub batch_size: usize,
    /// Building the batch (scheduler).
    pub schedule_time: Duration,
    /// The executor call, wall time on the host.
    pub execute_time: Duration,
    /// Appending tokens, stop checks, freeing, emitting outputs.
    pub postprocess_time: Duration,
    /// Time the device reports as busy for this step.
    pub device_time: Duration,
    /// Wall time spent computing the step's grammar masks (structured
    /// outputs), on the grammar threads while the step ran; `None` when no
    /// sequence of the step was constrained.
    pub grammar_mask_time: Option<Duration>,
    /// Requests that finished during this step (reused buffer: cleared each step).
    pub finished_requests: Vec<FinishedRequestStats>,
    /// The step's prompt, cached and generation tokens by tenant: one entry
    /// per tenant label in the step (reused buffer), summing to the totals.
    pub tenant_tokens: Vec<TenantTokens>,
}

/// One tenant's share of a step's token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantTokens {
    /// The tenant's label slot.
    pub tenant: TenantLabel,
    /// Its part of [`IterationStats::num_prompt_tokens`].
    pub prompt: u64,
    /// Its part of [`IterationStats::num_prompt_tokens_cached`].
    pub prompt_cached: u64,
    /// Its part of [`IterationStats::num_generation_tokens`].
    pub generation: u64,
}

impl IterationStats {
    /// The entry of `tenant` in [`Self::tenant_tokens`], added when absent
    /// (a scan: a step holds few tenants, and the buffer is reused).
    pub fn tenant_entry(&mut self, tenant: TenantLabel) -> &mut TenantTokens {
        let i = match self.tenant_tokens.iter().position(|t| t.tenant == tenant) {
            Some(i) => i,
            None => {
                self.tenant_tokens.push(TenantTokens {
                    tenant,
                    ..TenantTokens::default()
                });
                self.tenant_tokens.len() - 1
            }
        };
        &mut self.tenant_tokens[i]
    }
}

impl IterationStats {
    /// Resets for reuse without freeing the buffer.
    pub fn clear(&mut self) {
        let mut finished = std::mem::take(&mut self.finished_requests);
        finished.clear();
        let mut tenants = std::mem::take(&mut self.tenant_tokens);
        tenants.clear();
        let mut experts = std::mem::take(&mut self.expert_tokens);
        experts.clear();
        *self = IterationStats {
            finished_requests: finished,
            tenant_tokens: tenants,
            expert_tokens: experts,
            ..Default::default()
        };
    }
}

/// Latencies the serving front end measures where tokens are handed to the
/// client (TTFT, ITL, e2e). Recorded once per finished request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrontendRequestStats {
    /// Arrival to first token handed to the response.
    pub ttft: Option<Duration>,
    /// Arrival to the final output handed to the response.
    pub e2e: Duration,
    /// Output tokens the client received.
    pub num_generation_tokens: usize,
}

/// A finished request as a front end without an engine sees it (the proxy
/// reads the figures from the response's `usage` and the request body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObservedRequest {
    /// Why it finished.
    pub finish_reason: FinishReason,
    /// `usage.prompt_tokens`, if the response had it.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`, if the response had it.
    pub generation_tokens: Option<u64>,
    /// The request's `max_tokens` (or `max_completion_tokens`), if it set one.
    pub max_tokens: Option<u64>,
    /// Arrival to the first chunk with content (streams only).
    pub ttft: Option<Duration>,
    /// Arrival to the end of the response (or to the abort).
    pub e2e: Duration,
}

/// What a serving front end measures, as plain stats: per token where it is
/// handed to the client, and per finished request. `serve` and `proxy` hand
/// these to the metrics manager's front-end recorder, as the engine hands
/// its stats to a [`StatsRecorder`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FrontendStats {
    /// A request's first token was handed to the client `ttft` after its
    /// arrival (the TTFT sample).
    FirstToken {
        /// Arrival to the first token.
        ttft: Duration,
    },
    /// `count` later tokens were each handed to the client `itl` after the
    /// one before them (`count` inter-token latency samples of one value:
    /// tokens handed on together are sent as one, `itl` 0 after the first).
    NextToken {
        /// The previous token to each one.
        itl: Duration,
        /// How many tokens (samples).
        count: u64,
    },
    /// A request finished as the server's front end saw it: e2e and TPOT
    /// (its TTFT was recorded as [`FrontendStats::FirstToken`]).
    Finished(FrontendRequestStats),
    /// A request finished as seen from outside an engine (the proxy): the
    /// success counter, e2e, and the token counters, TPOT and request
    /// histograms for the figures that are known; an unknown figure is not
    /// recorded, so it never shows up as a zero. TTFT and ITL are recorded
    /// as they happen.
    Observed(ObservedRequest),
    /// A request went in flight at a front end without an engine (the
    /// proxy): the running-requests gauge goes up by one.
    Started,
    /// A request counted by [`FrontendStats::Started`] left (finished,
    /// aborted or refused): the running-requests gauge goes down by one.
    Ended,
    /// Generation tokens of a response whose choices' own counts are
    /// unknown (the proxy with `n > 1`): the generation-token counter alone
    /// (its [`FrontendStats::Observed`] choices then carry no token count).
    GenerationTokens(u64),
    /// Every choice of one prompt (vLLM's parent request) ended: its `n`
    /// and the most tokens any of its choices generated, observed once per
    /// prompt as vLLM observes `request_params_n` and
    /// `request_max_num_generation_tokens`.
    ParentFinished {
        /// The request's `n`.
        n: usize,
        /// The most tokens one of its choices generated; `None` when not
        /// known (a proxy that saw only a response's total), not observed.
        max_generation_tokens: Option<usize>,
    },
}

/// Why an engine core stopped serving for good; the `cause` label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineFailure {
    /// A panic in the core's thread (executor, scheduler or recorder).
    Panic,
    /// The executor returned an error it cannot recover from.
    ExecutorError,
}

impl EngineFailure {
    /// Every cause, in label order.
    pub const ALL: [EngineFailure; 2] = [Self::Panic, Self::ExecutorError];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Panic => "panic",
            Self::ExecutorError => "executor_error",
        }
    }

    /// Index into [`EngineFailure::ALL`], for per-cause handle arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Receiver of stats. Implemented by the metrics manager; the engine calls it
/// from its core thread once per step, so implementations must not block.
pub trait StatsRecorder: Send + Sync {
    /// One engine step's figures. `engine` is the global engine index.
    fn record_step(&self, engine: usize, scheduler: &SchedulerStats, iteration: &IterationStats);

    /// Requests that finished outside a step (aborted while the engine had
    /// nothing to run). Steps report theirs in `IterationStats`.
    fn record_finished(&self, engine: usize, finished: &[FinishedRequestStats]);

    /// The engine loop has nothing to run. Called when it goes idle (with
    /// `idle` zero, so the gauges show the empty state) and when it wakes up
    /// (with the time it waited: the `engine_idle_seconds` increment).
    fn record_idle(&self, engine: usize, scheduler: &SchedulerStats, idle: Duration);

    /// The engine core died (it serves no more requests until restarted);
    /// called once, from its thread, before its requests are failed.
    fn record_engine_failure(&self, engine: usize, cause: EngineFailure);

    /// `batches` of the engine's KV-cache events were dropped because the
    /// publisher's queue was full. Most recorders ignore it.
    fn record_kv_events_dropped(&self, engine: usize, batches: u64) {
        let _ = (engine, batches);
    }
}

/// A recorder that drops everything (tests, `--disable-metrics`).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopRecorder;

impl StatsRecorder for NoopRecorder {
    fn record_step(&self, _: usize, _: &SchedulerStats, _: &IterationStats) {}
    fn record_finished(&self, _: usize, _: &[FinishedRequestStats]) {}
    fn record_idle(&self, _: usize, _: &SchedulerStats, _: Duration) {}
    fn record_engine_failure(&self, _: usize, _: EngineFailure) {}
}
