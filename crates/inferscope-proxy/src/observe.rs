//! What the proxy measures, from the bytes the client receives: a response
//! body wrapper that passes each upstream frame on as it arrives and reads a
//! view of it on the way: SSE events (TTFT at the first chunk with content,
//! one inter-token sample per later content chunk, finish reasons, `usage`)
//! or a JSON body (finish reason and `usage` at the end).
//!
//! Usage injection: when the proxy asked the upstream for the usage chunk on
//! the client's behalf, the body is cut at event boundaries and that chunk
//! (and `"usage":null` fields the upstream added because of the request) is
//! left out, so the client gets exactly what it asked for. Only an incomplete
//! event is held back, which the client could not have used anyway.

use std::borrow::Cow;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use inferscope_metrics::{EngineMetrics, ObservedRequest};
use inferscope_schema::stats::FinishReason;
use pin_project_lite::pin_project;
use serde::Deserialize;

/// JSON bodies larger than this are passed on but not read for usage.
const MAX_JSON_VIEW: usize = 16 * 1024 * 1024;

/// The request fields the metrics need, read from the client's body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestView {
    /// `"stream": true`.
    pub stream: bool,
    /// `stream_options.include_usage` is true.
    pub include_usage: bool,
    /// `max_tokens`, else `max_completion_tokens`.
    pub max_tokens: Option<u64>,
    /// `n` (1 when absent).
    pub n: u64,
}

impl RequestView {
    /// Reads the fields from a parsed body (absent or mistyped fields are defaults:
    /// the upstream answers invalid requests itself).
    pub fn of(body: &serde_json::Value) -> Self {
        let include_usage = body
            .pointer("/stream_options/include_usage")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        Self {
            stream: body.get("stream").and_then(serde_json::Value::as_bool) == Some(true),
            include_usage,
            max_tokens: body
                .get("max_tokens")
                .or_else(|| body.get("max_completion_tokens"))
                .and_then(serde_json::Value::as_u64),
            n: body
                .get("n")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(1),
        }
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

/// One request's measurements, recorded once when it ends (or is dropped).
#[derive(Debug)]
pub struct Observer {
    engine: EngineMetrics,
    start: Instant,
    request: RequestView,
    first_content: Option<Instant>,
    last_content: Option<Instant>,
    finish: Option<FinishReason>,
    usage: Option<(Option<u64>, Option<u64>)>,
    recorded: bool,
}

impl Observer {
    /// Starts observing a request that arrived at `start`; counts it in flight.
    pub fn new(engine: EngineMetrics, start: Instant, request: RequestView) -> Self {
        engine.add_running(1);
        Self {
            engine,
            start,
            request,
            first_content: None,
            last_content: None,
            finish: None,
            usage: None,
            recorded: false,
        }
    }

    fn read_chunk(&mut self, chunk: &Chunk<'_>, now: Instant) {
        if chunk.choices.iter().any(Choice::has_content) {
            match self.last_content {
                None => {
                    self.first_content = Some(now);
                    self.engine
                        .observe_ttft(now.duration_since(self.start).as_secs_f64());
                }
                Some(prev) => self
                    .engine
                    .observe_itl(now.duration_since(prev).as_secs_f64()),
            }
            self.last_content = Some(now);
        }
        for c in &chunk.choices {
            if let Some(r) = &c.finish_reason {
                self.finish = Some(finish_reason(r));
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
                if let Some(r) = &c.finish_reason {
                    self.finish = Some(finish_reason(r));
                }
            }
            if let Some(u) = &chunk.usage {
                self.usage = Some((u.prompt_tokens, u.completion_tokens));
            }
        }
    }

    /// Forgets the request without recording it (the upstream refused it).
    pub fn discard(&mut self) {
        if !self.recorded {
            self.recorded = true;
            self.engine.add_running(-1);
        }
    }

    /// Records the request once; later calls do nothing.
    pub fn finish(&mut self, outcome: Outcome) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        self.engine.add_running(-1);
        let reason = match outcome {
            Outcome::Aborted => FinishReason::Abort,
            Outcome::Failed => FinishReason::Error,
            // A body that ended without a finish_reason was cut short upstream.
            Outcome::Complete => self.finish.unwrap_or(FinishReason::Error),
        };
        let (prompt_tokens, generation_tokens) = self.usage.unwrap_or((None, None));
        self.engine.record_observed(&ObservedRequest {
            finish_reason: reason,
            prompt_tokens,
            generation_tokens,
            max_tokens: self.request.max_tokens,
            n: self.request.n,
            ttft: self.first_content.map(|t| t.duration_since(self.start)),
            e2e: self.start.elapsed(),
        });
    }
}

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
    As,
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

pin_project! {
    /// An upstream response body, passed on frame by frame and observed.
    pub struct ObservedBody<B> {
        #[pin]
        inner: B,
        view: View,
        observer: Observer,
        outcome_if_done: Outcome,
        done: bool,
    }
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
            inner,
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
            Keep::As => {
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
        return Keep::As;
    }
    let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(&data) else {
        return Keep::As;
    };
    observer.read_chunk(&chunk, now);
    if !strip {
        return Keep::As;
    }
    if chunk.choices.is_empty() && chunk.usage.is_some() {
        return Keep::Drop;
    }
    match without_null_usage(event) {
        Some(e) => Keep::Rewritten(e),
        None => Keep::As,
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
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        loop {
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                None => {
                    *this.done = true;
                    let rest = this.view.end(this.observer);
                    this.observer.finish(*this.outcome_if_done);
                    return Poll::Ready(rest.map(|b| Ok(Frame::data(b))));
                }
                Some(Err(e)) => {
                    *this.done = true;
                    this.observer.finish(Outcome::Failed);
                    return Poll::Ready(Some(Err(e)));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let mut out = this.view.pass(data, this.observer);
                        // A body of known length is not polled past its last
                        // byte (hyper stops at Content-Length): end it here.
                        if this.inner.is_end_stream() {
                            *this.done = true;
                            if let Some(rest) = this.view.end(this.observer) {
                                let mut joined = BytesMut::from(&out[..]);
                                joined.extend_from_slice(&rest);
                                out = joined.freeze();
                            }
                            this.observer.finish(*this.outcome_if_done);
                        }
                        if out.is_empty() {
                            if *this.done {
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
        match self.view {
            // The length changes when the usage chunk is taken out.
            View::Sse { strip: true, .. } => SizeHint::default(),
            _ => self.inner.size_hint(),
        }
    }
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
        let mut v: serde_json::Value =
            serde_json::from_str(r#"{"stream":true,"max_completion_tokens":7,"n":2}"#).unwrap();
        let r = RequestView::of(&v);
        assert_eq!(
            r,
            RequestView {
                stream: true,
                include_usage: false,
                max_tokens: Some(7),
                n: 2
            }
        );
        assert!(inject_usage(&mut v));
        assert!(RequestView::of(&v).include_usage);
        let mut bad: serde_json::Value = serde_json::from_str(r#"{"stream_options":3}"#).unwrap();
        assert!(!inject_usage(&mut bad));
    }

    #[test]
    fn finish_reasons() {
        assert_eq!(finish_reason("length"), FinishReason::Length);
        assert_eq!(finish_reason("tool_calls"), FinishReason::Stop);
        assert_eq!(finish_reason("stop"), FinishReason::Stop);
    }
}
