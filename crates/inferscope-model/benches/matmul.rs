//! The products of a decode step, `y = x Wᵀ`: the packed-panel kernel
//! against candle's matmul (the `gemm` crate) on the same matrices, at the
//! row counts of decode (1, 4, 32) and of a prefill chunk (256); and GGUF
//! Q8_0 weights, the packed Q8_0 kernel against candle's `QMatMul`, at rows
//! 1, 8 and 128; likewise GGUF Q4_K and Q6_K weights with the packed
//! K-quant kernels (`matmul-q4k`, `matmul-q6k`); and the packed kernel with
//! f32, f16 and bf16 storage at the same shapes and rows (`matmul-f16`);
//! every packed quantized format, IQ4_XS too, on a 125M Llama's shapes
//! (`matmul-qshapes`).
//! Run: `cargo bench -p inferscope-model --bench matmul` (`-- matmul-q8`,
//! `-- 'matmul-q[46]k'` or `-- matmul-f16` for those groups only).

use std::hint::black_box;
use std::time::Duration;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use inferscope_model::packed::{PackedWeight, WeightDtype};
use inferscope_model::packed_kquant::{KQuant, PackedKQuant};
use inferscope_model::packed_q8::PackedQ8;

/// A deterministic `[out][in]` weight matrix in [-0.5, 0.5].
fn weights(out: usize, inp: usize) -> Vec<f32> {
    (0..out * inp)
        .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
        .collect()
}

/// A benchmark group with the sampling every group here uses but the
/// prefill one (20 samples, 0.5 s warm-up, 2 s measured).
fn group(c: &mut Criterion, name: String) -> BenchmarkGroup<'_, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g
}

fn matmul(c: &mut Criterion) {
    // (name, out, in): the demo model's fused q/k/v, gate/up and down, and
    // the generated 110M model's gate/up.
    let shapes = [
        ("demo-qkv", 512, 256),
        ("demo-gate-up", 1376, 256),
        ("demo-down", 256, 688),
        ("110m-gate-up", 4096, 768),
    ];
    for (name, out, inp) in shapes {
        let w = weights(out, inp);
        let packed = PackedWeight::pack(&w, out, inp);
        let wt = Tensor::from_slice(&w, (out, inp), &Device::Cpu).expect("tensor");
        let mut g = group(c, format!("matmul/{name}"));
        for rows in [1usize, 4, 32, 256] {
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                .collect();
            g.throughput(Throughput::Elements((rows * out * inp) as u64));
            g.bench_function(BenchmarkId::new("packed", rows), |b| {
                b.iter(|| packed.matmul(black_box(&x), rows))
            });
            g.bench_function(BenchmarkId::new("candle", rows), |b| {
                b.iter(|| {
                    let xt =
                        Tensor::from_slice(black_box(&x), (rows, inp), &Device::Cpu).expect("x");
                    xt.matmul(&wt.t().expect("t"))
                        .expect("mm")
                        .flatten_all()
                        .expect("f")
                        .to_vec1::<f32>()
                        .expect("v")
                })
            });
        }
        g.finish();
    }
}

/// A packed quantized weight the benchmark runs.
trait QuantProduct {
    fn product(&self, x: &[f32], rows: usize) -> Vec<f32>;
}

impl QuantProduct for PackedQ8 {
    fn product(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul(x, rows)
    }
}

impl QuantProduct for PackedKQuant {
    fn product(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul(x, rows)
    }
}

/// candle's `QMatMul` against the packed kernel on the same `dtype` blocks,
/// in one group per shape named `{prefix}/{shape}`.
fn quant_groups<P: QuantProduct>(
    c: &mut Criterion,
    prefix: &str,
    dtype: GgmlDType,
    pack: impl Fn(&[u8], usize, usize) -> P,
) {
    // (name, out, in): an 88M Llama's (hidden 768, MLP 2048) o projection
    // and gate (or up).
    let shapes = [("768x768", 768, 768), ("2048x768", 2048, 768)];
    for (name, out, inp) in shapes {
        let w = weights(out, inp);
        let wt = Tensor::from_slice(&w, (out, inp), &Device::Cpu).expect("tensor");
        let q = QTensor::quantize(&wt, dtype).expect("quantize");
        let packed = pack(&q.data().expect("data"), out, inp);
        let qmm = QMatMul::from_qtensor(q).expect("qmatmul");
        let mut g = group(c, format!("{prefix}/{name}"));
        for rows in [1usize, 8, 128] {
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                .collect();
            g.throughput(Throughput::Elements((rows * out * inp) as u64));
            g.bench_function(BenchmarkId::new("packed", rows), |b| {
                b.iter(|| packed.product(black_box(&x), rows))
            });
            g.bench_function(BenchmarkId::new("candle", rows), |b| {
                b.iter(|| {
                    let xt =
                        Tensor::from_slice(black_box(&x), (rows, inp), &Device::Cpu).expect("x");
                    qmm.forward(&xt)
                        .expect("mm")
                        .flatten_all()
                        .expect("f")
                        .to_vec1::<f32>()
                        .expect("v")
                })
            });
        }
        g.finish();
    }
}

fn matmul_q8(c: &mut Criterion) {
    quant_groups(c, "matmul-q8", GgmlDType::Q8_0, |b, out, inp| {
        PackedQ8::from_blocks(b, out, inp).expect("pack")
    });
}

fn matmul_kquant(c: &mut Criterion) {
    for (prefix, dtype, kind) in [
        ("matmul-q4k", GgmlDType::Q4K, KQuant::Q4K),
        ("matmul-q6k", GgmlDType::Q6K, KQuant::Q6K),
    ] {
        quant_groups(c, prefix, dtype, |b, out, inp| {
            PackedKQuant::from_blocks(kind, b, out, inp).expect("pack")
        });
    }
}

fn matmul_f16(c: &mut Criterion) {
    // The same shapes with the weights stored as f32, f16 (GGUF F16, kept
    // 16-bit) and bf16: half the bytes to read, widened in registers.
    let shapes = [("768x768", 768, 768), ("2048x768", 2048, 768)];
    for (name, out, inp) in shapes {
        let w = weights(out, inp);
        let mut g = group(c, format!("matmul-f16/{name}"));
        for rows in [1usize, 8, 128] {
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                .collect();
            g.throughput(Throughput::Elements((rows * out * inp) as u64));
            for (label, dtype) in [
                ("f32", WeightDtype::F32),
                ("f16", WeightDtype::F16),
                ("bf16", WeightDtype::Bf16),
            ] {
                let packed = PackedWeight::pack_as(&w, out, inp, dtype);
                g.bench_function(BenchmarkId::new(label, rows), |b| {
                    b.iter(|| packed.matmul(black_box(&x), rows))
                });
            }
        }
        g.finish();
    }
}

/// K-quant products three ways in one run (`-- matmul-kint`): the f32
/// rebuild of each weight (`rebuild`), the integer dot products with Q8_K
/// activations (`int`), and candle's `QMatMul` (Q8_K activations too).
fn matmul_kquant_int(c: &mut Criterion) {
    for (prefix, dtype, kind) in [
        ("matmul-kint-q4k", GgmlDType::Q4K, KQuant::Q4K),
        ("matmul-kint-q6k", GgmlDType::Q6K, KQuant::Q6K),
    ] {
        for (name, out, inp) in [("768x768", 768, 768), ("2048x768", 2048, 768)] {
            let w = weights(out, inp);
            let wt = Tensor::from_slice(&w, (out, inp), &Device::Cpu).expect("tensor");
            let q = QTensor::quantize(&wt, dtype).expect("quantize");
            let data = q.data().expect("data").into_owned();
            let int = PackedKQuant::from_blocks(kind, &data, out, inp).expect("pack");
            let rebuild = PackedKQuant::from_blocks_rebuild(kind, &data, out, inp).expect("pack");
            let qmm = QMatMul::from_qtensor(q).expect("qmatmul");
            let mut g = group(c, format!("{prefix}/{name}"));
            for rows in [1usize, 8, 128] {
                let x: Vec<f32> = (0..rows * inp)
                    .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                    .collect();
                g.throughput(Throughput::Elements((rows * out * inp) as u64));
                let mut y = Vec::new();
                g.bench_function(BenchmarkId::new("rebuild", rows), |b| {
                    b.iter(|| rebuild.matmul_into(black_box(&x), rows, &mut y))
                });
                g.bench_function(BenchmarkId::new("int", rows), |b| {
                    b.iter(|| int.matmul_into(black_box(&x), rows, &mut y))
                });
                g.bench_function(BenchmarkId::new("candle", rows), |b| {
                    b.iter(|| {
                        let xt = Tensor::from_slice(black_box(&x), (rows, inp), &Device::Cpu)
                            .expect("x");
                        qmm.forward(&xt).expect("mm")
                    })
                });
            }
            g.finish();
        }
    }
}

fn matmul_prefill(c: &mut Criterion) {
    // The 125M Llama of the llama.cpp side by side (hidden 768, 4 KV heads
    // of 64, MLP 2048): fused q/k/v, o, fused gate/up, down, f32 and f16
    // weights, at a 128-token prefill (the blocked path, and `plain`: the
    // register tiles without it) and at decode's 1 and 8 rows. `cpu1`: one
    // thread, timed by its own on-CPU time (/proc/thread-self/schedstat),
    // which other processes on a loaded machine disturb far less than the
    // wall clock of a 2-thread run.
    let shapes = [
        ("qkv-1280x768", 1280, 768),
        ("o-768x768", 768, 768),
        ("gate-up-4096x768", 4096, 768),
        ("down-768x2048", 768, 2048),
    ];
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .use_current_thread()
        .build()
        .expect("pool");
    for (name, out, inp) in shapes {
        let w = weights(out, inp);
        let mut g = c.benchmark_group(format!("matmul-prefill/{name}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        for rows in [1usize, 8, 128] {
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                .collect();
            g.throughput(Throughput::Elements((rows * out * inp) as u64));
            for (label, dtype) in [("f32", WeightDtype::F32), ("f16", WeightDtype::F16)] {
                let packed = PackedWeight::pack_as(&w, out, inp, dtype);
                let mut y = Vec::new();
                g.bench_function(BenchmarkId::new(label, rows), |b| {
                    b.iter(|| packed.matmul_into(black_box(&x), rows, &mut y))
                });
                if rows < 128 {
                    continue;
                }
                g.bench_function(BenchmarkId::new(format!("{label}-plain"), rows), |b| {
                    b.iter(|| packed.matmul_plain_into(black_box(&x), rows, &mut y))
                });
                for plain in [false, true] {
                    let id = format!("{label}{}-cpu1", if plain { "-plain" } else { "" });
                    g.bench_function(BenchmarkId::new(id, rows), |b| {
                        b.iter_custom(|iters| {
                            one.install(|| {
                                let t0 = thread_cpu_ns();
                                for _ in 0..iters {
                                    if plain {
                                        packed.matmul_plain_into(black_box(&x), rows, &mut y);
                                    } else {
                                        packed.matmul_into(black_box(&x), rows, &mut y);
                                    }
                                }
                                Duration::from_nanos(thread_cpu_ns() - t0)
                            })
                        })
                    });
                }
            }
        }
        g.finish();
    }
}

/// Nanoseconds this thread has run on a CPU (Linux schedstat's first field).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("/proc/thread-self/schedstat")
}

/// The integer products of every quantized format on the 125M Llama's
/// shapes (`-- matmul-qshapes`): `o` 768×768, fused gate/up 768→4096, down
/// 2048→768 at 1, 8 and 128 rows (decode, batched decode, prefill), and the
/// LM head 768→32000 at 1 and 8; throughput in multiply-adds per second.
fn matmul_quant_shapes(c: &mut Criterion) {
    let shapes = [
        ("o-768x768", 768, 768),
        ("gate-up-4096x768", 4096, 768),
        ("down-768x2048", 768, 2048),
        ("head-32000x768", 32000, 768),
    ];
    // IQ4_XS: candle has no quantizer for it; random blocks cost the same.
    for (fmt, dtype) in [
        ("q8_0", Some(GgmlDType::Q8_0)),
        ("q4k", Some(GgmlDType::Q4K)),
        ("q6k", Some(GgmlDType::Q6K)),
        ("iq4_xs", None),
    ] {
        for (name, out, inp) in shapes {
            let Some(dtype) = dtype else {
                let data = iq4_xs_blocks(out, inp);
                let p = PackedKQuant::from_blocks(KQuant::Iq4Xs, &data, out, inp).expect("pack");
                bench_rows(c, fmt, name, (out, inp), &move |x, rows, y| {
                    p.matmul_into(x, rows, y)
                });
                continue;
            };
            let w = weights(out, inp);
            let wt = Tensor::from_slice(&w, (out, inp), &Device::Cpu).expect("tensor");
            let q = QTensor::quantize(&wt, dtype).expect("quantize");
            let data = q.data().expect("data").into_owned();
            let packed: Box<Product> = match dtype {
                GgmlDType::Q8_0 => {
                    let p = PackedQ8::from_blocks(&data, out, inp).expect("pack");
                    Box::new(move |x, rows, y| p.matmul_into(x, rows, y))
                }
                _ => {
                    let kind = if dtype == GgmlDType::Q4K {
                        KQuant::Q4K
                    } else {
                        KQuant::Q6K
                    };
                    let p = PackedKQuant::from_blocks(kind, &data, out, inp).expect("pack");
                    Box::new(move |x, rows, y| p.matmul_into(x, rows, y))
                }
            };
            bench_rows(c, fmt, name, (out, inp), &packed);
        }
    }
}

/// One packed weight's `matmul_into`.
type Product = dyn Fn(&[f32], usize, &mut Vec<f32>);

/// `matmul-qshapes/{fmt}/{name}`: `packed` at the rows of decode, batched
/// decode and (but for the head) prefill.
fn bench_rows(
    c: &mut Criterion,
    fmt: &str,
    name: &str,
    (out, inp): (usize, usize),
    packed: &Product,
) {
    let mut g = group(c, format!("matmul-qshapes/{fmt}/{name}"));
    let rows_list: &[usize] = if out > 4096 { &[1, 8] } else { &[1, 8, 128] };
    for &rows in rows_list {
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
            .collect();
        g.throughput(Throughput::Elements((rows * out * inp) as u64));
        let mut y = Vec::new();
        g.bench_function(BenchmarkId::new("int", rows), |b| {
            b.iter(|| packed(black_box(&x), rows, &mut y))
        });
    }
    g.finish();
}

/// `[out][inp]` of IQ4_XS super-blocks: pseudo-random indices and scales,
/// scales `d` of 10⁻³.
fn iq4_xs_blocks(out: usize, inp: usize) -> Vec<u8> {
    let bb = KQuant::Iq4Xs.block_bytes();
    let mut data: Vec<u8> = (0..out * inp / 256 * bb)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    for blk in data.chunks_exact_mut(bb) {
        blk[..2].copy_from_slice(&half::f16::from_f32(1e-3).to_le_bytes());
    }
    data
}

/// The products of a decode step of the 125M Llama of the llama.cpp side by
/// side: fused q/k/v, o, fused gate/up, down, LM head (`[out][in]`).
const DECODE_SHAPES: [(&str, usize, usize); 5] = [
    ("qkv-1280x768", 1280, 768),
    ("o-768x768", 768, 768),
    ("gate-up-4096x768", 4096, 768),
    ("down-768x2048", 768, 2048),
    ("head-32000x768", 32000, 768),
];

/// The one-row (decode) products of the 125M Llama with f32, f16 and bf16
/// weights (`-- matmul-row`): the one-row kernel (`row`) against the plain
/// 1-row tile (`plain`), throughput in stored weight bytes per second. Each
/// iteration takes the next of enough copies of the weight (≥ 160 MB) that
/// it reads from DRAM as a decode step does, not from L3.
fn matmul_decode_row(c: &mut Criterion) {
    for (name, out, inp) in DECODE_SHAPES {
        let w = weights(out, inp);
        let x: Vec<f32> = (0..inp)
            .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
            .collect();
        let mut g = group(c, format!("matmul-row/{name}"));
        for (label, dtype) in [
            ("f32", WeightDtype::F32),
            ("f16", WeightDtype::F16),
            ("bf16", WeightDtype::Bf16),
        ] {
            let one = PackedWeight::pack_as(&w, out, inp, dtype);
            let bytes = one.size_bytes();
            let copies = (160usize << 20).div_ceil(bytes).max(2);
            let ws: Vec<PackedWeight> = (0..copies).map(|_| one.clone()).collect();
            g.throughput(Throughput::Bytes(bytes as u64));
            let mut y = Vec::new();
            for plain in [true, false] {
                let id = format!("{label}-{}", if plain { "plain" } else { "row" });
                let mut i = 0;
                g.bench_function(BenchmarkId::new(id, 1), |b| {
                    b.iter(|| {
                        i = (i + 1) % copies;
                        if plain {
                            ws[i].matmul_plain_into(black_box(&x), 1, &mut y)
                        } else {
                            ws[i].matmul_into(black_box(&x), 1, &mut y)
                        }
                    })
                });
            }
        }
        g.finish();
    }
}

/// The Q8_0 products of a decode step at the memory roofline
/// (`-- matmul-q8dec`): each shape of the 125M Llama (fused q/k/v, o, fused
/// gate/up, down, LM head) at 1, 8 and 128 rows on one thread and on two,
/// cycling through enough copies of the weight (≥ 96 MiB, three times the
/// L3) that every product reads its weights from DRAM, as a decode step
/// does; throughput in stored bytes (weights and scales) per second. The
/// one-row F32 product on the same shapes and copies (`f32/1`) is the rate
/// the memory gives a kernel that does little per byte.
fn matmul_q8_decode(c: &mut Criterion) {
    const COLD_BYTES: usize = 96 << 20;
    let pools: Vec<(usize, rayon::ThreadPool)> = [1, 2]
        .into_iter()
        .map(|n| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("pool");
            (n, pool)
        })
        .collect();
    for (name, out, inp) in DECODE_SHAPES {
        let w = weights(out, inp);
        let wt = Tensor::from_slice(&w, (out, inp), &Device::Cpu).expect("tensor");
        let q = QTensor::quantize(&wt, GgmlDType::Q8_0).expect("quantize");
        let data = q.data().expect("data").into_owned();
        let one = PackedQ8::from_blocks(&data, out, inp).expect("pack");
        let bytes = one.size_bytes();
        let copies: Vec<PackedQ8> = (0..COLD_BYTES.div_ceil(bytes).max(2))
            .map(|_| one.clone())
            .collect();
        let mut g = group(c, format!("matmul-q8dec/{name}"));
        g.throughput(Throughput::Bytes(bytes as u64));
        for rows in [1usize, 8, 128] {
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                .collect();
            for (threads, pool) in &pools {
                let mut y = Vec::new();
                let mut i = 0;
                let id = BenchmarkId::new(format!("q8_0-{threads}t"), rows);
                g.bench_function(id, |b| {
                    b.iter(|| {
                        i = (i + 1) % copies.len();
                        pool.install(|| copies[i].matmul_into(black_box(&x), rows, &mut y))
                    })
                });
            }
        }
        // F32 at one row, the same cycling: bytes are 4 per weight.
        let f = PackedWeight::pack(&w, out, inp);
        let f_copies: Vec<PackedWeight> = (0..COLD_BYTES.div_ceil(4 * out * inp).max(2))
            .map(|_| f.clone())
            .collect();
        g.throughput(Throughput::Bytes((4 * out * inp) as u64));
        let x: Vec<f32> = (0..inp)
            .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
            .collect();
        for (threads, pool) in &pools {
            let mut i = 0;
            g.bench_function(BenchmarkId::new(format!("f32-{threads}t"), 1), |b| {
                b.iter(|| {
                    i = (i + 1) % f_copies.len();
                    pool.install(|| f_copies[i].matmul(black_box(&x), 1))
                })
            });
        }
        g.finish();
    }
}

criterion_group!(
    benches,
    matmul,
    matmul_q8,
    matmul_kquant,
    matmul_f16,
    matmul_kquant_int,
    matmul_prefill,
    matmul_quant_shapes,
    matmul_decode_row,
    matmul_q8_decode,
);
criterion_main!(benches);
