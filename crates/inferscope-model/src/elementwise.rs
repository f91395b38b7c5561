//! Element-wise math over slices, written so that the compiler vectorises
//! it (libm's `expf` is a call per value), with AVX2/FMA builds chosen at
//! run time.

use rayon::prelude::*;

use crate::config::Activation;

#[cfg(target_arch = "x86_64")]
use crate::isa::{Isa, IsaKind};

/// Elements of a SwiGLU (rows × intermediate size) from which its rows are
/// split across the pool: a 128-token prefill's 256 Ki elements took ~0.5 ms
/// per layer on one thread (reading the gate/up product from the other
/// core's cache), a decode step's 2 Ki are far below a parallel section's
/// cost.
const SWIGLU_PARALLEL_MIN: usize = 1 << 16;

/// `x ← eˣ` for every element, with a polynomial the compiler vectorises
/// (Cephes' `expf`: relative error ~2e-7), where libm's is a call per value.
#[inline(always)]
pub(crate) fn exp_in_place(xs: &mut [f32]) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that `n · ln 2` is exact in the first part.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 · 2²³ rounds to an integer, which then sits in the low
    // mantissa bits: a rounding and a conversion without the NaN and
    // saturation handling of `round()` and `as i32`, which do not vectorise.
    const MAGIC: f32 = 12_582_912.0;
    // Below LO the result is under f32's normal range (0 is close); above
    // HI it overflows.
    const LO: f32 = -87.3;
    const HI: f32 = 88.3;
    for x in xs.iter_mut() {
        let v = x.clamp(LO, HI);
        let t = v * LOG2E + MAGIC;
        let n = t - MAGIC;
        let r = v - n * LN2_HI - n * LN2_LO;
        let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
            * r
            + 1.666_666_5e-1)
            * r
            + 0.5;
        let e = p * r * r + r + 1.0;
        // 2ⁿ from its exponent bits: n is in -126..=127 after the clamp.
        let k = t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127);
        let scale = f32::from_bits(k << 23);
        *x = if *x < LO { 0.0 } else { e * scale };
    }
}

/// RMSNorm of every row of `x` (`[rows][w.len()]`) in place (the per-head
/// q/k norms of Qwen3 and Gemma 3).
pub(crate) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    #[cfg(target_arch = "x86_64")]
    if Isa::get(IsaKind::Avx2).is_some() {
        // SAFETY: the CPU supports the features the function is compiled for.
        unsafe { rms_norm_in_place_avx2(x, w, eps) };
        return;
    }
    rms_norm_in_place_generic(x, w, eps);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rms_norm_in_place_avx2(x: &mut [f32], w: &[f32], eps: f32) {
    rms_norm_in_place_generic(x, w, eps)
}

#[inline(always)]
fn rms_norm_in_place_generic(x: &mut [f32], w: &[f32], eps: f32) {
    for xr in x.chunks_exact_mut(w.len()) {
        let r = inv_rms(xr, eps);
        for (v, wi) in xr.iter_mut().zip(w) {
            *v = *v * r * wi;
        }
    }
}

/// `1 / √(mean(x²) + eps)` of one row.
#[inline(always)]
fn inv_rms(xr: &[f32], eps: f32) -> f32 {
    // 16 partial sums, which the compiler keeps in two vectors: one
    // running f32 sum cannot be reordered, so it waited on an add's
    // latency per element (3.4 ms of a 128-token prefill step).
    let mut lanes = [0f32; 16];
    let mut chunks = xr.chunks_exact(16);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += v * v;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    let ms = (lanes.iter().sum::<f32>() + tail) / xr.len() as f32;
    1.0 / (ms + eps).sqrt()
}

/// RMSNorm of every row of `x` (`[rows][w.len()]`) into `out`:
/// `out = x / √(mean(x²) + eps) · w`.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::get(IsaKind::Avx2).is_some() {
        // SAFETY: the CPU supports the features the function is compiled for.
        unsafe { rms_norm_avx2(x, w, eps, out) };
        return;
    }
    rms_norm_generic(x, w, eps, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rms_norm_avx2(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_generic(x, w, eps, out)
}

#[inline(always)]
fn rms_norm_generic(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let r = inv_rms(xr, eps);
        for ((o, v), wi) in or.iter_mut().zip(xr).zip(w) {
            *o = v * r * wi;
        }
    }
}

/// The gated activation (SwiGLU or GeGLU) of every row of `gate_up`
/// (`[rows][2 · inter]`: the gate, then the up projection) into `act`
/// (`[rows][inter]`); many rows are split across the pool.
pub(crate) fn gated_rows(gate_up: &[f32], inter: usize, act: &mut [f32], kind: Activation) {
    let row = |(a, gu): (&mut [f32], &[f32])| {
        let (g, u) = gu.split_at(inter);
        match kind {
            Activation::Silu => swiglu(g, u, a),
            Activation::GeluTanh => geglu_tanh(g, u, a),
        }
    };
    if act.len() >= SWIGLU_PARALLEL_MIN {
        act.par_chunks_exact_mut(inter)
            .zip(gate_up.par_chunks_exact(2 * inter))
            .for_each(row);
    } else {
        act.chunks_exact_mut(inter)
            .zip(gate_up.chunks_exact(2 * inter))
            .for_each(row);
    }
}

/// `out[i] = silu(g[i]) · u[i]`, SwiGLU's activation, where
/// `silu(x) = x / (1 + e⁻ˣ)`.
pub(crate) fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::get(IsaKind::Avx2).is_some() {
        // SAFETY: the CPU supports the features the function is compiled for.
        unsafe { swiglu_avx2(g, u, out) };
        return;
    }
    swiglu_generic(g, u, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn swiglu_avx2(g: &[f32], u: &[f32], out: &mut [f32]) {
    swiglu_generic(g, u, out)
}

/// `out[i] = gelu_tanh(g[i]) · u[i]`, Gemma's GeGLU, where
/// `gelu_tanh(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))`, computed as
/// `x / (1 + e^(-2y))` (the same value: `½(1 + tanh y)` is `σ(2y)`), so
/// that it vectorises like SwiGLU.
pub(crate) fn geglu_tanh(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::get(IsaKind::Avx2).is_some() {
        // SAFETY: the CPU supports the features the function is compiled for.
        unsafe { geglu_tanh_avx2(g, u, out) };
        return;
    }
    geglu_tanh_generic(g, u, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn geglu_tanh_avx2(g: &[f32], u: &[f32], out: &mut [f32]) {
    geglu_tanh_generic(g, u, out)
}

#[inline(always)]
fn geglu_tanh_generic(g: &[f32], u: &[f32], out: &mut [f32]) {
    // -2 · √(2/π).
    const K: f32 = -1.595_769;
    for (o, x) in out.iter_mut().zip(g) {
        *o = K * (x + 0.044_715 * x * x * x);
    }
    exp_in_place(out);
    for ((o, x), ui) in out.iter_mut().zip(g).zip(u) {
        *o = x / (1.0 + *o) * ui;
    }
}

#[inline(always)]
fn swiglu_generic(g: &[f32], u: &[f32], out: &mut [f32]) {
    for (o, gi) in out.iter_mut().zip(g) {
        *o = -gi;
    }
    exp_in_place(out);
    for ((o, gi), ui) in out.iter_mut().zip(g).zip(u) {
        *o = gi / (1.0 + *o) * ui;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_matches_the_formula() {
        let g: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.25).collect();
        let u: Vec<f32> = (0..1000).map(|i| 1.0 + (i % 7) as f32).collect();
        let mut out = vec![0f32; g.len()];
        swiglu(&g, &u, &mut out);
        for ((o, gi), ui) in out.iter().zip(&g).zip(&u) {
            let e = gi / (1.0 + (-gi).exp()) * ui;
            assert!(
                (o - e).abs() <= 1e-6 * e.abs().max(1.0),
                "silu({gi})·{ui} = {o}, want {e}"
            );
        }
    }

    #[test]
    fn geglu_tanh_matches_the_formula() {
        let g: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.02).collect();
        let u: Vec<f32> = (0..1000).map(|i| 1.0 + (i % 7) as f32).collect();
        let mut out = vec![0f32; g.len()];
        geglu_tanh(&g, &u, &mut out);
        for ((o, gi), ui) in out.iter().zip(&g).zip(&u) {
            let x = f64::from(*gi);
            let y = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3));
            let e = 0.5 * x * (1.0 + y.tanh()) * f64::from(*ui);
            assert!(
                (f64::from(*o) - e).abs() <= 1e-5 * e.abs().max(1.0),
                "gelu_tanh({gi})·{ui} = {o}, want {e}"
            );
        }
    }

    #[test]
    fn rms_norm_in_place_equals_rms_norm() {
        let w: Vec<f32> = (0..24).map(|i| 0.5 + i as f32 * 0.1).collect();
        let x: Vec<f32> = (0..72).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
        let mut out = vec![f32::NAN; x.len()];
        rms_norm(&x, &w, 1e-6, &mut out);
        let mut y = x.clone();
        rms_norm_in_place(&mut y, &w, 1e-6);
        assert_eq!(y, out);
    }

    #[test]
    fn rms_norm_matches_the_formula() {
        // 3 rows of 40 (not a multiple of 16: the tail counts too), one of
        // them all zeros (only eps keeps it finite).
        let h = 40;
        let x: Vec<f32> = (0..3 * h)
            .map(|i| {
                if i / h == 1 {
                    0.0
                } else {
                    ((i * 7) % 11) as f32 - 4.5
                }
            })
            .collect();
        let w: Vec<f32> = (0..h).map(|i| 0.5 + i as f32 * 0.05).collect();
        let mut out = vec![f32::NAN; x.len()];
        rms_norm(&x, &w, 1e-5, &mut out);
        for (xr, or) in x.chunks(h).zip(out.chunks(h)) {
            let ms = xr.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / h as f64;
            let r = 1.0 / (ms + 1e-5).sqrt();
            for ((o, v), wi) in or.iter().zip(xr).zip(&w) {
                let e = f64::from(*v) * r * f64::from(*wi);
                assert!(
                    (f64::from(*o) - e).abs() <= 1e-6 * e.abs().max(1.0),
                    "{o} vs {e}"
                );
            }
        }
    }

    #[test]
    fn swiglu_rows_match_row_by_row_serial_and_parallel() {
        // 4 rows (serial) and 40 rows of 2048 (past SWIGLU_PARALLEL_MIN).
        for rows in [4, 40] {
            let inter = 2048;
            let gu: Vec<f32> = (0..rows * 2 * inter)
                .map(|i| ((i * 13) % 29) as f32 * 0.25 - 3.5)
                .collect();
            let mut act = vec![f32::NAN; rows * inter];
            gated_rows(&gu, inter, &mut act, Activation::Silu);
            for (r, a) in act.chunks(inter).enumerate() {
                let (g, u) = gu[r * 2 * inter..(r + 1) * 2 * inter].split_at(inter);
                let mut e = vec![0f32; inter];
                swiglu(g, u, &mut e);
                assert_eq!(a, &e[..], "row {r} of {rows}");
            }
        }
    }

    #[test]
    fn exp_matches_libm() {
        let xs: Vec<f32> = (0..20_000).map(|i| -87.0 + i as f32 * 0.0049).collect();
        let mut ys = xs.clone();
        exp_in_place(&mut ys);
        for (x, y) in xs.iter().zip(&ys) {
            let e = x.exp();
            assert!(((y - e) / e).abs() < 1e-6, "exp({x}) = {y}, libm {e}");
        }
        let mut edge = [-1000.0f32, -88.0, 0.0];
        exp_in_place(&mut edge);
        assert_eq!(edge, [0.0, 0.0, 1.0]);
    }
}
