//! `doctor --prometheus URL`: read the window from a Prometheus server with
//! one range query instead of scraping the server, then analyse it exactly
//! like live scrapes (each evaluation step of the range becomes a scrape).

use crate::window::{Scrape, Window};
use inferscope_schema::promtext::{self, Sample};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Evaluation steps per window (gauge samples).
const STEPS: f64 = 8.0;
/// How long the query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Percent-encodes a query-string value.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The PromQL selector for every series the doctor reads.
pub fn selector(extra: &str) -> String {
    let extra = extra.trim().trim_matches(|c| c == '{' || c == '}');
    let name = r#"__name__=~"(inferscope|vllm):.+|http_requests_total""#;
    if extra.is_empty() {
        format!("{{{name}}}")
    } else {
        format!("{{{name},{extra}}}")
    }
}

/// Converts a `query_range` response (`resultType` `matrix`) into scrapes,
/// one per evaluation timestamp, timed from the first.
pub fn matrix_to_scrapes(body: &Value) -> anyhow::Result<Vec<(f64, Scrape)>> {
    if body.get("status").and_then(Value::as_str) != Some("success") {
        let why = body
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no status \"success\"");
        anyhow::bail!("Prometheus query failed: {why}");
    }
    let result = body
        .pointer("/data/result")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow::anyhow!("Prometheus answer without data.result"))?;
    // Timestamps as integer milliseconds, so equal steps group exactly.
    let mut by_time: BTreeMap<i64, Vec<Sample>> = BTreeMap::new();
    for series in result {
        let Some(metric) = series.get("metric").and_then(Value::as_object) else {
            continue;
        };
        let Some(name) = metric.get("__name__").and_then(Value::as_str) else {
            continue;
        };
        let labels: BTreeMap<String, String> = metric
            .iter()
            .filter(|(k, _)| *k != "__name__")
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        for point in series
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(t), Some(v)) = (
                point.get(0).and_then(Value::as_f64),
                point
                    .get(1)
                    .and_then(Value::as_str)
                    .and_then(promtext::parse_value),
            ) else {
                continue;
            };
            by_time
                .entry((t * 1000.0).round() as i64)
                .or_default()
                .push(Sample::new(name, labels.clone(), v));
        }
    }
    let t0 = by_time.keys().next().copied().unwrap_or(0);
    Ok(by_time
        .into_iter()
        .map(|(t, samples)| ((t - t0) as f64 / 1000.0, Scrape { samples }))
        .collect())
}

/// Reads the last `window` of the selected series from Prometheus at `base`.
pub async fn collect(
    base: &str,
    extra_selector: &str,
    window: Duration,
    namespace: Option<&str>,
) -> anyhow::Result<Window> {
    let end = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| anyhow::anyhow!("system clock before 1970: {e}"))?
        .as_secs_f64();
    let secs = window.as_secs_f64();
    // Prometheus refuses sub-millisecond steps; a second is its usual floor anyway.
    let step = (secs / STEPS).max(1.0);
    let url = format!(
        "{}/api/v1/query_range?query={}&start={:.3}&end={:.3}&step={:.3}",
        base.trim_end_matches('/'),
        encode(&selector(extra_selector)),
        end - secs,
        end,
        step
    );
    let text = crate::client::get_text(&url, QUERY_TIMEOUT).await?;
    let body: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("Prometheus answer is not JSON: {e}"))?;
    let scrapes = matrix_to_scrapes(&body)?;
    if scrapes.len() < 2 {
        anyhow::bail!(
            "Prometheus holds fewer than two points of the selected series in the last {secs:.0} s \
             (check --selector and that it scrapes the server)"
        );
    }
    Ok(Window::new(scrapes, namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_query_becomes_scrapes() {
        let body = serde_json::json!({
            "status": "success",
            "data": {"resultType": "matrix", "result": [
                {"metric": {"__name__": "vllm:generation_tokens_total", "engine": "0", "job": "v"},
                 "values": [[1700000000.0, "100"], [1700000010.0, "300"]]},
                {"metric": {"__name__": "vllm:num_requests_running", "engine": "0"},
                 "values": [[1700000000.0, "2"], [1700000010.0, "4"]]}
            ]}
        });
        let scrapes = matrix_to_scrapes(&body).expect("scrapes");
        assert_eq!(scrapes.len(), 2);
        assert_eq!(scrapes[1].0, 10.0);
        let s = Window::new(scrapes, None).summary();
        assert_eq!(s.namespace, "vllm");
        assert_eq!(s.generation_tokens_per_s, Some(20.0));
        assert_eq!(s.running_mean, Some(3.0));
        let err = matrix_to_scrapes(&serde_json::json!({"status": "error", "error": "bad"}));
        assert!(err.is_err());
        assert_eq!(
            selector("job=\"x\""),
            r#"{__name__=~"(inferscope|vllm):.+|http_requests_total",job="x"}"#
        );
        assert_eq!(encode("a b{\"}"), "a%20b%7B%22%7D");
    }
}
