//! A small parser for the Prometheus text format (0.0.4) and OpenMetrics:
//! samples with labels and values; comments, timestamps and exemplars are skipped.

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name as exposed (with `_total`, `_bucket`, … suffixes).
    pub name: String,
    /// Label pairs in exposition order.
    pub labels: Vec<(String, String)>,
    /// Sample value.
    pub value: f64,
}

impl Sample {
    /// The value of label `k`, if present.
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

/// Parsed exposition: the samples and how many lines could not be parsed.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    /// All samples.
    pub samples: Vec<Sample>,
    /// Lines that were neither comments nor valid samples.
    pub skipped: usize,
}

/// Parses an exposition; malformed lines are counted and skipped, never fatal.
pub fn parse(text: &str) -> Exposition {
    let mut e = Exposition::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Some(s) => e.samples.push(s),
            None => e.skipped += 1,
        }
    }
    e
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Parses a sample value, including the spellings of infinities and NaN.
pub fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    if name_end == 0 {
        return None;
    }
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(r)?;
        labels = parsed;
        rest = after;
    }
    // Value, then an optional timestamp, then an optional ` # exemplar`.
    let value = rest.split_whitespace().next()?;
    Some(Sample {
        name,
        labels,
        value: parse_value(value)?,
    })
}

/// Parses `k="v",…}` and returns the labels and the text after `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.push((key, value));
        s = &s[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_004() {
        let text = "# HELP x_total Requests.\n# TYPE x_total counter\n\
                    x_total{a=\"1\",b=\"q\\\"uo\\\\te\\n\"} 3 1700000000000\n\
                    up 1\n\
                    h_bucket{le=\"+Inf\"} 5\n\
                    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
                    g -Inf\nbad line here\nn NaN\n";
        let e = parse(text);
        assert_eq!(e.skipped, 1);
        assert_eq!(e.samples.len(), 6);
        assert_eq!(e.samples[0].name, "x_total");
        assert_eq!(e.samples[0].label("b"), Some("q\"uo\\te\n"));
        assert_eq!(e.samples[0].value, 3.0);
        assert_eq!(e.samples[2].value, 5.0);
        assert_eq!(
            e.samples[2].label("le").and_then(parse_value),
            Some(f64::INFINITY)
        );
        assert_eq!(e.samples[3].name, "vllm:kv_cache_usage_perc");
        assert_eq!(e.samples[3].label("engine"), Some("0"));
        assert_eq!(e.samples[4].value, f64::NEG_INFINITY);
        assert!(e.samples[5].value.is_nan());
    }

    #[test]
    fn openmetrics_with_exemplars_and_eof() {
        let text = "# TYPE inferscope:time_to_first_token_seconds histogram\n\
                    # UNIT inferscope:time_to_first_token_seconds seconds\n\
                    inferscope:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\"} 7 # {trace_id=\"abc\"} 0.05 1700000000.1\n\
                    inferscope:request_success_total{finished_reason=\"length\", engine=\"0\"} 1.5e3\n\
                    # EOF\n";
        let e = parse(text);
        assert_eq!(e.skipped, 0);
        assert_eq!(e.samples.len(), 2);
        assert_eq!(e.samples[0].value, 7.0);
        assert_eq!(e.samples[0].label("le"), Some("0.1"));
        assert_eq!(e.samples[1].value, 1500.0);
        assert_eq!(e.samples[1].label("engine"), Some("0"));
    }
}
