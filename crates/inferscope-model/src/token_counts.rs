//! Per-sequence token counts, the input of the presence, frequency and
//! repetition penalties, kept incrementally as the sequence's tokens pass
//! through the executor's batches.

use std::collections::HashMap;

use inferscope_engine::{ScheduledBatch, ScheduledSeq};

/// How one token id occurs in a sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCount {
    /// Times it occurs among the generated tokens.
    pub output: u32,
    /// Whether it occurs in the prompt.
    pub in_prompt: bool,
}

/// The distinct tokens of one sequence (prompt and output) with their
/// counts. Each position is counted once: a recompute after a preemption
/// feeds positions already counted, which are skipped.
#[derive(Debug, Clone, Default)]
pub struct TokenCounts {
    num_prompt_tokens: usize,
    /// Positions `0..counted` are counted.
    counted: usize,
    counts: HashMap<u32, TokenCount>,
}

/// A batch skipped positions of a sequence that no earlier batch carried:
/// the counts would be wrong, so the step fails instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token counts cover positions up to {counted} but the batch starts at {start}")]
pub struct CountGap {
    /// Positions counted so far.
    pub counted: usize,
    /// The first position the batch carried.
    pub start: usize,
}

impl TokenCounts {
    /// Empty counts for a sequence whose first `num_prompt_tokens` positions
    /// are its prompt.
    pub fn new(num_prompt_tokens: usize) -> Self {
        Self {
            num_prompt_tokens,
            ..Self::default()
        }
    }

    /// Counts `tokens`, which sit at positions `start..start + tokens.len()`;
    /// positions already counted are skipped.
    pub fn extend(
        &mut self,
        start: usize,
        tokens: impl IntoIterator<Item = u32>,
    ) -> Result<(), CountGap> {
        if start > self.counted {
            return Err(CountGap {
                counted: self.counted,
                start,
            });
        }
        for (pos, t) in (start..).zip(tokens) {
            if pos < self.counted {
                continue;
            }
            let c = self.counts.entry(t).or_default();
            if pos < self.num_prompt_tokens {
                c.in_prompt = true;
            } else {
                c.output += 1;
            }
            self.counted = pos + 1;
        }
        Ok(())
    }

    /// Counts what `batch` carries for `seq`: the history it skipped past,
    /// then its new tokens.
    pub fn extend_from_batch(
        &mut self,
        batch: &ScheduledBatch,
        seq: &ScheduledSeq,
    ) -> Result<(), CountGap> {
        let history = batch.history(seq);
        let start = seq.start_pos.saturating_sub(history.len());
        let tokens = history.iter().chain(batch.tokens(seq)).copied();
        self.extend(start, tokens)
    }

    /// Every distinct token of the sequence with its counts, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, TokenCount)> + '_ {
        self.counts.iter().map(|(&t, &c)| (t, c))
    }

    /// Positions counted.
    pub fn len(&self) -> usize {
        self.counted
    }

    /// Whether nothing is counted yet.
    pub fn is_empty(&self) -> bool {
        self.counted == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(c: &TokenCounts) -> Vec<(u32, u32, bool)> {
        let mut v: Vec<_> = c.iter().map(|(t, c)| (t, c.output, c.in_prompt)).collect();
        v.sort_unstable();
        v
    }

    /// Prompt tokens are flagged, output tokens counted; a recompute that
    /// feeds the same positions again (preemption) changes nothing, and a
    /// gap is refused.
    #[test]
    fn counts_each_position_once() {
        let mut c = TokenCounts::new(3);
        // Prompt [5, 6, 5] in two chunks, then outputs 6, 7, 6.
        c.extend(0, [5, 6]).unwrap();
        c.extend(2, [5]).unwrap();
        c.extend(3, [6]).unwrap();
        c.extend(4, [7]).unwrap();
        c.extend(5, [6]).unwrap();
        let want = vec![(5, 0, true), (6, 2, true), (7, 1, false)];
        assert_eq!(sorted(&c), want);
        assert_eq!(c.len(), 6);
        // Recompute of everything after a preemption.
        c.extend(0, [5, 6, 5, 6, 7, 6]).unwrap();
        assert_eq!(sorted(&c), want);
        // A recompute that overlaps and goes one further.
        c.extend(4, [7, 6, 9]).unwrap();
        assert_eq!(sorted(&c)[3], (9, 1, false));
        assert_eq!(
            c.extend(9, [1]),
            Err(CountGap {
                counted: 7,
                start: 9
            })
        );
    }

    /// The history a batch carries for a prefix-cache hit is counted as the
    /// positions before the new tokens.
    #[test]
    fn batch_history_fills_the_prefix() {
        let mut batch = ScheduledBatch {
            token_ids: vec![8, 9],
            history_token_ids: vec![1, 2, 3, 4],
            ..ScheduledBatch::default()
        };
        let mut seq = ScheduledSeq::for_test(1, 4, 2, 0);
        seq.history = inferscope_engine::SeqHistory {
            num_prompt_tokens: 5,
            offset: 0,
            len: 4,
            ..Default::default()
        };
        let mut c = TokenCounts::new(5);
        c.extend_from_batch(&batch, &seq).unwrap();
        assert_eq!(
            sorted(&c),
            vec![
                (1, 0, true),
                (2, 0, true),
                (3, 0, true),
                (4, 0, true),
                (8, 0, true),
                (9, 1, false)
            ]
        );
        // Without the history the same step is a gap.
        batch.history_token_ids.clear();
        seq.history.len = 0;
        assert!(TokenCounts::new(5).extend_from_batch(&batch, &seq).is_err());
    }
}
