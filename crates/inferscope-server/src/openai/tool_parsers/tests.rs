//! Every parser on whole outputs and on the same outputs streamed in chunks
//! of every size and at every split point: chunk boundaries inside the
//! markers, inside JSON strings and inside escapes.

use super::*;

/// `(content, [(name, arguments)])`, the ids left out.
type Expected<'a> = (Option<&'a str>, Vec<(&'a str, &'a str)>);

fn summary(content: Option<String>, calls: &[ToolCall]) -> (Option<String>, Vec<(String, String)>) {
    (
        content,
        calls
            .iter()
            .map(|c| (c.function.name.clone(), c.function.arguments.clone()))
            .collect(),
    )
}

/// Streams `chunks` through a parser: checks the shape of the deltas (a
/// call's first delta has its id and name, later ones neither; indexes
/// count up) and returns what a client accumulates.
fn stream(format: &Format, chunks: &[&str]) -> (Option<String>, Vec<ToolCall>) {
    let mut parser = ToolCallParser::new(format.clone());
    let mut acc = Accumulated::default();
    let mut deltas = Vec::new();
    for c in chunks {
        deltas.push(parser.push(c));
    }
    deltas.push(parser.finish());
    let mut announced = 0;
    for d in &deltas {
        for c in &d.calls {
            if c.index == announced {
                assert!(
                    c.id.is_some() && c.name.is_some(),
                    "first delta of a call: {c:?}"
                );
                announced += 1;
            } else {
                assert!(c.index < announced, "{c:?} before its announcement");
                assert!(c.id.is_none() && c.name.is_none(), "later delta: {c:?}");
                assert!(!c.arguments.is_empty(), "an empty later delta: {c:?}");
            }
        }
        acc.add(d.clone());
    }
    assert_eq!(parser.called(), announced > 0);
    acc.into_parts()
}

/// `text` splits into chunks of `size` characters.
fn chunks_of(text: &str, size: usize) -> Vec<&str> {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .step_by(size)
        .chain([text.len()])
        .collect();
    bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

/// The whole text, and streamed in every chunking tried, give `expected`.
fn check(format: Format, text: &str, expected: Expected) {
    let want = (
        expected.0.map(str::to_owned),
        expected
            .1
            .iter()
            .map(|&(n, a)| (n.to_owned(), a.to_owned()))
            .collect::<Vec<_>>(),
    );
    let (content, calls) = parse_complete(format.clone(), text);
    assert_eq!(summary(content, &calls), want, "whole: {text}");
    for size in 1..=9 {
        let (content, calls) = stream(&format, &chunks_of(text, size));
        assert_eq!(summary(content, &calls), want, "chunks of {size}: {text}");
    }
    for (i, _) in text.char_indices().skip(1) {
        let (content, calls) = stream(&format, &[&text[..i], &text[i..]]);
        assert_eq!(summary(content, &calls), want, "split at {i}: {text}");
    }
}

const HERMES: Format = Format::Parser(ParserName::Hermes);
const LLAMA3: Format = Format::Parser(ParserName::Llama3Json);
const MISTRAL: Format = Format::Parser(ParserName::Mistral);
const PYTHONIC: Format = Format::Parser(ParserName::Pythonic);

#[test]
fn hermes_one_call() {
    check(
        HERMES,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
        (
            None,
            vec![("get_weather", r#"{"city": "Paris", "unit": "c"}"#)],
        ),
    );
}

#[test]
fn hermes_text_then_two_calls_with_escapes() {
    check(
        HERMES,
        "Let me check.\n<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":\"<tag> \\\"q\\\" \\u00e9\\n\",\"n\":[1,-2.5e3]}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>\n",
        (
            Some("Let me check."),
            vec![
                ("a", r#"{"x": "<tag> \"q\" é\n", "n": [1, -2.5e3]}"#),
                ("b", "{}"),
            ],
        ),
    );
}

#[test]
fn hermes_plain_text_is_untouched() {
    check(
        HERMES,
        "a < b, <tool and <tool_cal are not calls\n",
        (Some("a < b, <tool and <tool_cal are not calls\n"), vec![]),
    );
    check(HERMES, "ends on <tool_c", (Some("ends on <tool_c"), vec![]));
}

#[test]
fn hermes_malformed_call_is_content() {
    check(
        HERMES,
        "x <tool_call>not json</tool_call>",
        (Some("x<tool_call>not json</tool_call>"), vec![]),
    );
}

#[test]
fn hermes_unclosed_and_argumentless_calls() {
    // The output ended (EOS) before `</tool_call>`.
    check(
        HERMES,
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        (None, vec![("f", r#"{"a": 1}"#)]),
    );
    check(
        HERMES,
        "<tool_call>{\"name\": \"f\"}</tool_call>after",
        (Some("after"), vec![("f", "{}")]),
    );
}

#[test]
fn llama3_json_calls() {
    check(
        LLAMA3,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        (None, vec![("get_weather", r#"{"city": "Paris"}"#)]),
    );
    check(
        LLAMA3,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {\"y\": [1, 2]}}",
        (None, vec![("a", r#"{"x": 1}"#), ("b", r#"{"y": [1, 2]}"#)]),
    );
}

#[test]
fn llama3_json_text_is_content() {
    check(
        LLAMA3,
        "Hello {\"name\": \"a\", \"parameters\": {}}",
        (Some("Hello {\"name\": \"a\", \"parameters\": {}}"), vec![]),
    );
    check(LLAMA3, "  <|python", (Some("  <|python"), vec![]));
}

#[test]
fn mistral_list_and_v11_calls() {
    check(
        MISTRAL,
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"now\", \"arguments\": {}}]",
        (
            None,
            vec![("get_weather", r#"{"city": "Paris"}"#), ("now", "{}")],
        ),
    );
    check(
        MISTRAL,
        "Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[ARGS]{}",
        (
            Some("Sure."),
            vec![("get_weather", r#"{"city": "Paris"}"#), ("now", "{}")],
        ),
    );
    check(MISTRAL, "[TOOL text", (Some("[TOOL text"), vec![]));
}

#[test]
fn pythonic_calls() {
    check(
        PYTHONIC,
        "[get_weather(city=\"Paris\", days=3), now()]",
        (
            None,
            vec![
                ("get_weather", r#"{"city": "Paris", "days": 3}"#),
                ("now", "{}"),
            ],
        ),
    );
    check(
        PYTHONIC,
        "\n[search(q='it\\'s', filters={'tags': ['a', \"b\"], 'max': 2.50, 'exact': True}, page=None)]\n",
        (
            None,
            vec![(
                "search",
                r#"{"q": "it's", "filters": {"tags": ["a", "b"], "max": 2.5, "exact": true}, "page": null}"#,
            )],
        ),
    );
    // Text after the list is content (vLLM's non-streamed parser would
    // return the whole output as content).
    check(
        PYTHONIC,
        "[f(a=1)] Done.",
        (Some("Done."), vec![("f", r#"{"a": 1}"#)]),
    );
    // A call broken after its name (a positional argument) keeps what was
    // read, as in the other formats.
    check(PYTHONIC, "[f(1)]", (None, vec![("f", "{")]));
}

#[test]
fn pythonic_text_is_content() {
    for text in [
        "The weather is fine.",
        "[1, 2, 3]",
        "[Note] f(a=1)",
        " [1, 2]",
        "[]",
        "Call [f(a=1)]",
        "[get_wea",
    ] {
        check(PYTHONIC, text, (Some(text), vec![]));
    }
    // Content is sent once the text cannot be a call list, not held to the end.
    let mut parser = ToolCallParser::new(PYTHONIC);
    assert_eq!(parser.push("[").content, "");
    assert_eq!(parser.push("Note] x").content, "[Note] x");
}

/// Streamed a character at a time, the name comes first and the arguments
/// in many fragments, never all at once.
#[test]
fn arguments_stream_in_fragments() {
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>";
    let mut parser = ToolCallParser::new(HERMES);
    let mut deltas: Vec<ToolCallDelta> = Vec::new();
    for c in chunks_of(text, 1) {
        deltas.extend(parser.push(c).calls);
    }
    deltas.extend(parser.finish().calls);
    assert_eq!(deltas[0].name.as_deref(), Some("f"));
    assert_eq!(deltas[0].arguments, "");
    assert!(deltas.len() > 10, "{deltas:?}");
    let args: String = deltas.iter().map(|d| d.arguments.as_str()).collect();
    assert_eq!(args, r#"{"city": "Paris"}"#);
    // The chunk shape: id and type on the first only.
    let first = serde_json::to_value(deltas[0].chunk()).expect("json");
    assert_eq!(first["type"], "function");
    assert!(
        first["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-tool-"))
    );
    let later = serde_json::to_value(deltas[1].chunk()).expect("json");
    assert_eq!(
        later,
        serde_json::json!({"index": 0, "function": {"arguments": deltas[1].arguments}})
    );
}

#[test]
fn mistral_ids_are_nine_alphanumerics() {
    let (_, calls) = parse_complete(MISTRAL, "[TOOL_CALLS]f[ARGS]{}");
    assert_eq!(calls[0].id.len(), 9);
    assert!(calls[0].id.bytes().all(|b| b.is_ascii_alphanumeric()));
}

#[test]
fn required_streams_like_the_rest() {
    check(
        Format::Required,
        "[{\"name\": \"a\", \"parameters\": {\"q\": \"x,y\"}}, {\"name\":\"b\",\"parameters\":{}}]",
        (None, vec![("a", r#"{"q": "x,y"}"#), ("b", "{}")]),
    );
}

/// Texts stitched from markers, JSON pieces, escapes and multi-byte
/// characters: no parser panics, and every chunking accumulates to the
/// whole text's answer.
#[test]
fn any_text_streams_as_it_parses_whole() {
    const PIECES: &[&str] = &[
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "[TOOL_CALLS]",
        "[ARGS]",
        "<|python_tag|>",
        "{",
        "}",
        "[",
        "]",
        "\"name\"",
        ": ",
        ",",
        ";",
        "\"f\"",
        "\"arguments\"",
        "\"parameters\"",
        "\"a\\\"b\"",
        "\\u00e9",
        "\\ud83d\\ude00",
        "\\",
        "é",
        "😀",
        " ",
        "\n",
        "12",
        "true",
        "x",
        "f(",
        "a=",
        ")",
        "'",
        "\"\"\"",
        "True",
        "None",
        "-1.5e3",
        "\\x4",
        "1",
        "{'k': ",
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for format in [
        HERMES,
        LLAMA3,
        MISTRAL,
        PYTHONIC,
        Format::Required,
        Format::Named("f".into()),
    ] {
        for _ in 0..300 {
            let len = (next() % 24) as usize;
            let text: String = (0..len)
                .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
                .collect();
            let (content, calls) = parse_complete(format.clone(), &text);
            let want = summary(content, &calls);
            for size in [1, 2, 3, 5] {
                let (content, calls) = stream(&format, &chunks_of(&text, size));
                assert_eq!(
                    summary(content, &calls),
                    want,
                    "{format:?} chunks of {size}: {text:?}"
                );
            }
        }
    }
}
