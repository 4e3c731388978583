//! The local tier: buckets, denial cache, warm-start memory and ledger together.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tierlimit_core::{Clock, Decision, Error, MAX_RULES, Result, RuleSet, Tier};

use crate::bounded::BoundedMap;
use crate::slot::{self, Share, Slot};
use crate::{Claim, Ledger};

/// Bounds of the local tier. Every map is bounded; see each field for what
/// happens when it is full.
///
/// # Examples
///
/// ```
/// use tierlimit_local::LocalConfig;
///
/// let config = LocalConfig { max_keys: 50_000, ..LocalConfig::default() };
/// assert!(config.validate().is_ok());
/// assert!(LocalConfig { max_keys: 0, ..config }.validate().is_err());
/// ```
// Not `#[non_exhaustive]`: it is built with `..LocalConfig::default()`, which
// keeps working when fields are added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalConfig {
    /// Most (rule set, key) buckets kept. When full, a check for a new key gets
    /// [`LocalAnswer::Full`] (the facade answers it with the rule set's overflow
    /// policy, fail-closed by default) and is counted in
    /// `tierlimit_local_keys_refused_total`; existing keys keep working.
    pub max_keys: usize,
    /// Most cached Redis denials. When full, new denials are not cached (they
    /// still reach Redis) until pruning frees room.
    pub max_denials: usize,
    /// Most keys whose last Redis-reported remaining is kept for warm starts.
    /// When full, new keys are not remembered until pruning frees room (they
    /// start full locally).
    pub max_warm_keys: usize,
    /// Most outage-ledger entries; see [`Ledger`].
    pub max_ledger_entries: usize,
    /// Most bytes the local tier's maps may take together (default 256 MiB,
    /// at least 1 MiB): the buckets and the ledger get 3/8 each, the denial
    /// cache and the warm-start map 1/8 each. Each entry is charged its key's
    /// bytes and its slot, so long keys hit this bound before the entry
    /// bounds: a full map refuses new entries as it does at its entry bound.
    /// What the process really takes stays within about this (the test
    /// `memory_is_bounded_by_bytes` measures it), plus the allocator's own
    /// slack.
    pub max_bytes: usize,
}

/// The smallest [`LocalConfig::max_bytes`].
const MIN_BYTES: usize = 1 << 20;

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            max_keys: 100_000,
            max_denials: 100_000,
            max_warm_keys: 100_000,
            max_ledger_entries: 1_000_000,
            max_bytes: 256 << 20,
        }
    }
}

impl LocalConfig {
    /// Checks every bound is at least 1.
    pub fn validate(&self) -> Result<()> {
        for (name, value) in [
            ("max_keys", self.max_keys),
            ("max_denials", self.max_denials),
            ("max_warm_keys", self.max_warm_keys),
            ("max_ledger_entries", self.max_ledger_entries),
        ] {
            if value == 0 {
                return Err(Error::InvalidConfig {
                    what: format!("local.{name} must be at least 1"),
                });
            }
        }
        if self.max_bytes < MIN_BYTES {
            return Err(Error::InvalidConfig {
                what: format!(
                    "local.max_bytes must be at least {MIN_BYTES} (got {})",
                    self.max_bytes
                ),
            });
        }
        Ok(())
    }
}

/// The local tier's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LocalAnswer {
    /// The local bucket decided (tier [`Tier::Local`]).
    Decided(Decision),
    /// The key is new and the bucket map is full: the caller applies its
    /// overflow answer.
    Full,
}

#[derive(Debug)]
struct Bucket {
    /// The rule set the slots were made for (its identity is the map key).
    set: RuleSet,
    /// The instance count and outage the slots were made for: a new count or a
    /// new outage starts the key afresh, from its warm seed.
    instances: u64,
    outage: u64,
    slots: Vec<Slot>,
}

#[derive(Debug, Clone, Copy)]
struct Denial {
    /// When the cache lets the key ask Redis again: a little before
    /// `retry_until_us` (see [`DENIAL_SPREAD`]).
    until_us: u64,
    /// When Redis said a retry could be admitted.
    retry_until_us: u64,
    cost: u64,
    decision: Decision,
}

/// Cached denials that would expire in a crowded millisecond expire early
/// instead, by a random share of their retry-after up to this one: denials
/// cached at one window boundary would otherwise all expire at the same
/// instant, and the whole fleet would return to Redis at once (latency spikes
/// of 15-27 ms at each boundary were measured for issue 9). Early, never late:
/// Redis stays the judge of when a retry is admitted.
pub const DENIAL_SPREAD: f64 = 0.2;

/// Denials that may expire in one millisecond before the rest are spread: a
/// lone hammered key is never moved, so it keeps costing one Redis call per
/// retry-after.
const CROWDED: u64 = 16;
/// Milliseconds of expiries tracked at once (a ring; an older millisecond's
/// count is taken over by a newer one).
const EXPIRY_RING: usize = 64;
/// Bits of a ring slot holding the count; the millisecond is above them.
const COUNT_BITS: u32 = 20;

#[derive(Debug)]
struct Warm {
    seen_at_us: u64,
    expires_us: u64,
    remaining: Vec<u64>,
}

/// The per-process tier used while Redis cannot be asked, plus the memory it
/// keeps while Redis is healthy (denials, last remaining values).
///
/// Buckets are sized to this instance's share of each rule: `ceil(limit /
/// instances)` (at least 1), so `instances` limiters together admit about the
/// global limit. A rule set is checked all or nothing, as in Redis.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tierlimit_core::{Rule, RuleSet, SystemClock, Tier};
/// use tierlimit_local::{LocalAnswer, LocalConfig, LocalTier};
///
/// let local = LocalTier::new(LocalConfig::default(), Arc::new(SystemClock))?;
/// let set = RuleSet::new("api", [Rule::per_minute(30)?])?;
/// // Three instances share the limit: this one admits ceil(30 / 3) = 10 at once.
/// let admitted = (0..30)
///     .filter(|_| matches!(local.check("user-1", &set, 1, 3, false),
///                          LocalAnswer::Decided(d) if d.allowed && d.tier == Tier::Local))
///     .count();
/// assert_eq!(admitted, 10);
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug)]
pub struct LocalTier {
    clock: Arc<dyn Clock>,
    buckets: BoundedMap<String, Bucket>,
    denials: BoundedMap<String, Denial>,
    warm: BoundedMap<String, Warm>,
    ledger: Ledger,
    refused: AtomicU64,
    /// Which outage buckets belong to; see [`LocalTier::end_outage`].
    outage: AtomicU64,
    /// Until when (clock µs) the ended outage's buckets still bound their keys.
    settle_until_us: AtomicU64,
    /// How many cached denials expire in each recent millisecond, as
    /// `ms << COUNT_BITS | count`, to tell a crowd from a lone key.
    expiries: [AtomicU64; EXPIRY_RING],
}

/// Local state is keyed like Redis state: by the rule set's identity (its
/// name and rule ids), so two sets that share a name but not their rules (or
/// a rule edited during a rolling deploy) never reset each other's buckets or
/// apply each other's denials.
fn map_key(set: &RuleSet, escaped_key: &str) -> String {
    // Neither identities nor keys hold control characters, so this is unambiguous.
    let identity = set.identity();
    let mut k = String::with_capacity(identity.len() + 1 + escaped_key.len());
    k.push_str(identity);
    k.push('\u{1f}');
    k.push_str(escaped_key);
    k
}

fn us(d: u64) -> Duration {
    Duration::from_micros(d)
}

impl LocalTier {
    /// A local tier with the given bounds and clock.
    pub fn new(config: LocalConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        config.validate()?;
        Ok(LocalTier {
            clock,
            buckets: BoundedMap::new(
                config.max_keys,
                config.max_bytes / 8 * 3,
                MAX_RULES * std::mem::size_of::<Slot>(),
            ),
            denials: BoundedMap::new(config.max_denials, config.max_bytes / 8, 0),
            warm: BoundedMap::new(
                config.max_warm_keys,
                config.max_bytes / 8,
                MAX_RULES * std::mem::size_of::<u64>(),
            ),
            ledger: Ledger::new(config.max_ledger_entries, config.max_bytes / 8 * 3),
            refused: AtomicU64::new(0),
            outage: AtomicU64::new(0),
            settle_until_us: AtomicU64::new(0),
            expiries: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }

    /// Counts one more denial expiring at `until_us`; true when that
    /// millisecond already holds [`CROWDED`] of them.
    fn crowded(&self, until_us: u64) -> bool {
        let ms = until_us / 1_000;
        let slot = &self.expiries[(ms % EXPIRY_RING as u64) as usize];
        let mask = (1u64 << COUNT_BITS) - 1;
        let tag = ms << COUNT_BITS;
        let mut count = 0;
        let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            count = if v & !mask == tag { (v & mask) + 1 } else { 1 };
            Some(tag | count.min(mask))
        });
        count > CROWDED
    }

    /// Ends the current outage: Redis answers again. Every bucket made so far
    /// is stale from now on, and the next outage starts each key from what
    /// Redis last reported (its warm seed), never from an older outage's
    /// bucket: a key that used its local share in one outage, then Redis for a
    /// while, would otherwise meet the next outage with the leftover of the
    /// first, which with hourly or daily rules admits about twice the limit.
    ///
    /// For `settle` after that, a key's bucket from the ended outage still
    /// bounds it ([`settling`](Self::settling)): instances return from an
    /// outage at different times (each probes after its own jittered
    /// cool-down), and until the last one has written back what it admitted,
    /// Redis undercounts the key. Without this, the first instance back could
    /// take the key's whole Redis quota on top of what the fleet admitted
    /// locally in the same window. Pass the longest time the other instances
    /// may take to come back (the breaker's longest cool-down plus a deadline).
    pub fn end_outage(&self, settle: Duration) {
        let until = self
            .clock
            .unix_micros()
            .saturating_add(u64::try_from(settle.as_micros()).unwrap_or(u64::MAX));
        self.settle_until_us.store(until, Ordering::Relaxed);
        self.outage.fetch_add(1, Ordering::Relaxed);
    }

    /// While the outage that just ended settles (see [`end_outage`](Self::end_outage)):
    /// charges `cost` to the key's bucket from that outage, if it has one, and
    /// answers its denial when that bucket has no room, so Redis is not asked
    /// (the caller asks Redis when this is `None`). Free otherwise.
    pub fn settling(&self, escaped_key: &str, set: &RuleSet, cost: u64) -> Option<Decision> {
        let now = self.clock.unix_micros();
        if now >= self.settle_until_us.load(Ordering::Relaxed) {
            return None;
        }
        let ended = self.outage.load(Ordering::Relaxed).checked_sub(1)?;
        let mut bucket = self.buckets.get_mut(map_key(set, escaped_key).as_str())?;
        if bucket.outage != ended {
            return None;
        }
        let instances = bucket.instances;
        let evals: Vec<slot::Eval> = set
            .rules()
            .iter()
            .zip(&bucket.slots)
            .map(|(r, slot)| slot::evaluate(r, Share::of(r, instances), *slot, now, cost))
            .collect();
        let allowed = evals.iter().all(|e| e.ok);
        if allowed {
            for (slot, e) in bucket.slots.iter_mut().zip(&evals) {
                *slot = e.next;
            }
            return None;
        }
        drop(bucket);
        Some(decide(set, &evals, false))
    }

    /// Checks `cost` units for `escaped_key` against this instance's share of
    /// every rule of `set`, all or nothing. When `record` is true, what is
    /// admitted is written to the outage ledger for the rules the set reconciles.
    ///
    /// Key and cost must already be validated (the facade does it first).
    pub fn check(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        cost: u64,
        instances: u64,
        record: bool,
    ) -> LocalAnswer {
        let now = self.clock.unix_micros();
        let outage = self.outage.load(Ordering::Relaxed);
        let key = map_key(set, escaped_key);
        let shares: Vec<Share> = set
            .rules()
            .iter()
            .map(|r| Share::of(r, instances))
            .collect();
        let fresh_slots = |key: &String| {
            let seeds = self.warm_seeds(key, set.rules().len(), now);
            Bucket {
                set: set.clone(),
                instances,
                outage,
                slots: set
                    .rules()
                    .iter()
                    .zip(&shares)
                    .enumerate()
                    .map(|(i, (r, s))| {
                        slot::fresh(
                            r,
                            *s,
                            now,
                            seeds.as_ref().map(|(at, rem)| (rem[i], *at)),
                            instances,
                        )
                    })
                    .collect(),
            }
        };
        // The warm store is a different map, so reading it while holding this
        // bucket's shard lock cannot deadlock.
        let Some(mut bucket) = self.buckets.get_or_try_insert(key, fresh_slots) else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("tierlimit_local_keys_refused_total").increment(1);
            return LocalAnswer::Full;
        };
        if bucket.instances != instances || bucket.outage != outage {
            *bucket = fresh_slots(bucket.key());
        }
        let evals: Vec<slot::Eval> = set
            .rules()
            .iter()
            .zip(&shares)
            .zip(&bucket.slots)
            .map(|((r, s), slot)| slot::evaluate(r, *s, *slot, now, cost))
            .collect();
        let allowed = evals.iter().all(|e| e.ok);
        if allowed {
            for (slot, e) in bucket.slots.iter_mut().zip(&evals) {
                *slot = e.next;
            }
        }
        drop(bucket);
        if allowed && record {
            for (i, rule) in set.rules().iter().enumerate() {
                if set.reconciles(i) {
                    self.ledger
                        .record(set.storage_key(escaped_key, i), rule, cost, now);
                }
            }
        }
        LocalAnswer::Decided(decide(set, &evals, allowed))
    }

    /// Claims what `escaped_key` still owes Redis under `set`'s rules, so the
    /// key's next Redis call can carry it; empty (and free) when the ledger is.
    pub fn claim_pending(&self, escaped_key: &str, set: &RuleSet) -> Vec<Claim> {
        if self.ledger.is_empty() {
            return Vec::new();
        }
        let now = self.clock.unix_micros();
        let mut claims = Vec::new();
        for (i, rule) in set.rules().iter().enumerate() {
            if set.reconciles(i) {
                claims.extend(
                    self.ledger
                        .claim_key(&set.storage_key(escaped_key, i), rule, now),
                );
            }
        }
        claims
    }

    /// Records `cost` units admitted without Redis for `escaped_key` in the outage
    /// ledger, for every rule the set reconciles.
    pub fn record(&self, escaped_key: &str, set: &RuleSet, cost: u64) {
        let now = self.clock.unix_micros();
        for (i, rule) in set.rules().iter().enumerate() {
            if set.reconciles(i) {
                self.ledger
                    .record(set.storage_key(escaped_key, i), rule, cost, now);
            }
        }
    }

    fn warm_seeds(&self, key: &str, rules: usize, now: u64) -> Option<(u64, Vec<u64>)> {
        let w = self.warm.get_mut(key)?;
        (w.expires_us > now && w.remaining.len() == rules)
            .then(|| (w.seen_at_us, w.remaining.clone()))
    }

    /// Remembers what Redis last reported for a key (per rule: remaining units and
    /// time until full), so a bucket created during an outage starts from there,
    /// scaled to the share, instead of from full. Kept until the last rule would be
    /// full again, bounded by [`LocalConfig::max_warm_keys`].
    pub fn remember(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        rules: impl Iterator<Item = (u64, Duration)>,
    ) {
        let now = self.clock.unix_micros();
        let mut remaining = Vec::with_capacity(set.rules().len());
        let mut longest = 0u64;
        for (r, reset) in rules {
            remaining.push(r);
            longest = longest.max(u64::try_from(reset.as_micros()).unwrap_or(u64::MAX));
        }
        let warm = Warm {
            seen_at_us: now,
            expires_us: now.saturating_add(longest),
            remaining,
        };
        if let Some(mut w) = self
            .warm
            .get_or_try_insert(map_key(set, escaped_key), |_| Warm {
                seen_at_us: 0,
                expires_us: 0,
                remaining: Vec::new(),
            })
        {
            *w = warm;
        }
    }

    /// Caches a Redis denial: until its retry-after passes, a request for the same
    /// key with at least the same cost is denied locally (tier
    /// [`Tier::DenyCache`]) without a Redis round trip.
    pub fn cache_denial(&self, escaped_key: &str, set: &RuleSet, cost: u64, decision: &Decision) {
        let Some(retry) = decision.retry_after else {
            return;
        };
        let now = self.clock.unix_micros();
        let retry_us = u64::try_from(retry.as_micros()).unwrap_or(u64::MAX);
        let retry_until_us = now.saturating_add(retry_us);
        let spread = |denial: &mut Denial| {
            let early = (retry_us as f64 * DENIAL_SPREAD * fastrand::f64()) as u64;
            denial.until_us = retry_until_us - early.min(retry_us);
        };
        let mut denial = Denial {
            until_us: retry_until_us,
            retry_until_us,
            cost,
            decision: *decision,
        };
        let mut fresh = false;
        let Some(mut d) = self
            .denials
            .get_or_try_insert(map_key(set, escaped_key), |_| {
                fresh = true;
                denial
            })
        else {
            return;
        };
        if fresh {
            if self.crowded(retry_until_us) {
                spread(&mut d);
            }
            return;
        }
        // A denial still nominally in force expired early (the spread) and
        // Redis denied again: keep the key off Redis until the retry-after
        // itself, so the spread costs one extra call per retry-after, not more.
        if d.retry_until_us <= now && self.crowded(retry_until_us) {
            spread(&mut denial);
        }
        // Keep the smaller cost: a denial at cost c implies a denial at any cost >= c.
        if d.until_us <= denial.until_us || denial.cost < d.cost {
            *d = denial;
        }
    }

    /// A cached denial for this request, if one is still in force.
    pub fn cached_denial(&self, escaped_key: &str, set: &RuleSet, cost: u64) -> Option<Decision> {
        let now = self.clock.unix_micros();
        let key = map_key(set, escaped_key);
        let d = *self.denials.get_mut(key.as_str())?;
        if d.until_us <= now {
            // Kept until the retry-after itself, so a re-denial is not spread again.
            self.denials
                .remove_if(key.as_str(), |d| d.retry_until_us <= now);
            return None;
        }
        if cost < d.cost {
            return None;
        }
        metrics::counter!("tierlimit_deny_cache_hits_total").increment(1);
        let mut decision = d.decision;
        decision.tier = Tier::DenyCache;
        decision.retry_after = Some(us(d.retry_until_us - now));
        Some(decision)
    }

    /// Forgets what no longer matters: buckets of an ended outage or back to
    /// full, expired denials and warm-start values; returns memory to the
    /// allocator.
    pub fn prune(&self) {
        let now = self.clock.unix_micros();
        let outage = self.outage.load(Ordering::Relaxed);
        let settling = now < self.settle_until_us.load(Ordering::Relaxed);
        self.buckets.retain(|_, b| {
            (b.outage == outage || (settling && b.outage + 1 == outage))
                && !b.set.rules().iter().zip(&b.slots).all(|(rule, slot)| {
                    slot::is_idle(rule, Share::of(rule, b.instances), *slot, now)
                })
        });
        self.denials.retain(|_, d| d.retry_until_us > now);
        self.warm.retain(|_, w| w.expires_us > now);
    }

    /// Number of local buckets.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// True when no local bucket exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of cached denials.
    pub fn denial_count(&self) -> usize {
        self.denials.len()
    }

    /// Bytes charged to the local tier's maps (see [`LocalConfig::max_bytes`]).
    pub fn bytes(&self) -> usize {
        self.buckets.bytes() + self.denials.bytes() + self.warm.bytes() + self.ledger.bytes()
    }

    /// Number of keys whose last Redis-reported state is kept for warm starts.
    pub fn warm_count(&self) -> usize {
        self.warm.len()
    }

    /// Checks refused because the bucket map was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The outage ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }
}

/// The deciding rule: when admitted the one with the fewest remaining, when
/// denied the denying one with the longest wait. `limit` is the rule's global
/// limit (what a client was promised), `remaining` this instance's.
fn decide(set: &RuleSet, evals: &[slot::Eval], allowed: bool) -> Decision {
    let key = |(i, e): &(usize, &slot::Eval)| {
        if allowed {
            (u64::MAX - e.remaining, std::cmp::Reverse(*i))
        } else {
            (e.retry_after_us * u64::from(!e.ok), std::cmp::Reverse(*i))
        }
    };
    let (rule, e) = evals
        .iter()
        .enumerate()
        .max_by_key(|p| key(p))
        .unwrap_or((0, &slot::Eval::EMPTY));
    let limit = set.rules().get(rule).map_or(0, |r| r.limit());
    if allowed {
        Decision::allowed(limit, e.remaining, us(e.reset_after_us), rule, Tier::Local)
    } else {
        Decision::denied(
            limit,
            us(e.reset_after_us),
            us(e.retry_after_us),
            rule,
            Tier::Local,
        )
    }
}
