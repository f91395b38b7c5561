//! Structured outputs: constrained decoding through `llguidance`.
//!
//! The pieces, in the order a request meets them:
//!
//! - [`StructuredOutput`] says what the output must match (a JSON schema,
//!   any JSON object, a regex, one of a list of strings, a Lark grammar). It
//!   is the internal API: the OpenAI front end builds one from
//!   `response_format` / `structured_outputs` / `guided_*`, and tool-call code
//!   can build one from a function's parameter schema.
//! - [`GrammarCompiler`] (one per served tokenizer) compiles it against the
//!   vocabulary into a [`CompiledGrammar`]; the server does this during
//!   validation, on a validation worker, so a bad schema is a 400 and no
//!   compilation ever runs on the async runtime or the engine thread.
//! - The engine gives each sequence its own matcher ([`SeqGrammar`]); each
//!   step the scheduler hands the matchers of the sequences that will sample
//!   to the [`GrammarWorker`] thread, which computes their token masks while
//!   the executor runs the forward pass ([`StepMasks`]); the executor waits
//!   for them only at sampling and applies them to the logits
//!   ([`TokenMask::apply`]). After the step the scheduler advances each
//!   matcher with its sampled token and ends a sequence whose grammar has
//!   finished (`finish_reason` stop).
//!
//! A request without a constraint pays one `Option` check per sequence and
//! step: no allocation, no lock.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory, TokenParser};
use parking_lot::{Condvar, Mutex};

/// What a request's output must match: the one internal description of a
/// constraint, whichever API field asked for it.
#[derive(Debug, Clone, PartialEq)]
pub enum StructuredOutput {
    /// JSON matching this JSON schema (`response_format: json_schema`,
    /// `structured_outputs.json`, `guided_json`, a tool's parameters).
    Json(serde_json::Value),
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// Text matching this regular expression (whole output).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (which also reads GBNF rules).
    Grammar(String),
    /// vLLM's `structural_tag` (xgrammar's format, either form): free text
    /// in which trigger strings open tags whose content is constrained
    /// (`structural_tag.rs` writes it as a Lark grammar).
    StructuralTag(serde_json::Value),
}

impl StructuredOutput {
    /// A short name for logs and the request log: `json`, `json_object`,
    /// `regex`, `choice`, `grammar` or `structural_tag`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Json(_) => "json",
            Self::JsonObject => "json_object",
            Self::Regex(_) => "regex",
            Self::Choice(_) => "choice",
            Self::Grammar(_) => "grammar",
            Self::StructuralTag(_) => "structural_tag",
        }
    }

    fn to_grammar(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            // Compact separators: llguidance's default allows any whitespace
            // between tokens, and a small model then spends its budget on
            // blanks (vLLM sets the same option by default).
            Self::Json(schema) => TopLevelGrammar::from_json_schema(compact(schema.clone())),
            Self::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Self::Choice(choices) => {
                if choices.is_empty() {
                    return Err(GrammarError("the list of choices is empty".into()));
                }
                let alts: Vec<String> = choices.iter().map(|c| escape_regex(c)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", alts.join("|")))
            }
            Self::Grammar(g) if g.contains("::=") => {
                TopLevelGrammar::from_lark(crate::gbnf::to_lark(g))
            }
            Self::Grammar(g) => TopLevelGrammar::from_lark(g.clone()),
            Self::StructuralTag(tag) => TopLevelGrammar::from_lark(
                crate::structural_tag::to_lark(tag, compact).map_err(GrammarError)?,
            ),
        })
    }
}

/// Adds llguidance's `x-guidance` option for compact JSON (no free
/// whitespace) to a schema object, unless the schema sets its own.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut()
        && !obj.contains_key("x-guidance")
    {
        obj.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false}),
        );
    }
    schema
}

/// `s` with every regex metacharacter escaped.
fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A constraint that cannot be compiled or followed; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// Compiled grammars a [`GrammarCompiler`] keeps, the oldest dropped first.
pub const GRAMMAR_CACHE_CAPACITY: usize = 64;

/// Compiles constraints against one tokenizer's vocabulary.
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    vocab_size: usize,
    /// The grammars compiled last, by constraint: clients send the same
    /// schema with request after request, and compiling it again each time
    /// (milliseconds of CPU) competes with the engine's masks for the cores.
    cache: Arc<Mutex<GrammarCache>>,
}

/// A bounded map from a constraint's key ([`cache_key`]) to its grammar.
#[derive(Default)]
struct GrammarCache {
    map: HashMap<String, CompiledGrammar>,
    /// Keys in insertion order: the front is dropped when full.
    order: VecDeque<String>,
}

impl GrammarCache {
    fn insert(&mut self, key: String, grammar: CompiledGrammar) {
        if self.map.contains_key(&key) {
            return;
        }
        if self.order.len() >= GRAMMAR_CACHE_CAPACITY
            && let Some(old) = self.order.pop_front()
        {
            self.map.remove(&old);
        }
        self.order.push_back(key.clone());
        self.map.insert(key, grammar);
    }
}

/// A string naming `c` exactly (equal strings, equal constraints).
fn cache_key(c: &StructuredOutput) -> String {
    match c {
        StructuredOutput::Json(v) => format!("json:{v}"),
        StructuredOutput::JsonObject => "json_object".to_owned(),
        StructuredOutput::Regex(r) => format!("regex:{r}"),
        StructuredOutput::Choice(cs) => format!("choice:{}", serde_json::json!(cs)),
        StructuredOutput::Grammar(g) => format!("grammar:{g}"),
        StructuredOutput::StructuralTag(v) => format!("structural_tag:{v}"),
    }
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

impl GrammarCompiler {
    /// A compiler over a vocabulary: `token_bytes[id]` is what token `id`
    /// decodes to, special tokens prefixed with `0xFF` (llguidance's marker)
    /// so a grammar never matches them as text; `eos` ends a finished grammar.
    pub fn new(token_bytes: Vec<Vec<u8>>, eos: u32) -> Result<Self, GrammarError> {
        let vocab_size = token_bytes.len();
        if (eos as usize) >= vocab_size {
            return Err(GrammarError(format!(
                "the EOS token {eos} is outside the vocabulary (0..{vocab_size})"
            )));
        }
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let trie = TokTrie::from(&info, &token_bytes);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| GrammarError(format!("cannot build the token trie: {e}")))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            vocab_size,
            cache: Arc::default(),
        })
    }

    /// Tokens in the vocabulary the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Compiles `constraint`; an invalid schema, regex or grammar is an
    /// error saying what is wrong. A constraint compiled lately is taken
    /// from the cache ([`GRAMMAR_CACHE_CAPACITY`]). CPU work (milliseconds
    /// for a large schema): call it off the async runtime.
    pub fn compile(&self, constraint: StructuredOutput) -> Result<CompiledGrammar, GrammarError> {
        let key = cache_key(&constraint);
        if let Some(g) = self.cache.lock().map.get(&key) {
            return Ok(g.clone());
        }
        // Compiled outside the lock: a miss never holds up another request.
        let compiled = self.compile_uncached(constraint)?;
        self.cache.lock().insert(key, compiled.clone());
        Ok(compiled)
    }

    fn compile_uncached(
        &self,
        constraint: StructuredOutput,
    ) -> Result<CompiledGrammar, GrammarError> {
        let parser = self
            .parser(constraint.to_grammar()?)
            .map_err(|e| self.blame(&constraint, e))?;
        Ok(CompiledGrammar {
            parser: Arc::new(Mutex::new(parser)),
            constraint: Arc::new(constraint),
        })
    }

    /// The parser of `grammar`, probed once: the first mask builds the
    /// lexer, and an error there (a regex no token sequence can match, a
    /// grammar past the size limits) is the client's, reported now rather
    /// than as a failed generation.
    fn parser(&self, grammar: TopLevelGrammar) -> Result<TokenParser, String> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        Matcher::new(Ok(parser.deep_clone()))
            .compute_mask()
            .map_err(|e| e.to_string())?;
        Ok(parser)
    }

    /// The error of a constraint that did not compile: for a structural tag
    /// whose embedded `grammar` is at fault, that grammar's own error under
    /// its key (`format.content.grammar: ...`), so the client knows which.
    fn blame(&self, constraint: &StructuredOutput, error: String) -> GrammarError {
        if let StructuredOutput::StructuralTag(tag) = constraint {
            for (key, lark) in crate::structural_tag::embedded_grammars(tag) {
                if let Err(e) = self.parser(TopLevelGrammar::from_lark(lark)) {
                    return GrammarError(format!("`{key}` is not a valid grammar: {e}"));
                }
            }
        }
        GrammarError(error)
    }
}

/// A compiled constraint, shared by the choices of one request: each
/// sequence starts its own matcher from it ([`CompiledGrammar::start`]).
#[derive(Clone)]
pub struct CompiledGrammar {
    parser: Arc<Mutex<TokenParser>>,
    constraint: Arc<StructuredOutput>,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar")
            .field("kind", &self.constraint.kind())
            .finish()
    }
}

impl CompiledGrammar {
    /// What was compiled.
    pub fn constraint(&self) -> &StructuredOutput {
        &self.constraint
    }

    /// A fresh matcher at the start of the output.
    pub fn start(&self) -> SeqGrammar {
        let parser = self.parser.lock().deep_clone();
        SeqGrammar(Arc::new(Mutex::new(SeqMatcher {
            matcher: Matcher::new(Ok(parser)),
            pending: None,
        })))
    }
}

/// One sequence's matcher. After a step the engine thread hands it the
/// sampled token ([`SeqGrammar::defer`]); the grammar worker consumes that
/// token at the start of the sequence's next mask, while the next step
/// runs, so the engine thread does not spend its time between steps
/// advancing every constrained sequence (never both at once: the step waits
/// for its masks before its tokens come back).
#[derive(Clone)]
pub struct SeqGrammar(Arc<Mutex<SeqMatcher>>);

/// A matcher and the sampled token it has not consumed yet.
struct SeqMatcher {
    matcher: Matcher,
    /// A sampled token not consumed yet.
    pending: Option<u32>,
}

impl SeqMatcher {
    /// Consumes the pending token, if any.
    fn settle(&mut self) -> Advance {
        match self.pending.take() {
            Some(token) => self.consume(token),
            None => Advance::Continue,
        }
    }

    fn consume(&mut self, token: u32) -> Advance {
        let m = &mut self.matcher;
        if let Err(e) = m.consume_token(token) {
            // The first line says what failed; the rest is the parser's
            // state dump, not for the client.
            let e = e.to_string();
            let first = e.lines().next().unwrap_or_default();
            return Advance::Error(format!("structured output: {first}"));
        }
        if m.is_stopped() {
            Advance::Finished
        } else {
            Advance::Continue
        }
    }
}

impl std::fmt::Debug for SeqGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SeqGrammar")
    }
}

/// What advancing a matcher by one token gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advance {
    /// The grammar goes on.
    Continue,
    /// The grammar is complete: the sequence ends (`stop`).
    Finished,
    /// The token was not allowed or the matcher failed.
    Error(String),
}

impl SeqGrammar {
    /// Advances the matcher past the sampled `token` now (and past a token
    /// deferred before it).
    pub fn advance(&self, token: u32) -> Advance {
        let mut m = self.0.lock();
        match m.settle() {
            Advance::Continue => m.consume(token),
            ended => ended,
        }
    }

    /// Leaves the sampled `token` for the grammar worker to consume before
    /// it computes the next mask ([`ReadyMasks::advance`] says what that
    /// gave). A token still pending (its mask was never computed: no step
    /// sampled the sequence since) is consumed here first, and what that
    /// gave is returned.
    pub fn defer(&self, token: u32) -> Advance {
        let mut m = self.0.lock();
        let earlier = m.settle();
        if earlier == Advance::Continue {
            m.pending = Some(token);
        }
        earlier
    }

    /// Consumes the pending token, then computes the next mask; `Err` with
    /// what consuming gave where the grammar ended or broke there.
    fn next_mask(&self) -> Result<Option<SimpleVob>, Advance> {
        let mut m = self.0.lock();
        match m.settle() {
            Advance::Continue => Ok(m.matcher.compute_mask().ok()),
            ended => Err(ended),
        }
    }
}

/// The tokens one sequence may sample next.
#[derive(Debug, Clone)]
pub struct TokenMask(SimpleVob);

impl TokenMask {
    /// A mask that allows exactly `tokens` out of `vocab_size` (tests, benches).
    pub fn from_allowed(vocab_size: usize, tokens: &[u32]) -> Self {
        let mut v = SimpleVob::alloc(vocab_size);
        for &t in tokens {
            if (t as usize) < vocab_size {
                v.allow_token(t);
            }
        }
        Self(v)
    }

    /// Whether `token` may be sampled.
    pub fn is_allowed(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }

    /// Allowed tokens.
    pub fn num_allowed(&self) -> usize {
        self.0.num_set()
    }

    /// The `k`-th allowed token in id order (`k < num_allowed()`).
    pub fn nth_allowed(&self, mut k: usize) -> Option<u32> {
        for (w, &word) in self.0.as_slice().iter().enumerate() {
            let n = word.count_ones() as usize;
            if k >= n {
                k -= n;
                continue;
            }
            let mut word = word;
            for _ in 0..k {
                word &= word - 1;
            }
            return Some((w * 32) as u32 + word.trailing_zeros());
        }
        None
    }

    /// Sets the logit of every token the mask does not allow to -inf
    /// (logits past the mask's vocabulary too: padding rows of the
    /// embedding are never text).
    pub fn apply(&self, logits: &mut [f32]) {
        let words = self.0.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let word = words.get(w).copied().unwrap_or(0);
            if word == u32::MAX && chunk.len() == 32 {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if word & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// The masks of one step, filled by the grammar worker while the step runs.
#[derive(Debug, Default)]
pub struct StepMasks {
    state: Mutex<MaskState>,
    ready: Condvar,
}

#[derive(Debug, Default)]
struct MaskState {
    done: bool,
    /// One per slot ([`crate::ScheduledSeq::mask_slot`]); `None` where the
    /// matcher failed (the sequence then samples unconstrained and the
    /// scheduler ends it with the error when the token does not match), or
    /// where the previous token ended the grammar (`ended`).
    masks: Vec<Option<TokenMask>>,
    /// Slots whose previous token (deferred) completed or broke the
    /// grammar, with what it gave: the sequence ends there, and this step's
    /// token is not part of its output.
    ended: Vec<(u32, Advance)>,
    /// Host time the worker spent computing them.
    compute_time: Duration,
}

/// The masks of a step, once computed ([`StepMasks::wait`]).
pub struct ReadyMasks<'a>(parking_lot::MutexGuard<'a, MaskState>);

impl ReadyMasks<'_> {
    /// The mask of `slot`, if it was computed.
    pub fn get(&self, slot: usize) -> Option<&TokenMask> {
        self.0.masks.get(slot).and_then(Option::as_ref)
    }

    /// Host time the worker spent computing them.
    pub fn compute_time(&self) -> Duration {
        self.0.compute_time
    }

    /// What consuming `slot`'s deferred token gave ([`SeqGrammar::defer`]):
    /// `Finished` or `Error` where the grammar ended there.
    pub fn advance(&self, slot: usize) -> Advance {
        let ended = self.0.ended.iter().find(|(s, _)| *s as usize == slot);
        ended.map_or(Advance::Continue, |(_, a)| a.clone())
    }
}

impl StepMasks {
    /// Blocks until the worker has computed every mask of the step.
    pub fn wait(&self) -> ReadyMasks<'_> {
        let mut st = self.state.lock();
        while !st.done {
            self.ready.wait(&mut st);
        }
        ReadyMasks(st)
    }

    /// Masks already computed, published at once (tests and benches that
    /// drive an executor without a scheduler).
    pub fn ready(masks: Vec<Option<TokenMask>>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(MaskState {
                done: true,
                masks,
                ended: Vec::new(),
                compute_time: Duration::ZERO,
            }),
            ready: Condvar::new(),
        })
    }

    fn finish(
        &self,
        masks: Vec<Option<TokenMask>>,
        ended: Vec<(u32, Advance)>,
        compute_time: Duration,
    ) {
        let mut st = self.state.lock();
        st.masks = masks;
        st.ended = ended;
        st.compute_time = compute_time;
        st.done = true;
        self.ready.notify_all();
    }
}

type Job = (Arc<StepMasks>, Vec<SeqGrammar>);

/// Threads a grammar worker computes masks on by default: the machine's
/// cores, at most 8 (a step's masks are a few milliseconds of work split
/// across sequences; more threads than that mostly wait on each other).
pub fn default_grammar_threads() -> usize {
    std::thread::available_parallelism()
        .map(std::num::NonZeroUsize::get)
        .unwrap_or(1)
        .min(8)
}

/// A thread that computes a step's masks while the step runs (one per
/// engine core, started at its first constrained request), spreading the
/// sequences of a step over a small pool of its own.
#[derive(Debug)]
pub struct GrammarWorker {
    tx: Sender<Job>,
}

impl GrammarWorker {
    /// Starts the thread, computing each step's masks on
    /// [`default_grammar_threads`] threads.
    pub fn spawn(name: String) -> std::io::Result<Self> {
        Self::with_threads(name, default_grammar_threads())
    }

    /// Starts the thread, computing each step's masks on `threads` threads
    /// (1: one sequence after another on the worker thread itself).
    pub fn with_threads(name: String, threads: usize) -> std::io::Result<Self> {
        let pool = mask_pool(&name, threads)?;
        let (tx, rx) = channel::<Job>();
        std::thread::Builder::new().name(name).spawn(move || {
            // Woken by the engine thread, which still has a step to start.
            crate::thread_policy::run_as_batch();
            for (step, grammars) in rx {
                compute_guarded(&step, &grammars, pool.as_ref());
            }
        })?;
        Ok(Self { tx })
    }

    /// Computes the masks of `grammars` (in slot order) into a new
    /// [`StepMasks`], in the background.
    pub fn submit(&self, grammars: Vec<SeqGrammar>) -> Arc<StepMasks> {
        let step = Arc::new(StepMasks::default());
        if let Err(err) = self.tx.send((Arc::clone(&step), grammars)) {
            // The thread is gone: compute here rather than leave the
            // executor waiting forever.
            let (step, grammars) = err.0;
            compute_into(&step, &grammars, None);
            return step;
        }
        step
    }

    /// Computes the masks of `grammars` on this thread (when no worker
    /// thread could be started).
    pub fn compute_now(grammars: Vec<SeqGrammar>) -> Arc<StepMasks> {
        let step = Arc::new(StepMasks::default());
        compute_into(&step, &grammars, None);
        step
    }
}

/// The pool a worker spreads a step's sequences over; none for one thread.
fn mask_pool(name: &str, threads: usize) -> std::io::Result<Option<rayon::ThreadPool>> {
    if threads <= 1 {
        return Ok(None);
    }
    let prefix = name.to_owned();
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{prefix}-{i}"))
        .start_handler(|_| crate::thread_policy::run_as_batch())
        .build()
        .map(Some)
        .map_err(std::io::Error::other)
}

/// [`compute_into`], publishing no masks if it panics, so the executor
/// never waits for ever: the step's constrained sequences then sample
/// unconstrained and end with an error when their tokens break the grammar.
fn compute_guarded(step: &StepMasks, grammars: &[SeqGrammar], pool: Option<&rayon::ThreadPool>) {
    let run = std::panic::AssertUnwindSafe(|| compute_into(step, grammars, pool));
    if std::panic::catch_unwind(run).is_err() {
        tracing::error!("computing grammar masks panicked; the step samples unconstrained");
        step.finish(Vec::new(), Vec::new(), Duration::ZERO);
    }
}

/// Computes the masks of `grammars` into `step` (slot `i` is `grammars[i]`'s
/// mask) and publishes them: in parallel across sequences on `pool`, else
/// one after another. Each sequence's matcher has its own lock, so the
/// sequences never wait on each other.
fn compute_into(step: &StepMasks, grammars: &[SeqGrammar], pool: Option<&rayon::ThreadPool>) {
    use rayon::prelude::*;
    let t0 = Instant::now();
    let mask = |g: &SeqGrammar| g.next_mask().map(|m| m.map(TokenMask));
    let results: Vec<_> = match pool {
        // An indexed parallel collect keeps the input order: slot order.
        Some(pool) if grammars.len() > 1 => {
            pool.install(|| grammars.par_iter().map(mask).collect())
        }
        _ => grammars.iter().map(mask).collect(),
    };
    let mut ended = Vec::new();
    let masks = (results.into_iter().enumerate())
        .map(|(slot, r)| {
            r.unwrap_or_else(|advance| {
                ended.push((slot as u32, advance));
                None
            })
        })
        .collect();
    step.finish(masks, ended, t0.elapsed());
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Bytes 0..=255, then EOS (256); the structural-tag tests use it too.
    pub(crate) fn byte_compiler() -> GrammarCompiler {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"\xFF</s>".to_vec());
        GrammarCompiler::new(words, 256).expect("compiler")
    }

    fn run(g: &SeqGrammar, text: &str) -> Advance {
        let mut last = Advance::Continue;
        for b in text.bytes() {
            last = g.advance(u32::from(b));
            if last != Advance::Continue {
                return last;
            }
        }
        last
    }

    #[test]
    fn a_deferred_token_is_consumed_before_the_next_mask() {
        let c = byte_compiler();
        let choice = |words: &[&str]| {
            let words = words.iter().map(|w| w.to_string()).collect();
            c.compile(StructuredOutput::Choice(words))
                .expect("compiles")
                .start()
        };
        let g = choice(&["yes", "no"]);
        let mask = |g: &SeqGrammar| TokenMask(g.next_mask().ok().flatten().expect("mask"));
        assert_eq!(g.defer(u32::from(b'y')), Advance::Continue);
        let m = mask(&g);
        assert_eq!(
            (m.num_allowed(), m.nth_allowed(0)),
            (1, Some(u32::from(b'e')))
        );
        assert_eq!(g.defer(u32::from(b'e')), Advance::Continue);
        assert_eq!(mask(&g).nth_allowed(0), Some(u32::from(b's')));
        // The last letter completes the choice: the worker says so instead
        // of a mask.
        assert_eq!(g.defer(u32::from(b's')), Advance::Continue);
        assert_eq!(g.next_mask().err(), Some(Advance::Finished));

        // A token outside the grammar, deferred, breaks it at the next mask;
        // two deferred in a row (no mask between) are both consumed.
        let g = choice(&["yes"]);
        assert_eq!(g.defer(u32::from(b'y')), Advance::Continue);
        assert_eq!(g.defer(u32::from(b'x')), Advance::Continue);
        assert!(
            matches!(g.next_mask(), Err(Advance::Error(e)) if e.starts_with("structured output:"))
        );
        // advance() settles a deferred token first.
        let g = choice(&["no"]);
        assert_eq!(g.defer(u32::from(b'n')), Advance::Continue);
        assert_eq!(g.advance(u32::from(b'o')), Advance::Finished);
    }

    #[test]
    fn choice_allows_only_its_strings_and_finishes() {
        let c = byte_compiler();
        let g = c
            .compile(StructuredOutput::Choice(vec!["yes".into(), "no".into()]))
            .expect("compiles")
            .start();
        let m = TokenMask(g.next_mask().ok().flatten().expect("mask"));
        assert!(m.is_allowed(u32::from(b'y')) && m.is_allowed(u32::from(b'n')));
        assert_eq!(m.num_allowed(), 2);
        assert_eq!(m.nth_allowed(0), Some(u32::from(b'n')));
        assert_eq!(m.nth_allowed(1), Some(u32::from(b'y')));
        assert_eq!(run(&g, "ye"), Advance::Continue);
        // Nothing can follow `yes`: the grammar stops without waiting for EOS.
        assert_eq!(g.advance(u32::from(b's')), Advance::Finished);
        let g2 = c
            .compile(StructuredOutput::Choice(vec!["a.b".into()]))
            .expect("compiles")
            .start();
        assert!(
            matches!(run(&g2, "axb"), Advance::Error(_)),
            "`.` is literal"
        );
    }

    /// The same constraint twice is one compilation; matchers started from
    /// it are independent; the cache keeps at most its capacity.
    #[test]
    fn compiled_grammars_are_reused_and_bounded() {
        let c = byte_compiler();
        let rx = || StructuredOutput::Regex("[a-c]{3}".into());
        let a = c.compile(rx()).expect("compiles");
        let b = c.compile(rx()).expect("compiles");
        assert!(Arc::ptr_eq(&a.parser, &b.parser), "compiled once");
        let other = c.compile(StructuredOutput::Regex("[a-d]{3}".into()));
        assert!(!Arc::ptr_eq(&a.parser, &other.expect("compiles").parser));
        let (g1, g2) = (a.start(), b.start());
        assert_eq!(run(&g1, "ab"), Advance::Continue);
        assert_eq!(run(&g2, "c"), Advance::Continue);
        assert_eq!(g1.advance(u32::from(b'c')), Advance::Finished);
        assert_eq!(run(&g2, "ab"), Advance::Finished);
        for i in 0..GRAMMAR_CACHE_CAPACITY + 5 {
            c.compile(StructuredOutput::Regex(format!("x{{{i}}}")))
                .expect("compiles");
        }
        let cache = c.cache.lock();
        assert_eq!(cache.map.len(), GRAMMAR_CACHE_CAPACITY);
        assert_eq!(cache.order.len(), GRAMMAR_CACHE_CAPACITY);
        assert!(!cache.map.contains_key(&cache_key(&rx())), "oldest dropped");
        // Invalid constraints are not cached: each is an error again.
        drop(cache);
        assert!(c.compile(StructuredOutput::Regex("a(b".into())).is_err());
        assert!(c.compile(StructuredOutput::Regex("a(b".into())).is_err());
    }

    #[test]
    fn invalid_constraints_are_errors() {
        let c = byte_compiler();
        assert!(c.compile(StructuredOutput::Regex("a(b".into())).is_err());
        assert!(c.compile(StructuredOutput::Choice(vec![])).is_err());
        assert!(
            c.compile(StructuredOutput::Json(serde_json::json!({"type": "nope"})))
                .is_err()
        );
        assert!(
            c.compile(StructuredOutput::Grammar("start: undefined_rule".into()))
                .is_err()
        );
    }

    #[test]
    fn gbnf_grammars_are_read() {
        let c = byte_compiler();
        let gbnf = "root ::= word-pair\nword-pair ::= [a-b]{2} \"-\" (\"x\" | \"y\")";
        let g = c
            .compile(StructuredOutput::Grammar(gbnf.into()))
            .expect("compiles")
            .start();
        assert_eq!(run(&g, "ab-"), Advance::Continue);
        assert_eq!(g.advance(u32::from(b'y')), Advance::Finished);
    }

    /// Free text until a trigger, then the tag's JSON, then free text;
    /// a trigger cannot be followed by anything but a tag's begin.
    #[test]
    fn structural_tags_constrain_only_after_a_trigger() {
        let c = byte_compiler();
        let legacy = serde_json::json!({
            "type": "structural_tag",
            "structures": [{"begin": "<f=w>", "end": "</f>", "schema": {
                "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}],
            "triggers": ["<f="],
        });
        let g = c
            .compile(StructuredOutput::StructuralTag(legacy.clone()))
            .expect("compiles")
            .start();
        assert_eq!(
            run(&g, "any text, <f=w>{\"n\":12}</f> more"),
            Advance::Continue
        );
        let g = c
            .compile(StructuredOutput::StructuralTag(legacy))
            .expect("compiles")
            .start();
        assert!(
            matches!(run(&g, "x <f=v"), Advance::Error(_)),
            "only tags follow a trigger"
        );
        let g = c
            .compile(StructuredOutput::StructuralTag(serde_json::json!({"structures": [
                {"begin": "<f=w>", "end": "</f>", "schema": {"type": "integer"}}], "triggers": ["<f="]})))
            .expect("compiles")
            .start();
        assert!(
            matches!(run(&g, "<f=w>x"), Advance::Error(_)),
            "the schema holds"
        );
        // The newer form: a sequence with a tag of free text.
        let g = c
            .compile(StructuredOutput::StructuralTag(
                serde_json::json!({"format": {
                "type": "sequence", "elements": [
                    {"type": "const_string", "value": "A:"},
                    {"type": "tag", "begin": "<t>", "content": {"type": "any_text"}, "end": "</t>"},
                    {"type": "regex", "pattern": "[0-9]/"}]}}),
            ))
            .expect("compiles")
            .start();
        assert_eq!(run(&g, "A:<t>a</t"), Advance::Continue);
        assert!(matches!(run(&g, ">x"), Advance::Error(_)));
        // At least one triggered tag, and nothing after the first.
        let tag = serde_json::json!({"type": "tag", "begin": "<a>",
            "content": {"type": "json_schema", "json_schema": {"type": "integer"}}, "end": "</a>"});
        let once = serde_json::json!({"format": {"type": "triggered_tags", "triggers": ["<a"],
            "tags": [tag.clone()], "at_least_one": true, "stop_after_first": true}});
        let g = c
            .compile(StructuredOutput::StructuralTag(once))
            .expect("compiles")
            .start();
        assert_eq!(run(&g, "hi <a>12</a"), Advance::Continue);
        assert_eq!(g.advance(u32::from(b'>')), Advance::Finished);
        // Tags with a separator: only tags and separators.
        let list = serde_json::json!({"format": {"type": "tags_with_separator",
            "tags": [tag], "separator": ",", "at_least_one": true}});
        let g = c
            .compile(StructuredOutput::StructuralTag(list))
            .expect("compiles")
            .start();
        assert_eq!(run(&g, "<a>1</a>,<a>2</a>"), Advance::Continue);
        assert!(matches!(run(&g, " "), Advance::Error(_)));
        let invalid =
            serde_json::json!({"format": {"type": "json_schema", "json_schema": {"type": "nope"}}});
        assert!(c.compile(StructuredOutput::StructuralTag(invalid)).is_err());
    }

    #[test]
    fn json_object_starts_with_a_brace() {
        let c = byte_compiler();
        let g = c
            .compile(StructuredOutput::JsonObject)
            .expect("compiles")
            .start();
        let m = TokenMask(g.next_mask().ok().flatten().expect("mask"));
        assert_eq!(m.nth_allowed(0), Some(u32::from(b'{')));
        assert_eq!(m.num_allowed(), 1);
        assert_eq!(run(&g, r#"{"a":[1,2]"#), Advance::Continue);
        assert_eq!(g.advance(u32::from(b'}')), Advance::Finished);
    }

    #[test]
    fn apply_masks_logits_past_the_vocabulary_too() {
        let m = TokenMask::from_allowed(40, &[3, 33]);
        let mut logits = vec![1.0f32; 70];
        m.apply(&mut logits);
        let kept: Vec<usize> = (0..70).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(kept, vec![3, 33]);
    }

    #[test]
    fn worker_computes_masks_in_slot_order() {
        let c = byte_compiler();
        let w = GrammarWorker::spawn("grammar-test".into()).expect("thread");
        let a = c.compile(StructuredOutput::Regex("x+".into())).expect("ok");
        let b = c.compile(StructuredOutput::Regex("y".into())).expect("ok");
        let step = w.submit(vec![a.start(), b.start()]);
        let ready = step.wait();
        assert!(ready.get(0).expect("mask").is_allowed(u32::from(b'x')));
        assert!(!ready.get(0).expect("mask").is_allowed(u32::from(b'y')));
        assert!(ready.get(1).expect("mask").is_allowed(u32::from(b'y')));
        assert!(ready.get(2).is_none());
    }

    /// Many sequences over several grammars, each some way into its output,
    /// so that neighbouring slots have different masks.
    fn mixed_sequences(c: &GrammarCompiler, n: usize) -> Vec<SeqGrammar> {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"]
        });
        let kinds = [
            (StructuredOutput::Json(schema), r#"{"name":"abcdef"}"#),
            (StructuredOutput::Regex("[a-z]{3}[0-9]+".into()), "abc12345"),
            (
                StructuredOutput::Choice(vec!["alpha".into(), "beta".into(), "gamma".into()]),
                "gamma",
            ),
            (StructuredOutput::JsonObject, r#"{"a":[1,2,3]}"#),
            (
                StructuredOutput::Grammar("root ::= [a-b]{2} \"-\" (\"x\" | \"y\")".into()),
                "ab-x",
            ),
        ];
        let compiled: Vec<(CompiledGrammar, &str)> = kinds
            .into_iter()
            .map(|(k, text)| (c.compile(k).expect("compiles"), text))
            .collect();
        (0..n)
            .map(|i| {
                let (grammar, text) = &compiled[i % compiled.len()];
                let g = grammar.start();
                let prefix = &text[..(i / compiled.len()) % text.len()];
                assert_eq!(run(&g, prefix), Advance::Continue, "{prefix:?}");
                g
            })
            .collect()
    }

    fn bits(m: Option<&TokenMask>) -> Option<Vec<u32>> {
        m.map(|m| m.0.as_slice().to_vec())
    }

    #[test]
    fn parallel_masks_equal_serial_masks_in_slot_order() {
        let c = byte_compiler();
        let seqs = mixed_sequences(&c, 97);
        let serial = StepMasks::default();
        compute_into(&serial, &seqs, None);
        let serial = serial.wait();
        let distinct: std::collections::HashSet<_> =
            (0..seqs.len()).map(|i| bits(serial.get(i))).collect();
        assert!(distinct.len() > 10, "the sequences' masks differ");
        let pool = mask_pool("grammar-test", 4).expect("pool");
        let parallel = StepMasks::default();
        compute_into(&parallel, &seqs, pool.as_ref());
        let worker = GrammarWorker::with_threads("grammar-test".into(), 3).expect("thread");
        let submitted = worker.submit(seqs.clone());
        for step in [parallel.wait(), submitted.wait()] {
            for i in 0..seqs.len() {
                assert!(serial.get(i).is_some(), "slot {i} has a mask");
                assert_eq!(bits(step.get(i)), bits(serial.get(i)), "slot {i}");
            }
            assert!(step.get(seqs.len()).is_none());
        }
    }
}
