//! Rows of f32 activations quantized to Q8_0 for the integer Q8_0 products.
//!
//! Each 32-element block of a row becomes 32 int8 and one scale, exactly as
//! candle's (and llama.cpp's reference) `quantize_row_q8_0` does it:
//! `d = amax / 127`, `q = round(x · (1 / d))` (halves away from zero), and
//! the scale kept as the f16 `d` rounds to, so the integer product sees the
//! same operands as candle's `QMatMul`. One difference on purpose: a block
//! holding a NaN or an infinity gets a NaN scale, so the outputs it feeds are
//! NaN (as with f32 activations) instead of silently using zeros.

use half::f16;
use rayon::prelude::*;

use crate::isa::{Isa, IsaKind};

/// Elements per block (one scale each), as in Q8_0 weights.
pub(crate) const BLOCK: usize = 32;

/// Below this many elements one thread quantizes all rows.
const PARALLEL_MIN_ELEMS: usize = 1 << 16;

/// Quantized rows: `[rows][inp]` int8 in `[-127, 127]` and `[rows][inp / 32]`
/// scales. Kept across products so a step allocates nothing once it has
/// seen its largest batch.
#[derive(Default)]
pub(crate) struct Q8Rows {
    /// The int8 values, row-major.
    pub(crate) qs: Vec<i8>,
    /// Each block's scale (f16-rounded, as f32).
    pub(crate) d: Vec<f32>,
}

impl Q8Rows {
    /// Quantizes `x` (`[rows][inp]`, `inp` a multiple of 32) into `self`,
    /// with the instructions of `isa`.
    pub(crate) fn quantize(&mut self, isa: Isa, x: &[f32], inp: usize) {
        debug_assert!(inp.is_multiple_of(BLOCK) && x.len().is_multiple_of(inp.max(1)));
        let nb = x.len() / BLOCK;
        self.qs.resize(x.len(), 0);
        self.d.resize(nb, 0.0);
        let run = |(x, (q, d)): (&[f32], (&mut [i8], &mut f32))| {
            *d = quantize_block(isa, x.try_into().expect("32"), q.try_into().expect("32"));
        };
        let blocks = x
            .chunks_exact(BLOCK)
            .zip(self.qs.chunks_exact_mut(BLOCK).zip(self.d.iter_mut()));
        if x.len() < PARALLEL_MIN_ELEMS {
            blocks.for_each(run);
        } else {
            // A prefill chunk: a few percent of the product on one thread.
            x.par_chunks_exact(BLOCK)
                .zip(
                    self.qs
                        .par_chunks_exact_mut(BLOCK)
                        .zip(self.d.par_iter_mut()),
                )
                .with_min_len(256)
                .for_each(run);
        }
    }
}

/// Quantizes one block into `q`; returns its scale.
// The AVX2 call is wrapped in `unsafe`, which the portable one does not need.
#[allow(unused_unsafe)]
fn quantize_block(isa: Isa, x: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> f32 {
    match isa.kind() {
        // SAFETY: holding an `Isa` of kind AVX2 or AVX-512 means the CPU
        // runs AVX2 (see `isa.rs`; every AVX-512 CPU has AVX2).
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 | IsaKind::Avx512 => unsafe { quantize_block_avx2(x, q) },
        _ => quantize_block_portable(x, q),
    }
}

/// The scale of a block whose largest magnitude is `amax` (NaN if the block
/// holds a NaN or an infinity), and the multiplier that quantizes it.
fn scale(amax: f32, finite: bool) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let d = if finite {
        f16::from_f32(d).to_f32()
    } else {
        f32::NAN
    };
    (d, id)
}

/// The scalar reference: candle's `BlockQ8_0::from_float`, plus the NaN
/// scale for non-finite blocks and a clamp at -127 (never reached from a
/// finite block; the integer kernel needs it, see `packed_q8`).
pub(crate) fn quantize_block_portable(x: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let finite = x.iter().all(|v| v.is_finite());
    let (d, id) = scale(amax, finite);
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = ((v * id).round() as i8).max(-127);
    }
    d
}

/// [`quantize_block_portable`] with AVX2: the same multiply, and rounding
/// halves away from zero as `trunc(v + copysign(0.5 - 2⁻²⁵, v))` (exact for
/// every f32: the addend just below ½ cannot carry a value below a half up).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn quantize_block_avx2(x: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> f32 {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    // SAFETY: four 8-float loads inside the 32-float block.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    let a = v.map(|v| _mm256_andnot_ps(sign, v));
    let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
    // Not-less-than infinity, or unordered: an infinity or a NaN.
    let inf = _mm256_set1_ps(f32::INFINITY);
    let bad = a.iter().fold(0, |b, &a| {
        b | _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ))
    });
    let (d, id) = scale(amax, bad == 0);
    let (id, half) = (
        _mm256_set1_ps(id),
        _mm256_set1_ps(f32::from_bits(0x3eff_ffff)),
    );
    let i = v.map(|v| {
        let s = _mm256_mul_ps(v, id);
        _mm256_cvttps_epi32(_mm256_add_ps(s, _mm256_or_ps(_mm256_and_ps(s, sign), half)))
    });
    // Packing interleaves 4-element groups across the 128-bit halves.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]),
        _mm256_packs_epi32(i[2], i[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let p = _mm256_max_epi8(p, _mm256_set1_epi8(-127));
    // SAFETY: one 32-byte store into the 32-byte block.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), p) };
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// Blocks that exercise the rounding: ties at every half, zeros, an
    /// all-zero block, one huge element, negative-only, tiny values.
    fn blocks() -> Vec<[f32; BLOCK]> {
        let mut out = Vec::new();
        // amax 127 makes d = 1 and id = 1: x·id is x, so halves are ties.
        let mut ties = [0f32; BLOCK];
        for (i, t) in ties.iter_mut().enumerate() {
            *t = (i as f32 - 16.0) + 0.5;
        }
        ties[0] = 127.0;
        ties[1] = -0.5;
        ties[2] = 0.5;
        ties[3] = 0.0;
        ties[4] = -0.0;
        ties[5] = f32::from_bits(0x3eff_ffff); // just below a half
        ties[6] = 126.5;
        ties[7] = -126.5;
        out.push(ties);
        out.push([0.0; BLOCK]);
        let mut one = [0f32; BLOCK];
        one[17] = -3.0e4;
        one[3] = 1.0;
        out.push(one);
        out.push(std::array::from_fn(|i| -(i as f32) * 0.37 - 0.01));
        out.push(std::array::from_fn(|i| (i as f32 - 15.5) * 1e-30));
        for seed in 0..200u64 {
            out.push(std::array::from_fn(|i| {
                let h = (i as u64 * 2654435761 + seed * 40503) % 100003;
                (h as f32 / 100003.0 - 0.5) * (1.0 + seed as f32)
            }));
        }
        out
    }

    #[test]
    fn portable_is_candles_quantizer() {
        // candle's `BlockQ8_0::from_float` on the same values: the same
        // int8 and the same f16 scale, block by block.
        let bs = blocks();
        let flat: Vec<f32> = bs.iter().flatten().copied().collect();
        let t = Tensor::from_vec(flat.clone(), flat.len(), &Device::Cpu).unwrap();
        let c = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
        let c = c.data().unwrap();
        for (i, b) in bs.iter().enumerate() {
            let mut q = [0i8; BLOCK];
            let d = quantize_block_portable(b, &mut q);
            let cb = &c[i * 34..(i + 1) * 34];
            assert_eq!(d, f16::from_le_bytes([cb[0], cb[1]]).to_f32(), "block {i}");
            let cq: Vec<i8> = cb[2..].iter().map(|&v| v as i8).collect();
            assert_eq!(q.as_slice(), cq.as_slice(), "block {i}");
        }
    }

    #[test]
    fn ties_round_away_from_zero() {
        let bs = blocks();
        let mut q = [0i8; BLOCK];
        assert_eq!(quantize_block_portable(&bs[0], &mut q), 1.0);
        assert_eq!(&q[..8], &[127, -1, 1, 0, 0, 0, 127, -127]);
        // (i - 16) + 0.5 for i = 8..: -7.5 → -8, …, -0.5 → -1, 0.5 → 1, …
        for (i, &v) in q.iter().enumerate().skip(8) {
            let e = i as i32 - 16;
            assert_eq!(v as i32, if e < 0 { e } else { e + 1 }, "{i}");
        }
        assert_eq!(quantize_block_portable(&bs[1], &mut q), 0.0);
        assert_eq!(q, [0; BLOCK]);
    }

    #[test]
    fn every_isa_matches_the_reference() {
        for isa in crate::kernel_reference::isas_checked(module_path!()) {
            for (i, b) in blocks().iter().enumerate() {
                let (mut q, mut r) = ([0i8; BLOCK], [0i8; BLOCK]);
                let d = quantize_block(isa, b, &mut q);
                assert_eq!(d, quantize_block_portable(b, &mut r), "{isa:?} block {i}");
                assert_eq!(q, r, "{isa:?} block {i}");
            }
        }
    }

    #[test]
    fn rows_are_quantized_block_by_block_serial_and_parallel() {
        for isa in crate::kernel_reference::isas_checked(module_path!()) {
            for rows in [1, 3, 600] {
                let inp = 128;
                let x: Vec<f32> = (0..rows * inp)
                    .map(|i| ((i * 7919) % 1009) as f32 * 0.01 - 5.0)
                    .collect();
                let mut s = Q8Rows::default();
                s.quantize(isa, &x, inp);
                assert_eq!((s.qs.len(), s.d.len()), (rows * inp, rows * inp / BLOCK));
                for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
                    let mut r = [0i8; BLOCK];
                    let d = quantize_block_portable(xb.try_into().unwrap(), &mut r);
                    assert_eq!(s.d[b], d, "{isa:?} {rows} rows, block {b}");
                    assert_eq!(&s.qs[b * BLOCK..][..BLOCK], &r, "{isa:?} block {b}");
                }
            }
        }
    }

    #[test]
    fn non_finite_blocks_get_a_nan_scale() {
        for isa in crate::kernel_reference::isas_checked(module_path!()) {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut b = [1f32; BLOCK];
                b[9] = bad;
                let mut q = [0i8; BLOCK];
                assert!(quantize_block(isa, &b, &mut q).is_nan(), "{isa:?} {bad}");
            }
        }
    }
}
