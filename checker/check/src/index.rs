//! The orders by id: a hash table the fold can ask to fetch a slot early.
//!
//! A long run's history names a new order on nearly every invoke, and each
//! one is looked up in a table of millions, far larger than the caches: the
//! lookup waits on memory, twice (the slot's tag, then its entry), and that
//! wait was half the fold's time. The fold reads its lines in chunks, so it
//! knows the ids a few lines ahead; [`IdIndex::prefetch`] starts fetching
//! their slots, and the lookup finds them in the cache.
//!
//! The table is open addressing with linear probing over two arrays: a byte
//! per slot holding a tag of the hash (0 for an empty slot), which is what a
//! probe reads, 64 slots to a cache line, and the order's index, read only
//! when a tag matches. A hash's first slot is `hash * slots >> 64`, so the
//! table is sized to its orders rather than to a power of two. The entries are
//! the indexes `0..len`, each once (the fold's orders, pushed in order), which
//! lets growing re-insert them without reading the old table.

/// Orders by the hash of their id; see the module's doc.
#[derive(Debug, Default)]
pub struct IdIndex {
    tags: Vec<u8>,
    entries: Vec<u32>,
    len: u32,
}

/// The table grows past three entries in four slots: a longer run of full
/// slots would make a probe for a new id read more than a cache line.
const fn slots_for(len: usize) -> usize {
    len + len / 3 + 1
}

impl IdIndex {
    /// Makes room for `additional` more entries; `hash_of(i)` is the hash of
    /// the `i`th order's id.
    pub fn reserve(&mut self, additional: usize, hash_of: impl Fn(u32) -> u64) {
        let want = slots_for(self.len as usize + additional);
        if want > self.tags.len() {
            self.rebuild(want, hash_of);
        }
    }

    /// The entry under `hash` for which `is` holds.
    #[inline]
    pub fn find(&self, hash: u64, is: impl Fn(u32) -> bool) -> Option<u32> {
        if self.tags.is_empty() {
            return None;
        }
        let tag = tag(hash);
        let mut at = self.home(hash);
        loop {
            match self.tags[at] {
                0 => return None,
                t if t == tag && is(self.entries[at]) => return Some(self.entries[at]),
                _ => at = self.next(at),
            }
        }
    }

    /// Adds entry `len` (the next order's index) under `hash`; it must not be
    /// in the table. `hash_of` as for [`IdIndex::reserve`].
    #[inline]
    pub fn push(&mut self, hash: u64, hash_of: impl Fn(u32) -> u64) -> u32 {
        if slots_for(self.len as usize + 1) > self.tags.len() {
            self.rebuild(slots_for(2 * (self.len as usize + 1)), hash_of);
        }
        let i = self.len;
        self.place(hash, i);
        self.len += 1;
        i
    }

    /// Starts fetching the cache lines a lookup of `hash` reads first.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        if !self.tags.is_empty() {
            let at = self.home(hash);
            prefetch(&self.tags[at]);
            prefetch(&self.entries[at]);
        }
    }

    fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.tags.len() as u128) >> 64) as usize
    }

    fn next(&self, at: usize) -> usize {
        if at + 1 == self.tags.len() { 0 } else { at + 1 }
    }

    fn place(&mut self, hash: u64, i: u32) {
        let mut at = self.home(hash);
        while self.tags[at] != 0 {
            at = self.next(at);
        }
        self.tags[at] = tag(hash);
        self.entries[at] = i;
    }

    /// Makes the table `slots` long and puts every entry back, in order.
    fn rebuild(&mut self, slots: usize, hash_of: impl Fn(u32) -> u64) {
        self.tags = vec![0; slots];
        self.entries = vec![0; slots];
        for i in 0..self.len {
            self.place(hash_of(i), i);
        }
    }
}

/// A slot's tag: the hash's low byte (its first slot comes from the high
/// bits), never 0, which marks an empty slot.
fn tag(hash: u64) -> u8 {
    (hash as u8).max(1)
}

/// Asks the CPU to bring `value`'s cache line in, without waiting for it.
#[inline]
#[allow(unsafe_code)]
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE, the only feature the intrinsic needs, is part of every
    // x86_64 CPU, and a prefetch reads nothing the program sees: it cannot
    // fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hash that puts many entries on few first slots, so that probes wrap
    /// past the end and tags collide.
    fn crowded(i: u32) -> u64 {
        u64::from(i % 7) << 61 | u64::from(i % 3)
    }

    #[test]
    fn every_entry_is_found_and_nothing_else() {
        for hash_of in [crowded as fn(u32) -> u64, |i| u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15)] {
            let mut index = IdIndex::default();
            for i in 0..5000u32 {
                assert_eq!(index.find(hash_of(i), |j| j == i), None);
                assert_eq!(index.push(hash_of(i), hash_of), i);
            }
            for i in 0..5000u32 {
                index.prefetch(hash_of(i));
                assert_eq!(index.find(hash_of(i), |j| j == i), Some(i), "entry {i}");
            }
            assert_eq!(index.find(hash_of(5000), |j| j == 5000), None);
            assert!(index.tags.iter().filter(|&&t| t != 0).count() == 5000);
        }
    }

    #[test]
    fn reserving_keeps_what_is_there() {
        let hash_of = |i: u32| u64::from(i) << 40;
        let mut index = IdIndex::default();
        index.prefetch(7);
        assert_eq!(index.find(7, |_| true), None);
        for i in 0..10 {
            index.push(hash_of(i), hash_of);
        }
        index.reserve(1000, hash_of);
        let slots = index.tags.len();
        assert!(slots >= 1010);
        for i in 10..1010 {
            index.push(hash_of(i), hash_of);
        }
        assert_eq!(index.tags.len(), slots, "reserved room is used without growing");
        assert!((0..1010).all(|i| index.find(hash_of(i), |j| j == i) == Some(i)));
    }
}
