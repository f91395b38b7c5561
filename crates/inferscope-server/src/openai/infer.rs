//! The generate layer, in the manner of TGI's `Infer`: admission, one
//! engine request per choice, and a stream of choice events — text deltas
//! after incremental detokenization and stop strings, and one final event per
//! choice. The request-level latency metrics are taken here, where each delta
//! is handed to the response.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::Stream;
use inferscope_engine::{
    Coordinator, EngineError, EngineRequest, FinishReason, PositionLogprobs, RequestHandle,
    RequestOutput, RequestTimeline,
};
use inferscope_metrics::{FrontendRecorder, StatLoggerManager};
use inferscope_model::{IncrementalDecoder, Tokenizer};
use inferscope_schema::{FrontendRequestStats, FrontendStats, RequestRef};

use crate::admission::{Admission, Reservation};
use crate::error::ApiError;
use crate::features::RequestFeatures;
pub use crate::openai::protocol::{PromptLogprobs, RankedLogprob, TokenLogprob};
use crate::openai::validation::{LogprobsPlan, Plan};
use crate::request_ids::RequestIds;
use crate::request_log::{RequestLog, RequestLogEntry};
use crate::timings::ChoiceTimings;
use inferscope_tenants::{REASON_TENANT_LIMIT, Tenant, TenantChoice};

/// What generation needs of the server: borrowed from its state per request.
pub struct Infer<'a> {
    /// The engine cores.
    pub coordinator: &'a Coordinator,
    /// Admission control.
    pub admission: &'a Admission,
    /// Detokenizes the outputs.
    pub tokenizer: &'a Arc<dyn Tokenizer>,
    /// Where rejections and latencies are recorded.
    pub metrics: &'a Arc<StatLoggerManager>,
    /// Whether request-level latencies are recorded.
    pub record_latency: bool,
    /// Makes each choice's unique engine id.
    pub ids: &'a RequestIds,
    /// Where finished choices are logged, when `--enable-request-log` is on.
    pub request_log: Option<&'a RequestLog>,
}

/// The choices of one admitted request, each with its engine request.
pub struct Generation {
    /// One stream per prompt and choice, in response order.
    pub choices: Vec<ChoiceStream>,
    /// Prompt tokens over all prompts (each counted once, not per choice).
    pub prompt_tokens: usize,
}

impl Infer<'_> {
    /// Admits the request and starts one engine request per prompt and
    /// choice, each with its own engine id made from `request_id` (so two
    /// requests with the same client id never collide). A refusal is the
    /// 429 or 4xx/5xx to answer. `trace_id` is the request's trace when it
    /// is sampled (what exemplars link to); `tenant` who sent it, when an
    /// API key named them.
    pub fn generate(
        &self,
        request_id: &str,
        plan: &Plan,
        arrival: Instant,
        trace_id: Option<[u8; 16]>,
        tenant: Option<Arc<Tenant>>,
    ) -> Result<Generation, ApiError> {
        let n = plan.params.n;
        let total = plan.prompts.len() * n;
        let per_choice: Vec<usize> = plan
            .prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.len(), n))
            .collect();
        // The tenant's own limits first: its 429 names the tenant's limit,
        // not the server's.
        let permit = match tenant.as_ref().map(|t| t.admit(total)).transpose() {
            Ok(p) => p,
            Err(rejection) => {
                self.metrics.record_admission_rejection(REASON_TENANT_LIMIT);
                let name = tenant.as_ref().map_or("", |t| &*t.name);
                return Err(ApiError::tenant_limit(&rejection, name));
            }
        };
        let mut reservations = match self
            .admission
            .admit(&per_choice, self.coordinator.num_waiting())
        {
            Ok(r) => r.into_iter(),
            Err(rejection) => {
                self.metrics.record_admission_rejection(rejection.reason());
                return Err(rejection.to_api_error());
            }
        };
        let mut tenant_choices = match permit {
            Some(p) => {
                p.charge(plan.prompts.iter().map(Vec::len).sum::<usize>());
                p.into_choices().into_iter()
            }
            None => Vec::new().into_iter(),
        };
        let tenant = tenant.map(|t| Arc::clone(&t.name));
        // Once per request: every choice's stats carry the slot, not the name.
        let tenant_label = self.metrics.tenant_labels().slot(tenant.as_deref());
        let stop: Arc<[String]> = plan.stop.clone().into();
        let mut choices = Vec::with_capacity(total);
        for (p, prompt) in plan.prompts.iter().enumerate() {
            let mut parent = None;
            for i in 0..n {
                let index = p * n + i;
                // On an error, the handles already made abort themselves when
                // `choices` is dropped.
                let engine_id: Arc<str> = self.ids.engine_id(request_id).into();
                // Built once per choice: every exemplar and log line shares
                // it, and the engine the id.
                let request =
                    RequestRef::shared(Arc::clone(&engine_id), trace_id).with_tenant(tenant_label);
                let handle = self
                    .coordinator
                    .add_request(EngineRequest {
                        request_id: engine_id,
                        prompt_token_ids: EngineRequest::token_buffer(
                            prompt,
                            plan.params.max_tokens,
                        ),
                        // One `Arc` for every choice: long parameter lists
                        // (stop ids) are neither copied nor re-indexed per choice.
                        params: Arc::clone(&plan.params),
                        seed_offset: i as u64,
                        arrival,
                        trace_id,
                        tenant: tenant.clone(),
                        tenant_label,
                        // Each choice starts its own matcher from it.
                        grammar: plan.grammar.clone(),
                    })
                    .map_err(|e| match e {
                        // Engine ids are unique by construction: this is a bug.
                        EngineError::DuplicateRequestId(id) => {
                            ApiError::internal(format!("engine request id `{id}` is in use"))
                        }
                        other => ApiError::unavailable(other.to_string()),
                    })?;
                // Resolved once per choice, not per token.
                let latency = self
                    .record_latency
                    .then(|| self.metrics.frontend(handle.engine))
                    .flatten();
                // One per prompt, on its first choice's engine (the choices
                // may be spread over several).
                if i == 0 {
                    parent = latency.clone().map(|recorder| {
                        Arc::new(ParentRequest {
                            n,
                            max_generation_tokens_plus_one: AtomicUsize::new(0),
                            recorder,
                        })
                    });
                }
                let decoder = IncrementalDecoder::new(self.tokenizer.clone(), prompt)
                    .with_skip_special_tokens(plan.skip_special_tokens);
                // Its fields are set where it stands: each builder call
                // moved the 600-odd bytes of the stream.
                let mut choice = ChoiceStream::new(
                    index,
                    handle,
                    decoder,
                    stop.clone(),
                    arrival,
                    latency,
                    request,
                );
                choice.request_log = self.request_log.cloned();
                choice.include_stop = plan.include_stop_str_in_output;
                choice.features = plan.features;
                choice.echo = plan.echo.as_ref().map(|echo| echo[p].clone());
                choice.parent = parent.clone();
                if plan.logprobs != LogprobsPlan::default() {
                    choice.set_logprobs(plan.logprobs, self.tokenizer.clone(), prompt[0]);
                }
                choice.reservation = reservations.next();
                choice.tenant = tenant_choices.next();
                choice.tenant_name = tenant.clone();
                choices.push(choice);
            }
        }
        Ok(Generation {
            choices,
            prompt_tokens: plan.prompts.iter().map(Vec::len).sum(),
        })
    }
}

impl Generation {
    /// Every choice's events merged in arrival order; each choice ends with
    /// one final event (`finish` set). Dropping the stream aborts the
    /// engine requests still running.
    pub fn events(self) -> impl Stream<Item = ChoiceDelta> + Send + Unpin {
        futures::stream::select_all(self.choices.into_iter().map(|c| {
            Box::pin(futures::stream::unfold(c, |mut c| async move {
                c.next().await.map(|d| (d, c))
            }))
        }))
    }

    /// Waits for every choice: its index, whole text and finish, in order.
    /// (An `async` block, as [`ChoiceStream::collect`] is.)
    #[allow(clippy::manual_async_fn)] // not an `async fn`: see above
    pub fn collect(mut self) -> impl Future<Output = Vec<CompletedChoice>> {
        async move {
            if self.choices.len() == 1 {
                // The usual `n` of 1: awaited as it is, not boxed into a join.
                let only = self.choices.pop().expect("one choice");
                return vec![only.collect().await];
            }
            futures::future::join_all(self.choices.into_iter().map(ChoiceStream::collect)).await
        }
    }
}

/// The choices of one prompt (vLLM's parent request). When the last of
/// them is dropped, its `n` and the most tokens a choice generated are
/// observed once: `request_params_n` and `request_max_num_generation_tokens`
/// per prompt, as vLLM observes them, not once per choice.
struct ParentRequest {
    n: usize,
    /// The most tokens one finished choice generated, plus one (0: none
    /// finished, e.g. the request was refused after its first choice).
    max_generation_tokens_plus_one: AtomicUsize,
    recorder: FrontendRecorder,
}

impl ParentRequest {
    fn choice_finished(&self, generation_tokens: usize) {
        self.max_generation_tokens_plus_one
            .fetch_max(generation_tokens.saturating_add(1), Ordering::Relaxed);
    }
}

impl Drop for ParentRequest {
    fn drop(&mut self) {
        let plus_one = *self.max_generation_tokens_plus_one.get_mut();
        if plus_one > 0 {
            self.recorder.record(&FrontendStats::ParentFinished {
                n: self.n,
                max_generation_tokens: Some(plus_one - 1),
            });
        }
    }
}

/// A choice run to its end (full, non-streamed responses).
#[derive(Debug, Clone, PartialEq)]
pub struct CompletedChoice {
    /// Choice index in the response.
    pub index: usize,
    /// All its text.
    pub text: String,
    /// The log-probabilities of its tokens (echoed prompt first), when asked.
    pub logprobs: Vec<TokenLogprob>,
    /// vLLM's `prompt_logprobs`, when asked.
    pub prompt_logprobs: Option<PromptLogprobs>,
    /// How it ended.
    pub finish: ChoiceFinish,
}

/// A choice's log-probability state: what to report and the tokenizer that
/// names the tokens.
struct ChoiceLogprobs {
    plan: LogprobsPlan,
    tokenizer: Arc<dyn Tokenizer>,
    /// The prompt's first token (`echo`: reported without a value).
    first_prompt_token: u32,
    /// Tokens whose text has not gone out yet.
    pending: Vec<TokenLogprob>,
    /// vLLM's `prompt_logprobs`, once the engine sent them.
    prompt: Option<PromptLogprobs>,
}

impl ChoiceLogprobs {
    fn text(&self, id: u32) -> String {
        // Special tokens keep their text (EOS is reported as such, as vLLM).
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    /// The token and up to `n` most likely others, in vLLM's order.
    fn ranked(&self, lp: &PositionLogprobs, n: usize) -> Vec<RankedLogprob> {
        let mut top = Vec::with_capacity(n + 1);
        top.push(RankedLogprob {
            token_id: lp.token_id,
            text: self.text(lp.token_id),
            logprob: lp.logprob,
            rank: lp.rank,
        });
        for (i, &(id, logprob)) in lp.top.iter().take(n).enumerate() {
            if id != lp.token_id {
                top.push(RankedLogprob {
                    token_id: id,
                    text: self.text(id),
                    logprob,
                    rank: i as u32 + 1,
                });
            }
        }
        top
    }

    fn token(&self, lp: &PositionLogprobs, n: usize) -> TokenLogprob {
        TokenLogprob {
            token: self.text(lp.token_id),
            logprob: Some(lp.logprob),
            top: self.ranked(lp, n),
        }
    }

    /// Takes what an engine output carries: the prompt's values (on the
    /// first output) and the generated token's, unless `drop_token`.
    fn take(&mut self, out: &mut RequestOutput, drop_token: bool) {
        self.take_prompt(out);
        if let Some(lp) = out.logprobs.take()
            && !drop_token
            && let Some(n) = self.plan.tokens
        {
            let t = self.token(&lp, n);
            self.pending.push(t);
        }
    }

    /// Takes the prompt's values, when `out` (the first output) has them.
    fn take_prompt(&mut self, out: &mut RequestOutput) {
        if let Some(prompt) = out.prompt_logprobs.take() {
            if self.plan.echo {
                let n = self.plan.tokens.unwrap_or(0);
                let first = TokenLogprob {
                    token: self.text(self.first_prompt_token),
                    logprob: None,
                    top: Vec::new(),
                };
                let rest: Vec<TokenLogprob> = prompt.iter().map(|p| self.token(p, n)).collect();
                // The prompt's tokens come before any generated one.
                self.pending
                    .splice(0..0, std::iter::once(first).chain(rest));
            }
            if let Some(n) = self.plan.prompt {
                let mut field = Vec::with_capacity(prompt.len() + 1);
                field.push(None);
                field.extend(prompt.iter().map(|p| Some(self.ranked(p, n))));
                self.prompt = Some(field);
            }
        }
    }
}

/// One piece of a choice's output.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceDelta {
    /// Choice index in the response.
    pub index: usize,
    /// New text (may be empty on the final delta).
    pub text: String,
    /// The log-probabilities of the tokens behind `text`, when asked.
    pub logprobs: Vec<TokenLogprob>,
    /// vLLM's `prompt_logprobs`, on the delta after they arrived, when asked.
    pub prompt_logprobs: Option<PromptLogprobs>,
    /// Set on the final delta (boxed: the per-token delta stays small,
    /// and moving it costs no `memmove`).
    pub finish: Option<Box<ChoiceFinish>>,
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceFinish {
    /// Why.
    pub reason: FinishReason,
    /// The engine's error message, when `reason` is `Error`.
    pub error: Option<String>,
    /// Prompt tokens of this choice's prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// The engine's timeline of the request; `None` when the engine dropped
    /// it without a finish.
    pub timeline: Option<RequestTimeline>,
    /// What the choice's life cost (the response's `metrics`).
    pub timings: ChoiceTimings,
}

/// Turns one engine request's outputs into text deltas.
pub struct ChoiceStream {
    index: usize,
    handle: RequestHandle,
    decoder: IncrementalDecoder,
    stop: Arc<[String]>,
    /// Longest stop string in bytes: text that could start one is held back.
    max_stop_len: usize,
    held: String,
    arrival: Instant,
    first_delta: Option<Instant>,
    last_delta: Option<Instant>,
    /// When the outputs handled since the stream last waited were seen: the
    /// clock is read once for all those already queued (a request's tokens
    /// often arrive together, and a read per token was a tenth of the
    /// frontend's time per token; `docs/results/request-path.md`).
    seen_at: Option<Instant>,
    /// Inter-token latencies of 0 not recorded yet: deltas handled at one
    /// clock read after the first of them, recorded together (one histogram
    /// update instead of one per token) when a later latency is not 0, at the
    /// finish, or when the stream is dropped.
    zero_itls: u64,
    /// Where the choice's latencies are recorded: the serving engine's
    /// recorder, found once per choice.
    latency: Option<FrontendRecorder>,
    /// The choice's engine request: names it in exemplars and in the
    /// request log.
    request: RequestRef,
    /// Where the choice is logged when it ends.
    request_log: Option<RequestLog>,
    /// The prompt tokens counted as queued, released at the first output.
    reservation: Option<Reservation>,
    /// The choice's hold on its tenant's limits (with an API key file).
    tenant: Option<TenantChoice>,
    /// Its tenant's name, for the request log (`None`: anonymous).
    tenant_name: Option<Arc<str>>,
    /// `include_stop_str_in_output`: the stop string or stop token that
    /// ended the choice stays in its text.
    include_stop: bool,
    /// `echo`: text sent before the first generated one.
    echo: Option<String>,
    /// Which optional features its request used (request log).
    features: RequestFeatures,
    /// Its prompt's choices together (metrics), shared by them.
    parent: Option<Arc<ParentRequest>>,
    /// Log-probabilities, when the request asked for any.
    logprobs: Option<Box<ChoiceLogprobs>>,
    /// An output received early (`echo` with log-probabilities waits for
    /// the prompt's), handled next.
    early: Option<Option<RequestOutput>>,
    done: bool,
}

impl ChoiceStream {
    /// A stream over `handle`'s outputs for choice `index`.
    pub fn new(
        index: usize,
        handle: RequestHandle,
        decoder: IncrementalDecoder,
        stop: Arc<[String]>,
        arrival: Instant,
        latency: Option<FrontendRecorder>,
        request: RequestRef,
    ) -> Self {
        let max_stop_len = stop.iter().map(String::len).max().unwrap_or(0);
        Self {
            index,
            handle,
            decoder,
            stop,
            max_stop_len,
            held: String::new(),
            arrival,
            first_delta: None,
            last_delta: None,
            seen_at: None,
            zero_itls: 0,
            latency,
            request,
            request_log: None,
            reservation: None,
            tenant: None,
            tenant_name: None,
            include_stop: false,
            echo: None,
            features: RequestFeatures::default(),
            parent: None,
            logprobs: None,
            early: None,
            done: false,
        }
    }

    /// Reports log-probabilities as `plan` says, naming tokens with
    /// `tokenizer`; `first_prompt_token` leads an echoed prompt's.
    pub fn set_logprobs(
        &mut self,
        plan: LogprobsPlan,
        tokenizer: Arc<dyn Tokenizer>,
        first_prompt_token: u32,
    ) {
        self.logprobs = Some(Box::new(ChoiceLogprobs {
            plan,
            tokenizer,
            first_prompt_token,
            pending: Vec::new(),
            prompt: None,
        }));
    }

    /// A delta of `text` with the log-probabilities gathered so far.
    fn delta(&mut self, text: String, finish: Option<Box<ChoiceFinish>>) -> ChoiceDelta {
        let (logprobs, prompt_logprobs) = match &mut self.logprobs {
            Some(lp) => (std::mem::take(&mut lp.pending), lp.prompt.take()),
            None => (Vec::new(), None),
        };
        ChoiceDelta {
            index: self.index,
            text,
            logprobs,
            prompt_logprobs,
            finish,
        }
    }

    /// Whether the generated token is not reported (`max_tokens: 0`).
    fn prefill_only(&self) -> bool {
        self.logprobs.as_ref().is_some_and(|l| l.plan.prefill_only)
    }

    /// The next delta with text or the final one; `None` after the final.
    pub async fn next(&mut self) -> Option<ChoiceDelta> {
        if self.done {
            return None;
        }
        // The caller handed the last delta on (a stream's write) since:
        // what is queued now is seen now.
        self.seen_at = None;
        Some(self.step(String::new()).await)
    }

    /// The next output, waiting for it if none is queued; the clock is read
    /// again after a wait.
    async fn next_output(&mut self) -> Option<RequestOutput> {
        if let Some(out) = self.handle.recv_ready() {
            return out;
        }
        self.seen_at = None;
        self.handle.recv().await
    }

    /// When the output being handled was seen (see `seen_at`).
    fn seen_now(&mut self) -> Instant {
        *self.seen_at.get_or_insert_with(Instant::now)
    }

    /// Runs the choice to its end.
    ///
    /// An `async` block, not an `async fn`: an `async fn` keeps its
    /// argument twice in its future (the argument and the body's own
    /// binding of it), and this future is moved as the request starts.
    #[allow(clippy::manual_async_fn)] // not an `async fn`: see above
    pub fn collect(mut self) -> impl Future<Output = CompletedChoice> {
        async move {
            let mut text = String::new();
            let mut logprobs = Vec::new();
            let mut prompt_logprobs = None;
            // Each delta's text comes back for the next one: no string per token.
            let mut scratch = String::new();
            loop {
                self.take_queued_tokens(&mut text);
                let mut d = self.step(scratch).await;
                text.push_str(&d.text);
                scratch = std::mem::take(&mut d.text);
                logprobs.append(&mut d.logprobs);
                if d.prompt_logprobs.is_some() {
                    prompt_logprobs = d.prompt_logprobs;
                }
                if let Some(finish) = d.finish {
                    return CompletedChoice {
                        index: d.index,
                        text,
                        logprobs,
                        prompt_logprobs,
                        finish: *finish,
                    };
                }
            }
        }
    }

    /// An output (a token, the finish or the stream's end) arrived: the
    /// prompt is no longer queued, and the tenant's choice has started.
    fn output_arrived(&mut self) {
        self.reservation = None;
        if let Some(t) = &mut self.tenant {
            t.started();
        }
    }

    /// Whether an output without a finish is a token's text and nothing
    /// else: no stop string to look for, no log-probabilities, no echo or
    /// early output to hand on before it.
    fn plain(&self) -> bool {
        self.stop.is_empty()
            && self.logprobs.is_none()
            && self.echo.is_none()
            && self.early.is_none()
    }

    /// Appends to `text` the queued outputs that are plain tokens, as the
    /// deltas `step` would give for them would, without a delta each (per
    /// token, a delta was most of the work of collecting a choice); the
    /// first other output (a finish, the stream's end) is left for `step`.
    fn take_queued_tokens(&mut self, text: &mut String) {
        if !self.plain() {
            return;
        }
        while let Some(out) = self.handle.recv_ready() {
            match out {
                Some(out) if out.finished.is_none() => {
                    self.output_arrived();
                    let before = text.len();
                    if let Some(t) = out.token_id {
                        // As in `step`: a token that cannot be decoded is skipped.
                        let _ = self.decoder.push_into(t, text);
                    }
                    if text.len() > before {
                        self.observe_delta();
                    }
                }
                other => {
                    self.early = Some(other);
                    return;
                }
            }
        }
    }

    /// The next delta with text, or the final one. Every path ends in a
    /// delta, so a caller that loops until `finish` always gets one. The
    /// delta's text is written into `buf` (its capacity reused) where it can be.
    async fn step(&mut self, mut buf: String) -> ChoiceDelta {
        // The echoed prompt is not generated text: no latency is recorded
        // for it, and stop strings are not searched in it.
        if let Some(echo) = self.echo.take() {
            // The echoed prompt's log-probabilities come with the first
            // output: wait for it, and handle it next.
            if self.logprobs.as_ref().is_some_and(|l| l.plan.echo) {
                let mut out = self.next_output().await;
                self.reservation = None;
                if let (Some(o), Some(lp)) = (&mut out, &mut self.logprobs) {
                    lp.take_prompt(o);
                }
                self.early = Some(out);
                return self.delta(echo, None);
            }
            if !echo.is_empty() {
                return self.delta(echo, None);
            }
        }
        loop {
            let out = match self.early.take() {
                Some(out) => out,
                None => self.next_output().await,
            };
            self.output_arrived();
            let Some(mut out) = out else {
                // The engine dropped the request without a finish.
                return self.finish(
                    String::new(),
                    FinishReason::Error,
                    Some("the engine stopped without finishing the request".into()),
                    0,
                    0,
                    None,
                );
            };
            let mut text = std::mem::take(&mut buf);
            text.clear();
            let prefill_only = self.prefill_only();
            if let Some(lp) = &mut self.logprobs {
                lp.take(&mut out, prefill_only);
            }
            // As vLLM does, the token that stopped the choice (EOS or a stop
            // token id) is left out of the text unless asked for.
            let stopped_by = out.finished.as_ref().and_then(|f| f.stop_token_id);
            if let Some(t) = out.token_id
                && (self.include_stop || stopped_by != Some(t))
                && !prefill_only
            {
                // A token the tokenizer cannot decode is skipped, not fatal.
                let _ = self.decoder.push_into(t, &mut text);
            }
            if let Some(f) = out.finished {
                let f = *f;
                text.push_str(&self.decoder.finish());
                let mut pending = std::mem::take(&mut self.held);
                pending.push_str(&text);
                let (emit, reason) = match self.find_stop(&pending) {
                    Some(pos) => (pending[..pos].to_owned(), FinishReason::Stop),
                    None => (pending, f.reason),
                };
                return self.finish(
                    emit,
                    reason,
                    f.error,
                    f.num_prompt_tokens,
                    f.num_generation_tokens,
                    Some((f.timeline, f.num_preemptions)),
                );
            }
            if text.is_empty() {
                buf = text;
                continue;
            }
            if self.stop.is_empty() {
                // No stop strings: nothing to hold back or search for.
                self.observe_delta();
                return self.delta(text, None);
            }
            self.held.push_str(&text);
            if let Some(end) = self.find_stop(&self.held) {
                let emit = self.held[..end].to_owned();
                self.held.clear();
                // Ends the request in the engine as `stop`; the finish it
                // sends back carries the counts.
                self.handle.finish(FinishReason::Stop);
                return self.drain_after_stop(emit).await;
            }
            let emit = self.take_safe_text();
            if emit.is_empty() {
                buf = text;
                continue;
            }
            self.observe_delta();
            return self.delta(emit, None);
        }
    }

    /// After a stop string: waits for the engine's finish to get the counts.
    async fn drain_after_stop(&mut self, emit: String) -> ChoiceDelta {
        while let Some(out) = self.next_output().await {
            if let Some(f) = out.finished {
                let f = *f;
                return self.finish(
                    emit,
                    FinishReason::Stop,
                    None,
                    f.num_prompt_tokens,
                    f.num_generation_tokens,
                    Some((f.timeline, f.num_preemptions)),
                );
            }
        }
        self.finish(emit, FinishReason::Stop, None, 0, 0, None)
    }

    /// Text that can no longer be the start of a stop string.
    fn take_safe_text(&mut self) -> String {
        let keep = self.max_stop_len.saturating_sub(1);
        if self.held.len() <= keep {
            return String::new();
        }
        let mut cut = self.held.len() - keep;
        while !self.held.is_char_boundary(cut) {
            cut -= 1;
        }
        let rest = self.held.split_off(cut);
        std::mem::replace(&mut self.held, rest)
    }

    /// Where the text to emit ends when a stop string occurs in `text`:
    /// before the first one, or after it with `include_stop_str_in_output`.
    fn find_stop(&self, text: &str) -> Option<usize> {
        let (pos, len) = self
            .stop
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|p| (p, s.len())))
            .min()?;
        Some(if self.include_stop { pos + len } else { pos })
    }

    /// Records a delta handed on now (TTFT for the first, else ITL).
    fn observe_delta(&mut self) {
        let now = self.seen_now();
        if let Some(recorder) = &self.latency {
            let stats = match self.last_delta {
                None => FrontendStats::FirstToken {
                    ttft: now.duration_since(self.arrival),
                },
                Some(prev) if prev == now => {
                    self.zero_itls += 1;
                    return;
                }
                Some(prev) => FrontendStats::NextToken {
                    itl: now.duration_since(prev),
                    count: 1,
                },
            };
            recorder.record_for(&stats, &self.request);
        }
        self.first_delta.get_or_insert(now);
        self.last_delta = Some(now);
    }

    /// Records the inter-token latencies of 0 held in `zero_itls`.
    fn record_zero_itls(&mut self) {
        let count = std::mem::take(&mut self.zero_itls);
        if let Some(recorder) = &self.latency
            && count > 0
        {
            let stats = FrontendStats::NextToken {
                itl: Duration::ZERO,
                count,
            };
            recorder.record_for(&stats, &self.request);
        }
    }

    /// The final delta; `engine` is the engine's timeline and preemption
    /// count, when the engine finished the request.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        text: String,
        reason: FinishReason,
        error: Option<String>,
        prompt_tokens: usize,
        completion_tokens: usize,
        engine: Option<(RequestTimeline, u64)>,
    ) -> ChoiceDelta {
        self.done = true;
        if let Some(t) = &mut self.tenant {
            t.finished(completion_tokens);
        }
        if reason != FinishReason::Abort && reason != FinishReason::Error {
            self.observe_delta();
        }
        self.record_zero_itls();
        // Measured once: the histograms, the response's `metrics` and the
        // request log all get this same value.
        let frontend = FrontendRequestStats {
            ttft: self.first_delta.map(|t| t.duration_since(self.arrival)),
            e2e: self.seen_now().duration_since(self.arrival),
            num_generation_tokens: completion_tokens,
        };
        if let Some(recorder) = &self.latency {
            recorder.record_for(&FrontendStats::Finished(frontend), &self.request);
        }
        if let Some(parent) = &self.parent {
            parent.choice_finished(completion_tokens);
        }
        let timings = ChoiceTimings::new(
            frontend.ttft,
            frontend.e2e,
            engine.as_ref().map(|(t, _)| t),
            engine.as_ref().map_or(0, |(_, p)| *p),
            completion_tokens,
        );
        if let Some(log) = &self.request_log {
            log.record(RequestLogEntry {
                request: self.request.clone(),
                tenant: self.tenant_name.clone(),
                engine: self.handle.engine,
                finish_reason: reason,
                prompt_tokens,
                completion_tokens,
                timings: timings.clone(),
                features: self.features,
            });
        }
        let timeline = engine.map(|(t, _)| t);
        self.delta(
            text,
            Some(Box::new(ChoiceFinish {
                reason,
                error,
                prompt_tokens,
                completion_tokens,
                timeline,
                timings,
            })),
        )
    }
}

impl Drop for ChoiceStream {
    fn drop(&mut self) {
        // A stream dropped before its finish (the client left) still
        // counts the latencies of the deltas it handled.
        self.record_zero_itls();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use inferscope_engine::{
        Coordinator, EngineConfig, EngineRequest, Executor, SamplingParams, SimExecutor,
        SimProfile, sim::SimTokens,
    };
    use inferscope_model::{ByteTokenizer, Tokenizer};
    use inferscope_schema::NoopRecorder;

    use super::*;

    fn coordinator() -> Coordinator {
        Coordinator::start(
            EngineConfig::default(),
            1,
            0,
            |_| {
                let p = SimProfile::builtin("tiny").expect("tiny");
                Ok(Box::new(SimExecutor::new(p, SimTokens::default())) as Box<dyn Executor>)
            },
            Arc::new(NoopRecorder),
        )
        .expect("coordinator")
    }

    /// A choice stream of a `max_tokens` request to `c`, with `stop` strings.
    fn stream(c: &Coordinator, max_tokens: usize, stop: &[&str]) -> ChoiceStream {
        stream_recorded(c, max_tokens, stop, None)
    }

    /// [`stream`], its latencies recorded into `latency`.
    fn stream_recorded(
        c: &Coordinator,
        max_tokens: usize,
        stop: &[&str],
        latency: Option<FrontendRecorder>,
    ) -> ChoiceStream {
        let tok: Arc<dyn Tokenizer> = Arc::new(ByteTokenizer);
        let prompt = tok.encode("hello", false).expect("encode");
        let h = c
            .add_request(EngineRequest {
                request_id: format!("t{max_tokens}-{}", stop.len()).into(),
                prompt_token_ids: prompt.clone(),
                params: Arc::new(SamplingParams {
                    max_tokens,
                    ignore_eos: true,
                    seed: Some(3),
                    ..Default::default()
                }),
                seed_offset: 0,
                arrival: Instant::now(),
                trace_id: None,
                tenant: None,
                tenant_label: 0,
                grammar: None,
            })
            .expect("add");
        let stops: Arc<[String]> = stop.iter().map(|s| s.to_string()).collect();
        ChoiceStream::new(
            0,
            h,
            IncrementalDecoder::new(tok, &prompt),
            stops,
            Instant::now(),
            latency,
            RequestRef::new("test-0", None),
        )
    }

    /// The TTFT and inter-token latency sample counts `metrics` exposes,
    /// and the inter-token latencies' sum.
    fn latency_samples(metrics: &inferscope_metrics::StatLoggerManager) -> (f64, f64, f64) {
        let (_, text) = metrics.render(inferscope_metrics::Format::Prometheus);
        let samples = inferscope_schema::promtext::parse(&text)
            .expect("exposition")
            .into_samples();
        let count = |name| inferscope_schema::promtext::sum(&samples, name, &[]);
        (
            count("inferscope_time_to_first_token_seconds_count"),
            count("inferscope_inter_token_latency_seconds_count"),
            count("inferscope_inter_token_latency_seconds_sum"),
        )
    }

    async fn collect(c: &Coordinator, max_tokens: usize, stop: &[&str]) -> (String, ChoiceFinish) {
        let mut s = stream(c, max_tokens, stop);
        let mut text = String::new();
        loop {
            let d = tokio::time::timeout(Duration::from_secs(10), s.next())
                .await
                .expect("not stuck")
                .expect("a delta");
            text.push_str(&d.text);
            if let Some(f) = d.finish {
                assert!(s.next().await.is_none(), "nothing after the final delta");
                return (text, *f);
            }
        }
    }

    #[tokio::test]
    async fn stop_strings_cut_the_text_and_end_as_stop() {
        let c = coordinator();
        let (full, f) = collect(&c, 200, &[]).await;
        assert_eq!(f.reason, FinishReason::Length);
        assert_eq!(full.len(), 200, "byte tokenizer: one char per token");
        // Pick a stop string from the middle of the known output.
        let stop = &full[50..53];
        let first = full.find(stop).expect("present");
        let (cut, f) = collect(&c, 200, &[stop]).await;
        assert_eq!(f.reason, FinishReason::Stop);
        assert_eq!(cut, full[..first], "text ends right before the stop string");
        assert!(f.completion_tokens >= first + stop.len());
    }

    /// `collect` takes queued tokens without a delta each: the same text,
    /// counts and latency samples as the deltas give, whether the tokens
    /// are all queued before it starts or arrive while it waits.
    #[tokio::test]
    async fn collecting_queued_tokens_gives_what_the_deltas_give() {
        let c = coordinator();
        let (streamed, f) = collect(&c, 40, &[]).await;
        assert_eq!(streamed.len(), 40, "byte tokenizer: one char per token");
        for queued in [false, true] {
            let metrics =
                inferscope_metrics::StatLoggerManager::new(Default::default()).expect("metrics");
            let s = stream_recorded(&c, 40, &[], metrics.frontend(0));
            if queued {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let done = tokio::time::timeout(Duration::from_secs(10), s.collect())
                .await
                .expect("not stuck");
            assert_eq!(done.text, streamed, "queued first: {queued}");
            assert_eq!(done.finish.reason, FinishReason::Length);
            assert_eq!(done.finish.completion_tokens, f.completion_tokens);
            let (ttft, itl, _) = latency_samples(&metrics);
            assert_eq!((ttft, itl), (1.0, 39.0));
        }
    }

    /// Outputs queued together share one clock read, but a stream's reader
    /// that takes its time between deltas sees each when it reads it: its
    /// end-to-end time includes the reading.
    #[tokio::test]
    async fn a_slow_readers_deltas_are_timed_when_it_reads_them() {
        let c = coordinator();
        let mut s = stream(&c, 4, &[]);
        // All four tokens are queued before the first read.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut deltas = 0;
        let finish = loop {
            let d = s.next().await.expect("a delta");
            deltas += 1;
            if let Some(f) = d.finish {
                break *f;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(deltas, 4, "one delta per token");
        let t = finish.timings;
        let reading = t.e2e - t.ttft.expect("a first delta");
        assert!(
            reading >= Duration::from_millis(60),
            "three 20 ms pauses between first and last delta, timed {reading:?}"
        );
    }

    /// Deltas handled at one clock read have inter-token latencies of 0,
    /// recorded together: still one sample per token after the first, at
    /// the finish and when the stream is dropped before it.
    #[tokio::test]
    async fn every_token_after_the_first_is_one_itl_sample_however_they_are_read() {
        let c = coordinator();
        for read in [2, 5, 8] {
            let metrics =
                inferscope_metrics::StatLoggerManager::new(Default::default()).expect("metrics");
            let mut s = stream_recorded(&c, 8, &[], metrics.frontend(0));
            // All eight tokens are queued before the first read.
            tokio::time::sleep(Duration::from_millis(100)).await;
            // As `collect` reads: one clock read for what is queued.
            for _ in 0..read {
                s.step(String::new()).await;
            }
            assert_eq!(s.done, read == 8);
            drop(s);
            assert_eq!(
                latency_samples(&metrics),
                (1.0, (read - 1) as f64, 0.0),
                "{read} deltas read"
            );
        }
    }
}
