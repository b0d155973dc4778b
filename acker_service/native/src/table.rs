//! One flat open-addressing hash table of fixed-size (24-byte) entries keyed by root id.
//!
//! Why not `hashbrown`: its capacity is a power of two at load 7/8, so a table just
//! past a power of two (one million pending trees: 2^21 slots) holds nearly twice the
//! slots it needs. Here the capacity is any number (slots are picked by a
//! multiply-shift, "fastrange") and grows by 1.5x at load 0.8, so the slack per entry
//! stays bounded at every size (bytes per entry: docs/native-ledger.md; measured bytes
//! per pending tree: docs/benchmarks.md).
//! Linear probing with backward-shift deletion keeps no tombstones.
//!
//! Root id 0 marks an empty slot: the wire protocol refuses zero root ids.

/// Bits of `Entry::meta`: start time, spout, generation and three flags.
const STARTED_BITS: u32 = 39;
/// Start times are microseconds since the ledger's epoch, modulo 2^39 (6.4 days).
pub const STARTED_MASK: u64 = (1 << STARTED_BITS) - 1;
/// The ledger's side notes (see `ledger::notes`) hold something for this root: the
/// bit lets an ending tree skip a hash lookup when it has none (most trees).
const NOTES_BIT: u64 = 1 << STARTED_BITS;
const SPOUT_SHIFT: u32 = 40;
const GEN_SHIFT: u32 = 56;
/// Generations are kept modulo 64; see `ledger::MAX_BUCKETS` for why that is enough.
pub const GEN_MASK: u64 = 0x3f;
const FAILED_BIT: u64 = 1 << 62;
const DEDUP_BIT: u64 = 1 << 63;

/// One pending root: 24 bytes whatever the size of its tree.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Entry {
    /// The root id (0: the slot is empty).
    pub root: u64,
    /// The XOR checksum of the tree's edges.
    pub val: u64,
    /// started (39 bits) | has notes (1) | spout id (16) | generation (6) | failed (1) | has dedup keys (1).
    meta: u64,
}

impl Entry {
    /// A fresh entry: no spout (unknown until init), not failed, no dedup keys.
    pub fn new(root: u64, started_us: u64, gen: u64) -> Entry {
        Entry {
            root,
            val: 0,
            meta: (started_us & STARTED_MASK) | ((gen & GEN_MASK) << GEN_SHIFT),
        }
    }

    /// Microseconds since the ledger epoch (modulo 2^39) when the tree started.
    pub fn started(&self) -> u64 {
        self.meta & STARTED_MASK
    }

    /// Set the start time (init resets it: latency is measured from init).
    pub fn set_started(&mut self, started_us: u64) {
        self.meta = (self.meta & !STARTED_MASK) | (started_us & STARTED_MASK);
    }

    /// Spout id, 0 while the init has not arrived.
    pub fn spout(&self) -> u16 {
        (self.meta >> SPOUT_SHIFT) as u16
    }

    /// Set the spout id (at init).
    pub fn set_spout(&mut self, spout: u16) {
        self.meta = (self.meta & !(0xffff << SPOUT_SHIFT)) | ((spout as u64) << SPOUT_SHIFT);
    }

    /// The rotation generation the entry was last put in (modulo 64).
    pub fn gen(&self) -> u64 {
        (self.meta >> GEN_SHIFT) & GEN_MASK
    }

    /// Move the entry to generation `gen` (a fresh timeout).
    pub fn set_gen(&mut self, gen: u64) {
        self.meta = (self.meta & !(GEN_MASK << GEN_SHIFT)) | ((gen & GEN_MASK) << GEN_SHIFT);
    }

    /// Whether some tuple of the tree failed.
    pub fn failed(&self) -> bool {
        self.meta & FAILED_BIT != 0
    }

    /// Mark the tree failed.
    pub fn set_failed(&mut self) {
        self.meta |= FAILED_BIT;
    }

    /// Whether the dedup side table holds keys for this root.
    pub fn has_dedup(&self) -> bool {
        self.meta & DEDUP_BIT != 0
    }

    /// Record that the dedup side table holds keys for this root.
    pub fn set_dedup(&mut self) {
        self.meta |= DEDUP_BIT;
    }

    /// Whether the ledger's side notes hold something for this root.
    pub fn has_notes(&self) -> bool {
        self.meta & NOTES_BIT != 0
    }

    /// Record that the ledger's side notes hold something for this root.
    pub fn set_notes(&mut self) {
        self.meta |= NOTES_BIT;
    }
}

const MIN_CAPACITY: usize = 64;
/// Grow above this load (numerator / denominator): linear probing stays short up to ~0.8.
const MAX_LOAD: (usize, usize) = (4, 5);

/// The open-addressing table.
pub struct Table {
    slots: Vec<Entry>,
    len: usize,
    seed: u64,
    /// Bumped whenever slots move wholesale (resize), so a scan in progress restarts.
    layout_version: u64,
    /// The position of an expiry scan in progress, if any; see `note_move`.
    pub scan_pos: Option<usize>,
}

impl Table {
    /// An empty table; `seed` randomises slot placement (a client cannot aim roots at one slot).
    pub fn new(seed: u64) -> Table {
        Table {
            slots: vec![Entry::default(); MIN_CAPACITY],
            len: 0,
            seed,
            layout_version: 0,
            scan_pos: None,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of slots (memory is `capacity * 24` bytes).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Changes whenever a resize moved every entry.
    pub fn layout_version(&self) -> u64 {
        self.layout_version
    }

    /// The slot where a probe for `root` starts (valid until the next resize).
    #[inline]
    pub fn home(&self, root: u64) -> usize {
        // A strong 64-bit mixer (murmur3's finaliser) over the seeded root, then fastrange.
        let mut x = root ^ self.seed;
        x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 33;
        ((x as u128 * self.slots.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// Hint the CPU to load slot `home` (batch prefetching).
    #[inline]
    pub fn prefetch(&self, home: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.slots[home..].as_ptr();
            // SAFETY: `p` points into the slots; prefetching has no effect on program state.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch(p as *const i8, _MM_HINT_T0);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = home;
    }

    /// Grow now so that `additional` more entries fit without a resize (slots and homes stay put).
    pub fn reserve(&mut self, additional: usize) {
        let wanted = self.len + additional;
        if wanted * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            let by_load = wanted * MAX_LOAD.1 / MAX_LOAD.0 + 1;
            self.resize(by_load.max(self.slots.len() + self.slots.len() / 2));
        }
    }

    /// The slot holding `root`, if any.
    #[inline]
    pub fn find(&self, root: u64) -> Option<usize> {
        self.find_from(self.home(root), root)
    }

    /// The slot holding `root`, probing from its `home` slot.
    #[inline]
    pub fn find_from(&self, home: usize, root: u64) -> Option<usize> {
        let mut i = home;
        loop {
            let r = self.slots[i].root;
            if r == root {
                return Some(i);
            }
            if r == 0 {
                return None;
            }
            i = self.next(i);
        }
    }

    /// The entry in slot `i`.
    #[inline]
    pub fn get(&self, i: usize) -> &Entry {
        &self.slots[i]
    }

    /// The entry in slot `i`, to change (never its root).
    #[inline]
    pub fn get_mut(&mut self, i: usize) -> &mut Entry {
        &mut self.slots[i]
    }

    /// Insert an entry whose root is absent; return its slot. May resize (slots move).
    pub fn insert_new(&mut self, entry: Entry) -> usize {
        debug_assert!(entry.root != 0);
        if (self.len + 1) * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            self.resize(self.slots.len() + self.slots.len() / 2);
        }
        self.len += 1;
        self.place(entry)
    }

    /// Insert an absent root probing from its `home`; the caller `reserve`d room (no resize here).
    #[inline]
    pub fn insert_from(&mut self, home: usize, entry: Entry) -> usize {
        debug_assert!((self.len + 1) * MAX_LOAD.1 <= self.slots.len() * MAX_LOAD.0 + MAX_LOAD.1);
        self.len += 1;
        let mut i = home;
        while self.slots[i].root != 0 {
            i = self.next(i);
        }
        self.slots[i] = entry;
        i
    }

    fn place(&mut self, entry: Entry) -> usize {
        let mut i = self.home(entry.root);
        while self.slots[i].root != 0 {
            i = self.next(i);
        }
        self.slots[i] = entry;
        i
    }

    /// Rebuild with `capacity` slots (at least enough for the entries at the load bound).
    pub fn resize(&mut self, capacity: usize) {
        let needed = self.len * MAX_LOAD.1 / MAX_LOAD.0 + 1;
        let capacity = capacity.max(needed).max(MIN_CAPACITY);
        let old = std::mem::replace(&mut self.slots, vec![Entry::default(); capacity]);
        for e in old.into_iter().filter(|e| e.root != 0) {
            self.place(e);
        }
        self.layout_version += 1;
        if self.scan_pos.is_some() {
            self.scan_pos = Some(0);
        }
    }

    /// Shrink after a mass expiry so memory follows the pending count down.
    pub fn shrink_if_sparse(&mut self) {
        if self.slots.len() > MIN_CAPACITY && self.len * 8 < self.slots.len() {
            self.resize(self.len * 2);
        }
    }

    /// Remove the entry in slot `i` and return it; later entries of the probe run move back.
    pub fn remove_at(&mut self, mut i: usize) -> Entry {
        let removed = self.slots[i];
        self.len -= 1;
        // Knuth's algorithm R: shift back every entry whose home is not between hole and it.
        let mut j = i;
        loop {
            j = self.next(j);
            let e = self.slots[j];
            if e.root == 0 {
                break;
            }
            let k = self.home(e.root);
            let stays = if i <= j { i < k && k <= j } else { i < k || k <= j };
            if !stays {
                self.slots[i] = e;
                self.note_move(j, i);
                i = j;
            }
        }
        self.slots[i] = Entry::default();
        removed
    }

    /// An entry moved from slot `from` back to `to`: a scan that already passed `to`
    /// but not `from` must look at `to` again, or it would miss the entry.
    fn note_move(&mut self, from: usize, to: usize) {
        if let Some(pos) = self.scan_pos {
            if to < pos && pos <= from {
                self.scan_pos = Some(to);
            }
        }
    }

    /// Every entry, in slot order (scans for diagnostics; not the hot path).
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().filter(|e| e.root != 0)
    }

    /// All entries' roots (diagnostics and tests; not the hot path).
    pub fn roots(&self) -> Vec<u64> {
        self.slots.iter().filter(|e| e.root != 0).map(|e| e.root).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(roots: impl IntoIterator<Item = u64>) -> Table {
        let mut t = Table::new(12345);
        for r in roots {
            t.insert_new(Entry::new(r, 0, 0));
        }
        t
    }

    #[test]
    fn entry_is_24_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
    }

    #[test]
    fn entry_fields_do_not_overlap() {
        let mut e = Entry::new(7, STARTED_MASK, 63);
        e.set_spout(0xffff);
        e.set_failed();
        e.set_dedup();
        assert_eq!((e.started(), e.spout(), e.gen(), e.failed(), e.has_dedup()), (STARTED_MASK, 0xffff, 63, true, true));
        assert!(!e.has_notes(), "a full start time does not spill into the notes bit");
        e.set_notes();
        assert!(e.has_notes());
        e.set_started(5);
        e.set_gen(2);
        e.set_spout(9);
        assert_eq!((e.started(), e.spout(), e.gen(), e.failed(), e.has_dedup()), (5, 9, 2, true, true));
    }

    #[test]
    fn insert_find_remove_many() {
        let roots: Vec<u64> = (1..=20_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).collect();
        let mut t = table_with(roots.iter().copied());
        assert_eq!(t.len(), roots.len());
        assert!(t.capacity() * 4 >= t.len() * 5, "load above 0.8");
        for (n, r) in roots.iter().enumerate() {
            if n % 3 == 0 {
                let i = t.find(*r).expect("present");
                assert_eq!(t.remove_at(i).root, *r);
            }
        }
        for (n, r) in roots.iter().enumerate() {
            assert_eq!(t.find(*r).is_some(), n % 3 != 0, "root {r}");
        }
        assert_eq!(t.find(0xdead_beef), None);
    }

    #[test]
    fn sequential_roots_and_wraparound_survive_removal() {
        // Small sequential roots cluster nowhere in particular; removal in every order keeps lookups right.
        let mut t = table_with(1..=50);
        for r in (1..=50).rev().step_by(2) {
            let i = t.find(r).unwrap();
            t.remove_at(i);
        }
        for r in 1..=50u64 {
            assert_eq!(t.find(r).is_some(), r % 2 == 1, "root {r}");
        }
    }

    #[test]
    fn shrink_keeps_entries() {
        let mut t = table_with(1..=10_000);
        for r in 1..=9_900u64 {
            let i = t.find(r).unwrap();
            t.remove_at(i);
        }
        let before = t.capacity();
        t.shrink_if_sparse();
        assert!(t.capacity() < before);
        assert!((9_901..=10_000).all(|r| t.find(r).is_some()));
    }
}

#[cfg(test)]
mod probe_stats {
    use super::*;

    #[test]
    fn mean_probe_length_at_max_load() {
        let mut t = Table::new(99);
        let mut x: u64 = 0x1234567;
        let mut roots = vec![];
        while t.len() * 5 < t.capacity() * 4 - 5 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            roots.push(x | 1);
            t.insert_new(Entry::new(x | 1, 0, 0));
        }
        let mut total = 0usize;
        for &r in &roots {
            let h = t.home(r);
            let i = t.find(r).unwrap();
            total += (i + t.capacity() - h) % t.capacity() + 1;
        }
        let mean = total as f64 / roots.len() as f64;
        println!("load {:.3}, mean probes {mean:.2}", t.len() as f64 / t.capacity() as f64);
        assert!(mean < 4.0, "mean probe length {mean}");
    }
}
