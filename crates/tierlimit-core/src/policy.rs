//! What to answer when Redis cannot be asked.

/// What a rule set answers while Redis is slow, hung or gone.
///
/// Set per [`RuleSet`](crate::RuleSet) with a limiter-wide default: a login rule
/// fails closed while a read API falls back to local buckets.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Policy, Rule, RuleSet};
///
/// let login = RuleSet::new("login", [Rule::per_minute(5)?])?.with_policy(Policy::FailClosed);
/// assert_eq!(login.policy(), Some(Policy::FailClosed));
/// assert_eq!(Policy::default(), Policy::LocalFallback);
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Policy {
    /// Admit everything (availability over protection).
    FailOpen,
    /// Deny everything (protection over availability).
    FailClosed,
    /// Decide with per-process buckets sized to this instance's share of the
    /// global limit, so the fleet as a whole admits about the global limit.
    #[default]
    LocalFallback,
}

impl Policy {
    /// A short lowercase name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::FailOpen => "fail_open",
            Policy::FailClosed => "fail_closed",
            Policy::LocalFallback => "local_fallback",
        }
    }
}
