//! `--report-html`: one self-contained HTML file (inline CSS and inline SVG
//! charts from [`crate::plot`], no script, nothing fetched when it is viewed).
//!
//! Every number shown is measured by the client, or read from the server's
//! `/metrics` and labelled so (histogram quantiles are shown as their bucket).

use crate::client::RequestOutput;
use crate::plot::{self, Chart, Series};
use crate::server_view::ServerSeries;
use crate::statistics::{BenchmarkMetrics, Distribution, Metric, percentile_word};
use crate::timeline::{ClientSeries, Slice};
use std::fmt::Write;

const STYLE: &str = "body{font-family:'DejaVu Sans',sans-serif;margin:2em auto;max-width:1700px;color:#222;padding:0 1em}\
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}\
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:.85em}\
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(500px,1fr));gap:1em}\
figure.chart{margin:0}figure.chart svg{width:100%;height:auto;border:1px solid #ddd}\
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}\
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}.note{color:#555;font-size:.9em}";

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(crate) fn open(s: &mut String, title: &str) {
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title><style>{STYLE}</style></head><body>\n<h1>{0}</h1>\n",
        esc(title)
    );
}

/// A chart when it has data to draw, else a note saying there is none (so
/// every chart element in the page drew something).
pub(crate) fn chart(s: &mut String, id: &str, c: &Chart) {
    let has_data = c
        .series
        .iter()
        .any(|x| x.points.iter().any(|(a, b)| a.is_finite() && b.is_finite()));
    // A series of one point draws no line: show the points then.
    let sparse = c.series.iter().all(|x| x.points.len() < 2);
    if has_data {
        let mut c = c.clone();
        c.lines_only &= !sparse;
        let c = &c;
        let _ = writeln!(
            s,
            "<figure class=\"chart\" data-chart=\"{}\">{}</figure>",
            esc(id),
            plot::svg(c)
        );
    } else {
        let _ = writeln!(
            s,
            "<p class=\"note\">{}: no data in this run.</p>",
            esc(&c.title)
        );
    }
}

/// Points of an empirical CDF (x in ms), at most about 400 of them.
pub fn cdf_ms(values_s: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values_s.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(400).max(1);
    let mut pts: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (v[i] * 1000.0, (i + 1) as f64 / n as f64))
        .collect();
    if !(n - 1).is_multiple_of(step) {
        pts.push((v[n - 1] * 1000.0, 1.0));
    }
    pts
}

/// The raw per-request samples behind TTFT, TPOT, ITL and E2E (seconds).
fn samples(outputs: &[RequestOutput], m: &BenchmarkMetrics) -> [(Metric, Vec<f64>); 4] {
    let ok = || outputs.iter().filter(|o| o.success);
    let tpot = outputs
        .iter()
        .zip(&m.output_lens)
        .filter(|(o, n)| o.success && **n > 1)
        .map(|(o, n)| (o.latency - o.ttft) / (*n - 1) as f64)
        .collect();
    [
        (Metric::Ttft, ok().map(|o| o.ttft).collect()),
        (Metric::Tpot, tpot),
        (
            Metric::Itl,
            ok().flat_map(|o| o.itl.iter().copied()).collect(),
        ),
        (Metric::E2el, ok().map(|o| o.latency).collect()),
    ]
}

fn series(name: &str, points: Vec<(f64, f64)>) -> Series {
    Series {
        name: name.to_string(),
        points,
    }
}

fn time_chart(title: &str, y_label: &str, x_max: f64, s: Vec<Series>) -> Chart {
    Chart {
        title: title.to_string(),
        x_label: "time since the start of the run (s)".into(),
        y_label: y_label.to_string(),
        series: s,
        lines_only: true,
        x_max: Some(x_max),
        ..Chart::default()
    }
}

pub(crate) fn f2(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "n/a".into()
    }
}

fn dist_cells(d: &Distribution, pct: f64) -> String {
    let p = d
        .percentiles_ms
        .iter()
        .find(|(q, _)| *q == pct)
        .map_or("n/a".to_string(), |(_, v)| f2(*v));
    format!(
        "<td>{}</td><td>{}</td><td>{p}</td>",
        f2(d.mean_ms),
        f2(d.median_ms)
    )
}

/// The per-window table (`--slice-duration`).
fn slices_table(s: &mut String, slices: &[Slice], pct: f64) {
    let pw = percentile_word(pct);
    let _ = write!(
        s,
        "<table class=\"slices\"><tr><th>window (s)</th><th>completed</th><th>failed</th><th>req/s</th><th>output tok/s</th>"
    );
    for name in ["TTFT", "TPOT", "ITL", "E2E"] {
        let _ = write!(
            s,
            "<th>{name} mean (ms)</th><th>{name} median (ms)</th><th>{name} P{pw} (ms)</th>"
        );
    }
    s.push_str("</tr>\n");
    for w in slices {
        let m = &w.metrics;
        let _ = write!(
            s,
            "<tr><td>{:.1} – {:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            w.start_s,
            w.end_s,
            m.completed,
            m.failed,
            f2(m.request_throughput),
            f2(m.output_throughput)
        );
        for d in [&m.ttft, &m.tpot, &m.itl, &m.e2el] {
            s.push_str(&dist_cells(d, pct));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
}

/// Everything the report of one `bench serve` run shows.
pub struct ServeReport<'a> {
    /// Page title.
    pub title: String,
    /// Settings shown under the title (`name`, `value`).
    pub settings: Vec<(String, String)>,
    /// The printed vLLM-style report.
    pub summary_text: &'a str,
    /// The figures.
    pub metrics: &'a BenchmarkMetrics,
    /// Per-request measurements.
    pub outputs: &'a [RequestOutput],
    /// Run duration, seconds.
    pub duration_s: f64,
    /// The client's series over the run.
    pub client: &'a ClientSeries,
    /// The server's series and its printed agreement table (`--scrape-metrics`).
    pub server: Option<(&'a ServerSeries, &'a str)>,
    /// The windows (`--slice-duration`) and their length.
    pub slices: Option<(&'a [Slice], f64)>,
    /// The percentile shown in tables (the highest of `--metric-percentiles`).
    pub percentile: f64,
}

/// Renders the report of one run.
pub fn serve_report(r: &ServeReport<'_>) -> String {
    let mut s = String::new();
    open(&mut s, &r.title);
    s.push_str("<table class=\"settings\">");
    for (k, v) in &r.settings {
        let _ = write!(s, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    s.push_str("</table>\n<h2>Summary</h2>\n<p class=\"note\">As printed by the run (the layout of <code>vllm bench serve</code>); measured by the client.</p>\n");
    let _ = writeln!(s, "<pre>{}</pre>", esc(r.summary_text));

    s.push_str("<h2>Latency distributions</h2>\n<p class=\"note\">Empirical CDFs of every measured value (client side).</p>\n<div class=\"charts\">\n");
    for (metric, values) in samples(r.outputs, r.metrics) {
        let name = metric.name();
        let c = Chart {
            title: format!("{name} distribution (CDF)"),
            x_label: format!("{name} (ms)"),
            y_label: "fraction of values ≤ x".into(),
            series: vec![series(name, cdf_ms(&values))],
            lines_only: true,
            ..Chart::default()
        };
        chart(&mut s, &format!("cdf-{}", metric.key()), &c);
    }
    s.push_str("</div>\n");

    let cs = r.client;
    let x_max = cs
        .in_flight
        .last()
        .map_or(r.duration_s, |p| p.0)
        .max(r.duration_s);
    s.push_str("<h2>Over the run</h2>\n<div class=\"charts\">\n");
    let bin = format!("{} s bins", cs.bin_s);
    chart(
        &mut s,
        "in-flight",
        &time_chart(
            "Requests in flight (client)",
            "requests",
            x_max,
            vec![series("in flight", cs.in_flight.clone())],
        ),
    );
    chart(
        &mut s,
        "output-tps",
        &time_chart(
            &format!("Output tokens per second (client, {bin})"),
            "tokens/s",
            x_max,
            vec![series("output tok/s", cs.output_tps.clone())],
        ),
    );
    chart(
        &mut s,
        "ttft-by-arrival",
        &time_chart(
            &format!("TTFT by time of sending ({bin})"),
            "TTFT (ms)",
            x_max,
            vec![
                series("mean", cs.ttft_mean_ms.clone()),
                series("max", cs.ttft_max_ms.clone()),
            ],
        ),
    );
    s.push_str("</div>\n");

    if let Some((ss, agreement)) = r.server {
        s.push_str("<h2>Server side (<code>/metrics</code>)</h2>\n<p class=\"note\">Gauges sampled during the run, on the same time axis; device utilisation from the busy-time counter between samples (the counter moves when a step ends, so a step's time past the end of the interval it ended in is moved back to the intervals where it ran: no interval reads above 100 %).</p>\n<div class=\"charts\">\n");
        chart(
            &mut s,
            "server-queue",
            &time_chart(
                "Server requests running and waiting",
                "requests",
                x_max,
                vec![
                    series("running", ss.running.clone()),
                    series("waiting", ss.waiting.clone()),
                ],
            ),
        );
        chart(
            &mut s,
            "server-kv",
            &time_chart(
                "Server KV-cache usage (highest engine)",
                "KV-cache usage (%)",
                x_max,
                vec![series("KV usage", ss.kv_usage_pct.clone())],
            ),
        );
        chart(
            &mut s,
            "server-device",
            &time_chart(
                "Server device utilisation (mean over engines)",
                "utilisation (%)",
                x_max,
                vec![series("device busy", ss.device_util_pct.clone())],
            ),
        );
        chart(
            &mut s,
            "server-preemptions",
            &time_chart(
                "Server preemptions since the start",
                "preemptions",
                x_max,
                vec![series("preemptions", ss.preemptions.clone())],
            ),
        );
        s.push_str("</div>\n<h3>Client / server agreement</h3>\n");
        let _ = writeln!(s, "<pre>{}</pre>", esc(agreement));
    }

    if let Some((slices, len)) = r.slices {
        let _ = writeln!(
            s,
            "<h2>Time slices ({len} s)</h2>\n<p class=\"note\">Each request counts in the window of its send time; throughputs are its window's tokens (requests) over the window's length.</p>"
        );
        slices_table(&mut s, slices, r.percentile);
        let mid = |w: &Slice| (w.start_s + w.end_s) / 2.0;
        let pts = |f: &dyn Fn(&BenchmarkMetrics) -> f64| {
            slices
                .iter()
                .map(|w| (mid(w), f(&w.metrics)))
                .collect::<Vec<_>>()
        };
        s.push_str("<div class=\"charts\">\n");
        chart(
            &mut s,
            "slices-latency",
            &time_chart(
                "Median latencies per window",
                "latency (ms)",
                x_max,
                vec![
                    series("TTFT", pts(&|m| m.ttft.median_ms)),
                    series("TPOT", pts(&|m| m.tpot.median_ms)),
                    series("ITL", pts(&|m| m.itl.median_ms)),
                ],
            ),
        );
        chart(
            &mut s,
            "slices-throughput",
            &time_chart(
                "Output throughput per window",
                "tokens/s",
                x_max,
                vec![series("output tok/s", pts(&|m| m.output_throughput))],
            ),
        );
        s.push_str("</div>\n");
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_is_monotone_and_ends_at_one() {
        let v: Vec<f64> = (0..1000).rev().map(|i| f64::from(i) / 1000.0).collect();
        let c = cdf_ms(&v);
        assert!(c.len() <= 402, "{}", c.len());
        assert_eq!(c.first(), Some(&(0.0, 0.001)));
        assert_eq!(c.last(), Some(&(999.0, 1.0)));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert!(cdf_ms(&[]).is_empty());
    }

    #[test]
    fn a_chart_without_data_becomes_a_note() {
        let mut s = String::new();
        chart(
            &mut s,
            "x",
            &Chart {
                title: "Empty <one>".into(),
                series: vec![series("a", vec![])],
                ..Chart::default()
            },
        );
        assert_eq!(
            s,
            "<p class=\"note\">Empty &lt;one&gt;: no data in this run.</p>\n"
        );
    }
}
