//! End-to-end checks of the rendered exposition: every schema metric is
//! there, histograms are well formed, engines don't overwrite each other,
//! and both formats follow their specs.

use std::time::Duration;

use inferscope_metrics::{Format, StatLoggerManager};
use inferscope_schema::promtext::{check_histograms, parse};
use inferscope_schema::schema::{self, MetricType};
use inferscope_schema::{FinishReason, FrontendRequestStats, FrontendStats, StatsRecorder};

use crate::traffic::{busy_manager, config, finished, sched, step};

#[test]
fn every_schema_metric_is_exposed_and_well_formed() {
    for format in [Format::Prometheus, Format::OpenMetrics] {
        let m = busy_manager("inferscope", &[0]);
        let (_, body) = m.render(format);
        let expo = parse(&body).unwrap_or_else(|e| panic!("{format:?}: {e}\n{body}"));
        // HTTP families with labels have no series before the first request
        // (tests/http.rs covers them); families without series are omitted.
        let defs = schema::ENGINE_METRICS
            .iter()
            .chain([&schema::HTTP_REQUEST_DURATION_HIGHR]);
        for def in defs {
            // 0.0.4 names counter families `x_total`; OpenMetrics names them `x`.
            let family = match (format, def.metric_type) {
                (Format::OpenMetrics, MetricType::Counter) => def.registered_name("inferscope"),
                _ => def.exposed_name("inferscope"),
            };
            let f = expo
                .family(&family)
                .unwrap_or_else(|| panic!("{format:?}: {family} missing\n{body}"));
            assert_eq!(f.typ, def.metric_type.as_str(), "{family}");
            assert_eq!(f.help.as_deref(), Some(format!("{}.", def.help).as_str()));
            assert!(
                f.unit.is_none(),
                "{family}: names carry their unit, no # UNIT"
            );
        }
        let n = check_histograms(&expo).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        assert!(n >= 20, "{n} histogram series checked");
    }
}

#[test]
fn values_land_where_expected() {
    let m = busy_manager("inferscope", &[0]);
    let (_, body) = m.render(Format::Prometheus);
    let e = parse(&body).unwrap();
    let l = [("model_name", "demo"), ("engine", "0")];
    let v = |name: &str, extra: &[(&str, &str)]| {
        let mut labels = l.to_vec();
        labels.extend_from_slice(extra);
        e.value(name, &labels)
            .unwrap_or_else(|| panic!("{name} {extra:?} missing\n{body}"))
    };
    assert_eq!(v("inferscope_num_requests_running", &[]), 0.0, "idle after");
    assert_eq!(v("inferscope_num_requests_waiting", &[]), 2.0);
    assert_eq!(v("inferscope_kv_cache_usage_perc", &[]), 0.25);
    assert_eq!(v("inferscope_prompt_tokens_total", &[]), 40.0);
    assert_eq!(v("inferscope_generation_tokens_total", &[]), 3.0);
    assert_eq!(v("inferscope_num_preemptions_total", &[]), 2.0);
    assert_eq!(v("inferscope_prefix_cache_queries_total", &[]), 80.0);
    assert_eq!(v("inferscope_prefix_cache_hits_total", &[]), 32.0);
    assert_eq!(v("inferscope_prompt_tokens_cached_total", &[]), 16.0);
    // One step of 40 prompt tokens, 16 of them from the cache.
    let source = |s: &str| v("inferscope_prompt_tokens_by_source_total", &[("source", s)]);
    assert_eq!(source("local_cache_hit"), 16.0);
    assert_eq!(source("local_compute"), 24.0);
    // Each expert's tokens of the one step, a series per expert.
    let expert = |x: &str| v("inferscope_moe_expert_tokens_total", &[("expert", x)]);
    assert_eq!([expert("0"), expert("1"), expert("2")], [3.0, 0.0, 5.0]);
    // Two finished requests of 40 prompt tokens with 16 cached.
    let kv = "inferscope_request_prefill_kv_computed_tokens_sum";
    assert_eq!(v(kv, &[]), 48.0);
    // 2 waiting after the last (idle) snapshot, none deferred.
    let waiting = |r: &str| {
        v(
            "inferscope_num_requests_waiting_by_reason",
            &[("reason", r)],
        )
    };
    assert_eq!((waiting("capacity"), waiting("deferred")), (2.0, 0.0));
    assert_eq!(
        v(
            "inferscope_request_success_total",
            &[("finished_reason", "stop")]
        ),
        1.0
    );
    assert_eq!(
        v(
            "inferscope_request_success_total",
            &[("finished_reason", "abort")]
        ),
        1.0
    );
    assert_eq!(
        v(
            "inferscope_request_success_total",
            &[("finished_reason", "error")]
        ),
        0.0,
        "every reason pre-created"
    );
    assert_eq!(v("inferscope_engine_steps_total", &[]), 1.0);
    assert!((v("inferscope_device_busy_seconds_total", &[]) - 0.005).abs() < 1e-9);
    assert!((v("inferscope_engine_idle_seconds_total", &[]) - 0.25).abs() < 1e-9);
    assert_eq!(v("inferscope_inter_token_latency_seconds_count", &[]), 6.0);
    assert_eq!(v("inferscope_time_to_first_token_seconds_count", &[]), 1.0);
    // TPOT = (0.3 - 0.12) / 6 = 0.03
    assert!((v("inferscope_request_time_per_output_token_seconds_sum", &[]) - 0.03).abs() < 1e-9);
    assert_eq!(v("inferscope_e2e_request_latency_seconds_count", &[]), 1.0);
    assert_eq!(v("inferscope_request_queue_time_seconds_count", &[]), 2.0);
    assert_eq!(
        v("inferscope_iteration_tokens_bucket", &[("le", "32")]),
        0.0
    );
    assert_eq!(
        v("inferscope_iteration_tokens_bucket", &[("le", "64")]),
        1.0
    );
    assert_eq!(
        v("inferscope_request_prompt_tokens_bucket", &[("le", "50")]),
        2.0
    );
    assert_eq!(
        v(
            "inferscope_engine_step_duration_seconds_count",
            &[("phase", "execute")]
        ),
        1.0
    );
    assert_eq!(
        e.value(
            "inferscope_admission_rejections_total",
            &[("model_name", "demo"), ("reason", "queue_full")]
        ),
        Some(1.0)
    );
    assert_eq!(
        e.value(
            "inferscope_cache_config_info",
            &[
                ("engine", "0"),
                ("block_size", "16"),
                ("num_gpu_blocks", "512"),
                ("enable_prefix_caching", "True"),
                ("cache_dtype", "auto"),
            ]
        ),
        Some(1.0)
    );
}

#[test]
fn request_token_buckets_follow_max_model_len() {
    let m = busy_manager("inferscope", &[0]);
    let (_, body) = m.render(Format::Prometheus);
    let e = parse(&body).unwrap();
    let les: Vec<&str> = e
        .family("inferscope_request_prompt_tokens")
        .unwrap()
        .samples
        .iter()
        .filter_map(|s| s.labels.get("le").map(String::as_str))
        .collect();
    assert_eq!(les, ["1", "2", "5", "10", "20", "50", "100", "+Inf"]);
}

#[test]
fn engines_do_not_overwrite_each_other() {
    for engines in [[0usize, 1], [2, 3]] {
        let m = busy_manager("inferscope", &engines);
        let (_, body) = m.render(Format::Prometheus);
        let e = parse(&body).unwrap();
        check_histograms(&e).unwrap();
        for (k, idx) in engines.iter().enumerate() {
            let idx = idx.to_string();
            let l = [("model_name", "demo"), ("engine", idx.as_str())];
            let k = k as f64 + 1.0;
            assert_eq!(
                e.value("inferscope_engine_steps_total", &l),
                Some(k),
                "{body}"
            );
            assert_eq!(
                e.value("inferscope_prompt_tokens_total", &l),
                Some(40.0 * k)
            );
            assert_eq!(
                e.value("inferscope_time_to_first_token_seconds_count", &l),
                Some(1.0)
            );
            assert!(
                e.value("inferscope_cache_config_info", &[("engine", idx.as_str())])
                    .is_some()
            );
        }
        assert_eq!(e.series_count("inferscope_num_requests_running"), 2);
        assert!(
            e.value("inferscope_engine_steps_total", &[("engine", "7")])
                .is_none()
        );
    }
}

#[test]
fn unknown_engine_is_ignored() {
    let m = busy_manager("inferscope", &[4, 5]);
    m.record_step(0, &sched(1), &step(1, 1));
    assert!(m.frontend(0).is_none());
    let (_, body) = m.render(Format::Prometheus);
    assert!(!body.contains("engine=\"0\""), "{body}");
}

#[test]
fn prometheus_text_follows_0_0_4() {
    let m = busy_manager("vllm", &[0]);
    let (ct, body) = m.render(Format::Prometheus);
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    assert!(!body.contains("# EOF"));
    assert!(!body.contains("# UNIT"));
    assert!(!body.contains("_created"));
    assert!(
        body.contains("# TYPE vllm:request_success_total counter\n"),
        "{body}"
    );
    assert!(body.contains("# HELP vllm:request_success_total "));
    assert!(body.contains("# TYPE vllm:iteration_tokens_total histogram\n"));
    assert!(body.contains("# TYPE vllm:cache_config_info gauge\n"));
    let e = parse(&body).unwrap();
    assert!(!e.eof);
    assert!(e.samples().all(|s| s.exemplar.is_none()));
}

#[test]
fn openmetrics_follows_1_0_0() {
    let m = busy_manager("vllm", &[0]);
    let (ct, body) = m.render(Format::OpenMetrics);
    assert_eq!(
        ct,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(body.ends_with("# EOF\n"));
    assert!(
        body.contains("# TYPE vllm:request_success counter\n"),
        "{body}"
    );
    assert!(body.contains("vllm:request_success_total{"));
    let e = parse(&body).unwrap();
    assert!(e.eof);
}

#[test]
fn bucket_overrides_apply() {
    let mut c = config("inferscope", &[0]);
    c.buckets.set_from_str("time_to_first_token=0.5,1").unwrap();
    let m = StatLoggerManager::new(c).unwrap();
    m.frontend(0).unwrap().record(&FrontendStats::FirstToken {
        ttft: Duration::from_millis(700),
    });
    let (_, body) = m.render(Format::Prometheus);
    let e = parse(&body).unwrap();
    let les: Vec<&str> = e
        .family("inferscope_time_to_first_token_seconds")
        .unwrap()
        .samples
        .iter()
        .filter_map(|s| s.labels.get("le").map(String::as_str))
        .collect();
    assert_eq!(les, ["0.5", "1", "+Inf"]);
    assert_eq!(
        e.value(
            "inferscope_time_to_first_token_seconds_bucket",
            &[("le", "1")]
        ),
        Some(1.0)
    );
}

/// The `le` bounds of histogram family `family` in `body`, `+Inf` included.
fn bounds_of(body: &str, family: &str) -> Vec<String> {
    parse(body)
        .unwrap()
        .family(family)
        .unwrap_or_else(|| panic!("{family} missing\n{body}"))
        .samples
        .iter()
        .filter_map(|s| s.labels.get("le").cloned())
        .collect()
}

#[test]
fn latency_buckets_are_finer_natively_and_vllms_under_vllm() {
    let le = |b: &[f64]| {
        let mut v: Vec<String> = b.iter().map(|x| format!("{x}")).collect();
        v.push("+Inf".into());
        v
    };
    // Native: every request_latency histogram resolves 1 ms to 200 ms.
    let m = StatLoggerManager::new(config("inferscope", &[0])).unwrap();
    let mut f = finished(FinishReason::Stop);
    f.queue_time = Duration::from_millis(7);
    let mut s = step(1, 1);
    s.finished_requests = vec![f];
    m.record_step(0, &sched(1), &s);
    let (_, body) = m.render(Format::Prometheus);
    for def in [
        &schema::E2E_REQUEST_LATENCY,
        &schema::REQUEST_QUEUE_TIME,
        &schema::REQUEST_INFERENCE_TIME,
        &schema::REQUEST_PREFILL_TIME,
        &schema::REQUEST_DECODE_TIME,
    ] {
        let name = def.exposed_name("inferscope");
        assert_eq!(
            bounds_of(&body, &name),
            le(schema::REQUEST_LATENCY_FINE_BUCKETS),
            "{name}"
        );
    }
    // A 7 ms wait lands in (5 ms, 10 ms], not in vLLM's 0–300 ms.
    let e = parse(&body).unwrap();
    let q = "inferscope_request_queue_time_seconds_bucket";
    assert_eq!(e.value(q, &[("le", "0.005")]), Some(0.0));
    assert_eq!(e.value(q, &[("le", "0.01")]), Some(1.0));
    // vllm: vLLM's defaults exactly, unless overridden.
    let (_, body) = StatLoggerManager::new(config("vllm", &[0]))
        .unwrap()
        .render(Format::Prometheus);
    assert_eq!(
        bounds_of(&body, "vllm:request_queue_time_seconds"),
        le(schema::REQUEST_LATENCY_BUCKETS)
    );
    let mut c = config("vllm", &[0]);
    c.buckets.set_from_str("request_latency=0.01,0.1").unwrap();
    let (_, body) = StatLoggerManager::new(c)
        .unwrap()
        .render(Format::Prometheus);
    assert_eq!(
        bounds_of(&body, "vllm:e2e_request_latency_seconds"),
        ["0.01", "0.1", "+Inf"]
    );
}

#[test]
fn disabled_prometheus_exposes_no_engine_metrics() {
    let mut c = config("inferscope", &[0]);
    c.enable_prometheus = false;
    let m = StatLoggerManager::new(c).unwrap();
    m.record_step(0, &sched(1), &step(1, 1));
    m.frontend(0).unwrap().record(&FrontendStats::NextToken {
        itl: Duration::from_millis(100),
        count: 1,
    });
    let (_, body) = m.render(Format::Prometheus);
    assert!(!body.contains("inferscope_"), "{body}");
    assert!(body.contains("http_request_duration_highr_seconds"));
}

#[test]
fn openmetrics_carries_the_latest_request_of_each_bucket_as_exemplar() {
    use inferscope_schema::RequestRef;
    let m = StatLoggerManager::new(config("vllm", &[0, 1])).unwrap();
    let e0 = m.frontend(0).unwrap();
    let traced = RequestRef::new("traced-1", Some([0x4b; 16]));
    let plain = RequestRef::new("plain-2", None);
    // Same TTFT bucket twice: the later request is the exemplar.
    let ttft = |ms| FrontendStats::FirstToken {
        ttft: Duration::from_millis(ms),
    };
    e0.record_for(&ttft(30), &plain);
    e0.record_for(&ttft(35), &traced);
    e0.record_for(
        &FrontendStats::NextToken {
            itl: Duration::from_millis(12),
            count: 1,
        },
        &plain,
    );
    let mut req = finished(FinishReason::Stop);
    req.request = plain.clone();
    m.record_finished(0, &[req]);
    e0.record_for(
        &FrontendStats::Finished(FrontendRequestStats {
            ttft: Some(Duration::from_millis(35)),
            e2e: Duration::from_millis(900),
            num_generation_tokens: 7,
        }),
        &traced,
    );

    let (_, body) = m.render(Format::OpenMetrics);
    let e = parse(&body).unwrap();
    let bucket_of = |family: &str, engine: &str| -> Vec<(f64, String, f64)> {
        e.family(family)
            .unwrap_or_else(|| panic!("{family} missing"))
            .samples
            .iter()
            .filter(|s| s.name.ends_with("_bucket") && s.labels["engine"] == engine)
            .scan(f64::NEG_INFINITY, |below, s| {
                let le: f64 = match s.labels["le"].as_str() {
                    "+Inf" => f64::INFINITY,
                    v => v.parse().unwrap(),
                };
                let lower = std::mem::replace(below, le);
                Some(s.exemplar.as_ref().map(|ex| {
                    // On the bucket the value falls in: above the previous bound.
                    assert!(
                        lower < ex.value && ex.value <= le,
                        "{family}: exemplar {} on le={le}",
                        ex.value
                    );
                    let (k, v) = ex.labels.iter().next().unwrap();
                    assert!(ex.timestamp.is_some(), "timestamped");
                    (le, format!("{k}={v}"), ex.value)
                }))
            })
            .flatten()
            .collect()
    };
    let ttft = bucket_of("vllm:time_to_first_token_seconds", "0");
    assert_eq!(ttft.len(), 1, "{ttft:?}");
    assert_eq!(ttft[0].1, format!("trace_id={}", "4b".repeat(16)));
    assert_eq!(ttft[0].2, 0.035);
    assert!(ttft[0].2 <= ttft[0].0, "exemplar within its bucket");
    assert!(
        bucket_of("vllm:time_to_first_token_seconds", "1").is_empty(),
        "engine 1 saw nothing"
    );
    let itl = bucket_of("vllm:inter_token_latency_seconds", "0");
    assert_eq!(itl.len(), 1);
    assert_eq!(itl[0].1, "request_id=plain-2");
    for (family, expect) in [
        ("vllm:request_queue_time_seconds", 0.4),
        ("vllm:request_prefill_time_seconds", 0.05),
        ("vllm:request_decode_time_seconds", 0.9),
        ("vllm:request_inference_time_seconds", 0.95),
    ] {
        let ex = bucket_of(family, "0");
        assert_eq!(ex.len(), 1, "{family}: {ex:?}");
        assert_eq!((ex[0].1.as_str(), ex[0].2), ("request_id=plain-2", expect));
    }
    let e2e = bucket_of("vllm:e2e_request_latency_seconds", "0");
    assert_eq!(
        (e2e[0].1.as_str(), e2e[0].2),
        (&*format!("trace_id={}", "4b".repeat(16)), 0.9)
    );
    // Token-count histograms carry none.
    assert!(bucket_of("vllm:request_prompt_tokens", "0").is_empty());
    let success: Vec<_> = e
        .family("vllm:request_success")
        .unwrap()
        .samples
        .iter()
        .filter(|s| s.exemplar.is_some())
        .collect();
    assert_eq!(success.len(), 1);
    assert_eq!(success[0].labels["finished_reason"], "stop");
    assert_eq!(
        success[0].exemplar.as_ref().unwrap().labels["request_id"],
        "plain-2"
    );

    // Prometheus text 0.0.4 has no exemplars, whatever was recorded.
    let (_, text) = m.render(Format::Prometheus);
    assert!(
        parse(&text)
            .unwrap()
            .samples()
            .all(|s| s.exemplar.is_none())
    );
    assert!(
        !text.contains("plain-2") && !text.contains("4b4b"),
        "{text}"
    );
}
