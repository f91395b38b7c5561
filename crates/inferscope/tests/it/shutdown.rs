//! Graceful shutdown of the real binary under load: SIGTERM while 50
//! requests are in flight (some streaming, some not; some short, some far
//! longer than `--shutdown-timeout`). Every request must end with a complete
//! response or an explicit error — never a connection cut mid-stream.
//!
//! Plain `std` networking on purpose: the test reads the raw HTTP/1.1 bytes,
//! so it sees exactly whether a chunked body was terminated.

#![cfg(unix)]

use crate::common;

use common::Server;
use inferscope_schema::promtext;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Starts `inferscope serve` (sim, 32 sequences) with `--shutdown-timeout
/// timeout`; returns it, its address and the rest of its log lines.
fn start_server(timeout: &str) -> (Server, SocketAddr, mpsc::Receiver<String>) {
    common::start_server(&[
        "--executor",
        "sim",
        "--sim-profile",
        "tiny,t_weights_ms=2",
        "--max-num-seqs",
        "32",
        "--shutdown-timeout",
        timeout,
    ])
}

/// Sends SIGTERM to the server.
fn sigterm(server: &Server) {
    let killed = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
}

/// Waits until the engine holds `n` requests (running, waiting or done).
fn wait_admitted(addr: SocketAddr, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while metrics_sum(
        addr,
        &[
            "inferscope_num_requests_running",
            "inferscope_num_requests_waiting",
            "inferscope_request_success_total",
        ],
    ) < n
    {
        assert!(Instant::now() < deadline, "requests were not admitted");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for the process to exit by itself; its exit status.
fn wait_exit(server: &mut Server, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = server.0.try_wait().expect("wait") {
            return status;
        }
        assert!(start.elapsed() < within, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks a stream ended with an explicit abort: the abort chunk, an error
/// event naming the shutdown, `[DONE]`.
fn assert_explicit_abort(o: &Outcome) {
    assert!(o.terminated, "response cut silently: {o:?}");
    assert_eq!(o.status, 200, "{o:?}");
    let events: Vec<&str> = o
        .body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or(e))
        .collect();
    let n = events.len();
    assert!(n >= 3, "{o:?}");
    assert!(
        events[n - 3].contains(r#""finish_reason":"abort""#),
        "{o:?}"
    );
    assert!(
        events[n - 2].starts_with(r#"{"error":"#) && events[n - 2].contains("shutting down"),
        "{o:?}"
    );
    assert_eq!(events[n - 1], "[DONE]", "{o:?}");
}

/// What the client got.
#[derive(Debug)]
struct Outcome {
    stream: bool,
    max_tokens: u32,
    status: u16,
    /// The body, de-chunked.
    body: String,
    /// The response ended properly (terminating chunk, or the full content-length).
    terminated: bool,
}

/// Sum of the samples of `names` in the server's `/metrics` (read as a raw
/// HTTP response: the lenient parser skips the status line and headers).
fn metrics_sum(addr: SocketAddr, names: &[&str]) -> f64 {
    let mut conn = TcpStream::connect(addr).expect("connect");
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .expect("send");
    let mut text = String::new();
    conn.read_to_string(&mut text).expect("metrics");
    let samples = promtext::parse_lenient(&text).into_samples();
    names.iter().map(|n| promtext::sum(&samples, n, &[])).sum()
}

/// Sends one request and reads the whole response.
fn request(addr: SocketAddr, stream: bool, max_tokens: u32) -> Outcome {
    let body = format!(
        r#"{{"prompt":"shutdown test","max_tokens":{max_tokens},"ignore_eos":true,"stream":{stream}}}"#
    );
    let mut conn = TcpStream::connect(addr).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut reader = BufReader::new(conn);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("status line");
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let (mut chunked, mut length) = (false, None);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if lower == "transfer-encoding: chunked" {
            chunked = true;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse::<usize>().ok();
        }
    }
    let mut body = Vec::new();
    let terminated = if chunked {
        loop {
            let mut size = String::new();
            if reader.read_line(&mut size).unwrap_or(0) == 0 {
                break false;
            }
            let Ok(size) = usize::from_str_radix(size.trim_end(), 16) else {
                break false;
            };
            let mut chunk = vec![0; size + 2];
            if reader.read_exact(&mut chunk).is_err() {
                break false;
            }
            if size == 0 {
                break true;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        let _ = reader.read_to_end(&mut body);
        length == Some(body.len())
    };
    Outcome {
        stream,
        max_tokens,
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        terminated,
    }
}

#[test]
fn sigterm_under_load_ends_every_request_explicitly() {
    let (mut server, addr, _log) = start_server("2");
    // 40 streams and 10 full responses; a third ask for far more tokens than
    // 2 s of 2 ms steps can produce, so they must be cut by the timeout.
    let mut clients = Vec::new();
    for i in 0..50u32 {
        let stream = i % 5 != 0;
        let max_tokens = if i % 3 == 0 { 5000 } else { 20 + 15 * i };
        clients.push(std::thread::spawn(move || {
            request(addr, stream, max_tokens)
        }));
    }
    // SIGTERM once the engine has every request: running, waiting (32
    // sequences at most run at once) or already finished.
    wait_admitted(addr, 50.0);
    sigterm(&server);

    let outcomes: Vec<Outcome> = clients
        .into_iter()
        .map(|c| c.join().expect("client thread"))
        .collect();
    // The process exits by itself once drained.
    let exit = wait_exit(&mut server, Duration::from_secs(20));
    assert!(exit.success(), "exit status {exit:?}");

    let (mut complete, mut aborted) = (0, 0);
    for o in &outcomes {
        assert!(o.terminated, "response cut silently: {o:?}");
        if o.stream {
            assert_eq!(o.status, 200, "{o:?}");
            let events: Vec<&str> = o
                .body
                .split("\n\n")
                .filter(|e| !e.is_empty())
                .map(|e| e.strip_prefix("data: ").unwrap_or(e))
                .collect();
            assert_eq!(events.last(), Some(&"[DONE]"), "{o:?}");
            let finish = events
                .iter()
                .position(|e| e.contains(r#""finish_reason":""#))
                .unwrap_or_else(|| panic!("no finish: {o:?}"));
            if events[finish].contains(r#""finish_reason":"abort""#) {
                let error = events.get(finish + 1).copied().unwrap_or("");
                assert!(
                    error.starts_with(r#"{"error":"#)
                        && error.contains("the server is shutting down")
                        && error.contains("503"),
                    "an abort must say why: {o:?}"
                );
                aborted += 1;
            } else {
                assert!(
                    events[finish].contains(r#""finish_reason":"length""#),
                    "{o:?}"
                );
                assert!(
                    o.max_tokens < 5000,
                    "5000 tokens cannot finish in time: {o:?}"
                );
                complete += 1;
            }
        } else if o.status == 200 {
            assert!(o.body.contains(r#""finish_reason":"length""#), "{o:?}");
            complete += 1;
        } else {
            assert_eq!(o.status, 503, "{o:?}");
            assert!(o.body.contains("the server is shutting down"), "{o:?}");
            aborted += 1;
        }
    }
    assert!(complete > 0, "short requests finish during the drain");
    assert!(aborted > 0, "long requests are aborted at the timeout");
    assert_eq!(complete + aborted, outcomes.len());
}

/// A second SIGTERM during a long drain aborts the rest at once — still
/// with an explicit final event for every stream.
#[test]
fn a_second_sigterm_aborts_the_drain_explicitly() {
    let (mut server, addr, log) = start_server("600");
    let clients: Vec<_> = (0..10)
        .map(|_| std::thread::spawn(move || request(addr, true, 5000)))
        .collect();
    wait_admitted(addr, 10.0);
    sigterm(&server);
    // The first signal has been handled once the drain is logged.
    loop {
        let line = log
            .recv_timeout(Duration::from_secs(30))
            .expect("the drain is logged");
        if line.contains("shutting down") {
            break;
        }
    }
    sigterm(&server);
    for c in clients {
        assert_explicit_abort(&c.join().expect("client thread"));
    }
    // Far sooner than the 600 s drain.
    let exit = wait_exit(&mut server, Duration::from_secs(20));
    assert!(exit.success(), "exit status {exit:?}");
}
