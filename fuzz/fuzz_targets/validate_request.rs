//! Request parsing and validation of both OpenAI endpoints on arbitrary
//! bytes: never a panic; every refusal a 4xx; every accepted plan within the
//! limits. The same functions the server's handlers call.

#![no_main]

use inferscope_model::{ByteTokenizer, Tokenizer};
use inferscope_server::openai::tool_parsers::ParserName;
use inferscope_server::openai::tools::ToolSettings;
use inferscope_server::openai::validation::{
    Limits, Validated, Validator, parse_and_validate_chat, parse_and_validate_completion,
};
use libfuzzer_sys::fuzz_target;

fn check(result: Result<Validated, inferscope_server::ApiError>, limits: &Limits) {
    match result {
        Ok(v) => {
            let plan = v.plan;
            assert_eq!(v.model, "demo");
            assert!(!plan.prompts.is_empty());
            assert!(plan.params.n >= 1 && plan.params.n <= limits.max_n);
            assert!(plan.prompts.len() * plan.params.n <= limits.max_choices);
            for p in &plan.prompts {
                assert!(!p.is_empty());
                assert!(p.len() + plan.params.max_tokens <= limits.max_model_len);
                assert!(p.iter().all(|&t| (t as usize) < limits.vocab_size));
            }
        }
        Err(e) => assert!(e.status.is_client_error(), "{} {}", e.status, e.message),
    }
}

fuzz_target!(|data: &[u8]| {
    let tok = ByteTokenizer;
    let limits = Limits {
        max_model_len: 64,
        vocab_size: tok.vocab_size(),
        max_n: 128,
        max_choices: 256,
        max_stop_sequences: 16,
        max_stop_sequence_bytes: 256,
        max_stop_token_ids: 256,
    };
    let served = ["demo".to_owned()];
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
        grammar: None,
    };
    check(parse_and_validate_completion(data, &v), &limits);
    check(parse_and_validate_chat(data, &v), &limits);
});
