//! A request's span, recorded while it runs (a few fields, one entry per
//! choice) and turned into OTLP spans on the export task.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use inferscope_engine::{FinishReason, RequestTimeline};
use opentelemetry::trace::{Event, SpanContext, SpanId, SpanKind, Status, TraceFlags};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks};

use super::{REQUEST_SPAN_NAME, TraceContext, Traces};
use crate::features::RequestFeatures;

/// What is known of a request when its span starts.
#[derive(Debug, Clone)]
pub struct SpanStart {
    /// `gen_ai.operation.name`: `chat` or `text_completion`.
    pub operation: &'static str,
    /// The matched route (`http.route`).
    pub route: &'static str,
}

/// The request parameters the span carries (vLLM's `gen_ai.request.*`).
#[derive(Debug, Clone)]
struct Params {
    model: String,
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    n: usize,
}

/// One engine request (choice) as it ended.
#[derive(Debug, Clone)]
struct Choice {
    index: usize,
    reason: FinishReason,
    completion_tokens: usize,
    timeline: Option<RequestTimeline>,
}

/// The span of one sampled request. Dropping it unfinished (the client went
/// away, the handler was cancelled) still exports it, as aborted.
pub struct RequestSpan {
    traces: Arc<Traces>,
    /// Boxed: a span (sampled or not) rides in every generation request's
    /// future, which is moved a few times as it starts; a pointer moves
    /// cheaper than the 400-odd bytes of the record.
    record: Option<Box<SpanRecord>>,
}

/// Everything the export task needs to build the request's spans.
#[derive(Debug)]
pub(super) struct SpanRecord {
    cx: TraceContext,
    arrival: Instant,
    arrival_wall: SystemTime,
    start: SpanStart,
    request_id: Option<String>,
    params: Option<Params>,
    /// Who sent it (`inferscope.tenant`): the tenant's name, never its key.
    tenant: Option<Arc<str>>,
    /// Which optional features it used (`inferscope.request.*`).
    features: RequestFeatures,
    choices: Vec<Choice>,
    usage: Option<(usize, usize)>,
    status_code: Option<u16>,
    /// `error.type` and the status message, when it failed.
    error: Option<(Cow<'static, str>, String)>,
    end: Instant,
}

impl RequestSpan {
    pub(super) fn new(
        traces: Arc<Traces>,
        cx: TraceContext,
        arrival: Instant,
        arrival_wall: SystemTime,
        start: SpanStart,
    ) -> Self {
        Self {
            traces,
            record: Some(Box::new(SpanRecord {
                cx,
                arrival,
                arrival_wall,
                start,
                request_id: None,
                tenant: None,
                features: RequestFeatures::default(),
                params: None,
                choices: Vec::new(),
                usage: None,
                status_code: None,
                error: None,
                end: arrival,
            })),
        }
    }

    fn rec(&mut self) -> &mut SpanRecord {
        // Only `end` and `drop` take the record, and both consume the span.
        self.record.as_mut().expect("a live span has its record")
    }

    /// The request id and what the request asked for.
    pub fn set_request(
        &mut self,
        request_id: &str,
        model: &str,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        n: usize,
    ) {
        let r = self.rec();
        r.request_id = Some(request_id.to_owned());
        r.params = Some(Params {
            model: model.to_owned(),
            max_tokens,
            temperature,
            top_p,
            n,
        });
    }

    /// Which optional features the request used (log-probabilities,
    /// structured output, tools).
    pub fn set_features(&mut self, features: RequestFeatures) {
        self.rec().features = features;
    }

    /// The request's tenant (its name; `anonymous` when none).
    pub fn set_tenant(&mut self, tenant: Arc<str>) {
        self.rec().tenant = Some(tenant);
    }

    /// The HTTP status of the response.
    pub fn set_status_code(&mut self, code: u16) {
        self.rec().status_code = Some(code);
    }

    /// One choice ended with the engine's timeline (none when the engine
    /// dropped it without a finish).
    pub fn choice_finished(
        &mut self,
        index: usize,
        reason: FinishReason,
        completion_tokens: usize,
        timeline: Option<RequestTimeline>,
    ) {
        self.rec().choices.push(Choice {
            index,
            reason,
            completion_tokens,
            timeline,
        });
    }

    /// The usage the response reported.
    pub fn set_usage(&mut self, prompt_tokens: usize, completion_tokens: usize) {
        self.rec().usage = Some((prompt_tokens, completion_tokens));
    }

    /// Marks the request failed: `error_type` is `error.type` (low
    /// cardinality), `message` the status description.
    pub fn set_error(
        &mut self,
        error_type: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) {
        self.rec().error = Some((error_type.into(), message.into()));
    }

    /// Ends the span now and queues it for export.
    pub fn end(mut self) {
        self.submit();
    }

    fn submit(&mut self) {
        if let Some(mut r) = self.record.take() {
            r.end = Instant::now();
            self.traces.queue.submit(*r);
        }
    }
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        if let Some(r) = self.record.as_mut()
            && r.error.is_none()
        {
            r.error = Some((
                "abort".into(),
                "the request was aborted before it finished (client disconnected)".into(),
            ));
        }
        self.submit();
    }
}

/// Converts monotonic instants of one request to wall-clock times.
struct Clock {
    arrival: Instant,
    arrival_wall: SystemTime,
}

impl Clock {
    fn wall(&self, t: Instant) -> SystemTime {
        match t.checked_duration_since(self.arrival) {
            Some(d) => self.arrival_wall + d,
            None => self.arrival_wall - self.arrival.duration_since(t),
        }
    }
}

fn secs(later: Option<Instant>, earlier: Option<Instant>) -> Option<f64> {
    Some(later?.saturating_duration_since(earlier?).as_secs_f64())
}

impl SpanRecord {
    /// How many spans it becomes (for the dropped-spans count).
    pub(super) fn span_count(&self) -> u64 {
        1 + self
            .choices
            .iter()
            .map(|c| match &c.timeline {
                // queued + prefill chunks + decode
                Some(t) => 2 + t.prefill_chunks.len() as u64,
                None => 0,
            })
            .sum::<u64>()
    }

    /// The request span and its children, ready for the exporter.
    pub(super) fn into_spans(
        self,
        scope: &InstrumentationScope,
        ids: &RandomIdGenerator,
        out: &mut Vec<SpanData>,
    ) {
        let clock = Clock {
            arrival: self.arrival,
            arrival_wall: self.arrival_wall,
        };
        let cx = &self.cx.span;
        let mut attrs = Vec::with_capacity(32);
        let mut events = Vec::new();
        attrs.push(KeyValue::new("gen_ai.operation.name", self.start.operation));
        attrs.push(KeyValue::new("http.route", self.start.route));
        attrs.push(KeyValue::new("http.request.method", "POST"));
        if let Some(code) = self.status_code {
            attrs.push(KeyValue::new("http.response.status_code", i64::from(code)));
        }
        if let Some(id) = &self.request_id {
            attrs.push(KeyValue::new("gen_ai.request.id", id.clone()));
        }
        if let Some(t) = &self.tenant {
            attrs.push(KeyValue::new("inferscope.tenant", t.to_string()));
        }
        if let Some(p) = &self.params {
            attrs.push(KeyValue::new("gen_ai.request.model", p.model.clone()));
            attrs.push(KeyValue::new("gen_ai.response.model", p.model.clone()));
            attrs.push(KeyValue::new(
                "gen_ai.request.max_tokens",
                p.max_tokens as i64,
            ));
            attrs.push(KeyValue::new(
                "gen_ai.request.temperature",
                f64::from(p.temperature),
            ));
            attrs.push(KeyValue::new("gen_ai.request.top_p", f64::from(p.top_p)));
            attrs.push(KeyValue::new("gen_ai.request.n", p.n as i64));
        }
        // Only the features used: a plain request's span carries none of them.
        let f = &self.features;
        for (key, value) in [
            ("inferscope.request.logprobs", f.logprobs),
            ("inferscope.request.prompt_logprobs", f.prompt_logprobs),
            ("inferscope.request.tools", f.tools),
        ] {
            if let Some(v) = value {
                attrs.push(KeyValue::new(key, i64::try_from(v).unwrap_or(i64::MAX)));
            }
        }
        for (key, value) in [
            ("inferscope.request.structured_output", f.structured_output),
            ("inferscope.request.tool_choice", f.tool_choice),
        ] {
            if let Some(v) = value {
                attrs.push(KeyValue::new(key, v));
            }
        }
        if let Some((prompt, completion)) = self.usage {
            for (k, v) in [
                ("gen_ai.usage.prompt_tokens", prompt),
                ("gen_ai.usage.input_tokens", prompt),
                ("gen_ai.usage.completion_tokens", completion),
                ("gen_ai.usage.output_tokens", completion),
            ] {
                attrs.push(KeyValue::new(k, v as i64));
            }
        }
        if !self.choices.is_empty() {
            let reasons: Vec<opentelemetry::StringValue> = self
                .choices
                .iter()
                .map(|c| c.reason.as_str().into())
                .collect();
            attrs.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(reasons.into()),
            ));
        }
        // vLLM's latency attributes. With several choices (`n` > 1) the
        // request is one span, so its phases span the choices: it leaves the
        // queue when its first choice is scheduled, has its first token when
        // any choice does, and ends with its last choice.
        let timelines = || self.choices.iter().filter_map(|c| c.timeline.as_ref());
        let arrival = timelines().map(|t| t.arrival).min();
        let first_scheduled = timelines().filter_map(|t| t.first_scheduled).min();
        let first_token = timelines().filter_map(|t| t.first_token).min();
        let last_token = timelines().filter_map(|t| t.last_token).max();
        let finished = timelines().filter_map(|t| t.finished).max();
        for (k, v) in [
            (
                "gen_ai.latency.time_in_queue",
                secs(first_scheduled, arrival),
            ),
            (
                "gen_ai.latency.time_to_first_token",
                secs(first_token, arrival),
            ),
            ("gen_ai.latency.e2e", secs(finished, arrival)),
            (
                "gen_ai.latency.time_in_model_prefill",
                secs(first_token, first_scheduled),
            ),
            (
                "gen_ai.latency.time_in_model_decode",
                secs(last_token, first_token),
            ),
            (
                "gen_ai.latency.time_in_model_inference",
                secs(finished, first_scheduled),
            ),
        ] {
            if let Some(v) = v {
                attrs.push(KeyValue::new(k, v));
            }
        }
        let preemptions: usize = self
            .choices
            .iter()
            .filter_map(|c| c.timeline.as_ref())
            .map(|t| t.preemptions.len())
            .sum();
        attrs.push(KeyValue::new(
            "inferscope.num_preemptions",
            preemptions as i64,
        ));

        let request_ctx = SpanContext::new(
            cx.trace_id(),
            cx.span_id(),
            TraceFlags::SAMPLED,
            false,
            cx.trace_state().clone(),
        );
        let mut end_wall = clock.wall(self.end);
        for c in &self.choices {
            let Some(t) = &c.timeline else { continue };
            let choice_attr = KeyValue::new("gen_ai.choice.index", c.index as i64);
            let child =
                |name: &'static str, start: Instant, end: Instant, mut attrs: Vec<KeyValue>| {
                    attrs.push(choice_attr.clone());
                    SpanData {
                        span_context: SpanContext::new(
                            cx.trace_id(),
                            ids.new_span_id(),
                            TraceFlags::SAMPLED,
                            false,
                            cx.trace_state().clone(),
                        ),
                        parent_span_id: cx.span_id(),
                        parent_span_is_remote: false,
                        span_kind: SpanKind::Internal,
                        name: Cow::Borrowed(name),
                        start_time: clock.wall(start),
                        end_time: clock.wall(end.max(start)),
                        attributes: attrs,
                        dropped_attributes_count: 0,
                        events: SpanEvents::default(),
                        links: SpanLinks::default(),
                        status: Status::Unset,
                        instrumentation_scope: scope.clone(),
                    }
                };
            let finished = t.finished.unwrap_or(self.end);
            out.push(child(
                "queued",
                t.arrival,
                t.first_scheduled.unwrap_or(finished),
                Vec::new(),
            ));
            let first_preemption = t.preemptions.first().copied();
            for (k, chunk) in t.prefill_chunks.iter().enumerate() {
                let mut a = vec![
                    KeyValue::new("inferscope.prefill.chunk", k as i64),
                    KeyValue::new("inferscope.prefill.tokens", chunk.num_tokens as i64),
                ];
                if first_preemption.is_some_and(|p| chunk.start >= p) {
                    a.push(KeyValue::new("inferscope.prefill.recompute", true));
                }
                out.push(child("prefill", chunk.start, chunk.end, a));
            }
            if let Some(first) = t.first_token {
                out.push(child(
                    "decode",
                    first,
                    finished,
                    vec![KeyValue::new(
                        "gen_ai.usage.output_tokens",
                        c.completion_tokens as i64,
                    )],
                ));
            }
            for (k, &p) in t.preemptions.iter().enumerate() {
                events.push(Event::new(
                    "preempted",
                    clock.wall(p),
                    vec![
                        KeyValue::new("inferscope.preemptions.count", (k + 1) as i64),
                        choice_attr.clone(),
                    ],
                    0,
                ));
            }
            events.push(Event::new(
                "finished",
                clock.wall(finished),
                vec![
                    KeyValue::new("gen_ai.response.finish_reason", c.reason.as_str()),
                    choice_attr.clone(),
                ],
                0,
            ));
            end_wall = end_wall.max(clock.wall(finished));
        }
        let status = match &self.error {
            Some((kind, message)) => {
                attrs.push(KeyValue::new("error.type", kind.clone()));
                Status::error(message.clone())
            }
            None => Status::Ok,
        };
        // A non-exhaustive struct with public fields.
        let mut span_events = SpanEvents::default();
        span_events.events = events;
        out.push(SpanData {
            span_context: request_ctx,
            parent_span_id: self.cx.parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: self.cx.parent.is_some(),
            span_kind: SpanKind::Server,
            name: Cow::Borrowed(REQUEST_SPAN_NAME),
            start_time: clock.arrival_wall,
            end_time: end_wall,
            attributes: attrs,
            dropped_attributes_count: 0,
            events: span_events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope.clone(),
        });
    }
}
