//! The body of `check_atomicity.rs`'s test, on any server or Cluster and
//! any key (the Cluster tests run it on keys of every master).
//!
//! All or nothing across the rules of a set: with "3 per second AND 5 per 10
//! seconds", for every pair of algorithms, a request denied by either rule
//! changes no rule's stored state (read back with DUMP before and after), and
//! the decision names the rule that denied.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use tierlimit_core::{FakeClock, RuleSet};
use tierlimit_redis::{RedisTier, Verdict};

use crate::support::{ALGORITHMS, client_time_tier, dump, rule, set, storage_key};

/// 1 ms past a boundary of every 1 s and 10 s window, so both rules start a
/// window together.
const START_US: u64 = 1_700_000_000_000_000 + 1_000;

struct Probe<'a, C> {
    tier: &'a RedisTier,
    conn: C,
    key: &'a str,
    set: &'a RuleSet,
    keys: [String; 2],
}

impl<C: ConnectionLike> Probe<'_, C> {
    async fn state(&mut self) -> [Option<Vec<u8>>; 2] {
        [
            dump(&mut self.conn, &self.keys[0]).await,
            dump(&mut self.conn, &self.keys[1]).await,
        ]
    }

    async fn check(&self) -> Verdict {
        self.tier.check(self.key, self.set, 1).await.expect("check")
    }

    /// Checks until denied; returns how many were admitted and the denial,
    /// asserting that the denial wrote nothing.
    async fn until_denied(&mut self, label: &str) -> (usize, Verdict) {
        for admitted in 0..10 {
            let before = self.state().await;
            let v = self.check().await;
            if !v.decision.allowed {
                assert_eq!(
                    self.state().await,
                    before,
                    "{label}: a denial changed stored state"
                );
                return (admitted, v);
            }
        }
        panic!("{label}: never denied");
    }
}

/// The body of the test of this name, on `key` at `url`; `conn` reads the
/// stored state (any connection that reaches the key: one server's, or a
/// Cluster connection).
pub(crate) async fn a_denial_by_either_rule_changes_nothing<C: ConnectionLike + Clone>(
    url: &str,
    key: &str,
    conn: C,
) {
    for first in ALGORITHMS {
        for second in ALGORITHMS {
            let label = format!("{first:?} + {second:?}");
            let clock = FakeClock::new(START_US);
            let tier = client_time_tier(url, Arc::new(clock.clone()));
            let name = format!("pair{}{}", first.code(), second.code());
            let set = set(
                &name,
                [
                    rule(first, 3, Duration::from_secs(1)),
                    rule(second, 5, Duration::from_secs(10)),
                ],
            );
            let mut probe = Probe {
                tier: &tier,
                conn: conn.clone(),
                key,
                keys: [storage_key(&set, key, 0), storage_key(&set, key, 1)],
                set: &set,
            };

            // Rule 0 runs out first; rule 1 still has 2 left and is not charged.
            let (admitted, denied) = probe.until_denied(&label).await;
            assert_eq!(admitted, 3, "{label}");
            assert_eq!(denied.decision.rule, 0, "{label}");
            assert_eq!(denied.rules[0].remaining, 0, "{label}");
            assert_eq!(denied.rules[1].remaining, 2, "{label}: rule 1 as it stands");
            // The sliding window counter waits into the next window: 1.33 s.
            let wait = denied.decision.retry_after.expect("denied");
            assert!(wait <= Duration::from_millis(1_334), "{label}: {wait:?}");

            // 2 s later rule 0 is full again, and rule 1 runs out: after 2
            // more for the window algorithms (2 left of 5); after 3 for GCRA
            // and the token bucket, which refilled one unit, and then both
            // rules deny but rule 1 has the longer wait.
            clock.advance(Duration::from_secs(2));
            let (admitted, denied) = probe.until_denied(&label).await;
            let refills = second.has_burst();
            assert_eq!(admitted, if refills { 3 } else { 2 }, "{label}");
            assert_eq!(denied.decision.rule, 1, "{label}");
            assert_eq!(denied.rules[1].remaining, 0, "{label}");
            assert_eq!(denied.decision.limit, 5, "{label}");
            if !refills {
                assert_eq!(
                    denied.rules[0].remaining, 1,
                    "{label}: rule 0 passed, uncharged"
                );
            }
            let wait = denied.decision.retry_after.expect("denied");
            assert!(wait > Duration::from_secs(1), "{label}: {wait:?}");
        }
    }
}
