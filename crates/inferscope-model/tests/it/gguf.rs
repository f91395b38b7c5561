//! GGUF: a small file written here (unquantized and quantized tensors, a
//! SentencePiece vocabulary in the metadata) is loaded and run.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};
use common::*;
use inferscope_engine::{Executor, StepOutput};
use inferscope_model::config::ModelConfig;
use inferscope_model::demo::random_weights;
use inferscope_model::llama::Part;
use inferscope_model::loader::model_from_tensors;
use inferscope_model::{CpuExecutor, KvBudget, LoadedModel, ModelOptions};

const PIECES: &[(&str, f32)] = &[
    ("\u{2581}", -1.0),
    ("a", -2.0),
    ("b", -2.0),
    ("c", -2.0),
    ("ab", -3.0),
    ("\u{2581}a", -3.5),
    ("\u{2581}ab", -4.0),
    ("bc", -5.0),
];

/// `<unk>`, `<s>`, `</s>`, 256 byte tokens, then `PIECES`.
fn vocab() -> (Vec<String>, Vec<i32>, Vec<f32>) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (p, s) in PIECES {
        tokens.push((*p).to_string());
        types.push(1);
        scores.push(*s);
    }
    (tokens, types, scores)
}

fn config(vocab_size: usize) -> ModelConfig {
    ModelConfig {
        architecture: "LlamaForCausalLM".into(),
        vocab_size,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_interleaved: false,
        max_position_embeddings: 512,
        tie_word_embeddings: false,
        attention_bias: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        sliding_window: None,
        arch: Default::default(),
    }
}

/// llama.cpp's q/k row permutation for the interleaved rotation.
fn permute(w: &Tensor, heads: usize) -> Tensor {
    let (out, inp) = w.dims2().unwrap();
    w.reshape((heads, 2, out / heads / 2, inp))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((out, inp))
        .unwrap()
}

/// Writes the model as GGUF; `quantize` picks Q8_0/Q4_0/F16 for some tensors.
fn write_gguf(
    cfg: &ModelConfig,
    w: &HashMap<String, Tensor>,
    quantize: bool,
    name: &str,
) -> PathBuf {
    write_gguf_with(cfg, w, types(quantize), name, spm_metadata(), Vec::new())
}

/// The SentencePiece (`llama`) tokenizer metadata of [`vocab`].
fn spm_metadata() -> Vec<(&'static str, Value)> {
    let (tokens, types, scores) = vocab();
    vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            Value::Array(scores.into_iter().map(Value::F32).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
    ]
}

/// The storage of (q/k/v/o/gate/up and the head, down, the embeddings):
/// F32, or a mix of Q8_0, Q4_0 and F16.
fn types(quantize: bool) -> (GgmlDType, GgmlDType, GgmlDType) {
    if quantize {
        (GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::F16)
    } else {
        (GgmlDType::F32, GgmlDType::F32, GgmlDType::F32)
    }
}

/// [`write_gguf_with`] for the usual file: an F32 embedding, the
/// SentencePiece vocabulary, no extra tensors.
fn write_spm_gguf(
    cfg: &ModelConfig,
    w: &HashMap<String, Tensor>,
    lin: GgmlDType,
    down: GgmlDType,
    name: &str,
) -> PathBuf {
    write_gguf_with(
        cfg,
        w,
        (lin, down, GgmlDType::F32),
        name,
        spm_metadata(),
        Vec::new(),
    )
}

fn write_gguf_with(
    cfg: &ModelConfig,
    w: &HashMap<String, Tensor>,
    (lin, down, embd): (GgmlDType, GgmlDType, GgmlDType),
    name: &str,
    tokenizer: Vec<(&'static str, Value)>,
    extra: Vec<(String, Tensor)>,
) -> PathBuf {
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut put = |name: String, t: Tensor, dtype: GgmlDType| {
        tensors.push((
            name,
            QTensor::quantize(&t.to_dtype(DType::F32).unwrap(), dtype).unwrap(),
        ));
    };
    for (n, t) in extra {
        put(n, t, GgmlDType::F32);
    }
    put(
        "token_embd.weight".into(),
        w["model.embed_tokens.weight"].clone(),
        embd,
    );
    put(
        "output_norm.weight".into(),
        w["model.norm.weight"].clone(),
        GgmlDType::F32,
    );
    if !cfg.tie_word_embeddings {
        put("output.weight".into(), w["lm_head.weight"].clone(), lin);
    }
    for l in 0..cfg.num_layers {
        let hf = |n: &str| w[&format!("model.layers.{l}.{n}.weight")].clone();
        let g = |n: &str| format!("blk.{l}.{n}.weight");
        put(g("attn_norm"), hf("input_layernorm"), GgmlDType::F32);
        put(
            g("ffn_norm"),
            hf("post_attention_layernorm"),
            GgmlDType::F32,
        );
        put(
            g("attn_q"),
            permute(&hf("self_attn.q_proj"), cfg.num_heads),
            lin,
        );
        put(
            g("attn_k"),
            permute(&hf("self_attn.k_proj"), cfg.num_kv_heads),
            lin,
        );
        // `attn_v` as `ffn_down`, as a Q4_K_M file has them (Q6_K).
        put(g("attn_v"), hf("self_attn.v_proj"), down);
        put(g("attn_output"), hf("self_attn.o_proj"), lin);
        put(g("ffn_gate"), hf("mlp.gate_proj"), lin);
        put(g("ffn_up"), hf("mlp.up_proj"), lin);
        put(g("ffn_down"), hf("mlp.down_proj"), down);
    }
    let u = |x: usize| Value::U32(x as u32);
    let mut meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.embedding_length", u(cfg.hidden_size)),
        ("llama.block_count", u(cfg.num_layers)),
        ("llama.feed_forward_length", u(cfg.intermediate_size)),
        ("llama.attention.head_count", u(cfg.num_heads)),
        ("llama.attention.head_count_kv", u(cfg.num_kv_heads)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        ("llama.rope.freq_base", Value::F32(cfg.rope_theta)),
        ("llama.context_length", u(cfg.max_position_embeddings)),
    ];
    meta.extend(tokenizer);
    let path = std::env::temp_dir().join(format!("inferscope-{name}-{}.gguf", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
    path
}

fn logits(exec: &mut CpuExecutor, prompt: &[u32]) -> Vec<f32> {
    let mut s = Seq::new(1, prompt, greedy());
    let b = build_batch(&mut [&mut s], &mut Alloc::new(0), 512);
    exec.forward_logits(&b).unwrap().remove(0)
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn gguf_loads_runs_and_matches_the_safetensors_path() {
    let (tokens, _, _) = vocab();
    let cfg = config(tokens.len());
    let w = random_weights(&cfg, 99).unwrap();
    let hf = std::sync::Arc::new(model_from_tensors(cfg.clone(), w.clone()).unwrap());
    let mut hf_exec =
        CpuExecutor::new("hf".into(), hf, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
    hf_exec.init_kv_cache(BLOCK_SIZE).unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| 3 + i * 29).collect();
    let expected = logits(&mut hf_exec, &prompt);

    let opts = ModelOptions {
        kv_cache_memory: Some(4 << 20),
        ..ModelOptions::default()
    };
    for quantize in [false, true] {
        let path = write_gguf(&cfg, &w, quantize, if quantize { "q" } else { "f32" });
        let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(m.max_model_len(), 512);
        let mut exec = m.cpu_executor().unwrap();
        exec.init_kv_cache(BLOCK_SIZE).unwrap();
        let got = logits(&mut exec, &prompt);
        let diff = max_rel_diff(&got, &expected);
        // Unquantized: the same model through the interleaved rotation of
        // permuted q/k rows. Quantized (Q8_0/Q4_0/F16): close, not equal.
        let bound = if quantize { 0.1 } else { 1e-4 };
        assert!(
            diff < bound,
            "quantize={quantize}: relative difference {diff}"
        );
        if quantize {
            assert!(diff > 1e-6, "quantized weights should change the logits");
        }

        // Generation runs end to end.
        let mut s = Seq::new(2, &prompt, greedy());
        let mut out = StepOutput::default();
        let mut alloc = Alloc::new(0);
        for _ in 0..5 {
            let b = build_batch(&mut [&mut s], &mut alloc, 512);
            exec.execute(&b, &mut out).unwrap();
            append(&mut [&mut s], &b, &out.sampled);
        }
        assert_eq!(s.tokens.len(), prompt.len() + 5);

        // The tokenizer comes from the metadata.
        let t = m.tokenizer();
        let ids = t.encode("ab abc", true).unwrap();
        let id = |p: &str| tokens.iter().position(|t| t == p).unwrap() as u32;
        assert_eq!(ids, vec![1, id("\u{2581}ab"), id("\u{2581}ab"), id("c")]);
        // As llama.cpp's detokenize: the first token loses its leading
        // space, and with BOS first that token is BOS.
        assert_eq!(t.decode(&ids, true).unwrap(), " ab abc");
        assert_eq!(t.decode(&ids[1..], true).unwrap(), "ab abc");
        assert_eq!(
            t.decode(&[id("a"), 3 + 0xC3, 3 + 0xA9], true).unwrap(),
            "aé"
        );
        assert_eq!(t.eos_token_ids(), vec![2]);
        assert_eq!(t.bos_token_id(), Some(1));
    }
}

#[test]
fn gguf_q8_0_runs_the_dequantized_model() {
    // Every linear layer (and the head) in Q8_0: the logits are close to
    // those of the same model with the weights dequantized by candle (run
    // through the safetensors path), for prompts of 9 and 33 tokens.
    let (tokens, _, _) = vocab();
    let cfg = config(tokens.len());
    let w = random_weights(&cfg, 7).unwrap();
    let q8 = GgmlDType::Q8_0;
    let path = write_spm_gguf(&cfg, &w, q8, q8, "q8");
    let opts = ModelOptions {
        kv_cache_memory: Some(4 << 20),
        ..ModelOptions::default()
    };
    let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
    let _ = std::fs::remove_file(&path);
    let mut exec = m.cpu_executor().unwrap();
    exec.init_kv_cache(BLOCK_SIZE).unwrap();

    // What a step reads (the `estimated_read_bytes` term): every linear as
    // repacked, 1 byte per weight plus an f16 scale per 32, over output rows
    // padded to the 16-row panels.
    let (h, kv, ffn) = (
        cfg.hidden_size,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    );
    let per_layer = [
        (h, h),
        (kv, h),
        (kv, h),
        (h, h),
        (ffn, h),
        (ffn, h),
        (h, ffn),
    ];
    let q8_bytes = |(out, inp): (usize, usize)| out.div_ceil(16) * 16 * inp * 17 / 16;
    let expected = cfg.num_layers * per_layer.into_iter().map(q8_bytes).sum::<usize>()
        + q8_bytes((cfg.vocab_size, h));
    assert_eq!(m.model().weight_bytes(), expected);
    let cost = inferscope_model::CpuCost::of(m.model(), inferscope_model::KvDtype::F32);
    assert_eq!(cost.weight_bytes, expected as f64);

    let deq: HashMap<String, Tensor> = w
        .iter()
        .map(|(n, t)| {
            let linear = n.contains("_proj") || n == "lm_head.weight";
            let t = if linear {
                let q = QTensor::quantize(&t.to_dtype(DType::F32).unwrap(), q8).unwrap();
                q.dequantize(&candle_core::Device::Cpu).unwrap()
            } else {
                t.clone()
            };
            (n.clone(), t)
        })
        .collect();
    let hf = std::sync::Arc::new(model_from_tensors(cfg.clone(), deq).unwrap());
    let mut hf_exec =
        CpuExecutor::new("hf".into(), hf, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
    hf_exec.init_kv_cache(BLOCK_SIZE).unwrap();
    let undeq = std::sync::Arc::new(model_from_tensors(cfg.clone(), w.clone()).unwrap());
    let mut undeq_exec =
        CpuExecutor::new("f32".into(), undeq, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
    undeq_exec.init_kv_cache(BLOCK_SIZE).unwrap();
    for len in [9, 33] {
        let prompt: Vec<u32> = (0..len).map(|i| 3 + (i * 29) % 260).collect();
        let got = logits(&mut exec, &prompt);
        let diff = max_rel_diff(&got, &logits(&mut hf_exec, &prompt));
        // The packed kernels round the activations to 8 bits per 32-block
        // (as candle's QMatMul and llama.cpp do): 1.0e-2 / 8.6e-3 of the
        // largest logit at 9 / 33 tokens, where it was 1e-4 with f32
        // activations.
        assert!(diff < 2e-2, "{len} tokens: relative difference {diff}");
        // And the quantization is visible: not the f32 model's logits.
        let off = max_rel_diff(&got, &logits(&mut undeq_exec, &prompt));
        assert!(off > 1e-4, "{len} tokens: Q8_0 equals f32 ({off})");
    }
}

/// The small config with K-quant shapes: super-blocks are 256 weights
/// along a row, so every input dimension is a multiple of 256.
fn kquant_config() -> ModelConfig {
    ModelConfig {
        hidden_size: 256,
        intermediate_size: 512,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        ..config(vocab().0.len())
    }
}

/// Runs a model whose linear layers are K-quants (`lin` for q/k/o,
/// gate/up and the head, `down` for v and down) and checks its logits against the
/// same model with candle's dequantized weights, and the bytes the cost
/// model reads against the packed layout computed from the shapes.
fn check_kquant_model(lin: GgmlDType, down: GgmlDType, name: &str) {
    let cfg = kquant_config();
    let w = random_weights(&cfg, 11).unwrap();
    let path = write_spm_gguf(&cfg, &w, lin, down, name);
    let opts = ModelOptions {
        kv_cache_memory: Some(4 << 20),
        ..ModelOptions::default()
    };
    let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
    let _ = std::fs::remove_file(&path);
    let mut exec = m.cpu_executor().unwrap();
    exec.init_kv_cache(BLOCK_SIZE).unwrap();

    // What a step reads: output rows padded to 16-row panels; per weight,
    // Q4_K 0.5 byte of quants + an int8 scale and min per 32 + f32 d and
    // dmin per 256 (19/32 byte), Q6_K an int8 quant + an int8 scale per 16
    // + an f32 d per 256 (69/64 byte).
    let bytes = |dtype: GgmlDType, (out, inp): (usize, usize)| {
        let (num, den) = match dtype {
            GgmlDType::Q4K => (19, 32),
            GgmlDType::Q5K => (23, 32),
            GgmlDType::Q6K => (69, 64),
            other => panic!("not a K-quant: {other:?}"),
        };
        out.div_ceil(16) * 16 * inp * num / den
    };
    let (h, kv, ffn) = (
        cfg.hidden_size,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    );
    let per_layer = [(h, h), (kv, h), (h, h), (ffn, h), (ffn, h)]
        .into_iter()
        .map(|s| bytes(lin, s))
        .sum::<usize>()
        + bytes(down, (kv, h))
        + bytes(down, (h, ffn));
    let expected = cfg.num_layers * per_layer + bytes(lin, (cfg.vocab_size, h));
    assert_eq!(m.model().weight_bytes(), expected, "{name}");
    let cost = inferscope_model::CpuCost::of(m.model(), inferscope_model::KvDtype::F32);
    assert_eq!(cost.weight_bytes, expected as f64);

    let deq: HashMap<String, Tensor> = w
        .iter()
        .map(|(n, t)| {
            let dtype = if n.contains("down_proj") || n.contains("v_proj") {
                down
            } else {
                lin
            };
            let linear = n.contains("_proj") || n == "lm_head.weight";
            let t = if linear {
                let q = QTensor::quantize(&t.to_dtype(DType::F32).unwrap(), dtype).unwrap();
                q.dequantize(&candle_core::Device::Cpu).unwrap()
            } else {
                t.clone()
            };
            (n.clone(), t)
        })
        .collect();
    let hf = std::sync::Arc::new(model_from_tensors(cfg.clone(), deq).unwrap());
    let mut hf_exec =
        CpuExecutor::new("hf".into(), hf, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
    hf_exec.init_kv_cache(BLOCK_SIZE).unwrap();
    let undeq = std::sync::Arc::new(model_from_tensors(cfg.clone(), w.clone()).unwrap());
    let mut undeq_exec =
        CpuExecutor::new("f32".into(), undeq, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
    undeq_exec.init_kv_cache(BLOCK_SIZE).unwrap();
    for len in [9, 33] {
        let prompt: Vec<u32> = (0..len).map(|i| 3 + (i * 29) % 260).collect();
        let got = logits(&mut exec, &prompt);
        let diff = max_rel_diff(&got, &logits(&mut hf_exec, &prompt));
        // Q4_K and Q6_K products round the activations to 8 bits (Q8_K,
        // as llama.cpp and candle): measured up to 1.6e-2 here (1e-4 when
        // the products were exact with the dequantized weights).
        assert!(
            diff < 3e-2,
            "{name}, {len} tokens: relative difference {diff}"
        );
        // And the quantization is visible: not the f32 model's logits.
        let off = max_rel_diff(&got, &logits(&mut undeq_exec, &prompt));
        assert!(off > 1e-4, "{name}, {len} tokens: equals f32 ({off})");
    }
}

#[test]
fn gguf_q4_k_runs_the_dequantized_model() {
    // Every linear layer (and the head) in Q4_K: the packed Q4_K kernels
    // (q/k/v and gate/up fused).
    check_kquant_model(GgmlDType::Q4K, GgmlDType::Q4K, "q4k");
}

#[test]
fn gguf_q6_k_and_q4_k_m_like_run_the_dequantized_model() {
    // Every linear layer in Q6_K; then Q4_K with v and down in Q6_K (as a
    // Q4_K_M file mixes them: q and k fuse, v stays apart), and Q5_K with v
    // and down in Q6_K.
    check_kquant_model(GgmlDType::Q6K, GgmlDType::Q6K, "q6k");
    check_kquant_model(GgmlDType::Q4K, GgmlDType::Q6K, "q4km");
    check_kquant_model(GgmlDType::Q5K, GgmlDType::Q6K, "q5km");
}

/// A mapped file's embedding table stays in its stored type (Q4_K, Q6_K,
/// Q8_0), every looked-up row is candle's dequantization of it, and a tied
/// head runs the packed kernels on the stored table (not on f32 rows).
#[test]
fn gguf_embeddings_stay_in_their_stored_type() {
    for (embd, tied, name) in [
        (GgmlDType::Q4K, false, "emb-q4k"),
        (GgmlDType::Q6K, true, "emb-q6k-tied"),
        (GgmlDType::Q8_0, true, "emb-q8-tied"),
    ] {
        let cfg = ModelConfig {
            tie_word_embeddings: tied,
            ..kquant_config()
        };
        let w = random_weights(&cfg, 5).unwrap();
        let f32_ = GgmlDType::F32;
        let path = write_gguf_with(&cfg, &w, (f32_, f32_, embd), name, spm_metadata(), vec![]);
        let opts = ModelOptions {
            kv_cache_memory: Some(4 << 20),
            ..ModelOptions::default()
        };
        let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
        // The map outlives the file's name.
        let _ = std::fs::remove_file(&path);
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let e = &m.model().embed;
        assert_eq!(e.dtype(), embd.into(), "{name}");
        let row_bytes = h / embd.block_size() * embd.type_size();
        assert_eq!(e.stored_bytes(), v * row_bytes, "{name}");
        let by_part = m.model().weight_bytes_by_part();
        let head = by_part.iter().find(|(p, _)| *p == Part::LmHead).unwrap().1;
        if tied {
            // Packed in 16-row panels of the stored blocks: about the
            // table's size, under a third of f32 rows.
            assert!(
                head >= v * row_bytes && head < v.div_ceil(16) * 16 * h * 4 / 3,
                "{name}: {head}"
            );
        } else {
            assert_eq!(head, v.div_ceil(16) * 16 * h * 4, "{name}: f32 head");
        }

        // The same model with the table dequantized by candle.
        let deq: HashMap<String, Tensor> = w
            .iter()
            .map(|(n, t)| {
                let t = if n == "model.embed_tokens.weight" {
                    let q = QTensor::quantize(&t.to_dtype(DType::F32).unwrap(), embd).unwrap();
                    q.dequantize(&candle_core::Device::Cpu).unwrap()
                } else {
                    t.clone()
                };
                (n.clone(), t)
            })
            .collect();
        let hf = std::sync::Arc::new(model_from_tensors(cfg.clone(), deq).unwrap());
        let mut hf_exec =
            CpuExecutor::new("hf".into(), hf, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
        hf_exec.init_kv_cache(BLOCK_SIZE).unwrap();
        let mut exec = m.cpu_executor().unwrap();
        exec.init_kv_cache(BLOCK_SIZE).unwrap();
        let prompt: Vec<u32> = (0..17).map(|i| 3 + (i * 29) % 260).collect();
        let diff = max_rel_diff(&logits(&mut exec, &prompt), &logits(&mut hf_exec, &prompt));
        // Untied: the looked-up rows are exact and the products f32, so
        // only the rotation's order of operations differs. Tied: the head's
        // quantized product rounds the activations to 8 bits (Q8_K / Q8_0).
        let bound = if tied { 3e-2 } else { 1e-4 };
        assert!(diff < bound, "{name}: relative difference {diff}");
    }
}

/// `bytes` of a GGUF file with tensor `name`'s type id set to `ty` (the
/// type follows the name, its dimension count and its dimensions).
fn retype(bytes: &mut [u8], name: &str, ty: u32) {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .unwrap_or_else(|| panic!("no tensor {name}"))
        + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let t = at + 4 + 8 * n_dims;
    bytes[t..t + 4].copy_from_slice(&ty.to_le_bytes());
}

/// The linear layers' names in the GGUF file of [`config`]'s model.
fn linear_names(cfg: &ModelConfig) -> Vec<String> {
    let mut names = vec!["output.weight".to_string()];
    for l in 0..cfg.num_layers {
        for n in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            names.push(format!("blk.{l}.{n}.weight"));
        }
    }
    names
}

/// A file whose linear layers are IQ4_NL loads, runs as the model with
/// those weights dequantized (by `iq4`, which the gguf-py fixture checks),
/// and holds them as Q8_0 blocks of the same values; a file with a type
/// that does not load is refused, naming the tensor and its type.
#[test]
fn gguf_iq4_nl_runs_the_dequantized_model_and_other_types_are_refused() {
    let (tokens, _, _) = vocab();
    let cfg = config(tokens.len());
    let is_linear = |n: &str| n.contains("_proj") || n == "lm_head.weight";
    // Q4_0 blocks have IQ4_NL's shape (an f16 and 16 bytes per 32): the
    // same bytes retyped are IQ4_NL blocks, of weights about 16 times
    // larger (the table spans ±127 where Q4_0's quants span ±8): the
    // linear weights are divided by 16 first, so that the model is not
    // more sensitive to the activations' rounding than the others here.
    let w: HashMap<String, Tensor> = random_weights(&cfg, 13)
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            let t = if is_linear(&n) {
                (t / 16.0).unwrap()
            } else {
                t
            };
            (n, t)
        })
        .collect();
    let q4_0 = GgmlDType::Q4_0;
    let path = write_spm_gguf(&cfg, &w, q4_0, q4_0, "iq4nl");
    let written = std::fs::read(&path).unwrap();
    let mut bytes = written.clone();
    for n in linear_names(&cfg) {
        retype(&mut bytes, &n, 20);
    }
    std::fs::write(&path, &bytes).unwrap();
    let opts = ModelOptions {
        kv_cache_memory: Some(4 << 20),
        ..ModelOptions::default()
    };
    let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
    let mut exec = m.cpu_executor().unwrap();
    exec.init_kv_cache(BLOCK_SIZE).unwrap();
    // Q8_0's 1 byte per weight and an f16 per 32, over 16-row panels.
    let (h, kv, ffn) = (
        cfg.hidden_size,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    );
    let q8_bytes = |(out, inp): (usize, usize)| out.div_ceil(16) * 16 * inp * 17 / 16;
    let per_layer = [
        (h, h),
        (kv, h),
        (kv, h),
        (h, h),
        (ffn, h),
        (ffn, h),
        (h, ffn),
    ];
    let expected = cfg.num_layers * per_layer.into_iter().map(q8_bytes).sum::<usize>()
        + q8_bytes((cfg.vocab_size, h));
    assert_eq!(m.model().weight_bytes(), expected);

    // Each row's blocks are independent, so dequantizing the Hugging Face
    // weights' blocks gives the file's weights before the q/k row permutation.
    let deq: HashMap<String, Tensor> = w
        .iter()
        .map(|(n, t)| {
            let t = if is_linear(n) {
                let q = QTensor::quantize(&t.to_dtype(DType::F32).unwrap(), q4_0).unwrap();
                let mut v = vec![0f32; t.elem_count()];
                inferscope_model::iq4::dequantize_nl(&q.data().unwrap(), &mut v);
                Tensor::from_vec(v, t.dims(), &candle_core::Device::Cpu).unwrap()
            } else {
                t.clone()
            };
            (n.clone(), t)
        })
        .collect();
    let hf = std::sync::Arc::new(model_from_tensors(cfg.clone(), deq).unwrap());
    let mut hf_exec =
        CpuExecutor::new("hf".into(), hf, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
    hf_exec.init_kv_cache(BLOCK_SIZE).unwrap();
    for len in [9, 33] {
        let prompt: Vec<u32> = (0..len).map(|i| 3 + (i * 29) % 260).collect();
        let diff = max_rel_diff(&logits(&mut exec, &prompt), &logits(&mut hf_exec, &prompt));
        // Q8_0 activations, as for Q8_0 weights (gguf_q8_0_runs_...).
        assert!(diff < 2e-2, "{len} tokens: relative difference {diff}");
    }

    for (id, name) in [
        (16, "IQ2_XXS"),
        (19, "IQ1_S"),
        (34, "TQ1_0"),
        (39, "MXFP4"),
        (77, "type 77"),
    ] {
        let mut bad = written.clone();
        retype(&mut bad, "blk.1.ffn_up.weight", id);
        std::fs::write(&path, &bad).unwrap();
        let e = LoadedModel::load(path.to_str().unwrap(), &opts)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("tensor blk.1.ffn_up.weight has type {name}, "))
                && e.contains("supported types: F32, F16, BF16, Q4_0")
                && e.contains("IQ4_NL, IQ4_XS"),
            "{e}"
        );
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn gguf_errors_are_clear() {
    let opts = ModelOptions::default();
    let missing = std::env::temp_dir().join("inferscope-does-not-exist.gguf");
    let e = LoadedModel::load(missing.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing file") && e.contains("inferscope-does-not-exist.gguf"),
        "{e}"
    );

    // A GGUF file is known by its first bytes, whatever its name.
    let path = std::env::temp_dir().join(format!("inferscope-arch-{}.bin", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    let arch = Value::String("mamba".into());
    gguf_file::write(&mut f, &[("general.architecture", &arch)], &[]).unwrap();
    drop(f);
    let e = LoadedModel::load(path.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("mamba"), "{e}");
    // Neither a directory nor a GGUF file, whatever its name.
    std::fs::write(&path, b"not a gguf file").unwrap();
    let e = LoadedModel::load(path.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a GGUF file") && e.contains("`GGUF`"), "{e}");
    let named = path.with_extension("gguf");
    std::fs::rename(&path, &named).unwrap();
    let e = LoadedModel::load(named.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a GGUF file"), "{e}");
    // The magic bytes and then garbage: a GGUF file that does not parse.
    std::fs::write(&named, b"GGUF\xff\xff").unwrap();
    let e = LoadedModel::load(named.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a valid GGUF file"), "{e}");
    let _ = std::fs::remove_file(&named);

    // A truncated file: its tensors pass the end of the map.
    let (tokens, _, _) = vocab();
    let cfg = config(tokens.len());
    let w = random_weights(&cfg, 3).unwrap();
    let path = write_gguf(&cfg, &w, false, "truncated");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let e = LoadedModel::load(path.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    let _ = std::fs::remove_file(&path);
    assert!(
        e.contains("pass the end of the file") && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn gguf_gpt2_tokenizer_and_chat_template_from_metadata() {
    let tokens = [
        "a",
        "b",
        "\u{120}",
        "ab",
        "\u{120}a",
        "<|endoftext|>",
        "<|im_end|>",
    ];
    let cfg = config(tokens.len());
    let w = random_weights(&cfg, 5).unwrap();
    let strings = |v: &[&str]| Value::Array(v.iter().map(|t| Value::String((*t).into())).collect());
    let meta = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::Array([1, 1, 1, 1, 1, 3, 1].map(Value::I32).to_vec()),
        ),
        ("tokenizer.ggml.merges", strings(&["a b", "\u{120} a"])),
        ("tokenizer.ggml.eos_token_id", Value::U32(5)),
        (
            "tokenizer.chat_template",
            Value::String(
                "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}".into(),
            ),
        ),
    ];
    let path = write_gguf_with(&cfg, &w, types(false), "gpt2", meta, Vec::new());
    let m = LoadedModel::load(path.to_str().unwrap(), &ModelOptions::default()).unwrap();
    let _ = std::fs::remove_file(&path);
    let t = m.tokenizer();
    assert_eq!(t.encode("ab a", true).unwrap(), vec![3, 4]);
    assert_eq!(t.decode(&[3, 4, 5], true).unwrap(), "ab a");
    // llama.cpp's end-of-generation set: EOS and <|im_end|> by its text.
    assert_eq!(t.eos_token_ids(), vec![5, 6]);
    let chat = [inferscope_model::ChatMessage {
        role: "user".into(),
        content: "ab".into(),
    }];
    assert_eq!(
        t.apply_chat_template(&chat, true).unwrap(),
        "ab<|endoftext|>"
    );
    // The engine stops at all of them.
    assert_eq!(m.executor().unwrap().eos_token_ids(), vec![5, 6]);
}

#[test]
fn gguf_rope_freqs_carry_llama3_scaling() {
    // llama.cpp stores Llama-3 rope scaling as per-frequency divisors in
    // `rope_freqs.weight`; with them the GGUF equals the HF model with
    // `rope_scaling` (and differs without them).
    let (tokens, _, _) = vocab();
    let mut scaled = config(tokens.len());
    scaled.rope_theta = 500_000.0;
    scaled.rope_scaling = Some(inferscope_model::config::RopeScaling::Llama3(
        inferscope_model::config::Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 16,
        },
    ));
    let mut plain = scaled.clone();
    plain.rope_scaling = None;
    let factors: Vec<f32> = plain
        .rope_inv_freq(plain.rope_theta)
        .iter()
        .zip(scaled.rope_inv_freq(scaled.rope_theta))
        .map(|(base, s)| base / s)
        .collect();
    assert!(
        factors.iter().any(|f| *f > 1.5),
        "the scaling must matter: {factors:?}"
    );
    let w = random_weights(&scaled, 11).unwrap();
    let hf = std::sync::Arc::new(model_from_tensors(scaled.clone(), w.clone()).unwrap());
    let mut hf_exec =
        CpuExecutor::new("hf".into(), hf, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
    hf_exec.init_kv_cache(BLOCK_SIZE).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| 3 + i * 6).collect();
    let expected = logits(&mut hf_exec, &prompt);

    let opts = ModelOptions {
        kv_cache_memory: Some(4 << 20),
        ..ModelOptions::default()
    };
    let n = factors.len();
    let freqs = Tensor::from_vec(factors, n, &candle_core::Device::Cpu).unwrap();
    let extra = vec![("rope_freqs.weight".to_string(), freqs)];
    let path = write_gguf_with(&plain, &w, types(false), "ropefreqs", spm_metadata(), extra);
    let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
    let _ = std::fs::remove_file(&path);
    let mut exec = m.cpu_executor().unwrap();
    exec.init_kv_cache(BLOCK_SIZE).unwrap();
    let diff = max_rel_diff(&logits(&mut exec, &prompt), &expected);
    assert!(diff < 1e-4, "with rope_freqs: relative difference {diff}");

    let path = write_gguf(&plain, &w, false, "noropefreqs");
    let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
    let _ = std::fs::remove_file(&path);
    let mut exec = m.cpu_executor().unwrap();
    exec.init_kv_cache(BLOCK_SIZE).unwrap();
    let diff = max_rel_diff(&logits(&mut exec, &prompt), &expected);
    assert!(
        diff > 1e-3,
        "without rope_freqs the logits should differ ({diff})"
    );
}

#[test]
fn gguf_f16_and_bf16_weights_stay_16_bit_and_compute_exactly() {
    // Every linear layer, the head and the embeddings in F16 (then BF16):
    // the weights are kept 16-bit — half the bytes of the same file in F32 —
    // and widening them is exact, so the logits equal those of the F32 file
    // holding the same (rounded) values, for prompts of 9 and 33 tokens.
    let (tokens, _, _) = vocab();
    let cfg = config(tokens.len());
    let w = random_weights(&cfg, 11).unwrap();
    let opts = ModelOptions {
        kv_cache_memory: Some(4 << 20),
        ..ModelOptions::default()
    };
    let load = |path: PathBuf| {
        let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
        let _ = std::fs::remove_file(&path);
        m
    };
    for (half, dtype, name) in [
        (GgmlDType::F16, DType::F16, "f16"),
        (GgmlDType::BF16, DType::BF16, "bf16"),
    ] {
        let halves = write_gguf_with(
            &cfg,
            &w,
            (half, half, half),
            name,
            spm_metadata(),
            Vec::new(),
        );
        // The same values, rounded by candle and written as F32 (the norms
        // are F32 in both files).
        let rounded: HashMap<String, Tensor> = w
            .iter()
            .map(|(n, t)| {
                let half = n.contains("_proj") || n.contains("embed") || n == "lm_head.weight";
                let t = if half {
                    t.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap()
                } else {
                    t.clone()
                };
                (n.clone(), t)
            })
            .collect();
        let f32_file = write_spm_gguf(
            &cfg,
            &rounded,
            GgmlDType::F32,
            GgmlDType::F32,
            &format!("{name}-f32"),
        );
        let (m16, m32) = (load(halves), load(f32_file));
        assert_eq!(
            2 * m16.model().weight_bytes(),
            m32.model().weight_bytes(),
            "{name}: half the bytes of the f32 load"
        );
        let mut e16 = m16.cpu_executor().unwrap();
        e16.init_kv_cache(BLOCK_SIZE).unwrap();
        let mut e32 = m32.cpu_executor().unwrap();
        e32.init_kv_cache(BLOCK_SIZE).unwrap();
        for len in [9, 33] {
            let prompt: Vec<u32> = (0..len).map(|i| 3 + (i * 31) % 260).collect();
            let diff = max_rel_diff(&logits(&mut e16, &prompt), &logits(&mut e32, &prompt));
            assert!(
                diff < 1e-6,
                "{name}, {len} tokens: relative difference {diff}"
            );
        }
    }
}

/// A Hugging Face checkpoint of a family beyond Llama written as
/// `convert_hf_to_gguf.py` writes it: llama.cpp's tensor names (Gemma's
/// pre/post norms included), q/k rows in the NeoX order these families keep,
/// Gemma's norms with their 1 added, no `output.weight` when tied, and the
/// family's metadata keys. F32 tensors.
fn write_family_gguf(arch: &str, cfg: &ModelConfig, w: &HashMap<String, Tensor>) -> PathBuf {
    let gemma = arch.starts_with("gemma");
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut put = |name: String, t: &Tensor| {
        let norm = name.ends_with("norm.weight");
        let t = if gemma && norm {
            (t + 1.0).unwrap()
        } else {
            t.clone()
        };
        tensors.push((name, QTensor::quantize(&t, GgmlDType::F32).unwrap()));
    };
    put("token_embd.weight".into(), &w["model.embed_tokens.weight"]);
    put("output_norm.weight".into(), &w["model.norm.weight"]);
    if !cfg.tie_word_embeddings {
        put("output.weight".into(), &w["lm_head.weight"]);
    }
    let mut names = vec![
        ("attn_norm", "input_layernorm"),
        ("attn_output", "self_attn.o_proj"),
        ("ffn_down", "mlp.down_proj"),
    ];
    if arch == "phi3" {
        // Fused as in the checkpoint: `attn_qkv`, and gate/up as `ffn_up`.
        names.extend([
            ("attn_qkv", "self_attn.qkv_proj"),
            ("ffn_up", "mlp.gate_up_proj"),
        ]);
    } else {
        names.extend([
            ("attn_q", "self_attn.q_proj"),
            ("attn_k", "self_attn.k_proj"),
            ("attn_v", "self_attn.v_proj"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
        ]);
    }
    if cfg.arch.qk_norm {
        names.extend([
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
        ]);
    }
    if gemma {
        names.extend([
            ("post_attention_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
        ]);
    } else {
        names.push(("ffn_norm", "post_attention_layernorm"));
    }
    for l in 0..cfg.num_layers {
        for (g, hf) in &names {
            put(
                format!("blk.{l}.{g}.weight"),
                &w[&format!("model.layers.{l}.{hf}.weight")],
            );
        }
    }
    let u = |x: usize| Value::U32(x as u32);
    let key = |k: &str| format!("{arch}.{k}");
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (key("embedding_length"), u(cfg.hidden_size)),
        (key("block_count"), u(cfg.num_layers)),
        (key("feed_forward_length"), u(cfg.intermediate_size)),
        (key("attention.head_count"), u(cfg.num_heads)),
        (key("attention.head_count_kv"), u(cfg.num_kv_heads)),
        (key("attention.key_length"), u(cfg.head_dim)),
        (
            key("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        (key("rope.freq_base"), Value::F32(cfg.rope_theta)),
        (key("context_length"), u(cfg.max_position_embeddings)),
    ];
    if let Some(win) = cfg.sliding_window {
        meta.push((key("attention.sliding_window"), u(win)));
    }
    if let Some(inferscope_model::config::RopeScaling::Linear { factor }) = cfg.rope_scaling {
        meta.push((key("rope.scaling.type"), Value::String("linear".into())));
        meta.push((key("rope.scaling.factor"), Value::F32(factor)));
    }
    for (k, cap) in [
        ("attn_logit_softcapping", cfg.arch.attn_logit_softcapping),
        ("final_logit_softcapping", cfg.arch.final_logit_softcapping),
    ] {
        if let Some(cap) = cap {
            meta.push((key(k), Value::F32(cap)));
        }
    }
    meta.extend(spm_metadata().into_iter().map(|(k, v)| (k.to_string(), v)));
    let path = std::env::temp_dir().join(format!("inferscope-{arch}-{}.gguf", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
    path
}

/// Qwen3, Gemma 3, Phi-3 and Gemma 2 GGUF files (as llama.cpp's converter writes them) give
/// the logits of the same checkpoint loaded from safetensors, past Gemma 3's
/// sliding window (its GGUF carries only the window: llama.cpp's fixed
/// pattern of five local layers and a global one, local RoPE base 10⁴).
#[test]
fn gguf_families_match_the_safetensors_path() {
    let (tokens, _, _) = vocab();
    let mut qwen3 = config(tokens.len());
    qwen3.architecture = "Qwen3ForCausalLM".into();
    qwen3.rope_theta = 1e6;
    qwen3.arch.qk_norm = true;
    let mut gemma3 = config(tokens.len());
    gemma3.architecture = "Gemma3ForCausalLM".into();
    gemma3.num_layers = 6;
    gemma3.rope_theta = 1e6;
    gemma3.tie_word_embeddings = true;
    gemma3.sliding_window = Some(4);
    gemma3.arch = inferscope_model::config::ArchOptions {
        qk_norm: true,
        post_norms: true,
        norm_offset: true,
        embed_scale: true,
        activation: inferscope_model::config::Activation::GeluTanh,
        query_pre_attn_scalar: None,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        sliding_window_pattern: Some(6),
        rope_local_theta: Some(10_000.0),
        moe: None,
    };
    // Gemma 3 4B–27B: linear RoPE scaling on the global layers.
    let mut gemma3_scaled = gemma3.clone();
    gemma3_scaled.rope_scaling =
        Some(inferscope_model::config::RopeScaling::Linear { factor: 8.0 });
    let mut gemma2 = gemma3.clone();
    gemma2.architecture = "Gemma2ForCausalLM".into();
    gemma2.num_layers = 2;
    gemma2.rope_theta = 10_000.0;
    gemma2.arch.qk_norm = false;
    gemma2.arch.sliding_window_pattern = Some(2);
    gemma2.arch.rope_local_theta = None;
    gemma2.arch.attn_logit_softcapping = Some(1.5);
    gemma2.arch.final_logit_softcapping = Some(4.0);
    let mut phi3 = config(tokens.len());
    phi3.architecture = "Phi3ForCausalLM".into();
    let prompt: Vec<u32> = (0..9).map(|i| 3 + i * 29).collect();
    let families = [
        ("qwen3", qwen3),
        ("gemma3", gemma3),
        ("gemma3", gemma3_scaled),
        ("phi3", phi3),
        ("gemma2", gemma2),
    ];
    for (arch, cfg) in families {
        let w = random_weights(&cfg, 7).unwrap();
        let hf = std::sync::Arc::new(model_from_tensors(cfg.clone(), w.clone()).unwrap());
        let mut hf_exec =
            CpuExecutor::new("hf".into(), hf, KvBudget::Bytes(4 << 20), vec![2], None).unwrap();
        hf_exec.init_kv_cache(BLOCK_SIZE).unwrap();
        let expected = logits(&mut hf_exec, &prompt);
        let path = write_family_gguf(arch, &cfg, &w);
        let opts = ModelOptions {
            kv_cache_memory: Some(4 << 20),
            ..ModelOptions::default()
        };
        let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
        let _ = std::fs::remove_file(&path);
        let got_cfg = &m.model().cfg;
        assert_eq!(got_cfg.arch.qk_norm, cfg.arch.qk_norm, "{arch}");
        assert_eq!(got_cfg.rope_scaling, cfg.rope_scaling, "{arch}");
        assert_eq!(
            (
                got_cfg.arch.attn_logit_softcapping,
                got_cfg.arch.final_logit_softcapping
            ),
            (
                cfg.arch.attn_logit_softcapping,
                cfg.arch.final_logit_softcapping
            ),
            "{arch}: soft-caps"
        );
        assert_eq!(
            (0..cfg.num_layers)
                .map(|l| (got_cfg.layer_window(l), got_cfg.layer_rope_theta(l)))
                .collect::<Vec<_>>(),
            (0..cfg.num_layers)
                .map(|l| (cfg.layer_window(l), cfg.layer_rope_theta(l)))
                .collect::<Vec<_>>(),
            "{arch}: per-layer windows and RoPE bases"
        );
        let mut exec = m.cpu_executor().unwrap();
        exec.init_kv_cache(BLOCK_SIZE).unwrap();
        let diff = max_rel_diff(&logits(&mut exec, &prompt), &expected);
        assert!(diff < 1e-4, "{arch}: relative difference {diff}");
    }
}

/// The packed-weights cache: a first load repacks and saves the panels, a
/// second maps them in place (every weight: K-quant, Q8_0 and F16) and
/// computes the same logits bit for bit; a changed model file, and a
/// truncated cache file, are repacked (and the cache written again), never
/// read; a saved file whose model file is gone is removed by the next save.
#[test]
fn gguf_packed_weights_cache_maps_the_panels_of_a_later_load() {
    let cfg = kquant_config();
    let w = random_weights(&cfg, 12).unwrap();
    let dir = std::env::temp_dir().join(format!("inferscope-packed-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = inferscope_model::PackedCache {
        dir: dir.clone(),
        background: false,
    };
    let opts = ModelOptions {
        kv_cache_memory: Some(4 << 20),
        packed_cache: Some(cache),
        ..ModelOptions::default()
    };
    let panels_files = || {
        std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "panels"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    // A Q4_K_M-like mix (Q4_K, v and down in Q6_K), Q8_0, and F16.
    for (lin, down, name) in [
        (GgmlDType::Q4K, GgmlDType::Q6K, "cache-q4km"),
        (GgmlDType::Q8_0, GgmlDType::Q8_0, "cache-q8"),
        (GgmlDType::F16, GgmlDType::F16, "cache-f16"),
    ] {
        let write = || write_spm_gguf(&cfg, &w, lin, down, name);
        let path = write();
        let prompt: Vec<u32> = (0..21).map(|i| 3 + (i * 31) % 260).collect();
        let load = || {
            let m = LoadedModel::load(path.to_str().unwrap(), &opts).unwrap();
            let mut exec = m.cpu_executor().unwrap();
            exec.init_kv_cache(BLOCK_SIZE).unwrap();
            let l = logits(&mut exec, &prompt);
            (m.model().mapped_weight_bytes(), m.model().weight_bytes(), l)
        };
        let (mapped, total, first) = load();
        assert_eq!(mapped, 0, "{name}: the first load repacks");
        let files = panels_files();
        assert_eq!(files.len(), 1, "{name}: one cache file: {files:?}");
        let (mapped, total2, second) = load();
        assert_eq!(
            (mapped, total2),
            (total, total),
            "{name}: the second load maps every weight"
        );
        assert_eq!(first, second, "{name}: the same logits, bit for bit");

        // The model file changed (written again, a later time): repacked,
        // and saved again for the next load.
        write();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let (mapped, _, third) = load();
        assert_eq!(mapped, 0, "{name}: a changed model file is repacked");
        assert_eq!(third, first);
        assert_eq!(load().0, total, "{name}: and mapped at the next load");

        // A truncated cache file is not read.
        let file = panels_files().remove(0);
        let len = std::fs::metadata(&file).unwrap().len();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let (mapped, _, fourth) = load();
        assert_eq!(mapped, 0, "{name}: a truncated cache file is repacked");
        assert_eq!(fourth, first);
        assert_eq!(load().0, total, "{name}: and written whole again");
        assert_eq!(panels_files().len(), 1, "{name}: still one file");
        // The model file goes; its cache file stays until the next save
        // (the next format's first load) removes it: "one cache file"
        // above.
        std::fs::remove_file(&path).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
