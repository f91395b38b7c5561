//! The `pythonic` format (Llama 3.2/4, ToolACE): the output is a Python
//! list of calls, `[get_weather(city="Paris", days=3), now()]`, keyword
//! arguments only, each a literal (strings, numbers, `True`/`False`/`None`,
//! lists and dicts of them). [`scan`] reads such a list as far as it is
//! written and turns each call's keyword arguments into the JSON vLLM sends
//! (`json.dumps(kwargs, ensure_ascii=False)`), one complete piece at a time,
//! so the arguments of a prefix are a prefix of the whole's.

use super::json_scan::{PartialCall, Scan, push_escaped};

/// Why reading stopped short of a complete list.
enum Stop {
    /// The text ends before the list does.
    More,
    /// Not a list of calls with literal keyword arguments.
    Broken,
}

type Step = Result<(), Stop>;

/// The calls of `region` (blanks, then `[`), as far as they go: `Done`
/// after the list's `]`, `More` while it may continue, `Broken` once it
/// cannot be a list of calls.
pub fn scan(region: &str) -> (Vec<PartialCall>, Scan) {
    let mut r = Reader {
        text: region,
        pos: 0,
    };
    let mut calls = Vec::new();
    let scan = match r.call_list(&mut calls) {
        Ok(()) => Scan::Done(r.pos),
        Err(Stop::More) => Scan::More,
        Err(Stop::Broken) => Scan::Broken,
    };
    (calls, scan)
}

struct Reader<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// The next byte (`More` at the end).
    fn peek(&self) -> Result<u8, Stop> {
        self.text
            .as_bytes()
            .get(self.pos)
            .copied()
            .ok_or(Stop::More)
    }

    fn expect(&mut self, c: u8) -> Step {
        if self.peek()? != c {
            return Err(Stop::Broken);
        }
        self.pos += 1;
        Ok(())
    }

    /// Skips blanks (newlines too: the list is inside brackets).
    fn blanks(&mut self) {
        let s = self.text.as_bytes();
        while self.pos < s.len() && matches!(s[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    /// An identifier; `More` when the text ends inside it (it may grow).
    fn ident(&mut self) -> Result<&'a str, Stop> {
        let s = self.text.as_bytes();
        let start = self.pos;
        if !matches!(self.peek()?, b'a'..=b'z' | b'A'..=b'Z' | b'_') {
            return Err(Stop::Broken);
        }
        while self.pos < s.len()
            && matches!(s[self.pos], b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_')
        {
            self.pos += 1;
        }
        if self.pos == s.len() {
            return Err(Stop::More);
        }
        Ok(&self.text[start..self.pos])
    }

    /// `[name(k=v, ...), ...]`; each call is pushed once its `(` is read.
    fn call_list(&mut self, calls: &mut Vec<PartialCall>) -> Step {
        self.blanks();
        self.expect(b'[')?;
        loop {
            self.blanks();
            if self.peek()? == b']' {
                self.pos += 1;
                return Ok(());
            }
            let name = self.ident()?;
            self.blanks();
            self.expect(b'(')?;
            calls.push(PartialCall {
                name: Some(name.to_owned()),
                arguments: String::from("{"),
                has_arguments: true,
            });
            let Some(call) = calls.last_mut() else {
                return Err(Stop::Broken);
            };
            self.kwargs(&mut call.arguments)?;
            self.blanks();
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(Stop::Broken),
            }
        }
    }

    /// `k=v, ...)` as a JSON object (the `{` is written already). A
    /// positional argument is not a call (vLLM drops it silently).
    fn kwargs(&mut self, out: &mut String) -> Step {
        let mut first = true;
        loop {
            self.blanks();
            if self.peek()? == b')' {
                self.pos += 1;
                out.push('}');
                return Ok(());
            }
            let key = self.ident()?;
            self.blanks();
            self.expect(b'=')?;
            if !first {
                out.push_str(", ");
            }
            first = false;
            out.push('"');
            out.push_str(key);
            out.push_str("\": ");
            self.blanks();
            self.value(out)?;
            self.blanks();
            match self.peek()? {
                b',' => self.pos += 1,
                b')' => {
                    self.pos += 1;
                    out.push('}');
                    return Ok(());
                }
                _ => return Err(Stop::Broken),
            }
        }
    }

    /// One literal, written as JSON.
    fn value(&mut self, out: &mut String) -> Step {
        match self.peek()? {
            b'"' | b'\'' => self.string(out),
            b'[' => {
                self.pos += 1;
                out.push('[');
                self.items(out, b']', |r, out| r.value(out))
            }
            b'{' => {
                self.pos += 1;
                out.push('{');
                self.items(out, b'}', |r, out| {
                    r.key(out)?;
                    r.blanks();
                    r.expect(b':')?;
                    out.push_str(": ");
                    r.blanks();
                    r.value(out)
                })
            }
            b'-' | b'0'..=b'9' | b'.' => {
                let n = self.number()?;
                out.push_str(&n);
                Ok(())
            }
            _ => {
                let word = match self.ident()? {
                    "True" => "true",
                    "False" => "false",
                    "None" => "null",
                    _ => return Err(Stop::Broken),
                };
                out.push_str(word);
                Ok(())
            }
        }
    }

    /// Items up to `close` (a trailing comma allowed), each read by `item`;
    /// the `, ` between two is written when the second starts.
    fn items(
        &mut self,
        out: &mut String,
        close: u8,
        item: impl Fn(&mut Self, &mut String) -> Step,
    ) -> Step {
        let mut first = true;
        loop {
            self.blanks();
            if self.peek()? == close {
                self.pos += 1;
                out.push(close as char);
                return Ok(());
            }
            if !first {
                out.push_str(", ");
            }
            first = false;
            item(self, out)?;
            self.blanks();
            match self.peek()? {
                b',' => self.pos += 1,
                c if c == close => {}
                _ => return Err(Stop::Broken),
            }
        }
    }

    /// A dict key as `json.dumps` writes it: strings as they are, numbers
    /// and `True`/`False`/`None` as strings.
    fn key(&mut self, out: &mut String) -> Step {
        match self.peek()? {
            b'"' | b'\'' => self.string(out),
            b'-' | b'0'..=b'9' | b'.' => {
                let n = self.number()?;
                out.push('"');
                out.push_str(&n);
                out.push('"');
                Ok(())
            }
            _ => {
                let word = match self.ident()? {
                    "True" => "\"true\"",
                    "False" => "\"false\"",
                    "None" => "\"null\"",
                    _ => return Err(Stop::Broken),
                };
                out.push_str(word);
                Ok(())
            }
        }
    }

    /// A number literal as `json.dumps` writes its value; `More` while
    /// more digits may follow.
    fn number(&mut self) -> Result<String, Stop> {
        let s = self.text.as_bytes();
        let start = self.pos;
        let negative = s[start] == b'-';
        let mut i = start + usize::from(negative);
        while i < s.len() {
            let c = s[i];
            let sign_after_exponent = matches!(c, b'+' | b'-')
                && matches!(s[i - 1], b'e' | b'E')
                && !self.text[start..i].to_ascii_lowercase().contains("0x");
            if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || sign_after_exponent {
                i += 1;
            } else {
                break;
            }
        }
        if i == s.len() {
            return Err(Stop::More);
        }
        self.pos = i;
        let digits = &self.text[start + usize::from(negative)..i];
        let value = python_number(digits).ok_or(Stop::Broken)?;
        Ok(if negative { format!("-{value}") } else { value })
    }

    /// A string literal (`'…'`, `"…"`, or triple-quoted), decoded and
    /// written as a JSON string, character by character.
    fn string(&mut self, out: &mut String) -> Step {
        let s = self.text.as_bytes();
        let q = s[self.pos];
        // `''` may be an empty string or the start of `'''`.
        let triple = match (s.get(self.pos + 1), s.get(self.pos + 2)) {
            (None, _) => return Err(Stop::More),
            (Some(&b), None) if b == q => return Err(Stop::More),
            (Some(&b), Some(&c)) => b == q && c == q,
            _ => false,
        };
        self.pos += if triple { 3 } else { 1 };
        out.push('"');
        loop {
            let c = self.peek()?;
            if c == q {
                if !triple {
                    self.pos += 1;
                    out.push('"');
                    return Ok(());
                }
                match (s.get(self.pos + 1), s.get(self.pos + 2)) {
                    (Some(&b), Some(&c)) if b == q && c == q => {
                        self.pos += 3;
                        out.push('"');
                        return Ok(());
                    }
                    (None, _) | (Some(_), None) => return Err(Stop::More),
                    _ => {}
                }
            }
            match c {
                b'\\' => self.escape(out)?,
                b'\n' if !triple => return Err(Stop::Broken),
                _ => {
                    let ch = self.text[self.pos..].chars().next().ok_or(Stop::More)?;
                    self.pos += ch.len_utf8();
                    push_escaped(out, ch);
                }
            }
        }
    }

    /// A backslash escape of a Python string (`\n`, `\'`, `\x41`, `\u00e9`,
    /// `\U0001F600`, octal `\101`, a line continuation); an unknown one
    /// keeps its backslash, as Python does.
    fn escape(&mut self, out: &mut String) -> Step {
        let s = self.text.as_bytes();
        let Some(&e) = s.get(self.pos + 1) else {
            return Err(Stop::More);
        };
        let code = |len: usize| -> Result<u32, Stop> {
            if self.pos + 2 + len > s.len() {
                return Err(Stop::More);
            }
            let digits = self
                .text
                .get(self.pos + 2..self.pos + 2 + len)
                .ok_or(Stop::Broken)?;
            if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Stop::Broken);
            }
            u32::from_str_radix(digits, 16).map_err(|_| Stop::Broken)
        };
        let (cp, len) = match e {
            b'\n' => {
                self.pos += 2;
                return Ok(());
            }
            b'\\' | b'\'' | b'"' => (u32::from(e), 2),
            b'a' => (7, 2),
            b'b' => (8, 2),
            b'f' => (12, 2),
            b'n' => (10, 2),
            b'r' => (13, 2),
            b't' => (9, 2),
            b'v' => (11, 2),
            b'x' => (code(2)?, 4),
            b'u' => (code(4)?, 6),
            b'U' => (code(8)?, 10),
            b'0'..=b'7' => {
                let mut n = 1;
                while n < 3 && matches!(s.get(self.pos + 1 + n), Some(b'0'..=b'7')) {
                    n += 1;
                }
                if n < 3 && self.pos + 1 + n == s.len() {
                    return Err(Stop::More);
                }
                let digits = &self.text[self.pos + 1..self.pos + 1 + n];
                (
                    u32::from_str_radix(digits, 8).map_err(|_| Stop::Broken)?,
                    1 + n,
                )
            }
            b'N' => return Err(Stop::Broken),
            _ => {
                out.push_str("\\\\");
                self.pos += 1;
                return Ok(());
            }
        };
        self.pos += len;
        match char::from_u32(cp) {
            Some(ch) => push_escaped(out, ch),
            // A lone surrogate: the escape `json.dumps` writes for it.
            None if cp <= 0xFFFF => out.push_str(&format!("\\u{cp:04x}")),
            None => return Err(Stop::Broken),
        }
        Ok(())
    }
}

/// An unsigned Python number literal as `json.dumps` writes its value:
/// integers in decimal (`0x1F` → `31`, `1_000` → `1000`), floats as
/// Python's `repr` (`1e3` → `1000.0`, `.5` → `0.5`, `1e16` → `1e+16`).
/// `None` for what is not a number (`1j`, `08`, `1.2.3`).
fn python_number(tok: &str) -> Option<String> {
    let clean = tok.replace('_', "");
    if clean.is_empty() {
        return None;
    }
    let lower = clean.to_ascii_lowercase();
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(digits) = lower.strip_prefix(prefix) {
            return u128::from_str_radix(digits, radix)
                .ok()
                .map(|n| n.to_string());
        }
    }
    if !clean
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    if !lower.contains(['.', 'e']) {
        // Python refuses leading zeros (`007`) but not `000`.
        if clean.len() > 1 && clean.starts_with('0') && clean.bytes().any(|b| b != b'0') {
            return None;
        }
        return Some(clean.trim_start_matches('0').to_owned())
            .map(|d| if d.is_empty() { "0".to_owned() } else { d });
    }
    let x: f64 = clean.parse().ok()?;
    if x.is_infinite() {
        return Some("Infinity".to_owned());
    }
    // Rust's `{:?}` is the shortest round-trip text, as Python's `repr`,
    // and switches to exponents at the same magnitudes; only the
    // exponent's spelling differs (`1e16` → `1e+16`, `1e-5` → `1e-05`).
    let text = format!("{x:?}");
    Some(match text.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> (Vec<(Option<String>, String)>, Scan) {
        let (calls, scan) = scan(text);
        (
            calls.into_iter().map(|c| (c.name, c.arguments)).collect(),
            scan,
        )
    }

    /// Each literal as Python's `json.dumps(ast.literal_eval(...),
    /// ensure_ascii=False)` writes it (values checked against Python).
    #[test]
    fn literals_are_written_as_json_dumps() {
        for (py, json) in [
            (r#""Paris""#, r#""Paris""#),
            (r#"'it\'s "x"'"#, r#""it's \"x\"""#),
            (r#"'\x41\u00e9\U0001F600\101\n\t\\'"#, r#""Aé😀A\n\t\\""#),
            (r#"'a\qb'"#, r#""a\\qb""#),
            ("'''two\nlines'''", r#""two\nlines""#),
            ("''", r#""""#),
            ("3", "3"),
            ("-3", "-3"),
            ("1_000", "1000"),
            ("0x1F", "31"),
            ("000", "0"),
            ("2.50", "2.5"),
            (".5", "0.5"),
            ("1e3", "1000.0"),
            ("1e16", "1e+16"),
            ("1.5e-7", "1.5e-07"),
            ("1e999", "Infinity"),
            ("True", "true"),
            ("False", "false"),
            ("None", "null"),
            ("[1, 'a', [None]]", r#"[1, "a", [null]]"#),
            ("[1, 2,]", "[1, 2]"),
            ("[]", "[]"),
            (
                "{'k': {'n': 1.0}, 2: True, None: []}",
                r#"{"k": {"n": 1.0}, "2": true, "null": []}"#,
            ),
        ] {
            let text = format!("[f(x={py})]");
            let (calls, scan) = args(&text);
            assert_eq!(scan, Scan::Done(text.len()), "{py}");
            assert_eq!(calls[0].1, format!("{{\"x\": {json}}}"), "{py}");
        }
    }

    #[test]
    fn calls_and_their_keyword_arguments() {
        let text = "[get_weather(city=\"Paris\", days=3), now(), f(a=1,)]";
        let (calls, scan) = args(text);
        assert_eq!(scan, Scan::Done(text.len()));
        assert_eq!(
            calls,
            [
                (
                    Some("get_weather".into()),
                    r#"{"city": "Paris", "days": 3}"#.into()
                ),
                (Some("now".into()), "{}".into()),
                (Some("f".into()), r#"{"a": 1}"#.into()),
            ]
        );
        // Blanks anywhere Python allows them; the end is after `]`.
        let (calls, scan) = args(" [ f ( a = 1 ) ] tail");
        assert_eq!(scan, Scan::Done(16));
        assert_eq!(calls[0].1, r#"{"a": 1}"#);
    }

    #[test]
    fn what_is_not_a_call_list_is_broken() {
        for text in [
            "Hello",
            "[1, 2]",
            "[Note: x]",
            "[f(1)]",
            "[f(x)]",
            "[f(a=b)]",
            "[f(a=(1, 2))]",
            "[a.b()]",
            "[f(a='x\ny')]",
            "[f(a=1j)]",
            "[f(a=08)]",
            "[f(a=1) g()]",
        ] {
            assert_eq!(scan(text).1, Scan::Broken, "{text}");
        }
    }

    /// Every prefix reads to a prefix of the whole's arguments, and a
    /// prefix ends `More` (not `Broken`).
    #[test]
    fn a_prefix_reads_to_a_prefix() {
        let text = r#"[get_weather(city='Pa\'ris\u00e9', days=-3, opts={'a': [1.5, True, None], 7: "x"}), now()]"#;
        let (whole, _) = args(text);
        for (i, _) in text.char_indices() {
            let (part, scan) = args(&text[..i]);
            assert_eq!(scan, Scan::More, "{i}: {}", &text[..i]);
            for (p, w) in part.iter().zip(&whole) {
                assert_eq!(p.0, w.0, "{i}");
                assert!(w.1.starts_with(&p.1), "{i}: {:?} vs {:?}", p.1, w.1);
            }
        }
    }
}
