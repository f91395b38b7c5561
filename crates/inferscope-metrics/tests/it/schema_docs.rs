//! The vLLM-compatible names are pinned. (`docs/metrics.md` drift is
//! checked in the schema crate, where the schema lives.)

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use http_body_util::BodyExt;
use inferscope_metrics::{Format, MetricsConfig, StatLoggerManager};
use inferscope_schema::promtext;
use inferscope_schema::{
    FinishReason, FinishedRequestStats, FrontendRequestStats, FrontendStats, IterationStats,
    SchedulerStats, StatsRecorder,
};
use tower::ServiceExt;

/// Every family the exposition serves in `vllm` mode, in order, as vLLM's
/// dashboards and the Gateway API Inference Extension read them.
const VLLM_FAMILIES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:prompt_tokens_by_source_total",
    "vllm:admission_rejections_total",
    "vllm:request_log_dropped_total",
    "vllm:tenant_labels_folded",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:request_max_num_generation_tokens",
    "vllm:iteration_tokens_total",
    "vllm:request_params_n",
    "vllm:request_prefill_kv_computed_tokens",
    "vllm:request_num_preemptions",
    "vllm:engine_steps_total",
    "vllm:device_busy_seconds_total",
    "vllm:engine_step_duration_seconds",
    "vllm:engine_idle_seconds_total",
    "vllm:batch_size",
    "vllm:grammar_mask_duration_seconds",
    "vllm:engine_core_failures_total",
    "vllm:kv_events_dropped_batches_total",
    "vllm:trace_spans_dropped_total",
    "http_requests_total",
    "http_request_size_bytes",
    "http_response_size_bytes",
    "http_request_duration_highr_seconds",
    "http_request_duration_seconds",
    "http_requests_inprogress",
];

#[tokio::test]
async fn vllm_namespace_names_are_exact() {
    let m = StatLoggerManager::new(MetricsConfig {
        namespace: "vllm".into(),
        model_name: "m".into(),
        cache_configs: vec![inferscope_metrics::CacheConfig {
            block_size: 16,
            num_gpu_blocks: 10,
            enable_prefix_caching: false,
            cache_dtype: "auto".into(),
        }],
        ..Default::default()
    })
    .unwrap();
    let mut iter = IterationStats {
        num_prompt_tokens: 5,
        num_scheduled_tokens: 5,
        ..Default::default()
    };
    iter.finished_requests.push(FinishedRequestStats {
        request: inferscope_schema::RequestRef::new("docs-req", None),
        finish_reason: FinishReason::Length,
        num_prompt_tokens: 5,
        num_generation_tokens: 1,
        num_cached_tokens: 0,
        max_tokens_param: 1,
        n: 1,
        num_preemptions: 0,
        queue_time: Duration::ZERO,
        prefill_time: Duration::ZERO,
        decode_time: Duration::ZERO,
        inference_time: Duration::ZERO,
    });
    m.record_step(0, &SchedulerStats::default(), &iter);
    m.frontend(0)
        .unwrap()
        .record(&FrontendStats::Finished(FrontendRequestStats {
            ttft: None,
            e2e: Duration::from_millis(5),
            num_generation_tokens: 1,
        }));
    m.record_admission_rejection("queue_full");
    let router = Router::new()
        .route("/v1/models", get(|| async { "[]" }))
        .layer(m.http_layer());
    let resp = router
        .oneshot(Request::get("/v1/models").body(Body::empty()).unwrap())
        .await
        .unwrap();
    resp.into_body().collect().await.unwrap();

    let (_, body) = m.render(Format::Prometheus);
    let expo = promtext::parse(&body).unwrap();
    let names: Vec<&str> = expo.families.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, VLLM_FAMILIES, "{body}");
}
