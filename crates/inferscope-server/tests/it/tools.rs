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
    // `/tokenize` of the same messages and tools counts the same prompt.
    let r = post(
        addr,
        "/tokenize",
        &json!({"messages": round_trip(), "tools": tools()}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["count"], expected.len(), "{}", r.body);
    for (body, param) in [
        (
            json!({"messages": round_trip(), "tools": {"type": "function"}}),
            "tools",
        ),
        (json!({"prompt": "hi", "tools": tools()}), "tools"),
    ] {
        let r = post(addr, "/tokenize", &body).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{}", r.body);
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
            json!({"tools": tools(), "tool_choice": "required",
                   "response_format": {"type": "json_object"}}),
            "tool_choice",
            "cannot be combined",
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

/// Two tools whose arguments are short enough for random constrained text.
fn bounded_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}},
            "required": ["zone"], "additionalProperties": false}}},
    ])
}

/// A call's arguments validate against its tool's parameters.
fn check_call(call: &Value, names: &[&str]) {
    let name = call["function"]["name"].as_str().unwrap();
    assert!(names.contains(&name), "{call}");
    assert_eq!(call["type"], "function", "{call}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {call}"));
    let keys: Vec<&String> = args.as_object().expect("an object").keys().collect();
    match name {
        "get_weather" => {
            assert_eq!(keys, ["city"], "{call}");
            assert!(
                args["city"].as_str().unwrap().chars().count() <= 8,
                "{call}"
            );
        }
        _ => {
            assert_eq!(keys, ["zone"], "{call}");
            assert!(
                ["utc", "cet"].contains(&args["zone"].as_str().unwrap()),
                "{call}"
            );
        }
    }
}

/// `tool_choice: "required"` and a named function constrain the sim's
/// random text to the tools' schemas (as vLLM does, no parser flag needed):
/// every answer is calls whose arguments validate, streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_tool_choices_are_held_to_the_schemas() {
    let server = start(&[]).await;
    let addr = server.addr;
    let user = json!([{"role": "user", "content": "weather?"}]);
    for seed in 0..6 {
        let r = post(
            addr,
            CHAT,
            &json!({"messages": user, "tools": bounded_tools(), "tool_choice": "required",
                    "max_tokens": 2000, "seed": seed}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let choice = &r.json()["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
        let calls = choice["message"]["tool_calls"].as_array().expect("calls");
        assert!(!calls.is_empty(), "{choice}");
        for call in calls {
            check_call(call, &["get_weather", "get_time"]);
        }
    }
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    for seed in 0..4 {
        let r = post(
            addr,
            CHAT,
            &json!({"messages": user, "tools": bounded_tools(), "tool_choice": named,
                    "max_tokens": 200, "seed": seed}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let choice = &r.json()["choices"][0];
        let calls = choice["message"]["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 1, "{choice}");
        check_call(&calls[0], &["get_time"]);
        // Streamed: the deltas add up to the same kind of call.
        let r = post(
            addr,
            CHAT,
            &json!({"messages": user, "tools": bounded_tools(), "tool_choice": named,
                    "max_tokens": 200, "seed": seed, "stream": true}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let (mut name, mut args) = (String::new(), String::new());
        for e in sse_events(&r.body) {
            let Ok(v) = serde_json::from_str::<Value>(&e) else {
                continue;
            };
            for c in v["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                name.push_str(c["function"]["name"].as_str().unwrap_or(""));
                args.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        check_call(
            &json!({"type": "function", "function": {"name": name, "arguments": args}}),
            &["get_time"],
        );
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// The request log says which requests offered tools (how many, and the
/// `tool_choice`, the default one included) and which asked for
/// log-probabilities; a plain request's line names neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_names_the_tools_and_tool_choice() {
    let path =
        std::env::temp_dir().join(format!("inferscope-tools-log-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let server = start(&[
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--enable-request-log",
        path.to_str().expect("utf-8"),
    ])
    .await;
    let addr = server.addr;
    let two_tools = json!([tools()[0], {"type": "function", "function": {"name": "get_time"}}]);
    let messages = json!([{"role": "user", "content": "hi"}]);
    for body in [
        // The default `tool_choice` with tools: auto.
        json!({"messages": messages, "tools": two_tools, "max_tokens": 2}),
        json!({"messages": messages, "tools": tools(), "tool_choice": "none", "max_tokens": 2,
               "logprobs": true, "top_logprobs": 2}),
        json!({"messages": messages, "max_tokens": 2}),
    ] {
        let r = post(addr, CHAT, &body).await;
        assert_eq!(r.status, 200, "{body}: {}", r.body);
    }
    server.shutdown(Duration::from_secs(5)).await;
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    let features = |l: &Value| {
        (
            l.get("tools").cloned(),
            l.get("tool_choice").cloned(),
            l.get("logprobs").cloned(),
        )
    };
    assert_eq!(
        features(&lines[0]),
        (Some(json!(2)), Some(json!("auto")), None),
        "{text}"
    );
    assert_eq!(
        features(&lines[1]),
        (Some(json!(1)), Some(json!("none")), Some(json!(2))),
        "{text}"
    );
    assert_eq!(features(&lines[2]), (None, None, None), "{text}");
    let _ = std::fs::remove_file(&path);
}
