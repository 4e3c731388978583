//! All or nothing across the rules of a set: with "3 per second AND 5 per 10
//! seconds", for every pair of algorithms, a request denied by either rule
//! changes no rule's stored state (read back with DUMP before and after), and
//! the decision names the rule that denied.

#[path = "support/atomicity.rs"]
mod atomicity;
mod support;

use tierlimit_test::RedisServer;

#[tokio::test]
async fn a_denial_by_either_rule_changes_nothing() {
    let server = RedisServer::start();
    atomicity::a_denial_by_either_rule_changes_nothing(&server.url(), "user", server.conn().await)
        .await;
}
