//! Per-interval history for `top`: what changed between two consecutive
//! scrapes, per engine, read through the schema crate's delta layer.
//!
//! Quantiles from a histogram are only known to the bucket: they are kept
//! and shown as the bucket's bounds (`p99 in 40–60 ms`), never as an
//! interpolated number that would look like a measurement.

use inferscope_schema::names;
use inferscope_schema::scrape::{Delta, Histogram, Scrape, full_name};
use std::collections::BTreeMap;

pub use inferscope_schema::scrape::{BucketBound, secs};

/// The bucket holding quantile `q` (0..1] of `h`; `None` without observations.
pub fn quantile_bucket(h: &Histogram, q: f64) -> Option<BucketBound> {
    h.quantile_bucket(q)
}

/// p50 and p99 of one histogram, as buckets.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Quantiles {
    /// Observations.
    pub count: f64,
    /// Exact mean (from `_sum` and `_count`), when there were observations.
    pub mean: Option<f64>,
    /// The median's bucket.
    pub p50: Option<BucketBound>,
    /// The 99th percentile's bucket.
    pub p99: Option<BucketBound>,
}

impl Quantiles {
    /// The quantiles of `h`. Without `_count` (a partial exposition) the
    /// highest bucket is the count: buckets are cumulative.
    pub fn of(h: &Histogram) -> Self {
        let highest = h.buckets.last().map_or(0.0, |b| b.1);
        Quantiles {
            count: if h.count > 0.0 { h.count } else { highest },
            mean: h.mean(),
            p50: quantile_bucket(h, 0.5),
            p99: quantile_bucket(h, 0.99),
        }
    }
}

/// One engine in one interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineTick {
    /// Waiting requests at the end of the interval.
    pub waiting: Option<f64>,
    /// Time to first token of the requests that got one in the interval;
    /// `None` when not exported or when there is no earlier scrape.
    pub ttft: Option<Quantiles>,
    /// Inter-token latency of the tokens of the interval.
    pub itl: Option<Quantiles>,
}

/// One refresh: the interval since the previous scrape, or an outage.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tick {
    /// The scrape failed: the server was unreachable.
    pub outage: bool,
    /// Per engine label.
    pub engines: BTreeMap<String, EngineTick>,
    /// Requests finished in the interval by `finished_reason`, all engines.
    pub finished: BTreeMap<String, f64>,
    /// Prompt tokens/s over the interval, all engines.
    pub prompt_tps: Option<f64>,
    /// Generated tokens/s over the interval, all engines.
    pub generation_tps: Option<f64>,
}

impl Tick {
    /// A failed scrape.
    pub fn outage() -> Self {
        Tick {
            outage: true,
            ..Tick::default()
        }
    }

    /// The interval ending at `after` (`before` is the previous scrape of the
    /// same run of the server, `None` right after start or an outage).
    pub fn between(
        before: Option<&Scrape>,
        after: &Scrape,
        namespace: &str,
        engines: &[String],
    ) -> Self {
        let waiting = full_name(namespace, names::NUM_REQUESTS_WAITING);
        let delta = before.map(|b| Delta::new(Some(b), after, namespace));
        let engines = engines
            .iter()
            .map(|e| {
                let f: Vec<(&str, &str)> = if e.is_empty() {
                    Vec::new()
                } else {
                    vec![("engine", e.as_str())]
                };
                let tick = EngineTick {
                    waiting: after.sum(&waiting, &f),
                    ttft: delta
                        .and_then(|d| d.histogram(names::TIME_TO_FIRST_TOKEN_SECONDS, &f))
                        .map(|h| Quantiles::of(&h)),
                    itl: delta
                        .and_then(|d| d.inter_token_latency(&f))
                        .map(|h| Quantiles::of(&h)),
                };
                (e.clone(), tick)
            })
            .collect();
        Tick {
            outage: false,
            engines,
            finished: delta
                .map(|d| d.counter_by(names::REQUEST_SUCCESS, "finished_reason"))
                .unwrap_or_default(),
            // Rates need the scrape times: the model fills them in.
            prompt_tps: None,
            generation_tps: None,
        }
    }
}

/// A bucket as text: `≤ 5 ms`, `in 40–60 ms`, `in 750 ms–1 s`, `> 20 s`.
pub fn bucket_text(b: &BucketBound) -> String {
    b.secs_text()
}

/// `p50 ≤ 5 ms  p99 in 40–60 ms`, or `–` without observations.
pub fn quantiles_text(q: Option<&Quantiles>) -> String {
    match q.and_then(|q| Some((q.p50?, q.p99?))) {
        Some((p50, p99)) => format!("p50 {}  p99 {}", bucket_text(&p50), bucket_text(&p99)),
        None => "–".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(buckets: &[(f64, f64)]) -> Histogram {
        Histogram {
            buckets: buckets.to_vec(),
            sum: 1.0,
            count: buckets.last().map_or(0.0, |b| b.1),
        }
    }

    #[test]
    fn quantiles_are_buckets_not_interpolations() {
        let x = h(&[
            (0.005, 0.0),
            (0.04, 10.0),
            (0.06, 98.0),
            (0.1, 100.0),
            (f64::INFINITY, 100.0),
        ]);
        let p50 = quantile_bucket(&x, 0.5).expect("p50");
        assert_eq!((p50.lower, p50.upper, p50.index), (0.04, 0.06, 2));
        assert_eq!(bucket_text(&p50), "in 40–60 ms");
        let p99 = quantile_bucket(&x, 0.99).expect("p99");
        assert_eq!(bucket_text(&p99), "in 60–100 ms");
        let first = quantile_bucket(&h(&[(0.005, 3.0), (f64::INFINITY, 3.0)]), 0.5).expect("b");
        assert_eq!(bucket_text(&first), "≤ 5 ms");
        let over = quantile_bucket(&h(&[(20.0, 0.0), (f64::INFINITY, 3.0)]), 0.99).expect("b");
        assert_eq!(bucket_text(&over), "> 20 s");
        let mixed = quantile_bucket(&h(&[(0.75, 0.0), (1.0, 3.0), (f64::INFINITY, 3.0)]), 0.5);
        assert_eq!(bucket_text(&mixed.expect("b")), "in 750 ms–1 s");
        assert_eq!(
            quantile_bucket(&h(&[(0.1, 0.0), (f64::INFINITY, 0.0)]), 0.5),
            None
        );
    }
}
