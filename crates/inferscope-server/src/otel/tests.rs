//! Trace context, sampling, configuration and span building, against an
//! in-memory exporter.

use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use inferscope_engine::{FinishReason, PrefillChunk, RequestTimeline};
use inferscope_metrics::{MetricsConfig, StatLoggerManager};
use opentelemetry::trace::{SpanKind, Status, TraceId};
use opentelemetry::{Key, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData, SpanExporter};

use super::config::{self, Protocol};
use super::*;

const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

fn test_config(flag_ratio: Option<f64>) -> TraceConfig {
    TraceConfig {
        endpoint: "http://127.0.0.1:9/v1/traces".into(),
        protocol: Protocol::HttpProtobuf,
        sampler: config::sampler(flag_ratio, None, None).expect("sampler"),
        max_queue_requests: 2,
        max_export_batch: 512,
        schedule_delay: Duration::from_millis(10),
    }
}

/// The in-memory exporter without its clear-on-shutdown, so that a test can
/// read what the export task sent before it stopped.
#[derive(Debug)]
struct Keep(InMemorySpanExporter);

impl SpanExporter for Keep {
    async fn export(&self, batch: Vec<SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.export(batch).await
    }
}

fn traces(flag_ratio: Option<f64>) -> (Arc<Traces>, InMemorySpanExporter, TraceSpanDrops) {
    let metrics = StatLoggerManager::new(MetricsConfig::default()).expect("metrics");
    let drops = metrics.trace_span_drops();
    let exporter = InMemorySpanExporter::default();
    let t = Traces::with_exporter(
        Keep(exporter.clone()),
        &test_config(flag_ratio),
        drops.clone(),
    );
    (t, exporter, drops)
}

fn headers(traceparent: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("traceparent", traceparent.parse().expect("header"));
    h.insert("tracestate", "vendor=abc".parse().expect("header"));
    h
}

#[tokio::test]
async fn a_valid_traceparent_becomes_the_parent() {
    let (t, _, _) = traces(Some(0.0));
    let cx = t.context(&headers(&format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01")));
    assert_eq!(cx.span.trace_id().to_string(), PARENT_TRACE);
    assert_eq!(
        cx.parent.map(|p| p.to_string()).as_deref(),
        Some(PARENT_SPAN)
    );
    assert_ne!(cx.span.span_id().to_string(), PARENT_SPAN, "a new span id");
    assert_eq!(cx.span.trace_state().header(), "vendor=abc");
    // Parent-based: sampled by the parent although the ratio is 0.
    assert!(cx.span.is_sampled());
    let tp = cx.traceparent();
    let tp = tp.to_str().expect("ascii");
    assert_eq!(tp, format!("00-{PARENT_TRACE}-{}-01", cx.span.span_id()));
    assert_eq!(cx.sampled_trace_id(), Some(cx.span.trace_id().to_bytes()));

    // An unsampled parent is followed too, whatever the ratio.
    let (t, _, _) = traces(Some(1.0));
    let cx = t.context(&headers(&format!("00-{PARENT_TRACE}-{PARENT_SPAN}-00")));
    assert!(!cx.span.is_sampled());
    assert!(cx.traceparent().to_str().expect("ascii").ends_with("-00"));
    assert_eq!(cx.sampled_trace_id(), None);
}

#[tokio::test]
async fn invalid_traceparents_start_a_new_trace() {
    let (t, _, _) = traces(Some(1.0));
    let zero_trace = "0".repeat(32);
    let zero_span = "0".repeat(16);
    for bad in [
        format!("00-{zero_trace}-{PARENT_SPAN}-01"),
        format!("00-{PARENT_TRACE}-{zero_span}-01"),
        format!("00-{PARENT_TRACE}-{PARENT_SPAN}"),
        "garbage".to_owned(),
        format!("ff-{PARENT_TRACE}-{PARENT_SPAN}-01"),
    ] {
        let cx = t.context(&headers(&bad));
        assert_eq!(cx.parent, None, "{bad}");
        let id = cx.span.trace_id();
        assert_ne!(id, TraceId::INVALID, "{bad}");
        assert_ne!(id.to_string(), PARENT_TRACE, "{bad}");
        assert!(cx.span.is_sampled(), "ratio 1 samples new traces");
    }
    let cx = t.context(&HeaderMap::new());
    assert_eq!(cx.parent, None);
    let (t0, _, _) = traces(Some(0.0));
    assert!(!t0.context(&HeaderMap::new()).span.is_sampled(), "ratio 0");
    assert!(
        t0.start_span(&t0.context(&HeaderMap::new()), Instant::now(), start())
            .is_none()
    );
}

#[test]
fn configuration_errors_name_the_setting() {
    fn err<T>(r: Result<T, crate::ServerError>) -> String {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    }
    assert!(err(config::sampler(Some(1.5), None, None)).contains("--otlp-traces-sample-ratio"));
    assert!(err(config::sampler(None, Some("sometimes"), None)).contains("OTEL_TRACES_SAMPLER"));
    assert!(
        err(config::sampler(None, Some("traceidratio"), Some("x")))
            .contains("OTEL_TRACES_SAMPLER_ARG")
    );
    assert!(err(config::protocol(Some("http/json"), None)).contains("http/json"));
    assert_eq!(
        config::protocol(None, Some("http/protobuf")).ok(),
        Some(Protocol::HttpProtobuf)
    );
    assert_eq!(
        config::protocol(None, None).ok(),
        Some(Protocol::HttpProtobuf)
    );
    assert_eq!(
        config::protocol(Some("grpc"), Some("http/protobuf")).ok(),
        Some(Protocol::Grpc),
        "the traces variable wins over the general one"
    );
    assert_eq!(
        config::protocol(None, Some("grpc")).ok(),
        Some(Protocol::Grpc)
    );
    assert_eq!(
        config::http_endpoint("http://c:4318"),
        "http://c:4318/v1/traces"
    );
    assert_eq!(
        config::http_endpoint("http://c:4318/"),
        "http://c:4318/v1/traces"
    );
    assert_eq!(
        config::http_endpoint("http://c:4318/custom"),
        "http://c:4318/custom"
    );
    assert!(err(TraceConfig::from_env("localhost:4318", None)).contains("http://"));
    assert!(err(TraceConfig::from_env("https://c:4318", None)).contains("without TLS"));
}

fn start() -> SpanStart {
    SpanStart {
        operation: "chat",
        route: "/v1/chat/completions",
    }
}

/// A timeline of a request chunked into two prefill steps and preempted once.
fn timeline(arrival: Instant) -> RequestTimeline {
    let at = |ms: u64| arrival + Duration::from_millis(ms);
    let mut t = RequestTimeline::new(arrival);
    t.first_scheduled = Some(at(10));
    t.prefill_chunks = vec![
        PrefillChunk {
            start: at(10),
            end: at(20),
            num_tokens: 32,
        },
        PrefillChunk {
            start: at(20),
            end: at(30),
            num_tokens: 8,
        },
        PrefillChunk {
            start: at(45),
            end: at(50),
            num_tokens: 42,
        },
    ];
    t.preemptions = vec![at(40)];
    t.first_token = Some(at(30));
    t.last_token = Some(at(60));
    t.finished = Some(at(60));
    t
}

fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key == Key::new(key.to_owned()))
        .map(|kv| &kv.value)
}

async fn exported(t: &Arc<Traces>, exporter: &InMemorySpanExporter) -> Vec<SpanData> {
    t.shutdown(Duration::from_secs(5)).await;
    exporter.get_finished_spans().expect("spans")
}

#[tokio::test]
async fn a_finished_request_becomes_a_span_tree() {
    let (t, exporter, _) = traces(Some(1.0));
    let cx = t.context(&headers(&format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01")));
    let arrival = Instant::now() - Duration::from_millis(100);
    let mut span = t.start_span(&cx, arrival, start()).expect("sampled");
    span.set_request("req-1", "m", 16, 0.5, 0.9, 1);
    span.set_tenant("team-a".into());
    span.set_status_code(200);
    span.choice_finished(0, FinishReason::Length, 3, Some(timeline(arrival)));
    span.set_usage(40, 3);
    span.end();
    let spans = exported(&t, &exporter).await;
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "queued",
            "prefill",
            "prefill",
            "prefill",
            "decode",
            "llm_request"
        ]
    );
    let req = &spans[5];
    assert_eq!(req.span_kind, SpanKind::Server);
    assert_eq!(req.span_context.trace_id().to_string(), PARENT_TRACE);
    assert_eq!(req.parent_span_id.to_string(), PARENT_SPAN);
    assert!(req.parent_span_is_remote);
    assert_eq!(
        req.span_context.span_id(),
        cx.span.span_id(),
        "the id the response named"
    );
    assert_eq!(req.status, Status::Ok);
    for (k, v) in [
        ("gen_ai.usage.prompt_tokens", 40),
        ("gen_ai.usage.input_tokens", 40),
        ("gen_ai.usage.completion_tokens", 3),
        ("gen_ai.usage.output_tokens", 3),
        ("gen_ai.request.max_tokens", 16),
        ("http.response.status_code", 200),
        ("inferscope.num_preemptions", 1),
    ] {
        assert_eq!(attr(req, k), Some(&Value::I64(v)), "{k}");
    }
    assert_eq!(attr(req, "gen_ai.request.id"), Some(&Value::from("req-1")));
    assert_eq!(attr(req, "inferscope.tenant"), Some(&Value::from("team-a")));
    assert_eq!(
        attr(req, "gen_ai.operation.name"),
        Some(&Value::from("chat"))
    );
    let f = |k| match attr(req, k) {
        Some(Value::F64(v)) => *v,
        other => panic!("{k}: {other:?}"),
    };
    assert!((f("gen_ai.latency.time_in_queue") - 0.010).abs() < 1e-9);
    assert!((f("gen_ai.latency.time_to_first_token") - 0.030).abs() < 1e-9);
    assert!((f("gen_ai.latency.e2e") - 0.060).abs() < 1e-9);
    assert!((f("gen_ai.latency.time_in_model_prefill") - 0.020).abs() < 1e-9);
    assert!((f("gen_ai.latency.time_in_model_decode") - 0.030).abs() < 1e-9);
    assert!((f("gen_ai.latency.time_in_model_inference") - 0.050).abs() < 1e-9);
    // The request span starts at the arrival, in wall-clock time.
    let arrival_wall = SystemTime::now() - arrival.elapsed();
    let skew = match arrival_wall.duration_since(req.start_time) {
        Ok(d) => d,
        Err(e) => e.duration(),
    };
    assert!(skew < Duration::from_millis(50), "{skew:?}");
    // Children: same trace, parented on the request span, inside it in time.
    for c in &spans[..5] {
        assert_eq!(c.span_context.trace_id(), req.span_context.trace_id());
        assert_eq!(c.parent_span_id, req.span_context.span_id());
        assert!(
            c.start_time >= req.start_time && c.end_time <= req.end_time,
            "{}",
            c.name
        );
        assert!(c.start_time <= c.end_time);
    }
    let ms = |s: &SpanData| {
        s.end_time
            .duration_since(s.start_time)
            .expect("ordered")
            .as_millis()
    };
    assert_eq!(
        spans[..5].iter().map(ms).collect::<Vec<_>>(),
        [10, 10, 10, 5, 30]
    );
    assert_eq!(
        attr(&spans[3], "inferscope.prefill.recompute"),
        Some(&Value::Bool(true))
    );
    assert_eq!(attr(&spans[1], "inferscope.prefill.recompute"), None);
    let events: Vec<&str> = req.events.iter().map(|e| e.name.as_ref()).collect();
    assert_eq!(events, ["preempted", "finished"]);
    let count = req.events.events[0]
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == "inferscope.preemptions.count");
    assert_eq!(count.map(|kv| &kv.value), Some(&Value::I64(1)));
}

#[tokio::test]
async fn a_dropped_span_ends_as_aborted_and_a_full_queue_counts_drops() {
    let (t, exporter, drops) = traces(Some(1.0));
    let arrival = Instant::now();
    // The export task has not run yet (current-thread runtime): the queue of
    // two takes two requests; the third is dropped and counted (one span: no
    // choice finished).
    for _ in 0..3 {
        let cx = t.context(&HeaderMap::new());
        let mut span = t.start_span(&cx, arrival, start()).expect("sampled");
        span.set_status_code(200);
        drop(span);
    }
    assert_eq!(drops.queue_full.get(), 1);
    let spans = exported(&t, &exporter).await;
    assert_eq!(spans.len(), 2);
    for s in &spans {
        assert!(matches!(&s.status, Status::Error { .. }), "{:?}", s.status);
        assert_eq!(attr(s, "error.type"), Some(&Value::from("abort")));
    }
    assert_eq!(drops.export_failed.get(), 0);
}

#[tokio::test]
async fn several_choices_make_one_request_span_over_all_of_them() {
    let (t, exporter, _) = traces(Some(1.0));
    let cx = t.context(&HeaderMap::new());
    let arrival = Instant::now() - Duration::from_millis(200);
    let at = |ms: u64| arrival + Duration::from_millis(ms);
    // Choice 1 is scheduled later but gets its first token earlier and ends
    // first; choice 0 ends last. Neither alone gives the request's figures.
    let mut slow = RequestTimeline::new(arrival);
    slow.first_scheduled = Some(at(5));
    slow.prefill_chunks = vec![PrefillChunk {
        start: at(5),
        end: at(40),
        num_tokens: 16,
    }];
    slow.first_token = Some(at(40));
    slow.last_token = Some(at(120));
    slow.finished = Some(at(121));
    let mut fast = RequestTimeline::new(arrival);
    fast.first_scheduled = Some(at(8));
    fast.prefill_chunks = vec![PrefillChunk {
        start: at(8),
        end: at(20),
        num_tokens: 16,
    }];
    fast.first_token = Some(at(20));
    fast.last_token = Some(at(70));
    fast.finished = Some(at(70));
    let mut span = t.start_span(&cx, arrival, start()).expect("sampled");
    span.set_request("req-n2", "m", 16, 1.0, 1.0, 2);
    span.choice_finished(1, FinishReason::Stop, 5, Some(fast));
    span.choice_finished(0, FinishReason::Length, 16, Some(slow));
    span.set_usage(16, 21);
    span.end();
    let spans = exported(&t, &exporter).await;
    let requests: Vec<&SpanData> = spans.iter().filter(|s| s.name == "llm_request").collect();
    assert_eq!(requests.len(), 1, "one span per request, not per choice");
    let req = requests[0];
    assert_eq!(
        attr(req, "gen_ai.usage.output_tokens"),
        Some(&Value::I64(21))
    );
    assert_eq!(attr(req, "gen_ai.request.n"), Some(&Value::I64(2)));
    let f = |k| match attr(req, k) {
        Some(Value::F64(v)) => *v,
        other => panic!("{k}: {other:?}"),
    };
    for (k, want) in [
        ("gen_ai.latency.time_in_queue", 0.005),
        ("gen_ai.latency.time_to_first_token", 0.020),
        ("gen_ai.latency.e2e", 0.121),
        ("gen_ai.latency.time_in_model_prefill", 0.015),
        ("gen_ai.latency.time_in_model_decode", 0.100),
        ("gen_ai.latency.time_in_model_inference", 0.116),
    ] {
        assert!((f(k) - want).abs() < 1e-9, "{k}: {} != {want}", f(k));
    }
    // Each choice keeps its own children, tagged with its index.
    let decodes: Vec<(Option<&Value>, Option<&Value>)> = spans
        .iter()
        .filter(|s| s.name == "decode")
        .map(|s| {
            (
                attr(s, "gen_ai.choice.index"),
                attr(s, "gen_ai.usage.output_tokens"),
            )
        })
        .collect();
    assert_eq!(
        decodes,
        [
            (Some(&Value::I64(1)), Some(&Value::I64(5))),
            (Some(&Value::I64(0)), Some(&Value::I64(16)))
        ]
    );
}

#[tokio::test]
async fn the_features_a_request_used_are_span_attributes_and_only_those() {
    let (t, exporter, _) = traces(Some(1.0));
    let arrival = Instant::now();
    let features = crate::features::RequestFeatures {
        logprobs: Some(2),
        prompt_logprobs: None,
        structured_output: Some("json"),
        tools: Some(3),
        tool_choice: Some("required"),
    };
    for f in [features, crate::features::RequestFeatures::default()] {
        let cx = t.context(&headers(&format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01")));
        let mut span = t.start_span(&cx, arrival, start()).expect("sampled");
        span.set_request("req-f", "m", 16, 1.0, 1.0, 1);
        span.set_features(f);
        span.end();
    }
    let spans = exported(&t, &exporter).await;
    assert_eq!(spans.len(), 2);
    let used = &spans[0];
    for (k, v) in [
        ("inferscope.request.logprobs", Value::I64(2)),
        ("inferscope.request.tools", Value::I64(3)),
        ("inferscope.request.structured_output", Value::from("json")),
        ("inferscope.request.tool_choice", Value::from("required")),
    ] {
        assert_eq!(attr(used, k), Some(&v), "{k}");
    }
    assert_eq!(attr(used, "inferscope.request.prompt_logprobs"), None);
    // A plain request's span names no feature.
    let plain = &spans[1];
    assert!(
        !plain
            .attributes
            .iter()
            .any(|kv| kv.key.as_str().starts_with("inferscope.request.")),
        "{:?}",
        plain.attributes
    );
}
