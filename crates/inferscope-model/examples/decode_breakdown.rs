//! Where a decode step at batch 1 spends its time, part by part, against
//! the memory roofline:
//!
//! ```text
//! cargo run --release -p inferscope-model --example decode_breakdown -- FILE.gguf [FILE.gguf …]
//! ```
//!
//! For each GGUF file: a prefill of `CONTEXT` tokens (default 128), then
//! decode steps at batch 1 that rewrite the same KV slot (so the context
//! stays fixed), through the cpu executor as the engine calls it (sampling
//! greedy over the vocabulary included). Prints the median step time with
//! the profile off, then the median over rounds of each part's time per
//! step with it on, and for each product its weight bytes and the rate at
//! which it read them, against the streaming read bandwidth measured first
//! (1 GiB, all threads and one thread, 1, 4 and 8 streams per thread; the roofline
//! column uses 8 streams on all threads). Knobs (environment): `CONTEXT`,
//! `STEPS` per round (default 40), `ROUNDS` (default 7).

use std::sync::Arc;
use std::time::{Duration, Instant};

use measure::{env, executor, median, pool, profile_parts, read_bandwidth};

use inferscope_engine::{Executor, SamplingParams, ScheduledBatch, ScheduledSeq, StepOutput};
use inferscope_model::CpuExecutor;
use inferscope_model::gguf::load_gguf;
use inferscope_model::llama::Part;

mod measure;

const BLOCK_SIZE: usize = 16;

/// One sequence's step: `n` tokens from position `start`.
fn step(start: usize, n: usize, blocks: usize) -> ScheduledBatch {
    ScheduledBatch {
        block_size: BLOCK_SIZE,
        token_ids: (0..n as u32).map(|i| 3 + (i * 7) % 200).collect(),
        block_tables: (0..blocks as u32).collect(),
        seqs: vec![ScheduledSeq {
            seq_id: 1,
            token_offset: 0,
            num_tokens: n,
            start_pos: start,
            block_table_offset: 0,
            block_table_len: blocks,
            is_prefill: start == 0,
            sample: true,
            num_generated: 1,
            seed: 1,
            params: Arc::new(SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            }),
            history: Default::default(),
            mask_slot: None,
            prompt_rows: None,
        }],
        ..ScheduledBatch::default()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        return Err("usage: decode_breakdown FILE.gguf [FILE.gguf …]".into());
    }
    let (context, steps, rounds) = (env("CONTEXT", 128), env("STEPS", 40), env("ROUNDS", 7));
    let threads = rayon::current_num_threads();
    let (all, one) = (pool(threads), pool(1));
    for streams in [1, 4, 8] {
        println!(
            "read bandwidth, {streams} stream(s) per thread: {:.1} GB/s on {threads} threads, {:.1} GB/s on one",
            read_bandwidth(&all, streams),
            read_bandwidth(&one, streams)
        );
    }
    let bw_all = read_bandwidth(&all, 8);
    for file in &files {
        let (model, _) = load_gguf(file.as_ref()).map_err(|e| format!("{file}: {e}"))?;
        let model = Arc::new(model);
        let blocks = (context + 1).div_ceil(BLOCK_SIZE);
        let kv = (blocks
            * BLOCK_SIZE
            * model
                .cfg
                .kv_bytes_per_token(inferscope_model::KvDtype::default())) as u64;
        let mut exec = executor(model.clone(), kv, BLOCK_SIZE)?;
        let mut out = StepOutput::default();
        exec.execute(&step(0, context, blocks), &mut out)?;
        let decode = step(context, 1, blocks);
        let mut run = |exec: &mut CpuExecutor| -> Result<Duration, Box<dyn std::error::Error>> {
            let t = Instant::now();
            exec.execute(&decode, &mut out)?;
            Ok(t.elapsed())
        };
        for _ in 0..steps {
            run(&mut exec)?;
        }
        // Step time without the profile: median of every step of every round.
        let mut plain = Vec::new();
        for _ in 0..rounds {
            for _ in 0..steps {
                plain.push(run(&mut exec)?.as_secs_f64() * 1e6);
            }
        }
        let plain = median(plain);
        let (parts, total) = profile_parts(&mut exec, rounds, steps, run)?;
        let parts: Vec<f64> = parts.iter().map(|s| s * 1e6).collect();
        let total = total * 1e6;
        let bytes = model.weight_bytes_by_part();
        let all_bytes: usize = bytes.iter().map(|b| b.1).sum();
        println!(
            "\n{file}: decode step at batch 1, context {context}: {plain:.0} µs median \
             ({:.1} tok/s); profiled {total:.0} µs; weights {:.1} MB, roofline {:.0} µs at {bw_all:.1} GB/s",
            1e6 / plain,
            all_bytes as f64 / 1e6,
            all_bytes as f64 / bw_all / 1e3,
        );
        println!(
            "| part | µs/step | % of step | weight MB | GB/s read | roofline µs |\n|---|---|---|---|---|---|"
        );
        for (part, us) in Part::ALL.iter().zip(&parts) {
            let pct = 100.0 * us / total;
            match bytes.iter().find(|b| b.0 == *part) {
                Some(&(_, b)) => println!(
                    "| {} | {us:.0} | {pct:.1} | {:.1} | {:.1} | {:.0} |",
                    part.label(),
                    b as f64 / 1e6,
                    b as f64 / us / 1e3,
                    b as f64 / bw_all / 1e3,
                ),
                None => println!("| {} | {us:.0} | {pct:.1} | | | |", part.label()),
            }
        }
        let other = total - parts.iter().sum::<f64>();
        println!(
            "| outside the parts (pool entry, device clock) | {other:.0} | {:.1} | | | |",
            100.0 * other / total
        );
    }
    Ok(())
}
