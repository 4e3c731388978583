//! A DashMap with a hard bound on its number of entries.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use dashmap::mapref::one::RefMut;

/// A concurrent map that never holds more than `max` entries: an insert that
/// would pass the bound is refused, not an old entry evicted (evicting would let
/// a key sprayer reset real clients' state).
///
/// The count is kept beside the map so the bound holds exactly under
/// concurrency (`DashMap::len` locks every shard and is only a snapshot).
#[derive(Debug)]
pub(crate) struct BoundedMap<K: Eq + Hash, V> {
    map: DashMap<K, V>,
    len: AtomicUsize,
    max: usize,
}

impl<K: Eq + Hash + Clone, V> BoundedMap<K, V> {
    pub(crate) fn new(max: usize) -> Self {
        BoundedMap {
            map: DashMap::new(),
            len: AtomicUsize::new(0),
            max,
        }
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
        let removed = self.map.remove_if(key, |_, v| pred(v)).map(|(_, v)| v);
        if removed.is_some() {
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
        removed
    }

    /// Keeps the entries for which `keep` holds, then gives memory back.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.map.retain(|k, v| {
            let kept = keep(k, v);
            if !kept {
                self.len.fetch_sub(1, Ordering::AcqRel);
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
