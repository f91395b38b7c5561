//! The tokenizer of a GGUF file without a `tokenizer.json` beside it,
//! built from its `tokenizer.ggml.*` metadata.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use crate::chat_template::ChatTemplate;
use crate::error::ModelError;
use crate::gguf::{Meta, as_f64, as_u64};
use crate::tokenizer::HfTokenizer;

/// The `tokenizer.ggml.*` metadata.
pub(crate) struct TokenizerMeta {
    /// `tokenizer.ggml.bos_token_id`.
    pub(crate) bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub(crate) eos: Option<u32>,
}

impl TokenizerMeta {
    pub(crate) fn read(meta: &Meta<'_>) -> Self {
        Self {
            bos: meta
                .opt_usize("tokenizer.ggml.bos_token_id")
                .map(|x| x as u32),
            eos: meta
                .opt_usize("tokenizer.ggml.eos_token_id")
                .map(|x| x as u32),
        }
    }

    /// Builds a `tokenizer.json` equivalent of the GGUF vocabulary
    /// (`gpt2`: byte-level BPE with merges; `llama`: SentencePiece BPE with
    /// byte fallback, merges derived from the scores) and parses it.
    pub(crate) fn build(&self, meta: &Meta<'_>) -> Result<HfTokenizer, ModelError> {
        let err = |m: &str| ModelError::Tokenizer(format!("GGUF tokenizer: {m}"));
        let model = meta
            .str("tokenizer.ggml.model")
            .ok_or_else(|| err("no tokenizer.ggml.model and no tokenizer.json beside the file"))?;
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            match meta.0.get(key) {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s.clone()),
                        _ => Err(err(&format!("{key} holds a non-string"))),
                    })
                    .collect(),
                _ => Err(err(&format!("missing {key}"))),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types: Vec<u64> = match meta.0.get("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a.iter().map(|v| as_u64(v).unwrap_or(1)).collect(),
            _ => vec![1; tokens.len()],
        };
        let vocab: serde_json::Map<String, serde_json::Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), serde_json::Value::from(i)))
            .collect();
        // Control (3) and user-defined (4) tokens are matched before the model.
        let added: Vec<serde_json::Value> = tokens
            .iter()
            .enumerate()
            .filter(|(i, _)| matches!(types.get(*i), Some(3 | 4)))
            .map(|(i, t)| {
                serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": types.get(i) == Some(&3)})
            })
            .collect();
        let add_bos = match meta.0.get("tokenizer.ggml.add_bos_token") {
            Some(Value::Bool(b)) => *b,
            _ => model == "llama",
        };
        let post_processor = match (add_bos, self.bos) {
            (true, Some(bos)) => {
                let name = tokens.get(bos as usize).cloned().unwrap_or_default();
                serde_json::json!({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {name.clone(): {"id": name, "ids": [bos], "tokens": [name]}}})
            }
            _ => serde_json::Value::Null,
        };
        let json = match model {
            "gpt2" => {
                let merges = strings("tokenizer.ggml.merges")?;
                serde_json::json!({
                    "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
                    "normalizer": null,
                    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
                    "post_processor": post_processor,
                    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
                    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                        "vocab": vocab, "merges": merges}
                })
            }
            "llama" => {
                let scores: Vec<f64> = match meta.0.get("tokenizer.ggml.scores") {
                    Some(Value::Array(a)) => a.iter().map(|v| as_f64(v).unwrap_or(0.0)).collect(),
                    _ => vec![0.0; tokens.len()],
                };
                let unk = meta
                    .opt_usize("tokenizer.ggml.unknown_token_id")
                    .and_then(|i| tokens.get(i).cloned());
                serde_json::json!({
                    "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
                    "normalizer": {"type": "Sequence", "normalizers": [
                        {"type": "Prepend", "prepend": "\u{2581}"},
                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]},
                    "pre_tokenizer": null,
                    "post_processor": post_processor,
                    "decoder": {"type": "Sequence", "decoders": [
                        {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                        {"type": "ByteFallback"}, {"type": "Fuse"},
                        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                    "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                        "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                        "vocab": vocab, "merges": spm_merges(&tokens, &types, &scores)}
                })
            }
            other => return Err(err(&format!("unsupported tokenizer model {other:?}"))),
        };
        let inner = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes())
            .map_err(|e| err(&e.to_string()))?;
        let template = meta.str("tokenizer.chat_template").map(|t| {
            let name = |id: Option<u32>| {
                id.and_then(|i| tokens.get(i as usize).cloned())
                    .unwrap_or_default()
            };
            ChatTemplate::new(t.to_string(), name(self.bos), name(self.eos))
        });
        Ok(
            HfTokenizer::from_inner(inner, self.eos.into_iter().collect(), self.bos)
                .with_chat_template(template),
        )
    }
}

/// BPE merges of a SentencePiece vocabulary: every split of a normal token
/// into two vocabulary pieces, ranked by the merged piece's score (as the
/// Hugging Face converter does).
fn spm_merges(tokens: &[String], types: &[u64], scores: &[f64]) -> Vec<String> {
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f64, usize, usize, String)> = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        if types.get(id).copied().unwrap_or(1) != 1 {
            continue;
        }
        let score = scores.get(id).copied().unwrap_or(0.0);
        for (split, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(split);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((score, li, ri, format!("{l} {r}")));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges.into_iter().map(|m| m.3).collect()
}
