//! A limiter built from a config file and reloaded from it: once
//! (`reload_file`) and on every change (`watch_config`). A file that does not
//! load keeps the config in force, returns its error and is counted; a
//! changed limit keeps its usage; start-only settings are named, not applied.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use tierlimit::{Config, HybridLimiter, Policy};
use tierlimit_test::RedisServer;

/// Counters by name and `limiter` label; gauges and histograms ignored.
#[derive(Default)]
struct Counters(Mutex<HashMap<(String, String, String), Arc<AtomicU64>>>);

struct Cell(Arc<AtomicU64>);

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    fn absolute(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
}

struct Rec(&'static Counters);

impl Recorder for Rec {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        let id = (key.name().to_owned(), label("limiter"), label("result"));
        let cell = self
            .0
            .0
            .lock()
            .expect("counters lock")
            .entry(id)
            .or_default()
            .clone();
        Counter::from_arc(Arc::new(Cell(cell)))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<&'static Counters> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        let counters: &'static Counters = Box::leak(Box::default());
        metrics::set_global_recorder(Rec(counters)).expect("the only recorder of this binary");
        counters
    })
}

/// `tierlimit_config_reloads_total{limiter, result}`.
fn reloads(limiter: &str, result: &str) -> u64 {
    let id = (
        "tierlimit_config_reloads_total".to_owned(),
        limiter.to_owned(),
        result.to_owned(),
    );
    counters()
        .0
        .lock()
        .expect("counters lock")
        .get(&id)
        .map_or(0, |c| c.load(Ordering::Relaxed))
}

/// A directory of this test's own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!(
            "tierlimit-{test}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Dir(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("tierlimit.toml")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the file the way editors do: a new file renamed over the old one.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write config");
    std::fs::rename(&tmp, path).expect("rename config");
}

fn file(url: &str, name: &str, login: &str, extra: &str) -> String {
    format!(
        r#"
[redis]
url = "{url}"
deadline = "50ms"

[limiter]
name = "{name}"
instances = 1
default_policy = "fail-closed"
{extra}

[rule_sets.login]
rules = ["{login}"]

[rule_sets.api]
policy = "local-fallback"
rules = ["100/min"]
"#
    )
}

async fn admitted(limiter: &HybridLimiter, key: &str, tries: usize) -> usize {
    let mut n = 0;
    for _ in 0..tries {
        let d = limiter
            .check_by_name("login", key, 1)
            .await
            .expect("valid input");
        n += usize::from(d.allowed);
    }
    n
}

/// A server, and a limiter built from a file of `name` (login 5/h) in a
/// directory of its own.
async fn from_file(name: &str) -> (RedisServer, Dir, HybridLimiter) {
    let server = RedisServer::start();
    let dir = Dir::new(name);
    write(&dir.file(), &file(&server.url(), name, "5/h", ""));
    let limiter = healthy(&Config::load(dir.file()).expect("valid file")).await;
    (server, dir, limiter)
}

async fn healthy(config: &Config) -> HybridLimiter {
    counters();
    let limiter = HybridLimiter::from_config(config).expect("a loaded config builds");
    assert!(
        limiter.wait_closed(Duration::from_secs(5)).await,
        "the limiter did not reach Redis within 5 s"
    );
    limiter
}

/// Polls `cond` every 5 ms; false after `timeout`.
#[cfg(feature = "watch")]
async fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

fn login_limit(limiter: &HybridLimiter) -> Option<u64> {
    limiter.rule_set("login").map(|s| s.rules()[0].limit())
}

#[tokio::test]
async fn a_reloaded_file_swaps_the_sets_and_a_raised_limit_keeps_its_usage() {
    let (server, dir, limiter) = from_file("reload").await;
    assert_eq!(
        limiter
            .rule_sets()
            .iter()
            .map(|s| s.name().to_owned())
            .collect::<Vec<_>>(),
        ["api", "login"]
    );
    assert_eq!(admitted(&limiter, "u", 10).await, 5);

    write(&dir.file(), &file(&server.url(), "reload", "8/h", ""));
    let report = limiter.reload_file(dir.file()).expect("valid file");
    assert_eq!(report.changed, ["login"]);
    assert!(report.added.is_empty() && report.removed.is_empty());
    assert!(report.needs_restart.is_empty(), "{report:?}");
    assert_eq!(login_limit(&limiter), Some(8));
    // 5 of 8 used already: 3 more, not a fresh 8.
    assert_eq!(admitted(&limiter, "u", 10).await, 3);
    assert_eq!(reloads("reload", "applied"), 1);
}

#[tokio::test]
async fn a_file_that_does_not_load_keeps_the_config_in_force_and_is_counted() {
    let (server, dir, limiter) = from_file("bad").await;
    assert_eq!(admitted(&limiter, "u", 3).await, 3);

    write(&dir.file(), &file(&server.url(), "bad", "0/h", ""));
    let err = limiter
        .reload_file(dir.file())
        .expect_err("a limit of 0 does not load");
    assert!(
        err.problems()
            .iter()
            .any(|p| p.path().starts_with("rule_sets.login.rules[0]")),
        "{err}"
    );
    assert_eq!(reloads("bad", "rejected"), 1);
    assert_eq!(reloads("bad", "applied"), 0);
    // The old sets still decide, with their usage.
    assert_eq!(login_limit(&limiter), Some(5));
    assert_eq!(admitted(&limiter, "u", 5).await, 2);

    std::fs::remove_file(dir.file()).expect("remove");
    let err = limiter.reload_file(dir.file()).expect_err("no file");
    assert!(err.to_string().contains("cannot read"), "{err}");
    assert_eq!(reloads("bad", "rejected"), 2);
    assert_eq!(login_limit(&limiter), Some(5));
}

#[tokio::test]
async fn the_default_policy_reloads_into_sets_without_their_own() {
    let server = RedisServer::start();
    let text = file(&server.url(), "policy", "5/h", "");
    let limiter = healthy(&Config::from_toml_str(&text).expect("valid")).await;
    let policy = |name: &str| limiter.rule_set(name).and_then(|s| s.policy());
    assert_eq!(policy("login"), Some(Policy::FailClosed));
    assert_eq!(policy("api"), Some(Policy::LocalFallback));

    let text = text.replace(
        "default_policy = \"fail-closed\"",
        "default_policy = \"fail-open\"",
    );
    let report = limiter
        .reload(&Config::from_toml_str(&text).expect("valid"))
        .expect("reload");
    assert_eq!(report.changed, ["login"]);
    assert!(report.needs_restart.is_empty(), "{report:?}");
    assert_eq!(policy("login"), Some(Policy::FailOpen));
    assert_eq!(
        policy("api"),
        Some(Policy::LocalFallback),
        "its own policy stays"
    );

    // A default removed from the file is the library's again, not the one
    // the limiter was built with.
    let text = text.replace("default_policy = \"fail-open\"", "");
    let report = limiter
        .reload(&Config::from_toml_str(&text).expect("valid"))
        .expect("reload");
    assert_eq!(report.changed, ["login"]);
    assert_eq!(policy("login"), Some(Policy::LocalFallback));
}

/// The reloaded default answers for the sets a caller builds that name no
/// policy too, not only for the file's: such a set (here the file's own,
/// taken from the config as loaded) was still answered by the default the
/// limiter was built with, though the reload said nothing needed a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_default_policy_answers_sets_without_their_own() {
    let server = RedisServer::start();
    let text = file(&server.url(), "own", "5/h", "");
    let limiter = healthy(&Config::from_toml_str(&text).expect("valid")).await;
    let text = text.replace(
        "default_policy = \"fail-closed\"",
        "default_policy = \"fail-open\"",
    );
    let config = Config::from_toml_str(&text).expect("valid");
    let report = limiter.reload(&config).expect("reload");
    assert!(report.needs_restart.is_empty(), "{report:?}");
    let own = config.rule_set("login").expect("in the file").clone();
    assert_eq!(own.policy(), None);
    server.pause();
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while limiter.breaker_state() == tierlimit::BreakerState::Closed {
        assert!(
            std::time::Instant::now() < end,
            "the breaker did not trip in 5 s"
        );
        let _ = limiter.check("trip", &own, 1).await;
    }
    let d = limiter.check("u", &own, 1).await.expect("a valid check");
    server.resume();
    assert_eq!(d.tier, tierlimit::Tier::FailOpen, "{d:?}");
}

/// A start-only setting written out at its default is no change from the
/// same setting left out: each was compared as written, so a file that
/// spelled out `group = "default"` (or the default batch size, a learned
/// instance count, the default overflow policy, a name that is the group's)
/// asked for a restart at every reload, and the warning said settings
/// changed that had not.
#[tokio::test]
async fn a_default_written_out_is_no_start_only_change() {
    let server = RedisServer::start();
    // Neither instances nor a name (the group's, then) in the file built from.
    let text = file(&server.url(), "defaults", "5/h", "")
        .replace("instances = 1\n", "")
        .replace("name = \"defaults\"\n", "");
    let limiter = healthy(&Config::from_toml_str(&text).expect("valid")).await;
    let spelled = text
        .replace(
            "deadline = \"50ms\"",
            "deadline = \"50ms\"\nclient_time = false\nmax_batch = 32",
        )
        .replace(
            "default_policy",
            "name = \"default\"\ngroup = \"default\"\ninstances = \"learned\"\noverflow_policy = \"fail-closed\"\nheartbeat_every = \"1s\"\ndefault_policy",
        );
    let config = Config::from_toml_str(&spelled).expect("valid");
    let report = limiter.reload(&config).expect("reload");
    assert!(report.needs_restart.is_empty(), "{report:?}");
}

/// A config reload sets the default policy to the file's, or to the
/// default when the file has none, whatever the limiter was built with; the
/// report says so when that changes it (it was silent: a limiter built with
/// `FailClosed` for its unnamed sets, reloaded from a file without
/// `default_policy`, went `LocalFallback`, and nothing told).
#[tokio::test]
async fn a_reload_that_changes_the_default_policy_says_so() {
    let server = RedisServer::start();
    let limiter = HybridLimiter::builder()
        .redis_url(server.url())
        .default_policy(Policy::FailClosed)
        .build()
        .expect("valid");
    let text =
        file(&server.url(), "policy", "5/h", "").replace("default_policy = \"fail-closed\"\n", "");
    let config = Config::from_toml_str(&text).expect("valid");
    let report = limiter.reload(&config).expect("reload");
    assert_eq!(
        report.default_policy,
        Some((Policy::FailClosed, Policy::LocalFallback)),
        "{report:?}"
    );
    assert!(!report.is_empty());
    let again = limiter.reload(&config).expect("reload");
    assert_eq!(
        again.default_policy, None,
        "unchanged the second time: {again:?}"
    );
}

#[tokio::test]
async fn start_only_settings_are_named_and_kept() {
    let server = RedisServer::start();
    let text = file(&server.url(), "restart", "5/h", "");
    let limiter = healthy(&Config::from_toml_str(&text).expect("valid")).await;
    let changed = text
        .replace("deadline = \"50ms\"", "deadline = \"80ms\"")
        .replace("instances = 1", "instances = 2")
        .replace("\"5/h\"", "\"6/h\"");
    let report = limiter
        .reload(&Config::from_toml_str(&changed).expect("valid"))
        .expect("reload");
    assert_eq!(
        report.needs_restart,
        ["redis.deadline", "limiter.instances"]
    );
    assert_eq!(
        report.changed,
        ["login"],
        "the rule sets are applied all the same"
    );
    // Reloading the same file again: the running limiter still has the
    // values it was built with, so the file still disagrees with them.
    let again = limiter
        .reload(&Config::from_toml_str(&changed).expect("valid"))
        .expect("reload");
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(again.needs_restart, ["redis.deadline", "limiter.instances"]);
    assert_eq!(limiter.instances(), Some(1), "kept until a restart");
    // Back to the values in force (the new limit kept): nothing needs a restart.
    let back = text.replace("\"5/h\"", "\"6/h\"");
    let back = limiter
        .reload(&Config::from_toml_str(&back).expect("valid"))
        .expect("reload");
    assert!(back.is_empty() && back.needs_restart.is_empty(), "{back:?}");
}

#[cfg(feature = "watch")]
#[tokio::test]
async fn a_watched_file_reloads_on_change_and_a_bad_one_is_kept_out() {
    let (server, dir, limiter) = from_file("watch").await;
    let _watch = limiter
        .watch_config(dir.file(), Duration::from_millis(50))
        .expect("watch the file's directory");

    write(&dir.file(), &file(&server.url(), "watch", "7/h", ""));
    assert!(
        eventually(Duration::from_secs(10), || login_limit(&limiter) == Some(7)).await,
        "the changed file was not applied within 10 s"
    );
    assert_eq!(reloads("watch", "applied"), 1);

    write(&dir.file(), "[redis\nurl =");
    assert!(
        eventually(Duration::from_secs(10), || reloads("watch", "rejected")
            == 1)
        .await,
        "the bad file was not seen within 10 s"
    );
    assert_eq!(
        login_limit(&limiter),
        Some(7),
        "the bad file changed nothing"
    );

    write(&dir.file(), &file(&server.url(), "watch", "9/h", ""));
    assert!(
        eventually(Duration::from_secs(10), || login_limit(&limiter) == Some(9)).await,
        "the fixed file was not applied within 10 s"
    );
    // Several quick writes: one reload once they are quiet (debounced).
    let applied = reloads("watch", "applied");
    for limit in [10, 11, 12] {
        write(
            &dir.file(),
            &file(&server.url(), "watch", &format!("{limit}/h"), ""),
        );
    }
    assert!(
        eventually(Duration::from_secs(10), || login_limit(&limiter)
            == Some(12))
        .await,
        "the last of three writes was not applied within 10 s"
    );
    assert!(
        reloads("watch", "applied") - applied <= 2,
        "three writes within the debounce made {} reloads",
        reloads("watch", "applied") - applied
    );
}

#[test]
fn the_readme_config_file_loads() {
    let readme = include_str!("../../../README.md");
    let start = readme.find("```toml\n").expect("README has a TOML example") + 8;
    let end = start + readme[start..].find("```").expect("closed block");
    let config = Config::from_toml_str(&readme[start..end]).expect("the README's file loads");
    let names: Vec<&str> = config.rule_sets().iter().map(|s| s.name()).collect();
    assert_eq!(names, ["login", "api"]);
    assert_eq!(config.rule_sets()[1].rules()[1].burst(), Some(20));
}

/// A bad file is rejected once, not at every wake of the watcher until it
/// is fixed: the watcher's own reads of it woke the watcher again (and so
/// did anything else happening in the directory), and each wake rejected
/// and counted it anew.
#[cfg(feature = "watch")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_bad_file_is_rejected_once() {
    let (server, dir, limiter) = from_file("watch-bad").await;
    let _watch = limiter
        .watch_config(dir.file(), Duration::from_millis(20))
        .expect("watch the file's directory");
    write(&dir.file(), "[redis\nurl =");
    assert!(
        eventually(Duration::from_secs(10), || reloads("watch-bad", "rejected")
            >= 1)
        .await,
        "the bad file was not seen within 10 s"
    );
    // Another file is written beside it, and both are read, five times,
    // each time long enough for the watcher to act (what must not happen
    // has no sign to wait for); then the fix.
    let other = dir.0.join("other.txt");
    for i in 0..5 {
        std::fs::write(&other, format!("{i}")).expect("write another file");
        let _ = std::fs::read(&other);
        let _ = std::fs::read(dir.file());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    write(&dir.file(), &file(&server.url(), "watch-bad", "9/h", ""));
    assert!(
        eventually(Duration::from_secs(10), || login_limit(&limiter) == Some(9)).await,
        "the fixed file was not applied within 10 s"
    );
    assert_eq!(
        reloads("watch-bad", "rejected"),
        1,
        "one bad file, rejected again and again"
    );
}

/// A file beside the config that is written more often than the debounce
/// (a log, say) does not keep the config from reloading: any event in the
/// directory restarted the quiet period, so the reload never ran.
#[cfg(feature = "watch")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_neighbour_does_not_hold_a_reload_back() {
    let (server, dir, limiter) = from_file("watch-busy").await;
    let _watch = limiter
        .watch_config(dir.file(), Duration::from_millis(100))
        .expect("watch the file's directory");
    let log = dir.0.join("app.log");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut line = 0u64;
            while !stop.load(Ordering::Relaxed) {
                line += 1;
                std::fs::write(&log, format!("line {line}\n")).expect("write the log");
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    write(&dir.file(), &file(&server.url(), "watch-busy", "7/h", ""));
    let applied = eventually(Duration::from_secs(5), || login_limit(&limiter) == Some(7)).await;
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the log writer");
    assert!(
        applied,
        "a log written every 10 ms held the reload back for 5 s"
    );
}

/// A file changed between loading it and watching it is applied when the
/// watch starts: the watcher took the file as it then was for the config in
/// force, and applied the change only if the file changed again.
#[cfg(feature = "watch")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_before_the_watch_is_applied_when_it_starts() {
    let (server, dir, limiter) = from_file("watch-late").await;
    write(&dir.file(), &file(&server.url(), "watch-late", "7/h", ""));
    let _watch = limiter
        .watch_config(dir.file(), Duration::from_millis(20))
        .expect("watch the file's directory");
    assert!(
        eventually(Duration::from_secs(10), || login_limit(&limiter) == Some(7)).await,
        "a change made before the watch was not applied within 10 s"
    );
    assert_eq!(reloads("watch-late", "applied"), 1);
}

/// A debounce the watcher could not add to the clock is refused when the
/// watch starts: `Duration::MAX` was taken, and the first change panicked
/// the watcher's task, which reloaded nothing ever after.
#[cfg(feature = "watch")]
#[tokio::test]
async fn a_watch_whose_debounce_is_too_long_is_refused() {
    let (_server, dir, limiter) = from_file("watch-long").await;
    for debounce in [Duration::MAX, Duration::from_secs(86_401)] {
        let e = limiter
            .watch_config(dir.file(), debounce)
            .expect_err("an unbounded debounce");
        assert!(e.to_string().contains("debounce"), "{e}");
    }
    limiter
        .watch_config(dir.file(), Duration::from_secs(86_400))
        .expect("a day's debounce");
}

/// A file removed is rejected once, not again at every event in its
/// directory while it stays away: a missing file's bytes were never
/// remembered, so each wake read "nothing", rejected and counted it anew.
/// Put back, it is applied.
#[cfg(feature = "watch")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_file_is_rejected_once() {
    let (server, dir, limiter) = from_file("watch-gone").await;
    let _watch = limiter
        .watch_config(dir.file(), Duration::from_millis(20))
        .expect("watch the file's directory");
    std::fs::remove_file(dir.file()).expect("remove the file");
    assert!(
        eventually(Duration::from_secs(10), || reloads(
            "watch-gone",
            "rejected"
        ) >= 1)
        .await,
        "the removed file was not seen within 10 s"
    );
    // Files made and removed beside it (each an event the watcher must
    // look at), each time long enough for the watcher to act (what must
    // not happen has no sign to wait for); then the file comes back.
    for i in 0..5 {
        let other = dir.0.join(format!("other-{i}.txt"));
        std::fs::write(&other, "x").expect("write another file");
        std::fs::remove_file(&other).expect("remove it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    write(&dir.file(), &file(&server.url(), "watch-gone", "9/h", ""));
    assert!(
        eventually(Duration::from_secs(10), || login_limit(&limiter) == Some(9)).await,
        "the file put back was not applied within 10 s"
    );
    assert_eq!(login_limit(&limiter), Some(9));
    assert_eq!(
        reloads("watch-gone", "rejected"),
        1,
        "one removal, rejected again and again"
    );
}
