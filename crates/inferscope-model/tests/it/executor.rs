//! The cpu executor on the demo model: batching, preemption, sampling, errors.

use crate::common;

use common::*;
use inferscope_engine::{BadWords, Executor, SamplingParams, StepOutput};
use inferscope_model::{CpuExecutor, LoadedModel, ModelOptions};

fn demo() -> (LoadedModel, CpuExecutor) {
    let opts = ModelOptions {
        kv_cache_memory: Some(64 << 20),
        ..ModelOptions::default()
    };
    let m = LoadedModel::load("demo-random", &opts).unwrap();
    let mut e = m.cpu_executor().unwrap();
    let blocks = e.init_kv_cache(BLOCK_SIZE).unwrap();
    // 64 MiB over (2 · 4 layers · 4 heads · 32 dims · 2 B) per token: the
    // default cache is f16.
    assert_eq!(blocks, (64 << 20) / (2 * 4096));
    (m, e)
}

/// Runs sequences to `steps` generated tokens each, all in one batch per step.
fn generate(
    e: &mut CpuExecutor,
    seqs: &mut [&mut Seq],
    alloc: &mut Alloc,
    steps: usize,
    chunk: usize,
) {
    let mut out = StepOutput::default();
    while seqs.iter().any(|s| s.num_generated < steps) {
        let mut active: Vec<&mut Seq> = seqs
            .iter_mut()
            .filter(|s| s.num_generated < steps)
            .map(|s| &mut **s)
            .collect();
        let batch = build_batch(&mut active, alloc, chunk);
        e.execute(&batch, &mut out).unwrap();
        assert_eq!(out.sampled.len(), batch.seqs.len());
        append(&mut active, &batch, &out.sampled);
    }
}

#[test]
fn demo_generates_printable_text() {
    let (m, mut e) = demo();
    let tok = m.tokenizer();
    let mut s = Seq::new(
        1,
        &tok.encode("Hello", true).unwrap(),
        SamplingParams::default(),
    );
    generate(&mut e, &mut [&mut s], &mut Alloc::new(0), 40, 512);
    let text = tok.decode(&s.tokens[6..], true).unwrap();
    assert_eq!(text.len(), 40);
    assert!(
        text.chars().all(|c| c == '\n' || (' '..='~').contains(&c)),
        "{text:?}"
    );
    assert_eq!(e.name(), "cpu:demo-random");
    assert_eq!(e.eos_token_ids(), vec![257]);
}

#[test]
fn batched_greedy_equals_alone() {
    let (_, mut e) = demo();
    let prompts: [&[u32]; 3] = [
        &[256, 72, 105],
        &[256, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        &[256, 50],
    ];
    let mut alone = Vec::new();
    let mut alloc = Alloc::new(0);
    for (i, p) in prompts.iter().enumerate() {
        let mut s = Seq::new(i as u64, p, greedy());
        generate(&mut e, &mut [&mut s], &mut alloc, 12, 512);
        alone.push(s.tokens);
    }
    let mut seqs: Vec<Seq> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Seq::new(i as u64, p, greedy()))
        .collect();
    let mut refs: Vec<&mut Seq> = seqs.iter_mut().collect();
    // Chunked prefill (3 tokens a step) mixes prefill chunks and decodes.
    generate(&mut e, &mut refs, &mut alloc, 12, 3);
    for (s, a) in seqs.iter().zip(&alone) {
        assert_eq!(&s.tokens, a);
    }
}

#[test]
fn recompute_after_preemption_reproduces_sampled_tokens() {
    let (_, mut e) = demo();
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        ..SamplingParams::default()
    };
    let mut alloc = Alloc::new(0);
    let mut straight = Seq::new(5, &[256, 10, 20, 30], params.clone());
    generate(&mut e, &mut [&mut straight], &mut alloc, 16, 512);

    let mut s = Seq::new(5, &[256, 10, 20, 30], params);
    generate(&mut e, &mut [&mut s], &mut alloc, 8, 512);
    s.preempt();
    generate(&mut e, &mut [&mut s], &mut alloc, 16, 512);
    assert_eq!(s.tokens, straight.tokens);
}

/// Greedy with all three penalties: the executor's incremental token counts,
/// through chunked prefill, batching and a preemption with recompute, pick
/// the tokens that a rescan of the whole sequence gives at every step (the
/// reference: the step's raw logits, the penalties computed from the token
/// list by hand, argmax).
#[test]
fn penalties_follow_the_whole_sequence_across_preemption() {
    let (_, mut e) = demo();
    let (rep, freq, pres) = (1.3f32, 2.0f32, 0.5f32);
    let params = SamplingParams {
        temperature: 0.0,
        repetition_penalty: rep,
        frequency_penalty: freq,
        presence_penalty: pres,
        ..SamplingParams::default()
    };
    let prompt = [256, 10, 20, 10, 30, 20, 10];
    let steps = 24;
    let mut alloc = Alloc::new(0);
    let mut reference = prompt.to_vec();
    let mut plain = prompt.to_vec();
    for i in 0..steps as u64 {
        for (seq, penalised) in [(&mut reference, true), (&mut plain, false)] {
            let mut s = Seq::new(1000 + 2 * i + u64::from(penalised), seq, greedy());
            let batch = build_batch(&mut [&mut s], &mut alloc, 512);
            let mut l = e.forward_logits(&batch).unwrap().remove(0);
            if penalised {
                let output = &seq[prompt.len()..];
                let mut seen: Vec<u32> = seq.clone();
                seen.sort_unstable();
                seen.dedup();
                for t in seen {
                    let x = &mut l[t as usize];
                    *x = if *x > 0.0 { *x / rep } else { *x * rep };
                    let n = output.iter().filter(|&&o| o == t).count() as f32;
                    *x -= freq * n + if n > 0.0 { pres } else { 0.0 };
                }
            }
            seq.push(inferscope_model::sampler::argmax(&l));
        }
    }
    assert_ne!(reference, plain, "the penalties change this output");

    // Alongside another sequence, prefilled 3 tokens a step, preempted
    // half-way and recomputed from scratch.
    let mut s = Seq::new(5, &prompt, params.clone());
    let mut other = Seq::new(6, &[256, 40, 41], params);
    generate(&mut e, &mut [&mut s, &mut other], &mut alloc, steps / 2, 3);
    s.preempt();
    generate(&mut e, &mut [&mut s, &mut other], &mut alloc, steps, 3);
    assert_eq!(s.tokens, reference);
    // The counts themselves: every position fed so far (all but the last
    // sampled token) counted once, recompute or not.
    for seq in [&s, &other] {
        let fed = &seq.tokens[..seq.tokens.len() - 1];
        let mut want: Vec<(u32, u32, bool)> = fed
            .iter()
            .map(|&t| {
                let out = fed[seq.prompt_len..].iter().filter(|&&o| o == t).count();
                (t, out as u32, seq.tokens[..seq.prompt_len].contains(&t))
            })
            .collect();
        want.sort_unstable();
        want.dedup();
        let counts = e.token_counts(seq.id).expect("counts kept");
        let mut got: Vec<(u32, u32, bool)> = counts
            .iter()
            .map(|(t, c)| (t, c.output, c.in_prompt))
            .collect();
        got.sort_unstable();
        assert_eq!(got, want, "sequence {}", seq.id);
        assert_eq!(counts.len(), fed.len());
    }
}

/// `bad_words`, greedily: a one-token word never comes out; for a
/// two-token word `[a, b]` taken from the greedy output, `a` still comes
/// out, then `b` is refused there, so the output follows the greedy one up
/// to `a`, differs right after, and nowhere holds `a, b`; the prompt is not
/// output (a word of the prompt's last token and the first greedy token
/// changes nothing). The same through chunked prefill, batching and a
/// preemption with recompute.
#[test]
fn bad_words_ban_their_token_sequences() {
    let (_, mut e) = demo();
    let prompt = [256, 72, 101, 108, 108, 111];
    let steps = 24;
    let mut alloc = Alloc::new(0);
    let banning = |words: &[&[u32]]| SamplingParams {
        bad_words: BadWords::new(words),
        ..greedy()
    };
    let run = |e: &mut CpuExecutor, alloc: &mut Alloc, params: SamplingParams| {
        let mut s = Seq::new(1, &prompt, params);
        generate(e, &mut [&mut s], alloc, steps, 512);
        s.tokens[prompt.len()..].to_vec()
    };
    let out = run(&mut e, &mut alloc, greedy());
    let holds = |o: &[u32], w: [u32; 2]| o.windows(2).any(|x| x == w);

    let banned = run(&mut e, &mut alloc, banning(&[&[out[0]]]));
    assert!(!banned.contains(&out[0]), "{banned:?} holds {}", out[0]);

    let (a, b) = (out[2], out[3]);
    let i = out.windows(2).position(|w| w == [a, b]).expect("pair");
    let banned = run(&mut e, &mut alloc, banning(&[&[a, b]]));
    assert_eq!(banned[..=i], out[..=i], "{banned:?} vs {out:?}");
    assert_ne!(banned[i + 1], b);
    assert!(!holds(&banned, [a, b]), "{banned:?} holds {a}, {b}");

    let last = prompt[prompt.len() - 1];
    let unchanged = run(&mut e, &mut alloc, banning(&[&[last, out[0]]]));
    assert_eq!(unchanged, out, "the prompt is not output");

    let mut s = Seq::new(5, &prompt, banning(&[&[a, b]]));
    let mut other = Seq::new(6, &[256, 40, 41], banning(&[&[a]]));
    generate(&mut e, &mut [&mut s, &mut other], &mut alloc, steps / 2, 3);
    s.preempt();
    generate(&mut e, &mut [&mut s, &mut other], &mut alloc, steps, 3);
    assert_eq!(s.tokens[prompt.len()..], banned);
    assert!(!other.tokens[3..].contains(&a));
}

#[test]
fn min_tokens_masks_eos() {
    let (_, mut e) = demo();
    let mut out = StepOutput::default();
    // Every token but 65 is a stop token: the only one left is 65.
    let params = SamplingParams {
        min_tokens: 5,
        stop_token_ids: (0..258).filter(|&t| t != 65).collect(),
        ..SamplingParams::default()
    };
    let mut s = Seq::new(1, &[256, 1], params);
    let batch = build_batch(&mut [&mut s], &mut Alloc::new(0), 512);
    e.execute(&batch, &mut out).unwrap();
    assert_eq!(out.sampled, vec![Some(65)]);
}

#[test]
fn bad_batches_are_step_errors() {
    let (_, mut e) = demo();
    let mut out = StepOutput::default();
    let mut s = Seq::new(1, &[256, 1], greedy());
    let mut batch = build_batch(&mut [&mut s], &mut Alloc::new(0), 512);
    batch.block_tables[0] = u32::MAX;
    let err = e.execute(&batch, &mut out).unwrap_err();
    assert!(err.to_string().contains("outside the KV pool"), "{err}");
    batch.block_tables[0] = 0;
    batch.token_ids[0] = 1000;
    let err = e.execute(&batch, &mut out).unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
}

#[test]
fn kv_budget_smaller_than_a_block_fails() {
    let opts = ModelOptions {
        kv_cache_memory: Some(10),
        ..ModelOptions::default()
    };
    let m = LoadedModel::load("demo-random", &opts).unwrap();
    let mut e = m.executor().unwrap();
    assert!(e.init_kv_cache(16).is_err());
}

/// A step's device time is its forward pass: positive, and strictly inside
/// the executor call, which also prepares inputs and samples.
#[test]
fn device_time_is_inside_the_execute_call() {
    let (m, mut e) = demo();
    let tok = m.tokenizer();
    let mut s = Seq::new(
        1,
        &tok.encode("Hello there", true).unwrap(),
        SamplingParams::default(),
    );
    let mut alloc = Alloc::new(0);
    let mut out = StepOutput::default();
    for _ in 0..3 {
        let batch = build_batch(&mut [&mut s], &mut alloc, 512);
        let start = std::time::Instant::now();
        e.execute(&batch, &mut out).unwrap();
        let wall = start.elapsed();
        assert!(out.device_time > std::time::Duration::ZERO);
        assert!(out.device_time < wall, "{:?} vs {wall:?}", out.device_time);
        append(&mut [&mut s], &batch, &out.sampled);
    }
}
