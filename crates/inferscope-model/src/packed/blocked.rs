//! The blocked path of dense products with AVX2 (from [`BLOCKED_MIN_ROWS`]
//! rows: decode at concurrency, prefill): `x` packed per row tile, the
//! inner dimension cut into [`KC`] blocks whose weight slices stay in L1
//! while every row tile passes over them.

use std::ops::Range;

use super::dense::{PackedWeight, PanelSlice};
use super::kernels_avx2::{block_tile_avx2, widen_avx2};
use super::tiling::{LANES, MAX_MR, TiledOutput, row_tiles, schedule_blocks};
use crate::isa::Isa;

/// Rows from which AVX2 products take the blocked path: from 8 rows (a
/// decode step at concurrency 8) the plain tiles' two row tiles read each
/// panel twice, the second time from L2, while the blocked path keeps a
/// KC slice in L1 for both; a whole 8-row step of the side-by-side model
/// took about 0.7× the time (docs/results/cpu-executor.md, "decode at 8 rows").
pub(super) const BLOCKED_MIN_ROWS: usize = 8;

/// Most row tiles of a row block whose 16-bit weights the blocked path
/// widens in the kernel's registers, each tile again, instead of once per
/// slice into a scratch f32 slice that every tile reads back: with few
/// tiles (a decode step at concurrency 8 has 2) the separate widening pass
/// costs more than the conversions it saves: a whole 8-row step of the
/// side-by-side model's F16 and BF16 files took 0.75–0.80× the time, 16
/// rows (3 tiles) the same, 24 rows 1.15× (docs/results/cpu-executor.md).
const DIRECT_16BIT_MAX_TILES: usize = 2;

/// Inner-dimension block of the blocked path: a panel's `KC × LANES` f32
/// weights (16 KiB) stay in L1 while every row tile of the block uses them.
const KC: usize = 256;

/// Most rows of a row block of the blocked path: their packed `x` over one
/// [`KC`] block (rows × KC f32, 256 KiB at 256 rows) stays in L2 while every
/// panel of a task passes over it.
const BLOCKED_ROW_BLOCK: usize = 256;

/// Panels a task of the blocked path computes (64 columns): each of its KC
/// blocks of `x` is read from L2 once per panel, and a 128-row product of
/// `o` (48 panels) still makes 12 tasks to balance two threads.
const BLOCKED_TASK_PANELS: usize = 4;

thread_local! {
    /// The blocked path's per-thread scratch: the packed `x` of a product,
    /// and a task's widened weights and accumulators.
    static X_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static TASK_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<[f32; LANES]>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` on a thread-local buffer, or on a fresh one when the thread's is
/// in use (a rayon worker that took up a task of another product).
fn with_scratch<T: Default, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut T::default()),
    })
}

/// Rows per block of the blocked path: at most [`BLOCKED_ROW_BLOCK`], in
/// near-equal blocks.
fn blocked_row_block(rows: usize) -> usize {
    rows.div_ceil(rows.div_ceil(BLOCKED_ROW_BLOCK))
}

/// `x`'s rows packed per register tile, `[k][mr]` (the tiles of
/// [`row_tiles`] over each block of `row_block` rows), so that the kernel
/// broadcasts from one sequential stream at fixed offsets.
fn pack_rows(x: &[f32], rows: usize, inp: usize, row_block: usize, xp: &mut Vec<f32>) {
    // Grown, not cleared: every cell is written below.
    if xp.len() < rows * inp {
        xp.resize(rows * inp, 0.0);
    }
    for b0 in (0..rows).step_by(row_block) {
        for (r0, mr) in row_tiles::<MAX_MR>(b0..(b0 + row_block).min(rows)) {
            let dst = &mut xp[r0 * inp..(r0 + mr) * inp];
            let src = &x[r0 * inp..(r0 + mr) * inp];
            // Sequential writes, `mr` sequential reads.
            for (k, d) in dst.chunks_exact_mut(mr).enumerate() {
                for (r, v) in d.iter_mut().enumerate() {
                    *v = src[r * inp + k];
                }
            }
        }
    }
}

impl PackedWeight {
    /// The product for many rows with AVX2 (prefill): `x` packed per row
    /// tile once; tasks of [`BLOCKED_TASK_PANELS`] panels × a row block;
    /// within a task the inner dimension is cut into [`KC`] blocks, and for
    /// each block every panel's slice stays in L1 (f16/bf16 widened to f32
    /// once per slice, not per row tile, unless the block has at most
    /// [`DIRECT_16BIT_MAX_TILES`] row tiles) while every row tile passes over
    /// it, the block's packed `x` staying in L2 for all the task's panels;
    /// 6×16 tiles whose accumulators carry from block to block in f32 (the
    /// same sums, in the same order, as the plain tiles).
    pub(super) fn product_blocked(&self, isa: Isa, x: &[f32], rows: usize, y: &mut [f32]) {
        let inp = self.inp;
        let row_block = blocked_row_block(rows);
        let out = TiledOutput::new(y, rows, self.out);
        with_scratch(&X_SCRATCH, |xp| {
            pack_rows(x, rows, inp, row_block, xp);
            let xp = &xp[..];
            schedule_blocks(
                rows,
                row_block,
                inp,
                self.out,
                BLOCKED_TASK_PANELS,
                |r, g| {
                    with_scratch(&TASK_SCRATCH, |(wide, acc)| {
                        self.compute_blocked(isa, xp, r, g, (wide, acc), &out)
                    })
                },
            );
        });
    }

    /// Rows `rows` × panel groups `groups` (of [`BLOCKED_TASK_PANELS`]) of
    /// the blocked path.
    fn compute_blocked(
        &self,
        _isa: Isa,
        xp: &[f32],
        rows: Range<usize>,
        groups: Range<usize>,
        (wide, acc): (&mut Vec<f32>, &mut Vec<[f32; LANES]>),
        out: &TiledOutput,
    ) {
        let inp = self.inp;
        let panel_len = inp * LANES;
        let all = self.out.div_ceil(LANES);
        let panels =
            groups.start * BLOCKED_TASK_PANELS..(groups.end * BLOCKED_TASK_PANELS).min(all);
        let n = rows.len();
        // Grown, not cleared: the first block writes every cell before a
        // block reads it.
        if acc.len() < n * panels.len() {
            acc.resize(n * panels.len(), [0.0; LANES]);
        }
        wide.resize(KC * LANES, 0.0);
        let few_tiles = rows.len().div_ceil(MAX_MR) <= DIRECT_16BIT_MAX_TILES;
        for k0 in (0..inp).step_by(KC) {
            let kc = KC.min(inp - k0);
            for (i, p) in panels.clone().enumerate() {
                let span = p * panel_len + k0 * LANES..p * panel_len + (k0 + kc) * LANES;
                // The next slice this task reads (the next panel's, or the
                // first panel's of the next block) does not follow this one
                // in memory, so the first tiles prefetch it into L2 by hand.
                let next = if p + 1 < panels.end {
                    Some(((p + 1) * panel_len + k0 * LANES, kc))
                } else if k0 + KC < inp {
                    Some((
                        panels.start * panel_len + (k0 + KC) * LANES,
                        KC.min(inp - k0 - KC),
                    ))
                } else {
                    None
                };
                let (pf, pf_bytes) = next.map_or((std::ptr::null(), 0), |(at, len)| {
                    self.data.bytes_at(at, len * LANES)
                });
                let acc = &mut acc[i * n..(i + 1) * n];
                // The last block of a whole panel stores its sums in `y`
                // itself; the others (and a last, partial panel) in `acc`.
                let direct = k0 + kc == inp && (p + 1) * LANES <= self.out;
                // Every row tile over the slice `w` (f32, or 16-bit
                // widened in the kernel's registers).
                macro_rules! tiles {
                    ($w:expr) => {{
                        let w = $w;
                        for (t, (r0, mr)) in row_tiles::<MAX_MR>(rows.clone()).enumerate() {
                            let a = &mut acc[r0 - rows.start..][..mr];
                            let dst = if direct {
                                out.cell(r0, p * LANES)
                            } else {
                                std::ptr::null_mut()
                            };
                            let xt = &xp[r0 * inp + k0 * mr..][..kc * mr];
                            // Tile t prefetches the next slice's bytes from
                            // t·PREFETCH_BYTES (prefetching does not fault: a
                            // pointer past the slice is only never used).
                            let from = (t * PREFETCH_BYTES).min(pf_bytes);
                            let part =
                                (pf.wrapping_add(from), (pf_bytes - from).min(PREFETCH_BYTES));
                            // SAFETY: `_isa` is AVX2 (the caller checked), so
                            // the CPU has AVX2, FMA and F16C; `dst`, when not
                            // null, is row r0's column p·LANES of `y`, which
                            // has rows r0..r0 + mr and columns p·LANES.. +
                            // LANES (a whole panel), cells this task alone
                            // writes (see `TiledOutput`).
                            unsafe {
                                block_tile_avx2(mr, xt, w, kc, a, k0 == 0, part, (dst, out.cols()))
                            };
                        }
                    }};
                }
                match self.data.slice(span) {
                    PanelSlice::F32(w) => tiles!(w),
                    PanelSlice::F16(w) if few_tiles => tiles!(w),
                    PanelSlice::Bf16(w) if few_tiles => tiles!(w),
                    // SAFETY: as above, the CPU has F16C.
                    PanelSlice::F16(w) => tiles!(unsafe { widen_avx2(w, wide) }),
                    // SAFETY: as above.
                    PanelSlice::Bf16(w) => tiles!(unsafe { widen_avx2(w, wide) }),
                }
            }
        }
        for (i, p) in panels.enumerate() {
            if (p + 1) * LANES > self.out {
                for (r, a) in acc[i * n..(i + 1) * n].iter().enumerate() {
                    out.store_at::<1, 1>(rows.start + r, p * LANES, 1, &[[*a]]);
                }
            }
        }
    }
}

/// Bytes of the next weight slice each row tile prefetches (64 lines: one
/// per 4 steps of a 256-long block): a 16 KiB f32 slice is fetched by the
/// first 4 tiles of a block's 22 (at 128 rows).
const PREFETCH_BYTES: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::IsaKind;
    use crate::packed::tests::assert_plain_tiles_sums;

    #[test]
    fn blocked_path_gives_the_plain_tiles_sums() {
        // The AVX2 prefill path against the plain tiles, bit for bit (the
        // same f32 sums in the same order), and against the naive product:
        // rows from the threshold up (16-bit weights widened in registers up
        // to 12 rows, two row tiles, and through the scratch from 13), in
        // one row block and in several
        // (280 rows are two blocks of 140, tiled unlike one of 280), inp
        // shorter than a KC block and not a multiple of it, out not a
        // multiple of a panel nor of a task's panels (200 columns: 13
        // panels, tasks of 4, 4, 4, 1); serial (small) and parallel; f32,
        // f16 and bf16 weights.
        let Some(isa) = Isa::get(IsaKind::Avx2) else {
            return;
        };
        for (rows, inp, out) in [
            (BLOCKED_MIN_ROWS, 37, 61),
            (12, 530, 45),
            (13, 530, 45),
            (17, 300, 33),
            (23, 513, 100),
            (128, 768, 200),
            (130, 2100, 40),
            (45, 256, 16),
            (280, 530, 70),
        ] {
            assert_plain_tiles_sums(isa, rows, inp, out);
        }
    }
}
