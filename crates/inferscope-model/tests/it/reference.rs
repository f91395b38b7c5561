//! Logits against an independent implementation: `candle-transformers`'
//! Llama, Qwen2, Qwen3 and Gemma 3, on small random checkpoints written as
//! safetensors and loaded through our Hugging Face directory loader.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{gemma2, gemma3, llama, mixtral, phi3, qwen2, qwen3, qwen3_moe};
use common::*;
use inferscope_engine::Executor;
use inferscope_model::config::{
    Activation, ArchOptions, Llama3RopeScaling, ModelConfig, MoeOptions, RopeScaling,
};
use inferscope_model::demo::random_weights;
use inferscope_model::{CpuExecutor, KvDtype, LoadedModel, ModelOptions};

const TOLERANCE: f32 = 1e-4;

fn config(arch: &str, tie: bool) -> ModelConfig {
    ModelConfig {
        architecture: arch.into(),
        vocab_size: 300,
        hidden_size: 64,
        intermediate_size: 160,
        num_layers: 3,
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_interleaved: false,
        max_position_embeddings: 256,
        tie_word_embeddings: tie,
        attention_bias: arch == "Qwen2ForCausalLM",
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        sliding_window: None,
        arch: Default::default(),
    }
}

/// A WordLevel tokenizer.json over `vocab` ids (t0, t1, ...).
fn tokenizer_json(vocab: usize) -> String {
    let words: serde_json::Map<String, serde_json::Value> = (0..vocab)
        .map(|i| (format!("t{i}"), serde_json::Value::from(i)))
        .collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "t0"}
    })
    .to_string()
}

/// Writes a checkpoint directory; `shards > 1` writes an index and shards.
fn write_checkpoint(
    name: &str,
    cfg: &ModelConfig,
    w: &HashMap<String, Tensor>,
    shards: usize,
) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("inferscope-ref-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_hf_json()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json(cfg.vocab_size)).unwrap();
    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    let config = serde_json::json!({"chat_template": template, "eos_token": "t2"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    if shards == 1 {
        candle_core::safetensors::save(w, dir.join("model.safetensors")).unwrap();
    } else {
        let mut names: Vec<&String> = w.keys().collect();
        names.sort();
        let mut weight_map = serde_json::Map::new();
        for s in 0..shards {
            let file = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
            let part: HashMap<String, Tensor> = names
                .iter()
                .skip(s)
                .step_by(shards)
                .map(|n| ((*n).clone(), w[*n].clone()))
                .collect();
            for n in part.keys() {
                weight_map.insert(n.clone(), file.clone().into());
            }
            candle_core::safetensors::save(&part, dir.join(&file)).unwrap();
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
    dir
}

/// Qwen3: Qwen2 without biases, with RMSNorms over each head of q and k.
fn qwen3_config() -> ModelConfig {
    let mut c = config("Qwen3ForCausalLM", false);
    c.rope_theta = 1_000_000.0;
    c.arch.qk_norm = true;
    c
}

/// Qwen3-MoE: Qwen3 whose odd layers (`decoder_sparse_step` 2) route each
/// token to 3 of 8 experts, the chosen probabilities not renormalised.
fn qwen3_moe_config() -> ModelConfig {
    let mut c = qwen3_config();
    c.architecture = "Qwen3MoeForCausalLM".into();
    c.num_layers = 4;
    c.arch.moe = Some(MoeOptions {
        num_experts: 8,
        experts_per_token: 3,
        expert_intermediate_size: 48,
        norm_topk_prob: false,
        sparse_step: 2,
        dense_layers: Vec::new(),
    });
    c
}

/// Mixtral: Mistral with every layer's MLP 8 experts, 2 per token (the
/// softmax of the two chosen logits).
fn mixtral_config() -> ModelConfig {
    let mut c = config("MixtralForCausalLM", false);
    c.rope_theta = 1_000_000.0;
    c.intermediate_size = 48;
    c.arch.moe = Some(MoeOptions {
        num_experts: 8,
        experts_per_token: 2,
        expert_intermediate_size: 48,
        norm_topk_prob: true,
        sparse_step: 1,
        dense_layers: Vec::new(),
    });
    c
}

/// The sliding window of the Gemma test models: shorter than the prompts.
const GEMMA_WINDOW: usize = 6;

/// Gemma 3 (text): layers 0, 1 and 3 local (window of [`GEMMA_WINDOW`],
/// RoPE base 10⁴), layer 2 global (base 10⁶); tied head.
fn gemma3_config() -> ModelConfig {
    let mut c = config("Gemma3ForCausalLM", true);
    c.num_layers = 4;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1_000_000.0;
    c.sliding_window = Some(GEMMA_WINDOW);
    c.arch = ArchOptions {
        qk_norm: true,
        post_norms: true,
        norm_offset: true,
        embed_scale: true,
        activation: Activation::GeluTanh,
        // candle-transformers' Gemma 3 scales by 1/√head_dim: the reference
        // only agrees where query_pre_attn_scalar equals head_dim.
        query_pre_attn_scalar: Some(8),
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        sliding_window_pattern: Some(3),
        rope_local_theta: Some(10_000.0),
        moe: None,
    };
    c
}

/// Gemma 2: Gemma 3 without q/k norms and with one RoPE base, local and
/// global layers alternating, attention scores and final logits soft-capped
/// (caps small enough to change the random model's numbers). The window is
/// wider than the tests' sequences: candle-transformers' Gemma 2 has none.
fn gemma2_config() -> ModelConfig {
    let mut c = gemma3_config();
    c.architecture = "Gemma2ForCausalLM".into();
    c.rope_theta = 10_000.0;
    c.sliding_window = Some(64);
    c.arch.qk_norm = false;
    c.arch.sliding_window_pattern = Some(2);
    c.arch.rope_local_theta = None;
    c.arch.attn_logit_softcapping = Some(1.5);
    c.arch.final_logit_softcapping = Some(4.0);
    c
}

/// The reference: one model instance and KV cache per sequence.
enum Reference {
    Llama(llama::Llama, llama::Cache),
    Qwen2(qwen2::ModelForCausalLM),
    Qwen3(qwen3::ModelForCausalLM),
    Gemma3(gemma3::Model),
    Phi3(phi3::Model),
    Gemma2(gemma2::Model),
    Qwen3Moe(qwen3_moe::ModelForCausalLM),
    Mixtral(mixtral::Model),
}

impl Reference {
    fn new(cfg: &ModelConfig, w: &HashMap<String, Tensor>) -> Self {
        let vb = VarBuilder::from_tensors(w.clone(), DType::F32, &Device::Cpu);
        let mut j: serde_json::Value = serde_json::from_str(&cfg.to_hf_json()).unwrap();
        if cfg.architecture == "Qwen3MoeForCausalLM" {
            j["max_window_layers"] = 0.into();
            j["use_sliding_window"] = false.into();
            j["hidden_act"] = "silu".into();
            let c: qwen3_moe::Config = serde_json::from_value(j).unwrap();
            Reference::Qwen3Moe(qwen3_moe::ModelForCausalLM::new(&c, vb).unwrap())
        } else if cfg.architecture == "MixtralForCausalLM" {
            j["hidden_act"] = "silu".into();
            j["sliding_window"] = 4096.into();
            j["use_flash_attn"] = false.into();
            let c: mixtral::Config = serde_json::from_value(j).unwrap();
            Reference::Mixtral(mixtral::Model::new(&c, vb).unwrap())
        } else if cfg.architecture == "Qwen3ForCausalLM" {
            j["max_window_layers"] = 0.into();
            j["use_sliding_window"] = false.into();
            j["hidden_act"] = "silu".into();
            let c: qwen3::Config = serde_json::from_value(j).unwrap();
            Reference::Qwen3(qwen3::ModelForCausalLM::new(&c, vb).unwrap())
        } else if cfg.architecture == "Gemma2ForCausalLM" {
            let c: gemma2::Config = serde_json::from_value(j).unwrap();
            Reference::Gemma2(gemma2::Model::new(false, &c, vb).unwrap())
        } else if cfg.architecture == "Phi3ForCausalLM" {
            j["hidden_act"] = "silu".into();
            j["eos_token_id"] = cfg.eos_token_ids[0].into();
            let c: phi3::Config = serde_json::from_value(j).unwrap();
            Reference::Phi3(phi3::Model::new(&c, vb).unwrap())
        } else if cfg.architecture == "Gemma3ForCausalLM" {
            let c: gemma3::Config = serde_json::from_value(j).unwrap();
            Reference::Gemma3(gemma3::Model::new(false, &c, vb).unwrap())
        } else if cfg.architecture == "Qwen2ForCausalLM" {
            let mut j: serde_json::Value = serde_json::from_str(&cfg.to_hf_json()).unwrap();
            j["sliding_window"] = 4096.into();
            j["max_window_layers"] = 0.into();
            j["use_sliding_window"] = false.into();
            j["hidden_act"] = "silu".into();
            let c: qwen2::Config = serde_json::from_value(j).unwrap();
            Reference::Qwen2(qwen2::ModelForCausalLM::new(&c, vb).unwrap())
        } else {
            let c: llama::LlamaConfig = serde_json::from_str(&cfg.to_hf_json()).unwrap();
            let c = c.into_config(false);
            let cache = llama::Cache::new(true, DType::F32, &c, &Device::Cpu).unwrap();
            Reference::Llama(llama::Llama::load(vb, &c).unwrap(), cache)
        }
    }

    /// Feeds `tokens` at positions `pos..`; returns the last token's logits.
    fn feed(&mut self, tokens: &[u32], pos: usize) -> Vec<f32> {
        let input = Tensor::new(tokens, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = match self {
            Reference::Llama(m, cache) => m.forward(&input, pos, cache).unwrap(),
            Reference::Qwen2(m) => m.forward(&input, pos).unwrap(),
            Reference::Qwen3(m) => m.forward(&input, pos).unwrap(),
            Reference::Qwen3Moe(m) => m.forward(&input, pos).unwrap(),
            Reference::Mixtral(m) => m.forward(&input, pos).unwrap(),
            Reference::Phi3(m) => m.forward(&input, pos).unwrap(),
            Reference::Gemma2(m) => m.forward(&input, pos).unwrap(),
            Reference::Gemma3(m) => {
                // One token at a time: candle's prefill mask lets a local
                // layer see `sliding_window + 1` positions, its decode
                // (through the rotating cache) `sliding_window`, as
                // transformers does.
                let mut last = None;
                for (i, &t) in tokens.iter().enumerate() {
                    let one = Tensor::new(&[t], &Device::Cpu)
                        .unwrap()
                        .unsqueeze(0)
                        .unwrap();
                    last = Some(m.forward(&one, pos + i).unwrap());
                }
                last.unwrap()
            }
        };
        logits.flatten_all().unwrap().to_vec1().unwrap()
    }
}

fn assert_close(ours: &[f32], reference: &[f32], what: &str) {
    assert_eq!(ours.len(), reference.len());
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = ours
        .iter()
        .zip(reference)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= TOLERANCE * scale,
        "{what}: max |ours - reference| = {diff}, relative {} > {TOLERANCE}",
        diff / scale
    );
}

fn argmax(l: &[f32]) -> u32 {
    inferscope_model::sampler::argmax(l)
}

struct Setup {
    cfg: ModelConfig,
    weights: HashMap<String, Tensor>,
    exec: CpuExecutor,
    block_size: usize,
}

fn setup(name: &str, cfg: ModelConfig, shards: usize, block_size: usize) -> Setup {
    let weights = random_weights(&cfg, 1234).unwrap();
    let dir = write_checkpoint(name, &cfg, &weights, shards);
    let opts = ModelOptions {
        kv_cache_memory: Some(8 << 20),
        // The reference's cache is f32: the parity holds to 1e-4 on an f32 pool.
        kv_cache_dtype: KvDtype::F32,
        ..ModelOptions::default()
    };
    let model = LoadedModel::load(dir.to_str().unwrap(), &opts).unwrap();
    assert_eq!(model.model().cfg, cfg);
    let chat = [inferscope_model::ChatMessage {
        role: "user".into(),
        content: "hi".into(),
    }];
    let prompt = model.tokenizer().apply_chat_template(&chat, true).unwrap();
    assert_eq!(
        prompt, "<user>HI<assistant>",
        "the checkpoint's chat template"
    );
    let mut exec = model.cpu_executor().unwrap();
    exec.init_kv_cache(block_size).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Setup {
        cfg,
        weights,
        exec,
        block_size,
    }
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + salt * 11 + 3) % 300)
        .collect()
}

/// Prefill, 20 decode steps, a preemption and recompute: each step's logits
/// against the reference fed the same tokens.
fn prefill_decode_and_recompute(s: &mut Setup) {
    let mut alloc = Alloc::new(0).with_block_size(s.block_size);
    let mut seq = Seq::new(1, &prompt(11, 1), greedy());
    let mut reference = Reference::new(&s.cfg, &s.weights);
    let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
    let ours = s.exec.forward_logits(&batch).unwrap();
    let mut expected = reference.feed(&seq.tokens, 0);
    assert_close(&ours[0], &expected, "prefill");
    for step in 0..20 {
        seq.tokens.push(argmax(&expected));
        seq.num_generated += 1;
        let pos = seq.tokens.len() - 1;
        let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
        let ours = s.exec.forward_logits(&batch).unwrap();
        expected = reference.feed(&seq.tokens[pos..], pos);
        assert_close(&ours[0], &expected, &format!("decode step {step}"));
    }
    // Preemption: the whole sequence comes back as a prefill in new blocks
    // (chunked, 8 tokens a step, as the scheduler may do).
    seq.preempt();
    let mut last = Vec::new();
    while seq.cached < seq.tokens.len() {
        let batch = build_batch(&mut [&mut seq], &mut alloc, 8);
        last = s.exec.forward_logits(&batch).unwrap();
    }
    assert_close(&last[0], &expected, "recompute after preemption");
    seq.tokens.push(argmax(&expected));
    let pos = seq.tokens.len() - 1;
    let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
    let ours = s.exec.forward_logits(&batch).unwrap();
    assert_close(
        &ours[0],
        &reference.feed(&seq.tokens[pos..], pos),
        "decode after recompute",
    );
}

/// Sequences of different lengths in one step, then decodes of some mixed
/// with the prefill of a newcomer, each against the reference alone.
fn batched_sequences(s: &mut Setup) {
    let mut alloc = Alloc::new(1000).with_block_size(s.block_size);
    let lens = [1usize, 6, 13, 4];
    let mut seqs: Vec<Seq> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| Seq::new(i as u64, &prompt(l, i as u32), greedy()))
        .collect();
    let mut refs: Vec<Reference> = lens
        .iter()
        .map(|_| Reference::new(&s.cfg, &s.weights))
        .collect();
    let mut expected: Vec<Vec<f32>> = seqs
        .iter()
        .zip(&mut refs)
        .map(|(q, r)| r.feed(&q.tokens, 0))
        .collect();
    {
        let mut first: Vec<&mut Seq> = seqs[..3].iter_mut().collect();
        let batch = build_batch(&mut first, &mut alloc, 512);
        let ours = s.exec.forward_logits(&batch).unwrap();
        for i in 0..3 {
            assert_close(
                &ours[i],
                &expected[i],
                &format!("batched prefill of seq {i}"),
            );
        }
    }
    for step in 0..3 {
        for i in 0..3 {
            let t = argmax(&expected[i]);
            let pos = seqs[i].tokens.len();
            seqs[i].tokens.push(t);
            seqs[i].num_generated += 1;
            expected[i] = refs[i].feed(&[t], pos);
        }
        let mut all: Vec<&mut Seq> = if step == 0 {
            seqs.iter_mut().collect()
        } else {
            seqs[..3].iter_mut().collect()
        };
        let batch = build_batch(&mut all, &mut alloc, 512);
        let ours = s.exec.forward_logits(&batch).unwrap();
        for (i, l) in ours.iter().enumerate() {
            assert_close(l, &expected[i], &format!("step {step}, seq {i}"));
        }
    }
}

#[test]
fn llama_matches_candle_transformers() {
    let mut s = setup("llama", config("LlamaForCausalLM", false), 1, BLOCK_SIZE);
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

#[test]
fn llama3_rope_scaling_tied_head_sharded_matches() {
    let mut cfg = config("LlamaForCausalLM", true);
    cfg.rope_theta = 500_000.0;
    cfg.rope_scaling = Some(RopeScaling::Llama3(Llama3RopeScaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 16,
    }));
    let mut s = setup("llama3", cfg, 3, BLOCK_SIZE);
    prefill_decode_and_recompute(&mut s);
}

#[test]
fn qwen2_with_attention_bias_matches() {
    // The server's default block size (attention has a fast path for it).
    let mut s = setup("qwen2", config("Qwen2ForCausalLM", false), 2, 16);
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

/// `--dtype bfloat16` and `float16`: dense weights stored in 16 bits,
/// computed in f32. The reference gets the same weights rounded to that type
/// (by candle), so the logits must agree as closely as in f32 — through
/// prefill, decodes, a preemption and batching — while the dense weights take
/// half the bytes.
#[test]
fn bf16_and_f16_weights_match_the_reference_on_the_same_rounded_weights() {
    let cfg = config("LlamaForCausalLM", false);
    let weights = random_weights(&cfg, 1234).unwrap();
    let dir = write_checkpoint("bf16", &cfg, &weights, 1);
    let load = |dtype: &str| {
        let opts = ModelOptions {
            kv_cache_memory: Some(8 << 20),
            dtype: dtype.into(),
            // The reference's cache is f32: the parity holds to 1e-4 on an f32 pool.
            kv_cache_dtype: KvDtype::F32,
            ..ModelOptions::default()
        };
        LoadedModel::load(dir.to_str().unwrap(), &opts).unwrap()
    };
    let f32_model = load("float32");
    for (flag, dtype) in [("bfloat16", DType::BF16), ("float16", DType::F16)] {
        let model = load(flag);
        assert_eq!(
            model.model().weight_bytes() * 2,
            f32_model.model().weight_bytes(),
            "{flag}"
        );
        let mut exec = model.cpu_executor().unwrap();
        exec.init_kv_cache(BLOCK_SIZE).unwrap();
        let rounded = weights
            .iter()
            .map(|(name, t)| {
                let dense = name.ends_with("_proj.weight") || name == "lm_head.weight";
                let t = if dense {
                    t.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap()
                } else {
                    t.clone()
                };
                (name.clone(), t)
            })
            .collect();
        let mut s = Setup {
            cfg: cfg.clone(),
            weights: rounded,
            exec,
            block_size: BLOCK_SIZE,
        };
        prefill_decode_and_recompute(&mut s);
        batched_sequences(&mut s);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--dtype auto` keeps the 16-bit type `config.json` names (`torch_dtype`,
/// or transformers v5's `dtype`), as vLLM does, and f32 otherwise.
#[test]
fn dtype_auto_keeps_the_checkpoints_16_bit_type() {
    let cfg = config("LlamaForCausalLM", false);
    let weights = random_weights(&cfg, 99).unwrap();
    let dir = write_checkpoint("auto-dtype", &cfg, &weights, 1);
    let base: serde_json::Value = serde_json::from_str(&cfg.to_hf_json()).unwrap();
    let bytes_with = |key: Option<(&str, &str)>| {
        let mut c = base.clone();
        if let Some((k, v)) = key {
            c[k] = v.into();
        }
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
        let opts = ModelOptions {
            kv_cache_memory: Some(8 << 20),
            dtype: "auto".into(),
            ..ModelOptions::default()
        };
        let m = LoadedModel::load(dir.to_str().unwrap(), &opts).unwrap();
        m.model().weight_bytes()
    };
    let full = bytes_with(None);
    assert_eq!(bytes_with(Some(("torch_dtype", "float32"))), full);
    assert_eq!(bytes_with(Some(("torch_dtype", "bfloat16"))) * 2, full);
    assert_eq!(bytes_with(Some(("torch_dtype", "float16"))) * 2, full);
    assert_eq!(bytes_with(Some(("dtype", "bfloat16"))) * 2, full);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Mistral's sliding window. With one layer a token's output depends only on
/// the last `WINDOW` tokens, and RoPE only on their relative positions, so
/// each step's logits must equal the reference fed just those tokens from
/// position 0 — through a prefill and decodes, with the window starting
/// mid-block and whole blocks falling out of it.
#[test]
fn sliding_window_sees_only_the_last_window_positions() {
    const WINDOW: usize = 5;
    let mut cfg = config("MistralForCausalLM", false);
    cfg.num_layers = 1;
    cfg.sliding_window = Some(WINDOW);
    let mut s = setup("mistral-window", cfg, 1, BLOCK_SIZE);
    let windowed = |s: &Setup, tokens: &[u32]| {
        Reference::new(&s.cfg, &s.weights).feed(&tokens[tokens.len() - WINDOW..], 0)
    };
    let mut alloc = Alloc::new(0).with_block_size(s.block_size);
    let mut seq = Seq::new(1, &prompt(13, 2), greedy());
    let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
    let ours = s.exec.forward_logits(&batch).unwrap();
    assert_close(&ours[0], &windowed(&s, &seq.tokens), "prefill");
    // The whole sequence gives other logits, so the check can fail.
    let full = Reference::new(&s.cfg, &s.weights).feed(&seq.tokens, 0);
    let diff = ours[0]
        .iter()
        .zip(&full)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff > 1e-2, "the window made no difference ({diff})");
    let mut last = ours[0].clone();
    for step in 0..8 {
        seq.tokens.push(argmax(&last));
        seq.num_generated += 1;
        let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
        last = s.exec.forward_logits(&batch).unwrap().remove(0);
        assert_close(
            &last,
            &windowed(&s, &seq.tokens),
            &format!("decode step {step}"),
        );
    }
}

#[test]
fn greedy_with_others_equals_alone_on_reference_model() {
    let mut s = setup("greedy", config("LlamaForCausalLM", false), 1, BLOCK_SIZE);
    let mut out = inferscope_engine::StepOutput::default();
    let mut alloc = Alloc::new(0);
    let mut alone = Seq::new(9, &prompt(5, 9), greedy());
    for _ in 0..10 {
        let b = build_batch(&mut [&mut alone], &mut alloc, 512);
        s.exec.execute(&b, &mut out).unwrap();
        append(&mut [&mut alone], &b, &out.sampled);
    }
    let mut with = Seq::new(9, &prompt(5, 9), greedy());
    let mut others: Vec<Seq> = (0..5)
        .map(|i| Seq::new(20 + i, &prompt(3 + 4 * i as usize, i as u32), greedy()))
        .collect();
    for _ in 0..10 {
        let mut all: Vec<&mut Seq> = std::iter::once(&mut with)
            .chain(others.iter_mut())
            .collect();
        let b = build_batch(&mut all, &mut alloc, 512);
        s.exec.execute(&b, &mut out).unwrap();
        append(&mut all, &b, &out.sampled);
    }
    assert_eq!(with.tokens, alone.tokens);
}

#[test]
fn loader_errors_name_the_problem() {
    let cfg = config("LlamaForCausalLM", false);
    let mut w = random_weights(&cfg, 1).unwrap();
    let opts = ModelOptions::default();
    let load_err = |name: &str, w: &HashMap<String, Tensor>| {
        let dir = write_checkpoint(name, &cfg, w, 1);
        let e = LoadedModel::load(dir.to_str().unwrap(), &opts)
            .unwrap_err()
            .to_string();
        let _ = std::fs::remove_dir_all(&dir);
        e
    };
    w.insert(
        "model.layers.1.mlp.up_proj.weight".into(),
        Tensor::zeros((7, 64), DType::F32, &Device::Cpu).unwrap(),
    );
    let e = load_err("shape", &w);
    assert!(
        e.contains("model.layers.1.mlp.up_proj.weight")
            && e.contains("[7, 64]")
            && e.contains("[160, 64]"),
        "{e}"
    );
    w.remove("model.norm.weight");
    w.remove("model.layers.1.mlp.up_proj.weight");
    let e = load_err("missing", &w);
    assert!(e.contains("missing tensor") && e.contains("up_proj"), "{e}");

    let dir = std::env::temp_dir().join(format!("inferscope-ref-none-{}", std::process::id()));
    let e = LoadedModel::load(dir.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing file") && e.contains("inferscope-ref-none"),
        "{e}"
    );
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures":["MambaForCausalLM"]}"#,
    )
    .unwrap();
    let e = LoadedModel::load(dir.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("MambaForCausalLM"), "{e}");
    std::fs::write(dir.join("config.json"), cfg.to_hf_json()).unwrap();
    let e = LoadedModel::load(dir.to_str().unwrap(), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hf_tokenizer_round_trips() {
    let dir = std::env::temp_dir().join(format!("inferscope-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer_json(300)).unwrap();
    let t = inferscope_model::HfTokenizer::from_file(&path, vec![2], Some(1)).unwrap();
    use inferscope_model::Tokenizer;
    assert_eq!(t.encode("t5 t17 t299", false).unwrap(), vec![5, 17, 299]);
    assert_eq!(t.vocab_size(), 300);
    assert_eq!(t.eos_token_ids(), vec![2]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shipped demo model (`models/demo`, bf16 on disk, tied LM head, GQA
/// 6:2) against candle-transformers on the same weights, through the loader.
#[test]
fn shipped_demo_model_matches_candle_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let opts = ModelOptions {
        kv_cache_memory: Some(64 << 20),
        // The reference's cache is f32: the parity holds to 1e-4 on an f32 pool.
        kv_cache_dtype: KvDtype::F32,
        ..ModelOptions::default()
    };
    let model = LoadedModel::load(dir.to_str().unwrap(), &opts).unwrap();
    let cfg = model.model().cfg.clone();
    assert!(cfg.tie_word_embeddings && cfg.num_kv_heads < cfg.num_heads);
    let weights = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.to_dtype(DType::F32).unwrap()))
        .collect();
    let mut exec = model.cpu_executor().unwrap();
    exec.init_kv_cache(16).unwrap();
    let mut s = Setup {
        cfg,
        weights,
        exec,
        block_size: 16,
    };
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

/// Qwen3's per-head q/k RMSNorms, through prefill, decodes, a preemption
/// and batching.
#[test]
fn qwen3_with_qk_norm_matches() {
    let mut s = setup("qwen3", qwen3_config(), 1, 16);
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

/// Gemma 3: the (1 + w) norms, scaled embeddings, GeGLU, post norms, q/k
/// norms, and local layers with their own RoPE base beside a global one.
/// The prompts (11 tokens, then 20 decodes; 13 in the batch) run past the
/// window of 6, so local and global layers see different contexts.
#[test]
fn gemma3_matches_candle_transformers_past_the_window() {
    let mut s = setup("gemma3", gemma3_config(), 1, 16);
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

/// The window matters in this test (so the test above can fail on it): the
/// same checkpoint without a window gives other logits past it.
#[test]
fn gemma3_window_changes_the_logits() {
    let cfg = gemma3_config();
    let w = random_weights(&cfg, 1234).unwrap();
    let tokens = prompt(13, 1);
    let windowed = Reference::new(&cfg, &w).feed(&tokens, 0);
    let mut wide = cfg.clone();
    wide.sliding_window = Some(64);
    let full = Reference::new(&wide, &w).feed(&tokens, 0);
    let diff = windowed
        .iter()
        .zip(&full)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff > 1e-2, "the window made no difference ({diff})");
}

/// A multimodal Gemma 3 checkpoint (`Gemma3ForConditionalGeneration`: the
/// text model's config under `text_config`, its weights under
/// `model.language_model.`, plus a vision tower that is not loaded) gives
/// the logits of the text-only checkpoint.
#[test]
fn gemma3_conditional_generation_loads_its_text_model() {
    let cfg = gemma3_config();
    let w = random_weights(&cfg, 1234).unwrap();
    let dir = write_checkpoint("gemma3-mm", &cfg, &w, 1);
    let mut text: serde_json::Value = serde_json::from_str(&cfg.to_hf_json()).unwrap();
    text.as_object_mut().unwrap().remove("architectures");
    text["model_type"] = "gemma3_text".into();
    let top = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": {"hidden_size": 16},
    });
    std::fs::write(dir.join("config.json"), top.to_string()).unwrap();
    let mut mm: HashMap<String, Tensor> = w
        .iter()
        .map(|(n, t)| (n.replacen("model.", "model.language_model.", 1), t.clone()))
        .collect();
    mm.insert(
        "model.vision_tower.vision_model.post_layernorm.weight".into(),
        Tensor::zeros(16, DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&mm, dir.join("model.safetensors")).unwrap();
    let opts = ModelOptions {
        kv_cache_memory: Some(8 << 20),
        // The reference's cache is f32: the parity holds to 1e-4 on an f32 pool.
        kv_cache_dtype: KvDtype::F32,
        ..ModelOptions::default()
    };
    let model = LoadedModel::load(dir.to_str().unwrap(), &opts).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let mut want = cfg.clone();
    want.architecture = "Gemma3ForConditionalGeneration".into();
    assert_eq!(model.model().cfg, want);
    let mut exec = model.cpu_executor().unwrap();
    exec.init_kv_cache(16).unwrap();
    let mut alloc = Alloc::new(0).with_block_size(16);
    let mut seq = Seq::new(1, &prompt(11, 1), greedy());
    let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
    let ours = exec.forward_logits(&batch).unwrap();
    let expected = Reference::new(&cfg, &w).feed(&seq.tokens, 0);
    assert_close(&ours[0], &expected, "multimodal checkpoint's text model");
}

/// `query_pre_attn_scalar` (which candle-transformers' Gemma 3 ignores):
/// scores scaled by `1/√(4·head_dim)` equal scores of queries halved, which
/// halving the q-norm weights does (Gemma's stored `w` becomes `(1+w)/2 − 1`).
#[test]
fn gemma3_query_pre_attn_scalar_scales_the_scores() {
    let mut cfg = gemma3_config();
    cfg.arch.query_pre_attn_scalar = Some(4 * cfg.head_dim);
    let w = random_weights(&cfg, 1234).unwrap();
    let mut halved_cfg = cfg.clone();
    halved_cfg.arch.query_pre_attn_scalar = Some(cfg.head_dim);
    let mut halved = w.clone();
    for l in 0..cfg.num_layers {
        let name = format!("model.layers.{l}.self_attn.q_norm.weight");
        let t = ((&w[&name] + 1.0).unwrap() * 0.5).unwrap();
        halved.insert(name, (t - 1.0).unwrap());
    }
    let run = |cfg: &ModelConfig, w: &HashMap<String, Tensor>| {
        let m = inferscope_model::loader::model_from_tensors(cfg.clone(), w.clone()).unwrap();
        let mut exec = CpuExecutor::new(
            "t".into(),
            std::sync::Arc::new(m),
            inferscope_model::KvBudget::Bytes(4 << 20),
            vec![2],
            None,
        )
        .unwrap();
        exec.init_kv_cache(16).unwrap();
        let mut seq = Seq::new(1, &prompt(11, 1), greedy());
        let batch = build_batch(&mut [&mut seq], &mut Alloc::new(0).with_block_size(16), 512);
        exec.forward_logits(&batch).unwrap().remove(0)
    };
    let (scaled, reference) = (run(&cfg, &w), run(&halved_cfg, &halved));
    assert_close(&scaled, &reference, "query_pre_attn_scalar = 4·head_dim");
    let plain = run(&halved_cfg, &w);
    let diff = plain
        .iter()
        .zip(&scaled)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff > 1e-2, "the scalar made no difference ({diff})");
}

/// Qwen3-MoE: dense and MoE layers alternating, top-3 of 8 experts without
/// renormalisation, through prefill, decodes, a preemption and batching
/// (where a step's tokens go to different experts).
#[test]
fn qwen3_moe_matches_candle_transformers() {
    let mut s = setup("qwen3moe", qwen3_moe_config(), 1, 16);
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

/// Mixtral: every layer top-2 of 8 experts, softmax over the chosen two.
#[test]
fn mixtral_matches_candle_transformers() {
    let mut s = setup("mixtral", mixtral_config(), 2, BLOCK_SIZE);
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

/// Phi-3: q/k/v fused in `qkv_proj` and gate/up in `gate_up_proj` (split by
/// the product's rows, never copied apart), through prefill, decodes, a
/// preemption and batching.
#[test]
fn phi3_fused_projections_match() {
    let mut s = setup("phi3", config("Phi3ForCausalLM", false), 1, 16);
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

/// Phi-3's 128k models (LongRoPE) are refused by name, not run as 4k ones.
#[test]
fn phi3_longrope_is_refused() {
    let mut j: serde_json::Value =
        serde_json::from_str(&config("Phi3ForCausalLM", false).to_hf_json()).unwrap();
    j["rope_scaling"] = serde_json::json!({"type": "longrope", "short_factor": [1.0, 1.0, 1.0, 1.0],
        "long_factor": [2.0, 2.0, 2.0, 2.0]});
    let e = ModelConfig::from_hf_json(&j.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"longrope\""), "{e}");
    j["rope_scaling"] = serde_json::Value::Null;
    j["partial_rotary_factor"] = 0.75.into();
    let e = ModelConfig::from_hf_json(&j.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("partial_rotary_factor"), "{e}");
}

/// Gemma 2: the soft-caps and (1 + w) pre/post norms, through prefill,
/// decodes, a preemption and batching.
#[test]
fn gemma2_softcapping_matches() {
    let mut s = setup("gemma2", gemma2_config(), 1, 16);
    prefill_decode_and_recompute(&mut s);
    batched_sequences(&mut s);
}

/// Gemma 2's local layers: a one-layer model (layer 0 is local) sees only
/// the last `WINDOW` tokens, so each step's logits equal the reference fed
/// just those from position 0 (RoPE depends on relative positions only).
#[test]
fn gemma2_local_layer_sees_only_its_window() {
    const WINDOW: usize = 5;
    let mut cfg = gemma2_config();
    cfg.num_layers = 1;
    cfg.sliding_window = Some(WINDOW);
    let mut s = setup("gemma2-window", cfg, 1, BLOCK_SIZE);
    let mut wide = s.cfg.clone();
    wide.sliding_window = Some(64);
    let windowed = |tokens: &[u32]| {
        Reference::new(&wide, &s.weights).feed(&tokens[tokens.len() - WINDOW..], 0)
    };
    let mut alloc = Alloc::new(0).with_block_size(s.block_size);
    let mut seq = Seq::new(1, &prompt(13, 2), greedy());
    let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
    let mut last = s.exec.forward_logits(&batch).unwrap().remove(0);
    assert_close(&last, &windowed(&seq.tokens), "prefill");
    let full = Reference::new(&wide, &s.weights).feed(&seq.tokens, 0);
    let diff = last
        .iter()
        .zip(&full)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff > 1e-2, "the window made no difference ({diff})");
    for step in 0..6 {
        seq.tokens.push(argmax(&last));
        seq.num_generated += 1;
        let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
        last = s.exec.forward_logits(&batch).unwrap().remove(0);
        assert_close(
            &last,
            &windowed(&seq.tokens),
            &format!("decode step {step}"),
        );
    }
}

/// Log-softmax of `l`, in f64, from the definition.
fn log_softmax(l: &[f32]) -> Vec<f64> {
    let z: f64 = l.iter().map(|&x| f64::from(x).exp()).sum();
    l.iter().map(|&x| f64::from(x) - z.ln()).collect()
}

/// Absolute tolerance on a log-probability: the logits agree within
/// `TOLERANCE` × their largest magnitude, and a log-softmax moves by at
/// most twice the largest logit error.
fn logprob_tolerance(reference: &[f32]) -> f64 {
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
    2.0 * f64::from(TOLERANCE * scale) + 1e-6
}

/// The executor's log-probabilities (`--logprobs-mode raw_logprobs`) are
/// the log-softmax of the reference forward pass's logits: every prompt
/// position's (`prompt_logprobs`: the next prompt token's value and the top
/// 3) and each greedy token's (its value and the top 5), over a prefill and
/// 6 decode steps, with `logit_bias` and a temperature that must not change
/// them.
#[test]
fn logprobs_are_the_log_softmax_of_the_reference_logits() {
    use inferscope_engine::{PromptRows, SamplingParams, StepOutput};
    let mut s = setup("llama-lp", config("LlamaForCausalLM", false), 1, BLOCK_SIZE);
    let mut alloc = Alloc::new(0).with_block_size(s.block_size);
    let params = SamplingParams {
        temperature: 0.0,
        logprobs: Some(5),
        prompt_logprobs: Some(3),
        // Raw values: the bias steers the sample, not the reported values.
        logit_bias: vec![(7, 3.0)],
        ..SamplingParams::default()
    };
    let tokens = prompt(9, 4);
    let mut seq = Seq::new(1, &tokens, params);
    let mut reference = Reference::new(&s.cfg, &s.weights);
    // The reference one position at a time: the logits of every position.
    let per_pos: Vec<Vec<f32>> = (0..tokens.len())
        .map(|p| reference.feed(&tokens[p..p + 1], p))
        .collect();
    let mut batch = build_batch(&mut [&mut seq], &mut alloc, 512);
    batch.seqs[0].prompt_rows = Some(PromptRows {
        start: 0,
        end: tokens.len() - 1,
        next_token: tokens[tokens.len() - 1],
    });
    let mut out = StepOutput::default();
    s.exec.execute(&batch, &mut out).unwrap();
    let (prompt_rows, sampled): (Vec<_>, Vec<_>) = out.logprobs.iter().partition(|r| r.prompt);
    assert_eq!(prompt_rows.len(), tokens.len() - 1);
    assert_eq!(sampled.len(), 1);
    let check =
        |row: &inferscope_engine::PositionLogprobs, logits: &[f32], n: usize, what: &str| {
            let want = log_softmax(logits);
            let tol = logprob_tolerance(logits);
            let got = f64::from(row.logprob);
            let exp = want[row.token_id as usize];
            assert!(
                (got - exp).abs() <= tol,
                "{what}: {got} vs {exp} (tolerance {tol})"
            );
            let mut order: Vec<usize> = (0..want.len()).collect();
            order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
            assert_eq!(row.top.len(), n, "{what}");
            for (k, &(id, v)) in row.top.iter().enumerate() {
                assert_eq!(id as usize, order[k], "{what}: rank {k}");
                assert!(
                    (f64::from(v) - want[id as usize]).abs() <= tol,
                    "{what}: top {k}"
                );
            }
            let rank = 1 + want.iter().filter(|&&w| w > exp).count() as u32;
            assert_eq!(row.rank, rank, "{what}: rank");
        };
    for r in &prompt_rows {
        assert_eq!(r.logprobs.token_id, tokens[r.position + 1], "target");
        check(
            &r.logprobs,
            &per_pos[r.position],
            3,
            &format!("prompt {}", r.position),
        );
    }
    let mut expected = per_pos[tokens.len() - 1].clone();
    let mut token = out.sampled[0].unwrap();
    check(&sampled[0].logprobs, &expected, 5, "prefill sample");
    for step in 0..6 {
        // The biased token is the sample whenever it wins with +3.
        let mut biased = expected.clone();
        biased[7] += 3.0;
        assert_eq!(
            token,
            argmax(&biased),
            "step {step}: greedy over the biased logits"
        );
        seq.tokens.push(token);
        seq.num_generated += 1;
        let pos = seq.tokens.len() - 1;
        let batch = build_batch(&mut [&mut seq], &mut alloc, 512);
        s.exec.execute(&batch, &mut out).unwrap();
        expected = reference.feed(&seq.tokens[pos..], pos);
        assert_eq!(out.logprobs.len(), 1, "no prompt rows after the prefill");
        check(
            &out.logprobs[0].logprobs,
            &expected,
            5,
            &format!("decode {step}"),
        );
        token = out.sampled[0].unwrap();
    }
}
