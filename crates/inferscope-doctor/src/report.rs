//! The doctor's report: ranked findings with evidence and actions, as text
//! for people and as JSON for tests and CI gates.

use crate::findings::{Diagnosis, Evidence, Severity};
use crate::window::Summary;
use serde::Serialize;
use std::fmt::Write as _;

/// Everything `doctor` concluded about one window.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where the metrics came from (`/metrics` URL or Prometheus server).
    pub source: String,
    /// Metric namespace read.
    pub namespace: String,
    /// Seconds covered.
    pub window_s: f64,
    /// Highest severity found.
    pub worst: Severity,
    /// Findings and skipped rules.
    #[serde(flatten)]
    pub diagnosis: Diagnosis,
    /// The figures the rules read.
    pub summary: Summary,
}

impl Report {
    /// Builds a report from a summary and its diagnosis.
    pub fn new(source: &str, summary: Summary, diagnosis: Diagnosis) -> Self {
        Report {
            source: source.to_string(),
            namespace: summary.namespace.clone(),
            window_s: summary.window_s,
            worst: diagnosis
                .findings
                .iter()
                .map(|f| f.severity)
                .max()
                .unwrap_or(Severity::Ok),
            diagnosis,
            summary,
        }
    }

    /// The process exit status: 2 when a critical finding is present, else 0.
    pub fn exit_code(&self) -> i32 {
        if self.worst == Severity::Critical {
            2
        } else {
            0
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail; fall back anyway
        // rather than panic.
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\":\"cannot serialise the report: {e}\"}}"))
    }

    /// The text report.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let s = &self.summary;
        let _ = writeln!(
            out,
            "inferscope doctor — {} (namespace {}, {:.1} s window, {} scrapes, {} engine{})",
            self.source,
            self.namespace,
            self.window_s,
            s.scrapes,
            s.engines.len(),
            if s.engines.len() == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            out,
            "load: {} req/s finished, prompt {} tok/s, generation {} tok/s, running {} (peak {}), waiting {} (peak {})",
            num(s.requests_per_s, 2),
            num(s.prompt_tokens_per_s, 0),
            num(s.generation_tokens_per_s, 0),
            num(s.running_mean, 1),
            num(s.running_peak, 0),
            num(s.waiting_mean, 1),
            num(s.waiting_peak, 0),
        );
        out.push('\n');
        for (i, f) in self.diagnosis.findings.iter().enumerate() {
            let _ = writeln!(
                out,
                "{}. [{}] {}",
                i + 1,
                severity_word(f.severity),
                f.title
            );
            let figures: Vec<String> = f.evidence.iter().map(format_evidence).collect();
            let _ = writeln!(out, "   evidence: {}", figures.join(", "));
            let _ = writeln!(out, "   action:   {}", f.action);
            out.push('\n');
        }
        if !self.diagnosis.skipped.is_empty() {
            let _ = writeln!(out, "rules not evaluated:");
            for k in &self.diagnosis.skipped {
                let _ = writeln!(out, "  - {}: {}", k.rule, k.reason);
            }
        }
        out
    }
}

/// Upper-case label of a severity.
pub fn severity_word(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "CRITICAL",
        Severity::Warning => "WARNING",
        Severity::Info => "INFO",
        Severity::Ok => "OK",
    }
}

fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{x:.decimals$}"))
}

/// `name=value unit`, with ratios as percentages and seconds as milliseconds.
pub fn format_evidence(e: &Evidence) -> String {
    match e.unit.as_str() {
        "ratio" => format!("{}={:.1}%", e.name, e.value * 100.0),
        "s" => format!("{}={:.1} ms", e.name, e.value * 1000.0),
        "per_s" => format!("{}={:.2}/s", e.name, e.value),
        u => {
            if e.value.fract() == 0.0 {
                format!("{}={:.0} {u}", e.name, e.value)
            } else {
                format!("{}={:.2} {u}", e.name, e.value)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::{Finding, Skipped};

    #[test]
    fn text_and_json_and_exit_code() {
        let f = Finding {
            id: "kv_saturated",
            severity: Severity::Critical,
            title: "KV cache saturated".into(),
            evidence: vec![
                Evidence {
                    name: "kv_usage_peak".into(),
                    value: 0.97,
                    unit: "ratio".into(),
                },
                Evidence {
                    name: "queue_time_mean".into(),
                    value: 0.25,
                    unit: "s".into(),
                },
                Evidence {
                    name: "preemptions".into(),
                    value: 12.0,
                    unit: "preemptions".into(),
                },
            ],
            action: "More KV memory.".into(),
        };
        let r = Report::new(
            "http://x/metrics",
            Summary::default(),
            Diagnosis {
                findings: vec![f],
                skipped: vec![Skipped {
                    rule: "host_bound",
                    reason: "vLLM".into(),
                }],
            },
        );
        assert_eq!(r.exit_code(), 2);
        let t = r.to_text();
        assert!(t.contains("1. [CRITICAL] KV cache saturated"), "{t}");
        assert!(t.contains("kv_usage_peak=97.0%"), "{t}");
        assert!(t.contains("queue_time_mean=250.0 ms"), "{t}");
        assert!(t.contains("preemptions=12 preemptions"), "{t}");
        assert!(t.contains("host_bound: vLLM"), "{t}");
        let j: serde_json::Value = serde_json::from_str(&r.to_json()).expect("json");
        assert_eq!(j["worst"], "critical");
        assert_eq!(j["findings"][0]["id"], "kv_saturated");
        assert_eq!(j["findings"][0]["evidence"][2]["value"], 12.0);
        assert_eq!(j["skipped"][0]["rule"], "host_bound");
    }
}
