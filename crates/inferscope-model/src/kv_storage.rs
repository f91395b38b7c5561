//! The paged KV storage: the memory the scheduler's blocks (the engine's `BlockPool`) stand for.

/// Keys and values of all layers, in blocks of `block_size` token slots.
///
/// Layout per layer: values `[num_blocks][num_kv_heads][block_size][head_dim]`
/// and keys transposed, `[num_blocks][num_kv_heads][head_dim][block_size]`,
/// so that attention scores a whole block of keys with vector operations
/// along the slots (no horizontal sum per key) and then sums values along
/// `head_dim`; each is contiguous per (block, head).
pub struct KvStorage {
    k: Vec<f32>,
    v: Vec<f32>,
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl KvStorage {
    /// A zeroed store. The allocation is zero-initialised memory, which the
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

    /// Bytes held by the store.
    pub fn size_bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * std::mem::size_of::<f32>()
    }

    /// Offset of the `block_size * head_dim` floats of (layer, block, head).
    #[inline]
    fn offset(&self, layer: usize, block: usize, head: usize) -> usize {
        ((layer * self.num_blocks + block) * self.num_kv_heads + head)
            * self.block_size
            * self.head_dim
    }

    /// Writes one token's K and V (`[num_kv_heads * head_dim]` each).
    pub fn write(&mut self, layer: usize, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        let (d, bs) = (self.head_dim, self.block_size);
        for h in 0..self.num_kv_heads {
            let o = self.offset(layer, block, h);
            for (i, &x) in k[h * d..(h + 1) * d].iter().enumerate() {
                self.k[o + i * bs + slot] = x;
            }
            self.v[o + slot * d..o + (slot + 1) * d].copy_from_slice(&v[h * d..(h + 1) * d]);
        }
    }

    /// Keys of `block` for `head`, transposed: `[head_dim][block_size]`.
    #[inline]
    pub fn keys(&self, layer: usize, block: usize, head: usize) -> &[f32] {
        let o = self.offset(layer, block, head);
        &self.k[o..o + self.block_size * self.head_dim]
    }

    /// Values of `block` for `head`: `[block_size][head_dim]`.
    #[inline]
    pub fn values(&self, layer: usize, block: usize, head: usize) -> &[f32] {
        let o = self.offset(layer, block, head);
        &self.v[o..o + self.block_size * self.head_dim]
    }
}
