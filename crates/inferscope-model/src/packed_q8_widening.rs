//! The f32-widening Q8_0 kernel the integer one replaced, kept only so the
//! benchmark can compare them in one run.
//!
//! Q8_0 stores each row of `W` (`[out][in]`) as blocks of 32 int8 weights
//! with one f16 scale. At load the blocks are repacked into the dense
//! kernels' panel layout — panels of [`LANES`] output rows interleaved along
//! `in`, `[out / LANES][in][LANES]` int8, one byte per weight, beside
//! `[out / LANES][in / 32][LANES]` f32 scales — so a tile streams each panel
//! sequentially, widens 16 int8 weights to f32 in registers, multiplies them
//! by their rows' block scales once, and multiply-adds them into every row of
//! its register tile, exactly like the f32 kernel. The activations stay f32
//! (no per-row quantization as llama.cpp and candle do), so the result is
//! the product with the dequantized weights, to f32 rounding.

use std::ops::Range;

use half::f16;

use crate::error::ModelError;
use crate::isa::{Isa, IsaKind};
use crate::packed::{Acc, LANES, MAX_MR, Out, quantized_product};

use super::{Q8_0_BLOCK_BYTES, QK8_0};


/// A Q8_0 `[out][in]` weight in panel layout.
#[derive(Clone)]
pub struct PackedQ8 {
    /// `[panels][in][LANES]` int8; rows past `out` in the last panel are 0.
    qs: Vec<i8>,
    /// `[panels][in / QK8_0][LANES]`: each row's block scales.
    scales: Vec<f32>,
    out: usize,
    inp: usize,
}

impl std::fmt::Debug for PackedQ8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedQ8[{}, {}]", self.out, self.inp)
    }
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
        let mut qs = vec![0i8; panels * inp * LANES];
        let mut scales = vec![0f32; panels * nb * LANES];
        for (i, blk) in data.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
            let (o, b) = (i / nb, i % nb);
            let (p, l) = (o / LANES, o % LANES);
            scales[(p * nb + b) * LANES + l] = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let dst = &mut qs[(p * inp + b * QK8_0) * LANES..][..QK8_0 * LANES];
            for (j, &q) in blk[2..].iter().enumerate() {
                dst[j * LANES + l] = q as i8;
            }
        }
        Ok(Self {
            qs,
            scales,
            out,
            inp,
        })
    }

    /// The GGUF Q8_0 blocks back, row-major (scales are exact: f16 → f32
    /// → f16 round-trips), to fuse projections.
    pub fn to_blocks(&self) -> Vec<u8> {
        let nb = self.inp / QK8_0;
        let mut data = Vec::with_capacity(self.out * nb * Q8_0_BLOCK_BYTES);
        for o in 0..self.out {
            let (p, l) = (o / LANES, o % LANES);
            for b in 0..nb {
                let d = f16::from_f32(self.scales[(p * nb + b) * LANES + l]);
                data.extend_from_slice(&d.to_le_bytes());
                let src = &self.qs[(p * self.inp + b * QK8_0) * LANES..][..QK8_0 * LANES];
                data.extend((0..QK8_0).map(|j| src[j * LANES + l] as u8));
            }
        }
        data
    }

    /// The dequantized row-major `[out][inp]` matrix.
    pub fn dequantize(&self) -> Vec<f32> {
        let nb = self.inp / QK8_0;
        let mut w = vec![0f32; self.out * self.inp];
        for (o, row) in w
            .chunks_exact_mut(self.inp.max(1))
            .enumerate()
            .take(self.out)
        {
            let (p, l) = (o / LANES, o % LANES);
            for (k, v) in row.iter_mut().enumerate() {
                let d = self.scales[(p * nb + k / QK8_0) * LANES + l];
                *v = d * f32::from(self.qs[(p * self.inp + k) * LANES + l]);
            }
        }
        w
    }

    /// Bytes the weights and scales occupy.
    pub fn size_bytes(&self) -> usize {
        self.qs.len() + self.scales.len() * 4
    }

    /// Output dimension.
    pub fn out_dim(&self) -> usize {
        self.out
    }

    /// Input dimension.
    pub fn in_dim(&self) -> usize {
        self.inp
    }

    /// `x` is `[rows][in]`; returns `x Wᵀ`, `[rows][out]`.
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
        quantized_product(
            isa,
            x,
            rows,
            (self.inp, self.out),
            y,
            |isa, nv, r, g, out| self.compute(isa, nv, x, r, g, out),
        );
    }

    /// Rows `rows` × the columns of panel groups `groups` (of `nv` panels),
    /// row tiles inside panel groups as in the dense kernel.
    fn compute(
        &self,
        isa: Isa,
        nv: usize,
        x: &[f32],
        rows: Range<usize>,
        groups: Range<usize>,
        out: &Out,
    ) {
        let nb = self.inp / QK8_0;
        let (panel_q, panel_s) = (self.inp * LANES, nb * LANES);
        let panels = self.out.div_ceil(LANES);
        let n = rows.len();
        let count = n.div_ceil(MAX_MR);
        let (base, extra) = (n / count, n % count);
        for g in groups {
            let p0 = g * nv;
            let np = nv.min(panels - p0);
            let mut r0 = rows.start;
            for i in 0..count {
                let mr = base + usize::from(i < extra);
                let t = QTile {
                    qs: &self.qs[p0 * panel_q..(p0 + np) * panel_q],
                    scales: &self.scales[p0 * panel_s..(p0 + np) * panel_s],
                    x: &x[r0 * self.inp..(r0 + mr) * self.inp],
                    inp: self.inp,
                    np,
                };
                kernel(isa, mr, nv, &t, r0, p0 * LANES, out);
                r0 += mr;
            }
        }
    }
}

/// One register tile's operands.
struct QTile<'a> {
    /// The tile's panels of int8, `[np][inp][LANES]`.
    qs: &'a [i8],
    /// Their scales, `[np][inp / QK8_0][LANES]`.
    scales: &'a [f32],
    /// Its rows of `x`, `[mr][inp]`.
    x: &'a [f32],
    inp: usize,
    /// Panels present (the last group may have fewer than the tile's NV).
    np: usize,
}

impl QTile<'_> {
    /// Checks the bounds the unchecked kernels rely on.
    #[cfg(target_arch = "x86_64")]
    fn check(&self, mr: usize) {
        assert!(
            self.x.len() >= mr * self.inp
                && self.inp.is_multiple_of(QK8_0)
                && self.qs.len() >= self.np * self.inp * LANES
                && self.scales.len() >= self.np * self.inp / QK8_0 * LANES
        );
    }
}

/// Runs the micro-kernel for `mr` rows and `nv` panels, storing at
/// (`row0`, `col0`).
// Every call is wrapped in `unsafe`, which the portable kernel does not need.
#[allow(unused_unsafe)]
fn kernel(isa: Isa, mr: usize, nv: usize, t: &QTile<'_>, row0: usize, col0: usize, out: &Out) {
    macro_rules! go {
        ($f:ident; $($m:literal x $n:literal),*) => {
            match (mr, nv) {
                $(
                    ($m, $n) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$m, $n>(t) };
                        out.store_at::<$m, $n>(row0, col0, t.np, &acc)
                    }
                )*
                _ => unreachable!("no {mr}x{nv} Q8_0 kernel for {isa:?}"),
            }
        };
    }
    // SAFETY (the `unsafe` calls): an `Isa` can only be made by detection
    // (see `isa.rs`), so holding one means the CPU has its features.
    match isa.kind() {
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => go!(
            tile_avx2; 1 x 4, 2 x 2, 3 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1
        ),
        _ => go!(tile_portable; 1 x 4, 2 x 2, 3 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1),
    }
}

/// The tile's product, portable (the compiler vectorises what it can).
fn tile_portable<const MR: usize, const NV: usize>(t: &QTile<'_>) -> Acc<MR, NV> {
    let mut acc = [[[0f32; LANES]; NV]; MR];
    let (panel_q, panel_s) = (t.inp * LANES, t.inp / QK8_0 * LANES);
    let np = t.np.min(NV);
    let mut w = [[0f32; LANES]; NV];
    for k in 0..t.inp {
        for (p, wp) in w.iter_mut().enumerate().take(np) {
            let q = &t.qs[p * panel_q + k * LANES..][..LANES];
            let d = &t.scales[p * panel_s + k / QK8_0 * LANES..][..LANES];
            for l in 0..LANES {
                wp[l] = f32::from(q[l]) * d[l];
            }
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = t.x[r * t.inp + k];
            for (a, wp) in acc_r.iter_mut().zip(&w).take(np) {
                for l in 0..LANES {
                    a[l] += wp[l] * xv;
                }
            }
        }
    }
    acc
}

/// The tile's product with AVX2/FMA: `MR × 2·NV` accumulators in registers;
/// per element of `in`, each panel's 16 int8 weights are widened to f32 and
/// scaled once, then multiply-added into every row. A missing last panel
/// is computed from zeros and not stored.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<const MR: usize, const NV: usize>(t: &QTile<'_>) -> Acc<MR, NV> {
    use std::arch::x86_64::*;
    t.check(MR);
    let np = t.np.min(NV);
    let nb = t.inp / QK8_0;
    let (panel_q, panel_s) = (t.inp * LANES, nb * LANES);
    let mut acc = [[[_mm256_setzero_ps(); 2]; NV]; MR];
    let (q, s, x) = (t.qs.as_ptr(), t.scales.as_ptr(), t.x.as_ptr());
    for b in 0..nb {
        let mut d = [[_mm256_setzero_ps(); 2]; NV];
        for (p, dp) in d.iter_mut().enumerate().take(np) {
            // SAFETY: p < np and b < nb: 16 scales inside `scales` (checked).
            unsafe {
                let at = s.add(p * panel_s + b * LANES);
                *dp = [_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8))];
            }
        }
        for k in b * QK8_0..(b + 1) * QK8_0 {
            let mut wv = [[_mm256_setzero_ps(); 2]; NV];
            for (p, v) in wv.iter_mut().enumerate().take(np) {
                // SAFETY: p < np and k < inp, so the 16 bytes lie inside `qs`
                // (checked above); each load reads 8 of them.
                unsafe {
                    let at = q.add(p * panel_q + k * LANES);
                    let lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.cast()));
                    let hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.add(8).cast()));
                    *v = [
                        _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d[p][0]),
                        _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d[p][1]),
                    ];
                }
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                // SAFETY: r < MR and k < inp: inside `t.x` (checked above).
                let xv = unsafe { _mm256_broadcast_ss(&*x.add(r * t.inp + k)) };
                for (a, v) in acc_r.iter_mut().zip(&wv) {
                    a[0] = _mm256_fmadd_ps(v[0], xv, a[0]);
                    a[1] = _mm256_fmadd_ps(v[1], xv, a[1]);
                }
            }
        }
    }
    let mut res = [[[0f32; LANES]; NV]; MR];
    for (dst_r, acc_r) in res.iter_mut().zip(&acc) {
        for (dst, a) in dst_r.iter_mut().zip(acc_r) {
            // SAFETY: `dst` is LANES (16) floats: two 8-float stores.
            unsafe {
                _mm256_storeu_ps(dst.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(dst.as_mut_ptr().add(8), a[1]);
            }
        }
    }
    res
}

