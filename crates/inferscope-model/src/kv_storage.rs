//! The paged KV storage: the memory the scheduler's blocks (the engine's `BlockPool`) stand for.

use half::vec::HalfBitsVecExt;
use half::{bf16, f16};

use crate::error::ModelError;

/// The element type of the KV cache (`--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// IEEE half precision: half the bytes of f32, 10-bit mantissa (llama.cpp's default).
    #[default]
    F16,
    /// bfloat16: half the bytes of f32, f32's range, 7-bit mantissa.
    Bf16,
    /// f32: the reference the parity tests compare against.
    F32,
}

impl KvDtype {
    /// The type a `--kv-cache-dtype` value names: `auto` is float16, the
    /// 16-bit type with the finer mantissa (the cpu executor computes in
    /// f32, so there is no model dtype for `auto` to follow).
    pub fn parse(name: &str) -> Result<Self, ModelError> {
        match name {
            "auto" | "float16" | "fp16" | "f16" | "half" => Ok(Self::F16),
            "bfloat16" | "bf16" => Ok(Self::Bf16),
            "float32" | "fp32" | "f32" | "float" => Ok(Self::F32),
            other => Err(ModelError::Config(format!(
                "kv-cache dtype {other:?} is not supported by the cpu executor \
                 (supported: auto, float16, bfloat16, float32)"
            ))),
        }
    }

    /// Bytes of one element.
    pub fn size_bytes(self) -> usize {
        match self {
            Self::F16 | Self::Bf16 => 2,
            Self::F32 => 4,
        }
    }

    /// vLLM's name for it (`cache_config_info`'s `cache_dtype` label).
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "float16",
            Self::Bf16 => "bfloat16",
            Self::F32 => "float32",
        }
    }
}

/// An element type the KV cache can hold; the attention kernels are
/// generic over it and widen each row to f32 as they load it.
pub(crate) trait KvElem: Copy + Send + Sync + 'static {
    /// Rounded to nearest, ties to even.
    fn from_f32(x: f32) -> Self;
    /// Exact.
    fn to_f32(self) -> f32;
    /// Which it is, for the vector loads.
    const DTYPE: KvDtype;
    /// `n` zeros, from zero-initialised memory: the OS maps its pages
    /// lazily, so a pool costs no time or memory until written.
    fn zeroed_vec(n: usize) -> Vec<Self>;
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    const DTYPE: KvDtype = KvDtype::F32;
    fn zeroed_vec(n: usize) -> Vec<Self> {
        // The standard library allocates zeroed memory for 0.0.
        vec![0.0; n]
    }
}

impl KvElem for f16 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    const DTYPE: KvDtype = KvDtype::F16;
    fn zeroed_vec(n: usize) -> Vec<Self> {
        // `vec![f16::ZERO; n]` writes every element (the standard library
        // zero-allocates only its own types); zero `u16`s are zero-allocated
        // and reinterpreted in place.
        vec![0u16; n].reinterpret_into()
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        // The upper half of an f32: a shift, which vectorises.
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    const DTYPE: KvDtype = KvDtype::Bf16;
    fn zeroed_vec(n: usize) -> Vec<Self> {
        // As f16's.
        vec![0u16; n].reinterpret_into()
    }
}

/// The keys and values of every layer in one element type.
pub(crate) struct KvArrays<T> {
    pub k: Vec<T>,
    pub v: Vec<T>,
}

/// The store's arrays, in the chosen element type.
pub(crate) enum KvData {
    F32(KvArrays<f32>),
    F16(KvArrays<f16>),
    Bf16(KvArrays<bf16>),
}

/// Where a (layer, block, head) lives in the arrays.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvLayout {
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvLayout {
    /// Offset of the `block_size * head_dim` elements of (layer, block, head).
    #[inline(always)]
    pub fn offset(&self, layer: usize, block: usize, head: usize) -> usize {
        ((layer * self.num_blocks + block) * self.num_kv_heads + head)
            * self.block_size
            * self.head_dim
    }
}

/// A typed, read-only view of the store for the attention kernels.
#[derive(Clone, Copy)]
pub(crate) struct KvView<'a, T> {
    k: &'a [T],
    v: &'a [T],
    layout: KvLayout,
}

impl<'a, T> KvView<'a, T> {
    /// Tokens per block.
    #[inline(always)]
    pub fn block_size(&self) -> usize {
        self.layout.block_size
    }

    /// Keys of `block` for `head`, transposed: `[head_dim][block_size]`.
    #[inline(always)]
    pub fn keys(&self, layer: usize, block: usize, head: usize) -> &'a [T] {
        let o = self.layout.offset(layer, block, head);
        &self.k[o..o + self.layout.block_size * self.layout.head_dim]
    }

    /// Values of `block` for `head`: `[block_size][head_dim]`.
    #[inline(always)]
    pub fn values(&self, layer: usize, block: usize, head: usize) -> &'a [T] {
        let o = self.layout.offset(layer, block, head);
        &self.v[o..o + self.layout.block_size * self.layout.head_dim]
    }
}

/// Keys and values of all layers, in blocks of `block_size` token slots.
///
/// Layout per layer: values `[num_blocks][num_kv_heads][block_size][head_dim]`
/// and keys transposed, `[num_blocks][num_kv_heads][head_dim][block_size]`,
/// so that attention scores a whole block of keys with vector operations
/// along the slots (no horizontal sum per key) and then sums values along
/// `head_dim`; each is contiguous per (block, head). Elements are f16,
/// bf16 or f32 ([`KvDtype`]); the kernels widen them as they load them.
pub struct KvStorage {
    data: KvData,
    layout: KvLayout,
}

impl KvStorage {
    /// A zeroed f32 store (the parity tests' reference).
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        Self::with_dtype(
            KvDtype::F32,
            num_layers,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
        )
    }

    /// A zeroed store of `dtype` elements. The allocation is
    /// zero-initialised memory (all-zero bits are 0.0 in each type), which
    /// the OS provides lazily, so a large pool costs nothing until written.
    pub fn with_dtype(
        dtype: KvDtype,
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let n = num_layers * num_blocks * block_size * num_kv_heads * head_dim;
        fn zeroed<T: KvElem>(n: usize) -> KvArrays<T> {
            KvArrays {
                k: T::zeroed_vec(n),
                v: T::zeroed_vec(n),
            }
        }
        let data = match dtype {
            KvDtype::F32 => KvData::F32(zeroed(n)),
            KvDtype::F16 => KvData::F16(zeroed(n)),
            KvDtype::Bf16 => KvData::Bf16(zeroed(n)),
        };
        Self {
            data,
            layout: KvLayout {
                num_blocks,
                block_size,
                num_kv_heads,
                head_dim,
            },
        }
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        match self.data {
            KvData::F32(_) => KvDtype::F32,
            KvData::F16(_) => KvDtype::F16,
            KvData::Bf16(_) => KvDtype::Bf16,
        }
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.layout.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.layout.block_size
    }

    /// Bytes held by the store.
    pub fn size_bytes(&self) -> usize {
        let elems = match &self.data {
            KvData::F32(a) => a.k.len() + a.v.len(),
            KvData::F16(a) => a.k.len() + a.v.len(),
            KvData::Bf16(a) => a.k.len() + a.v.len(),
        };
        elems * self.dtype().size_bytes()
    }

    /// The arrays, for the attention kernels.
    pub(crate) fn data(&self) -> &KvData {
        &self.data
    }

    /// A typed view of `arrays`, which must be this store's.
    pub(crate) fn view<'a, T>(&self, arrays: &'a KvArrays<T>) -> KvView<'a, T> {
        KvView {
            k: &arrays.k,
            v: &arrays.v,
            layout: self.layout,
        }
    }

    /// Writes one token's K and V (`[num_kv_heads * head_dim]` each),
    /// rounding them to the store's type.
    pub fn write(&mut self, layer: usize, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        let layout = self.layout;
        match &mut self.data {
            KvData::F32(a) => write_token(a, layout, layer, block, slot, k, v),
            KvData::F16(a) => write_token(a, layout, layer, block, slot, k, v),
            KvData::Bf16(a) => write_token(a, layout, layer, block, slot, k, v),
        }
    }

    /// One element of a key as stored, widened (tests).
    #[doc(hidden)]
    pub fn key_at(&self, layer: usize, block: usize, head: usize, dim: usize, slot: usize) -> f32 {
        let i = self.layout.offset(layer, block, head) + dim * self.layout.block_size + slot;
        match &self.data {
            KvData::F32(a) => a.k[i],
            KvData::F16(a) => a.k[i].to_f32(),
            KvData::Bf16(a) => KvElem::to_f32(a.k[i]),
        }
    }
}

fn write_token<T: KvElem>(
    a: &mut KvArrays<T>,
    layout: KvLayout,
    layer: usize,
    block: usize,
    slot: usize,
    k: &[f32],
    v: &[f32],
) {
    let (d, bs) = (layout.head_dim, layout.block_size);
    for h in 0..layout.num_kv_heads {
        let o = layout.offset(layer, block, h);
        for (i, &x) in k[h * d..(h + 1) * d].iter().enumerate() {
            a.k[o + i * bs + slot] = T::from_f32(x);
        }
        for (dst, &x) in a.v[o + slot * d..o + (slot + 1) * d]
            .iter_mut()
            .zip(&v[h * d..(h + 1) * d])
        {
            *dst = T::from_f32(x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same budget holds twice the tokens in 16 bits as in 32.
    #[test]
    fn sixteen_bit_elements_take_half_the_bytes() {
        let f32_pool = KvStorage::new(2, 4, 16, 2, 8);
        for dtype in [KvDtype::F16, KvDtype::Bf16] {
            let p = KvStorage::with_dtype(dtype, 2, 4, 16, 2, 8);
            assert_eq!(2 * p.size_bytes(), f32_pool.size_bytes(), "{dtype:?}");
            assert_eq!(p.dtype(), dtype);
        }
        assert_eq!(KvDtype::parse("auto").unwrap(), KvDtype::F16);
        assert_eq!(KvDtype::parse("bfloat16").unwrap(), KvDtype::Bf16);
        assert_eq!(KvDtype::parse("float32").unwrap(), KvDtype::F32);
        let e = KvDtype::parse("fp8").unwrap_err().to_string();
        assert!(e.contains("\"fp8\"") && e.contains("float16"), "{e}");
    }

    /// Bytes of `buf` in resident pages (`mincore`): the buffer's own pages,
    /// so tests allocating on other threads cannot change the answer.
    #[cfg(target_os = "linux")]
    fn resident_bytes<T>(buf: &[T]) -> usize {
        // SAFETY: sysconf reads a constant of the system; no memory is passed.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let start = buf.as_ptr() as usize / page * page;
        let end = buf.as_ptr() as usize + std::mem::size_of_val(buf);
        let mut pages = vec![0u8; (end - start).div_ceil(page)];
        // SAFETY: the range covers the pages of a live allocation, and
        // `pages` holds one byte per page of it.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, end - start, pages.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().filter(|&&p| p & 1 == 1).count() * page
    }

    /// A new pool of any element type is zeros the OS has not yet mapped:
    /// of 512 MiB of keys and values, (far) less than 64 MiB is resident
    /// (a server starts without touching its KV cache).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_new_pool_is_not_resident() {
        for dtype in [KvDtype::F16, KvDtype::Bf16, KvDtype::F32] {
            // 32 layers × 256 blocks × 16 slots × 8 heads × 128 = 2²⁷ elements each.
            let p = KvStorage::with_dtype(dtype, 32, 256, 16, 8, 128);
            assert!(p.size_bytes() >= 512 << 20, "{dtype:?}");
            let resident = match &p.data {
                KvData::F16(a) => resident_bytes(&a.k) + resident_bytes(&a.v),
                KvData::Bf16(a) => resident_bytes(&a.k) + resident_bytes(&a.v),
                KvData::F32(a) => resident_bytes(&a.k) + resident_bytes(&a.v),
            };
            assert!(resident < 64 << 20, "{dtype:?}: {resident} bytes resident");
            match &p.data {
                KvData::F16(a) => assert!(
                    a.k.iter()
                        .chain(&a.v)
                        .step_by(4099)
                        .all(|x| x.to_bits() == 0)
                ),
                KvData::Bf16(a) => assert!(
                    a.k.iter()
                        .chain(&a.v)
                        .step_by(4099)
                        .all(|x| x.to_bits() == 0)
                ),
                KvData::F32(a) => assert!(
                    a.k.iter()
                        .chain(&a.v)
                        .step_by(4099)
                        .all(|x| x.to_bits() == 0)
                ),
            }
        }
    }

    /// Writes round to the nearest 16-bit value and land where the
    /// transposed key layout says.
    #[test]
    fn writes_round_to_the_store_type() {
        let k: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 / 3.0).collect();
        let v = k.clone();
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
            let mut p = KvStorage::with_dtype(dtype, 1, 2, 4, 2, 8);
            p.write(0, 1, 3, &k, &v);
            for h in 0..2 {
                for i in 0..8 {
                    let x = k[h * 8 + i];
                    let want = match dtype {
                        KvDtype::F32 => x,
                        KvDtype::F16 => f16::from_f32(x).to_f32(),
                        KvDtype::Bf16 => bf16::from_f32(x).to_f32(),
                    };
                    assert_eq!(p.key_at(0, 1, h, i, 3), want, "{dtype:?}");
                }
            }
        }
    }
}
