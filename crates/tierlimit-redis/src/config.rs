//! How to reach Redis and how long to wait for it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Clock, Error, Result};

/// Where the scripts' "now" comes from.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tierlimit_core::FakeClock;
/// use tierlimit_redis::TimeSource;
///
/// // The default: Redis's own TIME, so app servers' clock skew changes nothing.
/// assert!(matches!(TimeSource::default(), TimeSource::Server));
/// // For tests, or managed Redis services that reject TIME in scripts.
/// let client = TimeSource::Client(Arc::new(FakeClock::default()));
/// # let _ = client;
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum TimeSource {
    /// The server's clock (`TIME` inside the script). Every instance sees the
    /// same time whatever its own clock says.
    #[default]
    Server,
    /// This process's clock ([`Clock::unix_micros`]), sent with every call.
    /// Instances whose clocks disagree make different decisions.
    Client(Arc<dyn Clock>),
}

impl fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeSource::Server => f.write_str("Server"),
            TimeSource::Client(clock) => f.debug_tuple("Client").field(clock).finish(),
        }
    }
}

/// Settings of a [`RedisTier`](crate::RedisTier). Setters never fail;
/// [`RedisTier::new`](crate::RedisTier::new) validates everything and answers
/// [`Error::InvalidConfig`] naming the bad setting.
///
/// The defaults suit a rate limiter, not redis-rs's general-purpose defaults
/// (500 ms response timeout, six reconnect attempts with growing delays):
/// a 50 ms deadline on every call, a 200 ms connect timeout, one reconnect
/// retry at most 20 ms later, and `TCP_NODELAY` on.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tierlimit_redis::{RedisTier, RedisTierConfig, TimeSource};
///
/// let config = RedisTierConfig::new("redis://127.0.0.1:6380/")
///     .deadline(Duration::from_millis(30))
///     .time_source(TimeSource::Server);
/// let tier = RedisTier::new(config)?; // no I/O: Redis may be down
/// assert_eq!(tier.deadline(), Duration::from_millis(30));
///
/// let bad = RedisTierConfig::new("redis://127.0.0.1:6380/").deadline(Duration::ZERO);
/// assert!(RedisTier::new(bad).is_err());
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Clone)]
pub struct RedisTierConfig {
    pub(crate) url: String,
    pub(crate) deadline: Duration,
    pub(crate) time_source: TimeSource,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_retries: usize,
    pub(crate) reconnect_max_delay: Duration,
}

/// The longest deadline, connect timeout or reconnect delay accepted: longer
/// waits defeat the point of a rate limiter's hard deadline.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// The most reconnect retries accepted.
const MAX_RETRIES: usize = 10;
/// The first reconnect delay; later ones double up to the max delay.
pub(crate) const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(2);

impl RedisTierConfig {
    /// Settings for the server at `url` (`redis://host:port/db`,
    /// `rediss://` for TLS where redis-rs supports it), with the defaults.
    pub fn new(url: impl Into<String>) -> Self {
        RedisTierConfig {
            url: url.into(),
            deadline: Duration::from_millis(50),
            time_source: TimeSource::Server,
            connect_timeout: Duration::from_millis(200),
            reconnect_retries: 1,
            reconnect_max_delay: Duration::from_millis(20),
        }
    }

    /// The hard bound on every call, connecting included (default 50 ms;
    /// 1 ms to 60 s). A call past it fails with a
    /// [`Timeout`](tierlimit_core::RedisFailure::Timeout) whose outcome is
    /// unknown: the script may still run.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Where "now" comes from (default [`TimeSource::Server`]).
    pub fn time_source(mut self, time_source: TimeSource) -> Self {
        self.time_source = time_source;
        self
    }

    /// How long one connection attempt may take (default 200 ms; 1 ms to 60 s).
    /// Calls still give up at their deadline; the attempt goes on for the next call.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many times a failed (re)connection is retried before a call sees
    /// the error (default 1; at most 10).
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// The longest wait between reconnection attempts (default 20 ms; 2 ms to 60 s).
    pub fn reconnect_max_delay(mut self, delay: Duration) -> Self {
        self.reconnect_max_delay = delay;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let in_range = |what: &str, value: Duration, min: Duration| {
            if value < min || value > MAX_WAIT {
                Err(invalid(format!(
                    "{what} must be between {min:?} and {MAX_WAIT:?} (got {value:?})"
                )))
            } else {
                Ok(())
            }
        };
        in_range("deadline", self.deadline, Duration::from_millis(1))?;
        in_range(
            "connect_timeout",
            self.connect_timeout,
            Duration::from_millis(1),
        )?;
        in_range(
            "reconnect_max_delay",
            self.reconnect_max_delay,
            RECONNECT_MIN_DELAY,
        )?;
        if self.reconnect_retries > MAX_RETRIES {
            return Err(invalid(format!(
                "reconnect_retries must be at most {MAX_RETRIES} (got {})",
                self.reconnect_retries
            )));
        }
        Ok(())
    }
}

impl fmt::Debug for RedisTierConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTierConfig")
            .field("url", &redacted(&self.url))
            .field("deadline", &self.deadline)
            .field("time_source", &self.time_source)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_retries", &self.reconnect_retries)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .finish()
    }
}

/// The URL without its credentials (`redis://user:secret@host` becomes
/// `redis://***@host`), for logs.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

pub(crate) fn invalid(what: String) -> Error {
    Error::InvalidConfig { what }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_credentials() {
        let config = RedisTierConfig::new("redis://user:s3cret@cache.internal:6380/0");
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("redis://***@cache.internal:6380/0"),
            "{shown}"
        );
        assert_eq!(redacted("redis://127.0.0.1/"), "redis://127.0.0.1/");
    }
}
