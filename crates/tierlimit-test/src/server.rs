//! A private `redis-server` child process per test.

use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Environment variable that may name the `redis-server` binary to run.
const BINARY_ENV: &str = "TIERLIMIT_REDIS_SERVER";
const NOT_FOUND: &str = "redis-server not found on PATH: install it with \
    `sudo apt-get install -y redis-server` (Debian/Ubuntu) or run scripts/test, which installs it";
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const REBIND_TIMEOUT: Duration = Duration::from_secs(5);
const START_ATTEMPTS: usize = 5;
const OPENSSL_NOT_FOUND: &str = "openssl not found on PATH (the TLS tests make their CA with it): \
    install it with `sudo apt-get install -y openssl` or run scripts/test, which installs it";

/// A `redis-server` child process listening on its own loopback port, with
/// persistence disabled and a fresh scratch directory.
///
/// [`start_tls`](Self::start_tls) starts one that speaks TLS only, with a
/// certificate signed by a CA made for it; [`start_with`](Self::start_with)
/// and [`acl_user`](Self::acl_user) add an ACL user with a password.
///
/// The process is killed and its directory removed when this value is dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    pid: u32,
    port: u16,
    args: Vec<String>,
    dir: PathBuf,
    paused: AtomicBool,
    tls: Option<TestCa>,
}

/// A CA and a server certificate for 127.0.0.1, made by the `openssl` CLI in a
/// directory of their own (kept across [`RedisServer::restart`]).
#[derive(Debug)]
pub(crate) struct TestCa {
    dir: PathBuf,
    ca_pem: Vec<u8>,
    /// The server's certificate and key, PEM, good for client use too.
    identity: (Vec<u8>, Vec<u8>),
    /// The host the harness's own connections name: one the certificate
    /// names.
    harness_host: &'static str,
}

impl TestCa {
    pub(crate) fn new() -> TestCa {
        TestCa::naming("IP:127.0.0.1,DNS:localhost")
    }

    /// A CA and a server certificate whose subject alternative names are
    /// `names` (openssl's syntax: `DNS:host,IP:addr`).
    fn naming(names: &str) -> TestCa {
        let dir = fresh_dir();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .output();
            match out {
                Ok(out) if out.status.success() => {}
                Ok(out) => panic!(
                    "openssl {} failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                ),
                Err(e) if e.kind() == io::ErrorKind::NotFound => panic!("{OPENSSL_NOT_FOUND}"),
                Err(e) => panic!("cannot run openssl: {e}"),
            }
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec![
            "req",
            "-x509",
            "-days",
            "2",
            "-subj",
            "/CN=tierlimit test CA",
        ];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
        ca.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        ca.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        run(&ca);
        let mut csr = vec!["req", "-subj", "/CN=127.0.0.1", "-keyout", "server.key"];
        csr.extend(ec);
        csr.extend(["-out", "server.csr"]);
        run(&csr);
        // Client use too: a cluster node presents it when it connects to
        // another node's bus, which always asks for a client certificate.
        fs::write(
            dir.join("server.ext"),
            format!(
                "subjectAltName={names}\n\
                 basicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature\n\
                 extendedKeyUsage=serverAuth,clientAuth\n"
            ),
        )
        .expect("cannot write server.ext");
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ]);
        let read = |name: &str| fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (ca_pem, identity) = (read("ca.crt"), (read("server.crt"), read("server.key")));
        TestCa {
            dir,
            ca_pem,
            identity,
            harness_host: if names.contains("IP:127.0.0.1") {
                "127.0.0.1"
            } else {
                "localhost"
            },
        }
    }

    /// The CA's certificate, PEM.
    pub(crate) fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// A cluster node's arguments beside its plain port: TLS clients on
    /// `tls_port`, and TLS on the cluster bus and for replication.
    pub(crate) fn cluster_node_args(&self, tls_port: u16) -> Vec<String> {
        let mut args = self.args(tls_port);
        // Drop `--port 0`: the node keeps its plain port for the harness.
        args.drain(..2);
        args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
        args
    }

    /// The server's arguments: TLS on `port`, no plain TCP port at all.
    fn args(&self, port: u16) -> Vec<String> {
        let file = |name: &str| self.dir.join(name).display().to_string();
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            file("server.crt"),
            "--tls-key-file".into(),
            file("server.key"),
            "--tls-ca-cert-file".into(),
            file("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// How a start-up attempt ended.
enum Startup {
    Ready,
    Exited(ExitStatus),
    TimedOut,
}

impl RedisServer {
    /// Starts a server with the default arguments; panics if it cannot.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments appended, e.g.
    /// `["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]`.
    ///
    /// Blocks the calling thread (for well under a second, normally) until the
    /// server answers `PING`; panics if it does not within 10 s.
    pub fn start_with(args: &[&str]) -> RedisServer {
        RedisServer::start_as(args, None)
    }

    /// Starts a server that speaks TLS only (`--port 0 --tls-port <port>`),
    /// with a fresh CA and a certificate for `127.0.0.1` signed by it (made
    /// with the `openssl` CLI), plus extra arguments as in
    /// [`start_with`](Self::start_with). Clients must trust
    /// [`tls_ca_pem`](Self::tls_ca_pem); [`url`](Self::url) is `rediss://`.
    pub fn start_tls(args: &[&str]) -> RedisServer {
        RedisServer::start_as(args, Some(TestCa::new()))
    }

    /// As [`start_tls`](Self::start_tls), with a certificate that names
    /// only `localhost`, not `127.0.0.1`, which [`url`](Self::url) names: a
    /// client that checks the name must refuse it. This harness's own
    /// connections to it name `localhost`.
    pub fn start_tls_naming_localhost(args: &[&str]) -> RedisServer {
        RedisServer::start_as(args, Some(TestCa::naming("DNS:localhost")))
    }

    /// The arguments that add an ACL user `user` with password `password`,
    /// allowed every key and command, for [`start_with`](Self::start_with)
    /// or [`start_tls`](Self::start_tls). The `default` user stays as it is,
    /// so this harness's own helpers keep working.
    pub fn acl_user(user: &str, password: &str) -> Vec<String> {
        [
            "--user",
            user,
            "on",
            &format!(">{password}"),
            "~*",
            "&*",
            "+@all",
        ]
        .map(String::from)
        .to_vec()
    }

    fn start_as(args: &[&str], tls: Option<TestCa>) -> RedisServer {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        RedisServer::start_each(|| (args.clone(), ()), tls).0
    }

    /// Starts a server with the extra arguments `attempt` makes for each
    /// start attempt, and answers what the successful attempt made beside
    /// them: arguments that name ports of their own (a Cluster node's bus
    /// port) draw them afresh when a port was taken.
    pub(crate) fn start_each<T>(
        attempt: impl Fn() -> (Vec<String>, T),
        tls: Option<TestCa>,
    ) -> (RedisServer, T) {
        for n in 1..=START_ATTEMPTS {
            let (args, made) = attempt();
            let port = free_port();
            let dir = fresh_dir();
            let mut child = spawn(port, &dir, &args, tls.as_ref());
            match wait_ready(&mut child, port, tls.as_ref()) {
                Startup::Ready => {
                    let server = RedisServer {
                        pid: child.id(),
                        child: Some(child),
                        port,
                        args,
                        dir,
                        paused: AtomicBool::new(false),
                        tls,
                    };
                    return (server, made);
                }
                // Most likely someone else took a port between our probe and
                // the server's bind: try other ports.
                Startup::Exited(_) if n < START_ATTEMPTS => {
                    let _ = fs::remove_dir_all(&dir);
                }
                outcome => fail(child, &dir, port, outcome),
            }
        }
        unreachable!("the last start attempt either returns or panics")
    }

    /// The TCP port the server listens on (stable across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's socket address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The connection URL: `redis://127.0.0.1:<port>/`, or `rediss://…` for a
    /// server started by [`start_tls`](Self::start_tls).
    pub fn url(&self) -> String {
        url_for(self.port, self.tls.is_some())
    }

    /// The URL that logs in as ACL user `user` with `password`
    /// (`redis://user:password@127.0.0.1:<port>/`; the password is
    /// percent-encoded where a URL needs it).
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let encode = |s: &str| {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        };
        let url = self.url();
        let (scheme, rest) = url.split_once("://").expect("url() has a scheme");
        format!("{scheme}://{}:{}@{rest}", encode(user), encode(password))
    }

    /// The PEM of the CA that signed a TLS server's certificate; `None` for a
    /// plain server.
    pub fn tls_ca_pem(&self) -> Option<&[u8]> {
        self.tls.as_ref().map(|ca| ca.ca_pem.as_slice())
    }

    /// A client certificate and its key, PEM, signed by the server's CA, for
    /// a server started with [`start_tls`](Self::start_tls) (the harness
    /// presents it too, so a server started with `--tls-auth-clients yes`
    /// serves it); `None` for a plain one.
    pub fn tls_client_identity(&self) -> Option<(&[u8], &[u8])> {
        self.tls
            .as_ref()
            .map(|ca| (ca.identity.0.as_slice(), ca.identity.1.as_slice()))
    }

    /// The process id of the current (or, after [`kill9`](Self::kill9), the last) server process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The last `lines` lines of the server's log (its stdout and stderr),
    /// for failure messages; empty when there is none yet.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether a server process is currently running (it may be paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// A `redis` client for this server (trusting its test CA when it speaks TLS).
    pub fn client(&self) -> redis::Client {
        client_for(self.port, self.tls.as_ref())
    }

    /// A fresh multiplexed connection straight to the server (bypassing any proxy);
    /// panics if it cannot connect.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| {
                panic!("cannot connect to test redis-server at {}: {e}", self.url())
            })
    }

    /// Kills the server with SIGKILL (no shutdown, no save) and reaps it.
    /// Does nothing if it is not running.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL also ends a stopped process; no SIGCONT needed first.
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Starts the server again on the same port with the same arguments and a
    /// fresh, empty directory: no data and an empty script cache. Kills the
    /// current process first if it is still running. Retries for up to 5 s if
    /// the port cannot be bound yet; panics if the server does not come up.
    pub fn restart(&mut self) {
        self.kill9();
        let _ = fs::remove_dir_all(&self.dir);
        self.dir = fresh_dir();
        let deadline = Instant::now() + REBIND_TIMEOUT;
        loop {
            let mut child = spawn(self.port, &self.dir, &self.args, self.tls.as_ref());
            match wait_ready(&mut child, self.port, self.tls.as_ref()) {
                Startup::Ready => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                Startup::Exited(_) if Instant::now() < deadline => {
                    sleep(Duration::from_millis(50));
                }
                outcome => fail(child, &self.dir, self.port, outcome),
            }
        }
    }

    /// Freezes the server with SIGSTOP: connections stay open but nothing is answered.
    pub fn pause(&self) {
        self.signal("STOP");
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Thaws a server frozen by [`pause`](Self::pause) with SIGCONT.
    pub fn resume(&self) {
        self.signal("CONT");
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Whether the server is currently frozen by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// How many times `cmd` (e.g. `"evalsha"`) has been called since start,
    /// from `INFO commandstats`; 0 if it has never been called.
    pub async fn command_calls(&self, cmd: &str) -> u64 {
        self.command_stat(cmd, "calls").await
    }

    /// How many calls of `cmd` the server refused before running them since
    /// start (`rejected_calls`: a Cluster node's `MOVED` replies among them);
    /// 0 if it has refused none.
    pub async fn rejected_calls(&self, cmd: &str) -> u64 {
        self.command_stat(cmd, "rejected_calls").await
    }

    /// Integer `field` of `cmd`'s line in `INFO commandstats`; 0 without one.
    async fn command_stat(&self, cmd: &str, field: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn().await)
            .await
            .expect("INFO commandstats failed");
        let prefix = format!("cmdstat_{}:", cmd.to_ascii_lowercase());
        let field = format!("{field}=");
        info.lines()
            .filter_map(|line| line.strip_prefix(&prefix))
            .flat_map(|fields| fields.split(','))
            .find_map(|f| f.strip_prefix(&field))
            .map(|n| n.trim().parse().expect("a commandstats field is a number"))
            .unwrap_or(0)
    }

    /// How many script calls the server has run since start: `EVALSHA` and
    /// `FCALL` (a tier runs its Lua by either, see
    /// `tierlimit_redis::RedisTier::script_mode`).
    pub async fn script_calls(&self) -> u64 {
        self.command_calls("evalsha").await + self.command_calls("fcall").await
    }

    /// How many times Lua code was loaded since start: `SCRIPT LOAD` and
    /// `FUNCTION LOAD`.
    pub async fn code_loads(&self) -> u64 {
        self.command_calls("script|load").await + self.command_calls("function|load").await
    }

    /// Empties the Functions libraries (`FUNCTION FLUSH`), so the next `FCALL`
    /// gets `Function not found`.
    pub async fn function_flush(&self) {
        self.run(redis::cmd("FUNCTION").arg("FLUSH")).await;
    }

    /// Drops all Lua code the server holds: scripts and function libraries
    /// (`SCRIPT FLUSH`, `FUNCTION FLUSH`), whichever a tier uses.
    pub async fn lua_flush(&self) {
        self.script_flush().await;
        self.function_flush().await;
    }

    /// Sets one of the server's settings while it runs (`CONFIG SET`), e.g.
    /// `maxmemory` to `1`, so that every write is refused as out of memory.
    pub async fn config_set(&self, name: &str, value: &str) {
        self.run(redis::cmd("CONFIG").arg("SET").arg(name).arg(value))
            .await;
    }

    /// Deletes every key (`FLUSHALL`).
    pub async fn flushall(&self) {
        self.run(&redis::cmd("FLUSHALL")).await;
    }

    /// Empties the Lua script cache (`SCRIPT FLUSH`), so the next `EVALSHA` gets `NOSCRIPT`.
    pub async fn script_flush(&self) {
        self.run(redis::cmd("SCRIPT").arg("FLUSH")).await;
    }

    /// The number of keys in the database (`DBSIZE`).
    pub async fn dbsize(&self) -> u64 {
        redis::cmd("DBSIZE")
            .query_async(&mut self.conn().await)
            .await
            .expect("DBSIZE failed")
    }

    /// Every key that has no expiry (`PTTL` is -1), sorted. Useful to check
    /// that nothing is left behind forever.
    pub async fn keys_without_ttl(&self) -> Vec<String> {
        let mut conn = self.conn().await;
        let mut cursor = 0u64;
        let mut found = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .expect("SCAN failed");
            for key in keys {
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .expect("PTTL failed");
                if pttl == -1 {
                    found.push(key);
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        found.sort();
        found
    }

    async fn run(&self, cmd: &redis::Cmd) {
        let () = cmd
            .query_async(&mut self.conn().await)
            .await
            .unwrap_or_else(|e| panic!("{cmd:?} failed: {e}"));
    }

    fn signal(&self, signal: &str) {
        assert!(self.child.is_some(), "redis-server is not running");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status()
            .expect("cannot run `kill` to signal redis-server");
        assert!(
            status.success(),
            "kill -{signal} {} failed: {status}",
            self.pid
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.is_paused() && self.child.is_some() {
            self.signal("CONT");
        }
        self.kill9();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port that was free a moment ago. Another socket may take it
/// before a server binds it: the server then exits, and
/// [`RedisServer::start_each`] tries again with every port drawn afresh (a
/// Cluster node's bus and TLS ports too).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("cannot bind an ephemeral port on 127.0.0.1")
        .port()
}

/// A new, empty directory under the system temp dir.
fn fresh_dir() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tierlimit-redis-{}-{n}", std::process::id()));
        match fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create {}: {e}", dir.display()),
        }
    }
}

fn spawn(port: u16, dir: &Path, extra: &[String], tls: Option<&TestCa>) -> Child {
    let binary = std::env::var(BINARY_ENV).unwrap_or_else(|_| "redis-server".to_string());
    let log = File::create(dir.join("redis.log")).expect("cannot create redis.log");
    let log2 = log.try_clone().expect("cannot clone the redis.log handle");
    let listen = match tls {
        Some(ca) => ca.args(port),
        None => vec!["--port".into(), port.to_string()],
    };
    let spawned = Command::new(&binary)
        .args(listen)
        .args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn();
    match spawned {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound && std::env::var_os(BINARY_ENV).is_some() => {
            panic!("{BINARY_ENV}={binary} does not exist")
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => panic!("{NOT_FOUND}"),
        Err(e) => panic!("cannot start {binary}: {e}"),
    }
}

/// `redis://127.0.0.1:<port>/`, or `rediss://…` for a server speaking TLS.
fn url_for(port: u16, tls: bool) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    format!("{scheme}://127.0.0.1:{port}/")
}

/// A `redis` client for the server on `port` (trusting `tls`'s CA, if given).
fn client_for(port: u16, tls: Option<&TestCa>) -> redis::Client {
    let url = url_for(port, tls.is_some());
    match tls {
        None => redis::Client::open(url).expect("a 127.0.0.1 redis URL is always valid"),
        Some(ca) => {
            let url = url.replacen("127.0.0.1", ca.harness_host, 1);
            if rustls::crypto::CryptoProvider::get_default().is_none() {
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
            let certs = redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: ca.identity.0.clone(),
                    client_key: ca.identity.1.clone(),
                }),
                root_cert: Some(ca.ca_pem.clone()),
            };
            redis::Client::build_with_tls(url, certs)
                .expect("the test CA is a valid PEM certificate")
        }
    }
}

/// Polls until `child` answers on `port`, exits, or 10 s pass.
///
/// The answer must be the child's own (`INFO`'s `process_id`): the port was
/// free a moment before the child was started, and another test's server may
/// have taken it since. Such a server answers while the child fails to bind
/// and exits, and a test that went on with it would lose its connection when
/// that other test ends (the likely cause of a check's `broken pipe` in the
/// middle of a blackhole, seen once in CI).
fn wait_ready(child: &mut Child, port: u16, tls: Option<&TestCa>) -> Startup {
    let deadline = Instant::now() + READY_TIMEOUT;
    let client = client_for(port, tls);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Startup::Exited(status);
        }
        if serving_pid(&client) == Some(child.id()) {
            return Startup::Ready;
        }
        sleep(Duration::from_millis(10));
    }
    Startup::TimedOut
}

/// The process id of the server that answers `client`, if one does.
fn serving_pid(client: &redis::Client) -> Option<u32> {
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(100))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(200)))
        .ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))?
        .trim()
        .parse()
        .ok()
}

fn fail(mut child: Child, dir: &Path, port: u16, outcome: Startup) -> ! {
    let _ = child.kill();
    let _ = child.wait();
    let log = fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    let _ = fs::remove_dir_all(dir);
    let why = match outcome {
        Startup::Exited(status) => format!("exited with {status}"),
        Startup::TimedOut => format!("did not answer PING within {READY_TIMEOUT:?}"),
        Startup::Ready => "was ready".to_string(),
    };
    panic!("redis-server on 127.0.0.1:{port} {why}; its log:\n{log}")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A port an attempt's arguments name was taken before the server bound
    /// it: the server exits, and the next attempt draws its ports afresh.
    #[test]
    fn a_start_whose_own_port_was_taken_is_tried_again_with_fresh_ports() {
        let held = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
        let taken = held.local_addr().expect("a bound address").port();
        let attempts = AtomicUsize::new(0);
        let (server, bus) = RedisServer::start_each(
            || {
                let bus = match attempts.fetch_add(1, Ordering::Relaxed) {
                    0 => taken,
                    _ => free_port(),
                };
                let args = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus.to_string(),
                ]
                .map(String::from)
                .to_vec();
                (args, bus)
            },
            None,
        );
        assert_eq!(attempts.load(Ordering::Relaxed), 2);
        assert_ne!(bus, taken);
        assert!(server.is_running());
        let mut conn = server.client().get_connection().expect("connect");
        let (_, port): (String, u16) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("cluster-port")
            .query(&mut conn)
            .expect("its cluster port");
        assert_eq!(port, bus, "the server runs with the second attempt's port");
        drop(held);
    }
}
