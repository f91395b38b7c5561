//! `--report-html` and `--slice-duration` end to end against the mock server:
//! the report holds every section and chart, the JSON holds the windows.

use clap::Parser;
use inferscope_bench::mock::{MockConfig, MockServer};
use inferscope_bench::serve::run_serve;
use std::time::Duration;

use crate::common;

use common::args;

/// Every chart of the page drew at least one line with points.
fn charts_with_points(page: &str) -> Vec<String> {
    page.split("<figure class=\"chart\" data-chart=\"")
        .skip(1)
        .filter(|f| {
            let fig = f.split("</figure>").next().unwrap_or("");
            fig.contains("<polyline") && !fig.contains("points=\"\"")
        })
        .map(|f| f.split('"').next().unwrap_or("").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_writes_a_report_and_slices() {
    let mock = MockServer::start(MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(5),
        metrics_namespace: Some("inferscope".into()),
        ..Default::default()
    })
    .await
    .expect("mock starts");
    let dir = std::env::temp_dir().join(format!("isb-report-{}", std::process::id()));
    let html = dir.join("sub").join("report.html");
    let a = args(
        &mock.base_url(),
        &[
            "--num-prompts",
            "20",
            "--request-rate",
            "100",
            "--random-input-len",
            "8",
            "--random-output-len",
            "4",
            "--scrape-metrics",
            "--scrape-interval",
            "0.02",
            "--slice-duration",
            "0.05",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--save-result",
            "--result-dir",
            dir.to_str().expect("utf-8 path"),
            "--result-filename",
            "r.json",
            "--report-html",
            html.to_str().expect("utf-8 path"),
        ],
    );
    let out = run_serve(&a).await.expect("run succeeds");
    assert!(out.slices.len() >= 2, "{} windows", out.slices.len());
    let per_window: usize = out.slices.iter().map(|w| w.metrics.completed).sum();
    assert_eq!(per_window, 20);

    let saved = std::fs::read_to_string(dir.join("r.json")).expect("result file");
    let json: serde_json::Value = serde_json::from_str(&saved).expect("valid JSON");
    let slices = json["slices"].as_array().expect("slices array");
    assert_eq!(slices.len(), out.slices.len());
    assert_eq!(json["slice_duration"], 0.05);
    assert_eq!(slices[0]["start_s"], 0.0);
    assert!(slices[0]["median_ttft_ms"].is_number());
    assert!(slices[0]["output_throughput"].is_number());
    let total: u64 = slices.iter().filter_map(|w| w["completed"].as_u64()).sum();
    assert_eq!(total, 20);

    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(page.starts_with("<!DOCTYPE html>"));
    // Self-contained: nothing to fetch when it is viewed.
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"));
    assert!(page.contains("Serving Benchmark Result"));
    assert!(page.contains("Server-side View"));
    assert!(page.contains("Time slices (0.05 s)"));
    let drawn = charts_with_points(&page);
    for id in [
        "cdf-ttft",
        "cdf-tpot",
        "cdf-itl",
        "cdf-e2el",
        "in-flight",
        "output-tps",
        "ttft-by-arrival",
        "server-queue",
        "server-kv",
        "slices-latency",
        "slices-throughput",
    ] {
        assert!(drawn.iter().any(|d| d == id), "{id} not drawn: {drawn:?}");
    }
}

#[derive(Parser)]
struct SweepCli {
    #[command(flatten)]
    args: inferscope_bench::SweepArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_writes_one_report() {
    let mock = MockServer::start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        ..Default::default()
    })
    .await
    .expect("mock starts");
    let dir = std::env::temp_dir().join(format!("isb-sweep-report-{}", std::process::id()));
    let html = dir.join("sweep.html");
    let base = mock.base_url();
    let argv = [
        "sweep",
        "--base-url",
        &base,
        "--model",
        "m",
        "--disable-tqdm",
        "--num-prompts",
        "4",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--max-concurrencies",
        "1,2",
        "--plot-dir",
        dir.to_str().expect("utf-8 path"),
        "--report-html",
        html.to_str().expect("utf-8 path"),
    ];
    let args = SweepCli::try_parse_from(argv)
        .expect("valid arguments")
        .args;
    inferscope_bench::sweep::run(&args)
        .await
        .expect("sweep runs");
    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(page.contains("<td>conc=1</td>") && page.contains("<td>conc=2</td>"));
    assert!(page.contains("aturation point"));
    let drawn = charts_with_points(&page);
    assert_eq!(drawn, vec!["sweep-ttft", "sweep-tpot"]);
    // The points wrote no report of their own.
    let htmls = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "html"))
        .count();
    assert_eq!(htmls, 1);
}
