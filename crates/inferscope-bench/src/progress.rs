//! A progress bar on stderr, drawn only when stdout is a terminal.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// A running progress bar; `finish` removes it.
pub struct Progress {
    task: Option<JoinHandle<()>>,
    total: usize,
    done: Arc<AtomicUsize>,
    start: Instant,
    label: &'static str,
    unit: &'static str,
    /// Whether the bar has been drawn (a delayed one may never be).
    drawn: Arc<std::sync::atomic::AtomicBool>,
}

/// Whether a bar should be shown (stdout is a terminal and not disabled).
pub fn wanted(disabled: bool) -> bool {
    !disabled && std::io::stdout().is_terminal()
}

fn draw(label: &str, unit: &str, done: usize, total: usize, elapsed: Duration) {
    let width = 30;
    let done = done.min(total);
    let filled = (done * width)
        .checked_div(total)
        .unwrap_or(width)
        .min(width);
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r{label}[{}{}] {done}/{total} {:.1}s {rate:.1} {unit}/s ",
        "#".repeat(filled),
        " ".repeat(width - filled),
        elapsed.as_secs_f64()
    );
    let _ = err.flush();
}

impl Progress {
    /// Starts redrawing every 200 ms when `enabled`; counts come from `done`.
    pub fn start(total: usize, enabled: bool, done: Arc<AtomicUsize>) -> Self {
        Self::start_after("", "req", Duration::ZERO, total, enabled, done)
    }

    /// A bar `label[###   ] done/total … unit/s`, first drawn after `delay`
    /// (work that ends sooner shows no bar at all).
    pub fn start_after(
        label: &'static str,
        unit: &'static str,
        delay: Duration,
        total: usize,
        enabled: bool,
        done: Arc<AtomicUsize>,
    ) -> Self {
        let start = Instant::now();
        let drawn = Arc::new(std::sync::atomic::AtomicBool::new(delay.is_zero()));
        let task = enabled.then(|| {
            let (done, drawn) = (done.clone(), drawn.clone());
            tokio::spawn(async move {
                let first = tokio::time::Instant::from_std(start + delay);
                let mut tick = tokio::time::interval_at(first, Duration::from_millis(200));
                loop {
                    tick.tick().await;
                    drawn.store(true, Ordering::Relaxed);
                    draw(
                        label,
                        unit,
                        done.load(Ordering::Relaxed),
                        total,
                        start.elapsed(),
                    );
                }
            })
        });
        Progress {
            task,
            total,
            done,
            start,
            label,
            unit,
            drawn,
        }
    }

    /// Draws the final state and ends the line.
    pub fn finish(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            if !self.drawn.load(Ordering::Relaxed) {
                return;
            }
            draw(
                self.label,
                self.unit,
                self.done.load(Ordering::Relaxed),
                self.total,
                self.start.elapsed(),
            );
            eprintln!();
        }
    }
}
