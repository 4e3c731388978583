//! The key of every local map: a rule set's identity and a user key, looked
//! up without building one.
//!
//! Local state is keyed like Redis state, by the rule set's identity (its name
//! and rule ids: algorithm, period, UTC offset), so two sets that share a name
//! but not their rules' shapes never reset each other's buckets or apply each
//! other's denials. Sets of one identity with other limits or bursts share a
//! key; what the key holds remembers the limits it was written under (a
//! bucket's engine, a denial's set, a warm seed's capacities) and converts or
//! ignores it, in `tier.rs`. A check looks a key up through [`Lookup`] with the
//! borrowed set and key, so only a key seen for the first time is allocated.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use tierlimit_core::RuleSet;

use dashmap::mapref::one::RefMut;

use crate::bounded::{BoundedMap, KeyBytes, ValueBytes};

/// A rule set and an escaped user key, owned: what a map stores.
#[derive(Debug, Clone)]
pub(crate) struct LocalKey {
    set: RuleSet,
    key: Box<str>,
}

impl LocalKey {
    pub(crate) fn new(set: &RuleSet, key: &str) -> Self {
        LocalKey {
            set: set.clone(),
            key: key.into(),
        }
    }

    pub(crate) fn set(&self) -> &RuleSet {
        &self.set
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }
}

/// A rule set and an escaped user key, borrowed: what a check looks up with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe<'a> {
    pub(crate) set: &'a RuleSet,
    pub(crate) key: &'a str,
}

/// What [`LocalKey`] and [`Probe`] have in common, so a map of the first can
/// be searched with the second.
pub(crate) trait Lookup {
    fn parts(&self) -> (&RuleSet, &str);
}

impl Lookup for LocalKey {
    fn parts(&self) -> (&RuleSet, &str) {
        (&self.set, &self.key)
    }
}

impl Lookup for Probe<'_> {
    fn parts(&self) -> (&RuleSet, &str) {
        (self.set, self.key)
    }
}

impl Hash for dyn Lookup + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (set, key) = self.parts();
        state.write_u64(set.identity_hash());
        // The key's bytes without `str`'s end marker: the identity before it
        // has a fixed length, so no two (set, key) pairs feed the same bytes.
        state.write(key.as_bytes());
    }
}

impl PartialEq for dyn Lookup + '_ {
    fn eq(&self, other: &Self) -> bool {
        let ((a, ka), (b, kb)) = (self.parts(), other.parts());
        ka == kb && a.same_identity(b)
    }
}

impl Eq for dyn Lookup + '_ {}

impl Hash for LocalKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn Lookup).hash(state);
    }
}

impl PartialEq for LocalKey {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn Lookup) == (other as &dyn Lookup)
    }
}

impl Eq for LocalKey {}

impl<'a> Borrow<dyn Lookup + 'a> for LocalKey {
    fn borrow(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

impl KeyBytes for LocalKey {
    fn key_bytes(&self) -> usize {
        self.key.len()
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
        self.get_or_try_insert_with(
            &Probe { set, key } as &dyn Lookup,
            || LocalKey::new(set, key),
            make,
        )
    }
}
