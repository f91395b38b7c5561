//! Test support: start a server in-process on an ephemeral port, a small
//! HTTP client, an SSE reader, and the schema crate's exposition parser.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use inferscope_server::RunningServer;

/// Starts a server with the sim executor's `tiny` profile plus `flags`.
pub async fn start(flags: &[&str]) -> RunningServer {
    let mut all = Vec::new();
    if !flags.contains(&"--sim-profile") {
        all.extend(["--sim-profile", "tiny"]);
    }
    all.extend_from_slice(flags);
    inferscope_test_support::start_sim(&all).await
}

/// Starting (sim executor, `tiny` profile) with `flags` fails with a message holding each of `needles`.
pub async fn start_fails(flags: &[&str], needles: &[&str]) {
    let mut all = vec!["--sim-profile", "tiny"];
    all.extend_from_slice(flags);
    let err = inferscope_test_support::start_sim_error(&all).await;
    for n in needles {
        assert!(err.contains(n), "{err}");
    }
}

#[allow(unused_imports)] // each test file uses its own part
pub use inferscope_test_support::{Reply, call, client, post, send, sse_events};

pub use inferscope_schema::promtext::Sample;

/// Parses the exposition with the schema crate's parser; panics on a malformed line.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    inferscope_schema::promtext::parse(text)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_samples()
}

/// Sum of every sample named `name` whose labels include `filter`.
pub fn sum(samples: &[Sample], name: &str, filter: &[(&str, &str)]) -> f64 {
    inferscope_schema::promtext::sum(samples, name, filter)
}

/// Checks every histogram: buckets cumulative, `+Inf` equal to `_count`.
pub fn assert_histograms_well_formed(samples: &[Sample]) {
    let checked = inferscope_schema::promtext::check_histogram_samples(samples)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(checked > 0, "no histogram found");
}

/// Scrapes and parses `/metrics`.
pub async fn scrape(addr: SocketAddr) -> Vec<Sample> {
    let r = call(addr, "GET", "/metrics", "", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    parse_exposition(&r.body)
}

/// Scrapes until the samples named `name` sum to at least `at_least`. The
/// engine counts a finish before it delivers it (`engine/src/engine_core.rs`), but
/// a finish the server causes (a stop string, a client that left) reaches
/// the engine as an abort after the client has its response, and the HTTP
/// layer counts a response once its last byte is written, so a client can
/// see its response before those counters move.
pub async fn scrape_when(addr: SocketAddr, name: &str, at_least: f64) -> Vec<Sample> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let samples = scrape(addr).await;
        let value = sum(&samples, name, &[]);
        if value >= at_least {
            return samples;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} stayed at {value}, expected {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
