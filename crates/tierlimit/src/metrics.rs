//! The limiter's metrics: names, help texts and units in one place, and the
//! `limiter` label every per-limiter series carries.
//!
//! Two limiters in one process (two groups, or a test's three instances)
//! would otherwise overwrite each other's gauges. Labels are bounded: the
//! limiter's name, the rule set's name (names are few and chosen by the
//! programmer, never by a client), the tier, the outcome. Never a key.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::{
    Counter, Histogram, SharedString, Unit, counter, describe_counter, describe_gauge,
    describe_histogram,
};
use tierlimit_core::{RuleSet, Tier};

use crate::breaker::BreakerState;

pub(crate) const DECISIONS: &str = "tierlimit_decisions_total";
pub(crate) const REDIS_CALL: &str = "tierlimit_redis_call_seconds";
pub(crate) const BREAKER_STATE: &str = "tierlimit_breaker_state";
pub(crate) const BREAKER_TRANSITIONS: &str = "tierlimit_breaker_transitions_total";
pub(crate) const PROBES: &str = "tierlimit_probes_total";
pub(crate) const CONNECTIONS_REPLACED: &str = "tierlimit_connections_replaced_total";
pub(crate) const INSTANCES: &str = "tierlimit_instances";
pub(crate) const LOCAL_KEYS: &str = "tierlimit_local_keys";
pub(crate) const DENIAL_CACHE: &str = "tierlimit_deny_cache_entries";
pub(crate) const WARM_KEYS: &str = "tierlimit_warm_keys";
pub(crate) const LEDGER_ENTRIES: &str = "tierlimit_ledger_entries";
pub(crate) const LEDGER_UNITS: &str = "tierlimit_ledger_units";
pub(crate) const LEDGER_OLDEST: &str = "tierlimit_ledger_oldest_seconds";
pub(crate) const RECONCILED_UNITS: &str = "tierlimit_reconciled_units_total";
pub(crate) const BATCHES_RETRIED: &str = "tierlimit_reconcile_batches_retried_total";
pub(crate) const PARKED: &str = "tierlimit_reconcile_parked_total";
pub(crate) const RELOADS: &str = "tierlimit_config_reloads_total";
// Counted by the local tier itself (no limiter label: counters add up), but
// the ledger's units lost with a limiter (`reason="dropped"`), which the
// limiter counts, under its label.
const LOCAL_REFUSED: &str = "tierlimit_local_keys_refused_total";
const DENY_CACHE_HITS: &str = "tierlimit_deny_cache_hits_total";
const LEDGER_DROPPED: &str = "tierlimit_ledger_dropped_units_total";

/// Every metric the limiter emits: name, unit, help. The crate docs' table and
/// this list are checked against each other by a test.
pub(crate) const ALL: &[(&str, Unit, &str)] = &[
    (
        DECISIONS,
        Unit::Count,
        "Checks answered, by limiter, rule set, tier (redis, local, deny_cache, fail_open, fail_closed) and outcome (allowed, denied).",
    ),
    (
        REDIS_CALL,
        Unit::Seconds,
        "Duration of each check's call to Redis, failures and timeouts included.",
    ),
    (
        BREAKER_STATE,
        Unit::Count,
        "Circuit breaker state: 0 closed, 1 open, 2 half-open.",
    ),
    (
        BREAKER_TRANSITIONS,
        Unit::Count,
        "Circuit breaker transitions, by from and to state.",
    ),
    (
        PROBES,
        Unit::Count,
        "Background probes of Redis while the breaker is open, by result (succeeded, failed).",
    ),
    (
        CONNECTIONS_REPLACED,
        Unit::Count,
        "Redis connections replaced after consecutive timeouts (a hung socket).",
    ),
    (
        INSTANCES,
        Unit::Count,
        "Instance count local shares are sized for (0 while unknown).",
    ),
    (LOCAL_KEYS, Unit::Count, "Local fallback buckets held."),
    (DENIAL_CACHE, Unit::Count, "Redis denials cached locally."),
    (
        WARM_KEYS,
        Unit::Count,
        "Keys whose last Redis-reported state is kept for warm local starts.",
    ),
    (
        LEDGER_ENTRIES,
        Unit::Count,
        "Outage-ledger entries waiting to be written back to Redis.",
    ),
    (
        LEDGER_UNITS,
        Unit::Count,
        "Units admitted without Redis, waiting to be written back.",
    ),
    (
        LEDGER_OLDEST,
        Unit::Seconds,
        "Age of the oldest unit waiting in the outage ledger (drain lag).",
    ),
    (
        RECONCILED_UNITS,
        Unit::Count,
        "Units written back to Redis and acknowledged.",
    ),
    (
        BATCHES_RETRIED,
        Unit::Count,
        "Reconcile batches re-sent after a failure (same batch id, applied once).",
    ),
    (
        PARKED,
        Unit::Count,
        "Ledger entries Redis refused on their own (e.g. WRONGTYPE), set aside so the others drain.",
    ),
    (
        RELOADS,
        Unit::Count,
        "Reloads of the rule sets (from a config file or in code), by result (applied, rejected: the sets in force were kept).",
    ),
    (
        LOCAL_REFUSED,
        Unit::Count,
        "Local fallback checks refused because the bucket map was full.",
    ),
    (
        DENY_CACHE_HITS,
        Unit::Count,
        "Checks denied from the local denial cache without a Redis call.",
    ),
    (
        LEDGER_DROPPED,
        Unit::Count,
        "Units dropped from the outage ledger, by reason (expired, overflow, dropped with the limiter).",
    ),
];

/// Registers every metric's help text and unit with the installed recorder.
/// Called by every `build()`: describing again is harmless, and a recorder
/// installed after the first limiter still learns them from the next.
pub(crate) fn describe() {
    for &(name, unit, help) in ALL {
        if name == REDIS_CALL {
            describe_histogram!(name, unit, help);
        } else if name.ends_with("_total") {
            describe_counter!(name, unit, help);
        } else {
            describe_gauge!(name, unit, help);
        }
    }
}

/// Sets every counter series a limiter may create later to 0 (the labelled
/// ones for `labels`' limiter), so an exporter lists every metric from the
/// first scrape, and `rate()` and alerts see a 0 rather than a missing
/// series until the first event. Called by every `build()`; decision
/// counters appear with their first check.
pub(crate) fn zero_series(labels: &Labels) {
    let l = &labels.limiter;
    for name in [
        CONNECTIONS_REPLACED,
        RECONCILED_UNITS,
        BATCHES_RETRIED,
        PARKED,
    ] {
        counter!(name, "limiter" => l.clone()).increment(0);
    }
    for result in ["succeeded", "failed"] {
        counter!(PROBES, "limiter" => l.clone(), "result" => result).increment(0);
    }
    for result in ["applied", "rejected"] {
        counter!(RELOADS, "limiter" => l.clone(), "result" => result).increment(0);
    }
    counter!(LOCAL_REFUSED).increment(0);
    counter!(DENY_CACHE_HITS).increment(0);
    for reason in ["expired", "overflow"] {
        counter!(LEDGER_DROPPED, "reason" => reason).increment(0);
    }
    counter!(LEDGER_DROPPED, "limiter" => l.clone(), "reason" => "dropped").increment(0);
}

/// The `limiter` label of one limiter's series.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    limiter: SharedString,
    /// Unique per limiter (clones share it): half of a decision cache key.
    id: u64,
    /// Taken at the first Redis call, as the decision counters are.
    redis_call: Arc<OnceLock<Histogram>>,
}

const TIERS: [Tier; 5] = [
    Tier::Redis,
    Tier::Local,
    Tier::DenyCache,
    Tier::FailOpen,
    Tier::FailClosed,
];

/// One rule set's decision counters for one limiter: per tier, allowed and denied.
#[derive(Debug)]
struct DecisionCounters {
    limiter: u64,
    set: u64,
    counters: [[Counter; 2]; TIERS.len()],
}

/// Per-thread slots of recently used decision counters, indexed by rule set
/// id: a check finds its counter without building labels or asking the
/// recorder (which allocates and hashes the labels every time). A slot holds
/// one (limiter, set) at a time; another one taking it costs one rebuild.
const CACHED_SETS: usize = 64;

thread_local! {
    static DECISION_COUNTERS: RefCell<[Option<Box<DecisionCounters>>; CACHED_SETS]> =
        const { RefCell::new([const { None }; CACHED_SETS]) };
}

impl Labels {
    pub(crate) fn new(name: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Labels {
            limiter: SharedString::from(Arc::<str>::from(name)),
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            redis_call: Arc::default(),
        }
    }

    fn decision_counters(&self, set: &RuleSet) -> DecisionCounters {
        let name = SharedString::from(Arc::<str>::from(set.name()));
        DecisionCounters {
            limiter: self.id,
            set: set.id(),
            counters: TIERS.map(|tier| {
                ["allowed", "denied"].map(|outcome| {
                    counter!(
                        DECISIONS,
                        "limiter" => self.limiter.clone(),
                        "set" => name.clone(),
                        "tier" => tier.as_str(),
                        "outcome" => outcome
                    )
                })
            }),
        }
    }

    /// Counts a decision by `tier` that admitted or not. Takes the two
    /// fields, not the decision: a check's decision then never has its
    /// address taken on the way to its caller, so it is built where it is
    /// returned instead of being copied there.
    pub(crate) fn decision(&self, set: &RuleSet, tier: Tier, allowed: bool) {
        let outcome = usize::from(!allowed);
        let Some(index) = TIERS.iter().position(|t| *t == tier) else {
            counter!(
                DECISIONS,
                "limiter" => self.limiter.clone(),
                "set" => set.name().to_owned(),
                "tier" => tier.as_str(),
                "outcome" => ["allowed", "denied"][outcome]
            )
            .increment(1);
            return;
        };
        let slot = (set.id() % CACHED_SETS as u64) as usize;
        DECISION_COUNTERS.with(|cache| {
            let mut cache = cache.borrow_mut();
            let cached = &mut cache[slot];
            match cached {
                Some(c) if c.limiter == self.id && c.set == set.id() => {}
                _ => *cached = Some(Box::new(self.decision_counters(set))),
            }
            if let Some(c) = cached {
                c.counters[index][outcome].increment(1);
            }
        });
    }

    pub(crate) fn redis_call(&self, seconds: f64) {
        self.redis_call
            .get_or_init(|| metrics::histogram!(REDIS_CALL, "limiter" => self.limiter.clone()))
            .record(seconds);
    }

    pub(crate) fn breaker_state(&self, state: BreakerState) {
        metrics::gauge!(BREAKER_STATE, "limiter" => self.limiter.clone()).set(state.gauge_value());
    }

    pub(crate) fn transition(&self, from: BreakerState, to: BreakerState) {
        counter!(
            BREAKER_TRANSITIONS,
            "limiter" => self.limiter.clone(),
            "from" => from.as_str(),
            "to" => to.as_str()
        )
        .increment(1);
    }

    pub(crate) fn probe(&self, succeeded: bool) {
        let result = if succeeded { "succeeded" } else { "failed" };
        counter!(PROBES, "limiter" => self.limiter.clone(), "result" => result).increment(1);
    }

    pub(crate) fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "rejected" };
        counter!(RELOADS, "limiter" => self.limiter.clone(), "result" => result).increment(1);
    }

    /// Units owed to Redis that were lost with the limiter (dropped without
    /// shutdown, or shutdown timed out).
    pub(crate) fn ledger_lost(&self, units: u64) {
        counter!(LEDGER_DROPPED, "limiter" => self.limiter.clone(), "reason" => "dropped")
            .increment(units);
    }

    pub(crate) fn connection_replaced(&self) {
        counter!(CONNECTIONS_REPLACED, "limiter" => self.limiter.clone()).increment(1);
    }

    #[allow(
        dead_code,
        reason = "the reconciler's counters move here with its rework"
    )]
    pub(crate) fn counter(&self, name: &'static str, n: u64) {
        counter!(name, "limiter" => self.limiter.clone()).increment(n);
    }

    pub(crate) fn gauge(&self, name: &'static str, value: f64) {
        metrics::gauge!(name, "limiter" => self.limiter.clone()).set(value);
    }
}
