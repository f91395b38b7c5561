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

    /// This choice's figures in the response's `metrics` shape (the
    /// request log's line for it).
    pub fn response_metrics(&self) -> ResponseMetrics {
        RequestTimings::of([self]).response_metrics()
    }
}

/// The timings of a whole request, over its choices: with `n` > 1 (or a
/// batch of prompts) the request waits until its first choice is scheduled,
/// has its first token when any choice does and ends with its last choice.
/// With one choice every figure is that choice's, bit for bit.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestTimings {
    ttft: Option<Duration>,
    e2e: Duration,
    queue: Duration,
    prefill: Duration,
    decode: Duration,
    inference: Duration,
    num_preemptions: u64,
    completion_tokens: usize,
    /// Sum of the choices' decode gaps (e2e − TTFT) and their count
    /// (tokens − 1): the mean inter-token latency over all the choices' gaps.
    gap_time: Duration,
    gaps: usize,
}

impl RequestTimings {
    /// The request made of `choices` (all measured from the same arrival).
    pub fn of<'a>(choices: impl IntoIterator<Item = &'a ChoiceTimings>) -> Self {
        let mut r = Self {
            ttft: None,
            e2e: Duration::ZERO,
            queue: Duration::MAX,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            inference: Duration::ZERO,
            num_preemptions: 0,
            completion_tokens: 0,
            gap_time: Duration::ZERO,
            gaps: 0,
        };
        // Engine-side instants as offsets from the arrival.
        let mut first_token = Duration::MAX;
        let mut last_token = Duration::ZERO;
        let mut finished = Duration::ZERO;
        for c in choices {
            r.ttft = match (r.ttft, c.ttft) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            r.e2e = r.e2e.max(c.e2e);
            r.queue = r.queue.min(c.queue);
            let ft = c.queue + c.prefill;
            first_token = first_token.min(ft);
            last_token = last_token.max(ft + c.decode);
            finished = finished.max(c.queue + c.inference);
            r.num_preemptions += c.num_preemptions;
            r.completion_tokens += c.completion_tokens;
            // The gaps `time_per_output_token` averages, as the histogram does.
            if let Some(ttft) = c.ttft
                && c.completion_tokens > 1
            {
                r.gap_time += c.e2e.saturating_sub(ttft);
                r.gaps += c.completion_tokens - 1;
            }
        }
        if r.queue == Duration::MAX {
            // No choice at all.
            r.queue = Duration::ZERO;
            first_token = Duration::ZERO;
        }
        r.prefill = first_token.saturating_sub(r.queue);
        r.decode = last_token.saturating_sub(first_token);
        r.inference = finished.saturating_sub(r.queue);
        r
    }

    /// Mean time between output tokens after the first, over every choice's
    /// gaps, in seconds (0 when no choice has two tokens).
    fn mean_itl(&self) -> f64 {
        if self.gaps == 0 {
            0.0
        } else {
            self.gap_time.as_secs_f64() / self.gaps as f64
        }
    }

    /// The response's `metrics` object.
    pub fn response_metrics(&self) -> ResponseMetrics {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let e2e = self.e2e.as_secs_f64();
        ResponseMetrics {
            time_to_first_token_ms: self.ttft.map(ms),
            generation_time_ms: ms(self.e2e),
            queue_time_ms: ms(self.queue),
            mean_itl_ms: self.mean_itl() * 1e3,
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
        headers.insert("x-time-per-token", ms(self.mean_itl()));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn choice(
        ttft: u64,
        e2e: u64,
        queue: u64,
        prefill: u64,
        decode: u64,
        tokens: usize,
    ) -> ChoiceTimings {
        ChoiceTimings {
            ttft: Some(ms(ttft)),
            e2e: ms(e2e),
            queue: ms(queue),
            prefill: ms(prefill),
            decode: ms(decode),
            inference: ms(prefill + decode + 1),
            num_preemptions: 1,
            completion_tokens: tokens,
        }
    }

    #[test]
    fn one_choice_is_its_own_request() {
        let c = choice(30, 130, 10, 19, 100, 11);
        let m = RequestTimings::of([&c]).response_metrics();
        assert_eq!(m.time_to_first_token_ms, Some(30.0));
        assert_eq!(m.generation_time_ms, 130.0);
        assert_eq!(m.queue_time_ms, 10.0);
        assert_eq!(m.prefill_time_ms, 19.0);
        assert_eq!(m.decode_time_ms, 100.0);
        // Bit for bit what the TPOT histogram observed.
        assert_eq!(m.mean_itl_ms, c.time_per_output_token() * 1e3);
        assert_eq!(m.num_preemptions, 1);
    }

    #[test]
    fn several_choices_span_all_of_them() {
        // Choice a: scheduled at 10, first token at 30, last at 130, 11 tokens.
        // Choice b: scheduled at 12, first token at 20, last at 80, 4 tokens.
        let a = choice(31, 131, 10, 20, 100, 11);
        let b = choice(21, 82, 12, 8, 60, 4);
        let r = RequestTimings::of([&a, &b]);
        let m = r.response_metrics();
        assert_eq!(m.time_to_first_token_ms, Some(21.0));
        assert_eq!(m.generation_time_ms, 131.0);
        assert_eq!(m.queue_time_ms, 10.0);
        assert_eq!(
            m.prefill_time_ms, 10.0,
            "from the first scheduling to the first token"
        );
        assert_eq!(m.decode_time_ms, 110.0, "first token 20 to last token 130");
        assert_eq!(m.num_preemptions, 2);
        // All 13 gaps: (131 - 31) + (82 - 21) ms.
        assert!(
            (m.mean_itl_ms - 161.0 / 13.0).abs() < 1e-9,
            "{}",
            m.mean_itl_ms
        );
        assert!((m.tokens_per_second - 15.0 / 0.131).abs() < 1e-9);
        let mut h = HeaderMap::new();
        r.insert_headers(&mut h);
        assert_eq!(h["x-total-time"], "131");
        assert_eq!(h["x-queue-time"], "10");
        // Inference: scheduled at 10, last finish at 12 + 8 + 60 + 1 = 81 or 10 + 121 = 131.
        assert_eq!(h["x-inference-time"], "121");
    }
}
