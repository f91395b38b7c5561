//! The 16-bit KV cache (`--kv-cache-dtype`) against the f32 one: the same
//! budget holds twice the tokens, and the logits stay within a stated
//! tolerance of the f32 path's, with the same greedy tokens.

use crate::common;

use common::*;
use inferscope_engine::Executor;
use inferscope_model::{KvDtype, LoadedModel, ModelOptions};

/// Relative tolerance (max |Δ| over the largest |logit|) of the 16-bit
/// caches' logits against the f32 cache's. f16 keeps 11 significant bits
/// (K/V rounded by at most 2⁻¹² relative): the logits move by 1.0e-4
/// (demo) and 2.1e-4 (demo-random) of their scale, against the f32 path's
/// 1e-4 to candle's; bf16's 8 bits move them about 10× more.
const F16_TOLERANCE: f32 = 5e-4;
const BF16_TOLERANCE: f32 = 5e-3;

fn load(spec: &str, kv: KvDtype) -> LoadedModel {
    let opts = ModelOptions {
        kv_cache_memory: Some(16 << 20),
        kv_cache_dtype: kv,
        ..ModelOptions::default()
    };
    LoadedModel::load(spec, &opts).unwrap()
}

/// The logits of every step of a greedy run from `prompt`, `n` tokens: a
/// prefill in chunks of 8 and `n` decodes, each step's token the argmax of
/// the previous step's logits.
fn greedy_logits(m: &LoadedModel, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut e = m.cpu_executor().unwrap();
    e.init_kv_cache(16).unwrap();
    let mut alloc = Alloc::new(0).with_block_size(16);
    let mut s = Seq::new(1, prompt, greedy());
    let mut all = Vec::new();
    while s.num_generated < n {
        let b = build_batch(&mut [&mut s], &mut alloc, 8);
        let logits = e.forward_logits(&b).unwrap();
        let mut rows = logits.iter();
        let sampled: Vec<Option<u32>> = b
            .seqs
            .iter()
            .map(|q| {
                q.sample
                    .then(|| inferscope_model::sampler::argmax(rows.next().unwrap()))
            })
            .collect();
        if let Some(l) = logits.first() {
            all.push(l.clone());
        }
        append(&mut [&mut s], &b, &sampled);
    }
    (s.tokens[prompt.len()..].to_vec(), all)
}

fn max_relative_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// `spec` run greedily with each 16-bit cache and with the f32 one.
fn check_against_f32(spec: &str, prompt: &[u32], n: usize) {
    let (want_tokens, want) = greedy_logits(&load(spec, KvDtype::F32), prompt, n);
    for (kv, tol) in [
        (KvDtype::F16, F16_TOLERANCE),
        (KvDtype::Bf16, BF16_TOLERANCE),
    ] {
        let (tokens, got) = greedy_logits(&load(spec, kv), prompt, n);
        assert_eq!(got.len(), want.len());
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| max_relative_diff(a, b))
            .fold(0f32, f32::max);
        eprintln!("{spec} {kv:?}: worst relative logit difference {worst:.2e} over {n} steps");
        assert!(worst <= tol, "{spec} {kv:?}: {worst} > {tol}");
        // A 16-bit cache moves the logits, never to zero: it is really used.
        assert!(worst > 0.0, "{spec} {kv:?}: identical logits");
        if kv == KvDtype::F16 {
            assert_eq!(
                tokens, want_tokens,
                "{spec}: greedy tokens with an f16 cache"
            );
        }
    }
}

/// The trained demo model: 48 greedy tokens after a 40-token prompt.
#[test]
fn f16_cache_matches_the_f32_cache_on_the_demo_model() {
    let m = load("demo", KvDtype::F32);
    let prompt = m
        .tokenizer()
        .encode(
            "It is a truth universally acknowledged, that a single man",
            true,
        )
        .unwrap();
    check_against_f32("demo", &prompt, 48);
}

/// The random-weight Llama (`demo-random`).
#[test]
fn f16_cache_matches_the_f32_cache_on_a_random_llama() {
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 3) % 250).collect();
    check_against_f32("demo-random", &prompt, 32);
}

/// The same `--kv-cache-memory` holds twice the blocks in 16 bits.
#[test]
fn sixteen_bit_cache_holds_twice_the_tokens() {
    let blocks = |kv: KvDtype| {
        let mut e = load("demo", kv).cpu_executor().unwrap();
        assert_eq!(e.kv_dtype(), kv);
        e.init_kv_cache(16).unwrap()
    };
    let f32_blocks = blocks(KvDtype::F32);
    assert!(f32_blocks > 0);
    assert_eq!(blocks(KvDtype::F16), 2 * f32_blocks);
    assert_eq!(blocks(KvDtype::Bf16), 2 * f32_blocks);
    // The server's default is 16-bit.
    assert_eq!(ModelOptions::default().kv_cache_dtype, KvDtype::F16);
}
