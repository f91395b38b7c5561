//! llama.cpp's own tokenizer tests (`tests/test-tokenizer-0.cpp`) against
//! the GGUF tokenizer: every `ggml-vocab-*.gguf` of
//! `$INFERSCOPE_LLAMA_CPP_MODELS` (vocabulary-only files) with its `.inp`
//! inputs and `.out` expected ids, tokenized as that test does (no BOS/EOS,
//! control tokens in the text not parsed). Skipped, with a message, when the
//! variable is unset (`scripts/llama-cpp-test-data.sh` fetches the files).

use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use inferscope_model::{GgufTokenizer, Tokenizer};

/// The tokenizer models the GGUF tokenizer runs; the others are skipped.
const SUPPORTED: &[&str] = &["llama", "gpt2", "gemma4"];

fn data_dir() -> Option<PathBuf> {
    match std::env::var_os("INFERSCOPE_LLAMA_CPP_MODELS") {
        Some(d) => Some(PathBuf::from(d)),
        None => {
            println!(
                "skipped: INFERSCOPE_LLAMA_CPP_MODELS is unset (export INFERSCOPE_LLAMA_CPP_MODELS=\"$(scripts/llama-cpp-test-data.sh)\")"
            );
            None
        }
    }
}

/// `test-tokenizer-0.cpp`'s `read_tests`: inputs separated by
/// `\n__ggml_vocab_test__\n`, one line of space-separated ids per input.
fn read_tests(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    let raw = std::fs::read_to_string(inp).expect("read .inp");
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].find(sep) {
            Some(i) => {
                inputs.push(raw[pos..pos + i].to_string());
                pos += i + sep.len();
            }
            None => {
                inputs.push(raw[pos..].to_string());
                break;
            }
        }
    }
    let outs: Vec<Vec<u32>> = std::fs::read_to_string(out)
        .expect("read .out")
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("token id"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        outs.len(),
        "{}: inputs and outputs differ in number",
        inp.display()
    );
    inputs.into_iter().zip(outs).collect()
}

fn tokenizer_model(path: &Path) -> String {
    let mut f = File::open(path).expect("open vocab");
    let c = Content::read(&mut f).expect("read GGUF metadata");
    match c.metadata.get("tokenizer.ggml.model") {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

#[test]
fn llama_cpp_vocab_tests_token_for_token() {
    let Some(dir) = data_dir() else { return };
    let mut vocabs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read INFERSCOPE_LLAMA_CPP_MODELS")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ggml-vocab-") && n.ends_with(".gguf"))
        })
        .collect();
    vocabs.sort();
    assert!(
        !vocabs.is_empty(),
        "no ggml-vocab-*.gguf in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    let mut files_run = 0;
    for vocab in &vocabs {
        let name = vocab.file_name().unwrap().to_string_lossy().into_owned();
        let inp = PathBuf::from(format!("{}.inp", vocab.display()));
        let out = PathBuf::from(format!("{}.out", vocab.display()));
        let model = tokenizer_model(vocab);
        if !SUPPORTED.contains(&model.as_str()) {
            println!("{name}: skipped: tokenizer model {model:?} is not supported");
            continue;
        }
        if !inp.is_file() || !out.is_file() {
            println!("{name}: skipped: no .inp/.out tests beside it");
            continue;
        }
        let tok = GgufTokenizer::from_file(vocab)
            .unwrap_or_else(|e| panic!("{name}: the tokenizer does not load: {e}"));
        files_run += 1;
        let tests = read_tests(&inp, &out);
        let (mut matched, mut round_trips) = (0, 0);
        for (text, expected) in &tests {
            let got = tok.encode_with(text, false, false);
            if &got == expected {
                matched += 1;
            } else {
                failures.push(format!(
                    "{name} ({}): {text:?}\n  expected {expected:?}\n  got      {got:?}",
                    tok.model_name()
                ));
            }
            // The expected ids decode back to the input.
            let back = tok.decode(expected, false).expect("decode");
            if &back == text {
                round_trips += 1;
            } else {
                failures.push(format!(
                    "{name}: {expected:?} decodes to {back:?}, not {text:?}"
                ));
            }
        }
        println!(
            "{name} ({}): {matched}/{} inputs give llama.cpp's ids, {round_trips}/{} decode back",
            tok.model_name(),
            tests.len(),
            tests.len()
        );
    }
    assert!(files_run > 0, "no vocabulary with tests was run");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
