//! Element-wise math over slices, written so that the compiler vectorises
//! it (libm's `expf` is a call per value), with AVX2/FMA builds chosen at
//! run time.

#[cfg(target_arch = "x86_64")]
use crate::isa::{Isa, IsaKind};

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
