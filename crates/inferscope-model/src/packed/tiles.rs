//! The plain register-tile path of dense products, for any rows and any
//! ISA: row tiles × panel groups, each tile's sums in registers (the
//! portable kernel here, the AVX2 and AVX-512 ones beside it).

use std::ops::Range;

use half::f16;

use super::dense::{Elem, PackedWeight, PanelSlice, Tile};
#[cfg(target_arch = "x86_64")]
use super::kernels_avx2::tile_avx2;
#[cfg(target_arch = "x86_64")]
use super::kernels_avx512::tile_avx512;
use super::tiling::{LANES, MAX_MR, TileSums, TiledOutput, for_each_tile, schedule};
use crate::isa::Isa;
#[cfg(target_arch = "x86_64")]
use crate::isa::IsaKind;

impl PackedWeight {
    /// The product with the plain register tiles (`y` already sized).
    pub(super) fn product_tiles(&self, isa: Isa, x: &[f32], rows: usize, y: &mut [f32]) {
        let nv = isa.panels_per_tile(rows);
        let out = TiledOutput::new(y, rows, self.out);
        schedule(rows, self.inp, self.out, nv, |r, g| {
            self.compute(isa, nv, x, r, g, &out)
        });
    }

    /// Computes rows `rows` × the columns of panel groups `groups` (of `nv`
    /// panels): each group's panels stay in L1 while every row tile uses
    /// them.
    fn compute(
        &self,
        isa: Isa,
        nv: usize,
        x: &[f32],
        rows: Range<usize>,
        groups: Range<usize>,
        out: &TiledOutput,
    ) {
        let panel_len = self.inp * LANES;
        let panels = self.out.div_ceil(LANES);
        for_each_tile::<MAX_MR>(rows, groups, (nv, panels), |r0, mr, p0, np| {
            let t = Tile {
                w: self.data.slice(p0 * panel_len..(p0 + np) * panel_len),
                x: &x[r0 * self.inp..(r0 + mr) * self.inp],
                inp: self.inp,
                row0: r0,
                col0: p0 * LANES,
            };
            kernel(isa, mr, nv, &t, out);
        });
    }
}

/// Runs the micro-kernel for `mr` rows and `nv` panels (the pairs
/// [`Isa::panels_per_tile`] and `PackedWeight::compute` produce).
// Every call is wrapped in `unsafe`, which the portable kernel does not need.
#[allow(unused_unsafe)]
fn kernel(isa: Isa, mr: usize, nv: usize, t: &Tile<'_>, out: &TiledOutput) {
    macro_rules! go {
        ($f:ident; $($m:literal x $n:literal),*) => {
            match (mr, nv, t.w) {
                $(
                    ($m, $n, PanelSlice::F32(w)) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$m, $n, f32>(t, w) };
                        t.store::<$m, $n>(out, &acc)
                    }
                    ($m, $n, PanelSlice::Bf16(w)) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$m, $n, u16>(t, w) };
                        t.store::<$m, $n>(out, &acc)
                    }
                    ($m, $n, PanelSlice::F16(w)) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$m, $n, f16>(t, w) };
                        t.store::<$m, $n>(out, &acc)
                    }
                )*
                _ => unreachable!("no {mr}x{nv} kernel for {isa:?}"),
            }
        };
    }
    // SAFETY (the `unsafe` calls): an `Isa` can only be made by detection
    // (see `isa.rs`), so holding one means the CPU has its features.
    match isa.kind() {
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx512 => go!(tile_avx512; 1 x 8, 1 x 4, 2 x 4, 3 x 4, 4 x 4, 5 x 4, 6 x 4),
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => go!(
            tile_avx2; 1 x 4, 2 x 2, 3 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1
        ),
        _ => go!(tile_portable; 1 x 4, 2 x 2, 3 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1),
    }
}

/// The tile's product, portable (the compiler vectorises what it can).
fn tile_portable<const MR: usize, const NV: usize, E: Elem>(
    t: &Tile<'_>,
    w: &[E],
) -> TileSums<MR, NV> {
    let mut acc = [[[0f32; LANES]; NV]; MR];
    let panel_len = t.inp * LANES;
    let np = t.panels().min(NV);
    for k in 0..t.inp {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = t.x[r * t.inp + k];
            for (p, a) in acc_r.iter_mut().enumerate().take(np) {
                let w = &w[p * panel_len + k * LANES..][..LANES];
                for l in 0..LANES {
                    a[l] += w[l].widen() * xv;
                }
            }
        }
    }
    acc
}
