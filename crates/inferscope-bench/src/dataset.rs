//! Datasets: the prompts to send and the output length asked of each.
//!
//! With a tokenizer (`--tokenizer`, or the server's `/tokenize`), prompt
//! lengths are exact. Without one they are estimates: generated prompts are
//! made of common English words that BPE tokenizers (GPT, Llama, Qwen, Mistral)
//! encode as one token each when preceded by a space, so `n` words ≈ `n`
//! tokens; lengths of real text (ShareGPT, custom) are estimated as
//! ⌈characters / 4⌉. Reports say which ([`CountedBy`]).

use crate::error::BenchError;
use crate::rng::Rng;
use serde::Deserialize;
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRequest {
    /// The prompt text.
    pub prompt: String,
    /// Prompt length in tokens as the server counts it (an estimate without a tokenizer).
    pub prompt_len: usize,
    /// `max_tokens` to ask for.
    pub expected_output_len: usize,
}

/// Which dataset to draw from, with its parameters.
#[derive(Debug, Clone)]
pub enum DatasetSpec {
    /// Random words of (approximately) the given token lengths.
    Random {
        /// Mean input length in tokens (excluding the prefix).
        input_len: usize,
        /// Mean output length in tokens.
        output_len: usize,
        /// Lengths are uniform in `[len·(1−r), len·(1+r)]`.
        range_ratio: f64,
        /// A prefix of this many tokens shared by every prompt.
        prefix_len: usize,
    },
    /// ShareGPT JSON: first human turn as prompt, the reply's length as output length.
    ShareGpt {
        /// The JSON file.
        path: PathBuf,
        /// Fixed output length instead of the reply's.
        output_len: Option<usize>,
    },
    /// JSON Lines with a `prompt` field (and optionally `output_tokens`).
    Custom {
        /// The JSONL file.
        path: PathBuf,
        /// Output length when a line gives none.
        output_len: usize,
    },
    /// `num_prefixes` shared prefixes, each followed by a random suffix.
    PrefixRepetition {
        /// Tokens per shared prefix.
        prefix_len: usize,
        /// Tokens per random suffix.
        suffix_len: usize,
        /// Number of distinct prefixes.
        num_prefixes: usize,
        /// Output length.
        output_len: usize,
    },
}

/// Words that are one token each (with a leading space) in common BPE vocabularies.
pub(crate) const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "they",
    "this",
    "which",
    "but",
    "not",
    "are",
    "were",
    "had",
    "have",
    "one",
    "all",
    "time",
    "new",
    "first",
    "people",
    "year",
    "would",
    "there",
    "their",
    "been",
    "has",
    "more",
    "when",
    "will",
    "who",
    "also",
    "after",
    "into",
    "other",
    "two",
    "many",
    "some",
    "could",
    "them",
    "than",
    "only",
    "over",
    "most",
    "such",
    "city",
    "made",
    "water",
    "world",
    "state",
    "school",
    "house",
    "light",
    "music",
    "river",
    "market",
    "paper",
    "table",
    "green",
    "small",
    "large",
    "long",
    "great",
    "little",
    "old",
    "good",
    "right",
    "high",
    "early",
    "young",
    "important",
    "public",
    "family",
    "system",
    "group",
    "number",
    "part",
    "place",
    "case",
    "point",
    "work",
    "week",
    "company",
    "program",
    "question",
    "government",
    "night",
    "power",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "name",
    "story",
    "fact",
];

/// How a token count was obtained. Reports say which, so an estimate is never
/// read as a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CountedBy {
    /// The server's `usage` in each response.
    Usage,
    /// The server's `POST /tokenize`.
    ServerTokenizer,
    /// A local `tokenizer.json` (`--tokenizer`).
    Tokenizer,
    /// Estimated: words or characters for prompts, stream chunks for outputs.
    #[default]
    Estimate,
}

impl CountedBy {
    /// The value in the result JSON.
    pub fn key(self) -> &'static str {
        match self {
            CountedBy::Usage => "usage",
            CountedBy::ServerTokenizer => "server_tokenize",
            CountedBy::Tokenizer => "tokenizer",
            CountedBy::Estimate => "estimate",
        }
    }

    /// Whether the count is exact.
    pub fn is_exact(self) -> bool {
        self != CountedBy::Estimate
    }

    /// The weaker of two (a total mixing an estimate with exact counts is an estimate).
    pub fn and(self, other: CountedBy) -> CountedBy {
        match (self, other) {
            (CountedBy::Estimate, _) | (_, CountedBy::Estimate) => CountedBy::Estimate,
            (CountedBy::Usage, o) => o,
            (s, _) => s,
        }
    }
}

/// Where prompt text and token counts come from: a word list without a
/// tokenizer, or a tokenizer (local or the server's) for exact lengths.
/// Batched, so a tokenizer behind HTTP can answer many texts at once.
pub trait PromptSource: Send + Sync {
    /// How this source counts.
    fn counted_by(&self) -> CountedBy;
    /// Tokens the server adds to every prompt (BOS and the like).
    fn special_tokens(&self) -> usize;
    /// Tokens of each text as the server counts it as a prompt (special
    /// tokens included).
    fn prompt_tokens(&self, texts: &[String]) -> Result<Vec<usize>, BenchError>;
    /// Tokens of each text on its own (no special tokens): generated text.
    fn text_tokens(&self, texts: &[String]) -> Result<Vec<usize>, BenchError>;
    /// For each `(prefix, n)`: `prefix` followed by random text, `n` tokens
    /// more than the prefix; returns each prompt and its `prompt_tokens`.
    fn extend(
        &self,
        asks: &[(String, usize)],
        rng: &mut Rng,
    ) -> Result<Vec<(String, usize)>, BenchError>;
}

/// Prompts from the built-in word list; counts of real text are ⌈chars/4⌉.
#[derive(Debug, Clone, Copy, Default)]
pub struct WordSource;

impl PromptSource for WordSource {
    fn counted_by(&self) -> CountedBy {
        CountedBy::Estimate
    }

    fn special_tokens(&self) -> usize {
        0
    }

    fn prompt_tokens(&self, texts: &[String]) -> Result<Vec<usize>, BenchError> {
        Ok(texts.iter().map(|t| estimate_tokens(t)).collect())
    }

    fn text_tokens(&self, texts: &[String]) -> Result<Vec<usize>, BenchError> {
        self.prompt_tokens(texts)
    }

    fn extend(
        &self,
        asks: &[(String, usize)],
        rng: &mut Rng,
    ) -> Result<Vec<(String, usize)>, BenchError> {
        Ok(asks
            .iter()
            .map(|(prefix, n)| {
                // Prefixes come from this source: one word per token.
                let prefix_len = prefix.split(' ').filter(|w| !w.is_empty()).count();
                let body = random_words(*n, rng);
                let prompt = match (prefix.is_empty(), body.is_empty()) {
                    (true, _) => body,
                    (false, true) => prefix.clone(),
                    (false, false) => format!("{prefix} {body}"),
                };
                (prompt, prefix_len + n)
            })
            .collect())
    }
}

/// `n` random words joined by spaces (≈ `n` tokens).
pub fn random_words(n: usize, rng: &mut Rng) -> String {
    let mut s = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[rng.below(WORDS.len())]);
    }
    s
}

/// Estimated token count of arbitrary text without a tokenizer (⌈chars/4⌉).
pub fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

/// Draws `num_prompts` requests from the dataset with the word-list source.
pub fn sample(
    spec: &DatasetSpec,
    num_prompts: usize,
    rng: &mut Rng,
) -> Result<Vec<SampleRequest>, BenchError> {
    sample_with(spec, num_prompts, rng, &WordSource)
}

/// Draws `num_prompts` requests, with text and counts from `src`.
pub fn sample_with(
    spec: &DatasetSpec,
    num_prompts: usize,
    rng: &mut Rng,
    src: &dyn PromptSource,
) -> Result<Vec<SampleRequest>, BenchError> {
    match spec {
        DatasetSpec::Random {
            input_len,
            output_len,
            range_ratio,
            prefix_len,
        } => sample_random(
            *input_len,
            *output_len,
            *range_ratio,
            *prefix_len,
            num_prompts,
            rng,
            src,
        ),
        DatasetSpec::ShareGpt { path, output_len } => {
            sample_sharegpt(path, *output_len, num_prompts, rng, src)
        }
        DatasetSpec::Custom { path, output_len } => {
            sample_custom(path, *output_len, num_prompts, rng, src)
        }
        DatasetSpec::PrefixRepetition {
            prefix_len,
            suffix_len,
            num_prefixes,
            output_len,
        } => sample_prefix_repetition(
            *prefix_len,
            *suffix_len,
            *num_prefixes,
            *output_len,
            num_prompts,
            rng,
            src,
        ),
    }
}

fn length_bounds(len: usize, ratio: f64) -> (usize, usize) {
    let lo = (len as f64 * (1.0 - ratio)).floor().max(0.0) as usize;
    let hi = (len as f64 * (1.0 + ratio)).ceil() as usize;
    (lo, hi)
}

fn sample_random(
    input_len: usize,
    output_len: usize,
    range_ratio: f64,
    prefix_len: usize,
    num_prompts: usize,
    rng: &mut Rng,
    src: &dyn PromptSource,
) -> Result<Vec<SampleRequest>, BenchError> {
    if !(0.0..1.0).contains(&range_ratio) {
        return Err(BenchError::InvalidArg(format!(
            "--random-range-ratio must be in [0, 1), got {range_ratio}"
        )));
    }
    let prefix = match prefix_len {
        0 => String::new(),
        n => first(src.extend(&[(String::new(), n)], rng)?)?.0,
    };
    let (in_lo, in_hi) = length_bounds(input_len, range_ratio);
    let (out_lo, out_hi) = length_bounds(output_len, range_ratio);
    // As vLLM does: the server's special tokens are part of the input length,
    // so the server sees `prefix_len + input_len` tokens.
    let special = src.special_tokens();
    let mut asks = Vec::with_capacity(num_prompts);
    let mut outs = Vec::with_capacity(num_prompts);
    for _ in 0..num_prompts {
        let n_in = rng.range_inclusive(in_lo, in_hi);
        outs.push(rng.range_inclusive(out_lo, out_hi).max(1));
        asks.push((prefix.clone(), n_in.saturating_sub(special)));
    }
    Ok(src
        .extend(&asks, rng)?
        .into_iter()
        .zip(outs)
        .map(
            |((prompt, prompt_len), expected_output_len)| SampleRequest {
                prompt,
                prompt_len,
                expected_output_len,
            },
        )
        .collect())
}

/// The one answer to a one-ask `extend`.
fn first<T>(v: Vec<T>) -> Result<T, BenchError> {
    v.into_iter()
        .next()
        .ok_or_else(|| BenchError::Dataset("the prompt source answered nothing".into()))
}

fn sample_prefix_repetition(
    prefix_len: usize,
    suffix_len: usize,
    num_prefixes: usize,
    output_len: usize,
    num_prompts: usize,
    rng: &mut Rng,
    src: &dyn PromptSource,
) -> Result<Vec<SampleRequest>, BenchError> {
    let empty: Vec<(String, usize)> = vec![(String::new(), prefix_len); num_prefixes.max(1)];
    let prefixes = src.extend(&empty, rng)?;
    let asks: Vec<(String, usize)> = (0..num_prompts)
        .map(|i| (prefixes[i % prefixes.len()].0.clone(), suffix_len))
        .collect();
    let mut out: Vec<SampleRequest> = src
        .extend(&asks, rng)?
        .into_iter()
        .map(|(prompt, prompt_len)| SampleRequest {
            prompt,
            prompt_len,
            expected_output_len: output_len.max(1),
        })
        .collect();
    rng.shuffle(&mut out);
    Ok(out)
}

fn read_file(path: &Path) -> Result<String, BenchError> {
    std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))
}

#[derive(Deserialize)]
struct ShareGptEntry {
    #[serde(default)]
    conversations: Vec<ShareGptTurn>,
}

#[derive(Deserialize)]
struct ShareGptTurn {
    #[serde(default)]
    value: String,
}

fn sample_sharegpt(
    path: &Path,
    fixed_output_len: Option<usize>,
    num_prompts: usize,
    rng: &mut Rng,
    src: &dyn PromptSource,
) -> Result<Vec<SampleRequest>, BenchError> {
    let text = read_file(path)?;
    let mut entries: Vec<ShareGptEntry> =
        serde_json::from_str(&text).map_err(|source| BenchError::Json {
            context: format!("ShareGPT file {}", path.display()),
            source,
        })?;
    entries.retain(|e| e.conversations.len() >= 2);
    rng.shuffle(&mut entries);
    let mut out = Vec::with_capacity(num_prompts);
    // Counted in batches of what is still missing (a server tokenizer answers
    // a batch concurrently), not the whole file.
    let mut rest = entries.as_slice();
    while out.len() < num_prompts && !rest.is_empty() {
        let take = (num_prompts - out.len()).max(16).min(rest.len());
        let (batch, tail) = rest.split_at(take);
        rest = tail;
        let prompts: Vec<String> = batch
            .iter()
            .map(|e| e.conversations[0].value.clone())
            .collect();
        let prompt_lens = src.prompt_tokens(&prompts)?;
        let output_lens = match fixed_output_len {
            Some(n) => vec![n; batch.len()],
            None => {
                let replies: Vec<String> = batch
                    .iter()
                    .map(|e| e.conversations[1].value.clone())
                    .collect();
                src.text_tokens(&replies)?
            }
        };
        for ((prompt, prompt_len), output_len) in
            prompts.into_iter().zip(prompt_lens).zip(output_lens)
        {
            if out.len() == num_prompts {
                break;
            }
            // Same filter as vLLM: drop very short and very long pairs.
            if fixed_output_len.is_none()
                && (prompt_len < 4
                    || output_len < 4
                    || prompt_len > 1024
                    || prompt_len + output_len > 2048)
            {
                continue;
            }
            out.push(SampleRequest {
                prompt,
                prompt_len,
                expected_output_len: output_len.max(1),
            });
        }
    }
    if out.is_empty() {
        return Err(BenchError::Dataset(format!(
            "no usable conversation in {}",
            path.display()
        )));
    }
    Ok(cycle_to(out, num_prompts))
}

#[derive(Deserialize)]
struct CustomLine {
    prompt: String,
    #[serde(default)]
    output_tokens: Option<usize>,
}

fn sample_custom(
    path: &Path,
    output_len: usize,
    num_prompts: usize,
    rng: &mut Rng,
    src: &dyn PromptSource,
) -> Result<Vec<SampleRequest>, BenchError> {
    let file = std::fs::File::open(path).map_err(|e| BenchError::io(path, e))?;
    let mut lines: Vec<CustomLine> = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| BenchError::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: CustomLine =
            serde_json::from_str(&line).map_err(|source| BenchError::Json {
                context: format!("{} line {}", path.display(), i + 1),
                source,
            })?;
        lines.push(parsed);
    }
    if lines.is_empty() {
        return Err(BenchError::Dataset(format!(
            "no prompt in {}",
            path.display()
        )));
    }
    rng.shuffle(&mut lines);
    // Only the prompts that will be sent are counted.
    lines.truncate(num_prompts);
    let prompts: Vec<String> = lines.iter().map(|l| l.prompt.clone()).collect();
    let lens = src.prompt_tokens(&prompts)?;
    let out = lines
        .into_iter()
        .zip(lens)
        .map(|(l, prompt_len)| SampleRequest {
            prompt: l.prompt,
            prompt_len,
            expected_output_len: l.output_tokens.unwrap_or(output_len).max(1),
        })
        .collect();
    Ok(cycle_to(out, num_prompts))
}

/// Repeats the samples in order until there are `n` (datasets smaller than `--num-prompts`).
fn cycle_to(samples: Vec<SampleRequest>, n: usize) -> Vec<SampleRequest> {
    samples.iter().cycle().take(n).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_total_is_as_good_as_its_weakest_count() {
        use CountedBy::*;
        assert_eq!(Usage.and(Usage), Usage);
        assert_eq!(Usage.and(ServerTokenizer), ServerTokenizer);
        assert_eq!(Tokenizer.and(Usage), Tokenizer);
        assert_eq!(ServerTokenizer.and(Estimate), Estimate);
        assert_eq!(Estimate.and(Usage), Estimate);
        assert!(Usage.is_exact() && Tokenizer.is_exact() && !Estimate.is_exact());
    }

    #[test]
    fn random_lengths_within_range_and_prefix_shared() {
        let mut rng = Rng::new(3);
        let spec = DatasetSpec::Random {
            input_len: 100,
            output_len: 20,
            range_ratio: 0.5,
            prefix_len: 10,
        };
        let reqs = sample(&spec, 200, &mut rng).expect("random dataset");
        assert_eq!(reqs.len(), 200);
        let prefix: Vec<&str> = reqs[0].prompt.split(' ').take(10).collect();
        for r in &reqs {
            let words = r.prompt.split(' ').count();
            assert_eq!(words, r.prompt_len);
            assert!((60..=160).contains(&r.prompt_len), "{}", r.prompt_len);
            assert!((10..=30).contains(&r.expected_output_len));
            assert_eq!(r.prompt.split(' ').take(10).collect::<Vec<_>>(), prefix);
        }
    }

    #[test]
    fn custom_jsonl_and_bad_lines() {
        let dir = std::env::temp_dir().join(format!("isb-ds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let good = dir.join("good.jsonl");
        std::fs::write(
            &good,
            "{\"prompt\":\"hello there\"}\n\n{\"prompt\":\"x\",\"output_tokens\":7}\n",
        )
        .expect("write");
        let reqs = sample(
            &DatasetSpec::Custom {
                path: good,
                output_len: 33,
            },
            5,
            &mut Rng::new(0),
        )
        .expect("custom");
        assert_eq!(reqs.len(), 5);
        assert!(reqs.iter().any(|r| r.expected_output_len == 7));
        assert!(
            reqs.iter()
                .any(|r| r.expected_output_len == 33 && r.prompt == "hello there")
        );
        let bad = dir.join("bad.jsonl");
        std::fs::write(&bad, "{\"text\":1}\n").expect("write");
        let err = sample(
            &DatasetSpec::Custom {
                path: bad,
                output_len: 1,
            },
            1,
            &mut Rng::new(0),
        );
        assert!(matches!(err, Err(BenchError::Json { .. })));
    }

    #[test]
    fn sharegpt_takes_first_turn() {
        let dir = std::env::temp_dir().join(format!("isb-sg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let p = dir.join("sg.json");
        std::fs::write(
            &p,
            r#"[{"conversations":[{"from":"human","value":"What is the capital of France, please?"},{"from":"gpt","value":"The capital of France is Paris, of course."}]},{"conversations":[{"from":"human","value":"lonely"}]}]"#,
        )
        .expect("write");
        let reqs = sample(
            &DatasetSpec::ShareGpt {
                path: p,
                output_len: None,
            },
            2,
            &mut Rng::new(0),
        )
        .expect("sharegpt");
        assert_eq!(reqs.len(), 2);
        assert!(
            reqs.iter()
                .all(|r| r.prompt.starts_with("What is the capital"))
        );
        assert_eq!(
            reqs[0].expected_output_len,
            estimate_tokens("The capital of France is Paris, of course.")
        );
    }

    #[test]
    fn prefix_repetition_shares_prefixes() {
        let reqs = sample(
            &DatasetSpec::PrefixRepetition {
                prefix_len: 5,
                suffix_len: 3,
                num_prefixes: 2,
                output_len: 9,
            },
            10,
            &mut Rng::new(1),
        )
        .expect("prefix repetition");
        let mut prefixes: Vec<String> = reqs
            .iter()
            .map(|r| r.prompt.split(' ').take(5).collect::<Vec<_>>().join(" "))
            .collect();
        prefixes.sort();
        prefixes.dedup();
        assert_eq!(prefixes.len(), 2);
        assert!(
            reqs.iter()
                .all(|r| r.prompt_len == 8 && r.expected_output_len == 9)
        );
    }
}
