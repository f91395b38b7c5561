//! The shipped demo model (`models/demo`, trained on *Pride and Prejudice*):
//! it loads through the normal loader, continues a line of the book in
//! English, and its tokenizer round-trips the book exactly.

use crate::common;

use std::collections::HashSet;
use std::io::Read;
use std::path::PathBuf;

use common::*;
use inferscope_engine::{Executor, StepOutput};
use inferscope_model::{LoadedModel, ModelOptions};

/// The opening of the held-out last chapter: not seen in training.
const OPENING: &str = "Happy for all her maternal feelings was the day on which Mrs. Bennet got rid of her two most deserving daughters.";

fn shipped_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

fn book() -> String {
    let gz = std::fs::read(shipped_dir().join("pride-and-prejudice.txt.gz")).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_string(&mut text)
        .unwrap();
    text
}

/// Lower-cased runs of letters (apostrophes split words, as in "Bennet's").
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn load(spec: &str) -> LoadedModel {
    let opts = ModelOptions {
        kv_cache_memory: Some(16 << 20),
        ..ModelOptions::default()
    };
    LoadedModel::load(spec, &opts).unwrap()
}

/// Greedy continuation of `prompt` (BOS added), `n` tokens.
fn greedy_continuation(m: &LoadedModel, prompt: &str, n: usize) -> (Vec<u32>, String) {
    let tok = m.tokenizer();
    let ids = tok.encode(prompt, true).unwrap();
    let mut e = m.cpu_executor().unwrap();
    e.init_kv_cache(16).unwrap();
    let mut alloc = Alloc::new(0).with_block_size(16);
    let mut s = Seq::new(1, &ids, greedy());
    let mut out = StepOutput::default();
    while s.num_generated < n {
        let b = build_batch(&mut [&mut s], &mut alloc, 512);
        e.execute(&b, &mut out).unwrap();
        append(&mut [&mut s], &b, &out.sampled);
    }
    let generated = s.tokens[ids.len()..].to_vec();
    let text = tok.decode(&generated, true).unwrap();
    (generated, text)
}

#[test]
fn greedy_continuation_of_the_book_is_english() {
    let vocab: HashSet<String> = words(&book()).into_iter().collect();
    let m = load(shipped_dir().to_str().unwrap());
    let (ids, text) = greedy_continuation(&m, OPENING, 64);
    let w = words(&text);
    assert!(w.len() >= 20, "too few words in {text:?}");
    let known = w.iter().filter(|x| vocab.contains(*x)).count();
    let fraction = known as f64 / w.len() as f64;
    eprintln!(
        "greedy continuation ({known}/{} words in the book's vocabulary, {fraction:.3}): {text:?}",
        w.len()
    );
    assert!(fraction >= 0.9, "{fraction:.3} of {text:?}");
    // The built-in `demo` is the same model, embedded in the binary.
    let builtin = load("demo");
    assert_eq!(builtin.name(), "demo");
    assert!(
        !builtin.is_demo(),
        "the trained model is not the random one"
    );
    assert_eq!(builtin.model().cfg, m.model().cfg);
    assert_eq!(greedy_continuation(&builtin, OPENING, 64).0, ids);
}

#[test]
fn shipped_tokenizer_round_trips_the_book() {
    let text = book();
    let m = load("demo");
    let tok = m.tokenizer();
    let ids = tok.encode(&text, false).unwrap();
    // A few thousand tokens, trained on this text: ~4 bytes a token.
    assert!(
        (2000..=8192).contains(&tok.vocab_size()),
        "{}",
        tok.vocab_size()
    );
    assert!(
        ids.len() * 3 < text.len(),
        "{} tokens for {} bytes",
        ids.len(),
        text.len()
    );
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    // With special tokens: BOS first, skipped on decode.
    let with = tok.encode(OPENING, true).unwrap();
    assert_eq!(Some(with[0]), tok.bos_token_id());
    assert_eq!(tok.decode(&with, true).unwrap(), OPENING);
}

#[test]
fn chat_template_turns_a_message_into_a_paragraph() {
    let m = load("demo");
    let msg = [inferscope_model::ChatMessage {
        role: "user".into(),
        content: "  Mr. Darcy was not a man to be trifled with. ".into(),
    }];
    let prompt = m.tokenizer().apply_chat_template(&msg, true).unwrap();
    assert_eq!(prompt, "<s>Mr. Darcy was not a man to be trifled with.\n\n");
    // Encoded as the server encodes a chat: the template's BOS, only one.
    let ids = m.tokenizer().encode(&prompt, false).unwrap();
    assert_eq!(ids[0], m.tokenizer().bos_token_id().unwrap());
    assert_ne!(ids[1], ids[0]);
}

#[test]
fn random_demo_stays_available_by_name() {
    let m = load("demo-random");
    assert_eq!(m.name(), "demo-random");
    assert!(m.is_demo());
    assert_eq!(m.tokenizer().vocab_size(), 258);
}
