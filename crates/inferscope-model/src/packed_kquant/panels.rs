//! The two panel layouts of a K-quant weight, and where each value lies in
//! them. Both keep the dense kernels' panels of [`LANES`] output rows
//! interleaved along `in`, with the same arrays of the same sizes
//! ([`KPanels`]); they differ in how the quants and the sub-block scales are
//! ordered inside a panel.
//!
//! [`Layout::Dequantized`] (Q5_K; any kind on request), per panel:
//!
//! - quants `[in][bpk]` bytes: Q4_K two 4-bit values per byte (row `l` in
//!   the low nibble of byte `l`, row `l + 8` in the high one: 8 bytes per
//!   `in` element, 0.5 byte per weight, as in the file); Q5_K the same
//!   nibbles plus the 16 rows' fifth bits in 2 bytes; Q6_K `q − 32` as int8
//!   (1 byte per weight: unpacking 6 bits costs more instructions than the
//!   0.18 byte per weight it would save);
//! - sub-block scales (and mins) `[in / sub][LANES]` int8.
//!
//! [`Layout::Integer`] (Q4_K, Q6_K, IQ4_XS), per panel and super-block (`pb =
//! panel · nsb + super-block`):
//!
//! - quants `[pb][group of 4 in][32 bytes]` (Q4_K, and IQ4_XS's table
//!   indices) — byte `4r + j` holds
//!   row `r`'s quant of element `j` of the group in its low nibble and row
//!   `r + 8`'s in its high one (2048 bytes, 0.5 byte per weight) — or
//!   `[pb][group][half][32 bytes]` (Q6_K, `q` as 0..64 in a byte, byte
//!   `4r + j` of half `h` is row `8h + r`; 1 byte per weight): one 32-byte
//!   load is 8 rows × 4 consecutive elements, the operand of `maddubs`
//!   against the 4 activations broadcast. (Q6_K kept in 6 bits, 0.75 byte,
//!   unpacked in registers, made decode steps 4–7 % slower here: the
//!   unpacking costs more than the bytes it saves; docs/results/cpu-executor.md.)
//! - sub-block scales (and Q4_K's mins) `[pb][pair][LANES][2]` int8: two
//!   consecutive sub-blocks' values per row side by side, so one widening
//!   load is the operand of `madd` against two `bsums` (and a byte shuffle
//!   gives one sub-block's per row, each twice, for the int16 sums).
//!
//! In both, super-block `d` (and `dmin`) are `[in / 256][LANES]` f32 per
//! panel (the f16 widened), and rows past `out` in the last panel are 0.

use std::ops::Range;

use rayon::prelude::*;

use super::format::{Block, IQ4, KQuant, Q4, Q5, Q6, QK_K, Rows};
use crate::packed::tiling::LANES;
use crate::panel_data::PanelData;

/// How a K-quant weight's panels are laid out, and so which product runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// For products that rebuild the dequantized weights in f32.
    Dequantized,
    /// For integer products with Q8_K activations (Q4_K and Q6_K).
    Integer,
}

impl KQuant {
    /// The layout its products use: integer dot products with Q8_K
    /// activations for Q4_K and Q6_K, f32 weights rebuilt for Q5_K.
    pub(super) const fn layout(self) -> Layout {
        match self {
            Self::Q4K | Self::Q6K | Self::Iq4Xs => Layout::Integer,
            Self::Q5K => Layout::Dequantized,
        }
    }

    /// Bytes of quants per element of `in` in a panel (either layout).
    pub(super) const fn bpk(self) -> usize {
        match self {
            Self::Q4K | Self::Iq4Xs => 8,
            Self::Q5K => 10,
            Self::Q6K => 16,
        }
    }

    /// Bytes per weight the panels store (quants, scales, mins, `d`s), in
    /// either layout.
    pub fn packed_bytes_per_weight(self) -> f64 {
        let mins = if self.has_min() { 2.0 } else { 1.0 };
        self.bpk() as f64 / LANES as f64 + mins / self.sub() as f64 + 4.0 * mins / QK_K as f64
    }

    /// Bytes of quants per super-block of a panel in the integer layout.
    pub(super) const fn int_sb_bytes(self) -> usize {
        QK_K * self.bpk()
    }

    /// Sub-block scales per super-block, as pairs.
    pub(super) const fn pairs(self) -> usize {
        QK_K / self.sub() / 2
    }
}

/// A K-quant weight's panels, in either [`Layout`]: per panel `inp · bpk`
/// bytes of quants, `inp / sub · LANES` scales (and mins), `inp / 256 ·
/// LANES` super-block scales (and min scales).
#[derive(Clone)]
pub(super) struct KPanels {
    /// `[panels][inp · bpk]` quants.
    pub(super) qs: PanelData<u8>,
    /// `[panels][inp / sub · LANES]` sub-block scales.
    pub(super) sc: PanelData<i8>,
    /// Sub-block mins, as `sc` (empty for Q6_K).
    pub(super) mn: PanelData<i8>,
    /// `[panels][inp / 256][LANES]` super-block scales (0 past `out`).
    pub(super) d: PanelData<f32>,
    /// Super-block min scales, as `d` (empty for Q6_K).
    pub(super) dmin: PanelData<f32>,
}

/// A run of panels of a [`KPanels`], borrowed for a register tile.
#[derive(Clone, Copy)]
pub(super) struct PanelRun<'a> {
    /// The panels' quants, `[np][inp · bpk]`.
    pub(super) qs: &'a [u8],
    /// Their sub-block scales, `[np][inp / sub · LANES]`.
    pub(super) sc: &'a [i8],
    /// Their sub-block mins, as `sc` (empty for Q6_K).
    pub(super) mn: &'a [i8],
    /// Their super-block scales, `[np][inp / 256][LANES]`.
    pub(super) d: &'a [f32],
    /// Their super-block min scales, as `d` (empty for Q6_K).
    pub(super) dmin: &'a [f32],
}

/// Each panel's lengths of the quants, the scales and the `d`s.
fn panel_lens(kind: KQuant, inp: usize) -> (usize, usize, usize) {
    (
        inp * kind.bpk(),
        inp / kind.sub() * LANES,
        inp / QK_K * LANES,
    )
}

impl KPanels {
    /// The lengths of the five arrays of `[out][inp]`: quants, scales,
    /// mins, `d`s and min scales.
    pub(super) fn zeroed_lens(kind: KQuant, out: usize, inp: usize) -> [usize; 5] {
        let panels = out.div_ceil(LANES);
        let (q, s, d) = panel_lens(kind, inp);
        let mins = usize::from(kind.has_min());
        [
            panels * q,
            panels * s,
            mins * panels * s,
            panels * d,
            mins * panels * d,
        ]
    }

    /// Panels for `[out][inp]` of zeros.
    fn zeroed(kind: KQuant, out: usize, inp: usize) -> Self {
        let [q, s, m, d, dm] = Self::zeroed_lens(kind, out, inp);
        Self {
            qs: vec![0; q].into(),
            sc: vec![0; s].into(),
            mn: vec![0; m].into(),
            d: vec![0.0; d].into(),
            dmin: vec![0.0; dm].into(),
        }
    }

    /// Packs unpacked rows into panels laid out as `layout` (fused parts
    /// that end inside a panel; loading uses [`KPanels::from_blocks`]). The
    /// panels are independent, so their quants (all but a few percent of
    /// the bytes) are packed in parallel.
    pub(super) fn pack(layout: Layout, kind: KQuant, r: &Rows, out: usize, inp: usize) -> Self {
        let mut k = Self::zeroed(kind, out, inp);
        let ((lq, ls, ld), nsub, nsb) = (panel_lens(kind, inp), inp / kind.sub(), inp / QK_K);
        k.qs.par_chunks_mut(lq)
            .zip(r.q.par_chunks(LANES * inp))
            .for_each(|(qs, rows)| {
                for (l, row) in rows.chunks_exact(inp).enumerate() {
                    layout.put_row(kind, qs, l, row);
                }
            });
        for o in 0..out {
            let (p, l) = (o / LANES, o % LANES);
            for j in 0..nsub {
                let at = p * ls + layout.scale_at(l, j);
                k.sc[at] = r.sc[o * nsub + j];
                if kind.has_min() {
                    k.mn[at] = r.mn[o * nsub + j];
                }
            }
            for b in 0..nsb {
                let at = p * ld + b * LANES + l;
                k.d[at] = r.d[o * nsb + b];
                if kind.has_min() {
                    k.dmin[at] = r.dmin[o * nsb + b];
                }
            }
        }
        k
    }

    /// Decodes the GGUF blocks of row-major `[out][inp]` matrices, `parts`
    /// stacked along `out` (fused projections: every part but the last
    /// fills its panels), straight into panels laid out as `layout`: each
    /// block is unpacked on the stack and placed, one parallel task per
    /// panel, so no row-major copy of the weight is made and fused parts are
    /// not copied again (loading a model is mostly this; a restart repeats
    /// it from the page cache). The parts hold `out · inp / 256` blocks.
    pub(super) fn from_blocks(
        layout: Layout,
        kind: KQuant,
        parts: &[&[u8]],
        out: usize,
        inp: usize,
    ) -> Self {
        let mut k = Self::zeroed(kind, out, inp);
        let ((lq, ls, ld), nsb) = (panel_lens(kind, inp), inp / QK_K);
        let (row_bytes, per) = (nsb * kind.block_bytes(), QK_K / kind.sub());
        // Q6_K has no mins: one empty slice per panel stands for them.
        fn split<T>(v: &mut [T], len: usize, n: usize) -> Vec<&mut [T]> {
            if v.is_empty() {
                (0..n).map(|_| <&mut [T]>::default()).collect()
            } else {
                v.chunks_mut(len).collect()
            }
        }
        let panels = out.div_ceil(LANES);
        let sources: Vec<&[u8]> = parts
            .iter()
            .flat_map(|data| data.chunks(LANES * row_bytes))
            .collect();
        assert_eq!(
            sources.len(),
            panels,
            "every fused part but the last fills its panels"
        );
        let tasks: Vec<_> =
            k.qs.chunks_mut(lq)
                .zip(k.sc.chunks_mut(ls))
                .zip(split(&mut k.mn, ls, panels))
                .zip(k.d.chunks_mut(ld))
                .zip(split(&mut k.dmin, ld, panels))
                .zip(sources)
                .collect();
        tasks
            .into_par_iter()
            .for_each(|(((((qs, sc), mn), d), dmin), rows)| {
                let n = rows.len() / row_bytes;
                // The panel's quants of one super-block, row by row (4 KiB,
                // in L1); rows past `out` hold what packs to zero bytes.
                let pad = if kind == KQuant::Q6K { -32 } else { 0 };
                let mut tile = [[pad; QK_K]; LANES];
                let mut blk = Block::default();
                let bb = kind.block_bytes();
                for b in 0..nsb {
                    for (l, q) in tile.iter_mut().enumerate().take(n) {
                        blk.decode(kind, &rows[l * row_bytes + b * bb..][..bb], q);
                        d[b * LANES + l] = blk.d;
                        for (j, &s) in blk.sc[..per].iter().enumerate() {
                            sc[layout.scale_at(l, b * per + j)] = s;
                        }
                        if kind.has_min() {
                            dmin[b * LANES + l] = blk.dmin;
                            for (j, &m) in blk.mn[..per].iter().enumerate() {
                                mn[layout.scale_at(l, b * per + j)] = m;
                            }
                        }
                    }
                    layout.put_tile(kind, qs, b, &tile, n);
                }
            });
        k
    }

    /// `parts` one after the other along `out`, when every part but the
    /// last fills its panels (`out` a multiple of [`LANES`]): the panels
    /// then just follow each other. `None` otherwise.
    pub(super) fn concat(parts: &[(&Self, usize)]) -> Option<Self> {
        let (_, init) = parts.split_last()?;
        if init.iter().any(|(_, out)| !out.is_multiple_of(LANES)) {
            return None;
        }
        let mut k = Self {
            qs: PanelData::default(),
            sc: PanelData::default(),
            mn: PanelData::default(),
            d: PanelData::default(),
            dmin: PanelData::default(),
        };
        for (p, _) in parts {
            k.qs.to_mut().extend_from_slice(&p.qs);
            k.sc.to_mut().extend_from_slice(&p.sc);
            k.mn.to_mut().extend_from_slice(&p.mn);
            k.d.to_mut().extend_from_slice(&p.d);
            k.dmin.to_mut().extend_from_slice(&p.dmin);
        }
        Some(k)
    }

    /// The rows back from panels laid out as `layout`.
    pub(super) fn rows(&self, layout: Layout, kind: KQuant, out: usize, inp: usize) -> Rows {
        let mut r = Rows::zeroed(kind, out, inp);
        let ((lq, ls, ld), nsub, nsb) = (panel_lens(kind, inp), inp / kind.sub(), inp / QK_K);
        for o in 0..out {
            let (p, l) = (o / LANES, o % LANES);
            let qs = &self.qs[p * lq..][..lq];
            for (kk, q) in r.q[o * inp..][..inp].iter_mut().enumerate() {
                *q = layout.quant(kind, qs, l, kk);
            }
            for j in 0..nsub {
                let at = p * ls + layout.scale_at(l, j);
                r.sc[o * nsub + j] = self.sc[at];
                if kind.has_min() {
                    r.mn[o * nsub + j] = self.mn[at];
                }
            }
            for b in 0..nsb {
                let at = p * ld + b * LANES + l;
                r.d[o * nsb + b] = self.d[at];
                if kind.has_min() {
                    r.dmin[o * nsb + b] = self.dmin[at];
                }
            }
        }
        r
    }

    /// Bytes held.
    pub(super) fn size_bytes(&self) -> usize {
        self.qs.len() + self.sc.len() + self.mn.len() + 4 * (self.d.len() + self.dmin.len())
    }

    /// Panels `panels` of a weight of `kind` with input dimension `inp`.
    pub(super) fn run(&self, kind: KQuant, inp: usize, panels: Range<usize>) -> PanelRun<'_> {
        let (q, s, d) = panel_lens(kind, inp);
        let at = |len: usize| panels.start * len..panels.end * len;
        // Q6_K has no mins: its `mn` and `dmin` stay empty.
        fn part<T>(v: &[T], r: Range<usize>) -> &[T] {
            if v.is_empty() { v } else { &v[r] }
        }
        PanelRun {
            qs: &self.qs[at(q)],
            sc: &self.sc[at(s)],
            mn: part(&self.mn, at(s)),
            d: &self.d[at(d)],
            dmin: part(&self.dmin, at(d)),
        }
    }
}

impl Layout {
    /// Sets row `l`'s quants `row` (all `inp` of them) in a panel's quants
    /// `qs` (zero before).
    fn put_row(self, kind: KQuant, qs: &mut [u8], l: usize, row: &[i8]) {
        for (b, sb) in row.chunks_exact(QK_K).enumerate() {
            self.put_sb(kind, qs, l, b, sb);
        }
    }

    /// Sets row `l`'s quants `src` of super-block `b` in a panel's quants
    /// `qs` (zero before). The integer layouts, which the common kinds use,
    /// are written four bytes at a time; the rest value by value.
    #[inline]
    fn put_sb(self, kind: KQuant, qs: &mut [u8], l: usize, b: usize, src: &[i8]) {
        let (h, r) = (l / 8, l % 8);
        match (self, kind) {
            (Layout::Integer, KQuant::Q4K | KQuant::Iq4Xs) => {
                let dst = &mut qs[b * kind.int_sb_bytes()..][..kind.int_sb_bytes()];
                let shift = 4 * h;
                for (g, four) in src.chunks_exact(4).enumerate() {
                    let at = &mut dst[g * 32 + 4 * r..][..4];
                    for (b, &q) in at.iter_mut().zip(four) {
                        *b |= (q as u8 & 0xF) << shift;
                    }
                }
            }
            (Layout::Integer, KQuant::Q6K) => {
                let dst = &mut qs[b * kind.int_sb_bytes()..][..kind.int_sb_bytes()];
                for (g, four) in src.chunks_exact(4).enumerate() {
                    let at = &mut dst[(g * 2 + h) * 32 + 4 * r..][..4];
                    for (b, &q) in at.iter_mut().zip(four) {
                        // `q − 32` back to 0..64: unsigned for `maddubs`.
                        *b = (q + 32) as u8;
                    }
                }
            }
            _ => {
                for (i, &q) in src.iter().enumerate() {
                    self.put_quant(kind, qs, l, b * QK_K + i, q);
                }
            }
        }
    }

    /// Sets super-block `b`'s quants of a panel's `n` rows, `tile[l]` row
    /// `l`'s (rows `n..` hold values that pack to zero bytes), in the
    /// panel's quants `qs` (zero before). The integer layouts, which the
    /// common kinds use, write each byte once, in order.
    #[inline]
    fn put_tile(self, kind: KQuant, qs: &mut [u8], b: usize, tile: &[[i8; QK_K]; LANES], n: usize) {
        let sb = kind.int_sb_bytes();
        match (self, kind) {
            (Layout::Integer, KQuant::Q4K | KQuant::Iq4Xs) => {
                // Byte `4r + j` of group `g`: rows `r` and `r + 8`, element `4g + j`.
                for (g, dst) in qs[b * sb..][..sb].chunks_exact_mut(32).enumerate() {
                    for (r, four) in dst.chunks_exact_mut(4).enumerate() {
                        let lo = &tile[r][4 * g..][..4];
                        let hi = &tile[r + 8][4 * g..][..4];
                        for ((o, &a), &c) in four.iter_mut().zip(lo).zip(hi) {
                            *o = (a as u8 & 0xF) | ((c as u8 & 0xF) << 4);
                        }
                    }
                }
            }
            (Layout::Integer, KQuant::Q6K) => {
                // Half `h` of group `g`, byte `4r + j`: row `8h + r`, element `4g + j`.
                for (gh, dst) in qs[b * sb..][..sb].chunks_exact_mut(32).enumerate() {
                    let (g, h) = (gh / 2, gh % 2);
                    for (r, four) in dst.chunks_exact_mut(4).enumerate() {
                        for (o, &q) in four.iter_mut().zip(&tile[8 * h + r][4 * g..][..4]) {
                            // `q − 32` back to 0..64: unsigned for `maddubs`.
                            *o = (q + 32) as u8;
                        }
                    }
                }
            }
            _ => {
                for (l, row) in tile.iter().enumerate().take(n) {
                    self.put_sb(kind, qs, l, b, row);
                }
            }
        }
    }

    /// Sets row `l`'s quant `q` of element `kk` in a panel's quants `qs`
    /// (zero before).
    fn put_quant(self, kind: KQuant, qs: &mut [u8], l: usize, kk: usize, q: i8) {
        match self {
            Layout::Dequantized => {
                let bpk = kind.bpk();
                let dst = &mut qs[kk * bpk..][..bpk];
                match kind {
                    KQuant::Q4K | KQuant::Q5K | KQuant::Iq4Xs => {
                        dst[l % 8] |= (q as u8 & 0xF) << (4 * (l / 8));
                        if kind == KQuant::Q5K {
                            // Bit l of the u16 after the nibbles.
                            dst[8 + l / 8] |= (q as u8 >> 4) << (l % 8);
                        }
                    }
                    KQuant::Q6K => dst[l] = q as u8,
                }
            }
            Layout::Integer => {
                let (at, shift) = int_at(kind, l, kk % QK_K);
                // Q6_K's `q − 32` back to 0..64: unsigned for `maddubs`.
                let v = if kind == KQuant::Q6K { q + 32 } else { q } as u8;
                qs[kk / QK_K * kind.int_sb_bytes() + at] |= v << shift;
            }
        }
    }

    /// Row `l`'s quant of element `kk` from a panel's quants `qs`.
    fn quant(self, kind: KQuant, qs: &[u8], l: usize, kk: usize) -> i8 {
        match self {
            Layout::Dequantized => {
                let src = &qs[kk * kind.bpk()..][..kind.bpk()];
                (match kind {
                    KQuant::Q4K => decode::<Q4>(src, l),
                    KQuant::Q5K => decode::<Q5>(src, l),
                    KQuant::Q6K => decode::<Q6>(src, l),
                    // The index back, not the table's value.
                    KQuant::Iq4Xs => decode::<Q4>(src, l),
                }) as i8
            }
            Layout::Integer => {
                let (at, shift) = int_at(kind, l, kk % QK_K);
                let v = qs[kk / QK_K * kind.int_sb_bytes() + at] >> shift;
                if kind.nibbles() {
                    (v & 0xF) as i8
                } else {
                    v as i8 - 32
                }
            }
        }
    }

    /// Where row `l`'s scale (and min) of sub-block `j` lies in a panel's.
    fn scale_at(self, l: usize, j: usize) -> usize {
        match self {
            Layout::Dequantized => j * LANES + l,
            Layout::Integer => ((j / 2) * LANES + l) * 2 + j % 2,
        }
    }
}

/// Row `l`'s quant from the `kind.bpk()` bytes of one element of a panel in
/// the dequantized layout (IQ4_XS: the table's value).
#[inline(always)]
pub(super) fn decode<const K: u8>(src: &[u8], l: usize) -> i32 {
    match K {
        Q6 => i32::from(src[l] as i8),
        IQ4 => i32::from(crate::iq4::KVALUES[usize::from(decode::<Q4>(src, l) as u8)]),
        _ => {
            let nib = i32::from(if l < 8 { src[l] & 0xF } else { src[l - 8] >> 4 });
            if K == Q5 {
                let h = u16::from_le_bytes([src[8], src[9]]);
                nib | (i32::from((h >> l) & 1) << 4)
            } else {
                nib
            }
        }
    }
}

/// Where row `l` (of a panel), element `kk` (of a super-block) of a quant
/// lies in the integer layout's super-block bytes, and its shift.
#[inline(always)]
pub(super) fn int_at(kind: KQuant, l: usize, kk: usize) -> (usize, u32) {
    let (g, j, h, r) = (kk / 4, kk % 4, l / 8, l % 8);
    match kind {
        KQuant::Q4K | KQuant::Iq4Xs => (g * 32 + 4 * r + j, 4 * h as u32),
        _ => ((g * 2 + h) * 32 + 4 * r + j, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed_kquant::tests::weight;

    /// The fields of `a` and `b` equal to the byte (f32s by their bits).
    fn same(a: &KPanels, b: &KPanels) -> bool {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        a.qs == b.qs
            && a.sc == b.sc
            && a.mn == b.mn
            && bits(&a.d) == bits(&b.d)
            && bits(&a.dmin) == bits(&b.dmin)
    }

    #[test]
    fn blocks_decoded_into_panels_equal_rows_packed() {
        // Every kind in its layout and in the f32-rebuild one (Q5_K's are
        // the same); `out` filling its panels, ending inside one, and large
        // enough for several parallel tasks.
        for kind in [KQuant::Q4K, KQuant::Q5K, KQuant::Q6K, KQuant::Iq4Xs] {
            for (out, inp) in [(16, 256), (61, 512), (40, 768), (300, 1024)] {
                let (data, _) = weight(kind, out, inp, out + inp);
                let rows = Rows::from_blocks(kind, &data, out, inp);
                for layout in [kind.layout(), Layout::Dequantized] {
                    let direct = KPanels::from_blocks(layout, kind, &[&data], out, inp);
                    let packed = KPanels::pack(layout, kind, &rows, out, inp);
                    assert!(
                        same(&direct, &packed),
                        "{kind:?} {layout:?} [{out}x{inp}]: the panels differ"
                    );
                }
            }
        }
    }
}
