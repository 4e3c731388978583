//! How to reach Redis and how long to wait for it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Clock, Error, Result, SystemClock};

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
    #[cfg(feature = "tls")]
    pub(crate) tls: TlsSettings,
    pub(crate) deadline: Duration,
    pub(crate) time_source: TimeSource,
    pub(crate) local_clock: Arc<dyn Clock>,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_retries: usize,
    pub(crate) reconnect_max_delay: Duration,
    pub(crate) max_batch: usize,
}

/// The longest deadline, connect timeout or reconnect delay accepted: longer
/// waits defeat the point of a rate limiter's hard deadline.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// The most reconnect retries accepted.
const MAX_RETRIES: usize = 10;
/// Checks per batch call by default: 32 GCRA checks keep Redis busy for
/// about 0.5 ms per call (measured ≈ 15 µs per check inside the script on
/// these machines, see BENCHMARKS.md), short enough not to stall other
/// clients, long enough that the fixed cost of a call is spread thin.
pub const DEFAULT_MAX_BATCH: usize = 32;
/// The largest batch accepted (the batch script refuses more than 1000).
const MAX_BATCH: usize = 1000;
/// The first reconnect delay; later ones double up to the max delay.
pub(crate) const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(2);

impl RedisTierConfig {
    /// Settings for the server at `url`, with the defaults.
    ///
    /// * `redis://host:port/db`: plain TCP.
    /// * `redis://user:password@host:port/db`: an ACL user (Redis 6+); a
    ///   password alone is `redis://:password@host/`. Credentials are
    ///   percent-decoded. A wrong password cannot be found without I/O, so it
    ///   shows up on the first call as a Redis fault (`WRONGPASS`,
    ///   [`RedisFailure::Other`](tierlimit_core::RedisFailure::Other)).
    /// * `rediss://host:port/db` (needs the `tls` feature, on by default):
    ///   TLS. The server's certificate is verified against the system's trust
    ///   store, or only against
    ///   [`tls_root_certificates`](Self::tls_root_certificates) when given, and
    ///   its name must match the URL's host. There is no way to switch
    ///   verification off: redis-rs's `#insecure` fragment is refused.
    /// * `redis+cluster://host1:7000,host2:7001/` (needs the `cluster`
    ///   feature, on by default): a Redis Cluster, found from these seed nodes
    ///   (one is enough; more help while one is down). Credentials, path and
    ///   query apply to every node (`redis+cluster://user:pass@h1:7000,h2:7001/`);
    ///   `rediss+cluster://` is TLS to every node. Each check goes to the
    ///   master of its key's hash slot, on one reconnecting connection per
    ///   master; a `MOVED` or `ASK` reply is followed once, at once, and a
    ///   second redirection is the check's answer (a fault, so the policy's).
    ///   The whole check stays within the [deadline](Self::deadline).
    ///   [`connect_timeout`](Self::connect_timeout),
    ///   [`reconnect_retries`](Self::reconnect_retries) and
    ///   [`reconnect_max_delay`](Self::reconnect_max_delay) apply to each
    ///   master's connection as to a single server's.
    ///
    /// Every place that prints the URL (this config's `Debug`, the tier's, and
    /// every error) shows it through [`redact_url`].
    pub fn new(url: impl Into<String>) -> Self {
        RedisTierConfig {
            url: url.into(),
            #[cfg(feature = "tls")]
            tls: TlsSettings::default(),
            deadline: Duration::from_millis(50),
            time_source: TimeSource::Server,
            local_clock: Arc::new(SystemClock),
            connect_timeout: Duration::from_millis(200),
            reconnect_retries: 1,
            reconnect_max_delay: Duration::from_millis(20),
            max_batch: DEFAULT_MAX_BATCH,
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

    /// The clock the write-backs' times are on (default the system clock): the
    /// one that stamped what the local tier admitted. On server time a
    /// write-back tells Redis this clock's time as it is sent, and the script
    /// moves the units' times onto the server's by the difference: a host
    /// whose clock is behind Redis' would otherwise see units of a window
    /// still live on Redis' clock dropped as passed. (On client time both
    /// are the [`TimeSource::Client`] clock.)
    pub fn local_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.local_clock = clock;
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

    /// The most checks one script call may carry (default 32; 1 to 1000; 1
    /// turns batching off). Checks that arrive while calls are in flight
    /// queue and go together in one call (when a call ends, once the queue
    /// is as large as the calls in flight, or once it has waited a tenth of
    /// the deadline), each decided as if sent alone, in
    /// arrival order; a check on an idle connection goes at once. See
    /// [`RedisTier::check_key`](crate::RedisTier::check_key).
    pub fn max_batch(mut self, checks: usize) -> Self {
        self.max_batch = checks;
        self
    }

    /// Trusts only the CA certificates in `pem` (one or more PEM blocks) for
    /// `rediss://` servers, instead of the system's trust store. For a private
    /// CA, as Redis deployments inside a network usually have.
    ///
    /// A PEM that holds no certificate, or a non-`rediss://` URL with this set,
    /// is refused by [`RedisTier::new`](crate::RedisTier::new).
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_pem = Some(pem.into());
        self
    }

    /// Authenticates this client to a `rediss://` server with a certificate
    /// chain and its private key, both PEM (mutual TLS, Redis's
    /// `tls-auth-clients yes`).
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((chain_pem.into(), key_pem.into()));
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
        if !(1..=MAX_BATCH).contains(&self.max_batch) {
            return Err(invalid(format!(
                "max_batch must be 1 to {MAX_BATCH} (got {})",
                self.max_batch
            )));
        }
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
        let mut f = f.debug_struct("RedisTierConfig");
        f.field("url", &redact_url(&self.url));
        #[cfg(feature = "tls")]
        f.field("tls", &self.tls);
        f.field("deadline", &self.deadline)
            .field("time_source", &self.time_source)
            .field("local_clock", &self.local_clock)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_retries", &self.reconnect_retries)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

/// TLS material for `rediss://` servers. Certificates are public, but the key
/// is not: `Debug` says only what is set.
#[cfg(feature = "tls")]
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    pub(crate) root_pem: Option<Vec<u8>>,
    /// Certificate chain and private key.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl TlsSettings {
    pub(crate) fn is_set(&self) -> bool {
        self.root_pem.is_some() || self.client.is_some()
    }
}

#[cfg(feature = "tls")]
impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("root_certificates", &self.root_pem.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

/// `url` with its credentials hidden, for anything that prints it: logs,
/// `Debug`, error messages. `redis://user:secret@host:6379/0` becomes
/// `redis://***@host:6379/0`; a URL without credentials comes back unchanged.
///
/// Everything between the scheme and the last `@` is hidden, so a password
/// holding `@`, `:` or `/` unencoded is hidden too, and so is a malformed URL
/// without a scheme (`user:secret@host`). A URL that has an `@` elsewhere
/// loses more than its credentials: better too much hidden than a password
/// shown.
///
/// # Examples
///
/// ```
/// use tierlimit_redis::redact_url;
///
/// assert_eq!(redact_url("rediss://app:s3cret@cache:6380/0"), "rediss://***@cache:6380/0");
/// assert_eq!(redact_url("redis://127.0.0.1/"), "redis://127.0.0.1/");
/// assert_eq!(redact_url("app:s3cret@cache"), "***@cache");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_string();
    };
    let start = match url.find("://") {
        Some(scheme) if scheme < at => scheme + 3,
        _ => 0,
    };
    format!("{}***{}", &url[..start], &url[at..])
}

/// `text` (a message from redis-rs or our own) with every trace of `url`'s
/// credentials replaced: the whole URL by its redacted form, then its
/// userinfo, and its password alone, raw and percent-decoded. redis-rs's
/// messages carry no URL today; this keeps it so if one ever does.
pub(crate) fn scrub(text: &str, url: &str) -> String {
    let mut text = text.replace(url, &redact_url(url));
    let Some(at) = url.rfind('@') else {
        return text;
    };
    let start = url
        .find("://")
        .map_or(0, |s| if s < at { s + 3 } else { 0 });
    let userinfo = &url[start..at];
    let password = userinfo.split_once(':').map_or("", |(_, p)| p);
    let decoded = percent_decode(password);
    for secret in [userinfo, password, decoded.as_str()] {
        // Short secrets would blank out ordinary words; the URL and its
        // userinfo were already replaced whole above.
        if secret.len() >= 4 {
            text = text.replace(secret, "***");
        }
    }
    text
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
        assert_eq!(redact_url("redis://127.0.0.1/"), "redis://127.0.0.1/");
    }

    #[test]
    fn redaction_hides_awkward_passwords() {
        for (url, shown) in [
            ("redis://:pa@ss@h:1/", "redis://***@h:1/"),
            ("redis://u:p/a?s#s@h/", "redis://***@h/"),
            ("u:secret@h", "***@h"),
            ("rediss://u:secret@h/", "rediss://***@h/"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
    }

    #[test]
    fn scrub_hides_the_password_in_any_message() {
        let url = "redis://app:s%40cret!@host:1/";
        let message = format!("failed for {url}: s@cret! / s%40cret! / app:s%40cret!");
        let clean = scrub(&message, url);
        assert!(!clean.contains("s@cret"), "{clean}");
        assert!(!clean.contains("s%40cret"), "{clean}");
        assert!(clean.contains("redis://***@host:1/"), "{clean}");
    }
}
