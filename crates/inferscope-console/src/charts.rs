//! The console's line charts — tokens/s, requests/s by finish reason, and
//! each latency's p50/p99 bucket bound over time — drawn on the server from
//! the history by `inferscope_charts`, the code the bench's report draws
//! with, so both look alike. Drawn once per request of the charts route
//! (docs/console.md), never per sample or per token.

use std::sync::Arc;

use inferscope_charts::{Chart, Series, svg};
use inferscope_metrics::{EngineReading, LATENCIES, Latency};
use inferscope_schema::FinishReason;
use inferscope_schema::scrape::Histogram;
use serde_json::{Map, Value, json};

use super::Serving;
use super::history::Sample;

/// Samples back of the window each quantile over time is taken over.
pub const QUANTILE_WINDOW: usize = 10;

/// Each chart's size: the SVG scales to its box, so this fixes the text's
/// size relative to the chart (readable from a phone to a wide screen).
const SIZE: (u32, u32) = (480, 300);

/// A duration in seconds as the page writes it (`12 ms`, `1.50 s`).
pub fn secs(s: f64) -> String {
    if !s.is_finite() {
        "–".into()
    } else if s == 0.0 {
        "0".into()
    } else if s >= 1.0 {
        format!("{s:.*} s", if s >= 10.0 { 1 } else { 2 })
    } else if s >= 0.001 {
        format!("{:.*} ms", if s >= 0.1 { 0 } else { 1 }, s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

/// `f` summed over the engines of `s`.
fn total(s: &Sample, f: &dyn Fn(&EngineReading) -> u64) -> u64 {
    s.engines.iter().map(f).sum()
}

/// Per-second rates of a counter summed over engines, `(t, rate)` between
/// consecutive samples (a counter that went down, a restart, gives none).
fn rate(samples: &[Arc<Sample>], f: &dyn Fn(&EngineReading) -> u64) -> Vec<(f64, f64)> {
    samples
        .windows(2)
        .filter_map(|w| {
            let dt = w[1].t - w[0].t;
            let delta = total(&w[1], f).checked_sub(total(&w[0], f))?;
            (dt > 0.0).then(|| (w[1].t, delta as f64 / dt))
        })
        .collect()
}

/// Each sample's bucket counts of latency `l` (`+Inf` last), summed over
/// engines.
fn latency_totals(l: usize, samples: &[Arc<Sample>], buckets: usize) -> Vec<Vec<u64>> {
    samples
        .iter()
        .map(|s| {
            let mut counts = vec![0u64; buckets];
            for e in &s.engines {
                for (slot, c) in counts.iter_mut().zip(e.latency[l].iter()) {
                    *slot += c;
                }
            }
            counts
        })
        .collect()
}

/// The observations between the bucket counts `a` and `b` (a reset
/// counts from 0) as a histogram over `bounds`, its finite bucket bounds.
fn window(a: &[u64], b: &[u64], bounds: &[f64]) -> Histogram {
    let mut cumulative = 0.0;
    let buckets = bounds
        .iter()
        .copied()
        .chain([f64::INFINITY])
        .zip(b.iter().zip(a))
        .map(|(le, (after, before))| {
            cumulative += after.saturating_sub(*before) as f64;
            (le, cumulative)
        })
        .collect();
    Histogram {
        buckets,
        sum: 0.0,
        count: cumulative,
    }
}

/// A chart of the console's look over clock time at `utc_offset`.
fn chart(title: &str, y_label: &str, utc_offset: i64, series: Vec<Series>) -> Chart {
    Chart {
        title: title.into(),
        x_label: "clock time".into(),
        y_label: y_label.into(),
        series,
        lines_only: true,
        clock: Some(utc_offset),
        hover: true,
        size: Some(SIZE),
        ..Chart::default()
    }
}

/// The p50 and p99 bucket bounds of latency `l` over time, each over the
/// last [`QUANTILE_WINDOW`] samples. Above the last bound there is no upper
/// bound: drawn at the last one, labelled `> last`.
fn latency_chart(l: usize, samples: &[Arc<Sample>], bounds: &[f64], utc_offset: i64) -> Chart {
    let title = format!("p50 and p99 over time ({QUANTILE_WINDOW} s windows)");
    let y_label = "seconds (bucket bound)";
    let Some(&last) = bounds.last() else {
        return chart(&title, y_label, utc_offset, Vec::new());
    };
    let totals = latency_totals(l, samples, bounds.len() + 1);
    let qs = [0.5, 0.99];
    let mut points = [Vec::new(), Vec::new()];
    let mut texts = [Vec::new(), Vec::new()];
    for (k, w) in totals.windows(QUANTILE_WINDOW + 1).enumerate() {
        let h = window(&w[0], &w[QUANTILE_WINDOW], bounds);
        let t = samples[k + QUANTILE_WINDOW].t;
        for (n, &q) in qs.iter().enumerate() {
            let Some(bucket) = h.quantile_bucket(q) else {
                continue;
            };
            points[n].push((t, bucket.upper.min(last)));
            texts[n].push(if bucket.upper.is_finite() {
                format!("≤ {}", secs(bucket.upper))
            } else {
                format!("> {}", secs(last))
            });
        }
    }
    let series = ["p50", "p99"]
        .iter()
        .zip(points)
        .map(|(name, points)| Series {
            name: format!("{name} (bucket bound)"),
            points,
        })
        .collect();
    Chart {
        y_format: Some(secs),
        labels: texts.into(),
        ..chart(&title, y_label, utc_offset, series)
    }
}

/// Every line chart of the page as SVG text: `tokens`, `requests`, and
/// `latency` by key (a proxy has no `queue`). `bounds`: each of
/// [`LATENCIES`]' finite bucket bounds; `utc_offset`: the reader's clock,
/// seconds east of UTC.
pub fn render(
    samples: &[Arc<Sample>],
    bounds: &[Vec<f64>],
    serving: Serving,
    utc_offset: i64,
) -> Value {
    let tokens = chart(
        "Tokens/s (all engines)",
        "tokens/s",
        utc_offset,
        vec![
            Series {
                name: "prompt tok/s".into(),
                points: rate(samples, &|e| e.prompt_tokens),
            },
            Series {
                name: "generation tok/s".into(),
                points: rate(samples, &|e| e.generation_tokens),
            },
        ],
    );
    let requests = chart(
        "Requests/s by finish reason (all engines)",
        "requests/s",
        utc_offset,
        FinishReason::ALL
            .iter()
            .enumerate()
            .map(|(i, reason)| Series {
                name: reason.as_str().into(),
                points: rate(samples, &|e| e.requests[i]),
            })
            .collect(),
    );
    let latency: Map<String, Value> = LATENCIES
        .iter()
        .enumerate()
        .filter(|(_, l)| serving == Serving::Engines || **l != Latency::Queue)
        .map(|(i, l)| {
            let b = bounds.get(i).map_or(&[][..], Vec::as_slice);
            let c = latency_chart(i, samples, b, utc_offset);
            (l.as_str().to_owned(), json!(svg(&c)))
        })
        .collect();
    json!({"tokens": svg(&tokens), "requests": svg(&requests), "latency": latency})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One engine whose counters grow by `k` per second and whose TTFTs all
    /// fall in bucket `ttft_bucket` (of three bounds and `+Inf`).
    fn sample(t: f64, k: u64, ttft_bucket: usize) -> Arc<Sample> {
        let metrics = inferscope_metrics::StatLoggerManager::new(
            inferscope_metrics::MetricsConfig::default(),
        )
        .expect("metrics");
        let mut e = metrics.read_engines().remove(0);
        e.prompt_tokens = 10 * k;
        e.generation_tokens = 3 * k;
        e.requests = [k, 0, 0, 0];
        let mut ttft = vec![0u64; 4];
        ttft[ttft_bucket] = 5 * k;
        e.latency[0] = ttft.into();
        Arc::new(Sample {
            t,
            engines: vec![e],
        })
    }

    fn titles(svg: &str) -> Vec<&str> {
        svg.split("<title>")
            .skip(1)
            .map(|t| &t[..t.find("</title>").unwrap_or(0)])
            .collect()
    }

    #[test]
    fn rates_and_quantile_bounds_come_from_the_history() {
        // 12 one-second samples at 00:00:00..00:00:11 UTC, whose TTFT
        // counts are above the last bound from the eleventh on.
        let samples: Vec<Arc<Sample>> = (0..12u64)
            .map(|k| sample(k as f64, k, if k >= 10 { 3 } else { 1 }))
            .collect();
        let bounds = vec![vec![0.01, 0.1, 1.0]; 4];
        let charts = render(&samples, &bounds, Serving::Proxy, 0);
        let tokens = charts["tokens"].as_str().expect("svg");
        let t = titles(tokens);
        assert_eq!(t.len(), 11, "{t:?}");
        assert_eq!(
            t[0],
            "00:00:01\nprompt tok/s: 10.00\ngeneration tok/s: 3.000"
        );
        let requests = charts["requests"].as_str().expect("svg");
        assert!(titles(requests)[3].contains("stop: 1.000"), "{requests}");
        // The proxy has no queue time.
        let latency = charts["latency"].as_object().expect("latency");
        assert_eq!(
            latency.keys().map(String::as_str).collect::<Vec<_>>(),
            ["ttft", "itl", "e2e"]
        );
        let ttft = titles(latency["ttft"].as_str().expect("svg"));
        // Windows end at samples 10 and 11, each holding only counts above
        // the last bound.
        assert_eq!(
            ttft,
            [
                "00:00:10\np50 (bucket bound): &gt; 1.00 s\np99 (bucket bound): &gt; 1.00 s",
                "00:00:11\np50 (bucket bound): &gt; 1.00 s\np99 (bucket bound): &gt; 1.00 s",
            ]
        );
        let engines = render(&samples, &bounds, Serving::Engines, 0);
        assert!(engines["latency"]["queue"].is_string());
    }

    #[test]
    fn the_p50_is_the_bucket_of_the_median() {
        let samples: Vec<Arc<Sample>> = (0..11u64).map(|k| sample(k as f64, k, 1)).collect();
        let c = latency_chart(0, &samples, &[0.01, 0.1, 1.0], 3600);
        assert_eq!(c.series[0].points, [(10.0, 0.1)]);
        assert_eq!(c.labels[0], ["≤ 100 ms"]);
        assert!(titles(&svg(&c))[0].starts_with("01:00:10\n"));
    }

    #[test]
    fn durations_read_as_the_page_writes_them() {
        assert_eq!(secs(0.0123), "12.3 ms");
        assert_eq!(secs(1.5), "1.50 s");
        assert_eq!(secs(20.0), "20.0 s");
        assert_eq!(secs(0.000002), "2 µs");
    }
}
