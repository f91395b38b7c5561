//! Logs an operator can ship: the real binary with stderr to a pipe (as a
//! log file or a shipper sees it) writes no colour escapes, `--log-format
//! json` writes one JSON object per line, the periodic `Engine 000: ...`
//! line keeps its text, and a bad sim profile is a clear start-up error.

#![cfg(unix)]

use crate::common;

use common::Server;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Runs `inferscope [global] serve` (sim `tiny`, stats every 0.2 s, then
/// `extra`) with stderr piped; passes each line to `done` until it says the
/// run has shown enough (60 s at most); returns the log lines.
fn serve_logs_until(
    global: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
    mut done: impl FnMut(&str) -> bool,
) -> Vec<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferscope"));
    cmd.args(global)
        .args([
            "serve",
            "--executor",
            "sim",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-stats-interval",
            "0.2",
        ])
        .args(extra)
        .env_remove("NO_COLOR")
        .env_remove("INFERSCOPE_LOG_FORMAT")
        // Idle stats lines after the first are debug: show them all.
        .env("RUST_LOG", "info,inferscope::stats=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if !extra.contains(&"--sim-profile") {
        cmd.args(["--sim-profile", "tiny"]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("the binary starts");
    let stderr = child.stderr.take().expect("stderr");
    let server = Server(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let enough = done(&line);
                lines.push(line);
                if enough {
                    break;
                }
            }
            Err(_) => panic!("the expected lines did not come within 60 s; got {lines:#?}"),
        }
    }
    drop(server);
    lines
}

/// [`serve_logs_until`] the first periodic stats line.
fn serve_logs(global: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    serve_logs_until(global, &[], env, |l| l.contains("Engine 000: "))
}

fn assert_plain(lines: &[String]) {
    for l in lines {
        assert!(
            !l.contains('\u{1b}'),
            "an escape sequence in a piped log: {l:?}"
        );
    }
}

#[test]
fn text_logs_to_a_pipe_have_no_colour_and_keep_the_stats_line() {
    let lines = serve_logs(&[], &[]);
    assert_plain(&lines);
    let stats = lines
        .iter()
        .find(|l| l.contains("Engine 000: "))
        .expect("stats line");
    // The text after the target is exactly the stats line.
    let text = stats
        .split_once("inferscope::stats: ")
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("{stats:?}"));
    assert!(
        text.starts_with("Engine 000: Avg prompt throughput: "),
        "{text:?}"
    );
    // NO_COLOR is honoured as well (here it is a pipe anyway).
    assert_plain(&serve_logs(&[], &[("NO_COLOR", "1")]));
}

/// Every line is a JSON object with the keys a shipper indexes.
fn assert_json_lines_only(lines: &[String]) {
    assert!(lines.len() >= 2, "{lines:#?}");
    assert_plain(lines);
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
        for key in ["timestamp", "level", "target"] {
            assert!(v[key].is_string(), "no {key}: {l}");
        }
        assert!(v["fields"]["message"].is_string(), "no message: {l}");
    }
}

fn assert_json_lines(lines: &[String]) {
    assert_json_lines_only(lines);
    let listening = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["addr"].is_string())
        .expect("a line with a structured field");
    assert_eq!(listening["level"], "INFO");
    let stats = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["target"] == "inferscope::stats")
        .expect("stats line");
    assert!(
        stats["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Engine 000: Avg prompt throughput: ")),
        "{stats}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    assert_json_lines(&serve_logs(&["--log-format", "json"], &[]));
    assert_json_lines(&serve_logs(&[], &[("INFERSCOPE_LOG_FORMAT", "json")]));
}

/// Sends one completion request and reads the reply to its end.
fn complete_once(addr: &str) -> String {
    let body = r#"{"prompt":"hi","max_tokens":8,"ignore_eos":true}"#;
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply
}

/// An engine thread that panics, in JSON format: the panic itself and the
/// engine's account of it are JSON events too, so no line breaks a shipper.
#[test]
fn a_panic_is_logged_as_json() {
    let mut reply = None;
    let lines = serve_logs_until(
        &["--log-format", "json"],
        &[
            "--sim-profile",
            "tiny,die_by_panic=1",
            "--sim-die-after-steps",
            "1",
        ],
        &[],
        |l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
            if let Some(addr) = v["fields"]["addr"].as_str().filter(|_| reply.is_none()) {
                reply = Some(complete_once(addr));
            }
            v["fields"]["message"] == "engine core panicked; failing its requests"
        },
    );
    assert_json_lines_only(&lines);
    let events: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let panic = events
        .iter()
        .find(|v| v["target"] == "panic")
        .expect("the panic as an event");
    assert_eq!(panic["level"], "ERROR");
    assert!(
        panic["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("simulated device panic after 1 steps")),
        "{panic}"
    );
    assert_eq!(panic["fields"]["thread"], "engine-core-0");
    let death = events.last().expect("events");
    assert_eq!(death["fields"]["engine"], 0, "{death}");
    assert!(
        death["fields"]["error"]
            .as_str()
            .is_some_and(|m| m.starts_with("engine core panicked: ")),
        "{death}"
    );
    let reply = reply.unwrap_or_default();
    assert!(reply.starts_with("HTTP/1.1 500"), "{reply}");
    assert!(reply.contains("engine core panicked"), "{reply}");
}

#[test]
fn an_out_of_range_sim_profile_is_a_clear_start_up_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .args([
            "serve",
            "--executor",
            "sim",
            "--sim-profile",
            "tiny,t_fixed_ms=1e300",
            "--port",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--sim-profile")
            && stderr.contains("t_fixed_ms")
            && stderr.contains("out of range"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
