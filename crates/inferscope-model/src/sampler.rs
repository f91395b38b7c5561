//! Per-request sampling with vLLM's stages: stop-token masking, logit bias,
//! repetition/frequency/presence penalties, then greedy, or temperature,
//! min_p, top-k and top-p and a seeded draw.

use inferscope_engine::SamplingParams;

use crate::demo::SplitMix64;
#[cfg(target_arch = "x86_64")]
use crate::isa::{Isa, IsaKind};
use crate::token_counts::TokenCounts;

/// Temperatures below this are greedy.
const GREEDY_BELOW: f32 = 1e-5;

/// The RNG of the token a request generates at index `num_generated`:
/// derived from both so that a recompute after preemption draws the same.
pub fn token_rng(seed: u64, num_generated: usize) -> SplitMix64 {
    let mut mix =
        SplitMix64::new(seed ^ (num_generated as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // One draw decorrelates nearby (seed, index) pairs.
    SplitMix64::new(mix.next_u64())
}

/// Index of the largest logit (the first on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if Isa::get(IsaKind::Avx2).is_some() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { argmax_avx2(logits) };
    }
    argmax_lanes(logits)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn argmax_avx2(logits: &[f32]) -> u32 {
    argmax_lanes(logits)
}

/// [`argmax`] over 8 lanes that each keep their first maximum (a compare
/// and two blends per 8 logits, where one running maximum is a branch per
/// logit: ~70 µs over a 32 000-token vocabulary), then the lanes' best with
/// the lowest index, then the tail.
#[inline(always)]
fn argmax_lanes(logits: &[f32]) -> u32 {
    const L: usize = 8;
    let (mut best, mut best_v) = (0usize, f32::NEG_INFINITY);
    let chunks = logits.chunks_exact(L);
    let tail = chunks.remainder();
    if logits.len() >= L {
        // Lane `l` starts at index `l`: with every logit -inf or NaN the
        // answer is index 0, as with one running maximum.
        let mut lane_v = [f32::NEG_INFINITY; L];
        let mut lane_i: [u32; L] = std::array::from_fn(|l| l as u32);
        for (c, chunk) in chunks.enumerate() {
            let base = (c * L) as u32;
            for l in 0..L {
                let v = chunk[l];
                // Strictly greater: a lane keeps its first maximum; NaN
                // compares false.
                let take = v > lane_v[l];
                lane_v[l] = if take { v } else { lane_v[l] };
                lane_i[l] = if take { base + l as u32 } else { lane_i[l] };
            }
        }
        best_v = lane_v[0];
        best = lane_i[0] as usize;
        for l in 1..L {
            let (v, i) = (lane_v[l], lane_i[l] as usize);
            if v > best_v || (v == best_v && i < best) {
                best_v = v;
                best = i;
            }
        }
    }
    let start = logits.len() - tail.len();
    for (i, &v) in tail.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = start + i;
        }
    }
    best as u32
}

/// Samples tokens, reusing its candidate buffer from token to token.
///
/// The stages and their order are vLLM's: on the raw logits (where a
/// log-probability would be taken) the ids outside `allowed_token_ids` and
/// the masked ids go to -inf, then `logit_bias`, then the penalties
/// (repetition, frequency, presence); a
/// greedy request takes the argmax there; otherwise temperature, `min_p`,
/// top-k, top-p, and a draw.
#[derive(Debug, Default)]
pub struct Sampler {
    /// (token, logit then weight) of the tokens still in the running.
    cand: Vec<(u32, f32)>,
    /// The last token came from a draw (not the argmax): `cand` holds the
    /// tokens the draw kept and their weights.
    drew: bool,
}

impl Sampler {
    /// Samples one token from `logits` (modified in place). `masked` ids get
    /// -inf first (EOS and stop tokens before `min_tokens`, the tokens that
    /// would complete one of the `bad_words`); `counts` are
    /// the sequence's tokens, required when the parameters use them.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        params: &SamplingParams,
        masked: &[u32],
        counts: Option<&TokenCounts>,
        rng: &mut SplitMix64,
    ) -> u32 {
        // `logits` are raw up to here.
        process_logits(logits, params, masked, counts);
        self.drew = false;
        if params.temperature < GREEDY_BELOW || params.top_k == 1 {
            return argmax(logits);
        }
        self.drew = true;
        self.draw(logits, params, rng)
    }

    /// After [`Sampler::sample`] on `logits`: the log-probabilities the
    /// draw used (`--logprobs-mode processed_logprobs`), `token`'s and the
    /// `n` most likely. A greedy request's are the log-softmax of the
    /// processed logits (no temperature, as vLLM); a drawn one's are its
    /// weights after temperature, `min_p`, top-k and top-p, normalised over
    /// the tokens kept (the others are -inf).
    pub fn processed_logprobs(
        &self,
        logits: &[f32],
        token: u32,
        n: usize,
    ) -> inferscope_engine::PositionLogprobs {
        if !self.drew || self.cand.is_empty() {
            return crate::logprobs::position_logprobs(logits, token, n);
        }
        // `cand` is sorted by logit, so by weight: its head is the top.
        let ln_total = f64::from(self.cand.iter().map(|c| c.1).sum::<f32>()).ln();
        let lp = |w: f32| (f64::from(w).ln() - ln_total) as f32;
        let (logprob, rank) = match self.cand.iter().position(|c| c.0 == token) {
            // Sorted by weight: ties before it count as more likely only
            // when strictly heavier.
            Some(i) => {
                let w = self.cand[i].1;
                let above = self.cand.iter().filter(|c| c.1 > w).count();
                (lp(w), 1 + above as u32)
            }
            None => (f32::NEG_INFINITY, 1 + self.cand.len() as u32),
        };
        let mut top: Vec<(u32, f32)> = self.cand.iter().take(n).map(|c| (c.0, lp(c.1))).collect();
        // Fewer kept than asked for: the rest are -inf, lowest ids first.
        let mut id = 0u32;
        while top.len() < n && (id as usize) < logits.len() {
            if !self.cand.iter().any(|c| c.0 == id) {
                top.push((id, f32::NEG_INFINITY));
            }
            id += 1;
        }
        inferscope_engine::PositionLogprobs {
            token_id: token,
            logprob,
            rank,
            top,
        }
    }

    /// Temperature, `min_p`, top-k and top-p over the processed logits, then
    /// a draw from what is left.
    fn draw(&mut self, logits: &[f32], params: &SamplingParams, rng: &mut SplitMix64) -> u32 {
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l)),
        );
        if cand.is_empty() {
            return argmax(logits);
        }
        // Descending by logit, then by id: a total, deterministic order.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        // Top-k and min_p both keep a head of this order, so they commute;
        // top-k first keeps the sort short.
        if params.top_k > 0 && params.top_k < cand.len() {
            cand.select_nth_unstable_by(params.top_k - 1, by_logit);
            cand.truncate(params.top_k);
        }
        cand.sort_unstable_by(by_logit);
        let max = cand[0].1;
        let inv_t = 1.0 / params.temperature;
        // Weights relative to the most likely token (which weighs 1), so
        // min_p compares each weight with min_p itself.
        for c in cand.iter_mut() {
            c.1 = ((c.1 - max) * inv_t).exp();
        }
        if params.min_p > 0.0 {
            let keep = cand.partition_point(|c| c.1 >= params.min_p);
            cand.truncate(keep.max(1));
        }
        let mut total: f32 = cand.iter().map(|c| c.1).sum();
        if params.top_p < 1.0 {
            let keep_mass = params.top_p.max(0.0) * total;
            let mut acc = 0f32;
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                acc += c.1;
                if acc >= keep_mass {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
            total = cand.iter().map(|c| c.1).sum();
        }
        let mut r = rng.next_f32() * total;
        for c in cand.iter() {
            if r < c.1 {
                return c.0;
            }
            r -= c.1;
        }
        cand[cand.len() - 1].0
    }
}

/// The stages that can change the argmax, in place on the raw logits:
/// ids outside `allowed_token_ids` and `masked` ids to -inf, `logit_bias`,
/// then the penalties.
pub fn process_logits(
    logits: &mut [f32],
    params: &SamplingParams,
    masked: &[u32],
    counts: Option<&TokenCounts>,
) {
    if !params.allowed_token_ids.is_empty() {
        // Sorted ids: one merge walk over the row, no allocation.
        let mut allowed = params.allowed_token_ids.iter().peekable();
        for (id, l) in logits.iter_mut().enumerate() {
            if allowed.next_if(|&&a| a as usize == id).is_none() {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    for &id in masked {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    for &(id, bias) in &params.logit_bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += bias;
        }
    }
    if let Some(counts) = counts
        && params.uses_token_counts()
    {
        apply_penalties(logits, params, counts);
    }
}

/// vLLM's penalties, on the tokens `counts` holds (every other logit is
/// unchanged): the repetition penalty on tokens of the prompt or the output
/// (a positive logit divided by it, a negative one multiplied, so both move
/// down for a penalty above 1), then `frequency_penalty` times the output
/// count and `presence_penalty` once for a token the output holds.
pub fn apply_penalties(logits: &mut [f32], params: &SamplingParams, counts: &TokenCounts) {
    let rep = params.repetition_penalty;
    for (id, c) in counts.iter() {
        let Some(l) = logits.get_mut(id as usize) else {
            continue;
        };
        if rep != 1.0 {
            // Clamped: a tiny penalty must not turn a logit into +inf,
            // which the draw would drop instead of favouring.
            *l = if *l > 0.0 {
                (*l / rep).min(f32::MAX)
            } else {
                *l * rep
            };
        }
        if c.output > 0 {
            *l -= params.frequency_penalty * c.output as f32 + params.presence_penalty;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferscope_engine::BadWords;

    fn sample(
        logits: &mut [f32],
        params: &SamplingParams,
        masked: &[u32],
        rng: &mut SplitMix64,
    ) -> u32 {
        Sampler::default().sample(logits, params, masked, None, rng)
    }

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..SamplingParams::default()
        }
    }

    /// One running maximum: the definition the lanes must match.
    fn argmax_reference(logits: &[f32]) -> u32 {
        let (mut best, mut best_v) = (0, f32::NEG_INFINITY);
        for (i, &v) in logits.iter().enumerate() {
            if v > best_v {
                best_v = v;
                best = i;
            }
        }
        best as u32
    }

    /// The lanes give the first maximum, skip NaN, and handle every length
    /// and tail, with and without AVX2: on random logits drawn from a few
    /// values (so ties across and within lanes are common), with NaN and
    /// -inf mixed in, and on all--inf/NaN vectors.
    #[test]
    fn argmax_is_the_first_maximum() {
        let mut rng = SplitMix64::new(3);
        let palette = [1.0, 2.0, 2.0, -3.0, f32::NAN, f32::NEG_INFINITY, 0.5, 2.5];
        let mut cases: Vec<Vec<f32>> = Vec::new();
        for len in (0..70).chain([255, 256, 257, 32_000]) {
            for _ in 0..20 {
                let v: Vec<f32> = (0..len)
                    .map(|_| palette[(rng.next_u64() % palette.len() as u64) as usize])
                    .collect();
                cases.push(v);
            }
            cases.push(vec![f32::NAN; len]);
            cases.push(vec![f32::NEG_INFINITY; len]);
            cases.push((0..len).map(|i| (i % 5) as f32).collect());
        }
        for v in &cases {
            let want = argmax_reference(v);
            assert_eq!(argmax_lanes(v), want, "{v:?}");
            assert_eq!(argmax(v), want, "{v:?}");
        }
    }

    #[test]
    fn greedy_picks_max_and_respects_mask() {
        let mut l = vec![0.0, 3.0, 1.0, 2.0];
        assert_eq!(
            sample(&mut l, &params(0.0, 0, 1.0), &[], &mut token_rng(1, 0)),
            1
        );
        let mut l = vec![0.0, 3.0, 1.0, 2.0];
        assert_eq!(
            sample(&mut l, &params(0.0, 0, 1.0), &[1], &mut token_rng(1, 0)),
            3
        );
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support() {
        let logits = vec![5.0, 4.9, 4.8, -10.0, 0.0];
        for i in 0..200 {
            let mut l = logits.clone();
            let t = sample(&mut l, &params(1.0, 2, 1.0), &[], &mut token_rng(7, i));
            assert!(t == 0 || t == 1, "top_k=2 sampled {t}");
            let mut l = logits.clone();
            let t = sample(&mut l, &params(1.0, 0, 0.3), &[], &mut token_rng(7, i));
            assert!(t <= 1, "top_p=0.3 sampled {t}");
        }
    }

    #[test]
    fn sampling_is_repeatable_and_varies() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let p = params(1.0, 0, 1.0);
        let draw = |seed, i| sample(&mut logits.clone(), &p, &[], &mut token_rng(seed, i));
        let a: Vec<u32> = (0..30).map(|i| draw(42, i)).collect();
        let b: Vec<u32> = (0..30).map(|i| draw(42, i)).collect();
        let c: Vec<u32> = (0..30).map(|i| draw(43, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 5);
    }

    /// Prompt [0, 1, 5], output [1, 2, 2, 4] over six logits.
    fn counts() -> TokenCounts {
        let mut c = TokenCounts::new(3);
        c.extend(0, [0, 1, 5, 1, 2, 2, 4]).unwrap();
        c
    }

    const LOGITS: [f32; 6] = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0];

    fn penalised(presence: f32, frequency: f32, repetition: f32) -> Vec<f32> {
        let p = SamplingParams {
            presence_penalty: presence,
            frequency_penalty: frequency,
            repetition_penalty: repetition,
            ..SamplingParams::default()
        };
        let mut l = LOGITS.to_vec();
        process_logits(&mut l, &p, &[], Some(&counts()));
        l
    }

    /// Each penalty alone and all three together, against the values worked
    /// out by hand from vLLM's definitions.
    #[test]
    fn penalties_match_a_hand_computation() {
        // Presence: once per token the output holds (1, 2, 4), never a
        // prompt-only token (0, 5).
        assert_eq!(
            penalised(0.25, 0.0, 1.0),
            [2.0, -1.25, 0.25, 3.0, -2.25, 1.0]
        );
        // Frequency: times the output count (1 once, 2 twice, 4 once).
        assert_eq!(penalised(0.0, 0.5, 1.0), [2.0, -1.5, -0.5, 3.0, -2.5, 1.0]);
        // Repetition over prompt and output: positives halved, negatives
        // doubled; 3 occurs nowhere.
        assert_eq!(penalised(0.0, 0.0, 2.0), [1.0, -2.0, 0.25, 3.0, -4.0, 0.5]);
        // All three: repetition first, then frequency and presence.
        assert_eq!(
            penalised(0.25, 0.5, 2.0),
            [1.0, -2.75, -1.0, 3.0, -4.75, 0.5]
        );
        // A tiny repetition penalty saturates a positive logit at f32::MAX
        // rather than +inf.
        assert_eq!(penalised(0.0, 0.0, 1e-40)[0], f32::MAX);
        // Negative presence and frequency reward instead.
        assert_eq!(penalised(-1.0, -1.0, 1.0), [2.0, 1.0, 3.5, 3.0, 0.0, 1.0]);
        // Neutral values change nothing, and no counts means no penalty.
        assert_eq!(penalised(0.0, 0.0, 1.0), LOGITS);
        let mut l = LOGITS.to_vec();
        let p = SamplingParams {
            presence_penalty: 1.0,
            ..SamplingParams::default()
        };
        process_logits(&mut l, &p, &[], None);
        assert_eq!(l, LOGITS);
    }

    /// `bad_words` on known logits (best first: 3, 0, 5, 2, 1, 4): the
    /// executor masks what [`BadWords::banned`] names after the output so
    /// far, and greedy takes the best of the rest. A one-token word is
    /// always banned, a longer word's last token only right after the rest
    /// of it, never after a part of it.
    #[test]
    fn bad_words_ban_the_completion_of_a_prefix() {
        let bad = BadWords::new([vec![3], vec![1, 0], vec![2, 4, 0]]);
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let pick = |output: &[u32]| {
            let masked: Vec<u32> = bad.banned(output).collect();
            let mut l = LOGITS.to_vec();
            let t = sample(&mut l, &greedy, &masked, &mut token_rng(1, 0));
            let inf = l.iter().filter(|x| x.is_infinite()).count();
            (t, inf)
        };
        assert_eq!(pick(&[]), (0, 1), "3 is banned from the start");
        assert_eq!(pick(&[1]), (5, 2), "0 after 1");
        assert_eq!(pick(&[5, 2, 1]), (5, 2), "0 after 1");
        assert_eq!(pick(&[1, 2]), (0, 1), "1 is not the last token");
        assert_eq!(pick(&[2, 4]), (5, 2), "0 after 2, 4");
        assert_eq!(pick(&[4]), (0, 1), "4 alone is half a prefix");
        assert_eq!(pick(&[2, 5, 4]), (0, 1), "2, 4 not back to back");
        assert_eq!(pick(&[4, 2]), (0, 1), "the prefix reversed");
    }

    /// Only the allowed ids keep their logits: the argmax and every draw
    /// come from them, and the bias of an id outside them does not help it.
    #[test]
    fn allowed_token_ids_restrict_the_draw() {
        let p = SamplingParams {
            allowed_token_ids: vec![2, 4],
            logit_bias: vec![(1, 50.0), (4, 1.0)],
            ..SamplingParams::default()
        };
        let mut l = LOGITS.to_vec();
        process_logits(&mut l, &p, &[], None);
        let inf = f32::NEG_INFINITY;
        assert_eq!(l, [inf, inf, LOGITS[2], inf, LOGITS[4] + 1.0, inf]);
        for seed in 0..50 {
            let mut l = LOGITS.to_vec();
            let t = sample(&mut l, &p, &[], &mut token_rng(seed, 0));
            assert!(t == 2 || t == 4, "{t}");
        }
    }

    /// The bias is added to the raw logit before the penalties see it (so
    /// the repetition penalty divides the biased, now positive, logit), and
    /// it moves the argmax.
    #[test]
    fn logit_bias_comes_before_the_penalties() {
        let p = SamplingParams {
            logit_bias: vec![(1, 4.0), (3, -100.0)],
            ..SamplingParams::default()
        };
        let mut l = LOGITS.to_vec();
        process_logits(&mut l, &p, &[], None);
        assert_eq!(l, [2.0, 3.0, 0.5, -97.0, -2.0, 1.0]);
        let greedy = SamplingParams {
            temperature: 0.0,
            ..p.clone()
        };
        let mut l = LOGITS.to_vec();
        assert_eq!(sample(&mut l, &greedy, &[], &mut token_rng(1, 0)), 1);
        // -1 + 4 = 3, halved: 1.5 (penalty first would give -2 + 4 = 2).
        let both = SamplingParams {
            repetition_penalty: 2.0,
            ..p
        };
        let mut l = LOGITS.to_vec();
        process_logits(&mut l, &both, &[], Some(&counts()));
        assert_eq!(l[1], 1.5);
    }

    /// The tokens `min_p` leaves: those whose probability after temperature
    /// is at least `min_p` times the largest, computed directly.
    #[test]
    fn min_p_keeps_tokens_above_its_fraction_of_the_top() {
        // Probabilities relative to the top: 1, 0.5, 0.2, 0.05.
        let logits = [0.0f32, 0.5f32.ln(), 0.2f32.ln(), 0.05f32.ln()];
        let support = |temperature: f32, min_p: f32| {
            let p = SamplingParams {
                temperature,
                min_p,
                ..SamplingParams::default()
            };
            let mut seen = [false; 4];
            let mut sampler = Sampler::default();
            for i in 0..2000 {
                let mut l = logits.to_vec();
                let t = sampler.sample(&mut l, &p, &[], None, &mut token_rng(5, i));
                seen[t as usize] = true;
            }
            seen
        };
        // Direct: relative probability exp((l - max) / T) >= min_p.
        let direct = |temperature: f32, min_p: f32| {
            logits.map(|l| ((l - logits[0]) / temperature).exp() >= min_p)
        };
        for (t, m) in [(1.0, 0.1), (1.0, 0.3), (1.0, 0.6), (2.0, 0.3), (1.0, 0.0)] {
            assert_eq!(support(t, m), direct(t, m), "temperature {t}, min_p {m}");
        }
        // The cases above differ from each other, so the check has teeth.
        assert_eq!(direct(1.0, 0.3), [true, true, false, false]);
        assert_eq!(direct(2.0, 0.3), [true, true, true, false]);
    }

    /// `processed_logprobs`: a drawn request's values are its weights after
    /// temperature and top-k, renormalised over the tokens kept (the rest
    /// -inf), computed directly; a greedy one's the log-softmax of the
    /// processed (biased) logits.
    #[test]
    fn processed_logprobs_follow_the_draw() {
        let logits = [2.0f32, 1.0, 0.5, -1.0, 3.0];
        let p = SamplingParams {
            temperature: 0.5,
            top_k: 3,
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::default();
        let mut l = logits.to_vec();
        let t = sampler.sample(&mut l, &p, &[], None, &mut token_rng(9, 0));
        let lp = sampler.processed_logprobs(&l, t, 4);
        // Direct: the top 3 (ids 4, 0, 1) at temperature 0.5.
        let kept = [4usize, 0, 1];
        let z: f64 = kept
            .iter()
            .map(|&i| (f64::from(logits[i]) / 0.5).exp())
            .sum();
        let direct = |i: usize| (f64::from(logits[i]) / 0.5 - z.ln()) as f32;
        assert!(kept.contains(&(t as usize)));
        assert!((lp.logprob - direct(t as usize)).abs() < 1e-5, "{lp:?}");
        for (k, &i) in kept.iter().enumerate() {
            assert_eq!(lp.top[k].0 as usize, i);
            assert!((lp.top[k].1 - direct(i)).abs() < 1e-5, "{lp:?}");
        }
        assert_eq!(lp.top[3].1, f32::NEG_INFINITY, "outside top-k");
        // Greedy: log-softmax of the biased logits, no temperature.
        let g = SamplingParams {
            temperature: 0.0,
            logit_bias: vec![(3, 10.0)],
            ..SamplingParams::default()
        };
        let mut l = logits.to_vec();
        let t = sampler.sample(&mut l, &g, &[], None, &mut token_rng(9, 0));
        assert_eq!(t, 3);
        let lp = sampler.processed_logprobs(&l, t, 1);
        let biased = [2.0f32, 1.0, 0.5, 9.0, 3.0];
        let z: f64 = biased.iter().map(|&x| f64::from(x).exp()).sum();
        assert!((f64::from(lp.logprob) - (9.0 - z.ln())).abs() < 1e-5);
    }
}
