//! `--profile-dir`: `/start_profile` and `/stop_profile`, and the Trace Event
//! Format file they write, checked against the responses' own `metrics`
//! and token counts (the acceptance test).

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const KEY: &str = "profile-key";
const AUTH: (&str, &str) = ("authorization", "Bearer profile-key");

/// A request's phases read back from the file: name → (begin, end) in µs.
type Phases = HashMap<String, (f64, f64)>;

/// The request tracks of a trace: engine request id → (pid, phases), from
/// the `b`/`e` pairs of each id (a name opens once per phase).
fn request_tracks(events: &[Value]) -> HashMap<String, (u64, Phases)> {
    let mut tracks: HashMap<String, (u64, Phases)> = HashMap::new();
    for e in events
        .iter()
        .filter(|e| e["cat"] == "request" && e["id"].is_string())
    {
        let id = e["id"].as_str().unwrap().to_owned();
        let name = e["name"].as_str().unwrap().to_owned();
        let ts = e["ts"].as_f64().expect("ts");
        let track = tracks
            .entry(id)
            .or_insert_with(|| (e["pid"].as_u64().unwrap(), HashMap::new()));
        match e["ph"].as_str().unwrap() {
            "b" => {
                // Chunks repeat their name: only the phases are kept.
                track.1.entry(name).or_insert((ts, f64::NAN));
            }
            "e" => {
                let span = track.1.get_mut(&name).expect("an end after its begin");
                if span.1.is_nan() {
                    span.1 = ts;
                }
            }
            ph => panic!("unexpected phase {ph} on a request track"),
        }
    }
    tracks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routes_exist_only_with_a_profile_dir() {
    let server = start(&[]).await;
    let r = call(server.addr, "POST", "/start_profile", "", &[]).await;
    assert_eq!(r.status, 404, "{}", r.body);
    let r = call(server.addr, "POST", "/stop_profile", "", &[]).await;
    assert_eq!(r.status, 404, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_reconstructs_each_request_and_step() {
    let dir = std::env::temp_dir().join(format!("inferscope-profile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = start(&[
        "--profile-dir",
        dir.to_str().unwrap(),
        "--api-key",
        KEY,
        "--enable-per-request-metrics",
        // Steps of 2 ms or more: every phase lasts longer than the 1 ms the
        // check allows, so a phase bound off by one step fails it.
        "--sim-profile",
        "tiny,t_fixed_ms=2",
        "--data-parallel-size",
        "2",
        // Some requests queue behind others.
        "--max-num-seqs",
        "2",
        // Every prompt token is computed, so the steps' prefill tokens sum to it.
        "--no-enable-prefix-caching",
    ])
    .await;
    let addr = server.addr;
    assert!(dir.is_dir(), "the dir is created at start");

    // The key, as on /v1/*; the order of start and stop.
    let r = call(addr, "POST", "/start_profile", "", &[]).await;
    assert_eq!(r.status, 401, "{}", r.body);
    let r = call(addr, "POST", "/stop_profile", "", &[AUTH]).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/start_profile")
    );
    let r = call(addr, "POST", "/start_profile", "", &[AUTH]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = call(addr, "POST", "/start_profile", "", &[AUTH]).await;
    assert_eq!(r.status, 409, "twice: {}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already running")
    );

    let tasks: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(3 * i)).await;
                let id = format!("p{i}");
                let body = json!({"prompt": format!("profile me {}", "x".repeat(20 * i as usize)),
                    "max_tokens": 4 + 3 * i, "ignore_eos": true, "include_metrics": true});
                let r = call(
                    addr,
                    "POST",
                    "/v1/completions",
                    &body.to_string(),
                    &[AUTH, ("x-request-id", &id)],
                )
                .await;
                assert_eq!(r.status, 200, "{}", r.body);
                (id, r.json())
            })
        })
        .collect();
    let mut responses = Vec::new();
    for t in tasks {
        responses.push(t.await.unwrap());
    }

    let r = call(addr, "POST", "/stop_profile", "", &[AUTH]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let stop = r.json();
    assert_eq!(stop["engines"], json!([0, 1]), "{stop}");
    let path = std::path::PathBuf::from(stop["path"].as_str().unwrap());
    assert_eq!(path.parent(), Some(dir.as_path()));
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let r = call(addr, "POST", "/stop_profile", "", &[AUTH]).await;
    assert_eq!(r.status, 409, "stopped already: {}", r.body);

    let events = trace["traceEvents"].as_array().expect("traceEvents");
    // One named process per engine, with its steps thread.
    for engine in [0, 1] {
        let named = |name: &str, value: &str| {
            events.iter().any(|e| {
                e["ph"] == "M"
                    && e["name"] == name
                    && e["pid"] == engine + 1
                    && e["args"]["name"] == value
            })
        };
        assert!(
            named("process_name", &format!("engine {engine}")),
            "engine {engine}"
        );
        assert!(named("thread_name", "steps"), "engine {engine}");
    }
    let steps: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "step")
        .collect();
    assert!(!steps.is_empty());
    let tracks = request_tracks(events);

    // Each request: its phases last what its `metrics` say, and it sits in
    // exactly the steps of its engine that ran between its first scheduling
    // and its last token, with its prompt and generated tokens.
    let mut engines_used = std::collections::HashSet::new();
    for (id, v) in &responses {
        let prefix = format!("{id}-");
        let (engine_id, (pid, phases)) = tracks
            .iter()
            .find(|(k, _)| k.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no track for {id}"));
        engines_used.insert(*pid);
        let m = &v["metrics"];
        for (phase, key) in [
            ("queued", "queue_time_ms"),
            ("prefill", "prefill_time_ms"),
            ("decode", "decode_time_ms"),
        ] {
            let (b, e) = phases[phase];
            let from_trace = (e - b) / 1e3;
            let reported = m[key].as_f64().unwrap();
            assert!(
                (from_trace - reported).abs() <= 1.0,
                "{id} {phase}: {from_trace} ms in the profile, {reported} ms in metrics"
            );
        }
        let (lo, hi) = (phases["prefill"].0, phases["decode"].1);
        let mut prefill = 0;
        let mut decode = 0;
        for s in steps.iter().filter(|s| s["pid"] == *pid) {
            let start = s["ts"].as_f64().unwrap();
            let end = start + s["dur"].as_f64().unwrap();
            let entry = s["args"]["batch"]
                .as_array()
                .unwrap()
                .iter()
                .find(|q| q["request_id"] == engine_id.as_str());
            let expected = start < hi && end > lo;
            assert_eq!(
                entry.is_some(),
                expected,
                "{id} in the step at {start}..{end} µs (it ran {lo}..{hi})"
            );
            if let Some(q) = entry {
                prefill += q["prefill_tokens"].as_u64().unwrap();
                decode += q["decode_tokens"].as_u64().unwrap();
            }
        }
        let usage = &v["usage"];
        assert_eq!(prefill, usage["prompt_tokens"].as_u64().unwrap(), "{id}");
        // The first token comes from the last prefill step.
        assert_eq!(
            decode + 1,
            usage["completion_tokens"].as_u64().unwrap(),
            "{id}"
        );
    }
    assert_eq!(
        engines_used.len(),
        2,
        "both engines served: {engines_used:?}"
    );

    // Each step: its phases tile it, and device plus host time is its wall time.
    for s in &steps {
        let args = &s["args"];
        let dur = s["dur"].as_f64().unwrap();
        let split =
            args["device_time_us"].as_f64().unwrap() + args["host_time_us"].as_f64().unwrap();
        assert!(split >= dur - 0.01, "{s}");
        assert!(args["device_time_us"].as_f64().unwrap() > 0.0, "{s}");
        let tokens: u64 = args["batch"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["prefill_tokens"].as_u64().unwrap() + q["decode_tokens"].as_u64().unwrap())
            .sum();
        assert_eq!(
            tokens,
            args["prefill_tokens"].as_u64().unwrap() + args["decode_tokens"].as_u64().unwrap()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
