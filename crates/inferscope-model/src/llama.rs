//! The Llama-family forward pass over a flattened batch of tokens.

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Module, Tensor};

use crate::attention::{AttnShape, TokenCtx, paged_attention};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kv_pool::KvPool;
use crate::packed::PackedWeight;

/// A layer's weight: dense f32 in panel layout, or quantized.
enum Weight {
    Packed(PackedWeight),
    Quantized(QMatMul),
}

/// `y = x Wᵀ + b` with a dense or quantized `W` (`[out, in]`).
pub struct Linear {
    w: Weight,
    b: Option<Vec<f32>>,
    out_dim: usize,
}

impl Linear {
    /// A layer from its weight (and bias), which must already have the right
    /// shape; dense f32 weights are repacked for the decode kernels.
    pub fn new(w: QMatMul, b: Option<Vec<f32>>, out_dim: usize) -> Result<Self, ModelError> {
        let w = match w {
            QMatMul::Tensor(t) if t.dtype() == DType::F32 && t.rank() == 2 => {
                let (out, inp) = t.dims2()?;
                let data = t.flatten_all()?.to_vec1::<f32>()?;
                Weight::Packed(PackedWeight::pack(&data, out, inp))
            }
            other => Weight::Quantized(other),
        };
        Ok(Self { w, b, out_dim })
    }

    /// `x` is `[rows][in]`; returns `[rows][out]`.
    fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, ModelError> {
        let mut y = match &self.w {
            Weight::Packed(w) => w.matmul(x, rows),
            Weight::Quantized(w) => {
                // Candle's quantized kernels.
                let cols = x.len() / rows.max(1);
                let xt = Tensor::from_slice(x, (rows, cols), &Device::Cpu)?;
                w.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?
            }
        };
        if let Some(b) = &self.b {
            for row in y.chunks_exact_mut(self.out_dim) {
                for (yi, bi) in row.iter_mut().zip(b) {
                    *yi += bi;
                }
            }
        }
        Ok(y)
    }
}

/// Projections of the same input, fused into one product when all are
/// dense: one pass over the input and one product instead of several.
struct Projection {
    parts: Vec<Linear>,
    dims: Vec<usize>,
}

impl Projection {
    fn new(parts: Vec<Linear>) -> Self {
        let dims: Vec<usize> = parts.iter().map(|l| l.out_dim).collect();
        let dense: Vec<&PackedWeight> = parts
            .iter()
            .filter_map(|l| match &l.w {
                Weight::Packed(w) => Some(w),
                Weight::Quantized(_) => None,
            })
            .collect();
        let inp = dense.first().map(|w| w.in_dim());
        if parts.len() < 2
            || dense.len() != parts.len()
            || dense.iter().any(|w| Some(w.in_dim()) != inp)
        {
            return Self { parts, dims };
        }
        let total: usize = dims.iter().sum();
        let rows: Vec<f32> = dense.iter().flat_map(|w| w.unpack()).collect();
        let w = PackedWeight::pack(&rows, total, inp.unwrap_or(0));
        let b = parts.iter().any(|l| l.b.is_some()).then(|| {
            parts
                .iter()
                .flat_map(|l| match &l.b {
                    Some(x) => x.clone(),
                    None => vec![0.0; l.out_dim],
                })
                .collect()
        });
        Self {
            parts: vec![Linear {
                w: Weight::Packed(w),
                b,
                out_dim: total,
            }],
            dims,
        }
    }

    /// One `[rows][dim]` output per projection.
    fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<Vec<f32>>, ModelError> {
        if self.parts.len() == self.dims.len() {
            return self.parts.iter().map(|l| l.forward(x, rows)).collect();
        }
        let y = self.parts[0].forward(x, rows)?;
        let total: usize = self.dims.iter().sum();
        let mut outs: Vec<Vec<f32>> = self
            .dims
            .iter()
            .map(|d| Vec::with_capacity(rows * d))
            .collect();
        for row in y.chunks_exact(total) {
            let mut off = 0;
            for (out, d) in outs.iter_mut().zip(&self.dims) {
                out.extend_from_slice(&row[off..off + d]);
                off += d;
            }
        }
        Ok(outs)
    }
}

/// A layer as the forward pass runs it.
struct Block {
    attn_norm: Vec<f32>,
    qkv: Projection,
    o: Linear,
    mlp_norm: Vec<f32>,
    gate_up: Projection,
    down: Linear,
}

/// One decoder layer.
pub struct Layer {
    /// RMSNorm weight before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection.
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub o: Linear,
    /// RMSNorm weight before the MLP.
    pub mlp_norm: Vec<f32>,
    /// SwiGLU gate.
    pub gate: Linear,
    /// SwiGLU up projection.
    pub up: Linear,
    /// SwiGLU down projection.
    pub down: Linear,
}

/// A loaded Llama-family model (weights only; the KV cache is per executor).
pub struct LlamaModel {
    /// Hyper-parameters.
    pub cfg: ModelConfig,
    /// Token embeddings, `[vocab][hidden]`.
    pub embed: Vec<f32>,
    layers: Vec<Block>,
    /// Final RMSNorm weight.
    pub norm: Vec<f32>,
    /// LM head (`[vocab, hidden]`, the embeddings when tied).
    pub lm_head: Linear,
    inv_freq: Vec<f32>,
}

/// What one step computes attention for: one entry per token.
pub(crate) struct StepTokens<'a> {
    pub ids: &'a [u32],
    pub ctx: &'a [TokenCtx],
    pub block_tables: &'a [u32],
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, v), wi) in or.iter_mut().zip(xr).zip(w) {
            *o = v * r * wi;
        }
    }
}

/// Rotates each head of `x` (`[tokens][heads * d]`) by its token's angles.
fn apply_rope(x: &mut [f32], heads: usize, d: usize, cos: &[f32], sin: &[f32], interleaved: bool) {
    let half = d / 2;
    for (t, row) in x.chunks_exact_mut(heads * d).enumerate() {
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for head in row.chunks_exact_mut(d) {
            if interleaved {
                for i in 0..half {
                    let (a, b) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = a * c[i] - b * s[i];
                    head[2 * i + 1] = b * c[i] + a * s[i];
                }
            } else {
                for i in 0..half {
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * c[i] - b * s[i];
                    head[i + half] = b * c[i] + a * s[i];
                }
            }
        }
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

impl LlamaModel {
    /// Assembles a model (shapes were checked by the loader), fusing the
    /// q/k/v and gate/up projections where the weights are dense.
    pub fn new(
        cfg: ModelConfig,
        embed: Vec<f32>,
        layers: Vec<Layer>,
        norm: Vec<f32>,
        lm_head: Linear,
    ) -> Result<Self, ModelError> {
        let inv_freq = cfg.rope_inv_freq();
        let layers = layers
            .into_iter()
            .map(|l| Block {
                attn_norm: l.attn_norm,
                qkv: Projection::new(vec![l.q, l.k, l.v]),
                o: l.o,
                mlp_norm: l.mlp_norm,
                gate_up: Projection::new(vec![l.gate, l.up]),
                down: l.down,
            })
            .collect();
        Ok(Self {
            cfg,
            embed,
            layers,
            norm,
            lm_head,
            inv_freq,
        })
    }

    /// Divides the RoPE frequencies by per-frequency factors (GGUF's
    /// `rope_freqs.weight`, how llama.cpp stores Llama-3 rope scaling).
    pub fn with_rope_freq_factors(mut self, factors: &[f32]) -> Result<Self, ModelError> {
        if factors.len() != self.inv_freq.len() {
            return Err(ModelError::ShapeMismatch {
                name: "rope_freqs.weight".into(),
                expected: vec![self.inv_freq.len()],
                actual: vec![factors.len()],
            });
        }
        for (f, d) in self.inv_freq.iter_mut().zip(factors) {
            *f /= d;
        }
        Ok(self)
    }

    /// Runs all tokens of a step through the decoder, writing their K/V into
    /// `pool`, and returns the logits of the tokens in `logit_rows`
    /// (`[logit_rows.len()][vocab]`).
    pub(crate) fn forward(
        &self,
        step: &StepTokens<'_>,
        pool: &mut KvPool,
        logit_rows: &[usize],
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.cfg;
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let n = step.ids.len();
        let eps = cfg.rms_norm_eps as f32;
        let bs = pool.block_size();

        let mut x = Vec::with_capacity(n * h);
        for &id in step.ids {
            let id = id as usize;
            x.extend_from_slice(&self.embed[id * h..(id + 1) * h]);
        }
        // The angles depend on the position only: computed once per step.
        let half = d / 2;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for c in step.ctx {
            let p = c.pos as f32;
            for &f in &self.inv_freq {
                let a = p * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let shape = AttnShape {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: d,
        };
        let mut normed = vec![0f32; n * h];
        let mut attn = vec![0f32; n * nh * d];
        for (li, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, eps, &mut normed);
            let mut qkv = layer.qkv.forward(&normed, n)?.into_iter();
            let (Some(mut q), Some(mut k), Some(v)) = (qkv.next(), qkv.next(), qkv.next()) else {
                return Err(ModelError::Config("q/k/v projection lost a part".into()));
            };
            apply_rope(&mut q, nh, d, &cos, &sin, cfg.rope_interleaved);
            apply_rope(&mut k, nkv, d, &cos, &sin, cfg.rope_interleaved);
            for (t, c) in step.ctx.iter().enumerate() {
                let block = step.block_tables[c.table_offset + c.pos / bs] as usize;
                let kv = nkv * d;
                pool.write(
                    li,
                    block,
                    c.pos % bs,
                    &k[t * kv..(t + 1) * kv],
                    &v[t * kv..(t + 1) * kv],
                );
            }
            paged_attention(&q, &mut attn, step.ctx, step.block_tables, pool, li, shape);
            let o = layer.o.forward(&attn, n)?;
            for (xi, oi) in x.iter_mut().zip(&o) {
                *xi += oi;
            }
            rms_norm(&x, &layer.mlp_norm, eps, &mut normed);
            let mut gu = layer.gate_up.forward(&normed, n)?.into_iter();
            let (Some(mut g), Some(u)) = (gu.next(), gu.next()) else {
                return Err(ModelError::Config("gate/up projection lost a part".into()));
            };
            for (gi, ui) in g.iter_mut().zip(&u) {
                *gi = silu(*gi) * ui;
            }
            let down = layer.down.forward(&g, n)?;
            for (xi, di) in x.iter_mut().zip(&down) {
                *xi += di;
            }
        }
        // Only the tokens that sample need the (large) LM head.
        let mut last = Vec::with_capacity(logit_rows.len() * h);
        for &r in logit_rows {
            last.extend_from_slice(&x[r * h..(r + 1) * h]);
        }
        if logit_rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut last_normed = vec![0f32; last.len()];
        rms_norm(&last, &self.norm, eps, &mut last_normed);
        self.lm_head.forward(&last_normed, logit_rows.len())
    }
}
