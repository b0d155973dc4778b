//! The acker's ledger: Storm's XOR tree tracking with expiry by rotation generations.
//!
//! Same semantics as the reference model (`acker_service/reference_ledger.py`) and the
//! acker-semantics spec; each rule below names its reason. The RotatingMap's `b`
//! buckets become a generation number in every entry: a rotation bumps the current
//! generation, and an entry whose generation is `b` or more rotations old has expired.
//! Expired entries are collected by a scan that can run in bounded slices
//! (`expire_some`), and an expired entry that an operation touches before the scan
//! reached it is expired right then, so slicing never changes what a client sees.
//!
//! The ledger never reads a clock: every call takes `now` (seconds, monotonic).

use hashbrown::{HashMap, HashSet};

use crate::spouts::{Spouts, MAX_SPOUTS};
use crate::table::{Entry, Table, GEN_MASK, STARTED_MASK};

mod admin;
mod handoff;
pub use admin::{TimeoutRules, TreeInfo, TreeStatus};
pub use handoff::Moved;

/// Operation kinds (the proto enum's wire values).
pub const INIT: i32 = 1;
/// See [`INIT`].
pub const ACK: i32 = 2;
/// See [`INIT`].
pub const FAIL: i32 = 3;
/// See [`INIT`].
pub const RESET_TIMEOUT: i32 = 4;

/// Outcomes (the proto enum's wire values).
pub const ACKED: u8 = 1;
/// See [`ACKED`].
pub const FAILED: u8 = 2;
/// See [`ACKED`].
pub const TIMED_OUT: u8 = 3;
/// Not an end: a RESET_TIMEOUT gave a tree with a known spout a fresh timeout.
pub const TIMEOUT_RESET: u8 = 4;
/// The tree reached the maximum lifetime (`--max-tree-lifetime`): a timeout the spout can tell apart.
pub const LIFETIME_EXCEEDED: u8 = 7;

/// Most buckets: generations are stored modulo 64, and an expired entry must be
/// collected before its age could wrap (ages stay below `2 * buckets`).
pub const MAX_BUCKETS: u64 = 32;

/// A batch of operations as parallel slices, already validated (see `validate`).
pub struct Ops<'a> {
    /// One kind per operation.
    pub kinds: &'a [i32],
    /// Non-zero root ids.
    pub roots: &'a [u64],
    /// One value per operation.
    pub values: &'a [u64],
    /// Empty, or one dedup key per operation (0: no key).
    pub dedup_keys: &'a [u64],
    /// Spout names referenced by INITs.
    pub spouts: &'a [String],
    /// Empty (every INIT names `spouts[0]`), or one index into `spouts` per operation.
    pub spout_index: &'a [u32],
}

/// Outcomes as columns: outcome `i` is (spout[i], root[i], outcome[i], latency_us[i]).
#[derive(Default, Debug, Clone, PartialEq)]
pub struct Outcomes {
    /// Spout ids (names via [`Ledger::spout_name`], valid until the next ledger call).
    pub spout: Vec<u16>,
    /// Root ids.
    pub root: Vec<u64>,
    /// Outcome codes.
    pub outcome: Vec<u8>,
    /// Microseconds from the tree's init to this outcome.
    pub latency_us: Vec<u64>,
}

impl Outcomes {
    fn reserve(&mut self, n: usize) {
        self.spout.reserve(n);
        self.root.reserve(n);
        self.outcome.reserve(n);
        self.latency_us.reserve(n);
    }

    fn push(&mut self, spout: u16, root: u64, outcome: u8, latency_us: u64) {
        self.spout.push(spout);
        self.root.push(root);
        self.outcome.push(outcome);
        self.latency_us.push(latency_us);
    }

    /// Number of outcomes.
    pub fn len(&self) -> usize {
        self.root.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.root.is_empty()
    }
}

/// What one `apply` did.
#[derive(Default, Debug)]
pub struct BatchOutput {
    /// Trees that ended: those that expired before the batch first, then the batch's own.
    pub ended: Outcomes,
    /// TIMEOUT_RESET notifications for trees with a known spout.
    pub resets: Outcomes,
    /// Operations that changed the ledger.
    pub applied: u64,
    /// ACKs dropped because their dedup key was already applied to the tree.
    pub deduplicated: u64,
    /// Duplicate INITs, and RESET_TIMEOUTs for roots with no entry.
    pub ignored: u64,
}

/// Monotonic counters (the fields of the Python `LedgerStats`).
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub inits: u64,
    pub acks: u64,
    pub fails: u64,
    pub resets: u64,
    pub acked: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub orphaned: u64,
    pub duplicate_inits: u64,
    pub deduplicated: u64,
    /// Trees ended LIFETIME_EXCEEDED (also counted in `timed_out`).
    pub outlived: u64,
    /// Trees ended FAILED by `force_fail` (also counted in `failed`).
    pub force_failed: u64,
    /// Trees handed to another acker by a layout change (see `handoff`).
    pub moved_out: u64,
    /// Trees taken from another acker by a layout change.
    pub moved_in: u64,
}

/// Why a ledger refuses a whole call.
#[derive(Debug, PartialEq, Eq)]
pub enum LedgerError {
    /// Constructor arguments out of range.
    Config(String),
    /// The batch would need more distinct pending spouts than an entry can name.
    TooManySpouts(String),
}

/// Pending tuple trees of one shard.
pub struct Ledger {
    table: Table,
    dedup: DedupKeys,
    spouts: Spouts,
    buckets: u64,
    timeout: f64,
    period: f64,
    epoch: f64,
    next_rotation: f64,
    generation: u64,
    open_trees: u64,
    stats: Stats,
    /// Progress timeouts and the lifetime cap (see `admin`).
    rules: TimeoutRules,
    /// Ledger time (µs) of the rotation that began each generation, by generation modulo 64:
    /// a due tree's lifetime is judged at the rotation that made it due, however late it is collected.
    rotations_us: [u64; GEN_MASK as usize + 1],
    /// Reset counts of roots whose entry has the notes bit (most trees have none).
    notes: HashMap<u64, u32>,
}

/// CPython's float floor division (`a // b`), so rotation counts match the reference
/// model bit for bit (it is not always `floor(a / b)`: `7.0 // 0.1 == 69.0`).
fn py_floordiv(a: f64, b: f64) -> f64 {
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut floordiv = div.floor();
        if div - floordiv > 0.5 {
            floordiv += 1.0;
        }
        floordiv
    } else {
        0.0f64.copysign(a / b)
    }
}

impl Ledger {
    /// A ledger expiring trees `message_timeout` seconds after their last put, with
    /// `buckets` rotation buckets; `now` is the clock at creation, `seed` randomises the table.
    pub fn new(message_timeout: f64, buckets: u64, now: f64, seed: u64) -> Result<Ledger, LedgerError> {
        // Same checks and messages as the reference model (`not > 0` also refuses NaN).
        if message_timeout.is_nan() || message_timeout <= 0.0 {
            return Err(LedgerError::Config(format!(
                "message_timeout must be positive, got {message_timeout}"
            )));
        }
        if buckets < 2 {
            return Err(LedgerError::Config(format!(
                "a RotatingMap needs at least 2 buckets, got {buckets}"
            )));
        }
        if buckets > MAX_BUCKETS {
            return Err(LedgerError::Config(format!(
                "the native ledger supports at most {MAX_BUCKETS} buckets, got {buckets}; \
                 use fewer buckets or the reference engine"
            )));
        }
        let period = message_timeout / (buckets - 1) as f64;
        Ok(Ledger {
            table: Table::new(seed),
            dedup: DedupKeys::default(),
            spouts: Spouts::new(),
            buckets,
            timeout: message_timeout,
            period,
            epoch: now,
            next_rotation: now + period,
            generation: 0,
            open_trees: 0,
            stats: Stats::default(),
            rules: TimeoutRules::default(),
            rotations_us: [0; GEN_MASK as usize + 1],
            notes: HashMap::new(),
        })
    }

    /// Number of buckets `b`.
    pub fn buckets(&self) -> u64 {
        self.buckets
    }

    /// The message timeout `T` in seconds.
    pub fn message_timeout(&self) -> f64 {
        self.timeout
    }

    /// Seconds between rotations, `T / (b - 1)`.
    pub fn rotation_period(&self) -> f64 {
        self.period
    }

    /// Trees whose init was applied and that have no outcome yet.
    pub fn pending_trees(&self) -> u64 {
        self.open_trees
    }

    /// Entries created by acks or fails whose init has not (yet) arrived.
    pub fn orphan_entries(&self) -> u64 {
        self.table.len() as u64 - self.open_trees
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Slots of the entry table (memory is 24 bytes per slot plus dedup keys).
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Seconds until the next rotation is due (never negative).
    pub fn seconds_until_rotation(&self, now: f64) -> f64 {
        (self.next_rotation - now).max(0.0)
    }

    /// The name of a spout id found in outcomes, valid until the next `apply`/`advance`.
    pub fn spout_name(&self, id: u16) -> &str {
        self.spouts.name(id)
    }

    /// Root ids of all entries (tests and diagnostics; not the hot path).
    pub fn roots(&self) -> Vec<u64> {
        self.table.roots()
    }

    fn micros(&self, now: f64) -> u64 {
        // Wrapping: start times are kept modulo 2^39 microseconds (see `table`).
        (((now - self.epoch) * 1e6).round() as i64 as u64) & STARTED_MASK
    }

    fn latency(now_us: u64, e: &Entry) -> u64 {
        now_us.wrapping_sub(e.started()) & STARTED_MASK
    }

    #[inline]
    fn is_expired(&self, e: &Entry) -> bool {
        (self.generation.wrapping_sub(e.gen()) & GEN_MASK) >= self.buckets || self.outlived(e)
    }

    /// Rotate as many times as the clock says are due; return whether any rotation happened.
    ///
    /// Only marks what expired: `expire_some` collects it (the reference model does both at once).
    pub fn advance_clock(&mut self, now: f64) -> bool {
        if now < self.next_rotation {
            return false;
        }
        // A long stall owes many rotations; count them instead of looping, as the reference does.
        let due = py_floordiv(now - self.next_rotation, self.period) + 1.0;
        self.next_rotation += due * self.period;
        // After `buckets` rotations everything has expired; more would change nothing.
        let steps = if due >= self.buckets as f64 { self.buckets } else { due as u64 };
        // The lifetime cap is judged at rotations, like the timeout, so slicing changes nothing.
        let now_us = self.micros(now);
        for step in 1..=steps {
            self.rotations_us[(self.generation.wrapping_add(step) & GEN_MASK) as usize] = now_us;
        }
        self.generation = self.generation.wrapping_add(steps);
        self.rules.rotated_at_us = now_us;
        if !self.table.is_empty() {
            // (Re)start the collecting scan: the expired set only grows, so one full pass suffices.
            self.table.scan_pos = Some(0);
        }
        true
    }

    /// Collect at most `limit` expired entries into `out`; return whether more may be due.
    ///
    /// Trees with a spout end TIMED_OUT; entries without one (acks whose init never
    /// came) are dropped and counted as orphaned, as the spec says.
    pub fn expire_some(&mut self, now: f64, limit: usize, out: &mut Outcomes) -> bool {
        let now_us = self.micros(now);
        let mut expired = 0;
        while let Some(pos) = self.table.scan_pos {
            if pos >= self.table.capacity() {
                self.table.scan_pos = None;
                self.table.shrink_if_sparse();
                return false;
            }
            if expired == limit {
                return true;
            }
            let e = *self.table.get(pos);
            if e.root != 0 && self.is_expired(&e) {
                // Do not step: backward-shift deletion may move the next entry into `pos`.
                self.table.remove_at(pos);
                self.settle_expired(&e, now_us, out);
                expired += 1;
            } else {
                self.table.scan_pos = Some(pos + 1);
            }
        }
        false
    }

    /// Rotate and collect everything due (the reference model's `advance`).
    pub fn advance(&mut self, now: f64, out: &mut Outcomes) {
        self.advance_at_most(now, usize::MAX, out);
    }

    /// Rotate as due, then collect at most `limit` expired trees; true if more are due.
    pub fn advance_at_most(&mut self, now: f64, limit: usize, out: &mut Outcomes) -> bool {
        self.spouts.collect();
        self.advance_clock(now);
        self.expire_some(now, limit, out)
    }

    fn settle_expired(&mut self, e: &Entry, now_us: u64, out: &mut Outcomes) {
        self.forget_side_state(e);
        let spout = e.spout();
        if spout == 0 {
            self.stats.orphaned += 1;
            return;
        }
        self.open_trees -= 1;
        self.stats.timed_out += 1;
        let outcome = if self.ended_outlived(e) {
            self.stats.outlived += 1;
            LIFETIME_EXCEEDED
        } else {
            TIMED_OUT
        };
        out.push(spout, e.root, outcome, Self::latency(now_us, e));
        self.spouts.release(spout);
    }

    /// Drop what the side tables hold for an entry that leaves the ledger.
    #[inline]
    fn forget_side_state(&mut self, e: &Entry) {
        if e.has_dedup() {
            self.dedup.forget(e.root);
        }
        if e.has_notes() {
            self.notes.remove(&e.root);
        }
    }

    /// Refuse a batch that would need more distinct pending spouts than ids exist.
    fn check_spout_room(&self, ops: &Ops) -> Result<(), LedgerError> {
        if self.spouts.live() + ops.spouts.len() <= MAX_SPOUTS {
            return Ok(());
        }
        let new = ops.spouts.iter().filter(|n| self.spouts.lookup(n).is_none()).count();
        if self.spouts.live() + new > MAX_SPOUTS {
            return Err(LedgerError::TooManySpouts(format!(
                "this acker already holds pending trees of {} distinct spouts and the batch names {new} more; \
                 at most {MAX_SPOUTS} spouts can have pending trees at once",
                self.spouts.live()
            )));
        }
        Ok(())
    }

    /// Apply a validated batch at time `now`: first expire what is due, then every operation.
    pub fn apply(&mut self, ops: &Ops, now: f64, out: &mut BatchOutput) -> Result<(), LedgerError> {
        self.apply_expiring_at_most(ops, now, usize::MAX, out)
    }

    /// `apply`, collecting at most `expire_limit` expired trees first (bounded latency
    /// under a mass timeout). Expired entries the batch touches still expire before
    /// it applies to them; the rest wait for `expire_some`.
    pub fn apply_expiring_at_most(
        &mut self,
        ops: &Ops,
        now: f64,
        expire_limit: usize,
        out: &mut BatchOutput,
    ) -> Result<(), LedgerError> {
        self.check_spout_room(ops)?;
        self.spouts.collect();
        self.advance_clock(now);
        self.expire_some(now, expire_limit, &mut out.ended);
        let now_us = self.micros(now);
        let generation = self.generation & GEN_MASK;
        let n = ops.kinds.len();
        // Room for every op to create an entry: no resize inside the loop, so the homes
        // computed up front stay valid and each root is hashed once.
        self.table.reserve(n);
        let homes: Vec<usize> = ops.roots.iter().map(|&r| self.table.home(r)).collect();
        out.ended.reserve(n / 2);
        let mut batch_ids = vec![0u16; ops.spouts.len()];
        let (mut inits, mut acked, mut failed, mut acks, mut fails, mut resets, mut dup_inits) =
            (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        const AHEAD: usize = 8;
        for i in 0..n {
            if let Some(&h) = homes.get(i + AHEAD) {
                self.table.prefetch(h);
            }
            let (kind, root, value) = (ops.kinds[i], ops.roots[i], ops.values[i]);
            let mut slot = self.table.find_from(homes[i], root);
            if let Some(s) = slot {
                let e = *self.table.get(s);
                if self.is_expired(&e) {
                    // Due but not collected yet (a sliced expiry): it expires first, as a scan would have.
                    self.table.remove_at(s);
                    self.settle_expired(&e, now_us, &mut out.ended);
                    slot = None;
                }
            }
            let s = match slot {
                Some(s) => s,
                None => {
                    if kind == RESET_TIMEOUT {
                        // Nothing to keep alive; an entry would only be an orphan.
                        out.ignored += 1;
                        continue;
                    }
                    // An ack or fail may overtake its init: create the entry now.
                    self.table.insert_from(homes[i], Entry::new(root, now_us, generation))
                }
            };
            match kind {
                ACK => {
                    let key = ops.dedup_keys.get(i).copied().unwrap_or(0);
                    if key != 0 && !self.remember_key(s, root, key) {
                        // A re-run Spark task: the first copy of this ack counted.
                        out.deduplicated += 1;
                        continue;
                    }
                    let e = self.table.get_mut(s);
                    e.val ^= value;
                    if self.rules.progress {
                        // Progress mode: an applied ack is progress, the tree gets a fresh timeout.
                        e.set_gen(generation);
                    }
                    acks += 1;
                }
                INIT => {
                    if self.table.get(s).spout() != 0 {
                        // Init is set-once: a retried init must not XOR itself back out
                        // and let the tree reach 0 (a false ack).
                        dup_inits += 1;
                        out.ignored += 1;
                        continue;
                    }
                    let si = ops.spout_index.get(i).map_or(0, |&x| x as usize);
                    let id = match batch_ids[si] {
                        0 => {
                            let id = self.spouts.acquire(&ops.spouts[si]);
                            batch_ids[si] = id;
                            id
                        }
                        id => {
                            self.spouts.retain(id);
                            id
                        }
                    };
                    let e = self.table.get_mut(s);
                    e.val ^= value;
                    e.set_spout(id);
                    e.set_started(now_us); // latency is measured from init
                    inits += 1;
                }
                FAIL => {
                    self.table.get_mut(s).set_failed();
                    fails += 1;
                }
                _ => {
                    // reset_timeout: back to the nursery, a fresh timeout for slow work.
                    let e = self.table.get_mut(s);
                    e.set_gen(generation);
                    e.set_notes();
                    let e = *e;
                    *self.notes.entry(root).or_insert(0) += 1;
                    resets += 1;
                    out.applied += 1;
                    if e.spout() != 0 {
                        out.resets.push(e.spout(), root, TIMEOUT_RESET, Self::latency(now_us, &e));
                    }
                    continue;
                }
            }
            out.applied += 1;
            let e = *self.table.get(s);
            if e.spout() != 0 {
                // Storm's order: a zero checksum wins over the failed flag.
                let outcome = if e.val == 0 {
                    acked += 1;
                    ACKED
                } else if e.failed() {
                    failed += 1;
                    FAILED
                } else {
                    continue;
                };
                self.table.remove_at(s);
                self.forget_side_state(&e);
                out.ended.push(e.spout(), root, outcome, Self::latency(now_us, &e));
                self.spouts.release(e.spout());
            }
        }
        self.open_trees = self.open_trees + inits - acked - failed;
        let st = &mut self.stats;
        st.inits += inits;
        st.acked += acked;
        st.failed += failed;
        st.acks += acks;
        st.fails += fails;
        st.resets += resets;
        st.duplicate_inits += dup_inits;
        st.deduplicated += out.deduplicated;
        Ok(())
    }

    /// Record `key` for the entry in slot `s`; false if the tree has seen it already.
    fn remember_key(&mut self, s: usize, root: u64, key: u64) -> bool {
        let e = self.table.get_mut(s);
        if !e.has_dedup() {
            // Created on the first keyed ack only: most trees never pay for a key set.
            e.set_dedup();
            self.dedup.first.insert(root, key);
            return true;
        }
        self.dedup.remember(root, key)
    }
}

/// The dedup keys applied to pending trees, kept beside the entry table.
///
/// Most keyed trees see one key (the client keys each flushed batch, and a tree's
/// acks usually travel in one batch), so the first key of a tree is a flat
/// root -> key pair (16 bytes a slot); only trees with a second key get a set.
/// A set per tree from the first key cost several times that per pending tree
/// (the figures and their command: docs/benchmarks.md).
#[derive(Default)]
struct DedupKeys {
    first: HashMap<u64, u64>,
    more: HashMap<u64, HashSet<u64>>,
}

impl DedupKeys {
    /// Record `key` for `root`, whose first key is already recorded; false if seen before.
    fn remember(&mut self, root: u64, key: u64) -> bool {
        if self.first.get(&root) == Some(&key) {
            return false;
        }
        self.more.entry(root).or_default().insert(key)
    }

    /// Drop every key of `root` (its tree ended or expired).
    fn forget(&mut self, root: u64) {
        if self.first.remove(&root).is_some() {
            self.more.remove(&root);
        }
    }

    /// Keys held for `root` (whose entry has the dedup bit).
    fn count(&self, root: u64) -> u32 {
        let first = u32::from(self.first.contains_key(&root));
        first + self.more.get(&root).map_or(0, |m| m.len() as u32)
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.first.is_empty() && self.more.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: u64 = 0x9E37_79B9_7F4A_7C15;

    fn spouts() -> Vec<String> {
        vec!["s".to_owned()]
    }

    /// Apply one batch of spout "s" and check conservation (also used by `admin`'s tests).
    pub(super) fn run(l: &mut Ledger, now: f64, kinds: &[i32], roots: &[u64], values: &[u64], keys: &[u64]) -> BatchOutput {
        run_limited(l, now, kinds, roots, values, keys, usize::MAX)
    }

    fn run_limited(
        l: &mut Ledger,
        now: f64,
        kinds: &[i32],
        roots: &[u64],
        values: &[u64],
        keys: &[u64],
        limit: usize,
    ) -> BatchOutput {
        let names = spouts();
        let ops = Ops {
            kinds,
            roots,
            values,
            dedup_keys: keys,
            spouts: &names,
            spout_index: &[],
        };
        let mut out = BatchOutput::default();
        l.apply_expiring_at_most(&ops, now, limit, &mut out).unwrap();
        let s = l.stats();
        assert_eq!(
            s.inits + s.moved_in,
            s.acked + s.failed + s.timed_out + l.pending_trees() + s.moved_out,
            "conservation"
        );
        out
    }

    #[test]
    fn floordiv_matches_python() {
        assert_eq!(py_floordiv(7.0, 0.1), 69.0);
        assert_eq!(py_floordiv(3.0, 1.5), 2.0);
        assert_eq!(py_floordiv(0.0, 2.0), 0.0);
    }

    #[test]
    fn init_then_ack_acks_with_latency() {
        let mut l = Ledger::new(30.0, 3, 1000.0, 1).unwrap();
        run(&mut l, 1000.0, &[INIT], &[R], &[5], &[]);
        let out = run(&mut l, 1002.5, &[ACK], &[R], &[5], &[]);
        assert_eq!(out.ended.root, vec![R]);
        assert_eq!(out.ended.outcome, vec![ACKED]);
        assert_eq!(out.ended.latency_us, vec![2_500_000]);
        assert_eq!(l.spout_name(out.ended.spout[0]), "s");
        assert_eq!((l.pending_trees(), l.orphan_entries()), (0, 0));
    }

    #[test]
    fn duplicate_init_is_ignored() {
        let mut l = Ledger::new(30.0, 3, 0.0, 1).unwrap();
        let out = run(&mut l, 0.0, &[INIT, INIT], &[R, R], &[3, 3], &[]);
        assert_eq!((out.applied, out.ignored, out.ended.len()), (1, 1, 0));
        assert_eq!(l.stats().duplicate_inits, 1);
    }

    #[test]
    fn dedup_key_drops_the_repeat() {
        let mut l = Ledger::new(30.0, 3, 0.0, 1).unwrap();
        let out = run(&mut l, 0.0, &[INIT, ACK, ACK, ACK], &[R; 4], &[3, 1, 1, 2], &[0, 9, 9, 8]);
        assert_eq!((out.applied, out.deduplicated), (3, 1));
        assert_eq!(out.ended.outcome, vec![ACKED]);
        assert!(l.dedup.is_empty(), "keys leave with the tree");
    }

    #[test]
    fn later_keys_of_a_tree_are_deduplicated_too() {
        // First key in the flat table, the second and third in the tree's set:
        // a repeat of any of them is dropped, whichever table holds it.
        let mut l = Ledger::new(30.0, 3, 0.0, 1).unwrap();
        let out = run(&mut l, 0.0, &[INIT, ACK, ACK, ACK, ACK, ACK], &[R; 6], &[15, 1, 2, 1, 2, 4], &[0, 5, 6, 5, 6, 7]);
        assert_eq!((out.applied, out.deduplicated), (4, 2));
        assert!(out.ended.outcome.is_empty(), "15 ^ 1 ^ 2 ^ 4 is 8: still pending");
        assert_eq!((l.dedup.first.len(), l.dedup.more.len()), (1, 1));
        let out = run(&mut l, 0.0, &[ACK], &[R], &[8], &[8]);
        assert_eq!(out.ended.outcome, vec![ACKED]);
        assert!(l.dedup.is_empty(), "keys of both tables leave with the tree");
    }

    #[test]
    fn expiry_inside_window_and_orphans_counted() {
        let (t, b) = (12.0, 4u64);
        let mut l = Ledger::new(t, b, 0.0, 1).unwrap();
        run(&mut l, 1.0, &[INIT, ACK], &[R, R + 1], &[3, 4], &[]);
        let mut out = Outcomes::default();
        l.advance(1.0 + t - 1e-6, &mut out);
        assert!(out.is_empty());
        l.advance(1.0 + t + t / (b - 1) as f64, &mut out);
        assert_eq!((out.root.clone(), out.outcome.clone()), (vec![R], vec![TIMED_OUT]));
        assert_eq!((l.stats().orphaned, l.pending_trees(), l.orphan_entries()), (1, 0, 0));
    }

    #[test]
    fn sliced_expiry_collects_everything_and_touch_expires_early() {
        let mut l = Ledger::new(2.0, 3, 0.0, 7).unwrap();
        let roots: Vec<u64> = (1..=1000u64).collect();
        run(&mut l, 0.0, &vec![INIT; 1000], &roots, &vec![1; 1000], &[]);
        assert!(l.advance_clock(10.0));
        let mut out = Outcomes::default();
        assert!(l.expire_some(10.0, 100, &mut out));
        assert_eq!(out.len(), 100);
        // An operation on a due root that the scan has not reached expires it first.
        let pending = roots.iter().copied().find(|r| !out.root.contains(r)).unwrap();
        let b = run_limited(&mut l, 10.0, &[ACK], &[pending], &[1], &[], 0);
        assert_eq!(b.ended.root, vec![pending]);
        assert_eq!(b.ended.outcome, vec![TIMED_OUT]);
        assert_eq!(l.orphan_entries(), 1, "the ack then made an orphan");
        while l.expire_some(10.0, 50, &mut out) {}
        assert_eq!(out.len() + 1, 1000);
        assert_eq!(l.pending_trees(), 0);
    }

    #[test]
    fn reset_moves_to_nursery_and_notifies() {
        let mut l = Ledger::new(4.0, 3, 0.0, 1).unwrap();
        run(&mut l, 0.0, &[INIT], &[R], &[3], &[]);
        let out = run(&mut l, 3.5, &[RESET_TIMEOUT, RESET_TIMEOUT], &[R, R + 1], &[0, 0], &[]);
        assert_eq!((out.applied, out.ignored), (1, 1));
        assert_eq!(out.resets.outcome, vec![TIMEOUT_RESET]);
        let mut ended = Outcomes::default();
        l.advance(7.0, &mut ended);
        assert!(ended.is_empty(), "the reset gave a fresh timeout");
        l.advance(3.5 + 4.0 + 2.0, &mut ended);
        assert_eq!(ended.outcome, vec![TIMED_OUT]);
    }

    #[test]
    fn constructor_refuses_bad_arguments() {
        assert!(Ledger::new(0.0, 3, 0.0, 0).is_err());
        assert!(Ledger::new(f64::NAN, 3, 0.0, 0).is_err());
        assert!(Ledger::new(1.0, 1, 0.0, 0).is_err());
        assert!(Ledger::new(1.0, MAX_BUCKETS + 1, 0.0, 0).is_err());
    }
}
