//! The proxy in front of three upstreams started in-process: `inferscope
//! serve` (sim executor; the proxy's counts must equal the server's own),
//! the bench's mock server (byte-exact pass-through, usage stripping), and
//! nothing at all (502, 504).

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{proxy, serve};
use http_body_util::BodyExt;
use inferscope_bench::mock::{MockConfig, MockServer};
use inferscope_proxy::ProxyArgs;
use inferscope_schema::promtext::{self, Exposition};
use inferscope_schema::schema::{self, MetricDef};
use inferscope_test_support::send;

const NS: &str = "inferscope";

async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let r = inferscope_test_support::call(addr, method, path, body, &[]).await;
    (r.status, r.body)
}

async fn scrape(addr: SocketAddr) -> Exposition {
    let (status, text) = call(addr, "GET", "/metrics", "").await;
    assert_eq!(status, 200, "{text}");
    promtext::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn mock_addr(m: &MockServer) -> SocketAddr {
    m.base_url()
        .trim_start_matches("http://")
        .parse()
        .expect("mock address")
}

/// Whether the exposition has the family (counters are named with `_total`).
fn has_family(e: &Exposition, def: &MetricDef) -> bool {
    e.family(&def.registered_name(NS)).is_some() || e.family(&def.exposed_name(NS)).is_some()
}

fn name(def: &MetricDef) -> String {
    def.exposed_name(NS)
}

fn value(e: &Exposition, def: &MetricDef, labels: &[(&str, &str)]) -> f64 {
    promtext::sum(e.samples(), &name(def), labels)
}

fn finished(e: &Exposition, reason: &str) -> f64 {
    value(e, &schema::REQUEST_SUCCESS, &[("finished_reason", reason)])
}

/// Cumulative bucket counts of a histogram, by `le`.
fn buckets(e: &Exposition, def: &MetricDef) -> Vec<(String, f64)> {
    let bucket = format!("{}_bucket", def.exposed_name(NS));
    e.samples()
        .filter(|s| s.name == bucket)
        .map(|s| (s.label("le").unwrap_or("").to_owned(), s.value))
        .collect()
}

fn hist_count(e: &Exposition, def: &MetricDef) -> f64 {
    promtext::sum(e.samples(), &format!("{}_count", def.exposed_name(NS)), &[])
}

fn hist_sum(e: &Exposition, def: &MetricDef) -> f64 {
    promtext::sum(e.samples(), &format!("{}_sum", def.exposed_name(NS)), &[])
}

/// The JSON payloads of an SSE body, `[DONE]` excluded.
fn events(body: &str) -> Vec<serde_json::Value> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// Waits until `f(scrape)` holds (the server records some figures just
/// after the client sees the end).
async fn eventually(addr: SocketAddr, what: &str, f: impl Fn(&Exposition) -> bool) -> Exposition {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let e = scrape(addr).await;
        if f(&e) {
            return e;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_equal_the_servers_own_and_latencies_fall_in_the_same_buckets() {
    // 100 ms steps: a request of k tokens takes at least k steps, so its
    // TTFT lands just above 0.1 s in (0.1, 0.25] and its e2e just above
    // k × 0.1 s, 100 ms or more below the next bound up (0.2, 0.3, 0.5,
    // 0.8, 1.0 for k = 1..8). The proxy's own cost (µs, or ms on a
    // starved machine) and the steps' lateness under load stay far from
    // the bounds. (With 25 ms steps the server's TTFT rose to near the
    // 40 ms bound under load and the proxy's crossed it: 1 run in 8 with
    // five busy loops beside the suite.)
    let server = serve(&[
        "--sim-profile",
        "tiny,t_fixed_ms=100",
        "--served-model-name",
        "m",
    ])
    .await;
    let p = proxy(&format!("http://{}", server.addr), &[]).await;
    assert_eq!(
        p.model_name, "m",
        "the label comes from the upstream's /v1/models"
    );

    let streams = [
        r#"{"model":"m","prompt":"one two three","max_tokens":8,"stream":true}"#,
        r#"{"model":"m","prompt":"a b c d e f","max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"hi there"}],"max_tokens":8,"stream":true}"#,
        r#"{"model":"m","prompt":"x","max_tokens":3,"stream":true,"ignore_eos":true}"#,
    ];
    for body in streams {
        let path = if body.contains("messages") {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (status, text) = call(p.addr, "POST", path, body).await;
        assert_eq!(status, 200, "{text}");
        let asked = body.contains("include_usage");
        let usage_chunks = events(&text)
            .iter()
            .filter(|e| !e["usage"].is_null())
            .count();
        assert_eq!(
            usage_chunks,
            usize::from(asked),
            "usage chunk only when asked: {text}"
        );
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
    let s = eventually(server.addr, "the server's e2e of 4 requests", |e| {
        hist_count(e, &schema::E2E_REQUEST_LATENCY) == 4.0
    })
    .await;
    // The proxy, too, records a stream's end as its body finishes, which
    // can be just after the client has read `[DONE]`.
    let px = eventually(p.addr, "the proxy's e2e of 4 requests", |e| {
        hist_count(e, &schema::E2E_REQUEST_LATENCY) == 4.0
    })
    .await;
    for reason in ["stop", "length", "abort", "error"] {
        assert_eq!(
            finished(&px, reason),
            finished(&s, reason),
            "finished_reason={reason}"
        );
    }
    assert_eq!(finished(&px, "stop") + finished(&px, "length"), 4.0);
    for def in [&schema::PROMPT_TOKENS, &schema::GENERATION_TOKENS] {
        assert_eq!(value(&px, def, &[]), value(&s, def, &[]), "{}", def.name);
        assert!(value(&px, def, &[]) > 0.0, "{}", def.name);
    }
    for def in [&schema::TIME_TO_FIRST_TOKEN, &schema::E2E_REQUEST_LATENCY] {
        let (a, b) = (buckets(&px, def), buckets(&s, def));
        assert!(!a.is_empty(), "{}", def.name);
        assert_eq!(a, b, "{} buckets, proxy vs server", def.name);
        // Closer than the buckets: the proxy's span holds the server's (it
        // reads the request before the server does and the chunks after),
        // plus its hops, well under 50 ms a request even when starved.
        let extra = hist_sum(&px, def) - hist_sum(&s, def);
        assert!(
            (-0.001..0.2).contains(&extra),
            "{}: the proxy's 4 samples sum {extra} s more than the server's",
            def.name
        );
    }
    assert_eq!(hist_count(&px, &schema::TIME_TO_FIRST_TOKEN), 4.0);
    // One sample per content chunk after the first, as the server does.
    assert_eq!(
        hist_count(&px, &schema::INTER_TOKEN_LATENCY),
        hist_count(&s, &schema::INTER_TOKEN_LATENCY)
    );

    // Not streamed: counted from the JSON body's usage and finish_reason.
    for body in [
        r#"{"model":"m","prompt":"one two","max_tokens":5}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":5}"#,
    ] {
        let path = if body.contains("messages") {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (status, text) = call(p.addr, "POST", path, body).await;
        assert_eq!(status, 200, "{text}");
    }
    // Refused by the upstream: passed through, counted by neither.
    let (status, text) = call(p.addr, "POST", "/v1/completions", "{not json").await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("\"error\""), "{text}");

    let s = eventually(server.addr, "6 e2e samples", |e| {
        hist_count(e, &schema::E2E_REQUEST_LATENCY) == 6.0
    })
    .await;
    let px = scrape(p.addr).await;
    for reason in ["stop", "length", "abort", "error"] {
        assert_eq!(
            finished(&px, reason),
            finished(&s, reason),
            "finished_reason={reason}"
        );
    }
    for def in [&schema::PROMPT_TOKENS, &schema::GENERATION_TOKENS] {
        assert_eq!(value(&px, def, &[]), value(&s, def, &[]), "{}", def.name);
    }
    assert_eq!(hist_count(&px, &schema::E2E_REQUEST_LATENCY), 6.0);
    assert_eq!(value(&px, &schema::NUM_REQUESTS_RUNNING, &[]), 0.0);
    // The HTTP layer counted each route by its template.
    let http = name(&schema::HTTP_REQUESTS);
    assert_eq!(
        promtext::sum(px.samples(), &http, &[("handler", "/v1/completions")]),
        5.0
    );
    assert_eq!(
        promtext::sum(px.samples(), &http, &[("handler", "/v1/chat/completions")]),
        2.0
    );

    p.shutdown(Duration::from_secs(1)).await;
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_ends_the_upstream_request_and_counts_abort() {
    // 200 tokens at 20 ms a step: 4 s unless the upstream request is ended.
    let server = serve(&[
        "--sim-profile",
        "tiny,t_fixed_ms=20",
        "--served-model-name",
        "m",
    ])
    .await;
    let p = proxy(&format!("http://{}", server.addr), &[]).await;
    let resp = send(
        p.addr,
        "POST",
        "/v1/completions",
        r#"{"model":"m","prompt":"go","max_tokens":200,"ignore_eos":true,"stream":true}"#,
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = 0;
    while got < 3 {
        let frame = body.frame().await.expect("a frame").expect("no error");
        if frame.data_ref().is_some_and(|d| d.starts_with(b"data: {")) {
            got += 1;
        }
    }
    let px = scrape(p.addr).await;
    assert_eq!(
        value(&px, &schema::NUM_REQUESTS_RUNNING, &[]),
        1.0,
        "in flight"
    );
    let dropped = Instant::now();
    drop(body);
    let s = eventually(server.addr, "the server's abort", |e| {
        finished(e, "abort") == 1.0
    })
    .await;
    assert!(
        dropped.elapsed() < Duration::from_secs(2),
        "the upstream request ended {:?} after the disconnect",
        dropped.elapsed()
    );
    assert_eq!(finished(&s, "length"), 0.0);
    let px = eventually(p.addr, "the proxy's abort", |e| finished(e, "abort") == 1.0).await;
    assert_eq!(value(&px, &schema::NUM_REQUESTS_RUNNING, &[]), 0.0);
    assert_eq!(
        finished(&px, "length") + finished(&px, "stop") + finished(&px, "error"),
        0.0
    );
    // No usage chunk came: the tokens counted are the content chunks the
    // proxy relayed, at least the three the client read and at most what
    // the server generated.
    let (relayed, generated) = (
        value(&px, &schema::GENERATION_TOKENS, &[]),
        value(&s, &schema::GENERATION_TOKENS, &[]),
    );
    assert!(
        (3.0..=generated).contains(&relayed),
        "proxy counted {relayed} tokens, the server {generated}"
    );
    p.shutdown(Duration::from_secs(1)).await;
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_upstream_passes_through_unchanged_and_strips_only_the_injected_usage() {
    let mock = MockServer::start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(2),
        ..MockConfig::default()
    })
    .await
    .expect("mock");
    let p = proxy(&mock.base_url(), &["--served-model-name", "mock-model"]).await;

    // The client asked for usage: the proxied body is the upstream's, byte for byte.
    let asked = r#"{"model":"mock-model","prompt":"a b c","max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}"#;
    let direct = call(mock_addr(&mock), "POST", "/v1/completions", asked).await;
    let via = call(p.addr, "POST", "/v1/completions", asked).await;
    assert_eq!(via, direct);
    assert_eq!(
        events(&via.1).last().unwrap()["usage"]["completion_tokens"],
        6
    );

    // It did not: the same body less the usage event.
    let not_asked = r#"{"model":"mock-model","prompt":"a b c","max_tokens":6,"stream":true}"#;
    let (status, via) = call(p.addr, "POST", "/v1/completions", not_asked).await;
    assert_eq!(status, 200);
    let usage_event = direct
        .1
        .split("\n\n")
        .find(|e| e.contains("\"usage\""))
        .unwrap();
    assert_eq!(via, direct.1.replace(&format!("{usage_event}\n\n"), ""));
    assert_eq!(events(&via).len(), 6, "six token chunks");

    // The request id passes through both ways.
    let resp = send(
        p.addr,
        "POST",
        "/v1/completions",
        not_asked,
        &[("x-request-id", "req-42")],
    )
    .await;
    let _ = resp.into_body().collect().await;
    assert_eq!(mock.last_request_id().as_deref(), Some("req-42"));

    let px = scrape(p.addr).await;
    // The mock sends no finish_reason: a stream that ends without one was cut short.
    assert_eq!(finished(&px, "error"), 3.0);
    assert_eq!(
        value(&px, &schema::GENERATION_TOKENS, &[]),
        18.0,
        "from the usage chunks, stripped or not"
    );
    assert_eq!(value(&px, &schema::PROMPT_TOKENS, &[]), 9.0);
    assert_eq!(hist_count(&px, &schema::TIME_TO_FIRST_TOKEN), 3.0);
    assert_eq!(
        hist_count(&px, &schema::INTER_TOKEN_LATENCY),
        15.0,
        "5 gaps per stream"
    );
    assert_eq!(
        promtext::sum(
            px.samples(),
            &format!("{}_sum", name(&schema::REQUEST_PARAMS_MAX_TOKENS)),
            &[]
        ),
        18.0
    );
    p.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_only_series_are_absent_and_upstream_metrics_appear_beside() {
    let mock = MockServer::start(MockConfig {
        metrics_namespace: Some("vllm".into()),
        ..MockConfig::default()
    })
    .await
    .expect("mock");
    let p = proxy(
        &mock.base_url(),
        &[
            "--upstream-metrics",
            &format!("{}/metrics", mock.base_url()),
        ],
    )
    .await;
    assert_eq!(p.model_name, "mock-model");
    let (status, text) = call(p.addr, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let e = promtext::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    for absent in [
        &schema::KV_CACHE_USAGE_PERC,
        &schema::NUM_REQUESTS_WAITING,
        &schema::REQUEST_QUEUE_TIME,
        &schema::DEVICE_BUSY_SECONDS,
        &schema::ENGINE_STEP_DURATION,
        &schema::CACHE_CONFIG_INFO,
    ] {
        assert!(!has_family(&e, absent), "{} present:\n{text}", absent.name);
    }
    for present in [
        &schema::TIME_TO_FIRST_TOKEN,
        &schema::REQUEST_SUCCESS,
        &schema::NUM_REQUESTS_RUNNING,
    ] {
        assert!(has_family(&e, present), "{} absent:\n{text}", present.name);
    }
    // The upstream's own exposition, unchanged, after the proxy's.
    let (_, upstream) = call(mock_addr(&mock), "GET", "/metrics", "").await;
    let busy = upstream
        .lines()
        .find(|l| l.starts_with("vllm:device_busy_seconds_total{"))
        .unwrap();
    assert!(
        text.contains(&format!("\n{}", upstream.lines().next().unwrap())),
        "{text}"
    );
    assert!(
        e.value("vllm:num_requests_waiting", &[("engine", "0")])
            .is_some(),
        "{text}"
    );
    // The busy counter grows with uptime, so compare its labels, not its value.
    let busy_labels = &busy[..busy.find('}').unwrap()];
    assert!(text.contains(busy_labels), "{text}");

    // Upstream metrics down: the proxy's own still scrape.
    let p2 = proxy(
        &mock.base_url(),
        &["--upstream-metrics", "http://127.0.0.1:9/metrics"],
    )
    .await;
    let (status, text) = call(p2.addr, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let e = promtext::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    assert!(has_family(&e, &schema::TIME_TO_FIRST_TOKEN), "{text}");

    // --api-key: refused without it, OpenAI error body.
    let p3 = proxy(&mock.base_url(), &["--api-key", "sekrit"]).await;
    let (status, body) = call(p3.addr, "GET", "/v1/models", "").await;
    assert_eq!(status, 401, "{body}");
    let resp = send(
        p3.addr,
        "GET",
        "/v1/models",
        "",
        &[("authorization", "Bearer sekrit")],
    )
    .await;
    assert_eq!(resp.status(), 200);
    // The generation routes (served without the router) check it too, and
    // the HTTP layer counts the refusal under the route's template.
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let (status, body) = call(p3.addr, "POST", "/v1/chat/completions", chat).await;
    assert_eq!(status, 401, "{body}");
    let err: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err["error"]["type"], "invalid_request_error", "{body}");
    let resp = send(
        p3.addr,
        "POST",
        "/v1/chat/completions",
        chat,
        &[("authorization", "Bearer sekrit")],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let http = name(&schema::HTTP_REQUESTS);
    let chat_route = ("handler", "/v1/chat/completions");
    // The layer records a request once its body has been written, which
    // can be just after the client has it.
    let e = eventually(p3.addr, "the authorised chat post's 2xx", |e| {
        promtext::sum(e.samples(), &http, &[chat_route, ("status", "2xx")]) == 1.0
    })
    .await;
    assert_eq!(
        promtext::sum(e.samples(), &http, &[chat_route, ("status", "4xx")]),
        1.0
    );
    for p in [p, p2, p3] {
        p.shutdown(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_is_502_and_a_silent_one_504() {
    // A port nobody listens on.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let p = proxy(&format!("http://{free}"), &["--served-model-name", "m"]).await;
    let (status, body) = call(
        p.addr,
        "POST",
        "/v1/completions",
        r#"{"prompt":"x","stream":true}"#,
    )
    .await;
    assert_eq!(status, 502, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON error body");
    assert_eq!(v["error"]["type"], "bad_gateway");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&free.to_string()),
        "{body}"
    );
    let (status, _) = call(p.addr, "GET", "/v1/models", "").await;
    assert_eq!(status, 502);
    let px = scrape(p.addr).await;
    assert_eq!(
        finished(&px, "error"),
        1.0,
        "the generation request, not /v1/models"
    );

    // Accepts connections, never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let p2 = proxy(
        &format!("http://{silent_addr}"),
        &["--served-model-name", "m", "--upstream-timeout", "0.3"],
    )
    .await;
    let t = Instant::now();
    let (status, body) = call(
        p2.addr,
        "POST",
        "/v1/chat/completions",
        r#"{"messages":[]}"#,
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert!(t.elapsed() < Duration::from_secs(5));
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON error body");
    assert_eq!(v["error"]["type"], "gateway_timeout");
    assert_eq!(finished(&scrape(p2.addr).await, "error"), 1.0);
    hold.abort();
    p.shutdown(Duration::from_secs(1)).await;
    p2.shutdown(Duration::from_secs(1)).await;
}

#[test]
fn bad_flags_are_named() {
    let err = |flags: &[&str]| {
        let args = ProxyArgs::try_parse_flags(flags.iter().copied()).expect("parses");
        let rt = tokio::runtime::Runtime::new().unwrap();
        match rt.block_on(inferscope_proxy::start(&args)) {
            Ok(_) => panic!("{flags:?} started"),
            Err(e) => e.to_string(),
        }
    };
    assert!(err(&["--upstream", "https://x:1"]).contains("https"));
    assert!(err(&["--upstream", "nope"]).contains("nope"));
    assert!(
        err(&[
            "--upstream",
            "http://127.0.0.1:1",
            "--served-model-name",
            "m",
            "--upstream-timeout=-1"
        ])
        .contains("--upstream-timeout")
    );
    assert!(
        err(&[
            "--upstream",
            "http://127.0.0.1:1",
            "--served-model-name",
            "m",
            "--metrics-namespace",
            "a-b"
        ])
        .contains("a-b")
    );
    assert!(
        ProxyArgs::try_parse_flags(["--port", "1"]).is_err(),
        "--upstream is required"
    );
}

/// A TCP relay in front of `to` that counts the connections it accepts.
async fn counting_relay(
    to: SocketAddr,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut upstream) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_at_a_time_reuses_one_upstream_connection() {
    let mock = MockServer::start(MockConfig {
        ttft: Duration::from_millis(1),
        itl: Duration::from_millis(1),
        ..MockConfig::default()
    })
    .await
    .expect("mock");
    let (relay, accepted) = counting_relay(mock_addr(&mock)).await;
    let p = proxy(
        &format!("http://{relay}"),
        &["--served-model-name", "mock-model"],
    )
    .await;
    let stream = r#"{"model":"mock-model","prompt":"a b","max_tokens":4,"stream":true}"#;
    let whole = r#"{"model":"mock-model","prompt":"a b","max_tokens":4}"#;
    for i in 0..20 {
        // The next request leaves as soon as the client has read the end of
        // the last one: the upstream connection must be back by then.
        let body = if i % 2 == 0 { stream } else { whole };
        let (status, text) = call(p.addr, "POST", "/v1/completions", body).await;
        assert_eq!(status, 200, "{text}");
        let (status, _) = call(p.addr, "GET", "/v1/models", "").await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "40 sequential requests, streamed and not, over one upstream connection"
    );
    p.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_are_counted_per_choice_as_the_server_counts_them() {
    // Two choices per stream and three in a JSON answer: the server counts
    // each choice as one request (its own finish reason, TTFT, tokens, and
    // the prompt once per choice); the proxy must come to the same figures.
    let server = serve(&[
        "--sim-profile",
        "tiny,t_fixed_ms=5",
        "--served-model-name",
        "m",
    ])
    .await;
    let p = proxy(&format!("http://{}", server.addr), &[]).await;
    for (path, body) in [
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"one two three","max_tokens":6,"n":2,"stream":true}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"min_tokens":4,"n":2,"stream":true,"ignore_eos":true}"#,
        ),
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"a b","max_tokens":5,"n":3}"#,
        ),
    ] {
        let (status, text) = call(p.addr, "POST", path, body).await;
        assert_eq!(status, 200, "{text}");
    }
    let s = eventually(server.addr, "the server's 7 choices", |e| {
        hist_count(e, &schema::E2E_REQUEST_LATENCY) == 7.0
    })
    .await;
    let px = eventually(p.addr, "the proxy's 7 choices", |e| {
        hist_count(e, &schema::E2E_REQUEST_LATENCY) == 7.0
    })
    .await;
    for reason in ["stop", "length", "abort", "error"] {
        assert_eq!(
            finished(&px, reason),
            finished(&s, reason),
            "finished_reason={reason}"
        );
    }
    assert_eq!(finished(&px, "stop") + finished(&px, "length"), 7.0);
    for def in [&schema::PROMPT_TOKENS, &schema::GENERATION_TOKENS] {
        assert_eq!(value(&px, def, &[]), value(&s, def, &[]), "{}", def.name);
    }
    for def in [&schema::REQUEST_PROMPT_TOKENS, &schema::REQUEST_PARAMS_N] {
        assert_eq!(
            hist_count(&px, def),
            hist_count(&s, def),
            "{} samples",
            def.name
        );
    }
    // A TTFT per streamed choice; the server also times the JSON answer's
    // choices inside, which the proxy cannot see.
    assert_eq!(hist_count(&px, &schema::TIME_TO_FIRST_TOKEN), 4.0);
    assert_eq!(hist_count(&s, &schema::TIME_TO_FIRST_TOKEN), 7.0);
    // A choice's own token count is known only when the content chunks add
    // up to the usage total: always for the min_tokens stream (2 choices:
    // ignore_eos alone still lets the sim draw a text-less EOS, 1 time in
    // 128, which once left both streams unknown);
    // the other stream only when neither choice stopped on an EOS token
    // (which has no text); a JSON answer gives only the sum.
    let known = hist_count(&px, &schema::REQUEST_GENERATION_TOKENS);
    assert!(known == 2.0 || known == 4.0, "{known}");
    assert_eq!(hist_count(&s, &schema::REQUEST_GENERATION_TOKENS), 7.0);
    p.shutdown(Duration::from_secs(1)).await;
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_per_model_and_other_for_names_outside_the_set() {
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock starts");
    let p = proxy(&mock.base_url(), &["--served-model-name", "a,b"]).await;
    let ask = |model: &'static str| {
        format!(r#"{{"model":"{model}","prompt":"hi","max_tokens":3,"stream":true}}"#)
    };
    for model in ["a", "a", "b", "zzz", "yyy", "zzz"] {
        let (status, text) = call(p.addr, "POST", "/v1/completions", &ask(model)).await;
        assert_eq!(status, 200, "{text}");
    }
    let px = eventually(p.addr, "6 requests", |e| {
        hist_count(e, &schema::E2E_REQUEST_LATENCY) == 6.0
    })
    .await;
    let e2e = format!("{}_count", name(&schema::E2E_REQUEST_LATENCY));
    let by_model = |m: &str| promtext::sum(px.samples(), &e2e, &[("model_name", m)]);
    assert_eq!(
        (by_model("a"), by_model("b"), by_model("other")),
        (2.0, 1.0, 3.0)
    );
    assert_eq!(
        by_model("zzz"),
        0.0,
        "no series for a name the client made up"
    );
    let ttft = format!("{}_count", name(&schema::TIME_TO_FIRST_TOKEN));
    assert_eq!(
        promtext::sum(px.samples(), &ttft, &[("model_name", "a")]),
        2.0
    );
    p.shutdown(Duration::from_secs(1)).await;
}

/// A raw HTTP/1.1 upstream: reads one request per connection, writes
/// `pieces` with a pause between them, then closes the connection.
async fn raw_upstream(pieces: Vec<Vec<u8>>) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let pieces = pieces.clone();
            tokio::spawn(async move {
                let mut req = vec![0u8; 8192];
                if s.read(&mut req).await.unwrap_or(0) == 0 {
                    return;
                }
                for p in pieces {
                    if s.write_all(&p).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_closes_mid_stream_cuts_the_clients_stream_and_counts_error() {
    let event = "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n";
    let up = raw_upstream(vec![
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
        format!("{:x}\r\n{event}\r\n", event.len()).into_bytes(),
        // Cut inside the next chunk: no terminator ever comes.
        format!("{:x}\r\ndata: {{\"choices\":[{{\"ind", event.len()).into_bytes(),
    ])
    .await;
    let p = proxy(&format!("http://{up}"), &["--served-model-name", "m"]).await;
    let resp = send(
        p.addr,
        "POST",
        "/v1/completions",
        r#"{"model":"m","prompt":"x","stream":true}"#,
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let ended_with_error = loop {
        match body.frame().await {
            Some(Ok(f)) => got.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Some(Err(_)) => break true,
            None => break false,
        }
    };
    assert!(
        ended_with_error,
        "the client must see the stream cut, not a clean end: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        got.starts_with(b"data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    let px = eventually(p.addr, "the proxy's error", |e| finished(e, "error") == 1.0).await;
    assert_eq!(hist_count(&px, &schema::TIME_TO_FIRST_TOKEN), 1.0);
    assert_eq!(value(&px, &schema::NUM_REQUESTS_RUNNING, &[]), 0.0);
    assert_eq!(finished(&px, "stop") + finished(&px, "abort"), 0.0);
    p.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_sends_no_valid_head_is_502() {
    let up = raw_upstream(vec![b"SSH-2.0-OpenSSH_9.6\r\n\r\n".to_vec()]).await;
    let p = proxy(&format!("http://{up}"), &["--served-model-name", "m"]).await;
    let (status, body) = call(
        p.addr,
        "POST",
        "/v1/completions",
        r#"{"model":"m","prompt":"x","stream":true}"#,
    )
    .await;
    assert_eq!(status, 502, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("an OpenAI error body");
    assert_eq!(v["error"]["type"], "bad_gateway", "{body}");
    let px = scrape(p.addr).await;
    assert_eq!(finished(&px, "error"), 1.0);
    p.shutdown(Duration::from_secs(1)).await;
}

/// A keep-alive upstream that answers every read with `{}` and keeps what
/// it was sent.
async fn recording_upstream() -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    record.lock().unwrap().extend_from_slice(&buf[..n]);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_refused_for_its_api_key_never_reaches_the_upstream() {
    // The fast path sends a generation post upstream before its handler
    // runs when a pooled connection is idle (here after `/v1/models`): the
    // key is checked before that, so a refused post is never sent.
    let (up, seen) = recording_upstream().await;
    let p = proxy(
        &format!("http://{up}"),
        &["--served-model-name", "m", "--api-key", "k"],
    )
    .await;
    let key = [("authorization", "Bearer k")];
    let post = r#"{"model":"m","prompt":"hi","max_tokens":2}"#;
    for _ in 0..2 {
        let resp = send(p.addr, "GET", "/v1/models", "", &key).await;
        assert_eq!(resp.status(), 200);
        let (status, body) = call(p.addr, "POST", "/v1/completions", post).await;
        assert_eq!(status, 401, "{body}");
        let resp = send(p.addr, "POST", "/v1/completions", post, &key).await;
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{}");
    }
    // Long enough for a refused post's bytes to have arrived.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let seen = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    assert_eq!(seen.matches("GET /v1/models ").count(), 2, "{seen}");
    assert_eq!(
        seen.matches("POST /v1/completions ").count(),
        2,
        "only the two posts with the key go upstream: {seen}"
    );
    assert_eq!(seen.matches(post).count(), 2, "{seen}");
    p.shutdown(Duration::from_secs(1)).await;
}
