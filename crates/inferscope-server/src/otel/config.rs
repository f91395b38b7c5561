//! Trace configuration: the `--otlp-traces-*` flags over the standard
//! `OTEL_*` environment variables.

use std::time::Duration;

use opentelemetry_sdk::trace::Sampler;

use crate::error::ServerError;

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over HTTP with protobuf bodies (the default).
    HttpProtobuf,
    /// OTLP over gRPC (tonic, plaintext HTTP/2).
    Grpc,
}

/// Everything the trace exporter needs, resolved and validated at start-up.
#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// Where spans go: for HTTP the full URL (`/v1/traces` is added to a
    /// URL without a path), for gRPC the collector's URL.
    pub endpoint: String,
    /// The transport.
    pub protocol: Protocol,
    /// Which requests are traced.
    pub sampler: Sampler,
    /// Requests whose spans may wait for export; more are dropped and counted
    /// (`OTEL_BSP_MAX_QUEUE_SIZE`, default 2048).
    pub max_queue_requests: usize,
    /// Most spans in one export call (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, default 512).
    pub max_export_batch: usize,
    /// Longest wait before queued spans are sent (`OTEL_BSP_SCHEDULE_DELAY`, ms, default 5000).
    pub schedule_delay: Duration,
}

/// Reads an environment variable; unset and empty are the same.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn config_err(m: String) -> ServerError {
    ServerError::Config(m)
}

/// A sampling ratio in 0..=1.
fn ratio(what: &str, text: &str) -> Result<f64, ServerError> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(config_err(format!(
            "{what} must be a number from 0 to 1, got {text:?}"
        ))),
    }
}

/// The sampler: `--otlp-traces-sample-ratio` when given (parent-based: a
/// request whose `traceparent` says sampled is traced whatever the ratio),
/// else `OTEL_TRACES_SAMPLER` with `OTEL_TRACES_SAMPLER_ARG`, else
/// `parentbased_always_on` (the OpenTelemetry default).
pub(crate) fn sampler(
    flag_ratio: Option<f64>,
    sampler: Option<&str>,
    arg: Option<&str>,
) -> Result<Sampler, ServerError> {
    if let Some(r) = flag_ratio {
        let r = ratio("--otlp-traces-sample-ratio", &r.to_string())?;
        return Ok(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            r,
        ))));
    }
    let arg_ratio = || -> Result<f64, ServerError> {
        match arg {
            Some(a) => ratio("OTEL_TRACES_SAMPLER_ARG", a),
            None => Ok(1.0),
        }
    };
    let parent = |s: Sampler| Sampler::ParentBased(Box::new(s));
    Ok(match sampler.map(str::trim) {
        None | Some("parentbased_always_on") => parent(Sampler::AlwaysOn),
        Some("always_on") => Sampler::AlwaysOn,
        Some("always_off") => Sampler::AlwaysOff,
        Some("parentbased_always_off") => parent(Sampler::AlwaysOff),
        Some("traceidratio") => Sampler::TraceIdRatioBased(arg_ratio()?),
        Some("parentbased_traceidratio") => parent(Sampler::TraceIdRatioBased(arg_ratio()?)),
        Some(other) => {
            return Err(config_err(format!(
                "OTEL_TRACES_SAMPLER={other:?} is not supported: use always_on, always_off, \
                 traceidratio, parentbased_always_on, parentbased_always_off or \
                 parentbased_traceidratio"
            )));
        }
    })
}

/// The protocol of `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
/// `OTEL_EXPORTER_OTLP_PROTOCOL`, else HTTP/protobuf.
pub(crate) fn protocol(
    traces: Option<&str>,
    general: Option<&str>,
) -> Result<Protocol, ServerError> {
    let (var, value) = match (traces, general) {
        (Some(v), _) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v),
        (None, Some(v)) => ("OTEL_EXPORTER_OTLP_PROTOCOL", v),
        (None, None) => return Ok(Protocol::HttpProtobuf),
    };
    match value.trim() {
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        "grpc" => Ok(Protocol::Grpc),
        other => Err(config_err(format!(
            "{var}={other:?} is not supported: use http/protobuf or grpc"
        ))),
    }
}

/// A positive integer environment variable, or `default`.
fn env_count(name: &str, default: usize) -> Result<usize, ServerError> {
    match env(name) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(config_err(format!(
                "{name} must be a positive integer, got {v:?}"
            ))),
        },
    }
}

/// For HTTP: the URL as given, or with `/v1/traces` when it has no path
/// (`http://collector:4318` means the collector's traces route).
pub(crate) fn http_endpoint(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    if rest.trim_end_matches('/').contains('/') {
        url.to_owned()
    } else {
        format!("{}/v1/traces", url.trim_end_matches('/'))
    }
}

impl TraceConfig {
    /// The configuration for `--otlp-traces-endpoint endpoint` with the
    /// optional ratio flag, the rest from the environment.
    pub fn from_env(endpoint: &str, flag_ratio: Option<f64>) -> Result<Self, ServerError> {
        let endpoint = endpoint.trim();
        if endpoint.starts_with("https://") {
            // Neither exporter is built with TLS (it would add a TLS stack to
            // the build); refusing here beats failing every export later.
            return Err(config_err(format!(
                "--otlp-traces-endpoint {endpoint:?}: this build exports OTLP without TLS; \
                 use an http:// URL (e.g. a local OpenTelemetry Collector that forwards over TLS)"
            )));
        }
        if !endpoint.starts_with("http://") {
            return Err(config_err(format!(
                "--otlp-traces-endpoint {endpoint:?}: expected an http:// URL, \
                 e.g. http://localhost:4318/v1/traces (HTTP) or http://localhost:4317 (gRPC)"
            )));
        }
        if endpoint.parse::<axum::http::Uri>().is_err() {
            return Err(config_err(format!(
                "--otlp-traces-endpoint {endpoint:?} is not a valid URL"
            )));
        }
        let protocol = protocol(
            env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").as_deref(),
            env("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref(),
        )?;
        let endpoint = match protocol {
            Protocol::HttpProtobuf => http_endpoint(endpoint),
            Protocol::Grpc => endpoint.to_owned(),
        };
        let sampler = sampler(
            flag_ratio,
            env("OTEL_TRACES_SAMPLER").as_deref(),
            env("OTEL_TRACES_SAMPLER_ARG").as_deref(),
        )?;
        let delay_ms = env_count("OTEL_BSP_SCHEDULE_DELAY", 5000)?;
        Ok(Self {
            endpoint,
            protocol,
            sampler,
            max_queue_requests: env_count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?,
            max_export_batch: env_count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?,
            schedule_delay: Duration::from_millis(delay_ms as u64),
        })
    }
}
