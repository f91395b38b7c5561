//! What structured outputs cost a decode step: the trained demo model at
//! batch 1 and 32, free text against a JSON schema on every sequence. The
//! constrained step does what the engine does: the grammar thread computes
//! the masks while the forward pass runs, the executor applies them before
//! sampling, and each matcher is advanced with its token (restarted when its
//! object is complete). Run: `cargo bench -p inferscope-model --bench
//! structured_decode`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use inferscope_engine::structured::{Advance, GrammarWorker, SeqGrammar};
use inferscope_engine::{
    Executor, GrammarCompiler, SamplingParams, ScheduledBatch, ScheduledSeq, StepOutput,
    StructuredOutput,
};
use inferscope_model::demo::trained_demo_model;
use inferscope_model::{CpuExecutor, KvBudget, KvDtype, Tokenizer};

/// Tokens already in the cache when the measured decode step runs.
const CONTEXT: usize = 64;
const BLOCK_SIZE: usize = 16;

/// One decode step of `batch` sequences at position `CONTEXT` (the same KV
/// slot is rewritten every iteration, so the context stays fixed).
fn decode_batch(batch: usize) -> ScheduledBatch {
    let blocks_per_seq = (CONTEXT + 1).div_ceil(BLOCK_SIZE);
    let params = Arc::new(SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    });
    let mut b = ScheduledBatch {
        block_size: BLOCK_SIZE,
        ..ScheduledBatch::default()
    };
    for i in 0..batch {
        b.seqs.push(ScheduledSeq {
            seq_id: i as u64,
            token_offset: i,
            num_tokens: 1,
            start_pos: CONTEXT,
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
        let free = decode_batch(batch);
        let mut constrained = decode_batch(batch);
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

criterion_group!(benches, structured_decode);
criterion_main!(benches);
