//! A TCP proxy in front of a redis server whose behaviour can be switched at run time.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};

/// How long [`FaultProxy::set`] waits for a fault to take effect, and how long
/// the proxy keeps trying to re-bind its port after [`Fault::Refuse`].
const APPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// What the proxy does to traffic. Changes apply to existing connections too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Forward everything untouched.
    #[default]
    None,
    /// Delay every chunk, in each direction, by this long (order is kept, so a
    /// request/reply round trip takes at least twice this).
    Latency(Duration),
    /// Keep sockets open and read from them, but forward nothing either way:
    /// the client sees a hung server. New connections are accepted and hang too.
    Blackhole,
    /// Close every connection and stop listening, so new connects are refused.
    /// Switching to any other fault listens again on the same port.
    Refuse,
    /// Reset (TCP RST) every existing connection, and every new one right after accept.
    Reset,
    /// Forward requests to the server but swallow its replies: commands run,
    /// the client never hears back.
    DropReplies,
}

impl Fault {
    fn kills_connections(self) -> bool {
        matches!(self, Fault::Refuse | Fault::Reset)
    }
}

/// The current fault and a generation number bumped on every [`FaultProxy::set`].
type State = (Fault, u64);

#[derive(Debug, Default)]
struct Counters {
    /// Connections accepted so far.
    accepted: AtomicU64,
    /// Connections currently being relayed.
    live: AtomicUsize,
    /// Latest generation the accept loop has acted on.
    applied: AtomicU64,
    /// Bytes read from clients, whatever the fault then did with them.
    client_bytes: AtomicU64,
}

/// An in-process TCP proxy for fault injection between a client and a redis
/// server: on a free `127.0.0.1` port ([`start`](Self::start)) or on a given
/// address ([`listen`](Self::listen), which the chaos suite's proxy container uses).
///
/// It runs on its own small tokio runtime, so it keeps working whatever the
/// test's runtime does (current-thread, blocked, paused clock), and
/// [`set`](Self::set) can wait until a fault has fully taken effect. Dropping
/// the proxy stops all its tasks and closes every connection.
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: Arc<str>,
    state: watch::Sender<State>,
    counters: Arc<Counters>,
    runtime: Option<Runtime>,
}

impl FaultProxy {
    /// Starts a pass-through proxy to `upstream`, listening on a free loopback port.
    /// Panics if it cannot (a test cannot go on without it).
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        FaultProxy::listen((Ipv4Addr::LOCALHOST, 0).into(), &upstream.to_string())
            .expect("cannot start the fault proxy on 127.0.0.1")
    }

    /// Starts a pass-through proxy listening on `addr` (port 0: a free one) to
    /// `upstream`, a `host:port` looked up again for every connection, so a
    /// server that comes back at another address is found.
    pub fn listen(addr: SocketAddr, upstream: &str) -> io::Result<FaultProxy> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fault-proxy")
            .enable_all()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let upstream: Arc<str> = upstream.into();
        let (state, rx) = watch::channel((Fault::None, 0));
        let counters = Arc::new(Counters::default());
        runtime.spawn(accept_loop(
            listener,
            Arc::clone(&upstream),
            rx,
            Arc::clone(&counters),
        ));
        Ok(FaultProxy {
            addr,
            upstream,
            state,
            counters,
            runtime: Some(runtime),
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection URL for clients, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// The server the proxy forwards to, as given (`host:port`).
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// The fault currently in force.
    pub fn fault(&self) -> Fault {
        self.state.borrow().0
    }

    /// How many client connections the proxy has accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// Bytes clients have sent the proxy so far (forwarded or not): what a
    /// client said to Redis, or tried to.
    pub fn bytes_from_clients(&self) -> u64 {
        self.counters.client_bytes.load(Ordering::SeqCst)
    }

    /// Switches the fault and blocks (briefly: milliseconds) until it is in
    /// force: the listener is closed or re-bound as needed and, for
    /// [`Fault::Refuse`] and [`Fault::Reset`], every existing connection is gone.
    /// Panics if that takes more than 5 s.
    pub fn set(&self, fault: Fault) {
        if let Err(e) = self.try_set(fault) {
            panic!("{e}");
        }
    }

    /// [`set`](Self::set), returning an error instead of panicking when the
    /// fault is not in force within 5 s.
    pub fn try_set(&self, fault: Fault) -> Result<(), String> {
        let mut generation = 0;
        self.state.send_modify(|state| {
            state.0 = fault;
            state.1 += 1;
            generation = state.1;
        });
        let deadline = Instant::now() + APPLY_TIMEOUT;
        loop {
            let listener_ok = self.counters.applied.load(Ordering::SeqCst) >= generation;
            let conns_ok =
                !fault.kills_connections() || self.counters.live.load(Ordering::SeqCst) == 0;
            if listener_ok && conns_ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "fault proxy on {} did not apply {fault:?} within {APPLY_TIMEOUT:?}",
                    self.addr
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("fault", &self.fault())
            .field("connections_accepted", &self.connections_accepted())
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Drops every task, and with them every socket. Safe inside async code.
            runtime.shutdown_background();
        }
    }
}

async fn accept_loop(
    first: TcpListener,
    upstream: Arc<str>,
    mut rx: watch::Receiver<State>,
    counters: Arc<Counters>,
) {
    let addr = first.local_addr().expect("proxy listener has an address");
    let mut listener = Some(first);
    loop {
        let (fault, generation) = *rx.borrow_and_update();
        if fault == Fault::Refuse {
            listener = None;
        } else if listener.is_none() {
            listener = Some(rebind(addr).await);
        }
        counters.applied.store(generation, Ordering::SeqCst);

        let Some(current) = &listener else {
            if rx.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            accepted = current.accept() => {
                if let Ok((client, _)) = accepted {
                    counters.accepted.fetch_add(1, Ordering::SeqCst);
                    let fault = rx.borrow().0;
                    match fault {
                        Fault::Reset => reset(client),
                        Fault::Refuse => drop(client),
                        _ => {
                            counters.live.fetch_add(1, Ordering::SeqCst);
                            tokio::spawn(relay(client, Arc::clone(&upstream), rx.clone(), Arc::clone(&counters)));
                        }
                    }
                }
            }
        }
    }
}

/// Listens on `addr` again, retrying while the port is still busy.
async fn rebind(addr: SocketAddr) -> TcpListener {
    let deadline = Instant::now() + APPLY_TIMEOUT;
    loop {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        };
        let attempt = socket.and_then(|socket| {
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        });
        match attempt {
            Ok(listener) => return listener,
            Err(e) if Instant::now() >= deadline => {
                panic!("fault proxy cannot re-bind {addr}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Closes `stream` with a TCP RST instead of a FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Decrements the live-connection count when a relay task ends or is dropped.
struct LiveGuard(Arc<Counters>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn relay(
    mut client: TcpStream,
    upstream: Arc<str>,
    rx: watch::Receiver<State>,
    counters: Arc<Counters>,
) {
    let _live = LiveGuard(Arc::clone(&counters));
    let server = tokio::select! {
        server = TcpStream::connect(&*upstream) => server.ok(),
        () = killed(rx.clone()) => None,
    };
    if let Some(mut server) = server {
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        tokio::select! {
            () = pump(client_read, server_write, Some(&counters.client_bytes), &rx) => {}
            () = pump(server_read, client_write, None, &rx) => {}
            () = killed(rx.clone()) => {}
        }
    }
    if rx.borrow().0 == Fault::Reset {
        reset(client);
    }
}

/// Resolves once the fault is one that ends connections (or the proxy is gone).
async fn killed(mut rx: watch::Receiver<State>) {
    while !rx.borrow_and_update().0.kills_connections() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Copies chunks from `from` to `to`, applying the fault in force when each
/// chunk arrives. A delayed chunk is held back by its own delay from its
/// arrival, not behind the chunks before it: requests sent one after another
/// overlap on their way, as on a link whose latency is not its bandwidth.
/// `from_client` counts the bytes read from a client; `None` for the
/// server's side.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    from_client: Option<&AtomicU64>,
    rx: &watch::Receiver<State>,
) {
    let to_client = from_client.is_none();
    let (tx, mut due) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Some(counted) = from_client {
                counted.fetch_add(n as u64, Ordering::SeqCst);
            }
            let now = tokio::time::Instant::now();
            let at = match rx.borrow().0 {
                Fault::None => now,
                Fault::Latency(delay) => now + delay,
                Fault::Blackhole => continue,
                Fault::DropReplies if to_client => continue,
                Fault::DropReplies => now,
                Fault::Refuse | Fault::Reset => return,
            };
            if tx.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    // Ends when the reader has ended and what it passed on is written.
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            // A timer, even one already due, waits for the timer wheel's
            // next tick (a millisecond): none for a chunk not delayed.
            if at > tokio::time::Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(read, write);
}
