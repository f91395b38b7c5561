//! The dense AVX-512 kernel: the register tile.

use super::dense::{Elem, Tile, Widen};
use super::tiling::{LANES, TileSums};

/// Loads 16 weights as f32 (bf16: widened by shifting into the high half;
/// f16: `vcvtph2ps`, part of AVX-512F).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16<E: Elem>(p: *const E) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller passes 16 readable elements.
    unsafe {
        match E::WIDEN {
            Widen::Bf16 => {
                let h = _mm256_loadu_si256(p.cast::<__m256i>());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
            Widen::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>())),
            Widen::None => _mm512_loadu_ps(p.cast::<f32>()),
        }
    }
}

/// The tile's product with AVX-512: `MR × NV` accumulators in registers.
#[target_feature(enable = "avx512f")]
pub(super) fn tile_avx512<const MR: usize, const NV: usize, E: Elem>(
    t: &Tile<'_>,
    w: &[E],
) -> TileSums<MR, NV> {
    use std::arch::x86_64::*;
    let np = t.checked_panels::<MR, NV>();
    let panel_len = t.inp * LANES;
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    let (w, x) = (w.as_ptr(), t.x.as_ptr());
    for k in 0..t.inp {
        let mut wv = [_mm512_setzero_ps(); NV];
        for (p, v) in wv.iter_mut().enumerate().take(np) {
            // SAFETY: p < np and k < inp, so the 16 weights lie inside `w`
            // (checked above).
            *v = unsafe { load16(w.add(p * panel_len + k * LANES)) };
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: r < MR and k < inp: inside `t.x` (checked above).
            let xv = _mm512_set1_ps(unsafe { *x.add(r * t.inp + k) });
            for (a, &v) in acc_r.iter_mut().zip(&wv) {
                *a = _mm512_fmadd_ps(v, xv, *a);
            }
        }
    }
    let mut res = [[[0f32; LANES]; NV]; MR];
    for (dst_r, acc_r) in res.iter_mut().zip(&acc) {
        for (dst, a) in dst_r.iter_mut().zip(acc_r) {
            // SAFETY: `dst` is LANES (16) floats.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), *a) };
        }
    }
    res
}
