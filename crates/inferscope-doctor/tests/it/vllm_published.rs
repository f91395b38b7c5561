//! `doctor` and `top` on vLLM's own published `/metrics` output (the
//! `vllm_*` fixtures: each names its source, and which lines are published
//! and which snapshot is derived). Nothing here was recorded from inferscope.

use inferscope_doctor::report::Report;
use inferscope_doctor::top::{TopModel, render};
use inferscope_doctor::window::{Scrape, Window};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

/// Seconds between the two snapshots of every fixture (as their headers say).
const WINDOW_S: f64 = 10.0;

fn fixture(name: &str) -> Scrape {
    let path = format!("{}/tests/fixtures/{name}.prom", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Scrape::parse(&text)
}

fn report(name: &str) -> Report {
    let w = Window::new(
        vec![
            (0.0, fixture(&format!("{name}_before"))),
            (WINDOW_S, fixture(&format!("{name}_after"))),
        ],
        None,
    );
    let r = inferscope_doctor::diagnose_window(name, &w);
    println!("{}", r.to_text());
    r
}

fn screen(name: &str, w: u16, h: u16) -> (TopModel, String) {
    let mut m = TopModel::new("http://vllm:8000/metrics", 60.0, None);
    m.on_scrape(0.0, fixture(&format!("{name}_before")));
    m.on_scrape(WINDOW_S, fixture(&format!("{name}_after")));
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    t.draw(|f| render(f, &m.state)).expect("draw");
    let buf = t.backend().buffer().clone();
    let text: Vec<String> = (0..h)
        .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect())
        .collect();
    let text = text.join("\n");
    println!("{text}");
    (m, text)
}

fn skipped(r: &Report) -> Vec<&str> {
    r.diagnosis.skipped.iter().map(|k| k.rule).collect()
}

fn bounds(b: Option<inferscope_doctor::window::Bucket>) -> (f64, Option<f64>) {
    let b = b.expect("a bucket");
    (b.lo, b.hi)
}

/// vLLM's design doc sample: V1 names, `model_name` label, no `engine`
/// label, no KV gauge, a TTFT histogram without `_sum`.
#[test]
fn design_doc_sample_doctor_judges_what_it_can_and_names_the_rest() {
    let r = report("vllm_docs");
    let s = &r.summary;
    assert_eq!(r.namespace, "vllm");
    // No `engine` label: one anonymous engine, from the running gauge.
    assert_eq!(s.engines.len(), 1);
    assert_eq!(s.engines[0].engine, "");
    assert_eq!(s.engines[0].running_now, Some(8.0));
    assert_eq!(s.engines[0].waiting_now, None, "not in the sample");
    // Counter deltas over the window, by the real finished_reason values.
    assert_eq!(s.finished_by_reason.get("stop"), Some(&1.0));
    assert_eq!(s.finished_by_reason.get("length"), Some(&10.0));
    assert_eq!(s.finished_by_reason.get("abort"), Some(&0.0));
    assert_eq!(s.requests_per_s, Some(1.1));
    assert_eq!(s.generation_tokens_per_s, Some(100.0));
    assert_eq!(s.prompt_tokens_per_s, None);
    assert_eq!(s.http_by_status.get("2xx"), Some(&11.0));
    // `enable_prefix_caching="False"` from the published cache_config_info.
    assert_eq!(s.prefix_caching_enabled, Some(false));
    // TTFT on vLLM's own bucket edges; the sample has no `_sum`, so no mean.
    let ttft = s.ttft.expect("ttft");
    assert_eq!(ttft.count, 11.0);
    assert_eq!(ttft.mean, None, "no _sum: a mean of 0 would be invented");
    assert_eq!(bounds(ttft.p50), (0.02, Some(0.04)));
    assert_eq!(bounds(ttft.p99), (0.06, Some(0.08)));
    // The verdict: no problem in what is exported, and what is not judged.
    assert_eq!(r.diagnosis.findings.len(), 1);
    let f = &r.diagnosis.findings[0];
    assert_eq!(f.id, "no_problem_found");
    assert_eq!(r.exit_code(), 0);
    assert!(
        f.title.contains("KV cache usage not exported"),
        "{}",
        f.title
    );
    assert!(!f.title.contains("peaked"), "{}", f.title);
    assert_eq!(f.evidence("kv_usage_peak"), None);
    assert_eq!(f.evidence("ttft_p99_bucket_hi"), Some(0.08));
    assert_eq!(
        skipped(&r),
        [
            "kv_saturated",
            "queue_bound",
            "host_bound",
            "long_prompts",
            "prefix_cache",
            "admission_rejections"
        ]
    );
    assert!(
        f.title.contains("not evaluated: kv_saturated"),
        "{}",
        f.title
    );
    assert_eq!(
        s.missing,
        [
            "vllm:device_busy_seconds",
            "vllm:engine_step_duration_seconds",
            "vllm:engine_idle_seconds"
        ]
    );
}

/// vLLM 0.10.0: `engine="0"`, `_created` gauges, deprecated prefix names
/// beside the V1 ones, the older ITL name, histograms without `_count`.
#[test]
fn vllm_0_10_sample_engine_label_created_lines_and_prefix_name_generations() {
    let r = report("vllm_0_10");
    let s = &r.summary;
    assert_eq!(r.namespace, "vllm");
    // The engine comes from the KV gauge's `engine` label.
    assert_eq!(s.engines.len(), 1);
    assert_eq!(s.engines[0].engine, "0");
    assert_eq!(s.kv_usage_peak, Some(9.75010481363281e-06));
    assert_eq!(s.engines[0].running_now, None);
    // `_created` gauges are not series of their families: the TTFT
    // histogram is absent though `..._seconds_created` is there, and the
    // deprecated queries counter exists only as `_created`.
    assert!(s.ttft.is_none());
    let w = Window::new(
        vec![
            (0.0, fixture("vllm_0_10_before")),
            (WINDOW_S, fixture("vllm_0_10_after")),
        ],
        None,
    );
    assert_eq!(w.delta("vllm:gpu_prefix_cache_queries_total", &[]), None);
    // One counter of each generation moved: V1 queries +64, deprecated
    // hits +32. Mixing them would read a 50 % hit rate; a pair must come
    // from one generation, so there is no hit rate here.
    assert_eq!(w.delta("vllm:prefix_cache_queries_total", &[]), Some(64.0));
    assert_eq!(w.delta("vllm:gpu_prefix_cache_hits_total", &[]), Some(32.0));
    assert_eq!(s.prefix_cache_queries, None);
    assert_eq!(s.prefix_cache_hits, None);
    // ITL from `time_per_output_token_seconds`, counted from its buckets
    // (the excerpt has no `_count`), with no mean (no `_sum`).
    let itl = s.itl.expect("itl from the older name");
    assert_eq!(itl.count, 100.0);
    assert_eq!(itl.mean, None);
    assert_eq!(bounds(itl.p50), (0.05, Some(0.075)));
    assert_eq!(bounds(itl.p99), (0.05, Some(0.075)));
    let queue = s.queue.expect("queue");
    assert_eq!(queue.count, 2.0);
    assert_eq!(bounds(queue.p99), (0.0, Some(1.0)), "lowest published edge");
    let f = &r.diagnosis.findings[0];
    assert_eq!(f.id, "no_problem_found");
    assert!(f.title.contains("KV cache peaked at 0%"), "{}", f.title);
    assert!(
        !skipped(&r).contains(&"kv_saturated"),
        "the KV gauge is there"
    );
    assert!(skipped(&r).contains(&"admission_rejections"));
}

/// Early V1 (spring 2025): the older KV and ITL names, no `engine` label,
/// `iteration_tokens_total` on CUDA-graph bucket edges, no request counter.
#[test]
fn early_v1_sample_older_names_and_cuda_graph_buckets() {
    let r = report("vllm_v1_early");
    let s = &r.summary;
    assert_eq!(r.namespace, "vllm");
    assert_eq!(s.engines.len(), 1);
    // `vllm:gpu_cache_usage_perc` read: 0, not "not exported".
    assert_eq!(s.kv_usage_peak, Some(0.0));
    assert_eq!(s.engines[0].waiting_now, Some(0.0));
    let itl = s.itl.expect("itl from time_per_output_token_seconds");
    assert_eq!(itl.count, 2000.0);
    assert_eq!(bounds(itl.p50), (0.025, Some(0.05)));
    assert_eq!(bounds(itl.p99), (0.05, Some(0.075)));
    // Tokens per step: 1000 steps, mean 141 (this histogram has `_sum`),
    // all at or below the lowest published edge, 440.
    let it = s.iteration_tokens.expect("iteration_tokens_total");
    assert_eq!(it.count, 1000.0);
    assert_eq!(it.mean, Some(141.0));
    assert_eq!(bounds(it.p99), (0.0, Some(440.0)));
    // Prompt lengths without `_sum`: the prefix rule says why it cannot judge.
    assert_eq!(s.prompt_len.map(|d| d.count), Some(10.0));
    let why = r
        .diagnosis
        .skipped
        .iter()
        .find(|k| k.rule == "prefix_cache")
        .expect("prefix_cache skipped");
    assert!(why.reason.contains("_sum"), "{}", why.reason);
    // No request counter and an idle gauge at both scrapes, but 2000 tokens
    // were timed: there was traffic, so not "no_traffic".
    assert_eq!(s.finished_by_reason.len(), 0);
    let f = &r.diagnosis.findings[0];
    assert_eq!(f.id, "no_problem_found", "{}", f.title);
    assert_eq!(f.evidence("itl_p99_bucket_hi"), Some(0.075));
}

#[test]
fn top_renders_the_design_doc_sample_without_inventing_zeros() {
    let (m, text) = screen("vllm_docs", 120, 30);
    assert!(text.contains("[vllm] — up"), "{text}");
    // The anonymous engine: 8 running, waiting and KV not exported.
    let row = text
        .lines()
        .find(|l| l.trim_start_matches('│').starts_with("-  "))
        .expect("engine row");
    let cells: Vec<&str> = row.trim_matches('│').split_whitespace().collect();
    assert_eq!(cells[..5], ["-", "8", "n/a", "n/a", "n/a"], "{row}");
    assert_eq!(m.state.engines[0].waiting, None);
    assert!(text.contains("prompt: not exported"), "{text}");
    assert!(text.contains("generation 100 tok/s"), "{text}");
    assert!(text.contains("engine -: not exported"), "{text}");
    assert!(
        text.contains("TTFT p50 in 20–40 ms  p99 in 60–80 ms  mean –  n=11"),
        "{text}"
    );
    assert!(text.contains("ITL  p50 –  p99 –  (not exported)"), "{text}");
    assert!(text.contains("requests: abort 0.00/s  length 1.00/s  stop 0.10/s"));
    assert!(text.contains("http: 2xx 1.10/s"), "{text}");
}

#[test]
fn top_renders_the_older_names_and_the_engine_label() {
    let (_, text) = screen("vllm_0_10", 120, 30);
    let row = text
        .lines()
        .find(|l| l.trim_start_matches('│').starts_with("0  "))
        .expect("engine 0 row");
    assert!(row.contains("0.0%") && row.contains('░'), "{row}");
    assert!(
        text.contains("ITL  p50 in 50–75 ms  p99 in 50–75 ms  mean –  n=100"),
        "{text}"
    );
    let (_, text) = screen("vllm_v1_early", 120, 30);
    assert!(
        text.contains("ITL  p50 in 25–50 ms  p99 in 50–75 ms  mean –  n=2000"),
        "{text}"
    );
    assert!(text.contains("TTFT p50 –  p99 –  (not exported)"), "{text}");
}

/// vLLM V1 with two data-parallel engines (multiprocess exposition): the
/// engines come from the `engine` label of its histograms.
#[test]
fn data_parallel_sample_per_engine_histograms() {
    let r = report("vllm_dp2");
    let s = &r.summary;
    assert_eq!(r.namespace, "vllm");
    let engines: Vec<&str> = s.engines.iter().map(|e| e.engine.as_str()).collect();
    assert_eq!(engines, ["0", "1"]);
    // Totals over engines: engine 0 finished 3 requests, engine 1 gave 1
    // first token, each on vLLM 0.10's bucket edges.
    let e2e = s.e2e.expect("e2e");
    assert_eq!(
        e2e.count, 3.0,
        "from the buckets: the excerpt has no _count"
    );
    assert_eq!(bounds(e2e.p50), (5.0, Some(10.0)));
    assert_eq!(bounds(s.queue.expect("queue").p99), (0.0, Some(15.0)));
    assert_eq!(s.ttft.map(|d| d.count), Some(1.0));
    // Means need `_sum`: the queue rule says so rather than judge.
    let why = |rule: &str| {
        r.diagnosis
            .skipped
            .iter()
            .find(|k| k.rule == rule)
            .map(|k| k.reason.clone())
            .unwrap_or_default()
    };
    assert!(
        why("queue_bound").contains("_sum"),
        "{}",
        why("queue_bound")
    );
    // Two engines but neither device time nor token counters: imbalance
    // cannot be judged, and is not reported as balanced.
    assert!(
        why("dp_imbalance").contains("token counters"),
        "{}",
        why("dp_imbalance")
    );
    // top: both engines listed, the interval's TTFT on engine 1 only.
    let (m, text) = screen("vllm_dp2", 120, 30);
    for e in ["0", "1"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start_matches('│').starts_with(&format!("{e}  "))),
            "{text}"
        );
    }
    let tick = m.state.history.back().expect("a tick");
    assert_eq!(tick.engines["1"].ttft.map(|q| q.count), Some(1.0));
    assert_eq!(tick.engines["0"].ttft, None, "engine 0 has no TTFT series");
    assert!(text.contains("engine 1: p50 ≤ 100 ms"), "{text}");
}

/// Every vLLM name the doctor and `top` read (the families of
/// `window.rs` and `top.rs`, current and older names) is one vLLM's own
/// test requires of a V1 server: nothing is read under a name vLLM lacks
/// except the inferscope-only families the doctor reports as missing.
#[test]
fn every_name_read_under_vllm_is_one_vllm_exposes() {
    use inferscope_doctor::window::{
        HOST_FAMILIES, LEGACY_GPU_PREFIX_CACHE_HITS, LEGACY_GPU_PREFIX_CACHE_QUERIES,
    };
    use inferscope_schema::names;
    use inferscope_schema::scrape::{
        LEGACY_GPU_CACHE_USAGE_PERC, LEGACY_TIME_PER_OUTPUT_TOKEN_SECONDS, full_name,
    };
    let path = format!(
        "{}/tests/fixtures/vllm_expected_metrics_v1.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let expected: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert_eq!(expected.len(), 50);
    // (schema name, what is read: the series the doctor looks up).
    let counters = [
        names::PROMPT_TOKENS,
        names::GENERATION_TOKENS,
        names::NUM_PREEMPTIONS,
        names::REQUEST_SUCCESS,
        names::PREFIX_CACHE_QUERIES,
        names::PREFIX_CACHE_HITS,
        LEGACY_GPU_PREFIX_CACHE_QUERIES,
        LEGACY_GPU_PREFIX_CACHE_HITS,
    ];
    let gauges = [
        names::NUM_REQUESTS_RUNNING,
        names::NUM_REQUESTS_WAITING,
        names::KV_CACHE_USAGE_PERC,
        LEGACY_GPU_CACHE_USAGE_PERC,
        names::CACHE_CONFIG_INFO,
    ];
    let histograms = [
        names::TIME_TO_FIRST_TOKEN_SECONDS,
        names::INTER_TOKEN_LATENCY_SECONDS,
        LEGACY_TIME_PER_OUTPUT_TOKEN_SECONDS,
        names::E2E_REQUEST_LATENCY_SECONDS,
        names::REQUEST_QUEUE_TIME_SECONDS,
        names::REQUEST_PREFILL_TIME_SECONDS,
        names::REQUEST_PROMPT_TOKENS,
        names::ITERATION_TOKENS,
    ];
    // vLLM's list names a family bare (`vllm:prefix_cache_queries`,
    // `vllm:iteration_tokens_total`) or by the exposed series.
    let listed =
        |family: &str, exposed: &str| expected.contains(&family) || expected.contains(&exposed);
    let mut unknown = Vec::new();
    for c in counters {
        let f = full_name("vllm", c);
        if !listed(&f, &format!("{f}_total")) {
            unknown.push(f);
        }
    }
    for g in gauges {
        let f = full_name("vllm", g);
        if !listed(&f, &f) {
            unknown.push(f);
        }
    }
    for h in histograms {
        let f = full_name("vllm", h);
        if !listed(&f, &format!("{f}_bucket")) {
            unknown.push(f);
        }
    }
    assert!(
        unknown.is_empty(),
        "read under vllm but not in vLLM's list: {unknown:?}"
    );
    // The inferscope-only families are not in vLLM's list: the doctor says
    // they are missing (see the fixtures' `missing`).
    for h in HOST_FAMILIES.iter().chain([&names::ADMISSION_REJECTIONS]) {
        let f = full_name("vllm", h);
        assert!(!listed(&f, &format!("{f}_total")), "{f}");
    }
}
