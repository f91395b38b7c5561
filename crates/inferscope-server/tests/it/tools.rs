//! Tool calling over HTTP on the sim executor (a byte-level tokenizer, so
//! `usage.prompt_tokens` is the rendered prompt's length in bytes): what
//! the chat template sees, the 400s, and the parsed answer's shape.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";

/// Prints what a template receives of tools and tool messages.
const TEMPLATE: &str = "{{ tools | tojson }}|{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %};{% endfor %}";

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

fn round_trip() -> Value {
    json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ])
}

/// The template sees `tools` in vLLM's shape and the tool messages with
/// each call's arguments as a mapping (keys in the order sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_and_tool_messages_reach_the_template() {
    let server = start(&[
        "--chat-template",
        TEMPLATE,
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ])
    .await;
    let addr = server.addr;
    let expected = concat!(
        r#"[{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]|"#,
        "user:Weather in Paris?;",
        r#"assistant:get_weather{"city": "Paris", "a": 1};"#,
        "tool:sunny(call_1);"
    );
    for choice in [json!("auto"), json!("none"), Value::Null] {
        let r = post(
            addr,
            CHAT,
            &json!({"messages": round_trip(), "tools": tools(), "tool_choice": choice, "max_tokens": 4}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.json()["usage"]["prompt_tokens"],
            expected.len(),
            "tool_choice {choice}: the template did not print {expected}"
        );
    }
    // Without tools the template sees none.
    let r = post(
        addr,
        CHAT,
        &json!({"messages": round_trip(), "max_tokens": 4}),
    )
    .await;
    let without = format!("null{}", &expected[expected.find('|').expect("|")..]);
    assert_eq!(
        r.json()["usage"]["prompt_tokens"],
        without.len(),
        "{}",
        r.body
    );
    server.shutdown(Duration::from_secs(5)).await;
}

/// Bad tool fields are 400s naming the field; `auto` needs the flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_fields_are_checked() {
    let plain = start(&[]).await;
    let r = post(
        plain.addr,
        CHAT,
        &json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools()}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "tool_choice");
    assert!(r.body.contains("--enable-auto-tool-choice"), "{}", r.body);
    // tool_choice none needs no flag, and the template still gets the tools.
    let r = post(
        plain.addr,
        CHAT,
        &json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools(), "tool_choice": "none", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    plain.shutdown(Duration::from_secs(5)).await;

    let server = start(&["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]).await;
    let user = json!([{"role": "user", "content": "hi"}]);
    for (body, param, says) in [
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
            "nope",
        ),
        (
            json!({"tools": tools(), "tool_choice": "required"}),
            "tool_choice",
            "structured outputs",
        ),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
            "tool_choice",
            "structured outputs",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"description": "no name"}}]}),
            "tools",
            "tools[0].function.name",
        ),
        (json!({"tools": {"type": "function"}}), "tools", "list"),
        (
            json!({"tools": tools(), "parallel_tool_calls": "yes"}),
            "parallel_tool_calls",
            "boolean",
        ),
    ] {
        let mut b = body.clone();
        b["messages"] = user.clone();
        let r = post(server.addr, CHAT, &b).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let err = &r.json()["error"];
        assert_eq!(err["param"], param, "{body}: {}", r.body);
        assert_eq!(err["type"], "invalid_request_error");
        assert!(
            err["message"].as_str().unwrap_or_default().contains(says),
            "{body}: {}",
            r.body
        );
    }
    let mut bad = round_trip();
    bad[1]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    let r = post(
        server.addr,
        CHAT,
        &json!({"messages": bad, "tools": tools()}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "messages");
    assert!(
        r.body
            .contains("messages[1].tool_calls[0].function.arguments"),
        "{}",
        r.body
    );
    server.shutdown(Duration::from_secs(5)).await;
}

/// With the hermes parser on, an answer without a call is the same text
/// streamed and not (the parser holds back, then releases, what could
/// start a marker), with no `tool_calls` and the engine's finish reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parsed_answers_stream_as_they_answer_whole() {
    let server = start(&["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]).await;
    let addr = server.addr;
    for seed in 0..4 {
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools(),
            "max_tokens": 40, "seed": seed, "ignore_eos": true});
        let whole = post(addr, CHAT, &body).await;
        assert_eq!(whole.status, 200, "{}", whole.body);
        let whole = whole.json();
        let message = &whole["choices"][0]["message"];
        assert!(message.get("tool_calls").is_none(), "{whole}");
        assert_eq!(whole["choices"][0]["finish_reason"], "length");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let r = post(addr, CHAT, &streamed).await;
        let mut content = String::new();
        let mut finish = Value::Null;
        for e in sse_events(&r.body) {
            if e == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(&e).expect("chunk");
            let choice = &chunk["choices"][0];
            assert!(choice["delta"].get("tool_calls").is_none(), "{e}");
            content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
            }
        }
        assert_eq!(
            content,
            message["content"].as_str().unwrap_or_default(),
            "seed {seed}"
        );
        assert_eq!(finish, "length");
    }
    server.shutdown(Duration::from_secs(5)).await;
}
