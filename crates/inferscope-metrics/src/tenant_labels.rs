//! The bounded `tenant` label: each tenant gets a slot the first time it is
//! seen, up to `--max-tenant-labels` slots; every later tenant shares the
//! `other` slot, and how many did is the `tenant_labels_folded` gauge.
//!
//! A slot is resolved once per request (a lock and a hash lookup, off the
//! per-token path); recording then indexes an array of handles by it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use inferscope_schema::TenantLabel;
use inferscope_schema::schema::{TENANT_ANONYMOUS, TENANT_OTHER};
use prometheus_client::metrics::gauge::Gauge;

/// Folded names remembered for the gauge; past this many the gauge stops
/// growing, so a gateway inventing a name per request cannot grow memory.
const MAX_FOLDED_REMEMBERED: usize = 65_536;

/// The tenants with their own label value, and the count of those without.
#[derive(Debug)]
pub struct TenantLabels {
    max: usize,
    inner: Mutex<Inner>,
    folded: Gauge,
}

#[derive(Debug, Default)]
struct Inner {
    slots: HashMap<Arc<str>, TenantLabel>,
    names: Vec<Arc<str>>,
    folded: HashSet<Arc<str>>,
}

impl TenantLabels {
    /// At most `max` (at least 1) tenants with their own value, `anonymous`
    /// first; `folded` is the gauge of the tenants beyond them.
    pub fn new(max: usize, folded: Gauge) -> Self {
        let max = max.max(1);
        let anonymous: Arc<str> = Arc::from(TENANT_ANONYMOUS);
        let inner = Inner {
            slots: HashMap::from([(Arc::clone(&anonymous), 0)]),
            names: vec![anonymous],
            folded: HashSet::new(),
        };
        Self {
            max,
            inner: Mutex::new(inner),
            folded,
        }
    }

    /// Slots a handle array needs: `max` tenants and `other`.
    pub fn num_slots(&self) -> usize {
        self.max + 1
    }

    /// The slot of `other`.
    pub fn other(&self) -> TenantLabel {
        TenantLabel::try_from(self.max).unwrap_or(TenantLabel::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state stays consistent across a panic elsewhere: every update
        // is one insert.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot of `tenant` (`None`: anonymous), given one if there is room.
    pub fn slot(&self, tenant: Option<&str>) -> TenantLabel {
        let Some(name) = tenant else { return 0 };
        if name == TENANT_OTHER {
            return self.other();
        }
        let mut inner = self.lock();
        if let Some(&slot) = inner.slots.get(name) {
            return slot;
        }
        if inner.names.len() < self.max {
            let slot = TenantLabel::try_from(inner.names.len()).unwrap_or(TenantLabel::MAX);
            let name: Arc<str> = Arc::from(name);
            inner.slots.insert(Arc::clone(&name), slot);
            inner.names.push(name);
            return slot;
        }
        if inner.folded.len() < MAX_FOLDED_REMEMBERED && inner.folded.insert(Arc::from(name)) {
            self.folded
                .set(i64::try_from(inner.folded.len()).unwrap_or(i64::MAX));
        }
        self.other()
    }

    /// The label value of `slot` (`other` past the named ones).
    pub fn name(&self, slot: TenantLabel) -> Arc<str> {
        self.lock()
            .names
            .get(slot as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(TENANT_OTHER))
    }

    /// Tenants folded into `other` so far.
    pub fn folded(&self) -> i64 {
        self.folded.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_past_the_bound_fold_into_other() {
        let labels = TenantLabels::new(3, Gauge::default());
        assert_eq!(labels.slot(None), 0);
        assert_eq!(labels.slot(Some("anonymous")), 0);
        let a = labels.slot(Some("a"));
        let b = labels.slot(Some("b"));
        assert_eq!((a, b), (1, 2));
        assert_eq!(labels.slot(Some("a")), 1, "a slot is stable");
        // The bound is reached: c and d share `other`, counted once each.
        assert_eq!(labels.slot(Some("c")), 3);
        assert_eq!(labels.slot(Some("d")), 3);
        assert_eq!(labels.slot(Some("c")), 3);
        assert_eq!(labels.folded(), 2);
        assert_eq!(&*labels.name(1), "a");
        assert_eq!(&*labels.name(3), "other");
        assert_eq!(labels.num_slots(), 4);
        // A tenant called `other` is not a new value either.
        assert_eq!(labels.slot(Some("other")), 3);
    }
}
