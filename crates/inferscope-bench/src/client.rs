//! The HTTP client: one pooled connection set shared by every request,
//! OpenAI request bodies, and per-request timing of the SSE stream.

use crate::connect::{GuardedConnector, never_sent};
use crate::error::BenchError;
use crate::sse::SseParser;
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Which request format to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    /// `/v1/completions` with `prompt`.
    Completions,
    /// `/v1/chat/completions` with `messages`.
    Chat,
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct RequestOutput {
    /// HTTP 200 and at least one choice-bearing event, no transport error.
    pub success: bool,
    /// Concatenated text of the deltas.
    pub generated_text: String,
    /// `completion_tokens` from the usage chunk, when the server sent one.
    pub usage_output_tokens: Option<usize>,
    /// `prompt_tokens` from the usage chunk, when the server sent one.
    pub usage_prompt_tokens: Option<usize>,
    /// Tokens of `generated_text` counted by a tokenizer after the run
    /// (only where the server sent no usage).
    pub counted_output_tokens: Option<usize>,
    /// Number of choice-bearing events.
    pub chunks: usize,
    /// Time to first token, seconds.
    pub ttft: f64,
    /// Gaps between successive choice-bearing events, seconds.
    pub itl: Vec<f64>,
    /// Time of the last choice-bearing event after the send, seconds.
    pub latency: f64,
    /// Send time, seconds since the start of the run.
    pub start: f64,
    /// How late the send was against its schedule, seconds.
    pub send_lag: f64,
    /// How late the scheduler thread handed the request to the runtime, seconds
    /// (the part of `send_lag` before the runtime picked the task up).
    pub dispatch_lag: f64,
    /// Prompt length from the dataset (the server's `usage`, when it sends
    /// one, is `usage_prompt_tokens`).
    pub prompt_len: usize,
    /// Why it failed (empty on success).
    pub error: String,
    /// Times it was sent again because its pooled connection turned out to
    /// be closed by the server before any of it was written.
    pub resent: usize,
}

/// Connection and request settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Full URL of the generation endpoint.
    pub url: String,
    /// Request format.
    pub api: ApiKind,
    /// `model` field.
    pub model: String,
    /// Send `ignore_eos: true`.
    pub ignore_eos: bool,
    /// Sampling fields sent with each request.
    pub sampling: Sampling,
    /// Fail a request when the server sends nothing for this long.
    pub read_timeout: Duration,
    /// `Authorization: Bearer` value (from `OPENAI_API_KEY`).
    pub api_key: Option<String>,
    /// What to send as `x-request-id`.
    pub request_ids: RequestIds,
}

/// The `x-request-id` header of each request. Random UUIDs by default:
/// some servers (llama.cpp's) answer 400 to anything else.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestIds {
    /// `PREFIX` + a random v4 UUID (an empty prefix sends the bare UUID).
    Uuid {
        /// Prepended to each UUID.
        prefix: String,
    },
    /// No header.
    Off,
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds::Uuid {
            prefix: String::new(),
        }
    }
}

/// SplitMix64's output function: a bijection on u64, so distinct inputs
/// give distinct outputs.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A random-looking v4 UUID for request `n` of a client seeded with `seed`;
/// distinct `n` give distinct UUIDs (the high half is a bijection of `n`).
pub fn uuid_v4(seed: u64, n: u64) -> String {
    let hi = mix64(seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let lo = mix64(hi ^ seed.rotate_left(32));
    // Version 4 in the 13th hex digit, variant 10xx in the 17th.
    let hi = (hi & !0xF000) | 0x4000;
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

/// Fields of a completions or chat request that every OpenAI-compatible
/// server knows; the others are named when a request fails without a reason.
const STANDARD_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "stop",
    "n",
];

/// What a request carried beyond the standard, for errors the server did
/// not explain (an empty body).
fn non_standard(body: &Value, request_id: Option<&str>) -> String {
    let mut parts = Vec::new();
    if let Some(id) = request_id {
        parts.push(format!("header x-request-id: {id}"));
    }
    if let Some(o) = body.as_object() {
        let fields: Vec<&str> = o
            .keys()
            .map(String::as_str)
            .filter(|k| !STANDARD_FIELDS.contains(k))
            .collect();
        if !fields.is_empty() {
            parts.push(format!("body fields {}", fields.join(", ")));
        }
    }
    if parts.is_empty() {
        "nothing non-standard".to_string()
    } else {
        parts.join("; ")
    }
}

/// Sampling fields of the requests, as `vllm bench serve` sends them:
/// greedy unless a temperature is given, the others only when set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// `temperature` (0 when unset).
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k`.
    pub top_k: Option<i64>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// Fields merged into every request body last (`--extra-body`), e.g.
    /// a structured-output constraint.
    pub extra: Option<serde_json::Map<String, Value>>,
}

impl Sampling {
    /// Writes the fields into a request body.
    fn apply(&self, body: &mut Value) {
        body["temperature"] = json!(self.temperature.unwrap_or(0.0));
        if let Some(p) = self.top_p {
            body["top_p"] = json!(p);
        }
        if let Some(k) = self.top_k {
            body["top_k"] = json!(k);
        }
        if let Some(p) = self.min_p {
            body["min_p"] = json!(p);
        }
        for (k, v) in self.extra.iter().flatten() {
            body[k] = v.clone();
        }
    }
}

/// The pooled HTTP/1 client type of the bench.
pub type HttpClient = Client<GuardedConnector, Full<Bytes>>;

/// How many times a request is sent again after finding its pooled
/// connection closed by the server before any of it was written (each try
/// discards one dead connection; a server that closes after every response
/// leaves at most one per earlier request in the pool).
const MAX_RESENDS: usize = 16;

/// A shared, pooled client for one endpoint.
pub struct ApiClient {
    http: HttpClient,
    /// The server has closed one of `http`'s connections (see [`Self::send`]).
    server_closes: Arc<AtomicBool>,
    uri: Uri,
    cfg: ClientConfig,
    next_id: AtomicU64,
    /// Random per client, so ids differ between runs and processes.
    id_seed: u64,
}

/// A seed that differs between processes and runs (std's per-process
/// random hash keys, the time and the pid), without a dependency.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

/// Parses an `http://` URL; https is not supported (this build carries no TLS stack).
pub fn parse_http_uri(url: &str) -> Result<Uri, BenchError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| BenchError::InvalidArg(format!("bad URL {url:?}: {e}")))?;
    match uri.scheme_str() {
        Some("http") => Ok(uri),
        Some("https") => Err(BenchError::InvalidArg(format!(
            "{url}: https is not supported; benchmark the server over plain http"
        ))),
        _ => Err(BenchError::InvalidArg(format!(
            "{url}: expected an http:// URL"
        ))),
    }
}

/// A pooled HTTP/1 client with TCP_NODELAY, a connect timeout, and
/// connections checked for a server-side close before each request
/// ([`crate::connect`]).
pub fn http_client() -> HttpClient {
    http_client_watching_closes().0
}

/// [`http_client`], and a flag set once the server closes any of its connections.
pub fn http_client_watching_closes() -> (HttpClient, Arc<AtomicBool>) {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(10)));
    let conn = GuardedConnector::new(conn);
    let closes = conn.peer_closes();
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(usize::MAX)
        .build(conn);
    (client, closes)
}

/// Error text with its chain of causes (hyper's top-level messages are terse).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

impl ApiClient {
    /// Creates a client for `cfg.url`.
    pub fn new(cfg: ClientConfig) -> Result<Self, BenchError> {
        let uri = parse_http_uri(&cfg.url)?;
        let (http, server_closes) = http_client_watching_closes();
        Ok(ApiClient {
            http,
            server_closes,
            uri,
            cfg,
            next_id: AtomicU64::new(0),
            id_seed: random_seed(),
        })
    }

    /// Whether the server has closed one of the client's connections, so
    /// that requests now ask for a connection each (`Connection: close`).
    pub fn server_closes_connections(&self) -> bool {
        self.server_closes.load(Ordering::Relaxed)
    }

    /// The request body for one prompt.
    pub fn body(&self, prompt: &str, max_tokens: usize) -> Value {
        let mut body = match self.cfg.api {
            ApiKind::Completions => json!({
                "model": self.cfg.model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "stream": true,
                "stream_options": {"include_usage": true},
            }),
            ApiKind::Chat => json!({
                "model": self.cfg.model,
                "messages": [{"role": "user", "content": prompt}],
                "max_completion_tokens": max_tokens,
                "stream": true,
                "stream_options": {"include_usage": true},
            }),
        };
        self.cfg.sampling.apply(&mut body);
        if self.cfg.ignore_eos {
            body["ignore_eos"] = Value::Bool(true);
        }
        body
    }

    /// Sends one streaming request and times it. Never panics on server output;
    /// every failure ends up in `error`.
    pub async fn send(&self, prompt: &str, prompt_len: usize, max_tokens: usize) -> RequestOutput {
        let mut out = RequestOutput {
            prompt_len,
            ..Default::default()
        };
        let json_body = self.body(prompt, max_tokens);
        let body = json_body.to_string();
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request_id = match &self.cfg.request_ids {
            RequestIds::Uuid { prefix } => Some(format!("{prefix}{}", uuid_v4(self.id_seed, n))),
            RequestIds::Off => None,
        };
        let body = Bytes::from(body);
        let timeout = self.cfg.read_timeout;
        let st = Instant::now();
        let resp = loop {
            let mut builder = Request::post(self.uri.clone())
                .header(http::header::CONTENT_TYPE, "application/json");
            if let Some(id) = &request_id {
                builder = builder.header("x-request-id", id.as_str());
            }
            if let Some(key) = &self.cfg.api_key {
                builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
            }
            // A server that closed a connection (llama-server does after
            // every streamed response, announcing keep-alive) may close the
            // next one while a request is being written into it, and then
            // nobody can tell whether it ran: one connection per request.
            if self.server_closes.load(Ordering::Relaxed) {
                builder = builder.header(http::header::CONNECTION, "close");
            }
            let req = match builder.body(Full::new(body.clone())) {
                Ok(r) => r,
                Err(e) => {
                    out.error = format!("building request: {e}");
                    return out;
                }
            };
            match tokio::time::timeout(timeout, self.http.request(req)).await {
                Err(_) => {
                    out.error = format!("no response within {:.0} s", timeout.as_secs_f64());
                    return out;
                }
                // Nothing of it reached the server (see `connect`): sending it
                // again cannot run it twice. The clock keeps the first try's
                // start, so the resend's cost is in TTFT.
                Ok(Err(e)) if never_sent(&e) && out.resent < MAX_RESENDS => {
                    out.resent += 1;
                }
                Ok(Err(e)) => {
                    out.error = error_chain(&e);
                    return out;
                }
                Ok(Ok(r)) => break r,
            }
        };
        let status = resp.status();
        let mut body = resp.into_body();
        if status != StatusCode::OK {
            let text = match tokio::time::timeout(timeout, body.collect()).await {
                Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes())
                    .chars()
                    .take(300)
                    .collect(),
                _ => String::new(),
            };
            out.error = if text.trim().is_empty() {
                // Nothing to go on: say what was sent that a server may refuse.
                format!(
                    "HTTP {status} with an empty body; sent {}",
                    non_standard(&json_body, request_id.as_deref())
                )
            } else {
                format!("HTTP {status}: {text}")
            };
            return out;
        }
        let mut parser = SseParser::new();
        let mut state = StreamState::new(st);
        // After `[DONE]` the body is still read to its end, as vLLM's client
        // does: dropping it early would close the connection from this side,
        // and a server that closes every streamed response's connection
        // itself (llama-server) would then never be seen doing it, so the
        // run would go on reusing connections it is about to close. What
        // comes after `[DONE]` (the end, a close, a timeout) is not timed and
        // cannot fail the request (`StreamState::fail`).
        loop {
            match tokio::time::timeout(timeout, body.frame()).await {
                Err(_) => {
                    state.fail(format!("no data for {:.0} s", timeout.as_secs_f64()));
                    break;
                }
                Ok(None) => {
                    parser.finish(|ev| state.on_event(ev, Instant::now()));
                    break;
                }
                Ok(Some(Err(e))) => {
                    state.fail(format!("stream broken: {}", error_chain(&e)));
                    break;
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let now = Instant::now();
                        parser.push(&data, |ev| state.on_event(ev, now));
                    }
                }
            }
            if state.error.is_some() {
                break;
            }
        }
        state.finish(&mut out);
        out
    }
}

/// Timing state of one stream.
struct StreamState {
    st: Instant,
    last: Option<Instant>,
    ttft: f64,
    itl: Vec<f64>,
    text: String,
    chunks: usize,
    usage: Option<usize>,
    usage_prompt: Option<usize>,
    done: bool,
    error: Option<String>,
}

impl StreamState {
    fn new(st: Instant) -> Self {
        StreamState {
            st,
            last: None,
            ttft: 0.0,
            itl: Vec::new(),
            text: String::new(),
            chunks: 0,
            usage: None,
            usage_prompt: None,
            done: false,
            error: None,
        }
    }

    /// Records the stream's first failure; none after `[DONE]` counts.
    fn fail(&mut self, msg: String) {
        if self.error.is_none() && !self.done {
            self.error = Some(msg);
        }
    }

    fn on_event(&mut self, ev: &[u8], now: Instant) {
        if self.done || self.error.is_some() {
            return;
        }
        if ev == b"[DONE]" {
            self.done = true;
            return;
        }
        let v: Value = match serde_json::from_slice(ev) {
            Ok(v) => v,
            Err(e) => {
                let snippet: String = String::from_utf8_lossy(ev).chars().take(120).collect();
                self.fail(format!("invalid JSON event ({e}): {snippet}"));
                return;
            }
        };
        if let Some(err) = v.get("error") {
            self.fail(format!("error event: {err}"));
            return;
        }
        if let Some(choices) = v.get("choices").and_then(Value::as_array)
            && let Some(c) = choices.first()
        {
            match self.last {
                None => self.ttft = now.duration_since(self.st).as_secs_f64(),
                Some(prev) => self.itl.push(now.duration_since(prev).as_secs_f64()),
            }
            self.last = Some(now);
            self.chunks += 1;
            let piece = c.get("text").and_then(Value::as_str).or_else(|| {
                c.get("delta")
                    .and_then(|d| d.get("content"))
                    .and_then(Value::as_str)
            });
            if let Some(p) = piece {
                self.text.push_str(p);
            }
        }
        // Usage from whichever chunk carries it: vLLM sends it on a chunk of
        // its own, llama.cpp's server beside the last choice.
        let usage = |k: &str| {
            v.get("usage")
                .and_then(|u| u.get(k))
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
        };
        if let Some(n) = usage("completion_tokens") {
            self.usage = Some(n);
        }
        if let Some(n) = usage("prompt_tokens") {
            self.usage_prompt = Some(n);
        }
    }

    fn finish(self, out: &mut RequestOutput) {
        out.ttft = self.ttft;
        out.itl = self.itl;
        out.generated_text = self.text;
        out.chunks = self.chunks;
        out.usage_output_tokens = self.usage;
        out.usage_prompt_tokens = self.usage_prompt;
        out.latency = self
            .last
            .map(|l| l.duration_since(self.st).as_secs_f64())
            .unwrap_or(0.0);
        match self.error {
            Some(e) => out.error = e,
            None if self.chunks == 0 => {
                out.error = "stream ended without a token".to_string();
            }
            None => out.success = true,
        }
    }
}

/// Fetches `GET {base}/v1/models` and returns `data[0].id`, the name the
/// server accepts as `model` (`root` is the checkpoint it was loaded from,
/// which a server need not accept: vLLM's bench also sends the `id`).
/// `api_key` goes as a bearer token (a server with keys answers 401
/// without one).
pub async fn discover_model(
    base_url: &str,
    timeout: Duration,
    api_key: Option<&str>,
) -> Result<String, BenchError> {
    let url = format!("{}/v1/models", base_url.trim_end_matches('/'));
    let v = get_json(&url, timeout, api_key).await?;
    let first = v
        .get("data")
        .and_then(Value::as_array)
        .and_then(|d| d.first());
    first
        .and_then(|m| m.get("id").and_then(Value::as_str))
        .map(str::to_string)
        .ok_or_else(|| BenchError::Server(format!("{url}: no model listed; pass --model")))
}

/// `GET url` and the body as text, with `api_key` as a bearer token when
/// given; errors on non-200.
pub async fn get_text(
    url: &str,
    timeout: Duration,
    api_key: Option<&str>,
) -> Result<String, BenchError> {
    let (status, body) = send_empty(http::Method::GET, url, timeout, api_key).await?;
    if status != StatusCode::OK {
        return Err(BenchError::Server(format!("{url}: HTTP {status}")));
    }
    Ok(body)
}

/// `POST url` with an empty body (vLLM's `/start_profile`), with `api_key`
/// as a bearer token when given: the status and the body as text, whatever
/// the status (the caller explains the ones it expects).
pub async fn post_text(
    url: &str,
    timeout: Duration,
    api_key: Option<&str>,
) -> Result<(StatusCode, String), BenchError> {
    send_empty(http::Method::POST, url, timeout, api_key).await
}

/// `METHOD url` with an empty body: the status and the body as text.
async fn send_empty(
    method: http::Method,
    url: &str,
    timeout: Duration,
    api_key: Option<&str>,
) -> Result<(StatusCode, String), BenchError> {
    let uri = parse_http_uri(url)?;
    let client = http_client();
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(key) = api_key {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let req = builder
        .body(Full::new(Bytes::new()))
        .map_err(|e| BenchError::InvalidArg(format!("{url}: {e}")))?;
    let fut = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| BenchError::Server(format!("{url}: {}", error_chain(&e))))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| BenchError::Server(format!("{url}: {}", error_chain(&e))))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| BenchError::Server(format!("{url}: timed out")))?
}

async fn get_json(
    url: &str,
    timeout: Duration,
    api_key: Option<&str>,
) -> Result<Value, BenchError> {
    let text = get_text(url, timeout, api_key).await?;
    serde_json::from_str(&text).map_err(|source| BenchError::Json {
        context: url.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(events: &[(&str, u64)]) -> RequestOutput {
        let st = Instant::now();
        let mut s = StreamState::new(st);
        for (ev, ms) in events {
            s.on_event(ev.as_bytes(), st + Duration::from_millis(*ms));
        }
        let mut out = RequestOutput::default();
        s.finish(&mut out);
        out
    }

    fn client(sampling: Sampling) -> ApiClient {
        ApiClient::new(ClientConfig {
            url: "http://127.0.0.1:1/v1/completions".into(),
            api: ApiKind::Completions,
            model: "m".into(),
            ignore_eos: false,
            request_ids: RequestIds::default(),
            sampling,
            read_timeout: Duration::from_secs(1),
            api_key: None,
        })
        .expect("client")
    }

    #[test]
    fn request_ids_are_distinct_v4_uuids() {
        let ids: std::collections::BTreeSet<String> = (0..1000).map(|n| uuid_v4(7, n)).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let b = id.as_bytes();
            assert_eq!(id.len(), 36, "{id}");
            assert_eq!(
                (b[8], b[13], b[18], b[23]),
                (b'-', b'-', b'-', b'-'),
                "{id}"
            );
            assert_eq!(b[14], b'4', "{id}");
            assert!(matches!(b[19], b'8' | b'9' | b'a' | b'b'), "{id}");
        }
        assert_ne!(uuid_v4(7, 0), uuid_v4(8, 0));
    }

    #[test]
    fn sampling_flags_reach_the_body() {
        let greedy = client(Sampling::default()).body("p", 4);
        assert_eq!(greedy["temperature"], 0.0);
        assert!(greedy.get("top_p").is_none() && greedy.get("top_k").is_none());
        let b = client(Sampling {
            temperature: Some(0.7),
            top_p: Some(0.9),
            top_k: Some(40),
            min_p: Some(0.05),
            extra: serde_json::from_str(r#"{"guided_choice": ["a"], "top_k": 3}"#).ok(),
        })
        .body("p", 4);
        assert_eq!(b["guided_choice"], json!(["a"]));
        assert_eq!(b["temperature"], 0.7);
        assert_eq!(b["top_p"], 0.9);
        assert_eq!(b["top_k"], 3, "--extra-body is merged last");
        assert_eq!(b["min_p"], 0.05);
        assert_eq!(b["max_tokens"], 4);
    }

    #[test]
    fn timing_from_choice_events_only() {
        let out = feed(&[
            (r#"{"choices":[{"index":0,"text":"a"}]}"#, 50),
            (r#"{"choices":[{"index":0,"text":"b"}]}"#, 60),
            (r#"{"choices":[{"index":0,"delta":{"content":"c"}}]}"#, 75),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#,
                90,
            ),
            ("[DONE]", 95),
        ]);
        assert!(out.success);
        assert_eq!(out.generated_text, "abc");
        assert_eq!(out.usage_output_tokens, Some(3));
        assert_eq!(out.usage_prompt_tokens, Some(7));
        assert!((out.ttft - 0.050).abs() < 1e-9);
        assert!((out.latency - 0.075).abs() < 1e-9);
        assert_eq!(out.itl.len(), 2);
        assert!((out.itl[1] - 0.015).abs() < 1e-9);
    }

    #[test]
    fn usage_beside_the_last_choice_is_read() {
        // llama.cpp's server: usage on the chunk with `finish_reason`.
        let out = feed(&[
            (r#"{"choices":[{"index":0,"text":"a"}]}"#, 50),
            (
                r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
                70,
            ),
            ("[DONE]", 71),
        ]);
        assert!(out.success);
        assert_eq!(out.usage_output_tokens, Some(2));
        assert_eq!(out.usage_prompt_tokens, Some(5));
        assert_eq!(out.itl.len(), 1);
    }

    #[test]
    fn bad_output_fails_without_panicking() {
        assert!(!feed(&[("not json", 1)]).success);
        assert!(!feed(&[(r#"{"error":{"message":"boom"}}"#, 1)]).success);
        assert!(!feed(&[("[DONE]", 1)]).success);
        assert!(!feed(&[(r#"{"choices":"weird"}"#, 1)]).success);
    }

    #[test]
    fn https_is_refused_clearly() {
        assert!(parse_http_uri("https://x/v1").is_err());
        assert!(parse_http_uri("http://127.0.0.1:8000/v1/completions").is_ok());
    }
}
