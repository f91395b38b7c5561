//! inferscope-doctor: `inferscope doctor` turns a server's `/metrics` into a
//! ranked diagnosis with evidence and concrete actions; `inferscope top`
//! watches the same metrics live. Both read only the metrics endpoint (or a
//! Prometheus server), so they work against any server exporting this schema
//! — vLLM's included, under the `vllm:` namespace.

pub mod client;
pub mod findings;
pub mod prometheus_api;
pub mod report;
pub mod top;
pub mod window;

use anyhow::Context as _;
use clap::Args;
use std::io::Write as _;
use std::time::{Duration, Instant};
use window::{Scrape, Window};

pub use top::{TopArgs, run_top};

/// Flags of `inferscope doctor`.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// The server: `http://HOST:PORT` (its `/metrics` is read) or the full metrics URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,

    /// How long to observe: the two scrapes are this far apart (`30s`, `500ms`, `2m`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub window: Duration,

    /// Read the window from this Prometheus server (range query ending now)
    /// instead of scraping `--url`.
    #[arg(long)]
    pub prometheus: Option<String>,

    /// With `--prometheus`: label matchers selecting the server's series,
    /// e.g. `job="inferscope",instance="10.0.0.1:8000"`.
    #[arg(long, default_value = "")]
    pub selector: String,

    /// Metric namespace (`inferscope`, `vllm`, or `inferscope:` for servers
    /// that spelled names `inferscope:x`); detected from the metrics when absent.
    #[arg(long)]
    pub metrics_namespace: Option<String>,

    /// Print the report as JSON (for tests and CI gates).
    #[arg(long)]
    pub json: bool,
}

/// Parses `30s`, `500ms`, `2m`, `1.5s` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 30s, 500ms, 2m)"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("`{s}`: the duration must be positive"));
    }
    Duration::try_from_secs_f64(v * scale).map_err(|_| format!("`{s}`: the duration is too long"))
}

/// The metrics URL for `--url`: `/metrics` is appended when no path is given.
pub fn metrics_url(url: &str) -> String {
    let u = url.trim_end_matches('/');
    let after_scheme = u.split_once("://").map_or(u, |(_, r)| r);
    if after_scheme.contains('/') {
        u.to_string()
    } else {
        format!("{u}/metrics")
    }
}

/// How long one scrape may take before it counts as failed.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Fetches and parses one exposition.
pub async fn fetch(url: &str) -> anyhow::Result<Scrape> {
    let text = client::get_text(url, SCRAPE_TIMEOUT).await?;
    Ok(Scrape::parse(&text))
}

/// Scrapes `url` over `window`: first and last scrape for the deltas, and
/// several in between so gauges are averaged rather than caught at one instant.
pub async fn collect(
    url: &str,
    window: Duration,
    namespace: Option<&str>,
) -> anyhow::Result<Window> {
    // About eight gauge samples per window, at most one a second.
    let interval = (window / 8).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let start = Instant::now();
    let first = fetch(url)
        .await
        .with_context(|| format!("cannot read the metrics at {url}"))?;
    let mut scrapes = vec![(0.0, first)];
    let mut last_error = None;
    loop {
        let elapsed = start.elapsed();
        if elapsed >= window {
            break;
        }
        tokio::time::sleep(interval.min(window - elapsed)).await;
        let at = start.elapsed().as_secs_f64();
        // A failed scrape mid-window is not fatal: the others still count.
        match fetch(url).await {
            Ok(s) => scrapes.push((at, s)),
            Err(e) => last_error = Some(e),
        }
    }
    if scrapes.len() < 2 {
        let why = last_error.map_or_else(String::new, |e| format!(": {e:#}"));
        anyhow::bail!("only one scrape of {url} succeeded in the window{why}");
    }
    Ok(Window::new(scrapes, namespace))
}

/// Builds the report of a window.
pub fn diagnose_window(source: &str, w: &Window) -> report::Report {
    let summary = w.summary();
    let d = findings::diagnose(&summary, w.failure_trend());
    report::Report::new(source, summary, d)
}

/// The findings of `/metrics` texts taken at the given seconds (oldest
/// first), as the console shows them (docs/console.md): the window's length,
/// the worst severity and the ranked findings with evidence and action; the
/// server's console calls it every few seconds on its own renders.
pub fn console_findings(texts: &[(f64, &str)]) -> serde_json::Value {
    let scrapes = texts
        .iter()
        .map(|&(t, text)| (t, Scrape::parse(text)))
        .collect();
    let r = diagnose_window("/metrics", &Window::new(scrapes, None));
    serde_json::json!({
        "window_s": r.window_s,
        "worst": r.worst,
        "findings": r.diagnosis.findings,
    })
}

/// Runs `doctor`: prints the report and returns the exit status (2 when a
/// critical finding is present).
pub async fn run_doctor(args: DoctorArgs) -> anyhow::Result<i32> {
    let ns = args.metrics_namespace.as_deref();
    let (source, window) = match &args.prometheus {
        Some(prom) => {
            let w = prometheus_api::collect(prom, &args.selector, args.window, ns).await?;
            (format!("{prom} (Prometheus)"), w)
        }
        None => {
            let url = metrics_url(&args.url);
            if !args.json {
                eprintln!("observing {url} for {:.1} s …", args.window.as_secs_f64());
            }
            let w = collect(&url, args.window, ns).await?;
            (url, w)
        }
    };
    let prefix = inferscope_schema::schema::name_prefix(&window.namespace);
    let found = window
        .scrapes
        .last()
        .is_some_and(|(_, s)| s.samples.iter().any(|x| x.name.starts_with(&prefix)));
    if !found {
        // Most likely the wrong port or a different server: say so rather
        // than report an idle "no traffic".
        anyhow::bail!(
            "{source} has no `{prefix}` metrics: is it an inferscope or vLLM server? \
             (pass --metrics-namespace if it uses another namespace)"
        );
    }
    let report = diagnose_window(&source, &window);
    let text = if args.json {
        report.to_json() + "\n"
    } else {
        report.to_text()
    };
    // A closed pipe (`doctor | head`) is not an error worth a panic.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    Ok(report.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_urls() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("1e300h").is_err());
        assert_eq!(metrics_url("http://h:8000"), "http://h:8000/metrics");
        assert_eq!(metrics_url("http://h:8000/"), "http://h:8000/metrics");
        assert_eq!(metrics_url("http://h:8000/m"), "http://h:8000/m");
    }
}
