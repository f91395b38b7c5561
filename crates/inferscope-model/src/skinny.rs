//! Matrix products with few rows (decode at small batch): `y = x Wᵀ` with
//! `W` read exactly once, as a stream, split across threads by output rows.
//!
//! At one to a few tokens per step the product is bound by reading the
//! weights; a general GEMM spends time packing that this streaming loop does
//! not.

use rayon::prelude::*;

/// Up to this many rows take the streaming path.
pub(crate) const MAX_ROWS: usize = 4;

/// Output rows per parallel task (a few hundred KiB of weights).
const ROWS_PER_TASK: usize = 64;

/// Below this many multiply-adds one thread does the product: a parallel
/// section costs a synchronisation, and on a loaded machine waiting for a
/// descheduled worker costs far more than the work.
const PARALLEL_MIN_MACS: usize = 1 << 20;

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    // 32 independent accumulators: enough parallel chains for the vector
    // units to stay busy once the compiler vectorises the loop.
    let mut acc = [0f32; 32];
    let ca = a.chunks_exact(32);
    let cb = b.chunks_exact(32);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..32 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = 0f32;
    for v in acc {
        s += v;
    }
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `out[o][r] = W[o] · x[r]` for a block of output rows.
#[inline(always)]
fn block_portable(w: &[f32], x: &[f32], rows: usize, inp: usize, out: &mut [f32]) {
    for (wr, o) in w.chunks_exact(inp).zip(out.chunks_exact_mut(rows)) {
        for (r, or) in o.iter_mut().enumerate() {
            *or = dot_portable(wr, &x[r * inp..(r + 1) * inp]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_avx2(w: &[f32], x: &[f32], rows: usize, inp: usize, out: &mut [f32]) {
    // The same code, compiled with AVX2/FMA so that it vectorises 8-wide.
    block_portable(w, x, rows, inp, out)
}

fn block(w: &[f32], x: &[f32], rows: usize, inp: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        unsafe { block_avx2(w, x, rows, inp, out) };
        return;
    }
    block_portable(w, x, rows, inp, out)
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
        // Single-threaded and parallel sizes.
        check(3, 70, 130);
        check(2, 600, 1000);
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
