//! Starting the built `inferscope serve` for the binary's tests.

#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Kills the server when the test ends, however it ends.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes ANSI colour sequences from a log line.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Starts `inferscope serve --host 127.0.0.1 --port 0 --disable-log-stats`
/// with `args`; returns it, its address (from the start-up log line) and the
/// rest of its log lines (colour stripped, echoed to the test's stderr).
pub fn start_server(args: &[&str]) -> (Server, SocketAddr, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--disable-log-stats",
        ])
        .args(args)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Keep draining so the server never blocks on a full pipe.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let line = strip_ansi(&line);
            eprintln!("server: {line}");
            let _ = tx.send(line);
        }
    });
    let server = Server(child);
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the server logs its address");
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap_or("").to_owned();
        }
    };
    (server, addr.parse().expect("an address"), rx)
}
