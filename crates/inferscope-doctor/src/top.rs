//! `inferscope top`: a live terminal view of a server's `/metrics`.
//!
//! The model ([`TopModel`]) folds scrapes into a [`TopState`]; drawing is a
//! pure function of that state ([`render`]), so tests render recorded
//! metrics into ratatui's `TestBackend` and read the screen.
//!
//! The screen, top to bottom: engines now, token throughput, the history of
//! each engine (waiting requests, TTFT and ITL per interval) and finished
//! requests per interval by reason, then the figures over `--window` (the
//! busiest tenants among them, where the server has a `tenant` label). The
//! history panels take whatever height is left, so the view fills any
//! terminal.

pub mod history;

use crate::window::{Dist, Scrape, Window};
use clap::Args;
use history::{Quantiles, Tick, quantiles_text};
use inferscope_schema::names;
use inferscope_schema::scrape::LEGACY_TIME_PER_OUTPUT_TOKEN_SECONDS;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Sparkline, SparklineBar, Table};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Flags of `inferscope top`.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// The server: `http://HOST:PORT` (its `/metrics` is read) or the full metrics URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,

    /// Seconds between refreshes.
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration)]
    pub interval: Duration,

    /// Span of the latency quantiles and request rates.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    pub window: Duration,

    /// Metric namespace (`inferscope`, `vllm`, or `inferscope:` for servers
    /// that spelled names `inferscope:x`); detected from the metrics when absent.
    #[arg(long)]
    pub metrics_namespace: Option<String>,
}

/// Points kept for the throughput sparklines and the history panels.
pub const HISTORY: usize = 120;

/// One engine's row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineRow {
    /// The `engine` label.
    pub engine: String,
    /// Running requests now; `None` when the server does not export the gauge.
    pub running: Option<f64>,
    /// Waiting requests now; `None` when the server does not export the gauge.
    pub waiting: Option<f64>,
    /// KV-cache usage now, fraction.
    pub kv_usage: Option<f64>,
    /// Device utilisation over the window, fraction (inferscope only).
    pub device_utilisation: Option<f64>,
}

/// Tenants shown, the busiest by tokens.
pub const TOP_TENANTS: usize = 5;

/// One tenant's share of the window (from the `tenant` label).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRow {
    /// The `tenant` label (`other` holds the tenants past the server's bound).
    pub tenant: String,
    /// Prompt plus generated tokens per second over the window.
    pub tokens_per_s: f64,
    /// Its fraction of all tenants' tokens in the window.
    pub share: f64,
}

/// The tenants of the window's token counts (`tokens` by tenant label):
/// the busiest `n` by tokens (ties by name), idle tenants left out, and how
/// many active tenants did not make the cut.
pub fn top_tenants(tokens: &BTreeMap<String, f64>, secs: f64, n: usize) -> (Vec<TenantRow>, usize) {
    let total: f64 = tokens.values().filter(|v| **v > 0.0).sum();
    let mut active: Vec<(&String, f64)> = tokens
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .map(|(k, v)| (k, *v))
        .collect();
    // Stable sort over name order: equal counts stay by name.
    active.sort_by(|a, b| b.1.total_cmp(&a.1));
    let hidden = active.len().saturating_sub(n);
    let rows = active
        .into_iter()
        .take(n)
        .map(|(t, v)| TenantRow {
            tenant: t.clone(),
            tokens_per_s: v / secs.max(f64::EPSILON),
            share: v / total,
        })
        .collect();
    (rows, hidden)
}

/// Whether the last scrape worked.
#[derive(Debug, Clone, PartialEq)]
pub enum Connection {
    /// No scrape yet.
    Starting,
    /// The last scrape succeeded.
    Up,
    /// The last scrape failed; the view shows the last data it had.
    Down {
        /// Why.
        error: String,
        /// Consecutive failed scrapes.
        failures: u32,
    },
}

/// Everything the screen shows.
#[derive(Debug, Clone, PartialEq)]
pub struct TopState {
    /// Metrics URL.
    pub url: String,
    /// Namespace read.
    pub namespace: String,
    /// Connection state.
    pub connection: Connection,
    /// Seconds the latency and rate figures cover.
    pub window_s: f64,
    /// Per engine.
    pub engines: Vec<EngineRow>,
    /// Prompt tokens/s, oldest first.
    pub prompt_tps: VecDeque<f64>,
    /// Generated tokens/s, oldest first.
    pub generation_tps: VecDeque<f64>,
    /// Time to first token over the window.
    pub ttft: Option<Dist>,
    /// Inter-token latency over the window.
    pub itl: Option<Dist>,
    /// Finished requests per second by `finished_reason`, plus `rejected`.
    pub request_rates: BTreeMap<String, f64>,
    /// HTTP responses per second by status class.
    pub http_rates: BTreeMap<String, f64>,
    /// Mean device utilisation over engines (inferscope only).
    pub device_utilisation: Option<f64>,
    /// Time to first token over the window, as buckets.
    pub ttft_window: Option<Quantiles>,
    /// Inter-token latency over the window, as buckets.
    pub itl_window: Option<Quantiles>,
    /// One entry per refresh (interval or outage), oldest first.
    pub history: VecDeque<Tick>,
    /// The busiest tenants over the window; `None` when the server has no
    /// `tenant` label (vLLM, an older inferscope).
    pub tenants: Option<Vec<TenantRow>>,
    /// Active tenants over the window beyond [`TopState::tenants`].
    pub tenants_hidden: usize,
}

impl TopState {
    /// An empty state for `url`.
    pub fn new(url: &str) -> Self {
        TopState {
            url: url.to_string(),
            namespace: String::new(),
            connection: Connection::Starting,
            window_s: 0.0,
            engines: Vec::new(),
            prompt_tps: VecDeque::new(),
            generation_tps: VecDeque::new(),
            ttft: None,
            itl: None,
            request_rates: BTreeMap::new(),
            http_rates: BTreeMap::new(),
            device_utilisation: None,
            ttft_window: None,
            itl_window: None,
            history: VecDeque::new(),
            tenants: None,
            tenants_hidden: 0,
        }
    }
}

/// Folds scrapes into the state: keeps the scrapes of the last window.
#[derive(Debug)]
pub struct TopModel {
    /// What is drawn.
    pub state: TopState,
    window: f64,
    namespace: Option<String>,
    recent: VecDeque<(f64, Scrape)>,
}

fn push_capped<T>(q: &mut VecDeque<T>, v: T) {
    q.push_back(v);
    while q.len() > HISTORY {
        q.pop_front();
    }
}

impl TopModel {
    /// A model for `url` with quantiles and rates over `window` seconds.
    pub fn new(url: &str, window: f64, namespace: Option<String>) -> Self {
        TopModel {
            state: TopState::new(url),
            window,
            namespace,
            recent: VecDeque::new(),
        }
    }

    /// Adds a scrape taken at `at` seconds (any monotonic origin).
    pub fn on_scrape(&mut self, at: f64, scrape: Scrape) {
        self.state.connection = Connection::Up;
        self.recent.push_back((at, scrape));
        // Keep one scrape at or before the window start, so deltas span it.
        while self.recent.len() > 2 && self.recent[1].0 <= at - self.window {
            self.recent.pop_front();
        }
        let ns = self.namespace.as_deref();
        let n = self.recent.len();
        let scrapes: Vec<(f64, Scrape)> = self.recent.iter().cloned().collect();
        let window = Window::new(scrapes, ns);
        let whole = window.summary();
        self.state.namespace = whole.namespace.clone();
        self.state.window_s = whole.window_s;
        self.state.engines = whole
            .engines
            .iter()
            .map(|e| EngineRow {
                engine: e.engine.clone(),
                running: e.running_now,
                waiting: e.waiting_now,
                kv_usage: e.kv_usage_now,
                device_utilisation: e.device_utilisation,
            })
            .collect();
        let ids: Vec<String> = whole.engines.iter().map(|e| e.engine.clone()).collect();
        // The interval since the previous scrape of this run of the server
        // (none right after start or an outage: `recent` was cleared).
        if let Some((_, after)) = self.recent.back() {
            let before = n
                .checked_sub(2)
                .and_then(|i| self.recent.get(i))
                .map(|r| &r.1);
            let tick = Tick::between(before, after, &whole.namespace, &ids);
            push_capped(&mut self.state.history, tick);
        }
        if n < 2 {
            return;
        }
        // Sparklines: the rate between the last two scrapes.
        let last_two: Vec<(f64, Scrape)> = self.recent.iter().skip(n - 2).cloned().collect();
        let latest = Window::new(last_two, ns).summary();
        if let Some(t) = self.state.history.back_mut() {
            t.prompt_tps = latest.prompt_tokens_per_s;
            t.generation_tps = latest.generation_tokens_per_s;
        }
        push_capped(
            &mut self.state.prompt_tps,
            latest.prompt_tokens_per_s.unwrap_or(0.0),
        );
        push_capped(
            &mut self.state.generation_tps,
            latest.generation_tokens_per_s.unwrap_or(0.0),
        );
        self.state.ttft = whole.ttft;
        self.state.itl = whole.itl;
        // A mean needs `_sum`: without it (a partial exposition) none is shown.
        let quantiles = |base: &str| {
            window.hist(base, &[]).map(|h| Quantiles {
                mean: Quantiles::of(&h).mean.filter(|_| window.has_sum(base)),
                ..Quantiles::of(&h)
            })
        };
        self.state.ttft_window = quantiles(names::TIME_TO_FIRST_TOKEN_SECONDS);
        self.state.itl_window = quantiles(names::INTER_TOKEN_LATENCY_SECONDS)
            .or_else(|| quantiles(LEGACY_TIME_PER_OUTPUT_TOKEN_SECONDS));
        let secs = whole.window_s.max(f64::EPSILON);
        let mut rates: BTreeMap<String, f64> = whole
            .finished_by_reason
            .iter()
            .map(|(k, v)| (k.clone(), v / secs))
            .collect();
        if let Some(r) = whole.admission_rejections {
            rates.insert("rejected".into(), r / secs);
        }
        self.state.request_rates = rates;
        self.state.http_rates = whole
            .http_by_status
            .iter()
            .map(|(k, v)| (k.clone(), v / secs))
            .collect();
        self.state.device_utilisation = whole.device_utilisation;
        // An empty map: no series carries the label at all.
        (self.state.tenants, self.state.tenants_hidden) = if whole.tenant_tokens.is_empty() {
            (None, 0)
        } else {
            let (rows, hidden) = top_tenants(&whole.tenant_tokens, secs, TOP_TENANTS);
            (Some(rows), hidden)
        };
    }

    /// Records a failed scrape. The old figures stay on screen; the scrapes
    /// are dropped so that no delta spans the outage (the server may have
    /// restarted with its counters at zero).
    pub fn on_error(&mut self, error: String) {
        let failures = match &self.state.connection {
            Connection::Down { failures, .. } => failures + 1,
            _ => 1,
        };
        self.state.connection = Connection::Down { error, failures };
        self.recent.clear();
        // The outage takes its place in the history, so the panels show it.
        push_capped(&mut self.state.history, Tick::outage());
    }
}

/// A text bar of `width` cells for a fraction 0..1.
pub fn bar(frac: f64, width: usize) -> String {
    let f = if frac.is_finite() {
        frac.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let filled = (f * width as f64).round() as usize;
    format!(
        "{}{} {:>5.1}%",
        "█".repeat(filled),
        "░".repeat(width - filled),
        f * 100.0
    )
}

fn rates_line(label: &str, rates: &BTreeMap<String, f64>) -> String {
    if rates.is_empty() {
        return format!("{label}: –");
    }
    let parts: Vec<String> = rates.iter().map(|(k, v)| format!("{k} {v:.2}/s")).collect();
    format!("{label}: {}", parts.join("  "))
}

/// `tenants (tok/s): team-a 1200 (80%)  team-b 300 (20%)  +2 more`; none
/// for a server without the `tenant` label, whose screen keeps the row for
/// the history panels (it matters on 24-row terminals).
fn tenants_line(s: &TopState) -> Option<String> {
    let rows = s.tenants.as_ref()?;
    if rows.is_empty() {
        return Some("tenants: none active".into());
    }
    let mut parts: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {:.0} ({:.0}%)",
                r.tenant,
                r.tokens_per_s,
                r.share * 100.0
            )
        })
        .collect();
    if s.tenants_hidden > 0 {
        parts.push(format!("+{} more", s.tenants_hidden));
    }
    Some(format!("tenants (tok/s): {}", parts.join("  ")))
}

/// `TTFT p50 ≤ 100 ms  p99 in 100–250 ms  mean 84.2 ms  n=62`: bucket
/// bounds for the quantiles, the exact mean beside them.
fn latency_line(label: &str, q: Option<&Quantiles>) -> String {
    match q {
        Some(q) if q.count > 0.0 => format!(
            "{label} {}  mean {}  n={:.0}",
            quantiles_text(Some(q)),
            q.mean.map_or_else(|| "–".into(), history::secs),
            q.count
        ),
        Some(_) => format!("{label} p50 –  p99 –  (no observations)"),
        None => format!("{label} p50 –  p99 –  (not exported)"),
    }
}

/// Draws the whole screen from `s`.
pub fn render(f: &mut Frame, s: &TopState) {
    let area = f.area();
    // Taller terminals get taller throughput sparklines; the history panels
    // take the rest, so no row is left empty.
    let tput_height = match area.height {
        40.. => 6,
        30.. => 5,
        _ => 3,
    };
    let [head, engines, tput, hist, lat] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(s.engines.len().max(1) as u16 + 3),
        Constraint::Length(tput_height),
        Constraint::Fill(1),
        Constraint::Length(7 + u16::from(s.tenants.is_some())),
    ])
    .areas(area);
    let (conn, style) = match &s.connection {
        Connection::Starting => ("connecting…".to_string(), Style::default()),
        Connection::Up => ("up".to_string(), Style::default().fg(Color::Green)),
        Connection::Down { error, failures } => (
            format!("UNREACHABLE ({failures} failed scrapes: {error}); showing last data"),
            Style::default().fg(Color::Red),
        ),
    };
    f.render_widget(
        Paragraph::new(Line::styled(
            format!(
                "inferscope top — {} [{}] — {conn} — q quits",
                s.url,
                if s.namespace.is_empty() {
                    "?"
                } else {
                    &s.namespace
                }
            ),
            style,
        )),
        head,
    );
    let rows = s.engines.iter().map(|e| {
        Row::new(vec![
            engine_name(&e.engine).to_string(),
            count_or_na(e.running),
            count_or_na(e.waiting),
            e.kv_usage.map_or_else(|| "n/a".to_string(), |k| bar(k, 20)),
            e.device_utilisation
                .map_or_else(|| "n/a".to_string(), |u| bar(u, 10)),
        ])
    });
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(8),
                Constraint::Length(9),
                Constraint::Length(9),
                Constraint::Length(28),
                Constraint::Min(18),
            ],
        )
        .header(
            Row::new(vec![
                "engine",
                "running",
                "waiting",
                "KV cache",
                "device busy",
            ])
            .style(Style::default().fg(Color::Yellow)),
        )
        .block(Block::default().borders(Borders::ALL).title(" engines ")),
        engines,
    );
    let [p, g] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(tput);
    spark(f, p, "prompt", &s.prompt_tps, s, |t| t.prompt_tps);
    spark(f, g, "generation", &s.generation_tps, s, |t| {
        t.generation_tps
    });
    render_history(f, hist, s);
    let mut lines = vec![
        Line::raw(latency_line("TTFT", s.ttft_window.as_ref())),
        Line::raw(latency_line("ITL ", s.itl_window.as_ref())),
        Line::raw(rates_line("requests", &s.request_rates)),
        Line::raw(rates_line("http", &s.http_rates)),
    ];
    lines.extend(tenants_line(s).map(Line::raw));
    lines.push(Line::raw(format!(
        "device utilisation: {}",
        s.device_utilisation
            .map_or_else(|| "n/a (not exported)".to_string(), |u| bar(u, 20))
    )));
    f.render_widget(
        Paragraph::new(lines).block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!(" latency and requests, last {:.0} s ", s.window_s)),
        ),
        lat,
    );
}

/// A gauge of requests, or `n/a` when the server does not export it.
fn count_or_na(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.0}"))
}

fn engine_name(e: &str) -> &str {
    if e.is_empty() { "-" } else { e }
}

/// Marks a refresh whose scrape failed, over the whole height of a sparkline.
const OUTAGE: &str = "×";

/// The four history panels: waiting and TTFT above, ITL and finished below.
fn render_history(f: &mut Frame, area: Rect, s: &TopState) {
    let [upper, lower] =
        Layout::vertical([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let halves = [Constraint::Percentage(50), Constraint::Percentage(50)];
    let [waiting, ttft] = Layout::horizontal(halves).areas(upper);
    let [itl, finished] = Layout::horizontal(halves).areas(lower);
    // Engines of the whole history, numeric ranks in numeric order.
    let mut ids: Vec<&String> = s
        .history
        .iter()
        .flat_map(|t| t.engines.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    ids.sort_by_key(|e| (e.parse::<u64>().unwrap_or(u64::MAX), *e));
    let legend = if s.history.iter().any(|t| t.outage) {
        format!(" ({OUTAGE} = unreachable) ")
    } else {
        String::new()
    };
    waiting_panel(f, waiting, s, &ids, &legend);
    latency_panel(f, ttft, s, &ids, "TTFT", &legend, |t| t.ttft.as_ref());
    latency_panel(f, itl, s, &ids, "ITL", &legend, |t| t.itl.as_ref());
    finished_panel(f, finished, s, &legend);
}

/// A bordered panel; returns the areas of the `n` items that fit inside
/// (one row at least each) and how many did not fit.
fn panel(f: &mut Frame, area: Rect, title: String, n: usize) -> (Vec<Rect>, usize) {
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let shown = n.min(inner.height as usize);
    let areas = Layout::vertical(vec![Constraint::Fill(1); shown])
        .split(inner)
        .to_vec();
    (areas, n - shown)
}

/// The newest values of `data` that fit in `width` columns.
fn newest<T: Copy>(data: &[T], width: u16) -> &[T] {
    &data[data.len().saturating_sub(width as usize)..]
}

/// A label above a sparkline, or a short label beside it when there is
/// one row only.
fn labelled_spark(
    f: &mut Frame,
    area: Rect,
    (long, short): (Line, Line),
    data: &[Option<u64>],
    max: u64,
    color: Color,
) {
    let (label, l, sp) = if area.height >= 2 {
        let [l, sp] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(area);
        (long, l, sp)
    } else {
        let w = (short.width() as u16 + 1).min(area.width * 3 / 5);
        let [l, sp] = Layout::horizontal([Constraint::Length(w), Constraint::Min(1)]).areas(area);
        (short, l, sp)
    };
    f.render_widget(Paragraph::new(label), l);
    f.render_widget(
        Sparkline::default()
            .data(
                newest(data, sp.width)
                    .iter()
                    .copied()
                    .map(SparklineBar::from),
            )
            .max(max.max(1))
            .style(Style::default().fg(color))
            .absent_value_symbol(OUTAGE)
            .absent_value_style(Style::default().fg(Color::Red)),
        sp,
    );
}

/// `engine 0: …` and the short form `e0 …`.
fn engine_labels(e: &str, long: String, short: String) -> (Line<'static>, Line<'static>) {
    let yellow = Style::default().fg(Color::Yellow);
    (
        Line::from(vec![
            Span::styled(format!("engine {}", engine_name(e)), yellow),
            Span::raw(format!(": {long}")),
        ]),
        Line::from(vec![
            Span::styled(format!("e{}", engine_name(e)), yellow),
            Span::raw(format!(" {short}")),
        ]),
    )
}

fn waiting_panel(f: &mut Frame, area: Rect, s: &TopState, ids: &[&String], legend: &str) {
    let (areas, hidden) = panel(
        f,
        area,
        format!(" waiting requests per engine{legend}"),
        ids.len(),
    );
    let series: Vec<Vec<Option<u64>>> = ids
        .iter()
        .map(|e| {
            s.history
                .iter()
                .map(|t| {
                    if t.outage {
                        return None;
                    }
                    let w = t.engines.get(*e).and_then(|x| x.waiting).unwrap_or(0.0);
                    Some(w.max(0.0).round() as u64)
                })
                .collect()
        })
        .collect();
    // One scale for all engines, so their heights compare.
    let max = series
        .iter()
        .flatten()
        .flatten()
        .copied()
        .max()
        .unwrap_or(0);
    for ((e, data), a) in ids.iter().zip(&series).zip(areas) {
        let now = data.iter().rev().flatten().next().copied().unwrap_or(0);
        let peak = data.iter().flatten().copied().max().unwrap_or(0);
        // vLLM's published samples do not always carry the gauge: say so
        // rather than draw zeros.
        let exported = s
            .history
            .iter()
            .any(|t| t.engines.get(*e).is_some_and(|x| x.waiting.is_some()));
        let label = if exported {
            engine_labels(
                e,
                format!("{now} now, peak {peak}"),
                format!("{now} (peak {peak})"),
            )
        } else {
            engine_labels(e, "not exported".into(), "n/a".into())
        };
        labelled_spark(f, a, label, data, max, Color::Magenta);
    }
    more(f, area, hidden);
}

fn latency_panel(
    f: &mut Frame,
    area: Rect,
    s: &TopState,
    ids: &[&String],
    what: &str,
    legend: &str,
    pick: impl Fn(&history::EngineTick) -> Option<&Quantiles>,
) {
    let (areas, hidden) = panel(
        f,
        area,
        format!(" {what} per interval, bar = p99 bucket{legend}"),
        ids.len(),
    );
    for (e, a) in ids.iter().zip(areas) {
        let mut latest: Option<&Quantiles> = None;
        let mut buckets = 0;
        // Bar height is the p99 bucket's position: the buckets grow about
        // geometrically, so this reads like a log scale, and it shows no
        // more precision than the buckets have.
        let data: Vec<Option<u64>> = s
            .history
            .iter()
            .map(|t| {
                if t.outage {
                    return None;
                }
                let q = t.engines.get(*e).and_then(&pick);
                let p99 = q.filter(|q| q.count > 0.0).and_then(|q| {
                    latest = Some(q);
                    q.p99
                });
                Some(p99.map_or(0, |b| {
                    buckets = buckets.max(b.buckets);
                    b.index as u64 + 1
                }))
            })
            .collect();
        let p99 = latest
            .and_then(|q| q.p99)
            .map_or_else(|| "–".into(), |b| history::bucket_text(&b));
        let label = engine_labels(e, quantiles_text(latest), format!("p99 {p99}"));
        labelled_spark(f, a, label, &data, buckets as u64, Color::Cyan);
    }
    more(f, area, hidden);
}

/// Reasons always shown, in this order; others follow when seen.
const REASONS: [(&str, Color); 4] = [
    ("stop", Color::Green),
    ("length", Color::Cyan),
    ("abort", Color::Yellow),
    ("error", Color::Red),
];

fn finished_panel(f: &mut Frame, area: Rect, s: &TopState, legend: &str) {
    let mut reasons: Vec<(&str, Color)> = REASONS.to_vec();
    for t in &s.history {
        for r in t.finished.keys() {
            if !reasons.iter().any(|(x, _)| x == r) {
                reasons.push((r.as_str(), Color::White));
            }
        }
    }
    let (areas, hidden) = panel(
        f,
        area,
        format!(" finished per interval by reason{legend}"),
        reasons.len(),
    );
    let series: Vec<Vec<Option<u64>>> = reasons
        .iter()
        .map(|(r, _)| {
            s.history
                .iter()
                .map(|t| {
                    (!t.outage).then(|| t.finished.get(*r).map_or(0, |v| v.max(0.0).round() as u64))
                })
                .collect()
        })
        .collect();
    let max = series
        .iter()
        .flatten()
        .flatten()
        .copied()
        .max()
        .unwrap_or(0);
    for (((r, color), data), a) in reasons.iter().zip(&series).zip(areas) {
        let last = data.iter().rev().flatten().next().copied().unwrap_or(0);
        let total: u64 = data.iter().flatten().sum();
        let name = Span::styled(r.to_string(), Style::default().fg(*color));
        let label = (
            Line::from(vec![
                name.clone(),
                Span::raw(format!(": {last} last, {total} shown")),
            ]),
            Line::from(vec![name, Span::raw(format!(" {last}"))]),
        );
        labelled_spark(f, a, label, data, max, *color);
    }
    more(f, area, hidden);
}

/// Says on the panel's bottom border how many items did not fit.
fn more(f: &mut Frame, area: Rect, hidden: usize) {
    if hidden == 0 || area.height < 2 || area.width < 12 {
        return;
    }
    let text = format!(" +{hidden} more ");
    let w = (text.chars().count() as u16).min(area.width - 2);
    f.render_widget(
        Paragraph::new(text),
        Rect::new(area.x + 1, area.y + area.height - 1, w, 1),
    );
}

/// Token throughput: the latest rate in the title, the history below with
/// the outages marked like the history panels.
fn spark(
    f: &mut Frame,
    area: Rect,
    what: &str,
    rates: &VecDeque<f64>,
    s: &TopState,
    pick: impl Fn(&Tick) -> Option<f64>,
) {
    let now = rates.back().copied().unwrap_or(0.0);
    let title = if s.history.iter().any(|t| pick(t).is_some()) {
        format!(" {what} {now:.0} tok/s ")
    } else {
        format!(" {what}: not exported ")
    };
    // Sparklines take integers; the newest points are the rightmost that fit.
    let width = area.width.saturating_sub(2) as usize;
    let pts: Vec<Option<u64>> = s
        .history
        .iter()
        .skip(s.history.len().saturating_sub(width))
        .map(|t| (!t.outage).then(|| pick(t).map_or(0, |v| v.max(0.0).round() as u64)))
        .collect();
    f.render_widget(
        Sparkline::default()
            .block(Block::default().borders(Borders::ALL).title(title))
            .data(pts.into_iter().map(SparklineBar::from))
            .style(Style::default().fg(Color::Cyan))
            .absent_value_symbol(OUTAGE)
            .absent_value_style(Style::default().fg(Color::Red)),
        area,
    );
}

/// Runs `top` until `q`, Esc or Ctrl-C.
pub async fn run_top(args: TopArgs) -> anyhow::Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    let url = crate::metrics_url(&args.url);
    let mut model = TopModel::new(
        &url,
        args.window.as_secs_f64(),
        args.metrics_namespace.clone(),
    );
    let mut terminal = ratatui::try_init()?;
    // Keys are read on their own thread: crossterm's reads block.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        loop {
            match event::poll(Duration::from_millis(200)) {
                Ok(true) => match event::read() {
                    Ok(ev) => {
                        if tx.send(ev).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                },
                Ok(false) => {
                    if tx.is_closed() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    // Scrapes run on their own task, so a slow or hung server never delays `q`.
    let (scrape_tx, mut scrapes) = tokio::sync::mpsc::channel(4);
    let scraper = {
        // A zero period would make `interval` panic; faster than 10 Hz is pointless.
        let (url, interval) = (url.clone(), args.interval.max(Duration::from_millis(100)));
        tokio::spawn(async move {
            let start = Instant::now();
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let r = crate::fetch(&url).await.map_err(|e| format!("{e:#}"));
                if scrape_tx
                    .send((start.elapsed().as_secs_f64(), r))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
    };
    let result: anyhow::Result<()> = async {
        terminal.draw(|f| render(f, &model.state))?;
        loop {
            tokio::select! {
                got = scrapes.recv() => match got {
                    Some((at, Ok(s))) => model.on_scrape(at, s),
                    Some((_, Err(e))) => model.on_error(e),
                    None => return Ok(()),
                },
                ev = rx.recv() => match ev {
                    Some(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                        let ctrl_c = k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL);
                        if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                            return Ok(());
                        }
                    }
                    Some(_) => {}
                    None => return Ok(()),
                },
            }
            terminal.draw(|f| render(f, &model.state))?;
        }
    }
    .await;
    scraper.abort();
    drop(rx);
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_tenants_come_first_and_idle_ones_are_left_out() {
        let tokens: BTreeMap<String, f64> = [
            ("anonymous", 0.0),
            ("a", 100.0),
            ("b", 600.0),
            ("c", 200.0),
            ("d", 100.0),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        let (rows, hidden) = top_tenants(&tokens, 10.0, 3);
        let names: Vec<&str> = rows.iter().map(|r| r.tenant.as_str()).collect();
        // a and d tie: name order; d is the one cut.
        assert_eq!(names, ["b", "c", "a"]);
        assert_eq!(hidden, 1, "d is active and not shown; anonymous is idle");
        assert!((rows[0].tokens_per_s - 60.0).abs() < 1e-9);
        assert!((rows[0].share - 0.6).abs() < 1e-9);
        let (none, hidden) = top_tenants(&BTreeMap::new(), 10.0, 3);
        assert!(none.is_empty() && hidden == 0);
    }

    #[test]
    fn the_tenants_line_says_when_the_server_has_no_label() {
        let mut s = TopState::new("u");
        assert_eq!(tenants_line(&s), None);
        s.tenants = Some(Vec::new());
        assert_eq!(tenants_line(&s).as_deref(), Some("tenants: none active"));
        s.tenants = Some(vec![TenantRow {
            tenant: "a".into(),
            tokens_per_s: 1234.4,
            share: 0.8,
        }]);
        s.tenants_hidden = 2;
        assert_eq!(
            tenants_line(&s).as_deref(),
            Some("tenants (tok/s): a 1234 (80%)  +2 more")
        );
    }
}
