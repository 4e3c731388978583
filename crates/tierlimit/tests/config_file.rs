//! The TOML config file (issue 13): every documented field reaches the
//! limiter's builder or its rule set, and every malformed file is refused
//! with its specific problem at its field path.
//!
//! How a field is seen to arrive: the builder's `Debug` (it prints every
//! setting, credentials and keys redacted) of `Config::builder()` is compared
//! with the `Debug` of a builder set by hand to the same value, and must
//! differ from a default builder's. Rule sets are compared with sets built in
//! code (`RuleSet: PartialEq` compares name, rules, policy and reconcile). The
//! Redis URL's credentials and the TLS CA, which `Debug` hides, are proved by
//! checks decided by a real TLS Redis as an ACL user. Every config that loads
//! here is also built into a limiter inside a Tokio runtime (build does no
//! I/O).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tierlimit::{
    Algorithm, BreakerConfig, Config, ConfigError, HybridLimiter, HybridLimiterBuilder, Instances,
    LocalConfig, Policy, ReconcileConfig, Rule, RuleSet, Tier,
};
use tierlimit_test::RedisServer;

const URL: &str = "redis://127.0.0.1:6379/";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A file with `[redis] url` and `extra` appended.
fn with_url(extra: &str) -> String {
    format!("[redis]\nurl = \"{URL}\"\n{extra}")
}

/// Loads `text`, failing the test with every problem when it does not load,
/// and proves it builds.
fn load(text: &str) -> Config {
    match Config::from_toml_str(text) {
        Ok(config) => {
            builds(&config);
            config
        }
        Err(e) => panic!("should load:\n{text}\n--- problems:\n{e}"),
    }
}

/// A config that loads builds: `build()` (no I/O) inside a runtime.
fn builds(config: &Config) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        if let Err(e) = config.builder().build() {
            panic!("a loaded config must build: {e}\n{config:?}");
        }
    });
}

fn problems(text: &str) -> ConfigError {
    match Config::from_toml_str(text) {
        Ok(config) => panic!("should be refused:\n{text}\n--- loaded as {config:?}"),
        Err(e) => e,
    }
}

/// Asserts `text` is refused with exactly one problem, at `path`, whose
/// message contains `says`; returns the problem's line.
fn refused(text: &str, path: &str, says: &str) -> Option<usize> {
    let e = problems(text);
    assert_eq!(
        e.problems().len(),
        1,
        "one problem expected for\n{text}\n--- got:\n{e}"
    );
    let p = &e.problems()[0];
    assert_eq!(p.path(), path, "{e}");
    assert!(
        p.message().contains(says),
        "{path}: {:?} should say {says:?}",
        p.message()
    );
    p.line()
}

fn debug(b: HybridLimiterBuilder) -> String {
    format!("{b:?}")
}

fn default_builder() -> HybridLimiterBuilder {
    HybridLimiter::builder().redis_url(URL)
}

// ---------------------------------------------------------------------------
// Every field reaches the builder.

type Setter = fn(HybridLimiterBuilder) -> HybridLimiterBuilder;

fn breaker(f: fn(&mut BreakerConfig)) -> BreakerConfig {
    let mut c = BreakerConfig::default();
    f(&mut c);
    c
}

fn reconcile(f: fn(&mut ReconcileConfig)) -> ReconcileConfig {
    let mut c = ReconcileConfig::default();
    f(&mut c);
    c
}

/// (section, line, the same setting made by hand).
fn every_setting() -> Vec<(&'static str, &'static str, Setter)> {
    vec![
        ("redis", "deadline = \"75ms\"", |b| b.deadline(ms(75))),
        ("redis", "client_time = true", |b| b.client_time(true)),
        ("redis", "max_batch = 8", |b| b.max_batch(8)),
        ("limiter", "name = \"api-1\"", |b| b.name("api-1")),
        ("limiter", "group = \"payments\"", |b| b.group("payments")),
        ("limiter", "default_policy = \"fail-open\"", |b| {
            b.default_policy(Policy::FailOpen)
        }),
        ("limiter", "default_policy = \"fail-closed\"", |b| {
            b.default_policy(Policy::FailClosed)
        }),
        ("limiter", "overflow_policy = \"fail-open\"", |b| {
            b.overflow_policy(Policy::FailOpen)
        }),
        ("limiter", "instances = 3", |b| {
            b.instances(Instances::Fixed(3))
        }),
        (
            "limiter",
            "instances = \"learned\"\nassume_instances = 4",
            |b| b.instances(Instances::Learned { assume: Some(4) }),
        ),
        ("limiter", "assume_instances = 2", |b| {
            b.instances(Instances::Learned { assume: Some(2) })
        }),
        ("limiter", "heartbeat_every = \"250ms\"", |b| {
            b.heartbeat_every(ms(250))
        }),
        ("limiter", "instance_ttl = \"1m\"", |b| {
            b.instance_ttl(secs(60))
        }),
        ("limiter", "prune_every = \"2s\"", |b| {
            b.prune_every(secs(2))
        }),
        ("breaker", "consecutive_failures = 7", |b| {
            b.breaker(breaker(|c| c.consecutive_failures = 7))
        }),
        ("breaker", "window_size = 100", |b| {
            b.breaker(breaker(|c| c.window_size = 100))
        }),
        ("breaker", "minimum_calls = 10", |b| {
            b.breaker(breaker(|c| c.minimum_calls = 10))
        }),
        ("breaker", "failure_rate_threshold = 0.25", |b| {
            b.breaker(breaker(|c| c.failure_rate_threshold = 0.25))
        }),
        ("breaker", "slow_call_threshold = \"30ms\"", |b| {
            b.breaker(breaker(|c| c.slow_call_threshold = ms(30)))
        }),
        ("breaker", "slow_call_rate_threshold = 1", |b| {
            b.breaker(breaker(|c| c.slow_call_rate_threshold = 1.0))
        }),
        ("breaker", "cool_down = \"100ms\"", |b| {
            b.breaker(breaker(|c| c.cool_down = ms(100)))
        }),
        ("breaker", "max_cool_down = \"10s\"", |b| {
            b.breaker(breaker(|c| c.max_cool_down = secs(10)))
        }),
        ("breaker", "backoff_multiplier = 1.5", |b| {
            b.breaker(breaker(|c| c.backoff_multiplier = 1.5))
        }),
        ("breaker", "jitter = 0.0", |b| {
            b.breaker(breaker(|c| c.jitter = 0.0))
        }),
        ("breaker", "replace_connection_after = 9", |b| {
            b.breaker(breaker(|c| c.replace_connection_after = 9))
        }),
        ("local", "max_keys = 5000", |b| {
            b.local(LocalConfig {
                max_keys: 5000,
                ..LocalConfig::default()
            })
        }),
        ("local", "max_denials = 6000", |b| {
            b.local(LocalConfig {
                max_denials: 6000,
                ..LocalConfig::default()
            })
        }),
        ("local", "max_warm_keys = 7000", |b| {
            b.local(LocalConfig {
                max_warm_keys: 7000,
                ..LocalConfig::default()
            })
        }),
        ("local", "max_ledger_entries = 8000", |b| {
            b.local(LocalConfig {
                max_ledger_entries: 8000,
                ..LocalConfig::default()
            })
        }),
        ("local", "max_bytes = 16_777_216", |b| {
            b.local(LocalConfig {
                max_bytes: 16 << 20,
                ..LocalConfig::default()
            })
        }),
        ("reconcile", "batch_size = 32", |b| {
            b.reconcile(reconcile(|c| c.batch_size = 32))
        }),
        ("reconcile", "duty_cycle = 0.25", |b| {
            b.reconcile(reconcile(|c| c.duty_cycle = 0.25))
        }),
        ("reconcile", "idle_poll = \"250ms\"", |b| {
            b.reconcile(reconcile(|c| c.idle_poll = ms(250)))
        }),
    ]
}

#[test]
fn every_setting_reaches_the_builder() {
    let default = debug(default_builder());
    for (section, line, by_hand) in every_setting() {
        let text = if section == "redis" {
            with_url(line)
        } else {
            with_url(&format!("[{section}]\n{line}\n"))
        };
        let config = load(&text);
        let from_file = debug(config.builder());
        assert_eq!(
            from_file,
            debug(by_hand(default_builder())),
            "{section}: {line}"
        );
        assert_ne!(from_file, default, "{section}: {line} changed nothing");
    }
}

#[test]
fn every_setting_at_once_reaches_the_builder() {
    // All the settings in one file: none overrides another.
    let text = with_url(
        r#"deadline = "75ms"
client_time = true
max_batch = 8
[limiter]
name = "api-1"
group = "payments"
default_policy = "fail-closed"
overflow_policy = "fail-open"
instances = "learned"
assume_instances = 4
heartbeat_every = "250ms"
instance_ttl = "1m"
prune_every = "2s"
[breaker]
consecutive_failures = 7
window_size = 100
minimum_calls = 10
failure_rate_threshold = 0.25
slow_call_threshold = "30ms"
slow_call_rate_threshold = 1
cool_down = "100ms"
max_cool_down = "10s"
backoff_multiplier = 1.5
jitter = 0.0
replace_connection_after = 9
[local]
max_keys = 5000
max_denials = 6000
max_warm_keys = 7000
max_ledger_entries = 8000
max_bytes = 16_777_216
[reconcile]
batch_size = 32
duty_cycle = 0.25
idle_poll = "250ms"
"#,
    );
    let mut breaker = BreakerConfig::default();
    breaker.consecutive_failures = 7;
    breaker.window_size = 100;
    breaker.minimum_calls = 10;
    breaker.failure_rate_threshold = 0.25;
    breaker.slow_call_threshold = ms(30);
    breaker.slow_call_rate_threshold = 1.0;
    breaker.cool_down = ms(100);
    breaker.max_cool_down = secs(10);
    breaker.backoff_multiplier = 1.5;
    breaker.jitter = 0.0;
    breaker.replace_connection_after = 9;
    let mut reconcile = ReconcileConfig::default();
    reconcile.batch_size = 32;
    reconcile.duty_cycle = 0.25;
    reconcile.idle_poll = ms(250);
    let by_hand = default_builder()
        .deadline(ms(75))
        .client_time(true)
        .max_batch(8)
        .name("api-1")
        .group("payments")
        .default_policy(Policy::FailClosed)
        .overflow_policy(Policy::FailOpen)
        .instances(Instances::Learned { assume: Some(4) })
        .heartbeat_every(ms(250))
        .instance_ttl(secs(60))
        .prune_every(secs(2))
        .breaker(breaker)
        .local(LocalConfig {
            max_keys: 5000,
            max_denials: 6000,
            max_warm_keys: 7000,
            max_ledger_entries: 8000,
            max_bytes: 16 << 20,
        })
        .reconcile(reconcile);
    let config = load(&text);
    assert_eq!(debug(config.builder()), debug(by_hand));
}

#[test]
fn learned_instances_without_an_assumption_is_the_default() {
    let config = load(&with_url("[limiter]\ninstances = \"learned\"\n"));
    assert_eq!(
        debug(config.builder()),
        debug(default_builder().instances(Instances::Learned { assume: None }))
    );
}

#[test]
fn snake_case_names_work_as_well_as_kebab_case() {
    let config = load(&with_url(
        "[limiter]\ndefault_policy = \"local_fallback\"\noverflow_policy = \"fail_closed\"\n\
         [rule_sets.a]\nrules = [{ rate = \"10/s\", algorithm = \"token_bucket\" }]\n",
    ));
    assert_eq!(
        debug(config.builder()),
        debug(
            default_builder()
                .default_policy(Policy::LocalFallback)
                .overflow_policy(Policy::FailClosed)
        )
    );
    assert_eq!(
        config.rule_sets()[0].rules()[0].algorithm(),
        Algorithm::TokenBucket
    );
}

#[test]
fn the_builder_can_be_taken_twice() {
    let config = load(&with_url("[limiter]\nname = \"twice\"\n"));
    assert_eq!(debug(config.builder()), debug(config.builder()));
}

// ---------------------------------------------------------------------------
// Rule sets and rules.

fn rule(r: tierlimit::Result<Rule>) -> Rule {
    r.expect("a valid rule")
}

#[test]
fn every_rule_form_reaches_its_rule_set() {
    let config = load(&with_url(
        r#"
[rule_sets.login]
policy = "fail-closed"
reconcile = false
rules = [
    "10/s",
    "100/min",
    "20/30s",
    "1000/day@+08:00",
    "100/hour@-05:00",
    { limit = 100, per = "1m", algorithm = "token-bucket", burst = 20 },
    { rate = "600/h", algorithm = "sliding-window" },
    { limit = 50, per = "1s", algorithm = "sliding-log" },
    { limit = 5, per = "2s", algorithm = "fixed-window" },
    { limit = 7, per = "10s", algorithm = "gcra", burst = 3 },
    { limit = 10000, per = "1d", utc_offset = "+05:30" },
    { rate = "40/h", utc_offset = "UTC", algorithm = "fixed-window" },
]
"#,
    ));
    let expected = RuleSet::new(
        "login",
        [
            rule(Rule::per_second(10)),
            rule(Rule::per_minute(100)),
            rule(Rule::with_period(20, secs(30))),
            rule(Rule::per_natural_day(1000, 8 * 3600)),
            rule(Rule::per_natural_hour(100, -5 * 3600)),
            rule(Rule::per_minute(100).and_then(|r| {
                r.with_algorithm(Algorithm::TokenBucket)
                    .and_then(|r| r.with_burst(20))
            })),
            rule(Rule::per_hour(600).and_then(|r| r.with_algorithm(Algorithm::SlidingWindow))),
            rule(Rule::per_second(50).and_then(|r| r.with_algorithm(Algorithm::SlidingLog))),
            rule(
                Rule::with_period(5, secs(2))
                    .and_then(|r| r.with_algorithm(Algorithm::FixedWindow)),
            ),
            rule(Rule::with_period(7, secs(10)).and_then(|r| r.with_burst(3))),
            rule(Rule::per_natural_day(10_000, 5 * 3600 + 1800)),
            rule(Rule::per_natural_hour(40, 0)),
        ],
    )
    .expect("a valid set")
    .with_policy(Policy::FailClosed)
    .with_reconcile(false);
    assert_eq!(config.rule_sets(), std::slice::from_ref(&expected));
    assert_eq!(config.rule_set("login"), Some(&expected));
    assert_eq!(config.rule_set("nope"), None);
}

#[test]
fn rule_sets_come_in_file_order_with_their_own_settings() {
    let config = load(&with_url(
        r#"
[rule_sets.zeta]
rules = ["1/s"]
[rule_sets.alpha]
policy = "fail-open"
rules = ["2/s"]
[rule_sets."api.v1"]
reconcile = true
policy = "local-fallback"
rules = ["3/s"]
"#,
    ));
    let names: Vec<&str> = config.rule_sets().iter().map(RuleSet::name).collect();
    assert_eq!(names, ["zeta", "alpha", "api.v1"]);
    let [zeta, alpha, api] = config.rule_sets() else {
        panic!("three sets")
    };
    // No policy in the file: None, so the limiter's default applies at check time.
    assert_eq!(zeta.policy(), None);
    assert_eq!(alpha.policy(), Some(Policy::FailOpen));
    assert_eq!(api.policy(), Some(Policy::LocalFallback));
    let plain = RuleSet::new("zeta", [rule(Rule::per_second(1))]).expect("valid");
    assert_eq!(zeta, &plain, "no reconcile key: the set's own default");
    let reconciling = RuleSet::new("api.v1", [rule(Rule::per_second(3))])
        .expect("valid")
        .with_policy(Policy::LocalFallback)
        .with_reconcile(true);
    assert_eq!(api, &reconciling);
}

#[test]
fn a_file_without_rule_sets_loads() {
    let config = load(&with_url(""));
    assert!(config.rule_sets().is_empty());
    assert_eq!(debug(config.builder()), debug(default_builder()));
}

#[test]
fn the_example_file_loads_and_builds() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tierlimit.toml");
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()));
    builds(&config);
    let names: Vec<&str> = config.rule_sets().iter().map(RuleSet::name).collect();
    assert_eq!(names, ["login", "api"]);
    assert_eq!(config.rule_set("api").map(RuleSet::stripes), Some(4));
    let login = config.rule_set("login").expect("login");
    assert_eq!(login.stripes(), 1);
    assert_eq!(login.policy(), Some(Policy::FailClosed));
    assert_eq!(login.rules().len(), 4);
    assert_eq!(
        login.rules()[2],
        rule(Rule::per_natural_day(1000, 8 * 3600))
    );
    let shown = format!("{config:?}");
    assert!(!shown.contains("secret"), "the password is hidden: {shown}");
    assert!(shown.contains("redis://***@127.0.0.1:6379/0"), "{shown}");
    let b = debug(config.builder());
    assert!(b.contains("name: Some(\"api-1\")"), "{b}");
    assert!(b.contains("Learned { assume: Some(3) }"), "{b}");
}

// ---------------------------------------------------------------------------
// The URL's credentials and TLS, proved by a real server.

/// A self-signed certificate and its key (both PEM) in `dir`, made by the
/// `openssl` CLI as the test harness makes its CA.
fn self_signed(dir: &Path) {
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=tierlimit config test",
            "-keyout",
            "client.key",
            "-out",
            "client.pem",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run openssl ({e}): install it with `sudo apt-get install -y openssl`")
        });
    assert!(
        out.status.success(),
        "openssl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory for one test's files.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tierlimit-config-{name}-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_credentials_and_the_tls_ca_reach_redis() {
    let args = RedisServer::acl_user("app", "s3cret-pw");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = RedisServer::start_tls(&args);
    let dir = temp_dir("tls");
    std::fs::write(
        dir.join("ca.pem"),
        server.tls_ca_pem().expect("a TLS server"),
    )
    .expect("write");
    let file = dir.join("tierlimit.toml");
    std::fs::write(
        &file,
        format!(
            "[redis]\nurl = \"{}\"\ndeadline = \"1s\"\ntls_ca_file = \"ca.pem\"\n\
             [limiter]\ninstances = 1\n\
             [rule_sets.tls]\npolicy = \"fail-closed\"\nrules = [\"100/min\"]\n",
            server.url_as("app", "s3cret-pw")
        ),
    )
    .expect("write");
    // Loaded from another directory: the CA path is relative to the file.
    let config = Config::load(&file).unwrap_or_else(|e| panic!("{e}"));
    assert!(!format!("{config:?}").contains("s3cret-pw"));
    let limiter = config.builder().build().expect("builds");
    let set = config.rule_set("tls").expect("the set");
    // Decided by Redis: the URL's user and password logged in, and the
    // server's certificate was verified against the file's CA. Polled: the
    // first connection (TLS handshake included) may pass a deadline on a
    // busy machine, and then the breaker needs a probe.
    let started = std::time::Instant::now();
    let decision = loop {
        let decision = limiter.check("user:1", set, 1).await.expect("valid check");
        if decision.tier == Tier::Redis || started.elapsed() > secs(15) {
            break decision;
        }
        tokio::time::sleep(ms(20)).await;
    };
    assert_eq!(decision.tier, Tier::Redis, "{decision:?}");
    assert!(decision.allowed);
    drop(limiter);

    // The same file with a wrong password: the login fails, so Redis never
    // decides (the credentials really come from the file's URL).
    let wrong = std::fs::read_to_string(&file)
        .expect("read")
        .replace("s3cret-pw", "wrong-pw");
    std::fs::write(&file, wrong).expect("write");
    let config = Config::load(&file).unwrap_or_else(|e| panic!("{e}"));
    let limiter = config.builder().build().expect("builds");
    let set = config.rule_set("tls").expect("the set");
    for _ in 0..3 {
        let decision = limiter.check("user:1", set, 1).await.expect("valid check");
        assert_eq!(decision.tier, Tier::FailClosed, "{decision:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_client_certificate_files_are_read_relative_to_the_file() {
    let dir = temp_dir("mtls");
    self_signed(&dir);
    let file = dir.join("tierlimit.toml");
    std::fs::write(
        &file,
        "[redis]\nurl = \"rediss://127.0.0.1:6380/\"\ntls_ca_file = \"client.pem\"\n\
         tls_client_cert_file = \"client.pem\"\ntls_client_key_file = \"client.key\"\n",
    )
    .expect("write");
    let config = Config::load(&file).unwrap_or_else(|e| panic!("{e}"));
    builds(&config);
    let ca = std::fs::read(dir.join("client.pem")).expect("read");
    let key = std::fs::read(dir.join("client.key")).expect("read");
    let by_hand = HybridLimiter::builder()
        .redis_url("rediss://127.0.0.1:6380/")
        .tls_root_certificates(ca.clone())
        .tls_client_certificate(ca, key);
    assert_eq!(debug(config.builder()), debug(by_hand));
    let shown = debug(config.builder());
    assert!(shown.contains("root_certificates: true"), "{shown}");
    assert!(shown.contains("client_certificate: true"), "{shown}");
    let shown = format!("{config:?}");
    assert!(
        !shown.contains("PRIVATE KEY"),
        "the key stays hidden: {shown}"
    );
    assert!(shown.contains("tls_client: true"), "{shown}");

    // A key file that is not a key is found at load, not at the first call.
    std::fs::write(dir.join("client.key"), "not a key").expect("write");
    let e = Config::load(&file).expect_err("a bad key");
    assert_eq!(e.problems().len(), 1, "{e}");
    assert_eq!(e.problems()[0].path(), "redis.tls_client_cert_file", "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// Malformed files: each one's own problem, at its path.

#[test]
fn missing_redis_url() {
    refused("[limiter]\nname = \"x\"\n", "redis.url", "required");
    refused("[redis]\ndeadline = \"50ms\"\n", "redis.url", "required");
    assert_eq!(refused("", "redis.url", "required: the Redis URL"), None);
}

#[test]
fn unknown_field_is_a_typo() {
    let line = refused(
        &with_url("deadlne = \"50ms\"\n"),
        "redis.deadlne",
        "did you mean \"deadline\"",
    );
    assert_eq!(line, Some(3));
    refused(
        &with_url("[breaker]\ncool_dwn = \"1s\"\n"),
        "breaker.cool_dwn",
        "did you mean \"cool_down\"",
    );
    refused(
        &with_url("[limitter]\nname = \"x\"\n"),
        "limitter",
        "did you mean \"limiter\"",
    );
    refused(
        &with_url("[rule_sets.a]\nrules = [{ limit = 1, per = \"1s\", brust = 2 }]\n"),
        "rule_sets.a.rules[0].brust",
        "did you mean \"burst\"",
    );
    refused(
        &with_url("[rule_sets.a]\nrules = [\"1/s\"]\npolcy = \"fail-open\"\n"),
        "rule_sets.a.polcy",
        "did you mean \"policy\"",
    );
}

#[test]
fn wrong_type() {
    refused(
        &with_url("[breaker]\nwindow_size = \"50\"\n"),
        "breaker.window_size",
        "expected an integer, got a string",
    );
    refused(
        "[redis]\nurl = 6379\n",
        "redis.url",
        "expected a string, got an integer",
    );
    refused(&with_url("max_batch = 0\n"), "redis.max_batch", "1 to 1000");
    refused(
        &with_url("client_time = \"yes\"\n"),
        "redis.client_time",
        "expected a boolean, got a string",
    );
    refused(
        &with_url("[breaker]\njitter = \"0.1\"\n"),
        "breaker.jitter",
        "expected a number, got a string",
    );
    refused(
        &format!("limiter = 5\n{}", with_url("")),
        "limiter",
        "expected a table, got an integer",
    );
    refused(
        &with_url("[rule_sets]\nlogin = [\"10/s\"]\n"),
        "rule_sets.login",
        "expected a table, got an array",
    );
    refused(
        &with_url("[rule_sets.a]\nrules = \"10/s\"\n"),
        "rule_sets.a.rules",
        "expected an array of rules, got a string",
    );
    refused(
        &with_url("[rule_sets.a]\nrules = [10]\n"),
        "rule_sets.a.rules[0]",
        "expected a rule string like \"10/s\" or a table, got an integer",
    );
    refused(
        &with_url("[local]\nmax_keys = -1\n"),
        "local.max_keys",
        "must be at least 0 (got -1)",
    );
    refused(
        &with_url("[breaker]\nwindow_size = 4294967296\n"),
        "breaker.window_size",
        "must be at most 4294967295",
    );
}

#[test]
fn bad_duration() {
    refused(
        &with_url("[limiter]\nheartbeat_every = \"1.5s\"\n"),
        "limiter.heartbeat_every",
        "\"1.5s\" is not a duration: fractions are not allowed",
    );
    refused(
        &with_url("deadline = 50\n"),
        "redis.deadline",
        "a bare number has no unit",
    );
    refused(
        &with_url("[breaker]\ncool_down = \"1 s\"\n"),
        "breaker.cool_down",
        "no spaces",
    );
    refused(
        &with_url("[reconcile]\nidle_poll = \"5 fortnights\"\n"),
        "reconcile.idle_poll",
        "no spaces",
    );
    refused(
        &with_url("[reconcile]\nidle_poll = \"5fortnights\"\n"),
        "reconcile.idle_poll",
        "unknown unit \"fortnights\"",
    );
}

#[test]
fn deadline_zero() {
    refused(
        &with_url("deadline = \"0ms\"\n"),
        "redis.deadline",
        "must be between 1ms and 60s (got 0ns)",
    );
    refused(
        &with_url("deadline = \"2m\"\n"),
        "redis.deadline",
        "must be between 1ms and 60s (got 120s)",
    );
}

#[test]
fn policy_typo() {
    refused(
        &with_url("[limiter]\ndefault_policy = \"fail-opn\"\n"),
        "limiter.default_policy",
        "unknown policy \"fail-opn\": use \"local-fallback\", \"fail-open\" or \"fail-closed\"",
    );
    refused(
        &with_url("[rule_sets.a]\npolicy = \"closed\"\nrules = [\"1/s\"]\n"),
        "rule_sets.a.policy",
        "unknown policy \"closed\"",
    );
    refused(
        &with_url("[limiter]\noverflow_policy = \"local-fallback\"\n"),
        "limiter.overflow_policy",
        "must be \"fail-open\" or \"fail-closed\"",
    );
}

#[test]
fn instances_zero() {
    refused(
        &with_url("[limiter]\ninstances = 0\n"),
        "limiter.instances",
        "must be at least 1",
    );
    refused(
        &with_url("[limiter]\nassume_instances = 0\n"),
        "limiter.assume_instances",
        "must be at least 1",
    );
    refused(
        &with_url("[limiter]\ninstances = \"many\"\n"),
        "limiter.instances",
        "expected \"learned\" or a number of instances",
    );
    refused(
        &with_url("[limiter]\ninstances = 3\nassume_instances = 3\n"),
        "limiter.assume_instances",
        "only with instances = \"learned\"",
    );
}

#[test]
fn limiter_intervals_are_held_to_builds_ranges() {
    refused(
        &with_url("[limiter]\nheartbeat_every = \"5ms\"\n"),
        "limiter.heartbeat_every",
        "must be 10ms to 3600s (got 5ms)",
    );
    refused(
        &with_url("[limiter]\nprune_every = \"2h\"\n"),
        "limiter.prune_every",
        "must be 1ms to 3600s (got 7200s)",
    );
    refused(
        &with_url("[limiter]\nheartbeat_every = \"1s\"\ninstance_ttl = \"1500ms\"\n"),
        "limiter.instance_ttl",
        "must be 2s to 86400s (got 1.5s)",
    );
    // The default TTL (30 s) against a long heartbeat set in the file.
    refused(
        &with_url("[limiter]\nheartbeat_every = \"20s\"\n"),
        "limiter.instance_ttl",
        "(the default, as it is not set here",
    );
    refused(
        &with_url("[limiter]\ngroup = \"a b\"\n"),
        "limiter.group",
        "invalid group \"a b\"",
    );
    refused(
        &with_url("[limiter]\nname = \"\"\n"),
        "limiter.name",
        "must not be empty",
    );
}

#[test]
fn bad_rule_string() {
    refused(
        &with_url("[rule_sets.login]\nrules = [\"10/s\", \"10/fortnight\"]\n"),
        "rule_sets.login.rules[1]",
        "\"10/fortnight\" is not a rule: unknown unit \"fortnight\"",
    );
    refused(
        &with_url("[rule_sets.login]\nrules = [\"0/s\"]\n"),
        "rule_sets.login.rules[0]",
        "\"0/s\": a rule's limit must be at least 1",
    );
    refused(
        &with_url("[rule_sets.login]\nrules = [\"10/s@+25:00\"]\n"),
        "rule_sets.login.rules[0]",
        "hours must be 00 to 23",
    );
    refused(
        &with_url("[rule_sets.login]\nrules = [{ rate = \"10/fortnight\" }]\n"),
        "rule_sets.login.rules[0].rate",
        "unknown unit \"fortnight\"",
    );
}

#[test]
fn limit_zero_in_table_form() {
    let e = problems(&with_url(
        "[rule_sets.login]\nrules = [\"10/s\", { limit = 0, per = \"1m\" }]\n",
    ));
    assert_eq!(e.problems().len(), 1, "{e}");
    let p = &e.problems()[0];
    assert_eq!(p.path(), "rule_sets.login.rules[1].limit");
    assert_eq!(p.message(), "must be at least 1");
    assert_eq!(
        e.to_string(),
        "rule_sets.login.rules[1].limit: must be at least 1 (line 4, column 28)"
    );
    refused(
        &with_url("[rule_sets.login]\nrules = [{ limit = 10 }]\n"),
        "rule_sets.login.rules[0].per",
        "required",
    );
    refused(
        &with_url("[rule_sets.login]\nrules = [{ per = \"1s\" }]\n"),
        "rule_sets.login.rules[0].limit",
        "required",
    );
    refused(
        &with_url("[rule_sets.login]\nrules = [{ rate = \"1/s\", limit = 1, per = \"1s\" }]\n"),
        "rule_sets.login.rules[0].rate",
        "not both",
    );
    refused(
        &with_url("[rule_sets.login]\nrules = [{ limit = 1, per = \"500us\" }]\n"),
        "rule_sets.login.rules[0].per",
        "at least 1 ms",
    );
    refused(
        &with_url("[rule_sets.login]\nrules = [{ limit = 1, per = \"1s\", burst = 0 }]\n"),
        "rule_sets.login.rules[0].burst",
        "must be at least 1",
    );
}

#[test]
fn burst_on_a_window_algorithm() {
    refused(
        &with_url(
            "[rule_sets.login]\nrules = [{ limit = 10, per = \"1m\", algorithm = \"fixed-window\", burst = 5 }]\n",
        ),
        "rule_sets.login.rules[0].burst",
        "\"fixed-window\" has no burst",
    );
    refused(
        &with_url(
            "[rule_sets.login]\nrules = [{ rate = \"10/min\", algorithm = \"sliding-log\", burst = 5 }]\n",
        ),
        "rule_sets.login.rules[0].burst",
        "\"sliding-log\" has no burst",
    );
}

/// A slow-call threshold at or past the deadline would never see a slow
/// call (none ends later than the deadline): refused where it is written,
/// or at the deadline when the threshold is the default.
#[test]
fn a_slow_call_threshold_past_the_deadline_is_refused() {
    let line = refused(
        &with_url("deadline = \"20ms\"\n"),
        "redis.deadline",
        "slow_call_threshold (40ms) must be below the Redis deadline (20ms)",
    );
    assert_eq!(line, Some(3));
    let line = refused(
        &with_url("[breaker]\nslow_call_threshold = \"50ms\"\n"),
        "breaker.slow_call_threshold",
        "must be below the Redis deadline (50ms)",
    );
    assert_eq!(line, Some(4));
    load(&with_url("deadline = \"41ms\"\n"));
}

#[test]
fn other_rule_combinations_name_their_field() {
    refused(
        &with_url(
            "[rule_sets.a]\nrules = [{ limit = 5000, per = \"1m\", algorithm = \"sliding-log\" }]\n",
        ),
        "rule_sets.a.rules[0].limit",
        "a sliding log's limit is at most 1000 (got 5000)",
    );
    refused(
        &with_url(
            "[rule_sets.a]\nrules = [{ limit = 5, per = \"1d\", algorithm = \"gcra\", utc_offset = \"+08:00\" }]\n",
        ),
        "rule_sets.a.rules[0].utc_offset",
        "needs algorithm = \"fixed-window\"",
    );
    refused(
        &with_url(
            "[rule_sets.a]\nrules = [{ rate = \"5/day@+08:00\", algorithm = \"token-bucket\" }]\n",
        ),
        "rule_sets.a.rules[0].algorithm",
        "needs algorithm = \"fixed-window\"",
    );
    // UTC is a calendar window too: an offset of 0 is no reason to drop it.
    refused(
        &with_url("[rule_sets.a]\nrules = [{ rate = \"10/day@UTC\", algorithm = \"gcra\" }]\n"),
        "rule_sets.a.rules[0].algorithm",
        "needs algorithm = \"fixed-window\"",
    );
    refused(
        &with_url(
            "[rule_sets.a]\nrules = [{ limit = 10, per = \"1d\", utc_offset = \"UTC\", algorithm = \"sliding-window\" }]\n",
        ),
        "rule_sets.a.rules[0].utc_offset",
        "needs algorithm = \"fixed-window\"",
    );
    refused(
        &with_url(
            "[rule_sets.a]\nrules = [{ limit = 5, per = \"7h\", utc_offset = \"+08:00\" }]\n",
        ),
        "rule_sets.a.rules[0].per",
        "divides a day evenly",
    );
    refused(
        &with_url(
            "[rule_sets.a]\nrules = [{ limit = 5, per = \"1d\", utc_offset = \"+24:00\" }]\n",
        ),
        "rule_sets.a.rules[0].utc_offset",
        "hours must be 00 to 23",
    );
    refused(
        &with_url(
            "[rule_sets.a]\nrules = [{ rate = \"1000/day@+08:00\", utc_offset = \"+01:00\" }]\n",
        ),
        "rule_sets.a.rules[0].utc_offset",
        "names a UTC offset already",
    );
    refused(
        &with_url("[rule_sets.a]\nrules = [{ limit = 5, per = \"1d\", algorithm = \"leaky\" }]\n"),
        "rule_sets.a.rules[0].algorithm",
        "unknown algorithm \"leaky\"",
    );
}

#[test]
fn duplicate_rules() {
    refused(
        &with_url("[rule_sets.login]\nrules = [\"10/s\", \"100/min\", \"10/s\"]\n"),
        "rule_sets.login.rules[2]",
        "repeats rule_sets.login.rules[0]",
    );
    // Two ways to write one rule are still one rule.
    refused(
        &with_url("[rule_sets.login]\nrules = [\"10/s\", { limit = 10, per = \"1s\" }]\n"),
        "rule_sets.login.rules[1]",
        "repeats rule_sets.login.rules[0]",
    );
    // Two limits over one period and algorithm would share one key (the
    // key names algorithm, period and offset, so a changed limit keeps it).
    refused(
        &with_url("[rule_sets.login]\nrules = [\"10/min\", \"100/h\", \"20/min\"]\n"),
        "rule_sets.login.rules[2]",
        "has the algorithm, period and UTC offset of rule_sets.login.rules[0]",
    );
    // Another algorithm over the same period is another key.
    load(&with_url(
        "[rule_sets.login]\nrules = [\"10/min\", { rate = \"20/min\", algorithm = \"fixed-window\" }]\n",
    ));
}

#[test]
fn empty_rules_list() {
    refused(
        &with_url("[rule_sets.login]\nrules = []\n"),
        "rule_sets.login.rules",
        "must hold at least one rule",
    );
    refused(
        &with_url("[rule_sets.login]\npolicy = \"fail-open\"\n"),
        "rule_sets.login.rules",
        "required",
    );
    let seventeen: Vec<String> = (1..=17).map(|n| format!("\"{n}/s\"")).collect();
    refused(
        &with_url(&format!(
            "[rule_sets.login]\nrules = [{}]\n",
            seventeen.join(", ")
        )),
        "rule_sets.login.rules",
        "holds at most 16 rules (got 17)",
    );
}

#[test]
fn bad_set_name() {
    refused(
        &with_url("[rule_sets.\"bad name\"]\nrules = [\"1/s\"]\n"),
        "rule_sets.\"bad name\"",
        "invalid rule set name \"bad name\"",
    );
    let long = "x".repeat(65);
    refused(
        &with_url(&format!("[rule_sets.{long}]\nrules = [\"1/s\"]\n")),
        &format!("rule_sets.{long}"),
        "use 1 to 64 characters",
    );
}

#[test]
fn tls_client_cert_without_key() {
    let dir = temp_dir("nokey");
    self_signed(&dir);
    let file = dir.join("tierlimit.toml");
    std::fs::write(
        &file,
        "[redis]\nurl = \"rediss://127.0.0.1:6380/\"\ntls_client_cert_file = \"client.pem\"\n",
    )
    .expect("write");
    let e = Config::load(&file).expect_err("a cert without its key");
    assert_eq!(e.problems().len(), 1, "{e}");
    assert_eq!(e.problems()[0].path(), "redis.tls_client_cert_file");
    assert!(
        e.problems()[0]
            .message()
            .contains("needs tls_client_key_file too"),
        "{e}"
    );
    std::fs::write(
        &file,
        "[redis]\nurl = \"rediss://127.0.0.1:6380/\"\ntls_client_key_file = \"client.key\"\n",
    )
    .expect("write");
    let e = Config::load(&file).expect_err("a key without its cert");
    assert_eq!(e.problems()[0].path(), "redis.tls_client_key_file", "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_tls_file() {
    let dir = temp_dir("missing");
    let file = dir.join("tierlimit.toml");
    std::fs::write(
        &file,
        "[redis]\nurl = \"rediss://127.0.0.1:6380/\"\ntls_ca_file = \"nowhere/ca.pem\"\n",
    )
    .expect("write");
    let e = Config::load(&file).expect_err("a missing CA file");
    assert_eq!(e.problems().len(), 1, "{e}");
    let p = &e.problems()[0];
    assert_eq!(p.path(), "redis.tls_ca_file");
    // The path as resolved: relative to the config file's directory.
    let resolved = dir.join("nowhere/ca.pem");
    assert!(
        p.message()
            .starts_with(&format!("cannot read {}", resolved.display())),
        "{e}"
    );
    assert_eq!(p.line(), Some(3));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_material_is_checked_at_load() {
    let dir = temp_dir("pem");
    std::fs::write(dir.join("ca.pem"), "no certificate here").expect("write");
    let file = dir.join("tierlimit.toml");
    std::fs::write(
        &file,
        "[redis]\nurl = \"rediss://127.0.0.1:6380/\"\ntls_ca_file = \"ca.pem\"\n",
    )
    .expect("write");
    let e = Config::load(&file).expect_err("a CA file without a certificate");
    assert_eq!(e.problems()[0].path(), "redis.tls_ca_file", "{e}");
    assert!(
        e.problems()[0].message().contains("holds no certificate"),
        "{e}"
    );
    // TLS files with a plain redis:// URL.
    self_signed(&dir);
    std::fs::write(
        &file,
        "[redis]\nurl = \"redis://127.0.0.1:6380/\"\ntls_ca_file = \"client.pem\"\n",
    )
    .expect("write");
    let e = Config::load(&file).expect_err("TLS without rediss://");
    assert_eq!(e.problems()[0].path(), "redis.tls_ca_file", "{e}");
    assert!(e.problems()[0].message().contains("not rediss://"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_url() {
    refused(
        "[redis]\nurl = \"http://127.0.0.1/\"\n",
        "redis.url",
        "http://127.0.0.1/",
    );
    refused(
        "[redis]\nurl = \"rediss://127.0.0.1/#insecure\"\n",
        "redis.url",
        "fragment is refused",
    );
    let e = problems("[redis]\nurl = \"redis://app:pw-hidden@:::bad/\"\n");
    assert!(!e.to_string().contains("pw-hidden"), "{e}");
}

#[test]
fn toml_syntax_error_with_line() {
    let e = problems("[redis]\nurl = \"redis://127.0.0.1/\"\ndeadline = \"50ms\n[limiter]\n");
    let p = &e.problems()[0];
    assert_eq!(p.path(), "", "{e}");
    assert!(p.message().starts_with("TOML syntax: "), "{e}");
    assert_eq!(p.line(), Some(3), "{e}");
    assert!(e.to_string().starts_with("line 3, column "), "{e}");
    // A key given twice is a TOML error too.
    let e = problems("[redis]\nurl = \"a\"\nurl = \"b\"\n");
    assert_eq!(e.problems()[0].line(), Some(3), "{e}");
}

#[test]
fn settings_sections_report_their_own_checks() {
    refused(
        &with_url("[breaker]\nwindow_size = 10\nminimum_calls = 20\n"),
        "breaker.minimum_calls",
        "must be 1 to window_size (10) (got 20)",
    );
    // minimum_calls left at its default (20) against a smaller window.
    refused(
        &with_url("[breaker]\nwindow_size = 10\n"),
        "breaker.minimum_calls",
        "(the default, as it is not set here)",
    );
    refused(
        &with_url("[breaker]\njitter = 1.5\n"),
        "breaker.jitter",
        "must be in [0, 1) (got 1.5)",
    );
    refused(
        &with_url("[breaker]\ncool_down = \"10s\"\nmax_cool_down = \"5s\"\n"),
        "breaker.max_cool_down",
        "between cool_down (10s)",
    );
    refused(
        &with_url("[breaker]\nfailure_rate_threshold = nan\n"),
        "breaker.failure_rate_threshold",
        "in (0, 1]",
    );
    refused(
        &with_url("[local]\nmax_bytes = 1000\n"),
        "local.max_bytes",
        "must be at least 4194304 (got 1000)",
    );
    refused(
        &with_url("[local]\nmax_denials = 0\n"),
        "local.max_denials",
        "must be at least 1",
    );
    refused(
        &with_url("[reconcile]\nduty_cycle = 0.001\n"),
        "reconcile.duty_cycle",
        "must be in [0.01, 1] (got 0.001)",
    );
    refused(
        &with_url("[reconcile]\nbatch_size = 0\n"),
        "reconcile.batch_size",
        "must be 1 to 10000 (got 0)",
    );
    refused(
        &with_url("[reconcile]\nidle_poll = \"0s\"\n"),
        "reconcile.idle_poll",
        "must not be zero",
    );
}

#[test]
fn a_file_with_several_mistakes_reports_every_one_in_file_order() {
    let text = r#"
[redis]
url = "redis://127.0.0.1:6379/"
deadline = "0ms"
[limiter]
default_policy = "fail-opn"
instances = 0
[breaker]
consecutive_failures = 0
jitter = 2.0
[local]
max_keys = 0
max_bytes = 10
[reconcile]
batch_sise = 4
[rule_sets.login]
rules = ["10/s", { limit = 0, per = "1m" }, "10/fortnight", "10/s"]
[rule_sets."no good"]
rules = []
"#;
    let e = problems(text);
    let got: Vec<(&str, Option<usize>)> =
        e.problems().iter().map(|p| (p.path(), p.line())).collect();
    assert_eq!(
        got,
        [
            ("redis.deadline", Some(4)),
            ("limiter.default_policy", Some(6)),
            ("limiter.instances", Some(7)),
            ("breaker.consecutive_failures", Some(9)),
            ("breaker.jitter", Some(10)),
            ("local.max_keys", Some(12)),
            ("local.max_bytes", Some(13)),
            ("reconcile.batch_sise", Some(15)),
            ("rule_sets.login.rules[1].limit", Some(17)),
            ("rule_sets.login.rules[2]", Some(17)),
            ("rule_sets.login.rules[3]", Some(17)),
            ("rule_sets.\"no good\"", Some(18)),
            ("rule_sets.\"no good\".rules", Some(19)),
        ],
        "\n{e}"
    );
    // Display: one problem per line, each with its path.
    let shown = e.to_string();
    assert_eq!(shown.lines().count(), e.problems().len(), "{shown}");
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("rule_sets.login.rules[1].limit: must be at least 1")),
        "{shown}"
    );
}

#[test]
fn no_prefix_of_the_example_file_panics() {
    // Every prefix of a real file: cut mid-string, mid-table, mid-array.
    // Each either loads (and builds) or says what is wrong; none panics.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tierlimit.toml"),
    )
    .expect("the example file");
    let mut loaded = 0;
    for end in (0..=text.len()).filter(|i| text.is_char_boundary(*i)) {
        match Config::from_toml_str(&text[..end]) {
            Ok(config) => {
                loaded += 1;
                if loaded % 50 == 1 {
                    builds(&config);
                }
            }
            Err(e) => {
                assert!(!e.problems().is_empty(), "{end}");
                assert!(!e.to_string().is_empty(), "{end}");
            }
        }
    }
    assert!(
        loaded > 0,
        "the prefixes that end after a whole rule set load"
    );
}

#[test]
fn an_unreadable_file_is_a_config_error() {
    let e = Config::load("/nonexistent/tierlimit.toml").expect_err("no such file");
    assert_eq!(e.problems().len(), 1);
    assert_eq!(e.problems()[0].path(), "");
    assert!(
        e.to_string()
            .starts_with("cannot read /nonexistent/tierlimit.toml: "),
        "{e}"
    );
}

// ---------------------------------------------------------------------------
// Striping (issue 14, hot keys).

#[test]
fn stripes_are_read_into_the_rule_set() {
    let config = load(&with_url(
        "[rule_sets.tenant]\nstripes = 4\nrules = [\"1000/s\", \"10/min\"]\n\
         [rule_sets.plain]\nrules = [\"3/s\"]\n",
    ));
    let tenant = config.rule_set("tenant").expect("tenant");
    assert_eq!(tenant.stripes(), 4);
    assert_eq!(
        tenant.stripe(3).map(|s| s.rules()[1].limit()),
        Some(2),
        "10 over 4 stripes: 3, 3, 2, 2"
    );
    assert_eq!(config.rule_set("plain").map(RuleSet::stripes), Some(1));
    // Policy and striping together.
    let both = load(&with_url(
        "[rule_sets.t]\npolicy = \"fail-open\"\nstripes = 2\nrules = [\"10/s\"]\n",
    ));
    let t = both.rule_set("t").expect("t");
    assert_eq!((t.stripes(), t.policy()), (2, Some(Policy::FailOpen)));
}

#[test]
fn bad_stripes_are_refused_with_path_and_line() {
    for (value, says) in [
        ("0", "must be at least 1"),
        ("65", "1 to 64 sub-keys (got 65)"),
        ("99999999999", "1 to 64 sub-keys"),
        ("-2", "must be at least 1"),
        ("\"4\"", "an integer"),
        ("2.5", "an integer"),
        // 3/min cannot give 4 stripes one unit each.
        (
            "4",
            "rule 1 cannot be striped over 4 sub-keys: its limit of 3",
        ),
    ] {
        let line = refused(
            &with_url(&format!(
                "[rule_sets.hot]\nrules = [\"100/s\", \"3/min\"]\nstripes = {value}\n"
            )),
            "rule_sets.hot.stripes",
            says,
        );
        assert_eq!(line, Some(5), "stripes = {value}");
    }
    // A burst below the stripes is refused like a limit.
    refused(
        &with_url(
            "[rule_sets.hot]\nstripes = 8\nrules = [{ limit = 100, per = \"1s\", burst = 5 }]\n",
        ),
        "rule_sets.hot.stripes",
        "its capacity of 5",
    );
}

/// A window rule may count more than one unit per microsecond, in either of
/// the table's forms: it is made by its algorithm from the start. (GCRA, the
/// default, refuses such a rate: at the limit.)
#[test]
fn a_window_finer_than_a_microsecond_loads() {
    for (rule, algorithm) in [
        (
            r#"{ rate = "2000000/s", algorithm = "sliding-window" }"#,
            Algorithm::SlidingWindow,
        ),
        (
            r#"{ limit = 2000000, per = "1s", algorithm = "fixed-window" }"#,
            Algorithm::FixedWindow,
        ),
        (
            r#"{ rate = "100000000000/day@+08:00" }"#,
            Algorithm::FixedWindow,
        ),
    ] {
        let text = format!("[redis]\nurl = \"{URL}\"\n[rule_sets.a]\nrules = [{rule}]\n");
        let config = Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{rule}: {e}"));
        let set = config.rule_set("a").expect("the set");
        assert_eq!(set.rules()[0].algorithm(), algorithm, "{rule}");
    }
    refused(
        &format!("[redis]\nurl = \"{URL}\"\n[rule_sets.a]\nrules = [{{ rate = \"2000000/s\" }}]\n"),
        "rule_sets.a.rules[0].rate",
        "finer",
    );
}

/// A `stripes` out of range is reported beside a problem with the rules:
/// it depends on nothing else. Regression: a rule's problem ended the set's
/// checks before the stripes', which showed up only once it was fixed.
#[test]
fn stripes_out_of_range_are_reported_beside_a_bad_rule() {
    let e = problems(&format!(
        "[redis]\nurl = \"{URL}\"\n[rule_sets.a]\nstripes = 100\nrules = [\"0/s\"]\n"
    ));
    let paths: Vec<&str> = e.problems().iter().map(|p| p.path()).collect();
    assert_eq!(
        paths,
        ["rule_sets.a.stripes", "rule_sets.a.rules[0]"],
        "{e}"
    );
}

/// A rate that names its UTC offset (`@...`) and a `utc_offset` beside it
/// is refused at `utc_offset`, whatever the algorithm: one would silently
/// replace the other.
#[test]
fn a_utc_offset_given_twice_is_refused() {
    for algorithm in ["", ", algorithm = \"gcra\""] {
        refused(
            &format!(
                "[redis]\nurl = \"{URL}\"\n[rule_sets.a]\nrules = [{{ rate = \"100/day@+08:00\", utc_offset = \"+01:00\"{algorithm} }}]\n"
            ),
            "rule_sets.a.rules[0].utc_offset",
            "give it in one place",
        );
    }
}

/// A GCRA rule whose period alone is too long for its arrival time (a full
/// bucket refills in one period) is refused at its period, which is what
/// the file said, not at a burst it never gave.
#[test]
fn a_gcra_period_too_long_is_refused_at_the_period() {
    let rule = |extra: &str| {
        format!(
            "[redis]\nurl = \"{URL}\"\n[rule_sets.a]\nrules = [{{ limit = 1, per = \"60000d\"{extra} }}]\n"
        )
    };
    refused(&rule(""), "rule_sets.a.rules[0].per", "too long");
    // The same period as a window has no refill to keep exact.
    Config::from_toml_str(&rule(", algorithm = \"fixed-window\""))
        .expect("a window of 60,000 days loads");
}
