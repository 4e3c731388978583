//! The local tier: buckets, denial cache, warm-start memory and ledger together.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::one::RefMut;
use smallvec::SmallVec;
use tierlimit_core::{
    Clock, Decision, Error, MAX_RULES, Result, Rule, RuleSet, RuleState, Tier, owed_since_us,
    units_matter_until_us, window_index,
};

use crate::bounded::{BoundedMap, ValueBytes};
use crate::engine::{RuleEngine, Tat, governor_check};
use crate::key::{LocalKey, Probe, SharedSets};
use crate::ledger::reframe;
use crate::slot::{self, Eval, Share, Slot};
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
    /// start full locally), and an ended outage's bucket that would leave
    /// its usage here as a seed is kept instead of pruned.
    pub max_warm_keys: usize,
    /// Most outage-ledger entries; see [`Ledger`].
    pub max_ledger_entries: usize,
    /// Most bytes the local tier's maps may take together (default 256 MiB,
    /// at least 4 MiB): the ledger and the buckets get 5/16 each, the denial
    /// cache, the warm-start map and the rule sets their keys hold (one copy
    /// per distinct set) 1/8 each: room for the largest set there is (16
    /// rules over 64 stripes, about 330 KB) at the least. Each entry is
    /// charged its key's bytes and its slot, so long keys hit this bound
    /// before the entry bounds: a full map refuses new entries as it does at
    /// its entry bound.
    /// What the process really takes stays within about this (the test
    /// `memory_is_bounded_by_bytes` measures it), plus the allocator's own
    /// slack.
    pub max_bytes: usize,
}

/// The smallest [`LocalConfig::max_bytes`].
pub(crate) const MIN_BYTES: usize = 4 << 20;

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
    /// Checks every count bound is at least 1 and `max_bytes` at least
    /// 4 MiB (the largest rule set must fit its share of it).
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

/// A check's time: the injected clock's monotonic time for governor's cells
/// and its wall clock (µs since the epoch) for the windows, which align to it
/// like Redis' do, and for the ledger.
#[derive(Debug, Clone, Copy)]
struct Now {
    mono_ns: u64,
    unix_us: u64,
}

impl Now {
    /// The monotonic clock in µs: the times the tier keeps for itself
    /// (denials, warm seeds, settling).
    fn mono_us(self) -> u64 {
        self.mono_ns / 1_000
    }

    /// When something happened now, for the ledger.
    fn stamp(self) -> Stamp {
        Stamp {
            unix_us: self.unix_us,
            frame_us: self.unix_us.wrapping_sub(self.mono_us()),
        }
    }
}

/// A wall-clock time (µs since the epoch) and the frame it is in: that wall
/// clock's offset from the monotonic clock (wrapping). The ledger judges an
/// entry's expiry in its own frame, so a wall clock stepped since does not
/// age or rejuvenate it (see [`Ledger::drop_expired`]).
#[derive(Debug, Clone, Copy)]
struct Stamp {
    unix_us: u64,
    frame_us: u64,
}

/// One rule's state for one key: a governor cell or this crate's slot,
/// whichever its [`RuleEngine`] decides with.
#[derive(Debug)]
enum State {
    Governor(Tat),
    Own(Slot),
}

/// What one rule of a bucket admitted locally and Redis has not been told of:
/// counted in place, so a check touches one map; moved into the [`Ledger`]
/// (keyed by Redis key) by [`LocalTier::ledger`] and before a key's next
/// Redis call. Units are exact; under a concurrent move the first and last
/// times may be off by that move.
#[derive(Debug)]
struct Owed {
    units: AtomicU64,
    first_us: AtomicU64,
    last_us: AtomicU64,
    /// The window the units belong to (window rules; 0 otherwise).
    window: AtomicU64,
    /// The wall clock the times are on, as its offset from the monotonic
    /// clock (wrapping; the latest units'): see [`Ledger::drop_expired`].
    frame_us: AtomicU64,
}

impl Owed {
    fn new() -> Self {
        Owed {
            units: AtomicU64::new(0),
            first_us: AtomicU64::new(u64::MAX),
            last_us: AtomicU64::new(0),
            window: AtomicU64::new(0),
            frame_us: AtomicU64::new(0),
        }
    }

    /// Counts `units` admitted at `now` under `rule`. Only the holder of
    /// the bucket's exclusive guard counts, so no other thread can count or
    /// take meanwhile and plain stores do: a locked add was a fifth of a
    /// local check's time (perf, `fallback/1000-keys`).
    fn add(&mut self, rule: &Rule, units: u64, now: Stamp) {
        let Stamp {
            unix_us: now_us,
            frame_us,
        } = now;
        let was = std::mem::replace(self.frame_us.get_mut(), frame_us);
        let owed = self.units.get_mut();
        let before = *owed;
        if was != frame_us && before > 0 {
            // The times so far onto the clock as stepped since: one count
            // holds one clock's times.
            for t in [self.first_us.get_mut(), self.last_us.get_mut()] {
                if *t != u64::MAX {
                    *t = reframe(*t, was, frame_us);
                }
            }
        }
        // Saturating like the ledger's: a count that wrapped to 0 would owe
        // nothing, and its bucket would be pruned as clean.
        *owed = owed.saturating_add(units);
        let first = self.first_us.get_mut();
        *first = owed_since_us(rule, *first, before, now_us);
        let last = self.last_us.get_mut();
        *last = (*last).max(now_us);
    }

    /// Takes everything owed: (units, first, last, frame).
    ///
    /// Takers may race (each under a shared guard), never with `add`: only
    /// the one whose swap took the units resets the times, so the times go
    /// with the units. A taker that found none and reset them anyway could
    /// leave the one that took the units with times of 0, a span the ledger
    /// would drop as long expired.
    fn take(&self) -> Option<(u64, u64, u64, u64)> {
        if self.units.load(Ordering::Acquire) == 0 {
            return None;
        }
        let units = self.units.swap(0, Ordering::AcqRel);
        if units == 0 {
            return None;
        }
        let first = self.first_us.swap(u64::MAX, Ordering::Relaxed);
        let last = self.last_us.swap(0, Ordering::Relaxed);
        let first = if first == u64::MAX { last } else { first };
        Some((
            units,
            first,
            last.max(first),
            self.frame_us.load(Ordering::Relaxed),
        ))
    }
}

#[derive(Debug)]
struct RuleCell {
    state: State,
    owed: Owed,
}

/// The engines of one rule set for one instance count, shared by its buckets.
#[derive(Debug)]
struct SetEngine {
    set: RuleSet,
    instances: u64,
    rules: Box<[RuleEngine]>,
    /// One rule, on governor: checked on the fast path.
    lock_free: bool,
}

#[derive(Debug)]
struct Bucket {
    /// What the states were made for; `None` for a key that only owes units
    /// (admitted by FailOpen) and has no bucket yet.
    engine: Option<Arc<SetEngine>>,
    /// The outage the states were last checked in: a later outage goes on
    /// from them until Redis reports on the key (`LocalTier::superseded`).
    outage: u64,
    /// Boxed even for one rule: inline, the map's slots grew from 72 to 160
    /// bytes, and at a million keys that cost more in cache misses than the
    /// pointer hop it saved (fallback/1000000-keys 1.17-1.23 boxed, 1.33-1.51
    /// inline; no difference at 1 and 1,000 keys).
    rules: Box<[RuleCell]>,
}

impl ValueBytes for Bucket {
    fn value_bytes(&self) -> usize {
        self.rules.len() * std::mem::size_of::<RuleCell>()
    }
}

impl Bucket {
    /// The engine, when the states are this outage's and this instance count's
    /// and were written under `set`'s limits.
    fn current(&self, set: &RuleSet, instances: u64, outage: u64) -> Option<&Arc<SetEngine>> {
        self.engine.as_ref().filter(|e| {
            e.instances == instances && self.outage == outage && same_limits(&e.set, set)
        })
    }

    /// Moves the states to `engine` (the same rule set with other limits or
    /// bursts, or for another instance count) keeping what was used: see
    /// [`carry`].
    fn carry_to(&mut self, engine: &Arc<SetEngine>, now: Now) {
        if let Some(old) = self.engine.take() {
            let rules = engine.set.rules();
            for (i, r) in self.rules.iter_mut().enumerate() {
                if let (Some(from), Some(to), Some(rule)) =
                    (old.rules.get(i), engine.rules.get(i), rules.get(i))
                {
                    r.state = carry(from, to, rule, &r.state, now);
                }
            }
        }
        self.engine = Some(engine.clone());
    }

    /// True when every rule is back to full and nothing is owed.
    fn is_idle(&self, now: Now) -> bool {
        let owes = self
            .rules
            .iter()
            .any(|r| r.owed.units.load(Ordering::Acquire) > 0);
        let Some(engine) = &self.engine else {
            return !owes;
        };
        !owes
            && engine
                .set
                .rules()
                .iter()
                .zip(engine.rules.iter())
                .zip(self.rules.iter())
                .all(|((rule, e), r)| match (&r.state, e) {
                    (State::Governor(tat), _) => tat.get() <= now.mono_ns,
                    (State::Own(s), RuleEngine::Own(share)) => {
                        slot::is_idle(rule, *share, *s, now.unix_us)
                    }
                    (State::Own(_), _) => true,
                })
    }
}

/// Checks `cost` against every rule of a bucket it holds exclusively, all or
/// nothing: governor cells a later rule's denial leaves charged are put back,
/// own slots are written only when every rule admits. Fills `evals`.
fn check_exclusive(
    engine: &SetEngine,
    rules: &mut [RuleCell],
    now: Now,
    cost: u64,
    evals: &mut [Eval; MAX_RULES],
) -> bool {
    let mut before = [0u64; MAX_RULES];
    let mut next = [None; MAX_RULES];
    let set_rules = engine.set.rules();
    for (i, (e, r)) in engine.rules.iter().zip(rules.iter_mut()).enumerate() {
        evals[i] = match (e, &mut r.state) {
            (
                RuleEngine::Governor {
                    limiter,
                    t_ns,
                    burst_ns,
                },
                State::Governor(tat),
            ) => {
                before[i] = tat.get();
                governor_check(limiter, *t_ns, *burst_ns, tat, now.mono_ns, cost)
            }
            (RuleEngine::Own(share), State::Own(s)) => {
                let (eval, n) = slot::evaluate(&set_rules[i], *share, *s, now.unix_us, cost);
                next[i] = Some(n);
                eval
            }
            // States are made from their engine; a mismatch cannot admit.
            _ => Eval::EMPTY,
        };
    }
    let n = rules.len();
    let allowed = evals[..n].iter().all(|e| e.ok);
    for (i, r) in rules.iter_mut().enumerate() {
        match &mut r.state {
            State::Governor(tat) if !allowed && evals[i].ok => tat.set(before[i]),
            State::Own(s) if allowed => {
                if let Some(n) = next[i] {
                    *s = n;
                }
            }
            _ => {}
        }
    }
    allowed
}

/// True when `a` and `b`, two sets of one identity, have the same limit and
/// capacity in every rule: state and denials made under one hold for the other.
fn same_limits(a: &RuleSet, b: &RuleSet) -> bool {
    let quota = |r: &Rule| (r.limit(), r.capacity());
    a.id() == b.id() || a.rules().iter().map(quota).eq(b.rules().iter().map(quota))
}

/// The engine cache's key for `set` and `instances`: the identity's hash mixed
/// with every rule's limit and capacity, so sets that differ only there get
/// engines of their own.
fn engine_slot(set: &RuleSet, instances: u64) -> (u64, u64) {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mixed = set.rules().iter().fold(set.identity_hash(), |h, r| {
        let h = (h ^ r.limit()).wrapping_mul(K).rotate_left(29);
        (h ^ r.capacity()).wrapping_mul(K).rotate_left(29)
    });
    (mixed, instances)
}

/// One rule's state written under engine `from`, carried to `to`: the same
/// rule (algorithm, period, offset) with another limit or burst, or another
/// instance count (another share). What this instance used is kept, as the
/// Redis scripts keep what the fleet used:
///
/// - GCRA (governor's cell or this crate's): the units still draining stay,
///   and drain at the new rate. They are counted as `units * period` µs,
///   exact in this crate's slot (its TAT is µs times the share's limit, so
///   `TAT - now` is that already) and rounded up from governor's nanoseconds.
///   More than the new burst is kept too: denied until it has drained.
/// - Windows: the counts stay; the new limit judges them.
fn carry(from: &RuleEngine, to: &RuleEngine, rule: &Rule, state: &State, now: Now) -> State {
    if let State::Own(slot @ Slot::Window { .. }) = state {
        return State::Own(*slot);
    }
    let period_us = u128::from(rule.period_micros().max(1));
    let used = draining(from, rule, state, now);
    match to {
        RuleEngine::Governor { t_ns, .. } if used > 0 => {
            let ahead_ns = (used * u128::from(*t_ns)).div_ceil(period_us);
            let ahead_ns = u64::try_from(ahead_ns).unwrap_or(u64::MAX);
            State::Governor(Tat::new(now.mono_ns.saturating_add(ahead_ns)))
        }
        RuleEngine::Governor { .. } => State::Governor(Tat::new(0)),
        RuleEngine::Own(share) if used > 0 => State::Own(Slot::Tat(
            u128::from(now.unix_us) * u128::from(share.limit) + used,
        )),
        RuleEngine::Own(_) => State::Own(Slot::Tat(0)),
    }
}

/// A GCRA state's units still draining at `now`, times the rule's period in
/// µs (exact for this crate's slot, rounded up from governor's
/// nanoseconds); 0 for a window.
fn draining(engine: &RuleEngine, rule: &Rule, state: &State, now: Now) -> u128 {
    match (engine, state) {
        (RuleEngine::Governor { t_ns, .. }, State::Governor(tat)) => {
            let ahead_ns = u128::from(tat.get().saturating_sub(now.mono_ns));
            (ahead_ns * u128::from(rule.period_micros())).div_ceil(u128::from((*t_ns).max(1)))
        }
        (RuleEngine::Own(share), State::Own(Slot::Tat(stored))) => {
            stored.saturating_sub(u128::from(now.unix_us) * u128::from(share.limit))
        }
        // Windows, and a state not of its engine (states are made from
        // their engine: never).
        _ => 0,
    }
}

/// The units of a rule's share a state holds at `now`: a GCRA state's still
/// draining (rounded up), a window's counted in the current window.
fn in_use(engine: &RuleEngine, rule: &Rule, state: &State, now: Now) -> u64 {
    match state {
        State::Own(slot @ Slot::Window { .. }) => slot::in_window(rule, *slot, now.unix_us),
        _ => {
            let units = draining(engine, rule, state, now)
                .div_ceil(u128::from(rule.period_micros().max(1)));
            u64::try_from(units).unwrap_or(u64::MAX)
        }
    }
}

#[derive(Debug, Clone)]
struct Denial {
    /// When the cache lets the key ask Redis again: a little before
    /// `retry_until_us` (see [`DENIAL_SPREAD`]). Both times are on the
    /// monotonic clock, in µs.
    until_us: u64,
    /// When Redis said a retry could be admitted.
    retry_until_us: u64,
    cost: u64,
    decision: Decision,
    /// The set Redis denied (its shared copy): a set of the same identity
    /// with other limits gets no answer from this denial.
    set: Arc<RuleSet>,
}

impl ValueBytes for Denial {}

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
/// The bit of [`LocalTier`]'s outage word set once a bucket belongs to the
/// current outage.
const DECIDED: u64 = 1;
/// Milliseconds of expiries tracked at once (a ring; an older millisecond's
/// count is taken over by a newer one).
const EXPIRY_RING: usize = 64;
/// Bits of a ring slot holding the count; the millisecond is above them.
const COUNT_BITS: u32 = 20;

#[derive(Debug)]
struct Warm {
    /// When Redis reported, and until when the report matters, on the
    /// monotonic clock (µs): a wall clock stepped forward since made the
    /// report look that much older, and the buckets made from it got the
    /// refill of the step (6 h on a daily rule, a quarter of its limit).
    seen_mono_us: u64,
    expires_mono_us: u64,
    /// The outage the reporting call was sent in: a bucket of an earlier
    /// outage has been written back to Redis and superseded by this report.
    outage: u64,
    /// Per rule, the remaining Redis reported and the rule's capacity then
    /// (a seed for other limits keeps what was used); its length never
    /// changes (a key's identity fixes its rules). Inline for one rule, so
    /// recording a healthy check's report touches no other cache line.
    remaining: SmallVec<[(u64, u64); 1]>,
}

impl ValueBytes for Warm {
    fn value_bytes(&self) -> usize {
        if self.remaining.spilled() {
            self.remaining.capacity() * std::mem::size_of::<(u64, u64)>()
        } else {
            0
        }
    }
}

/// The per-process tier used while Redis cannot be asked, plus the memory it
/// keeps while Redis is healthy (denials, last remaining values).
///
/// Buckets are sized to this instance's share of each rule: `ceil(limit /
/// instances)` (at least 1), so `instances` limiters together admit about the
/// global limit. A rule set is checked all or nothing, as in Redis. Which
/// engine decides each rule is [`Engine::of`](crate::Engine::of): governor for GCRA and token
/// buckets.
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
    buckets: BoundedMap<LocalKey, Bucket>,
    denials: BoundedMap<LocalKey, Denial>,
    warm: BoundedMap<LocalKey, Warm>,
    /// The rule sets the keys of the three maps above hold, one copy each.
    sets: SharedSets,
    /// Engines by (identity and limits hash, instance count), shared by
    /// their buckets: see `engine_slot`.
    engines: DashMap<(u64, u64), Arc<SetEngine>>,
    ledger: Ledger,
    /// Some bucket may owe units the ledger does not hold yet.
    owing: AtomicBool,
    /// Held while the buckets' debts move into the ledger: see
    /// `move_all_owed`.
    moving: Mutex<()>,
    /// True while a move walks the buckets, the mark already taken: see
    /// `claim_pending`.
    walking: AtomicBool,
    /// Wall clock minus monotonic clock, in µs (wrapping); see `stamp_at`.
    unix_offset_us: AtomicU64,
    refused: AtomicU64,
    /// Which outage buckets belong to, doubled, plus [`DECIDED`] once a
    /// bucket was made or carried into it; see [`LocalTier::end_outage`].
    outage: AtomicU64,
    /// The first ended outage whose buckets still bound their keys.
    settle_from: AtomicU64,
    /// Until when (monotonic clock µs: a wall clock stepped forward after a
    /// heal ended the settling at once, and one stepped back held keys to
    /// their buckets that much longer) the buckets of the outages from
    /// `settle_from` to the current one still bound their keys; 0 once that
    /// has passed (or before any outage ended).
    settle_until_us: AtomicU64,
    /// Serializes the writers of the two above.
    settle_lock: Mutex<()>,
    /// How many cached denials expire in each recent millisecond, as
    /// `ms << COUNT_BITS | count`, to tell a crowd from a lone key.
    expiries: [AtomicU64; EXPIRY_RING],
}

fn us(d: u64) -> Duration {
    Duration::from_micros(d)
}

impl LocalTier {
    /// A local tier with the given bounds and clock.
    pub fn new(config: LocalConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        config.validate()?;
        let tier = LocalTier {
            clock,
            buckets: BoundedMap::new(config.max_keys, config.max_bytes / 16 * 5),
            denials: BoundedMap::new(config.max_denials, config.max_bytes / 8),
            warm: BoundedMap::new(config.max_warm_keys, config.max_bytes / 8),
            sets: SharedSets::new(config.max_keys, config.max_bytes / 8),
            engines: DashMap::new(),
            ledger: Ledger::new(config.max_ledger_entries, config.max_bytes / 16 * 5),
            owing: AtomicBool::new(false),
            moving: Mutex::new(()),
            walking: AtomicBool::new(false),
            unix_offset_us: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            outage: AtomicU64::new(0),
            settle_from: AtomicU64::new(0),
            settle_until_us: AtomicU64::new(0),
            settle_lock: Mutex::new(()),
            expiries: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        tier.sync_clocks(tier.now());
        Ok(tier)
    }

    fn mono_ns(&self) -> u64 {
        u64::try_from(self.clock.now().as_nanos()).unwrap_or(u64::MAX)
    }

    fn mono_us(&self) -> u64 {
        self.mono_ns() / 1_000
    }

    fn now(&self) -> Now {
        Now {
            mono_ns: self.mono_ns(),
            unix_us: self.clock.unix_micros(),
        }
    }

    /// The wall clock at `mono_ns`, from the offset between the clocks last
    /// measured (at construction and each prune): for the times the ledger
    /// keeps, without a second clock read on a check's fast path.
    fn stamp_at(&self, mono_ns: u64) -> Stamp {
        let frame_us = self.unix_offset_us.load(Ordering::Relaxed);
        Stamp {
            unix_us: (mono_ns / 1_000).wrapping_add(frame_us),
            frame_us,
        }
    }

    fn sync_clocks(&self, now: Now) {
        let offset = now.unix_us.wrapping_sub(now.mono_us());
        self.unix_offset_us.store(offset, Ordering::Relaxed);
        self.ledger.set_frame(offset);
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

    /// The outage a Redis call sent now is sent in: pass it, with the call's
    /// answer, to [`remember`](Self::remember) and
    /// [`end_outage`](Self::end_outage).
    ///
    /// An outage is every check decided here because Redis could not be
    /// asked or did not answer, from the first until Redis answers a call
    /// sent after it: a breaker that stayed Open for minutes, or one call
    /// that failed while the breaker stayed Closed.
    pub fn outage(&self) -> u64 {
        self.outage.load(Ordering::Relaxed) >> 1
    }

    /// Notes that a bucket now belongs to `outage`, so that an answer to a
    /// call sent in it ends it. Free once noted.
    fn decided_in(&self, outage: u64) {
        self.move_outage(outage << 1, outage << 1 | DECIDED);
    }

    /// Sets the outage word to `to` if it is `from`; a load first, so a
    /// word already moved on costs no locked instruction.
    fn move_outage(&self, from: u64, to: u64) {
        if self.outage.load(Ordering::Relaxed) == from {
            let _ = self
                .outage
                .compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Redis answered a call sent in outage `sent_in` (see
    /// [`outage`](Self::outage)): that outage is over. Free when nothing was
    /// decided in it, or it has ended already.
    ///
    /// A bucket made so far is stale once Redis reports on its key from a
    /// call sent after this (the key's next Redis call carries what the
    /// bucket admitted, so the report counts it): the next outage starts that
    /// key from the report (its warm seed), not from the older bucket. A key
    /// that used its local share in one outage, then Redis for a while, would
    /// otherwise meet the next outage with the leftover of the first, which
    /// with hourly or daily rules admits about twice the limit. Until then
    /// the bucket is the latest word on its key and the next outage goes on
    /// from it: a key Redis was not asked about between two outages would
    /// otherwise get a second share of the same window from the seed of
    /// before the first. Pruned once the outage has settled, such a bucket
    /// leaves what it used as its key's warm seed (when the warm map is full
    /// at [`LocalConfig::max_warm_keys`], the bucket stays instead, until a
    /// later prune finds room or it is back to full).
    ///
    /// For `settle` after that (none when zero), a key's bucket from this
    /// outage or a later one that has ended still bounds it
    /// ([`settling`](Self::settling)): instances return from an outage at
    /// different times (each probes after its own jittered cool-down), and
    /// until the last one has written back what it admitted, Redis
    /// undercounts the key. Without this, the first instance back could take
    /// the key's whole Redis quota on top of what the fleet admitted locally
    /// in the same window. Pass the longest time the other instances may take
    /// to come back (the breaker's longest cool-down plus a deadline) when a
    /// probe ends an outage of the whole fleet; zero when a check's call
    /// answers after another one failed. A settle still running goes on,
    /// over every outage ended since it began: while Redis flaps, with ends
    /// coming faster than `settle`, the first outage's buckets stay and bound
    /// their keys until it stops (they admit less, never more; the map's
    /// bound holds).
    pub fn end_outage(&self, sent_in: u64, settle: Duration) {
        if !settle.is_zero() {
            self.settle(sent_in, settle);
            // Over even when nothing was decided here in it: the buckets the
            // settle makes for keys (see `settling`) are this outage's, not
            // the next one's, or the first would stand for the next and the
            // rest would go to Redis unbounded.
            self.move_outage(sent_in << 1, (sent_in + 1) << 1);
        }
        self.move_outage(sent_in << 1 | DECIDED, (sent_in + 1) << 1);
    }

    /// Bounds keys by their buckets of outage `from` and later ended ones
    /// for `settle` from now, or by those of the settle running now, if it
    /// began with an earlier outage, until the later of the two ends.
    fn settle(&self, from: u64, settle: Duration) {
        let now = self.mono_us();
        let until = now.saturating_add(u64::try_from(settle.as_micros()).unwrap_or(u64::MAX));
        let _writer = self
            .settle_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let running = self.settle_until_us.load(Ordering::Relaxed);
        if running <= now {
            self.settle_from.store(from, Ordering::Relaxed);
        }
        self.settle_until_us
            .store(running.max(until), Ordering::Release);
    }

    /// While outages settle: the first of them (its buckets, and those of
    /// every outage after it but the current one, still bound their keys).
    fn settling_from(&self, now: Now) -> Option<u64> {
        let until = self.settle_until_us.load(Ordering::Acquire);
        (now.mono_us() < until).then(|| self.settle_from.load(Ordering::Relaxed))
    }

    /// While the outages that just ended settle (see [`end_outage`](Self::end_outage)):
    /// charges `cost` to the key's bucket from one of them and answers its
    /// denial when that bucket has no room, so Redis is not asked (the caller
    /// asks Redis when this is `None`). Free otherwise: once the settling time
    /// has passed, it reads no clock until the next outage ends.
    ///
    /// `instances` answers `Some` for a set that falls back to this tier (its
    /// share of that count); it is asked only while a settle runs. A key
    /// without a bucket from those outages then gets one now, started from
    /// its seed: the other instances may have spent their shares of it
    /// locally, and Redis does not count them until they are back and have
    /// written them back, so the first instance back must not take more than
    /// its own share meanwhile. `None` (or a count of 1) asks Redis for such
    /// a key, and so does a map with no room for its bucket (these buckets
    /// count against [`LocalConfig::max_keys`] like any other, until they are
    /// pruned once the settle is over). `rules`, when given, gets each rule's
    /// state on a denial (cleared first), as [`check_rules`](Self::check_rules)
    /// gives it.
    pub fn settling(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        cost: u64,
        instances: impl FnOnce() -> Option<u64>,
        rules: Option<&mut Vec<RuleState>>,
    ) -> Option<Decision> {
        let until = self.settle_until_us.load(Ordering::Acquire);
        if until == 0 {
            return None;
        }
        let mono_ns = self.mono_ns();
        if mono_ns / 1_000 >= until {
            // Settled. Not if another outage ended meanwhile: it set its own.
            let _ = self.settle_until_us.compare_exchange(
                until,
                0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return None;
        }
        let now = Now {
            mono_ns,
            unix_us: self.clock.unix_micros(),
        };
        let from = self.settle_from.load(Ordering::Relaxed);
        let current = self.outage();
        let probe = Probe::new(set, escaped_key);
        let found = self.buckets.get_mut(&probe);
        let settling = found.as_ref().and_then(|b| {
            b.engine
                .clone()
                .filter(|_| (from..current).contains(&b.outage))
        });
        let (mut bucket, engine) = match (found, settling) {
            (Some(mut bucket), Some(written)) => {
                let engine = if same_limits(&written.set, set) {
                    written
                } else {
                    // Limits changed since: charge the same usage by the new ones.
                    let engine = self.engine(set, written.instances);
                    bucket.carry_to(&engine, now);
                    engine
                };
                (bucket, engine)
            }
            // A bucket of the outage under way (calls fail while the breaker
            // stays Closed): Redis is asked, and a failure falls back to it.
            (Some(bucket), None) if bucket.outage >= current => return None,
            (found, _) => {
                drop(found);
                // One instance has no others to leave room for.
                let n = instances().filter(|n| *n > 1)?;
                self.bucket_for(escaped_key, set, self.engine(set, n), now, from)?
            }
        };
        let mut evals = [Eval::EMPTY; MAX_RULES];
        if check_exclusive(&engine, &mut bucket.rules, now, cost, &mut evals) {
            return None;
        }
        drop(bucket);
        let evals = &evals[..set.rules().len()];
        if let Some(rules) = rules {
            rules.clear();
            rules.extend(evals.iter().map(|e| rule_state(e, false, cost)));
        }
        Some(decide(set, evals, false))
    }

    /// The engines of `set` for `instances`, shared by every bucket of theirs.
    fn engine(&self, set: &RuleSet, instances: u64) -> Arc<SetEngine> {
        let make = || {
            let rules: Box<[RuleEngine]> = set
                .rules()
                .iter()
                .map(|r| RuleEngine::new(r, instances))
                .collect();
            let lock_free = matches!(&*rules, [RuleEngine::Governor { .. }]);
            Arc::new(SetEngine {
                set: set.clone(),
                instances,
                rules,
                lock_free,
            })
        };
        let slot = engine_slot(set, instances);
        if let Some(e) = self.engines.get(&slot) {
            if e.set.same_identity(set) && same_limits(&e.set, set) {
                return e.clone();
            }
            // Two identities (or limits) with one hash: the second goes uncached.
            return make();
        }
        self.engines.entry(slot).or_insert_with(make).clone()
    }

    /// Fresh states for a key, from its warm seed when Redis reported one.
    fn fresh_states<'a>(
        &self,
        key: &'a LocalKey,
        engine: &'a SetEngine,
        now: Now,
    ) -> impl Iterator<Item = State> + 'a {
        // The engine's set, not the key's: the key keeps the set that first
        // made it, whose limits may since have changed.
        let set = &engine.set;
        let seeds = self.warm_seeds(key, set, now);
        set.rules()
            .iter()
            .zip(engine.rules.iter())
            .enumerate()
            .map(move |(i, (rule, e))| {
                let seed = seeds.as_ref().map(|(age_us, rem)| (rem[i], *age_us));
                let share = Share::of(rule, engine.instances);
                match e {
                    RuleEngine::Governor { t_ns, .. } => {
                        State::Governor(Tat::new(seed.map_or(0, |(remaining, age_us)| {
                            // Where the cell was when Redis said it, on the
                            // monotonic clock; refill since then accrues.
                            let used = slot::used_at_seed(share, remaining, engine.instances);
                            let age_ns = age_us.saturating_mul(1_000);
                            now.mono_ns
                                .saturating_sub(age_ns)
                                .saturating_add(used.saturating_mul(*t_ns))
                                .max(1)
                        })))
                    }
                    // Windows and the exact GCRA run on the wall clock: the
                    // report as that long before now there.
                    RuleEngine::Own(share) => State::Own(slot::fresh(
                        rule,
                        *share,
                        now.unix_us,
                        seed.map(|(remaining, age_us)| {
                            (remaining, now.unix_us.saturating_sub(age_us))
                        }),
                        engine.instances,
                    )),
                }
            })
    }

    /// Checks `cost` units for `escaped_key` against this instance's share of
    /// every rule of `set`, all or nothing. When `record` is true, what is
    /// admitted is owed to Redis (see [`ledger`](Self::ledger)) for the rules
    /// the set reconciles.
    ///
    /// Key and cost must already be validated (the facade does it first).
    #[inline]
    pub fn check(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        cost: u64,
        instances: u64,
        record: bool,
    ) -> LocalAnswer {
        self.check_into(escaped_key, set, cost, instances, record, None)
    }

    /// As [`check`](Self::check), and when the bucket decides, also each
    /// rule's state, in the set's order, into `rules` (cleared first; left
    /// empty for [`LocalAnswer::Full`]). This instance's share, like the
    /// decision: when admitted, each rule after this request; when denied,
    /// nothing was consumed, so a rule that had room shows it.
    pub fn check_rules(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        cost: u64,
        instances: u64,
        record: bool,
        rules: &mut Vec<RuleState>,
    ) -> LocalAnswer {
        rules.clear();
        self.check_into(escaped_key, set, cost, instances, record, Some(rules))
    }

    fn check_into(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        cost: u64,
        instances: u64,
        record: bool,
        rules: Option<&mut Vec<RuleState>>,
    ) -> LocalAnswer {
        let mono_ns = self.mono_ns();
        let outage = self.outage();
        let probe = Probe::new(set, escaped_key);
        // A known key of a one-rule governor set: governor, under the
        // bucket's exclusive guard, so the cell and what is owed are written
        // with plain stores. A shared guard would cost the same two atomic
        // operations (lock, unlock), and the cell and the count one more
        // each: a locked compare-and-swap and a locked add, together a third
        // of a check's time here (perf, fallback/1000-keys).
        if let Some(mut guard) = self.buckets.get_mut(&probe)
            && let bucket = &mut *guard
            && let Some(engine) = bucket.engine.as_ref().filter(|e| {
                e.instances == instances && bucket.outage == outage && same_limits(&e.set, set)
            })
            && engine.lock_free
            && let (
                [
                    RuleEngine::Governor {
                        limiter,
                        t_ns,
                        burst_ns,
                    },
                ],
                [
                    RuleCell {
                        state: State::Governor(tat),
                        owed,
                    },
                ],
            ) = (&*engine.rules, &mut *bucket.rules)
        {
            let eval = governor_check(limiter, *t_ns, *burst_ns, tat, mono_ns, cost);
            if eval.ok
                && record
                && set.reconciles(0)
                && let Some(rule) = set.rules().first()
            {
                owed.add(rule, cost, self.stamp_at(mono_ns));
                self.mark_owing();
            }
            if let Some(rules) = rules {
                rules.push(rule_state(&eval, eval.ok, cost));
            }
            return LocalAnswer::Decided(decide_one(set, &eval));
        }
        self.check_slow(
            escaped_key,
            set,
            cost,
            instances,
            record,
            rules,
            mono_ns,
            outage,
        )
    }

    /// [`check_into`](Self::check_into) past its fast path: a new key, a
    /// bucket to convert, a set of several rules or of other engines. Out of
    /// line, so the fast path's frame stays small.
    #[inline(never)]
    #[allow(
        clippy::too_many_arguments,
        reason = "check_into's, and its clock reads"
    )]
    fn check_slow(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        cost: u64,
        instances: u64,
        record: bool,
        rules: Option<&mut Vec<RuleState>>,
        mono_ns: u64,
        outage: u64,
    ) -> LocalAnswer {
        let now = Now {
            mono_ns,
            unix_us: self.clock.unix_micros(),
        };
        let Some((mut bucket, engine)) =
            self.bucket_for(escaped_key, set, self.engine(set, instances), now, outage)
        else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("tierlimit_local_keys_refused_total").increment(1);
            return LocalAnswer::Full;
        };
        self.decided_in(outage);
        let mut evals = [Eval::EMPTY; MAX_RULES];
        let allowed = check_exclusive(&engine, &mut bucket.rules, now, cost, &mut evals);
        if allowed && record {
            let (key, b) = bucket.pair_mut();
            self.owe(set, key.key(), &mut b.rules, cost, now.stamp());
        }
        drop(bucket);
        let evals = &evals[..set.rules().len()];
        if let Some(rules) = rules {
            rules.extend(evals.iter().map(|e| rule_state(e, allowed, cost)));
        }
        LocalAnswer::Decided(decide(set, evals, allowed))
    }

    /// The key's bucket, its states made for `engine` in `outage`: new from
    /// the key's seed; or, for a bucket of other limits, another instance
    /// count or another outage, carried over while it is still the latest
    /// word on the key, else started afresh from Redis' report (keeping what
    /// it owes). `None` when the map has no room: then the engine made for
    /// it goes too, or sets built per request, each with limits of their own,
    /// would fill the engine map without bound until the next prune.
    fn bucket_for(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        engine: Arc<SetEngine>,
        now: Now,
        outage: u64,
    ) -> Option<(RefMut<'_, LocalKey, Bucket>, Arc<SetEngine>)> {
        let make = |key: &LocalKey| Bucket {
            rules: self
                .fresh_states(key, &engine, now)
                .map(|state| RuleCell {
                    state,
                    owed: Owed::new(),
                })
                .collect(),
            engine: Some(engine.clone()),
            outage,
        };
        // The warm store is a different map, so reading it while holding this
        // bucket's shard lock cannot deadlock.
        let Some(mut bucket) = self.buckets.entry_of(&self.sets, set, escaped_key, make) else {
            let slot = engine_slot(set, engine.instances);
            drop(engine);
            self.engines
                .remove_if(&slot, |_, e| Arc::strong_count(e) == 1);
            return None;
        };
        if bucket.current(set, engine.instances, outage).is_none() {
            let (key, b) = bucket.pair_mut();
            if b.engine.is_some() && !self.superseded(key, b, now) {
                // Other limits, another instance count or a later outage, but
                // still the latest word on the key: keep what was used.
                b.carry_to(&engine, now);
            } else {
                // Redis reported on the key since the bucket's outage (or the
                // key only owed units): fresh states from the report, same debts.
                for (r, state) in b.rules.iter_mut().zip(self.fresh_states(key, &engine, now)) {
                    r.state = state;
                }
                b.engine = Some(engine.clone());
            }
            b.outage = outage;
        }
        Some((bucket, engine))
    }

    /// True when Redis reported on the bucket's key after the bucket's outage
    /// ended: the report counts what the bucket admitted (the key's next
    /// Redis call carries it, see [`claim_pending`](Self::claim_pending)), so
    /// it, not the bucket, is the key's latest word. Until then a later
    /// outage goes on from the bucket: started afresh from the seed of before
    /// the first outage, the key would get a second share of the same window.
    ///
    /// Nor while the bucket's outage settles: a report then does not count
    /// what the instances still on their way back admitted, so the bucket
    /// stays the key's bound, in a next outage too. Started from that report,
    /// an instance that Redis failed again soon after it came back got a
    /// second share of what the others had already spent.
    fn superseded(&self, key: &LocalKey, bucket: &Bucket, now: Now) -> bool {
        if self
            .settling_from(now)
            .is_some_and(|from| bucket.outage >= from)
        {
            return false;
        }
        self.warm.get(key).is_some_and(|w| w.outage > bucket.outage)
    }

    /// Keeps what a bucket Redis has not reported on since its outage used as
    /// its key's warm seed, as if Redis had reported it: the whole rule's
    /// remaining that leaves each instance this one's share minus what it
    /// used. So the bucket's memory can go while the next outage still starts
    /// the key where this one left it. (A sliding window keeps its whole
    /// estimate, the window before weighted as of now, as used in the
    /// current window: a seed only ever overstates what was used.)
    /// False when the warm map is full: then the bucket must stay, or what
    /// it used would be lost.
    fn keep_as_seed(&self, key: &LocalKey, bucket: &Bucket, now: Now) -> bool {
        let Some(engine) = &bucket.engine else {
            return true;
        };
        let states = engine.rules.iter().zip(bucket.rules.iter());
        let seeds = engine.set.rules().iter().zip(states).map(|(rule, (e, r))| {
            let share = Share::of(rule, engine.instances);
            let left = share.capacity - in_use(e, rule, &r.state, now).min(share.capacity);
            let remaining = left.saturating_mul(engine.instances).min(rule.capacity());
            // As long as what was used can matter: a period was short of a
            // burst above the limit's refill, and of a sliding window's
            // next window, and the next outage then started the key full.
            let lasts_us = units_matter_until_us(rule, now.unix_us).saturating_sub(now.unix_us);
            (remaining, rule.capacity(), lasts_us)
        });
        // Not a report after the bucket's outage: it supersedes no bucket.
        self.store_seed(key.set(), key.key(), now.mono_us(), bucket.outage, seeds)
    }

    /// Stores `escaped_key`'s warm seed as of `now_mono_us`: per rule of `set`,
    /// the remaining units, the capacity they count against, and how long
    /// they matter (the seed lasts the longest). `outage` is the outage count
    /// it was taken at (see [`superseded`](Self::superseded)). False when
    /// the warm map is full.
    fn store_seed(
        &self,
        set: &RuleSet,
        escaped_key: &str,
        now_mono_us: u64,
        outage: u64,
        seeds: impl Iterator<Item = (u64, u64, u64)>,
    ) -> bool {
        let Some(mut w) = self.warm.entry_of(&self.sets, set, escaped_key, |_| Warm {
            seen_mono_us: 0,
            expires_mono_us: 0,
            outage: 0,
            remaining: smallvec::smallvec![(0, 0); set.rules().len()],
        }) else {
            return false;
        };
        if w.outage > outage {
            // A report from a call sent before the one already stored (it
            // answered late): older news, and it must not take back that
            // one's standing over the buckets of the outages between.
            return true;
        }
        let mut longest = 0u64;
        for (slot, (remaining, capacity, lasts_us)) in w.remaining.iter_mut().zip(seeds) {
            *slot = (remaining, capacity);
            longest = longest.max(lasts_us);
        }
        w.seen_mono_us = now_mono_us;
        w.expires_mono_us = now_mono_us.saturating_add(longest);
        w.outage = outage;
        true
    }

    fn mark_owing(&self) {
        if !self.owing.load(Ordering::Relaxed) {
            self.owing.store(true, Ordering::SeqCst);
        }
    }

    /// Adds `cost` to what each rule of `set` it reconciles owes for
    /// `escaped_key`'s bucket, moving what a window rule owed for an earlier
    /// window to the ledger first (a bucket owes for one window at a time).
    ///
    /// `set` is the one checked, not the set the bucket's key was made with:
    /// both share the storage keys, but the limits may have changed since, and
    /// the ledger writes back under the latest.
    fn owe(&self, set: &RuleSet, escaped_key: &str, rules: &mut [RuleCell], cost: u64, now: Stamp) {
        for (i, (rule, r)) in set.rules().iter().zip(rules).enumerate() {
            if !set.reconciles(i) {
                continue;
            }
            let window = window_index(rule, now.unix_us);
            if r.owed.window.load(Ordering::Relaxed) != window {
                self.move_owed(set, escaped_key, i, &r.owed);
                r.owed.window.store(window, Ordering::Relaxed);
            }
            r.owed.add(rule, cost, now);
        }
        self.mark_owing();
    }

    fn move_owed(&self, set: &RuleSet, escaped_key: &str, rule: usize, owed: &Owed) {
        if let (Some((units, first, last, frame_us)), Some(r)) =
            (owed.take(), set.rules().get(rule))
        {
            self.ledger.record_in_frame(
                frame_us,
                set.storage_key(escaped_key, rule),
                r,
                set.stripes(),
                units,
                (first, last),
            );
        }
    }

    /// Moves what every bucket owes into the ledger, under the limits its
    /// states were last checked with.
    ///
    /// A caller waits for a move under way: finding the mark already taken,
    /// it went on at once to a ledger the mover had not finished, and a
    /// reload's retarget of it was then overwritten, entry by entry, with the
    /// old rules of the buckets the mover reached after (a raised limit's
    /// write-back capped at the old one, and the rest lost).
    fn move_all_owed(&self) {
        let _moving = self.moving.lock().unwrap_or_else(PoisonError::into_inner);
        self.walking.store(true, Ordering::SeqCst);
        if self.owing.swap(false, Ordering::SeqCst) {
            self.buckets.for_each(|key, bucket| {
                let set = bucket.engine.as_ref().map_or(key.set(), |e| &e.set);
                for (i, r) in bucket.rules.iter().enumerate() {
                    self.move_owed(set, key.key(), i, &r.owed);
                }
            });
        }
        self.walking.store(false, Ordering::SeqCst);
    }

    /// Claims what `escaped_key` still owes Redis under `set`'s rules, so the
    /// key's next Redis call can carry it; empty (and free) when nothing is owed.
    pub fn claim_pending(&self, escaped_key: &str, set: &RuleSet) -> Vec<Claim> {
        // Nothing owed anywhere: not while a move walks the buckets, which
        // took the mark before it reached this key's and the ledger may be
        // empty still (the key's call went out without its units). In this
        // order: a mark found taken was taken by a walk still flagged, or
        // by one that ended and filled the ledger.
        if !self.owing.load(Ordering::SeqCst)
            && !self.walking.load(Ordering::SeqCst)
            && self.ledger.is_empty()
        {
            return Vec::new();
        }
        let probe = Probe::new(set, escaped_key);
        if let Some(bucket) = self.buckets.get(&probe) {
            for (i, r) in bucket.rules.iter().enumerate() {
                self.move_owed(set, escaped_key, i, &r.owed);
            }
        }
        if self.ledger.is_empty() {
            return Vec::new();
        }
        // The claims' times go out on the wall clock as measured now (see
        // `Ledger::claim`): the write-back tells Redis this clock's now.
        let now = self.now();
        self.sync_clocks(now);
        let now = now.unix_us;
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

    /// Records `cost` units admitted without a bucket (FailOpen) for
    /// `escaped_key`: owed to Redis for every rule the set reconciles, like a
    /// local admission.
    pub fn record(&self, escaped_key: &str, set: &RuleSet, cost: u64) {
        let now = self.stamp_at(self.mono_ns());
        let probe = Probe::new(set, escaped_key);
        if let Some(mut bucket) = self.buckets.get_mut(&probe) {
            self.owe(set, escaped_key, &mut bucket.rules, cost, now);
            return;
        }
        let outage = self.outage();
        self.decided_in(outage);
        let bucket = self
            .buckets
            .entry_of(&self.sets, set, escaped_key, |_| Bucket {
                engine: None,
                outage,
                rules: set
                    .rules()
                    .iter()
                    .map(|_| RuleCell {
                        state: State::Own(Slot::Tat(0)),
                        owed: Owed::new(),
                    })
                    .collect(),
            });
        match bucket {
            Some(mut bucket) => self.owe(set, escaped_key, &mut bucket.rules, cost, now),
            // No room for the key: straight to the ledger, which counts what
            // it cannot hold.
            None => {
                for (i, rule) in set.rules().iter().enumerate() {
                    if set.reconciles(i) {
                        self.ledger.record_in_frame(
                            now.frame_us,
                            set.storage_key(escaped_key, i),
                            rule,
                            set.stripes(),
                            cost,
                            (now.unix_us, now.unix_us),
                        );
                    }
                }
            }
        }
    }

    /// How long ago (µs, on the monotonic clock) Redis last reported on
    /// `key`, and the remaining it reported for each rule of `set`:
    /// reported under other limits or bursts, what was used then is kept
    /// (`capacity - used`, at least 0).
    fn warm_seeds(&self, key: &LocalKey, set: &RuleSet, now: Now) -> Option<(u64, Vec<u64>)> {
        let w = self.warm.get(key)?;
        let rules = set.rules();
        let now_mono_us = now.mono_us();
        (w.expires_mono_us > now_mono_us && w.remaining.len() == rules.len()).then(|| {
            let remaining = w
                .remaining
                .iter()
                .zip(rules)
                .map(|(&(remaining, then), rule)| {
                    let used = then.saturating_sub(remaining);
                    rule.capacity().saturating_sub(used)
                })
                .collect();
            (now_mono_us.saturating_sub(w.seen_mono_us), remaining)
        })
    }

    /// Remembers what Redis last reported for a key (per rule: remaining units and
    /// time until full), so a bucket created during an outage starts from there,
    /// scaled to the share, instead of from full. Kept until the last rule would be
    /// full again, bounded by [`LocalConfig::max_warm_keys`].
    ///
    /// `sent_in` is the [`outage`](Self::outage) the reporting call was sent
    /// in: the report supersedes the key's bucket of an earlier outage only.
    pub fn remember(
        &self,
        escaped_key: &str,
        set: &RuleSet,
        rules: impl Iterator<Item = (u64, Duration)>,
        sent_in: u64,
    ) {
        let seeds = set.rules().iter().zip(rules).map(|(rule, (r, reset))| {
            let reset_us = u64::try_from(reset.as_micros()).unwrap_or(u64::MAX);
            (r, rule.capacity(), reset_us)
        });
        self.store_seed(set, escaped_key, self.mono_us(), sent_in, seeds);
    }

    /// Caches a Redis denial: until its retry-after passes, a request for the same
    /// key with at least the same cost is denied locally (tier
    /// [`Tier::DenyCache`]) without a Redis round trip. Only under the same
    /// limits and bursts: a set of the same identity with other limits (a
    /// raised limit, say) asks Redis.
    pub fn cache_denial(&self, escaped_key: &str, set: &RuleSet, cost: u64, decision: &Decision) {
        let Some(retry) = decision.retry_after else {
            return;
        };
        // On the monotonic clock: a retry-after is a span, and a wall clock
        // stepped back would keep the key off Redis (and tell its clients to
        // wait) that much longer.
        let now = self.mono_us();
        let retry_us = u64::try_from(retry.as_micros()).unwrap_or(u64::MAX);
        let retry_until_us = now.saturating_add(retry_us);
        let spread = |denial: &mut Denial| {
            let early = (retry_us as f64 * DENIAL_SPREAD * fastrand::f64()) as u64;
            denial.until_us = retry_until_us - early.min(retry_us);
        };
        let Some(shared) = self.sets.share(set) else {
            return;
        };
        let mut denial = Denial {
            until_us: retry_until_us,
            retry_until_us,
            cost,
            decision: *decision,
            set: shared,
        };
        let mut fresh = false;
        let Some(mut d) = self.denials.entry_of(&self.sets, set, escaped_key, |_| {
            fresh = true;
            denial.clone()
        }) else {
            return;
        };
        if fresh || !same_limits(&d.set, set) {
            // One cached under other limits says nothing about these: replaced.
            if !fresh {
                *d = denial;
            }
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
    #[inline]
    pub fn cached_denial(&self, escaped_key: &str, set: &RuleSet, cost: u64) -> Option<Decision> {
        // Inlined into the facade: with no denial cached (every outage-only
        // workload), one load and no call.
        if self.denials.len() == 0 {
            return None;
        }
        self.cached_denial_of(escaped_key, set, cost)
    }

    #[inline(never)]
    fn cached_denial_of(&self, escaped_key: &str, set: &RuleSet, cost: u64) -> Option<Decision> {
        let now = self.mono_us();
        let probe = Probe::new(set, escaped_key);
        let (until_us, retry_until_us, d_cost, mut decision) = {
            let d = self.denials.get(&probe)?;
            if !same_limits(&d.set, set) {
                return None;
            }
            (d.until_us, d.retry_until_us, d.cost, d.decision)
        };
        if until_us <= now {
            // Kept until the retry-after itself, so a re-denial is not spread again.
            self.denials.remove_if(&probe, |d| d.retry_until_us <= now);
            return None;
        }
        if cost < d_cost {
            return None;
        }
        metrics::counter!("tierlimit_deny_cache_hits_total").increment(1);
        // Both times count down from when Redis denied.
        let retry_us = retry_until_us - now;
        let since = decision
            .retry_after
            .map_or(Duration::ZERO, |r| r.saturating_sub(us(retry_us)));
        decision.tier = Tier::DenyCache;
        decision.retry_after = Some(us(retry_us));
        decision.reset_after = decision.reset_after.saturating_sub(since);
        Some(decision)
    }

    /// Forgets what no longer matters: buckets back to full or of an ended
    /// outage that has settled (once what they owe is in the ledger; one
    /// Redis has not reported on since leaves what it used as its key's warm
    /// seed, see [`end_outage`](Self::end_outage)), expired denials and
    /// warm-start values, engines no bucket uses; returns memory to the
    /// allocator.
    pub fn prune(&self) {
        self.move_all_owed();
        let now = self.now();
        self.sync_clocks(now);
        // Kept: buckets of this outage and of the ones still settling.
        let outage = self.outage();
        let kept_from = self.settling_from(now).unwrap_or(outage);
        self.buckets.retain(|key, b| {
            let owes = b
                .rules
                .iter()
                .any(|r| r.owed.units.load(Ordering::Acquire) > 0);
            if owes {
                return true;
            }
            if b.is_idle(now) {
                return false;
            }
            if b.outage >= kept_from {
                return true;
            }
            // A bucket whose seed finds no room in the warm map stays until
            // a later prune finds room or it is idle.
            !(self.superseded(key, b, now) || self.keep_as_seed(key, b, now))
        });
        self.denials.retain(|_, d| d.retry_until_us > now.mono_us());
        self.warm.retain(|_, w| w.expires_mono_us > now.mono_us());
        self.engines.retain(|_, e| Arc::strong_count(e) > 1);
        self.sets.prune();
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
        self.buckets.bytes()
            + self.denials.bytes()
            + self.warm.bytes()
            + self.sets.bytes()
            + self.ledger.bytes()
    }

    /// Number of keys whose last Redis-reported state is kept for warm starts.
    pub fn warm_count(&self) -> usize {
        self.warm.len()
    }

    /// Checks refused because the bucket map was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Drops from the [`ledger`](Self::ledger) what can no longer change any
    /// decision, judged now, and returns how many units that was (see
    /// [`Ledger::drop_expired`]). Measures the wall clock against the
    /// monotonic one first: a wall clock stepped since the last prune put
    /// `now` in another frame than the ledger's, and units just recorded on
    /// the stepped clock were judged that far older.
    pub fn drop_expired(&self) -> u64 {
        let ledger = self.ledger();
        let now = self.now();
        self.sync_clocks(now);
        ledger.drop_expired(now.unix_us)
    }

    /// Claims up to `n` entries of the ledger for a write-back (see
    /// [`Ledger::claim`], `hold_now_us` on its clock), their times on the
    /// wall clock as measured now: the write-back tells Redis this clock's
    /// now, so a clock stepped since the last measure must not move them.
    pub fn claim(&self, n: usize, hold_now_us: u64) -> Vec<Claim> {
        let ledger = self.ledger();
        self.sync_clocks(self.now());
        ledger.claim(n, hold_now_us)
    }

    /// The outage ledger, holding everything admitted locally that Redis has
    /// not counted yet. Buckets count what they admit in place (a check
    /// touches one map); this moves those counts into the ledger first, so
    /// call it for the ledger, not in a hot loop.
    pub fn ledger(&self) -> &Ledger {
        self.move_all_owed();
        &self.ledger
    }
}

/// One rule's state for [`LocalTier::check_rules`]: when the set was denied,
/// nothing was consumed, so a rule that had room gets this request back.
fn rule_state(e: &Eval, allowed: bool, cost: u64) -> RuleState {
    let remaining = if !allowed && e.ok {
        e.remaining.saturating_add(cost)
    } else {
        e.remaining
    };
    RuleState::new(remaining, us(e.reset_after_us))
}

/// [`decide`] for a one-rule set, without choosing among rules.
fn decide_one(set: &RuleSet, e: &Eval) -> Decision {
    let limit = set.rules().first().map_or(0, Rule::limit);
    if e.ok {
        Decision::allowed(limit, e.remaining, us(e.reset_after_us), 0, Tier::Local)
    } else {
        Decision::denied(
            limit,
            us(e.reset_after_us),
            us(e.retry_after_us),
            0,
            Tier::Local,
        )
    }
}

/// The deciding rule: when admitted the one with the fewest remaining, when
/// denied the denying one with the longest wait. `limit` is the rule's global
/// limit (what a client was promised), `remaining` this instance's.
fn decide(set: &RuleSet, evals: &[Eval], allowed: bool) -> Decision {
    let key = |(i, e): &(usize, &Eval)| {
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
        .unwrap_or((0, &Eval::EMPTY));
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
