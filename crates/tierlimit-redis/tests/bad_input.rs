//! Every kind of bad input is refused with its own error. Rules and rule sets
//! are refused when built; keys and costs by `RedisTier::check` before any I/O,
//! shown with a tier whose server port is closed.

mod support;

use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use tierlimit_core::{
    Algorithm, Error, MAX_EXACT, MAX_KEY_LEN, MAX_LIMIT, MAX_REFILL_US, MAX_SLIDING_LOG_LIMIT,
    RedisFailure, Rule, RuleSet,
};
use tierlimit_redis::{CheckRequest, RedisTier, RedisTierConfig};

use support::{rule, set};

/// A tier on a loopback port nothing listens on.
fn closed_port_tier() -> RedisTier {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port();
    // The listener is dropped here, so the port is closed.
    RedisTier::new(RedisTierConfig::new(format!("redis://127.0.0.1:{port}/")))
        .expect("valid config")
}

fn api() -> RuleSet {
    set(
        "api",
        [
            Rule::per_second(10).expect("valid"),
            Rule::per_minute(5).expect("valid"),
        ],
    )
}

#[test]
fn zero_limit() {
    assert!(matches!(Rule::per_second(0), Err(Error::ZeroLimit)));
}

#[test]
fn zero_period() {
    assert!(matches!(
        Rule::with_period(1, Duration::ZERO),
        Err(Error::PeriodTooShort { .. })
    ));
}

#[test]
fn sub_millisecond_period() {
    assert!(matches!(
        Rule::with_period(1, Duration::from_micros(999)),
        Err(Error::PeriodTooShort { .. })
    ));
}

#[test]
fn period_not_whole_microseconds() {
    assert!(matches!(
        Rule::with_period(1, Duration::from_nanos(1_000_500)),
        Err(Error::PeriodPrecision { .. })
    ));
}

#[test]
fn limit_above_2_pow_53() {
    assert!(matches!(
        Rule::per_day(MAX_EXACT + 1),
        Err(Error::LimitTooLarge { value, max: MAX_LIMIT }) if value == MAX_EXACT + 1
    ));
}

/// Regression (issue 9, item 22): `with_period(2^53, 2^53 µs)` was accepted,
/// and in the scripts' doubles `c + 1` rounded back to `c`. Limits and bursts
/// stop at 2^51, so the largest sum a script forms (previous + current + cost
/// of the sliding window) stays below 2^53. `exact_bounds.rs` shows the
/// largest accepted values exact on Redis.
#[test]
fn limit_and_burst_above_2_pow_51() {
    let period = Duration::from_micros(MAX_EXACT);
    assert!(matches!(
        Rule::with_period(MAX_EXACT, period),
        Err(Error::LimitTooLarge {
            value: MAX_EXACT,
            max: MAX_LIMIT
        })
    ));
    // A rule starts as GCRA, which needs a period of at least `limit` µs.
    let long = Duration::from_micros(MAX_LIMIT);
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let at_bound = Rule::with_period(MAX_LIMIT, long).and_then(|r| r.with_algorithm(algorithm));
        assert!(at_bound.is_ok(), "{algorithm:?}: {at_bound:?}");
    }
    assert!(matches!(
        Rule::with_period(MAX_LIMIT + 1, long),
        Err(Error::LimitTooLarge { value, max: MAX_LIMIT }) if value == MAX_LIMIT + 1
    ));
    // 2^40 per 2^41 µs: a burst of 2^51 refills in 2^52 µs, the longest accepted.
    let r = Rule::with_period(1 << 40, Duration::from_micros(1 << 41)).expect("valid");
    assert!(r.clone().with_burst(MAX_LIMIT).is_ok());
    assert!(matches!(
        r.with_burst(MAX_LIMIT + 1),
        Err(Error::LimitTooLarge { value, max: MAX_LIMIT }) if value == MAX_LIMIT + 1
    ));
}

/// Regression (issue 9, item 22): GCRA stores its arrival time as now +
/// burst * period / limit µs since the epoch; with that term up to 2^53 the sum
/// passed 2^53. The term now stops at 2^52.
#[test]
fn refill_beyond_2_pow_52() {
    let longest = Rule::with_period(1, Duration::from_micros(MAX_REFILL_US));
    assert!(longest.is_ok(), "{longest:?}");
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        // No burst was given: the period is what is too long, and the error
        // names the bound this rule has, also past 2^53 µs (where it named
        // the windows' 2^53, and a period cut to that met a second error).
        for period_us in [MAX_REFILL_US + 1, (1 << 53) + 1] {
            let r = Rule::new(1, Duration::from_micros(period_us), algorithm);
            assert!(
                matches!(r, Err(Error::PeriodTooLong { max, .. }) if max == Duration::from_micros(MAX_REFILL_US)),
                "{algorithm:?} over {period_us} µs: {r:?}"
            );
        }
    }
    // The same bound through the burst: 3 per 3 * 2^50 µs refill 2^52 µs at a burst of 4.
    let r = Rule::with_period(3, Duration::from_micros(3 << 50)).expect("valid");
    assert!(r.clone().with_burst(4).is_ok());
    assert!(matches!(
        r.with_burst(5),
        Err(Error::BurstWindowTooLong { capacity: 5, .. })
    ));
}

/// Regression (issue 9, item 9): `per_hour(1_000_000)` as a sliding log was
/// accepted, and one check of cost 1,000,000 added a million sorted-set
/// members in one script call, blocking Redis for seconds. A sliding log's
/// limit now stops at `MAX_SLIDING_LOG_LIMIT`; `script_work.rs` shows the
/// largest accepted call taking milliseconds of server time.
#[test]
fn sliding_log_limit_above_its_bound() {
    let log = |limit| Rule::per_hour(limit).and_then(|r| r.with_algorithm(Algorithm::SlidingLog));
    assert!(log(MAX_SLIDING_LOG_LIMIT).is_ok());
    for limit in [MAX_SLIDING_LOG_LIMIT + 1, 1_000_000, 1_000_000_000] {
        assert!(
            matches!(
                log(limit),
                Err(Error::SlidingLogTooLarge { limit: l, max: MAX_SLIDING_LOG_LIMIT }) if l == limit
            ),
            "{limit}"
        );
    }
}

/// The same rule twice would put one storage key twice into one script call,
/// which the script refuses (it could not commit both whole). So would two
/// rules that differ only in limit or burst (issue 13: those are not part of
/// the storage key).
#[test]
fn duplicate_rule() {
    let r = Rule::per_second(10).expect("valid");
    let m = Rule::per_minute(10).expect("valid");
    assert!(matches!(
        RuleSet::new("api", [r.clone(), m.clone(), r]),
        Err(Error::DuplicateRule {
            first: 0,
            second: 2
        })
    ));
    let wider = Rule::per_minute(50)
        .and_then(|r| r.with_burst(5))
        .expect("valid");
    assert!(matches!(
        RuleSet::new("api", [m, wider]),
        Err(Error::DuplicateRule {
            first: 0,
            second: 1
        })
    ));
}

#[test]
fn zero_burst() {
    let r = Rule::per_second(10).expect("valid");
    assert!(matches!(r.with_burst(0), Err(Error::ZeroBurst)));
}

#[test]
fn burst_whose_refill_is_beyond_exact_doubles() {
    let r = Rule::per_day(1).expect("valid");
    assert!(matches!(
        r.with_burst(1 << 40),
        Err(Error::BurstWindowTooLong { capacity, limit: 1, .. }) if capacity == 1 << 40
    ));
}

#[test]
fn burst_on_window_algorithms() {
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let r = rule(algorithm, 10, Duration::from_secs(1));
        assert!(
            matches!(r.with_burst(5), Err(Error::BurstNotSupported { algorithm: a }) if a == algorithm),
            "{algorithm:?}"
        );
    }
}

#[test]
fn rate_finer_than_one_per_microsecond() {
    assert!(matches!(
        Rule::with_period(1_001, Duration::from_millis(1)),
        Err(Error::RateTooFine { .. })
    ));
}

/// A window counts units, not their spacing: one may hold more than one
/// unit per microsecond of its period (100 billion bytes a day), where GCRA
/// and the token bucket cannot. Regression: every rule was first made as
/// GCRA and then given its algorithm, so each such window was refused with
/// `RateTooFine`, and so were the config file's and the rule texts'.
#[tokio::test]
async fn a_window_may_count_more_than_one_unit_per_microsecond() {
    let server = tierlimit_test::RedisServer::start();
    let tier = support::tier(&server.url());
    let day = Duration::from_secs(86_400);
    let limit = 100_000_000_000;
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        let r = Rule::new(limit, day, algorithm).expect("a window of 1e11 per day");
        let s = set("bytes", [r]);
        let key = format!("{algorithm:?}");
        let v = tier.check(&key, &s, limit - 1).await.expect("checked");
        assert!(v.decision.allowed, "{algorithm:?}: {v:?}");
        assert_eq!(v.decision.remaining, 1, "{algorithm:?}");
        assert!(
            !tier
                .check(&key, &s, 2)
                .await
                .expect("checked")
                .decision
                .allowed
        );
    }
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        assert!(
            matches!(
                Rule::new(limit, day, algorithm),
                Err(Error::RateTooFine { .. })
            ),
            "{algorithm:?}"
        );
    }
    let calendar: Rule = "100000000000/day@UTC".parse().expect("a calendar window");
    assert_eq!(calendar, Rule::per_natural_day(limit, 0).expect("valid"));
    let sliding = tierlimit_core::parse_rule_as("100000000000/day", Some(Algorithm::SlidingWindow))
        .expect("a sliding window");
    assert_eq!(
        sliding,
        Rule::new(limit, day, Algorithm::SlidingWindow).expect("valid")
    );
}

#[test]
fn utc_offset_on_other_algorithms() {
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ] {
        let r = rule(algorithm, 10, Duration::from_secs(3600));
        assert!(
            matches!(r.with_utc_offset(3600), Err(Error::CalendarNeedsFixedWindow { algorithm: a }) if a == algorithm),
            "{algorithm:?}"
        );
        // UTC itself is a calendar window, in either order of the calls.
        let r = rule(algorithm, 10, Duration::from_secs(3600));
        assert!(
            matches!(
                r.with_utc_offset(0),
                Err(Error::CalendarNeedsFixedWindow { .. })
            ),
            "{algorithm:?} at UTC"
        );
        let calendar = Rule::per_natural_day(10, 0).expect("a UTC day");
        assert!(
            matches!(
                calendar.with_algorithm(algorithm),
                Err(Error::CalendarNeedsFixedWindow { .. })
            ),
            "a UTC day made {algorithm:?}"
        );
    }
}

#[test]
fn a_calendar_period_divides_a_day() {
    let seven_hours = rule(Algorithm::FixedWindow, 10, Duration::from_secs(7 * 3600));
    assert!(matches!(
        seven_hours.clone().with_utc_offset(3600),
        Err(Error::CalendarPeriod { period }) if period == Duration::from_secs(7 * 3600)
    ));
    assert!(matches!(
        seven_hours.with_utc_offset(0),
        Err(Error::CalendarPeriod { .. })
    ));
    let six_hours = rule(Algorithm::FixedWindow, 10, Duration::from_secs(6 * 3600));
    assert!(six_hours.with_utc_offset(3600).is_ok());
}

#[test]
fn empty_rule_set() {
    assert!(matches!(RuleSet::new("api", []), Err(Error::EmptyRuleSet)));
}

#[test]
fn invalid_rule_set_name() {
    let r = Rule::per_second(1).expect("valid");
    assert!(matches!(
        RuleSet::new("no spaces", [r]),
        Err(Error::InvalidName { .. })
    ));
}

#[test]
fn invalid_tier_config() {
    let bad = [
        RedisTierConfig::new("redis://127.0.0.1:1/").deadline(Duration::ZERO),
        RedisTierConfig::new("redis://127.0.0.1:1/").deadline(Duration::from_secs(3600)),
        RedisTierConfig::new("redis://127.0.0.1:1/").connect_timeout(Duration::ZERO),
        RedisTierConfig::new("redis://127.0.0.1:1/").reconnect_retries(1000),
        RedisTierConfig::new("redis://127.0.0.1:1/").reconnect_max_delay(Duration::ZERO),
        RedisTierConfig::new("not a url"),
    ];
    for config in bad {
        let shown = format!("{config:?}");
        assert!(
            matches!(RedisTier::new(config), Err(Error::InvalidConfig { .. })),
            "{shown}"
        );
    }
}

#[tokio::test]
async fn cost_zero() {
    let err = closed_port_tier()
        .check("k", &api(), 0)
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::ZeroCost), "{err:?}");
}

#[tokio::test]
async fn cost_above_capacity_is_not_a_denial() {
    // 6 can never pass rule 1 (5 per minute): an error, not a "retry later".
    let err = closed_port_tier()
        .check("k", &api(), 6)
        .await
        .expect_err("refused");
    assert!(
        matches!(
            err,
            Error::CostExceedsCapacity {
                cost: 6,
                rule: 1,
                capacity: 5
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn empty_key() {
    let err = closed_port_tier()
        .check("", &api(), 1)
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::EmptyKey), "{err:?}");
}

#[tokio::test]
async fn key_longer_than_512_bytes() {
    let key = "k".repeat(MAX_KEY_LEN + 1);
    let err = closed_port_tier()
        .check(&key, &api(), 1)
        .await
        .expect_err("refused");
    assert!(
        matches!(err, Error::KeyTooLong { len, max: MAX_KEY_LEN } if len == MAX_KEY_LEN + 1),
        "{err:?}"
    );
}

#[tokio::test]
async fn key_with_control_character() {
    let err = closed_port_tier()
        .check("user\u{7}42", &api(), 1)
        .await
        .expect_err("refused");
    assert!(
        matches!(err, Error::KeyControlChar { position: 4 }),
        "{err:?}"
    );
}

#[tokio::test]
async fn bad_items_of_a_batch_fail_alone_and_before_io() {
    let api = api();
    let long = "k".repeat(MAX_KEY_LEN + 1);
    let batch = [
        CheckRequest::new("", &api, 1),
        CheckRequest::new(&long, &api, 1),
        CheckRequest::new("k", &api, 0),
        CheckRequest::new("k", &api, 6),
    ];
    let results = closed_port_tier()
        .check_many(&batch)
        .await
        .expect("nothing to send, so no I/O error");
    assert!(matches!(results[0], Err(Error::EmptyKey)));
    assert!(matches!(results[1], Err(Error::KeyTooLong { .. })));
    assert!(matches!(results[2], Err(Error::ZeroCost)));
    assert!(matches!(results[3], Err(Error::CostExceedsCapacity { .. })));
}

/// The control for the tests above: the same tier, given good input, does try
/// to reach the closed port, so those errors really came before any I/O.
#[tokio::test]
async fn good_input_reaches_for_the_server() {
    let err = closed_port_tier()
        .check("k", &api(), 1)
        .await
        .expect_err("nothing listens");
    assert!(!err.is_bad_input(), "{err:?}");
    assert!(
        matches!(
            err.redis_failure(),
            Some(RedisFailure::ConnectionRefused | RedisFailure::Timeout)
        ),
        "{err:?}"
    );
}
