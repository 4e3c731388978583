//! Regression (issue 9, item 13): metrics an operator can act on. Before, no
//! metric had a help text or unit, decisions had no rule-set label, two
//! limiters in one process overwrote each other's gauges, probes and
//! connection replacements were not counted, and a check left no trace.
//!
//! A recorder and a tracing subscriber of this test's own capture what the
//! limiter emits through a whole outage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use tierlimit::{HybridLimiter, Instances, Policy, Rule, RuleSet};
use tierlimit_test::{Fault, FaultProxy, RedisServer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata as TraceMetadata, Subscriber};

type Series = (String, Vec<(String, String)>);

#[derive(Default)]
struct Capture {
    described: Mutex<BTreeMap<String, (Option<Unit>, String)>>,
    /// Every series registered, by name and sorted labels.
    series: Mutex<BTreeSet<Series>>,
    gauges: Mutex<BTreeMap<Series, Arc<AtomicU64>>>,
    counters: Mutex<BTreeMap<Series, Arc<AtomicU64>>>,
    /// Field values of every `tierlimit_check` span.
    spans: Mutex<BTreeMap<u64, BTreeMap<String, String>>>,
    next_span: AtomicU64,
    /// Field values of every warning event.
    warnings: Mutex<Vec<BTreeMap<String, String>>>,
}

fn series(key: &Key) -> Series {
    let mut labels: Vec<(String, String)> = key
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect();
    labels.sort();
    (key.name().to_owned(), labels)
}

struct CounterCell(Arc<AtomicU64>);
impl CounterFn for CounterCell {
    fn increment(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    fn absolute(&self, n: u64) {
        self.0.fetch_max(n, Ordering::Relaxed);
    }
}

struct GaugeCell(Arc<AtomicU64>);
impl GaugeFn for GaugeCell {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

struct Rec(&'static Capture);

impl Recorder for Rec {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(key, unit, help);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(key, unit, help);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(key, unit, help);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let s = series(key);
        self.0.series.lock().expect("lock").insert(s.clone());
        let cell = self
            .0
            .counters
            .lock()
            .expect("lock")
            .entry(s)
            .or_default()
            .clone();
        Counter::from_arc(Arc::new(CounterCell(cell)))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let s = series(key);
        self.0.series.lock().expect("lock").insert(s.clone());
        let cell = self
            .0
            .gauges
            .lock()
            .expect("lock")
            .entry(s)
            .or_default()
            .clone();
        Gauge::from_arc(Arc::new(GaugeCell(cell)))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0.series.lock().expect("lock").insert(series(key));
        Histogram::noop()
    }
}

impl Rec {
    fn describe(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.0
            .described
            .lock()
            .expect("lock")
            .insert(key.as_str().to_owned(), (unit, help.to_string()));
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);
impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

struct Sub(&'static Capture);

impl Subscriber for Sub {
    fn enabled(&self, _: &TraceMetadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.0.next_span.fetch_add(1, Ordering::Relaxed) + 1;
        if span.metadata().name() == "tierlimit_check" {
            let mut fields = BTreeMap::new();
            span.record(&mut Fields(&mut fields));
            self.0.spans.lock().expect("lock").insert(id, fields);
        }
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(fields) = self.0.spans.lock().expect("lock").get_mut(&span.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            self.0.warnings.lock().expect("lock").push(fields);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture: &'static Capture = Box::leak(Box::default());
        metrics::set_global_recorder(Rec(capture)).expect("the only recorder");
        tracing::subscriber::set_global_default(Sub(capture)).expect("the only subscriber");
        capture
    })
}

/// Whether `done` held within `timeout`, polled every 10 ms.
async fn until(timeout: Duration, done: impl Fn() -> bool) -> bool {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

fn gauge(capture: &Capture, name: &str, limiter: &str) -> Option<f64> {
    capture
        .gauges
        .lock()
        .expect("lock")
        .iter()
        .find(|((n, labels), _)| {
            n == name && labels.iter().any(|(k, v)| k == "limiter" && v == limiter)
        })
        .map(|(_, v)| f64::from_bits(v.load(Ordering::Relaxed)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_described_labelled_by_limiter_and_every_check_traced() {
    let capture = capture();
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let build = |name: &str, url: &str, instances| {
        let mut breaker = tierlimit::BreakerConfig::default();
        breaker.cool_down = Duration::from_millis(100);
        HybridLimiter::builder()
            .redis_url(url)
            .name(name)
            .breaker(breaker)
            .instances(Instances::Fixed(instances))
            .prune_every(Duration::from_millis(20))
            .build()
            .expect("valid config")
    };
    let a = build("a", &proxy.url(), 2);
    let b = build("b", &server.url(), 5);
    let set = RuleSet::new("api", [Rule::per_second(5).expect("valid")])
        .expect("valid")
        .with_policy(Policy::LocalFallback)
        .with_reconcile(true);
    for _ in 0..7 {
        a.check("user-1", &set, 1).await.expect("valid");
        b.check("user-1", &set, 1).await.expect("valid");
    }
    // An outage of a's Redis: local decisions, a probe that fails, then recovery.
    let owed_since = Instant::now();
    proxy.set(Fault::Refuse);
    while a.breaker_state() == tierlimit::BreakerState::Closed {
        a.check("trip", &set, 1).await.expect("valid");
    }
    a.check("user-2", &set, 1).await.expect("valid");
    // Drain lag: what a owes Redis waits while its Redis is away (gauges
    // are published every 20 ms here, by a task a busy machine may delay).
    let lag = || gauge(capture, "tierlimit_ledger_oldest_seconds", "a").unwrap_or(0.0);
    assert!(
        until(Duration::from_secs(10), || lag() >= 0.2).await,
        "drain lag still {} s after {:?}",
        lag(),
        owed_since.elapsed()
    );
    let waited = owed_since.elapsed().as_secs_f64();
    assert!(lag() <= waited, "drain lag {} s after {waited} s", lag());
    proxy.set(Fault::None);
    assert!(a.wait_closed(Duration::from_secs(10)).await);
    // The pruner publishes the gauges: the breaker's, closed, once it ran.
    assert!(
        until(Duration::from_secs(10), || gauge(
            capture,
            "tierlimit_breaker_state",
            "a"
        ) == Some(0.0))
        .await,
        "the closed breaker's gauge was not published within 10 s"
    );

    let described = capture.described.lock().expect("lock").clone();
    let emitted = capture.series.lock().expect("lock").clone();
    // Every emitted metric is described, with a unit and a help text.
    for (name, _) in &emitted {
        let (unit, help) = described
            .get(name)
            .unwrap_or_else(|| panic!("{name} is emitted but not described"));
        assert!(
            unit.is_some() && help.len() > 10,
            "{name}: {unit:?} {help:?}"
        );
    }
    // The crate docs' table lists exactly the described metrics.
    let docs: BTreeSet<String> = include_str!("../src/lib.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//! | `tierlimit_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| format!("tierlimit_{name}"))
        .collect();
    let described_names: BTreeSet<String> = described.keys().cloned().collect();
    assert_eq!(
        docs, described_names,
        "the docs table and the described metrics differ"
    );

    // Decisions carry limiter, set, tier and outcome.
    for (limiter, tier) in [
        ("a", "redis"),
        ("a", "local"),
        ("a", "deny_cache"),
        ("b", "redis"),
    ] {
        assert!(
            emitted
                .iter()
                .any(|(n, labels)| n == "tierlimit_decisions_total"
                    && labels.contains(&("limiter".into(), limiter.into()))
                    && labels.contains(&("set".into(), "api".into()))
                    && labels.contains(&("tier".into(), tier.into()))),
            "no decision series for limiter {limiter}, tier {tier}: {emitted:?}"
        );
    }
    // Probes are counted by result; the two limiters keep separate gauges.
    for result in ["failed", "succeeded"] {
        assert!(
            emitted
                .iter()
                .any(|(n, labels)| n == "tierlimit_probes_total"
                    && labels.contains(&("result".into(), result.into()))),
            "no {result} probe counted"
        );
    }
    assert_eq!(gauge(capture, "tierlimit_instances", "a"), Some(2.0));
    assert_eq!(gauge(capture, "tierlimit_instances", "b"), Some(5.0));
    assert_eq!(gauge(capture, "tierlimit_breaker_state", "a"), Some(0.0));

    // Every check is a span with the set, a hash of the key (never the key),
    // the tier and the outcome.
    let spans = capture.spans.lock().expect("lock").clone();
    let checks: Vec<_> = spans.values().filter(|f| f.contains_key("tier")).collect();
    assert!(checks.len() >= 14, "{} check spans", checks.len());
    for fields in &checks {
        assert_eq!(fields.get("set").map(String::as_str), Some("api"));
        let hash = fields.get("key_hash").expect("a key hash");
        assert!(
            hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()),
            "{hash}"
        );
        assert!(fields.contains_key("allowed"));
        assert!(
            !fields.values().any(|v| v.contains("user-1")),
            "a raw key in {fields:?}"
        );
    }
    // Keyed: one key hashes alike on both limiters of a process, keys apart
    // hash apart, and no hash is the key's under a hasher anyone can run
    // (the standard one with its fixed keys).
    let mut by_hash: BTreeMap<&str, usize> = BTreeMap::new();
    for fields in &checks {
        *by_hash.entry(fields["key_hash"].as_str()).or_default() += 1;
    }
    assert!(by_hash.len() >= 3, "user-1, user-2 and trip: {by_hash:?}");
    assert!(
        by_hash.values().any(|n| *n >= 14),
        "user-1's 14 checks (7 on each limiter) under one hash: {by_hash:?}"
    );
    for key in ["user-1", "user-2", "trip"] {
        let mut plain = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(key, &mut plain);
        let plain = format!("{:016x}", std::hash::Hasher::finish(&plain));
        assert!(
            !by_hash.contains_key(plain.as_str()),
            "{key}'s unkeyed hash"
        );
    }
}

/// A limiter dropped without `shutdown()` while it owes Redis units counts
/// them, as the README says, in
/// `tierlimit_ledger_dropped_units_total{reason="dropped"}` (under its own
/// `limiter` label) and names them in a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_dropped_while_it_owes_units_counts_them_lost() {
    let capture = capture();
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let limiter = HybridLimiter::builder()
        .redis_url(proxy.url())
        .name("dropper")
        .instances(Instances::Fixed(1))
        .build()
        .expect("valid config");
    // Named as the other test's: it asserts every check span it captures
    // (this test's too, in one process) names the set "api".
    let set = RuleSet::new("api", [Rule::per_hour(10).expect("valid")])
        .expect("valid")
        .with_policy(Policy::LocalFallback);
    proxy.set(Fault::Refuse);
    while limiter.breaker_state() == tierlimit::BreakerState::Closed {
        let _ = limiter.check("trip", &set, 1).await;
    }
    for _ in 0..3 {
        let d = limiter.check("k", &set, 1).await.expect("valid");
        assert!(d.allowed && d.tier == tierlimit::Tier::Local, "{d:?}");
    }
    let owed = limiter.local().ledger().units();
    assert!(owed >= 3, "owed {owed}");
    drop(limiter);
    let dropped = capture
        .counters
        .lock()
        .expect("lock")
        .iter()
        .find(|((n, labels), _)| {
            n == "tierlimit_ledger_dropped_units_total"
                && labels.contains(&("limiter".to_owned(), "dropper".to_owned()))
                && labels.contains(&("reason".to_owned(), "dropped".to_owned()))
        })
        .map(|(_, v)| v.load(Ordering::Relaxed));
    assert_eq!(dropped, Some(owed));
    let warnings = capture.warnings.lock().expect("lock").clone();
    assert!(
        warnings.iter().any(|w| {
            w.get("units") == Some(&owed.to_string())
                && w.get("message")
                    .is_some_and(|m| m.contains("dropped without shutdown()"))
        }),
        "no warning named the {owed} units lost: {warnings:?}"
    );
}
