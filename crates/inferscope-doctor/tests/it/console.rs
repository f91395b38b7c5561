//! The server's console shows the doctor's findings (docs/console.md): the
//! binary hands the server [`inferscope_doctor::console_findings`], the
//! console runs it on its own `/metrics` every few seconds, and the page's
//! data carries the same ranked findings the doctor gives over `/metrics`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inferscope_test_support::{call, sim_args};
use serde_json::Value;

use crate::common::{Load, SERIAL, Shape};

/// The console's snapshot once its findings name `id` with a finding that
/// `holds` (the test fails after `within`).
async fn findings_naming(
    addr: std::net::SocketAddr,
    id: &str,
    holds: impl Fn(&Value) -> bool,
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let r = call(addr, "GET", "/console/api/snapshot", "", &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let s = r.json();
        let found = s["findings"]["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["id"] == id && holds(f)));
        if found {
            return s;
        }
        assert!(Instant::now() < deadline, "no `{id}` finding: {s:#}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_doctors_findings_of_its_own_metrics() {
    let _serial = SERIAL.lock().await;
    let args = sim_args(&[
        "--sim-profile",
        "tiny,t_weights_ms=5",
        "--max-num-seqs",
        "1",
    ]);
    let diagnose: inferscope_server::Diagnose = Arc::new(inferscope_doctor::console_findings);
    let srv = inferscope_server::start_with_findings(&args, Some(diagnose))
        .await
        .expect("server starts");
    let shape = Shape {
        prompt_len: 24,
        max_tokens: 8,
        guided_regex: None,
    };
    let load = Load::start(srv.addr, 6, shape);
    // The running batch's peak comes from the renders' gauges: between a
    // step that finishes the one running request and the next step, the
    // gauge reads 0, and a diagnosis whose renders both fell there says 0.
    // The next diagnosis (5 s on) sees the batch.
    let running_peak = |f: &Value| {
        f["evidence"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["name"] == "running_peak_per_engine"))
            .map(|e| e["value"].clone())
    };
    // The first diagnosis needs two renders of /metrics, 5 s apart.
    let s = findings_naming(
        srv.addr,
        "queue_bound",
        |f| running_peak(f) == Some(1.0.into()),
        Duration::from_secs(40),
    )
    .await;
    load.stop().await;

    let f = &s["findings"];
    assert!(s["findings_note"].as_str().unwrap().contains("30 s"), "{s}");
    let window = f["window_s"].as_f64().unwrap();
    assert!((4.0..=31.0).contains(&window), "window {window}");
    let first = &f["findings"][0];
    assert_eq!(first["id"], "queue_bound", "{f:#}");
    assert_eq!(f["worst"], first["severity"], "{f:#}");
    assert!(
        first["action"].as_str().unwrap().contains("--max-num-seqs"),
        "{first}"
    );
    assert_eq!(running_peak(first), Some(1.0.into()), "{first}");
    srv.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_without_the_rules_says_why_it_has_no_findings() {
    let srv = inferscope_test_support::start_sim(&[]).await;
    let r = call(srv.addr, "GET", "/console/api/snapshot", "", &[]).await;
    let s = r.json();
    assert_eq!(s["findings"], Value::Null, "{s}");
    assert!(
        s["findings_note"]
            .as_str()
            .unwrap()
            .contains("inferscope doctor"),
        "{s}"
    );
    srv.shutdown(Duration::from_secs(5)).await;
}
