//! Regression (issue 9, item 23): the public check script trusted its numbers.
//! It checked only the argument count and the algorithm code: a negative cost
//! refunded quota; `nan`, `inf`, `0x10`, fractions and huge periods were
//! accepted; a huge period on the second rule failed `PEXPIRE` after the first
//! rule was written; one key under two algorithms failed with `WRONGTYPE` after
//! a write. The scripts are documented as callable by hand, so here they are
//! called by hand with bad arguments: each call is refused with its own error
//! reply, and nothing is written (every key's value and TTL as before).
//!
//! The check runs two ways: as the script (`EVALSHA`), and as the Functions
//! library's check function (`FCALL`), whose memos of checked arguments
//! (common.lua's RULES_SEEN, INTS_SEEN) already hold the good call's numbers
//! when the bad ones come: a look-alike of a number seen must still be
//! refused.

mod support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tierlimit_core::Algorithm;
use tierlimit_redis::{CHECK, RECONCILE};
use tierlimit_test::RedisServer;

use support::{dump, rule, set, tier};

const GCRA_KEY: &str = "tl:{u}:api:g60000000";
const LOG_KEY: &str = "tl:{u}:api:l60000000";

/// A valid call: GCRA 10 per minute and a sliding log 10 per minute, cost 1.
/// Each rule is written as its five numbers, one per item, so a test can
/// spoil one of them; [`wire`] joins them as the scripts take them.
fn good_check() -> (Vec<String>, Vec<String>) {
    let keys = vec![GCRA_KEY.to_string(), LOG_KEY.to_string()];
    let args = [
        "0", "1", "42", // now (server TIME), cost, nonce
        "1", "10", "60000000", "10", "0", // GCRA
        "3", "10", "60000000", "10", "0", // sliding log
    ];
    (keys, args.iter().map(|s| s.to_string()).collect())
}

/// How a test calls the check: the script, or the library's function (its name).
#[derive(Clone, Debug)]
enum Way {
    Script,
    Function(String),
}

impl Way {
    /// Both ways on `server`: the library loaded by a tier's first check.
    async fn both(server: &RedisServer) -> [Way; 2] {
        let probe = set("probe", [rule(Algorithm::Gcra, 1, Duration::from_secs(1))]);
        tier(&server.url())
            .check("probe", &probe, 1)
            .await
            .expect("a tier's first check loads the library");
        [Way::Script, Way::Function(check_function(server).await)]
    }
}

/// The name of the loaded library's check function (`FUNCTION LIST`).
async fn check_function(server: &RedisServer) -> String {
    library_function(server, |n| {
        n.starts_with("tierlimit_check_") && !n.starts_with("tierlimit_check_batch_")
    })
    .await
}

/// The name of the loaded library's function `wanted` picks.
async fn library_function(server: &RedisServer, wanted: impl Fn(&str) -> bool) -> String {
    let list: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut server.conn().await)
        .await
        .expect("FUNCTION LIST");
    fn names(value: &redis::Value, out: &mut Vec<String>) {
        match value {
            redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => out.push(s.clone()),
            redis::Value::Array(items) => items.iter().for_each(|v| names(v, out)),
            redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
                names(k, out);
                names(v, out);
            }),
            _ => {}
        }
    }
    let mut all = Vec::new();
    names(&list, &mut all);
    all.into_iter()
        .find(|n| wanted(n))
        .expect("the library's function is loaded")
}

/// `args` as a script takes them: the first `head` as they are, then each
/// rule's five numbers joined by ':' (`lua/check.lua`), then, when `tail`,
/// the rest as they are after one rule.
fn wire(args: &[String], head: usize, tail: bool) -> Vec<String> {
    let (front, rest) = args.split_at(head.min(args.len()));
    let mut out = front.to_vec();
    if tail {
        let (rule, after) = rest.split_at(5.min(rest.len()));
        out.push(rule.join(":"));
        out.extend_from_slice(after);
    } else {
        out.extend(rest.chunks(5).map(|rule| rule.join(":")));
    }
    out
}

/// Calls the check `way` with `args` (now, cost, nonce, then five numbers per
/// rule: see [`wire`]).
async fn run_check_as(
    way: &Way,
    conn: &mut MultiplexedConnection,
    keys: &[String],
    args: &[String],
) -> redis::RedisResult<redis::Value> {
    run_wire_as(way, conn, keys, &wire(args, 3, false)).await
}

/// Calls the check `way` with `args` as they are.
async fn run_wire_as(
    way: &Way,
    conn: &mut MultiplexedConnection,
    keys: &[String],
    args: &[String],
) -> redis::RedisResult<redis::Value> {
    match way {
        Way::Script => {
            let mut invocation = CHECK.prepare_invoke();
            for k in keys {
                invocation.key(k);
            }
            for a in args {
                invocation.arg(a);
            }
            invocation.invoke_async(conn).await
        }
        Way::Function(name) => {
            redis::cmd("FCALL")
                .arg(name)
                .arg(keys.len())
                .arg(keys)
                .arg(args)
                .query_async(conn)
                .await
        }
    }
}

async fn run_check(
    conn: &mut MultiplexedConnection,
    keys: &[String],
    args: &[String],
) -> redis::RedisResult<redis::Value> {
    run_check_as(&Way::Script, conn, keys, args).await
}

/// Every key with its serialized value and whether it has a TTL.
async fn snapshot(conn: &mut MultiplexedConnection) -> Vec<(String, Option<Vec<u8>>, bool)> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("KEYS");
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(conn)
            .await
            .expect("PTTL");
        out.push((k.clone(), dump(conn, &k).await, pttl > 0));
    }
    out
}

/// Calls the check script with `args` changed at `index` (into
/// [`good_check`]'s items, 0-based) to `value`, and asserts a refusal naming
/// `expect` that wrote nothing.
async fn refused(
    way: &Way,
    conn: &mut MultiplexedConnection,
    index: usize,
    value: &str,
    expect: &str,
) {
    let (keys, mut args) = good_check();
    args[index] = value.to_string();
    let before = snapshot(conn).await;
    let err = run_check_as(way, conn, &keys, &args)
        .await
        .expect_err(&format!(
            "{way:?}: ARGV[{}] = {value:?} must be refused",
            index + 1
        ));
    let shown = err.to_string();
    assert!(
        shown.contains("tierlimit check") && shown.contains(expect),
        "{way:?}: ARGV[{}] = {value:?}: {shown}",
        index + 1
    );
    assert_eq!(
        snapshot(conn).await,
        before,
        "{way:?}: ARGV[{}] = {value:?} wrote",
        index + 1
    );
}

#[tokio::test]
async fn bad_numbers_are_refused_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for way in &Way::both(&server).await {
        bad_numbers_are_refused(&server, &mut conn, way).await;
    }
}

async fn bad_numbers_are_refused(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    way: &Way,
) {
    // Both rules hold state (with TTLs) before the bad calls, and the
    // library's memos hold the good call's numbers.
    let (keys, args) = good_check();
    run_check_as(way, conn, &keys, &args)
        .await
        .expect("a good call");
    assert_eq!(server.keys_without_ttl().await, Vec::<String>::new());

    for cost in [
        "-1",
        "0",
        "nan",
        "inf",
        "-inf",
        "0x10",
        "1.5",
        "1e3",
        "",
        " 1",
        "99999999999999999999",
    ] {
        refused(way, conn, 1, cost, "cost").await;
    }
    refused(way, conn, 1, "11", "above the capacity").await;
    for now in ["-5", "abc", "1.7e15"] {
        refused(way, conn, 0, now, "now_us").await;
    }
    refused(way, conn, 2, "", "nonce").await;
    // The second rule's period: huge (PEXPIRE used to fail after rule 1 was
    // written), fractional, below a millisecond.
    for period in [
        "1e30",
        "100000000000000000000",
        "60000000.5",
        "999",
        "-60000000",
    ] {
        refused(way, conn, 10, period, "period_us").await;
    }
    // Algorithm codes, limits, capacities, offsets.
    refused(way, conn, 8, "6", "algorithm code").await;
    refused(way, conn, 8, "0", "algorithm code").await;
    refused(way, conn, 9, "1001", "limit").await; // a sliding log's bound
    refused(way, conn, 4, "2251799813685249", "limit").await; // 2^51 + 1
    refused(way, conn, 4, "-10", "limit").await;
    refused(way, conn, 11, "9", "capacity").await; // a window's capacity is its limit
    refused(way, conn, 6, "4503599627370496", "capacity").await; // above 2^51
    refused(way, conn, 12, "3600000000", "utc_offset_us").await; // only fixed windows
    refused(way, conn, 7, "1", "utc_offset_us").await;
    // GCRA finer than one unit per µs.
    refused(way, conn, 4, "60000001", "at most period_us").await;
    // Look-alikes of the good call's numbers (which the library's memos hold):
    // each refused, none read as the number it resembles.
    for limit in ["10 ", " 10", "0xa", "1e1", "10.0", "+10"] {
        refused(way, conn, 4, limit, "limit").await;
    }
    refused(way, conn, 1, "1 ", "cost").await;
    refused(way, conn, 1, "+1", "cost").await;
    // A rule is one argument of exactly five numbers joined by ':': six
    // (a ':' inside a number), four, or none are refused.
    refused(way, conn, 4, "10:5", "code:limit:period_us").await;
    let keys = good_check().0;
    for rule in ["1:10:60000000:10", "", "1:10:60000000:10:0:0"] {
        let args = ["0", "1", "42", "1:10:60000000:10:0", rule].map(String::from);
        let before = snapshot(conn).await;
        let err = run_wire_as(way, conn, &keys, &args)
            .await
            .expect_err(&format!("{way:?}: rule {rule:?} must be refused"));
        assert!(
            err.to_string()
                .contains("a rule must be code:limit:period_us:capacity:utc_offset_us"),
            "{way:?}: rule {rule:?}: {err}"
        );
        assert_eq!(snapshot(conn).await, before, "{way:?}: rule {rule:?} wrote");
    }
    // Two arguments run together, the next one empty: the same text joined.
    let mut split = good_check().1;
    split[4] = "10 60000000".into();
    split[5] = "10".into();
    split[6] = "0".into();
    split[7] = String::new();
    let before = snapshot(conn).await;
    let err = run_check_as(way, conn, &good_check().0, &split)
        .await
        .expect_err("arguments run together are refused");
    assert!(
        err.to_string().contains("tierlimit check"),
        "{way:?}: {err}"
    );
    assert_eq!(
        snapshot(conn).await,
        before,
        "{way:?}: arguments run together wrote"
    );
}

/// The batch function called by hand: arguments that do not add up, or a
/// nonce missing or empty, refuse the whole call before anything is read or
/// written; a good call decides each request (three integers each, after the server time).
#[tokio::test]
async fn a_batch_that_does_not_add_up_is_refused_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    Way::both(&server).await;
    let batch = library_function(&server, |n| n.starts_with("tierlimit_check_batch_")).await;
    let gcra = ["1", "1:10:60000000:10:0"]; // one rule: GCRA 10 per minute
    let log = ["1", "3:10:60000000:10:0"]; // one rule: sliding log 10 per minute
    let call = |keys: &[&str], args: Vec<&str>| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&batch).arg(keys.len()).arg(keys).arg(args);
        cmd
    };
    let two = ["tl:{a}:api:g60000000", "tl:{b}:api:l60000000"];
    // n, g, nonce, now; one set, so each request is its cost.
    let good = [&["2", "1", "42", "0"][..], &gcra, &["1", "1"]].concat();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        // A request naming its set with one set in the call: one argument too many each.
        (
            [&["2", "1", "42", "0"][..], &gcra, &["1", "1", "1", "1"]].concat(),
            "arguments",
        ),
        // A request short of its cost.
        (
            [&["2", "1", "42", "0"][..], &gcra, &["1"]].concat(),
            "arguments",
        ),
        // The nonce empty, or missing (the call ends before it).
        (
            [&["2", "1", "", "0"][..], &gcra, &["1", "1"]].concat(),
            "nonce",
        ),
        (vec!["2", "1"], "nonce"),
        // The call's now: one for all its requests, checked first.
        (
            [&["2", "1", "42", "-5"][..], &gcra, &["1", "1"]].concat(),
            "now_us",
        ),
        (
            [&["2", "1", "42", "1e15"][..], &gcra, &["1", "1"]].concat(),
            "now_us",
        ),
        // Two sets: every request names one of them, 1 or 2.
        (
            [
                &["2", "2", "42", "0"][..],
                &gcra,
                &log,
                &["1", "1", "3", "1"],
            ]
            .concat(),
            "rule set of request 2",
        ),
    ];
    for (args, expect) in cases {
        let before = snapshot(&mut conn).await;
        let err = call(&two, args.clone())
            .query_async::<redis::Value>(&mut conn)
            .await
            .expect_err(&format!("{args:?} must be refused"));
        assert!(
            err.to_string().contains("tierlimit check batch") && err.to_string().contains(expect),
            "{args:?}: {err}"
        );
        assert_eq!(snapshot(&mut conn).await, before, "{args:?} wrote");
    }
    // Well formed, with one set and with two: each request decided.
    let one_set = ["tl:{a}:api:g60000000", "tl:{c}:api:g60000000"];
    // {a}'s GCRA rule is checked in both calls: 9 left, then 8.
    for (keys, args, left) in [
        (&one_set, good, (9, 9)),
        (
            &two,
            [
                &["2", "2", "42", "0"][..],
                &gcra,
                &log,
                &["1", "1", "2", "1"],
            ]
            .concat(),
            (8, 9),
        ),
    ] {
        let reply: Vec<i64> = call(keys, args.clone())
            .query_async(&mut conn)
            .await
            .expect("a good batch");
        // The server time, then per request: retry-after (0: admitted),
        // remaining, reset-after.
        assert_eq!(reply.len(), 7, "{args:?}: {reply:?}");
        assert!(reply[0] > 0, "{args:?}: {reply:?}");
        assert_eq!((reply[1], reply[2]), (0, left.0), "{args:?}: {reply:?}");
        assert_eq!((reply[4], reply[5]), (0, left.1), "{args:?}: {reply:?}");
    }
    // "2" passed above as a count (the library remembers checked counts and
    // costs by their text): as the rule sets of one request it is still
    // refused, and nothing is written.
    let before = snapshot(&mut conn).await;
    let args = [&["1", "2", "42", "0"][..], &gcra, &log, &["1", "1"]].concat();
    let err = call(&two[..1], args.clone())
        .query_async::<redis::Value>(&mut conn)
        .await
        .expect_err("two rule sets for one request");
    assert!(
        err.to_string()
            .contains("the number of rule sets must be in [1, 1], got 2"),
        "{err}"
    );
    assert_eq!(snapshot(&mut conn).await, before, "{args:?} wrote");
}

/// Requests of one batch that raise (a key of another type, a refused cost)
/// answer their own error, in their own place, naming their own key; every
/// request before and after them is decided, the failed ones write nothing.
/// The batch decides its requests under one `pcall`, resumed after the one
/// that raised, so this is what keeps the others going.
#[tokio::test]
async fn requests_that_raise_in_a_batch_answer_alone_and_the_rest_are_decided() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    Way::both(&server).await;
    let batch = library_function(&server, |n| n.starts_with("tierlimit_check_batch_")).await;
    let keys = [
        "tl:{a}:api:g60000000",
        "tl:{spoilt}:api:g60000000",
        "tl:{b}:api:g60000000",
        "tl:{c}:api:g60000000",
        "tl:{d}:api:g60000000",
    ];
    let () = redis::cmd("HSET")
        .arg(keys[1])
        .arg("not")
        .arg("gcra")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    // GCRA 10 per minute; five requests of cost 1, but the fourth's is 0.
    let args = [
        "5",
        "1",
        "42",
        "0",
        "1",
        "1:10:60000000:10:0",
        "1",
        "1",
        "1",
        "0",
        "1",
    ];
    let before = snapshot(&mut conn).await;
    let mut call = redis::cmd("FCALL");
    call.arg(&batch)
        .arg(keys.len())
        .arg(&keys[..])
        .arg(&args[..]);
    // Sent raw: a query would turn the whole reply into its first error.
    let reply = redis::aio::ConnectionLike::req_packed_command(&mut conn, &call)
        .await
        .expect("the call answers each request");
    let redis::Value::Array(reply) = reply else {
        panic!("not an array: {reply:?}");
    };
    // The server time, then {a} (three integers), {spoilt}'s error, {b}'s
    // three, {c}'s error, {d}'s three.
    assert_eq!(reply.len(), 1 + 3 + 1 + 3 + 1 + 3, "{reply:?}");
    let int = |i: usize| match &reply[i] {
        redis::Value::Int(n) => *n,
        other => panic!("item {i} is {other:?}: {reply:?}"),
    };
    let error = |i: usize| match &reply[i] {
        redis::Value::ServerError(e) => format!("{} {}", e.code(), e.details().unwrap_or("")),
        other => panic!("item {i} is {other:?}: {reply:?}"),
    };
    for at in [1, 5, 9] {
        assert_eq!(
            (int(at), int(at + 1)),
            (0, 9),
            "admitted, 9 left: {reply:?}"
        );
    }
    let wrongtype = error(4);
    assert!(
        wrongtype.starts_with("WRONGTYPE tierlimit check: KEYS[2] holds another type"),
        "{wrongtype}"
    );
    let refused = error(8);
    assert!(
        refused.starts_with("ERR tierlimit check: cost must be in"),
        "{refused}"
    );
    let after = snapshot(&mut conn).await;
    let written: Vec<&String> = after
        .iter()
        .filter(|entry| !before.contains(entry))
        .map(|(key, _, _)| key)
        .collect();
    assert_eq!(
        written,
        [keys[0], keys[2], keys[4]],
        "only the decided requests wrote"
    );
}

#[tokio::test]
async fn one_key_under_two_algorithms_writes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // The same key for a GCRA rule and a sliding-log rule: both reads pass on
    // an empty key, and the second commit used to fail (WRONGTYPE) after the
    // first had written.
    let (_, args) = good_check();
    let keys = vec![GCRA_KEY.to_string(), GCRA_KEY.to_string()];
    let err = run_check(&mut conn, &keys, &args)
        .await
        .expect_err("one key twice is refused");
    assert!(err.to_string().contains("repeats KEYS[1]"), "{err}");
    assert_eq!(server.dbsize().await, 0, "nothing was written");
    // Not only next to each other: the third key repeats the first.
    let (mut keys, mut args) = good_check();
    keys.push(GCRA_KEY.to_string());
    args.extend(args[3..8].to_vec());
    let err = run_check(&mut conn, &keys, &args)
        .await
        .expect_err("a key repeated further on is refused");
    assert!(err.to_string().contains("KEYS[3] repeats KEYS[1]"), "{err}");
    assert_eq!(server.dbsize().await, 0, "nothing was written");

    // A key that already holds another algorithm's type: WRONGTYPE before any
    // commit, naming the key; the other rule's key is not written.
    let (keys, args) = good_check();
    run_check(&mut conn, &keys[1..], &[&args[..3], &args[8..]].concat())
        .await
        .expect("a sliding-log call");
    let swapped = vec!["tl:{u}:other".to_string(), LOG_KEY.to_string()];
    let gcra_twice = [&args[..8], &args[3..8]].concat();
    let before = snapshot(&mut conn).await;
    let err = run_check(&mut conn, &swapped, &gcra_twice)
        .await
        .expect_err("a sorted set read as GCRA state");
    assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
    assert!(err.to_string().contains("KEYS[2]"), "{err}");
    assert_eq!(snapshot(&mut conn).await, before, "nothing was written");
}

/// A valid reconcile call: 3 units of the GCRA rule, admitted a second ago
/// (the rule as its five numbers, joined by [`run_reconcile`]).
fn good_reconcile(batch: &str) -> (Vec<String>, Vec<String>) {
    let keys = vec![GCRA_KEY.to_string(), format!("{GCRA_KEY}:rc:{batch}")];
    let args = [
        "1700000001000000",
        "1",
        "10",
        "60000000",
        "10",
        "0", // now, code, limit, period, capacity, offset
        "3",
        "1700000000000000",
        "1700000000000000",
        "120000",
        batch,
    ];
    (keys, args.iter().map(|s| s.to_string()).collect())
}

async fn run_reconcile(
    conn: &mut MultiplexedConnection,
    keys: &[String],
    args: &[String],
) -> redis::RedisResult<redis::Value> {
    let mut invocation = RECONCILE.prepare_invoke();
    for k in keys {
        invocation.key(k);
    }
    for a in &wire(args, 1, true) {
        invocation.arg(a);
    }
    invocation.invoke_async(conn).await
}

#[tokio::test]
async fn reconcile_refuses_bad_input_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let (keys, args) = good_reconcile("b0");
    run_reconcile(&mut conn, &keys, &args)
        .await
        .expect("a good call");

    let cases: [(usize, &str, &str); 10] = [
        (6, "-3", "units"), // used to refund quota
        (6, "0", "units"),
        (6, "nan", "units"),
        (6, "2.5", "units"),
        (7, "0x10", "first_us"),
        (8, "1", "last_us"), // before first_us
        (3, "1e30", "period_us"),
        (9, "inf", "marker_ttl_ms"),
        (1, "7", "algorithm code"),
        (2, "2251799813685249", "limit"),
    ];
    for (index, value, expect) in cases {
        let (keys, mut args) = good_reconcile("b1");
        args[index] = value.to_string();
        let before = snapshot(&mut conn).await;
        let err = run_reconcile(&mut conn, &keys, &args)
            .await
            .expect_err(&format!("ARGV[{}] = {value:?} must be refused", index + 1));
        assert!(
            err.to_string().contains("tierlimit reconcile") && err.to_string().contains(expect),
            "ARGV[{}] = {value:?}: {err}",
            index + 1
        );
        assert_eq!(
            snapshot(&mut conn).await,
            before,
            "ARGV[{}] = {value:?} wrote",
            index + 1
        );
    }

    // A marker that is not the key's own.
    let (mut keys, args) = good_reconcile("b2");
    keys[1] = LOG_KEY.to_string();
    let before = snapshot(&mut conn).await;
    let err = run_reconcile(&mut conn, &keys, &args)
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("KEYS[2]"), "{err}");
    assert_eq!(snapshot(&mut conn).await, before);

    // Sliding-log units onto a key holding GCRA state: WRONGTYPE, no marker.
    let (mut keys, mut args) = good_reconcile("b3");
    args[1] = "3".to_string();
    keys[0] = GCRA_KEY.to_string();
    let before = snapshot(&mut conn).await;
    let err = run_reconcile(&mut conn, &keys, &args)
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
    assert_eq!(
        snapshot(&mut conn).await,
        before,
        "no state and no marker written"
    );
}

/// The library's memo of checked rules is bounded: past 512 rules it starts
/// over, and every rule, remembered, forgotten or new, still decides by its
/// own numbers (here, a limit of n admits n and denies the next).
#[tokio::test]
async fn the_librarys_memo_of_rules_starts_over_and_still_decides_each_rule() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let [_, function] = Way::both(&server).await;
    // A day, so no key expires while the test runs.
    const DAY_US: u64 = 86_400_000_000;
    let check = |limit: u64, key: String| {
        let args: Vec<String> = ["0", "1", "7", "1"]
            .iter()
            .map(|s| s.to_string())
            .chain([limit, DAY_US, limit, 0].map(|n| n.to_string()))
            .collect();
        (vec![key], args)
    };
    // 1,200 distinct rules: the memo fills and starts over twice. Each
    // rule's key takes its limit, then is denied.
    for round in 0..2 {
        for limit in (1..=1_200u64).step_by(if round == 0 { 1 } else { 97 }) {
            let key = format!("tl:{{m{round}-{limit}}}:s:g{DAY_US}");
            let (keys, args) = check(limit, key);
            let reply: Vec<i64> = {
                let v = run_check_as(&function, &mut conn, &keys, &args)
                    .await
                    .expect("a good call");
                redis::from_redis_value(v).expect("an integer reply")
            };
            // The server time, retry-after (0: admitted), remaining, reset-after.
            assert_eq!(reply[1], 0, "limit {limit}: the first unit is admitted");
            assert_eq!(reply[2], limit as i64 - 1, "limit {limit}: remaining");
        }
    }
    // Bad numbers are still refused after the memo started over.
    let () = redis::cmd("FLUSHDB")
        .query_async(&mut conn)
        .await
        .expect("FLUSHDB");
    for (index, value, expect) in [(4, "0x10", "limit"), (1, "1.0", "cost")] {
        refused(&function, &mut conn, index, value, expect).await;
    }
}
