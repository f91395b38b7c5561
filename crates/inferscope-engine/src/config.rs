//! Engine configuration shared by every engine core.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::waiting_queue::SchedulingPolicy;

/// Scheduler and cache limits of one engine core.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Token budget of one step (prefill chunks plus decodes).
    pub max_num_batched_tokens: usize,
    /// Cap on sequences in the running batch.
    pub max_num_seqs: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Reuse full KV blocks across requests with the same prefix.
    pub enable_prefix_caching: bool,
    /// Longest sequence (prompt plus output) accepted.
    pub max_model_len: usize,
    /// Fraction of KV block allocations whose residency is timed
    /// (`--kv-cache-metrics`); `None` when off.
    #[serde(default)]
    pub kv_cache_metrics_sample: Option<f64>,
    /// Ask the executor for each step's estimated FLOPs and bytes
    /// (`--enable-mfu-metrics`).
    #[serde(default)]
    pub enable_mfu_metrics: bool,
    /// Ask the executor for each step's tokens per expert of a mixture of
    /// experts (`--expert-metrics`).
    #[serde(default)]
    pub enable_expert_metrics: bool,
    /// How waiting requests are admitted (`--scheduling-policy`).
    #[serde(default)]
    pub scheduling_policy: SchedulingPolicy,
    /// Each tenant's share under fair admission (absent: 1).
    #[serde(default)]
    pub tenant_weights: BTreeMap<String, f64>,
    /// Threads each engine core computes grammar masks on
    /// (`--grammar-threads`); `None`: [`crate::structured::default_grammar_threads`].
    #[serde(default)]
    pub grammar_threads: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            block_size: 16,
            enable_prefix_caching: true,
            max_model_len: 8192,
            kv_cache_metrics_sample: None,
            enable_mfu_metrics: false,
            enable_expert_metrics: false,
            scheduling_policy: SchedulingPolicy::Fair,
            tenant_weights: BTreeMap::new(),
            grammar_threads: None,
        }
    }
}
