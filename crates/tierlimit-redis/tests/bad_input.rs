//! Every kind of bad input is refused with its own error. Rules and rule sets
//! are refused when built; keys and costs by `RedisTier::check` before any I/O,
//! shown with a tier whose server port is closed.

mod support;

use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use tierlimit_core::{Algorithm, Error, MAX_EXACT, MAX_KEY_LEN, RedisFailure, Rule, RuleSet};
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
        Err(Error::LimitTooLarge { value }) if value == MAX_EXACT + 1
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
    }
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
