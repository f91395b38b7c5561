//! KV-cache events: what entered and left the prefix cache, per engine step.
//!
//! The block pool records events while it works; the engine core hands each
//! step's events to a [`KvEventSink`] in one [`KvEventBatch`]. The sink must
//! not block (the publisher behind it lives outside this crate and runs on
//! its own thread), so it answers at once whether it took the batch.

/// Identity of a full block's content: chained over every earlier block
/// ([`crate::block_pool::hash_block`]), as the events name blocks.
pub type BlockHash = u64;

/// One change of the prefix cache, as vLLM's `KVCacheEvent`s describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks entered the prefix cache: a chain, each block the parent
    /// of the next, the first one's parent being `parent_block_hash`.
    BlockStored {
        /// Hashes of the stored blocks, in chain order.
        block_hashes: Vec<BlockHash>,
        /// Hash of the block before the first one (`None` at a prompt's start).
        parent_block_hash: Option<BlockHash>,
        /// The tokens of every stored block, concatenated.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: usize,
    },
    /// Cached blocks were evicted (their slots were reused).
    BlockRemoved {
        /// Hashes that left the prefix cache.
        block_hashes: Vec<BlockHash>,
    },
    /// The whole prefix cache was dropped.
    AllBlocksCleared,
}

/// The events of one engine step.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventBatch {
    /// Wall-clock time of the step's end, in seconds since the Unix epoch.
    pub ts: f64,
    /// Global index of the engine (its data-parallel rank).
    pub engine: usize,
    /// The events, in the order they happened.
    pub events: Vec<KvEvent>,
}

/// Where engine cores hand their event batches; called on the engine thread.
pub trait KvEventSink: Send + Sync {
    /// Takes the batch, or returns false at once when it cannot (a full
    /// queue): the engine counts the batch as dropped and goes on.
    fn try_publish(&self, batch: KvEventBatch) -> bool;
}

/// Collects events in the block pool, merging where vLLM would send one
/// event: consecutive stores of one chain, consecutive removals.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    events: Vec<KvEvent>,
}

impl EventLog {
    pub(crate) fn stored(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
        block_size: usize,
    ) {
        if let Some(KvEvent::BlockStored {
            block_hashes,
            token_ids,
            block_size: bs,
            ..
        }) = self.events.last_mut()
            && *bs == block_size
            && parent.is_some()
            && block_hashes.last().copied() == parent
        {
            block_hashes.push(hash);
            token_ids.extend_from_slice(tokens);
            return;
        }
        self.events.push(KvEvent::BlockStored {
            block_hashes: vec![hash],
            parent_block_hash: parent,
            token_ids: tokens.to_vec(),
            block_size,
        });
    }

    pub(crate) fn removed(&mut self, hash: BlockHash) {
        if let Some(KvEvent::BlockRemoved { block_hashes }) = self.events.last_mut() {
            block_hashes.push(hash);
            return;
        }
        self.events.push(KvEvent::BlockRemoved {
            block_hashes: vec![hash],
        });
    }

    pub(crate) fn cleared(&mut self) {
        // Whatever came before is moot for a consumer that clears its set.
        self.events.clear();
        self.events.push(KvEvent::AllBlocksCleared);
    }

    pub(crate) fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }
}
