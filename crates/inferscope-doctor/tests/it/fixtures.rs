//! Fixture tests: `/metrics` texts recorded from inferscope itself (two
//! scrapes two seconds apart, re-recorded by the ignored `record_fixtures`
//! scenario; `inferscope_as_vllm_kv` under `--metrics-namespace vllm`)
//! through the doctor and the `top` view, without a server. vLLM's own
//! published output is tested in `vllm_published.rs`.

use inferscope_doctor::findings::Severity;
use inferscope_doctor::top::{TopModel, render};
use inferscope_doctor::window::{Scrape, Window};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn fixture(name: &str) -> Scrape {
    let path = format!("{}/tests/fixtures/{name}.prom", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Scrape::parse(&text)
}

fn window(name: &str, ns: Option<&str>) -> Window {
    Window::new(
        vec![
            (0.0, fixture(&format!("{name}_before"))),
            (2.0, fixture(&format!("{name}_after"))),
        ],
        ns,
    )
}

#[test]
fn inferscope_queue_fixture() {
    let r = inferscope_doctor::diagnose_window("fixture", &window("inferscope_queue", None));
    println!("{}", r.to_text());
    assert_eq!(r.namespace, "inferscope");
    let f = &r.diagnosis.findings[0];
    assert_eq!(f.id, "queue_bound");
    assert!(f.evidence("queue_share_of_e2e").is_some_and(|v| v >= 0.3));
    assert_eq!(f.evidence("running_peak_per_engine"), Some(1.0));
    assert!(f.evidence("device_utilisation").is_some());
    // Every rule could run: the inferscope schema has the host families.
    assert!(r.summary.missing.is_empty(), "{:?}", r.summary.missing);
    assert!(!r.diagnosis.skipped.iter().any(|s| s.rule == "host_bound"));
}

#[test]
fn inferscope_as_vllm_fixture_is_detected_and_degrades_gracefully() {
    let r = inferscope_doctor::diagnose_window("fixture", &window("inferscope_as_vllm_kv", None));
    println!("{}", r.to_text());
    assert_eq!(r.namespace, "vllm");
    assert_eq!(r.summary.engines.len(), 2);
    let f = &r.diagnosis.findings[0];
    assert_eq!(f.id, "kv_saturated");
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(r.exit_code(), 2);
    assert!(f.evidence("preemptions").is_some_and(|p| p >= 1.0));
    assert!(f.evidence("num_gpu_blocks").is_some());
    // vLLM lacks device and host time: the rule that needs them says so.
    let skipped = r
        .diagnosis
        .skipped
        .iter()
        .find(|s| s.rule == "host_bound")
        .expect("host_bound skipped");
    assert!(skipped.reason.contains("vLLM"), "{}", skipped.reason);
    assert_eq!(r.summary.missing.len(), 3);
    assert!(r.to_text().contains("rules not evaluated"));
    // Imbalance falls back from device time to tokens per second.
    // vLLM has no device time, and its two engines here are balanced in
    // tokens per second (909 + 2534.5 vs 909 + 2748): the rule stays clear.
    use inferscope_doctor::findings::{Outcome, dp_imbalance};
    assert!(
        r.summary
            .engines
            .iter()
            .all(|e| e.device_utilisation.is_none())
    );
    assert_eq!(dp_imbalance(&r.summary), Outcome::Clear);
    // The same window with engine 0 doing most of the work fires, on
    // tokens per second.
    let mut skewed = r.summary.clone();
    skewed.engines[0].generation_tokens_per_s = Some(20_000.0);
    match dp_imbalance(&skewed) {
        Outcome::Fired(f) => {
            assert_eq!(f.id, "dp_imbalance");
            assert_eq!(f.evidence("tokens_per_s_max"), Some(20_909.0));
            assert_eq!(f.evidence("tokens_per_s_min"), Some(909.0 + 2748.0));
            assert!(f.evidence("device_utilisation_max").is_none());
        }
        other => panic!("a 5x imbalance must fire: {other:?}"),
    }
}

#[test]
fn forced_namespace_reads_nothing_from_other_names() {
    let r = inferscope_doctor::diagnose_window(
        "fixture",
        &window("inferscope_as_vllm_kv", Some("inferscope")),
    );
    assert_eq!(r.namespace, "inferscope");
    assert!(r.summary.engines.is_empty());
    assert_eq!(r.diagnosis.findings[0].id, "no_traffic");
}

/// The screen as lines of text.
fn screen(model: &TopModel, w: u16, h: u16) -> Vec<String> {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    t.draw(|f| render(f, &model.state)).expect("draw");
    let buf = t.backend().buffer().clone();
    (0..h)
        .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect())
        .collect()
}

#[test]
fn top_renders_recorded_metrics() {
    let mut m = TopModel::new("http://h:8000/metrics", 10.0, None);
    m.on_scrape(0.0, fixture("inferscope_as_vllm_kv_before"));
    m.on_scrape(2.0, fixture("inferscope_as_vllm_kv_after"));
    let lines = screen(&m, 110, 24);
    let text = lines.join("\n");
    println!("{text}");
    assert!(text.contains("inferscope top — http://h:8000/metrics [vllm] — up"));
    // Both engines, with KV bars.
    let rows: Vec<&String> = lines
        .iter()
        .filter(|l| {
            l.trim_start_matches('│')
                .trim_start()
                .starts_with(['0', '1'])
        })
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows.iter().all(|r| r.contains('█') || r.contains('░')));
    assert!(rows.iter().all(|r| r.contains('%')));
    // Throughput titles carry the latest rate; the rates are positive.
    let g = m.state.generation_tps.back().copied().expect("a rate");
    assert!(g > 0.0);
    assert!(text.contains(&format!("generation {g:.0} tok/s")), "{text}");
    assert!(text.contains("TTFT p50"));
    assert!(text.contains("requests: "));
    assert!(text.contains("length "), "{text}");
    // vLLM has no device time.
    assert!(text.contains("device utilisation: n/a"));
}

#[test]
fn top_survives_the_server_going_away_and_coming_back() {
    let mut m = TopModel::new("http://h:8000/metrics", 10.0, None);
    m.on_scrape(0.0, fixture("inferscope_queue_before"));
    m.on_scrape(2.0, fixture("inferscope_queue_after"));
    let before = m.state.engines.clone();
    m.on_error("connection refused".into());
    m.on_error("connection refused".into());
    let text = screen(&m, 110, 24).join("\n");
    assert!(
        text.contains("UNREACHABLE (2 failed scrapes: connection refused)"),
        "{text}"
    );
    // The last figures stay on screen.
    assert_eq!(m.state.engines, before);
    assert!(text.contains("device busy"));
    // Back, restarted with counters at zero: no negative or spanning rates.
    let sparks = m.state.generation_tps.len();
    m.on_scrape(3.0, fixture("inferscope_queue_before"));
    assert_eq!(
        m.state.generation_tps.len(),
        sparks,
        "one scrape: no rate yet"
    );
    m.on_scrape(5.0, fixture("inferscope_queue_after"));
    assert_eq!(m.state.generation_tps.len(), sparks + 1);
    assert!(m.state.generation_tps.iter().all(|v| *v >= 0.0));
    let text = screen(&m, 110, 24).join("\n");
    assert!(text.contains("— up —"), "{text}");
    // Device utilisation shown as a bar for inferscope.
    assert!(text.contains("device utilisation: █"), "{text}");
}

/// A Prometheus `query_range` answer holding the two scrapes of a fixture.
fn matrix(name: &str) -> serde_json::Value {
    use std::collections::BTreeMap;
    let mut series: BTreeMap<Vec<(String, String)>, Vec<serde_json::Value>> = BTreeMap::new();
    for (t, which) in [(1_700_000_000.0, "before"), (1_700_000_002.0, "after")] {
        for s in fixture(&format!("{name}_{which}")).samples {
            let mut key = vec![("__name__".to_string(), s.name.clone())];
            key.extend(s.labels.clone());
            series
                .entry(key)
                .or_default()
                .push(serde_json::json!([t, s.value.to_string()]));
        }
    }
    let result: Vec<serde_json::Value> = series
        .into_iter()
        .map(|(k, values)| {
            let metric: serde_json::Map<String, serde_json::Value> =
                k.into_iter().map(|(a, b)| (a, b.into())).collect();
            serde_json::json!({"metric": metric, "values": values})
        })
        .collect();
    serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": result}})
}

#[tokio::test]
async fn prometheus_range_query_mode() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let body = matrix("inferscope_as_vllm_kv").to_string();
    let server = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.expect("accept");
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            req.extend_from_slice(&buf[..n]);
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        sock.write_all(head.as_bytes()).await.expect("write");
        sock.write_all(body.as_bytes()).await.expect("write");
        String::from_utf8_lossy(&req).into_owned()
    });
    let w = inferscope_doctor::prometheus_api::collect(
        &format!("http://{addr}"),
        "job=\"llm\"",
        std::time::Duration::from_secs(60),
        None,
    )
    .await
    .expect("range query");
    let request = server.await.expect("server");
    let line = request.lines().next().unwrap_or_default();
    assert!(line.starts_with("GET /api/v1/query_range?query="), "{line}");
    assert!(line.contains("job%3D%22llm%22"), "{line}");
    assert!(line.contains("&step=7.500"), "{line}");
    let r = inferscope_doctor::diagnose_window("prom", &w);
    assert_eq!(r.namespace, "vllm");
    assert_eq!(r.window_s, 2.0);
    assert_eq!(r.diagnosis.findings[0].id, "kv_saturated");
}
