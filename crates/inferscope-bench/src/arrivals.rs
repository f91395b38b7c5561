//! Arrival process: when each request is sent, relative to the start.

use crate::rng::Rng;
use std::time::Duration;

/// Latest send offset a schedule may hold.
const MAX_OFFSET: Duration = Duration::from_secs(1_000_000_000);

/// Send offsets from the start of the run for `n` requests.
///
/// The first request goes at 0; the gaps between requests are drawn from a
/// gamma distribution of shape `burstiness` and mean `1 / rate` (shape 1 is a
/// Poisson process). An infinite rate sends everything at once.
pub fn schedule(n: usize, rate: f64, burstiness: f64, rng: &mut Rng) -> Vec<Duration> {
    if !rate.is_finite() {
        return vec![Duration::ZERO; n];
    }
    let gaps = gaps(n.saturating_sub(1), rate, burstiness, rng);
    let mut t = 0.0;
    let mut out = Vec::with_capacity(n);
    if n > 0 {
        out.push(Duration::ZERO);
    }
    for g in gaps {
        t += g;
        // Clamped: absurd rates must not overflow the schedule (about 30 years).
        out.push(
            Duration::try_from_secs_f64(t)
                .unwrap_or(MAX_OFFSET)
                .min(MAX_OFFSET),
        );
    }
    out
}

/// `n` inter-arrival gaps in seconds (gamma, shape `burstiness`, mean `1/rate`).
pub fn gaps(n: usize, rate: f64, burstiness: f64, rng: &mut Rng) -> Vec<f64> {
    let scale = 1.0 / (rate * burstiness);
    (0..n).map(|_| rng.gamma(burstiness, scale)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_cv(xs: &[f64]) -> (f64, f64) {
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64;
        (m, var.sqrt() / m)
    }

    #[test]
    fn gamma_arrivals_have_configured_rate_and_cv() {
        for (rate, burstiness) in [(10.0, 1.0), (250.0, 0.5), (3.0, 4.0), (1000.0, 0.25)] {
            let mut rng = Rng::new(42);
            let g = gaps(10_000, rate, burstiness, &mut rng);
            let (m, cv) = mean_cv(&g);
            let got_rate = 1.0 / m;
            assert!(
                (got_rate / rate - 1.0).abs() < 0.05,
                "rate {rate} burstiness {burstiness}: got {got_rate}"
            );
            let want_cv = 1.0 / burstiness.sqrt();
            assert!(
                (cv / want_cv - 1.0).abs() < 0.08,
                "rate {rate} burstiness {burstiness}: cv {cv}, want {want_cv}"
            );
        }
    }

    #[test]
    fn infinite_rate_sends_at_once_and_schedule_is_increasing() {
        let mut rng = Rng::new(0);
        assert!(
            schedule(5, f64::INFINITY, 1.0, &mut rng)
                .iter()
                .all(|d| d.is_zero())
        );
        let s = schedule(100, 50.0, 1.0, &mut rng);
        assert_eq!(s.len(), 100);
        assert_eq!(s[0], Duration::ZERO);
        assert!(s.windows(2).all(|w| w[0] <= w[1]));
    }
}
