//! Shared set-up of the hybrid limiter's fault tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tierlimit::{
    BreakerConfig, BreakerState, HybridLimiter, HybridLimiterBuilder, Instances, RuleSet,
};

/// The deadline every fault test runs with.
pub const DEADLINE: Duration = Duration::from_millis(50);

/// A breaker tuned like production but with short cool-downs, so tests recover fast.
pub fn breaker() -> BreakerConfig {
    let mut b = BreakerConfig::default();
    b.cool_down = Duration::from_millis(200);
    b.max_cool_down = Duration::from_millis(800);
    b
}

/// A builder with the test defaults (deadline 50 ms, short cool-downs, fixed 1
/// instance); set `.instances(..)` for another count.
pub fn builder(url: &str) -> HybridLimiterBuilder {
    HybridLimiter::builder()
        .redis_url(url)
        .deadline(DEADLINE)
        .breaker(breaker())
        .instances(Instances::Fixed(1))
        .heartbeat_every(Duration::from_millis(100))
}

/// Builds a limiter and waits until its first probe closed the breaker.
pub async fn healthy(builder: HybridLimiterBuilder) -> Arc<HybridLimiter> {
    let limiter = Arc::new(builder.build().expect("valid limiter config"));
    assert!(
        limiter.wait_closed(Duration::from_secs(5)).await,
        "the limiter did not reach Redis within 5 s"
    );
    limiter
}

/// Records every change of a breaker's state, polled each millisecond.
#[derive(Debug)]
pub struct StateLog {
    pub events: Arc<Mutex<Vec<(Duration, BreakerState)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StateLog {
    pub fn start(limiter: Arc<HybridLimiter>, origin: Instant) -> StateLog {
        let events = Arc::new(Mutex::new(vec![(
            origin.elapsed(),
            limiter.breaker_state(),
        )]));
        let log = events.clone();
        let task = tokio::spawn(async move {
            let mut last = limiter.breaker_state();
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let now = limiter.breaker_state();
                if now != last {
                    log.lock().expect("log lock").push((origin.elapsed(), now));
                    last = now;
                }
            }
        });
        StateLog { events, task }
    }

    /// The first time the state became `state` at or after `from`.
    pub fn first(&self, state: BreakerState, from: Duration) -> Option<Duration> {
        self.events
            .lock()
            .expect("log lock")
            .iter()
            .find(|(at, s)| *s == state && *at >= from)
            .map(|(at, _)| *at)
    }

    /// True when the breaker was not Closed during the whole of `[at - margin,
    /// at + margin]` (the log is polled, so it lags a transition by a little).
    pub fn open_throughout(&self, at: Duration, margin: Duration) -> bool {
        let events = self.events.lock().expect("log lock");
        let state_at = |t: Duration| {
            events
                .iter()
                .take_while(|(when, _)| *when <= t)
                .last()
                .map(|(_, s)| *s)
        };
        let from = at.saturating_sub(margin);
        let changes_inside = events
            .iter()
            .any(|(when, _)| *when > from && *when <= at + margin);
        !changes_inside && state_at(from).is_some_and(|s| s != BreakerState::Closed)
    }

    /// True when the breaker left Closed at any time after `from`.
    pub fn left_closed(&self, from: Duration) -> bool {
        self.events
            .lock()
            .expect("log lock")
            .iter()
            .any(|(at, s)| *at >= from && *s != BreakerState::Closed)
    }
}

impl Drop for StateLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Wall-clock milliseconds since the Unix epoch: fixed windows are aligned to
/// it, so tests count admissions per window with it.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A rule set of `limit` per hour, answered locally during an outage.
pub fn hourly(name: &str, limit: u64) -> RuleSet {
    RuleSet::new(name, [tierlimit::Rule::per_hour(limit).expect("valid")])
        .expect("valid")
        .with_policy(tierlimit::Policy::LocalFallback)
}

/// Waits for a condition, polling each millisecond; false after `timeout`.
pub async fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cond()
}

/// Checks until the breaker leaves Closed (Redis must already be failing); panics
/// after 2 s.
pub async fn trip(limiter: &HybridLimiter, set: &RuleSet) {
    let end = Instant::now() + Duration::from_secs(2);
    while limiter.breaker_state() == BreakerState::Closed {
        assert!(Instant::now() < end, "the breaker did not trip within 2 s");
        let _ = limiter.check("trip", set, 1).await;
    }
}

/// Waits until the breaker closed again and the outage ledger is drained;
/// panics after `timeout`.
pub async fn drained(limiter: &HybridLimiter, timeout: Duration) {
    assert!(
        limiter.wait_closed(timeout).await,
        "the breaker did not close within {timeout:?}"
    );
    assert!(
        wait_for(timeout, || limiter.reconcile_stats().pending_units == 0).await,
        "the ledger did not drain within {timeout:?}: {:?}",
        limiter.reconcile_stats()
    );
}
