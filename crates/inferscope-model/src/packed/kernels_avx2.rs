//! The dense AVX2 (with FMA and F16C) kernels: the register tile, the
//! one-row kernel of decode steps, and the blocked path's block kernel.

use super::dense::{Elem, Tile, Widen};
use super::tiling::{LANES, TileSums};

/// Loads 8 weights as f32 (bf16: widened by shifting into the high half;
/// f16: converted by F16C, which [`IsaKind::Avx2`] includes).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<E: Elem>(p: *const E) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the caller passes 8 readable elements.
    unsafe {
        match E::WIDEN {
            Widen::Bf16 => {
                let h = _mm_loadu_si128(p.cast::<__m128i>());
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
            Widen::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())),
            Widen::None => _mm256_loadu_ps(p.cast::<f32>()),
        }
    }
}

/// The tile's product with AVX2/FMA: `MR × 2·NV` accumulators in registers.
/// A missing last panel is computed from zeros and not stored.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn tile_avx2<const MR: usize, const NV: usize, E: Elem>(
    t: &Tile<'_>,
    w: &[E],
) -> TileSums<MR, NV> {
    use std::arch::x86_64::*;
    let np = t.checked_panels::<MR, NV>();
    let panel_len = t.inp * LANES;
    let mut acc = [[[_mm256_setzero_ps(); 2]; NV]; MR];
    let (w, x) = (w.as_ptr(), t.x.as_ptr());
    for k in 0..t.inp {
        let mut wv = [[_mm256_setzero_ps(); 2]; NV];
        for (p, v) in wv.iter_mut().enumerate().take(np) {
            // SAFETY: p < np and k < inp, so the 16 weights lie inside `w`
            // (checked above).
            unsafe {
                let at = w.add(p * panel_len + k * LANES);
                *v = [load8(at), load8(at.add(8))];
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
    crate::packed::tiling::tile_sums_avx2(&acc)
}

/// Bytes ahead of each panel stream that the one-row kernel prefetches
/// into L2 for 16-bit weights: their converts make 4× the instructions per
/// byte of f32's, so the out-of-order window alone keeps fewer lines in
/// flight (f32 needs no prefetch).
const ROW_PREFETCH_BYTES: usize = 256;

/// One row of `x` (`inp` long) against `NV` panels of `w` of which `np`
/// are present (the missing ones are computed from the last one and not
/// stored): the 1-row tile of [`tile_avx2`], unrolled by 4 steps, with
/// 16-bit weights prefetched [`ROW_PREFETCH_BYTES`] ahead.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_avx2<const NV: usize, E: Elem>(
    x: &[f32],
    w: &[E],
    inp: usize,
    np: usize,
) -> [[f32; LANES]; NV] {
    use std::arch::x86_64::*;
    assert!((1..=NV).contains(&np) && x.len() >= inp && w.len() >= np * inp * LANES);
    let panel_len = inp * LANES;
    let base: [*const E; NV] = std::array::from_fn(|p| w[p.min(np - 1) * panel_len..].as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; NV];
    let xp = x.as_ptr();
    let size = std::mem::size_of::<E>();
    // Lines one panel's 4 steps span (2 for 16-bit weights).
    let lines = (4 * LANES * size).div_ceil(64);
    macro_rules! step {
        ($k:expr) => {{
            let k = $k;
            // SAFETY: k < inp: inside `x` (checked above).
            let xv = unsafe { _mm256_broadcast_ss(&*xp.add(k)) };
            for (a, b) in acc.iter_mut().zip(&base) {
                // SAFETY: k < inp: the 16 weights lie inside the panel.
                unsafe {
                    let at = b.add(k * LANES);
                    a[0] = _mm256_fmadd_ps(load8(at), xv, a[0]);
                    a[1] = _mm256_fmadd_ps(load8(at.add(8)), xv, a[1]);
                }
            }
        }};
    }
    for k in (0..inp / 4).map(|j| j * 4) {
        if size == 2 {
            for b in &base {
                let at = b.wrapping_add(k * LANES).cast::<u8>();
                for l in 0..lines {
                    // Past the panel's end it fetches the next panel's
                    // start, or nothing: a prefetch never faults.
                    _mm_prefetch::<_MM_HINT_T1>(
                        at.wrapping_add(ROW_PREFETCH_BYTES + l * 64).cast(),
                    );
                }
            }
        }
        step!(k);
        step!(k + 1);
        step!(k + 2);
        step!(k + 3);
    }
    for k in inp / 4 * 4..inp {
        step!(k);
    }
    let mut res = [[0f32; LANES]; NV];
    for (dst, a) in res.iter_mut().zip(&acc) {
        // SAFETY: `dst` is LANES (16) floats: two 8-float stores.
        unsafe {
            _mm256_storeu_ps(dst.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(dst.as_mut_ptr().add(8), a[1]);
        }
    }
    res
}

/// `src` widened to f32 into `dst` (resized to fit); returns it.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn widen_avx2<'a, E: Elem>(src: &[E], dst: &'a mut Vec<f32>) -> &'a [f32] {
    dst.resize(src.len(), 0.0);
    let chunks = src.len() / 8;
    for i in 0..chunks {
        // SAFETY: 8 elements from 8·i are inside both slices.
        unsafe {
            let v = load8(src.as_ptr().add(i * 8));
            std::arch::x86_64::_mm256_storeu_ps(dst.as_mut_ptr().add(i * 8), v);
        }
    }
    for i in chunks * 8..src.len() {
        dst[i] = src[i].widen();
    }
    &dst[..src.len()]
}

/// Runs [`block_avx2`] for a tile of `mr` (1 to [`MAX_MR`](super::tiling::MAX_MR)) rows.
///
/// # Safety
/// As [`block_avx2`]'s.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn block_tile_avx2<E: Elem>(
    mr: usize,
    xt: &[f32],
    w: &[E],
    kc: usize,
    acc: &mut [[f32; LANES]],
    first: bool,
    pf: (*const u8, usize),
    dst: (*mut f32, usize),
) {
    // SAFETY: the caller's.
    unsafe {
        match mr {
            1 => block_avx2::<1, E>(xt, w, kc, acc, first, pf, dst),
            2 => block_avx2::<2, E>(xt, w, kc, acc, first, pf, dst),
            3 => block_avx2::<3, E>(xt, w, kc, acc, first, pf, dst),
            4 => block_avx2::<4, E>(xt, w, kc, acc, first, pf, dst),
            5 => block_avx2::<5, E>(xt, w, kc, acc, first, pf, dst),
            6 => block_avx2::<6, E>(xt, w, kc, acc, first, pf, dst),
            _ => unreachable!("no {mr}-row block kernel"),
        }
    }
}

/// One `kc`-long block of an `MR`-row tile against one panel: `acc` (the
/// tile's rows × LANES columns) starts from zero when `first`, else from
/// what the blocks before left, and receives the sums. `xt` is the tile's
/// packed `x` for the block, `[kc][MR]`; `w` the panel's, `[kc][LANES]`
/// (f32, or 16-bit widened as loaded).
/// The sums go to `dst` (pointer, row stride in floats) when it is not
/// null, else to `acc`. Every 4 steps it prefetches one line of `pf`
/// (address, bytes) into L2. The loop is unrolled by 4: the 2·MR
/// accumulators, the two weight vectors and the broadcast stay in registers.
///
/// # Safety
/// The CPU has AVX2 and FMA; a non-null `dst` is valid for writes of
/// LANES floats at each of `dst + r·stride`, r < MR, that nothing else
/// accesses meanwhile.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2<const MR: usize, E: Elem>(
    xt: &[f32],
    w: &[E],
    kc: usize,
    acc: &mut [[f32; LANES]],
    first: bool,
    (pf, pf_bytes): (*const u8, usize),
    (dst, stride): (*mut f32, usize),
) {
    use std::arch::x86_64::*;
    assert!(xt.len() >= kc * MR && w.len() >= kc * LANES && acc.len() >= MR);
    let mut a = [[_mm256_setzero_ps(); 2]; MR];
    if !first {
        for (v, row) in a.iter_mut().zip(acc.iter()) {
            // SAFETY: `row` is LANES (16) floats.
            unsafe {
                *v = [
                    _mm256_loadu_ps(row.as_ptr()),
                    _mm256_loadu_ps(row.as_ptr().add(8)),
                ];
            }
        }
    }
    let (mut x, mut w) = (xt.as_ptr(), w.as_ptr());
    // One step k: the panel's 16 weights times each row's x[k].
    macro_rules! step {
        ($s:literal) => {{
            let w0 = load8(w.add($s * LANES));
            let w1 = load8(w.add($s * LANES + 8));
            for (r, v) in a.iter_mut().enumerate() {
                let xv = _mm256_broadcast_ss(&*x.add($s * MR + r));
                v[0] = _mm256_fmadd_ps(w0, xv, v[0]);
                v[1] = _mm256_fmadd_ps(w1, xv, v[1]);
            }
        }};
    }
    let lines = pf_bytes.div_ceil(64);
    for j in 0..kc / 4 {
        // SAFETY: steps 4j..4j+4 < kc: MR floats of x and LANES of w each
        // (checked above); a prefetch reads nothing.
        unsafe {
            if j < lines {
                _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(j * 64).cast());
            }
            step!(0);
            step!(1);
            step!(2);
            step!(3);
            x = x.add(4 * MR);
            w = w.add(4 * LANES);
        }
    }
    for _ in 0..kc % 4 {
        // SAFETY: as above, one step.
        unsafe {
            step!(0);
            x = x.add(MR);
            w = w.add(LANES);
        }
    }
    let (dst, stride) = if dst.is_null() {
        (acc.as_mut_ptr().cast::<f32>(), LANES)
    } else {
        (dst, stride)
    };
    for (r, v) in a.iter().enumerate() {
        // SAFETY: `acc` holds MR rows of LANES floats (checked above); a
        // non-null `dst` is the caller's promise.
        unsafe {
            _mm256_storeu_ps(dst.add(r * stride), v[0]);
            _mm256_storeu_ps(dst.add(r * stride + 8), v[1]);
        }
    }
}
