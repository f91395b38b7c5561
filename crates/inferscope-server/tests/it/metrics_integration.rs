//! The metrics a known workload must produce, read back from `/metrics` and
//! parsed (not grepped).

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use http_body_util::BodyExt;
use serde_json::json;

const NS: &str = "inferscope_";

fn m(name: &str) -> String {
    format!("{NS}{name}")
}

/// 20 requests, `ignore_eos`, `max_tokens` 16, half streaming, on two engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_workload_counts_exactly_per_engine() {
    let server = start(&["--data-parallel-size", "2"]).await;
    let addr = server.addr;
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(tokio::spawn(async move {
            let stream = i % 2 == 0;
            let r = post(
                addr,
                "/v1/completions",
                &json!({"prompt": format!("request number {i}"), "max_tokens": 16, "ignore_eos": true, "stream": stream}),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.body);
            if stream {
                let events = sse_events(&r.body);
                assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
            } else {
                assert_eq!(r.json()["usage"]["completion_tokens"], 16);
            }
        }));
    }
    for t in tasks {
        t.await.expect("request task");
    }
    // A path no route matches.
    assert_eq!(
        call(addr, "GET", "/no/such/path", "", &[]).await.status,
        404
    );

    let samples = scrape_when(addr, &m("request_success_total"), 20.0).await;
    assert_eq!(sum(&samples, &m("request_success_total"), &[]), 20.0);
    assert_eq!(
        sum(
            &samples,
            &m("request_success_total"),
            &[("finished_reason", "length")]
        ),
        20.0
    );
    assert_eq!(sum(&samples, &m("generation_tokens_total"), &[]), 320.0);
    let e0 = sum(&samples, &m("generation_tokens_total"), &[("engine", "0")]);
    let e1 = sum(&samples, &m("generation_tokens_total"), &[("engine", "1")]);
    assert!(e0 > 0.0 && e1 > 0.0, "both engines served: {e0} {e1}");
    assert_eq!(e0 + e1, 320.0);
    let s0 = sum(&samples, &m("request_success_total"), &[("engine", "0")]);
    let s1 = sum(&samples, &m("request_success_total"), &[("engine", "1")]);
    assert_eq!(s0 + s1, 20.0);
    assert_eq!(
        sum(&samples, &m("time_to_first_token_seconds_count"), &[]),
        20.0
    );
    assert_eq!(
        sum(&samples, &m("e2e_request_latency_seconds_count"), &[]),
        20.0
    );
    assert_eq!(
        sum(
            &samples,
            "http_requests_total",
            &[
                ("handler", "/v1/completions"),
                ("method", "POST"),
                ("status", "2xx")
            ]
        ),
        20.0
    );
    assert_eq!(
        sum(
            &samples,
            "http_requests_total",
            &[("handler", "none"), ("status", "4xx")]
        ),
        1.0
    );
    assert_histograms_well_formed(&samples);
    server.shutdown(Duration::from_secs(5)).await;
}

/// The same request, full and streamed, adds the same number of TTFT and
/// inter-token samples: one per text delta, whether or not the client sees
/// the deltas one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_and_streamed_responses_sample_latency_alike() {
    let server = start(&[]).await;
    let addr = server.addr;
    let body = |stream: bool| {
        json!({"prompt": "Mr. Darcy", "max_tokens": 24, "ignore_eos": true,
               "temperature": 0.9, "seed": 11, "stream": stream})
    };
    let counts = |samples: &[Sample]| {
        (
            sum(samples, &m("time_to_first_token_seconds_count"), &[]),
            sum(samples, &m("inter_token_latency_seconds_count"), &[]),
        )
    };
    let full = post(addr, "/v1/completions", &body(false)).await;
    assert_eq!(full.status, 200, "{}", full.body);
    let after_full = counts(&scrape_when(addr, &m("request_success_total"), 1.0).await);
    let streamed = post(addr, "/v1/completions", &body(true)).await;
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    let samples = scrape_when(addr, &m("request_success_total"), 2.0).await;
    let after_both = counts(&samples);

    // The same text both ways (same seed), and one delta per chunk with text.
    let text: String = sse_events(&streamed.body)
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).expect("chunk JSON");
            v["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(full.json()["choices"][0]["text"], text);
    let deltas = sse_events(&streamed.body)
        .iter()
        .filter(|e| e.contains("\"text\":\"") && !e.contains("\"text\":\"\""))
        .count() as f64;
    assert!(deltas > 10.0, "{deltas} deltas");
    assert_eq!(after_full.0, 1.0);
    assert_eq!(after_both.0, 2.0);
    let streamed_itl = after_both.1 - after_full.1;
    assert_eq!(after_full.1, streamed_itl, "ITL samples: full vs streamed");
    assert!(
        (streamed_itl - (deltas - 1.0)).abs() <= 1.0,
        "{streamed_itl} ITL samples for {deltas} text deltas"
    );
    assert!(sum(&samples, &m("inter_token_latency_seconds_sum"), &[]) > 0.0);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_paths_add_no_series() {
    let server = start(&[]).await;
    let addr = server.addr;
    assert_eq!(call(addr, "GET", "/warm-up", "", &[]).await.status, 404);
    let before: BTreeSet<String> = series_keys(&scrape(addr).await);
    for i in 0..1000 {
        let r = call(addr, "GET", &format!("/scan/{i}/{}", i * 7919), "", &[]).await;
        assert_eq!(r.status, 404);
    }
    let after = series_keys(&scrape(addr).await);
    assert_eq!(before, after, "a path scan must not create series");
    server.shutdown(Duration::from_secs(5)).await;
}

fn series_keys(samples: &[Sample]) -> BTreeSet<String> {
    samples
        .iter()
        .map(|s| format!("{}{:?}", s.name, s.labels))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_duration_covers_the_whole_stream() {
    // 5 ms per decode step: 40 tokens (39 decode steps) take at least 195 ms.
    let server = start(&["--sim-profile", "tiny,t_weights_ms=5"]).await;
    let addr = server.addr;
    let t0 = Instant::now();
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "time me", "max_tokens": 40, "ignore_eos": true, "stream": true}),
    )
    .await;
    let client_seen = t0.elapsed().as_secs_f64();
    assert_eq!(r.status, 200);
    assert!(
        client_seen >= 0.195,
        "the stream itself took {client_seen}s"
    );
    let samples = scrape(addr).await;
    let recorded = sum(
        &samples,
        "http_request_duration_seconds_sum",
        &[("handler", "/v1/completions")],
    );
    assert!(
        recorded >= 0.195 && recorded <= client_seen + 0.05,
        "recorded {recorded}s, client saw {client_seen}s"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_stream_is_counted_and_frees_its_blocks() {
    let server = start(&["--sim-profile", "tiny,t_weights_ms=2"]).await;
    let addr = server.addr;
    let resp = send(
        addr,
        "POST",
        "/v1/completions",
        &json!({"prompt": "never mind", "max_tokens": 5000, "ignore_eos": true, "stream": true})
            .to_string(),
        &[],
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.into_body();
    let mut got = 0;
    while got < 3 {
        let frame = body.frame().await.expect("a frame").expect("ok frame");
        if frame.data_ref().is_some() {
            got += 1;
        }
    }
    let samples = scrape(addr).await;
    assert_eq!(sum(&samples, &m("num_requests_running"), &[]), 1.0);
    assert!(sum(&samples, &m("kv_cache_usage_perc"), &[]) > 0.0);
    drop(body);

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let samples = scrape(addr).await;
        let aborted = sum(
            &samples,
            &m("request_success_total"),
            &[("finished_reason", "abort")],
        );
        let running = sum(&samples, &m("num_requests_running"), &[]);
        let kv = sum(&samples, &m("kv_cache_usage_perc"), &[]);
        if aborted == 1.0 && running == 0.0 && kv == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "abort not reflected: aborted {aborted}, running {running}, kv {kv}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_namespace_and_openmetrics() {
    let server = start(&["--metrics-namespace", "vllm"]).await;
    let addr = server.addr;
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200);
    let samples = scrape_when(addr, "vllm:request_success_total", 1.0).await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:request_success_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
    ] {
        assert!(samples.iter().any(|s| s.name == name), "missing {name}");
    }
    assert!(!samples.iter().any(|s| s.name.starts_with("inferscope_")));
    // vLLM's latency buckets, not the native finer ones: 0.3 s is the first edge.
    let queue_le: Vec<&str> = samples
        .iter()
        .filter(|s| s.name == "vllm:request_queue_time_seconds_bucket")
        .filter_map(|s| s.label("le"))
        .collect();
    assert_eq!(queue_le.first(), Some(&"0.3"), "{queue_le:?}");
    let om = call(
        addr,
        "GET",
        "/metrics",
        "",
        &[("accept", "application/openmetrics-text; version=1.0.0")],
    )
    .await;
    assert!(
        om.headers["content-type"]
            .to_str()
            .unwrap_or("")
            .starts_with("application/openmetrics-text"),
        "{:?}",
        om.headers
    );
    assert!(om.body.trim_end().ends_with("# EOF"));
    let text = call(addr, "GET", "/metrics", "", &[]).await;
    assert!(
        text.headers["content-type"]
            .to_str()
            .unwrap_or("")
            .starts_with("text/plain; version=0.0.4")
    );
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_metrics_hides_the_endpoint() {
    let server = start(&["--disable-metrics"]).await;
    let r = call(server.addr, "GET", "/metrics", "", &[]).await;
    assert_eq!(r.status, 404);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("disabled")
    );
    server.shutdown(Duration::from_secs(5)).await;
}

/// vLLM's request-parameter histograms: `n` (and the most tokens a choice
/// generated) once per prompt, `max_tokens` once per choice, as vLLM
/// observes them; with two engines, so the choices may be spread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_params_n_and_max_tokens_land_in_their_buckets() {
    let server = start(&["--metrics-namespace", "vllm", "--data-parallel-size", "2"]).await;
    let addr = server.addr;
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "n": 3, "max_tokens": 7, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"].as_array().map(Vec::len), Some(3));
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 100, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let samples = scrape_when(addr, "vllm:request_success_total", 4.0).await;
    assert_histograms_well_formed(&samples);
    let bucket = |name: &str, le: &str| sum(&samples, &format!("{name}_bucket"), &[("le", le)]);
    let n = "vllm:request_params_n";
    assert_eq!(
        sum(&samples, &format!("{n}_count"), &[]),
        2.0,
        "once per prompt"
    );
    assert_eq!(sum(&samples, &format!("{n}_sum"), &[]), 3.0 + 1.0);
    // vLLM's buckets 1, 2, 5, 10, 20: n=1 in the first, n=3 up to 5.
    assert_eq!(
        [bucket(n, "1"), bucket(n, "2"), bucket(n, "5")],
        [1.0, 1.0, 2.0]
    );
    let max = "vllm:request_params_max_tokens";
    assert_eq!(
        sum(&samples, &format!("{max}_count"), &[]),
        4.0,
        "once per choice"
    );
    assert_eq!(sum(&samples, &format!("{max}_sum"), &[]), 3.0 * 7.0 + 100.0);
    assert_eq!(
        [
            bucket(max, "5"),
            bucket(max, "10"),
            bucket(max, "50"),
            bucket(max, "100")
        ],
        [0.0, 3.0, 3.0, 4.0]
    );
    let most = "vllm:request_max_num_generation_tokens";
    assert_eq!(sum(&samples, &format!("{most}_count"), &[]), 2.0);
    assert_eq!(sum(&samples, &format!("{most}_sum"), &[]), 7.0 + 100.0);
    server.shutdown(Duration::from_secs(5)).await;
}
