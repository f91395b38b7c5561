//! Log-probabilities of a logits row: the log-softmax normaliser, the
//! most likely tokens, and which values are reported (`--logprobs-mode`).

use inferscope_engine::PositionLogprobs;

/// Which logits the reported log-probabilities are taken from (vLLM's
/// `--logprobs-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogprobsMode {
    /// The model's raw logits, before any sampling stage (vLLM's default).
    #[default]
    RawLogprobs,
    /// The logits the draw uses: after masks, `logit_bias`, penalties,
    /// temperature, `min_p`, top-k and top-p (tokens they drop are -inf).
    ProcessedLogprobs,
}

/// `ln Σ exp(l)` over `logits`, accumulated in f64 from the maximum, so
/// `l - log_sum_exp(logits)` is the log-softmax. `-inf` when every logit is.
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    (f64::from(max) + sum.ln()) as f32
}

/// The `n` largest of `logits` as (id, logit), largest first, ties broken
/// by the lower id; NaN never counts. One pass with a short sorted list.
pub fn top_n(logits: &[f32], n: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    if n == 0 {
        return;
    }
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || (out.len() == n && l <= out[n - 1].1) {
            continue;
        }
        // After every entry at least as large: ties keep the lower id first.
        let at = out.partition_point(|&(_, v)| v >= l);
        if out.len() == n {
            out.pop();
        }
        out.insert(at, (i as u32, l));
    }
}

/// The log-probabilities at a row: `token`'s and the `n` most likely, as
/// the log-softmax of `logits`.
pub fn position_logprobs(logits: &[f32], token: u32, n: usize) -> PositionLogprobs {
    let lse = log_sum_exp(logits);
    let mut top = Vec::with_capacity(n);
    top_n(logits, n, &mut top);
    for t in &mut top {
        t.1 -= lse;
    }
    let chosen = logits
        .get(token as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    PositionLogprobs {
        token_id: token,
        logprob: chosen - lse,
        rank: rank_of(logits, chosen),
        top,
    }
}

/// 1 + the number of logits strictly above `value` (vLLM's rank).
pub fn rank_of(logits: &[f32], value: f32) -> u32 {
    1 + logits.iter().filter(|&&l| l > value).count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a direct computation: exp of the log-probabilities sums to
    /// one, their differences are the logits', and the top list is sorted.
    #[test]
    fn log_softmax_and_top_n_match_a_direct_computation() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5, f32::NEG_INFINITY];
        let lp = position_logprobs(&logits, 4, 3);
        let direct = |i: usize| {
            let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
            (f64::from(logits[i]).exp() / z).ln() as f32
        };
        assert!((lp.logprob - direct(4)).abs() < 1e-6);
        assert_eq!(lp.rank, 4, "below 3.0, 3.0 and 1.0");
        assert_eq!(
            lp.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 3, 0],
            "largest first, ties by lower id"
        );
        for &(id, v) in &lp.top {
            assert!((v - direct(id as usize)).abs() < 1e-6);
        }
        let total: f64 = (0..logits.len()).map(|i| f64::from(direct(i)).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(position_logprobs(&logits, 5, 0).logprob, f32::NEG_INFINITY);
        assert!(position_logprobs(&logits, 5, 0).top.is_empty());
        let mut out = Vec::new();
        top_n(&[f32::NAN, 2.0, 1.0], 5, &mut out);
        assert_eq!(out, vec![(1, 2.0), (2, 1.0)]);
    }
}
