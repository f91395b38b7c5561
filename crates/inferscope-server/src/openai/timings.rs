//! Per-request timings handed back to the client that asks for them
//! (`--enable-per-request-metrics` and `"include_metrics": true`): the
//! `metrics` object of the response, in vLLM's keys plus inferscope's, and
//! TGI's timing headers. Every figure is the very value the server's
//! histograms observed for the request, so the two always agree.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use inferscope_engine::RequestTimeline;
use inferscope_metrics::prometheus::time_per_output_token;
use inferscope_schema::FrontendRequestStats;
use serde::Serialize;

/// What one choice's life cost, measured by the front end (TTFT, e2e) and
/// the engine (queue, prefill, decode, inference).
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceTimings {
    /// Arrival to the first delta handed to the response
    /// (`time_to_first_token_seconds`).
    pub ttft: Option<Duration>,
    /// Arrival to the final delta (`e2e_request_latency_seconds`).
    pub e2e: Duration,
    /// Arrival to first scheduled (`request_queue_time_seconds`).
    pub queue: Duration,
    /// First scheduled to first token (`request_prefill_time_seconds`).
    pub prefill: Duration,
    /// First token to last token (`request_decode_time_seconds`).
    pub decode: Duration,
    /// First scheduled to finished (`request_inference_time_seconds`).
    pub inference: Duration,
    /// Times the engine preempted the request.
    pub num_preemptions: u64,
    /// Tokens generated.
    pub completion_tokens: usize,
}

impl ChoiceTimings {
    /// The timings of a choice the engine finished with `timeline`.
    pub fn new(
        ttft: Option<Duration>,
        e2e: Duration,
        timeline: Option<&RequestTimeline>,
        num_preemptions: u64,
        completion_tokens: usize,
    ) -> Self {
        let engine = |f: fn(&RequestTimeline) -> Duration| timeline.map(f).unwrap_or_default();
        Self {
            ttft,
            e2e,
            queue: engine(RequestTimeline::queue_time),
            prefill: engine(RequestTimeline::prefill_time),
            decode: engine(RequestTimeline::decode_time),
            inference: engine(RequestTimeline::inference_time),
            num_preemptions,
            completion_tokens,
        }
    }

    /// (e2e − TTFT) / (tokens − 1) in seconds, as `request_time_per_output_token_seconds`.
    pub fn time_per_output_token(&self) -> f64 {
        time_per_output_token(&FrontendRequestStats {
            ttft: self.ttft,
            e2e: self.e2e,
            num_generation_tokens: self.completion_tokens,
        })
    }

    /// The response's `metrics` object.
    pub fn response_metrics(&self) -> ResponseMetrics {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let e2e = self.e2e.as_secs_f64();
        ResponseMetrics {
            time_to_first_token_ms: self.ttft.map(ms),
            generation_time_ms: ms(self.e2e),
            queue_time_ms: ms(self.queue),
            mean_itl_ms: self.time_per_output_token() * 1e3,
            tokens_per_second: if e2e > 0.0 {
                self.completion_tokens as f64 / e2e
            } else {
                0.0
            },
            prefill_time_ms: ms(self.prefill),
            decode_time_ms: ms(self.decode),
            num_preemptions: self.num_preemptions,
        }
    }

    /// TGI's timing headers, whole milliseconds: `x-queue-time`,
    /// `x-inference-time`, `x-time-per-token`, `x-total-time`.
    pub fn insert_headers(&self, headers: &mut HeaderMap) {
        let ms = |secs: f64| HeaderValue::from((secs * 1e3).round() as u64);
        headers.insert("x-queue-time", ms(self.queue.as_secs_f64()));
        headers.insert("x-inference-time", ms(self.inference.as_secs_f64()));
        headers.insert("x-time-per-token", ms(self.time_per_output_token()));
        headers.insert("x-total-time", ms(self.e2e.as_secs_f64()));
    }
}

/// `metrics` in a response: vLLM's keys, then inferscope's (milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponseMetrics {
    /// Arrival to the first token handed to the response; null when none was.
    pub time_to_first_token_ms: Option<f64>,
    /// Arrival to the last token (the end-to-end latency).
    pub generation_time_ms: f64,
    /// Time waiting before first being scheduled.
    pub queue_time_ms: f64,
    /// Mean time between output tokens after the first: (e2e − TTFT) / (tokens − 1).
    pub mean_itl_ms: f64,
    /// Generated tokens over the end-to-end time.
    pub tokens_per_second: f64,
    /// First scheduled to first token.
    pub prefill_time_ms: f64,
    /// First token to last token.
    pub decode_time_ms: f64,
    /// Times the engine preempted the request.
    pub num_preemptions: u64,
}
