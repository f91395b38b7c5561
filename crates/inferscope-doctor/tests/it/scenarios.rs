//! Scenario tests: drive an in-process server (sim executor) into each
//! condition and check that the doctor ranks the expected finding first,
//! with its evidence. Timings are never asserted exactly: the machine may be
//! loaded, so figures are checked for presence and plausibility.

use crate::common;

use common::{Load, SERIAL, Shape, WARMUP, doctor, evidence, first, scenario};
use inferscope_doctor::findings::Severity;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const WINDOW: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_num_seqs_1_is_queue_bound() {
    let run = scenario(
        &[
            "--sim-profile",
            "tiny,t_weights_ms=5",
            "--max-num-seqs",
            "1",
        ],
        6,
        Shape {
            prompt_len: 24,
            max_tokens: 8,
            guided_regex: None,
        },
        WINDOW,
    )
    .await;
    let r = run.report;
    let f = first(&r);
    assert_eq!(f.id, "queue_bound");
    assert!(f.severity >= Severity::Warning);
    assert!(evidence(f, "queue_share_of_e2e") >= 0.3);
    assert!(evidence(f, "queue_time_mean") > 0.0);
    assert_eq!(evidence(f, "running_peak_per_engine"), 1.0);
    assert!(evidence(f, "kv_usage_peak") < 0.8);
    assert!(f.action.contains("--max-num-seqs"), "{}", f.action);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_kv_storage_preempts() {
    let run = scenario(
        &[
            "--sim-profile",
            "tiny,t_weights_ms=2,kv_tokens=2000",
            "--max-model-len",
            "1024",
        ],
        8,
        Shape {
            prompt_len: 100,
            max_tokens: 300,
            guided_regex: None,
        },
        WINDOW,
    )
    .await;
    let r = run.report;
    let f = first(&r);
    assert_eq!(f.id, "kv_saturated");
    assert!(evidence(f, "preemptions") >= 1.0);
    assert!(evidence(f, "kv_usage_peak") > 0.8);
    // 2000 tokens in blocks of 16.
    assert_eq!(evidence(f, "num_gpu_blocks"), 125.0);
    assert!(f.action.contains("--max-model-len"), "{}", f.action);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instant_device_is_host_bound() {
    // A device that takes no time: every step is host work.
    // Many long generations keep the batch full, so the engine loop never
    // idles and each step's host work grows with the batch; 24 × 2016 tokens
    // stay within the 65536-token KV pool, so nothing is preempted.
    let run = scenario(
        &[
            "--sim-profile",
            "tiny,t_fixed_ms=0,t_prefill_us=0,t_weights_ms=0,t_kv_ns=0",
        ],
        24,
        Shape {
            prompt_len: 16,
            max_tokens: 2000,
            guided_regex: None,
        },
        WINDOW,
    )
    .await;
    let r = run.report;
    let f = first(&r);
    assert_eq!(f.id, "host_bound");
    assert!(evidence(f, "device_utilisation") < 0.5);
    assert!(evidence(f, "engine_idle_fraction") <= 0.2);
    assert!(evidence(f, "dominant_phase_fraction") > 0.0);
    assert!(
        ["schedule", "execute", "postprocess"]
            .iter()
            .any(|p| f.title.contains(&format!("mostly in {p}"))),
        "{}",
        f.title
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_grammar_masks_hold_the_device_back() {
    // A fast device (0.4 ms per step) and 32 sequences whose masks are
    // computed one after another (one grammar thread): the masks of a step
    // take longer than the step, so the device waits for them. Long outputs
    // keep requests (and their grammar compilations) few, so admission does
    // not queue.
    let run = scenario(
        &[
            "--sim-profile",
            "tiny,t_fixed_ms=0.1,t_prefill_us=0,t_weights_ms=0.3,t_kv_ns=0",
            "--grammar-threads",
            "1",
        ],
        32,
        Shape {
            prompt_len: 16,
            max_tokens: 400,
            guided_regex: Some("[a-z ]{400}"),
        },
        WINDOW,
    )
    .await;
    assert_eq!(run.counts[2], 0, "every constrained request succeeds");
    let r = run.report;
    let f = first(&r);
    assert_eq!(f.id, "grammar_masks");
    assert!(evidence(f, "device_utilisation") < 0.95);
    assert!(evidence(f, "mask_to_device_step_ratio") >= 0.5);
    assert!(evidence(f, "grammar_mask_per_step") > 0.0);
    assert!(evidence(f, "constrained_step_fraction") > 0.5);
    assert!(f.action.contains("--grammar-threads"), "{}", f.action);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_and_short_requests_unbalance_engines() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(&[
        "--sim-profile",
        "tiny,t_weights_ms=2",
        "--data-parallel-size",
        "2",
    ])
    .await;
    // The router picks the least-loaded engine by request count, ties to the
    // lowest rank. Sending a long request while both are idle, then a short
    // one while the long one is queued, puts every long request on engine 0
    // and every short one on engine 1: equal counts, very unequal work.
    let addr = srv.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let task = tokio::spawn(async move {
        let c = common::client();
        let mut n = 0;
        while !s.load(Ordering::Relaxed) {
            n += 1;
            // Let the engines publish that the last pair finished, so that
            // both count as idle and the tie goes to engine 0.
            tokio::time::sleep(Duration::from_millis(30)).await;
            let long_prompt = common::prompt(&format!("long{n}"), 16);
            let long = common::complete(&c, addr, &long_prompt, 150);
            let short = async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                common::complete(&c, addr, &common::prompt(&format!("short{n}"), 16), 2).await
            };
            let _ = tokio::join!(long, short);
        }
    });
    let load = Load::from_task(stop, task);
    let r = doctor(srv.addr, WARMUP, WINDOW).await;
    load.stop().await;
    srv.shutdown(Duration::from_secs(5)).await;
    let f = first(&r);
    assert_eq!(f.id, "dp_imbalance");
    assert!(evidence(f, "max_over_mean") >= 1.5);
    let (e0, e1) = (
        evidence(f, "device_utilisation_engine_0"),
        evidence(f, "device_utilisation_engine_1"),
    );
    assert!(e0 > e1 * 2.0, "engine 0 {e0} vs engine 1 {e1}");
    assert!(f.title.contains("engine 0"), "{}", f.title);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_dominate_ttft() {
    // 300 µs per prompt token and a 256-token prefill budget: a 1000-token
    // prompt needs four steps and about 0.3 s of prefill.
    // One client: nothing queues, so the first token waits only for prefill.
    let run = scenario(
        &[
            "--sim-profile",
            "tiny,t_prefill_us=300,t_weights_ms=1",
            "--max-num-batched-tokens",
            "256",
        ],
        1,
        Shape {
            prompt_len: 1000,
            max_tokens: 4,
            guided_regex: None,
        },
        Duration::from_secs(2),
    )
    .await;
    let r = run.report;
    let f = first(&r);
    assert_eq!(f.id, "long_prompts");
    assert!(evidence(f, "prefill_share_of_ttft") >= 0.5);
    assert!(evidence(f, "ttft_mean") >= 0.2);
    let mean_prompt = evidence(f, "prompt_tokens_mean");
    assert!((900.0..=1100.0).contains(&mean_prompt), "{mean_prompt}");
    assert!(
        f.action.contains("--max-num-batched-tokens"),
        "{}",
        f.action
    );
    // Distinct long prompts also make the prefix cache useless: ranked lower.
    assert!(r.diagnosis.findings.iter().any(|f| f.id == "prefix_cache"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_long_prompts_miss_the_prefix_cache() {
    // Slow decode steps keep the device busy, so only the cache is remarkable.
    let run = scenario(
        &["--sim-profile", "tiny,t_weights_ms=4"],
        2,
        Shape {
            prompt_len: 600,
            max_tokens: 4,
            guided_regex: None,
        },
        WINDOW,
    )
    .await;
    let r = run.report;
    let f = first(&r);
    assert_eq!(f.id, "prefix_cache");
    assert_eq!(f.severity, Severity::Info);
    assert!(evidence(f, "prefix_hit_rate") < 0.1);
    assert!(evidence(f, "prefix_cache_queries") > 0.0);
    assert!(evidence(f, "prompt_tokens_mean") >= 256.0);
    // Read from prompt_tokens_by_source: the prefill the cache saved.
    assert!(evidence(f, "prompt_tokens_from_cache_share") < 0.1);
    assert!(evidence(f, "prompt_tokens_computed") >= 600.0);
    assert!(f.title.contains("of prompt tokens"), "{}", f.title);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_rejects_at_admission() {
    let run = scenario(
        &[
            "--sim-profile",
            "tiny,t_weights_ms=5",
            "--max-num-seqs",
            "1",
            "--max-waiting-requests",
            "1",
        ],
        6,
        Shape {
            prompt_len: 24,
            max_tokens: 8,
            guided_regex: None,
        },
        WINDOW,
    )
    .await;
    let r = run.report;
    let rejected = run.counts[1];
    assert!(rejected > 0, "the load saw no 429");
    let f = first(&r);
    assert_eq!(f.id, "admission_rejections");
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(r.exit_code(), 2);
    assert!(evidence(f, "admission_rejections") >= 1.0);
    assert!(evidence(f, "failure_share") >= 0.05);
}

/// The engine dies part-way through the window: no failures early, every
/// request failing late, so the error finding says the rate is rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_dying_mid_window_is_a_rising_error_rate() {
    // Steps last at least 5 ms (the weights' time), so 240 steps end no
    // sooner than 1.2 s into the load: past the point (warm-up + window/6)
    // after which the late half has 1.5× the early half's failures, for
    // any step time up to ~14 ms.
    let window = Duration::from_secs(3);
    let run = scenario(
        &[
            "--sim-profile",
            "tiny,t_weights_ms=5",
            "--sim-die-after-steps",
            "240",
        ],
        4,
        Shape {
            prompt_len: 24,
            max_tokens: 8,
            guided_regex: None,
        },
        window,
    )
    .await;
    let r = run.report;
    let (ok, failed) = (run.counts[0], run.counts[2]);
    assert!(ok > 0 && failed > 0, "{ok} succeeded, {failed} failed");
    let f = first(&r);
    assert_eq!(f.id, "errors");
    assert_eq!(f.severity, Severity::Critical);
    assert!(f.title.contains("rising"), "{}", f.title);
    let (early, late) = (
        evidence(f, "failures_early_half"),
        evidence(f, "failures_late_half"),
    );
    assert!(late > early * 1.5, "early {early}, late {late}");
    assert_eq!(r.exit_code(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn light_load_is_healthy() {
    let run = scenario(
        &["--sim-profile", "tiny,t_weights_ms=2"],
        2,
        Shape {
            prompt_len: 32,
            max_tokens: 16,
            guided_regex: None,
        },
        WINDOW,
    )
    .await;
    let r = run.report;
    let f = first(&r);
    assert_eq!(f.id, "healthy");
    assert_eq!(r.diagnosis.findings.len(), 1);
    assert_eq!(r.exit_code(), 0);
    assert!(evidence(f, "requests_per_s") > 0.0);
    let headroom = evidence(f, "kv_headroom");
    assert!(headroom > 0.5 && headroom <= 1.0, "{headroom}");
    assert!(f.title.contains("KV cache peaked at"), "{}", f.title);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_namespace_is_detected_and_run_doctor_exits_zero_when_healthy() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(&[
        "--sim-profile",
        "tiny,t_weights_ms=2",
        "--metrics-namespace",
        "vllm",
    ])
    .await;
    let load = Load::start(
        srv.addr,
        2,
        Shape {
            prompt_len: 32,
            max_tokens: 16,
            guided_regex: None,
        },
    );
    tokio::time::sleep(WARMUP).await;
    let args = inferscope_doctor::DoctorArgs {
        url: format!("http://{}", srv.addr),
        window: Duration::from_millis(800),
        prometheus: None,
        selector: String::new(),
        metrics_namespace: None,
        json: true,
    };
    let code = inferscope_doctor::run_doctor(args)
        .await
        .expect("doctor runs");
    let w = inferscope_doctor::collect(
        &format!("http://{}/metrics", srv.addr),
        Duration::from_millis(500),
        None,
    )
    .await
    .expect("collect");
    load.stop().await;
    srv.shutdown(Duration::from_secs(5)).await;
    assert_eq!(code, 0);
    assert_eq!(w.namespace, "vllm");
    let s = w.summary();
    assert!(s.generation_tokens_per_s.unwrap_or(0.0) > 0.0, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_an_error_not_a_panic() {
    // Port 9 (discard) on localhost is closed in test environments.
    let r = inferscope_doctor::collect(
        "http://127.0.0.1:9/metrics",
        Duration::from_millis(100),
        None,
    )
    .await;
    assert!(r.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_namespace_is_an_error() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(&["--sim-profile", "tiny"]).await;
    let args = inferscope_doctor::DoctorArgs {
        url: format!("http://{}", srv.addr),
        window: Duration::from_millis(100),
        prometheus: None,
        selector: String::new(),
        metrics_namespace: Some("sglang".into()),
        json: true,
    };
    let r = inferscope_doctor::run_doctor(args).await;
    srv.shutdown(Duration::from_secs(5)).await;
    let e = r.expect_err("no sglang: metrics");
    assert!(format!("{e:#}").contains("no `sglang_` metrics"), "{e:#}");
}
