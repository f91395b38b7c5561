//! Typed reads of a GGUF file's metadata, shared by the weight loader
//! (`gguf.rs`), the tokenizer (`gguf_tokenizer.rs`) and the header reader
//! (`gguf_file.rs`).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use crate::error::ModelError;

pub(crate) fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some(u64::from(*x)),
        Value::U16(x) => Some(u64::from(*x)),
        Value::U32(x) => Some(u64::from(*x)),
        Value::U64(x) => Some(*x),
        Value::I8(x) => u64::try_from(*x).ok(),
        Value::I16(x) => u64::try_from(*x).ok(),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

pub(crate) fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(f64::from(*x)),
        Value::F64(x) => Some(*x),
        other => as_u64(other).map(|x| x as f64),
    }
}

/// Typed reads of a GGUF file's metadata.
pub(crate) struct Meta<'a>(pub(crate) &'a HashMap<String, Value>);

impl Meta<'_> {
    pub(crate) fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.0
            .get(key)
            .and_then(as_u64)
            .map(|x| x as usize)
            .ok_or_else(|| ModelError::Config(format!("GGUF metadata lacks integer {key:?}")))
    }
    pub(crate) fn opt_usize(&self, key: &str) -> Option<usize> {
        self.0.get(key).and_then(as_u64).map(|x| x as usize)
    }
    pub(crate) fn opt_f64(&self, key: &str) -> Option<f64> {
        self.0.get(key).and_then(as_f64)
    }
    pub(crate) fn str(&self, key: &str) -> Option<&str> {
        match self.0.get(key) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        }
    }
}
