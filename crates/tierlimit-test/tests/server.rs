//! Tests for `RedisServer`.

use std::time::Duration;

use redis::AsyncCommands;
use tierlimit_test::RedisServer;
use tokio::time::timeout;

async fn ping(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

#[tokio::test]
async fn starts_and_answers() {
    let server =
        RedisServer::start_with(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]);
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.addr().port(), server.port());
    let mut conn = server.conn().await;
    assert_eq!(ping(&mut conn).await.expect("PING"), "PONG");
    let maxmemory: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query_async(&mut conn)
        .await
        .expect("CONFIG GET");
    assert_eq!(maxmemory, ["maxmemory", "2097152"]);
}

#[tokio::test]
async fn inspection_helpers() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let before = server.command_calls("ping").await;
    for _ in 0..3 {
        ping(&mut conn).await.expect("PING");
    }
    assert_eq!(server.command_calls("ping").await, before + 3);
    assert_eq!(server.command_calls("evalsha").await, 0);

    let () = conn.set("forever", 1).await.expect("SET");
    let () = conn.set_ex("fleeting", 1, 60).await.expect("SETEX");
    assert_eq!(server.dbsize().await, 2);
    assert_eq!(server.keys_without_ttl().await, ["forever"]);
    server.flushall().await;
    assert_eq!(server.dbsize().await, 0);

    let script = redis::Script::new("return 1");
    let n: i64 = script.invoke_async(&mut conn).await.expect("script");
    assert_eq!(n, 1);
    server.script_flush().await;
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(script.get_hash())
        .query_async(&mut conn)
        .await
        .expect("SCRIPT EXISTS");
    assert_eq!(exists, [false]);
}

#[tokio::test]
async fn kill9_then_restart_is_empty_on_the_same_port() {
    let mut server = RedisServer::start();
    let (port, pid) = (server.port(), server.pid());
    let mut conn = server.conn().await;
    let () = conn.set("k", "v").await.expect("SET");
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut conn)
        .await
        .expect("LOAD");

    server.kill9();
    assert!(!server.is_running());
    assert!(
        ping(&mut conn).await.is_err(),
        "a killed server must not answer"
    );

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), pid);
    assert_eq!(server.dbsize().await, 0);
    let mut conn = server.conn().await;
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(redis::Script::new("return 1").get_hash())
        .query_async(&mut conn)
        .await
        .expect("SCRIPT EXISTS");
    assert_eq!(exists, [false]);
}

#[tokio::test]
async fn pause_hangs_and_resume_answers() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    server.pause();
    assert!(server.is_paused());
    let hung = timeout(Duration::from_millis(200), ping(&mut conn)).await;
    assert!(
        hung.is_err(),
        "a paused server must not answer, got {hung:?}"
    );

    server.resume();
    assert!(!server.is_paused());
    assert_eq!(ping(&mut conn).await.expect("PING after resume"), "PONG");
}

#[tokio::test]
async fn drop_while_paused_kills_the_process() {
    let server = RedisServer::start();
    let pid = server.pid();
    server.pause();
    drop(server);
    let alive = std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run kill -0");
    assert!(
        !alive.success(),
        "redis-server {pid} is still running after drop"
    );
}

/// A server of someone else's on the port (another test's, started on the
/// port this one freed) is not taken for this one's: `restart` waits for its
/// own process to answer, which cannot bind the port, and gives up with a
/// panic instead of handing the test a server another test will kill.
#[test]
fn a_restart_never_takes_another_servers_answer_for_its_own() {
    let mut ours = RedisServer::start();
    let port = ours.port();
    ours.kill9();
    let dir = std::env::temp_dir().join(format!("tierlimit-foreign-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch dir");
    // The binary the harness starts (README: TIERLIMIT_REDIS_SERVER names it).
    let binary = std::env::var("TIERLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let mut foreign = std::process::Command::new(&binary)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{binary} does not run ({e}): scripts/ensure-redis installs redis-server")
        });
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("valid URL");
    let started = std::time::Instant::now();
    while client
        .get_connection()
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the other server never answered"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let restarted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ours.restart()));
    let _ = foreign.kill();
    let _ = foreign.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let why = restarted.expect_err("restart() went on with another process's server");
    let why = why
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(
        why.contains(&format!("127.0.0.1:{port} exited")),
        "it gave up because its own server could not listen: {why}"
    );
}
