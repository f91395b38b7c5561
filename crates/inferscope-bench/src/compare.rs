//! `bench compare A.json B.json`: two runs side by side with the change of every figure.

use crate::cli::CompareArgs;
use crate::error::BenchError;
use serde_json::{Map, Value};
use std::fmt::Write;
use std::path::Path;

/// Settings shown (as text) above the figures.
const SETTINGS: &[&str] = &[
    "date",
    "label",
    "backend",
    "model_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "input_tokens_counted_by",
    "output_tokens_counted_by",
];

/// Headline figures, in report order.
const HEADLINE: &[&str] = &[
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
];

/// Whether a larger value of `key` is better (throughputs, completions) or worse (latencies, failures).
pub fn higher_is_better(key: &str) -> Option<bool> {
    if key.ends_with("_ms") || key == "failed" || key == "duration" {
        Some(false)
    } else if key.contains("throughput")
        || key.contains("goodput")
        || key == "completed"
        || key == "max_output_tokens_per_s"
    {
        Some(true)
    } else {
        None
    }
}

/// Change from `a` to `b` in percent; None when `a` is 0.
pub fn change_pct(a: f64, b: f64) -> Option<f64> {
    (a != 0.0).then(|| (b - a) / a.abs() * 100.0)
}

fn text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn metric_rank(key: &str) -> Option<(usize, usize, String)> {
    let metrics = ["ttft", "tpot", "itl", "e2el"];
    let body = key.strip_suffix("_ms")?;
    let (stat, m) = body.rsplit_once('_')?;
    let mi = metrics.iter().position(|x| *x == m)?;
    let si = match stat {
        "mean" => 0,
        "median" => 1,
        "std" => 2,
        _ if stat.starts_with('p') => 3,
        _ => return None,
    };
    // Percentiles sort numerically.
    let p = stat
        .strip_prefix('p')
        .and_then(|p| p.parse::<f64>().ok())
        .unwrap_or(0.0);
    Some((mi, si, format!("{:012.4}", p)))
}

/// The numeric keys to compare, in a stable, readable order.
fn figure_keys(a: &Map<String, Value>, b: &Map<String, Value>) -> Vec<String> {
    let numeric = |k: &String| {
        a.get(k).is_some_and(Value::is_number) || b.get(k).is_some_and(Value::is_number)
    };
    let mut keys: Vec<String> = HEADLINE
        .iter()
        .map(|s| s.to_string())
        .filter(numeric)
        .collect();
    let mut metric_keys: Vec<(usize, usize, String, String)> = a
        .keys()
        .chain(b.keys())
        .filter_map(|k| metric_rank(k).map(|(m, s, p)| (m, s, p, k.clone())))
        .collect();
    metric_keys.sort();
    metric_keys.dedup();
    keys.extend(metric_keys.into_iter().map(|t| t.3));
    let mut others: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| !keys.contains(k) && !SETTINGS.contains(&k.as_str()) && numeric(k))
        .cloned()
        .collect();
    others.sort();
    others.dedup();
    keys.extend(others);
    keys
}

/// Renders the comparison table.
pub fn render(
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    a_name: &str,
    b_name: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:=^80}", " Benchmark Comparison ");
    let _ = writeln!(
        s,
        "{:<32} {:>16} {:>16} {:>13}",
        "", "A (before)", "B (after)", "change"
    );
    let _ = writeln!(
        s,
        "{:<32} {:>16} {:>16}",
        "file:",
        short(a_name),
        short(b_name)
    );
    for k in SETTINGS {
        let (va, vb) = (text(a.get(*k)), text(b.get(*k)));
        if va != "-" || vb != "-" {
            let _ = writeln!(
                s,
                "{:<32} {:>16} {:>16}",
                format!("{k}:"),
                short(&va),
                short(&vb)
            );
        }
    }
    let _ = writeln!(s, "{:-^80}", "");
    for k in figure_keys(a, b) {
        let va = a.get(&k).and_then(Value::as_f64);
        let vb = b.get(&k).and_then(Value::as_f64);
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
        let change = match (va, vb) {
            (Some(x), Some(y)) => match change_pct(x, y) {
                Some(c) => {
                    let verdict = match higher_is_better(&k) {
                        _ if c.abs() < 1.0 => "  =",
                        Some(true) if c > 0.0 => " ok",
                        Some(false) if c < 0.0 => " ok",
                        Some(_) => " !!",
                        None => "   ",
                    };
                    format!("{c:+.2}%{verdict}")
                }
                None if x == y => "+0.00%  =".to_string(),
                None => "n/a".to_string(),
            },
            _ => "n/a".to_string(),
        };
        let _ = writeln!(
            s,
            "{:<32} {:>16} {:>16} {:>13}",
            format!("{k}:"),
            fmt(va),
            fmt(vb),
            change
        );
    }
    let _ = writeln!(s, "{}", "=".repeat(80));
    let _ = writeln!(
        s,
        "change = (B - A) / A; '=' within 1%, 'ok' better, '!!' worse"
    );
    s
}

fn short(s: &str) -> String {
    let n = s.chars().count();
    if n <= 16 {
        s.to_string()
    } else {
        let tail: String = s.chars().skip(n - 15).collect();
        format!("…{tail}")
    }
}

/// Loads a result JSON object.
pub fn load(path: &Path) -> Result<Map<String, Value>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(BenchError::InvalidArg(format!(
            "{}: not a JSON object",
            path.display()
        ))),
        Err(source) => Err(BenchError::Json {
            context: path.display().to_string(),
            source,
        }),
    }
}

/// Runs `bench compare`.
pub fn run(args: &CompareArgs) -> Result<(), BenchError> {
    let a = load(&args.a)?;
    let b = load(&args.b)?;
    print!(
        "{}",
        render(
            &a,
            &b,
            &args.a.display().to_string(),
            &args.b.display().to_string()
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn side_by_side_with_changes() {
        let a = obj(
            json!({"model_id":"m","request_rate":"inf","completed":100,"failed":0,
            "request_throughput":10.0,"mean_ttft_ms":100.0,"p99.9_ttft_ms":300.0,"p99_ttft_ms":200.0,
            "median_tpot_ms":20.0,"itls":[1,2],"gpu":"h100","extra":5}),
        );
        let b = obj(
            json!({"model_id":"m","request_rate":"inf","completed":100,"failed":2,
            "request_throughput":12.5,"mean_ttft_ms":80.0,"p99.9_ttft_ms":300.0,"p99_ttft_ms":250.0,
            "median_tpot_ms":20.1}),
        );
        let out = render(&a, &b, "a.json", "b.json");
        let line = |k: &str| {
            out.lines()
                .find(|l| l.starts_with(k))
                .unwrap_or_default()
                .to_string()
        };
        assert!(line("request_throughput:").contains("+25.00% ok"), "{out}");
        assert!(line("mean_ttft_ms:").contains("-20.00% ok"), "{out}");
        assert!(line("p99_ttft_ms:").contains("+25.00% !!"), "{out}");
        assert!(line("median_tpot_ms:").contains("+0.50%  ="), "{out}");
        assert!(line("failed:").contains("n/a"), "{out}");
        assert!(line("extra:").contains("5.00"), "{out}");
        assert!(!out.contains("itls"));
        // Metric order: ttft mean, p99, p99.9, then tpot.
        let pos = |k: &str| out.find(k).unwrap_or(usize::MAX);
        assert!(pos("mean_ttft_ms") < pos("p99_ttft_ms"));
        assert!(pos("p99_ttft_ms") < pos("p99.9_ttft_ms"));
        assert!(pos("p99.9_ttft_ms") < pos("median_tpot_ms"));
    }
}
