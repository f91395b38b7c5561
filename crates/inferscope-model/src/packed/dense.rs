//! Dense weights (f32, bf16, f16) in panel layout: the storage, packing
//! and unpacking, the element types the kernels widen, and the operands of
//! one register tile.

use std::ops::Range;
use std::sync::Arc;

use half::f16;
use memmap2::Mmap;

use super::tiling::{LANES, TileSums, TiledOutput};
use crate::panel_data::PanelData;

/// How a packed weight's elements are stored (the products are f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    /// 4 bytes per weight.
    F32,
    /// bfloat16, 2 bytes per weight: half the memory and half the bytes
    /// read per decode step; widened to f32 as it is loaded.
    Bf16,
    /// IEEE half precision, 2 bytes per weight (GGUF's F16): widened to f32
    /// exactly as it is loaded (F16C `vcvtph2ps` on x86).
    F16,
}

/// The panels, `[panels][inp][LANES]`, in one of the storage types.
#[derive(Clone)]
pub(super) enum Panels {
    F32(PanelData<f32>),
    Bf16(PanelData<u16>),
    F16(PanelData<f16>),
}

/// A run of panels borrowed for a tile.
#[derive(Clone, Copy)]
pub(super) enum PanelSlice<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    F16(&'a [f16]),
}

impl PanelSlice<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Self::F32(w) => w.len(),
            Self::Bf16(w) => w.len(),
            Self::F16(w) => w.len(),
        }
    }
}

impl Panels {
    pub(super) fn slice(&self, r: Range<usize>) -> PanelSlice<'_> {
        match self {
            Self::F32(w) => PanelSlice::F32(&w[r]),
            Self::Bf16(w) => PanelSlice::Bf16(&w[r]),
            Self::F16(w) => PanelSlice::F16(&w[r]),
        }
    }

    pub(super) fn get(&self, i: usize) -> f32 {
        match self {
            Self::F32(w) => w[i],
            Self::Bf16(w) => w[i].widen(),
            Self::F16(w) => w[i].widen(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Panels {
    /// The address of element `at` and the bytes of `len` elements from it
    /// (for prefetching; never read through).
    pub(super) fn bytes_at(&self, at: usize, len: usize) -> (*const u8, usize) {
        match self {
            Self::F32(w) => (w[at..].as_ptr().cast(), len * 4),
            Self::Bf16(w) => (w[at..].as_ptr().cast(), len * 2),
            Self::F16(w) => (w[at..].as_ptr().cast(), len * 2),
        }
    }
}

/// How a kernel widens a weight element to f32.
#[derive(PartialEq, Eq)]
pub(super) enum Widen {
    /// Already f32.
    None,
    /// bf16 bits, shifted into the high half of an f32.
    Bf16,
    /// IEEE half, converted (F16C on x86).
    F16,
}

/// A weight element the kernels read: f32, bf16 kept as its bits, or f16.
pub(super) trait Elem: Copy + Send + Sync {
    /// How it becomes f32.
    const WIDEN: Widen;
    /// The value as f32.
    fn widen(self) -> f32;
}

impl Elem for f32 {
    const WIDEN: Widen = Widen::None;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Elem for u16 {
    const WIDEN: Widen = Widen::Bf16;
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

impl Elem for f16 {
    const WIDEN: Widen = Widen::F16;
    #[inline(always)]
    fn widen(self) -> f32 {
        // Exact: every f16 is an f32.
        self.to_f32()
    }
}

/// `w` (`[out][inp]`, row-major) rearranged into panels, `[panels][inp][LANES]`,
/// the rows past `out` in the last panel zero.
fn panelize<T: Copy + Default>(w: &[T], out: usize, inp: usize) -> Vec<T> {
    assert_eq!(w.len(), out * inp, "weight is not [{out}][{inp}]");
    let panels = out.div_ceil(LANES);
    let mut data = vec![T::default(); panels * inp * LANES];
    for (o, row) in w.chunks_exact(inp.max(1)).enumerate().take(out) {
        let panel = &mut data[(o / LANES) * inp * LANES..][..inp * LANES];
        for (k, &v) in row.iter().enumerate() {
            panel[k * LANES + o % LANES] = v;
        }
    }
    data
}

/// `x` rounded to the nearest bfloat16 (ties to even), as its bits.
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        // Keep it a (quiet) NaN whatever its low bits were.
        return ((b >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// A dense `[out][in]` weight in panel layout.
#[derive(Clone)]
pub struct PackedWeight {
    /// `[panels][inp][LANES]`; rows past `out` in the last panel are zero.
    pub(super) data: Panels,
    pub(super) out: usize,
    pub(super) inp: usize,
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeight[{}, {}]", self.out, self.inp)
    }
}

impl PackedWeight {
    /// Packs a row-major `[out][inp]` matrix, kept in f32.
    pub fn pack(w: &[f32], out: usize, inp: usize) -> Self {
        Self::pack_as(w, out, inp, WeightDtype::F32)
    }

    /// Packs a row-major `[out][inp]` matrix, stored as `dtype`.
    /// F16 rounds to nearest even (`half`), as bf16 does.
    pub fn pack_as(w: &[f32], out: usize, inp: usize, dtype: WeightDtype) -> Self {
        let data = panelize(w, out, inp);
        let data = match dtype {
            WeightDtype::F32 => Panels::F32(data.into()),
            WeightDtype::Bf16 => {
                Panels::Bf16(data.into_iter().map(to_bf16).collect::<Vec<_>>().into())
            }
            WeightDtype::F16 => Panels::F16(
                data.into_iter()
                    .map(f16::from_f32)
                    .collect::<Vec<_>>()
                    .into(),
            ),
        };
        Self { data, out, inp }
    }

    /// Packs a row-major `[out][inp]` matrix of IEEE halves as they are
    /// (GGUF F16: no round trip through f32).
    pub fn pack_f16(w: &[f16], out: usize, inp: usize) -> Self {
        let data = Panels::F16(panelize(w, out, inp).into());
        Self { data, out, inp }
    }

    /// Packs a row-major `[out][inp]` matrix of bfloat16 bits as they are
    /// (GGUF BF16).
    pub fn pack_bf16(w: &[u16], out: usize, inp: usize) -> Self {
        let data = Panels::Bf16(panelize(w, out, inp).into());
        Self { data, out, inp }
    }

    /// How the weights are stored.
    pub fn dtype(&self) -> WeightDtype {
        match self.data {
            Panels::F32(_) => WeightDtype::F32,
            Panels::Bf16(_) => WeightDtype::Bf16,
            Panels::F16(_) => WeightDtype::F16,
        }
    }

    /// Bytes the weights occupy.
    pub fn size_bytes(&self) -> usize {
        match &self.data {
            Panels::F32(w) => w.len() * 4,
            Panels::Bf16(w) => w.len() * 2,
            Panels::F16(w) => w.len() * 2,
        }
    }

    /// The panels as bytes (the packed-weights cache saves them).
    pub(crate) fn panel_bytes(&self) -> &[u8] {
        match &self.data {
            Panels::F32(w) => w.as_bytes(),
            Panels::Bf16(w) => w.as_bytes(),
            Panels::F16(w) => w.as_bytes(),
        }
    }

    /// A `[out, inp]` weight stored as `dtype`, read in place from bytes
    /// `at` of `map` as [`PackedWeight::panel_bytes`] gave them; `None`
    /// when `at` is not the length those dimensions take, lies outside the
    /// map or is misaligned.
    pub(crate) fn from_mapped(
        dtype: WeightDtype,
        out: usize,
        inp: usize,
        map: &Arc<Mmap>,
        at: Range<usize>,
    ) -> Option<Self> {
        let len = out.div_ceil(LANES) * inp * LANES;
        let width = if dtype == WeightDtype::F32 { 4 } else { 2 };
        if at.len() != len * width {
            return None;
        }
        let data = match dtype {
            WeightDtype::F32 => Panels::F32(PanelData::mapped(map.clone(), at.start, len)?),
            WeightDtype::Bf16 => Panels::Bf16(PanelData::mapped(map.clone(), at.start, len)?),
            WeightDtype::F16 => Panels::F16(PanelData::mapped(map.clone(), at.start, len)?),
        };
        Some(Self { data, out, inp })
    }

    /// Whether its panels are read in place from a mapped file.
    pub fn is_mapped(&self) -> bool {
        match &self.data {
            Panels::F32(w) => w.is_mapped(),
            Panels::Bf16(w) => w.is_mapped(),
            Panels::F16(w) => w.is_mapped(),
        }
    }

    /// The row-major `[out][inp]` matrix back (bf16/f16 widened to f32).
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out * self.inp];
        for (o, row) in w
            .chunks_exact_mut(self.inp.max(1))
            .enumerate()
            .take(self.out)
        {
            let panel = (o / LANES) * self.inp * LANES;
            for (k, v) in row.iter_mut().enumerate() {
                *v = self.data.get(panel + k * LANES + o % LANES);
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
}

/// One register tile's operands.
pub(super) struct Tile<'a> {
    /// The tile's panels, `[np][inp][LANES]`.
    pub(super) w: PanelSlice<'a>,
    /// Its rows of `x`, `[mr][inp]`.
    pub(super) x: &'a [f32],
    pub(super) inp: usize,
    pub(super) row0: usize,
    pub(super) col0: usize,
}

impl Tile<'_> {
    /// Panels present (the last group of a matrix may have fewer than NV).
    pub(super) fn panels(&self) -> usize {
        self.w.len() / (self.inp * LANES).max(1)
    }

    /// Checks the bounds the unchecked kernels rely on; returns the panels
    /// present.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn checked_panels<const MR: usize, const NV: usize>(&self) -> usize {
        let np = self.panels().min(NV);
        assert!(self.x.len() >= MR * self.inp && self.w.len() >= np * self.inp * LANES);
        np
    }

    /// Stores the tile's sums at its place, dropping padding columns.
    pub(super) fn store<const MR: usize, const NV: usize>(
        &self,
        out: &TiledOutput,
        acc: &TileSums<MR, NV>,
    ) {
        out.store_at(self.row0, self.col0, self.panels(), acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(to_bf16(-2.0), 0xc000);
        // 1 + 2⁻⁸ is halfway between 1 and the next bf16: ties go to even (1).
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2⁻⁸ is halfway to an odd neighbour: rounds up to even.
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(to_bf16(f32::INFINITY), 0x7f80);
        assert!(to_bf16(f32::NAN).widen().is_nan());
        // Rounding the largest finite f32 overflows to infinity, as it should.
        assert_eq!(to_bf16(f32::MAX), 0x7f80);
        let p = PackedWeight::pack_as(&[0.1; 64], 4, 16, WeightDtype::Bf16);
        assert_eq!(
            p.size_bytes(),
            16 * 16 * 2,
            "one panel of 16 rows, 2 bytes each"
        );
    }
}
