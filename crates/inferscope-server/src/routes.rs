//! HTTP handlers: the OpenAI routes (full responses and SSE streams),
//! models, health, version, metrics, and the API-key check.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use inferscope_engine::{EngineError, EngineRequest, FinishReason};
use inferscope_metrics::negotiate;
use inferscope_model::IncrementalDecoder;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::app::{AppState, unix_now};
use crate::error::ApiError;
use crate::generation::{ChoiceDelta, ChoiceStream, LatencySink};
use crate::protocol::{ChatChoice, ChatDelta, CompletionChoice, ResponseBody, Usage};
use crate::validation::{self, Plan};

type AppStateRef = State<Arc<AppState>>;

/// Which API a request came in on: decides the response shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Completions,
    Chat,
}

/// `GET /v1/models`.
pub async fn models(State(s): AppStateRef) -> Json<serde_json::Value> {
    let data: Vec<_> = s
        .served_model_names
        .iter()
        .map(|name| {
            json!({
                "id": name,
                "object": "model",
                "created": s.created,
                "owned_by": "inferscope",
                "root": s.model_root,
                "parent": null,
                "max_model_len": s.limits.max_model_len,
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /health`: 200 while every engine core can serve.
pub async fn health(State(s): AppStateRef) -> Response {
    if s.coordinator.is_healthy() {
        return StatusCode::OK.into_response();
    }
    let why: Vec<String> = s
        .coordinator
        .engines()
        .filter(|e| !e.is_alive())
        .map(|e| {
            format!(
                "engine {}: {}",
                e.engine_index,
                e.dead_reason().unwrap_or_else(|| "stopped".into())
            )
        })
        .collect();
    let msg = if why.is_empty() {
        "the server is shutting down".to_owned()
    } else {
        why.join("; ")
    };
    ApiError::unavailable(msg).into_response()
}

/// `GET /version`.
pub async fn version() -> Json<serde_json::Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

/// `GET /metrics`: Prometheus text 0.0.4 or OpenMetrics, by `Accept`.
pub async fn metrics(State(s): AppStateRef, headers: HeaderMap) -> Response {
    if !s.metrics_enabled {
        return ApiError {
            status: StatusCode::NOT_FOUND,
            message: "metrics are disabled (--disable-metrics)".into(),
            kind: "NotFoundError",
            param: None,
        }
        .into_response();
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = s.metrics.render(negotiate(accept));
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Any path no route matches.
pub async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such route".into(),
        kind: "NotFoundError",
        param: None,
    }
}

/// Rejects /v1/* requests without the right bearer token.
pub async fn require_api_key(State(s): AppStateRef, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares without an early exit, so the time taken does not reveal how
/// much of the key matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in b.iter().enumerate() {
        diff |= usize::from(x ^ a.get(i).copied().unwrap_or(!x));
    }
    diff == 0
}

/// `POST /v1/completions`.
pub async fn completions(
    State(s): AppStateRef,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    let result = body_bytes(body)
        .and_then(|b| validation::parse_and_validate_completion(&b, &s.validator()));
    match result {
        Ok(v) => generate(s, Api::Completions, v.model, v.plan, &headers, arrival).await,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(s): AppStateRef,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    let result =
        body_bytes(body).and_then(|b| validation::parse_and_validate_chat(&b, &s.validator()));
    match result {
        Ok(v) => generate(s, Api::Chat, v.model, v.plan, &headers, arrival).await,
        Err(e) => e.into_response(),
    }
}

/// The body, or the extractor's rejection (413 over the limit) as an OpenAI error.
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| ApiError {
        status: rejection.status(),
        message: rejection.body_text(),
        kind: "invalid_request_error",
        param: None,
    })
}

/// The client's `x-request-id` when usable, else a fresh id.
fn request_id(s: &AppState, headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .map(str::to_owned)
        .unwrap_or_else(|| {
            let n = s.next_request.fetch_add(1, Ordering::Relaxed);
            format!("{}-{n:x}", s.id_prefix)
        })
}

/// Admits the request, starts one engine request per prompt and choice,
/// and answers with a full response or an SSE stream.
async fn generate(
    s: Arc<AppState>,
    api: Api,
    model: String,
    plan: Plan,
    headers: &HeaderMap,
    arrival: Instant,
) -> Response {
    let request_id = request_id(&s, headers);
    let n = plan.params.n;
    let total = plan.prompts.len() * n;
    let per_choice: Vec<usize> = plan
        .prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.len(), n))
        .collect();
    let mut reservations = match s.admission.admit(&per_choice, s.coordinator.num_waiting()) {
        Ok(r) => r.into_iter(),
        Err(rejection) => {
            s.metrics.record_admission_rejection(rejection.reason());
            return with_request_id(rejection.to_api_error().into_response(), &request_id);
        }
    };
    let stop: Arc<[String]> = plan.stop.into();
    let prompt_tokens: usize = plan.prompts.iter().map(Vec::len).sum();
    let mut choices = Vec::with_capacity(total);
    for (p, prompt) in plan.prompts.iter().enumerate() {
        for i in 0..n {
            let index = p * n + i;
            let mut params = plan.params.clone();
            params.seed = params.seed.map(|seed| seed.wrapping_add(i as u64));
            let engine_id = if total == 1 {
                request_id.clone()
            } else {
                format!("{request_id}-{index}")
            };
            let handle = match s.coordinator.add_request(EngineRequest {
                request_id: engine_id,
                prompt_token_ids: prompt.clone(),
                params: Arc::new(params),
                arrival,
            }) {
                Ok(h) => h,
                Err(e) => {
                    // Handles already made abort themselves when dropped.
                    let err = match e {
                        EngineError::DuplicateRequestId(id) => ApiError::invalid(
                            format!(
                                "request id `{id}` is already in flight (x-request-id must be unique)"
                            ),
                            None,
                        ),
                        other => ApiError::unavailable(other.to_string()),
                    };
                    return with_request_id(err.into_response(), &request_id);
                }
            };
            let latency = s
                .metrics_enabled
                .then(|| LatencySink::new(s.metrics.clone(), handle.engine))
                .flatten();
            let decoder = IncrementalDecoder::new(s.tokenizer.clone(), prompt);
            let mut choice =
                ChoiceStream::new(index, handle, decoder, stop.clone(), arrival, latency);
            if let Some(r) = reservations.next() {
                choice = choice.with_reservation(r);
            }
            choices.push(choice);
        }
    }
    let response_id = match api {
        Api::Completions => format!("cmpl-{request_id}"),
        Api::Chat => format!("chatcmpl-{request_id}"),
    };
    let shape = Shape {
        api,
        id: response_id,
        model,
        created: unix_now(),
    };
    let response = if plan.stream {
        stream_response(shape, choices, prompt_tokens, plan.include_usage)
    } else {
        full_response(shape, choices, prompt_tokens).await
    };
    with_request_id(response, &request_id)
}

fn with_request_id(mut r: Response, id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(id) {
        r.headers_mut().insert("x-request-id", v);
    }
    r
}

/// What every chunk of a response shares.
struct Shape {
    api: Api,
    id: String,
    model: String,
    created: u64,
}

impl Shape {
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

    /// The final usage chunk: empty `choices` (the same in both APIs).
    fn usage_chunk(&self, usage: Usage) -> Bytes {
        let none: &[CompletionChoice] = &[];
        sse_event(&self.body(self.chunk_object(), none, Some(usage)))
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
/// the channel close and drops the requests, which aborts them.
fn stream_response(
    shape: Shape,
    choices: Vec<ChoiceStream>,
    prompt_tokens: usize,
    include_usage: bool,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let num_choices = choices.len();
        let mut started = vec![false; num_choices];
        let mut merged = futures::stream::select_all(choices.into_iter().map(|c| {
            Box::pin(futures::stream::unfold(c, |mut c| async move {
                c.next().await.map(|d| (d, c))
            }))
        }));
        let mut completion_tokens = 0;
        loop {
            let delta = tokio::select! {
                _ = tx.closed() => return,
                d = merged.next() => d,
            };
            let Some(d) = delta else { break };
            if let Some(f) = &d.finish
                && f.reason == FinishReason::Error
            {
                let err = ApiError::internal(
                    f.error
                        .clone()
                        .unwrap_or_else(|| "generation failed".into()),
                );
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
            }
            if tx.send(shape.chunk(&d, first)).await.is_err() {
                return;
            }
            // A client still reading did not abort this choice: the server
            // did (shutdown). Say why, so the stream does not just stop.
            if let Some(f) = &d.finish
                && f.reason == FinishReason::Abort
            {
                let err = ApiError::unavailable(server_abort_message(f));
                let event = sse_event(&err.body());
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
        if include_usage {
            let usage = Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
            };
            if tx.send(shape.usage_chunk(usage)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<Bytes, Infallible>));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| ApiError::internal("cannot build the stream").into_response())
}

/// Why the server aborted a choice, with how far it got.
fn server_abort_message(f: &crate::generation::ChoiceFinish) -> String {
    format!(
        "{}; the request was aborted after {} generated tokens",
        f.error
            .as_deref()
            .unwrap_or("the request was aborted by the server"),
        f.completion_tokens
    )
}

/// Waits for every choice and answers with one JSON body.
async fn full_response(shape: Shape, choices: Vec<ChoiceStream>, prompt_tokens: usize) -> Response {
    let results = futures::future::join_all(choices.into_iter().map(|mut c| async move {
        let mut text = String::new();
        while let Some(d) = c.next().await {
            text.push_str(&d.text);
            if let Some(f) = d.finish {
                return (d.index, text, f);
            }
        }
        unreachable_finish(c)
    }))
    .await;
    if let Some((_, _, f)) = results.iter().find(|r| r.2.reason == FinishReason::Error) {
        return ApiError::internal(
            f.error
                .clone()
                .unwrap_or_else(|| "generation failed".into()),
        )
        .into_response();
    }
    // The client is still waiting, so it did not abort: the server did.
    if let Some((_, _, f)) = results.iter().find(|r| r.2.reason == FinishReason::Abort) {
        return ApiError::unavailable(server_abort_message(f)).into_response();
    }
    let completion_tokens: usize = results.iter().map(|r| r.2.completion_tokens).sum();
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    };
    let body = match shape.api {
        Api::Completions => {
            let choices: Vec<_> = results
                .iter()
                .map(|(index, text, f)| CompletionChoice {
                    index: *index,
                    text,
                    logprobs: None,
                    finish_reason: Some(f.reason.as_str()),
                })
                .collect();
            serde_json::to_value(shape.body("text_completion", &choices, Some(usage)))
        }
        Api::Chat => {
            let choices: Vec<_> = results
                .iter()
                .map(|(index, text, f)| ChatChoice {
                    index: *index,
                    message: Some(ChatDelta {
                        role: Some("assistant"),
                        content: Some(text),
                    }),
                    delta: None,
                    logprobs: None,
                    finish_reason: Some(f.reason.as_str()),
                })
                .collect();
            serde_json::to_value(shape.body("chat.completion", &choices, Some(usage)))
        }
    };
    match body {
        Ok(v) => Json(v).into_response(),
        Err(e) => ApiError::internal(format!("cannot encode the response: {e}")).into_response(),
    }
}

/// A choice stream that ended without a final delta cannot happen (the
/// stream always yields one); answer it as an error rather than panic.
fn unreachable_finish(c: ChoiceStream) -> (usize, String, crate::generation::ChoiceFinish) {
    let _ = c;
    (
        0,
        String::new(),
        crate::generation::ChoiceFinish {
            reason: FinishReason::Error,
            error: Some("the request ended without a result".into()),
            prompt_tokens: 0,
            completion_tokens: 0,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn key_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret-longer", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
        assert!(constant_time_eq(b"", b""));
    }
}
