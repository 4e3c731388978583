//! The demo's Redis: a `redis-server` child of our own, or a forwarder in front
//! of the user's Redis (`REDIS_URL`), either of which the demo can take away
//! and give back.

use std::io::{self, ErrorKind};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::Failure;

const INSTALL_HINT: &str = "redis-server is not on PATH: install it (Debian/Ubuntu: \
    `sudo apt-get install -y redis-server`; macOS: `brew install redis`), name it with \
    TIERLIMIT_REDIS_SERVER=/path/to/redis-server, or point the demo at a running Redis \
    with REDIS_URL=redis://host:port/";
/// Names the `redis-server` binary to run, as for the test harness and
/// `scripts/ensure-redis`; else it is looked for on `PATH`.
const BINARY_ENV: &str = "TIERLIMIT_REDIS_SERVER";
/// How long a started server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Ports tried before giving up when another process takes each one first.
const START_ATTEMPTS: usize = 5;

/// A `redis-server` child on a free loopback port, persistence off, in a
/// scratch directory. Killed (SIGKILL) and its directory removed when dropped,
/// so every way out of the demo (an error, a panic, Ctrl-C) stops it.
#[derive(Debug)]
pub(crate) struct RedisChild {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl RedisChild {
    /// Starts a server and waits until it answers PING.
    pub(crate) async fn start() -> Result<RedisChild, Failure> {
        let dir = std::env::temp_dir().join(format!(
            "tierlimit-demo-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::new(format!("cannot create {}: {e}", dir.display())))?;
        let mut server = RedisChild {
            child: None,
            port: 0,
            dir,
        };
        for attempt in 1..=START_ATTEMPTS {
            server.port = free_port()?;
            server.spawn()?;
            match server.wait_ready().await {
                Ok(()) => return Ok(server),
                // Someone else took the port between our probe and the bind.
                Err(_) if attempt < START_ATTEMPTS => server.kill(),
                Err(e) => return Err(e),
            }
        }
        Err(Failure::new("redis-server did not start"))
    }

    /// `redis://127.0.0.1:<port>/`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The process id of the running server, if one runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The port the server listens on (the same after a restart).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server with SIGKILL (no shutdown, nothing saved) and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port: empty, as a crashed Redis
    /// without persistence comes back. Retries while the port is not free yet.
    pub(crate) async fn restart(&mut self) -> Result<(), Failure> {
        self.kill();
        let started = Instant::now();
        loop {
            self.spawn()?;
            match self.wait_ready().await {
                Ok(()) => return Ok(()),
                Err(_) if started.elapsed() < READY_TIMEOUT => {
                    self.kill();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn spawn(&mut self) -> Result<(), Failure> {
        let server = redis_server()?;
        let log = std::fs::File::create(self.dir.join("redis.log"))
            .map_err(|e| Failure::new(format!("cannot create the redis-server log: {e}")))?;
        // Through `setpriv --pdeathsig KILL` (util-linux) when it is there:
        // the kernel then kills the server if the demo itself is killed with
        // SIGKILL, the one exit no cleanup code of ours can see.
        let mut command = match with_pdeathsig(&server) {
            Some(c) => c,
            None => Command::new(&server),
        };
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::null());
        // A process group of its own: Ctrl-C in the terminal reaches only the
        // demo, which then stops the server itself, after its limiters.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        match command.spawn() {
            Ok(child) => {
                self.child = Some(child);
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Err(Failure::new(INSTALL_HINT)),
            Err(e) => Err(Failure::new(format!("cannot start redis-server: {e}"))),
        }
    }

    /// Polls until the server answers PING, exits, or [`READY_TIMEOUT`] passes.
    async fn wait_ready(&mut self) -> Result<(), Failure> {
        let started = Instant::now();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        while started.elapsed() < READY_TIMEOUT {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                return Err(Failure::new(format!(
                    "redis-server exited ({status}) on port {}: {}",
                    self.port,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )));
            }
            if ping(addr).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(Failure::new(format!(
            "redis-server on port {} did not answer PING within {READY_TIMEOUT:?}",
            self.port
        )))
    }
}

impl Drop for RedisChild {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The executable `name` in a directory of `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// `server` under `setpriv --pdeathsig KILL --`, when a `setpriv` on `PATH`
/// runs it so: one older than util-linux 2.33 has no `--pdeathsig` and
/// refuses it, and the server never started (five times over, its reason
/// lost with setpriv's stderr). Tried with `--version`, which exits at once.
fn with_pdeathsig(server: &std::path::Path) -> Option<Command> {
    let setpriv = which("setpriv")?;
    let under = |server: &std::path::Path| {
        let mut c = Command::new(&setpriv);
        c.args(["--pdeathsig", "KILL", "--"]).arg(server);
        c
    };
    let works = under(server)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    works.then(|| under(server))
}

/// The `redis-server` to run: [`BINARY_ENV`]'s, else the one on `PATH`.
fn redis_server() -> Result<PathBuf, Failure> {
    match std::env::var_os(BINARY_ENV) {
        Some(named) if is_executable(std::path::Path::new(&named)) => Ok(named.into()),
        Some(named) => Err(Failure::new(format!(
            "{BINARY_ENV}={} is not an executable file",
            named.to_string_lossy()
        ))),
        None => which("redis-server").ok_or_else(|| Failure::new(INSTALL_HINT)),
    }
}

#[cfg(unix)]
fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &std::path::Path) -> bool {
    path.is_file()
}

/// True when a Redis at `addr` answers `PING` with `+PONG` within 500 ms.
pub(crate) async fn ping(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"PING\r\n").await?;
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply).await?;
        Ok::<bool, io::Error>(&reply == b"+PONG\r\n")
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), attempt).await,
        Ok(Ok(true))
    )
}

/// A free loopback port, never Redis' default 6379 (someone's real Redis).
fn free_port() -> Result<u16, Failure> {
    for _ in 0..10 {
        let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| Failure::new(format!("cannot bind a loopback port: {e}")))?
            .port();
        if port != 6379 {
            return Ok(port);
        }
    }
    Err(Failure::new("no free loopback port other than 6379"))
}

/// A TCP forwarder on a loopback port in front of the user's Redis, which the
/// demo cannot stop: [`cut`](Self::cut) closes every forwarded connection and
/// closes new ones as soon as they are accepted (clients see their
/// connections closed, as when Redis dies), [`heal`](Self::heal) forwards
/// again. The user's Redis keeps its data throughout.
#[derive(Debug)]
pub(crate) struct Forwarder {
    addr: SocketAddr,
    state: Arc<Mutex<Pipes>>,
    accept: AbortHandle,
}

/// The forwarder's connections, and whether it is cut: one lock, so no
/// connection accepted while `cut` runs escapes it.
#[derive(Debug, Default)]
struct Pipes {
    cut: bool,
    open: Vec<AbortHandle>,
}

fn lock(state: &Mutex<Pipes>) -> std::sync::MutexGuard<'_, Pipes> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Forwarder {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    pub(crate) async fn start(upstream: String) -> Result<Forwarder, Failure> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| Failure::new(format!("cannot bind the forwarder: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Failure::new(format!("cannot read the forwarder's address: {e}")))?;
        let state = Arc::new(Mutex::new(Pipes::default()));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Out of descriptors, say: do not spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let mut pipes = lock(&shared);
                if pipes.cut {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let pipe = tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    let Ok(mut server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = server.set_nodelay(true);
                    let mut client = client;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                pipes.open.retain(|h| !h.is_finished());
                pipes.open.push(pipe.abort_handle());
            }
        })
        .abort_handle();
        Ok(Forwarder {
            addr,
            state,
            accept,
        })
    }

    /// The loopback address clients connect to.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Takes Redis away: closes every forwarded connection, and every new one.
    pub(crate) fn cut(&self) {
        let mut pipes = lock(&self.state);
        pipes.cut = true;
        for pipe in pipes.open.drain(..) {
            pipe.abort();
        }
    }

    /// Gives Redis back: new connections are forwarded again.
    pub(crate) fn heal(&self) {
        lock(&self.state).cut = false;
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// The parts of a `redis://` URL the demo's forwarder needs: where the user's
/// Redis is, and the URL that reaches it through the forwarder instead.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct UserUrl {
    /// `host:port` of the user's Redis.
    pub(crate) upstream: String,
    scheme_and_user: String,
    path: String,
}

impl UserUrl {
    /// Splits `redis://[user[:password]@]host[:port][/db]`. A `rediss://`
    /// URL is refused: the forwarder listens on 127.0.0.1, a name the
    /// server's certificate does not cover, and verification is never
    /// skipped.
    pub(crate) fn parse(url: &str) -> Result<UserUrl, Failure> {
        if url.starts_with("rediss://") {
            return Err(Failure::new(
                "REDIS_URL is rediss:// (TLS): the demo takes Redis away with a TCP forwarder \
                 on 127.0.0.1, which your server's certificate does not name; run the demo \
                 with a redis:// URL, or without REDIS_URL (it then starts its own redis-server)",
            ));
        }
        let rest = url.strip_prefix("redis://").ok_or_else(|| {
            Failure::new(format!(
                "REDIS_URL must start with redis:// (got `{}`)",
                redact(url)
            ))
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        let (user, host_port) = match authority.rfind('@') {
            Some(i) => (&authority[..=i], &authority[i + 1..]),
            None => ("", authority),
        };
        if host_port.is_empty() {
            return Err(Failure::new("REDIS_URL names no host"));
        }
        let has_port = match host_port.rfind(':') {
            // `[::1]` alone has colons but no port after the bracket.
            Some(i) => !host_port[i..].contains(']'),
            None => false,
        };
        let upstream = if has_port {
            host_port.to_owned()
        } else {
            format!("{host_port}:6379")
        };
        Ok(UserUrl {
            upstream,
            scheme_and_user: format!("redis://{user}"),
            path: path.to_owned(),
        })
    }

    /// The URL that reaches the user's Redis through a forwarder at `addr`
    /// (credentials and database kept).
    pub(crate) fn through(&self, addr: SocketAddr) -> String {
        format!("{}{addr}{}", self.scheme_and_user, self.path)
    }
}

/// `url` without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_urls_keep_credentials_and_database() {
        let u = UserUrl::parse("redis://app:s3cret@db.internal:6380/2").expect("valid");
        assert_eq!(u.upstream, "db.internal:6380");
        let through = u.through(SocketAddr::from((Ipv4Addr::LOCALHOST, 4000)));
        assert_eq!(through, "redis://app:s3cret@127.0.0.1:4000/2");
        let u = UserUrl::parse("redis://localhost").expect("valid");
        assert_eq!(u.upstream, "localhost:6379");
        assert_eq!(
            u.through(SocketAddr::from((Ipv4Addr::LOCALHOST, 1))),
            "redis://127.0.0.1:1/"
        );
        assert_eq!(
            UserUrl::parse("redis://[::1]").expect("valid").upstream,
            "[::1]:6379"
        );
        assert!(UserUrl::parse("rediss://h:1/").is_err());
        assert!(UserUrl::parse("http://h:1/").is_err());
        assert!(UserUrl::parse("redis:///").is_err());
        assert_eq!(redact("redis://u:p@h:1/"), "redis://***@h:1/");
    }
}
