//! The key of every local map: a rule set's identity and a user key, looked
//! up without building one.
//!
//! Local state is keyed like Redis state, by the rule set's identity (its name
//! and rule ids: algorithm, period, UTC offset), so two sets that share a name
//! but not their rules' shapes never reset each other's buckets or apply each
//! other's denials. Sets of one identity with other limits or bursts share a
//! key; what the key holds remembers the limits it was written under (a
//! bucket's engine, a denial's set, a warm seed's capacities) and converts or
//! ignores it, in `tier.rs`. A check looks a key up through [`Probe`] with the
//! borrowed set and key, so only a key seen for the first time is allocated.

use std::borrow::{Borrow, Cow};
use std::hash::{Hash, Hasher};

use tierlimit_core::RuleSet;

use dashmap::mapref::one::RefMut;

use crate::bounded::{BoundedMap, KeyBytes, ValueBytes};

/// A rule set and an escaped user key, borrowed (what a check looks up with)
/// or owned (inside a [`LocalKey`]).
///
/// One type for both, rather than a trait object over two: a map of
/// [`LocalKey`] is searched with a `Probe` through `Borrow`, and hashing and
/// comparing a `Probe` are plain inlined code, where a `dyn` key cost three
/// virtual calls per lookup (a tenth of a local check, perf on
/// `fallback/1000-keys`).
#[derive(Debug, Clone)]
pub(crate) struct Probe<'a> {
    set: Cow<'a, RuleSet>,
    key: Cow<'a, str>,
}

impl<'a> Probe<'a> {
    pub(crate) fn new(set: &'a RuleSet, key: &'a str) -> Self {
        Probe {
            set: Cow::Borrowed(set),
            key: Cow::Borrowed(key),
        }
    }
}

impl Hash for Probe<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.set.identity_hash());
        // The key's bytes without `str`'s end marker: the identity before it
        // has a fixed length, so no two (set, key) pairs feed the same bytes.
        state.write(self.key.as_bytes());
    }
}

impl PartialEq for Probe<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        same_bytes(self.key.as_bytes(), other.key.as_bytes()) && self.set.same_identity(&other.set)
    }
}

/// `a == b`, without a call to `memcmp` for keys of 4 to 16 bytes (most
/// keys): two overlapping word compares. The call was a few ns of a local
/// check (perf, `fallback/1000-keys`).
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    match a.len() {
        8..=16 => {
            a.first_chunk::<8>() == b.first_chunk::<8>()
                && a.last_chunk::<8>() == b.last_chunk::<8>()
        }
        4..=7 => {
            a.first_chunk::<4>() == b.first_chunk::<4>()
                && a.last_chunk::<4>() == b.last_chunk::<4>()
        }
        _ => a == b,
    }
}

impl Eq for Probe<'_> {}

/// A rule set and an escaped user key, owned: what a map stores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LocalKey(Probe<'static>);

impl LocalKey {
    pub(crate) fn new(set: &RuleSet, key: &str) -> Self {
        LocalKey(Probe {
            set: Cow::Owned(set.clone()),
            key: Cow::Owned(key.to_owned()),
        })
    }

    pub(crate) fn set(&self) -> &RuleSet {
        &self.0.set
    }

    pub(crate) fn key(&self) -> &str {
        &self.0.key
    }
}

// `Probe` is covariant in its lifetime: an owned key is a probe of any.
impl<'a> Borrow<Probe<'a>> for LocalKey {
    fn borrow(&self) -> &Probe<'a> {
        &self.0
    }
}

impl KeyBytes for LocalKey {
    fn key_bytes(&self) -> usize {
        self.0.key.len()
    }
}

impl<V: ValueBytes> BoundedMap<LocalKey, V> {
    /// The entry of (`set`, `key`), made with `make` when absent and there is
    /// room; the owned key is built only then.
    pub(crate) fn entry_of(
        &self,
        set: &RuleSet,
        key: &str,
        make: impl FnOnce(&LocalKey) -> V,
    ) -> Option<RefMut<'_, LocalKey, V>> {
        self.get_or_try_insert_with(&Probe::new(set, key), || LocalKey::new(set, key), make)
    }
}

#[cfg(test)]
mod tests {
    use super::same_bytes;

    #[test]
    fn same_bytes_is_slice_equality() {
        let keys: Vec<Vec<u8>> = (0..40usize)
            .flat_map(|len| {
                let base: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                // The key itself and one copy per position with that byte changed.
                let mut variants = vec![base.clone()];
                for i in 0..len {
                    let mut v = base.clone();
                    v[i] ^= 1;
                    variants.push(v);
                }
                variants
            })
            .collect();
        for a in &keys {
            for b in &keys {
                assert_eq!(same_bytes(a, b), a == b, "{a:?} vs {b:?}");
            }
        }
    }
}
