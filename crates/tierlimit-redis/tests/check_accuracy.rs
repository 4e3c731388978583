//! Accuracy under contention, on one server: 64 tasks on 4 connections
//! hammer one key for about 2 s per algorithm; see `support/accuracy.rs` for
//! what each test asserts (the Cluster tests run the same bodies).

#[path = "support/accuracy.rs"]
mod accuracy;
mod support;

use tierlimit_test::RedisServer;

fn key() -> [String; 1] {
    ["hammered".to_string()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_admits_exactly_its_rate() {
    let server = RedisServer::start();
    accuracy::gcra_admits_exactly_its_rate(&server.url(), &key()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_admits_exactly_its_rate() {
    let server = RedisServer::start();
    accuracy::token_bucket_admits_exactly_its_rate(&server.url(), &key()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_admits_exactly_its_window() {
    let server = RedisServer::start();
    accuracy::sliding_log_admits_exactly_its_window(&server.url(), &key()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_admits_exactly_its_limit_per_window() {
    let server = RedisServer::start();
    accuracy::fixed_window_admits_exactly_its_limit_per_window(&server.url(), &key()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_stays_within_its_error_bound() {
    let server = RedisServer::start();
    accuracy::sliding_window_stays_within_its_error_bound(&server.url(), &key()).await;
}
