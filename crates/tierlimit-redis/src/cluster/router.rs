//! The Cluster connection: one reconnecting connection per master, each call
//! sent to the master its slot map names for the call's slot.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value};

use crate::nodes::Nodes;

/// How to connect to any node of one Cluster: the seed URL's scheme,
/// credentials, path and query around each node's `host:port`, the TLS
/// certificates, and the connection settings every node gets.
pub(crate) struct NodeClients {
    /// `redis://user:pass@` (or `rediss://...`).
    prefix: String,
    /// What followed the hosts: `/db?query`, or nothing.
    tail: String,
    /// `host:port` of each seed node.
    seeds: Vec<String>,
    config: ConnectionManagerConfig,
    #[cfg(feature = "tls")]
    certificates: Option<redis::TlsCertificates>,
    /// Turns of [`any_seed`](Self::any_seed).
    turn: AtomicUsize,
}

impl NodeClients {
    /// The clients of `seeds` (`host:port`), each reached as
    /// `{prefix}{host:port}{tail}`. Makes a client of every seed (no I/O), so a
    /// URL or certificate the redis crate refuses is refused here.
    pub(crate) fn new(
        prefix: String,
        seeds: Vec<String>,
        tail: String,
        config: ConnectionManagerConfig,
        #[cfg(feature = "tls")] certificates: Option<redis::TlsCertificates>,
    ) -> RedisResult<NodeClients> {
        let clients = NodeClients {
            prefix,
            tail,
            seeds,
            config,
            #[cfg(feature = "tls")]
            certificates,
            turn: AtomicUsize::new(0),
        };
        for seed in &clients.seeds {
            clients.client(seed)?;
        }
        Ok(clients)
    }

    /// `host:port` of every seed node.
    pub(crate) fn seeds(&self) -> &[String] {
        &self.seeds
    }

    /// One seed, another at each call.
    fn any_seed(&self) -> &str {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        self.seeds
            .get(turn % self.seeds.len().max(1))
            .map_or("", String::as_str)
    }

    fn client(&self, addr: &str) -> RedisResult<redis::Client> {
        let info = format!("{}{addr}{}", self.prefix, self.tail)
            .into_connection_info()?
            .set_tcp_settings(TcpSettings::default().set_nodelay(true));
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            return redis::Client::build_with_tls(info, certificates.clone());
        }
        redis::Client::open(info)
    }

    /// A connection to `addr` that connects on its first command.
    fn connect(&self, addr: &str) -> RedisResult<ConnectionManager> {
        ConnectionManager::new_lazy_with_config(self.client(addr)?, self.config.clone())
    }
}

/// The connections of one [`ClusterConn`] and its clones.
struct Router {
    nodes: Arc<Nodes>,
    clients: Arc<NodeClients>,
    /// By `host:port`; copied on write (a new node, a forgotten one), read
    /// without a lock by every call.
    conns: ArcSwap<HashMap<String, ConnectionManager>>,
}

impl Router {
    /// The connection to `addr`, made now (lazily) if there is none.
    fn conn_for(&self, addr: &str) -> RedisResult<ConnectionManager> {
        if let Some(conn) = self.conns.load().get(addr) {
            return Ok(conn.clone());
        }
        let fresh = self.clients.connect(addr)?;
        // Another call may have raced us here: keep whichever came first.
        let map = self.conns.rcu(|conns| {
            let mut conns = HashMap::clone(conns);
            conns
                .entry(addr.to_string())
                .or_insert_with(|| fresh.clone());
            conns
        });
        Ok(map.get(addr).cloned().unwrap_or(fresh))
    }
}

/// A Cluster connection, sending its calls to the master of the slot it is
/// [`at`](Self::at), else to any master that is not down. Cloning shares the
/// connections.
#[derive(Clone)]
pub(crate) struct ClusterConn {
    router: Arc<Router>,
    slot: Option<u16>,
}

/// Where a node sent a call that is not its own.
enum Redirect {
    /// The slot (when the reply could be read) lives on this node now.
    Moved(Option<u16>, String),
    /// The slot is moving: ask this node, once, after `ASKING`.
    Ask(String),
}

impl Redirect {
    /// The redirect of an error reply `<MOVED|ASK> <slot> <host:port>`.
    fn of(reply: &Value) -> Option<Redirect> {
        let Value::ServerError(e) = reply else {
            return None;
        };
        let mut details = e.details()?.split_whitespace();
        let slot = details.next().and_then(|slot| slot.parse().ok());
        let to = details.next()?.to_string();
        match e.kind()? {
            ServerErrorKind::Moved => Some(Redirect::Moved(slot, to)),
            ServerErrorKind::Ask => Some(Redirect::Ask(to)),
            _ => None,
        }
    }
}

impl ClusterConn {
    /// A connection to the Cluster `clients` reach, routed by `nodes`'s map;
    /// no I/O until its first call.
    pub(crate) fn new(nodes: Arc<Nodes>, clients: Arc<NodeClients>) -> ClusterConn {
        ClusterConn {
            router: Arc::new(Router {
                nodes,
                clients,
                conns: ArcSwap::from_pointee(HashMap::new()),
            }),
            slot: None,
        }
    }

    /// This connection with its calls sent to the master of `slot`.
    pub(crate) fn at(mut self, slot: u16) -> ClusterConn {
        self.slot = Some(slot);
        self
    }

    /// Drops the connection to `addr`: its next call connects afresh (a
    /// socket that lived through a hung node may hold requests that will
    /// never be answered).
    pub(crate) fn forget(&self, addr: &str) {
        if self.router.conns.load().contains_key(addr) {
            self.router.conns.rcu(|conns| {
                let mut conns = HashMap::clone(conns);
                conns.remove(addr);
                conns
            });
        }
    }

    /// The connection this call goes through: the master of the slot, else
    /// (no slot, or no map yet) any master that is not down, else a seed.
    fn conn(&self) -> RedisResult<ConnectionManager> {
        let router = &self.router;
        if let Some(slot) = self.slot
            && let Some(conn) = router.nodes.with_master(slot, |addr| router.conn_for(addr))
        {
            return conn;
        }
        match router.nodes.any_master(router.nodes.now_us()) {
            Some(addr) => router.conn_for(&addr),
            None => router.conn_for(router.clients.any_seed()),
        }
    }

    /// Sends `cmd` and answers its reply, an error reply as a value; a
    /// `MOVED` or `ASK` reply is followed once.
    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let reply = self.conn()?.send_packed_command(cmd).await?;
        let Some(redirect) = Redirect::of(&reply) else {
            return Ok(reply);
        };
        match redirect {
            Redirect::Moved(slot, addr) => {
                self.router.nodes.moved(slot, &addr);
                self.router.conn_for(&addr)?.send_packed_command(cmd).await
            }
            Redirect::Ask(addr) => {
                let mut asking = Pipeline::with_capacity(2);
                asking.add_command(redis::cmd("ASKING"));
                asking.add_command(cmd.clone());
                let mut replies = self
                    .router
                    .conn_for(&addr)?
                    .send_packed_commands(&asking, 0, 2)
                    .await?;
                Ok(replies.pop().unwrap_or(Value::Nil))
            }
        }
    }

    /// Sends the commands of `pipe` (all of one slot) and answers one reply
    /// per command; the commands a node redirected are sent, once, where it
    /// said, and their replies take the redirects' places.
    pub(crate) async fn send_pipeline(&self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        let mut replies = self
            .conn()?
            .send_packed_commands(pipe, 0, pipe.len())
            .await?;
        let redirected: Vec<(usize, Redirect)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, reply)| Redirect::of(reply).map(|r| (i, r)))
            .collect();
        let Some((_, first)) = redirected.first() else {
            return Ok(replies);
        };
        // One slot, so one place for all of them.
        let (addr, asking) = match first {
            Redirect::Moved(slot, addr) => {
                self.router.nodes.moved(*slot, addr);
                (addr.clone(), false)
            }
            Redirect::Ask(addr) => (addr.clone(), true),
        };
        let commands: Vec<&Cmd> = pipe.cmd_iter().collect();
        let mut again = Pipeline::with_capacity(redirected.len() * (1 + usize::from(asking)));
        for (i, _) in &redirected {
            if asking {
                again.add_command(redis::cmd("ASKING"));
            }
            again.add_command(commands[*i].clone());
        }
        let answers = self
            .router
            .conn_for(&addr)?
            .send_packed_commands(&again, 0, again.len())
            .await?;
        let step = 1 + usize::from(asking);
        for ((i, _), answer) in redirected
            .iter()
            .zip(answers.into_iter().skip(step - 1).step_by(step))
        {
            replies[*i] = answer;
        }
        Ok(replies)
    }

    /// Sends `cmd` to every master (the seeds before the map is known) at
    /// once; answers the first error reply or failure, else the last reply.
    pub(crate) async fn send_to_every_master(&self, cmd: &Cmd) -> RedisResult<Value> {
        let mut masters = self.router.nodes.masters();
        if masters.is_empty() {
            masters = self.router.clients.seeds().to_vec();
        }
        let sends = masters
            .iter()
            .map(|addr| async move { self.router.conn_for(addr)?.send_packed_command(cmd).await })
            .collect();
        let mut last = Ok(Value::Nil);
        for outcome in super::join_all(sends).await {
            match outcome {
                Ok(Value::ServerError(e)) => return Ok(Value::ServerError(e)),
                Err(e) => return Err(e),
                ok => last = ok,
            }
        }
        last
    }
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            if offset == 0 && count == pipeline.len() {
                return self.send_pipeline(pipeline).await;
            }
            // A transaction's replies (redis-rs skips the queued ones):
            // sent where the slot lives, no redirect followed.
            self.conn()?
                .req_packed_commands(pipeline, offset, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
