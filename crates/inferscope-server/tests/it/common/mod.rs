//! Test support: start a server in-process on an ephemeral port, a small
//! HTTP client, an SSE reader, and the schema crate's exposition parser.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use inferscope_server::{RunningServer, ServeArgs};

/// Starts a server with the sim executor's `tiny` profile plus `flags`.
pub async fn start(flags: &[&str]) -> RunningServer {
    let mut all = vec![
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "sim",
        "--disable-log-stats",
    ];
    if !flags.contains(&"--sim-profile") {
        all.extend(["--sim-profile", "tiny"]);
    }
    all.extend_from_slice(flags);
    let args = ServeArgs::try_parse_flags(all).expect("flags");
    inferscope_server::start(&args)
        .await
        .expect("server starts")
}

/// A keep-alive HTTP/1 client.
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response read in full.
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Sends a request and returns the raw response (body not read).
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
    tokio::time::timeout(Duration::from_secs(30), client().request(req))
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
    let bytes = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
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

/// POSTs JSON.
pub async fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Reply {
    call(addr, "POST", path, &body.to_string(), &[]).await
}

/// The `data:` payloads of an SSE body, in order.
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

pub use inferscope_schema::promtext::Sample;

/// Parses the exposition with the schema crate's parser; panics on a malformed line.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    inferscope_schema::promtext::parse(text)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_samples()
}

/// Sum of every sample named `name` whose labels include `filter`.
pub fn sum(samples: &[Sample], name: &str, filter: &[(&str, &str)]) -> f64 {
    inferscope_schema::promtext::sum(samples, name, filter)
}

/// Checks every histogram: buckets cumulative, `+Inf` equal to `_count`.
pub fn assert_histograms_well_formed(samples: &[Sample]) {
    let checked = inferscope_schema::promtext::check_histogram_samples(samples)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(checked > 0, "no histogram found");
}

/// Scrapes and parses `/metrics`.
pub async fn scrape(addr: SocketAddr) -> Vec<Sample> {
    let r = call(addr, "GET", "/metrics", "", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    parse_exposition(&r.body)
}

/// Scrapes until the samples named `name` sum to at least `at_least`. The
/// engine counts a finish before it delivers it (`engine/src/core.rs`), but
/// a finish the server causes (a stop string, a client that left) reaches
/// the engine as an abort after the client has its response, and the HTTP
/// layer counts a response once its last byte is written, so a client can
/// see its response before those counters move.
pub async fn scrape_when(addr: SocketAddr, name: &str, at_least: f64) -> Vec<Sample> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let samples = scrape(addr).await;
        let value = sum(&samples, name, &[]);
        if value >= at_least {
            return samples;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} stayed at {value}, expected {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
