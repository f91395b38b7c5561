//! GGUF K-quant weights (Q4_K, Q5_K, Q6_K), and IQ4_XS, which has their
//! shape, packed for the same products as [`crate::packed`].
//!
//! A K-quant row is made of super-blocks of 256 weights with an f16 scale
//! (and for Q4_K/Q5_K an f16 min scale) and small integer scales per
//! sub-block (`format`). At load the blocks are decoded and repacked into
//! the dense kernels' panels of 16 output rows interleaved along `in`
//! (`panels`), in one of two layouts, each for its own product:
//!
//! - Q4_K, Q6_K and IQ4_XS run **integer products** (`integer`): each product
//!   first quantizes `x` to Q8_K (8-bit per 256-block, as llama.cpp and
//!   candle do; see `q8k.rs`), then takes integer dot products of the
//!   quants with the int8 activations, scaled by the sub-block scales in
//!   integers and by `d·d_x` per super-block in f32. The activations'
//!   rounding to 8 bits makes the product differ from the one with the
//!   dequantized weights (by up to about 1 % of the largest output on the
//!   tests' weights); it equals the exact product of its operands to f32
//!   rounding.
//! - Q5_K runs **f32 products** (`dequantized`): per element of `in` the
//!   kernel rebuilds each panel's 16 weights in f32 from the quants and
//!   the per-sub-block `d·sc` (and `dmin·m`), exactly candle's dequantized
//!   weights, and multiply-adds them into its register tile: the product
//!   is the product with the dequantized weights to f32 summation order.
//!   [`PackedKQuant::from_blocks_rebuild`] packs Q4_K and Q6_K this way too
//!   (the benchmarks compare the two).
//!
//! Both products cut the work as the dense one does (`packed::tiling`).

/// Runs kernel `$f::<$k, MR, NV>` on tile `$t` for the `(MR, NV)` among the
/// listed shapes that is `($mr, $nv)`, and stores its sums at (`$row0`,
/// `$col0`) of `$out`: the kernels' const generics from run-time shapes.
/// The caller holds an `Isa` of the kernel's family (the `unsafe` call's
/// condition).
macro_rules! run_tile {
    (
        $f:ident::<$k:ident>($t:ident) at ($row0:expr, $col0:expr) of $out:expr,
        shape ($mr:expr, $nv:expr) in [$($m:literal x $n:literal),* $(,)?]
    ) => {
        match ($mr, $nv) {
            $(
                ($m, $n) => {
                    // SAFETY: the caller's `Isa` names the kernel family.
                    let acc = unsafe { $f::<$k, $m, $n>($t) };
                    $out.store_at::<$m, $n>($row0, $col0, $t.np, &acc)
                }
            )*
            (mr, nv) => unreachable!("no {mr}x{nv} {} kernel", stringify!($f)),
        }
    };
}

mod dequantized;
mod format;
mod integer;
mod panels;

pub use format::{KQuant, QK_K};

use std::ops::Range;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::ModelError;
use crate::isa::Isa;
use crate::packed::tiling::{LANES, quantized_product, shape_output};
use crate::panel_data::{PanelData, Plain};
use crate::q8k::Q8K;
use format::Rows;
use panels::{KPanels, Layout};

/// A Q4_K, Q5_K, Q6_K or IQ4_XS `[out][in]` weight in panel layout.
#[derive(Clone)]
pub struct PackedKQuant {
    kind: KQuant,
    /// Which product runs, and so how `panels` is laid out.
    layout: Layout,
    /// The quants, scales and `d`s; rows past `out` in the last panel are 0.
    panels: KPanels,
    out: usize,
    inp: usize,
}

impl std::fmt::Debug for PackedKQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedKQuant[{:?}, {}, {}]",
            self.kind, self.out, self.inp
        )
    }
}

impl PackedKQuant {
    /// Repacks the GGUF `kind` blocks of a row-major `[out][inp]` matrix.
    pub fn from_blocks(
        kind: KQuant,
        data: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<Self, ModelError> {
        Self::from_parts(kind, &[(data, out)], inp)
    }

    /// Whether parts with these output sizes stack straight into one
    /// weight's panels ([`PackedKQuant::from_parts`]): every part but the
    /// last fills its panels (q/k/v and gate/up of every real shape).
    pub fn stacks(outs: &[usize]) -> bool {
        outs.split_last()
            .is_some_and(|(_, init)| init.iter().all(|o| o.is_multiple_of(LANES)))
    }

    /// Repacks the GGUF `kind` blocks of row-major `[out][inp]` matrices,
    /// `(blocks, out)` each, stacked along `out` into one weight (fused
    /// projections), each block read once; the parts must
    /// [stack](PackedKQuant::stacks).
    pub fn from_parts(
        kind: KQuant,
        parts: &[(&[u8], usize)],
        inp: usize,
    ) -> Result<Self, ModelError> {
        if inp == 0 || !inp.is_multiple_of(QK_K) {
            return Err(ModelError::Config(format!(
                "{kind:?} weight [_, {inp}]: the input dimension is not a positive multiple of {QK_K}"
            )));
        }
        for &(data, out) in parts {
            let expected = out * inp / QK_K * kind.block_bytes();
            if data.len() != expected {
                return Err(ModelError::Config(format!(
                    "{kind:?} weight [{out}, {inp}] holds {} bytes, expected {expected}",
                    data.len()
                )));
            }
        }
        let outs: Vec<usize> = parts.iter().map(|&(_, out)| out).collect();
        if !Self::stacks(&outs) {
            return Err(ModelError::Config(format!(
                "{kind:?} parts of {outs:?} rows do not stack: all but the last must be multiples of {LANES}"
            )));
        }
        let (out, data) = (
            outs.iter().sum(),
            parts.iter().map(|&(d, _)| d).collect::<Vec<_>>(),
        );
        let layout = kind.layout();
        Ok(Self {
            kind,
            layout,
            panels: KPanels::from_blocks(layout, kind, &data, out, inp),
            out,
            inp,
        })
    }

    /// As [`PackedKQuant::from_blocks`], in the f32-rebuild layout whatever
    /// the kind (the benchmark compares the two kernels).
    #[doc(hidden)]
    pub fn from_blocks_rebuild(
        kind: KQuant,
        data: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<Self, ModelError> {
        let p = Self::from_blocks(kind, data, out, inp)?;
        Ok(Self {
            layout: Layout::Dequantized,
            panels: KPanels::from_blocks(Layout::Dequantized, kind, &[data], out, inp),
            ..p
        })
    }

    /// Packs unpacked rows into panels laid out as `layout`.
    fn pack(kind: KQuant, r: &Rows, out: usize, inp: usize, layout: Layout) -> Self {
        Self {
            kind,
            layout,
            panels: KPanels::pack(layout, kind, r, out, inp),
            out,
            inp,
        }
    }

    /// The rows back from the panels.
    fn rows(&self) -> Rows {
        self.panels.rows(self.layout, self.kind, self.out, self.inp)
    }

    /// The parts stacked along `out` (fused projections), when all are the
    /// same kind with the same input dimension.
    pub fn stack(parts: &[&Self]) -> Option<Self> {
        let first = parts.first()?;
        let (kind, inp) = (first.kind, first.inp);
        if parts.iter().any(|p| p.kind != kind || p.inp != inp) {
            return None;
        }
        let out = parts.iter().map(|p| p.out).sum();
        let whole: Vec<_> = parts.iter().map(|p| (&p.panels, p.out)).collect();
        if parts.iter().all(|p| p.layout == first.layout)
            && let Some(panels) = KPanels::concat(&whole)
        {
            return Some(Self {
                kind,
                layout: first.layout,
                panels,
                out,
                inp,
            });
        }
        // A part ending inside a panel: its rows are repacked.
        let mut all = Rows::default();
        for p in parts {
            all.extend(p.rows());
        }
        Some(Self::pack(kind, &all, out, inp, first.layout))
    }

    /// The dequantized row-major `[out][inp]` matrix (equal to candle's).
    pub fn dequantize(&self) -> Vec<f32> {
        self.rows().dequantize(self.kind, self.out, self.inp)
    }

    /// The panel arrays as bytes, in the order [`PackedKQuant::from_mapped`]
    /// takes them back (the packed-weights cache saves them so).
    pub(crate) fn panel_bytes(&self) -> [&[u8]; 5] {
        let k = &self.panels;
        [
            k.qs.as_bytes(),
            k.sc.as_bytes(),
            k.mn.as_bytes(),
            k.d.as_bytes(),
            k.dmin.as_bytes(),
        ]
    }

    /// A `[out, inp]` weight of `kind` read in place from `map`, its five
    /// arrays at the byte ranges `at` (as [`PackedKQuant::panel_bytes`] gave
    /// them); `None` when a range is not the length those dimensions take,
    /// lies outside the map or is misaligned.
    pub(crate) fn from_mapped(
        kind: KQuant,
        out: usize,
        inp: usize,
        map: &Arc<Mmap>,
        at: &[Range<usize>],
    ) -> Option<Self> {
        if inp == 0 || !inp.is_multiple_of(QK_K) || at.len() != 5 {
            return None;
        }
        let want = KPanels::zeroed_lens(kind, out, inp);
        fn array<T: Plain>(map: &Arc<Mmap>, r: &Range<usize>, len: usize) -> Option<PanelData<T>> {
            (r.len() == len * size_of::<T>())
                .then(|| PanelData::mapped(map.clone(), r.start, len))
                .flatten()
        }
        let panels = KPanels {
            qs: array(map, &at[0], want[0])?,
            sc: array(map, &at[1], want[1])?,
            mn: array(map, &at[2], want[2])?,
            d: array(map, &at[3], want[3])?,
            dmin: array(map, &at[4], want[4])?,
        };
        Some(Self {
            kind,
            layout: kind.layout(),
            panels,
            out,
            inp,
        })
    }

    /// Whether its panels are read in place from a mapped file.
    pub fn is_mapped(&self) -> bool {
        self.panels.qs.is_mapped()
    }

    /// Which format it holds.
    pub fn kind(&self) -> KQuant {
        self.kind
    }

    /// Bytes the quants, scales and mins occupy.
    pub fn size_bytes(&self) -> usize {
        self.panels.size_bytes()
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
        let mut y = Vec::new();
        self.matmul_into(x, rows, &mut y);
        y
    }

    /// [`PackedKQuant::matmul`] into `y` (resized to `[rows][out]`).
    pub fn matmul_into(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        self.product(Isa::detect(), x, rows, y);
    }

    /// The product with the kernels of `isa` (tests run each one the CPU has).
    fn product(&self, isa: Isa, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        let dims = (self.inp, self.out);
        match self.layout {
            Layout::Integer => {
                // Checked before quantizing `x` (the driver checks it again).
                if !shape_output(x, rows, dims, y) {
                    return;
                }
                Q8K::with(x, rows, self.inp, |q| {
                    quantized_product(isa, x, rows, dims, y, |isa, nv, r, g, out| {
                        self.compute_integer(isa, nv, q, r, g, out)
                    })
                });
            }
            Layout::Dequantized => {
                quantized_product(isa, x, rows, dims, y, |isa, nv, r, g, out| {
                    self.compute_dequantized(isa, nv, x, r, g, out)
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    const KINDS: [KQuant; 4] = [KQuant::Q4K, KQuant::Q5K, KQuant::Q6K, KQuant::Iq4Xs];

    /// A `kind` weight and its dequantization: K-quants quantized and
    /// dequantized by candle; IQ4_XS (which candle lacks) as random blocks
    /// (every index and scale occurs) dequantized by `iq4`'s reference,
    /// which the fixture from gguf-py checks.
    pub(super) fn weight(kind: KQuant, out: usize, inp: usize, seed: usize) -> (Vec<u8>, Vec<f32>) {
        let dtype = match kind {
            KQuant::Q4K => GgmlDType::Q4K,
            KQuant::Q5K => GgmlDType::Q5K,
            KQuant::Q6K => GgmlDType::Q6K,
            KQuant::Iq4Xs => return iq4_xs_weight(out, inp, seed),
        };
        quantized(dtype, out, inp, seed)
    }

    fn iq4_xs_weight(out: usize, inp: usize, seed: usize) -> (Vec<u8>, Vec<f32>) {
        let bb = KQuant::Iq4Xs.block_bytes();
        let mut blocks: Vec<u8> = (0..out * inp / QK_K * bb)
            .map(|i| ((i * 2654435761 + seed * 40503) >> 7) as u8)
            .collect();
        for (i, blk) in blocks.chunks_exact_mut(bb).enumerate() {
            // Scales of a few magnitudes, both signs.
            let d = (((i * 7 + seed) % 11) as f32 - 5.0) * 1e-3;
            blk[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        }
        let mut deq = vec![0f32; out * inp];
        crate::iq4::dequantize_xs(&blocks, &mut deq);
        (blocks, deq)
    }

    /// A `kind` weight quantized by candle, and candle's dequantization of it.
    pub(super) fn quantized(
        dtype: GgmlDType,
        out: usize,
        inp: usize,
        seed: usize,
    ) -> (Vec<u8>, Vec<f32>) {
        // Rows of different magnitudes and offsets, so that scales and mins
        // differ between rows and sub-blocks.
        let w: Vec<f32> = (0..out * inp)
            .map(|i| {
                let h = (i * 2654435761 + seed * 40503) % 10007;
                let (row, sub) = (i / inp, i % inp / 16);
                (h as f32 / 10007.0 - 0.5) * (1.0 + (row % 7) as f32) * (1.0 + (sub % 5) as f32)
                    + 0.1 * (row % 3) as f32
            })
            .collect();
        let t = Tensor::from_vec(w, (out, inp), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, dtype).unwrap();
        let deq = q.dequantize(&Device::Cpu).unwrap();
        let deq = deq.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        (q.data().unwrap().into_owned(), deq)
    }

    pub(super) fn naive(x: &[f32], w: &[f32], rows: usize, inp: usize, out: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * out];
        for r in 0..rows {
            for o in 0..out {
                y[r * out + o] = (0..inp).map(|k| x[r * inp + k] * w[o * inp + k]).sum();
            }
        }
        y
    }

    fn input(rows: usize, inp: usize) -> Vec<f32> {
        (0..rows * inp)
            .map(|i| ((i * 7) % 13) as f32 * 0.25 - 1.5)
            .collect()
    }

    /// Max |a - b| relative to max |b|, and the index of the worst cell.
    pub(super) fn rel_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / scale)
            .enumerate()
            .fold((0.0, 0), |m, (i, d)| if d > m.0 { (d, i) } else { m })
    }

    /// Every ISA's product of `p` against the naive product with `deq`.
    fn check_product(p: &PackedKQuant, deq: &[f32], rows: usize) {
        let (inp, out) = (p.in_dim(), p.out_dim());
        let x = input(rows, inp);
        let e = naive(&x, deq, rows, inp, out);
        // The f32 rebuild: different summation orders of the same f32
        // products. The integer products: activations rounded to 8 bits
        // (see `INT_TOL_DEQ`).
        let tol = if p.layout == Layout::Integer {
            INT_TOL_DEQ
        } else {
            1e-5
        };
        for isa in crate::kernel_reference::isas_checked(module_path!()) {
            let mut y = vec![f32::NAN; 3];
            p.product(isa, &x, rows, &mut y);
            assert_eq!(y.len(), e.len());
            let (d, i) = rel_diff(&y, &e);
            assert!(
                d < tol,
                "{isa:?} {:?} [{rows}x{inp}x{out}] cell {i}: {} vs {} (rel {d})",
                p.kind(),
                y[i],
                e[i]
            );
        }
    }

    fn check(rows: usize, inp: usize, out: usize) {
        for kind in KINDS {
            let (blocks, deq) = weight(kind, out, inp, rows);
            let p = PackedKQuant::from_blocks(kind, &blocks, out, inp).unwrap();
            assert_eq!(p.dequantize(), deq, "{kind:?}: candle's dequantization");
            check_product(&p, &deq, rows);
        }
    }

    #[test]
    fn matches_candle_dequantized_product() {
        // The row counts, out not a multiple of a panel (or group).
        for rows in [1, 3, 8, 33, 128] {
            check(rows, 256, 61);
        }
        for rows in 1..=7 {
            check(rows, 512, 40);
        }
    }

    #[test]
    fn matches_candle_dequantized_product_in_parallel() {
        // Above the threshold: split across tasks and row blocks.
        check(1, 1024, 1100);
        check(8, 512, 300);
        check(128, 256, 80);
    }

    #[test]
    fn stacked_parts_are_the_rows_one_after_the_other() {
        // Fused q/k/v: part sizes not multiples of a panel (rows repacked),
        // then whole panels but the last (panels concatenated).
        for sizes in [[(24, 1), (8, 2), (37, 3)], [(32, 1), (16, 2), (37, 3)]] {
            for kind in KINDS {
                let parts: Vec<(Vec<u8>, Vec<f32>, usize)> = sizes
                    .into_iter()
                    .map(|(out, seed)| {
                        let (b, d) = weight(kind, out, 512, seed);
                        (b, d, out)
                    })
                    .collect();
                let packed: Vec<PackedKQuant> = parts
                    .iter()
                    .map(|(b, _, out)| PackedKQuant::from_blocks(kind, b, *out, 512).unwrap())
                    .collect();
                let s = PackedKQuant::stack(&packed.iter().collect::<Vec<_>>()).unwrap();
                let deq: Vec<f32> = parts.iter().flat_map(|(_, d, _)| d.clone()).collect();
                let out: usize = sizes.iter().map(|(out, _)| out).sum();
                assert_eq!(s.out_dim(), out);
                assert_eq!(s.dequantize(), deq, "{kind:?} {sizes:?}");
                check_product(&s, &deq, 5);
            }
        }
        let (b4, _) = quantized(GgmlDType::Q4K, 16, 256, 0);
        let (b6, _) = quantized(GgmlDType::Q6K, 16, 256, 0);
        let q4 = PackedKQuant::from_blocks(KQuant::Q4K, &b4, 16, 256).unwrap();
        let q6 = PackedKQuant::from_blocks(KQuant::Q6K, &b6, 16, 256).unwrap();
        assert!(PackedKQuant::stack(&[&q4, &q6]).is_none(), "mixed kinds");
    }

    #[test]
    fn one_corrupt_block_changes_exactly_its_outputs() {
        // Raising one sub-block's scale (row 19, super-block 1, sub-block 3)
        // must move output column 19 and nothing else.
        let (rows, inp, out) = (3, 512, 40);
        for kind in KINDS {
            let (mut blocks, deq) = weight(kind, out, inp, 0);
            let at = (19 * inp / QK_K + 1) * kind.block_bytes();
            let blk = &mut blocks[at..at + kind.block_bytes()];
            match kind {
                // Sub-block 3's 6-bit scale is the low bits of scales[3].
                KQuant::Q4K | KQuant::Q5K => blk[4 + 3] ^= 0x10,
                KQuant::Q6K => blk[192 + 3] = blk[192 + 3].wrapping_add(9),
                // Sub-block 3's low 4 scale bits are the high nibble of
                // scales_l[1].
                KQuant::Iq4Xs => blk[4 + 1] ^= 0x10,
            }
            let p = PackedKQuant::from_blocks(kind, &blocks, out, inp).unwrap();
            let (clean, _) = weight(kind, out, inp, 0);
            let clean = PackedKQuant::from_blocks(kind, &clean, out, inp).unwrap();
            assert_ne!(p.dequantize(), deq, "{kind:?}: the corruption shows");
            let x = input(rows, inp);
            for isa in crate::kernel_reference::isas_checked(module_path!()) {
                let (mut y, mut e) = (Vec::new(), Vec::new());
                p.product(isa, &x, rows, &mut y);
                // The same kernel on the clean weight: other columns equal
                // to the bit.
                clean.product(isa, &x, rows, &mut e);
                for (i, (a, b)) in y.iter().zip(&e).enumerate() {
                    let moved = a != b;
                    assert_eq!(
                        moved,
                        i % out == 19,
                        "{isa:?} {kind:?} cell {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// The integer products against the dequantized f32 product: each
    /// activation is rounded to 8 bits (an error of up to half a step,
    /// amax/254, per value), which on these weights (large per-row offsets
    /// that cancel) moves a product by up to 1.1 % of max |y| (measured
    /// 1.08e-2 at most).
    pub(super) const INT_TOL_DEQ: f32 = 2e-2;

    #[test]
    fn integer_layout_bytes() {
        // Q4_K: 0.5 byte of quants + 2 int8 per 32 + 2 f32 per 256, as
        // before; Q6_K: 1 byte + 1 int8 per 16 + 1 f32 per 256.
        // IQ4_XS: Q4_K's without the mins.
        for (kind, per_weight) in [
            (KQuant::Q4K, 0.59375),
            (KQuant::Q6K, 1.078125),
            (KQuant::Iq4Xs, 0.546875),
        ] {
            let (b, deq) = weight(kind, 20, 512, 0);
            let p = PackedKQuant::from_blocks(kind, &b, 20, 512).unwrap();
            assert_eq!(kind.packed_bytes_per_weight(), per_weight);
            // Two panels (32 rows, padded).
            assert_eq!(p.size_bytes() as f64, 32.0 * 512.0 * per_weight, "{kind:?}");
            assert_eq!(p.dequantize(), deq, "{kind:?} round trip");
            let r = PackedKQuant::from_blocks_rebuild(kind, &b, 20, 512).unwrap();
            assert!(r.layout == Layout::Dequantized);
            assert_eq!(r.size_bytes(), p.size_bytes());
        }
    }

    #[test]
    fn layout_bytes() {
        // Q4_K: 0.5 byte of quants + 2 int8 per 32 + 2 f32 per 256.
        assert_eq!(KQuant::Q4K.packed_bytes_per_weight(), 0.59375);
        assert_eq!(KQuant::Q5K.packed_bytes_per_weight(), 0.71875);
        assert_eq!(KQuant::Q6K.packed_bytes_per_weight(), 1.078125);
        let (b, _) = quantized(GgmlDType::Q4K, 20, 512, 0);
        let p = PackedKQuant::from_blocks(KQuant::Q4K, &b, 20, 512).unwrap();
        // Two panels (32 rows, padded).
        assert_eq!(p.size_bytes(), 32 * 512 * 19 / 32);
    }

    #[test]
    fn bad_blocks_are_errors() {
        let e = PackedKQuant::from_blocks(KQuant::Q4K, &[0; 144], 1, 128).unwrap_err();
        assert!(
            e.to_string().contains("not a positive multiple of 256"),
            "{e}"
        );
        let e = PackedKQuant::from_blocks(KQuant::Q6K, &[], 4, 0).unwrap_err();
        assert!(e.to_string().contains("not a positive multiple"), "{e}");
        let e = PackedKQuant::from_blocks(KQuant::Q6K, &[0; 209], 1, 256).unwrap_err();
        assert!(
            e.to_string().contains("holds 209 bytes, expected 210"),
            "{e}"
        );
    }
}
