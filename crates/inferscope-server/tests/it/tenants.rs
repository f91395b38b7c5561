//! Tenants from `--api-key-file`: each key names its tenant (401 otherwise),
//! and under a flood from one tenant, fair admission serves another's
//! requests without waiting behind the flood, where FCFS makes them wait.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use inferscope_test_support::TempFile;
use serde_json::json;

/// A key file for tenants `flood` and `light`, removed when dropped, and
/// its path.
fn key_file() -> (TempFile, String) {
    key_file_with(
        r#"{"tenants": [{"name": "flood", "key": "key-flood"},
                        {"name": "light", "key": "key-light"}]}"#,
    )
}

/// A key file holding `text`, and its path.
fn key_file_with(text: &str) -> (TempFile, String) {
    let file = TempFile::json("inferscope-tenants", text);
    let arg = file.arg.clone();
    (file, arg)
}

async fn complete(addr: std::net::SocketAddr, key: &str) -> Reply {
    complete_with(addr, key, 16).await
}

async fn complete_with(addr: std::net::SocketAddr, key: &str, max_tokens: usize) -> Reply {
    let body = json!({"prompt": "hello there", "max_tokens": max_tokens, "ignore_eos": true});
    let auth = format!("Bearer {key}");
    call(
        addr,
        "POST",
        "/v1/completions",
        &body.to_string(),
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
    )
    .await
}

/// Three tenants (the bound, 3, leaves `team-c` to `other`): each tenant's
/// token counters equal the sum of the `usage` of its responses, and the key
/// itself appears nowhere in the exposition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counters_are_attributed_to_tenants_within_the_bound() {
    let (_dir, keys) = key_file_with(
        r#"{"tenants": [{"name": "team-a", "key": "secret-key-a"},
                        {"name": "team-b", "key": "secret-key-b"},
                        {"name": "team-c", "key": "secret-key-c"}]}"#,
    );
    let server = start(&[
        "--api-key-file",
        &keys,
        "--max-tenant-labels",
        "3",
        "--metrics-namespace",
        "vllm",
    ])
    .await;
    let addr = server.addr;
    let mut usage = std::collections::BTreeMap::<&str, (f64, f64, f64)>::new();
    for (key, label, n, max_tokens) in [
        ("secret-key-a", "team-a", 3, 5),
        ("secret-key-b", "team-b", 2, 9),
        ("secret-key-c", "other", 4, 3),
    ] {
        for _ in 0..n {
            let r = complete_with(addr, key, max_tokens).await;
            assert_eq!(r.status, 200, "{}", r.body);
            let u = &r.json()["usage"];
            let e = usage.entry(label).or_default();
            e.0 += u["prompt_tokens"].as_f64().expect("prompt_tokens");
            e.1 += u["completion_tokens"].as_f64().expect("completion_tokens");
            e.2 += 1.0;
        }
    }
    let text = call(addr, "GET", "/metrics", "", &[]).await.body;
    let samples = scrape_when(addr, "vllm:request_success_total", 9.0).await;
    for (label, (prompt, generation, requests)) in &usage {
        let t = [("tenant", *label)];
        assert_eq!(
            sum(&samples, "vllm:prompt_tokens_total", &t),
            *prompt,
            "{label}"
        );
        assert_eq!(
            sum(&samples, "vllm:generation_tokens_total", &t),
            *generation,
            "{label}"
        );
        assert_eq!(
            sum(
                &samples,
                "vllm:request_success_total",
                &[("tenant", label), ("finished_reason", "length")]
            ),
            *requests,
            "{label}"
        );
        assert_eq!(
            sum(&samples, "vllm:e2e_request_latency_seconds_count", &t),
            *requests,
            "{label}"
        );
        assert_eq!(
            sum(&samples, "vllm:time_to_first_token_seconds_count", &t),
            *requests,
            "{label}"
        );
    }
    assert_eq!(sum(&samples, "vllm:tenant_labels_folded", &[]), 1.0);
    assert_eq!(
        sum(
            &samples,
            "vllm:prompt_tokens_total",
            &[("tenant", "team-c")]
        ),
        0.0,
        "past the bound a tenant has no series of its own"
    );
    assert!(!text.contains("secret-key"), "a key leaked into /metrics");
    server.shutdown(Duration::from_secs(5)).await;
}

/// A tenant over its `max_concurrent` or `tokens_per_minute` gets 429s
/// with `Retry-After`, counted as `reason="tenant_limit"`, while another
/// tenant gets 200s; afterwards nothing is left running or holding blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_limits_answer_429_with_retry_after_and_leak_nothing() {
    let (_dir, keys) = key_file_with(
        r#"{"tenants": [{"name": "capped", "key": "key-capped", "max_concurrent": 2},
                        {"name": "metered", "key": "key-metered", "tokens_per_minute": 40},
                        {"name": "free", "key": "key-free"}]}"#,
    );
    // 2 ms a step: a 64-token request holds its slot for over 100 ms.
    let server = start(&[
        "--api-key-file",
        &keys,
        "--sim-profile",
        "tiny,t_fixed_ms=2",
    ])
    .await;
    let addr = server.addr;
    let burst: Vec<_> = (0..8)
        .map(|_| tokio::spawn(async move { complete_with(addr, "key-capped", 64).await }))
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        complete(addr, "key-free").await.status,
        200,
        "another tenant is served"
    );
    let mut refused = 0;
    for b in burst {
        let r = b.await.expect("burst task");
        match r.status {
            200 => {}
            429 => {
                refused += 1;
                let retry = r.headers.get("retry-after").expect("Retry-After");
                assert_eq!(retry.to_str().expect("ascii"), "1");
                let e = &r.json()["error"];
                assert_eq!(e["type"], "rate_limit_error");
                assert!(
                    e["message"]
                        .as_str()
                        .expect("message")
                        .contains("max_concurrent"),
                    "{e}"
                );
            }
            other => panic!("status {other}: {}", r.body),
        }
    }
    assert!(
        refused >= 6,
        "only {refused} of 8 refused over max_concurrent 2"
    );
    // The permits came back: the capped tenant is served again.
    assert_eq!(complete(addr, "key-capped").await.status, 200);

    // tokens_per_minute 40: the first request (prompt + 16) passes, the
    // next ones find the minute's tokens spent.
    let first = complete(addr, "key-metered").await;
    assert_eq!(first.status, 200, "{}", first.body);
    let second = complete(addr, "key-metered").await;
    let over = if second.status == 200 {
        complete(addr, "key-metered").await
    } else {
        second
    };
    assert_eq!(over.status, 429, "{}", over.body);
    let retry: u64 = over.headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert!(over.body.contains("tokens_per_minute"), "{}", over.body);
    assert_eq!(complete(addr, "key-free").await.status, 200);

    let samples = scrape(addr).await;
    assert!(
        sum(
            &samples,
            "inferscope_admission_rejections_total",
            &[("reason", "tenant_limit")]
        ) >= f64::from(refused + 1)
    );
    // Nothing leaked: no request running or waiting, no KV block held.
    assert_eq!(sum(&samples, "inferscope_num_requests_running", &[]), 0.0);
    assert_eq!(sum(&samples, "inferscope_num_requests_waiting", &[]), 0.0);
    assert_eq!(sum(&samples, "inferscope_kv_cache_usage_perc", &[]), 0.0);
    server.shutdown(Duration::from_secs(5)).await;
}

/// `--tenant-header` names the tenant only on connections from a
/// `--trusted-proxy` address; from anyone else the header is ignored and
/// the API key decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_header_is_believed_only_from_trusted_proxies() {
    let (_dir, keys) = key_file();
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let headers = [
        ("content-type", "application/json"),
        ("x-tenant", "gateway-team"),
    ];
    let trusted = start(&[
        "--api-key-file",
        &keys,
        "--tenant-header",
        "x-tenant",
        "--trusted-proxy",
        "10.0.0.0/8,127.0.0.1",
    ])
    .await;
    let r = call(trusted.addr, "POST", "/v1/completions", &body, &headers).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let bad = call(
        trusted.addr,
        "POST",
        "/v1/completions",
        &body,
        &[
            ("content-type", "application/json"),
            ("x-tenant", "two words"),
        ],
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["type"], "invalid_request_error");
    let samples = scrape_when(trusted.addr, "inferscope_request_success_total", 1.0).await;
    assert_eq!(
        sum(
            &samples,
            "inferscope_request_success_total",
            &[("tenant", "gateway-team")]
        ),
        1.0
    );
    trusted.shutdown(Duration::from_secs(5)).await;

    let untrusted = start(&[
        "--api-key-file",
        &keys,
        "--tenant-header",
        "x-tenant",
        "--trusted-proxy",
        "10.0.0.1",
    ])
    .await;
    let r = call(untrusted.addr, "POST", "/v1/completions", &body, &headers).await;
    assert_eq!(r.status, 401, "{}", r.body);
    untrusted.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_name_tenants_and_others_get_401() {
    let (_dir, keys) = key_file();
    let server = start(&["--api-key-file", &keys]).await;
    let addr = server.addr;
    assert_eq!(complete(addr, "key-light").await.status, 200);
    assert_eq!(complete(addr, "key-flood").await.status, 200);
    let wrong = complete(addr, "key-nobody").await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_eq!(wrong.json()["error"]["type"], "authentication_error");
    let none = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(none.status, 401);
    server.shutdown(Duration::from_secs(5)).await;
}

/// Mean latency of `light`'s requests, sent one after another, while
/// `flood` keeps far more requests in flight than the engine runs at once.
async fn light_latency_under_flood(policy: &str) -> Duration {
    let (_dir, keys) = key_file();
    let server = start(&[
        "--api-key-file",
        &keys,
        "--scheduling-policy",
        policy,
        "--max-num-seqs",
        "4",
        // 2 ms a step: the flood takes about a second to drain.
        "--sim-profile",
        "tiny,t_fixed_ms=2",
    ])
    .await;
    let addr = server.addr;
    let flood: Vec<_> = (0..120)
        .map(|_| tokio::spawn(async move { complete(addr, "key-flood").await.status }))
        .collect();
    // Let the flood fill the waiting queue first.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut total = Duration::ZERO;
    for _ in 0..3 {
        let t = Instant::now();
        let r = complete(addr, "key-light").await;
        assert_eq!(r.status, 200, "{}", r.body);
        total += t.elapsed();
    }
    for f in flood {
        assert_eq!(f.await.expect("flood task"), 200);
    }
    server.shutdown(Duration::from_secs(5)).await;
    total / 3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_admission_serves_a_light_tenant_through_a_flood() {
    let fair = light_latency_under_flood("fair").await;
    let fcfs = light_latency_under_flood("fcfs").await;
    eprintln!("light tenant's mean latency under the flood: fair {fair:?}, fcfs {fcfs:?}");
    // Under FCFS each light request waits behind the whole flood ahead of
    // it (about 30 batches of 16 steps); fairly, behind one flood request.
    assert!(
        fair * 4 < fcfs,
        "light tenant's mean latency: fair {fair:?}, fcfs {fcfs:?}"
    );
}

/// The request log names each choice's tenant (`anonymous` without one),
/// never its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_names_the_tenant_not_the_key() {
    let (_dir, keys) = key_file();
    let log = std::env::temp_dir().join(format!(
        "inferscope-tenant-log-{}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&log);
    let server = start(&[
        "--api-key-file",
        &keys,
        "--enable-request-log",
        log.to_str().expect("utf-8 path"),
    ])
    .await;
    assert_eq!(complete(server.addr, "key-light").await.status, 200);
    assert_eq!(complete(server.addr, "key-flood").await.status, 200);
    // The log's writer is a thread of its own: wait for both lines.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 2 || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    server.shutdown(Duration::from_secs(5)).await;
    let _ = std::fs::remove_file(&log);
    let tenants: Vec<String> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            v["tenant"].as_str().expect("tenant field").to_owned()
        })
        .collect();
    assert_eq!(tenants, ["light", "flood"], "{text}");
    assert!(
        !text.contains("key-"),
        "a key leaked into the request log: {text}"
    );
}
