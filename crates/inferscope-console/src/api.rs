//! The JSON of the console's data routes (documented in docs/console.md):
//! the history's samples, the recent requests, and what a reader needs to
//! interpret them (engines, finish reasons, bucket bounds).

use inferscope_metrics::{EngineReading, LATENCIES, StatLoggerManager};
use inferscope_schema::FinishReason;
use serde_json::{Map, Value, json};

use super::Serving;
use super::history::{HISTORY_SECONDS, INTERVAL_SECONDS, Sample};

/// The format's version: bumped when a field changes meaning or goes away.
pub const FORMAT_VERSION: u64 = 1;

/// Why a server started without the doctor's rules (a library user of
/// `inferscope_server::start`) has no findings (docs/console.md).
pub const NO_FINDINGS_NOTE: &str = "not computed: this server was started without the doctor's rules \
     (the `inferscope` binary hands them in); run `inferscope doctor` against /metrics";

/// What the findings cover when the server computes them.
pub fn findings_note() -> String {
    format!(
        "the doctor's rules over this server's /metrics of the last {} s (less just after start), \
         recomputed every {} s",
        super::findings::WINDOW_SECONDS,
        super::findings::EVERY_SECONDS
    )
}

/// One engine's reading.
fn engine(r: &EngineReading) -> Value {
    let requests: Map<String, Value> = FinishReason::ALL
        .iter()
        .zip(r.requests)
        .map(|(reason, n)| (reason.as_str().to_owned(), json!(n)))
        .collect();
    let latency: Map<String, Value> = LATENCIES
        .iter()
        .zip(&r.latency)
        .map(|(l, counts)| (l.as_str().to_owned(), json!(counts)))
        .collect();
    json!({
        "engine": r.engine,
        "running": r.running,
        "waiting": r.waiting,
        "kv_cache_usage": r.kv_cache_usage,
        "device_busy_seconds": r.device_busy_seconds,
        "preemptions": r.preemptions,
        "prompt_tokens": r.prompt_tokens,
        "generation_tokens": r.generation_tokens,
        "requests": requests,
        "latency": latency,
    })
}

/// One sample.
pub fn sample(s: &Sample) -> Value {
    json!({
        "t": s.t,
        "engines": s.engines.iter().map(engine).collect::<Vec<_>>(),
    })
}

/// Recent requests, each with its `seq`.
pub fn recent(entries: Vec<(u64, Value)>) -> Value {
    Value::Array(
        entries
            .into_iter()
            .map(|(seq, mut v)| {
                if let Value::Object(m) = &mut v {
                    m.insert("seq".into(), json!(seq));
                }
                v
            })
            .collect(),
    )
}

/// What a reader needs to interpret samples: engines, reasons, bounds.
/// `serving`: which panels apply; `diagnosed`: whether the server computes
/// the doctor's findings.
pub fn meta(
    metrics: &StatLoggerManager,
    model: &str,
    serving: Serving,
    diagnosed: bool,
) -> Map<String, Value> {
    let bounds: Map<String, Value> = LATENCIES
        .iter()
        .map(|&l| (l.as_str().to_owned(), json!(metrics.latency_bounds(l))))
        .collect();
    let engines: Vec<usize> = metrics.read_engines().iter().map(|e| e.engine).collect();
    let mut m = Map::new();
    m.insert("version".into(), json!(FORMAT_VERSION));
    m.insert("model".into(), json!(model));
    let serving = match serving {
        Serving::Engines => "engines",
        Serving::Proxy => "proxy",
    };
    m.insert("serving".into(), json!(serving));
    m.insert("interval_seconds".into(), json!(INTERVAL_SECONDS));
    m.insert("history_seconds".into(), json!(HISTORY_SECONDS));
    m.insert("engines".into(), json!(engines));
    m.insert(
        "finish_reasons".into(),
        json!(FinishReason::ALL.map(FinishReason::as_str)),
    );
    m.insert("latency_bounds".into(), Value::Object(bounds));
    let note = if diagnosed {
        findings_note()
    } else {
        NO_FINDINGS_NOTE.to_owned()
    };
    m.insert("findings_note".into(), json!(note));
    m
}
