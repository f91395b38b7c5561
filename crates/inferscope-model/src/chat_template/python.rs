//! Python's behaviour where chat templates see it: `str()` of a printed
//! value, `json.dumps` (transformers' `tojson` filter), and the `str`
//! methods that minijinja-contrib's pycompat lacks or gets wrong.
//!
//! Templates are written against Jinja2, i.e. Python objects: `{{ x }}`
//! prints `str(x)` (`None`, `True`, `['a']`), and `s.find(t)` counts
//! characters, not bytes.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind, from_args};
use minijinja::{Error, ErrorKind, State, Value};

/// Python's `str(value)` as Jinja2 prints it; undefined prints nothing.
pub fn str_of(value: &Value) -> String {
    let mut out = String::new();
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_repr(&mut out, value),
    }
    out
}

/// Python's `repr(value)` (what `str` gives for everything but strings).
fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number(value, false)),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key);
                out.push_str(": ");
                write_repr(out, &value.get_item(&key).unwrap_or_default());
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// `repr` of a string: single quotes unless it holds `'` and no `"`.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// A number as Python prints it (`repr`), or as `json.dumps` writes it.
fn number(value: &Value, json: bool) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) => float_repr(f, json),
        Err(_) => value.to_string(),
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for
/// exponents -4..16, else `1e+16` / `1.5e-05`; `json.dumps` spells the
/// non-finite values `NaN` / `Infinity`.
pub fn float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 { format!("-{s}") } else { s.into() };
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let mut s = format!("{f}");
        if !s.contains('.') {
            s.push_str(".0");
        }
        s
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// Jinja2's `iterable` test (`iter(value)` works): not for None, numbers
/// or booleans, which minijinja would iterate as empty; yes for undefined,
/// which Jinja2's `Undefined` iterates as empty.
pub fn is_iterable(value: &Value) -> bool {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
        ValueKind::Undefined
        | ValueKind::String
        | ValueKind::Seq
        | ValueKind::Map
        | ValueKind::Iterable => true,
        _ => value.try_iter().is_ok(),
    }
}

/// Jinja2's `sequence` test (`len(value)` and `value[...]` work): strings
/// and dicts too, not only lists.
pub fn is_sequence(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Undefined | ValueKind::String | ValueKind::Seq | ValueKind::Map
    )
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, arguments by position
/// in that order or by name. Unlike Jinja2's own `tojson` it does not
/// escape HTML characters.
pub fn tojson(value: &Value, args: &[Value]) -> Result<Value, Error> {
    let (rest, kwargs): (&[Value], Kwargs) = from_args(args)?;
    let positional = |i: usize, name: &str| -> Result<Value, Error> {
        match (rest.get(i), kwargs.get::<Option<Value>>(name)?) {
            (Some(_), Some(_)) => Err(Error::new(
                ErrorKind::TooManyArguments,
                format!("tojson got `{name}` twice"),
            )),
            (Some(v), None) => Ok(v.clone()),
            (None, Some(v)) => Ok(v),
            (None, None) => Ok(Value::UNDEFINED),
        }
    };
    if rest.len() > 4 {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let ensure_ascii = positional(0, "ensure_ascii")?.is_true();
    let indent = positional(1, "indent")?;
    let separators = positional(2, "separators")?;
    let sort_keys = positional(3, "sort_keys")?.is_true();
    kwargs.assert_all_used()?;
    let indent = match indent.kind() {
        ValueKind::Undefined | ValueKind::None => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => Some(" ".repeat(indent.as_i64().unwrap_or(0).max(0) as usize)),
        _ => return Err(bad_value("tojson: `indent` must be a number or a string")),
    };
    // Python's defaults: ", " between items unless indenting, then ",".
    let (item_sep, key_sep) = match separators.kind() {
        ValueKind::Undefined | ValueKind::None => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
        _ => {
            let parts: Vec<Value> = separators.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(bad_value(
                        "tojson: `separators` must be an (item, key) pair of strings",
                    ));
                }
            }
        }
    };
    let dumper = JsonDumper {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    dumper.write(&mut out, value, 0)?;
    Ok(Value::from(out))
}

fn bad_value(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.to_string())
}

/// The options of one `json.dumps` call.
struct JsonDumper {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonDumper {
    fn write(&self, out: &mut String, value: &Value, level: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&number(value, true)),
            ValueKind::String => self.write_str(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, '[', ']', &items, level, |out, item| {
                    self.write(out, item, level + 1)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<(String, Value)> = Vec::new();
                for key in value.try_iter()? {
                    keys.push((self.key_string(&key)?, key));
                }
                if self.sort_keys {
                    keys.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.write_container(out, '{', '}', &keys, level, |out, (name, key)| {
                    self.write_str(out, name);
                    out.push_str(&self.key_sep);
                    self.write(out, &value.get_item(key)?, level + 1)
                })?;
            }
            // Python's json cannot serialise Jinja2's Undefined either.
            _ => {
                return Err(bad_value(&format!(
                    "tojson: a value of type {} is not JSON serializable",
                    value.kind()
                )));
            }
        }
        Ok(())
    }

    fn write_container<T>(
        &self,
        out: &mut String,
        open: char,
        close: char,
        items: &[T],
        level: usize,
        mut each: impl FnMut(&mut String, &T) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, depth: usize| {
            if let Some(indent) = &self.indent {
                out.push('\n');
                for _ in 0..depth {
                    out.push_str(indent);
                }
            }
        };
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            newline(out, level + 1);
            each(out, item)?;
        }
        newline(out, level);
        out.push(close);
        Ok(())
    }

    /// A dict key as `json.dumps` writes it: strings as they are, numbers,
    /// booleans and None converted; anything else is an error.
    fn key_string(&self, key: &Value) -> Result<String, Error> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::Number => number(key, true),
            ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_string(),
            ValueKind::None => "null".to_string(),
            _ => {
                return Err(bad_value(
                    "tojson: keys must be str, int, float, bool or None",
                ));
            }
        })
    }

    fn write_str(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python `str` methods minijinja-contrib's pycompat lacks or counts in
/// bytes (`find` must give a character index: templates slice with it),
/// then pycompat's for everything else.
pub fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str()
        && let Some(result) = string_method(s, method, args)?
    {
        return Ok(result);
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.isspace` set, which `str.strip()` and `str.split()` use.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Char index of a byte offset.
fn char_index(s: &str, byte: usize) -> i64 {
    s[..byte].chars().count() as i64
}

fn string_method(s: &str, method: &str, args: &[Value]) -> Result<Option<Value>, Error> {
    let v = match method {
        "find" | "rfind" | "index" | "rindex" => {
            let (needle,): (&str,) = from_args(args)?;
            let found = if method.starts_with('r') {
                s.rfind(needle)
            } else {
                s.find(needle)
            };
            match found {
                Some(byte) => Value::from(char_index(s, byte)),
                None if method.ends_with("find") => Value::from(-1),
                None => return Err(bad_value("substring not found")),
            }
        }
        "strip" | "lstrip" | "rstrip" => {
            let (chars,): (Option<&str>,) = from_args(args)?;
            let set: Option<Vec<char>> = chars.map(|c| c.chars().collect());
            let strip = |c: char| match &set {
                Some(set) => set.contains(&c),
                None => is_py_space(c),
            };
            Value::from(match method {
                "strip" => s.trim_matches(strip),
                "lstrip" => s.trim_start_matches(strip),
                _ => s.trim_end_matches(strip),
            })
        }
        "split" | "rsplit" => {
            let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
            let parts = split(s, sep, maxsplit.unwrap_or(-1), method == "rsplit")?;
            Value::from(parts)
        }
        "partition" | "rpartition" => {
            let (sep,): (&str,) = from_args(args)?;
            if sep.is_empty() {
                return Err(bad_value("empty separator"));
            }
            let found = if method == "partition" {
                s.find(sep)
            } else {
                s.rfind(sep)
            };
            let (a, b, c) = match found {
                Some(i) => (&s[..i], sep, &s[i + sep.len()..]),
                None if method == "partition" => (s, "", ""),
                None => ("", "", s),
            };
            Value::from(vec![a.to_string(), b.to_string(), c.to_string()])
        }
        "removeprefix" => {
            let (prefix,): (&str,) = from_args(args)?;
            Value::from(s.strip_prefix(prefix).unwrap_or(s))
        }
        "removesuffix" => {
            let (suffix,): (&str,) = from_args(args)?;
            Value::from(s.strip_suffix(suffix).unwrap_or(s))
        }
        "title" => {
            let () = from_args(args)?;
            Value::from(title(s))
        }
        "swapcase" => {
            let () = from_args(args)?;
            let mut out = String::with_capacity(s.len());
            for c in s.chars() {
                if c.is_uppercase() {
                    out.extend(c.to_lowercase());
                } else {
                    out.extend(c.to_uppercase());
                }
            }
            Value::from(out)
        }
        _ => return Ok(None),
    };
    Ok(Some(v))
}

/// Python's `str.split` / `str.rsplit`: on whitespace runs (dropping empty
/// ends) without a separator, else exactly on `sep`; at most `maxsplit`
/// splits when it is not negative.
fn split(
    s: &str,
    sep: Option<&str>,
    maxsplit: i64,
    from_right: bool,
) -> Result<Vec<String>, Error> {
    let limit = usize::try_from(maxsplit).ok();
    match sep {
        Some("") => Err(bad_value("empty separator")),
        Some(sep) => Ok(match (limit, from_right) {
            (None, _) => s.split(sep).map(String::from).collect(),
            (Some(n), false) => s.splitn(n + 1, sep).map(String::from).collect(),
            (Some(n), true) => {
                let mut parts: Vec<String> = s.rsplitn(n + 1, sep).map(String::from).collect();
                parts.reverse();
                parts
            }
        }),
        None => {
            // Whitespace runs; the remainder after `maxsplit` splits keeps
            // its inner whitespace and loses only the leading run.
            let mut parts = Vec::new();
            if from_right {
                let mut rest = s.trim_end_matches(is_py_space);
                while !rest.is_empty() {
                    if limit.is_some_and(|n| parts.len() == n) {
                        parts.push(rest.to_string());
                        break;
                    }
                    let start = rest.rfind(is_py_space).map_or(0, |i| {
                        i + rest[i..].chars().next().map_or(1, char::len_utf8)
                    });
                    parts.push(rest[start..].to_string());
                    rest = rest[..start].trim_end_matches(is_py_space);
                }
                parts.reverse();
            } else {
                let mut rest = s.trim_start_matches(is_py_space);
                while !rest.is_empty() {
                    if limit.is_some_and(|n| parts.len() == n) {
                        parts.push(rest.to_string());
                        break;
                    }
                    let end = rest.find(is_py_space).unwrap_or(rest.len());
                    parts.push(rest[..end].to_string());
                    rest = rest[end..].trim_start_matches(is_py_space);
                }
            }
            Ok(parts)
        }
    }
}

/// Python's `str.title`: a letter after a non-letter is upper-cased, every
/// other letter lower-cased (so `they're` becomes `They'Re`).
fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_cased = false;
    for c in s.chars() {
        if prev_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        prev_cased = c.is_alphabetic();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
        ] {
            assert_eq!(float_repr(f, false), want, "{f}");
        }
        assert_eq!(float_repr(f64::NAN, true), "NaN");
        assert_eq!(float_repr(f64::NEG_INFINITY, true), "-Infinity");
    }

    #[test]
    fn str_of_values_is_pythons() {
        let v = Value::from_serialize(serde_json::json!([null, true, 1, 2.5, "it's", {"a": "b"}]));
        assert_eq!(str_of(&v), r#"[None, True, 1, 2.5, "it's", {'a': 'b'}]"#);
        assert_eq!(str_of(&Value::UNDEFINED), "");
        assert_eq!(str_of(&Value::from(false)), "False");
    }

    #[test]
    fn split_follows_python() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            split("  a b  c ", None, -1, false).unwrap(),
            s(&["a", "b", "c"])
        );
        assert_eq!(
            split("  a b  c ", None, 1, false).unwrap(),
            s(&["a", "b  c "])
        );
        assert_eq!(
            split("  a b  c ", None, 1, true).unwrap(),
            s(&["  a b", "c"])
        );
        assert_eq!(
            split("a,b,c", Some(","), 1, true).unwrap(),
            s(&["a,b", "c"])
        );
        assert_eq!(split("", Some(","), -1, false).unwrap(), s(&[""]));
        assert!(split("a", Some(""), -1, false).is_err());
    }

    #[test]
    fn iterable_and_sequence_tests_are_jinja2s() {
        let none = Value::from(());
        assert!(!is_iterable(&none), "iter(None) raises");
        assert!(is_iterable(&Value::UNDEFINED));
        assert!(is_iterable(&Value::from("ab")));
        assert!(!is_iterable(&Value::from(1)));
        assert!(is_sequence(&Value::from("ab")));
        assert!(!is_sequence(&none));
    }

    #[test]
    fn title_and_find_follow_python() {
        assert_eq!(title("they're bill's"), "They'Re Bill'S");
        let v = string_method("héllo", "find", &[Value::from("l")])
            .unwrap()
            .unwrap();
        assert_eq!(v.as_i64(), Some(2), "a character index, not a byte offset");
    }
}
