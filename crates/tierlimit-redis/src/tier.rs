//! The global tier: one script call per check or per batch of concurrent
//! checks, under a hard deadline.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::ConnectionManagerConfig;
use redis::io::tcp::TcpSettings;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};
use tierlimit_core::{
    Clock, Error, MAX_EXACT, RedisFailure, Result, RuleSet, escape_key, stripe_key, validate_key,
};

use crate::batch::{
    Batcher, CheckKey, Checked, Entry, QUEUE_WAIT_SHARE, Queued, Unheard, reporter,
};
use crate::cluster::{Backend, Conn, check_slot, group_by_slot, join_all, key_slot, seed_urls};
use crate::command;
use crate::config::{RECONNECT_MIN_DELAY, invalid, redact_url, scrub};
use crate::failure::{classify, classify_server, failure_of, timeout};
use crate::nodes::{Master, Nodes, SlotMap};
use crate::reconcile::{Parts, WriteBack, Written, add_reconcile_cmds, reconcile_cmd};
use crate::script::{Head, Routine, ScriptMode, as_evalsha};
use crate::stripe::{first_stripe, stripe_set};
use crate::verdict::{parse_batch, parse_verdict};
use crate::{CheckRequest, RECONCILE, RedisTierConfig, TimeSource, Verdict};

/// On a Cluster, how long a master that failed a call is not asked: checks of
/// its slots get [`RedisFailure::NodeDown`] at once meanwhile. Long enough
/// that a dead master costs one deadline per half second, not one per check;
/// short enough that a master that only hiccuped is back at once.
const NODE_DOWN_FOR: Duration = Duration::from_millis(500);

/// How often the slot map is read while a master is down.
const SLOTS_REFRESH_EVERY: Duration = Duration::from_millis(100);

/// [`Inner::mode`]: not chosen yet (the next call tries Functions).
const MODE_UNKNOWN: u8 = 0;
/// [`Inner::mode`]: [`ScriptMode::Functions`].
const MODE_FUNCTIONS: u8 = 1;
/// [`Inner::mode`]: [`ScriptMode::Scripts`].
const MODE_SCRIPTS: u8 = 2;

/// The most times one command (or one pipeline's command) is sent: a
/// library or script reload, or a switch to `EVALSHA`, each costs one more
/// send, and the longest chain (`FCALL` meets `Function not found`, the load
/// is refused, the `EVALSHA` meets `NOSCRIPT`, the script is loaded) is 3.
const MAX_SENDS: usize = 4;
/// How much sooner a batch's call times out than the earliest deadline of
/// its checks: two ticks of Tokio's millisecond timer wheel, so the call's
/// timer fires on an earlier tick than theirs.
const ANSWER_MARGIN: Duration = Duration::from_millis(2);

/// The global tier: checks rule sets on Redis with the scripts in `lua/`.
///
/// * Creating it does no I/O: the connection is made on first use, under that
///   call's deadline, so an application starts while Redis is down.
/// * Every call (connecting, script reloads and pipelines included) ends by
///   its [deadline](RedisTierConfig::deadline); past it the call fails with
///   [`RedisFailure::Timeout`](tierlimit_core::RedisFailure::Timeout).
/// * The check code runs as a Redis Functions library (`FCALL`) when the
///   server has Functions and lets the user load the library, else as
///   scripts (`EVALSHA`); see [`script_mode`](Self::script_mode). Either is
///   reloaded when the server lost it (`FUNCTION FLUSH`, `SCRIPT FLUSH`, a
///   restart), for single and pipelined checks alike, and a call that ran is
///   never sent twice.
/// * Redis faults come back as [`Error::Redis`], classified by
///   [`RedisFailure`](tierlimit_core::RedisFailure) with the redis-rs error as
///   the source; bad input comes back before any I/O.
///
/// Cloning is cheap and clones share the connection. All calls must run
/// inside a Tokio runtime.
///
/// # Examples
///
/// ```no_run
/// use tierlimit_core::{Rule, RuleSet};
/// use tierlimit_redis::{RedisTier, RedisTierConfig};
///
/// # async fn run() -> tierlimit_core::Result<()> {
/// let tier = RedisTier::new(RedisTierConfig::new("redis://127.0.0.1:6380/"))?;
/// let set = RuleSet::new("api", [Rule::per_second(10)?, Rule::per_hour(1000)?])?;
/// match tier.check("user:42", &set, 1).await {
///     Ok(verdict) if verdict.decision.allowed => { /* serve */ }
///     Ok(verdict) => println!("retry in {:?}", verdict.decision.retry_after),
///     Err(e) if e.is_bad_input() => return Err(e),
///     Err(e) => println!("Redis fault ({e}): let the caller's policy decide"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisTier {
    inner: Arc<Inner>,
}

struct Inner {
    /// One server or a Cluster, and how to connect to it.
    backend: Backend,
    deadline: Duration,
    /// How long a background replacement may take to connect and answer PING.
    replace_budget: Duration,
    time_source: TimeSource,
    /// The clock ledger entries' times are on (see `RedisTierConfig::local_clock`).
    local_clock: Arc<dyn Clock>,
    /// Checks, the heartbeat and PING.
    conn: ArcSwapOption<Conn>,
    /// Reconcile batches, on a socket of their own: a pipelined batch on the
    /// checks' socket would make every check sent meanwhile wait for the whole
    /// batch's replies before its own (redis-rs answers in order).
    bulk: ArcSwapOption<Conn>,
    replacing: AtomicBool,
    replaced: AtomicU64,
    /// The reconcile script was loaded on the server since the connections
    /// were last dropped or replaced (every probe drops them), and since then
    /// no call failed on its connection (a restart) and no script call met
    /// `NOSCRIPT` (the server lost its scripts); see [`RedisTier::check_after`].
    reconcile_loaded: LoadedNote,
    /// Functions or scripts (`MODE_*`): chosen by the first call on a
    /// connection, chosen again after the connections are dropped or replaced.
    mode: AtomicU8,
    /// Checks waiting for the call in flight (see `batch.rs`): on one server;
    /// on a Cluster each master has its own (see [`RedisTier::batcher`]).
    batcher: Arc<Batcher>,
    /// On a Cluster: which master serves each slot, and which failed lately
    /// (shared with the Cluster connections, which route by it).
    nodes: Arc<Nodes>,
    /// A task reads the slot map again (see [`RedisTier::refresh_slots`]).
    refreshing: AtomicBool,
    /// Hears of the calls no check reported (see [`RedisTier::on_unheard`]).
    unheard: OnceLock<UnheardHook>,
}

/// What [`RedisTier::on_unheard`] sets.
type UnheardHook = Box<dyn Fn(Unheard) + Send + Sync>;

/// Why a call failed, kept unconverted so one failure can be reported to every
/// item of a batch.
#[derive(Clone)]
enum Failure {
    Timeout,
    Redis(RedisError),
}

impl Failure {
    fn into_error(self) -> Error {
        match self {
            Failure::Timeout => timeout(),
            Failure::Redis(e) => classify(e),
        }
    }

    fn to_error(&self) -> Error {
        match self {
            Failure::Timeout => timeout(),
            Failure::Redis(e) => classify(e.clone()),
        }
    }

    fn kind(&self) -> RedisFailure {
        match self {
            Failure::Timeout => RedisFailure::Timeout,
            Failure::Redis(e) => failure_of(e),
        }
    }
}

impl fmt::Debug for RedisTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: the connection info may hold a password.
        f.debug_struct("RedisTier")
            .field("addr", &self.inner.backend.addr())
            .field("deadline", &self.inner.deadline)
            .field("time_source", &self.inner.time_source)
            .field("connected", &self.inner.conn.load().is_some())
            .field("connections_replaced", &self.connections_replaced())
            .finish()
    }
}

impl RedisTier {
    /// A tier for `config`'s server. Validates the settings and the URL
    /// ([`Error::InvalidConfig`] names what is wrong); does no I/O and needs no
    /// runtime.
    pub fn new(config: RedisTierConfig) -> Result<RedisTier> {
        config.validate()?;
        let backend = backend_for(&config)?;
        let replace_budget = config.connect_timeout + config.deadline;
        Ok(RedisTier {
            inner: Arc::new(Inner {
                backend,
                deadline: config.deadline,
                replace_budget,
                time_source: config.time_source,
                local_clock: config.local_clock,
                conn: ArcSwapOption::empty(),
                bulk: ArcSwapOption::empty(),
                replacing: AtomicBool::new(false),
                replaced: AtomicU64::new(0),
                reconcile_loaded: LoadedNote::default(),
                mode: AtomicU8::new(MODE_UNKNOWN),
                batcher: Arc::new(Batcher::new(config.max_batch)),
                nodes: Arc::new(Nodes::new(NODE_DOWN_FOR)),
                refreshing: AtomicBool::new(false),
                unheard: OnceLock::new(),
            }),
        })
    }

    /// Sets `hook` to hear of every check's call that no
    /// [`Checked::counts_call`] reported because its check was dropped
    /// first (see [`Unheard`]), so a circuit breaker fed by both hears of
    /// every call once. Called on the task that ended the call or
    /// dropped the check: keep it short. Set once: false when a hook was set
    /// already (this one is dropped).
    pub fn on_unheard(&self, hook: impl Fn(Unheard) + Send + Sync + 'static) -> bool {
        self.inner.unheard.set(Box::new(hook)).is_ok()
    }

    fn unheard(&self, unheard: Unheard) {
        if let Some(hook) = self.inner.unheard.get() {
            hook(unheard);
        }
    }

    /// True when this tier talks to a Redis Cluster (`redis+cluster://`).
    pub fn is_cluster(&self) -> bool {
        self.inner.backend.is_cluster()
    }

    /// The Redis Cluster hash slot (0 to 16383) of every storage key of a
    /// check of `key`, or `None` on one server: what a circuit breaker per
    /// slot (or per slot range) keys on, so that a fault of one master does
    /// not stop the checks bound for the others. Computed locally, no I/O.
    pub fn slot_of(&self, key: &CheckKey<'_>) -> Option<u16> {
        self.is_cluster().then(|| check_slot(key.escaped()))
    }

    /// How this tier runs its Lua on the server: [`ScriptMode::Functions`]
    /// (`FCALL` of a library loaded once per server) or
    /// [`ScriptMode::Scripts`] (`EVALSHA`); `None` until a call has chosen.
    ///
    /// The first script call on a connection tries Functions: `FCALL`, and
    /// when the server lacks the library, `FUNCTION LOAD` and `FCALL` again.
    /// A server without Functions (older than Redis 7: `unknown command`) or
    /// a user the ACL refuses `FCALL` or `FUNCTION LOAD` (`NOPERM`) makes the
    /// tier use scripts instead, for that call and the next ones, until the
    /// connections are dropped or replaced (then the next call chooses again).
    /// Either way a call that ran is never sent twice, and decisions are the
    /// same: the library is built from the same Lua files as the scripts.
    ///
    /// The library is named after the hash of its code
    /// (`tierlimit_<16 hex digits>`), so versions sharing a server never
    /// replace one another's. Unlike scripts, libraries are kept with the
    /// data (RDB, AOF, replicas): one a version no longer used left behind
    /// stays until `FUNCTION DELETE` removes it.
    pub fn script_mode(&self) -> Option<ScriptMode> {
        match self.inner.mode.load(Ordering::Relaxed) {
            MODE_FUNCTIONS => Some(ScriptMode::Functions),
            MODE_SCRIPTS => Some(ScriptMode::Scripts),
            _ => None,
        }
    }

    /// The head of a call of `routine` as this tier sends it now: `FCALL`
    /// unless the tier chose scripts.
    pub(crate) fn head(&self, routine: Routine) -> Head {
        if self.inner.mode.load(Ordering::Relaxed) == MODE_SCRIPTS {
            routine.head(ScriptMode::Scripts)
        } else {
            routine.head(ScriptMode::Functions)
        }
    }

    /// The hard bound on every call.
    pub fn deadline(&self) -> Duration {
        self.inner.deadline
    }

    /// Where the scripts' "now" comes from.
    pub fn time_source(&self) -> &TimeSource {
        &self.inner.time_source
    }

    /// Checks `cost` units for `key` against every rule of `set` in one script
    /// call: admitted only if every rule admits, and a denied request consumes
    /// nothing anywhere.
    ///
    /// Bad input ([`validate_key`], [`RuleSet::validate_cost`]) is refused
    /// before any I/O. A [`Timeout`](tierlimit_core::RedisFailure::Timeout)
    /// means the outcome is unknown: the script may still have run.
    ///
    /// Concurrent checks are batched: see [`check_key`](Self::check_key).
    pub async fn check(&self, key: &str, set: &RuleSet, cost: u64) -> Result<Verdict> {
        self.check_key(&CheckKey::new(key)?, set, cost).await.result
    }

    /// [`check`](Self::check) of a key validated and escaped already, with
    /// whether this check speaks for its script call.
    ///
    /// Checks are batched adaptively ([`RedisTierConfig::max_batch`]): a check
    /// that finds fewer than two calls of this tier's checks in flight sends
    /// its own call at once; checks that arrive while they are in flight
    /// queue and then go together, in arrival order, in one call of the batch
    /// script (`lua/check_batch.lua`), which decides each exactly as a lone
    /// call would have and answers one reply per check. The queue goes when a
    /// call in flight ends, at once when it holds as many checks as the
    /// calls in flight (at least four) or `max_batch`, and beside the calls
    /// in flight once its first check has waited a tenth of the deadline
    /// (so a slow or distant server leaves each check most of its deadline
    /// for its own call). A check never waits longer than its deadline
    /// (counted from its arrival): past it, it fails with a
    /// [`Timeout`](tierlimit_core::RedisFailure::Timeout) whether it was still
    /// queued or in a call. When a call fails, every check of it fails as a
    /// lone call would, and one of them has [`Checked::counts_call`] set, so a
    /// circuit breaker counts one failed call, not one per check (none on a
    /// Cluster when the call's master fails alone, while another answers).
    ///
    /// All keys of one check share a hash tag, so a batch splits by Cluster
    /// slot along check boundaries.
    ///
    /// A [striped](RuleSet::with_stripes) set's check asks its stripes in
    /// turn (each such call batched like any other), all within one deadline:
    /// see there.
    pub async fn check_key(&self, key: &CheckKey<'_>, set: &RuleSet, cost: u64) -> Checked {
        if set.stripes() > 1 {
            return self.check_striped(key, set, cost).await;
        }
        self.check_whole(key, set, cost).await
    }

    /// [`check_key`](Self::check_key) of an unstriped set, or of one stripe.
    pub(crate) async fn check_whole(
        &self,
        key: &CheckKey<'_>,
        set: &RuleSet,
        cost: u64,
    ) -> Checked {
        if let Err(e) = set.validate_cost(cost) {
            return Checked {
                result: Err(e),
                counts_call: false,
            };
        }
        // Not a call: a breaker must not count it.
        if let Some(down) = self.node_down(key.escaped()) {
            return Checked {
                result: Err(down),
                counts_call: false,
            };
        }
        let now = self.now_arg();
        let nonce = fastrand::u64(..);
        let batcher = self.batcher(key.escaped());
        if !batcher.enabled() {
            return self.check_alone(key.escaped(), set, cost, now, nonce).await;
        }
        let arrived = tokio::time::Instant::now();
        let deadline = arrived + self.inner.deadline;
        let entry = batcher.enter(|tx| Queued {
            escaped: key.escaped().to_owned(),
            set: set.clone(),
            cost,
            now,
            nonce,
            deadline,
            tx,
        });
        match entry {
            Entry::Send => {
                let _flight = Flight {
                    tier: Cow::Borrowed(self),
                    batcher,
                    checks: 1,
                };
                self.check_alone(key.escaped(), set, cost, now, nonce).await
            }
            Entry::Wait {
                mut rx,
                full,
                first,
            } => {
                if let Some(full) = full {
                    self.spawn_batch(full, batcher.into_owned());
                } else if let Some(generation) = first {
                    // Flushed at `flush_at`, or sooner when this check is
                    // dropped before: the checks queued behind it wait for it.
                    let mut starter = QueueStarter {
                        tier: self,
                        batcher: &batcher,
                        generation: Some(generation),
                    };
                    let flush_at = arrived + self.inner.deadline / QUEUE_WAIT_SHARE;
                    if let Ok(answer) = tokio::time::timeout_at(flush_at, &mut rx).await {
                        return answered(answer.ok());
                    }
                    starter.flush();
                }
                answered(
                    tokio::time::timeout_at(deadline, rx)
                        .await
                        .ok()
                        .and_then(Result::ok),
                )
            }
        }
    }

    /// One check in one call of the check script, which it speaks for.
    async fn check_alone(
        &self,
        escaped: &str,
        set: &RuleSet,
        cost: u64,
        now: u64,
        nonce: u64,
    ) -> Checked {
        let head = self.head(Routine::Check);
        let cmd = &command::check(head, set, escaped, now, cost, nonce);
        let slot = self.slot_of_check(escaped);
        let under_way = UnderWay::new(self);
        let call = self
            .call_slot(&self.inner.conn, self.inner.deadline, slot, |conn| {
                send_refused_once(conn, |c| self.run(c, cmd, slot))
            })
            .await;
        under_way.ended();
        Checked {
            counts_call: call.speaks,
            result: call
                .outcome
                .map_err(Failure::into_error)
                .and_then(|reply| parse_verdict(reply, set)),
        }
    }

    /// Whether a failed call sent to `master` (`None` on one server)
    /// speaks for the deployment to a circuit breaker (every answer does):
    /// every failure on one server; on a Cluster, not a failure of one master
    /// while another answers (see `Nodes::failing_alone`): a few in a row
    /// mark that master down instead, and one master's fault is not an
    /// outage.
    fn failure_speaks(&self, master: Option<&Master>) -> bool {
        master.is_none_or(|m| !self.inner.nodes.failing_alone(m, self.monotonic_us()))
    }

    /// Sends `batch`, drawn from `batcher`'s queue, from a task of its own
    /// (the call in flight continues meanwhile on the same connection).
    fn spawn_batch(&self, batch: Vec<Queued>, batcher: Arc<Batcher>) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // Made before the task, so the call is ended even when the
                // task is dropped unpolled (its runtime shutting down).
                let flight = Flight {
                    tier: Cow::Owned(self.clone()),
                    batcher: Cow::Owned(batcher),
                    checks: batch.len(),
                };
                runtime.spawn(async move {
                    flight.tier.send_batch(batch).await;
                    drop(flight);
                });
            }
            Err(_) => batcher.abandon(batch.len()),
        }
    }

    /// The batcher a check of `escaped` queues in: on a Cluster, its slot's
    /// master's, so a master that is slow to answer holds up only its own
    /// keys' checks (one queue for all would make every key wait behind the
    /// calls in flight to it); on one server, or before the slot map is
    /// read, the tier's.
    /// Borrowed on one server: no reference count touched per check.
    fn batcher(&self, escaped: &str) -> Cow<'_, Arc<Batcher>> {
        if self.inner.backend.is_cluster()
            && let Some(batcher) = self.inner.nodes.batcher(check_slot(escaped))
        {
            return Cow::Owned(batcher);
        }
        Cow::Borrowed(&self.inner.batcher)
    }

    /// One call for the checks of `batch` whose callers still wait, under the
    /// earliest of their deadlines; every one gets its answer. On a Cluster,
    /// one call per hash slot of the batch, all sent at once, each with its
    /// own [`Checked::counts_call`] vote (each is a call of its own node).
    async fn send_batch(&self, mut batch: Vec<Queued>) {
        let now = tokio::time::Instant::now();
        batch.retain(|q| !q.tx.is_closed() && q.deadline > now);
        if !self.inner.backend.is_cluster() {
            return self.send_group(batch, 0, now).await;
        }
        let groups = group_by_slot(&batch, |q| check_slot(&q.escaped));
        if let [(slot, _)] = groups.as_slice() {
            return self.send_group(batch, *slot, now).await;
        }
        let mut group_of = vec![0; batch.len()];
        for (g, (_, members)) in groups.iter().enumerate() {
            for &i in members {
                group_of[i] = g;
            }
        }
        let mut parts: Vec<Vec<Queued>> = groups
            .iter()
            .map(|(_, members)| Vec::with_capacity(members.len()))
            .collect();
        for (q, g) in batch.into_iter().zip(group_of) {
            parts[g].push(q);
        }
        let calls = parts
            .into_iter()
            .zip(&groups)
            .map(|(part, (slot, _))| self.send_group(part, *slot, now))
            .collect();
        join_all(calls).await;
    }

    /// One script call for `batch`, whose checks' keys are all in `slot` on a
    /// Cluster (any slot on one server); see [`send_batch`](Self::send_batch).
    async fn send_group(&self, batch: Vec<Queued>, slot: u16, now: tokio::time::Instant) {
        let Some(deadline) = batch.iter().map(|q| q.deadline).min() else {
            return;
        };
        // The call ends a little before its checks' deadlines, so that its
        // answer, a timeout included, reaches them before their own timers
        // fire and one of them speaks for the call (a check that gave up
        // speaks for nothing): else a hung server's batches went unreported.
        let left = deadline.saturating_duration_since(now);
        let budget = if left > 2 * ANSWER_MARGIN {
            left - ANSWER_MARGIN
        } else {
            left
        };
        let began = tokio::time::Instant::now();
        let speaks;
        let results: Vec<Result<Verdict>> = if let [q] = batch.as_slice() {
            let head = self.head(Routine::Check);
            let cmd = &command::check(head, &q.set, &q.escaped, q.now, q.cost, q.nonce);
            let call = self
                .call_slot(&self.inner.conn, budget, slot, |conn| {
                    send_refused_once(conn, |c| self.run(c, cmd, slot))
                })
                .await;
            speaks = call.speaks;
            vec![
                call.outcome
                    .map_err(Failure::into_error)
                    .and_then(|r| parse_verdict(r, &q.set)),
            ]
        } else {
            let cmd = &command::check_batch(self.head(Routine::CheckBatch), &batch);
            let call = self
                .call_slot(&self.inner.conn, budget, slot, |conn| {
                    send_refused_once(conn, |c| self.run(c, cmd, slot))
                })
                .await;
            speaks = call.speaks;
            match call
                .outcome
                .map(|r| parse_batch(r, batch.iter().map(|q| &q.set)))
            {
                Ok(Ok(results)) => results,
                Ok(Err(what)) => {
                    let what = format!("batch script answered {what} for {} checks", batch.len());
                    batch
                        .iter()
                        .map(|_| {
                            Err(Error::redis(
                                tierlimit_core::RedisFailure::MalformedReply,
                                Some(what.clone().into()),
                            ))
                        })
                        .collect()
                }
                Err(failure) => batch.iter().map(|_| Err(failure.to_error())).collect(),
            }
        };
        let reports = reporter(&results);
        let counts = results.get(reports).is_some_and(|r| r.is_ok() || speaks);
        for (i, (q, result)) in batch.into_iter().zip(results).enumerate() {
            let reporter = counts && i == reports;
            // A caller that gave up meanwhile dropped its receiver: the
            // call's report, if it carried it, goes to the hook.
            if let Err(unsent) = q.tx.send(Checked {
                result,
                counts_call: reporter,
            }) && reporter
            {
                self.unheard(Unheard::Ended {
                    latency: began.elapsed(),
                    result: unsent.result.map(drop),
                });
            }
        }
    }

    /// Checks independent requests in one pipelined round trip, under one
    /// deadline.
    ///
    /// `Err` means nothing came back: the connection failed or the deadline
    /// passed before any reply (some checks may still have run on the server).
    /// Otherwise each request has its own result, in order: bad input, a
    /// per-command error (`-OOM`, say), or its verdict.
    ///
    /// Pipelined scripts are not reloaded by redis-rs. When the server lost the
    /// script, it is loaded once and only the checks that failed with
    /// `NOSCRIPT` are sent again; a check that ran is never sent twice. If the
    /// deadline passes during that second round, the checks of the first round
    /// keep their verdicts and the others get a timeout.
    ///
    /// A [striped](RuleSet::with_stripes) check asks one stripe in the
    /// pipeline; when that stripe denies it, the other stripes are asked
    /// after the pipeline, one call each, within the same deadline.
    pub async fn check_many(&self, checks: &[CheckRequest<'_>]) -> Result<Vec<Result<Verdict>>> {
        let deadline = tokio::time::Instant::now() + self.inner.deadline;
        // Each check's first stripe; empty (no allocation) when none is striped.
        let first: Vec<u32> = if checks.iter().any(|c| c.set.stripes() > 1) {
            checks.iter().map(|c| first_stripe(c.set)).collect()
        } else {
            Vec::new()
        };
        let first_of = |i: usize| first.get(i).copied().unwrap_or(0);
        let mut results: Vec<Option<Result<Verdict>>> = Vec::with_capacity(checks.len());
        let mut sent = Vec::new();
        let mut cmds = Vec::with_capacity(checks.len());
        let cluster = self.inner.backend.is_cluster();
        for (i, check) in checks.iter().enumerate() {
            match self.check_cmd(check.key, check.set, check.cost, first_of(i)) {
                Ok(cmd) => {
                    let slot = if cluster {
                        check_slot(&stripe_key(&escape_key(check.key), first_of(i)))
                    } else {
                        0
                    };
                    cmds.push((cmd, slot));
                    sent.push(i);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        if !cmds.is_empty() {
            let (replies, failures, _) = self.pipelined(&self.inner.conn, cmds).await;
            if replies.iter().all(Option::is_none)
                && let Some(Some(failure)) = failures.first()
            {
                return Err(failure.to_error());
            }
            for ((i, reply), failure) in sent.iter().zip(replies).zip(failures) {
                results[*i] = Some(match reply {
                    Some(Value::ServerError(e)) => Err(classify_server(e)),
                    Some(value) => parse_verdict(value, stripe_set(checks[*i].set, first_of(*i))),
                    None => Err(failure.map_or_else(timeout, Failure::into_error)),
                });
            }
        }
        let results = results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(timeout())))
            .collect();
        if first.is_empty() {
            return Ok(results);
        }
        Ok(self
            .finish_striped_many(checks, &first, results, deadline)
            .await)
    }

    /// Sends `PING` under the deadline (connecting first if needed).
    pub async fn ping(&self) -> Result<()> {
        let pong: String = self
            .call(|conn| {
                send_refused_once(conn, |mut c| async move {
                    redis::cmd("PING").query_async(&mut c).await
                })
            })
            .await
            .map_err(Failure::into_error)?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(Error::redis(
                tierlimit_core::RedisFailure::MalformedReply,
                Some(format!("PING answered {pong:?}").into()),
            ))
        }
    }

    /// Records `instance_id` as alive for `ttl` in the sorted set `zset_key`
    /// (used as given, not escaped), drops the ids whose time is up, and
    /// answers how many instances are alive, this one included.
    ///
    /// Both strings are checked like user keys ([`validate_key`]); `ttl` must be
    /// at least 1 ms ([`Error::InvalidConfig`] otherwise).
    pub async fn heartbeat(&self, zset_key: &str, instance_id: &str, ttl: Duration) -> Result<u64> {
        validate_key(zset_key)?;
        validate_key(instance_id)?;
        let ttl_us = u64::try_from(ttl.as_micros())
            .ok()
            .filter(|us| (1_000..=MAX_EXACT).contains(us))
            .ok_or_else(|| {
                invalid(format!(
                    "heartbeat ttl must be 1 ms to 2^53 µs (got {ttl:?})"
                ))
            })?;
        let mut cmd = Cmd::new();
        self.head(Routine::Heartbeat).write(&mut cmd);
        cmd.arg(1)
            .arg(zset_key)
            .arg(self.now_arg())
            .arg(instance_id)
            .arg(ttl_us);
        let cmd = &cmd;
        let slot = if self.inner.backend.is_cluster() {
            key_slot(zset_key.as_bytes())
        } else {
            0
        };
        let reply = self
            .call_slot(&self.inner.conn, self.inner.deadline, slot, |conn| {
                send_refused_once(conn, |c| self.run(c, cmd, slot))
            })
            .await
            .outcome
            .map_err(Failure::into_error)?;
        redis::from_redis_value(reply).map_err(|e| {
            Error::redis(
                tierlimit_core::RedisFailure::MalformedReply,
                Some(format!("heartbeat script reply: {e}").into()),
            )
        })
    }

    /// Writes outage-ledger entries back to Redis through
    /// `lua/reconcile.lua`, in one pipelined round trip on a connection of
    /// their own, under the deadline, debiting each rule's key as if the
    /// requests had gone to Redis.
    ///
    /// Each write-back's id (checked like a user key) makes it idempotent:
    /// each key remembers the ids applied to it, so re-sending one whose
    /// outcome was unknown (a timeout) changes nothing twice.
    ///
    /// `Err` means the call failed as a whole (connection, deadline): any of
    /// them may have run, and all may be re-sent under their ids. Otherwise
    /// each write-back has its own outcome, in order: an error there is one
    /// that may pass (`-OOM`, say); one that cannot is [`Written::Refused`].
    ///
    /// On a Cluster the write-backs go in one pipeline per hash slot, all at
    /// once; `Err` then means every one of them failed as a whole, and a
    /// write-back whose pipeline alone failed has that pipeline's error.
    pub async fn reconcile(&self, writes: &[WriteBack<'_>]) -> Result<Vec<Result<Written>>> {
        self.reconcile_counted(writes).await.result
    }

    /// As [`reconcile`](Self::reconcile), and whether a circuit breaker
    /// should hear of the call ([`Checked::counts_call`]): not when a
    /// pipeline failed on one Cluster master while another answers (that
    /// master's fault, as for a check: a reconciler that counted it would
    /// open the breaker for every key while the master's keys' write-backs
    /// wait for its replica), and not for bad input.
    pub async fn reconcile_counted(
        &self,
        writes: &[WriteBack<'_>],
    ) -> Checked<Vec<Result<Written>>> {
        let (cmds, parts) = match self.writeback_cmds(writes) {
            Ok(built) => built,
            Err(e) => {
                return Checked {
                    result: Err(e),
                    counts_call: false,
                };
            }
        };
        if cmds.is_empty() {
            return Checked {
                result: Ok(Vec::new()),
                counts_call: false,
            };
        }
        let deadline = tokio::time::Instant::now() + self.inner.deadline;
        let sent = self.send_writebacks(cmds).await;
        let result = match sent.result {
            Ok(replies) => Ok(self.outcomes(writes, parts, replies, deadline).await),
            Err(e) => Err(e),
        };
        Checked {
            result,
            counts_call: sent.counts_call,
        }
    }

    /// Sends `cmds`, reconcile script calls each with its keys' slot, on the
    /// reconcile batches' connection under the deadline (one pipeline per
    /// slot on a Cluster): each command's reply, or the failure of its
    /// pipeline; `Err` when every pipeline failed.
    pub(crate) async fn send_writebacks(
        &self,
        cmds: Vec<(Cmd, u16)>,
    ) -> Checked<Vec<Result<Value>>> {
        let (replies, failures, counts_call) = self.pipelined(&self.inner.bulk, cmds).await;
        if failures.iter().all(Option::is_some)
            && let Some(Some(failure)) = failures.first()
        {
            return Checked {
                result: Err(failure.to_error()),
                counts_call,
            };
        }
        let result = Ok(replies
            .into_iter()
            .zip(failures)
            .map(|(reply, failure)| match (reply, failure) {
                (Some(reply), _) => Ok(reply),
                (None, failure) => Err(failure.map_or_else(timeout, Failure::into_error)),
            })
            .collect());
        Checked {
            result,
            counts_call,
        }
    }

    /// Sends `cmds` (script calls, each with its keys' slot) pipelined on the
    /// connection in `conn`, under the deadline, reloading what the server
    /// lost (see [`pipeline_routines`](Self::pipeline_routines)): one pipeline on one server; on a Cluster one
    /// per slot, all sent at once. Answers each command's reply (`None` when
    /// none came), the failure of its pipeline, if it failed, and whether a
    /// circuit breaker should hear of the call: unless a pipeline failed on
    /// one Cluster master alone (see [`SlotCall::speaks`]).
    async fn pipelined(
        &self,
        conn: &ArcSwapOption<Conn>,
        cmds: Vec<(Cmd, u16)>,
    ) -> (Vec<Option<Value>>, Vec<Option<Failure>>, bool) {
        let count = cmds.len();
        if !self.inner.backend.is_cluster() {
            let mut pipe = Pipeline::with_capacity(count);
            for (cmd, _) in cmds {
                pipe.add_command(cmd);
            }
            let mut replies: Vec<Option<Value>> = vec![None; count];
            let outcome = self
                .call_on(conn, self.inner.deadline, |c| {
                    self.pipeline_routines(c, &pipe, &mut replies, None)
                })
                .await;
            return (replies, vec![outcome.err(); count], true);
        }
        let groups = group_by_slot(&cmds, |(_, slot)| *slot);
        let mut group_of = vec![0; count];
        for (g, (_, members)) in groups.iter().enumerate() {
            for &i in members {
                group_of[i] = g;
            }
        }
        let mut pipes: Vec<Pipeline> = groups
            .iter()
            .map(|(_, members)| Pipeline::with_capacity(members.len()))
            .collect();
        for ((cmd, _), &g) in cmds.into_iter().zip(&group_of) {
            pipes[g].add_command(cmd);
        }
        let calls = groups
            .iter()
            .zip(&pipes)
            .map(|((slot, _), pipe)| async move {
                let mut replies: Vec<Option<Value>> = vec![None; pipe.len()];
                let call = self
                    .call_slot(conn, self.inner.deadline, *slot, |c| {
                        self.pipeline_routines(c, pipe, &mut replies, Some(*slot))
                    })
                    .await;
                (replies, call.outcome.err(), call.speaks)
            })
            .collect();
        let mut answers = join_all(calls).await;
        let speaks = answers.iter().all(|(_, _, speaks)| *speaks);
        let mut replies = vec![None; count];
        let mut failures = vec![None; count];
        for ((_, members), (group_replies, failure, _)) in groups.iter().zip(&mut answers) {
            for (&i, reply) in members.iter().zip(group_replies.iter_mut()) {
                replies[i] = reply.take();
                failures[i] = failure.clone();
            }
        }
        (replies, failures, speaks)
    }

    /// [`check`](Self::check), with this key's pending write-backs sent first
    /// in the same pipeline on the checks' connection, so Redis applies them
    /// before it decides (it runs one connection's commands in order): a key
    /// never gets its Redis quota before what it used locally is counted.
    ///
    /// `Err` when the call failed as a whole or the check itself failed (the
    /// write-backs may have run: re-send them under their ids).
    pub async fn check_after(
        &self,
        key: &str,
        set: &RuleSet,
        cost: u64,
        writes: &[WriteBack<'_>],
    ) -> Result<(Verdict, Vec<Result<Written>>)> {
        self.check_after_key(&CheckKey::new(key)?, set, cost, writes)
            .await
            .result
    }

    /// [`check_after`](Self::check_after) of a key validated and escaped
    /// already, with whether a circuit breaker should count it
    /// ([`Checked::counts_call`]: every call on one server; on a Cluster,
    /// not a failure of the key's master while another master answers).
    /// Never batched with other checks: the write-backs and the check go in
    /// one pipeline of their own.
    pub async fn check_after_key(
        &self,
        key: &CheckKey<'_>,
        set: &RuleSet,
        cost: u64,
        writes: &[WriteBack<'_>],
    ) -> Checked<(Verdict, Vec<Result<Written>>)> {
        // On a Cluster, the master the write-backs and the check go to (they
        // share the key's hash tag); `None` on one server.
        let master = self.sent_to(self.slot_of_check(key.escaped()));
        let (result, vote) = if self.inner.backend.is_cluster() {
            self.check_after_on_cluster(key, set, cost, writes).await
        } else {
            self.check_after_on_one(key, set, cost, writes).await
        };
        let counts_call = match &result {
            Ok(_) => true,
            Err(e) if !was_sent(e) => false,
            // The vote of the call that failed, when known (none when an
            // abandoned call reported itself); else the master's.
            Err(_) => vote.unwrap_or_else(|| self.failure_speaks(master.as_deref())),
        };
        Checked {
            result,
            counts_call,
        }
    }

    /// [`check_after_key`](Self::check_after_key) on one server: the
    /// write-backs and the check in one pipeline (with a striped
    /// write-back's spills), then a striped check's further stripes, all by
    /// one deadline. Also answers the vote of the call that failed, when
    /// known: none when the deadline dropped a call of this check's own,
    /// which reports itself as abandoned ([`UnderWay`]).
    async fn check_after_on_one(
        &self,
        key: &CheckKey<'_>,
        set: &RuleSet,
        cost: u64,
        writes: &[WriteBack<'_>],
    ) -> (Result<(Verdict, Vec<Result<Written>>)>, Option<bool>) {
        if let Err(e) = set.validate_cost(cost) {
            return (Err(e), None);
        }
        let deadline = tokio::time::Instant::now() + self.inner.deadline;
        // A striped set's check asks one stripe here, the others after.
        let stripe = first_stripe(set);
        let check = command::check(
            self.head(Routine::Check),
            stripe_set(set, stripe),
            key.striped(stripe).escaped(),
            self.now_arg(),
            cost,
            fastrand::u64(..),
        );
        let (mut pipe, parts) = match self.writeback_pipeline(writes, 1) {
            Ok(made) => made,
            Err(e) => return (Err(e), None),
        };
        pipe.add_command(check);
        let under_way = UnderWay::new(self);
        let first = async {
            let mut replies: Vec<Option<Value>> = vec![None; pipe.len()];
            // A server that restarted since holds the check script (every
            // check loads it) but maybe not the reconcile script: the
            // pipeline would get NOSCRIPT for the write-backs only, run the
            // check, and re-send them after it. So the reconcile script is
            // loaded first, once per connection and again after any call
            // met NOSCRIPT or failed on its connection, under the same
            // deadline as the pipeline. (The library holds both: with
            // Functions, both are there or neither.)
            let note = &self.inner.reconcile_loaded;
            let scripts = self.inner.mode.load(Ordering::Relaxed) == MODE_SCRIPTS;
            self.call(|conn| async {
                let seen = note.read();
                if scripts && !LoadedNote::is_loaded(seen) {
                    send_refused_once(conn.clone(), |mut c| async move {
                        RECONCILE.load_async(&mut c).await
                    })
                    .await?;
                    note.loaded(seen);
                }
                self.pipeline_routines(conn, &pipe, &mut replies, None)
                    .await
            })
            .await
            .map_err(Failure::into_error)?;
            let check = match replies.pop().flatten() {
                Some(Value::ServerError(e)) => Err(classify_server(e)),
                Some(reply) => parse_verdict(reply, stripe_set(set, stripe)),
                None => Err(timeout()),
            };
            let replies = replies.into_iter().map(|r| r.ok_or_else(timeout));
            // A striped write-back's spills are round trips of their own.
            let written = self.outcomes(writes, parts, replies, deadline).await;
            Ok((check, written))
        };
        let (check, written) = match tokio::time::timeout_at(deadline, first).await {
            Ok(Ok(first)) => {
                under_way.ended();
                first
            }
            Ok(Err(e)) => {
                under_way.ended();
                return (Err(e), Some(true));
            }
            // `under_way`, dropped unended, reports the call.
            Err(_) => return (Err(timeout()), Some(false)),
        };
        let checked = Checked {
            result: check,
            counts_call: true,
        };
        let done = self
            .continue_striped(key, set, cost, stripe, checked, deadline)
            .await;
        (
            done.result.map(|verdict| (verdict, written)),
            Some(done.counts_call),
        )
    }

    /// [`check_after_key`](Self::check_after_key) on a Cluster: the write-backs
    /// (grouped by slot, as [`reconcile`](Self::reconcile) sends them) and
    /// then the check, one after the other, both within one deadline. Two
    /// round trips instead of one pipeline: the write-backs reach their
    /// nodes, scripts reloaded, before the check is sent. Also answers the
    /// check's own [`Checked::counts_call`] once it was answered, and none
    /// when the deadline dropped a call (which reports itself as abandoned).
    async fn check_after_on_cluster(
        &self,
        key: &CheckKey<'_>,
        set: &RuleSet,
        cost: u64,
        writes: &[WriteBack<'_>],
    ) -> (Result<(Verdict, Vec<Result<Written>>)>, Option<bool>) {
        let mut check_vote = None;
        let both = async {
            set.validate_cost(cost)?;
            if let Some(down) = self.node_down(key.escaped()) {
                return Err(down);
            }
            let writing = UnderWay::new(self);
            let written = self.reconcile(writes).await;
            writing.ended();
            let written = written?;
            let checked = self.check_key(key, set, cost).await;
            check_vote = Some(checked.counts_call);
            Ok((checked.result?, written))
        };
        match tokio::time::timeout(self.inner.deadline, both).await {
            Ok(result) => (result, check_vote),
            // The call it dropped (the write-backs', or the check's own)
            // reports itself as abandoned.
            Err(_) => (Err(timeout()), Some(false)),
        }
    }

    /// The write-backs' `EVALSHA`s, each with its keys' hash slot (see
    /// [`writeback_into`](Self::writeback_into)).
    fn writeback_cmds(&self, writes: &[WriteBack<'_>]) -> Result<(Vec<(Cmd, u16)>, Parts)> {
        let mut cmds = Vec::with_capacity(writes.len());
        let parts = self.writeback_into(writes, |cmd, key| {
            cmds.push((cmd, self.slot_of_key(key)));
        })?;
        Ok((cmds, parts))
    }

    /// A pipeline of the write-backs' `EVALSHA`s, with room for `more`
    /// commands after them (see [`writeback_into`](Self::writeback_into)).
    fn writeback_pipeline(
        &self,
        writes: &[WriteBack<'_>],
        more: usize,
    ) -> Result<(Pipeline, Parts)> {
        let mut pipe = Pipeline::with_capacity(writes.len() + more);
        let parts = self.writeback_into(writes, |cmd, _| {
            pipe.add_command(cmd);
        })?;
        Ok((pipe, parts))
    }

    /// Hands `add` the write-backs' `EVALSHA`s, each with the storage key it
    /// writes; when any is striped, answers the commands of each write-back
    /// (one per stripe it is spread over), `None` when none is (one command
    /// each), so unstriped write-backs allocate nothing more.
    fn writeback_into(
        &self,
        writes: &[WriteBack<'_>],
        mut add: impl FnMut(Cmd, &str),
    ) -> Result<Parts> {
        let (now_arg, local_now_us) = (self.now_arg(), self.local_now_us());
        let head = self.head(Routine::Reconcile);
        let mut parts = writes
            .iter()
            .any(|w| w.entry.stripes > 1)
            .then(|| Vec::with_capacity(writes.len()));
        for w in writes {
            validate_key(w.id)?;
            match &mut parts {
                Some(parts) => parts.push(add_reconcile_cmds(
                    &mut add,
                    head,
                    w.entry,
                    w.id,
                    now_arg,
                    local_now_us,
                )),
                None => add(
                    reconcile_cmd(head, w.entry, w.id, now_arg, local_now_us),
                    &w.entry.storage_key,
                ),
            }
        }
        Ok(parts)
    }

    /// Removes `instance_id` from the heartbeat set `zset_key` (when an
    /// instance shuts down, so the others widen their shares at once rather
    /// than after the instance TTL).
    pub async fn leave(&self, zset_key: &str, instance_id: &str) -> Result<()> {
        validate_key(zset_key)?;
        validate_key(instance_id)?;
        let _: i64 = self
            .call(|conn| {
                send_refused_once(conn, |mut c| async move {
                    redis::cmd("ZREM")
                        .arg(zset_key)
                        .arg(instance_id)
                        .query_async(&mut c)
                        .await
                })
            })
            .await
            .map_err(Failure::into_error)?;
        Ok(())
    }

    /// Forgets the current connections (the checks' and the reconcile
    /// batches'): the next call connects afresh, within its deadline.
    ///
    /// redis-rs matches replies to requests in order. A socket that lived
    /// through a blackhole has sent requests that will never be answered, so
    /// once traffic flows again every later call would receive an earlier
    /// call's reply and time out. The hybrid limiter calls this before each
    /// probe, so the probe, and the calls after a successful one, use a socket
    /// with nothing in flight.
    pub fn drop_connection(&self) {
        self.inner.conn.store(None);
        self.inner.bulk.store(None);
        self.inner.reconcile_loaded.forget();
        self.inner.mode.store(MODE_UNKNOWN, Ordering::Relaxed);
    }

    /// Starts building a fresh connection in the background and swaps it in
    /// once it answers `PING`; calls keep using the current one until then.
    ///
    /// A deadline passing never makes redis-rs drop a connection, so against a
    /// hung server (SIGSTOP, a blackholed route) every call would keep paying
    /// the full deadline on the dead socket: the circuit breaker calls this
    /// after some consecutive timeouts. If the replacement cannot connect
    /// within the connect timeout plus the deadline (on a Cluster, its
    /// `PING` goes to a master that is not down), the current connection
    /// stays. Returns false when a replacement is already under way. Outside
    /// a Tokio runtime it only drops the current connection, so the next call
    /// makes a new one. The reconcile batches' connection is dropped at once
    /// either way: nothing waits on it, and the next batch connects afresh.
    pub fn replace_connection(&self) -> bool {
        if self.inner.replacing.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.inner.bulk.store(None);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.conn.store(None);
            self.inner.replaced.fetch_add(1, Ordering::Relaxed);
            self.inner.replacing.store(false, Ordering::Release);
            return true;
        };
        let inner = Arc::clone(&self.inner);
        runtime.spawn(async move {
            let _done = ClearOnDrop(&inner.replacing);
            let connect = async {
                let fresh = inner.backend.connect_lazy(&inner.nodes)?;
                fresh.clone().ping(None).await?;
                Ok::<_, RedisError>(fresh)
            };
            match tokio::time::timeout(inner.replace_budget, connect).await {
                Ok(Ok(fresh)) => {
                    inner.conn.store(Some(Arc::new(fresh)));
                    inner.mode.store(MODE_UNKNOWN, Ordering::Relaxed);
                    inner.reconcile_loaded.forget();
                    inner.replaced.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("replaced the Redis connection");
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "could not replace the Redis connection"),
                Err(_) => tracing::warn!(
                    budget = ?inner.replace_budget,
                    "could not replace the Redis connection in time"
                ),
            }
        });
        true
    }

    /// How many times [`replace_connection`](Self::replace_connection) has
    /// swapped in a fresh connection (for metrics, and for tests to wait on).
    pub fn connections_replaced(&self) -> u64 {
        self.inner.replaced.load(Ordering::Relaxed)
    }

    /// Validates a check and builds its `EVALSHA` (see `lua/check.lua`) for
    /// stripe `stripe` of `set` (0 when it is not striped).
    fn check_cmd(&self, key: &str, set: &RuleSet, cost: u64, stripe: u32) -> Result<Cmd> {
        validate_key(key)?;
        set.validate_cost(cost)?;
        Ok(command::check(
            self.head(Routine::Check),
            stripe_set(set, stripe),
            &stripe_key(&escape_key(key), stripe),
            self.now_arg(),
            cost,
            fastrand::u64(..),
        ))
    }

    /// On a Cluster, when the master of `escaped`'s slot failed a call
    /// moments ago: the error a check of it answers at once, unsent.
    fn node_down(&self, escaped: &str) -> Option<Error> {
        if !self.inner.backend.is_cluster() {
            return None;
        }
        let slot = check_slot(escaped);
        let addr = self.inner.nodes.down(slot, self.monotonic_us())?;
        Some(Error::redis(
            RedisFailure::NodeDown,
            Some(format!("master {addr} of slot {slot} failed a call moments ago").into()),
        ))
    }

    /// A call sent through `conn` to Cluster master `master` failed: when
    /// the fault is the node's (no answer, refused, lost, or the cluster
    /// moving the slot), it counts against that master (see `nodes.rs`: a
    /// few in a row mark it down for [`NODE_DOWN_FOR`], and its connection
    /// is dropped) and the slot map is read again. Any other error reply
    /// (`WRONGTYPE`, `-OOM`, `BUSY`) is the master's answer, as a success
    /// is: its failures in a row start again.
    fn node_failed(&self, conn: &ArcSwapOption<Conn>, master: &Master, failure: &Failure) {
        if matches!(
            failure.kind(),
            RedisFailure::Timeout
                | RedisFailure::ConnectionRefused
                | RedisFailure::ConnectionLost
                | RedisFailure::ClusterUnavailable
                | RedisFailure::ReadOnly
                | RedisFailure::Loading
        ) {
            if let Some(addr) = self.inner.nodes.failed(master, self.monotonic_us())
                && let Some(conn) = conn.load().as_deref()
            {
                conn.forget(addr);
            }
            self.refresh_slots();
        } else if matches!(failure, Failure::Redis(e) if e.code().is_some()) {
            self.inner.nodes.succeeded(master);
        }
    }

    /// On a Cluster, the master a call for `slot` sent now goes to, which
    /// its outcome counts for; `None` on one server (or before the slot map
    /// is read).
    fn sent_to(&self, slot: u16) -> Option<Arc<Master>> {
        if self.inner.backend.is_cluster() {
            self.inner.nodes.master_of(slot)
        } else {
            None
        }
    }

    /// Reads the slot map (`CLUSTER SLOTS`, from any node) in a task of its
    /// own, and again every [`SLOTS_REFRESH_EVERY`] while a master that serves
    /// slots is down, so a promoted replica is asked as soon as the cluster
    /// names it. One such task at a time; it ends when the tier is dropped.
    fn refresh_slots(&self) {
        if self.inner.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.refreshing.store(false, Ordering::Release);
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let tier = RedisTier { inner };
                if let Ok(Some(map)) = tier.slot_map(None).await {
                    tier.settle_disputes(&map).await;
                    tier.inner.nodes.replace(map, tier.monotonic_us());
                }
                let busy = |tier: &RedisTier| tier.inner.nodes.any_down(tier.monotonic_us());
                if !busy(&tier) {
                    tier.inner.refreshing.store(false, Ordering::Release);
                    // A master marked down since the check above finds the
                    // flag set and spawns nothing: take the flag back.
                    if !busy(&tier) || tier.inner.refreshing.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
                drop(tier);
                tokio::time::sleep(SLOTS_REFRESH_EVERY).await;
            }
        });
    }

    /// The slot map `CLUSTER SLOTS` answers, read from the master of `slot`,
    /// or from any master (any seed before the first map); `None` when the
    /// reply has another shape.
    async fn slot_map(&self, slot: Option<u16>) -> std::result::Result<Option<SlotMap>, Failure> {
        let reply = self
            .call(|conn| async move {
                let mut conn = match slot {
                    Some(slot) => conn.at(slot),
                    None => conn,
                };
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
            })
            .await?;
        Ok(SlotMap::from_cluster_slots(
            &reply,
            self.inner.batcher.max(),
        ))
    }

    /// Asks each master that answers and that `fresh` would take slots from
    /// ([`Nodes::disputes`]) for its own map, all at once, each within the
    /// deadline. One that names another master for its slot gave them up;
    /// one whose call fails has that failure counted against it (see
    /// [`node_failed`](Self::node_failed)). Either way the next map takes its
    /// slots. So a master that failed over while the tier sent it nothing is
    /// left before a check goes to it, and a stale reader's map still
    /// takes nothing from a master that serves its slots.
    async fn settle_disputes(&self, fresh: &SlotMap) {
        let nodes = &self.inner.nodes;
        let asks = nodes
            .disputes(fresh, self.monotonic_us())
            .into_iter()
            .map(|slot| async move {
                let master = nodes.master_of(slot);
                match self.slot_map(Some(slot)).await {
                    Ok(Some(own)) => nodes.heard_from(slot, &own),
                    Ok(None) => {}
                    Err(failure) => {
                        if let Some(master) = master {
                            self.node_failed(&self.inner.conn, &master, &failure);
                        }
                    }
                }
            })
            .collect();
        join_all(asks).await;
    }

    /// µs on the monotonic clock the down marks are kept in.
    fn monotonic_us(&self) -> u64 {
        self.inner.nodes.now_us()
    }

    /// The hash slot of storage key `key` on a Cluster; 0 on one server,
    /// where slots mean nothing (and cost nothing).
    pub(crate) fn slot_of_key(&self, key: &str) -> u16 {
        if self.inner.backend.is_cluster() {
            key_slot(key.as_bytes())
        } else {
            0
        }
    }

    /// The hash slot of a check of `escaped` on a Cluster; 0 on one server,
    /// where slots mean nothing (and cost nothing).
    fn slot_of_check(&self, escaped: &str) -> u16 {
        if self.inner.backend.is_cluster() {
            check_slot(escaped)
        } else {
            0
        }
    }

    /// This process's idea of now (µs since the epoch): the injected clock in
    /// client-time mode, else the system clock.
    pub(crate) fn local_now_us(&self) -> u64 {
        match &self.inner.time_source {
            TimeSource::Client(clock) => clock.unix_micros(),
            TimeSource::Server => self.inner.local_clock.unix_micros(),
        }
    }

    /// ARGV "now": 0 asks the script for the server's TIME.
    pub(crate) fn now_arg(&self) -> u64 {
        match &self.inner.time_source {
            TimeSource::Server => 0,
            // 0 would mean server time: a clock at the epoch is a broken clock anyway.
            TimeSource::Client(clock) => clock.unix_micros().max(1),
        }
    }

    /// Runs `op` on the checks' connection (made now if there is none yet),
    /// all under the deadline.
    async fn call<T, F, Fut>(&self, op: F) -> std::result::Result<T, Failure>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.call_on(&self.inner.conn, self.inner.deadline, op)
            .await
    }

    /// Runs `op` on the connection in `slot` (made now if there is none yet),
    /// all within `budget` (at most the deadline).
    async fn call_on<T, F, Fut>(
        &self,
        slot: &ArcSwapOption<Conn>,
        budget: Duration,
        op: F,
    ) -> std::result::Result<T, Failure>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let work = async {
            let conn = self.connection(slot)?;
            op(conn).await
        };
        let outcome = match tokio::time::timeout(budget, work).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(Failure::Redis(e)),
            Err(_) => Err(Failure::Timeout),
        };
        if let Err(failure) = &outcome
            && matches!(
                failure.kind(),
                RedisFailure::ConnectionRefused | RedisFailure::ConnectionLost
            )
        {
            // The server may have restarted, its scripts lost: a restart
            // breaks every connection, and another instance may meet the
            // NOSCRIPT that would have told this one.
            self.inner.reconcile_loaded.forget();
        }
        if self.inner.nodes.take_moved() {
            self.refresh_slots();
        }
        outcome
    }

    /// [`call_on`](Self::call_on) for keys in hash `slot`: on a Cluster it
    /// goes to the slot's master, and its outcome counts for or against that
    /// master (see [`node_failed`](Self::node_failed)), the one it was sent
    /// to even when the slot has another by the time it ends.
    async fn call_slot<T, F, Fut>(
        &self,
        conn: &ArcSwapOption<Conn>,
        budget: Duration,
        slot: u16,
        op: F,
    ) -> SlotCall<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let master = self.sent_to(slot);
        let outcome = self.call_on(conn, budget, |c| op(c.at(slot))).await;
        if let Some(master) = master.as_deref() {
            match &outcome {
                Ok(_) => self.inner.nodes.succeeded(master),
                Err(failure) => self.node_failed(conn, master, failure),
            }
        }
        SlotCall {
            speaks: outcome.is_ok() || self.failure_speaks(master.as_deref()),
            outcome,
        }
    }

    /// The connection in `slot`, created lazily (no I/O here: it connects on
    /// its first command). On a Cluster a new connection also has the slot
    /// map read, so the first failures of a master already count against it.
    fn connection(&self, slot: &ArcSwapOption<Conn>) -> RedisResult<Conn> {
        if let Some(conn) = slot.load_full() {
            return Ok((*conn).clone());
        }
        let fresh = Arc::new(self.inner.backend.connect_lazy(&self.inner.nodes)?);
        if self.inner.backend.is_cluster() {
            self.refresh_slots();
        }
        // Another call may have raced us here: keep whichever was stored first.
        let previous = slot.rcu(|current| match current {
            Some(conn) => Some(Arc::clone(conn)),
            None => Some(Arc::clone(&fresh)),
        });
        Ok(match previous {
            Some(conn) => (*conn).clone(),
            None => (*fresh).clone(),
        })
    }
}

/// How to reach `config`'s server or Cluster, with its TLS settings. Every
/// error names the URL only through [`redact_url`] and never carries its
/// password.
fn backend_for(config: &RedisTierConfig) -> Result<Backend> {
    let url = config.url.as_str();
    let bad_url = |why: &str| invalid(format!("url {}: {}", redact_url(url), scrub(why, url)));
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let tls_scheme = ["rediss", "valkeys", "rediss+cluster"]
        .iter()
        .any(|s| scheme.eq_ignore_ascii_case(s));
    if tls_scheme && !cfg!(feature = "tls") {
        return Err(bad_url(
            "rediss:// needs the `tls` feature of tierlimit-redis \
             (on by default in tierlimit and tierlimit-redis)",
        ));
    }
    if tls_scheme && url.contains('#') {
        // redis-rs reads `#insecure` as "skip certificate verification"; a
        // rate limiter's credentials must not travel to an unverified server.
        return Err(bad_url(
            "a URL fragment is refused (`#insecure` would skip certificate verification)",
        ));
    }
    let seeds = seed_urls(url).map_err(|why| bad_url(&why))?;
    let info = |node: &str| {
        node.into_connection_info()
            .map_err(|e| bad_url(&e.to_string()))
            .map(|info| info.set_tcp_settings(TcpSettings::default().set_nodelay(true)))
    };
    #[cfg(feature = "tls")]
    let certificates = tls_certificates(config, tls_scheme, &bad_url)?;
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        // Our deadline is the real bound; this only stops redis-rs from
        // waiting on its own default (500 ms) for abandoned requests.
        .set_response_timeout(Some(config.deadline))
        .set_number_of_retries(config.reconnect_retries)
        .set_min_delay(RECONNECT_MIN_DELAY)
        .set_max_delay(config.reconnect_max_delay);
    if let Some(seeds) = seeds {
        #[cfg(not(feature = "cluster"))]
        {
            let _ = seeds;
            return Err(bad_url(
                "redis+cluster:// needs the `cluster` feature of tierlimit-redis \
                 (on by default in tierlimit and tierlimit-redis)",
            ));
        }
        #[cfg(feature = "cluster")]
        {
            for node in seeds.urls() {
                info(&node)?;
            }
            let clients = crate::cluster::NodeClients::new(
                seeds.prefix,
                seeds.hosts,
                seeds.tail,
                manager_config,
                #[cfg(feature = "tls")]
                certificates,
            )
            .map_err(|e| bad_url(&e.to_string()))?;
            return Ok(Backend::Cluster(Arc::new(clients)));
        }
    }
    let info = info(url)?;
    #[cfg(feature = "tls")]
    if let Some(certificates) = certificates {
        let client = redis::Client::build_with_tls(info, certificates)
            .map_err(|e| invalid(format!("tls certificates: {}", scrub(&e.to_string(), url))))?;
        return Ok(Backend::Single {
            client,
            config: manager_config,
        });
    }
    let client = redis::Client::open(info).map_err(|e| bad_url(&e.to_string()))?;
    Ok(Backend::Single {
        client,
        config: manager_config,
    })
}

/// The certificates set for `config` (`None` when none is, so the system's
/// trust store serves), after checking they fit the URL; installs the `ring`
/// provider for any TLS URL.
#[cfg(feature = "tls")]
fn tls_certificates(
    config: &RedisTierConfig,
    tls_scheme: bool,
    bad_url: &dyn Fn(&str) -> Error,
) -> Result<Option<redis::TlsCertificates>> {
    if tls_scheme {
        install_crypto_provider();
    }
    if !config.tls.is_set() {
        return Ok(None);
    }
    if !tls_scheme {
        return Err(bad_url(
            "TLS certificates are set but the URL is not rediss://",
        ));
    }
    if let Some(pem) = &config.tls.root_pem
        && !pem.windows(11).any(|w| w == b"CERTIFICATE")
    {
        return Err(invalid(
            "tls_root_certificates: the PEM holds no certificate".into(),
        ));
    }
    Ok(Some(redis::TlsCertificates {
        client_tls: config
            .tls
            .client
            .as_ref()
            .map(|(chain, key)| redis::ClientTlsConfig {
                client_cert: chain.clone(),
                client_key: key.clone(),
            }),
        root_cert: config.tls.root_pem.clone(),
    }))
}

/// Makes `ring` rustls's process-wide provider unless one is installed already.
/// rustls picks a provider by itself only when exactly one is compiled in; if
/// another crate of the application also turns on `aws-lc-rs`, rustls would
/// panic at the first TLS connection instead.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err only when another thread installed one first: that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A queued check's outcome: no answer (a timeout) when its deadline passed
/// or its batch was dropped unsent (the runtime is shutting down).
fn answered(answer: Option<Checked>) -> Checked {
    answer.unwrap_or_else(|| Checked {
        result: Err(timeout()),
        counts_call: false,
    })
}

/// Whether `error`, a check's failure, is one of a call that was sent: not
/// bad input, and not a check answered unsent because its Cluster master is
/// down ([`NodeDown`](tierlimit_core::RedisFailure::NodeDown)).
fn was_sent(error: &Error) -> bool {
    error
        .redis_failure()
        .is_some_and(|f| f != RedisFailure::NodeDown)
}

/// What a call for one hash slot came to (see [`RedisTier::call_slot`]).
struct SlotCall<T> {
    outcome: std::result::Result<T, Failure>,
    /// Whether a circuit breaker should hear of it: every answer, and every
    /// failure but one master's alone on a Cluster (see
    /// [`RedisTier::failure_speaks`]).
    speaks: bool,
}

/// The first check of a queue, which sends it if no call has taken it by
/// the time it waited its share of the deadline, or by the time it is
/// dropped (its caller gave up), whichever is first.
struct QueueStarter<'a> {
    tier: &'a RedisTier,
    batcher: &'a Arc<Batcher>,
    generation: Option<u64>,
}

impl QueueStarter<'_> {
    /// Sends the queue beside the calls in flight, unless a call took it.
    fn flush(&mut self) {
        if let Some(generation) = self.generation.take()
            && let Some(queue) = self.batcher.flush(generation)
        {
            self.tier.spawn_batch(queue, Arc::clone(self.batcher));
        }
    }
}

impl Drop for QueueStarter<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// A call of `checks` checks in flight: when it ends, however it ends (its
/// future dropped included), the checks queued meanwhile are sent.
struct Flight<'a> {
    tier: Cow<'a, RedisTier>,
    batcher: Cow<'a, Arc<Batcher>>,
    checks: usize,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if let Some(next) = self.batcher.done(self.checks) {
            self.tier.spawn_batch(next, Arc::clone(&self.batcher));
        }
    }
}

/// A check's own call under way, in its caller's future: dropped before the
/// call ends (by the caller, or by a deadline over the whole check, which
/// then leaves the vote to it), the call would go unreported, so it is
/// handed to the [`Unheard`] hook as abandoned.
struct UnderWay<'a> {
    tier: &'a RedisTier,
    since: std::time::Instant,
    ended: bool,
}

impl<'a> UnderWay<'a> {
    fn new(tier: &'a RedisTier) -> Self {
        UnderWay {
            tier,
            since: std::time::Instant::now(),
            ended: false,
        }
    }

    /// The call ended: its check reports it.
    fn ended(mut self) {
        self.ended = true;
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.tier.unheard(Unheard::Abandoned {
                after: self.since.elapsed(),
            });
        }
    }
}

/// Whether a script is loaded on the server, as a count: odd while it is.
/// Forgetting always moves to a later even count, so a load that raced a
/// reason to forget it (its connection failed meanwhile, say) cannot mark
/// it loaded afterwards.
#[derive(Debug, Default)]
struct LoadedNote(AtomicU64);

impl LoadedNote {
    /// The note now, for [`is_loaded`](Self::is_loaded) and
    /// [`loaded`](Self::loaded).
    fn read(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn is_loaded(read: u64) -> bool {
        read & 1 == 1
    }

    /// The script was loaded after the note read `read`: loaded, unless it
    /// was forgotten since.
    fn loaded(&self, read: u64) {
        let _ = self
            .0
            .compare_exchange(read, read | 1, Ordering::AcqRel, Ordering::Acquire);
    }

    fn forget(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some((n | 1) + 1));
    }
}

/// Resets a flag when the task holding it ends, however it ends.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Sends once more when the first try was refused. A refusal comes from
/// `connect`, so nothing was sent; and redis-rs hands out a failed connection
/// attempt once more before it reconnects, so without this the first call after
/// Redis comes back would fail although Redis is up.
async fn send_refused_once<T, F, Fut>(conn: Conn, mut send: F) -> RedisResult<T>
where
    F: FnMut(Conn) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    match send(conn.clone()).await {
        Err(e) if e.is_connection_refusal() => send(conn).await,
        other => other,
    }
}

/// What a script call's reply asks for before its command is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    /// Nothing: the reply is the call's answer (a value or an error).
    Nothing,
    /// `FCALL` met `Function not found`: load the library, send it again
    /// (or, when the load is refused, send it as `EVALSHA`).
    Library(Routine),
    /// `EVALSHA` met `NOSCRIPT`: load the script, send it again.
    Script(Routine),
    /// `FCALL` cannot run here (no Functions, not allowed, or refused whole
    /// under `maxmemory`): send it as `EVALSHA`.
    AsScript(Routine),
}

impl RedisTier {
    /// What `reply`, the answer to `cmd`, needs (see [`Need`]); notes the
    /// script mode a reply proves: an `FCALL` that ran means Functions, one
    /// the server does not know or the ACL refuses means scripts. A call
    /// whose reply asks for more did not run: it is safe to send again.
    fn need(&self, cmd: &Cmd, reply: &Value) -> Need {
        let Some((routine, mode)) = Routine::of(cmd) else {
            return Need::Nothing;
        };
        if mode == ScriptMode::Scripts {
            return if is_noscript(reply) {
                // The server lost its scripts (a flush, a restart): the
                // reconcile script too, which `check_after` loads first.
                self.inner.reconcile_loaded.forget();
                Need::Script(routine)
            } else {
                Need::Nothing
            };
        }
        match function_fault(reply) {
            None => {
                let _ = self.inner.mode.compare_exchange(
                    MODE_UNKNOWN,
                    MODE_FUNCTIONS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                Need::Nothing
            }
            Some(FunctionFault::Missing) => Need::Library(routine),
            Some(FunctionFault::Unsupported) => {
                self.use_scripts("FCALL refused");
                Need::AsScript(routine)
            }
            // Refused before it ran (a function that may write is refused
            // whole under maxmemory, where a script runs until its first
            // write): as a script, a denial still reads and answers.
            Some(FunctionFault::OutOfMemory) => Need::AsScript(routine),
        }
    }

    /// From now on (until the connections are dropped or replaced), calls go
    /// by `EVALSHA`.
    fn use_scripts(&self, why: &str) {
        if self.inner.mode.swap(MODE_SCRIPTS, Ordering::Relaxed) != MODE_SCRIPTS {
            tracing::info!(why, "Redis Functions not usable here: using EVALSHA");
        }
    }

    /// Loads the library where the call for `slot` ran: true when the server
    /// has it now (loaded, or loaded already by another client), false when
    /// the load was refused (the calls then go as scripts; a server without
    /// `FUNCTION` or a user not allowed it switches the tier to scripts).
    async fn load_library(&self, conn: &mut Conn, slot: Option<u16>) -> RedisResult<bool> {
        tracing::debug!("function library missing on the server: loading it");
        let refused = match conn.load_library(slot).await {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            Ok(_) => return Ok(true),
            Err(e) if e.code().is_some() => e,
            Err(e) => return Err(e),
        };
        let detail = refused.detail().unwrap_or("");
        if detail.contains("already exists") {
            return Ok(true);
        }
        if refused.code() == Some("NOPERM") || detail.starts_with("unknown") {
            self.use_scripts("FUNCTION LOAD refused");
        } else {
            tracing::warn!(error = %refused, "FUNCTION LOAD failed: this call goes by EVALSHA");
        }
        Ok(false)
    }

    /// Sends `cmd`, a call of one of the routines (`FCALL` or `EVALSHA`), and
    /// answers its reply, an error reply as an error. What the server lost
    /// is loaded and `cmd` sent again (a library on `Function not found`, a
    /// script on `NOSCRIPT`, as redis-rs's `ScriptInvocation` does); an
    /// `FCALL` that cannot run here goes as `EVALSHA` (see [`need`](Self::need)).
    /// Called directly rather than through redis-rs, so a check builds one
    /// command and no boxed future. On a Cluster what is loaded goes to the
    /// master of `slot` (`cmd`'s keys' slot), the node that answered.
    async fn run(&self, mut conn: Conn, cmd: &Cmd, slot: u16) -> RedisResult<Value> {
        let mut converted: Option<Cmd> = None;
        let mut sends = 0;
        loop {
            sends += 1;
            let current = converted.as_ref().unwrap_or(cmd);
            let reply = conn.send_packed_command(current).await?;
            let need = if sends < MAX_SENDS {
                self.need(current, &reply)
            } else {
                Need::Nothing
            };
            let as_script = match need {
                Need::Nothing => {
                    return match reply {
                        Value::ServerError(e) => Err(e.into()),
                        reply => Ok(reply),
                    };
                }
                Need::Library(_) => !self.load_library(&mut conn, Some(slot)).await?,
                Need::Script(routine) => {
                    conn.load_script(routine.script(), Some(slot)).await?;
                    false
                }
                Need::AsScript(_) => true,
            };
            if as_script {
                let script = as_evalsha(current);
                converted = script;
            }
        }
    }

    /// Pipelines `pipe` (script calls), reloading what the server lost and
    /// re-sending only the commands that did not run (see [`need`](Self::need)):
    /// a command that ran is never sent twice. Commands sent again keep
    /// their order, and the scripts of those turned into `EVALSHA` are
    /// loaded first, so they all run in that order. Replies land in
    /// `replies` as they arrive, so what came back survives a later failure.
    /// On a Cluster every command of `pipe` has its keys in `slot`.
    async fn pipeline_routines(
        &self,
        mut conn: Conn,
        pipe: &Pipeline,
        replies: &mut [Option<Value>],
        slot: Option<u16>,
    ) -> RedisResult<()> {
        let first = send_pipeline(&conn, pipe).await?;
        // The healthy case, without allocating: every command ran.
        if pipe
            .cmd_iter()
            .zip(&first)
            .all(|(cmd, reply)| self.need(cmd, reply) == Need::Nothing)
        {
            for (slot, reply) in replies.iter_mut().zip(first) {
                *slot = Some(reply);
            }
            return Ok(());
        }
        let mut again: Vec<(usize, Cmd)> = Vec::new();
        let sent: Vec<(usize, &Cmd)> = pipe.cmd_iter().enumerate().collect();
        self.sort_replies(&mut conn, &sent, first, replies, slot, &mut again, 2)
            .await?;
        for sends in 2..=MAX_SENDS {
            if again.is_empty() {
                return Ok(());
            }
            tracing::debug!(
                commands = again.len(),
                "script or library missing on the server: re-sending what did not run"
            );
            let mut resend = Pipeline::with_capacity(again.len());
            for (_, cmd) in &again {
                resend.add_command(cmd.clone());
            }
            let answers = send_pipeline(&conn, &resend).await?;
            let round = std::mem::take(&mut again);
            let sent: Vec<(usize, &Cmd)> = round.iter().map(|(i, c)| (*i, c)).collect();
            self.sort_replies(
                &mut conn,
                &sent,
                answers,
                replies,
                slot,
                &mut again,
                sends + 1,
            )
            .await?;
        }
        Ok(())
    }

    /// Puts each reply of `sent` in `replies`, or, when it asks for more
    /// (and `next_send` is within [`MAX_SENDS`]), does what it asks (a
    /// library or script loaded once for all) and adds the command to send
    /// again to `again`, in order.
    #[allow(clippy::too_many_arguments)]
    async fn sort_replies(
        &self,
        conn: &mut Conn,
        sent: &[(usize, &Cmd)],
        answers: Vec<Value>,
        replies: &mut [Option<Value>],
        slot: Option<u16>,
        again: &mut Vec<(usize, Cmd)>,
        next_send: usize,
    ) -> RedisResult<()> {
        let needs: Vec<Need> = sent
            .iter()
            .zip(&answers)
            .map(|((_, cmd), reply)| {
                if next_send <= MAX_SENDS {
                    self.need(cmd, reply)
                } else {
                    Need::Nothing
                }
            })
            .collect();
        // What ran is kept before anything is loaded: a load that fails
        // fails the call, and the replies of what ran must survive it.
        let mut answers: Vec<Option<Value>> = answers.into_iter().map(Some).collect();
        for (((i, _), reply), need) in sent.iter().zip(&mut answers).zip(&needs) {
            if *need == Need::Nothing {
                replies[*i] = reply.take();
            }
        }
        let library = if needs.iter().any(|n| matches!(n, Need::Library(_))) {
            self.load_library(conn, slot).await?
        } else {
            true
        };
        let mut scripts: Vec<Routine> = Vec::new();
        for need in &needs {
            match *need {
                Need::Script(r) | Need::AsScript(r) if !scripts.contains(&r) => scripts.push(r),
                Need::Library(r) if !library && !scripts.contains(&r) => scripts.push(r),
                _ => {}
            }
        }
        for routine in scripts {
            send_refused_once(conn.clone(), |mut c| async move {
                c.load_script(routine.script(), slot).await
            })
            .await?;
        }
        for (((i, cmd), reply), need) in sent.iter().zip(answers).zip(needs) {
            match need {
                Need::Nothing => {}
                Need::Library(_) if library => again.push((*i, (*cmd).clone())),
                Need::Script(_) => again.push((*i, (*cmd).clone())),
                Need::Library(_) | Need::AsScript(_) => match as_evalsha(cmd) {
                    Some(script) => again.push((*i, script)),
                    None => replies[*i] = reply,
                },
            }
        }
        Ok(())
    }
}

/// Why an `FCALL` did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FunctionFault {
    /// The server lacks the library (`FUNCTION FLUSH`, a new server).
    Missing,
    /// No `FCALL` here: a server older than Redis 7, or the ACL refuses it.
    Unsupported,
    /// Refused whole under `maxmemory`.
    OutOfMemory,
}

/// Why `reply`, an `FCALL`'s, says it did not run; `None` when it ran (an
/// answer or an error of its own).
fn function_fault(reply: &Value) -> Option<FunctionFault> {
    let Value::ServerError(e) = reply else {
        return None;
    };
    let detail = e.details().unwrap_or("");
    match e.code() {
        "ERR" if detail.starts_with("Function not found") => Some(FunctionFault::Missing),
        "ERR" if detail.starts_with("unknown command") => Some(FunctionFault::Unsupported),
        "NOPERM" if detail.to_ascii_lowercase().contains("'fcall'") => {
            Some(FunctionFault::Unsupported)
        }
        "OOM" => Some(FunctionFault::OutOfMemory),
        _ => None,
    }
}

/// Sends `pipe`; one reply per command, error replies included as values.
async fn send_pipeline(conn: &Conn, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
    let replies = send_refused_once(conn.clone(), |mut c| async move {
        c.send_packed_commands(pipe).await
    })
    .await?;
    if replies.len() != pipe.len() {
        return Err(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "pipeline answered a different number of replies than commands sent",
        )));
    }
    Ok(replies)
}

fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierlimit_core::Rule;
    use tierlimit_test::RedisServer;

    /// The README's Cluster numbers: a master that keeps failing is down for
    /// 500 ms at a time, and the slot map is read again every 100 ms.
    #[test]
    fn the_cluster_timings_are_the_readmes() {
        assert_eq!(NODE_DOWN_FOR, Duration::from_millis(500));
        assert_eq!(SLOTS_REFRESH_EVERY, Duration::from_millis(100));
    }

    /// A load that raced a reason to forget the script does not mark it
    /// loaded: the store of `true` after the load could overwrite a failed
    /// connection's `false`.
    #[test]
    fn a_note_forgotten_during_a_load_stays_forgotten() {
        let note = LoadedNote::default();
        let seen = note.read();
        assert!(!LoadedNote::is_loaded(seen));
        note.forget();
        note.loaded(seen);
        assert!(!LoadedNote::is_loaded(note.read()), "forgotten meanwhile");
        let seen = note.read();
        note.loaded(seen);
        assert!(LoadedNote::is_loaded(note.read()));
        note.forget();
        assert!(!LoadedNote::is_loaded(note.read()));
    }

    /// A batch's task dropped before its first poll (its runtime shut down)
    /// still ends its call. The call's count stayed, and once two had
    /// leaked no check of the tier went at once again: each waited for its
    /// queue to be flushed.
    #[test]
    fn a_batch_dropped_unpolled_ends_its_call() {
        let tier = RedisTier::new(RedisTierConfig::new("redis://127.0.0.1:1/")).expect("valid");
        let batcher = Arc::clone(&tier.inner.batcher);
        let set = RuleSet::new("b", [Rule::per_second(10).expect("valid")]).expect("valid");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        // The queued check's receiver, kept open until the end.
        let mut waiting = None;
        runtime.block_on(async {
            for _ in 0..crate::batch::EAGER_CALLS {
                let entry = batcher.enter(|_| unreachable!("a lone call is not queued"));
                assert!(matches!(entry, Entry::Send));
            }
            let Entry::Wait { rx, .. } = batcher.enter(|tx| Queued {
                escaped: "k".into(),
                set: set.clone(),
                cost: 1,
                now: 0,
                nonce: 0,
                deadline: tokio::time::Instant::now() + Duration::from_secs(1),
                tx,
            }) else {
                panic!("a third check waits");
            };
            // One lone call ends: the queue goes in a task of its own, which
            // this runtime never polls.
            let next = batcher.done(1).expect("the queued check");
            tier.spawn_batch(next, Arc::clone(&batcher));
            waiting = Some(rx);
        });
        drop(runtime);
        assert_eq!(batcher.in_flight(), 1, "the other lone call only");
        drop(waiting);
    }

    /// Without the `tls` feature a `rediss://` URL is a configuration error at
    /// construction that names the feature, not a failure at the first check.
    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_without_the_tls_feature_names_the_feature() {
        let err = RedisTier::new(RedisTierConfig::new("rediss://u:secret@127.0.0.1:1/"))
            .expect_err("rediss:// needs the tls feature");
        let shown = err.to_string();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{shown}");
        assert!(shown.contains("`tls` feature"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    /// Without the `cluster` feature a `redis+cluster://` URL is a
    /// configuration error at construction that names the feature.
    #[cfg(not(feature = "cluster"))]
    #[test]
    fn a_cluster_url_without_the_cluster_feature_names_the_feature() {
        let err = RedisTier::new(RedisTierConfig::new(
            "redis+cluster://u:secret@127.0.0.1:1,127.0.0.1:2/",
        ))
        .expect_err("redis+cluster:// needs the cluster feature");
        let shown = err.to_string();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{shown}");
        assert!(shown.contains("`cluster` feature"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    /// A bad cluster URL is a configuration error at construction naming the
    /// problem, never showing the password; a good one does no I/O.
    #[cfg(feature = "cluster")]
    #[test]
    fn cluster_urls_are_checked_at_construction() {
        for (url, says) in [
            ("redis+cluster://u:secret@/", "at least one seed node"),
            ("redis+cluster://u:secret@a:1,,b:2/", "seed node 2"),
            ("redis+cluster://u:secret@127.0.0.1:notaport/", "url "),
        ] {
            let err = RedisTier::new(RedisTierConfig::new(url)).expect_err(url);
            let shown = err.to_string();
            assert!(matches!(err, Error::InvalidConfig { .. }), "{shown}");
            assert!(shown.contains(says), "{shown}");
            assert!(!shown.contains("secret"), "{shown}");
        }
        let tier = RedisTier::new(RedisTierConfig::new(
            "redis+cluster://u:secret@127.0.0.1:1,127.0.0.1:2/",
        ))
        .expect("a valid cluster URL, nothing listening");
        let shown = format!("{tier:?}");
        assert!(
            shown.contains("cluster of 127.0.0.1:1,127.0.0.1:2"),
            "{shown}"
        );
        assert!(!shown.contains("secret"), "{shown}");
        assert!(tier.is_cluster());
        let key = CheckKey::new("foo").expect("valid");
        assert_eq!(tier.slot_of(&key), Some(12182), "CLUSTER KEYSLOT foo");
        let braces = CheckKey::new("a{b}").expect("valid");
        assert_eq!(
            tier.slot_of(&braces),
            Some(crate::cluster::key_slot(b"a%7Bb%7D"))
        );
        let single = RedisTier::new(RedisTierConfig::new("redis://127.0.0.1:1/")).expect("valid");
        assert!(!single.is_cluster());
        assert_eq!(single.slot_of(&key), None);
    }

    #[test]
    fn futures_are_send() {
        fn send<T: Send>(_: &T) {}
        let tier = RedisTier::new(RedisTierConfig::new("redis://127.0.0.1:1/")).expect("valid");
        let set = RuleSet::new("s", [Rule::per_hour(5).expect("valid")]).expect("valid");
        send(&tier.check("k", &set, 1));
        send(&tier.check_many(&[]));
        send(&tier.ping());
        send(&tier.heartbeat("h", "me", Duration::from_secs(1)));
        send(&tier.reconcile(&[]));
    }

    /// A tier whose user may not load functions: it runs scripts.
    async fn scripts_tier(server: &RedisServer) -> RedisTier {
        let mut admin = server.conn().await;
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("scripts")
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-function")
            .query_async(&mut admin)
            .await
            .expect("ACL SETUSER");
        let config =
            RedisTierConfig::new(server.url_as("scripts", "pw")).deadline(Duration::from_secs(2));
        RedisTier::new(config).expect("valid config")
    }

    /// The script is flushed between two checks of one pipeline: the first
    /// ran, the second met NOSCRIPT. Only the second may be sent again.
    #[tokio::test]
    async fn only_checks_that_met_noscript_are_sent_again() {
        let server = RedisServer::start();
        let tier = scripts_tier(&server).await;
        let set = RuleSet::new("partial", [Rule::per_hour(5).expect("valid")]).expect("valid");
        tier.check("warm", &set, 1).await.expect("loads the script");
        assert_eq!(tier.script_mode(), Some(ScriptMode::Scripts));

        let check = |key: &str| tier.check_cmd(key, &set, 1, 0).expect("valid check");
        let mut flush = redis::cmd("SCRIPT");
        flush.arg("FLUSH");
        let mut pipe = redis::pipe();
        pipe.add_command(check("a"))
            .add_command(flush)
            .add_command(check("b"));
        let mut replies = [None, None, None];
        let before = server.command_calls("evalsha").await;
        let conn = tier.connection(&tier.inner.conn).expect("connection");
        tier.pipeline_routines(conn, &pipe, &mut replies, None)
            .await
            .expect("pipeline");

        // a, b (NOSCRIPT), b again.
        assert_eq!(server.command_calls("evalsha").await - before, 3);
        assert_eq!(
            server.command_calls("script|load").await,
            2,
            "warm-up and reload"
        );
        let [a, flushed, b] = replies.map(|r| r.expect("every command answered"));
        assert!(
            matches!(flushed, Value::Okay | Value::SimpleString(_)),
            "{flushed:?}"
        );
        for (name, reply) in [("a", a), ("b", b)] {
            let v = parse_verdict(reply, &set).expect("verdict");
            assert_eq!(v.decision.remaining, 4, "{name} consumed exactly once");
        }
    }

    /// A check that ran keeps its verdict when the reload another command
    /// of its pipeline needs fails. Regression: the replies of what ran were
    /// stored after the load, so a load refused (or timed out) lost them,
    /// and a check that had consumed its units on Redis came back as a
    /// failed call, for the policy to decide (and count) again.
    #[tokio::test]
    async fn what_ran_keeps_its_reply_when_a_reload_fails() {
        let server = RedisServer::start();
        let tier = scripts_tier(&server).await;
        let set = RuleSet::new("partial", [Rule::per_hour(5).expect("valid")]).expect("valid");
        tier.check("warm", &set, 1).await.expect("loads the script");

        let check = |key: &str| tier.check_cmd(key, &set, 1, 0).expect("valid check");
        let mut flush = redis::cmd("SCRIPT");
        flush.arg("FLUSH");
        // The tier's own user may no longer load scripts: the reload fails.
        let mut refuse = redis::cmd("ACL");
        refuse.arg("SETUSER").arg("scripts").arg("-script|load");
        let mut pipe = redis::pipe();
        pipe.add_command(check("a"))
            .add_command(flush)
            .add_command(refuse)
            .add_command(check("b"));
        let mut replies = [None, None, None, None];
        let conn = tier.connection(&tier.inner.conn).expect("connection");
        let failed = tier
            .pipeline_routines(conn, &pipe, &mut replies, None)
            .await;
        assert!(failed.is_err(), "the reload was refused: {failed:?}");
        let [a, flushed, refused, b] = replies;
        let v = parse_verdict(a.expect("a ran: its reply is kept"), &set).expect("verdict");
        assert_eq!(v.decision.remaining, 4, "a consumed once");
        assert!(flushed.is_some() && refused.is_some(), "they ran too");
        assert!(b.is_none(), "b never ran: {b:?}");
    }

    /// The same with Functions: the library is flushed between two checks of
    /// one pipeline; only the second is sent again, after one load.
    #[tokio::test]
    async fn only_checks_that_met_function_not_found_are_sent_again() {
        let server = RedisServer::start();
        let config = RedisTierConfig::new(server.url()).deadline(Duration::from_secs(2));
        let tier = RedisTier::new(config).expect("valid config");
        let set = RuleSet::new("partial", [Rule::per_hour(5).expect("valid")]).expect("valid");
        assert_eq!(tier.script_mode(), None, "nothing chosen before a call");
        tier.check("warm", &set, 1)
            .await
            .expect("loads the library");
        assert_eq!(tier.script_mode(), Some(ScriptMode::Functions));

        let check = |key: &str| tier.check_cmd(key, &set, 1, 0).expect("valid check");
        let mut flush = redis::cmd("FUNCTION");
        flush.arg("FLUSH");
        let mut pipe = redis::pipe();
        pipe.add_command(check("a"))
            .add_command(flush)
            .add_command(check("b"));
        let mut replies = [None, None, None];
        let before = server.command_calls("fcall").await;
        let conn = tier.connection(&tier.inner.conn).expect("connection");
        tier.pipeline_routines(conn, &pipe, &mut replies, None)
            .await
            .expect("pipeline");

        // a, b (Function not found), b again.
        assert_eq!(server.command_calls("fcall").await - before, 3);
        assert_eq!(server.command_calls("evalsha").await, 0);
        assert_eq!(
            server.command_calls("function|load").await,
            2,
            "warm-up and reload"
        );
        let [a, flushed, b] = replies.map(|r| r.expect("every command answered"));
        assert!(
            matches!(flushed, Value::Okay | Value::SimpleString(_)),
            "{flushed:?}"
        );
        for (name, reply) in [("a", a), ("b", b)] {
            let v = parse_verdict(reply, &set).expect("verdict");
            assert_eq!(v.decision.remaining, 4, "{name} consumed exactly once");
        }
    }

    /// A batch's request of several rules writes its reply into the batch's
    /// own; when one of its commits fails (`-OOM`: a script runs until its
    /// first write, then Redis refuses the write), its reply is that error
    /// alone, with nothing of the items it had begun, even as the batch's
    /// last request, where no later request writes over them.
    #[tokio::test]
    async fn a_request_whose_commit_fails_answers_its_error_alone() {
        let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
        let mut conn = server.conn().await;
        let spent = "1:1:3600000000:1:0";
        let mut first = crate::script::CHECK.prepare_invoke();
        first.key("tl:{spent}:g").arg("0").arg(1).arg(7).arg(spent);
        let _: Value = first.invoke_async(&mut conn).await.expect("spends the key");
        let sha = crate::script::CHECK_BATCH
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .expect("SCRIPT LOAD");
        server.config_set("maxmemory", "1").await;

        // A denial of a one-rule set (decided: it writes nothing), then an
        // admission of a two-rule set on fresh keys (its first commit fails).
        let mut batch = redis::cmd("EVALSHA");
        batch
            .arg(sha)
            .arg(3)
            .arg(&["tl:{spent}:g", "tl:{fresh}:g", "tl:{fresh}:f"])
            .arg(&[
                "2",
                "2",
                "7",
                "0",
                "1",
                spent,
                "2",
                spent,
                "5:1:3600000000:1:0",
            ])
            .arg(&["1", "1", "2", "1"]);
        // Sent raw: a query would turn the whole reply into its first error.
        let reply = redis::aio::ConnectionLike::req_packed_command(&mut conn, &batch)
            .await
            .expect("the batch answers");
        let Value::Array(items) = reply else {
            panic!("not an array: {reply:?}");
        };
        assert_eq!(
            items.len(),
            1 + 3 + 1,
            "time, the denial, the error: {items:?}"
        );
        assert!(
            matches!(&items[1], Value::Int(retry) if *retry > 0),
            "the first request denied: {items:?}"
        );
        assert!(
            matches!(&items[4], Value::ServerError(e) if e.code() == "OOM"),
            "the second request's own error: {items:?}"
        );
        assert_eq!(server.dbsize().await, 1, "only the spent key");
    }
}
