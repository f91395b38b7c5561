//! The log of finished requests (choices), in two places that are each on
//! or off: `--enable-request-log [PATH|-]` writes one JSON line per choice,
//! for automated tests and audits; the console keeps the last
//! [`RECENT_CAPACITY`] in memory ([`RecentRequests`]), in the same shape.
//!
//! The request's task hands the entry to a bounded queue with `try_send` and
//! moves on; one writer thread formats and writes the lines. When the writer
//! falls behind, entries are dropped and counted in `request_log_dropped`,
//! never waited for. A server shutting down waits (bounded) until the lines
//! queued so far are written ([`RequestLog::flush`]). The in-memory ring is
//! a short critical section per finished choice (never per token) with no
//! allocation: its slots are reserved up front.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use inferscope_engine::FinishReason;
use inferscope_metrics::StatLoggerManager;
use inferscope_schema::RequestRef;
use serde::Serialize;

use crate::features::RequestFeatures;
use crate::timings::{ChoiceTimings, ResponseMetrics};

/// Entries the queue holds before new ones are dropped.
pub const QUEUE_CAPACITY: usize = 4096;

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Standard error (`-`).
    Stderr,
    /// A file, appended to.
    File(PathBuf),
}

impl Destination {
    /// `-` is stderr, anything else a file path.
    pub fn parse(arg: &str) -> Self {
        if arg == "-" {
            Self::Stderr
        } else {
            Self::File(PathBuf::from(arg))
        }
    }
}

/// One finished choice, as handed to the writer.
#[derive(Debug, Clone)]
pub struct RequestLogEntry {
    /// The engine request.
    pub request: RequestRef,
    /// Who sent it (`None`: anonymous).
    pub tenant: Option<Arc<str>>,
    /// Engine index that served it.
    pub engine: usize,
    /// Why it finished.
    pub finish_reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Its timings.
    pub timings: ChoiceTimings,
    /// The optional features its request used.
    pub features: RequestFeatures,
}

/// The JSON line (and the console's recent request): every field but the
/// prompt and the output text, which are never logged.
#[derive(Serialize)]
pub struct Line<'a> {
    /// Unix seconds when the line was written (the console: when the
    /// choice finished).
    timestamp: f64,
    request_id: &'a str,
    trace_id: Option<String>,
    tenant: &'a str,
    engine: usize,
    finish_reason: &'static str,
    prompt_tokens: usize,
    completion_tokens: usize,
    #[serde(flatten)]
    metrics: ResponseMetrics,
    inference_time_ms: f64,
    /// Present only when the output was constrained.
    #[serde(skip_serializing_if = "Option::is_none")]
    structured_output: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
}

/// Unix time now, in seconds.
impl RequestLogEntry {
    fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        serde_json::to_writer(
            &mut *out,
            &self.line(inferscope_console::history::unix_now()),
        )?;
        out.write_all(b"\n")
    }

    /// The entry's JSON shape, stamped `timestamp` (unix seconds).
    pub fn line(&self, timestamp: f64) -> Line<'_> {
        Line {
            timestamp,
            request_id: &self.request.request_id,
            trace_id: self.request.trace_id_hex(),
            tenant: self
                .tenant
                .as_deref()
                .unwrap_or(inferscope_schema::schema::TENANT_ANONYMOUS),
            engine: self.engine,
            finish_reason: self.finish_reason.as_str(),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            metrics: self.timings.response_metrics(),
            inference_time_ms: self.timings.inference.as_secs_f64() * 1e3,
            structured_output: self.features.structured_output,
            logprobs: self.features.logprobs,
            prompt_logprobs: self.features.prompt_logprobs,
            tools: self.features.tools,
            tool_choice: self.features.tool_choice,
        }
    }
}

/// Finished choices the console shows: the last [`RECENT_CAPACITY`].
pub use inferscope_console::recent::RECENT_CAPACITY;

/// A ring of the last finished choices, each numbered (`seq`, from 1) so a
/// reader can ask for those after the last it saw.
pub struct RecentRequests {
    ring: Mutex<Ring>,
}

struct Ring {
    /// `(seq, finished at in unix seconds, entry)`, oldest first.
    entries: VecDeque<(u64, f64, RequestLogEntry)>,
    capacity: usize,
    last_seq: u64,
}

impl RecentRequests {
    /// A ring of `capacity` entries (at least one), all reserved now.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            ring: Mutex::new(Ring {
                entries: VecDeque::with_capacity(capacity),
                capacity,
                last_seq: 0,
            }),
        }
    }

    /// Adds `entry`, finished now, dropping the oldest when full.
    pub fn push(&self, entry: RequestLogEntry) {
        let now = inferscope_console::history::unix_now();
        // A panic elsewhere while holding the lock leaves the ring whole.
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.entries.len() == ring.capacity {
            ring.entries.pop_front();
        }
        ring.last_seq += 1;
        let seq = ring.last_seq;
        ring.entries.push_back((seq, now, entry));
    }

    /// Copies of the entries numbered above `after`, oldest first, with
    /// their `seq` and finish time (0 gives them all).
    pub fn after(&self, after: u64) -> Vec<(u64, f64, RequestLogEntry)> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        ring.entries
            .iter()
            .filter(|(seq, _, _)| *seq > after)
            .cloned()
            .collect()
    }
}

/// The console reads the ring as JSON: each entry's request-log line, made
/// when read (once a second), not when the choice finishes.
impl inferscope_console::RecentSource for RecentRequests {
    fn after(&self, seq: u64) -> Vec<(u64, serde_json::Value)> {
        RecentRequests::after(self, seq)
            .into_iter()
            .map(|(seq, at, e)| {
                let line = serde_json::to_value(e.line(at)).unwrap_or(serde_json::Value::Null);
                (seq, line)
            })
            .collect()
    }
}

/// What the writer's queue carries. Nearly every message is an entry:
/// boxing it to shrink the rare flush would allocate once per request.
#[allow(clippy::large_enum_variant)]
enum Queued {
    /// A line to write.
    Entry(RequestLogEntry),
    /// Answered once everything queued before it is written and flushed.
    Flush(mpsc::Sender<()>),
}

/// The sending side: cheap to clone, never blocks.
#[derive(Clone)]
pub struct RequestLog {
    /// The line writer's queue, with `--enable-request-log`.
    writer: Option<(SyncSender<Queued>, Arc<StatLoggerManager>)>,
    /// The console's ring, unless `--disable-console`.
    recent: Option<Arc<RecentRequests>>,
}

impl RequestLog {
    /// Opens `dest` and starts the writer thread; dropped entries are
    /// counted in `metrics`. The thread ends when every sender is gone.
    pub fn start(dest: &Destination, metrics: Arc<StatLoggerManager>) -> io::Result<Self> {
        Self::with_capacity(dest, metrics, QUEUE_CAPACITY)
    }

    /// A log kept only in the console's ring `recent`.
    pub fn recent_only(recent: Arc<RecentRequests>) -> Self {
        Self {
            writer: None,
            recent: Some(recent),
        }
    }

    /// Also keeps each entry in `recent`.
    pub fn with_recent(mut self, recent: Option<Arc<RecentRequests>>) -> Self {
        self.recent = recent;
        self
    }

    /// The console's ring, when kept.
    pub fn recent(&self) -> Option<&Arc<RecentRequests>> {
        self.recent.as_ref()
    }

    /// [`Self::start`] with a queue of `capacity` entries.
    pub fn with_capacity(
        dest: &Destination,
        metrics: Arc<StatLoggerManager>,
        capacity: usize,
    ) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = match dest {
            Destination::Stderr => Box::new(io::stderr()),
            Destination::File(path) => Box::new(open(path)?),
        };
        Self::with_writer(out, metrics, capacity)
    }

    fn with_writer(
        out: Box<dyn Write + Send>,
        metrics: Arc<StatLoggerManager>,
        capacity: usize,
    ) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(capacity);
        std::thread::Builder::new()
            .name("request-log".into())
            .spawn(move || write_loop(rx, BufWriter::new(out)))?;
        Ok(Self {
            writer: Some((tx, metrics)),
            recent: None,
        })
    }

    /// Keeps `entry` in the console's ring and queues it for the writer;
    /// drops and counts it when the writer's queue is full.
    pub fn record(&self, entry: RequestLogEntry) {
        let Some((tx, metrics)) = &self.writer else {
            if let Some(recent) = &self.recent {
                recent.push(entry);
            }
            return;
        };
        if let Some(recent) = &self.recent {
            recent.push(entry.clone());
        }
        match tx.try_send(Queued::Entry(entry)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                metrics.record_request_log_dropped();
            }
        }
    }

    /// Waits, at most `timeout`, until every entry recorded so far is
    /// written and flushed (a server shutting down: its last lines are in
    /// the file when it is gone). Blocks the calling thread.
    pub fn flush(&self, timeout: Duration) {
        let Some((tx, _)) = &self.writer else {
            return;
        };
        let deadline = Instant::now() + timeout;
        let (ack, done) = mpsc::channel();
        // Queued without blocking past the deadline: the queue may be full
        // behind a writer that is stuck (a pipe nobody reads).
        let mut flush = Queued::Flush(ack);
        loop {
            match tx.try_send(flush) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    flush = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return,
            }
        }
        let _ = done.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

fn open(path: &Path) -> io::Result<std::fs::File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("request log {}: {e}", path.display())))
}

/// Writes entries as they come; flushes whenever the queue is empty, so a
/// reader sees every line of an idle server.
fn write_loop(rx: Receiver<Queued>, mut out: BufWriter<Box<dyn Write + Send>>) {
    let mut failed = false;
    let mut acks = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut result = Ok(());
        for queued in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match queued {
                Queued::Entry(entry) => result = result.and_then(|()| entry.write_json(&mut out)),
                Queued::Flush(ack) => acks.push(ack),
            }
        }
        result = result.and_then(|()| out.flush());
        if let Err(e) = result
            && !failed
        {
            // Once: a full disk would otherwise log on every request.
            failed = true;
            tracing::error!(error = %e, "writing the request log failed");
        }
        for ack in acks.drain(..) {
            let _ = ack.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use inferscope_metrics::{Format, MetricsConfig};

    use super::*;

    /// A writer that waits for `gate` on every write and keeps what it got.
    struct Gated {
        gate: Arc<Mutex<()>>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _open = self.gate.lock().unwrap();
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn entry(i: usize) -> RequestLogEntry {
        RequestLogEntry {
            request: RequestRef::new(&format!("r{i}"), Some([7; 16])),
            tenant: Some("team-a".into()),
            engine: 1,
            finish_reason: FinishReason::Length,
            prompt_tokens: 5,
            completion_tokens: i,
            timings: ChoiceTimings::new(
                Some(Duration::from_millis(3)),
                Duration::from_millis(9),
                None,
                2,
                i,
            ),
            features: RequestFeatures::default(),
        }
    }

    fn dropped(m: &StatLoggerManager) -> f64 {
        let (_, text) = m.render(Format::Prometheus);
        let samples = inferscope_schema::promtext::parse(&text)
            .unwrap()
            .into_samples();
        inferscope_schema::promtext::sum(&samples, "inferscope_request_log_dropped_total", &[])
    }

    /// The ring keeps the newest, numbered, and hands out those after a seq.
    #[test]
    fn the_recent_ring_keeps_the_last_entries_in_order() {
        let recent = RecentRequests::new(3);
        for i in 0..5 {
            recent.push(entry(i));
        }
        let all = recent.after(0);
        let seqs: Vec<u64> = all.iter().map(|(s, _, _)| *s).collect();
        assert_eq!(seqs, [3, 4, 5]);
        assert_eq!(all[0].2.request.request_id.as_ref(), "r2");
        let newer = recent.after(4);
        assert_eq!(newer.len(), 1);
        assert_eq!(newer[0].2.completion_tokens, 4);
        // Without a writer, the log keeps entries only in the ring.
        let log = RequestLog::recent_only(Arc::new(RecentRequests::new(2)));
        log.record(entry(9));
        assert_eq!(log.recent().unwrap().after(0)[0].2.completion_tokens, 9);
        println!(
            "recent entry: {} bytes + its request id",
            std::mem::size_of::<(u64, f64, RequestLogEntry)>()
        );
    }

    type Shared<T> = Arc<Mutex<T>>;

    /// A log of `capacity` queued entries whose writer waits on the gate
    /// returned, and keeps what it writes in the buffer returned.
    fn gated_log(
        metrics: &Arc<StatLoggerManager>,
        capacity: usize,
    ) -> (RequestLog, Shared<()>, Shared<Vec<u8>>) {
        let gate = Arc::new(Mutex::new(()));
        let got = Arc::new(Mutex::new(Vec::new()));
        let writer = Box::new(Gated {
            gate: gate.clone(),
            got: got.clone(),
        });
        let log = RequestLog::with_writer(writer, metrics.clone(), capacity).unwrap();
        (log, gate, got)
    }

    /// `flush` returns once every entry recorded before it is written: a
    /// server's last lines are in its file when it is gone.
    #[test]
    fn flush_waits_for_the_lines_recorded_before_it() {
        let metrics = Arc::new(StatLoggerManager::new(MetricsConfig::default()).unwrap());
        let (log, gate, got) = gated_log(&metrics, 16);
        let closed = gate.lock().unwrap();
        for i in 0..3 {
            log.record(entry(i));
        }
        let flushing = {
            let log = log.clone();
            std::thread::spawn(move || log.flush(Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!flushing.is_finished(), "flush waits for the stuck writer");
        drop(closed);
        flushing.join().unwrap();
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        // Without a writer there is nothing to wait for.
        RequestLog::recent_only(Arc::new(RecentRequests::new(2))).flush(Duration::from_secs(10));
    }

    /// A writer that never gets on with it (its queue full) holds a flush
    /// no longer than its timeout: a shutdown is not stuck behind it.
    #[test]
    fn flush_gives_up_at_its_timeout_behind_a_stuck_writer() {
        let metrics = Arc::new(StatLoggerManager::new(MetricsConfig::default()).unwrap());
        let (log, gate, _got) = gated_log(&metrics, 2);
        let _closed = gate.lock().unwrap();
        log.record(entry(0));
        // The writer takes it and waits at the gate; these fill the queue.
        std::thread::sleep(Duration::from_millis(50));
        for i in 1..4 {
            log.record(entry(i));
        }
        let flushing = std::thread::spawn(move || log.flush(Duration::from_millis(100)));
        std::thread::sleep(Duration::from_secs(2));
        assert!(flushing.is_finished(), "flush still waiting after 2 s");
    }

    #[test]
    fn a_stuck_writer_drops_and_counts_instead_of_blocking() {
        let metrics = Arc::new(StatLoggerManager::new(MetricsConfig::default()).unwrap());
        let (log, gate, got) = gated_log(&metrics, 2);
        let closed = gate.lock().unwrap();
        let start = std::time::Instant::now();
        for i in 0..10 {
            log.record(entry(i));
        }
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "record never waits"
        );
        // 2 queued, and at most one more taken by the (stuck) writer.
        let lost = dropped(&metrics);
        assert!((7.0..=8.0).contains(&lost), "dropped {lost}");
        drop(closed);
        drop(log);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if lines.len() as f64 == 10.0 - lost {
                let first = &lines[0];
                assert_eq!(first["request_id"], "r0");
                assert_eq!(first["trace_id"], "07".repeat(16));
                assert_eq!(first["engine"], 1);
                assert_eq!(first["tenant"], "team-a");
                assert_eq!(first["finish_reason"], "length");
                assert_eq!(first["num_preemptions"], 2);
                assert_eq!(first["time_to_first_token_ms"], 3.0);
                assert_eq!(first["generation_time_ms"], 9.0);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{text}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
