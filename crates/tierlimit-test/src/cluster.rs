//! A real Redis Cluster of `redis-server` children: 3 masters and 3 replicas
//! on free loopback ports, joined by `redis-cli --cluster create`.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::RedisServer;
use crate::server::{TestCa, free_port};

const MASTERS: usize = 3;
/// How long a node may be unreachable before the others fail it over. Short,
/// so failover tests finish in seconds.
const NODE_TIMEOUT_MS: &str = "1000";
/// How long a master waits before it sends a replica its first full copy.
/// Redis' default, 5 s (to let more replicas join one transfer), held every
/// cluster's start 4 s longer, as [`wait_cluster_ready`] waits for the copies;
/// each master here has one replica.
const REPL_DISKLESS_SYNC_DELAY_S: &str = "0";
const SERVING_TIMEOUT: Duration = Duration::from_secs(30);
const CLI_NOT_FOUND: &str = "redis-cli not found on PATH: install it with \
    `sudo apt-get install -y redis-tools` (Debian/Ubuntu; redis-server's package \
    pulls it in) or run scripts/test, which installs it";

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's id.
    pub id: String,
    /// Its client address, `host:port`, as the cluster announces it.
    pub addr: String,
    /// Its client port.
    pub port: u16,
    /// True for a master, false for a replica.
    pub master: bool,
    /// The id of its master, for a replica.
    pub master_id: Option<String>,
    /// True when the others consider it failed (`fail` or `fail?`).
    pub failed: bool,
}

/// A Redis Cluster of three masters, each with one replica, every node a
/// [`RedisServer`] child on its own loopback port (its cluster bus on
/// another free port). Killed with its nodes when dropped.
///
/// [`start`](Self::start) returns once every one of the 16384 slots is served
/// and every node agrees the cluster is `ok`. Nodes are addressed by index
/// (0 to 5, in start order); which are masters changes with failovers, so ask
/// [`topology`](Self::topology), [`master_of`](Self::master_of) or
/// [`replica_of`](Self::replica_of).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// For a cluster started by [`start_tls`](RedisCluster::start_tls): its
    /// CA and each node's TLS port, by node index.
    tls: Option<(TestCa, Vec<u16>)>,
}

impl RedisCluster {
    /// Starts six nodes and joins them as 3 masters + 3 replicas; panics with
    /// what went wrong when it cannot.
    pub fn start() -> RedisCluster {
        RedisCluster::start_as(None)
    }

    /// [`start`](Self::start), every node also serving TLS clients on a port
    /// of its own (with a certificate for `127.0.0.1` signed by one CA made
    /// for the cluster, [`tls_ca_pem`](Self::tls_ca_pem)), and speaking TLS
    /// on the cluster bus and for replication. The harness keeps using each
    /// node's plain port; [`tls_cluster_url`](Self::tls_cluster_url) names
    /// the TLS ones.
    pub fn start_tls() -> RedisCluster {
        RedisCluster::start_as(Some(TestCa::new()))
    }

    fn start_as(ca: Option<TestCa>) -> RedisCluster {
        let (nodes, tls_ports): (Vec<RedisServer>, Vec<Option<u16>>) = (0..MASTERS * 2)
            .map(|_| {
                RedisServer::start_each(
                    || {
                        let mut args: Vec<String> = [
                            "--cluster-enabled",
                            "yes",
                            "--cluster-node-timeout",
                            NODE_TIMEOUT_MS,
                            "--repl-diskless-sync-delay",
                            REPL_DISKLESS_SYNC_DELAY_S,
                            "--cluster-port",
                            &free_port().to_string(),
                        ]
                        .map(String::from)
                        .to_vec();
                        let tls_port = ca.as_ref().map(|ca| {
                            let port = free_port();
                            args.extend(ca.cluster_node_args(port));
                            port
                        });
                        (args, tls_port)
                    },
                    None,
                )
            })
            .unzip();
        let tls_ports: Vec<u16> = tls_ports.into_iter().flatten().collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        if let Err(e) = create_cluster(&addrs) {
            panic!("{e}");
        }
        if let Err(e) = wait_cluster_ready(&addrs, SERVING_TIMEOUT) {
            panic!("{e}");
        }
        RedisCluster {
            nodes,
            tls: ca.map(|ca| (ca, tls_ports)),
        }
    }

    /// The `rediss+cluster://` URL of a cluster started by
    /// [`start_tls`](Self::start_tls), every node's TLS port a seed; panics
    /// for a cluster without TLS.
    pub fn tls_cluster_url(&self) -> String {
        let (_, ports) = self.tls.as_ref().expect("a cluster started by start_tls");
        let seeds: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("rediss+cluster://{}/", seeds.join(","))
    }

    /// The PEM of the CA that signed the nodes' certificates, for a cluster
    /// started by [`start_tls`](Self::start_tls).
    pub fn tls_ca_pem(&self) -> Option<&[u8]> {
        self.tls.as_ref().map(|(ca, _)| ca.ca_pem())
    }

    /// The nodes, by index.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `index`, to kill, pause or resume it.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// `redis://127.0.0.1:<port>/` of every node: seed URLs for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Sets `cluster-require-full-coverage no` on every node, as tierlimit's
    /// README asks: the masters go on serving their slots while another
    /// master's have none (Redis's default stops them all). Panics when a
    /// node refuses.
    pub async fn serve_partial_coverage(&self) {
        for node in &self.nodes {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-require-full-coverage")
                .arg("no")
                .query_async(&mut node.conn().await)
                .await
                .expect("CONFIG SET cluster-require-full-coverage no");
        }
    }

    /// The `redis+cluster://` URL tierlimit takes for this cluster, every
    /// node a seed.
    pub fn cluster_url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}/", seeds.join(","))
    }

    /// `per_master` user keys `<prefix><n>` on each of the three masters,
    /// placed by the slot of `storage_key(user key)` (a real storage key of
    /// the rule set they are checked with); master index to its keys.
    /// Panics unless there are three masters and each got its keys.
    pub fn keys_on_every_master(
        &self,
        prefix: &str,
        per_master: usize,
        storage_key: impl Fn(&str) -> String,
    ) -> std::collections::BTreeMap<usize, Vec<String>> {
        let mut masters: Vec<usize> = self
            .topology()
            .iter()
            .filter(|(_, n)| n.master && !n.failed)
            .map(|(i, _)| *i)
            .collect();
        masters.sort_unstable();
        assert_eq!(masters.len(), 3, "three masters");
        let mut by_master: std::collections::BTreeMap<usize, Vec<String>> = Default::default();
        for n in 0..10_000 {
            let key = format!("{prefix}{n}");
            let keys = by_master
                .entry(self.master_of(&storage_key(&key)))
                .or_default();
            if keys.len() < per_master {
                keys.push(key);
            }
            if by_master.len() == 3 && by_master.values().all(|k| k.len() == per_master) {
                break;
            }
        }
        let found: Vec<usize> = by_master.keys().copied().collect();
        assert_eq!(found, masters, "keys on every master");
        assert!(by_master.values().all(|k| k.len() == per_master));
        by_master
    }

    /// The node listening on `port`, plain or TLS.
    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .or_else(|| {
                let (_, tls_ports) = self.tls.as_ref()?;
                tls_ports.iter().position(|&p| p == port)
            })
    }

    /// The first running, unpaused node; panics when none is.
    fn live(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.is_running() && !n.is_paused())
            .expect("no node of the cluster is running")
    }

    /// `CLUSTER NODES` as a live node sees it, by node index.
    pub fn topology(&self) -> HashMap<usize, ClusterNode> {
        cluster_nodes(&addr(self.live()))
            .expect("CLUSTER NODES on a live node")
            .into_iter()
            .filter_map(|node| self.index_of_port(node.port).map(|i| (i, node)))
            .collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`: hash tags count).
    pub fn slot(&self, key: &str) -> u16 {
        query_node(
            &addr(self.live()),
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
        .expect("CLUSTER KEYSLOT on a live node")
    }

    /// The index of the master serving `key`'s slot now, as a live node
    /// sees it.
    pub fn master_of(&self, key: &str) -> usize {
        let slot = self.slot(key);
        self.slot_masters()
            .into_iter()
            .find(|(range, _)| range.contains(&slot))
            .map(|(_, master)| master)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Every slot range with the index of its master (`CLUSTER SLOTS`, as a
    /// live node sees it).
    fn slot_masters(&self) -> Vec<(std::ops::RangeInclusive<u16>, usize)> {
        slot_masters(&addr(self.live()))
            .expect("CLUSTER SLOTS on a live node")
            .into_iter()
            .filter_map(|(range, master)| {
                let port = master.rsplit(':').next()?.parse().ok()?;
                Some((range, self.index_of_port(port)?))
            })
            .collect()
    }

    /// The index of the replica of master `master`, if it has one.
    pub fn replica_of(&self, master: usize) -> Option<usize> {
        let topology = self.topology();
        let id = topology.get(&master)?.id.clone();
        topology
            .into_iter()
            .find(|(_, n)| n.master_id.as_deref() == Some(id.as_str()))
            .map(|(i, _)| i)
    }

    /// Promotes replica `replica` with `CLUSTER FAILOVER` (a manual,
    /// coordinated failover: no write is lost) and waits until it is a master
    /// and every slot is served; panics if that takes over 30 s.
    pub fn failover(&self, replica: usize) {
        let _: String = query_node(
            &addr(&self.nodes[replica]),
            redis::cmd("CLUSTER").arg("FAILOVER"),
        )
        .expect("CLUSTER FAILOVER on a replica");
        let end = Instant::now() + SERVING_TIMEOUT;
        while !self.topology().get(&replica).is_some_and(|n| n.master) {
            assert!(
                Instant::now() < end,
                "node {replica} was not promoted within {SERVING_TIMEOUT:?}"
            );
            sleep(Duration::from_millis(20));
        }
        assert!(
            self.wait_serving(SERVING_TIMEOUT),
            "slots unserved after the failover"
        );
    }

    /// Waits until every running, unpaused node reports `cluster_state:ok`
    /// with all 16384 slots `ok`, and every slot's master is a running,
    /// unpaused node (so a killed master's slots have moved to its replica);
    /// false after `timeout`.
    pub fn wait_serving(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            let live: Vec<&RedisServer> = self
                .nodes
                .iter()
                .filter(|n| n.is_running() && !n.is_paused())
                .collect();
            let ok = live.iter().all(|node| cluster_ok(&addr(node)));
            let up = |i: usize| self.nodes[i].is_running() && !self.nodes[i].is_paused();
            if ok && !live.is_empty() {
                // One CLUSTER SLOTS read: every slot covered, each by a live master.
                let masters = self.slot_masters();
                let covered: usize = masters.iter().map(|(range, _)| range.len()).sum();
                if covered == 16384 && masters.iter().all(|(_, m)| up(*m)) {
                    return true;
                }
            }
            if Instant::now() >= end {
                return false;
            }
            sleep(Duration::from_millis(20));
        }
    }
}

/// `127.0.0.1:<port>` of one of this process's nodes.
fn addr(node: &RedisServer) -> String {
    format!("127.0.0.1:{}", node.port())
}

/// How long `redis-cli --cluster create` may take: it waits for ever for
/// nodes that cannot reach each other's cluster bus.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Joins fresh cluster-enabled nodes (`host:port` each, six for 3 masters and
/// 3 replicas) with `redis-cli --cluster create ... --cluster-replicas 1
/// --cluster-yes`; an error says what went wrong (redis-cli missing, its
/// output, or that it did not finish within a minute).
pub fn create_cluster(addrs: &[String]) -> Result<(), String> {
    let child = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(CLI_NOT_FOUND.to_owned()),
        Err(e) => return Err(format!("cannot run redis-cli: {e}")),
    };
    // Read while it runs: a full pipe would stop it.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let end = Instant::now() + CREATE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < end => sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Err(e) => return Err(format!("waiting for redis-cli: {e}")),
        }
    };
    let output = format!(
        "{}{}",
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default()
    );
    match status {
        Some(status) if status.success() => Ok(()),
        Some(_) => Err(format!("redis-cli --cluster create failed: {output}")),
        None => Err(format!(
            "redis-cli --cluster create did not finish within {CREATE_TIMEOUT:?} (can the \
             nodes reach each other's cluster bus, port + 10000?); its output: {output}"
        )),
    }
}

/// Waits until a new cluster of 3 masters and 3 replicas at `addrs` is ready:
/// every node reports `cluster_state:ok` with all slots `ok`, every node sees
/// 3 masters and 3 replicas (a replica's role reaches the others by gossip a
/// moment after the slots are served), and every replica's link to its master
/// is up (its first sync done: a replica that never synced refuses to fail
/// over). An error after `timeout` says what was missing.
pub fn wait_cluster_ready(addrs: &[String], timeout: Duration) -> Result<(), String> {
    let end = Instant::now() + timeout;
    loop {
        let missing = cluster_not_ready(addrs);
        match missing {
            None => return Ok(()),
            Some(what) if Instant::now() >= end => {
                return Err(format!(
                    "the cluster was not ready within {timeout:?}: {what}"
                ));
            }
            Some(_) => sleep(Duration::from_millis(20)),
        }
    }
}

/// What a new cluster at `addrs` still lacks (see [`wait_cluster_ready`]).
fn cluster_not_ready(addrs: &[String]) -> Option<String> {
    for addr in addrs {
        if !cluster_ok(addr) {
            return Some(format!("{addr} does not report every slot ok"));
        }
        let nodes = cluster_nodes(addr).unwrap_or_default();
        let masters = nodes.iter().filter(|n| n.master).count();
        if (masters, nodes.len() - masters) != (MASTERS, MASTERS) {
            return Some(format!(
                "{addr} sees {masters} masters and {} replicas",
                nodes.len() - masters
            ));
        }
        let me = nodes.iter().find(|n| n.addr == *addr);
        if me.is_some_and(|n| !n.master) {
            let info: String =
                query_node(addr, redis::cmd("INFO").arg("replication")).unwrap_or_default();
            if !info.contains("master_link_status:up") {
                return Some(format!("replica {addr} has not synced with its master"));
            }
        }
    }
    None
}

/// Every node as the node at `addr` (`host:port`) sees it (`CLUSTER NODES`).
pub fn cluster_nodes(addr: &str) -> redis::RedisResult<Vec<ClusterNode>> {
    let text: String = query_node(addr, redis::cmd("CLUSTER").arg("NODES"))?;
    Ok(text.lines().filter_map(parse_node).collect())
}

/// Whether the node at `addr` reports `cluster_state:ok` with all 16384
/// slots `ok`.
pub fn cluster_ok(addr: &str) -> bool {
    query_node::<String>(addr, redis::cmd("CLUSTER").arg("INFO")).is_ok_and(|info| {
        info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
    })
}

/// Every slot range with its master's `host:port`, as the node at `addr`
/// sees it (`CLUSTER SLOTS`, which Redis 6 and 7 both answer).
pub fn slot_masters(
    addr: &str,
) -> redis::RedisResult<Vec<(std::ops::RangeInclusive<u16>, String)>> {
    let slots: redis::Value = query_node(addr, redis::cmd("CLUSTER").arg("SLOTS"))?;
    let redis::Value::Array(ranges) = slots else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "CLUSTER SLOTS is not an array",
        )));
    };
    let int = |v: Option<&redis::Value>| match v {
        Some(redis::Value::Int(n)) => u16::try_from(*n).ok(),
        _ => None,
    };
    let text = |v: Option<&redis::Value>| match v {
        Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Some(redis::Value::SimpleString(s)) => Some(s.clone()),
        _ => None,
    };
    Ok(ranges
        .iter()
        .filter_map(|range| {
            let redis::Value::Array(fields) = range else {
                return None;
            };
            let redis::Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let (start, end) = (int(fields.first())?, int(fields.get(1))?);
            let host = text(master.first())?;
            let port = int(master.get(1))?;
            Some((start..=end, format!("{host}:{port}")))
        })
        .collect())
}

/// One `CLUSTER NODES` line: `<id> <ip:port@bus> <flags> <master|-> ...`.
fn parse_node(line: &str) -> Option<ClusterNode> {
    let mut fields = line.split_whitespace();
    let id = fields.next()?.to_owned();
    let addr = fields.next()?.split('@').next()?.to_owned();
    let port = addr.rsplit(':').next()?.parse().ok()?;
    let flags: Vec<&str> = fields.next()?.split(',').collect();
    let master_id = fields.next().filter(|m| *m != "-").map(str::to_owned);
    Some(ClusterNode {
        id,
        addr,
        port,
        master: flags.contains(&"master"),
        master_id,
        failed: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
    })
}

/// One command on the node at `addr` (`host:port`) over a short-lived
/// blocking connection with 2 s timeouts: works for nodes this process did
/// not start (the chaos suite's containers) as for its own.
pub fn query_node<T: redis::FromRedisValue>(addr: &str, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut conn = redis::Client::open(format!("redis://{addr}/"))?
        .get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    cmd.query(&mut conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_parse() {
        let master = parse_node(
            "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,hostname4 \
             master - 0 1426238317239 4 connected 0-5460",
        )
        .expect("a master line");
        assert!(master.master && master.master_id.is_none() && !master.failed);
        assert_eq!(master.port, 30004);
        assert_eq!(master.addr, "127.0.0.1:30004");
        let replica = parse_node(
            "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 \
             myself,slave,fail? e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 0 2 connected",
        )
        .expect("a replica line");
        assert!(!replica.master && replica.failed);
        assert_eq!(
            replica.master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
    }
}
