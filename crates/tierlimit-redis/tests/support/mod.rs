//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, Clock, Rule, RuleSet, escape_key};
use tierlimit_redis::{RedisTier, RedisTierConfig, TimeSource};

/// Every algorithm, in code order.
pub(crate) const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
];

/// A tier on `url` using server time, with a deadline generous enough that a
/// slow, noisy test machine never turns a check into an outcome-unknown timeout.
pub(crate) fn tier(url: &str) -> RedisTier {
    tier_with(url, Duration::from_secs(2), TimeSource::Server)
}

/// A tier on `url` whose "now" comes from `clock`.
pub(crate) fn client_time_tier(url: &str, clock: Arc<dyn Clock>) -> RedisTier {
    tier_with(url, Duration::from_secs(2), TimeSource::Client(clock))
}

pub(crate) fn tier_with(url: &str, deadline: Duration, time: TimeSource) -> RedisTier {
    RedisTier::new(
        RedisTierConfig::new(url)
            .deadline(deadline)
            .time_source(time),
    )
    .expect("valid tier config")
}

/// `limit` per `period` checked by `algorithm`.
pub(crate) fn rule(algorithm: Algorithm, limit: u64, period: Duration) -> Rule {
    Rule::with_period(limit, period)
        .and_then(|r| r.with_algorithm(algorithm))
        .expect("valid rule")
}

pub(crate) fn set(name: &str, rules: impl IntoIterator<Item = Rule>) -> RuleSet {
    RuleSet::new(name, rules).expect("valid rule set")
}

/// The Redis key of rule `index` of `set` for user key `key`.
pub(crate) fn storage_key(set: &RuleSet, key: &str, index: usize) -> String {
    set.storage_key(&escape_key(key), index)
}

/// A key's serialized value (`DUMP`), `None` when it does not exist.
pub(crate) async fn dump(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Option<Vec<u8>> {
    redis::cmd("DUMP")
        .arg(key)
        .query_async(conn)
        .await
        .expect("DUMP failed")
}
