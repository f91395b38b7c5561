//! Activations quantized to Q8_K for the K-quant integer products.
//!
//! As llama.cpp's `quantize_row_q8_K` (the reference its x86 CPU backend
//! calls): per block of 256 values of a row, `max` is the value of largest
//! magnitude (the first one on ties), `iscale = −127 / max`, each value
//! becomes `nearest_int(iscale·x)` as int8, the scale kept is
//! `d = 1 / iscale` (negative when `max` is positive: `x ≈ d·q`), and
//! `bsums` holds the sum of each 16 consecutive int8 values (the K-quant
//! products use them for the mins and Q6_K's `−32`). A block of zeros has
//! `d = 0` and zero quants. The same operations in the same order, so the
//! quants and scales are bit-identical to llama.cpp's.
//!
//! `nearest_int` rounds halves to even, as do llama.cpp's AVX2 quantizer of
//! 4 rows (`_MM_ROUND_NEAREST`, before its repacked Q4_K products); candle's
//! `BlockQ8K::from_float` rounds them away from zero. Matching llama.cpp
//! matters beyond the rare halves themselves: a product's outputs feed the
//! next product's rounding, so one activation rounded the other way can move
//! the logits by about as much as the 8-bit rounding does (see
//! docs/results/cpu-executor.md, "Q4_K_M logits against llama.cpp").

use std::cell::Cell;

use rayon::prelude::*;

use crate::isa::{Isa, IsaKind};

/// Values per Q8_K block.
pub(crate) const QK_K: usize = 256;

/// Values per `bsums` entry.
pub(crate) const BSUM: usize = 16;

/// Below this many elements one thread quantizes all rows.
const PARALLEL_MIN_ELEMS: usize = 1 << 16;

/// A `[rows][inp]` matrix quantized to Q8_K, with buffers reused across
/// products.
#[derive(Default)]
pub(crate) struct Q8K {
    /// `[rows][inp]` int8 quants.
    pub(crate) qs: Vec<i8>,
    /// `[rows][inp / 256]` block scales.
    pub(crate) d: Vec<f32>,
    /// `[rows][inp / 16]` sums of each 16 quants.
    pub(crate) bsums: Vec<i16>,
}

thread_local! {
    // One scratch per thread, taken while in use: a product that runs
    // another product on the same thread (rayon work stealing) finds it
    // empty and allocates instead of aliasing it.
    static SCRATCH: Cell<Q8K> = Cell::new(Q8K::default());
}

impl Q8K {
    /// Runs `f` with `x` (`[rows][inp]`, `inp` a multiple of 256)
    /// quantized in this thread's scratch (no allocation once it has grown
    /// to the largest product).
    pub(crate) fn with<R>(x: &[f32], rows: usize, inp: usize, f: impl FnOnce(&Q8K) -> R) -> R {
        let mut q = SCRATCH.take();
        q.quantize(Isa::detect(), x, rows, inp);
        let r = f(&q);
        SCRATCH.set(q);
        r
    }

    /// Quantizes `x`, `[rows][inp]`, into these buffers with the code for
    /// `isa` (the same values from each).
    pub(crate) fn quantize(&mut self, isa: Isa, x: &[f32], rows: usize, inp: usize) {
        assert!(
            inp.is_multiple_of(QK_K) && x.len() == rows * inp,
            "Q8_K input [{rows}][{inp}] of {} values",
            x.len()
        );
        self.qs.resize(rows * inp, 0);
        self.d.resize(rows * inp / QK_K, 0.0);
        self.bsums.resize(rows * inp / BSUM, 0);
        // One block: its values, quants, 16-sums and scale.
        #[allow(clippy::type_complexity)]
        let run = |((x, q), (s, d)): ((&[f32], &mut [i8]), (&mut [i16], &mut f32))| {
            *d = match isa.kind() {
                // SAFETY: an `Isa` is only made for a CPU that runs it.
                #[cfg(target_arch = "x86_64")]
                IsaKind::Avx2 | IsaKind::Avx512 => unsafe { quantize_block_avx2(x, q, s) },
                _ => quantize_block(x, q, s),
            };
        };
        if x.len() < PARALLEL_MIN_ELEMS {
            x.chunks_exact(QK_K)
                .zip(self.qs.chunks_exact_mut(QK_K))
                .zip(
                    self.bsums
                        .chunks_exact_mut(QK_K / BSUM)
                        .zip(self.d.iter_mut()),
                )
                .for_each(run);
        } else {
            // A prefill chunk: each block is independent (the same bits
            // from any thread), and on one thread it was a few percent of
            // a 2-thread product.
            x.par_chunks_exact(QK_K)
                .zip(self.qs.par_chunks_exact_mut(QK_K))
                .zip(
                    self.bsums
                        .par_chunks_exact_mut(QK_K / BSUM)
                        .zip(self.d.par_iter_mut()),
                )
                .with_min_len(32)
                .for_each(run);
        }
    }
}

/// `v` rounded to the nearest integer, halves to even: llama.cpp's
/// `nearest_int`, for |v| < 2²² (the quants are within ±128). Adding
/// 1.5·2²³ leaves no fraction bits in the f32 sum, so the addition itself
/// rounds (to nearest, ties to even) and the low mantissa bits hold the
/// result; `f32::round_ties_even` would be a libm call on baseline x86-64.
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let sum = v + 12_582_912.0;
    (sum.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// Quantizes one block of 256 values into `q` and `bsums`; returns `d`.
fn quantize_block(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    let iscale = -127f32 / max;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).clamp(-128, 127) as i8;
    }
    for (s, q) in bsums.iter_mut().zip(q.chunks_exact(BSUM)) {
        *s = q.iter().map(|&v| i16::from(v)).sum();
    }
    1.0 / iscale
}

/// [`quantize_block`] with AVX2: the same multiply, the same rounding (to
/// nearest, halves to even), the same clamp, so the same quants.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn quantize_block_avx2(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    use std::arch::x86_64::*;
    assert!(x.len() == QK_K && q.len() == QK_K && bsums.len() == QK_K / BSUM);
    let (xp, qp) = (x.as_ptr(), q.as_mut_ptr());
    let abs = _mm256_set1_ps(f32::from_bits(0x7FFF_FFFF));
    let mut m = _mm256_setzero_ps();
    for i in (0..QK_K).step_by(8) {
        // SAFETY: i + 8 ≤ 256 = x.len().
        m = _mm256_max_ps(m, _mm256_and_ps(abs, unsafe { _mm256_loadu_ps(xp.add(i)) }));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let amax = lanes.iter().fold(0f32, |a, &v| a.max(v));
    if amax == 0.0 {
        q.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    // The first value of that magnitude, as the scalar loop finds it.
    let max = *x
        .iter()
        .find(|v| v.abs() == amax)
        .expect("amax is one of them");
    let iscale = -127f32 / max;
    let vs = _mm256_set1_ps(iscale);
    let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for i in (0..QK_K).step_by(32) {
        let mut v = [_mm256_setzero_si256(); 4];
        for (j, v) in v.iter_mut().enumerate() {
            // SAFETY: i + 8j + 8 ≤ 256.
            let s = _mm256_mul_ps(vs, unsafe { _mm256_loadu_ps(xp.add(i + 8 * j)) });
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(s);
            *v = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
        }
        // Packing works per 128-bit lane: the permute puts the 32 bytes
        // back in order.
        let w = _mm256_packs_epi16(
            _mm256_packs_epi32(v[0], v[1]),
            _mm256_packs_epi32(v[2], v[3]),
        );
        let w = _mm256_permutevar8x32_epi32(w, order);
        // SAFETY: i + 32 ≤ 256 = q.len().
        unsafe { _mm256_storeu_si256(qp.add(i).cast(), w) };
    }
    for (s, q) in bsums.iter_mut().zip(q.chunks_exact(BSUM)) {
        *s = q.iter().map(|&v| i16::from(v)).sum();
    }
    1.0 / iscale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quantizer written out from llama.cpp's reference
    /// (`quantize_row_q8_K_ref`), with `f32::round_ties_even` for its
    /// `nearest_int`.
    fn reference(x: &[f32]) -> (Vec<i8>, Vec<f32>, Vec<i16>) {
        let (mut qs, mut ds, mut bs) = (Vec::new(), Vec::new(), Vec::new());
        for b in x.chunks(QK_K) {
            let mut max = 0f32;
            for &v in b {
                if v.abs() > max.abs() {
                    max = v;
                }
            }
            if max == 0.0 {
                qs.extend([0i8; QK_K]);
                bs.extend([0i16; QK_K / BSUM]);
                ds.push(0.0);
                continue;
            }
            let iscale = -127f32 / max;
            let q: Vec<i8> = b
                .iter()
                .map(|&v| (iscale * v).round_ties_even().min(127.0) as i8)
                .collect();
            for c in q.chunks(BSUM) {
                bs.push(c.iter().map(|&v| v as i16).sum());
            }
            qs.extend(q);
            ds.push(1.0 / iscale);
        }
        (qs, ds, bs)
    }

    fn check(x: &[f32], rows: usize, inp: usize) {
        let (qs, d, bs) = reference(x);
        for isa in crate::kernel_reference::isas_checked(module_path!()) {
            let mut q = Q8K::default();
            q.quantize(isa, x, rows, inp);
            assert_eq!(q.qs, qs, "{isa:?} quants");
            assert_eq!(q.d, d, "{isa:?} scales");
            assert_eq!(q.bsums, bs, "{isa:?} bsums");
        }
    }

    #[test]
    fn matches_the_reference_quantizer() {
        // Magnitudes and signs varying per block, exact halves (0.5·k/127
        // multiples of the max), a block of zeros and a negative max.
        let (rows, inp) = (3, 768);
        let mut x: Vec<f32> = (0..rows * inp)
            .map(|i| {
                let h = (i * 2654435761) % 10007;
                (h as f32 / 10007.0 - 0.45) * (1 + i / QK_K % 5) as f32
            })
            .collect();
        x[QK_K..2 * QK_K].fill(0.0);
        x[2 * QK_K + 7] = -9.0;
        for (j, v) in x[3 * QK_K..4 * QK_K].iter_mut().enumerate() {
            *v = (j as f32 - 128.0) * 0.5;
        }
        check(&x, rows, inp);
        // Ties of magnitude: the first one sets the sign of the scale.
        let mut t = vec![0.25f32; QK_K];
        t[3] = -2.0;
        t[9] = 2.0;
        check(&t, 1, QK_K);
        // A prefill chunk, quantized across threads: the same bits.
        let (rows, inp) = (128, 768);
        assert!(rows * inp >= PARALLEL_MIN_ELEMS);
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 2654435761) % 10007) as f32 / 10007.0 - 0.5 + (i / QK_K % 7) as f32)
            .collect();
        check(&x, rows, inp);
    }

    #[test]
    fn nearest_int_rounds_halves_to_even() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.5, -2),
            (0.50000006, 1),
            (0.49999997, 0),
            (-0.49999997, 0),
            (126.5, 126),
            (-127.0, -127),
            (0.0, 0),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
            assert_eq!(v.round_ties_even() as i32, want, "{v}");
        }
    }

    #[test]
    fn halves_round_to_even_as_llama_cpp() {
        // `max` = −127 makes `iscale` 1, so these values are the scaled
        // ones: exact halves, where candle's quantizer (halves away from
        // zero) gives 1, 3, −1, −3, 127 and llama.cpp's 0, 2, 0, −2, 126.
        let mut x = vec![0f32; QK_K];
        x[..6].copy_from_slice(&[-127.0, 0.5, 2.5, -0.5, -2.5, 126.5]);
        for isa in crate::kernel_reference::isas_checked(module_path!()) {
            let mut q = Q8K::default();
            q.quantize(isa, &x, 1, QK_K);
            assert_eq!(q.qs[..6], [-127, 0, 2, 0, -2, 126], "{isa:?}");
            assert_eq!(q.d, [1.0], "{isa:?}");
            assert_eq!(q.bsums[0], -1, "{isa:?}");
        }
    }

    #[test]
    fn scratch_is_reused() {
        let x = vec![1.0f32; 2 * QK_K];
        let p1 = Q8K::with(&x, 2, QK_K, |q| q.qs.as_ptr());
        let p2 = Q8K::with(&x[..QK_K], 1, QK_K, |q| {
            assert_eq!((q.qs.len(), q.d.len(), q.bsums.len()), (QK_K, 1, 16));
            assert_eq!(q.bsums[0], -127 * 16);
            q.qs.as_ptr()
        });
        assert_eq!(p1, p2, "no new buffer for a smaller product");
    }
}
