//! Latency accuracy against the mock server (TTFT 50 ms, 10 ms between
//! tokens). Its own test binary (not in `it`), so no other test competes
//! for the CPU; two
//! requests in flight at a time; medians with tolerances of a few ms.

use inferscope_bench::mock::{MockConfig, MockServer};
use inferscope_bench::serve::run_serve;
use std::time::Duration;

#[path = "it/common/mod.rs"]
mod common;

use common::args;

/// `Err` with a message when `got` is not within `tol` of `want`.
fn within(got: f64, want: f64, tol: f64, what: &str) -> Result<(), String> {
    if (got - want).abs() <= tol {
        Ok(())
    } else {
        Err(format!("{what}: got {got:.2} ms, want {want} ± {tol} ms"))
    }
}

/// One run; counts are asserted, timing errors returned.
async fn measure(usage: bool, backend: &str) -> Result<(), String> {
    let mock = MockServer::start(MockConfig {
        ttft: Duration::from_millis(50),
        itl: Duration::from_millis(10),
        send_usage: usage,
        ..Default::default()
    })
    .await
    .expect("mock starts");
    let a = args(
        &mock.base_url(),
        &[
            "--backend",
            backend,
            "--num-prompts",
            "8",
            "--max-concurrency",
            "2",
            "--random-input-len",
            "32",
            "--random-output-len",
            "10",
            "--ignore-eos",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
        ],
    );
    let out = run_serve(&a).await.expect("run succeeds");
    let m = &out.metrics;
    assert_eq!((m.completed, m.failed), (8, 0));
    assert_eq!(m.total_output, 80, "usage={usage}");
    assert_eq!(m.total_input, 8 * 32);
    assert_eq!(m.output_lens, vec![10; 8]);
    assert_eq!(m.max_concurrent_requests, 2.0);
    assert_eq!(mock.requests(), 9, "initial test + 8");
    within(m.ttft.median_ms, 50.0, 8.0, "median TTFT")?;
    within(m.tpot.median_ms, 10.0, 2.0, "median TPOT")?;
    within(m.itl.median_ms, 10.0, 3.0, "median ITL")?;
    within(m.itl.mean_ms, 10.0, 2.0, "mean ITL")?;
    within(m.e2el.median_ms, 140.0, 10.0, "median E2EL")?;
    Ok(())
}

/// TTFT 50 ms, ITL 10 ms, 10 tokens: medians within a few ms, counts exact.
/// On a machine loaded by other processes a wake-up can be late by tens of
/// milliseconds, so each case gets up to three tries; a systematic error
/// fails all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latencies_match_configured_delays() {
    for (usage, backend) in [(true, "openai"), (false, "openai-chat")] {
        let mut errors = Vec::new();
        for _ in 0..3 {
            match measure(usage, backend).await {
                Ok(()) => break,
                Err(e) => errors.push(e),
            }
        }
        assert!(errors.len() < 3, "{backend}: {errors:?}");
    }
}
