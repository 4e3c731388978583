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
pub(crate) async fn dump(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> Option<Vec<u8>> {
    redis::cmd("DUMP")
        .arg(key)
        .query_async(conn)
        .await
        .expect("DUMP failed")
}

/// Makes Redis log every command with its server time (`SLOWLOG` with a
/// threshold of 0 µs) and empties the log, so [`slowest_script_us`] sees only
/// what runs after this.
pub(crate) async fn slowlog_reset(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .query_async(conn)
        .await
        .expect("CONFIG SET slowlog-log-slower-than");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-max-len")
        .arg(10_000)
        .query_async(conn)
        .await
        .expect("CONFIG SET slowlog-max-len");
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(conn)
        .await
        .expect("SLOWLOG RESET");
}

/// Every `EVAL`/`EVALSHA`/`FCALL` in the slow log since [`slowlog_reset`]:
/// its server time in µs (what Redis itself measured, not the client's wall
/// clock) and its arguments, the command's name first.
pub(crate) async fn slowlog_script_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Vec<(u64, Vec<String>)> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(conn)
        .await
        .expect("SLOWLOG GET");
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("slow log argument {other:?}"),
    };
    let mut calls = Vec::new();
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            panic!("slow log entry {entry:?}");
        };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(args))) =
            (fields.get(2), fields.get(3))
        else {
            panic!("slow log entry {fields:?}");
        };
        let args: Vec<String> = args.iter().map(text).collect();
        let name = args
            .first()
            .map(|a| a.to_ascii_lowercase())
            .unwrap_or_default();
        if name.starts_with("eval") || name.starts_with("fcall") {
            calls.push((u64::try_from(*us).expect("a duration"), args));
        }
    }
    calls
}

/// The longest server time, in µs, of any script call in the slow log since
/// [`slowlog_reset`]. Panics when the log holds no script call.
pub(crate) async fn slowest_script_us(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    slowlog_script_calls(conn)
        .await
        .into_iter()
        .map(|(us, _)| us)
        .max()
        .expect("the slow log holds a script call")
}

/// The URL of a user of `server` the ACL allows everything but Functions
/// (`FUNCTION`, `FCALL`, `FCALL_RO`): a tier logged in as it runs scripts
/// (`EVALSHA`), as on a server older than Redis 7.
pub(crate) async fn scripts_only_url(server: &tierlimit_test::RedisServer) -> String {
    let mut admin = server.conn().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("scripts-only")
        .arg("on")
        .arg(">scripts-only-pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-function")
        .arg("-fcall")
        .arg("-fcall_ro")
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    server.url_as("scripts-only", "scripts-only-pw")
}
