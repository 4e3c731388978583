//! One connection type for one server or a Redis Cluster, and the Cluster's
//! hash slots.
//!
//! On a Cluster the tier routes each call itself: one reconnecting
//! connection per master, chosen by the slot map of `nodes.rs`, with
//! `MOVED` and `ASK` followed once. (redis-rs's cluster client was used
//! first; while it rebuilds its slot map it holds every request, those for
//! healthy masters too, behind one lock while it reconnects to each node,
//! the dead one included, so one failed master slowed every key.)
//!
//! A Cluster runs a script only when all of its keys are in one hash slot.
//! Every check's keys share its user key's hash tag, so one check is one
//! slot; what carries several user keys (a batch, `check_many`, a reconcile
//! pipeline) is split by [`key_slot`] in Cluster mode, and left whole on
//! one server.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
#[cfg(test)]
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Script, Value};

#[cfg(feature = "cluster")]
pub(crate) use router::{ClusterConn, NodeClients};

#[cfg(feature = "cluster")]
mod router;

/// How many hash slots a Redis Cluster has.
pub(crate) const SLOTS: u16 = 16384;

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of
/// the key modulo 16384, or of its hash tag only, the part between the first
/// `{` and the first `}` after it, when that part is not empty.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// The hash slot of every storage key of a check of `escaped_key` (an
/// [`escape_key`](tierlimit_core::escape_key) result, never empty and free of
/// braces, so it is the whole hash tag of `tl:{<escaped_key>}:...`).
pub(crate) fn check_slot(escaped_key: &str) -> u16 {
    crc16(escaped_key.as_bytes()) % SLOTS
}

/// CRC16-CCITT as Redis Cluster uses it (XMODEM: polynomial 0x1021, initial
/// value 0, no reflection, no final xor).
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (0..8).fold(crc ^ (u16::from(b) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

/// The connection the tier uses: redis-rs's reconnecting manager for one
/// server, or the tier's own Cluster connection (see [`ClusterConn`]).
/// Cloning shares it.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(ClusterConn),
}

impl Conn {
    /// This connection, its calls sent on a Cluster to the master of `slot`
    /// (on one server, unchanged).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) fn at(self, slot: u16) -> Conn {
        match self {
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => Conn::Cluster(conn.at(slot)),
            single => single,
        }
    }

    /// On a Cluster, drops the connection to master `addr` (see
    /// [`ClusterConn::forget`]).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) fn forget(&self, addr: &str) {
        #[cfg(feature = "cluster")]
        if let Conn::Cluster(conn) = self {
            conn.forget(addr);
        }
    }

    /// Sends one command and answers its reply, an error reply as a value.
    /// On one server through the manager's own method: the trait's would box
    /// its future, one allocation more per check.
    pub(crate) async fn send_packed_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(conn) => conn.send_packed_command(cmd).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.send(cmd).await,
        }
    }

    /// Sends the commands of `pipe` and answers one reply per command.
    pub(crate) async fn send_packed_commands(
        &mut self,
        pipe: &Pipeline,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.send_packed_commands(pipe, 0, pipe.len()).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.send_pipeline(pipe).await,
        }
    }

    /// Asks one node for `PONG`: the server, or on a Cluster the master of
    /// `slot`, else any master that is not down.
    pub(crate) async fn ping(self, slot: Option<u16>) -> RedisResult<()> {
        let mut conn = match slot {
            Some(slot) => self.at(slot),
            None => self,
        };
        conn.send_packed_command(&redis::cmd("PING"))
            .await?
            .extract_error()
            .map(drop)
    }

    /// Loads `script` where the command that met `NOSCRIPT` ran: on one
    /// server, there; on a Cluster, on the master of `slot` (the node that
    /// answered, unless the slot moved meanwhile; then the retried command
    /// meets `NOSCRIPT` again and fails as a Redis fault, and the next call
    /// loads it on the new master). Without a slot, on every master.
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) async fn load_script(
        &mut self,
        script: &Script,
        slot: Option<u16>,
    ) -> RedisResult<()> {
        match self {
            Conn::Single(conn) => script.load_async(conn).await.map(drop),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => {
                let Some(source) = crate::script::source_of(script) else {
                    return script.load_async(conn).await.map(drop);
                };
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(source);
                let reply = match slot {
                    Some(slot) => conn.clone().at(slot).send(&load).await?,
                    None => conn.send_to_every_master(&load).await?,
                };
                reply.extract_error().map(drop)
            }
        }
    }

    /// Loads the Functions library ([`LIBRARY`](crate::script::LIBRARY)) where
    /// a call met `Function not found`, as [`load_script`](Self::load_script)
    /// loads a script: on one server, there; on a Cluster, on the master of
    /// `slot` (every master without a slot). Answers the server's reply, an
    /// error reply as a value (the caller tells "already loaded" and "not
    /// allowed" apart).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) async fn load_library(&mut self, slot: Option<u16>) -> RedisResult<Value> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(&crate::script::LIBRARY.source);
        match self {
            Conn::Single(conn) => conn.send_packed_command(&load).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => match slot {
                Some(slot) => conn.clone().at(slot).send(&load).await,
                None => conn.send_to_every_master(&load).await,
            },
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// How the tier makes its connections.
// One per tier, never moved about: the size of the one-server variant costs
// nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
    },
    #[cfg(feature = "cluster")]
    Cluster(std::sync::Arc<NodeClients>),
}

impl Backend {
    /// A connection that connects on its first command (no I/O here); on a
    /// Cluster, routed by `nodes`.
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) fn connect_lazy(
        &self,
        nodes: &std::sync::Arc<crate::nodes::Nodes>,
    ) -> RedisResult<Conn> {
        match self {
            Backend::Single { client, config } => {
                ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    .map(Conn::Single)
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(clients) => Ok(Conn::Cluster(ClusterConn::new(
                std::sync::Arc::clone(nodes),
                std::sync::Arc::clone(clients),
            ))),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        !matches!(self, Backend::Single { .. })
    }

    /// Where it connects, without credentials.
    pub(crate) fn addr(&self) -> String {
        match self {
            Backend::Single { client, .. } => client.get_connection_info().addr().to_string(),
            #[cfg(feature = "cluster")]
            Backend::Cluster(clients) => format!("cluster of {}", clients.seeds().join(",")),
        }
    }
}

/// The seed nodes of a `redis+cluster://` URL: every node's URL is
/// `{prefix}{host:port}{tail}`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Seeds {
    /// `redis://` or `rediss://`, and the credentials with their `@`.
    pub(crate) prefix: String,
    /// `host:port` of each seed, as the URL gave them.
    pub(crate) hosts: Vec<String>,
    /// The path and query after the hosts.
    pub(crate) tail: String,
}

impl Seeds {
    /// Each seed's own URL (what the Cluster backend connects to).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn urls(&self) -> Vec<String> {
        self.hosts
            .iter()
            .map(|host| format!("{}{host}{}", self.prefix, self.tail))
            .collect()
    }
}

/// The seed nodes of a `redis+cluster://` (or `rediss+cluster://`) URL, each
/// reached as a `redis://` (or `rediss://`) URL with the same credentials,
/// path and query; `Ok(None)` for any other scheme. `Err` says what is
/// wrong, in words that never contain the URL's credentials.
///
/// `redis+cluster://user:pass@host1:7000,host2:7001/` seeds
/// `redis://user:pass@host1:7000/` and `redis://user:pass@host2:7001/`.
pub(crate) fn seed_urls(url: &str) -> Result<Option<Seeds>, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let node_scheme = if scheme.eq_ignore_ascii_case("redis+cluster") {
        "redis"
    } else if scheme.eq_ignore_ascii_case("rediss+cluster") {
        "rediss"
    } else {
        return Ok(None);
    };
    // The credentials end at the last `@` (a password may hold `/` or `@`
    // unencoded, as `redact_url` assumes too).
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let hosts_end = after.find(['/', '?']).unwrap_or(after.len());
    let (hosts, tail) = after.split_at(hosts_end);
    if hosts.is_empty() {
        return Err("a cluster URL needs at least one seed node (host:port)".into());
    }
    let hosts = hosts
        .split(',')
        .enumerate()
        .map(|(i, host)| {
            if host.trim().is_empty() {
                Err(format!("seed node {} of the cluster URL is empty", i + 1))
            } else if host.contains(char::is_whitespace) {
                Err(format!(
                    "seed node {} of the cluster URL holds a space",
                    i + 1
                ))
            } else {
                Ok(host.to_string())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Seeds {
        prefix: format!("{node_scheme}://{userinfo}"),
        hosts,
        tail: tail.to_string(),
    }))
}

/// Runs every future of `futures` at once on this task and answers their
/// outputs in order (the few slot groups of one call: no task spawned, so
/// they may borrow).
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// The indexes of `items` grouped by the slot `slot_of` gives each, groups in
/// order of their first item, items in order within a group.
pub(crate) fn group_by_slot<T>(items: &[T], slot_of: impl Fn(&T) -> u16) -> Vec<(u16, Vec<usize>)> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let slot = slot_of(item);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known slots from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    #[test]
    fn slots_match_redis() {
        assert_eq!(crc16(b"123456789"), 0x31C3, "the spec's CRC16 check value");
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
    }

    /// The hash tag rules: the first `{`, the first `}` after it, and an
    /// empty tag hashes the whole key.
    #[test]
    fn hash_tags_follow_the_spec() {
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{bar"), crc16(b"foo{bar") % SLOTS);
        assert_eq!(key_slot(b"}foo{bar}"), key_slot(b"bar"));
    }

    /// A check's slot is its storage keys' slot, and a marker key built on a
    /// storage key shares it.
    #[test]
    fn a_check_is_one_slot() {
        let set = tierlimit_core::RuleSet::new(
            "s",
            [
                tierlimit_core::Rule::per_second(1).expect("valid"),
                tierlimit_core::Rule::per_hour(9).expect("valid"),
            ],
        )
        .expect("valid");
        for key in ["user:1", "a{b}c", "{}", "}{", "%7B"] {
            let escaped = tierlimit_core::escape_key(key);
            let slot = check_slot(&escaped);
            for i in 0..2 {
                let storage = set.storage_key(&escaped, i);
                assert_eq!(key_slot(storage.as_bytes()), slot, "{key}");
                let marker = format!("{storage}:rc:batch{{x}}");
                assert_eq!(key_slot(marker.as_bytes()), slot, "{key}");
            }
        }
    }

    #[test]
    fn seed_urls_keep_credentials_path_and_query() {
        assert_eq!(seed_urls("redis://h:1/"), Ok(None));
        let urls = |url| seed_urls(url).map(|seeds| seeds.map(|s| s.urls()));
        assert_eq!(
            urls("redis+cluster://u:p@a:7000,b:7001/?protocol=resp3"),
            Ok(Some(vec![
                "redis://u:p@a:7000/?protocol=resp3".to_string(),
                "redis://u:p@b:7001/?protocol=resp3".to_string(),
            ]))
        );
        assert_eq!(
            urls("REDISS+CLUSTER://a:1"),
            Ok(Some(vec!["rediss://a:1".to_string()]))
        );
        for bad in [
            "redis+cluster:///",
            "redis+cluster://",
            "redis+cluster://a:1,,b:2/",
            "redis+cluster://u:secret@/",
            "redis+cluster://a:1, b:2/",
        ] {
            let err = seed_urls(bad).expect_err(bad);
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn groups_keep_order() {
        let groups = group_by_slot(&[5u16, 7, 5, 9, 7], |s| *s);
        assert_eq!(groups, vec![(5, vec![0, 2]), (7, vec![1, 4]), (9, vec![3])]);
    }

    #[tokio::test]
    async fn join_all_answers_in_order() {
        let slow = |ms: u64, v: u32| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            v
        };
        let out = join_all(vec![slow(20, 1), slow(0, 2), slow(10, 3)]).await;
        assert_eq!(out, vec![1, 2, 3]);
    }
}
