//! TLS (`rediss://`), ACL users with passwords, and URL redaction.
//!
//! Regression tests for issue 9, items 10 and 20: `rediss://` failed with "TLS
//! feature is not enabled", and a password in the URL could be printed.

mod support;

use std::time::Duration;

use tierlimit_core::{Error, Rule, RuleSet};
use tierlimit_redis::{RedisTier, RedisTierConfig};
use tierlimit_test::RedisServer;

const USER: &str = "app";
const PASSWORD: &str = "pw-s3cret-9f2";

fn set() -> RuleSet {
    RuleSet::new("security", [Rule::per_minute(100).expect("valid rule")]).expect("valid set")
}

fn tls_tier(url: &str, ca_pem: &[u8]) -> RedisTier {
    RedisTier::new(
        RedisTierConfig::new(url)
            .deadline(Duration::from_secs(2))
            .tls_root_certificates(ca_pem),
    )
    .expect("valid TLS tier config")
}

fn acl_args() -> Vec<String> {
    RedisServer::acl_user(USER, PASSWORD)
}

fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_checks_on_a_tls_only_server_verified_against_its_ca() {
    let server = RedisServer::start_tls(&[]);
    assert!(server.url().starts_with("rediss://"));
    let tier = tls_tier(&server.url(), server.tls_ca_pem().expect("a TLS server"));
    let verdict = tier
        .check("user:1", &set(), 1)
        .await
        .expect("check over TLS");
    assert!(verdict.decision.allowed);
    assert_eq!(verdict.decision.remaining, 99);
    assert!(server.script_calls().await >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_refuses_a_server_whose_certificate_another_ca_signed() {
    let server = RedisServer::start_tls(&[]);
    let stranger = RedisServer::start_tls(&[]);
    let tier = tls_tier(&server.url(), stranger.tls_ca_pem().expect("a TLS server"));
    let err = tier
        .check("user:1", &set(), 1)
        .await
        .expect_err("a certificate from an untrusted CA must not be accepted");
    assert!(
        err.redis_failure().is_some(),
        "a Redis fault, not bad input: {err}"
    );
    assert_eq!(server.script_calls().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_refuses_a_certificate_that_does_not_name_the_urls_host() {
    // Signed by the CA the tier trusts, for `localhost` only.
    let server = RedisServer::start_tls_naming_localhost(&[]);
    let ca = server.tls_ca_pem().expect("a TLS server");
    assert!(server.url().starts_with("rediss://127.0.0.1:"));
    let err = tls_tier(&server.url(), ca)
        .check("user:1", &set(), 1)
        .await
        .expect_err("a certificate that does not name 127.0.0.1 must not be accepted there");
    assert!(
        err.redis_failure().is_some(),
        "a Redis fault, not bad input: {err}"
    );
    assert_eq!(server.script_calls().await, 0);
    // The same server and CA, by the name the certificate gives: accepted.
    let by_name = server.url().replacen("127.0.0.1", "localhost", 1);
    let verdict = tls_tier(&by_name, ca)
        .check("user:1", &set(), 1)
        .await
        .expect("the certificate names localhost");
    assert!(verdict.decision.allowed);
}

#[test]
fn rediss_insecure_fragment_and_certificates_without_rediss_are_refused_at_new() {
    let err = RedisTier::new(RedisTierConfig::new("rediss://127.0.0.1:1/#insecure"))
        .expect_err("#insecure would switch verification off");
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    let err =
        RedisTier::new(RedisTierConfig::new("redis://127.0.0.1:1/").tls_root_certificates("x"))
            .expect_err("TLS settings on a plain URL");
    assert!(err.to_string().contains("rediss://"), "{err}");
    let err = RedisTier::new(
        RedisTierConfig::new("rediss://127.0.0.1:1/").tls_root_certificates("not a pem"),
    )
    .expect_err("a PEM without a certificate");
    assert!(err.to_string().contains("tls_root_certificates"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_a_password_checks_and_a_wrong_password_is_a_redis_fault() {
    let server = RedisServer::start_with(&as_strs(&acl_args()));
    let tier = support::tier(&server.url_as(USER, PASSWORD));
    let verdict = tier.check("user:1", &set(), 1).await.expect("check as app");
    assert!(verdict.decision.allowed);

    let wrong = support::tier(&server.url_as(USER, "not-the-password"));
    let err = wrong
        .check("user:1", &set(), 1)
        .await
        .expect_err("a wrong password must not be accepted");
    assert!(!err.is_bad_input(), "{err}");
    assert!(err.redis_failure().is_some(), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("not-the-password"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_an_acl_user_together() {
    let server = RedisServer::start_tls(&as_strs(&acl_args()));
    let tier = tls_tier(
        &server.url_as(USER, PASSWORD),
        server.tls_ca_pem().expect("a TLS server"),
    );
    let verdict = tier
        .check("user:1", &set(), 1)
        .await
        .expect("check as app over TLS");
    assert!(verdict.decision.allowed);
    let shown = format!("{tier:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
}

#[test]
fn no_debug_or_error_built_from_a_url_shows_its_password() {
    let url = format!("redis://{USER}:{PASSWORD}@127.0.0.1:6390/0");
    let config = RedisTierConfig::new(&url).tls_root_certificates("pem");
    let shown = format!("{config:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    assert!(shown.contains("redis://***@127.0.0.1:6390/0"), "{shown}");

    let tier = RedisTier::new(RedisTierConfig::new(&url)).expect("valid config");
    let shown = format!("{tier:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");

    // Every way a URL can be refused at construction.
    for bad in [
        format!("redis://{USER}:{PASSWORD}@127.0.0.1:6390/not-a-db"),
        format!("redis://{USER}:{PASSWORD}@0.0.0.0:6390/"),
        format!("rediss://{USER}:{PASSWORD}@127.0.0.1:6390/#insecure"),
        format!("{USER}:{PASSWORD}@127.0.0.1:6390"),
        format!("redis://{USER}:{PASSWORD}@127.0.0.1:6390/").replace("redis", "nope"),
    ] {
        let err = RedisTier::new(RedisTierConfig::new(&bad)).expect_err(&bad);
        assert!(matches!(err, Error::InvalidConfig { .. }), "{bad}: {err}");
        let shown = format!("{err} / {err:?}");
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(
            shown.contains("***"),
            "the message names the URL, redacted: {shown}"
        );
    }
}
