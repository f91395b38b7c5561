//! Matrix products with few rows (decode at small batch): `y = x Wᵀ`
//! straight from the row-major weights, read once as a stream, without the
//! packing a general GEMM does; split across threads by output rows when
//! large.
//!
//! At one to a few tokens per step the product is bound by reading the
//! weights. (At 32 rows candle's GEMM is ~2× faster than this kernel, so the
//! path stops at 4.)

use rayon::prelude::*;

/// Up to this many rows take this path.
pub(crate) const MAX_ROWS: usize = 4;

/// Weight rows computed together: each loaded `x` vector feeds this many
/// independent multiply-add chains.
const GROUP: usize = 8;

/// Output rows per parallel task.
const ROWS_PER_TASK: usize = 64;

/// Below this many multiply-adds one thread does the product: a parallel
/// section costs a synchronisation, and on a loaded machine waiting for a
/// descheduled worker costs far more than the work.
const PARALLEL_MIN_MACS: usize = 1 << 20;

#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    // `mul_add` is one instruction where FMA is enabled and a slow libm call
    // where it is not, so the portable build multiplies and adds.
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// Dot products of `GROUP` weight rows (`w`, `[GROUP][inp]`) with `x`.
#[inline(always)]
fn dots<const FMA: bool>(w: &[f32], x: &[f32], inp: usize) -> [f32; GROUP] {
    let mut acc = [[0f32; 8]; GROUP];
    let chunks = inp / 8;
    for c in 0..chunks {
        let xs = &x[c * 8..c * 8 + 8];
        for (g, a) in acc.iter_mut().enumerate() {
            let ws = &w[g * inp + c * 8..g * inp + c * 8 + 8];
            for l in 0..8 {
                a[l] = fmadd::<FMA>(ws[l], xs[l], a[l]);
            }
        }
    }
    let mut out = [0f32; GROUP];
    for (g, o) in out.iter_mut().enumerate() {
        let mut s: f32 = acc[g].iter().sum();
        for k in chunks * 8..inp {
            s += w[g * inp + k] * x[k];
        }
        *o = s;
    }
    out
}

#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let ca = a.chunks_exact(32);
    let cb = b.chunks_exact(32);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..32 {
            acc[i] = fmadd::<FMA>(x[i], y[i], acc[i]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `out[o][r] = W[o] · x[r]` for a block of output rows.
#[inline(always)]
fn block_generic<const FMA: bool>(w: &[f32], x: &[f32], rows: usize, inp: usize, out: &mut [f32]) {
    let n_out = out.len() / rows;
    let full = n_out / GROUP * GROUP;
    for o in (0..full).step_by(GROUP) {
        let wg = &w[o * inp..(o + GROUP) * inp];
        for r in 0..rows {
            let d = dots::<FMA>(wg, &x[r * inp..(r + 1) * inp], inp);
            for (g, v) in d.iter().enumerate() {
                out[(o + g) * rows + r] = *v;
            }
        }
    }
    for o in full..n_out {
        for r in 0..rows {
            out[o * rows + r] = dot::<FMA>(&w[o * inp..(o + 1) * inp], &x[r * inp..(r + 1) * inp]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_avx2(w: &[f32], x: &[f32], rows: usize, inp: usize, out: &mut [f32]) {
    // The same code, compiled with AVX2/FMA so that it vectorises 8-wide.
    block_generic::<true>(w, x, rows, inp, out)
}

fn block(w: &[f32], x: &[f32], rows: usize, inp: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        unsafe { block_avx2(w, x, rows, inp, out) };
        return;
    }
    block_generic::<false>(w, x, rows, inp, out)
}

/// `x` is `[rows][inp]`, `w` is `[out][inp]`; returns `[rows][out]`.
pub(crate) fn matmul_t(x: &[f32], w: &[f32], rows: usize, inp: usize, out: usize) -> Vec<f32> {
    let mut yt = vec![0f32; out * rows];
    if out * inp * rows < PARALLEL_MIN_MACS {
        block(w, x, rows, inp, &mut yt);
    } else {
        yt.par_chunks_mut(ROWS_PER_TASK * rows)
            .zip(w.par_chunks(ROWS_PER_TASK * inp))
            .for_each(|(o, wc)| block(wc, x, rows, inp, o));
    }
    if rows == 1 {
        return yt;
    }
    let mut y = vec![0f32; rows * out];
    for o in 0..out {
        for r in 0..rows {
            y[r * out + o] = yt[o * rows + r];
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_product() {
        // Single-threaded and parallel sizes, with remainders everywhere.
        check(3, 70, 130);
        check(2, 600, 1000);
        check(33, 100, 77);
    }

    fn check(rows: usize, inp: usize, out: usize) {
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
            .collect();
        let y = matmul_t(&x, &w, rows, inp, out);
        for r in 0..rows {
            for o in 0..out {
                let e: f32 = (0..inp).map(|k| x[r * inp + k] * w[o * inp + k]).sum();
                assert!(
                    (y[r * out + o] - e).abs() < 1e-3,
                    "{r},{o}: {} vs {e}",
                    y[r * out + o]
                );
            }
        }
    }
}
