//! The export queue: a bounded channel from the request path to one task
//! that builds spans and hands them, in batches, to the official OTLP
//! exporter.
//!
//! Why not the SDK's `BatchSpanProcessor`: it does not tell how many spans
//! its full queue dropped, and it exports from its own thread, where the
//! HTTP client (hyper, on tokio) has no runtime. Batching here is a few
//! lines; encoding and transport stay the SDK's.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use inferscope_metrics::TraceSpanDrops;
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{RandomIdGenerator, SpanData, SpanExporter};
use tokio::sync::{mpsc, watch};

use super::config::{Protocol, TraceConfig};
use super::span::SpanRecord;
use crate::error::ServerError;

/// At most one "cannot export" log line per this long.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The request side of the queue, and the task behind it.
pub(super) struct ExportQueue {
    tx: mpsc::Sender<SpanRecord>,
    drops: TraceSpanDrops,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The service's resource: `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`
/// as the SDK reads them, with `service.name` defaulting to `inferscope`.
fn resource() -> Resource {
    let from_env = Resource::builder().build();
    let named = from_env
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    if named {
        from_env
    } else {
        Resource::builder().with_service_name("inferscope").build()
    }
}

fn build_exporter(config: &TraceConfig) -> Result<opentelemetry_otlp::SpanExporter, ServerError> {
    let built = match config.protocol {
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(config.endpoint.clone())
            .build(),
        // The channel connects lazily: an absent collector fails exports
        // (counted), not start-up.
        Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(config.endpoint.clone())
            .build(),
    };
    let mut exporter: opentelemetry_otlp::SpanExporter = built.map_err(|e| {
        ServerError::Config(format!("--otlp-traces-endpoint {}: {e}", config.endpoint))
    })?;
    exporter.set_resource(&resource());
    Ok(exporter)
}

impl ExportQueue {
    /// Builds the exporter and starts the task on the current runtime.
    pub(super) fn start(config: &TraceConfig, drops: TraceSpanDrops) -> Result<Self, ServerError> {
        Ok(Self::with_exporter(build_exporter(config)?, config, drops))
    }

    /// Starts the task on the current runtime with `exporter` (tests use an
    /// in-memory one).
    pub(super) fn with_exporter<E: SpanExporter + 'static>(
        exporter: E,
        config: &TraceConfig,
        drops: TraceSpanDrops,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.max_queue_requests);
        let (stop, stopped) = watch::channel(false);
        let worker = Worker {
            exporter,
            rx,
            stopped,
            drops: drops.clone(),
            endpoint: config.endpoint.clone(),
            max_batch: config.max_export_batch,
            delay: config.schedule_delay,
            scope: InstrumentationScope::builder("inferscope")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            ids: RandomIdGenerator::default(),
            last_log: None,
            failed_since_log: 0,
        };
        let task = tokio::spawn(worker.run());
        Self {
            tx,
            drops,
            stop,
            task: Mutex::new(Some(task)),
        }
    }

    /// Queues a finished request's spans; when the queue is full they are
    /// dropped and counted, never waited for.
    pub(super) fn submit(&self, record: SpanRecord) {
        if let Err(e) = self.tx.try_send(record) {
            let record = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            self.drops.queue_full.inc_by(record.span_count());
        }
    }

    /// Exports what is queued, then stops the task; gives up after `timeout`.
    pub(super) async fn shutdown(&self, timeout: Duration) {
        let _ = self.stop.send(true);
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task
            && tokio::time::timeout(timeout, task).await.is_err()
        {
            tracing::warn!("trace export did not finish within the shutdown timeout");
        }
    }
}

/// The export task's state.
struct Worker<E> {
    exporter: E,
    rx: mpsc::Receiver<SpanRecord>,
    stopped: watch::Receiver<bool>,
    drops: TraceSpanDrops,
    endpoint: String,
    max_batch: usize,
    delay: Duration,
    scope: InstrumentationScope,
    ids: RandomIdGenerator,
    last_log: Option<Instant>,
    failed_since_log: u64,
}

impl<E: SpanExporter> Worker<E> {
    async fn run(mut self) {
        let mut batch: Vec<SpanData> = Vec::new();
        loop {
            // Collect until the batch is full or the delay has passed.
            let deadline = tokio::time::sleep(self.delay);
            tokio::pin!(deadline);
            let mut last = false;
            loop {
                tokio::select! {
                    msg = self.rx.recv() => match msg {
                        Some(r) => {
                            r.into_spans(&self.scope, &self.ids, &mut batch);
                            if batch.len() >= self.max_batch {
                                break;
                            }
                        }
                        None => { last = true; break; }
                    },
                    _ = &mut deadline => break,
                    _ = self.stopped.wait_for(|s| *s) => { last = true; break; }
                }
            }
            if last {
                while let Ok(r) = self.rx.try_recv() {
                    r.into_spans(&self.scope, &self.ids, &mut batch);
                }
            }
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(self.max_batch));
                let chunk = std::mem::replace(&mut batch, rest);
                self.export(chunk).await;
            }
            if last {
                let _ = self.exporter.shutdown();
                return;
            }
        }
    }

    async fn export(&mut self, chunk: Vec<SpanData>) {
        let n = chunk.len() as u64;
        if let Err(e) = self.exporter.export(chunk).await {
            self.drops.export_failed.inc_by(n);
            self.failed_since_log += n;
            let now = Instant::now();
            if self
                .last_log
                .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
            {
                tracing::warn!(
                    endpoint = %self.endpoint,
                    error = %e,
                    spans_dropped = self.failed_since_log,
                    "cannot export trace spans; they are dropped and counted in trace_spans_dropped (next message in 60 s at the earliest)"
                );
                self.last_log = Some(now);
                self.failed_since_log = 0;
            }
        }
    }
}

impl Drop for ExportQueue {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
