//! The request fields that ask for structured outputs, read into the
//! engine's one description of a constraint ([`StructuredOutput`]) and
//! compiled against the tokenizer during validation (on a validation
//! worker: see `handlers::validate`).
//!
//! Fields, as vLLM reads them: OpenAI's `response_format` (`text`,
//! `json_object`, `json_schema` with `schema` and `strict`, and vLLM's
//! `structural_tag`), vLLM's `structured_outputs: {json, regex, choice,
//! grammar, json_object, structural_tag}` and the
//! legacy `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.
//! At most one may ask for a constraint; every mistake is a 400 naming the
//! field.

use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

use inferscope_engine::{CompiledGrammar, GrammarCompiler, StructuredOutput};
use serde_json::Value;

use crate::error::ApiError;

/// The structured-output compiler, built on a thread of its own while the
/// server starts (a trie of every token: tens of milliseconds for a 128k
/// vocabulary, kept off the path to the first request); the first request
/// that compiles a constraint waits for it, on a validation worker.
pub struct StartupGrammar {
    built: OnceLock<Option<GrammarCompiler>>,
    building: Mutex<Option<JoinHandle<Option<GrammarCompiler>>>>,
}

impl StartupGrammar {
    /// Starts `build` (`None`: the vocabulary cannot be read) on a thread.
    pub fn spawn(build: impl FnOnce() -> Option<GrammarCompiler> + Send + 'static) -> Self {
        let thread = std::thread::Builder::new()
            .name("grammar-trie".into())
            .spawn(build);
        match thread {
            Ok(h) => Self {
                built: OnceLock::new(),
                building: Mutex::new(Some(h)),
            },
            // No thread to be had: structured outputs are refused, as for
            // a vocabulary that cannot be read.
            Err(e) => {
                tracing::warn!(error = %e, "structured outputs are unavailable: no thread to build the token trie");
                Self::ready(None)
            }
        }
    }

    /// One already built (or none).
    pub fn ready(compiler: Option<GrammarCompiler>) -> Self {
        Self {
            built: OnceLock::from(compiler),
            building: Mutex::new(None),
        }
    }

    /// The compiler, once built (waiting for it the first time); `None`
    /// when the vocabulary cannot be read. Blocks: call it off the runtime.
    pub fn get(&self) -> Option<&GrammarCompiler> {
        self.built
            .get_or_init(|| {
                let h = self.building.lock().ok()?.take()?;
                h.join().ok().flatten()
            })
            .as_ref()
    }
}

/// The structured-output fields of a request body, as sent.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct StructuredFields {
    /// OpenAI's `response_format`.
    pub response_format: Option<Value>,
    /// vLLM's `structured_outputs`.
    pub structured_outputs: Option<Value>,
    /// vLLM's legacy `guided_json`: a schema (object or JSON text).
    pub guided_json: Option<Value>,
    /// vLLM's legacy `guided_regex`.
    pub guided_regex: Option<Value>,
    /// vLLM's legacy `guided_choice`.
    pub guided_choice: Option<Value>,
    /// vLLM's legacy `guided_grammar`.
    pub guided_grammar: Option<Value>,
}

/// The constraint a request asks for and the field that asked, if any.
pub fn read(f: &StructuredFields) -> Result<Option<(StructuredOutput, &'static str)>, ApiError> {
    let mut found: Option<(StructuredOutput, &'static str)> = None;
    let mut take = |c: Option<StructuredOutput>, field: &'static str| -> Result<(), ApiError> {
        let Some(c) = c else { return Ok(()) };
        if let Some((_, first)) = &found {
            return Err(ApiError::invalid(
                format!("`{field}` and `{first}` both constrain the output: send one of them"),
                Some(field),
            ));
        }
        found = Some((c, field));
        Ok(())
    };
    take(
        response_format(f.response_format.as_ref())?,
        "response_format",
    )?;
    take(
        structured_outputs(f.structured_outputs.as_ref())?,
        "structured_outputs",
    )?;
    take(
        non_null(&f.guided_json)
            .map(|v| json_schema(v, "guided_json"))
            .transpose()?,
        "guided_json",
    )?;
    take(
        non_null(&f.guided_regex)
            .map(|v| string(v, "guided_regex").map(StructuredOutput::Regex))
            .transpose()?,
        "guided_regex",
    )?;
    take(
        non_null(&f.guided_choice)
            .map(|v| choices(v, "guided_choice"))
            .transpose()?,
        "guided_choice",
    )?;
    take(
        non_null(&f.guided_grammar)
            .map(|v| string(v, "guided_grammar").map(StructuredOutput::Grammar))
            .transpose()?,
        "guided_grammar",
    )?;
    Ok(found)
}

/// Reads and compiles the request's constraint. `compiler` is `None` when
/// the tokenizer's vocabulary could not be read at start-up.
pub fn compile(
    f: &StructuredFields,
    compiler: &StartupGrammar,
) -> Result<Option<CompiledGrammar>, ApiError> {
    let Some((constraint, field)) = read(f)? else {
        return Ok(None);
    };
    compile_constraint(constraint, field, compiler.get()).map(Some)
}

/// Compiles one constraint; errors name `field`, the request field it came
/// from (`tool_choice` for the schema of a required or named tool call).
pub fn compile_constraint(
    constraint: StructuredOutput,
    field: &'static str,
    compiler: Option<&GrammarCompiler>,
) -> Result<CompiledGrammar, ApiError> {
    let Some(compiler) = compiler else {
        return Err(ApiError::invalid(
            format!(
                "`{field}` is not supported with this model: its tokenizer's vocabulary could not be read for grammar masks"
            ),
            Some(field),
        ));
    };
    let kind = constraint.kind();
    compiler.compile(constraint).map_err(|e| {
        let what = match kind {
            "json" => "an invalid JSON schema",
            "regex" => "an invalid regular expression",
            "grammar" => "an invalid grammar",
            "structural_tag" => "an invalid structural tag",
            _ => "an invalid constraint",
        };
        ApiError::invalid(format!("`{field}` is {what}: {e}"), Some(field))
    })
}

/// `null` counts as absent.
fn non_null(v: &Option<Value>) -> Option<&Value> {
    v.as_ref().filter(|v| !v.is_null())
}

fn string(v: &Value, field: &'static str) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| ApiError::invalid(format!("`{field}` must be a string"), Some(field)))
}

fn choices(v: &Value, field: &'static str) -> Result<StructuredOutput, ApiError> {
    let bad = || {
        ApiError::invalid(
            format!("`{field}` must be a non-empty list of strings"),
            Some(field),
        )
    };
    let list = v.as_array().filter(|a| !a.is_empty()).ok_or_else(bad)?;
    list.iter()
        .map(|c| c.as_str().map(str::to_owned).ok_or_else(bad))
        .collect::<Result<Vec<_>, _>>()
        .map(StructuredOutput::Choice)
}

/// A JSON schema given as an object (or a boolean schema), or as JSON text
/// (vLLM accepts both).
fn json_schema(v: &Value, field: &'static str) -> Result<StructuredOutput, ApiError> {
    let schema = match v {
        Value::String(text) => serde_json::from_str(text).map_err(|e| {
            ApiError::invalid(format!("`{field}` is not valid JSON: {e}"), Some(field))
        })?,
        other => other.clone(),
    };
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(ApiError::invalid(
            format!("`{field}` must be a JSON schema (an object)"),
            Some(field),
        ));
    }
    Ok(StructuredOutput::Json(schema))
}

/// `response_format`: `text` (no constraint), `json_object`, or
/// `json_schema` with `json_schema.schema` (`strict` is accepted: the
/// output is always held to the schema, as vLLM does).
fn response_format(v: Option<&Value>) -> Result<Option<StructuredOutput>, ApiError> {
    const F: &str = "response_format";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = v.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            "`response_format.type` is required: `text`, `json_object`, `json_schema` or `structural_tag`",
            Some(F),
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(StructuredOutput::JsonObject)),
        // vLLM's: the object itself (`structures` and `triggers`, or `format`).
        "structural_tag" => Ok(Some(StructuredOutput::StructuralTag(v.clone()))),
        "json_schema" => {
            let js = v
                .get("json_schema")
                .filter(|j| j.is_object())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "`response_format.json_schema` is required with type `json_schema`",
                        Some(F),
                    )
                })?;
            if let Some(strict) = js.get("strict")
                && !(strict.is_null() || strict.is_boolean())
            {
                return Err(ApiError::invalid(
                    "`response_format.json_schema.strict` must be a boolean",
                    Some(F),
                ));
            }
            match js.get("schema").filter(|s| !s.is_null()) {
                Some(schema) => json_schema(schema, F).map(Some),
                // OpenAI's schema is optional: without one, any JSON object.
                None => Ok(Some(StructuredOutput::JsonObject)),
            }
        }
        other => Err(ApiError::invalid(
            format!(
                "`response_format.type` `{}` is not supported: `text`, `json_object`, `json_schema` or `structural_tag`",
                other.chars().take(64).collect::<String>()
            ),
            Some(F),
        )),
    }
}

/// vLLM's `structured_outputs` object: exactly one of `json`, `regex`,
/// `choice`, `grammar`, `json_object`.
fn structured_outputs(v: Option<&Value>) -> Result<Option<StructuredOutput>, ApiError> {
    const F: &str = "structured_outputs";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::invalid("`structured_outputs` must be an object", Some(F)))?;
    let mut found = None;
    for (key, val) in obj {
        if val.is_null() || val == &Value::Bool(false) {
            continue;
        }
        let c = match key.as_str() {
            "json" => json_schema(val, F)?,
            "regex" => StructuredOutput::Regex(string(val, F)?),
            "choice" => choices(val, F)?,
            "grammar" => StructuredOutput::Grammar(string(val, F)?),
            "json_object" if val == &Value::Bool(true) => StructuredOutput::JsonObject,
            // vLLM takes JSON text; an object is read too.
            "structural_tag" => match val {
                Value::String(text) => {
                    StructuredOutput::StructuralTag(serde_json::from_str(text).map_err(|e| {
                        ApiError::invalid(
                            format!("`structured_outputs.structural_tag` is not valid JSON: {e}"),
                            Some(F),
                        )
                    })?)
                }
                other => StructuredOutput::StructuralTag(other.clone()),
            },
            // Options that change nothing here.
            "disable_fallback" | "disable_any_whitespace" | "disable_additional_properties" => {
                continue;
            }
            "backend" if matches!(val.as_str(), Some("auto" | "guidance" | "llguidance")) => {
                continue;
            }
            other => {
                return Err(ApiError::invalid(
                    format!(
                        "`structured_outputs.{}` is not supported by this server (supported: json, regex, choice, grammar, json_object, structural_tag)",
                        other.chars().take(64).collect::<String>()
                    ),
                    Some(F),
                ));
            }
        };
        if found.is_some() {
            return Err(ApiError::invalid(
                "`structured_outputs` must set exactly one of json, regex, choice, grammar, json_object, structural_tag",
                Some(F),
            ));
        }
        found = Some(c);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &str) -> StructuredFields {
        serde_json::from_str(body).expect("json")
    }

    #[test]
    fn the_startup_grammar_is_waited_for_once_and_only_for_a_constraint() {
        let words: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let g = StartupGrammar::spawn(move || {
            // Held until the test lets it finish.
            rx.recv().ok()?;
            GrammarCompiler::new(words, 0).ok()
        });
        // A request without a constraint never asks for the compiler, so
        // it does not wait for the build.
        assert!(compile(&fields("{}"), &g).expect("no constraint").is_none());
        tx.send(()).expect("builder waiting");
        let body = r#"{"guided_regex": "a+"}"#;
        let compiled = compile(&fields(body), &g).expect("compiled once built");
        assert_eq!(compiled.expect("a constraint").constraint().kind(), "regex");
        assert!(g.get().is_some(), "kept after the first wait");
        // A vocabulary that could not be read: the fields are 400s.
        let none = StartupGrammar::ready(None);
        let e = compile(&fields(body), &none).expect_err("no compiler");
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn each_field_reads_into_its_constraint() {
        for (body, kind, field) in [
            (
                r#"{"response_format": {"type": "json_object"}}"#,
                "json_object",
                "response_format",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}}}"#,
                "json",
                "response_format",
            ),
            (
                r#"{"structured_outputs": {"regex": "a+"}}"#,
                "regex",
                "structured_outputs",
            ),
            (
                r#"{"structured_outputs": {"choice": ["a"]}}"#,
                "choice",
                "structured_outputs",
            ),
            (
                r#"{"guided_json": "{\"type\": \"string\"}"}"#,
                "json",
                "guided_json",
            ),
            (r#"{"guided_regex": "a+"}"#, "regex", "guided_regex"),
            (
                r#"{"guided_choice": ["a", "b"]}"#,
                "choice",
                "guided_choice",
            ),
            (
                r#"{"guided_grammar": "start: \"a\""}"#,
                "grammar",
                "guided_grammar",
            ),
            (
                r#"{"structured_outputs": {"structural_tag": "{\"structures\": [], \"triggers\": []}"}}"#,
                "structural_tag",
                "structured_outputs",
            ),
            (
                r#"{"response_format": {"type": "structural_tag", "format": {"type": "any_text"}}}"#,
                "structural_tag",
                "response_format",
            ),
        ] {
            let (c, f) = read(&fields(body)).expect(body).expect(body);
            assert_eq!((c.kind(), f), (kind, field), "{body}");
        }
        for none in [
            r#"{}"#,
            r#"{"response_format": {"type": "text"}, "guided_json": null}"#,
        ] {
            assert!(read(&fields(none)).expect(none).is_none());
        }
    }

    #[test]
    fn mistakes_are_400s_naming_the_field() {
        for (body, field) in [
            (r#"{"response_format": {"type": "xml"}}"#, "response_format"),
            (
                r#"{"response_format": {"type": "json_schema"}}"#,
                "response_format",
            ),
            (r#"{"guided_choice": []}"#, "guided_choice"),
            (r#"{"guided_regex": 3}"#, "guided_regex"),
            (r#"{"guided_json": "{not json"}"#, "guided_json"),
            (
                r#"{"structured_outputs": {"structural_tag": "x"}}"#,
                "structured_outputs",
            ),
            (
                r#"{"structured_outputs": {"whitespace_pattern": " "}}"#,
                "structured_outputs",
            ),
            (
                r#"{"structured_outputs": {"regex": "a", "choice": ["b"]}}"#,
                "structured_outputs",
            ),
            (
                r#"{"guided_regex": "a", "guided_choice": ["b"]}"#,
                "guided_choice",
            ),
        ] {
            let e = read(&fields(body)).expect_err(body);
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param, Some(field), "{body}: {}", e.message);
        }
    }
}
