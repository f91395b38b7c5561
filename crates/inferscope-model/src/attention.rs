//! Causal grouped-query attention over the paged KV pool.

use rayon::prelude::*;

use crate::elementwise::exp_in_place;
#[cfg(target_arch = "x86_64")]
use crate::isa::{Isa, IsaKind};
use crate::kv_storage::{KvData, KvElem, KvStorage, KvView};

/// Where one token of the step attends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenCtx {
    /// The token's position: it attends to positions `0..=pos`.
    pub pos: usize,
    /// Offset of its sequence's block table in the batch's flattened tables.
    pub table_offset: usize,
}

/// Attention shapes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Positions a token attends to, itself included (sliding window).
    pub window: Option<usize>,
    /// Multiplies the scores: `1/√head_dim`, or `1/√query_pre_attn_scalar`.
    pub scale: f32,
    /// Scaled scores become `cap · tanh(s / cap)` (Gemma 2).
    pub softcap: Option<f32>,
}

/// The queries of a step: token `t`'s head `h` is `d` floats at
/// `t * stride + h * d` (the q part of the fused q/k/v rows).
#[derive(Clone, Copy)]
pub(crate) struct Queries<'a> {
    pub data: &'a [f32],
    pub stride: usize,
}

/// `out[t, h, :] = softmax(q[t, h] · K[0..=pos]ᵀ / √d) · V[0..=pos]` for every
/// token and query head; K/V come from the pool through the block table.
/// `out` is `[tokens][num_heads * head_dim]`. One unit of work is a token's
/// KV head with all the query heads that share it, so each key and value is
/// read once for the group.
pub(crate) fn paged_attention(
    q: Queries<'_>,
    out: &mut [f32],
    tokens: &[TokenCtx],
    block_tables: &[u32],
    pool: &KvStorage,
    layer: usize,
    shape: AttnShape,
) {
    // One dispatch per layer on the element type; the kernels widen each
    // row of keys or values to f32 as they load it (no pass over the cache).
    match pool.data() {
        KvData::F32(a) => attention_typed(q, out, tokens, block_tables, pool.view(a), layer, shape),
        KvData::F16(a) => attention_typed(q, out, tokens, block_tables, pool.view(a), layer, shape),
        KvData::Bf16(a) => {
            attention_typed(q, out, tokens, block_tables, pool.view(a), layer, shape)
        }
    }
}

/// [`paged_attention`] over a store of `T` elements.
fn attention_typed<T: KvElem>(
    q: Queries<'_>,
    out: &mut [f32],
    tokens: &[TokenCtx],
    block_tables: &[u32],
    pool: KvView<'_, T>,
    layer: usize,
    shape: AttnShape,
) {
    let AttnShape {
        num_heads,
        num_kv_heads,
        head_dim: d,
        window,
        scale,
        softcap,
    } = shape;
    let group = num_heads / num_kv_heads;
    #[cfg(target_arch = "x86_64")]
    let avx2 = Isa::get(IsaKind::Avx2).is_some();
    let work = |scores: &mut Vec<f32>, (idx, o): (usize, &mut [f32])| {
        let (t, kv_head) = (idx / num_kv_heads, idx % num_kv_heads);
        let q0 = t * q.stride + kv_head * group * d;
        let g = Group {
            q: &q.data[q0..q0 + group * d],
            heads: group,
            kv_head,
            ctx: tokens[t],
            window,
            block_tables,
            pool,
            layer,
            scale,
            softcap,
        };
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the CPU supports the features the function is compiled for.
            unsafe { attend_avx2(&g, scores, o) };
            return;
        }
        attend::<false, T>(&g, scores, o);
    };
    // Small steps run on one thread: a parallel section's synchronisation
    // costs more than the work, and far more when other processes hold the
    // cores. A decode step with a long context is small in multiply-adds
    // but reads every key and value from memory (the weights streamed
    // since the last layer evicted them), which two threads do faster.
    let seen = |t: &TokenCtx| window.map_or(t.pos + 1, |w| w.min(t.pos + 1));
    let positions: usize = tokens.iter().map(seen).sum();
    let macs = positions * num_heads * d;
    let kv_bytes = positions * num_kv_heads * d * 2 * T::DTYPE.size_bytes();
    let unit = group * d;
    if !parallel_attention(macs, kv_bytes, tokens.len() * num_kv_heads) {
        let mut scores = Vec::new();
        out.chunks_mut(unit)
            .enumerate()
            .for_each(|item| work(&mut scores, item));
    } else {
        out.par_chunks_mut(unit)
            .enumerate()
            .for_each_init(Vec::new, work);
    }
}

/// Multiply-adds below which attention runs on one thread...
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// ...unless it reads at least this many bytes of keys and values.
const PARALLEL_MIN_KV_BYTES: usize = 128 << 10;

/// Whether attention over `units` (token, KV head) pairs splits across
/// the pool.
fn parallel_attention(macs: usize, kv_bytes: usize, units: usize) -> bool {
    units > 1 && (macs >= PARALLEL_MIN_MACS || kv_bytes >= PARALLEL_MIN_KV_BYTES)
}

/// One token's KV head and the query heads that share it.
struct Group<'a, T> {
    /// `[heads][head_dim]`.
    q: &'a [f32],
    heads: usize,
    kv_head: usize,
    ctx: TokenCtx,
    window: Option<usize>,
    block_tables: &'a [u32],
    pool: KvView<'a, T>,
    layer: usize,
    scale: f32,
    softcap: Option<f32>,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn attend_avx2<T: KvElem>(g: &Group<'_, T>, scores: &mut Vec<f32>, o: &mut [f32]) {
    // The same code, compiled so that the loops along the slots and along
    // `head_dim` vectorise 8-wide with fused multiply-adds.
    attend::<true, T>(g, scores, o)
}

/// `a · b + c`: one instruction where FMA is enabled; where it is not,
/// `mul_add` would be a slow libm call, so the portable build multiplies
/// and adds.
#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// Scales the scores in place and returns their maximum, 8 lanes at a time
/// (`f32::max` would not vectorise: it must handle NaN).
#[inline(always)]
fn scale_and_max(s: &mut [f32], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        for (x, m) in c.iter_mut().zip(&mut lanes) {
            *x *= scale;
            *m = if *x > *m { *x } else { *m };
        }
    }
    let mut max = lanes
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    for x in chunks.into_remainder() {
        *x *= scale;
        max = if *x > max { *x } else { max };
    }
    max
}

/// `s[j] = Σ_i q[i] · kt[i][j]` for one block of transposed keys.
#[inline(always)]
fn score_block<const FMA: bool, T: KvElem>(q: &[f32], kt: &[T], s: &mut [f32]) {
    let bs = s.len();
    if bs == 16 {
        // The default block size: the accumulators stay in registers.
        let mut acc = [0f32; 16];
        for (qi, row) in q.iter().zip(kt.chunks_exact(16)) {
            for (a, k) in acc.iter_mut().zip(row) {
                *a = fmadd::<FMA>(*qi, k.to_f32(), *a);
            }
        }
        s.copy_from_slice(&acc);
        return;
    }
    s.fill(0.0);
    for (qi, row) in q.iter().zip(kt.chunks_exact(bs)) {
        for (a, k) in s.iter_mut().zip(row) {
            *a = fmadd::<FMA>(*qi, k.to_f32(), *a);
        }
    }
}

/// The block size whose scores [`score_block_heads`] computes.
const HEADS_BLOCK: usize = 16;

/// [`score_block`] with FMA for `R` query heads at once (`q` is `[R][d]`)
/// against one block of [`HEADS_BLOCK`] transposed keys, head `r`'s scores
/// going to `s[r · stride..][..16]`: each key row is loaded once for all
/// the heads, and their 2·R accumulator chains keep both FMA units busy
/// (one head's two chains waited on the multiply-add latency: two-fifths
/// of a 128-token prefill's attention). Each score is summed in the same
/// order, with the same fused multiply-adds, as [`score_block`]'s.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn score_block_heads_avx2<const R: usize, T: KvElem>(
    q: &[f32],
    kt: &[T],
    s: &mut [f32],
    stride: usize,
) {
    use std::arch::x86_64::*;
    let d = q.len() / R;
    assert!(kt.len() >= d * HEADS_BLOCK && s.len() >= (R - 1) * stride + HEADS_BLOCK);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let (qp, kp) = (q.as_ptr(), kt.as_ptr());
    for i in 0..d {
        // SAFETY: i < d: the key row `i` (16 floats) is inside `kt`, and
        // each head's element `i` inside `q` (checked above).
        unsafe {
            let k0 = load8(kp.add(i * HEADS_BLOCK));
            let k1 = load8(kp.add(i * HEADS_BLOCK + 8));
            for (r, a) in acc.iter_mut().enumerate() {
                let qv = _mm256_broadcast_ss(&*qp.add(r * d + i));
                a[0] = _mm256_fmadd_ps(qv, k0, a[0]);
                a[1] = _mm256_fmadd_ps(qv, k1, a[1]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: 16 floats from r · stride are inside `s` (checked above).
        unsafe {
            _mm256_storeu_ps(s.as_mut_ptr().add(r * stride), a[0]);
            _mm256_storeu_ps(s.as_mut_ptr().add(r * stride + 8), a[1]);
        }
    }
}

#[inline(always)]
fn attend<const FMA: bool, T: KvElem>(g: &Group<'_, T>, scores: &mut Vec<f32>, o: &mut [f32]) {
    let d = g.q.len() / g.heads;
    let bs = g.pool.block_size();
    let n = g.ctx.pos + 1;
    // With a sliding window the token sees positions `first..n`; blocks
    // wholly before `first` are not read at all.
    let first = g.window.map_or(0, |w| n.saturating_sub(w));
    let (b0, n_blocks) = (first / bs, n.div_ceil(bs));
    // Scores of head i at `[i * stride + position - b0 * bs]`; the slots
    // past `n` in the last block are computed and ignored, those before
    // `first` in the first block get probability 0.
    let stride = (n_blocks - b0) * bs;
    let (skip, len) = (first - b0 * bs, n - b0 * bs);
    scores.clear();
    scores.resize(g.heads * stride, 0.0);
    let off = g.ctx.table_offset;
    let table = &g.block_tables[off + b0..off + n_blocks];
    for (bi, &block) in table.iter().enumerate() {
        let kt = g.pool.keys(g.layer, block as usize, g.kv_head);
        #[cfg(target_arch = "x86_64")]
        if FMA && bs == HEADS_BLOCK {
            // Up to 4 heads at a time against the block.
            let mut h = 0;
            while h < g.heads {
                let r = (g.heads - h).min(4);
                let q = &g.q[h * d..(h + r) * d];
                let s = &mut scores[h * stride + bi * bs..];
                // SAFETY: `FMA` is only set by `attend_avx2`, whose
                // caller checked that the CPU has AVX2 and FMA.
                unsafe {
                    match r {
                        4 => score_block_heads_avx2::<4, T>(q, kt, s, stride),
                        3 => score_block_heads_avx2::<3, T>(q, kt, s, stride),
                        2 => score_block_heads_avx2::<2, T>(q, kt, s, stride),
                        _ => score_block_heads_avx2::<1, T>(q, kt, s, stride),
                    }
                }
                h += r;
            }
            continue;
        }
        for (h, q) in g.q.chunks_exact(d).enumerate() {
            score_block::<FMA, T>(q, kt, &mut scores[h * stride + bi * bs..][..bs]);
        }
    }
    for h in 0..g.heads {
        let row = &mut scores[h * stride..h * stride + len];
        row[..skip].fill(0.0);
        let s = &mut row[skip..];
        let max = match g.softcap {
            None => scale_and_max(s, g.scale),
            Some(cap) => {
                // tanh is a libm call per score: only Gemma 2 pays it.
                let k = g.scale / cap;
                s.iter_mut().for_each(|x| *x = cap * (*x * k).tanh());
                scale_and_max(s, 1.0)
            }
        };
        s.iter_mut().for_each(|x| *x -= max);
        exp_in_place(s);
        let inv = 1.0 / s.iter().sum::<f32>();
        s.iter_mut().for_each(|x| *x *= inv);
    }
    for (h, oh) in o.chunks_exact_mut(d).enumerate() {
        let p = &scores[h * stride..h * stride + len];
        match d {
            // Common head sizes: the output row stays in registers.
            32 => weighted_sum::<32, FMA, T>(p, g, table, oh),
            64 => weighted_sum::<64, FMA, T>(p, g, table, oh),
            128 => weighted_sum::<128, FMA, T>(p, g, table, oh),
            _ => {
                oh.fill(0.0);
                for (bi, &block) in table.iter().enumerate() {
                    let vals = g.pool.values(g.layer, block as usize, g.kv_head);
                    for (&pj, val) in p[bi * bs..].iter().zip(vals.chunks_exact(d)) {
                        for (oi, vi) in oh.iter_mut().zip(val) {
                            *oi = fmadd::<FMA>(pj, vi.to_f32(), *oi);
                        }
                    }
                }
            }
        }
    }
}

/// `o = Σ_j p[j] · V[j]` over the sequence's value rows of `D` floats.
#[inline(always)]
fn weighted_sum<const D: usize, const FMA: bool, T: KvElem>(
    p: &[f32],
    g: &Group<'_, T>,
    table: &[u32],
    o: &mut [f32],
) {
    let bs = g.pool.block_size();
    #[cfg(target_arch = "x86_64")]
    if FMA && T::DTYPE != crate::kv_storage::KvDtype::F32 {
        // SAFETY: `FMA` is only set by `attend_avx2`, whose caller checked
        // that the CPU has AVX2, FMA and F16C.
        unsafe { weighted_sum_avx2::<D, T>(p, g, table, o) };
        return;
    }
    let mut acc = [0f32; D];
    for (bi, &block) in table.iter().enumerate() {
        let vals = g.pool.values(g.layer, block as usize, g.kv_head);
        for (&pj, val) in p[bi * bs..].iter().zip(vals.chunks_exact(D)) {
            for (a, v) in acc.iter_mut().zip(val) {
                *a = fmadd::<FMA>(pj, v.to_f32(), *a);
            }
        }
    }
    o.copy_from_slice(&acc);
}

/// 8 elements from `p` widened to f32: a load for f32, one conversion
/// instruction for f16 (F16C), a zero-extend and shift for bf16 (its bits
/// are the upper half of an f32's).
///
/// # Safety
/// The CPU has AVX2 and F16C; 8 elements from `p` are readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<T: KvElem>(p: *const T) -> std::arch::x86_64::__m256 {
    use crate::kv_storage::KvDtype;
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees 8 readable elements: 32 bytes for
    // f32, 16 for the 16-bit types.
    unsafe {
        match T::DTYPE {
            KvDtype::F32 => _mm256_loadu_ps(p.cast()),
            KvDtype::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            KvDtype::Bf16 => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p.cast()),
            ))),
        }
    }
}

/// [`weighted_sum`] for 16-bit values: each value row is widened 8 lanes
/// at a time in registers as it is read (the compiler does not vectorise
/// the scalar conversions). Each output is summed in the same order, with
/// the same fused multiply-adds, as the f32 path's.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_sum_avx2<const D: usize, T: KvElem>(
    p: &[f32],
    g: &Group<'_, T>,
    table: &[u32],
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    const { assert!(D.is_multiple_of(8)) };
    assert!(o.len() == D);
    let bs = g.pool.block_size();
    let mut acc = [_mm256_setzero_ps(); 16];
    let acc = &mut acc[..D / 8];
    for (bi, &block) in table.iter().enumerate() {
        let vals = g.pool.values(g.layer, block as usize, g.kv_head);
        for (&pj, val) in p[bi * bs..].iter().zip(vals.chunks_exact(D)) {
            let pv = _mm256_set1_ps(pj);
            for (c, a) in acc.iter_mut().enumerate() {
                // SAFETY: `val` holds D elements and c * 8 + 8 <= D.
                *a = _mm256_fmadd_ps(pv, unsafe { load8(val.as_ptr().add(c * 8)) }, *a);
            }
        }
    }
    for (c, a) in acc.iter().enumerate() {
        // SAFETY: `o` holds D floats (checked above).
        unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(c * 8), *a) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::SplitMix64;
    use crate::kv_storage::KvDtype;

    /// Softmax attention written out, over K/V rows `[pos][kv_heads * d]`.
    fn reference(
        q: &[f32],
        k: &[Vec<f32>],
        v: &[Vec<f32>],
        shape: AttnShape,
        n: usize,
    ) -> Vec<f32> {
        let (nh, nkv, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
        let group = nh / nkv;
        let mut out = vec![0f32; nh * d];
        for h in 0..nh {
            let kvh = h / group;
            let qh = &q[h * d..(h + 1) * d];
            let s: Vec<f32> = (0..n)
                .map(|p| {
                    let kh = &k[p][kvh * d..(kvh + 1) * d];
                    let s = qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>() * shape.scale;
                    shape.softcap.map_or(s, |c| c * (s / c).tanh())
                })
                .collect();
            let max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            for (p, ep) in e.iter().enumerate() {
                for i in 0..d {
                    out[h * d + i] += ep / sum * v[p][kvh * d + i];
                }
            }
        }
        out
    }

    /// A decode token at position `pos` over a pool filled with random K/V
    /// (blocks in reverse order, so the block table matters), against the
    /// reference.
    fn check_decode(pos: usize, shape: AttnShape, expect_parallel: bool) {
        check_decode_as(KvDtype::F32, pos, shape, expect_parallel);
    }

    /// [`check_decode`] over a pool of `dtype`, against the reference fed
    /// the K/V rounded to `dtype`: the kernels' widening is exact, so the
    /// tolerance is the f32 one.
    fn check_decode_as(dtype: KvDtype, pos: usize, shape: AttnShape, expect_parallel: bool) {
        let (nh, nkv, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
        let bs = 16;
        let n = pos + 1;
        let blocks = n.div_ceil(bs);
        let mut pool = KvStorage::with_dtype(dtype, 2, blocks + 1, bs, nkv, d);
        let table: Vec<u32> = (0..blocks as u32).rev().collect();
        let mut rng = SplitMix64::new(pos as u64);
        let mut rand = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let (k, v): (Vec<Vec<f32>>, Vec<Vec<f32>>) =
            (0..n).map(|_| (rand(nkv * d), rand(nkv * d))).unzip();
        for p in 0..n {
            pool.write(1, table[p / bs] as usize, p % bs, &k[p], &v[p]);
        }
        let round = |x: &Vec<f32>| -> Vec<f32> {
            x.iter()
                .map(|&x| match dtype {
                    KvDtype::F32 => x,
                    KvDtype::F16 => half::f16::from_f32(x).to_f32(),
                    KvDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
                })
                .collect()
        };
        let (k, v): (Vec<Vec<f32>>, Vec<Vec<f32>>) =
            (k.iter().map(round).collect(), v.iter().map(round).collect());
        let q = rand(nh * d);
        let kv_bytes = n * nkv * d * 2 * dtype.size_bytes();
        assert_eq!(
            parallel_attention(n * nh * d, kv_bytes, nkv),
            expect_parallel,
            "pos {pos}"
        );
        let mut out = vec![f32::NAN; nh * d];
        let ctx = [TokenCtx {
            pos,
            table_offset: 0,
        }];
        let queries = Queries {
            data: &q,
            stride: nh * d,
        };
        paged_attention(queries, &mut out, &ctx, &table, &pool, 1, shape);
        let want = reference(&q, &k, &v, shape, n);
        for (i, (a, b)) in out.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() < 1e-5,
                "{dtype:?} pos {pos}, output {i}: {a} vs {b}"
            );
        }
    }

    /// 16-bit caches: every kernel path (16-slot blocks scored 4, 2 and 1
    /// heads at a time; the register-held value sums of 32, 64 and 128
    /// dims; the generic loops of a 48-dim head; soft-capping; one thread
    /// and split) attends to exactly the rounded keys and values.
    #[test]
    fn sixteen_bit_caches_attend_to_their_rounded_keys_and_values() {
        for dtype in [KvDtype::F16, KvDtype::Bf16] {
            for (num_heads, num_kv_heads, head_dim, softcap) in [
                (6, 2, 64, None),
                (12, 2, 32, None),
                (5, 1, 128, None),
                (4, 4, 48, None),
                (4, 2, 32, Some(1.5)),
            ] {
                let shape = AttnShape {
                    num_heads,
                    num_kv_heads,
                    head_dim,
                    window: None,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    softcap,
                };
                check_decode_as(dtype, 40, shape, false);
            }
            let shape = AttnShape {
                num_heads: 6,
                num_kv_heads: 2,
                head_dim: 64,
                window: None,
                scale: 0.125,
                softcap: None,
            };
            check_decode_as(dtype, 700, shape, true);
        }
    }

    /// Decode attention gives the reference's outputs on one thread (short
    /// context) and split across the pool (a context whose K/V pass
    /// `PARALLEL_MIN_KV_BYTES`, though its multiply-adds do not).
    #[test]
    fn decode_attention_matches_the_reference_serial_and_parallel() {
        let shape = AttnShape {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 64,
            window: None,
            scale: 0.125,
            softcap: None,
        };
        check_decode(20, shape, false);
        check_decode(300, shape, true);
        const { assert!(300 * 6 * 64 < PARALLEL_MIN_MACS) };
        // Groups of 6 and 5 heads (scored 4 + 2 and 4 + 1 at a time), and
        // one head per KV head.
        for (num_heads, num_kv_heads) in [(12, 2), (5, 1), (4, 4)] {
            let shape = AttnShape {
                num_heads,
                num_kv_heads,
                head_dim: 32,
                window: None,
                scale: 1.0 / 32f32.sqrt(),
                softcap: None,
            };
            check_decode(40, shape, false);
        }
    }

    /// Gemma's score scale (`query_pre_attn_scalar`) and Gemma 2's tanh
    /// soft-capping (a cap small enough that it changes the result).
    #[test]
    fn decode_attention_with_scale_and_softcap_matches_the_reference() {
        let shape = AttnShape {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
            window: None,
            scale: 0.7,
            softcap: Some(1.5),
        };
        check_decode(40, shape, false);
    }

    #[test]
    fn one_unit_never_splits() {
        assert!(!parallel_attention(usize::MAX, usize::MAX, 1));
        assert!(parallel_attention(0, PARALLEL_MIN_KV_BYTES, 2));
        assert!(!parallel_attention(0, PARALLEL_MIN_KV_BYTES - 1, 2));
    }
}
