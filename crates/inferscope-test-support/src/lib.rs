//! What the integration tests of `serve`, `proxy`, `doctor` and the binary
//! share: an in-process `inferscope serve --executor sim` on an ephemeral
//! port of 127.0.0.1, a small keep-alive HTTP/1 client that reads whole
//! responses with a timeout, and a raw connection for what a client library
//! would not send. A dev-dependency only: no shipped crate links it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use inferscope_server::{RunningServer, ServeArgs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one request (or its body) may take before the test fails.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Starts `inferscope serve --executor sim` on 127.0.0.1, port 0, without the
/// periodic log lines, with `flags` added.
pub async fn start_sim(flags: &[&str]) -> RunningServer {
    inferscope_server::start(&sim_args(flags))
        .await
        .expect("server starts")
}

/// What [`start_sim`] with `flags` fails with: the start-up error's text
/// (the test fails if it starts).
pub async fn start_sim_error(flags: &[&str]) -> String {
    match inferscope_server::start(&sim_args(flags)).await {
        Ok(_) => panic!("started with {flags:?}"),
        Err(e) => e.to_string(),
    }
}

/// A file in the temporary directory holding given text (a key file, a
/// config), removed when dropped; `arg` is its path as a flag's value.
pub struct TempFile {
    path: std::path::PathBuf,
    /// The path, as a command-line argument.
    pub arg: String,
}

impl TempFile {
    /// Writes `text` to a new file whose name starts with `prefix` and ends
    /// with `.json`.
    pub fn json(prefix: &str, text: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("{prefix}-{}-{n}.json", std::process::id()));
        std::fs::write(&path, text).expect("write a temporary file");
        let arg = path.to_string_lossy().into_owned();
        Self { path, arg }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The arguments of [`start_sim`] with `flags` (for the other ways to start).
pub fn sim_args(flags: &[&str]) -> ServeArgs {
    let mut all = vec![
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "sim",
        "--disable-log-stats",
    ];
    all.extend_from_slice(flags);
    ServeArgs::try_parse_flags(all).expect("flags")
}

/// A request as raw bytes: a POST of `body` with a JSON content type and its
/// `Content-Length`, `extra` header lines (each ending in CRLF) before it.
pub fn raw_post(path: &str, body: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A client connection spoken to in raw bytes (heads cut anywhere, requests
/// pipelined, malformed heads), which keeps what it read past one response.
pub struct RawConn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    /// Connects to `addr` (TCP_NODELAY).
    pub async fn open(addr: SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    /// Writes `bytes`.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Ends the writing side (the server reads end of file).
    pub async fn half_close(&mut self) {
        self.stream.shutdown().await.expect("half-close");
    }

    /// What was read and not yet taken as a response.
    pub fn read_so_far(&self) -> &[u8] {
        &self.buf
    }

    /// Reads more; false at the connection's end.
    pub async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        let n = tokio::time::timeout(TIMEOUT, self.stream.read(&mut chunk))
            .await
            .expect("no read timeout")
            .unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n > 0
    }

    /// The next response (an interim one too; its body by `Content-Length`,
    /// else chunked), or None when the connection ends first.
    pub async fn reply(&mut self) -> Option<Reply> {
        let (status, headers, head_len) = loop {
            let mut slots = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut slots);
            if let httparse::Status::Complete(n) = resp.parse(&self.buf).expect("a valid head") {
                let mut headers = hyper::HeaderMap::new();
                for h in resp.headers.iter() {
                    headers.append(
                        hyper::header::HeaderName::from_bytes(h.name.as_bytes()).expect("name"),
                        hyper::header::HeaderValue::from_bytes(h.value).expect("value"),
                    );
                }
                break (resp.code.expect("status"), headers, n);
            }
            if !self.fill().await {
                return None;
            }
        };
        self.buf.drain(..head_len);
        let mut body = Vec::new();
        if (100..200).contains(&status) || status == 204 || status == 304 {
            // No body.
        } else if let Some(n) = headers.get("content-length") {
            let n: usize = n
                .to_str()
                .ok()
                .and_then(|n| n.parse().ok())
                .expect("a length");
            while self.buf.len() < n {
                assert!(self.fill().await, "the body ended early");
            }
            body.extend(self.buf.drain(..n));
        } else {
            assert_eq!(
                headers.get("transfer-encoding").map(|v| v.as_bytes()),
                Some(&b"chunked"[..])
            );
            loop {
                let line_end = loop {
                    if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    assert!(self.fill().await, "the stream ended without its terminator");
                };
                let size = usize::from_str_radix(
                    std::str::from_utf8(&self.buf[..line_end]).expect("size line"),
                    16,
                )
                .expect("hex size");
                while self.buf.len() < line_end + 2 + size + 2 {
                    assert!(self.fill().await, "a chunk ended early");
                }
                self.buf.drain(..line_end + 2);
                body.extend(self.buf.drain(..size));
                assert_eq!(self.buf.drain(..2).collect::<Vec<_>>(), b"\r\n");
                if size == 0 {
                    break;
                }
            }
        }
        Some(Reply {
            status,
            headers,
            body: String::from_utf8(body).expect("utf-8"),
        })
    }

    /// True when the peer closes with nothing more to read.
    pub async fn closed(&mut self) -> bool {
        self.buf.is_empty() && !self.fill().await
    }
}

/// A request as raw bytes: a POST of `body` with a JSON content type, sent
/// as one chunk of a chunked body.
pub fn raw_chunked_post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    )
    .into_bytes()
}

/// Sends malformed heads (a bad `Content-Length`, a header line without a
/// colon, bytes that are no request, two lengths), each on a connection of
/// its own, and checks that each is answered 400 and the connection closed,
/// as hyper's server answers them.
pub async fn send_malformed_heads(addr: SocketAddr) {
    for bad in [
        &b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n"[..],
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n",
        b"\x01\x02 nonsense\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
    ] {
        let mut c = RawConn::open(addr).await;
        c.send(bad).await;
        let r = c.reply().await.expect("an answer");
        assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(bad));
        assert!(c.closed().await, "closed after a malformed head");
    }
}

/// Sends `body` to `path` twice with a `Content-Length` that does not match
/// it, and checks what a server reading its own connections must answer:
/// with bytes past the declared length, the declared request's answer
/// (returned, a 200) and then a 400 for the rest (not a request), then the
/// close; with fewer bytes and the client's side closed, a 400 with an
/// OpenAI error body, then the close.
pub async fn send_mismatched_lengths(addr: SocketAddr, path: &str, body: &str) -> Reply {
    let mut c = RawConn::open(addr).await;
    let mut longer = raw_post(path, body, "");
    longer.extend_from_slice(b"trailing junk\r\n\r\n");
    c.send(&longer).await;
    let first = c.reply().await.expect("the declared request's answer");
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(c.reply().await.expect("the junk's answer").status, 400);
    assert!(c.closed().await, "closed after the junk");

    let mut c = RawConn::open(addr).await;
    let whole = raw_post(path, body, "");
    c.send(&whole[..whole.len() - 5]).await;
    c.half_close().await;
    let short = c.reply().await.expect("an answer to a body cut short");
    assert_eq!(short.status, 400, "{}", short.body);
    assert!(
        short.body.contains("invalid_request_error"),
        "{}",
        short.body
    );
    assert!(c.closed().await, "closed after a short body");
    first
}

/// A keep-alive HTTP/1 client.
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response read in full.
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The response headers.
    pub headers: hyper::HeaderMap,
    /// The body, as text (lossy).
    pub body: String,
}

impl Reply {
    /// A header's value as text, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as JSON; panics (naming the body) when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Sends a request with a JSON content type and returns the response, its
/// body not read.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> hyper::Response<Incoming> {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    tokio::time::timeout(TIMEOUT, client().request(req))
        .await
        .expect("no timeout")
        .expect("response")
}

/// Sends a request and reads the whole body.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let resp = send(addr, method, path, body, headers).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = tokio::time::timeout(TIMEOUT, resp.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// POSTs JSON and reads the whole response.
pub async fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Reply {
    call(addr, "POST", path, &body.to_string(), &[]).await
}

/// The `data:` payloads of an SSE body, in order; panics on an event
/// without one.
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without `data: `: {e:?}"))
                .to_owned()
        })
        .collect()
}
