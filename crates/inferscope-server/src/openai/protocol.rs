//! The OpenAI request and response shapes this server reads and writes.
//!
//! Requests tolerate unknown fields and `null` for every optional one (the
//! official clients send both). The fields here are honoured; the known
//! fields that are not are refused by [`super::refusals`]. Numbers that must be positive are read as
//! signed so that a negative value gets a message naming the field rather
//! than a type error.

use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct};
use serde::{Deserialize, Serialize, Serializer};

use crate::openai::tool_parsers::{ToolCall, ToolCallChunk};

/// `prompt` of a completion request.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// Several text prompts (a batch).
    Texts(Vec<String>),
    /// One tokenized prompt.
    Tokens(Vec<i64>),
    /// Several tokenized prompts.
    TokenLists(Vec<Vec<i64>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl StopInput {
    /// The stop strings, empty ones dropped.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with usage and empty `choices`.
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// vLLM: usage on every chunk (refused when true).
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// Sampling fields shared by completions and chat. Read from the same
/// body fields as the endpoint's own (`super::body::Fields`), not with
/// `#[serde(flatten)]`: flatten buffers the whole body as generic values
/// first, which for a long token list costs several times the body's size.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    /// Softmax temperature.
    pub temperature: Option<f64>,
    /// Nucleus mass.
    pub top_p: Option<f64>,
    /// Top-k (-1 or 0: off).
    pub top_k: Option<i64>,
    /// Seed.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<StopInput>,
    /// Stop token ids (vLLM extension).
    pub stop_token_ids: Option<Vec<i64>>,
    /// Only these token ids may be sampled (vLLM extension).
    pub allowed_token_ids: Option<Vec<i64>>,
    /// Choices per prompt.
    pub n: Option<i64>,
    /// Stream over SSE.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Keep going past EOS (vLLM extension).
    pub ignore_eos: Option<bool>,
    /// Minimum tokens before EOS may stop (vLLM extension).
    pub min_tokens: Option<i64>,
    /// vLLM's repetition penalty over prompt and output tokens (> 0).
    pub repetition_penalty: Option<f64>,
    /// Penalty for a token the output holds, in [-2, 2].
    pub presence_penalty: Option<f64>,
    /// Penalty per occurrence in the output, in [-2, 2].
    pub frequency_penalty: Option<f64>,
    /// Minimum probability relative to the most likely token, in [0, 1]
    /// (vLLM extension).
    pub min_p: Option<f64>,
    /// Token id (a decimal string) to a bias in [-100, 100] added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Words the output must not contain (vLLM extension): a list of
    /// strings, checked and tokenized in validation.
    pub bad_words: Option<serde_json::Value>,
    /// Candidates to sample per choice: only `n` (or absent) is supported.
    pub best_of: Option<i64>,
    /// Leave special tokens out of the text (vLLM extension; default true).
    pub skip_special_tokens: Option<bool>,
    /// Keep the stop string that ended a choice in its text (vLLM extension).
    pub include_stop_str_in_output: Option<bool>,
    /// An end-user id: accepted, changes nothing.
    pub user: Option<serde_json::Value>,
    /// Key-value tags: accepted, changes nothing.
    pub metadata: Option<serde_json::Value>,
    /// OpenAI's stored completions: accepted, nothing is stored.
    pub store: Option<serde_json::Value>,
    /// `false`: at most one tool call is returned.
    pub parallel_tool_calls: Option<serde_json::Value>,
    /// Return the request's timings as `metrics` (vLLM extension; needs
    /// `--enable-per-request-metrics`).
    pub include_metrics: Option<bool>,
    /// Log-probabilities of each prompt token plus this many most likely
    /// (vLLM extension; -1: the whole vocabulary).
    pub prompt_logprobs: Option<i64>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The served model name.
    pub model: Option<String>,
    /// The prompt(s).
    pub prompt: Option<PromptInput>,
    /// Tokens to generate (default 16).
    pub max_tokens: Option<i64>,
    /// Put the prompt text before each choice's completion.
    pub echo: Option<bool>,
    /// Log-probabilities of each token plus this many most likely (a
    /// number; `false` and `null` ask for none).
    pub logprobs: Option<serde_json::Value>,
    /// Add the tokenizer's special tokens (BOS) to a text prompt (default true).
    pub add_special_tokens: Option<bool>,
}

/// A chat message's content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ChatContent {
    /// Plain text.
    Text(String),
    /// `[{type: "text", text}]` parts.
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part message.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type; only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The content (may be null for assistant tool calls).
    pub content: Option<ChatContent>,
    /// The participant's name (passed to the template).
    pub name: Option<String>,
    /// `tool` messages: the call this answers.
    pub tool_call_id: Option<String>,
    /// `assistant` messages: the calls made (read as template values,
    /// so that keys keep their order).
    pub tool_calls: Option<inferscope_model::chat_template::Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The served model name.
    pub model: Option<String>,
    /// The conversation.
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Tokens to generate (newer name).
    pub max_completion_tokens: Option<i64>,
    /// Tokens to generate (older name).
    pub max_tokens: Option<i64>,
    /// End the rendering with the assistant's turn (vLLM extension; default true).
    pub add_generation_prompt: Option<bool>,
    /// Return each generated token's log-probability.
    pub logprobs: Option<bool>,
    /// With `logprobs`: this many most likely tokens per position.
    pub top_logprobs: Option<i64>,
    /// Add the tokenizer's special tokens to the rendered text (vLLM
    /// extension; default true here, false in vLLM).
    pub add_special_tokens: Option<bool>,
    /// Functions the model may call (passed to the chat template).
    pub tools: Option<inferscope_model::chat_template::Value>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<inferscope_model::chat_template::Value>,
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens (over all prompts).
    pub prompt_tokens: usize,
    /// Generated tokens (over all choices).
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

/// A completion choice (full response) or chunk choice (stream).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice<'a> {
    /// Choice index.
    pub index: usize,
    /// Text (the delta, in a stream).
    pub text: &'a str,
    /// The tokens' log-probabilities when asked for (`logprobs`), else null.
    pub logprobs: Option<CompletionLogprobs<'a>>,
    /// Set on the last chunk of a choice.
    pub finish_reason: Option<&'a str>,
    /// vLLM's `prompt_logprobs`, only when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobsJson<'a>>,
}

/// OpenAI's smallest log-probability: -inf (a masked token) is reported as
/// this, as vLLM does (JSON has no infinity).
const MIN_LOGPROB: f32 = -9999.0;

fn clamp(l: f32) -> f32 {
    if l.is_nan() {
        MIN_LOGPROB
    } else {
        l.max(MIN_LOGPROB)
    }
}

/// A completion choice's `logprobs`: `text_offset`, `token_logprobs`,
/// `tokens` and `top_logprobs` (each a map of up to `top` + 1 tokens: the
/// token itself and the `top` most likely, as vLLM).
#[derive(Debug, Clone, Copy)]
pub struct CompletionLogprobs<'a> {
    /// The tokens.
    pub tokens: &'a [TokenLogprob],
    /// The request's `logprobs`.
    pub top: usize,
    /// Offset of the first token's text in the choice's text.
    pub first_offset: usize,
}

impl Serialize for CompletionLogprobs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Characters, as vLLM counts them (Python's `len`).
        let offsets = self.tokens.iter().scan(self.first_offset, |offset, t| {
            let o = *offset;
            *offset += t.token.chars().count();
            Some(o)
        });
        let mut st = s.serialize_struct("Logprobs", 4)?;
        st.serialize_field("text_offset", &Seq(offsets))?;
        st.serialize_field(
            "token_logprobs",
            &Seq(self.tokens.iter().map(|t| t.logprob.map(clamp))),
        )?;
        st.serialize_field("tokens", &Seq(self.tokens.iter().map(|t| t.token.as_str())))?;
        let top = self.top;
        st.serialize_field(
            "top_logprobs",
            &Seq(self.tokens.iter().map(|t| {
                t.logprob.map(|_| TopMap {
                    entries: &t.top[..t.top.len().min(top + 1)],
                })
            })),
        )?;
        st.end()
    }
}

/// A sequence serialised from an iterator (no intermediate vector).
struct Seq<I>(I);

impl<I> Serialize for Seq<I>
where
    I: Iterator + Clone,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        for item in self.0.clone() {
            seq.serialize_element(&item)?;
        }
        seq.end()
    }
}

/// Token text to log-probability; a text seen twice keeps its first value.
struct TopMap<'a> {
    entries: &'a [RankedLogprob],
}

impl Serialize for TopMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        for (i, e) in self.entries.iter().enumerate() {
            if self.entries[..i].iter().all(|p| p.text != e.text) {
                m.serialize_entry(&e.text, &clamp(e.logprob))?;
            }
        }
        m.end()
    }
}

/// A chat choice's `logprobs`: `content`, one entry per token with its
/// `top_logprobs` (the first `top` of vLLM's order: the token, then the
/// most likely others).
#[derive(Debug, Clone, Copy)]
pub struct ChatLogprobs<'a> {
    /// The tokens.
    pub tokens: &'a [TokenLogprob],
    /// The request's `top_logprobs`.
    pub top: usize,
}

impl Serialize for ChatLogprobs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let top = self.top;
        let mut st = s.serialize_struct("ChoiceLogprobs", 1)?;
        st.serialize_field(
            "content",
            &Seq(self.tokens.iter().map(move |t| ChatTokenLogprob { t, top })),
        )?;
        st.end()
    }
}

#[derive(Clone, Copy)]
struct ChatTokenLogprob<'a> {
    t: &'a TokenLogprob,
    top: usize,
}

impl Serialize for ChatTokenLogprob<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("ChatCompletionTokenLogprob", 4)?;
        st.serialize_field("token", &self.t.token)?;
        st.serialize_field("logprob", &clamp(self.t.logprob.unwrap_or(MIN_LOGPROB)))?;
        st.serialize_field("bytes", self.t.token.as_bytes())?;
        let n = self.t.top.len().min(self.top);
        st.serialize_field(
            "top_logprobs",
            &Seq(self.t.top[..n].iter().map(|e| ChatTopLogprob { e })),
        )?;
        st.end()
    }
}

#[derive(Clone, Copy)]
struct ChatTopLogprob<'a> {
    e: &'a RankedLogprob,
}

impl Serialize for ChatTopLogprob<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("TopLogprob", 3)?;
        st.serialize_field("token", &self.e.text)?;
        st.serialize_field("logprob", &clamp(self.e.logprob))?;
        st.serialize_field("bytes", self.e.text.as_bytes())?;
        st.end()
    }
}

/// vLLM's `prompt_logprobs`: per prompt position null (the first) or a map
/// from token id to `{logprob, rank, decoded_token}`.
#[derive(Debug, Clone, Copy)]
pub struct PromptLogprobsJson<'a>(pub &'a [Option<Vec<RankedLogprob>>]);

impl Serialize for PromptLogprobsJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for p in self.0 {
            seq.serialize_element(&p.as_deref().map(PromptPosition))?;
        }
        seq.end()
    }
}

struct PromptPosition<'a>(&'a [RankedLogprob]);

impl Serialize for PromptPosition<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        for (i, e) in self.0.iter().enumerate() {
            if self.0[..i].iter().all(|p| p.token_id != e.token_id) {
                m.serialize_entry(&e.token_id.to_string(), &PromptEntry { e })?;
            }
        }
        m.end()
    }
}

struct PromptEntry<'a> {
    e: &'a RankedLogprob,
}

impl Serialize for PromptEntry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Logprob", 3)?;
        st.serialize_field("logprob", &clamp(self.e.logprob))?;
        st.serialize_field("rank", &self.e.rank)?;
        st.serialize_field("decoded_token", &self.e.text)?;
        st.end()
    }
}

/// A completion or chat response, or one stream chunk: the envelope both
/// APIs share around their own choice type `C`.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseBody<'a, C> {
    /// Response id.
    pub id: &'a str,
    /// `text_completion`, `chat.completion` or `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: &'a str,
    /// Choices (empty in the usage chunk).
    pub choices: &'a [C],
    /// Token counts (full response, usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The request's timings, when it asked (full response, final chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<crate::timings::ResponseMetrics>,
    /// Chat: vLLM's `prompt_logprobs`, only when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobsJson<'a>>,
}

/// A stream delta.
#[derive(Debug, Clone, Serialize)]
pub struct ChatDelta<'a> {
    /// `assistant` on the first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// Text, when there is some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    /// Tool-call deltas, when there are some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallChunk<'a>>>,
}

/// The assistant message of a full response.
#[derive(Debug, Clone, Serialize)]
pub struct ChatMessageOut<'a> {
    /// Always `assistant`.
    pub role: &'static str,
    /// The text (null when the model only called tools).
    pub content: Option<&'a str>,
    /// The calls the model made.
    #[serde(skip_serializing_if = "<[ToolCall]>::is_empty")]
    pub tool_calls: &'a [ToolCall],
}

/// A chat choice: `message` in a full response, `delta` in a stream.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice<'a> {
    /// Choice index.
    pub index: usize,
    /// Full response: the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatMessageOut<'a>>,
    /// Stream: the delta (always present in chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChatDelta<'a>>,
    /// The tokens' log-probabilities when asked for (`logprobs`), else null.
    pub logprobs: Option<ChatLogprobs<'a>>,
    /// Set on the last chunk of a choice.
    pub finish_reason: Option<&'a str>,
}

/// `POST /tokenize` (vLLM's shape): a text prompt, or chat messages rendered
/// with the chat template. Which one is decided by the presence of `messages`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// The served model name.
    pub model: Option<String>,
    /// The text to tokenize (completion form).
    pub prompt: Option<String>,
    /// The conversation to render and tokenize (chat form).
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Chat form: end the rendering with the assistant's turn (default true).
    pub add_generation_prompt: Option<bool>,
    /// Add the tokenizer's special tokens on top of the text (default: true
    /// for `prompt`, false for `messages`, whose template writes its own;
    /// as the completion and chat routes do, so `count` is what they count).
    pub add_special_tokens: Option<bool>,
    /// Chat form: the tools the template sees, as a chat request's `tools`.
    pub tools: Option<inferscope_model::chat_template::Value>,
}

/// The answer of `POST /tokenize`.
#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    /// Number of tokens.
    pub count: usize,
    /// The server's longest prompt plus output.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
}

/// `POST /detokenize` (vLLM's shape).
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// The served model name.
    pub model: Option<String>,
    /// Token ids (signed, so a negative id gets a message naming the field).
    pub tokens: Option<Vec<i64>>,
}

/// The answer of `POST /detokenize`.
#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    /// The decoded text.
    pub prompt: String,
}

/// One token's log-probability with the most likely alternatives, as a
/// response reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text, decoded alone.
    pub token: String,
    /// `None` for the prompt's first token (nothing precedes it).
    pub logprob: Option<f32>,
    /// vLLM's order: the token itself, then the most likely others.
    pub top: Vec<RankedLogprob>,
}

/// A token's log-probability and rank.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedLogprob {
    /// The token id.
    pub token_id: u32,
    /// Its text, decoded alone.
    pub text: String,
    /// The value.
    pub logprob: f32,
    /// 1 for the most likely token.
    pub rank: u32,
}

/// vLLM's `prompt_logprobs`: per prompt position (the first has none) the
/// prompt token and the most likely tokens.
pub type PromptLogprobs = Vec<Option<Vec<RankedLogprob>>>;
