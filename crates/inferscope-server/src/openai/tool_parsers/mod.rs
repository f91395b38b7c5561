//! Tool calls in the model's output: the parsers chosen with vLLM's
//! `--tool-call-parser` (`hermes`, `llama3_json`, `mistral`, `pythonic`), and the
//! formats of `tool_choice: "required"` and a named function, whose output
//! is JSON constrained by [`constrained::tool_choice_schema`].
//!
//! One machine serves every format: it takes the output text as it is
//! generated, passes the text outside the calls through as content, and
//! turns each call into OpenAI's stream deltas (the name first, with an id,
//! then fragments of `arguments`). The non-streamed answer is the same
//! machine fed the whole text at once, so a streamed answer accumulates to
//! exactly the non-streamed one, whatever the chunking.

pub mod constrained;
pub mod json_scan;
pub mod pythonic;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use json_scan::{PartialCall, Scan, call_object, canonical, skip_ws, value_end};

/// The parsers of `--tool-call-parser`, named as vLLM names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ParserName {
    /// Hermes 2 Pro, Qwen 2.5/3: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.
    Hermes,
    /// Llama 3.1/3.2 JSON: the output is `{"name": ..., "parameters": ...}`
    /// (after an optional `<|python_tag|>`), several separated by `;`.
    #[value(name = "llama3_json")]
    Llama3Json,
    /// Mistral: `[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]`, or
    /// the newer `[TOOL_CALLS]name[ARGS]{...}`.
    Mistral,
    /// Llama 3.2/4, ToolACE: the output is a Python list of calls,
    /// `[get_weather(city="Paris"), now()]`.
    Pythonic,
}

impl ParserName {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
            Self::Pythonic => "pythonic",
        }
    }

    /// Whether the request's special tokens must stay in the text: the
    /// markers are special tokens in these models' vocabularies (vLLM's
    /// `adjust_request` turns `skip_special_tokens` off for the same reason).
    pub fn keeps_special_tokens(self) -> bool {
        matches!(self, Self::Hermes | Self::Mistral)
    }
}

/// The shape of the calls in the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// A parser of `--tool-call-parser`.
    Parser(ParserName),
    /// `tool_choice: "required"`: the whole output is a JSON array of
    /// `{"name", "parameters"}` objects.
    Required,
    /// A named function: the whole output is that function's arguments.
    Named(String),
}

/// How a request's output is read into calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCalls {
    /// The calls' shape.
    pub format: Format,
    /// `parallel_tool_calls: false`: calls after the first are dropped.
    pub single_call: bool,
}

impl ToolCalls {
    /// A parser for one choice.
    pub fn parser(&self) -> ToolCallParser {
        let mut p = ToolCallParser::new(self.format.clone());
        p.calls.single_call = self.single_call;
        p
    }

    /// A whole output's content and calls.
    pub fn parse(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        let mut parser = self.parser();
        let mut acc = Accumulated::default();
        acc.add(parser.push(text));
        acc.add(parser.finish());
        acc.into_parts()
    }
}

/// One call in a stream: the first delta of a call carries its id and
/// name, the later ones only fragments of `arguments`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// The call's index in the choice.
    pub index: usize,
    /// Set on the call's first delta.
    pub id: Option<String>,
    /// Set on the call's first delta.
    pub name: Option<String>,
    /// The next fragment of the arguments (may be empty on the first).
    pub arguments: String,
}

/// What one piece of output text turned into.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedDelta {
    /// Text outside the calls.
    pub content: String,
    /// Call deltas, in order.
    pub calls: Vec<ToolCallDelta>,
}

impl ParsedDelta {
    /// Nothing to send.
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.calls.is_empty()
    }
}

/// A whole call, as a non-streamed answer carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    /// `chatcmpl-tool-…` (Mistral: 9 letters and digits, as vLLM makes them).
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function called.
    pub function: FunctionCall,
}

/// The function of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionCall {
    /// Its name.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
}

/// A stream delta's call in OpenAI's shape.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallChunk<'a> {
    /// The call's index.
    pub index: usize,
    /// On the first delta of a call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    /// `function`, on the first delta of a call.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name (first delta) and argument fragment.
    pub function: FunctionChunk<'a>,
}

/// The function part of a [`ToolCallChunk`].
#[derive(Debug, Clone, Serialize)]
pub struct FunctionChunk<'a> {
    /// On the first delta of a call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    /// The fragment (empty on a first delta written before any argument).
    pub arguments: &'a str,
}

impl ToolCallDelta {
    /// This delta in OpenAI's chunk shape.
    pub fn chunk(&self) -> ToolCallChunk<'_> {
        ToolCallChunk {
            index: self.index,
            id: self.id.as_deref(),
            kind: self.id.as_ref().map(|_| "function"),
            function: FunctionChunk {
                name: self.name.as_deref(),
                arguments: &self.arguments,
            },
        }
    }
}

/// Where the machine is in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Llama 3 JSON, pythonic: before the first non-blank character,
    /// which decides.
    Undecided,
    /// Plain text, watching for the opening marker.
    Content,
    /// Plain text for good (Llama 3 JSON output that is not a call).
    ContentOnly,
    /// Inside a call region.
    Region,
}

/// A streaming parser of one choice's output.
#[derive(Debug)]
pub struct ToolCallParser {
    format: Format,
    mode: Mode,
    /// Content not yet sent (a possible start of the marker), or the
    /// region's text so far.
    buf: String,
    content: ContentOut,
    calls: CallsOut,
}

impl ToolCallParser {
    /// A parser for one choice.
    pub fn new(format: Format) -> Self {
        let mode = match &format {
            Format::Parser(ParserName::Llama3Json | ParserName::Pythonic) => Mode::Undecided,
            Format::Parser(_) => Mode::Content,
            Format::Required | Format::Named(_) => Mode::Region,
        };
        let mistral_ids = format == Format::Parser(ParserName::Mistral);
        Self {
            format,
            mode,
            buf: String::new(),
            content: ContentOut::default(),
            calls: CallsOut {
                mistral_ids,
                ..CallsOut::default()
            },
        }
    }

    /// Whether any call has been sent (`finish_reason` becomes `tool_calls`).
    pub fn called(&self) -> bool {
        self.calls.next_index > 0
    }

    /// Feeds the next piece of output text.
    pub fn push(&mut self, text: &str) -> ParsedDelta {
        self.buf.push_str(text);
        self.advance(false);
        self.take()
    }

    /// Ends the output: what was held back, and the last call closed.
    pub fn finish(&mut self) -> ParsedDelta {
        self.advance(true);
        match self.mode {
            Mode::Region => {
                let region = std::mem::take(&mut self.buf);
                self.close_region(&region, None);
            }
            _ => {
                let rest = std::mem::take(&mut self.buf);
                self.content.text(&rest);
            }
        }
        self.content.finish();
        self.take()
    }

    fn take(&mut self) -> ParsedDelta {
        ParsedDelta {
            content: std::mem::take(&mut self.content.out),
            calls: std::mem::take(&mut self.calls.out),
        }
    }

    /// The opening marker, for formats that have one.
    fn open(&self) -> Option<&'static str> {
        match self.format {
            Format::Parser(ParserName::Hermes) => Some("<tool_call>"),
            Format::Parser(ParserName::Mistral) => Some("[TOOL_CALLS]"),
            _ => None,
        }
    }

    /// The marker that ends a region (Mistral: the next call's opening).
    fn close(&self) -> Option<&'static str> {
        match self.format {
            Format::Parser(ParserName::Hermes) => Some("</tool_call>"),
            Format::Parser(ParserName::Mistral) => Some("[TOOL_CALLS]"),
            _ => None,
        }
    }

    fn advance(&mut self, at_end: bool) {
        loop {
            match self.mode {
                Mode::Undecided if self.format == Format::Parser(ParserName::Pythonic) => {
                    // A call list or nothing: the blanks before `[` stay in
                    // the region, so text that is not a list keeps them.
                    match self.buf.trim_start().as_bytes().first() {
                        Some(b'[') => self.mode = Mode::Region,
                        Some(_) => self.mode = Mode::ContentOnly,
                        None => return,
                    }
                }
                Mode::Region if self.format == Format::Parser(ParserName::Pythonic) => {
                    let (calls, scan) = pythonic::scan(&self.buf);
                    match scan {
                        Scan::Done(end) => {
                            // The list is closed: what follows is content.
                            let region: String = self.buf.drain(..end).collect();
                            self.close_region(&region, None);
                            self.mode = Mode::ContentOnly;
                        }
                        Scan::More | Scan::Broken => {
                            let named = self.calls.update(&calls);
                            if scan == Scan::More || named {
                                // (A list broken after a call keeps its calls
                                // and the rest is dropped, as in the other
                                // formats.)
                                return;
                            }
                            // Not a call list after all: the text is content.
                            self.mode = Mode::ContentOnly;
                        }
                    }
                }
                Mode::Undecided => {
                    const TAG: &str = "<|python_tag|>";
                    let text = self.buf.trim_start();
                    if text.starts_with('{') {
                        self.buf = text.to_owned();
                        self.mode = Mode::Region;
                    } else if let Some(rest) = text.strip_prefix(TAG) {
                        self.buf = rest.to_owned();
                        self.mode = Mode::Region;
                    } else if text.is_empty() || (TAG.starts_with(text) && !at_end) {
                        return;
                    } else {
                        self.mode = Mode::ContentOnly;
                    }
                }
                Mode::ContentOnly => {
                    let text = std::mem::take(&mut self.buf);
                    self.content.text(&text);
                    return;
                }
                Mode::Content => {
                    let Some(open) = self.open() else {
                        self.mode = Mode::ContentOnly;
                        continue;
                    };
                    if let Some(pos) = self.buf.find(open) {
                        let before = self.buf[..pos].to_owned();
                        self.content.text(&before);
                        self.content.call_starts();
                        self.buf.drain(..pos + open.len());
                        self.mode = Mode::Region;
                        continue;
                    }
                    let safe = self.buf.len() - partial_suffix(&self.buf, open);
                    let text: String = self.buf.drain(..safe).collect();
                    self.content.text(&text);
                    return;
                }
                Mode::Region => {
                    let close = self.close();
                    if let Some(close) = close
                        && let Some(pos) = self.buf.find(close)
                    {
                        let region = self.buf[..pos].to_owned();
                        self.close_region(&region, Some(close));
                        // Mistral's marker opens the next region: leave it.
                        let consumed = if Some(close) == self.open() {
                            pos
                        } else {
                            pos + close.len()
                        };
                        self.buf.drain(..consumed);
                        self.mode = Mode::Content;
                        continue;
                    }
                    let safe = self.buf.len() - close.map_or(0, |c| partial_suffix(&self.buf, c));
                    let calls = self.scan(&self.buf[..safe]);
                    self.calls.update(&calls);
                    return;
                }
            }
        }
    }

    /// Ends a region: its calls sent in full; a region without a named
    /// call is content after all, markers included (as vLLM answers an
    /// output it cannot parse).
    fn close_region(&mut self, region: &str, close: Option<&str>) {
        let calls = self.scan(region);
        let named = self.calls.update(&calls);
        self.calls.close(&calls);
        if !named {
            let mut raw = String::from(self.open().unwrap_or_default());
            raw.push_str(region);
            if close != self.open() {
                raw.push_str(close.unwrap_or_default());
            }
            self.content.text(&raw);
        } else {
            self.content.call_ends();
        }
    }

    /// The calls of a region's text, as far as it goes.
    fn scan(&self, region: &str) -> Vec<PartialCall> {
        match &self.format {
            Format::Parser(ParserName::Hermes) => {
                let pos = skip_ws(region.as_bytes(), 0);
                if pos == region.len() {
                    return Vec::new();
                }
                vec![call_object(region, pos, &["arguments"]).0]
            }
            Format::Parser(ParserName::Llama3Json) => {
                objects(region, 0, b';', None, &["parameters", "arguments"])
            }
            Format::Parser(ParserName::Mistral) => mistral(region),
            Format::Parser(ParserName::Pythonic) => pythonic::scan(region).0,
            Format::Required => {
                let s = region.as_bytes();
                let pos = skip_ws(s, 0);
                match s.get(pos) {
                    Some(b'[') => objects(region, pos + 1, b',', Some(b']'), &["parameters"]),
                    _ => Vec::new(),
                }
            }
            // vLLM sends a named function's output as its arguments, as written.
            Format::Named(name) => vec![PartialCall {
                name: Some(name.clone()),
                arguments: region.to_owned(),
                has_arguments: !region.is_empty(),
            }],
        }
    }
}

/// Call objects from `pos`, separated by `sep` (and blanks), up to `end`.
fn objects(
    region: &str,
    mut pos: usize,
    sep: u8,
    end: Option<u8>,
    arg_keys: &[&str],
) -> Vec<PartialCall> {
    let s = region.as_bytes();
    let mut calls = Vec::new();
    loop {
        pos = skip_ws(s, pos);
        if s.get(pos) != Some(&b'{') {
            return calls;
        }
        let (call, scan) = call_object(region, pos, arg_keys);
        calls.push(call);
        let Scan::Done(next) = scan else {
            return calls;
        };
        pos = skip_ws(s, next);
        match s.get(pos) {
            Some(&c) if c == sep => pos += 1,
            Some(&c) if Some(c) == end => return calls,
            _ => return calls,
        }
    }
}

/// A Mistral region (after `[TOOL_CALLS]`): a JSON list of calls, one
/// call object, or `name[ARGS]{...}` (tokenizer v11 and later).
fn mistral(region: &str) -> Vec<PartialCall> {
    const ARGS: &str = "[ARGS]";
    let s = region.as_bytes();
    let pos = skip_ws(s, 0);
    match s.get(pos) {
        None => Vec::new(),
        Some(b'[') => objects(region, pos + 1, b',', Some(b']'), &["arguments"]),
        Some(b'{') => objects(region, pos, b',', None, &["arguments"]),
        Some(_) => {
            let Some(at) = region.find(ARGS) else {
                return vec![PartialCall::default()];
            };
            // `name[CALL_ID]id[ARGS]`: the id is the model's, not ours.
            let name = region[..at].split("[CALL_ID]").next().unwrap_or_default();
            let args = &region[at + ARGS.len()..];
            let a = skip_ws(args.as_bytes(), 0);
            let end = match value_end(args.as_bytes(), a) {
                Scan::Done(end) => end,
                _ => args.len(),
            };
            vec![PartialCall {
                name: Some(name.trim().to_owned()),
                arguments: canonical(&args[a..end]),
                has_arguments: a < args.len(),
            }]
        }
    }
}

/// The length of the longest suffix of `text` that starts `marker` (and
/// may become it with more text).
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// The content side: text outside the calls, with the blanks next to a
/// call dropped (a model writes `\n` around its calls; vLLM's content is
/// the text before the first call).
#[derive(Debug, Default)]
struct ContentOut {
    out: String,
    /// Trailing blanks, sent when more text follows.
    held: String,
    /// Right after a call: leading blanks are dropped.
    after_call: bool,
}

impl ContentOut {
    fn text(&mut self, s: &str) {
        let s = if self.after_call { s.trim_start() } else { s };
        if s.is_empty() {
            return;
        }
        self.after_call = false;
        let body = s.trim_end().len();
        if body > 0 {
            self.out.push_str(&std::mem::take(&mut self.held));
            self.out.push_str(&s[..body]);
        }
        self.held.push_str(&s[body..]);
    }

    fn call_starts(&mut self) {
        self.held.clear();
    }

    fn call_ends(&mut self) {
        self.held.clear();
        self.after_call = true;
    }

    fn finish(&mut self) {
        let held = std::mem::take(&mut self.held);
        self.out.push_str(&held);
    }
}

/// The calls side: which calls of the current region were announced, and
/// how much of their arguments went out.
#[derive(Debug, Default)]
struct CallsOut {
    out: Vec<ToolCallDelta>,
    /// The index the next announced call gets.
    next_index: usize,
    /// Per call of the current region: its index once announced, and the
    /// bytes of its arguments sent.
    region: Vec<(Option<usize>, usize)>,
    mistral_ids: bool,
    /// Only the first call is announced (`parallel_tool_calls: false`).
    single_call: bool,
}

impl CallsOut {
    /// Sends what `calls` (a rescan of the region) hold beyond what went
    /// out. Returns whether the region has a named call (announced or,
    /// past the first with `single_call`, dropped).
    fn update(&mut self, calls: &[PartialCall]) -> bool {
        if self.region.len() < calls.len() {
            self.region.resize(calls.len(), (None, 0));
        }
        for (call, slot) in calls.iter().zip(self.region.iter_mut()) {
            match slot.0 {
                None => {
                    let Some(name) = &call.name else { continue };
                    if self.single_call && self.next_index > 0 {
                        continue;
                    }
                    let index = self.next_index;
                    self.next_index += 1;
                    *slot = (Some(index), call.arguments.len());
                    self.out.push(ToolCallDelta {
                        index,
                        id: Some(call_id(self.mistral_ids)),
                        name: Some(name.clone()),
                        arguments: call.arguments.clone(),
                    });
                }
                Some(index) => {
                    let Some(new) = call.arguments.get(slot.1..).filter(|n| !n.is_empty()) else {
                        continue;
                    };
                    slot.1 = call.arguments.len();
                    push_args(&mut self.out, index, new);
                }
            }
        }
        calls.iter().any(|c| c.name.is_some())
    }

    /// Ends the region: a call written without arguments gets `{}`.
    fn close(&mut self, calls: &[PartialCall]) {
        for (call, slot) in calls.iter().zip(&self.region) {
            if let (Some(index), 0) = *slot
                && call.arguments.is_empty()
            {
                push_args(&mut self.out, index, "{}");
            }
        }
        self.region.clear();
    }
}

/// Appends an argument fragment, merged into the last delta of the same call.
fn push_args(out: &mut Vec<ToolCallDelta>, index: usize, text: &str) {
    match out.last_mut() {
        Some(last) if last.index == index => last.arguments.push_str(text),
        _ => out.push(ToolCallDelta {
            index,
            id: None,
            name: None,
            arguments: text.to_owned(),
        }),
    }
}

/// A fresh call id: `chatcmpl-tool-` and 32 hex digits as vLLM makes them,
/// or Mistral's 9 letters and digits.
fn call_id(mistral: bool) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static KEY: std::collections::hash_map::RandomState = std::collections::hash_map::RandomState::new();
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let (a, b) = KEY.with(|k| (k.hash_one((n, 0u8)), k.hash_one((n, 1u8))));
    if mistral {
        const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let mut x = a;
        (0..9)
            .map(|_| {
                let c = ALNUM[(x % ALNUM.len() as u64) as usize] as char;
                x /= ALNUM.len() as u64;
                c
            })
            .collect()
    } else {
        format!("chatcmpl-tool-{a:016x}{b:016x}")
    }
}

/// The whole output's content (`None` when empty and a call was made)
/// and calls: the streaming machine fed everything at once.
pub fn parse_complete(format: Format, text: &str) -> (Option<String>, Vec<ToolCall>) {
    ToolCalls {
        format,
        single_call: false,
    }
    .parse(text)
}

/// Deltas accumulated the way a client accumulates a stream.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Accumulated {
    /// Content so far.
    pub content: String,
    /// Calls so far, by index.
    pub calls: Vec<ToolCall>,
}

impl Accumulated {
    /// Adds one delta.
    pub fn add(&mut self, d: ParsedDelta) {
        self.content.push_str(&d.content);
        for c in d.calls {
            if c.index == self.calls.len() {
                self.calls.push(ToolCall {
                    id: c.id.unwrap_or_default(),
                    kind: "function",
                    function: FunctionCall {
                        name: c.name.unwrap_or_default(),
                        arguments: String::new(),
                    },
                });
            }
            if let Some(call) = self.calls.get_mut(c.index) {
                call.function.arguments.push_str(&c.arguments);
            }
        }
    }

    /// The content (`None` when empty and a call was made) and the calls.
    pub fn into_parts(self) -> (Option<String>, Vec<ToolCall>) {
        let content = (!self.content.is_empty() || self.calls.is_empty()).then_some(self.content);
        (content, self.calls)
    }
}

#[cfg(test)]
mod tests;
