//! Resident memory of the cpu executor for a GGUF file: after load, and
//! after a prompt of N tokens (prefill in chunks of 256, then 16 decodes)
//! with a KV pool sized for it, in the given `--kv-cache-dtype`.
//!
//! `cargo run --release -p inferscope-model --example gguf_rss -- FILE.gguf [TOKENS] [KV_DTYPE]`

use std::time::Instant;

use inferscope_engine::{Executor, SamplingParams, ScheduledBatch, ScheduledSeq, StepOutput};
use inferscope_model::{CpuExecutor, KvBudget, KvDtype, LoadedModel, ModelOptions};

/// `VmRSS`, `RssAnon` and `RssFile` of this process, in MiB.
fn rss() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    format!(
        "VmRSS {:.0} MiB (anon {:.0}, file {:.0})",
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssFile:")
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: gguf_rss FILE.gguf [TOKENS] [KV_DTYPE]")?;
    let tokens: usize = args.get(2).map_or(Ok(2048), |s| s.parse())?;
    let kv = KvDtype::parse(args.get(3).map_or("auto", String::as_str))?;
    const BS: usize = 16;
    let blocks = (tokens + 16).div_ceil(BS);
    println!("start: {}", rss());
    let t = Instant::now();
    let m = LoadedModel::load(path, &ModelOptions::default())?;
    println!("loaded in {:.2}s: {}", t.elapsed().as_secs_f64(), rss());
    let per_token = m.model().cfg.kv_bytes_per_token(kv);
    let budget = KvBudget::Bytes((blocks * BS * per_token) as u64);
    let mut e =
        CpuExecutor::new("cpu".into(), m.model().clone(), budget, vec![], None)?.with_kv_dtype(kv);
    let n = e.init_kv_cache(BS)?;
    println!("KV pool: {n} blocks of {BS} tokens, {kv:?}: {}", rss());
    let params = std::sync::Arc::new(SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    });
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut out = StepOutput::default();
    let vocab = m.model().cfg.vocab_size as u32;
    let mut pos = 0;
    let t = Instant::now();
    while pos < tokens + 16 {
        let chunk = if pos < tokens {
            (tokens - pos).min(256)
        } else {
            1
        };
        let batch = ScheduledBatch {
            block_size: BS,
            token_ids: (pos..pos + chunk)
                .map(|i| 3 + (i as u32 * 7919) % (vocab - 3))
                .collect(),
            block_tables: table.clone(),
            seqs: vec![ScheduledSeq {
                seq_id: 1,
                token_offset: 0,
                num_tokens: chunk,
                start_pos: pos,
                block_table_offset: 0,
                block_table_len: table.len(),
                is_prefill: pos < tokens,
                sample: pos + chunk >= tokens,
                num_generated: pos.saturating_sub(tokens),
                seed: 1,
                params: params.clone(),
                history: Default::default(),
                mask_slot: None,
                prompt_rows: None,
            }],
            ..ScheduledBatch::default()
        };
        e.execute(&batch, &mut out)?;
        pos += chunk;
    }
    println!(
        "after a {tokens}-token prompt and 16 decodes ({:.1}s): {}",
        t.elapsed().as_secs_f64(),
        rss()
    );
    Ok(())
}
