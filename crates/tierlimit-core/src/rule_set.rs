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
    /// Per rule, the argument the check script reads, formatted once here
    /// rather than on every check (see [`RuleSet::script_arg`]).
    script_args: Vec<String>,
    policy: Option<Policy>,
    reconcile: Option<bool>,
    /// One set per stripe, each rule at its share (see
    /// [`RuleSet::with_stripes`]); empty when the set is not striped.
    stripes: Vec<RuleSet>,
    /// The largest cost [`RuleSet::validate_cost`] accepts: the smallest
    /// capacity of a rule (of the smallest stripe when striped), kept so a
    /// check validates its cost with one comparison.
    max_cost: u64,
}

impl Inner {
    /// The smallest capacity of a rule (of the last, smallest, stripe when striped).
    fn smallest_capacity(&self) -> u64 {
        match self.stripes.last() {
            Some(smallest) => smallest.inner.max_cost,
            None => self.rules.iter().map(Rule::capacity).min().unwrap_or(0),
        }
    }
}

impl PartialEq for RuleSet {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (&*self.inner, &*other.inner);
        a.name == b.name
            && a.rules == b.rules
            && a.policy == b.policy
            && a.reconcile == b.reconcile
            && a.stripes.len() == b.stripes.len()
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
        let script_args = rules.iter().map(|r| r.script_arg().to_string()).collect();
        let max_cost = rules.iter().map(Rule::capacity).min().unwrap_or(0);
        Ok(RuleSet {
            inner: Arc::new(Inner {
                max_cost,
                identity_hash: hash_identity(&identity),
                id: next_id(),
                identity,
                name,
                rules,
                suffixes,
                script_args,
                policy: None,
                reconcile: None,
                stripes: Vec::new(),
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

    /// Spreads every user key of this set over `stripes` sub-keys (stripes),
    /// for a hot key that one Redis Cluster node cannot serve alone (one rule
    /// for a whole tenant, say). Each stripe has a hash tag of its own (see
    /// [`stripe_key`](crate::stripe_key)), so on a cluster the stripes land on
    /// different slots, and each has a share of every rule: the limit and the
    /// burst split by [`stripe_share`](crate::stripe_share) (10 over 4 is
    /// 3, 3, 2, 2), so the shares add up to the rule exactly. 1 stripe is no
    /// striping (the default).
    ///
    /// [`Error::StripesOutOfRange`] unless `stripes` is 1 to
    /// [`MAX_STRIPES`](crate::MAX_STRIPES); [`Error::StripesExceedRule`] when
    /// a rule's limit or capacity is below `stripes` (a stripe would get 0).
    /// A stripe's share is a rule of its own: one that breaks a bound of
    /// [`Rule`] is that bound's error, with the share's numbers (a burst far
    /// above its limit, split, can leave a share whose refill is longer than
    /// GCRA keeps: [`Error::BurstWindowTooLong`] for 75,000 over a limit of
    /// 1 per day, from a burst of 150,000 over 3 per day on 2 stripes).
    ///
    /// # How the Redis tier checks a striped key
    ///
    /// A check asks one stripe, chosen at random; when that stripe denies it,
    /// the next, and so on, until one admits or all `stripes` have denied it.
    /// So a key with room anywhere is admitted, and a denial costs up to
    /// `stripes` round trips (in turn, all within the one deadline of the
    /// check). The denial's retry-after is the earliest of the stripes', and
    /// the hybrid limiter's denial cache keeps a saturated key off Redis
    /// until then, so a saturated key pays those round trips once per
    /// retry-after, not once per request. A striped decision's `limit` is
    /// the whole rule's; its `remaining` (and each rule's) is the deciding
    /// stripe's scaled by the number of stripes, at most the capacity: an
    /// estimate, since the other stripes were not read. The local tier's warm
    /// start (when an outage begins) starts from that estimate too, so it may
    /// be off by what the stripes' usage differs; the write-back afterwards
    /// never charges the key beyond its limit.
    ///
    /// # Accuracy
    ///
    /// With limit `L` (capacity `C`) over `K` stripes and checks of cost `c`:
    ///
    /// * **Never above the limit** while the number of stripes stays the
    ///   same (for the window in which it changes, see below). Each stripe
    ///   is exact for its share, and
    ///   the shares add up to `L` (and `C`): a fixed window admits at most
    ///   `L` per window, a sliding log at most `L` in any trailing period,
    ///   GCRA and the token bucket at most `C + L·t/period` over any span
    ///   `t`, as without striping. The sliding window counter keeps its own
    ///   approximation per stripe.
    /// * **Close to the limit when demand exceeds it.** A check is denied
    ///   only after every stripe denied it, each then holding fewer than `c`
    ///   units, so the key held fewer than `K·(c − 1) + 1` units in all: a
    ///   window in which a check of cost `c` was denied admitted at least
    ///   `L − K·(c − 1)`, and for checks of cost 1 exactly `L`.
    /// * **Cost.** A check's cost must fit on one stripe: at most the
    ///   smallest stripe's capacity, `⌊C/K⌋`
    ///   ([`validate_cost`](Self::validate_cost) says so).
    ///
    /// # State, reload and the local tier
    ///
    /// Striping keeps the [`identity`](Self::identity): stripe 0 is the
    /// unstriped key itself and every stripe keeps the rules' ids, so
    /// striping a set, or changing its number of stripes, carries state over
    /// as a changed limit does (stripe 0 keeps what the key used; stripes
    /// added start empty, stripes dropped expire by their TTL). So in the
    /// window (or refill span) in which the number of stripes changes, a key
    /// may get up to the added stripes' shares on top of what it used: a
    /// fixed window of 100 that had used all 100, restriped from 1 to 4,
    /// admits 75 more in that window. Change the number of stripes at a
    /// quiet time or accept that once. The local
    /// tier ignores stripes: during an outage it limits the whole key by the
    /// whole rule (this instance's share of it), and the write-back spreads
    /// what it admitted over the stripes by the same shares, so no stripe is
    /// charged beyond its share of the limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use tierlimit_core::{Error, Rule, RuleSet};
    ///
    /// let tenant = RuleSet::new("tenant", [Rule::per_second(1000)?])?.with_stripes(4)?;
    /// assert_eq!(tenant.stripes(), 4);
    /// assert_eq!(tenant.stripe(3).map(|s| s.rules()[0].limit()), Some(250));
    /// assert!(matches!(
    ///     RuleSet::new("tiny", [Rule::per_second(3)?])?.with_stripes(4),
    ///     Err(Error::StripesExceedRule { rule: 0, .. })
    /// ));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn with_stripes(self, stripes: u32) -> Result<RuleSet> {
        for (i, rule) in self.rules().iter().enumerate() {
            rule.check_stripes(stripes, i)?;
        }
        let sets = if stripes == 1 {
            Vec::new()
        } else {
            (0..stripes)
                .map(|s| {
                    let rules = self
                        .rules()
                        .iter()
                        .map(|r| r.stripe(stripes, s))
                        .collect::<Result<Vec<Rule>>>()?;
                    RuleSet::new(self.name(), rules)
                })
                .collect::<Result<Vec<RuleSet>>>()?
        };
        Ok(self.modify(|inner| inner.stripes = sets))
    }

    /// The number of stripes each user key is spread over (1: not striped);
    /// see [`with_stripes`](Self::with_stripes).
    pub fn stripes(&self) -> u32 {
        u32::try_from(self.inner.stripes.len().max(1)).unwrap_or(u32::MAX)
    }

    /// Stripe `stripe`'s rule set: the same name and rule ids, each rule at
    /// its [share](crate::Rule::stripe); this set itself for stripe 0 of an
    /// unstriped set, `None` past the last stripe. Read-only: what the Redis
    /// tier checks one stripe with.
    pub fn stripe(&self, stripe: u32) -> Option<&RuleSet> {
        if self.inner.stripes.is_empty() {
            return (stripe == 0).then_some(self);
        }
        self.inner.stripes.get(usize::try_from(stripe).ok()?)
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
            stripes: shared.stripes.clone(),
            max_cost: shared.max_cost,
        });
        f(&mut inner);
        inner.max_cost = inner.smallest_capacity();
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
    /// (clones share it; [`with_policy`](Self::with_policy),
    /// [`with_reconcile`](Self::with_reconcile) and
    /// [`with_stripes`](Self::with_stripes) make a new one): what caches of
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
    /// A [striped](Self::with_stripes) set's capacity is its smallest
    /// stripe's: one check is decided by one stripe.
    #[inline]
    pub fn validate_cost(&self, cost: u64) -> Result<()> {
        // The common case in one comparison, inlined into the caller; the
        // errors, which name the rule, out of line.
        if cost != 0 && cost <= self.inner.max_cost {
            return Ok(());
        }
        self.cost_error(cost)
    }

    #[inline(never)]
    fn cost_error(&self, cost: u64) -> Result<()> {
        if let Some(smallest) = self.inner.stripes.last() {
            return smallest.validate_cost(cost);
        }
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

    /// [`Rule::script_arg`] of rule `index`: the argument the Redis check
    /// script (`lua/check.lua`) reads for it. Formatted once when the set is
    /// built, since it never changes, so a check copies it instead of
    /// formatting it again.
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
    /// assert_eq!(set.script_arg(0), "5:1000:86400000000:1000:-28800000000");
    /// # Ok::<(), tierlimit_core::Error>(())
    /// ```
    pub fn script_arg(&self, index: usize) -> &str {
        &self.inner.script_args[index]
    }
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
    fn striping_is_validated_and_keeps_the_identity() {
        let set = RuleSet::new(
            "s",
            [
                Rule::per_second(10).expect("valid"),
                Rule::per_minute(7)
                    .and_then(|r| r.with_burst(5))
                    .expect("valid"),
            ],
        )
        .expect("valid");
        assert_eq!(set.stripes(), 1);
        assert!(
            set.stripe(0)
                .is_some_and(|s| Arc::ptr_eq(&s.inner, &set.inner))
        );
        assert!(set.stripe(1).is_none());
        for bad in [0, crate::MAX_STRIPES + 1] {
            assert!(matches!(
                set.clone().with_stripes(bad),
                Err(Error::StripesOutOfRange { .. })
            ));
        }
        // Rule 1's burst of 5 cannot give 6 stripes one unit each.
        assert!(matches!(
            set.clone().with_stripes(6),
            Err(Error::StripesExceedRule {
                rule: 1,
                what: "capacity",
                value: 5,
                ..
            })
        ));
        let striped = set.clone().with_stripes(5).expect("5 fits every rule");
        assert_eq!(striped.stripes(), 5);
        assert!(striped.same_identity(&set));
        assert_ne!(striped, set);
        assert_eq!(striped.clone().with_stripes(1).expect("valid"), set);
        let shares: Vec<(u64, u64)> = (0..5)
            .map(|i| {
                let s = striped.stripe(i).expect("in range");
                assert_eq!(s.identity(), set.identity());
                (s.rules()[0].limit(), s.rules()[1].capacity())
            })
            .collect();
        assert_eq!(shares, [(2, 1); 5]);
        // Policy and reconcile after striping keep the stripes.
        let striped = striped.with_reconcile(false);
        assert_eq!(striped.stripes(), 5);
        // One check is decided by one stripe: its cost fits the smallest.
        assert!(striped.validate_cost(1).is_ok());
        assert!(matches!(
            striped.validate_cost(2),
            Err(Error::CostExceedsCapacity {
                rule: 1,
                capacity: 1,
                ..
            })
        ));
    }

    #[test]
    fn the_cost_bound_follows_every_change_of_the_set() {
        let set = RuleSet::new(
            "bound",
            [
                Rule::per_second(10).expect("valid"),
                Rule::per_minute(100)
                    .and_then(|r| r.with_burst(4))
                    .expect("valid"),
            ],
        )
        .expect("valid");
        let exceeds = |s: &RuleSet, cost: u64| {
            matches!(
                s.validate_cost(cost),
                Err(Error::CostExceedsCapacity {
                    rule: 1,
                    capacity: 4,
                    ..
                })
            )
        };
        // The smallest capacity bounds the cost, whichever rule has it.
        assert!(set.validate_cost(4).is_ok());
        assert!(exceeds(&set, 5));
        assert!(matches!(set.validate_cost(0), Err(Error::ZeroCost)));
        // A shared set is copied by a change (the copy's bound is its own)...
        let kept = set.clone();
        let striped = set.with_stripes(2).expect("valid");
        assert!(striped.validate_cost(2).is_ok());
        assert!(matches!(
            striped.validate_cost(3),
            Err(Error::CostExceedsCapacity { capacity: 2, .. })
        ));
        assert!(kept.validate_cost(4).is_ok());
        // ...and one changed in place (not shared) keeps what striping set.
        let unstriped = striped
            .with_policy(Policy::FailOpen)
            .with_stripes(1)
            .expect("valid");
        assert!(unstriped.validate_cost(4).is_ok());
        assert!(exceeds(&unstriped, 5));
        assert!(matches!(unstriped.validate_cost(0), Err(Error::ZeroCost)));
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
