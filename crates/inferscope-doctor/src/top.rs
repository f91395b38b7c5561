//! `inferscope top`: a live terminal view of a server's `/metrics`.
//!
//! The model ([`TopModel`]) folds scrapes into a [`TopState`]; drawing is a
//! pure function of that state ([`render`]), so tests render recorded
//! metrics into ratatui's `TestBackend` and read the screen.

use crate::snapshot::{Dist, Scrape, Window};
use clap::Args;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Sparkline, Table};
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

    /// Metric namespace (`inferscope`, `vllm`); detected from the metrics when absent.
    #[arg(long)]
    pub metrics_namespace: Option<String>,
}

/// Points kept for the throughput sparklines.
pub const HISTORY: usize = 120;

/// One engine's row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineRow {
    /// The `engine` label.
    pub engine: String,
    /// Running requests now.
    pub running: f64,
    /// Waiting requests now.
    pub waiting: f64,
    /// KV-cache usage now, fraction.
    pub kv_usage: Option<f64>,
    /// Device utilisation over the window, fraction (inferscope only).
    pub device_utilisation: Option<f64>,
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

fn push_capped(q: &mut VecDeque<f64>, v: f64) {
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
        let whole = Window::new(scrapes, ns).summary();
        self.state.namespace = whole.namespace.clone();
        self.state.window_s = whole.window_s;
        self.state.engines = whole
            .engines
            .iter()
            .map(|e| EngineRow {
                engine: e.engine.clone(),
                running: e.running_now.unwrap_or(0.0),
                waiting: e.waiting_now.unwrap_or(0.0),
                kv_usage: e.kv_usage_now,
                device_utilisation: e.device_utilisation,
            })
            .collect();
        if n < 2 {
            return;
        }
        // Sparklines: the rate between the last two scrapes.
        let last_two: Vec<(f64, Scrape)> = self.recent.iter().skip(n - 2).cloned().collect();
        let latest = Window::new(last_two, ns).summary();
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

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |x| format!("{:.1} ms", x * 1000.0))
}

fn rates_line(label: &str, rates: &BTreeMap<String, f64>) -> String {
    if rates.is_empty() {
        return format!("{label}: –");
    }
    let parts: Vec<String> = rates.iter().map(|(k, v)| format!("{k} {v:.2}/s")).collect();
    format!("{label}: {}", parts.join("  "))
}

/// Draws the whole screen from `s`.
pub fn render(f: &mut Frame, s: &TopState) {
    let [head, engines, tput, lat] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(s.engines.len().max(1) as u16 + 3),
        Constraint::Length(5),
        Constraint::Min(5),
    ])
    .areas(f.area());
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
            if e.engine.is_empty() {
                "-".to_string()
            } else {
                e.engine.clone()
            },
            format!("{:.0}", e.running),
            format!("{:.0}", e.waiting),
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
    spark(f, p, "prompt", &s.prompt_tps);
    spark(f, g, "generation", &s.generation_tps);
    let lines = vec![
        Line::raw(format!(
            "TTFT p50 {}  p99 {}    ITL p50 {}  p99 {}    (last {:.0} s)",
            ms(s.ttft.and_then(|d| d.p50)),
            ms(s.ttft.and_then(|d| d.p99)),
            ms(s.itl.and_then(|d| d.p50)),
            ms(s.itl.and_then(|d| d.p99)),
            s.window_s
        )),
        Line::raw(rates_line("requests", &s.request_rates)),
        Line::raw(rates_line("http", &s.http_rates)),
        Line::raw(format!(
            "device utilisation: {}",
            s.device_utilisation
                .map_or_else(|| "n/a (not exported)".to_string(), |u| bar(u, 20))
        )),
    ];
    f.render_widget(
        Paragraph::new(lines).block(
            Block::default()
                .borders(Borders::ALL)
                .title(" latency and requests "),
        ),
        lat,
    );
}

fn spark(f: &mut Frame, area: Rect, what: &str, data: &VecDeque<f64>) {
    let now = data.back().copied().unwrap_or(0.0);
    // Sparklines take integers; the newest points are the rightmost that fit.
    let width = area.width.saturating_sub(2) as usize;
    let pts: Vec<u64> = data
        .iter()
        .skip(data.len().saturating_sub(width))
        .map(|v| v.max(0.0).round() as u64)
        .collect();
    f.render_widget(
        Sparkline::default()
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(format!(" {what} {now:.0} tok/s ")),
            )
            .data(&pts)
            .style(Style::default().fg(Color::Cyan)),
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
