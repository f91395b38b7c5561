//! Fixture tests: recorded `/metrics` texts (two scrapes two seconds apart,
//! re-recorded by the ignored `record_fixtures` scenario) through the doctor
//! and the `top` view, without a server.

use inferscope_doctor::findings::Severity;
use inferscope_doctor::snapshot::{Scrape, Window};
use inferscope_doctor::top::{TopModel, render};
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
fn vllm_fixture_is_detected_and_degrades_gracefully() {
    let r = inferscope_doctor::diagnose_window("fixture", &window("vllm_kv", None));
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
    let dp = inferscope_doctor::findings::dp_imbalance(&r.summary);
    if let inferscope_doctor::findings::Outcome::Fired(f) = dp {
        assert!(
            f.evidence
                .iter()
                .any(|e| e.name.starts_with("tokens_per_s"))
        );
    }
}

#[test]
fn forced_namespace_reads_nothing_from_other_names() {
    let r = inferscope_doctor::diagnose_window("fixture", &window("vllm_kv", Some("inferscope")));
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
    m.on_scrape(0.0, fixture("vllm_kv_before"));
    m.on_scrape(2.0, fixture("vllm_kv_after"));
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
