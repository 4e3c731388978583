//! GCRA's stored state: a TAT that is a whole number of microseconds is
//! written as an integer (no `%.17f` fraction to format on the server), one
//! that is not keeps its fraction, and both are read back the same way.

mod support;

use std::time::Duration;

use tierlimit_core::Algorithm;
use tierlimit_test::RedisServer;

use support::{rule, set, storage_key, tier};

/// The stored "<TAT>@<limit>" of `key` under `set`'s only rule.
async fn stored(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    redis::cmd("GET")
        .arg(key)
        .query_async::<Option<String>>(conn)
        .await
        .expect("GET")
        .unwrap_or_else(|| panic!("{key} holds no state"))
}

#[tokio::test]
async fn a_whole_tat_has_no_fraction_and_a_fractional_one_keeps_it() {
    let server = RedisServer::start();
    let tier = tier(&server.url());
    let mut conn = server.conn().await;
    // 10 per hour: T = 360 s, a whole number of µs. 7 per hour: T =
    // 514285714.28... µs. Both drain far slower than four checks take.
    let whole = set(
        "whole",
        [rule(Algorithm::Gcra, 10, Duration::from_secs(3600))],
    );
    let fraction = set(
        "fraction",
        [rule(Algorithm::Gcra, 7, Duration::from_secs(3600))],
    );
    for (set, limit, has_fraction) in [(&whole, 10, false), (&fraction, 7, true)] {
        let mut remaining = Vec::new();
        for _ in 0..4 {
            let outcome = tier.check("u", set, 1).await.expect("a healthy check");
            remaining.push((outcome.decision.allowed, outcome.decision.remaining));
            let value = stored(&mut conn, &storage_key(set, "u", 0)).await;
            let (tat, written) = value.split_once('@').expect("<TAT>@<limit>");
            assert_eq!(written, limit.to_string(), "{value}");
            assert_eq!(
                tat.contains('.'),
                has_fraction,
                "{}: stored {value}",
                set.name()
            );
            assert!(
                tat.chars().all(|c| c.is_ascii_digit() || c == '.'),
                "{value}"
            );
        }
        // Read back as written: each check takes one more unit.
        let expected: Vec<(bool, u64)> = (1..=4).map(|used| (true, limit - used)).collect();
        assert_eq!(remaining, expected, "{}", set.name());
    }
}

/// A value no script of ours wrote (set by hand, say) is no state: the check
/// finds a full bucket and writes a valid TAT over it, whatever Lua's
/// `tonumber` would make of the text (it reads "nan", "inf" and hex).
#[tokio::test]
async fn a_value_no_script_wrote_is_a_full_bucket() {
    let server = RedisServer::start();
    let tier = tier(&server.url());
    let mut conn = server.conn().await;
    let set = set(
        "junk",
        [rule(Algorithm::Gcra, 10, Duration::from_secs(3600))],
    );
    let junk = [
        "nan@10",
        "inf@10",
        "-inf@10",
        "1e400@10",
        "-5@10",
        "99999999999999999999@10",
        "0x7fffffffffffffff@10",
        "1700000000000000@nan",
        "1700000000000000@0",
        "1700000000000000.5.5@inf",
        "abc",
        "@10",
        "17000000000000001",
    ];
    for (i, value) in junk.into_iter().enumerate() {
        let user = format!("u{i}");
        let key = storage_key(&set, &user, 0);
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .query_async(&mut conn)
            .await
            .expect("SET");
        let outcome = tier.check(&user, &set, 1).await.expect("a healthy check");
        assert!(
            outcome.decision.allowed && outcome.decision.remaining == 9,
            "{value:?}: {:?}",
            outcome.decision
        );
        let written = stored(&mut conn, &key).await;
        let (tat, limit) = written.split_once('@').expect("<TAT>@<limit>");
        assert_eq!(limit, "10", "{value:?} became {written}");
        assert!(
            tat.parse::<u64>().is_ok_and(|t| t > 1_700_000_000_000_000),
            "{value:?} became {written}"
        );
    }
}
