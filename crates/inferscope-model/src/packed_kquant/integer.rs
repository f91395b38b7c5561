//! The integer K-quant product: Q4_K, Q6_K and IQ4_XS weights, over panels in
//! [`Layout::Integer`](super::panels::Layout::Integer), × Q8_K activations.
//!
//! The activations are quantized per product to Q8_K (see `q8k.rs`); each
//! super-block of a weight row then costs integer dot products of the
//! unsigned quants with the int8 activations (`maddubs`), summed per
//! sub-block in int16, scaled by the sub-block scales in int32 (`madd`),
//! and one f32 multiply-add by `d·d_x` per super-block. The mins (Q4_K) and
//! Q6_K's `−32` go through the activations' 16-sums (`bsums`): per
//! super-block `Σ_j m_j·bsum_j` and `32·Σ_j sc_j·bsum_j`, in int32.
//! IQ4_XS's indices become its table's int8 values in registers (a byte
//! shuffle); being signed, they multiply the activations by the sign trick
//! (`maddubs(|w|, x·sign(w))`), as ggml's `mul_sum_i8_pairs` does.
//! Where the CPU has AVX512-VNNI (under [`IsaKind::Avx512`]), `vpdpbusd`
//! takes the `maddubs`/`madd` pair's place: int32 sums per sub-block with no
//! int16 step, and IQ4_XS's table offset to unsigned instead of the sign
//! trick (timings in docs/results/cpu-executor.md).

use std::ops::Range;

use super::PackedKQuant;
use super::format::{IQ4, KQuant, Q4, Q6, QK_K, kind_of};
use super::panels::{PanelRun, int_at};
use crate::isa::{Dot, Isa, IsaKind};
use crate::packed::tiling::{LANES, TileSums, TiledOutput, for_each_tile};
use crate::q8k::{BSUM, Q8K};

/// Rows of `x` in one integer register tile at most (with one panel: 8
/// int16 accumulators, the weights, the mask and a broadcast fill the 16
/// registers).
const INT_MR: usize = 4;
/// Rows of `x` in one VNNI tile at most: AVX512VL's 32 `ymm` registers
/// hold six rows' float and int32 accumulators for one panel next to the
/// operands (128-row products 0.89–0.99× the time of 4-row tiles,
/// `docs/results/cpu-executor.md`).
const VNNI_MR: usize = 6;

impl PackedKQuant {
    /// Rows `rows` × panel groups `groups` (of `nv` panels) of the product
    /// with the quantized activations `x`, with the tiles of `isa`'s dot
    /// product.
    pub(super) fn compute_integer(
        &self,
        isa: Isa,
        nv: usize,
        x: &Q8K,
        rows: Range<usize>,
        groups: Range<usize>,
        out: &TiledOutput,
    ) {
        let (inp, nsb) = (self.inp, self.inp / QK_K);
        let panels = self.out.div_ceil(LANES);
        // IQ4_XS's tile needs the scales at every group, not every 8th: at
        // most 2 panels per tile keep its operands in the 16 registers.
        let step = if self.kind == KQuant::Iq4Xs {
            nv.min(2)
        } else {
            nv
        };
        let body = |r0: usize, mr: usize, p0: usize, np: usize| {
            for q0 in (p0..p0 + np).step_by(step) {
                let qn = step.min(p0 + np - q0);
                let t = ITile {
                    w: self.panels.run(self.kind, inp, q0..q0 + qn),
                    xq: &x.qs[r0 * inp..(r0 + mr) * inp],
                    xd: &x.d[r0 * nsb..(r0 + mr) * nsb],
                    xs: &x.bsums[r0 * inp / BSUM..(r0 + mr) * inp / BSUM],
                    nsb,
                    np: qn,
                };
                int_kernel(isa, self.kind, mr, step, &t, r0, q0 * LANES, out);
            }
        };
        if isa.dot() == Dot::Avx512Vnni {
            for_each_tile::<VNNI_MR>(rows, groups, (nv, panels), body);
        } else {
            for_each_tile::<INT_MR>(rows, groups, (nv, panels), body);
        }
    }
}

/// One integer register tile's operands.
struct ITile<'a> {
    /// The tile's panels (quants `[np][nsb][int_sb_bytes]`, scales
    /// `[np][nsb][pairs][LANES][2]`, `d`s `[np][nsb][LANES]`).
    w: PanelRun<'a>,
    /// The rows' Q8_K quants, `[mr][inp]`.
    xq: &'a [i8],
    /// Their block scales, `[mr][nsb]`.
    xd: &'a [f32],
    /// Their 16-sums, `[mr][inp / 16]`.
    xs: &'a [i16],
    /// Super-blocks along `in`.
    nsb: usize,
    /// Panels present (the last group may have fewer than the tile's NV).
    np: usize,
}

impl ITile<'_> {
    /// Panics unless every array holds what the tile of `MR` rows reads
    /// (the AVX2 kernel's loads rely on it).
    fn check<const MR: usize>(&self, kind: KQuant) {
        let (nsb, np) = (self.nsb, self.np);
        let s = np * nsb * kind.pairs() * LANES * 2;
        assert!(
            self.w.qs.len() >= np * nsb * kind.int_sb_bytes()
                && self.w.sc.len() >= s
                && self.w.d.len() >= np * nsb * LANES
                && (!kind.has_min()
                    || (self.w.mn.len() >= s && self.w.dmin.len() >= np * nsb * LANES))
                && self.xq.len() >= MR * nsb * QK_K
                && self.xd.len() >= MR * nsb
                && self.xs.len() >= MR * nsb * QK_K / BSUM
        );
    }

    /// Row `r`'s activation sums paired as `madd` takes them, for pair `i`
    /// of super-block `b`'s sub-blocks: Q4_K's sub-blocks are 32 (two
    /// 16-sums each), Q6_K's 16.
    #[inline(always)]
    fn bsum_pair(&self, kind: KQuant, r: usize, b: usize, i: usize) -> (i16, i16) {
        let s = &self.xs[(r * self.nsb + b) * (QK_K / BSUM)..][..QK_K / BSUM];
        if kind.sub() == 32 {
            (s[4 * i] + s[4 * i + 1], s[4 * i + 2] + s[4 * i + 3])
        } else {
            (s[2 * i], s[2 * i + 1])
        }
    }
}

/// Runs the integer micro-kernel for `kind`, `mr` rows and `nv` panels,
/// storing at (`row0`, `col0`); under the AVX2 ISA, the tile of its dot
/// product ([`Dot`]).
#[allow(unused_unsafe, clippy::too_many_arguments)]
fn int_kernel(
    isa: Isa,
    kind: KQuant,
    mr: usize,
    nv: usize,
    t: &ITile<'_>,
    row0: usize,
    col0: usize,
    out: &TiledOutput,
) {
    // Every tile shape up to `INT_MR` rows, and the taller ones given (the
    // VNNI tiles', up to `VNNI_MR`).
    macro_rules! shapes {
        ($f:ident, $k:ident $(, $m:literal x $n:literal)*) => {
            run_tile!($f::<$k>(t) at (row0, col0) of out, shape (mr, nv) in [
                1 x 4, 2 x 2, 3 x 2, 1 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1 $(, $m x $n)*
            ])
        };
    }
    // SAFETY (the `unsafe` calls): an `Isa` can only be made by detection
    // (see `isa.rs`), so holding one means the CPU has its features, its
    // dot product's included.
    use Dot::{Avx512Vnni, AvxVnni, Maddubs};
    use IsaKind::Avx2;
    match (isa.kind(), isa.dot(), kind) {
        #[cfg(target_arch = "x86_64")]
        (Avx2, Avx512Vnni, KQuant::Q4K) => shapes!(int_tile_vnni, Q4, 5 x 1, 6 x 1),
        #[cfg(target_arch = "x86_64")]
        (Avx2, Avx512Vnni, KQuant::Q6K) => shapes!(int_tile_vnni, Q6, 5 x 1, 6 x 1),
        #[cfg(target_arch = "x86_64")]
        (Avx2, Avx512Vnni, KQuant::Iq4Xs) => shapes!(int_tile_vnni, IQ4, 5 x 1, 6 x 1),
        #[cfg(target_arch = "x86_64")]
        (Avx2, AvxVnni, KQuant::Q4K) => shapes!(int_tile_avx_vnni, Q4),
        #[cfg(target_arch = "x86_64")]
        (Avx2, AvxVnni, KQuant::Q6K) => shapes!(int_tile_avx_vnni, Q6),
        #[cfg(target_arch = "x86_64")]
        (Avx2, AvxVnni, KQuant::Iq4Xs) => shapes!(int_tile_avx_vnni, IQ4),
        #[cfg(target_arch = "x86_64")]
        (Avx2, Maddubs, KQuant::Q4K) => shapes!(int_tile_avx2, Q4),
        #[cfg(target_arch = "x86_64")]
        (Avx2, Maddubs, KQuant::Q6K) => shapes!(int_tile_avx2, Q6),
        #[cfg(target_arch = "x86_64")]
        (Avx2, Maddubs, KQuant::Iq4Xs) => shapes!(int_tile_avx2, IQ4),
        (_, _, KQuant::Q4K) => shapes!(int_tile_portable, Q4),
        (_, _, KQuant::Q6K) => shapes!(int_tile_portable, Q6),
        (_, _, KQuant::Iq4Xs) => shapes!(int_tile_portable, IQ4),
        (_, _, KQuant::Q5K) => unreachable!("Q5_K has no integer layout"),
    }
}

/// The integer tile, portable: the same integer sums, one output at a time.
fn int_tile_portable<const K: u8, const MR: usize, const NV: usize>(
    t: &ITile<'_>,
) -> TileSums<MR, NV> {
    let kind = kind_of(K);
    t.check::<MR>(kind);
    let (nsb, sub, pairs, sbb) = (t.nsb, kind.sub(), kind.pairs(), kind.int_sb_bytes());
    let mut acc = [[[0f32; LANES]; NV]; MR];
    for (r, acc_r) in acc.iter_mut().enumerate() {
        for (p, acc_p) in acc_r.iter_mut().enumerate().take(t.np.min(NV)) {
            for (l, a) in acc_p.iter_mut().enumerate() {
                for b in 0..nsb {
                    let pb = p * nsb + b;
                    let q = &t.w.qs[pb * sbb..][..sbb];
                    let x = &t.xq[(r * nsb + b) * QK_K..][..QK_K];
                    let (mut isum, mut corr) = (0i32, 0i32);
                    for s in 0..QK_K / sub {
                        let at = ((pb * pairs + s / 2) * LANES + l) * 2 + s % 2;
                        let dot: i32 = (s * sub..(s + 1) * sub)
                            .map(|kk| {
                                let (i, shift) = int_at(kind, l, kk);
                                let v = (q[i] >> shift) & if K == Q6 { 0xFF } else { 0xF };
                                let w = if K == IQ4 {
                                    i32::from(crate::iq4::KVALUES[usize::from(v)])
                                } else {
                                    i32::from(v)
                                };
                                w * i32::from(x[kk])
                            })
                            .sum();
                        isum += i32::from(t.w.sc[at]) * dot;
                        let c = if K == Q4 { t.w.mn[at] } else { t.w.sc[at] };
                        let (b0, b1) = t.bsum_pair(kind, r, b, s / 2);
                        corr += i32::from(c) * i32::from(if s % 2 == 0 { b0 } else { b1 });
                    }
                    let dx = t.xd[r * nsb + b];
                    if K == Q4 {
                        *a += isum as f32 * (t.w.d[pb * LANES + l] * dx);
                        *a -= corr as f32 * (t.w.dmin[pb * LANES + l] * dx);
                    } else if K == IQ4 {
                        *a += isum as f32 * (t.w.d[pb * LANES + l] * dx);
                    } else {
                        *a += (isum - 32 * corr) as f32 * (t.w.d[pb * LANES + l] * dx);
                    }
                }
            }
        }
    }
    acc
}

/// IQ4_XS's table offset by 128, as bytes: unsigned, for `vpdpbusd`.
#[cfg(target_arch = "x86_64")]
const KVALUES_PLUS_128: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (crate::iq4::KVALUES[i] as i16 + 128) as u8 as i8;
        i += 1;
    }
    t
};

/// The integer tiles on 256-bit vectors, written once for two instruction
/// sets: `$name` is compiled with `$features`, and `$vnni` picks the dot
/// products (the other branch is never taken, so never needs the features).
///
/// AVX2 (`int_tile_avx2`): per group of 4 elements of `in`, each panel's 16
/// rows × 4 quants are two 32-byte vectors (Q4_K: one load, the nibbles
/// split by and/shift), `maddubs` against each row's 4 activations
/// broadcast gives int16 pair sums, added up per sub-block (Q6_K: per 2
/// groups, where int16 would overflow further), then `madd` by the
/// sub-block scales into int32 per super-block; at its end the mins (or
/// `−32`) from the `bsums`, and one f32 multiply-add by `d·d_x`. IQ4_XS's
/// signed table values take the sign trick and a `madd` after every group.
///
/// VNNI (`int_tile_vnni`, AVX512-VNNI on 256-bit vectors; `int_tile_avx_vnni`,
/// the same instruction in AVX-VNNI's VEX encoding, for CPUs with AVX2 but no
/// AVX-512, whose 16 registers keep the AVX2 tiles' shapes): `vpdpbusd` sums
/// each row's 4 products straight into int32, a sub-block's groups with no
/// int16 step and no overflow, then one multiply by the sub-block's scales.
/// IQ4_XS's table is offset to unsigned (`w + 128`), and `128·Σ sc·x`
/// comes back out through the `bsums`, as Q6_K's `−32` does.
macro_rules! int_tile_x86 {
    ($name:ident, $features:literal, $dot:expr) => {
        /// The integer tile with the instruction sets of `#[target_feature]`
        /// (see `int_tile_x86!`).
        ///
        /// # Safety
        /// The CPU has those instruction sets.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        fn $name<const K: u8, const MR: usize, const NV: usize>(t: &ITile<'_>) -> TileSums<MR, NV> {
            use std::arch::x86_64::*;
            const VNNI: bool = !matches!($dot, Dot::Maddubs);
            // VNNI through AVX-VNNI's VEX encoding rather than AVX512VL's.
            const AVX_VNNI: bool = matches!($dot, Dot::AvxVnni);
            let kind = kind_of(K);
            t.check::<MR>(kind);
            let (nsb, pairs, sbb) = (t.nsb, kind.pairs(), kind.int_sb_bytes());
            // Every loop runs over all NV panels (constant bounds: the arrays stay
            // in registers); a missing last panel reads the last present one and
            // is not stored.
            let last = t.np.min(NV) - 1;
            let inp = nsb * QK_K;
            // Groups of 4 elements per sub-block, and per int16 sum: Q4_K's
            // 8 × 2 × 15 × 128 < 2¹⁵, Q6_K's 2 × 2 × 63 × 128 < 2¹⁵, IQ4_XS's one
            // (2 × 127 × 127 fills an int16).
            let gsub = kind.sub() / 4;
            let gsum = match K {
                // VNNI's int32 sums hold a whole sub-block.
                _ if VNNI => gsub,
                Q4 => 8,
                IQ4 => 1,
                _ => 2,
            };
            let mask = _mm256_set1_epi8(0x0F);
            // The table in both 128-bit halves, for `vpshufb`.
            let table = {
                // With VNNI, offset to unsigned (`vpdpbusd` multiplies u8 by i8).
                let k = if VNNI {
                    &KVALUES_PLUS_128
                } else {
                    &crate::iq4::KVALUES
                };
                // SAFETY: the table is 16 bytes.
                let lane = unsafe { _mm_loadu_si128(k.as_ptr().cast()) };
                _mm256_set_m128i(lane, lane)
            };
            // Byte shuffles picking sub-block 0 or 1 of a pair, each twice.
            let pick = [
                _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14),
                _mm_setr_epi8(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15),
            ];
            // VNNI: once each, in the low 8 bytes (widened to int32).
            let pick_once = [
                _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1),
                _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1),
            ];
            let (qs, sc) = (t.w.qs.as_ptr(), t.w.sc.as_ptr());
            let corr_src = if K == Q4 { t.w.mn.as_ptr() } else { sc };
            let mut facc = [[[_mm256_setzero_ps(); 2]; NV]; MR];
            for b in 0..nsb {
                if MR == 1 {
                    // Decode: the next super-block's scales (past a panel's last,
                    // the next panel's first), which lie in four arrays of their
                    // own; without this their misses held up the quants' stream
                    // (a Q4_K_M decode step took 1.5–6 % longer).
                    for p in 0..NV {
                        let pb = p.min(last) * nsb + b + 1;
                        let (at, bytes) = (pb * pairs * LANES * 2, pairs * LANES * 2);
                        for line in (at..at + bytes).step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>(sc.wrapping_add(line).cast());
                            if K == Q4 {
                                _mm_prefetch::<_MM_HINT_T0>(
                                    t.w.mn.as_ptr().wrapping_add(line).cast(),
                                );
                            }
                        }
                        _mm_prefetch::<_MM_HINT_T0>(t.w.d.as_ptr().wrapping_add(pb * LANES).cast());
                        if K == Q4 {
                            _mm_prefetch::<_MM_HINT_T0>(
                                t.w.dmin.as_ptr().wrapping_add(pb * LANES).cast(),
                            );
                        }
                    }
                }
                let mut iacc = [[[_mm256_setzero_si256(); 2]; NV]; MR];
                for s in 0..QK_K / kind.sub() {
                    // The sub-block scales per row: int16, each twice (the
                    // `madd` pairs), or with VNNI int32, once.
                    let mut scv = [[_mm256_setzero_si256(); 2]; NV];
                    for (p, v) in scv.iter_mut().enumerate() {
                        for (h, v) in v.iter_mut().enumerate() {
                            let at =
                                (((p.min(last) * nsb + b) * pairs + s / 2) * LANES + 8 * h) * 2;
                            // SAFETY: p ≤ last < np, b < nsb, s / 2 < pairs: 16
                            // bytes inside `sc` (checked).
                            let raw = unsafe { _mm_loadu_si128(sc.add(at).cast()) };
                            *v = if VNNI {
                                _mm256_cvtepi8_epi32(_mm_shuffle_epi8(raw, pick_once[s % 2]))
                            } else {
                                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(raw, pick[s % 2]))
                            };
                        }
                    }
                    for a in 0..gsub / gsum {
                        // Sums of `gsum` groups: int16 pairs, or with VNNI int32.
                        let mut sg = [[[_mm256_setzero_si256(); 2]; NV]; MR];
                        for gg in 0..gsum {
                            let g = s * gsub + a * gsum + gg;
                            let mut xb = [_mm256_setzero_si256(); MR];
                            for (r, v) in xb.iter_mut().enumerate() {
                                let at = r * inp + b * QK_K + 4 * g;
                                // SAFETY: r < MR, 4g + 4 ≤ 256: inside `xq`.
                                *v = _mm256_set1_epi32(unsafe {
                                    t.xq.as_ptr().add(at).cast::<i32>().read_unaligned()
                                });
                            }
                            for p in 0..NV {
                                let base = (p.min(last) * nsb + b) * sbb;
                                // SAFETY: p ≤ last < np, b < nsb, g < 64: inside `qs`.
                                let w = unsafe {
                                    if K == Q4 || K == IQ4 {
                                        let v = _mm256_loadu_si256(qs.add(base + 32 * g).cast());
                                        let (lo, hi) = (
                                            _mm256_and_si256(v, mask),
                                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                                        );
                                        if K == IQ4 {
                                            [
                                                _mm256_shuffle_epi8(table, lo),
                                                _mm256_shuffle_epi8(table, hi),
                                            ]
                                        } else {
                                            [lo, hi]
                                        }
                                    } else {
                                        [
                                            _mm256_loadu_si256(qs.add(base + 64 * g).cast()),
                                            _mm256_loadu_si256(qs.add(base + 64 * g + 32).cast()),
                                        ]
                                    }
                                };
                                if VNNI {
                                    for (sg_r, x) in sg.iter_mut().zip(&xb) {
                                        for (acc, w) in sg_r[p].iter_mut().zip(w) {
                                            // Unsafe to call only in the tiles
                                            // that never take the branch.
                                            #[allow(unused_unsafe)]
                                            // SAFETY: each branch is reached only
                                            // in the tile whose target features
                                            // include its instructions (AVX-VNNI;
                                            // AVX512-VNNI and AVX512VL).
                                            let v = unsafe {
                                                if AVX_VNNI {
                                                    _mm256_dpbusd_avx_epi32(*acc, w, *x)
                                                } else {
                                                    _mm256_dpbusd_epi32(*acc, w, *x)
                                                }
                                            };
                                            *acc = v;
                                        }
                                    }
                                } else if K == IQ4 {
                                    // Signed weights: |w| times x with w's sign (the
                                    // activations are −127..127: no overflow).
                                    let aw = w.map(|w| _mm256_sign_epi8(w, w));
                                    for (sg_r, x) in sg.iter_mut().zip(&xb) {
                                        for h in 0..2 {
                                            let xs = _mm256_sign_epi8(*x, w[h]);
                                            let m = _mm256_maddubs_epi16(aw[h], xs);
                                            sg_r[p][h] = _mm256_add_epi16(sg_r[p][h], m);
                                        }
                                    }
                                } else {
                                    for (sg_r, x) in sg.iter_mut().zip(&xb) {
                                        for h in 0..2 {
                                            let m = _mm256_maddubs_epi16(w[h], *x);
                                            sg_r[p][h] = _mm256_add_epi16(sg_r[p][h], m);
                                        }
                                    }
                                }
                            }
                        }
                        for (ia_r, sg_r) in iacc.iter_mut().zip(&sg) {
                            for p in 0..NV {
                                for h in 0..2 {
                                    let m = if VNNI {
                                        _mm256_mullo_epi32(sg_r[p][h], scv[p][h])
                                    } else {
                                        _mm256_madd_epi16(sg_r[p][h], scv[p][h])
                                    };
                                    ia_r[p][h] = _mm256_add_epi32(ia_r[p][h], m);
                                }
                            }
                        }
                    }
                }
                // The super-block's mins (or `−32`) and its f32 scale.
                for p in 0..NV {
                    let pb = p.min(last) * nsb + b;
                    for (r, (fa_r, ia_r)) in facc.iter_mut().zip(&iacc).enumerate() {
                        let dx = _mm256_set1_ps(t.xd[r * nsb + b]);
                        let mut c = [_mm256_setzero_si256(); 2];
                        // IQ4_XS has no min, and an offset only with VNNI.
                        for i in 0..if K == IQ4 && !VNNI { 0 } else { pairs } {
                            let (b0, b1) = t.bsum_pair(kind, r, b, i);
                            let pair =
                                _mm256_set1_epi32(i32::from(b0 as u16) | (i32::from(b1) << 16));
                            for (h, c) in c.iter_mut().enumerate() {
                                let at = ((pb * pairs + i) * LANES + 8 * h) * 2;
                                // SAFETY: as for `scv`.
                                let v = unsafe { _mm_loadu_si128(corr_src.add(at).cast()) };
                                let m = _mm256_madd_epi16(_mm256_cvtepi8_epi16(v), pair);
                                *c = _mm256_add_epi32(*c, m);
                            }
                        }
                        for h in 0..2 {
                            let at = pb * LANES + 8 * h;
                            // SAFETY: pb < np · nsb: 16 floats of `d` (and `dmin`).
                            let d = unsafe { _mm256_loadu_ps(t.w.d.as_ptr().add(at)) };
                            let a = &mut fa_r[p][h];
                            if K == Q4 {
                                // SAFETY: as `d`: Q4_K has `dmin` (checked).
                                let dm = unsafe { _mm256_loadu_ps(t.w.dmin.as_ptr().add(at)) };
                                let i = _mm256_cvtepi32_ps(ia_r[p][h]);
                                *a = _mm256_fmadd_ps(i, _mm256_mul_ps(d, dx), *a);
                                let m = _mm256_cvtepi32_ps(c[h]);
                                *a = _mm256_fnmadd_ps(m, _mm256_mul_ps(dm, dx), *a);
                            } else if K == IQ4 {
                                // With VNNI the table was offset by 128.
                                let i = if VNNI {
                                    _mm256_sub_epi32(ia_r[p][h], _mm256_slli_epi32::<7>(c[h]))
                                } else {
                                    ia_r[p][h]
                                };
                                let i = _mm256_cvtepi32_ps(i);
                                *a = _mm256_fmadd_ps(i, _mm256_mul_ps(d, dx), *a);
                            } else {
                                let i = _mm256_sub_epi32(ia_r[p][h], _mm256_slli_epi32::<5>(c[h]));
                                let i = _mm256_cvtepi32_ps(i);
                                *a = _mm256_fmadd_ps(i, _mm256_mul_ps(d, dx), *a);
                            }
                        }
                    }
                }
            }
            crate::packed::tiling::tile_sums_avx2(&facc)
        }
    };
}

int_tile_x86!(int_tile_avx2, "avx2,fma", Dot::Maddubs);
int_tile_x86!(int_tile_avx_vnni, "avx2,fma,avxvnni", Dot::AvxVnni);
int_tile_x86!(
    int_tile_vnni,
    "avx2,fma,avx512f,avx512vl,avx512vnni",
    Dot::Avx512Vnni
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_reference::{isas_checked, product_f64, rel_diff_f64};
    use crate::packed_kquant::panels::Layout;
    use crate::packed_kquant::tests::{INT_TOL_DEQ, naive, rel_diff, weight};

    /// The integer products against the exact product of their operands
    /// (see `kernel_reference`): the dequantized weights (exactly candle's)
    /// times the activations as the portable Q8_K quantizer rounds them. The
    /// kernels scale by `sc` in integers and by `d` per super-block in f32,
    /// so they differ from it by the f32 rounding of a few terms per
    /// super-block.
    const INT_TOL_EXACT: f64 = 2e-6;

    /// Rows of activations of varied magnitudes per 256-block and row.
    fn varied_input(rows: usize, inp: usize, seed: usize) -> Vec<f32> {
        (0..rows * inp)
            .map(|i| {
                let h = (i * 2246822519 + seed * 3266489917) % 65521;
                (h as f32 / 65521.0 - 0.5) * (0.2 + (i / QK_K % 7) as f32)
            })
            .collect()
    }

    /// `x` as the portable Q8_K quantizer rounds it, dequantized in f64.
    fn q8k_operand(x: &[f32], rows: usize, inp: usize) -> Vec<f64> {
        let mut q = crate::q8k::Q8K::default();
        q.quantize(Isa::get(IsaKind::Portable).unwrap(), x, rows, inp);
        q.qs.iter()
            .enumerate()
            .map(|(k, &v)| f64::from(q.d[k / QK_K]) * f64::from(v))
            .collect()
    }

    /// The integer product of Q4_K, Q6_K and IQ4_XS weights against the
    /// exact product of its operands and against the dequantized product,
    /// every ISA.
    fn check_int(rows: usize, inp: usize, out: usize) {
        for kind in [KQuant::Q4K, KQuant::Q6K, KQuant::Iq4Xs] {
            let (blocks, deq) = weight(kind, out, inp, rows + out);
            let p = PackedKQuant::from_blocks(kind, &blocks, out, inp).unwrap();
            assert!(
                p.layout == Layout::Integer,
                "{kind:?} runs integer products"
            );
            let x = varied_input(rows, inp, out);
            let c = product_f64(&q8k_operand(&x, rows, inp), &deq, rows, inp, out);
            let e = naive(&x, &deq, rows, inp, out);
            for isa in isas_checked(&format!("{kind:?} integer [{rows}x{inp}x{out}]")) {
                let mut y = vec![f32::NAN; 5];
                p.product(isa, &x, rows, &mut y);
                let at = format!("{isa:?} {kind:?} [{rows}x{inp}x{out}]");
                let (d, i) = rel_diff_f64(&y, &c);
                assert!(
                    d < INT_TOL_EXACT,
                    "{at} vs exact, cell {i}: {} vs {} (rel {d})",
                    y[i],
                    c[i]
                );
                let (d, i) = rel_diff(&y, &e);
                assert!(
                    d < INT_TOL_DEQ,
                    "{at} vs f32, cell {i}: {} vs {} (rel {d})",
                    y[i],
                    e[i]
                );
            }
        }
    }

    #[test]
    fn integer_products_match_the_exact_product() {
        // out not a multiple of a panel and a multiple; every tile height
        // of the VNNI tiles (5 and 6 rows alone, 7 as 4 + 3).
        for rows in [1, 3, 5, 6, 7, 8, 33, 128] {
            check_int(rows, 512, 61);
            check_int(rows, 256, 48);
        }
    }

    #[test]
    fn iq4_xs_products_at_the_extremes_do_not_overflow() {
        // Every index 0 (−127) or 15 (113), scales at both ends (ls 0 and
        // 63: −32 and 31), activations whose quants are all ±127: each
        // pair of products is 2 × 127 × 127, the most an int16 sum holds.
        let (rows, inp, out) = (2, 512, 32);
        let bb = KQuant::Iq4Xs.block_bytes();
        let mut blocks = vec![0u8; out * inp / QK_K * bb];
        for (i, blk) in blocks.chunks_exact_mut(bb).enumerate() {
            blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            let (scales, q) = if i % 2 == 0 {
                (0x00, 0x00)
            } else {
                (0xFF, 0xFF)
            };
            blk[2..8].fill(scales);
            blk[8..].fill(if i % 4 < 2 { q } else { 0x00 });
        }
        let mut deq = vec![0f32; out * inp];
        crate::iq4::dequantize_xs(&blocks, &mut deq);
        let p = PackedKQuant::from_blocks(KQuant::Iq4Xs, &blocks, out, inp).unwrap();
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| if i < inp { -1.0 } else { 2.0 })
            .collect();
        let c = product_f64(&q8k_operand(&x, rows, inp), &deq, rows, inp, out);
        for isa in isas_checked("IQ4_XS extremes") {
            let mut y = Vec::new();
            p.product(isa, &x, rows, &mut y);
            let (d, i) = rel_diff_f64(&y, &c);
            assert!(
                d < INT_TOL_EXACT,
                "{isa:?} cell {i}: {} vs {} (rel {d})",
                y[i],
                c[i]
            );
        }
    }

    #[test]
    fn integer_products_match_the_exact_product_in_parallel() {
        check_int(1, 1024, 1100);
        check_int(8, 512, 300);
        check_int(128, 256, 80);
    }
}
