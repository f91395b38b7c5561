//! The paged KV block pool with prefix caching.
//!
//! Blocks are reference-counted. A full block whose tokens are computed gets
//! a hash chained over its parent's hash and its own token ids, and is
//! entered in the prefix cache. When its last reference goes, it joins the
//! free list but keeps its hash, so a later request with the same prefix can
//! take it back; the free list is ordered least recently freed first, which
//! makes allocation evict cached blocks in LRU order.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

pub use crate::kv_events::BlockHash;
use crate::kv_events::{EventLog, KvEvent};
use crate::kv_residency::ResidencyTracker;

/// Marks "no block" in the intrusive free list.
const NIL: u32 = u32::MAX;

/// Hash of a full block, chained over the parent block's hash.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    // SipHash keyed at random once per process: the same content hashes the
    // same in every engine core, but nobody can craft prompts offline whose
    // blocks collide with another tenant's cached blocks.
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut h = KEYS
        .get_or_init(std::collections::hash_map::RandomState::new)
        .build_hasher();
    h.write_u64(parent.unwrap_or(0x9e37_79b9_7f4a_7c15));
    for &t in tokens {
        h.write_u32(t);
    }
    h.finish()
}

#[derive(Debug, Clone)]
struct Block {
    ref_count: u32,
    hash: Option<BlockHash>,
    /// Neighbours in the free list (NIL when not free or at an end).
    prev: u32,
    next: u32,
    in_free_list: bool,
}

/// Counters of prefix-cache lookups, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheCounts {
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Of those, tokens found.
    pub hits: u64,
}

/// A fixed set of KV blocks, their reference counts and the prefix cache.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    free_head: u32,
    free_tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, u32, foldhash::fast::RandomState>,
    enable_prefix_caching: bool,
    counts: PrefixCacheCounts,
    /// Sampled residency timing (`--kv-cache-metrics`); `None` when off.
    residency: Option<Box<ResidencyTracker>>,
    /// KV-cache events since the last take (only when events are on).
    events: Option<EventLog>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, all free.
    pub fn new(num_blocks: usize, enable_prefix_caching: bool) -> Self {
        let n = u32::try_from(num_blocks).unwrap_or(NIL - 1).min(NIL - 1);
        let blocks = (0..n)
            .map(|i| Block {
                ref_count: 0,
                hash: None,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == n { NIL } else { i + 1 },
                in_free_list: true,
            })
            .collect();
        Self {
            blocks,
            free_head: if n == 0 { NIL } else { 0 },
            free_tail: if n == 0 { NIL } else { n - 1 },
            num_free: n as usize,
            cached: HashMap::default(),
            enable_prefix_caching,
            counts: PrefixCacheCounts::default(),
            residency: None,
            events: None,
        }
    }

    /// Times the residency of a `fraction` of allocated blocks (`seed`
    /// picks which).
    pub fn with_residency_sampling(mut self, fraction: f64, seed: u64) -> Self {
        self.residency = Some(Box::new(ResidencyTracker::new(
            self.blocks.len(),
            fraction,
            seed,
        )));
        self
    }

    /// The residency tracker, when sampling is on.
    pub fn residency_mut(&mut self) -> Option<&mut ResidencyTracker> {
        self.residency.as_deref_mut()
    }

    /// Records KV-cache events from now on (see [`BlockPool::take_events`]).
    pub fn enable_events(&mut self) {
        self.events.get_or_insert_with(EventLog::default);
    }

    /// The events since the last call, in order (empty when events are off).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(EventLog::take).unwrap_or_default()
    }

    /// Hashes of every block in the prefix cache, in no order.
    pub fn cached_hashes(&self) -> Vec<BlockHash> {
        self.cached.keys().copied().collect()
    }

    /// Drops the whole prefix cache, as vLLM's `reset_prefix_cache`: only
    /// when no block is in use (a running sequence's blocks must stay
    /// reachable); false, and nothing changed, otherwise.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free != self.blocks.len() {
            return false;
        }
        for &b in self.cached.values() {
            self.blocks[b as usize].hash = None;
        }
        self.cached.clear();
        if let Some(log) = &mut self.events {
            log.cleared();
        }
        true
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks with no reference (cached or not): what allocation can take.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Fraction of blocks referenced by live sequences.
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        (self.blocks.len() - self.num_free) as f64 / self.blocks.len() as f64
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.enable_prefix_caching
    }

    /// Reference count of a block (tests and invariant checks).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.blocks[block as usize].ref_count
    }

    /// Blocks that are free but still hold a cached prefix.
    pub fn num_cached_free(&self) -> usize {
        self.cached
            .values()
            .filter(|&&b| self.blocks[b as usize].ref_count == 0)
            .count()
    }

    /// Counts since the last call, reset to zero.
    pub fn take_counts(&mut self) -> PrefixCacheCounts {
        std::mem::take(&mut self.counts)
    }

    /// Takes a reference on the cached block of each hash in turn, stopping
    /// at the first miss; `hashes` has one entry per full block of a prompt.
    /// Pushes the hit blocks to `out`. Counts nothing: the caller records the
    /// lookup with [`BlockPool::record_lookup`] once the request is admitted.
    pub fn take_cached_prefix(&mut self, hashes: &[BlockHash], out: &mut Vec<u32>) {
        if !self.enable_prefix_caching {
            return;
        }
        for h in hashes {
            let Some(&b) = self.cached.get(h) else { break };
            self.acquire(b);
            if let Some(r) = &mut self.residency {
                r.on_hit(b);
            }
            out.push(b);
        }
    }

    /// Counts one admitted lookup: `queries` tokens looked up, `hits` found.
    pub fn record_lookup(&mut self, queries: usize, hits: usize) {
        self.counts.queries += queries as u64;
        self.counts.hits += hits as u64;
    }

    /// Takes `n` fresh blocks (evicting cached free ones, oldest first), or
    /// none at all when fewer than `n` are free.
    pub fn allocate(&mut self, n: usize, out: &mut Vec<u32>) -> bool {
        if n > self.num_free {
            return false;
        }
        for _ in 0..n {
            let b = self.free_head;
            debug_assert_ne!(b, NIL);
            self.unlink(b);
            let block = &mut self.blocks[b as usize];
            let evicted = block.hash.take();
            if let Some(h) = evicted {
                // Evicted: forget the hash only if it still points here.
                if self.cached.get(&h) == Some(&b) {
                    self.cached.remove(&h);
                    if let Some(log) = &mut self.events {
                        log.removed(h);
                    }
                }
            }
            block.ref_count = 1;
            if let Some(r) = &mut self.residency {
                r.on_allocate(b, evicted.is_some());
            }
            out.push(b);
        }
        true
    }

    /// Drops one reference from each block, last block first, so that a
    /// sequence's tail is evicted before its head.
    pub fn free(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            let block = &mut self.blocks[b as usize];
            debug_assert!(block.ref_count > 0, "double free of block {b}");
            block.ref_count = block.ref_count.saturating_sub(1);
            if block.ref_count == 0 {
                self.push_free(b);
                if let Some(r) = &mut self.residency {
                    r.on_release(b);
                }
            }
        }
    }

    /// Enters a full, computed block in the prefix cache. A block whose
    /// content is already cached elsewhere stays uncached (a duplicate).
    /// `parent` and `tokens` (the block's own tokens) go into the event.
    pub fn cache_block(
        &mut self,
        block: u32,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) {
        if !self.enable_prefix_caching {
            return;
        }
        let entry = self.cached.entry(hash).or_insert(block);
        if *entry == block
            && self.blocks[block as usize].hash.replace(hash).is_none()
            && let Some(log) = &mut self.events
        {
            log.stored(hash, parent, tokens, tokens.len());
        }
    }

    /// Whether `block` is the cached holder of `hash`.
    pub fn is_cached_as(&self, block: u32, hash: BlockHash) -> bool {
        self.cached.get(&hash) == Some(&block)
    }

    fn acquire(&mut self, b: u32) {
        if self.blocks[b as usize].in_free_list {
            self.unlink(b);
        }
        self.blocks[b as usize].ref_count += 1;
    }

    fn unlink(&mut self, b: u32) {
        let (prev, next) = {
            let block = &mut self.blocks[b as usize];
            debug_assert!(block.in_free_list);
            block.in_free_list = false;
            (
                std::mem::replace(&mut block.prev, NIL),
                std::mem::replace(&mut block.next, NIL),
            )
        };
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.num_free -= 1;
    }

    fn push_free(&mut self, b: u32) {
        let tail = self.free_tail;
        {
            let block = &mut self.blocks[b as usize];
            debug_assert!(!block.in_free_list);
            block.in_free_list = true;
            block.prev = tail;
            block.next = NIL;
        }
        if tail == NIL {
            self.free_head = b;
        } else {
            self.blocks[tail as usize].next = b;
        }
        self.free_tail = b;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_and_free_round_trip() {
        let mut pool = BlockPool::new(4, true);
        let mut got = Vec::new();
        assert!(pool.allocate(3, &mut got));
        assert_eq!(pool.num_free(), 1);
        assert!(!pool.allocate(2, &mut got), "must not over-allocate");
        assert_eq!(got.len(), 3, "a failed allocation takes nothing");
        pool.free(&got);
        assert_eq!(pool.num_free(), 4);
        assert_eq!(pool.usage(), 0.0);
    }

    #[test]
    fn cached_blocks_are_reused_then_evicted_lru() {
        let mut pool = BlockPool::new(3, true);
        let h1 = hash_block(None, &[1, 2]);
        let h2 = hash_block(Some(h1), &[3, 4]);
        let mut a = Vec::new();
        assert!(pool.allocate(2, &mut a));
        pool.cache_block(a[0], h1, None, &[1, 2]);
        pool.cache_block(a[1], h2, Some(h1), &[3, 4]);
        pool.free(&a);
        assert_eq!(pool.num_cached_free(), 2);

        let mut hit = Vec::new();
        pool.take_cached_prefix(&[h1, h2], &mut hit);
        assert_eq!(hit, a);
        pool.free(&hit);

        // Freed last block first: a[1] was freed before a[0], so it is older
        // in the LRU order and is evicted first (after the never-used block).
        let mut fresh = Vec::new();
        assert!(pool.allocate(2, &mut fresh));
        assert!(!pool.is_cached_as(a[1], h2), "tail block evicted first");
        assert!(pool.is_cached_as(a[0], h1), "head block survives");
    }

    #[test]
    fn chained_hash_depends_on_parent() {
        let a = hash_block(None, &[7, 8]);
        let b = hash_block(Some(a), &[7, 8]);
        assert_ne!(a, b);
        assert_eq!(a, hash_block(None, &[7, 8]));
    }

    #[test]
    fn prefix_caching_off_never_hits() {
        let mut pool = BlockPool::new(2, false);
        let h = hash_block(None, &[1]);
        let mut a = Vec::new();
        assert!(pool.allocate(1, &mut a));
        pool.cache_block(a[0], h, None, &[1]);
        pool.free(&a);
        let mut hit = Vec::new();
        pool.take_cached_prefix(&[h], &mut hit);
        assert!(hit.is_empty());
    }

    #[test]
    fn events_follow_the_prefix_cache() {
        let mut pool = BlockPool::new(3, true);
        pool.enable_events();
        let h1 = hash_block(None, &[1, 2]);
        let h2 = hash_block(Some(h1), &[3, 4]);
        let h3 = hash_block(None, &[5, 6]);
        let mut a = Vec::new();
        assert!(pool.allocate(3, &mut a));
        pool.cache_block(a[0], h1, None, &[1, 2]);
        pool.cache_block(a[1], h2, Some(h1), &[3, 4]);
        pool.cache_block(a[2], h3, None, &[5, 6]);
        // Entering the same block again, or a duplicate of cached content,
        // changes nothing and says nothing.
        pool.cache_block(a[2], h3, None, &[5, 6]);
        assert_eq!(
            pool.take_events(),
            vec![
                KvEvent::BlockStored {
                    block_hashes: vec![h1, h2],
                    parent_block_hash: None,
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                },
                KvEvent::BlockStored {
                    block_hashes: vec![h3],
                    parent_block_hash: None,
                    token_ids: vec![5, 6],
                    block_size: 2,
                },
            ],
            "one chain is one event; a new chain starts another"
        );
        assert!(pool.take_events().is_empty(), "taken once");
        pool.free(&a);
        // Freed blocks stay cached: no event. Reuse evicts them LRU.
        assert!(pool.take_events().is_empty());
        let mut b = Vec::new();
        assert!(pool.allocate(2, &mut b));
        let KvEvent::BlockRemoved { block_hashes } = &pool.take_events()[0] else {
            panic!("eviction must be a BlockRemoved event");
        };
        let mut removed = block_hashes.clone();
        removed.sort_unstable();
        let mut gone: Vec<_> = [h1, h2, h3]
            .into_iter()
            .filter(|h| !pool.cached_hashes().contains(h))
            .collect();
        gone.sort_unstable();
        assert_eq!(removed, gone, "exactly the evicted hashes");
        assert_eq!(pool.cached_hashes().len(), 1);

        // Reset refuses while blocks are in use, then clears.
        assert!(!pool.reset_prefix_cache());
        assert!(pool.take_events().is_empty());
        pool.free(&b);
        assert!(pool.reset_prefix_cache());
        assert_eq!(pool.take_events(), vec![KvEvent::AllBlocksCleared]);
        assert!(pool.cached_hashes().is_empty());
        let mut c = Vec::new();
        assert!(pool.allocate(3, &mut c));
        assert!(pool.take_events().is_empty(), "nothing left to evict");
    }

    #[test]
    fn events_off_records_nothing() {
        let mut pool = BlockPool::new(1, true);
        let mut a = Vec::new();
        assert!(pool.allocate(1, &mut a));
        pool.cache_block(a[0], 7, None, &[1]);
        assert!(pool.take_events().is_empty());
    }
}
