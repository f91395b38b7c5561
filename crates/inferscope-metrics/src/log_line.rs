//! The periodic log line, one per engine:
//! `Engine 000: Avg prompt throughput: … tokens/s, …, Prefix cache hit rate: …%`.
//!
//! The engine thread accumulates under a per-engine mutex that only the
//! periodic `log()` contends with; formatting is a pure function.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use inferscope_schema::stats::{IterationStats, SchedulerStats};

/// Steps with prefix-cache lookups kept in the hit-rate window.
pub const PREFIX_CACHE_WINDOW: usize = 1024;

/// What one log line reports.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLineSnapshot {
    /// Global engine index.
    pub engine: usize,
    /// Prompt tokens per second since the last line.
    pub prompt_throughput: f64,
    /// Generated tokens per second since the last line.
    pub generation_throughput: f64,
    /// Requests running at the last step.
    pub num_running: usize,
    /// Requests waiting at the last step.
    pub num_waiting: usize,
    /// KV-cache usage 0..1 at the last step.
    pub kv_cache_usage: f64,
    /// Prefix-cache hit rate 0..1 over the recent window.
    pub prefix_cache_hit_rate: f64,
    /// Tokens looked up in the prefix cache within that window (its weight
    /// when engines are aggregated).
    pub prefix_cache_window_queries: u64,
}

/// Formats one line, exactly as specified (pure, for tests).
pub fn format_log_line(s: &LogLineSnapshot) -> String {
    let mut out = String::with_capacity(200);
    let _ = write!(
        out,
        "Engine {:03}: Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, \
         Running: {} reqs, Waiting: {} reqs, KV cache usage: {:.1}%, Prefix cache hit rate: {:.1}%",
        s.engine,
        s.prompt_throughput,
        s.generation_throughput,
        s.num_running,
        s.num_waiting,
        s.kv_cache_usage * 100.0,
        s.prefix_cache_hit_rate * 100.0,
    );
    out
}

/// Formats the `N Engines Aggregated: …` line: throughputs and request
/// counts summed, KV usage averaged, hit rate weighted by window lookups.
pub fn format_aggregated_line(lines: &[LogLineSnapshot]) -> String {
    let n = lines.len();
    let sum = |f: fn(&LogLineSnapshot) -> f64| lines.iter().map(f).sum::<f64>();
    let queries: u64 = lines.iter().map(|l| l.prefix_cache_window_queries).sum();
    let hit_rate = if queries == 0 {
        0.0
    } else {
        sum(|l| l.prefix_cache_hit_rate * l.prefix_cache_window_queries as f64) / queries as f64
    };
    let mut out = String::with_capacity(220);
    let _ = write!(
        out,
        "{n} Engines Aggregated: Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, \
         Running: {} reqs, Waiting: {} reqs, KV cache usage: {:.1}%, Prefix cache hit rate: {:.1}%",
        sum(|l| l.prompt_throughput),
        sum(|l| l.generation_throughput),
        lines.iter().map(|l| l.num_running).sum::<usize>(),
        lines.iter().map(|l| l.num_waiting).sum::<usize>(),
        sum(|l| l.kv_cache_usage) / n.max(1) as f64 * 100.0,
        hit_rate * 100.0,
    );
    out
}

/// Sliding window over the last [`PREFIX_CACHE_WINDOW`] steps that looked
/// anything up in the prefix cache (steps with no lookups don't push data out).
#[derive(Debug)]
struct HitRateWindow {
    entries: Box<[(u64, u64)]>,
    next: usize,
    queries: u64,
    hits: u64,
}

impl HitRateWindow {
    fn new(capacity: usize) -> Self {
        Self {
            entries: vec![(0, 0); capacity.max(1)].into_boxed_slice(),
            next: 0,
            queries: 0,
            hits: 0,
        }
    }

    fn push(&mut self, queries: u64, hits: u64) {
        if queries == 0 {
            return;
        }
        let len = self.entries.len();
        if let Some(slot) = self.entries.get_mut(self.next) {
            let (old_q, old_h) = *slot;
            self.queries = self.queries - old_q + queries;
            self.hits = self.hits - old_h + hits;
            *slot = (queries, hits);
        }
        self.next = (self.next + 1) % len;
    }

    fn rate(&self) -> f64 {
        if self.queries == 0 {
            0.0
        } else {
            self.hits as f64 / self.queries as f64
        }
    }
}

#[derive(Debug)]
struct Accumulator {
    prompt_tokens: u64,
    generation_tokens: u64,
    num_running: usize,
    num_waiting: usize,
    kv_cache_usage: f64,
    window: HitRateWindow,
    last_log: Instant,
    /// Whether the previous interval had zero throughput.
    last_idle: bool,
}

/// One engine's log-line state.
#[derive(Debug)]
pub struct LogLineLogger {
    engine: usize,
    state: Mutex<Accumulator>,
}

/// A line ready to emit, and whether it is demoted to debug level.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    /// The figures.
    pub snapshot: LogLineSnapshot,
    /// True after two idle intervals in a row.
    pub debug: bool,
}

impl LogLineLogger {
    /// A logger for global engine `engine`, its interval starting at `now`.
    pub fn new(engine: usize, now: Instant) -> Self {
        Self {
            engine,
            state: Mutex::new(Accumulator {
                prompt_tokens: 0,
                generation_tokens: 0,
                num_running: 0,
                num_waiting: 0,
                kv_cache_usage: 0.0,
                window: HitRateWindow::new(PREFIX_CACHE_WINDOW),
                last_log: now,
                last_idle: false,
            }),
        }
    }

    /// The global engine index.
    pub fn engine(&self) -> usize {
        self.engine
    }

    /// Accumulates one step.
    pub fn record_step(&self, sched: &SchedulerStats, iter: &IterationStats) {
        let mut s = self.state.lock();
        s.prompt_tokens += iter.num_prompt_tokens;
        s.generation_tokens += iter.num_generation_tokens;
        Self::set_scheduler(&mut s, sched);
    }

    /// Updates the scheduler snapshot after an idle wait.
    pub fn record_idle(&self, sched: &SchedulerStats) {
        let mut s = self.state.lock();
        Self::set_scheduler(&mut s, sched);
    }

    fn set_scheduler(s: &mut Accumulator, sched: &SchedulerStats) {
        s.num_running = sched.num_running;
        s.num_waiting = sched.num_waiting;
        s.kv_cache_usage = sched.kv_cache_usage;
        s.window
            .push(sched.prefix_cache_queries, sched.prefix_cache_hits);
    }

    /// Closes the interval at `now` and returns its line.
    pub fn take_line(&self, now: Instant) -> LogLine {
        let mut s = self.state.lock();
        let elapsed = now.saturating_duration_since(s.last_log);
        let secs = elapsed.max(Duration::from_millis(1)).as_secs_f64();
        let prompt = s.prompt_tokens as f64 / secs;
        let generation = s.generation_tokens as f64 / secs;
        let idle = s.prompt_tokens == 0 && s.generation_tokens == 0;
        let debug = idle && s.last_idle;
        s.last_idle = idle;
        s.prompt_tokens = 0;
        s.generation_tokens = 0;
        s.last_log = now;
        LogLine {
            snapshot: LogLineSnapshot {
                engine: self.engine,
                prompt_throughput: prompt,
                generation_throughput: generation,
                num_running: s.num_running,
                num_waiting: s.num_waiting,
                kv_cache_usage: s.kv_cache_usage,
                prefix_cache_hit_rate: s.window.rate(),
                prefix_cache_window_queries: s.window.queries,
            },
            debug,
        }
    }

    /// Closes the interval now and emits the line through `tracing`.
    pub fn log(&self) {
        let line = self.take_line(Instant::now());
        emit(&format_log_line(&line.snapshot), line.debug);
    }
}

/// Emits a stats line at info level, or debug when the engine(s) idled.
pub(crate) fn emit(text: &str, debug: bool) {
    if debug {
        tracing::debug!(target: "inferscope::stats", "{text}");
    } else {
        tracing::info!(target: "inferscope::stats", "{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_exactly() {
        let s = LogLineSnapshot {
            engine: 0,
            prompt_throughput: 3064.0,
            generation_throughput: 359.0,
            num_running: 26,
            num_waiting: 0,
            kv_cache_usage: 0.053,
            prefix_cache_hit_rate: 0.0,
            prefix_cache_window_queries: 0,
        };
        assert_eq!(
            format_log_line(&s),
            "Engine 000: Avg prompt throughput: 3064.0 tokens/s, Avg generation throughput: 359.0 tokens/s, \
             Running: 26 reqs, Waiting: 0 reqs, KV cache usage: 5.3%, Prefix cache hit rate: 0.0%"
        );
        let s = LogLineSnapshot {
            engine: 12,
            prefix_cache_hit_rate: 0.4567,
            ..s
        };
        let line = format_log_line(&s);
        assert!(line.starts_with("Engine 012: "), "{line}");
        assert!(line.ends_with("Prefix cache hit rate: 45.7%"), "{line}");
    }

    #[test]
    fn aggregated_line() {
        let a = LogLineSnapshot {
            engine: 0,
            prompt_throughput: 100.0,
            generation_throughput: 10.0,
            num_running: 2,
            num_waiting: 1,
            kv_cache_usage: 0.1,
            prefix_cache_hit_rate: 0.5,
            prefix_cache_window_queries: 300,
        };
        let b = LogLineSnapshot {
            engine: 1,
            prompt_throughput: 50.5,
            generation_throughput: 5.0,
            num_running: 3,
            num_waiting: 0,
            kv_cache_usage: 0.3,
            prefix_cache_hit_rate: 0.0,
            prefix_cache_window_queries: 100,
        };
        assert_eq!(
            format_aggregated_line(&[a, b]),
            "2 Engines Aggregated: Avg prompt throughput: 150.5 tokens/s, Avg generation throughput: 15.0 tokens/s, \
             Running: 5 reqs, Waiting: 1 reqs, KV cache usage: 20.0%, Prefix cache hit rate: 37.5%"
        );
    }

    #[test]
    fn throughput_is_tokens_over_interval() {
        let t0 = Instant::now();
        let l = LogLineLogger::new(1, t0);
        let iter = IterationStats {
            num_prompt_tokens: 100,
            num_generation_tokens: 10,
            ..Default::default()
        };
        let sched = SchedulerStats {
            num_running: 3,
            num_waiting: 2,
            kv_cache_usage: 0.25,
            prefix_cache_queries: 100,
            prefix_cache_hits: 25,
            num_preemptions: 0,
            ..Default::default()
        };
        l.record_step(&sched, &iter);
        l.record_step(&sched, &iter);
        let line = l.take_line(t0 + Duration::from_secs(10));
        assert!(!line.debug);
        assert_eq!(
            line.snapshot,
            LogLineSnapshot {
                engine: 1,
                prompt_throughput: 20.0,
                generation_throughput: 2.0,
                num_running: 3,
                num_waiting: 2,
                kv_cache_usage: 0.25,
                prefix_cache_hit_rate: 0.25,
                prefix_cache_window_queries: 200,
            }
        );
        // The interval restarts: nothing new → zero throughput.
        let line = l.take_line(t0 + Duration::from_secs(20));
        assert_eq!(line.snapshot.prompt_throughput, 0.0);
        // Hit rate is a sliding window, not per interval.
        assert_eq!(line.snapshot.prefix_cache_hit_rate, 0.25);
    }

    #[test]
    fn two_idle_intervals_drop_to_debug() {
        let t0 = Instant::now();
        let l = LogLineLogger::new(0, t0);
        let t = |s| t0 + Duration::from_secs(s);
        assert!(!l.take_line(t(10)).debug, "first idle interval stays info");
        assert!(l.take_line(t(20)).debug, "second idle interval in a row");
        assert!(l.take_line(t(30)).debug);
        l.record_step(
            &SchedulerStats::default(),
            &IterationStats {
                num_generation_tokens: 1,
                ..Default::default()
            },
        );
        assert!(!l.take_line(t(40)).debug, "busy again");
        assert!(!l.take_line(t(50)).debug, "one idle interval after busy");
    }

    #[test]
    fn window_forgets_old_steps() {
        let mut w = HitRateWindow::new(2);
        w.push(10, 10);
        w.push(10, 0);
        assert_eq!(w.rate(), 0.5);
        w.push(0, 0); // no lookups: ignored
        assert_eq!(w.rate(), 0.5);
        w.push(10, 0); // evicts the 10/10 step
        assert_eq!(w.rate(), 0.0);
    }
}
