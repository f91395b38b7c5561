//! The K-quant product with the weights rebuilt in f32 (Q5_K, and any
//! kind packed with [`PackedKQuant::from_blocks_rebuild`]), over panels in
//! [`Layout::Dequantized`](super::panels::Layout::Dequantized).
//!
//! Per sub-block the kernel computes each panel's 16 scales `d·sc` (and
//! offsets `dmin·m`) once; per element of `in` it widens the panel's 16
//! quants to f32 and makes the weights with one `q·s − o` multiply-add, then
//! multiply-adds them into every row of its register tile. That rebuilds
//! exactly candle's dequantized weights (`d·sc` and `q·(d·sc)` are exact in
//! f32, one rounding as in candle), so the product is the product with the
//! dequantized weights to f32 summation order.

use std::ops::Range;

use super::PackedKQuant;
use super::format::{IQ4, KQuant, Q4, Q5, Q6, QK_K, kind_of};
use super::panels::{PanelRun, decode};
use crate::isa::{Isa, IsaKind};
use crate::packed::tiling::{LANES, MAX_MR, TileSums, TiledOutput, for_each_tile};

impl PackedKQuant {
    /// Rows `rows` × the columns of panel groups `groups` (of `nv` panels),
    /// row tiles inside panel groups as in the dense kernel.
    pub(super) fn compute_dequantized(
        &self,
        isa: Isa,
        nv: usize,
        x: &[f32],
        rows: Range<usize>,
        groups: Range<usize>,
        out: &TiledOutput,
    ) {
        let panels = self.out.div_ceil(LANES);
        for_each_tile::<MAX_MR>(rows, groups, (nv, panels), |r0, mr, p0, np| {
            let t = KTile {
                w: self.panels.run(self.kind, self.inp, p0..p0 + np),
                x: &x[r0 * self.inp..(r0 + mr) * self.inp],
                inp: self.inp,
                np,
            };
            kernel(isa, self.kind, mr, nv, &t, r0, p0 * LANES, out);
        });
    }
}

/// One register tile's operands.
struct KTile<'a> {
    /// The tile's panels (quants `[np][inp][bpk]`, scales `[np][inp /
    /// sub][LANES]`, `d`s `[np][inp / 256][LANES]`).
    w: PanelRun<'a>,
    /// Its rows of `x`, `[mr][inp]`.
    x: &'a [f32],
    inp: usize,
    /// Panels present (the last group may have fewer than the tile's NV).
    np: usize,
}

/// Runs the micro-kernel for `kind`, `mr` rows and `nv` panels, storing at
/// (`row0`, `col0`).
// Every call is wrapped in `unsafe`, which the portable kernel does not need.
#[allow(unused_unsafe, clippy::too_many_arguments)]
fn kernel(
    isa: Isa,
    kind: KQuant,
    mr: usize,
    nv: usize,
    t: &KTile<'_>,
    row0: usize,
    col0: usize,
    out: &TiledOutput,
) {
    macro_rules! shapes {
        ($f:ident, $k:ident) => {
            run_tile!($f::<$k>(t) at (row0, col0) of out, shape (mr, nv) in [
                1 x 4, 2 x 2, 3 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1
            ])
        };
    }
    // SAFETY (the `unsafe` calls): an `Isa` can only be made by detection
    // (see `isa.rs`), so holding one means the CPU has its features.
    match (isa.kind(), kind) {
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, KQuant::Q4K) => shapes!(tile_avx2, Q4),
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, KQuant::Q5K) => shapes!(tile_avx2, Q5),
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, KQuant::Q6K) => shapes!(tile_avx2, Q6),
        (_, KQuant::Q4K) => shapes!(tile_portable, Q4),
        (_, KQuant::Q5K) => shapes!(tile_portable, Q5),
        (_, KQuant::Q6K) => shapes!(tile_portable, Q6),
        // Only the benchmarks pack IQ4_XS this way: the portable tile.
        (_, KQuant::Iq4Xs) => shapes!(tile_portable, IQ4),
    }
}

/// The tile's product, portable (the compiler vectorises what it can).
fn tile_portable<const K: u8, const MR: usize, const NV: usize>(t: &KTile<'_>) -> TileSums<MR, NV> {
    let kind = kind_of(K);
    let (sub, bpk) = (kind.sub(), kind.bpk());
    let (nsub, nsb) = (t.inp / sub, t.inp / QK_K);
    let np = t.np.min(NV);
    let (sc, mn) = (t.w.sc, t.w.mn);
    let mut acc = [[[0f32; LANES]; NV]; MR];
    let mut s = [[0f32; LANES]; NV];
    let mut o = [[0f32; LANES]; NV];
    let mut w = [[0f32; LANES]; NV];
    for b in 0..nsub {
        let sb = b * sub / QK_K;
        for p in 0..np {
            let (at, dat) = ((p * nsub + b) * LANES, (p * nsb + sb) * LANES);
            for l in 0..LANES {
                s[p][l] = t.w.d[dat + l] * f32::from(sc[at + l]);
                if kind.has_min() {
                    o[p][l] = t.w.dmin[dat + l] * f32::from(mn[at + l]);
                }
            }
        }
        for k in b * sub..(b + 1) * sub {
            for p in 0..np {
                let src = &t.w.qs[(p * t.inp + k) * bpk..][..bpk];
                for l in 0..LANES {
                    w[p][l] = decode::<K>(src, l) as f32 * s[p][l] - o[p][l];
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
    }
    acc
}

/// The 16 quants of one element of `in` of a panel, as two vectors of 8
/// i32 (rows 0–7, 8–15).
///
/// # Safety
/// `at` points at `kind_of(K).bpk()` readable bytes; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn decode_avx2<const K: u8>(
    at: *const u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        if K == Q6 {
            return (
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.cast())),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.add(8).cast())),
            );
        }
        // Byte l holds row l (low nibble) and row l + 8 (high nibble).
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.cast()));
        let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xF));
        let hi = _mm256_srli_epi32::<4>(v);
        if K != Q5 {
            return (lo, hi);
        }
        // The fifth bits: bit l of the u16 after the nibbles is row l's.
        let h = _mm256_set1_epi32(i32::from(at.add(8).cast::<u16>().read_unaligned()));
        let one = _mm256_set1_epi32(1);
        let bit = |shifts: __m256i| {
            _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srlv_epi32(h, shifts), one))
        };
        (
            _mm256_or_si256(lo, bit(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))),
            _mm256_or_si256(hi, bit(_mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15))),
        )
    }
}

/// The tile's product with AVX2/FMA: `MR × 2·NV` accumulators in registers;
/// per sub-block each panel's 16 scales (and offsets) are made once, per
/// element of `in` its 16 quants are widened to f32 and turned into weights
/// with one multiply-add, then multiply-added into every row. A missing
/// last panel is computed from zeros and not stored.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<const K: u8, const MR: usize, const NV: usize>(t: &KTile<'_>) -> TileSums<MR, NV> {
    use std::arch::x86_64::*;
    let kind = kind_of(K);
    let (sub, bpk) = (kind.sub(), kind.bpk());
    let (nsub, nsb) = (t.inp / sub, t.inp / QK_K);
    let np = t.np.min(NV);
    assert!(
        t.x.len() >= MR * t.inp
            && t.inp.is_multiple_of(QK_K)
            && t.w.qs.len() >= np * t.inp * bpk
            && t.w.sc.len() >= np * nsub * LANES
            && t.w.d.len() >= np * nsb * LANES
            && (!kind.has_min()
                || (t.w.mn.len() >= np * nsub * LANES && t.w.dmin.len() >= np * nsb * LANES))
    );
    let (panel_q, panel_s, panel_d) = (t.inp * bpk, nsub * LANES, nsb * LANES);
    let mut acc = [[[_mm256_setzero_ps(); 2]; NV]; MR];
    let (q, x) = (t.w.qs.as_ptr(), t.x.as_ptr());
    for b in 0..nsub {
        let sb = b * sub / QK_K;
        let mut s = [[_mm256_setzero_ps(); 2]; NV];
        let mut o = [[_mm256_setzero_ps(); 2]; NV];
        for p in 0..np {
            // SAFETY: p < np, b < nsub, sb < nsb: 16 values of each array
            // (checked above).
            unsafe {
                let (at, dat) = ((p * panel_s + b * LANES), p * panel_d + sb * LANES);
                let widen = |v: *const i8| {
                    [
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(v.cast()))),
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(v.add(8).cast()))),
                    ]
                };
                let d = t.w.d.as_ptr().add(dat);
                let sc = widen(t.w.sc.as_ptr().add(at));
                s[p] = [
                    _mm256_mul_ps(sc[0], _mm256_loadu_ps(d)),
                    _mm256_mul_ps(sc[1], _mm256_loadu_ps(d.add(8))),
                ];
                if kind.has_min() {
                    let dm = t.w.dmin.as_ptr().add(dat);
                    let m = widen(t.w.mn.as_ptr().add(at));
                    o[p] = [
                        _mm256_mul_ps(m[0], _mm256_loadu_ps(dm)),
                        _mm256_mul_ps(m[1], _mm256_loadu_ps(dm.add(8))),
                    ];
                }
            }
        }
        for k in b * sub..(b + 1) * sub {
            let mut wv = [[_mm256_setzero_ps(); 2]; NV];
            for (p, v) in wv.iter_mut().enumerate().take(np) {
                // SAFETY: p < np and k < inp: the bpk bytes lie inside `qs`.
                let (lo, hi) = unsafe { decode_avx2::<K>(q.add(p * panel_q + k * bpk)) };
                let (lo, hi) = (_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi));
                *v = if kind.has_min() {
                    [
                        _mm256_fmsub_ps(lo, s[p][0], o[p][0]),
                        _mm256_fmsub_ps(hi, s[p][1], o[p][1]),
                    ]
                } else {
                    [_mm256_mul_ps(lo, s[p][0]), _mm256_mul_ps(hi, s[p][1])]
                };
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
    crate::packed::tiling::tile_sums_avx2(&acc)
}
