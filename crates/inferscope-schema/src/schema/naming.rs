//! How metric names are spelled under a namespace: the namespaces, the
//! [`Style`] a namespace selects, and the prefix it puts before names.

/// Default namespace (`inferscope_…`).
pub const DEFAULT_NAMESPACE: &str = "inferscope";
/// Namespace for drop-in compatibility with vLLM dashboards and routers.
pub const VLLM_NAMESPACE: &str = "vllm";
/// How servers before the lint-clean names spelled the default namespace
/// (`inferscope:x`, vLLM's names): a namespace readers still accept; the
/// trailing colon selects [`Style::Vllm`].
pub const LEGACY_DEFAULT_NAMESPACE: &str = "inferscope:";

/// How engine metric names are spelled under a namespace, and which default
/// buckets they get: the one place that decides both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Style {
    /// vLLM's: `ns:name` with vLLM's names where ours differ
    /// (`iteration_tokens_total`) and vLLM's default buckets, so vLLM's
    /// dashboards and routers work unchanged. Colons are reserved for
    /// recording rules, so `promtool check metrics` objects to these names.
    Vllm,
    /// Prometheus' conventions: `ns_name`, no `_total` on non-counters, and
    /// request latency buckets that resolve sub-300 ms times.
    Native,
}

impl Style {
    /// The style of `namespace`: [`Style::Vllm`] for `vllm` and for a
    /// namespace written with a trailing colon (`inferscope:`, the older
    /// spelling readers still accept); [`Style::Native`] otherwise.
    pub fn of(namespace: &str) -> Style {
        if namespace == VLLM_NAMESPACE || namespace.ends_with(':') {
            Style::Vllm
        } else {
            Style::Native
        }
    }
}

/// What engine metric names start with under `namespace`: `inferscope_`,
/// `vllm:`, `inferscope:` for [`LEGACY_DEFAULT_NAMESPACE`], or nothing for
/// the empty namespace.
pub fn name_prefix(namespace: &str) -> String {
    let stem = namespace.strip_suffix(':').unwrap_or(namespace);
    if stem.is_empty() {
        return String::new();
    }
    match Style::of(namespace) {
        Style::Vllm => format!("{stem}:"),
        Style::Native => format!("{stem}_"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_styles() {
        assert_eq!(name_prefix(""), "");
        assert_eq!(name_prefix("inferscope"), "inferscope_");
        assert_eq!(name_prefix("vllm"), "vllm:");
        assert_eq!(Style::of("vllm"), Style::Vllm);
        assert_eq!(Style::of(LEGACY_DEFAULT_NAMESPACE), Style::Vllm);
        assert_eq!(Style::of("inferscope"), Style::Native);
        assert_eq!(Style::of(""), Style::Native);
    }
}
