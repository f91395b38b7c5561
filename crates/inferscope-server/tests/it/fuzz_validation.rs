//! Property tests over hostile request bodies: arbitrary bytes, arbitrary
//! JSON, and request-shaped JSON with arbitrary field values. Request parsing
//! and validation (the same functions the `fuzz/` target drives) must never
//! panic and never answer 5xx; neither may the live endpoints.
//!
//! More cases: `PROPTEST_CASES=20000 cargo test --release -p inferscope-server --test it fuzz_validation::`.

use crate::common;

use std::time::Duration;

use inferscope_model::{ByteTokenizer, GenerationDefaults, Tokenizer};
use inferscope_server::openai::structured::StartupGrammar;
use inferscope_server::openai::tool_parsers::ParserName;
use inferscope_server::openai::tools::ToolSettings;
use inferscope_server::openai::validation::{
    Limits, Validated, Validator, parse_and_detokenize, parse_and_tokenize,
    parse_and_validate_chat, parse_and_validate_completion,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value};

const MAX_MODEL_LEN: usize = 64;

/// Field names the server reads, so that generated objects reach deep checks.
const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "stream",
    "stream_options",
    "include_usage",
    "ignore_eos",
    "min_tokens",
    "logprobs",
    "top_logprobs",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_p",
    "logit_bias",
    "best_of",
    "echo",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "continuous_usage_stats",
    "response_format",
    "tools",
    "tool_choice",
    "guided_json",
    "chat_template_kwargs",
    "role",
    "content",
    "type",
    "text",
    "tokens",
    "add_special_tokens",
    "add_generation_prompt",
];

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..300).prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(vec![0.0, -0.0, 0.5, 1.0, 1e-300, 1e300, -1.5]).prop_map(Value::from),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        ".{0,24}".prop_map(Value::String),
        prop::sample::select(vec!["demo", "text", "user", "assistant", "image_url", ""])
            .prop_map(|s| Value::String(s.to_owned())),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        prop::sample::select(FIELDS.to_vec()).prop_map(str::to_owned),
                        ".{0,8}"
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An object with a random subset of the request fields, each with any value.
fn request_shaped() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(FIELDS.to_vec()), json()), 0..10).prop_map(|kv| {
        Value::Object(
            kv.into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Map<_, _>>(),
        )
    })
}

/// A body: raw bytes, JSON, or request-shaped JSON.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        json().prop_map(|v| v.to_string().into_bytes()),
        request_shaped().prop_map(|v| v.to_string().into_bytes()),
        // Valid-looking requests with one hostile field: the likeliest to get deep.
        (request_shaped(), any::<bool>()).prop_map(|(extra, chat)| {
            let mut base = if chat {
                serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            } else {
                serde_json::json!({"prompt": "hi", "max_tokens": 4})
            };
            if let (Value::Object(b), Value::Object(e)) = (&mut base, extra) {
                b.extend(e);
            }
            base.to_string().into_bytes()
        }),
    ]
}

fn limits(tok: &dyn Tokenizer) -> Limits {
    Limits {
        max_model_len: MAX_MODEL_LEN,
        vocab_size: tok.vocab_size(),
        max_n: 128,
        max_choices: 256,
        max_stop_sequences: 16,
        max_stop_sequence_bytes: 256,
        max_stop_token_ids: 256,
        sampling_defaults: GenerationDefaults::NONE,
        max_logprobs: 20,
    }
}

/// What every accepted plan must satisfy; every refusal must be a 4xx.
/// Returns whether the request was accepted.
fn check(result: Result<Validated, inferscope_server::ApiError>, limits: &Limits) -> bool {
    match result {
        Ok(v) => {
            assert_eq!(v.model, "demo");
            let plan = v.plan;
            assert!(!plan.prompts.is_empty());
            assert!(plan.params.max_tokens >= 1);
            assert!(plan.params.n >= 1 && plan.params.n <= limits.max_n);
            assert!(plan.prompts.len() * plan.params.n <= limits.max_choices);
            for p in &plan.prompts {
                assert!(!p.is_empty());
                assert!(p.len() + plan.params.max_tokens <= limits.max_model_len);
                assert!(p.iter().all(|&t| (t as usize) < limits.vocab_size));
            }
            true
        }
        Err(e) => {
            assert!(e.status.is_client_error(), "{} {}", e.status, e.message);
            assert!(!e.message.is_empty());
            false
        }
    }
}

fn config() -> Config {
    // `Config::default()` reads PROPTEST_CASES, so CI and long runs can differ.
    Config {
        failure_persistence: None,
        ..Config::default()
    }
}

#[test]
fn validation_never_panics_and_refuses_with_4xx() {
    let tok = ByteTokenizer;
    let limits = limits(&tok);
    let served = vec!["demo".to_owned()];
    let v = Validator {
        served_model_names: &served,
        limits: &limits,
        tokenizer: &tok,
        // Tool calling on, so `tools` and `tool_choice` reach their checks.
        tools: ToolSettings {
            auto_tool_choice: true,
            parser: Some(ParserName::Hermes),
            exclude_tools_when_none: false,
        },
        grammar: &StartupGrammar::ready(None),
    };
    let accepted = std::cell::Cell::new(0usize);
    let mut runner = TestRunner::new(config());
    runner
        .run(&body(), |bytes| {
            let a = check(parse_and_validate_completion(&bytes, &v), &limits);
            let b = check(parse_and_validate_chat(&bytes, &v), &limits);
            accepted.set(accepted.get() + usize::from(a) + usize::from(b));
            Ok(())
        })
        .expect("no failing input");
    // The generator must also reach the end of validation, not only its
    // first refusals.
    assert!(accepted.get() > 0, "no generated request was valid");
}

/// `/tokenize` and `/detokenize` bodies: never a panic, refusals are 4xx,
/// and an accepted tokenization fits the model and the vocabulary.
#[test]
fn tokenizer_routes_never_panic_and_refuse_with_4xx() {
    let tok = ByteTokenizer;
    let limits = limits(&tok);
    let served = vec!["demo".to_owned()];
    let v = Validator {
        served_model_names: &served,
        limits: &limits,
        tokenizer: &tok,
        // Tool calling on, so `tools` and `tool_choice` reach their checks.
        tools: ToolSettings {
            auto_tool_choice: true,
            parser: Some(ParserName::Hermes),
            exclude_tools_when_none: false,
        },
        grammar: &StartupGrammar::ready(None),
    };
    let refused = |e: inferscope_server::ApiError| {
        assert!(e.status.is_client_error(), "{} {}", e.status, e.message);
        assert!(!e.message.is_empty());
    };
    let mut runner = TestRunner::new(config());
    runner
        .run(&body(), |bytes| {
            match parse_and_tokenize(&bytes, &v) {
                Ok(r) => {
                    assert_eq!(r.count, r.tokens.len());
                    assert!(r.count <= limits.max_model_len);
                    assert!(r.tokens.iter().all(|&t| (t as usize) < limits.vocab_size));
                }
                Err(e) => refused(e),
            }
            if let Err(e) = parse_and_detokenize(&bytes, &v) {
                refused(e);
            }
            Ok(())
        })
        .expect("no failing input");
}

#[test]
fn live_endpoints_never_answer_5xx() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let max_len = MAX_MODEL_LEN.to_string();
    let server = rt.block_on(common::start(&["--max-model-len", &max_len]));
    let addr = server.addr;
    let mut runner = TestRunner::new(config());
    runner
        .run(&body(), |bytes| {
            let body = String::from_utf8_lossy(&bytes).into_owned();
            rt.block_on(async {
                for path in [
                    "/v1/completions",
                    "/v1/chat/completions",
                    "/tokenize",
                    "/detokenize",
                ] {
                    let r = common::call(addr, "POST", path, &body, &[]).await;
                    assert!(r.status < 500, "{path} {body:?}: {} {}", r.status, r.body);
                    if r.status != 200 {
                        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
                    }
                }
            });
            Ok(())
        })
        .expect("no failing input");
    rt.block_on(async {
        assert_eq!(
            common::call(addr, "GET", "/health", "", &[]).await.status,
            200
        );
        server.shutdown(Duration::from_secs(5)).await;
    });
}
