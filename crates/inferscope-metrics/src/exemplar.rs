//! OpenMetrics exemplars: the most recent request behind each histogram
//! bucket and each finished-request counter, named by its trace id when it
//! was traced, else by its request id.
//!
//! prometheus-client 0.26 cannot encode these for us: its `Exemplar` has no
//! public constructor, and its exemplar-carrying metrics take a lock on every
//! observation. So observations store the exemplar in a per-bucket slot here
//! (a `try_lock`: a contended slot keeps its previous exemplar rather than
//! wait), and [`attach`] appends them to the matching sample lines of the
//! rendered OpenMetrics text. Prometheus text 0.0.4 never carries them.

use std::collections::HashMap;
use std::sync::Arc;

pub use crate::exemplar_slot::{
    ExemplarSlot, MAX_LABEL_SET_CHARS, REQUEST_ID_LABEL, TRACE_ID_LABEL,
};
use crate::histogram::AtomicHistogram;

/// Where a series' exemplars live.
#[derive(Debug, Clone)]
enum Source {
    /// A histogram: one slot per bucket, matched by `le`.
    Histogram(AtomicHistogram),
    /// A counter: one slot for its `_total` sample.
    Counter(Arc<ExemplarSlot>),
}

/// The exemplar-carrying series of a registry, found again in its rendered
/// text by family name and label set.
#[derive(Debug, Default, Clone)]
pub struct ExemplarIndex {
    /// Sample name (`…_bucket`, `…_total`) → label key → source.
    series: HashMap<String, HashMap<String, Source>>,
}

impl ExemplarIndex {
    /// Adds a histogram registered as `name` with these labels (`le` aside).
    pub fn add_histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &AtomicHistogram) {
        self.series
            .entry(format!("{name}_bucket"))
            .or_default()
            .insert(
                label_key(labels.iter().copied()),
                Source::Histogram(h.clone()),
            );
    }

    /// Adds a counter registered as `name` (exposed as `name_total`).
    pub fn add_counter(&mut self, name: &str, labels: &[(&str, &str)], slot: &Arc<ExemplarSlot>) {
        self.series
            .entry(format!("{name}_total"))
            .or_default()
            .insert(
                label_key(labels.iter().copied()),
                Source::Counter(Arc::clone(slot)),
            );
    }

    /// Whether no series carries exemplars.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// The exemplar suffix for one sample line, if it has one.
    fn suffix_for(&self, line: &str, out: &mut String) {
        let Some(open) = line.find('{') else { return };
        let Some(by_labels) = self.series.get(&line[..open]) else {
            return;
        };
        let Some(labels) = parse_labels(&line[open + 1..]) else {
            return;
        };
        let le = labels
            .iter()
            .find(|(k, _)| k == "le")
            .map(|(_, v)| v.clone());
        let key = label_key(
            labels
                .iter()
                .filter(|(k, _)| k != "le")
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        match (by_labels.get(&key), le) {
            (Some(Source::Histogram(h)), Some(le)) => {
                let bound = if le == "+Inf" {
                    Some(f64::INFINITY)
                } else {
                    le.parse::<f64>().ok()
                };
                let idx = bound.and_then(|b| {
                    if b == f64::INFINITY {
                        Some(h.bounds().len())
                    } else {
                        h.bounds().iter().position(|&x| x == b)
                    }
                });
                if let Some(slot) = idx.and_then(|i| h.exemplar_slot(i)) {
                    slot.write_suffix(out);
                }
            }
            (Some(Source::Counter(slot)), None) => slot.write_suffix(out),
            _ => {}
        }
    }
}

/// Labels sorted by name, as one string: the same for a label set however
/// the encoder ordered it.
fn label_key<'a>(labels: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut v: Vec<_> = labels.collect();
    v.sort_unstable();
    let mut key = String::new();
    for (k, val) in v {
        key.push_str(k);
        key.push('\u{0}');
        key.push_str(val);
        key.push('\u{0}');
    }
    key
}

/// Parses `k="v",k2="v2"}` (after the `{`), unescaping values; `None` when malformed.
fn parse_labels(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(',');
        if rest.starts_with('}') {
            return Some(out);
        }
        let eq = rest.find('=')?;
        let name = rest[..eq].to_owned();
        rest = rest[eq + 1..].strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        out.push((name, value));
        rest = &rest[end + 1..];
    }
}

/// Appends each indexed series' exemplars to its sample lines in `body`
/// (OpenMetrics text from prometheus-client).
pub fn attach(body: &str, index: &ExemplarIndex) -> String {
    if index.is_empty() {
        return body.to_owned();
    }
    let mut out = String::with_capacity(body.len() + body.len() / 4);
    for line in body.split_inclusive('\n') {
        let text = line.strip_suffix('\n').unwrap_or(line);
        if text.starts_with('#') {
            out.push_str(line);
            continue;
        }
        out.push_str(text);
        index.suffix_for(text, &mut out);
        if line.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exemplar_slot::write_label;
    use inferscope_schema::stats::RequestRef;
    use std::time::{SystemTime, UNIX_EPOCH};

    fn req(id: &str, trace: Option<[u8; 16]>) -> RequestRef {
        RequestRef::new(id, trace)
    }

    #[test]
    fn labels_are_trace_ids_or_cut_request_ids() {
        let mut s = String::new();
        let mut trace = [0u8; 16];
        trace[0] = 0xab;
        trace[15] = 0x01;
        write_label(&mut s, &req("r1", Some(trace)));
        assert_eq!(s, "trace_id=\"ab000000000000000000000000000001\"");
        s.clear();
        let long = "é".repeat(300);
        write_label(&mut s, &req(&long, None));
        let value = s
            .strip_prefix("request_id=\"")
            .and_then(|v| v.strip_suffix('"'))
            .unwrap();
        assert_eq!(
            value.chars().count() + REQUEST_ID_LABEL.len(),
            MAX_LABEL_SET_CHARS
        );
        s.clear();
        write_label(&mut s, &req("a\"b\\c", None));
        assert_eq!(s, "request_id=\"a\\\"b\\\\c\"");
    }

    #[test]
    fn label_parsing_unescapes_and_handles_braces_in_values() {
        let l = parse_labels(r#"model_name="a}\"b",engine="0",le="0.5"} 3"#).unwrap();
        assert_eq!(
            l,
            vec![
                ("model_name".into(), "a}\"b".into()),
                ("engine".into(), "0".into()),
                ("le".into(), "0.5".into())
            ]
        );
        assert!(parse_labels("broken").is_none());
    }

    #[test]
    fn exemplars_go_on_their_bucket_and_counter_lines_only() {
        let h = AtomicHistogram::new(&[0.1, 1.0]);
        h.observe_for(0.05, &req("first", None));
        h.observe_for(0.07, &req("second", None));
        h.observe_for(5.0, &req("slow", None));
        let slot = Arc::new(ExemplarSlot::default());
        slot.set(&req("done", None), 1.0);
        let mut index = ExemplarIndex::default();
        index.add_histogram("x:lat", &[("engine", "0"), ("model_name", "m")], &h);
        index.add_counter("x:ok", &[("engine", "0")], &slot);
        let body = "# TYPE x:lat histogram\n\
            x:lat_bucket{model_name=\"m\",engine=\"0\",le=\"0.1\"} 2\n\
            x:lat_bucket{model_name=\"m\",engine=\"0\",le=\"1.0\"} 2\n\
            x:lat_bucket{model_name=\"m\",engine=\"0\",le=\"+Inf\"} 3\n\
            x:lat_bucket{model_name=\"other\",engine=\"0\",le=\"0.1\"} 0\n\
            x:ok_total{engine=\"0\"} 1\n# EOF\n";
        let out = attach(body, &index);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[1].starts_with("x:lat_bucket{model_name=\"m\",engine=\"0\",le=\"0.1\"} 2 # {request_id=\"second\"} 0.07 "),
            "{out}"
        );
        assert!(!lines[2].contains('#'), "empty bucket: {out}");
        assert!(lines[3].contains("# {request_id=\"slow\"} 5.0 "), "{out}");
        assert!(!lines[4].contains(" # "), "unindexed series: {out}");
        assert!(lines[5].contains("# {request_id=\"done\"} 1.0 "), "{out}");
        assert_eq!(lines[6], "# EOF");
        // The timestamp is the observation's, in seconds.
        let ts: f64 = lines[1].rsplit(' ').next().unwrap().parse().unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - ts).abs() < 60.0, "{ts} vs {now}");
    }
}
