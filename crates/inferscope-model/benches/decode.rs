//! Decode throughput of the cpu executor (demo model and a generated ~110M
//! Llama) at batch 1 and 32, next to `candle-transformers`' Llama at batch 1
//! on the same weights (and with bf16 and f16 weight storage); decode over
//! a long context with an f16 KV cache against an f32 one
//! (`decode_kv/...`); a JSON schema on every sequence against free text
//! (`structured_decode/...`); plus the machine's streaming read bandwidth for
//! the roofline estimate. Run: `cargo bench -p inferscope-model --bench decode`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use inferscope_engine::structured::{Advance, GrammarWorker, SeqGrammar};
use inferscope_engine::{
    Executor, GrammarCompiler, SamplingParams, ScheduledBatch, ScheduledSeq, StepOutput,
    StructuredOutput,
};
use inferscope_model::config::ModelConfig;
use inferscope_model::demo::{demo_config, random_weights, trained_demo_model};
use inferscope_model::llama::LlamaModel;
use inferscope_model::loader::model_from_tensors;
use inferscope_model::packed::WeightDtype;
use inferscope_model::{CpuExecutor, KvBudget, KvDtype, Tokenizer};
use rayon::prelude::*;

/// Tokens already in the cache when the measured decode step runs.
const CONTEXT: usize = 64;
const BLOCK_SIZE: usize = 16;

fn model_100m() -> ModelConfig {
    ModelConfig {
        architecture: "LlamaForCausalLM".into(),
        vocab_size: 32_000,
        hidden_size: 768,
        intermediate_size: 2048,
        num_layers: 10,
        num_heads: 12,
        num_kv_heads: 4,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_interleaved: false,
        max_position_embeddings: 2048,
        tie_word_embeddings: false,
        attention_bias: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        sliding_window: None,
        arch: Default::default(),
    }
}

/// One decode step of `batch` sequences, each at position `CONTEXT`. The
/// step rewrites the same KV slot every iteration, so the context stays fixed.
fn decode_batch(batch: usize) -> ScheduledBatch {
    decode_batch_at(batch, CONTEXT)
}

/// [`decode_batch`] at position `context`, greedy.
fn decode_batch_at(batch: usize, context: usize) -> ScheduledBatch {
    let params = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    decode_batch_with(batch, context, params)
}

/// [`decode_batch`] at position `context`, sampled with `params`.
fn decode_batch_with(batch: usize, context: usize, params: SamplingParams) -> ScheduledBatch {
    let blocks_per_seq = (context + 1).div_ceil(BLOCK_SIZE);
    let params = Arc::new(params);
    let mut b = ScheduledBatch {
        block_size: BLOCK_SIZE,
        ..ScheduledBatch::default()
    };
    for i in 0..batch {
        b.seqs.push(ScheduledSeq {
            seq_id: i as u64,
            token_offset: i,
            num_tokens: 1,
            start_pos: context,
            block_table_offset: i * blocks_per_seq,
            block_table_len: blocks_per_seq,
            is_prefill: false,
            sample: true,
            num_generated: 1,
            seed: i as u64,
            params: params.clone(),
            history: Default::default(),
            mask_slot: None,
            prompt_rows: None,
        });
        b.token_ids.push((i * 7 + 3) as u32 % 200);
        b.block_tables
            .extend((0..blocks_per_seq).map(|k| (i * blocks_per_seq + k) as u32));
    }
    b
}

/// The executor for `cfg` with dense weights stored as `dtype` and an f32
/// KV cache (as the reference's), room for 64 sequences of `CONTEXT`.
fn executor(name: &str, cfg: &ModelConfig, weights: &Weights, dtype: WeightDtype) -> CpuExecutor {
    let model = model_from_tensors(cfg.clone(), weights.clone()).expect("model");
    let model = Arc::new(model.with_weight_dtype(dtype));
    kv_executor(name, model, KvDtype::F32, 64, CONTEXT)
}

/// An executor over `model` with a KV cache of `kv`, room for `seqs`
/// sequences of `context` tokens.
fn kv_executor(
    name: &str,
    model: Arc<LlamaModel>,
    kv: KvDtype,
    seqs: usize,
    context: usize,
) -> CpuExecutor {
    let per_token = model.cfg.kv_bytes_per_token(kv);
    let mut exec = CpuExecutor::new(
        format!("cpu:{name}"),
        model,
        KvBudget::Bytes((seqs * (context + BLOCK_SIZE) * per_token) as u64),
        vec![2],
        None,
    )
    .expect("executor")
    .with_kv_dtype(kv);
    exec.init_kv_cache(BLOCK_SIZE).expect("kv");
    exec
}

type Weights = std::collections::HashMap<String, Tensor>;

fn bench_model(c: &mut Criterion, name: &str, cfg: &ModelConfig) {
    let weights = random_weights(cfg, 7).expect("weights");
    let mut exec = executor(name, cfg, &weights, WeightDtype::F32);
    let mut g = c.benchmark_group(format!("decode/{name}"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let mut out = StepOutput::default();
    let b1 = decode_batch(1);
    let mut ours = || exec.execute(black_box(&b1), &mut out).expect("step");

    // The reference, its cache filled with CONTEXT tokens; each measured
    // step starts from a clone of that cache (cheap: tensors are shared).
    let c2: llama::LlamaConfig = serde_json::from_str(&cfg.to_hf_json()).expect("config");
    let c2 = c2.into_config(false);
    let vb = VarBuilder::from_tensors(weights.clone(), DType::F32, &Device::Cpu);
    let m = llama::Llama::load(vb, &c2).expect("reference model");
    let mut cache = llama::Cache::new(true, DType::F32, &c2, &Device::Cpu).expect("cache");
    let prompt: Vec<u32> = (0..CONTEXT as u32).map(|i| i % 200).collect();
    let input = Tensor::new(prompt.as_slice(), &Device::Cpu)
        .and_then(|t| t.unsqueeze(0))
        .expect("input");
    m.forward(&input, 0, &mut cache).expect("prefill");
    let next = Tensor::new(&[[5u32]], &Device::Cpu).expect("token");
    let theirs = || {
        let mut cache = cache.clone();
        let logits = m.forward(&next, CONTEXT, &mut cache).expect("step");
        // The same greedy pick as the executor's sampler.
        black_box(logits.argmax(1).expect("argmax"));
    };

    // Batch 1, ours and the reference measured alternately (A/B
    // interleaving), so that load from other processes hits both alike.
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("inferscope", 1), |bench| {
        bench.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                ours();
                t += start.elapsed();
                theirs();
            }
            t
        })
    });
    g.bench_function(BenchmarkId::new("candle-transformers", 1), |bench| {
        bench.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                ours();
                let start = Instant::now();
                theirs();
                t += start.elapsed();
            }
            t
        })
    });

    let b32 = decode_batch(32);
    g.throughput(Throughput::Elements(32));
    g.bench_function(BenchmarkId::new("inferscope", 32), |bench| {
        bench.iter(|| exec.execute(black_box(&b32), &mut out).expect("step"))
    });
    drop(exec);

    // The same model with bf16 weights (`--dtype bfloat16`) and with f16
    // weights (how a GGUF F16 file is kept): half the bytes per decode step.
    for (label, dtype) in [
        ("inferscope-bf16", WeightDtype::Bf16),
        ("inferscope-f16", WeightDtype::F16),
    ] {
        let mut exec = executor(name, cfg, &weights, dtype);
        for (batch, b) in [(1, &b1), (32, &b32)] {
            g.throughput(Throughput::Elements(batch));
            g.bench_function(BenchmarkId::new(label, batch), |bench| {
                bench.iter(|| exec.execute(black_box(b), &mut out).expect("step"))
            });
        }
    }
    g.finish();
}

/// Decode with an f16 KV cache against an f32 one (`--kv-cache-dtype`), at
/// batch 1 and 8 over a `context`-token context, measured alternately
/// (A/B interleaving) so that load from other processes hits both alike.
/// The caches are filled with random K/V (a prefill's worth of writes,
/// without its cost): untouched zero pages would read as the one shared
/// zero page, from cache.
fn bench_kv_dtype(c: &mut Criterion, name: &str, cfg: &ModelConfig, context: usize) {
    let weights = random_weights(cfg, 7).expect("weights");
    let model = Arc::new(model_from_tensors(cfg.clone(), weights).expect("model"));
    let mut g = c.benchmark_group(format!("decode_kv/{name}/ctx{context}"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for batch in [1usize, 8] {
        let mut execs = [KvDtype::F32, KvDtype::F16].map(|kv| {
            let mut e = kv_executor(name, model.clone(), kv, batch, context);
            e.fill_kv_cache(11).expect("fill");
            e
        });
        let step = decode_batch_at(batch, context);
        let mut out = StepOutput::default();
        g.throughput(Throughput::Elements(batch as u64));
        for (i, label) in ["kv-f32", "kv-f16"].into_iter().enumerate() {
            g.bench_function(BenchmarkId::new(label, batch), |bench| {
                bench.iter_custom(|iters| {
                    let mut t = Duration::ZERO;
                    for _ in 0..iters {
                        for (j, e) in execs.iter_mut().enumerate() {
                            let start = Instant::now();
                            e.execute(black_box(&step), &mut out).expect("step");
                            if j == i {
                                t += start.elapsed();
                            }
                        }
                    }
                    t
                })
            });
        }
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    bench_model(c, "demo", &demo_config());
    bench_model(c, "llama-110m", &model_100m());
    bench_kv_dtype(c, "demo", &demo_config(), 2048);
    bench_kv_dtype(c, "llama-110m", &model_100m(), 1024);
}

/// Streaming read of 1 GiB (beyond the L3 cache) on all cores: what decode at batch 1 is bound by.
fn memory_bandwidth(c: &mut Criterion) {
    let data = vec![1u32; 256 << 20];
    let mut g = c.benchmark_group("memory");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Bytes((data.len() * 4) as u64));
    g.bench_function("read_bandwidth", |b| {
        b.iter(|| {
            data.par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u32, |a, &x| a.wrapping_add(x)))
                .reduce(|| 0, u32::wrapping_add)
        })
    });
    g.finish();
}

/// Sections a demo step synchronises at: 4 layers × (q/k/v, attention, o,
/// gate/up, down) and the LM head.
const SECTIONS: usize = 21;

/// What synchronising costs, apart from the work: `SECTIONS` empty
/// fork/joins on the rayon pool as a step does them today (from inside the
/// pool, 16 tasks each), against one region per step where every thread
/// crosses `SECTIONS` barriers (spinning, then yielding), and a bare
/// `rayon::scope` (the one wake-up per step either way).
fn sync(c: &mut Criterion) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut g = c.benchmark_group("sync");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g.bench_function("rayon-scope", |b| b.iter(|| rayon::scope(|_| {})));
    g.bench_function(BenchmarkId::new("fork-join-sections", SECTIONS), |b| {
        b.iter(|| {
            rayon::scope(|_| {
                for _ in 0..SECTIONS {
                    (0..16usize).into_par_iter().for_each(|i| {
                        black_box(i);
                    });
                }
            })
        })
    });
    g.bench_function(BenchmarkId::new("one-region-barriers", SECTIONS), |b| {
        let threads = rayon::current_num_threads();
        b.iter(|| {
            // A sense-reversing barrier: the last thread to arrive bumps
            // the generation the others spin (then yield) on.
            let (arrived, generation) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let wait = || {
                let gen0 = generation.load(Ordering::Acquire);
                if arrived.fetch_add(1, Ordering::AcqRel) + 1 == threads {
                    arrived.store(0, Ordering::Relaxed);
                    generation.fetch_add(1, Ordering::Release);
                } else {
                    let mut spins = 0u32;
                    while generation.load(Ordering::Acquire) == gen0 {
                        spins += 1;
                        if spins < 2000 {
                            std::hint::spin_loop();
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }
            };
            rayon::broadcast(|_| {
                for i in 0..SECTIONS {
                    black_box(i);
                    wait();
                }
            });
        })
    });
    g.finish();
}

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "traits": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
            "married": {"type": "boolean"}
        },
        "required": ["name", "age", "traits", "married"],
        "additionalProperties": false
    })
}

/// What structured outputs cost a decode step: the trained demo model at
/// batch 1 and 32, free text against a JSON schema on every sequence. The
/// constrained step does what the engine does: the grammar thread computes
/// the masks while the forward pass runs, the executor applies them before
/// sampling, and each matcher is advanced with its token (restarted when its
/// object is complete).
fn structured_decode(c: &mut Criterion) {
    let (model, tokenizer) = trained_demo_model().expect("demo model");
    let cfg = model.cfg.clone();
    let eos = tokenizer.eos_token_ids();
    let mut exec = CpuExecutor::new(
        "cpu:demo".into(),
        Arc::new(model),
        KvBudget::Bytes(
            64 * ((CONTEXT + BLOCK_SIZE) * cfg.kv_bytes_per_token(KvDtype::F32)) as u64,
        ),
        eos.clone(),
        None,
    )
    .expect("executor");
    exec.init_kv_cache(BLOCK_SIZE).expect("kv");
    let compiler = GrammarCompiler::new(tokenizer.token_bytes().expect("vocabulary"), eos[0])
        .expect("compiler");
    let compiled = compiler
        .compile(StructuredOutput::Json(schema()))
        .expect("schema");
    let worker = GrammarWorker::spawn("bench-grammar".into()).expect("thread");

    let mut g = c.benchmark_group("structured_decode/demo");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let mut out = StepOutput::default();
    for batch in [1usize, 32] {
        let sampled = || {
            decode_batch_with(
                batch,
                CONTEXT,
                SamplingParams {
                    temperature: 1.0,
                    ..SamplingParams::default()
                },
            )
        };
        let free = sampled();
        let mut constrained = sampled();
        for (i, s) in constrained.seqs.iter_mut().enumerate() {
            s.mask_slot = Some(i as u32);
        }
        let mut grammars: Vec<SeqGrammar> = (0..batch).map(|_| compiled.start()).collect();
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_function(BenchmarkId::new("free", batch), |b| {
            b.iter(|| exec.execute(black_box(&free), &mut out).expect("step"))
        });
        g.bench_function(BenchmarkId::new("json-schema", batch), |b| {
            b.iter(|| {
                constrained.masks = Some(worker.submit(grammars.clone()));
                exec.execute(black_box(&constrained), &mut out)
                    .expect("step");
                for (gr, tok) in grammars.iter_mut().zip(&out.sampled) {
                    let tok = tok.expect("sampled");
                    if gr.advance(tok) != Advance::Continue {
                        *gr = compiled.start();
                    }
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, decode, structured_decode, memory_bandwidth, sync);
criterion_main!(benches);
