//! [`RateLimitLayer`] and its builder.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::StatusCode;
use tierlimit::{Error, HybridLimiter, RuleSet};
use tower_layer::Layer;

use crate::headers::HeaderMode;
use crate::key::{ClientIp, KeyExtractor};
use crate::route::{Action, Limit, Match, Rendered, Routes, SetSource};
use crate::service::RateLimit;

/// What a request without a key gets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// `400 Bad Request` (gRPC: `INVALID_ARGUMENT`). The default.
    #[default]
    Reject,
    /// Checked against this key, shared by every keyless request.
    Fallback(String),
}

/// The layer's configuration, shared by every service it makes.
pub(crate) struct Shared {
    pub(crate) limiter: Arc<HybridLimiter>,
    pub(crate) key: Box<dyn KeyExtractor>,
    pub(crate) routes: Routes,
    pub(crate) missing_key: MissingKey,
    pub(crate) headers: HeaderMode,
    pub(crate) fail_closed_status: StatusCode,
    pub(crate) partition_key: bool,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitConfig")
            .field("key", &self.key)
            .field("routes", &self.routes)
            .field("missing_key", &self.missing_key)
            .field("headers", &self.headers)
            .field("fail_closed_status", &self.fail_closed_status)
            .field("partition_key", &self.partition_key)
            .finish_non_exhaustive()
    }
}

/// A tower [`Layer`] that rate-limits requests with a shared
/// [`HybridLimiter`]: it finds the request's key and route, checks the
/// route's rule set, and answers a denial itself (see the crate docs for the
/// responses and headers). Cheap to clone.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use http::Method;
/// use tierlimit::{HybridLimiter, Policy, Rule, RuleSet};
/// use tierlimit_tower::{ClientIp, HeaderKey, KeyExtractor, Match, RateLimitLayer};
///
/// # fn run() -> Result<(), tierlimit::Error> {
/// let limiter = Arc::new(HybridLimiter::builder().redis_url("redis://127.0.0.1:6380/").build()?);
/// let login = RuleSet::new("login", [Rule::per_minute(5)?])?.with_policy(Policy::FailClosed);
/// let api = RuleSet::new("api", [Rule::per_second(10)?, Rule::per_hour(1000)?])?;
/// // Logins per client address: keyed by API key, a guesser would send a
/// // fresh key with each attempt.
/// let logins = RateLimitLayer::builder(limiter.clone())
///     .key(ClientIp::peer())
///     .route(Match::method(Method::POST, "/login"), login, 1)
///     .build()?;
/// let calls = RateLimitLayer::builder(limiter)
///     .key(HeaderKey::api_key("x-api-key")?.or(ClientIp::peer()))
///     .exempt(Match::any("/health"))
///     .exempt(Match::method(Method::POST, "/login"))
///     .default_route(api, 1)
///     .build()?;
/// # let _ = (logins, calls); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// A builder around `limiter`: keys from the peer IP, no routes, no
    /// default (unmatched requests pass unchecked), keyless requests
    /// refused with 400, both header sets, 503 for fail-closed denials.
    pub fn builder(limiter: Arc<HybridLimiter>) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            shared: Shared {
                limiter,
                key: Box::new(ClientIp::peer()),
                routes: Routes::default(),
                missing_key: MissingKey::default(),
                headers: HeaderMode::default(),
                fail_closed_status: StatusCode::SERVICE_UNAVAILABLE,
                partition_key: false,
            },
            pending: Vec::new(),
            default: None,
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, self.shared.clone())
    }
}

/// Builds a [`RateLimitLayer`]; see [`RateLimitLayer::builder`]. Every
/// setting is checked by [`build`](Self::build).
#[derive(Debug)]
pub struct RateLimitLayerBuilder {
    shared: Shared,
    pending: Vec<(Match, Option<(Given, u64)>)>,
    default: Option<(Given, u64)>,
}

/// A route's rule set as the builder was given it.
#[derive(Debug)]
enum Given {
    Set(RuleSet),
    Name(String),
}

impl RateLimitLayerBuilder {
    /// How a request's key is found (default: [`ClientIp::peer`]).
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.shared.key = Box::new(key);
        self
    }

    /// Requests matching `m` are checked against `set` for `cost` units.
    /// Routes are tried in the order they were added; the first match wins.
    ///
    /// The route keeps `set` as given: a reload of the limiter's rule sets
    /// does not reach it (see [`route_named`](Self::route_named)).
    pub fn route(mut self, m: Match, set: RuleSet, cost: u64) -> Self {
        self.pending.push((m, Some((Given::Set(set), cost))));
        self
    }

    /// As [`route`](Self::route), with the rule set the limiter holds under
    /// `set_name` when each request is checked: after a reload
    /// ([`HybridLimiter::replace_rule_sets`], a watched config file) the
    /// route's requests are checked against the new set.
    ///
    /// [`build`](Self::build) refuses a name the limiter does not hold. A
    /// reload that drops the name leaves the route on the set it last used,
    /// so it neither stops limiting nor fails; a reload that shrinks the
    /// set's capacity below `cost` makes the route answer `500` until it is
    /// fixed, since no request could be admitted.
    pub fn route_named(mut self, m: Match, set_name: impl Into<String>, cost: u64) -> Self {
        self.pending
            .push((m, Some((Given::Name(set_name.into()), cost))));
        self
    }

    /// Requests matching `m` are not checked and carry no rate-limit headers.
    pub fn exempt(mut self, m: Match) -> Self {
        self.pending.push((m, None));
        self
    }

    /// Requests no route matches are checked against `set` for `cost`
    /// units. Without a default they pass unchecked.
    pub fn default_route(mut self, set: RuleSet, cost: u64) -> Self {
        self.default = Some((Given::Set(set), cost));
        self
    }

    /// As [`default_route`](Self::default_route), by the limiter's rule set
    /// of that name at each request (see [`route_named`](Self::route_named)).
    pub fn default_route_named(mut self, set_name: impl Into<String>, cost: u64) -> Self {
        self.default = Some((Given::Name(set_name.into()), cost));
        self
    }

    /// What a keyless request gets (default: [`MissingKey::Reject`]).
    pub fn missing_key(mut self, answer: MissingKey) -> Self {
        self.shared.missing_key = answer;
        self
    }

    /// Which rate-limit headers responses carry (default: [`HeaderMode::Both`]).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.shared.headers = mode;
        self
    }

    /// The status of a denial by [`Policy::FailClosed`](tierlimit::Policy)
    /// while Redis is unavailable (default: 503, so clients do not take it
    /// for their own excess). gRPC requests get `UNAVAILABLE` whatever this is.
    pub fn fail_closed_status(mut self, status: StatusCode) -> Self {
        self.shared.fail_closed_status = status;
        self
    }

    /// Whether the draft `RateLimit` field carries the key as its `pk`
    /// parameter (default: off; the key may hold an API key or user id, and
    /// the client knows it already).
    pub fn partition_key(mut self, on: bool) -> Self {
        self.shared.partition_key = on;
        self
    }

    /// The layer. Fails with [`Error::InvalidConfig`] for a malformed route
    /// pattern, an invalid fallback key or a fail-closed status that is not a
    /// client or server error, with [`Error::UnknownRuleSet`] for a named
    /// route whose name the limiter does not hold, and with the rule set's
    /// error for a cost it could never admit.
    pub fn build(mut self) -> tierlimit::Result<RateLimitLayer> {
        let limiter = self.shared.limiter.clone();
        let limit = |(given, cost): (Given, u64)| -> tierlimit::Result<Limit> {
            let (set, name) = match given {
                Given::Set(set) => (set, None),
                Given::Name(name) => match limiter.rule_set(&name) {
                    Some(set) => (set, Some(name)),
                    None => return Err(Error::UnknownRuleSet { name }),
                },
            };
            set.validate_cost(cost)?;
            let rendered = Rendered::new(set);
            let set = match name {
                None => SetSource::Fixed(rendered),
                Some(name) => SetSource::Named {
                    name,
                    last: ArcSwap::new(rendered),
                },
            };
            Ok(Limit { set, cost })
        };
        for (m, action) in self.pending {
            m.validate()?;
            let action = match action {
                Some(limited) => Action::Limit(limit(limited)?),
                None => Action::Exempt,
            };
            self.shared.routes.routes.push((m, action));
        }
        self.shared.routes.default = self.default.map(limit).transpose()?;
        if let MissingKey::Fallback(key) = &self.shared.missing_key {
            tierlimit_core::validate_key(key).map_err(|e| Error::InvalidConfig {
                what: format!("missing_key fallback: {e}"),
            })?;
        }
        let status = self.shared.fail_closed_status;
        if !status.is_client_error() && !status.is_server_error() {
            return Err(Error::InvalidConfig {
                what: format!("fail_closed_status {status}: a denial must be a 4xx or 5xx"),
            });
        }
        Ok(RateLimitLayer {
            shared: Arc::new(self.shared),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierlimit::Rule;

    fn limiter() -> Arc<HybridLimiter> {
        // Never connects: build() does no I/O and these tests never check.
        Arc::new(
            HybridLimiter::builder()
                .redis_url("redis://127.0.0.1:1/")
                .build()
                .expect("a valid limiter config"),
        )
    }

    #[tokio::test]
    async fn build_refuses_what_could_never_work() -> tierlimit::Result<()> {
        let set = RuleSet::new("b", [Rule::per_minute(5)?])?;
        let build = |f: fn(RateLimitLayerBuilder, RuleSet) -> RateLimitLayerBuilder| {
            f(RateLimitLayer::builder(limiter()), set.clone()).build()
        };
        assert!(build(|b, s| b.route(Match::any("/a/*"), s, 1)).is_ok());
        let bad_pattern = build(|b, s| b.route(Match::any("a*"), s, 1));
        assert!(matches!(bad_pattern, Err(Error::InvalidConfig { .. })));
        let never = build(|b, s| b.default_route(s, 6));
        assert!(matches!(never, Err(Error::CostExceedsCapacity { .. })));
        let unknown = build(|b, _| b.route_named(Match::any("/n"), "nope", 1));
        assert!(matches!(unknown, Err(Error::UnknownRuleSet { name }) if name == "nope"));
        let unknown = build(|b, _| b.default_route_named("nope", 1));
        assert!(matches!(unknown, Err(Error::UnknownRuleSet { .. })));
        let fallback = build(|b, _| b.missing_key(MissingKey::Fallback("a\nb".into())));
        assert!(matches!(fallback, Err(Error::InvalidConfig { .. })));
        let ok_status = build(|b, _| b.fail_closed_status(StatusCode::OK));
        assert!(matches!(ok_status, Err(Error::InvalidConfig { .. })));
        Ok(())
    }
}
