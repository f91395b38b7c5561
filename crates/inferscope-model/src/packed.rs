//! Dense weights packed for the products a decode step does: `y = x Wᵀ`
//! with a few to a few hundred rows of `x`.
//!
//! `W` (`[out][in]`, row-major as checkpoints store it) is kept as panels of
//! [`LANES`] output rows interleaved along `in` — `[out / LANES][in][LANES]`
//! — so the kernel reads each panel as one sequential stream and multiplies
//! a vector of `LANES` weights by one broadcast element of `x`, accumulating
//! a tile of `MR` rows × `NV` panels in registers (a BLIS-style
//! micro-kernel without packing `x`, which is small). The same layout serves
//! batch 1 — where the product is bound by reading the weights once — and
//! batch 32, where it is bound by the multiply-adds; a general GEMM spends
//! much of such small products packing its operands.

use std::ops::Range;

use rayon::prelude::*;

/// Output rows per panel: one AVX2 vector of f32.
pub(crate) const LANES: usize = 8;

/// Most rows of `x` in one register tile.
const MAX_MR: usize = 6;

/// Below this many multiply-adds one thread does the product: a parallel
/// section costs a synchronisation, and on a loaded machine waiting for a
/// descheduled worker costs far more than the work.
const PARALLEL_MIN_MACS: usize = 1 << 20;

/// Multiply-adds per parallel task, so that tasks outnumber threads enough
/// to balance without each paying more in scheduling than it computes.
const TASK_MACS: usize = 1 << 18;

/// A dense `[out][in]` f32 weight in panel layout.
#[derive(Clone)]
pub struct PackedWeight {
    /// `[panels][inp][LANES]`; rows past `out` in the last panel are zero.
    data: Vec<f32>,
    out: usize,
    inp: usize,
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeight[{}, {}]", self.out, self.inp)
    }
}

impl PackedWeight {
    /// Packs a row-major `[out][inp]` matrix.
    pub fn pack(w: &[f32], out: usize, inp: usize) -> Self {
        assert_eq!(w.len(), out * inp, "weight is not [{out}][{inp}]");
        let panels = out.div_ceil(LANES);
        let mut data = vec![0f32; panels * inp * LANES];
        for (o, row) in w.chunks_exact(inp.max(1)).enumerate().take(out) {
            let panel = &mut data[(o / LANES) * inp * LANES..][..inp * LANES];
            for (k, &v) in row.iter().enumerate() {
                panel[k * LANES + o % LANES] = v;
            }
        }
        Self { data, out, inp }
    }

    /// The row-major `[out][inp]` matrix back.
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out * self.inp];
        for (o, row) in w
            .chunks_exact_mut(self.inp.max(1))
            .enumerate()
            .take(self.out)
        {
            let panel = &self.data[(o / LANES) * self.inp * LANES..][..self.inp * LANES];
            for (k, v) in row.iter_mut().enumerate() {
                *v = panel[k * LANES + o % LANES];
            }
        }
        w
    }

    /// Output dimension.
    pub fn out_dim(&self) -> usize {
        self.out
    }

    /// Input dimension.
    pub fn in_dim(&self) -> usize {
        self.inp
    }

    /// `x` is `[rows][in]`; returns `x Wᵀ`, `[rows][out]`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        assert_eq!(
            x.len(),
            rows * self.inp,
            "input is not [{rows}][{}]",
            self.inp
        );
        let mut y = vec![0f32; rows * self.out];
        if rows == 0 || self.out == 0 {
            return y;
        }
        let nv = panels_per_tile(rows);
        let groups = self.out.div_ceil(LANES).div_ceil(nv);
        let blocks = rows.div_ceil(ROW_BLOCK);
        let out = Out {
            ptr: y.as_mut_ptr(),
            rows,
            cols: self.out,
        };
        let job = |block: usize, g: Range<usize>| {
            let r0 = block * ROW_BLOCK;
            self.compute(x, r0..(r0 + ROW_BLOCK).min(rows), g, nv, &out);
        };
        if rows * self.inp * self.out < PARALLEL_MIN_MACS {
            for b in 0..blocks {
                job(b, 0..groups);
            }
        } else {
            let group_macs = rows.min(ROW_BLOCK) * self.inp * nv * LANES;
            let per_task = (TASK_MACS / group_macs.max(1)).max(1);
            let chunks = groups.div_ceil(per_task);
            (0..blocks * chunks).into_par_iter().for_each(|i| {
                let g0 = (i % chunks) * per_task;
                job(i / chunks, g0..(g0 + per_task).min(groups));
            });
        }
        y
    }

    /// Computes rows `rows` × the columns of panel groups `groups` (of `nv`
    /// panels): each group's panels stay in L1 while every row tile uses them.
    fn compute(&self, x: &[f32], rows: Range<usize>, groups: Range<usize>, nv: usize, out: &Out) {
        let panel_len = self.inp * LANES;
        let panels = self.out.div_ceil(LANES);
        // Rows cut into near-equal tiles of at most MAX_MR, so that 32 rows
        // are 6+6+5+5+5+5, all with the widest kernel.
        let n = rows.len();
        let count = n.div_ceil(MAX_MR);
        let (base, extra) = (n / count, n % count);
        for g in groups {
            let p0 = g * nv;
            let np = nv.min(panels - p0);
            let w = &self.data[p0 * panel_len..(p0 + np) * panel_len];
            let mut r0 = rows.start;
            for i in 0..count {
                let mr = base + usize::from(i < extra);
                let t = Tile {
                    w,
                    x: &x[r0 * self.inp..(r0 + mr) * self.inp],
                    inp: self.inp,
                    row0: r0,
                    col0: p0 * LANES,
                };
                kernel(mr, nv, &t, out);
                r0 += mr;
            }
        }
    }
}

/// Rows per block of work: a block's rows of `x` stay in cache while the
/// weights stream past, and large prefills split across threads by rows too.
const ROW_BLOCK: usize = 48;

/// Panels per tile for a product of `rows` rows: enough independent
/// accumulators (8 or more) to hide the FMA latency with few rows, and at
/// most 15 of the 16 vector registers with many.
fn panels_per_tile(rows: usize) -> usize {
    match rows {
        1 => 8,
        2 => 4,
        3 => 3,
        _ => 2,
    }
}

/// The output, written by tiles that each own distinct (row, column) cells.
struct Out {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
}

// SAFETY: tasks write disjoint cells (distinct panel groups are distinct
// columns) of a buffer that outlives the parallel section.
unsafe impl Sync for Out {}

/// One register tile's operands.
struct Tile<'a> {
    /// The tile's panels, `[np][inp][LANES]`.
    w: &'a [f32],
    /// Its rows of `x`, `[mr][inp]`.
    x: &'a [f32],
    inp: usize,
    row0: usize,
    col0: usize,
}

impl Tile<'_> {
    /// Panels present (the last group of a matrix may have fewer than NV).
    fn panels(&self) -> usize {
        self.w.len() / (self.inp * LANES).max(1)
    }
}

impl Out {
    /// Stores `acc` (`[mr][np][LANES]`) at the tile's place, dropping padding columns.
    fn store<const MR: usize, const NV: usize>(
        &self,
        t: &Tile<'_>,
        acc: &[[[f32; LANES]; NV]; MR],
    ) {
        let np = t.panels();
        for (r, row) in acc.iter().enumerate() {
            let y = t.row0 + r;
            debug_assert!(y < self.rows);
            for (p, v) in row.iter().enumerate().take(np) {
                let c0 = t.col0 + p * LANES;
                let n = LANES.min(self.cols.saturating_sub(c0));
                // SAFETY: y < rows and c0 + n <= cols, so the cells are inside
                // the buffer; no other tile writes them (see `Out`).
                unsafe {
                    std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(y * self.cols + c0), n);
                }
            }
        }
    }
}

/// Dispatches to the micro-kernel for `mr` rows and `nv` panels (the pairs
/// [`panels_per_tile`] and [`PackedWeight::compute`] produce).
fn kernel(mr: usize, nv: usize, t: &Tile<'_>, out: &Out) {
    match (mr, nv) {
        (1, 8) => run::<1, 8>(t, out),
        (2, 4) => run::<2, 4>(t, out),
        (3, 3) => run::<3, 3>(t, out),
        (1, 2) => run::<1, 2>(t, out),
        (2, 2) => run::<2, 2>(t, out),
        (3, 2) => run::<3, 2>(t, out),
        (4, 2) => run::<4, 2>(t, out),
        (5, 2) => run::<5, 2>(t, out),
        (6, 2) => run::<6, 2>(t, out),
        _ => unreachable!("no {mr}x{nv} kernel"),
    }
}

fn run<const MR: usize, const NV: usize>(t: &Tile<'_>, out: &Out) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        let acc = unsafe { tile_avx2::<MR, NV>(t) };
        out.store::<MR, NV>(t, &acc);
        return;
    }
    let acc = tile_portable::<MR, NV>(t);
    out.store::<MR, NV>(t, &acc);
}

/// The tile's product, portable (the compiler vectorises what it can).
fn tile_portable<const MR: usize, const NV: usize>(t: &Tile<'_>) -> [[[f32; LANES]; NV]; MR] {
    let mut acc = [[[0f32; LANES]; NV]; MR];
    let panel_len = t.inp * LANES;
    for k in 0..t.inp {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = t.x[r * t.inp + k];
            for (p, a) in acc_r.iter_mut().enumerate() {
                let Some(w) =
                    t.w.get(p * panel_len + k * LANES..p * panel_len + (k + 1) * LANES)
                else {
                    continue;
                };
                for l in 0..LANES {
                    a[l] += w[l] * xv;
                }
            }
        }
    }
    acc
}

/// The tile's product with AVX2/FMA: `MR × NV` accumulators in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<const MR: usize, const NV: usize>(t: &Tile<'_>) -> [[[f32; LANES]; NV]; MR] {
    use std::arch::x86_64::*;
    let panel_len = t.inp * LANES;
    let np = t.panels().min(NV);
    assert!(t.x.len() >= MR * t.inp && t.w.len() >= np * panel_len);
    let mut acc = [[_mm256_setzero_ps(); NV]; MR];
    let (w, x) = (t.w.as_ptr(), t.x.as_ptr());
    for k in 0..t.inp {
        let mut wv = [_mm256_setzero_ps(); NV];
        for (p, v) in wv.iter_mut().enumerate().take(np) {
            // SAFETY: p < np and k < inp, so the 8 floats lie inside `t.w`
            // (asserted above).
            *v = unsafe { _mm256_loadu_ps(w.add(p * panel_len + k * LANES)) };
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: r < MR and k < inp: inside `t.x` (asserted above).
            let xv = unsafe { _mm256_broadcast_ss(&*x.add(r * t.inp + k)) };
            for (a, &v) in acc_r.iter_mut().zip(&wv) {
                *a = _mm256_fmadd_ps(v, xv, *a);
            }
        }
    }
    let mut res = [[[0f32; LANES]; NV]; MR];
    for (dst_r, acc_r) in res.iter_mut().zip(&acc) {
        for (dst, a) in dst_r.iter_mut().zip(acc_r) {
            // SAFETY: `dst` is LANES (8) floats.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), *a) };
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], w: &[f32], rows: usize, inp: usize, out: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * out];
        for r in 0..rows {
            for o in 0..out {
                y[r * out + o] = (0..inp).map(|k| x[r * inp + k] * w[o * inp + k]).sum();
            }
        }
        y
    }

    fn check(rows: usize, inp: usize, out: usize) {
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
            .collect();
        let p = PackedWeight::pack(&w, out, inp);
        assert_eq!(p.unpack(), w, "pack/unpack round trip");
        let y = p.matmul(&x, rows);
        let e = naive(&x, &w, rows, inp, out);
        for (i, (a, b)) in y.iter().zip(&e).enumerate() {
            assert!((a - b).abs() < 1e-3, "[{rows}x{inp}x{out}] {i}: {a} vs {b}");
        }
    }

    #[test]
    fn matches_naive_product_for_every_tile_shape() {
        // Every row count up to several tiles, out not a multiple of the
        // panel width or of a panel group, inp odd.
        for rows in 1..=14 {
            check(rows, 37, 61);
        }
        check(32, 64, 96);
        check(33, 100, 77);
        check(1, 5, 3);
    }

    #[test]
    fn matches_naive_product_in_parallel() {
        // Above the threshold: split across tasks; also with more than one
        // panel group per task and a ragged last task.
        check(2, 600, 1000);
        check(32, 256, 517);
        check(200, 64, 130);
    }

    #[test]
    fn portable_kernel_matches_naive() {
        let (rows, inp, out) = (5, 19, 20);
        let x: Vec<f32> = (0..rows * inp).map(|i| (i % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..out * inp).map(|i| (i % 5) as f32 * 0.25).collect();
        let p = PackedWeight::pack(&w, out, inp);
        let mut y = vec![0f32; rows * out];
        let o = Out {
            ptr: y.as_mut_ptr(),
            rows,
            cols: out,
        };
        for p0 in (0..out.div_ceil(LANES)).step_by(2) {
            let np = 2.min(out.div_ceil(LANES) - p0);
            let t = Tile {
                w: &p.data[p0 * inp * LANES..(p0 + np) * inp * LANES],
                x: &x,
                inp,
                row0: 0,
                col0: p0 * LANES,
            };
            let acc = tile_portable::<5, 2>(&t);
            o.store::<5, 2>(&t, &acc);
        }
        assert_eq!(y, naive(&x, &w, rows, inp, out));
    }

    #[test]
    fn empty_shapes() {
        let p = PackedWeight::pack(&[], 0, 4);
        assert!(p.matmul(&[1.0; 8], 2).is_empty());
        let p = PackedWeight::pack(&[1.0; 8], 2, 4);
        assert!(p.matmul(&[], 0).is_empty());
    }
}
