//! A TOML config file that builds the limiter and its rule sets.
//!
//! [`Config::load`] reads a file, [`Config::from_toml_str`] a string. Loading
//! checks everything the builder and the constructors would refuse, and reads
//! the TLS files, so a config that loads builds: [`Config::builder`] hands
//! back a [`HybridLimiterBuilder`] with every setting of the file applied, and
//! [`Config::rule_sets`] the rule sets, in file order. A file with mistakes is
//! a [`ConfigError`] listing **every** problem found, each with its field path
//! (and its line and column where the file has them):
//!
//! ```text
//! rule_sets.login.rules[1].limit: must be at least 1 (line 31, column 26)
//! breaker.jitter: must be in [0, 1) (got 1.5) (line 14, column 10)
//! limiter.default_policy: unknown policy "fail-opn": use "local-fallback", "fail-open" or "fail-closed" (line 7, column 18)
//! ```
//!
//! Unknown fields are errors too (a typo never falls back to a default
//! silently); a field that is not written takes the builder's default.
//!
//! # The format
//!
//! ```toml
#![doc = include_str!("../examples/tierlimit.toml")]
//! ```
//!
//! | field | type | default | meaning |
//! |---|---|---|---|
//! | `redis.url` | string, **required** | | [`redis_url`](HybridLimiterBuilder::redis_url): `redis://host:port/db`, `redis://user:password@host:port/db` (ACL user), `rediss://…` (TLS) |
//! | `redis.deadline` | duration | `"50ms"` | [`deadline`](HybridLimiterBuilder::deadline), 1 ms to 60 s, above `breaker.slow_call_threshold` |
//! | `redis.client_time` | boolean | `false` | [`client_time`](HybridLimiterBuilder::client_time) |
//! | `redis.max_batch` | integer | `32` | [`max_batch`](HybridLimiterBuilder::max_batch): most checks per script call, 1 to 1000 (1: no batching) |
//! | `redis.tls_ca_file` | path | system trust store | PEM CA certificates to trust only ([`tls_root_certificates`](HybridLimiterBuilder::tls_root_certificates)); needs `rediss://` |
//! | `redis.tls_client_cert_file`, `redis.tls_client_key_file` | paths, both or neither | none | client certificate chain and key, PEM ([`tls_client_certificate`](HybridLimiterBuilder::tls_client_certificate)) |
//! | `limiter.name` | string | the group | [`name`](HybridLimiterBuilder::name) (metrics label) |
//! | `limiter.group` | string | `"default"` | [`group`](HybridLimiterBuilder::group) |
//! | `limiter.default_policy` | policy | `"local-fallback"` | [`default_policy`](HybridLimiterBuilder::default_policy) |
//! | `limiter.overflow_policy` | `"fail-open"` or `"fail-closed"` | `"fail-closed"` | [`overflow_policy`](HybridLimiterBuilder::overflow_policy) |
//! | `limiter.instances` | `"learned"` or an integer ≥ 1 | `"learned"` | [`instances`](HybridLimiterBuilder::instances) |
//! | `limiter.assume_instances` | integer ≥ 1 | none | the count assumed until learned ([`Instances::Learned`]); only with `"learned"` |
//! | `limiter.heartbeat_every` | duration | `"1s"` | [`heartbeat_every`](HybridLimiterBuilder::heartbeat_every), 10 ms to 1 h |
//! | `limiter.instance_ttl` | duration | `"30s"` | [`instance_ttl`](HybridLimiterBuilder::instance_ttl), 2 × `heartbeat_every` to 1 day |
//! | `limiter.prune_every` | duration | `"10s"` | [`prune_every`](HybridLimiterBuilder::prune_every), 1 ms to 1 h |
//! | `breaker.*` | | see [`BreakerConfig`] | every field of [`BreakerConfig`], same names; durations as strings, rates as floats |
//! | `local.*` | integers | see [`LocalConfig`] | every field of [`LocalConfig`], same names |
//! | `reconcile.*` | | see [`ReconcileConfig`] | every field of [`ReconcileConfig`], same names |
//! | `rule_sets.<name>.rules` | array, **required**, 1 to 16 rules | | the rules, strings or tables (below) |
//! | `rule_sets.<name>.policy` | policy | the limiter's default | [`RuleSet::with_policy`] |
//! | `rule_sets.<name>.reconcile` | boolean | `true` | [`RuleSet::with_reconcile`] |
//! | `rule_sets.<name>.stripes` | integer, 1 to 64, at most every rule's limit and burst | `1` (no striping) | [`RuleSet::with_stripes`]: each key spread over this many sub-keys |
//!
//! * A **duration** is a string: a count and a unit, `"250us"`, `"50ms"`,
//!   `"2s"`, `"1m"` (a minute), `"1h"`, `"1d"`; see
//!   [`parse_duration`]. A bare number is
//!   refused: it has no unit.
//! * A **policy** is `"local-fallback"`, `"fail-open"` or `"fail-closed"`
//!   (`_` for `-` works too).
//! * A relative TLS path is relative to the config file's directory
//!   ([`Config::load`]) or to the current directory
//!   ([`Config::from_toml_str`]). The files are read when the config is
//!   loaded, so a missing file is a load error, and a changed file takes
//!   effect on the next load.
//! * A rule set's name is its key: 1 to 64 characters from `[A-Za-z0-9_.-]`
//!   (quote it as a TOML key if it holds a `.`: `[rule_sets."api.v1"]`).
//!   A file may hold no rule sets at all (rule sets made in code).
//!
//! ## Rules
//!
//! A rule is a string in the rule grammar (see [`Rule`]'s `FromStr`):
//! `"10/s"`, `"100/min"`, `"20/30s"`, `"1000/day@+08:00"` (a calendar day in
//! UTC+8). Such a rule is GCRA with a burst equal to its limit, or a fixed
//! window for a calendar (`@`) rule.
//!
//! Or a table, to choose the algorithm and the burst:
//!
//! | key | meaning |
//! |---|---|
//! | `rate` | a rule string, `"100/min"`; or, instead of it, both of: |
//! | `limit`, `per` | an integer ≥ 1 and a duration: `limit = 100, per = "1m"` |
//! | `algorithm` | `"gcra"` (default), `"token-bucket"`, `"sliding-log"`, `"sliding-window"`, `"fixed-window"` |
//! | `burst` | integer ≥ 1, GCRA and token bucket only (default: the limit) |
//! | `utc_offset` | `"+08:00"`, `"-05:30"` or `"UTC"`: a calendar window (fixed window only; with no `algorithm` it is `"fixed-window"`); the period must divide a day evenly |
//!
//! One set may not hold two rules with the same algorithm, period and UTC
//! offset (`"10/min"` and `"20/min"`): they would count in one storage key
//! (see [`RuleSet::identity`]). That, a burst on a window algorithm, or a
//! sliding log above its limit are each reported at the rule (or the field)
//! at fault.
//!
//! # Examples
//!
//! ```
//! use tierlimit::{Config, Policy};
//!
//! let config = Config::from_toml_str(r#"
//!     [redis]
//!     url = "redis://127.0.0.1:6379/"
//!     [rule_sets.login]
//!     policy = "fail-closed"
//!     rules = ["10/min", { limit = 100, per = "1h", algorithm = "sliding-window" }]
//! "#)?;
//! let login = &config.rule_sets()[0];
//! assert_eq!(login.policy(), Some(Policy::FailClosed));
//! assert_eq!(login.rules().len(), 2);
//! # let _builder = config.builder(); // then .build() inside a Tokio runtime
//!
//! let err = Config::from_toml_str(r#"
//!     [redis]
//!     url = "redis://127.0.0.1:6379/"
//!     deadlin = "50ms"
//!     [rule_sets.login]
//!     rules = ["10/min", { limit = 0, per = "1h" }]
//! "#).unwrap_err();
//! let paths: Vec<&str> = err.problems().iter().map(|p| p.path()).collect();
//! assert_eq!(paths, ["redis.deadlin", "rule_sets.login.rules[1].limit"]);
//! assert_eq!(err.problems()[1].message(), "must be at least 1");
//! # Ok::<(), tierlimit::ConfigError>(())
//! ```

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tierlimit_core::{
    Algorithm, Error, MAX_RULES, Policy, Rule, RuleSet, parse_duration, parse_rule_as,
    parse_utc_offset,
};
use tierlimit_local::LocalConfig;
use tierlimit_redis::{RedisTier, RedisTierConfig, redact_url};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::breaker::BreakerConfig;
use crate::limiter::{
    DEFAULT_DEADLINE, HybridLimiter, HybridLimiterBuilder, Instances, MAX_INSTANCE_TTL,
    MAX_PERIODIC, MIN_HEARTBEAT, MIN_PRUNE, in_range, slow_beyond_deadline,
};
use crate::reconcile::ReconcileConfig;

const DAY: Duration = Duration::from_secs(86_400);

/// A loaded, validated config file: the limiter's settings and the rule sets.
///
/// See the [module docs](crate::config) for the format. Its `Debug` never
/// shows the Redis password or the TLS key.
///
/// # Examples
///
/// ```no_run
/// use tierlimit::Config;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::load("/etc/myapp/tierlimit.toml")?;
/// let limiter = config.builder().build()?;
/// let login = config.rule_set("login").expect("the file has [rule_sets.login]");
/// let decision = limiter.check("user:42", login, 1).await?;
/// # let _ = decision; Ok(()) }
/// ```
#[derive(Clone, PartialEq)]
pub struct Config {
    redis_url: String,
    deadline: Option<Duration>,
    client_time: Option<bool>,
    max_batch: Option<usize>,
    tls_ca: Option<Vec<u8>>,
    tls_client: Option<(Vec<u8>, Vec<u8>)>,
    name: Option<String>,
    group: Option<String>,
    default_policy: Option<Policy>,
    overflow_policy: Option<Policy>,
    instances: Option<Instances>,
    heartbeat_every: Option<Duration>,
    instance_ttl: Option<Duration>,
    prune_every: Option<Duration>,
    breaker: BreakerConfig,
    local: LocalConfig,
    reconcile: ReconcileConfig,
    rule_sets: Vec<RuleSet>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("redis_url", &redact_url(&self.redis_url))
            .field("deadline", &self.deadline)
            .field("client_time", &self.client_time)
            .field("max_batch", &self.max_batch)
            .field("tls_ca", &self.tls_ca.is_some())
            .field("tls_client", &self.tls_client.is_some())
            .field("name", &self.name)
            .field("group", &self.group)
            .field("default_policy", &self.default_policy)
            .field("overflow_policy", &self.overflow_policy)
            .field("instances", &self.instances)
            .field("heartbeat_every", &self.heartbeat_every)
            .field("instance_ttl", &self.instance_ttl)
            .field("prune_every", &self.prune_every)
            .field("breaker", &self.breaker)
            .field("local", &self.local)
            .field("reconcile", &self.reconcile)
            .field("rule_sets", &self.rule_sets)
            .finish()
    }
}

impl Config {
    /// Parses and validates a config file's text. Relative TLS paths are
    /// relative to the current directory.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] with every problem found: TOML syntax (with line and
    /// column), unknown fields, wrong types, values out of range, bad rules,
    /// unreadable TLS files.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        parse(text, None)
    }

    /// Reads and validates the config file at `path`. Relative TLS paths are
    /// relative to the file's directory.
    ///
    /// # Errors
    ///
    /// As [`from_toml_str`](Self::from_toml_str); an unreadable file is a
    /// [`ConfigError`] too, whose one problem has an empty path.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        Config::from_file_bytes(path, std::fs::read(path).as_deref())
    }

    /// The config in `read`, what reading the file at `path` gave: what
    /// [`load`](Self::load) does once the file is read, for a caller that
    /// compares the bytes it read (the watcher) and must parse those same
    /// bytes, not a second read's.
    pub(crate) fn from_file_bytes(
        path: &Path,
        read: Result<&[u8], &std::io::Error>,
    ) -> Result<Config, ConfigError> {
        let cannot =
            |e: &dyn fmt::Display| ConfigError::io(format!("cannot read {}: {e}", path.display()));
        let text = std::str::from_utf8(read.map_err(|e| cannot(e))?).map_err(|e| cannot(&e))?;
        let dir = path.parent().unwrap_or(Path::new(""));
        parse(text, Some(dir))
    }

    /// A builder with every setting of the file applied; the settings the
    /// file leaves out keep the builder's defaults. Rule sets are not part of
    /// the builder: pass [`rule_sets`](Self::rule_sets) to the checks.
    ///
    /// Calling it again gives another builder with the same settings. Its
    /// [`build`](HybridLimiterBuilder::build) only fails outside a Tokio
    /// runtime: every setting was checked when the file was loaded.
    pub fn builder(&self) -> HybridLimiterBuilder {
        let mut b = HybridLimiter::builder().redis_url(self.redis_url.clone());
        if let Some(d) = self.deadline {
            b = b.deadline(d);
        }
        if let Some(on) = self.client_time {
            b = b.client_time(on);
        }
        if let Some(checks) = self.max_batch {
            b = b.max_batch(checks);
        }
        #[cfg(feature = "tls")]
        {
            if let Some(pem) = &self.tls_ca {
                b = b.tls_root_certificates(pem.clone());
            }
            if let Some((chain, key)) = &self.tls_client {
                b = b.tls_client_certificate(chain.clone(), key.clone());
            }
        }
        if let Some(name) = &self.name {
            b = b.name(name.clone());
        }
        if let Some(group) = &self.group {
            b = b.group(group.clone());
        }
        if let Some(p) = self.default_policy {
            b = b.default_policy(p);
        }
        if let Some(p) = self.overflow_policy {
            b = b.overflow_policy(p);
        }
        if let Some(i) = self.instances {
            b = b.instances(i);
        }
        if let Some(d) = self.heartbeat_every {
            b = b.heartbeat_every(d);
        }
        if let Some(d) = self.instance_ttl {
            b = b.instance_ttl(d);
        }
        if let Some(d) = self.prune_every {
            b = b.prune_every(d);
        }
        b.breaker(self.breaker.clone())
            .local(self.local.clone())
            .reconcile(self.reconcile.clone())
    }

    /// Every `[rule_sets.<name>]` of the file, **in file order**, each with
    /// its `policy` and `reconcile` applied when the file sets them.
    pub fn rule_sets(&self) -> &[RuleSet] {
        &self.rule_sets
    }

    /// `limiter.default_policy`, when the file sets it.
    pub(crate) fn default_policy(&self) -> Option<Policy> {
        self.default_policy
    }

    /// The settings that only apply when a limiter is built (everything but
    /// the rule sets and the default policy) whose values differ in `new`,
    /// by their path in the file. Compared as the builders they make, so a
    /// setting left out equals its default written out.
    pub(crate) fn restart_changes(&self, new: &Config) -> Vec<String> {
        self.builder()
            .start_changes(&new.builder())
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// The rule set named `name`, if the file has one.
    pub fn rule_set(&self, name: &str) -> Option<&RuleSet> {
        self.rule_sets.iter().find(|s| s.name() == name)
    }
}

/// Everything wrong with a config file: one [`ConfigProblem`] per mistake
/// found, not only the first. `Display` prints one problem per line.
///
/// # Examples
///
/// ```
/// use tierlimit::Config;
///
/// let err = Config::from_toml_str("[redis]\nurl = 5\n").unwrap_err();
/// assert_eq!(err.to_string(), "redis.url: expected a string, got an integer (line 2, column 7)");
/// assert_eq!(err.problems()[0].line(), Some(2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    problems: Vec<ConfigProblem>,
}

impl ConfigError {
    /// One problem with no field path: the file as a whole (unreadable,
    /// unwatchable).
    pub(crate) fn io(message: String) -> ConfigError {
        ConfigError {
            problems: vec![ConfigProblem {
                path: String::new(),
                message,
                line: None,
                column: None,
            }],
        }
    }

    /// An error of the limiter's own, as a problem of the file as a whole.
    pub(crate) fn from_error(error: tierlimit_core::Error) -> ConfigError {
        ConfigError::io(error.to_string())
    }

    /// The problems, in the order of the file (never empty).
    pub fn problems(&self) -> &[ConfigProblem] {
        &self.problems
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// One mistake in a config file: where (a field path such as
/// `rule_sets.login.rules[1].limit`, and the line and column when the file
/// has the field) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    path: String,
    message: String,
    line: Option<usize>,
    column: Option<usize>,
}

impl ConfigProblem {
    /// The field's path: TOML keys joined by `.`, array items as `[i]`
    /// (from 0), keys that are not bare quoted (`rule_sets."a b"`). Empty for
    /// problems of the file as a whole: TOML syntax, an unreadable file.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong, and what would be right.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The line (from 1) of the value at fault, when the file has it (a
    /// missing required field has none).
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The column (from 1, in characters) of the value at fault.
    pub fn column(&self) -> Option<usize> {
        self.column
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = match (self.line, self.column) {
            (Some(l), Some(c)) => Some(format!("line {l}, column {c}")),
            (Some(l), None) => Some(format!("line {l}")),
            _ => None,
        };
        match (self.path.is_empty(), at) {
            (true, Some(at)) => write!(f, "{at}: {}", self.message),
            (true, None) => f.write_str(&self.message),
            (false, Some(at)) => write!(f, "{}: {} ({at})", self.path, self.message),
            (false, None) => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

// ---------------------------------------------------------------------------
// The walk over the document.

type Value<'i> = Spanned<DeValue<'i>>;

/// The problems found so far, and what locating them needs.
struct Walk<'t> {
    text: &'t str,
    dir: Option<&'t Path>,
    problems: Vec<ConfigProblem>,
}

impl Walk<'_> {
    fn report(&mut self, path: &str, span: Option<Range<usize>>, message: impl Into<String>) {
        let (line, column) = match span {
            Some(span) => {
                let (l, c) = line_column(self.text, span.start);
                (Some(l), Some(c))
            }
            None => (None, None),
        };
        self.problems.push(ConfigProblem {
            path: path.to_owned(),
            message: message.into(),
            line,
            column,
        });
    }

    fn string<'v>(&mut self, path: &str, v: &'v Value<'_>) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s),
            other => {
                self.report(path, Some(v.span()), expected("a string", other));
                None
            }
        }
    }

    fn boolean(&mut self, path: &str, v: &Value<'_>) -> Option<bool> {
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                self.report(path, Some(v.span()), expected("a boolean", other));
                None
            }
        }
    }

    /// An integer of at least `min`.
    fn integer(&mut self, path: &str, v: &Value<'_>, min: u64) -> Option<u64> {
        let DeValue::Integer(i) = v.get_ref() else {
            self.report(path, Some(v.span()), expected("an integer", v.get_ref()));
            return None;
        };
        let digits = i.as_str().replace('_', "");
        let Ok(n) = i128::from_str_radix(&digits, i.radix()) else {
            self.report(path, Some(v.span()), "the integer does not fit in 64 bits");
            return None;
        };
        if n < i128::from(min) {
            let message = if n < 0 {
                format!("must be at least {min} (got {n})")
            } else {
                format!("must be at least {min}")
            };
            self.report(path, Some(v.span()), message);
            return None;
        }
        match u64::try_from(n) {
            Ok(n) => Some(n),
            Err(_) => {
                self.report(path, Some(v.span()), "the integer does not fit in 64 bits");
                None
            }
        }
    }

    fn u32(&mut self, path: &str, v: &Value<'_>) -> Option<u32> {
        let n = self.integer(path, v, 0)?;
        match u32::try_from(n) {
            Ok(n) => Some(n),
            Err(_) => {
                self.report(
                    path,
                    Some(v.span()),
                    format!("must be at most {}", u32::MAX),
                );
                None
            }
        }
    }

    fn usize(&mut self, path: &str, v: &Value<'_>) -> Option<usize> {
        let n = self.integer(path, v, 0)?;
        match usize::try_from(n) {
            Ok(n) => Some(n),
            Err(_) => {
                self.report(
                    path,
                    Some(v.span()),
                    format!("must be at most {}", usize::MAX),
                );
                None
            }
        }
    }

    /// A float; an integer is taken as its value (`backoff_multiplier = 2`).
    fn float(&mut self, path: &str, v: &Value<'_>) -> Option<f64> {
        let parsed = match v.get_ref() {
            DeValue::Float(x) => x.as_str().replace('_', "").parse::<f64>().ok(),
            DeValue::Integer(i) => i128::from_str_radix(&i.as_str().replace('_', ""), i.radix())
                .ok()
                .map(|n| n as f64),
            other => {
                self.report(path, Some(v.span()), expected("a number", other));
                return None;
            }
        };
        if parsed.is_none() {
            self.report(path, Some(v.span()), "not a number this file can hold");
        }
        parsed
    }

    fn duration(&mut self, path: &str, v: &Value<'_>) -> Option<Duration> {
        match v.get_ref() {
            DeValue::String(s) => match parse_duration(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    self.report(path, Some(v.span()), reason_of(&e));
                    None
                }
            },
            DeValue::Integer(i) => {
                self.report(
                    path,
                    Some(v.span()),
                    format!(
                        "expected a duration string with a unit, like \"{n}ms\" or \"{n}s\" (a bare number has no unit)",
                        n = i.as_str()
                    ),
                );
                None
            }
            other => {
                self.report(
                    path,
                    Some(v.span()),
                    expected("a duration string like \"50ms\" or \"2s\"", other),
                );
                None
            }
        }
    }

    fn policy(&mut self, path: &str, v: &Value<'_>) -> Option<Policy> {
        let s = self.string(path, v)?;
        match s.replace('_', "-").as_str() {
            "local-fallback" => Some(Policy::LocalFallback),
            "fail-open" => Some(Policy::FailOpen),
            "fail-closed" => Some(Policy::FailClosed),
            _ => {
                self.report(
                    path,
                    Some(v.span()),
                    format!(
                        "unknown policy {s:?}: use \"local-fallback\", \"fail-open\" or \"fail-closed\""
                    ),
                );
                None
            }
        }
    }

    fn algorithm(&mut self, path: &str, v: &Value<'_>) -> Option<Algorithm> {
        let s = self.string(path, v)?;
        match s.replace('_', "-").as_str() {
            "gcra" => Some(Algorithm::Gcra),
            "token-bucket" => Some(Algorithm::TokenBucket),
            "sliding-log" => Some(Algorithm::SlidingLog),
            "sliding-window" => Some(Algorithm::SlidingWindow),
            "fixed-window" => Some(Algorithm::FixedWindow),
            _ => {
                self.report(
                    path,
                    Some(v.span()),
                    format!(
                        "unknown algorithm {s:?}: use \"gcra\", \"token-bucket\", \"sliding-log\", \"sliding-window\" or \"fixed-window\""
                    ),
                );
                None
            }
        }
    }

    /// The fields of a table, in file order, after reporting every key not
    /// in `known` (a typo must not fall back to a default).
    fn fields<'a, 'i>(
        &mut self,
        path: &str,
        v: &'a Value<'i>,
        known: &[&str],
    ) -> Option<Fields<'a, 'i>> {
        let DeValue::Table(table) = v.get_ref() else {
            self.report(path, Some(v.span()), expected("a table", v.get_ref()));
            return None;
        };
        let mut fields = Fields {
            path: path.to_owned(),
            entries: entries(table),
        };
        fields.entries.retain(|(key, key_span, _)| {
            if known.contains(key) {
                return true;
            }
            let mut message = format!("unknown field; expected one of: {}", known.join(", "));
            if let Some(near) = nearest(key, known) {
                message = format!(
                    "unknown field (did you mean {near:?}?); expected one of: {}",
                    known.join(", ")
                );
            }
            self.report(&join(path, key), Some(key_span.clone()), message);
            false
        });
        Some(fields)
    }

    /// Reads a file named by the config, relative to its directory.
    fn read_file(&mut self, path: &str, v: &Value<'_>) -> Option<Vec<u8>> {
        let name = self.string(path, v)?;
        if name.is_empty() {
            self.report(
                path,
                Some(v.span()),
                "must not be empty: a path to a PEM file",
            );
            return None;
        }
        let file = match self.dir {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        };
        match std::fs::read(&file) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                self.report(
                    path,
                    Some(v.span()),
                    format!("cannot read {}: {e}", file.display()),
                );
                None
            }
        }
    }
}

/// A table's entries, in file order.
struct Fields<'a, 'i> {
    path: String,
    entries: Vec<(&'a str, Range<usize>, &'a Value<'i>)>,
}

impl<'a, 'i> Fields<'a, 'i> {
    fn get(&self, key: &str) -> Option<&'a Value<'i>> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, _, v)| *v)
    }

    fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    fn span(&self, key: &str) -> Option<Range<usize>> {
        self.get(key).map(Spanned::span)
    }
}

/// A table's entries sorted by their place in the file (the parser's map is
/// sorted by key).
fn entries<'a, 'i>(table: &'a DeTable<'i>) -> Vec<(&'a str, Range<usize>, &'a Value<'i>)> {
    let mut entries: Vec<_> = table
        .iter()
        .map(|(k, v)| (k.get_ref().as_ref(), k.span(), v))
        .collect();
    entries.sort_by_key(|(_, span, _)| span.start);
    entries
}

fn join(path: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let key: Cow<'_, str> = if bare {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("{key:?}"))
    };
    if path.is_empty() {
        key.into_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date-time",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

fn expected(what: &str, got: &DeValue<'_>) -> String {
    format!("expected {what}, got {}", type_name(got))
}

/// Line and column (from 1; the column in characters) of byte `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// The known name closest to `key`, when it is a likely typo (edit distance
/// at most 2).
fn nearest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The reason of a text-parsing error, or its whole message.
fn reason_of(e: &Error) -> String {
    match e {
        Error::InvalidDuration { text, reason } => format!("{text:?} is not a duration: {reason}"),
        Error::InvalidRuleSpec { spec, reason } => format!("{spec:?} is not a rule: {reason}"),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------
// The sections.

fn parse(text: &str, dir: Option<&Path>) -> Result<Config, ConfigError> {
    let (doc, syntax) = DeTable::parse_recoverable(text);
    let mut w = Walk {
        text,
        dir,
        problems: Vec::new(),
    };
    if !syntax.is_empty() {
        for e in syntax {
            w.report("", e.span(), format!("TOML syntax: {}", e.message()));
        }
        return Err(ConfigError {
            problems: w.problems,
        });
    }
    let root = Spanned::new(doc.span(), DeValue::Table(doc.into_inner()));
    let top = w
        .fields(
            "",
            &root,
            &[
                "redis",
                "limiter",
                "breaker",
                "local",
                "reconcile",
                "rule_sets",
            ],
        )
        .unwrap_or_else(|| Fields {
            path: String::new(),
            entries: Vec::new(),
        });
    let config = sections(&mut w, &top);
    match config {
        Some(config) if w.problems.is_empty() => Ok(config),
        _ => {
            if w.problems.is_empty() {
                // Every section that gives up reports why first; this only
                // keeps the promise that an error is never empty.
                w.report("", None, "the config is incomplete");
            }
            // Sections are walked in a fixed order; report in file order
            // (problems without a place, like a missing field, first).
            w.problems
                .sort_by_key(|p| (p.line.unwrap_or(0), p.column.unwrap_or(0)));
            Err(ConfigError {
                problems: w.problems,
            })
        }
    }
}

fn sections(w: &mut Walk<'_>, top: &Fields<'_, '_>) -> Option<Config> {
    let redis = redis_section(w, top.get("redis"));
    let limiter = limiter_section(w, top.get("limiter"));
    let breaker = breaker_section(w, top.get("breaker"));
    let local = local_section(w, top.get("local"));
    let reconcile = reconcile_section(w, top.get("reconcile"));
    let rule_sets = rule_sets_section(w, top.get("rule_sets"));
    let redis = redis?;
    let limiter = limiter?;
    let deadline = redis.deadline.unwrap_or(DEFAULT_DEADLINE);
    // Compared only when each is right on its own: a wrong one is reported.
    let wrong = |path: &str| w.problems.iter().any(|p| p.path == path);
    if breaker.slow_call_threshold >= deadline
        && !wrong("redis.deadline")
        && !wrong("breaker.slow_call_threshold")
    {
        let (path, span) = match table_span(top.get("breaker"), "slow_call_threshold") {
            Some(span) => ("breaker.slow_call_threshold", Some(span)),
            None => ("redis.deadline", table_span(top.get("redis"), "deadline")),
        };
        w.report(
            path,
            span,
            slow_beyond_deadline(breaker.slow_call_threshold, deadline),
        );
    }
    Some(Config {
        redis_url: redis.url,
        deadline: redis.deadline,
        client_time: redis.client_time,
        max_batch: redis.max_batch,
        tls_ca: redis.tls_ca,
        tls_client: redis.tls_client,
        name: limiter.name,
        group: limiter.group,
        default_policy: limiter.default_policy,
        overflow_policy: limiter.overflow_policy,
        instances: limiter.instances,
        heartbeat_every: limiter.heartbeat_every,
        instance_ttl: limiter.instance_ttl,
        prune_every: limiter.prune_every,
        breaker,
        local,
        reconcile,
        rule_sets,
    })
}

/// Where `key` of the table `section` is written, if it is.
fn table_span(section: Option<&Value<'_>>, key: &str) -> Option<Range<usize>> {
    match section?.get_ref() {
        DeValue::Table(table) => table.get(key).map(Spanned::span),
        _ => None,
    }
}

struct RedisSection {
    url: String,
    deadline: Option<Duration>,
    client_time: Option<bool>,
    max_batch: Option<usize>,
    tls_ca: Option<Vec<u8>>,
    tls_client: Option<(Vec<u8>, Vec<u8>)>,
}

fn redis_section(w: &mut Walk<'_>, v: Option<&Value<'_>>) -> Option<RedisSection> {
    const URL_HINT: &str = "required: the Redis URL, like \"redis://127.0.0.1:6379/\"";
    let Some(v) = v else {
        w.report("redis.url", None, URL_HINT);
        return None;
    };
    let before = w.problems.len();
    let f = w.fields(
        "redis",
        v,
        &[
            "url",
            "deadline",
            "client_time",
            "max_batch",
            "tls_ca_file",
            "tls_client_cert_file",
            "tls_client_key_file",
        ],
    )?;
    let url = match f.get("url") {
        Some(v) => w.string("redis.url", v).map(str::to_owned),
        None => {
            w.report("redis.url", None, URL_HINT);
            None
        }
    };
    let deadline = f
        .get("deadline")
        .and_then(|v| w.duration("redis.deadline", v));
    let client_time = f
        .get("client_time")
        .and_then(|v| w.boolean("redis.client_time", v));
    let max_batch = f
        .get("max_batch")
        .and_then(|v| w.usize("redis.max_batch", v));
    if let Some(checks) = max_batch
        && let Err(e) =
            RedisTier::new(RedisTierConfig::new("redis://127.0.0.1:6379/").max_batch(checks))
    {
        w.report(
            "redis.max_batch",
            f.span("max_batch"),
            field_message(&e, "max_batch"),
        );
    }
    let tls_ca = f
        .get("tls_ca_file")
        .and_then(|v| w.read_file("redis.tls_ca_file", v));
    let cert = f
        .get("tls_client_cert_file")
        .and_then(|v| w.read_file("redis.tls_client_cert_file", v));
    let key = f
        .get("tls_client_key_file")
        .and_then(|v| w.read_file("redis.tls_client_key_file", v));
    match (f.get("tls_client_cert_file"), f.get("tls_client_key_file")) {
        (Some(v), None) => w.report(
            "redis.tls_client_cert_file",
            Some(v.span()),
            "needs tls_client_key_file too: a client certificate goes with its key",
        ),
        (None, Some(v)) => w.report(
            "redis.tls_client_key_file",
            Some(v.span()),
            "needs tls_client_cert_file too: a client key goes with its certificate",
        ),
        _ => {}
    }
    if !cfg!(feature = "tls") {
        for key in ["tls_ca_file", "tls_client_cert_file", "tls_client_key_file"] {
            if let Some(span) = f.span(key) {
                w.report(
                    &f.path(key),
                    Some(span),
                    "needs the `tls` feature of tierlimit (on by default)",
                );
            }
        }
    }
    let tls_client = cert.zip(key);
    // The Redis tier's own checks (URL, deadline, TLS material): it does no
    // I/O and needs no runtime, so loading runs exactly what build() will.
    // The deadline is checked on a URL known to be good, so a bad URL and a
    // bad deadline are both reported.
    if let Some(d) = deadline
        && let Err(e) = RedisTier::new(RedisTierConfig::new("redis://127.0.0.1:6379/").deadline(d))
    {
        w.report(
            "redis.deadline",
            f.span("deadline"),
            field_message(&e, "deadline"),
        );
    }
    let url = url?;
    let base = RedisTierConfig::new(url.clone());
    let url_ok = match RedisTier::new(base.clone()) {
        Ok(_) => true,
        Err(e) => {
            w.report("redis.url", f.span("url"), field_message(&e, "url"));
            false
        }
    };
    #[cfg(feature = "tls")]
    if url_ok {
        if let Some(pem) = &tls_ca
            && let Err(e) = RedisTier::new(base.clone().tls_root_certificates(pem.clone()))
        {
            w.report(
                "redis.tls_ca_file",
                f.span("tls_ca_file"),
                field_message(&e, "url"),
            );
        }
        if let Some((chain, key)) = &tls_client
            && let Err(e) = RedisTier::new(
                base.clone()
                    .tls_client_certificate(chain.clone(), key.clone()),
            )
        {
            w.report(
                "redis.tls_client_cert_file",
                f.span("tls_client_cert_file"),
                field_message(&e, "url"),
            );
        }
    }
    // Each part passed on its own: now all of them together, as build()
    // will hand them over.
    if url_ok && w.problems.len() == before {
        let mut full = base;
        if let Some(d) = deadline {
            full = full.deadline(d);
        }
        if let Some(checks) = max_batch {
            full = full.max_batch(checks);
        }
        #[cfg(feature = "tls")]
        {
            if let Some(pem) = &tls_ca {
                full = full.tls_root_certificates(pem.clone());
            }
            if let Some((chain, key)) = &tls_client {
                full = full.tls_client_certificate(chain.clone(), key.clone());
            }
        }
        if let Err(e) = RedisTier::new(full) {
            w.report("redis", Some(v.span()), field_message(&e, ""));
        }
    }
    Some(RedisSection {
        url,
        deadline,
        client_time,
        max_batch,
        tls_ca,
        tls_client,
    })
}

struct LimiterSection {
    name: Option<String>,
    group: Option<String>,
    default_policy: Option<Policy>,
    overflow_policy: Option<Policy>,
    instances: Option<Instances>,
    heartbeat_every: Option<Duration>,
    instance_ttl: Option<Duration>,
    prune_every: Option<Duration>,
}

fn limiter_section(w: &mut Walk<'_>, v: Option<&Value<'_>>) -> Option<LimiterSection> {
    let mut s = LimiterSection {
        name: None,
        group: None,
        default_policy: None,
        overflow_policy: None,
        instances: None,
        heartbeat_every: None,
        instance_ttl: None,
        prune_every: None,
    };
    let Some(v) = v else {
        return Some(s);
    };
    let f = w.fields(
        "limiter",
        v,
        &[
            "name",
            "group",
            "default_policy",
            "overflow_policy",
            "instances",
            "assume_instances",
            "heartbeat_every",
            "instance_ttl",
            "prune_every",
        ],
    )?;
    if let Some(v) = f.get("name")
        && let Some(name) = w.string("limiter.name", v)
    {
        if name.is_empty() {
            w.report("limiter.name", Some(v.span()), "must not be empty");
        } else {
            s.name = Some(name.to_owned());
        }
    }
    if let Some(v) = f.get("group")
        && let Some(group) = w.string("limiter.group", v)
    {
        // The group is part of a Redis key: build() holds it to the rule set
        // name rules, and so does this.
        let ok = Rule::per_second(1)
            .and_then(|r| RuleSet::new(group, [r]))
            .is_ok();
        if ok {
            s.group = Some(group.to_owned());
        } else {
            w.report(
                "limiter.group",
                Some(v.span()),
                format!("invalid group {group:?}: use 1 to 64 characters from [A-Za-z0-9_.-]"),
            );
        }
    }
    s.default_policy = f
        .get("default_policy")
        .and_then(|v| w.policy("limiter.default_policy", v));
    if let Some(v) = f.get("overflow_policy")
        && let Some(p) = w.policy("limiter.overflow_policy", v)
    {
        if p == Policy::LocalFallback {
            w.report(
                "limiter.overflow_policy",
                Some(v.span()),
                "must be \"fail-open\" or \"fail-closed\": it answers when local fallback has no room",
            );
        } else {
            s.overflow_policy = Some(p);
        }
    }
    let fixed = match f.get("instances") {
        None => None,
        Some(v) => match v.get_ref() {
            DeValue::String(t) if t.as_ref() == "learned" => Some(false),
            DeValue::Integer(_) => {
                let n = w.integer("limiter.instances", v, 1);
                if let Some(n) = n {
                    s.instances = Some(Instances::Fixed(n));
                }
                Some(true)
            }
            DeValue::String(t) => {
                w.report(
                    "limiter.instances",
                    Some(v.span()),
                    format!(
                        "expected \"learned\" or a number of instances (at least 1), got {t:?}"
                    ),
                );
                None
            }
            other => {
                w.report(
                    "limiter.instances",
                    Some(v.span()),
                    expected("\"learned\" or a number of instances", other),
                );
                None
            }
        },
    };
    if let Some(v) = f.get("assume_instances") {
        if fixed == Some(true) {
            w.report(
                "limiter.assume_instances",
                Some(v.span()),
                "only with instances = \"learned\": a fixed count needs no assumption",
            );
        } else if let Some(n) = w.integer("limiter.assume_instances", v, 1) {
            s.instances = Some(Instances::Learned { assume: Some(n) });
        }
    } else if fixed == Some(false) {
        s.instances = Some(Instances::Learned { assume: None });
    }
    // build()'s own range checks, field by field.
    let defaults = HybridLimiter::builder();
    let duration = |w: &mut Walk<'_>, key: &str, min: Duration, max: Duration| {
        let v = f.get(key)?;
        let path = f.path(key);
        let d = w.duration(&path, v)?;
        match in_range(key, d, min, max) {
            Ok(()) => Some(d),
            Err(e) => {
                w.report(&path, Some(v.span()), field_message(&e, key));
                None
            }
        }
    };
    s.heartbeat_every = duration(w, "heartbeat_every", MIN_HEARTBEAT, MAX_PERIODIC);
    s.prune_every = duration(w, "prune_every", MIN_PRUNE, MAX_PERIODIC);
    let heartbeat_ok = f.get("heartbeat_every").is_none() || s.heartbeat_every.is_some();
    let heartbeat = s.heartbeat_every.unwrap_or(defaults.heartbeat_every);
    if heartbeat_ok {
        match f.get("instance_ttl") {
            Some(_) => {
                s.instance_ttl = duration(w, "instance_ttl", heartbeat * 2, MAX_INSTANCE_TTL);
            }
            None => {
                // The default TTL must still fit a heartbeat set here.
                if let Err(e) = in_range(
                    "instance_ttl",
                    defaults.instance_ttl,
                    heartbeat * 2,
                    MAX_INSTANCE_TTL,
                ) {
                    w.report(
                        "limiter.instance_ttl",
                        f.span("heartbeat_every"),
                        format!(
                            "{} (the default, as it is not set here; set it to at least twice heartbeat_every)",
                            field_message(&e, "instance_ttl")
                        ),
                    );
                }
            }
        }
    } else if let Some(v) = f.get("instance_ttl") {
        // Checked against a heartbeat that is wrong itself would only echo it.
        s.instance_ttl = w.duration("limiter.instance_ttl", v);
    }
    Some(s)
}

/// An `InvalidConfig` message about `field` without the field's name: what
/// is wrong with it.
fn field_message(e: &Error, field: &str) -> String {
    let what = match e {
        Error::InvalidConfig { what } => what.as_str(),
        _ => return e.to_string(),
    };
    what.strip_prefix(field)
        .map(str::trim_start)
        .unwrap_or(what)
        .to_owned()
}

/// One field of a settings struct: its name, and how to read it from the
/// file into the struct and to put its default back.
struct Setting<C> {
    name: &'static str,
    read: fn(&mut Walk<'_>, &str, &Value<'_>, &mut C) -> bool,
    /// Puts a value that passes back, once the field was reported: the
    /// default, or for a field whose range depends on another, a value
    /// inside that range.
    reset: fn(&mut C, &C),
    /// A field whose value this one's range depends on.
    after: Option<&'static str>,
}

macro_rules! setting {
    ($ty:ty, $field:ident, $reader:ident) => {
        setting!($ty, $field, $reader, None, |c, d| c.$field =
            d.$field.clone())
    };
    ($ty:ty, $field:ident, $reader:ident, $after:expr, $reset:expr) => {
        Setting::<$ty> {
            name: stringify!($field),
            read: |w, path, v, c| match w.$reader(path, v) {
                Some(x) => {
                    c.$field = x;
                    true
                }
                None => false,
            },
            reset: $reset,
            after: $after,
        }
    };
}

/// Reads a settings section field by field, then runs its own `validate`
/// until it passes: each failure is reported at the field it names, and that
/// field is put back to its default so the next failure shows. A field whose
/// range depends on one already reported is not reported again.
fn settings_section<C: Clone>(
    w: &mut Walk<'_>,
    section: &str,
    v: Option<&Value<'_>>,
    settings: &[Setting<C>],
    default: C,
    validate: fn(&C) -> Result<(), Error>,
    message_prefix: &str,
) -> C {
    let mut config = default.clone();
    let Some(v) = v else {
        return config;
    };
    let names: Vec<&str> = settings.iter().map(|s| s.name).collect();
    let Some(f) = w.fields(section, v, &names) else {
        return config;
    };
    let mut failed: Vec<&str> = Vec::new();
    for s in settings {
        if let Some(v) = f.get(s.name)
            && !(s.read)(w, &f.path(s.name), v, &mut config)
        {
            failed.push(s.name);
        }
    }
    let mut reported: Vec<&str> = Vec::new();
    for _ in 0..=settings.len() {
        let what = match validate(&config) {
            Ok(()) => break,
            Err(Error::InvalidConfig { what }) => what,
            Err(e) => e.to_string(),
        };
        let rest = what.strip_prefix(message_prefix).unwrap_or(&what);
        let Some(s) = settings.iter().find(|s| {
            rest.strip_prefix(s.name)
                .is_some_and(|after| after.starts_with(' '))
        }) else {
            w.report(section, Some(v.span()), what.clone());
            break;
        };
        let depends_on_failed = s.after.is_some_and(|a| failed.contains(&a));
        if reported.contains(&s.name) {
            // Its reset value failed too: nothing more can be learned.
            break;
        }
        reported.push(s.name);
        if !depends_on_failed {
            let message = rest[s.name.len()..].trim_start().to_owned();
            match f.span(s.name) {
                Some(span) => w.report(&f.path(s.name), Some(span), message),
                None => w.report(
                    &f.path(s.name),
                    Some(v.span()),
                    format!("{message} (the default, as it is not set here)"),
                ),
            }
        }
        failed.push(s.name);
        (s.reset)(&mut config, &default);
    }
    config
}

fn breaker_settings() -> [Setting<BreakerConfig>; 11] {
    [
        setting!(BreakerConfig, consecutive_failures, u32),
        setting!(BreakerConfig, window_size, u32),
        setting!(
            BreakerConfig,
            minimum_calls,
            u32,
            Some("window_size"),
            |c, _| c.minimum_calls = 1
        ),
        setting!(BreakerConfig, failure_rate_threshold, float),
        setting!(BreakerConfig, slow_call_threshold, duration),
        setting!(BreakerConfig, slow_call_rate_threshold, float),
        setting!(BreakerConfig, cool_down, duration),
        setting!(
            BreakerConfig,
            max_cool_down,
            duration,
            Some("cool_down"),
            |c, _| c.max_cool_down = c.cool_down
        ),
        setting!(BreakerConfig, backoff_multiplier, float),
        setting!(BreakerConfig, jitter, float),
        setting!(BreakerConfig, replace_connection_after, u32),
    ]
}

fn breaker_section(w: &mut Walk<'_>, v: Option<&Value<'_>>) -> BreakerConfig {
    settings_section(
        w,
        "breaker",
        v,
        &breaker_settings(),
        BreakerConfig::default(),
        BreakerConfig::validate,
        "breaker ",
    )
}

fn local_settings() -> [Setting<LocalConfig>; 5] {
    [
        setting!(LocalConfig, max_keys, usize),
        setting!(LocalConfig, max_denials, usize),
        setting!(LocalConfig, max_warm_keys, usize),
        setting!(LocalConfig, max_ledger_entries, usize),
        setting!(LocalConfig, max_bytes, usize),
    ]
}

fn local_section(w: &mut Walk<'_>, v: Option<&Value<'_>>) -> LocalConfig {
    settings_section(
        w,
        "local",
        v,
        &local_settings(),
        LocalConfig::default(),
        LocalConfig::validate,
        "local.",
    )
}

fn reconcile_settings() -> [Setting<ReconcileConfig>; 3] {
    [
        setting!(ReconcileConfig, batch_size, usize),
        setting!(ReconcileConfig, duty_cycle, float),
        setting!(ReconcileConfig, idle_poll, duration),
    ]
}

fn reconcile_section(w: &mut Walk<'_>, v: Option<&Value<'_>>) -> ReconcileConfig {
    settings_section(
        w,
        "reconcile",
        v,
        &reconcile_settings(),
        ReconcileConfig::default(),
        ReconcileConfig::validate,
        "reconcile.",
    )
}

fn rule_sets_section(w: &mut Walk<'_>, v: Option<&Value<'_>>) -> Vec<RuleSet> {
    let Some(v) = v else {
        return Vec::new();
    };
    let DeValue::Table(table) = v.get_ref() else {
        w.report(
            "rule_sets",
            Some(v.span()),
            expected("a table of rule sets ([rule_sets.<name>])", v.get_ref()),
        );
        return Vec::new();
    };
    entries(table)
        .into_iter()
        .filter_map(|(name, name_span, v)| rule_set(w, name, name_span, v))
        .collect()
}

fn rule_set(
    w: &mut Walk<'_>,
    name: &str,
    name_span: Range<usize>,
    v: &Value<'_>,
) -> Option<RuleSet> {
    let path = join("rule_sets", name);
    let before = w.problems.len();
    let name_ok = Rule::per_second(1)
        .and_then(|r| RuleSet::new(name, [r]))
        .is_ok();
    if !name_ok {
        w.report(
            &path,
            Some(name_span),
            format!("invalid rule set name {name:?}: use 1 to 64 characters from [A-Za-z0-9_.-]"),
        );
    }
    let f = w.fields(&path, v, &["rules", "policy", "reconcile", "stripes"])?;
    let policy = f.get("policy").and_then(|v| w.policy(&f.path("policy"), v));
    let reconcile = f
        .get("reconcile")
        .and_then(|v| w.boolean(&f.path("reconcile"), v));
    let stripes_path = f.path("stripes");
    // The range is checked here, whatever the rules: a problem with them
    // would otherwise hide this one until they were fixed.
    let stripes = f.get("stripes").and_then(|v| {
        let k = w.integer(&stripes_path, v, 1)?;
        let max = tierlimit_core::MAX_STRIPES;
        let Some(k) = u32::try_from(k).ok().filter(|k| *k <= max) else {
            let e = Error::StripesOutOfRange { stripes: k, max };
            w.report(&stripes_path, Some(v.span()), e.to_string());
            return None;
        };
        Some((k, v.span()))
    });
    let rules_path = f.path("rules");
    let rules = match f.get("rules") {
        None => {
            w.report(
                &rules_path,
                Some(v.span()),
                "required: a list of rules, like rules = [\"10/s\", \"1000/day\"]",
            );
            None
        }
        Some(v) => rules(w, &rules_path, v),
    };
    let rules = rules?;
    if w.problems.len() > before {
        return None;
    }
    let set = match RuleSet::new(name, rules) {
        Ok(set) => set,
        Err(e) => {
            w.report(&path, Some(v.span()), e.to_string());
            return None;
        }
    };
    let set = match stripes {
        None => set,
        Some((k, span)) => match set.with_stripes(k) {
            Ok(set) => set,
            Err(e) => {
                w.report(&stripes_path, Some(span), e.to_string());
                return None;
            }
        },
    };
    let set = match policy {
        Some(p) => set.with_policy(p),
        None => set,
    };
    Some(match reconcile {
        Some(on) => set.with_reconcile(on),
        None => set,
    })
}

fn rules(w: &mut Walk<'_>, path: &str, v: &Value<'_>) -> Option<Vec<Rule>> {
    let DeValue::Array(items) = v.get_ref() else {
        w.report(
            path,
            Some(v.span()),
            expected("an array of rules", v.get_ref()),
        );
        return None;
    };
    if items.is_empty() {
        w.report(
            path,
            Some(v.span()),
            "must hold at least one rule, like rules = [\"10/s\"]",
        );
        return None;
    }
    if items.len() > MAX_RULES {
        w.report(
            path,
            Some(v.span()),
            format!("holds at most {MAX_RULES} rules (got {})", items.len()),
        );
        return None;
    }
    let mut rules: Vec<Option<Rule>> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let rule = match item.get_ref() {
            DeValue::String(text) => match text.parse::<Rule>() {
                Ok(r) => Some(r),
                Err(e @ Error::InvalidRuleSpec { .. }) => {
                    w.report(&item_path, Some(item.span()), reason_of(&e));
                    None
                }
                Err(e) => {
                    w.report(&item_path, Some(item.span()), format!("{text:?}: {e}"));
                    None
                }
            },
            DeValue::Table(_) => rule_table(w, &item_path, item),
            other => {
                w.report(
                    &item_path,
                    Some(item.span()),
                    expected("a rule string like \"10/s\" or a table", other),
                );
                None
            }
        };
        // What RuleSet::new refuses: two rules with one id (algorithm,
        // period and UTC offset) would share one storage key.
        if let Some(rule) = &rule
            && let Some(first) = rules
                .iter()
                .position(|r| r.as_ref().is_some_and(|r| r.id() == rule.id()))
        {
            let message = if rules[first].as_ref() == Some(rule) {
                format!("repeats {path}[{first}]; remove one")
            } else {
                format!(
                    "has the algorithm, period and UTC offset of {path}[{first}], so both would \
                     count in one storage key: merge them, or change the period or algorithm"
                )
            };
            w.report(&item_path, Some(item.span()), message);
        }
        rules.push(rule);
    }
    rules.into_iter().collect()
}

fn rule_table(w: &mut Walk<'_>, path: &str, v: &Value<'_>) -> Option<Rule> {
    let f = w.fields(
        path,
        v,
        &["rate", "limit", "per", "algorithm", "burst", "utc_offset"],
    )?;
    let before = w.problems.len();
    let algorithm = f
        .get("algorithm")
        .and_then(|v| w.algorithm(&f.path("algorithm"), v));
    let burst = f
        .get("burst")
        .and_then(|v| w.integer(&f.path("burst"), v, 1));
    let offset = f.get("utc_offset").and_then(|v| {
        let text = w.string(&f.path("utc_offset"), v)?;
        match parse_utc_offset(text) {
            Ok(s) => Some(s),
            Err(Error::InvalidRuleSpec { reason, .. }) => {
                w.report(&f.path("utc_offset"), Some(v.span()), reason);
                None
            }
            Err(e) => {
                w.report(&f.path("utc_offset"), Some(v.span()), e.to_string());
                None
            }
        }
    });
    // One offset, in one place: `utc_offset` would silently replace the
    // rate's `@offset`.
    if let (Some(v), Some(rate)) = (f.get("utc_offset"), f.get("rate"))
        && matches!(rate.get_ref(), DeValue::String(r) if r.contains('@'))
    {
        w.report(
            &f.path("utc_offset"),
            Some(v.span()),
            "the rate names a UTC offset already (\"@...\"): give it in one place",
        );
        return None;
    }
    // A UTC offset makes a calendar window: the fixed window, unless the
    // file names another algorithm (then the rule's own error says why not).
    // The rule is made by its algorithm from the start: a window may count
    // more than one unit per µs, which the default (GCRA) refuses.
    let algorithm = algorithm.or(offset.map(|_| Algorithm::FixedWindow));
    let base = match (f.get("rate"), f.get("limit"), f.get("per")) {
        (Some(rate), None, None) => {
            let text = w.string(&f.path("rate"), rate)?;
            match parse_rule_as(text, algorithm) {
                Ok(r) => Some(r),
                Err(e @ Error::InvalidRuleSpec { .. }) => {
                    w.report(&f.path("rate"), Some(rate.span()), reason_of(&e));
                    None
                }
                // A constructor's error, at the field it is about (a calendar
                // rate with another algorithm: at `algorithm`).
                Err(e) => step(w, &f, path, v, "rate", Err(e)),
            }
        }
        (Some(rate), _, _) => {
            w.report(
                &f.path("rate"),
                Some(rate.span()),
                "give rate, or limit and per, not both",
            );
            None
        }
        (None, limit, per) => {
            let limit = match limit {
                Some(v) => w.integer(&f.path("limit"), v, 1),
                None => {
                    w.report(
                        &f.path("limit"),
                        Some(v.span()),
                        "required (or rate = \"100/min\" instead of limit and per)",
                    );
                    None
                }
            };
            let per = match per {
                Some(v) => w.duration(&f.path("per"), v),
                None => {
                    w.report(
                        &f.path("per"),
                        Some(v.span()),
                        "required: the period, like per = \"1m\"",
                    );
                    None
                }
            };
            let (limit, per) = (limit?, per?);
            let algorithm = algorithm.unwrap_or(Algorithm::Gcra);
            step(w, &f, path, v, "per", Rule::new(limit, per, algorithm))
        }
    };
    let mut rule = base?;
    if w.problems.len() > before {
        return None;
    }
    if offset.is_some() && !DAY.as_micros().is_multiple_of(rule.period().as_micros()) {
        let key = if f.get("per").is_some() {
            "per"
        } else {
            "rate"
        };
        w.report(
            &f.path(key),
            f.span(key),
            "a calendar window (utc_offset) needs a period that divides a day evenly (like 15m, 1h, 6h or 1d)",
        );
        return None;
    }
    if let Some(o) = offset {
        rule = step(w, &f, path, v, "utc_offset", rule.with_utc_offset(o))?;
    }
    if let Some(b) = burst {
        rule = step(w, &f, path, v, "burst", rule.with_burst(b))?;
    }
    Some(rule)
}

/// The rule a constructor step made, or its error reported at the table
/// field it is about (`key`: the field the step applied).
fn step(
    w: &mut Walk<'_>,
    f: &Fields<'_, '_>,
    path: &str,
    v: &Value<'_>,
    key: &str,
    made: Result<Rule, Error>,
) -> Option<Rule> {
    let e = match made {
        Ok(rule) => return Some(rule),
        Err(e) => e,
    };
    let limit_key = if f.get("limit").is_some() {
        "limit"
    } else {
        "rate"
    };
    let period_key = if f.get("per").is_some() {
        "per"
    } else {
        "rate"
    };
    let (key, message) = match &e {
        Error::ZeroLimit => (limit_key, "must be at least 1".to_owned()),
        Error::LimitTooLarge { value, max } => (
            if key == "burst" { "burst" } else { limit_key },
            format!("must be at most {max} (got {value})"),
        ),
        Error::SlidingLogTooLarge { limit, max } => (
            limit_key,
            format!(
                "a sliding log's limit is at most {max} (got {limit}): use \"sliding-window\" or \"gcra\" for larger limits"
            ),
        ),
        Error::RateTooFine { .. } => (limit_key, e.to_string()),
        Error::PeriodTooShort { .. }
        | Error::PeriodPrecision { .. }
        | Error::PeriodTooLong { .. } => (period_key, e.to_string()),
        Error::ZeroBurst => ("burst", "must be at least 1".to_owned()),
        Error::BurstNotSupported { algorithm } => (
            "burst",
            format!(
                "{:?} has no burst (its capacity is its limit): only \"gcra\" and \"token-bucket\" take one",
                algorithm_name(*algorithm)
            ),
        ),
        Error::BurstWindowTooLong { .. } => ("burst", e.to_string()),
        Error::CalendarNeedsFixedWindow { algorithm } => (
            if f.get("utc_offset").is_some() {
                "utc_offset"
            } else {
                "algorithm"
            },
            format!(
                "a calendar window (UTC offset) needs algorithm = \"fixed-window\", not {:?}",
                algorithm_name(*algorithm)
            ),
        ),
        Error::InvalidUtcOffset { .. } => ("utc_offset", e.to_string()),
        _ => (key, e.to_string()),
    };
    match f.get(key) {
        Some(at) => w.report(&f.path(key), Some(at.span()), message),
        None => w.report(path, Some(v.span()), message),
    }
    None
}

fn algorithm_name(a: Algorithm) -> &'static str {
    match a {
        Algorithm::Gcra => "gcra",
        Algorithm::TokenBucket => "token-bucket",
        Algorithm::SlidingLog => "sliding-log",
        Algorithm::SlidingWindow => "sliding-window",
        Algorithm::FixedWindow => "fixed-window",
        _ => "this algorithm",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_count_characters() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_column(text, 0), (1, 1));
        let x = text.find("\"x\"").expect("present");
        assert_eq!(line_column(text, x), (2, 6));
    }

    #[test]
    fn typos_find_their_field() {
        assert_eq!(nearest("deadlin", &["url", "deadline"]), Some("deadline"));
        assert_eq!(nearest("zzzzzz", &["url", "deadline"]), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn paths_quote_keys_that_are_not_bare() {
        assert_eq!(join("rule_sets", "login"), "rule_sets.login");
        assert_eq!(join("rule_sets", "a b"), "rule_sets.\"a b\"");
        assert_eq!(join("", "redis"), "redis");
    }

    #[test]
    fn every_field_of_the_settings_structs_is_in_the_format() {
        // A field added to BreakerConfig, LocalConfig or ReconcileConfig must
        // reach the file format too: their derived Debug names every field.
        fn fields(debug: &str) -> Vec<String> {
            let inner = debug
                .split_once('{')
                .and_then(|(_, rest)| rest.rsplit_once('}'))
                .map_or("", |(inner, _)| inner);
            inner
                .split(',')
                .filter_map(|part| part.split(':').next())
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
                .collect()
        }
        fn names<C>(settings: &[Setting<C>]) -> Vec<String> {
            settings.iter().map(|s| s.name.to_owned()).collect()
        }
        assert_eq!(
            fields(&format!("{:?}", BreakerConfig::default())),
            names(&breaker_settings())
        );
        assert_eq!(
            fields(&format!("{:?}", LocalConfig::default())),
            names(&local_settings())
        );
        assert_eq!(
            fields(&format!("{:?}", ReconcileConfig::default())),
            names(&reconcile_settings())
        );
    }
}
