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
//!
//! A stored key of up to 23 bytes (user ids, IPv4 addresses, short tokens)
//! is kept inline in the map's slot ([`SmolStr`]): storing it allocates
//! nothing, and finding it compares bytes already at hand where a `String`
//! led to another cache line. Longer keys are shared on the heap, as before.

use std::borrow::{Borrow, Cow};
use std::hash::{Hash, Hasher};

use smol_str::SmolStr;
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
    key: KeyText<'a>,
}

/// A user key, borrowed or owned: inline up to 23 bytes, shared on the heap
/// beyond.
#[derive(Debug, Clone)]
enum KeyText<'a> {
    Borrowed(&'a str),
    Owned(SmolStr),
}

impl KeyText<'_> {
    #[inline]
    fn as_str(&self) -> &str {
        match self {
            KeyText::Borrowed(key) => key,
            KeyText::Owned(key) => key.as_str(),
        }
    }
}

impl<'a> Probe<'a> {
    pub(crate) fn new(set: &'a RuleSet, key: &'a str) -> Self {
        Probe {
            set: Cow::Borrowed(set),
            key: KeyText::Borrowed(key),
        }
    }
}

impl Hash for Probe<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.set.identity_hash());
        // The key's bytes without `str`'s end marker: the identity before it
        // has a fixed length, so no two (set, key) pairs feed the same bytes.
        state.write(self.key.as_str().as_bytes());
    }
}

impl PartialEq for Probe<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        same_bytes(self.key.as_str().as_bytes(), other.key.as_str().as_bytes())
            && self.set.same_identity(&other.set)
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
            key: KeyText::Owned(SmolStr::new(key)),
        })
    }

    pub(crate) fn set(&self) -> &RuleSet {
        &self.0.set
    }

    pub(crate) fn key(&self) -> &str {
        self.0.key.as_str()
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
        match &self.0.key {
            // An `Arc<str>`: the text and two counts.
            KeyText::Owned(key) if key.is_heap_allocated() => {
                key.len() + 2 * std::mem::size_of::<usize>()
            }
            _ => 0,
        }
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
    use super::{KeyBytes, LocalKey, Probe, same_bytes};
    use tierlimit_core::{Rule, RuleSet};

    #[test]
    fn a_short_key_is_inline_and_a_long_one_is_charged_its_heap_text() {
        let set = RuleSet::new("api", [Rule::per_second(1).expect("valid")]).expect("valid");
        let short = "k".repeat(23);
        let long = "k".repeat(24);
        assert_eq!(LocalKey::new(&set, &short).key_bytes(), 0);
        assert_eq!(
            LocalKey::new(&set, &long).key_bytes(),
            24 + 2 * std::mem::size_of::<usize>()
        );
        // Either way the owned key is found by a borrowed probe.
        for key in [short, long] {
            let owned = LocalKey::new(&set, &key);
            let probe: &Probe<'_> = std::borrow::Borrow::borrow(&owned);
            assert_eq!(probe, &Probe::new(&set, &key));
            assert_eq!(owned.key(), key);
        }
    }

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
