//! inferscope-metrics: the server side of metrics: the stat-logger manager,
//! the Prometheus and log-line loggers, HTTP instrumentation and exposition.
//! The schema and stats types are in `inferscope-schema` (re-exported here).
//!
//! The server builds one [`StatLoggerManager`] from a [`MetricsConfig`],
//! hands it to the engine as its
//! [`StatsRecorder`](inferscope_schema::StatsRecorder), records TTFT / ITL /
//! e2e as [`FrontendStats`](inferscope_schema::FrontendStats) through a
//! [`FrontendRecorder`] (one per engine, from [`StatLoggerManager::frontend`];
//! the proxy's one per model, from [`StatLoggerManager::model_frontend`]),
//! wraps its router in [`StatLoggerManager::http_layer`], serves `/metrics` with
//! [`exposition::negotiate`] + [`StatLoggerManager::render`], and calls
//! [`StatLoggerManager::log`] every interval.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use axum::{Router, extract::State, http::HeaderMap, response::IntoResponse, routing::get};
//! use inferscope_metrics::{CacheConfig, MetricsConfig, StatLoggerManager, negotiate};
//! use inferscope_schema::{FrontendRequestStats, FrontendStats, RequestRef, StatsRecorder};
//!
//! let manager = Arc::new(StatLoggerManager::new(MetricsConfig {
//!     namespace: "vllm".into(),
//!     model_name: "demo".into(),
//!     engine_indices: vec![0, 1],
//!     max_model_len: 4096,
//!     cache_configs: vec![CacheConfig {
//!         block_size: 16,
//!         num_gpu_blocks: 4096,
//!         enable_prefix_caching: true,
//!         cache_dtype: "auto".into(),
//!     }],
//!     ..Default::default()
//! })?);
//!
//! // The engine's recorder.
//! let _recorder: Arc<dyn StatsRecorder> = manager.clone();
//!
//! // Once per request: the recorder of the engine serving it.
//! if let Some(recorder) = manager.frontend(1) {
//!     // Where tokens are handed to the response (no lock, no allocation),
//!     // the request as the exemplar (or `record`, without one).
//!     let request = RequestRef::new("cmpl-1-0", None);
//!     let ttft = Duration::from_millis(80);
//!     recorder.record_for(&FrontendStats::FirstToken { ttft }, &request);
//!     let itl = Duration::from_millis(12);
//!     recorder.record_for(&FrontendStats::NextToken { itl, count: 1 }, &request);
//!     let finished = FrontendRequestStats {
//!         ttft: Some(ttft),
//!         e2e: Duration::from_millis(500),
//!         num_generation_tokens: 36,
//!     };
//!     recorder.record_for(&FrontendStats::Finished(finished), &request);
//! }
//!
//! // `/metrics` with content negotiation.
//! async fn metrics(State(m): State<Arc<StatLoggerManager>>, headers: HeaderMap) -> impl IntoResponse {
//!     let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
//!     let (content_type, body) = m.render(negotiate(accept));
//!     ([(axum::http::header::CONTENT_TYPE, content_type)], body)
//! }
//!
//! let _app: Router = Router::new()
//!     .route("/v1/models", get(|| async { "[]" }))
//!     .route("/metrics", get(metrics))
//!     // After the routes, with `Router::layer`, so the matched route is known.
//!     .layer(manager.http_layer())
//!     .with_state(manager.clone());
//!
//! // Every 10 s, from a periodic task.
//! manager.log();
//! # Ok::<(), inferscope_metrics::ConfigError>(())
//! ```

pub mod exemplar;
pub mod exemplar_slot;
pub mod exposition;
pub mod frontend;
pub mod histogram;
pub mod http;
pub mod log_line;
pub mod manager;
pub mod prometheus;
pub mod reading;
pub mod tenant_labels;

pub use exposition::{Format, negotiate};
pub use frontend::FrontendRecorder;
pub use http::{HttpMetrics, HttpMetricsLayer};
pub use manager::{ConfigError, MetricsConfig, StatLoggerManager, TraceSpanDrops};
pub use prometheus::{CacheConfig, MetricFilter, OptionalMetrics, every_metric};
pub use reading::{EngineReading, LATENCIES, Latency};
pub use tenant_labels::TenantLabels;
