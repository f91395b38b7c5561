//! Loading Hugging Face checkpoints: `config.json`, `tokenizer.json` and
//! single or sharded `*.safetensors`; telling a GGUF file by its first bytes.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor};

use crate::chat_template::ChatTemplate;
use crate::config::ModelConfig;
use crate::embedding::Embedding;
use crate::error::ModelError;
use crate::llama::{Expert, Layer, Linear, LlamaModel, Mlp};
use crate::tokenizer::HfTokenizer;

fn read_to_string(path: &Path) -> Result<String, ModelError> {
    if !path.is_file() {
        return Err(ModelError::MissingFile(path.to_path_buf()));
    }
    std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The first bytes of every GGUF file.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// Whether `path` is a GGUF file: it starts with the bytes `GGUF`, whatever
/// its name (a file shorter than that is not one).
pub fn is_gguf_file(path: &Path) -> Result<bool, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(io)?;
    match file.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == GGUF_MAGIC),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(io(e)),
    }
}

/// The safetensors files of a model directory: those the index names, else
/// `model.safetensors`, else every `*.safetensors`.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let v: serde_json::Value = serde_json::from_str(&read_to_string(&index)?)
            .map_err(|e| ModelError::Config(format!("{}: {e}", index.display())))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::Config(format!("{} has no weight_map", index.display())))?;
        let files: BTreeSet<&str> = map.values().filter_map(|f| f.as_str()).collect();
        let paths: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
        if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
            return Err(ModelError::MissingFile(missing.clone()));
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| ModelError::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(ModelError::MissingFile(single));
    }
    Ok(found)
}

/// Loads a Hugging Face model directory.
pub fn load_hf_dir(dir: &Path) -> Result<(LlamaModel, HfTokenizer), ModelError> {
    let cfg = ModelConfig::from_hf_json(&read_to_string(&dir.join("config.json"))?)?;
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        return Err(ModelError::MissingFile(tokenizer_path));
    }
    let mut tensors = HashMap::new();
    for file in safetensors_files(dir)? {
        let part = candle_core::safetensors::load(&file, &Device::Cpu)
            .map_err(|e| ModelError::Config(format!("{}: {e}", file.display())))?;
        tensors.extend(part);
    }
    let inner = tokenizers::Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", tokenizer_path.display())))?;
    let optional = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (model, tokenizer) = assemble(
        cfg,
        tensors,
        inner,
        optional("tokenizer_config.json").as_deref(),
        optional("generation_config.json").as_deref(),
    )?;
    // The directory's template: `chat_template.jinja` (transformers v5)
    // before the config's.
    Ok((
        model,
        tokenizer.with_chat_template(ChatTemplate::from_hf_dir(dir)),
    ))
}

/// Builds model and tokenizer from a checkpoint's parsed `config.json`,
/// weights and `tokenizer.json`, and the text of its optional
/// `tokenizer_config.json` and `generation_config.json`.
pub fn assemble(
    cfg: ModelConfig,
    tensors: HashMap<String, Tensor>,
    tokenizer: tokenizers::Tokenizer,
    tokenizer_config_json: Option<&str>,
    generation_config_json: Option<&str>,
) -> Result<(LlamaModel, HfTokenizer), ModelError> {
    let model = model_from_tensors(cfg.clone(), tensors)?;
    let (eos, bos) = special_ids(generation_config_json, &cfg);
    let template = tokenizer_config_json.and_then(ChatTemplate::from_tokenizer_config);
    let tokenizer = HfTokenizer::from_inner(tokenizer, eos, bos).with_chat_template(template);
    Ok((model, tokenizer))
}

/// EOS/BOS ids: `generation_config.json` overrides `config.json`.
fn special_ids(generation_config_json: Option<&str>, cfg: &ModelConfig) -> (Vec<u32>, Option<u32>) {
    let mut eos = cfg.eos_token_ids.clone();
    let mut bos = cfg.bos_token_id;
    if let Some(text) = generation_config_json
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
    {
        match v.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => {
                eos = n.as_u64().map(|x| x as u32).into_iter().collect()
            }
            Some(serde_json::Value::Array(a)) => {
                eos = a
                    .iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect();
            }
            _ => {}
        }
        if let Some(b) = v.get("bos_token_id").and_then(|b| b.as_u64()) {
            bos = Some(b as u32);
        }
    }
    (eos, bos)
}

/// Takes tensors by Hugging Face name, checking their shapes.
struct TensorSource {
    tensors: HashMap<String, Tensor>,
    /// Added to every RMSNorm weight (Gemma stores `w - 1`).
    norm_offset: f32,
}

impl TensorSource {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let t = self
            .tensors
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if t.dims() != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: t.dims().to_vec(),
            });
        }
        Ok(t.to_dtype(DType::F32)?.contiguous()?)
    }

    fn vec(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        Ok(self.take(name, &[len])?.to_vec1::<f32>()?)
    }

    /// An RMSNorm weight, with the family's offset applied.
    fn norm(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let mut w = self.vec(name, len)?;
        if self.norm_offset != 0.0 {
            w.iter_mut().for_each(|x| *x += self.norm_offset);
        }
        Ok(w)
    }

    fn linear(
        &mut self,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, ModelError> {
        let w = self.take(&format!("{prefix}.weight"), &[out, inp])?;
        let b = if bias {
            Some(self.vec(&format!("{prefix}.bias"), out)?)
        } else {
            None
        };
        Linear::new(QMatMul::Tensor(w), b, out)
    }
}

/// How a MoE family's checkpoints name a layer's experts:
/// `{layer}.{block}.gate` is the router, `{layer}.{block}.experts.{e}.{gate|up|down}`
/// the expert's products.
pub(crate) struct ExpertNames {
    /// The MoE block under the layer.
    pub block: &'static str,
    /// An expert's gate product.
    pub gate: &'static str,
    /// Its up product.
    pub up: &'static str,
    /// Its down product.
    pub down: &'static str,
}

/// The expert names of `architecture`'s checkpoints (Mixtral's `w1`, `w3`,
/// `w2` under `block_sparse_moe`; Qwen3-MoE's Llama names under `mlp`).
pub(crate) fn hf_expert_names(architecture: &str) -> ExpertNames {
    if architecture == "MixtralForCausalLM" {
        ExpertNames {
            block: "block_sparse_moe",
            gate: "w1",
            up: "w3",
            down: "w2",
        }
    } else {
        ExpertNames {
            block: "mlp",
            gate: "gate_proj",
            up: "up_proj",
            down: "down_proj",
        }
    }
}

/// Builds the model from tensors named as in Hugging Face checkpoints.
pub fn model_from_tensors(
    cfg: ModelConfig,
    tensors: HashMap<String, Tensor>,
) -> Result<LlamaModel, ModelError> {
    cfg.validate()?;
    // A multimodal Gemma 3's text model sits under `language_model`
    // (transformers v4.52+ and v5: `model.language_model.`; before:
    // `language_model.model.`); its vision tower is not loaded.
    let root = ["model.language_model.", "language_model.model."]
        .into_iter()
        .find(|r| tensors.contains_key(&format!("{r}embed_tokens.weight")))
        .unwrap_or("model.");
    let mut src = TensorSource {
        tensors,
        norm_offset: if cfg.arch.norm_offset { 1.0 } else { 0.0 },
    };
    let (h, v, i) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let (d, q_dim) = (cfg.head_dim, cfg.num_heads * cfg.head_dim);
    let kv_dim = cfg.num_kv_heads * cfg.head_dim;
    let embed_t = src.take(&format!("{root}embed_tokens.weight"), &[v, h])?;
    let embed = Embedding::dense(embed_t.flatten_all()?.to_vec1::<f32>()?, v, h)?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    // Gemma 2 and 3 norm the attention output with what Llama calls the
    // pre-MLP norm, and have a pre- and a post-feedforward norm.
    let post = cfg.arch.post_norms;
    // Phi-3 stores q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj`.
    let fused = cfg.architecture == "Phi3ForCausalLM";
    let mlp_norm = if post {
        "pre_feedforward_layernorm"
    } else {
        "post_attention_layernorm"
    };
    for l in 0..cfg.num_layers {
        let p = format!("{root}layers.{l}");
        let bias = cfg.attention_bias;
        let qk_norm = if cfg.arch.qk_norm {
            Some((
                src.norm(&format!("{p}.self_attn.q_norm.weight"), d)?,
                src.norm(&format!("{p}.self_attn.k_norm.weight"), d)?,
            ))
        } else {
            None
        };
        let post_norm = |src: &mut TensorSource, name: &str| {
            post.then(|| src.norm(&format!("{p}.{name}.weight"), h))
                .transpose()
        };
        layers.push(Layer {
            attn_norm: src.norm(&format!("{p}.input_layernorm.weight"), h)?,
            qkv: if fused {
                vec![src.linear(
                    &format!("{p}.self_attn.qkv_proj"),
                    q_dim + 2 * kv_dim,
                    h,
                    bias,
                )?]
            } else {
                vec![
                    src.linear(&format!("{p}.self_attn.q_proj"), q_dim, h, bias)?,
                    src.linear(&format!("{p}.self_attn.k_proj"), kv_dim, h, bias)?,
                    src.linear(&format!("{p}.self_attn.v_proj"), kv_dim, h, bias)?,
                ]
            },
            qk_norm,
            o: src.linear(&format!("{p}.self_attn.o_proj"), h, q_dim, false)?,
            post_attn_norm: post_norm(&mut src, "post_attention_layernorm")?,
            mlp_norm: src.norm(&format!("{p}.{mlp_norm}.weight"), h)?,
            mlp: match &cfg.arch.moe {
                Some(m) if cfg.layer_is_moe(l) => {
                    let names = hf_expert_names(&cfg.architecture);
                    let (block, ei) = (format!("{p}.{}", names.block), m.expert_intermediate_size);
                    let router = src.linear(&format!("{block}.gate"), m.num_experts, h, false)?;
                    let experts = (0..m.num_experts)
                        .map(|e| {
                            let name = |w: &str| format!("{block}.experts.{e}.{w}");
                            Ok(Expert {
                                gate_up: vec![
                                    src.linear(&name(names.gate), ei, h, false)?,
                                    src.linear(&name(names.up), ei, h, false)?,
                                ],
                                down: src.linear(&name(names.down), h, ei, false)?,
                            })
                        })
                        .collect::<Result<_, ModelError>>()?;
                    Mlp::Moe { router, experts }
                }
                _ => Mlp::Dense(Expert {
                    gate_up: if fused {
                        vec![src.linear(&format!("{p}.mlp.gate_up_proj"), 2 * i, h, false)?]
                    } else {
                        vec![
                            src.linear(&format!("{p}.mlp.gate_proj"), i, h, false)?,
                            src.linear(&format!("{p}.mlp.up_proj"), i, h, false)?,
                        ]
                    },
                    down: src.linear(&format!("{p}.mlp.down_proj"), h, i, false)?,
                }),
            },
            post_mlp_norm: post_norm(&mut src, "post_feedforward_layernorm")?,
        });
    }
    let norm = src.norm(&format!("{root}norm.weight"), h)?;
    let lm_head = if cfg.tie_word_embeddings {
        Linear::new(QMatMul::Tensor(embed_t), None, v)?
    } else {
        src.linear("lm_head", v, h, false)?
    };
    LlamaModel::new(cfg, embed, layers, norm, lm_head)
}
