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
use crate::packed::{Acc, LANES, MAX_MR, Out, quantized_product, shape_output};
use crate::q8k::{BSUM, Q8K};

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
    /// The integer-product layout (Q4_K, Q6_K); the fields above are then
    /// empty.
    int: Option<IntPanels>,
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
            kind.integer(),
        ))
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
        Ok(Self::pack(kind, &p.rows(), out, inp, false))
    }

    /// Packs unpacked rows into panels, the integer layout if `int`.
    fn pack(kind: KQuant, r: &Rows, out: usize, inp: usize, int: bool) -> Self {
        if int {
            return Self {
                kind,
                qs: Vec::new(),
                sc: Vec::new(),
                mn: Vec::new(),
                d: Vec::new(),
                dmin: Vec::new(),
                int: Some(IntPanels::pack(kind, r, out, inp)),
                out,
                inp,
            };
        }
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
            int: None,
            out,
            inp,
        }
    }

    /// The rows back from the panels.
    fn rows(&self) -> Rows {
        let (out, inp, kind) = (self.out, self.inp, self.kind);
        if let Some(ip) = &self.int {
            return ip.rows(kind, out, inp);
        }
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
        Some(Self::pack(kind, &all, out, inp, first.int.is_some()))
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
        self.qs.len()
            + self.sc.len()
            + self.mn.len()
            + 4 * (self.d.len() + self.dmin.len())
            + self.int.as_ref().map_or(0, IntPanels::size_bytes)
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
        if let Some(ip) = &self.int {
            // Checked before quantizing `x` (the driver checks it again).
            if !shape_output(x, rows, (self.inp, self.out), y) {
                return;
            }
            return Q8K::with(x, rows, self.inp, |q| {
                quantized_product(
                    isa,
                    x,
                    rows,
                    (self.inp, self.out),
                    y,
                    |isa, nv, r, g, out| ip.compute(self.kind, self.inp, isa, nv, q, r, g, out),
                )
            });
        }
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

// ---------------------------------------------------------------------
// Integer products: K-quant weights × Q8_K activations.
//
// The activations are quantized per product to Q8_K (see `q8k.rs`); each
// super-block of a weight row then costs integer dot products of the
// unsigned quants with the int8 activations (`maddubs`), summed per
// sub-block in int16, scaled by the sub-block scales in int32 (`madd`),
// and one f32 multiply-add by `d·d_x` per super-block. The mins (Q4_K) and
// Q6_K's `−32` go through the activations' 16-sums (`bsums`): per
// super-block `Σ_j m_j·bsum_j` and `32·Σ_j sc_j·bsum_j`, in int32.
// ---------------------------------------------------------------------

/// Rows of `x` in one integer register tile at most (with one panel: 8
/// int16 accumulators, the weights, the mask and a broadcast fill the 16
/// registers).
const INT_MR: usize = 4;

impl KQuant {
    /// Whether its products are integer dot products with Q8_K activations.
    const fn integer(self) -> bool {
        matches!(self, Self::Q4K | Self::Q6K)
    }

    /// Bytes of quants per super-block of a panel in the integer layout.
    const fn int_sb_bytes(self) -> usize {
        match self {
            Self::Q4K => QK_K * LANES / 2,
            _ => QK_K * LANES,
        }
    }

    /// Sub-block scales per super-block, as pairs.
    const fn pairs(self) -> usize {
        QK_K / self.sub() / 2
    }
}

/// The integer layout of a Q4_K or Q6_K weight, per panel of [`LANES`]
/// rows and super-block (`pb = panel · nsb + super-block`):
///
/// - quants `[pb][group of 4 in][32 bytes]` (Q4_K) — byte `4r + j` holds
///   row `r`'s quant of element `j` of the group in its low nibble and row
///   `r + 8`'s in its high one (2048 bytes, 0.5 byte per weight) — or
///   `[pb][group][half][32 bytes]` (Q6_K, `q` as 0..64 in a byte, byte
///   `4r + j` of half `h` is row `8h + r`; 1 byte per weight): one 32-byte
///   load is 8 rows × 4 consecutive elements, the operand of `maddubs`
///   against the 4 activations broadcast. (Q6_K kept in 6 bits, 0.75 byte,
///   unpacked in registers, made decode steps 4–7 % slower here: the
///   unpacking costs more than the bytes it saves; docs/results/cpu-executor.md.)
/// - sub-block scales (and Q4_K's mins) `[pb][pair][LANES][2]` int8: two
///   consecutive sub-blocks' values per row side by side, so one widening
///   load is the operand of `madd` against two `bsums` (and a byte shuffle
///   gives one sub-block's per row, each twice, for the int16 sums);
/// - `d` (and `dmin`) `[pb][LANES]` f32.
#[derive(Clone)]
struct IntPanels {
    qs: Vec<u8>,
    sc: Vec<i8>,
    mn: Vec<i8>,
    d: Vec<f32>,
    dmin: Vec<f32>,
}

/// Where row `l` (of a panel), element `kk` (of a super-block) of a quant
/// lies in the integer layout's super-block bytes, and its shift.
#[inline(always)]
fn int_at(kind: KQuant, l: usize, kk: usize) -> (usize, u32) {
    let (g, j, h, r) = (kk / 4, kk % 4, l / 8, l % 8);
    match kind {
        KQuant::Q4K => (g * 32 + 4 * r + j, 4 * h as u32),
        _ => ((g * 2 + h) * 32 + 4 * r + j, 0),
    }
}

impl IntPanels {
    /// Packs unpacked rows (`kind` is Q4_K or Q6_K).
    fn pack(kind: KQuant, r: &Rows, out: usize, inp: usize) -> Self {
        let (nsb, nsub, per) = (inp / QK_K, inp / kind.sub(), QK_K / kind.sub());
        let (sbb, pairs, panels) = (kind.int_sb_bytes(), kind.pairs(), out.div_ceil(LANES));
        let mut ip = IntPanels {
            qs: vec![0; panels * nsb * sbb],
            sc: vec![0; panels * nsb * pairs * LANES * 2],
            mn: Vec::new(),
            d: vec![0.0; panels * nsb * LANES],
            dmin: Vec::new(),
        };
        if kind.has_min() {
            ip.mn = vec![0; ip.sc.len()];
            ip.dmin = vec![0.0; ip.d.len()];
        }
        for o in 0..out {
            let (p, l) = (o / LANES, o % LANES);
            for b in 0..nsb {
                let pb = p * nsb + b;
                let dst = &mut ip.qs[pb * sbb..][..sbb];
                for kk in 0..QK_K {
                    let q = r.q[o * inp + b * QK_K + kk];
                    let (at, shift) = int_at(kind, l, kk);
                    // Q6_K's `q − 32` back to 0..64: unsigned for `maddubs`.
                    let v = if kind.has_min() { q } else { q + 32 } as u8;
                    dst[at] |= v << shift;
                }
                for s in 0..per {
                    let at = ((pb * pairs + s / 2) * LANES + l) * 2 + s % 2;
                    ip.sc[at] = r.sc[o * nsub + b * per + s];
                    if kind.has_min() {
                        ip.mn[at] = r.mn[o * nsub + b * per + s];
                    }
                }
                ip.d[pb * LANES + l] = r.d[o * nsb + b];
                if kind.has_min() {
                    ip.dmin[pb * LANES + l] = r.dmin[o * nsb + b];
                }
            }
        }
        ip
    }

    /// The rows back.
    fn rows(&self, kind: KQuant, out: usize, inp: usize) -> Rows {
        let (nsb, nsub, per) = (inp / QK_K, inp / kind.sub(), QK_K / kind.sub());
        let (sbb, pairs) = (kind.int_sb_bytes(), kind.pairs());
        let mut r = Rows {
            q: vec![0; out * inp],
            sc: vec![0; out * nsub],
            mn: vec![0; if kind.has_min() { out * nsub } else { 0 }],
            d: vec![0.0; out * nsb],
            dmin: vec![0.0; if kind.has_min() { out * nsb } else { 0 }],
        };
        for o in 0..out {
            let (p, l) = (o / LANES, o % LANES);
            for b in 0..nsb {
                let pb = p * nsb + b;
                for kk in 0..QK_K {
                    let (at, shift) = int_at(kind, l, kk);
                    let v = self.qs[pb * sbb + at] >> shift;
                    r.q[o * inp + b * QK_K + kk] = if kind.has_min() {
                        (v & 0xF) as i8
                    } else {
                        v as i8 - 32
                    };
                }
                for s in 0..per {
                    let at = ((pb * pairs + s / 2) * LANES + l) * 2 + s % 2;
                    r.sc[o * nsub + b * per + s] = self.sc[at];
                    if kind.has_min() {
                        r.mn[o * nsub + b * per + s] = self.mn[at];
                    }
                }
                r.d[o * nsb + b] = self.d[pb * LANES + l];
                if kind.has_min() {
                    r.dmin[o * nsb + b] = self.dmin[pb * LANES + l];
                }
            }
        }
        r
    }

    /// Bytes held.
    fn size_bytes(&self) -> usize {
        self.qs.len() + self.sc.len() + self.mn.len() + 4 * (self.d.len() + self.dmin.len())
    }

    /// Rows `rows` × panel groups `groups` (of `nv` panels) of the product
    /// with the quantized activations `x`.
    #[allow(clippy::too_many_arguments)]
    fn compute(
        &self,
        kind: KQuant,
        inp: usize,
        isa: Isa,
        nv: usize,
        x: &Q8K,
        rows: Range<usize>,
        groups: Range<usize>,
        out: &Out,
    ) {
        let nsb = inp / QK_K;
        let (panel_q, panel_s, panel_d) = (
            nsb * kind.int_sb_bytes(),
            nsb * kind.pairs() * LANES * 2,
            nsb * LANES,
        );
        let panels = self.d.len() / panel_d;
        let n = rows.len();
        let count = n.div_ceil(INT_MR);
        let (base, extra) = (n / count, n % count);
        fn part<T>(v: &[T], r: Range<usize>) -> &[T] {
            if v.is_empty() { v } else { &v[r] }
        }
        for g in groups {
            let p0 = g * nv;
            let np = nv.min(panels - p0);
            let mut r0 = rows.start;
            for i in 0..count {
                let mr = base + usize::from(i < extra);
                let t = ITile {
                    qs: &self.qs[p0 * panel_q..(p0 + np) * panel_q],
                    sc: &self.sc[p0 * panel_s..(p0 + np) * panel_s],
                    mn: part(&self.mn, p0 * panel_s..(p0 + np) * panel_s),
                    d: &self.d[p0 * panel_d..(p0 + np) * panel_d],
                    dmin: part(&self.dmin, p0 * panel_d..(p0 + np) * panel_d),
                    xq: &x.qs[r0 * inp..(r0 + mr) * inp],
                    xd: &x.d[r0 * nsb..(r0 + mr) * nsb],
                    xs: &x.bsums[r0 * inp / BSUM..(r0 + mr) * inp / BSUM],
                    nsb,
                    np,
                };
                int_kernel(isa, kind, mr, nv, &t, r0, p0 * LANES, out);
                r0 += mr;
            }
        }
    }
}

/// One integer register tile's operands (the layout of [`IntPanels`]).
struct ITile<'a> {
    /// The tile's panels' quants, `[np][nsb][int_sb_bytes]`.
    qs: &'a [u8],
    /// Their scales, `[np][nsb][pairs][LANES][2]`.
    sc: &'a [i8],
    /// Their mins, as `sc` (empty for Q6_K).
    mn: &'a [i8],
    /// Their super-block scales, `[np][nsb][LANES]`.
    d: &'a [f32],
    /// Their super-block min scales, as `d` (empty for Q6_K).
    dmin: &'a [f32],
    /// The rows' Q8_K quants, `[mr][inp]`.
    xq: &'a [i8],
    /// Their block scales, `[mr][nsb]`.
    xd: &'a [f32],
    /// Their 16-sums, `[mr][inp / 16]`.
    xs: &'a [i16],
    /// Super-blocks along `in`.
    nsb: usize,
    /// Panels present (the last group may have fewer than the tile's NV).
    np: usize,
}

impl ITile<'_> {
    /// Panics unless every array holds what the tile of `MR` rows reads
    /// (the AVX2 kernel's loads rely on it).
    fn check<const MR: usize>(&self, kind: KQuant) {
        let (nsb, np) = (self.nsb, self.np);
        let s = np * nsb * kind.pairs() * LANES * 2;
        assert!(
            self.qs.len() >= np * nsb * kind.int_sb_bytes()
                && self.sc.len() >= s
                && self.d.len() >= np * nsb * LANES
                && (!kind.has_min() || (self.mn.len() >= s && self.dmin.len() >= np * nsb * LANES))
                && self.xq.len() >= MR * nsb * QK_K
                && self.xd.len() >= MR * nsb
                && self.xs.len() >= MR * nsb * QK_K / BSUM
        );
    }

    /// Row `r`'s activation sums paired as `madd` takes them, for pair `i`
    /// of super-block `b`'s sub-blocks: Q4_K's sub-blocks are 32 (two
    /// 16-sums each), Q6_K's 16.
    #[inline(always)]
    fn bsum_pair(&self, kind: KQuant, r: usize, b: usize, i: usize) -> (i16, i16) {
        let s = &self.xs[(r * self.nsb + b) * (QK_K / BSUM)..][..QK_K / BSUM];
        if kind.has_min() {
            (s[4 * i] + s[4 * i + 1], s[4 * i + 2] + s[4 * i + 3])
        } else {
            (s[2 * i], s[2 * i + 1])
        }
    }
}

/// Runs the integer micro-kernel for `kind`, `mr` rows and `nv` panels,
/// storing at (`row0`, `col0`).
#[allow(unused_unsafe, clippy::too_many_arguments)]
fn int_kernel(
    isa: Isa,
    kind: KQuant,
    mr: usize,
    nv: usize,
    t: &ITile<'_>,
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
                _ => unreachable!("no {mr}x{nv} {kind:?} integer kernel for {isa:?}"),
            }
        };
    }
    macro_rules! shapes {
        ($f:ident, $k:expr) => {
            go!($f, $k; 1 x 4, 2 x 2, 3 x 2, 1 x 2, 1 x 1, 2 x 1, 3 x 1, 4 x 1)
        };
    }
    // SAFETY (the `unsafe` calls): an `Isa` can only be made by detection
    // (see `isa.rs`), so holding one means the CPU has its features.
    match (isa.kind(), kind) {
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, KQuant::Q4K) => shapes!(int_tile_avx2, Q4),
        #[cfg(target_arch = "x86_64")]
        (IsaKind::Avx2, KQuant::Q6K) => shapes!(int_tile_avx2, Q6),
        (_, KQuant::Q4K) => shapes!(int_tile_portable, Q4),
        (_, KQuant::Q6K) => shapes!(int_tile_portable, Q6),
        (_, KQuant::Q5K) => unreachable!("Q5_K has no integer layout"),
    }
}

/// The integer tile, portable: the same integer sums, one output at a time.
fn int_tile_portable<const K: u8, const MR: usize, const NV: usize>(t: &ITile<'_>) -> Acc<MR, NV> {
    let kind = kind_of(K);
    t.check::<MR>(kind);
    let (nsb, sub, pairs, sbb) = (t.nsb, kind.sub(), kind.pairs(), kind.int_sb_bytes());
    let mut acc = [[[0f32; LANES]; NV]; MR];
    for (r, acc_r) in acc.iter_mut().enumerate() {
        for (p, acc_p) in acc_r.iter_mut().enumerate().take(t.np.min(NV)) {
            for (l, a) in acc_p.iter_mut().enumerate() {
                for b in 0..nsb {
                    let pb = p * nsb + b;
                    let q = &t.qs[pb * sbb..][..sbb];
                    let x = &t.xq[(r * nsb + b) * QK_K..][..QK_K];
                    let (mut isum, mut corr) = (0i32, 0i32);
                    for s in 0..QK_K / sub {
                        let at = ((pb * pairs + s / 2) * LANES + l) * 2 + s % 2;
                        let dot: i32 = (s * sub..(s + 1) * sub)
                            .map(|kk| {
                                let (i, shift) = int_at(kind, l, kk);
                                let v = (q[i] >> shift) & if K == Q4 { 0xF } else { 0xFF };
                                i32::from(v) * i32::from(x[kk])
                            })
                            .sum();
                        isum += i32::from(t.sc[at]) * dot;
                        let c = if K == Q4 { t.mn[at] } else { t.sc[at] };
                        let (b0, b1) = t.bsum_pair(kind, r, b, s / 2);
                        corr += i32::from(c) * i32::from(if s % 2 == 0 { b0 } else { b1 });
                    }
                    let dx = t.xd[r * nsb + b];
                    if K == Q4 {
                        *a += isum as f32 * (t.d[pb * LANES + l] * dx);
                        *a -= corr as f32 * (t.dmin[pb * LANES + l] * dx);
                    } else {
                        *a += (isum - 32 * corr) as f32 * (t.d[pb * LANES + l] * dx);
                    }
                }
            }
        }
    }
    acc
}

/// The integer tile with AVX2: per group of 4 elements of `in`, each
/// panel's 16 rows × 4 quants are two 32-byte vectors (Q4_K: one load, the
/// nibbles split by and/shift), `maddubs` against each row's 4
/// activations broadcast gives int16 pair sums, added up per sub-block
/// (Q6_K: per 2 groups, where int16 would overflow further), then `madd`
/// by the sub-block scales into int32 per super-block; at its end the
/// mins (or `−32`) from the `bsums`, and one f32 multiply-add by `d·d_x`.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn int_tile_avx2<const K: u8, const MR: usize, const NV: usize>(t: &ITile<'_>) -> Acc<MR, NV> {
    use std::arch::x86_64::*;
    let kind = kind_of(K);
    t.check::<MR>(kind);
    let (nsb, pairs, sbb) = (t.nsb, kind.pairs(), kind.int_sb_bytes());
    // Every loop runs over all NV panels (constant bounds: the arrays stay
    // in registers); a missing last panel reads the last present one and
    // is not stored.
    let last = t.np.min(NV) - 1;
    let inp = nsb * QK_K;
    // Groups of 4 elements per sub-block, and per int16 sum: Q4_K's
    // 8 × 2 × 15 × 128 < 2¹⁵, Q6_K's 2 × 2 × 63 × 128 < 2¹⁵.
    let gsub = kind.sub() / 4;
    let gsum = if K == Q4 { 8 } else { 2 };
    let mask = _mm256_set1_epi8(0x0F);
    // Byte shuffles picking sub-block 0 or 1 of a pair, each twice.
    let pick = [
        _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14),
        _mm_setr_epi8(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15),
    ];
    let (qs, sc) = (t.qs.as_ptr(), t.sc.as_ptr());
    let corr_src = if K == Q4 { t.mn.as_ptr() } else { sc };
    let mut facc = [[[_mm256_setzero_ps(); 2]; NV]; MR];
    for b in 0..nsb {
        if MR == 1 {
            // Decode: the next super-block's scales (past a panel's last,
            // the next panel's first), which lie in four arrays of their
            // own; without this their misses held up the quants' stream
            // (a Q4_K_M decode step took 1.5–6 % longer).
            for p in 0..NV {
                let pb = p.min(last) * nsb + b + 1;
                let (at, bytes) = (pb * pairs * LANES * 2, pairs * LANES * 2);
                for line in (at..at + bytes).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(sc.wrapping_add(line).cast());
                    if K == Q4 {
                        _mm_prefetch::<_MM_HINT_T0>(t.mn.as_ptr().wrapping_add(line).cast());
                    }
                }
                _mm_prefetch::<_MM_HINT_T0>(t.d.as_ptr().wrapping_add(pb * LANES).cast());
                if K == Q4 {
                    _mm_prefetch::<_MM_HINT_T0>(t.dmin.as_ptr().wrapping_add(pb * LANES).cast());
                }
            }
        }
        let mut iacc = [[[_mm256_setzero_si256(); 2]; NV]; MR];
        for s in 0..QK_K / kind.sub() {
            let mut sc16 = [[_mm256_setzero_si256(); 2]; NV];
            for (p, v) in sc16.iter_mut().enumerate() {
                for (h, v) in v.iter_mut().enumerate() {
                    let at = (((p.min(last) * nsb + b) * pairs + s / 2) * LANES + 8 * h) * 2;
                    // SAFETY: p ≤ last < np, b < nsb, s / 2 < pairs: 16
                    // bytes inside `sc` (checked).
                    let raw = unsafe { _mm_loadu_si128(sc.add(at).cast()) };
                    *v = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(raw, pick[s % 2]));
                }
            }
            for a in 0..gsub / gsum {
                let mut s16 = [[[_mm256_setzero_si256(); 2]; NV]; MR];
                for gg in 0..gsum {
                    let g = s * gsub + a * gsum + gg;
                    let mut xb = [_mm256_setzero_si256(); MR];
                    for (r, v) in xb.iter_mut().enumerate() {
                        let at = r * inp + b * QK_K + 4 * g;
                        // SAFETY: r < MR, 4g + 4 ≤ 256: inside `xq`.
                        *v = _mm256_set1_epi32(unsafe {
                            t.xq.as_ptr().add(at).cast::<i32>().read_unaligned()
                        });
                    }
                    for p in 0..NV {
                        let base = (p.min(last) * nsb + b) * sbb;
                        // SAFETY: p ≤ last < np, b < nsb, g < 64: inside `qs`.
                        let (w0, w1) = unsafe {
                            if K == Q4 {
                                let v = _mm256_loadu_si256(qs.add(base + 32 * g).cast());
                                (
                                    _mm256_and_si256(v, mask),
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                                )
                            } else {
                                (
                                    _mm256_loadu_si256(qs.add(base + 64 * g).cast()),
                                    _mm256_loadu_si256(qs.add(base + 64 * g + 32).cast()),
                                )
                            }
                        };
                        for (s16_r, x) in s16.iter_mut().zip(&xb) {
                            let v = &mut s16_r[p];
                            v[0] = _mm256_add_epi16(v[0], _mm256_maddubs_epi16(w0, *x));
                            v[1] = _mm256_add_epi16(v[1], _mm256_maddubs_epi16(w1, *x));
                        }
                    }
                }
                for (ia_r, s16_r) in iacc.iter_mut().zip(&s16) {
                    for p in 0..NV {
                        for h in 0..2 {
                            let m = _mm256_madd_epi16(s16_r[p][h], sc16[p][h]);
                            ia_r[p][h] = _mm256_add_epi32(ia_r[p][h], m);
                        }
                    }
                }
            }
        }
        // The super-block's mins (or `−32`) and its f32 scale.
        for p in 0..NV {
            let pb = p.min(last) * nsb + b;
            for (r, (fa_r, ia_r)) in facc.iter_mut().zip(&iacc).enumerate() {
                let dx = _mm256_set1_ps(t.xd[r * nsb + b]);
                let mut c = [_mm256_setzero_si256(); 2];
                for i in 0..pairs {
                    let (b0, b1) = t.bsum_pair(kind, r, b, i);
                    let pair = _mm256_set1_epi32(i32::from(b0 as u16) | (i32::from(b1) << 16));
                    for (h, c) in c.iter_mut().enumerate() {
                        let at = ((pb * pairs + i) * LANES + 8 * h) * 2;
                        // SAFETY: as for `sc16`.
                        let v = unsafe { _mm_loadu_si128(corr_src.add(at).cast()) };
                        let m = _mm256_madd_epi16(_mm256_cvtepi8_epi16(v), pair);
                        *c = _mm256_add_epi32(*c, m);
                    }
                }
                for h in 0..2 {
                    // SAFETY: pb < np · nsb: 16 floats of `d` (and `dmin`).
                    let d = unsafe { _mm256_loadu_ps(t.d.as_ptr().add(pb * LANES + 8 * h)) };
                    let a = &mut fa_r[p][h];
                    if K == Q4 {
                        // SAFETY: as `d`: Q4_K has `dmin` (checked).
                        let dm =
                            unsafe { _mm256_loadu_ps(t.dmin.as_ptr().add(pb * LANES + 8 * h)) };
                        let i = _mm256_cvtepi32_ps(ia_r[p][h]);
                        *a = _mm256_fmadd_ps(i, _mm256_mul_ps(d, dx), *a);
                        let m = _mm256_cvtepi32_ps(c[h]);
                        *a = _mm256_fnmadd_ps(m, _mm256_mul_ps(dm, dx), *a);
                    } else {
                        let i = _mm256_sub_epi32(ia_r[p][h], _mm256_slli_epi32::<5>(c[h]));
                        let i = _mm256_cvtepi32_ps(i);
                        *a = _mm256_fmadd_ps(i, _mm256_mul_ps(d, dx), *a);
                    }
                }
            }
        }
    }
    let mut res = [[[0f32; LANES]; NV]; MR];
    for (dst_r, acc_r) in res.iter_mut().zip(&facc) {
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
    use crate::kernel_reference::{isas_checked, product_f64, rel_diff_f64};
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
        // The f32 rebuild: different summation orders of the same f32
        // products. The integer products: activations rounded to 8 bits
        // (see `INT_TOL_DEQ`).
        let tol = if p.int.is_some() { INT_TOL_DEQ } else { 1e-5 };
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
            let (clean, _) = quantized(dtype, out, inp, 0);
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

    /// The integer products against the exact product of their operands
    /// (see `kernel_reference`): the dequantized weights (exactly candle's)
    /// times the activations as the portable Q8_K quantizer rounds them. The
    /// kernels scale by `sc` in integers and by `d` per super-block in f32,
    /// so they differ from it by the f32 rounding of a few terms per
    /// super-block.
    const INT_TOL_EXACT: f64 = 2e-6;

    /// The integer products against the dequantized f32 product: each
    /// activation is rounded to 8 bits (an error of up to half a step,
    /// amax/254, per value), which on these weights (large per-row offsets
    /// that cancel) moves a product by up to 1.1 % of max |y| (measured
    /// 1.08e-2 at most).
    const INT_TOL_DEQ: f32 = 2e-2;

    /// Rows of activations of varied magnitudes per 256-block and row.
    fn varied_input(rows: usize, inp: usize, seed: usize) -> Vec<f32> {
        (0..rows * inp)
            .map(|i| {
                let h = (i * 2246822519 + seed * 3266489917) % 65521;
                (h as f32 / 65521.0 - 0.5) * (0.2 + (i / QK_K % 7) as f32)
            })
            .collect()
    }

    /// `x` as the portable Q8_K quantizer rounds it, dequantized in f64.
    fn q8k_operand(x: &[f32], rows: usize, inp: usize) -> Vec<f64> {
        let mut q = crate::q8k::Q8K::default();
        q.quantize(Isa::get(IsaKind::Portable).unwrap(), x, rows, inp);
        q.qs.iter()
            .enumerate()
            .map(|(k, &v)| f64::from(q.d[k / QK_K]) * f64::from(v))
            .collect()
    }

    /// The integer product of Q4_K and Q6_K weights against the exact
    /// product of its operands and against the dequantized product, every ISA.
    fn check_int(rows: usize, inp: usize, out: usize) {
        for (kind, dtype) in [(KQuant::Q4K, GgmlDType::Q4K), (KQuant::Q6K, GgmlDType::Q6K)] {
            let (blocks, deq) = quantized(dtype, out, inp, rows + out);
            let p = PackedKQuant::from_blocks(kind, &blocks, out, inp).unwrap();
            assert!(p.int.is_some(), "{kind:?} runs integer products");
            let x = varied_input(rows, inp, out);
            let c = product_f64(&q8k_operand(&x, rows, inp), &deq, rows, inp, out);
            let e = naive(&x, &deq, rows, inp, out);
            for isa in isas_checked(&format!("{kind:?} integer [{rows}x{inp}x{out}]")) {
                let mut y = vec![f32::NAN; 5];
                p.product(isa, &x, rows, &mut y);
                let at = format!("{isa:?} {kind:?} [{rows}x{inp}x{out}]");
                let (d, i) = rel_diff_f64(&y, &c);
                assert!(
                    d < INT_TOL_EXACT,
                    "{at} vs exact, cell {i}: {} vs {} (rel {d})",
                    y[i],
                    c[i]
                );
                let (d, i) = rel_diff(&y, &e);
                assert!(
                    d < INT_TOL_DEQ,
                    "{at} vs f32, cell {i}: {} vs {} (rel {d})",
                    y[i],
                    e[i]
                );
            }
        }
    }

    #[test]
    fn integer_products_match_the_exact_product() {
        // out not a multiple of a panel and a multiple.
        for rows in [1, 3, 8, 33, 128] {
            check_int(rows, 512, 61);
            check_int(rows, 256, 48);
        }
    }

    #[test]
    fn integer_products_match_the_exact_product_in_parallel() {
        check_int(1, 1024, 1100);
        check_int(8, 512, 300);
        check_int(128, 256, 80);
    }

    #[test]
    fn integer_layout_bytes() {
        // Q4_K: 0.5 byte of quants + 2 int8 per 32 + 2 f32 per 256, as
        // before; Q6_K: 1 byte + 1 int8 per 16 + 1 f32 per 256.
        for (kind, dtype, per_weight) in [
            (KQuant::Q4K, GgmlDType::Q4K, 0.59375),
            (KQuant::Q6K, GgmlDType::Q6K, 1.078125),
        ] {
            let (b, deq) = quantized(dtype, 20, 512, 0);
            let p = PackedKQuant::from_blocks(kind, &b, 20, 512).unwrap();
            assert_eq!(kind.packed_bytes_per_weight(), per_weight);
            // Two panels (32 rows, padded).
            assert_eq!(p.size_bytes() as f64, 32.0 * 512.0 * per_weight, "{kind:?}");
            assert_eq!(p.dequantize(), deq, "{kind:?} round trip");
            let r = PackedKQuant::from_blocks_rebuild(kind, &b, 20, 512).unwrap();
            assert!(r.int.is_none());
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
        assert!(e.to_string().contains("not a multiple of 256"), "{e}");
        let e = PackedKQuant::from_blocks(KQuant::Q6K, &[0; 209], 1, 256).unwrap_err();
        assert!(
            e.to_string().contains("holds 209 bytes, expected 210"),
            "{e}"
        );
    }
}
