//! The result JSON (`--save-result`), key for key as `vllm bench serve` writes it.

use crate::client::RequestOutput;
use crate::statistics::{BenchmarkMetrics, Metric, percentile_word};
use serde_json::{Map, Value, json};
use std::time::{SystemTime, UNIX_EPOCH};

/// Run settings recorded in the result.
#[derive(Debug, Clone, Default)]
pub struct RunMeta {
    /// `YYYYMMDD-HHMMSS` (UTC).
    pub date: String,
    /// `--backend`.
    pub backend: String,
    /// `--label`.
    pub label: Option<String>,
    /// Model name sent.
    pub model_id: String,
    /// `--tokenizer`, else the model id.
    pub tokenizer_id: String,
    /// `--num-prompts`.
    pub num_prompts: usize,
    /// `--request-rate`.
    pub request_rate: f64,
    /// `--burstiness`.
    pub burstiness: f64,
    /// `--max-concurrency`.
    pub max_concurrency: Option<usize>,
    /// Benchmark duration, seconds.
    pub duration_s: f64,
    /// `--metadata k=v` pairs.
    pub metadata: Vec<(String, String)>,
}

/// `YYYYMMDD-HHMMSS` in UTC for a Unix time (civil-from-days, no time-zone data needed).
pub fn format_date(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

/// The current UTC date in result format.
pub fn now_date() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_date(secs)
}

/// Python's `str(float)` for the request rate: `inf`, `10.0`, `2.5`.
pub fn rate_str(rate: f64) -> String {
    if rate.is_infinite() {
        "inf".to_string()
    } else if rate.fract() == 0.0 {
        format!("{rate:.1}")
    } else {
        format!("{rate}")
    }
}

fn num(x: f64) -> Value {
    // JSON has no NaN or infinity; those only arise from degenerate runs.
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// Inserts the figures (counts, throughputs, latency statistics of the
/// selected metrics) with the keys of `vllm bench serve`.
pub fn insert_metrics(r: &mut Map<String, Value>, m: &BenchmarkMetrics, selected: &[Metric]) {
    r.insert("completed".into(), json!(m.completed));
    r.insert("failed".into(), json!(m.failed));
    r.insert("total_input_tokens".into(), json!(m.total_input));
    r.insert("total_output_tokens".into(), json!(m.total_output));
    // Not in vLLM's result: whether the totals are exact, and from what.
    r.insert(
        "input_tokens_counted_by".into(),
        json!(m.input_counted_by.key()),
    );
    r.insert(
        "output_tokens_counted_by".into(),
        json!(m.output_counted_by.key()),
    );
    r.insert("request_throughput".into(), num(m.request_throughput));
    r.insert(
        "request_goodput".into(),
        m.request_goodput.map_or(Value::Null, num),
    );
    r.insert("output_throughput".into(), num(m.output_throughput));
    r.insert(
        "total_token_throughput".into(),
        num(m.total_token_throughput),
    );
    r.insert(
        "max_output_tokens_per_s".into(),
        num(m.max_output_tokens_per_s),
    );
    r.insert(
        "max_concurrent_requests".into(),
        num(m.max_concurrent_requests),
    );
    for metric in Metric::ALL {
        if !selected.contains(&metric) {
            continue;
        }
        let k = metric.key();
        let d = m.dist(metric);
        r.insert(format!("mean_{k}_ms"), num(d.mean_ms));
        r.insert(format!("median_{k}_ms"), num(d.median_ms));
        r.insert(format!("std_{k}_ms"), num(d.std_ms));
        for (p, v) in &d.percentiles_ms {
            r.insert(format!("p{}_{k}_ms", percentile_word(*p)), num(*v));
        }
    }
}

/// The `slices` array (`--slice-duration`): each window's bounds and figures.
pub fn slices_json(slices: &[crate::timeline::Slice], selected: &[Metric]) -> Value {
    Value::Array(
        slices
            .iter()
            .map(|w| {
                let mut o = Map::new();
                o.insert("start_s".into(), num(w.start_s));
                o.insert("end_s".into(), num(w.end_s));
                insert_metrics(&mut o, &w.metrics, selected);
                Value::Object(o)
            })
            .collect(),
    )
}

/// Builds the result object; `outputs` adds the per-request arrays (`--save-detailed`).
pub fn build(
    meta: &RunMeta,
    m: &BenchmarkMetrics,
    selected: &[Metric],
    outputs: Option<&[RequestOutput]>,
) -> Map<String, Value> {
    let mut r = Map::new();
    r.insert("date".into(), json!(meta.date));
    r.insert("backend".into(), json!(meta.backend));
    r.insert("label".into(), json!(meta.label));
    r.insert("model_id".into(), json!(meta.model_id));
    r.insert("tokenizer_id".into(), json!(meta.tokenizer_id));
    r.insert("num_prompts".into(), json!(meta.num_prompts));
    let rate = if meta.request_rate.is_finite() {
        num(meta.request_rate)
    } else {
        json!("inf")
    };
    r.insert("request_rate".into(), rate);
    r.insert("burstiness".into(), num(meta.burstiness));
    r.insert("max_concurrency".into(), json!(meta.max_concurrency));
    r.insert("duration".into(), num(meta.duration_s));
    insert_metrics(&mut r, m, selected);
    if let Some(outs) = outputs {
        r.insert(
            "input_lens".into(),
            json!(outs.iter().map(|o| o.prompt_len).collect::<Vec<_>>()),
        );
        r.insert("output_lens".into(), json!(m.output_lens));
        r.insert(
            "ttfts".into(),
            Value::Array(outs.iter().map(|o| num(o.ttft)).collect()),
        );
        r.insert(
            "itls".into(),
            Value::Array(
                outs.iter()
                    .map(|o| Value::Array(o.itl.iter().map(|x| num(*x)).collect()))
                    .collect(),
            ),
        );
        r.insert(
            "generated_texts".into(),
            json!(
                outs.iter()
                    .map(|o| o.generated_text.as_str())
                    .collect::<Vec<_>>()
            ),
        );
        r.insert(
            "errors".into(),
            json!(outs.iter().map(|o| o.error.as_str()).collect::<Vec<_>>()),
        );
    }
    for (k, v) in &meta.metadata {
        r.insert(k.clone(), json!(v));
    }
    r
}

/// Default file name: `{label or backend}-{rate}qps[-concurrency{c}]-{model basename}-{date}.json`.
pub fn default_filename(meta: &RunMeta) -> String {
    let label = meta.label.clone().unwrap_or_else(|| meta.backend.clone());
    let conc = meta
        .max_concurrency
        .map(|c| format!("-concurrency{c}"))
        .unwrap_or_default();
    let model = meta.model_id.rsplit('/').next().unwrap_or(&meta.model_id);
    format!(
        "{label}-{}qps{conc}-{model}-{}.json",
        rate_str(meta.request_rate),
        meta.date
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statistics::Distribution;

    #[test]
    fn dates_and_rates() {
        assert_eq!(format_date(0), "19700101-000000");
        assert_eq!(format_date(951_782_400 + 3_661), "20000229-010101");
        assert_eq!(format_date(1_798_761_599), "20261231-235959");
        assert_eq!(rate_str(f64::INFINITY), "inf");
        assert_eq!(rate_str(10.0), "10.0");
        assert_eq!(rate_str(2.5), "2.5");
    }

    /// Golden test of the JSON keys.
    #[test]
    fn golden_keys() {
        let meta = RunMeta {
            date: "20260101-000000".into(),
            backend: "openai".into(),
            model_id: "org/model".into(),
            tokenizer_id: "org/model".into(),
            num_prompts: 2,
            request_rate: f64::INFINITY,
            burstiness: 1.0,
            max_concurrency: Some(4),
            metadata: vec![("gpu".into(), "h100".into())],
            ..Default::default()
        };
        let d = Distribution {
            percentiles_ms: vec![(99.0, 1.0), (99.9, 2.0)],
            ..Default::default()
        };
        let m = BenchmarkMetrics {
            ttft: d.clone(),
            tpot: d.clone(),
            itl: d.clone(),
            e2el: d,
            output_lens: vec![3],
            ..Default::default()
        };
        let outs = vec![RequestOutput::default()];
        let sel = [Metric::Ttft, Metric::Tpot, Metric::Itl];
        let r = build(&meta, &m, &sel, Some(&outs));
        let mut keys: Vec<&str> = r.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want: Vec<&str> = include_str!("../tests/golden/result_keys.txt")
            .lines()
            .filter(|l| !l.is_empty())
            .collect();
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(r["request_rate"], json!("inf"));
        // The default metrics counted nothing exactly: the result says so.
        assert_eq!(r["input_tokens_counted_by"], json!("estimate"));
        assert_eq!(r["output_tokens_counted_by"], json!("estimate"));
        assert_eq!(r["request_goodput"], Value::Null);
        assert_eq!(r["max_concurrency"], json!(4));
        let brief = build(&meta, &m, &sel, None);
        assert!(!brief.contains_key("ttfts") && !brief.contains_key("errors"));
        assert_eq!(
            default_filename(&meta),
            "openai-infqps-concurrency4-model-20260101-000000.json"
        );
    }
}
