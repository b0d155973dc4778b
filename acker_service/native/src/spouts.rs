//! Spout names interned as 16-bit ids, reference-counted by the entries that hold them.
//!
//! An entry stores a 2-byte id instead of a name. An id whose last entry left is freed
//! at the start of the next ledger call (not at once), so the outcomes of the call that
//! ended that entry can still name it.

use hashbrown::HashMap;

/// Most spouts with pending trees at once (id 0 means "no spout yet").
pub const MAX_SPOUTS: usize = u16::MAX as usize;

/// The intern table.
#[derive(Default)]
pub struct Spouts {
    names: Vec<String>, // index = id; names[0] is unused
    refs: Vec<u32>,
    ids: HashMap<String, u16>,
    free: Vec<u16>,
    unreferenced: Vec<u16>,
}

impl Spouts {
    /// An empty table.
    pub fn new() -> Spouts {
        Spouts {
            names: vec![String::new()],
            refs: vec![0],
            ..Default::default()
        }
    }

    /// The name of `id` (valid until the next `collect`).
    pub fn name(&self, id: u16) -> &str {
        &self.names[id as usize]
    }

    /// The id of `name` if it is interned.
    pub fn lookup(&self, name: &str) -> Option<u16> {
        self.ids.get(name).copied()
    }

    /// Ids in use (interned and not yet freed).
    pub fn live(&self) -> usize {
        self.ids.len()
    }

    /// Intern `name` (the caller checked there is room) and take a reference to it.
    pub fn acquire(&mut self, name: &str) -> u16 {
        let id = match self.ids.get(name) {
            Some(&id) => id,
            None => {
                let id = match self.free.pop() {
                    Some(id) => {
                        self.names[id as usize] = name.to_owned();
                        id
                    }
                    None => {
                        assert!(self.names.len() <= MAX_SPOUTS, "spout table full");
                        self.names.push(name.to_owned());
                        self.refs.push(0);
                        (self.names.len() - 1) as u16
                    }
                };
                self.ids.insert(name.to_owned(), id);
                id
            }
        };
        self.refs[id as usize] += 1;
        id
    }

    /// Take one more reference to an interned `id`.
    pub fn retain(&mut self, id: u16) {
        self.refs[id as usize] += 1;
    }

    /// Drop a reference to `id` (an entry holding it left the ledger).
    pub fn release(&mut self, id: u16) {
        let r = &mut self.refs[id as usize];
        *r -= 1;
        if *r == 0 {
            self.unreferenced.push(id);
        }
    }

    /// Free the ids that lost their last reference before this call (and were not reused).
    pub fn collect(&mut self) {
        for id in std::mem::take(&mut self.unreferenced) {
            if self.refs[id as usize] == 0 && !self.names[id as usize].is_empty() {
                let name = std::mem::take(&mut self.names[id as usize]);
                self.ids.remove(&name);
                self.free.push(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_shared_then_recycled_after_collect() {
        let mut s = Spouts::new();
        let a = s.acquire("a");
        assert_eq!(s.acquire("a"), a);
        let b = s.acquire("b");
        assert_ne!(a, b);
        s.release(a);
        s.release(a);
        assert_eq!(s.name(a), "a", "a released id keeps its name until collect");
        s.collect();
        assert_eq!(s.lookup("a"), None);
        assert_eq!(s.live(), 1);
        assert_eq!(s.acquire("c"), a, "the freed id is reused");
        assert_eq!(s.name(b), "b");
    }

    #[test]
    fn reacquired_before_collect_is_kept() {
        let mut s = Spouts::new();
        let a = s.acquire("a");
        s.release(a);
        assert_eq!(s.acquire("a"), a);
        s.collect();
        assert_eq!(s.lookup("a"), Some(a));
    }
}
