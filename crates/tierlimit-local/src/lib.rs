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
//! Every map of keys is bounded ([`LocalConfig`]) and pruned
//! ([`LocalTier::prune`]); the engines (one per distinct rule set and
//! instance count, see below) are not counted against `max_bytes`: each goes
//! when no key holds it, at once for a key refused, else at the next prune.
//! This crate knows nothing of Redis; the facade (`tierlimit`) joins the tiers.
//!
//! # Which rule runs on what
//!
//! | rule | local engine ([`Engine`]) |
//! |---|---|
//! | GCRA, token bucket | governor's GCRA ([`Engine::Governor`]) |
//! | GCRA with a per-instance burst above `u32::MAX` | this crate's exact GCRA ([`Engine::Gcra`]) |
//! | fixed and calendar windows | a window counter aligned like Redis' ([`Engine::Window`]) |
//! | sliding log, sliding window counter | a two-window estimate ([`Engine::Window`]) |
//!
//! Buckets live in one bounded DashMap keyed by (rule set identity, key): one
//! lookup per check of a known key of a one-rule governor set (other sets
//! look their engine up too), no allocation for a key that already has a
//! bucket. For a
//! governor rule the bucket holds governor's state, an atomic theoretical
//! arrival time, and a governor keyed limiter per rule set holds the quota:
//! its state store is the cell itself. That is how a bucket starts warm (the
//! seed is written into the cell), how several rules are all or nothing (the
//! cells a later denial leaves charged are put back, under the bucket's lock)
//! and how one bound holds over every key (the map is ours). The window
//! algorithms keep their own counter: governor has no windows aligned to the
//! clock, and the sliding log's exactness would cost a timestamp per unit.
//!
//! # When limits change
//!
//! A rule set's identity names its rules' algorithms, periods and UTC offsets,
//! not their limits or bursts (as the Redis keys do), so a set whose limits
//! changed (a hot reload, a rolling deploy) finds the same buckets. Each
//! bucket remembers the engine, and so the limits, its state was written
//! under; checked under other limits, it converts that state keeping what was
//! used (GCRA: the units still draining; windows: the counts), then judges it
//! by the new limits. Engines are cached per identity *and* limits, a cached
//! denial answers only the limits it was cached under, and a warm seed keeps
//! the units used when Redis reported it rather than the remaining.
//!
//! # Across outages
//!
//! An outage is the checks decided here because Redis could not be asked or
//! did not answer, until Redis answers a call sent in it: an Open breaker's
//! minutes, or a single call that failed while the breaker stayed Closed
//! ([`LocalTier::outage`], [`LocalTier::end_outage`]). A bucket is the latest
//! word on its key until Redis reports on the key from a call sent after the
//! bucket's outage ended (that report counts what the bucket admitted: the
//! key's next Redis call carries it). A later outage, or
//! another instance count, goes on from the bucket until then, converted
//! like a limit change (what this instance used, judged by its new share),
//! and from the report after it. Pruned before any report, the bucket
//! leaves what it used as the key's warm seed (a sliding window's whole
//! estimate, the window before included), or stays while the warm map is
//! full. So a second outage soon
//! after the first does not hand a key a second share of the same window,
//! and a key used through Redis between two outages does not meet the
//! second with the first one's leftover.
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
//! let reported = [(10, std::time::Duration::from_secs(3600))];
//! local.remember("user-7", &set, reported.into_iter(), local.outage());
//! let admitted = (0..100)
//!     .filter(|_| matches!(local.check("user-7", &set, 1, 1, true), LocalAnswer::Decided(d) if d.allowed))
//!     .count();
//! assert_eq!(admitted, 10);
//! assert_eq!(local.ledger().units(), 10);
//! # Ok::<(), tierlimit_core::Error>(())
//! ```
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod bounded;
mod engine;
mod key;
mod ledger;
mod slot;
mod tier;

pub use engine::Engine;
pub use ledger::{Claim, Ledger};
pub use tier::{DENIAL_SPREAD, LocalAnswer, LocalConfig, LocalTier};
