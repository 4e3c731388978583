//! Rules checked together, all or nothing.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::{Policy, Rule};

/// The most rules one rule set holds (one script call checks them all).
pub const MAX_RULES: usize = 16;

/// A named, non-empty list of [`Rule`]s checked together: a request is admitted
/// only when every rule admits it, and a denied request consumes nothing in any
/// rule.
///
/// Cloning is cheap (the rules are shared).
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Policy, Rule, RuleSet};
///
/// let api = RuleSet::new(
///     "api",
///     [Rule::per_minute(10)?, Rule::per_hour(100)?, Rule::per_day(1000)?],
/// )?
/// .with_policy(Policy::LocalFallback);
/// assert_eq!(api.rules().len(), 3);
/// assert!(RuleSet::new("empty", []).is_err());
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct RuleSet {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    rules: Vec<Rule>,
    /// `:<name>:<rule id>` per rule: the part of a storage key after the user key.
    suffixes: Vec<String>,
    /// The suffixes joined: the name and every rule id, in order.
    identity: String,
    /// A hash of `identity`, the same in every process of a build.
    identity_hash: u64,
    /// Unique to this value in the process (never reused): see [`RuleSet::id`].
    id: u64,
    /// Per rule, the five numbers the check script reads, formatted once here
    /// rather than on every check (see [`RuleSet::script_args`]).
    script_args: Vec<[String; 5]>,
    policy: Option<Policy>,
    reconcile: Option<bool>,
}

impl PartialEq for RuleSet {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (&*self.inner, &*other.inner);
        a.name == b.name && a.rules == b.rules && a.policy == b.policy && a.reconcile == b.reconcile
    }
}

impl Eq for RuleSet {}

impl RuleSet {
    /// A rule set named `name` (1 to 64 characters from `[A-Za-z0-9_.-]`; the
    /// name is part of every storage key, so two rule sets never share state).
    pub fn new(name: impl Into<String>, rules: impl IntoIterator<Item = Rule>) -> Result<RuleSet> {
        let name = name.into();
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !name_ok {
            return Err(Error::InvalidName { name });
        }
        let rules: Vec<Rule> = rules.into_iter().collect();
        if rules.is_empty() {
            return Err(Error::EmptyRuleSet);
        }
        if rules.len() > MAX_RULES {
            return Err(Error::TooManyRules {
                count: rules.len(),
                max: MAX_RULES,
            });
        }
        // Two rules with one id share one storage key; the check script refuses
        // a key named twice (it could not commit both without a partial write).
        let ids: Vec<String> = rules.iter().map(Rule::id).collect();
        for (second, id) in ids.iter().enumerate() {
            if let Some(first) = ids[..second].iter().position(|i| i == id) {
                return Err(Error::DuplicateRule { first, second });
            }
        }
        let suffixes: Vec<String> = ids.iter().map(|id| format!(":{name}:{id}")).collect();
        let identity = suffixes.concat();
        let script_args = rules.iter().map(script_args).collect();
        Ok(RuleSet {
            inner: Arc::new(Inner {
                identity_hash: hash_identity(&identity),
                id: next_id(),
                identity,
                name,
                rules,
                suffixes,
                script_args,
                policy: None,
                reconcile: None,
            }),
        })
    }

    /// Sets this rule set's failure policy (otherwise the limiter's default applies).
    pub fn with_policy(self, policy: Policy) -> RuleSet {
        self.modify(|inner| inner.policy = Some(policy))
    }

    /// Turns reconciliation after an outage on or off for every rule of this set
    /// (default: on).
    ///
    /// On, what the local tier admitted while Redis could not be asked is
    /// written back once it answers, for every rule whose window is still
    /// live. A short window matters too: a 2 s window of 61 admitted 68-124
    /// around a heal without the write-back (Redis' 61 plus what was admitted
    /// locally), 63-66 with it (measured for issue 9). A write-back whose
    /// window has passed is dropped without a Redis call.
    pub fn with_reconcile(self, on: bool) -> RuleSet {
        self.modify(|inner| inner.reconcile = Some(on))
    }

    fn modify(self, f: impl FnOnce(&mut Inner)) -> RuleSet {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            name: shared.name.clone(),
            rules: shared.rules.clone(),
            suffixes: shared.suffixes.clone(),
            identity: shared.identity.clone(),
            identity_hash: shared.identity_hash,
            id: next_id(),
            script_args: shared.script_args.clone(),
            policy: shared.policy,
            reconcile: shared.reconcile,
        });
        f(&mut inner);
        RuleSet {
            inner: Arc::new(inner),
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// What state is keyed by, on Redis and locally: the name and the
    /// [id](Rule::id) of every rule (algorithm, period, UTC offset), in order.
    /// Two rule sets with the same identity share their state (their limits,
    /// bursts, policy and reconcile setting may differ); two with the same name
    /// and different identities never do.
    ///
    /// Changing only a rule's limit or burst (say, during a rolling deploy or a
    /// hot reload) keeps the identity, so the storage key and what was used
    /// carry over: on Redis and in the local buckets, the units already used in
    /// the current window (fixed and sliding windows, sliding log) or still
    /// draining (GCRA, token bucket) count against the new limit. Raising 100
    /// to 200 per minute after 80 were used leaves 120 this minute; lowering it
    /// to 50 denies until the usage has drained below 50. A denial cached under
    /// the old limits is not applied to the new ones. While old and new sets are
    /// checked side by side, each admits by its own limit against the shared
    /// usage, so the key never takes more than the larger limit.
    ///
    /// Changing a rule's algorithm, period or UTC offset changes its id: the
    /// rule starts afresh, on Redis under a new key (the old key expires by its
    /// TTL) and locally in new buckets, with no cached denial or warm seed from
    /// the old rule. Instances still running the old rule keep counting under
    /// the old key until they are replaced.
    ///
    /// # Examples
    ///
    /// ```
    /// use tierlimit_core::{Rule, RuleSet};
    ///
    /// let before = RuleSet::new("api", [Rule::per_minute(100)?])?;
    /// let raised = RuleSet::new("api", [Rule::per_minute(200)?.with_burst(20)?])?;
    /// let hourly = RuleSet::new("api", [Rule::per_hour(100)?])?;
    /// assert_eq!(before.identity(), raised.identity());
    /// assert_eq!(before.storage_key("u", 0), raised.storage_key("u", 0));
    /// assert_ne!(before.identity(), hourly.identity());
    /// # Ok::<(), tierlimit_core::Error>(())
    /// ```
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// A hash of [`identity`](Self::identity), computed once: maps keyed by
    /// identity hash this rather than the whole string on every lookup.
    pub fn identity_hash(&self) -> u64 {
        self.inner.identity_hash
    }

    /// A number no other rule set of this process has had or will have
    /// (clones share it; [`with_policy`](Self::with_policy) and
    /// [`with_reconcile`](Self::with_reconcile) make a new one): what caches of
    /// per-set handles, such as metric counters, are keyed by.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// True when both sets have the same [`identity`](Self::identity) (clones
    /// of one set answer without comparing strings).
    pub fn same_identity(&self, other: &RuleSet) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.identity_hash == other.inner.identity_hash
                && self.inner.identity == other.inner.identity)
    }

    /// The rules, in the order they were given (decisions name rules by index).
    pub fn rules(&self) -> &[Rule] {
        &self.inner.rules
    }

    /// The policy set on this rule set, if any.
    pub fn policy(&self) -> Option<Policy> {
        self.inner.policy
    }

    /// Whether what rule `index` admitted locally during an outage is written back
    /// to Redis afterwards.
    pub fn reconciles(&self, index: usize) -> bool {
        index < self.inner.rules.len() && self.inner.reconcile.unwrap_or(true)
    }

    /// Checks a cost against every rule: 0 is [`Error::ZeroCost`], more than a
    /// rule's capacity is [`Error::CostExceedsCapacity`] (it could never succeed).
    pub fn validate_cost(&self, cost: u64) -> Result<()> {
        if cost == 0 {
            return Err(Error::ZeroCost);
        }
        match self
            .rules()
            .iter()
            .enumerate()
            .find(|(_, r)| cost > r.capacity())
        {
            Some((rule, r)) => Err(Error::CostExceedsCapacity {
                cost,
                rule,
                capacity: r.capacity(),
            }),
            None => Ok(()),
        }
    }

    /// The storage key of rule `index` for `escaped_key` (see
    /// [`escape_key`](crate::escape_key)): `tl:{<key>}:<set>:<rule id>`. All rules of
    /// one user key share the hash tag, so they sit in one Redis Cluster slot.
    ///
    /// # Panics
    ///
    /// Never for `index < self.rules().len()`; other indexes are a bug in the caller.
    pub fn storage_key(&self, escaped_key: &str, index: usize) -> String {
        let suffix = &self.inner.suffixes[index];
        let mut key = String::with_capacity(6 + escaped_key.len() + suffix.len());
        key.push_str("tl:{");
        key.push_str(escaped_key);
        key.push('}');
        key.push_str(suffix);
        key
    }

    /// The part of rule `index`'s [storage key](Self::storage_key) after the
    /// user key's hash tag: `:<set>:<rule id>`, so that key is
    /// `tl:{<escaped key>}` followed by this. For callers that write keys
    /// straight into a buffer of their own.
    ///
    /// # Panics
    ///
    /// Never for `index < self.rules().len()`; other indexes are a bug in the caller.
    ///
    /// # Examples
    ///
    /// ```
    /// use tierlimit_core::{Rule, RuleSet};
    ///
    /// let set = RuleSet::new("api", [Rule::per_second(10)?])?;
    /// let key = format!("tl:{{user:42}}{}", set.storage_key_suffix(0));
    /// assert_eq!(key, set.storage_key("user:42", 0));
    /// # Ok::<(), tierlimit_core::Error>(())
    /// ```
    pub fn storage_key_suffix(&self, index: usize) -> &str {
        &self.inner.suffixes[index]
    }

    /// The five numbers the Redis check script (`lua/check.lua`) reads for
    /// rule `index`, as decimal strings, in its order: algorithm
    /// [code](crate::Algorithm::code), limit, period in µs, capacity, UTC
    /// offset in µs. Formatted once when the set is built, since they never
    /// change, so a check copies them instead of formatting them again.
    ///
    /// # Panics
    ///
    /// Never for `index < self.rules().len()`; other indexes are a bug in the caller.
    ///
    /// # Examples
    ///
    /// ```
    /// use tierlimit_core::{Rule, RuleSet};
    ///
    /// let set = RuleSet::new("api", [Rule::per_natural_day(1000, -8 * 3600)?])?;
    /// assert_eq!(set.script_args(0), ["5", "1000", "86400000000", "1000", "-28800000000"]);
    /// # Ok::<(), tierlimit_core::Error>(())
    /// ```
    pub fn script_args(&self, index: usize) -> [&str; 5] {
        self.inner.script_args[index].each_ref().map(String::as_str)
    }
}

/// [`RuleSet::script_args`] of one rule.
fn script_args(rule: &Rule) -> [String; 5] {
    [
        rule.algorithm().code().to_string(),
        rule.limit().to_string(),
        rule.period_micros().to_string(),
        rule.capacity().to_string(),
        (i64::from(rule.utc_offset_secs()) * 1_000_000).to_string(),
    ]
}

fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn hash_identity(identity: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    // `DefaultHasher::new()` has fixed keys: the same identity hashes the same
    // in every process of one build.
    let mut h = DefaultHasher::new();
    identity.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_keys_share_one_hash_tag() {
        let set = RuleSet::new(
            "s",
            [
                Rule::per_second(3).expect("valid"),
                Rule::per_minute(5).expect("valid"),
            ],
        )
        .expect("valid");
        let a = set.storage_key("u1", 0);
        let b = set.storage_key("u1", 1);
        assert_ne!(a, b);
        assert!(a.starts_with("tl:{u1}:s:"));
        assert!(b.starts_with("tl:{u1}:s:"));
    }

    #[test]
    fn every_rule_reconciles_by_default() {
        let set = RuleSet::new(
            "s",
            [
                Rule::per_second(3).expect("valid"),
                Rule::per_minute(5).expect("valid"),
            ],
        )
        .expect("valid");
        // Regression (issue 9, item 6): rules under a minute were left out.
        assert!(set.reconciles(0));
        assert!(set.reconciles(1));
        assert!(!set.reconciles(2));
        let set = set.with_reconcile(false);
        assert!(!set.reconciles(0));
    }

    /// Issue 13: with limits out of rule ids, two rules of one algorithm and
    /// period would share one storage key.
    #[test]
    fn rules_sharing_an_id_are_refused() {
        let rules = [
            Rule::per_minute(10).expect("valid"),
            Rule::per_hour(100).expect("valid"),
            Rule::per_minute(20).expect("valid"),
        ];
        assert!(matches!(
            RuleSet::new("s", rules),
            Err(Error::DuplicateRule {
                first: 0,
                second: 2
            })
        ));
        let other_algorithm = Rule::per_minute(20)
            .and_then(|r| r.with_algorithm(crate::Algorithm::FixedWindow))
            .expect("valid");
        assert!(RuleSet::new("s", [Rule::per_minute(10).expect("valid"), other_algorithm]).is_ok());
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", "a b", "a{b", "x".repeat(65).as_str()] {
            assert!(matches!(
                RuleSet::new(bad, [Rule::per_second(1).expect("valid")]),
                Err(Error::InvalidName { .. })
            ));
        }
    }
}
