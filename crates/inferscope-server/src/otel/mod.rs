//! OpenTelemetry traces of requests: one SERVER span `llm_request` per
//! generation request (vLLM's name and attributes plus the OTel GenAI ones),
//! with child spans for its phases, built after the request ends from the
//! timestamps the engine already records, and exported over OTLP off the
//! request path.
//!
//! The per-request cost with tracing on: parsing `traceparent`, one sampling
//! decision and two random ids at arrival; for a sampled request, one
//! `try_send` of its timings at the end. Everything else (span building,
//! encoding, sending) happens on the export task. With tracing off nothing
//! of this runs.

mod config;
mod export;
mod span;

pub use config::{Protocol, TraceConfig};
pub use span::{RequestSpan, SpanStart};

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::http::{HeaderMap, HeaderValue};
use inferscope_metrics::TraceSpanDrops;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample,
};

use crate::error::ServerError;
use export::ExportQueue;

/// The span name vLLM gives a request.
pub const REQUEST_SPAN_NAME: &str = "llm_request";

/// Request tracing: the sampler, the id generator and the export queue.
pub struct Traces {
    sampler: Sampler,
    ids: RandomIdGenerator,
    propagator: TraceContextPropagator,
    queue: ExportQueue,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces")
            .field("sampler", &self.sampler)
            .finish_non_exhaustive()
    }
}

/// Reads `traceparent` / `tracestate` out of request headers.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// What a request's trace is, decided at its arrival.
#[derive(Debug, Clone)]
pub struct TraceContext {
    /// The request span's context (trace id, span id, sampled flag, tracestate).
    pub span: SpanContext,
    /// The remote parent's span id, when the request carried a valid `traceparent`.
    pub parent: Option<SpanId>,
}

impl TraceContext {
    /// The W3C `traceparent` of the request's span, for the response.
    pub fn traceparent(&self) -> HeaderValue {
        let s = format!(
            "00-{}-{}-{:02x}",
            self.span.trace_id(),
            self.span.span_id(),
            self.span.trace_flags().to_u8()
        );
        // Hex digits and dashes only: always a valid header value.
        HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The trace id, when the request is sampled (its spans will be exported):
    /// what exemplars and request logs may link to.
    pub fn sampled_trace_id(&self) -> Option<[u8; 16]> {
        self.span
            .is_sampled()
            .then(|| self.span.trace_id().to_bytes())
    }
}

impl Traces {
    /// Starts the export task (on the current tokio runtime) for `config`;
    /// `drops` counts the spans that could not be delivered.
    pub fn start(config: &TraceConfig, drops: TraceSpanDrops) -> Result<Arc<Self>, ServerError> {
        let queue = ExportQueue::start(config, drops)?;
        Ok(Arc::new(Self {
            sampler: config.sampler.clone(),
            ids: RandomIdGenerator::default(),
            propagator: TraceContextPropagator::new(),
            queue,
        }))
    }

    /// Tracing with `exporter` instead of OTLP (tests).
    #[cfg(test)]
    fn with_exporter<E: opentelemetry_sdk::trace::SpanExporter + 'static>(
        exporter: E,
        config: &TraceConfig,
        drops: TraceSpanDrops,
    ) -> Arc<Self> {
        Arc::new(Self {
            sampler: config.sampler.clone(),
            ids: RandomIdGenerator::default(),
            propagator: TraceContextPropagator::new(),
            queue: ExportQueue::with_exporter(exporter, config, drops),
        })
    }

    /// The trace of a request that arrived with `headers`: the incoming
    /// `traceparent` (when valid; an all-zero id is not) becomes the parent,
    /// its `tracestate` is kept; without one a new trace starts.
    pub fn context(&self, headers: &HeaderMap) -> TraceContext {
        let cx = self.propagator.extract(&Headers(headers));
        let remote = cx.span().span_context().clone();
        let (trace_id, parent, trace_state) = if remote.is_valid() {
            (
                remote.trace_id(),
                Some(remote.span_id()),
                remote.trace_state().clone(),
            )
        } else {
            (self.ids.new_trace_id(), None, Default::default())
        };
        let parent_cx = parent.is_some().then_some(&cx);
        let decision = self
            .sampler
            .should_sample(
                parent_cx,
                trace_id,
                REQUEST_SPAN_NAME,
                &SpanKind::Server,
                &[],
                &[],
            )
            .decision;
        let flags = match decision {
            SamplingDecision::RecordAndSample => TraceFlags::SAMPLED,
            _ => TraceFlags::default(),
        };
        TraceContext {
            span: SpanContext::new(trace_id, self.ids.new_span_id(), flags, false, trace_state),
            parent,
        }
    }

    /// A recorder for the span of a sampled request that arrived at
    /// `arrival`; `None` when it is not sampled (nothing is recorded).
    pub fn start_span(
        self: &Arc<Self>,
        cx: &TraceContext,
        arrival: Instant,
        start: SpanStart,
    ) -> Option<RequestSpan> {
        cx.span.is_sampled().then(|| {
            RequestSpan::new(
                self.clone(),
                cx.clone(),
                arrival,
                SystemTime::now() - arrival.elapsed(),
                start,
            )
        })
    }

    /// Exports what is queued and stops the export task, waiting at most `timeout`.
    pub async fn shutdown(&self, timeout: std::time::Duration) {
        self.queue.shutdown(timeout).await;
    }
}

#[cfg(test)]
mod tests;
