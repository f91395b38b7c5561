//! GGUF K-quant weights (Q4_K, Q5_K, Q6_K) packed for the same products as
//! [`crate::packed`].
//!
//! A K-quant row is made of super-blocks of 256 weights, each with an f16
//! scale `d` (and for Q4_K/Q5_K an f16 `dmin`) and small integer scales per
//! sub-block: `w = d·sc·q − dmin·m` over sub-blocks of 32 (Q4_K: 4-bit `q`,
//! Q5_K: 5-bit; `sc`, `m` 6-bit), `w = d·sc·(q − 32)` over sub-blocks of 16
//! (Q6_K: 6-bit `q`, int8 `sc`). At load the blocks are repacked into the
//! dense kernels' panels of [`LANES`] output rows interleaved along `in`:
//!
//! - quants `[panels][in][BPK]` bytes: Q4_K two 4-bit values per byte (row
//!   `l` in the low nibble of byte `l`, row `l + 8` in the high one: 8 bytes
//!   per `in` element and panel, 0.5 byte per weight, as in the file);
//!   Q5_K the same nibbles plus the 16 rows' fifth bits in 2 bytes;
//!   Q6_K `q − 32` as int8 (1 byte per weight: unpacking 6 bits costs more
//!   instructions than the 0.18 byte per weight it would save);
//! - sub-block scales (and mins) `[panels][in / SUB][LANES]` int8, super-
//!   block `d` (and `dmin`) `[panels][in / 256][LANES]` f32 (the f16
//!   widened).
//!
//! Per sub-block the kernel computes each panel's 16 scales `d·sc` (and
//! offsets `dmin·m`) once; per element of `in` it widens the panel's 16
//! quants to f32 and makes the weights with one `q·s − o` multiply-add, then
//! multiply-adds them into every row of its register tile. That rebuilds
//! exactly candle's dequantized weights (`d·sc` and `q·(d·sc)` are exact in
//! f32, one rounding as in candle), so the product is the product with the
//! dequantized weights to f32 summation order.

use std::ops::Range;

use half::f16;

use crate::error::ModelError;
use crate::isa::{Isa, IsaKind};
use crate::packed::{Acc, LANES, MAX_MR, Out, quantized_product};

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

/// Which K-quant format a [`PackedKQuant`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuant {
    /// 4-bit quants, 6-bit scales and mins per 32: 4.5 bits per weight.
    Q4K,
    /// 5-bit quants, 6-bit scales and mins per 32: 5.5 bits per weight.
    Q5K,
    /// 6-bit quants, int8 scales per 16: 6.5625 bits per weight.
    Q6K,
}

// The kinds as const-generic parameters of the kernels.
const Q4: u8 = 0;
const Q5: u8 = 1;
const Q6: u8 = 2;

impl KQuant {
    /// Weights per sub-block (one scale each).
    pub const fn sub(self) -> usize {
        match self {
            Self::Q4K | Self::Q5K => 32,
            Self::Q6K => 16,
        }
    }

    /// Whether sub-blocks have a min (`− dmin·m`).
    const fn has_min(self) -> bool {
        !matches!(self, Self::Q6K)
    }

    /// Bytes of quants per element of `in` in a panel.
    const fn bpk(self) -> usize {
        match self {
            Self::Q4K => 8,
            Self::Q5K => 10,
            Self::Q6K => 16,
        }
    }

    /// Bytes of a super-block in a GGUF file.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    /// Bytes per weight this layout stores (quants, scales, mins, `d`s).
    pub fn packed_bytes_per_weight(self) -> f64 {
        let mins = if self.has_min() { 2.0 } else { 1.0 };
        self.bpk() as f64 / LANES as f64 + mins / self.sub() as f64 + 4.0 * mins / QK_K as f64
    }
}

/// A K-quant matrix unpacked to one value per element, row-major: the
/// common form between the file's blocks and the panels (loading and
/// fusing go through it).
struct Rows {
    /// `[out][inp]`: Q4_K 0..16, Q5_K 0..32, Q6_K −32..32 (`q − 32`).
    q: Vec<i8>,
    /// `[out][inp / sub]` sub-block scales.
    sc: Vec<i8>,
    /// `[out][inp / sub]` sub-block mins (empty for Q6_K).
    mn: Vec<i8>,
    /// `[out][inp / 256]` super-block scales.
    d: Vec<f32>,
    /// `[out][inp / 256]` super-block min scales (empty for Q6_K).
    dmin: Vec<f32>,
}

/// Q4_K/Q5_K's 6-bit scale and min of sub-block `j` from the 12 packed bytes.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

impl Rows {
    /// Unpacks the GGUF blocks of a row-major `[out][inp]` matrix.
    fn from_blocks(kind: KQuant, data: &[u8], out: usize, inp: usize) -> Self {
        let (nsb, nsub) = (inp / QK_K, inp / kind.sub());
        let mut r = Rows {
            q: vec![0; out * inp],
            sc: vec![0; out * nsub],
            mn: if kind.has_min() {
                vec![0; out * nsub]
            } else {
                Vec::new()
            },
            d: vec![0.0; out * nsb],
            dmin: if kind.has_min() {
                vec![0.0; out * nsb]
            } else {
                Vec::new()
            },
        };
        for (i, blk) in data.chunks_exact(kind.block_bytes()).enumerate() {
            let q = &mut r.q[i * QK_K..][..QK_K];
            let per = QK_K / kind.sub();
            let sc = &mut r.sc[i * per..][..per];
            match kind {
                KQuant::Q4K | KQuant::Q5K => {
                    r.d[i] = f16_at(blk, 0);
                    r.dmin[i] = f16_at(blk, 2);
                    let scales = &blk[4..16];
                    let mn = &mut r.mn[i * per..][..per];
                    for (j, (s, m)) in sc.iter_mut().zip(mn.iter_mut()).enumerate() {
                        let (a, b) = scale_min_k4(j, scales);
                        (*s, *m) = (a as i8, b as i8);
                    }
                    let (qh, qs) = if kind == KQuant::Q4K {
                        (&[0u8; 32][..], &blk[16..144])
                    } else {
                        (&blk[16..48], &blk[48..176])
                    };
                    for j in 0..4 {
                        for l in 0..32 {
                            let b = qs[j * 32 + l];
                            let h = qh[l] >> (2 * j);
                            q[j * 64 + l] = ((b & 0xF) | ((h & 1) << 4)) as i8;
                            q[j * 64 + 32 + l] = ((b >> 4) | (((h >> 1) & 1) << 4)) as i8;
                        }
                    }
                }
                KQuant::Q6K => {
                    let (ql, qh) = (&blk[0..128], &blk[128..192]);
                    for (s, &b) in sc.iter_mut().zip(&blk[192..208]) {
                        *s = b as i8;
                    }
                    r.d[i] = f16_at(blk, 208);
                    for n in 0..2 {
                        let (ql, qh, q) = (&ql[64 * n..], &qh[32 * n..], &mut q[128 * n..]);
                        for l in 0..32 {
                            let h = qh[l];
                            q[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
                            q[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
                            q[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                            q[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                        }
                    }
                }
            }
        }
        r
    }
}

/// Writes the 16 quants `q` of one element of `in` of a panel as `kind`
/// stores them (`dst` is `kind.bpk()` bytes).
fn encode(kind: KQuant, q: &[i8; LANES], dst: &mut [u8]) {
    match kind {
        KQuant::Q4K | KQuant::Q5K => {
            for j in 0..8 {
                dst[j] = (q[j] as u8 & 0xF) | ((q[j + 8] as u8 & 0xF) << 4);
            }
            if kind == KQuant::Q5K {
                let h = (0..LANES).fold(0u16, |h, l| h | (u16::from(q[l] as u8 >> 4) << l));
                dst[8..10].copy_from_slice(&h.to_le_bytes());
            }
        }
        KQuant::Q6K => {
            for (d, &v) in dst.iter_mut().zip(q) {
                *d = v as u8;
            }
        }
    }
}

/// Row `l`'s quant from the `kind.bpk()` bytes of one element of a panel.
#[inline(always)]
fn decode<const K: u8>(src: &[u8], l: usize) -> i32 {
    match K {
        Q6 => i32::from(src[l] as i8),
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

/// A Q4_K, Q5_K or Q6_K `[out][in]` weight in panel layout.
#[derive(Clone)]
pub struct PackedKQuant {
    kind: KQuant,
    /// `[panels][in][bpk]` quants; rows past `out` in the last panel are 0.
    qs: Vec<u8>,
    /// `[panels][in / sub][LANES]` sub-block scales.
    sc: Vec<i8>,
    /// `[panels][in / sub][LANES]` sub-block mins (empty for Q6_K).
    mn: Vec<i8>,
    /// `[panels][in / 256][LANES]` super-block scales (0 past `out`).
    d: Vec<f32>,
    /// `[panels][in / 256][LANES]` super-block min scales (empty for Q6_K).
    dmin: Vec<f32>,
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
        if !inp.is_multiple_of(QK_K) {
            return Err(ModelError::Config(format!(
                "{kind:?} weight [{out}, {inp}]: the input dimension is not a multiple of {QK_K}"
            )));
        }
        let expected = out * inp / QK_K * kind.block_bytes();
        if data.len() != expected {
            return Err(ModelError::Config(format!(
                "{kind:?} weight [{out}, {inp}] holds {} bytes, expected {expected}",
                data.len()
            )));
        }
        Ok(Self::pack(
            kind,
            &Rows::from_blocks(kind, data, out, inp),
            out,
            inp,
        ))
    }

    /// Packs unpacked rows into panels.
    fn pack(kind: KQuant, r: &Rows, out: usize, inp: usize) -> Self {
        let (sub, bpk) = (kind.sub(), kind.bpk());
        let (nsb, nsub) = (inp / QK_K, inp / sub);
        let panels = out.div_ceil(LANES);
        let mut qs = vec![0u8; panels * inp * bpk];
        let mut sc = vec![0i8; panels * nsub * LANES];
        let mut mn = vec![0i8; if kind.has_min() { sc.len() } else { 0 }];
        let mut d = vec![0f32; panels * nsb * LANES];
        let mut dmin = vec![0f32; if kind.has_min() { d.len() } else { 0 }];
        for p in 0..panels {
            let rows = p * LANES..((p + 1) * LANES).min(out);
            for k in 0..inp {
                let mut q = [0i8; LANES];
                for o in rows.clone() {
                    q[o % LANES] = r.q[o * inp + k];
                }
                encode(kind, &q, &mut qs[(p * inp + k) * bpk..][..bpk]);
            }
            for o in rows {
                let l = o % LANES;
                for b in 0..nsub {
                    sc[(p * nsub + b) * LANES + l] = r.sc[o * nsub + b];
                    if kind.has_min() {
                        mn[(p * nsub + b) * LANES + l] = r.mn[o * nsub + b];
                    }
                }
                for b in 0..nsb {
                    d[(p * nsb + b) * LANES + l] = r.d[o * nsb + b];
                    if kind.has_min() {
                        dmin[(p * nsb + b) * LANES + l] = r.dmin[o * nsb + b];
                    }
                }
            }
        }
        Self {
            kind,
            qs,
            sc,
            mn,
            d,
            dmin,
            out,
            inp,
        }
    }

    /// The rows back from the panels.
    fn rows(&self) -> Rows {
        let (out, inp, kind) = (self.out, self.inp, self.kind);
        let (bpk, nsub, nsb) = (kind.bpk(), inp / kind.sub(), inp / QK_K);
        let mut r = Rows {
            q: vec![0; out * inp],
            sc: vec![0; out * nsub],
            mn: vec![0; if kind.has_min() { out * nsub } else { 0 }],
            d: vec![0.0; out * nsb],
            dmin: vec![0.0; if kind.has_min() { out * nsb } else { 0 }],
        };
        for o in 0..out {
            let (p, l) = (o / LANES, o % LANES);
            for k in 0..inp {
                let src = &self.qs[(p * inp + k) * bpk..][..bpk];
                r.q[o * inp + k] = match kind {
                    KQuant::Q4K => decode::<Q4>(src, l),
                    KQuant::Q5K => decode::<Q5>(src, l),
                    KQuant::Q6K => decode::<Q6>(src, l),
                } as i8;
            }
            for b in 0..nsub {
                r.sc[o * nsub + b] = self.sc[(p * nsub + b) * LANES + l];
                if kind.has_min() {
                    r.mn[o * nsub + b] = self.mn[(p * nsub + b) * LANES + l];
                }
            }
            for b in 0..nsb {
                r.d[o * nsb + b] = self.d[(p * nsb + b) * LANES + l];
                if kind.has_min() {
                    r.dmin[o * nsb + b] = self.dmin[(p * nsb + b) * LANES + l];
                }
            }
        }
        r
    }

    /// The parts stacked along `out` (fused projections), when all are the
    /// same kind with the same input dimension.
    pub fn stack(parts: &[&Self]) -> Option<Self> {
        let first = parts.first()?;
        let (kind, inp) = (first.kind, first.inp);
        if parts.iter().any(|p| p.kind != kind || p.inp != inp) {
            return None;
        }
        let mut all = Rows {
            q: Vec::new(),
            sc: Vec::new(),
            mn: Vec::new(),
            d: Vec::new(),
            dmin: Vec::new(),
        };
        for p in parts {
            let r = p.rows();
            all.q.extend(r.q);
            all.sc.extend(r.sc);
            all.mn.extend(r.mn);
            all.d.extend(r.d);
            all.dmin.extend(r.dmin);
        }
        let out = parts.iter().map(|p| p.out).sum();
        Some(Self::pack(kind, &all, out, inp))
    }

    /// The dequantized row-major `[out][inp]` matrix (equal to candle's).
    pub fn dequantize(&self) -> Vec<f32> {
        let r = self.rows();
        let (inp, sub) = (self.inp, self.kind.sub());
        let (nsub, nsb) = (inp / sub, inp / QK_K);
        let mut w = vec![0f32; self.out * inp];
        for o in 0..self.out {
            for k in 0..inp {
                let (b, sb) = (o * nsub + k / sub, o * nsb + k / QK_K);
                let s = r.d[sb] * f32::from(r.sc[b]);
                let q = f32::from(r.q[o * inp + k]);
                w[o * inp + k] = if self.kind.has_min() {
                    s * q - r.dmin[sb] * f32::from(r.mn[b])
                } else {
                    s * q
                };
            }
        }
        w
    }

    /// Which format it holds.
    pub fn kind(&self) -> KQuant {
        self.kind
    }

    /// Bytes the quants, scales and mins occupy.
    pub fn size_bytes(&self) -> usize {
        self.qs.len() + self.sc.len() + self.mn.len() + 4 * (self.d.len() + self.dmin.len())
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
        quantized_product(
            isa,
            x,
            rows,
            (self.inp, self.out),
            y,
            |isa, nv, r, g, out| self.compute(isa, nv, x, r, g, out),
        );
    }

    /// Rows `rows` × the columns of panel groups `groups` (of `nv` panels),
    /// row tiles inside panel groups as in the dense kernel.
    fn compute(
        &self,
        isa: Isa,
        nv: usize,
        x: &[f32],
        rows: Range<usize>,
        groups: Range<usize>,
        out: &Out,
    ) {
        let kind = self.kind;
        let (nsub, nsb) = (self.inp / kind.sub(), self.inp / QK_K);
        let (panel_q, panel_s, panel_d) = (self.inp * kind.bpk(), nsub * LANES, nsb * LANES);
        let panels = self.out.div_ceil(LANES);
        let n = rows.len();
        let count = n.div_ceil(MAX_MR);
        let (base, extra) = (n / count, n % count);
        // Q6_K has no mins: its `mn` stays empty.
        fn part<T>(v: &[T], r: Range<usize>) -> &[T] {
            if v.is_empty() { v } else { &v[r] }
        }
        for g in groups {
            let p0 = g * nv;
            let np = nv.min(panels - p0);
            let mut r0 = rows.start;
            for i in 0..count {
                let mr = base + usize::from(i < extra);
                let t = KTile {
                    qs: &self.qs[p0 * panel_q..(p0 + np) * panel_q],
                    sc: &self.sc[p0 * panel_s..(p0 + np) * panel_s],
                    mn: part(&self.mn, p0 * panel_s..(p0 + np) * panel_s),
                    d: &self.d[p0 * panel_d..(p0 + np) * panel_d],
                    dmin: part(&self.dmin, p0 * panel_d..(p0 + np) * panel_d),
                    x: &x[r0 * self.inp..(r0 + mr) * self.inp],
                    inp: self.inp,
                    np,
                };
                kernel(isa, kind, mr, nv, &t, r0, p0 * LANES, out);
                r0 += mr;
            }
        }
    }
}

/// One register tile's operands.
struct KTile<'a> {
    /// The tile's panels of quants, `[np][inp][bpk]`.
    qs: &'a [u8],
    /// Their sub-block scales, `[np][inp / sub][LANES]`.
    sc: &'a [i8],
    /// Their sub-block mins, as `sc` (empty for Q6_K).
    mn: &'a [i8],
    /// Their super-block scales, `[np][inp / 256][LANES]`.
    d: &'a [f32],
    /// Their super-block min scales, as `d` (empty for Q6_K).
    dmin: &'a [f32],
    /// Its rows of `x`, `[mr][inp]`.
    x: &'a [f32],
    inp: usize,
    /// Panels present (the last group may have fewer than the tile's NV).
    np: usize,
}

/// Runs the micro-kernel for `kind`, `mr` rows and `nv` panels, storing at
/// (`row0`, `col0`).
// Every call is wrapped in `unsafe`, which the portable kernel does not need.
#[allow(unused_unsafe, clippy::too_many_arguments)]
fn kernel(
    isa: Isa,
    kind: KQuant,
    mr: usize,
    nv: usize,
    t: &KTile<'_>,
    row0: usize,
    col0: usize,
    out: &Out,
) {
    macro_rules! go {
        ($f:ident, $k:expr; $($m:literal x $n:literal),*) => {
            match (mr, nv) {
                $(
                    ($m, $n) => {
                        // SAFETY: `isa` names the kernel family (see below).
                        let acc = unsafe { $f::<$k, $m, $n>(t) };
                        out.store_at::<$m, $n>(row0, col0, t.np, &acc)
                    }
                )*
                _ => unreachable!("no {mr}x{nv} {kind:?} kernel for {isa:?}"),
            }
        };
    }
    macro_rules! shapes {
        ($f:ident, $k:expr) => {
            go!($f, $k; 1 x 4, 2 x 2, 3 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1)
        };
    }
    // SAFETY (the `unsafe` calls): an `Isa` can only be made by detection
    // (see `isa.rs`), so holding one means the CPU has its features.
    match (isa.kind(), kind) {
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, KQuant::Q4K) => shapes!(tile_avx2, Q4),
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, KQuant::Q5K) => shapes!(tile_avx2, Q5),
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, KQuant::Q6K) => shapes!(tile_avx2, Q6),
        (_, KQuant::Q4K) => shapes!(tile_portable, Q4),
        (_, KQuant::Q5K) => shapes!(tile_portable, Q5),
        (_, KQuant::Q6K) => shapes!(tile_portable, Q6),
    }
}

/// The kind with id `K`.
const fn kind_of(k: u8) -> KQuant {
    match k {
        Q4 => KQuant::Q4K,
        Q5 => KQuant::Q5K,
        _ => KQuant::Q6K,
    }
}

/// The tile's product, portable (the compiler vectorises what it can).
fn tile_portable<const K: u8, const MR: usize, const NV: usize>(t: &KTile<'_>) -> Acc<MR, NV> {
    let kind = kind_of(K);
    let (sub, bpk) = (kind.sub(), kind.bpk());
    let (nsub, nsb) = (t.inp / sub, t.inp / QK_K);
    let np = t.np.min(NV);
    let (sc, mn) = (t.sc, t.mn);
    let mut acc = [[[0f32; LANES]; NV]; MR];
    let mut s = [[0f32; LANES]; NV];
    let mut o = [[0f32; LANES]; NV];
    let mut w = [[0f32; LANES]; NV];
    for b in 0..nsub {
        let sb = b * sub / QK_K;
        for p in 0..np {
            let (at, dat) = ((p * nsub + b) * LANES, (p * nsb + sb) * LANES);
            for l in 0..LANES {
                s[p][l] = t.d[dat + l] * f32::from(sc[at + l]);
                if kind.has_min() {
                    o[p][l] = t.dmin[dat + l] * f32::from(mn[at + l]);
                }
            }
        }
        for k in b * sub..(b + 1) * sub {
            for p in 0..np {
                let src = &t.qs[(p * t.inp + k) * bpk..][..bpk];
                for l in 0..LANES {
                    w[p][l] = decode::<K>(src, l) as f32 * s[p][l] - o[p][l];
                }
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let xv = t.x[r * t.inp + k];
                for (a, wp) in acc_r.iter_mut().zip(&w).take(np) {
                    for l in 0..LANES {
                        a[l] += wp[l] * xv;
                    }
                }
            }
        }
    }
    acc
}

/// The 16 quants of one element of `in` of a panel, as two vectors of 8
/// i32 (rows 0–7, 8–15).
///
/// # Safety
/// `at` points at `kind_of(K).bpk()` readable bytes; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn decode_avx2<const K: u8>(
    at: *const u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        if K == Q6 {
            return (
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.cast())),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.add(8).cast())),
            );
        }
        // Byte l holds row l (low nibble) and row l + 8 (high nibble).
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.cast()));
        let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xF));
        let hi = _mm256_srli_epi32::<4>(v);
        if K != Q5 {
            return (lo, hi);
        }
        // The fifth bits: bit l of the u16 after the nibbles is row l's.
        let h = _mm256_set1_epi32(i32::from(at.add(8).cast::<u16>().read_unaligned()));
        let one = _mm256_set1_epi32(1);
        let bit = |shifts: __m256i| {
            _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srlv_epi32(h, shifts), one))
        };
        (
            _mm256_or_si256(lo, bit(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))),
            _mm256_or_si256(hi, bit(_mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15))),
        )
    }
}

/// The tile's product with AVX2/FMA: `MR × 2·NV` accumulators in registers;
/// per sub-block each panel's 16 scales (and offsets) are made once, per
/// element of `in` its 16 quants are widened to f32 and turned into weights
/// with one multiply-add, then multiply-added into every row. A missing
/// last panel is computed from zeros and not stored.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<const K: u8, const MR: usize, const NV: usize>(t: &KTile<'_>) -> Acc<MR, NV> {
    use std::arch::x86_64::*;
    let kind = kind_of(K);
    let (sub, bpk) = (kind.sub(), kind.bpk());
    let (nsub, nsb) = (t.inp / sub, t.inp / QK_K);
    let np = t.np.min(NV);
    assert!(
        t.x.len() >= MR * t.inp
            && t.inp.is_multiple_of(QK_K)
            && t.qs.len() >= np * t.inp * bpk
            && t.sc.len() >= np * nsub * LANES
            && t.d.len() >= np * nsb * LANES
            && (!kind.has_min()
                || (t.mn.len() >= np * nsub * LANES && t.dmin.len() >= np * nsb * LANES))
    );
    let (panel_q, panel_s, panel_d) = (t.inp * bpk, nsub * LANES, nsb * LANES);
    let mut acc = [[[_mm256_setzero_ps(); 2]; NV]; MR];
    let (q, x) = (t.qs.as_ptr(), t.x.as_ptr());
    for b in 0..nsub {
        let sb = b * sub / QK_K;
        let mut s = [[_mm256_setzero_ps(); 2]; NV];
        let mut o = [[_mm256_setzero_ps(); 2]; NV];
        for p in 0..np {
            // SAFETY: p < np, b < nsub, sb < nsb: 16 values of each array
            // (checked above).
            unsafe {
                let (at, dat) = ((p * panel_s + b * LANES), p * panel_d + sb * LANES);
                let widen = |v: *const i8| {
                    [
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(v.cast()))),
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(v.add(8).cast()))),
                    ]
                };
                let d = t.d.as_ptr().add(dat);
                let sc = widen(t.sc.as_ptr().add(at));
                s[p] = [
                    _mm256_mul_ps(sc[0], _mm256_loadu_ps(d)),
                    _mm256_mul_ps(sc[1], _mm256_loadu_ps(d.add(8))),
                ];
                if kind.has_min() {
                    let dm = t.dmin.as_ptr().add(dat);
                    let m = widen(t.mn.as_ptr().add(at));
                    o[p] = [
                        _mm256_mul_ps(m[0], _mm256_loadu_ps(dm)),
                        _mm256_mul_ps(m[1], _mm256_loadu_ps(dm.add(8))),
                    ];
                }
            }
        }
        for k in b * sub..(b + 1) * sub {
            let mut wv = [[_mm256_setzero_ps(); 2]; NV];
            for (p, v) in wv.iter_mut().enumerate().take(np) {
                // SAFETY: p < np and k < inp: the bpk bytes lie inside `qs`.
                let (lo, hi) = unsafe { decode_avx2::<K>(q.add(p * panel_q + k * bpk)) };
                let (lo, hi) = (_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi));
                *v = if kind.has_min() {
                    [
                        _mm256_fmsub_ps(lo, s[p][0], o[p][0]),
                        _mm256_fmsub_ps(hi, s[p][1], o[p][1]),
                    ]
                } else {
                    [_mm256_mul_ps(lo, s[p][0]), _mm256_mul_ps(hi, s[p][1])]
                };
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                // SAFETY: r < MR and k < inp: inside `t.x` (checked above).
                let xv = unsafe { _mm256_broadcast_ss(&*x.add(r * t.inp + k)) };
                for (a, v) in acc_r.iter_mut().zip(&wv) {
                    a[0] = _mm256_fmadd_ps(v[0], xv, a[0]);
                    a[1] = _mm256_fmadd_ps(v[1], xv, a[1]);
                }
            }
        }
    }
    let mut res = [[[0f32; LANES]; NV]; MR];
    for (dst_r, acc_r) in res.iter_mut().zip(&acc) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    const KINDS: [(KQuant, GgmlDType); 3] = [
        (KQuant::Q4K, GgmlDType::Q4K),
        (KQuant::Q5K, GgmlDType::Q5K),
        (KQuant::Q6K, GgmlDType::Q6K),
    ];

    /// A `kind` weight quantized by candle, and candle's dequantization of it.
    fn quantized(dtype: GgmlDType, out: usize, inp: usize, seed: usize) -> (Vec<u8>, Vec<f32>) {
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

    fn naive(x: &[f32], w: &[f32], rows: usize, inp: usize, out: usize) -> Vec<f32> {
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
    fn rel_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
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
        for isa in Isa::available() {
            let mut y = vec![f32::NAN; 3];
            p.product(isa, &x, rows, &mut y);
            assert_eq!(y.len(), e.len());
            let (d, i) = rel_diff(&y, &e);
            // Different summation orders of the same f32 products.
            assert!(
                d < 1e-5,
                "{isa:?} {:?} [{rows}x{inp}x{out}] cell {i}: {} vs {} (rel {d})",
                p.kind(),
                y[i],
                e[i]
            );
        }
    }

    fn check(rows: usize, inp: usize, out: usize) {
        for (kind, dtype) in KINDS {
            let (blocks, deq) = quantized(dtype, out, inp, rows);
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
        // Fused q/k/v: part sizes not multiples of a panel.
        for (kind, dtype) in KINDS {
            let parts: Vec<(Vec<u8>, Vec<f32>, usize)> = [(24, 1), (8, 2), (37, 3)]
                .into_iter()
                .map(|(out, seed)| {
                    let (b, d) = quantized(dtype, out, 256, seed);
                    (b, d, out)
                })
                .collect();
            let packed: Vec<PackedKQuant> = parts
                .iter()
                .map(|(b, _, out)| PackedKQuant::from_blocks(kind, b, *out, 256).unwrap())
                .collect();
            let s = PackedKQuant::stack(&packed.iter().collect::<Vec<_>>()).unwrap();
            let deq: Vec<f32> = parts.iter().flat_map(|(_, d, _)| d.clone()).collect();
            assert_eq!(s.out_dim(), 69);
            assert_eq!(s.dequantize(), deq, "{kind:?}");
            check_product(&s, &deq, 5);
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
        for (kind, dtype) in KINDS {
            let (mut blocks, deq) = quantized(dtype, out, inp, 0);
            let at = (19 * inp / QK_K + 1) * kind.block_bytes();
            let blk = &mut blocks[at..at + kind.block_bytes()];
            match kind {
                // Sub-block 3's 6-bit scale is the low bits of scales[3].
                KQuant::Q4K | KQuant::Q5K => blk[4 + 3] ^= 0x10,
                KQuant::Q6K => blk[192 + 3] = blk[192 + 3].wrapping_add(9),
            }
            let p = PackedKQuant::from_blocks(kind, &blocks, out, inp).unwrap();
            let x = input(rows, inp);
            let e = naive(&x, &deq, rows, inp, out);
            for isa in Isa::available() {
                let mut y = Vec::new();
                p.product(isa, &x, rows, &mut y);
                for (i, (a, b)) in y.iter().zip(&e).enumerate() {
                    let moved = (a - b).abs() > 1e-3 * b.abs().max(1.0);
                    assert_eq!(
                        moved,
                        i % out == 19,
                        "{isa:?} {kind:?} cell {i}: {a} vs {b}"
                    );
                }
            }
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
        assert!(e.to_string().contains("not a multiple of 256"), "{e}");
        let e = PackedKQuant::from_blocks(KQuant::Q6K, &[0; 209], 1, 256).unwrap_err();
        assert!(
            e.to_string().contains("holds 209 bytes, expected 210"),
            "{e}"
        );
    }
}
