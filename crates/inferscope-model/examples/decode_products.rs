//! The one-row (decode) products of the llama.cpp side by side's model, in
//! GB/s of stored weight bytes, per shape and storage type, on one thread
//! and on the pool, against the streaming read bandwidth:
//!
//! ```text
//! cargo run --release -p inferscope-model --example decode_products [-- ROWS]
//! ```
//!
//! Each product cycles over enough copies of its weight (≥ 160 MB) that
//! every call reads from DRAM, as a decode step does (a 2 MB `o` weight
//! called in a loop would be served from L3). `plain` is the register
//! tiles without the one-row kernel (the path before it), `new` what
//! `matmul_into` runs; they alternate per round. Knobs (environment):
//! `ROUNDS` (default 9), `DTYPES` (default `f32,f16,bf16`), `SHAPES`
//! (comma-separated names, default all).

use std::hint::black_box;
use std::time::Instant;

use inferscope_model::packed::{PackedWeight, WeightDtype};
use measure::{env, median, pool, read_bandwidth};

mod measure;

fn main() {
    let rows: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let rounds = env("ROUNDS", 9);
    let dtypes = std::env::var("DTYPES").unwrap_or_else(|_| "f32,f16,bf16".into());
    let pools: Vec<(usize, rayon::ThreadPool)> = [1, 2].into_iter().map(|n| (n, pool(n))).collect();
    for (n, pool) in &pools {
        for streams in [1, 8] {
            println!(
                "read bandwidth, {n} thread(s), {streams} stream(s) each: {:.1} GB/s",
                read_bandwidth(pool, streams)
            );
        }
    }
    let shapes = [
        ("qkv", 1280, 768),
        ("o", 768, 768),
        ("gate/up", 4096, 768),
        ("down", 768, 2048),
        ("lm_head", 32000, 768),
    ];
    println!("rows {rows}; GB/s of stored bytes and µs per product, median of {rounds} rounds");
    for dtype in dtypes.split(',') {
        let dtype = match dtype {
            "f32" => WeightDtype::F32,
            "f16" => WeightDtype::F16,
            "bf16" => WeightDtype::Bf16,
            other => panic!("unknown dtype {other}"),
        };
        let only = std::env::var("SHAPES").unwrap_or_default();
        for (name, out, inp) in shapes {
            if !only.is_empty() && !only.split(',').any(|o| o == name) {
                continue;
            }
            let w: Vec<f32> = (0..out * inp)
                .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
                .collect();
            let one = PackedWeight::pack_as(&w, out, inp, dtype);
            let bytes = one.size_bytes();
            let copies = (160usize << 20).div_ceil(bytes).max(2);
            let ws: Vec<PackedWeight> = (0..copies).map(|_| one.clone()).collect();
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                .collect();
            let mut y = Vec::new();
            for (n, pool) in &pools {
                let variants = ["plain", "new"];
                let mut times = vec![Vec::new(); variants.len()];
                pool.install(|| {
                    for _ in 0..rounds {
                        for (v, t) in variants.iter().zip(times.iter_mut()) {
                            let t0 = Instant::now();
                            for w in &ws {
                                if *v == "plain" {
                                    w.matmul_plain_into(black_box(&x), rows, &mut y);
                                } else {
                                    w.matmul_into(black_box(&x), rows, &mut y);
                                }
                            }
                            t.push(t0.elapsed().as_secs_f64() / copies as f64);
                        }
                    }
                });
                let line: Vec<String> = variants
                    .iter()
                    .zip(times)
                    .map(|(v, t)| {
                        let m = median(t);
                        format!("{v} {:5.1} GB/s {:7.1} µs", bytes as f64 / m / 1e9, m * 1e6)
                    })
                    .collect();
                println!(
                    "{dtype:?} {name:8} {n}t ({:.2} MB): {}",
                    bytes as f64 / 1e6,
                    line.join(" | ")
                );
            }
        }
    }
}
