//! The tokenizer of a GGUF file without a `tokenizer.json` beside it, built
//! from its `tokenizer.ggml.*` metadata to give llama.cpp's tokens, token for
//! token (`src/llama-vocab.cpp`): the vocabulary types and attributes,
//! special tokens matched in the text, the pre-tokenizer named by
//! `tokenizer.ggml.pre` ([`crate::pretokenizer`]), the merges
//! ([`crate::bpe`]), the pieces tokens decode to, and the end-of-generation
//! set.

use std::path::Path;

use aho_corasick::{AhoCorasick, MatchKind};
use candle_core::quantized::gguf_file::Value;

use crate::bpe::{self, Bpe, NONE, Pieces, Scratch, Spm};
use crate::chat_template::ChatTemplate;
use crate::error::ModelError;
use crate::gguf_file::GgufFile;
use crate::gguf_meta::{Meta, as_f64, as_u64};
use crate::pretokenizer::PreTokenizer;
use crate::tokenizer::{ChatMessage, Tokenizer, default_chat_template};

/// Token attributes (llama.cpp's `llama_token_attr`).
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// The attribute of a `tokenizer.ggml.token_type` value.
fn attr_of_type(t: i64) -> u16 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0,
    }
}

/// Texts llama.cpp takes for an end-of-turn token when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
/// Same for end-of-message.
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
/// Same for the fill-in-the-middle tokens (only pad, repo and file separator
/// end generation, but all of them become control tokens).
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Texts that end generation wherever they are in the vocabulary
/// (llama.cpp's `special_eog_ids` rule).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// The tokenizer models (`tokenizer.ggml.model`) this module runs.
const SUPPORTED_MODELS: &str = "llama (SentencePiece), gpt2 (byte-level BPE), gemma4";

/// How text becomes symbols to merge.
enum Model {
    /// SentencePiece (`llama`): merges by score, byte fallback.
    Spm(Box<Spm>),
    /// BPE (`gpt2`, `gemma4`): pre-tokenizer, then merges by rank.
    Bpe { pre: PreTokenizer, bpe: Box<Bpe> },
}

/// The special tokens matched in the text before the model runs, longest
/// first (llama.cpp's `cache_special_tokens`).
struct SpecialTokens {
    /// One pattern per token of `ids`, in the same order.
    matcher: Option<AhoCorasick>,
    ids: Vec<u32>,
}

/// A piece of the text after the special tokens are matched.
enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

/// A GGUF vocabulary tokenized as llama.cpp tokenizes it.
pub struct GgufTokenizer {
    model: Model,
    /// Token texts, as in the file.
    texts: Vec<Box<str>>,
    attrs: Vec<u16>,
    pieces: Pieces,
    special: SpecialTokens,
    /// What each token decodes to (llama.cpp's `token_to_piece` with
    /// specials), all in one buffer.
    decoded: Vec<u8>,
    decoded_ends: Vec<usize>,
    bos: Option<u32>,
    eos: Option<u32>,
    /// Every token that ends generation, sorted.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// Spaces become ▁ before a BPE model runs (`gemma4`).
    escape_whitespaces: bool,
    chat_template: Option<ChatTemplate>,
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("model", &self.model_name())
            .field("vocab_size", &self.texts.len())
            .field("bos", &self.bos)
            .field("eog", &self.eog)
            .finish()
    }
}

/// The `tokenizer.ggml.*` metadata the model loader needs before the
/// tokenizer is built.
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

    /// Builds the tokenizer from the metadata.
    pub(crate) fn build(&self, meta: &Meta<'_>) -> Result<GgufTokenizer, ModelError> {
        GgufTokenizer::from_meta(meta)
    }
}

fn err(m: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(format!("GGUF tokenizer: {m}"))
}

fn strings(meta: &Meta<'_>, key: &str) -> Result<Vec<String>, ModelError> {
    match meta.0.get(key) {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(err(format!("{key} holds a non-string"))),
            })
            .collect(),
        Some(_) => Err(err(format!("{key} is not an array of strings"))),
        None => Err(err(format!("missing {key}"))),
    }
}

fn numbers(meta: &Meta<'_>, key: &str, n: usize) -> Result<Option<Vec<f64>>, ModelError> {
    match meta.0.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) if a.len() >= n => a
            .iter()
            .map(|v| as_f64(v).ok_or_else(|| err(format!("{key} holds a non-number"))))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(Value::Array(a)) => Err(err(format!("{key} has {} entries for {n} tokens", a.len()))),
        Some(_) => Err(err(format!("{key} is not an array"))),
    }
}

fn flag(meta: &Meta<'_>, key: &str) -> Option<bool> {
    match meta.0.get(key) {
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => as_u64(v).map(|x| x != 0),
        None => None,
    }
}

impl GgufTokenizer {
    /// Builds the tokenizer of a GGUF file from its metadata alone (the
    /// tensors are not read; vocabulary-only files work).
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let content = GgufFile::read(path)?;
        Self::from_meta(&Meta(&content.metadata))
    }

    pub(crate) fn from_meta(meta: &Meta<'_>) -> Result<Self, ModelError> {
        let model_name = meta
            .str("tokenizer.ggml.model")
            .ok_or_else(|| err("no tokenizer.ggml.model and no tokenizer.json beside the file"))?;
        let mut texts = strings(meta, "tokenizer.ggml.tokens")?;
        let n = texts.len();
        if n == 0 || n >= NONE as usize {
            return Err(err(format!("tokenizer.ggml.tokens has {n} tokens")));
        }
        for (i, t) in texts.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
        }
        let scores: Vec<f32> = numbers(meta, "tokenizer.ggml.scores", n)?
            .map(|s| s.into_iter().map(|x| x as f32).collect())
            .unwrap_or_else(|| vec![0.0; n]);
        let mut attrs: Vec<u16> = numbers(meta, "tokenizer.ggml.token_type", n)?
            .map(|t| t.into_iter().map(|x| attr_of_type(x as i64)).collect())
            .unwrap_or_else(|| vec![attr::NORMAL; n]);
        let mut pieces = Pieces::new(texts.iter().map(String::as_str));

        // Per type: the model, default special ids (llama.cpp's), flags.
        let (model, default_bos, default_eos, default_unk, add_space_prefix, escape, add_bos) =
            match model_name {
                "llama" => (
                    Model::Spm(Box::new(Spm {
                        scores: Vec::new(),
                        byte_tokens: [NONE; 256],
                        unk: None,
                        split: false,
                    })),
                    Some(1),
                    Some(2),
                    Some(0),
                    true,
                    true,
                    true,
                ),
                "gpt2" | "gemma4" => {
                    let pre_name = if model_name == "gemma4" {
                        "gemma4"
                    } else {
                        match meta.str("tokenizer.ggml.pre") {
                            Some(p) => p,
                            None => {
                                tracing::warn!(
                                    "GGUF tokenizer: no tokenizer.ggml.pre, using the `default` pre-tokenizer as llama.cpp does (generation quality may suffer; regenerate the file)"
                                );
                                "default"
                            }
                        }
                    };
                    let pre = PreTokenizer::by_name(pre_name)?;
                    let merges = strings(meta, "tokenizer.ggml.merges")?;
                    let gemma4 = model_name == "gemma4";
                    let bpe = Bpe::new(&mut pieces, &merges, !gemma4, pre.ignore_merges, gemma4);
                    let add_bos = pre.add_bos;
                    let (bos, eos) = if gemma4 {
                        (None, None)
                    } else {
                        (Some(11), Some(11))
                    };
                    (
                        Model::Bpe {
                            pre,
                            bpe: Box::new(bpe),
                        },
                        bos,
                        eos,
                        None,
                        false,
                        gemma4,
                        add_bos,
                    )
                }
                other => {
                    return Err(err(format!(
                        "unsupported tokenizer model tokenizer.ggml.model = {other:?} (supported: {SUPPORTED_MODELS})"
                    )));
                }
            };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let id_key = |key: &str, default: Option<u32>| -> Option<u32> {
            match meta.opt_usize(&format!("tokenizer.ggml.{key}")) {
                Some(i) if i < n => Some(i as u32),
                Some(i) => {
                    tracing::warn!(
                        "GGUF tokenizer: tokenizer.ggml.{key} = {i} is outside the vocabulary, ignored"
                    );
                    in_range(default)
                }
                None => in_range(default),
            }
        };
        let bos = id_key("bos_token_id", default_bos);
        let eos = id_key("eos_token_id", default_eos);
        let unk = id_key("unknown_token_id", default_unk);
        let eot = id_key("eot_token_id", None);
        let eom = id_key("eom_token_id", None);
        let fim = [
            (
                id_key("fim_pre_token_id", None).or_else(|| id_key("prefix_token_id", None)),
                FIM_PRE_TEXTS,
            ),
            (
                id_key("fim_suf_token_id", None).or_else(|| id_key("suffix_token_id", None)),
                FIM_SUF_TEXTS,
            ),
            (
                id_key("fim_mid_token_id", None).or_else(|| id_key("middle_token_id", None)),
                FIM_MID_TEXTS,
            ),
            (id_key("fim_pad_token_id", None), FIM_PAD_TEXTS),
            (id_key("fim_rep_token_id", None), FIM_REP_TEXTS),
            (id_key("fim_sep_token_id", None), FIM_SEP_TEXTS),
        ];
        let mut add_bos = flag(meta, "tokenizer.ggml.add_bos_token").unwrap_or(add_bos);
        let add_eos = flag(meta, "tokenizer.ggml.add_eos_token").unwrap_or(false);
        if model_name == "gemma4" {
            // llama.cpp forces it for Gemma 4.
            add_bos = true;
        }
        let add_space_prefix =
            flag(meta, "tokenizer.ggml.add_space_prefix").unwrap_or(add_space_prefix);
        if add_bos && bos.is_none() {
            return Err(err(
                "tokenizer.ggml.add_bos_token is set but there is no BOS token",
            ));
        }
        if add_eos && eos.is_none() {
            return Err(err(
                "tokenizer.ggml.add_eos_token is set but there is no EOS token",
            ));
        }

        let eog = end_of_generation(&texts, &pieces, &mut attrs, [eos, eot, eom], fim);

        // Special tokens matched in the text: longest first, then by id.
        let mut special: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));

        let mut model = model;
        if let Model::Spm(spm) = &mut model {
            for (b, t) in spm.byte_tokens.iter_mut().enumerate() {
                *t = pieces
                    .token(&format!("<0x{b:02X}>"))
                    .or_else(|| {
                        std::str::from_utf8(&[b as u8])
                            .ok()
                            .and_then(|s| pieces.token(s))
                    })
                    .unwrap_or(NONE);
            }
            spm.scores = scores;
            spm.unk = unk;
            spm.split = bpe::splits_before_spaces(texts.iter().map(String::as_str));
        }
        let texts: Vec<Box<str>> = texts.into_iter().map(String::into_boxed_str).collect();
        let (decoded, decoded_ends) = decode_table(&model, &texts, &attrs, escape);

        // Attributes llama.cpp sets by model name (after the caches above).
        let general_name = meta.str("general.name").unwrap_or("").to_lowercase();
        let pre = meta.str("tokenizer.ggml.pre").unwrap_or("");
        let arch = meta.str("general.architecture").unwrap_or("");
        let set = |attrs: &mut Vec<u16>, t: &str, a: u16, on: bool| {
            if let Some(i) = pieces.token(t) {
                let x = &mut attrs[i as usize];
                *x = if on { *x | a } else { *x & !a };
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|a| arch.contains(a))
        {
            set(&mut attrs, "<mask>", attr::LSTRIP, true);
        } else if general_name.contains("phi-3") || general_name.contains("phi3") {
            for &i in &special {
                attrs[i as usize] |= attr::RSTRIP;
            }
            set(&mut attrs, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(&mut attrs, t, attr::RSTRIP, false);
            }
        } else if general_name.contains("modern-bert") {
            set(&mut attrs, "[MASK]", attr::LSTRIP, true);
        }

        let matcher = if special.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::Standard)
                    .build(special.iter().map(|&i| texts[i as usize].as_bytes()))
                    .map_err(|e| err(format!("special tokens: {e}")))?,
            )
        };
        let chat_template = meta.str("tokenizer.chat_template").map(|t| {
            let name = |id: Option<u32>| {
                id.map(|i| texts[i as usize].to_string())
                    .unwrap_or_default()
            };
            ChatTemplate::new(t.to_string(), name(bos), name(eos))
        });
        Ok(Self {
            model,
            texts,
            attrs,
            pieces,
            special: SpecialTokens {
                matcher,
                ids: special,
            },
            decoded,
            decoded_ends,
            bos,
            eos,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            escape_whitespaces: escape,
            chat_template,
        })
    }

    /// `llama` (SentencePiece) or the BPE pre-tokenizer's name.
    pub fn model_name(&self) -> &str {
        match &self.model {
            Model::Spm(_) => "llama",
            Model::Bpe { pre, .. } => &pre.name,
        }
    }

    /// The tokens of `text`, as llama.cpp's `llama_tokenize`: BOS/EOS as the
    /// file says when `add_special`, and control tokens matched in the text
    /// when `parse_special` (user-defined tokens always are).
    pub fn encode_with(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let fragments = self.partition(text, parse_special);
        let mut scratch = Scratch::default();
        let mut buf = String::new();
        let mut words = Vec::new();
        // SentencePiece: a space before the text and after each special token.
        let mut prev_special = true;
        for f in fragments {
            let range = match f {
                Fragment::Token(t) => {
                    out.push(t);
                    prev_special = true;
                    continue;
                }
                Fragment::Text(r) => r,
            };
            let part = &text[range];
            match &self.model {
                Model::Spm(spm) => {
                    buf.clear();
                    if self.add_space_prefix && prev_special {
                        buf.push(' ');
                    }
                    buf.push_str(part);
                    let escaped = buf.replace(' ', "\u{2581}");
                    spm.encode(&self.pieces, &escaped, &mut scratch, &mut out);
                }
                Model::Bpe { pre, bpe } => {
                    let escaped;
                    let part = if self.escape_whitespaces {
                        escaped = part.replace(' ', "\u{2581}");
                        escaped.as_str()
                    } else {
                        part
                    };
                    words.clear();
                    pre.split(part, &mut words);
                    for w in words.drain(..) {
                        bpe.word(&self.pieces, &part[w], &mut scratch, &mut out);
                    }
                }
            }
            prev_special = false;
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits `text` at special tokens as llama.cpp's
    /// `tokenizer_st_partition`: each token, longest first, is cut out of
    /// the text that is left, leftmost occurrence first; `lstrip`/`rstrip`
    /// tokens also take the whitespace beside them. One automaton finds all
    /// occurrences, which are then taken in that order.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        // No text, no fragment: SentencePiece adds no space either.
        if text.is_empty() {
            return Vec::new();
        }
        let whole = || vec![Fragment::Text(0..text.len())];
        let Some(ac) = &self.special.matcher else {
            return whole();
        };
        let ids = &self.special.ids;
        let usable = |pattern: usize| {
            parse_special
                || self.attrs[ids[pattern] as usize] & (attr::CONTROL | attr::UNKNOWN) == 0
        };
        let mut found: Vec<(usize, usize, usize)> = ac
            .find_overlapping_iter(text)
            .filter(|m| usable(m.pattern().as_usize()))
            .map(|m| (m.pattern().as_usize(), m.start(), m.end()))
            .collect();
        if found.is_empty() {
            return whole();
        }
        found.sort_unstable();
        let bytes = text.as_bytes();
        // Bytes taken by a token or stripped beside one.
        let mut taken = vec![false; bytes.len()];
        let mut tokens: Vec<(usize, usize, u32)> = Vec::new();
        for (pattern, start, end) in found {
            if taken[start..end].iter().any(|&t| t) {
                continue;
            }
            let id = ids[pattern];
            taken[start..end].fill(true);
            tokens.push((start, end, id));
            let a = self.attrs[id as usize];
            if a & attr::LSTRIP != 0 {
                let mut i = start;
                while i > 0 && !taken[i - 1] && c_isspace(bytes[i - 1]) {
                    i -= 1;
                    taken[i] = true;
                }
            }
            if a & attr::RSTRIP != 0 {
                let mut i = end;
                while i < bytes.len() && !taken[i] && c_isspace(bytes[i]) {
                    taken[i] = true;
                    i += 1;
                }
            }
        }
        tokens.sort_unstable();
        let mut out = Vec::with_capacity(2 * tokens.len() + 1);
        let push_text = |out: &mut Vec<Fragment>, from: usize, to: usize| {
            // The untaken bytes between two tokens (stripping only takes
            // bytes next to a token).
            let (mut a, mut b) = (from, to);
            while a < b && taken[a] {
                a += 1;
            }
            while b > a && taken[b - 1] {
                b -= 1;
            }
            if a < b {
                out.push(Fragment::Text(a..b));
            }
        };
        let mut pos = 0;
        for (start, end, id) in tokens {
            push_text(&mut out, pos, start);
            out.push(Fragment::Token(id));
            pos = end;
        }
        push_text(&mut out, pos, bytes.len());
        out
    }

    /// The text of one token as the file stores it.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(|t| &**t)
    }
}

/// llama.cpp's end-of-generation set: EOS, EOT, EOM and the FIM pad, repo
/// and file-separator tokens given by `ids` (`[eos, eot, eom]`) and `fim`
/// (pre, suf, mid, pad, rep, sep) or else found by their text, plus every
/// token whose text is in [`EOG_TEXTS`]; sorted. Tokens found by their text
/// become control tokens in `attrs`, and gpt-oss's channel tokens
/// user-defined ones, as llama.cpp makes them in the same pass.
fn end_of_generation(
    texts: &[String],
    pieces: &Pieces,
    attrs: &mut [u16],
    ids: [Option<u32>; 3],
    mut fim: [(Option<u32>, &[&str]); 6],
) -> Vec<u32> {
    let [eos, mut eot, mut eom] = ids;
    // The distinct texts in id order; a duplicated text is its last id
    // (llama.cpp walks an unordered map; where it picks the first match
    // of several, this picks the lowest id).
    let unique: Vec<(usize, &str)> = texts
        .iter()
        .enumerate()
        .filter(|(i, t)| pieces.token(t) == Some(*i as u32))
        .map(|(i, t)| (i, t.as_str()))
        .collect();
    // Special tokens found by their text become control tokens.
    let find = |slot: &mut Option<u32>, names: &[&str], attrs: &mut [u16]| {
        if slot.is_none()
            && let Some(&(i, _)) = unique.iter().find(|(_, t)| names.contains(t))
        {
            *slot = Some(i as u32);
            attrs[i] |= attr::CONTROL;
        }
    };
    find(&mut eot, EOT_TEXTS, attrs);
    find(&mut eom, EOM_TEXTS, attrs);
    for (slot, names) in &mut fim {
        find(slot, names, attrs);
    }
    let mut eog: Vec<u32> = fim[3..].iter().filter_map(|(id, _)| *id).collect();
    for &(i, t) in &unique {
        if EOG_TEXTS.contains(&t) {
            eog.push(i as u32);
            attrs[i] |= attr::CONTROL;
        }
    }
    // gpt-oss renders these (llama.cpp's hack).
    for &(i, t) in &unique {
        if matches!(
            t,
            "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
        ) {
            attrs[i] = attr::USER_DEFINED;
        }
    }
    eog.extend([eos, eot, eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    let eog_with = |t: &str| eog.iter().copied().find(|&i| &*texts[i as usize] == t);
    // o200k_harmony and solar-open: <|end|> ends a message, not the turn.
    let call = eog_with("<|call|>").or(eog_with("<|calls|>")).is_some();
    let end = eog_with("<|end|>");
    let harmony = call && (eog_with("<|return|>").is_some() || eog_with("<|flush|>").is_some());
    // Gemma 4 and PLaMo have a normal </s>.
    let s_normal = eog_with("<|tool_response>")
        .or(eog_with("<|plamo:eos|>"))
        .is_some();
    let s = eog_with("</s>");
    if let (Some(end), true) = (end, harmony) {
        eog.retain(|&i| i != end);
        attrs[end as usize] = attr::USER_DEFINED;
    }
    if let (Some(s), true) = (s, s_normal) {
        eog.retain(|&i| i != s);
        attrs[s as usize] = attr::NORMAL;
    }
    eog
}

/// C's `isspace` in the "C" locale, which llama.cpp's strip uses.
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// What each token decodes to, as llama.cpp's `token_to_piece` with
/// specials: control, unknown and user-defined tokens their text, normal
/// tokens their text with ▁ as space (SentencePiece) or their GPT-2
/// characters as bytes (byte-level BPE), byte tokens their byte, others
/// nothing.
fn decode_table(
    model: &Model,
    texts: &[Box<str>],
    attrs: &[u16],
    escape: bool,
) -> (Vec<u8>, Vec<usize>) {
    let mut from_char = [None::<u8>; 512];
    for (b, c) in bpe::byte_chars().iter().enumerate() {
        if let Some(slot) = from_char.get_mut(*c as usize) {
            *slot = Some(b as u8);
        }
    }
    let mut buf = Vec::with_capacity(texts.iter().map(|t| t.len()).sum());
    let mut ends = Vec::with_capacity(texts.len());
    for (t, &a) in texts.iter().zip(attrs) {
        if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
            buf.extend_from_slice(t.as_bytes());
        } else if a & attr::NORMAL != 0 {
            if matches!(model, Model::Spm(_)) || escape {
                buf.extend_from_slice(t.replace('\u{2581}', " ").as_bytes());
            } else {
                for c in t.chars() {
                    match from_char.get(c as usize).copied().flatten() {
                        Some(b) => buf.push(b),
                        // llama.cpp writes the token's text in brackets.
                        None => {
                            buf.extend_from_slice(b"[UNK_BYTE_0x");
                            let mut u = [0u8; 4];
                            for x in c.encode_utf8(&mut u).bytes() {
                                buf.extend_from_slice(format!("{x:02x}").as_bytes());
                            }
                            buf.extend_from_slice(t.as_bytes());
                            buf.push(b']');
                        }
                    }
                }
            }
        } else if a & attr::BYTE != 0 {
            // `<0xXX>`
            if let Some(b) = t.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                buf.push(b);
            }
        }
        ends.push(buf.len());
    }
    (buf, ends)
}

impl Tokenizer for GgufTokenizer {
    /// Tokenizes as llama.cpp's server tokenizes a prompt: special tokens
    /// in the text are parsed.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        Ok(self.encode_with(text, add_special_tokens, true))
    }

    /// The tokens' pieces joined (llama.cpp's `detokenize` without its
    /// space clean-up, which its server does not apply to generated text
    /// either): the first token loses one leading space where the
    /// tokenizer adds one; control and unknown tokens are dropped when
    /// `skip_special_tokens`.
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (k, &id) in ids.iter().enumerate() {
            let i = id as usize;
            if i >= self.texts.len() {
                return Err(ModelError::Tokenizer(format!(
                    "token id {id} is outside the vocabulary (0..{})",
                    self.texts.len()
                )));
            }
            if skip_special_tokens && self.attrs[i] & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let start = if i == 0 { 0 } else { self.decoded_ends[i - 1] };
            let mut piece = &self.decoded[start..self.decoded_ends[i]];
            if k == 0 && self.add_space_prefix {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
            bytes.extend_from_slice(piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// The pieces `decode` writes; control and unknown tokens marked special.
    fn token_bytes(&self) -> Result<Vec<Vec<u8>>, ModelError> {
        Ok((0..self.texts.len())
            .map(|i| {
                let start = if i == 0 { 0 } else { self.decoded_ends[i - 1] };
                let piece = &self.decoded[start..self.decoded_ends[i]];
                if self.attrs[i] & (attr::CONTROL | attr::UNKNOWN) != 0 {
                    let mut w = Vec::with_capacity(piece.len() + 1);
                    w.push(0xFF);
                    w.extend_from_slice(piece);
                    w
                } else {
                    piece.to_vec()
                }
            })
            .collect())
    }

    /// llama.cpp's end-of-generation set.
    fn eos_token_ids(&self) -> Vec<u32> {
        self.eog.clone()
    }

    fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_ref().map(ChatTemplate::source)
    }

    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        match &self.chat_template {
            Some(t) => t.render(messages, add_generation_prompt),
            None => Ok(default_chat_template(messages, add_generation_prompt)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Metadata of a byte-level BPE vocabulary: `tokens` (all normal unless
    /// `types` says), merges "a b" and "Ġ a", plus `extra` keys.
    fn meta(tokens: &[&str], types: &[i32], extra: &[(&str, Value)]) -> HashMap<String, Value> {
        let strings =
            |v: &[&str]| Value::Array(v.iter().map(|t| Value::String((*t).into())).collect());
        let mut types_all = vec![1; tokens.len()];
        types_all[..types.len()].copy_from_slice(types);
        let mut m: HashMap<String, Value> = [
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("gpt-2".into())),
            ("tokenizer.ggml.tokens", strings(tokens)),
            (
                "tokenizer.ggml.token_type",
                Value::Array(types_all.into_iter().map(Value::I32).collect()),
            ),
            ("tokenizer.ggml.merges", strings(&["a b", "\u{120} a"])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in extra {
            m.insert((*k).to_string(), v.clone());
        }
        m
    }

    fn build(m: &HashMap<String, Value>) -> Result<GgufTokenizer, ModelError> {
        GgufTokenizer::from_meta(&Meta(m))
    }

    const BASE: &[&str] = &["a", "b", "\u{120}", "ab", "\u{120}a", " "];

    #[test]
    fn end_of_turn_tokens_end_generation_by_their_text() {
        let mut toks = BASE.to_vec();
        toks.extend([
            "<|im_start|>",
            "<|im_end|>",
            "<|endoftext|>",
            "<|eom_id|>",
            "<end_of_turn>",
        ]);
        // <|im_end|> is a normal token in the file: llama.cpp makes it control.
        // It is taken for EOT (the first end-of-turn text); <end_of_turn>
        // ends generation by the text rule alone.
        let m = meta(
            &toks,
            &[1, 1, 1, 1, 1, 1, 3, 1],
            &[("tokenizer.ggml.eos_token_id", Value::U32(8))],
        );
        let t = build(&m).unwrap();
        assert_eq!(t.eos_token_ids(), vec![7, 8, 9, 10]);
        assert_eq!(t.attrs[7] & attr::CONTROL, attr::CONTROL);
        // Control tokens are matched in a prompt, and skipped in decoding.
        let ids = t.encode("a<|im_end|>ab", false).unwrap();
        assert_eq!(ids, vec![0, 7, 3]);
        assert_eq!(t.decode(&ids, true).unwrap(), "aab");
        assert_eq!(t.decode(&ids, false).unwrap(), "a<|im_end|>ab");
        // Not parsed when the caller says so (llama.cpp's tests): its
        // characters are not tokens here, so nothing is left.
        assert_eq!(t.encode_with("<|im_end|>", false, false), Vec::<u32>::new());
    }

    #[test]
    fn eot_and_eom_ids_from_the_metadata_end_generation() {
        let mut toks = BASE.to_vec();
        toks.extend(["<stop_a>", "<stop_b>"]);
        let m = meta(
            &toks,
            &[],
            &[
                ("tokenizer.ggml.eos_token_id", Value::U32(0)),
                ("tokenizer.ggml.eot_token_id", Value::U32(6)),
                ("tokenizer.ggml.eom_token_id", Value::U32(7)),
            ],
        );
        assert_eq!(build(&m).unwrap().eos_token_ids(), vec![0, 6, 7]);
    }

    #[test]
    fn harmony_end_is_not_an_end_of_generation() {
        let mut toks = BASE.to_vec();
        toks.extend(["<|end|>", "<|return|>", "<|call|>"]);
        let t = build(&meta(&toks, &[], &[])).unwrap();
        // No EOS in the file: the BPE default (11) is outside this vocabulary.
        assert_eq!(t.eos_token_ids(), vec![7, 8]);
        let mut toks = BASE.to_vec();
        toks.push("<|end|>");
        assert_eq!(
            build(&meta(&toks, &[], &[])).unwrap().eos_token_ids(),
            vec![6]
        );
    }

    #[test]
    fn rstrip_tokens_take_the_whitespace_after_them() {
        // Phi-3 (by general.name): special tokens take the whitespace after them.
        let mut toks = BASE.to_vec();
        toks.push("<|user|>");
        let m = meta(
            &toks,
            &[1, 1, 1, 1, 1, 1, 3],
            &[("general.name", Value::String("Phi3".into()))],
        );
        let t = build(&m).unwrap();
        assert_eq!(t.encode("<|user|>  \n a", false).unwrap(), vec![6, 0]);
        let m = meta(&toks, &[1, 1, 1, 1, 1, 1, 3], &[]);
        let t = build(&m).unwrap();
        // Without rstrip the spaces stay text: "  \n" then " a" (the newline
        // has no token here).
        assert_eq!(t.encode("<|user|>  \n a", false).unwrap(), vec![6, 2, 2, 4]);
    }

    #[test]
    fn the_longest_special_token_is_cut_first() {
        let mut toks = BASE.to_vec();
        toks.extend(["<x>", "a<x>b"]);
        let t = build(&meta(&toks, &[1, 1, 1, 1, 1, 1, 4, 4], &[])).unwrap();
        assert_eq!(t.encode_with("aa<x>bb", false, false), vec![0, 7, 1]);
        assert_eq!(t.encode_with("<x>a<x>", false, false), vec![6, 0, 6]);
    }

    #[test]
    fn bad_metadata_is_a_clear_error() {
        let mut m = meta(BASE, &[], &[]);
        m.insert(
            "tokenizer.ggml.pre".into(),
            Value::String("brand-new".into()),
        );
        let e = build(&m).unwrap_err().to_string();
        assert!(e.contains("\"brand-new\"") && e.contains("qwen2"), "{e}");
        m.insert("tokenizer.ggml.model".into(), Value::String("bert".into()));
        let e = build(&m).unwrap_err().to_string();
        assert!(e.contains("\"bert\"") && e.contains("gpt2"), "{e}");
        let mut m = meta(BASE, &[], &[]);
        m.remove("tokenizer.ggml.merges");
        let e = build(&m).unwrap_err().to_string();
        assert!(e.contains("tokenizer.ggml.merges"), "{e}");
        let m = meta(
            BASE,
            &[],
            &[("tokenizer.ggml.add_bos_token", Value::Bool(true))],
        );
        let e = build(&m).unwrap_err().to_string();
        assert!(e.contains("BOS"), "{e}");
        let t = build(&meta(BASE, &[], &[])).unwrap();
        assert!(t.decode(&[99], false).is_err());
    }
}
