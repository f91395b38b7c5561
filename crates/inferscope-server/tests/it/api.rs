//! The OpenAI contract: shapes of responses and stream chunks, parameters,
//! and bad input answered with 4xx and an OpenAI error body.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn error_of(r: &Reply) -> Value {
    let body = r.json();
    let err = body["error"].clone();
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        r.body
    );
    assert!(err["type"].is_string(), "{}", r.body);
    assert!(
        err.get("param").is_some() && err.get("code").is_some(),
        "{}",
        r.body
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_version() {
    let server = start(&["--served-model-name", "my-model", "other-name"]).await;
    let addr = server.addr;
    let models = call(addr, "GET", "/v1/models", "", &[]).await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "my-model");
    assert_eq!(models["data"][0]["root"], "demo");
    assert_eq!(models["data"][1]["id"], "other-name");
    assert_eq!(call(addr, "GET", "/health", "", &[]).await.status, 200);
    assert!(call(addr, "GET", "/version", "", &[]).await.json()["version"].is_string());
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "other-name", "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status, 200, "any served name works");
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_stream_shape_usage_and_request_id() {
    let server = start(&[]).await;
    let addr = server.addr;
    // `ignore_eos` only keeps going past an EOS (as in vLLM), which then
    // decodes to nothing; `min_tokens` masks it, so every token is a byte.
    let body = json!({"model": "demo", "prompt": "Hello", "max_tokens": 7, "min_tokens": 7, "ignore_eos": true,
                      "stream": true, "stream_options": {"include_usage": true}});
    let r = call(
        addr,
        "POST",
        "/v1/completions",
        &body.to_string(),
        &[("x-request-id", "req-42")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-request-id"], "req-42");
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let events = sse_events(&r.body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect();
    let (usage, tokens) = chunks.split_last().expect("chunks");
    assert_eq!(usage["choices"], json!([]), "usage chunk has empty choices");
    assert_eq!(usage["usage"]["completion_tokens"], 7);
    assert_eq!(
        usage["usage"]["prompt_tokens"].as_u64().map(|p| p > 0),
        Some(true)
    );
    assert_eq!(
        tokens.len(),
        7,
        "one chunk per token with the byte tokenizer"
    );
    for (i, c) in tokens.iter().enumerate() {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["id"], "cmpl-req-42");
        assert_eq!(c["choices"][0]["index"], 0);
        assert!(c["choices"][0]["logprobs"].is_null());
        assert!(!c["choices"][0]["text"].as_str().unwrap_or("").is_empty());
        let finish = &c["choices"][0]["finish_reason"];
        if i + 1 == tokens.len() {
            assert_eq!(
                finish, "length",
                "the last token's chunk carries the finish"
            );
        } else {
            assert!(finish.is_null());
        }
    }
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_full_and_stream() {
    let server = start(&[]).await;
    let addr = server.addr;
    let messages = json!([{"role": "system", "content": "be brief"},
                          {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]);
    let r = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_completion_tokens": 5, "min_tokens": 5, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // With `min_tokens` masking EOS, each of the 5 tokens is one printable byte.
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().map(str::len),
        Some(5)
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);

    let r = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 4, "min_tokens": 4, "ignore_eos": true, "stream": true}),
    )
    .await;
    let events = sse_events(&r.body);
    assert_eq!(events.len(), 5, "4 chunks and [DONE]: {events:?}");
    let first: Value = serde_json::from_str(&events[0]).expect("json");
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(
        first["choices"][0]["delta"]["role"], "assistant",
        "role rides with the first token"
    );
    assert!(first["choices"][0]["delta"]["content"].is_string());
    for e in &events[1..4] {
        let c: Value = serde_json::from_str(e).expect("json");
        assert!(
            c["choices"][0].get("delta").is_some(),
            "delta always present"
        );
        assert!(c["choices"][0]["delta"].get("role").is_none());
    }
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_seeds_and_batched_prompts() {
    let server = start(&[]).await;
    let addr = server.addr;
    let body = json!({"prompt": "same", "max_tokens": 12, "ignore_eos": true, "n": 3, "seed": 11});
    let a = post(addr, "/v1/completions", &body).await.json();
    let b = post(addr, "/v1/completions", &body).await.json();
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .expect("choices")
            .iter()
            .map(|c| c["text"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    assert_eq!(texts(&a).len(), 3);
    assert_eq!(texts(&a), texts(&b), "a seed makes the output repeatable");
    assert_ne!(texts(&a)[0], texts(&a)[1], "choices differ");
    assert_eq!(a["usage"]["completion_tokens"], 36);

    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ["one", "two"], "max_tokens": 2, "ignore_eos": true}),
    )
    .await
    .json();
    assert_eq!(r["choices"].as_array().map(Vec::len), Some(2));
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": [72, 105], "max_tokens": 2, "ignore_eos": true}),
    )
    .await
    .json();
    assert_eq!(r["usage"]["prompt_tokens"], 2);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_requests_repeat_on_the_sim() {
    // Clients check stop strings and caching by sending one greedy request
    // twice: as with a model's argmax, the same prompt gives the same tokens
    // (whatever the seed or choice), and another prompt gives others.
    let server = start(&[]).await;
    let addr = server.addr;
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .expect("choices")
            .iter()
            .map(|c| c["text"].as_str().expect("text").to_owned())
            .collect()
    };
    let greedy = |prompt: &str, extra: Value| {
        let mut body =
            json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
        body.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        body
    };
    let a = texts(
        &post(addr, "/v1/completions", &greedy("hi", json!({})))
            .await
            .json(),
    );
    let b = texts(
        &post(addr, "/v1/completions", &greedy("hi", json!({})))
            .await
            .json(),
    );
    assert_eq!(a, b, "the same greedy request twice");
    let c = texts(
        &post(
            addr,
            "/v1/completions",
            &greedy("hi", json!({"n": 2, "seed": 5})),
        )
        .await
        .json(),
    );
    assert_eq!(
        c,
        [a[0].clone(), a[0].clone()],
        "seed and choice change nothing"
    );
    let d = texts(
        &post(addr, "/v1/completions", &greedy("bye", json!({})))
            .await
            .json(),
    );
    assert_ne!(a, d, "another prompt, other tokens");
    // Sampling without a seed still differs between requests.
    let sampled = json!({"prompt": "hi", "max_tokens": 8, "ignore_eos": true});
    let s1 = texts(&post(addr, "/v1/completions", &sampled).await.json());
    let s2 = texts(&post(addr, "/v1/completions", &sampled).await.json());
    assert_ne!(s1, s2, "unseeded sampling");
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_and_min_tokens() {
    let server = start(&[]).await;
    let addr = server.addr;
    let base = json!({"prompt": "abc", "max_tokens": 60, "ignore_eos": true, "seed": 5});
    let full = post(addr, "/v1/completions", &base).await.json();
    let text = full["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    let stop = &text[20..22];
    let cut = text.find(stop).expect("stop present");
    let mut with_stop = base.clone();
    with_stop["stop"] = json!([stop]);
    let r = post(addr, "/v1/completions", &with_stop).await.json();
    assert_eq!(r["choices"][0]["text"], text[..cut]);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    with_stop["stream"] = json!(true);
    let s = post(addr, "/v1/completions", &with_stop).await;
    let events = sse_events(&s.body);
    let mut streamed = String::new();
    let mut last_finish = Value::Null;
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).expect("json");
        streamed.push_str(c["choices"][0]["text"].as_str().unwrap_or(""));
        last_finish = c["choices"][0]["finish_reason"].clone();
    }
    assert_eq!(streamed, text[..cut]);
    assert_eq!(last_finish, "stop");

    // All three requests counted (one `length`, two `stop`). A stop string
    // is found in the server, which then ends the engine request: the engine
    // counts that finish just after the client has seen it, so wait for the
    // total, not for any two.
    let samples = scrape_when(addr, "inferscope_request_success_total", 3.0).await;
    assert_eq!(
        sum(
            &samples,
            "inferscope_request_success_total",
            &[("finished_reason", "stop")]
        ),
        2.0
    );
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_4xx_with_an_openai_error() {
    let server = start(&["--max-model-len", "64", "--max-request-body-bytes", "4096"]).await;
    let addr = server.addr;
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/completions", "{not json".into(), 400, None),
        (
            "/v1/completions",
            json!({"prompt": 5}).to_string(),
            400,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": "ten"}).to_string(),
            400,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": -4}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"model": "gpt-9", "prompt": "x"}).to_string(),
            404,
            Some("model"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "y".repeat(80)}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 100}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": []}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"max_tokens": 3}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "n": 0}).to_string(),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": -0.5}).to_string(),
            400,
            Some("temperature"),
        ),
        ("/v1/completions", "z".repeat(5000), 413, None),
        (
            "/v1/chat/completions",
            json!({"messages": []}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})
                .to_string(),
            400,
            Some("max_completion_tokens"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hello"}).to_string(),
            400,
            None,
        ),
    ];
    for (path, body, status, param) in cases {
        let r = call(addr, "POST", path, &body, &[]).await;
        assert_eq!(r.status, status, "{path} {body:.60}: {}", r.body);
        let err = error_of(&r);
        if let Some(p) = param {
            assert_eq!(err["param"], p, "{body:.60}: {}", r.body);
        }
    }
    // The long prompt's message names both numbers.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 100}),
    )
    .await;
    let msg = error_of(&r)["message"].as_str().unwrap_or("").to_owned();
    assert!(msg.contains("64") && msg.contains("100"), "{msg}");
    // Nothing leaked: the engine is idle and healthy.
    let samples = scrape(addr).await;
    assert_eq!(sum(&samples, "inferscope_num_requests_running", &[]), 0.0);
    assert_eq!(sum(&samples, "inferscope_request_success_total", &[]), 0.0);
    assert_eq!(call(addr, "GET", "/health", "", &[]).await.status, 200);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_v1_only() {
    let server = start(&["--api-key", "s3cret"]).await;
    let addr = server.addr;
    let r = call(addr, "GET", "/v1/models", "", &[]).await;
    assert_eq!(r.status, 401);
    error_of(&r);
    assert_eq!(
        call(
            addr,
            "GET",
            "/v1/models",
            "",
            &[("authorization", "Bearer wrong")]
        )
        .await
        .status,
        401
    );
    assert_eq!(
        call(
            addr,
            "GET",
            "/v1/models",
            "",
            &[("authorization", "Bearer s3cret")]
        )
        .await
        .status,
        200
    );
    assert_eq!(call(addr, "GET", "/health", "", &[]).await.status, 200);
    assert_eq!(call(addr, "GET", "/metrics", "", &[]).await.status, 200);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_limit_answers_429() {
    // One sequence at a time, slow steps: the queue fills.
    let server = start(&[
        "--max-num-seqs",
        "1",
        "--max-waiting-requests",
        "2",
        "--sim-profile",
        "tiny,t_weights_ms=5",
    ])
    .await;
    let addr = server.addr;
    let mut tasks = Vec::new();
    for i in 0..8 {
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 15)).await;
            post(
                addr,
                "/v1/completions",
                &json!({"prompt": "q", "max_tokens": 20, "ignore_eos": true}),
            )
            .await
            .status
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("task"));
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(statuses.contains(&200), "{statuses:?}");
    let samples = scrape(addr).await;
    let rejected = sum(&samples, "inferscope_admission_rejections_total", &[]);
    assert_eq!(
        rejected,
        statuses.iter().filter(|&&s| s == 429).count() as f64
    );
    server.shutdown(Duration::from_secs(5)).await;
}
