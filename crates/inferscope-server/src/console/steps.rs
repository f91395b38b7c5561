//! The console's engine-step timeline (`GET /console/api/steps`): the last
//! steps of each engine, from the engines' step rings
//! (`inferscope_engine::StepRing`, at most
//! [`STEP_RING_CAPACITY`](inferscope_engine::step_trace::STEP_RING_CAPACITY)
//! steps each).
//!
//! The rings record only while a page reads them: the first read turns them
//! on, and a task turns them off again, freeing them, once no read came for
//! [`IDLE_OFF`]. Until then an engine pays nothing but one relaxed load per
//! step.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use inferscope_engine::StepRecord;
use inferscope_engine::step_trace::STEP_RING_CAPACITY;
use serde_json::{Value, json};

use super::Console;
use crate::error::ApiError;
use crate::profile::batch_json;
use crate::state::AppState;

/// The rings stop recording when no page has read them for this long.
pub const IDLE_OFF: Duration = Duration::from_secs(10);

/// The route's state.
struct Steps {
    console: Arc<Console>,
    state: Arc<AppState>,
    /// Timestamps are microseconds from here (monotonic).
    epoch: Instant,
    epoch_unix: f64,
    /// The last read; `None` while the rings are off.
    last_read: Mutex<Option<Instant>>,
}

/// The step route, behind the console's key.
pub fn routes<S: Clone + Send + Sync + 'static>(
    console: &Arc<Console>,
    state: Arc<AppState>,
) -> Router<S> {
    let epoch_unix = inferscope_console::history::unix_now();
    let steps = Arc::new(Steps {
        console: Arc::clone(console),
        state,
        epoch: Instant::now(),
        epoch_unix,
        last_read: Mutex::new(None),
    });
    Router::new()
        .route("/console/api/steps", get(steps_route))
        .with_state(steps)
}

impl Steps {
    /// Notes a read; the first turns the rings on and starts the task that
    /// turns them off when the reads stop.
    fn watch(self: &Arc<Self>) {
        let mut last = self
            .last_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let was_off = last.is_none();
        *last = Some(Instant::now());
        if !was_off {
            return;
        }
        self.set_rings(true);
        let steps = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let mut last = steps
                    .last_read
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if last.is_none_or(|t| t.elapsed() >= IDLE_OFF) {
                    *last = None;
                    steps.set_rings(false);
                    return;
                }
            }
        });
    }

    fn set_rings(&self, on: bool) {
        for e in self.state.coordinator.engines() {
            e.step_ring().set_enabled(on);
        }
    }

    fn us(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_micros() as u64
    }

    /// One step as the route gives it.
    fn step(&self, s: &StepRecord) -> Value {
        let us = |d: Duration| d.as_micros() as u64;
        json!({
            "t_us": self.us(s.start),
            "dur_us": us(s.wall()),
            "schedule_us": us(s.schedule),
            "execute_us": us(s.execute),
            "postprocess_us": us(s.postprocess),
            "device_us": us(s.device_time),
            "host_us": us(s.host_time()),
            "batch": batch_json(&s.batch),
        })
    }
}

/// `?since_us=T`: only the steps that started after `T`.
#[derive(Debug, serde::Deserialize)]
struct StepsQuery {
    since_us: Option<u64>,
}

async fn steps_route(
    State(s): State<Arc<Steps>>,
    Query(q): Query<StepsQuery>,
    headers: HeaderMap,
) -> Response {
    if !s.console.authorized(&headers) {
        return ApiError::unauthorized().into_response();
    }
    s.watch();
    let since = q.since_us.map(|us| s.epoch + Duration::from_micros(us));
    let engines: Vec<Value> = s
        .state
        .coordinator
        .engines()
        .map(|e| {
            let steps: Vec<Value> = e
                .step_ring()
                .steps_since(since)
                .iter()
                .map(|st| s.step(st))
                .collect();
            json!({"engine": e.engine_index, "steps": steps})
        })
        .collect();
    let body = json!({
        "version": inferscope_console::api::FORMAT_VERSION,
        "now_us": s.us(Instant::now()),
        "epoch_unix_s": s.epoch_unix,
        "ring_capacity": STEP_RING_CAPACITY,
        "idle_off_seconds": IDLE_OFF.as_secs(),
        "engines": engines,
    });
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response()
}
