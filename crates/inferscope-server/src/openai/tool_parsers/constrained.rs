//! `tool_choice: "required"` and a named function: vLLM constrains the
//! output with a JSON schema made from the tools, then reads the JSON as
//! the calls. [`tool_choice_schema`] is that schema; the output is parsed
//! by the [`super::Format::Required`] and [`super::Format::Named`] formats.

use serde_json::{Map, Value, json};

/// What `tool_choice` asks for, checked against `tools`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: tools are not parsed.
    None,
    /// The model decides; its output is parsed by the server's parser.
    Auto,
    /// At least one call, of any of the tools.
    Required,
    /// One call of this function.
    Named(String),
}

/// The JSON schema vLLM constrains the output with (its
/// `_get_json_schema_from_tool`), or `None` when the output is free.
/// `tools` are the request's tool objects (`{"type": "function",
/// "function": {"name", "parameters", ...}}`), already validated.
///
/// - required: an array (at least one item) of `{"name": <one of the
///   names>, "parameters": <that tool's parameters>}`, each tool's `$defs`
///   lifted to the top (the same name defined twice differently is an error);
/// - named: the function's parameters schema.
///
/// A tool without `parameters` takes any object's worth of none:
/// `{"type": "object", "properties": {}}`.
pub fn tool_choice_schema(tools: &[Value], choice: &ToolChoice) -> Result<Option<Value>, String> {
    let function = |t: &Value| -> (String, Value) {
        let f = &t["function"];
        let name = f["name"].as_str().unwrap_or_default().to_owned();
        let params = match &f["parameters"] {
            Value::Null => json!({"type": "object", "properties": {}}),
            p => p.clone(),
        };
        (name, params)
    };
    match choice {
        ToolChoice::None | ToolChoice::Auto => Ok(None),
        ToolChoice::Named(name) => tools
            .iter()
            .map(function)
            .find(|(n, _)| n == name)
            .map(|(_, params)| Some(params))
            .ok_or_else(|| format!("tool `{name}` is not in `tools`")),
        ToolChoice::Required => {
            let mut defs = Map::new();
            let mut any_of = Vec::with_capacity(tools.len());
            for t in tools {
                let (name, mut params) = function(t);
                if let Some(Value::Object(d)) =
                    params.as_object_mut().and_then(|p| p.remove("$defs"))
                {
                    for (k, v) in d {
                        match defs.get(&k) {
                            Some(old) if *old != v => {
                                return Err(format!(
                                    "tool definition `{k}` has multiple schemas, which is not supported"
                                ));
                            }
                            _ => {
                                defs.insert(k, v);
                            }
                        }
                    }
                }
                any_of.push(json!({
                    "properties": {
                        "name": {"type": "string", "enum": [name]},
                        "parameters": params,
                    },
                    "required": ["name", "parameters"],
                }));
            }
            let mut schema = json!({
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "anyOf": any_of},
            });
            if !defs.is_empty() {
                schema["$defs"] = Value::Object(defs);
            }
            Ok(Some(schema))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::tool_parsers::{Format, parse_complete};

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
                               "required": ["city"], "$defs": {"City": {"type": "string"}}}}}),
            json!({"type": "function", "function": {"name": "now"}}),
        ]
    }

    /// The schema of vLLM's `_get_json_schema_from_tool`, key for key.
    #[test]
    fn required_is_an_array_of_any_tool() {
        let schema = tool_choice_schema(&tools(), &ToolChoice::Required)
            .expect("schema")
            .expect("constrained");
        assert_eq!(
            schema,
            json!({
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "anyOf": [
                    {"properties": {"name": {"type": "string", "enum": ["get_weather"]},
                                    "parameters": {"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
                                                   "required": ["city"]}},
                     "required": ["name", "parameters"]},
                    {"properties": {"name": {"type": "string", "enum": ["now"]},
                                    "parameters": {"type": "object", "properties": {}}},
                     "required": ["name", "parameters"]},
                ]},
                "$defs": {"City": {"type": "string"}},
            })
        );
    }

    #[test]
    fn named_is_the_functions_parameters() {
        let schema =
            tool_choice_schema(&tools(), &ToolChoice::Named("now".into())).expect("schema");
        assert_eq!(schema, Some(json!({"type": "object", "properties": {}})));
        let schema = tool_choice_schema(&tools(), &ToolChoice::Named("get_weather".into()))
            .expect("schema")
            .expect("some");
        assert_eq!(schema["required"], json!(["city"]));
        assert!(tool_choice_schema(&tools(), &ToolChoice::Named("nope".into())).is_err());
        assert_eq!(tool_choice_schema(&tools(), &ToolChoice::Auto), Ok(None));
        assert_eq!(tool_choice_schema(&tools(), &ToolChoice::None), Ok(None));
    }

    #[test]
    fn conflicting_defs_are_refused() {
        let mut t = tools();
        t.push(json!({"type": "function", "function": {"name": "other",
            "parameters": {"type": "object", "$defs": {"City": {"type": "integer"}}}}}));
        let err = tool_choice_schema(&t, &ToolChoice::Required).expect_err("conflict");
        assert!(err.contains("City"), "{err}");
    }

    /// The constrained outputs read back as calls: required's array with
    /// `json.dumps` arguments, a named function's output as written.
    #[test]
    fn constrained_outputs_become_calls() {
        let (content, calls) = parse_complete(
            Format::Required,
            r#"[{"name": "get_weather", "parameters": {"city":"Paris"}}, {"name": "now", "parameters": {}}]"#,
        );
        assert_eq!(content, None);
        let got: Vec<_> = calls
            .iter()
            .map(|c| (c.function.name.as_str(), c.function.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [("get_weather", r#"{"city": "Paris"}"#), ("now", "{}")]
        );
        let (content, calls) =
            parse_complete(Format::Named("get_weather".into()), r#"{"city":"Oslo"}"#);
        assert_eq!(content, None);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, r#"{"city":"Oslo"}"#);
        assert!(calls[0].id.starts_with("chatcmpl-tool-"));
    }
}
