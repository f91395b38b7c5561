//! Test support: start a server in-process on an ephemeral port, a small
//! HTTP client, an SSE reader and a Prometheus exposition parser.

#![allow(dead_code)]

use std::collections::BTreeMap;
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

/// One sample of the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus text (0.0.4) into samples; panics on a malformed line.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("bad labels {line:?}"));
                (name.to_owned(), parse_labels(body))
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

fn parse_labels(body: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(
            chars.next(),
            Some('"'),
            "label value must be quoted in {body:?}"
        );
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

/// Sum of every sample named `name` whose labels include `filter`.
pub fn sum(samples: &[Sample], name: &str, filter: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && filter
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// A series: its name and its labels (without `le`).
type SeriesKey = (String, Vec<(String, String)>);

/// Checks every histogram: buckets cumulative, `+Inf` equal to `_count`.
pub fn assert_histograms_well_formed(samples: &[Sample]) {
    let mut series: BTreeMap<SeriesKey, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<SeriesKey, f64> = BTreeMap::new();
    for s in samples {
        if let Some(base) = s.name.strip_suffix("_bucket") {
            let le = s.labels.get("le").expect("bucket has le");
            let le: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().expect("le number")
            };
            let key: Vec<_> = s
                .labels
                .iter()
                .filter(|(k, _)| *k != "le")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            series
                .entry((base.to_owned(), key))
                .or_default()
                .push((le, s.value));
        } else if let Some(base) = s.name.strip_suffix("_count") {
            let key: Vec<_> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            counts.insert((base.to_owned(), key), s.value);
        }
    }
    assert!(!series.is_empty(), "no histogram found");
    for (key, mut buckets) in series {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in buckets.windows(2) {
            assert!(
                w[1].1 >= w[0].1,
                "{key:?}: buckets not cumulative: {buckets:?}"
            );
        }
        let last = buckets.last().expect("a bucket");
        assert!(last.0.is_infinite(), "{key:?}: no +Inf bucket");
        let count = counts
            .get(&key)
            .unwrap_or_else(|| panic!("{key:?}: no _count"));
        assert_eq!(last.1, *count, "{key:?}: +Inf bucket differs from _count");
    }
}

/// Scrapes and parses `/metrics`.
pub async fn scrape(addr: SocketAddr) -> Vec<Sample> {
    let r = call(addr, "GET", "/metrics", "", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    parse_exposition(&r.body)
}

/// Scrapes until the samples named `name` sum to at least `at_least`: the
/// engine counts a finish just after it delivers it, so a client can see its
/// response before the counters move.
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
