//! Causal grouped-query attention over the paged KV pool.

use rayon::prelude::*;

use crate::kv_pool::KvPool;

/// Where one token of the step attends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenCtx {
    /// The token's position: it attends to positions `0..=pos`.
    pub pos: usize,
    /// Offset of its sequence's block table in the batch's flattened tables.
    pub table_offset: usize,
}

/// Dot product with several accumulators so that it vectorises.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Attention shapes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// `out[t, h, :] = softmax(q[t, h] · K[0..=pos]ᵀ / √d) · V[0..=pos]` for every
/// token and query head; K/V rows come from the pool through the block table.
/// `q` and `out` are `[tokens][num_heads * head_dim]`.
pub(crate) fn paged_attention(
    q: &[f32],
    out: &mut [f32],
    tokens: &[TokenCtx],
    block_tables: &[u32],
    pool: &KvPool,
    layer: usize,
    shape: AttnShape,
) {
    let AttnShape {
        num_heads,
        num_kv_heads,
        head_dim: d,
    } = shape;
    let group = num_heads / num_kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    #[cfg(target_arch = "x86_64")]
    let avx2 =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    let work = |scores: &mut Vec<f32>, (idx, o): (usize, &mut [f32])| {
        let (t, h) = (idx / num_heads, idx % num_heads);
        let ctx = tokens[t];
        let head = Head {
            q: &q[idx * d..(idx + 1) * d],
            kv_head: h / group,
            ctx,
            block_tables,
            pool,
            layer,
            scale,
        };
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the CPU supports the features the function is compiled for.
            unsafe { attend_avx2(&head, scores, o) };
            return;
        }
        attend(&head, scores, o);
    };
    // Small steps (decode at low batch) run on one thread: a parallel
    // section's synchronisation costs more than the work, and far more when
    // other processes hold the cores.
    let macs: usize = tokens.iter().map(|t| t.pos + 1).sum::<usize>() * num_heads * d;
    if macs < PARALLEL_MIN_MACS {
        let mut scores = Vec::new();
        out.chunks_mut(d)
            .enumerate()
            .for_each(|item| work(&mut scores, item));
    } else {
        out.par_chunks_mut(d)
            .enumerate()
            .for_each_init(Vec::new, work);
    }
}

/// Multiply-adds below which attention runs on one thread.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// One (token, query head) pair's inputs.
struct Head<'a> {
    q: &'a [f32],
    kv_head: usize,
    ctx: TokenCtx,
    block_tables: &'a [u32],
    pool: &'a KvPool,
    layer: usize,
    scale: f32,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn attend_avx2(h: &Head<'_>, scores: &mut Vec<f32>, o: &mut [f32]) {
    // The same code, compiled so that the dot products vectorise 8-wide.
    attend(h, scores, o)
}

#[inline(always)]
fn attend(h: &Head<'_>, scores: &mut Vec<f32>, o: &mut [f32]) {
    let d = h.q.len();
    let bs = h.pool.block_size();
    let n = h.ctx.pos + 1;
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    let n_blocks = n.div_ceil(bs);
    for bi in 0..n_blocks {
        let block = h.block_tables[h.ctx.table_offset + bi] as usize;
        let keys = h.pool.keys(h.layer, block, h.kv_head);
        let in_block = (n - bi * bs).min(bs);
        for key in keys.chunks_exact(d).take(in_block) {
            let s = dot(h.q, key) * h.scale;
            max = max.max(s);
            scores.push(s);
        }
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    o.fill(0.0);
    for bi in 0..n_blocks {
        let block = h.block_tables[h.ctx.table_offset + bi] as usize;
        let vals = h.pool.values(h.layer, block, h.kv_head);
        let in_block = (n - bi * bs).min(bs);
        for (j, val) in vals.chunks_exact(d).take(in_block).enumerate() {
            let p = scores[bi * bs + j] * inv;
            for (oi, vi) in o.iter_mut().zip(val) {
                *oi += p * vi;
            }
        }
    }
}
