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
}

/// Whether a bar should be shown (stdout is a terminal and not disabled).
pub fn wanted(disabled: bool) -> bool {
    !disabled && std::io::stdout().is_terminal()
}

fn draw(done: usize, total: usize, elapsed: Duration) {
    let width = 30;
    let filled = (done * width)
        .checked_div(total)
        .unwrap_or(width)
        .min(width);
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r[{}{}] {done}/{total} {:.1}s {rate:.1} req/s ",
        "#".repeat(filled),
        " ".repeat(width - filled),
        elapsed.as_secs_f64()
    );
    let _ = err.flush();
}

impl Progress {
    /// Starts redrawing every 200 ms when `enabled`; counts come from `done`.
    pub fn start(total: usize, enabled: bool, done: Arc<AtomicUsize>) -> Self {
        let start = Instant::now();
        let task = enabled.then(|| {
            let done = done.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                loop {
                    tick.tick().await;
                    draw(done.load(Ordering::Relaxed), total, start.elapsed());
                }
            })
        });
        Progress {
            task,
            total,
            done,
            start,
        }
    }

    /// Draws the final state and ends the line.
    pub fn finish(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            draw(
                self.done.load(Ordering::Relaxed),
                self.total,
                self.start.elapsed(),
            );
            eprintln!();
        }
    }
}
