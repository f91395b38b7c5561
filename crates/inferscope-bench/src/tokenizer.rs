//! Exact token counts and exact-length random prompts from a tokenizer: a
//! local `tokenizer.json` (the pure-Rust `tokenizers` crate) or the server's
//! own (`/tokenize` and `/detokenize`, see [`crate::server_tokenizer`]). Both
//! sit behind [`Codec`]; the fitting of prompt lengths is written once, in
//! [`ExactSource`].

use crate::dataset::{CountedBy, PromptSource};
use crate::error::BenchError;
use crate::rng::Rng;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Token ids to text and back, in batches (a tokenizer behind HTTP answers
/// a batch concurrently).
pub trait Codec: Send + Sync {
    /// How counts from this codec are labelled.
    fn counted_by(&self) -> CountedBy;
    /// Ids of each text, without special tokens.
    fn encode(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, BenchError>;
    /// Text of each id list.
    fn decode(&self, ids: &[Vec<u32>]) -> Result<Vec<String>, BenchError>;
    /// Ids that decode to clean text, to draw random prompts from.
    fn pool(&self) -> &[u32];
    /// Tokens the server adds to a prompt (BOS and the like).
    fn special_tokens(&self) -> usize;
    /// Each text's token count as the server counts it as a prompt, when
    /// that is not `encode` plus the special tokens (a chat template).
    fn prompt_tokens(&self, _texts: &[String]) -> Result<Option<Vec<usize>>, BenchError> {
        Ok(None)
    }
}

/// Attempts to reach the exact length before settling for the closest found.
const FIT_ROUNDS: usize = 8;

/// Prompts fitted together, round by round.
const FIT_GROUP: usize = 128;

/// A [`PromptSource`] with exact counts and fitted random prompts from a codec.
pub struct ExactSource {
    codec: Arc<dyn Codec>,
    /// Prompts prepared so far (for a progress bar).
    pub done: Arc<AtomicUsize>,
}

impl ExactSource {
    /// A source over `codec`.
    pub fn new(codec: Arc<dyn Codec>) -> Self {
        ExactSource {
            codec,
            done: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn random_ids(&self, n: usize, rng: &mut Rng) -> Vec<u32> {
        let pool = self.codec.pool();
        if pool.is_empty() {
            return Vec::new();
        }
        (0..n).map(|_| pool[rng.below(pool.len())]).collect()
    }

    /// For each ask, `prefix` + a body of random ids such that the whole
    /// prompt encodes to `len(prefix) + n` tokens; returns each prompt and its
    /// length without special tokens.
    ///
    /// Random ids decoded to text do not always re-encode to the same number
    /// of tokens (merges within and across the boundary); so, as `vllm bench
    /// serve` does, the body is decoded, the whole prompt re-encoded, and the
    /// body trimmed or grown until it fits. The prefix text is kept byte for
    /// byte (prefix caching). All asks advance round by round together, so a
    /// codec behind HTTP sees a few batches, not one call at a time.
    fn fit(
        &self,
        asks: &[(String, usize)],
        rng: &mut Rng,
    ) -> Result<Vec<(String, usize)>, BenchError> {
        let codec = self.codec.as_ref();
        // Each distinct prefix is encoded once.
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut distinct: Vec<String> = Vec::new();
        let which: Vec<usize> = asks
            .iter()
            .map(|(p, _)| {
                *index.entry(p.as_str()).or_insert_with(|| {
                    distinct.push(p.clone());
                    distinct.len() - 1
                })
            })
            .collect();
        let pre_ids = codec.encode(&distinct)?;
        let targets: Vec<usize> = asks
            .iter()
            .zip(&which)
            .map(|((_, n), &w)| pre_ids[w].len() + n)
            .collect();
        let first_ids: Vec<Vec<u32>> = asks.iter().map(|(_, n)| self.random_ids(*n, rng)).collect();
        let mut bodies = codec.decode(&first_ids)?;
        let mut best: Vec<Option<(String, usize)>> = vec![None; asks.len()];
        let mut active: Vec<usize> = (0..asks.len()).collect();
        for round in 0..FIT_ROUNDS {
            let prompts: Vec<String> = active
                .iter()
                .map(|&i| format!("{}{}", asks[i].0, bodies[i]))
                .collect();
            let encoded = codec.encode(&prompts)?;
            // Asks still off target: index, body ids, prompt length now.
            let mut still: Vec<usize> = Vec::new();
            let mut next_ids: Vec<Vec<u32>> = Vec::new();
            let mut lens: Vec<usize> = Vec::new();
            let mut unstripped: Vec<usize> = Vec::new();
            for ((&i, prompt), ids) in active.iter().zip(prompts).zip(encoded) {
                let (len, target) = (ids.len(), targets[i]);
                if best[i]
                    .as_ref()
                    .is_none_or(|b| len.abs_diff(target) < b.1.abs_diff(target))
                {
                    best[i] = Some((prompt, len));
                }
                if len == target || round + 1 == FIT_ROUNDS {
                    self.done.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // The body's ids as they are now: the prompt's, past the prefix;
                // when the boundary merged, the body re-encoded alone.
                let body = match ids.strip_prefix(pre_ids[which[i]].as_slice()) {
                    Some(rest) => rest.to_vec(),
                    None => {
                        unstripped.push(still.len());
                        Vec::new()
                    }
                };
                still.push(i);
                next_ids.push(body);
                lens.push(len);
            }
            if still.is_empty() {
                break;
            }
            if !unstripped.is_empty() {
                let texts: Vec<String> = unstripped
                    .iter()
                    .map(|&k| bodies[still[k]].clone())
                    .collect();
                for (&k, ids) in unstripped.iter().zip(codec.encode(&texts)?) {
                    next_ids[k] = ids;
                }
            }
            for ((&i, body), &len) in still.iter().zip(next_ids.iter_mut()).zip(&lens) {
                let target = targets[i];
                if len > target {
                    body.truncate(body.len().saturating_sub(len - target));
                } else {
                    body.extend(self.random_ids(target - len, rng));
                }
            }
            let decoded = codec.decode(&next_ids)?;
            for (&i, text) in still.iter().zip(decoded) {
                bodies[i] = text;
            }
            active = still;
        }
        Ok(best
            .into_iter()
            .zip(asks)
            .map(|(b, (prefix, _))| b.unwrap_or_else(|| (prefix.clone(), 0)))
            .collect())
    }
}

impl PromptSource for ExactSource {
    fn counted_by(&self) -> CountedBy {
        self.codec.counted_by()
    }

    fn special_tokens(&self) -> usize {
        self.codec.special_tokens()
    }

    fn prompt_tokens(&self, texts: &[String]) -> Result<Vec<usize>, BenchError> {
        let counts = match self.codec.prompt_tokens(texts)? {
            Some(c) => c,
            None => self
                .text_tokens(texts)?
                .into_iter()
                .map(|n| n + self.special_tokens())
                .collect(),
        };
        self.done.fetch_add(texts.len(), Ordering::Relaxed);
        Ok(counts)
    }

    fn text_tokens(&self, texts: &[String]) -> Result<Vec<usize>, BenchError> {
        Ok(self.codec.encode(texts)?.iter().map(Vec::len).collect())
    }

    fn extend(
        &self,
        asks: &[(String, usize)],
        rng: &mut Rng,
    ) -> Result<Vec<(String, usize)>, BenchError> {
        // In groups, so progress shows group by group; a group is still
        // wide enough to keep every concurrent call of a server codec busy.
        let mut fitted = Vec::with_capacity(asks.len());
        for group in asks.chunks(FIT_GROUP) {
            fitted.extend(self.fit(group, rng)?);
        }
        let special = self.special_tokens();
        let texts: Vec<String> = fitted.iter().map(|(t, _)| t.clone()).collect();
        // A chat template changes the count: ask the codec for the real one.
        Ok(match self.codec.prompt_tokens(&texts)? {
            Some(counts) => texts.into_iter().zip(counts).collect(),
            None => fitted.into_iter().map(|(t, n)| (t, n + special)).collect(),
        })
    }
}

/// A tokenizer loaded from `tokenizer.json`.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// Ids that decode on their own to clean text (no U+FFFD, no control
    /// characters): random prompts drawn from them stay valid UTF-8.
    clean_ids: Vec<u32>,
    /// Tokens its post-processor adds to a prompt.
    special: usize,
}

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
        let len = |special| {
            inner
                .encode("the", special)
                .map_or(0, |e| e.get_ids().len())
        };
        let special = len(true).saturating_sub(len(false));
        Ok(TextTokenizer {
            inner,
            clean_ids,
            special,
        })
    }

    /// Tokens of `text` (no special tokens).
    pub fn count(&self, text: &str) -> usize {
        self.encode_one(text).len()
    }

    fn encode_one(&self, text: &str) -> Vec<u32> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }
}

impl Codec for TextTokenizer {
    fn counted_by(&self) -> CountedBy {
        CountedBy::Tokenizer
    }

    fn encode(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, BenchError> {
        Ok(texts.iter().map(|t| self.encode_one(t)).collect())
    }

    fn decode(&self, ids: &[Vec<u32>]) -> Result<Vec<String>, BenchError> {
        Ok(ids
            .iter()
            .map(|i| self.inner.decode(i, true).unwrap_or_default())
            .collect())
    }

    fn pool(&self) -> &[u32] {
        &self.clean_ids
    }

    fn special_tokens(&self) -> usize {
        self.special
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{DatasetSpec, sample_with};

    /// A byte-level BPE whose merges (Ġt, Ġa, th) make lengths depend on
    /// neighbours.
    fn byte_bpe() -> TextTokenizer {
        let json = crate::mock::byte_level_bpe_json(&["Ġ t", "Ġ a", "t h"]);
        TextTokenizer::from_bytes(json.as_bytes()).expect("tokenizer loads")
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
        let src = ExactSource::new(Arc::new(byte_bpe()));
        let reqs = sample_with(&spec, 50, &mut Rng::new(5), &src).expect("sample");
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
