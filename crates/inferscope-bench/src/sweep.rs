//! `bench sweep`: `serve` at several request rates or concurrency levels, a
//! table, and plots of throughput against TTFT and TPOT percentiles.

use crate::cli::SweepArgs;
use crate::error::BenchError;
use crate::plot::{self, Chart, Series};
use crate::result_json::rate_str;
use crate::serve::run_serve;
use crate::statistics::{BenchmarkMetrics, Distribution, percentile_word};
use serde_json::json;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// One sweep point's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Point {
    /// A request rate (req/s, may be infinite).
    Rate(f64),
    /// A concurrency cap.
    Concurrency(usize),
}

impl Point {
    /// Short label (`rate=4.0`, `conc=16`).
    pub fn label(self) -> String {
        match self {
            Point::Rate(r) => format!("rate={}", rate_str(r)),
            Point::Concurrency(c) => format!("conc={c}"),
        }
    }
}

/// The points from `--request-rates` or `--max-concurrencies` (exactly one).
pub fn points(args: &SweepArgs) -> Result<Vec<Point>, BenchError> {
    match (
        args.request_rates.is_empty(),
        args.max_concurrencies.is_empty(),
    ) {
        (false, true) => Ok(args.request_rates.iter().map(|&r| Point::Rate(r)).collect()),
        (true, false) => Ok(args
            .max_concurrencies
            .iter()
            .map(|&c| Point::Concurrency(c))
            .collect()),
        _ => Err(BenchError::InvalidArg(
            "give exactly one of --request-rates or --max-concurrencies".into(),
        )),
    }
}

fn pcts(d: &Distribution) -> String {
    d.percentiles_ms
        .iter()
        .map(|(p, v)| format!("P{} {v:.2}", percentile_word(*p)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The summary table.
pub fn table(rows: &[(Point, BenchmarkMetrics)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| point | ok | failed | req/s | out tok/s | TTFT mean / median (ms) | TTFT pct (ms) | TPOT mean / median (ms) | TPOT pct (ms) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|---:|---|");
    for (p, m) in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} / {:.2} | {} | {:.2} / {:.2} | {} |",
            p.label(),
            m.completed,
            m.failed,
            m.request_throughput,
            m.output_throughput,
            m.ttft.mean_ms,
            m.ttft.median_ms,
            pcts(&m.ttft),
            m.tpot.mean_ms,
            m.tpot.median_ms,
            pcts(&m.tpot),
        );
    }
    s
}

/// Chart of output throughput against a latency metric's median and percentiles.
pub fn chart(rows: &[(Point, BenchmarkMetrics)], name: &str, pick: Pick) -> Chart {
    // The median is drawn unless P50 is among the chosen percentiles already.
    let has_p50 = rows
        .first()
        .is_some_and(|(_, m)| pick(m).percentiles_ms.iter().any(|(p, _)| *p == 50.0));
    let mut series = Vec::new();
    if !has_p50 {
        series.push(Series {
            name: format!("median {name}"),
            points: rows
                .iter()
                .map(|(_, m)| (m.output_throughput, pick(m).median_ms))
                .collect(),
        });
    }
    let n_pct = rows
        .first()
        .map_or(0, |(_, m)| pick(m).percentiles_ms.len());
    for i in 0..n_pct {
        let label = rows
            .first()
            .and_then(|(_, m)| pick(m).percentiles_ms.get(i))
            .map_or(String::new(), |(p, _)| {
                format!("P{} {name}", percentile_word(*p))
            });
        series.push(Series {
            name: label,
            points: rows
                .iter()
                .filter_map(|(_, m)| {
                    pick(m)
                        .percentiles_ms
                        .get(i)
                        .map(|(_, v)| (m.output_throughput, *v))
                })
                .collect(),
        });
    }
    Chart {
        title: format!("{name} against output throughput"),
        x_label: "output token throughput (tok/s)".into(),
        y_label: format!("{name} (ms)"),
        series,
        ..Chart::default()
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), BenchError> {
    std::fs::write(path, bytes).map_err(|e| BenchError::io(path, e))
}

/// Picks one latency distribution out of a run's metrics.
pub type Pick = fn(&BenchmarkMetrics) -> &Distribution;

/// Writes `sweep_ttft.{svg,png}`, `sweep_tpot.{svg,png}` and `sweep.json` into `dir`.
pub fn write_outputs(
    dir: &Path,
    rows: &[(Point, BenchmarkMetrics)],
) -> Result<Vec<PathBuf>, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let mut written = Vec::new();
    let charts: [(&str, &str, Pick); 2] =
        [("ttft", "TTFT", |m| &m.ttft), ("tpot", "TPOT", |m| &m.tpot)];
    for (key, name, pick) in charts {
        let c = chart(rows, name, pick);
        let svg_path = dir.join(format!("sweep_{key}.svg"));
        write(&svg_path, plot::svg(&c).as_bytes())?;
        let png_path = dir.join(format!("sweep_{key}.png"));
        write(&png_path, &plot::png(&c)?)?;
        written.extend([svg_path, png_path]);
    }
    let points: Vec<_> = rows
        .iter()
        .map(|(p, m)| {
            json!({
                "point": p.label(),
                "request_rate": match p { Point::Rate(r) if r.is_finite() => json!(r), Point::Rate(_) => json!("inf"), Point::Concurrency(_) => json!(null) },
                "max_concurrency": match p { Point::Concurrency(c) => json!(c), Point::Rate(_) => json!(null) },
                "completed": m.completed,
                "failed": m.failed,
                "request_throughput": m.request_throughput,
                "output_throughput": m.output_throughput,
                "mean_ttft_ms": m.ttft.mean_ms,
                "median_ttft_ms": m.ttft.median_ms,
                "mean_tpot_ms": m.tpot.mean_ms,
                "median_tpot_ms": m.tpot.median_ms,
                "ttft_percentiles_ms": m.ttft.percentiles_ms,
                "tpot_percentiles_ms": m.tpot.percentiles_ms,
            })
        })
        .collect();
    let json_path = dir.join("sweep.json");
    let text = serde_json::to_string_pretty(&points).map_err(|source| BenchError::Json {
        context: "sweep".into(),
        source,
    })?;
    write(&json_path, text.as_bytes())?;
    written.push(json_path);
    Ok(written)
}

/// Runs `bench sweep`.
pub async fn run(args: &SweepArgs) -> Result<Vec<(Point, BenchmarkMetrics)>, BenchError> {
    let mut rows = Vec::new();
    for p in points(args)? {
        let mut serve = args.serve.clone();
        // The sweep writes one report of its own, not one per point.
        serve.report_html = None;
        match p {
            Point::Rate(r) => serve.request_rate = r,
            Point::Concurrency(c) => serve.max_concurrency = Some(c),
        }
        if let Some(name) = &args.serve.result_filename {
            let stem = name.strip_suffix(".json").unwrap_or(name);
            serve.result_filename = Some(format!("{stem}-{}.json", p.label().replace('=', "")));
        }
        println!("\n### Sweep point {}", p.label());
        let outcome = run_serve(&serve).await?;
        rows.push((p, outcome.metrics));
    }
    let table_md = table(&rows);
    println!("\n{table_md}");
    let dir = args
        .plot_dir
        .clone()
        .or_else(|| args.serve.result_dir.clone())
        .unwrap_or_else(|| PathBuf::from("."));
    for path in write_outputs(&dir, &rows)? {
        println!("Wrote {}", path.display());
    }
    if let Some(i) = crate::html::saturation(&rows).and_then(|i| rows.get(i)) {
        println!(
            "Saturation point (estimate): {} — output throughput grew by less than 5 % after it",
            i.0.label()
        );
    }
    if let Some(path) = &args.serve.report_html {
        crate::serve::write_file(path, crate::html::sweep_report(&rows, &table_md).as_bytes())?;
        println!("HTML report written to {}", path.display());
    }
    Ok(rows)
}
