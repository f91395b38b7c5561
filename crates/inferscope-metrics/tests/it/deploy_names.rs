//! Every metric name that the shipped Grafana dashboard and Prometheus alert
//! rules (`deploy/`) query must exist in the schema, so a renamed or removed
//! metric breaks `cargo test --workspace` instead of a production dashboard.

use std::collections::BTreeSet;
use std::path::PathBuf;

use inferscope_schema::schema::{MetricType, all_metrics, name_prefix};

const NS: &str = "inferscope";
const VLLM: &str = "vllm";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every series name a query may use under `ns`: the exposed family name,
/// plus `_bucket`, `_sum` and `_count` for histograms.
fn schema_series_names(ns: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for def in all_metrics() {
        let exposed = def.exposed_name(ns);
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

/// The dashboard's `prefix` variable replaced by the names' prefix under `ns`.
fn substitute(text: &str, ns: &str) -> String {
    let prefix = name_prefix(ns);
    text.replace("${prefix}", &prefix)
        .replace("$prefix", &prefix)
        .replace("[[prefix]]", &prefix)
}

/// Identifiers in `text` that name one of our metrics under `ns`: namespaced
/// ones and the HTTP ones.
fn metric_names_in(text: &str, ns: &str) -> BTreeSet<String> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let ns_prefix = name_prefix(ns);
    let mut out = BTreeSet::new();
    let mut token = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if is_ident(c) {
            token.push(c);
            continue;
        }
        // A bare prefix is prose (comments), not a metric name.
        if (token.starts_with(&ns_prefix) && token.len() > ns_prefix.len())
            || token.starts_with("http_")
        {
            out.insert(std::mem::take(&mut token));
        }
        token.clear();
    }
    out
}

/// The alternatives of every `__name__=~"a|b"` matcher in `text` (quotes
/// JSON-escaped or not): one name per spelling, of which one must exist.
fn name_alternations(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("__name__=~") {
        let rest = text[i + "__name__=~".len()..].trim_start_matches('\\');
        let Some(rest) = rest.strip_prefix('"') else {
            continue;
        };
        let end = rest.find('"').unwrap_or(rest.len());
        let body = rest[..end].trim_end_matches('\\');
        out.push(body.split('|').map(str::to_owned).collect());
    }
    out
}

/// Checks `text` under `ns`: every name is in the schema, except that of
/// the alternatives of a `__name__` matcher one suffices. Returns the names
/// that exist.
fn check_names(file: &str, text: &str, ns: &str) -> BTreeSet<String> {
    let text = substitute(text, ns);
    let schema = schema_series_names(ns);
    let mut used = metric_names_in(&text, ns);
    for alternatives in name_alternations(&text) {
        assert!(
            alternatives.iter().any(|a| schema.contains(a)),
            "{file} under {ns}: none of {alternatives:?} is in the schema"
        );
        for a in alternatives.iter().filter(|a| !schema.contains(*a)) {
            used.remove(a);
        }
    }
    let unknown: Vec<_> = used.iter().filter(|n| !schema.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "{file} under {ns} uses metric names that are not in the schema: {unknown:?}"
    );
    used
}

fn assert_all_in_schema(file: &str, ns: &str, min_names: usize) -> BTreeSet<String> {
    let used = check_names(file, &read(file), ns);
    assert!(
        used.len() >= min_names,
        "{file}: expected at least {min_names} metric names, found {used:?}"
    );
    used
}

#[test]
fn dashboard_uses_only_schema_metrics() {
    let dashboard = "deploy/grafana/inferscope-dashboard.json";
    // The same panels under vLLM's spelling (`--metrics-namespace vllm`).
    let vllm = assert_all_in_schema(dashboard, VLLM, 15);
    assert!(vllm.contains("vllm:iteration_tokens_total_sum"), "{vllm:?}");
    let used = assert_all_in_schema(dashboard, NS, 15);
    assert!(used.contains("inferscope_iteration_tokens_sum"), "{used:?}");
    // The panels the operations guide documents.
    for needed in [
        "inferscope_request_success_total",
        "inferscope_time_to_first_token_seconds_bucket",
        "inferscope_inter_token_latency_seconds_bucket",
        "inferscope_e2e_request_latency_seconds_bucket",
        "inferscope_request_queue_time_seconds_bucket",
        "inferscope_num_requests_running",
        "inferscope_num_requests_waiting",
        "inferscope_kv_cache_usage_perc",
        "inferscope_prefix_cache_hits_total",
        "inferscope_prefix_cache_queries_total",
        "inferscope_num_preemptions_total",
        "inferscope_device_busy_seconds_total",
        "inferscope_engine_step_duration_seconds_sum",
        "http_requests_total",
        // vLLM's 2025–2026 series.
        "inferscope_num_requests_waiting_by_reason",
        "inferscope_prompt_tokens_by_source_total",
        "inferscope_request_prefill_kv_computed_tokens_bucket",
        "inferscope_kv_block_lifetime_seconds_bucket",
        "inferscope_kv_block_idle_before_evict_seconds_bucket",
        "inferscope_kv_block_reuse_gap_seconds_bucket",
        "inferscope_estimated_flops_per_gpu_total",
        "inferscope_estimated_read_bytes_per_gpu_total",
        "inferscope_estimated_write_bytes_per_gpu_total",
    ] {
        assert!(used.contains(needed), "dashboard lacks {needed}");
    }
}

#[test]
fn dashboard_queries_go_through_the_prefix_variable() {
    // A literal namespace would break the dashboard for the other one; only
    // the variable's own definition may spell the prefixes.
    let text = read("deploy/grafana/inferscope-dashboard.json");
    let queries: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"expr\"") || l.contains("label_values"))
        .collect();
    assert!(queries.len() >= 15, "{queries:?}");
    for q in queries {
        for literal in ["inferscope:", "inferscope_", "vllm:"] {
            assert!(
                !q.contains(literal),
                "dashboard query contains the literal `{literal}`; use `${{prefix}}`: {q}"
            );
        }
    }
}

#[test]
fn alert_rules_use_only_schema_metrics() {
    let used = assert_all_in_schema("deploy/prometheus/alerts.yml", NS, 5);
    for needed in [
        "inferscope_request_queue_time_seconds_bucket",
        "inferscope_kv_cache_usage_perc",
        "inferscope_num_preemptions_total",
        "inferscope_request_success_total",
        "inferscope_device_busy_seconds_total",
        "inferscope_num_requests_waiting",
    ] {
        assert!(used.contains(needed), "alerts lack {needed}");
    }
}

#[test]
fn alert_rule_tests_use_only_schema_metrics() {
    assert_all_in_schema("deploy/prometheus/alerts_test.yml", NS, 5);
}

#[test]
fn the_extractor_finds_names_and_suffixes() {
    let text = substitute(
        r#"{"expr": "histogram_quantile(0.9, sum by (le) (rate(${prefix}time_to_first_token_seconds_bucket[5m]))) / http_requests_total{status=\"5xx\"}"}"#,
        NS,
    );
    let names = metric_names_in(&text, NS);
    let want: BTreeSet<String> = [
        "inferscope_time_to_first_token_seconds_bucket",
        "http_requests_total",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, want);
    let schema = schema_series_names(NS);
    assert!(!schema.contains("inferscope_time_to_first_token_seconds"));
    assert!(schema.contains("inferscope_num_requests_running"));
    assert!(!schema.contains("inferscope_request_success"));
    assert!(!schema.contains("inferscope:num_requests_running"));
    // Alternations: one spelling must exist; a misspelt pair is caught.
    let alt = r#"rate({__name__=~\"${prefix}iteration_tokens_sum|${prefix}iteration_tokens_total_sum\", engine=~\"$engine\"}[1m])"#;
    assert_eq!(
        name_alternations(&substitute(alt, VLLM)),
        [[
            "vllm:iteration_tokens_sum",
            "vllm:iteration_tokens_total_sum"
        ]]
    );
    assert_eq!(check_names("t", alt, VLLM).len(), 1);
    assert_eq!(check_names("t", alt, NS).len(), 1);
    let bad = alt.replace("iteration_tokens_sum|", "iteration_token_sum|");
    assert!(std::panic::catch_unwind(|| check_names("t", &bad, NS)).is_err());
}
