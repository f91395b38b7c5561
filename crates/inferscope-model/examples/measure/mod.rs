//! What the model crate's measurement examples share (`mod measure;` in
//! each; a directory without `main.rs`, so not an example itself).

// Each example uses a part of this module.
#![allow(dead_code)]

use std::error::Error;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferscope_engine::Executor;
use inferscope_model::llama::{LlamaModel, Part};
use inferscope_model::{CpuExecutor, KvBudget};
use rayon::prelude::*;

/// The environment variable `name` as a number, else `default`.
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Streaming read bandwidth in GB/s over 1 GiB (median of 5) on the
/// threads of `pool`, each task reading `streams` sequential streams side
/// by side (a product's panels are several streams: one stream per core
/// leaves memory-level parallelism unused).
pub fn read_bandwidth(pool: &rayon::ThreadPool, streams: usize) -> f64 {
    let data = vec![1u32; 256 << 20];
    let bytes = (data.len() * 4) as f64;
    // One task: `streams` equal parts of `c`, read in lockstep.
    let sum = |c: &[u32]| {
        let len = c.len() / streams;
        let parts: Vec<&[u32]> = c.chunks_exact(len).take(streams).collect();
        let mut acc = [0u32; 8];
        for i in (0..len).step_by(8) {
            for p in &parts {
                for (a, &x) in acc.iter_mut().zip(&p[i..i + 8]) {
                    *a = a.wrapping_add(x);
                }
            }
        }
        acc.iter().fold(0u32, |a, &x| a.wrapping_add(x))
    };
    let runs = (0..6)
        .map(|_| {
            let t = Instant::now();
            let s = pool.install(|| {
                data.par_chunks(1 << 20)
                    .map(sum)
                    .reduce(|| 0, u32::wrapping_add)
            });
            black_box(s);
            bytes / t.elapsed().as_secs_f64() / 1e9
        })
        .skip(1)
        .collect();
    median(runs)
}

/// A rayon pool of `threads` threads.
pub fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
}

/// A cpu executor of `model` with a KV pool of `kv_bytes` in blocks of
/// `block_size` tokens, on the global rayon pool.
pub fn executor(
    model: Arc<LlamaModel>,
    kv_bytes: u64,
    block_size: usize,
) -> Result<CpuExecutor, Box<dyn Error>> {
    let mut exec = CpuExecutor::new("cpu".into(), model, KvBudget::Bytes(kv_bytes), vec![], None)?;
    exec.init_kv_cache(block_size)?;
    Ok(exec)
}

/// With the executor's profile on, `rounds` rounds of `steps` steps each
/// through `run`: the median over the rounds of each part's seconds per
/// step (in [`Part::ALL`]'s order) and of the whole step's.
pub fn profile_parts(
    exec: &mut CpuExecutor,
    rounds: usize,
    steps: usize,
    mut run: impl FnMut(&mut CpuExecutor) -> Result<Duration, Box<dyn Error>>,
) -> Result<(Vec<f64>, f64), Box<dyn Error>> {
    let mut per_part = vec![Vec::new(); Part::ALL.len()];
    let mut totals = Vec::new();
    for _ in 0..rounds {
        exec.set_profile(true);
        let mut total = Duration::ZERO;
        for _ in 0..steps {
            total += run(exec)?;
        }
        let p = exec.profile().expect("profile on").clone();
        for (v, t) in per_part.iter_mut().zip(p.time) {
            v.push(t.as_secs_f64() / p.steps as f64);
        }
        totals.push(total.as_secs_f64() / steps as f64);
    }
    exec.set_profile(false);
    Ok((per_part.into_iter().map(median).collect(), median(totals)))
}
