//! Dense weights packed for the products a decode step does: `y = x Wᵀ`
//! with a few to a few hundred rows of `x`.
//!
//! `W` (`[out][in]`, row-major as checkpoints store it) is kept as panels of
//! `LANES` (16) output rows interleaved along `in` — `[out / LANES][in][LANES]`
//! — so the kernel reads each panel as one sequential stream and multiplies
//! a vector of `LANES` weights by one broadcast element of `x`, accumulating
//! a tile of `MR` rows × `NV` panels in registers (a BLIS-style
//! micro-kernel without packing `x`, which is small). The same layout serves
//! batch 1 — where the product is bound by reading the weights once — and
//! batch 32, where it is bound by the multiply-adds; a general GEMM spends
//! much of such small products packing its operands.
//!
//! - `tiling`: what every packed product (dense, Q8_0, K-quant) shares:
//!   the panel width, how a product is cut into tasks and register tiles,
//!   and the output the tiles store into;
//! - `dense`: the weight itself: storage types, packing, unpacking;
//! - `tiles`: the plain register tiles, any rows on any ISA (with
//!   `kernels_avx2` and `kernels_avx512`, the per-ISA micro-kernels);
//! - `row`: AVX2 at one row (decode at batch 1);
//! - `blocked`: AVX2 from `BLOCKED_MIN_ROWS` (8) rows, with the inner
//!   dimension blocked for L1.
//!
//! [`PackedWeight::matmul_into`] picks the path.

#[cfg(target_arch = "x86_64")]
mod blocked;
mod dense;
#[cfg(target_arch = "x86_64")]
mod kernels_avx2;
#[cfg(target_arch = "x86_64")]
mod kernels_avx512;
#[cfg(target_arch = "x86_64")]
mod row;
mod tiles;
pub(crate) mod tiling;

pub use dense::{PackedWeight, WeightDtype, to_bf16};

use crate::isa::Isa;
#[cfg(target_arch = "x86_64")]
use crate::isa::IsaKind;
use tiling::shape_output;

impl PackedWeight {
    /// `x` is `[rows][in]`; returns `x Wᵀ`, `[rows][out]`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = Vec::new();
        self.matmul_into(x, rows, &mut y);
        y
    }

    /// [`PackedWeight::matmul`] into `y` (resized to `[rows][out]`), so that
    /// a step reuses its buffers.
    pub fn matmul_into(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        self.product(Isa::detect(), x, rows, y);
    }

    /// [`PackedWeight::matmul_into`] with the plain register tiles whatever
    /// the rows (no blocked path, no one-row kernel): the benchmarks
    /// compare them.
    #[doc(hidden)]
    pub fn matmul_plain_into(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        if shape_output(x, rows, (self.inp, self.out), y) {
            self.product_tiles(Isa::detect(), x, rows, y);
        }
    }

    /// The product with the kernels of `isa` (tests run each one the CPU has).
    fn product(&self, isa: Isa, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        // Every cell is written below: no need to clear what was there.
        if !shape_output(x, rows, (self.inp, self.out), y) {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa.kind() == IsaKind::Avx2 && rows >= blocked::BLOCKED_MIN_ROWS {
            return self.product_blocked(isa, x, rows, y);
        }
        #[cfg(target_arch = "x86_64")]
        if isa.kind() == IsaKind::Avx2 && rows == 1 {
            return self.product_row(x, y);
        }
        self.product_tiles(isa, x, rows, y);
    }
}

#[cfg(test)]
mod tests {
    use super::dense::Elem;
    use super::tiling::LANES;
    use super::*;
    use half::f16;

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
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16] {
            // What the packed weight holds: bf16 and f16 round each value.
            let held: Vec<f32> = match dtype {
                WeightDtype::F32 => w.clone(),
                WeightDtype::Bf16 => w.iter().map(|&v| to_bf16(v).widen()).collect(),
                WeightDtype::F16 => w.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
            };
            let p = PackedWeight::pack_as(&w, out, inp, dtype);
            assert_eq!(p.dtype(), dtype);
            assert_eq!(p.unpack(), held, "pack/unpack round trip");
            let e = naive(&x, &held, rows, inp, out);
            for isa in crate::kernel_reference::isas_checked(module_path!()) {
                let mut y = vec![f32::NAN; 3];
                p.product(isa, &x, rows, &mut y);
                assert_eq!(y.len(), e.len());
                for (i, (a, b)) in y.iter().zip(&e).enumerate() {
                    assert!(
                        (a - b).abs() < 1e-3,
                        "{isa:?} {dtype:?} [{rows}x{inp}x{out}] {i}: {a} vs {b}"
                    );
                }
            }
            assert_eq!(p.matmul(&x, rows).len(), e.len());
        }
    }

    #[test]
    fn f16_weights_are_kept_and_widened_exactly() {
        // Halves across the range (subnormal, fractional, near the largest
        // finite), from bits as a GGUF F16 tensor holds them: unpacked and
        // multiplied, each is its exact f32 value, on every ISA, for every
        // row count a tile handles, serial and parallel.
        let bits = [
            0x0001u16, 0x3555, 0xb4cd, 0x7bff, 0xfbfe, 0x0400, 0x3c00, 0xc2d3, 0x1234,
        ];
        for (rows, inp, out) in [
            (1, 37, 61),
            (7, 9, 200),
            (13, 37, 61),
            (14, 8, 33),
            (3, 600, 700),
        ] {
            let w: Vec<f16> = (0..out * inp)
                .map(|i| f16::from_bits(bits[(i * 7) % bits.len()]))
                .collect();
            let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
            assert_eq!(wf[0], 5.960_464_5e-8, "the smallest subnormal half");
            let p = PackedWeight::pack_f16(&w, out, inp);
            assert_eq!(p.dtype(), WeightDtype::F16);
            assert_eq!(p.size_bytes(), out.div_ceil(LANES) * LANES * inp * 2);
            assert_eq!(p.unpack(), wf, "the halves, widened exactly");
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 3) % 7) as f32 * 0.25 - 0.75)
                .collect();
            let e = naive(&x, &wf, rows, inp, out);
            let scale = e.iter().fold(1f32, |m, v| m.max(v.abs()));
            for isa in crate::kernel_reference::isas_checked(module_path!()) {
                let mut y = Vec::new();
                p.product(isa, &x, rows, &mut y);
                for (i, (a, b)) in y.iter().zip(&e).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale,
                        "{isa:?} [{rows}x{inp}x{out}] {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn matches_naive_product_for_every_tile_shape() {
        // Every row count up to several tiles, out not a multiple of the
        // panel width or of a panel group, inp odd.
        for rows in 1..=14 {
            check(rows, 37, 61);
            check(rows, 9, 200);
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

    /// `x` (`rows` × `inp`) times `w` (`out` × `inp`) through `product`
    /// (the path under test: blocked or one-row, by `rows`) against the
    /// plain tiles, bit for bit (the same f32 sums in the same order), and
    /// against the naive product, for f32, f16 and bf16 weights.
    pub(super) fn assert_plain_tiles_sums(isa: Isa, rows: usize, inp: usize, out: usize) {
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 7) % 13) as f32 * 0.37 - 2.1)
            .collect();
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 5) % 11) as f32 * 0.13 - 0.6)
            .collect();
        for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
            let p = PackedWeight::pack_as(&w, out, inp, dtype);
            let e = naive(&x, &p.unpack(), rows, inp, out);
            let mut fast = vec![f32::NAN; 5];
            p.product(isa, &x, rows, &mut fast);
            let mut plain = vec![f32::NAN; rows * out];
            p.product_tiles(isa, &x, rows, &mut plain);
            assert_eq!(fast.len(), rows * out);
            for (i, ((a, b), c)) in fast.iter().zip(&plain).zip(&e).enumerate() {
                let at = format!("{dtype:?} [{rows}x{inp}x{out}] {i}");
                assert_eq!(a.to_bits(), b.to_bits(), "{at}: {a} vs plain {b}");
                assert!((a - c).abs() <= 1e-4 * c.abs().max(1.0), "{at}: {a} vs {c}");
            }
        }
    }

    #[test]
    fn empty_shapes() {
        let p = PackedWeight::pack(&[], 0, 4);
        assert!(p.matmul(&[1.0; 8], 2).is_empty());
        let p = PackedWeight::pack(&[1.0; 8], 2, 4);
        assert!(p.matmul(&[], 0).is_empty());
    }
}
