//! HTTP handlers, all thin: the OpenAI routes (parse and validate on the
//! validation workers → generate → shape), models, health, version, metrics.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use futures::future::Either;
use inferscope_metrics::negotiate;
use serde_json::json;

use crate::error::ApiError;
use crate::openai::response::{self, Api, Shape};
use crate::openai::validation::{self, Needles, Validated};
use crate::otel::{RequestSpan, SpanStart, TraceContext};
use crate::state::{AppState, unix_now};
use crate::validation_workers::{INLINE_MAX_BYTES, REASON_VALIDATION_QUEUE};
use inferscope_tenants::Tenant;

type AppStateRef = State<Arc<AppState>>;

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
        return ApiError::not_found("metrics are disabled (--disable-metrics)").into_response();
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = s.metrics.render(negotiate(accept));
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Any path no route matches.
pub async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// The tenant the API key named (none without keys: anonymous).
type TenantRef = Option<Extension<Arc<Tenant>>>;

/// `POST /v1/completions`.
pub async fn completions(
    State(s): AppStateRef,
    tenant: TenantRef,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tenant = tenant.map(|Extension(t)| t);
    generation_route(s, Api::Completions, tenant, headers, body_bytes(body)).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(s): AppStateRef,
    tenant: TenantRef,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tenant = tenant.map(|Extension(t)| t);
    generation_route(s, Api::Chat, tenant, headers, body_bytes(body)).await
}

/// Both generation routes: validate on the workers with `api`'s parser,
/// then generate and shape.
///
/// The futures of a request's path are `async` blocks, not `async fn`s: an
/// `async fn` keeps each argument twice in its future (the argument and the
/// body's binding of it), and the request's future is moved a few times as
/// it starts (`docs/results/request-path.md`).
#[allow(clippy::manual_async_fn)] // not an `async fn`: see above
pub(crate) fn generation_route(
    s: Arc<AppState>,
    api: Api,
    tenant: Option<Arc<Tenant>>,
    headers: HeaderMap,
    body: Result<Bytes, ApiError>,
) -> impl Future<Output = Response> {
    async move {
        let arrival = Instant::now();
        // Decided at arrival, so that the response headers can name the span.
        let trace = s.traces.as_ref().map(|t| t.context(&headers));
        let span = match (&s.traces, &trace) {
            (Some(traces), Some(cx)) => traces.start_span(
                cx,
                arrival,
                SpanStart {
                    operation: match api {
                        Api::Completions => "text_completion",
                        Api::Chat => "chat",
                    },
                    route: match api {
                        Api::Completions => "/v1/completions",
                        Api::Chat => "/v1/chat/completions",
                    },
                },
            ),
            _ => None,
        };
        let validated = match api {
            Api::Completions => {
                validate(&s, body, |b, s| {
                    validation::parse_and_validate_completion(b, &s.validator())
                })
                .await
            }
            Api::Chat => {
                validate(&s, body, |b, s| {
                    validation::parse_and_validate_chat(b, &s.validator())
                })
                .await
            }
        };
        let trace_id = trace.as_ref().and_then(TraceContext::sampled_trace_id);
        // Not boxed: on the inbound path this future lives in the connection's
        // task, and a box of it went through glibc's slow path (larger than its
        // per-thread cache) on every request; moving it when it starts costs
        // less.
        let mut response = respond(
            &s, api, validated, &headers, arrival, trace_id, tenant, span,
        )
        .await;
        if let Some(cx) = &trace {
            response
                .headers_mut()
                .insert("traceparent", cx.traceparent());
        }
        response
    }
}

/// `POST /tokenize` (vLLM's shape): a prompt or chat messages to token ids,
/// tokenized on the validation workers exactly as the generation routes do.
pub async fn tokenize(State(s): AppStateRef, body: Result<Bytes, BytesRejection>) -> Response {
    let answer = validate(&s, body_bytes(body), |b, s| {
        validation::parse_and_tokenize(b, &s.validator())
    })
    .await;
    match answer {
        Ok(r) => Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /detokenize` (vLLM's shape): token ids to text, on the validation workers.
pub async fn detokenize(State(s): AppStateRef, body: Result<Bytes, BytesRejection>) -> Response {
    let answer = validate(&s, body_bytes(body), |b, s| {
        validation::parse_and_detokenize(b, &s.validator())
    })
    .await;
    match answer {
        Ok(r) => Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /tokenizer_info` (vLLM's, behind `--enable-tokenizer-info-endpoint`):
/// the tokenizer's configuration, built once at start.
pub async fn tokenizer_info(State(s): AppStateRef) -> Response {
    match &s.tokenizer_info {
        Some(info) => Json(info.clone()).into_response(),
        None => not_found().await.into_response(),
    }
}

/// Runs `check` (parsing, template rendering, tokenization: CPU work that
/// grows with the prompt) on the validation workers, not on the runtime.
async fn validate<T: Send + 'static>(
    s: &Arc<AppState>,
    body: Result<Bytes, ApiError>,
    check: fn(&[u8], &AppState) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let body = body?;
    let state = s.clone();
    // Compiling a grammar takes milliseconds: a small body that may ask for
    // one goes to the workers too, never inline on the runtime.
    let cost = if may_constrain(&body) {
        body.len().max(INLINE_MAX_BYTES + 1)
    } else {
        body.len()
    };
    let result = s
        .validation_workers
        .run(cost, move || check(&body, &state))
        .await;
    // Validation itself never answers 429: a 429 here is the pool's full queue.
    if let Err(e) = &result
        && e.status == StatusCode::TOO_MANY_REQUESTS
    {
        s.metrics
            .record_admission_rejection(REASON_VALIDATION_QUEUE);
    }
    result
}

/// Whether `body` may hold a structured-output field, or a `tool_choice`
/// that is one (a cheap scan of a small body; a false positive only moves it
/// to a worker).
fn may_constrain(body: &[u8]) -> bool {
    static NAMES: Needles<4> = Needles::new([
        "response_format",
        "structured_outputs",
        "guided_",
        "tool_choice",
    ]);
    body.len() <= INLINE_MAX_BYTES && NAMES.any_in(body)
}

/// Generates a validated request and shapes the answer; every answer past
/// validation carries the request id. `trace_id` is the request's sampled
/// trace, `span` its span when traced.
///
/// Everything but the wait for a non-streamed body is done before it
/// returns: the future holds only that wait and the request id, not the
/// plan and the rest, which it would otherwise carry to the end.
#[allow(clippy::too_many_arguments)]
fn respond(
    s: &AppState,
    api: Api,
    validated: Result<Validated, ApiError>,
    headers: &HeaderMap,
    arrival: Instant,
    trace_id: Option<[u8; 16]>,
    tenant: Option<Arc<Tenant>>,
    mut span: Option<RequestSpan>,
) -> impl Future<Output = Response> + use<> {
    let now = |r| Either::Left(std::future::ready(r));
    let Validated { model, plan } = match validated {
        Ok(v) => v,
        Err(e) => return now(refused(e, span)),
    };
    let request_id = s.request_ids.external(headers);
    if let Some(span) = &mut span {
        let p = &plan.params;
        span.set_request(
            &request_id,
            &model,
            p.max_tokens,
            p.temperature,
            p.top_p,
            p.n,
        );
        span.set_features(plan.features);
        span.set_tenant(tenant.as_ref().map_or_else(
            || Arc::from(inferscope_schema::schema::TENANT_ANONYMOUS),
            |t| Arc::clone(&t.name),
        ));
    }
    let generation = match s
        .infer()
        .generate(&request_id, &plan, arrival, trace_id, tenant)
    {
        Ok(generation) => generation,
        Err(e) => return now(with_request_id(refused(e, span), request_id)),
    };
    let shape = Shape::new(api, &request_id, model, unix_now())
        .with_tool_calls(plan.tool_calls.clone())
        .with_logprobs(plan.logprobs);
    // Without `--enable-per-request-metrics` the field is ignored,
    // as an unknown field would be.
    let include_metrics = plan.include_metrics && s.per_request_metrics;
    if plan.stream {
        let streamed =
            response::stream(shape, generation, plan.include_usage, include_metrics, span);
        return now(with_request_id(streamed, request_id));
    }
    // A combinator, not an `async` block: a block awaiting `full` would
    // hold it twice (captured, and moved into its await).
    Either::Right(
        response::full(shape, generation, include_metrics, span)
            .map(move |r| with_request_id(r, request_id)),
    )
}

/// The error answer to a request refused before generation; its span (when
/// traced) ends with the status and `error.type` = the status code.
fn refused(e: ApiError, span: Option<RequestSpan>) -> Response {
    if let Some(mut span) = span {
        span.set_status_code(e.status.as_u16());
        span.set_error(e.status.as_u16().to_string(), e.message.clone());
        span.end();
    }
    e.into_response()
}

/// The body, or the extractor's rejection (413 over the limit) as an OpenAI error.
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| unreadable_body(rejection.status(), rejection.body_text()))
}

/// A request body that could not be read, as an OpenAI error.
fn unreadable_body(status: StatusCode, message: String) -> ApiError {
    ApiError {
        status,
        message,
        kind: "invalid_request_error",
        param: None,
        retry_after: None,
    }
}

/// The whole body, at most `limit` bytes: what axum's `Bytes` extractor
/// under `DefaultBodyLimit::max(limit)` reads, and its refusals as
/// [`body_bytes`] words them (413 over the limit, 400 for a body that
/// fails), without boxing the body twice, a limit extension and a frame
/// queue on the way (`router::Generation`).
pub(crate) async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    const CANNOT: &str = "Failed to buffer the request body";
    let mut body = std::pin::pin!(body);
    let mut whole: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|e| {
            unreadable_body(StatusCode::BAD_REQUEST, format!("{CANNOT}: {}", e.into()))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        len += data.len();
        if len > limit {
            return Err(unreadable_body(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("{CANNOT}: length limit exceeded"),
            ));
        }
        // One frame (the common case) is kept as it came, not copied.
        match &whole {
            None if more.is_empty() => whole = Some(data),
            _ => {
                if let Some(first) = whole.take() {
                    more.extend_from_slice(&first);
                }
                more.extend_from_slice(&data);
            }
        }
    }
    Ok(whole.unwrap_or_else(|| Bytes::from(more)))
}

/// The answer's `x-request-id`: a static name and the id's own bytes, so
/// that neither is copied (a `&str` name would be, on every request).
fn with_request_id(mut r: Response, id: String) -> Response {
    const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    if let Ok(v) = HeaderValue::try_from(id) {
        r.headers_mut().insert(X_REQUEST_ID, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of `chunks` (an error where a chunk is None).
    fn body_of(chunks: &[Option<&'static str>]) -> axum::body::Body {
        let frames: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = chunks
            .iter()
            .map(|c| match c {
                Some(c) => Ok(http_body::Frame::data(Bytes::from_static(c.as_bytes()))),
                None => Err(std::io::Error::other("the peer reset")),
            })
            .collect();
        axum::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )))
    }

    /// `read_body` answers what axum's extractor under the same limit does,
    /// refusals worded alike.
    #[tokio::test]
    async fn a_body_is_read_as_axums_extractor_reads_it() {
        use axum::extract::{DefaultBodyLimit, FromRequest};
        let cases: &[&[Option<&'static str>]] = &[
            &[],
            &[Some("{}")],
            &[Some("{\"a\""), Some(":"), Some("1}")],
            &[Some(""), Some("abc")],
            &[Some("0123456789")],
            &[Some("0123456789a")],
            &[Some("012345"), Some("6789ab")],
            &[Some("ab"), None],
        ];
        for chunks in cases {
            let mine = read_body(body_of(chunks), 10).await;
            let mut req = axum::extract::Request::new(body_of(chunks));
            DefaultBodyLimit::max(10).apply(&mut req);
            let axums = body_bytes(Bytes::from_request(req, &()).await);
            match (mine, axums) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{chunks:?}"),
                (Err(a), Err(b)) => {
                    assert_eq!((a.status, &a.message), (b.status, &b.message), "{chunks:?}")
                }
                (a, b) => panic!("{chunks:?}: {:?} against axum's {:?}", a.is_ok(), b.is_ok()),
            }
        }
        // One frame is handed on as it came, not copied.
        let one = Bytes::from_static(b"{\"prompt\":\"hi\"}");
        let read = read_body(http_body_util::Full::new(one.clone()), 100).await;
        assert_eq!(read.expect("read").as_ptr(), one.as_ptr());
    }

    /// A small body naming a constraining field goes to the workers; one
    /// that names none, or is large anyway, is judged by its size alone.
    #[test]
    fn a_body_that_may_constrain_is_seen() {
        for field in [
            "response_format",
            "structured_outputs",
            "guided_json",
            "tool_choice",
        ] {
            let body = format!(r#"{{"prompt":"hi","{field}":"x"}}"#);
            assert!(may_constrain(body.as_bytes()), "{body}");
        }
        assert!(!may_constrain(br#"{"prompt":"hi","max_tokens":16}"#));
        let large = format!(
            r#"{{"tool_choice":"required","prompt":"{}"}}"#,
            "a".repeat(INLINE_MAX_BYTES)
        );
        assert!(!may_constrain(large.as_bytes()));
    }
}
