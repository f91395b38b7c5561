//! inferscope-console: the browser console (`GET /`, `/console`) and its
//! data routes (`/console/api/snapshot`, `/console/api/events`,
//! `/console/api/charts`; docs/console.md), served by `inferscope serve` and by `inferscope proxy`.
//!
//! The page is one HTML file with its CSS and script embedded in the binary:
//! nothing is fetched from elsewhere, nothing is built. Its data is the
//! server's own short history ([`history`]), sampled once a second by one
//! task from the metric handles, and the last finished requests from a
//! [`RecentSource`] (the server's request-log ring, the proxy's
//! [`RecentRing`]): the per-token path does no extra work for it.

pub mod api;
pub mod charts;
pub mod findings;
pub mod history;
pub mod recent;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use inferscope_metrics::StatLoggerManager;
use serde_json::{Value, json};
use tokio::sync::watch;

pub use findings::Diagnose;
use findings::Findings;
use history::{HISTORY_SECONDS, History, INTERVAL_SECONDS, Sample};
pub use recent::{RecentRing, RecentSource};

/// Whether a request may read the console's data (the API key, a tenant's
/// key, or anything when the server has no key).
pub type Authorize = Arc<dyn Fn(&HeaderMap) -> bool + Send + Sync>;

/// What the console serves: its panels differ between `serve` and `proxy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// `inferscope serve`: every panel, the engines' gauges and steps too.
    Engines,
    /// `inferscope proxy`: what the proxy measures from the client's side;
    /// the engine-only panels are absent, as are their metrics.
    Proxy,
}

/// The page: HTML with its style and script inlined once, at first use.
static PAGE: LazyLock<String> = LazyLock::new(|| {
    let palette: Vec<String> = inferscope_schema::palette::SERIES
        .iter()
        .map(|&c| inferscope_schema::palette::hex(c))
        .collect();
    include_str!("page.html")
        .replace("/*STYLE*/", include_str!("page.css"))
        .replace(
            "/*SCRIPT*/",
            &[include_str!("page.js"), include_str!("steps.js")]
                .concat()
                .replace(
                    "/*PALETTE*/[]",
                    &serde_json::to_string(&palette).unwrap_or_else(|_| "[]".into()),
                ),
        )
});

/// The console's state: the history, the recent requests, the API key.
pub struct Console {
    metrics: Arc<StatLoggerManager>,
    history: History,
    recent: Arc<dyn RecentSource>,
    authorize: Authorize,
    serving: Serving,
    model: String,
    /// The doctor's findings over the server's own `/metrics`, when the
    /// binary handed in its rules.
    findings: Option<Findings>,
    /// Bumped after each sample; the event streams wait on it.
    sampled: watch::Sender<u64>,
}

impl Console {
    /// A console over `metrics` and `recent`, whose data routes admit the
    /// requests `authorize` accepts, and whose findings `diagnose` computes
    /// (none without it). Sampling starts with [`Self::spawn_sampler`].
    pub fn new(
        metrics: Arc<StatLoggerManager>,
        recent: Arc<dyn RecentSource>,
        authorize: Authorize,
        serving: Serving,
        model: String,
        diagnose: Option<Diagnose>,
    ) -> Arc<Self> {
        Arc::new(Self {
            metrics,
            history: History::new(HISTORY_SECONDS),
            recent,
            authorize,
            serving,
            model,
            findings: diagnose.map(Findings::new),
            sampled: watch::channel(0).0,
        })
    }

    /// Takes one sample now and wakes the event streams.
    pub fn sample(&self) {
        self.history.push(Sample::take(&self.metrics));
        self.sampled.send_modify(|n| *n += 1);
    }

    /// Samples every [`INTERVAL_SECONDS`], and diagnoses every
    /// [`findings::EVERY_SECONDS`] when it has the rules, until the task is
    /// aborted.
    pub fn spawn_sampler(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let console = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(INTERVAL_SECONDS));
            // A late tick (a busy runtime) is skipped, not made up in a burst.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut diagnosis: Option<tokio::task::JoinHandle<()>> = None;
            let mut last_diagnosis: Option<std::time::Instant> = None;
            loop {
                tick.tick().await;
                console.sample();
                let due = last_diagnosis
                    .is_none_or(|at| at.elapsed() >= Duration::from_secs(findings::EVERY_SECONDS));
                // Rendering and parsing `/metrics` take milliseconds: off the
                // runtime, one at a time.
                if console.findings.is_some()
                    && due
                    && diagnosis.as_ref().is_none_or(|d| d.is_finished())
                {
                    last_diagnosis = Some(std::time::Instant::now());
                    let c = Arc::clone(&console);
                    diagnosis = Some(tokio::task::spawn_blocking(move || {
                        if let Some(f) = &c.findings {
                            f.update(&c.metrics, history::unix_now());
                        }
                    }));
                }
            }
        })
    }

    /// The snapshot route's body: everything kept so far.
    pub fn snapshot(&self) -> Value {
        let mut m = api::meta(
            &self.metrics,
            &self.model,
            self.serving,
            self.findings.is_some(),
        );
        // `null` before the first, or without the rules.
        let findings = self.findings.as_ref().map_or(Value::Null, Findings::latest);
        m.insert("findings".into(), findings);
        let samples: Vec<Value> = self.history.all().iter().map(|s| api::sample(s)).collect();
        m.insert("samples".into(), Value::Array(samples));
        m.insert("recent".into(), api::recent(self.recent.after(0)));
        Value::Object(m)
    }

    /// The charts route's body: the line charts of the history as SVG,
    /// with clock times `utc_offset` seconds east of UTC.
    pub fn charts(&self, utc_offset: i64) -> Value {
        let bounds: Vec<Vec<f64>> = inferscope_metrics::LATENCIES
            .iter()
            .map(|&l| self.metrics.latency_bounds(l))
            .collect();
        charts::render(&self.history.all(), &bounds, self.serving, utc_offset)
    }

    /// Whether `headers` may read the console's data.
    pub fn authorized(&self, headers: &HeaderMap) -> bool {
        (self.authorize)(headers)
    }

    /// The routes: the page (open) and the data (behind the API key).
    /// `/` is the page too when serving engines; a proxy leaves `/` to its
    /// upstream (llama.cpp serves its own page there).
    pub fn routes<S: Clone + Send + Sync + 'static>(self: &Arc<Self>) -> Router<S> {
        let router = match self.serving {
            Serving::Engines => Router::new().route("/", get(page)),
            Serving::Proxy => Router::new(),
        };
        router
            .route("/console", get(page))
            .route("/console/api/snapshot", get(snapshot))
            .route("/console/api/events", get(events))
            .route("/console/api/charts", get(charts))
            .with_state(Arc::clone(self))
    }
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE.as_str(),
    )
        .into_response()
}

async fn snapshot(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    if !c.authorized(&headers) {
        return unauthorized();
    }
    let body = c.snapshot();
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response()
}

/// The charts route's query: `utc_offset=SECONDS` east of UTC, the
/// reader's clock (default 0, UTC).
#[derive(Debug, serde::Deserialize)]
struct ChartsQuery {
    utc_offset: Option<i64>,
}

async fn charts(
    State(c): State<Arc<Console>>,
    Query(query): Query<ChartsQuery>,
    headers: HeaderMap,
) -> Response {
    if !c.authorized(&headers) {
        return unauthorized();
    }
    // Real offsets lie within a day; anything else is clamped, not trusted.
    let offset = query.utc_offset.unwrap_or(0).clamp(-86_400, 86_400);
    // Milliseconds of formatting (docs/console.md): off the runtime.
    match tokio::task::spawn_blocking(move || c.charts(offset)).await {
        Ok(body) => ([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The events route's query: `after=SEQ`, the last request the reader has.
#[derive(Debug, serde::Deserialize)]
struct EventsQuery {
    after: Option<u64>,
}

/// One SSE event per sample: the newest sample and the requests finished
/// since the previous event (the first event: those after `?after=SEQ`,
/// else those finished since the stream opened).
async fn events(
    State(c): State<Arc<Console>>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    if !c.authorized(&headers) {
        return unauthorized();
    }
    let rx = c.sampled.subscribe();
    let seen = match query.after {
        Some(seq) => seq,
        None => c.recent.after(0).last().map_or(0, |(seq, _)| *seq),
    };
    // The findings the reader has: those of the snapshot it took before.
    let findings_seen = c.findings.as_ref().map_or(0, Findings::number);
    let state = (c, rx, seen, findings_seen);
    let stream = futures::stream::unfold(state, |(c, mut rx, seen, findings_seen)| async move {
        // Ends when the console is gone (the server is shutting down).
        rx.changed().await.ok()?;
        let sample = c.history.latest()?;
        let recent = c.recent.after(seen);
        let seen = recent.last().map_or(seen, |(seq, _)| *seq);
        let mut data = json!({"sample": api::sample(&sample), "recent": api::recent(recent)});
        // New findings ride on the next sample's event, once.
        let mut number = findings_seen;
        if let Some((newer, findings)) = c.findings.as_ref().and_then(|f| f.newer_than(number)) {
            number = newer;
            data["findings"] = findings;
        }
        let event = Bytes::from(format!("event: sample\ndata: {data}\n\n"));
        Some((
            Ok::<_, std::convert::Infallible>(event),
            (c, rx, seen, number),
        ))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The 401 of a data route read without the key, in OpenAI's error shape
/// (as the API routes answer it).
pub fn unauthorized() -> Response {
    let body = json!({"error": {
        "message": "Invalid or missing API key: send `Authorization: Bearer <key>`.",
        "type": "authentication_error",
        "param": null,
        "code": 401,
    }});
    (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Works offline: nothing in the page is fetched from elsewhere, and
    /// every placeholder was filled (with the shared palette).
    #[test]
    fn the_page_is_self_contained() {
        let page = PAGE.as_str();
        for placeholder in ["/*STYLE*/", "/*SCRIPT*/", "/*PALETTE*/"] {
            assert!(!page.contains(placeholder), "{placeholder} left");
        }
        // The one URL is the SVG namespace, a name, not a fetch.
        let urls: Vec<&str> = page
            .match_indices("://")
            .map(|(i, _)| &page[i.saturating_sub(5)..(i + 30).min(page.len())])
            .filter(|u| !u.contains("://www.w3.org/2000/svg"))
            .collect();
        assert!(urls.is_empty(), "{urls:?}");
        // An empty icon, so the browser asks for no /favicon.ico.
        let page = page.replace(r#"<link rel="icon" href="data:,">"#, "");
        for fetcher in ["<link", "src=", "@import", "url("] {
            assert!(!page.contains(fetcher), "{fetcher}");
        }
        assert!(page.contains("const PALETTE = [\"#1f77b4\","), "palette");
        assert!(page.contains("body{font-family"), "style inlined");
    }
}
