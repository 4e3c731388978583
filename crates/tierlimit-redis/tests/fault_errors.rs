//! Server-side faults come back classified, with the redis-rs error as the
//! source: `-OOM` under `noeviction`, `-READONLY` from a replica.

mod support;

use std::error::Error as _;
use std::time::Duration;

use tierlimit_core::{Algorithm, RedisFailure};
use tierlimit_redis::CheckRequest;
use tierlimit_test::RedisServer;

use support::{ALGORITHMS, rule, set, tier};

#[tokio::test]
async fn out_of_memory() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let tier = tier(&server.url());
    let set = set(
        "oom",
        ALGORITHMS.map(|a| rule(a, 10, Duration::from_secs(60))),
    );
    tier.check("k", &set, 1).await.expect("fits in memory");
    // Now any memory in use is too much: every write is refused.
    server.config_set("maxmemory", "1").await;

    let err = tier.check("k", &set, 1).await.expect_err("out of memory");
    assert_eq!(
        err.redis_failure(),
        Some(RedisFailure::OutOfMemory),
        "{err:?}"
    );
    assert!(err.source().is_some(), "the RedisError is kept");
    let results = tier
        .check_many(&[
            CheckRequest::new("k", &set, 1),
            CheckRequest::new("j", &set, 1),
        ])
        .await
        .expect("the batch itself went through");
    for r in results {
        let err = r.expect_err("out of memory");
        assert_eq!(
            err.redis_failure(),
            Some(RedisFailure::OutOfMemory),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn read_only_replica() {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let tier = tier(&replica.url());
    let set = set("ro", [rule(Algorithm::Gcra, 10, Duration::from_secs(1))]);
    let err = tier.check("k", &set, 1).await.expect_err("read-only");
    assert_eq!(err.redis_failure(), Some(RedisFailure::ReadOnly), "{err:?}");
    assert!(err.is_transient());
}
