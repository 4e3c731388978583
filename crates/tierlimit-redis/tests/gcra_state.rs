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
