//! The one error type of tierlimit.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::Algorithm;

/// Everything that can go wrong in tierlimit.
///
/// Two families live here:
///
/// * **Bad input and misconfiguration** ([`Error::is_bad_input`]): raised at the
///   earliest point, when a [`Rule`](crate::Rule) or [`RuleSet`](crate::RuleSet)
///   is built or a check's key and cost are validated. These are the only errors
///   the hybrid limiter ever returns from a check.
/// * **Redis faults** ([`Error::Redis`]): produced by the Redis tier and classified
///   by [`RedisFailure`] so the circuit breaker can read them. The hybrid limiter
///   turns them into decisions through the rule set's policy; they never reach the
///   caller of its `check`.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Error, Rule};
///
/// let err = Rule::per_second(0).unwrap_err();
/// assert!(matches!(err, Error::ZeroLimit));
/// assert!(err.is_bad_input());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A rule's limit was 0: such a rule could never admit anything.
    #[error("a rule's limit must be at least 1")]
    ZeroLimit,
    /// A limit or burst above [`MAX_LIMIT`](crate::MAX_LIMIT) (2^51): the
    /// scripts' sums of counts (in doubles) could pass 2^53 and stop being exact.
    #[error(
        "a limit or burst of {value} is above {max}: counts summed in the scripts' doubles would pass 2^53"
    )]
    LimitTooLarge {
        /// The offending value.
        value: u64,
        /// The largest value accepted.
        max: u64,
    },
    /// A [`SlidingLog`](crate::Algorithm::SlidingLog) limit above
    /// [`MAX_SLIDING_LOG_LIMIT`](crate::MAX_SLIDING_LOG_LIMIT): one request could
    /// add that many sorted-set members in one script call and block Redis.
    #[error(
        "a sliding log's limit is at most {max} (got {limit}): it stores one member per unit; use SlidingWindow or GCRA for larger limits"
    )]
    SlidingLogTooLarge {
        /// The rule's limit.
        limit: u64,
        /// The largest sliding-log limit accepted.
        max: u64,
    },
    /// The period is zero or shorter than a millisecond, so the TTL of its keys would round to 0.
    #[error(
        "a rule's period must be at least 1 ms (got {period:?}): Redis TTLs are whole milliseconds"
    )]
    PeriodTooShort {
        /// The offending period.
        period: Duration,
    },
    /// The period is not a whole number of microseconds, the scripts' unit of time.
    #[error("a rule's period must be a whole number of microseconds (got {period:?})")]
    PeriodPrecision {
        /// The offending period.
        period: Duration,
    },
    /// The period is longer than the scripts can represent: 2^53 µs
    /// ([`MAX_EXACT`](crate::MAX_EXACT)), and for GCRA and the token bucket
    /// without a burst 2^52 µs ([`MAX_REFILL_US`](crate::MAX_REFILL_US)), the
    /// longest a full bucket may take to refill.
    #[error("a rule's period is too long (got {period:?}, at most {max:?})")]
    PeriodTooLong {
        /// The offending period.
        period: Duration,
        /// The longest period this rule may have.
        max: Duration,
    },
    /// More than one request per microsecond: the emission interval of GCRA and
    /// the token bucket would round to zero.
    #[error("{limit} per {period:?} is finer than one request per microsecond")]
    RateTooFine {
        /// The rule's limit.
        limit: u64,
        /// The rule's period.
        period: Duration,
    },
    /// The time a full burst takes to refill (`capacity * period / limit`) is
    /// longer than [`MAX_REFILL_US`](crate::MAX_REFILL_US) (2^52 µs): the
    /// arrival time, now plus that, would not stay exact in a double.
    #[error(
        "a burst of {capacity} at {limit} per {period:?} takes too long to refill to represent exactly"
    )]
    BurstWindowTooLong {
        /// The rule's capacity (burst).
        capacity: u64,
        /// The rule's limit.
        limit: u64,
        /// The rule's period.
        period: Duration,
    },
    /// A burst of 0 was asked for.
    #[error("a rule's burst must be at least 1")]
    ZeroBurst,
    /// A burst was asked for on an algorithm that has no burst (the window algorithms).
    #[error("{algorithm:?} has no burst: its capacity is its limit")]
    BurstNotSupported {
        /// The rule's algorithm.
        algorithm: Algorithm,
    },
    /// A UTC offset (calendar window) was asked for on an algorithm other than the fixed window.
    #[error("calendar windows (UTC offsets) need Algorithm::FixedWindow, not {algorithm:?}")]
    CalendarNeedsFixedWindow {
        /// The rule's algorithm.
        algorithm: Algorithm,
    },
    /// A calendar window (a UTC offset) whose period does not divide a day
    /// evenly, so its windows could not all start at local midnight.
    #[error(
        "a calendar window's period must divide a day evenly (like 15 min, 1 h or 1 day), not {period:?}"
    )]
    CalendarPeriod {
        /// The rule's period.
        period: Duration,
    },
    /// A UTC offset of a day or more, or not a whole number of seconds.
    #[error(
        "UTC offset must be a whole number of seconds strictly within one day (got {seconds} s)"
    )]
    InvalidUtcOffset {
        /// The offending offset in seconds.
        seconds: i64,
    },
    /// A rule written as text (`"10/s"`, `"1000/day@+08:00"`) that does not
    /// follow the rule grammar (see [`Rule`](crate::Rule)'s `FromStr`).
    #[error("invalid rule {spec:?}: {reason}")]
    InvalidRuleSpec {
        /// The text as given.
        spec: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// A duration written as text (`"50ms"`, `"2s"`) that does not follow the
    /// grammar of [`parse_duration`](crate::parse_duration).
    #[error("invalid duration {text:?}: {reason}")]
    InvalidDuration {
        /// The text as given.
        text: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// A rule set had no rules.
    #[error("a rule set needs at least one rule")]
    EmptyRuleSet,
    /// A rule set had more rules than one script call checks.
    #[error("a rule set holds at most {max} rules (got {count})")]
    TooManyRules {
        /// The number of rules given.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// Two rules of one rule set with the same [id](crate::Rule::id): the same
    /// algorithm, period and UTC offset (whatever their limits and bursts).
    /// Both would share one storage key.
    #[error(
        "rule {second} of the rule set has the algorithm, period and UTC offset of rule {first}: \
         both would share one storage key"
    )]
    DuplicateRule {
        /// The index of the first occurrence.
        first: usize,
        /// The index of the repetition.
        second: usize,
    },
    /// A rule set asked to stripe its keys over a number of stripes outside
    /// 1 to [`MAX_STRIPES`](crate::MAX_STRIPES) (see
    /// [`RuleSet::with_stripes`](crate::RuleSet::with_stripes)).
    #[error("a rule set stripes a key over 1 to {max} sub-keys (got {stripes})")]
    StripesOutOfRange {
        /// The number of stripes asked for.
        stripes: u64,
        /// The largest number accepted.
        max: u32,
    },
    /// A stripe asked of a rule past its last one (see
    /// [`Rule::stripe`](crate::Rule::stripe)): stripes are numbered from 0
    /// to `stripes - 1`.
    #[error("stripe {stripe} of {stripes}: stripes are numbered 0 to {}", .stripes.saturating_sub(1))]
    StripeOutOfRange {
        /// The stripe asked for.
        stripe: u32,
        /// The number of stripes.
        stripes: u32,
    },
    /// A rule whose limit or capacity (burst) is below the number of stripes:
    /// some stripe would get a share of 0 and could never admit anything.
    #[error(
        "rule {rule} cannot be striped over {stripes} sub-keys: its {what} of {value} \
         leaves some sub-key a share of 0 (use at most {value} stripes)"
    )]
    StripesExceedRule {
        /// The number of stripes asked for.
        stripes: u32,
        /// The index of the rule.
        rule: usize,
        /// `"limit"` or `"capacity"`.
        what: &'static str,
        /// That rule's limit or capacity.
        value: u64,
    },
    /// A rule set's name was empty, too long, or used characters outside `[A-Za-z0-9_.-]`.
    #[error("invalid rule set name {name:?}: use 1 to 64 characters from [A-Za-z0-9_.-]")]
    InvalidName {
        /// The offending name.
        name: String,
    },
    /// Two rule sets of one limiter had the same name (a limiter's named sets,
    /// from its builder, a config file or a reload, are looked up by name).
    #[error("rule set name {name:?} is used twice")]
    DuplicateRuleSet {
        /// The repeated name.
        name: String,
    },
    /// A check named a rule set the limiter does not hold (see
    /// `HybridLimiter::check_by_name` in the facade).
    #[error("no rule set named {name:?}")]
    UnknownRuleSet {
        /// The name asked for.
        name: String,
    },
    /// A check was asked with cost 0.
    #[error("a check's cost must be at least 1")]
    ZeroCost,
    /// The cost is above a rule's capacity: the request can never succeed, however long
    /// the caller waits (not the same as "denied, retry after").
    #[error("cost {cost} can never succeed: rule {rule} holds at most {capacity}")]
    CostExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The index of the rule whose capacity is exceeded.
        rule: usize,
        /// That rule's capacity.
        capacity: u64,
    },
    /// An empty key.
    #[error("a key must not be empty")]
    EmptyKey,
    /// A key longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    #[error("a key holds at most {max} bytes (got {len})")]
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A key containing a control character.
    #[error("a key must not contain control characters (found one at byte {position})")]
    KeyControlChar {
        /// Byte offset of the first control character.
        position: usize,
    },
    /// A configuration value outside its valid range (builder settings).
    #[error("invalid configuration: {what}")]
    InvalidConfig {
        /// What was wrong, naming the setting.
        what: String,
    },
    /// A Redis fault, classified.
    #[error("redis {kind}")]
    Redis {
        /// What kind of failure.
        kind: RedisFailure,
        /// The underlying error, when there is one (a deadline has none).
        #[source]
        source: Option<Box<dyn StdError + Send + Sync>>,
    },
}

/// The classes of Redis failure the circuit breaker distinguishes.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Error, RedisFailure};
///
/// let err = Error::redis(RedisFailure::Timeout, None);
/// assert!(err.is_timeout());
/// assert!(err.is_transient());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisFailure {
    /// Our deadline passed before a reply arrived. The outcome is unknown: the
    /// command may still run on the server.
    Timeout,
    /// The connection was refused (nothing listens).
    ConnectionRefused,
    /// The connection broke or could not be used. When it broke after the
    /// command was written, the outcome is unknown: the command may have run
    /// and only its reply been lost.
    ConnectionLost,
    /// The server did not know the script (after `SCRIPT FLUSH` or a restart) and
    /// reloading it failed.
    NoScript,
    /// The server is out of memory (`-OOM` under `noeviction`).
    OutOfMemory,
    /// The server is a read-only replica (`-READONLY`).
    ReadOnly,
    /// The server is still loading its dataset (`-LOADING`).
    Loading,
    /// A Redis Cluster could not serve the key's slot: the cluster is down or
    /// failing over (`-CLUSTERDOWN`, `-TRYAGAIN`, `-MASTERDOWN`), or a
    /// `-MOVED`/`-ASK` redirect still stood after the client's retries. The
    /// node refused the command before running it.
    ClusterUnavailable,
    /// Not asked: on a Redis Cluster, the master of the key's slot failed a
    /// call moments ago, so the check was answered at once instead of
    /// waiting on it again (see `tierlimit_redis`'s crate docs, "Redis
    /// Cluster"). Nothing was sent.
    NodeDown,
    /// The key holds a value of another type than its rule stores
    /// (`-WRONGTYPE`): something other than tierlimit wrote under its keys.
    /// A fault of that key, not of Redis, which answered: a circuit breaker
    /// counts it as an answer ([`Error::is_key_fault`]). Nothing was written.
    WrongType,
    /// The reply did not have the shape the script promises.
    MalformedReply,
    /// Any other server or client error.
    Other,
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RedisFailure::Timeout => "call passed its deadline",
            RedisFailure::ConnectionRefused => "connection refused",
            RedisFailure::ConnectionLost => "connection lost",
            RedisFailure::NoScript => "script missing (NOSCRIPT)",
            RedisFailure::OutOfMemory => "out of memory (OOM)",
            RedisFailure::ReadOnly => "read-only replica (READONLY)",
            RedisFailure::Loading => "loading dataset (LOADING)",
            RedisFailure::ClusterUnavailable => "cluster slot unavailable",
            RedisFailure::NodeDown => "the slot's master failed moments ago (not asked)",
            RedisFailure::WrongType => "the key holds another type (WRONGTYPE)",
            RedisFailure::MalformedReply => "malformed reply",
            RedisFailure::Other => "error",
        })
    }
}

impl RedisFailure {
    /// True when the command may have run on the server although no usable
    /// reply came back: the deadline passed, the connection broke after the
    /// command could have been written, the reply was malformed, or the error
    /// is unclassified. False when the server refused the command before
    /// running it (`-OOM`, `-NOSCRIPT`, `-READONLY`, `-LOADING`, a Cluster's
    /// `-CLUSTERDOWN`...) or nothing
    /// accepted the connection.
    ///
    /// A unit checked by such a call may be counted by Redis even though the
    /// policy answered: callers that account units exactly must allow for it.
    ///
    /// # Examples
    ///
    /// ```
    /// use tierlimit_core::RedisFailure;
    ///
    /// assert!(RedisFailure::ConnectionLost.may_have_run());
    /// assert!(!RedisFailure::ConnectionRefused.may_have_run());
    /// ```
    pub fn may_have_run(self) -> bool {
        match self {
            RedisFailure::Timeout
            | RedisFailure::ConnectionLost
            | RedisFailure::MalformedReply
            | RedisFailure::Other => true,
            RedisFailure::ConnectionRefused
            | RedisFailure::NoScript
            | RedisFailure::OutOfMemory
            | RedisFailure::ReadOnly
            | RedisFailure::Loading
            | RedisFailure::ClusterUnavailable
            | RedisFailure::NodeDown
            | RedisFailure::WrongType => false,
        }
    }
}

impl Error {
    /// A Redis fault of the given kind.
    pub fn redis(kind: RedisFailure, source: Option<Box<dyn StdError + Send + Sync>>) -> Self {
        Error::Redis { kind, source }
    }

    /// The Redis failure class, when this is a Redis fault.
    pub fn redis_failure(&self) -> Option<RedisFailure> {
        match self {
            Error::Redis { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// True for bad input and misconfiguration: retrying the same call cannot help.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, Error::Redis { .. })
    }

    /// True when our deadline passed (outcome unknown).
    pub fn is_timeout(&self) -> bool {
        self.redis_failure() == Some(RedisFailure::Timeout)
    }

    /// True when the connection was refused or lost.
    pub fn is_connection(&self) -> bool {
        matches!(
            self.redis_failure(),
            Some(RedisFailure::ConnectionRefused | RedisFailure::ConnectionLost)
        )
    }

    /// True for Redis faults that may go away by themselves (everything but a
    /// malformed reply, which means the scripts and the code disagree, and a
    /// key of another type, which stays until someone removes it), a Cluster
    /// failing over ([`RedisFailure::ClusterUnavailable`]) included.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.redis_failure(),
            Some(k) if k != RedisFailure::MalformedReply && k != RedisFailure::WrongType
        )
    }

    /// True for a fault of one key rather than of Redis
    /// ([`RedisFailure::WrongType`]): Redis answered, so a circuit breaker
    /// counts the call as answered, and a key someone else wrote under
    /// cannot trip it for every key.
    pub fn is_key_fault(&self) -> bool {
        self.redis_failure() == Some(RedisFailure::WrongType)
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
