//! Structured outputs: every field that asks for them is honoured (the
//! output matches the constraint, on the sim executor and on the demo
//! model), a bad schema, regex or grammar is a 400 naming the field, the
//! mask time is in /metrics and the request log says the request was
//! constrained.

use crate::common;

use std::time::Duration;

use common::*;
use inferscope_server::ServeArgs;
use serde_json::{Value, json};

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

/// A request to `path` with `extra` fields merged in.
fn body(path: &str, extra: Value) -> Value {
    let mut b = if path == CHAT {
        json!({"messages": [{"role": "user", "content": "answer"}], "max_tokens": 48})
    } else {
        json!({"prompt": "answer", "max_tokens": 48})
    };
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// The text and finish reason of the only choice of a response.
fn choice(path: &str, reply: &Reply) -> (String, String) {
    let v = reply.json();
    let c = &v["choices"][0];
    let text = if path == CHAT {
        c["message"]["content"].as_str().unwrap_or_default()
    } else {
        c["text"].as_str().unwrap_or_default()
    };
    (
        text.to_owned(),
        c["finish_reason"].as_str().unwrap_or_default().to_owned(),
    )
}

/// `s` is `[a-c]{2}-[0-9]{1,3}`.
fn matches_code(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 4
        && b.len() <= 6
        && b[..2].iter().all(|c| (b'a'..=b'c').contains(c))
        && b[2] == b'-'
        && b[3..].iter().all(u8::is_ascii_digit)
}

/// `t` is [`qwen_params`]'s XML parameters, as xgrammar's
/// `qwen_xml_parameter` writes them: `<parameter=NAME>VALUE</parameter>`
/// in order, `[ \n\t]*` before, between and after them and around the
/// (non-string) values.
fn is_qwen_params(t: &str) -> bool {
    let ws = |s: &str| s.trim_start_matches([' ', '\n', '\t']).to_owned();
    let mut rest = ws(t);
    let mut values = Vec::new();
    for name in ["n", "ok", "unit"] {
        let Some(r) = rest.strip_prefix(&format!("<parameter={name}>")) else {
            return false;
        };
        let Some((value, r)) = r.split_once("</parameter>") else {
            return false;
        };
        values.push(value.trim_matches([' ', '\n', '\t']).to_owned());
        rest = ws(r);
    }
    rest.is_empty()
        && values[0]
            .parse::<u8>()
            .is_ok_and(|n| n <= 99 && values[0] == n.to_string())
        && (values[1] == "true" || values[1] == "false")
        && (values[2] == "c" || values[2] == "f")
}

/// A tool's parameters for `qwen_xml_parameter`: no free-text string, so
/// the sim's random walk ends well within `max_tokens`.
fn qwen_params() -> Value {
    json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "ok": {"type": "boolean"},
            "unit": {"enum": ["c", "f"]}
        },
        "required": ["n", "ok", "unit"]
    })
}

/// The schema the JSON tests hold output to: bounded, so a random walk
/// through it ends well within `max_tokens`.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    })
}

/// `v` matches [`person_schema`].
fn is_person(v: &Value) -> bool {
    let Some(o) = v.as_object() else { return false };
    o.len() == 3
        && o["name"].as_str().is_some_and(|n| n.chars().count() <= 5)
        && o["age"].as_i64().is_some_and(|a| (0..=120).contains(&a))
        && o["tags"]
            .as_array()
            .is_some_and(|t| t.len() <= 2 && t.iter().all(|x| x == "a" || x == "b"))
}

/// Every field (and each form of `structured_outputs`) constrains the sim's
/// output on both endpoints, for several seeds: the sim draws inside the
/// mask, so without the mask its printable-ASCII noise would fail each check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_constrains_the_output() {
    let server = start(&[]).await;
    let addr = server.addr;
    type Check = fn(&str, &str) -> bool;
    let json_person: Check =
        |t, f| f == "stop" && serde_json::from_str::<Value>(t).is_ok_and(|v| is_person(&v));
    let json_object: Check = |t, f| {
        t.starts_with('{')
            && (f != "stop" || serde_json::from_str::<Value>(t).is_ok_and(|v| v.is_object()))
    };
    let code: Check = |t, f| f == "stop" && matches_code(t);
    let yes_no: Check = |t, f| f == "stop" && (t == "yes" || t == "no");
    let qwen: Check = |t, f| f == "stop" && is_qwen_params(t);
    let ab_cd: Check = |t, f| f == "stop" && (t == "ab" || t == "cd");
    let tagged_code: Check = |t, f| {
        f == "stop"
            && t.strip_prefix("<f>")
                .and_then(|t| t.strip_suffix("</f>"))
                .is_some_and(matches_code)
    };
    let cases: Vec<(Value, Check)> = vec![
        (
            json!({"response_format": {"type": "json_object"}}),
            json_object,
        ),
        (
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}}),
            json_person,
        ),
        (
            json!({"structured_outputs": {"json": person_schema()}}),
            json_person,
        ),
        (
            json!({"structured_outputs": {"regex": "[a-c]{2}-[0-9]{1,3}"}}),
            code,
        ),
        (
            json!({"structured_outputs": {"choice": ["yes", "no"]}}),
            yes_no,
        ),
        (
            json!({"structured_outputs": {"grammar": "start: \"ab\" | \"cd\""}}),
            ab_cd,
        ),
        (
            json!({"guided_json": person_schema().to_string()}),
            json_person,
        ),
        (json!({"guided_regex": "[a-c]{2}-[0-9]{1,3}"}), code),
        (json!({"guided_choice": ["yes", "no"]}), yes_no),
        (json!({"guided_grammar": "root ::= \"ab\" | \"cd\""}), ab_cd),
        (
            json!({"response_format": {"type": "structural_tag", "format": {"type": "tag",
                "begin": "<f>", "content": {"type": "regex", "pattern": "[a-c]{2}-[0-9]{1,3}"},
                "end": "</f>"}}}),
            tagged_code,
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {"type": "tag",
                "begin": "<f>", "content": {"type": "grammar",
                    "grammar": "root ::= letter letter \"-\" digits\nletter ::= [a-c]\ndigits ::= [0-9]{1,3}"},
                "end": "</f>"}}}),
            tagged_code,
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {"type": "grammar",
                "grammar": "start: \"ab\" | \"cd\""}}}),
            ab_cd,
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {
                "type": "qwen_xml_parameter", "json_schema": qwen_params()}}}),
            qwen,
        ),
    ];
    for (extra, check) in &cases {
        for path in [COMPLETIONS, CHAT] {
            for seed in 0..4 {
                let mut b = body(path, extra.clone());
                b["seed"] = json!(seed);
                b["max_tokens"] = json!(200);
                let r = post(addr, path, &b).await;
                assert_eq!(r.status, 200, "{path} {extra}: {}", r.body);
                let (text, finish) = choice(path, &r);
                assert!(
                    check(&text, &finish),
                    "{path} {extra} seed {seed}: {finish} {text:?}"
                );
            }
        }
    }
    // n > 1: each choice runs its own matcher.
    let b = body(
        COMPLETIONS,
        json!({"guided_choice": ["yes", "no"], "n": 4, "seed": 1}),
    );
    let r = post(addr, COMPLETIONS, &b).await;
    assert_eq!(r.status, 200, "{}", r.body);
    for c in r.json()["choices"].as_array().expect("choices") {
        assert!(matches!(c["text"].as_str(), Some("yes" | "no")), "{c}");
    }
    // Streamed: the deltas add up to a valid choice.
    let mut b = body(
        CHAT,
        json!({"guided_choice": ["yes", "no"], "stream": true}),
    );
    b["seed"] = json!(3);
    let r = post(addr, CHAT, &b).await;
    let mut text = String::new();
    for e in sse_events(&r.body) {
        if let Ok(v) = serde_json::from_str::<Value>(&e) {
            text.push_str(
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .unwrap_or_default(),
            );
        }
    }
    assert!(text == "yes" || text == "no", "{text:?}");
    server.shutdown(Duration::from_secs(5)).await;
}

/// A constraint that cannot be compiled, or two at once, is a 400 naming
/// the field and saying what is wrong; nothing reaches the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_constraints_are_400s_naming_the_field() {
    let server = start(&[]).await;
    let addr = server.addr;
    let cases: &[(Value, &str, &str)] = &[
        (
            json!({"guided_regex": "a(b"}),
            "guided_regex",
            "regular expression",
        ),
        (
            json!({"guided_json": {"type": "nope"}}),
            "guided_json",
            "JSON schema",
        ),
        (json!({"guided_json": "{"}), "guided_json", "not valid JSON"),
        (
            json!({"guided_choice": []}),
            "guided_choice",
            "non-empty list",
        ),
        (
            json!({"guided_grammar": "start: missing_rule"}),
            "guided_grammar",
            "grammar",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": 7}}}}}}),
            "response_format",
            "JSON schema",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
            "yaml",
        ),
        (
            json!({"structured_outputs": {"regex": "(", "choice": null}}),
            "structured_outputs",
            "regular expression",
        ),
        (
            json!({"structured_outputs": {"structural_tag": "x"}}),
            "structured_outputs",
            "not valid JSON",
        ),
        (
            json!({"structured_outputs": {"structural_tag": json!({"structures": [
                {"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}], "triggers": ["<b"]}).to_string()}}),
            "structured_outputs",
            "does not start with any of the triggers",
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {"type": "tag",
                "begin": "<a>", "content": {"type": "grammar", "grammar": "root ::= missing"}, "end": "</a>"}}}),
            "response_format",
            "`format.content.grammar` is not a valid grammar",
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {"type": "qwen_xml_parameter",
                "json_schema": {"type": "object", "properties": {"a": {"type": 7}}}}}}),
            "response_format",
            "`format.json_schema.properties.a.type` must be",
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {"type": "qwen_xml_parameter",
                "json_schema": {"type": "object", "additionalProperties": true}}}}),
            "response_format",
            "`format.json_schema.additionalProperties` other than false is not supported",
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {"type": "json", "grammar": "x"}}}),
            "response_format",
            "`format.type` \"json\" is not a structural tag format",
        ),
        (
            json!({"guided_regex": "a", "response_format": {"type": "json_object"}}),
            "guided_regex",
            "both constrain",
        ),
    ];
    for (extra, field, says) in cases {
        for path in [COMPLETIONS, CHAT] {
            let r = post(addr, path, &body(path, extra.clone())).await;
            assert_eq!(r.status, 400, "{path} {extra}: {}", r.body);
            let err = &r.json()["error"];
            assert_eq!(err["param"], *field, "{path} {extra}: {}", r.body);
            assert_eq!(err["type"], "invalid_request_error");
            let msg = err["message"].as_str().unwrap_or_default();
            assert!(msg.contains(says), "{path} {extra}: {msg}");
        }
    }
    let samples = scrape(addr).await;
    assert_eq!(sum(&samples, "inferscope_request_success_total", &[]), 0.0);
    server.shutdown(Duration::from_secs(5)).await;
}

/// The mask time is a histogram observed on steps with a constrained
/// sequence only; the request log names the constraint's kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mask_time_and_request_log_show_constrained_requests() {
    let dir = std::env::temp_dir().join(format!("inferscope-structured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let log_path = dir.join("requests.jsonl");
    let _ = std::fs::remove_file(&log_path);
    let server = start(&["--enable-request-log", log_path.to_str().expect("utf-8")]).await;
    let addr = server.addr;
    let name = "inferscope_grammar_mask_duration_seconds_count";
    let free = post(
        addr,
        COMPLETIONS,
        &body(COMPLETIONS, json!({"max_tokens": 5, "ignore_eos": true})),
    )
    .await;
    assert_eq!(free.status, 200);
    let samples = scrape_when(addr, "inferscope_request_success_total", 1.0).await;
    assert_eq!(sum(&samples, name, &[]), 0.0, "no constrained step yet");
    let r = post(
        addr,
        COMPLETIONS,
        &body(COMPLETIONS, json!({"guided_choice": ["yes", "no"]})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let samples = scrape_when(addr, "inferscope_request_success_total", 2.0).await;
    assert_histograms_well_formed(&samples);
    let steps = sum(&samples, name, &[]);
    // "yes" or "no": 2 or 3 sampled tokens, each after a mask, and the step
    // after the last, whose mask job finds the grammar complete (the choice
    // ends there, its token dropped).
    assert!((3.0..=4.0).contains(&steps), "{steps}");
    server.shutdown(Duration::from_secs(5)).await;
    let log = std::fs::read_to_string(&log_path).expect("request log");
    let _ = std::fs::remove_dir_all(&dir);
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(lines[0].get("structured_output").is_none(), "{log}");
    assert_eq!(lines[1]["structured_output"], "choice", "{log}");
}

/// On the demo model (the cpu executor), a JSON schema holds the real
/// model's output: every seed gives an object that validates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_model_output_follows_the_schema() {
    let args = ServeArgs::try_parse_flags(vec![
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "cpu",
        "--model",
        "demo",
        "--disable-log-stats",
    ])
    .expect("flags");
    let server = inferscope_server::start(&args)
        .await
        .expect("server starts");
    let addr = server.addr;
    for seed in 0..5 {
        let b = json!({"messages": [{"role": "user", "content": "Who is Mr. Darcy?"}],
            "max_tokens": 120, "seed": seed, "temperature": 1.0,
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}});
        let r = post(addr, CHAT, &b).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let (text, finish) = choice(CHAT, &r);
        assert_eq!(finish, "stop", "seed {seed}: {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(is_person(&v), "seed {seed}: {v}");
    }
    server.shutdown(Duration::from_secs(5)).await;
}
