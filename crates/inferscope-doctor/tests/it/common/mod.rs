//! Test support: an in-process server on the sim executor, a small load
//! generator, and a doctor run over a short window.

#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use inferscope_doctor::findings::Finding;
use inferscope_doctor::report::Report;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Scenario tests share two cores: one at a time, so timings stay meaningful.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub use inferscope_test_support::{client, start_sim as start};

/// POSTs a completion and reads the whole response; returns the status.
pub async fn complete(
    c: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    prompt: &str,
    max_tokens: usize,
) -> u16 {
    let body = serde_json::json!({
        "model": "demo",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
    });
    post(c, addr, body).await
}

/// POSTs `body` to `/v1/completions` and reads the whole response; returns the status.
async fn post(
    c: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    body: serde_json::Value,
) -> u16 {
    let req = hyper::Request::post(format!("http://{addr}/v1/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(30), c.request(req)).await else {
        return 0;
    };
    let status = resp.status().as_u16();
    let _ = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect()).await;
    status
}

/// As [`complete`], with the output constrained to match `regex`.
pub async fn complete_guided(
    c: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    prompt: &str,
    max_tokens: usize,
    regex: &str,
) -> u16 {
    let body = serde_json::json!({
        "model": "demo",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "guided_regex": regex,
    });
    post(c, addr, body).await
}

/// Closed-loop clients sending requests until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Responses by class: [2xx, 429, other].
    pub counts: Arc<[AtomicU64; 3]>,
}

/// What each client sends.
#[derive(Clone, Copy)]
pub struct Shape {
    /// Prompt length in bytes (one token each with the sim's byte tokenizer).
    pub prompt_len: usize,
    /// Tokens to generate.
    pub max_tokens: usize,
    /// A `guided_regex` every request's output must match (structured outputs).
    pub guided_regex: Option<&'static str>,
}

/// A prompt of `len` bytes starting with a unique tag, so no two prompts share
/// a prefix block.
pub fn prompt(tag: &str, len: usize) -> String {
    let mut p = format!("{tag} ");
    while p.len() < len {
        p.push_str("lorem ipsum dolor sit amet ");
    }
    p.truncate(len);
    p
}

impl Load {
    /// Starts `clients` closed-loop clients against `addr`.
    pub fn start(addr: SocketAddr, clients: usize, shape: Shape) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
        let tasks = (0..clients)
            .map(|i| {
                let (stop, counts) = (stop.clone(), counts.clone());
                tokio::spawn(async move {
                    let c = client();
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let p = prompt(&format!("c{i}r{n}"), shape.prompt_len);
                        n += 1;
                        let status = match shape.guided_regex {
                            Some(rx) => complete_guided(&c, addr, &p, shape.max_tokens, rx).await,
                            None => complete(&c, addr, &p, shape.max_tokens).await,
                        };
                        let slot = match status {
                            200..=299 => 0,
                            429 => 1,
                            _ => 2,
                        };
                        counts[slot].fetch_add(1, Ordering::Relaxed);
                        if slot != 0 {
                            // Refused requests return at once: do not spin.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            tasks,
            counts,
        }
    }

    /// A load made of an existing task (custom patterns).
    pub fn from_task(stop: Arc<AtomicBool>, task: tokio::task::JoinHandle<()>) -> Load {
        Load {
            stop,
            tasks: vec![task],
            counts: Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]),
        }
    }

    /// Stops the clients and waits for their last requests.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
        }
    }
}

/// Lets the load settle, then runs the doctor over `window`.
pub async fn doctor(addr: SocketAddr, warmup: Duration, window: Duration) -> Report {
    tokio::time::sleep(warmup).await;
    let url = inferscope_doctor::metrics_url(&format!("http://{addr}"));
    let w = inferscope_doctor::collect(&url, window, None)
        .await
        .expect("doctor collects");
    inferscope_doctor::diagnose_window(&url, &w)
}

/// Warm-up before the doctor's window, so the load has reached steady state.
pub const WARMUP: Duration = Duration::from_millis(400);

/// A finished scenario: the doctor's report and the load's response counts.
pub struct Run {
    /// The doctor's report over the window.
    pub report: Report,
    /// Responses by class when the window closed: [2xx, 429, other].
    pub counts: [u64; 3],
}

/// One scenario, one at a time ([`SERIAL`]): a sim server with `flags`,
/// `clients` closed-loop clients of `shape`, the doctor over `window` after
/// [`WARMUP`], then the load and the server stopped.
pub async fn scenario(flags: &[&str], clients: usize, shape: Shape, window: Duration) -> Run {
    let _serial = SERIAL.lock().await;
    let srv = start(flags).await;
    let load = Load::start(srv.addr, clients, shape);
    let report = doctor(srv.addr, WARMUP, window).await;
    let counts = std::array::from_fn(|i| load.counts[i].load(Ordering::Relaxed));
    load.stop().await;
    srv.shutdown(Duration::from_secs(5)).await;
    Run { report, counts }
}

/// The first finding, after printing the report (shown when a test fails).
pub fn first(r: &Report) -> &Finding {
    println!("{}", r.to_text());
    r.diagnosis.findings.first().expect("at least one finding")
}

/// The evidence `name` of `f`, which must be present.
pub fn evidence(f: &Finding, name: &str) -> f64 {
    f.evidence(name)
        .unwrap_or_else(|| panic!("finding {} lacks evidence {name}: {:?}", f.id, f.evidence))
}
