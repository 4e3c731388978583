//! The global tier of tierlimit: rate-limit rule sets checked on Redis by
//! atomic Lua scripts, under a hard deadline.
//!
//! A check on an idle connection is one script call; checks that arrive while
//! a call is in flight go together in the next call (adaptive batching, see
//! [`RedisTier::check_key`]), each decided as it would have been alone.
//!
//! Every rule of a [`RuleSet`](tierlimit_core::RuleSet) is checked first and
//! committed only if all admit, whatever their algorithms (GCRA, token bucket,
//! sliding log, sliding window counter, fixed and calendar windows); time comes
//! from the server unless [`TimeSource::Client`] is chosen. The scripts live in
//! the workspace's `lua/` folder, each opened by a comment stating its keys,
//! arguments and reply. On Redis 7 and later they run as one Functions
//! library (`FUNCTION LOAD` once per server, `FCALL` per call), so the
//! algorithms are not defined again on every call; elsewhere, or when the
//! ACL forbids it, as scripts by `EVALSHA` ([`RedisTier::script_mode`]).
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use tierlimit_core::{Algorithm, Rule, RuleSet};
//! use tierlimit_redis::{CheckRequest, RedisTier, RedisTierConfig};
//!
//! # async fn run() -> tierlimit_core::Result<()> {
//! let tier = RedisTier::new(
//!     RedisTierConfig::new("redis://127.0.0.1:6380/").deadline(Duration::from_millis(50)),
//! )?; // no I/O yet: the app may start while Redis is down
//!
//! // 10 per second AND 1000 per natural day in UTC-8.
//! let set = RuleSet::new("api", [Rule::per_second(10)?, Rule::per_natural_day(1000, -8 * 3600)?])?;
//! let verdict = tier.check("user:42", &set, 1).await?;
//! println!("allowed: {}, decided by rule {}", verdict.decision.allowed, verdict.decision.rule);
//!
//! // Independent checks in one round trip.
//! let burst = RuleSet::new("uploads", [Rule::per_minute(5)?.with_algorithm(Algorithm::SlidingLog)?])?;
//! let batch = [CheckRequest::new("user:1", &burst, 1), CheckRequest::new("user:2", &burst, 2)];
//! for result in tier.check_many(&batch).await? {
//!     println!("{:?}", result.map(|v| v.decision.allowed));
//! }
//! # Ok(()) }
//! ```
//!
//! # Hot keys
//!
//! A rule set made with [`RuleSet::with_stripes`](tierlimit_core::RuleSet::with_stripes)
//! spreads each user key over K stripes, each its own hash tag (so its own
//! Cluster slot) with a share of every rule: a check asks one stripe at
//! random and, while they deny, the others in turn, within one deadline; a
//! write-back spreads its units over the stripes. The accuracy bound is
//! documented there.
//!
//! # Redis Cluster
//!
//! `redis+cluster://host1:7000,host2:7001/` (the `cluster` feature, on by
//! default) checks on a Redis Cluster. The tier reads the slot map itself
//! and keeps one connection per master, so a failed master holds up only its
//! own slots' calls. Each check goes to the master of its
//! user key's hash slot (every storage key of a check shares the tag
//! `{<user key>}`, so a check of many rules is still one script call). What
//! carries many keys is split by slot: a batch of concurrent checks becomes
//! one script call per slot, sent at once; [`RedisTier::check_many`] and
//! [`RedisTier::reconcile`] send one pipeline per slot. A script a master
//! lacks (a promoted replica, `SCRIPT FLUSH`) is loaded on that master and
//! the call sent again. A master failing over makes the calls for its slots
//! fail within their deadline (`CLUSTERDOWN`, `TRYAGAIN` and leftover
//! `MOVED`/`ASK` are [`RedisFailure::ClusterUnavailable`](tierlimit_core::RedisFailure::ClusterUnavailable)),
//! while the other masters' keys go on, provided the servers run with
//! `cluster-require-full-coverage no`: with Redis's default (`yes`) every
//! master refuses every key (`CLUSTERDOWN`) until the failed master's replica
//! is promoted. [`RedisTier::ping`] asks one master, one not marked down
//! when there is one. A master's failures are its own while another master
//! answers: a few in a row mark it down for a while (its keys then get
//! [`RedisFailure::NodeDown`](tierlimit_core::RedisFailure::NodeDown) at once), and a circuit breaker does not
//! hear of them ([`Checked::counts_call`]: a call's vote goes with the
//! master it was sent to, even once a replica serves its slot);
//! once every master fails, it does.
//!
//! # TLS and ACL users
//!
//! `rediss://` URLs need the `tls` feature (on by default): rustls with the
//! `ring` provider, no OpenSSL. The server's certificate is always verified,
//! against the system's trust store or only the CA given to
//! [`RedisTierConfig::tls_root_certificates`]; without the feature, or with
//! redis-rs's `#insecure` fragment, [`RedisTier::new`] refuses the URL with
//! [`Error::InvalidConfig`](tierlimit_core::Error::InvalidConfig). ACL users
//! log in with `redis://user:password@host/`; a wrong password is a Redis
//! fault at the first call. Every `Debug` and error shows URLs through
//! [`redact_url`], never with their password.
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod batch;
mod cluster;
mod command;
mod config;
mod failure;
mod nodes;
mod reconcile;
mod script;
mod stripe;
mod tier;
mod verdict;

pub use batch::{CheckKey, Checked, Unheard};
pub use config::{DEFAULT_MAX_BATCH, RedisTierConfig, TimeSource, redact_url};
pub use reconcile::{WriteBack, Written};
pub use script::{
    CHECK, CHECK_SOURCE, FIXED_WINDOW, GCRA, HEARTBEAT, RECONCILE, SLIDING_LOG, SLIDING_WINDOW,
    ScriptMode, TOKEN_BUCKET, library_source,
};
pub use tier::RedisTier;
pub use tierlimit_core::RuleState;
pub use verdict::{CheckRequest, Verdict};
