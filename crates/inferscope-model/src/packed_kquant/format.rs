//! The K-quant formats as GGUF stores them: super-blocks of [`QK_K`]
//! weights, each with an f16 scale `d` (and for Q4_K/Q5_K an f16 `dmin`)
//! and small integer scales per sub-block: `w = d·sc·q − dmin·m` over
//! sub-blocks of 32 (Q4_K: 4-bit `q`, Q5_K: 5-bit; `sc`, `m` 6-bit),
//! `w = d·sc·(q − 32)` over sub-blocks of 16 (Q6_K: 6-bit `q`, int8 `sc`).
//! IQ4_XS has the same shape: `w = d·sc·KVALUES[q]` over sub-blocks of 32
//! (4-bit `q`, an index into llama.cpp's non-linear table; `sc` 6-bit − 32).
//! Loading decodes each block on the stack ([`Block`]) and places it in
//! its panel; [`Rows`], one value per element, is the common form of the
//! slower paths (fusing parts that end inside a panel, dequantizing).

use half::f16;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

/// Which K-quant format a [`PackedKQuant`](super::PackedKQuant) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuant {
    /// 4-bit quants, 6-bit scales and mins per 32: 4.5 bits per weight.
    Q4K,
    /// 5-bit quants, 6-bit scales and mins per 32: 5.5 bits per weight.
    Q5K,
    /// 6-bit quants, int8 scales per 16: 6.5625 bits per weight.
    Q6K,
    /// 4-bit indices into a non-linear table, 6-bit scales per 32: 4.25
    /// bits per weight.
    Iq4Xs,
}

// The kinds as const-generic parameters of the kernels.
pub(super) const Q4: u8 = 0;
pub(super) const Q5: u8 = 1;
pub(super) const Q6: u8 = 2;
pub(super) const IQ4: u8 = 3;

/// The kind with id `K`.
pub(super) const fn kind_of(k: u8) -> KQuant {
    match k {
        Q4 => KQuant::Q4K,
        Q5 => KQuant::Q5K,
        Q6 => KQuant::Q6K,
        _ => KQuant::Iq4Xs,
    }
}

impl KQuant {
    /// Weights per sub-block (one scale each).
    pub const fn sub(self) -> usize {
        match self {
            Self::Q4K | Self::Q5K | Self::Iq4Xs => 32,
            Self::Q6K => 16,
        }
    }

    /// Whether sub-blocks have a min (`− dmin·m`).
    pub(super) const fn has_min(self) -> bool {
        matches!(self, Self::Q4K | Self::Q5K)
    }

    /// Whether its quants are 4-bit (two per byte in the panels).
    pub(super) const fn nibbles(self) -> bool {
        matches!(self, Self::Q4K | Self::Iq4Xs)
    }

    /// Bytes of a super-block in a GGUF file.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Iq4Xs => crate::iq4::IQ4_XS_BLOCK_BYTES,
        }
    }
}

/// A K-quant matrix unpacked to one value per element, row-major: the
/// common form between the file's blocks and the panels (loading and
/// fusing go through it).
#[derive(Default)]
pub(super) struct Rows {
    /// `[out][inp]`: Q4_K 0..16, Q5_K 0..32, Q6_K −32..32 (`q − 32`),
    /// IQ4_XS the table index 0..16.
    pub(super) q: Vec<i8>,
    /// `[out][inp / sub]` sub-block scales.
    pub(super) sc: Vec<i8>,
    /// `[out][inp / sub]` sub-block mins (empty for Q6_K).
    pub(super) mn: Vec<i8>,
    /// `[out][inp / 256]` super-block scales.
    pub(super) d: Vec<f32>,
    /// `[out][inp / 256]` super-block min scales (empty for Q6_K).
    pub(super) dmin: Vec<f32>,
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

/// One super-block's scales unpacked, as [`Rows`] holds each (its quants
/// go to the caller's buffer): decoded on the stack, then placed.
#[derive(Default)]
pub(super) struct Block {
    /// Sub-block scales (the first `256 / sub`).
    pub(super) sc: [i8; 16],
    /// Sub-block mins (Q4_K, Q5_K).
    pub(super) mn: [i8; 16],
    /// Super-block scale.
    pub(super) d: f32,
    /// Super-block min scale (Q4_K, Q5_K).
    pub(super) dmin: f32,
}

impl Block {
    /// Decodes one GGUF super-block `blk` of `kind` (`kind.block_bytes()`
    /// bytes): its quants into `q` (as [`Rows::q`]), its scales into
    /// `self`, every field the kind has overwritten.
    pub(super) fn decode(&mut self, kind: KQuant, blk: &[u8], q: &mut [i8; QK_K]) {
        let sc = &mut self.sc;
        match kind {
            KQuant::Q4K | KQuant::Q5K => {
                self.d = f16_at(blk, 0);
                self.dmin = f16_at(blk, 2);
                let scales = &blk[4..16];
                for (j, (s, m)) in sc.iter_mut().zip(self.mn.iter_mut()).take(8).enumerate() {
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
            KQuant::Iq4Xs => {
                self.d = f16_at(blk, 0);
                for (j, s) in sc.iter_mut().take(8).enumerate() {
                    *s = crate::iq4::xs_scale(blk, j) as i8 - 32;
                }
                for (j, &b) in blk[8..].iter().enumerate() {
                    let (sub, l) = (j / 16, j % 16);
                    q[sub * 32 + l] = (b & 0xF) as i8;
                    q[sub * 32 + 16 + l] = (b >> 4) as i8;
                }
            }
            KQuant::Q6K => {
                let (ql, qh) = (&blk[0..128], &blk[128..192]);
                for (s, &b) in sc.iter_mut().zip(&blk[192..208]) {
                    *s = b as i8;
                }
                self.d = f16_at(blk, 208);
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
}

impl Rows {
    /// `[out][inp]` of zeros (no mins for Q6_K).
    pub(super) fn zeroed(kind: KQuant, out: usize, inp: usize) -> Self {
        let (nsb, nsub) = (inp / QK_K, inp / kind.sub());
        let mins = usize::from(kind.has_min());
        Rows {
            q: vec![0; out * inp],
            sc: vec![0; out * nsub],
            mn: vec![0; mins * out * nsub],
            d: vec![0.0; out * nsb],
            dmin: vec![0.0; mins * out * nsb],
        }
    }

    /// Unpacks the GGUF blocks of a row-major `[out][inp]` matrix (loading
    /// decodes each block straight into its panel instead; this is the
    /// reference the tests compare that with).
    #[cfg(test)]
    pub(super) fn from_blocks(kind: KQuant, data: &[u8], out: usize, inp: usize) -> Self {
        let mut r = Rows::zeroed(kind, out, inp);
        let per = QK_K / kind.sub();
        let mut b = Block::default();
        for (i, blk) in data.chunks_exact(kind.block_bytes()).enumerate() {
            let q = (&mut r.q[i * QK_K..][..QK_K])
                .try_into()
                .expect("256 quants");
            b.decode(kind, blk, q);
            r.sc[i * per..][..per].copy_from_slice(&b.sc[..per]);
            r.d[i] = b.d;
            if kind.has_min() {
                r.mn[i * per..][..per].copy_from_slice(&b.mn[..per]);
                r.dmin[i] = b.dmin;
            }
        }
        r
    }
    /// `other`'s rows after these (fused projections).
    pub(super) fn extend(&mut self, other: Rows) {
        self.q.extend(other.q);
        self.sc.extend(other.sc);
        self.mn.extend(other.mn);
        self.d.extend(other.d);
        self.dmin.extend(other.dmin);
    }

    /// The weights, row-major `[out][inp]`, as the format defines them
    /// (equal to candle's dequantization, and for IQ4_XS to ggml's).
    pub(super) fn dequantize(&self, kind: KQuant, out: usize, inp: usize) -> Vec<f32> {
        let sub = kind.sub();
        let (nsub, nsb) = (inp / sub, inp / QK_K);
        let mut w = vec![0f32; out * inp];
        for o in 0..out {
            for k in 0..inp {
                let (b, sb) = (o * nsub + k / sub, o * nsb + k / QK_K);
                let s = self.d[sb] * f32::from(self.sc[b]);
                let q = self.q[o * inp + k];
                let q = f32::from(if kind == KQuant::Iq4Xs {
                    crate::iq4::KVALUES[q as usize]
                } else {
                    q
                });
                w[o * inp + k] = if kind.has_min() {
                    s * q - self.dmin[sb] * f32::from(self.mn[b])
                } else {
                    s * q
                };
            }
        }
        w
    }
}
