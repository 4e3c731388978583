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
//! A stored key holds its rule set through [`SharedSets`]: one copy per
//! distinct set, charged to the byte bound once. A caller that builds its
//! `RuleSet` per request (limits from a user's plan, say) otherwise left a
//! copy of its own in every key, several KB for a set of 16 rules, none of it
//! charged: the process outgrew `max_bytes` many times over.
//!
//! A stored key of up to 23 bytes (user ids, IPv4 addresses, short tokens)
//! is kept inline in the map's slot ([`SmolStr`]): storing it allocates
//! nothing, and finding it compares bytes already at hand where a `String`
//! led to another cache line. Longer keys are shared on the heap, as before.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

use smol_str::SmolStr;
use tierlimit_core::{Rule, RuleSet};

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
    set: SetRef<'a>,
    key: KeyText<'a>,
}

/// A rule set, borrowed (a check's) or shared (a stored key's, from
/// [`SharedSets`]).
#[derive(Debug, Clone)]
enum SetRef<'a> {
    Borrowed(&'a RuleSet),
    Shared(Arc<RuleSet>),
}

impl Deref for SetRef<'_> {
    type Target = RuleSet;

    #[inline]
    fn deref(&self) -> &RuleSet {
        match self {
            SetRef::Borrowed(set) => set,
            SetRef::Shared(set) => set,
        }
    }
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
            set: SetRef::Borrowed(set),
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
    /// `key` under `set`, a copy from [`SharedSets::share`].
    pub(crate) fn new(set: Arc<RuleSet>, key: &str) -> Self {
        LocalKey(Probe {
            set: SetRef::Shared(set),
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
    /// room, in this map and for the set in `sets`; the owned key is built
    /// only then.
    pub(crate) fn entry_of(
        &self,
        sets: &SharedSets,
        set: &RuleSet,
        key: &str,
        make: impl FnOnce(&LocalKey) -> V,
    ) -> Option<RefMut<'_, LocalKey, V>> {
        self.get_or_try_insert_with(
            &Probe::new(set, key),
            || sets.share(set).map(|set| LocalKey::new(set, key)),
            make,
        )
    }
}

/// One copy of each distinct rule set the maps' keys (and cached denials)
/// hold, charged to the byte bound: see the module's docs. Bounded like the
/// other maps; a copy no key holds any more goes at the next
/// [`prune`](SharedSets::prune).
#[derive(Debug)]
pub(crate) struct SharedSets {
    map: BoundedMap<SetKey, Arc<RuleSet>>,
}

/// A set as [`SharedSets`] finds its copy: equal sets (name, rules with their
/// limits and bursts, policy, reconciling, stripes) share one.
#[derive(Debug, Clone)]
struct SetKey(RuleSet);

impl Hash for SetKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.identity_hash());
        self.0.rules().hash(state);
    }
}

impl PartialEq for SetKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for SetKey {}

impl KeyBytes for SetKey {
    /// The key is a second handle on the value's set: charged there.
    fn key_bytes(&self) -> usize {
        0
    }
}

impl ValueBytes for Arc<RuleSet> {
    fn value_bytes(&self) -> usize {
        set_bytes(self)
    }
}

/// About what a rule set takes on the heap: its fields, texts and rules, and
/// its stripes' sets. Counted from what the set shows, so an estimate: each
/// allocation is taken at its length plus the allocator's 16 bytes.
fn set_bytes(set: &RuleSet) -> usize {
    /// The set's own fields with its `Arc`'s counts, and its five vectors
    /// and strings.
    const FIXED: usize = 256 + 5 * 16;
    let rules = set.rules().len();
    let texts: usize = (0..rules)
        .map(|i| set.storage_key_suffix(i).len() + set.script_arg(i).len() + 2 * 16)
        .sum();
    let own = FIXED
        + set.name().len()
        + set.identity().len()
        + texts
        + rules * (std::mem::size_of::<Rule>() + 2 * std::mem::size_of::<String>());
    let stripes = if set.stripes() > 1 {
        (0..set.stripes())
            .filter_map(|i| set.stripe(i))
            .map(set_bytes)
            .sum()
    } else {
        0
    };
    own + stripes
}

impl SharedSets {
    /// At most `max` distinct sets and `max_bytes`.
    pub(crate) fn new(max: usize, max_bytes: usize) -> Self {
        SharedSets {
            map: BoundedMap::new(max, max_bytes),
        }
    }

    /// The shared copy of `set`, made when there is none yet; `None` when
    /// there is none and no room for one.
    pub(crate) fn share(&self, set: &RuleSet) -> Option<Arc<RuleSet>> {
        let copy = self
            .map
            .get_or_try_insert(SetKey(set.clone()), |_| Arc::new(set.clone()))?;
        Some(copy.value().clone())
    }

    /// Drops the copies no key holds.
    pub(crate) fn prune(&self) {
        self.map.retain(|_, set| Arc::strong_count(set) > 1);
    }

    /// Bytes charged to the copies.
    pub(crate) fn bytes(&self) -> usize {
        self.map.bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{BoundedMap, KeyBytes, LocalKey, Probe, SharedSets, ValueBytes, same_bytes};
    use tierlimit_core::{Rule, RuleSet};

    #[test]
    fn a_short_key_is_inline_and_a_long_one_is_charged_its_heap_text() {
        let set = RuleSet::new("api", [Rule::per_second(1).expect("valid")]).expect("valid");
        let short = "k".repeat(23);
        let long = "k".repeat(24);
        let shared = Arc::new(set.clone());
        assert_eq!(LocalKey::new(shared.clone(), &short).key_bytes(), 0);
        assert_eq!(
            LocalKey::new(shared.clone(), &long).key_bytes(),
            24 + 2 * std::mem::size_of::<usize>()
        );
        // Either way the owned key is found by a borrowed probe.
        for key in [short, long] {
            let owned = LocalKey::new(shared.clone(), &key);
            let probe: &Probe<'_> = std::borrow::Borrow::borrow(&owned);
            assert_eq!(probe, &Probe::new(&set, &key));
            assert_eq!(owned.key(), key);
        }
    }

    #[test]
    fn equal_sets_share_one_copy_until_no_key_holds_it() {
        let set = || RuleSet::new("api", [Rule::per_second(10).expect("valid")]).expect("valid");
        let raised = RuleSet::new("api", [Rule::per_second(20).expect("valid")]).expect("valid");
        let sets = SharedSets::new(10, 1 << 20);
        let a = sets.share(&set()).expect("room");
        let b = sets.share(&set()).expect("room");
        assert!(Arc::ptr_eq(&a, &b), "two equal sets got two copies");
        let c = sets.share(&raised).expect("room");
        assert!(
            !Arc::ptr_eq(&a, &c),
            "a set with other limits got the first one's copy"
        );
        let charged = sets.bytes();
        assert!(charged > 2 * 256, "{charged} bytes charged for two sets");
        drop((b, c));
        sets.prune();
        assert!(
            sets.bytes() < charged,
            "the raised set's copy outlived its last holder"
        );
        // The copy still held stays, and is still the one handed out.
        assert!(Arc::ptr_eq(&a, &sets.share(&set()).expect("room")));
    }

    /// The largest set there is fits the rule sets' share of the smallest
    /// byte bound: one that did not fit could never be decided locally.
    #[test]
    fn the_largest_set_fits_the_smallest_bound() {
        use tierlimit_core::{MAX_RULES, MAX_STRIPES};
        let rules = (1..=MAX_RULES as u64).map(|i| {
            Rule::with_period(1_000_000 * i, std::time::Duration::from_secs(60 * i)).expect("valid")
        });
        let set = RuleSet::new("n".repeat(64), rules)
            .and_then(|s| s.with_stripes(MAX_STRIPES))
            .expect("valid");
        let sets = SharedSets::new(1, crate::tier::MIN_BYTES / 8);
        assert!(
            sets.share(&set).is_some(),
            "{} bytes",
            super::set_bytes(&set)
        );
    }

    #[test]
    fn a_full_set_store_refuses_a_new_set_and_its_key() {
        let sets = SharedSets::new(1, 1 << 20);
        let first = RuleSet::new("a", [Rule::per_second(1).expect("valid")]).expect("valid");
        let second = RuleSet::new("b", [Rule::per_second(1).expect("valid")]).expect("valid");
        let _held = sets.share(&first).expect("room");
        assert!(sets.share(&second).is_none());
        struct Unit;
        impl ValueBytes for Unit {}
        let map: BoundedMap<LocalKey, Unit> = BoundedMap::new(10, 1 << 20);
        assert!(map.entry_of(&sets, &second, "k", |_| Unit).is_none());
        assert!(map.entry_of(&sets, &first, "k", |_| Unit).is_some());
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
