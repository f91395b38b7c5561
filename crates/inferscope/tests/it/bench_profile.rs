//! `bench serve --profile` against the built `inferscope serve --profile-dir`:
//! the bench starts the server's profiler before its run and stops it
//! after, so the profile holds exactly the run's requests; against a server
//! without a profile dir it fails before sending any load, saying why.

#![cfg(unix)]

use crate::common;

use serde_json::Value;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};

const PROMPTS: usize = 6;

/// `inferscope bench serve --profile` against `addr`, a few short requests
/// whose `x-request-id`s start with `bp-`.
fn bench_with_profile(addr: SocketAddr) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .env_remove("OPENAI_API_KEY")
        .args(["bench", "serve", "--base-url", &format!("http://{addr}")])
        .args(["--profile", "--disable-tqdm", "--ignore-eos"])
        .args(["--num-prompts", &PROMPTS.to_string()])
        .args(["--random-input-len", "16", "--random-output-len", "6"])
        .args(["--max-concurrency", "3", "--request-id-prefix", "bp-"])
        .output()
        .expect("bench runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The only file in `dir`, parsed.
fn only_profile(dir: &Path) -> Value {
    let files: Vec<_> = std::fs::read_dir(dir)
        .expect("the profile dir")
        .map(|e| e.expect("an entry").path())
        .collect();
    assert_eq!(files.len(), 1, "one profile: {files:?}");
    serde_json::from_slice(&std::fs::read(&files[0]).expect("readable")).expect("JSON")
}

#[test]
fn the_profile_covers_the_benchs_requests() {
    let dir = std::env::temp_dir().join(format!("inferscope-bench-profile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (_server, addr, _log) = common::start_server(&[
        "--executor",
        "sim",
        "--sim-profile",
        "tiny",
        "--data-parallel-size",
        "2",
        "--profile-dir",
        dir.to_str().expect("utf-8 path"),
    ]);
    let out = bench_with_profile(addr);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("Profile written by the server to"), "{said}");

    let trace = only_profile(&dir);
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    // Each request's track opens with its own id as the name; the initial
    // test request ran before the start, so only the run's are in it.
    let tracks: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "b" && e["cat"] == "request" && e["name"] == e["id"])
        .collect();
    let ids: BTreeSet<&str> = tracks.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), PROMPTS, "{ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("bp-")), "{ids:?}");
    assert!(
        tracks.iter().all(|e| e["args"]["finished"] == true),
        "the stop came after the run: every request finished inside the profile"
    );
    // The steps ran exactly these requests.
    let batched: BTreeSet<&str> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "step")
        .flat_map(|e| e["args"]["batch"].as_array().expect("batch").iter())
        .filter_map(|q| q["request_id"].as_str())
        .collect();
    assert_eq!(batched, ids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_a_profile_dir_the_bench_says_so_before_its_run() {
    let (_server, addr, _log) =
        common::start_server(&["--executor", "sim", "--sim-profile", "tiny"]);
    let out = bench_with_profile(addr);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("/start_profile: HTTP 404")
            && said.contains("not started with --profile-dir"),
        "{said}"
    );
    assert!(!said.contains("Successful requests"), "no run: {said}");
}
