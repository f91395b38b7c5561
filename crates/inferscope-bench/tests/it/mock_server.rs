//! Acceptance tests against the mock server: token counts are exact, failures
//! are counted, a dead server does not hang the run, the server-side view
//! agrees, sweeps and comparisons work. (Latency accuracy: `latency.rs`.)

use clap::Parser;
use inferscope_bench::mock::{MockConfig, MockServer};
use inferscope_bench::serve::run_serve;
use std::time::{Duration, Instant};

use crate::common;

use common::args;

fn within(got: f64, want: f64, tol: f64, what: &str) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got:.2} ms, want {want} ± {tol} ms"
    );
}

/// HTTP 500 and dropped connections are counted as failures with their errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted() {
    let mock = MockServer::start(MockConfig {
        fail_every: Some(3),
        drop_every: Some(5),
        ..Default::default()
    })
    .await
    .expect("mock starts");
    // Server request numbers 2..=11 (1 is the initial test): 500 at 3, 6, 9; drops at 5, 10.
    let a = args(
        &mock.base_url(),
        &[
            "--num-prompts",
            "10",
            "--random-input-len",
            "8",
            "--random-output-len",
            "6",
            "--max-concurrency",
            "1",
        ],
    );
    let out = run_serve(&a).await.expect("run completes");
    assert_eq!((out.metrics.completed, out.metrics.failed), (5, 5));
    assert_eq!(out.metrics.total_output, 5 * 6);
    let errors: Vec<&str> = out
        .outputs
        .iter()
        .filter(|o| !o.success)
        .map(|o| o.error.as_str())
        .collect();
    assert_eq!(
        errors.iter().filter(|e| e.starts_with("HTTP 500")).count(),
        3,
        "{errors:?}"
    );
    assert_eq!(
        errors
            .iter()
            .filter(|e| e.starts_with("stream broken"))
            .count(),
        2,
        "{errors:?}"
    );
}

/// A closed port fails at once; a server that accepts and never answers times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_server_does_not_hang() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let closed_addr = closed.local_addr().expect("addr");
    drop(closed);
    let t = Instant::now();
    let err = run_serve(&args(
        &format!("http://{closed_addr}"),
        &["--num-prompts", "2"],
    ))
    .await;
    assert!(err.is_err());
    assert!(t.elapsed() < Duration::from_secs(5));

    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let t = Instant::now();
    let err = run_serve(&args(
        &format!("http://{silent_addr}"),
        &["--num-prompts", "2", "--request-timeout", "0.5"],
    ))
    .await;
    let msg = err.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("no response"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(5));
    holder.abort();
}

/// Server-side view: counter deltas agree with the client's counts; the JSON is saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_metrics_and_save_result() {
    // `inferscope:` is how servers before the lint-clean names spelled the default.
    for ns in ["vllm", "inferscope", "inferscope:"] {
        let mock = MockServer::start(MockConfig {
            ttft: Duration::from_millis(20),
            metrics_namespace: Some(ns.to_string()),
            ..Default::default()
        })
        .await
        .expect("mock starts");
        let dir = std::env::temp_dir().join(format!("isb-result-{}-{ns}", std::process::id()));
        let a = args(
            &mock.base_url(),
            &[
                "--num-prompts",
                "6",
                "--random-input-len",
                "16",
                "--random-output-len",
                "4",
                "--scrape-metrics",
                "--scrape-interval",
                "0.05",
                "--save-result",
                "--result-dir",
                dir.to_str().expect("utf-8 path"),
                "--result-filename",
                "r.json",
                "--metadata",
                "gpu=none",
                "--goodput",
                "ttft:1000",
            ],
        );
        let out = run_serve(&a).await.expect("run succeeds");
        let v = out.server_view.expect("server view");
        assert_eq!(v.namespace, ns);
        assert_eq!(v.finished.values().sum::<f64>(), 6.0);
        assert_eq!(v.generation_tokens, Some(24.0));
        assert_eq!(v.prompt_tokens, Some(6.0 * 16.0));
        let ttft = v.ttft.expect("server ttft");
        within(ttft.mean_ms, 20.0, 0.001, "server TTFT mean");
        assert!(v.peaks.samples >= 1);
        let saved = std::fs::read_to_string(dir.join("r.json")).expect("result file");
        let json: serde_json::Value = serde_json::from_str(&saved).expect("valid JSON");
        assert_eq!(json["completed"], 6);
        assert_eq!(json["gpu"], "none");
        assert_eq!(json["request_rate"], "inf");
        assert!(json["p99_ttft_ms"].is_number());
        assert!(json["request_goodput"].as_f64().is_some_and(|g| g > 0.0));
        assert!(json.get("ttfts").is_none());
    }
    // No metrics endpoint: the run still succeeds, without a view.
    let mock = MockServer::start(MockConfig::default())
        .await
        .expect("mock starts");
    let out = run_serve(&args(
        &mock.base_url(),
        &["--num-prompts", "2", "--scrape-metrics"],
    ))
    .await
    .expect("run succeeds");
    assert!(out.server_view.is_none());
}

#[derive(Parser)]
struct SweepCli {
    #[command(flatten)]
    args: inferscope_bench::SweepArgs,
}

/// A sweep over two rates writes the table JSON and both plots; compare reads two results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_writes_plots_and_compare_reads_results() {
    let mock = MockServer::start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        ..Default::default()
    })
    .await
    .expect("mock starts");
    let dir = std::env::temp_dir().join(format!("isb-sweep-{}", std::process::id()));
    let base = mock.base_url();
    let d = dir.to_str().expect("utf-8 path");
    let argv = [
        "sweep",
        "--base-url",
        &base,
        "--model",
        "m",
        "--disable-tqdm",
        "--num-prompts",
        "4",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--request-rates",
        "50,inf",
        "--save-result",
        "--result-dir",
        d,
        "--result-filename",
        "run.json",
    ];
    let args = SweepCli::try_parse_from(argv)
        .expect("valid arguments")
        .args;
    let rows = inferscope_bench::sweep::run(&args)
        .await
        .expect("sweep runs");
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|(_, m)| m.completed == 4));
    for f in [
        "sweep_ttft.svg",
        "sweep_ttft.png",
        "sweep_tpot.svg",
        "sweep_tpot.png",
        "sweep.json",
    ] {
        let len = std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 100, "{f}: {len} bytes");
    }
    let a = inferscope_bench::compare::load(&dir.join("run-rate50.0.json")).expect("point 1");
    let b = inferscope_bench::compare::load(&dir.join("run-rateinf.json")).expect("point 2");
    let text = inferscope_bench::compare::render(&a, &b, "a", "b");
    assert!(text.contains("request_throughput:"));
    assert!(text.contains("p99_ttft_ms:"));
}

/// With `--tokenizer`, prompts have exact lengths and, without a usage chunk,
/// output tokens are the tokenizer's count of the text (not the chunk count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_counts_prompts_and_outputs() {
    let mut vocab = serde_json::Map::new();
    for i in 0..200 {
        vocab.insert(format!("t{i}"), serde_json::json!(i));
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    let dir = std::env::temp_dir().join(format!("isb-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).expect("write tokenizer");
    let mock = MockServer::start(MockConfig {
        send_usage: false,
        chunk_text: " t5 t6".to_string(),
        metrics_namespace: Some("inferscope".into()),
        ..Default::default()
    })
    .await
    .expect("mock starts");
    let a = args(
        &mock.base_url(),
        &[
            "--tokenizer",
            path.to_str().expect("utf-8 path"),
            "--num-prompts",
            "5",
            "--random-input-len",
            "30",
            "--random-prefix-len",
            "4",
            "--random-output-len",
            "7",
            "--scrape-metrics",
        ],
    );
    let out = run_serve(&a).await.expect("run succeeds");
    assert_eq!(out.metrics.total_input, 5 * 34);
    assert_eq!(out.metrics.total_output, 5 * 14, "two tokens per chunk");
    let v = out.server_view.expect("server view");
    assert_eq!(
        v.prompt_tokens,
        Some(5.0 * 34.0),
        "server counts words = tokens"
    );
    assert_eq!(out.result["input_tokens_counted_by"], "tokenizer");
    // Chat: the local tokenizer does not know the server's template, so its
    // prompt counts are labelled estimates (outputs are still counted exactly).
    let chat = args(
        &mock.base_url(),
        &[
            "--backend",
            "openai-chat",
            "--tokenizer",
            path.to_str().expect("utf-8 path"),
            "--num-prompts",
            "2",
            "--random-input-len",
            "6",
            "--random-output-len",
            "3",
        ],
    );
    let out = run_serve(&chat).await.expect("run succeeds");
    assert_eq!(out.result["input_tokens_counted_by"], "estimate");
    assert_eq!(out.result["output_tokens_counted_by"], "tokenizer");
}

/// A server that accepts only UUIDs as `x-request-id` (llama.cpp's): the
/// default ids pass, `--no-request-id` sends none, and a prefix that breaks
/// the UUID fails with an error that says what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_every_server_accepts() {
    let mock = MockServer::start(MockConfig {
        uuid_request_ids_only: true,
        ..Default::default()
    })
    .await
    .expect("mock starts");
    let base = mock.base_url();
    let out = run_serve(&args(&base, &["--num-prompts", "3"]))
        .await
        .expect("default ids are accepted");
    assert_eq!(out.metrics.completed, 3);
    let id = mock.last_request_id().expect("an id was sent");
    assert!(inferscope_bench::mock::is_uuid(&id), "{id}");
    // Version 4, variant 10xx.
    assert_eq!(id.as_bytes()[14], b'4', "{id}");
    assert!(
        matches!(id.as_bytes()[19], b'8' | b'9' | b'a' | b'b'),
        "{id}"
    );

    let out = run_serve(&args(&base, &["--num-prompts", "2", "--no-request-id"]))
        .await
        .expect("no id is accepted");
    assert_eq!(out.metrics.completed, 2);
    assert_eq!(mock.last_request_id(), None);

    let err = run_serve(&args(
        &base,
        &[
            "--num-prompts",
            "2",
            "--request-id-prefix",
            "run7-",
            "--ignore-eos",
        ],
    ))
    .await
    .err()
    .expect("the server refuses a non-UUID id");
    let msg = err.to_string();
    assert!(
        msg.contains("HTTP 400 Bad Request with an empty body"),
        "{msg}"
    );
    assert!(msg.contains("header x-request-id: run7-"), "{msg}");
    assert!(msg.contains("body fields ignore_eos"), "{msg}");
}

/// Without `--tokenizer`, a server that offers `/tokenize` and `/detokenize`
/// gives exact prompt lengths (its BOS included in the asked length) and,
/// without usage, exact output counts; the number of tokenizer calls stays
/// bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tokenizer_gives_exact_counts() {
    let mock = MockServer::start(MockConfig {
        tokenizer: true,
        send_usage: false,
        metrics_namespace: Some("inferscope".into()),
        ..Default::default()
    })
    .await
    .expect("mock starts");
    let a = args(
        &mock.base_url(),
        &[
            "--num-prompts",
            "8",
            "--random-input-len",
            "20",
            "--random-prefix-len",
            "4",
            "--random-output-len",
            "5",
            "--scrape-metrics",
        ],
    );
    let out = run_serve(&a).await.expect("run succeeds");
    // 4 prefix words + 19 words + BOS = 24 tokens as the server counts them.
    assert_eq!(out.metrics.total_input, 8 * 24);
    assert_eq!(out.metrics.total_output, 8 * 5);
    assert_eq!(out.result["input_tokens_counted_by"], "server_tokenize");
    assert_eq!(out.result["output_tokens_counted_by"], "server_tokenize");
    let v = out.server_view.expect("server view");
    assert_eq!(v.prompt_tokens, Some(8.0 * 24.0));
    assert_eq!(v.generation_tokens, Some(8.0 * 5.0));
    // The probe (3 calls), then a few calls per prompt: at least a decode and
    // an encode each and one count per output; here the prefix's last word and
    // the body's first merge, so most prompts take a second round.
    let calls = mock.tokenizer_calls();
    assert!(
        (3 + 8 * 2 + 8..=3 + 8 * 10).contains(&calls),
        "{calls} calls"
    );

    // ShareGPT through the server's tokenizer: prompts counted with the BOS,
    // output lengths are the replies' word counts.
    let sg = std::env::temp_dir().join(format!("isb-sg-tok-{}.json", std::process::id()));
    std::fs::write(
        &sg,
        r#"[{"conversations":[{"value":"one two three four five"},{"value":"a b c d e f"}]},
            {"conversations":[{"value":"six seven eight nine"},{"value":"g h i j"}]}]"#,
    )
    .expect("write");
    let calls_before = mock.tokenizer_calls();
    let sg_args = args(
        &mock.base_url(),
        &[
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            sg.to_str().expect("utf-8 path"),
            "--num-prompts",
            "4",
        ],
    );
    let sg_out = run_serve(&sg_args).await.expect("run succeeds");
    assert_eq!(sg_out.metrics.total_input, 2 * (6 + 5), "words + BOS");
    assert_eq!(sg_out.metrics.total_output, 2 * (6 + 4), "reply lengths");
    // Probe 3, two prompts and two replies counted once each, 4 outputs.
    assert_eq!(mock.tokenizer_calls() - calls_before, 3 + 2 + 2 + 4);
}

/// The server's usage is preferred to the dataset's count: a custom dataset
/// counted as ⌈chars/4⌉ (no tokenizer) reports the server's word counts.
/// With neither usage nor a tokenizer, the result says "estimate".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_preferred_and_estimates_are_labelled() {
    let dir = std::env::temp_dir().join(format!("isb-usage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("prompts.jsonl");
    // 4 words, 27 characters: the estimate (7) is not the server's count (4).
    std::fs::write(&path, "{\"prompt\":\"aaaaaa bbbbbb cccccc dddddd\"}\n").expect("write");
    for usage in [true, false] {
        let mock = MockServer::start(MockConfig {
            send_usage: usage,
            metrics_namespace: Some("inferscope".into()),
            ..Default::default()
        })
        .await
        .expect("mock starts");
        let a = args(
            &mock.base_url(),
            &[
                "--dataset-name",
                "custom",
                "--dataset-path",
                path.to_str().expect("utf-8 path"),
                "--custom-output-len",
                "3",
                "--num-prompts",
                "5",
                "--scrape-metrics",
            ],
        );
        let out = run_serve(&a).await.expect("run succeeds");
        let v = out.server_view.expect("server view");
        assert_eq!(v.prompt_tokens, Some(5.0 * 4.0));
        if usage {
            assert_eq!(out.metrics.total_input, 5 * 4, "the server's usage");
            assert_eq!(out.result["input_tokens_counted_by"], "usage");
            assert_eq!(out.result["output_tokens_counted_by"], "usage");
        } else {
            assert_eq!(out.metrics.total_input, 5 * 7, "⌈27 chars / 4⌉");
            assert_eq!(out.result["input_tokens_counted_by"], "estimate");
            assert_eq!(out.result["output_tokens_counted_by"], "estimate");
        }
        assert_eq!(out.metrics.total_output, 5 * 3);
    }
}
