//! Memory under an overload burst, measured on the server process alone.
//!
//! The in-process tests of `inferscope-server` share one process with the
//! other tests running beside them, so its RSS says nothing about one
//! server; here the server is the built binary, its own process.

#![cfg(target_os = "linux")]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The resident set of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {path} ({e}): the memory bound cannot be checked"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {path}: the memory bound cannot be checked"))
}

/// The status code and body of one whole `connection: close` response.
fn read_response(mut conn: TcpStream) -> (u16, String) {
    let mut text = String::new();
    conn.read_to_string(&mut text).expect("a whole response");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, text)
}

/// 500 requests sent at once against room for 8 running and 20 waiting:
/// each is answered (200 or 429), and the server's RSS grows by a few MiB
/// for the connections and their buffers; a leak per request of more than
/// ~130 KiB (64 MiB over 500) would show.
#[test]
fn an_overload_burst_leaves_the_servers_memory_bounded() {
    let (server, addr, _log) = common::start_server(&[
        "--executor",
        "sim",
        "--sim-profile",
        "tiny,t_weights_ms=1",
        "--max-num-seqs",
        "8",
        "--max-waiting-requests",
        "20",
    ]);
    let pid = server.0.id();
    // One request first, so the memory of a served request's first use
    // (thread stacks, buffers) is in the baseline.
    let warm = TcpStream::connect(addr).expect("connect");
    let body = r#"{"prompt":"warm up","max_tokens":4}"#;
    send(&warm, addr, body);
    assert_eq!(read_response(warm).0, 200);
    let before = rss_kib(pid);

    // All written before any is read: the server holds all 500 at once.
    let conns: Vec<TcpStream> = (0..500)
        .map(|i| {
            let conn = TcpStream::connect(addr).expect("connect");
            let max_tokens = 8 + i % 25;
            send(
                &conn,
                addr,
                &format!(r#"{{"prompt":"burst {i}","max_tokens":{max_tokens},"ignore_eos":true}}"#),
            );
            conn
        })
        .collect();
    let (mut ok, mut rejected) = (0, 0);
    for conn in conns {
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        match read_response(conn) {
            (200, _) => ok += 1,
            (429, _) => rejected += 1,
            (status, text) => panic!("unexpected {status}: {text}"),
        }
    }
    let after = rss_kib(pid);
    assert!(ok >= 28 && rejected > 0, "ok {ok}, rejected {rejected}");
    let grown_mib = after.saturating_sub(before) / 1024;
    eprintln!("RSS {before} -> {after} KiB over {ok} served and {rejected} refused");
    assert!(
        grown_mib < 64,
        "RSS grew {grown_mib} MiB ({before} -> {after} KiB)"
    );
}

/// Writes a completion request on `conn`.
fn send(mut conn: &TcpStream, addr: std::net::SocketAddr, body: &str) {
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
}
