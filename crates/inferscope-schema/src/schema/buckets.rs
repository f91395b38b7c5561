//! Histogram buckets: the default bounds, the groups a user may override,
//! and the parsing and validation of overrides (`group=b1,b2,…`).

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use super::naming::Style;

// vLLM V1 default buckets (vllm/v1/metrics/loggers.py).
/// Default TTFT buckets (seconds).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Default ITL and TPOT buckets (seconds).
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's e2e / queue / inference / prefill / decode buckets (seconds), the
/// defaults under [`Style::Vllm`].
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// The native default for the same group: 1 ms to 200 ms below vLLM's
/// edges, which are all kept so dashboards built on them still work (a
/// queue time of a few ms otherwise lands in 0–300 ms).
pub const REQUEST_LATENCY_FINE_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0,
    10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
];
/// Default tokens-per-step buckets.
pub const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// `n` parameter buckets.
pub const PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// Preemptions-per-request buckets.
pub const PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];
/// Host phase durations: from 50 µs (a scheduler pass) to seconds (a long prefill).
pub const STEP_DURATION_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5,
];
/// Sequences per step: powers of two up to typical `max_num_seqs` limits.
pub const BATCH_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// KV block residency (lifetime, idle before eviction, reuse gap): 1 ms to
/// 30 min, as vLLM's.
pub const KV_RESIDENCY_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1200.0, 1800.0,
];
/// `http_request_duration_highr_seconds` buckets (the instrumentator's).
pub const HTTP_HIGHR_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
    7.5, 10.0, 30.0, 60.0,
];
/// `http_request_duration_seconds` buckets (the instrumentator's).
pub const HTTP_DURATION_BUCKETS: &[f64] = &[0.1, 0.5, 1.0];
/// HTTP body sizes: powers of four from 64 B to 16 MiB.
pub const HTTP_SIZE_BUCKETS: &[f64] = &[
    64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
];

/// The 1-2-5 series up to `max` (vLLM's `build_1_2_5_buckets`): max 100 →
/// 1, 2, 5, 10, 20, 50, 100. Always holds at least `1`.
pub fn one_two_five_buckets(max: usize) -> Vec<f64> {
    let max = max.max(1) as f64;
    let mut out = Vec::new();
    let mut scale = 1.0_f64;
    'outer: loop {
        for m in [1.0, 2.0, 5.0] {
            let v = m * scale;
            if v > max {
                break 'outer;
            }
            out.push(v);
        }
        scale *= 10.0;
    }
    out
}

/// Bucket groups a user may override (names as vLLM's CLI uses them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketGroup {
    /// TTFT.
    TimeToFirstToken,
    /// ITL and TPOT.
    InterTokenLatency,
    /// e2e, queue, inference, prefill, decode times.
    RequestLatency,
    /// Per-request token counts (1-2-5 series up to max_model_len by default).
    RequestTokens,
    /// Tokens per engine step.
    IterationTokens,
}

impl BucketGroup {
    /// Every group, in docs order.
    pub const ALL: [BucketGroup; 5] = [
        Self::TimeToFirstToken,
        Self::InterTokenLatency,
        Self::RequestLatency,
        Self::RequestTokens,
        Self::IterationTokens,
    ];

    /// The group's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TimeToFirstToken => "time_to_first_token",
            Self::InterTokenLatency => "inter_token_latency",
            Self::RequestLatency => "request_latency",
            Self::RequestTokens => "request_tokens",
            Self::IterationTokens => "iteration_tokens",
        }
    }

    /// The default buckets under `namespace` (its [`Style`] decides);
    /// `max_model_len` bounds the 1-2-5 token series.
    pub fn default_buckets(self, namespace: &str, max_model_len: usize) -> Vec<f64> {
        match self {
            Self::TimeToFirstToken => TTFT_BUCKETS.to_vec(),
            Self::InterTokenLatency => ITL_BUCKETS.to_vec(),
            Self::RequestLatency => match Style::of(namespace) {
                Style::Vllm => REQUEST_LATENCY_BUCKETS.to_vec(),
                Style::Native => REQUEST_LATENCY_FINE_BUCKETS.to_vec(),
            },
            Self::RequestTokens => one_two_five_buckets(max_model_len),
            Self::IterationTokens => ITERATION_TOKENS_BUCKETS.to_vec(),
        }
    }
}

impl fmt::Display for BucketGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BucketGroup {
    type Err = BucketsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|g| g.as_str() == s)
            .ok_or_else(|| BucketsError::UnknownGroup(s.to_owned()))
    }
}

/// Where a histogram's buckets come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Buckets {
    /// Not a histogram.
    None,
    /// An overridable group.
    Group(BucketGroup),
    /// Fixed bounds.
    Fixed(&'static [f64]),
}

impl Buckets {
    /// The bounds in force under `namespace` (an empty list when not a
    /// histogram): a group's override, else its default.
    pub fn bounds(
        self,
        overrides: &BucketOverrides,
        namespace: &str,
        max_model_len: usize,
    ) -> Vec<f64> {
        match self {
            Buckets::None => Vec::new(),
            Buckets::Fixed(b) => b.to_vec(),
            Buckets::Group(g) => overrides
                .slot(g)
                .cloned()
                .unwrap_or_else(|| g.default_buckets(namespace, max_model_len)),
        }
    }
}

/// A bad bucket list or group name.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum BucketsError {
    /// Nothing between the commas.
    #[error("empty bucket list: expected comma-separated numbers such as \"0.1,0.5,1\"")]
    Empty,
    /// Not a number.
    #[error(
        "bucket {position} ({value:?}) is not a number: expected comma-separated numbers such as \"0.1,0.5,1\""
    )]
    NotANumber {
        /// 1-based position in the list.
        position: usize,
        /// The offending text.
        value: String,
    },
    /// NaN or infinite (`+Inf` is implicit).
    #[error("bucket {position} ({value}) must be finite; the +Inf bucket is added automatically")]
    NotFinite {
        /// 1-based position in the list.
        position: usize,
        /// The offending value.
        value: f64,
    },
    /// Bounds must strictly increase.
    #[error(
        "buckets must be strictly increasing, but bucket {position} ({value}) follows {previous}"
    )]
    NotIncreasing {
        /// 1-based position in the list.
        position: usize,
        /// The offending value.
        value: f64,
        /// The bound before it.
        previous: f64,
    },
    /// Unknown group name.
    #[error(
        "unknown bucket group {0:?}; expected one of time_to_first_token, inter_token_latency, request_latency, request_tokens, iteration_tokens"
    )]
    UnknownGroup(String),
}

/// Parses `"0.1,0.5,1"` into strictly increasing finite bucket bounds.
pub fn parse_buckets(s: &str) -> Result<Vec<f64>, BucketsError> {
    let mut out = Vec::new();
    for (i, part) in s.split(',').enumerate() {
        let part = part.trim();
        if part.is_empty() {
            if s.trim().is_empty() {
                return Err(BucketsError::Empty);
            }
            return Err(BucketsError::NotANumber {
                position: i + 1,
                value: String::new(),
            });
        }
        let value: f64 = part.parse().map_err(|_| BucketsError::NotANumber {
            position: i + 1,
            value: part.to_owned(),
        })?;
        out.push(value);
    }
    validate_buckets(&out)?;
    Ok(out)
}

/// Checks that bounds are non-empty, finite and strictly increasing.
pub fn validate_buckets(bounds: &[f64]) -> Result<(), BucketsError> {
    if bounds.is_empty() {
        return Err(BucketsError::Empty);
    }
    let mut previous: Option<f64> = None;
    for (i, &value) in bounds.iter().enumerate() {
        if !value.is_finite() {
            return Err(BucketsError::NotFinite {
                position: i + 1,
                value,
            });
        }
        if let Some(previous) = previous
            && value <= previous
        {
            return Err(BucketsError::NotIncreasing {
                position: i + 1,
                value,
                previous,
            });
        }
        previous = Some(value);
    }
    Ok(())
}

/// Per-group bucket overrides; `None` keeps the default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BucketOverrides {
    /// `time_to_first_token`.
    pub time_to_first_token: Option<Vec<f64>>,
    /// `inter_token_latency` (ITL and TPOT).
    pub inter_token_latency: Option<Vec<f64>>,
    /// `request_latency` (e2e, queue, inference, prefill, decode).
    pub request_latency: Option<Vec<f64>>,
    /// `request_tokens` (per-request token counts).
    pub request_tokens: Option<Vec<f64>>,
    /// `iteration_tokens` (tokens per step).
    pub iteration_tokens: Option<Vec<f64>>,
}

impl BucketOverrides {
    /// The override slot of a group.
    pub fn slot(&self, group: BucketGroup) -> Option<&Vec<f64>> {
        match group {
            BucketGroup::TimeToFirstToken => self.time_to_first_token.as_ref(),
            BucketGroup::InterTokenLatency => self.inter_token_latency.as_ref(),
            BucketGroup::RequestLatency => self.request_latency.as_ref(),
            BucketGroup::RequestTokens => self.request_tokens.as_ref(),
            BucketGroup::IterationTokens => self.iteration_tokens.as_ref(),
        }
    }

    /// Sets a group's buckets after validating them.
    pub fn set(&mut self, group: BucketGroup, bounds: Vec<f64>) -> Result<(), BucketsError> {
        validate_buckets(&bounds)?;
        let slot = match group {
            BucketGroup::TimeToFirstToken => &mut self.time_to_first_token,
            BucketGroup::InterTokenLatency => &mut self.inter_token_latency,
            BucketGroup::RequestLatency => &mut self.request_latency,
            BucketGroup::RequestTokens => &mut self.request_tokens,
            BucketGroup::IterationTokens => &mut self.iteration_tokens,
        };
        *slot = Some(bounds);
        Ok(())
    }

    /// Parses `group=b1,b2,…` (e.g. `time_to_first_token=0.1,0.5,1`) and sets it.
    pub fn set_from_str(&mut self, spec: &str) -> Result<(), BucketsError> {
        let (group, list) = spec
            .split_once('=')
            .ok_or_else(|| BucketsError::UnknownGroup(spec.to_owned()))?;
        let group: BucketGroup = group.trim().parse()?;
        self.set(group, parse_buckets(list)?)
    }

    /// Checks every override.
    pub fn validate(&self) -> Result<(), BucketsError> {
        for group in BucketGroup::ALL {
            if let Some(b) = self.slot(group) {
                validate_buckets(b)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::naming::{DEFAULT_NAMESPACE, VLLM_NAMESPACE};

    #[test]
    fn one_two_five_matches_vllm() {
        assert_eq!(
            one_two_five_buckets(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(one_two_five_buckets(4096).last(), Some(&2000.0));
        assert_eq!(one_two_five_buckets(0), vec![1.0]);
    }

    #[test]
    fn parse_buckets_accepts_and_rejects() {
        assert_eq!(parse_buckets("0.1, 0.5,1").unwrap(), vec![0.1, 0.5, 1.0]);
        assert_eq!(parse_buckets(""), Err(BucketsError::Empty));
        assert!(matches!(
            parse_buckets("0.1,x"),
            Err(BucketsError::NotANumber { position: 2, .. })
        ));
        assert!(matches!(
            parse_buckets("0.1,,1"),
            Err(BucketsError::NotANumber { position: 2, .. })
        ));
        assert!(matches!(
            parse_buckets("1,0.5"),
            Err(BucketsError::NotIncreasing { position: 2, .. })
        ));
        assert!(matches!(
            parse_buckets("1,1"),
            Err(BucketsError::NotIncreasing { .. })
        ));
        assert!(matches!(
            parse_buckets("1,inf"),
            Err(BucketsError::NotFinite { .. })
        ));
        let msg = parse_buckets("a").unwrap_err().to_string();
        assert!(msg.contains("0.1,0.5,1"), "{msg}");
    }

    #[test]
    fn default_groups_are_valid_and_named() {
        for g in BucketGroup::ALL {
            validate_buckets(&g.default_buckets(DEFAULT_NAMESPACE, 1000)).unwrap();
            validate_buckets(&g.default_buckets(VLLM_NAMESPACE, 1000)).unwrap();
            assert_eq!(g.as_str().parse::<BucketGroup>().unwrap(), g);
        }
    }

    #[test]
    fn latency_buckets_depend_on_the_style() {
        let fine = BucketGroup::RequestLatency.default_buckets(DEFAULT_NAMESPACE, 0);
        let vllm = BucketGroup::RequestLatency.default_buckets(VLLM_NAMESPACE, 0);
        assert_eq!(vllm, REQUEST_LATENCY_BUCKETS);
        // The finer edges below 300 ms, then every one of vLLM's.
        let below: Vec<f64> = fine.iter().copied().filter(|&b| b < 0.3).collect();
        assert_eq!(below, [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2]);
        assert_eq!(&fine[below.len()..], REQUEST_LATENCY_BUCKETS);
        // A custom namespace is native; only the other groups match vLLM's.
        assert_eq!(BucketGroup::RequestLatency.default_buckets("acme", 0), fine);
        for g in BucketGroup::ALL {
            if g != BucketGroup::RequestLatency {
                assert_eq!(
                    g.default_buckets(DEFAULT_NAMESPACE, 100),
                    g.default_buckets(VLLM_NAMESPACE, 100),
                    "{g}"
                );
            }
        }
    }
}
