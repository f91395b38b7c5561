//! How every packed product (dense, Q8_0, K-quant) is cut up: output
//! columns in panels of [`LANES`] rows of `W`, panel groups × row blocks as
//! tasks ([`schedule`]), register tiles of rows × panels inside a task
//! ([`for_each_tile`], [`row_tiles`]), and the output the tiles store their
//! sums into ([`TiledOutput`], [`TileSums`]).

use std::ops::Range;

use rayon::prelude::*;

use crate::isa::{Isa, IsaKind};

/// Output rows per panel: one AVX-512 (or two AVX2) vectors of f32.
pub(crate) const LANES: usize = 16;

/// Most rows of `x` in one register tile of the f32 kernels (dense
/// weights, and K-quants rebuilt in f32).
pub(crate) const MAX_MR: usize = 6;

/// Below this many multiply-adds one thread does the product: a parallel
/// section costs a synchronisation, and on a loaded machine waiting for a
/// descheduled worker costs far more than the work. At 512 Ki a one-row
/// product of a 768-wide model's q/k/v and o (0.6–1 M multiply-adds, 18 %
/// of a decode step) splits: one thread cannot pull the memory bandwidth
/// two can, and a one-row integer product is bound by its unpacking.
pub(crate) const PARALLEL_MIN_MACS: usize = 1 << 19;

/// Multiply-adds per parallel task, so that tasks outnumber threads enough
/// to balance without each paying more in scheduling than it computes.
const TASK_MACS: usize = 1 << 18;

/// Rows per block of work: a block's rows of `x` stay in cache while the
/// weights stream past, and large prefills split across threads by rows too.
pub(crate) const ROW_BLOCK: usize = 48;

/// `rows` cut into near-equal tiles of at most `MR` rows, as `(first row,
/// rows)`, so that 32 rows in tiles of at most 6 are 6+6+5+5+5+5, all with
/// the widest kernel.
pub(crate) fn row_tiles<const MR: usize>(
    rows: Range<usize>,
) -> impl Iterator<Item = (usize, usize)> {
    let n = rows.len();
    let count = n.div_ceil(MR);
    let (base, extra) = (n / count.max(1), n % count.max(1));
    (0..count).scan(rows.start, move |r0, i| {
        let mr = base + usize::from(i < extra);
        let tile = (*r0, mr);
        *r0 += mr;
        Some(tile)
    })
}

/// Runs `tile(row0, mr, panel0, np)` for every register tile of rows
/// `rows` × panel groups `groups` (of `nv` panels, of `panels` in all: the
/// last group may have fewer, `np`): row tiles of at most `MR` rows
/// ([`row_tiles`]) inside each group, so that a group's panels stay in L1
/// while every row tile uses them.
#[inline]
pub(crate) fn for_each_tile<const MR: usize>(
    rows: Range<usize>,
    groups: Range<usize>,
    (nv, panels): (usize, usize),
    mut tile: impl FnMut(usize, usize, usize, usize),
) {
    for g in groups {
        let p0 = g * nv;
        let np = nv.min(panels - p0);
        for (r0, mr) in row_tiles::<MR>(rows.clone()) {
            tile(r0, mr, p0, np);
        }
    }
}

/// Checks that `x` is `[rows][inp]` and sizes `y` to `[rows][out]` (its
/// cells are all written by the caller); false when there is nothing to
/// compute.
pub(crate) fn shape_output(
    x: &[f32],
    rows: usize,
    (inp, out): (usize, usize),
    y: &mut Vec<f32>,
) -> bool {
    assert_eq!(x.len(), rows * inp, "input is not [{rows}][{inp}]");
    y.resize(rows * out, 0.0);
    rows > 0 && out > 0
}

/// The driver the quantized products share: checks that `x` is
/// `[rows][inp]`, sizes `y` to `[rows][out]`, and runs `compute(isa, nv,
/// rows, groups, out)` over [`schedule`]'s split. AVX-512 CPUs run the AVX2
/// quantized tiles (the integer K-quant ones with VNNI where the CPU has
/// it: [`Isa::for_quantized_tiles`]).
pub(crate) fn quantized_product(
    isa: Isa,
    x: &[f32],
    rows: usize,
    (inp, out_dim): (usize, usize),
    y: &mut Vec<f32>,
    compute: impl Fn(Isa, usize, Range<usize>, Range<usize>, &TiledOutput) + Sync,
) {
    if !shape_output(x, rows, (inp, out_dim), y) {
        return;
    }
    let isa = isa.for_quantized_tiles();
    let nv = isa.panels_per_tile(rows);
    let out = TiledOutput::new(y, rows, out_dim);
    schedule(rows, inp, out_dim, nv, |r, g| compute(isa, nv, r, g, &out));
}

/// Cuts a `[rows] x [inp] x [out]` product into blocks of [`ROW_BLOCK`]
/// rows × runs of panel groups (of `nv` panels) and runs `job` on each, on
/// this thread when the product is small, else across the rayon pool.
pub(crate) fn schedule(
    rows: usize,
    inp: usize,
    out: usize,
    nv: usize,
    job: impl Fn(Range<usize>, Range<usize>) + Sync,
) {
    schedule_blocks(rows, ROW_BLOCK, inp, out, nv, job);
}

/// [`schedule`] with blocks of `row_block` rows.
pub(super) fn schedule_blocks(
    rows: usize,
    row_block: usize,
    inp: usize,
    out: usize,
    nv: usize,
    job: impl Fn(Range<usize>, Range<usize>) + Sync,
) {
    let groups = out.div_ceil(LANES).div_ceil(nv);
    let blocks = rows.div_ceil(row_block);
    let block = |b: usize| b * row_block..((b + 1) * row_block).min(rows);
    if rows * inp * out < PARALLEL_MIN_MACS {
        for b in 0..blocks {
            job(block(b), 0..groups);
        }
    } else {
        let group_macs = rows.min(row_block) * inp * nv * LANES;
        let per_task = (TASK_MACS / group_macs.max(1)).max(1);
        let chunks = groups.div_ceil(per_task);
        (0..blocks * chunks).into_par_iter().for_each(|i| {
            let g0 = (i % chunks) * per_task;
            job(block(i / chunks), g0..(g0 + per_task).min(groups));
        });
    }
}

impl Isa {
    /// Panels per tile for a product of `rows` rows: at least 8 independent
    /// accumulators to hide the FMA latency with few rows, and as many as the
    /// registers hold (next to the weights and the broadcast) with many.
    pub(crate) fn panels_per_tile(self, rows: usize) -> usize {
        match (self.kind(), rows) {
            (IsaKind::Avx512, 1) => 8,
            (IsaKind::Avx512, _) => 4,
            (_, 1) => 4,
            (_, 2 | 3) => 2,
            _ => 1,
        }
    }
}

/// The output, `[rows][cols]`, written by register tiles that each own
/// distinct (row, column) cells.
pub(crate) struct TiledOutput {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
}

// SAFETY: tasks write disjoint cells (distinct panel groups are distinct
// columns) of a buffer that outlives the parallel section.
unsafe impl Sync for TiledOutput {}

/// A register tile's sums: `[MR][NV][LANES]`, rows × panels × a panel's
/// columns.
pub(crate) type TileSums<const MR: usize, const NV: usize> = [[[f32; LANES]; NV]; MR];

/// An AVX tile's accumulators (two 8-float halves per panel and row) as
/// its [`TileSums`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub(crate) fn tile_sums_avx2<const MR: usize, const NV: usize>(
    acc: &[[[std::arch::x86_64::__m256; 2]; NV]; MR],
) -> TileSums<MR, NV> {
    use std::arch::x86_64::_mm256_storeu_ps;
    let mut res = [[[0f32; LANES]; NV]; MR];
    for (dst_r, acc_r) in res.iter_mut().zip(acc) {
        for (dst, a) in dst_r.iter_mut().zip(acc_r) {
            // SAFETY: `dst` is LANES (16) floats: two 8-float stores.
            unsafe {
                _mm256_storeu_ps(dst.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(dst.as_mut_ptr().add(8), a[1]);
            }
        }
    }
    res
}

impl TiledOutput {
    /// The output `y`, `[rows][cols]`.
    pub(crate) fn new(y: &mut [f32], rows: usize, cols: usize) -> Self {
        assert!(y.len() >= rows * cols);
        Self {
            ptr: y.as_mut_ptr(),
            rows,
            cols,
        }
    }

    /// Columns per row.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// The address of cell (`row`, `col`), which must be inside (the
    /// caller owns the cells it writes through it).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn cell(&self, row: usize, col: usize) -> *mut f32 {
        assert!(row < self.rows && col < self.cols);
        // SAFETY: inside the buffer (asserted).
        unsafe { self.ptr.add(row * self.cols + col) }
    }

    /// Stores the first `np` panels of `acc` at row `row0`, column `col0`
    /// (the caller owns those cells).
    pub(crate) fn store_at<const MR: usize, const NV: usize>(
        &self,
        row0: usize,
        col0: usize,
        np: usize,
        acc: &TileSums<MR, NV>,
    ) {
        for (r, row) in acc.iter().enumerate() {
            let y = row0 + r;
            debug_assert!(y < self.rows);
            for (p, v) in row.iter().enumerate().take(np) {
                let c0 = col0 + p * LANES;
                let n = LANES.min(self.cols.saturating_sub(c0));
                // SAFETY: y < rows and c0 + n <= cols, so the cells are inside
                // the buffer; no other tile writes them (see `TiledOutput`).
                unsafe {
                    let dst = self.ptr.add(y * self.cols + c0);
                    if n == LANES {
                        // A fixed-size store, not a call to memcpy.
                        dst.cast::<[f32; LANES]>().write_unaligned(*v);
                    } else {
                        std::ptr::copy_nonoverlapping(v.as_ptr(), dst, n);
                    }
                }
            }
        }
    }
}
