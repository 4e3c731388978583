//! A DashMap with hard bounds on its number of entries and its bytes.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use dashmap::mapref::one::RefMut;

/// What a key costs in memory beyond the map's own slot: its heap bytes.
pub(crate) trait KeyBytes {
    fn key_bytes(&self) -> usize;
}

impl KeyBytes for String {
    fn key_bytes(&self) -> usize {
        self.capacity()
    }
}

impl KeyBytes for (String, u64) {
    fn key_bytes(&self) -> usize {
        self.0.capacity()
    }
}

/// A concurrent map that never holds more than `max` entries nor charges more
/// than `max_bytes`: an insert that would pass either bound is refused, not an
/// old entry evicted (evicting would let a key sprayer reset real clients'
/// state).
///
/// Each entry is charged its key's heap bytes plus `overhead`: the map's slot
/// (key and value, with DashMap's spare capacity) and the most heap its value
/// can hold. Keys are what vary: up to 1,536 bytes once escaped, so a bound on
/// entries alone let 200,000 long keys take 321 MB (measured for issue 9).
///
/// The counts are kept beside the map so the bounds hold exactly under
/// concurrency (`DashMap::len` locks every shard and is only a snapshot).
#[derive(Debug)]
pub(crate) struct BoundedMap<K: Eq + Hash, V> {
    map: DashMap<K, V>,
    len: AtomicUsize,
    max: usize,
    bytes: AtomicUsize,
    max_bytes: usize,
    overhead: usize,
}

impl<K: Eq + Hash + Clone + KeyBytes, V> BoundedMap<K, V> {
    /// A map of at most `max` entries and `max_bytes`, each entry charged its
    /// key's bytes plus its slot, twice over for the map's spare capacity, plus
    /// `value_heap` (the most heap one value holds).
    pub(crate) fn new(max: usize, max_bytes: usize, value_heap: usize) -> Self {
        BoundedMap {
            map: DashMap::new(),
            len: AtomicUsize::new(0),
            max,
            bytes: AtomicUsize::new(0),
            max_bytes,
            overhead: 2 * std::mem::size_of::<(K, V)>() + value_heap,
        }
    }

    fn charge(&self, key: &K) -> usize {
        key.key_bytes() + self.overhead
    }

    /// Bytes charged to the entries held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The entry for `key`, created with `make` when absent and there is room;
    /// `None` when absent and the map is full.
    ///
    /// Holds a shard lock while the returned guard lives: never call another
    /// method of this map while holding it.
    pub(crate) fn get_or_try_insert(
        &self,
        key: K,
        make: impl FnOnce(&K) -> V,
    ) -> Option<RefMut<'_, K, V>> {
        match self.map.entry(key) {
            Entry::Occupied(o) => Some(o.into_ref()),
            Entry::Vacant(v) => {
                if self.len.fetch_add(1, Ordering::AcqRel) >= self.max {
                    self.len.fetch_sub(1, Ordering::AcqRel);
                    return None;
                }
                let charge = self.charge(v.key());
                if self.bytes.fetch_add(charge, Ordering::AcqRel) + charge > self.max_bytes {
                    self.bytes.fetch_sub(charge, Ordering::AcqRel);
                    self.len.fetch_sub(1, Ordering::AcqRel);
                    return None;
                }
                let value = make(v.key());
                Some(v.insert(value))
            }
        }
    }

    pub(crate) fn get_mut<Q>(&self, key: &Q) -> Option<RefMut<'_, K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get_mut(key)
    }

    /// Removes `key` when `pred` holds for its value.
    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&V) -> bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let removed = self.map.remove_if(key, |_, v| pred(v));
        if let Some((k, _)) = &removed {
            self.len.fetch_sub(1, Ordering::AcqRel);
            self.bytes.fetch_sub(self.charge(k), Ordering::AcqRel);
        }
        removed.map(|(_, v)| v)
    }

    /// Keeps the entries for which `keep` holds, then gives memory back.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.map.retain(|k, v| {
            let kept = keep(k, v);
            if !kept {
                self.len.fetch_sub(1, Ordering::AcqRel);
                self.bytes.fetch_sub(self.charge(k), Ordering::AcqRel);
            }
            kept
        });
        self.map.shrink_to_fit();
    }

    /// Folds over every entry (one shard locked at a time).
    pub(crate) fn fold<T>(&self, init: T, mut f: impl FnMut(T, &K, &V) -> T) -> T {
        self.map
            .iter()
            .fold(init, |acc, e| f(acc, e.key(), e.value()))
    }

    /// Clones up to `n` entries.
    pub(crate) fn snapshot(&self, n: usize) -> Vec<(K, V)>
    where
        V: Clone,
    {
        self.map
            .iter()
            .take(n)
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect()
    }
}
