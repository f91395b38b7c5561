//! What the integration tests of `serve`, `proxy`, `doctor` and the binary
//! share: an in-process `inferscope serve --executor sim` on an ephemeral
//! port of 127.0.0.1, and a small keep-alive HTTP/1 client that reads whole
//! responses with a timeout. A dev-dependency only: no shipped crate links it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use inferscope_server::{RunningServer, ServeArgs};

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
