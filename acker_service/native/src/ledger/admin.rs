//! Operating a running ledger: progress timeouts and the lifetime cap, inspecting
//! trees, and failing them from outside (Inspect, ForceFail). Same rules as the reference
//! model's `ReferenceLedger` methods of the same names.
//!
//! The hot path only consults [`TimeoutRules`] (one flag on ACK, one comparison in
//! the expiry predicate); the scans here walk the whole table and are for operators
//! (an Inspect call, a metrics scrape, a force-fail), never per operation.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{Ledger, LedgerError, Outcomes, FAILED};
use crate::table::{Entry, GEN_MASK, STARTED_MASK};

/// Ages are start times modulo 2^39 µs: differences below half of that are ages,
/// above it they are entries that started after the reference time.
const HALF_RANGE_US: u64 = STARTED_MASK.div_ceil(2);

/// How timeouts follow a tree beyond the fixed message timeout.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutRules {
    /// Every applied ACK gives the tree a fresh timeout (Storm's STORM-2359 proposal).
    pub progress: bool,
    /// No tree lives longer than this many microseconds after its init (0: no cap).
    pub cap_us: u64,
    /// Ledger time of the last rotation: the cap is judged there, as the timeout is.
    pub rotated_at_us: u64,
}

/// Where a root stands (the proto enum `TreeStatus`'s wire values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TreeStatus {
    /// No entry: never started here, or already ended.
    Absent = 1,
    /// Init applied, no outcome yet.
    Pending = 2,
    /// Acks or fails arrived but the init has not (yet).
    AwaitingInit = 3,
    /// Due to expire: the next expiry slice (or a message touching it) ends it.
    Expiring = 4,
}

/// One root's state, for an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeInfo {
    /// The root id.
    pub root: u64,
    /// Where it stands.
    pub status: TreeStatus,
    /// Spout id (0 before init); names via [`Ledger::spout_name`].
    pub spout: u16,
    /// Microseconds since init (since the first message, before init).
    pub age_us: u64,
    /// Whether a tuple of the tree failed.
    pub failed: bool,
    /// RESET_TIMEOUTs applied to it.
    pub resets: u32,
    /// Dedup keys held for it.
    pub dedup_keys: u32,
}

impl Ledger {
    /// Set the timeout mode and the lifetime cap in seconds (0: none). Takes effect at
    /// once: a cap judged at the next rotation, progress on the next ack.
    pub fn set_timeout_rules(&mut self, progress: bool, max_lifetime: f64) -> Result<(), LedgerError> {
        if max_lifetime.is_nan() || max_lifetime < 0.0 || max_lifetime.is_infinite() {
            return Err(LedgerError::Config(format!(
                "max_tree_lifetime must be zero (no cap) or a positive number of seconds, got {max_lifetime}"
            )));
        }
        let cap_us = (max_lifetime * 1e6).round() as u64;
        let limit_us = HALF_RANGE_US - (self.period * 1e6).ceil() as u64;
        if cap_us >= limit_us {
            return Err(LedgerError::Config(format!(
                "max_tree_lifetime plus one rotation period must stay below {:.0} seconds, got {max_lifetime}",
                HALF_RANGE_US as f64 / 1e6
            )));
        }
        self.rules.progress = progress;
        self.rules.cap_us = cap_us;
        Ok(())
    }

    /// The timeout rules in force.
    pub fn timeout_rules(&self) -> TimeoutRules {
        self.rules
    }

    /// Whether an entry reached the lifetime cap as of the last rotation.
    #[inline]
    pub(super) fn outlived(&self, e: &Entry) -> bool {
        let cap = self.rules.cap_us;
        if cap == 0 {
            return false;
        }
        let age = self.rules.rotated_at_us.wrapping_sub(e.started()) & STARTED_MASK;
        age >= cap && age < HALF_RANGE_US
    }

    /// Whether a due entry ends LIFETIME_EXCEEDED: it had reached the cap at the rotation that
    /// made it due (the one that expired its generation, else the last one), so an expiry
    /// collected late, after further rotations, ends the same as one collected at once.
    #[inline]
    pub(super) fn ended_outlived(&self, e: &Entry) -> bool {
        let cap = self.rules.cap_us;
        if cap == 0 {
            return false;
        }
        let judged_at = if (self.generation.wrapping_sub(e.gen()) & GEN_MASK) >= self.buckets {
            self.rotations_us[(e.gen().wrapping_add(self.buckets) & GEN_MASK) as usize]
        } else {
            self.rules.rotated_at_us
        };
        let age = judged_at.wrapping_sub(e.started()) & STARTED_MASK;
        age >= cap && age < HALF_RANGE_US
    }

    fn info(&self, e: &Entry, now_us: u64) -> TreeInfo {
        let status = if self.is_expired(e) {
            TreeStatus::Expiring
        } else if e.spout() == 0 {
            TreeStatus::AwaitingInit
        } else {
            TreeStatus::Pending
        };
        let resets = if e.has_notes() { self.notes.get(&e.root).copied().unwrap_or(0) } else { 0 };
        let dedup_keys = if e.has_dedup() { self.dedup.count(e.root) } else { 0 };
        TreeInfo {
            root: e.root,
            status,
            spout: e.spout(),
            age_us: Self::latency(now_us, e),
            failed: e.failed(),
            resets,
            dedup_keys,
        }
    }

    /// The state of each root at time `now` (read-only: nothing expires here).
    pub fn inspect(&self, roots: &[u64], now: f64) -> Vec<TreeInfo> {
        let now_us = self.micros(now);
        roots
            .iter()
            .map(|&root| match self.table.find(root) {
                Some(s) => self.info(self.table.get(s), now_us),
                None => TreeInfo {
                    root,
                    status: TreeStatus::Absent,
                    spout: 0,
                    age_us: 0,
                    failed: false,
                    resets: 0,
                    dedup_keys: 0,
                },
            })
            .collect()
    }

    fn pending_entries(&self) -> impl Iterator<Item = &Entry> {
        self.table.entries().filter(|e| e.spout() != 0 && !self.is_expired(e))
    }

    /// The `k` oldest pending trees (by time since init; ties by root), oldest first.
    pub fn oldest(&self, k: usize, now: f64) -> Vec<TreeInfo> {
        let now_us = self.micros(now);
        // A min-heap of the k oldest so far: one pass, k log k memory and time.
        let mut heap: BinaryHeap<Reverse<(u64, Reverse<u64>)>> = BinaryHeap::with_capacity(k.min(1 << 16) + 1);
        if k == 0 {
            return Vec::new();
        }
        for e in self.pending_entries() {
            let key = (Self::latency(now_us, e), Reverse(e.root));
            if heap.len() < k {
                heap.push(Reverse(key));
            } else if heap.peek().is_some_and(|Reverse(least)| key > *least) {
                heap.pop();
                heap.push(Reverse(key));
            }
        }
        let mut found: Vec<(u64, Reverse<u64>)> = heap.into_iter().map(|Reverse(key)| key).collect();
        found.sort_unstable_by(|a, b| b.cmp(a));
        found
            .into_iter()
            .map(|(_, Reverse(root))| {
                let s = self.table.find(root).expect("a pending entry found by the scan");
                self.info(self.table.get(s), now_us)
            })
            .collect()
    }

    /// Pending trees counted by age: `counts[i]` holds ages `<= bounds_us[i]` and above
    /// the previous bound, the last slot those above every bound; and the sum of ages (µs).
    pub fn age_histogram(&self, bounds_us: &[u64], now: f64) -> (Vec<u64>, u128) {
        let now_us = self.micros(now);
        let mut counts = vec![0u64; bounds_us.len() + 1];
        let mut sum: u128 = 0;
        for e in self.pending_entries() {
            let age = Self::latency(now_us, e);
            counts[bounds_us.partition_point(|&b| b < age)] += 1;
            sum += age as u128;
        }
        (counts, sum)
    }

    /// End a pending tree FAILED now (an operator's force-fail); a due one expires instead.
    fn force_fail_slot(&mut self, s: usize, now_us: u64, out: &mut Outcomes) {
        let e = *self.table.get(s);
        if self.is_expired(&e) {
            // Its timeout came first: that is its one outcome.
            self.table.remove_at(s);
            self.settle_expired(&e, now_us, out);
            return;
        }
        let spout = e.spout();
        self.table.remove_at(s);
        self.forget_side_state(&e);
        self.open_trees -= 1;
        self.stats.failed += 1;
        self.stats.force_failed += 1;
        out.push(spout, e.root, FAILED, Self::latency(now_us, &e));
        self.spouts.release(spout);
    }

    /// Fail the pending trees among `roots` now (outcome FAILED, to their spouts).
    /// Roots that are absent or still awaiting their init are left alone.
    pub fn force_fail(&mut self, roots: &[u64], now: f64, out: &mut Outcomes) {
        self.spouts.collect();
        self.advance_clock(now);
        let now_us = self.micros(now);
        for &root in roots {
            if let Some(s) = self.table.find(root) {
                let e = self.table.get(s);
                if e.spout() != 0 || self.is_expired(e) {
                    self.force_fail_slot(s, now_us, out);
                }
            }
        }
    }

    /// Fail every pending tree of the spout named `spout` now.
    pub fn force_fail_spout(&mut self, spout: &str, now: f64, out: &mut Outcomes) {
        self.spouts.collect();
        self.advance_clock(now);
        let Some(id) = self.spouts.lookup(spout) else {
            return;
        };
        let now_us = self.micros(now);
        let mut pos = 0;
        while pos < self.table.capacity() {
            let e = self.table.get(pos);
            if e.root != 0 && e.spout() == id {
                // Do not step: backward-shift deletion may move the next entry into `pos`.
                self.force_fail_slot(pos, now_us, out);
            } else {
                pos += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::run as apply;
    use super::super::{ACK, ACKED, INIT, LIFETIME_EXCEEDED, RESET_TIMEOUT, TIMED_OUT};
    use super::*;

    #[test]
    fn progress_mode_restarts_the_timeout_on_every_ack() {
        let mut fixed = Ledger::new(4.0, 3, 0.0, 1).unwrap();
        let mut progress = Ledger::new(4.0, 3, 0.0, 1).unwrap();
        progress.set_timeout_rules(true, 100.0).unwrap();
        for l in [&mut fixed, &mut progress] {
            apply(l, 0.0, &[INIT], &[7], &[3], &[]);
            apply(l, 3.9, &[ACK], &[7], &[1], &[]);
        }
        let (mut a, mut b) = (Outcomes::default(), Outcomes::default());
        fixed.advance(6.5, &mut a);
        progress.advance(6.5, &mut b);
        assert_eq!(a.outcome, vec![TIMED_OUT], "fixed: the ack did not move the timeout");
        assert!(b.is_empty(), "progress: the ack restarted it");
        let out = apply(&mut progress, 6.6, &[ACK], &[7], &[2], &[]);
        assert_eq!(out.ended.outcome, vec![ACKED]);
    }

    #[test]
    fn the_cap_ends_a_tree_kept_alive_by_resets_with_its_own_outcome() {
        let mut l = Ledger::new(4.0, 3, 0.0, 1).unwrap();
        l.set_timeout_rules(false, 10.0).unwrap();
        apply(&mut l, 0.0, &[INIT], &[7], &[3], &[]);
        let mut ended = Outcomes::default();
        let mut t = 0.0;
        while ended.is_empty() {
            t += 1.0;
            // The rotation due at `t` runs before the reset applies: the cap may end the tree there.
            ended = apply(&mut l, t, &[RESET_TIMEOUT], &[7], &[0], &[]).ended;
            l.advance(t, &mut ended);
            assert!(t < 20.0, "the cap never ended the tree");
        }
        assert_eq!(ended.outcome, vec![LIFETIME_EXCEEDED]);
        assert!((10.0..=12.0).contains(&t), "ended within a rotation period after the cap, at {t}");
        assert_eq!((l.stats().timed_out, l.stats().outlived), (1, 1));
    }

    #[test]
    fn inspect_reports_resets_keys_and_status() {
        let mut l = Ledger::new(30.0, 3, 0.0, 1).unwrap();
        apply(&mut l, 0.0, &[INIT, ACK, ACK, RESET_TIMEOUT, ACK], &[7, 7, 7, 7, 9], &[3, 1, 2 ^ 8, 0, 5], &[0, 11, 12, 0, 0]);
        let info = l.inspect(&[7, 9, 8], 2.5);
        assert_eq!(info[0].status, TreeStatus::Pending);
        assert_eq!((info[0].resets, info[0].dedup_keys, info[0].age_us), (1, 2, 2_500_000));
        assert_eq!(l.spout_name(info[0].spout), "s");
        assert_eq!(info[1].status, TreeStatus::AwaitingInit);
        assert_eq!(info[2].status, TreeStatus::Absent);
    }

    #[test]
    fn oldest_and_histogram_count_pending_trees_only() {
        let mut l = Ledger::new(30.0, 3, 0.0, 1).unwrap();
        for (t, root) in [(0.0, 5u64), (1.0, 6), (2.0, 7), (2.0, 4)] {
            apply(&mut l, t, &[INIT], &[root], &[1], &[]);
        }
        apply(&mut l, 2.0, &[ACK], &[99], &[1], &[]); // an orphan is not a pending tree
        let roots: Vec<u64> = l.oldest(3, 3.0).iter().map(|i| i.root).collect();
        assert_eq!(roots, vec![5, 6, 4], "oldest first, ties by root");
        let (counts, sum) = l.age_histogram(&[1_000_000, 2_000_000], 3.0);
        assert_eq!(counts, vec![2, 1, 1]);
        assert_eq!(sum, 3_000_000 + 2_000_000 + 1_000_000 * 2);
    }

    #[test]
    fn force_fail_by_root_and_by_spout() {
        let mut l = Ledger::new(30.0, 3, 0.0, 1).unwrap();
        let roots: Vec<u64> = (1..=500).collect();
        let kinds = vec![INIT; roots.len()];
        apply(&mut l, 0.0, &kinds, &roots, &vec![1; roots.len()], &[]);
        apply(&mut l, 0.0, &[ACK], &[1000], &[1], &[]);
        let mut out = Outcomes::default();
        l.force_fail(&[3, 1000, 4242], 1.0, &mut out);
        assert_eq!((out.root.clone(), out.outcome.clone()), (vec![3], vec![FAILED]));
        let mut out = Outcomes::default();
        l.force_fail_spout("s", 1.0, &mut out);
        assert_eq!(out.len(), 499);
        assert!(out.outcome.iter().all(|&o| o == FAILED));
        assert_eq!((l.pending_trees(), l.orphan_entries()), (0, 1));
        assert_eq!(l.stats().force_failed, 500);
        l.force_fail_spout("nobody", 1.0, &mut out);
        assert_eq!(out.len(), 499);
    }

    #[test]
    fn a_timeout_collected_after_a_later_rotation_keeps_its_outcome() {
        // Timeout 2 s, 3 buckets (a rotation each second), cap 3.5 s: the tree is due at
        // t = 3 (age 3 s, under the cap); collected only after the rotation at t = 4 (age 4 s).
        let mut late = Ledger::new(2.0, 3, 0.0, 1).unwrap();
        late.set_timeout_rules(false, 3.5).unwrap();
        apply(&mut late, 0.0, &[INIT], &[7], &[3], &[]);
        let mut out = Outcomes::default();
        assert!(late.advance_at_most(3.0, 0, &mut out), "due, not collected");
        late.advance(4.0, &mut out);
        assert_eq!(out.outcome, vec![TIMED_OUT], "judged at the rotation that made it due");
        assert_eq!(late.stats().outlived, 0);
    }

    #[test]
    fn refuses_a_bad_cap() {
        let mut l = Ledger::new(30.0, 3, 0.0, 1).unwrap();
        assert!(l.set_timeout_rules(false, f64::NAN).is_err());
        assert!(l.set_timeout_rules(false, -1.0).is_err());
        assert!(l.set_timeout_rules(false, 400_000.0).is_err());
        assert_eq!(l.timeout_rules(), TimeoutRules::default(), "a refusal changes nothing");
    }
}
