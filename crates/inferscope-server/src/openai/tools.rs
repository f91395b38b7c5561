//! The tool-calling fields of a chat request, as vLLM reads them: `tools`
//! (checked, and passed to the chat template as transformers' `tools`),
//! `tool_choice`, `parallel_tool_calls`, and the messages that carry calls
//! (`assistant` with `tool_calls`, `tool` with `tool_call_id`).

use inferscope_model::chat_template::{Value, ValueKind};

use crate::error::ApiError;
use crate::openai::tool_parsers::constrained::{ToolChoice, tool_choice_schema};
use crate::openai::tool_parsers::{Format, ParserName};

/// The server's tool-calling flags (vLLM's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolSettings {
    /// `--enable-auto-tool-choice`: `tool_choice: "auto"` is served.
    pub auto_tool_choice: bool,
    /// `--tool-call-parser`: how model output becomes calls.
    pub parser: Option<ParserName>,
    /// `--exclude-tools-when-tool-choice-none`: the template does not see
    /// the tools when `tool_choice` is `none`.
    pub exclude_tools_when_none: bool,
}

/// What a request's tool fields come to.
#[derive(Debug, Clone, Default)]
pub struct ToolPlan {
    /// `tools` as the chat template sees them (`None`: no tools).
    pub template_tools: Option<Vec<Value>>,
    /// How the output is read into `tool_calls` (`None`: it is not).
    pub format: Option<Format>,
    /// `parallel_tool_calls: false`: only the first call is returned.
    pub single_call: bool,
    /// The tool markers are special tokens: keep them in the text.
    pub keep_special_tokens: bool,
    /// `required` or a named function: the JSON schema the output is
    /// constrained to, as vLLM constrains it.
    pub schema: Option<serde_json::Value>,
    /// How many tools were offered and the `tool_choice` (`none`, `auto`,
    /// `required`, `function`), when any were (the request log, the span).
    pub offered: Option<(usize, &'static str)>,
}

/// Checks `tools` and `tool_choice` against the server's settings and
/// decides what the template sees and how the output is parsed.
pub fn plan_tools(
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<&serde_json::Value>,
    settings: &ToolSettings,
) -> Result<ToolPlan, ApiError> {
    let tools = match tools {
        None => Vec::new(),
        Some(t) => check_tools(&t)?,
    };
    let choice = parse_choice(tool_choice.as_ref(), &tools)?;
    let single_call = match parallel_tool_calls {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(true)) => false,
        Some(serde_json::Value::Bool(false)) => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "`parallel_tool_calls` must be a boolean",
                Some("parallel_tool_calls"),
            ));
        }
    };
    let offered = (!tools.is_empty()).then(|| {
        let name = match &choice {
            ToolChoice::None => "none",
            ToolChoice::Auto => "auto",
            ToolChoice::Required => "required",
            // OpenAI's `{"type": "function", ...}`; the name stays out of logs.
            ToolChoice::Named(_) => "function",
        };
        (tools.len(), name)
    });
    let hidden = choice == ToolChoice::None && settings.exclude_tools_when_none;
    let template_tools = (!tools.is_empty() && !hidden).then(|| tools.clone());
    let mut schema = None;
    let format = match &choice {
        ToolChoice::None => None,
        ToolChoice::Auto => match (settings.auto_tool_choice, settings.parser) {
            (true, Some(p)) => Some(Format::Parser(p)),
            _ => {
                return Err(ApiError::invalid(
                    "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                    Some("tool_choice"),
                ));
            }
        },
        // vLLM constrains the output with the schema and reads it with the
        // format; the request's constraint is compiled in validation.rs.
        ToolChoice::Required | ToolChoice::Named(_) => {
            let (format, s) = constrained(&tools, &choice)?;
            schema = Some(s);
            Some(format)
        }
    };
    let keep_special_tokens =
        matches!(&format, Some(Format::Parser(p)) if p.keeps_special_tokens());
    Ok(ToolPlan {
        template_tools,
        format,
        single_call,
        keep_special_tokens,
        schema,
        offered,
    })
}

/// What `tool_choice` `required` or a named function needs: the format
/// that reads the constrained output into calls, and the JSON schema
/// ([`tool_choice_schema`]) that constrains it.
pub fn constrained(
    tools: &[Value],
    choice: &ToolChoice,
) -> Result<(Format, serde_json::Value), ApiError> {
    let json_tools: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| serde_json::to_value(t).unwrap_or_default())
        .collect();
    let schema = tool_choice_schema(&json_tools, choice)
        .map_err(|e| ApiError::invalid(e, Some("tools")))?
        .unwrap_or_default();
    let format = match choice {
        ToolChoice::Named(name) => Format::Named(name.clone()),
        _ => Format::Required,
    };
    Ok((format, schema))
}

/// `tools` as the chat template sees them, checked as a chat request's
/// are (`/tokenize` of messages with tools); `None` for an empty list.
pub fn template_tools(tools: Value) -> Result<Option<Vec<Value>>, ApiError> {
    let tools = check_tools(&tools)?;
    Ok((!tools.is_empty()).then_some(tools))
}

/// A field of a map-like value, `None` when absent or none.
fn field(v: &Value, key: &str) -> Option<Value> {
    v.get_attr(key)
        .ok()
        .filter(|f| !f.is_undefined() && !f.is_none())
}

/// `tools`: a list of `{"type": "function", "function": {"name", ...}}`.
/// Each is returned as vLLM hands it to the template (pydantic's
/// `model_dump()`): `type`, then `function` with `name`, `description`
/// and `parameters` (none when absent) and any other keys after them.
fn check_tools(tools: &Value) -> Result<Vec<Value>, ApiError> {
    let bad = |msg: String| ApiError::invalid(msg, Some("tools"));
    if tools.kind() != ValueKind::Seq {
        return Err(bad("`tools` must be a list of tools".into()));
    }
    let mut out = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (i, tool) in tools.try_iter().into_iter().flatten().enumerate() {
        if tool.kind() != ValueKind::Map {
            return Err(bad(format!("`tools[{i}]` must be an object")));
        }
        match field(&tool, "type") {
            Some(t) if t.as_str() == Some("function") => {}
            None => {}
            Some(t) => {
                return Err(bad(format!(
                    "`tools[{i}].type` must be \"function\", got {t}"
                )));
            }
        }
        let Some(function) = field(&tool, "function").filter(|f| f.kind() == ValueKind::Map) else {
            return Err(bad(format!("`tools[{i}].function` must be an object")));
        };
        let name = match field(&function, "name").as_ref().and_then(Value::as_str) {
            Some(n) if valid_name(n) => n.to_owned(),
            _ => {
                return Err(bad(format!(
                    "`tools[{i}].function.name` must be a string of 1 to 64 letters, digits, `_` or `-`"
                )));
            }
        };
        if names.contains(&name) {
            return Err(bad(format!(
                "`tools[{i}].function.name` `{name}` is given twice"
            )));
        }
        if let Some(d) = field(&function, "description")
            && d.as_str().is_none()
        {
            return Err(bad(format!(
                "`tools[{i}].function.description` must be a string"
            )));
        }
        if let Some(p) = field(&function, "parameters")
            && p.kind() != ValueKind::Map
        {
            return Err(bad(format!(
                "`tools[{i}].function.parameters` must be a JSON schema object"
            )));
        }
        names.push(name);
        out.push(model_dump(&tool, &function));
    }
    Ok(out)
}

/// OpenAI's rule for function names.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The tool in pydantic's `model_dump()` order (see [`check_tools`]).
fn model_dump(tool: &Value, function: &Value) -> Value {
    const DECLARED: [&str; 3] = ["name", "description", "parameters"];
    let mut f: Vec<(Value, Value)> = DECLARED
        .iter()
        .map(|k| {
            (
                Value::from(*k),
                field(function, k).unwrap_or(Value::from(())),
            )
        })
        .collect();
    f.extend(extra_keys(function, &DECLARED));
    let mut t = vec![
        (Value::from("type"), Value::from("function")),
        (Value::from("function"), Value::from_iter(f)),
    ];
    t.extend(extra_keys(tool, &["type", "function"]));
    Value::from_iter(t)
}

/// The entries of map `v` other than `declared`, in order.
fn extra_keys(v: &Value, declared: &[&str]) -> Vec<(Value, Value)> {
    v.try_iter()
        .into_iter()
        .flatten()
        .filter(|k| !k.as_str().is_some_and(|k| declared.contains(&k)))
        .map(|k| {
            let val = v.get_item(&k).unwrap_or_default();
            (k, val)
        })
        .collect()
}

/// `tool_choice`: `none`, `auto`, `required` or `{"type": "function",
/// "function": {"name"}}`; absent means `auto` with tools, `none` without.
fn parse_choice(choice: Option<&Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let bad = |msg: String| ApiError::invalid(msg, Some("tool_choice"));
    let choice = match choice.filter(|c| !c.is_none()) {
        None if tools.is_empty() => return Ok(ToolChoice::None),
        None => return Ok(ToolChoice::Auto),
        Some(c) => c,
    };
    let parsed = match (choice.as_str(), choice.kind()) {
        (Some("none"), _) => ToolChoice::None,
        (Some("auto"), _) => ToolChoice::Auto,
        (Some("required"), _) => ToolChoice::Required,
        (_, ValueKind::Map) => {
            let name = field(choice, "function")
                .and_then(|f| field(&f, "name"))
                .and_then(|n| n.as_str().map(str::to_owned));
            match name {
                Some(n) => ToolChoice::Named(n),
                None => {
                    return Err(bad(
                        "a named `tool_choice` is {\"type\": \"function\", \"function\": {\"name\": ...}}".into(),
                    ));
                }
            }
        }
        _ => {
            return Err(bad(format!(
                "invalid value for `tool_choice`: {choice}; only named tools, \"none\", \"auto\" or \"required\" are supported"
            )));
        }
    };
    if parsed != ToolChoice::None && tools.is_empty() {
        return Err(bad("when using `tool_choice`, `tools` must be set".into()));
    }
    if let ToolChoice::Named(name) = &parsed {
        let known = tools.iter().any(|t| {
            field(t, "function")
                .and_then(|f| field(&f, "name"))
                .is_some_and(|n| n.as_str() == Some(name.as_str()))
        });
        if !known {
            return Err(bad(format!(
                "tool `{name}` named in `tool_choice` is not in `tools`"
            )));
        }
    }
    Ok(parsed)
}

/// An assistant message's `tool_calls` as templates expect them: each
/// call's `function.arguments`, a JSON string on the wire, becomes the
/// mapping it encodes (as vLLM does before rendering), keys in order.
pub fn template_tool_calls(calls: &Value, m: usize) -> Result<Value, ApiError> {
    let bad = |msg: String| ApiError::invalid(msg, Some("messages"));
    if calls.kind() != ValueKind::Seq {
        return Err(bad(format!("`messages[{m}].tool_calls` must be a list")));
    }
    let mut out = Vec::new();
    for (i, call) in calls.try_iter().into_iter().flatten().enumerate() {
        let at = format!("messages[{m}].tool_calls[{i}]");
        let function = field(&call, "function").filter(|f| f.kind() == ValueKind::Map);
        let Some(function) = function else {
            return Err(bad(format!("`{at}.function` must be an object")));
        };
        if field(&function, "name")
            .and_then(|n| n.as_str().map(|_| ()))
            .is_none()
        {
            return Err(bad(format!("`{at}.function.name` must be a string")));
        }
        let arguments = match field(&function, "arguments") {
            None => Value::from(std::collections::BTreeMap::<String, Value>::new()),
            Some(a) => match a.as_str() {
                Some("") => Value::from(std::collections::BTreeMap::<String, Value>::new()),
                Some(s) => serde_json::from_str::<Value>(s).map_err(|e| {
                    bad(format!("`{at}.function.arguments` is not valid JSON: {e}"))
                })?,
                None => a,
            },
        };
        let mut f: Vec<(Value, Value)> = function
            .try_iter()
            .into_iter()
            .flatten()
            .map(|k| {
                let v = if k.as_str() == Some("arguments") {
                    arguments.clone()
                } else {
                    function.get_item(&k).unwrap_or_default()
                };
                (k, v)
            })
            .collect();
        if field(&function, "arguments").is_none()
            && !f.iter().any(|(k, _)| k.as_str() == Some("arguments"))
        {
            f.push((Value::from("arguments"), arguments));
        }
        let entries: Vec<(Value, Value)> = call
            .try_iter()
            .into_iter()
            .flatten()
            .map(|k| {
                let v = if k.as_str() == Some("function") {
                    Value::from_iter(f.clone())
                } else {
                    call.get_item(&k).unwrap_or_default()
                };
                (k, v)
            })
            .collect();
        out.push(Value::from_iter(entries));
    }
    Ok(Value::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(json: &str) -> Value {
        serde_json::from_str(json).expect("json")
    }

    const SETTINGS: ToolSettings = ToolSettings {
        auto_tool_choice: true,
        parser: Some(ParserName::Hermes),
        exclude_tools_when_none: false,
    };

    const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}}]"#;

    #[test]
    fn tools_reach_the_template_in_vllms_shape() {
        let p = plan_tools(Some(v(TOOLS)), None, None, &SETTINGS).expect("plan");
        let tools = p.template_tools.expect("tools");
        // Keys in pydantic's order, the absent description as none.
        assert_eq!(
            serde_json::to_string(&tools[0]).expect("json"),
            r#"{"type":"function","function":{"name":"get_weather","description":null,"parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}}"#
        );
        assert_eq!(p.format, Some(Format::Parser(ParserName::Hermes)));
        assert!(p.keep_special_tokens);
    }

    #[test]
    fn choices_and_their_errors() {
        let plan = |tools: Option<&str>, choice: Option<&str>, s: &ToolSettings| {
            plan_tools(tools.map(v), choice.map(v), None, s)
        };
        // none: the template still sees the tools, nothing is parsed.
        let p = plan(Some(TOOLS), Some(r#""none""#), &SETTINGS).expect("none");
        assert!(p.template_tools.is_some() && p.format.is_none());
        let excl = ToolSettings {
            exclude_tools_when_none: true,
            ..SETTINGS
        };
        let p = plan(Some(TOOLS), Some(r#""none""#), &excl).expect("none");
        assert!(p.template_tools.is_none());
        // auto (explicit or by default) needs the flags.
        for choice in [None, Some(r#""auto""#)] {
            let err = plan(Some(TOOLS), choice, &ToolSettings::default()).expect_err("no flag");
            assert_eq!(err.param, Some("tool_choice"));
            assert!(
                err.message.contains("--enable-auto-tool-choice"),
                "{}",
                err.message
            );
        }
        for (tools, choice, param, says) in [
            (
                Some(TOOLS),
                Some(r#"{"type": "function", "function": {"name": "nope"}}"#),
                "tool_choice",
                "nope",
            ),
            (
                Some(TOOLS),
                Some(r#""sometimes""#),
                "tool_choice",
                "sometimes",
            ),
            (
                None,
                Some(r#""auto""#),
                "tool_choice",
                "`tools` must be set",
            ),
            (Some(r#"{"type": "function"}"#), None, "tools", "list"),
            (
                Some(r#"[{"type": "function"}]"#),
                None,
                "tools",
                "tools[0].function",
            ),
            (
                Some(r#"[{"type": "retrieval", "function": {"name": "a"}}]"#),
                None,
                "tools",
                "tools[0].type",
            ),
            (
                Some(r#"[{"function": {"name": "a b"}}]"#),
                None,
                "tools",
                "tools[0].function.name",
            ),
            (
                Some(r#"[{"function": {"name": "a"}}, {"function": {"name": "a"}}]"#),
                None,
                "tools",
                "twice",
            ),
            (
                Some(r#"[{"function": {"name": "a", "parameters": [1]}}]"#),
                None,
                "tools",
                "parameters",
            ),
        ] {
            let err = plan(tools, choice, &SETTINGS).expect_err(says);
            assert_eq!(err.param, Some(param), "{says}");
            assert!(err.message.contains(says), "{says}: {}", err.message);
        }
        let p = plan_tools(
            Some(v(TOOLS)),
            None,
            Some(&serde_json::json!(false)),
            &SETTINGS,
        )
        .expect("single");
        assert!(p.single_call);
    }

    /// The hook's inputs: the format and the schema, from the checked tools.
    #[test]
    fn required_and_named_have_their_schema_and_format() {
        let tools = check_tools(&v(TOOLS)).expect("tools");
        let (format, schema) = constrained(&tools, &ToolChoice::Required).expect("required");
        assert_eq!(format, Format::Required);
        assert_eq!(
            schema["items"]["anyOf"][0]["properties"]["name"]["enum"][0],
            "get_weather"
        );
        let named = ToolChoice::Named("get_weather".into());
        let (format, schema) = constrained(&tools, &named).expect("named");
        assert_eq!(format, Format::Named("get_weather".into()));
        assert_eq!(schema["properties"]["city"]["type"], "string");
        // The plan carries them for validation.rs to compile.
        let p = plan_tools(Some(v(TOOLS)), Some(v(r#""required""#)), None, &SETTINGS)
            .expect("required");
        assert_eq!(p.format, Some(Format::Required));
        assert_eq!(p.schema.expect("schema")["minItems"], 1);
        // The same with the pythonic parser: the constrained output is JSON
        // whatever the parser; `auto` reads Python call lists.
        let pythonic = ToolSettings {
            parser: Some(ParserName::Pythonic),
            ..SETTINGS
        };
        for (choice, format) in [
            (r#""required""#, Format::Required),
            (
                r#"{"type": "function", "function": {"name": "get_weather"}}"#,
                Format::Named("get_weather".into()),
            ),
            (r#""auto""#, Format::Parser(ParserName::Pythonic)),
        ] {
            let p = plan_tools(Some(v(TOOLS)), Some(v(choice)), None, &pythonic).expect(choice);
            assert_eq!(p.format, Some(format), "{choice}");
            assert_eq!(p.schema.is_some(), choice != r#""auto""#, "{choice}");
            assert!(!p.keep_special_tokens, "{choice}");
        }
    }

    #[test]
    fn call_arguments_become_mappings_in_order() {
        let calls = v(
            r#"[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [true]}"}}]"#,
        );
        let out = template_tool_calls(&calls, 2).expect("calls");
        assert_eq!(
            serde_json::to_string(&out).expect("json"),
            r#"[{"id":"c1","type":"function","function":{"name":"f","arguments":{"z":1,"a":[true]}}}]"#
        );
        let bad = v(r#"[{"function": {"name": "f", "arguments": "{nope"}}]"#);
        let err = template_tool_calls(&bad, 2).expect_err("bad json");
        assert_eq!(err.param, Some("messages"));
        assert!(
            err.message
                .contains("messages[2].tool_calls[0].function.arguments"),
            "{}",
            err.message
        );
    }
}
