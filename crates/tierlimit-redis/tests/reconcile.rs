//! Writing an outage ledger back: for every algorithm the units debit the
//! rule as if they had been checked on Redis, a re-sent batch changes nothing,
//! an entry whose window has passed changes nothing, and a lost script cache
//! is reloaded.

mod support;

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, Clock, FakeClock, LedgerEntry};
use tierlimit_redis::{RedisTier, WriteBack, Written};
use tierlimit_test::RedisServer;

use support::{ALGORITHMS, client_time_tier, rule, set, storage_key};

/// Half past some hour, so hourly windows hold still.
const NOW_US: u64 = 1_700_000_000_000_000 + 30 * 60_000_000;

#[tokio::test]
async fn ledger_units_count_once() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    for algorithm in ALGORITHMS {
        let label = format!("{algorithm:?}");
        let r = rule(algorithm, 10, Duration::from_secs(3600));
        let set = set(&format!("rc{}", algorithm.code()), [r.clone()]);
        assert_eq!(
            tier.check("k", &set, 1)
                .await
                .expect("check")
                .decision
                .remaining,
            9
        );

        let at = clock.unix_micros() - 1_000;
        let entry = LedgerEntry::new(storage_key(&set, "k", 0), r.clone(), 3, at, at);
        let batch = format!("b{}", algorithm.code());
        let report = write_back(&tier, &batch, std::slice::from_ref(&entry)).await;
        assert_eq!(report.applied_units, 3, "{label}: {report:?}");
        let v = tier.check("k", &set, 1).await.expect("check");
        assert_eq!(v.decision.remaining, 5, "{label}: 1 + 3 + 1 of 10 used");

        // The same batch again (its first outcome was, say, a timeout).
        let report = write_back(&tier, &batch, &[entry]).await;
        assert_eq!(
            (report.applied_units, report.already_applied),
            (0, 1),
            "{label}"
        );
        let v = tier.check("k", &set, 1).await.expect("check");
        assert_eq!(
            v.decision.remaining, 4,
            "{label}: the re-sent batch changed nothing"
        );

        // Units from two hours ago no longer matter to an hourly rule (the
        // ledger drops such entries before sending them; the script agrees).
        {
            let old = clock.unix_micros() - 2 * 3_600_000_000;
            let stale = LedgerEntry::new(storage_key(&set, "k", 0), r, 2, old, old);
            let report = write_back(&tier, &format!("old{}", algorithm.code()), &[stale]).await;
            assert_eq!((report.applied_units, report.expired), (0, 1), "{label}");
            let v = tier.check("k", &set, 1).await.expect("check");
            assert_eq!(
                v.decision.remaining, 3,
                "{label}: stale units changed nothing"
            );
        }
    }
}

#[tokio::test]
async fn reconcile_after_script_flush() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    let r = rule(ALGORITHMS[0], 10, Duration::from_secs(60));
    let set = set("flushed", [r.clone()]);
    let entries: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|k| {
            LedgerEntry::new(
                storage_key(&set, k, 0),
                r.clone(),
                2,
                NOW_US - 10,
                NOW_US - 5,
            )
        })
        .collect();
    for (round, batch) in ["one", "two"].iter().enumerate() {
        server.lua_flush().await;
        let report = write_back(&tier, batch, &entries).await;
        assert_eq!(report.applied_units, 6, "round {round}");
    }
    assert_eq!(
        server.keys_without_ttl().await,
        Vec::<String>::new(),
        "markers expire too"
    );
    let v = tier.check("a", &set, 1).await.expect("check");
    assert_eq!(v.decision.remaining, 5);
}

/// What a write-back of `entries` under ids `<id>-<i>` did, added up.
#[derive(Debug, Default)]
struct Report {
    applied_units: u64,
    already_applied: usize,
    expired: usize,
}

async fn write_back(tier: &RedisTier, id: &str, entries: &[LedgerEntry]) -> Report {
    let ids: Vec<String> = (0..entries.len()).map(|i| format!("{id}-{i}")).collect();
    let writes: Vec<WriteBack<'_>> = ids
        .iter()
        .zip(entries)
        .map(|(id, e)| WriteBack::new(id, e))
        .collect();
    let mut report = Report::default();
    for outcome in tier.reconcile(&writes).await.expect("reconcile") {
        match outcome.expect("an entry's outcome") {
            Written::Applied(units) => report.applied_units += units,
            Written::AlreadyApplied => report.already_applied += 1,
            Written::Expired => report.expired += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    report
}

/// A bucket whose burst is above its limit refills over more than a period,
/// and units admitted into it are owed for as long: 20 units of a 10-per-hour
/// rule with a burst of 20, admitted 61 minutes ago, still hold 20 - 10 × 61/60
/// of the bucket. They were dropped as stale after one period, and the key got
/// its whole burst again.
#[tokio::test]
async fn a_burst_above_the_limit_keeps_units_owed_past_a_period() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let label = format!("{algorithm:?}");
        let r = rule(algorithm, 10, Duration::from_secs(3600))
            .with_burst(20)
            .expect("valid");
        let set = set(&format!("burst{}", algorithm.code()), [r.clone()]);
        let at = clock.unix_micros() - 61 * 60_000_000;
        let entry = LedgerEntry::new(storage_key(&set, "k", 0), r, 20, at, at);
        assert!(entry.expires_at_us() > clock.unix_micros(), "{label}");
        let report = write_back(&tier, &format!("b{}", algorithm.code()), &[entry]).await;
        assert_eq!((report.applied_units, report.expired), (20, 0), "{label}");
        // 9.83 of 20 still owed: one more check leaves 9.
        let v = tier.check("k", &set, 1).await.expect("check");
        assert_eq!(v.decision.remaining, 9, "{label}");
    }
}

/// Three instances each spent their share of a bucket at once, 30 s before
/// they write back: 60 units of a 60-per-minute bucket, half refilled since.
/// Alone, each instance's 20 units read as refilled (20 s of units ending 10
/// s ago), and the bucket came back full; where each write-back ends is kept,
/// so the next stacks after it, and the bucket is half spent.
#[tokio::test]
async fn a_fleets_write_backs_stack_where_each_alone_refilled() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let label = format!("{algorithm:?}");
        let r = rule(algorithm, 60, Duration::from_secs(60));
        let set = set(&format!("fleet{}", algorithm.code()), [r.clone()]);
        let at = clock.unix_micros() - 30_000_000;
        let mut applied = 0;
        for instance in 0..3 {
            let entry = LedgerEntry::new(storage_key(&set, "k", 0), r.clone(), 20, at, at);
            let id = format!("f{}-{instance}", algorithm.code());
            applied += write_back(&tier, &id, &[entry]).await.applied_units;
        }
        assert_eq!(applied, 40, "{label}: the first 20 alone had refilled");
        // 30 of 60 still owed: one more check leaves 29.
        let v = tier.check("k", &set, 1).await.expect("check");
        assert_eq!(v.decision.remaining, 29, "{label}");
    }
}

/// Where a refilled write-back ends is kept in the past, and a check reads
/// it as a full bucket, never more: the token bucket's count below zero was
/// read as extra tokens by a check at the write-back's own time (its clock
/// not past the stored one), and its reply's reset came out negative.
#[tokio::test]
async fn a_check_after_a_refilled_write_back_finds_a_full_bucket() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let label = format!("{algorithm:?}");
        let r = rule(algorithm, 60, Duration::from_secs(60));
        let set = set(&format!("full{}", algorithm.code()), [r.clone()]);
        let at = clock.unix_micros() - 30_000_000;
        let entry = LedgerEntry::new(storage_key(&set, "k", 0), r, 20, at, at);
        let report = write_back(&tier, &format!("r{}", algorithm.code()), &[entry]).await;
        assert_eq!(report.expired, 1, "{label}: refilled 10 s ago");
        let v = tier.check("k", &set, 1).await.expect("check");
        assert_eq!(v.decision.remaining, 59, "{label}");
        assert!(
            v.decision.reset_after <= Duration::from_secs(1),
            "{label}: {v:?}"
        );
    }
}

/// More units than a bucket holds: the newest of them start where the
/// others' run ends. 10 units at once, then 10 over the next second, of a
/// 10-a-second bucket, written back at once, leave it empty; taken as spread
/// evenly over that second, they ended half a second early and the key got
/// 5 back.
#[tokio::test]
async fn a_bucket_write_back_above_its_capacity_keeps_the_newest_run() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let label = format!("{algorithm:?}");
        let r = rule(algorithm, 10, Duration::from_secs(1));
        let set = set(&format!("run{}", algorithm.code()), [r.clone()]);
        let now = clock.unix_micros();
        let entry = LedgerEntry::new(storage_key(&set, "k", 0), r, 20, now - 1_000_000, now);
        let report = write_back(&tier, &format!("n{}", algorithm.code()), &[entry]).await;
        assert_eq!(report.applied_units, 10, "{label}: the newest 10");
        let v = tier.check("k", &set, 1).await.expect("check");
        assert!(!v.decision.allowed, "{label}: {v:?}");
    }
}

/// A sliding log with less room than a write-back has units takes the
/// newest of them: those bound the key longest. It took the oldest, which
/// leave the log first, and the key was free again that much sooner than
/// the units admitted said.
#[tokio::test]
async fn a_sliding_log_short_of_room_keeps_the_newest_units() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    let r = rule(Algorithm::SlidingLog, 10, Duration::from_secs(3600));
    let set = set("newest", [r.clone()]);
    for _ in 0..8 {
        assert!(
            tier.check("k", &set, 1)
                .await
                .expect("check")
                .decision
                .allowed
        );
    }
    // 5 units over the last 40 minutes into the 2 places left.
    let minute = 60_000_000;
    let (first, last) = (NOW_US - 50 * minute, NOW_US - 10 * minute);
    let entry = LedgerEntry::new(storage_key(&set, "k", 0), r, 5, first, last);
    let report = write_back(&tier, "short", &[entry]).await;
    assert_eq!(report.applied_units, 2);
    let mut conn = server.conn().await;
    let scores: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg(storage_key(&set, "k", 0))
        .arg(0)
        .arg(1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .expect("ZRANGE");
    // The two oldest members are the write-back's: its 4th and 5th units.
    assert_eq!(
        scores.iter().map(|(_, at)| *at).collect::<Vec<_>>(),
        [NOW_US - 20 * minute, last],
        "{scores:?}"
    );
}

/// Where a write-back that leaves its bucket short ends is kept until a
/// full refill after it, as a refilled one's is: the next instance's units
/// of the same outage stack after it, however late they come. It was kept
/// only until the bucket was full again, and an instance writing back after
/// that found the key gone: its units read as refilled, and a bucket the
/// fleet spent twice over came back full.
#[tokio::test]
async fn a_write_back_that_leaves_its_bucket_short_is_kept_for_the_next_to_stack() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    // How long the second instance writes back after the first: the server
    // expires keys on its own clock, so this is real time.
    let later = Duration::from_millis(50);
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let label = format!("{algorithm:?}");
        let r = rule(algorithm, 60, Duration::from_secs(60));
        let set = set(&format!("short{}", algorithm.code()), [r.clone()]);
        // 20 units a second apart from here end 1 ms after now: the bucket
        // is short by 1 ms when the first instance writes them back.
        let at = clock.unix_micros() - 19_999_000;
        let entry = LedgerEntry::new(storage_key(&set, "k", 0), r.clone(), 20, at, at);
        let first = write_back(&tier, &format!("s{}-a", algorithm.code()), &[entry]).await;
        assert_eq!(first.applied_units, 20, "{label}");
        tokio::time::sleep(later).await;
        clock.advance(later);
        let entry = LedgerEntry::new(storage_key(&set, "k", 0), r, 20, at, at);
        let second = write_back(&tier, &format!("s{}-b", algorithm.code()), &[entry]).await;
        assert_eq!(
            (second.applied_units, second.expired),
            (20, 0),
            "{label}: stacked after the first"
        );
        // 20 s less 50 ms of the second instance's units still owed: one
        // more check leaves 60 - 20 - 1.
        let v = tier.check("k", &set, 1).await.expect("check");
        assert_eq!(v.decision.remaining, 39, "{label}");
    }
}

/// A host clock `0` µs behind the system's (negative: ahead), which the
/// private redis-server shares: a host whose clock is off Redis'.
#[derive(Debug)]
struct Skewed(i64);

impl Clock for Skewed {
    fn now(&self) -> Duration {
        tierlimit_core::SystemClock.now()
    }

    fn unix_micros(&self) -> u64 {
        tierlimit_core::SystemClock
            .unix_micros()
            .saturating_add_signed(-self.0)
    }
}

/// The 10 s windows of the skew tests, µs.
const PERIOD_US: u64 = 10_000_000;

/// Waits (at most a window and a half) until Redis' clock is `into` µs into
/// one of its 10 s windows, and answers its time then.
async fn into_window(
    conn: &mut redis::aio::MultiplexedConnection,
    into: std::ops::Range<u64>,
) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = server_time(conn).await;
        if into.contains(&(now % PERIOD_US)) {
            return now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Redis' clock never came {into:?} µs into a window"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Redis' clock, µs since the epoch.
async fn server_time(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1_000_000 + us
}

/// On server time, a write-back's times are on the host's clock, and the
/// script moves them onto Redis' by how far the host's clock is from it as
/// the write-back is sent. Regression: from a host 2 s behind, units
/// admitted in a window still live on Redis' clock, but in the last 2 s of a
/// window on the host's, were dropped as passed (lost); from a host 2 s
/// ahead, units of a window that had passed on Redis' clock were charged to
/// the next one. Rule 100 per 10 s, fixed windows; Redis' time 0.5 to 1 s
/// into a window.
#[tokio::test]
async fn a_skewed_hosts_write_back_lands_in_the_window_its_units_were_admitted_in() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let r = rule(Algorithm::FixedWindow, 100, Duration::from_secs(10));
    let now = into_window(&mut conn, 500_000..1_000_000).await;
    // (host clock behind Redis', units' age on Redis' clock, applied, expired)
    for (skew_us, age_us, applied, expired) in [
        (2_000_000_i64, 300_000_u64, 30, 0),
        (-2_000_000, 1_100_000, 0, 1),
    ] {
        let set = set(&format!("skew{}", skew_us.signum() + 1), [r.clone()]);
        let tier = RedisTier::new(
            tierlimit_redis::RedisTierConfig::new(server.url())
                .deadline(Duration::from_secs(2))
                .local_clock(Arc::new(Skewed(skew_us))),
        )
        .expect("valid config");
        // Admitted `age_us` before `now` on Redis' clock, stamped by the host's.
        let at = (now - age_us).saturating_add_signed(-skew_us);
        let entry = LedgerEntry::new(storage_key(&set, "k", 0), r.clone(), 30, at, at + 50_000);
        let report = write_back(&tier, &format!("skew{skew_us}"), &[entry]).await;
        assert_eq!(
            (report.applied_units, report.expired),
            (applied, expired),
            "host {skew_us} µs behind: {report:?}"
        );
        // Redis' own window now holds them, or not.
        let d = tier.check("k", &set, 1).await.expect("check").decision;
        assert_eq!(d.remaining, 100 - applied - 1, "host {skew_us} µs behind");
    }
}

/// The units of one of a skewed host's windows, moved onto Redis' clock, can
/// straddle two of Redis' windows: each window gets its own, spread evenly
/// over the entry's span as the sliding log spreads them, and those of a
/// window already passed count no more. Regression (review): every unit went
/// to the window of the last, up to a whole window's limit over-charged.
/// Host 5 s behind; 30 units over Redis' [now - 6.5 s, now - 0.5 s], now 2 to
/// 2.5 s into a 10 s window: 7 to 10 of them fall in it.
#[tokio::test]
async fn a_write_back_straddling_two_windows_charges_each_its_own() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let now = into_window(&mut conn, 2_000_000..2_500_000).await;
    const SKEW_US: u64 = 5_000_000;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let r = rule(algorithm, 100, Duration::from_secs(10));
        let set = set(&format!("straddle{}", algorithm.code()), [r.clone()]);
        let tier = RedisTier::new(
            tierlimit_redis::RedisTierConfig::new(server.url())
                .deadline(Duration::from_secs(2))
                .local_clock(Arc::new(Skewed(SKEW_US as i64))),
        )
        .expect("valid config");
        let (first, last) = (now - 6_500_000 - SKEW_US, now - 500_000 - SKEW_US);
        let entry = LedgerEntry::new(storage_key(&set, "k", 0), r.clone(), 30, first, last);
        let report = write_back(&tier, &format!("straddle{}", algorithm.code()), &[entry]).await;
        let d = tier.check("k", &set, 1).await.expect("check").decision;
        let label = format!("{algorithm:?}: {report:?}, remaining {}", d.remaining);
        if algorithm == Algorithm::FixedWindow {
            // Only the current window's units count.
            assert!((7..=10).contains(&report.applied_units), "{label}");
            assert_eq!(d.remaining, 100 - report.applied_units - 1, "{label}");
        } else {
            // All count, the earlier ones in the previous window (weighed by
            // what is left of it), the rest in this one.
            assert_eq!(report.applied_units, 30, "{label}");
            assert!(d.remaining > 100 - 30 - 1, "{label}");
        }
    }
}
