//! The console through `inferscope proxy` (docs/console.md): `/console` and
//! its data routes list the requests the proxy measured, with the usage and
//! timings the client saw; the engine-only panels are absent; `/` stays the
//! upstream's; the API key guards the data; `--disable-console` removes it.

use crate::common;

use std::time::{Duration, Instant};

use common::{proxy, serve};
use inferscope_test_support::{call, post};
use serde_json::{Value, json};

/// The proxy's snapshot once it lists a request whose id starts with `id`.
async fn listed(addr: std::net::SocketAddr, id: &str, key: &[(&str, &str)]) -> (Value, Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = call(addr, "GET", "/console/api/snapshot", "", key).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let s = r.json();
        let found = s["recent"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["request_id"].as_str().unwrap().starts_with(id))
            .cloned();
        if let Some(entry) = found {
            return (s, entry);
        }
        assert!(Instant::now() < deadline, "{id} never listed: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_console_lists_what_the_client_got() {
    let flags = [
        "--sim-profile",
        "tiny,t_weights_ms=2",
        "--served-model-name",
        "sim-llama",
    ];
    let server = serve(&flags).await;
    let p = proxy(&format!("http://{}", server.addr), &[]).await;

    let body = json!({"model": "sim-llama", "prompt": "hello there", "max_tokens": 7,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let r = call(
        p.addr,
        "POST",
        "/v1/completions",
        &body.to_string(),
        &[("x-request-id", "via-proxy")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let usage: Value = r
        .body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find(|c| !c["usage"].is_null())
        .expect("a usage chunk")["usage"]
        .clone();
    // A second request without an id: the proxy names it.
    let plain = post(
        p.addr,
        "/v1/completions",
        // `ignore_eos`: the sim samples its EOS token now and then.
        &json!({"model": "sim-llama", "prompt": "x", "max_tokens": 2, "ignore_eos": true}),
    )
    .await;
    assert_eq!(plain.status, 200, "{}", plain.body);

    let (snap, entry) = listed(p.addr, "via-proxy", &[]).await;
    assert_eq!(snap["serving"], "proxy", "{snap}");
    assert_eq!(entry["request_id"], "via-proxy-0", "{entry}");
    assert_eq!(entry["finish_reason"], "length", "{entry}");
    assert_eq!(
        entry["prompt_tokens"], usage["prompt_tokens"],
        "{entry} {usage}"
    );
    assert_eq!(
        entry["completion_tokens"], usage["completion_tokens"],
        "{entry} {usage}"
    );
    assert_eq!(entry["completion_tokens"], 7, "{entry}");
    let ttft = entry["time_to_first_token_ms"].as_f64().unwrap();
    let e2e = entry["generation_time_ms"].as_f64().unwrap();
    let decode = entry["decode_time_ms"].as_f64().unwrap();
    assert!(ttft > 0.0 && ttft <= e2e, "{entry}");
    assert!((ttft + decode - e2e).abs() < 1e-6, "{entry}");
    for engine_only in ["queue_time_ms", "prefill_time_ms", "engine"] {
        assert!(entry[engine_only].is_null(), "{engine_only}: {entry}");
    }
    let (_, unnamed) = listed(p.addr, "proxy-", &[]).await;
    assert_eq!(unnamed["completion_tokens"], 2, "{unnamed}");
    // Samples come from the proxy's own metrics: its generation tokens.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = call(p.addr, "GET", "/console/api/snapshot", "", &[])
            .await
            .json();
        let tokens = s["samples"].as_array().unwrap().last().map_or(0, |l| {
            l["engines"][0]["generation_tokens"].as_u64().unwrap()
        });
        if tokens == 9 {
            break;
        }
        assert!(Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The page is at /console; / is the upstream's (here inferscope's own page).
    let page = call(p.addr, "GET", "/console", "", &[]).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("inferscope console"), "{}", page.body);
    p.shutdown(Duration::from_secs(5)).await;
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_guards_the_proxy_console_and_the_flag_removes_it() {
    let server = serve(&[]).await;
    let upstream = format!("http://{}", server.addr);
    let p = proxy(
        &upstream,
        &["--served-model-name", "sim-llama", "--api-key", "k1"],
    )
    .await;
    let r = call(p.addr, "GET", "/console/api/snapshot", "", &[]).await;
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = call(
        p.addr,
        "GET",
        "/console/api/snapshot",
        "",
        &[("authorization", "Bearer k1")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    p.shutdown(Duration::from_secs(5)).await;

    // Without its console the proxy passes /console/* through: the upstream
    // (an inferscope server) answers with its own, serving engines.
    let p = proxy(
        &upstream,
        &["--served-model-name", "sim-llama", "--disable-console"],
    )
    .await;
    let r = call(p.addr, "GET", "/console/api/snapshot", "", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["serving"], "engines");
    p.shutdown(Duration::from_secs(5)).await;
    server.shutdown(Duration::from_secs(5)).await;
}
