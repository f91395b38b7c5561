//! Exact token counts and exact-length random prompts from a `tokenizer.json`
//! (the pure-Rust `tokenizers` crate).

use crate::dataset::{DatasetSpec, PromptSource, SampleRequest, sample_with};
use crate::error::BenchError;
use crate::rng::Rng;
use std::path::Path;

/// A tokenizer loaded from `tokenizer.json`.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// Ids that decode on their own to clean text (no U+FFFD, no control
    /// characters): random prompts drawn from them stay valid UTF-8.
    clean_ids: Vec<u32>,
}

/// Attempts to reach the exact length before settling for the closest found.
const FIT_ROUNDS: usize = 8;

impl TextTokenizer {
    /// Loads a tokenizer.
    pub fn from_file(path: &Path) -> Result<Self, BenchError> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| BenchError::InvalidArg(format!("--tokenizer {}: {e}", path.display())))?;
        Self::from_inner(inner, &path.display().to_string())
    }

    /// Loads a tokenizer from JSON bytes.
    pub fn from_bytes(json: &[u8]) -> Result<Self, BenchError> {
        let inner = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| BenchError::InvalidArg(format!("tokenizer: {e}")))?;
        Self::from_inner(inner, "tokenizer")
    }

    fn from_inner(inner: tokenizers::Tokenizer, what: &str) -> Result<Self, BenchError> {
        let vocab_size = u32::try_from(inner.get_vocab_size(true)).unwrap_or(u32::MAX);
        let clean_ids: Vec<u32> = (0..vocab_size)
            .filter(|&id| {
                inner.decode(&[id], true).is_ok_and(|t| {
                    !t.trim().is_empty() && !t.chars().any(|c| c == '\u{FFFD}' || c.is_control())
                })
            })
            .collect();
        if clean_ids.is_empty() {
            return Err(BenchError::InvalidArg(format!(
                "{what}: no token decodes to plain text"
            )));
        }
        Ok(TextTokenizer { inner, clean_ids })
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, true).unwrap_or_default()
    }

    fn random_ids(&self, n: usize, rng: &mut Rng) -> Vec<u32> {
        (0..n)
            .map(|_| self.clean_ids[rng.below(self.clean_ids.len())])
            .collect()
    }

    /// Draws requests with exact prompt lengths (and tokenizer counts for real text).
    pub fn sample(
        &self,
        spec: &DatasetSpec,
        n: usize,
        rng: &mut Rng,
    ) -> Result<Vec<SampleRequest>, BenchError> {
        sample_with(spec, n, rng, self)
    }
}

impl PromptSource for TextTokenizer {
    fn count(&self, text: &str) -> usize {
        self.encode(text).len()
    }

    /// Random token ids decoded to text do not always re-encode to the same
    /// number of tokens (merges within and across the boundary); so the body
    /// is re-encoded and trimmed or grown until the whole prompt encodes to
    /// the target. The prefix text is kept byte for byte (prefix caching).
    fn extend(&self, prefix: &str, _prefix_len: usize, n: usize, rng: &mut Rng) -> (String, usize) {
        let pre_ids = self.encode(prefix);
        let target = pre_ids.len() + n;
        let mut body_text = self.decode(&self.random_ids(n, rng));
        let mut best: Option<(String, usize)> = None;
        for _ in 0..FIT_ROUNDS {
            let prompt = format!("{prefix}{body_text}");
            let ids = self.encode(&prompt);
            let len = ids.len();
            if best
                .as_ref()
                .is_none_or(|b| len.abs_diff(target) < b.1.abs_diff(target))
            {
                best = Some((prompt, len));
            }
            if len == target {
                break;
            }
            let mut body_ids = match ids.strip_prefix(pre_ids.as_slice()) {
                Some(rest) => rest.to_vec(),
                None => self.encode(&body_text),
            };
            if len > target {
                body_ids.truncate(body_ids.len().saturating_sub(len - target));
            } else {
                body_ids.extend(self.random_ids(target - len, rng));
            }
            body_text = self.decode(&body_ids);
        }
        best.unwrap_or_else(|| (prefix.to_string(), pre_ids.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A byte-level BPE over the 256 byte symbols plus a few merges: random ids
    /// decode to arbitrary bytes, so re-encoding often changes the length.
    fn byte_bpe() -> TextTokenizer {
        let mut chars: Vec<char> = Vec::new();
        let mut n = 0u32;
        for b in 0u32..256 {
            let printable =
                (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
            if printable {
                chars.push(char::from_u32(b).unwrap_or('?'));
            } else {
                chars.push(char::from_u32(256 + n).unwrap_or('?'));
                n += 1;
            }
        }
        let mut vocab = serde_json::Map::new();
        for (i, c) in chars.iter().enumerate() {
            vocab.insert(c.to_string(), json!(i));
        }
        // Ġt, Ġa, th: merges make lengths depend on neighbours.
        let sp = chars[32];
        let merges = [format!("{sp} t"), format!("{sp} a"), "t h".to_string()];
        for (i, m) in merges.iter().enumerate() {
            vocab.insert(m.replace(' ', ""), json!(256 + i));
        }
        let j = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "vocab": vocab, "merges": merges}
        });
        TextTokenizer::from_bytes(j.to_string().as_bytes()).expect("tokenizer loads")
    }

    #[test]
    fn random_prompts_have_exact_lengths() {
        let t = byte_bpe();
        // "the" → th, e; " at" → Ġa, t: merges apply (6 bytes, 4 tokens).
        assert_eq!(t.count("the at"), 4);
        let spec = DatasetSpec::Random {
            input_len: 40,
            output_len: 8,
            range_ratio: 0.0,
            prefix_len: 10,
        };
        let reqs = t.sample(&spec, 50, &mut Rng::new(5)).expect("sample");
        let mut exact = 0;
        for r in &reqs {
            assert_eq!(
                t.count(&r.prompt),
                r.prompt_len,
                "reported length is the real one"
            );
            exact += usize::from(r.prompt_len == 50);
        }
        assert!(exact >= 48, "prompts of exactly 10 + 40 tokens: {exact}/50");
        let prefix: String = reqs[0].prompt.chars().take(5).collect();
        assert!(reqs.iter().all(|r| r.prompt.starts_with(&prefix)));
    }
}
