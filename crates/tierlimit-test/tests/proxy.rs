//! Tests for `FaultProxy`, each against its own `RedisServer`.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tierlimit_test::{Fault, FaultProxy, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

const SHORT: Duration = Duration::from_millis(200);

async fn setup() -> (RedisServer, FaultProxy, MultiplexedConnection) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let conn = redis::Client::open(proxy.url())
        .expect("proxy URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect through the proxy");
    (server, proxy, conn)
}

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

/// Sends an inline PING on a raw socket and reads whatever comes back.
async fn raw_ping(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    stream.write_all(b"PING\r\n").await?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf).await?;
    Ok(buf[..n].to_vec())
}

#[tokio::test]
async fn passes_through() {
    let _serial = tierlimit_test::serial().await;
    let (server, proxy, mut conn) = setup().await;
    assert_eq!(proxy.fault(), Fault::None);
    assert_eq!(proxy.upstream(), server.addr().to_string());
    assert_eq!(ping(&mut conn).await.expect("PING"), "PONG");
    let () = conn.set("k", "v").await.expect("SET");
    let v: String = server.conn().await.get("k").await.expect("GET");
    assert_eq!(v, "v");
    assert_eq!(proxy.connections_accepted(), 1);
}

#[tokio::test]
async fn latency_delays_replies() {
    let _serial = tierlimit_test::serial().await;
    let (_server, proxy, mut conn) = setup().await;
    proxy.set(Fault::Latency(Duration::from_millis(100)));
    let started = Instant::now();
    assert_eq!(ping(&mut conn).await.expect("PING"), "PONG");
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "took {:?}",
        started.elapsed()
    );

    proxy.set(Fault::None);
    let started = Instant::now();
    ping(&mut conn).await.expect("PING");
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "took {:?}",
        started.elapsed()
    );
}

/// Each chunk is delayed by itself: a request sent while an earlier one is
/// still held back is not queued behind it (else two calls in flight took
/// three delays and more, not two).
#[tokio::test]
async fn latency_delays_each_chunk_from_its_own_arrival() {
    let _serial = tierlimit_test::serial().await;
    let (_server, proxy, _conn) = setup().await;
    let delay = Duration::from_millis(200);
    let mut raw = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(raw_ping(&mut raw).await.expect("PING"), b"+PONG\r\n");
    proxy.set(Fault::Latency(delay));
    let started = Instant::now();
    raw.write_all(b"PING\r\n").await.expect("write");
    // The second request leaves half a delay after the first (a scripted
    // gap, not a wait for anything).
    tokio::time::sleep(delay / 2).await;
    raw.write_all(b"PING\r\n").await.expect("write");
    let mut got = Vec::new();
    while got.len() < 14 {
        let mut buf = [0u8; 64];
        let n = timeout(Duration::from_secs(5), raw.read(&mut buf))
            .await
            .expect("both replies within 5 s")
            .expect("read");
        assert!(n > 0, "the proxy closed the connection");
        got.extend_from_slice(&buf[..n]);
    }
    let took = started.elapsed();
    assert_eq!(got, b"+PONG\r\n+PONG\r\n");
    // Each round trip is two delays: the second ends at 2.5 delays. Behind
    // the first, it would end at 3 (its request sent on at 2, its reply at 3).
    assert!(
        took >= delay * 5 / 2 && took < delay * 5 / 2 + delay * 2 / 5,
        "two overlapping round trips took {took:?}, delay {delay:?}"
    );
}

#[tokio::test]
async fn blackhole_hangs_with_the_socket_open() {
    let _serial = tierlimit_test::serial().await;
    let (_server, proxy, mut conn) = setup().await;
    let mut raw = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(raw_ping(&mut raw).await.expect("PING"), b"+PONG\r\n");

    proxy.set(Fault::Blackhole);
    assert!(
        timeout(SHORT, ping(&mut conn)).await.is_err(),
        "PING must hang"
    );
    let hung = timeout(SHORT, raw_ping(&mut raw)).await;
    assert!(hung.is_err(), "no reply and no EOF expected, got {hung:?}");
    raw.write_all(b"PING\r\n")
        .await
        .expect("the socket is still open");

    let mut late = TcpStream::connect(proxy.addr())
        .await
        .expect("new connections are accepted");
    assert!(timeout(SHORT, raw_ping(&mut late)).await.is_err());
    assert_eq!(proxy.connections_accepted(), 3);
}

#[tokio::test]
async fn drop_replies_runs_the_command_but_hangs_the_client() {
    let _serial = tierlimit_test::serial().await;
    let (server, proxy, mut conn) = setup().await;
    proxy.set(Fault::DropReplies);
    let set = timeout(SHORT, conn.set::<_, _, ()>("k", "v")).await;
    assert!(set.is_err(), "the reply must never arrive, got {set:?}");
    let v: Option<String> = server.conn().await.get("k").await.expect("GET");
    assert_eq!(v.as_deref(), Some("v"));
}

#[tokio::test]
async fn refuse_then_recover() {
    let _serial = tierlimit_test::serial().await;
    let (_server, proxy, mut conn) = setup().await;
    proxy.set(Fault::Refuse);
    let started = Instant::now();
    let err = TcpStream::connect(proxy.addr())
        .await
        .expect_err("connect must be refused");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        timeout(SHORT, ping(&mut conn))
            .await
            .expect("fails fast")
            .is_err()
    );

    proxy.set(Fault::None);
    let mut fresh = redis::Client::open(proxy.url())
        .expect("proxy URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect after Refuse is lifted");
    assert_eq!(ping(&mut fresh).await.expect("PING"), "PONG");
}

#[tokio::test]
async fn reset_breaks_existing_and_new_connections() {
    let _serial = tierlimit_test::serial().await;
    let (_server, proxy, mut conn) = setup().await;
    let mut raw = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(raw_ping(&mut raw).await.expect("PING"), b"+PONG\r\n");

    proxy.set(Fault::Reset);
    let mut buf = [0u8; 8];
    let err = raw
        .read(&mut buf)
        .await
        .expect_err("the socket must be reset");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    let failed = timeout(SHORT, ping(&mut conn)).await.expect("fails fast");
    assert!(failed.is_err_and(|e| e.is_io_error() || e.is_connection_dropped()));

    // The reset right after accept can reach the client before its connect
    // returns (connect then fails with it) or after (the first read does).
    let err = match TcpStream::connect(proxy.addr()).await {
        Ok(mut late) => late
            .read(&mut buf)
            .await
            .expect_err("the new socket must be reset"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
}
