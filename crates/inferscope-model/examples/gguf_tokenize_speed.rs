//! Encoding throughput of a GGUF vocabulary's tokenizer on a long English
//! text (Pride and Prejudice, shipped with the demo model), against the path
//! it replaced: the same vocabulary and merges as a Hugging Face
//! `tokenizer.json` (byte-level BPE with GPT-2's regex) run by the
//! `tokenizers` crate. Run it in release:
//!
//! ```text
//! cargo run --release -p inferscope-model --example gguf_tokenize_speed -- \
//!     "$INFERSCOPE_LLAMA_CPP_MODELS/ggml-vocab-llama-bpe.gguf"
//! ```

use std::fs::File;
use std::io::Read;
use std::time::Instant;

use candle_core::quantized::gguf_file::{Content, Value};
use inferscope_model::GgufTokenizer;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn book() -> Res<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/demo/pride-and-prejudice.txt.gz"
    );
    let mut text = String::new();
    flate2::read::GzDecoder::new(File::open(path)?).read_to_string(&mut text)?;
    Ok(text)
}

/// The replaced path: a `tokenizer.json` equivalent of the vocabulary.
fn old_tokenizer(path: &str) -> Res<tokenizers::Tokenizer> {
    let content = Content::read(&mut File::open(path)?)?;
    let get = |key: &str| content.metadata.get(key);
    let strings = |key: &str| -> Res<Vec<String>> {
        match get(key) {
            Some(Value::Array(a)) => Ok(a
                .iter()
                .filter_map(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    _ => None,
                })
                .collect()),
            _ => Err(format!("no {key}").into()),
        }
    };
    let numbers = |key: &str| -> Vec<f64> {
        match get(key) {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::F32(x) => f64::from(*x),
                    Value::I32(x) => f64::from(*x),
                    _ => 0.0,
                })
                .collect(),
            _ => Vec::new(),
        }
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), serde_json::Value::from(i)))
        .collect();
    let json = match get("tokenizer.ggml.model") {
        Some(Value::String(m)) if m == "gpt2" => serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "vocab": vocab, "merges": strings("tokenizer.ggml.merges")?}
        }),
        Some(Value::String(m)) if m == "llama" => {
            // Every split of a normal token into two tokens, ranked by the
            // token's score.
            let (types, scores) = (
                numbers("tokenizer.ggml.token_type"),
                numbers("tokenizer.ggml.scores"),
            );
            let ids: std::collections::HashMap<&str, usize> = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (t.as_str(), i))
                .collect();
            let mut merges: Vec<(f64, usize, usize, String)> = Vec::new();
            for (id, t) in tokens.iter().enumerate() {
                if types.get(id).copied().unwrap_or(1.0) != 1.0 {
                    continue;
                }
                for (split, _) in t.char_indices().skip(1) {
                    let (l, r) = t.split_at(split);
                    if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                        merges.push((
                            scores.get(id).copied().unwrap_or(0.0),
                            li,
                            ri,
                            format!("{l} {r}"),
                        ));
                    }
                }
            }
            merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            let merges: Vec<String> = merges.into_iter().map(|m| m.3).collect();
            serde_json::json!({
                "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
                "normalizer": {"type": "Sequence", "normalizers": [
                    {"type": "Prepend", "prepend": "\u{2581}"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]},
                "pre_tokenizer": null, "post_processor": null, "decoder": null,
                "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                    "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                    "vocab": vocab, "merges": merges}
            })
        }
        _ => return Err("the old path had only gpt2 and llama".into()),
    };
    tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).map_err(|e| e.to_string().into())
}

/// Encodes `text` `rounds` times; returns MB/s and the ids of the last run.
fn measure(rounds: usize, text: &str, mut encode: impl FnMut(&str) -> Vec<u32>) -> (f64, Vec<u32>) {
    let mut ids = encode(text); // warm-up
    let t = Instant::now();
    for _ in 0..rounds {
        ids = encode(text);
    }
    let secs = t.elapsed().as_secs_f64();
    ((text.len() * rounds) as f64 / secs / 1e6, ids)
}

fn main() -> Res<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: gguf_tokenize_speed VOCAB.gguf [ROUNDS]")?;
    let rounds: usize = std::env::args()
        .nth(2)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(5);
    let text = book()?;
    let new = GgufTokenizer::from_file(std::path::Path::new(&path))?;
    let (new_mbs, new_ids) = measure(rounds, &text, |t| new.encode_with(t, false, false));
    println!(
        "{}: {} bytes of English, {} tokens",
        path,
        text.len(),
        new_ids.len()
    );
    println!(
        "new GGUF tokenizer ({}): {new_mbs:.2} MB/s, {:.0} tokens/s",
        new.model_name(),
        new_mbs * 1e6 * new_ids.len() as f64 / text.len() as f64
    );
    match old_tokenizer(&path) {
        Ok(old) => {
            let (old_mbs, old_ids) = measure(rounds, &text, |t| {
                old.encode(t, false)
                    .map(|e| e.get_ids().to_vec())
                    .unwrap_or_default()
            });
            let same = new_ids.len() == old_ids.len() && new_ids == old_ids;
            println!(
                "old tokenizer.json path: {old_mbs:.2} MB/s ({} tokens, {} the new ids)",
                old_ids.len(),
                if same { "same as" } else { "differs from" }
            );
        }
        Err(e) => println!("old path not comparable for this vocabulary: {e}"),
    }
    Ok(())
}
