//! The vocabulary of tierlimit: rules, rule sets, decisions, policies, errors and
//! clocks. No I/O happens here; the Redis tier (`tierlimit-redis`), the local tier
//! (`tierlimit-local`) and the facade (`tierlimit`) all speak these types.
//!
//! # Examples
//!
//! ```
//! use tierlimit_core::{Algorithm, Error, Rule, RuleSet};
//!
//! // 10 per minute AND 100 per hour AND 1000 per natural day (UTC).
//! let set = RuleSet::new(
//!     "api",
//!     [
//!         Rule::per_minute(10)?,
//!         Rule::per_hour(100)?.with_algorithm(Algorithm::SlidingWindow)?,
//!         Rule::per_natural_day(1000, 0)?,
//!     ],
//! )?;
//! assert!(matches!(set.validate_cost(11), Err(Error::CostExceedsCapacity { rule: 0, .. })));
//! # Ok::<(), Error>(())
//! ```
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod clock;
mod decision;
mod error;
mod key;
mod ledger_entry;
mod policy;
mod rule;
mod rule_set;
mod rule_spec;
mod stripe;

pub use clock::{Clock, FakeClock, SystemClock};
pub use decision::{Decision, RuleState, Tier};
pub use error::{Error, RedisFailure, Result};
pub use key::{MAX_KEY_LEN, escape_key, validate_and_escape_key, validate_key};
pub use ledger_entry::{
    LedgerEntry, owed_after_us, owed_since_us, units_matter_until_us, window_index, window_start,
};
pub use policy::Policy;
pub use rule::{Algorithm, MAX_EXACT, MAX_LIMIT, MAX_REFILL_US, MAX_SLIDING_LOG_LIMIT, Rule};
pub use rule_set::{MAX_RULES, RuleSet};
pub use rule_spec::{parse_duration, parse_rule_as, parse_utc_offset};
pub use stripe::{MAX_STRIPES, stripe_key, stripe_share, stripe_storage_key};
