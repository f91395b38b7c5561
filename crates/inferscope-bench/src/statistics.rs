//! Benchmark statistics: per-request measurements to the report's figures.

use crate::client::RequestOutput;
use crate::dataset::CountedBy;
use crate::error::BenchError;

/// Linear-interpolation percentile (numpy's default) of sorted data; 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (p / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// Arithmetic mean; 0 when empty.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Population standard deviation (numpy's default, ddof = 0); 0 when empty.
pub fn std_dev(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64).sqrt()
}

/// One latency metric of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Time to first token.
    Ttft,
    /// Time per output token, excluding the first.
    Tpot,
    /// Inter-token latency.
    Itl,
    /// End-to-end latency.
    E2el,
}

impl Metric {
    /// All metrics in report order.
    pub const ALL: [Metric; 4] = [Metric::Ttft, Metric::Tpot, Metric::Itl, Metric::E2el];

    /// Key used in flags and JSON (`ttft`, …).
    pub fn key(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Tpot => "tpot",
            Metric::Itl => "itl",
            Metric::E2el => "e2el",
        }
    }

    /// Short name in the report (`TTFT`, …).
    pub fn name(self) -> &'static str {
        match self {
            Metric::Ttft => "TTFT",
            Metric::Tpot => "TPOT",
            Metric::Itl => "ITL",
            Metric::E2el => "E2EL",
        }
    }

    /// Section header in the report.
    pub fn header(self) -> &'static str {
        match self {
            Metric::Ttft => "Time to First Token",
            Metric::Tpot => "Time per Output Token (excl. 1st token)",
            Metric::Itl => "Inter-token Latency",
            Metric::E2el => "End-to-end Latency",
        }
    }
}

/// Parses `--percentile-metrics` (comma-separated).
pub fn parse_metrics(s: &str) -> Result<Vec<Metric>, BenchError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let m = Metric::ALL
            .into_iter()
            .find(|m| m.key() == part)
            .ok_or_else(|| BenchError::InvalidArg(format!("unknown percentile metric {part:?}")))?;
        if !out.contains(&m) {
            out.push(m);
        }
    }
    Ok(out)
}

/// Parses `--metric-percentiles` (comma-separated numbers in [0, 100]).
pub fn parse_percentiles(s: &str) -> Result<Vec<f64>, BenchError> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.parse::<f64>() {
            Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
            _ => Err(BenchError::InvalidArg(format!("bad percentile {p:?}"))),
        })
        .collect()
}

/// `99` for 99.0, `99.9` for 99.9 (as Python's `str(int(p))` / `str(p)`).
pub fn percentile_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// Service-level objectives for goodput, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slo {
    /// TTFT limit.
    pub ttft_ms: Option<f64>,
    /// TPOT limit.
    pub tpot_ms: Option<f64>,
    /// E2EL limit.
    pub e2el_ms: Option<f64>,
}

impl Slo {
    /// Parses `--goodput ttft:MS tpot:MS e2el:MS`.
    pub fn parse(items: &[String]) -> Result<Option<Slo>, BenchError> {
        if items.is_empty() {
            return Ok(None);
        }
        let mut slo = Slo::default();
        for item in items {
            let (k, v) = item.split_once(':').ok_or_else(|| {
                BenchError::InvalidArg(format!("--goodput {item:?}: expected NAME:MS"))
            })?;
            let ms: f64 = v
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| {
                    BenchError::InvalidArg(format!("--goodput {item:?}: bad milliseconds"))
                })?;
            match k {
                "ttft" => slo.ttft_ms = Some(ms),
                "tpot" => slo.tpot_ms = Some(ms),
                "e2el" => slo.e2el_ms = Some(ms),
                _ => {
                    return Err(BenchError::InvalidArg(format!(
                        "--goodput {item:?}: metric must be ttft, tpot or e2el"
                    )));
                }
            }
        }
        Ok(Some(slo))
    }
}

/// Mean, median, standard deviation and chosen percentiles, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Distribution {
    /// Mean.
    pub mean_ms: f64,
    /// Median.
    pub median_ms: f64,
    /// Standard deviation (population).
    pub std_ms: f64,
    /// `(percentile, value)` pairs.
    pub percentiles_ms: Vec<(f64, f64)>,
}

impl Distribution {
    /// Summarises values given in seconds.
    pub fn from_seconds(xs: &[f64], ps: &[f64]) -> Self {
        let mut sorted: Vec<f64> = xs.iter().map(|x| x * 1000.0).collect();
        sorted.sort_by(f64::total_cmp);
        Distribution {
            mean_ms: mean(&sorted),
            median_ms: percentile(&sorted, 50.0),
            std_ms: std_dev(&sorted),
            percentiles_ms: ps.iter().map(|&p| (p, percentile(&sorted, p))).collect(),
        }
    }
}

/// The figures of one benchmark run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BenchmarkMetrics {
    /// Successful requests.
    pub completed: usize,
    /// Failed requests.
    pub failed: usize,
    /// Prompt tokens of successful requests.
    pub total_input: usize,
    /// Output tokens of successful requests.
    pub total_output: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Requests meeting every SLO per second (None without SLOs).
    pub request_goodput: Option<f64>,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Input plus output tokens per second.
    pub total_token_throughput: f64,
    /// Most tokens in any 1-second bucket.
    pub max_output_tokens_per_s: f64,
    /// Largest overlap of `[start, start + latency)`.
    pub max_concurrent_requests: f64,
    /// Time to first token.
    pub ttft: Distribution,
    /// Time per output token.
    pub tpot: Distribution,
    /// Inter-token latency.
    pub itl: Distribution,
    /// End-to-end latency.
    pub e2el: Distribution,
    /// Output length per request (0 for failures), in request order.
    pub output_lens: Vec<usize>,
    /// How `total_input` was counted (the weakest of its parts).
    pub input_counted_by: CountedBy,
    /// How `total_output` was counted (the weakest of its parts).
    pub output_counted_by: CountedBy,
}

impl BenchmarkMetrics {
    /// The distribution of one metric.
    pub fn dist(&self, m: Metric) -> &Distribution {
        match m {
            Metric::Ttft => &self.ttft,
            Metric::Tpot => &self.tpot,
            Metric::Itl => &self.itl,
            Metric::E2el => &self.e2el,
        }
    }
}

/// How the dataset's prompt lengths, and outputs the server sent no usage
/// for, were counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counting {
    /// The dataset's prompt lengths.
    pub prompts: CountedBy,
    /// `counted_output_tokens`.
    pub outputs: CountedBy,
}

/// Output tokens of one request and how they were counted: the usage chunk,
/// else a tokenizer's count of the text (when one counted it), else the number
/// of choice-bearing events (an estimate: a chunk may carry several tokens).
pub fn output_tokens(o: &RequestOutput, counting: Counting) -> (usize, CountedBy) {
    match (o.usage_output_tokens, o.counted_output_tokens) {
        (Some(n), _) => (n, CountedBy::Usage),
        (None, Some(n)) => (n, counting.outputs),
        (None, None) => (o.chunks, CountedBy::Estimate),
    }
}

/// Prompt tokens of one request and how they were counted: the server's
/// usage, else the dataset's length.
pub fn input_tokens(o: &RequestOutput, counting: Counting) -> (usize, CountedBy) {
    match o.usage_prompt_tokens {
        Some(n) => (n, CountedBy::Usage),
        None => (o.prompt_len, counting.prompts),
    }
}

/// Computes the report's figures from per-request outputs.
pub fn compute(
    outputs: &[RequestOutput],
    duration_s: f64,
    slo: Option<&Slo>,
    percentiles: &[f64],
    counting: Counting,
) -> BenchmarkMetrics {
    let mut m = BenchmarkMetrics::default();
    let (mut ttfts, mut tpots, mut itls, mut e2els) = (vec![], vec![], vec![], vec![]);
    let mut good = 0usize;
    let (mut input_by, mut output_by) = (None::<CountedBy>, None::<CountedBy>);
    for o in outputs {
        if !o.success {
            m.failed += 1;
            m.output_lens.push(0);
            continue;
        }
        let (n, out_by) = output_tokens(o, counting);
        let (n_in, in_by) = input_tokens(o, counting);
        output_by = Some(output_by.map_or(out_by, |b| b.and(out_by)));
        input_by = Some(input_by.map_or(in_by, |b| b.and(in_by)));
        m.output_lens.push(n);
        m.completed += 1;
        m.total_input += n_in;
        m.total_output += n;
        // TPOT is 0 for single-token outputs when judging SLOs (as vLLM does),
        // but such requests do not enter the TPOT distribution.
        let tpot = if n > 1 {
            let t = (o.latency - o.ttft) / (n - 1) as f64;
            tpots.push(t);
            t
        } else {
            0.0
        };
        ttfts.push(o.ttft);
        e2els.push(o.latency);
        itls.extend_from_slice(&o.itl);
        if let Some(s) = slo {
            let ok = s.ttft_ms.is_none_or(|l| o.ttft * 1000.0 <= l)
                && s.tpot_ms.is_none_or(|l| tpot * 1000.0 <= l)
                && s.e2el_ms.is_none_or(|l| o.latency * 1000.0 <= l);
            good += usize::from(ok);
        }
    }
    // With nothing completed the totals are 0; say how they would have been counted.
    m.input_counted_by = input_by.unwrap_or(counting.prompts);
    m.output_counted_by = output_by.unwrap_or(counting.outputs);
    let d = if duration_s > 0.0 {
        duration_s
    } else {
        f64::INFINITY
    };
    m.request_throughput = m.completed as f64 / d;
    m.output_throughput = m.total_output as f64 / d;
    m.total_token_throughput = (m.total_input + m.total_output) as f64 / d;
    m.request_goodput = slo.map(|_| good as f64 / d);
    m.max_output_tokens_per_s = peak_tokens_per_second(outputs);
    m.max_concurrent_requests = peak_concurrency(outputs) as f64;
    m.ttft = Distribution::from_seconds(&ttfts, percentiles);
    m.tpot = Distribution::from_seconds(&tpots, percentiles);
    m.itl = Distribution::from_seconds(&itls, percentiles);
    m.e2el = Distribution::from_seconds(&e2els, percentiles);
    m
}

/// Largest number of choice-bearing events (tokens) of successful requests in
/// any 1-second bucket counted from the earliest start.
pub fn peak_tokens_per_second(outputs: &[RequestOutput]) -> f64 {
    let ok: Vec<&RequestOutput> = outputs.iter().filter(|o| o.success).collect();
    let Some(t0) = ok.iter().map(|o| o.start).reduce(f64::min) else {
        return 0.0;
    };
    let t_end = ok.iter().map(|o| o.start + o.latency).fold(t0, f64::max);
    let n_buckets = (t_end - t0).ceil() as usize + 1;
    let mut buckets = vec![0u64; n_buckets];
    for o in ok {
        let mut t = o.start + o.ttft;
        let mut add = |t: f64| {
            let b = (t - t0).max(0.0) as usize;
            if let Some(slot) = buckets.get_mut(b) {
                *slot += 1;
            }
        };
        add(t);
        for gap in &o.itl {
            t += gap;
            add(t);
        }
    }
    buckets.into_iter().max().unwrap_or(0) as f64
}

/// Largest number of successful requests in flight at once: the maximum
/// overlap of the half-open intervals `[start, start + latency)`.
pub fn peak_concurrency(outputs: &[RequestOutput]) -> usize {
    let mut edges: Vec<(f64, i32)> = Vec::new();
    for o in outputs.iter().filter(|o| o.success) {
        edges.push((o.start, 1));
        edges.push((o.start + o.latency, -1));
    }
    // Ends sort before starts at the same instant: the intervals are half-open.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut cur, mut best) = (0i32, 0i32);
    for (_, d) in edges {
        cur += d;
        best = best.max(cur);
    }
    best as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_linearly() {
        let xs = [1.0, 2.0, 3.0, 4.0, 10.0];
        assert_eq!(percentile(&xs, 0.0), 1.0);
        assert_eq!(percentile(&xs, 50.0), 3.0);
        assert_eq!(percentile(&xs, 100.0), 10.0);
        // rank 0.9 * 4 = 3.6 → 4 + 0.6 * (10 - 4)
        assert!((percentile(&xs, 90.0) - 7.6).abs() < 1e-12);
        // rank 0.25 * 4 = 1 exactly
        assert_eq!(percentile(&xs, 25.0), 2.0);
        // Two points: p99 = a + 0.99 (b - a)
        assert!((percentile(&[0.0, 100.0], 99.0) - 99.0).abs() < 1e-12);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn mean_and_population_std() {
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&xs), 5.0);
        assert_eq!(std_dev(&xs), 2.0);
        let d = Distribution::from_seconds(&[0.003, 0.001, 0.002], &[50.0, 99.0]);
        assert!((d.mean_ms - 2.0).abs() < 1e-9);
        assert!((d.median_ms - 2.0).abs() < 1e-9);
        assert!((d.percentiles_ms[1].1 - 2.98).abs() < 1e-9);
    }

    fn req(start: f64, ttft: f64, itl: &[f64], usage: Option<usize>) -> RequestOutput {
        RequestOutput {
            success: true,
            start,
            ttft,
            itl: itl.to_vec(),
            latency: ttft + itl.iter().sum::<f64>(),
            chunks: itl.len() + 1,
            usage_output_tokens: usage,
            prompt_len: 10,
            ..Default::default()
        }
    }

    #[test]
    fn compute_definitions() {
        let outs = vec![
            req(0.0, 0.1, &[0.02, 0.02, 0.02], Some(4)),
            req(0.5, 0.3, &[0.01], None),
            RequestOutput {
                prompt_len: 99,
                error: "HTTP 500".into(),
                ..Default::default()
            },
        ];
        let slo = Slo {
            ttft_ms: Some(200.0),
            ..Default::default()
        };
        let exact = Counting {
            prompts: CountedBy::Tokenizer,
            outputs: CountedBy::Tokenizer,
        };
        let m = compute(&outs, 2.0, Some(&slo), &[99.0], exact);
        assert_eq!((m.completed, m.failed), (2, 1));
        assert_eq!(m.total_input, 20);
        assert_eq!(m.total_output, 4 + 2);
        assert_eq!(m.output_lens, vec![4, 2, 0]);
        assert_eq!(m.request_throughput, 1.0);
        assert_eq!(m.request_goodput, Some(0.5));
        assert_eq!(m.output_throughput, 3.0);
        assert_eq!(m.total_token_throughput, 13.0);
        // TPOT: (0.16 - 0.1) / 3 = 0.02 and (0.31 - 0.3) / 1 = 0.01.
        assert!((m.tpot.mean_ms - 15.0).abs() < 1e-9);
        assert!((m.ttft.mean_ms - 200.0).abs() < 1e-9);
        assert!((m.e2el.median_ms - 235.0).abs() < 1e-9);
        assert_eq!(m.itl.percentiles_ms.len(), 1);
        assert!((m.itl.mean_ms - 17.5).abs() < 1e-9);
        assert_eq!(m.max_concurrent_requests, 1.0);
        assert_eq!(m.max_output_tokens_per_s, 6.0);
        // One output's length is the chunk count: the total is an estimate.
        assert_eq!(m.output_counted_by, CountedBy::Estimate);
        assert_eq!(m.input_counted_by, CountedBy::Tokenizer);
        // A tokenizer counted the text: its count wins over the chunks.
        let mut outs2 = outs.clone();
        outs2[1].counted_output_tokens = Some(9);
        outs2[0].usage_prompt_tokens = Some(11);
        outs2[1].usage_prompt_tokens = Some(12);
        let m2 = compute(&outs2, 2.0, None, &[99.0], exact);
        assert_eq!(m2.output_lens, vec![4, 9, 0]);
        assert_eq!(m2.output_counted_by, CountedBy::Tokenizer);
        assert_eq!(m2.request_goodput, None);
        // Usage's prompt counts win over the dataset's.
        assert_eq!(m2.total_input, 23);
        assert_eq!(m2.input_counted_by, CountedBy::Usage);
        // Dataset lengths from words: an estimate, said so.
        let m3 = compute(&outs, 2.0, None, &[99.0], Counting::default());
        assert_eq!(m3.input_counted_by, CountedBy::Estimate);
    }

    #[test]
    fn concurrency_is_half_open_overlap() {
        let outs = vec![
            req(0.0, 1.0, &[], None),
            req(1.0, 1.0, &[], None),
            req(0.5, 1.0, &[], None),
        ];
        assert_eq!(peak_concurrency(&outs), 2);
    }

    #[test]
    fn parsing_flags() {
        assert_eq!(
            parse_metrics("ttft, e2el").expect("ok"),
            vec![Metric::Ttft, Metric::E2el]
        );
        assert!(parse_metrics("ttft,bogus").is_err());
        assert_eq!(parse_percentiles("50,99.9").expect("ok"), vec![50.0, 99.9]);
        assert!(parse_percentiles("101").is_err());
        assert_eq!(percentile_word(99.0), "99");
        assert_eq!(percentile_word(99.9), "99.9");
        let slo = Slo::parse(&["ttft:100".into(), "e2el:2000".into()])
            .expect("ok")
            .expect("some");
        assert_eq!(slo.ttft_ms, Some(100.0));
        assert_eq!(slo.e2el_ms, Some(2000.0));
        assert!(Slo::parse(&["ttft=1".into()]).is_err());
        assert!(Slo::parse(&["foo:1".into()]).is_err());
    }
}
