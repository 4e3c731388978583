//! The local tier of tierlimit: what a process decides by itself while Redis is
//! slow, hung or gone, and what it remembers while Redis is healthy so the
//! fallback is sound.
//!
//! - [`LocalTier`]: per (rule set, key) buckets sized to this instance's share of
//!   each rule, checked all or nothing like the Redis scripts; a denial cache
//!   that answers a hammered, denied key without a Redis round trip; the last
//!   remaining values Redis reported, so a bucket created during an outage starts
//!   warm rather than full.
//! - [`Ledger`]: what was admitted locally while the breaker was not Closed, per
//!   Redis key, for the reconciler to write back.
//!
//! Every map is bounded ([`LocalConfig`]) and pruned ([`LocalTier::prune`]).
//! This crate knows nothing of Redis; the facade (`tierlimit`) joins the tiers.
//!
//! The buckets are a small GCRA / window map on DashMap rather than governor's
//! keyed limiters: a rule set must be checked all or nothing across its rules
//! (governor has one quota per limiter and no undo), a bucket must start from a
//! remaining value Redis reported (governor cannot set state), and one bound must
//! hold over every key.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use tierlimit_core::{Rule, RuleSet, SystemClock};
//! use tierlimit_local::{LocalAnswer, LocalConfig, LocalTier};
//!
//! let local = LocalTier::new(LocalConfig::default(), Arc::new(SystemClock))?;
//! let set = RuleSet::new("reports", [Rule::per_hour(100)?])?;
//! // Redis said 10 remained just before it failed; one instance gets those 10, not 100.
//! local.remember("user-7", &set, [(10, std::time::Duration::from_secs(3600))].into_iter());
//! let admitted = (0..100)
//!     .filter(|_| matches!(local.check("user-7", &set, 1, 1, true), LocalAnswer::Decided(d) if d.allowed))
//!     .count();
//! assert_eq!(admitted, 10);
//! assert_eq!(local.ledger().units(), 10);
//! # Ok::<(), tierlimit_core::Error>(())
//! ```
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod bounded;
mod ledger;
mod slot;
mod tier;

pub use ledger::{Claim, Ledger};
pub use tier::{DENIAL_SPREAD, LocalAnswer, LocalConfig, LocalTier};
