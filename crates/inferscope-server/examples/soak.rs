//! Soak benchmark: the server in-process on the sim executor, driven with a
//! mixed workload (streams, full responses, chat, `n` > 1, stop strings,
//! clients that hang up mid-stream, bad requests, random `x-request-id`s) at
//! high concurrency, with resident memory and the number of exported series
//! sampled after a warm-up, in the middle and at the end.
//!
//! ```text
//! cargo run --release -p inferscope-server --example soak -- --requests 100000 --concurrency 256
//! ```
//!
//! Pass criteria (printed): RSS growth from start to end under 10%, the
//! series count constant, no unexpected status.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use inferscope_schema::promtext;
use inferscope_server::ServeArgs;
use tokio::task::JoinSet;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Outcome counters.
#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    client_errors: AtomicU64,
    dropped: AtomicU64,
    unexpected: AtomicU64,
}

fn flag(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident memory of this process in KiB (Linux).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// SplitMix64 of `i`: a reproducible per-request random number.
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

async fn get_metrics(client: &HttpClient, addr: SocketAddr) -> Result<String, Box<dyn Error>> {
    let req =
        hyper::Request::get(format!("http://{addr}/metrics")).body(Full::new(Bytes::new()))?;
    let resp = client.request(req).await?;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Number of series (sample lines) in the exposition, and a gauge's sum.
fn series_and_gauge(text: &str, gauge: &str) -> (usize, f64) {
    let samples = promtext::parse_lenient(text).into_samples();
    (samples.len(), promtext::sum(&samples, gauge, &[]))
}

/// One request of the mix, chosen by `i`.
async fn one(client: HttpClient, addr: SocketAddr, i: u64, counts: Arc<Counts>) {
    let r = mix(i);
    let kind = r % 100;
    let max_tokens = 1 + (r >> 8) % 48;
    let (path, body, keep_events) = match kind {
        0..45 => (
            "/v1/completions",
            format!(
                r#"{{"prompt":"soak {i}","max_tokens":{max_tokens},"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":{}}}}}"#,
                r & 1 == 0
            ),
            None,
        ),
        45..80 => (
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"user","content":"soak chat {i}"}}],"max_tokens":{max_tokens}}}"#
            ),
            None,
        ),
        80..88 => (
            "/v1/completions",
            format!(r#"{{"prompt":"soak n {i}","max_tokens":{max_tokens},"n":2,"seed":{i}}}"#),
            None,
        ),
        88..93 => (
            "/v1/completions",
            format!(
                r#"{{"prompt":"soak drop {i}","max_tokens":400,"ignore_eos":true,"stream":true}}"#
            ),
            Some((r >> 20) as usize % 8),
        ),
        93..95 => (
            "/v1/completions",
            format!(r#"{{"prompt":"soak stop {i}","max_tokens":{max_tokens},"stop":["a","e"]}}"#),
            None,
        ),
        95..98 => (
            "/v1/completions",
            format!(r#"{{"model":"no-such-model-{i}","prompt":"x"}}"#),
            None,
        ),
        _ => ("/v1/chat/completions", format!("{{broken json {i}"), None),
    };
    let mut req = hyper::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    if r & 2 == 0 {
        req = req.header("x-request-id", format!("soak-{i}-{r:x}"));
    }
    let Ok(req) = req.body(Full::new(Bytes::from(body))) else {
        counts.unexpected.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let resp = match client.request(req).await {
        Ok(resp) => resp,
        Err(e) => {
            eprintln!("request {i}: {e}");
            counts.unexpected.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    if let Some(keep) = keep_events {
        let mut seen = 0;
        while seen < keep {
            match body.frame().await {
                Some(Ok(_)) => seen += 1,
                _ => break,
            }
        }
        drop(body);
        counts.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let complete = body.collect().await.is_ok();
    let counter = match (status, complete) {
        (200, true) => &counts.ok,
        (400 | 404, true) => &counts.client_errors,
        _ => {
            eprintln!("request {i}: status {status}, complete {complete}");
            &counts.unexpected
        }
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Runs requests `range` with at most `concurrency` in flight.
async fn phase(
    client: &HttpClient,
    addr: SocketAddr,
    range: std::ops::Range<u64>,
    concurrency: usize,
    counts: &Arc<Counts>,
) {
    let mut set = JoinSet::new();
    for i in range {
        if set.len() >= concurrency {
            let _ = set.join_next().await;
        }
        set.spawn(one(client.clone(), addr, i, counts.clone()));
    }
    while set.join_next().await.is_some() {}
}

/// One row of the report.
struct Row {
    label: String,
    requests: u64,
    seconds: f64,
    rss_mib: f64,
    series: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // As `inferscope serve` does.
    inferscope_server::limit_allocator_arenas();
    let total = flag("--requests", 100_000) as u64;
    let concurrency = flag("--concurrency", 256);
    // The allocator's working set grows until the peak mix of concurrent
    // requests has occurred; "start" is taken after this share of the run.
    let warmup_percent = flag("--warmup-percent", 20) as u64;
    let args = ServeArgs::try_parse_flags([
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "sim",
        "--sim-profile",
        "tiny",
        "--max-num-seqs",
        "512",
        "--disable-log-stats",
    ])?;
    let server = inferscope_server::start(&args).await?;
    let addr = server.addr;
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .build_http();
    let counts = Arc::new(Counts::default());
    let t0 = Instant::now();
    let mut rows = Vec::new();
    let mut sample = async |label: String, requests: u64| -> Result<(), Box<dyn Error>> {
        // Let aborts and finishes settle before measuring.
        loop {
            let text = get_metrics(&client, addr).await?;
            let (series, running) = series_and_gauge(&text, "inferscope_num_requests_running");
            if running == 0.0 {
                rows.push(Row {
                    label,
                    requests,
                    seconds: t0.elapsed().as_secs_f64(),
                    rss_mib: rss_kib() as f64 / 1024.0,
                    series,
                });
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // Checkpoints every 10% (and at 5%), each sampled once no request runs.
    let mut points: Vec<u64> = std::iter::once(5).chain((1..=10).map(|d| d * 10)).collect();
    if !points.contains(&warmup_percent) {
        points.push(warmup_percent);
        points.sort_unstable();
    }
    sample("before any request".into(), 0).await?;
    let mut done = 0;
    let (mut taken, mut start_row, mut middle_row) = (1, 1, 1);
    for p in points {
        let upto = total * p / 100;
        phase(&client, addr, done..upto, concurrency, &counts).await;
        done = upto;
        let label = if p == warmup_percent {
            start_row = taken;
            format!("{p}%: start")
        } else if p == 50 {
            middle_row = taken;
            "50%: middle".to_owned()
        } else if p == 100 {
            "100%: end".to_owned()
        } else {
            format!("{p}%")
        };
        sample(label, upto).await?;
        taken += 1;
    }

    println!(
        "soak: {total} requests, concurrency {concurrency}, sim profile tiny, start after {warmup_percent}%"
    );
    println!(
        "{:<24} {:>10} {:>9} {:>10} {:>8}",
        "point", "requests", "seconds", "RSS MiB", "series"
    );
    for r in &rows {
        println!(
            "{:<24} {:>10} {:>9.1} {:>10.1} {:>8}",
            r.label, r.requests, r.seconds, r.rss_mib, r.series
        );
    }
    let start = &rows[start_row];
    let middle = &rows[middle_row];
    let end = &rows[rows.len() - 1];
    let growth = (end.rss_mib - start.rss_mib) / start.rss_mib * 100.0;
    let growth_middle = (end.rss_mib - middle.rss_mib) / middle.rss_mib * 100.0;
    let series_constant = rows[1..].iter().all(|r| r.series == start.series);
    let secs = end.seconds - rows[0].seconds;
    println!(
        "outcomes: {} ok, {} expected 4xx, {} dropped by the client, {} unexpected",
        counts.ok.load(Ordering::Relaxed),
        counts.client_errors.load(Ordering::Relaxed),
        counts.dropped.load(Ordering::Relaxed),
        counts.unexpected.load(Ordering::Relaxed)
    );
    println!(
        "throughput: {:.0} requests/s; RSS growth start -> end: {growth:+.1}% (target < 10%), middle -> end: {growth_middle:+.1}%; series constant after the first requests: {series_constant}",
        total as f64 / secs
    );
    let pass = growth < 10.0 && series_constant && counts.unexpected.load(Ordering::Relaxed) == 0;
    println!("{}", if pass { "PASS" } else { "FAIL" });
    server.shutdown(Duration::from_secs(5)).await;
    if pass {
        Ok(())
    } else {
        Err("soak criteria not met".into())
    }
}
