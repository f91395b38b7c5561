//! Response shaping: a generation's choice events into one JSON body or an
//! SSE stream, in the shapes of the API the request came in on.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use inferscope_engine::FinishReason;

use crate::error::ApiError;
use crate::openai::infer::{ChoiceDelta, ChoiceFinish, CompletedChoice, Generation};
use crate::openai::protocol::{
    ChatChoice, ChatDelta, ChatLogprobs, CompletionChoice, CompletionLogprobs, PromptLogprobsJson,
    ResponseBody, Usage,
};
use crate::openai::validation::LogprobsPlan;
use crate::otel::RequestSpan;
use crate::timings::{ChoiceTimings, RequestTimings, ResponseMetrics};

/// Which API a request came in on: decides the response shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// What every chunk of a response shares.
pub struct Shape {
    api: Api,
    id: String,
    model: String,
    created: u64,
    logprobs: LogprobsPlan,
}

impl Shape {
    /// The shape of a response to request `request_id` on `api`, for the
    /// served `model`, created at `created` (unix seconds).
    pub fn new(api: Api, request_id: &str, model: String, created: u64) -> Self {
        let id = match api {
            Api::Completions => format!("cmpl-{request_id}"),
            Api::Chat => format!("chatcmpl-{request_id}"),
        };
        Self {
            api,
            id,
            model,
            created,
            logprobs: LogprobsPlan::default(),
        }
    }

    /// Reports log-probabilities as `plan` says.
    pub fn with_logprobs(mut self, plan: LogprobsPlan) -> Self {
        self.logprobs = plan;
        self
    }

    /// A completion choice's `logprobs` over `tokens`, the first at `offset`.
    fn completion_logprobs<'a>(
        &self,
        tokens: &'a [crate::openai::infer::TokenLogprob],
        offset: usize,
    ) -> Option<CompletionLogprobs<'a>> {
        self.logprobs.tokens.map(|top| CompletionLogprobs {
            tokens,
            top,
            first_offset: offset,
        })
    }

    /// A chat choice's `logprobs` over `tokens`.
    fn chat_logprobs<'a>(
        &self,
        tokens: &'a [crate::openai::infer::TokenLogprob],
    ) -> Option<ChatLogprobs<'a>> {
        self.logprobs.tokens.map(|top| ChatLogprobs { tokens, top })
    }

    /// The envelope around `choices`.
    fn body<'a, C>(
        &'a self,
        object: &'static str,
        choices: &'a [C],
        usage: Option<Usage>,
    ) -> ResponseBody<'a, C> {
        ResponseBody {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices,
            usage,
            metrics: None,
            prompt_logprobs: None,
        }
    }

    /// `object` of a stream chunk.
    fn chunk_object(&self) -> &'static str {
        match self.api {
            Api::Completions => "text_completion",
            Api::Chat => "chat.completion.chunk",
        }
    }

    /// One SSE event carrying `delta` (the first of its choice when `first`;
    /// `offset`: characters of the choice's text already sent).
    fn chunk(&self, d: &ChoiceDelta, first: bool, offset: usize) -> Bytes {
        let finish_reason = d.finish.as_ref().map(|f| f.reason.as_str());
        let object = self.chunk_object();
        // A chunk without tokens (the final one, often) has null logprobs.
        let tokens = (!d.logprobs.is_empty()).then_some(d.logprobs.as_slice());
        match self.api {
            Api::Completions => sse_event(&self.body(
                object,
                &[CompletionChoice {
                    index: d.index,
                    text: &d.text,
                    logprobs: tokens.and_then(|t| self.completion_logprobs(t, offset)),
                    finish_reason,
                    prompt_logprobs: None,
                }],
                None,
            )),
            Api::Chat => sse_event(&self.body(
                object,
                &[ChatChoice {
                    index: d.index,
                    message: None,
                    delta: Some(ChatDelta {
                        role: first.then_some("assistant"),
                        content: (!d.text.is_empty()).then_some(d.text.as_str()),
                    }),
                    logprobs: tokens.and_then(|t| self.chat_logprobs(t)),
                    finish_reason,
                }],
                None,
            )),
        }
    }

    /// The final chunk with usage and/or metrics: empty `choices` (the same
    /// in both APIs).
    fn final_chunk(&self, usage: Option<Usage>, metrics: Option<ResponseMetrics>) -> Bytes {
        let none: &[CompletionChoice] = &[];
        let mut body = self.body(self.chunk_object(), none, usage);
        body.metrics = metrics;
        sse_event(&body)
    }
}

/// `data: <json>\n\n`, serialised straight into the event's one buffer.
fn sse_event(body: &impl serde::Serialize) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    // Serialising these plain structs cannot fail.
    let _ = serde_json::to_writer(&mut out, body);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Streams the choices as SSE. The body is a stream over the choices'
/// events, polled by the connection as it writes: no task, no channel. When
/// the client goes away the body is dropped with the choices, which aborts
/// their engine requests. `span`, when the request is traced, ends with the
/// stream (or as aborted, when dropped).
///
/// With `include_metrics`, the last chunk before `[DONE]` (the usage chunk,
/// or a chunk of its own) carries the request's `metrics`, over all its
/// choices.
pub fn stream(
    shape: Shape,
    generation: Generation,
    include_usage: bool,
    include_metrics: bool,
    mut span: Option<RequestSpan>,
) -> Response {
    if let Some(span) = &mut span {
        span.set_status_code(200);
    }
    let num_choices = generation.choices.len();
    let prompt_tokens = generation.prompt_tokens;
    let events = SseEvents {
        shape,
        events: generation.events(),
        include_usage,
        include_metrics,
        span,
        prompt_tokens,
        started: vec![false; num_choices],
        sent_chars: vec![0; num_choices],
        completion_tokens: 0,
        timings: Vec::new(),
        queued: None,
        ended: false,
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| ApiError::internal("cannot build the stream").into_response())
}

/// An event due after the one just yielded.
enum Queued {
    Event(Bytes),
    Done,
}

/// The SSE events of a streamed response, made as the choices' deltas come.
struct SseEvents<S> {
    shape: Shape,
    /// The choices' deltas; dropping them aborts the engine requests.
    events: S,
    include_usage: bool,
    include_metrics: bool,
    span: Option<RequestSpan>,
    prompt_tokens: usize,
    /// Per choice: whether its first chunk went out.
    started: Vec<bool>,
    /// Per choice: characters of text sent (completions' `text_offset`).
    sent_chars: Vec<usize>,
    completion_tokens: usize,
    timings: Vec<ChoiceTimings>,
    queued: Option<Queued>,
    /// `[DONE]` went out.
    ended: bool,
}

impl<S> SseEvents<S> {
    /// The event for delta `d`; queues the error event that follows a server
    /// abort.
    fn on_delta(&mut self, mut d: ChoiceDelta) -> Bytes {
        if let (Some(span), Some(f)) = (&mut self.span, &mut d.finish) {
            span.choice_finished(d.index, f.reason, f.completion_tokens, f.timeline.take());
        }
        if let Some(f) = &d.finish
            && f.reason == FinishReason::Error
        {
            let message = f
                .error
                .clone()
                .unwrap_or_else(|| "generation failed".into());
            if let Some(span) = &mut self.span {
                span.set_error("engine_error", message.clone());
            }
            self.completion_tokens += f.completion_tokens;
            return sse_event(&ApiError::internal(message).body());
        }
        let slot = d.index % self.started.len().max(1);
        let first = match self.started.get_mut(slot) {
            Some(s) => !std::mem::replace(s, true),
            None => true,
        };
        if let Some(f) = &d.finish {
            self.completion_tokens += f.completion_tokens;
            if self.include_metrics {
                self.timings.push(f.timings.clone());
            }
        }
        let offset = match self.sent_chars.get_mut(slot) {
            // Counted only when reported: no scan of every delta otherwise.
            Some(n) if self.shape.logprobs.tokens.is_some() => {
                let before = *n;
                *n += d.text.chars().count();
                before
            }
            _ => 0,
        };
        let chunk = self.shape.chunk(&d, first, offset);
        // A client still reading did not abort this choice: the server did
        // (shutdown). Say why, so the stream does not just stop.
        if let Some(f) = &d.finish
            && f.reason == FinishReason::Abort
        {
            let message = server_abort_message(f);
            if let Some(span) = &mut self.span {
                span.set_error("abort", message.clone());
            }
            let err = ApiError::unavailable(message);
            self.queued = Some(Queued::Event(sse_event(&err.body())));
        }
        chunk
    }

    /// The final chunk (usage and/or metrics) when asked for, then `[DONE]`.
    fn on_end(&mut self) -> Bytes {
        if let Some(span) = &mut self.span {
            span.set_usage(self.prompt_tokens, self.completion_tokens);
        }
        let metrics = (!self.timings.is_empty())
            .then(|| RequestTimings::of(&self.timings).response_metrics());
        if self.include_usage || metrics.is_some() {
            let usage = self.include_usage.then_some(Usage {
                prompt_tokens: self.prompt_tokens,
                completion_tokens: self.completion_tokens,
                total_tokens: self.prompt_tokens + self.completion_tokens,
            });
            self.queued = Some(Queued::Done);
            return self.shape.final_chunk(usage, metrics);
        }
        self.done()
    }

    /// `[DONE]`, ending the span: the stream is complete.
    fn done(&mut self) -> Bytes {
        self.ended = true;
        if let Some(span) = self.span.take() {
            span.end();
        }
        Bytes::from_static(b"data: [DONE]\n\n")
    }
}

impl<S: Stream<Item = ChoiceDelta> + Unpin> Stream for SseEvents<S> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.queued.take() {
            Some(Queued::Event(b)) => return Poll::Ready(Some(Ok(b))),
            Some(Queued::Done) => return Poll::Ready(Some(Ok(this.done()))),
            None => {}
        }
        if this.ended {
            return Poll::Ready(None);
        }
        let event = match ready!(this.events.poll_next_unpin(cx)) {
            Some(d) => this.on_delta(d),
            None => this.on_end(),
        };
        Poll::Ready(Some(Ok(event)))
    }
}

/// Why the server aborted a choice, with how far it got.
fn server_abort_message(f: &ChoiceFinish) -> String {
    format!(
        "{}; the request was aborted after {} generated tokens",
        f.error
            .as_deref()
            .unwrap_or("the request was aborted by the server"),
        f.completion_tokens
    )
}

/// Waits for every choice and answers with one JSON body; ends `span`, when
/// the request is traced, with the answer's status. With `include_metrics`,
/// the body carries the request's `metrics` (over all its choices) and the
/// response TGI's timing headers.
pub async fn full(
    shape: Shape,
    generation: Generation,
    include_metrics: bool,
    span: Option<RequestSpan>,
) -> Response {
    let prompt_tokens = generation.prompt_tokens;
    let mut results = generation.collect().await;
    let Some(mut span) = span else {
        return full_body(shape, prompt_tokens, results, include_metrics);
    };
    for c in &mut results {
        let f = &mut c.finish;
        span.choice_finished(c.index, f.reason, f.completion_tokens, f.timeline.take());
    }
    let completion_tokens = results.iter().map(|c| c.finish.completion_tokens).sum();
    span.set_usage(prompt_tokens, completion_tokens);
    let failure = results
        .iter()
        .find(|c| matches!(c.finish.reason, FinishReason::Error | FinishReason::Abort))
        .map(|c| {
            let kind = match c.finish.reason {
                FinishReason::Error => "engine_error",
                _ => "abort",
            };
            (kind, c.finish.error.clone().unwrap_or_else(|| kind.into()))
        });
    if let Some((kind, message)) = failure {
        span.set_error(kind, message);
    }
    let response = full_body(shape, prompt_tokens, results, include_metrics);
    span.set_status_code(response.status().as_u16());
    span.end();
    response
}

/// The one JSON body of a non-streamed answer (or its error).
fn full_body(
    shape: Shape,
    prompt_tokens: usize,
    results: Vec<CompletedChoice>,
    include_metrics: bool,
) -> Response {
    if let Some(c) = results
        .iter()
        .find(|c| c.finish.reason == FinishReason::Error)
    {
        return ApiError::internal(
            c.finish
                .error
                .clone()
                .unwrap_or_else(|| "generation failed".into()),
        )
        .into_response();
    }
    // The client is still waiting, so it did not abort: the server did.
    if let Some(c) = results
        .iter()
        .find(|c| c.finish.reason == FinishReason::Abort)
    {
        return ApiError::unavailable(server_abort_message(&c.finish)).into_response();
    }
    let completion_tokens: usize = results.iter().map(|c| c.finish.completion_tokens).sum();
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    };
    let timings = (include_metrics && !results.is_empty())
        .then(|| RequestTimings::of(results.iter().map(|c| &c.finish.timings)));
    let metrics = timings.as_ref().map(|t| t.response_metrics());
    let body = match shape.api {
        Api::Completions => {
            let choices: Vec<_> = results
                .iter()
                .map(|c| CompletionChoice {
                    index: c.index,
                    text: &c.text,
                    logprobs: shape.completion_logprobs(&c.logprobs, 0),
                    finish_reason: Some(c.finish.reason.as_str()),
                    prompt_logprobs: c.prompt_logprobs.as_deref().map(PromptLogprobsJson),
                })
                .collect();
            let mut body = shape.body("text_completion", &choices, Some(usage));
            body.metrics = metrics;
            json_bytes(&body)
        }
        Api::Chat => {
            let choices: Vec<_> = results
                .iter()
                .map(|c| ChatChoice {
                    index: c.index,
                    message: Some(ChatDelta {
                        role: Some("assistant"),
                        content: Some(&c.text),
                    }),
                    delta: None,
                    logprobs: shape.chat_logprobs(&c.logprobs),
                    finish_reason: Some(c.finish.reason.as_str()),
                })
                .collect();
            let mut body = shape.body("chat.completion", &choices, Some(usage));
            body.metrics = metrics;
            // One prompt per chat request: its values are at the top level.
            body.prompt_logprobs = results
                .first()
                .and_then(|c| c.prompt_logprobs.as_deref())
                .map(PromptLogprobsJson);
            json_bytes(&body)
        }
    };
    match body {
        Ok(v) => {
            let mut r = Response::new(Body::from(v));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if let Some(t) = &timings {
                t.insert_headers(r.headers_mut());
            }
            r
        }
        Err(e) => ApiError::internal(format!("cannot encode the response: {e}")).into_response(),
    }
}

/// `body` as JSON, serialised once, straight into the response's buffer.
fn json_bytes(body: &impl serde::Serialize) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(512);
    serde_json::to_writer(&mut out, body)?;
    Ok(out)
}
