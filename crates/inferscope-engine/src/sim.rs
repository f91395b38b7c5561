//! A simulated accelerator: each step takes the time a roofline cost model
//! gives and really waits that long, so the host side runs for real at the
//! scale of a GPU.
//!
//! One step costs
//! `t = t_fixed + n_prefill_tokens·t_prefill + [decodes present]·t_weights + n_context_tokens·t_kv`:
//! prefill is compute-bound (FLOPs per token), a decode step streams the
//! weights once for the whole batch, and attention streams each sequence's KV.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cost::ModelCost;
use crate::executor::{
    Executor, ExecutorError, LogprobRow, ScheduledBatch, ScheduledSeq, StepCost, StepOutput,
};
use crate::request::PositionLogprobs;
use crate::structured::TokenMask;

/// Cost-model parameters of a simulated device and model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimProfile {
    /// Profile name (for logs and `cache_config_info`).
    pub name: String,
    /// Per-step launch and synchronisation cost, seconds.
    pub t_fixed: f64,
    /// Compute time per prefill token, seconds.
    pub t_prefill: f64,
    /// Time to stream the weights once (a decode step), seconds.
    pub t_weights: f64,
    /// Time to read one token's keys and values, seconds.
    pub t_kv: f64,
    /// KV cache capacity in tokens.
    pub kv_capacity_tokens: usize,
    /// The simulated model's FLOPs and bytes per token and the device's peak
    /// (`--enable-mfu-metrics`); a custom profile keeps its base's.
    #[serde(default = "default_cost")]
    pub cost: ModelCost,
    /// Test only: an injected death ([`SimFaults::die_after_steps`]) is a
    /// panic inside `execute` instead of a fatal error. It lives in the
    /// profile (key `die_by_panic=1`) so that a server test reaches it
    /// through `--sim-profile` without a flag of its own.
    #[serde(skip)]
    pub die_by_panic: bool,
}

/// Override keys: name, factor from the key's unit to seconds, largest value.
///
/// The bounds are far beyond any real device (a minute per step, a second per
/// prefill token, a millisecond per KV token) yet keep every modelled step
/// time finite and representable as a `Duration`.
const TIME_KEYS: &[(&str, f64, f64)] = &[
    ("t_fixed_ms", 1e-3, 60_000.0),
    ("t_prefill_us", 1e-6, 1e6),
    ("t_weights_ms", 1e-3, 60_000.0),
    ("t_kv_ns", 1e-9, 1e6),
];

fn default_cost() -> ModelCost {
    ModelCost::llama3_8b(H100_PEAK_FLOPS)
}

/// H100 and H200 SXM dense bf16 peak, FLOP/s.
const H100_PEAK_FLOPS: f64 = 989e12;

/// Largest KV capacity a profile may claim, in tokens.
const MAX_KV_TOKENS: usize = 1_000_000_000;

/// The built-in profiles: name, then the reasoning behind the figures.
///
/// Llama-3-8B: ~16 GB of bf16 weights, ~16 GFLOP per token, KV of
/// 2·32 layers·8 heads·128 dims·2 B = 128 KiB per token. Prefill at ~50% MFU;
/// KV capacity is 90% of HBM less the weights.
/// The last figure is the device's peak FLOP/s (MFU's denominator).
const PROFILES: &[(&str, f64, f64, f64, f64, usize, f64)] = &[
    // 3.35 TB/s HBM, 989 TFLOP/s bf16, 80 GB.
    (
        "h100-llama3-8b",
        0.3e-3,
        30e-6,
        4.8e-3,
        39e-9,
        430_000,
        H100_PEAK_FLOPS,
    ),
    // 4.8 TB/s HBM, 989 TFLOP/s bf16, 141 GB.
    (
        "h200-llama3-8b",
        0.3e-3,
        30e-6,
        3.3e-3,
        27e-9,
        846_000,
        H100_PEAK_FLOPS,
    ),
    // 2.0 TB/s HBM, 312 TFLOP/s bf16, 80 GB.
    (
        "a100-llama3-8b",
        0.4e-3,
        100e-6,
        8.0e-3,
        65e-9,
        430_000,
        312e12,
    ),
    // A fast toy device for tests and demos on small machines: a fictional
    // peak at which its prefill runs at ~50% MFU, like the others.
    ("tiny", 50e-6, 0.5e-6, 0.2e-3, 1e-9, 65_536, 60e15),
];

impl SimProfile {
    /// Names of the built-in profiles.
    pub fn names() -> impl Iterator<Item = &'static str> {
        PROFILES.iter().map(|p| p.0)
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Option<Self> {
        PROFILES.iter().find(|p| p.0 == name).map(
            |&(name, t_fixed, t_prefill, t_weights, t_kv, kv, peak)| Self {
                name: name.to_owned(),
                t_fixed,
                t_prefill,
                t_weights,
                t_kv,
                kv_capacity_tokens: kv,
                cost: ModelCost::llama3_8b(peak),
                die_by_panic: false,
            },
        )
    }

    /// Checks that every number is finite, non-negative and within its
    /// bound, so that no step time can overflow (or be NaN) at run time.
    pub fn validate(&self) -> Result<(), SimProfileError> {
        let fields = [self.t_fixed, self.t_prefill, self.t_weights, self.t_kv];
        for (&(key, factor, max), seconds) in TIME_KEYS.iter().zip(fields) {
            let value = seconds / factor;
            // Compared in seconds, with room for the rounding of the unit factor.
            if !seconds.is_finite() || seconds < 0.0 || seconds > max * factor * (1.0 + 1e-9) {
                return Err(SimProfileError::OutOfRange {
                    key,
                    value: value.to_string(),
                    max: max.to_string(),
                });
            }
        }
        if !(1..=MAX_KV_TOKENS).contains(&self.kv_capacity_tokens) {
            return Err(SimProfileError::OutOfRange {
                key: "kv_tokens",
                value: self.kv_capacity_tokens.to_string(),
                max: MAX_KV_TOKENS.to_string(),
            });
        }
        Ok(())
    }

    /// The modelled time of one step.
    pub fn step_time(&self, batch: &ScheduledBatch) -> Duration {
        let mut prefill = 0usize;
        let mut decodes = false;
        for s in &batch.seqs {
            if s.is_prefill {
                prefill += s.num_tokens;
            } else {
                decodes = true;
            }
        }
        let t = self.t_fixed
            + prefill as f64 * self.t_prefill
            + if decodes { self.t_weights } else { 0.0 }
            + batch.num_context_tokens() as f64 * self.t_kv;
        // A validated profile stays far below the limit; saturate rather
        // than panic for one built by hand.
        Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX)
    }
}

/// Error parsing a `--sim-profile` value.
#[derive(Debug, thiserror::Error)]
pub enum SimProfileError {
    /// The base name is not a built-in profile.
    #[error("unknown sim profile `{0}` (built-in: {known})", known = SimProfile::names().collect::<Vec<_>>().join(", "))]
    UnknownProfile(String),
    /// An override is not `key=value` with a known key and a number.
    #[error(
        "bad sim profile override `{0}`: expected key=value with key one of t_fixed_ms, t_prefill_us, t_weights_ms, t_kv_ns, kv_tokens"
    )]
    BadOverride(String),
    /// A number is negative, not finite, or beyond its bound.
    #[error(
        "sim profile `{key}` = {value} is out of range: it must be finite, at least 0 (kv_tokens: at least 1) and at most {max}"
    )]
    OutOfRange {
        /// The override key.
        key: &'static str,
        /// The value given, in the key's unit.
        value: String,
        /// The largest value allowed, in the key's unit.
        max: String,
    },
}

impl FromStr for SimProfile {
    type Err = SimProfileError;

    /// `NAME` or `NAME,key=value,...`; a list starting with `key=value`
    /// overrides `h100-llama3-8b`. Keys: `t_fixed_ms`, `t_prefill_us`,
    /// `t_weights_ms`, `t_kv_ns`, `kv_tokens`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .peekable();
        let base = match parts.peek() {
            Some(first) if !first.contains('=') => {
                let name = parts.next().unwrap_or_default();
                Self::builtin(name)
                    .ok_or_else(|| SimProfileError::UnknownProfile(name.to_owned()))?
            }
            _ => {
                let mut p = Self::builtin("h100-llama3-8b")
                    .ok_or_else(|| SimProfileError::UnknownProfile("h100-llama3-8b".into()))?;
                p.name = "custom".to_owned();
                p
            }
        };
        let mut p = base;
        for kv in parts {
            let bad = || SimProfileError::BadOverride(kv.to_owned());
            let (k, v) = kv.split_once('=').ok_or_else(bad)?;
            let v: f64 = v.trim().parse().map_err(|_| bad())?;
            let k = k.trim();
            if let Some(&(key, factor, max)) = TIME_KEYS.iter().find(|t| t.0 == k) {
                if !v.is_finite() || !(0.0..=max).contains(&v) {
                    return Err(SimProfileError::OutOfRange {
                        key,
                        value: v.to_string(),
                        max: max.to_string(),
                    });
                }
                let seconds = v * factor;
                match key {
                    "t_fixed_ms" => p.t_fixed = seconds,
                    "t_prefill_us" => p.t_prefill = seconds,
                    "t_weights_ms" => p.t_weights = seconds,
                    _ => p.t_kv = seconds,
                }
                continue;
            }
            match k {
                "kv_tokens" => {
                    // `as usize` would quietly truncate 1.5 or saturate 1e300.
                    if !v.is_finite()
                        || v.fract() != 0.0
                        || !(1.0..=MAX_KV_TOKENS as f64).contains(&v)
                    {
                        return Err(SimProfileError::OutOfRange {
                            key: "kv_tokens",
                            value: v.to_string(),
                            max: MAX_KV_TOKENS.to_string(),
                        });
                    }
                    p.kv_capacity_tokens = v as usize;
                }
                "die_by_panic" if v == 0.0 || v == 1.0 => p.die_by_panic = v == 1.0,
                _ => return Err(bad()),
            }
        }
        p.validate()?;
        Ok(p)
    }
}

impl fmt::Display for SimProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (t_fixed {:.3} ms, t_prefill {:.1} µs/token, t_weights {:.2} ms, t_kv {:.0} ns/token, KV {} tokens)",
            self.name,
            self.t_fixed * 1e3,
            self.t_prefill * 1e6,
            self.t_weights * 1e3,
            self.t_kv * 1e9,
            self.kv_capacity_tokens
        )?;
        if self.die_by_panic {
            write!(f, ", injected deaths panic (test only)")?;
        }
        Ok(())
    }
}

/// What the simulated model's tokens look like.
#[derive(Debug, Clone, PartialEq)]
pub struct SimTokens {
    /// Ordinary tokens are drawn uniformly from `lo..hi`.
    pub lo: u32,
    /// Exclusive upper bound.
    pub hi: u32,
    /// The EOS token id.
    pub eos_token_id: u32,
    /// Chance that a token is EOS (where EOS is not masked).
    pub eos_probability: f64,
}

impl Default for SimTokens {
    /// Printable ASCII for a byte-level vocabulary, EOS at 257, mean output
    /// length ~128 tokens.
    fn default() -> Self {
        Self {
            lo: 32,
            hi: 127,
            eos_token_id: 257,
            eos_probability: 1.0 / 128.0,
        }
    }
}

impl SimTokens {
    /// Token ids the simulated model knows: `0..vocab_size()`.
    pub fn vocab_size(&self) -> u32 {
        self.hi.max(self.eos_token_id + 1).max(1)
    }

    /// The sim's synthetic distribution at a position whose chosen token is
    /// `token`: a geometric one over a rotation of the vocabulary, with
    /// `token` the most likely, then `token + 1`, `token + 2`, … (mod the
    /// vocabulary), each half as likely as the one before. Deterministic and
    /// normalised (the log-probabilities of all tokens sum to 1 in
    /// probability), but not what the sim's draw follows.
    pub fn synthetic_logprobs(&self, token: u32, top: usize) -> PositionLogprobs {
        let v = self.vocab_size();
        // ln P(rank i) = ln(1 - q) + i ln q - ln(1 - q^V), q = 1/2.
        let ln_q = 0.5f64.ln();
        let norm = (1.0 - 0.5f64.powi(v.min(1 << 20) as i32)).ln();
        let lp = |rank: u32| ((1.0 - 0.5f64).ln() + f64::from(rank) * ln_q - norm) as f32;
        let top = (0..(top as u32).min(v))
            .map(|i| ((token % v + i) % v, lp(i)))
            .collect();
        PositionLogprobs {
            token_id: token,
            logprob: lp(0),
            rank: 1,
            top,
        }
    }
}

/// Injected failures, for testing the engine's fault handling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimFaults {
    /// Every Nth step fails (0: never).
    pub fail_every_n_steps: u64,
    /// After this many steps the executor dies (0: never): a fatal error,
    /// or a panic inside `execute` when the profile has `die_by_panic`.
    pub die_after_steps: u64,
}

/// The simulated-accelerator executor.
#[derive(Debug, Clone)]
pub struct SimExecutor {
    profile: SimProfile,
    tokens: SimTokens,
    faults: SimFaults,
    steps: u64,
}

impl SimExecutor {
    /// A simulated device with the given cost model and token generator.
    pub fn new(profile: SimProfile, tokens: SimTokens) -> Self {
        Self {
            profile,
            tokens,
            faults: SimFaults::default(),
            steps: 0,
        }
    }

    /// Injects faults (tests).
    pub fn with_faults(mut self, faults: SimFaults) -> Self {
        self.faults = faults;
        self
    }

    /// The cost model.
    pub fn profile(&self) -> &SimProfile {
        &self.profile
    }

    fn sample(&self, seed: u64, index: usize, mask_eos: bool) -> u32 {
        sample(&self.tokens, seed, index, mask_eos)
    }
}

/// Token `index` of a sequence seeded with `seed`; never EOS when `mask_eos`.
fn sample(tokens: &SimTokens, seed: u64, index: usize, mask_eos: bool) -> u32 {
    let x = splitmix64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let u = (x >> 11) as f64 / (1u64 << 53) as f64;
    if !mask_eos && u < tokens.eos_probability {
        return tokens.eos_token_id;
    }
    let span = u64::from(tokens.hi.saturating_sub(tokens.lo).max(1));
    tokens.lo + (splitmix64(x) % span) as u32
}

/// Token `index` of a constrained sequence: EOS where the grammar allows it
/// with the profile's EOS chance (never when `mask_eos`), otherwise an
/// allowed token drawn uniformly; an empty mask leaves the unconstrained draw.
fn sample_masked(
    tokens: &SimTokens,
    seed: u64,
    index: usize,
    mask_eos: bool,
    mask: &TokenMask,
) -> u32 {
    let x = splitmix64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let u = (x >> 11) as f64 / (1u64 << 53) as f64;
    let eos = tokens.eos_token_id;
    if !mask_eos && mask.is_allowed(eos) && u < tokens.eos_probability {
        return eos;
    }
    let n = mask.num_allowed();
    if n == 0 {
        return sample(tokens, seed, index, mask_eos);
    }
    let pick = |k: u64| mask.nth_allowed((k % n as u64) as usize);
    let mut t = pick(splitmix64(x));
    // Under min_tokens EOS is not drawn while another token is allowed.
    if mask_eos && t == Some(eos) && n > 1 {
        t = pick(splitmix64(x) + 1);
    }
    t.unwrap_or(eos)
}

/// `t`, or when the request has `allowed_token_ids` that do not hold it,
/// one of them drawn from the sequence's seed: the first from a seeded
/// start that the grammar `mask` allows and, under `min_tokens`, is not
/// EOS or a stop id (the seeded one when none is).
fn restrict(tokens: &SimTokens, s: &ScheduledSeq, t: u32, mask: Option<&TokenMask>) -> u32 {
    let allowed = &s.params.allowed_token_ids;
    if allowed.is_empty() || allowed.binary_search(&t).is_ok() {
        return t;
    }
    let x = splitmix64(s.seed ^ (s.num_generated as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let start = (splitmix64(x ^ 0xa11d) % allowed.len() as u64) as usize;
    let stops = s.mask_stop_tokens();
    (0..allowed.len())
        .map(|k| allowed[(start + k) % allowed.len()])
        .find(|&a| {
            mask.is_none_or(|m| m.is_allowed(a))
                && !(stops && (a == tokens.eos_token_id || s.params.stop_token_ids.contains(a)))
        })
        .unwrap_or(allowed[start])
}

/// `t`, or when the request's `bad_words` ban it after `tail` (the latest
/// generated tokens), the first token after it that nothing bans and that
/// the grammar `mask`, `allowed_token_ids` and `min_tokens` allow: ordinary
/// tokens first, cyclically, then the rest of the vocabulary; `t` when none
/// is (as a model would sample from all -inf logits).
fn avoid_bad_words(
    tokens: &SimTokens,
    s: &ScheduledSeq,
    tail: &[u32],
    t: u32,
    mask: Option<&TokenMask>,
) -> u32 {
    let bad = &s.params.bad_words;
    if bad.is_empty() || !bad.bans(tail, t) {
        return t;
    }
    let allowed = &s.params.allowed_token_ids;
    let stops = s.mask_stop_tokens();
    let ok = |a: &u32| {
        let a = *a;
        mask.is_none_or(|m| m.is_allowed(a))
            && (allowed.is_empty() || allowed.binary_search(&a).is_ok())
            && !(stops && (a == tokens.eos_token_id || s.params.stop_token_ids.contains(a)))
            && !bad.bans(tail, a)
    };
    let span = tokens.hi.saturating_sub(tokens.lo);
    let next = if (tokens.lo..tokens.hi).contains(&t) {
        t - tokens.lo + 1
    } else {
        0
    };
    let ordinary = (0..span).map(|k| tokens.lo + (next + k) % span);
    ordinary.chain(0..tokens.vocab_size()).find(ok).unwrap_or(t)
}

/// SplitMix64: a small, well-mixed generator step.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Waits until `deadline`: sleeps most of the way, then spins the last
/// stretch, because a plain sleep overshoots by tens of microseconds.
fn wait_until(deadline: Instant) {
    const SPIN: Duration = Duration::from_micros(100);
    let now = Instant::now();
    if deadline > now + SPIN {
        std::thread::sleep(deadline - now - SPIN);
    }
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

impl Executor for SimExecutor {
    fn name(&self) -> String {
        format!("sim:{}", self.profile.name)
    }

    fn init_kv_cache(&mut self, block_size: usize) -> Result<usize, ExecutorError> {
        if block_size == 0 {
            return Err(ExecutorError::Init("block size must be positive".into()));
        }
        // A profile built in code, not parsed, is checked here.
        self.profile
            .validate()
            .map_err(|e| ExecutorError::Init(e.to_string()))?;
        Ok(self.profile.kv_capacity_tokens / block_size)
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        vec![self.tokens.eos_token_id]
    }

    fn execute(
        &mut self,
        batch: &ScheduledBatch,
        out: &mut StepOutput,
    ) -> Result<(), ExecutorError> {
        let t = self.profile.step_time(batch);
        // A step of no modelled time waits for nothing: no clock is read
        // (the request-path benchmark runs a zero-time device, where these
        // reads were the executor's whole cost).
        let start = (!t.is_zero()).then(Instant::now);
        self.steps += 1;
        if self.faults.die_after_steps > 0 && self.steps > self.faults.die_after_steps {
            if self.profile.die_by_panic {
                panic!(
                    "simulated device panic after {} steps",
                    self.faults.die_after_steps
                );
            }
            return Err(ExecutorError::Fatal(format!(
                "simulated device lost after {} steps",
                self.faults.die_after_steps
            )));
        }
        if self.faults.fail_every_n_steps > 0
            && self.steps.is_multiple_of(self.faults.fail_every_n_steps)
        {
            return Err(ExecutorError::Step(format!(
                "simulated fault at step {}",
                self.steps
            )));
        }
        out.sampled.clear();
        out.logprobs.clear();
        for (k, s) in batch.seqs.iter().enumerate() {
            if let (Some(n), Some(rows)) = (s.params.prompt_logprobs, s.prompt_rows) {
                for pos in rows.start..rows.end {
                    if let Some(target) = s.prompt_target(batch, pos) {
                        out.logprobs.push(LogprobRow {
                            seq_index: k,
                            position: pos,
                            prompt: true,
                            logprobs: self.tokens.synthetic_logprobs(target, n),
                        });
                    }
                }
            }
            if !s.sample {
                out.sampled.push(None);
                continue;
            }
            let mask = s.mask_stop_tokens();
            let mut t = self.sample(s.seed, s.num_generated, mask);
            let stops = &s.params.stop_token_ids;
            if mask && !stops.is_empty() {
                // Under min_tokens, stop token ids are masked too: redraw.
                let mut salt = 0u64;
                while stops.contains(t) && salt < 64 {
                    salt += 1;
                    t = sample(
                        &self.tokens,
                        s.seed ^ splitmix64(salt),
                        s.num_generated,
                        mask,
                    );
                }
            }
            let t = restrict(&self.tokens, s, t, None);
            let t = avoid_bad_words(&self.tokens, s, batch.output_tail(s), t, None);
            out.sampled.push(Some(t));
            if let Some(n) = s.params.logprobs {
                out.logprobs.push(LogprobRow {
                    seq_index: k,
                    position: s.start_pos + s.num_tokens - 1,
                    prompt: false,
                    logprobs: self.tokens.synthetic_logprobs(t, n),
                });
            }
        }
        if let Some(start) = start {
            wait_until(start + t);
        }
        // The grammar masks were computed while the device "ran": wait for
        // them only now, as a real executor does before sampling, and draw
        // the constrained sequences' tokens inside their masks.
        if let Some(masks) = &batch.masks {
            let ready = masks.wait();
            for (s, sampled) in batch.seqs.iter().zip(out.sampled.iter_mut()) {
                if let (Some(slot), Some(tok)) = (s.mask_slot, sampled.as_mut())
                    && let Some(mask) = ready.get(slot as usize)
                {
                    *tok = sample_masked(
                        &self.tokens,
                        s.seed,
                        s.num_generated,
                        s.mask_stop_tokens(),
                        mask,
                    );
                    *tok = restrict(&self.tokens, s, *tok, Some(mask));
                    *tok = avoid_bad_words(&self.tokens, s, batch.output_tail(s), *tok, Some(mask));
                }
            }
        }
        out.device_time = t;
        Ok(())
    }

    fn step_cost(&self, batch: &ScheduledBatch) -> Option<StepCost> {
        Some(self.profile.cost.step_cost(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_builtin_and_overrides() {
        let p: SimProfile = "h100-llama3-8b".parse().expect("builtin");
        assert_eq!(p.kv_capacity_tokens, 430_000);
        let p: SimProfile = "tiny,t_weights_ms=2,kv_tokens=1000"
            .parse()
            .expect("override");
        assert_eq!(p.name, "tiny");
        assert!((p.t_weights - 2e-3).abs() < 1e-12);
        assert_eq!(p.kv_capacity_tokens, 1000);
        let p: SimProfile = "t_kv_ns=10".parse().expect("custom");
        assert_eq!(p.name, "custom");
        assert!((p.t_kv - 10e-9).abs() < 1e-15);
        assert!("nope".parse::<SimProfile>().is_err());
        assert!("tiny,t_weights_ms=-1".parse::<SimProfile>().is_err());
        assert!("tiny,colour=3".parse::<SimProfile>().is_err());
    }

    #[test]
    fn rejects_numbers_out_of_range() {
        for bad in [
            "tiny,t_fixed_ms=1e300",
            "tiny,t_prefill_us=1e7",
            "tiny,t_weights_ms=60001",
            "tiny,t_kv_ns=inf",
            "tiny,t_kv_ns=NaN",
            "tiny,t_fixed_ms=-0.5",
            "tiny,kv_tokens=0",
            "tiny,kv_tokens=1.5",
            "tiny,kv_tokens=1e300",
            "tiny,die_by_panic=2",
        ] {
            let err = bad.parse::<SimProfile>().expect_err(bad).to_string();
            assert!(
                err.contains("out of range") || err.contains("bad sim profile"),
                "{bad}: {err}"
            );
        }
        let err = "tiny,t_fixed_ms=1e300"
            .parse::<SimProfile>()
            .expect_err("1e300");
        assert!(err.to_string().contains("t_fixed_ms"), "{err}");
        // The largest values are accepted, and their step time is finite.
        let p: SimProfile = "tiny,t_fixed_ms=60000,t_prefill_us=1e6,t_weights_ms=60000,t_kv_ns=1e6"
            .parse()
            .expect("bounds");
        assert!(p.step_time(&ScheduledBatch::default()) <= Duration::from_secs(61));
        // A profile built in code is checked when the executor starts.
        let mut p = SimProfile::builtin("tiny").expect("tiny");
        p.t_fixed = 1e300;
        let mut ex = SimExecutor::new(p, SimTokens::default());
        assert!(
            matches!(ex.init_kv_cache(16), Err(ExecutorError::Init(m)) if m.contains("t_fixed_ms"))
        );
    }

    #[test]
    fn sampling_is_repeatable_and_in_range() {
        let ex = SimExecutor::new(
            SimProfile::builtin("tiny").expect("tiny"),
            SimTokens::default(),
        );
        for i in 0..1000 {
            let a = ex.sample(42, i, true);
            assert_eq!(a, ex.sample(42, i, true));
            assert!((32..127).contains(&a), "masked EOS never sampled: {a}");
        }
        let eos = (0..10_000)
            .filter(|&i| ex.sample(7, i, false) == 257)
            .count();
        assert!((40..120).contains(&eos), "EOS rate near 1/128: {eos}");
    }
}
