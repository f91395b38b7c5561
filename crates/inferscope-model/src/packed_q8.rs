//! GGUF Q8_0 weights packed for integer products with Q8_0 activations.
//!
//! Q8_0 stores each row of `W` (`[out][in]`) as blocks of 32 int8 weights
//! with one f16 scale. A product first quantizes each row of `x` per
//! 32-block to int8 and a scale (as candle's `QMatMul` and llama.cpp do; see
//! [`activations`]), then takes int8 · int8 dot products per block
//! and one f32 multiply-add per block with the two scales.
//!
//! At load the weights are repacked into panels of [`LANES`] output rows,
//! each panel a run of [`PANEL_BLOCK`]-byte blocks: per 32 inputs, the
//! int8 interleaved by groups of 4 (`[8][LANES][4]`, 512 bytes), then the
//! 16 rows' f16 scales (32 bytes) as the file stores them, so 1.0625 bytes
//! per weight, the file's size, and one sequential stream per panel. One
//! 32-byte vector holds 4 consecutive weights of 8 output rows, which
//! matches AVX2's integer dot product (`vpmaddubsw` sums pairs of u8·i8
//! into i16, `vpmaddwd` with ones sums pairs of those into i32): against 4
//! activations broadcast to every lane, it gives 8 outputs' partial sums in
//! the 8 i32 lanes, so a block's sums accumulate in integer registers, one
//! lane per output, and only once per block are they converted and scaled
//! (the llama.cpp layout, 32 weights of one row per vector, needs a convert,
//! a multiply-add and a horizontal sum per row, block and output).
//!
//! The product rounds the activations to 8 bits (relative error up to
//! 1/254 of each block's largest element), so it equals candle's
//! `QMatMul` to f32 rounding, not the product with dequantized weights.

use std::cell::Cell;
use std::ops::Range;

use half::f16;
use rayon::prelude::*;

use crate::error::ModelError;
use crate::isa::{Dot, Isa, IsaKind};
use crate::packed::tiling::{
    LANES, PARALLEL_MIN_MACS, TileSums, TiledOutput, row_tiles, schedule, shape_output,
};
use crate::panel_data::PanelData;
use activations::Q8Rows;

#[path = "q8_activations.rs"]
pub(crate) mod activations;

/// Weights per Q8_0 block (one scale each).
pub const QK8_0: usize = 32;

/// Bytes of a Q8_0 block in a GGUF file: an f16 scale, then 32 int8.
pub const Q8_0_BLOCK_BYTES: usize = 2 + QK8_0;

/// Inputs per interleaved group: the 4 bytes `vpmaddubsw`+`vpmaddwd` sum.
const GROUP: usize = 4;

/// Bytes of one panel's int8 in one block: 32 inputs × [`LANES`] rows.
const BLOCK_QS: usize = QK8_0 * LANES;

/// Bytes of one panel's block: its int8, then its [`LANES`] f16 scales.
const PANEL_BLOCK: usize = BLOCK_QS + 2 * LANES;

/// Most rows of `x` in one register tile.
const MAX_MR: usize = 4;

/// Stored bytes per task of a parallel one-row product (at least one task
/// per thread): a task streams far past its start-up cost, and tasks stay
/// small enough to rebalance when another process holds a core.
const TASK_BYTES: usize = 256 << 10;

thread_local! {
    /// The quantized activations of the product running on this thread.
    static SCRATCH: Cell<Q8Rows> = Cell::new(Q8Rows::default());
}

/// A Q8_0 `[out][in]` weight in panel layout.
#[derive(Clone)]
pub struct PackedQ8 {
    /// `[panels][in / QK8_0]` blocks of [`PANEL_BLOCK`] bytes: `[8][LANES][4]`
    /// int8, then `[LANES]` f16 scales; rows past `out` in the last panel
    /// are 0.
    data: PanelData<u8>,
    out: usize,
    inp: usize,
}

impl std::fmt::Debug for PackedQ8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedQ8[{}, {}]", self.out, self.inp)
    }
}

/// Where weight (`o`, `k`) of an `[out][inp]` matrix lies in the panels.
fn at(o: usize, k: usize, inp: usize) -> usize {
    let b = k / QK8_0;
    block_at(o, b, inp) + (k % QK8_0 / GROUP) * LANES * GROUP + (o % LANES) * GROUP + k % GROUP
}

/// Where the block holding row `o`'s block `b` starts.
fn block_at(o: usize, b: usize, inp: usize) -> usize {
    ((o / LANES) * (inp / QK8_0) + b) * PANEL_BLOCK
}

/// Where row `o`'s scale of block `b` lies (two bytes, little-endian f16).
fn scale_at(o: usize, b: usize, inp: usize) -> usize {
    block_at(o, b, inp) + BLOCK_QS + 2 * (o % LANES)
}

impl PackedQ8 {
    /// Repacks GGUF Q8_0 blocks of a row-major `[out][inp]` matrix.
    pub fn from_blocks(data: &[u8], out: usize, inp: usize) -> Result<Self, ModelError> {
        if !inp.is_multiple_of(QK8_0) {
            return Err(ModelError::Config(format!(
                "Q8_0 weight [{out}, {inp}]: the input dimension is not a multiple of {QK8_0}"
            )));
        }
        let nb = inp / QK8_0;
        if data.len() != out * nb * Q8_0_BLOCK_BYTES {
            return Err(ModelError::Config(format!(
                "Q8_0 weight [{out}, {inp}] holds {} bytes, expected {}",
                data.len(),
                out * nb * Q8_0_BLOCK_BYTES
            )));
        }
        let panels = out.div_ceil(LANES);
        let mut packed = vec![0u8; panels * nb * PANEL_BLOCK];
        for (i, blk) in data.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
            let (o, b) = (i / nb, i % nb);
            let s = scale_at(o, b, inp);
            packed[s..s + 2].copy_from_slice(&blk[..2]);
            for (j, &q) in blk[2..].iter().enumerate() {
                packed[at(o, b * QK8_0 + j, inp)] = q;
            }
        }
        Ok(Self {
            data: packed.into(),
            out,
            inp,
        })
    }

    /// The GGUF Q8_0 blocks back, row-major (the scales are the file's
    /// bytes), to fuse projections.
    pub fn to_blocks(&self) -> Vec<u8> {
        let nb = self.inp / QK8_0;
        let mut data = Vec::with_capacity(self.out * nb * Q8_0_BLOCK_BYTES);
        for o in 0..self.out {
            for b in 0..nb {
                let s = scale_at(o, b, self.inp);
                data.extend_from_slice(&self.data[s..s + 2]);
                data.extend((b * QK8_0..(b + 1) * QK8_0).map(|k| self.data[at(o, k, self.inp)]));
            }
        }
        data
    }

    /// Row `o`'s scale of block `b`.
    fn scale(&self, o: usize, b: usize) -> f32 {
        let s = scale_at(o, b, self.inp);
        f16::from_le_bytes([self.data[s], self.data[s + 1]]).to_f32()
    }

    /// The dequantized row-major `[out][inp]` matrix.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out * self.inp];
        for (o, row) in w
            .chunks_exact_mut(self.inp.max(1))
            .enumerate()
            .take(self.out)
        {
            for (k, v) in row.iter_mut().enumerate() {
                let q = self.data[at(o, k, self.inp)] as i8;
                *v = self.scale(o, k / QK8_0) * f32::from(q);
            }
        }
        w
    }

    /// The panels as bytes (the packed-weights cache saves them).
    pub(crate) fn panel_bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    /// A `[out, inp]` weight read in place from bytes `at` of `map`, as
    /// [`PackedQ8::panel_bytes`] gave them; `None` when `at` is not the
    /// length those dimensions take or lies outside the map.
    pub(crate) fn from_mapped(
        out: usize,
        inp: usize,
        map: &std::sync::Arc<memmap2::Mmap>,
        at: Range<usize>,
    ) -> Option<Self> {
        let len = out.div_ceil(LANES) * (inp / QK8_0) * PANEL_BLOCK;
        if !inp.is_multiple_of(QK8_0) || at.len() != len {
            return None;
        }
        Some(Self {
            data: PanelData::mapped(map.clone(), at.start, len)?,
            out,
            inp,
        })
    }

    /// Whether its panels are read in place from a mapped file.
    pub fn is_mapped(&self) -> bool {
        self.data.is_mapped()
    }

    /// Bytes the weights and scales occupy.
    pub fn size_bytes(&self) -> usize {
        self.data.len()
    }

    /// Output dimension.
    pub fn out_dim(&self) -> usize {
        self.out
    }

    /// Input dimension.
    pub fn in_dim(&self) -> usize {
        self.inp
    }

    /// `x` is `[rows][in]`; returns `x Wᵀ`, `[rows][out]`, with `x`
    /// quantized to Q8_0 first.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = Vec::new();
        self.matmul_into(x, rows, &mut y);
        y
    }

    /// [`PackedQ8::matmul`] into `y` (resized to `[rows][out]`).
    pub fn matmul_into(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        self.product(Isa::detect(), x, rows, y);
    }

    /// The product with the kernels of `isa` (tests run each one the CPU has).
    fn product(&self, isa: Isa, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        if !shape_output(x, rows, (self.inp, self.out), y) {
            return;
        }
        // No AVX-512 kernel: its CPUs run the AVX2 one, with VNNI where the
        // CPU has it.
        let isa = isa.for_quantized_tiles();
        // The thread's scratch, taken while in use (as `Q8K::with` does): a
        // rayon worker that steals a second product while waiting inside the
        // first finds it empty and gets a fresh one.
        let mut scratch = SCRATCH.take();
        self.product_with(isa, x, rows, y, &mut scratch);
        SCRATCH.set(scratch);
    }

    /// The product, quantizing `x` into `xq`.
    fn product_with(&self, isa: Isa, x: &[f32], rows: usize, y: &mut [f32], xq: &mut Q8Rows) {
        xq.quantize(isa, x, self.inp);
        let out = TiledOutput::new(y, rows, self.out);
        let nv = panels_per_tile(rows);
        let xq = &*xq;
        let job = |r: Range<usize>, g: Range<usize>| self.compute(isa, nv, xq, r, g, &out);
        if rows > 1 {
            return schedule(rows, self.inp, self.out, nv, job);
        }
        let groups = self.out.div_ceil(LANES).div_ceil(nv);
        if rows * self.inp * self.out < PARALLEL_MIN_MACS {
            return job(0..rows, 0..groups);
        }
        // One row: equal contiguous runs of panel groups, a multiple of the
        // threads, so each task streams one stretch of the weights and the
        // threads finish together (`schedule`'s tasks of 256 Ki
        // multiply-adds left 3 tasks for 2 threads on a 768×768).
        let threads = rayon::current_num_threads();
        let tasks = (threads * (self.data.len() / (threads * TASK_BYTES)).max(1)).min(groups);
        (0..tasks)
            .into_par_iter()
            .for_each(|t| job(0..rows, t * groups / tasks..(t + 1) * groups / tasks));
    }

    /// Rows `rows` × the columns of panel groups `groups` (of `nv` panels),
    /// row tiles inside panel groups; a last group with fewer panels runs
    /// tiles of one panel.
    fn compute(
        &self,
        isa: Isa,
        nv: usize,
        xq: &Q8Rows,
        rows: Range<usize>,
        groups: Range<usize>,
        out: &TiledOutput,
    ) {
        let nb = self.inp / QK8_0;
        let panel = nb * PANEL_BLOCK;
        let panels = self.out.div_ceil(LANES);
        for g in groups {
            let p0 = g * nv;
            let np = nv.min(panels - p0);
            let (tile_nv, tiles) = if np == nv { (nv, 1) } else { (1, np) };
            for j in 0..tiles {
                let p = p0 + j * tile_nv;
                for (r0, mr) in row_tiles::<MAX_MR>(rows.clone()) {
                    let t = QTile {
                        w: &self.data[p * panel..(p + tile_nv) * panel],
                        xq: &xq.qs[r0 * self.inp..(r0 + mr) * self.inp],
                        xd: &xq.d[r0 * nb..(r0 + mr) * nb],
                        inp: self.inp,
                    };
                    kernel(isa, mr, tile_nv, &t, r0, p * LANES, out);
                }
            }
        }
    }
}

/// Panels per tile for a product of `rows` rows: one row reuses each
/// broadcast activation across four panels (four streams of weights in
/// flight); with more rows, the rows share each panel's weights.
fn panels_per_tile(rows: usize) -> usize {
    if rows == 1 { 4 } else { 1 }
}

/// One register tile's operands.
struct QTile<'a> {
    /// The tile's panels, `[NV][inp / QK8_0]` blocks of [`PANEL_BLOCK`].
    w: &'a [u8],
    /// Its rows of quantized `x`, `[mr][inp]`.
    xq: &'a [i8],
    /// Their block scales, `[mr][inp / QK8_0]`.
    xd: &'a [f32],
    inp: usize,
}

impl QTile<'_> {
    /// Checks the bounds the unchecked kernels rely on.
    #[cfg(target_arch = "x86_64")]
    fn check(&self, mr: usize, nv: usize) {
        let nb = self.inp / QK8_0;
        assert!(
            self.inp.is_multiple_of(QK8_0)
                && self.xq.len() >= mr * self.inp
                && self.xd.len() >= mr * nb
                && self.w.len() >= nv * nb * PANEL_BLOCK
        );
    }
}

/// Runs the micro-kernel for `mr` rows and `nv` panels, storing at
/// (`row0`, `col0`); under the AVX2 ISA, the tile of its dot product.
// Every call is wrapped in `unsafe`, which the portable kernel does not need.
#[allow(unused_unsafe)]
fn kernel(
    isa: Isa,
    mr: usize,
    nv: usize,
    t: &QTile<'_>,
    row0: usize,
    col0: usize,
    out: &TiledOutput,
) {
    macro_rules! go {
        ($f:ident; $($m:literal x $n:literal),*) => {
            match (mr, nv) {
                $(
                    ($m, $n) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$m, $n>(t) };
                        out.store_at::<$m, $n>(row0, col0, $n, &acc)
                    }
                )*
                _ => unreachable!("no {mr}x{nv} Q8_0 kernel for {isa:?}"),
            }
        };
    }
    // SAFETY (the `unsafe` calls): an `Isa` can only be made by detection
    // (see `isa.rs`), so holding one means the CPU has its features, its
    // dot product's included.
    match (isa.kind(), isa.dot()) {
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, Dot::Avx512Vnni) => go!(tile_vnni; 1 x 4, 1 x 1, 2 x 1, 3 x 1, 4 x 1),
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, Dot::AvxVnni) => go!(tile_avx_vnni; 1 x 4, 1 x 1, 2 x 1, 3 x 1, 4 x 1),
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, Dot::Maddubs) => go!(tile_avx2; 1 x 4, 1 x 1, 2 x 1, 3 x 1, 4 x 1),
        _ => go!(tile_portable; 1 x 4, 1 x 1, 2 x 1, 3 x 1, 4 x 1),
    }
}

/// The tile's product, portable: exact i32 sums per block, then one f32
/// multiply-add per block with the product of the two scales.
fn tile_portable<const MR: usize, const NV: usize>(t: &QTile<'_>) -> TileSums<MR, NV> {
    let mut acc = [[[0f32; LANES]; NV]; MR];
    let nb = t.inp / QK8_0;
    for b in 0..nb {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = &t.xq[r * t.inp + b * QK8_0..][..QK8_0];
            let dx = t.xd[r * nb + b];
            for (p, acc_p) in acc_r.iter_mut().enumerate() {
                let blk = &t.w[(p * nb + b) * PANEL_BLOCK..][..PANEL_BLOCK];
                let (w, dw) = blk.split_at(BLOCK_QS);
                let mut sum = [0i32; LANES];
                for (g, xg) in x.chunks_exact(GROUP).enumerate() {
                    let wg = &w[g * LANES * GROUP..][..LANES * GROUP];
                    for (l, s) in sum.iter_mut().enumerate() {
                        *s += (0..GROUP)
                            .map(|j| i32::from(wg[l * GROUP + j] as i8) * i32::from(xg[j]))
                            .sum::<i32>();
                    }
                }
                for l in 0..LANES {
                    let d = f16::from_le_bytes([dw[2 * l], dw[2 * l + 1]]).to_f32();
                    acc_p[l] += sum[l] as f32 * (d * dx);
                }
            }
        }
    }
    acc
}

/// The tile's product with AVX2: per group of 4 inputs, each 32-byte vector
/// of weights (8 outputs × 4 inputs) is made unsigned (`|w|`), each row's 4
/// quantized activations are broadcast and given the weights' signs, and
/// `vpmaddubsw` + `vpmaddwd` add the 4 products of each output into its i32
/// lane; after a block's 8 groups the lanes are converted and multiply-added
/// with the scales (converted from f16 by `vcvtph2ps`). The weights supply
/// the unsigned side, as in llama.cpp, because `|-128|` is 128 as u8 while
/// the activations, clamped to ±127, never hit `vpsignb`'s overflow.
///
/// With AVX512-VNNI (`tile_vnni`) or AVX-VNNI (`tile_avx_vnni`; see [`Dot`]),
/// `vpdpbusd` takes the `vpmaddubsw` + `vpmaddwd` + add: the same signed
/// operands, one instruction.
macro_rules! q8_tile_x86 {
    ($name:ident, $features:literal, $dot:expr) => {
        /// The Q8_0 tile with the instruction sets of `#[target_feature]` (see
        /// `q8_tile_x86!`).
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        fn $name<const MR: usize, const NV: usize>(t: &QTile<'_>) -> TileSums<MR, NV> {
            use std::arch::x86_64::*;
            const VNNI: bool = !matches!($dot, Dot::Maddubs);
            // VNNI through AVX-VNNI's VEX encoding rather than AVX512VL's.
            const AVX_VNNI: bool = matches!($dot, Dot::AvxVnni);
            t.check(MR, NV);
            let nb = t.inp / QK8_0;
            let panel = nb * PANEL_BLOCK;
            let ones = _mm256_set1_epi16(1);
            let mut acc = [[[_mm256_setzero_ps(); 2]; NV]; MR];
            let (q, x, xd) = (t.w.as_ptr(), t.xq.as_ptr(), t.xd.as_ptr());
            for b in 0..nb {
                let mut sum = [[[_mm256_setzero_si256(); 2]; NV]; MR];
                for g in 0..QK8_0 / GROUP {
                    // SAFETY: r < MR and 32·b + 4·g + 4 <= inp: inside `xq` (checked).
                    let xv: [__m256i; MR] = std::array::from_fn(|r| unsafe {
                        let at = x.add(r * t.inp + b * QK8_0 + g * GROUP);
                        _mm256_set1_epi32(at.cast::<i32>().read_unaligned())
                    });
                    for (p, _) in acc[0].iter().enumerate() {
                        for h in 0..2 {
                            // SAFETY: p < NV and b < nb: 32 bytes inside the int8
                            // of block b of panel p, inside `w` (checked).
                            let w = unsafe {
                                let at = p * panel + b * PANEL_BLOCK + (g * LANES + 8 * h) * GROUP;
                                _mm256_loadu_si256(q.add(at).cast())
                            };
                            let aw = _mm256_sign_epi8(w, w);
                            for (r, sum_r) in sum.iter_mut().enumerate() {
                                let sx = _mm256_sign_epi8(xv[r], w);
                                if VNNI {
                                    // Unsafe to call only in the tiles that never
                                    // take the branch.
                                    #[allow(unused_unsafe)]
                                    // SAFETY: each branch is reached only in the
                                    // tile whose target features include its
                                    // instructions (AVX-VNNI; AVX512-VNNI and
                                    // AVX512VL).
                                    let v = unsafe {
                                        if AVX_VNNI {
                                            _mm256_dpbusd_avx_epi32(sum_r[p][h], aw, sx)
                                        } else {
                                            _mm256_dpbusd_epi32(sum_r[p][h], aw, sx)
                                        }
                                    };
                                    sum_r[p][h] = v;
                                } else {
                                    let m = _mm256_maddubs_epi16(aw, sx);
                                    sum_r[p][h] =
                                        _mm256_add_epi32(sum_r[p][h], _mm256_madd_epi16(m, ones));
                                }
                            }
                        }
                    }
                }
                for p in 0..NV {
                    // SAFETY: p < NV and b < nb: the 16 f16 scales after the int8
                    // of block b of panel p, inside `w` (checked).
                    let dw = unsafe {
                        let at = q.add(p * panel + b * PANEL_BLOCK + BLOCK_QS);
                        [
                            _mm256_cvtph_ps(_mm_loadu_si128(at.cast())),
                            _mm256_cvtph_ps(_mm_loadu_si128(at.add(16).cast())),
                        ]
                    };
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        // SAFETY: r < MR and b < nb: inside `xd` (checked).
                        let dx = unsafe { _mm256_broadcast_ss(&*xd.add(r * nb + b)) };
                        for h in 0..2 {
                            let f = _mm256_cvtepi32_ps(sum[r][p][h]);
                            acc_r[p][h] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw[h], dx), acc_r[p][h]);
                        }
                    }
                }
            }
            crate::packed::tiling::tile_sums_avx2(&acc)
        }
    };
}

q8_tile_x86!(tile_avx2, "avx2,fma,f16c", Dot::Maddubs);
q8_tile_x86!(tile_avx_vnni, "avx2,fma,f16c,avxvnni", Dot::AvxVnni);
q8_tile_x86!(
    tile_vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    Dot::Avx512Vnni
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_reference::{isas_checked, product_f64, rel_diff_f64};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// A Q8_0 weight quantized by candle, and candle's dequantization of it.
    fn quantized(out: usize, inp: usize, seed: usize) -> (Vec<u8>, Vec<f32>) {
        // Rows of different magnitudes so block scales differ a lot.
        let w: Vec<f32> = (0..out * inp)
            .map(|i| {
                let h = (i * 2654435761 + seed * 40503) % 10007;
                (h as f32 / 10007.0 - 0.5) * (1.0 + (i / inp % 7) as f32)
            })
            .collect();
        let t = Tensor::from_vec(w, (out, inp), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
        let deq = q.dequantize(&Device::Cpu).unwrap();
        let deq = deq.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        (q.data().unwrap().into_owned(), deq)
    }

    /// The product of the operands the kernels multiply, in f64 (see
    /// `kernel_reference`): the dequantized weights times `x` as the
    /// portable quantizer rounds it (bit for bit candle's quantizer, checked
    /// in `q8_activations`).
    fn exact_product(p: &PackedQ8, x: &[f32], rows: usize) -> Vec<f64> {
        let mut xq = Q8Rows::default();
        xq.quantize(Isa::get(IsaKind::Portable).unwrap(), x, p.inp);
        let xd: Vec<f64> = xq
            .qs
            .iter()
            .enumerate()
            .map(|(k, &q)| f64::from(xq.d[k / QK8_0]) * f64::from(q))
            .collect();
        product_f64(&xd, &p.dequantize(), rows, p.inp, p.out)
    }

    /// The f32 product with the dequantized weights, and for each cell a
    /// bound on what rounding the activations to Q8_0 can move it by: each
    /// activation moves by at most half a step (`d / 2`) plus 127 times the
    /// f16 rounding of `d` (2⁻¹¹ `d`), under `0.57 d`, times `|w|`.
    fn dequantized_product(
        x: &[f32],
        w: &[f32],
        rows: usize,
        inp: usize,
        out: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut y = vec![0f32; rows * out];
        let mut bound = vec![0f32; rows * out];
        for r in 0..rows {
            let xr = &x[r * inp..][..inp];
            let step: Vec<f32> = xr
                .chunks_exact(QK8_0)
                .map(|b| b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0)
                .collect();
            for o in 0..out {
                let wo = &w[o * inp..][..inp];
                y[r * out + o] = xr.iter().zip(wo).map(|(a, b)| a * b).sum();
                bound[r * out + o] = (0..inp).map(|k| 0.57 * step[k / QK8_0] * wo[k].abs()).sum();
            }
        }
        (y, bound)
    }

    fn input(rows: usize, inp: usize) -> Vec<f32> {
        // Blocks of different magnitudes, a zero block in row 0.
        (0..rows * inp)
            .map(|i| {
                let v = ((i * 7) % 13) as f32 * 0.25 - 1.5 + ((i * 31) % 17) as f32 * 0.013;
                if i < 32 {
                    0.0
                } else {
                    v * (1 + (i / 32) % 5) as f32
                }
            })
            .collect()
    }

    /// Against the exact product of the same operands: only the f32
    /// rounding of the per-block terms and their sum, a few ulps of the
    /// largest output.
    const EXACT_TOL: f64 = 2e-6;

    fn check(rows: usize, inp: usize, out: usize) {
        let (blocks, deq) = quantized(out, inp, rows);
        let p = PackedQ8::from_blocks(&blocks, out, inp).unwrap();
        assert_eq!(p.dequantize(), deq, "candle's dequantization");
        assert_eq!(p.to_blocks(), blocks, "repack round trip");
        let x = input(rows, inp);
        let c = exact_product(&p, &x, rows);
        let (e, bound) = dequantized_product(&x, &deq, rows, inp, out);
        let scale = e.iter().fold(0f32, |m, v| m.max(v.abs()));
        for isa in isas_checked(&format!("Q8_0 [{rows}x{inp}x{out}]")) {
            let mut y = vec![f32::NAN; 3];
            p.product(isa, &x, rows, &mut y);
            assert_eq!(y.len(), e.len());
            let (d, i) = rel_diff_f64(&y, &c);
            assert!(
                d < EXACT_TOL,
                "{isa:?} [{rows}x{inp}x{out}] cell {i}: {} vs exact {} (rel {d})",
                y[i],
                c[i]
            );
            for (i, (a, b)) in y.iter().zip(&e).enumerate() {
                assert!(
                    (a - b).abs() <= bound[i] + 1e-5 * scale,
                    "{isa:?} [{rows}x{inp}x{out}] cell {i}: {a} vs dequantized {b} (bound {})",
                    bound[i]
                );
            }
        }
    }

    #[test]
    fn matches_the_exact_and_the_dequantized_product() {
        // The row counts, out not a multiple of a panel (or group).
        for rows in [1, 3, 8, 33, 128] {
            check(rows, 96, 61);
        }
        for rows in 1..=9 {
            check(rows, 32, 40);
        }
    }

    #[test]
    fn matches_the_exact_and_the_dequantized_product_in_parallel() {
        // Above the threshold: split across tasks and row blocks.
        check(1, 1024, 1100);
        check(3, 1024, 400);
        check(8, 512, 300);
        check(33, 256, 200);
        check(128, 256, 80);
        // One row splits into equal runs of panel groups: 4.3 MB makes more
        // tasks than threads, and 69 panels leave a last group of one.
        check(1, 2048, 2000);
        check(1, 768, 1280);
    }

    #[test]
    fn stores_the_files_bytes_per_weight() {
        // f16 scales inline: 34 bytes per 32 weights, as the file; a last
        // panel of 13 rows is padded to 16.
        for (out, inp) in [(32, 64), (768, 768), (61, 96)] {
            let (blocks, _) = quantized(out, inp, 1);
            let p = PackedQ8::from_blocks(&blocks, out, inp).unwrap();
            assert_eq!(
                p.size_bytes(),
                out.next_multiple_of(LANES) * inp / QK8_0 * 34
            );
        }
    }

    #[test]
    fn one_corrupt_block_changes_exactly_its_outputs() {
        // The tests above can see a wrong scale: doubling one block's scale
        // (row 19, block 2) must move output column 19 and nothing else.
        let (rows, inp, out) = (3, 128, 40);
        let (mut blocks, _) = quantized(out, inp, 0);
        let x = input(rows, inp);
        let clean = PackedQ8::from_blocks(&blocks, out, inp).unwrap();
        let e = exact_product(&clean, &x, rows);
        let at = (19 * inp / QK8_0 + 2) * Q8_0_BLOCK_BYTES;
        let d = f16::from_le_bytes([blocks[at], blocks[at + 1]]).to_f32();
        blocks[at..at + 2].copy_from_slice(&f16::from_f32(2.0 * d).to_le_bytes());
        let p = PackedQ8::from_blocks(&blocks, out, inp).unwrap();
        for isa in isas_checked("Q8_0 one corrupt block") {
            let mut y = Vec::new();
            p.product(isa, &x, rows, &mut y);
            for (i, (a, b)) in y.iter().zip(&e).enumerate() {
                let moved = (f64::from(*a) - b).abs() > 1e-3 * b.abs().max(1.0);
                assert_eq!(moved, i % out == 19, "{isa:?} cell {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn weights_of_minus_128_are_exact() {
        // GGUF allows -128 (llama.cpp's quantizer never writes it): the
        // kernels must not lose its sign. One block of -128 against one row
        // of ±1 (negative activations are where a signed -128 would flip).
        let (out, inp) = (17, 64);
        let mut blocks = Vec::new();
        for o in 0..out {
            for b in 0..2 {
                blocks.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
                // Block 0 all -128; block 1 alternates -128 and o - 8.
                blocks.extend((0..QK8_0).map(|j| {
                    let v = if b == 0 || j % 2 == 0 {
                        -128i8
                    } else {
                        o as i8 - 8
                    };
                    v as u8
                }));
            }
        }
        let p = PackedQ8::from_blocks(&blocks, out, inp).unwrap();
        // Ones in block 0 (scale 1/127) and minus ones in block 1.
        let x: Vec<f32> = (0..inp).map(|k| if k < 32 { 1.0 } else { -1.0 }).collect();
        for isa in crate::kernel_reference::isas_checked(module_path!()) {
            let y = {
                let mut y = Vec::new();
                p.product(isa, &x, 1, &mut y);
                y
            };
            for (o, v) in y.iter().enumerate() {
                // Activations quantize to ±127 with d = f16(1/127).
                let dx = f16::from_f32(1.0 / 127.0).to_f32();
                let b1 = 16.0 * (-128.0 + (o as f32 - 8.0));
                let e = (-128.0 * 32.0 - b1) * 127.0 * 0.5 * dx;
                assert!(
                    (v - e).abs() <= 1e-4 * e.abs().max(1.0),
                    "{isa:?} {o}: {v} vs {e}"
                );
            }
        }
    }

    #[test]
    fn bad_blocks_are_errors() {
        let e = PackedQ8::from_blocks(&[0; 34], 1, 48).unwrap_err();
        assert!(e.to_string().contains("not a multiple of 32"), "{e}");
        let e = PackedQ8::from_blocks(&[0; 33], 1, 32).unwrap_err();
        assert!(e.to_string().contains("holds 33 bytes, expected 34"), "{e}");
    }
}
