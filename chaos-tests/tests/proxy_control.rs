//! The `chaos-proxy` program, as the docker driver uses it, run here as a
//! process between a client and a real redis-server: it forwards to a
//! `host:port` upstream, and faults set over its control port take effect.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chaos_tests::proxy;
use tierlimit_test::{Fault, RedisServer};

/// The proxy process, killed when the test ends however it ends.
struct Proxy {
    child: Child,
    addr: SocketAddr,
    control: SocketAddr,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_proxy(upstream: &str) -> Proxy {
    let mut child = Command::new(env!("CARGO_BIN_EXE_chaos-proxy"))
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
        .args(["--control", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("chaos-proxy starts");
    let mut first = String::new();
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut stderr = BufReader::new(stderr);
    stderr
        .read_line(&mut first)
        .expect("chaos-proxy says where it listens");
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    // "chaos-proxy: <addr> -> <upstream>, control on <control>"
    let addr_of = |s: &str| -> SocketAddr {
        s.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{s:?} in {first:?}: {e}"))
    };
    let (head, control) = first
        .split_once(", control on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
    let addr = head
        .strip_prefix("chaos-proxy: ")
        .and_then(|h| h.split_once(" -> "))
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .0;
    Proxy {
        addr: addr_of(addr),
        control: addr_of(control),
        child,
    }
}

/// Sends an inline PING and returns what came back (empty when the connection
/// was closed), or the I/O error.
fn ping_on(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"PING\r\n")?;
    let mut reply = [0u8; 7];
    let mut got = 0;
    while got < reply.len() {
        match stream.read(&mut reply[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(reply[..got].to_vec())
}

fn ping(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
    ping_on(&mut TcpStream::connect(addr)?)
}

#[test]
fn faults_set_over_the_control_port_take_effect() {
    let _serial = tierlimit_test::serial_blocking();
    let server = RedisServer::start();
    // A host name, as in the compose project ("redis:6379"): looked up per connection.
    let proxy_proc = start_proxy(&format!("localhost:{}", server.port()));
    let (addr, control) = (proxy_proc.addr, proxy_proc.control);

    assert_eq!(ping(addr).expect("PING through the proxy"), b"+PONG\r\n");

    proxy::send(control, Fault::Latency(Duration::from_millis(100))).expect("latency is set");
    let started = Instant::now();
    assert_eq!(ping(addr).expect("PING with latency"), b"+PONG\r\n");
    // 100 ms on the request and 100 ms on the reply.
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "a round trip under latency 100 ms took {:?}",
        started.elapsed()
    );

    proxy::send(control, Fault::None).expect("latency is cleared");
    let mut open = TcpStream::connect(addr).expect("connect");
    assert_eq!(ping_on(&mut open).expect("PING"), b"+PONG\r\n");
    proxy::send(control, Fault::Reset).expect("reset is set");
    // The open connection was reset, and a new one is reset at once.
    assert!(
        !matches!(ping_on(&mut open), Ok(r) if r == b"+PONG\r\n"),
        "a connection open before the reset still answers"
    );
    assert!(
        !matches!(ping(addr), Ok(r) if r == b"+PONG\r\n"),
        "a new connection answers while every connection is reset"
    );

    proxy::send(control, Fault::None).expect("reset is cleared");
    assert_eq!(ping(addr).expect("PING after the reset"), b"+PONG\r\n");
}

#[test]
fn a_bad_control_line_gets_an_error_and_changes_nothing() {
    let _serial = tierlimit_test::serial_blocking();
    let server = RedisServer::start();
    let proxy_proc = start_proxy(&server.addr().to_string());
    proxy::send(
        proxy_proc.control,
        Fault::Latency(Duration::from_millis(150)),
    )
    .expect("latency is set");
    let mut control = TcpStream::connect(proxy_proc.control).expect("control port");
    control
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    writeln!(control, "latency soon").expect("write");
    let mut reply = String::new();
    BufReader::new(&control)
        .read_line(&mut reply)
        .expect("a reply");
    assert!(
        reply.starts_with("err ") && reply.contains("whole milliseconds"),
        "reply {reply:?}"
    );
    // The latency set before is still in force.
    let started = Instant::now();
    assert_eq!(ping(proxy_proc.addr).expect("PING"), b"+PONG\r\n");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "a round trip took {:?} after the bad line: the latency is gone",
        started.elapsed()
    );
}
