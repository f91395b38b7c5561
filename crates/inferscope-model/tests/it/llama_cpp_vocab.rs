//! llama.cpp's own tokenizer tests (`tests/test-tokenizer-0.cpp`) against
//! the GGUF tokenizer: every `ggml-vocab-*.gguf` of
//! `$INFERSCOPE_LLAMA_CPP_MODELS` (vocabulary-only files) with its `.inp`
//! inputs and `.out` expected ids, tokenized as that test does (no BOS/EOS,
//! control tokens in the text not parsed). Skipped, with a message, when the
//! variable is unset (`scripts/llama-cpp-test-data.sh` fetches the files).
//!
//! Where those tests do not look, `tests/data/llama_cpp_special.json` holds
//! what llama.cpp itself gives for the same files
//! (`scripts/llama-cpp-special-fixture.py`): prompts with special tokens
//! tokenized as its server does, and the end-of-generation set.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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

/// One vocabulary file: its name and tokenizer, or why it is skipped.
struct Vocab {
    name: String,
    path: PathBuf,
    tokenizer: Result<GgufTokenizer, String>,
}

/// Every `ggml-vocab-*.gguf`, loaded once for all the tests here.
fn vocabs(dir: &Path) -> &'static [Vocab] {
    static LOADED: OnceLock<Vec<Vocab>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read INFERSCOPE_LLAMA_CPP_MODELS")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ggml-vocab-") && n.ends_with(".gguf"))
            })
            .collect();
        paths.sort();
        paths
            .into_iter()
            .map(|path| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let model = tokenizer_model(&path);
                let tokenizer = if SUPPORTED.contains(&model.as_str()) {
                    Ok(GgufTokenizer::from_file(&path)
                        .unwrap_or_else(|e| panic!("{name}: the tokenizer does not load: {e}")))
                } else {
                    Err(format!("tokenizer model {model:?} is not supported"))
                };
                Vocab {
                    name,
                    path,
                    tokenizer,
                }
            })
            .collect()
    })
}

#[test]
fn llama_cpp_vocab_tests_token_for_token() {
    let Some(dir) = data_dir() else { return };
    let vocabs = vocabs(&dir);
    assert!(
        !vocabs.is_empty(),
        "no ggml-vocab-*.gguf in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    let mut files_run = 0;
    for v in vocabs {
        let name = &v.name;
        let inp = PathBuf::from(format!("{}.inp", v.path.display()));
        let out = PathBuf::from(format!("{}.out", v.path.display()));
        let tok = match &v.tokenizer {
            Ok(t) => t,
            Err(why) => {
                println!("{name}: skipped: {why}");
                continue;
            }
        };
        if !inp.is_file() || !out.is_file() {
            println!("{name}: skipped: no .inp/.out tests beside it");
            continue;
        }
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

#[test]
fn llama_cpp_server_prompts_and_end_of_generation() {
    let Some(dir) = data_dir() else { return };
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/llama_cpp_special.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixture).expect("read fixture"))
            .expect("fixture JSON");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    for v in vocabs(&dir) {
        let Some(expected) = json["vocabs"].get(&v.name) else {
            continue;
        };
        let tok = v.tokenizer.as_ref().expect("a supported vocabulary");
        checked += 1;
        let eog = ids(&expected["eog"]);
        if tok.eos_token_ids() != eog {
            failures.push(format!(
                "{}: end of generation {:?}, llama.cpp {eog:?}",
                v.name,
                tok.eos_token_ids()
            ));
        }
        let cases = expected["server_prompts"].as_array().expect("cases");
        let mut matched = 0;
        for c in cases {
            let text = c["text"].as_str().expect("text");
            let want = ids(&c["ids"]);
            // The trait's encode is the server's: BOS as the file says,
            // special tokens in the text parsed.
            let got = tok.encode(text, true).expect("encode");
            if got == want {
                matched += 1;
            } else {
                failures.push(format!(
                    "{}: {text:?}\n  llama.cpp {want:?}\n  got       {got:?}",
                    v.name
                ));
            }
        }
        println!(
            "{}: {matched}/{} prompts with special tokens give llama.cpp's ids; end of generation {eog:?}",
            v.name,
            cases.len()
        );
    }
    assert!(
        checked > 0,
        "no vocabulary of the fixture found in {}",
        dir.display()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
