//! The metrics reference, `docs/metrics.md`, rendered from the catalogue:
//! a document of blocks (headings, paragraphs, lists, tables), one blank
//! line between each two.

use std::fmt::Display;

use super::buckets::{BucketGroup, Buckets};
use super::catalogue::{
    DEFAULT_MAX_TENANT_LABELS, ENGINE_METRICS, HTTP_METRICS, MAX_TENANT_LABELS_FLAG, MetricDef,
    PROMPT_TOKEN_SOURCES, STEP_PHASES, TENANT_ANONYMOUS, TENANT_OTHER, WAITING_REASONS,
    enabling_flag,
};
use super::naming::{LEGACY_DEFAULT_NAMESPACE, VLLM_NAMESPACE, name_prefix};
use crate::stats::FinishReason;

/// Renders the metrics reference (`docs/metrics.md`) for a namespace.
pub fn render_markdown(namespace: &str) -> String {
    let mut blocks = vec![
        "# Metrics reference".to_owned(),
        "<!-- GENERATED from crates/inferscope-schema/src/schema.rs by `schema::render_markdown`. \
         Do not edit: run `INFERSCOPE_BLESS=1 cargo test -p inferscope-schema` to regenerate. -->"
            .to_owned(),
        names_note(namespace),
        format!(
            "inferscope servers before these lint-clean names spelled the default namespace \
             `{LEGACY_DEFAULT_NAMESPACE}x` (vLLM's separator and names); `doctor`, `top` and \
             `bench serve --scrape-metrics` still read that spelling."
        ),
        "`GET /metrics` serves the Prometheus text format 0.0.4 by default and OpenMetrics 1.0.0 \
         when the `Accept` header asks for `application/openmetrics-text`."
            .to_owned(),
    ];
    for (title, defs) in [
        ("Engine and request metrics", ENGINE_METRICS),
        ("HTTP metrics", HTTP_METRICS),
    ] {
        blocks.push(format!("## {title}"));
        blocks.push(metrics_table(namespace, defs));
    }
    blocks.push("## Label values".to_owned());
    blocks.push(list([
        format!("`finished_reason`: {}.", code_list(FinishReason::ALL)),
        format!("`phase`: {}.", code_list(STEP_PHASES)),
        "`handler`: the matched route template (never the raw path); `none` when no route \
         matched. `/metrics` and `/health` are not instrumented by default."
            .to_owned(),
        "`status`: the status class `1xx` … `5xx`. `method`: the HTTP method, `other` for \
         non-standard ones."
            .to_owned(),
        format!(
            "`reason` (`num_requests_waiting_by_reason`): {}.",
            code_list(WAITING_REASONS)
        ),
        format!(
            "`tenant`: the tenant's name from `--api-key-file` (or the trusted `--tenant-header`), \
             `default` under `--api-key`, `{anon}` when nothing named one; at most \
             `{flag}` (default {max}) distinct values, every later tenant counted as `{other}` \
             (how many: `tenant_labels_folded`).",
            anon = TENANT_ANONYMOUS,
            flag = MAX_TENANT_LABELS_FLAG,
            max = DEFAULT_MAX_TENANT_LABELS,
            other = TENANT_OTHER,
        ),
        format!(
            "`source` (`prompt_tokens_by_source`): {}.",
            code_list(PROMPT_TOKEN_SOURCES)
        ),
        "`cache_config_info`: `block_size`, `cache_dtype`, `enable_prefix_caching` \
         (`True`/`False`, as vLLM writes it), `engine`, `num_gpu_blocks`."
            .to_owned(),
    ]));
    blocks.push("## Metrics behind a flag".to_owned());
    blocks.push(
        "These are registered only when their flag is given (the flags are vLLM's). \
         `--kv-cache-metrics-sample F` (default 0.01) sets the fraction of allocated KV blocks \
         whose residency is timed, so the block pool's hot path stays cheap (its cost is \
         measured in docs/scale-out.md). The `estimated_*` counters are estimates from the \
         executor's cost model, not measurements: the sim's profile, or for the cpu executor \
         the model's shapes and its weights' stored bytes (f32, bf16 or quantized blocks; \
         a quantized weight costs the FLOPs of a dense one):"
            .to_owned(),
    );
    blocks.push(list(ENGINE_METRICS.iter().filter_map(|def| {
        let flag = enabling_flag(def)?;
        Some(format!("`{}`: `{flag}`", def.exposed_name(namespace)))
    })));
    blocks.push("## Bucket overrides".to_owned());
    blocks.push(
        "Each bucket group can be overridden with a comma-separated list of strictly increasing \
         finite bounds (`+Inf` is implicit), in any namespace; without an override \
         `request_latency` resolves 1 ms to 200 ms in the native namespace and keeps vLLM's \
         defaults under `vllm`:"
            .to_owned(),
    );
    blocks.push(list(BucketGroup::ALL.into_iter().map(|g| {
        let users = ENGINE_METRICS
            .iter()
            .filter(|d| d.buckets == Buckets::Group(g))
            .map(|d| d.exposed_name(namespace));
        format!("`{g}`: {}", code_list(users))
    })));
    let mut doc = blocks.join("\n\n");
    doc.push('\n');
    doc
}

/// How names are spelled: the namespace's joiner, what `vllm` changes.
fn names_note(namespace: &str) -> String {
    let renamed: Vec<String> = ENGINE_METRICS
        .iter()
        .filter(|d| d.vllm_name.is_some())
        .map(|d| {
            format!(
                "`{}` is `{}`",
                d.exposed_name(namespace),
                d.exposed_name(VLLM_NAMESPACE)
            )
        })
        .collect();
    format!(
        "Names are shown with the default namespace `{namespace}`, joined with `_` so that \
         `promtool check metrics` accepts them; any other namespace but `vllm` is joined the \
         same way. `--metrics-namespace vllm` spells names exactly as vLLM does, for drop-in \
         compatibility with vLLM dashboards and routers: `{prefix}x` becomes `vllm:x`, and {renamed}. \
         HTTP metrics carry no namespace. Counters are shown with the `_total` suffix the \
         exposition adds. Engine-level series carry `model_name` and `engine` (the global \
         data-parallel rank, in decimal).",
        prefix = name_prefix(namespace),
        renamed = renamed.join(", "),
    )
}

/// One section's table: a row per metric.
fn metrics_table(namespace: &str, defs: &[MetricDef]) -> String {
    let header = ["name", "type", "unit", "labels", "buckets", "help"];
    let mut lines = vec![row(header), format!("|{}", "---|".repeat(header.len()))];
    for def in defs {
        let labels = if def.labels.is_empty() {
            "—".to_owned()
        } else {
            code_list(def.labels)
        };
        lines.push(row([
            format!("`{}`", def.exposed_name(namespace)),
            def.metric_type.as_str().to_owned(),
            def.unit.as_str().to_owned(),
            labels,
            buckets_cell(namespace, def.buckets),
            format!("{}.", def.help),
        ]));
    }
    lines.join("\n")
}

/// The buckets column: fixed bounds, or the group and its defaults (both
/// styles' where they differ).
fn buckets_cell(namespace: &str, buckets: Buckets) -> String {
    match buckets {
        Buckets::None => "—".to_owned(),
        Buckets::Fixed(b) => bounds(b),
        Buckets::Group(BucketGroup::RequestTokens) => {
            "group `request_tokens`: 1, 2, 5, 10, 20, 50, … up to max_model_len".to_owned()
        }
        Buckets::Group(g) => {
            let ours = g.default_buckets(namespace, 0);
            let vllm = g.default_buckets(VLLM_NAMESPACE, 0);
            if ours == vllm {
                format!("group `{g}`: {}", bounds(&ours))
            } else {
                format!(
                    "group `{g}`: {}; under `vllm`: {}",
                    bounds(&ours),
                    bounds(&vllm)
                )
            }
        }
    }
}

/// A table row: `| a | b |`.
fn row<T: AsRef<str>>(cells: impl IntoIterator<Item = T>) -> String {
    let cells: Vec<T> = cells.into_iter().collect();
    let cells: Vec<&str> = cells.iter().map(AsRef::as_ref).collect();
    format!("| {} |", cells.join(" | "))
}

/// A bulleted list, one `- item` line per item.
fn list(items: impl IntoIterator<Item = String>) -> String {
    items
        .into_iter()
        .map(|item| format!("- {item}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each item in backticks, comma-separated: `` `a`, `b` ``.
fn code_list<T: Display>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|item| format!("`{item}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Bucket bounds, comma-separated.
fn bounds(bounds: &[f64]) -> String {
    bounds
        .iter()
        .map(f64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
