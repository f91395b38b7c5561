//! Every metric name that the shipped Grafana dashboard and Prometheus alert
//! rules (`deploy/`) query must exist in the schema, so a renamed or removed
//! metric breaks `cargo test --workspace` instead of a production dashboard.

use std::collections::BTreeSet;
use std::path::PathBuf;

use inferscope_schema::schema::{MetricType, all_metrics};

const NS: &str = "inferscope";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every series name a query may use: the exposed family name, plus
/// `_bucket`, `_sum` and `_count` for histograms.
fn schema_series_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for def in all_metrics() {
        let exposed = def.exposed_name(NS);
        if def.metric_type == MetricType::Histogram {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{exposed}{suffix}"));
            }
        } else {
            names.insert(exposed);
        }
    }
    names
}

/// Identifiers in `text` (after substituting the Grafana namespace variable)
/// that name one of our metrics: namespaced ones and the HTTP ones.
fn metric_names_in(text: &str) -> BTreeSet<String> {
    let text = text
        .replace("${namespace}", NS)
        .replace("$namespace", NS)
        .replace("[[namespace]]", NS);
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let ns_prefix = format!("{NS}:");
    let mut out = BTreeSet::new();
    let mut token = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if is_ident(c) {
            token.push(c);
            continue;
        }
        // A bare `inferscope:` is prose (comments), not a metric name.
        if (token.starts_with(&ns_prefix) && token.len() > ns_prefix.len())
            || token.starts_with("http_")
        {
            out.insert(std::mem::take(&mut token));
        }
        token.clear();
    }
    out
}

fn assert_all_in_schema(file: &str, min_names: usize) -> BTreeSet<String> {
    let schema = schema_series_names();
    let used = metric_names_in(&read(file));
    let unknown: Vec<_> = used.iter().filter(|n| !schema.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "{file} uses metric names that are not in the schema: {unknown:?}"
    );
    assert!(
        used.len() >= min_names,
        "{file}: expected at least {min_names} metric names, found {used:?}"
    );
    used
}

#[test]
fn dashboard_uses_only_schema_metrics() {
    let used = assert_all_in_schema("deploy/grafana/inferscope-dashboard.json", 15);
    // The panels the operations guide documents.
    for needed in [
        "inferscope:request_success_total",
        "inferscope:time_to_first_token_seconds_bucket",
        "inferscope:inter_token_latency_seconds_bucket",
        "inferscope:e2e_request_latency_seconds_bucket",
        "inferscope:request_queue_time_seconds_bucket",
        "inferscope:num_requests_running",
        "inferscope:num_requests_waiting",
        "inferscope:kv_cache_usage_perc",
        "inferscope:prefix_cache_hits_total",
        "inferscope:prefix_cache_queries_total",
        "inferscope:num_preemptions_total",
        "inferscope:device_busy_seconds_total",
        "inferscope:engine_step_duration_seconds_sum",
        "http_requests_total",
    ] {
        assert!(used.contains(needed), "dashboard lacks {needed}");
    }
}

#[test]
fn dashboard_queries_go_through_the_namespace_variable() {
    // A literal namespace would break the dashboard for `--metrics-namespace vllm`.
    let text = read("deploy/grafana/inferscope-dashboard.json");
    for literal in ["inferscope:", "vllm:"] {
        assert!(
            !text.contains(literal),
            "dashboard contains the literal `{literal}`; use `${{namespace}}:`"
        );
    }
}

#[test]
fn alert_rules_use_only_schema_metrics() {
    let used = assert_all_in_schema("deploy/prometheus/alerts.yml", 5);
    for needed in [
        "inferscope:request_queue_time_seconds_bucket",
        "inferscope:kv_cache_usage_perc",
        "inferscope:num_preemptions_total",
        "inferscope:request_success_total",
        "inferscope:device_busy_seconds_total",
        "inferscope:num_requests_waiting",
    ] {
        assert!(used.contains(needed), "alerts lack {needed}");
    }
}

#[test]
fn alert_rule_tests_use_only_schema_metrics() {
    assert_all_in_schema("deploy/prometheus/alerts_test.yml", 5);
}

#[test]
fn the_extractor_finds_names_and_suffixes() {
    let names = metric_names_in(
        r#"{"expr": "histogram_quantile(0.9, sum by (le) (rate(${namespace}:time_to_first_token_seconds_bucket[5m]))) / http_requests_total{status=\"5xx\"}"}"#,
    );
    let want: BTreeSet<String> = [
        "inferscope:time_to_first_token_seconds_bucket",
        "http_requests_total",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, want);
    let schema = schema_series_names();
    assert!(!schema.contains("inferscope:time_to_first_token_seconds"));
    assert!(schema.contains("inferscope:num_requests_running"));
    assert!(!schema.contains("inferscope:request_success"));
}
