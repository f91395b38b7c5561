//! `LoadedModel`: a model spec (`demo`, `demo-random`, a directory, a GGUF file) turned
//! into weights, a tokenizer and executors.

use std::path::Path;
use std::sync::Arc;

use inferscope_engine::Executor;

use crate::error::ModelError;
use crate::executor::{CpuExecutor, KvBudget};
use crate::kv_storage::KvDtype;
use crate::llama::LlamaModel;
use crate::packed::WeightDtype;
use crate::packed_cache::PackedCache;
use crate::tokenizer::{ByteTokenizer, Tokenizer};

/// How to load and run a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelOptions {
    /// KV pool size in bytes per executor; overrides `kv_cache_fraction`.
    pub kv_cache_memory: Option<u64>,
    /// Fraction of available memory for each executor's KV pool.
    pub kv_cache_fraction: f64,
    /// Element type of the KV pool (`--kv-cache-dtype`; f16 by default).
    pub kv_cache_dtype: KvDtype,
    /// How dense weights are stored: `auto` (a Hugging Face checkpoint's
    /// 16-bit type, else f32), `f32` (`float32`), `bf16` (`bfloat16`) or
    /// `f16` (`float16`); 16 bits halve the memory, computation stays f32.
    pub dtype: String,
    /// Threads per executor; `None` uses the global pool (all cores).
    pub num_threads: Option<usize>,
    /// Where a GGUF file's repacked weights are saved and read back
    /// (`None`: repacked at every load).
    pub packed_cache: Option<PackedCache>,
    /// Which logits reported log-probabilities come from (`--logprobs-mode`).
    pub logprobs_mode: crate::LogprobsMode,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            kv_cache_memory: None,
            kv_cache_fraction: 0.2,
            kv_cache_dtype: KvDtype::default(),
            dtype: "f32".into(),
            num_threads: None,
            packed_cache: None,
            logprobs_mode: crate::LogprobsMode::default(),
        }
    }
}

/// Weights and tokenizer, ready to make executors.
pub struct LoadedModel {
    name: String,
    model: Arc<LlamaModel>,
    tokenizer: Arc<dyn Tokenizer>,
    opts: ModelOptions,
    is_demo: bool,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("name", &self.name)
            .field("config", &self.model.cfg)
            .finish()
    }
}

/// The weight storage a `--dtype` value names; `None` for `auto` (the
/// checkpoint's own type, see [`checkpoint_dtype`]).
pub fn weight_dtype(name: &str) -> Result<Option<WeightDtype>, ModelError> {
    match name {
        "auto" => Ok(None),
        "f32" | "float32" | "float" => Ok(Some(WeightDtype::F32)),
        "bf16" | "bfloat16" => Ok(Some(WeightDtype::Bf16)),
        "f16" | "float16" | "half" => Ok(Some(WeightDtype::F16)),
        other => Err(ModelError::Config(format!(
            "dtype {other:?} is not supported by the cpu executor (supported: auto, float32, bfloat16, float16)"
        ))),
    }
}

/// What `--dtype auto` keeps for a Hugging Face checkpoint: its `config.json`
/// type (`torch_dtype`, or transformers v5's `dtype`) when that is bfloat16
/// or float16, as vLLM keeps a checkpoint's 16-bit type; f32 otherwise.
pub fn checkpoint_dtype(config_json: &str) -> WeightDtype {
    let v: serde_json::Value = serde_json::from_str(config_json).unwrap_or_default();
    let named = v
        .get("dtype")
        .or_else(|| v.get("torch_dtype"))
        .and_then(serde_json::Value::as_str);
    match named {
        Some("bfloat16") => WeightDtype::Bf16,
        Some("float16") => WeightDtype::F16,
        _ => WeightDtype::F32,
    }
}

impl LoadedModel {
    /// Loads `demo` (trained on a book), `demo-random` (random weights), a
    /// Hugging Face model directory, or a GGUF file (by its first bytes,
    /// whatever its name).
    pub fn load(spec: &str, opts: &ModelOptions) -> Result<Self, ModelError> {
        let dtype = weight_dtype(&opts.dtype)?;
        // GGUF tensors and the built-in models keep the types they have.
        let mut auto = WeightDtype::F32;
        let (name, model, tokenizer, is_demo): (String, LlamaModel, Arc<dyn Tokenizer>, bool) =
            if spec == crate::demo::DEMO {
                let (m, t) = crate::demo::trained_demo_model()?;
                (spec.into(), m, Arc::new(t), false)
            } else if spec == crate::demo::DEMO_RANDOM {
                (
                    spec.into(),
                    crate::demo::demo_model()?,
                    Arc::new(ByteTokenizer),
                    true,
                )
            } else {
                let path = Path::new(spec);
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| spec.to_string());
                if path.is_dir() {
                    let (m, t) = crate::loader::load_hf_dir(path)?;
                    if dtype.is_none() {
                        let config =
                            std::fs::read_to_string(path.join("config.json")).unwrap_or_default();
                        auto = checkpoint_dtype(&config);
                    }
                    (name, m, Arc::new(t), false)
                } else if path.is_file() {
                    if !crate::loader::is_gguf_file(path)? {
                        return Err(ModelError::NotGguf(path.to_path_buf()));
                    }
                    let (m, t) = crate::gguf::load_gguf_cached(path, opts.packed_cache.as_ref())?;
                    (name, m, t, false)
                } else if !path.exists() {
                    return Err(ModelError::MissingFile(path.to_path_buf()));
                } else {
                    return Err(ModelError::BadSpec(spec.to_string()));
                }
            };
        let model = match dtype.unwrap_or(auto) {
            WeightDtype::F32 => model,
            other => model.with_weight_dtype(other),
        };
        Ok(Self {
            name,
            model: Arc::new(model),
            tokenizer,
            opts: opts.clone(),
            is_demo,
        })
    }

    /// The model's name (`demo`, `demo-random`, the directory or file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is the random-weight demo model (its text is not meaningful).
    pub fn is_demo(&self) -> bool {
        self.is_demo
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> Arc<dyn Tokenizer> {
        self.tokenizer.clone()
    }

    /// Longest sequence (prompt + generation) the model supports.
    pub fn max_model_len(&self) -> usize {
        self.model.cfg.max_position_embeddings
    }

    /// The weights.
    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.model
    }

    /// A new executor sharing the weights, with its own KV pool.
    pub fn executor(&self) -> Result<Box<dyn Executor>, ModelError> {
        Ok(Box::new(self.cpu_executor()?))
    }

    /// Like [`LoadedModel::executor`], with the concrete type.
    pub fn cpu_executor(&self) -> Result<CpuExecutor, ModelError> {
        let budget = match self.opts.kv_cache_memory {
            Some(b) => KvBudget::Bytes(b),
            None => KvBudget::FractionOfAvailable(self.opts.kv_cache_fraction),
        };
        let mut eos = self.tokenizer.eos_token_ids();
        for e in &self.model.cfg.eos_token_ids {
            if !eos.contains(e) {
                eos.push(*e);
            }
        }
        CpuExecutor::new(
            format!("cpu:{}", self.name),
            self.model.clone(),
            budget,
            eos,
            self.opts.num_threads,
        )
        .map(|e| e.with_kv_dtype(self.opts.kv_cache_dtype))
        .map(|e| e.with_logprobs_mode(self.opts.logprobs_mode))
        .map_err(|e| ModelError::Config(e.to_string()))
    }
}
