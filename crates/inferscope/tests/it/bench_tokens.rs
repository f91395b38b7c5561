//! Exact tokens on both sides: `bench serve --scrape-metrics` against the
//! real server, with no `--tokenizer` on the bench side, builds its random
//! prompts through the server's `/tokenize` and `/detokenize`; the server's
//! prompt and generation counters (`/metrics` deltas, as the report's
//! server-side view shows them) must equal the client's totals exactly, and
//! every prompt must be exactly the length asked for.
//!
//! Runs the built binary for both sides (the bench crate does not depend on
//! the server crate), on the sim executor (byte tokenizer with BOS; and a
//! byte-level BPE `tokenizer.json` whose merges make decoded random ids
//! re-encode to other lengths) and on the cpu executor's built-in demo model.

#![cfg(unix)]

use crate::common;

use common::Server;
use inferscope_bench::mock::byte_level_bpe_json;
use inferscope_schema::promtext;
use inferscope_schema::schema::{self, MetricDef};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Starts `inferscope serve` with `args`; returns it and its address.
fn start_server(args: &[&str]) -> (Server, SocketAddr) {
    let (server, addr, _log) = common::start_server(args);
    (server, addr)
}

/// `GET /metrics` over HTTP/1.0 (so the body is not chunked).
fn metrics(addr: SocketAddr) -> promtext::Exposition {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    promtext::parse_lenient(body)
}

/// Sum over engines of a counter of the default namespace.
fn counter(expo: &promtext::Exposition, def: &MetricDef) -> f64 {
    promtext::sum(
        expo.samples(),
        &def.exposed_name(schema::DEFAULT_NAMESPACE),
        &[],
    )
}

/// Prompt and generation token counters.
fn tokens(addr: SocketAddr) -> (f64, f64) {
    let m = metrics(addr);
    (
        counter(&m, &schema::PROMPT_TOKENS),
        counter(&m, &schema::GENERATION_TOKENS),
    )
}

/// Runs `bench serve` against `addr`; its stdout and result JSON.
fn bench(addr: SocketAddr, dir: &Path, extra: &[&str]) -> (String, Value) {
    bench_as(addr, dir, extra, None)
}

/// [`bench`] with `OPENAI_API_KEY` set to `key` (unset without one).
fn bench_as(addr: SocketAddr, dir: &Path, extra: &[&str], key: Option<&str>) -> (String, Value) {
    let base = format!("http://{addr}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferscope"));
    match key {
        Some(k) => cmd.env("OPENAI_API_KEY", k),
        None => cmd.env_remove("OPENAI_API_KEY"),
    };
    let out = cmd
        .args([
            "bench",
            "serve",
            "--base-url",
            &base,
            "--scrape-metrics",
            "--scrape-interval",
            "0.05",
            "--disable-tqdm",
            "--ignore-eos",
            "--seed",
            "7",
            "--save-result",
            "--result-dir",
            dir.to_str().expect("utf-8 path"),
            "--result-filename",
            "r.json",
        ])
        .args(extra)
        .output()
        .expect("bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let saved = std::fs::read_to_string(dir.join("r.json")).expect("result file");
    (stdout, serde_json::from_str(&saved).expect("valid JSON"))
}

/// The `server / client` pair of a line of the server-side view.
fn server_client(report: &str, label: &str) -> (u64, u64) {
    let line = report
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{report}"));
    let value = line[label.len()..].trim();
    let nums: Vec<u64> = value
        .split(['/', ' '])
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(nums.len(), 2, "{line:?}");
    assert!(!line.contains("disagree"), "{line:?}");
    (nums[0], nums[1])
}

/// A fresh directory for one test's files, removed when dropped.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!(
        "inferscope-bench-tokens-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).expect("tmp dir");
    TempDir(d)
}

/// One random run of `n` prompts of `prefix + input` tokens and `output`
/// generated tokens: every count agrees, exactly.
fn exact_run(addr: SocketAddr, name: &str, n: u64, prefix: u64, input: u64, output: u64) {
    let dir = temp_dir(name);
    let before = tokens(addr);
    let (report, result) = bench(
        addr,
        &dir,
        &[
            "--num-prompts",
            &n.to_string(),
            "--random-prefix-len",
            &prefix.to_string(),
            "--random-input-len",
            &input.to_string(),
            "--random-output-len",
            &output.to_string(),
        ],
    );
    let after = tokens(addr);
    assert!(
        report.contains("Prompt lengths: exact, from the server's /tokenize"),
        "{report}"
    );
    assert!(!report.contains("estimated"), "{report}");
    let per_prompt = prefix + input;
    // The bench's own view: the server's deltas equal the client's totals,
    // and both are what was asked for.
    assert_eq!(
        server_client(&report, "Prompt tokens (server / client):"),
        (n * per_prompt, n * per_prompt),
        "{report}"
    );
    assert_eq!(
        server_client(&report, "Generated tokens (server / client):"),
        (n * output, n * output),
        "{report}"
    );
    assert_eq!(result["total_input_tokens"], json!(n * per_prompt));
    assert_eq!(result["total_output_tokens"], json!(n * output));
    assert_eq!(result["input_tokens_counted_by"], "usage");
    assert_eq!(result["output_tokens_counted_by"], "usage");
    // Independently of the bench's scraper: the counters moved by the run
    // plus its initial test request (one more prompt of the same shape).
    assert_eq!(after.0 - before.0, ((n + 1) * per_prompt) as f64);
    assert_eq!(after.1 - before.1, ((n + 1) * output) as f64);
}

#[test]
fn sim_server_and_bench_count_the_same_tokens() {
    let (_server, addr) = start_server(&["--executor", "sim", "--sim-profile", "tiny"]);
    // Byte tokenizer with BOS: the BOS is part of the asked input length.
    exact_run(addr, "sim", 16, 8, 64, 8);
    // Range of lengths, chat: the client counts what the server counts
    // (template included), whatever the lengths.
    let dir = temp_dir("sim-chat");
    let (report, result) = bench(
        addr,
        &dir,
        &[
            "--backend",
            "openai-chat",
            "--num-prompts",
            "12",
            "--random-input-len",
            "40",
            "--random-range-ratio",
            "0.5",
            "--random-output-len",
            "6",
        ],
    );
    let (server, client) = server_client(&report, "Prompt tokens (server / client):");
    assert_eq!(server, client, "{report}");
    assert_eq!(result["total_input_tokens"], json!(client));
    let (server, client) = server_client(&report, "Generated tokens (server / client):");
    assert_eq!((server, client), (12 * 6, 12 * 6), "{report}");
}

/// A byte-level BPE (the 256 byte symbols and a few merges) as `tokenizer.json`:
/// random ids decode to text that often re-encodes to another length.
fn byte_bpe(path: &Path) {
    let json = byte_level_bpe_json(&["Ġ t", "Ġ a", "t h", "h e", "Ġ th"]);
    std::fs::write(path, json).expect("write tokenizer");
}

#[test]
fn sim_server_with_a_bpe_tokenizer_counts_the_same_tokens() {
    let dir = temp_dir("bpe");
    let path = dir.join("tokenizer.json");
    byte_bpe(&path);
    let (_server, addr) = start_server(&[
        "--executor",
        "sim",
        "--sim-profile",
        "tiny",
        "--tokenizer",
        path.to_str().expect("utf-8 path"),
    ]);
    exact_run(addr, "bpe-run", 16, 6, 50, 5);
}

#[test]
fn cpu_random_demo_model_and_bench_count_the_same_tokens() {
    let (_server, addr) = start_server(&["--executor", "cpu", "--model", "demo-random"]);
    exact_run(addr, "cpu", 4, 0, 24, 4);
}

/// `inferscope serve` with no model flags: the trained demo model, whose
/// byte-level BPE merges the bench's random words into multi-byte pieces.
#[test]
fn default_server_and_bench_count_the_same_tokens() {
    let (_server, addr) = start_server(&[]);
    exact_run(addr, "default", 4, 5, 40, 4);
}

#[test]
fn the_bench_sends_its_key_to_find_the_model() {
    // A server with a key answers 401 to `/v1/models` without it: the bench
    // finds the model with the key it sends its requests with (and sends it
    // to `/metrics` too, for servers that keep their metrics behind one).
    let (_server, addr) = start_server(&[
        "--executor",
        "sim",
        "--sim-profile",
        "tiny",
        "--api-key",
        "k",
    ]);
    let dir = temp_dir("key");
    let (report, result) = bench_as(
        addr,
        &dir,
        &[
            "--num-prompts",
            "4",
            "--random-input-len",
            "16",
            "--random-output-len",
            "4",
        ],
        Some("k"),
    );
    assert_eq!(result["completed"], json!(4), "{report}");
    let (server, client) = server_client(&report, "Generated tokens (server / client):");
    assert_eq!((server, client), (16, 16), "{report}");
}
