//! GGUF files: Llama-family weights (quantized ones stay quantized, F16 and
//! BF16 stay 16-bit) and the tokenizer from the metadata.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use candle_core::Device;
use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{Content, Value};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::llama::{Layer, Linear, LlamaModel};
use crate::tokenizer::{ChatTemplate, HfTokenizer, Tokenizer};

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some(u64::from(*x)),
        Value::U16(x) => Some(u64::from(*x)),
        Value::U32(x) => Some(u64::from(*x)),
        Value::U64(x) => Some(*x),
        Value::I8(x) => u64::try_from(*x).ok(),
        Value::I16(x) => u64::try_from(*x).ok(),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(f64::from(*x)),
        Value::F64(x) => Some(*x),
        other => as_u64(other).map(|x| x as f64),
    }
}

struct Meta<'a>(&'a HashMap<String, Value>);

impl Meta<'_> {
    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.0
            .get(key)
            .and_then(as_u64)
            .map(|x| x as usize)
            .ok_or_else(|| ModelError::Config(format!("GGUF metadata lacks integer {key:?}")))
    }
    fn opt_usize(&self, key: &str) -> Option<usize> {
        self.0.get(key).and_then(as_u64).map(|x| x as usize)
    }
    fn opt_f64(&self, key: &str) -> Option<f64> {
        self.0.get(key).and_then(as_f64)
    }
    fn str(&self, key: &str) -> Option<&str> {
        match self.0.get(key) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        }
    }
}

/// Reads tensors from the file, checking names and shapes.
struct Tensors<'a> {
    content: &'a Content,
    file: File,
    path: &'a Path,
}

impl Tensors<'_> {
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn get(&mut self, name: &str, shape: &[usize]) -> Result<QTensor, ModelError> {
        if !self.has(name) {
            return Err(ModelError::MissingTensor(name.to_string()));
        }
        let t = self
            .content
            .tensor(&mut self.file, name, &Device::Cpu)
            .map_err(|e| {
                ModelError::Config(format!("{}: tensor {name}: {e}", self.path.display()))
            })?;
        if t.shape().dims() != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: t.shape().dims().to_vec(),
            });
        }
        Ok(t)
    }

    fn vec(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.get(name, &[len])?.dequantize(&Device::Cpu)?;
        Ok(t.to_vec1::<f32>()?)
    }

    fn linear(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, ModelError> {
        let w = self.get(&format!("{name}.weight"), &[out, inp])?;
        let b = if bias {
            Some(self.vec(&format!("{name}.bias"), out)?)
        } else {
            None
        };
        Linear::from_qtensor(w, b)
    }
}

/// Loads a GGUF file: weights, and the tokenizer from `tokenizer.json`
/// beside the file or else from the GGUF metadata.
pub fn load_gguf(path: &Path) -> Result<(LlamaModel, Arc<dyn Tokenizer>), ModelError> {
    if !path.is_file() {
        return Err(ModelError::MissingFile(path.to_path_buf()));
    }
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let content = Content::read(&mut file).map_err(|e| {
        ModelError::Config(format!("{} is not a valid GGUF file: {e}", path.display()))
    })?;
    let meta = Meta(&content.metadata);
    let arch = meta
        .str("general.architecture")
        .ok_or_else(|| ModelError::Config("GGUF metadata lacks general.architecture".into()))?
        .to_string();
    let architecture = match arch.as_str() {
        "llama" => "LlamaForCausalLM",
        "mistral" => "MistralForCausalLM",
        "qwen2" => "Qwen2ForCausalLM",
        _ => return Err(ModelError::UnsupportedArchitecture(arch)),
    };
    let hidden_size = meta.usize(&format!("{arch}.embedding_length"))?;
    let num_heads = meta.usize(&format!("{arch}.attention.head_count"))?;
    let head_dim = meta
        .opt_usize(&format!("{arch}.attention.key_length"))
        .or_else(|| meta.opt_usize(&format!("{arch}.rope.dimension_count")))
        .unwrap_or(hidden_size / num_heads.max(1));
    let vocab_size = match meta.opt_usize(&format!("{arch}.vocab_size")) {
        Some(v) => v,
        None => content
            .tensor_infos
            .get("token_embd.weight")
            .and_then(|t| t.shape.dims().first().copied())
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?,
    };
    let tokens_meta = TokenizerMeta::read(&meta);
    let mut tensors = Tensors {
        content: &content,
        file,
        path,
    };
    let cfg = ModelConfig {
        architecture: architecture.to_string(),
        vocab_size,
        hidden_size,
        intermediate_size: meta.usize(&format!("{arch}.feed_forward_length"))?,
        num_layers: meta.usize(&format!("{arch}.block_count"))?,
        num_heads,
        num_kv_heads: meta
            .opt_usize(&format!("{arch}.attention.head_count_kv"))
            .unwrap_or(num_heads),
        head_dim,
        rms_norm_eps: meta
            .opt_f64(&format!("{arch}.attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5),
        rope_theta: meta
            .opt_f64(&format!("{arch}.rope.freq_base"))
            .unwrap_or(10_000.0) as f32,
        rope_scaling: None,
        // llama.cpp permutes the q/k rows of Llama and Mistral checkpoints
        // for the interleaved (GPT-J) rotation; Qwen2 keeps the NeoX layout.
        rope_interleaved: arch != "qwen2",
        max_position_embeddings: meta
            .opt_usize(&format!("{arch}.context_length"))
            .unwrap_or(4096),
        tie_word_embeddings: !tensors.has("output.weight"),
        attention_bias: tensors.has("blk.0.attn_q.bias"),
        bos_token_id: tokens_meta.bos,
        eos_token_ids: tokens_meta.eos.into_iter().collect(),
        // Written by llama.cpp where the architecture has one; Qwen2's only
        // applies to some layers, and llama.cpp ignores it too.
        sliding_window: (arch != "qwen2")
            .then(|| meta.opt_usize(&format!("{arch}.attention.sliding_window")))
            .flatten()
            .filter(|&w| w > 0),
    };
    cfg.validate()?;
    let (h, v, i) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let q_dim = cfg.num_heads * cfg.head_dim;
    let kv_dim = cfg.num_kv_heads * cfg.head_dim;
    let embd = tensors.get("token_embd.weight", &[v, h])?;
    let embed = embd
        .dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for l in 0..cfg.num_layers {
        let p = format!("blk.{l}");
        let bias = cfg.attention_bias;
        layers.push(Layer {
            attn_norm: tensors.vec(&format!("{p}.attn_norm.weight"), h)?,
            q: tensors.linear(&format!("{p}.attn_q"), q_dim, h, bias)?,
            k: tensors.linear(&format!("{p}.attn_k"), kv_dim, h, bias)?,
            v: tensors.linear(&format!("{p}.attn_v"), kv_dim, h, bias)?,
            o: tensors.linear(&format!("{p}.attn_output"), h, q_dim, false)?,
            mlp_norm: tensors.vec(&format!("{p}.ffn_norm.weight"), h)?,
            gate: tensors.linear(&format!("{p}.ffn_gate"), i, h, false)?,
            up: tensors.linear(&format!("{p}.ffn_up"), i, h, false)?,
            down: tensors.linear(&format!("{p}.ffn_down"), h, i, false)?,
        });
    }
    let norm = tensors.vec("output_norm.weight", h)?;
    let lm_head = if cfg.tie_word_embeddings {
        Linear::from_qtensor(embd, None)?
    } else {
        tensors.linear("output", v, h, false)?
    };
    let mut model = LlamaModel::new(cfg.clone(), embed, layers, norm, lm_head)?;
    if tensors.has("rope_freqs.weight") {
        let factors = tensors.vec("rope_freqs.weight", cfg.head_dim / 2)?;
        model = model.with_rope_freq_factors(&factors)?;
    }

    let sibling = path.with_file_name("tokenizer.json");
    let tokenizer: Arc<dyn Tokenizer> = if sibling.is_file() {
        Arc::new(HfTokenizer::from_file(
            &sibling,
            cfg.eos_token_ids.clone(),
            cfg.bos_token_id,
        )?)
    } else {
        Arc::new(tokens_meta.build(&meta)?)
    };
    Ok((model, tokenizer))
}

/// The `tokenizer.ggml.*` metadata.
struct TokenizerMeta {
    bos: Option<u32>,
    eos: Option<u32>,
}

impl TokenizerMeta {
    fn read(meta: &Meta<'_>) -> Self {
        Self {
            bos: meta
                .opt_usize("tokenizer.ggml.bos_token_id")
                .map(|x| x as u32),
            eos: meta
                .opt_usize("tokenizer.ggml.eos_token_id")
                .map(|x| x as u32),
        }
    }

    /// Builds a `tokenizer.json` equivalent of the GGUF vocabulary
    /// (`gpt2`: byte-level BPE with merges; `llama`: SentencePiece BPE with
    /// byte fallback, merges derived from the scores) and parses it.
    fn build(&self, meta: &Meta<'_>) -> Result<HfTokenizer, ModelError> {
        let err = |m: &str| ModelError::Tokenizer(format!("GGUF tokenizer: {m}"));
        let model = meta
            .str("tokenizer.ggml.model")
            .ok_or_else(|| err("no tokenizer.ggml.model and no tokenizer.json beside the file"))?;
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            match meta.0.get(key) {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s.clone()),
                        _ => Err(err(&format!("{key} holds a non-string"))),
                    })
                    .collect(),
                _ => Err(err(&format!("missing {key}"))),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types: Vec<u64> = match meta.0.get("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a.iter().map(|v| as_u64(v).unwrap_or(1)).collect(),
            _ => vec![1; tokens.len()],
        };
        let vocab: serde_json::Map<String, serde_json::Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), serde_json::Value::from(i)))
            .collect();
        // Control (3) and user-defined (4) tokens are matched before the model.
        let added: Vec<serde_json::Value> = tokens
            .iter()
            .enumerate()
            .filter(|(i, _)| matches!(types.get(*i), Some(3 | 4)))
            .map(|(i, t)| {
                serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": types.get(i) == Some(&3)})
            })
            .collect();
        let add_bos = match meta.0.get("tokenizer.ggml.add_bos_token") {
            Some(Value::Bool(b)) => *b,
            _ => model == "llama",
        };
        let post_processor = match (add_bos, self.bos) {
            (true, Some(bos)) => {
                let name = tokens.get(bos as usize).cloned().unwrap_or_default();
                serde_json::json!({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {name.clone(): {"id": name, "ids": [bos], "tokens": [name]}}})
            }
            _ => serde_json::Value::Null,
        };
        let json = match model {
            "gpt2" => {
                let merges = strings("tokenizer.ggml.merges")?;
                serde_json::json!({
                    "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
                    "normalizer": null,
                    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
                    "post_processor": post_processor,
                    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
                    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                        "vocab": vocab, "merges": merges}
                })
            }
            "llama" => {
                let scores: Vec<f64> = match meta.0.get("tokenizer.ggml.scores") {
                    Some(Value::Array(a)) => a.iter().map(|v| as_f64(v).unwrap_or(0.0)).collect(),
                    _ => vec![0.0; tokens.len()],
                };
                let unk = meta
                    .opt_usize("tokenizer.ggml.unknown_token_id")
                    .and_then(|i| tokens.get(i).cloned());
                serde_json::json!({
                    "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
                    "normalizer": {"type": "Sequence", "normalizers": [
                        {"type": "Prepend", "prepend": "\u{2581}"},
                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]},
                    "pre_tokenizer": null,
                    "post_processor": post_processor,
                    "decoder": {"type": "Sequence", "decoders": [
                        {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                        {"type": "ByteFallback"}, {"type": "Fuse"},
                        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                    "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                        "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                        "vocab": vocab, "merges": spm_merges(&tokens, &types, &scores)}
                })
            }
            other => return Err(err(&format!("unsupported tokenizer model {other:?}"))),
        };
        let inner = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes())
            .map_err(|e| err(&e.to_string()))?;
        let template = meta.str("tokenizer.chat_template").map(|t| {
            let name = |id: Option<u32>| {
                id.and_then(|i| tokens.get(i as usize).cloned())
                    .unwrap_or_default()
            };
            ChatTemplate::new(t.to_string(), name(self.bos), name(self.eos))
        });
        Ok(
            HfTokenizer::from_inner(inner, self.eos.into_iter().collect(), self.bos)
                .with_chat_template(template),
        )
    }
}

/// BPE merges of a SentencePiece vocabulary: every split of a normal token
/// into two vocabulary pieces, ranked by the merged piece's score (as the
/// Hugging Face converter does).
fn spm_merges(tokens: &[String], types: &[u64], scores: &[f64]) -> Vec<String> {
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f64, usize, usize, String)> = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        if types.get(id).copied().unwrap_or(1) != 1 {
            continue;
        }
        let score = scores.get(id).copied().unwrap_or(0.0);
        for (split, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(split);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((score, li, ri, format!("{l} {r}")));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges.into_iter().map(|m| m.3).collect()
}
