//! Rewrites a GGUF file's 2-D layer weights in a K-quant with candle's
//! quantizer, for benchmarks of the packed K-quant kernels (the `gguf`
//! Python package cannot quantize K-quants):
//!
//! ```text
//! cargo run --release -p inferscope-model --example requantize_gguf -- IN.gguf OUT.gguf q4_k_m
//! ```
//!
//! Types: `q4_k`, `q5_k`, `q6_k` (every `blk.*` linear weight and
//! `output.weight`), or `q4_k_m` / `q5_k_m`: as `q4_k` / `q5_k` but
//! `attn_v`, `ffn_down` and `output` in Q6_K, roughly llama.cpp's mix
//! (which keeps Q4_K for half of the layers' `attn_v`/`ffn_down`). The
//! embedding table, norms and metadata are copied unchanged.

use std::fs::File;
use std::io::BufReader;

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{DType, Device};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output, kind] = args.as_slice() else {
        return Err("usage: requantize_gguf IN.gguf OUT.gguf q4_k|q5_k|q6_k|q4_k_m|q5_k_m".into());
    };
    let (base, mixed) = match kind.as_str() {
        "q4_k" => (GgmlDType::Q4K, false),
        "q5_k" => (GgmlDType::Q5K, false),
        "q6_k" => (GgmlDType::Q6K, false),
        "q4_k_m" => (GgmlDType::Q4K, true),
        "q5_k_m" => (GgmlDType::Q5K, true),
        other => return Err(format!("unknown type {other:?}").into()),
    };
    let mut f = BufReader::new(File::open(input).map_err(|e| format!("{input}: {e}"))?);
    let content = gguf_file::Content::read(&mut f).map_err(|e| format!("{input}: {e}"))?;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors = Vec::new();
    for name in names {
        let t = content.tensor(&mut f, name, &Device::Cpu)?;
        let linear = t.shape().rank() == 2 && name != "token_embd.weight";
        let q = if linear {
            let heavy = ["attn_v.weight", "ffn_down.weight", "output.weight"]
                .iter()
                .any(|s| name.ends_with(s));
            let dtype = if mixed && heavy { GgmlDType::Q6K } else { base };
            let w = t.dequantize(&Device::Cpu)?.to_dtype(DType::F32)?;
            QTensor::quantize(&w, dtype)?
        } else {
            t
        };
        tensors.push((name.clone(), q));
    }
    let mut out = File::create(output).map_err(|e| format!("{output}: {e}"))?;
    let meta: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &meta, &refs)?;
    println!("{output}: {} tensors, {kind}", refs.len());
    Ok(())
}
