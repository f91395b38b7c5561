//! The request fields of the OpenAI API and of vLLM's extensions that this
//! server does not honour yet: each is refused with a 400 naming it, unless
//! its value asks for nothing (null, false, empty, the default). One row per
//! field, so honouring a field later means deleting its row.
//!
//! Fields nobody defines are still accepted and ignored, as vLLM does; the
//! fields this server honours are parsed in [`super::protocol`].

use serde_json::Value;

use crate::error::ApiError;
use crate::openai::body::Fields;

/// A field refused unless its value is neutral.
#[derive(Debug, Clone, Copy)]
pub struct Refusal {
    /// The field's name in the request body.
    pub field: &'static str,
    /// Whether a value asks for nothing this server lacks.
    pub allows: fn(&Value) -> bool,
    /// Why, after "`field` is not supported by this server": what is missing.
    pub why: &'static str,
}

impl Refusal {
    /// The 400 that refuses this field.
    pub fn error(&self) -> ApiError {
        ApiError::invalid(
            format!(
                "`{}` is not supported by this server: {}",
                self.field, self.why
            ),
            Some(self.field),
        )
    }
}

/// A row of a table.
const fn refuse(field: &'static str, allows: fn(&Value) -> bool, why: &'static str) -> Refusal {
    Refusal { field, allows, why }
}

/// `null` or `false`.
fn off(v: &Value) -> bool {
    matches!(v, Value::Null | Value::Bool(false))
}

/// `null`, or an empty string, list or object.
fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// `null` or `true` (fields whose default is true).
fn on(v: &Value) -> bool {
    matches!(v, Value::Null | Value::Bool(true))
}

/// `null` or the number 0.
fn zero(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(0.0)
}

/// `null` or the number 1.
fn one(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(1.0)
}

/// `null`, empty, or a name of the one structured-output backend.
fn guidance(v: &Value) -> bool {
    empty(v) || matches!(v.as_str(), Some("auto" | "guidance" | "llguidance"))
}

/// `null` or `"none"`: no tool is called.
fn no_tool(v: &Value) -> bool {
    v.is_null() || v.as_str() == Some("none")
}

const LOGPROBS: &str = "tokens in log-probabilities are always their text";
const TOOLS: &str =
    "the legacy function-calling fields are not read; send `tools` and `tool_choice`";

/// Refused on both `/v1/completions` and `/v1/chat/completions`.
pub const COMMON: &[Refusal] = &[
    refuse("return_tokens_as_token_ids", off, LOGPROBS),
    refuse(
        "guided_decoding_backend",
        guidance,
        "the structured-output backend is llguidance (`guidance`)",
    ),
    refuse(
        "guided_whitespace_pattern",
        empty,
        "JSON is written without free whitespace; no other pattern is read",
    ),
    refuse(
        "logits_processors",
        empty,
        "custom logits processors are not implemented",
    ),
    refuse("use_beam_search", off, "beam search is not implemented"),
    refuse("length_penalty", one, "beam search is not implemented"),
    refuse(
        "truncate_prompt_tokens",
        Value::is_null,
        "prompts are never truncated; shorten the prompt instead",
    ),
    refuse(
        "spaces_between_special_tokens",
        on,
        "the spacing of special tokens in the text is not configurable",
    ),
    refuse(
        "priority",
        zero,
        "requests carry no priority: admission is fair across tenants, first come first served within one",
    ),
    refuse(
        "cache_salt",
        empty,
        "the prefix cache is shared by all requests",
    ),
    refuse(
        "kv_transfer_params",
        empty,
        "disaggregated prefill is not implemented",
    ),
    refuse("vllm_xargs", empty, "no extra arguments are read"),
    refuse(
        "mm_processor_kwargs",
        empty,
        "multimodal input is not implemented",
    ),
];

/// Refused on `/v1/completions` only.
pub const COMPLETIONS: &[Refusal] = &[
    refuse(
        "suffix",
        empty,
        "insertion (text after the completion) is not implemented",
    ),
    refuse("prompt_embeds", empty, "prompts are text or token ids"),
];

/// Refused on `/v1/chat/completions` only.
pub const CHAT: &[Refusal] = &[
    refuse("functions", empty, TOOLS),
    refuse("function_call", no_tool, TOOLS),
    refuse("echo", off, "echoing the last message is not implemented"),
    refuse(
        "continue_final_message",
        off,
        "the conversation always ends with a new assistant turn",
    ),
    refuse(
        "chat_template",
        empty,
        "the server's chat template (the model's, or --chat-template) is always used",
    ),
    refuse(
        "chat_template_kwargs",
        empty,
        "the chat template takes no extra arguments",
    ),
    refuse(
        "documents",
        empty,
        "documents are not passed to the chat template",
    ),
    refuse(
        "reasoning_effort",
        Value::is_null,
        "reasoning is not controlled",
    ),
    refuse("modalities", modalities_text, "only text is produced"),
    refuse("audio", empty, "only text is produced"),
    refuse("prediction", empty, "predicted outputs are not implemented"),
    refuse("web_search_options", empty, "web search is not implemented"),
];

/// `null` or `["text"]`.
fn modalities_text(v: &Value) -> bool {
    v.is_null()
        || v.as_array()
            .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")))
}

/// The first field of the body that one of `tables` refuses, in body
/// order. Only those fields' values are parsed; the body itself was parsed
/// once, into its fields, by the caller.
pub fn check(fields: &Fields, tables: &[&[Refusal]]) -> Result<(), ApiError> {
    let find = |key: &str| {
        tables
            .iter()
            .flat_map(|t| t.iter())
            .find(|r| r.field == key)
    };
    for (key, value) in fields.iter() {
        let Some(refusal) = find(key) else {
            continue;
        };
        // A value that is not JSON cannot be in a parsed body.
        let value: Value = serde_json::from_str(value.get()).unwrap_or(Value::Null);
        if !(refusal.allows)(&value) {
            return Err(refusal.error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &[u8]) -> Fields<'_> {
        Fields::parse(body).expect("a JSON object")
    }

    /// No field is listed twice (its rows could disagree).
    #[test]
    fn every_field_is_listed_once() {
        let mut all: Vec<&str> = [COMMON, COMPLETIONS, CHAT]
            .iter()
            .flat_map(|t| t.iter().map(|r| r.field))
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a field is listed twice");
    }

    /// Neutral values pass, others are refused naming the field; unknown
    /// fields and fields of other tables pass.
    #[test]
    fn neutral_values_pass_and_the_rest_is_refused() {
        let tables: &[&[Refusal]] = &[COMMON, CHAT];
        for ok in [
            r#"{"logprobs": false, "top_logprobs": 0, "tools": [], "tool_choice": "none"}"#,
            r#"{"response_format": {"type": "json_object"}, "guided_json": {}, "priority": 0}"#,
            r#"{"unknown_field": {"tools": [1]}, "suffix": "x", "chat_template_kwargs": {}}"#,
        ] {
            assert!(check(&fields(ok.as_bytes()), tables).is_ok(), "{ok}");
        }
        for (bad, field) in [
            (
                r#"{"return_tokens_as_token_ids": true}"#,
                "return_tokens_as_token_ids",
            ),
            (
                r#"{"guided_decoding_backend": "xgrammar"}"#,
                "guided_decoding_backend",
            ),
            (r#"{"functions": [{"name": "f"}]}"#, "functions"),
            (r#"{"function_call": "auto"}"#, "function_call"),
            (
                r#"{"n": 1, "guided_whitespace_pattern": " ", "tools": [1]}"#,
                "guided_whitespace_pattern",
            ),
            (
                r#"{"chat_template_kwargs": {"enable_thinking": false}}"#,
                "chat_template_kwargs",
            ),
        ] {
            let err = check(&fields(bad.as_bytes()), tables).expect_err(bad);
            assert_eq!(err.status.as_u16(), 400);
            assert_eq!(err.param, Some(field), "{bad}");
            assert!(
                err.message.contains(&format!("`{field}`")),
                "{}",
                err.message
            );
        }
        // The completions table is not consulted here.
        assert!(check(&fields(br#"{"suffix": "tail"}"#), tables).is_ok());
        assert!(check(&fields(br#"{"suffix": "tail"}"#), &[COMPLETIONS]).is_err());
    }

    /// A key is looked up as JSON means it, escapes and all: a key the
    /// parser has to unescape (into its scratch buffer, not borrowed from
    /// the body) is found as well as a plain one.
    #[test]
    fn escaped_keys_are_looked_up_unescaped() {
        let tables: &[&[Refusal]] = &[COMMON, CHAT];
        for bad in [
            r#"{"functions": [{"name": "f"}]}"#,
            r#"{"\u0066unctions": [{"name": "f"}]}"#,
            r#"{"model": "m", "func\u0074ions": [{"name": "f"}]}"#,
        ] {
            let err = check(&fields(bad.as_bytes()), tables).expect_err(bad);
            assert_eq!(err.param, Some("functions"), "{bad}");
        }
        assert!(check(&fields(br#"{"functions\u0000": [1]}"#), tables).is_ok());
    }
}
