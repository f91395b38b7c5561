//! llama.cpp's non-linear 4-bit formats, as GGUF stores them, and their
//! scalar dequantization (written from ggml's `dequantize_row_iq4_nl` and
//! `dequantize_row_iq4_xs`; the tests check it against gguf-py's).
//!
//! - IQ4_NL: blocks of 32: an f16 `d`, then 16 bytes of 4-bit indices
//!   (element `j` in the low nibble of byte `j`, element `j + 16` in its
//!   high one); `w = d · KVALUES[index]`.
//! - IQ4_XS: super-blocks of 256: an f16 `d`, a u16 of the high 2 bits and
//!   4 bytes of the low 4 bits of eight 6-bit scales `ls` (one per 32), then
//!   128 bytes of indices laid out per 32 as IQ4_NL's;
//!   `w = d · (ls − 32) · KVALUES[index]`.
//!
//! Products: IQ4_XS runs the K-quant integer kernels (`packed_kquant`, the
//! table looked up in registers); an IQ4_NL block is exactly a Q8_0 block
//! (`d` and int8 `KVALUES[index]`), so IQ4_NL weights are repacked as Q8_0
//! ([`nl_to_q8_0`]) for its integer kernels.

use half::f16;

/// The 16 values a 4-bit index stands for (ggml's `kvalues_iq4nl`).
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Weights per IQ4_NL block.
pub const QK4_NL: usize = 32;
/// Bytes of an IQ4_NL block: `d`, 16 bytes of indices.
pub const IQ4_NL_BLOCK_BYTES: usize = 2 + QK4_NL / 2;
/// Weights per IQ4_XS super-block.
pub const QK_K: usize = 256;
/// Bytes of an IQ4_XS super-block: `d`, `scales_h`, `scales_l[4]`, 128
/// bytes of indices.
pub const IQ4_XS_BLOCK_BYTES: usize = 2 + 2 + QK_K / 64 + QK_K / 2;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 32 indices of one 16-byte run, in element order.
fn indices(qs: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let lo = qs.iter().map(|&b| usize::from(b & 0xF));
    lo.chain(qs.iter().map(|&b| usize::from(b >> 4)))
}

/// IQ4_XS sub-block `ib`'s 6-bit scale `ls` (0..64; the weight scale is
/// `ls − 32`) from a super-block's bytes.
pub(crate) fn xs_scale(blk: &[u8], ib: usize) -> u8 {
    let h = u16::from_le_bytes([blk[2], blk[3]]);
    let l = (blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
    l | (((h >> (2 * ib)) & 3) as u8) << 4
}

/// Dequantizes a row of IQ4_NL blocks into `out` (as many values as the
/// blocks hold).
pub fn dequantize_nl(row: &[u8], out: &mut [f32]) {
    for (blk, y) in row
        .chunks_exact(IQ4_NL_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK4_NL))
    {
        let d = f16_at(blk, 0);
        for (y, i) in y.iter_mut().zip(indices(&blk[2..])) {
            *y = d * f32::from(KVALUES[i]);
        }
    }
}

/// Dequantizes a row of IQ4_XS super-blocks into `out`.
pub fn dequantize_xs(row: &[u8], out: &mut [f32]) {
    for (blk, y) in row
        .chunks_exact(IQ4_XS_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(blk, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            // As ggml: the sub-block's scale in f32 first, then each weight.
            let dl = d * (f32::from(xs_scale(blk, ib)) - 32.0);
            let qs = &blk[8 + 16 * ib..][..16];
            for (y, i) in y.iter_mut().zip(indices(qs)) {
                *y = dl * f32::from(KVALUES[i]);
            }
        }
    }
}

/// IQ4_NL blocks as the Q8_0 blocks of the same weights: each block's `d`
/// as it is, each index replaced by its int8 table value.
pub fn nl_to_q8_0(data: &[u8]) -> Vec<u8> {
    let mut q8 = Vec::with_capacity(data.len() / IQ4_NL_BLOCK_BYTES * (2 + QK4_NL));
    for blk in data.chunks_exact(IQ4_NL_BLOCK_BYTES) {
        q8.extend_from_slice(&blk[..2]);
        q8.extend(indices(&blk[2..]).map(|i| KVALUES[i] as u8));
    }
    q8
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// gguf-py's dequantization of fixed blocks (see the fixture's script).
    pub(crate) struct Fixture {
        pub(crate) nl: (Vec<u8>, Vec<f32>),
        pub(crate) xs: (Vec<u8>, Vec<f32>),
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    pub(crate) fn fixture() -> Fixture {
        let text = include_str!("../tests/data/iq4_gguf_py.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let part = |k: &str| {
            let p = &v[k];
            let vals = p["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            (hex(p["blocks"].as_str().unwrap()), vals)
        };
        Fixture {
            nl: part("IQ4_NL"),
            xs: part("IQ4_XS"),
        }
    }

    #[test]
    fn dequantization_matches_gguf_py() {
        let f = fixture();
        for (name, (blocks, want), deq) in [
            ("IQ4_NL", &f.nl, dequantize_nl as fn(&[u8], &mut [f32])),
            ("IQ4_XS", &f.xs, dequantize_xs),
        ] {
            let mut got = vec![f32::NAN; want.len()];
            deq(blocks, &mut got);
            // gguf-py computes in f32 too: equal to the bit.
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{name} value {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn nl_blocks_are_q8_0_blocks_of_the_same_weights() {
        let (blocks, want) = fixture().nl;
        let q8 = nl_to_q8_0(&blocks);
        let p = crate::packed_q8::PackedQ8::from_blocks(&q8, 1, want.len()).unwrap();
        assert_eq!(p.dequantize(), want);
    }
}
