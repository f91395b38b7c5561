//! Reading JSON that is still being written: the tool calls' objects are
//! scanned as far as they go, and the `arguments` value is re-serialised as
//! vLLM sends it (Python's `json.dumps(..., ensure_ascii=False)`: `", "` and
//! `": "` separators, strings re-escaped) one complete character at a time,
//! so the text of a prefix is always a prefix of the text of the whole.

/// What a scan of one call object found so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartialCall {
    /// The function name, once its string is complete.
    pub name: Option<String>,
    /// The arguments re-serialised, as far as they are written.
    pub arguments: String,
    /// An arguments value was started (an absent one becomes `{}`).
    pub has_arguments: bool,
}

/// How far a scan got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Complete; the next byte to read.
    Done(usize),
    /// The text ends before the value does.
    More,
    /// Not JSON of the expected shape.
    Broken,
}

/// Skips ASCII whitespace from `pos`.
pub fn skip_ws(s: &[u8], mut pos: usize) -> usize {
    while pos < s.len() && s[pos].is_ascii_whitespace() {
        pos += 1;
    }
    pos
}

/// Scans a JSON string starting at `pos` (on its `"`); its raw end.
fn string_end(s: &[u8], pos: usize) -> Scan {
    let mut i = pos + 1;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'"' => return Scan::Done(i + 1),
            _ => i += 1,
        }
    }
    Scan::More
}

/// Scans one JSON value starting at `pos` (whitespace skipped); a scalar
/// at the end of the text is `More`, as more digits may follow.
pub fn value_end(s: &[u8], pos: usize) -> Scan {
    let pos = skip_ws(s, pos);
    let Some(&first) = s.get(pos) else {
        return Scan::More;
    };
    match first {
        b'"' => string_end(s, pos),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = pos;
            while i < s.len() {
                match s[i] {
                    b'"' => match string_end(s, i) {
                        Scan::Done(end) => {
                            i = end;
                            continue;
                        }
                        other => return other,
                    },
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Scan::Done(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            Scan::More
        }
        b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' => {
            let mut i = pos;
            while i < s.len()
                && matches!(s[i], b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
            {
                i += 1;
            }
            if i == s.len() {
                Scan::More
            } else {
                Scan::Done(i)
            }
        }
        _ => Scan::Broken,
    }
}

/// The decoded text of the complete JSON string at `pos`, and its end.
fn read_string(text: &str, pos: usize) -> Result<(String, usize), Scan> {
    match string_end(text.as_bytes(), pos) {
        Scan::Done(end) => serde_json::from_str::<String>(&text[pos..end])
            .map(|s| (s, end))
            .map_err(|_| Scan::Broken),
        other => Err(other),
    }
}

/// Scans a call object `{"name": ..., "<args key>": ...}` at `pos` (on its
/// `{`). The first `name` and the first of `arg_keys` count; other keys
/// are skipped. Returns what was found and how far the object got.
pub fn call_object(text: &str, pos: usize, arg_keys: &[&str]) -> (PartialCall, Scan) {
    let s = text.as_bytes();
    let mut call = PartialCall::default();
    if s.get(pos) != Some(&b'{') {
        return (call, Scan::Broken);
    }
    let mut i = pos + 1;
    loop {
        i = skip_ws(s, i);
        match s.get(i) {
            None => return (call, Scan::More),
            Some(b'}') => return (call, Scan::Done(i + 1)),
            Some(b'"') => {}
            Some(_) => return (call, Scan::Broken),
        }
        let key = match read_string(text, i) {
            Ok((key, end)) => {
                i = end;
                key
            }
            Err(scan) => return (call, scan),
        };
        i = skip_ws(s, i);
        match s.get(i) {
            None => return (call, Scan::More),
            Some(b':') => i = skip_ws(s, i + 1),
            Some(_) => return (call, Scan::Broken),
        }
        if i == s.len() {
            call.has_arguments |= call.name.is_some() && arg_keys.contains(&key.as_str());
            return (call, Scan::More);
        }
        if key == "name" && call.name.is_none() && s[i] == b'"' {
            match read_string(text, i) {
                Ok((name, end)) => {
                    call.name = Some(name);
                    i = end;
                }
                Err(scan) => return (call, scan),
            }
        } else if arg_keys.contains(&key.as_str()) && !call.has_arguments {
            call.has_arguments = true;
            let scan = value_end(s, i);
            let end = match scan {
                Scan::Done(end) => end,
                _ => s.len(),
            };
            call.arguments = canonical(&text[i..end]);
            match scan {
                Scan::Done(end) => i = end,
                other => return (call, other),
            }
        } else {
            match value_end(s, i) {
                Scan::Done(end) => i = end,
                other => return (call, other),
            }
        }
        i = skip_ws(s, i);
        match s.get(i) {
            None => return (call, Scan::More),
            Some(b',') => i += 1,
            Some(b'}') => return (call, Scan::Done(i + 1)),
            Some(_) => return (call, Scan::Broken),
        }
    }
}

/// `raw` (JSON, possibly cut short) re-serialised as Python's
/// `json.dumps(value, ensure_ascii=False)` writes it, as far as it is
/// complete: whitespace between tokens dropped, `", "` and `": "` as
/// separators, strings decoded and re-escaped. An escape cut short is held
/// back; numbers and literals keep the spelling they were written with.
pub fn canonical(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len() + 8);
    let mut chars = raw.char_indices().peekable();
    let mut in_string = false;
    while let Some((at, c)) = chars.next() {
        if !in_string {
            match c {
                ' ' | '\t' | '\n' | '\r' => {}
                ':' => out.push_str(": "),
                ',' => out.push_str(", "),
                '"' => {
                    in_string = true;
                    out.push('"');
                }
                c => out.push(c),
            }
            continue;
        }
        match c {
            '"' => {
                in_string = false;
                out.push('"');
            }
            '\\' => {
                let Some((_, e)) = chars.next() else {
                    return out;
                };
                match e {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '/' => out.push('/'),
                    'b' => out.push_str("\\b"),
                    'f' => out.push_str("\\f"),
                    'n' => out.push_str("\\n"),
                    'r' => out.push_str("\\r"),
                    't' => out.push_str("\\t"),
                    'u' => {
                        let start = at + 2;
                        let Some(hi) = hex4(raw, start) else {
                            // Cut short (or not hex): wait for the rest.
                            return out;
                        };
                        for _ in 0..4 {
                            chars.next();
                        }
                        if (0xD800..0xDC00).contains(&hi) {
                            // A high surrogate needs its low half to be a character.
                            let rest = raw.as_bytes().get(start + 4..).unwrap_or_default();
                            if rest.len() < 6 && b"\\u".starts_with(&rest[..rest.len().min(2)]) {
                                return out;
                            }
                            match hex4(raw, start + 6).filter(|_| rest.starts_with(b"\\u")) {
                                Some(lo) if (0xDC00..0xE000).contains(&lo) => {
                                    for _ in 0..6 {
                                        chars.next();
                                    }
                                    let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                                    push_escaped(
                                        &mut out,
                                        char::from_u32(cp).unwrap_or('\u{FFFD}'),
                                    );
                                }
                                _ => out.push_str(&format!("\\u{hi:04x}")),
                            }
                        } else {
                            match char::from_u32(hi) {
                                Some(ch) => push_escaped(&mut out, ch),
                                None => out.push_str(&format!("\\u{hi:04x}")),
                            }
                        }
                    }
                    other => {
                        out.push('\\');
                        out.push(other);
                    }
                }
            }
            c => push_escaped(&mut out, c),
        }
    }
    out
}

/// The value of 4 hex digits at `at`, when all are there.
fn hex4(raw: &str, at: usize) -> Option<u32> {
    let digits = raw.get(at..at + 4)?;
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// One decoded string character as `json.dumps(ensure_ascii=False)` writes it.
pub fn push_escaped(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The re-serialisation is Python's `json.dumps(json.loads(raw),
    /// ensure_ascii=False)` (values below checked against Python).
    #[test]
    fn canonical_is_python_json_dumps() {
        for (raw, python) in [
            (
                r#"{"a":1,"b":[true,null]}"#,
                r#"{"a": 1, "b": [true, null]}"#,
            ),
            ("{ \"city\" :\n \"Paris\" }", r#"{"city": "Paris"}"#),
            (
                r#"{"s":"\u00e9\/\"\\\n\u0001"}"#,
                r#"{"s": "é/\"\\\n\u0001"}"#,
            ),
            (r#"{"e":"\ud83d\ude00"}"#, r#"{"e": "😀"}"#),
            ("\"tab\there\"", r#""tab\there""#),
            (r#"{}"#, r#"{}"#),
        ] {
            assert_eq!(canonical(raw), python, "{raw}");
        }
    }

    /// Every prefix of the input gives a prefix of the whole's output.
    #[test]
    fn canonical_of_a_prefix_is_a_prefix() {
        let raw = r#"{"s": "a\u00e9\ud83d\ude00\n\"x", "n": [1.5e3, -2], "t": {"u": null}}"#;
        let whole = canonical(raw);
        for (i, _) in raw.char_indices() {
            let part = canonical(&raw[..i]);
            assert!(whole.starts_with(&part), "{i}: {part:?} vs {whole:?}");
        }
    }

    #[test]
    fn call_objects_are_scanned_as_far_as_they_go() {
        let keys = &["arguments"];
        let (c, scan) = call_object(r#"{"name": "f", "arguments": {"a": 1}} tail"#, 0, keys);
        assert_eq!(scan, Scan::Done(36));
        assert_eq!(c.name.as_deref(), Some("f"));
        assert_eq!(c.arguments, r#"{"a": 1}"#);
        // Arguments before the name, other keys skipped.
        let (c, scan) = call_object(
            r#"{"arguments": {"b": "}"}, "id": [1], "name": "g"}"#,
            0,
            keys,
        );
        assert!(matches!(scan, Scan::Done(_)));
        assert_eq!(
            (c.name.as_deref(), c.arguments.as_str()),
            (Some("g"), r#"{"b": "}"}"#)
        );
        // Cut inside the name: no name yet.
        let (c, scan) = call_object(r#"{"name": "get_wea"#, 0, keys);
        assert_eq!((c.name, scan), (None, Scan::More));
        // Cut inside the arguments: what is complete so far.
        let (c, scan) = call_object(r#"{"name": "f", "arguments": {"city": "Pa"#, 0, keys);
        assert_eq!(scan, Scan::More);
        assert_eq!(c.arguments, r#"{"city": "Pa"#);
        // Not an object of that shape.
        assert_eq!(call_object(r#"{"name" 1}"#, 0, keys).1, Scan::Broken);
    }
}
