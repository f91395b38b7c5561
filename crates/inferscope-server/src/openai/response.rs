//! Response shaping: a generation's choice events into one JSON body or an
//! SSE stream, in the shapes of the API the request came in on.

use std::convert::Infallible;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use inferscope_engine::FinishReason;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::openai::generate::{ChoiceDelta, ChoiceFinish, CompletedChoice, Generation};
use crate::openai::protocol::{ChatChoice, ChatDelta, CompletionChoice, ResponseBody, Usage};
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
        }
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
        }
    }

    /// `object` of a stream chunk.
    fn chunk_object(&self) -> &'static str {
        match self.api {
            Api::Completions => "text_completion",
            Api::Chat => "chat.completion.chunk",
        }
    }

    /// One SSE event carrying `delta` (the first of its choice when `first`).
    fn chunk(&self, d: &ChoiceDelta, first: bool) -> Bytes {
        let finish_reason = d.finish.as_ref().map(|f| f.reason.as_str());
        let object = self.chunk_object();
        match self.api {
            Api::Completions => sse_event(&self.body(
                object,
                &[CompletionChoice {
                    index: d.index,
                    text: &d.text,
                    logprobs: None,
                    finish_reason,
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
                    logprobs: None,
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

/// Streams the choices as SSE. A task drives the engine requests and feeds
/// the body; when the client goes away the body is dropped, the task sees
/// the channel close and drops the requests, which aborts them. `span`, when
/// the request is traced, ends with the stream (or as aborted, when dropped).
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
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    if let Some(span) = &mut span {
        span.set_status_code(200);
    }
    tokio::spawn(async move {
        let num_choices = generation.choices.len();
        let prompt_tokens = generation.prompt_tokens;
        let mut started = vec![false; num_choices];
        let mut events = generation.events();
        let mut completion_tokens = 0;
        let mut timings: Vec<ChoiceTimings> = Vec::new();
        loop {
            let delta = tokio::select! {
                _ = tx.closed() => return,
                d = events.next() => d,
            };
            let Some(mut d) = delta else { break };
            if let (Some(span), Some(f)) = (&mut span, &mut d.finish) {
                span.choice_finished(d.index, f.reason, f.completion_tokens, f.timeline.take());
            }
            if let Some(f) = &d.finish
                && f.reason == FinishReason::Error
            {
                let message = f
                    .error
                    .clone()
                    .unwrap_or_else(|| "generation failed".into());
                if let Some(span) = &mut span {
                    span.set_error("engine_error", message.clone());
                }
                let err = ApiError::internal(message);
                let event = sse_event(&err.body());
                if tx.send(event).await.is_err() {
                    return;
                }
                completion_tokens += f.completion_tokens;
                continue;
            }
            let first = !std::mem::replace(&mut started[d.index % num_choices.max(1)], true);
            if let Some(f) = &d.finish {
                completion_tokens += f.completion_tokens;
                if include_metrics {
                    timings.push(f.timings.clone());
                }
            }
            if tx.send(shape.chunk(&d, first)).await.is_err() {
                return;
            }
            // A client still reading did not abort this choice: the server
            // did (shutdown). Say why, so the stream does not just stop.
            if let Some(f) = &d.finish
                && f.reason == FinishReason::Abort
            {
                let message = server_abort_message(f);
                if let Some(span) = &mut span {
                    span.set_error("abort", message.clone());
                }
                let err = ApiError::unavailable(message);
                let event = sse_event(&err.body());
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
        if let Some(span) = &mut span {
            span.set_usage(prompt_tokens, completion_tokens);
        }
        let metrics =
            (!timings.is_empty()).then(|| RequestTimings::of(&timings).response_metrics());
        if include_usage || metrics.is_some() {
            let usage = include_usage.then_some(Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
            });
            if tx.send(shape.final_chunk(usage, metrics)).await.is_err() {
                return;
            }
        }
        if tx
            .send(Bytes::from_static(b"data: [DONE]\n\n"))
            .await
            .is_ok()
            && let Some(span) = span
        {
            span.end();
        }
    });
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<Bytes, Infallible>));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| ApiError::internal("cannot build the stream").into_response())
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
                    logprobs: None,
                    finish_reason: Some(c.finish.reason.as_str()),
                })
                .collect();
            let mut body = shape.body("text_completion", &choices, Some(usage));
            body.metrics = metrics;
            serde_json::to_value(body)
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
                    logprobs: None,
                    finish_reason: Some(c.finish.reason.as_str()),
                })
                .collect();
            let mut body = shape.body("chat.completion", &choices, Some(usage));
            body.metrics = metrics;
            serde_json::to_value(body)
        }
    };
    match body {
        Ok(v) => {
            let mut r = Json(v).into_response();
            if let Some(t) = &timings {
                t.insert_headers(r.headers_mut());
            }
            r
        }
        Err(e) => ApiError::internal(format!("cannot encode the response: {e}")).into_response(),
    }
}
