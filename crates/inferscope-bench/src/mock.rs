//! A mock OpenAI-compatible streaming server with fixed delays, for tests and
//! the client-capacity benchmark. Each token is sent as `chunk_text`; prompt tokens are
//! counted as whitespace-separated words (matching the random dataset), plus
//! a BOS token when the mock offers a tokenizer (`/tokenize`, `/detokenize`:
//! one id per word, a vocabulary grown as words are first seen).

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use inferscope_schema::names;
use inferscope_schema::schema::name_prefix;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Behaviour of the mock.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Delay from request to first token.
    pub ttft: Duration,
    /// Delay between tokens.
    pub itl: Duration,
    /// Send the usage chunk (`include_usage`).
    pub send_usage: bool,
    /// Every n-th generation request (1-based) gets HTTP 500.
    pub fail_every: Option<u64>,
    /// Every n-th generation request drops the connection after two tokens.
    pub drop_every: Option<u64>,
    /// Model id listed by `/v1/models`.
    pub model: String,
    /// Metric namespace for `/metrics` (`inferscope`, `vllm`, or `inferscope:`
    /// for the older spelling); None → 404.
    pub metrics_namespace: Option<String>,
    /// Text of each streamed chunk (one chunk per requested token).
    pub chunk_text: String,
    /// Answer 400 with an empty body to an `x-request-id` that is not a
    /// UUID, as llama.cpp's server does.
    pub uuid_request_ids_only: bool,
    /// Offer vLLM's `/tokenize` and `/detokenize` (word-level, with a BOS).
    pub tokenizer: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            ttft: Duration::ZERO,
            itl: Duration::ZERO,
            send_usage: true,
            fail_every: None,
            drop_every: None,
            model: "mock-model".to_string(),
            metrics_namespace: None,
            chunk_text: " tok".to_string(),
            uuid_request_ids_only: false,
            tokenizer: false,
        }
    }
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    success: AtomicU64,
    generation_tokens: AtomicU64,
    prompt_tokens: AtomicU64,
    running: AtomicU64,
}

struct State {
    cfg: MockConfig,
    c: Counters,
    started: Instant,
    /// `x-request-id` of the latest generation request, if it had one.
    last_request_id: std::sync::Mutex<Option<String>>,
    /// The word vocabulary of the mock tokenizer (id 0 is BOS).
    vocab: std::sync::Mutex<Vocab>,
    /// `/tokenize` and `/detokenize` calls.
    tokenizer_calls: AtomicU64,
}

/// Words to ids and back; id 0 is BOS.
#[derive(Default)]
struct Vocab {
    ids: std::collections::HashMap<String, u32>,
    words: Vec<String>,
}

impl Vocab {
    fn id(&mut self, w: &str) -> u32 {
        if self.words.is_empty() {
            self.words.push("<s>".into());
        }
        if let Some(&id) = self.ids.get(w) {
            return id;
        }
        let id = u32::try_from(self.words.len()).unwrap_or(u32::MAX);
        self.words.push(w.to_string());
        self.ids.insert(w.to_string(), id);
        id
    }
}

/// A running mock server; stops when dropped.
pub struct MockServer {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

type MockBody = BoxBody<Bytes, std::io::Error>;

/// A response body fed by a channel (hyper aborts the connection on an `Err` frame).
struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx)
    }
}

impl MockServer {
    /// Binds 127.0.0.1 on an ephemeral port and serves until dropped.
    pub async fn start(cfg: MockConfig) -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0", cfg).await
    }

    /// Binds `addr` (e.g. `127.0.0.1:8000`) and serves until dropped.
    pub async fn start_on(addr: &str, cfg: MockConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            cfg,
            c: Counters::default(),
            started: Instant::now(),
            last_request_id: std::sync::Mutex::new(None),
            vocab: std::sync::Mutex::new(Vocab::default()),
            tokenizer_calls: AtomicU64::new(0),
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((s, _)) => s,
                    Err(_) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(req, st.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(MockServer { addr, state, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `/tokenize` and `/detokenize` calls received so far.
    pub fn tokenizer_calls(&self) -> u64 {
        self.state.tokenizer_calls.load(Ordering::Relaxed)
    }

    /// Generation requests received so far.
    pub fn requests(&self) -> u64 {
        self.state.c.requests.load(Ordering::Relaxed)
    }

    /// The `x-request-id` of the latest generation request (`None`: it sent none).
    pub fn last_request_id(&self) -> Option<String> {
        self.state
            .last_request_id
            .lock()
            .map_or(None, |id| id.clone())
    }
}

/// `8-4-4-4-12` hex digits, as llama.cpp's server checks.
pub fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn full(status: StatusCode, ctype: &str, body: String) -> Response<MockBody> {
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(req: Request<Incoming>, st: Arc<State>) -> Result<Response<MockBody>, Infallible> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    Ok(match (method, path.as_str()) {
        (Method::GET, "/health") => full(StatusCode::OK, "text/plain", String::new()),
        (Method::GET, "/v1/models") => {
            let m = &st.cfg.model;
            let body = json!({"object":"list","data":[{"id":m,"object":"model","created":0,"owned_by":"mock","root":m}]});
            full(StatusCode::OK, "application/json", body.to_string())
        }
        (Method::GET, "/metrics") => match &st.cfg.metrics_namespace {
            Some(ns) => full(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                exposition(&st, ns),
            ),
            None => full(StatusCode::NOT_FOUND, "text/plain", "not found".into()),
        },
        (Method::POST, "/tokenize" | "/detokenize") if st.cfg.tokenizer => {
            tokenizer(req, st, path == "/tokenize").await
        }
        (Method::POST, "/v1/completions") => generate(req, st, false).await,
        (Method::POST, "/v1/chat/completions") => generate(req, st, true).await,
        _ => full(StatusCode::NOT_FOUND, "text/plain", "not found".into()),
    })
}

/// `/tokenize` (prompt → word ids, BOS first unless `add_special_tokens` is
/// false) and `/detokenize` (ids → words joined by spaces).
async fn tokenizer(req: Request<Incoming>, st: Arc<State>, encode: bool) -> Response<MockBody> {
    st.tokenizer_calls.fetch_add(1, Ordering::Relaxed);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return full(StatusCode::BAD_REQUEST, "text/plain", "bad body".into()),
    };
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let bad = |m: &str| {
        let e =
            json!({"error":{"message":m,"type":"invalid_request_error","param":null,"code":400}});
        full(StatusCode::BAD_REQUEST, "application/json", e.to_string())
    };
    let Ok(mut vocab) = st.vocab.lock() else {
        return bad("vocabulary poisoned");
    };
    let answer = if encode {
        let text = match (v.get("prompt"), v.pointer("/messages/0/content")) {
            (Some(p), _) => p.as_str(),
            (None, Some(c)) => c.as_str(),
            (None, None) => None,
        };
        let Some(text) = text else {
            return bad("`prompt` or `messages` is required");
        };
        let mut tokens: Vec<u32> = Vec::new();
        if v.get("add_special_tokens").and_then(Value::as_bool) != Some(false) {
            tokens.push(0);
        }
        tokens.extend(text.split_whitespace().map(|w| vocab.id(w)));
        json!({"count": tokens.len(), "max_model_len": 4096, "tokens": tokens})
    } else {
        let Some(ids) = v.get("tokens").and_then(Value::as_array) else {
            return bad("`tokens` is required");
        };
        let mut words = Vec::new();
        for id in ids {
            let w = id
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| vocab.words.get(i));
            match w {
                Some(w) if w != "<s>" => words.push(w.clone()),
                Some(_) => {}
                None => return bad("token id out of vocabulary"),
            }
        }
        json!({"prompt": words.join(" ")})
    };
    full(StatusCode::OK, "application/json", answer.to_string())
}

async fn generate(req: Request<Incoming>, st: Arc<State>, chat: bool) -> Response<MockBody> {
    let t0 = Instant::now();
    let n = st.c.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let request_id = req
        .headers()
        .get("x-request-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Ok(mut last) = st.last_request_id.lock() {
        last.clone_from(&request_id);
    }
    if st.cfg.uuid_request_ids_only && request_id.as_deref().is_some_and(|id| !is_uuid(id)) {
        return full(StatusCode::BAD_REQUEST, "text/plain", String::new());
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return full(StatusCode::BAD_REQUEST, "text/plain", "bad body".into()),
    };
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let max_tokens = v
        .get("max_tokens")
        .or_else(|| v.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(16);
    if st
        .cfg
        .fail_every
        .is_some_and(|k| k > 0 && n.is_multiple_of(k))
    {
        let err = json!({"error":{"message":"mock failure","type":"internal_error","param":null,"code":500}});
        return full(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/json",
            err.to_string(),
        );
    }
    let prompt_words = if chat {
        v.pointer("/messages/0/content").and_then(Value::as_str)
    } else {
        v.get("prompt").and_then(Value::as_str)
    }
    .map_or(0, |p| p.split_whitespace().count()) as u64
        + u64::from(st.cfg.tokenizer);
    let drop_after = st
        .cfg
        .drop_every
        .filter(|k| *k > 0 && n.is_multiple_of(*k))
        .map(|_| 2u64);
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(stream_tokens(
        st,
        tx,
        t0,
        max_tokens,
        prompt_words,
        chat,
        drop_after,
    ));
    let mut r = Response::new(ChannelBody(rx).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    r
}

fn event(v: &Value) -> Result<Frame<Bytes>, std::io::Error> {
    Ok(Frame::data(Bytes::from(format!("data: {v}\n\n"))))
}

async fn stream_tokens(
    st: Arc<State>,
    tx: mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
    t0: Instant,
    max_tokens: u64,
    prompt_tokens: u64,
    chat: bool,
    drop_after: Option<u64>,
) {
    st.c.running.fetch_add(1, Ordering::Relaxed);
    let (ttft, itl) = (st.cfg.ttft, st.cfg.itl);
    let mut sent = 0u64;
    let mut ok = true;
    for k in 0..max_tokens {
        // Absolute deadlines: timer jitter does not accumulate over a stream.
        let due = t0 + ttft + itl * u32::try_from(k).unwrap_or(u32::MAX);
        if due > Instant::now() {
            tokio::time::sleep_until(due.into()).await;
        }
        if drop_after == Some(k) {
            let _ = tx
                .send(Err(std::io::Error::other("mock drops the connection")))
                .await;
            ok = false;
            break;
        }
        let chunk = if chat {
            json!({"id":"x","object":"chat.completion.chunk","created":0,"model":st.cfg.model,
                   "choices":[{"index":0,"delta":{"content":st.cfg.chunk_text},"finish_reason":null}]})
        } else {
            json!({"id":"x","object":"text_completion","created":0,"model":st.cfg.model,
                   "choices":[{"index":0,"text":st.cfg.chunk_text,"logprobs":null,"finish_reason":null}]})
        };
        if tx.send(event(&chunk)).await.is_err() {
            ok = false;
            break;
        }
        sent += 1;
    }
    if ok && st.cfg.send_usage {
        let u = json!({"id":"x","object":"text_completion","created":0,"model":st.cfg.model,"choices":[],
                       "usage":{"prompt_tokens":prompt_tokens,"completion_tokens":sent,"total_tokens":prompt_tokens + sent}});
        ok = tx.send(event(&u)).await.is_ok();
    }
    if ok {
        ok = tx
            .send(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))))
            .await
            .is_ok();
    }
    st.c.generation_tokens.fetch_add(sent, Ordering::Relaxed);
    st.c.prompt_tokens
        .fetch_add(prompt_tokens, Ordering::Relaxed);
    if ok {
        st.c.success.fetch_add(1, Ordering::Relaxed);
    }
    st.c.running.fetch_sub(1, Ordering::Relaxed);
}

/// Prometheus text with two engines (engine 1 idle), so clients must sum label sets.
fn exposition(st: &State, ns: &str) -> String {
    let c = &st.c;
    let success = c.success.load(Ordering::Relaxed);
    let gen_tokens = c.generation_tokens.load(Ordering::Relaxed);
    let prompt = c.prompt_tokens.load(Ordering::Relaxed);
    let running = c.running.load(Ordering::Relaxed);
    let ttft = st.cfg.ttft.as_secs_f64();
    let up = st.started.elapsed().as_secs_f64();
    // The names as the schema spells them under `ns` (`inferscope_x`, `vllm:x`).
    let p = name_prefix(ns);
    let mut s = String::new();
    let (rs, busy, ttft_name) = (
        names::REQUEST_SUCCESS,
        names::DEVICE_BUSY_SECONDS,
        names::TIME_TO_FIRST_TOKEN_SECONDS,
    );
    let l0 = "engine=\"0\",model_name=\"mock-model\"";
    let l1 = "engine=\"1\",model_name=\"mock-model\"";
    s.push_str(&format!(
        "# HELP {p}{rs} Finished requests.\n# TYPE {p}{rs} counter\n"
    ));
    s.push_str(&format!(
        "{p}{rs}_total{{finished_reason=\"length\",{l0}}} {success}\n"
    ));
    s.push_str(&format!(
        "{p}{rs}_total{{finished_reason=\"stop\",{l1}}} 0\n"
    ));
    for (name, v) in [
        (names::GENERATION_TOKENS, gen_tokens),
        (names::PROMPT_TOKENS, prompt),
        (names::NUM_PREEMPTIONS, 0),
    ] {
        s.push_str(&format!(
            "# TYPE {p}{name} counter\n{p}{name}_total{{{l0}}} {v}\n{p}{name}_total{{{l1}}} 0\n"
        ));
    }
    s.push_str(&format!(
        "# TYPE {p}{busy} counter\n{p}{busy}_total{{{l0}}} {}\n{p}{busy}_total{{{l1}}} 0\n",
        up * 0.5
    ));
    for (name, v) in [
        (names::NUM_REQUESTS_RUNNING, running as f64),
        (names::NUM_REQUESTS_WAITING, 0.0),
        (
            names::KV_CACHE_USAGE_PERC,
            (running as f64 / 100.0).min(1.0),
        ),
    ] {
        s.push_str(&format!(
            "# TYPE {p}{name} gauge\n{p}{name}{{{l0}}} {v}\n{p}{name}{{{l1}}} 0\n"
        ));
    }
    s.push_str(&format!("# TYPE {p}{ttft_name} histogram\n"));
    for le in [0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25] {
        let v = if ttft <= le { success } else { 0 };
        s.push_str(&format!("{p}{ttft_name}_bucket{{{l0},le=\"{le}\"}} {v}\n"));
    }
    s.push_str(&format!(
        "{p}{ttft_name}_bucket{{{l0},le=\"+Inf\"}} {success}\n"
    ));
    s.push_str(&format!(
        "{p}{ttft_name}_sum{{{l0}}} {}\n",
        ttft * success as f64
    ));
    s.push_str(&format!("{p}{ttft_name}_count{{{l0}}} {success}\n"));
    s
}

/// A small byte-level BPE as `tokenizer.json` text: the 256 byte symbols (GPT-2's
/// byte-to-char map, so a space is `Ġ`) plus `merges` such as `"Ġ t"`, each
/// merged piece a token after the bytes. Random ids decode to bytes that often
/// re-encode to another length: what exact-length prompt fitting must handle.
pub fn byte_level_bpe_json(merges: &[&str]) -> String {
    let mut chars: Vec<char> = Vec::with_capacity(256);
    let mut unprintable = 0u32;
    for b in 0u32..256 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let code = if printable {
            b
        } else {
            unprintable += 1;
            256 + unprintable - 1
        };
        chars.push(char::from_u32(code).unwrap_or('?'));
    }
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    for (i, m) in merges.iter().enumerate() {
        vocab.insert(m.replace(' ', ""), json!(256 + i));
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges}
    })
    .to_string()
}
