//! The recent requests the console lists: where it reads them
//! ([`RecentSource`]), and a ring for servers that keep none of their own
//! ([`RecentRing`], the proxy's).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use serde_json::Value;

/// How many finished requests the console keeps and shows.
pub const RECENT_CAPACITY: usize = 256;

/// Where the console reads the last finished requests.
pub trait RecentSource: Send + Sync {
    /// The requests numbered above `seq` (numbered from 1, oldest first),
    /// each as its JSON object (docs/console.md, `REQUEST`) without `seq`.
    fn after(&self, seq: u64) -> Vec<(u64, Value)>;
}

/// The last [`RECENT_CAPACITY`] finished requests, each pushed as its JSON
/// object once, when it finishes.
#[derive(Debug)]
pub struct RecentRing {
    entries: Mutex<(u64, VecDeque<(u64, Value)>)>,
}

impl Default for RecentRing {
    fn default() -> Self {
        Self {
            entries: Mutex::new((0, VecDeque::with_capacity(RECENT_CAPACITY))),
        }
    }
}

impl RecentRing {
    /// Adds a finished request, dropping the oldest past the capacity.
    pub fn push(&self, entry: Value) {
        let mut guard = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let (last, ring) = &mut *guard;
        *last += 1;
        if ring.len() == RECENT_CAPACITY {
            ring.pop_front();
        }
        ring.push_back((*last, entry));
    }
}

impl RecentSource for RecentRing {
    fn after(&self, seq: u64) -> Vec<(u64, Value)> {
        let guard = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        guard.1.iter().filter(|(n, _)| *n > seq).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_ring_numbers_keeps_the_newest_and_reads_after_a_seq() {
        let ring = RecentRing::default();
        for i in 0..RECENT_CAPACITY + 3 {
            ring.push(json!({"i": i}));
        }
        let all = ring.after(0);
        assert_eq!(all.len(), RECENT_CAPACITY);
        assert_eq!(all[0], (4, json!({"i": 3})));
        let last = RECENT_CAPACITY as u64 + 3;
        assert_eq!(ring.after(last - 1), vec![(last, json!({"i": last - 1}))]);
        assert!(ring.after(last).is_empty());
    }
}
