//! Contract points fixed by the server redesign: sampling parameters out of
//! range are refused by name, error types are snake_case, and
//! `cache_config_info` names the KV cache's real element type.

use crate::common;

use std::time::Duration;

use common::*;
use inferscope_server::ServeArgs;
use serde_json::json;

/// `repetition_penalty` is vLLM's (> 0): 0 and negative values are a 400
/// naming it, any positive value is accepted (the sampler applies it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repetition_penalty_must_be_positive() {
    let server = start(&[]).await;
    let addr = server.addr;
    for (path, mut body) in [
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 2})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ),
    ] {
        for bad in [0.0, -1.0] {
            body["repetition_penalty"] = json!(bad);
            let r = post(addr, path, &body).await;
            assert_eq!(r.status, 400, "{path}: {}", r.body);
            let err = &r.json()["error"];
            assert_eq!(err["param"], "repetition_penalty", "{}", r.body);
            assert_eq!(err["type"], "invalid_request_error", "{}", r.body);
        }
        for ok in [0.5, 1.0, 1.3] {
            body["repetition_penalty"] = json!(ok);
            let r = post(addr, path, &body).await;
            assert_eq!(r.status, 200, "{path}: {}", r.body);
        }
    }
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_errors_are_snake_case() {
    let server = start(&[]).await;
    let addr = server.addr;
    let route = call(addr, "GET", "/no/such/route", "", &[]).await;
    assert_eq!(route.status, 404);
    assert_eq!(route.json()["error"]["type"], "not_found_error");
    let model = post(
        addr,
        "/v1/completions",
        &json!({"model": "other", "prompt": "hi"}),
    )
    .await;
    assert_eq!(model.status, 404);
    assert_eq!(model.json()["error"]["type"], "not_found_error");
    assert_eq!(model.json()["error"]["param"], "model");
    server.shutdown(Duration::from_secs(5)).await;
}

/// The `cache_dtype` label of `cache_config_info`.
async fn cache_dtype(addr: std::net::SocketAddr) -> Option<String> {
    scrape(addr)
        .await
        .into_iter()
        .find(|s| s.name == "inferscope_cache_config_info")
        .and_then(|s| s.labels.get("cache_dtype").cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_config_info_names_the_real_kv_dtype() {
    // The sim's profiles model bf16 KV caches.
    let sim = start(&[]).await;
    assert_eq!(cache_dtype(sim.addr).await.as_deref(), Some("bfloat16"));
    sim.shutdown(Duration::from_secs(5)).await;
    // The cpu executor's KV pool is f16 by default, even with bf16 weights.
    let args = ServeArgs::try_parse_flags([
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "cpu",
        "--model",
        "demo",
        "--dtype",
        "bfloat16",
        "--kv-cache-memory",
        "8000000",
        "--disable-log-stats",
    ])
    .expect("flags");
    let cpu = inferscope_server::start(&args)
        .await
        .expect("cpu server starts");
    assert_eq!(cache_dtype(cpu.addr).await.as_deref(), Some("float16"));
    cpu.shutdown(Duration::from_secs(5)).await;
}

/// `--tokenizer` gives the sim executor a real `tokenizer.json`: prompts are
/// counted in its tokens, not bytes; a missing file stops the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_serves_the_tokenizer_it_is_given() {
    let dir = std::env::temp_dir().join(format!("inferscope-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut vocab = serde_json::Map::new();
    for (i, w) in ["[UNK]", "hello", "world"].iter().enumerate() {
        vocab.insert((*w).into(), json!(i));
    }
    // Room for the sim's sampled ids (printable ASCII codes).
    for i in 3..300 {
        vocab.insert(format!("w{i}"), json!(i));
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer.to_string()).expect("write tokenizer.json");
    let path = path.to_string_lossy().into_owned();
    let server = start(&["--tokenizer", &path]).await;
    let r = post(
        server.addr,
        "/v1/completions",
        &json!({"prompt": "hello world hello", "max_tokens": 2, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["prompt_tokens"], 3, "{}", r.body);
    server.shutdown(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&dir);

    let missing = dir.join("missing.json").to_string_lossy().into_owned();
    let args = ServeArgs::try_parse_flags([
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "sim",
        "--tokenizer",
        missing.as_str(),
        "--disable-log-stats",
    ])
    .expect("flags");
    assert!(inferscope_server::start(&args).await.is_err());
}
