//! The one view of a server from scrapes of its `/metrics`: sums over label
//! sets, counter deltas that survive restarts, histogram deltas, the bucket
//! a quantile lies in (and its text: `p99 in 40–60 ms`), namespace detection
//! and the names older vLLM versions export. Bench's server-side view and
//! the doctor's window are thin users of it.

use std::collections::{BTreeMap, BTreeSet};

use crate::promtext::{self, Sample};
use crate::schema::{
    DEFAULT_NAMESPACE, LEGACY_DEFAULT_NAMESPACE, VLLM_NAMESPACE, name_prefix, names,
    namespaced_name,
};

/// vLLM before V1 called the KV-cache gauge `gpu_cache_usage_perc`.
pub const LEGACY_GPU_CACHE_USAGE_PERC: &str = "gpu_cache_usage_perc";
/// Older vLLM exports the per-token gap as `time_per_output_token_seconds`.
pub const LEGACY_TIME_PER_OUTPUT_TOKEN_SECONDS: &str = "time_per_output_token_seconds";

/// The exposed name of `base` under `namespace`, spelled as the schema
/// decides ([`namespaced_name`]): `inferscope_x`, `vllm:x`, `inferscope:x`
/// for [`LEGACY_DEFAULT_NAMESPACE`], or `base` when the namespace is empty.
pub fn full_name(namespace: &str, base: &str) -> String {
    namespaced_name(namespace, base)
}

/// The namespaces [`Scrape::detect_namespace`] recognises, preferred in this
/// order on a tie.
pub const KNOWN_NAMESPACES: [&str; 3] =
    [DEFAULT_NAMESPACE, LEGACY_DEFAULT_NAMESPACE, VLLM_NAMESPACE];

/// `after − before`, or `after` when the counter went down (the server
/// restarted and counts from zero again).
pub fn counter_delta(after: f64, before: Option<f64>) -> f64 {
    match before {
        Some(b) if after >= b => after - b,
        _ => after,
    }
}

/// Device utilisation from a delta of the busy-seconds counter over `wall`
/// seconds and `engines` engines, as a fraction in `0..=1`.
///
/// The counter moves by a whole step's device time when the step ends, so
/// a window counts in full the step that straddles its start (and none of
/// the one straddling its end): the raw ratio is off by up to one step over
/// the window and can read above 1 on a short window of a busy device. The
/// true value cannot, so it is clamped; `None` for an empty window.
pub fn utilisation(busy_delta_s: f64, wall_s: f64, engines: usize) -> Option<f64> {
    (wall_s > 0.0 && busy_delta_s.is_finite())
        .then(|| (busy_delta_s / (wall_s * engines.max(1) as f64)).clamp(0.0, 1.0))
}

/// Per-interval busy seconds with what a step counted past its interval's
/// capacity moved back to the intervals before it, where the step ran.
///
/// `busy[i]` is the counter's delta over interval `i`, `capacity[i]` its
/// wall seconds times the engines. An interval over its capacity holds time
/// of a step that ended in it but began earlier; moving the excess back
/// aligns the series with when the device was busy and keeps every interval
/// within its capacity (an excess reaching back past the first interval
/// belongs before the series and is dropped). Totals are kept otherwise.
pub fn busy_aligned(busy: &[f64], capacity: &[f64]) -> Vec<f64> {
    let mut out: Vec<f64> = busy.iter().map(|b| b.max(0.0)).collect();
    let mut carry = 0.0;
    for i in (0..out.len()).rev() {
        let cap = capacity.get(i).copied().unwrap_or(0.0).max(0.0);
        let v = out[i] + carry;
        out[i] = v.min(cap);
        carry = v - out[i];
    }
    out
}

/// A cumulative histogram summed over label sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// `(upper bound, cumulative count)`, sorted by bound, `+Inf` last.
    pub buckets: Vec<(f64, f64)>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: f64,
}

impl Histogram {
    /// Adds up `_bucket` samples of any label sets, bound by bound, into one
    /// histogram with the given `_sum` and `_count`; `None` without buckets.
    pub fn from_buckets<'a>(
        buckets: impl IntoIterator<Item = &'a Sample>,
        sum: f64,
        count: f64,
    ) -> Option<Histogram> {
        let mut by_le: Vec<(f64, f64)> = Vec::new();
        for s in buckets {
            let Some(le) = s.label("le").and_then(promtext::parse_value) else {
                continue;
            };
            match by_le.iter_mut().find(|(l, _)| *l == le) {
                Some(slot) => slot.1 += s.value,
                None => by_le.push((le, s.value)),
            }
        }
        if by_le.is_empty() {
            return None;
        }
        by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Histogram {
            buckets: by_le,
            sum,
            count,
        })
    }

    /// The observations made since `before` (missing earlier buckets count
    /// as 0). When the count went down the server restarted, and this
    /// histogram is the delta.
    pub fn delta(&self, before: Option<&Histogram>) -> Histogram {
        let Some(b) = before.filter(|b| self.count >= b.count) else {
            return self.clone();
        };
        let prev = |le: f64| {
            b.buckets
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, c)| *c)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, c)| (le, c - prev(le)))
                .collect(),
            sum: self.sum - b.sum,
            count: self.count - b.count,
        }
    }

    /// Quantile estimate as Prometheus' `histogram_quantile` (linear within a bucket).
    /// An estimate, not a measurement: reports show [`Histogram::quantile_bucket`].
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut prev_le = 0.0;
        let mut prev_c = 0.0;
        for &(le, c) in &self.buckets {
            if c >= rank {
                if le.is_infinite() {
                    // Above the highest finite bound: that bound is the best estimate.
                    return Some(prev_le);
                }
                let width = c - prev_c;
                let frac = if width > 0.0 {
                    (rank - prev_c) / width
                } else {
                    1.0
                };
                return Some(prev_le + (le - prev_le) * frac);
            }
            prev_le = le;
            prev_c = c;
        }
        Some(prev_le)
    }

    /// Mean observation, if any.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// The bucket holding quantile `q` (0..1]; `None` without observations.
    /// Buckets only tell where a quantile lies, so this, not
    /// [`Histogram::quantile`], is what a report should show.
    pub fn quantile_bucket(&self, q: f64) -> Option<BucketBound> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = 0.0;
        for (index, &(le, c)) in self.buckets.iter().enumerate() {
            if c >= rank {
                return Some(BucketBound {
                    lower,
                    upper: le,
                    index,
                    buckets: self.buckets.len(),
                });
            }
            lower = le;
        }
        None
    }
}

/// The bucket a quantile falls in: all that buckets can say about it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketBound {
    /// Lower bound (exclusive); 0 for the first bucket.
    pub lower: f64,
    /// Upper bound (inclusive); infinite above the highest finite bound.
    pub upper: f64,
    /// Position of the bucket, 0-based.
    pub index: usize,
    /// Buckets in the histogram, `+Inf` included.
    pub buckets: usize,
}

impl BucketBound {
    /// Whether `v` (same unit as the bounds) lies in this bucket.
    pub fn contains(&self, v: f64) -> bool {
        (self.index == 0 || v > self.lower) && v <= self.upper
    }

    /// The bounds in seconds as text: `≤ 5 ms`, `in 40–60 ms`,
    /// `in 750 ms–1 s`, `> 20 s`.
    pub fn secs_text(&self) -> String {
        if self.upper.is_infinite() {
            return format!("> {}", secs(self.lower));
        }
        if self.index == 0 || self.lower <= 0.0 {
            return format!("≤ {}", secs(self.upper));
        }
        let ((lo, lu), (hi, hu)) = (split_secs(self.lower), split_secs(self.upper));
        if lu == hu {
            format!("in {lo}–{hi} {hu}")
        } else {
            format!("in {lo} {lu}–{hi} {hu}")
        }
    }

    /// [`BucketBound::secs_text`] with the edge bucket named:
    /// `≤ 300 ms (first bucket)`, `> 20 s (last bucket)`.
    pub fn secs_text_named(&self) -> String {
        let t = self.secs_text();
        if self.upper.is_infinite() {
            format!("{t} (last bucket)")
        } else if self.index == 0 {
            format!("{t} (first bucket)")
        } else {
            t
        }
    }
}

/// `v` rounded to 3 decimals, without trailing zeros.
fn num(v: f64) -> String {
    let r = (v * 1000.0).round() / 1000.0;
    format!("{r}")
}

/// `(number, unit)` for seconds: milliseconds below 1 s.
fn split_secs(v: f64) -> (String, &'static str) {
    if v < 1.0 {
        (num(v * 1000.0), "ms")
    } else {
        (num(v), "s")
    }
}

/// Seconds with a unit: `250 ms`, `1.5 s`.
pub fn secs(v: f64) -> String {
    let (n, u) = split_secs(v);
    format!("{n} {u}")
}

/// One parsed exposition of `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    /// Every sample, as exposed.
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// Parses Prometheus text (0.0.4) or OpenMetrics; bad lines are skipped.
    pub fn parse(text: &str) -> Self {
        Scrape {
            samples: promtext::parse_lenient(text).into_samples(),
        }
    }

    /// The metric namespace found, as readers name it (see
    /// [`KNOWN_NAMESPACES`]): `inferscope` (`inferscope_x`), `inferscope:`
    /// (older servers' `inferscope:x`) or `vllm` (`vllm:x`), whichever has
    /// the most series (earlier in that list on a tie); `None` when none
    /// appears.
    pub fn detect_namespace(&self) -> Option<&'static str> {
        let count = |ns: &str| {
            let prefix = name_prefix(ns);
            self.samples
                .iter()
                .filter(|s| s.name.starts_with(&prefix))
                .count()
        };
        let mut best: Option<(&'static str, usize)> = None;
        for ns in KNOWN_NAMESPACES {
            let n = count(ns);
            if n > 0 && best.is_none_or(|(_, m)| n > m) {
                best = Some((ns, n));
            }
        }
        best.map(|(ns, _)| ns)
    }

    /// Samples named `name` carrying every label in `filter`.
    pub fn series<'a>(
        &'a self,
        name: &'a str,
        filter: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.matches(name, filter))
    }

    /// Sum over the label sets of `name` that carry every label in `filter`;
    /// `None` when there are none.
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> Option<f64> {
        let mut it = self.series(name, filter).peekable();
        it.peek()?;
        Some(it.map(|s| s.value).sum())
    }

    /// Largest value over the matching label sets of `name`.
    pub fn max(&self, name: &str, filter: &[(&str, &str)]) -> Option<f64> {
        self.series(name, filter).map(|s| s.value).reduce(f64::max)
    }

    /// Whether any sample is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// Distinct values of `label` on the series `name`.
    pub fn label_values(&self, name: &str, label: &str) -> BTreeSet<String> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter_map(|s| s.label(label).map(str::to_string))
            .collect()
    }

    /// Label value of the first series `name` matching `filter`.
    pub fn label_of(&self, name: &str, filter: &[(&str, &str)], label: &str) -> Option<String> {
        self.series(name, filter)
            .next()
            .and_then(|s| s.label(label).map(str::to_string))
    }

    /// The histogram `base` (full name without `_bucket`), summed over the
    /// label sets that match `filter`.
    pub fn histogram(&self, base: &str, filter: &[(&str, &str)]) -> Option<Histogram> {
        let bucket = format!("{base}_bucket");
        Histogram::from_buckets(
            self.series(&bucket, filter),
            self.sum(&format!("{base}_sum"), filter).unwrap_or(0.0),
            self.sum(&format!("{base}_count"), filter).unwrap_or(0.0),
        )
    }

    /// The exposed name of counter `base` (a schema name, without `_total`)
    /// under `namespace`: with `_total`, or bare when only that is exposed.
    pub fn counter_name(&self, namespace: &str, base: &str) -> String {
        let with = full_name(namespace, &format!("{base}_total"));
        let bare = full_name(namespace, base);
        if !self.has(&with) && self.has(&bare) {
            bare
        } else {
            with
        }
    }

    /// The KV-cache usage gauge's name: the V1 name, or vLLM's older one
    /// when only that is exposed.
    pub fn kv_usage_name(&self, namespace: &str) -> String {
        let v1 = full_name(namespace, names::KV_CACHE_USAGE_PERC);
        let legacy = full_name(namespace, LEGACY_GPU_CACHE_USAGE_PERC);
        if !self.has(&v1) && self.has(&legacy) {
            legacy
        } else {
            v1
        }
    }
}

/// What changed between two scrapes of one server, under one namespace.
/// Counters that went down (a restart) count from zero.
#[derive(Debug, Clone, Copy)]
pub struct Delta<'a> {
    /// The earlier scrape; `None` counts everything in `after`.
    pub before: Option<&'a Scrape>,
    /// The later scrape.
    pub after: &'a Scrape,
    /// Namespace the schema names are read under.
    pub namespace: &'a str,
}

impl<'a> Delta<'a> {
    /// The change from `before` to `after`.
    pub fn new(before: Option<&'a Scrape>, after: &'a Scrape, namespace: &'a str) -> Self {
        Delta {
            before,
            after,
            namespace,
        }
    }

    /// The full name of schema name `base` under this namespace.
    pub fn name(&self, base: &str) -> String {
        full_name(self.namespace, base)
    }

    /// The exposed name of counter `base` in the later scrape.
    pub fn counter_name(&self, base: &str) -> String {
        self.after.counter_name(self.namespace, base)
    }

    /// Delta of the exposed series `full_name` summed over the label sets
    /// matching `filter`; `None` when the later scrape lacks it.
    pub fn counter_exposed(&self, full_name: &str, filter: &[(&str, &str)]) -> Option<f64> {
        let after = self.after.sum(full_name, filter)?;
        let before = self.before.and_then(|s| s.sum(full_name, filter));
        Some(counter_delta(after, before))
    }

    /// Delta of counter `base` (a schema name) under the namespace.
    pub fn counter(&self, base: &str, filter: &[(&str, &str)]) -> Option<f64> {
        self.counter_exposed(&self.counter_name(base), filter)
    }

    /// Delta of the exposed series `full_name` per value of `label` (the
    /// values present in the later scrape).
    pub fn counter_exposed_by(&self, full_name: &str, label: &str) -> BTreeMap<String, f64> {
        self.after
            .label_values(full_name, label)
            .into_iter()
            .filter_map(|v| {
                let d = self.counter_exposed(full_name, &[(label, v.as_str())])?;
                Some((v, d))
            })
            .collect()
    }

    /// Delta of counter `base` (a schema name) per value of `label`.
    pub fn counter_by(&self, base: &str, label: &str) -> BTreeMap<String, f64> {
        self.counter_exposed_by(&self.counter_name(base), label)
    }

    /// Histogram `base` (a schema name) of the observations made between
    /// the scrapes, summed over the label sets matching `filter`.
    pub fn histogram(&self, base: &str, filter: &[(&str, &str)]) -> Option<Histogram> {
        let name = self.name(base);
        let after = self.after.histogram(&name, filter)?;
        let before = self.before.and_then(|s| s.histogram(&name, filter));
        Some(after.delta(before.as_ref()))
    }

    /// Inter-token latency, under its older vLLM name when the V1 one is absent.
    pub fn inter_token_latency(&self, filter: &[(&str, &str)]) -> Option<Histogram> {
        self.histogram(names::INTER_TOKEN_LATENCY_SECONDS, filter)
            .or_else(|| self.histogram(LEGACY_TIME_PER_OUTPUT_TOKEN_SECONDS, filter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilisation_is_a_fraction_of_the_window() {
        assert_eq!(utilisation(0.5, 1.0, 2), Some(0.25));
        // A step counted in full at a short window's end: never above 1.
        assert_eq!(utilisation(0.12, 0.1, 1), Some(1.0));
        assert_eq!(utilisation(1.0, 0.0, 1), None);
        assert_eq!(utilisation(-1.0, 1.0, 0), Some(0.0));
    }

    #[test]
    fn busy_time_past_an_interval_moves_back_to_where_the_step_ran() {
        // One engine, 0.25 s intervals; a 0.375 s step ends in the third.
        let cap = [0.25; 4];
        let busy = [0.25, 0.0, 0.375, 0.125];
        let a = busy_aligned(&busy, &cap);
        assert_eq!(a, vec![0.25, 0.125, 0.25, 0.125]);
        assert!(a.iter().zip(&cap).all(|(b, c)| b <= c));
        assert!((a.iter().sum::<f64>() - busy.iter().sum::<f64>()).abs() < 1e-12);
        // An excess reaching back past the first interval is dropped.
        assert_eq!(busy_aligned(&[0.75, 0.25], &[0.25, 0.25]), vec![0.25, 0.25]);
        assert!(busy_aligned(&[], &[]).is_empty());
    }

    /// Two engines; cumulative buckets 0.1 → 1·scale, 0.2 → 2·scale, +Inf → 2.5·scale.
    fn hist(ns: &str, scale: f64) -> String {
        let p = name_prefix(ns);
        let mut t = String::new();
        for e in ["0", "1"] {
            for (le, c) in [("0.1", 1.0), ("0.2", 2.0), ("+Inf", 2.5)] {
                t.push_str(&format!(
                    "{p}time_to_first_token_seconds_bucket{{engine=\"{e}\",le=\"{le}\"}} {}\n",
                    c * scale
                ));
            }
            t.push_str(&format!(
                "{p}time_to_first_token_seconds_sum{{engine=\"{e}\"}} {}\n",
                0.5 * scale
            ));
            t.push_str(&format!(
                "{p}time_to_first_token_seconds_count{{engine=\"{e}\"}} {}\n",
                2.5 * scale
            ));
            t.push_str(&format!(
                "{p}request_success_total{{engine=\"{e}\",finished_reason=\"length\"}} {}\n",
                10.0 * scale
            ));
        }
        t
    }

    #[test]
    fn quantiles_are_buckets_not_interpolations() {
        let h = |b: &[(f64, f64)]| Histogram {
            buckets: b.to_vec(),
            sum: 1.0,
            count: b.last().map_or(0.0, |x| x.1),
        };
        let x = h(&[
            (0.005, 0.0),
            (0.04, 10.0),
            (0.06, 98.0),
            (0.1, 100.0),
            (f64::INFINITY, 100.0),
        ]);
        let p50 = x.quantile_bucket(0.5).expect("p50");
        assert_eq!((p50.lower, p50.upper, p50.index), (0.04, 0.06, 2));
        assert_eq!(p50.secs_text(), "in 40–60 ms");
        assert!(p50.contains(0.05) && !p50.contains(0.04) && !p50.contains(0.07));
        assert_eq!(
            x.quantile_bucket(0.99).expect("p99").secs_text(),
            "in 60–100 ms"
        );
        let first = h(&[(0.3, 3.0), (f64::INFINITY, 3.0)])
            .quantile_bucket(0.5)
            .expect("b");
        assert_eq!(first.secs_text(), "≤ 300 ms");
        assert_eq!(first.secs_text_named(), "≤ 300 ms (first bucket)");
        assert!(first.contains(0.0) && first.contains(0.3));
        let over = h(&[(20.0, 0.0), (f64::INFINITY, 3.0)])
            .quantile_bucket(0.99)
            .expect("b");
        assert_eq!(over.secs_text_named(), "> 20 s (last bucket)");
        assert!(over.contains(25.0) && !over.contains(20.0));
        let mixed = h(&[(0.75, 0.0), (1.0, 3.0), (f64::INFINITY, 3.0)]).quantile_bucket(0.5);
        assert_eq!(mixed.expect("b").secs_text(), "in 750 ms–1 s");
        assert_eq!(
            h(&[(0.1, 0.0), (f64::INFINITY, 0.0)]).quantile_bucket(0.5),
            None
        );
    }

    #[test]
    fn histogram_quantiles_and_deltas() {
        let before = Scrape::parse(&hist("vllm", 1.0));
        let after = Scrape::parse(&hist("vllm", 3.0));
        assert_eq!(after.detect_namespace(), Some("vllm"));
        let d = Delta::new(Some(&before), &after, "vllm")
            .histogram(names::TIME_TO_FIRST_TOKEN_SECONDS, &[])
            .expect("histogram");
        // Delta: buckets 0.1 → 4, 0.2 → 8, +Inf → 10 (two engines × (3 − 1) × …).
        assert_eq!(
            d.buckets,
            vec![(0.1, 4.0), (0.2, 8.0), (f64::INFINITY, 10.0)]
        );
        assert_eq!(d.count, 10.0);
        assert!((d.mean().expect("mean") - 0.2).abs() < 1e-12);
        // Rank 5 lies in (0.1, 0.2]: 0.1 + 0.1 · (5 − 4) / 4.
        assert!((d.quantile(0.5).expect("p50") - 0.125).abs() < 1e-12);
        // Rank 9.9 is in +Inf: the highest finite bound.
        assert_eq!(d.quantile(0.99), Some(0.2));
        // Filtered to one engine.
        let e0 = Delta::new(Some(&before), &after, "vllm")
            .histogram(names::TIME_TO_FIRST_TOKEN_SECONDS, &[("engine", "0")])
            .expect("engine 0");
        assert_eq!(e0.count, 5.0);
    }

    #[test]
    fn restarts_count_from_zero() {
        let before = Scrape::parse(&hist("inferscope", 3.0));
        let after = Scrape::parse(&hist("inferscope", 1.0));
        let d = Delta::new(Some(&before), &after, "inferscope");
        // The counters went down: the later values are the delta.
        assert_eq!(d.counter(names::REQUEST_SUCCESS, &[]), Some(20.0));
        assert_eq!(
            d.counter_by(names::REQUEST_SUCCESS, "finished_reason")
                .get("length"),
            Some(&20.0)
        );
        let h = d
            .histogram(names::TIME_TO_FIRST_TOKEN_SECONDS, &[])
            .expect("histogram");
        assert_eq!(h.count, 5.0);
        assert_eq!(counter_delta(5.0, Some(2.0)), 3.0);
        assert_eq!(counter_delta(1.0, Some(2.0)), 1.0);
        assert_eq!(counter_delta(1.0, None), 1.0);
    }

    #[test]
    fn names_without_total_and_older_vllm_names() {
        // A server exposing counters without `_total` and pre-V1 vLLM names.
        let s = Scrape::parse(
            "vllm:request_success{finished_reason=\"stop\"} 4\n\
             vllm:gpu_cache_usage_perc{engine=\"0\"} 0.9\n\
             vllm:time_per_output_token_seconds_bucket{le=\"+Inf\"} 3\n\
             vllm:time_per_output_token_seconds_count 3\n",
        );
        let d = Delta::new(None, &s, "vllm");
        assert_eq!(
            d.counter_name(names::REQUEST_SUCCESS),
            "vllm:request_success"
        );
        assert_eq!(
            d.counter_by(names::REQUEST_SUCCESS, "finished_reason")
                .get("stop"),
            Some(&4.0)
        );
        assert_eq!(s.kv_usage_name("vllm"), "vllm:gpu_cache_usage_perc");
        assert_eq!(s.max(&s.kv_usage_name("vllm"), &[]), Some(0.9));
        assert_eq!(d.inter_token_latency(&[]).map(|h| h.count), Some(3.0));
        assert_eq!(Scrape::parse("# nothing\n").detect_namespace(), None);
        assert_eq!(full_name("", "http_requests_total"), "http_requests_total");
    }

    #[test]
    fn detection_reads_both_spellings_of_the_default_namespace() {
        // Today's lint-clean names, older servers' colon names, and vLLM's.
        for (ns, text) in [
            ("inferscope", hist("inferscope", 1.0)),
            (LEGACY_DEFAULT_NAMESPACE, hist("inferscope:", 1.0)),
            ("vllm", hist("vllm", 1.0)),
        ] {
            assert!(text.starts_with(&name_prefix(ns)), "{text}");
            let s = Scrape::parse(&text);
            assert_eq!(s.detect_namespace(), Some(ns), "{text}");
            let d = Delta::new(None, &s, ns);
            assert_eq!(d.counter(names::REQUEST_SUCCESS, &[]), Some(20.0), "{ns}");
            let h = d
                .histogram(names::TIME_TO_FIRST_TOKEN_SECONDS, &[])
                .expect("histogram");
            assert_eq!(h.count, 5.0, "{ns}");
        }
        let legacy = Scrape::parse(&hist("inferscope:", 1.0));
        assert_eq!(
            full_name(LEGACY_DEFAULT_NAMESPACE, names::TIME_TO_FIRST_TOKEN_SECONDS),
            "inferscope:time_to_first_token_seconds"
        );
        // The new spelling finds nothing in an old scrape, and the reverse.
        assert_eq!(
            Delta::new(None, &legacy, "inferscope").counter(names::REQUEST_SUCCESS, &[]),
            None
        );
        // Names of the tokens-per-step histogram follow the spelling.
        assert_eq!(
            full_name("inferscope", names::ITERATION_TOKENS),
            "inferscope_iteration_tokens"
        );
        assert_eq!(
            full_name(LEGACY_DEFAULT_NAMESPACE, names::ITERATION_TOKENS),
            "inferscope:iteration_tokens_total"
        );
        // Mixed: the spelling with more series wins; a tie prefers the new one.
        let mixed = format!("{}{}", hist("vllm", 1.0), hist("inferscope", 1.0));
        assert_eq!(Scrape::parse(&mixed).detect_namespace(), Some("inferscope"));
        let more_vllm = format!(
            "{}{}vllm:num_requests_running 1\n",
            hist("vllm", 1.0),
            hist("inferscope:", 1.0)
        );
        assert_eq!(Scrape::parse(&more_vllm).detect_namespace(), Some("vllm"));
        // HTTP series alone carry no namespace.
        assert_eq!(
            Scrape::parse("http_requests_total{handler=\"none\"} 1\n").detect_namespace(),
            None
        );
    }
}
