//! A lock-free histogram for prometheus-client.
//!
//! prometheus-client's own `Histogram` takes a mutex on every `observe`; the
//! engine and the per-token path must not, so this one keeps one atomic per
//! bucket plus an atomic sum, and computes `_count` from the buckets at
//! encode time so `le="+Inf"` always equals `_count` in a scrape.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::family::MetricConstructor;
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::exemplar_slot::{ExemplarSlot, ExemplarTime};
use inferscope_schema::stats::RequestRef;

/// The bucket of `value` among the sorted finite `bounds` (`bounds.len()`
/// is `+Inf`): how many bounds lie below it.
#[inline]
fn bucket_index(bounds: &[f64], value: f64) -> usize {
    bounds.iter().map(|&b| usize::from(b < value)).sum()
}

/// A histogram whose `observe` is a branch-free bucket count and two atomic updates.
#[derive(Debug, Clone)]
pub struct AtomicHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Finite upper bounds, strictly increasing.
    bounds: Box<[f64]>,
    /// Non-cumulative counts; one more than `bounds` (the `+Inf` bucket).
    counts: Box<[AtomicU64]>,
    /// Sum of observations, as `f64` bits.
    sum_bits: AtomicU64,
    /// The latest exemplar of each bucket (same length as `counts`).
    exemplars: Box<[ExemplarSlot]>,
}

impl AtomicHistogram {
    /// A histogram with these upper bounds (non-finite and out-of-order ones are dropped).
    pub fn new(bounds: &[f64]) -> Self {
        let mut clean: Vec<f64> = Vec::with_capacity(bounds.len());
        for &b in bounds {
            if b.is_finite() && clean.last().is_none_or(|&last| b > last) {
                clean.push(b);
            }
        }
        let counts = (0..=clean.len()).map(|_| AtomicU64::new(0)).collect();
        let exemplars = (0..=clean.len()).map(|_| ExemplarSlot::default()).collect();
        Self {
            inner: Arc::new(Inner {
                bounds: clean.into_boxed_slice(),
                counts,
                sum_bits: AtomicU64::new(0f64.to_bits()),
                exemplars,
            }),
        }
    }

    /// Records one value. NaN is ignored (it would poison `_sum`).
    #[inline]
    pub fn observe(&self, value: f64) {
        self.observe_at(value, 1);
    }

    /// Records `count` samples of one value at once (nothing for 0).
    #[inline]
    pub fn observe_many(&self, value: f64, count: u64) {
        self.observe_at(value, count);
    }

    /// Records one value and keeps `request` as its bucket's exemplar
    /// (no allocation: the id is shared, not copied).
    #[inline]
    pub fn observe_for(&self, value: f64, request: &RequestRef) {
        self.observe_many_for(value, 1, request);
    }

    /// Records `count` samples of one value and keeps `request` as their
    /// bucket's exemplar.
    #[inline]
    pub fn observe_many_for(&self, value: f64, count: u64, request: &RequestRef) {
        self.observe_many_for_at(value, count, request, &ExemplarTime::default());
    }

    /// [`AtomicHistogram::observe_for`], the exemplar timed by `at` (shared
    /// with the request's other exemplars: one clock read for all).
    #[inline]
    pub fn observe_for_at(&self, value: f64, request: &RequestRef, at: &ExemplarTime) {
        self.observe_many_for_at(value, 1, request, at);
    }

    /// `count` samples of `value`, `request` their bucket's exemplar, timed by `at`.
    #[inline]
    fn observe_many_for_at(&self, value: f64, count: u64, request: &RequestRef, at: &ExemplarTime) {
        if let Some(slot) = self
            .observe_at(value, count)
            .and_then(|i| self.exemplar_slot(i))
        {
            slot.set_at(request, value, at);
        }
    }

    /// The exemplar slot of bucket `idx` (`bounds().len()` is `+Inf`).
    pub fn exemplar_slot(&self, idx: usize) -> Option<&ExemplarSlot> {
        self.inner.exemplars.get(idx)
    }

    /// Records `count` samples of `value`; returns their bucket index
    /// (`None` for NaN or no samples).
    #[inline]
    fn observe_at(&self, value: f64, count: u64) -> Option<usize> {
        if value.is_nan() || count == 0 {
            return None;
        }
        let inner = &*self.inner;
        // `le` semantics: the first bucket whose bound is >= value, i.e. the
        // number of bounds below it (sorted). Counted without branches: a
        // binary search over ~20 bounds mispredicts on most of its steps,
        // and every token's latencies come through here.
        let idx = bucket_index(&inner.bounds, value);
        if let Some(c) = inner.counts.get(idx) {
            c.fetch_add(count, Ordering::Relaxed);
        }
        let add = value * count as f64;
        let mut cur = inner.sum_bits.load(Ordering::Relaxed);
        loop {
            let new = (f64::from_bits(cur) + add).to_bits();
            match inner.sum_bits.compare_exchange_weak(
                cur,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        Some(idx)
    }

    /// The finite upper bounds.
    pub fn bounds(&self) -> &[f64] {
        &self.inner.bounds
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum of observations.
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.inner.sum_bits.load(Ordering::Relaxed))
    }

    /// Non-cumulative bucket counts, `+Inf` last.
    pub fn counts(&self) -> Box<[u64]> {
        self.inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// `(upper bound, non-cumulative count)` pairs, `+Inf` last.
    pub fn snapshot(&self) -> Vec<(f64, u64)> {
        let inner = &*self.inner;
        inner
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(inner.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect()
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets = self.snapshot();
        // Count from the same snapshot, so +Inf == _count even mid-update.
        let count = buckets.iter().map(|(_, c)| c).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Builds histograms with fixed bounds for a `Family`.
#[derive(Debug, Clone)]
pub struct HistogramBuilder {
    bounds: Arc<[f64]>,
}

impl HistogramBuilder {
    /// A builder for these bounds.
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.into(),
        }
    }
}

impl MetricConstructor<AtomicHistogram> for HistogramBuilder {
    fn new_metric(&self) -> AtomicHistogram {
        AtomicHistogram::new(&self.bounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_uses_le_semantics() {
        let h = AtomicHistogram::new(&[1.0, 2.0, 5.0]);
        for v in [0.5, 1.0, 1.5, 2.0, 4.0, 100.0] {
            h.observe(v);
        }
        h.observe(f64::NAN);
        assert_eq!(
            h.snapshot(),
            vec![(1.0, 2), (2.0, 2), (5.0, 1), (f64::INFINITY, 1)]
        );
        assert_eq!(h.count(), 6);
        assert!((h.sum() - 109.0).abs() < 1e-9);
    }

    #[test]
    fn the_bucket_count_agrees_with_a_binary_search() {
        let bound_sets: [&[f64]; 4] = [
            &[],
            &[1.0],
            &[
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5,
            ],
            &[-3.0, -1.0, 0.0, 1e-300, 2.0, 1e9],
        ];
        for bounds in bound_sets {
            let mut values = vec![f64::NEG_INFINITY, f64::INFINITY, -0.0, 0.0, 1e-310];
            for &b in bounds {
                values.extend([b, b.next_down(), b.next_up(), b * 0.5, b * 2.0]);
            }
            for v in values {
                assert_eq!(
                    bucket_index(bounds, v),
                    bounds.partition_point(|&b| b < v),
                    "{v} in {bounds:?}"
                );
            }
        }
    }

    #[test]
    fn many_samples_at_once_count_as_one_by_one() {
        let (one_by_one, at_once) = (
            AtomicHistogram::new(&[1.0, 2.0]),
            AtomicHistogram::new(&[1.0, 2.0]),
        );
        let r = RequestRef::new("r", None);
        for (value, n) in [(1.5, 3), (0.0, 4), (7.0, 0), (f64::NAN, 2)] {
            for _ in 0..n {
                one_by_one.observe(value);
            }
            at_once.observe_many_for(value, n, &r);
        }
        assert_eq!(at_once.counts(), one_by_one.counts());
        assert_eq!(at_once.counts(), [4, 3, 0].into());
        assert_eq!(at_once.sum(), 4.5);
        // No samples, no exemplar: the `+Inf` slot stays empty.
        let suffix = |i: usize| {
            let mut out = String::new();
            at_once
                .exemplar_slot(i)
                .expect("a slot")
                .write_suffix(&mut out);
            out
        };
        assert!(suffix(1).contains("request_id=\"r\""), "{}", suffix(1));
        assert_eq!(suffix(2), "");
    }

    #[test]
    fn bad_bounds_are_dropped() {
        let h = AtomicHistogram::new(&[1.0, f64::INFINITY, 0.5, 2.0, f64::NAN]);
        assert_eq!(h.bounds(), &[1.0, 2.0]);
    }

    #[test]
    fn concurrent_observations_are_all_counted() {
        let h = AtomicHistogram::new(&[1.0, 10.0]);
        std::thread::scope(|s| {
            for t in 0..4 {
                let h = h.clone();
                s.spawn(move || {
                    for i in 0..10_000u32 {
                        h.observe(f64::from((i + t) % 20));
                    }
                });
            }
        });
        assert_eq!(h.count(), 40_000);
        // Integers sum exactly in f64: (0+…+19) * 500 per thread.
        assert_eq!(h.sum(), 4.0 * 190.0 * 500.0);
        let snap = h.snapshot();
        assert_eq!(snap[0], (1.0, 4 * 2 * 500));
        assert_eq!(snap[2], (f64::INFINITY, 4 * 9 * 500));
    }

    #[test]
    fn clones_share_state() {
        let h = AtomicHistogram::new(&[1.0]);
        h.clone().observe(3.0);
        assert_eq!(h.count(), 1);
    }
}
