//! Merging the symbols of a word into tokens, as llama.cpp does: BPE by
//! merge rank (GGUF `gpt2` and `gemma4` tokenizers,
//! `llm_tokenizer_bpe_session`) and SentencePiece by token score (`llama`,
//! `llm_tokenizer_spm_session`).
//!
//! Symbols are ranges of the word with a "piece" id: vocabulary strings keep
//! their token ids, other strings the merges name get ids after the
//! vocabulary, so a merge is one hash lookup on two integers.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// "No piece" / "no symbol".
pub(crate) const NONE: u32 = u32::MAX;

/// A fast non-cryptographic hasher for vocabulary strings and id pairs (the
/// keys come from the model file, not from requests).
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

const K: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(b));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(b) ^ ((rest.len() as u64) << 56));
        }
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(K);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Strings to piece ids: the vocabulary (the last token of a duplicated
/// text wins, as in llama.cpp's `token_to_id`), then merge parts and results
/// that are not tokens.
pub(crate) struct Pieces {
    ids: FastMap<Box<str>, u32>,
    n_vocab: u32,
    next: u32,
}

impl Pieces {
    /// The vocabulary's strings, in id order.
    pub(crate) fn new<'a>(tokens: impl ExactSizeIterator<Item = &'a str>) -> Self {
        let n = tokens.len() as u32;
        let mut ids = FastMap::default();
        ids.reserve(n as usize);
        for (i, t) in tokens.enumerate() {
            ids.insert(Box::from(t), i as u32);
        }
        Self {
            ids,
            n_vocab: n,
            next: n,
        }
    }

    /// The piece id of `s`, if the vocabulary or a merge names it.
    pub(crate) fn piece(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    /// The token id of `s` (llama.cpp's `text_to_token`).
    pub(crate) fn token(&self, s: &str) -> Option<u32> {
        self.piece(s).filter(|&p| p < self.n_vocab)
    }

    /// Whether piece `p` is a token.
    fn is_token(&self, p: u32) -> bool {
        p < self.n_vocab
    }

    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&p) = self.ids.get(s) {
            return p;
        }
        let p = self.next;
        self.next += 1;
        self.ids.insert(Box::from(s), p);
        p
    }
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the
/// others for code points from U+0100 on.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        out[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    out
}

/// A BPE vocabulary's merges.
pub(crate) struct Bpe {
    /// (left piece, right piece) → (rank, merged piece).
    merges: FastMap<(u32, u32), (u32, u32)>,
    /// Byte-level vocabularies: the piece of each byte's GPT-2 character.
    byte_pieces: Option<[u32; 256]>,
    /// The tokens a byte falls back to when a symbol is not a token: its
    /// GPT-2 character alone (byte-level) or `<0xXX>` (SentencePiece-style).
    byte_fallback: [u32; 256],
    /// Words that are whole tokens skip the merges.
    ignore_merges: bool,
    /// Words of newlines that are whole tokens skip the merges (Gemma 4).
    newline_words: bool,
}

/// One symbol of a word being merged.
#[derive(Clone, Copy)]
struct Symbol {
    piece: u32,
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// A candidate BPE merge: (rank, left symbol, right symbol, left piece,
/// right piece, merged piece); the smallest pops first (lowest rank, then
/// leftmost).
type BpeBigram = Reverse<(u32, u32, u32, u32, u32, u32)>;

/// Buffers reused across the words of one call.
#[derive(Default)]
pub(crate) struct Scratch {
    symbols: Vec<Symbol>,
    bpe_queue: BinaryHeap<BpeBigram>,
    spm_queue: BinaryHeap<SpmBigram>,
    word: String,
}

impl Bpe {
    /// Reads `merges` ("left right" strings, rank = position); the first of
    /// a duplicated pair wins (llama.cpp's `bpe_ranks.emplace`).
    pub(crate) fn new(
        pieces: &mut Pieces,
        merges: &[String],
        byte_level: bool,
        ignore_merges: bool,
        newline_words: bool,
    ) -> Self {
        let mut map: FastMap<(u32, u32), (u32, u32)> = FastMap::default();
        map.reserve(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let (l, r) = match m.as_bytes().iter().skip(1).position(|&b| b == b' ') {
                Some(i) => (&m[..i + 1], &m[i + 2..]),
                None => ("", ""),
            };
            let (li, ri) = (pieces.intern(l), pieces.intern(r));
            if map.contains_key(&(li, ri)) {
                continue;
            }
            joined.clear();
            joined.push_str(l);
            joined.push_str(r);
            let merged = pieces.intern(&joined);
            map.insert((li, ri), (rank as u32, merged));
        }
        let chars = byte_chars();
        let mut buf = [0u8; 4];
        let byte_pieces = byte_level
            .then(|| chars.map(|c| pieces.piece(c.encode_utf8(&mut buf)).unwrap_or(NONE)));
        let mut byte_fallback = [NONE; 256];
        for (b, t) in byte_fallback.iter_mut().enumerate() {
            *t = if byte_level {
                // llama.cpp looks up each byte of the symbol's GPT-2 text
                // alone: only the ASCII characters can be tokens.
                let c = chars[b];
                if c.is_ascii() {
                    pieces.token(c.encode_utf8(&mut buf)).unwrap_or(NONE)
                } else {
                    NONE
                }
            } else {
                pieces.token(&format!("<0x{b:02X}>")).unwrap_or(NONE)
            };
        }
        Self {
            merges: map,
            byte_pieces,
            byte_fallback,
            ignore_merges,
            newline_words,
        }
    }

    /// Merges one word (its bytes; for a byte-level vocabulary they stand
    /// for their GPT-2 characters) and appends its tokens to `out`.
    pub(crate) fn word(&self, pieces: &Pieces, word: &str, s: &mut Scratch, out: &mut Vec<u32>) {
        s.symbols.clear();
        s.bpe_queue.clear();
        if self.ignore_merges {
            let text: &str = match self.byte_pieces {
                Some(_) => {
                    let chars = BYTE_CHARS.get_or_init(byte_chars);
                    s.word.clear();
                    s.word.extend(word.bytes().map(|b| chars[b as usize]));
                    &s.word
                }
                None => word,
            };
            if let Some(t) = pieces.token(text) {
                out.push(t);
                return;
            }
        }
        if self.newline_words
            && word.bytes().all(|b| b == b'\n')
            && let Some(t) = pieces.token(word)
        {
            out.push(t);
            return;
        }
        match &self.byte_pieces {
            Some(bp) => {
                for (i, b) in word.bytes().enumerate() {
                    s.symbols.push(Symbol {
                        piece: bp[b as usize],
                        start: i as u32,
                        len: 1,
                        prev: (i as u32).wrapping_sub(1),
                        next: i as u32 + 1,
                    });
                }
            }
            None => {
                for (k, (i, c)) in word.char_indices().enumerate() {
                    let mut buf = [0u8; 4];
                    s.symbols.push(Symbol {
                        piece: pieces.piece(c.encode_utf8(&mut buf)).unwrap_or(NONE),
                        start: i as u32,
                        len: c.len_utf8() as u32,
                        prev: (k as u32).wrapping_sub(1),
                        next: k as u32 + 1,
                    });
                }
            }
        }
        let n = s.symbols.len() as u32;
        if let Some(last) = s.symbols.last_mut() {
            last.next = NONE;
        }
        for i in 1..n {
            self.push_pair(s, i - 1, i);
        }
        while let Some(Reverse((_, left, right, lp, rp, merged))) = s.bpe_queue.pop() {
            let (l, r) = (s.symbols[left as usize], s.symbols[right as usize]);
            // Outdated: one side was merged since.
            if l.len == 0 || r.len == 0 || l.piece != lp || r.piece != rp {
                continue;
            }
            let sym = &mut s.symbols[left as usize];
            sym.len += r.len;
            sym.piece = merged;
            sym.next = r.next;
            s.symbols[right as usize].len = 0;
            if r.next != NONE {
                s.symbols[r.next as usize].prev = left;
            }
            self.push_pair(s, l.prev, left);
            self.push_pair(s, left, r.next);
        }
        for sym in &s.symbols {
            if sym.len == 0 {
                continue;
            }
            if pieces.is_token(sym.piece) {
                out.push(sym.piece);
                continue;
            }
            let bytes = &word.as_bytes()[sym.start as usize..(sym.start + sym.len) as usize];
            out.extend(
                bytes
                    .iter()
                    .map(|&b| self.byte_fallback[b as usize])
                    .filter(|&t| t != NONE),
            );
        }
    }

    fn push_pair(&self, s: &mut Scratch, left: u32, right: u32) {
        if left == NONE || right == NONE {
            return;
        }
        let (lp, rp) = (
            s.symbols[left as usize].piece,
            s.symbols[right as usize].piece,
        );
        if lp == NONE || rp == NONE {
            return;
        }
        if let Some(&(rank, merged)) = self.merges.get(&(lp, rp)) {
            // Lowest rank first, then leftmost.
            s.bpe_queue
                .push(Reverse((rank, left, right, lp, rp, merged)));
        }
    }
}

static BYTE_CHARS: std::sync::OnceLock<[char; 256]> = std::sync::OnceLock::new();

/// A candidate SentencePiece merge: highest score first, then leftmost.
struct SpmBigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl PartialEq for SpmBigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for SpmBigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// Whether no string in `strings` has a character other than ▁ followed by
/// ▁. Then no merge can join the text on both sides of such a place, and
/// merging the text piece by piece between them gives the same tokens as
/// merging it whole (llama.cpp does the latter, with one priority queue for
/// the whole text, which is slow on long texts).
pub(crate) fn splits_before_spaces<'a>(mut strings: impl Iterator<Item = &'a str>) -> bool {
    !strings.any(|t| {
        let mut prev = None;
        t.chars().any(|c| {
            let inner = c == '\u{2581}' && prev.is_some_and(|p| p != '\u{2581}');
            prev = Some(c);
            inner
        })
    })
}

/// The pieces of `text` between the places a ▁ follows another character.
fn space_runs(text: &str) -> impl Iterator<Item = &str> {
    let mut start = 0;
    let mut prev_space = true;
    let mut cuts = text.char_indices().filter_map(move |(i, c)| {
        let space = c == '\u{2581}';
        let cut = space && !prev_space && i > 0;
        prev_space = space;
        cut.then_some(i)
    });
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let end = cuts.next().unwrap_or(text.len());
        let piece = &text[start..end];
        start = end;
        Some(piece)
    })
}

/// A SentencePiece vocabulary's merging: adjacent symbols whose
/// concatenation is a token merge, highest score first; symbols that are
/// not tokens become byte tokens (a byte without one becomes `unk`, where
/// llama.cpp throws).
pub(crate) struct Spm {
    /// Each token's score.
    pub(crate) scores: Vec<f32>,
    /// `<0xXX>` (or the byte itself) for each byte.
    pub(crate) byte_tokens: [u32; 256],
    pub(crate) unk: Option<u32>,
    /// Merge word by word ([`splits_before_spaces`]).
    pub(crate) split: bool,
}

impl Spm {
    /// Merges `text` (spaces already ▁) and appends its tokens to `out`.
    pub(crate) fn encode(&self, pieces: &Pieces, text: &str, s: &mut Scratch, out: &mut Vec<u32>) {
        if self.split {
            for part in space_runs(text) {
                self.merge(pieces, part, s, out);
            }
        } else {
            self.merge(pieces, text, s, out);
        }
    }

    fn merge(&self, pieces: &Pieces, text: &str, s: &mut Scratch, out: &mut Vec<u32>) {
        let (scores, byte_token, unk) = (&self.scores, &self.byte_tokens, self.unk);
        s.symbols.clear();
        s.spm_queue.clear();
        for (k, (i, c)) in text.char_indices().enumerate() {
            s.symbols.push(Symbol {
                piece: NONE,
                start: i as u32,
                len: c.len_utf8() as u32,
                prev: (k as u32).wrapping_sub(1),
                next: k as u32 + 1,
            });
        }
        if let Some(last) = s.symbols.last_mut() {
            last.next = NONE;
        }
        let try_pair = |s: &mut Scratch, left: u32, right: u32| {
            if left == NONE || right == NONE {
                return;
            }
            let (l, r) = (s.symbols[left as usize], s.symbols[right as usize]);
            let start = l.start as usize;
            let end = (r.start + r.len) as usize;
            if let Some(t) = pieces.token(&text[start..end]) {
                s.spm_queue.push(SpmBigram {
                    score: scores.get(t as usize).copied().unwrap_or(0.0),
                    left,
                    right,
                    size: (end - start) as u32,
                });
            }
        };
        for i in 1..s.symbols.len() as u32 {
            try_pair(s, i - 1, i);
        }
        while let Some(b) = s.spm_queue.pop() {
            let (l, r) = (s.symbols[b.left as usize], s.symbols[b.right as usize]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            let sym = &mut s.symbols[b.left as usize];
            sym.len += r.len;
            sym.next = r.next;
            s.symbols[b.right as usize].len = 0;
            if r.next != NONE {
                s.symbols[r.next as usize].prev = b.left;
            }
            try_pair(s, l.prev, b.left);
            try_pair(s, b.left, r.next);
        }
        for sym in &s.symbols {
            if sym.len == 0 {
                continue;
            }
            let piece = &text[sym.start as usize..(sym.start + sym.len) as usize];
            match pieces.token(piece) {
                Some(t) => out.push(t),
                None => out.extend(piece.bytes().filter_map(|b| {
                    let t = byte_token[b as usize];
                    if t != NONE { Some(t) } else { unk }
                })),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_gpt2s() {
        let c = byte_chars();
        assert_eq!(c[b'a' as usize], 'a');
        assert_eq!(c[b' ' as usize], 'Ġ');
        assert_eq!(c[b'\n' as usize], 'Ċ');
        assert_eq!(c[0], 'Ā');
        assert_eq!(c[0xA0], 'ł');
        assert_eq!(c[0xAD], 'Ń');
    }

    #[test]
    fn bpe_merges_lowest_rank_first() {
        let toks = ["a", "b", "c", "ab", "bc", "abc"];
        let mut p = Pieces::new(toks.iter().copied());
        // "b c" ranks before "a b": "abc" → a + bc, and no "a bc" merge.
        let bpe = Bpe::new(&mut p, &["b c".into(), "a b".into()], false, false, false);
        let (mut s, mut out) = (Scratch::default(), Vec::new());
        bpe.word(&p, "abc", &mut s, &mut out);
        assert_eq!(out, [0, 4]);
        out.clear();
        bpe.word(&p, "ab", &mut s, &mut out);
        assert_eq!(out, [3]);
    }

    #[test]
    fn spm_merges_highest_score_first_and_falls_back_to_bytes() {
        let toks = ["a", "b", "c", "ab", "bc", "<0x78>"];
        let p = Pieces::new(toks.iter().copied());
        let mut spm = Spm {
            scores: vec![0.0, 0.0, 0.0, -1.0, -2.0, 0.0],
            byte_tokens: [NONE; 256],
            unk: None,
            split: false,
        };
        spm.byte_tokens[b'x' as usize] = 5;
        let (mut s, mut out) = (Scratch::default(), Vec::new());
        spm.encode(&p, "abcx", &mut s, &mut out);
        assert_eq!(out, [3, 2, 5]);
    }

    #[test]
    fn spm_text_splits_where_a_space_follows_a_character() {
        let parts: Vec<&str> = space_runs("▁▁ab▁c▁▁d").collect();
        assert_eq!(parts, ["▁▁ab", "▁c", "▁▁d"]);
        assert_eq!(space_runs("").count(), 0);
        assert!(splits_before_spaces(["▁a", "▁▁", "b"].into_iter()));
        assert!(!splits_before_spaces(["▁a", "a▁b"].into_iter()));
    }
}
