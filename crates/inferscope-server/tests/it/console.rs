//! The browser console's routes (docs/console.md): the history equals
//! `/metrics`, recent requests carry what their responses reported, the API
//! key guards the data, `--disable-console` removes it all.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::common::{Sample, call, post, scrape, send, start, sum};

const NS: &str = "inferscope_";

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

async fn snapshot(addr: SocketAddr) -> Value {
    let r = call(addr, "GET", "/console/api/snapshot", "", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// The snapshot once it holds a sample taken after `after` (unix seconds).
async fn snapshot_after(addr: SocketAddr, after: f64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = snapshot(addr).await;
        if s["samples"]
            .as_array()
            .and_then(|a| a.last())
            .is_some_and(|last| last["t"].as_f64().unwrap() > after)
        {
            return s;
        }
        assert!(Instant::now() < deadline, "no sample after {after}: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn gauge(samples: &[Sample], name: &str, engine: &str) -> f64 {
    sum(samples, &format!("{NS}{name}"), &[("engine", engine)])
}

/// Checks the newest sample's engines against scrapes taken just before
/// (`a`) and just after (`b`) it: running and waiting (steady) equal both,
/// KV usage lies between them (it only grows while requests decode).
fn assert_sample_matches(s: &Value, a: &[Sample], b: &[Sample]) {
    let last = s["samples"].as_array().unwrap().last().unwrap();
    let engines = last["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 2, "{last}");
    for e in engines {
        let id = e["engine"].as_u64().unwrap().to_string();
        for (key, name) in [
            ("running", "num_requests_running"),
            ("waiting", "num_requests_waiting"),
        ] {
            let (va, vb) = (gauge(a, name, &id), gauge(b, name, &id));
            assert_eq!(va, vb, "engine {id} {name} moved during the check");
            assert_eq!(e[key].as_f64().unwrap(), va, "engine {id} {key}: {e}");
        }
        let kv = e["kv_cache_usage"].as_f64().unwrap();
        let (ka, kb) = (
            gauge(a, "kv_cache_usage_perc", &id),
            gauge(b, "kv_cache_usage_perc", &id),
        );
        assert!(
            ka <= kv && kv <= kb,
            "engine {id} KV {kv} not within the scrapes' {ka}..{kb}"
        );
    }
}

#[tokio::test]
async fn the_history_equals_metrics_idle_and_loaded_on_two_engines() {
    // Steps of ~20 ms and 2 running per engine: with 6 long requests each
    // engine runs 2 and queues 1 for many seconds.
    let server = start(&[
        "--sim-profile",
        "tiny,t_weights_ms=20",
        "--data-parallel-size",
        "2",
        "--max-num-seqs",
        "2",
    ])
    .await;
    let addr = server.addr;
    let meta = snapshot(addr).await;
    assert_eq!(meta["engines"], json!([0, 1]), "{meta}");
    assert_eq!(meta["history_seconds"], 300);
    let bounds = meta["latency_bounds"]["ttft"].as_array().unwrap().len();
    assert!(bounds > 5, "{meta}");

    // Idle.
    let t = unix_now();
    let a = scrape(addr).await;
    let s = snapshot_after(addr, t).await;
    let b = scrape(addr).await;
    assert_sample_matches(&s, &a, &b);
    let idle = &s["samples"].as_array().unwrap().last().unwrap()["engines"][0];
    assert_eq!(idle["running"], 0, "{idle}");
    assert_eq!(
        idle["latency"]["ttft"].as_array().unwrap().len(),
        bounds + 1,
        "bucket counts are the bounds plus +Inf"
    );

    // Loaded.
    let load: Vec<_> = (0..6)
        .map(|_| {
            tokio::spawn(async move {
                let body = json!({"prompt": "console", "max_tokens": 3000, "min_tokens": 3000, "ignore_eos": true});
                post(addr, "/v1/completions", &body).await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(addr).await;
        let steady = ["0", "1"].iter().all(|e| {
            gauge(&m, "num_requests_running", e) == 2.0
                && gauge(&m, "num_requests_waiting", e) == 1.0
        });
        if steady {
            break;
        }
        assert!(Instant::now() < deadline, "the load never settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = unix_now();
    let a = scrape(addr).await;
    let s = snapshot_after(addr, t).await;
    let b = scrape(addr).await;
    assert_sample_matches(&s, &a, &b);
    let last = s["samples"].as_array().unwrap().last().unwrap();
    assert!(
        last["engines"][0]["kv_cache_usage"].as_f64().unwrap() > 0.0,
        "{last}"
    );
    for task in load {
        task.abort();
    }
    server.shutdown(Duration::from_millis(200)).await;
}

/// The `data:` of the next SSE event of `body`, read across frames.
async fn next_event(body: &mut hyper::body::Incoming, buf: &mut String) -> Value {
    loop {
        if let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("no data in {event:?}"));
            return serde_json::from_str(data).unwrap();
        }
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("an event every second")
            .expect("stream open")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            buf.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
}

#[tokio::test]
async fn a_finished_request_shows_with_the_timings_its_response_reported() {
    let server = start(&["--enable-per-request-metrics"]).await;
    let addr = server.addr;
    let events = send(addr, "GET", "/console/api/events", "", &[]).await;
    assert_eq!(events.status(), 200);
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let mut body = events.into_body();
    let mut buf = String::new();

    let r = call(
        addr,
        "POST",
        "/v1/completions",
        &json!({"prompt": "who am I", "max_tokens": 9, "min_tokens": 9, "ignore_eos": true, "include_metrics": true})
            .to_string(),
        &[("x-request-id", "console-probe")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let resp = r.json();
    let check = |e: &Value| {
        let id = e["request_id"].as_str().unwrap();
        assert!(id.starts_with("console-probe-"), "{e}");
        assert_eq!(e["prompt_tokens"], resp["usage"]["prompt_tokens"], "{e}");
        assert_eq!(
            e["completion_tokens"], resp["usage"]["completion_tokens"],
            "{e}"
        );
        assert_eq!(e["finish_reason"], "length");
        for key in [
            "time_to_first_token_ms",
            "generation_time_ms",
            "queue_time_ms",
            "prefill_time_ms",
            "decode_time_ms",
            "num_preemptions",
        ] {
            assert_eq!(e[key], resp["metrics"][key], "{key}: {e} vs {resp}");
        }
        assert!(e["generation_time_ms"].as_f64().unwrap() > 0.0, "{e}");
        assert!(e.get("text").is_none() && e.get("prompt").is_none(), "{e}");
    };

    // The event stream brings it within a few events.
    let mut found = None;
    for _ in 0..5 {
        let event = next_event(&mut body, &mut buf).await;
        assert_eq!(event["sample"]["engines"].as_array().unwrap().len(), 1);
        if let Some(e) = event["recent"].as_array().unwrap().first() {
            found = Some(e.clone());
            break;
        }
    }
    let from_events = found.expect("the request in an event");
    check(&from_events);
    // And the snapshot has it, the same.
    let recent = snapshot(addr).await["recent"].as_array().unwrap().clone();
    assert_eq!(recent.len(), 1, "{recent:?}");
    check(&recent[0]);
    assert_eq!(recent[0], from_events);
    // A stream opened now with `after=0` starts with it; with its seq, not.
    let seq = recent[0]["seq"].as_u64().unwrap();
    for (after, expected) in [(0, 1), (seq, 0)] {
        let mut body = send(
            addr,
            "GET",
            &format!("/console/api/events?after={after}"),
            "",
            &[],
        )
        .await
        .into_body();
        let event = next_event(&mut body, &mut String::new()).await;
        assert_eq!(
            event["recent"].as_array().unwrap().len(),
            expected,
            "after={after}: {event}"
        );
    }
    server.shutdown(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn the_api_key_guards_the_data_not_the_page() {
    let server = start(&["--api-key", "sesame"]).await;
    let addr = server.addr;
    let page = call(addr, "GET", "/", "", &[]).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<html"), "{}", page.body);
    let key = [("authorization", "Bearer sesame")];
    let wrong = [("authorization", "Bearer open")];
    for path in [
        "/console/api/snapshot",
        "/console/api/events",
        "/console/api/steps",
        "/console/api/charts",
    ] {
        assert_eq!(call(addr, "GET", path, "", &[]).await.status, 401, "{path}");
        assert_eq!(
            call(addr, "GET", path, "", &wrong).await.status,
            401,
            "{path}"
        );
        assert_eq!(
            send(addr, "GET", path, "", &key).await.status(),
            200,
            "{path}"
        );
    }
    server.shutdown(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn the_console_follows_metrics_to_their_listener() {
    let server = start(&["--metrics-port", "0"]).await;
    let metrics = server.metrics_addr.unwrap();
    for path in [
        "/",
        "/console",
        "/console/api/snapshot",
        "/console/api/steps",
        "/console/api/charts",
    ] {
        assert_eq!(
            call(metrics, "GET", path, "", &[]).await.status,
            200,
            "{path}"
        );
        assert_eq!(
            call(server.addr, "GET", path, "", &[]).await.status,
            404,
            "{path}"
        );
    }
    server.shutdown(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn disable_console_removes_every_route() {
    let server = start(&["--disable-console"]).await;
    for path in [
        "/",
        "/console",
        "/console/api/snapshot",
        "/console/api/events",
        "/console/api/steps",
        "/console/api/charts",
    ] {
        let r = call(server.addr, "GET", path, "", &[]).await;
        assert_eq!(r.status, 404, "{path}");
    }
    // The rest is served.
    assert_eq!(
        call(server.addr, "GET", "/health", "", &[]).await.status,
        200
    );
    server.shutdown(Duration::from_millis(200)).await;
}

/// The step timeline: nothing is recorded before a page reads it; after the
/// first read each engine's steps list the requests they ran, with every
/// prompt token prefilled once and one decode per later token (checked
/// against the responses' usage), and their phases add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_timeline_lists_what_each_step_ran() {
    let server = start(&["--data-parallel-size", "2", "--no-enable-prefix-caching"]).await;
    let addr = server.addr;
    let warm = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "before", "max_tokens": 3}),
    )
    .await;
    assert_eq!(warm.status, 200);
    let first = call(addr, "GET", "/console/api/steps", "", &[])
        .await
        .json();
    for e in first["engines"].as_array().unwrap() {
        assert_eq!(e["steps"], json!([]), "not recorded before a read: {first}");
    }
    let mut usage = Vec::new();
    for i in 0..4 {
        let id = format!("ring{i}");
        let body = json!({"prompt": format!("steps {}", "y".repeat(i * 7)), "max_tokens": 3 + i,
            "ignore_eos": true});
        let r = call(
            addr,
            "POST",
            "/v1/completions",
            &body.to_string(),
            &[("x-request-id", &id)],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        usage.push((id, r.json()["usage"].clone()));
        // Read as the page does (every second): the rings stay on while
        // someone reads, even on a machine slow enough for these requests
        // to outlast the idle cut-off.
        let r = call(addr, "GET", "/console/api/steps", "", &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let since = first["now_us"].as_u64().unwrap();
    let later = call(
        addr,
        "GET",
        &format!("/console/api/steps?since_us={since}"),
        "",
        &[],
    )
    .await
    .json();
    let engines = later["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 2);
    let steps: Vec<&Value> = engines
        .iter()
        .flat_map(|e| e["steps"].as_array().unwrap())
        .collect();
    assert!(!steps.is_empty(), "{later}");
    for s in &steps {
        assert!(s["t_us"].as_u64().unwrap() > since, "{s}");
        let phases: u64 = ["schedule_us", "execute_us", "postprocess_us"]
            .iter()
            .map(|k| s[k].as_u64().unwrap())
            .sum();
        // Each figure is rounded down to a microsecond.
        assert!(
            phases <= s["dur_us"].as_u64().unwrap() && phases + 3 >= s["dur_us"].as_u64().unwrap(),
            "{s}"
        );
    }
    for (id, u) in &usage {
        let prefix = format!("{id}-");
        let mut prefill = 0;
        let mut decode = 0;
        for q in steps.iter().flat_map(|s| s["batch"].as_array().unwrap()) {
            if q["request_id"].as_str().unwrap().starts_with(&prefix) {
                prefill += q["prefill_tokens"].as_u64().unwrap();
                decode += q["decode_tokens"].as_u64().unwrap();
            }
        }
        assert_eq!(prefill, u["prompt_tokens"].as_u64().unwrap(), "{id}");
        assert_eq!(decode + 1, u["completion_tokens"].as_u64().unwrap(), "{id}");
    }
    server.shutdown(Duration::from_millis(200)).await;
}
