//! BPE pre-tokenizers named by a GGUF file's `tokenizer.ggml.pre`: the text
//! is cut into words before merging, exactly as llama.cpp cuts it
//! (`llm_tokenizer_bpe` in `src/llama-vocab.cpp`, `unicode_regex_split` in
//! `src/unicode.cpp`).
//!
//! llama.cpp applies a list of regexes one after the other: each one splits
//! every fragment left by the previous one into its matches and the text
//! between them. Four regexes run through hand-written splitters there
//! (GPT-2's, Llama 3's, Qwen2's, Qwen3.5's), whose results differ from the
//! regexes in corner cases; they are ported here as written. The others run
//! through `fancy-regex` with llama.cpp's meaning of `\s` (see [`RegexStep`]).

use std::ops::Range;

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

use crate::error::ModelError;

/// Unicode classes of a code point, as llama.cpp's `unicode_cpt_flags`.
mod flag {
    pub const UNDEFINED: u16 = 1 << 0;
    pub const NUMBER: u16 = 1 << 1;
    pub const LETTER: u16 = 1 << 2;
    pub const SEPARATOR: u16 = 1 << 3;
    pub const MARK: u16 = 1 << 4;
    pub const PUNCTUATION: u16 = 1 << 5;
    pub const SYMBOL: u16 = 1 << 6;
    pub const CONTROL: u16 = 1 << 7;
    pub const WHITESPACE: u16 = 1 << 8;
}

/// The flags of `c`: its general category group (unassigned code points are
/// "undefined") and whether it is White_Space. Never 0 for a real character,
/// which the splitters rely on: 0 means "outside the fragment".
fn flags_of(c: char) -> u16 {
    use GeneralCategory as G;
    let cat = match c.general_category() {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter => flag::LETTER,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => flag::MARK,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => flag::NUMBER,
        G::ConnectorPunctuation
        | G::DashPunctuation
        | G::OpenPunctuation
        | G::ClosePunctuation
        | G::InitialPunctuation
        | G::FinalPunctuation
        | G::OtherPunctuation => flag::PUNCTUATION,
        G::MathSymbol | G::CurrencySymbol | G::ModifierSymbol | G::OtherSymbol => flag::SYMBOL,
        G::SpaceSeparator | G::LineSeparator | G::ParagraphSeparator => flag::SEPARATOR,
        G::Unassigned => flag::UNDEFINED,
        _ => flag::CONTROL,
    };
    // char::is_whitespace is exactly Unicode's White_Space, llama.cpp's list.
    cat | if c.is_whitespace() {
        flag::WHITESPACE
    } else {
        0
    }
}

/// One splitting pass of a pre-tokenizer.
enum Step {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    /// (llama.cpp's `unicode_regex_split_custom_gpt2`).
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// and its variants (`unicode_regex_split_custom_llama3`, `_qwen2`, `_qwen35`).
    Llama3(Llama3Variant),
    /// `[^\n]+|[\n]+` (`unicode_regex_split_custom_newlines`).
    Newlines,
    /// Any other regex.
    Regex(RegexStep),
}

/// What distinguishes Qwen2's and Qwen3.5's splitters from Llama 3's.
#[derive(Clone, Copy)]
struct Llama3Variant {
    /// Digits in runs of up to three (`\p{N}{1,3}`) or one by one (`\p{N}`).
    digit_run: usize,
    /// Letter runs also take combining marks (`[\p{L}\p{M}]+`, Qwen3.5).
    marks: bool,
}

const LLAMA3: Llama3Variant = Llama3Variant {
    digit_run: 3,
    marks: false,
};
const QWEN2: Llama3Variant = Llama3Variant {
    digit_run: 1,
    marks: false,
};
const QWEN35: Llama3Variant = Llama3Variant {
    digit_run: 1,
    marks: true,
};

/// A regex run through `fancy-regex`.
///
/// llama.cpp runs a regex with `\p{..}` classes over a "collapsed" text in
/// which every non-ASCII code point stands for its class, and one without
/// over the code points, non-ASCII whitespace replaced by `\v`. Both mean
/// that `\s` is Unicode White_Space, as in Rust's regex; the second one also
/// means that a non-ASCII whitespace character never matches a literal in a
/// character class (`[　-。]` in deepseek-llm's), so such regexes see a view
/// of the text with those characters replaced by `\v` ([`TextView`]).
struct RegexStep {
    re: fancy_regex::Regex,
    /// Whether the regex sees non-ASCII whitespace as `\v`.
    ascii_ws: bool,
}

/// How llama.cpp's `llm_tokenizer_bpe` treats a pre-tokenizer type.
pub(crate) struct PreTokenizer {
    /// The `tokenizer.ggml.pre` name.
    pub(crate) name: String,
    steps: Vec<Step>,
    /// Words that are whole tokens skip the merges (Llama 3 and the like).
    pub(crate) ignore_merges: bool,
    /// BOS is prepended unless the file says otherwise.
    pub(crate) add_bos: bool,
}

/// The regexes of llama.cpp's `default` pre-tokenizer type.
const DEFAULT_STEPS: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|]+",
    GPT2_RE,
    r"\p{N}+",
    "[0-9][0-9][0-9]",
];
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_RE: &str = "<llama3>";
const QWEN2_RE: &str = "<qwen2>";
const QWEN35_RE: &str = "<qwen35>";
const NEWLINES_RE: &str = "<newlines>";
const CJK_RE: &str = "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+";

/// Pre-tokenizer types: llama.cpp's names for them, their regexes (the
/// hand-written splitters by name), whether merges are skipped for whole
/// tokens and whether BOS is added by default.
const PRE_TYPES: &[(&[&str], &[&str], bool, bool)] = &[
    (&["default"], DEFAULT_STEPS, false, false),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        &[LLAMA3_RE],
        true,
        true,
    ),
    (&["dbrx", "smaug-bpe"], &[LLAMA3_RE], false, false),
    (
        &["deepseek-llm"],
        &[
            "[\r\n]",
            "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
            "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
            "\\s+$",
            CJK_RE,
            r"\p{N}+",
        ],
        false,
        false,
    ),
    (
        &["deepseek-coder"],
        &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_RE, r"\p{N}"],
        false,
        false,
    ),
    (
        &["falcon"],
        &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, "[0-9][0-9][0-9]"],
        false,
        false,
    ),
    (
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        &[r"\p{N}", GPT2_RE],
        false,
        false,
    ),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
            "trillion",
            "granite-docling",
        ],
        &[GPT2_RE],
        false,
        false,
    ),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
        ],
        &[QWEN2_RE],
        false,
        false,
    ),
    (&["qwen35"], &[QWEN35_RE], false, false),
    (
        &["poro-chat", "bloom", "gpt3-finnish"],
        &[" ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+"],
        false,
        false,
    ),
    (
        &["viking"],
        &[
            " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+",
            r"\p{N}",
        ],
        false,
        false,
    ),
    // The `gemma4` tokenizer model: spaces become ▁ and only newlines split.
    (&["gemma4"], &[NEWLINES_RE], false, true),
];

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for `name`; an unknown name is an
    /// error naming it and the supported ones (llama.cpp refuses it too).
    pub(crate) fn by_name(name: &str) -> Result<Self, ModelError> {
        let Some((_, regexes, ignore_merges, add_bos)) =
            PRE_TYPES.iter().find(|(names, ..)| names.contains(&name))
        else {
            return Err(ModelError::Tokenizer(format!(
                "GGUF tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = {name:?} (supported: {})",
                Self::supported_names().join(", ")
            )));
        };
        let steps = regexes
            .iter()
            .map(|r| Step::compile(r))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            name: name.to_string(),
            steps,
            ignore_merges: *ignore_merges,
            add_bos: *add_bos,
        })
    }

    /// Every `tokenizer.ggml.pre` name [`PreTokenizer::by_name`] accepts.
    pub(crate) fn supported_names() -> Vec<&'static str> {
        PRE_TYPES
            .iter()
            .flat_map(|(names, ..)| names.iter().copied())
            .collect()
    }

    /// Cuts `text` into words; appends their byte ranges to `words`.
    pub(crate) fn split(&self, text: &str, words: &mut Vec<Range<usize>>) {
        if text.is_empty() {
            return;
        }
        let cps = Codepoints::new(text);
        // Word boundaries as code point indices: each word ends at one.
        let mut ends = vec![cps.len()];
        let mut next = Vec::with_capacity(text.len() / 3 + 1);
        let mut view = None;
        for step in &self.steps {
            next.clear();
            let mut start = 0;
            for &end in &ends {
                match step {
                    Step::Gpt2 => split_gpt2(&cps, start, end, &mut next),
                    Step::Llama3(v) => split_llama3(&cps, *v, start, end, &mut next),
                    Step::Newlines => split_newlines(&cps, start, end, &mut next),
                    Step::Regex(r) => {
                        let v: &TextView = if r.ascii_ws {
                            view.get_or_insert_with(|| TextView::ascii_ws(text, &cps))
                        } else {
                            &TextView::Same
                        };
                        r.split(text, v, &cps, start, end, &mut next)
                    }
                }
                start = end;
            }
            std::mem::swap(&mut ends, &mut next);
        }
        let mut start = 0;
        for &end in &ends {
            words.push(cps.byte(start)..cps.byte(end));
            start = end;
        }
    }
}

impl Step {
    fn compile(re: &str) -> Result<Self, ModelError> {
        Ok(match re {
            GPT2_RE => Step::Gpt2,
            LLAMA3_RE => Step::Llama3(LLAMA3),
            QWEN2_RE => Step::Llama3(QWEN2),
            QWEN35_RE => Step::Llama3(QWEN35),
            NEWLINES_RE => Step::Newlines,
            _ => Step::Regex(RegexStep {
                re: fancy_regex::Regex::new(re).map_err(|e| {
                    ModelError::Tokenizer(format!("pre-tokenizer regex {re:?}: {e}"))
                })?,
                ascii_ws: !re.contains(r"\p{"),
            }),
        })
    }
}

/// The code points of a text with their flags and byte offsets.
struct Codepoints {
    cps: Vec<char>,
    flags: Vec<u16>,
    /// Byte offset of each code point, and the text's length last.
    offsets: Vec<usize>,
}

impl Codepoints {
    fn new(text: &str) -> Self {
        let n = text.len();
        let mut cps = Vec::with_capacity(n);
        let mut flags = Vec::with_capacity(n);
        let mut offsets = Vec::with_capacity(n + 1);
        for (i, c) in text.char_indices() {
            cps.push(c);
            flags.push(if c.is_ascii() {
                ASCII_FLAGS[c as usize]
            } else {
                flags_of(c)
            });
            offsets.push(i);
        }
        offsets.push(n);
        Self {
            cps,
            flags,
            offsets,
        }
    }

    fn len(&self) -> usize {
        self.cps.len()
    }

    fn byte(&self, cp: usize) -> usize {
        self.offsets[cp]
    }
}

/// The flags of the ASCII characters, computed once.
static ASCII_FLAGS: std::sync::LazyLock<[u16; 128]> = std::sync::LazyLock::new(|| {
    let mut t = [0; 128];
    for (i, f) in t.iter_mut().enumerate() {
        *f = flags_of(i as u8 as char);
    }
    t
});

/// The text a [`RegexStep`] searches.
enum TextView {
    /// The text itself.
    Same,
    /// The text with non-ASCII whitespace replaced by `\v`, and the byte
    /// offset of each code point in it.
    Replaced { text: String, offsets: Vec<usize> },
}

impl TextView {
    fn ascii_ws(text: &str, cps: &Codepoints) -> Self {
        let has = cps
            .cps
            .iter()
            .zip(&cps.flags)
            .any(|(c, f)| !c.is_ascii() && f & flag::WHITESPACE != 0);
        if !has {
            return TextView::Same;
        }
        let mut out = String::with_capacity(text.len());
        let mut offsets = Vec::with_capacity(cps.len() + 1);
        for (c, f) in cps.cps.iter().zip(&cps.flags) {
            offsets.push(out.len());
            out.push(if !c.is_ascii() && f & flag::WHITESPACE != 0 {
                '\x0B'
            } else {
                *c
            });
        }
        offsets.push(out.len());
        TextView::Replaced { text: out, offsets }
    }
}

impl RegexStep {
    /// Splits code points `start..end` into matches and the gaps between them.
    fn split(
        &self,
        text: &str,
        view: &TextView,
        cps: &Codepoints,
        start: usize,
        end: usize,
        out: &mut Vec<usize>,
    ) {
        let (hay, offsets): (&str, &[usize]) = match view {
            TextView::Same => (text, &cps.offsets),
            TextView::Replaced { text, offsets } => (text, offsets),
        };
        let (b0, b1) = (offsets[start], offsets[end]);
        let to_cp = |b: usize| offsets.partition_point(|&o| o < b0 + b);
        let mut last = start;
        // The fragment alone: `$` and lookaheads end where it ends.
        for m in self.re.find_iter(&hay[b0..b1]) {
            // A regex error here is a backtracking limit: keep the rest whole.
            let Ok(m) = m else { break };
            let (s, e) = (to_cp(m.start()), to_cp(m.end()));
            if s > last {
                out.push(s);
            }
            if e > s {
                out.push(e);
            }
            last = e;
        }
        if last < end {
            out.push(end);
        }
    }
}

/// Reads code points and flags inside one fragment: outside it, the code
/// point is "none" and the flags are 0.
struct Fragment<'a> {
    cps: &'a [char],
    flags: &'a [u16],
    end: usize,
    /// Where the next word starts.
    prev_end: usize,
}

impl<'a> Fragment<'a> {
    fn new(cps: &'a Codepoints, start: usize, end: usize) -> Self {
        Self {
            cps: &cps.cps,
            flags: &cps.flags,
            end,
            prev_end: start,
        }
    }

    fn cpt(&self, pos: usize) -> Option<char> {
        (pos < self.end).then(|| self.cps[pos])
    }

    fn flags(&self, pos: usize) -> u16 {
        if pos < self.end { self.flags[pos] } else { 0 }
    }

    /// Where the last alternatives of the GPT-2 and Llama 3 splitters end a
    /// word starting at `pos`, `nws` whitespace characters ahead:
    /// `\s+(?!\S)` (all but the last of a run followed by more text), else
    /// `\s+`, else one character.
    fn whitespace_or_one(&self, pos: usize, nws: usize) -> usize {
        if nws > 1 && self.cpt(pos + nws).is_some() {
            pos + nws - 1
        } else if nws > 0 {
            pos + nws
        } else {
            pos + 1
        }
    }

    /// Ends a word at `end` (nothing if empty); returns its length.
    fn add(&mut self, end: usize, out: &mut Vec<usize>) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            out.push(end);
        }
        self.prev_end = end;
        len
    }

    /// The length of a contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`,
    /// `'d`; case-insensitive if `fold`) at `pos`, or 0.
    fn contraction(&self, pos: usize, fold: bool) -> usize {
        if self.cpt(pos) != Some('\'') || pos + 1 >= self.end {
            return 0;
        }
        let low = |c: char| if fold { c.to_ascii_lowercase() } else { c };
        let next = low(self.cps[pos + 1]);
        if matches!(next, 's' | 't' | 'm' | 'd') {
            return 2;
        }
        if pos + 2 < self.end {
            let next2 = low(self.cps[pos + 2]);
            if matches!((next, next2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                return 3;
            }
        }
        0
    }
}

const WLN: u16 = flag::WHITESPACE | flag::LETTER | flag::NUMBER;

/// llama.cpp's `unicode_regex_split_custom_gpt2`.
fn split_gpt2(cps: &Codepoints, start: usize, end: usize, out: &mut Vec<usize>) {
    let mut f = Fragment::new(cps, start, end);
    let mut pos = start;
    'next: while pos < end {
        let cpt = cps.cps[pos];
        let n = f.contraction(pos, false);
        if n > 0 {
            pos += f.add(pos + n, out);
            continue;
        }
        let space = usize::from(cpt == ' ');
        let flags2 = if cpt == ' ' {
            f.flags(pos + 1)
        } else {
            f.flags(pos)
        };
        // <space>?\p{L}+ | <space>?\p{N}+ | <space>?[^\s\p{L}\p{N}]+
        let classes: [fn(u16) -> bool; 3] = [
            |fl| fl & flag::LETTER != 0,
            |fl| fl & flag::NUMBER != 0,
            |fl| fl & WLN == 0 && fl != 0,
        ];
        for is in classes {
            if is(flags2) {
                pos += space;
                while is(f.flags(pos)) {
                    pos += 1;
                }
                f.add(pos, out);
                continue 'next;
            }
        }
        let mut nws = 0;
        while f.flags(pos + nws) & flag::WHITESPACE != 0 {
            nws += 1;
        }
        pos = f.whitespace_or_one(pos, nws);
        f.add(pos, out);
    }
}

/// llama.cpp's `unicode_regex_split_custom_llama3` (and `_qwen2`, `_qwen35`).
fn split_llama3(
    cps: &Codepoints,
    v: Llama3Variant,
    start: usize,
    end: usize,
    out: &mut Vec<usize>,
) {
    let mut f = Fragment::new(cps, start, end);
    let word = if v.marks {
        flag::LETTER | flag::MARK
    } else {
        flag::LETTER
    };
    // [^\s\p{L}\p{N}] (Qwen3.5: [^\s\p{L}\p{M}\p{N}])
    let other = WLN | if v.marks { flag::MARK } else { 0 };
    let is_crlf = |c: Option<char>| matches!(c, Some('\r' | '\n'));
    let mut pos = start;
    while pos < end {
        let cpt = cps.cps[pos];
        let flags = f.flags(pos);
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        let n = f.contraction(pos, true);
        if n > 0 {
            pos += f.add(pos + n, out);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+ (Qwen3.5: [\p{L}\p{M}]+)
        if !(cpt == '\r' || cpt == '\n' || flags & flag::NUMBER != 0)
            && (flags & word != 0 || f.flags(pos + 1) & word != 0)
        {
            pos += 1;
            while f.flags(pos) & word != 0 {
                pos += 1;
            }
            f.add(pos, out);
            continue;
        }
        // \p{N}{1,3} (Qwen: \p{N})
        if flags & flag::NUMBER != 0 {
            let mut ini = pos;
            while f.flags(pos) & flag::NUMBER != 0 {
                pos += 1;
                if pos - ini >= v.digit_run {
                    f.add(pos, out);
                    ini = pos;
                }
            }
            f.add(pos, out);
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests the first code
        // point's flags for "inside the fragment", not the one after the space)
        let mut flags2 = if cpt == ' ' { f.flags(pos + 1) } else { flags };
        if flags2 & other == 0 && flags != 0 {
            pos += usize::from(cpt == ' ');
            while flags2 & other == 0 && flags2 != 0 {
                pos += 1;
                flags2 = f.flags(pos);
            }
            while is_crlf(f.cpt(pos)) {
                pos += 1;
            }
            f.add(pos, out);
            continue;
        }
        let mut nws = 0;
        let mut last_crlf_end = 0;
        while f.flags(pos + nws) & flag::WHITESPACE != 0 {
            if is_crlf(f.cpt(pos + nws)) {
                last_crlf_end = pos + nws + 1;
            }
            nws += 1;
        }
        // \s*[\r\n]+
        if last_crlf_end > 0 {
            pos = last_crlf_end;
            f.add(pos, out);
            continue;
        }
        pos = f.whitespace_or_one(pos, nws);
        f.add(pos, out);
    }
}

/// llama.cpp's `unicode_regex_split_custom_newlines`: runs of `\n` and runs
/// of anything else.
fn split_newlines(cps: &Codepoints, start: usize, end: usize, out: &mut Vec<usize>) {
    let mut pos = start;
    while pos < end {
        let nl = cps.cps[pos] == '\n';
        while pos < end && (cps.cps[pos] == '\n') == nl {
            pos += 1;
        }
        out.push(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::by_name(pre).unwrap();
        let mut w = Vec::new();
        p.split(text, &mut w);
        w.into_iter().map(|r| text[r].to_string()).collect()
    }

    #[test]
    fn gpt2_splits_words_contractions_and_spaces() {
        assert_eq!(
            words("gpt-2", "Hello world's  3.5 ok\n\n"),
            ["Hello", " world", "'s", " ", " 3", ".", "5", " ok", "\n\n"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_newlines() {
        assert_eq!(
            words("llama-bpe", "1234567 I'M here\n\n  x"),
            ["123", "456", "7", " I", "'M", " here", "\n\n", " ", " x"]
        );
        assert_eq!(words("qwen2", "1234"), ["1", "2", "3", "4"]);
    }

    #[test]
    fn qwen35_keeps_combining_marks_in_words() {
        // "e" + U+0301 COMBINING ACUTE ACCENT: one word for qwen35, two for qwen2.
        assert_eq!(words("qwen35", "cafe\u{301}!"), ["cafe\u{301}", "!"]);
        assert_eq!(words("qwen2", "cafe\u{301}!"), ["cafe", "\u{301}!"]);
    }

    #[test]
    fn regex_steps_apply_one_after_the_other() {
        // default: punctuation runs first, then GPT-2, then digit runs, then
        // groups of three ASCII digits.
        assert_eq!(
            words("default", "ab,c 12345"),
            ["ab", ",", "c", " ", "123", "45"]
        );
        // starcoder: every digit alone, then GPT-2 on the rest.
        assert_eq!(words("starcoder", "x 42"), ["x", " ", "4", "2"]);
    }

    #[test]
    fn non_ascii_whitespace_is_not_a_class_literal() {
        // deepseek-llm's punctuation class lists U+3000..U+3002, but llama.cpp
        // sees U+3000 (a space) as \v: it does not join the "!" before it
        // (it starts the next word as `\s?`).
        assert_eq!(
            words("deepseek-llm", "a!\u{3000}!"),
            ["a", "!", "\u{3000}!"]
        );
    }

    #[test]
    fn unknown_name_is_refused_with_the_list() {
        let e = PreTokenizer::by_name("no-such-pre")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("\"no-such-pre\"") && e.contains("llama-bpe"),
            "{e}"
        );
    }
}
