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
    ChatChoice, ChatDelta, ChatLogprobs, ChatMessageOut, CompletionChoice, CompletionLogprobs,
    PromptLogprobsJson, ResponseBody, Usage,
};
use crate::openai::tool_parsers::{ParsedDelta, ToolCallParser, ToolCalls};
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
    /// Chat: how the output is read into `tool_calls`.
    tool_calls: Option<ToolCalls>,
    logprobs: LogprobsPlan,
}

impl Shape {
    /// The shape of a response to request `request_id` on `api`, for the
    /// served `model`, created at `created` (unix seconds).
    pub fn new(api: Api, request_id: &str, model: String, created: u64) -> Self {
        // Concatenated, not formatted: the formatting machinery costs more.
        let id = match api {
            Api::Completions => ["cmpl-", request_id].concat(),
            Api::Chat => ["chatcmpl-", request_id].concat(),
        };
        Self {
            api,
            id,
            model,
            created,
            tool_calls: None,
            logprobs: LogprobsPlan::default(),
        }
    }

    /// Reads each choice's output into `tool_calls` (chat).
    pub fn with_tool_calls(mut self, tool_calls: Option<ToolCalls>) -> Self {
        self.tool_calls = tool_calls;
        self
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
        // A chunk without tokens (the final one, often) has null logprobs.
        let tokens = (!d.logprobs.is_empty()).then_some(d.logprobs.as_slice());
        match self.api {
            Api::Completions => sse_event(&self.body(
                self.chunk_object(),
                &[CompletionChoice {
                    index: d.index,
                    text: &d.text,
                    logprobs: tokens.and_then(|t| self.completion_logprobs(t, offset)),
                    finish_reason,
                    prompt_logprobs: None,
                }],
                None,
            )),
            Api::Chat => self.chat_chunk(
                d.index,
                first,
                &ParsedDelta {
                    content: d.text.clone(),
                    calls: Vec::new(),
                },
                &d.logprobs,
                finish_reason,
            ),
        }
    }

    /// One chat SSE event: content and tool-call deltas of choice `index`,
    /// and the log-probabilities of the tokens they came from.
    fn chat_chunk(
        &self,
        index: usize,
        first: bool,
        parsed: &ParsedDelta,
        logprobs: &[crate::openai::infer::TokenLogprob],
        finish_reason: Option<&str>,
    ) -> Bytes {
        // A chunk without tokens (the final one, often) has null logprobs.
        let logprobs = if logprobs.is_empty() {
            None
        } else {
            self.chat_logprobs(logprobs)
        };
        let tool_calls =
            (!parsed.calls.is_empty()).then(|| parsed.calls.iter().map(|c| c.chunk()).collect());
        sse_event(&self.body(
            self.chunk_object(),
            &[ChatChoice {
                index,
                message: None,
                delta: Some(ChatDelta {
                    role: first.then_some("assistant"),
                    content: (!parsed.content.is_empty()).then_some(parsed.content.as_str()),
                    tool_calls,
                }),
                logprobs,
                finish_reason,
            }],
            None,
        ))
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
    let parsers = match &shape.tool_calls {
        Some(t) if shape.api == Api::Chat => (0..num_choices).map(|_| Some(t.parser())).collect(),
        _ => Vec::new(),
    };
    let events = SseEvents {
        parsers,
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
    /// Chat with tool parsing: each choice's parser, by index.
    parsers: Vec<Option<ToolCallParser>>,
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
    /// The event for delta `d` (`None` when it carries nothing to send:
    /// text a tool parser holds back); queues the error event that follows
    /// a server abort.
    fn on_delta(&mut self, mut d: ChoiceDelta) -> Option<Bytes> {
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
            return Some(sse_event(&ApiError::internal(message).body()));
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
        let chunk = match self.parsers.get_mut(d.index).and_then(Option::as_mut) {
            None => self.shape.chunk(&d, first, offset),
            Some(parser) => {
                let mut parsed = parser.push(&d.text);
                let finish_reason = d.finish.as_ref().map(|f| {
                    let rest = parser.finish();
                    parsed.content.push_str(&rest.content);
                    parsed.calls.extend(rest.calls);
                    // As vLLM: a choice that called a tool ends with `tool_calls`.
                    if parser.called()
                        && matches!(f.reason, FinishReason::Stop | FinishReason::Length)
                    {
                        "tool_calls"
                    } else {
                        f.reason.as_str()
                    }
                });
                if parsed.is_empty() && !first && finish_reason.is_none() && d.logprobs.is_empty() {
                    return None;
                }
                self.shape
                    .chat_chunk(d.index, first, &parsed, &d.logprobs, finish_reason)
            }
        };
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
        Some(chunk)
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
        loop {
            let event = match ready!(this.events.poll_next_unpin(cx)) {
                Some(d) => match this.on_delta(d) {
                    Some(event) => event,
                    None => continue,
                },
                None => this.on_end(),
            };
            return Poll::Ready(Some(Ok(event)));
        }
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
/// response TGI's timing headers. (An `async` block, as
/// [`ChoiceStream::collect`](super::infer::ChoiceStream::collect) is.)
#[allow(clippy::manual_async_fn)] // not an `async fn`: see above
pub fn full(
    shape: Shape,
    generation: Generation,
    include_metrics: bool,
    span: Option<RequestSpan>,
) -> impl Future<Output = Response> {
    async move {
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
            // Each choice's content and calls, when the output is parsed.
            let parsed: Vec<_> = results
                .iter()
                .map(|c| shape.tool_calls.as_ref().map(|t| t.parse(&c.text)))
                .collect();
            let choices: Vec<_> = results
                .iter()
                .zip(&parsed)
                .map(|(c, p)| {
                    let (content, calls) = match p {
                        Some((content, calls)) => (content.as_deref(), calls.as_slice()),
                        None => (Some(c.text.as_str()), &[][..]),
                    };
                    let finish_reason = match c.finish.reason {
                        FinishReason::Stop | FinishReason::Length if !calls.is_empty() => {
                            "tool_calls"
                        }
                        reason => reason.as_str(),
                    };
                    ChatChoice {
                        index: c.index,
                        message: Some(ChatMessageOut {
                            role: "assistant",
                            content,
                            tool_calls: calls,
                        }),
                        delta: None,
                        logprobs: shape.chat_logprobs(&c.logprobs),
                        finish_reason: Some(finish_reason),
                    }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use inferscope_engine::{
        Coordinator, EngineConfig, EngineRequest, Executor, ExecutorError, SamplingParams,
        ScheduledBatch, StepOutput,
    };
    use inferscope_model::{ByteTokenizer, IncrementalDecoder, Tokenizer};
    use inferscope_schema::{NoopRecorder, RequestRef};
    use serde_json::{Value, json};

    use super::*;
    use crate::openai::infer::ChoiceStream;
    use crate::openai::tool_parsers::{Format, ParserName};

    /// An executor that writes `text`, a byte per step, then EOS (each
    /// sequence's position counted here).
    struct Script(Vec<u8>, std::collections::HashMap<u64, usize>);

    impl Executor for Script {
        fn name(&self) -> String {
            "script".into()
        }
        fn init_kv_cache(&mut self, _block_size: usize) -> Result<usize, ExecutorError> {
            Ok(4096)
        }
        fn eos_token_ids(&self) -> Vec<u32> {
            vec![ByteTokenizer::EOS]
        }
        fn execute(
            &mut self,
            batch: &ScheduledBatch,
            out: &mut StepOutput,
        ) -> Result<(), ExecutorError> {
            out.sampled.clear();
            for seq in &batch.seqs {
                if !seq.sample {
                    out.sampled.push(None);
                    continue;
                }
                let n = self.1.entry(seq.seq_id).or_default();
                let token = self.0.get(*n).map_or(ByteTokenizer::EOS, |&b| u32::from(b));
                *n += 1;
                out.sampled.push(Some(token));
            }
            Ok(())
        }
    }

    /// A generation of one choice whose model writes `text`.
    fn generation(c: &Coordinator, text: &str) -> Generation {
        let tok: Arc<dyn Tokenizer> = Arc::new(ByteTokenizer);
        let prompt = tok.encode("hi", false).expect("encode");
        let handle = c
            .add_request(EngineRequest {
                request_id: format!("r{}", text.len()).into(),
                prompt_token_ids: prompt.clone(),
                params: Arc::new(SamplingParams {
                    max_tokens: 1000,
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
        let choice = ChoiceStream::new(
            0,
            handle,
            IncrementalDecoder::new(tok, &prompt),
            Arc::new([]),
            Instant::now(),
            None,
            RequestRef::new("r", None),
        );
        Generation {
            choices: vec![choice],
            prompt_tokens: prompt.len(),
        }
    }

    fn coordinator(text: &str) -> Coordinator {
        let bytes = text.as_bytes().to_vec();
        Coordinator::start(
            EngineConfig::default(),
            1,
            0,
            move |_| Ok(Box::new(Script(bytes.clone(), Default::default())) as Box<dyn Executor>),
            Arc::new(NoopRecorder),
        )
        .expect("coordinator")
    }

    fn shape() -> Shape {
        Shape::new(Api::Chat, "t", "m".into(), 0).with_tool_calls(Some(ToolCalls {
            format: Format::Parser(ParserName::Hermes),
            single_call: false,
        }))
    }

    async fn body(r: Response) -> String {
        let bytes = tokio::time::timeout(
            Duration::from_secs(10),
            axum::body::to_bytes(r.into_body(), usize::MAX),
        )
        .await
        .expect("not stuck")
        .expect("body");
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    /// The stream accumulated as the openai client does: content
    /// concatenated, each call's id, type and name from its first delta,
    /// its arguments concatenated. Also checks that every chunk has a delta.
    fn accumulate(sse: &str) -> (Value, Value) {
        let mut content = String::new();
        let mut calls: Vec<Value> = Vec::new();
        let mut finish = Value::Null;
        for line in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if line == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(line).expect("chunk");
            let choice = &chunk["choices"][0];
            let delta = &choice["delta"];
            assert!(delta.is_object(), "{line}");
            if let Some(t) = delta["content"].as_str() {
                content.push_str(t);
            }
            for c in delta["tool_calls"].as_array().into_iter().flatten() {
                let i = c["index"].as_u64().expect("index") as usize;
                if i == calls.len() {
                    assert!(
                        c["id"].is_string() && c["function"]["name"].is_string(),
                        "{line}"
                    );
                    assert_eq!(c["type"], "function");
                    calls.push(json!({"id": c["id"], "type": "function",
                        "function": {"name": c["function"]["name"], "arguments": ""}}));
                }
                let args = calls[i]["function"]["arguments"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
                    + c["function"]["arguments"].as_str().unwrap_or_default();
                calls[i]["function"]["arguments"] = json!(args);
            }
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
            }
        }
        let message = json!({"content": if content.is_empty() { Value::Null } else { json!(content) },
                             "tool_calls": calls});
        (message, finish)
    }

    const CALL: &str = "I'll look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>";

    /// A call the model wrote comes back as `tool_calls` with the text
    /// around it as content and `finish_reason: "tool_calls"`; streamed a
    /// byte at a time, it accumulates to the same message.
    #[tokio::test]
    async fn a_written_call_is_returned_full_and_streamed() {
        let c = coordinator(CALL);
        let full_body: Value = serde_json::from_str(
            &body(full(shape(), generation(&c, CALL), false, None).await).await,
        )
        .expect("json");
        let choice = &full_body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{full_body}");
        let message = &choice["message"];
        assert_eq!(message["content"], "I'll look.");
        let call = &message["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert!(
            call["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("chatcmpl-tool-"))
        );
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(
            call["function"]["arguments"],
            r#"{"city": "Paris", "days": [1, 2]}"#
        );

        let sse = body(stream(shape(), generation(&c, CALL), false, false, None)).await;
        let (streamed, finish) = accumulate(&sse);
        assert_eq!(finish, "tool_calls");
        assert_eq!(streamed["content"], message["content"]);
        let mut want = message["tool_calls"].clone();
        want[0]["id"] = streamed["tool_calls"][0]["id"].clone();
        assert_eq!(streamed["tool_calls"], want, "{sse}");
        // The arguments came in fragments, not in one piece.
        let fragments = sse.matches("\"arguments\":").count();
        assert!(fragments > 5, "{sse}");
    }

    /// A call cut short by EOS (no `</tool_call>`, no arguments) is closed
    /// when the choice ends: the last delta carries its `{}`.
    #[tokio::test]
    async fn a_call_ended_by_eos_is_closed_in_the_last_chunk() {
        let text = "<tool_call>{\"name\": \"now\"}";
        let c = coordinator(text);
        let (streamed, finish) =
            accumulate(&body(stream(shape(), generation(&c, text), false, false, None)).await);
        assert_eq!(finish, "tool_calls");
        assert_eq!(streamed["content"], Value::Null);
        assert_eq!(streamed["tool_calls"][0]["function"]["name"], "now");
        assert_eq!(streamed["tool_calls"][0]["function"]["arguments"], "{}");
    }

    /// Without a call the answer is the text, as without tools.
    #[tokio::test]
    async fn text_without_a_call_is_content() {
        let text = "No tools <tool needed.\n";
        let c = coordinator(text);
        let full_body: Value = serde_json::from_str(
            &body(full(shape(), generation(&c, text), false, None).await).await,
        )
        .expect("json");
        let choice = &full_body["choices"][0];
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(choice["message"]["content"], text);
        assert!(choice["message"].get("tool_calls").is_none(), "{full_body}");
        let (streamed, finish) =
            accumulate(&body(stream(shape(), generation(&c, text), false, false, None)).await);
        assert_eq!(
            (streamed["content"].as_str(), finish.as_str()),
            (Some(text), Some("stop"))
        );
    }
}
