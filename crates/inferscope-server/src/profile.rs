//! `--profile-dir DIR`: vLLM's `POST /start_profile` and `POST /stop_profile`.
//!
//! Between the two, every engine core records its steps and the timelines of
//! its requests (`inferscope_engine::step_trace`); the stop writes them into
//! DIR as one Trace Event Format file (`profile-YYYYMMDD-HHMMSS.json`) that
//! Perfetto and chrome://tracing open: per engine a process with a `steps`
//! thread (a slice per step, its phases as children) and one async track per
//! request (queued, prefill and its chunks, decode), preemptions as instants.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use inferscope_engine::{EngineProfile, RequestTrace, StepRecord, StepSeq};
use inferscope_model::chat_template::strftime::Utc;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::AppState;

/// How long `/stop_profile` waits for the engines to hand over their steps.
const ENGINE_ANSWER: Duration = Duration::from_secs(10);

/// The profile routes' state: where files go, whether a profile runs.
struct Profiler {
    app: Arc<AppState>,
    dir: PathBuf,
    /// When the running profile started (unix seconds); `None`: none runs.
    running: Mutex<Option<f64>>,
}

/// The two routes, when `--profile-dir` is set (the caller puts the API
/// key in front).
pub fn routes<S: Clone + Send + Sync + 'static>(app: Arc<AppState>) -> Option<Router<S>> {
    let dir = app.profile_dir.clone()?;
    let profiler = Arc::new(Profiler {
        app,
        dir,
        running: Mutex::new(None),
    });
    Some(
        Router::new()
            .route("/start_profile", post(start_profile))
            .route("/stop_profile", post(stop_profile))
            .with_state(profiler),
    )
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `POST /start_profile`: 409 when a profile already runs.
async fn start_profile(State(profiler): State<Arc<Profiler>>) -> Response {
    {
        let mut running = profiler
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if running.is_some() {
            return ApiError::conflict("a profile is already running; POST /stop_profile first")
                .into_response();
        }
        *running = Some(unix_now());
    }
    profiler.app.coordinator.start_profile();
    Json(json!({"profiling": true, "dir": profiler.dir})).into_response()
}

/// `POST /stop_profile`: writes the file; 409 when no profile runs.
async fn stop_profile(State(profiler): State<Arc<Profiler>>) -> Response {
    let Some(started_unix) = profiler
        .running
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    else {
        return ApiError::conflict("no profile is running; POST /start_profile first")
            .into_response();
    };
    let dir = profiler.dir.clone();
    let s = Arc::clone(&profiler.app);
    // The engines answer between steps, and the file may be large: off the runtime.
    let written = tokio::task::spawn_blocking(move || {
        let engines = s.coordinator.stop_profile(ENGINE_ANSWER);
        let missing: Vec<usize> = engines
            .iter()
            .filter(|(_, p)| p.is_none())
            .map(|(e, _)| *e)
            .collect();
        let profiles: Vec<EngineProfile> = engines.into_iter().filter_map(|(_, p)| p).collect();
        let trace = trace_events(&profiles, started_unix, unix_now(), &missing);
        let path = write_new(&dir, &trace)?;
        Ok::<_, std::io::Error>((path, profiles, missing))
    })
    .await;
    match written {
        Ok(Ok((path, profiles, missing))) => Json(json!({
            "path": path,
            "engines": profiles.iter().map(|p| p.engine).collect::<Vec<_>>(),
            "engines_missing": missing,
            "steps": profiles.iter().map(|p| p.steps.len()).sum::<usize>(),
            "dropped_steps": profiles.iter().map(|p| p.dropped_steps).sum::<u64>(),
            "requests": profiles.iter().map(|p| p.requests.len()).sum::<usize>(),
        }))
        .into_response(),
        Ok(Err(e)) => ApiError::internal(format!(
            "cannot write the profile into the profile dir: {e}"
        ))
        .into_response(),
        Err(_) => ApiError::internal("stopping the profile failed").into_response(),
    }
}

/// Writes `trace` to a new file named after the current UTC time (a
/// suffix when a file of that second exists); returns its path.
fn write_new(dir: &Path, trace: &Value) -> std::io::Result<PathBuf> {
    // Made at start, but it may have been removed since.
    std::fs::create_dir_all(dir)?;
    let stamp = Utc::now().format("%Y%m%d-%H%M%S");
    for n in 0u32.. {
        let name = match n {
            0 => format!("profile-{stamp}.json"),
            n => format!("profile-{stamp}-{n}.json"),
        };
        let path = dir.join(name);
        let file = match std::fs::File::create_new(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let mut out = std::io::BufWriter::new(file);
        serde_json::to_writer(&mut out, trace)?;
        out.flush()?;
        return Ok(path);
    }
    unreachable!("u32 names run out")
}

/// One step's batch as JSON: `[{"request_id", "prefill_tokens",
/// "decode_tokens"}]` (the profile's step args and the console's steps).
pub fn batch_json(batch: &[StepSeq]) -> Value {
    Value::Array(
        batch
            .iter()
            .map(|q| {
                json!({
                    "request_id": &*q.request_id,
                    "prefill_tokens": q.prefill_tokens,
                    "decode_tokens": q.decode_tokens,
                })
            })
            .collect(),
    )
}

/// Microseconds, the unit of Trace Event Format timestamps, in steps of
/// 1/1024 µs: sums and differences of these are exact in f64, so a viewer
/// adding `ts + dur` finds a phase's end exactly at its step's (with decimal
/// fractions it can land one ulp past it, and DevTools then no longer nests
/// the phase in its step).
fn us(d: Duration) -> f64 {
    let ticks = (d.as_nanos() * 1024 + 500) / 1000;
    ticks as f64 / 1024.0
}

/// The Trace Event Format document of `profiles`.
pub fn trace_events(
    profiles: &[EngineProfile],
    started_unix: f64,
    stopped_unix: f64,
    missing: &[usize],
) -> Value {
    // Every timestamp is from the earliest instant in the profile, so none
    // is negative (requests may have arrived before the start).
    let origin = profiles
        .iter()
        .flat_map(|p| {
            let steps = p.steps.iter().map(|s| s.start);
            let arrivals = p.requests.iter().map(|r| r.timeline.arrival);
            std::iter::once(p.started).chain(steps).chain(arrivals)
        })
        .min()
        .unwrap_or_else(Instant::now);
    let ts = |t: Instant| us(t.saturating_duration_since(origin));
    let mut events = Vec::new();
    for p in profiles {
        let pid = p.engine + 1;
        events.push(json!({"ph": "M", "name": "process_name", "pid": pid,
            "args": {"name": format!("engine {}", p.engine)}}));
        events.push(json!({"ph": "M", "name": "process_sort_index", "pid": pid,
            "args": {"sort_index": p.engine}}));
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1,
            "args": {"name": "steps"}}),
        );
        for (i, step) in p.steps.iter().enumerate() {
            step_events(&mut events, pid, i, step, &ts);
        }
        for r in &p.requests {
            request_events(&mut events, pid, r, p.stopped, &ts);
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": concat!("inferscope ", env!("CARGO_PKG_VERSION")),
            "started_unix_s": started_unix,
            "stopped_unix_s": stopped_unix,
            "dropped_steps": profiles.iter().map(|p| p.dropped_steps).sum::<u64>(),
            "engines_missing": missing,
        },
    })
}

/// A step's slice with its batch, and its phases as child slices.
fn step_events(
    events: &mut Vec<Value>,
    pid: usize,
    index: usize,
    step: &StepRecord,
    ts: &impl Fn(Instant) -> f64,
) {
    let start = ts(step.start);
    let end = ts(step.start + step.wall());
    let prefill: u32 = step.batch.iter().map(|q| q.prefill_tokens).sum();
    let decode: u32 = step.batch.iter().map(|q| q.decode_tokens).sum();
    events.push(json!({
        "ph": "X", "name": "step", "cat": "step", "pid": pid, "tid": 1,
        "ts": start, "dur": end - start,
        "args": {
            "step": index,
            "batch": batch_json(&step.batch),
            "prefill_tokens": prefill,
            "decode_tokens": decode,
            "device_time_us": us(step.device_time),
            "host_time_us": us(step.host_time()),
        },
    }));
    // Each phase from the step's own instants, so the last one ends exactly
    // where the step does.
    let mut at = step.start;
    for (name, d) in [
        ("schedule", step.schedule),
        ("execute", step.execute),
        ("postprocess", step.postprocess),
    ] {
        let (from, to) = (ts(at), ts(at + d));
        events.push(
            json!({"ph": "X", "name": name, "cat": "step", "pid": pid, "tid": 1,
            "ts": from, "dur": to - from}),
        );
        at += d;
    }
}

/// A request's async track: the whole request, then queued, prefill (its
/// chunks inside) and decode (recomputes after a preemption inside);
/// preemptions as instants on the engine's step track. A phase still open
/// at the stop ends there.
fn request_events(
    events: &mut Vec<Value>,
    pid: usize,
    r: &RequestTrace,
    stopped: Instant,
    ts: &impl Fn(Instant) -> f64,
) {
    let t = &r.timeline;
    let id = &*r.request_id;
    let end = t.finished.unwrap_or(stopped);
    let mut span = |ph: &str, name: &str, at: Instant, args: Value| {
        events.push(
            json!({"ph": ph, "cat": "request", "name": name, "id": id, "pid": pid,
            "ts": ts(at), "args": args}),
        );
    };
    span(
        "b",
        id,
        t.arrival,
        json!({"request_id": id, "finished": t.finished.is_some(),
            "preemptions": t.preemptions.len()}),
    );
    let scheduled = t.first_scheduled.unwrap_or(end);
    span("b", "queued", t.arrival, json!({"request_id": id}));
    span("e", "queued", scheduled, json!({}));
    let mut chunks = t.prefill_chunks.iter().peekable();
    let mut phase = |name: &str,
                     from: Instant,
                     to: Instant,
                     span: &mut dyn FnMut(&str, &str, Instant, Value)| {
        span("b", name, from, json!({"request_id": id}));
        while let Some(c) = chunks.next_if(|c| c.end <= to) {
            let chunk = if name == "prefill" {
                "prefill chunk"
            } else {
                "recompute"
            };
            span(
                "b",
                chunk,
                c.start,
                json!({"request_id": id, "tokens": c.num_tokens}),
            );
            span("e", chunk, c.end, json!({}));
        }
        span("e", name, to, json!({}));
    };
    if let Some(scheduled) = t.first_scheduled {
        phase(
            "prefill",
            scheduled,
            t.first_token.unwrap_or(end),
            &mut span,
        );
    }
    if let Some(first) = t.first_token {
        phase("decode", first, t.last_token.unwrap_or(end), &mut span);
    }
    span("e", id, end, json!({}));
    for &p in &t.preemptions {
        events.push(
            json!({"ph": "i", "s": "t", "cat": "request", "name": "preempted",
            "pid": pid, "tid": 1, "ts": ts(p), "args": {"request_id": id}}),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferscope_engine::{PrefillChunk, RequestTimeline};

    fn ms(base: Instant, n: u64) -> Instant {
        base + Duration::from_millis(n)
    }

    /// Steps of odd nanosecond lengths, far from the origin: each phase a
    /// viewer reads as `ts + dur` ends no later than its step (DevTools
    /// un-nests one that ends an ulp past it), and the last ends exactly there.
    #[test]
    fn phases_end_within_their_step_in_f64() {
        let origin = Instant::now();
        let steps: Vec<StepRecord> = (0..500u64)
            .map(|i| StepRecord {
                start: origin + Duration::from_nanos(3_600_000_000_123 + i * 7_654_321),
                schedule: Duration::from_nanos(100_003 + i * 17),
                execute: Duration::from_nanos(2_200_011 + i * 31),
                postprocess: Duration::from_nanos(45_007 + i * 13),
                device_time: Duration::from_nanos(2_000_000),
                batch: vec![],
            })
            .collect();
        let profile = EngineProfile {
            engine: 0,
            started: origin,
            stopped: origin,
            steps,
            dropped_steps: 0,
            requests: vec![],
        };
        let trace = trace_events(&[profile], 0.0, 0.0, &[]);
        let slices: Vec<(&str, f64, f64)> = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                let ts = e["ts"].as_f64().unwrap();
                (
                    e["name"].as_str().unwrap(),
                    ts,
                    ts + e["dur"].as_f64().unwrap(),
                )
            })
            .collect();
        for step in slices.chunks(4) {
            let (name, begin, end) = step[0];
            assert_eq!(name, "step");
            for &(phase, b, e) in &step[1..] {
                assert!(
                    b >= begin && e <= end,
                    "{phase} [{b}, {e}] outside [{begin}, {end}]"
                );
            }
            assert_eq!(step[3].2, end, "postprocess ends where its step does");
        }
    }

    /// A request preempted while decoding (its recompute nests in decode)
    /// and one still prefilling at the stop: each request's `b`/`e` events
    /// nest as a stack, as viewers require, the open phases end at the stop,
    /// and the preemption is an instant on the engine's step thread.
    #[test]
    fn request_tracks_nest_and_end_at_the_stop() {
        let t = Instant::now();
        let chunk = |a, b, n| PrefillChunk {
            start: ms(t, a),
            end: ms(t, b),
            num_tokens: n,
        };
        let preempted = RequestTimeline {
            arrival: t,
            first_scheduled: Some(ms(t, 2)),
            first_token: Some(ms(t, 6)),
            last_token: Some(ms(t, 20)),
            finished: Some(ms(t, 20)),
            prefill_chunks: vec![chunk(2, 4, 32), chunk(4, 6, 8), chunk(12, 14, 45)],
            preemptions: vec![ms(t, 10)],
        };
        let open = RequestTimeline {
            arrival: ms(t, 15),
            first_scheduled: Some(ms(t, 16)),
            first_token: None,
            last_token: None,
            finished: None,
            prefill_chunks: vec![chunk(16, 18, 32)],
            preemptions: vec![],
        };
        let profile = EngineProfile {
            engine: 3,
            started: t,
            stopped: ms(t, 25),
            steps: vec![],
            dropped_steps: 0,
            requests: vec![
                RequestTrace {
                    request_id: "a-1".into(),
                    timeline: preempted,
                },
                RequestTrace {
                    request_id: "b-2".into(),
                    timeline: open,
                },
            ],
        };
        let trace = trace_events(&[profile], 0.0, 0.0, &[]);
        let events = trace["traceEvents"].as_array().unwrap();
        let mut stacks: std::collections::HashMap<&str, Vec<(&str, f64)>> = Default::default();
        let mut closed = Vec::new();
        for e in events
            .iter()
            .filter(|e| e["cat"] == "request" && e["ph"] != "i")
        {
            let id = e["id"].as_str().unwrap();
            let (name, ts) = (e["name"].as_str().unwrap(), e["ts"].as_f64().unwrap());
            let stack = stacks.entry(id).or_default();
            if e["ph"] == "b" {
                if let Some(&(_, parent)) = stack.last() {
                    assert!(ts >= parent, "{name} starts before its parent");
                }
                stack.push((name, ts));
            } else {
                let (open, begin) = stack.pop().expect("an end without a begin");
                assert_eq!(open, name, "{id}: ends must close the innermost slice");
                assert!(ts >= begin);
                closed.push((id, name, begin / 1e3, ts / 1e3));
            }
        }
        assert!(stacks.values().all(Vec::is_empty), "every slice closed");
        let span = |id: &str, name: &str| {
            closed
                .iter()
                .filter(|c| c.0 == id && c.1 == name)
                .map(|c| (c.2, c.3))
                .collect::<Vec<_>>()
        };
        assert_eq!(span("a-1", "decode"), [(6.0, 20.0)]);
        assert_eq!(span("a-1", "recompute"), [(12.0, 14.0)], "inside decode");
        assert_eq!(span("a-1", "prefill chunk"), [(2.0, 4.0), (4.0, 6.0)]);
        assert_eq!(
            span("b-2", "prefill"),
            [(16.0, 25.0)],
            "open: ends at the stop"
        );
        assert_eq!(span("b-2", "b-2"), [(15.0, 25.0)]);
        let preemptions: Vec<&Value> = events.iter().filter(|e| e["ph"] == "i").collect();
        assert_eq!(preemptions.len(), 1);
        assert_eq!(preemptions[0]["args"]["request_id"], "a-1");
        assert_eq!(preemptions[0]["ts"], 10_000.0);
        assert_eq!(preemptions[0]["pid"], 4);
    }
}
