//! Every request field of the OpenAI API and of vLLM's extensions is
//! honoured or refused with a 400 naming it (docs/api.md), and the sampler's
//! fields change what the cpu executor generates as their definitions say.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

/// A request to `path` with one extra field.
fn body(path: &str, field: &str, value: Value) -> Value {
    let mut b = if path == CHAT {
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    } else {
        json!({"prompt": "hi", "max_tokens": 3})
    };
    b[field] = value;
    b
}

/// Each field that is not honoured, with a value that asks for it, gets a
/// 400 naming it on the endpoints it belongs to; its neutral values pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhonoured_fields_are_refused_by_name() {
    let server = start(&[]).await;
    let addr = server.addr;
    let both = [COMPLETIONS, CHAT];
    let refused: &[(&[&str], &str, Value)] = &[
        // Log-probabilities (tests/it/logprobs.rs) and structured outputs
        // (tests/it/structured.rs) are honoured; these options are not.
        (&both, "guided_decoding_backend", json!("xgrammar")),
        (&both, "guided_whitespace_pattern", json!("[ ]*")),
        (&both, "return_tokens_as_token_ids", json!(true)),
        (&both, "use_beam_search", json!(true)),
        (&both, "priority", json!(1)),
        (&[COMPLETIONS], "suffix", json!("tail")),
        (&both, "best_of", json!(2)),
        // Without tools; with them, see tools.rs.
        (&[CHAT], "tool_choice", json!("auto")),
        (&[CHAT], "tool_choice", json!("required")),
        (&[CHAT], "continue_final_message", json!(true)),
        (
            &[CHAT],
            "chat_template_kwargs",
            json!({"enable_thinking": false}),
        ),
        (&[CHAT], "chat_template", json!("{{ messages }}")),
        (&[CHAT], "echo", json!(true)),
    ];
    for (paths, field, value) in refused {
        for &path in *paths {
            let r = post(addr, path, &body(path, field, value.clone())).await;
            assert_eq!(r.status, 400, "{path} {field}={value}: {}", r.body);
            let err = &r.json()["error"];
            assert_eq!(err["param"], *field, "{path} {field}: {}", r.body);
            assert_eq!(err["type"], "invalid_request_error");
            let msg = err["message"].as_str().unwrap_or_default();
            assert!(msg.contains(&format!("`{field}`")), "{path}: {msg}");
        }
    }
    // The same fields with values that ask for nothing, and the fields that
    // are accepted and change nothing.
    let accepted: &[(&[&str], &str, Value)] = &[
        (&both, "logprobs", json!(false)),
        (&both, "logprobs", Value::Null),
        (&both, "top_logprobs", json!(0)),
        (&both, "response_format", json!({"type": "text"})),
        (&both, "guided_json", Value::Null),
        (&both, "bad_words", json!([])),
        (&both, "bad_words", Value::Null),
        (&[COMPLETIONS], "suffix", Value::Null),
        (&both, "best_of", json!(1)),
        (&[CHAT], "tools", json!([])),
        (&[CHAT], "tool_choice", json!("none")),
        (&[CHAT], "parallel_tool_calls", json!(false)),
        (&[CHAT], "continue_final_message", json!(false)),
        (&[CHAT], "chat_template_kwargs", json!({})),
        (&both, "user", json!("user-1234")),
        (&both, "metadata", json!({"team": "a"})),
        (&both, "store", json!(false)),
        (&both, "priority", json!(0)),
        // Unknown to the OpenAI API and to vLLM: ignored, as vLLM does.
        (&both, "no_such_field", json!({"tools": [1]})),
    ];
    for (paths, field, value) in accepted {
        for &path in *paths {
            let r = post(addr, path, &body(path, field, value.clone())).await;
            assert_eq!(r.status, 200, "{path} {field}={value}: {}", r.body);
        }
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// The sampler's fields are checked against vLLM's ranges, each refusal
/// naming its field; `logit_bias` names the id outside the vocabulary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampler_fields_are_range_checked() {
    let server = start(&[]).await;
    let addr = server.addr;
    for path in [COMPLETIONS, CHAT] {
        for (field, value) in [
            ("presence_penalty", json!(2.5)),
            ("frequency_penalty", json!(-3)),
            ("repetition_penalty", json!(0)),
            ("min_p", json!(1.01)),
            ("logit_bias", json!({"300": 5})),
            ("logit_bias", json!({"65": 101})),
            ("logit_bias", json!({"x": 1})),
        ] {
            let r = post(addr, path, &body(path, field, value.clone())).await;
            assert_eq!(r.status, 400, "{path} {field}={value}: {}", r.body);
            assert_eq!(r.json()["error"]["param"], field, "{}", r.body);
        }
        let r = post(
            addr,
            path,
            &body(path, "logit_bias", json!({"65": 1, "300": 5})),
        )
        .await;
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(msg.contains("300"), "{msg}");
        // In range: accepted (the sim's tokens are synthetic; they are
        // applied by the cpu executor, tested below).
        let mut ok = body(path, "presence_penalty", json!(-2));
        ok["frequency_penalty"] = json!(2);
        ok["repetition_penalty"] = json!(1.5);
        ok["min_p"] = json!(0.2);
        ok["logit_bias"] = json!({"65": -100, "66": 100});
        let r = post(addr, path, &ok).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// `echo` puts the prompt before the completion, streamed as the first
/// delta; `skip_special_tokens: false` keeps the BOS in it (the sim serves
/// the byte tokenizer: BOS is 256, decoded `<s>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_and_special_tokens() {
    let server = start(&[]).await;
    let addr = server.addr;
    let base =
        json!({"prompt": "Hello", "max_tokens": 5, "min_tokens": 5, "seed": 3, "echo": true});
    let plain = post(
        addr,
        COMPLETIONS,
        &json!({"prompt": "Hello", "max_tokens": 5, "min_tokens": 5, "seed": 3}),
    )
    .await
    .json();
    let generated = plain["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    let echoed = post(addr, COMPLETIONS, &base).await.json();
    assert_eq!(echoed["choices"][0]["text"], format!("Hello{generated}"));
    // Usage counts the generated tokens only.
    assert_eq!(echoed["usage"]["completion_tokens"], 5);
    let mut stream = base.clone();
    stream["stream"] = json!(true);
    let events = sse_events(&post(addr, COMPLETIONS, &stream).await.body);
    let first: Value = serde_json::from_str(&events[0]).expect("chunk");
    assert_eq!(first["choices"][0]["text"], "Hello");
    // Token prompts are decoded; the BOS only shows when asked for.
    let ids = json!([256, 72, 105]);
    for (skip, want) in [(true, "Hi"), (false, "<s>Hi")] {
        let r = post(
            addr,
            COMPLETIONS,
            &json!({"prompt": ids, "max_tokens": 1, "min_tokens": 1, "echo": true, "skip_special_tokens": skip}),
        )
        .await
        .json();
        let text = r["choices"][0]["text"].as_str().expect("text");
        assert!(
            text.starts_with(want) && text.len() <= want.len() + 1,
            "{text:?}"
        );
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// A stop string, or a stop token id, is left out of the text unless
/// `include_stop_str_in_output`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_stop_str_in_output() {
    let server = start(&[]).await;
    let addr = server.addr;
    let base = json!({"prompt": "abc", "max_tokens": 60, "ignore_eos": true, "seed": 5});
    let full = post(addr, COMPLETIONS, &base).await.json();
    let text = full["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    let stop = &text[20..22];
    let cut = text.find(stop).expect("stop present");
    let byte = text.as_bytes()[20];
    let first = text.bytes().position(|b| b == byte).expect("byte present");
    for include in [false, true] {
        let mut b = base.clone();
        b["include_stop_str_in_output"] = json!(include);
        b["stop"] = json!([stop]);
        let r = post(addr, COMPLETIONS, &b).await.json();
        let want = if include {
            &text[..cut + 2]
        } else {
            &text[..cut]
        };
        assert_eq!(
            r["choices"][0]["text"], want,
            "stop string, include {include}"
        );
        b["stream"] = json!(true);
        let events = sse_events(&post(addr, COMPLETIONS, &b).await.body);
        let streamed: String = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str::<Value>(e).expect("chunk"))
            .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(streamed, want, "streamed, include {include}");

        let mut b = base.clone();
        b["include_stop_str_in_output"] = json!(include);
        b["stop_token_ids"] = json!([byte]);
        let r = post(addr, COMPLETIONS, &b).await.json();
        let want = if include {
            &text[..first + 1]
        } else {
            &text[..first]
        };
        assert_eq!(
            r["choices"][0]["text"], want,
            "stop token, include {include}"
        );
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// A server on the cpu executor with the trained demo model.
async fn start_cpu() -> inferscope_server::RunningServer {
    let args = inferscope_server::ServeArgs::try_parse_flags([
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "cpu",
        "--model",
        "demo",
        "--kv-cache-memory",
        "16000000",
        "--disable-log-stats",
    ])
    .expect("flags");
    inferscope_server::start(&args)
        .await
        .expect("server starts")
}

/// The text of `ids`, from the server's own detokenizer.
async fn detokenize(addr: std::net::SocketAddr, ids: &[u32]) -> String {
    let r = post(addr, "/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["prompt"].as_str().expect("prompt").to_owned()
}

/// How many times `text` starts with `piece`, back to back.
fn leading_run(text: &str, piece: &str) -> usize {
    let mut rest = text;
    let mut n = 0;
    while let Some(r) = rest.strip_prefix(piece) {
        rest = r;
        n += 1;
    }
    n
}

/// On the demo model, greedily: `logit_bias` +100 on one token makes every
/// generated token that token; a frequency and presence penalty of 2 take
/// 4 + 2·(count − 1) off it per step, so the run ends once the penalty
/// outweighs the bias (after 49 tokens at the latest when the token's raw
/// logit is not above the best one), where without the penalty it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_and_penalties_steer_the_demo_model() {
    let server = start_cpu().await;
    let addr = server.addr;
    let prompt = "It is a truth universally acknowledged";
    // A token the model would not pick: greedy's first token, biased down,
    // shows the bias moves the argmax, and the token the bias raises is one
    // from far down the vocabulary.
    let greedy = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
    let first = post(addr, COMPLETIONS, &greedy).await.json()["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    let tok = post(
        addr,
        "/tokenize",
        &json!({"prompt": first, "add_special_tokens": false}),
    )
    .await
    .json();
    let first_id = tok["tokens"][0].as_u64().expect("id");
    let mut down = greedy.clone();
    down["logit_bias"] = json!({ first_id.to_string(): -100 });
    let other = post(addr, COMPLETIONS, &down).await.json()["choices"][0]["text"].clone();
    assert_ne!(other, json!(first), "a -100 bias moves the argmax");

    let target = 3000u32;
    let piece = detokenize(addr, &[target]).await;
    let n = 64;
    let mut biased = json!({"prompt": prompt, "max_tokens": n, "temperature": 0,
                            "logit_bias": {target.to_string(): 100}});
    let r = post(addr, COMPLETIONS, &biased).await.json();
    assert_eq!(
        r["choices"][0]["text"],
        detokenize(addr, &vec![target; n]).await,
        "every token is the biased one"
    );
    biased["frequency_penalty"] = json!(2);
    biased["presence_penalty"] = json!(2);
    let r = post(addr, COMPLETIONS, &biased).await.json();
    let text = r["choices"][0]["text"].as_str().expect("text");
    let run = leading_run(text, &piece);
    assert!(
        (10..n).contains(&run),
        "the penalty ends the run of {piece:?} after {run} tokens: {text:?}"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

/// `allowed_token_ids`: every generated token is one of them, on the sim
/// (the byte tokenizer: 65 and 66 are `A` and `B`; EOS is not allowed, so
/// every choice runs to `max_tokens`) and on the cpu demo model; ids outside
/// the vocabulary and an empty list are 400s naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_token_ids_restrict_the_output() {
    let sim = start(&[]).await;
    for path in [COMPLETIONS, CHAT] {
        for seed in 0..4 {
            let mut b = body(path, "allowed_token_ids", json!([66, 65, 66]));
            b["max_tokens"] = json!(24);
            b["seed"] = json!(seed);
            let r = post(sim.addr, path, &b).await;
            assert_eq!(r.status, 200, "{}", r.body);
            let j = r.json();
            let text = j["choices"][0]["text"]
                .as_str()
                .or(j["choices"][0]["message"]["content"].as_str())
                .expect("text");
            assert_eq!(text.len(), 24, "{text}");
            assert!(text.bytes().all(|c| c == b'A' || c == b'B'), "{text}");
        }
        for bad in [json!([]), json!([65, 300]), json!([-1])] {
            let r = post(
                sim.addr,
                path,
                &body(path, "allowed_token_ids", bad.clone()),
            )
            .await;
            assert_eq!(r.status, 400, "{bad}: {}", r.body);
            assert_eq!(
                r.json()["error"]["param"],
                "allowed_token_ids",
                "{}",
                r.body
            );
        }
    }
    sim.shutdown(Duration::from_secs(5)).await;

    let cpu = start_cpu().await;
    let (a, b) = (3000u32, 3001u32);
    let (pa, pb) = (
        detokenize(cpu.addr, &[a]).await,
        detokenize(cpu.addr, &[b]).await,
    );
    for seed in 0..3 {
        let r = post(
            cpu.addr,
            COMPLETIONS,
            &json!({"prompt": "It is a truth", "max_tokens": 12, "seed": seed,
                    "allowed_token_ids": [a, b]}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let text = r.json()["choices"][0]["text"]
            .as_str()
            .expect("text")
            .to_owned();
        // The text is the two pieces, back to back, 12 of them.
        let mut rest = text.as_str();
        let mut n = 0;
        while let Some(r) = rest.strip_prefix(&pa).or_else(|| rest.strip_prefix(&pb)) {
            rest = r;
            n += 1;
        }
        assert_eq!(
            (n, rest),
            (12, ""),
            "{text:?} is not made of {pa:?} and {pb:?}"
        );
    }
    cpu.shutdown(Duration::from_secs(5)).await;
}

/// `bad_words` on the sim (the byte tokenizer: `A` is 65, `B` 66): with
/// only `A` and `B` allowed, banning `AB` leaves outputs without it (`B`s
/// then `A`s), where the same seeds unbanned hold it; banning `A` leaves
/// only `B`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_words_are_never_generated_by_the_sim() {
    let sim = start(&[]).await;
    let text = |j: &Value| {
        j["choices"][0]["text"]
            .as_str()
            .or(j["choices"][0]["message"]["content"].as_str())
            .expect("text")
            .to_owned()
    };
    for path in [COMPLETIONS, CHAT] {
        let mut unbanned_hold_it = 0;
        for seed in 0..6 {
            let mut b = body(path, "allowed_token_ids", json!([65, 66]));
            b["max_tokens"] = json!(24);
            b["seed"] = json!(seed);
            let r = post(sim.addr, path, &b).await;
            unbanned_hold_it += usize::from(text(&r.json()).contains("AB"));
            for (words, never) in [(json!(["AB"]), "AB"), (json!([" A", "Q"]), "A")] {
                b["bad_words"] = words;
                let r = post(sim.addr, path, &b).await;
                assert_eq!(r.status, 200, "{}", r.body);
                let t = text(&r.json());
                assert_eq!(t.len(), 24, "{t}");
                assert!(t.bytes().all(|c| c == b'A' || c == b'B'), "{t}");
                assert!(!t.contains(never), "{never} in {t}");
            }
        }
        assert!(unbanned_hold_it > 3, "the seeds' outputs hold AB unbanned");
    }
    sim.shutdown(Duration::from_secs(5)).await;
}

/// `bad_words` that are not a list of non-empty strings, or too many words,
/// are a 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_words_values_are_checked() {
    let sim = start(&[]).await;
    for path in [COMPLETIONS, CHAT] {
        let many: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
        for bad in [
            json!("AB"),
            json!({"AB": 1}),
            json!([1]),
            json!(["ok", null]),
            json!([""]),
            json!(["  "]),
            json!(many),
        ] {
            let r = post(sim.addr, path, &body(path, "bad_words", bad.clone())).await;
            assert_eq!(r.status, 400, "{bad}: {}", r.body);
            let err = &r.json()["error"];
            assert_eq!(err["param"], "bad_words", "{}", r.body);
            let msg = err["message"].as_str().unwrap_or_default();
            assert!(msg.contains("`bad_words`"), "{msg}");
        }
    }
    sim.shutdown(Duration::from_secs(5)).await;
}

/// A completion on the demo model with `logprobs: 0`: its text and its
/// tokens' texts.
async fn text_and_tokens(addr: std::net::SocketAddr, body: &Value) -> (String, Vec<String>) {
    let r = post(addr, COMPLETIONS, body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let c = &r.json()["choices"][0];
    let tokens = c["logprobs"]["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("token").to_owned())
        .collect();
    (c["text"].as_str().expect("text").to_owned(), tokens)
}

/// The ids of `text` without special tokens.
async fn tokenize(addr: std::net::SocketAddr, text: &str) -> Vec<u64> {
    let r = post(
        addr,
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    )
    .await;
    r.json()["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("id"))
        .collect()
}

/// `bad_words` on the demo model, greedily: a word of two tokens that the
/// greedy text holds in the middle (so banned as vLLM tokenizes it with a
/// leading space; the demo model's words are one token each, so the "word"
/// is two of them, as `bad_words` allows) comes out as its first token, then
/// something else: the text follows the greedy one up to there and never
/// holds the two tokens back to back; a one-token word never comes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_words_steer_the_demo_model() {
    let cpu = start_cpu().await;
    let addr = cpu.addr;
    let greedy = json!({"prompt": "It is a truth universally acknowledged", "max_tokens": 32,
                        "temperature": 0, "logprobs": 0});
    let (text, toks) = text_and_tokens(addr, &greedy).await;
    // The first two tokens that make a word whose spaced form vLLM bans.
    let mut found = None;
    for i in 0..toks.len() - 1 {
        let (x, y) = (&toks[i], &toks[i + 1]);
        if !x.starts_with(' ') || x.trim().is_empty() || y.trim().is_empty() {
            continue;
        }
        let word = format!("{}{y}", x.trim_start());
        let plain = tokenize(addr, &word).await;
        let spaced = tokenize(addr, &format!(" {word}")).await;
        if spaced.len() == 2
            && plain.len() == 2
            && plain[0] != spaced[0]
            && detokenize(addr, &[spaced[0] as u32]).await == *x
            && detokenize(addr, &[spaced[1] as u32]).await == *y
        {
            found = Some((i, word));
            break;
        }
    }
    let (i, word) = found.unwrap_or_else(|| panic!("no two-token word in {toks:?}"));
    assert!(text.contains(&word));
    let mut banned = greedy.clone();
    banned["bad_words"] = json!([word]);
    let (text2, toks2) = text_and_tokens(addr, &banned).await;
    assert_eq!(toks2[..=i], toks[..=i], "{text2:?} vs {text:?}");
    assert_ne!(toks2[i + 1], toks[i + 1], "{text2:?}");
    let pair = [toks[i].clone(), toks[i + 1].clone()];
    assert!(
        !toks2.windows(2).any(|w| w == pair),
        "{pair:?} in {toks2:?}"
    );
    // The word's first token alone: never generated.
    let single = toks[i].trim_start().to_owned();
    banned["bad_words"] = json!([single]);
    let (text3, toks3) = text_and_tokens(addr, &banned).await;
    assert!(!toks3.contains(&toks[i]), "{:?} in {text3:?}", toks[i]);
    cpu.shutdown(Duration::from_secs(5)).await;
}

/// `--generation-config FOLDER` sets the defaults of the fields a request
/// omits (here greedy decoding and a cap of 3 tokens), `--override-generation-config`
/// lays over it, and `vllm` turns it off; bad values stop the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generation_config_sets_defaults_of_omitted_fields() {
    let dir = std::env::temp_dir().join(format!("inferscope-gencfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"temperature": 0.0, "max_new_tokens": 3, "eos_token_id": 2}"#,
    )
    .unwrap();
    let folder = dir.to_str().unwrap();
    let body = json!({"prompt": "same prompt", "ignore_eos": true});
    let texts = |server: &inferscope_server::RunningServer, body: Value| {
        let addr = server.addr;
        async move {
            let mut out = Vec::new();
            for _ in 0..3 {
                let r = post(addr, "/v1/completions", &body).await;
                assert_eq!(r.status, 200, "{}", r.body);
                let v = r.json();
                out.push((
                    v["choices"][0]["text"].as_str().unwrap().to_owned(),
                    v["usage"]["completion_tokens"].as_u64().unwrap(),
                ));
            }
            out
        }
    };

    let server = start(&["--generation-config", folder]).await;
    let got = texts(&server, body.clone()).await;
    assert!(got.iter().all(|(_, n)| *n == 3), "capped at 3: {got:?}");
    assert!(got.iter().all(|g| *g == got[0]), "greedy: {got:?}");
    // A request's own values win over the defaults but not over the cap.
    let mut own = body.clone();
    own["temperature"] = json!(1.0);
    own["max_tokens"] = json!(10);
    let got = texts(&server, own).await;
    assert!(got.iter().all(|(_, n)| *n == 3), "{got:?}");
    assert!(got.iter().any(|g| *g != got[0]), "sampled: {got:?}");
    server.shutdown(Duration::from_secs(5)).await;

    let server = start(&[
        "--generation-config",
        folder,
        "--override-generation-config",
        r#"{"max_new_tokens": 5}"#,
    ])
    .await;
    let got = texts(&server, body.clone()).await;
    assert!(got.iter().all(|(_, n)| *n == 5), "{got:?}");
    server.shutdown(Duration::from_secs(5)).await;

    let server = start(&["--generation-config", "vllm"]).await;
    let got = texts(&server, body.clone()).await;
    assert!(
        got.iter().all(|(_, n)| *n == 16),
        "vLLM's default 16: {got:?}"
    );
    server.shutdown(Duration::from_secs(5)).await;

    start_fails(
        &["--generation-config", "/nonexistent-folder"],
        &["--generation-config", "/nonexistent-folder"],
    )
    .await;
    start_fails(
        &["--override-generation-config", r#"{"temperature": "hot"}"#],
        &["--override-generation-config", "temperature"],
    )
    .await;
    start_fails(
        &["--override-generation-config", "{"],
        &["--override-generation-config"],
    )
    .await;
    start_fails(&["--threads", "0"], &["--threads"]).await;
    std::fs::remove_dir_all(&dir).ok();
}
