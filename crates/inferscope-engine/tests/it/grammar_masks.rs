//! The grammar masks the scheduler hands the executor are those of each
//! sequence's current state: the scheduler is driven step by step through
//! chunked prefills, staggered admissions and preemptions, and every mask a
//! batch carries is compared with one computed from a matcher of its own
//! that has consumed the same tokens. A mask one step stale (computed before
//! the last token was consumed), or another sequence's, fails the test.

use std::sync::Arc;

use inferscope_engine::output_channel::{OutputReceiver, channel};
use inferscope_engine::scheduler::Scheduler;
use inferscope_engine::structured::{Advance, GrammarWorker, SeqGrammar};
use inferscope_engine::{
    CompiledGrammar, EngineConfig, EngineRequest, FinishReason, GrammarCompiler, SamplingParams,
    StepOutput, StructuredOutput, TokenMask,
};

const EOS: u32 = 256;
const VOCAB: u32 = 257;

/// Bytes 0..=255, then EOS.
fn byte_compiler() -> GrammarCompiler {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.push(b"\xFF</s>".to_vec());
    GrammarCompiler::new(words, EOS).expect("compiler")
}

/// Constraints whose allowed tokens change from one step to the next.
fn constraints() -> Vec<StructuredOutput> {
    vec![
        StructuredOutput::Regex("abcdefghijklmnopqrst".into()),
        StructuredOutput::Regex("(ab|xy)(cd|zw)(ef|uv)(gh|st){4}".into()),
        StructuredOutput::Json(serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["name", "n"],
            "additionalProperties": false
        })),
        StructuredOutput::Choice(vec!["alpha-beta".into(), "gamma".into()]),
        StructuredOutput::Regex("[0-9]{3}-[a-z]{3}-[0-9]{2}".into()),
    ]
}

fn allowed(m: &TokenMask) -> Vec<u32> {
    (0..VOCAB).filter(|&t| m.is_allowed(t)).collect()
}

/// The mask of `g`'s current state, computed on its own.
fn reference_mask(g: &SeqGrammar) -> Vec<u32> {
    let step = GrammarWorker::compute_now(vec![g.clone()]);
    let ready = step.wait();
    allowed(ready.get(0).expect("reference mask"))
}

#[test]
fn masks_are_those_of_each_sequences_current_state() {
    let compiler = byte_compiler();
    let compiled: Vec<CompiledGrammar> = constraints()
        .into_iter()
        .map(|c| compiler.compile(c).expect("compiles"))
        .collect();
    // Few slots, a small token budget and a small pool: prompts are
    // prefilled in chunks, requests start as others end, and running ones
    // are preempted and computed again.
    let config = EngineConfig {
        max_num_batched_tokens: 24,
        max_num_seqs: 5,
        block_size: 4,
        enable_prefix_caching: false,
        max_model_len: 1_000,
        grammar_threads: Some(2),
        ..Default::default()
    };
    let mut sched = Scheduler::new(config, 40, vec![EOS]);
    let n = 14;
    let mut rxs: Vec<OutputReceiver> = Vec::new();
    // Request `i`'s own matcher (constrained ones) and the tokens it sampled.
    let mut reference: Vec<Option<SeqGrammar>> = Vec::new();
    let mut sampled: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut grammar_done = vec![false; n];
    for i in 0..n {
        // Every fourth request is unconstrained.
        let grammar = (i % 4 != 3).then(|| compiled[i % compiled.len()].clone());
        reference.push(grammar.as_ref().map(CompiledGrammar::start));
        let (tx, rx) = channel(0);
        rxs.push(rx);
        sched.add_request(
            EngineRequest {
                // EOS counts here: a grammar's end is an EOS.
                params: Arc::new(SamplingParams {
                    max_tokens: 40,
                    ..Default::default()
                }),
                grammar,
                ..crate::common::request(
                    &format!("r{i}"),
                    (0..(9 + 5 * i as u32) % 31 + 6).collect(),
                    40,
                )
            },
            tx,
        );
    }
    let mut out = StepOutput::default();
    let mut checked = 0;
    let mut steps = 0;
    let mut preemptions = 0;
    while sched.has_work() {
        steps += 1;
        assert!(steps < 2_000, "no progress");
        sched.schedule();
        preemptions += sched.snapshot().num_preemptions;
        let batch = sched.batch();
        if batch.seqs.is_empty() {
            continue;
        }
        out.sampled.clear();
        let ready = batch.masks.as_ref().map(|m| m.wait());
        for s in &batch.seqs {
            let i = s.seq_id as usize;
            if !s.sample {
                out.sampled.push(None);
                continue;
            }
            let Some(g) = &reference[i] else {
                assert!(s.mask_slot.is_none(), "r{i} is unconstrained");
                sampled[i].push(u32::from(b'q'));
                out.sampled.push(Some(u32::from(b'q')));
                continue;
            };
            let slot = s.mask_slot.expect("a constrained sequence has a mask slot") as usize;
            let r = ready.as_ref().expect("the step's masks");
            if grammar_done[i] {
                // The worker consumed the token that completed the grammar
                // while this step ran: no mask, and whatever this step
                // samples is not output.
                assert_eq!(r.advance(slot), Advance::Finished, "r{i}");
                assert!(
                    r.get(slot).is_none(),
                    "r{i} has a mask after its grammar ended"
                );
                out.sampled.push(Some(EOS));
                continue;
            }
            assert_eq!(r.advance(slot), Advance::Continue, "r{i}");
            let mask = r.get(slot).expect("its mask");
            let got = allowed(mask);
            assert_eq!(
                got,
                reference_mask(g),
                "r{i}'s mask after {:?}",
                String::from_utf8_lossy(&sampled[i].iter().map(|&t| t as u8).collect::<Vec<_>>())
            );
            checked += 1;
            // Vary the choice between steps and requests; EOS only when
            // nothing else is allowed.
            let text: Vec<u32> = got.iter().copied().filter(|&t| t != EOS).collect();
            let pick = if text.is_empty() {
                EOS
            } else {
                text[(steps * 7 + i * 3) % text.len()]
            };
            match g.advance(pick) {
                Advance::Continue => {}
                Advance::Finished => grammar_done[i] = true,
                Advance::Error(e) => panic!("r{i}: the reference matcher refused {pick}: {e}"),
            }
            sampled[i].push(pick);
            out.sampled.push(Some(pick));
        }
        drop(ready);
        sched.update(&out);
    }
    assert!(checked > 150, "only {checked} masks checked");
    assert!(preemptions > 0, "no sequence was preempted");
    for (i, rx) in rxs.iter_mut().enumerate() {
        let mut tokens = Vec::new();
        let mut finish = None;
        while let Ok(o) = rx.try_recv() {
            assert!(finish.is_none(), "r{i}: output after the finish");
            tokens.extend(o.token_id);
            finish = o.finished.map(|f| f.reason);
        }
        assert_eq!(tokens, sampled[i], "r{i}'s tokens");
        let expected = if reference[i].is_none() {
            FinishReason::Length
        } else {
            assert!(grammar_done[i], "r{i}'s grammar ended");
            FinishReason::Stop
        };
        assert_eq!(finish, Some(expected), "r{i}");
    }
}
