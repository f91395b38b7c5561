//! The one-row path of dense products with AVX2 (decode at batch 1): runs
//! of panel groups streamed side by side, split across the pool.

use std::ops::Range;

use half::f16;
use rayon::prelude::*;

use super::dense::{PackedWeight, PanelSlice};
use super::kernels_avx2::row_avx2;
use super::tiling::{LANES, PARALLEL_MIN_MACS, TiledOutput};

/// Panels the one-row kernel reads side by side: 8 independent accumulator
/// chains (2 per panel) hide the FMA latency, and 4 streams are few enough
/// for the hardware prefetcher.
const ROW_PANELS: usize = 4;

/// Tasks per thread of a parallel one-row product: near-equal runs of
/// panel groups, so each thread streams long sequential runs, with a
/// second task each to rebalance when one thread is held up.
const ROW_TASKS_PER_THREAD: usize = 2;

impl PackedWeight {
    /// The one-row product with AVX2 (decode at batch 1): groups of
    /// [`ROW_PANELS`] panels, split across the pool in near-equal runs.
    /// Each column's sum is the plain 1-row tile's, in the same order.
    pub(super) fn product_row(&self, x: &[f32], y: &mut [f32]) {
        let out = TiledOutput::new(y, 1, self.out);
        let panels = self.out.div_ceil(LANES);
        let groups = panels.div_ceil(ROW_PANELS);
        let panel_len = self.inp * LANES;
        let job = |gs: Range<usize>| {
            for g in gs {
                let p0 = g * ROW_PANELS;
                let np = ROW_PANELS.min(panels - p0);
                let w = self.data.slice(p0 * panel_len..(p0 + np) * panel_len);
                // SAFETY: the caller checked that the CPU runs AVX2 (with
                // FMA and F16C).
                let acc = unsafe {
                    match w {
                        PanelSlice::F32(w) => row_avx2::<ROW_PANELS, f32>(x, w, self.inp, np),
                        PanelSlice::F16(w) => row_avx2::<ROW_PANELS, f16>(x, w, self.inp, np),
                        PanelSlice::Bf16(w) => row_avx2::<ROW_PANELS, u16>(x, w, self.inp, np),
                    }
                };
                out.store_at::<1, ROW_PANELS>(0, p0 * LANES, np, &[acc]);
            }
        };
        if self.inp * self.out < PARALLEL_MIN_MACS {
            job(0..groups);
        } else {
            let tasks = (rayon::current_num_threads() * ROW_TASKS_PER_THREAD).min(groups);
            (0..tasks)
                .into_par_iter()
                .for_each(|t| job(t * groups / tasks..(t + 1) * groups / tasks));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::isa::{Isa, IsaKind};
    use crate::packed::tests::assert_plain_tiles_sums;

    #[test]
    fn one_row_path_gives_the_plain_tiles_sums() {
        // The AVX2 one-row (decode) kernel against the plain 1-row tile, bit
        // for bit (each column's sum in the same order), and against the
        // naive product: inp not a multiple of the 4-step unroll, out not a
        // multiple of a panel nor of a group (a ragged last group), serial
        // and parallel (past PARALLEL_MIN_MACS, more groups than tasks);
        // f32, f16 and bf16 weights.
        let Some(isa) = Isa::get(IsaKind::Avx2) else {
            return;
        };
        for (inp, out) in [
            (37, 61),
            (3, 20),
            (768, 40),
            (770, 1000),
            (2049, 300),
            (64, 16),
        ] {
            assert_plain_tiles_sums(isa, 1, inp, out);
        }
    }
}
