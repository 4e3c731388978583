//! Which rule set and cost a request is checked against.

use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{HeaderValue, Method};
use tierlimit::{HybridLimiter, RuleSet};

use crate::headers;

/// Which requests a route applies to: a method (or any) and a path pattern.
///
/// A pattern is an exact path (`/login`) or a prefix ending in `/*`
/// (`/api/*` matches `/api`, `/api/` and everything below; `/*` matches every
/// path). Query strings are not part of the path.
///
/// # Examples
///
/// ```
/// use http::Method;
/// use tierlimit_tower::Match;
///
/// let login = Match::method(Method::POST, "/login");
/// assert!(login.matches(&Method::POST, "/login"));
/// assert!(!login.matches(&Method::GET, "/login"));
/// let api = Match::any("/api/*");
/// assert!(api.matches(&Method::GET, "/api/v1/items"));
/// assert!(!api.matches(&Method::GET, "/apix"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    method: Option<Method>,
    pattern: Pattern,
    source: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    /// The prefix without its trailing `/`: `/api` for `/api/*`, empty for `/*`.
    Prefix(String),
    Invalid,
}

impl Match {
    /// Requests of any method whose path matches `pattern`.
    pub fn any(pattern: &str) -> Match {
        Match {
            method: None,
            pattern: Pattern::parse(pattern),
            source: pattern.into(),
        }
    }

    /// Requests of `method` whose path matches `pattern`; `GET` matches
    /// `HEAD` too, since servers answer a `HEAD` by running the `GET`
    /// handler (axum's `get` routes do): an expensive `GET` must not be free
    /// as a `HEAD`. (Routes match first to last: a `HEAD` route of its own
    /// goes before the `GET` route of the same path.)
    pub fn method(method: Method, pattern: &str) -> Match {
        Match {
            method: Some(method),
            ..Match::any(pattern)
        }
    }

    /// True when a request of `method` for `path` is matched.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if self
            .method
            .as_ref()
            .is_some_and(|m| m != method && !(*m == Method::GET && *method == Method::HEAD))
        {
            return false;
        }
        match &self.pattern {
            Pattern::Exact(exact) => path == exact,
            Pattern::Prefix(prefix) => path
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
            Pattern::Invalid => false,
        }
    }

    pub(crate) fn validate(&self) -> tierlimit::Result<()> {
        if self.pattern == Pattern::Invalid {
            return Err(tierlimit::Error::InvalidConfig {
                what: format!(
                    "route pattern {:?}: use an exact path starting with '/', or a prefix ending in \"/*\" (a '*' nowhere else)",
                    self.source
                ),
            });
        }
        Ok(())
    }
}

impl Pattern {
    fn parse(pattern: &str) -> Pattern {
        if !pattern.starts_with('/') {
            return Pattern::Invalid;
        }
        match pattern.strip_suffix("/*") {
            Some(prefix) if !prefix.contains('*') => Pattern::Prefix(prefix.into()),
            Some(_) => Pattern::Invalid,
            None if pattern.contains('*') => Pattern::Invalid,
            None => Pattern::Exact(pattern.into()),
        }
    }
}

/// What a matched route does.
#[derive(Debug)]
pub(crate) enum Action {
    Limit(Limit),
    Exempt,
}

/// A rule set and cost.
#[derive(Debug)]
pub(crate) struct Limit {
    pub(crate) set: SetSource,
    pub(crate) cost: u64,
}

/// Where a route's rule set comes from.
#[derive(Debug)]
pub(crate) enum SetSource {
    /// Given by value: the same for the layer's life.
    Fixed(Arc<Rendered>),
    /// The limiter's set of this name, looked up on every request, so a
    /// reload reaches the route; `last` is the one the route last used,
    /// kept if a reload drops the name.
    Named {
        name: String,
        last: ArcSwap<Rendered>,
    },
}

/// A rule set with its `RateLimit-Policy` value, rendered once per set.
#[derive(Debug)]
pub(crate) struct Rendered {
    pub(crate) set: RuleSet,
    pub(crate) policy: HeaderValue,
}

impl Rendered {
    pub(crate) fn new(set: RuleSet) -> Arc<Rendered> {
        Arc::new(Rendered {
            policy: headers::policy_value(&set),
            set,
        })
    }
}

impl Limit {
    /// The rule set a request is checked against now.
    pub(crate) fn current(&self, limiter: &HybridLimiter) -> Arc<Rendered> {
        match &self.set {
            SetSource::Fixed(rendered) => rendered.clone(),
            SetSource::Named { name, last } => {
                let seen = last.load_full();
                match limiter.rule_set(name) {
                    // A reload made a new set (ids are never reused).
                    Some(set) if set.id() != seen.set.id() => {
                        let fresh = Rendered::new(set);
                        last.store(fresh.clone());
                        fresh
                    }
                    _ => seen,
                }
            }
        }
    }
}

/// The routes in order (the first match wins) and the default.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    pub(crate) routes: Vec<(Match, Action)>,
    pub(crate) default: Option<Limit>,
}

impl Routes {
    /// The action for a request; `None`: no route matched and there is no
    /// default, so the request passes unchecked.
    pub(crate) fn find(&self, method: &Method, path: &str) -> Option<&Action> {
        self.routes
            .iter()
            .find(|(m, _)| m.matches(method, path))
            .map(|(_, action)| action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_route_holds_its_head_requests() {
        let get = Match::method(Method::GET, "/export");
        assert!(get.matches(&Method::HEAD, "/export"));
        assert!(!get.matches(&Method::POST, "/export"));
        assert!(!Match::method(Method::HEAD, "/export").matches(&Method::GET, "/export"));
    }

    #[test]
    fn patterns() {
        assert!(Match::any("/*").matches(&Method::GET, "/anything/at/all"));
        assert!(Match::any("/api/*").matches(&Method::GET, "/api"));
        assert!(Match::any("/api/*").matches(&Method::GET, "/api/"));
        assert!(!Match::any("/api/*").matches(&Method::GET, "/api2"));
        assert!(Match::any("/a").matches(&Method::PUT, "/a"));
        assert!(!Match::any("/a").matches(&Method::PUT, "/a/"));
        for bad in ["api", "/a*", "/*/b", "/a/*/*", ""] {
            assert!(Match::any(bad).validate().is_err(), "{bad}");
        }
    }
}
