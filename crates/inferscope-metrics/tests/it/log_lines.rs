//! The periodic stats lines reach `tracing` at the right level.

use std::io::Write;
use std::sync::Arc;

use inferscope_metrics::{MetricsConfig, StatLoggerManager};
use inferscope_schema::{IterationStats, SchedulerStats, StatsRecorder};
use parking_lot::Mutex;

/// Collects formatted log output.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock())).unwrap()
    }
}

fn with_capture(f: impl FnOnce(&Capture)) {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .without_time()
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || f(&capture));
}

fn busy_step(m: &StatLoggerManager, engine: usize) {
    let sched = SchedulerStats {
        num_running: 4,
        ..Default::default()
    };
    let iter = IterationStats {
        num_prompt_tokens: 10,
        num_generation_tokens: 4,
        ..Default::default()
    };
    m.record_step(engine, &sched, &iter);
}

#[test]
fn one_line_per_engine_then_debug_when_idle() {
    let m = StatLoggerManager::new(MetricsConfig {
        engine_indices: vec![4, 5],
        ..Default::default()
    })
    .unwrap();
    with_capture(|out| {
        busy_step(&m, 4);
        m.log();
        let text = out.take();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("INFO") && lines[0].contains("Engine 004: Avg prompt"));
        assert!(lines[0].contains("Running: 4 reqs"), "{text}");
        // Engine 5 idled this interval (first idle interval: still info).
        assert!(lines[1].contains("INFO") && lines[1].contains("Engine 005: "));
        m.log();
        let text = out.take();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("INFO"),
            "engine 4's first idle interval: {text}"
        );
        assert!(lines[1].contains("DEBUG"), "engine 5 idle twice: {text}");
    });
}

#[test]
fn aggregated_line() {
    let m = StatLoggerManager::new(MetricsConfig {
        engine_indices: vec![0, 1],
        aggregate_log_lines: true,
        ..Default::default()
    })
    .unwrap();
    with_capture(|out| {
        busy_step(&m, 0);
        busy_step(&m, 1);
        m.log();
        let text = out.take();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("2 Engines Aggregated: "), "{text}");
        assert!(text.contains("Running: 8 reqs"), "{text}");
    });
}

#[test]
fn disabled_log_stats_logs_nothing() {
    let m = StatLoggerManager::new(MetricsConfig {
        enable_log_stats: false,
        ..Default::default()
    })
    .unwrap();
    with_capture(|out| {
        busy_step(&m, 0);
        m.log();
        assert_eq!(out.take(), "");
    });
}
