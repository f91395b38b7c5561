//! The paged KV pool: the memory the scheduler's blocks stand for.

/// Keys and values of all layers, in blocks of `block_size` token slots.
///
/// Layout per layer and per K/V: `[num_blocks][num_kv_heads][block_size][head_dim]`,
/// so one head's keys of one block are contiguous for the attention loop.
pub struct KvPool {
    k: Vec<f32>,
    v: Vec<f32>,
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl KvPool {
    /// A zeroed pool. The allocation is zero-initialised memory, which the
    /// OS provides lazily, so a large pool costs nothing until written.
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let n = num_layers * num_blocks * block_size * num_kv_heads * head_dim;
        Self {
            k: vec![0.0; n],
            v: vec![0.0; n],
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
        }
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes held by the pool.
    pub fn size_bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * std::mem::size_of::<f32>()
    }

    /// Offset of the `head_dim` floats of (layer, block, head, slot).
    #[inline]
    fn offset(&self, layer: usize, block: usize, head: usize, slot: usize) -> usize {
        (((layer * self.num_blocks + block) * self.num_kv_heads + head) * self.block_size + slot)
            * self.head_dim
    }

    /// Writes one token's K and V (`[num_kv_heads * head_dim]` each).
    pub fn write(&mut self, layer: usize, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        let d = self.head_dim;
        for h in 0..self.num_kv_heads {
            let o = self.offset(layer, block, h, slot);
            self.k[o..o + d].copy_from_slice(&k[h * d..(h + 1) * d]);
            self.v[o..o + d].copy_from_slice(&v[h * d..(h + 1) * d]);
        }
    }

    /// Keys of `block` for `head`: `[block_size][head_dim]`.
    #[inline]
    pub fn keys(&self, layer: usize, block: usize, head: usize) -> &[f32] {
        let o = self.offset(layer, block, head, 0);
        &self.k[o..o + self.block_size * self.head_dim]
    }

    /// Values of `block` for `head`: `[block_size][head_dim]`.
    #[inline]
    pub fn values(&self, layer: usize, block: usize, head: usize) -> &[f32] {
        let o = self.offset(layer, block, head, 0);
        &self.v[o..o + self.block_size * self.head_dim]
    }
}
