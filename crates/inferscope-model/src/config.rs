//! The model hyper-parameters, read from `config.json` or GGUF metadata.

use serde_json::Value;

use crate::error::ModelError;

/// Llama-3 style frequency-dependent RoPE scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct Llama3RopeScaling {
    /// Divides the low frequencies.
    pub factor: f32,
    /// Wavelength threshold (in units of the original context) of the low band.
    pub low_freq_factor: f32,
    /// Wavelength threshold of the high band.
    pub high_freq_factor: f32,
    /// The context length the model was pre-trained with.
    pub original_max_position_embeddings: usize,
}

/// RoPE frequency scaling (of the global layers, where a family has local
/// ones with their own base).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Llama-3's frequency-dependent scaling.
    Llama3(Llama3RopeScaling),
    /// Every frequency divided by `factor` (`linear`: Gemma 3 4B–27B).
    Linear {
        /// The divisor.
        factor: f32,
    },
}

/// The gated MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// `silu(gate) · up` (Llama, Mistral, Qwen, Phi-3).
    #[default]
    Silu,
    /// `gelu_tanh(gate) · up` (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

/// What a family changes in the Llama decoder layer, resolved at load so
/// the forward pass only reads flags and numbers (the default: Llama).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ArchOptions {
    /// RMSNorms over each head of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorms of the attention and MLP outputs before each residual add
    /// (Gemma 2 and 3's `post_attention_layernorm`/`post_feedforward_layernorm`).
    pub post_norms: bool,
    /// Hugging Face checkpoints store Gemma's RMSNorm weights as `w - 1`
    /// (the layer computes `x̂ · (1 + w)`); the loader adds the 1 back once.
    pub norm_offset: bool,
    /// Embeddings are multiplied by `√hidden_size` (Gemma).
    pub embed_scale: bool,
    /// The gated MLP's activation.
    pub activation: Activation,
    /// Attention scores are scaled by `1/√this` instead of `1/√head_dim`
    /// (Gemma's `query_pre_attn_scalar`).
    pub query_pre_attn_scalar: Option<usize>,
    /// Attention scores become `cap · tanh(s / cap)` (Gemma 2).
    pub attn_logit_softcapping: Option<f32>,
    /// Final logits become `cap · tanh(l / cap)` (Gemma 2).
    pub final_logit_softcapping: Option<f32>,
    /// With a `sliding_window`: every `n`-th layer (the n-th, 2n-th, ...)
    /// attends to the whole sequence, the others through the window
    /// (Gemma 2: 2, Gemma 3: 6); `None`: every layer uses the window.
    pub sliding_window_pattern: Option<usize>,
    /// RoPE base of the sliding-window layers (Gemma 3's
    /// `rope_local_base_freq`); `None`: `rope_theta`.
    pub rope_local_theta: Option<f32>,
    /// Sparse mixture-of-experts MLPs (Qwen3-MoE, Mixtral); `None`: dense.
    pub moe: Option<MoeOptions>,
}

/// A sparse mixture-of-experts MLP: a router scores the experts per token,
/// the token goes through the `experts_per_token` best (softmax over all
/// experts, then top-k), and their outputs are summed weighted by those
/// probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeOptions {
    /// Experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token goes through (top-k).
    pub experts_per_token: usize,
    /// Width of one expert's gated MLP.
    pub expert_intermediate_size: usize,
    /// The top-k probabilities are renormalised to sum to 1 (Mixtral always,
    /// which is its softmax over the chosen logits; Qwen3-MoE's `norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// Every `n`-th layer (the n-th, 2n-th, ...) is a MoE layer
    /// (Qwen3-MoE's `decoder_sparse_step`; 1: all).
    pub sparse_step: usize,
    /// Layers with a dense MLP whatever the step (Qwen3-MoE's `mlp_only_layers`).
    pub dense_layers: Vec<usize>,
}

/// Hyper-parameters of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The architecture name (`LlamaForCausalLM`, ...).
    pub architecture: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE scaling, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// RoPE rotates adjacent pairs (GGUF layout) instead of halves (HF layout).
    pub rope_interleaved: bool,
    /// Longest supported sequence.
    pub max_position_embeddings: usize,
    /// The LM head is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections have biases (Qwen2).
    pub attention_bias: bool,
    /// BOS id from the config.
    pub bos_token_id: Option<u32>,
    /// EOS ids from the config.
    pub eos_token_ids: Vec<u32>,
    /// Each token attends to at most this many positions, itself included
    /// (Mistral's sliding window); `None`: the whole sequence.
    pub sliding_window: Option<usize>,
    /// What the family changes in the layer.
    pub arch: ArchOptions,
}

/// The decoder families this forward pass runs: `config.json`'s
/// architecture, its `model_type`, and GGUF's `general.architecture`.
const FAMILIES: &[(&str, &str, Option<&str>)] = &[
    ("LlamaForCausalLM", "llama", Some("llama")),
    ("MistralForCausalLM", "mistral", Some("mistral")),
    ("Qwen2ForCausalLM", "qwen2", Some("qwen2")),
    ("Qwen3ForCausalLM", "qwen3", Some("qwen3")),
    ("Gemma2ForCausalLM", "gemma2", Some("gemma2")),
    ("Gemma3ForCausalLM", "gemma3_text", Some("gemma3")),
    ("Gemma3ForConditionalGeneration", "gemma3", None),
    ("Phi3ForCausalLM", "phi3", Some("phi3")),
    ("Qwen3MoeForCausalLM", "qwen3_moe", Some("qwen3moe")),
    // GGUF writes Mixtral as `llama` with experts (`llama.expert_count`).
    ("MixtralForCausalLM", "mixtral", None),
];

/// The `config.json` architecture of a GGUF `general.architecture`.
pub fn architecture_of_gguf(arch: &str) -> Option<&'static str> {
    FAMILIES
        .iter()
        .find(|(_, _, g)| *g == Some(arch))
        .map(|(a, _, _)| *a)
}

/// The architectures that load, for error messages.
pub fn supported_architectures() -> String {
    let hf: Vec<&str> = FAMILIES.iter().map(|(a, _, _)| *a).collect();
    let gguf: Vec<&str> = FAMILIES.iter().filter_map(|(_, _, g)| *g).collect();
    format!("{}; GGUF: {}", hf.join(", "), gguf.join(", "))
}

/// What transformers' config class of each family assumes for a field the
/// file leaves out (only the fields whose default is not the generic one
/// below, and which real checkpoints do leave out).
fn family_defaults(architecture: &str) -> Value {
    match architecture {
        "Gemma2ForCausalLM" => serde_json::json!({
            "head_dim": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
            "query_pre_attn_scalar": 256, "sliding_window": 4096,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
            "tie_word_embeddings": true, "max_position_embeddings": 8192,
        }),
        "Gemma3ForCausalLM" | "Gemma3ForConditionalGeneration" => serde_json::json!({
            "vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
            "head_dim": 256, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0,
            "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256, "sliding_window": 4096,
            "sliding_window_pattern": 6, "tie_word_embeddings": true,
            "max_position_embeddings": 131_072,
        }),
        _ => serde_json::json!({}),
    }
}

fn get_usize(v: &Value, key: &str) -> Result<usize, ModelError> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| ModelError::Config(format!("missing or invalid integer field {key:?}")))
}

fn get_f32(v: &Value, key: &str) -> Option<f32> {
    v.get(key).and_then(Value::as_f64).map(|x| x as f32)
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// A RoPE description: transformers v4's `rope_scaling` object or one
/// entry of v5's `rope_parameters` (which also holds `rope_theta`). Returns
/// the base if given, and the Llama-3 scaling if any; a type this forward
/// pass does not implement is an error, never ignored.
fn parse_rope(rs: &Value, field: &str) -> Result<(Option<f32>, Option<RopeScaling>), ModelError> {
    if rs.is_null() {
        return Ok((None, None));
    }
    let theta = get_f32(rs, "rope_theta");
    let kind = rs
        .get("rope_type")
        .or_else(|| rs.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let scaling = match kind {
        "default" => None,
        "llama3" => {
            let f = |k: &str| {
                get_f32(rs, k)
                    .ok_or_else(|| ModelError::Config(format!("{field} (llama3) lacks {k:?}")))
            };
            Some(RopeScaling::Llama3(Llama3RopeScaling {
                factor: f("factor")?,
                low_freq_factor: f("low_freq_factor")?,
                high_freq_factor: f("high_freq_factor")?,
                original_max_position_embeddings: get_usize(
                    rs,
                    "original_max_position_embeddings",
                )?,
            }))
        }
        "linear" => match get_f32(rs, "factor") {
            Some(factor) if factor > 0.0 => Some(RopeScaling::Linear { factor }),
            _ => {
                return Err(ModelError::Config(format!(
                    "{field} (linear) needs a positive \"factor\""
                )));
            }
        },
        other => {
            return Err(ModelError::Config(format!(
                "unsupported rope type {other:?} in {field} (supported: default, llama3, linear)"
            )));
        }
    };
    Ok((theta, scaling))
}

/// Gemma's `layer_types` (`sliding_attention`/`full_attention` per layer)
/// as a period: every `n`-th layer full. `Ok(None)`: all sliding; an
/// error when the layers follow no such period.
fn pattern_of_layer_types(types: &[Value]) -> Result<Option<usize>, ModelError> {
    let full: Vec<bool> = types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(true),
            Some("sliding_attention") => Ok(false),
            _ => Err(ModelError::Config(format!(
                "unsupported layer type {t} in layer_types (supported: full_attention, sliding_attention)"
            ))),
        })
        .collect::<Result<_, _>>()?;
    let Some(first) = full.iter().position(|&f| f) else {
        return Ok(None);
    };
    let n = first + 1;
    if full
        .iter()
        .enumerate()
        .any(|(l, &f)| f != (l + 1).is_multiple_of(n))
    {
        return Err(ModelError::Config(
            "layer_types: only a periodic pattern (every n-th layer full_attention) is supported"
                .into(),
        ));
    }
    Ok(Some(n))
}

/// The experts of a MoE family's `config.json` (transformers' defaults for
/// the fields left out); `None` for a dense family.
fn moe_of_hf(architecture: &str, v: &Value) -> Result<Option<MoeOptions>, ModelError> {
    let opt = |k: &str, default: usize| match v.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(_) => get_usize(v, k),
    };
    let moe = match architecture {
        "MixtralForCausalLM" => MoeOptions {
            num_experts: opt("num_local_experts", 8)?,
            experts_per_token: opt("num_experts_per_tok", 2)?,
            expert_intermediate_size: get_usize(v, "intermediate_size")?,
            norm_topk_prob: true,
            sparse_step: 1,
            dense_layers: Vec::new(),
        },
        "Qwen3MoeForCausalLM" => MoeOptions {
            num_experts: opt("num_experts", 128)?,
            experts_per_token: opt("num_experts_per_tok", 8)?,
            expert_intermediate_size: get_usize(v, "moe_intermediate_size")?,
            norm_topk_prob: v
                .get("norm_topk_prob")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            sparse_step: opt("decoder_sparse_step", 1)?,
            dense_layers: match v.get("mlp_only_layers") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|l| l.as_u64().map(|l| l as usize))
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        ModelError::Config("mlp_only_layers must list layer numbers".into())
                    })?,
                Some(other) => {
                    return Err(ModelError::Config(format!(
                        "mlp_only_layers must list layer numbers, got {other}"
                    )));
                }
            },
        },
        _ => return Ok(None),
    };
    Ok(Some(moe))
}

impl ModelConfig {
    /// Parses a Hugging Face `config.json` (written by transformers v4 or
    /// v5; a multimodal Gemma 3's `text_config`).
    pub fn from_hf_json(text: &str) -> Result<Self, ModelError> {
        let top: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("config.json is not valid JSON: {e}")))?;
        let architecture = top
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| {
                let t = top.get("model_type").and_then(Value::as_str)?;
                Some(match FAMILIES.iter().find(|(_, m, _)| *m == t) {
                    Some((a, _, _)) => a.to_string(),
                    None => t.to_string(),
                })
            })
            .ok_or_else(|| ModelError::Config("no \"architectures\" or \"model_type\"".into()))?;
        if !FAMILIES.iter().any(|(a, _, _)| *a == architecture) {
            return Err(ModelError::UnsupportedArchitecture {
                name: architecture,
                supported: supported_architectures(),
            });
        }
        // The family's defaults under the file's fields (a multimodal
        // Gemma 3's text model is described by its `text_config`).
        let given = match architecture.as_str() {
            "Gemma3ForConditionalGeneration" => top
                .get("text_config")
                .ok_or_else(|| ModelError::Config("Gemma 3 config lacks \"text_config\"".into()))?,
            _ => &top,
        };
        let mut v = family_defaults(&architecture);
        if let (Some(d), Some(g)) = (v.as_object_mut(), given.as_object()) {
            d.extend(g.iter().map(|(k, x)| (k.clone(), x.clone())));
        }
        let v = &v;
        let is_qwen = matches!(
            architecture.as_str(),
            "Qwen2ForCausalLM" | "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM"
        );
        let is_gemma2 = architecture == "Gemma2ForCausalLM";
        let is_gemma3 = architecture.starts_with("Gemma3");
        let is_gemma = is_gemma2 || is_gemma3;

        let hidden_size = get_usize(v, "hidden_size")?;
        let num_heads = get_usize(v, "num_attention_heads")?;
        let num_kv_heads = get_usize(v, "num_key_value_heads").unwrap_or(num_heads);
        let head_dim = match v.get("head_dim").and_then(Value::as_u64) {
            Some(d) => d as usize,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        // EmbeddingGemma's encoder is a Gemma 3 without the causal mask.
        if v.get("use_bidirectional_attention")
            .and_then(Value::as_bool)
            == Some(true)
        {
            return Err(ModelError::Config(
                "use_bidirectional_attention (an embedding model) is not supported".into(),
            ));
        }
        if let Some(f) = v.get("partial_rotary_factor").and_then(Value::as_f64)
            && f != 1.0
        {
            return Err(ModelError::Config(format!(
                "partial_rotary_factor {f} is not supported (RoPE over the whole head only)"
            )));
        }

        // RoPE: v4's `rope_theta` + `rope_scaling`, or v5's
        // `rope_parameters`, which Gemma 3 keys by layer type.
        let (mut rope_theta, mut rope_scaling) = (get_f32(v, "rope_theta"), None);
        let mut rope_local_theta = is_gemma3
            .then(|| get_f32(v, "rope_local_base_freq"))
            .flatten();
        if let Some(rs) = v.get("rope_scaling") {
            rope_scaling = parse_rope(rs, "rope_scaling")?.1;
        }
        match v.get("rope_parameters") {
            Some(rp)
                if rp.get("full_attention").is_some() || rp.get("sliding_attention").is_some() =>
            {
                if let Some(full) = rp.get("full_attention") {
                    let (t, s) = parse_rope(full, "rope_parameters.full_attention")?;
                    rope_theta = t.or(rope_theta);
                    rope_scaling = s;
                }
                if let Some(local) = rp.get("sliding_attention") {
                    let (t, s) = parse_rope(local, "rope_parameters.sliding_attention")?;
                    if s.is_some() {
                        return Err(ModelError::Config(
                            "rope scaling on the sliding-window layers is not supported".into(),
                        ));
                    }
                    rope_local_theta = t.or(rope_local_theta);
                }
            }
            Some(rp) => {
                let (t, s) = parse_rope(rp, "rope_parameters")?;
                rope_theta = t.or(rope_theta);
                rope_scaling = s;
            }
            None => {}
        }
        let rope_theta = rope_theta.unwrap_or(10_000.0);

        // Qwen configs carry a `sliding_window` that only applies with
        // `use_sliding_window`, and then only from `max_window_layers` on.
        if is_qwen && v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            return Err(ModelError::Config(format!(
                "{architecture} with use_sliding_window is not supported (per-layer windows)"
            )));
        }
        let mut sliding_window = match v.get("sliding_window") {
            Some(w) if !is_qwen && !w.is_null() => {
                Some(w.as_u64().filter(|&w| w > 0).ok_or_else(|| {
                    ModelError::Config(format!(
                        "sliding_window must be a positive integer or null, got {w}"
                    ))
                })? as usize)
            }
            _ => None,
        };
        let sliding_window_pattern = if !is_gemma {
            None
        } else if let Some(types) = v.get("layer_types").and_then(Value::as_array) {
            let num_layers = get_usize(v, "num_hidden_layers")?;
            if types.len() != num_layers {
                return Err(ModelError::Config(format!(
                    "layer_types has {} entries for {num_layers} layers",
                    types.len()
                )));
            }
            let p = pattern_of_layer_types(types)?;
            if p == Some(1) {
                sliding_window = None;
            }
            p
        } else if is_gemma2 {
            Some(2)
        } else {
            Some(get_usize(v, "sliding_window_pattern")?)
        };
        let softcap = |k: &str| is_gemma2.then(|| get_f32(v, k)).flatten();
        if is_gemma3
            && ["attn_logit_softcapping", "final_logit_softcapping"]
                .iter()
                .any(|k| get_f32(v, k).is_some())
        {
            return Err(ModelError::Config(
                "Gemma 3 with logit soft-capping is not supported".into(),
            ));
        }
        let activation = match v
            .get("hidden_activation")
            .or_else(|| v.get("hidden_act"))
            .and_then(Value::as_str)
        {
            None if is_gemma => Activation::GeluTanh,
            None | Some("silu") => Activation::Silu,
            Some("gelu_pytorch_tanh") => Activation::GeluTanh,
            Some(other) => {
                return Err(ModelError::Config(format!(
                    "unsupported activation {other:?} (supported: silu, gelu_pytorch_tanh)"
                )));
            }
        };
        let arch = ArchOptions {
            qk_norm: is_gemma3
                || matches!(
                    architecture.as_str(),
                    "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM"
                ),
            post_norms: is_gemma,
            norm_offset: is_gemma,
            embed_scale: is_gemma,
            activation,
            query_pre_attn_scalar: is_gemma
                .then(|| get_usize(v, "query_pre_attn_scalar"))
                .transpose()?,
            attn_logit_softcapping: softcap("attn_logit_softcapping"),
            final_logit_softcapping: softcap("final_logit_softcapping"),
            sliding_window_pattern,
            rope_local_theta,
            moe: moe_of_hf(&architecture, v)?,
        };
        let cfg = Self {
            vocab_size: get_usize(v, "vocab_size")?,
            hidden_size,
            intermediate_size: get_usize(v, "intermediate_size")?,
            num_layers: get_usize(v, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            rope_interleaved: false,
            max_position_embeddings: get_usize(v, "max_position_embeddings").unwrap_or(4096),
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .or_else(|| top.get("tie_word_embeddings"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            attention_bias: v
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(architecture == "Qwen2ForCausalLM"),
            bos_token_id: ids(v.get("bos_token_id").or_else(|| top.get("bos_token_id")))
                .first()
                .copied(),
            eos_token_ids: ids(v.get("eos_token_id").or_else(|| top.get("eos_token_id"))),
            sliding_window,
            arch,
            architecture,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The window of layer `layer`'s attention (`None`: the whole sequence).
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        match self.arch.sliding_window_pattern {
            Some(n) if (layer + 1).is_multiple_of(n) => None,
            _ => self.sliding_window,
        }
    }

    /// Whether layer `layer`'s MLP is a mixture of experts.
    pub fn layer_is_moe(&self, layer: usize) -> bool {
        self.arch.moe.as_ref().is_some_and(|m| {
            (layer + 1).is_multiple_of(m.sparse_step) && !m.dense_layers.contains(&layer)
        })
    }

    /// Multiply-adds of one token through every layer's MLP: a MoE
    /// layer's router and the experts the token is routed to.
    pub fn mlp_macs_per_token(&self) -> usize {
        let h = self.hidden_size;
        (0..self.num_layers)
            .map(|l| match &self.arch.moe {
                Some(m) if self.layer_is_moe(l) => {
                    m.num_experts * h + m.experts_per_token * 3 * h * m.expert_intermediate_size
                }
                _ => 3 * h * self.intermediate_size,
            })
            .sum()
    }

    /// The RoPE base of layer `layer`.
    pub fn layer_rope_theta(&self, layer: usize) -> f32 {
        match (self.layer_window(layer), self.arch.rope_local_theta) {
            (Some(_), Some(local)) => local,
            _ => self.rope_theta,
        }
    }

    /// Checks the relations between the sizes.
    pub fn validate(&self) -> Result<(), ModelError> {
        let err = |m: String| Err(ModelError::Config(m));
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_layers == 0 {
            return err("vocab_size, hidden_size and num_hidden_layers must be positive".into());
        }
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return err(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.arch.sliding_window_pattern == Some(0) {
            return err("sliding_window_pattern must be positive".into());
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return err(format!(
                "head_dim ({}) must be positive and even",
                self.head_dim
            ));
        }
        if let Some(m) = &self.arch.moe
            && (m.experts_per_token == 0
                || m.experts_per_token > m.num_experts
                || m.expert_intermediate_size == 0
                || m.sparse_step == 0)
        {
            return err(format!(
                "experts: {} per token of {} (want 1 to the number of experts), \
                 expert width {}, sparse step {} (both must be positive)",
                m.experts_per_token, m.num_experts, m.expert_intermediate_size, m.sparse_step
            ));
        }
        Ok(())
    }

    /// RoPE inverse frequencies of layer `layer`: its base, scaled unless
    /// it is a local layer with its own base (Gemma 3's are never scaled).
    pub fn layer_rope_inv_freq(&self, layer: usize) -> Vec<f32> {
        let theta = self.layer_rope_theta(layer);
        if self.layer_window(layer).is_some() && self.arch.rope_local_theta.is_some() {
            return Self::unscaled_inv_freq(theta, self.head_dim);
        }
        self.rope_inv_freq(theta)
    }

    /// `1 / θ^(2i/d)` for each pair of a head's dimensions.
    fn unscaled_inv_freq(theta: f32, d: usize) -> Vec<f32> {
        // Computed in f32 exactly as the reference implementations do, so
        // that logits agree to rounding.
        (0..d)
            .step_by(2)
            .map(|i| 1f32 / theta.powf(i as f32 / d as f32))
            .collect()
    }

    /// RoPE inverse frequencies for the base `theta` with the config's
    /// scaling applied.
    pub fn rope_inv_freq(&self, theta: f32) -> Vec<f32> {
        let base = Self::unscaled_inv_freq(theta, self.head_dim);
        let rs = match &self.rope_scaling {
            None => return base,
            Some(RopeScaling::Linear { factor }) => {
                return base.into_iter().map(|f| f / factor).collect();
            }
            Some(RopeScaling::Llama3(rs)) => rs,
        };
        let orig = rs.original_max_position_embeddings as f32;
        let low_wavelen = orig / rs.low_freq_factor;
        let high_wavelen = orig / rs.high_freq_factor;
        base.into_iter()
            .map(|freq| {
                let wavelen = 2. * std::f32::consts::PI / freq;
                if wavelen < high_wavelen {
                    freq
                } else if wavelen > low_wavelen {
                    freq / rs.factor
                } else {
                    let smooth = (orig / wavelen - rs.low_freq_factor)
                        / (rs.high_freq_factor - rs.low_freq_factor);
                    (1. - smooth) * freq / rs.factor + smooth * freq
                }
            })
            .collect()
    }

    /// Bytes of K and V for one token across all layers, in a cache of `dtype`.
    pub fn kv_bytes_per_token(&self, dtype: crate::kv_storage::KvDtype) -> usize {
        2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype.size_bytes()
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let norms = if self.arch.post_norms { 4 * h } else { 2 * h };
        let qk_norms = if self.arch.qk_norm {
            2 * self.head_dim
        } else {
            0
        };
        let biases = if self.attention_bias { q + 2 * kv } else { 0 };
        let attn = h * (q + 2 * kv) + q * h + norms + qk_norms + biases;
        let mlps: usize = (0..self.num_layers)
            .map(|l| match &self.arch.moe {
                Some(m) if self.layer_is_moe(l) => {
                    m.num_experts * (h + 3 * h * m.expert_intermediate_size)
                }
                _ => 3 * h * self.intermediate_size,
            })
            .sum();
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_layers * attn + mlps + h + head
    }

    /// The config written as a Hugging Face `config.json`.
    pub fn to_hf_json(&self) -> String {
        let mut v = serde_json::json!({
            "architectures": [self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids,
        });
        if let Some(w) = self.sliding_window {
            v["sliding_window"] = w.into();
        }
        let a = &self.arch;
        if a.activation == Activation::GeluTanh {
            v["hidden_activation"] = "gelu_pytorch_tanh".into();
        }
        if a.norm_offset {
            // Gemma: the fields its config class would otherwise default.
            v["query_pre_attn_scalar"] = a.query_pre_attn_scalar.into();
            v["attn_logit_softcapping"] = a.attn_logit_softcapping.into();
            v["final_logit_softcapping"] = a.final_logit_softcapping.into();
            v["sliding_window"] = self.sliding_window.into();
            v["sliding_window_pattern"] = a.sliding_window_pattern.into();
            v["rope_local_base_freq"] = a.rope_local_theta.into();
        }
        if let Some(m) = &a.moe {
            v["num_experts_per_tok"] = m.experts_per_token.into();
            if self.architecture == "MixtralForCausalLM" {
                v["num_local_experts"] = m.num_experts.into();
            } else {
                v["num_experts"] = m.num_experts.into();
                v["moe_intermediate_size"] = m.expert_intermediate_size.into();
                v["norm_topk_prob"] = m.norm_topk_prob.into();
                v["decoder_sparse_step"] = m.sparse_step.into();
                v["mlp_only_layers"] = m.dense_layers.clone().into();
            }
        }
        match &self.rope_scaling {
            None => {}
            Some(RopeScaling::Llama3(rs)) => {
                v["rope_scaling"] = serde_json::json!({
                    "rope_type": "llama3",
                    "factor": rs.factor,
                    "low_freq_factor": rs.low_freq_factor,
                    "high_freq_factor": rs.high_freq_factor,
                    "original_max_position_embeddings": rs.original_max_position_embeddings,
                });
            }
            Some(RopeScaling::Linear { factor }) => {
                v["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": factor});
            }
        }
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_architecture_by_name() {
        let e = ModelConfig::from_hf_json(r#"{"architectures":["GPT2LMHeadModel"]}"#).unwrap_err();
        assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
    }

    #[test]
    fn qwen2_defaults_to_attention_bias() {
        let j = r#"{"architectures":["Qwen2ForCausalLM"],"vocab_size":10,"hidden_size":8,
            "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
            "num_key_value_heads":1,"eos_token_id":[3,4]}"#;
        let c = ModelConfig::from_hf_json(j).unwrap();
        assert!(c.attention_bias);
        assert_eq!(c.head_dim, 4);
        assert_eq!(c.eos_token_ids, vec![3, 4]);
    }

    #[test]
    fn sliding_window_from_mistral_but_not_qwen2() {
        let base = r#""vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2"#;
        let parse = |arch: &str, extra: &str| {
            ModelConfig::from_hf_json(&format!(r#"{{"architectures":["{arch}"],{base}{extra}}}"#))
        };
        let m = parse("MistralForCausalLM", r#","sliding_window":4096"#).unwrap();
        assert_eq!(m.sliding_window, Some(4096));
        assert_eq!(ModelConfig::from_hf_json(&m.to_hf_json()).unwrap(), m);
        let m = parse("MistralForCausalLM", r#","sliding_window":null"#).unwrap();
        assert_eq!(m.sliding_window, None);
        let e = parse("MistralForCausalLM", r#","sliding_window":0"#).unwrap_err();
        assert!(e.to_string().contains("sliding_window"), "{e}");
        let q = parse(
            "Qwen2ForCausalLM",
            r#","sliding_window":4096,"use_sliding_window":false"#,
        );
        assert_eq!(
            q.unwrap().sliding_window,
            None,
            "Qwen2 ignores it unless enabled"
        );
        let e = parse(
            "Qwen2ForCausalLM",
            r#","sliding_window":64,"use_sliding_window":true"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("use_sliding_window"), "{e}");
    }

    const SIZES: &str = r#""vocab_size":10,"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":6,"num_attention_heads":2,"num_key_value_heads":1"#;

    fn parse(arch: &str, extra: &str) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_hf_json(&format!(r#"{{"architectures":["{arch}"],{SIZES}{extra}}}"#))
    }

    /// transformers v5 moved `rope_theta` into `rope_parameters`; v4's
    /// field still reads, and an absent one is the family's default.
    #[test]
    fn rope_theta_from_v4_and_v5_configs() {
        let v4 = parse("LlamaForCausalLM", r#","rope_theta":500000.0"#).unwrap();
        assert_eq!(v4.rope_theta, 500_000.0);
        let v5 = parse(
            "LlamaForCausalLM",
            r#","rope_parameters":{"rope_type":"default","rope_theta":500000.0}"#,
        )
        .unwrap();
        assert_eq!(v5.rope_theta, 500_000.0);
        let v5 = parse(
            "LlamaForCausalLM",
            r#","rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}"#,
        )
        .unwrap();
        assert_eq!(v5.rope_theta, 500_000.0);
        assert!(matches!(v5.rope_scaling, Some(RopeScaling::Llama3(s)) if s.factor == 8.0));
        assert_eq!(parse("Gemma3ForCausalLM", "").unwrap().rope_theta, 1e6);
        let gemma = parse(
            "Gemma3ForCausalLM",
            r#","rope_parameters":{"full_attention":{"rope_type":"default","rope_theta":2000000.0},
            "sliding_attention":{"rope_type":"default","rope_theta":20000.0}}"#,
        )
        .unwrap();
        assert_eq!(gemma.rope_theta, 2e6);
        assert_eq!(gemma.arch.rope_local_theta, Some(20_000.0));
        assert_eq!(gemma.layer_rope_theta(0), 20_000.0);
        assert_eq!(gemma.layer_rope_theta(5), 2e6);
    }

    /// A rope type that is not implemented is refused, by name, in either
    /// form, never ignored.
    #[test]
    fn unimplemented_rope_types_are_refused() {
        for extra in [
            r#","rope_scaling":{"type":"yarn","factor":4.0}"#,
            r#","rope_parameters":{"rope_type":"yarn","rope_theta":10000.0,"factor":4.0}"#,
            r#","rope_scaling":{"rope_type":"longrope","short_factor":[1.0],"long_factor":[1.0]}"#,
        ] {
            let e = parse("LlamaForCausalLM", extra).unwrap_err().to_string();
            assert!(e.contains("unsupported rope type"), "{e}");
        }
        let e = parse(
            "Gemma3ForCausalLM",
            r#","rope_scaling":{"rope_type":"linear"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("factor"), "{e}");
    }

    /// Gemma's local/global layers from `sliding_window_pattern` (v4) or
    /// `layer_types` (newer), and Gemma 2's fixed alternation.
    #[test]
    fn gemma_layer_windows() {
        let g3 = parse("Gemma3ForCausalLM", r#","sliding_window":512"#).unwrap();
        let windows: Vec<_> = (0..6).map(|l| g3.layer_window(l)).collect();
        assert_eq!(
            windows,
            [Some(512); 5].into_iter().chain([None]).collect::<Vec<_>>()
        );
        let types = r#","sliding_window":512,"layer_types":["sliding_attention","full_attention",
            "sliding_attention","full_attention","sliding_attention","full_attention"]"#;
        let g = parse("Gemma3ForCausalLM", types).unwrap();
        assert_eq!(g.arch.sliding_window_pattern, Some(2));
        assert_eq!(g.layer_window(0), Some(512));
        assert_eq!(g.layer_window(1), None);
        let irregular = r#","layer_types":["sliding_attention","full_attention",
            "full_attention","full_attention","sliding_attention","full_attention"]"#;
        let e = parse("Gemma3ForCausalLM", irregular)
            .unwrap_err()
            .to_string();
        assert!(e.contains("layer_types"), "{e}");
        let e = parse(
            "Gemma3ForCausalLM",
            r#","use_bidirectional_attention":true"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("use_bidirectional_attention"), "{e}");
        let g2 = parse("Gemma2ForCausalLM", r#","sliding_window":64"#).unwrap();
        assert_eq!(g2.layer_window(0), Some(64));
        assert_eq!(g2.layer_window(1), None);
        assert_eq!(g2.arch.attn_logit_softcapping, Some(50.0));
        assert_eq!(g2.arch.final_logit_softcapping, Some(30.0));
        assert_eq!(g2.arch.activation, Activation::GeluTanh);
        assert!(g2.arch.post_norms && g2.arch.norm_offset && !g2.arch.qk_norm);
    }

    /// A multimodal Gemma 3's text model, with the fields its config
    /// class defaults left out (as released configs do).
    #[test]
    fn gemma3_text_config_with_defaults() {
        let j = r#"{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3",
            "eos_token_id":[1,106],"text_config":{"hidden_size":2560,"intermediate_size":10240,
            "model_type":"gemma3_text","num_hidden_layers":34,"sliding_window":1024}}"#;
        let c = ModelConfig::from_hf_json(j).unwrap();
        assert_eq!(
            (c.vocab_size, c.num_heads, c.num_kv_heads, c.head_dim),
            (262_208, 8, 4, 256)
        );
        assert_eq!(c.arch.query_pre_attn_scalar, Some(256));
        assert_eq!(c.eos_token_ids, vec![1, 106]);
        assert!(c.tie_word_embeddings && c.arch.qk_norm);
        assert_eq!(c.layer_window(4), Some(1024));
        assert_eq!(c.layer_window(5), None);
    }

    /// Gemma 3 4B–27B: `linear` scaling divides the global layers'
    /// frequencies (positions p·f then turn as p did unscaled); the local
    /// layers keep their own unscaled base.
    #[test]
    fn linear_rope_scaling_on_gemma3_global_layers_only() {
        let plain = parse("Gemma3ForCausalLM", r#","sliding_window":512"#).unwrap();
        let scaled = parse(
            "Gemma3ForCausalLM",
            r#","sliding_window":512,"rope_scaling":{"rope_type":"linear","factor":8.0}"#,
        )
        .unwrap();
        assert_eq!(
            ModelConfig::from_hf_json(&scaled.to_hf_json()).unwrap(),
            scaled
        );
        for (a, b) in plain
            .layer_rope_inv_freq(5)
            .iter()
            .zip(scaled.layer_rope_inv_freq(5))
        {
            assert_eq!(a / 8.0, b);
        }
        assert_eq!(plain.layer_rope_inv_freq(0), scaled.layer_rope_inv_freq(0));
        assert_ne!(plain.layer_rope_inv_freq(0), plain.layer_rope_inv_freq(5));
    }

    /// The parameter count is the number of weights a checkpoint of each
    /// family holds.
    #[test]
    fn num_params_counts_every_family_s_tensors() {
        let base = crate::demo::demo_config();
        let families = [
            ("LlamaForCausalLM", ArchOptions::default()),
            ("Qwen2ForCausalLM", ArchOptions::default()),
            (
                "Qwen3ForCausalLM",
                ArchOptions {
                    qk_norm: true,
                    ..ArchOptions::default()
                },
            ),
            (
                "Gemma3ForCausalLM",
                ArchOptions {
                    qk_norm: true,
                    post_norms: true,
                    norm_offset: true,
                    ..ArchOptions::default()
                },
            ),
            ("Phi3ForCausalLM", ArchOptions::default()),
            (
                "Qwen3MoeForCausalLM",
                ArchOptions {
                    qk_norm: true,
                    moe: Some(MoeOptions {
                        num_experts: 4,
                        experts_per_token: 2,
                        expert_intermediate_size: 32,
                        norm_topk_prob: false,
                        sparse_step: 2,
                        dense_layers: vec![3],
                    }),
                    ..ArchOptions::default()
                },
            ),
        ];
        for (arch, options) in families {
            let cfg = ModelConfig {
                architecture: arch.into(),
                attention_bias: arch == "Qwen2ForCausalLM",
                tie_word_embeddings: arch.starts_with("Gemma"),
                arch: options,
                ..base.clone()
            };
            let w = crate::demo::random_weights(&cfg, 1).unwrap();
            let n: usize = w.values().map(|t| t.elem_count()).sum();
            assert_eq!(cfg.num_params(), n, "{arch}");
        }
    }

    /// Qwen3-MoE's expert fields (with transformers' defaults), which
    /// layers are MoE ones, the round trip, and impossible expert counts
    /// refused by name.
    #[test]
    fn moe_configs() {
        let q = parse(
            "Qwen3MoeForCausalLM",
            r#","moe_intermediate_size":4,"num_experts":6,"num_experts_per_tok":2,
            "norm_topk_prob":true,"decoder_sparse_step":2,"mlp_only_layers":[3]"#,
        )
        .unwrap();
        let m = q.arch.moe.clone().unwrap();
        assert_eq!(
            (
                m.num_experts,
                m.experts_per_token,
                m.expert_intermediate_size
            ),
            (6, 2, 4)
        );
        assert!(m.norm_topk_prob && q.arch.qk_norm);
        let moe: Vec<bool> = (0..6).map(|l| q.layer_is_moe(l)).collect();
        assert_eq!(moe, [false, true, false, false, false, true]);
        assert_eq!(ModelConfig::from_hf_json(&q.to_hf_json()).unwrap(), q);
        let x = parse("MixtralForCausalLM", "").unwrap();
        let m = x.arch.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.experts_per_token), (8, 2));
        assert_eq!(m.expert_intermediate_size, x.intermediate_size);
        assert!(m.norm_topk_prob && (0..6).all(|l| x.layer_is_moe(l)));
        assert_eq!(ModelConfig::from_hf_json(&x.to_hf_json()).unwrap(), x);
        for extra in [r#","num_experts_per_tok":9"#, r#","num_experts_per_tok":0"#] {
            let e = parse("MixtralForCausalLM", extra).unwrap_err().to_string();
            assert!(e.contains("per token"), "{e}");
        }
        let e = parse("Qwen3MoeForCausalLM", r#","num_experts":4"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("moe_intermediate_size"), "{e}");
        assert!(!parse("Qwen3ForCausalLM", "").unwrap().layer_is_moe(0));
    }

    #[test]
    fn round_trips_through_json() {
        let c = crate::demo::demo_config();
        assert_eq!(ModelConfig::from_hf_json(&c.to_hf_json()).unwrap(), c);
    }
}
