//! GGUF files: Llama-family weights (quantized ones stay quantized, F16 and
//! BF16 stay 16-bit) and the tokenizer from the metadata.
//!
//! The file is mapped, not read: the embedding table is used in place from
//! the map (rows dequantized per looked-up token), and the weights the
//! packed kernels read are repacked from the map, after which their pages
//! are dropped from the process (`MADV_DONTNEED`: they stay in the page
//! cache, so a restart reads no disk, but not in this process's RSS).

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Device;
use memmap2::{Mmap, UncheckedAdvice};

use crate::embedding::{Embedding, SharedBytes};

use crate::config::{
    Activation, ArchOptions, ModelConfig, MoeOptions, RopeScaling, architecture_of_gguf,
};
use crate::error::ModelError;
use crate::gguf_file::{GgufFile, TensorType, invalid};
use crate::gguf_meta::Meta;
use crate::gguf_tokenizer::TokenizerMeta;
use crate::llama::{Expert, Layer, Linear, LlamaModel, Mlp, stored_kquant};
use crate::packed_cache::{CacheSession, PackedCache};
use crate::packed_kquant::PackedKQuant;
use crate::tokenizer::{HfTokenizer, Tokenizer};

/// Tensors of the mapped file, checked for names, shapes and extent.
struct Tensors<'a> {
    content: &'a GgufFile,
    map: &'a Arc<Mmap>,
    path: &'a Path,
    /// Bytes of the file repacked into the process's own memory.
    repacked: usize,
    /// The packed-weights cache of this load, when used.
    cache: Option<CacheSession>,
}

impl Tensors<'_> {
    /// `make` run to repack weight `name` (`[out, inp]`, bias `b`) from
    /// `bytes` of the file, or its panels read in place from the
    /// packed-weights cache instead (then nothing counts as repacked).
    fn repack_or_map(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        b: Option<Vec<f32>>,
        bytes: usize,
        make: impl FnOnce(Option<Vec<f32>>) -> Result<Linear, ModelError>,
    ) -> Result<Linear, ModelError> {
        let repacked = &mut self.repacked;
        let make = |b| {
            *repacked += bytes;
            make(b)
        };
        match &mut self.cache {
            Some(c) => c.weight(name, out, inp, b, make),
            None => make(b),
        }
    }

    fn has(&self, name: &str) -> bool {
        self.content.tensor(name).is_some()
    }

    /// The type of tensor `name` and where its bytes are in the map.
    fn locate(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<(TensorType, Range<usize>), ModelError> {
        let info = self
            .content
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if info.dims != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: info.dims.clone(),
            });
        }
        let dtype = info.ty;
        let elems: usize = shape.iter().product();
        let bad =
            |m: String| ModelError::Config(format!("{}: tensor {name}: {m}", self.path.display()));
        // `check_types` refused the others at the start.
        let (block, block_bytes) = dtype
            .block()
            .ok_or_else(|| bad(format!("type {} does not load", dtype.name())))?;
        // Blocks run along the innermost dimension.
        if shape.last().is_some_and(|&d| d % block != 0) {
            return Err(bad(format!(
                "rows of {:?} elements are not whole {} blocks",
                shape.last(),
                dtype.name()
            )));
        }
        let len = elems / block * block_bytes;
        let start = self
            .content
            .data_offset
            .checked_add(info.offset)
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| bad("offset overflows".into()))?;
        match start.checked_add(len) {
            Some(end) if end <= self.map.len() => Ok((dtype, start..end)),
            _ => Err(bad(format!(
                "{len} bytes at {start} pass the end of the file ({} bytes): truncated?",
                self.map.len()
            ))),
        }
    }

    /// Drops the pages of `range` from this process once their contents
    /// were copied (repacked): they stay in the page cache.
    fn release(&self, range: Range<usize>) {
        // SAFETY: the map is read-only and shared: MADV_DONTNEED only
        // unmaps its pages from this process, and a later read faults
        // them back in from the file, unchanged (nothing was written).
        // memmap2 widens the range to whole pages: a neighbour's page
        // dropped too is read back the same way.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(UncheckedAdvice::DontNeed, range.start, range.len())
        };
    }

    /// A vector (norm weights, RoPE factors), dequantized.
    fn vec(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let (dtype, range) = self.locate(name, &[len])?;
        let bytes = &self.map[range.clone()];
        let v = match dtype {
            TensorType::IQ4_NL | TensorType::IQ4_XS => {
                let mut v = vec![0f32; len];
                if dtype == TensorType::IQ4_NL {
                    crate::iq4::dequantize_nl(bytes, &mut v);
                } else {
                    crate::iq4::dequantize_xs(bytes, &mut v);
                }
                v
            }
            t => {
                let d = t.candle().expect("a type that loads is IQ4 or candle's");
                // candle copies the blocks (into aligned storage).
                let t = candle_core::quantized::ggml_file::qtensor_from_ggml(
                    d,
                    bytes,
                    vec![len],
                    &Device::Cpu,
                )?;
                t.dequantize(&Device::Cpu)?.to_vec1::<f32>()?
            }
        };
        self.release(range);
        Ok(v)
    }

    /// A product's weight, repacked from the map.
    fn stored_linear(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        b: Option<Vec<f32>>,
    ) -> Result<Linear, ModelError> {
        let (dtype, range) = self.locate(name, &[out, inp])?;
        let map = self.map;
        let bytes = &map[range.clone()];
        let l = self.repack_or_map(name, out, inp, b, range.len(), |b| {
            Linear::from_stored(dtype, bytes, out, inp, b)
                .map_err(|e| ModelError::Config(format!("tensor {name}: {e}")))
        })?;
        self.release(range);
        Ok(l)
    }

    /// Projections of one input, `(name, out)` each (`[out, inp]`), in
    /// order: a run of adjacent ones stored in one K-quant type that stack
    /// is repacked straight into one fused weight (each block read once,
    /// nothing copied again), a run of dense, Q8_0 or IQ4_NL ones from
    /// their bytes concatenated; the rest one by one, for the model to fuse
    /// or keep apart. (Fused here, a weight is what the packed-weights cache
    /// saves.)
    fn linears(
        &mut self,
        names: &[(String, usize)],
        inp: usize,
        bias: bool,
    ) -> Result<Vec<Linear>, ModelError> {
        let located = names
            .iter()
            .map(|(name, out)| self.locate(&format!("{name}.weight"), &[*out, inp]))
            .collect::<Result<Vec<_>, _>>()?;
        let outs: Vec<usize> = names.iter().map(|(_, out)| *out).collect();
        let mut linears = Vec::new();
        let mut s = 0;
        while s < names.len() {
            // The longest run from `s` of one type that fuses here: a
            // K-quant whose parts stack, or a dense, Q8_0 or IQ4_NL type,
            // whose rows stack by concatenating their bytes.
            let (dtype, kind) = (located[s].0, stored_kquant(located[s].0));
            let concatenates = matches!(
                dtype,
                TensorType::F32
                    | TensorType::F16
                    | TensorType::BF16
                    | TensorType::Q8_0
                    | TensorType::IQ4_NL
            );
            let mut e = s + 1;
            while (concatenates || kind.is_some())
                && e < names.len()
                && located[e].0 == dtype
                && (concatenates || PackedKQuant::stacks(&outs[s..=e]))
            {
                e += 1;
            }
            if e - s < 2 {
                linears.push(self.linear(&names[s].0, names[s].1, inp, bias)?);
                s += 1;
                continue;
            }
            let run = &names[s..e];
            let parts: Vec<(&[u8], usize)> = located[s..e]
                .iter()
                .zip(run)
                .map(|((_, range), (_, out))| (&self.map[range.clone()], *out))
                .collect();
            let b = if bias {
                let mut b = Vec::new();
                for (name, out) in run {
                    b.extend(self.vec(&format!("{name}.bias"), *out)?);
                }
                Some(b)
            } else {
                None
            };
            let name = run
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join("+");
            let out = run.iter().map(|(_, o)| o).sum();
            let bytes = located[s..e].iter().map(|(_, r)| r.len()).sum();
            let fused = self.repack_or_map(&name, out, inp, b, bytes, |b| {
                match kind {
                    Some(kind) => Linear::from_kquant_parts(kind, &parts, inp, b),
                    None => {
                        let blocks: Vec<u8> = parts.iter().flat_map(|(p, _)| *p).copied().collect();
                        Linear::from_stored(dtype, &blocks, out, inp, b)
                    }
                }
                .map_err(|err| {
                    ModelError::Config(format!(
                        "tensors {}..{}: {err}",
                        run[0].0,
                        run[run.len() - 1].0
                    ))
                })
            })?;
            for (_, range) in &located[s..e] {
                self.release(range.clone());
            }
            linears.push(fused);
            s = e;
        }
        Ok(linears)
    }

    /// Each expert's gate and up from the stacked `[n, out, in]` tensors
    /// `gate` and `up`: one fused weight per expert, repacked straight from
    /// its two slices of the map, where they stack; else the two apart.
    fn expert_gate_ups(
        &mut self,
        gate: &str,
        up: &str,
        n: usize,
        out: usize,
        inp: usize,
    ) -> Result<Vec<Vec<Linear>>, ModelError> {
        let (gt, gr) = self.locate(gate, &[n, out, inp])?;
        let (ut, ur) = self.locate(up, &[n, out, inp])?;
        let each = gr.len() / n.max(1);
        let kind = stored_kquant(gt).filter(|_| gt == ut && PackedKQuant::stacks(&[out, out]));
        if let Some(kind) = kind {
            let map = self.map;
            let slice = |r: &Range<usize>, e: usize| &map[r.start + e * each..][..each];
            let fused = (0..n)
                .map(|e| {
                    let parts = [(slice(&gr, e), out), (slice(&ur, e), out)];
                    self.repack_or_map(
                        &format!("{gate}+{up}#{e}"),
                        2 * out,
                        inp,
                        None,
                        2 * each,
                        |_| {
                            Linear::from_kquant_parts(kind, &parts, inp, None).map_err(|err| {
                                ModelError::Config(format!(
                                    "tensors {gate}, {up}, expert {e}: {err}"
                                ))
                            })
                        },
                    )
                    .map(|l| vec![l])
                })
                .collect::<Result<Vec<_>, _>>()?;
            for r in [gr, ur] {
                self.release(r);
            }
            return Ok(fused);
        }
        let gates = self.expert_linears(gate, n, out, inp)?;
        let ups = self.expert_linears(up, n, out, inp)?;
        Ok(gates
            .into_iter()
            .zip(ups)
            .map(|(g, u)| vec![g, u])
            .collect())
    }

    /// The `n` experts' weights of a stacked `[n, out, in]` tensor, each
    /// repacked from its own slice of the map (the experts lie one after
    /// the other, in whole blocks, in the stored type).
    fn expert_linears(
        &mut self,
        name: &str,
        n: usize,
        out: usize,
        inp: usize,
    ) -> Result<Vec<Linear>, ModelError> {
        let (dtype, range) = self.locate(name, &[n, out, inp])?;
        let each = range.len() / n.max(1);
        let map = self.map;
        let experts = (0..n)
            .map(|e| {
                let at = range.start + e * each;
                self.repack_or_map(&format!("{name}#{e}"), out, inp, None, each, |_| {
                    Linear::from_stored(dtype, &map[at..at + each], out, inp, None).map_err(|err| {
                        ModelError::Config(format!("tensor {name}, expert {e}: {err}"))
                    })
                })
            })
            .collect::<Result<_, _>>()?;
        self.release(range);
        Ok(experts)
    }

    fn linear(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, ModelError> {
        let b = if bias {
            Some(self.vec(&format!("{name}.bias"), out)?)
        } else {
            None
        };
        self.stored_linear(&format!("{name}.weight"), out, inp, b)
    }
}

/// Loads a GGUF file: weights, and the tokenizer from `tokenizer.json`
/// beside the file or else from the GGUF metadata.
pub fn load_gguf(path: &Path) -> Result<(LlamaModel, Arc<dyn Tokenizer>), ModelError> {
    load_gguf_cached(path, None)
}

/// As [`load_gguf`], with the packed weights read from `cache` when an
/// earlier start saved them there, and saved there when not.
pub fn load_gguf_cached(
    path: &Path,
    cache: Option<&PackedCache>,
) -> Result<(LlamaModel, Arc<dyn Tokenizer>), ModelError> {
    if !path.is_file() {
        return Err(ModelError::MissingFile(path.to_path_buf()));
    }
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let started = Instant::now();
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only. As for llama.cpp's maps, another
    // process truncating the file while the server runs would make later
    // reads of the lost pages fault; rewriting it in place would change
    // the weights. Model files are not modified while served.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io)?);
    let content = GgufFile::parse(&map).map_err(|e| invalid(path, &e))?;
    content.check_types(path)?;
    let meta = Meta(&content.metadata);
    let arch = meta
        .str("general.architecture")
        .ok_or_else(|| ModelError::Config("GGUF metadata lacks general.architecture".into()))?
        .to_string();
    // llama.cpp writes Mixtral as `llama` with experts.
    let experts = meta.opt_usize(&format!("{arch}.expert_count")).unwrap_or(0);
    let mixtral = arch == "llama" && experts > 0;
    let Some(architecture) = (if mixtral {
        Some("MixtralForCausalLM")
    } else {
        architecture_of_gguf(&arch)
    }) else {
        return Err(ModelError::UnsupportedArchitecture {
            name: arch,
            supported: crate::config::supported_architectures(),
        });
    };
    // Phi-3's LongRoPE (the 128k models) comes as per-frequency factors.
    if ["rope_factors_long.weight", "rope_factors_short.weight"]
        .iter()
        .any(|t| content.tensor(t).is_some())
    {
        return Err(ModelError::Config(
            "unsupported rope type \"longrope\" (rope_factors_long/short): \
             only Phi-3 models without rope scaling load"
                .into(),
        ));
    }
    let is_gemma = arch.starts_with("gemma");
    let hidden_size = meta.usize(&format!("{arch}.embedding_length"))?;
    let num_heads = meta.usize(&format!("{arch}.attention.head_count"))?;
    let head_dim = meta
        .opt_usize(&format!("{arch}.attention.key_length"))
        .or_else(|| meta.opt_usize(&format!("{arch}.rope.dimension_count")))
        .unwrap_or(hidden_size / num_heads.max(1));
    let vocab_size = match meta.opt_usize(&format!("{arch}.vocab_size")) {
        Some(v) => v,
        None => content
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.first().copied())
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?,
    };
    let num_layers = meta.usize(&format!("{arch}.block_count"))?;
    let sliding_window = match arch.as_str() {
        // Written by llama.cpp where the architecture has one; Qwen's
        // only applies to some layers, and llama.cpp ignores it too.
        "qwen2" | "qwen3" | "qwen3moe" => None,
        _ => meta
            .opt_usize(&format!("{arch}.attention.sliding_window"))
            .filter(|&w| w > 0),
    };
    let f32_key = |k: &str| meta.opt_f64(&format!("{arch}.{k}")).map(|x| x as f32);
    let gemma2 = arch == "gemma2";
    let arch_options = ArchOptions {
        qk_norm: matches!(arch.as_str(), "qwen3" | "qwen3moe" | "gemma3"),
        post_norms: is_gemma,
        // convert_hf_to_gguf.py already added Gemma's 1 to the norms.
        norm_offset: false,
        embed_scale: is_gemma,
        activation: if is_gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        // As llama.cpp: the scale is 1/√head_dim except for the 27B
        // models (62 layers for Gemma 3, 46 for Gemma 2), whose
        // `query_pre_attn_scalar` is hidden / heads; GGUF has no key for it.
        query_pre_attn_scalar: (is_gemma && num_layers == if gemma2 { 46 } else { 62 })
            .then(|| hidden_size / num_heads.max(1)),
        attn_logit_softcapping: gemma2.then(|| f32_key("attn_logit_softcapping")).flatten(),
        final_logit_softcapping: gemma2.then(|| f32_key("final_logit_softcapping")).flatten(),
        sliding_window_pattern: match arch.as_str() {
            "gemma2" => Some(2),
            "gemma3" => Some(6),
            _ => None,
        },
        rope_local_theta: (arch == "gemma3")
            .then(|| f32_key("rope.freq_base_swa").unwrap_or(10_000.0)),
        moe: moe_of_gguf(&meta, &arch, experts)?,
    };
    // llama.cpp writes linear scaling (Gemma 3 4B–27B) as a type and a
    // factor; Llama 3's comes as `rope_freqs.weight` (below). Any other
    // type is refused rather than ignored.
    let rope_scaling = match meta.str(&format!("{arch}.rope.scaling.type")) {
        None | Some("none") => None,
        Some("linear") => match f32_key("rope.scaling.factor") {
            Some(factor) if factor > 0.0 => Some(RopeScaling::Linear { factor }),
            _ => {
                return Err(ModelError::Config(format!(
                    "{arch}.rope.scaling.type is linear without a positive {arch}.rope.scaling.factor"
                )));
            }
        },
        Some(other) => {
            return Err(ModelError::Config(format!(
                "unsupported rope type {other:?} in {arch}.rope.scaling.type (supported: none, linear)"
            )));
        }
    };
    let tokens_meta = TokenizerMeta::read(&meta);
    let mut tensors = Tensors {
        content: &content,
        map: &map,
        path,
        repacked: 0,
        cache: cache.and_then(|c| CacheSession::open(c, path)),
    };
    let cfg = ModelConfig {
        architecture: architecture.to_string(),
        vocab_size,
        hidden_size,
        intermediate_size: match &arch_options.moe {
            // Every layer is a MoE one: the dense width is the experts'.
            Some(m) => meta
                .opt_usize(&format!("{arch}.feed_forward_length"))
                .unwrap_or(m.expert_intermediate_size),
            None => meta.usize(&format!("{arch}.feed_forward_length"))?,
        },
        num_layers,
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
        rope_scaling,
        // llama.cpp permutes the q/k rows of Llama and Mistral checkpoints
        // for the interleaved (GPT-J) rotation; the others keep the NeoX
        // layout.
        rope_interleaved: matches!(arch.as_str(), "llama" | "mistral"),
        max_position_embeddings: meta
            .opt_usize(&format!("{arch}.context_length"))
            .unwrap_or(4096),
        tie_word_embeddings: !tensors.has("output.weight"),
        attention_bias: tensors.has("blk.0.attn_q.bias"),
        bos_token_id: tokens_meta.bos,
        eos_token_ids: tokens_meta.eos.into_iter().collect(),
        sliding_window,
        arch: arch_options,
    };
    cfg.validate()?;
    let (h, v, i) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let (d, q_dim) = (cfg.head_dim, cfg.num_heads * cfg.head_dim);
    let kv_dim = cfg.num_kv_heads * cfg.head_dim;
    // The table stays in the map, in its stored type.
    let (embd_dtype, embd_range) = tensors.locate("token_embd.weight", &[v, h])?;
    let embed = Embedding::stored(
        map.clone() as SharedBytes,
        embd_range.start,
        embd_dtype,
        v,
        h,
    )?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for l in 0..cfg.num_layers {
        let p = format!("blk.{l}");
        let bias = cfg.attention_bias;
        let qk_norm = if cfg.arch.qk_norm {
            Some((
                tensors.vec(&format!("{p}.attn_q_norm.weight"), d)?,
                tensors.vec(&format!("{p}.attn_k_norm.weight"), d)?,
            ))
        } else {
            None
        };
        let post = cfg.arch.post_norms;
        let post_norm = |name: &str| {
            post.then(|| tensors.vec(&format!("{p}.{name}.weight"), h))
                .transpose()
        };
        let (post_attn_norm, post_mlp_norm) = (
            post_norm("post_attention_norm")?,
            post_norm("post_ffw_norm")?,
        );
        layers.push(Layer {
            attn_norm: tensors.vec(&format!("{p}.attn_norm.weight"), h)?,
            // Phi-3's q/k/v are one `attn_qkv` tensor.
            qkv: if tensors.has(&format!("{p}.attn_qkv.weight")) {
                vec![tensors.linear(&format!("{p}.attn_qkv"), q_dim + 2 * kv_dim, h, bias)?]
            } else {
                let qkv = [("q", q_dim), ("k", kv_dim), ("v", kv_dim)]
                    .map(|(x, out)| (format!("{p}.attn_{x}"), out));
                tensors.linears(&qkv, h, bias)?
            },
            qk_norm,
            o: tensors.linear(&format!("{p}.attn_output"), h, q_dim, false)?,
            post_attn_norm,
            mlp_norm: tensors.vec(&format!("{p}.ffn_norm.weight"), h)?,
            mlp: match &cfg.arch.moe {
                // The router, and the experts stacked along a third dimension.
                Some(m) => {
                    let (n, ei) = (m.num_experts, m.expert_intermediate_size);
                    let stacked = |t: &mut Tensors, name: &str, out, inp| {
                        t.expert_linears(&format!("{p}.{name}.weight"), n, out, inp)
                    };
                    let gate_ups = tensors.expert_gate_ups(
                        &format!("{p}.ffn_gate_exps.weight"),
                        &format!("{p}.ffn_up_exps.weight"),
                        n,
                        ei,
                        h,
                    )?;
                    let downs = stacked(&mut tensors, "ffn_down_exps", h, ei)?;
                    Mlp::Moe {
                        router: tensors.linear(&format!("{p}.ffn_gate_inp"), n, h, false)?,
                        experts: gate_ups
                            .into_iter()
                            .zip(downs)
                            .map(|(gate_up, down)| Expert { gate_up, down })
                            .collect(),
                    }
                }
                None => Mlp::Dense(Expert {
                    // Phi-3's gate and up are one `ffn_up` of twice the rows.
                    gate_up: if tensors.has(&format!("{p}.ffn_gate.weight")) {
                        let gate_up =
                            [("gate", i), ("up", i)].map(|(x, out)| (format!("{p}.ffn_{x}"), out));
                        tensors.linears(&gate_up, h, false)?
                    } else {
                        vec![tensors.linear(&format!("{p}.ffn_up"), 2 * i, h, false)?]
                    },
                    down: tensors.linear(&format!("{p}.ffn_down"), h, i, false)?,
                }),
            },
            post_mlp_norm,
        });
    }
    let norm = tensors.vec("output_norm.weight", h)?;
    let lm_head = if cfg.tie_word_embeddings {
        // The packed kernels on the table's stored type; lookups still
        // read the map.
        tensors.stored_linear("token_embd.weight", v, h, None)?
    } else {
        tensors.linear("output", v, h, false)?
    };
    let mut model = LlamaModel::new(cfg.clone(), embed, layers, norm, lm_head)?;
    if tensors.has("rope_freqs.weight") {
        let factors = tensors.vec("rope_freqs.weight", cfg.head_dim / 2)?;
        model = model.with_rope_freq_factors(&factors)?;
    }
    let cache = tensors.cache.take();
    tracing::info!(
        file = %path.display(),
        file_bytes = map.len(),
        embedding_in_place_bytes = model.embed.stored_bytes(),
        embedding_dtype = ?embd_dtype,
        repacked_file_bytes = tensors.repacked,
        packed_bytes = model.weight_bytes(),
        mapped_from_cache_bytes = model.mapped_weight_bytes(),
        load_seconds = started.elapsed().as_secs_f64(),
        "mapped GGUF file: embeddings read in place, products repacked or mapped from the packed-weights cache"
    );
    if let Some(c) = cache {
        c.finish();
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

/// The experts of a GGUF file's `{arch}.expert_*` keys (`n` of them; `None`
/// without). As llama.cpp runs `llama` (Mixtral) and `qwen3moe` files: every
/// layer is a MoE one, and the top-k probabilities are renormalised.
fn moe_of_gguf(meta: &Meta, arch: &str, n: usize) -> Result<Option<MoeOptions>, ModelError> {
    if n == 0 {
        return Ok(None);
    }
    if !matches!(arch, "llama" | "qwen3moe") {
        return Err(ModelError::Config(format!(
            "{arch} with experts ({arch}.expert_count = {n}) is not supported \
             (mixtures of experts: llama (Mixtral), qwen3moe)"
        )));
    }
    let used = meta.usize(&format!("{arch}.expert_used_count"))?;
    // llama.cpp: the experts' width, else the dense one per chosen expert.
    let width = match meta.opt_usize(&format!("{arch}.expert_feed_forward_length")) {
        Some(w) if arch == "qwen3moe" && w > 0 => w,
        _ if arch == "qwen3moe" => {
            meta.usize(&format!("{arch}.feed_forward_length"))? / used.max(1)
        }
        _ => meta.usize(&format!("{arch}.feed_forward_length"))?,
    };
    if let Some(scale) = meta.opt_f64(&format!("{arch}.expert_weights_scale"))
        && scale != 0.0
        && scale != 1.0
    {
        return Err(ModelError::Config(format!(
            "{arch}.expert_weights_scale {scale} is not supported (only 1)"
        )));
    }
    Ok(Some(MoeOptions {
        num_experts: n,
        experts_per_token: used,
        expert_intermediate_size: width,
        norm_topk_prob: true,
        sparse_step: 1,
        dense_layers: Vec::new(),
    }))
}
