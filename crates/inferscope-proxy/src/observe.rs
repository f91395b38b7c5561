//! What the proxy measures, from the bytes the client receives: a response
//! body wrapper that passes each upstream frame on as it arrives and reads a
//! view of it on the way: SSE events (per choice: TTFT at the first chunk
//! with content, inter-token samples for later content chunks, one per
//! token where the running usage total says how many a chunk holds; the
//! final chunk counts, text or not, as on `serve`; finish
//! reasons; `usage`) or a JSON body (finish reasons and `usage` at the end).
//!
//! Usage injection: when the proxy asked the upstream for the usage chunk on
//! the client's behalf, the body is cut at event boundaries and that chunk
//! (and `"usage":null` fields the upstream added because of the request) is
//! left out, so the client gets exactly what it asked for. Only an incomplete
//! event is held back, which the client could not have used anyway.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use inferscope_console::RecentRing;
use inferscope_schema::schema::TENANT_ANONYMOUS;

use crate::admission::Holds;
use inferscope_metrics::FrontendRecorder;
use inferscope_schema::schema::{self, MetricDef};
use inferscope_schema::stats::{FinishReason, FrontendStats, ObservedRequest, RequestRef};
use serde::Deserialize;

/// JSON bodies larger than this are passed on but not read for usage.
const MAX_JSON_VIEW: usize = 16 * 1024 * 1024;

/// The request fields the metrics need, read from the client's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestView {
    /// `"stream": true`.
    pub stream: bool,
    /// `stream_options.include_usage` is true.
    pub include_usage: bool,
    /// `max_tokens`, else `max_completion_tokens`.
    pub max_tokens: Option<u64>,
    /// `n` (1 when absent).
    pub n: u64,
    /// `model`, when it is a string.
    pub model: Option<String>,
    /// How `stream_options` stands, for the usage injection.
    stream_options: StreamOptions,
}

impl Default for RequestView {
    /// A body the proxy could not read: one choice, nothing else known.
    fn default() -> Self {
        Self {
            stream: false,
            include_usage: false,
            max_tokens: None,
            n: 1,
            model: None,
            stream_options: StreamOptions::Absent,
        }
    }
}

/// The request's `stream_options`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum StreamOptions {
    /// Not in the body: the member can be spliced in as bytes.
    #[default]
    Absent,
    /// An object: the body is re-serialised with `include_usage` set.
    Object,
    /// Something else (`null`, a number): left to the upstream to refuse.
    Other,
}

/// The members of a request body the proxy reads; the rest (the prompt, the
/// messages) is skipped by the parser without being copied.
#[derive(Deserialize)]
struct RequestFields {
    #[serde(default)]
    stream: Option<serde_json::Value>,
    #[serde(default)]
    stream_options: Option<serde_json::Value>,
    #[serde(default)]
    max_tokens: Option<serde_json::Value>,
    #[serde(default)]
    max_completion_tokens: Option<serde_json::Value>,
    #[serde(default)]
    n: Option<serde_json::Value>,
    #[serde(default)]
    model: Option<serde_json::Value>,
}

impl RequestView {
    /// Reads the fields from a request body; `None` when it is not a JSON
    /// object (the upstream answers invalid requests itself). Mistyped
    /// fields read as their defaults.
    pub fn parse(body: &[u8]) -> Option<Self> {
        let f: RequestFields = serde_json::from_slice(body).ok()?;
        let include_usage = f
            .stream_options
            .as_ref()
            .and_then(|o| o.get("include_usage"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        let stream_options = match &f.stream_options {
            None => StreamOptions::Absent,
            Some(serde_json::Value::Object(_)) => StreamOptions::Object,
            Some(_) => StreamOptions::Other,
        };
        Some(Self {
            stream: f.stream.as_ref().and_then(serde_json::Value::as_bool) == Some(true),
            include_usage,
            max_tokens: f
                .max_tokens
                .as_ref()
                .or(f.max_completion_tokens.as_ref())
                .and_then(serde_json::Value::as_u64),
            n: f.n
                .as_ref()
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(1),
            model: match f.model {
                Some(serde_json::Value::String(m)) => Some(m),
                _ => None,
            },
            stream_options,
        })
    }
}

/// `body` with `stream_options.include_usage` set to true, or `None` when
/// it cannot be set (a `stream_options` that is not an object: left to the
/// upstream to refuse). Without a `stream_options` member, the member is
/// spliced in after the opening brace, the rest of the body untouched (no
/// parse and re-serialisation on the way to the first token).
pub fn with_usage_requested(body: &[u8], view: &RequestView) -> Option<Vec<u8>> {
    match view.stream_options {
        StreamOptions::Absent => {
            let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
            if body[open] != b'{' {
                return None;
            }
            let rest = &body[open + 1..];
            let empty = rest
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                .is_some_and(|&b| b == b'}');
            const MEMBER: &[u8] = br#""stream_options":{"include_usage":true}"#;
            let mut out = Vec::with_capacity(body.len() + MEMBER.len() + 1);
            out.extend_from_slice(&body[..=open]);
            out.extend_from_slice(MEMBER);
            if !empty {
                out.push(b',');
            }
            out.extend_from_slice(rest);
            Some(out)
        }
        StreamOptions::Object => {
            let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
            inject_usage(&mut v).then(|| serde_json::to_vec(&v).ok())?
        }
        StreamOptions::Other => None,
    }
}

/// Sets `stream_options.include_usage` to true; `false` when the body has a
/// `stream_options` that is not an object (left to the upstream to refuse).
pub fn inject_usage(body: &mut serde_json::Value) -> bool {
    let Some(obj) = body.as_object_mut() else {
        return false;
    };
    let opts = obj
        .entry("stream_options")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    match opts.as_object_mut() {
        Some(o) => {
            o.insert("include_usage".into(), serde_json::Value::Bool(true));
            true
        }
        None => false,
    }
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: usize,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

/// One streamed chunk or a whole JSON response, the fields the proxy reads.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
}

fn non_empty(s: &Option<Cow<'_, str>>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

impl Choice<'_> {
    fn has_content(&self) -> bool {
        non_empty(&self.text)
            || self.delta.as_ref().is_some_and(|d| {
                non_empty(&d.content)
                    || non_empty(&d.reasoning_content)
                    || non_empty(&d.reasoning)
                    || d.tool_calls.is_some()
            })
    }
}

/// The `finished_reason` label of an OpenAI `finish_reason`.
pub fn finish_reason(s: &str) -> FinishReason {
    match s {
        "length" => FinishReason::Length,
        "abort" => FinishReason::Abort,
        "error" => FinishReason::Error,
        // stop, tool_calls, function_call, content_filter, eos: the model ended it.
        _ => FinishReason::Stop,
    }
}

/// How the request ended, from the proxy's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream body ended normally.
    Complete,
    /// The upstream failed (5xx, a broken body, no response).
    Failed,
    /// The client went away first.
    Aborted,
}

/// Choices followed per request: a larger `n` is recorded as this many
/// (the upstream refuses such an `n` long before).
const MAX_CHOICES: usize = 128;

/// What the proxy saw of one choice.
#[derive(Debug, Default, Clone)]
struct ChoiceSeen {
    first_content: Option<Instant>,
    last_content: Option<Instant>,
    finish: Option<FinishReason>,
    /// Chunks with content (one token each on llama.cpp, vLLM, inferscope).
    content_chunks: u64,
    /// `usage.completion_tokens` at its last content chunk, when the
    /// upstream sends usage on every chunk (vLLM's `continuous_usage_stats`).
    tokens_so_far: Option<u64>,
}

/// One request's measurements, recorded once when it ends (or is dropped).
///
/// With `n > 1` each choice is recorded as `serve` records each of its
/// engine requests: its own finish reason, TTFT and inter-token samples,
/// and the prompt counted once per choice.
#[derive(Debug)]
pub struct Observer {
    /// The request's model's recorder.
    recorder: FrontendRecorder,
    start: Instant,
    request: RequestView,
    choices: Vec<ChoiceSeen>,
    usage: Option<(Option<u64>, Option<u64>)>,
    /// The body was an event stream (a chunk was read from it).
    streamed: bool,
    recorded: bool,
    /// The console's ring and the request's id, when the console is on.
    recent: Option<(Arc<RecentRing>, String)>,
    /// The request with its tenant's label slot (and the exemplars' id),
    /// when a tenant sent it; `None`: anonymous.
    tenant: Option<(RequestRef, Arc<str>)>,
    /// Its holds on its tenant's limits and its upstream slot.
    holds: Option<Holds>,
}

/// Records `stats`, for `request`'s tenant when there is one.
#[inline]
fn record(recorder: &FrontendRecorder, request: Option<&RequestRef>, stats: &FrontendStats) {
    match request {
        Some(r) => recorder.record_for(stats, r),
        None => recorder.record(stats),
    }
}

impl Observer {
    /// Starts observing a request that arrived at `start`; counts it in flight.
    pub fn new(recorder: FrontendRecorder, start: Instant, request: RequestView) -> Self {
        recorder.record(&FrontendStats::Started);
        Self {
            recorder,
            start,
            request,
            choices: Vec::new(),
            usage: None,
            streamed: false,
            recorded: false,
            recent: None,
            tenant: None,
            holds: None,
        }
    }

    /// Attributes the request to tenant `name`: `request` carries its label
    /// slot (and is the exemplar of the series it lands in).
    pub fn for_tenant(&mut self, name: Arc<str>, request: RequestRef) {
        self.tenant = Some((request, name));
    }

    /// Keeps `holds` until the request ends (then the tokens of its `usage`
    /// are charged to its tenant), however it ends.
    pub fn hold(&mut self, holds: Holds) {
        self.holds = Some(holds);
    }

    /// Lists each of the request's choices, when it ends, in the console's
    /// `ring` as `{id}-{index}` (as `serve` names its choices).
    pub fn list_in(&mut self, ring: Arc<RecentRing>, id: String) {
        self.recent = Some((ring, id));
    }

    /// The state of choice `index` (none past [`MAX_CHOICES`]). A function
    /// of the list alone, so a chunk's reader can hold it beside `recorder`.
    fn choice(choices: &mut Vec<ChoiceSeen>, index: usize) -> Option<&mut ChoiceSeen> {
        if index >= MAX_CHOICES {
            return None;
        }
        if choices.len() <= index {
            choices.resize(index + 1, ChoiceSeen::default());
        }
        choices.get_mut(index)
    }

    fn read_chunk(&mut self, chunk: &Chunk<'_>, now: Instant) {
        self.streamed = true;
        // Usage on a chunk with choices: the running total (one choice).
        let running_total = match (&chunk.usage, chunk.choices.len()) {
            (Some(u), 1) => u.completion_tokens,
            _ => None,
        };
        // Borrowed, not cloned: this runs once per chunk.
        let recorder = &self.recorder;
        let request = self.tenant.as_ref().map(|(r, _)| r);
        let start = self.start;
        for c in &chunk.choices {
            let content = c.has_content();
            let finish = c.finish_reason.as_deref().map(finish_reason);
            let Some(seen) = Self::choice(&mut self.choices, c.index) else {
                continue;
            };
            if content {
                match seen.last_content {
                    None => {
                        seen.first_content = Some(now);
                        record(
                            recorder,
                            request,
                            &FrontendStats::FirstToken {
                                ttft: now.duration_since(start),
                            },
                        );
                    }
                    Some(prev) => {
                        let gap = now.duration_since(prev);
                        // A chunk of k tokens (known from the running usage
                        // total) is k inter-token gaps of gap / k; unknown,
                        // it is one sample (one token per chunk upstream).
                        let tokens = match (seen.tokens_so_far, running_total) {
                            (Some(before), Some(now_total)) if now_total > before => {
                                now_total - before
                            }
                            _ => 1,
                        };
                        let itl = FrontendStats::NextToken {
                            itl: gap.div_f64(tokens as f64),
                            count: tokens.min(MAX_TOKENS_PER_CHUNK),
                        };
                        record(recorder, request, &itl);
                    }
                }
                seen.last_content = Some(now);
                seen.content_chunks += 1;
                if running_total.is_some() {
                    seen.tokens_so_far = running_total;
                }
            } else if finish.is_some() {
                // The final chunk is a token's delta even without text (an
                // end-of-sequence token has none): `serve` samples it, as
                // the first token when nothing came before it.
                let stats = match seen.last_content {
                    None => {
                        seen.first_content = Some(now);
                        FrontendStats::FirstToken {
                            ttft: now.duration_since(start),
                        }
                    }
                    Some(prev) => FrontendStats::NextToken {
                        itl: now.duration_since(prev),
                        count: 1,
                    },
                };
                record(recorder, request, &stats);
            }
            if let Some(r) = finish {
                seen.finish = Some(r);
            }
        }
        if let Some(u) = &chunk.usage {
            self.usage = Some((u.prompt_tokens, u.completion_tokens));
        }
    }

    /// Reads a whole (non-streamed) JSON response.
    fn read_json(&mut self, body: &[u8]) {
        if let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(body) {
            for c in &chunk.choices {
                let finish = c.finish_reason.as_deref().map(finish_reason);
                if let (Some(seen), Some(r)) = (Self::choice(&mut self.choices, c.index), finish) {
                    seen.finish = Some(r);
                }
            }
            if let Some(u) = &chunk.usage {
                self.usage = Some((u.prompt_tokens, u.completion_tokens));
            }
        }
    }

    /// Forgets the request without recording it (the upstream refused it).
    pub fn discard(&mut self) {
        self.holds = None;
        if !self.recorded {
            self.recorded = true;
            self.recorder.record(&FrontendStats::Ended);
        }
    }

    /// Records the request once; later calls do nothing.
    pub fn finish(&mut self, outcome: Outcome) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        self.recorder.record(&FrontendStats::Ended);
        let e2e = self.start.elapsed();
        let (prompt_tokens, generation_tokens) = self.usage.unwrap_or((None, None));
        // The holds go now (the upstream slot to the next waiter), the
        // tokens charged to the tenant's tokens per minute.
        if let Some(mut holds) = self.holds.take() {
            holds.charge(prompt_tokens.unwrap_or(0) + generation_tokens.unwrap_or(0));
        }
        let request = self.tenant.as_ref().map(|(r, _)| r);
        let n = usize::try_from(self.request.n)
            .unwrap_or(MAX_CHOICES)
            .clamp(1, MAX_CHOICES)
            .max(self.choices.len());
        self.choices.resize(n, ChoiceSeen::default());
        // Each choice's own token count: the total with one choice; with
        // several, their content chunks when those add up to the total (one
        // token per chunk), else unknown (the counter still gets the total).
        // A stream that ended without its usage chunk (the client went away,
        // or the upstream cut it short): the content chunks relayed, one token
        // each as llama.cpp, vLLM and inferscope send them, so a count as
        // relayed (the upstream may have generated more).
        let chunks: u64 = self.choices.iter().map(|c| c.content_chunks).sum();
        let streamed = self.streamed;
        let per_choice = |c: &ChoiceSeen| match generation_tokens {
            Some(g) if n == 1 => Some(g),
            Some(g) if chunks == g => Some(c.content_chunks),
            None if streamed => Some(c.content_chunks),
            _ => None,
        };
        let split = n > 1 && generation_tokens.is_some_and(|g| chunks != g);
        if split && let Some(g) = generation_tokens {
            record(&self.recorder, request, &FrontendStats::GenerationTokens(g));
        }
        let mut max_generation_tokens = Some(0);
        for (index, c) in self.choices.iter().enumerate() {
            let generation_tokens = if split { None } else { per_choice(c) };
            max_generation_tokens = max_generation_tokens
                .zip(generation_tokens)
                .map(|(m, g)| m.max(g as usize));
            let reason = match outcome {
                Outcome::Aborted => FinishReason::Abort,
                Outcome::Failed => FinishReason::Error,
                // A choice that ended without a finish_reason was cut short upstream.
                Outcome::Complete => c.finish.unwrap_or(FinishReason::Error),
            };
            let ttft = c.first_content.map(|t| t.duration_since(self.start));
            record(
                &self.recorder,
                request,
                &FrontendStats::Observed(ObservedRequest {
                    finish_reason: reason,
                    prompt_tokens,
                    generation_tokens,
                    max_tokens: self.request.max_tokens,
                    ttft,
                    e2e,
                }),
            );
            if let Some((ring, id)) = &self.recent {
                ring.push(recent_entry(
                    format!("{id}-{index}"),
                    self.tenant.as_ref().map_or(TENANT_ANONYMOUS, |(_, t)| t),
                    reason,
                    prompt_tokens,
                    generation_tokens,
                    ttft,
                    e2e,
                ));
            }
        }
        // Once per request, as the server observes `n` once per prompt (a
        // list of prompts counts once here: the proxy does not parse them).
        self.recorder.record(&FrontendStats::ParentFinished {
            n,
            max_generation_tokens,
        });
    }
}

/// A choice as the console lists it (docs/console.md, `REQUEST`): what the
/// proxy measured from the client's side; what only an engine knows (queue,
/// prefill, engine, preemptions) is `null`.
fn recent_entry(
    request_id: String,
    tenant: &str,
    reason: FinishReason,
    prompt_tokens: Option<u64>,
    generation_tokens: Option<u64>,
    ttft: Option<std::time::Duration>,
    e2e: std::time::Duration,
) -> serde_json::Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    serde_json::json!({
        "timestamp": inferscope_console::history::unix_now(),
        "request_id": request_id,
        "trace_id": null,
        "tenant": tenant,
        "engine": null,
        "finish_reason": reason.as_str(),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generation_tokens,
        "time_to_first_token_ms": ttft.map(ms),
        "generation_time_ms": ms(e2e),
        "decode_time_ms": ttft.map(|t| ms(e2e.saturating_sub(t))),
        "queue_time_ms": null,
        "prefill_time_ms": null,
        "num_preemptions": null,
    })
}

/// Inter-token samples one chunk may add (a bound on a bogus usage total).
const MAX_TOKENS_PER_CHUNK: u64 = 4096;

impl Drop for Observer {
    fn drop(&mut self) {
        // Dropped before the end: the client went away (the body with it).
        self.finish(Outcome::Aborted);
    }
}

/// The end of the first SSE event in `buf`: the index just past its blank line.
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some(i + 2);
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

/// The `data:` payload of one event (lines joined by `\n`).
fn event_data(event: &[u8]) -> Cow<'_, [u8]> {
    let mut lines = event
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter_map(|l| l.strip_prefix(b"data:"))
        .map(|l| l.strip_prefix(b" ").unwrap_or(l));
    let Some(first) = lines.next() else {
        return Cow::Borrowed(&[]);
    };
    match lines.next() {
        None => Cow::Borrowed(first),
        Some(second) => {
            let mut joined = first.to_vec();
            for l in std::iter::once(second).chain(lines) {
                joined.push(b'\n');
                joined.extend_from_slice(l);
            }
            Cow::Owned(joined)
        }
    }
}

/// `event` without its `"usage":null` member, if it has one.
fn without_null_usage(event: &[u8]) -> Option<Vec<u8>> {
    // Inside a JSON string a quote is escaped, so `"usage":` here is a key.
    for pat in [&b"\"usage\":null"[..], &b"\"usage\": null"[..]] {
        if let Some(at) = event.windows(pat.len()).position(|w| w == pat) {
            let end = at + pat.len();
            let mut out = Vec::with_capacity(event.len());
            if event.get(end) == Some(&b',') {
                out.extend_from_slice(&event[..at]);
                out.extend_from_slice(&event[end + 1..]);
            } else {
                let start = event[..at]
                    .iter()
                    .rposition(|&b| b == b',')
                    .filter(|&c| event[c + 1..at].iter().all(u8::is_ascii_whitespace))
                    .unwrap_or(at);
                out.extend_from_slice(&event[..start]);
                out.extend_from_slice(&event[end..]);
            }
            return Some(out);
        }
    }
    None
}

/// What to do with an event when the proxy injected the usage request.
enum Keep {
    /// Pass it on unchanged.
    Unchanged,
    /// Leave it out (the usage chunk the client did not ask for).
    Drop,
    /// Pass on this rewritten event instead.
    Rewritten(Vec<u8>),
}

/// The body view: SSE events or one JSON document.
#[derive(Debug)]
enum View {
    /// `text/event-stream`; `strip` when the proxy injected `include_usage`.
    Sse { strip: bool, pending: BytesMut },
    /// Anything else, read at the end (up to [`MAX_JSON_VIEW`]).
    Json { seen: Option<Vec<u8>> },
    /// Not read (error responses).
    Opaque,
}

/// How the body should be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// An SSE stream; `strip_usage` takes out the injected usage chunk.
    Sse {
        /// The proxy asked for usage on the client's behalf.
        strip_usage: bool,
    },
    /// A JSON document.
    Json,
    /// Passed on without reading.
    Opaque,
}

/// An upstream response body, passed on frame by frame and observed.
pub struct ObservedBody<B> {
    /// `None` once handed to [`drain`] after the stream's `[DONE]`.
    inner: Option<B>,
    view: View,
    observer: Observer,
    outcome_if_done: Outcome,
    done: bool,
}

/// How long the rest of an upstream stream (after `[DONE]`, normally just
/// the chunked terminator) may take to arrive before the connection is
/// closed instead of pooled.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads what is left of `body` (its end, which gives the upstream
/// connection back to the pool), off the client's path.
async fn drain<B: Body + Unpin>(mut body: B) {
    let rest = async {
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            if frame.is_err() {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_LIMIT, rest).await;
}

/// Whether `data` ends with the `[DONE]` event that closes an OpenAI stream.
fn ends_with_done(data: &[u8]) -> bool {
    data.ends_with(b"data: [DONE]\n\n") || data.ends_with(b"data: [DONE]\r\n\r\n")
}

impl<B> ObservedBody<B> {
    /// Wraps `inner`; a complete body counts as `on_complete` (`Failed` for a
    /// 5xx answer whose body is passed on).
    pub fn new(inner: B, kind: BodyKind, observer: Observer, on_complete: Outcome) -> Self {
        let view = match kind {
            BodyKind::Sse { strip_usage } => View::Sse {
                strip: strip_usage,
                pending: BytesMut::new(),
            },
            BodyKind::Json => View::Json {
                seen: Some(Vec::new()),
            },
            BodyKind::Opaque => View::Opaque,
        };
        Self {
            inner: Some(inner),
            view,
            observer,
            outcome_if_done: on_complete,
            done: false,
        }
    }
}

/// Reads every complete event at the start of `buf`; returns how many bytes
/// they span and, when `strip`, the output if it differs from the input.
fn scan(
    buf: &[u8],
    strip: bool,
    observer: &mut Observer,
    now: Instant,
) -> (usize, Option<BytesMut>) {
    let mut at = 0;
    let mut out: Option<BytesMut> = None;
    while let Some(len) = event_end(&buf[at..]) {
        let event = &buf[at..at + len];
        let keep = read_event(event, strip, observer, now);
        match keep {
            Keep::Unchanged => {
                if let Some(o) = out.as_mut() {
                    o.extend_from_slice(event);
                }
            }
            Keep::Drop | Keep::Rewritten(_) => {
                let o = out.get_or_insert_with(|| BytesMut::from(&buf[..at]));
                if let Keep::Rewritten(e) = keep {
                    o.extend_from_slice(&e);
                }
            }
        }
        at += len;
    }
    (at, out)
}

fn read_event(event: &[u8], strip: bool, observer: &mut Observer, now: Instant) -> Keep {
    let data = event_data(event);
    if data.is_empty() || &*data == b"[DONE]" {
        return Keep::Unchanged;
    }
    let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(&data) else {
        return Keep::Unchanged;
    };
    observer.read_chunk(&chunk, now);
    if !strip {
        return Keep::Unchanged;
    }
    if chunk.choices.is_empty() && chunk.usage.is_some() {
        return Keep::Drop;
    }
    match without_null_usage(event) {
        Some(e) => Keep::Rewritten(e),
        None => Keep::Unchanged,
    }
}

impl View {
    /// Observes `data` and returns what the client gets of it.
    fn pass(&mut self, data: Bytes, observer: &mut Observer) -> Bytes {
        let now = Instant::now();
        match self {
            View::Opaque => data,
            View::Json { seen } => {
                if let Some(buf) = seen {
                    if buf.len() + data.len() <= MAX_JSON_VIEW {
                        buf.extend_from_slice(&data);
                    } else {
                        *seen = None;
                    }
                }
                data
            }
            View::Sse { strip, pending } => {
                if pending.is_empty() {
                    // The usual case: whole events in one frame, read in place.
                    let (used, out) = scan(&data, *strip, observer, now);
                    let rest = &data[used..];
                    if !*strip {
                        pending.extend_from_slice(rest);
                        return data;
                    }
                    let out = match out {
                        None if rest.is_empty() => return data,
                        None => data.slice(..used),
                        Some(o) => o.freeze(),
                    };
                    pending.extend_from_slice(rest);
                    out
                } else {
                    pending.extend_from_slice(&data);
                    let (used, out) = scan(pending, *strip, observer, now);
                    let done = pending.split_to(used);
                    if !*strip {
                        return data;
                    }
                    match out {
                        Some(o) => o.freeze(),
                        None => done.freeze(),
                    }
                }
            }
        }
    }

    /// At the end of the body: what is left to pass on, and a last read.
    fn end(&mut self, observer: &mut Observer) -> Option<Bytes> {
        match self {
            View::Opaque => None,
            View::Json { seen } => {
                if let Some(buf) = seen.take() {
                    observer.read_json(&buf);
                }
                None
            }
            View::Sse { strip, pending } => {
                // An unterminated last event: pass on what was held back.
                let rest = std::mem::take(pending);
                (*strip && !rest.is_empty()).then(|| rest.freeze())
            }
        }
    }
}

impl<B> Body for ObservedBody<B>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Send,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            match ready!(Pin::new(&mut *inner).poll_frame(cx)) {
                None => {
                    this.done = true;
                    let rest = this.view.end(&mut this.observer);
                    this.observer.finish(this.outcome_if_done);
                    return Poll::Ready(rest.map(|b| Ok(Frame::data(b))));
                }
                Some(Err(e)) => {
                    this.done = true;
                    this.observer.finish(Outcome::Failed);
                    return Poll::Ready(Some(Err(e)));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        // `[DONE]` ends an OpenAI stream: end the client's body
                        // with it, so the chunked terminator goes out in the
                        // same write. Otherwise it follows once the upstream's
                        // own terminator is read, after a client that stops at
                        // `[DONE]` has dropped the response, and that client
                        // cannot reuse its connection (a new connect each time).
                        let done_event = matches!(&this.view, View::Sse { pending, .. } if pending.is_empty())
                            && ends_with_done(&data);
                        let mut out = this.view.pass(data, &mut this.observer);
                        // A body of known length is not polled past its last
                        // byte (hyper stops at Content-Length): end it here.
                        let upstream_ended = inner.is_end_stream();
                        if done_event || upstream_ended {
                            this.done = true;
                            if let Some(rest) = this.view.end(&mut this.observer) {
                                let mut joined = BytesMut::from(&out[..]);
                                joined.extend_from_slice(&rest);
                                out = joined.freeze();
                            }
                            this.observer.finish(this.outcome_if_done);
                        }
                        if done_event && !upstream_ended {
                            if let Some(rest) = this.inner.take()
                                && let Ok(rt) = tokio::runtime::Handle::try_current()
                            {
                                rt.spawn(drain(rest));
                            }
                            return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out))));
                        }
                        if out.is_empty() {
                            if this.done {
                                return Poll::Ready(None);
                            }
                            // Everything was held back or left out: read on.
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.view, &self.inner) {
            // The length changes when the usage chunk is taken out.
            (View::Sse { strip: true, .. }, _) | (_, None) => SizeHint::default(),
            (_, Some(inner)) => inner.size_hint(),
        }
    }
}

/// The metrics the proxy can measure from outside an engine; the rest of the
/// schema (queue, prefill and decode time, KV cache, steps, device time,
/// preemptions, waiting requests) is left unregistered, so absent.
/// `num_requests_running` is the number of requests in flight through the
/// proxy (waiting for an upstream slot included); `admission_rejections`
/// counts its tenants' limits (`reason="tenant_limit"`).
pub const PROXY_METRICS: &[MetricDef] = &[
    schema::NUM_REQUESTS_RUNNING,
    schema::PROMPT_TOKENS,
    schema::GENERATION_TOKENS,
    schema::REQUEST_SUCCESS,
    schema::TIME_TO_FIRST_TOKEN,
    schema::INTER_TOKEN_LATENCY,
    schema::TIME_PER_OUTPUT_TOKEN,
    schema::E2E_REQUEST_LATENCY,
    schema::REQUEST_PROMPT_TOKENS,
    schema::REQUEST_GENERATION_TOKENS,
    schema::REQUEST_PARAMS_MAX_TOKENS,
    schema::REQUEST_MAX_NUM_GENERATION_TOKENS,
    schema::REQUEST_PARAMS_N,
    schema::ADMISSION_REJECTIONS,
    schema::TENANT_LABELS_FOLDED,
];

/// The proxy's [`inferscope_metrics::MetricFilter`]: [`PROXY_METRICS`] only.
pub fn measurable_by_proxy(def: &MetricDef) -> bool {
    PROXY_METRICS.iter().any(|d| d.name == def.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_boundaries() {
        assert_eq!(event_end(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(event_end(b"data: x\r\n\r\ndata"), Some(11));
        assert_eq!(event_end(b"data: x\n"), None);
        assert_eq!(&*event_data(b"data: {\"a\":1}\n\n"), b"{\"a\":1}");
        assert_eq!(&*event_data(b"event: e\ndata:a\ndata: b\n\n"), b"a\nb");
        assert_eq!(&*event_data(b": comment\n\n"), b"");
    }

    #[test]
    fn null_usage_removed() {
        let e = br#"data: {"id":"x","choices":[],"usage":null}"#;
        assert_eq!(
            without_null_usage(e).unwrap(),
            br#"data: {"id":"x","choices":[]}"#
        );
        let e = br#"data: {"usage":null,"id":"x"}"#;
        assert_eq!(without_null_usage(e).unwrap(), br#"data: {"id":"x"}"#);
        let e = br#"data: {"usage": null}"#;
        assert_eq!(without_null_usage(e).unwrap(), br#"data: {}"#);
        assert!(without_null_usage(br#"data: {"text":"\"usage\":null"}"#).is_none());
    }

    #[test]
    fn request_view_and_injection() {
        let body = br#"{"stream":true,"max_completion_tokens":7,"n":2,"model":"m"}"#;
        let r = RequestView::parse(body).unwrap();
        assert_eq!(
            (
                r.stream,
                r.include_usage,
                r.max_tokens,
                r.n,
                r.model.as_deref()
            ),
            (true, false, Some(7), 2, Some("m"))
        );
        // No stream_options: spliced in as bytes, the rest untouched.
        let out = with_usage_requested(body, &r).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"stream_options":{"include_usage":true},"stream":true,"max_completion_tokens":7,"n":2,"model":"m"}"#
        );
        assert!(RequestView::parse(&out).unwrap().include_usage);
        let empty = b" { } ";
        let out = with_usage_requested(empty, &RequestView::parse(empty).unwrap()).unwrap();
        assert_eq!(&out, br#" {"stream_options":{"include_usage":true} } "#);
        // An object: re-serialised with the member set, other members kept.
        let obj = br#"{"stream":true,"stream_options":{"continuous_usage_stats":true}}"#;
        let out = with_usage_requested(obj, &RequestView::parse(obj).unwrap()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["stream_options"]["continuous_usage_stats"], true);
        // Not an object: left for the upstream to refuse.
        let bad = br#"{"stream":true,"stream_options":3}"#;
        assert!(with_usage_requested(bad, &RequestView::parse(bad).unwrap()).is_none());
        // Mistyped fields read as defaults; a body that is no object, as none.
        let odd = RequestView::parse(br#"{"stream":"yes","n":-1,"model":5}"#).unwrap();
        assert_eq!((odd.stream, odd.n, odd.model), (false, 1, None));
        assert!(RequestView::parse(b"{not json").is_none());
    }

    use inferscope_schema::schema as s;

    fn metrics() -> (inferscope_metrics::StatLoggerManager, FrontendRecorder) {
        let m = inferscope_metrics::StatLoggerManager::new(inferscope_metrics::MetricsConfig {
            model_name: "m".into(),
            enable_log_stats: false,
            ..Default::default()
        })
        .unwrap();
        let e = m.frontend(0).unwrap();
        (m, e)
    }

    fn count(m: &inferscope_metrics::StatLoggerManager, series: &str) -> f64 {
        let (_, text) = m.render(inferscope_metrics::Format::Prometheus);
        let e = inferscope_schema::promtext::parse(&text).unwrap();
        inferscope_schema::promtext::sum(e.samples(), series, &[])
    }

    /// Feeds `events` (SSE payloads) through an observed body as one frame.
    fn observe_stream(recorder: &FrontendRecorder, n: u64, events: &[&str]) {
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let view = RequestView {
            stream: true,
            n,
            ..RequestView::default()
        };
        let observer = Observer::new(recorder.clone(), Instant::now(), view);
        let mut b = ObservedBody::new(
            http_body_util::Full::new(Bytes::from(body)),
            BodyKind::Sse { strip_usage: false },
            observer,
            Outcome::Complete,
        );
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        while let Poll::Ready(Some(_)) = Pin::new(&mut b).poll_frame(&mut cx) {}
    }

    #[test]
    fn inter_token_samples_follow_the_running_usage_total() {
        let (m, e) = metrics();
        // Usage on every chunk (continuous usage stats): 1, then +2, then +3
        // tokens: 5 inter-token gaps after the first token, not 2 chunks.
        observe_stream(
            &e,
            1,
            &[
                r#"{"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
                r#"{"choices":[{"index":0,"text":"bc"}],"usage":{"prompt_tokens":3,"completion_tokens":3}}"#,
                r#"{"choices":[{"index":0,"text":"def","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":6}}"#,
                "[DONE]",
            ],
        );
        assert_eq!(
            count(
                &m,
                &format!(
                    "{}_count",
                    s::INTER_TOKEN_LATENCY.exposed_name("inferscope")
                )
            ),
            5.0
        );
        assert_eq!(
            count(&m, &s::GENERATION_TOKENS.exposed_name("inferscope")),
            6.0
        );
        // Without usage per chunk: one sample per chunk after the first.
        observe_stream(
            &e,
            1,
            &[
                r#"{"choices":[{"index":0,"text":"a"}]}"#,
                r#"{"choices":[{"index":0,"text":"bc","finish_reason":"stop"}]}"#,
            ],
        );
        assert_eq!(
            count(
                &m,
                &format!(
                    "{}_count",
                    s::INTER_TOKEN_LATENCY.exposed_name("inferscope")
                )
            ),
            6.0
        );
    }

    #[test]
    fn each_choice_is_a_request() {
        let (m, e) = metrics();
        observe_stream(
            &e,
            2,
            &[
                r#"{"choices":[{"index":0,"text":"a"}]}"#,
                r#"{"choices":[{"index":1,"text":"b"}]}"#,
                r#"{"choices":[{"index":1,"text":"c","finish_reason":"length"}]}"#,
                r#"{"choices":[{"index":0,"text":"d"}]}"#,
                r#"{"choices":[{"index":0,"text":"e","finish_reason":"stop"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":5}}"#,
            ],
        );
        let ok = |r: &str| {
            let (_, text) = m.render(inferscope_metrics::Format::Prometheus);
            let e = inferscope_schema::promtext::parse(&text).unwrap();
            inferscope_schema::promtext::sum(
                e.samples(),
                &s::REQUEST_SUCCESS.exposed_name("inferscope"),
                &[("finished_reason", r)],
            )
        };
        assert_eq!((ok("stop"), ok("length"), ok("error")), (1.0, 1.0, 0.0));
        assert_eq!(
            count(
                &m,
                &format!(
                    "{}_count",
                    s::TIME_TO_FIRST_TOKEN.exposed_name("inferscope")
                )
            ),
            2.0
        );
        // 3 gaps: two in choice 0, one in choice 1 (not 4 across choices).
        assert_eq!(
            count(
                &m,
                &format!(
                    "{}_count",
                    s::INTER_TOKEN_LATENCY.exposed_name("inferscope")
                )
            ),
            3.0
        );
        assert_eq!(count(&m, &s::PROMPT_TOKENS.exposed_name("inferscope")), 8.0);
        assert_eq!(
            count(&m, &s::GENERATION_TOKENS.exposed_name("inferscope")),
            5.0
        );
        // Chunks add up to the total: each choice's own count (3 and 2).
        assert_eq!(
            count(
                &m,
                &format!(
                    "{}_sum",
                    s::REQUEST_GENERATION_TOKENS.exposed_name("inferscope")
                )
            ),
            5.0
        );
        assert_eq!(
            count(
                &m,
                &format!(
                    "{}_count",
                    s::REQUEST_GENERATION_TOKENS.exposed_name("inferscope")
                )
            ),
            2.0
        );
    }

    #[test]
    fn finish_reasons() {
        assert_eq!(finish_reason("length"), FinishReason::Length);
        assert_eq!(finish_reason("tool_calls"), FinishReason::Stop);
        assert_eq!(finish_reason("stop"), FinishReason::Stop);
    }

    #[test]
    fn only_measurable_metrics() {
        assert!(measurable_by_proxy(&schema::TIME_TO_FIRST_TOKEN));
        assert!(!measurable_by_proxy(&schema::KV_CACHE_USAGE_PERC));
        assert!(!measurable_by_proxy(&schema::REQUEST_QUEUE_TIME));
        assert!(!measurable_by_proxy(&schema::DEVICE_BUSY_SECONDS));
    }
}
