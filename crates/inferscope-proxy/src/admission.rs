//! Admission to the upstream: a request's holds on its tenant's limits
//! (`--api-key-file`), and `--max-upstream-concurrency`, past which
//! requests wait in per-tenant queues served by deficit round robin in
//! proportion to the tenants' weights (arrival order within a tenant).
//!
//! Why here and not upstream: the upstream (llama.cpp's server, vLLM)
//! serves its own queue first come, first served, so one tenant's burst
//! would sit in front of everyone else's requests; the proxy keeps the
//! burst on its side and hands the upstream's slots out fairly.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use inferscope_tenants::{Tenant, TenantChoice};
use tokio::sync::oneshot;

/// Deficit round robin over per-tenant queues of `T`: each turn a tenant
/// earns its weight in credit, and each request it sends costs one.
#[derive(Debug)]
pub struct FairQueue<T> {
    lanes: HashMap<Arc<str>, Lane<T>>,
    /// Tenants with requests waiting, in turn order (the front's turn).
    turns: VecDeque<Arc<str>>,
    len: usize,
}

#[derive(Debug)]
struct Lane<T> {
    weight: f64,
    credit: f64,
    /// Its visit is under way (its weight added for this turn).
    visited: bool,
    waiting: VecDeque<T>,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
            turns: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> FairQueue<T> {
    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none wait.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `item` behind `tenant`'s earlier ones (`weight`: its share).
    pub fn push(&mut self, tenant: &Arc<str>, weight: f64, item: T) {
        let lane = self
            .lanes
            .entry(Arc::clone(tenant))
            .or_insert_with(|| Lane {
                weight,
                credit: 0.0,
                visited: false,
                waiting: VecDeque::new(),
            });
        if lane.waiting.is_empty() {
            self.turns.push_back(Arc::clone(tenant));
        }
        lane.waiting.push_back(item);
        self.len += 1;
    }

    /// The next request by deficit round robin.
    pub fn pop(&mut self) -> Option<T> {
        // A visit to the front tenant earns it its weight once, then it
        // sends while its credit lasts and the turn passes on; each pass
        // adds credit, so this ends (weights are positive: the key file
        // checks them).
        loop {
            let tenant = self.turns.front()?;
            let lane = self.lanes.get_mut(tenant)?;
            if !lane.visited {
                lane.visited = true;
                lane.credit += lane.weight;
            }
            if lane.credit < 1.0 {
                // Its visit is over: a tenant that arrived meanwhile is
                // next, not behind this one's next visit.
                lane.visited = false;
                let t = self.turns.pop_front()?;
                self.turns.push_back(t);
                continue;
            }
            lane.credit -= 1.0;
            let item = lane.waiting.pop_front();
            if lane.waiting.is_empty() {
                // An idle tenant keeps no credit (DRR's rule): saving it up
                // would let it burst past the others later.
                let t = self.turns.pop_front()?;
                self.lanes.remove(&t);
            }
            if item.is_some() {
                self.len -= 1;
            }
            return item;
        }
    }

    /// Takes out the first of `tenant`'s requests that `is` matches.
    pub fn remove(&mut self, tenant: &str, is: impl Fn(&T) -> bool) -> Option<T> {
        let lane = self.lanes.get_mut(tenant)?;
        let at = lane.waiting.iter().position(is)?;
        let item = lane.waiting.remove(at);
        self.len -= 1;
        if lane.waiting.is_empty() {
            self.lanes.remove(tenant);
            self.turns.retain(|t| &**t != tenant);
        }
        item
    }
}

/// `--max-upstream-concurrency`: requests in flight to the upstream, and
/// those waiting for one of its slots. One per proxy (every thread's).
#[derive(Debug)]
pub struct UpstreamGate {
    max: usize,
    inner: Mutex<GateInner>,
}

#[derive(Debug, Default)]
struct GateInner {
    in_flight: usize,
    queue: FairQueue<(u64, oneshot::Sender<()>)>,
    next_id: u64,
}

/// One request's slot upstream; given back (to the next waiter) when dropped.
#[derive(Debug)]
pub struct UpstreamSlot {
    gate: Arc<UpstreamGate>,
}

impl Drop for UpstreamSlot {
    fn drop(&mut self) {
        let mut inner = self.gate.lock();
        inner.in_flight -= 1;
        self.gate.hand_out(&mut inner);
    }
}

/// A request waiting in the queue; leaves it when dropped (the client went away).
struct Waiting {
    gate: Arc<UpstreamGate>,
    tenant: Arc<str>,
    id: u64,
    rx: oneshot::Receiver<()>,
    /// It got its slot (now an [`UpstreamSlot`]'s).
    admitted: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.admitted {
            return;
        }
        // Under the lock slots are handed out, so either the slot came (and
        // is passed on) or the request is still in the queue (and leaves).
        let mut inner = self.gate.lock();
        if self.rx.try_recv().is_ok() {
            inner.in_flight -= 1;
            self.gate.hand_out(&mut inner);
            return;
        }
        let id = self.id;
        inner.queue.remove(&self.tenant, |(i, _)| *i == id);
    }
}

impl UpstreamGate {
    /// At most `max` (at least 1) requests in flight upstream.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            inner: Mutex::new(GateInner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, GateInner> {
        // Every update leaves the counts consistent: a panic elsewhere
        // cannot leave them half done.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives free slots to the next waiters in fair order.
    fn hand_out(&self, inner: &mut GateInner) {
        while inner.in_flight < self.max {
            let Some((_, tx)) = inner.queue.pop() else {
                return;
            };
            // A receiver already dropped takes nothing (its Drop found no slot).
            if tx.send(()).is_ok() {
                inner.in_flight += 1;
            }
        }
    }

    /// A slot now, if one is free and nobody waits for it.
    pub fn try_acquire(self: &Arc<Self>) -> Option<UpstreamSlot> {
        let mut inner = self.lock();
        (inner.in_flight < self.max && inner.queue.is_empty()).then(|| {
            inner.in_flight += 1;
            UpstreamSlot {
                gate: Arc::clone(self),
            }
        })
    }

    /// A slot, waiting behind others in `tenant`'s queue (weighted by
    /// `weight` against the other tenants') when none is free.
    pub async fn acquire(self: &Arc<Self>, tenant: &Arc<str>, weight: f64) -> UpstreamSlot {
        let waiting = {
            let mut inner = self.lock();
            if inner.in_flight < self.max && inner.queue.is_empty() {
                inner.in_flight += 1;
                return UpstreamSlot {
                    gate: Arc::clone(self),
                };
            }
            let (tx, rx) = oneshot::channel();
            let id = inner.next_id;
            inner.next_id += 1;
            inner.queue.push(tenant, weight, (id, tx));
            Waiting {
                gate: Arc::clone(self),
                tenant: Arc::clone(tenant),
                id,
                rx,
                admitted: false,
            }
        };
        let mut waiting = waiting;
        if (&mut waiting.rx).await.is_err() {
            // A queue entry is only dropped after sending; should that ever
            // change, count the slot taken so the counts stay balanced.
            waiting.gate.lock().in_flight += 1;
        }
        waiting.admitted = true;
        UpstreamSlot {
            gate: Arc::clone(&waiting.gate),
        }
    }

    /// Requests in flight upstream and waiting for a slot.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.in_flight, inner.queue.len())
    }
}

/// What an admitted request holds until its response ends, however it
/// ends (its tenant's counts, its upstream slot): released when dropped.
#[derive(Debug, Default)]
pub struct Holds {
    /// Its choices' holds on the tenant's limits (empty: no tenant limits).
    pub(crate) choices: Vec<TenantChoice>,
    /// Its upstream slot (none without `--max-upstream-concurrency`).
    pub(crate) slot: Option<UpstreamSlot>,
}

impl Holds {
    /// The request is on its way upstream: it no longer counts as waiting.
    pub(crate) fn started(&mut self) {
        for c in &mut self.choices {
            c.started();
        }
    }

    /// Charges `tokens` (prompt and generation) to the tenant's tokens per minute.
    pub(crate) fn charge(&mut self, tokens: u64) {
        if let Some(c) = self.choices.first_mut() {
            c.finished(usize::try_from(tokens).unwrap_or(usize::MAX));
        }
    }
}

/// The weight a tenant's queue gets (1 without one).
pub(crate) fn weight_of(tenant: Option<&Arc<Tenant>>) -> f64 {
    tenant.map_or(1.0, |t| t.weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut FairQueue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn equal_weights_alternate_and_keep_arrival_order() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut q = FairQueue::default();
        for x in ["a1", "a2", "a3", "a4"] {
            q.push(&a, 1.0, x);
        }
        q.push(&b, 1.0, "b1");
        q.push(&b, 1.0, "b2");
        assert_eq!(q.len(), 6);
        assert_eq!(drain(&mut q), ["a1", "b1", "a2", "b2", "a3", "a4"]);
        assert!(q.is_empty());
    }

    #[test]
    fn weights_share_the_slots_in_proportion() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut q = FairQueue::default();
        for x in ["a1", "a2", "a3", "a4", "a5", "a6"] {
            q.push(&a, 2.0, x);
        }
        for x in ["b1", "b2", "b3"] {
            q.push(&b, 1.0, x);
        }
        assert_eq!(
            drain(&mut q),
            ["a1", "a2", "b1", "a3", "a4", "b2", "a5", "a6", "b3"]
        );
        // A half weight waits two turns per request.
        let mut q = FairQueue::default();
        for x in ["a1", "a2", "a3", "a4"] {
            q.push(&a, 1.0, x);
        }
        q.push(&b, 0.5, "b1");
        assert_eq!(drain(&mut q), ["a1", "a2", "b1", "a3", "a4"]);
    }

    #[test]
    fn a_tenant_that_arrives_is_next_once_the_current_visit_ends() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut q = FairQueue::default();
        for x in ["a1", "a2", "a3", "a4"] {
            q.push(&a, 1.0, x);
        }
        assert_eq!(q.pop(), Some("a1"));
        q.push(&b, 1.0, "b1");
        assert_eq!(drain(&mut q), ["b1", "a2", "a3", "a4"]);
    }

    #[test]
    fn a_removed_request_leaves_its_tenants_turn() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut q = FairQueue::default();
        q.push(&a, 1.0, "a1");
        q.push(&b, 1.0, "b1");
        q.push(&a, 1.0, "a2");
        assert_eq!(q.remove("b", |x| *x == "b1"), Some("b1"));
        assert_eq!(q.remove("b", |x| *x == "b1"), None);
        assert_eq!(drain(&mut q), ["a1", "a2"]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_gate_hands_slots_out_fairly_and_forgets_who_left() {
        let gate = UpstreamGate::new(1);
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let first = gate.try_acquire().expect("free");
        assert!(gate.try_acquire().is_none());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (t, name) in [(&a, "a1"), (&a, "a2"), (&a, "a3"), (&b, "b1")] {
            let (gate, t, order) = (Arc::clone(&gate), Arc::clone(t), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let slot = gate.acquire(&t, 1.0).await;
                order.lock().expect("order").push(name);
                tokio::task::yield_now().await;
                drop(slot);
            }));
            tokio::task::yield_now().await;
        }
        // One more from a, gone before its turn: it leaves the queue.
        let left = tokio::spawn({
            let (gate, a) = (Arc::clone(&gate), Arc::clone(&a));
            async move { gate.acquire(&a, 1.0).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(gate.counts(), (1, 5));
        left.abort();
        let _ = left.await;
        assert_eq!(gate.counts(), (1, 4));
        drop(first);
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(*order.lock().expect("order"), ["a1", "b1", "a2", "a3"]);
        assert_eq!(gate.counts(), (0, 0));
    }
}
