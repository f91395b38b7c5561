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
    /// Llama-3 RoPE scaling, if any.
    pub rope_scaling: Option<Llama3RopeScaling>,
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
}

/// Architectures of `config.json` that this forward pass runs.
const SUPPORTED: &[&str] = &["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"];

fn get_usize(v: &Value, key: &str) -> Result<usize, ModelError> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| ModelError::Config(format!("missing or invalid integer field {key:?}")))
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

impl ModelConfig {
    /// Parses a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self, ModelError> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("config.json is not valid JSON: {e}")))?;
        let architecture = v
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| {
                v.get("model_type")
                    .and_then(Value::as_str)
                    .map(|t| match t {
                        "llama" => "LlamaForCausalLM".to_string(),
                        "mistral" => "MistralForCausalLM".to_string(),
                        "qwen2" => "Qwen2ForCausalLM".to_string(),
                        other => other.to_string(),
                    })
            })
            .ok_or_else(|| ModelError::Config("no \"architectures\" or \"model_type\"".into()))?;
        if !SUPPORTED.contains(&architecture.as_str()) {
            return Err(ModelError::UnsupportedArchitecture(architecture));
        }
        let hidden_size = get_usize(&v, "hidden_size")?;
        let num_heads = get_usize(&v, "num_attention_heads")?;
        let num_kv_heads = get_usize(&v, "num_key_value_heads").unwrap_or(num_heads);
        let head_dim = match v.get("head_dim").and_then(Value::as_u64) {
            Some(d) => d as usize,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        let rope_scaling = match v.get("rope_scaling") {
            Some(rs) if !rs.is_null() => {
                let kind = rs
                    .get("rope_type")
                    .or_else(|| rs.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                match kind {
                    "default" => None,
                    "llama3" => {
                        let f = |k: &str| {
                            rs.get(k)
                                .and_then(Value::as_f64)
                                .map(|x| x as f32)
                                .ok_or_else(|| {
                                    ModelError::Config(format!("rope_scaling lacks {k:?}"))
                                })
                        };
                        Some(Llama3RopeScaling {
                            factor: f("factor")?,
                            low_freq_factor: f("low_freq_factor")?,
                            high_freq_factor: f("high_freq_factor")?,
                            original_max_position_embeddings: get_usize(
                                rs,
                                "original_max_position_embeddings",
                            )?,
                        })
                    }
                    other => {
                        return Err(ModelError::Config(format!(
                            "unsupported rope_scaling type {other:?} (supported: llama3)"
                        )));
                    }
                }
            }
            _ => None,
        };
        let is_qwen2 = architecture == "Qwen2ForCausalLM";
        // Qwen2 configs carry a `sliding_window` that only applies with
        // `use_sliding_window`, and then only from `max_window_layers` on.
        let uses_window = if is_qwen2 {
            let on = v.get("use_sliding_window").and_then(Value::as_bool);
            if on == Some(true) {
                return Err(ModelError::Config(
                    "Qwen2 with use_sliding_window is not supported (per-layer windows)".into(),
                ));
            }
            false
        } else {
            true
        };
        let sliding_window = match v.get("sliding_window") {
            Some(w) if uses_window && !w.is_null() => {
                Some(w.as_u64().filter(|&w| w > 0).ok_or_else(|| {
                    ModelError::Config(format!(
                        "sliding_window must be a positive integer or null, got {w}"
                    ))
                })? as usize)
            }
            _ => None,
        };
        let cfg = Self {
            vocab_size: get_usize(&v, "vocab_size")?,
            hidden_size,
            intermediate_size: get_usize(&v, "intermediate_size")?,
            num_layers: get_usize(&v, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta: v
                .get("rope_theta")
                .and_then(Value::as_f64)
                .unwrap_or(10_000.0) as f32,
            rope_scaling,
            rope_interleaved: false,
            max_position_embeddings: get_usize(&v, "max_position_embeddings").unwrap_or(4096),
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            attention_bias: v
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(is_qwen2),
            bos_token_id: ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: ids(v.get("eos_token_id")),
            sliding_window,
            architecture,
        };
        cfg.validate()?;
        Ok(cfg)
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
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return err(format!(
                "head_dim ({}) must be positive and even",
                self.head_dim
            ));
        }
        Ok(())
    }

    /// RoPE inverse frequencies, with Llama-3 scaling applied.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        // Computed in f32 exactly as the reference implementations do, so
        // that logits agree to rounding.
        let base: Vec<f32> = (0..d)
            .step_by(2)
            .map(|i| 1f32 / self.rope_theta.powf(i as f32 / d as f32))
            .collect();
        let Some(rs) = &self.rope_scaling else {
            return base;
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

    /// Bytes of K and V for one token across all layers (f32).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.num_layers * self.num_kv_heads * self.head_dim * std::mem::size_of::<f32>()
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate_size + 2 * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_layers * layer + h + head
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
        if let Some(rs) = &self.rope_scaling {
            v["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3",
                "factor": rs.factor,
                "low_freq_factor": rs.low_freq_factor,
                "high_freq_factor": rs.high_freq_factor,
                "original_max_position_embeddings": rs.original_max_position_embeddings,
            });
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

    #[test]
    fn round_trips_through_json() {
        let c = crate::demo::demo_config();
        assert_eq!(ModelConfig::from_hf_json(&c.to_hf_json()).unwrap(), c);
    }
}
