//! Tenants on the proxy, in front of `inferscope serve` (sim executor):
//! the key file names who sent each request (401 otherwise), the token
//! counters are split by tenant within `--max-tenant-labels`, a tenant's
//! limits answer 429 while other tenants get 200, and with
//! `--max-upstream-concurrency` a light tenant is not queued behind a
//! flooding one.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{proxy, serve};
use inferscope_schema::promtext;
use inferscope_test_support::{Reply, TempFile, call};

/// A key file holding `text`, removed when dropped.
fn key_file(text: &str) -> TempFile {
    TempFile::json("inferscope-proxy-tenants", text)
}

async fn complete(addr: SocketAddr, key: &str, max_tokens: u32, stream: bool) -> Reply {
    // A stream asks for its usage (the proxy takes out a usage chunk the
    // client did not ask for).
    let body = serde_json::json!({"model": "m", "prompt": "hello there tenants",
        "max_tokens": max_tokens, "ignore_eos": true, "stream": stream,
        "stream_options": {"include_usage": stream}});
    let auth = format!("Bearer {key}");
    call(
        addr,
        "POST",
        "/v1/completions",
        &body.to_string(),
        &[("authorization", &auth)],
    )
    .await
}

/// The usage of a response (the last SSE event's for a stream).
fn usage(r: &Reply) -> (f64, f64) {
    let u = if r.body.starts_with("data: ") {
        let last = inferscope_test_support::sse_events(&r.body)
            .into_iter()
            .rfind(|e| e != "[DONE]" && e.contains("\"usage\""))
            .expect("a usage chunk");
        serde_json::from_str::<serde_json::Value>(&last).expect("json")["usage"].clone()
    } else {
        r.json()["usage"].clone()
    };
    let n = |k: &str| u[k].as_f64().unwrap_or_else(|| panic!("{k} in {u}"));
    (n("prompt_tokens"), n("completion_tokens"))
}

async fn metrics(addr: SocketAddr) -> String {
    let r = call(addr, "GET", "/metrics", "", &[]).await;
    assert_eq!(r.status, 200);
    r.body
}

fn by_tenant(text: &str, name: &str, tenant: &str) -> f64 {
    let e = promtext::parse(text).expect("exposition");
    promtext::sum(e.samples(), name, &[("tenant", tenant)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_attributed_limited_and_refused_without_a_key() {
    let keys = key_file(
        r#"{"tenants": [{"name": "team-a", "key": "secret-a"},
                        {"name": "team-b", "key": "secret-b", "max_concurrent": 1},
                        {"name": "team-c", "key": "secret-c"},
                        {"name": "team-d", "key": "secret-d", "tokens_per_minute": 5}]}"#,
    );
    // 30 ms steps: a 20-token stream is in flight for ~0.6 s.
    let server = serve(&[
        "--sim-profile",
        "tiny,t_fixed_ms=30",
        "--served-model-name",
        "m",
    ])
    .await;
    let keys_arg = keys.arg.clone();
    let p = proxy(
        &format!("http://{}", server.addr),
        &["--api-key-file", &keys_arg, "--max-tenant-labels", "3"],
    )
    .await;
    let addr = p.addr;

    // No key, or one not in the file: 401 with an OpenAI error body.
    for key in ["", "secret-z"] {
        let r = complete(addr, key, 2, false).await;
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    }
    let r = call(addr, "GET", "/v1/models", "", &[]).await;
    assert_eq!(r.status, 401, "pass-through routes need a key too");

    // Each tenant's token counters are the sum of its responses' usage;
    // team-c is past the bound of 3 (anonymous, team-a, team-b): `other`.
    let mut want = std::collections::BTreeMap::<&str, (f64, f64)>::new();
    for (i, (key, label)) in [
        ("secret-a", "team-a"),
        ("secret-b", "team-b"),
        ("secret-c", "other"),
        ("secret-a", "team-a"),
    ]
    .into_iter()
    .enumerate()
    {
        let r = complete(addr, key, 2 + i as u32, i % 2 == 0).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let (p, g) = usage(&r);
        let w = want.entry(label).or_default();
        w.0 += p;
        w.1 += g;
    }
    let text = metrics(addr).await;
    for (label, (p, g)) in &want {
        assert_eq!(
            by_tenant(&text, "inferscope_prompt_tokens_total", label),
            *p,
            "{label}"
        );
        assert_eq!(
            by_tenant(&text, "inferscope_generation_tokens_total", label),
            *g,
            "{label}"
        );
        let ttft = by_tenant(&text, "inferscope_time_to_first_token_seconds_count", label);
        let e2e = by_tenant(&text, "inferscope_e2e_request_latency_seconds_count", label);
        // TTFT is measured on streams (team-a's and other's first ones).
        let streamed = *label != "team-b";
        assert!(
            e2e >= 1.0 && (ttft >= 1.0) == streamed,
            "{label}: {ttft} {e2e}"
        );
    }
    // team-c and team-d fold into `other`.
    assert!(text.contains("inferscope_tenant_labels_folded{model_name=\"m\"} 2"));
    assert!(!text.contains("secret-"), "a key reached the metrics");

    // team-b may have one request in flight: a second gets 429 (naming the
    // limit, with Retry-After) while team-a gets 200.
    let long = tokio::spawn(async move { complete(addr, "secret-b", 20, true).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let refused = complete(addr, "secret-b", 2, false).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(
        refused.headers.get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let message = refused.json()["error"]["message"].to_string();
    assert!(
        message.contains("team-b") && message.contains("max_concurrent"),
        "{message}"
    );
    assert_eq!(complete(addr, "secret-a", 2, false).await.status, 200);
    assert_eq!(long.await.expect("stream").status, 200);
    // The finished stream gave its hold back.
    assert_eq!(complete(addr, "secret-b", 2, false).await.status, 200);
    let text = metrics(addr).await;
    let e = promtext::parse(&text).expect("exposition");
    assert_eq!(
        promtext::sum(
            e.samples(),
            "inferscope_admission_rejections_total",
            &[("reason", "tenant_limit")]
        ),
        1.0
    );
    assert!(!text.contains("secret-"), "a key reached the metrics");

    // team-d's first request is admitted into an empty window and charged
    // its usage at the end; the window is then over its 5 tokens a minute.
    assert_eq!(complete(addr, "secret-d", 2, false).await.status, 200);
    let over = complete(addr, "secret-d", 2, false).await;
    assert_eq!(over.status, 429, "{}", over.body);
    assert!(
        over.json()["error"]["message"]
            .to_string()
            .contains("tokens_per_minute")
    );
    let retry: u64 = over.headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");

    // A client that goes away mid-stream gives its hold back too.
    let gone = tokio::spawn(async move { complete(addr, "secret-b", 40, true).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gone.abort();
    let _ = gone.await;
    let mut status = 0;
    for _ in 0..50 {
        status = complete(addr, "secret-b", 1, false).await.status;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200, "the aborted stream's hold was released");
    p.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_tenant_is_not_queued_behind_a_flood() {
    let keys = key_file(
        r#"{"tenants": [{"name": "flood", "key": "key-flood", "max_waiting": 6},
                        {"name": "light", "key": "key-light"}]}"#,
    );
    // 25 ms steps, 6 tokens: each request holds the one upstream slot for
    // ~0.15 s, so the flood's queue is ~1 s long.
    let server = serve(&[
        "--sim-profile",
        "tiny,t_fixed_ms=25",
        "--served-model-name",
        "m",
    ])
    .await;
    let keys_arg = keys.arg.clone();
    let p = proxy(
        &format!("http://{}", server.addr),
        &[
            "--api-key-file",
            &keys_arg,
            "--max-upstream-concurrency",
            "1",
        ],
    )
    .await;
    let addr = p.addr;
    let done: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut flood = Vec::new();
    for i in 0..8 {
        let done = Arc::clone(&done);
        flood.push(tokio::spawn(async move {
            let r = complete(addr, "key-flood", 6, true).await;
            if r.status == 200 {
                done.lock().expect("order").push(format!("flood-{i}"));
            }
            r.status
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Let the flood queue up, then the light tenant asks once.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let light = complete(addr, "key-light", 6, true).await;
    assert_eq!(light.status, 200, "{}", light.body);
    done.lock().expect("order").push("light".into());
    let mut statuses = Vec::new();
    for f in flood {
        statuses.push(f.await.expect("flood request"));
    }
    // One in flight and six waiting: the eighth is over `max_waiting`.
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200, 429]);
    // Light was served after at most the request in flight and the one
    // flood request whose turn came first, not after the whole queue.
    let order = done.lock().expect("order").clone();
    let at = order.iter().position(|n| n == "light").expect("light");
    assert!(
        at <= 2,
        "light finished after {at} flood requests: {order:?}"
    );
    p.shutdown(Duration::from_secs(5)).await;
}

/// A failed upstream gives back the request's upstream slot and its
/// tenant's hold: with one slot and `max_concurrent: 1`, every request in
/// turn gets the upstream's 502, none waits for a slot that was never freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failure_gives_the_slot_and_the_hold_back() {
    let keys =
        key_file(r#"{"tenants": [{"name": "solo", "key": "key-solo", "max_concurrent": 1}]}"#);
    // A port nobody listens on.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let keys_arg = keys.arg.clone();
    let p = proxy(
        &format!("http://{free}"),
        &[
            "--served-model-name",
            "m",
            "--api-key-file",
            &keys_arg,
            "--max-upstream-concurrency",
            "1",
        ],
    )
    .await;
    for stream in [true, false, true] {
        let r = complete(p.addr, "key-solo", 2, stream).await;
        assert_eq!(r.status, 502, "{}", r.body);
    }
    p.shutdown(Duration::from_secs(5)).await;
}

/// `--tenant-header` is believed from a `--trusted-proxy` peer only: from
/// 127.0.0.1 trusted, the header names the tenant and no key is needed;
/// with another address trusted, the same request needs its key (401).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_header_counts_only_from_trusted_peers() {
    let server = serve(&["--sim-profile", "tiny", "--served-model-name", "m"]).await;
    let upstream = format!("http://{}", server.addr);
    let body = r#"{"model":"m","prompt":"hi","max_tokens":2}"#;
    let headers = [("x-tenant", "gw-team")];
    let trusted = proxy(
        &upstream,
        &[
            "--api-key",
            "k",
            "--tenant-header",
            "x-tenant",
            "--trusted-proxy",
            "127.0.0.0/8",
        ],
    )
    .await;
    let r = call(trusted.addr, "POST", "/v1/completions", body, &headers).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let text = metrics(trusted.addr).await;
    assert!(by_tenant(&text, "inferscope_prompt_tokens_total", "gw-team") > 0.0);
    let other = proxy(
        &upstream,
        &[
            "--api-key",
            "k",
            "--tenant-header",
            "x-tenant",
            "--trusted-proxy",
            "10.0.0.1",
        ],
    )
    .await;
    let r = call(other.addr, "POST", "/v1/completions", body, &headers).await;
    assert_eq!(r.status, 401, "{}", r.body);
    trusted.shutdown(Duration::from_secs(5)).await;
    other.shutdown(Duration::from_secs(5)).await;
}
