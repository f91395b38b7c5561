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
//!   and `tags_with_separator` (`tags`, `separator`, `at_least_one`,
//!   `stop_after_first`).
//!
//! Triggers use llguidance's lazy lexemes (its documented pattern for tool
//! calls): any text up to the first trigger, which then commits the output
//! to one of the tags that begin with it.

use serde_json::{Value, json};

/// Free text (greedy; lazy where a delimiter follows it).
const TEXT: &str = "/(?s:.*)/";

/// The Lark grammar of a structural tag, or what is wrong with it (naming
/// the offending key, e.g. `format.elements[1].type`). `schema` adds the
/// caller's options to each JSON schema (the compact JSON of `structured.rs`).
pub fn to_lark(tag: &Value, schema: fn(Value) -> Value) -> Result<String, String> {
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
    };
    let start = lark.format(&format, "format")?;
    let mut out = format!("start: {start}\n");
    for rule in lark.rules {
        out.push_str(&rule);
        out.push('\n');
    }
    Ok(out)
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
            other => {
                return Err(format!(
                    "`{path}.type` {other:?} is not a structural tag format read here (const_string, json_schema, regex, any_text, sequence, or, tag, triggered_tags, tags_with_separator)"
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

    #[test]
    fn regex_slashes_are_escaped() {
        assert_eq!(regex("a/b\\/c"), "/a\\/b\\/c/");
    }
}
