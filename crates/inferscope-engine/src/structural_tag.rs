//! vLLM's `structural_tag` constraint (xgrammar's format), written as an
//! llguidance Lark grammar: free text in which a trigger string opens a
//! tagged structure (`<function=get_weather>{"city": …}</function>`) whose
//! content is held to a JSON schema, then free text again.
//!
//! Two forms are read:
//! - the original: `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`;
//! - the newer `{"format": F}`, F one of `const_string` (`value`),
//!   `json_schema` (`json_schema`), `regex` (`pattern`), `any_text`,
//!   `sequence` / `or` (`elements`), `tag` (`begin`, `content`, `end`),
//!   `triggered_tags` (`triggers`, `tags`, `at_least_one`, `stop_after_first`)
//!   `tags_with_separator` (`tags`, `separator`, `at_least_one`,
//!   `stop_after_first`), `grammar` (`grammar`: GBNF/EBNF with a `root`
//!   rule, or Lark) and `qwen_xml_parameter` (`json_schema`: the parameters
//!   of a Qwen3-Coder XML tool call, `<parameter=NAME>VALUE</parameter>`).
//!
//! Triggers use llguidance's lazy lexemes (its documented pattern for tool
//! calls): any text up to the first trigger, which then commits the output
//! to one of the tags that begin with it.

use serde_json::{Value, json};

/// Free text (greedy; lazy where a delimiter follows it).
const TEXT: &str = "/(?s:.*)/";

/// xgrammar's optional whitespace around XML parameters and their
/// non-string values.
const WS: &str = r"/[ \n\t]*/";

/// The end of one XML parameter.
const PARAM_END: &str = "\"</parameter>\"";

/// The Lark grammar of a structural tag, or what is wrong with it (naming
/// the offending key, e.g. `format.elements[1].type`). `schema` adds the
/// caller's options to each JSON schema (the compact JSON of `structured.rs`).
pub fn to_lark(tag: &Value, schema: fn(Value) -> Value) -> Result<String, String> {
    translate(tag, schema).map(|(lark, _)| lark)
}

/// The `grammar` formats of a structural tag as Lark, each with the key it
/// came from (`format.content.grammar`): compiled alone, the one that fails
/// names the key of an invalid grammar.
pub fn embedded_grammars(tag: &Value) -> Vec<(String, String)> {
    translate(tag, |s| s).map(|(_, g)| g).unwrap_or_default()
}

/// The Lark grammar and the embedded grammars (see [`embedded_grammars`]).
fn translate(
    tag: &Value,
    schema: fn(Value) -> Value,
) -> Result<(String, Vec<(String, String)>), String> {
    let obj = tag
        .as_object()
        .ok_or("a structural tag must be an object")?;
    if let Some(kind) = obj.get("type")
        && kind != "structural_tag"
    {
        return Err(format!("`type` must be \"structural_tag\", got {kind}"));
    }
    let format = match (obj.get("format"), obj.get("structures")) {
        (Some(format), None) => format.clone(),
        (None, Some(structures)) => legacy(structures, obj.get("triggers"))?,
        _ => {
            return Err(
                "a structural tag has either `format`, or `structures` and `triggers`".into(),
            );
        }
    };
    let mut lark = Lark {
        rules: Vec::new(),
        schema,
        grammars: Vec::new(),
        raw_param: None,
    };
    let start = lark.format(&format, "format")?;
    let mut out = format!("start: {start}\n");
    for rule in lark.rules {
        out.push_str(&rule);
        out.push('\n');
    }
    Ok((out, lark.grammars))
}

/// The original form as a `triggered_tags` format.
fn legacy(structures: &Value, triggers: Option<&Value>) -> Result<Value, String> {
    let list = structures
        .as_array()
        .ok_or("`structures` must be a list of {begin, schema, end}")?;
    let mut tags = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let field = |key: &str| {
            s.get(key)
                .ok_or_else(|| format!("`structures[{i}].{key}` is required"))
        };
        tags.push(json!({
            "type": "tag",
            "begin": field("begin")?,
            "content": {"type": "json_schema", "json_schema": field("schema")?},
            "end": field("end")?,
        }));
    }
    Ok(json!({
        "type": "triggered_tags",
        "triggers": triggers.ok_or("`triggers` is required with `structures`")?,
        "tags": tags,
    }))
}

/// Rules written so far; each format becomes one named rule.
struct Lark {
    rules: Vec<String>,
    /// Adds the caller's options to a JSON schema.
    schema: fn(Value) -> Value,
    /// The `grammar` formats met: (key, Lark).
    grammars: Vec<(String, String)>,
    /// The rule of a raw string parameter value and its end tag, once written.
    raw_param: Option<String>,
}

impl Lark {
    /// Adds `name: body` (with `attrs`, e.g. `[lazy]`); returns the name.
    fn rule(&mut self, attrs: &str, body: &str) -> String {
        let name = format!("r{}", self.rules.len());
        self.rules.push(format!("{name}{attrs}: {body}"));
        name
    }

    /// The rule of the format at `path`.
    fn format(&mut self, f: &Value, path: &str) -> Result<String, String> {
        let kind = f
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("`{path}.type` is required (a string)"))?;
        let body = match kind {
            "const_string" => literal(string(f, path, "value")?),
            "json_schema" => {
                let schema = f
                    .get("json_schema")
                    .filter(|s| s.is_object() || s.is_boolean())
                    .ok_or_else(|| format!("`{path}.json_schema` must be a JSON schema"))?;
                format!("%json {}", (self.schema)(schema.clone()))
            }
            "regex" => regex(string(f, path, "pattern")?),
            "any_text" => TEXT.to_owned(),
            "sequence" | "or" => {
                let parts = list(f, path, "elements")?
                    .iter()
                    .enumerate()
                    .map(|(i, e)| self.format(e, &format!("{path}.elements[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                parts.join(if kind == "or" { " | " } else { " " })
            }
            "tag" => self.tag(f, path, None)?,
            "triggered_tags" => self.triggered_tags(f, path)?,
            "tags_with_separator" => {
                let items = self.tags(f, path, None)?;
                let sep = literal(string(f, path, "separator")?);
                let (at_least_one, first_only) = flags(f, path)?;
                match (at_least_one, first_only) {
                    (true, true) => items,
                    (false, true) => format!("({items})?"),
                    (true, false) => format!("{items} ({sep} {items})*"),
                    (false, false) => format!("({items} ({sep} {items})*)?"),
                }
            }
            "grammar" => {
                let g = string(f, path, "grammar")?;
                if g.trim().is_empty() {
                    return Err(format!("`{path}.grammar` must be a non-empty grammar"));
                }
                // A nested grammar has its own rule names: no collision with
                // ours (`rN`) or with another embedded grammar's.
                let lark = if g.contains("::=") {
                    crate::gbnf::to_lark(g)
                } else {
                    g.to_owned()
                };
                let body = format!("%lark {{\n{lark}\n}}");
                self.grammars.push((format!("{path}.grammar"), lark));
                body
            }
            "qwen_xml_parameter" => self.qwen_xml(f, path)?,
            other => {
                return Err(format!(
                    "`{path}.type` {other:?} is not a structural tag format read here (const_string, json_schema, regex, any_text, sequence, or, tag, triggered_tags, tags_with_separator, grammar, qwen_xml_parameter)"
                ));
            }
        };
        Ok(self.rule("", &body))
    }

    /// A `tag`: `begin content end`, `begin` without its first `skip`
    /// bytes (a trigger already wrote them). Free-text content ends lazily
    /// at the first `end`.
    fn tag(&mut self, f: &Value, path: &str, skip: Option<usize>) -> Result<String, String> {
        if f.get("type").and_then(Value::as_str) != Some("tag") {
            return Err(format!("`{path}.type` must be \"tag\""));
        }
        let begin = &string(f, path, "begin")?[skip.unwrap_or(0)..];
        let end = string(f, path, "end")?;
        let content = f
            .get("content")
            .ok_or_else(|| format!("`{path}.content` is required"))?;
        let begin = if begin.is_empty() {
            String::new()
        } else {
            literal(begin) + " "
        };
        if content.get("type").and_then(Value::as_str) == Some("any_text") {
            let text = self.rule("[lazy]", &format!("{TEXT} {}", literal(end)));
            return Ok(format!("{begin}{text}"));
        }
        let content = self.format(content, &format!("{path}.content"))?;
        Ok(format!("{begin}{content} {}", literal(end)))
    }

    /// The `tags` of `f` as alternatives; with `triggers`, each tag begins
    /// with the lazy rule of the trigger its `begin` starts with.
    fn tags(
        &mut self,
        f: &Value,
        path: &str,
        triggers: Option<&[(String, String)]>,
    ) -> Result<String, String> {
        let tags = list(f, path, "tags")?;
        let mut alts = Vec::with_capacity(tags.len());
        for (i, t) in tags.iter().enumerate() {
            let tpath = format!("{path}.tags[{i}]");
            let item = match triggers {
                None => self.tag(t, &tpath, None)?,
                Some(triggers) => {
                    let begin = string(t, &tpath, "begin")?;
                    let (trigger, head) = triggers
                        .iter()
                        .filter(|(trigger, _)| begin.starts_with(trigger.as_str()))
                        .max_by_key(|(trigger, _)| trigger.len())
                        .ok_or_else(|| {
                            format!(
                                "`{tpath}.begin` {begin:?} does not start with any of the triggers"
                            )
                        })?;
                    format!("{head} {}", self.tag(t, &tpath, Some(trigger.len()))?)
                }
            };
            alts.push(self.rule("", &item));
        }
        Ok(format!("({})", alts.join(" | ")))
    }

    /// Free text in which a trigger opens one of the tags.
    fn triggered_tags(&mut self, f: &Value, path: &str) -> Result<String, String> {
        let mut triggers = Vec::new();
        for (i, t) in list(f, path, "triggers")?.iter().enumerate() {
            let trigger = t
                .as_str()
                .filter(|t| !t.is_empty())
                .ok_or_else(|| format!("`{path}.triggers[{i}]` must be a non-empty string"))?;
            let head = self.rule("[lazy]", &format!("{TEXT} {}", literal(trigger)));
            triggers.push((trigger.to_owned(), head));
        }
        let items = self.tags(f, path, Some(&triggers))?;
        Ok(match flags(f, path)? {
            (true, true) => items,
            (false, true) => format!("{items} | {TEXT}"),
            (true, false) => format!("{items}+ {TEXT}"),
            (false, false) => format!("{items}* {TEXT}"),
        })
    }

    /// `qwen_xml_parameter`: an object's properties as Qwen3-Coder XML
    /// parameters, as xgrammar writes them: each `<parameter=NAME>` then the
    /// value then `</parameter>`, in the schema's property order, optional
    /// ones skippable, `[ \n\t]*` before, between and after them; a plain
    /// string value is raw text up to the first `</parameter>`, any other
    /// value JSON held to its schema, with `[ \n\t]*` around it.
    fn qwen_xml(&mut self, f: &Value, path: &str) -> Result<String, String> {
        let spath = format!("{path}.json_schema");
        let root = f
            .get("json_schema")
            .filter(|s| s.is_object())
            .ok_or_else(|| format!("`{spath}` must be a JSON schema of an object"))?;
        let obj = resolve(root, root, &spath)?;
        if let Some(t) = obj.get("type")
            && t != "object"
        {
            return Err(format!(
                "`{spath}.type` must be \"object\" (qwen_xml_parameter holds an object's parameters), got {t}"
            ));
        }
        for key in [
            "patternProperties",
            "propertyNames",
            "minProperties",
            "maxProperties",
            "unevaluatedProperties",
            "anyOf",
            "oneOf",
            "allOf",
        ] {
            if obj.contains_key(key) {
                return Err(format!(
                    "`{spath}.{key}` is not supported in qwen_xml_parameter"
                ));
            }
        }
        // xgrammar compiles a structural tag's schemas in strict mode: no
        // properties beyond the declared ones.
        match obj.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => {
                return Err(format!(
                    "`{spath}.additionalProperties` other than false is not supported in qwen_xml_parameter"
                ));
            }
        }
        let empty = serde_json::Map::new();
        let props = match obj.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(format!("`{spath}.properties` must be an object")),
        };
        let mut required = Vec::new();
        if let Some(r) = obj.get("required") {
            for (i, name) in r
                .as_array()
                .ok_or_else(|| format!("`{spath}.required` must be a list of property names"))?
                .iter()
                .enumerate()
            {
                let name = name
                    .as_str()
                    .filter(|n| props.contains_key(*n))
                    .ok_or_else(|| {
                        format!("`{spath}.required[{i}]` must name one of `{spath}.properties`")
                    })?;
                required.push(name);
            }
        }
        let mut params = Vec::with_capacity(props.len());
        for (name, schema) in props {
            let value = self.xml_value(root, schema, &format!("{spath}.properties.{name}"))?;
            params.push(self.rule(
                "",
                &format!("{} {value}", literal(&format!("<parameter={name}>"))),
            ));
        }
        if params.is_empty() {
            return Ok(WS.to_owned());
        }
        // tails[i]: what may follow parameter i (later ones, each optional
        // unless required, in order); as in xgrammar, the first parameters
        // may be skipped up to the first required one.
        let req: Vec<bool> = props
            .keys()
            .map(|k| required.contains(&k.as_str()))
            .collect();
        let n = params.len();
        let mut tails: Vec<Option<String>> = vec![None; n];
        for i in (0..n - 1).rev() {
            let next = &params[i + 1];
            let with = match &tails[i + 1] {
                Some(t) => format!("{WS} {next} {t}"),
                None => format!("{WS} {next}"),
            };
            let body = match (&tails[i + 1], req[i + 1]) {
                (_, true) => with,
                (Some(t), false) => format!("{t} | {with}"),
                (None, false) => format!("({with})?"),
            };
            tails[i] = Some(self.rule("", &body));
        }
        let mut starts = Vec::new();
        for (i, p) in params.iter().enumerate() {
            starts.push(match &tails[i] {
                Some(t) => format!("{p} {t}"),
                None => p.clone(),
            });
            if req[i] {
                break;
            }
        }
        let some = format!("{WS} ({}) {WS}", starts.join(" | "));
        Ok(if required.is_empty() {
            format!("{some} | {WS}")
        } else {
            some
        })
    }

    /// One parameter's value and its `</parameter>`, for `schema` (under
    /// `root`, which holds its `$defs`).
    fn xml_value(&mut self, root: &Value, schema: &Value, path: &str) -> Result<String, String> {
        let s = resolve(root, schema, path)?;
        let quoted = |v: &Value| match v {
            Value::String(s) => literal(s),
            other => literal(&other.to_string()),
        };
        match s.get("type") {
            None | Some(Value::String(_)) => {}
            Some(Value::Array(ts)) if ts.iter().all(Value::is_string) => {}
            Some(t) => return Err(format!("`{path}.type` must be a JSON schema type, got {t}")),
        }
        // Constants are written as they are: strings raw, others as JSON.
        if let Some(c) = s.get("const") {
            return Ok(format!("{WS} {} {WS} {PARAM_END}", quoted(c)));
        }
        if let Some(e) = s.get("enum") {
            let alts = e
                .as_array()
                .filter(|e| !e.is_empty())
                .ok_or_else(|| format!("`{path}.enum` must be a non-empty list"))?
                .iter()
                .map(quoted)
                .collect::<Vec<_>>();
            return Ok(format!("{WS} ({}) {WS} {PARAM_END}", alts.join(" | ")));
        }
        if s.get("type").and_then(Value::as_str) == Some("string") {
            for key in ["format", "minLength", "maxLength"] {
                if s.contains_key(key) {
                    return Err(format!(
                        "`{path}.{key}` is not supported for a string in qwen_xml_parameter"
                    ));
                }
            }
            if let Some(p) = s.get("pattern") {
                let p = p
                    .as_str()
                    .ok_or_else(|| format!("`{path}.pattern` must be a string"))?;
                // One lazy lexeme: it ends at the first `</parameter>`.
                return Ok(self.rule("[lazy]", &format!("{WS} {} {WS} {PARAM_END}", regex(p))));
            }
            if self.raw_param.is_none() {
                let raw = self.rule("[lazy]", &format!("{TEXT} {PARAM_END}"));
                self.raw_param = Some(raw);
            }
            return Ok(self.raw_param.clone().unwrap_or_default());
        }
        if !may_be_string(s) {
            let mut sub = Value::Object(s.clone());
            // References into the root's definitions still resolve.
            for defs in ["$defs", "definitions"] {
                if let (Some(d), Some(o)) = (root.get(defs), sub.as_object_mut()) {
                    o.entry(defs).or_insert_with(|| d.clone());
                }
            }
            return Ok(format!(
                "{WS} %json {} {WS} {PARAM_END}",
                (self.schema)(sub)
            ));
        }
        Err(format!(
            "`{path}`: a value that may be a string or something else (no `type`, or a union with a string) is not supported in qwen_xml_parameter"
        ))
    }
}

/// `schema` as an object, a local `$ref` (`#/...`) followed (once).
fn resolve<'a>(
    root: &'a Value,
    schema: &'a Value,
    path: &str,
) -> Result<&'a serde_json::Map<String, Value>, String> {
    let s = match schema.get("$ref") {
        Some(r) => {
            let pointer = r
                .as_str()
                .and_then(|r| r.strip_prefix('#'))
                .ok_or_else(|| format!("`{path}.$ref` must be a local reference (#/...)"))?;
            root.pointer(pointer)
                .ok_or_else(|| format!("`{path}.$ref` {r} does not resolve"))?
        }
        None => schema,
    };
    s.as_object()
        .ok_or_else(|| format!("`{path}` must be a JSON schema object"))
}

/// Whether a value of `s` may be a string (xgrammar writes those raw, so
/// they cannot share a JSON value grammar).
fn may_be_string(s: &serde_json::Map<String, Value>) -> bool {
    let union = ["anyOf", "oneOf"].iter().any(|k| {
        s.get(*k)
            .and_then(Value::as_array)
            .is_some_and(|opts| opts.iter().any(|o| o.as_object().is_none_or(may_be_string)))
    });
    let typed = match s.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        // No type: anything, strings too, unless it is plainly an object
        // or an array.
        _ => !["properties", "items", "anyOf", "oneOf"]
            .iter()
            .any(|k| s.contains_key(*k)),
    };
    union || typed || s.contains_key("allOf") || s.contains_key("$ref")
}

/// `at_least_one` and `stop_after_first` (both false when absent).
fn flags(f: &Value, path: &str) -> Result<(bool, bool), String> {
    let flag = |key: &str| match f.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("`{path}.{key}` must be a boolean")),
    };
    Ok((flag("at_least_one")?, flag("stop_after_first")?))
}

fn string<'a>(f: &'a Value, path: &str, key: &str) -> Result<&'a str, String> {
    f.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("`{path}.{key}` must be a string"))
}

fn list<'a>(f: &'a Value, path: &str, key: &str) -> Result<&'a Vec<Value>, String> {
    f.get(key)
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| format!("`{path}.{key}` must be a non-empty list"))
}

/// A Lark string literal (JSON's escapes, which llguidance reads).
fn literal(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// A Lark regex literal: `/` escaped.
fn regex(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 4);
    out.push('/');
    let mut escaped = false;
    for c in pattern.chars() {
        match c {
            '/' if !escaped => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            _ => out.push(c),
        }
        escaped = c == '\\' && !escaped;
    }
    out.push('/');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structured::tests::byte_compiler as compiler;
    use crate::structured::{Advance, GrammarCompiler, StructuredOutput};

    #[test]
    fn legacy_form_is_triggered_json_tags() {
        let lark = to_lark(&json!({
            "type": "structural_tag",
            "structures": [{"begin": "<function=f>", "schema": {"type": "object"}, "end": "</function>"}],
            "triggers": ["<function="],
        }), |s| s)
        .expect("lark");
        assert!(lark.contains(r#"[lazy]: /(?s:.*)/ "<function=""#), "{lark}");
        assert!(lark.contains(r#" "f>" "#), "{lark}");
        assert!(lark.contains("%json {"), "{lark}");
    }

    #[test]
    fn mistakes_name_their_key() {
        for (tag, needle) in [
            (json!([]), "must be an object"),
            (json!({"structures": []}), "structures"),
            (
                json!({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<b"]}),
                "`format.tags[0].begin` \"<a>\" does not start with any of the triggers",
            ),
            (
                json!({"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<a"]}),
                "`structures[0].schema` is required",
            ),
            (
                json!({"format": {"type": "sequence", "elements": [{"type": "const_string", "value": "a"}, {"type": "nope"}]}}),
                "`format.elements[1].type` \"nope\"",
            ),
            (
                json!({"format": {"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "a", "content": {"type": "any_text"}, "end": "b"}], "separator": ",", "at_least_one": 1}}),
                "`format.at_least_one` must be a boolean",
            ),
            (json!({"type": "json_schema", "format": {}}), "`type`"),
        ] {
            let err = to_lark(&tag, |s| s).expect_err(&tag.to_string());
            assert!(err.contains(needle), "{tag}: {err}");
        }
    }

    /// Whether the structural tag of `format` accepts all of `text` and
    /// may end there.
    fn accepts(c: &GrammarCompiler, format: &Value, text: &str) -> bool {
        let g = c
            .compile(StructuredOutput::StructuralTag(
                json!({"type": "structural_tag", "format": format}),
            ))
            .expect("compiles")
            .start();
        for (i, b) in text.bytes().enumerate() {
            match g.advance(u32::from(b)) {
                Advance::Continue => {}
                Advance::Finished => return i + 1 == text.len(),
                Advance::Error(_) => return false,
            }
        }
        g.advance(256) == Advance::Finished
    }

    fn check(c: &GrammarCompiler, format: &Value, cases: &[(&str, bool)]) {
        for (text, ok) in cases {
            assert_eq!(accepts(c, format, text), *ok, "{format}: {text:?}");
        }
    }

    /// xgrammar's tests of the `grammar` format: EBNF with `root`, alone,
    /// in a sequence and as a tag's content.
    #[test]
    fn structural_grammar_format_accepts_what_xgrammar_does() {
        let c = compiler();
        let ebnf = json!({"type": "grammar", "grammar": "root ::= \"Hello!\" number\n            number ::= [0-9] | [0-9] number"});
        check(
            &c,
            &ebnf,
            &[
                ("Hello!12345", true),
                ("Hello!0", true),
                ("Hello!", false),
                ("Hello!123a", false),
                ("Hi!123", false),
            ],
        );
        let seq = json!({"type": "sequence", "elements": [
            {"type": "const_string", "value": "Hello!"},
            {"type": "json_schema", "json_schema": {"type": "number"}},
            {"type": "grammar", "grammar": "root ::= \"\" | [-+*/]"},
            {"type": "regex", "pattern": "[simple]?"},
        ]});
        check(
            &c,
            &seq,
            &[
                ("Hello!123", true),
                ("Hello!Hello!", false),
                ("Hello!", false),
                ("123Hello!", false),
                ("Hello!123+", true),
                ("Hello!123-", true),
                ("Hello!123!", false),
                ("Hello!123s", true),
                ("Hello!123+s", true),
                ("Hello!123q", false),
            ],
        );
        let tag = json!({"type": "tag", "begin": "BEG",
            "content": {"type": "grammar", "grammar": "root ::= [+\\-]?[1-9][0-9]*"}, "end": "END"});
        check(
            &c,
            &tag,
            &[
                ("BEG12345END", true),
                ("BEG1234567END", true),
                ("BEG-1END", true),
                ("BEG???END", false),
                ("BEG12345ENDEND", false),
            ],
        );
    }

    /// Two embedded grammars with the same rule names (and ours, `rN`)
    /// each keep their own rules; Lark is read too.
    #[test]
    fn structural_grammars_keep_their_own_rule_names() {
        let c = compiler();
        let two = json!({"type": "sequence", "elements": [
            {"type": "grammar", "grammar": "root ::= r0 \"a\"\nr0 ::= [0-9]"},
            {"type": "grammar", "grammar": "root ::= r0 \"b\"\nr0 ::= [x-z]"},
            {"type": "grammar", "grammar": "start: r0\nr0: \"ab\" | \"cd\""},
        ]});
        check(
            &c,
            &two,
            &[
                ("1axbcd", true),
                ("1azbab", true),
                ("xa1bab", false),
                ("1a1bab", false),
                ("1axbxb", false),
            ],
        );
    }

    /// xgrammar's tests of `qwen_xml_parameter`, and what its grammar
    /// rejects: missing or reordered required parameters, a value off its
    /// schema, an unknown parameter.
    #[test]
    fn structural_qwen_xml_parameters_match_xgrammar() {
        let c = compiler();
        let f = json!({"type": "qwen_xml_parameter", "json_schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        }});
        check(
            &c,
            &f,
            &[
                (
                    "<parameter=name>Bob</parameter><parameter=age>\t100\n</parameter>",
                    true,
                ),
                (
                    "<parameter=name>Bob</parameter>\t\n<parameter=age>\t100\n</parameter>",
                    true,
                ),
                (
                    "<parameter=name>Bob</parameter><parameter=age>100</parameter>",
                    true,
                ),
                (
                    "\n\t<parameter=name>Bob</parameter><parameter=age>100</parameter>",
                    true,
                ),
                (
                    "<parameter=name>\"Bob&lt;\"</parameter><parameter=age>100</parameter>",
                    true,
                ),
                (
                    "<parameter=name><!DOCTYPE html>\n<html lang=\"en\">\n  <body><h1>Hello</h1></body>\n</html></parameter><parameter=age>100</parameter>",
                    true,
                ),
                (
                    "\n<parameter=name>\nBob\n</parameter>\n<parameter=age>\n100\n</parameter>\n",
                    true,
                ),
                ("<parameter=name>Bob</parameter>", false),
                (
                    "<parameter=age>100</parameter><parameter=name>Bob</parameter>",
                    false,
                ),
                (
                    "<parameter=name>Bob</parameter><parameter=age>1x</parameter>",
                    false,
                ),
                (
                    "<parameter=name>Bob</parameter><parameter=age>\"100\"</parameter>",
                    false,
                ),
                (
                    "<parameter=name>Bob</parameter><parameter=age>100</parameter><parameter=x>1</parameter>",
                    false,
                ),
                (
                    "<parameter=name>Bob</parameter> x<parameter=age>100</parameter>",
                    false,
                ),
            ],
        );
        let utf8 = json!({"type": "qwen_xml_parameter", "json_schema": {"type": "object",
            "properties": {"参数": {"type": "string"}}, "required": ["参数"], "additionalProperties": false}});
        check(&c, &utf8, &[("<parameter=参数>值</parameter>", true)]);
    }

    /// Optional parameters may be left out but keep the schema's order;
    /// objects, arrays, booleans, enums and patterns are held to their
    /// schemas (JSON, compact as for `json_schema`; enum strings raw).
    #[test]
    fn structural_qwen_xml_optional_and_typed_parameters() {
        let c = compiler();
        let f = json!({"type": "qwen_xml_parameter", "json_schema": {
            "type": "object",
            "properties": {
                "a": {"type": "boolean"},
                "b": {"$ref": "#/$defs/pair"},
                "c": {"enum": ["x y", 3]},
                "d": {"type": "string", "pattern": "[0-9]{2}"},
                "e": {"type": "array", "items": {"$ref": "#/$defs/digit"}},
            },
            "required": ["b"],
            "$defs": {
                "pair": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                "digit": {"type": "integer", "minimum": 0, "maximum": 9},
            },
        }});
        let p = |n: &str, v: &str| format!("<parameter={n}>{v}</parameter>");
        let cases = [
            (p("b", "[1,2]"), true),
            (p("a", "true") + &p("b", "[]"), true),
            (p("b", "[1]") + &p("c", "x y"), true),
            (p("b", "[1]") + &p("c", " 3\n"), true),
            (p("b", "[1]") + &p("d", "42"), true),
            (
                p("a", "false") + &p("b", "[1]") + &p("c", "3") + &p("d", "\n42\n"),
                true,
            ),
            (p("a", "true"), false),
            (String::new(), false),
            (p("b", "[1,2,3]"), false),
            (p("a", "yes") + &p("b", "[]"), false),
            (p("b", "[]") + &p("a", "true"), false),
            (p("b", "[1]") + &p("c", "x"), false),
            (p("b", "[1]") + &p("c", "\"x y\""), false),
            (p("b", "[1]") + &p("d", "4"), false),
            (p("b", "[1]") + &p("e", "[3,4]"), true),
            (p("b", "[1]") + &p("e", "[10]"), false),
        ];
        for (text, ok) in &cases {
            assert_eq!(accepts(&c, &f, text), *ok, "{text:?}");
        }
        let none_required = json!({"type": "qwen_xml_parameter", "json_schema": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}});
        check(
            &c,
            &none_required,
            &[
                ("", true),
                (" \n", true),
                ("<parameter=b>hi</parameter>", true),
                (
                    "<parameter=a>1</parameter> <parameter=b>hi</parameter>",
                    true,
                ),
                (
                    "<parameter=b>hi</parameter><parameter=a>1</parameter>",
                    false,
                ),
            ],
        );
    }

    /// What qwen_xml_parameter does not read is refused, naming the key.
    #[test]
    fn structural_qwen_xml_refusals_name_their_key() {
        for (schema, needle) in [
            (
                json!("x"),
                "`format.json_schema` must be a JSON schema of an object",
            ),
            (
                json!({"type": "array"}),
                "`format.json_schema.type` must be \"object\"",
            ),
            (
                json!({"type": "object", "additionalProperties": true}),
                "`format.json_schema.additionalProperties`",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}),
                "`format.json_schema.properties.a.maxLength` is not supported",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}}}),
                "`format.json_schema.properties.a`: a value that may be a string",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": 7}}}),
                "`format.json_schema.properties.a.type` must be a JSON schema type, got 7",
            ),
            (
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}),
                "`format.json_schema.properties.a.$ref` \"#/$defs/none\" does not resolve",
            ),
            (
                json!({"type": "object", "properties": {"a": {}}, "required": ["b"]}),
                "`format.json_schema.required[0]` must name one of",
            ),
        ] {
            let tag = json!({"format": {"type": "qwen_xml_parameter", "json_schema": schema}});
            let err = to_lark(&tag, |s| s).expect_err(&tag.to_string());
            assert!(err.contains(needle), "{tag}: {err}");
        }
    }

    /// An invalid embedded grammar is an error naming its key.
    #[test]
    fn structural_invalid_grammar_names_its_key() {
        let c = compiler();
        let tag = json!({"format": {"type": "tag", "begin": "<a>", "end": "</a>",
            "content": {"type": "grammar", "grammar": "root ::= missing"}}});
        let err = c
            .compile(StructuredOutput::StructuralTag(tag))
            .expect_err("invalid grammar");
        assert!(
            err.0
                .contains("`format.content.grammar` is not a valid grammar"),
            "{err}"
        );
        let empty = json!({"format": {"type": "grammar", "grammar": " "}});
        let err = to_lark(&empty, |s| s).expect_err("empty");
        assert!(
            err.contains("`format.grammar` must be a non-empty grammar"),
            "{err}"
        );
    }

    #[test]
    fn regex_slashes_are_escaped() {
        assert_eq!(regex("a/b\\/c"), "/a\\/b\\/c/");
    }
}
