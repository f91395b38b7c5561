//! `POST /tokenize` and `POST /detokenize`: vLLM's shapes, round trips on the
//! byte tokenizer and on a real `tokenizer.json`, chat messages counted with
//! the template, `count` equal to the `usage.prompt_tokens` of a completion
//! of the same prompt, the errors, the API key and the HTTP metrics; and
//! `GET /tokenizer_info` (only with `--enable-tokenizer-info-endpoint`).

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{call, post, scrape, start, sum};
use inferscope_model::{ByteTokenizer, ChatMessage, Tokenizer};
use serde_json::{Value, json};
use std::time::Instant;

/// `POST /tokenize`, expecting 200.
async fn tokenize(addr: SocketAddr, body: Value) -> Value {
    let r = post(addr, "/tokenize", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// `POST /detokenize` of `tokens`, expecting 200; the text.
async fn detokenize(addr: SocketAddr, tokens: &Value) -> String {
    let r = post(addr, "/detokenize", &json!({"tokens": tokens})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["prompt"].as_str().expect("prompt").to_owned()
}

/// The `usage.prompt_tokens` of a one-token generation at `path`.
async fn prompt_tokens(addr: SocketAddr, path: &str, mut body: Value) -> Value {
    body["max_tokens"] = json!(1);
    let r = post(addr, path, &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["usage"]["prompt_tokens"].clone()
}

/// Waits until the HTTP layer has counted `n` 2xx answers of `handler`.
async fn http_counted(addr: SocketAddr, handler: &str, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let counted = sum(
            &scrape(addr).await,
            "http_requests_total",
            &[("handler", handler), ("method", "POST"), ("status", "2xx")],
        );
        if counted == n {
            return;
        }
        assert!(
            counted < n && Instant::now() < deadline,
            "{handler}: {counted} counted, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A 4xx's error object, checked for the OpenAI shape.
async fn error(addr: SocketAddr, path: &str, body: &str, status: u16) -> Value {
    let r = call(addr, "POST", path, body, &[]).await;
    assert_eq!(r.status, status, "{}", r.body);
    let err = r.json()["error"].clone();
    assert!(err["message"].is_string(), "{}", r.body);
    assert!(err["type"].is_string(), "{}", r.body);
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_tokenizer_round_trip_counts_and_chat() {
    let server = start(&["--max-model-len", "256"]).await;
    let addr = server.addr;
    let text = "héllo, world";

    // Without special tokens: the bytes, and back to the same text.
    let r = tokenize(addr, json!({"prompt": text, "add_special_tokens": false})).await;
    let bytes: Vec<Value> = text.bytes().map(|b| json!(b)).collect();
    assert_eq!(r["tokens"], json!(bytes));
    assert_eq!(r["count"], text.len());
    assert_eq!(r["max_model_len"], 256);
    assert_eq!(detokenize(addr, &r["tokens"]).await, text);

    // By default BOS comes first, as in a completion; decoding keeps it.
    let r = tokenize(addr, json!({"prompt": text})).await;
    assert_eq!(r["tokens"][0], ByteTokenizer::BOS);
    assert_eq!(r["count"], text.len() + 1);
    assert_eq!(detokenize(addr, &r["tokens"]).await, format!("<s>{text}"));
    // Exact: the count is what a completion of the same prompt reports.
    let usage = prompt_tokens(addr, "/v1/completions", json!({"prompt": text})).await;
    assert_eq!(r["count"], usage);

    // Chat messages are rendered with the template before counting.
    let messages = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}
    ]);
    let chat = |add_generation_prompt: bool| {
        let msgs = [
            ChatMessage {
                role: "system".into(),
                content: "be brief".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: "hi there".into(),
            },
        ];
        let text = ByteTokenizer
            .apply_chat_template(&msgs, add_generation_prompt)
            .expect("template");
        ByteTokenizer.encode(&text, false).expect("encode")
    };
    let r = tokenize(addr, json!({"messages": messages})).await;
    assert_eq!(r["tokens"], json!(chat(true)));
    assert_eq!(r["count"], chat(true).len());
    let usage = prompt_tokens(addr, "/v1/chat/completions", json!({"messages": messages})).await;
    assert_eq!(r["count"], usage);
    let r = tokenize(
        addr,
        json!({"messages": messages, "add_generation_prompt": false}),
    )
    .await;
    assert_eq!(r["tokens"], json!(chat(false)));
    assert!(chat(false).len() < chat(true).len());

    // Counted by the HTTP layer under their route templates (once the last
    // body byte is written, so possibly just after the client has it).
    http_counted(addr, "/tokenize", 4.0).await;
    http_counted(addr, "/detokenize", 2.0).await;
    server.shutdown(Duration::from_secs(5)).await;
}

/// A word-level `tokenizer.json` (as in `server_contract.rs`), with room for
/// the sim's sampled ids.
fn word_tokenizer(dir: &std::path::Path) -> String {
    let mut vocab = serde_json::Map::new();
    for (i, w) in ["[UNK]", "hello", "world"].iter().enumerate() {
        vocab.insert((*w).into(), json!(i));
    }
    for i in 3..300 {
        vocab.insert(format!("w{i}"), json!(i));
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    std::fs::create_dir_all(dir).expect("temp dir");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer.to_string()).expect("write tokenizer.json");
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hf_tokenizer_round_trip_and_exact_counts() {
    let dir = std::env::temp_dir().join(format!("inferscope-tokenize-{}", std::process::id()));
    let path = word_tokenizer(&dir);
    let server = start(&["--tokenizer", &path]).await;
    let addr = server.addr;

    let text = "hello world w42 hello";
    let r = tokenize(addr, json!({"prompt": text})).await;
    assert_eq!(r["tokens"], json!([1, 2, 42, 1]));
    assert_eq!(r["count"], 4);
    assert_eq!(detokenize(addr, &r["tokens"]).await, text);
    let usage = prompt_tokens(addr, "/v1/completions", json!({"prompt": text})).await;
    assert_eq!(r["count"], usage);

    let messages = json!([{"role": "user", "content": "hello world"}]);
    let r = tokenize(addr, json!({"messages": messages})).await;
    let usage = prompt_tokens(addr, "/v1/chat/completions", json!({"messages": messages})).await;
    assert_eq!(r["count"], usage);
    assert!(
        r["count"].as_u64() > Some(2),
        "the template adds tokens: {r}"
    );

    server.shutdown(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_openai_4xx_naming_the_field() {
    let server = start(&["--max-model-len", "64"]).await;
    let addr = server.addr;
    let cases: &[(&str, &str, u16, Option<&str>)] = &[
        ("/tokenize", "{not json", 400, None),
        ("/detokenize", "[1,2", 400, None),
        (
            "/tokenize",
            r#"{"model": "other", "prompt": "hi"}"#,
            404,
            Some("model"),
        ),
        (
            "/detokenize",
            r#"{"model": "other", "tokens": [1]}"#,
            404,
            Some("model"),
        ),
        ("/tokenize", r#"{}"#, 400, Some("prompt")),
        (
            "/tokenize",
            r#"{"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}"#,
            400,
            Some("messages"),
        ),
        ("/tokenize", r#"{"messages": []}"#, 400, Some("messages")),
        (
            "/tokenize",
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            400,
            Some("messages"),
        ),
        ("/detokenize", r#"{}"#, 400, Some("tokens")),
        (
            "/detokenize",
            r#"{"tokens": [65, 258]}"#,
            400,
            Some("tokens"),
        ),
        ("/detokenize", r#"{"tokens": [-1]}"#, 400, Some("tokens")),
        ("/detokenize", r#"{"tokens": "abc"}"#, 400, None),
    ];
    for &(path, body, status, param) in cases {
        let err = error(addr, path, body, status).await;
        if let Some(p) = param {
            assert_eq!(err["param"], p, "{path} {body}: {err}");
        }
    }
    // Too long: more tokens than the model length (64), either way.
    let long = "x".repeat(64);
    let err = error(addr, "/tokenize", &json!({"prompt": long}).to_string(), 400).await;
    assert_eq!(err["param"], "prompt", "{err}");
    let ok = tokenize(addr, json!({"prompt": long, "add_special_tokens": false})).await;
    assert_eq!(ok["count"], 64);
    let err = error(
        addr,
        "/detokenize",
        &json!({"tokens": vec![65; 65]}).to_string(),
        400,
    )
    .await;
    assert_eq!(err["param"], "tokens", "{err}");
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_api_key_at_the_root_path() {
    let server = start(&["--api-key", "sekret"]).await;
    let addr = server.addr;
    for path in ["/tokenize", "/detokenize"] {
        let body = r#"{"prompt": "hi", "tokens": [104, 105]}"#;
        let r = call(addr, "POST", path, body, &[]).await;
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        let r = call(
            addr,
            "POST",
            path,
            body,
            &[("authorization", "Bearer wrong")],
        )
        .await;
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        let r = call(
            addr,
            "POST",
            path,
            body,
            &[("authorization", "Bearer sekret")],
        )
        .await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        // Not under /v1 (vLLM serves them at the root).
        let r = call(
            addr,
            "POST",
            &format!("/v1{path}"),
            body,
            &[("authorization", "Bearer sekret")],
        )
        .await;
        assert_eq!(r.status, 404, "/v1{path}: {}", r.body);
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// A word-level `tokenizer.json` whose post-processor adds BOS `<s>` (id
/// 300) as Llama's does, and a `tokenizer_config.json` whose template
/// writes `{{ bos_token }}` itself.
fn bos_tokenizer_dir(dir: &std::path::Path) -> String {
    word_tokenizer(dir);
    let path = dir.join("tokenizer.json");
    let mut t: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
        .expect("tokenizer.json");
    t["model"]["vocab"]["<s>"] = json!(300);
    t["added_tokens"] = json!([{"id": 300, "content": "<s>", "single_word": false,
        "lstrip": false, "rstrip": false, "normalized": false, "special": true}]);
    t["post_processor"] = json!({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]}}});
    std::fs::write(&path, t.to_string()).expect("write tokenizer.json");
    let config = json!({"bos_token": "<s>",
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }} {% endfor %}"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write config");
    dir.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_writing_bos_gives_exactly_one_bos() {
    let dir = std::env::temp_dir().join(format!("inferscope-bos-{}", std::process::id()));
    let path = bos_tokenizer_dir(&dir);
    let server = start(&["--tokenizer", &path]).await;
    let addr = server.addr;

    // A prompt gets the tokenizer's BOS; a rendered chat only its template's.
    let r = tokenize(addr, json!({"prompt": "hello"})).await;
    assert_eq!(r["tokens"], json!([300, 1]));
    let messages = json!([{"role": "user", "content": "hello world"}]);
    let r = tokenize(addr, json!({"messages": messages})).await;
    assert_eq!(r["tokens"], json!([300, 1, 2]), "one BOS, the template's");
    let usage = prompt_tokens(addr, "/v1/chat/completions", json!({"messages": messages})).await;
    assert_eq!(usage, 3, "the chat route counts the same three tokens");
    // Asking for the tokenizer's special tokens on top gives the second BOS.
    let r = tokenize(
        addr,
        json!({"messages": messages, "add_special_tokens": true}),
    )
    .await;
    assert_eq!(r["tokens"], json!([300, 300, 1, 2]));
    server.shutdown(Duration::from_secs(5)).await;

    // `--chat-template` (the text itself) replaces the directory's template,
    // with the same `bos_token`.
    let server = start(&[
        "--tokenizer",
        &path,
        "--chat-template",
        "{{ bos_token }}{{ messages[-1].content }} w7",
    ])
    .await;
    let r = tokenize(server.addr, json!({"messages": messages})).await;
    assert_eq!(r["tokens"], json!([300, 1, 2, 7]));
    server.shutdown(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET /tokenizer_info`, expecting 200.
async fn tokenizer_info(addr: SocketAddr, headers: &[(&str, &str)]) -> Value {
    let r = call(addr, "GET", "/tokenizer_info", "", headers).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_info_only_with_its_flag_and_behind_the_key() {
    // Without the flag: 404 with an OpenAI error body, as vLLM (no route).
    let server = start(&[]).await;
    let r = call(server.addr, "GET", "/tokenizer_info", "", &[]).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    server.shutdown(Duration::from_secs(5)).await;

    let server = start(&[
        "--enable-tokenizer-info-endpoint",
        "--max-model-len",
        "300",
        "--api-key",
        "sekret",
    ])
    .await;
    let addr = server.addr;
    let r = call(addr, "GET", "/tokenizer_info", "", &[]).await;
    assert_eq!(r.status, 401, "{}", r.body);
    let info = tokenizer_info(addr, &[("authorization", "Bearer sekret")]).await;
    assert_eq!(
        info,
        json!({"tokenizer_class": "ByteTokenizer", "bos_token": "<s>", "eos_token": "</s>",
               "add_bos_token": true, "model_max_length": 300}),
        "the byte tokenizer has no chat template to report"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_info_of_a_tokenizer_json_names_its_template_and_no_path() {
    let dir = std::env::temp_dir().join(format!("inferscope-info-{}", std::process::id()));
    let path = bos_tokenizer_dir(&dir);
    let server = start(&["--tokenizer", &path, "--enable-tokenizer-info-endpoint"]).await;
    let addr = server.addr;
    let info = tokenizer_info(addr, &[]).await;
    assert_eq!(info["tokenizer_class"], "HfTokenizer");
    assert_eq!(info["bos_token"], "<s>");
    assert_eq!(info["add_bos_token"], true);
    assert_eq!(
        info["chat_template"],
        "{{ bos_token }}{% for m in messages %}{{ m.content }} {% endfor %}"
    );
    // The strings are the ones `/tokenize` maps back to the ids (lm_eval's
    // remote tokenizer finds `bos_token_id` so).
    let r = tokenize(
        addr,
        json!({"prompt": info["bos_token"], "add_special_tokens": false}),
    )
    .await;
    assert_eq!(r["tokens"], json!([300]));
    assert!(
        !info.to_string().contains(&path),
        "no path of the model's files: {info}"
    );
    server.shutdown(Duration::from_secs(5)).await;

    // `--chat-template` replaces the reported template too.
    let server = start(&[
        "--tokenizer",
        &path,
        "--chat-template",
        "{{ messages[-1].content }}",
        "--enable-tokenizer-info-endpoint",
    ])
    .await;
    let info = tokenizer_info(server.addr, &[]).await;
    assert_eq!(info["chat_template"], "{{ messages[-1].content }}");
    server.shutdown(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&dir);
}
