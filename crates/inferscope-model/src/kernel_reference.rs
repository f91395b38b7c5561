//! The one reference the kernels' parity tests check every ISA path
//! against: the product of the operands a kernel really multiplies (the
//! stored weights dequantized, the activations as quantized), summed in
//! f64 in plain Rust. It depends on nothing the CPU decides at run time.
//! candle's `QMatMul` does (it picks AVX-512 VNNI and AMX paths by CPU
//! detection, which compute other sums than its portable path: 289.19 vs
//! 285.92 for one Q8_0 cell on an AVX-512 EPYC), so it is no reference
//! for our products; candle stays the reference for quantizing and
//! dequantizing, which are scalar code everywhere.

use crate::isa::Isa;

/// `x Wᵀ` in f64: `x` is `[rows][inp]`, `w` is `[out][inp]`.
pub(crate) fn product_f64(x: &[f64], w: &[f32], rows: usize, inp: usize, out: usize) -> Vec<f64> {
    let mut y = vec![0f64; rows * out];
    for r in 0..rows {
        let xr = &x[r * inp..][..inp];
        for o in 0..out {
            let wo = &w[o * inp..][..inp];
            y[r * out + o] = xr.iter().zip(wo).map(|(a, &b)| a * f64::from(b)).sum();
        }
    }
    y
}

/// Max |a - b| over max |b|, and the worst cell.
pub(crate) fn rel_diff_f64(a: &[f32], b: &[f64]) -> (f64, usize) {
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-12);
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).abs() / scale)
        .enumerate()
        .fold((0.0, 0), |m, (i, d)| if d > m.0 { (d, i) } else { m })
}

/// The ISA paths this CPU runs, printed once per test so a log shows what
/// was checked (`cargo test -- --nocapture`).
pub(crate) fn isas_checked(test: &str) -> Vec<Isa> {
    let isas: Vec<Isa> = Isa::available().collect();
    let paths: Vec<_> = isas.iter().map(|i| (i.kind(), i.dot())).collect();
    println!(
        "{test}: ISA paths checked on this CPU (instruction set, dot product of the integer K-quant and Q8_0 tiles): {paths:?}"
    );
    isas
}
