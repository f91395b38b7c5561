//! The built-in models, so `inferscope serve` runs with no download:
//! `demo`, a tiny Llama trained on *Pride and Prejudice* (the files of
//! `models/demo`, embedded in the binary; see docs/demo-model.md), and
//! `demo-random`, the same architecture over a byte vocabulary with weights
//! generated from a fixed seed, whose text is not meaningful.

use std::collections::HashMap;

use candle_core::{Device, Tensor};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::llama::LlamaModel;
use crate::loader::model_from_tensors;
use crate::tokenizer::{ByteTokenizer, HfTokenizer};

/// The spec (`--model`) and name of the trained demo model.
pub const DEMO: &str = "demo";
/// The spec and name of the random-weight demo model.
pub const DEMO_RANDOM: &str = "demo-random";

macro_rules! shipped {
    ($file:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/", $file)
    };
}

/// The trained demo model's `config.json`.
pub const TRAINED_CONFIG_JSON: &str = include_str!(shipped!("config.json"));
/// Its `tokenizer.json` (byte-level BPE trained on the book).
pub const TRAINED_TOKENIZER_JSON: &str = include_str!(shipped!("tokenizer.json"));
/// Its `tokenizer_config.json` (chat template, BOS/EOS names).
pub const TRAINED_TOKENIZER_CONFIG_JSON: &str = include_str!(shipped!("tokenizer_config.json"));
/// Its `generation_config.json`.
pub const TRAINED_GENERATION_CONFIG_JSON: &str = include_str!(shipped!("generation_config.json"));
/// Its weights (bf16 safetensors).
pub const TRAINED_WEIGHTS: &[u8] = include_bytes!(shipped!("model.safetensors"));

/// The trained demo model and its tokenizer, from the embedded files,
/// through the same path as a Hugging Face directory.
pub fn trained_demo_model() -> Result<(LlamaModel, HfTokenizer), ModelError> {
    let tensors = candle_core::safetensors::load_buffer(TRAINED_WEIGHTS, &Device::Cpu)
        .map_err(|e| ModelError::Config(format!("embedded demo weights: {e}")))?;
    let tokenizer = TRAINED_TOKENIZER_JSON
        .parse::<tokenizers::Tokenizer>()
        .map_err(|e| ModelError::Tokenizer(format!("embedded demo tokenizer: {e}")))?;
    crate::loader::assemble(
        ModelConfig::from_hf_json(TRAINED_CONFIG_JSON)?,
        tensors,
        tokenizer,
        Some(TRAINED_TOKENIZER_CONFIG_JSON),
        Some(TRAINED_GENERATION_CONFIG_JSON),
    )
}

/// The seed of the demo weights.
pub const DEMO_SEED: u64 = 0x1f5c_09e5;

/// The random demo model's hyper-parameters (~3M parameters).
pub fn demo_config() -> ModelConfig {
    ModelConfig {
        architecture: "LlamaForCausalLM".into(),
        vocab_size: ByteTokenizer::VOCAB_SIZE,
        hidden_size: 256,
        intermediate_size: 688,
        num_layers: 4,
        num_heads: 8,
        num_kv_heads: 4,
        head_dim: 32,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_interleaved: false,
        max_position_embeddings: 4096,
        tie_word_embeddings: false,
        attention_bias: false,
        bos_token_id: Some(ByteTokenizer::BOS),
        eos_token_ids: vec![ByteTokenizer::EOS],
        sliding_window: None,
        arch: Default::default(),
    }
}

/// SplitMix64: a tiny, stable generator for weights and sampling.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn uniform(rng: &mut SplitMix64, n: usize, std: f32) -> Vec<f32> {
    // Uniform on [-a, a] has standard deviation a/√3.
    let a = std * 3f32.sqrt();
    (0..n).map(|_| (rng.next_f32() * 2.0 - 1.0) * a).collect()
}

fn tensor(data: Vec<f32>, shape: &[usize]) -> Result<Tensor, ModelError> {
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// Random weights for `cfg`, named as in Hugging Face checkpoints of its
/// family (Llama's tensors, plus Qwen3's and Gemma's q/k norms and Gemma's
/// pre/post-feedforward norms). Scaled by 1/√fan_in so activations stay
/// O(1) through the layers; norm weights are near 1 (stored as `w - 1`
/// where the family's checkpoints do).
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> Result<HashMap<String, Tensor>, ModelError> {
    let mut rng = SplitMix64::new(seed);
    let mut m = HashMap::new();
    let (h, v, i) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let q_dim = cfg.num_heads * cfg.head_dim;
    let kv_dim = cfg.num_kv_heads * cfg.head_dim;
    let lin = |m: &mut HashMap<String, Tensor>,
               rng: &mut SplitMix64,
               name: String,
               out: usize,
               inp: usize| {
        let w = uniform(rng, out * inp, 1.0 / (inp as f32).sqrt());
        m.insert(name, tensor(w, &[out, inp])?);
        Ok::<(), ModelError>(())
    };
    let stored_one = if cfg.arch.norm_offset { 0.0 } else { 1.0 };
    let norm = |rng: &mut SplitMix64, n: usize| -> Vec<f32> {
        uniform(rng, n, 0.1)
            .into_iter()
            .map(|x| stored_one + x)
            .collect()
    };
    m.insert(
        "model.embed_tokens.weight".into(),
        tensor(uniform(&mut rng, v * h, 1.0), &[v, h])?,
    );
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        m.insert(
            format!("{p}.input_layernorm.weight"),
            tensor(norm(&mut rng, h), &[h])?,
        );
        lin(
            &mut m,
            &mut rng,
            format!("{p}.self_attn.q_proj.weight"),
            q_dim,
            h,
        )?;
        lin(
            &mut m,
            &mut rng,
            format!("{p}.self_attn.k_proj.weight"),
            kv_dim,
            h,
        )?;
        lin(
            &mut m,
            &mut rng,
            format!("{p}.self_attn.v_proj.weight"),
            kv_dim,
            h,
        )?;
        if cfg.attention_bias {
            for (n, d) in [("q", q_dim), ("k", kv_dim), ("v", kv_dim)] {
                m.insert(
                    format!("{p}.self_attn.{n}_proj.bias"),
                    tensor(uniform(&mut rng, d, 0.1), &[d])?,
                );
            }
        }
        if cfg.arch.qk_norm {
            for n in ["q_norm", "k_norm"] {
                let d = cfg.head_dim;
                m.insert(
                    format!("{p}.self_attn.{n}.weight"),
                    tensor(norm(&mut rng, d), &[d])?,
                );
            }
        }
        lin(
            &mut m,
            &mut rng,
            format!("{p}.self_attn.o_proj.weight"),
            h,
            q_dim,
        )?;
        m.insert(
            format!("{p}.post_attention_layernorm.weight"),
            tensor(norm(&mut rng, h), &[h])?,
        );
        if cfg.arch.post_norms {
            for n in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
                m.insert(format!("{p}.{n}.weight"), tensor(norm(&mut rng, h), &[h])?);
            }
        }
        match &cfg.arch.moe {
            Some(moe) if cfg.layer_is_moe(l) => {
                let names = crate::loader::hf_expert_names(&cfg.architecture);
                let (b, ei) = (format!("{p}.{}", names.block), moe.expert_intermediate_size);
                lin(
                    &mut m,
                    &mut rng,
                    format!("{b}.gate.weight"),
                    moe.num_experts,
                    h,
                )?;
                for e in 0..moe.num_experts {
                    let name = |w: &str| format!("{b}.experts.{e}.{w}.weight");
                    lin(&mut m, &mut rng, name(names.gate), ei, h)?;
                    lin(&mut m, &mut rng, name(names.up), ei, h)?;
                    lin(&mut m, &mut rng, name(names.down), h, ei)?;
                }
            }
            _ => {
                lin(&mut m, &mut rng, format!("{p}.mlp.gate_proj.weight"), i, h)?;
                lin(&mut m, &mut rng, format!("{p}.mlp.up_proj.weight"), i, h)?;
                lin(&mut m, &mut rng, format!("{p}.mlp.down_proj.weight"), h, i)?;
            }
        }
    }
    if cfg.architecture == "Phi3ForCausalLM" {
        // Phi-3 checkpoints fuse q/k/v and gate/up along the output rows.
        for l in 0..cfg.num_layers {
            let p = format!("model.layers.{l}");
            let mut fuse = |parts: &[&str], name: &str| -> Result<(), ModelError> {
                let ts = parts
                    .iter()
                    .map(|n| {
                        m.remove(&format!("{p}.{n}.weight"))
                            .expect("generated above")
                    })
                    .collect::<Vec<_>>();
                m.insert(format!("{p}.{name}.weight"), Tensor::cat(&ts, 0)?);
                Ok(())
            };
            fuse(
                &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
                "self_attn.qkv_proj",
            )?;
            fuse(&["mlp.gate_proj", "mlp.up_proj"], "mlp.gate_up_proj")?;
        }
    }
    m.insert("model.norm.weight".into(), tensor(norm(&mut rng, h), &[h])?);
    if !cfg.tie_word_embeddings {
        lin(&mut m, &mut rng, "lm_head.weight".into(), v, h)?;
    }
    Ok(m)
}

/// The random demo model (`demo-random`): [`demo_config`] with [`DEMO_SEED`]
/// weights whose LM head favours printable ASCII, so that its (meaningless)
/// text is readable.
pub fn demo_model() -> Result<LlamaModel, ModelError> {
    let cfg = demo_config();
    let mut w = random_weights(&cfg, DEMO_SEED)?;
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let mut rng = SplitMix64::new(DEMO_SEED ^ 0xdead_beef);
    // Rows of printable bytes get large weights and every other row zero,
    // so almost all probability mass sits on printable ASCII (and EOS is
    // practically never sampled: generation runs to max_tokens).
    let mut head = vec![0f32; v * h];
    for tok in 0..v {
        let printable = (0x20..0x7f).contains(&tok) || tok == usize::from(b'\n');
        if printable {
            head[tok * h..(tok + 1) * h].copy_from_slice(&uniform(&mut rng, h, 0.25));
        }
    }
    w.insert("lm_head.weight".into(), tensor(head, &[v, h])?);
    model_from_tensors(cfg, w)
}
