//! The rules: each a small function from a window's [`Summary`] to an
//! [`Outcome`], with its thresholds as named constants. A finding says what
//! is wrong, the figures it used, and one concrete action.

use crate::window::{Bucket, Summary};
use inferscope_schema::schema::DEFAULT_NAMESPACE;
use serde::Serialize;

/// How bad a finding is; the report sorts the worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Nothing wrong (the healthy verdict).
    Ok,
    /// Worth knowing; an opportunity rather than a problem.
    Info,
    /// Costs latency or throughput now.
    Warning,
    /// Users see failures or severe degradation; `doctor` exits non-zero.
    Critical,
}

/// One figure a finding rests on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evidence {
    /// What it is, e.g. `queue_time_mean`.
    pub name: String,
    /// The value, in `unit`.
    pub value: f64,
    /// `s`, `ratio` (0..1), `tokens`, `requests`, `per_s`, …
    pub unit: String,
}

/// A diagnosis with its evidence and the action to take.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Stable identifier for automation, e.g. `queue_bound`.
    pub id: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// What is wrong, in one sentence.
    pub title: String,
    /// The figures used.
    pub evidence: Vec<Evidence>,
    /// What to change, and in which direction, or where to look.
    pub action: String,
}

impl Finding {
    /// The evidence named `name`.
    pub fn evidence(&self, name: &str) -> Option<f64> {
        self.evidence
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.value)
    }
}

/// A rule that could not be evaluated, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    /// The rule's id.
    pub rule: &'static str,
    /// Why (usually: metrics the server does not expose).
    pub reason: String,
}

/// What a rule concluded.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The condition holds.
    Fired(Finding),
    /// The condition does not hold.
    Clear,
    /// The rule lacks the metrics it needs.
    Skipped(String),
}

/// Findings, worst first, and the rules that could not run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    /// Ranked findings: by severity, then by rule priority.
    pub findings: Vec<Finding>,
    /// Rules skipped for want of metrics.
    pub skipped: Vec<Skipped>,
}

/// Fewest finished requests in the window for latency rules to judge.
pub const MIN_REQUESTS: f64 = 3.0;
/// Share of the window's tokens one tenant took, with others active and
/// requests waiting, from which it is said to hold the server.
pub const TENANT_HOG_SHARE: f64 = 0.75;
/// Mean waiting requests from which others are said to wait.
pub const TENANT_HOG_MIN_WAITING: f64 = 1.0;
/// Error and rejection share of requests that warns.
pub const ERROR_SHARE_WARN: f64 = 0.01;
/// Error and rejection share of requests that is critical.
pub const ERROR_SHARE_CRITICAL: f64 = 0.05;
/// Preemptions per finished request above which preemption is critical.
pub const PREEMPTIONS_PER_REQUEST_CRITICAL: f64 = 0.05;
/// KV usage at which the cache counts as full.
pub const KV_FULL: f64 = 0.95;
/// KV usage below which the cache "has room" for a larger batch.
pub const KV_ROOM: f64 = 0.8;
/// Share of mean end-to-end latency spent queued that warns.
pub const QUEUE_SHARE_WARN: f64 = 0.3;
/// Share of mean end-to-end latency spent queued that is critical.
pub const QUEUE_SHARE_CRITICAL: f64 = 0.5;
/// Mean queue time below which queueing is noise, seconds.
pub const QUEUE_MIN_MEAN_S: f64 = 0.01;
/// Device utilisation below which the device counts as under-used.
pub const HOST_BOUND_UTILISATION: f64 = 0.5;
/// Idle fraction of the engine loop above which the engine is not busy.
pub const HOST_BOUND_MAX_IDLE: f64 = 0.2;
/// Device utilisation from which masks are not said to hold the device
/// back (issue #37's target with every sequence constrained).
pub const GRAMMAR_MASK_MAX_UTILISATION: f64 = 0.95;
/// Mask time per constrained step, over device time per step, from which
/// the masks no longer hide behind the step: the step's host work and the
/// other threads' share of the cores come on top of them.
pub const GRAMMAR_MASK_STEP_RATIO: f64 = 0.5;
/// Share of steps with a constrained sequence from which their waits matter.
pub const GRAMMAR_MASK_MIN_STEP_SHARE: f64 = 0.1;
/// Mean running requests that count as load.
pub const LOAD_MIN_RUNNING: f64 = 1.0;
/// Mean TTFT above which a slow first token is worth explaining, seconds.
pub const TTFT_SLOW_S: f64 = 0.2;
/// Share of mean TTFT spent in prefill that makes prefill the cause.
pub const PREFILL_SHARE: f64 = 0.5;
/// Mean prompt length that counts as long, tokens.
pub const LONG_PROMPT_TOKENS: f64 = 512.0;
/// Prefix-cache hit rate below which the cache is not earning its keep.
pub const PREFIX_HIT_LOW: f64 = 0.1;
/// Mean prompt length from which a prefix hit saves real work, tokens.
pub const PREFIX_PAYOFF_PROMPT_TOKENS: f64 = 256.0;
/// Share of tokens that are prompt tokens for prefix caching to pay off.
pub const PREFIX_PAYOFF_PROMPT_SHARE: f64 = 0.5;
/// Busiest engine's load over the mean engine load that counts as imbalance.
pub const IMBALANCE_RATIO: f64 = 1.5;
/// Busiest engine's device utilisation below which imbalance does not matter.
pub const IMBALANCE_MIN_BUSY: f64 = 0.2;
/// Late-half over early-half error rate that counts as rising.
pub const RISING_RATIO: f64 = 1.5;

/// Why a rule that needs a mean did not run.
const NO_SUM: &str = "a histogram it needs has no `_sum` in the exposition: the mean is unknown";

fn ev(name: &str, value: f64, unit: &str) -> Evidence {
    Evidence {
        name: name.to_string(),
        value,
        unit: unit.to_string(),
    }
}

/// A bucket of a count (tokens) as text: `≤ 512`, `in 512–1024`, `> 8192`.
fn count_bucket_text(b: &Bucket) -> String {
    match b.hi {
        None => format!("> {:.0}", b.lo),
        Some(hi) if b.bound.index == 0 => format!("≤ {hi:.0}"),
        Some(hi) => format!("in {:.0}–{hi:.0}", b.lo),
    }
}

/// A quantile as evidence: its bucket's bounds (`NAME_bucket_lo`, and
/// `NAME_bucket_hi` unless it is the `+Inf` bucket), never an interpolation.
fn bucket_ev(evidence: &mut Vec<Evidence>, name: &str, b: Option<Bucket>, unit: &str) {
    let Some(b) = b else { return };
    evidence.push(ev(&format!("{name}_bucket_lo"), b.lo, unit));
    if let Some(hi) = b.hi {
        evidence.push(ev(&format!("{name}_bucket_hi"), hi, unit));
    }
}

fn fire(
    id: &'static str,
    severity: Severity,
    title: String,
    evidence: Vec<Evidence>,
    action: String,
) -> Outcome {
    Outcome::Fired(Finding {
        id,
        severity,
        title,
        evidence,
        action,
    })
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn ms(x: f64) -> String {
    format!("{:.0} ms", x * 1000.0)
}

/// Requests the server saw: finished plus refused at admission.
fn attempts(s: &Summary) -> f64 {
    s.finished_total() + s.admission_rejections.unwrap_or(0.0)
}

/// Errors and admission rejections as a share of requests; rising when the
/// window's later half had clearly more of them than the earlier half.
pub fn errors_and_rejections(s: &Summary, trend: Option<(f64, f64)>) -> Outcome {
    let errors = s.finished_by_reason.get("error").copied().unwrap_or(0.0);
    let http_5xx = s.http_by_status.get("5xx").copied().unwrap_or(0.0);
    let rejected = s.admission_rejections.unwrap_or(0.0);
    // A 5xx and an errored request are usually the same failure: count the larger.
    let failures = errors.max(http_5xx);
    let total = attempts(s).max(s.http_by_status.values().sum());
    if total <= 0.0 || failures + rejected <= 0.0 {
        return Outcome::Clear;
    }
    let share = (failures + rejected) / total;
    if share < ERROR_SHARE_WARN {
        return Outcome::Clear;
    }
    let severity = if share >= ERROR_SHARE_CRITICAL {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let mut evidence = vec![
        ev("failure_share", share, "ratio"),
        ev("admission_rejections", rejected, "requests"),
        ev("errored_requests", errors, "requests"),
        ev("http_5xx", http_5xx, "responses"),
        ev("requests", total, "requests"),
        ev("waiting_peak", s.waiting_peak.unwrap_or(0.0), "requests"),
    ];
    let rising = match trend {
        Some((early, late)) => {
            evidence.push(ev("failures_early_half", early, "requests"));
            evidence.push(ev("failures_late_half", late, "requests"));
            late > early * RISING_RATIO && late > 0.0
        }
        None => false,
    };
    let trend_word = if rising { ", and rising" } else { "" };
    if rejected >= failures {
        fire(
            "admission_rejections",
            severity,
            format!(
                "{} of requests are refused at admission (HTTP 429: the waiting queue is full){trend_word}",
                pct(share)
            ),
            evidence,
            "Add capacity: more replicas or data-parallel engines (--data-parallel-size), or raise \
             --max-num-seqs if the KV cache has room so the queue drains faster; raising \
             --max-waiting-requests only trades 429s for queue time."
                .to_string(),
        )
    } else {
        fire(
            "errors",
            severity,
            format!("{} of requests fail with errors{trend_word}", pct(share)),
            evidence,
            "Look at the server log for failed engine steps and 5xx responses \
             (finished_reason=\"error\"); check the executor and the device."
                .to_string(),
        )
    }
}

/// Preemptions (KV cache too small for the batch), or a full KV cache that
/// makes requests wait for blocks.
pub fn kv_saturated(s: &Summary) -> Outcome {
    let preemptions = s.preemptions.unwrap_or(0.0);
    let kv_peak = s.kv_usage_peak;
    let full = kv_peak.is_some_and(|k| k >= KV_FULL) && s.waiting_mean.unwrap_or(0.0) > 0.0;
    if preemptions < 1.0 && !full {
        return if kv_peak.is_none() && s.preemptions.is_none() {
            Outcome::Skipped("no KV-cache usage gauge and no preemption counter".into())
        } else {
            Outcome::Clear
        };
    }
    let finished = s.finished_total();
    let per_request = preemptions / finished.max(1.0);
    let severity = if preemptions >= 1.0 && per_request >= PREEMPTIONS_PER_REQUEST_CRITICAL {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let mut evidence = vec![
        ev("preemptions", preemptions, "preemptions"),
        ev("preemptions_per_request", per_request, "per request"),
        ev("kv_usage_peak", kv_peak.unwrap_or(0.0), "ratio"),
        ev("kv_usage_mean", s.kv_usage_mean.unwrap_or(0.0), "ratio"),
        ev("waiting_mean", s.waiting_mean.unwrap_or(0.0), "requests"),
        ev("running_peak", s.running_peak.unwrap_or(0.0), "requests"),
    ];
    if let Some(blocks) = s
        .engines
        .iter()
        .filter_map(|e| e.num_gpu_blocks)
        .reduce(f64::min)
    {
        evidence.push(ev("num_gpu_blocks", blocks, "blocks"));
    }
    let title = if preemptions >= 1.0 {
        format!(
            "KV cache saturated: {preemptions:.0} preemptions in the window ({:.2} per finished request), KV usage peaked at {} {}",
            per_request,
            pct(kv_peak.unwrap_or(0.0)),
            in_scrapes(s)
        )
    } else {
        format!(
            "KV cache full ({}) while requests wait for blocks",
            pct(kv_peak.unwrap_or(0.0))
        )
    };
    fire(
        "kv_saturated",
        severity,
        title,
        evidence,
        "Give the KV cache more memory (a larger --kv-cache-memory / GPU memory share, a smaller \
         model or KV dtype), lower --max-model-len or --max-num-seqs so fewer long sequences \
         compete for blocks, or add replicas."
            .to_string(),
    )
}

/// Where a gauge's peak was seen: the gauges are read at each scrape, so a
/// peak is over those readings, not over every moment of the window.
fn in_scrapes(s: &Summary) -> String {
    match s.scrapes {
        1 => "in the one scrape read".to_string(),
        n => format!("in the {n} scrapes read"),
    }
}

/// Latency dominated by queue time while the KV cache has room: the batch cap
/// holds requests back, not memory.
pub fn queue_bound(s: &Summary) -> Outcome {
    let (Some(queue), Some(e2e)) = (s.queue, s.e2e) else {
        return Outcome::Skipped("no request_queue_time or e2e_request_latency histogram".into());
    };
    let (Some(queue_mean), Some(e2e_mean)) = (queue.mean, e2e.mean) else {
        return if e2e.count < MIN_REQUESTS {
            Outcome::Clear
        } else {
            Outcome::Skipped(NO_SUM.into())
        };
    };
    if e2e.count < MIN_REQUESTS || e2e_mean <= 0.0 {
        return Outcome::Clear;
    }
    let share = queue_mean / e2e_mean;
    let kv_peak = s.kv_usage_peak.unwrap_or(0.0);
    if share < QUEUE_SHARE_WARN
        || queue_mean < QUEUE_MIN_MEAN_S
        || kv_peak >= KV_ROOM
        || s.preemptions.unwrap_or(0.0) >= 1.0
    {
        return Outcome::Clear;
    }
    if prefill_dominated(s) {
        // Requests queue behind long prefills that use up the step's token
        // budget, not behind the batch cap: `long_prompts` says what to do.
        return Outcome::Clear;
    }
    let severity = if share >= QUEUE_SHARE_CRITICAL {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let running_peak_engine = s
        .engines
        .iter()
        .filter_map(|e| e.running_peak)
        .reduce(f64::max)
        .unwrap_or(0.0);
    let mut evidence = vec![
        ev("queue_share_of_e2e", share, "ratio"),
        ev("queue_time_mean", queue_mean, "s"),
        ev("e2e_latency_mean", e2e_mean, "s"),
        ev("waiting_mean", s.waiting_mean.unwrap_or(0.0), "requests"),
        ev("running_peak_per_engine", running_peak_engine, "requests"),
        ev("kv_usage_peak", kv_peak, "ratio"),
    ];
    if let Some(u) = s.device_utilisation {
        evidence.push(ev("device_utilisation", u, "ratio"));
    }
    fire(
        "queue_bound",
        severity,
        format!(
            "Latency is dominated by queueing: {} of the mean end-to-end latency ({} of {}) is spent waiting, while the KV cache peaked at only {} {}",
            pct(share),
            ms(queue_mean),
            ms(e2e_mean),
            pct(kv_peak),
            in_scrapes(s)
        ),
        evidence,
        format!(
            "Raise --max-num-seqs (the running batch peaked at {running_peak_engine:.0} per engine {}) \
             and, if prefills queue too, --max-num-batched-tokens: the KV cache has room for a larger batch.",
            in_scrapes(s)
        ),
    )
}

/// The device idles while the engine loop is busy: host work (schedule,
/// executor overhead, postprocess) is the bottleneck.
pub fn host_bound(s: &Summary) -> Outcome {
    let (Some(util), Some(idle), Some(ph)) = (s.device_utilisation, s.idle_fraction, s.phases)
    else {
        return Outcome::Skipped(
            "needs device_busy_seconds, engine_idle_seconds and engine_step_duration_seconds \
             (inferscope only; vLLM does not export them)"
                .into(),
        );
    };
    let running = s.running_mean.unwrap_or(0.0);
    if util >= HOST_BOUND_UTILISATION || idle > HOST_BOUND_MAX_IDLE || running < LOAD_MIN_RUNNING {
        return Outcome::Clear;
    }
    let device = ph.device.unwrap_or(0.0);
    // The executor phase includes the device time; only the rest is host overhead.
    let executor_overhead = (ph.execute - device).max(0.0);
    let phases = [
        ("schedule", ph.schedule),
        (
            "execute (executor overhead beyond device time)",
            executor_overhead,
        ),
        ("postprocess", ph.postprocess),
    ];
    let (dominant, dominant_s) = phases
        .iter()
        .copied()
        .fold(("schedule", f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
    let engines = s.engines.len().max(1) as f64;
    let where_to_look = match dominant {
        "schedule" => "the scheduler (batch building, KV block allocation, prefix-cache lookups)",
        "postprocess" => {
            "output processing (token appends, stop checks, detokenisation and streaming)"
        }
        _ => "the executor's host side (input preparation, launches, copies)",
    };
    fire(
        "host_bound",
        Severity::Warning,
        format!(
            "The device is under-used ({} busy) while the engine loop is busy ({} idle) with {running:.1} requests running: the host is the bottleneck, mostly in {dominant}",
            pct(util),
            pct(idle)
        ),
        vec![
            ev("device_utilisation", util, "ratio"),
            ev("engine_idle_fraction", idle, "ratio"),
            ev("running_mean", running, "requests"),
            ev("waiting_mean", s.waiting_mean.unwrap_or(0.0), "requests"),
            ev("schedule_fraction", ph.schedule / engines, "ratio"),
            ev(
                "executor_overhead_fraction",
                executor_overhead / engines,
                "ratio",
            ),
            ev("postprocess_fraction", ph.postprocess / engines, "ratio"),
            ev("dominant_phase_fraction", dominant_s / engines, "ratio"),
        ],
        format!(
            "Profile {where_to_look}; larger batches (--max-num-seqs, --max-num-batched-tokens) \
             amortise per-step host cost, and more data-parallel engines spread it over cores."
        ),
    )
}

/// Structured-output masks take so long next to the device step they
/// overlap that the device waits for them. Servers that do not export
/// `grammar_mask_duration_seconds` (vLLM) or the device view are not judged,
/// and not listed as skipped: most traffic is unconstrained, and `host_bound`
/// already names the missing device view.
pub fn grammar_masks(s: &Summary) -> Outcome {
    let (Some(gm), Some(util), Some(ph)) = (s.grammar_masks, s.device_utilisation, s.phases) else {
        return Outcome::Clear;
    };
    let (Some(device), Some(all_steps)) = (ph.device, gm.all_steps) else {
        return Outcome::Clear;
    };
    let running = s.running_mean.unwrap_or(0.0);
    if gm.steps <= 0.0 || all_steps <= 0.0 || s.window_s <= 0.0 || running < LOAD_MIN_RUNNING {
        return Outcome::Clear;
    }
    let mask_per_step = gm.seconds / gm.steps;
    let device_per_step = device * s.window_s / all_steps;
    let ratio = if device_per_step > 0.0 {
        mask_per_step / device_per_step
    } else {
        f64::INFINITY
    };
    let constrained_share = (gm.steps / all_steps).min(1.0);
    if util >= GRAMMAR_MASK_MAX_UTILISATION
        || ratio < GRAMMAR_MASK_STEP_RATIO
        || constrained_share < GRAMMAR_MASK_MIN_STEP_SHARE
    {
        return Outcome::Clear;
    }
    let engines = s.engines.len().max(1) as f64;
    // The executor waits for late masks after the device time: that wait is
    // in the execute phase beyond device time.
    let executor_overhead = (ph.execute - device).max(0.0) / engines;
    fire(
        "grammar_masks",
        Severity::Warning,
        format!(
            "Structured-output masks hold the device back: {} busy, masks take {:.1} ms per constrained step \
             against {:.1} ms of device time per step ({} of steps constrained)",
            pct(util),
            mask_per_step * 1e3,
            device_per_step * 1e3,
            pct(constrained_share)
        ),
        vec![
            ev("device_utilisation", util, "ratio"),
            ev("grammar_mask_per_step", mask_per_step, "s"),
            ev("device_time_per_step", device_per_step, "s"),
            ev("mask_to_device_step_ratio", ratio, "ratio"),
            ev("constrained_step_fraction", constrained_share, "ratio"),
            ev("executor_overhead_fraction", executor_overhead, "ratio"),
            ev("running_mean", running, "requests"),
        ],
        "Masks are computed while the step runs and the device waits for the rest: raise \
         --grammar-threads (a step's constrained sequences are spread over them) on a machine \
         with free cores, constrain fewer sequences per step (--max-num-seqs, or a separate \
         pool for constrained traffic), or simplify the schemas (fewer alternatives, bounded \
         strings and arrays)."
            .into(),
    )
}

/// Engines of one server doing very different amounts of work.
pub fn dp_imbalance(s: &Summary) -> Outcome {
    if s.engines.len() < 2 {
        return Outcome::Clear;
    }
    // Device time is the truest load; without it, tokens processed.
    let by_util: Option<Vec<f64>> = s.engines.iter().map(|e| e.device_utilisation).collect();
    let tokens_known = s
        .engines
        .iter()
        .any(|e| e.prompt_tokens_per_s.is_some() || e.generation_tokens_per_s.is_some());
    if by_util.is_none() && !tokens_known {
        return Outcome::Skipped(
            "no per-engine device time and no per-engine token counters to compare".into(),
        );
    }
    let (loads, what, unit) = match by_util {
        Some(u) => (u, "device_utilisation", "ratio"),
        None => (
            s.engines
                .iter()
                .map(|e| {
                    e.prompt_tokens_per_s.unwrap_or(0.0) + e.generation_tokens_per_s.unwrap_or(0.0)
                })
                .collect(),
            "tokens_per_s",
            "tokens/s",
        ),
    };
    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
    let (busiest, max) = loads
        .iter()
        .copied()
        .enumerate()
        .fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
    let min = loads.iter().copied().fold(f64::MAX, f64::min);
    if mean <= 0.0 || max / mean < IMBALANCE_RATIO {
        return Outcome::Clear;
    }
    if what == "device_utilisation" && max < IMBALANCE_MIN_BUSY {
        return Outcome::Clear;
    }
    let mut evidence = vec![
        ev("max_over_mean", max / mean, "times"),
        ev(&format!("{what}_max"), max, unit),
        ev(&format!("{what}_min"), min, unit),
    ];
    for (e, l) in s.engines.iter().zip(&loads) {
        evidence.push(ev(&format!("{what}_engine_{}", e.engine), *l, unit));
    }
    fire(
        "dp_imbalance",
        Severity::Warning,
        format!(
            "Data-parallel engines are unbalanced: engine {} does {:.1}× the mean load ({what})",
            s.engines[busiest].engine,
            max / mean
        ),
        evidence,
        "Requests differ greatly in length and the router balances request counts, not work: \
         route by KV-cache usage and queue depth (e.g. the Gateway API Inference Extension), \
         or serve long and short requests from separate pools."
            .to_string(),
    )
}

/// One tenant took most of the tokens while requests waited and other
/// tenants were active: it holds the server.
pub fn tenant_hog(s: &Summary) -> Outcome {
    // No tenant label (vLLM, an older inferscope): nothing to say, and not
    // worth a "skipped" line on every report.
    if s.tenant_tokens.is_empty() {
        return Outcome::Clear;
    }
    let total: f64 = s.tenant_tokens.values().sum();
    let active = s.tenant_tokens.values().filter(|n| **n > 0.0).count();
    let Some((top, top_tokens)) = s
        .tenant_tokens
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(t, n)| (t.clone(), *n))
    else {
        return Outcome::Clear;
    };
    let waiting = s.waiting_mean.unwrap_or(0.0);
    let share = if total > 0.0 { top_tokens / total } else { 0.0 };
    if active < 2 || share < TENANT_HOG_SHARE || waiting < TENANT_HOG_MIN_WAITING {
        return Outcome::Clear;
    }
    let mut evidence = vec![
        ev("top_tenant_token_share", share, "ratio"),
        ev("waiting_mean", waiting, "requests"),
        ev("active_tenants", active as f64, "tenants"),
    ];
    for (t, n) in &s.tenant_tokens {
        evidence.push(ev(&format!("tokens_tenant_{t}"), *n, "tokens"));
    }
    fire(
        "tenant_hog",
        Severity::Warning,
        format!(
            "Tenant `{top}` took {} of the tokens while {waiting:.1} requests waited on average",
            pct(share)
        ),
        evidence,
        format!(
            "Give `{top}` a limit in --api-key-file (max_concurrent, max_waiting or \
             tokens_per_minute) or a lower weight, and check that --scheduling-policy is fair \
             (docs/tenants.md). If `{top}` is `other` or `anonymous`, raise --max-tenant-labels \
             or give its callers keys to see who they are."
        ),
    )
}

/// Whether prompts are long and prefill is most of the time to first token.
fn prefill_dominated(s: &Summary) -> bool {
    let means = (
        s.ttft.and_then(|d| d.mean),
        s.prefill.and_then(|d| d.mean),
        s.prompt_len.and_then(|d| d.mean),
    );
    match means {
        (Some(t), Some(p), Some(len)) => {
            t > 0.0 && p / t >= PREFILL_SHARE && len >= LONG_PROMPT_TOKENS
        }
        _ => false,
    }
}

/// Slow first tokens caused by prefill of long prompts rather than by queueing.
pub fn long_prompts(s: &Summary) -> Outcome {
    let (Some(ttft), Some(prefill), Some(prompt)) = (s.ttft, s.prefill, s.prompt_len) else {
        return Outcome::Skipped(
            "needs time_to_first_token, request_prefill_time and request_prompt_tokens histograms"
                .into(),
        );
    };
    if ttft.count < MIN_REQUESTS {
        return Outcome::Clear;
    }
    let (Some(ttft_mean), Some(prefill_mean), Some(prompt_mean)) =
        (ttft.mean, prefill.mean, prompt.mean)
    else {
        return Outcome::Skipped(NO_SUM.into());
    };
    if ttft_mean < TTFT_SLOW_S || ttft_mean <= 0.0 {
        return Outcome::Clear;
    }
    let share = prefill_mean / ttft_mean;
    if share < PREFILL_SHARE || prompt_mean < LONG_PROMPT_TOKENS {
        return Outcome::Clear;
    }
    let mut evidence = vec![
        ev("prefill_share_of_ttft", share, "ratio"),
        ev("ttft_mean", ttft_mean, "s"),
        ev("prefill_time_mean", prefill_mean, "s"),
        ev("prompt_tokens_mean", prompt_mean, "tokens"),
    ];
    bucket_ev(&mut evidence, "ttft_p99", ttft.p99, "s");
    bucket_ev(&mut evidence, "prompt_tokens_p99", prompt.p99, "tokens");
    let step_tokens = s.iteration_tokens.and_then(|d| d.p99);
    bucket_ev(&mut evidence, "tokens_per_step_p99", step_tokens, "tokens");
    fire(
        "long_prompts",
        Severity::Warning,
        format!(
            "Long prompts dominate time to first token: prefill takes {} of the mean TTFT ({}), prompts average {:.0} tokens",
            pct(share),
            ms(ttft_mean),
            prompt_mean
        ),
        evidence,
        format!(
            "Raise the prefill budget --max-num-batched-tokens{} so a prompt prefills in fewer \
             chunks (at some cost to the inter-token latency of running requests), or shorten \
             prompts / reuse shared prefixes through the prefix cache.",
            step_tokens.map_or(String::new(), |t| format!(
                " (the p99 step carries {} tokens now)",
                count_bucket_text(&t)
            ))
        ),
    )
}

/// The prefix cache rarely hits although prompts are long enough to gain.
pub fn prefix_cache(s: &Summary) -> Outcome {
    let Some(prompt) = s.prompt_len else {
        return Outcome::Skipped("no request_prompt_tokens histogram".into());
    };
    let Some(prompt_mean) = prompt.mean else {
        return if prompt.count < MIN_REQUESTS {
            Outcome::Clear
        } else {
            Outcome::Skipped(NO_SUM.into())
        };
    };
    let prompt_tps = s.prompt_tokens_per_s.unwrap_or(0.0);
    let total_tps = prompt_tps + s.generation_tokens_per_s.unwrap_or(0.0);
    if prompt.count < MIN_REQUESTS
        || prompt_mean < PREFIX_PAYOFF_PROMPT_TOKENS
        || total_tps <= 0.0
        || prompt_tps / total_tps < PREFIX_PAYOFF_PROMPT_SHARE
    {
        return Outcome::Clear;
    }
    let evidence = |hit: Option<f64>| {
        let mut v = vec![
            ev("prompt_tokens_mean", prompt_mean, "tokens"),
            ev("prompt_token_share", prompt_tps / total_tps, "ratio"),
        ];
        if let Some(h) = hit {
            v.insert(0, ev("prefix_hit_rate", h, "ratio"));
            v.push(ev(
                "prefix_cache_queries",
                s.prefix_cache_queries.unwrap_or(0.0),
                "tokens",
            ));
        }
        v
    };
    if s.prefix_caching_enabled == Some(false) {
        return fire(
            "prefix_cache",
            Severity::Info,
            format!(
                "Prefix caching is off while prompts average {:.0} tokens and are {} of the tokens processed",
                prompt_mean,
                pct(prompt_tps / total_tps)
            ),
            evidence(None),
            "Enable it (--enable-prefix-caching) if requests share prefixes (system prompts, \
             few-shot examples, multi-turn history): hits skip their prefill."
                .to_string(),
        );
    }
    // The share of prompt tokens the cache served, each prompt counted once,
    // is the prefill actually saved; the lookup hit rate also counts the
    // re-lookups of preempted requests (which find their own blocks again),
    // so it is the fallback for servers without prompt_tokens_by_source.
    if let Some((from_cache, computed)) = s.prompt_tokens_by_source
        && from_cache + computed > 0.0
    {
        let saved = from_cache / (from_cache + computed);
        if saved >= PREFIX_HIT_LOW {
            return Outcome::Clear;
        }
        let mut evidence = evidence(None);
        evidence.insert(0, ev("prompt_tokens_from_cache_share", saved, "ratio"));
        evidence.push(ev("prompt_tokens_computed", computed, "tokens"));
        if let (Some(q), Some(h)) = (s.prefix_cache_queries, s.prefix_cache_hits)
            && q > 0.0
        {
            evidence.push(ev("prefix_hit_rate", h / q, "ratio"));
            evidence.push(ev("prefix_cache_queries", q, "tokens"));
        }
        return fire(
            "prefix_cache",
            Severity::Info,
            format!(
                "The prefix cache served {} of prompt tokens ({:.0} of {:.0}) while prompts \
                 average {:.0} tokens: prefill work could be saved",
                pct(saved),
                from_cache,
                from_cache + computed,
                prompt_mean
            ),
            evidence,
            PREFIX_ACTION.to_string(),
        );
    }
    let (Some(q), Some(h)) = (s.prefix_cache_queries, s.prefix_cache_hits) else {
        return Outcome::Skipped("no prefix_cache_queries / prefix_cache_hits counters".into());
    };
    if q <= 0.0 {
        return Outcome::Clear;
    }
    let rate = h / q;
    if rate >= PREFIX_HIT_LOW {
        return Outcome::Clear;
    }
    fire(
        "prefix_cache",
        Severity::Info,
        format!(
            "Prefix-cache hit rate is {} while prompts average {:.0} tokens: prefill work could be saved",
            pct(rate),
            prompt_mean
        ),
        evidence(Some(rate)),
        PREFIX_ACTION.to_string(),
    )
}

/// What to do about a cache that serves little of the prompts.
const PREFIX_ACTION: &str = "Put the shared part of prompts (system prompt, instructions, \
     documents) first and byte-identical across requests; with several replicas, route requests \
     with the same prefix to the same one (session or prefix affinity).";

/// Runs every rule and ranks the findings; adds the healthy verdict (with the
/// headroom left) when nothing is wrong, or says there was no traffic.
/// `trend` is the failures in the window's earlier and later halves, when known.
pub fn diagnose(s: &Summary, trend: Option<(f64, f64)>) -> Diagnosis {
    // The order is the priority among findings of equal severity.
    let outcomes = [
        ("errors", errors_and_rejections(s, trend)),
        ("kv_saturated", kv_saturated(s)),
        ("queue_bound", queue_bound(s)),
        // Before host_bound: late masks are host time too, and this names them.
        ("grammar_masks", grammar_masks(s)),
        ("host_bound", host_bound(s)),
        ("dp_imbalance", dp_imbalance(s)),
        ("tenant_hog", tenant_hog(s)),
        ("long_prompts", long_prompts(s)),
        ("prefix_cache", prefix_cache(s)),
    ];
    let mut findings = Vec::new();
    let mut skipped = Vec::new();
    for (rule, o) in outcomes {
        match o {
            Outcome::Fired(f) => findings.push(f),
            Outcome::Clear => {}
            Outcome::Skipped(reason) => skipped.push(Skipped { rule, reason }),
        }
    }
    if s.admission_rejections.is_none() && s.namespace != DEFAULT_NAMESPACE {
        // inferscope always counts refusals (the family appears with the
        // first one); vLLM has no such counter, so absence proves nothing.
        skipped.push(Skipped {
            rule: "admission_rejections",
            reason: "no admission_rejections counter in the exposition (vLLM exports none): \
                     requests refused before reaching the engine are not counted; the errors \
                     rule still reads finished_reason=\"error\" and HTTP 5xx"
                .into(),
        });
    }
    if !findings.iter().any(|f| f.severity >= Severity::Warning) {
        findings.push(verdict(s, &skipped));
    }
    if client_side_only(s) {
        findings.push(client_side_note());
    }
    // Stable: equal severities keep the rule order above.
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    Diagnosis { findings, skipped }
}

/// Latencies but no engine series at all: the exposition of `inferscope
/// proxy` (or another front end that measures only what the client sees).
pub fn client_side_only(s: &Summary) -> bool {
    s.ttft.is_some()
        && s.kv_usage_peak.is_none()
        && s.waiting_peak.is_none()
        && s.queue.is_none()
        && s.device_utilisation.is_none()
        && s.prefix_caching_enabled.is_none()
        && s.iteration_tokens.is_none()
}

/// What doctor cannot tell from a client-side exposition.
fn client_side_note() -> Finding {
    Finding {
        id: "client_side_only",
        severity: Severity::Info,
        title: "Measured from the client side (inferscope proxy): cannot tell KV-cache \
                saturation, queueing, host versus device time, prefix-cache reuse or \
                data-parallel balance"
            .into(),
        evidence: Vec::new(),
        action: "Scrape the upstream's own metrics too (`inferscope proxy --upstream-metrics`), \
                 or run doctor against the upstream if it exposes vLLM's or inferscope's names."
            .into(),
    }
}

/// Whether the window saw any work: requests finished or refused, requests
/// running, tokens, or latency observations (a partial exposition may lack
/// the request counter but still show tokens and histograms).
fn traffic(s: &Summary) -> bool {
    let positive = |v: Option<f64>| v.is_some_and(|v| v > 0.0);
    let observed = |d: Option<crate::window::Dist>| d.is_some_and(|d| d.count > 0.0);
    attempts(s) > 0.0
        || positive(s.running_peak)
        || positive(s.prompt_tokens_per_s)
        || positive(s.generation_tokens_per_s)
        || observed(s.ttft)
        || observed(s.itl)
        || observed(s.e2e)
        || observed(s.queue)
}

/// The verdict when no rule found a problem: healthy with headroom, no
/// problem found in what could be judged (some rules lacked metrics), or idle.
fn verdict(s: &Summary, skipped: &[Skipped]) -> Finding {
    if !traffic(s) {
        return Finding {
            id: "no_traffic",
            severity: Severity::Info,
            title: format!(
                "No requests during the {:.1} s window: nothing to judge",
                s.window_s
            ),
            evidence: vec![ev("window", s.window_s, "s")],
            action: "Run doctor while the server takes its usual load, or widen --window.".into(),
        };
    }
    // Only measured figures: a gauge the server does not export is said to
    // be missing, never shown as 0.
    let mut evidence = Vec::new();
    if let Some(r) = s.requests_per_s {
        evidence.push(ev("requests_per_s", r, "per_s"));
    }
    let mut headroom = Vec::new();
    match s.kv_usage_peak {
        Some(k) => {
            evidence.push(ev("kv_usage_peak", k, "ratio"));
            evidence.push(ev("kv_headroom", 1.0 - k, "ratio"));
            headroom.push(format!("KV cache peaked at {} {}", pct(k), in_scrapes(s)));
        }
        None => headroom.push("KV cache usage not exported".to_string()),
    }
    if let Some(w) = s.waiting_peak {
        evidence.push(ev("waiting_peak", w, "requests"));
    }
    if let Some(u) = s.device_utilisation {
        evidence.push(ev("device_utilisation", u, "ratio"));
        headroom.push(format!("device {} busy", pct(u)));
    }
    if let Some(p99) = s.ttft.and_then(|d| d.p99) {
        bucket_ev(&mut evidence, "ttft_p99", Some(p99), "s");
        headroom.push(format!("TTFT p99 {}", p99.bound.secs_text()));
    }
    if let Some(p99) = s.itl.and_then(|d| d.p99) {
        bucket_ev(&mut evidence, "itl_p99", Some(p99), "s");
        headroom.push(format!("ITL p99 {}", p99.bound.secs_text()));
    }
    if skipped.is_empty() {
        return Finding {
            id: "healthy",
            severity: Severity::Ok,
            title: format!("Healthy: no problem found ({})", headroom.join(", ")),
            evidence,
            action: "Nothing to change. The headroom left is the KV cache not in use and the \
                     device time not busy; load beyond it will first show as queueing."
                .into(),
        };
    }
    // Some rules could not run: say what was judged and what was not,
    // rather than call the server healthy.
    let rules: Vec<&str> = skipped.iter().map(|k| k.rule).collect();
    Finding {
        id: "no_problem_found",
        severity: Severity::Ok,
        title: format!(
            "No problem found in what the server exports ({}); not evaluated: {}",
            headroom.join(", "),
            rules.join(", ")
        ),
        evidence,
        action: "Nothing to change on this evidence. The rules listed under \"rules not \
                 evaluated\" lacked the metrics they need: judge those causes another way \
                 (device profiler, server logs) before calling the server healthy."
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Dist;
    use std::collections::BTreeMap;

    fn bucket(lower: f64, upper: f64, index: usize) -> Bucket {
        Bucket::new(inferscope_schema::scrape::BucketBound {
            lower,
            upper,
            index,
            buckets: 3,
        })
    }

    fn d(count: f64, mean: f64) -> Option<Dist> {
        Some(Dist {
            count,
            mean: Some(mean),
            p50: Some(bucket(0.0, mean, 0)),
            p99: Some(bucket(mean, mean * 2.0, 1)),
        })
    }

    fn busy() -> Summary {
        Summary {
            namespace: "inferscope".into(),
            window_s: 10.0,
            scrapes: 9,
            finished_by_reason: [("length".to_string(), 100.0)].into_iter().collect(),
            requests_per_s: Some(10.0),
            running_mean: Some(4.0),
            running_peak: Some(8.0),
            waiting_mean: Some(0.0),
            waiting_peak: Some(0.0),
            kv_usage_peak: Some(0.3),
            kv_usage_mean: Some(0.2),
            preemptions: Some(0.0),
            ttft: d(100.0, 0.05),
            itl: d(1000.0, 0.01),
            e2e: d(100.0, 0.5),
            queue: d(100.0, 0.0),
            prefill: d(100.0, 0.04),
            prompt_len: d(100.0, 64.0),
            prompt_tokens_per_s: Some(640.0),
            generation_tokens_per_s: Some(1000.0),
            ..Summary::default()
        }
    }

    #[test]
    fn a_busy_unremarkable_server_is_healthy() {
        // Without device metrics the host rule says why it did not run, and
        // the verdict does not claim health.
        let dg = diagnose(&busy(), None);
        assert_eq!(dg.findings.len(), 1);
        assert_eq!(dg.findings[0].id, "no_problem_found");
        assert!(dg.skipped.iter().any(|s| s.rule == "host_bound"));
        assert!(
            dg.findings[0].title.ends_with("not evaluated: host_bound"),
            "{}",
            dg.findings[0].title
        );
        // With them, every rule ran: healthy.
        let mut s = busy();
        s.device_utilisation = Some(0.9);
        s.idle_fraction = Some(0.05);
        s.phases = Some(crate::window::Phases {
            schedule: 0.01,
            execute: 0.9,
            postprocess: 0.01,
            device: Some(0.85),
        });
        let dg = diagnose(&s, None);
        assert!(dg.skipped.is_empty(), "{:?}", dg.skipped);
        assert_eq!(dg.findings[0].id, "healthy");
        assert_eq!(dg.findings[0].evidence("kv_headroom"), Some(0.7));
    }

    /// The sim with 256 constrained sequences before masks were parallel:
    /// 78% busy, 3.3 ms of masks per step against 6 ms of device time.
    fn constrained(util: f64, mask_s: f64, mask_steps: f64) -> Summary {
        let mut s = busy();
        s.running_mean = Some(250.0);
        s.device_utilisation = Some(util);
        s.idle_fraction = Some(0.0);
        s.phases = Some(crate::window::Phases {
            schedule: 0.02,
            execute: 0.95,
            postprocess: 0.03,
            device: Some(util),
        });
        // 10 s at `util` busy in 6 ms device steps.
        let all_steps = (util * 10.0 / 0.006_f64).round();
        s.grammar_masks = Some(crate::window::GrammarMasks {
            steps: mask_steps.min(all_steps),
            seconds: mask_s * mask_steps.min(all_steps),
            all_steps: Some(all_steps),
        });
        s
    }

    #[test]
    fn masks_as_long_as_half_the_device_step_hold_it_back() {
        let dg = diagnose(&constrained(0.78, 0.0033, 1e9), None);
        let f = &dg.findings[0];
        assert_eq!(f.id, "grammar_masks", "{:?}", dg.findings);
        assert_eq!(f.severity, Severity::Warning);
        let ratio = f.evidence("mask_to_device_step_ratio").expect("ratio");
        assert!((ratio - 0.55).abs() < 0.01, "{ratio}");
        let per_step = f.evidence("grammar_mask_per_step").expect("per step");
        assert!((per_step - 0.0033).abs() < 1e-9, "{per_step}");
        assert_eq!(f.evidence("constrained_step_fraction"), Some(1.0));
        assert!(f.action.contains("--grammar-threads"), "{}", f.action);
        // Masks hidden behind the step, a busy device, few constrained
        // steps, or no mask metric at all: nothing to say.
        for (s, why) in [
            (constrained(0.78, 0.001, 1e9), "short masks"),
            (constrained(0.97, 0.0033, 1e9), "a busy device"),
            (constrained(0.78, 0.0033, 50.0), "few constrained steps"),
            (constrained(0.78, 0.0, 0.0), "no constrained steps"),
            (
                Summary {
                    grammar_masks: None,
                    ..constrained(0.78, 0.0033, 1e9)
                },
                "no mask metric",
            ),
        ] {
            assert!(
                matches!(grammar_masks(&s), Outcome::Clear),
                "{why}: {:?}",
                grammar_masks(&s)
            );
        }
    }

    #[test]
    fn a_vllm_summary_notes_the_missing_rejection_counter() {
        let mut s = busy();
        s.namespace = "vllm".into();
        let dg = diagnose(&s, None);
        assert!(dg.skipped.iter().any(|k| k.rule == "admission_rejections"));
        // Once the counter is there (inferscope under the vllm namespace
        // after a refusal), it is read, not noted.
        s.admission_rejections = Some(0.0);
        let dg = diagnose(&s, None);
        assert!(!dg.skipped.iter().any(|k| k.rule == "admission_rejections"));
    }

    #[test]
    fn rising_errors_are_critical_and_outrank_everything() {
        let mut s = busy();
        s.finished_by_reason.insert("error".into(), 10.0);
        s.preemptions = Some(50.0);
        let dg = diagnose(&s, Some((1.0, 9.0)));
        let f = &dg.findings[0];
        assert_eq!(f.id, "errors");
        assert_eq!(f.severity, Severity::Critical);
        assert!(f.title.contains("rising"), "{}", f.title);
        assert_eq!(f.evidence("errored_requests"), Some(10.0));
        assert_eq!(dg.findings[1].id, "kv_saturated");
        // Below one percent: clear.
        let mut s = busy();
        s.finished_by_reason.insert("error".into(), 0.5);
        assert_eq!(errors_and_rejections(&s, None), Outcome::Clear);
    }

    #[test]
    fn full_kv_without_preemption_warns() {
        let mut s = busy();
        s.kv_usage_peak = Some(0.97);
        s.waiting_mean = Some(3.0);
        let Outcome::Fired(f) = kv_saturated(&s) else {
            panic!("expected a finding");
        };
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.title.contains("wait for blocks"));
    }

    #[test]
    fn queueing_needs_room_in_the_kv_cache() {
        let mut s = busy();
        s.queue = d(100.0, 0.3);
        let Outcome::Fired(f) = queue_bound(&s) else {
            panic!("expected a finding");
        };
        assert_eq!(f.severity, Severity::Critical);
        // A gauge's peak says how many readings it is over.
        let scrapes = format!("in the {} scrapes read", s.scrapes);
        assert!(f.title.contains(&scrapes), "{}", f.title);
        assert!(f.action.contains(&scrapes), "{}", f.action);
        s.kv_usage_peak = Some(0.85);
        assert_eq!(queue_bound(&s), Outcome::Clear);
        // Too few requests to judge.
        let mut s = busy();
        s.queue = d(2.0, 0.3);
        s.e2e = d(2.0, 0.5);
        assert_eq!(queue_bound(&s), Outcome::Clear);
    }

    #[test]
    fn prefix_caching_off_with_long_prompts_is_an_opportunity() {
        let mut s = busy();
        s.prompt_len = d(100.0, 2000.0);
        s.prompt_tokens_per_s = Some(20000.0);
        s.prefix_caching_enabled = Some(false);
        let Outcome::Fired(f) = prefix_cache(&s) else {
            panic!("expected a finding");
        };
        assert_eq!(f.severity, Severity::Info);
        assert!(f.action.contains("--enable-prefix-caching"));
        // On, with a good hit rate: clear.
        s.prefix_caching_enabled = Some(true);
        s.prefix_cache_queries = Some(1000.0);
        s.prefix_cache_hits = Some(600.0);
        assert_eq!(prefix_cache(&s), Outcome::Clear);
    }

    #[test]
    fn prompt_tokens_by_source_outrank_the_lookup_hit_rate() {
        let mut s = busy();
        s.prompt_len = d(100.0, 2000.0);
        s.prompt_tokens_per_s = Some(20_000.0);
        s.prefix_caching_enabled = Some(true);
        // Preempted requests re-find their own blocks: lookups hit 60%, yet
        // the cache served only 1000 of 20000 prompt tokens (5%).
        s.prefix_cache_queries = Some(40_000.0);
        s.prefix_cache_hits = Some(24_000.0);
        assert_eq!(prefix_cache(&s), Outcome::Clear, "lookups alone look fine");
        s.prompt_tokens_by_source = Some((1_000.0, 19_000.0));
        let Outcome::Fired(f) = prefix_cache(&s) else {
            panic!("expected a finding")
        };
        assert!(
            f.title
                .contains("served 5% of prompt tokens (1000 of 20000)"),
            "{}",
            f.title
        );
        assert_eq!(f.evidence("prompt_tokens_from_cache_share"), Some(0.05));
        assert_eq!(f.evidence("prompt_tokens_computed"), Some(19_000.0));
        assert_eq!(f.evidence("prefix_hit_rate"), Some(0.6));
        // A cache that serves most of the prompts is fine, whatever the lookups say.
        s.prefix_cache_hits = Some(0.0);
        s.prompt_tokens_by_source = Some((15_000.0, 5_000.0));
        assert_eq!(prefix_cache(&s), Outcome::Clear);
    }

    #[test]
    fn a_tenant_holding_the_server_while_others_wait_is_named() {
        let tokens =
            |a: f64, b: f64| BTreeMap::from([("team-a".to_string(), a), ("team-b".to_string(), b)]);
        let s = Summary {
            tenant_tokens: tokens(9000.0, 500.0),
            waiting_mean: Some(12.0),
            ..busy()
        };
        let dg = diagnose(&s, None);
        let f = dg
            .findings
            .iter()
            .find(|f| f.id == "tenant_hog")
            .expect("tenant_hog fires");
        assert!(f.title.contains("team-a"), "{}", f.title);
        assert!((f.evidence("top_tenant_token_share").unwrap() - 9000.0 / 9500.0).abs() < 1e-9);
        // Balanced tenants, or nobody waiting, or one tenant alone: clear.
        for s in [
            Summary {
                tenant_tokens: tokens(5000.0, 4500.0),
                waiting_mean: Some(12.0),
                ..busy()
            },
            Summary {
                tenant_tokens: tokens(9000.0, 500.0),
                waiting_mean: Some(0.2),
                ..busy()
            },
            Summary {
                tenant_tokens: tokens(9000.0, 0.0),
                waiting_mean: Some(12.0),
                ..busy()
            },
        ] {
            assert_eq!(tenant_hog(&s), Outcome::Clear, "{:?}", s.tenant_tokens);
        }
        assert_eq!(tenant_hog(&busy()), Outcome::Clear, "no tenant label");
    }

    #[test]
    fn idle_window_says_so() {
        let s = Summary {
            window_s: 5.0,
            ..Summary::default()
        };
        let dg = diagnose(&s, None);
        assert_eq!(dg.findings[0].id, "no_traffic");
    }

    #[test]
    fn a_proxy_exposition_says_what_it_cannot_tell() {
        let s = Summary {
            waiting_mean: None,
            waiting_peak: None,
            kv_usage_peak: None,
            kv_usage_mean: None,
            queue: None,
            prefill: None,
            device_utilisation: None,
            idle_fraction: None,
            phases: None,
            preemptions: None,
            prefix_caching_enabled: None,
            iteration_tokens: None,
            ..busy()
        };
        let dg = diagnose(&s, None);
        let ids: Vec<&str> = dg.findings.iter().map(|f| f.id).collect();
        assert!(ids.contains(&"client_side_only"), "{ids:?}");
        // A server's exposition is not mistaken for a proxy's.
        let dg = diagnose(&busy(), None);
        assert!(dg.findings.iter().all(|f| f.id != "client_side_only"));
    }
}
