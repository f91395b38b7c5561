//! The queue of requests waiting for admission: first come, first served,
//! or fair across tenants.
//!
//! Fair admission keeps one FCFS queue per tenant and admits next from the
//! waiting tenant that has been served least for its weight: each tenant has
//! a virtual counter of the tokens it was served (prompt tokens charged when
//! admitted, generated tokens as they are produced) divided by its weight,
//! as the Virtual Token Counter of Sheng et al., "Fairness in Serving Large
//! Language Models" (OSDI 2024). A tenant that starts waiting after an idle
//! spell has its counter lifted to the least counter among the tenants
//! waiting, so idleness banks no credit. Preempted requests go back to the
//! front (they were admitted once already) under either policy.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// How waiting requests are admitted (`--scheduling-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingPolicy {
    /// Fair across tenants, FCFS within one; with one tenant, FCFS.
    #[default]
    Fair,
    /// Strict arrival order, whoever sent the request.
    Fcfs,
}

/// The tenant slot of requests that name no tenant.
pub const ANONYMOUS_SLOT: usize = 0;

/// One tenant's waiting requests and how much it has been served.
#[derive(Debug)]
struct TenantQueue<T> {
    queue: VecDeque<T>,
    /// Tokens served divided by the weight.
    served: f64,
    weight: f64,
}

/// Waiting requests, in the order the policy admits them.
#[derive(Debug)]
pub(crate) struct WaitingQueue<T> {
    policy: SchedulingPolicy,
    /// FCFS: every waiting request. Fair: the preempted ones, first in line.
    front: VecDeque<T>,
    /// Fair: one queue per tenant slot (slot 0: requests without a tenant).
    tenants: Vec<TenantQueue<T>>,
    slots: HashMap<Arc<str>, usize>,
    weights: BTreeMap<String, f64>,
    len: usize,
}

impl<T> WaitingQueue<T> {
    /// An empty queue; `weights` gives tenants their share (default 1).
    pub(crate) fn new(policy: SchedulingPolicy, weights: BTreeMap<String, f64>) -> Self {
        Self {
            policy,
            front: VecDeque::new(),
            tenants: vec![TenantQueue {
                queue: VecDeque::new(),
                served: 0.0,
                weight: 1.0,
            }],
            slots: HashMap::new(),
            weights,
            len: 0,
        }
    }

    /// The slot of `tenant` (made on first sight; `None` is anonymous).
    /// Slots are never reused, so a number of tenants bounded by the key
    /// file bounds this table.
    pub(crate) fn slot(&mut self, tenant: Option<&Arc<str>>) -> usize {
        let Some(name) = tenant else {
            return ANONYMOUS_SLOT;
        };
        if let Some(&s) = self.slots.get(name) {
            return s;
        }
        let weight = self
            .weights
            .get(name.as_ref())
            .copied()
            .filter(|w| *w > 0.0)
            .unwrap_or(1.0);
        self.tenants.push(TenantQueue {
            queue: VecDeque::new(),
            served: 0.0,
            weight,
        });
        let s = self.tenants.len() - 1;
        self.slots.insert(Arc::clone(name), s);
        s
    }

    /// Requests waiting.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether none waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues a new arrival of tenant `slot`.
    pub(crate) fn push_back(&mut self, slot: usize, item: T) {
        self.len += 1;
        if self.policy == SchedulingPolicy::Fcfs {
            self.front.push_back(item);
            return;
        }
        if self.tenants[slot].queue.is_empty() {
            // Back from idle: no credit for the time it sent nothing.
            if let Some(least) = self.least_served_waiting() {
                let t = &mut self.tenants[slot];
                t.served = t.served.max(least);
            }
        }
        self.tenants[slot].queue.push_back(item);
    }

    /// Puts a preempted request back at the head of the line.
    pub(crate) fn push_front(&mut self, item: T) {
        self.len += 1;
        self.front.push_front(item);
    }

    /// Fair admission: puts a request preempted to make room for another
    /// tenant at the head of its own tenant's queue, so that it is not first
    /// in line ahead of the tenant it yielded to (as a request preempted for
    /// memory is). Under FCFS, the head of the line.
    pub(crate) fn push_front_of(&mut self, slot: usize, item: T) {
        if self.policy == SchedulingPolicy::Fcfs {
            self.push_front(item);
            return;
        }
        self.len += 1;
        self.tenants[slot].queue.push_front(item);
    }

    /// Fair admission with a named tenant seen (else every request is
    /// anonymous): the tenant slot admitted next, when no preempted request
    /// is first in line; `None` under FCFS.
    pub(crate) fn next_fair_slot(&self) -> Option<usize> {
        if self.policy != SchedulingPolicy::Fair || self.tenants.len() < 2 || !self.front.is_empty()
        {
            return None;
        }
        self.next_tenant()
    }

    /// The request admitted next, if any.
    pub(crate) fn front_mut(&mut self) -> Option<&mut T> {
        if !self.front.is_empty() {
            return self.front.front_mut();
        }
        let t = self.next_tenant()?;
        self.tenants[t].queue.front_mut()
    }

    /// Takes the request [`WaitingQueue::front_mut`] returned, charging its
    /// tenant `cost` tokens.
    pub(crate) fn pop_front(&mut self, cost: usize) -> Option<T> {
        let item = if self.front.is_empty() {
            let t = self.next_tenant()?;
            let tenant = &mut self.tenants[t];
            tenant.served += cost as f64 / tenant.weight;
            tenant.queue.pop_front()
        } else {
            self.front.pop_front()
        };
        if item.is_some() {
            self.len -= 1;
        }
        item
    }

    /// Charges tenant `slot` for `tokens` served while it runs (generated
    /// tokens); nothing under FCFS.
    pub(crate) fn charge(&mut self, slot: usize, tokens: usize) {
        if self.policy == SchedulingPolicy::Fair
            && let Some(t) = self.tenants.get_mut(slot)
        {
            t.served += tokens as f64 / t.weight;
        }
    }

    /// Every waiting request, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.front
            .iter()
            .chain(self.tenants.iter().flat_map(|t| t.queue.iter()))
    }

    /// Removes the first request that `matches`.
    pub(crate) fn remove_where(&mut self, matches: impl Fn(&T) -> bool) -> Option<T> {
        let found = match self.front.iter().position(&matches) {
            Some(i) => self.front.remove(i),
            None => self.tenants.iter_mut().find_map(|t| {
                let i = t.queue.iter().position(&matches)?;
                t.queue.remove(i)
            }),
        };
        if found.is_some() {
            self.len -= 1;
        }
        found
    }

    /// Takes every waiting request out.
    pub(crate) fn drain_all(&mut self) -> Vec<T> {
        self.len = 0;
        let mut all: Vec<T> = self.front.drain(..).collect();
        for t in &mut self.tenants {
            all.extend(t.queue.drain(..));
        }
        all
    }

    /// The waiting tenant served least for its weight; on a tie the lowest
    /// slot (the first seen), so one tenant alone is served FCFS.
    fn next_tenant(&self) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, t) in self.tenants.iter().enumerate() {
            if !t.queue.is_empty() && best.is_none_or(|(_, s)| t.served < s) {
                best = Some((i, t.served));
            }
        }
        best.map(|(i, _)| i)
    }

    fn least_served_waiting(&self) -> Option<f64> {
        self.next_tenant().map(|i| self.tenants[i].served)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(policy: SchedulingPolicy, weights: &[(&str, f64)]) -> WaitingQueue<(usize, u32)> {
        let w = weights.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        WaitingQueue::new(policy, w)
    }

    /// Admits everything, each request costing `cost` tokens: (slot, seq) in order.
    fn admit_all(q: &mut WaitingQueue<(usize, u32)>, cost: usize) -> Vec<(usize, u32)> {
        let mut out = Vec::new();
        while q.front_mut().is_some() {
            out.push(q.pop_front(cost).expect("front"));
        }
        assert!(q.is_empty());
        out
    }

    #[test]
    fn a_flooding_tenant_does_not_starve_a_later_one() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        for policy in [SchedulingPolicy::Fair, SchedulingPolicy::Fcfs] {
            let mut q = queue(policy, &[]);
            let (sa, sb) = (q.slot(Some(&a)), q.slot(Some(&b)));
            for i in 0..100 {
                q.push_back(sa, (sa, i));
            }
            for i in 0..3 {
                q.push_back(sb, (sb, i));
            }
            assert_eq!(q.len(), 103);
            let order = admit_all(&mut q, 10);
            let b_positions: Vec<usize> = order
                .iter()
                .enumerate()
                .filter(|(_, (s, _))| *s == sb)
                .map(|(i, _)| i)
                .collect();
            match policy {
                // b alternates with a from the start, in its own order.
                SchedulingPolicy::Fair => assert_eq!(b_positions, vec![1, 3, 5]),
                SchedulingPolicy::Fcfs => assert_eq!(b_positions, vec![100, 101, 102]),
            }
            let b_seqs: Vec<u32> = order
                .iter()
                .filter(|(s, _)| *s == sb)
                .map(|x| x.1)
                .collect();
            assert_eq!(b_seqs, vec![0, 1, 2]);
        }
    }

    #[test]
    fn weights_set_the_shares() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut q = queue(SchedulingPolicy::Fair, &[("a", 3.0)]);
        let (sa, sb) = (q.slot(Some(&a)), q.slot(Some(&b)));
        for i in 0..300 {
            q.push_back(sa, (sa, i));
            q.push_back(sb, (sb, i));
        }
        let first = &admit_all(&mut q, 10)[..200];
        let from_a = first.iter().filter(|(s, _)| *s == sa).count();
        assert_eq!(from_a, 150, "weight 3 against 1: three quarters");
    }

    #[test]
    fn idle_time_banks_no_credit_and_generation_counts() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut q = queue(SchedulingPolicy::Fair, &[]);
        let (sa, sb) = (q.slot(Some(&a)), q.slot(Some(&b)));
        // a is served a lot alone.
        for i in 0..50 {
            q.push_back(sa, (sa, i));
        }
        admit_all(&mut q, 100);
        for i in 0..10 {
            q.push_back(sa, (sa, i));
        }
        // b arrives: it is lifted to a's counter, so it does not get the
        // next 50 admissions in a row.
        for i in 0..10 {
            q.push_back(sb, (sb, i));
        }
        let order = admit_all(&mut q, 100);
        let b_first_six = order[..6].iter().filter(|(s, _)| *s == sb).count();
        assert_eq!(b_first_six, 3);
        // Tokens generated while running count against the tenant.
        for i in 0..4 {
            q.push_back(sa, (sa, i));
            q.push_back(sb, (sb, i));
        }
        q.charge(sa, 10_000);
        let order = admit_all(&mut q, 1);
        assert!(order[..4].iter().all(|(s, _)| *s == sb), "{order:?}");
    }

    #[test]
    fn preempted_requests_come_first_and_removal_finds_any() {
        let a: Arc<str> = "a".into();
        let mut q = queue(SchedulingPolicy::Fair, &[]);
        let sa = q.slot(Some(&a));
        q.push_back(sa, (sa, 1));
        q.push_back(ANONYMOUS_SLOT, (ANONYMOUS_SLOT, 2));
        q.push_front((sa, 0));
        assert_eq!(q.len(), 3);
        assert_eq!(q.front_mut().copied(), Some((sa, 0)));
        assert_eq!(q.remove_where(|x| x.1 == 2), Some((ANONYMOUS_SLOT, 2)));
        assert_eq!(q.remove_where(|x| x.1 == 9), None);
        assert_eq!(q.len(), 2);
        assert_eq!(q.iter().count(), 2);
        assert_eq!(q.drain_all().len(), 2);
        assert!(q.is_empty() && q.front_mut().is_none());
        // The same tenant name maps to the same slot.
        assert_eq!(q.slot(Some(&"a".into())), sa);
        assert_eq!(q.slot(None), ANONYMOUS_SLOT);
    }
}
