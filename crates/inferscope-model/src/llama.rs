//! The Llama-family forward pass over a flattened batch of tokens.

use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Storage, Tensor};

use crate::attention::{AttnShape, TokenCtx, paged_attention};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kv_pool::KvPool;
use crate::skinny;

/// `y = x Wᵀ + b` with a dense or quantized `W` (`[out, in]`).
pub struct Linear {
    w: QMatMul,
    b: Option<Vec<f32>>,
    out_dim: usize,
}

impl Linear {
    /// A layer from its weight (and bias), which must already have the right shape.
    pub fn new(w: QMatMul, b: Option<Vec<f32>>, out_dim: usize) -> Self {
        Self { w, b, out_dim }
    }

    /// `x` is `[rows][in]`; returns `[rows][out]`.
    fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, ModelError> {
        let cols = x.len() / rows.max(1);
        let mut y = match &self.w {
            QMatMul::Tensor(w) if rows <= skinny::MAX_ROWS => {
                let (storage, layout) = w.storage_and_layout();
                match (&*storage, layout.contiguous_offsets()) {
                    (Storage::Cpu(cpu), Some((start, end))) => {
                        let w = &cpu.as_slice::<f32>()?[start..end];
                        skinny::matmul_t(x, w, rows, cols, self.out_dim)
                    }
                    _ => {
                        drop(storage);
                        self.general(x, rows, cols)?
                    }
                }
            }
            _ => self.general(x, rows, cols)?,
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

impl Linear {
    /// Through candle's matmul (GEMM, or the quantized kernels).
    fn general(&self, x: &[f32], rows: usize, cols: usize) -> Result<Vec<f32>, ModelError> {
        let xt = Tensor::from_slice(x, (rows, cols), &Device::Cpu)?;
        Ok(self.w.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// Projections of the same input, fused into one product when all are
/// dense: one pass over the input and one GEMM instead of several.
struct Projection {
    parts: Vec<Linear>,
    dims: Vec<usize>,
}

impl Projection {
    fn new(parts: Vec<Linear>) -> Result<Self, ModelError> {
        let dims: Vec<usize> = parts.iter().map(|l| l.out_dim).collect();
        let dense: Vec<Tensor> = parts
            .iter()
            .filter_map(|l| match &l.w {
                QMatMul::Tensor(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        if parts.len() < 2 || dense.len() != parts.len() {
            return Ok(Self { parts, dims });
        }
        let w = Tensor::cat(&dense, 0)?;
        let b = if parts.iter().any(|l| l.b.is_some()) {
            let mut b = Vec::new();
            for l in &parts {
                match &l.b {
                    Some(x) => b.extend_from_slice(x),
                    None => b.extend(std::iter::repeat_n(0.0, l.out_dim)),
                }
            }
            Some(b)
        } else {
            None
        };
        let total = dims.iter().sum();
        Ok(Self {
            parts: vec![Linear::new(QMatMul::Tensor(w), b, total)],
            dims,
        })
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
            .map(|l| {
                Ok(Block {
                    attn_norm: l.attn_norm,
                    qkv: Projection::new(vec![l.q, l.k, l.v])?,
                    o: l.o,
                    mlp_norm: l.mlp_norm,
                    gate_up: Projection::new(vec![l.gate, l.up])?,
                    down: l.down,
                })
            })
            .collect::<Result<_, ModelError>>()?;
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
