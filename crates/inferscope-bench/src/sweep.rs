//! `bench sweep`: `serve` at several request rates or concurrency levels, a
//! table, and plots of throughput against TTFT and TPOT percentiles.

use crate::cli::SweepArgs;
use crate::error::BenchError;
use crate::html;
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
    let (head, body) = table_cells(rows);
    let mut s = String::new();
    let _ = writeln!(s, "| {} |", head.join(" | "));
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|---:|---|");
    for row in body {
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    s
}

/// The sweep table's header and rows, cell by cell (the Markdown table and
/// the HTML report show the same cells).
fn table_cells(rows: &[(Point, BenchmarkMetrics)]) -> (Vec<String>, Vec<Vec<String>>) {
    let head = [
        "point",
        "ok",
        "failed",
        "req/s",
        "out tok/s",
        "TTFT mean / median (ms)",
        "TTFT pct (ms)",
        "TPOT mean / median (ms)",
        "TPOT pct (ms)",
    ]
    .map(String::from)
    .to_vec();
    let body = rows
        .iter()
        .map(|(p, m)| {
            vec![
                p.label(),
                m.completed.to_string(),
                m.failed.to_string(),
                format!("{:.2}", m.request_throughput),
                format!("{:.2}", m.output_throughput),
                format!("{:.2} / {:.2}", m.ttft.mean_ms, m.ttft.median_ms),
                pcts(&m.ttft),
                format!("{:.2} / {:.2}", m.tpot.mean_ms, m.tpot.median_ms),
                pcts(&m.tpot),
            ]
        })
        .collect();
    (head, body)
}

/// The saturation point of a sweep (an estimate): the first point after which
/// output throughput grew by less than 5 %; `None` while it keeps growing.
pub fn saturation(rows: &[(Point, BenchmarkMetrics)]) -> Option<usize> {
    rows.windows(2)
        .position(|w| w[1].1.output_throughput < 1.05 * w[0].1.output_throughput)
}

/// Renders the HTML report of a sweep.
pub fn sweep_report(rows: &[(Point, BenchmarkMetrics)]) -> String {
    let mut s = String::new();
    html::open(&mut s, "inferscope bench sweep");
    s.push_str("<h2>Points</h2>\n<table>");
    let (head, body) = table_cells(rows);
    for (tag, row) in std::iter::once(("th", &head)).chain(body.iter().map(|r| ("td", r))) {
        s.push_str("<tr>");
        for cell in row {
            let _ = write!(s, "<{tag}>{}</{tag}>", html::esc(cell));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    let sat = saturation(rows).and_then(|i| rows.get(i));
    let marker = sat.map(|(p, m)| {
        (
            m.output_throughput,
            format!("saturation ≈ {} (estimate)", p.label()),
        )
    });
    match sat {
        Some((p, m)) => {
            let _ = writeln!(
                s,
                "<p><b>Saturation point (estimate): {}</b>, {} output tok/s — the first point after which output throughput grew by less than 5 %.</p>",
                html::esc(&p.label()),
                html::f2(m.output_throughput)
            );
        }
        None => s.push_str("<p><b>No saturation point</b>: output throughput grew by at least 5 % at every step.</p>\n"),
    }
    s.push_str("<h2>Latency against throughput</h2>\n<div class=\"charts\">\n");
    for (key, name, pick) in [
        ("ttft", "TTFT", (|m: &BenchmarkMetrics| &m.ttft) as Pick),
        ("tpot", "TPOT", |m: &BenchmarkMetrics| &m.tpot),
    ] {
        let mut c = chart(rows, name, pick);
        c.marker = marker.clone();
        html::chart(&mut s, &format!("sweep-{key}"), &c);
    }
    s.push_str("</div>\n</body></html>\n");
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
    if let Some(i) = saturation(&rows).and_then(|i| rows.get(i)) {
        println!(
            "Saturation point (estimate): {} — output throughput grew by less than 5 % after it",
            i.0.label()
        );
    }
    if let Some(path) = &args.serve.report_html {
        crate::serve::write_file(path, sweep_report(&rows).as_bytes())?;
        println!("HTML report written to {}", path.display());
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(tput: f64) -> BenchmarkMetrics {
        BenchmarkMetrics {
            output_throughput: tput,
            ..Default::default()
        }
    }

    #[test]
    fn saturation_is_where_throughput_stops_growing() {
        let rows = |t: &[f64]| {
            t.iter()
                .enumerate()
                .map(|(i, &x)| (Point::Concurrency(1 << i), at(x)))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            saturation(&rows(&[100.0, 190.0, 370.0, 380.0, 385.0])),
            Some(2)
        );
        assert_eq!(saturation(&rows(&[100.0, 200.0, 400.0])), None);
        assert_eq!(saturation(&rows(&[100.0])), None);
    }

    #[test]
    fn the_report_shows_the_tables_cells() {
        let rows = vec![(Point::Concurrency(4), at(123.456))];
        let r = sweep_report(&rows);
        assert!(r.contains("<th>point</th><th>ok</th>"), "{r}");
        assert!(r.contains("<td>123.46</td>"), "{r}");
        assert!(r.contains("No saturation point"), "{r}");
        let md = table(&rows);
        assert!(md.starts_with("| point | ok | failed |"), "{md}");
        assert!(md.contains("| 123.46 |"), "{md}");
    }
}
