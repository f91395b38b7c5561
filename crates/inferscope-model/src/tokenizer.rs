//! Tokenizers: the byte-level one of the demo model, Hugging Face
//! `tokenizer.json`, and incremental detokenization for streaming.

use std::path::Path;
use std::sync::Arc;

pub use crate::chat_template::ChatMessage;
use crate::chat_template::{ChatInput, ChatTemplate};
use crate::error::ModelError;

/// Text to token ids and back.
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text`, with BOS and the like when `add_special_tokens`.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError>;
    /// Text of `ids`; invalid UTF-8 becomes U+FFFD.
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError>;
    /// [`Tokenizer::decode`] appended to `out` (a tokenizer that can decode
    /// without a string of its own saves an allocation per call: the
    /// incremental decoder calls this twice per generated token). On an
    /// error `out` may hold part of the text.
    fn decode_into(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
        out: &mut String,
    ) -> Result<(), ModelError> {
        out.push_str(&self.decode(ids, skip_special_tokens)?);
        Ok(())
    }
    /// The ASCII character `id` decodes to wherever it stands: decoding any
    /// ids followed by `id` gives their text followed by this character.
    /// `None` (the default) where that is not so or not known (a
    /// tokenizer that cleans up spaces, or strips a leading one, decodes a
    /// token by its neighbours); the incremental decoder then decodes as
    /// usual, twice per token.
    fn ascii_char(&self, id: u32) -> Option<u8> {
        let _ = id;
        None
    }
    /// Number of token ids, specials included.
    fn vocab_size(&self) -> usize;
    /// What each token id decodes to, as bytes, for grammar masks
    /// (structured outputs): special tokens start with `0xFF`
    /// (llguidance's marker), so no grammar matches them as text; ids
    /// without text are empty.
    fn token_bytes(&self) -> Result<Vec<Vec<u8>>, ModelError>;
    /// Token ids that end generation.
    fn eos_token_ids(&self) -> Vec<u32>;
    /// The beginning-of-sequence token, if the vocabulary has one.
    fn bos_token_id(&self) -> Option<u32>;
    /// What kind of tokenizer this is (`tokenizer_class` of `/tokenizer_info`):
    /// the implementing type's name.
    fn tokenizer_class(&self) -> &'static str {
        let full = std::any::type_name::<Self>();
        full.rsplit("::").next().unwrap_or(full)
    }
    /// The model's chat template (Jinja source), when it has one; the plain
    /// default template is not one.
    fn chat_template_source(&self) -> Option<&str> {
        None
    }
    /// Renders plain `{role, content}` messages into a prompt.
    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        self.render_chat(&ChatInput::from_messages(messages, add_generation_prompt))
    }
    /// Renders a conversation, with tools and extra template arguments,
    /// into a prompt (the plain template when there is no chat template).
    /// The prompt already holds the special tokens the template writes:
    /// encode it without adding them again.
    fn render_chat(&self, input: &ChatInput) -> Result<String, ModelError> {
        Ok(default_chat_template(
            &input.plain_messages(),
            input.add_generation_prompt,
        ))
    }
}

/// A plain template for models without one we can run:
/// `<|role|>\ncontent\n` per message, then `<|assistant|>\n`.
pub fn default_chat_template(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|");
        out.push_str(&m.role);
        out.push_str("|>\n");
        out.push_str(&m.content);
        out.push('\n');
    }
    if add_generation_prompt {
        out.push_str("<|assistant|>\n");
    }
    out
}

/// Byte-level vocabulary: ids 0..=255 are bytes, then BOS and EOS.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// The BOS token id.
    pub const BOS: u32 = 256;
    /// The EOS token id.
    pub const EOS: u32 = 257;
    /// Number of ids.
    pub const VOCAB_SIZE: usize = 258;
}

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        let mut ids = Vec::with_capacity(text.len() + 1);
        if add_special_tokens {
            ids.push(Self::BOS);
        }
        ids.extend(text.bytes().map(u32::from));
        Ok(ids)
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        let mut out = String::with_capacity(ids.len());
        self.decode_into(ids, skip_special_tokens, &mut out)?;
        Ok(out)
    }

    fn decode_into(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
        out: &mut String,
    ) -> Result<(), ModelError> {
        let mut bytes = std::mem::take(out).into_bytes();
        let start = bytes.len();
        let mut result = Ok(());
        for &id in ids {
            match id {
                0..=255 => bytes.push(id as u8),
                Self::BOS if !skip_special_tokens => bytes.extend_from_slice(b"<s>"),
                Self::EOS if !skip_special_tokens => bytes.extend_from_slice(b"</s>"),
                Self::BOS | Self::EOS => {}
                _ => {
                    result = Err(ModelError::Tokenizer(format!(
                        "token id {id} is outside the byte vocabulary (0..{})",
                        Self::VOCAB_SIZE
                    )));
                    bytes.truncate(start);
                    break;
                }
            }
        }
        // ASCII, the usual text, in one cheap pass: an incremental decoder
        // calls this twice per token on a few bytes, where `from_utf8`'s
        // setup cost more than the rest of the decode.
        if bytes[start..].is_ascii() {
            // SAFETY: the bytes before `start` are the `String` taken from
            // `out` (UTF-8, ending on a character boundary); the rest is ASCII.
            *out = unsafe { String::from_utf8_unchecked(bytes) };
            return result;
        }
        // The bytes before `start` were a string already; the new ones are
        // checked, and replaced lossily (a copy) only when not UTF-8.
        *out = match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => {
                let mut bytes = e.into_bytes();
                let tail = String::from_utf8_lossy(&bytes[start..]).into_owned();
                bytes.truncate(start);
                let mut s = String::from_utf8(bytes).expect("the bytes before start were a string");
                s.push_str(&tail);
                s
            }
        };
        result
    }

    /// A byte below 128 is its character, whatever comes before it: an
    /// unfinished character before it decodes to U+FFFD either way.
    fn ascii_char(&self, id: u32) -> Option<u8> {
        u8::try_from(id).ok().filter(u8::is_ascii)
    }

    fn vocab_size(&self) -> usize {
        Self::VOCAB_SIZE
    }

    fn token_bytes(&self) -> Result<Vec<Vec<u8>>, ModelError> {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"\xFF<s>".to_vec());
        words.push(b"\xFF</s>".to_vec());
        Ok(words)
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        vec![Self::EOS]
    }

    fn bos_token_id(&self) -> Option<u32> {
        Some(Self::BOS)
    }
}

/// A Hugging Face `tokenizer.json` (pure Rust, no C dependencies).
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    eos: Vec<u32>,
    bos: Option<u32>,
    chat_template: Option<ChatTemplate>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos", &self.eos)
            .field("bos", &self.bos)
            .finish()
    }
}

impl HfTokenizer {
    /// Loads `tokenizer.json`; EOS and BOS come from the caller (config.json,
    /// tokenizer_config.json) and else from well-known token names.
    pub fn from_file(path: &Path, eos: Vec<u32>, bos: Option<u32>) -> Result<Self, ModelError> {
        if !path.is_file() {
            return Err(ModelError::MissingFile(path.to_path_buf()));
        }
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self::from_inner(inner, eos, bos))
    }

    /// Wraps an already parsed tokenizer.
    pub fn from_inner(inner: tokenizers::Tokenizer, eos: Vec<u32>, bos: Option<u32>) -> Self {
        let mut eos = eos;
        if eos.is_empty() {
            for name in [
                "</s>",
                "<|endoftext|>",
                "<|end_of_text|>",
                "<|eot_id|>",
                "<|im_end|>",
            ] {
                if let Some(id) = inner.token_to_id(name) {
                    eos.push(id);
                }
            }
        }
        let bos = bos.or_else(|| {
            ["<s>", "<|begin_of_text|>"]
                .iter()
                .find_map(|n| inner.token_to_id(n))
        });
        Self {
            inner,
            eos,
            bos,
            chat_template: None,
        }
    }

    /// Uses `template` for [`Tokenizer::apply_chat_template`].
    pub fn with_chat_template(mut self, template: Option<ChatTemplate>) -> Self {
        // Completions still work: say now why every chat request will fail.
        if let Some(Err(e)) = template.as_ref().map(ChatTemplate::check) {
            tracing::warn!("the model's chat template cannot be used: {e}");
        }
        self.chat_template = template;
        self
    }

    /// The id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Read from the tokenizer's JSON by llguidance (byte-level BPE and
    /// byte-fallback models), so the bytes are exactly the ones llguidance
    /// expects.
    fn token_bytes(&self) -> Result<Vec<Vec<u8>>, ModelError> {
        let json = self
            .inner
            .to_string(false)
            .map_err(|e| ModelError::Tokenizer(format!("cannot serialise the tokenizer: {e}")))?;
        let value: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| ModelError::Tokenizer(format!("cannot read the tokenizer: {e}")))?;
        // llguidance asserts on vocabularies it does not expect: a panic
        // there means this tokenizer gets no structured outputs, not a crash.
        let words =
            std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&value))
                .map_err(|_| {
                    ModelError::Tokenizer("llguidance cannot read this vocabulary".into())
                })?
                .map_err(|e| ModelError::Tokenizer(format!("the vocabulary's bytes: {e}")))?;
        let mut words = words;
        words.resize(words.len().max(self.vocab_size()), Vec::new());
        Ok(words)
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_ref().map(ChatTemplate::source)
    }

    fn render_chat(&self, input: &ChatInput) -> Result<String, ModelError> {
        match &self.chat_template {
            Some(t) => t.render_input(input),
            None => Ok(default_chat_template(
                &input.plain_messages(),
                input.add_generation_prompt,
            )),
        }
    }
}

/// A tokenizer whose chat template is replaced (`--chat-template`).
pub struct WithChatTemplate {
    inner: Arc<dyn Tokenizer>,
    template: ChatTemplate,
}

impl WithChatTemplate {
    /// `inner` rendering chats with `source`; the special-token strings are
    /// those of `inner`'s BOS and first EOS id.
    pub fn new(inner: Arc<dyn Tokenizer>, source: String) -> Result<Self, ModelError> {
        let name = |id: Option<u32>| {
            id.and_then(|id| inner.decode(&[id], false).ok())
                .unwrap_or_default()
        };
        let bos = name(inner.bos_token_id());
        let eos = name(inner.eos_token_ids().first().copied());
        let template = ChatTemplate::parse(source, bos, eos)?;
        Ok(Self { inner, template })
    }
}

impl Tokenizer for WithChatTemplate {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        self.inner.encode(text, add_special_tokens)
    }
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        self.inner.decode(ids, skip_special_tokens)
    }
    fn decode_into(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
        out: &mut String,
    ) -> Result<(), ModelError> {
        self.inner.decode_into(ids, skip_special_tokens, out)
    }
    fn ascii_char(&self, id: u32) -> Option<u8> {
        self.inner.ascii_char(id)
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn token_bytes(&self) -> Result<Vec<Vec<u8>>, ModelError> {
        self.inner.token_bytes()
    }
    fn eos_token_ids(&self) -> Vec<u32> {
        self.inner.eos_token_ids()
    }
    fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos_token_id()
    }
    fn tokenizer_class(&self) -> &'static str {
        self.inner.tokenizer_class()
    }
    fn chat_template_source(&self) -> Option<&str> {
        Some(self.template.source())
    }
    fn render_chat(&self, input: &ChatInput) -> Result<String, ModelError> {
        self.template.render_input(input)
    }
}

/// Context tokens of the prompt kept so that the first generated token
/// decodes with the right leading space (SentencePiece, byte-level BPE).
const PROMPT_CONTEXT: usize = 5;

/// Turns a stream of token ids into text deltas.
///
/// Decoding token by token breaks multi-byte characters and the spacing
/// rules of SentencePiece tokenizers, so it decodes a sliding window and
/// emits only the text that is complete.
pub struct IncrementalDecoder {
    tokenizer: Arc<dyn Tokenizer>,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
    /// The two decodes of each push, kept: no allocation per token.
    prefix: String,
    full: String,
}

impl IncrementalDecoder {
    /// A decoder whose first tokens follow `prompt_ids`.
    pub fn new(tokenizer: Arc<dyn Tokenizer>, prompt_ids: &[u32]) -> Self {
        let ctx = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT)..];
        let mut ids = Vec::with_capacity(ctx.len() + 64);
        ids.extend_from_slice(ctx);
        Self {
            tokenizer,
            ids,
            prefix_offset: 0,
            read_offset: ctx.len(),
            skip_special_tokens: true,
            prefix: String::new(),
            full: String::new(),
        }
    }

    /// Whether special tokens are left out of the text (the default) or
    /// decoded (`skip_special_tokens: false`).
    pub fn with_skip_special_tokens(mut self, skip: bool) -> Self {
        self.skip_special_tokens = skip;
        self
    }

    /// Adds one token; returns the text it completes (maybe empty).
    pub fn push(&mut self, token: u32) -> Result<String, ModelError> {
        let mut text = String::new();
        self.push_into(token, &mut text)?;
        Ok(text)
    }

    /// Adds one token; appends the text it completes (maybe none) to
    /// `out`, which is left as it was on an error.
    pub fn push_into(&mut self, token: u32, out: &mut String) -> Result<(), ModelError> {
        // Nothing held back and a token that is one ASCII character wherever
        // it stands: the two decodes below would differ by that character.
        if self.read_offset == self.ids.len()
            && let Some(c) = self.tokenizer.ascii_char(token)
        {
            self.ids.push(token);
            out.push(char::from(c));
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return Ok(());
        }
        self.ids.push(token);
        let (tok, skip) = (&self.tokenizer, self.skip_special_tokens);
        self.prefix.clear();
        tok.decode_into(
            &self.ids[self.prefix_offset..self.read_offset],
            skip,
            &mut self.prefix,
        )?;
        self.full.clear();
        tok.decode_into(&self.ids[self.prefix_offset..], skip, &mut self.full)?;
        let (prefix, full) = (&self.prefix, &self.full);
        // A trailing U+FFFD means the last token ends inside a character:
        // wait for the rest.
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            // The delta is the tail.
            out.push_str(&full[prefix.len()..]);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
        Ok(())
    }

    /// Flushes what was held back (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        if self.read_offset >= self.ids.len() {
            return String::new();
        }
        let prefix = self
            .tokenizer
            .decode(
                &self.ids[self.prefix_offset..self.read_offset],
                self.skip_special_tokens,
            )
            .unwrap_or_default();
        let full = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)
            .unwrap_or_default();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        full.get(prefix.len()..).unwrap_or_default().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_class_and_chat_template_source() {
        assert_eq!(ByteTokenizer.tokenizer_class(), "ByteTokenizer");
        assert_eq!(ByteTokenizer.chat_template_source(), None);
        let with = WithChatTemplate::new(Arc::new(ByteTokenizer), "{{ bos_token }}".into())
            .expect("a template");
        // The replaced template is reported, the class stays the inner one's.
        assert_eq!(with.tokenizer_class(), "ByteTokenizer");
        assert_eq!(with.chat_template_source(), Some("{{ bos_token }}"));
    }

    #[test]
    fn byte_tokenizer_round_trips() {
        let t = ByteTokenizer;
        let ids = t.encode("héllo", true).unwrap();
        assert_eq!(ids[0], ByteTokenizer::BOS);
        assert_eq!(ids.len(), 1 + "héllo".len());
        assert_eq!(t.decode(&ids, true).unwrap(), "héllo");
        assert_eq!(t.decode(&ids, false).unwrap(), "<s>héllo");
        assert!(t.decode(&[999], true).is_err());
    }

    #[test]
    fn incremental_decoder_holds_back_partial_utf8() {
        let t: Arc<dyn Tokenizer> = Arc::new(ByteTokenizer);
        let mut d = IncrementalDecoder::new(t.clone(), &t.encode("say: ", true).unwrap());
        let mut out = String::new();
        let text = "a€b😀";
        let mut deltas = Vec::new();
        for id in t.encode(text, false).unwrap() {
            let delta = d.push(id).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "{delta:?}");
            deltas.push(delta.clone());
            out.push_str(&delta);
        }
        out.push_str(&d.finish());
        assert_eq!(out, text);
        // "€" is 3 bytes: the first two pushes of it produce nothing.
        assert_eq!(deltas[1], "");
        assert_eq!(deltas[3], "€");
    }

    #[test]
    fn byte_decode_into_appends_as_decode_gives() {
        let t = ByteTokenizer;
        let cases: [&[u32]; 4] = [
            &[0x61, 0xE2, 0x82, 0xAC],
            // A lone continuation byte and a cut character: U+FFFD each.
            &[0x62, 0x82, 0x63, 0xF0, 0x9F],
            &[ByteTokenizer::BOS, 0x64, ByteTokenizer::EOS],
            &[],
        ];
        // After text that is ASCII or not: only the new bytes decide
        // whether they are checked as ASCII or as UTF-8.
        for ids in cases {
            for (skip, before) in [true, false]
                .into_iter()
                .flat_map(|s| [(s, "é:"), (s, "a:")])
            {
                let mut out = String::from(before);
                t.decode_into(ids, skip, &mut out).unwrap();
                assert_eq!(
                    out,
                    format!("{before}{}", t.decode(ids, skip).unwrap()),
                    "{ids:?}"
                );
            }
        }
        assert_eq!(t.decode(&[0x62, 0x82, 0x63], true).unwrap(), "b\u{FFFD}c");
        // An id outside the vocabulary: an error, and `out` as it was.
        let mut out = String::from("kept");
        assert!(t.decode_into(&[0x61, 999], true, &mut out).is_err());
        assert_eq!(out, "kept");
    }

    /// The byte tokenizer with its ASCII characters not declared: the
    /// incremental decoder takes its two-decode path for every token.
    struct TwoDecodes;

    impl Tokenizer for TwoDecodes {
        fn encode(&self, text: &str, add: bool) -> Result<Vec<u32>, ModelError> {
            ByteTokenizer.encode(text, add)
        }
        fn decode(&self, ids: &[u32], skip: bool) -> Result<String, ModelError> {
            ByteTokenizer.decode(ids, skip)
        }
        fn vocab_size(&self) -> usize {
            ByteTokenizer::VOCAB_SIZE
        }
        fn token_bytes(&self) -> Result<Vec<Vec<u8>>, ModelError> {
            ByteTokenizer.token_bytes()
        }
        fn eos_token_ids(&self) -> Vec<u32> {
            ByteTokenizer.eos_token_ids()
        }
        fn bos_token_id(&self) -> Option<u32> {
            ByteTokenizer.bos_token_id()
        }
    }

    #[test]
    fn ascii_tokens_give_the_deltas_of_two_decodes() {
        // Sequences mixing ASCII, characters of 2-4 bytes, cut and invalid
        // bytes, and specials: every push gives the same delta with and
        // without the ASCII path, and so does the flush.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let pieces: [&[u32]; 9] = [
            &[0x61],
            &[0x20],
            &[0xC3, 0xA9],
            &[0xE2, 0x82, 0xAC],
            &[0xF0, 0x9F, 0x98, 0x80],
            &[0xE2, 0x82],
            &[0x82],
            &[0xFF],
            &[ByteTokenizer::BOS, ByteTokenizer::EOS],
        ];
        let fast: Arc<dyn Tokenizer> = Arc::new(ByteTokenizer);
        let slow: Arc<dyn Tokenizer> = Arc::new(TwoDecodes);
        let mut ascii_pushes = 0;
        for case in 0..500 {
            let ids: Vec<u32> = (0..next() % 24)
                .flat_map(|_| {
                    pieces[(next() % pieces.len() as u64) as usize]
                        .iter()
                        .copied()
                })
                .collect();
            let prompt = &ids[..ids.len() / 3];
            let skip = case % 2 == 0;
            let mut a =
                IncrementalDecoder::new(fast.clone(), prompt).with_skip_special_tokens(skip);
            let mut b =
                IncrementalDecoder::new(slow.clone(), prompt).with_skip_special_tokens(skip);
            for &id in &ids[prompt.len()..] {
                ascii_pushes += usize::from(id < 0x80);
                assert_eq!(a.push(id).unwrap(), b.push(id).unwrap(), "{ids:?} at {id}");
            }
            assert_eq!(a.finish(), b.finish(), "{ids:?}");
        }
        assert!(ascii_pushes > 500, "{ascii_pushes}");
    }

    #[test]
    fn incremental_decoder_skips_specials_and_flushes() {
        let t: Arc<dyn Tokenizer> = Arc::new(ByteTokenizer);
        let mut d = IncrementalDecoder::new(t, &[]);
        assert_eq!(d.push(u32::from(b'x')).unwrap(), "x");
        assert_eq!(d.push(ByteTokenizer::EOS).unwrap(), "");
        assert_eq!(d.push(0xE2).unwrap(), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert_eq!(d.finish(), "");
    }
}
