//! What a check answers.

use std::time::Duration;

use crate::RedisFailure;

/// Where a [`Decision`] came from.
///
/// # Examples
///
/// ```
/// use tierlimit_core::Tier;
///
/// assert!(Tier::FailOpen.is_fallback());
/// assert!(!Tier::Redis.is_fallback());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Tier {
    /// The global tier: an atomic script on Redis decided.
    Redis,
    /// The local fallback bucket (this instance's share of the limit) decided.
    Local,
    /// Denied locally from a cached Redis denial, without a Redis round trip.
    DenyCache,
    /// Redis could not be asked; the policy admitted.
    FailOpen,
    /// Redis could not be asked; the policy denied.
    FailClosed,
}

impl Tier {
    /// A short lowercase name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Redis => "redis",
            Tier::Local => "local",
            Tier::DenyCache => "deny_cache",
            Tier::FailOpen => "fail_open",
            Tier::FailClosed => "fail_closed",
        }
    }

    /// True when Redis did not take part in this decision because it was unhealthy.
    pub fn is_fallback(self) -> bool {
        matches!(self, Tier::Local | Tier::FailOpen | Tier::FailClosed)
    }
}

/// The answer to one check, with what an HTTP layer needs (`RateLimit-*` and
/// `Retry-After` headers) without another call.
///
/// # One meaning per field, whatever the tier
///
/// Every tier fills the fields with the same meaning, so headers built from
/// them mean the same thing during an outage as while Redis is healthy:
///
/// | field | meaning | `Redis`, `DenyCache` | `Local` | `FailOpen` | `FailClosed` |
/// |---|---|---|---|---|---|
/// | `limit` | the deciding rule's global limit (what the client was promised) | the rule's limit | the rule's limit (not this instance's share) | the first rule's limit | the first rule's limit |
/// | `remaining` | units the deciding tier will still admit to this key, after this request, before `reset_after` | Redis' count (0 when denied) | this instance's bucket: a lower bound of the fleet's | `limit`: nothing is enforced | 0 |
/// | `reset_after` | time until the deciding rule is full again, as the deciding tier counts | from Redis | from the local bucket | zero: nothing is counted against the key | `retry_after` |
/// | `retry_after` | denied only: the earliest a retry of the same request could be admitted | from Redis (the cache: what is left of it) | from the local bucket | `None` | until the breaker's next probe (at least 1 ms) |
/// | `rule` | index of the deciding rule | the denying rule with the longest wait, or when admitted the one with the fewest remaining | as for Redis | 0 | 0 |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tierlimit_core::{Decision, Tier};
///
/// let d = Decision::denied(10, Duration::from_secs(6), Duration::from_secs(2), 1, Tier::Redis);
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after, Some(Duration::from_secs(2)));
/// assert_eq!(d.rule, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The deciding rule's global limit, in every tier (see the table above).
    pub limit: u64,
    /// Units the deciding tier will still admit to this key, after this request,
    /// before [`reset_after`](Self::reset_after) (0 when denied).
    pub remaining: u64,
    /// When the deciding rule is back to its full capacity, as the deciding
    /// tier counts.
    pub reset_after: Duration,
    /// When denied: how long until the same request would be admitted (the
    /// largest wait over the rules that denied). `None` when admitted.
    pub retry_after: Option<Duration>,
    /// Index of the deciding rule in its rule set: the rule that denied (the one
    /// with the longest wait), or when admitted the rule with the fewest remaining.
    pub rule: usize,
    /// Where the decision came from.
    pub tier: Tier,
    /// When the policy answered because this check's own call to Redis
    /// failed: how it failed. `None` when Redis decided, when the breaker was
    /// open so no call was made, and for denial-cache answers.
    ///
    /// When [`RedisFailure::may_have_run`] holds, Redis may also have counted
    /// this check's units although its reply was lost.
    pub redis_failure: Option<RedisFailure>,
}

impl Decision {
    /// An admitting decision.
    pub fn allowed(
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        rule: usize,
        tier: Tier,
    ) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining,
            reset_after,
            retry_after: None,
            rule,
            tier,
            redis_failure: None,
        }
    }

    /// A denying decision.
    pub fn denied(
        limit: u64,
        reset_after: Duration,
        retry_after: Duration,
        rule: usize,
        tier: Tier,
    ) -> Self {
        Decision {
            allowed: false,
            limit,
            remaining: 0,
            reset_after,
            retry_after: Some(retry_after),
            rule,
            tier,
            redis_failure: None,
        }
    }
}

/// One rule's state after a check, as the tier that decided counts it: the
/// Redis script, or this instance's local bucket.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tierlimit_core::RuleState;
///
/// let state = RuleState::new(4, Duration::from_millis(600));
/// assert_eq!(state.remaining, 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuleState {
    /// Units the rule would admit right now.
    pub remaining: u64,
    /// When the rule is back to its full capacity.
    pub reset_after: Duration,
}

impl RuleState {
    /// A rule state.
    pub fn new(remaining: u64, reset_after: Duration) -> Self {
        RuleState {
            remaining,
            reset_after,
        }
    }
}
