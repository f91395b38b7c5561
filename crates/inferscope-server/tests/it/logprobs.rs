//! Log-probabilities in OpenAI's and vLLM's shapes, on the sim executor
//! (whose synthetic distribution makes every value known: the chosen token
//! has ln ½ − ln(1 − 2⁻²⁵⁸), the next ids in turn half as likely each).

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

/// The sim's log-probability of the token at `rank` (0: the chosen one).
fn sim_logprob(rank: u32) -> f64 {
    0.5f64.ln() * f64::from(rank + 1) - (1.0 - 0.5f64.powi(258)).ln()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-5)
}

/// Completions `logprobs: 3`: the four lists, one entry per token, the
/// token texts making up the text, offsets counting their characters, the
/// chosen token's value and a map of the 3 most likely (the chosen one
/// first); streamed, the same entries spread over the chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_logprobs_shape_and_values() {
    let server = start(&[]).await;
    let addr = server.addr;
    let req =
        json!({"prompt": "Hello", "max_tokens": 6, "ignore_eos": true, "seed": 5, "logprobs": 3});
    let r = post(addr, COMPLETIONS, &req).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let choice = &r.json()["choices"][0];
    assert_eq!(
        keys(choice),
        set(&["index", "text", "logprobs", "finish_reason"])
    );
    let lp = &choice["logprobs"];
    assert_eq!(
        keys(lp),
        set(&["text_offset", "token_logprobs", "tokens", "top_logprobs"])
    );
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 6);
    assert_eq!(tokens.concat(), choice["text"].as_str().unwrap());
    let mut offset = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(lp["text_offset"][i], offset, "offset {i}");
        offset += t.chars().count();
        assert!(close(&lp["token_logprobs"][i], sim_logprob(0)), "{lp}");
        let top = lp["top_logprobs"][i].as_object().expect("a map");
        // The chosen token is the most likely: 3 entries, not 4.
        assert_eq!(top.len(), 3, "{top:?}");
        let mut values: Vec<f64> = top.values().map(|v| v.as_f64().unwrap()).collect();
        values.sort_by(|a, b| b.total_cmp(a));
        for (k, v) in values.iter().enumerate() {
            assert!((v - sim_logprob(k as u32)).abs() < 1e-5, "{top:?}");
        }
        assert!(close(&top[*t], sim_logprob(0)), "the token itself: {top:?}");
    }
    // Streamed: the same tokens and values, offsets continuing.
    let mut s = req.clone();
    s["stream"] = json!(true);
    let events = sse_events(&post(addr, COMPLETIONS, &s).await.body);
    let mut streamed = Vec::new();
    let mut offsets = Vec::new();
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        let l = &c["choices"][0]["logprobs"];
        if l.is_null() {
            continue;
        }
        for (i, t) in l["tokens"].as_array().unwrap().iter().enumerate() {
            streamed.push(t.as_str().unwrap().to_owned());
            offsets.push(l["text_offset"][i].as_u64().unwrap());
            assert!(close(&l["token_logprobs"][i], sim_logprob(0)));
            assert_eq!(l["top_logprobs"][i].as_object().unwrap().len(), 3);
        }
    }
    assert_eq!(streamed, tokens);
    let want: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(offsets, want);
    // Without the field: null, and no `prompt_logprobs` key.
    let r = post(addr, COMPLETIONS, &json!({"prompt": "Hi", "max_tokens": 2})).await;
    let choice = &r.json()["choices"][0];
    assert!(choice["logprobs"].is_null());
    assert!(choice.get("prompt_logprobs").is_none());
    // `logprobs: 0`: the chosen token only.
    let r = post(
        addr,
        COMPLETIONS,
        &json!({"prompt": "Hi", "max_tokens": 2, "logprobs": 0}),
    )
    .await;
    let top = &r.json()["choices"][0]["logprobs"]["top_logprobs"][0];
    assert_eq!(top.as_object().unwrap().len(), 1, "{top}");
    server.shutdown(Duration::from_secs(5)).await;
}

/// Chat `logprobs: true, top_logprobs: 2`: `content` entries with exactly
/// token, logprob, bytes (the token's UTF-8) and 2 top entries; without
/// `top_logprobs` the list is empty; streamed, the same entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs_shape_and_values() {
    let server = start(&[]).await;
    let addr = server.addr;
    let req = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5, "ignore_eos": true, "seed": 2,
        "logprobs": true, "top_logprobs": 2,
    });
    let r = post(addr, CHAT, &req).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let choice = &r.json()["choices"][0];
    assert_eq!(keys(&choice["logprobs"]), set(&["content"]));
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    let mut text = String::new();
    for e in content {
        assert_eq!(keys(e), set(&["token", "logprob", "bytes", "top_logprobs"]));
        let token = e["token"].as_str().unwrap();
        text.push_str(token);
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, token.as_bytes());
        assert!(close(&e["logprob"], sim_logprob(0)));
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        for (k, t) in top.iter().enumerate() {
            assert_eq!(keys(t), set(&["token", "logprob", "bytes"]));
            assert!(close(&t["logprob"], sim_logprob(k as u32)));
        }
        assert_eq!(top[0]["token"], e["token"], "greedy-like: the token first");
    }
    assert_eq!(text, choice["message"]["content"].as_str().unwrap());
    let mut s = req.clone();
    s["stream"] = json!(true);
    let events = sse_events(&post(addr, CHAT, &s).await.body);
    let mut streamed = Vec::new();
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        if let Some(entries) = c["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(entries.iter().cloned());
        }
    }
    assert_eq!(&streamed, content);
    // `logprobs` alone: each token's value, no alternatives.
    let mut only = req.clone();
    only.as_object_mut().unwrap().remove("top_logprobs");
    let r = post(addr, CHAT, &only).await.json();
    let e = &r["choices"][0]["logprobs"]["content"][0];
    assert_eq!(e["top_logprobs"], json!([]));
    let r = post(
        addr,
        CHAT,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    )
    .await;
    assert!(r.json()["choices"][0]["logprobs"].is_null());
    server.shutdown(Duration::from_secs(5)).await;
}

/// `echo` with `logprobs` and `max_tokens: 0` (a harness scoring a prompt):
/// the text is the prompt, one entry per prompt token, the first null;
/// streamed, the same in the first chunk. vLLM's `prompt_logprobs`: per
/// position null then `{id: {logprob, rank, decoded_token}}`, on completion
/// choices and at the chat response's top level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_and_prompt_logprobs() {
    let server = start(&[]).await;
    let addr = server.addr;
    let req = json!({"prompt": "Hello", "max_tokens": 0, "echo": true, "logprobs": 1});
    let r = post(addr, COMPLETIONS, &req).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["text"], "Hello");
    let lp = &choice["logprobs"];
    // The byte tokenizer adds BOS (`<s>`, 256): six prompt tokens.
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6, "{lp}");
    assert_eq!(tokens[0], "<s>");
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for i in 1..6 {
        assert_eq!(tokens[i], &"Hello"[i - 1..i]);
        // The sim puts the actual next token first.
        assert!(close(&lp["token_logprobs"][i], sim_logprob(0)), "{lp}");
    }
    // Streamed: the prompt's entries come with the echoed text.
    let mut s = req.clone();
    s["stream"] = json!(true);
    let events = sse_events(&post(addr, COMPLETIONS, &s).await.body);
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["text"], "Hello");
    assert_eq!(first["choices"][0]["logprobs"]["tokens"], lp["tokens"]);
    // Echo with generation: prompt entries, then the generated ones.
    let r = post(
        addr,
        COMPLETIONS,
        &json!({"prompt": "Hello", "max_tokens": 3, "ignore_eos": true, "echo": true, "logprobs": 1}),
    )
    .await
    .json();
    assert_eq!(
        r["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        9
    );
    // `max_tokens: 0` without `echo` generates nothing to report: refused.
    let r = post(addr, COMPLETIONS, &json!({"prompt": "Hi", "max_tokens": 0})).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "max_tokens");
    // vLLM's `prompt_logprobs`.
    let r = post(
        addr,
        COMPLETIONS,
        &json!({"prompt": "Hi", "max_tokens": 1, "prompt_logprobs": 2}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let p = &r.json()["choices"][0]["prompt_logprobs"];
    let p = p.as_array().unwrap_or_else(|| panic!("{}", r.body));
    assert_eq!(p.len(), 3);
    assert!(p[0].is_null());
    let pos1 = p[1].as_object().unwrap();
    // 'H' (72) first with rank 1, then the two next ids.
    assert_eq!(pos1.len(), 2, "{pos1:?}");
    assert_eq!(
        keys(&pos1["72"]),
        set(&["logprob", "rank", "decoded_token"])
    );
    assert_eq!(pos1["72"]["rank"], 1);
    assert_eq!(pos1["72"]["decoded_token"], "H");
    assert!(close(&pos1["73"]["logprob"], sim_logprob(1)));
    let r = post(
        addr,
        CHAT,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 0}),
    )
    .await
    .json();
    let p = r["prompt_logprobs"].as_array().unwrap();
    assert!(p[0].is_null() && p.len() > 1 && p[1].as_object().unwrap().len() == 1);
    server.shutdown(Duration::from_secs(5)).await;
}

/// More than `--max-logprobs` (default 20; -1 is the whole vocabulary), a
/// negative count, `top_logprobs` without `logprobs`, and `prompt_logprobs`
/// with `stream` are each a 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprob_limits_are_400s_naming_the_field() {
    let server = start(&[]).await;
    let addr = server.addr;
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let cmpl = |extra: Value| {
        let mut b = json!({"prompt": "hi", "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (path, body, field) in [
        (COMPLETIONS, cmpl(json!({"logprobs": 21})), "logprobs"),
        (COMPLETIONS, cmpl(json!({"logprobs": -1})), "logprobs"),
        (COMPLETIONS, cmpl(json!({"logprobs": -2})), "logprobs"),
        (COMPLETIONS, cmpl(json!({"logprobs": true})), "logprobs"),
        (
            CHAT,
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        (CHAT, chat(json!({"top_logprobs": 3})), "top_logprobs"),
        (
            COMPLETIONS,
            cmpl(json!({"prompt_logprobs": 21})),
            "prompt_logprobs",
        ),
        (
            COMPLETIONS,
            cmpl(json!({"prompt_logprobs": 1, "stream": true})),
            "prompt_logprobs",
        ),
        (
            CHAT,
            chat(json!({"prompt_logprobs": 1, "stream": true})),
            "prompt_logprobs",
        ),
    ] {
        let r = post(addr, path, &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{body}: {}", r.body);
    }
    let r = post(addr, COMPLETIONS, &cmpl(json!({"logprobs": 20}))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    server.shutdown(Duration::from_secs(5)).await;
    let server = start(&["--max-logprobs", "2"]).await;
    let r = post(server.addr, COMPLETIONS, &cmpl(json!({"logprobs": 3}))).await;
    assert_eq!(r.status, 400);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("--max-logprobs") && msg.contains('2'), "{msg}");
    let r = post(server.addr, COMPLETIONS, &cmpl(json!({"logprobs": 2}))).await;
    assert_eq!(r.status, 200);
    server.shutdown(Duration::from_secs(5)).await;
}

/// The request log says which requests asked for log-probabilities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_names_logprob_requests() {
    let path = std::env::temp_dir().join(format!("inferscope-lp-log-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let server = start(&["--enable-request-log", path.to_str().unwrap()]).await;
    let addr = server.addr;
    post(
        addr,
        COMPLETIONS,
        &json!({"prompt": "a", "max_tokens": 1, "logprobs": 4}),
    )
    .await;
    post(addr, COMPLETIONS, &json!({"prompt": "b", "max_tokens": 1})).await;
    // What evaluation harnesses send to score a prompt: the prompt's own
    // log-probabilities, echoed.
    post(
        addr,
        COMPLETIONS,
        &json!({"prompt": "c d", "max_tokens": 1, "logprobs": 1, "echo": true}),
    )
    .await;
    server.shutdown(Duration::from_secs(5)).await;
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(
        lines.iter().filter(|l| l["logprobs"] == 4).count(),
        1,
        "{text}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["logprobs"] == 1 && l["prompt_logprobs"] == 1)
            .count(),
        1,
        "{text}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.get("logprobs").is_none()).count(),
        1,
        "{text}"
    );
    let _ = std::fs::remove_file(&path);
}

/// A prompt split over several prefill chunks (a 16-token step budget)
/// still gets one `prompt_logprobs` entry per position, each naming the
/// prompt's own next token (the chunk's last row names the next chunk's
/// first token), with the prefix cache on and a repeated prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_across_prefill_chunks() {
    let server = start(&[
        "--max-num-batched-tokens",
        "16",
        "--max-num-seqs",
        "4",
        "--enable-prefix-caching",
    ])
    .await;
    let addr = server.addr;
    let prompt = "The quick brown fox jumps over the lazy dog, twice over.";
    for _ in 0..2 {
        let r = post(
            addr,
            COMPLETIONS,
            &json!({"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let p = r.json()["choices"][0]["prompt_logprobs"].clone();
        let p = p.as_array().unwrap();
        // BOS, then one byte per token.
        assert_eq!(p.len(), prompt.len() + 1);
        assert!(p[0].is_null());
        for (i, b) in prompt.bytes().enumerate() {
            let entry = p[i + 1].as_object().unwrap();
            assert_eq!(entry.len(), 1, "{entry:?}");
            assert!(
                entry.contains_key(&b.to_string()),
                "position {}: {entry:?}",
                i + 1
            );
        }
    }
    server.shutdown(Duration::from_secs(5)).await;
}
