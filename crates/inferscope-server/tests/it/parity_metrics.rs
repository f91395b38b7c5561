//! vLLM's 2025–2026 metrics on a running server, read back from `/metrics`:
//! exact values for a scripted workload of three requests on a KV cache of
//! eight blocks (a prefix hit, then an eviction of everything cached).

use crate::common;

use common::*;
use inferscope_engine::ScheduledBatch;
use inferscope_engine::SimProfile;
use inferscope_schema::schema::{self, names};
use serde_json::json;

fn m(name: &str) -> String {
    schema::namespaced_name("inferscope", name)
}

async fn complete(addr: std::net::SocketAddr, prompt: &[u32], done: f64) {
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Wait until the engine counted it, so the next request finds its blocks cached.
    scrape_when(addr, &format!("{}_total", m(names::REQUEST_SUCCESS)), done).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_vllm_metrics_have_exact_values() {
    let profile = "tiny,kv_tokens=32";
    let server = start(&[
        "--sim-profile",
        profile,
        "--block-size",
        "4",
        "--kv-cache-metrics",
        "--kv-cache-metrics-sample",
        "1",
        "--enable-mfu-metrics",
    ])
    .await;
    let addr = server.addr;
    let first: Vec<u32> = (10..22).collect();
    let mut second = first.clone();
    second.extend([40, 41, 42, 43]);
    let third: Vec<u32> = (100..128).collect();
    complete(addr, &first, 1.0).await;
    complete(addr, &second, 2.0).await;
    complete(addr, &third, 3.0).await;
    let s = scrape(addr).await;
    let v = |name: &str, labels: &[(&str, &str)]| sum(&s, &m(name), labels);
    let counter = |name: &str, labels: &[(&str, &str)]| v(&format!("{name}_total"), labels);

    // 12 + 16 + 28 prompt tokens; the second request found 3 blocks of 4 cached.
    assert_eq!(counter(names::PROMPT_TOKENS, &[]), 56.0);
    let by_source = names::PROMPT_TOKENS_BY_SOURCE;
    assert_eq!(counter(by_source, &[("source", "local_cache_hit")]), 12.0);
    assert_eq!(counter(by_source, &[("source", "local_compute")]), 44.0);
    assert_eq!(counter(names::PROMPT_TOKENS_CACHED, &[]), 12.0);
    let kv = names::REQUEST_PREFILL_KV_COMPUTED_TOKENS;
    assert_eq!(v(&format!("{kv}_sum"), &[]), 12.0 + 4.0 + 28.0);
    assert_eq!(v(&format!("{kv}_count"), &[]), 3.0);
    assert_eq!(v(&format!("{kv}_bucket"), &[("le", "5")]), 1.0);

    // Nothing waits at the end, and the reasons sum to the total.
    let reasons = names::NUM_REQUESTS_WAITING_BY_REASON;
    let capacity = v(reasons, &[("reason", "capacity")]);
    let deferred = v(reasons, &[("reason", "deferred")]);
    assert_eq!(capacity + deferred, v(names::NUM_REQUESTS_WAITING, &[]));
    assert_eq!(s.iter().filter(|x| x.name == m(reasons)).count(), 2);

    // Every block is sampled: the second request's 3 hits, then the third
    // request's 8 blocks evict the 4 full blocks the first two cached.
    let count = |name: &str| v(&format!("{name}_count"), &[]);
    assert_eq!(count(names::KV_BLOCK_REUSE_GAP_SECONDS), 3.0);
    assert_eq!(count(names::KV_BLOCK_LIFETIME_SECONDS), 4.0);
    assert_eq!(count(names::KV_BLOCK_IDLE_BEFORE_EVICT_SECONDS), 4.0);
    let lifetime = v(&format!("{}_sum", names::KV_BLOCK_LIFETIME_SECONDS), &[]);
    let idle = v(
        &format!("{}_sum", names::KV_BLOCK_IDLE_BEFORE_EVICT_SECONDS),
        &[],
    );
    assert!(lifetime > idle && idle > 0.0, "{lifetime} {idle}");

    // The sim's cost model over the nine steps (prefill, two decodes each).
    let cost = profile.parse::<SimProfile>().expect("profile").cost;
    // (start_pos, new tokens) of every step.
    let steps = [
        (0, 12),
        (12, 1),
        (13, 1),
        (12, 4),
        (16, 1),
        (17, 1),
        (0, 28),
        (28, 1),
        (29, 1),
    ];
    let (mut flops, mut read, mut write) = (0u64, 0u64, 0u64);
    for (start, n) in steps {
        let batch = one_seq_batch(start, n);
        let c = cost.step_cost(&batch);
        flops += c.flops as u64;
        read += c.read_bytes as u64;
        write += c.write_bytes as u64;
    }
    assert_eq!(counter(names::ESTIMATED_FLOPS_PER_GPU, &[]), flops as f64);
    assert_eq!(
        counter(names::ESTIMATED_READ_BYTES_PER_GPU, &[]),
        read as f64
    );
    assert_eq!(
        counter(names::ESTIMATED_WRITE_BYTES_PER_GPU, &[]),
        write as f64
    );
    // 50 tokens of 128 KiB of KV written.
    assert_eq!(write, 50 * 131_072);
    assert_histograms_well_formed(&s);
    server.shutdown(std::time::Duration::from_secs(5)).await;
}

fn one_seq_batch(start_pos: usize, num_tokens: usize) -> ScheduledBatch {
    ScheduledBatch {
        seqs: vec![inferscope_engine::ScheduledSeq::for_test(
            0, start_pos, num_tokens, 0,
        )],
        token_ids: vec![0; num_tokens],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flagged_metrics_are_absent_by_default_and_vllm_names_are_served() {
    let server = start(&["--metrics-namespace", "vllm"]).await;
    let addr = server.addr;
    complete_vllm(addr).await;
    let s = scrape(addr).await;
    let has = |name: &str| s.iter().any(|x| x.name.starts_with(name));
    assert!(has("vllm:num_requests_waiting_by_reason"));
    assert!(has("vllm:prompt_tokens_by_source_total"));
    assert!(has("vllm:request_prefill_kv_computed_tokens_bucket"));
    assert!(has("vllm:prompt_tokens_cached_total"));
    assert!(!has("vllm:kv_block_"), "behind --kv-cache-metrics");
    assert!(!has("vllm:estimated_"), "behind --enable-mfu-metrics");
    assert_eq!(
        sum(
            &s,
            "vllm:prompt_tokens_by_source_total",
            &[("source", "local_compute")]
        ),
        sum(&s, "vllm:prompt_tokens_total", &[])
    );
    server.shutdown(std::time::Duration::from_secs(5)).await;
}

async fn complete_vllm(addr: std::net::SocketAddr) {
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    scrape_when(addr, "vllm:request_success_total", 1.0).await;
}

/// A tiny sim server on a free local port, with `extra` flags.
fn sim_args(extra: &[&str]) -> inferscope_server::ServeArgs {
    let base = [
        "--executor",
        "sim",
        "--sim-profile",
        "tiny",
        "--port",
        "0",
        "--host",
        "127.0.0.1",
    ];
    inferscope_server::ServeArgs::try_parse_flags(base.iter().chain(extra)).expect("parses")
}

#[tokio::test]
async fn a_bad_sample_fraction_is_refused() {
    for bad in ["0", "1.5", "NaN", "-0.1"] {
        let args = sim_args(&[format!("--kv-cache-metrics-sample={bad}").as_str()]);
        let err = inferscope_server::start(&args)
            .await
            .err()
            .unwrap_or_else(|| panic!("{bad} accepted"));
        assert!(
            err.to_string().contains("--kv-cache-metrics-sample"),
            "{err}"
        );
    }
}

/// The cpu executor's estimates on a running server: one request of 5 prompt
/// tokens and 3 generated ones runs a 5-token prefill and two decodes, and the
/// counters equal the executor's cost model over exactly those steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_executor_serves_its_estimated_flops_and_bytes() {
    let args = inferscope_server::ServeArgs::try_parse_flags([
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "cpu",
        "--model",
        "demo-random",
        "--kv-cache-memory",
        "8000000",
        "--disable-log-stats",
        "--enable-mfu-metrics",
    ])
    .expect("flags");
    let server = inferscope_server::start(&args)
        .await
        .expect("server starts");
    let addr = server.addr;
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": [10, 11, 12, 13, 14], "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    scrape_when(addr, &format!("{}_total", m(names::REQUEST_SUCCESS)), 1.0).await;
    let s = scrape(addr).await;
    let counter = |name: &str| sum(&s, &m(&format!("{name}_total")), &[]);

    let model = inferscope_model::LoadedModel::load("demo-random", &Default::default()).unwrap();
    // The server's default KV cache is f16.
    let cost = inferscope_model::CpuCost::of(model.model(), inferscope_model::KvDtype::F16);
    let (mut flops, mut read, mut write) = (0u64, 0u64, 0u64);
    for (start, n) in [(0, 5), (5, 1), (6, 1)] {
        let c = cost.step_cost(&one_seq_batch(start, n));
        flops += c.flops as u64;
        read += c.read_bytes as u64;
        write += c.write_bytes as u64;
    }
    assert_eq!(counter(names::ESTIMATED_FLOPS_PER_GPU), flops as f64);
    assert_eq!(counter(names::ESTIMATED_READ_BYTES_PER_GPU), read as f64);
    assert_eq!(counter(names::ESTIMATED_WRITE_BYTES_PER_GPU), write as f64);
    // 7 tokens of f16 K and V: 2 · 4 layers · 4 KV heads · 32 dims · 2 bytes each.
    assert_eq!(write, 7 * 2048);
    server.shutdown(std::time::Duration::from_secs(5)).await;
}

/// A step budget below `--max-num-seqs` is refused at start, as vLLM does
/// (the first sequences would decode every step, the rest wait); equal is
/// accepted.
#[tokio::test]
async fn a_step_budget_below_max_num_seqs_is_refused() {
    let flags =
        |budget: &str| sim_args(&["--max-num-seqs", "64", "--max-num-batched-tokens", budget]);
    let err = inferscope_server::start(&flags("63"))
        .await
        .err()
        .expect("a budget of 63 for 64 sequences accepted");
    let msg = err.to_string();
    assert!(
        msg.contains("--max-num-batched-tokens (63)") && msg.contains("--max-num-seqs (64)"),
        "{msg}"
    );
    let server = inferscope_server::start(&flags("64"))
        .await
        .expect("a budget equal to --max-num-seqs");
    server.shutdown(std::time::Duration::from_secs(1)).await;
}
