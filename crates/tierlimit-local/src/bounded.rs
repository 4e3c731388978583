//! A DashMap with hard bounds on its number of entries and its bytes.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use dashmap::mapref::one::{Ref, RefMut};

/// The hasher of every bounded map: see [`BoundedMap`].
pub(crate) type KeyHasher = foldhash::quality::RandomState;

/// What a key costs in memory beyond the map's own slot: its heap bytes.
pub(crate) trait KeyBytes {
    fn key_bytes(&self) -> usize;
}

/// What a value costs in memory beyond the map's own slot: its heap bytes,
/// which must not change while it is in the map.
pub(crate) trait ValueBytes {
    fn value_bytes(&self) -> usize {
        0
    }
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
/// Each entry is charged its key's and its value's heap bytes plus the map's
/// slot (key and value, with DashMap's spare capacity). Keys are what vary: up to 1,536 bytes once escaped, so a bound on
/// entries alone let 200,000 long keys take 321 MB (measured for issue 9).
///
/// The counts are kept beside the map so the bounds hold exactly under
/// concurrency (`DashMap::len` locks every shard and is only a snapshot).
///
/// Keys are hashed with foldhash, seeded at random per map, not the
/// standard SipHash: hashing the key was a tenth of a local check's time
/// with SipHash, and a few nanoseconds with foldhash. Keys come from
/// clients, so the seed matters: without it a client could pick keys that
/// collide. foldhash resists that less than SipHash does (an attacker who
/// could recover a map's seed from timings could aim at one shard), and
/// every map here is bounded, so the worst a collision attack does is slow
/// one shard's lookups, never grow a map.
#[derive(Debug)]
pub(crate) struct BoundedMap<K: Eq + Hash, V> {
    map: DashMap<K, V, KeyHasher>,
    len: AtomicUsize,
    max: usize,
    bytes: AtomicUsize,
    max_bytes: usize,
    overhead: usize,
}

impl<K: Eq + Hash + Clone + KeyBytes, V: ValueBytes> BoundedMap<K, V> {
    /// A map of at most `max` entries and `max_bytes`, each entry charged its
    /// key's and value's heap bytes plus its slot, twice over for the map's
    /// spare capacity.
    pub(crate) fn new(max: usize, max_bytes: usize) -> Self {
        BoundedMap {
            map: DashMap::with_hasher(KeyHasher::default()),
            len: AtomicUsize::new(0),
            max,
            bytes: AtomicUsize::new(0),
            max_bytes,
            overhead: 2 * std::mem::size_of::<(K, V)>(),
        }
    }

    fn charge(&self, key: &K, value: &V) -> usize {
        key.key_bytes() + value.value_bytes() + self.overhead
    }

    /// Bytes charged to the entries held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    #[inline]
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
                let charge = self.charge(v.key(), &value);
                if self.bytes.fetch_add(charge, Ordering::AcqRel) + charge > self.max_bytes {
                    self.bytes.fetch_sub(charge, Ordering::AcqRel);
                    self.len.fetch_sub(1, Ordering::AcqRel);
                    return None;
                }
                Some(v.insert(value))
            }
        }
    }

    /// As [`get_or_try_insert`](Self::get_or_try_insert), looking `probe` up
    /// first: the owned key is built (`make_key`) only when it is absent, and
    /// `None` from it refuses the entry as a full map does.
    pub(crate) fn get_or_try_insert_with<Q>(
        &self,
        probe: &Q,
        make_key: impl FnOnce() -> Option<K>,
        make: impl FnOnce(&K) -> V,
    ) -> Option<RefMut<'_, K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.map.get_mut(probe) {
            Some(found) => Some(found),
            None => self.get_or_try_insert(make_key()?, make),
        }
    }

    /// A shared guard on `key`'s entry (other readers may hold it too).
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<Ref<'_, K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key)
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
        if let Some((k, v)) = &removed {
            self.len.fetch_sub(1, Ordering::AcqRel);
            self.bytes.fetch_sub(self.charge(k, v), Ordering::AcqRel);
        }
        removed.map(|(_, v)| v)
    }

    /// Keeps the entries for which `keep` holds, then gives memory back.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.map.retain(|k, v| {
            let kept = keep(k, v);
            if !kept {
                self.len.fetch_sub(1, Ordering::AcqRel);
                self.bytes.fetch_sub(self.charge(k, v), Ordering::AcqRel);
            }
            kept
        });
        self.map.shrink_to_fit();
    }

    /// Visits every entry under a shared guard (one shard at a time).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        self.map.iter().for_each(|e| f(e.key(), e.value()));
    }

    /// Calls `f` on every entry, mutably (one shard locked at a time): for
    /// changes that leave what the entry is charged unchanged.
    pub(crate) fn for_each_mut(&self, mut f: impl FnMut(&K, &mut V)) {
        self.map.iter_mut().for_each(|mut e| {
            let (k, v) = e.pair_mut();
            f(k, v)
        });
    }

    /// Folds over every entry (one shard locked at a time).
    pub(crate) fn fold<T>(&self, init: T, mut f: impl FnMut(T, &K, &V) -> T) -> T {
        self.map
            .iter()
            .fold(init, |acc, e| f(acc, e.key(), e.value()))
    }

    /// The keys of up to `n` entries whose value `pred` accepts.
    pub(crate) fn keys_where(&self, n: usize, mut pred: impl FnMut(&V) -> bool) -> Vec<K> {
        self.map
            .iter()
            .filter(|e| pred(e.value()))
            .take(n)
            .map(|e| e.key().clone())
            .collect()
    }
}
