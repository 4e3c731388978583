//! Regression (issue 9, item 22): counters stopped at 2^53. A rule of
//! `with_period(2^53, 2^53 µs)` was accepted, and in the scripts' doubles
//! `c + 1` rounded back to `c`: a sliding window admitted everything and a
//! fixed window answered `remaining = -1`. Rules now stop at `MAX_LIMIT`
//! (2^51) and `MAX_REFILL_US` (2^52; `bad_input.rs` shows one more refused);
//! here the largest accepted values count exactly on Redis, to the last unit.

#[path = "support/bounds.rs"]
mod bounds;
mod support;

use tierlimit_test::RedisServer;

#[tokio::test]
async fn the_largest_limits_count_exactly() {
    let server = RedisServer::start();
    bounds::the_largest_limits_count_exactly(&server.url(), "k").await;
}

#[tokio::test]
async fn the_longest_refill_is_exact() {
    let server = RedisServer::start();
    bounds::the_longest_refill_is_exact(&server.url(), "k").await;
}
