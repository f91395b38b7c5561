//! Request validation: every check that turns bad input into a 4xx with a
//! message naming the field, before anything reaches the engine.

use std::sync::{Arc, OnceLock};

use inferscope_engine::{
    BadWords, CompiledGrammar, SamplingParams, StopTokenIds, StructuredOutput,
};
use inferscope_model::chat_template::Value;
use inferscope_model::{ChatInput, GenerationDefaults, Tokenizer};

use crate::error::ApiError;
use crate::features::RequestFeatures;
use crate::openai::body::Fields;
use crate::openai::protocol::{
    ChatContent, ChatMessageIn, ChatRequest, CompletionRequest, DetokenizeRequest,
    DetokenizeResponse, PromptInput, SamplingFields, TokenizeRequest, TokenizeResponse,
};
use crate::openai::refusals::{self, CHAT, COMMON, COMPLETIONS};
use crate::openai::structured::{self, StartupGrammar, StructuredFields};
use crate::openai::tool_parsers::ToolCalls;
use crate::openai::tools::{self, ToolSettings};

/// Limits the server validates against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest prompt plus output.
    pub max_model_len: usize,
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Largest `n`.
    pub max_n: usize,
    /// Largest number of choices in one request (prompts in a batch times `n`):
    /// each is an engine request, so an unbounded batch would let one request
    /// occupy the whole engine and the server's memory.
    pub max_choices: usize,
    /// Most stop strings in one request: every output delta of every choice
    /// is searched for each of them.
    pub max_stop_sequences: usize,
    /// Longest stop string, in bytes.
    pub max_stop_sequence_bytes: usize,
    /// Most stop token ids in one request (duplicates included: the list is
    /// parsed and checked whole before it is deduplicated).
    pub max_stop_token_ids: usize,
    /// The model's sampling defaults (`--generation-config`), for requests
    /// that omit a field.
    pub sampling_defaults: GenerationDefaults,
    /// Most log-probabilities per position (`--max-logprobs`).
    pub max_logprobs: usize,
}

/// What a request is checked against.
#[derive(Clone, Copy)]
pub struct Validator<'a> {
    /// Names the model answers to; the first is the default.
    pub served_model_names: &'a [String],
    /// Length and range limits.
    pub limits: &'a Limits,
    /// Text to tokens.
    pub tokenizer: &'a dyn Tokenizer,
    /// Tool calling (`--enable-auto-tool-choice`, `--tool-call-parser`).
    pub tools: ToolSettings,
    /// Compiles structured-output constraints over the tokenizer's
    /// vocabulary (none when it could not be read: those fields are 400s);
    /// asked only when a request has a constraint.
    pub grammar: &'a StartupGrammar,
}

/// A request that passed every check: the served name it asked for and the plan.
#[derive(Debug, Clone)]
pub struct Validated {
    /// The served model name (one of `served_model_names`, never the raw input
    /// when it differs).
    pub model: String,
    /// What to run.
    pub plan: Plan,
}

/// Parses and validates a `/v1/completions` body. Never panics, whatever the
/// bytes (the fuzz target and the proptests call it directly).
pub fn parse_and_validate_completion(body: &[u8], v: &Validator) -> Result<Validated, ApiError> {
    let fields = Fields::parse(body)?;
    let req: CompletionRequest = fields.read()?;
    let mut sampling: SamplingFields = fields.read()?;
    let model = check_model(v.served_model_names, req.model.as_deref())?;
    refusals::check(&fields, &[COMMON, COMPLETIONS])?;
    // `echo` repeats a text prompt as sent; token prompts are decoded below.
    let echo = req.echo.unwrap_or(false);
    let sent_texts: Vec<String> = match (&req.prompt, echo) {
        (Some(PromptInput::Text(t)), true) => vec![t.clone()],
        (Some(PromptInput::Texts(t)), true) => t.clone(),
        _ => Vec::new(),
    };
    let add_special_tokens = req.add_special_tokens.unwrap_or(true);
    let prompts = completion_prompts(req.prompt, v.tokenizer, v.limits, add_special_tokens)?;
    // `max_tokens: 0` with `echo` (evaluation harnesses scoring a prompt):
    // the prompt is computed and one token generated, then dropped (vLLM).
    let prefill_only = echo && req.max_tokens == Some(0);
    let max_tokens = if prefill_only {
        Some(1)
    } else {
        req.max_tokens
    };
    let (prompt_logprobs, stream) = (sampling.prompt_logprobs, sampling.stream);
    let bad_words = sampling.bad_words.take();
    let mut plan = plan(
        prompts,
        max_tokens,
        |_| 16,
        sampling,
        v.limits,
        "max_tokens",
    )?;
    let tokens = match req.logprobs {
        None | Some(serde_json::Value::Null | serde_json::Value::Bool(false)) => None,
        Some(n) => match n.as_i64() {
            Some(n) => Some(logprob_count(n, "logprobs", v.limits)?),
            None => {
                return Err(ApiError::invalid(
                    format!("`logprobs` must be an integer, got {n}"),
                    Some("logprobs"),
                ));
            }
        },
    };
    apply_logprobs(&mut plan, tokens, prompt_logprobs, stream, echo, v.limits)?;
    apply_bad_words(&mut plan, bad_words, v)?;
    plan.logprobs.prefill_only = prefill_only;
    if echo {
        plan.echo = Some(echo_texts(sent_texts, &plan, v.tokenizer)?);
    }
    plan.grammar = compile_structured(body, &fields, v)?;
    plan.note_features(None);
    Ok(Validated { model, plan })
}

/// The number of log-probabilities per position `field` asks for: -1 is
/// the whole vocabulary (as vLLM), more than `--max-logprobs` is refused.
fn logprob_count(n: i64, field: &'static str, limits: &Limits) -> Result<usize, ApiError> {
    let count = match n {
        -1 => limits.vocab_size,
        n if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
        n => {
            return Err(ApiError::invalid(
                format!("`{field}` must be a non-negative number or -1, got {n}"),
                Some(field),
            ));
        }
    };
    if count > limits.max_logprobs {
        return Err(ApiError::invalid(
            format!(
                "`{field}` asks for {count} log-probabilities per token; at most {} are allowed (--max-logprobs)",
                limits.max_logprobs
            ),
            Some(field),
        ));
    }
    Ok(count)
}

/// Sets the engine's log-probability parameters and what the response
/// reports: `tokens` most likely per generated token, vLLM's
/// `prompt_logprobs`, and with `echo` the prompt's own (as many as `tokens`).
fn apply_logprobs(
    plan: &mut Plan,
    tokens: Option<usize>,
    prompt_field: Option<i64>,
    stream: Option<bool>,
    echo: bool,
    limits: &Limits,
) -> Result<(), ApiError> {
    let prompt = prompt_field
        .map(|n| logprob_count(n, "prompt_logprobs", limits))
        .transpose()?;
    if prompt.is_some() && stream == Some(true) {
        return Err(ApiError::invalid(
            "`prompt_logprobs` are not available when `stream` is true",
            Some("prompt_logprobs"),
        ));
    }
    let echoed = if echo { tokens } else { None };
    plan.logprobs.tokens = tokens;
    plan.logprobs.echo = echoed.is_some();
    plan.logprobs.prompt = prompt;
    if tokens.is_some() || prompt.is_some() {
        // The `Arc` is the plan's own until the request is started.
        let params = Arc::make_mut(&mut plan.params);
        params.logprobs = tokens;
        params.prompt_logprobs = match (prompt, echoed) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(())
}

/// Most token sequences and most tokens in all of them that `bad_words`
/// may make once tokenized (vLLM's defaults of `VLLM_MAX_NUM_BAD_WORDS` and
/// `VLLM_MAX_BAD_WORDS_TOTAL_TOKENS`): every sampling step checks them all.
const MAX_BAD_WORD_SEQUENCES: usize = 128;
const MAX_BAD_WORD_TOKENS: usize = 1024;

/// Sets the engine's `bad_words` from the field's value: tokenized here,
/// once, so that sampling compares token ids only.
fn apply_bad_words(
    plan: &mut Plan,
    value: Option<serde_json::Value>,
    v: &Validator,
) -> Result<(), ApiError> {
    let words = bad_words(value, v.tokenizer, v.limits)?;
    if !words.is_empty() {
        // The `Arc` is the plan's own until the request is started.
        Arc::make_mut(&mut plan.params).bad_words = words;
    }
    Ok(())
}

/// vLLM's `bad_words`: each word (leading whitespace dropped) tokenized
/// without special tokens as it is, and with a leading space when that
/// gives as many tokens starting with a different one (the word in the
/// middle of a text). Not a list, an entry that is not a string or is
/// empty, or too many tokens: a 400 naming the field.
fn bad_words(
    value: Option<serde_json::Value>,
    tokenizer: &dyn Tokenizer,
    limits: &Limits,
) -> Result<BadWords, ApiError> {
    const P: &str = "bad_words";
    let invalid = |msg: String| ApiError::invalid(msg, Some(P));
    let words = match value {
        None | Some(serde_json::Value::Null) => return Ok(BadWords::default()),
        Some(serde_json::Value::Array(words)) => words,
        Some(other) => {
            return Err(invalid(format!(
                "`{P}` must be a list of strings, got {}",
                truncate(&other.to_string(), 64)
            )));
        }
    };
    let encode = |text: &str| {
        tokenizer
            .encode(text, false)
            .map_err(|e| invalid(format!("cannot tokenize a word of `{P}`: {e}")))
    };
    let mut seqs: Vec<Vec<u32>> = Vec::with_capacity(words.len().min(MAX_BAD_WORD_SEQUENCES));
    for w in &words {
        let Some(word) = w.as_str() else {
            return Err(invalid(format!(
                "`{P}` must be a list of strings, got the entry {}",
                truncate(&w.to_string(), 64)
            )));
        };
        let word = word.trim_start();
        let plain = encode(word)?;
        if plain.is_empty() {
            return Err(invalid(format!(
                "`{P}` entries must not be empty or only whitespace"
            )));
        }
        let spaced = encode(&format!(" {word}"))?;
        let new_first = spaced.first() != plain.first();
        let same_len = spaced.len() == plain.len();
        seqs.push(plain);
        if new_first && same_len {
            seqs.push(spaced);
        }
        let tokens: usize = seqs.iter().map(Vec::len).sum();
        if seqs.len() > MAX_BAD_WORD_SEQUENCES || tokens > MAX_BAD_WORD_TOKENS {
            return Err(invalid(format!(
                "`{P}` makes too many token sequences: at most {MAX_BAD_WORD_SEQUENCES} sequences of {MAX_BAD_WORD_TOKENS} tokens in all are allowed"
            )));
        }
    }
    for &id in seqs.iter().flatten() {
        token_id(i64::from(id), limits, "token id", P)?;
    }
    Ok(BadWords::new(seqs))
}

/// The text `echo` puts before each prompt's choices: the prompt as sent
/// (`sent`, for text prompts) or its token ids decoded.
fn echo_texts(
    sent: Vec<String>,
    plan: &Plan,
    tokenizer: &dyn Tokenizer,
) -> Result<Vec<String>, ApiError> {
    if !sent.is_empty() {
        return Ok(sent);
    }
    plan.prompts
        .iter()
        .map(|ids| {
            tokenizer
                .decode(ids, plan.skip_special_tokens)
                .map_err(|e| {
                    ApiError::invalid(format!("cannot decode the prompt: {e}"), Some("echo"))
                })
        })
        .collect()
}

/// Parses and validates a `/v1/chat/completions` body: messages rendered with
/// the chat template and tokenized. Never panics, whatever the bytes.
pub fn parse_and_validate_chat(body: &[u8], v: &Validator) -> Result<Validated, ApiError> {
    let fields = Fields::parse(body)?;
    let req: ChatRequest = fields.read()?;
    let mut sampling: SamplingFields = fields.read()?;
    let model = check_model(v.served_model_names, req.model.as_deref())?;
    refusals::check(&fields, &[COMMON, CHAT])?;
    let tools = tools::plan_tools(
        req.tools,
        req.tool_choice,
        sampling.parallel_tool_calls.as_ref(),
        &v.tools,
    )?;
    let input = ChatInput {
        messages: chat_messages(req.messages)?,
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
        tools: tools.template_tools,
        ..ChatInput::default()
    };
    // The template writes the special tokens (BOS included) itself: by
    // default add none on top, as vLLM encodes a rendered chat.
    let prompt = render_chat(v.tokenizer, &input, req.add_special_tokens.unwrap_or(false))?;
    let (max_tokens, param) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(v), _) => (Some(v), "max_completion_tokens"),
        (None, v) => (v, "max_tokens"),
    };
    let max_len = v.limits.max_model_len;
    let (prompt_logprobs, stream) = (sampling.prompt_logprobs, sampling.stream);
    let bad_words = sampling.bad_words.take();
    let mut plan = plan(
        vec![prompt],
        max_tokens,
        |prompt_len| max_len.saturating_sub(prompt_len),
        sampling,
        v.limits,
        param,
    )?;
    if tools.keep_special_tokens {
        plan.skip_special_tokens = false;
    }
    plan.tool_calls = tools.format.map(|format| ToolCalls {
        format,
        single_call: tools.single_call,
    });
    let constraint = compile_structured(body, &fields, v)?;
    plan.grammar = match tools.schema {
        Some(_) if constraint.is_some() => {
            return Err(ApiError::invalid(
                "`tool_choice` \"required\" or a named function constrains the output already: it cannot be combined with `response_format` or another structured-output field",
                Some("tool_choice"),
            ));
        }
        Some(schema) => Some(structured::compile_constraint(
            StructuredOutput::Json(schema),
            "tool_choice",
            v.grammar.get(),
        )?),
        None => constraint,
    };
    let top = req
        .top_logprobs
        .map(|n| logprob_count(n, "top_logprobs", v.limits))
        .transpose()?;
    let tokens = match (req.logprobs.unwrap_or(false), top) {
        (true, top) => Some(top.unwrap_or(0)),
        (false, None | Some(0)) => None,
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "when using `top_logprobs`, `logprobs` must be set to true",
                Some("top_logprobs"),
            ));
        }
    };
    apply_logprobs(&mut plan, tokens, prompt_logprobs, stream, false, v.limits)?;
    apply_bad_words(&mut plan, bad_words, v)?;
    plan.note_features(tools.offered);
    Ok(Validated { model, plan })
}

/// The request's structured-output constraint, compiled; last of the
/// checks because it is the costliest (a large schema takes milliseconds).
fn compile_structured(
    body: &[u8],
    fields: &Fields,
    v: &Validator,
) -> Result<Option<CompiledGrammar>, ApiError> {
    if !may_name_structured_fields(body) {
        // Its fields are not there: no need to read them.
        return Ok(None);
    }
    let structured: StructuredFields = fields.read()?;
    structured::compile(&structured, v.grammar)
}

/// Whether `body` may hold one of [`StructuredFields`]' fields: it holds
/// one of their names, or an escape (`\u`) that could spell one. False
/// means certainly not; a SIMD scan, cheaper than another parse.
fn may_name_structured_fields(body: &[u8]) -> bool {
    static NAMES: Needles<4> =
        Needles::new(["response_format", "structured_outputs", "guided_", "\\u"]);
    NAMES.any_in(body)
}

/// A fixed set of byte strings to look for in request bodies, with their
/// SIMD searchers built once (building one costs about what a short search
/// does).
pub(crate) struct Needles<const N: usize> {
    words: [&'static str; N],
    finders: OnceLock<[memchr::memmem::Finder<'static>; N]>,
}

impl<const N: usize> Needles<N> {
    /// Searchers for `words`, built at the first search.
    pub(crate) const fn new(words: [&'static str; N]) -> Self {
        Self {
            words,
            finders: OnceLock::new(),
        }
    }

    /// Whether `body` holds one of the words.
    pub(crate) fn any_in(&self, body: &[u8]) -> bool {
        self.finders
            .get_or_init(|| self.words.map(memchr::memmem::Finder::new))
            .iter()
            .any(|f| f.find(body).is_some())
    }
}

/// The request's chat messages as the template sees them: `role`, the
/// text (parts joined), and `name`, `tool_call_id` and `tool_calls` when
/// given (each call's arguments as a mapping). A missing or empty list, a
/// non-text part or a malformed call is a 400 naming `messages`.
fn chat_messages(messages: Option<Vec<ChatMessageIn>>) -> Result<Vec<Value>, ApiError> {
    let messages =
        messages.ok_or_else(|| ApiError::invalid("`messages` is required", Some("messages")))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "`messages` must not be empty",
            Some("messages"),
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match m.content {
                None => String::new(),
                Some(ChatContent::Text(t)) => t,
                Some(ChatContent::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), p.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    format!(
                                        "content part type `{}` is not supported (only `text`)",
                                        truncate(kind, 64)
                                    ),
                                    Some("messages"),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            let mut fields = vec![
                ("role", Value::from(m.role)),
                ("content", Value::from(content)),
            ];
            if let Some(name) = m.name {
                fields.push(("name", Value::from(name)));
            }
            if let Some(id) = m.tool_call_id {
                fields.push(("tool_call_id", Value::from(id)));
            }
            if let Some(calls) = m.tool_calls.filter(|c| !c.is_none()) {
                fields.push(("tool_calls", tools::template_tool_calls(&calls, i)?));
            }
            Ok(Value::from_iter(fields))
        })
        .collect()
}

/// Renders a conversation with the chat template and tokenizes the text.
fn render_chat(
    tokenizer: &dyn Tokenizer,
    input: &ChatInput,
    add_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    tokenizer
        .render_chat(input)
        .and_then(|text| tokenizer.encode(&text, add_special_tokens))
        .map_err(|e| {
            ApiError::invalid(
                format!("cannot render the conversation: {e}"),
                Some("messages"),
            )
        })
}

/// Parses a `/tokenize` body and tokenizes it: the prompt, or the messages
/// rendered with the chat template, exactly as `/v1/completions` and
/// `/v1/chat/completions` do with the same defaults, so `count` is the
/// `usage.prompt_tokens` they would report. A result longer than
/// `max_model_len` is refused: no request could carry it.
pub fn parse_and_tokenize(body: &[u8], v: &Validator) -> Result<TokenizeResponse, ApiError> {
    let req: TokenizeRequest = parse_json(body)?;
    check_model(v.served_model_names, req.model.as_deref())?;
    // vLLM's defaults: a prompt gets the tokenizer's special tokens, a
    // rendered chat none on top of those its template writes.
    let add_special_tokens = req.add_special_tokens.unwrap_or(req.messages.is_none());
    if req.tools.is_some() && req.messages.is_none() {
        return Err(ApiError::invalid(
            "`tools` go to the chat template: send them with `messages`, not `prompt`",
            Some("tools"),
        ));
    }
    let (tokens, param) = match (req.messages, req.prompt) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "give either `prompt` or `messages`, not both",
                Some("messages"),
            ));
        }
        (Some(messages), None) => {
            let input = ChatInput {
                messages: chat_messages(Some(messages))?,
                add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                tools: req.tools.map(tools::template_tools).transpose()?.flatten(),
                ..ChatInput::default()
            };
            let tokens = render_chat(v.tokenizer, &input, add_special_tokens)?;
            (tokens, "messages")
        }
        (None, Some(prompt)) => {
            let tokens = v
                .tokenizer
                .encode(&prompt, add_special_tokens)
                .map_err(|e| {
                    ApiError::invalid(format!("cannot tokenize the prompt: {e}"), Some("prompt"))
                })?;
            (tokens, "prompt")
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "`prompt` or `messages` is required",
                Some("prompt"),
            ));
        }
    };
    let max_model_len = v.limits.max_model_len;
    if tokens.len() > max_model_len {
        return Err(ApiError::invalid(
            format!(
                "`{param}` is {} tokens, more than the maximum model length {max_model_len}",
                tokens.len()
            ),
            Some(param),
        ));
    }
    Ok(TokenizeResponse {
        count: tokens.len(),
        max_model_len,
        tokens,
    })
}

/// Parses a `/detokenize` body and decodes its token ids (special tokens
/// included, as vLLM does). Ids outside the vocabulary and lists longer
/// than `max_model_len` are refused.
pub fn parse_and_detokenize(body: &[u8], v: &Validator) -> Result<DetokenizeResponse, ApiError> {
    let req: DetokenizeRequest = parse_json(body)?;
    check_model(v.served_model_names, req.model.as_deref())?;
    let tokens = req
        .tokens
        .ok_or_else(|| ApiError::invalid("`tokens` is required", Some("tokens")))?;
    let max_model_len = v.limits.max_model_len;
    if tokens.len() > max_model_len {
        return Err(ApiError::invalid(
            format!(
                "`tokens` has {} ids, more than the maximum model length {max_model_len}",
                tokens.len()
            ),
            Some("tokens"),
        ));
    }
    let ids = tokens
        .into_iter()
        .map(|t| token_id(t, v.limits, "token id", "tokens"))
        .collect::<Result<Vec<_>, _>>()?;
    let prompt = v
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::invalid(format!("cannot decode the tokens: {e}"), Some("tokens")))?;
    Ok(DetokenizeResponse { prompt })
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}"), None))
}

/// The served name the request asked for (404 for another model). The name
/// returned is always one of `served`, so it is safe wherever it goes.
pub fn check_model(served: &[String], model: Option<&str>) -> Result<String, ApiError> {
    match model {
        None => served
            .first()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("no model is served")),
        Some(m) => served
            .iter()
            .find(|n| n.as_str() == m)
            .cloned()
            .ok_or_else(|| ApiError::model_not_found(&truncate(m, 256))),
    }
}

/// At most `max` bytes of `s` (on a char boundary), marked when cut: echoing a
/// megabyte of user input back in an error message helps no one.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

/// A request ready for the engine.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Tokenized prompts (one per prompt in a batch).
    pub prompts: Vec<Vec<u32>>,
    /// Parameters of each choice (the seed is varied per choice).
    pub params: Arc<SamplingParams>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream over SSE.
    pub stream: bool,
    /// Send the usage chunk.
    pub include_usage: bool,
    /// The request asked for its timings (`include_metrics`).
    pub include_metrics: bool,
    /// Leave special tokens out of the output text.
    pub skip_special_tokens: bool,
    /// Keep the stop string or stop token that ended a choice in its text.
    pub include_stop_str_in_output: bool,
    /// `echo`: the text put before the completion of each prompt's choices.
    pub echo: Option<Vec<String>>,
    /// Chat: how the output is read into `tool_calls` (`None`: it is not).
    pub tool_calls: Option<ToolCalls>,
    /// The compiled structured-output constraint, shared by every choice
    /// (each starts its own matcher).
    pub grammar: Option<CompiledGrammar>,
    /// What the response reports of log-probabilities.
    pub logprobs: LogprobsPlan,
    /// Which optional features the request used (the request log and the
    /// span), set once validation is done.
    pub features: RequestFeatures,
}

impl Plan {
    /// Fills `features` from the finished plan and `tools` (how many were
    /// offered and the `tool_choice`).
    fn note_features(&mut self, tools: Option<(usize, &'static str)>) {
        let lp = self.logprobs;
        self.features = RequestFeatures {
            logprobs: lp.tokens,
            prompt_logprobs: lp.prompt.or(lp.tokens.filter(|_| lp.echo)),
            structured_output: self.grammar.as_ref().map(|g| g.constraint().kind()),
            tools: tools.map(|(n, _)| n),
            tool_choice: tools.map(|(_, c)| c),
        };
    }
}

/// The log-probabilities a response reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogprobsPlan {
    /// Each generated token's, plus this many most likely (completions
    /// `logprobs`, chat `top_logprobs`); `None`: no `logprobs` in choices.
    pub tokens: Option<usize>,
    /// `echo` with `logprobs`: the prompt's tokens lead the choice's
    /// log-probabilities, the first with none.
    pub echo: bool,
    /// vLLM's `prompt_logprobs`: this many most likely per prompt position.
    pub prompt: Option<usize>,
    /// `max_tokens: 0` with `echo`: the one generated token is not reported.
    pub prefill_only: bool,
}

/// Tokenizes a completion prompt.
pub fn completion_prompts(
    prompt: Option<PromptInput>,
    tokenizer: &dyn Tokenizer,
    limits: &Limits,
    add_special_tokens: bool,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let missing = || ApiError::invalid("`prompt` is required", Some("prompt"));
    let encode = |text: &str| {
        tokenizer.encode(text, add_special_tokens).map_err(|e| {
            ApiError::invalid(format!("cannot tokenize the prompt: {e}"), Some("prompt"))
        })
    };
    let ids = |v: Vec<i64>| -> Result<Vec<u32>, ApiError> {
        v.into_iter()
            .map(|t| token_id(t, limits, "token id", "prompt"))
            .collect()
    };
    let prompts = match prompt.ok_or_else(missing)? {
        PromptInput::Text(s) => vec![encode(&s)?],
        PromptInput::Texts(v) => v.iter().map(|s| encode(s)).collect::<Result<_, _>>()?,
        PromptInput::Tokens(v) => vec![ids(v)?],
        PromptInput::TokenLists(v) => v.into_iter().map(ids).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(
            "`prompt` must not be an empty list",
            Some("prompt"),
        ));
    }
    Ok(prompts)
}

/// Checks the sampling fields and the lengths; builds the engine parameters.
/// `max_tokens` is the request's value; `default_max_tokens(prompt_len)`
/// applies when it is absent.
pub fn plan(
    prompts: Vec<Vec<u32>>,
    max_tokens: Option<i64>,
    default_max_tokens: impl Fn(usize) -> usize,
    f: SamplingFields,
    limits: &Limits,
    max_param: &'static str,
) -> Result<Plan, ApiError> {
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid(
            "the prompt is empty: send at least one token",
            Some("prompt"),
        ));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let max_tokens = match max_tokens {
        Some(v) if v < 1 => {
            return Err(ApiError::invalid(
                format!("`{max_param}` must be at least 1, got {v}"),
                Some(max_param),
            ));
        }
        Some(v) => usize::try_from(v).unwrap_or(usize::MAX),
        None => default_max_tokens(longest).max(1),
    };
    // As vLLM: the model's `max_new_tokens` caps the request's value too.
    let max_tokens = match limits.sampling_defaults.max_tokens {
        Some(cap) => max_tokens.min(usize::try_from(cap).unwrap_or(usize::MAX).max(1)),
        None => max_tokens,
    };
    let d = &limits.sampling_defaults;
    let f = SamplingFields {
        temperature: f.temperature.or(d.temperature),
        top_p: f.top_p.or(d.top_p),
        top_k: f.top_k.or(d.top_k),
        min_p: f.min_p.or(d.min_p),
        repetition_penalty: f.repetition_penalty.or(d.repetition_penalty),
        ..f
    };
    if longest >= limits.max_model_len || longest.saturating_add(max_tokens) > limits.max_model_len
    {
        return Err(ApiError::invalid(
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} in the completion). Please reduce the length of the prompt or of `{max_param}`.",
                limits.max_model_len,
                longest.saturating_add(max_tokens),
                longest,
                max_tokens
            ),
            Some(max_param),
        ));
    }
    let temperature = f.temperature.unwrap_or(1.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::invalid(
            format!("`temperature` must be a non-negative number, got {temperature}"),
            Some("temperature"),
        ));
    }
    let top_p = f.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            format!("`top_p` must be in (0, 1], got {top_p}"),
            Some("top_p"),
        ));
    }
    let top_k = match f.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        k => {
            return Err(ApiError::invalid(
                format!("`top_k` must be -1 (off) or positive, got {k}"),
                Some("top_k"),
            ));
        }
    };
    let n = f.n.unwrap_or(1);
    if n < 1 || n as u64 > limits.max_n as u64 {
        return Err(ApiError::invalid(
            format!("`n` must be between 1 and {}, got {n}", limits.max_n),
            Some("n"),
        ));
    }
    let choices = prompts.len().saturating_mul(n as usize);
    if choices > limits.max_choices {
        return Err(ApiError::invalid(
            format!(
                "{} prompts with `n` = {n} make {choices} choices; at most {} are allowed in one request",
                prompts.len(),
                limits.max_choices
            ),
            Some(if prompts.len() > 1 { "prompt" } else { "n" }),
        ));
    }
    let min_tokens = f.min_tokens.unwrap_or(0);
    if min_tokens < 0 || min_tokens as u64 > max_tokens as u64 {
        return Err(ApiError::invalid(
            format!(
                "`min_tokens` must be between 0 and `{max_param}` ({max_tokens}), got {min_tokens}"
            ),
            Some("min_tokens"),
        ));
    }
    // vLLM's ranges and messages.
    let presence_penalty = in_range(f.presence_penalty, 0.0, -2.0, 2.0, "presence_penalty")?;
    let frequency_penalty = in_range(f.frequency_penalty, 0.0, -2.0, 2.0, "frequency_penalty")?;
    let min_p = in_range(f.min_p, 0.0, 0.0, 1.0, "min_p")?;
    let repetition_penalty = f.repetition_penalty.unwrap_or(1.0);
    // Checked as the sampler's f32: 1e-300 would round to 0.
    if (repetition_penalty as f32).partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return Err(ApiError::invalid(
            format!("`repetition_penalty` must be greater than zero, got {repetition_penalty}"),
            Some("repetition_penalty"),
        ));
    }
    let logit_bias = logit_bias(f.logit_bias, limits)?;
    let allowed_token_ids = allowed_token_ids(f.allowed_token_ids, limits)?;
    // One sample per choice: `best_of` may only repeat `n`.
    if let Some(best_of) = f.best_of
        && best_of != n
    {
        let msg = if best_of < n {
            format!("`best_of` must be at least `n` ({n}), got {best_of}")
        } else {
            format!(
                "`best_of` greater than `n` is not supported by this server (one sample per choice): got {best_of} with `n` = {n}"
            )
        };
        return Err(ApiError::invalid(msg, Some("best_of")));
    }
    if f.stream_options
        .as_ref()
        .and_then(|o| o.continuous_usage_stats)
        .unwrap_or(false)
    {
        return Err(ApiError::invalid(
            "`stream_options.continuous_usage_stats` is not supported by this server: usage comes in the last chunk (`include_usage`)",
            Some("stream_options"),
        ));
    }
    let stop_token_ids = f.stop_token_ids.unwrap_or_default();
    if stop_token_ids.len() > limits.max_stop_token_ids {
        return Err(ApiError::invalid(
            format!(
                "`stop_token_ids` has {} ids; at most {} are allowed (--max-stop-token-ids)",
                stop_token_ids.len(),
                limits.max_stop_token_ids
            ),
            Some("stop_token_ids"),
        ));
    }
    let stop = f.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > limits.max_stop_sequences {
        return Err(ApiError::invalid(
            format!(
                "`stop` has {} strings; at most {} are allowed (--max-stop-sequences)",
                stop.len(),
                limits.max_stop_sequences
            ),
            Some("stop"),
        ));
    }
    if let Some(long) = stop
        .iter()
        .find(|s| s.len() > limits.max_stop_sequence_bytes)
    {
        return Err(ApiError::invalid(
            format!(
                "a `stop` string has {} bytes; at most {} are allowed (--max-stop-sequence-bytes)",
                long.len(),
                limits.max_stop_sequence_bytes
            ),
            Some("stop"),
        ));
    }
    let stop_token_ids = stop_token_ids
        .into_iter()
        .map(|t| token_id(t, limits, "stop token id", "stop_token_ids"))
        .collect::<Result<StopTokenIds, _>>()?;
    let stream = f.stream.unwrap_or(false);
    let include_usage = f
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    Ok(Plan {
        prompts,
        params: Arc::new(SamplingParams {
            max_tokens,
            min_tokens: min_tokens as usize,
            ignore_eos: f.ignore_eos.unwrap_or(false),
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed: f.seed.map(|s| s as u64),
            stop_token_ids,
            n: n as usize,
            presence_penalty: presence_penalty as f32,
            frequency_penalty: frequency_penalty as f32,
            repetition_penalty: repetition_penalty as f32,
            min_p: min_p as f32,
            logit_bias,
            allowed_token_ids,
            bad_words: BadWords::default(),
            logprobs: None,
            prompt_logprobs: None,
        }),
        stop,
        stream,
        include_usage,
        include_metrics: f.include_metrics.unwrap_or(false),
        skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
        include_stop_str_in_output: f.include_stop_str_in_output.unwrap_or(false),
        echo: None,
        tool_calls: None,
        grammar: None,
        logprobs: LogprobsPlan::default(),
        features: RequestFeatures::default(),
    })
}

/// `value` (or `default` when absent), refused outside `[lo, hi]` with
/// vLLM's message naming `param`.
fn in_range(
    value: Option<f64>,
    default: f64,
    lo: f64,
    hi: f64,
    param: &'static str,
) -> Result<f64, ApiError> {
    let v = value.unwrap_or(default);
    if !(lo..=hi).contains(&v) {
        return Err(ApiError::invalid(
            format!("`{param}` must be in [{lo}, {hi}], got {v}"),
            Some(param),
        ));
    }
    Ok(v)
}

/// Largest bias magnitude (OpenAI's range); a bias outside it is refused,
/// not clamped as vLLM does, so nobody gets less than they asked for unawares.
const MAX_LOGIT_BIAS: f64 = 100.0;

/// `logit_bias`: keys are token ids as decimal strings, checked against the
/// vocabulary; biases in [-100, 100]; an id given twice ("5" and "05") is
/// refused.
fn logit_bias(
    map: Option<std::collections::BTreeMap<String, f64>>,
    limits: &Limits,
) -> Result<Vec<(u32, f32)>, ApiError> {
    const P: &str = "logit_bias";
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(map.len());
    for (key, bias) in map {
        let id: i64 = key.trim().parse().map_err(|_| {
            ApiError::invalid(
                format!("`{P}` key `{}` is not a token id", truncate(&key, 32)),
                Some(P),
            )
        })?;
        let id = token_id(id, limits, "token id", P)?;
        if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&bias) {
            return Err(ApiError::invalid(
                format!("`{P}` bias of token id {id} must be in [-100, 100], got {bias}"),
                Some(P),
            ));
        }
        out.push((id, bias as f32));
    }
    out.sort_unstable_by_key(|&(id, _)| id);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::invalid(
            format!("token id {} appears twice in `{P}`", w[0].0),
            Some(P),
        ));
    }
    Ok(out)
}

/// vLLM's `allowed_token_ids`: ids in the vocabulary, sorted and each once
/// (the sampler walks them beside the logits); an empty list would allow
/// nothing and is refused, as vLLM does.
fn allowed_token_ids(ids: Option<Vec<i64>>, limits: &Limits) -> Result<Vec<u32>, ApiError> {
    const P: &str = "allowed_token_ids";
    let Some(ids) = ids else {
        return Ok(Vec::new());
    };
    if ids.is_empty() {
        return Err(ApiError::invalid(
            "`allowed_token_ids` must not be empty",
            Some(P),
        ));
    }
    let mut out = ids
        .into_iter()
        .map(|t| token_id(t, limits, "token id", P))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A token id from the request, checked against the vocabulary.
fn token_id(t: i64, limits: &Limits, what: &str, param: &'static str) -> Result<u32, ApiError> {
    u32::try_from(t)
        .ok()
        .filter(|&id| (id as usize) < limits.vocab_size)
        .ok_or_else(|| {
            ApiError::invalid(
                format!(
                    "{what} {t} in `{param}` is out of range (vocabulary size {})",
                    limits.vocab_size
                ),
                Some(param),
            )
        })
}

#[cfg(test)]
mod tests {
    use inferscope_model::ByteTokenizer;

    use super::*;

    const LIMITS: Limits = Limits {
        max_model_len: 100,
        vocab_size: 258,
        max_n: 16,
        max_choices: 32,
        max_stop_sequences: 3,
        max_stop_sequence_bytes: 8,
        max_stop_token_ids: 4,
        sampling_defaults: GenerationDefaults::NONE,
        max_logprobs: 5,
    };

    fn fields(json: &str) -> SamplingFields {
        serde_json::from_str(json).expect("fields")
    }

    /// The scan that skips the structured-output parse never skips a body
    /// whose parse finds one of those fields, however its key is spelled.
    #[test]
    fn the_structured_scan_misses_no_field_the_parse_finds() {
        let field_names = [
            "response_format",
            "structured_outputs",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
        ];
        let mut bodies = vec![
            r#"{"model":"m","prompt":"hello world","max_tokens":16}"#.to_owned(),
            r#"{"prompt":"caf\u00e9","guided_mode":1}"#.to_owned(),
        ];
        for name in field_names {
            bodies.push(format!(r#"{{"prompt":"x","{name}":{{"type":"text"}}}}"#));
            // The same key with its first letter escaped.
            let escaped = format!("\\u{:04x}{}", name.as_bytes()[0], &name[1..]);
            bodies.push(format!(r#"{{"prompt":"x","{escaped}":"[ab]"}}"#));
        }
        let mut found = 0;
        for body in &bodies {
            let parsed: StructuredFields = serde_json::from_str(body).expect("valid JSON");
            let present = [
                &parsed.response_format,
                &parsed.structured_outputs,
                &parsed.guided_json,
                &parsed.guided_regex,
                &parsed.guided_choice,
                &parsed.guided_grammar,
            ]
            .iter()
            .any(|f| f.is_some());
            if present {
                found += 1;
                assert!(may_name_structured_fields(body.as_bytes()), "{body}");
            }
        }
        assert_eq!(
            found,
            2 * field_names.len(),
            "every field found, plain and escaped"
        );
        assert!(!may_name_structured_fields(bodies[0].as_bytes()));
    }

    #[test]
    fn lengths_are_checked_and_named() {
        let check = |prompt, max| plan(prompt, max, |_| 16, fields("{}"), &LIMITS, "max_tokens");
        let err = check(vec![vec![1; 90]], Some(20)).expect_err("too long");
        assert_eq!(err.status.as_u16(), 400);
        assert!(
            err.message.contains("100") && err.message.contains("90") && err.message.contains("20")
        );
        let err = check(vec![vec![1; 5]], Some(0)).expect_err("zero");
        assert!(err.message.contains("max_tokens"));
        let err = check(vec![vec![1; 5]], Some(-3)).expect_err("negative");
        assert!(err.message.contains("-3"));
        let err = check(vec![vec![]], Some(3)).expect_err("empty");
        assert!(err.message.contains("empty"));
        let ok = plan(
            vec![vec![1; 5]],
            None,
            |p| 100 - p,
            fields("{}"),
            &LIMITS,
            "max_tokens",
        )
        .expect("default");
        assert_eq!(ok.params.max_tokens, 95);
        assert!(ok.params.allowed_token_ids.is_empty());
        let allowed = plan(
            vec![vec![1; 5]],
            None,
            |p| 100 - p,
            fields(r#"{"allowed_token_ids": [9, 3, 9, 0]}"#),
            &LIMITS,
            "max_tokens",
        )
        .expect("allowed");
        assert_eq!(
            allowed.params.allowed_token_ids,
            [0, 3, 9],
            "sorted, each once"
        );
    }

    #[test]
    fn sampling_fields_are_checked() {
        for (json, field) in [
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_k": -5}"#, "top_k"),
            (r#"{"n": 0}"#, "n"),
            (r#"{"n": 1000}"#, "n"),
            (r#"{"min_tokens": 50}"#, "min_tokens"),
            (r#"{"stop_token_ids": [999]}"#, "stop_token_ids"),
            (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
            (r#"{"repetition_penalty": -1}"#, "repetition_penalty"),
            (r#"{"repetition_penalty": 1e-300}"#, "repetition_penalty"),
            (r#"{"presence_penalty": 2.5}"#, "presence_penalty"),
            (r#"{"presence_penalty": -2.01}"#, "presence_penalty"),
            (r#"{"frequency_penalty": 3}"#, "frequency_penalty"),
            (r#"{"frequency_penalty": -2.5}"#, "frequency_penalty"),
            (r#"{"min_p": 1.5}"#, "min_p"),
            (r#"{"min_p": -0.1}"#, "min_p"),
            (r#"{"logit_bias": {"258": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"-1": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"abc": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"5": 100.5}}"#, "logit_bias"),
            (r#"{"logit_bias": {"5": 1, "05": 2}}"#, "logit_bias"),
            (r#"{"allowed_token_ids": []}"#, "allowed_token_ids"),
            (r#"{"allowed_token_ids": [1, 258]}"#, "allowed_token_ids"),
            (r#"{"allowed_token_ids": [-1]}"#, "allowed_token_ids"),
            (r#"{"best_of": 3, "n": 2}"#, "best_of"),
            (r#"{"best_of": 1, "n": 2}"#, "best_of"),
            (
                r#"{"stream_options": {"continuous_usage_stats": true}}"#,
                "stream_options",
            ),
        ] {
            let err = plan(
                vec![vec![1; 5]],
                Some(10),
                |_| 16,
                fields(json),
                &LIMITS,
                "max_tokens",
            )
            .expect_err(json);
            assert_eq!(err.param, Some(field), "{json}");
        }
        let ok = plan(
            vec![vec![1; 5]],
            Some(10),
            |_| 16,
            fields(r#"{"stop": "x", "n": 2, "ignore_eos": true, "seed": 7, "stream": true, "stream_options": {"include_usage": true}, "repetition_penalty": 1.0}"#),
            &LIMITS,
            "max_tokens",
        )
        .expect("valid");
        assert_eq!(ok.stop, vec!["x".to_owned()]);
        assert!(ok.stream && ok.include_usage && ok.params.ignore_eos);
        assert_eq!((ok.params.n, ok.params.seed), (2, Some(7)));
    }

    /// The model's generation config fills the fields a request omits, never
    /// those it sends, and its `max_new_tokens` caps `max_tokens` (vLLM).
    #[test]
    fn the_generation_config_fills_omitted_fields() {
        let limits = Limits {
            sampling_defaults: GenerationDefaults {
                temperature: Some(0.6),
                top_p: Some(0.9),
                top_k: Some(20),
                min_p: Some(0.05),
                repetition_penalty: Some(1.1),
                max_tokens: Some(8),
            },
            ..LIMITS
        };
        let run = |json, max| {
            plan(
                vec![vec![1; 5]],
                max,
                |_| 16,
                fields(json),
                &limits,
                "max_tokens",
            )
            .expect(json)
        };
        let p = run("{}", None).params;
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.6, 0.9, 20));
        assert_eq!((p.min_p, p.repetition_penalty), (0.05, 1.1));
        assert_eq!(p.max_tokens, 8, "the default 16, capped");
        let p = run(
            r#"{"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "repetition_penalty": 1}"#,
            Some(50),
        )
        .params;
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.0, 1.0, 0));
        assert_eq!((p.min_p, p.repetition_penalty), (0.0, 1.0));
        assert_eq!(p.max_tokens, 8, "a request's max_tokens, capped");
        assert_eq!(run("{}", Some(3)).params.max_tokens, 3);
    }

    /// The honoured sampler fields reach the engine's parameters as sent,
    /// at the edges of their ranges.
    #[test]
    fn sampler_fields_reach_the_engine() {
        let ok = plan(
            vec![vec![1; 5]],
            Some(10),
            |_| 16,
            fields(
                r#"{"presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 1.3,
                    "min_p": 1, "logit_bias": {"257": -100, "7": 100, " 3": 0.5}, "best_of": 2, "n": 2}"#,
            ),
            &LIMITS,
            "max_tokens",
        )
        .expect("valid");
        let p = &ok.params;
        assert_eq!(
            (
                p.presence_penalty,
                p.frequency_penalty,
                p.repetition_penalty,
                p.min_p
            ),
            (-2.0, 2.0, 1.3, 1.0)
        );
        assert_eq!(p.logit_bias, vec![(3, 0.5), (7, 100.0), (257, -100.0)]);
        // The logit_bias message names the bad id.
        let err = plan(
            vec![vec![1; 5]],
            Some(10),
            |_| 16,
            fields(r#"{"logit_bias": {"1": 0, "9999": 1}}"#),
            &LIMITS,
            "max_tokens",
        )
        .expect_err("out of the vocabulary");
        assert!(err.message.contains("9999"), "{}", err.message);
    }

    #[test]
    fn prompts_of_every_shape() {
        let tok = ByteTokenizer;
        let p = |json: &str| serde_json::from_str::<PromptInput>(json).expect("prompt");
        assert_eq!(
            completion_prompts(Some(p(r#""ab""#)), &tok, &LIMITS, true)
                .expect("text")
                .len(),
            1
        );
        assert_eq!(
            completion_prompts(Some(p(r#"["a","b"]"#)), &tok, &LIMITS, true)
                .expect("texts")
                .len(),
            2
        );
        assert_eq!(
            completion_prompts(Some(p("[1,2,3]")), &tok, &LIMITS, true).expect("ids"),
            vec![vec![1, 2, 3]]
        );
        assert_eq!(
            completion_prompts(Some(p("[[1],[2]]")), &tok, &LIMITS, true)
                .expect("lists")
                .len(),
            2
        );
        assert!(completion_prompts(Some(p("[1,-2]")), &tok, &LIMITS, true).is_err());
        assert!(completion_prompts(Some(p("[1,5000]")), &tok, &LIMITS, true).is_err());
        assert!(completion_prompts(None, &tok, &LIMITS, true).is_err());
    }

    #[test]
    fn stop_lists_are_bounded() {
        let check = |json: &str| {
            plan(
                vec![vec![1]],
                Some(4),
                |_| 16,
                fields(json),
                &LIMITS,
                "max_tokens",
            )
        };
        // At the limits: accepted; duplicates count towards the id limit.
        let ok = check(r#"{"stop": ["a", "b", "12345678"], "stop_token_ids": [5, 5, 5, 6]}"#)
            .expect("at the limits");
        assert_eq!(ok.stop.len(), 3);
        assert_eq!(
            ok.params.stop_token_ids,
            vec![5, 6].into(),
            "deduplicated once, here"
        );
        for (json, param, says) in [
            (
                r#"{"stop_token_ids": [1, 1, 1, 1, 1]}"#,
                "stop_token_ids",
                "at most 4",
            ),
            (r#"{"stop": ["a", "b", "c", "d"]}"#, "stop", "at most 3"),
            (r#"{"stop": "123456789"}"#, "stop", "9 bytes"),
        ] {
            let err = check(json).expect_err(json);
            assert_eq!(err.status.as_u16(), 400, "{json}");
            assert_eq!(err.param, Some(param), "{json}");
            assert!(err.message.contains(says), "{json}: {}", err.message);
        }
    }
}
