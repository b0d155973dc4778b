//! Moving pending entries between ackers (reshard, drain): a layout change gives some roots
//! a new owner, which takes their entries from the old one. Same rules as the
//! reference model's `export_moving` / `import_entries` (`acker_service/handoff.py`
//! describes the columns; docs/acker-semantics.md, "Moving trees", says why each
//! rule holds through a move).

use super::{Ledger, LedgerError, Outcomes, ACKED, FAILED};
use crate::spouts::MAX_SPOUTS;
use crate::table::{Entry, GEN_MASK, STARTED_MASK};

/// Entries on the move, as columns: entry `i` is `roots[i]`; its dedup keys are the
/// next `key_counts[i]` of `keys`. `spout_index[i]` is -1 while the init has not arrived.
#[derive(Default, Debug, Clone, PartialEq)]
pub struct Moved {
    pub roots: Vec<u64>,
    pub values: Vec<u64>,
    pub spouts: Vec<String>,
    pub spout_index: Vec<i32>,
    /// Microseconds since the tree started, on the exporting ledger's clock.
    pub ages_us: Vec<u64>,
    /// Rotations since the entry was last put (its place in the timeout window).
    pub generations: Vec<u8>,
    pub failed: Vec<bool>,
    pub resets: Vec<u32>,
    pub key_counts: Vec<u32>,
    pub keys: Vec<u64>,
}

impl Ledger {
    /// Remove and return the live entries whose root is not `keep`'s under `count`
    /// shards (`keep` negative: all). Rotates as due first; due entries stay and
    /// time out here, as they would have without the move.
    pub fn export_moving(&mut self, count: u64, keep: i64, now: f64) -> Moved {
        let (leaving, _) = self.moving_roots(count, keep, now);
        let out = self.remove_moving(leaving, self.micros(now));
        // Export runs a handful of times per layout change: give back the memory at once.
        self.table.shrink_if_sparse();
        out
    }

    /// The roots and ages (microseconds since the tree started) of the live entries
    /// `export_moving` would take out, leaving every entry in place: a cut lists what
    /// leaves at once and hands it over in slices (`export_roots`), youngest first.
    pub fn moving_roots(&mut self, count: u64, keep: i64, now: f64) -> (Vec<u64>, Vec<u64>) {
        self.spouts.collect();
        self.advance_clock(now);
        let now_us = self.micros(now);
        let count = count.max(1);
        let mut roots = Vec::new();
        let mut ages = Vec::new();
        for e in self.table.entries() {
            if (keep < 0 || e.root % count != keep as u64) && !self.is_expired(e) {
                roots.push(e.root);
                ages.push(Self::latency(now_us, e));
            }
        }
        (roots, ages)
    }

    /// Remove and return the live entries among `roots` (those absent, or due and left
    /// to time out here, are skipped): one slice of a cut listed by `moving_roots`.
    /// `last`: the cut's last slice, after which the table gives back its memory
    /// (not per slice: each shrink rehashes the table).
    pub fn export_roots(&mut self, roots: &[u64], now: f64, last: bool) -> Moved {
        self.spouts.collect();
        self.advance_clock(now);
        let mut leaving: Vec<u64> = roots.to_vec();
        leaving.sort_unstable();
        leaving.dedup();
        leaving.retain(|&r| match self.table.find(r) {
            Some(s) => !self.is_expired(self.table.get(s)),
            None => false,
        });
        let out = self.remove_moving(leaving, self.micros(now));
        if last {
            self.table.shrink_if_sparse();
        }
        out
    }

    /// Take the entries of `leaving` (each present and live) out of the ledger as columns.
    fn remove_moving(&mut self, leaving: Vec<u64>, now_us: u64) -> Moved {
        let mut out = Moved::default();
        let mut names: Vec<u16> = Vec::new();
        let mut trees = 0u64;
        for root in leaving {
            let s = self.table.find(root).expect("a root found by the scan");
            let e = self.table.remove_at(s);
            out.roots.push(root);
            out.values.push(e.val);
            let spout = e.spout();
            if spout == 0 {
                out.spout_index.push(-1);
            } else {
                let i = match names.iter().position(|&id| id == spout) {
                    Some(i) => i,
                    None => {
                        names.push(spout);
                        out.spouts.push(self.spouts.name(spout).to_owned());
                        names.len() - 1
                    }
                };
                out.spout_index.push(i as i32);
                trees += 1;
            }
            out.ages_us.push(Self::latency(now_us, &e));
            out.generations
                .push((self.generation.wrapping_sub(e.gen()) & GEN_MASK) as u8);
            out.failed.push(e.failed());
            out.resets.push(if e.has_notes() {
                self.notes.get(&root).copied().unwrap_or(0)
            } else {
                0
            });
            let before = out.keys.len();
            if e.has_dedup() {
                if let Some(&k) = self.dedup.first.get(&root) {
                    out.keys.push(k);
                }
                if let Some(more) = self.dedup.more.get(&root) {
                    out.keys.extend(more.iter().copied());
                }
                out.keys[before..].sort_unstable();
            }
            out.key_counts.push((out.keys.len() - before) as u32);
            self.forget_side_state(&e);
            if spout != 0 {
                self.spouts.release(spout);
            }
        }
        self.open_trees -= trees;
        self.stats.moved_out += trees;
        out
    }

    /// Copy the live entries whose root is `index`'s under `count` shards, leaving every
    /// entry in place (a restarted replica's catch-up: the partner keeps serving the range).
    /// Rotates as due first; due entries are not copied: they time out here.
    pub fn export_snapshot(&mut self, count: u64, index: u64, now: f64) -> Moved {
        self.spouts.collect();
        self.advance_clock(now);
        let now_us = self.micros(now);
        let count = count.max(1);
        let mut out = Moved::default();
        let mut names: Vec<u16> = Vec::new();
        for e in self.table.entries() {
            if e.root % count != index || self.is_expired(e) {
                continue;
            }
            out.roots.push(e.root);
            out.values.push(e.val);
            let spout = e.spout();
            if spout == 0 {
                out.spout_index.push(-1);
            } else {
                let i = match names.iter().position(|&id| id == spout) {
                    Some(i) => i,
                    None => {
                        names.push(spout);
                        out.spouts.push(self.spouts.name(spout).to_owned());
                        names.len() - 1
                    }
                };
                out.spout_index.push(i as i32);
            }
            out.ages_us.push(Self::latency(now_us, e));
            out.generations
                .push((self.generation.wrapping_sub(e.gen()) & GEN_MASK) as u8);
            out.failed.push(e.failed());
            out.resets.push(if e.has_notes() {
                self.notes.get(&e.root).copied().unwrap_or(0)
            } else {
                0
            });
            let before = out.keys.len();
            if e.has_dedup() {
                if let Some(&k) = self.dedup.first.get(&e.root) {
                    out.keys.push(k);
                }
                if let Some(more) = self.dedup.more.get(&e.root) {
                    out.keys.extend(more.iter().copied());
                }
                out.keys[before..].sort_unstable();
            }
            out.key_counts.push((out.keys.len() - before) as u32);
        }
        out
    }

    /// Merge moved entries in by XOR (failed OR, earliest start, keys united, the fresher
    /// timeout); trees that the merge ended go to `out` (ACKED before FAILED, Storm's
    /// order), after any due entry a moved one met, which expires first.
    pub fn import_entries(
        &mut self,
        moved: &Moved,
        now: f64,
        out: &mut Outcomes,
    ) -> Result<(), LedgerError> {
        let new = moved
            .spouts
            .iter()
            .filter(|n| self.spouts.lookup(n).is_none())
            .count();
        if self.spouts.live() + new > MAX_SPOUTS {
            return Err(LedgerError::TooManySpouts(format!(
                "the moved entries name {new} spouts this acker has no pending trees of; \
                 at most {MAX_SPOUTS} spouts can have pending trees at once"
            )));
        }
        self.spouts.collect();
        self.advance_clock(now);
        let now_us = self.micros(now);
        let oldest = self.buckets - 1;
        self.table.reserve(moved.roots.len());
        let mut offset = 0usize;
        for i in 0..moved.roots.len() {
            let root = moved.roots[i];
            let nkeys = moved.key_counts[i] as usize;
            let keys = &moved.keys[offset..offset + nkeys];
            offset += nkeys;
            let started = now_us.wrapping_sub(moved.ages_us[i]) & STARTED_MASK;
            let gen = self
                .generation
                .wrapping_sub((moved.generations[i] as u64).min(oldest))
                & GEN_MASK;
            let mut slot = self.table.find(root);
            if let Some(s) = slot {
                let e = *self.table.get(s);
                if self.is_expired(&e) {
                    self.table.remove_at(s);
                    self.settle_expired(&e, now_us, out);
                    slot = None;
                }
            }
            let s = match slot {
                Some(s) => {
                    let e = *self.table.get(s);
                    let mine_age = Self::latency(now_us, &e);
                    let my_gen_age = self.generation.wrapping_sub(e.gen()) & GEN_MASK;
                    let e = self.table.get_mut(s);
                    // The fresher of the two timeouts: the tree was touched then.
                    if (moved.generations[i] as u64).min(oldest) < my_gen_age {
                        e.set_gen(gen);
                    }
                    let incoming_init = moved.spout_index[i] >= 0;
                    if (e.spout() == 0) != incoming_init {
                        if moved.ages_us[i] > mine_age {
                            e.set_started(started);
                        }
                    } else if incoming_init {
                        e.set_started(started); // latency is measured from init
                    }
                    s
                }
                None => self.table.insert_new(Entry::new(root, started, gen)),
            };
            let e = self.table.get_mut(s);
            e.val ^= moved.values[i];
            if moved.failed[i] {
                e.set_failed();
            }
            if moved.resets[i] > 0 {
                e.set_notes();
                *self.notes.entry(root).or_insert(0) += moved.resets[i];
            }
            for &k in keys {
                self.remember_key(s, root, k);
            }
            if moved.spout_index[i] >= 0 {
                self.stats.moved_in += 1;
                if self.table.get(s).spout() == 0 {
                    let id = self
                        .spouts
                        .acquire(&moved.spouts[moved.spout_index[i] as usize]);
                    self.table.get_mut(s).set_spout(id);
                    self.open_trees += 1;
                }
            }
            let e = *self.table.get(s);
            if e.spout() != 0 && (e.val == 0 || e.failed()) {
                let outcome = if e.val == 0 {
                    self.stats.acked += 1;
                    ACKED
                } else {
                    self.stats.failed += 1;
                    FAILED
                };
                self.table.remove_at(s);
                self.forget_side_state(&e);
                self.open_trees -= 1;
                out.push(e.spout(), root, outcome, Self::latency(now_us, &e));
                self.spouts.release(e.spout());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::run;
    use super::super::{Ledger, Outcomes, ACK, ACKED, INIT};

    const R: u64 = 0x9E37_79B9_7F4A_7C15;

    #[test]
    fn a_tree_split_between_two_ledgers_acks_once_merged() {
        let mut a = Ledger::new(30.0, 3, 0.0, 1).unwrap();
        let mut b = Ledger::new(30.0, 3, 0.0, 2).unwrap();
        run(&mut a, 1.0, &[INIT, ACK], &[R, R], &[6, 2], &[0, 7]);
        let moved = a.export_moving(2, -1, 2.0);
        assert_eq!(
            (
                moved.roots.clone(),
                moved.values.clone(),
                moved.keys.clone()
            ),
            (vec![R], vec![4], vec![7])
        );
        assert_eq!((a.pending_trees(), a.stats().moved_out), (0, 1));
        let mut out = Outcomes::default();
        b.import_entries(&moved, 2.0, &mut out).unwrap();
        assert!(out.is_empty());
        let dup = run(&mut b, 3.0, &[ACK], &[R], &[2], &[7]);
        assert_eq!(
            dup.deduplicated, 1,
            "the moved key still drops a re-sent batch"
        );
        let end = run(&mut b, 3.0, &[ACK], &[R], &[4], &[8]);
        assert_eq!(end.ended.outcome, vec![ACKED]);
        assert_eq!(
            end.ended.latency_us,
            vec![2_000_000],
            "latency from the init at the old owner"
        );
    }
}
