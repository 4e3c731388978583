//! tierlimit: distributed rate limiting that stays correct while Redis is healthy
//! and stays useful when it is not.
//!
//! ```text
//!  check(key, rule set, cost)
//!     │
//!     ├─ denial cache hit? ─────────────────────────────► Tier::DenyCache
//!     ├─ breaker Closed? ── Redis (one Lua script, deadline) ─► Tier::Redis
//!     │                        └─ fault ─► breaker records it ─┐
//!     └─ breaker Open / HalfOpen, or the call failed ◄─────────┘
//!           └─ rule set's Policy: FailOpen │ FailClosed │ LocalFallback (share-sized buckets)
//! ```
//!
//! A check whose own Redis call failed says how in [`Decision::redis_failure`].
//! When the failure [may have run](RedisFailure::may_have_run) the script (the
//! deadline passed, or a reset lost the reply), Redis may have counted the
//! units too; a local admission for it is still written back, so the limiter
//! errs towards admitting less, never more.
//!
//! The crates underneath: [`tierlimit_core`] (the vocabulary), `tierlimit-redis`
//! (the global tier), `tierlimit-local` (the local tier). This crate joins them:
//! the circuit breaker, the [`HybridLimiter`] with its policies and background tasks
//! (probe, heartbeat, pruning) and the reconciler that writes what was admitted
//! locally during an outage back to Redis.
//!
//! # TLS and ACL users
//!
//! The `tls` feature (on by default) connects to `rediss://` URLs with rustls
//! and its `ring` provider (no OpenSSL, no cmake). The server's certificate is
//! always verified, and its name must match the URL's host: against the
//! system's trust store, or only against the CA given to
//! [`HybridLimiterBuilder::tls_root_certificates`]; a client certificate for
//! mutual TLS goes to [`HybridLimiterBuilder::tls_client_certificate`].
//! There is no switch that skips verification (redis-rs's `#insecure` URL
//! fragment is refused by `build()`). With `default-features = false`, a
//! `rediss://` URL is refused by `build()` with an error naming the feature.
//!
//! An ACL user logs in with `redis://user:password@host:port/` (or
//! `rediss://…`). A wrong password cannot be seen without I/O, so `build()`
//! accepts it; every call then fails with `WRONGPASS`, a Redis fault that the
//! breaker counts and each rule set's [`Policy`] answers, like any outage. The
//! password never appears in the builder's `Debug`, the limiter's, or an error.
//!
//! ```no_run
//! use tierlimit::HybridLimiter;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = HybridLimiter::builder()
//!     .redis_url("rediss://app:secret@redis.internal:6380/")
//!     .tls_root_certificates(std::fs::read("/etc/redis/ca.crt")?)
//!     .build()?;
//! # let _ = limiter; Ok(()) }
//! ```
//!
//! # Config file
//!
//! With the `config` feature (on by default), a TOML file sets up the
//! limiter and its rule sets: [`Config::load`] checks every field (unknown
//! ones included) and reports every mistake at once, each with its path and
//! line (`rule_sets.login.rules[1].limit: must be at least 1`);
//! [`HybridLimiter::from_config`] builds a limiter that holds the file's rule
//! sets by name ([`HybridLimiter::check_by_name`]).
//! Rules are written as `"10/s"`, `"100/min"` or `"1000/day@+08:00"` (a
//! calendar day in UTC+8), or as tables that pick the algorithm and burst.
//! The format, with a complete example file, is in the [`config`] module.
//!
//! # Hot reload
//!
//! [`HybridLimiter::reload`] (a [`Config`]), [`HybridLimiter::reload_file`]
//! and [`HybridLimiter::watch_config`] (the `watch` feature, on by default:
//! reloads whenever the file changes, debounced) put new rule sets and
//! policies in force at once; [`HybridLimiter::replace_rule_sets`] does the
//! same from code.
//!
//! * A check in flight finishes on the sets it started with; no check is lost
//!   or counted twice.
//! * **A changed limit keeps what was used.** A rule's storage key names its
//!   algorithm, period and UTC offset, not its limit or burst, so raising 100
//!   to 200 per minute leaves a key that used 80 with 120, and lowering it to
//!   50 denies until usage drains below 50: on Redis (GCRA and the token
//!   bucket rescale their stored state, the windows keep their counts) and in
//!   the local tier alike. Changing a rule's algorithm or period starts it
//!   afresh under a new key (the old one expires by its TTL).
//! * A file that does not load changes nothing: the error is returned,
//!   logged, and counted in `tierlimit_config_reloads_total{result="rejected"}`.
//! * Settings that only apply at start (Redis URL, deadline, breaker, local
//!   bounds, ...) are kept, and named in [`ReloadReport::needs_restart`].
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tierlimit::{Config, HybridLimiter};
//!
//! let limiter = HybridLimiter::from_config(&Config::load("tierlimit.toml")?)?;
//! let _watch = limiter.watch_config("tierlimit.toml", Duration::from_millis(250))?;
//! let decision = limiter.check_by_name("login", "user:42", 1).await?;
//! # let _ = decision; Ok(()) }
//! ```
//!
//! # Metrics
//!
//! Through the [`metrics`](https://docs.rs/metrics) facade (install any
//! recorder; none is forced). Install it before the limiter's first check:
//! the decision counters' handles are taken once per thread and rule set,
//! from the recorder installed then, so a check never builds labels. Every
//! metric is described (help text and unit) when a limiter is built. Series of one limiter carry the label `limiter`
//! (its [name](HybridLimiterBuilder::name), by default its group), so two
//! limiters in one process keep apart. Labels are bounded: never a key.
//!
//! | name | kind | unit | labels |
//! |---|---|---|---|
//! | `tierlimit_decisions_total` | counter | count | `limiter`, `set` (rule set name), `tier`, `outcome` (allowed, denied) |
//! | `tierlimit_redis_call_seconds` | histogram | seconds | `limiter` |
//! | `tierlimit_breaker_state` | gauge: 0 closed, 1 open, 2 half-open | count | `limiter` |
//! | `tierlimit_breaker_transitions_total` | counter | count | `limiter`, `from`, `to` |
//! | `tierlimit_probes_total` | counter | count | `limiter`, `result` (succeeded, failed) |
//! | `tierlimit_connections_replaced_total` | counter | count | `limiter` |
//! | `tierlimit_instances` | gauge (0 while unknown) | count | `limiter` |
//! | `tierlimit_local_keys` | gauge | count | `limiter` |
//! | `tierlimit_deny_cache_entries` | gauge | count | `limiter` |
//! | `tierlimit_warm_keys` | gauge | count | `limiter` |
//! | `tierlimit_ledger_entries` | gauge | count | `limiter` |
//! | `tierlimit_ledger_units` | gauge | count | `limiter` |
//! | `tierlimit_ledger_oldest_seconds` | gauge: drain lag | seconds | `limiter` |
//! | `tierlimit_reconciled_units_total` | counter | count | `limiter` |
//! | `tierlimit_reconcile_batches_retried_total` | counter | count | `limiter` |
//! | `tierlimit_reconcile_parked_total` | counter | count | `limiter` |
//! | `tierlimit_config_reloads_total` | counter | count | `limiter`, `result` (applied, rejected) |
//! | `tierlimit_local_keys_refused_total` | counter | count | |
//! | `tierlimit_deny_cache_hits_total` | counter | count | |
//! | `tierlimit_ledger_dropped_units_total` | counter | count | `reason` (expired, overflow; dropped, with `limiter`) |
//!
//! Breaker transitions and reconcile drains are also `tracing` events, and
//! every check is a debug-level span, `tierlimit_check` (rule set, a keyed
//! hash of the key, tier, outcome).
//!
//! # Examples
//!
//! ```no_run
//! use tierlimit::{HybridLimiter, Policy, Rule, RuleSet};
//!
//! # async fn run() -> Result<(), tierlimit::Error> {
//! let limiter = HybridLimiter::builder()
//!     .redis_url("redis://127.0.0.1:6380/")
//!     .default_policy(Policy::LocalFallback)
//!     .build()?;
//! let api = RuleSet::new("api", [Rule::per_minute(10)?, Rule::per_hour(100)?])?;
//! let decision = limiter.check("user:42", &api, 1).await?;
//! println!("allowed={} remaining={} tier={:?}", decision.allowed, decision.remaining, decision.tier);
//! # Ok(()) }
//! ```
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod breaker;
#[cfg(feature = "config")]
pub mod config;
mod instances;
mod limiter;
mod metrics;
mod named;
mod reconcile;
#[cfg(feature = "config")]
mod reload;
mod tasks;
mod view;

pub use breaker::{BreakerConfig, BreakerState};
#[cfg(feature = "config")]
pub use config::{Config, ConfigError, ConfigProblem};
pub use limiter::{HybridLimiter, HybridLimiterBuilder, Instances, ShutdownReport};
pub use named::ReloadReport;
pub use reconcile::{ReconcileConfig, ReconcileStats};
#[cfg(feature = "watch")]
pub use reload::ConfigWatch;
pub use tierlimit_core::{
    Algorithm, Clock, Decision, Error, FakeClock, Policy, RedisFailure, Result, Rule, RuleSet,
    RuleState, SystemClock, Tier,
};
pub use tierlimit_local::LocalConfig;
pub use view::{BreakerView, LedgerView, LocalView};

/// The README's code, compiled with the doctests so it cannot rot.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
