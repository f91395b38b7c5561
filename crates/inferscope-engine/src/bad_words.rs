//! vLLM's `bad_words`: token sequences a request must not generate. The
//! server tokenizes the words once, at validation; each sampling step then
//! bans the last token of every sequence whose other tokens the output has
//! just generated (a one-token sequence is always banned).

/// The token sequences of a request's `bad_words`, flattened.
///
/// The check reads only the last [`BadWords::context_len`] generated tokens,
/// which the scheduler hands the executor with each sampling step
/// ([`crate::ScheduledBatch::output_tail`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BadWords {
    /// All sequences' tokens, one after the other.
    ids: Vec<u32>,
    /// The end of each sequence in `ids` (exclusive).
    ends: Vec<usize>,
    /// Tokens in the longest sequence.
    longest: usize,
}

impl BadWords {
    /// The given sequences in order; empty ones are skipped (they ban nothing).
    pub fn new<I, S>(seqs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u32]>,
    {
        let mut out = Self::default();
        for s in seqs {
            let s = s.as_ref();
            if s.is_empty() {
                continue;
            }
            out.ids.extend_from_slice(s);
            out.ends.push(out.ids.len());
            out.longest = out.longest.max(s.len());
        }
        out
    }

    /// Whether nothing is banned.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Number of token sequences.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Tokens in all sequences together.
    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }

    /// How many of the latest generated tokens the check reads: one less
    /// than the longest sequence.
    pub fn context_len(&self) -> usize {
        self.longest.saturating_sub(1)
    }

    /// The sequences, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u32]> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.ids[a..b])
    }

    /// The tokens banned as the next one after `output`, the generated
    /// tokens so far or their last [`BadWords::context_len`] (vLLM's rule: a
    /// sequence's last token is banned when the output ends with the rest of
    /// it; the prompt never counts). May repeat a token; allocates nothing.
    pub fn banned<'a>(&'a self, output: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
        self.iter().filter_map(move |w| {
            let (&last, prefix) = w.split_last()?;
            output.ends_with(prefix).then_some(last)
        })
    }

    /// Whether `token` is banned as the next one after `output`.
    pub fn bans(&self, output: &[u32], token: u32) -> bool {
        self.banned(output).any(|t| t == token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-token word is banned from the start; a longer one only right
    /// after its prefix, never after a part of it or after a prefix that the
    /// output does not end with; the context is the longest prefix.
    #[test]
    fn bans_the_completion_of_a_prefix() {
        let bw = BadWords::new([vec![7], vec![], vec![1, 2, 3], vec![2, 4]]);
        assert_eq!(bw.len(), 3);
        assert_eq!(bw.num_tokens(), 6);
        assert_eq!(bw.context_len(), 2);
        let banned = |out: &[u32]| {
            let mut v: Vec<u32> = bw.banned(out).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(banned(&[]), [7]);
        assert_eq!(banned(&[2]), [4, 7]);
        assert_eq!(banned(&[1]), [7]);
        assert_eq!(banned(&[1, 2]), [3, 4, 7]);
        assert_eq!(banned(&[9, 1, 2]), [3, 4, 7]);
        assert_eq!(banned(&[1, 2, 9]), [7]);
        assert_eq!(banned(&[2, 1]), [7]);
        assert!(bw.bans(&[1, 2], 3));
        assert!(!bw.bans(&[5, 2], 3));
        assert!(BadWords::new(Vec::<Vec<u32>>::new()).is_empty());
        assert_eq!(
            bw.iter().collect::<Vec<_>>(),
            [&[7][..], &[1, 2, 3], &[2, 4]]
        );
    }
}
