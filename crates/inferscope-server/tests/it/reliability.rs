//! Reliability and security under faults, load and hostile input: engine
//! faults injected into the sim executor, admission control, a disconnect
//! storm, an overload burst, the separate metrics listener and label safety.

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use inferscope_server::RunningServer;
use inferscope_test_support::{RawConn, raw_post};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

const NS: &str = "inferscope_";

fn m(name: &str) -> String {
    format!("{NS}{name}")
}

fn assert_openai_error(r: &Reply, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", r.body);
    let err = r.json()["error"].clone();
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        r.body
    );
    assert!(
        err["type"].is_string() && err.get("param").is_some(),
        "{}",
        r.body
    );
    assert_eq!(err["code"], status, "{}", r.body);
    err
}

/// Polls `/metrics` until no request is running or waiting and `finished`
/// requests have been counted. The engine counts a finish before it sends
/// the last output (`engine/src/engine_core.rs`), but a finish the server causes
/// (a stop string, a client that left) reaches the engine as an abort after
/// the client has its response, so that count can move a moment later.
async fn wait_finished(addr: SocketAddr, finished: usize) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let samples = scrape(addr).await;
        let running = sum(&samples, &m("num_requests_running"), &[]);
        let waiting = sum(&samples, &m("num_requests_waiting"), &[]);
        let counted = sum(&samples, &m("request_success_total"), &[]);
        if running == 0.0 && waiting == 0.0 && counted as usize >= finished {
            return samples;
        }
        assert!(
            Instant::now() < deadline,
            "engine not idle: {running} running, {waiting} waiting, {counted} of {finished} counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Same-length sequential requests against a sim executor that fails every
/// 4th step: some fail (500 / an error event), the rest complete, every
/// failure is counted as `error`, blocks are freed and the core keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_faults_fail_their_requests_and_the_engine_keeps_serving() {
    let server = start(&["--sim-fail-every-n-steps", "4"]).await;
    let addr = server.addr;
    let (mut ok, mut failed) = (0, 0);
    for i in 0..12 {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": format!("fault {i}"), "max_tokens": 3, "ignore_eos": true}),
        )
        .await;
        if r.status == 200 {
            assert_eq!(r.json()["usage"]["completion_tokens"], 3, "{}", r.body);
            ok += 1;
        } else {
            let err = assert_openai_error(&r, 500);
            assert!(
                err["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("simulated fault"),
                "{err}"
            );
            failed += 1;
        }
    }
    assert!(ok > 0 && failed > 0, "ok {ok}, failed {failed}");

    // A stream hit by a fault: an error event, then [DONE]; never a silent cut.
    let mut stream_failures = 0;
    for i in 0..12 {
        let r = post(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": format!("s{i}")}],
                    "max_tokens": 6, "ignore_eos": true, "stream": true}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let events = sse_events(&r.body);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let errors: Vec<Value> = events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter(|v| v.get("error").is_some())
            .collect();
        if let Some(e) = errors.first() {
            assert_eq!(e["error"]["code"], 500, "{e}");
            assert_eq!(e["error"]["type"], "internal_server_error", "{e}");
            stream_failures += 1;
        } else {
            assert!(
                events
                    .iter()
                    .any(|e| e.contains(r#""finish_reason":"length""#)),
                "{events:?}"
            );
        }
    }
    assert!(stream_failures > 0, "no stream was hit by a fault");

    let samples = wait_finished(addr, 24).await;
    assert_eq!(
        sum(
            &samples,
            &m("request_success_total"),
            &[("finished_reason", "error")]
        ),
        f64::from(failed + stream_failures)
    );
    assert_eq!(
        sum(
            &samples,
            &m("request_success_total"),
            &[("finished_reason", "length")]
        ),
        f64::from(24 - failed - stream_failures)
    );
    assert_eq!(
        sum(&samples, &m("kv_cache_usage_perc"), &[]),
        0.0,
        "blocks freed"
    );
    assert_eq!(call(addr, "GET", "/health", "", &[]).await.status, 200);
    assert_eq!(server.state.admission.queued_tokens(), 0);
    server.shutdown(Duration::from_secs(5)).await;
}

/// One of two cores dies: its request fails, `/health` names it, and the
/// coordinator routes new requests to the survivor. When the last core dies,
/// new requests get 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_core_is_reported_and_skipped() {
    let server = start(&[
        "--data-parallel-size",
        "2",
        "--sim-die-after-steps",
        "3",
        "--sim-fault-engine",
        "0",
    ])
    .await;
    let addr = server.addr;
    // Sequential requests go to engine 0 (ties pick the first) until it dies.
    let mut failures = 0;
    for i in 0..4 {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": format!("d{i}"), "max_tokens": 2, "ignore_eos": true}),
        )
        .await;
        if r.status != 200 {
            let err = assert_openai_error(&r, 500);
            assert!(
                err["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("device lost"),
                "{err}"
            );
            failures += 1;
        }
    }
    assert_eq!(failures, 1, "exactly the request in flight when it died");
    let health = call(addr, "GET", "/health", "", &[]).await;
    let err = assert_openai_error(&health, 503);
    assert!(
        err["message"].as_str().unwrap_or("").contains("engine 0"),
        "{err}"
    );
    for i in 0..5 {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": format!("after {i}"), "max_tokens": 2, "ignore_eos": true}),
        )
        .await;
        assert_eq!(r.status, 200, "the live core serves: {}", r.body);
    }
    let samples = wait_finished(addr, 9).await;
    let count = |filter: &[(&str, &str)]| sum(&samples, &m("request_success_total"), filter);
    assert_eq!(count(&[("finished_reason", "error"), ("engine", "0")]), 1.0);
    assert_eq!(count(&[("finished_reason", "length")]), 8.0);
    assert!(count(&[("finished_reason", "length"), ("engine", "1")]) >= 5.0);
    server.shutdown(Duration::from_secs(5)).await;

    let server = start(&["--sim-die-after-steps", "1"]).await;
    let addr = server.addr;
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 4, "ignore_eos": true}),
    )
    .await;
    assert_openai_error(&r, 500);
    assert_openai_error(&call(addr, "GET", "/health", "", &[]).await, 503);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "b", "max_tokens": 4, "ignore_eos": true}),
    )
    .await;
    let err = assert_openai_error(&r, 503);
    assert!(
        err["message"]
            .as_str()
            .unwrap_or("")
            .contains("device lost"),
        "{err}"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

/// Engine 0 of two panics inside `execute` (a kernel assertion, an executor
/// bug) with requests in flight: each of its requests ends at once with a
/// 500 or an error event on its stream (not a hang, not a cut stream),
/// `/health` answers 503 naming engine 0 and the panic, its blocks are
/// freed, and later requests all go to engine 1, which served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_core_fails_its_requests_and_is_skipped() {
    let server = start(&[
        "--data-parallel-size",
        "2",
        "--sim-profile",
        // Steps of at least 1 ms: a full response takes 2 s, far more than
        // a starved test thread's delay (up to 0.8 s seen on 2 busy cores).
        "tiny,die_by_panic=1,t_weights_ms=1",
        "--sim-die-after-steps",
        "5",
        "--sim-fault-engine",
        "0",
    ])
    .await;
    let addr = server.addr;
    const MAX_TOKENS: u64 = 2000;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let stream = i % 2 == 1;
        tasks.push(tokio::spawn(async move {
            let body = if stream {
                json!({"messages": [{"role": "user", "content": format!("panic {i}")}],
                       "max_tokens": MAX_TOKENS, "ignore_eos": true, "stream": true})
            } else {
                json!({"prompt": format!("panic {i}"), "max_tokens": MAX_TOKENS, "ignore_eos": true})
            };
            let path = if stream {
                "/v1/chat/completions"
            } else {
                "/v1/completions"
            };
            let t0 = Instant::now();
            let r = post(addr, path, &body).await;
            (stream, r, t0.elapsed())
        }));
    }
    let (mut failed, mut ok) = (Vec::new(), Vec::new());
    for t in tasks {
        let (stream, r, took) = t.await.expect("task");
        let error = if stream {
            assert_eq!(r.status, 200, "{}", r.body);
            let events = sse_events(&r.body);
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
            events
                .iter()
                .filter_map(|e| serde_json::from_str::<Value>(e).ok())
                .find(|v| v.get("error").is_some())
                .map(|v| {
                    assert_eq!(v["error"]["code"], 500, "{v}");
                    v["error"].clone()
                })
        } else if r.status == 200 {
            assert_eq!(
                r.json()["usage"]["completion_tokens"],
                MAX_TOKENS,
                "{}",
                r.body
            );
            None
        } else {
            Some(assert_openai_error(&r, 500))
        };
        match error {
            Some(err) => {
                let msg = err["message"].as_str().unwrap_or("");
                assert!(msg.contains("engine core panicked"), "{err}");
                assert!(msg.contains("simulated device panic"), "{err}");
                failed.push(took);
            }
            None => ok.push(took),
        }
    }
    assert!(
        !failed.is_empty() && !ok.is_empty(),
        "failed {failed:?}, ok {ok:?}"
    );
    // The failures came at the panic, long before a full response could.
    let slowest_failure = failed.iter().max().copied().unwrap_or_default();
    let fastest_success = ok.iter().min().copied().unwrap_or_default();
    assert!(
        slowest_failure < fastest_success,
        "failures took up to {slowest_failure:?}, successes at least {fastest_success:?}"
    );

    let health = call(addr, "GET", "/health", "", &[]).await;
    let err = assert_openai_error(&health, 503);
    let msg = err["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("engine 0") && msg.contains("panicked"),
        "{err}"
    );
    assert!(!msg.contains("engine 1"), "{err}");

    for i in 0..6 {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": format!("after panic {i}"), "max_tokens": 3, "ignore_eos": true}),
        )
        .await;
        assert_eq!(r.status, 200, "the live core serves: {}", r.body);
    }
    let samples = wait_finished(addr, 14).await;
    let count = |filter: &[(&str, &str)]| sum(&samples, &m("request_success_total"), filter);
    assert_eq!(
        count(&[("finished_reason", "error"), ("engine", "0")]),
        failed.len() as f64
    );
    assert_eq!(count(&[("finished_reason", "error")]), failed.len() as f64);
    assert_eq!(
        count(&[("finished_reason", "length"), ("engine", "1")]),
        (ok.len() + 6) as f64,
        "engine 1 served its share and every later request"
    );
    assert_eq!(
        sum(&samples, &m("kv_cache_usage_perc"), &[("engine", "0")]),
        0.0,
        "the dead core's blocks are freed"
    );
    let failures =
        |filter: &[(&str, &str)]| sum(&samples, &m("engine_core_failures_total"), filter);
    assert_eq!(failures(&[("engine", "0"), ("cause", "panic")]), 1.0);
    assert_eq!(
        failures(&[]),
        1.0,
        "engine 1 did not fail, nothing failed twice"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

/// Prompt tokens admitted but not started are bounded: with one running
/// slot, a queued 30-token prompt leaves no room for another under a limit
/// of 50, which gets 429 and is counted as `max_queued_tokens`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tokens_limit_answers_429() {
    let server = start(&[
        "--max-num-seqs",
        "1",
        "--max-queued-tokens",
        "50",
        "--sim-profile",
        "tiny,t_weights_ms=3",
    ])
    .await;
    let addr = server.addr;
    let prompt = "p".repeat(30);
    let body = json!({"prompt": prompt, "max_tokens": 60, "ignore_eos": true});
    let first = tokio::spawn({
        let body = body.clone();
        async move { post(addr, "/v1/completions", &body).await }
    });
    let state = server.state.clone();
    let wait_for = |what: &'static str, cond: Box<dyn Fn() -> bool + Send>| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    {
        // Its first token releases its queued tokens.
        let s = state.clone();
        wait_for(
            "the first request to start",
            Box::new(move || {
                s.coordinator.engines().any(|e| e.num_running() == 1)
                    && s.admission.queued_tokens() == 0
            }),
        )
        .await;
    }
    let second = tokio::spawn({
        let body = body.clone();
        async move { post(addr, "/v1/completions", &body).await }
    });
    {
        let s = state.clone();
        wait_for(
            "the second request to queue",
            Box::new(move || s.admission.queued_tokens() > 0),
        )
        .await;
    }
    let third = post(addr, "/v1/completions", &body).await;
    let err = assert_openai_error(&third, 429);
    assert_eq!(err["type"], "rate_limit_error");
    assert!(
        err["message"].as_str().unwrap_or("").contains("50"),
        "{err}"
    );
    for t in [first, second] {
        let r = t.await.expect("task");
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["usage"]["completion_tokens"], 60);
    }
    let samples = scrape(addr).await;
    assert_eq!(
        sum(
            &samples,
            &m("admission_rejections_total"),
            &[("reason", "max_queued_tokens")]
        ),
        1.0
    );
    assert_eq!(state.admission.queued_tokens(), 0);
    server.shutdown(Duration::from_secs(5)).await;
}

/// How far a streaming client got before it went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamEnd {
    /// Saw the finish and `[DONE]`.
    Complete,
    /// Dropped the connection before the finish.
    Dropped,
}

/// Streams `body` on a raw connection, to the end (`keep` None) or until
/// `keep` events have come (0: right after the headers), then drops the
/// socket. A raw socket closes in the drop itself; hyper's client closed it
/// from its connection task, which a loaded machine ran seconds later, while
/// the server's writes went on into the kernel's buffer and the "dropped"
/// request ran to its end.
async fn stream_and_drop(addr: SocketAddr, body: Value, keep: Option<usize>) -> StreamEnd {
    let mut conn = RawConn::open(addr).await;
    conn.send(&raw_post("/v1/completions", &body.to_string(), ""))
        .await;
    let head_end = loop {
        if let Some(pos) = conn.read_so_far().windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        assert!(conn.fill().await, "the connection ended before the head");
    };
    assert!(
        conn.read_so_far().starts_with(b"HTTP/1.1 200 "),
        "{}",
        String::from_utf8_lossy(&conn.read_so_far()[..head_end])
    );
    // Events end in a blank line; the chunked framing (CRLFs) makes none.
    let (mut scanned, mut events, mut finished) = (head_end, 0, false);
    let enough = |events: usize| keep.is_some_and(|k| events >= k);
    loop {
        while !enough(events)
            && let Some(pos) = conn.read_so_far()[scanned..]
                .windows(2)
                .position(|w| w == b"\n\n")
        {
            let event = &conn.read_so_far()[scanned..scanned + pos + 2];
            scanned += pos + 2;
            events += 1;
            let has = |needle: &[u8]| event.windows(needle.len()).any(|w| w == needle);
            if has(b"data: [DONE]") {
                assert!(finished, "[DONE] without a finish");
                return StreamEnd::Complete;
            }
            if has(br#""finish_reason":""#) {
                finished = true;
            }
        }
        if enough(events) || !conn.fill().await {
            break;
        }
    }
    assert!(!finished, "stopped reading after the finish");
    drop(conn);
    StreamEnd::Dropped
}

/// A small deterministic generator (xorshift) so the storm is reproducible.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// 2000 streams at 200 at a time; half read to the end, half are dropped
/// after 0..15 events (0: right after the headers). The dropped ones ask for
/// thousands of tokens, so they cannot have finished when dropped: each must
/// be counted as `abort`, each complete one as `length`, and nothing may stay
/// running or hold KV blocks afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_storm_leaks_nothing() {
    const TOTAL: usize = 2000;
    // Steps of 5 ms: a dropped request's 3000+ tokens take 15 s or more,
    // far longer than the server can take to see its client gone, even on
    // a loaded machine (where the runtime writing the streams may lag the
    // engine by seconds: at 0.5 ms a step, a few dropped requests finished).
    let server = start(&["--sim-profile", "tiny,t_weights_ms=5"]).await;
    let addr = server.addr;
    let limit = Arc::new(Semaphore::new(200));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut tasks = Vec::with_capacity(TOTAL);
    for i in 0..TOTAL {
        let drop_it = rng.below(2) == 0;
        // Shared prefixes, so the prefix cache holds blocks afterwards.
        let prompt = format!(
            "{} storm {i}",
            "shared prefix ".repeat(rng.below(8) as usize)
        );
        let (max_tokens, keep) = if drop_it {
            (3000 + rng.below(3000), Some(rng.below(16) as usize))
        } else {
            (1 + rng.below(40), None)
        };
        let body =
            json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "stream": true});
        let permit = limit.clone().acquire_owned().await.expect("semaphore");
        tasks.push(tokio::spawn(async move {
            let end = stream_and_drop(addr, body, keep).await;
            drop(permit);
            end
        }));
    }
    let mut dropped = 0;
    for t in tasks {
        if t.await.expect("task") == StreamEnd::Dropped {
            dropped += 1;
        }
    }
    let complete = TOTAL - dropped;
    assert!(dropped > 0 && complete > 0);

    let samples = wait_finished(addr, TOTAL).await;
    let by = |reason: &str| {
        sum(
            &samples,
            &m("request_success_total"),
            &[("finished_reason", reason)],
        ) as usize
    };
    let counts = ["abort", "length", "stop", "error"].map(|r| (r, by(r)));
    assert_eq!(
        by("abort"),
        dropped,
        "every dropped request is an abort ({dropped} dropped, {complete} read to the end; counted {counts:?})"
    );
    assert_eq!(by("length"), complete);
    // Freed blocks that still hold cached prefixes count as free, not used:
    // usage must be exactly 0 even though the prefix cache is warm.
    assert_eq!(sum(&samples, &m("kv_cache_usage_perc"), &[]), 0.0);
    assert!(
        sum(&samples, &m("prefix_cache_hits_total"), &[]) > 0.0,
        "the prefix cache was used, so cached blocks remain"
    );
    assert_eq!(server.state.admission.queued_tokens(), 0);
    assert_eq!(server.state.coordinator.num_waiting(), 0);
    server.shutdown(Duration::from_secs(5)).await;
}

/// 500 requests at once against room for 8 running and 20 waiting: the
/// surplus gets 429 (each counted), everything admitted completes in full.
/// (The memory this costs is measured on the binary, whose process is the
/// server alone: `crates/inferscope/tests/it/memory.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_burst_gets_429s_and_admitted_requests_complete() {
    let server = start(&[
        "--max-waiting-requests",
        "20",
        "--max-num-seqs",
        "8",
        "--sim-profile",
        "tiny,t_weights_ms=1",
    ])
    .await;
    let addr = server.addr;
    assert_eq!(call(addr, "GET", "/health", "", &[]).await.status, 200);
    let mut tasks = Vec::new();
    for i in 0..500u64 {
        let max_tokens = 8 + i % 25;
        tasks.push(tokio::spawn(async move {
            let r = post(
                addr,
                "/v1/completions",
                &json!({"prompt": format!("burst {i}"), "max_tokens": max_tokens, "ignore_eos": true}),
            )
            .await;
            (max_tokens, r)
        }));
    }
    let (mut ok, mut rejected) = (0, 0);
    for t in tasks {
        let (max_tokens, r) = t.await.expect("task");
        match r.status {
            200 => {
                let v = r.json();
                assert_eq!(v["usage"]["completion_tokens"], max_tokens, "{}", r.body);
                assert_eq!(v["choices"][0]["finish_reason"], "length");
                ok += 1;
            }
            429 => {
                assert_openai_error(&r, 429);
                rejected += 1;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    assert!(ok >= 28 && rejected > 0, "ok {ok}, rejected {rejected}");
    let samples = wait_finished(addr, ok as usize).await;
    assert_eq!(
        sum(
            &samples,
            &m("admission_rejections_total"),
            &[("reason", "max_waiting_requests")]
        ),
        f64::from(rejected)
    );
    assert_eq!(
        sum(
            &samples,
            &m("request_success_total"),
            &[("finished_reason", "length")]
        ),
        f64::from(ok)
    );
    server.shutdown(Duration::from_secs(5)).await;
}

/// With `--metrics-port`, `/metrics` lives on its own listener (no API key
/// there) and the API port answers 404 for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_a_separate_listener() {
    let server = start(&["--metrics-port", "0", "--api-key", "k3y"]).await;
    let addr = server.addr;
    let maddr = server.metrics_addr.expect("a metrics listener");
    assert_ne!(addr, maddr);
    let r = call(addr, "GET", "/metrics", "", &[]).await;
    assert_openai_error(&r, 404);
    let r = call(
        addr,
        "POST",
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 2}).to_string(),
        &[("authorization", "Bearer k3y")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let samples = wait_finished(maddr, 1).await;
    assert_eq!(sum(&samples, &m("request_success_total"), &[]), 1.0);
    assert_eq!(call(maddr, "GET", "/health", "", &[]).await.status, 200);
    assert_eq!(
        call(maddr, "POST", "/v1/completions", "{}", &[])
            .await
            .status,
        404,
        "no API on the metrics listener"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

fn series_keys(samples: &[Sample]) -> BTreeSet<String> {
    samples
        .iter()
        .map(|s| format!("{}{:?}", s.name, s.labels))
        .collect()
}

/// A request with an arbitrary method and raw headers.
async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: String,
    headers: &[(&str, &str)],
) -> u16 {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(30), client().request(req))
        .await
        .expect("in time")
        .expect("response");
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

/// Sends hostile values everywhere a client controls something.
async fn hostile_round(server: &RunningServer, marker: &str) {
    let addr = server.addr;
    let long = format!("{marker}{}", "L".repeat(20_000));
    let ids = [
        format!("{marker}\"}},evil=\"1"),
        format!("{marker}{{le=\"+Inf\"}} 1e308"),
        format!("{marker}\\\\\\"),
        format!("{marker} # {{trace_id=\"x\"}}"),
        long.clone(),
    ];
    for (i, id) in ids.iter().enumerate() {
        // Valid requests carrying the id, streaming and not.
        let stream = i % 2 == 0;
        let r = call(
            addr,
            "POST",
            "/v1/completions",
            &json!({"prompt": "hi", "max_tokens": 2, "stream": stream}).to_string(),
            &[("x-request-id", id)],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let models = [
        format!("{marker}\"}}\n# HELP fake x\nfake 1"),
        format!("{marker}{{a=\"b\"}}"),
        long.clone(),
        format!("{marker}\u{0}\u{7f}ünïcode"),
    ];
    for model in &models {
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let body = json!({"model": model, "prompt": "x", "messages": [{"role": "user", "content": "x"}]});
            let r = call(
                addr,
                "POST",
                path,
                &body.to_string(),
                &[("x-request-id", &ids[0])],
            )
            .await;
            assert_eq!(r.status, 404, "{}", r.body);
        }
    }
    let paths = [
        format!("/{marker}%22%7D%0A"),
        format!("/v1/{marker}/completions"),
        format!("/metrics/{marker}"),
        format!("/{}", &long[..4000]),
    ];
    for path in &paths {
        assert_eq!(raw(addr, "GET", path, String::new(), &[]).await, 404);
    }
    for method in ["BREW", "PROPFIND", "M-SEARCH", "DELETE", "PATCH"] {
        for path in ["/v1/completions", "/metrics", "/x"] {
            let status = raw(
                addr,
                method,
                path,
                "{}".into(),
                &[("x-request-id", &ids[1])],
            )
            .await;
            assert!((400..500).contains(&status), "{method} {path}: {status}");
        }
    }
    // Bad JSON, wrong content types, oversized numbers.
    for body in [
        format!("{{\"prompt\": \"{marker}\", \"max_tokens\": 1e400}}"),
        format!("{{\"{marker}\": [[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]}}"),
        marker.to_owned(),
    ] {
        let status = raw(
            addr,
            "POST",
            "/v1/completions",
            body,
            &[("content-type", "text/evil")],
        )
        .await;
        assert_eq!(status, 400);
    }
}

/// No label value comes from request data: two rounds of hostile requests
/// with different markers leave the same series set, no label value contains
/// a marker, and the exposition still parses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_never_reaches_a_label() {
    let server = start(&[]).await;
    let addr = server.addr;
    hostile_round(&server, "hostileA").await;
    let samples_a = wait_finished(addr, 5).await;
    let after_a = series_keys(&samples_a);
    hostile_round(&server, "hostileB").await;
    let samples_b = wait_finished(addr, 10).await;
    let after_b = series_keys(&samples_b);
    assert_eq!(after_a, after_b, "hostile input created series");
    for s in samples_a.iter().chain(&samples_b) {
        for (k, v) in &s.labels {
            assert!(
                !v.contains("hostile") && !k.contains("hostile") && v.len() < 200,
                "request data in a label: {} {k}={v:?}",
                s.name
            );
        }
    }
    // The OpenMetrics rendering parses the same way and ends properly.
    let om = call(
        addr,
        "GET",
        "/metrics",
        "",
        &[("accept", "application/openmetrics-text; version=1.0.0")],
    )
    .await;
    assert!(om.body.trim_end().ends_with("# EOF"));
    // Exemplars name requests by the client's `x-request-id` (escaped, cut to
    // 128 characters): request data there, and nowhere else.
    inferscope_schema::promtext::parse(&om.body).unwrap_or_else(|e| panic!("{e}"));
    for line in om.body.lines() {
        let sample = line.split(" # {").next().unwrap_or(line);
        assert!(!sample.contains("hostile"), "{line}");
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// The one label value an operator chooses, the served model name, is
/// escaped in the exposition: quotes, backslashes and newlines round-trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_values_are_escaped() {
    let name = "we\"ird\\model\nname";
    let server = start(&["--served-model-name", name]).await;
    let addr = server.addr;
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": name, "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let text = call(addr, "GET", "/metrics", "", &[]).await.body;
    let samples = parse_exposition(&text);
    let labelled: Vec<_> = samples
        .iter()
        .filter(|s| s.labels.contains_key("model_name"))
        .collect();
    assert!(!labelled.is_empty());
    for s in labelled {
        assert_eq!(s.labels["model_name"], name, "{}", s.name);
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// One client cannot fail another's request by reusing its `x-request-id`
/// (or guessing a generated one): two requests with the same id, the
/// first still streaming when the second arrives, both succeed, and each
/// gets its id echoed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_with_the_same_request_id_both_succeed() {
    let server = start(&["--sim-profile", "tiny,t_weights_ms=1"]).await;
    let addr = server.addr;
    let id = [("x-request-id", "same-id")];
    let long = json!({"prompt": "first", "max_tokens": 1000, "ignore_eos": true, "stream": true});
    let first = send(addr, "POST", "/v1/completions", &long.to_string(), &id).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-request-id"], "same-id");
    let mut body = first.into_body();
    // Its first chunk is out: the first request is in the engine now.
    let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("first chunk in time");
    assert!(frame.is_some_and(|f| f.is_ok()));

    let short = json!({"prompt": "second", "max_tokens": 3, "ignore_eos": true});
    let second = call(addr, "POST", "/v1/completions", &short.to_string(), &id).await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(second.headers["x-request-id"], "same-id");
    assert_eq!(second.json()["id"], "cmpl-same-id");

    let rest = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("first stream ends")
        .expect("first stream body")
        .to_bytes();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    assert!(!rest.contains("\"error\""), "{rest}");
    server.shutdown(Duration::from_secs(5)).await;
}
