//! The Llama-family forward pass over a flattened batch of tokens: one
//! decoder for Llama, Mistral, Qwen2/3, Gemma 2/3 and Phi-3, whose
//! differences (`config::ArchOptions`) are resolved per layer at load.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use half::f16;

use crate::attention::{AttnShape, Queries, TokenCtx, paged_attention};
use crate::config::{Activation, ModelConfig};
use crate::elementwise::{gated_rows, rms_norm, rms_norm_in_place};
use crate::embedding::Embedding;
use crate::error::ModelError;
use crate::gguf_file::TensorType;
use crate::kv_storage::KvStorage;
use crate::packed::tiling::PARALLEL_MIN_MACS;
use crate::packed::{PackedWeight, WeightDtype};
use crate::packed_kquant::{KQuant, PackedKQuant};
use crate::packed_q8::PackedQ8;

/// A layer's weight: dense f32, Q8_0 or a K-quant in panel layout, or
/// another quantized format (candle's kernels).
// A few per layer: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Weight {
    Packed(PackedWeight),
    Q8(PackedQ8),
    KQuant(PackedKQuant),
    Quantized(QMatMul),
}

/// A weight in a form the packed-weights cache saves and maps back.
#[derive(Clone)]
pub(crate) enum Packed {
    Dense(PackedWeight),
    KQuant(PackedKQuant),
    Q8(PackedQ8),
}

/// `y = x Wᵀ + b` with a dense or quantized `W` (`[out, in]`).
pub struct Linear {
    w: Weight,
    b: Option<Vec<f32>>,
    out_dim: usize,
}

impl Linear {
    /// A layer from its weight (and bias), which must already have the right
    /// shape; dense f32, Q8_0, Q4_K, Q5_K and Q6_K weights are repacked for
    /// the packed kernels.
    pub fn new(w: QMatMul, b: Option<Vec<f32>>, out_dim: usize) -> Result<Self, ModelError> {
        let w = match w {
            QMatMul::Tensor(t) if t.dtype() == DType::F32 && t.rank() == 2 => {
                let (out, inp) = t.dims2()?;
                let data = t.flatten_all()?.to_vec1::<f32>()?;
                Weight::Packed(PackedWeight::pack(&data, out, inp))
            }
            QMatMul::QTensor(t) if t.dtype() == GgmlDType::Q8_0 && t.rank() == 2 => {
                let (out, inp) = t.shape().dims2()?;
                Weight::Q8(PackedQ8::from_blocks(&t.data()?, out, inp)?)
            }
            QMatMul::QTensor(t) if t.rank() == 2 && kquant(t.dtype()).is_some() => {
                let (out, inp) = t.shape().dims2()?;
                let kind = kquant(t.dtype()).expect("matched above");
                Weight::KQuant(PackedKQuant::from_blocks(kind, &t.data()?, out, inp)?)
            }
            other => Weight::Quantized(other),
        };
        Ok(Self { w, b, out_dim })
    }

    /// A layer from a GGUF tensor (`[out, in]`); see [`Linear::from_stored`].
    pub fn from_qtensor(w: QTensor, b: Option<Vec<f32>>) -> Result<Self, ModelError> {
        match *w.shape().dims() {
            [out, inp] => Self::from_stored(w.dtype().into(), &w.data()?, out, inp, b),
            _ => {
                let out = w.shape().dims().first().copied().unwrap_or(0);
                Self::new(QMatMul::from_qtensor(w)?, b, out)
            }
        }
    }

    /// A layer from a weight's bytes as a GGUF file stores them (`[out, in]`
    /// of `dtype`), read in place (from the file's map): F16 and BF16 stay
    /// 16-bit, packed from the file's bits as they are (candle's `QMatMul`
    /// would widen them to f32); F32, Q8_0, Q4_K, Q5_K and Q6_K are
    /// repacked straight from the bytes for the packed kernels (IQ4_XS as
    /// a K-quant, IQ4_NL as the Q8_0 blocks of the same weights); every
    /// other type that loads is copied once into candle's quantized matmul,
    /// which reads the stored block layout.
    pub fn from_stored(
        ty: TensorType,
        bytes: &[u8],
        out: usize,
        inp: usize,
        b: Option<Vec<f32>>,
    ) -> Result<Self, ModelError> {
        let halves = || {
            bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        let Some((block, block_bytes)) = ty.block() else {
            return Err(ModelError::Config(format!(
                "weights of type {} do not load (supported types: {})",
                ty.name(),
                crate::gguf_file::supported_types()
            )));
        };
        let expected = (out * inp) / block * block_bytes;
        if bytes.len() != expected || !inp.is_multiple_of(block) {
            return Err(ModelError::Config(format!(
                "a [{out}, {inp}] {} weight has {} bytes (want {expected})",
                ty.name(),
                bytes.len()
            )));
        }
        let dtype = match ty {
            TensorType::IQ4_NL => {
                let q8 = crate::iq4::nl_to_q8_0(bytes);
                let w = Weight::Q8(PackedQ8::from_blocks(&q8, out, inp)?);
                return Ok(Self { w, b, out_dim: out });
            }
            TensorType::IQ4_XS => {
                let w = PackedKQuant::from_blocks(KQuant::Iq4Xs, bytes, out, inp)?;
                return Ok(Self {
                    w: Weight::KQuant(w),
                    b,
                    out_dim: out,
                });
            }
            t => t.candle().expect("a type that loads is IQ4 or candle's"),
        };
        let w = match dtype {
            GgmlDType::F16 => {
                let h: Vec<f16> = halves().map(f16::from_bits).collect();
                Weight::Packed(PackedWeight::pack_f16(&h, out, inp))
            }
            GgmlDType::BF16 => Weight::Packed(PackedWeight::pack_bf16(
                &halves().collect::<Vec<u16>>(),
                out,
                inp,
            )),
            GgmlDType::F32 => {
                let data: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                Weight::Packed(PackedWeight::pack(&data, out, inp))
            }
            GgmlDType::Q8_0 => Weight::Q8(PackedQ8::from_blocks(bytes, out, inp)?),
            t => match kquant(t) {
                Some(kind) => Weight::KQuant(PackedKQuant::from_blocks(kind, bytes, out, inp)?),
                None => {
                    let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                        t,
                        bytes,
                        vec![out, inp],
                        &Device::Cpu,
                    )?;
                    Weight::Quantized(QMatMul::from_qtensor(q)?)
                }
            },
        };
        Ok(Self { w, b, out_dim: out })
    }

    /// Weights stored in the K-quant format `kind`, `[out, inp]` each
    /// (`(bytes, out)`), stacked along `out` into one layer straight from
    /// their bytes: fused projections with each block read once and nothing
    /// copied again. The parts must [stack](PackedKQuant::stacks); `b` is
    /// the stacked bias.
    pub(crate) fn from_kquant_parts(
        kind: KQuant,
        parts: &[(&[u8], usize)],
        inp: usize,
        b: Option<Vec<f32>>,
    ) -> Result<Self, ModelError> {
        let w = PackedKQuant::from_parts(kind, parts, inp)?;
        let out_dim = w.out_dim();
        Ok(Self {
            w: Weight::KQuant(w),
            b,
            out_dim,
        })
    }

    /// The weight in a form the packed-weights cache saves (dense, K-quant
    /// and Q8_0 panels; `None` for candle's other quantized types, repacked
    /// at every start).
    pub(crate) fn packed(&self) -> Option<Packed> {
        match &self.w {
            Weight::Packed(d) => Some(Packed::Dense(d.clone())),
            Weight::KQuant(k) => Some(Packed::KQuant(k.clone())),
            Weight::Q8(q) => Some(Packed::Q8(q.clone())),
            Weight::Quantized(_) => None,
        }
    }

    /// A layer of a weight the packed-weights cache read back.
    pub(crate) fn from_packed(w: Packed, b: Option<Vec<f32>>) -> Self {
        let (w, out_dim) = match w {
            Packed::Dense(d) => {
                let out = d.out_dim();
                (Weight::Packed(d), out)
            }
            Packed::KQuant(k) => {
                let out = k.out_dim();
                (Weight::KQuant(k), out)
            }
            Packed::Q8(q) => {
                let out = q.out_dim();
                (Weight::Q8(q), out)
            }
        };
        Self { w, b, out_dim }
    }

    /// The same layer with its dense weight stored as `dtype`.
    fn with_dtype(self, dtype: WeightDtype) -> Self {
        let w = match self.w {
            Weight::Packed(w) if w.dtype() != dtype => Weight::Packed(PackedWeight::pack_as(
                &w.unpack(),
                w.out_dim(),
                w.in_dim(),
                dtype,
            )),
            other => other,
        };
        Self { w, ..self }
    }

    /// Bytes of the weight read in place from a mapped file of panels.
    fn mapped_bytes(&self) -> usize {
        match &self.w {
            Weight::Packed(w) if w.is_mapped() => w.size_bytes(),
            Weight::KQuant(w) if w.is_mapped() => w.size_bytes(),
            Weight::Q8(w) if w.is_mapped() => w.size_bytes(),
            _ => 0,
        }
    }

    /// Bytes of the weight as stored: what one product reads.
    fn stored_bytes(&self) -> usize {
        match &self.w {
            Weight::Packed(w) => w.size_bytes(),
            Weight::Q8(w) => w.size_bytes(),
            Weight::KQuant(w) => w.size_bytes(),
            Weight::Quantized(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Weight::Quantized(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
        }
    }

    /// `x` is `[rows][in]`; writes `[rows][out]` into `y`.
    fn forward_into(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) -> Result<(), ModelError> {
        match &self.w {
            Weight::Packed(w) => w.matmul_into(x, rows, y),
            Weight::Q8(w) => w.matmul_into(x, rows, y),
            Weight::KQuant(w) => w.matmul_into(x, rows, y),
            Weight::Quantized(w) => {
                // Candle's quantized kernels.
                let cols = x.len() / rows.max(1);
                let xt = Tensor::from_slice(x, (rows, cols), &Device::Cpu)?;
                y.clear();
                y.extend(w.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        if let Some(b) = &self.b {
            for row in y.chunks_exact_mut(self.out_dim) {
                for (yi, bi) in row.iter_mut().zip(b) {
                    *yi += bi;
                }
            }
        }
        Ok(())
    }
}

/// The packed K-quant format of a GGUF type, if it has one.
fn kquant(t: GgmlDType) -> Option<KQuant> {
    match t {
        GgmlDType::Q4K => Some(KQuant::Q4K),
        GgmlDType::Q5K => Some(KQuant::Q5K),
        GgmlDType::Q6K => Some(KQuant::Q6K),
        _ => None,
    }
}

/// The packed K-quant format of a stored tensor type, if it has one
/// (IQ4_XS included).
pub(crate) fn stored_kquant(ty: TensorType) -> Option<KQuant> {
    match ty {
        TensorType::IQ4_XS => Some(KQuant::Iq4Xs),
        t => kquant(t.candle()?),
    }
}

/// Projections of the same input, side by side. Adjacent ones that are all
/// dense, all Q8_0 or all the same K-quant are fused into one product: one
/// pass over the input and one parallel section instead of several (a
/// Q4_K_M layer with a Q6_K `attn_v` still fuses its Q4_K `q` and `k`).
struct Projection {
    parts: Vec<Linear>,
}

impl Projection {
    fn new(parts: Vec<Linear>) -> Self {
        // The longest fusable run from each part on.
        let mut plan: Vec<(usize, Option<Linear>)> = Vec::new();
        let mut s = 0;
        while s < parts.len() {
            let run = (s + 2..=parts.len())
                .rev()
                .find_map(|e| Self::fused(&parts[s..e]).map(|l| (e - s, Some(l))));
            let (n, l) = run.unwrap_or((1, None));
            plan.push((n, l));
            s += n;
        }
        let mut it = parts.into_iter();
        let parts = plan
            .into_iter()
            .map(|(n, fused)| match fused {
                Some(l) => {
                    it.by_ref().take(n).for_each(drop);
                    l
                }
                None => it.next().expect("the plan covers every part"),
            })
            .collect();
        Self { parts }
    }

    /// `parts` as one layer, when their weights fuse.
    fn fused(parts: &[Linear]) -> Option<Linear> {
        let total: usize = parts.iter().map(|l| l.out_dim).sum();
        let w = Self::fuse(parts, total)?;
        let b = parts.iter().any(|l| l.b.is_some()).then(|| {
            parts
                .iter()
                .flat_map(|l| match &l.b {
                    Some(x) => x.clone(),
                    None => vec![0.0; l.out_dim],
                })
                .collect()
        });
        Some(Linear {
            w,
            b,
            out_dim: total,
        })
    }

    /// The parts' weights stacked into one `[total][in]` weight, when they
    /// are all dense, all Q8_0 or all the same K-quant, with one input
    /// dimension.
    fn fuse(parts: &[Linear], total: usize) -> Option<Weight> {
        if parts.len() < 2 {
            return None;
        }
        let dense: Option<Vec<&PackedWeight>> = parts
            .iter()
            .map(|l| match &l.w {
                Weight::Packed(w) => Some(w),
                _ => None,
            })
            .collect();
        if let Some(d) = dense {
            let (inp, dtype) = (d[0].in_dim(), d[0].dtype());
            // One storage type, so repacking the widened rows is exact.
            if d.iter().any(|w| w.in_dim() != inp || w.dtype() != dtype) {
                return None;
            }
            let rows: Vec<f32> = d.iter().flat_map(|w| w.unpack()).collect();
            let w = PackedWeight::pack_as(&rows, total, inp, dtype);
            return Some(Weight::Packed(w));
        }
        let kq: Option<Vec<&PackedKQuant>> = parts
            .iter()
            .map(|l| match &l.w {
                Weight::KQuant(w) => Some(w),
                _ => None,
            })
            .collect();
        if let Some(kq) = kq {
            return PackedKQuant::stack(&kq).map(Weight::KQuant);
        }
        let q8: Vec<&PackedQ8> = parts
            .iter()
            .map(|l| match &l.w {
                Weight::Q8(w) => Some(w),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let inp = q8[0].in_dim();
        if q8.iter().any(|w| w.in_dim() != inp) {
            return None;
        }
        // Stacking rows is concatenating their blocks.
        let blocks: Vec<u8> = q8.iter().flat_map(|w| w.to_blocks()).collect();
        PackedQ8::from_blocks(&blocks, total, inp)
            .ok()
            .map(Weight::Q8)
    }

    /// The same projections with their dense weights stored as `dtype`.
    fn with_dtype(self, dtype: WeightDtype) -> Self {
        Self {
            parts: self
                .parts
                .into_iter()
                .map(|l| l.with_dtype(dtype))
                .collect(),
        }
    }

    /// Writes the projections side by side, `[rows][dim₀ + dim₁ + …]`, into
    /// `y` (`part` is scratch for the unfused case).
    fn forward_into(
        &self,
        x: &[f32],
        rows: usize,
        y: &mut Vec<f32>,
        part: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        if let [fused] = self.parts.as_slice() {
            return fused.forward_into(x, rows, y);
        }
        let total: usize = self.parts.iter().map(|l| l.out_dim).sum();
        y.resize(rows * total, 0.0);
        let mut off = 0;
        for l in &self.parts {
            let d = l.out_dim;
            l.forward_into(x, rows, part)?;
            for (dst, src) in y.chunks_exact_mut(total).zip(part.chunks_exact(d)) {
                dst[off..off + d].copy_from_slice(src);
            }
            off += d;
        }
        Ok(())
    }
}

/// A gated MLP as the forward pass runs it: gate and up fused where they can be.
struct GatedMlp {
    gate_up: Projection,
    down: Linear,
}

impl GatedMlp {
    fn new(gate_up: Vec<Linear>, down: Linear) -> Self {
        Self {
            gate_up: Projection::new(gate_up),
            down,
        }
    }

    fn with_dtype(self, dtype: WeightDtype) -> Self {
        Self {
            gate_up: self.gate_up.with_dtype(dtype),
            down: self.down.with_dtype(dtype),
        }
    }

    fn gate_up_bytes(&self, of: fn(&Linear) -> usize) -> usize {
        self.gate_up.parts.iter().map(of).sum()
    }
}

/// A mixture-of-experts MLP as the forward pass runs it.
struct MoeBlock {
    router: Linear,
    experts: Vec<GatedMlp>,
    top_k: usize,
    norm_topk: bool,
    /// One expert's width.
    inter: usize,
}

/// A layer's MLP as the forward pass runs it.
enum BlockMlp {
    Dense(GatedMlp),
    Moe(MoeBlock),
}

impl BlockMlp {
    fn with_dtype(self, dtype: WeightDtype) -> Self {
        match self {
            BlockMlp::Dense(m) => BlockMlp::Dense(m.with_dtype(dtype)),
            BlockMlp::Moe(m) => BlockMlp::Moe(MoeBlock {
                router: m.router.with_dtype(dtype),
                experts: m.experts.into_iter().map(|e| e.with_dtype(dtype)).collect(),
                ..m
            }),
        }
    }

    /// The stored bytes of the router (none for a dense MLP), of the gate/up
    /// products and of the down products: every expert's, as all of them
    /// are kept (a step reads those its tokens are routed to).
    fn bytes(&self, of: fn(&Linear) -> usize) -> [usize; 3] {
        match self {
            BlockMlp::Dense(m) => [0, m.gate_up_bytes(of), of(&m.down)],
            BlockMlp::Moe(m) => [
                of(&m.router),
                m.experts.iter().map(|e| e.gate_up_bytes(of)).sum(),
                m.experts.iter().map(|e| of(&e.down)).sum(),
            ],
        }
    }
}

/// A layer as the forward pass runs it.
struct Block {
    attn_norm: Vec<f32>,
    qkv: Projection,
    /// Per-head RMSNorm weights of q and k (`[head_dim]` each).
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    o: Linear,
    post_attn_norm: Option<Vec<f32>>,
    mlp_norm: Vec<f32>,
    mlp: BlockMlp,
    post_mlp_norm: Option<Vec<f32>>,
    /// The attention window (`None`: the whole sequence).
    window: Option<usize>,
    /// Index of this layer's RoPE frequencies in `LlamaModel::inv_freq`.
    rope: usize,
}

/// One decoder layer.
pub struct Layer {
    /// RMSNorm weight before attention.
    pub attn_norm: Vec<f32>,
    /// The query, key and value projections in that order, or products
    /// of several of them fused in the checkpoint (Phi-3's `qkv_proj`):
    /// their outputs side by side are q, k and v.
    pub qkv: Vec<Linear>,
    /// Output projection.
    pub o: Linear,
    /// RMSNorm weights over each head of q and of k (Qwen3, Gemma 3).
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// RMSNorm weight of the attention output (Gemma 2 and 3).
    pub post_attn_norm: Option<Vec<f32>>,
    /// RMSNorm weight of the MLP output (Gemma 2 and 3).
    pub post_mlp_norm: Option<Vec<f32>>,
    /// RMSNorm weight before the MLP.
    pub mlp_norm: Vec<f32>,
    /// The MLP: dense, or a mixture of experts.
    pub mlp: Mlp,
}

/// A gated MLP's weights.
pub struct Expert {
    /// The gate and up projections, or their fused product (Phi-3's
    /// `gate_up_proj`): gate, then up.
    pub gate_up: Vec<Linear>,
    /// The down projection.
    pub down: Linear,
}

/// A decoder layer's MLP.
pub enum Mlp {
    /// One gated MLP for every token.
    Dense(Expert),
    /// A router (`[experts, hidden]`) and the experts it picks from.
    Moe {
        /// The router's product: one logit per expert.
        router: Linear,
        /// The experts, in the router's order.
        experts: Vec<Expert>,
    },
}

/// A loaded Llama-family model (weights only; the KV cache is per executor).
pub struct LlamaModel {
    /// Hyper-parameters.
    pub cfg: ModelConfig,
    /// Token embeddings, `[vocab][hidden]`: f32, or a GGUF file's rows in
    /// their stored type, dequantized per looked-up token.
    pub embed: Embedding,
    layers: Vec<Block>,
    /// Final RMSNorm weight.
    pub norm: Vec<f32>,
    /// LM head (`[vocab, hidden]`, the embeddings when tied).
    pub lm_head: Linear,
    /// RoPE inverse frequencies, one set per distinct base (Gemma 3's
    /// local and global layers have two).
    inv_freq: Vec<Vec<f32>>,
}

/// What one step computes attention for: one entry per token.
pub(crate) struct StepTokens<'a> {
    pub ids: &'a [u32],
    pub ctx: &'a [TokenCtx],
    pub block_tables: &'a [u32],
}

/// The parts of a step that [`StepProfile`] times apart.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The executor's checks and per-token contexts before the forward pass.
    Prepare,
    /// Embedding lookup and RoPE angles.
    Embed,
    /// The RMSNorms (two per layer and the final one).
    Norm,
    /// The fused (or separate) q/k/v projection.
    Qkv,
    /// RoPE on q and k, and writing k/v into the pool.
    RopeKv,
    /// Attention over the pool.
    Attention,
    /// The output projection.
    O,
    /// The two residual additions per layer.
    Residual,
    /// A mixture of experts' router product, top-k choice and grouping of
    /// the tokens per expert.
    Route,
    /// The fused (or separate) gate/up projection.
    GateUp,
    /// The gated activation (SwiGLU; GeGLU for Gemma).
    Swiglu,
    /// The down projection.
    Down,
    /// Gathering the sampling rows, and the LM head.
    LmHead,
    /// Sampling, after the forward pass.
    Sample,
}

impl Part {
    /// Every part, in step order.
    pub const ALL: [Part; 14] = [
        Part::Prepare,
        Part::Embed,
        Part::Norm,
        Part::Qkv,
        Part::RopeKv,
        Part::Attention,
        Part::O,
        Part::Residual,
        Part::Route,
        Part::GateUp,
        Part::Swiglu,
        Part::Down,
        Part::LmHead,
        Part::Sample,
    ];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Part::Prepare => "prepare",
            Part::Embed => "embed",
            Part::Norm => "rms_norm",
            Part::Qkv => "qkv",
            Part::RopeKv => "rope+kv_write",
            Part::Attention => "attention",
            Part::O => "o",
            Part::Residual => "residual",
            Part::Route => "moe_route",
            Part::GateUp => "gate_up",
            Part::Swiglu => "swiglu",
            Part::Down => "down",
            Part::LmHead => "lm_head",
            Part::Sample => "sample",
        }
    }
}

/// Wall time per [`Part`] summed over steps, for a breakdown of where a
/// step goes (the `decode` bench). Off by default: when on, each part
/// costs one clock read (~25 ns, ~120 per decode step of a 12-layer model).
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct StepProfile {
    /// Steps measured.
    pub steps: u64,
    /// Time per part, indexed like [`Part::ALL`].
    pub time: [std::time::Duration; Part::ALL.len()],
}

impl StepProfile {
    /// Time spent in `part`.
    pub fn get(&self, part: Part) -> std::time::Duration {
        self.time[part as usize]
    }
}

/// The clock of a step's profile: `lap` charges the time since the last
/// lap to a part; without a profile it does nothing.
#[derive(Default)]
pub(crate) struct Laps {
    profile: Option<StepProfile>,
    last: Option<std::time::Instant>,
}

impl Laps {
    /// Turns the profile on (cleared) or off.
    pub(crate) fn set(&mut self, on: bool) {
        self.profile = on.then(StepProfile::default);
        self.last = None;
    }

    /// The profile so far, if on.
    pub(crate) fn profile(&self) -> Option<&StepProfile> {
        self.profile.as_ref()
    }

    /// Starts timing (the next lap is charged from now).
    #[inline]
    pub(crate) fn start(&mut self) {
        if self.profile.is_some() {
            self.last = Some(std::time::Instant::now());
        }
    }

    /// Charges the time since the last lap (or `start`) to `part`.
    #[inline]
    pub(crate) fn lap(&mut self, part: Part) {
        if let (Some(p), Some(last)) = (&mut self.profile, &mut self.last) {
            let now = std::time::Instant::now();
            p.time[part as usize] += now - *last;
            *last = now;
        }
    }

    /// Counts one step.
    pub(crate) fn step_done(&mut self) {
        if let Some(p) = &mut self.profile {
            p.steps += 1;
        }
    }
}

/// Rotates each of the `heads` heads (`d` floats each, from `offset` in
/// each row of `stride` floats) of every token by that token's angles.
fn apply_rope(x: &mut [f32], rows: Span, heads: usize, d: usize, angles: &Angles) {
    let half = d / 2;
    for (t, row) in x.chunks_exact_mut(rows.stride).enumerate() {
        let (c, s) = (
            &angles.cos[t * half..(t + 1) * half],
            &angles.sin[t * half..(t + 1) * half],
        );
        for head in row[rows.offset..rows.offset + heads * d].chunks_exact_mut(d) {
            if angles.interleaved {
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

impl LlamaModel {
    /// Assembles a model (shapes were checked by the loader), fusing the
    /// q/k/v and gate/up projections where the weights are dense, and
    /// resolving the family's options per layer (window, RoPE base) once.
    /// `embed` is the table as stored; Gemma's `√hidden` scale is applied
    /// to each looked-up row (the tied LM head keeps its own, unscaled, copy).
    pub fn new(
        cfg: ModelConfig,
        mut embed: Embedding,
        layers: Vec<Layer>,
        norm: Vec<f32>,
        lm_head: Linear,
    ) -> Result<Self, ModelError> {
        if layers.len() != cfg.num_layers {
            return Err(ModelError::Config(format!(
                "{} layers for num_hidden_layers {}",
                layers.len(),
                cfg.num_layers
            )));
        }
        let (q_dim, kv_dim) = (
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        );
        let rows = |parts: &[Linear]| parts.iter().map(|l| l.out_dim).sum::<usize>();
        if let Some(l) = layers.iter().find(|l| rows(&l.qkv) != q_dim + 2 * kv_dim) {
            return Err(ModelError::Config(format!(
                "q/k/v projections have {} rows (want {})",
                rows(&l.qkv),
                q_dim + 2 * kv_dim,
            )));
        }
        for (li, l) in layers.iter().enumerate() {
            // What the config says this layer's MLP is, against what was loaded.
            let (want_experts, width) = match &cfg.arch.moe {
                Some(m) if cfg.layer_is_moe(li) => (m.num_experts, m.expert_intermediate_size),
                _ => (0, cfg.intermediate_size),
            };
            let experts: &[Expert] = match &l.mlp {
                Mlp::Dense(e) => std::slice::from_ref(e),
                Mlp::Moe { router, experts } => {
                    if want_experts == 0 || router.out_dim != want_experts {
                        return Err(ModelError::Config(format!(
                            "layer {li}: a router over {} experts (want {want_experts})",
                            router.out_dim
                        )));
                    }
                    experts
                }
            };
            if (want_experts > 0 && experts.len() != want_experts)
                || experts.iter().any(|e| rows(&e.gate_up) != 2 * width)
            {
                return Err(ModelError::Config(format!(
                    "layer {li}: {} MLPs with gate/up of {:?} rows (want {} of {})",
                    experts.len(),
                    experts.iter().map(|e| rows(&e.gate_up)).collect::<Vec<_>>(),
                    want_experts.max(1),
                    2 * width
                )));
            }
        }
        if layers
            .iter()
            .any(|l| l.qk_norm.is_some() != cfg.arch.qk_norm)
        {
            return Err(ModelError::Config(format!(
                "{}: q/k norm weights do not match the architecture",
                cfg.architecture
            )));
        }
        if embed.vocab() != cfg.vocab_size {
            return Err(ModelError::Config(format!(
                "{} embedding rows for vocab_size {}",
                embed.vocab(),
                cfg.vocab_size
            )));
        }
        if cfg.arch.embed_scale {
            embed = embed.with_scale((cfg.hidden_size as f32).sqrt());
        }
        let mut inv_freq: Vec<Vec<f32>> = Vec::new();
        let layers = layers
            .into_iter()
            .enumerate()
            .map(|(li, l)| {
                let freqs = cfg.layer_rope_inv_freq(li);
                let rope = match inv_freq.iter().position(|f| *f == freqs) {
                    Some(i) => i,
                    None => {
                        inv_freq.push(freqs);
                        inv_freq.len() - 1
                    }
                };
                Block {
                    attn_norm: l.attn_norm,
                    qkv: Projection::new(l.qkv),
                    qk_norm: l.qk_norm,
                    o: l.o,
                    post_attn_norm: l.post_attn_norm,
                    mlp_norm: l.mlp_norm,
                    mlp: match l.mlp {
                        Mlp::Dense(e) => BlockMlp::Dense(GatedMlp::new(e.gate_up, e.down)),
                        Mlp::Moe { router, experts } => {
                            let m = cfg.arch.moe.as_ref().expect("checked above");
                            BlockMlp::Moe(MoeBlock {
                                router,
                                experts: experts
                                    .into_iter()
                                    .map(|e| GatedMlp::new(e.gate_up, e.down))
                                    .collect(),
                                top_k: m.experts_per_token,
                                norm_topk: m.norm_topk_prob,
                                inter: m.expert_intermediate_size,
                            })
                        }
                    },
                    post_mlp_norm: l.post_mlp_norm,
                    window: cfg.layer_window(li),
                    rope,
                }
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
        let half = self.cfg.head_dim / 2;
        if factors.len() != half {
            return Err(ModelError::ShapeMismatch {
                name: "rope_freqs.weight".into(),
                expected: vec![half],
                actual: vec![factors.len()],
            });
        }
        for set in &mut self.inv_freq {
            for (f, d) in set.iter_mut().zip(factors) {
                *f /= d;
            }
        }
        Ok(self)
    }

    /// The same model with its dense layer weights stored as `dtype`
    /// (computation stays f32; the embedding table stays f32), converted one
    /// layer at a time.
    pub fn with_weight_dtype(self, dtype: WeightDtype) -> Self {
        let layers = self
            .layers
            .into_iter()
            .map(|b| Block {
                qkv: b.qkv.with_dtype(dtype),
                o: b.o.with_dtype(dtype),
                mlp: b.mlp.with_dtype(dtype),
                ..b
            })
            .collect();
        Self {
            layers,
            lm_head: self.lm_head.with_dtype(dtype),
            ..self
        }
    }

    /// Bytes of the layer weights and LM head as stored (f32, bf16 or
    /// quantized blocks; panel padding included): what a decode step reads.
    pub fn weight_bytes(&self) -> usize {
        self.bytes_of(Linear::stored_bytes)
    }

    /// Bytes of the stored weights read in place from a mapped file of
    /// panels (the packed-weights cache) rather than repacked at load.
    pub fn mapped_weight_bytes(&self) -> usize {
        self.bytes_of(Linear::mapped_bytes)
    }

    /// `of` summed over every product's weight.
    fn bytes_of(&self, of: fn(&Linear) -> usize) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|b| {
                b.qkv.parts.iter().map(of).sum::<usize>()
                    + of(&b.o)
                    + b.mlp.bytes(of).iter().sum::<usize>()
            })
            .sum();
        layers + of(&self.lm_head)
    }

    /// Bytes of the stored weights per product kind (q/k/v, o, the MoE
    /// routers, gate/up, down over all layers — every expert's — and the LM
    /// head): what each reads per step at most.
    #[doc(hidden)]
    pub fn weight_bytes_by_part(&self) -> [(Part, usize); 6] {
        let proj = |p: &Projection| p.parts.iter().map(Linear::stored_bytes).sum::<usize>();
        let sum = |f: &dyn Fn(&Block) -> usize| self.layers.iter().map(f).sum::<usize>();
        [
            (Part::Qkv, sum(&|b| proj(&b.qkv))),
            (Part::O, sum(&|b| b.o.stored_bytes())),
            (Part::Route, sum(&|b| b.mlp.bytes(Linear::stored_bytes)[0])),
            (Part::GateUp, sum(&|b| b.mlp.bytes(Linear::stored_bytes)[1])),
            (Part::Down, sum(&|b| b.mlp.bytes(Linear::stored_bytes)[2])),
            (Part::LmHead, self.lm_head.stored_bytes()),
        ]
    }

    /// Whether a step of `tokens` tokens has products big enough to split
    /// across threads.
    pub(crate) fn parallel_step(&self, tokens: usize) -> bool {
        let c = &self.cfg;
        let widest = (2 * c.intermediate_size)
            .max((c.num_heads + 2 * c.num_kv_heads) * c.head_dim)
            .max(c.vocab_size);
        tokens * c.hidden_size * widest >= PARALLEL_MIN_MACS
    }

    /// Runs all tokens of a step through the decoder, writing their K/V into
    /// `pool`, and leaves the logits of the tokens in `logit_rows` in
    /// `scratch.logits` (`[logit_rows.len()][vocab]`).
    pub(crate) fn forward(
        &self,
        step: &StepTokens<'_>,
        pool: &mut KvStorage,
        logit_rows: &[usize],
        scratch: &mut Scratch,
    ) -> Result<(), ModelError> {
        let cfg = &self.cfg;
        let (h, d, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let (q_dim, kv_dim) = (nh * d, nkv * d);
        let qkv_dim = q_dim + 2 * kv_dim;
        let n = step.ids.len();
        let eps = cfg.rms_norm_eps as f32;
        let bs = pool.block_size();
        let sc = scratch;

        // One row per token, dequantized from the stored type if need be.
        self.embed.lookup(step.ids, &mut sc.x);
        // The angles depend on the position (and the layer's base) only:
        // computed once per step.
        if sc.angles.len() < self.inv_freq.len() {
            sc.angles.resize_with(self.inv_freq.len(), Angles::default);
        }
        for (angles, inv_freq) in sc.angles.iter_mut().zip(&self.inv_freq) {
            angles.cos.clear();
            angles.sin.clear();
            angles.interleaved = cfg.rope_interleaved;
            for c in step.ctx {
                let p = c.pos as f32;
                for &f in inv_freq {
                    let a = p * f;
                    angles.cos.push(a.cos());
                    angles.sin.push(a.sin());
                }
            }
        }
        let scale_base = cfg.arch.query_pre_attn_scalar.unwrap_or(d) as f32;
        let shape = AttnShape {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: d,
            window: None,
            scale: 1.0 / scale_base.sqrt(),
            softcap: cfg.arch.attn_logit_softcapping,
        };
        sc.normed.resize(n * h, 0.0);
        sc.attn.resize(n * q_dim, 0.0);
        sc.laps.lap(Part::Embed);
        for (li, layer) in self.layers.iter().enumerate() {
            rms_norm(&sc.x, &layer.attn_norm, eps, &mut sc.normed);
            sc.laps.lap(Part::Norm);
            // q, k and v of a token side by side in one row.
            layer
                .qkv
                .forward_into(&sc.normed, n, &mut sc.fused, &mut sc.part)?;
            if sc.fused.len() != n * qkv_dim {
                return Err(ModelError::Config(
                    "q/k/v projection has the wrong size".into(),
                ));
            }
            sc.laps.lap(Part::Qkv);
            if let Some((qn, kn)) = &layer.qk_norm {
                for row in sc.fused.chunks_exact_mut(qkv_dim) {
                    let (q, kv) = row.split_at_mut(q_dim);
                    rms_norm_in_place(q, qn, eps);
                    rms_norm_in_place(&mut kv[..kv_dim], kn, eps);
                }
                sc.laps.lap(Part::Norm);
            }
            let angles = &sc.angles[layer.rope];
            let q_rows = Span::new(qkv_dim, 0);
            apply_rope(&mut sc.fused, q_rows, nh, d, angles);
            apply_rope(&mut sc.fused, Span::new(qkv_dim, q_dim), nkv, d, angles);
            for (c, row) in step.ctx.iter().zip(sc.fused.chunks_exact(qkv_dim)) {
                let block = step.block_tables[c.table_offset + c.pos / bs] as usize;
                let (k, v) = row[q_dim..].split_at(kv_dim);
                pool.write(li, block, c.pos % bs, k, v);
            }
            sc.laps.lap(Part::RopeKv);
            let q = Queries {
                data: &sc.fused,
                stride: qkv_dim,
            };
            paged_attention(
                q,
                &mut sc.attn,
                step.ctx,
                step.block_tables,
                pool,
                li,
                AttnShape {
                    window: layer.window,
                    ..shape
                },
            );
            sc.laps.lap(Part::Attention);
            layer.o.forward_into(&sc.attn, n, &mut sc.out)?;
            sc.laps.lap(Part::O);
            if let Some(w) = &layer.post_attn_norm {
                rms_norm(&sc.out, w, eps, &mut sc.normed);
                sc.laps.lap(Part::Norm);
                add(&mut sc.x, &sc.normed);
            } else {
                add(&mut sc.x, &sc.out);
            }
            sc.laps.lap(Part::Residual);
            rms_norm(&sc.x, &layer.mlp_norm, eps, &mut sc.normed);
            sc.laps.lap(Part::Norm);
            match &layer.mlp {
                BlockMlp::Dense(mlp) => {
                    let act = cfg.arch.activation;
                    mlp.forward(&sc.normed, n, inter, act, &mut sc.mlp, &mut sc.laps)?;
                    std::mem::swap(&mut sc.out, &mut sc.mlp.y);
                }
                BlockMlp::Moe(moe) => moe.forward(
                    &sc.normed,
                    n,
                    cfg.arch.activation,
                    &mut sc.out,
                    &mut sc.mlp,
                    &mut sc.laps,
                )?,
            }
            if let Some(w) = &layer.post_mlp_norm {
                rms_norm(&sc.out, w, eps, &mut sc.normed);
                sc.laps.lap(Part::Norm);
                add(&mut sc.x, &sc.normed);
            } else {
                add(&mut sc.x, &sc.out);
            }
            sc.laps.lap(Part::Residual);
        }
        // Only the tokens that sample need the (large) LM head.
        sc.logits.clear();
        if logit_rows.is_empty() {
            return Ok(());
        }
        sc.part.clear();
        for &r in logit_rows {
            sc.part.extend_from_slice(&sc.x[r * h..(r + 1) * h]);
        }
        sc.normed.resize(sc.part.len(), 0.0);
        rms_norm(&sc.part, &self.norm, eps, &mut sc.normed);
        sc.laps.lap(Part::Norm);
        let result = self
            .lm_head
            .forward_into(&sc.normed, logit_rows.len(), &mut sc.logits);
        if let Some(cap) = cfg.arch.final_logit_softcapping {
            sc.logits
                .iter_mut()
                .for_each(|l| *l = cap * (*l / cap).tanh());
        }
        sc.laps.lap(Part::LmHead);
        result
    }
}

impl GatedMlp {
    /// `rows` rows of `x` through the MLP (of width `inter`), into `s.y`.
    fn forward(
        &self,
        x: &[f32],
        rows: usize,
        inter: usize,
        act: Activation,
        s: &mut MlpScratch,
        laps: &mut Laps,
    ) -> Result<(), ModelError> {
        // gate and up side by side; SwiGLU reads both halves of a row.
        self.gate_up
            .forward_into(x, rows, &mut s.gate_up, &mut s.part)?;
        if s.gate_up.len() != rows * 2 * inter {
            return Err(ModelError::Config(
                "gate/up projection has the wrong size".into(),
            ));
        }
        laps.lap(Part::GateUp);
        s.act.resize(rows * inter, 0.0);
        gated_rows(&s.gate_up, inter, &mut s.act, act);
        laps.lap(Part::Swiglu);
        self.down.forward_into(&s.act, rows, &mut s.y)?;
        laps.lap(Part::Down);
        Ok(())
    }
}

impl MoeBlock {
    /// The `n` tokens of `x` through their experts, the weighted sum into
    /// `out` (`[n][hidden]`). The tokens are grouped per expert, so that a
    /// step reads each chosen expert's weights once, in one product over
    /// all the tokens routed to it.
    fn forward(
        &self,
        x: &[f32],
        n: usize,
        act: Activation,
        out: &mut Vec<f32>,
        s: &mut MlpScratch,
        laps: &mut Laps,
    ) -> Result<(), ModelError> {
        let (e, k) = (self.experts.len(), self.top_k);
        let h = x.len() / n.max(1);
        self.router.forward_into(x, n, &mut s.logits)?;
        if s.logits.len() != n * e {
            return Err(ModelError::Config(
                "router product has the wrong size".into(),
            ));
        }
        s.routes.resize(n * k, (0, 0.0));
        for (l, r) in s.logits.chunks_exact(e).zip(s.routes.chunks_exact_mut(k)) {
            route(l, self.norm_topk, r);
        }
        // A counting sort of the (token, weight) pairs by expert: expert
        // i's are `order[starts[i]..starts[i + 1]]`, in token order.
        s.starts.clear();
        s.starts.resize(e + 1, 0);
        for &(ex, _) in &s.routes {
            s.starts[ex as usize + 1] += 1;
        }
        for i in 0..e {
            s.starts[i + 1] += s.starts[i];
        }
        s.fill.clone_from(&s.starts);
        s.order.resize(n * k, (0, 0.0));
        for (i, &(ex, w)) in s.routes.iter().enumerate() {
            let slot = &mut s.fill[ex as usize];
            s.order[*slot] = ((i / k) as u32, w);
            *slot += 1;
        }
        if s.expert_tokens.len() == e {
            for (count, w) in s.expert_tokens.iter_mut().zip(s.starts.windows(2)) {
                *count += (w[1] - w[0]) as u64;
            }
        }
        out.clear();
        out.resize(n * h, 0.0);
        laps.lap(Part::Route);
        for (i, expert) in self.experts.iter().enumerate() {
            let (a, b) = (s.starts[i], s.starts[i + 1]);
            if a == b {
                continue;
            }
            // Taken out of the scratch (no copy) while the expert uses the rest.
            let mut rows = std::mem::take(&mut s.rows);
            rows.clear();
            for &(t, _) in &s.order[a..b] {
                let t = t as usize;
                rows.extend_from_slice(&x[t * h..(t + 1) * h]);
            }
            laps.lap(Part::Route);
            let done = expert.forward(&rows, b - a, self.inter, act, s, laps);
            s.rows = rows;
            done?;
            for (&(t, w), y) in s.order[a..b].iter().zip(s.y.chunks_exact(h)) {
                let t = t as usize;
                for (o, v) in out[t * h..(t + 1) * h].iter_mut().zip(y) {
                    *o += w * v;
                }
            }
            laps.lap(Part::Route);
        }
        Ok(())
    }
}

/// One token's experts from the router's `logits`: the `route.len()` most
/// probable (softmax over every expert; ties to the lower index), each with
/// its probability, renormalised over the chosen ones if `norm` (which is
/// the softmax of the chosen logits).
fn route(logits: &[f32], norm: bool, route: &mut [(u32, f32)]) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    let k = route.len();
    for j in 0..k {
        // k is small (2 to 8): a scan per pick beats sorting the experts.
        let mut best: Option<usize> = None;
        for (i, &l) in logits.iter().enumerate() {
            let taken = route[..j].iter().any(|&(e, _)| e as usize == i);
            if !taken && best.is_none_or(|b| l > logits[b]) {
                best = Some(i);
            }
        }
        let b = best.unwrap_or(0);
        route[j] = (b as u32, (logits[b] - max).exp());
    }
    let sum: f32 = if norm {
        route.iter().map(|&(_, p)| p).sum()
    } else {
        logits.iter().map(|&l| (l - max).exp()).sum()
    };
    for r in route.iter_mut() {
        r.1 /= sum;
    }
}

impl Scratch {
    /// A step's working memory for a model of `cfg`: with experts, it
    /// counts the tokens routed to each (a few adds per MoE layer and step).
    pub(crate) fn for_model(cfg: &ModelConfig) -> Self {
        let mut s = Self::default();
        if let Some(m) = &cfg.arch.moe {
            s.mlp.expert_tokens = vec![0; m.num_experts];
        }
        s
    }

    /// Moves the tokens routed to each expert since the last call into
    /// `out` (empty without experts) and restarts the count.
    pub(crate) fn take_expert_tokens(&mut self, out: &mut Vec<u64>) {
        out.clear();
        out.extend_from_slice(&self.mlp.expert_tokens);
        self.mlp.expert_tokens.fill(0);
    }
}

/// `x += y`, element-wise (the residual connections).
fn add(x: &mut [f32], y: &[f32]) {
    for (xi, yi) in x.iter_mut().zip(y) {
        *xi += yi;
    }
}

/// Where a group of heads sits in each row of a `[tokens][stride]` matrix.
#[derive(Clone, Copy)]
struct Span {
    stride: usize,
    offset: usize,
}

impl Span {
    fn new(stride: usize, offset: usize) -> Self {
        Self { stride, offset }
    }
}

/// RoPE's cos and sin for each token of the step, `[tokens][head_dim / 2]`.
#[derive(Default)]
struct Angles {
    cos: Vec<f32>,
    sin: Vec<f32>,
    interleaved: bool,
}

/// The MLPs' working memory (a dense MLP's, and a mixture of experts').
#[derive(Default)]
struct MlpScratch {
    /// gate/up outputs, `[rows][2 · intermediate]`.
    gate_up: Vec<f32>,
    /// One projection's output when the parts are not fused (quantized).
    part: Vec<f32>,
    /// Gated activations, `[rows][intermediate]`.
    act: Vec<f32>,
    /// The down projection's output, `[rows][hidden]`.
    y: Vec<f32>,
    /// Router logits, `[tokens][experts]`.
    logits: Vec<f32>,
    /// Each token's (expert, weight) pairs, `[tokens][top-k]`.
    routes: Vec<(u32, f32)>,
    /// Where each expert's tokens start in `order` (and the end).
    starts: Vec<usize>,
    fill: Vec<usize>,
    /// The (token, weight) pairs grouped by expert.
    order: Vec<(u32, f32)>,
    /// The rows of one expert's tokens.
    rows: Vec<f32>,
    /// Tokens routed to each expert, summed over the MoE layers and steps
    /// (counted only when sized to the number of experts).
    expert_tokens: Vec<u64>,
}

/// A step's working memory, kept by the executor from step to step so that
/// the forward pass does not allocate (or fault in fresh pages) per layer.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The residual stream, `[tokens][hidden]`.
    x: Vec<f32>,
    normed: Vec<f32>,
    /// Fused projection outputs (q/k/v, then gate/up).
    fused: Vec<f32>,
    /// One projection's output when the parts are not fused (quantized).
    part: Vec<f32>,
    attn: Vec<f32>,
    /// The o and down projections' outputs.
    out: Vec<f32>,
    /// The MLPs' working memory.
    mlp: MlpScratch,
    /// One set per RoPE base.
    angles: Vec<Angles>,
    /// The step's profile, when on.
    pub laps: Laps,
    /// The step's result: `[sampling tokens][vocab]`.
    pub logits: Vec<f32>,
}

#[cfg(test)]
mod tests {
    use super::route;

    /// The top-k by probability, ties to the lower index, weighted by the
    /// softmax over every expert, or over the chosen ones when renormalised.
    #[test]
    fn routes_to_the_most_probable_experts() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let mut r = [(0u32, 0f32); 3];
        route(&logits, false, &mut r);
        assert_eq!(r.map(|(e, _)| e), [1, 3, 4]);
        let all: f32 = logits.iter().map(|l| l.exp()).sum();
        for (e, w) in r {
            assert!((w - logits[e as usize].exp() / all).abs() < 1e-6, "{r:?}");
        }
        route(&logits, true, &mut r);
        let chosen: f32 = [2.0f32, 2.0, 1.0].iter().map(|l| l.exp()).sum();
        assert!((r[2].1 - 1f32.exp() / chosen).abs() < 1e-6, "{r:?}");
        assert!((r.iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
