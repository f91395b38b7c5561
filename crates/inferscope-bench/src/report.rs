//! The printed report, line for line as `vllm bench serve` prints it.

use crate::statistics::{BenchmarkMetrics, Metric, percentile_word};
use std::fmt::Write;

/// Run settings that appear in the report.
#[derive(Debug, Clone, Default)]
pub struct ReportContext {
    /// `--max-concurrency`, when set.
    pub max_concurrency: Option<usize>,
    /// `--request-rate` (infinite is not printed).
    pub request_rate: f64,
    /// Benchmark duration, seconds.
    pub duration_s: f64,
    /// Metrics chosen with `--percentile-metrics`.
    pub selected: Vec<Metric>,
}

/// One `label value` line: label left-justified to 40, value to 10.
pub fn line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{label:<40} {value:<10}");
}

/// A header line: the title centred in 50 columns of `fill`.
pub fn header(out: &mut String, title: &str, fill: char) {
    let _ = writeln!(out, "{}", center(title, 50, fill));
}

fn center(title: &str, width: usize, fill: char) -> String {
    let len = title.chars().count();
    if len >= width {
        return title.to_string();
    }
    let left = (width - len) / 2;
    let right = width - len - left;
    let f = fill.to_string();
    format!("{}{title}{}", f.repeat(left), f.repeat(right))
}

fn f2(x: f64) -> String {
    format!("{x:.2}")
}

/// Renders the report.
pub fn render(m: &BenchmarkMetrics, ctx: &ReportContext) -> String {
    let mut s = String::new();
    header(&mut s, " Serving Benchmark Result ", '=');
    line(&mut s, "Successful requests:", m.completed);
    line(&mut s, "Failed requests:", m.failed);
    if let Some(c) = ctx.max_concurrency {
        line(&mut s, "Maximum request concurrency:", c);
    }
    if ctx.request_rate.is_finite() {
        line(
            &mut s,
            "Request rate configured (RPS):",
            f2(ctx.request_rate),
        );
    }
    line(&mut s, "Benchmark duration (s):", f2(ctx.duration_s));
    line(&mut s, "Total input tokens:", m.total_input);
    line(&mut s, "Total generated tokens:", m.total_output);
    // vLLM's layout has no such line: it appears only when a count is not
    // exact, so an estimate is never read as a measurement.
    if !m.input_counted_by.is_exact() {
        line(&mut s, "Input tokens:", "estimated");
    }
    if !m.output_counted_by.is_exact() {
        line(&mut s, "Output tokens:", "estimated");
    }
    line(
        &mut s,
        "Request throughput (req/s):",
        f2(m.request_throughput),
    );
    if let Some(g) = m.request_goodput {
        line(&mut s, "Request goodput (req/s):", f2(g));
    }
    line(
        &mut s,
        "Output token throughput (tok/s):",
        f2(m.output_throughput),
    );
    line(
        &mut s,
        "Peak output token throughput (tok/s):",
        f2(m.max_output_tokens_per_s),
    );
    line(
        &mut s,
        "Peak concurrent requests:",
        f2(m.max_concurrent_requests),
    );
    line(
        &mut s,
        "Total token throughput (tok/s):",
        f2(m.total_token_throughput),
    );
    for metric in Metric::ALL {
        if !ctx.selected.contains(&metric) {
            continue;
        }
        let d = m.dist(metric);
        let name = metric.name();
        header(&mut s, metric.header(), '-');
        line(&mut s, &format!("Mean {name} (ms):"), f2(d.mean_ms));
        line(&mut s, &format!("Median {name} (ms):"), f2(d.median_ms));
        for (p, v) in &d.percentiles_ms {
            line(
                &mut s,
                &format!("P{} {name} (ms):", percentile_word(*p)),
                f2(*v),
            );
        }
    }
    let _ = writeln!(s, "{}", "=".repeat(50));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::CountedBy;
    use crate::statistics::Distribution;

    fn dist(base: f64) -> Distribution {
        Distribution {
            mean_ms: base,
            median_ms: base - 1.0,
            std_ms: 0.5,
            percentiles_ms: vec![(50.0, base - 1.0), (99.9, base * 2.0)],
        }
    }

    /// Golden test of the report text (trailing spaces come from the 10-column value field).
    #[test]
    fn golden_report() {
        let m = BenchmarkMetrics {
            completed: 32741,
            failed: 3,
            total_input: 7238749,
            total_output: 5967511,
            request_throughput: 50.2891,
            request_goodput: Some(48.0),
            output_throughput: 9165.574,
            total_token_throughput: 20283.644,
            max_output_tokens_per_s: 10240.0,
            max_concurrent_requests: 256.0,
            ttft: dist(120.0),
            tpot: dist(20.0),
            itl: dist(19.0),
            e2el: dist(3000.0),
            output_lens: vec![],
            input_counted_by: CountedBy::Usage,
            output_counted_by: CountedBy::Tokenizer,
        };
        let ctx = ReportContext {
            max_concurrency: Some(256),
            request_rate: 64.0,
            duration_s: 651.0849,
            selected: vec![Metric::E2el, Metric::Ttft, Metric::Itl],
        };
        let got = render(&m, &ctx);
        let want = include_str!("../tests/golden/report.txt");
        assert_eq!(got, want, "report drifted; got:\n{got}");
        for l in got.lines() {
            assert!(l.len() == 50 || l.len() == 51, "width of {l:?}");
        }
        // Infinite rate and no SLO: those lines disappear.
        let mut m2 = m.clone();
        m2.request_goodput = None;
        let ctx2 = ReportContext {
            max_concurrency: None,
            request_rate: f64::INFINITY,
            ..ctx.clone()
        };
        let got2 = render(&m2, &ctx2);
        assert!(!got2.contains("Request rate configured"));
        assert!(!got2.contains("goodput"));
        assert!(!got2.contains("Maximum request concurrency"));
        assert_eq!(got2.lines().count(), got.lines().count() - 3);
        // Estimated counts are said so, right under the totals.
        let mut m3 = m.clone();
        m3.input_counted_by = CountedBy::Estimate;
        let got3 = render(&m3, &ctx);
        let lines: Vec<&str> = got3.lines().collect();
        assert_eq!(
            lines[8],
            "Input tokens:                            estimated "
        );
        assert!(!got3.contains("Output tokens:"));
        m3.output_counted_by = CountedBy::Estimate;
        let got4 = render(&m3, &ctx);
        assert_eq!(
            got4.lines().nth(9),
            Some("Output tokens:                           estimated ")
        );
        assert_eq!(got4.lines().count(), got.lines().count() + 2);
    }
}
