//! Where a prefill step spends its time, part by part, against the
//! arithmetic it does:
//!
//! ```text
//! cargo run --release -p inferscope-model --example prefill_breakdown -- FILE.gguf [FILE.gguf …]
//! ```
//!
//! For each GGUF file: one step that prefills `SEQS` sequences (default 8)
//! of `CONTEXT` tokens each (default 128), as the engine schedules a wave
//! of prompts that arrive together, through the cpu executor (greedy
//! sampling of each sequence's last token included). Prints the median
//! step time with the profile off, then the median over `ROUNDS` (default
//! 5) of each part's time with it on, and for each product the multiply-adds
//! it does and the rate (GFLOP/s, two per multiply-add) it reached.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inferscope_engine::{Executor, SamplingParams, ScheduledBatch, ScheduledSeq, StepOutput};
use inferscope_model::gguf::load_gguf;
use inferscope_model::llama::Part;
use inferscope_model::{CpuExecutor, ModelConfig};
use measure::{env, executor, median, profile_parts};

mod measure;

const BLOCK_SIZE: usize = 16;

/// One step prefilling `seqs` sequences of `n` tokens, each in its own
/// `blocks` KV blocks.
fn prefill(seqs: usize, n: usize, blocks: usize) -> ScheduledBatch {
    let params = Arc::new(SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    });
    ScheduledBatch {
        block_size: BLOCK_SIZE,
        token_ids: (0..(seqs * n) as u32).map(|i| 3 + (i * 7) % 200).collect(),
        block_tables: (0..(seqs * blocks) as u32).collect(),
        seqs: (0..seqs)
            .map(|s| ScheduledSeq {
                seq_id: s as u64 + 1,
                token_offset: s * n,
                num_tokens: n,
                start_pos: 0,
                block_table_offset: s * blocks,
                block_table_len: blocks,
                is_prefill: true,
                sample: true,
                num_generated: 0,
                seed: 1,
                params: params.clone(),
                history: Default::default(),
                mask_slot: None,
                prompt_rows: None,
            })
            .collect(),
        ..ScheduledBatch::default()
    }
}

/// Multiply-adds per token of each product (the lm head runs on one row
/// per sequence, counted separately).
fn macs_per_token(cfg: &ModelConfig) -> [(Part, usize); 4] {
    let (h, i, l) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers);
    let qkv = h * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
    [
        (Part::Qkv, l * qkv),
        (Part::O, l * cfg.num_heads * cfg.head_dim * h),
        (Part::GateUp, l * 2 * h * i),
        (Part::Down, l * i * h),
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        return Err("usage: prefill_breakdown FILE.gguf [FILE.gguf …]".into());
    }
    let (seqs, context, rounds) = (env("SEQS", 8), env("CONTEXT", 128), env("ROUNDS", 5));
    let rows = seqs * context;
    for file in &files {
        let (model, _) = load_gguf(file.as_ref()).map_err(|e| format!("{file}: {e}"))?;
        let model = Arc::new(model);
        let blocks = context.div_ceil(BLOCK_SIZE);
        let kv = (seqs
            * blocks
            * BLOCK_SIZE
            * model
                .cfg
                .kv_bytes_per_token(inferscope_model::KvDtype::default())) as u64;
        let mut exec = executor(model.clone(), kv, BLOCK_SIZE)?;
        let batch = prefill(seqs, context, blocks);
        let mut out = StepOutput::default();
        let mut run = |exec: &mut CpuExecutor| -> Result<Duration, Box<dyn std::error::Error>> {
            let t = Instant::now();
            exec.execute(&batch, &mut out)?;
            Ok(t.elapsed())
        };
        run(&mut exec)?;
        let plain = median(
            (0..rounds)
                .map(|_| run(&mut exec).map(|d| d.as_secs_f64() * 1e3))
                .collect::<Result<_, _>>()?,
        );
        let (parts, total) = profile_parts(&mut exec, rounds, 1, run)?;
        let parts: Vec<f64> = parts.iter().map(|s| s * 1e3).collect();
        let total = total * 1e3;
        let macs = macs_per_token(&model.cfg);
        let lm_macs = seqs * model.cfg.hidden_size * model.cfg.vocab_size;
        let all_macs = rows * macs.iter().map(|m| m.1).sum::<usize>() + lm_macs;
        println!(
            "\n{file}: prefill of {seqs} × {context} tokens in one step: {plain:.1} ms median \
             ({:.1} GFLOP/s over the products); profiled {total:.1} ms",
            2.0 * all_macs as f64 / plain / 1e6,
        );
        println!("| part | ms | % of step | GMAC | GFLOP/s |\n|---|---|---|---|---|");
        for (part, ms) in Part::ALL.iter().zip(&parts) {
            let pct = 100.0 * ms / total;
            let m = match part {
                Part::LmHead => Some(lm_macs),
                _ => macs.iter().find(|m| m.0 == *part).map(|m| m.1 * rows),
            };
            match m {
                Some(m) => println!(
                    "| {} | {ms:.1} | {pct:.1} | {:.2} | {:.1} |",
                    part.label(),
                    m as f64 / 1e9,
                    2.0 * m as f64 / ms / 1e6,
                ),
                None => println!("| {} | {ms:.1} | {pct:.1} | | |", part.label()),
            }
        }
        let other = total - parts.iter().sum::<f64>();
        println!(
            "| outside the parts | {other:.1} | {:.1} | | |",
            100.0 * other / total
        );
    }
    Ok(())
}
