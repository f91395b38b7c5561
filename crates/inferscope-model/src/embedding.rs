//! The token-embedding table: f32 rows (checkpoints read as f32), or the
//! rows of a GGUF file in their stored type, read in place from the file's
//! map and dequantized one row per looked-up token.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, BlockQ8_1, BlockQ8K, GgmlType,
};
use half::{bf16, f16};

use crate::error::ModelError;
use crate::gguf_file::TensorType;
use crate::iq4;

/// Bytes shared with the rest of the model: a file's map, or a buffer.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Where the rows are and in which type.
enum Rows {
    /// `[vocab][hidden]` f32.
    F32(Vec<f32>),
    /// `[vocab]` rows of `row_bytes` bytes of `dtype` blocks from `offset`.
    Stored {
        bytes: SharedBytes,
        offset: usize,
        dtype: TensorType,
        row_bytes: usize,
    },
}

/// A `[vocab][hidden]` embedding table.
pub struct Embedding {
    rows: Rows,
    vocab: usize,
    hidden: usize,
    /// Multiplies every looked-up row (Gemma's `√hidden`).
    scale: Option<f32>,
}

impl Embedding {
    /// A table of f32 rows, `[vocab][hidden]`.
    pub fn dense(table: Vec<f32>, vocab: usize, hidden: usize) -> Result<Self, ModelError> {
        if table.len() != vocab * hidden {
            return Err(ModelError::ShapeMismatch {
                name: "embeddings".into(),
                expected: vec![vocab, hidden],
                actual: vec![table.len()],
            });
        }
        Ok(Self {
            rows: Rows::F32(table),
            vocab,
            hidden,
            scale: None,
        })
    }

    /// A table kept as stored: `vocab` rows of `hidden` elements of `dtype`
    /// from `offset` in `bytes` (a GGUF file's map), which are not copied.
    pub fn stored(
        bytes: SharedBytes,
        offset: usize,
        dtype: impl Into<TensorType>,
        vocab: usize,
        hidden: usize,
    ) -> Result<Self, ModelError> {
        let dtype = dtype.into();
        let bad = |m: String| Err(ModelError::Config(format!("token embeddings: {m}")));
        let name = dtype.name();
        let Some((block, block_bytes)) = dtype.block() else {
            return bad(format!("rows of type {name} do not load"));
        };
        if !hidden.is_multiple_of(block) {
            return bad(format!(
                "rows of {hidden} are not whole {name} blocks of {block}"
            ));
        }
        let row_bytes = hidden / block * block_bytes;
        let all = (*bytes).as_ref();
        if all.len() < offset || all.len() - offset < vocab * row_bytes {
            return bad(format!(
                "{vocab} rows of {row_bytes} bytes from {offset} pass the end ({} bytes)",
                all.len()
            ));
        }
        // The blocks are read in place as structs: each row must start at
        // their alignment (GGUF aligns tensors to 32 bytes, maps to pages).
        let align = block_align(dtype);
        if !(all.as_ptr() as usize + offset).is_multiple_of(align)
            || !row_bytes.is_multiple_of(align)
        {
            return bad(format!("{name} rows are not {align}-byte aligned"));
        }
        Ok(Self {
            rows: Rows::Stored {
                bytes,
                offset,
                dtype,
                row_bytes,
            },
            vocab,
            hidden,
            scale: None,
        })
    }

    /// The same table with every looked-up row multiplied by `scale`.
    pub fn with_scale(self, scale: f32) -> Self {
        Self {
            scale: Some(scale),
            ..self
        }
    }

    /// Rows.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The stored type of the rows (`F32` for a dense table).
    pub fn dtype(&self) -> TensorType {
        match &self.rows {
            Rows::F32(_) => GgmlDType::F32.into(),
            Rows::Stored { dtype, .. } => *dtype,
        }
    }

    /// Bytes of the table as stored (in a file's map: not resident until read).
    pub fn stored_bytes(&self) -> usize {
        match &self.rows {
            Rows::F32(t) => t.len() * 4,
            Rows::Stored { row_bytes, .. } => row_bytes * self.vocab,
        }
    }

    /// Writes row `id` (`id < vocab`, checked by the caller) as f32 into
    /// `out` (`hidden` floats): one row dequantized, nothing allocated.
    pub fn row_into(&self, id: usize, out: &mut [f32]) {
        let h = self.hidden;
        match &self.rows {
            Rows::F32(t) => out.copy_from_slice(&t[id * h..(id + 1) * h]),
            Rows::Stored {
                bytes,
                offset,
                dtype,
                row_bytes,
            } => {
                let start = offset + id * row_bytes;
                let row = &(**bytes).as_ref()[start..start + row_bytes];
                dequantize_row(*dtype, row, out);
            }
        }
        if let Some(s) = self.scale {
            // In f32, as the reference implementations multiply.
            out.iter_mut().for_each(|x| *x *= s);
        }
    }

    /// Appends the rows of `ids` to `out` (`[ids.len()][hidden]`).
    pub fn lookup(&self, ids: &[u32], out: &mut Vec<f32>) {
        let h = self.hidden;
        out.resize(ids.len() * h, 0.0);
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(h)) {
            self.row_into(id as usize, row);
        }
    }
}

/// The alignment the decoder of `dtype` needs: candle's read block
/// structs, the IQ4 ones bytes.
fn block_align(dtype: TensorType) -> usize {
    use std::mem::align_of;
    let Some(dtype) = dtype.candle() else {
        return 1;
    };
    match dtype {
        GgmlDType::F32 => align_of::<f32>(),
        GgmlDType::F16 | GgmlDType::BF16 => 2,
        GgmlDType::Q4_0 => align_of::<BlockQ4_0>(),
        GgmlDType::Q4_1 => align_of::<BlockQ4_1>(),
        GgmlDType::Q5_0 => align_of::<BlockQ5_0>(),
        GgmlDType::Q5_1 => align_of::<BlockQ5_1>(),
        GgmlDType::Q8_0 => align_of::<BlockQ8_0>(),
        GgmlDType::Q8_1 => align_of::<BlockQ8_1>(),
        GgmlDType::Q2K => align_of::<BlockQ2K>(),
        GgmlDType::Q3K => align_of::<BlockQ3K>(),
        GgmlDType::Q4K => align_of::<BlockQ4K>(),
        GgmlDType::Q5K => align_of::<BlockQ5K>(),
        GgmlDType::Q6K => align_of::<BlockQ6K>(),
        GgmlDType::Q8K => align_of::<BlockQ8K>(),
    }
}

/// Dequantizes one row of `dtype` blocks (a type that loads) into `out`
/// with candle's block decoders (ggml's formulas), or for IQ4 ours.
fn dequantize_row(dtype: TensorType, row: &[u8], out: &mut [f32]) {
    let dtype = match dtype {
        TensorType::IQ4_NL => return iq4::dequantize_nl(row, out),
        TensorType::IQ4_XS => return iq4::dequantize_xs(row, out),
        t => t.candle().expect("`stored` takes only types that load"),
    };
    match dtype {
        GgmlDType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlDType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlDType::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlDType::Q4_0 => blocks::<BlockQ4_0>(row, out),
        GgmlDType::Q4_1 => blocks::<BlockQ4_1>(row, out),
        GgmlDType::Q5_0 => blocks::<BlockQ5_0>(row, out),
        GgmlDType::Q5_1 => blocks::<BlockQ5_1>(row, out),
        GgmlDType::Q8_0 => blocks::<BlockQ8_0>(row, out),
        GgmlDType::Q8_1 => blocks::<BlockQ8_1>(row, out),
        GgmlDType::Q2K => blocks::<BlockQ2K>(row, out),
        GgmlDType::Q3K => blocks::<BlockQ3K>(row, out),
        GgmlDType::Q4K => blocks::<BlockQ4K>(row, out),
        GgmlDType::Q5K => blocks::<BlockQ5K>(row, out),
        GgmlDType::Q6K => blocks::<BlockQ6K>(row, out),
        GgmlDType::Q8K => blocks::<BlockQ8K>(row, out),
    }
}

/// `row` as `B` blocks, decoded into `out`.
fn blocks<B: GgmlType>(row: &[u8], out: &mut [f32]) {
    let n = row.len() / std::mem::size_of::<B>();
    assert!(
        n * std::mem::size_of::<B>() == row.len()
            && (row.as_ptr() as usize).is_multiple_of(std::mem::align_of::<B>())
            && out.len() == n * B::BLCK_SIZE
    );
    // SAFETY: the blocks are `repr(C)` structs of integers and 16-bit
    // floats, for which every bit pattern is valid; `row` holds exactly `n`
    // of them at their alignment (checked above).
    let xs = unsafe { std::slice::from_raw_parts(row.as_ptr().cast::<B>(), n) };
    B::to_float(xs, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    /// Rows looked up from the stored blocks equal the whole table
    /// dequantized by candle, for each type a GGUF embedding table comes in.
    #[test]
    fn stored_rows_equal_the_dequantized_table() {
        let (vocab, hidden) = (5, 512);
        let data: Vec<f32> = (0..vocab * hidden)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 23.0)
            .collect();
        let t = Tensor::from_vec(data.clone(), (vocab, hidden), &Device::Cpu).unwrap();
        for dtype in [
            GgmlDType::F32,
            GgmlDType::F16,
            GgmlDType::BF16,
            GgmlDType::Q4_0,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ] {
            let q = QTensor::quantize(&t, dtype).unwrap();
            let want = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            // Two bytes in front, so the offset matters.
            let raw = q.data().unwrap().to_vec();
            let mut bytes = vec![0u8; 32];
            bytes.extend_from_slice(&raw);
            let bytes: SharedBytes = Arc::new(bytes);
            let e = Embedding::stored(bytes, 32, dtype, vocab, hidden).unwrap();
            assert_eq!(e.stored_bytes(), raw.len(), "{dtype:?}");
            let mut out = Vec::new();
            e.lookup(&[3, 0, 4], &mut out);
            for (k, id) in [3usize, 0, 4].into_iter().enumerate() {
                assert_eq!(
                    out[k * hidden..(k + 1) * hidden],
                    want[id * hidden..(id + 1) * hidden],
                    "{dtype:?} row {id}"
                );
            }
            let scaled = Embedding::stored(
                Arc::new(raw.clone()) as SharedBytes,
                0,
                dtype,
                vocab,
                hidden,
            )
            .unwrap()
            .with_scale(2.0);
            let mut row = vec![0.0; hidden];
            scaled.row_into(1, &mut row);
            for (a, b) in row.iter().zip(&want[hidden..2 * hidden]) {
                assert_eq!(*a, 2.0 * b);
            }
        }
    }

    /// IQ4 rows looked up at an odd offset (read as bytes) equal gguf-py's
    /// dequantization of them.
    #[test]
    fn iq4_rows_equal_gguf_py() {
        let f = crate::iq4::tests::fixture();
        for (ty, (blocks, want), hidden) in [
            (TensorType::IQ4_NL, f.nl, 128),
            (TensorType::IQ4_XS, f.xs, 256),
        ] {
            let vocab = want.len() / hidden;
            let mut bytes = vec![0u8; 3];
            bytes.extend_from_slice(&blocks);
            let e =
                Embedding::stored(Arc::new(bytes) as SharedBytes, 3, ty, vocab, hidden).unwrap();
            assert_eq!(e.dtype(), ty);
            let ids: Vec<u32> = (0..vocab as u32).rev().collect();
            let mut out = Vec::new();
            e.lookup(&ids, &mut out);
            for (k, &id) in ids.iter().enumerate() {
                let id = id as usize;
                assert_eq!(
                    out[k * hidden..][..hidden],
                    want[id * hidden..][..hidden],
                    "{ty:?} {id}"
                );
            }
        }
        let bytes: SharedBytes = Arc::new(vec![0u8; 1024]);
        let e = Embedding::stored(bytes, 0, TensorType(16), 1, 256)
            .err()
            .unwrap();
        assert!(e.to_string().contains("IQ2_XXS do not load"), "{e}");
    }

    #[test]
    fn stored_tables_check_their_extent() {
        let bytes: SharedBytes = Arc::new(vec![0u8; 100]);
        let e = Embedding::stored(bytes.clone(), 0, GgmlDType::Q8_0, 4, 64).err();
        assert!(e.is_some_and(|e| e.to_string().contains("pass the end")));
        let e = Embedding::stored(bytes, 0, GgmlDType::Q4K, 1, 100).err();
        assert!(e.is_some_and(|e| e.to_string().contains("blocks")));
    }
}
