//! Sampled KV block residency (`--kv-cache-metrics`): how long a block's
//! content lives, how long it sat idle before eviction, and the gap between
//! uses that a prefix-cache hit closes.
//!
//! Only a fraction of allocations is tracked, chosen by a cheap generator, so
//! an untracked block costs one random draw at allocation and one vector
//! lookup at release, hit and eviction; the clock is read only for tracked
//! blocks.

use std::time::Instant;

use inferscope_schema::KvBlockResidency;

#[derive(Debug, Clone, Copy)]
struct Times {
    born: Instant,
    last_use: Instant,
}

/// Residency tracking of one block pool.
#[derive(Debug)]
pub struct ResidencyTracker {
    /// A block is tracked when a draw falls below this (fraction · 2⁶⁴).
    threshold: u64,
    always: bool,
    rng: u64,
    tracked: Vec<Option<Times>>,
    samples: KvBlockResidency,
}

impl ResidencyTracker {
    /// Tracks a `fraction` (0..=1) of the allocations in a pool of `num_blocks`.
    pub fn new(num_blocks: usize, fraction: f64, seed: u64) -> Self {
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        Self {
            threshold: (fraction * u64::MAX as f64) as u64,
            always: fraction >= 1.0,
            rng: seed | 1,
            tracked: vec![None; num_blocks],
            samples: KvBlockResidency::default(),
        }
    }

    fn draw(&mut self) -> bool {
        if self.always {
            return true;
        }
        // xorshift64: three shifts, enough for sampling.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x < self.threshold
    }

    /// `block` is taken for new content; `evicted` when it held cached content.
    #[inline]
    pub fn on_allocate(&mut self, block: u32, evicted: bool) {
        let b = block as usize;
        let old = self.tracked.get_mut(b).and_then(Option::take);
        let sampled = self.draw();
        if old.is_none() && !sampled {
            return;
        }
        let now = Instant::now();
        if let (Some(t), true) = (old, evicted) {
            let lifetime = now.saturating_duration_since(t.born).as_secs_f64();
            let idle = now.saturating_duration_since(t.last_use).as_secs_f64();
            self.samples.lifetime.push(lifetime);
            self.samples.idle_before_evict.push(idle);
        }
        if sampled && let Some(slot) = self.tracked.get_mut(b) {
            *slot = Some(Times {
                born: now,
                last_use: now,
            });
        }
    }

    /// A prefix-cache hit takes `block`.
    #[inline]
    pub fn on_hit(&mut self, block: u32) {
        if let Some(Some(t)) = self.tracked.get_mut(block as usize) {
            let now = Instant::now();
            let gap = now.saturating_duration_since(t.last_use).as_secs_f64();
            t.last_use = now;
            self.samples.reuse_gap.push(gap);
        }
    }

    /// The last reference to `block` went away.
    #[inline]
    pub fn on_release(&mut self, block: u32) {
        if let Some(Some(t)) = self.tracked.get_mut(block as usize) {
            t.last_use = Instant::now();
        }
    }

    /// Moves the samples since the last call into `out` (replacing its content).
    pub fn take_samples(&mut self, out: &mut KvBlockResidency) {
        *out = std::mem::take(&mut self.samples);
    }

    /// Blocks tracked now (tests).
    pub fn num_tracked(&self) -> usize {
        self.tracked.iter().filter(|t| t.is_some()).count()
    }
}
