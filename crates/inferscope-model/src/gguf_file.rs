//! The GGUF container: its metadata and tensor directory, read from the
//! file's bytes, and the tensor types the loader knows.
//!
//! candle's reader refuses a whole file at the first tensor type it does not
//! know (IQ4_XS: "unknown dtype for tensor 23"); this one keeps every
//! tensor's type id, so the loader loads the types it supports and names
//! any other with the tensor that has it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Value;

use crate::error::ModelError;

/// A GGUF tensor type, by its ggml id (`enum ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorType(pub u32);

/// Every ggml type id with its name, as `ggml.h` and gguf-py name them.
const NAMES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
    (40, "NVFP4"),
    (41, "Q1_0"),
];

/// The types weights load from, in the order the refusal lists them
/// (Q8_1 and Q8_K are activation types, never written as weights).
const SUPPORTED: &[u32] = &[0, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23];

impl TensorType {
    /// IEEE single precision.
    pub const F32: Self = Self(0);
    /// IEEE half precision.
    pub const F16: Self = Self(1);
    /// bfloat16.
    pub const BF16: Self = Self(30);
    /// 8-bit quants, f16 scale per 32.
    pub const Q8_0: Self = Self(8);
    /// 4-bit indices into a non-linear table, f16 scale per 32.
    pub const IQ4_NL: Self = Self(20);
    /// IQ4_NL's table with 6-bit scales per 32 under an f16 scale per 256.
    pub const IQ4_XS: Self = Self(23);

    /// Its name (`IQ4_XS`), or `type N` for an id no ggml version used.
    pub fn name(self) -> Cow<'static, str> {
        match NAMES.iter().find(|(id, _)| *id == self.0) {
            Some((_, n)) => Cow::Borrowed(n),
            None => Cow::Owned(format!("type {}", self.0)),
        }
    }

    /// candle's type for it, where candle has one.
    pub fn candle(self) -> Option<GgmlDType> {
        Some(match self.0 {
            0 => GgmlDType::F32,
            1 => GgmlDType::F16,
            2 => GgmlDType::Q4_0,
            3 => GgmlDType::Q4_1,
            6 => GgmlDType::Q5_0,
            7 => GgmlDType::Q5_1,
            8 => GgmlDType::Q8_0,
            9 => GgmlDType::Q8_1,
            10 => GgmlDType::Q2K,
            11 => GgmlDType::Q3K,
            12 => GgmlDType::Q4K,
            13 => GgmlDType::Q5K,
            14 => GgmlDType::Q6K,
            15 => GgmlDType::Q8K,
            30 => GgmlDType::BF16,
            _ => return None,
        })
    }

    /// Whether weights of this type load.
    pub fn is_supported(self) -> bool {
        SUPPORTED.contains(&self.0)
    }

    /// Elements per block and bytes per block, for the supported types.
    pub fn block(self) -> Option<(usize, usize)> {
        if !self.is_supported() {
            return None;
        }
        match self {
            Self::IQ4_NL => Some((crate::iq4::QK4_NL, crate::iq4::IQ4_NL_BLOCK_BYTES)),
            Self::IQ4_XS => Some((crate::iq4::QK_K, crate::iq4::IQ4_XS_BLOCK_BYTES)),
            t => t.candle().map(|d| (d.block_size(), d.type_size())),
        }
    }
}

impl From<GgmlDType> for TensorType {
    fn from(d: GgmlDType) -> Self {
        NAMES
            .iter()
            .map(|&(id, _)| Self(id))
            .find(|t| t.candle() == Some(d))
            .expect("each of candle's types is a ggml type")
    }
}

/// The names of the supported types, for messages.
pub fn supported_types() -> String {
    SUPPORTED
        .iter()
        .map(|&id| TensorType(id).name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One entry of the tensor directory.
#[derive(Debug, Clone)]
pub(crate) struct TensorInfo {
    pub(crate) name: String,
    /// Outermost first (`[out, in]` for a weight), as candle gives them.
    pub(crate) dims: Vec<usize>,
    pub(crate) ty: TensorType,
    /// From the start of the tensor data.
    pub(crate) offset: u64,
}

/// A GGUF file's metadata and tensor directory.
pub(crate) struct GgufFile {
    pub(crate) metadata: HashMap<String, Value>,
    /// The tensors in file order.
    pub(crate) tensors: Vec<TensorInfo>,
    /// Where each name is in `tensors`.
    index: HashMap<String, usize>,
    /// Where the tensor data starts in the file.
    pub(crate) data_offset: u64,
}

// The caps llama.cpp's reader has (GGUF_MAX_* in gguf.cpp, GGML_MAX_DIMS):
// a crafted file cannot make it allocate or recurse without bound.
const MAX_ELEMENTS: u64 = 1 << 30;
const MAX_DIMS: u32 = 4;
const MAX_DEPTH: usize = 64;

/// The bytes being read and the position in them.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    /// Bytes of a length prefix: 4 in GGUF v1, 8 later.
    len_bytes: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.b.len() => {
                let s = &self.b[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => Err(format!("{n} bytes at {} pass the end of the file", self.at)),
        }
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn len(&mut self) -> Result<u64, String> {
        let n = if self.len_bytes == 4 {
            u64::from(self.u32()?)
        } else {
            self.u64()?
        };
        if n > MAX_ELEMENTS {
            return Err(format!("a length of {n} at {}", self.at));
        }
        Ok(n)
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.len()? as usize;
        let mut s = self.take(n)?;
        // Some writers add a NUL; GGUF strings have none.
        while let [rest @ .., 0] = s {
            s = rest;
        }
        Ok(String::from_utf8_lossy(s).into_owned())
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("bool value {b}")),
            },
            8 => Value::String(self.string()?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err("arrays nested too deep".into());
                }
                let ty = self.u32()?;
                let n = self.len()?;
                // Each element takes at least a byte: no allocation for
                // more elements than the file could hold.
                if n > (self.b.len() - self.at) as u64 {
                    return Err(format!(
                        "an array of {n} elements passes the end of the file"
                    ));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(ty, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            t => return Err(format!("unknown metadata value type {t}")),
        })
    }
}

impl GgufFile {
    /// Reads the header of the GGUF file whose bytes are `b`.
    pub(crate) fn parse(b: &[u8]) -> Result<Self, String> {
        let mut c = Cursor {
            b,
            at: 0,
            len_bytes: 8,
        };
        if c.take(4)? != b"GGUF" {
            return Err("it does not start with GGUF".into());
        }
        c.len_bytes = match c.u32()? {
            1 => 4,
            2 | 3 => 8,
            v => return Err(format!("unsupported GGUF version {v}")),
        };
        let (n_tensors, n_kv) = (c.len()?, c.len()?);
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            let v = c
                .value(ty, 0)
                .map_err(|e| format!("metadata {key:?}: {e}"))?;
            metadata.insert(key, v);
        }
        let mut tensors = Vec::new();
        let mut index = HashMap::new();
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims > MAX_DIMS {
                return Err(format!("tensor {name} has {n_dims} dimensions"));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = if c.len_bytes == 4 {
                    u64::from(c.u32()?)
                } else {
                    c.u64()?
                };
                dims.push(usize::try_from(d).map_err(|_| format!("tensor {name}: dimension {d}"))?);
            }
            // ggml lists the innermost dimension first.
            dims.reverse();
            if dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_none()
            {
                return Err(format!("tensor {name}: {dims:?} elements overflow"));
            }
            let ty = TensorType(c.u32()?);
            let offset = c.u64()?;
            index.insert(name.clone(), tensors.len());
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            Some(v) => crate::gguf_meta::as_u64(v).filter(|&a| a > 0).unwrap_or(32),
            None => 32,
        };
        let data_offset = (c.at as u64).div_ceil(alignment) * alignment;
        Ok(Self {
            metadata,
            tensors,
            index,
            data_offset,
        })
    }

    /// Maps and reads the file at `path` (its header only is read).
    pub(crate) fn read(path: &Path) -> Result<Self, ModelError> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: read-only, and dropped before this returns (see gguf.rs
        // on maps of model files).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(&map).map_err(|e| invalid(path, &e))
    }

    /// The tensor named `name`.
    pub(crate) fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// An error naming the first tensor (in file order) whose type does not
    /// load, with the types that do.
    pub(crate) fn check_types(&self, path: &Path) -> Result<(), ModelError> {
        match self.tensors.iter().find(|t| !t.ty.is_supported()) {
            None => Ok(()),
            Some(t) => Err(ModelError::Config(format!(
                "{}: tensor {} has type {}, which inferscope does not load \
                 (supported types: {})",
                path.display(),
                t.name,
                t.ty.name(),
                supported_types()
            ))),
        }
    }
}

/// The error for a file that is not valid GGUF.
pub(crate) fn invalid(path: &Path, why: &str) -> ModelError {
    ModelError::Config(format!(
        "{} is not a valid GGUF file: {why}",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_candle_types_agree() {
        for (id, name) in NAMES {
            let t = TensorType(*id);
            assert_eq!(t.name(), *name);
            if let Some(d) = t.candle() {
                assert_eq!(TensorType::from(d), t, "{name}");
                // candle's own name, but for the underscores it drops.
                let bare = |n: &str| n.to_uppercase().replace('_', "");
                assert_eq!(bare(&format!("{d:?}")), bare(name));
            }
        }
        assert_eq!(TensorType(99).name(), "type 99");
        assert_eq!(
            supported_types(),
            "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, \
             IQ4_NL, IQ4_XS"
        );
        assert_eq!(TensorType::IQ4_XS.block(), Some((256, 136)));
        assert_eq!(TensorType::IQ4_NL.block(), Some((32, 18)));
        assert_eq!(TensorType(16).block(), None, "IQ2_XXS");
    }

    #[test]
    fn truncated_or_foreign_bytes_are_errors() {
        assert!(GgufFile::parse(b"GGU").is_err());
        assert!(GgufFile::parse(b"GGML\x03\0\0\0").is_err());
        // Version 3, 1 tensor, 0 metadata, then nothing.
        let mut b = b"GGUF\x03\0\0\0".to_vec();
        b.extend(1u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        let e = GgufFile::parse(&b).err().unwrap();
        assert!(e.contains("pass the end"), "{e}");
        // An array claiming more elements than bytes.
        let mut b = b"GGUF\x03\0\0\0".to_vec();
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.push(b'k');
        b.extend(9u32.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend((1u64 << 29).to_le_bytes());
        let e = GgufFile::parse(&b).err().unwrap();
        assert!(e.contains("passes the end"), "{e}");
    }
}
