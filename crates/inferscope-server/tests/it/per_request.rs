//! Per-request timings (`--enable-per-request-metrics`), exemplars and the
//! request log (`--enable-request-log`), checked against the server's own
//! histograms read back from `/metrics`.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const NS: &str = "inferscope_";

/// `(upper bound, cumulative count)` of `family`'s buckets, in order.
fn buckets(samples: &[Sample], family: &str) -> Vec<(f64, f64)> {
    let name = format!("{NS}{family}_bucket");
    let mut out: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| {
            let le = match s.labels["le"].as_str() {
                "+Inf" => f64::INFINITY,
                v => v.parse().expect("le"),
            };
            (le, s.value)
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The one bucket `(lower, upper]` that gained exactly one observation
/// between `before` and `after`.
fn counted_bucket(before: &[Sample], after: &[Sample], family: &str) -> (f64, f64) {
    let (b, a) = (buckets(before, family), buckets(after, family));
    assert_eq!(b.len(), a.len(), "{family}");
    let total = a.last().unwrap().1 - b.last().unwrap().1;
    assert_eq!(total, 1.0, "{family}: one request, one observation");
    let mut lower = f64::NEG_INFINITY;
    for ((le, cb), (_, ca)) in b.iter().zip(&a) {
        // Cumulative: the first bucket whose count moved holds the value.
        if ca - cb == 1.0 {
            return (lower, *le);
        }
        lower = *le;
    }
    unreachable!("{family}: no bucket moved")
}

fn assert_in(family: &str, ms: f64, (lower, upper): (f64, f64)) {
    let secs = ms / 1e3;
    // Milliseconds back to seconds may differ in the last bit of a float.
    let eps = 1e-12;
    assert!(
        lower - eps < secs && secs <= upper + eps,
        "{family}: {secs} s outside the bucket ({lower}, {upper}] the histogram counted"
    );
}

/// The families and the `metrics` key each must agree with.
const CHECKS: [(&str, &str); 6] = [
    ("time_to_first_token_seconds", "time_to_first_token_ms"),
    ("e2e_request_latency_seconds", "generation_time_ms"),
    ("request_queue_time_seconds", "queue_time_ms"),
    ("request_prefill_time_seconds", "prefill_time_ms"),
    ("request_decode_time_seconds", "decode_time_ms"),
    ("request_time_per_output_token_seconds", "mean_itl_ms"),
];

async fn settled_scrape(addr: std::net::SocketAddr, finished: f64) -> Vec<Sample> {
    scrape_when(addr, &format!("{NS}request_success_total"), finished).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_timings_fall_in_the_buckets_the_histograms_counted() {
    let dir = std::env::temp_dir().join(format!("inferscope-reqlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log_path = dir.join("requests.jsonl");
    let _ = std::fs::remove_file(&log_path);
    let server = start(&[
        "--enable-per-request-metrics",
        "--enable-request-log",
        log_path.to_str().unwrap(),
    ])
    .await;
    let addr = server.addr;
    let mut finished = 0.0;
    let mut before = settled_scrape(addr, finished).await;
    let mut sent: Vec<(String, usize)> = Vec::new();
    for (i, (stream, usage)) in [(false, false), (true, false), (true, true)]
        .into_iter()
        .enumerate()
    {
        let id = format!("timed-{i}");
        let mut body = json!({"prompt": format!("timings {i}"), "max_tokens": 12, "ignore_eos": true,
            "include_metrics": true, "stream": stream});
        if usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let r = call(
            addr,
            "POST",
            "/v1/completions",
            &body.to_string(),
            &[("x-request-id", &id)],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let metrics: Value = if stream {
            let events = sse_events(&r.body);
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
            let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
            assert_eq!(last["choices"], json!([]), "a final chunk of its own");
            assert_eq!(last.get("usage").is_some(), usage, "{last}");
            // Only the final chunk carries them.
            for e in &events[..events.len() - 2] {
                assert!(!e.contains("\"metrics\""), "{e}");
            }
            last["metrics"].clone()
        } else {
            let v = r.json();
            assert_eq!(v["usage"]["completion_tokens"], 12);
            // TGI's headers: whole milliseconds of the same figures.
            let header = |k: &str| -> f64 { r.headers[k].to_str().unwrap().parse().expect(k) };
            let m = &v["metrics"];
            for (h, key) in [
                ("x-queue-time", "queue_time_ms"),
                ("x-total-time", "generation_time_ms"),
                ("x-time-per-token", "mean_itl_ms"),
            ] {
                assert_eq!(header(h), m[key].as_f64().unwrap().round(), "{h}");
            }
            let inference =
                m["prefill_time_ms"].as_f64().unwrap() + m["decode_time_ms"].as_f64().unwrap();
            assert!(
                header("x-inference-time") >= inference.floor(),
                "inference covers prefill and decode"
            );
            v["metrics"].clone()
        };
        sent.push((id, 12));
        finished += 1.0;
        let after = settled_scrape(addr, finished).await;
        for (family, key) in CHECKS {
            let ms = metrics[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} in {metrics}"));
            assert_in(family, ms, counted_bucket(&before, &after, family));
        }
        assert_eq!(metrics["num_preemptions"], 0);
        let tps = metrics["tokens_per_second"].as_f64().unwrap();
        let e2e_s = metrics["generation_time_ms"].as_f64().unwrap() / 1e3;
        assert!((tps * e2e_s - 12.0).abs() < 1e-6, "{metrics}");
        before = after;
    }

    // OpenMetrics: the exemplars name the requests sent, on latency buckets;
    // read before another request can take timed-2's bucket (under load a
    // 3-token and a 12-token request can share one).
    let om = call(
        addr,
        "GET",
        "/metrics",
        "",
        &[("accept", "application/openmetrics-text; version=1.0.0")],
    )
    .await;
    let parsed = inferscope_schema::promtext::parse(&om.body).unwrap();
    let e2e_ids: Vec<String> = parsed
        .samples()
        .filter(|s| s.name == format!("{NS}e2e_request_latency_seconds_bucket"))
        .filter_map(|s| s.exemplar.as_ref())
        .map(|e| e.labels["request_id"].clone())
        .collect();
    assert!(!e2e_ids.is_empty(), "{}", om.body);
    for id in &e2e_ids {
        assert!(
            id.starts_with("timed-") || id.contains('-'),
            "exemplar {id} names a request sent"
        );
    }
    assert!(
        e2e_ids.iter().any(|id| id.starts_with("timed-2-")),
        "the last timed request is an exemplar: {e2e_ids:?}"
    );

    // Without `include_metrics`: no metrics, no headers.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "plain", "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert!(r.json().get("metrics").is_none(), "{}", r.body);
    assert!(r.headers.get("x-total-time").is_none());
    sent.push((String::new(), 0));

    // The request log: one line per request, fields as in the responses.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        if lines.len() >= sent.len() || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines.len(), sent.len(), "{lines:?}");
    for (i, (id, tokens)) in sent.iter().enumerate().take(3) {
        let l = &lines[i];
        assert!(
            l["request_id"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{id}-")),
            "{l}"
        );
        assert_eq!(l["completion_tokens"], *tokens as u64);
        assert_eq!(l["finish_reason"], "length");
        assert_eq!(l["engine"], 0);
        assert_eq!(l["trace_id"], Value::Null);
        assert!(l["prompt_tokens"].as_u64().unwrap() > 0);
        assert!(
            l["generation_time_ms"].as_f64().unwrap()
                >= l["time_to_first_token_ms"].as_f64().unwrap()
        );
    }
    assert_eq!(lines[3]["completion_tokens"], 3);
    let samples = scrape(addr).await;
    assert_eq!(
        sum(&samples, &format!("{NS}request_log_dropped_total"), &[]),
        0.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_metrics_is_ignored_without_the_flag() {
    let server = start(&[]).await;
    let r = post(
        server.addr,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 4, "include_metrics": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json().get("metrics").is_none(), "{}", r.body);
    assert!(r.headers.get("x-queue-time").is_none());
    let r = post(
        server.addr,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 4, "include_metrics": true, "stream": true}),
    )
    .await;
    assert!(!r.body.contains("\"metrics\""), "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_request_log_is_a_clear_start_up_error() {
    start_fails(
        &["--enable-request-log", "/nonexistent-dir/requests.jsonl"],
        &["--enable-request-log", "/nonexistent-dir/requests.jsonl"],
    )
    .await;
}
