//! The hybrid limiter: Redis while it is healthy, the policy's answer while not.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tierlimit_core::{
    Clock, Decision, Error, Policy, Result, Rule, RuleSet, RuleState, SystemClock, Tier,
};
use tierlimit_local::{LocalAnswer, LocalConfig, LocalTier};
use tierlimit_redis::{CheckKey, RedisTier, RedisTierConfig, TimeSource, Unheard, redact_url};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::breaker::{Breaker, BreakerConfig, BreakerState, FailureOutcome};
use crate::instances::InstanceCount;
use crate::metrics::{self, Labels};
use crate::named::{NamedSets, ReloadReport};
use crate::reconcile::{self, ReconcileConfig, ReconcileStats, Reconciler};
use crate::tasks;
use crate::view::{BreakerView, LocalView};

/// The shortest heartbeat interval: a beat is a script call on Redis.
pub(crate) const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
/// The shortest pruning interval.
pub(crate) const MIN_PRUNE: Duration = Duration::from_millis(1);
/// The longest interval of a periodic task: a longer one would leave the
/// instance count or the local maps stale for longer than any useful window.
pub(crate) const MAX_PERIODIC: Duration = Duration::from_secs(60 * 60);
/// The longest instance TTL: an instance gone for a day no longer shares any
/// limit worth keeping its share small for.
pub(crate) const MAX_INSTANCE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

pub(crate) fn in_range(field: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(Error::InvalidConfig {
            what: format!("{field} must be {min:?} to {max:?} (got {value:?})"),
        });
    }
    Ok(())
}

/// How many limiter instances share the global limit.
///
/// Local shares are `ceil(limit / instances)`. A learned count is the largest
/// the heartbeat reported within [`instance_ttl`](HybridLimiterBuilder::instance_ttl),
/// so it never falls faster than instances can really leave (Redis that comes
/// back empty reports 1, then 2, before every instance has beaten again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Instances {
    /// A fixed count, from configuration. Such an instance writes no
    /// heartbeat, so `Learned` instances of the same group do not count it:
    /// a deploy that moves a fleet from one mode to the other (or to another
    /// group) should keep the count fixed, at the larger fleet's size, until
    /// every instance runs the new mode, or the first new instances learn a
    /// count too small and take too large a share in an outage meanwhile.
    Fixed(u64),
    /// Learned from a heartbeat set in Redis while it is healthy.
    ///
    /// The count is learned once a heartbeat answers at least one
    /// [interval](HybridLimiterBuilder::heartbeat_every), or the breaker's
    /// longest cool-down plus the deadline if that is longer (5.05 s by
    /// default), after the first: every instance started with this one has
    /// beaten by then, even when Redis was down at their start and each beat
    /// only after its own probe (in a fleet started together the first to
    /// beat hears 1). Until then `assume` is used, raised to a larger count
    /// heard. With `assume: None` (the default) the count is unknown and
    /// [`Policy::LocalFallback`] does not guess it: its rule sets are answered
    /// by the [overflow policy](HybridLimiterBuilder::overflow_policy)
    /// (fail-closed by default) until the count is learned, because assuming
    /// one instance would hand every new instance of a rolling deploy the
    /// whole limit.
    Learned {
        /// The count assumed until one is learned; `None`: unknown.
        assume: Option<u64>,
    },
}

/// Builds a [`HybridLimiter`]; see [`HybridLimiter::builder`].
#[derive(Debug)]
pub struct HybridLimiterBuilder {
    redis_url: Option<RedactedUrl>,
    #[cfg(feature = "tls")]
    redis_tls: RedisTls,
    deadline: Duration,
    client_time: bool,
    default_policy: Policy,
    overflow_policy: Policy,
    instances: Instances,
    group: String,
    name: Option<String>,
    pub(crate) heartbeat_every: Duration,
    pub(crate) instance_ttl: Duration,
    prune_every: Duration,
    breaker: BreakerConfig,
    local: LocalConfig,
    reconcile: ReconcileConfig,
    clock: Arc<dyn Clock>,
    rule_sets: Vec<RuleSet>,
    max_batch: Option<usize>,
}

/// A Redis URL whose `Debug` hides its credentials, so the builder's derived
/// `Debug` never prints a password.
struct RedactedUrl(String);

impl std::fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&redact_url(&self.0), f)
    }
}

/// TLS material for `rediss://`, handed to [`RedisTierConfig`] at build.
/// `Debug` says only what is set: the client key is a secret.
#[cfg(feature = "tls")]
#[derive(Default)]
struct RedisTls {
    root_pem: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("root_certificates", &self.root_pem.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl HybridLimiterBuilder {
    /// The settings that only apply when a limiter is built whose values
    /// differ in `new`, by their path in a config file (see
    /// [`Config::restart_changes`](crate::Config)).
    #[cfg(feature = "config")]
    pub(crate) fn start_changes(&self, new: &HybridLimiterBuilder) -> Vec<&'static str> {
        let url = |b: &HybridLimiterBuilder| b.redis_url.as_ref().map(|u| u.0.clone());
        let max_batch =
            |b: &HybridLimiterBuilder| b.max_batch.unwrap_or(tierlimit_redis::DEFAULT_MAX_BATCH);
        let name = |b: &HybridLimiterBuilder| b.name.clone().unwrap_or_else(|| b.group.clone());
        let mut fields = vec![
            ("redis.url", url(self) != url(new)),
            ("redis.deadline", self.deadline != new.deadline),
            ("redis.client_time", self.client_time != new.client_time),
            ("redis.max_batch", max_batch(self) != max_batch(new)),
        ];
        #[cfg(feature = "tls")]
        fields.extend([
            (
                "redis.tls_ca_file",
                self.redis_tls.root_pem != new.redis_tls.root_pem,
            ),
            (
                "redis.tls_client_cert_file",
                self.redis_tls.client != new.redis_tls.client,
            ),
        ]);
        fields.extend([
            ("limiter.name", name(self) != name(new)),
            ("limiter.group", self.group != new.group),
            (
                "limiter.overflow_policy",
                self.overflow_policy != new.overflow_policy,
            ),
            ("limiter.instances", self.instances != new.instances),
            (
                "limiter.heartbeat_every",
                self.heartbeat_every != new.heartbeat_every,
            ),
            (
                "limiter.instance_ttl",
                self.instance_ttl != new.instance_ttl,
            ),
            ("limiter.prune_every", self.prune_every != new.prune_every),
            ("breaker", self.breaker != new.breaker),
            ("local", self.local != new.local),
            ("reconcile", self.reconcile != new.reconcile),
        ]);
        fields
            .into_iter()
            .filter(|(_, changed)| *changed)
            .map(|(path, _)| path)
            .collect()
    }

    /// Rule sets the limiter holds by name, for
    /// [`check_by_name`](HybridLimiter::check_by_name), replaced whole by a
    /// [reload](HybridLimiter::replace_rule_sets). Calls add up; two sets of
    /// one name are an [`Error::DuplicateRuleSet`] from
    /// [`build`](Self::build). A set without a [policy](RuleSet::with_policy)
    /// is answered by the [default policy](Self::default_policy).
    ///
    /// Any [`RuleSet`] can still be checked with [`check`](HybridLimiter::check),
    /// named here or not.
    pub fn rule_sets(mut self, sets: impl IntoIterator<Item = RuleSet>) -> Self {
        self.rule_sets.extend(sets);
        self
    }

    /// The Redis URL. Required. See [`RedisTierConfig::new`] for the forms:
    /// `redis://host:port/db`, `redis://user:password@host:port/db` for an
    /// ACL user, `rediss://…` for TLS (the `tls` feature, on by default; the
    /// server's certificate is always verified). A `rediss://` URL without
    /// the feature is refused by [`build`](Self::build). The password never
    /// appears in this builder's `Debug` or in an error.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.redis_url = Some(RedactedUrl(url.into()));
        self
    }

    /// Trusts only the CA certificates in `pem` for a `rediss://` Redis,
    /// instead of the system's trust store (a private CA). See
    /// [`RedisTierConfig::tls_root_certificates`].
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.redis_tls.root_pem = Some(pem.into());
        self
    }

    /// Authenticates to a `rediss://` Redis with a client certificate chain
    /// and key, both PEM (mutual TLS). See
    /// [`RedisTierConfig::tls_client_certificate`].
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.redis_tls.client = Some((chain_pem.into(), key_pem.into()));
        self
    }

    /// The hard deadline of every Redis call (default 50 ms): no check waits
    /// longer for Redis. Above the breaker's
    /// [`slow_call_threshold`](BreakerConfig::slow_call_threshold) (40 ms by
    /// default), or [`build`](Self::build) refuses it.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The most checks one Redis script call may carry (default 32; 1 turns
    /// batching off): see [`RedisTierConfig::max_batch`].
    pub fn max_batch(mut self, checks: usize) -> Self {
        self.max_batch = Some(checks);
        self
    }

    /// Passes the limiter's clock to the scripts instead of using Redis `TIME`
    /// (for Redis services that reject non-deterministic scripts, and for tests).
    pub fn client_time(mut self, on: bool) -> Self {
        self.client_time = on;
        self
    }

    /// The policy of rule sets that set none (default [`Policy::LocalFallback`]);
    /// a config reload replaces it with the file's.
    pub fn default_policy(mut self, policy: Policy) -> Self {
        self.default_policy = policy;
        self
    }

    /// The answer for a new key under [`Policy::LocalFallback`] when the local
    /// bucket map is full ([`LocalConfig::max_keys`]): [`Policy::FailClosed`]
    /// (default: a key sprayer gets nothing) or [`Policy::FailOpen`].
    pub fn overflow_policy(mut self, policy: Policy) -> Self {
        self.overflow_policy = policy;
        self
    }

    /// How many instances share the global limit (default: learned, unknown
    /// until Redis has answered once; see [`Instances::Learned`]).
    pub fn instances(mut self, instances: Instances) -> Self {
        self.instances = instances;
        self
    }

    /// The name of the group of instances that share limits, for the heartbeat
    /// set (default `"default"`; `[A-Za-z0-9_.-]`, 1 to 64 characters).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// This limiter's name in metrics: the `limiter` label of its series
    /// (default: the group). Give two limiters of one group in one process
    /// different names, or their gauges overwrite each other.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How often the instance count is refreshed while Redis is healthy
    /// (default 1 s; 10 ms to 1 h).
    pub fn heartbeat_every(mut self, every: Duration) -> Self {
        self.heartbeat_every = every;
        self
    }

    /// How long an instance stays counted after its last heartbeat (default
    /// 30 s; at least twice `heartbeat_every`, at most one day).
    ///
    /// An instance whose breaker is open cannot beat, yet it still admits its
    /// share locally; with a short TTL the instances that still reach Redis
    /// would count it gone during a partial outage or while Redis flaps, and
    /// widen their own shares. A long TTL errs the safe way: after a real
    /// scale-down, shares stay smaller for up to the TTL.
    pub fn instance_ttl(mut self, ttl: Duration) -> Self {
        self.instance_ttl = ttl;
        self
    }

    /// How often idle local keys, expired denials and expired ledger entries are
    /// pruned (default 10 s; 1 ms to 1 h).
    pub fn prune_every(mut self, every: Duration) -> Self {
        self.prune_every = every;
        self
    }

    /// The circuit breaker's settings.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// The local tier's bounds.
    pub fn local(mut self, config: LocalConfig) -> Self {
        self.local = config;
        self
    }

    /// The reconciler's settings.
    pub fn reconcile(mut self, config: ReconcileConfig) -> Self {
        self.reconcile = config;
        self
    }

    /// The clock of the breaker and the local tier (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How long a learned instance count waits after its first heartbeat
    /// before it is believed: until every instance started with this one has
    /// beaten, a heartbeat interval on or, when Redis was down at their
    /// start, once the last of their probes found it back (the breaker's
    /// longest cool-down plus the deadline).
    fn learn_after(&self) -> Duration {
        self.heartbeat_every
            .max(self.breaker.max_cool_down.saturating_add(self.deadline))
    }

    /// Validates everything and starts the background tasks (probe, heartbeat,
    /// pruning, reconciliation). Does no I/O itself: the breaker starts Closed
    /// and the connection is made by the first call, so the first check is
    /// decided by Redis when it is healthy (under the deadline), and an
    /// application still starts while Redis is down (its first checks fail
    /// fast and the breaker trips as for any outage).
    ///
    /// Every setting out of range is an [`Error::InvalidConfig`] naming the
    /// field; so is a call outside a Tokio runtime.
    pub fn build(self) -> Result<HybridLimiter> {
        let invalid = |what: &str| Error::InvalidConfig { what: what.into() };
        let learn_after = self.learn_after();
        let url = self
            .redis_url
            .ok_or_else(|| invalid("redis_url is required"))?
            .0;
        if matches!(self.overflow_policy, Policy::LocalFallback) {
            return Err(invalid("overflow_policy must be FailOpen or FailClosed"));
        }
        let instances = match self.instances {
            Instances::Fixed(0) | Instances::Learned { assume: Some(0) } => {
                return Err(invalid("instances must be at least 1"));
            }
            Instances::Fixed(n) => InstanceCount::fixed(n),
            Instances::Learned { assume } => {
                InstanceCount::learned(
                    assume,
                    self.instance_ttl,
                    learn_after,
                    // Beats answer this far apart: the interval, then the call.
                    self.heartbeat_every.saturating_add(self.deadline),
                )
            }
        };
        in_range(
            "heartbeat_every",
            self.heartbeat_every,
            MIN_HEARTBEAT,
            MAX_PERIODIC,
        )?;
        in_range("prune_every", self.prune_every, MIN_PRUNE, MAX_PERIODIC)?;
        // Both bounds are far from overflowing: heartbeat_every is at most an hour.
        in_range(
            "instance_ttl",
            self.instance_ttl,
            self.heartbeat_every * 2,
            MAX_INSTANCE_TTL,
        )?;
        // The group name becomes part of a Redis key: hold it to the rule set name rules.
        let group = RuleSet::new(self.group, [Rule::per_second(1)?])
            .map_err(|_| invalid("group must be 1 to 64 characters from [A-Za-z0-9_.-]"))?
            .name()
            .to_owned();
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| invalid("HybridLimiter::build must be called inside a Tokio runtime"))?;
        let time = if self.client_time {
            TimeSource::Client(self.clock.clone())
        } else {
            TimeSource::Server
        };
        let mut redis_config = RedisTierConfig::new(url)
            .deadline(self.deadline)
            .time_source(time)
            .local_clock(self.clock.clone());
        if let Some(checks) = self.max_batch {
            redis_config = redis_config.max_batch(checks);
        }
        #[cfg(feature = "tls")]
        let redis_config = {
            let mut config = redis_config;
            if let Some(pem) = self.redis_tls.root_pem {
                config = config.tls_root_certificates(pem);
            }
            if let Some((chain, key)) = self.redis_tls.client {
                config = config.tls_client_certificate(chain, key);
            }
            config
        };
        let redis = RedisTier::new(redis_config)?;
        self.reconcile.validate()?;
        let named = NamedSets::new(self.rule_sets)?;
        if self.name.as_deref() == Some("") {
            // As the config file refuses it: an empty label is an absent one
            // to Prometheus, and two such limiters would share their series.
            return Err(invalid("name must not be empty"));
        }
        let labels = Labels::new(self.name.as_deref().unwrap_or(&group));
        let threshold = self.breaker.slow_call_threshold;
        let breaker = Breaker::new(self.breaker, self.clock.clone(), labels.clone())?;
        // Each of the two is right on its own by now (the tier and the
        // breaker checked them).
        if threshold >= self.deadline {
            return Err(invalid(&slow_beyond_deadline(threshold, self.deadline)));
        }
        let local = LocalTier::new(self.local, self.clock.clone())?;
        let instance_id = format!("{:016x}-{}", fastrand::u64(..), std::process::id());
        let inner = Arc::new(Inner {
            redis,
            local,
            breaker,
            clock: self.clock,
            default_policy: DefaultPolicy::new(self.default_policy),
            overflow_policy: self.overflow_policy,
            learn_instances: matches!(self.instances, Instances::Learned { .. }),
            instances,
            heartbeat_key: format!("tl:{{instances}}:{group}"),
            instance_id,
            heartbeat_every: self.heartbeat_every,
            instance_ttl: self.instance_ttl,
            prune_every: self.prune_every,
            wake: Notify::new(),
            drain_wake: Arc::new(Notify::new()),
            reconciler: Reconciler::new(self.reconcile),
            named,
            #[cfg(feature = "config")]
            built_from: std::sync::OnceLock::new(),
            #[cfg(feature = "config")]
            in_force: std::sync::Mutex::new(None),
            labels,
        });
        // Calls whose checks their callers dropped reach the breaker too.
        let weak = Arc::downgrade(&inner);
        inner.redis.on_unheard(move |unheard| {
            if let Some(inner) = weak.upgrade() {
                inner.hear(unheard);
            }
        });
        metrics::describe();
        metrics::zero_series(&inner.labels);
        let tasks = tasks::spawn_all(&handle, &inner);
        Ok(HybridLimiter {
            inner,
            tasks,
            shut_down: false,
        })
    }
}

/// The policy of rule sets that name none, which a config reload replaces
/// (see `reload.rs`): one byte, read on every check that Redis cannot answer.
#[derive(Debug)]
pub(crate) struct DefaultPolicy(AtomicU8);

/// The policies by their number in [`DefaultPolicy`].
const POLICIES: [Policy; 3] = [Policy::LocalFallback, Policy::FailOpen, Policy::FailClosed];

impl DefaultPolicy {
    fn new(policy: Policy) -> Self {
        let default = DefaultPolicy(AtomicU8::new(0));
        default.set(policy);
        default
    }

    pub(crate) fn get(&self) -> Policy {
        let i = usize::from(self.0.load(Ordering::Relaxed));
        POLICIES.get(i).copied().unwrap_or_default()
    }

    pub(crate) fn set(&self, policy: Policy) {
        if let Some(i) = POLICIES.iter().position(|p| *p == policy)
            && let Ok(i) = u8::try_from(i)
        {
            self.0.store(i, Ordering::Relaxed);
        }
    }
}

/// How a call that failed with `e` goes to the breaker
/// ([`Inner::record_call`]'s `failed`): as a failure, by our deadline or not;
/// or, for a fault of one key (Redis answered), as an answer.
pub(crate) fn failed(e: &Error) -> Option<bool> {
    (!e.is_key_fault()).then(|| e.is_timeout())
}

/// Every Redis call's deadline unless set ([`HybridLimiterBuilder::deadline`]).
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);

/// Why a slow-call threshold at or past the deadline is refused: no call
/// ends later than the deadline, so none could count as slow (nor a check
/// dropped by its caller before the deadline, see `Inner::hear`).
pub(crate) fn slow_beyond_deadline(threshold: Duration, deadline: Duration) -> String {
    format!(
        "breaker.slow_call_threshold ({threshold:?}) must be below the Redis deadline \
         ({deadline:?}): no call takes longer than the deadline, so none could count as slow"
    )
}

/// State shared by the limiter and its background tasks.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) redis: RedisTier,
    pub(crate) local: LocalTier,
    pub(crate) breaker: Breaker,
    pub(crate) clock: Arc<dyn Clock>,
    /// The policy of sets that name none; a config reload replaces it.
    pub(crate) default_policy: DefaultPolicy,
    overflow_policy: Policy,
    pub(crate) learn_instances: bool,
    pub(crate) instances: InstanceCount,
    pub(crate) heartbeat_key: String,
    pub(crate) instance_id: String,
    pub(crate) heartbeat_every: Duration,
    pub(crate) instance_ttl: Duration,
    pub(crate) prune_every: Duration,
    /// Wakes the prober when the breaker opens.
    pub(crate) wake: Notify,
    /// Wakes the reconciler when the breaker closes.
    pub(crate) drain_wake: Arc<Notify>,
    pub(crate) reconciler: Reconciler,
    named: NamedSets,
    /// The config the limiter was built from, if any: its start-only
    /// settings are the ones in force until a restart, whatever reloads come.
    #[cfg(feature = "config")]
    built_from: std::sync::OnceLock<crate::config::Config>,
    /// The config last put in force whole (at build or by a reload), and
    /// one reload at a time: its sets and its default policy go in together
    /// (see `reload.rs`).
    #[cfg(feature = "config")]
    pub(crate) in_force: std::sync::Mutex<Option<crate::config::Config>>,
    pub(crate) labels: Labels,
}

/// A distributed rate limiter that asks Redis while it is healthy and answers by
/// each rule set's [`Policy`] while it is not.
///
/// * Every Redis call runs under a hard deadline; a circuit breaker in front of
///   Redis trips on consecutive failures, on the failure rate or on the slow-call
///   rate, and while it is open no check touches Redis.
/// * [`Policy::LocalFallback`] decides with per-process buckets sized to this
///   instance's share of each limit, started from what Redis last reported for
///   the key (or from what an earlier outage used of it, when Redis has not
///   reported on the key since); what they admit is kept in the outage ledger.
/// * A Redis denial is cached until its retry-after, so a client hammering a
///   denied key costs no Redis round trip.
///
/// Dropping the limiter stops its background tasks.
///
/// # Examples
///
/// ```no_run
/// use tierlimit::{HybridLimiter, Policy, Rule, RuleSet, Tier};
///
/// # async fn run() -> Result<(), tierlimit::Error> {
/// let limiter = HybridLimiter::builder().redis_url("redis://127.0.0.1:6380/").build()?;
/// let login = RuleSet::new("login", [Rule::per_minute(5)?])?.with_policy(Policy::FailClosed);
/// let decision = limiter.check("user:42", &login, 1).await?;
/// if !decision.allowed {
///     println!("retry in {:?} (decided by {:?})", decision.retry_after, decision.tier);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct HybridLimiter {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
    shut_down: bool,
}

/// What [`HybridLimiter::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Units admitted without Redis that shutdown wrote back (Redis
    /// acknowledged them).
    pub written_back_units: u64,
    /// Units shutdown did not send because they no longer count: their
    /// window had passed, or their bucket had refilled.
    pub expired_units: u64,
    /// Units of entries Redis refused on their own (a key of another type,
    /// say), set aside as the drain does (see
    /// [`ReconcileStats::parked_units`](crate::ReconcileStats::parked_units)).
    pub parked_units: u64,
    /// Units still owed to Redis when the timeout passed (lost with the
    /// process): 0 when nothing was left to write back. What the ledger held
    /// at the call is these four added up.
    pub undrained_units: u64,
    /// True when this instance left the heartbeat set: the others stop
    /// counting it a TTL sooner than if it had just stopped beating. False
    /// for a fixed instance count, or when Redis did not answer.
    pub left_group: bool,
}

impl Drop for HybridLimiter {
    /// Stops the background tasks. Without [`shutdown`](HybridLimiter::shutdown)
    /// what the ledger still owes Redis is lost: it is counted in
    /// `tierlimit_ledger_dropped_units_total{reason="dropped"}` and named in a
    /// warning.
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let owed = self.inner.local.ledger().units();
        if !self.shut_down && owed > 0 {
            self.inner.labels.ledger_lost(owed);
            tracing::warn!(
                units = owed,
                "limiter dropped without shutdown(): units admitted without Redis are lost"
            );
        }
    }
}

impl HybridLimiter {
    /// A builder with the defaults: 50 ms deadline, server time, local fallback,
    /// learned instance count.
    pub fn builder() -> HybridLimiterBuilder {
        HybridLimiterBuilder {
            redis_url: None,
            #[cfg(feature = "tls")]
            redis_tls: RedisTls::default(),
            deadline: DEFAULT_DEADLINE,
            client_time: false,
            default_policy: Policy::LocalFallback,
            overflow_policy: Policy::FailClosed,
            instances: Instances::Learned { assume: None },
            group: "default".into(),
            name: None,
            heartbeat_every: Duration::from_secs(1),
            instance_ttl: Duration::from_secs(30),
            prune_every: Duration::from_secs(10),
            breaker: BreakerConfig::default(),
            local: LocalConfig::default(),
            reconcile: ReconcileConfig::default(),
            clock: Arc::new(SystemClock),
            rule_sets: Vec::new(),
            max_batch: None,
        }
    }

    /// Checks `cost` units for `key` against every rule of `rule_set`.
    ///
    /// `Err` means bad input only (empty, over-long or control-character keys,
    /// cost 0, cost above a rule's capacity). Redis faults never surface: they
    /// become the rule set's policy's answer, [`Decision::tier`] says where
    /// the answer came from, and [`Decision::redis_failure`] says why, when
    /// this check's own call to Redis failed.
    ///
    /// Each check is a `tracing` span at debug level, `tierlimit_check`, with
    /// the rule set, a hash of the key (never the key itself: keys are user
    /// data), the tier that decided and whether it admitted.
    // Not an `async fn`: its future is `Check`, a few words, decided at its
    // first poll without a state machine when Redis is not asked (see `Check`).
    pub fn check<'a>(
        &'a self,
        key: &'a str,
        rule_set: &'a RuleSet,
        cost: u64,
    ) -> impl Future<Output = Result<Decision>> + Send + 'a {
        Check::Start {
            limiter: self,
            key,
            rule_set,
            cost,
            rules: None,
        }
    }

    /// As [`check`](Self::check), with the rule set this limiter holds under
    /// `set_name` (from [`HybridLimiterBuilder::rule_sets`], a config file, or
    /// the last [reload](Self::replace_rule_sets)).
    ///
    /// The set is taken once, when the check starts: a reload while it runs
    /// does not change it, and the next check sees the reloaded set. A name
    /// the limiter does not hold is [`Error::UnknownRuleSet`].
    pub async fn check_by_name(&self, set_name: &str, key: &str, cost: u64) -> Result<Decision> {
        let set = self.named_set(set_name)?;
        self.check_into(key, &set, cost, None).await
    }

    fn named_set(&self, name: &str) -> Result<RuleSet> {
        self.inner
            .named
            .get(name)
            .ok_or_else(|| Error::UnknownRuleSet { name: name.into() })
    }

    /// The rule set held under `name` now, if any (see
    /// [`check_by_name`](Self::check_by_name)).
    pub fn rule_set(&self, name: &str) -> Option<RuleSet> {
        self.inner.named.get(name)
    }

    /// Every rule set held by name now, sorted by name.
    pub fn rule_sets(&self) -> Vec<RuleSet> {
        self.inner.named.all()
    }

    /// Puts `sets` in force instead of the named rule sets held now, whole and
    /// at once, and says what changed; limits can so change while the
    /// limiter runs.
    ///
    /// * Checks in flight finish on the sets they started with; every check
    ///   after this returns uses the new ones. No check is lost or decided
    ///   twice by a reload.
    /// * A set whose rules keep their algorithm, period and UTC offset keeps
    ///   its state when only a limit or burst changes: what keys used under
    ///   the old limit counts against the new one, on Redis and in the local
    ///   tier (see [`RuleSet::identity`]).
    /// * Two sets of one name are an [`Error::DuplicateRuleSet`], and nothing
    ///   changes.
    ///
    /// Counted in `tierlimit_config_reloads_total` (`result` = applied or
    /// rejected).
    pub fn replace_rule_sets(
        &self,
        sets: impl IntoIterator<Item = RuleSet>,
    ) -> Result<ReloadReport> {
        self.inner.replace_rule_sets(sets.into_iter().collect())
    }

    /// What config reloads act on (`reload.rs`).
    #[cfg(feature = "config")]
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// As [`check`](Self::check), and also every rule's state, in the set's
    /// order, into `rules` (cleared first), when the tier that decided counts
    /// every rule: Redis, or the local bucket (this instance's share, like
    /// the decision). Left empty for the denial cache, `FailOpen` and
    /// `FailClosed`, which know the deciding rule only (see [`Decision`]).
    /// When admitted each rule is after this request; when denied nothing was
    /// consumed, so each rule is as it stands.
    ///
    /// For answers that show every rule (rate-limit headers, say); pass the
    /// same `Vec` again to reuse its memory.
    pub async fn check_with_rules(
        &self,
        key: &str,
        rule_set: &RuleSet,
        cost: u64,
        rules: &mut Vec<RuleState>,
    ) -> Result<Decision> {
        rules.clear();
        self.check_into(key, rule_set, cost, Some(rules)).await
    }

    fn check_into<'a>(
        &'a self,
        key: &'a str,
        rule_set: &'a RuleSet,
        cost: u64,
        rules: Option<&'a mut Vec<RuleState>>,
    ) -> Check<'a> {
        Check::Start {
            limiter: self,
            key,
            rule_set,
            cost,
            rules,
        }
    }

    /// A check's first poll: the answer when no Redis call is needed (and
    /// tracing is off), else the first poll of the boxed future that will
    /// give it, which waits in `check`. Returns the poll's own output type,
    /// so an answer decided here is built where the caller receives it.
    fn start<'a>(
        &'a self,
        key: &'a str,
        rule_set: &'a RuleSet,
        cost: u64,
        mut rules: Option<&'a mut Vec<RuleState>>,
        check: &mut Check<'a>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Decision>> {
        let span = tracing::debug_span!(
            "tierlimit_check",
            set = rule_set.name(),
            key_hash = tracing::field::Empty,
            tier = tracing::field::Empty,
            allowed = tracing::field::Empty,
        );
        if !span.is_disabled() {
            let traced = Box::pin(self.traced(span, key, rule_set, cost, rules));
            return check.wait(traced, cx);
        }
        match self.decide_here(key, rule_set, cost, rules.as_deref_mut()) {
            Here::Answer(answer) => Poll::Ready(answer),
            Here::AskRedis(key) => check.wait(self.ask_boxed(key, rule_set, cost, rules), cx),
        }
    }

    /// A check inside its `tierlimit_check` span, when a subscriber wants it.
    async fn traced(
        &self,
        span: tracing::Span,
        key: &str,
        rule_set: &RuleSet,
        cost: u64,
        rules: Option<&mut Vec<RuleState>>,
    ) -> Result<Decision> {
        span.record("key_hash", tracing::field::display(KeyHash(key)));
        let result = self
            .decide(key, rule_set, cost, rules)
            .instrument(span.clone())
            .await;
        if let Ok(d) = &result {
            span.record("tier", d.tier.as_str());
            span.record("allowed", d.allowed);
        }
        result
    }

    async fn decide(
        &self,
        key: &str,
        rule_set: &RuleSet,
        cost: u64,
        mut rules: Option<&mut Vec<RuleState>>,
    ) -> Result<Decision> {
        match self.decide_here(key, rule_set, cost, rules.as_deref_mut()) {
            Here::Answer(answer) => answer,
            Here::AskRedis(key) => self.ask_boxed(key, rule_set, cost, rules).await,
        }
    }

    /// Everything a check decides without waiting: bad input, a cached
    /// denial, the settling bound, and the policy while the breaker keeps
    /// Redis out. Synchronous, so the local paths cost no future of their own.
    #[inline(always)]
    fn decide_here<'k>(
        &self,
        key: &'k str,
        rule_set: &RuleSet,
        cost: u64,
        rules: Option<&mut Vec<RuleState>>,
    ) -> Here<'k> {
        // Validated and escaped once, for every tier this check may ask.
        let key = match CheckKey::new(key) {
            Ok(key) => key,
            Err(e) => return Here::Answer(Err(e)),
        };
        let escaped = key.escaped();
        if let Err(e) = rule_set.validate_cost(cost) {
            return Here::Answer(Err(e));
        }
        let inner = &*self.inner;
        if let Some(denied) = inner.local.cached_denial(escaped, rule_set, cost) {
            return Here::Answer(Ok(inner.count(rule_set, denied)));
        }
        if inner.breaker.allows_request() {
            let share_of = || inner.falls_back_locally(rule_set);
            if let Some(denied) = inner
                .local
                .settling(escaped, rule_set, cost, share_of, rules)
            {
                return Here::Answer(Ok(inner.count(rule_set, denied)));
            }
            return Here::AskRedis(key);
        }
        let decision = inner.fallback(escaped, rule_set, cost, rules);
        Here::Answer(Ok(inner.count(rule_set, decision)))
    }

    /// [`ask_redis`](Self::ask_redis)'s future, boxed. Boxed, since it is
    /// large (the Redis call's state): a check's future that held it inline
    /// would be copied whole on every check, the local ones included. Out of
    /// line, since the future is built on the stack before it is boxed: a
    /// caller that built it would take a frame of its size on every check.
    #[inline(never)]
    fn ask_boxed<'a>(
        &'a self,
        key: CheckKey<'a>,
        rule_set: &'a RuleSet,
        cost: u64,
        rules: Option<&'a mut Vec<RuleState>>,
    ) -> BoxedCheck<'a> {
        Box::pin(self.ask_redis(key, rule_set, cost, rules))
    }

    /// A check Redis is asked for (the breaker allows it).
    async fn ask_redis(
        &self,
        key: CheckKey<'_>,
        rule_set: &RuleSet,
        cost: u64,
        rules: Option<&mut Vec<RuleState>>,
    ) -> Result<Decision> {
        let key = &key;
        let inner = &*self.inner;
        let escaped = key.escaped();
        let epoch = inner.breaker.epoch();
        let started = Instant::now();
        let sent_in = inner.local.outage();
        // What this key used locally reaches Redis before its quota does.
        let claims = inner.local.claim_pending(escaped, rule_set);
        // A batch of checks is one Redis call: only one of its checks
        // (`counts_call`) reports it to the breaker, success or failure.
        let (result, counts_call) = if claims.is_empty() {
            let checked = inner.redis.check_key(key, rule_set, cost).await;
            (checked.result, checked.counts_call)
        } else {
            let writes = reconcile::writes(&claims);
            let checked = inner
                .redis
                .check_after_key(key, rule_set, cost, &writes)
                .await;
            let result = checked.result.map(|(verdict, written)| {
                reconcile::settle(inner, &claims, written);
                verdict
            });
            (result, checked.counts_call)
        };
        let latency = started.elapsed();
        inner.labels.redis_call(latency.as_secs_f64());
        match result {
            Ok(verdict) => {
                if counts_call {
                    inner.record_call(epoch, latency, None);
                }
                // Checks decided locally in the outage this call was sent in
                // (calls that failed while the breaker stayed Closed) are an
                // outage that ends with this answer; an Open breaker's outage
                // ends with its probe. (A trip by another check between this
                // read and the end, with a check decided locally in between,
                // ends the Open breaker's outage at once: its buckets so far
                // keep what they used, as seeds, but lose the settle bound.)
                if inner.breaker.allows_request() {
                    inner.local.end_outage(sent_in, Duration::ZERO);
                }
                let decision = verdict.decision;
                inner.local.remember(
                    escaped,
                    rule_set,
                    verdict.rules.iter().map(|r| (r.remaining, r.reset_after)),
                    sent_in,
                );
                if !decision.allowed {
                    inner.local.cache_denial(escaped, rule_set, cost, &decision);
                }
                if let Some(rules) = rules {
                    *rules = verdict.rules;
                }
                Ok(inner.count(rule_set, decision))
            }
            Err(e) if e.is_bad_input() => Err(e),
            Err(e) => {
                if counts_call {
                    inner.record_call(epoch, latency, failed(&e));
                }
                let mut decision = inner.fallback(escaped, rule_set, cost, rules);
                decision.redis_failure = e.redis_failure();
                Ok(inner.count(rule_set, decision))
            }
        }
    }

    /// Stops the limiter without losing what it owes Redis: writes back
    /// everything the local tier admitted that Redis has not counted yet
    /// (trying until `timeout` passes, whatever the breaker says), removes this
    /// instance from the heartbeat set, stops the background tasks, and says
    /// what it wrote back and what it could not.
    ///
    /// Checks stop with it (it takes the limiter): call it once no request
    /// needs a decision any more, e.g. after the server stopped accepting.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: tierlimit::HybridLimiter) {
    /// let report = limiter.shutdown(std::time::Duration::from_secs(5)).await;
    /// if report.undrained_units > 0 {
    ///     eprintln!("{} units admitted during the outage were not written back", report.undrained_units);
    /// }
    /// # }
    /// ```
    pub async fn shutdown(mut self, timeout: Duration) -> ShutdownReport {
        for task in &self.tasks {
            task.abort();
        }
        let inner = &*self.inner;
        let started = Instant::now();
        let mut report = ShutdownReport::default();
        let ledger = inner.local.ledger();
        let parked_before = ledger.parked_units();
        report.expired_units = inner.local.drop_expired();
        while started.elapsed() < timeout && !ledger.is_empty() {
            let claims = inner.local.claim(
                inner.reconciler.config.batch_size,
                reconcile::hold_clock_us(inner),
            );
            // Cut at what is left of the timeout: a batch's call alone is
            // bounded by the deadline, and against a hung Redis one held a
            // shutdown for a whole deadline past its timeout. Cut short, its
            // claims keep their ids: what Redis applied is not applied twice.
            let left = timeout.saturating_sub(started.elapsed());
            let failed = claims.is_empty()
                || match tokio::time::timeout(left, reconcile::send_batch(inner, &claims)).await {
                    Ok(sent) => {
                        report.written_back_units =
                            report.written_back_units.saturating_add(sent.units);
                        if sent.failed.as_ref().is_some_and(Error::is_timeout) {
                            // What the breaker does after timeouts, which it
                            // hears nothing of here: a socket whose request
                            // went unanswered may pair every later reply
                            // with the request before it.
                            inner.redis.drop_connection();
                        }
                        sent.failed.is_some()
                    }
                    Err(_) => break,
                };
            if failed {
                // Redis is down or failing, or what is left is held after a
                // failure: try again until the timeout.
                let left = timeout.saturating_sub(started.elapsed());
                tokio::time::sleep(left.min(Duration::from_millis(10))).await;
            }
        }
        report.parked_units = ledger.parked_units().saturating_sub(parked_before);
        report.undrained_units = ledger.units();
        let left = timeout.saturating_sub(started.elapsed());
        if inner.learn_instances && !left.is_zero() {
            let leave = inner.redis.leave(&inner.heartbeat_key, &inner.instance_id);
            report.left_group = matches!(tokio::time::timeout(left, leave).await, Ok(Ok(_)));
        }
        if report.undrained_units > 0 {
            inner.labels.ledger_lost(report.undrained_units);
            tracing::warn!(
                units = report.undrained_units,
                "shutdown timed out: units admitted without Redis were not written back"
            );
        }
        self.shut_down = true;
        report
    }

    /// The breaker's state.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// The breaker, read only (state, cool-down, transitions).
    pub fn breaker(&self) -> BreakerView<'_> {
        BreakerView::new(&self.inner.breaker)
    }

    /// The instance count local buckets are sized for now; `None` while it has
    /// never been learned (see [`Instances::Learned`]).
    pub fn instances(&self) -> Option<u64> {
        self.inner.instances.get()
    }

    /// What the reconciler has done since the limiter started, and what waits.
    pub fn reconcile_stats(&self) -> ReconcileStats {
        self.inner.reconciler.stats(&self.inner)
    }

    /// The local tier, read only (key counts, ledger).
    pub fn local(&self) -> LocalView<'_> {
        LocalView::new(&self.inner.local)
    }

    /// Waits until the breaker is Closed (Redis answered a probe), or `timeout` passes;
    /// true when Closed. Any timeout is fine, [`Duration::MAX`] included.
    pub async fn wait_closed(&self, timeout: Duration) -> bool {
        let started = Instant::now();
        loop {
            if self.breaker_state() == BreakerState::Closed {
                return true;
            }
            if started.elapsed() >= timeout {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// A key as it appears in traces: a keyed hash, with a key drawn once per
/// process, so a trace reader can follow one key within a process but cannot
/// look a known key up in it.
struct KeyHash<'a>(&'a str);

impl std::fmt::Display for KeyHash<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        static SEED: OnceLock<RandomState> = OnceLock::new();
        write!(
            f,
            "{:016x}",
            SEED.get_or_init(RandomState::new).hash_one(self.0)
        )
    }
}

/// What [`HybridLimiter::decide_here`] found.
enum Here<'k> {
    /// Decided without Redis, or refused as bad input.
    Answer(Result<Decision>),
    /// Redis decides; the key, validated and escaped.
    AskRedis(CheckKey<'k>),
}

/// A check waiting for Redis (or traced), boxed.
type BoxedCheck<'a> = Pin<Box<dyn Future<Output = Result<Decision>> + Send + 'a>>;

/// The future of [`HybridLimiter::check`]: its arguments until the first
/// poll, which answers at once when Redis is not asked (the breaker is open,
/// a cached denial, bad input) and otherwise boxes the call. Written out by
/// hand so that the local paths pay for no state machine, and the future a
/// caller holds and moves stays a few words whatever the Redis call needs.
enum Check<'a> {
    Start {
        limiter: &'a HybridLimiter,
        key: &'a str,
        rule_set: &'a RuleSet,
        cost: u64,
        rules: Option<&'a mut Vec<RuleState>>,
    },
    Waiting(BoxedCheck<'a>),
    Done,
}

impl Future for Check<'_> {
    type Output = Result<Decision>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin` (references and a box).
        let this = self.get_mut();
        match std::mem::replace(this, Check::Done) {
            Check::Start {
                limiter,
                key,
                rule_set,
                cost,
                rules,
            } => limiter.start(key, rule_set, cost, rules, this, cx),
            Check::Waiting(boxed) => this.wait(boxed, cx),
            Check::Done => panic!("a tierlimit check polled after it completed"),
        }
    }
}

impl<'a> Check<'a> {
    /// Polls `boxed`; keeps it in `self` to be polled again while it is pending.
    fn wait(&mut self, mut boxed: BoxedCheck<'a>, cx: &mut Context<'_>) -> Poll<Result<Decision>> {
        let polled = boxed.as_mut().poll(cx);
        if polled.is_pending() {
            *self = Check::Waiting(boxed);
        }
        polled
    }
}

impl Inner {
    pub(crate) fn replace_rule_sets(&self, sets: Vec<RuleSet>) -> Result<ReloadReport> {
        let result = self.named.replace(sets);
        match &result {
            Ok(report) => {
                // What their keys owe is written back under the new rules.
                // `ledger()` moves what the buckets owe there first, under
                // the rules it was admitted with, so no bucket takes an
                // entry back to the old ones. A set added may be one an
                // earlier reload removed while its keys owed units.
                let ledger = self.local.ledger();
                for set in report
                    .changed
                    .iter()
                    .chain(&report.added)
                    .filter_map(|name| self.named.get(name))
                {
                    ledger.retarget(&set);
                }
                self.labels.reload(true);
                tracing::info!(
                    generation = report.generation,
                    added = ?report.added,
                    removed = ?report.removed,
                    changed = ?report.changed,
                    "rule sets reloaded"
                );
            }
            Err(e) => {
                self.labels.reload(false);
                tracing::warn!(error = %e, "rule set reload rejected; the sets in force are kept");
            }
        }
        result
    }

    /// Remembers the config the limiter was built from, to tell a reload
    /// which of its settings need a restart; it is also the config in force
    /// until the first reload.
    #[cfg(feature = "config")]
    pub(crate) fn set_built_from(&self, config: crate::config::Config) {
        *self
            .in_force
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(config.clone());
        let _ = self.built_from.set(config);
    }

    /// The start-only settings `config` gives values other than those in
    /// force, the ones the limiter was built with (none when it was not
    /// built from a config).
    #[cfg(feature = "config")]
    pub(crate) fn restart_changes(&self, config: &crate::config::Config) -> Vec<String> {
        self.built_from
            .get()
            .map(|built| built.restart_changes(config))
            .unwrap_or_default()
    }

    #[inline(always)]
    fn count(&self, set: &RuleSet, decision: Decision) -> Decision {
        self.labels.decision(set, decision.tier, decision.allowed);
        decision
    }

    /// Tells the breaker how a Redis call that speaks for the deployment
    /// went: made in `epoch` (the breaker's, read before the call), answered
    /// after `latency` (`failed` None), or failed, by our deadline or not
    /// (`Some(timeout)`).
    pub(crate) fn record_call(&self, epoch: u64, latency: Duration, failed: Option<bool>) {
        match failed {
            None => {
                if self.breaker.record_success(latency, epoch).is_some() {
                    // Slow answers tripped it: the prober waits for this.
                    self.wake.notify_one();
                }
            }
            Some(timeout) => {
                let outcome = self.breaker.record_failure(latency, timeout, epoch);
                self.after_failure(outcome);
            }
        }
    }

    /// A call no check reported: its check was dropped while it ran (by the
    /// caller, or by a deadline over the whole check). One
    /// dropped unanswered after the slow-call threshold counts as a call
    /// that timed out: that long without an answer is what a hung server's
    /// calls all show, and a caller that gives up sooner than the deadline
    /// would otherwise keep a hung server from tripping the breaker. One
    /// dropped sooner says nothing of Redis.
    ///
    /// Counted in the breaker's stretch of now: a call ends within a deadline
    /// of being made, so only one made just before a trip and heard after the
    /// breaker closed again is counted there.
    fn hear(&self, unheard: Unheard) {
        let epoch = self.breaker.epoch();
        match unheard {
            Unheard::Ended { latency, result } => {
                self.record_call(epoch, latency, result.err().as_ref().and_then(failed));
            }
            Unheard::Abandoned { after } if after >= self.breaker.slow_call_threshold() => {
                self.record_call(epoch, after, Some(true));
            }
            _ => {}
        }
    }

    pub(crate) fn after_failure(&self, outcome: FailureOutcome) {
        if outcome.replace_connection && self.redis.replace_connection() {
            self.labels.connection_replaced();
        }
        if outcome.transition.is_some() {
            self.wake.notify_one();
        }
    }

    /// The instance count `set`'s local buckets take their share of, when
    /// its policy is `LocalFallback` and the count is known.
    fn falls_back_locally(&self, set: &RuleSet) -> Option<u64> {
        let policy = set.policy().unwrap_or_else(|| self.default_policy.get());
        (policy == Policy::LocalFallback)
            .then(|| self.instances.get())
            .flatten()
    }

    /// The rule set's policy's answer while Redis cannot be asked.
    ///
    /// Local fallback needs this instance's share, so while the instance count
    /// is unknown (never learned, nothing assumed) the overflow policy answers,
    /// as it does when the local tier has no room for the key.
    #[inline(always)]
    fn fallback(
        &self,
        escaped: &str,
        set: &RuleSet,
        cost: u64,
        rules: Option<&mut Vec<RuleState>>,
    ) -> Decision {
        match set.policy().unwrap_or_else(|| self.default_policy.get()) {
            Policy::LocalFallback => {
                if let Some(n) = self.instances.get() {
                    let answer = match rules {
                        Some(rules) => self.local.check_rules(escaped, set, cost, n, true, rules),
                        None => self.local.check(escaped, set, cost, n, true),
                    };
                    if let LocalAnswer::Decided(d) = answer {
                        return d;
                    }
                }
                self.fixed_answer(self.overflow_policy, escaped, set, cost)
            }
            policy => self.fixed_answer(policy, escaped, set, cost),
        }
    }

    /// The answer of a policy that counts nothing (see [`Decision`] for what its
    /// fields mean then).
    fn fixed_answer(&self, policy: Policy, escaped: &str, set: &RuleSet, cost: u64) -> Decision {
        let limit = set.rules().first().map_or(0, Rule::limit);
        if policy == Policy::FailOpen {
            // Admitted without any bucket: still owed to Redis like a local admission.
            self.local.record(escaped, set, cost);
            Decision::allowed(limit, limit, Duration::ZERO, 0, Tier::FailOpen)
        } else {
            // Retry once Redis may be back: after the next probe.
            let retry = self
                .breaker
                .time_until_probe()
                .unwrap_or(self.breaker.current_cool_down())
                .max(Duration::from_millis(1));
            Decision::denied(limit, retry, retry, 0, Tier::FailClosed)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::Waker;

    use super::*;

    fn ready<F: Future>(fut: F) -> F::Output {
        match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("expected an answer at the first poll"),
        }
    }

    /// The defaults the README states, each in one place: changing one
    /// changes what users were told.
    #[test]
    fn the_defaults_are_the_readmes() {
        let b = HybridLimiter::builder();
        assert_eq!(b.deadline, Duration::from_millis(50));
        assert_eq!(b.heartbeat_every, Duration::from_secs(1));
        assert_eq!(b.instance_ttl, Duration::from_secs(30));
        assert_eq!(b.prune_every, Duration::from_secs(10));
        assert_eq!(b.learn_after(), Duration::from_millis(5_050));
        let c = BreakerConfig::default();
        assert_eq!(
            (c.consecutive_failures, c.window_size, c.minimum_calls),
            (5, 50, 20)
        );
        assert_eq!(c.slow_call_threshold, Duration::from_millis(40));
        assert_eq!(
            (c.cool_down, c.max_cool_down, c.backoff_multiplier),
            (Duration::from_millis(250), Duration::from_secs(5), 2.0)
        );
    }

    /// A limiter on a port nothing listens on, its breaker untouched (Closed).
    fn dead_limiter(rt: &tokio::runtime::Runtime) -> HybridLimiter {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let _entered = rt.enter();
        HybridLimiter::builder()
            .redis_url(format!("redis://127.0.0.1:{port}/"))
            .instances(Instances::Fixed(1))
            .build()
            .expect("valid config")
    }

    /// Without the `tls` feature, `build()` refuses a `rediss://` URL with
    /// an error naming the feature (the README's promise; `.ci/run` runs the
    /// library's tests without default features for it).
    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_without_the_tls_feature_is_refused_by_build() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _entered = rt.enter();
        let err = HybridLimiter::builder()
            .redis_url("rediss://127.0.0.1:1/")
            .build()
            .expect_err("rediss:// needs the tls feature");
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().contains("`tls` feature"), "{err}");
    }

    /// The future a caller holds (and moves into its own) is its arguments,
    /// not the Redis call's state: every check, local or not, moves it.
    #[test]
    fn a_checks_future_is_a_few_words() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let limiter = dead_limiter(&rt);
        let set = RuleSet::new("small", [Rule::per_second(10).expect("valid")]).expect("valid");
        let fut = limiter.check("user-1", &set, 1);
        assert!(
            std::mem::size_of_val(&fut) <= 64,
            "a check's future takes {} bytes",
            std::mem::size_of_val(&fut)
        );
    }

    /// Bad input is answered at the first poll, before Redis is asked, and
    /// names what is wrong; the Redis path still validates the key it sends.
    #[test]
    fn bad_input_is_an_error_at_the_first_poll() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let limiter = dead_limiter(&rt);
        let set = RuleSet::new("small", [Rule::per_second(10).expect("valid")]).expect("valid");
        assert!(matches!(
            ready(limiter.check("", &set, 1)),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            ready(limiter.check("a\nb", &set, 1)),
            Err(Error::KeyControlChar { position: 1 })
        ));
        assert!(matches!(
            ready(limiter.check("ok", &set, 0)),
            Err(Error::ZeroCost)
        ));
        assert!(matches!(
            ready(limiter.check("ok", &set, 11)),
            Err(Error::CostExceedsCapacity { cost: 11, .. })
        ));
        // A valid check goes to Redis (down): answered by the policy, never an error.
        let d = rt
            .block_on(limiter.check("{ok}%", &set, 1))
            .expect("a valid check is never an error");
        assert_ne!(d.tier, Tier::Redis);
    }
}
