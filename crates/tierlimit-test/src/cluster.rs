//! A real Redis Cluster of `redis-server` children: 3 masters and 3 replicas
//! on free loopback ports, joined by `redis-cli --cluster create`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::RedisServer;

const MASTERS: usize = 3;
/// How long a node may be unreachable before the others fail it over. Short,
/// so failover tests finish in seconds.
const NODE_TIMEOUT_MS: &str = "1000";
const SERVING_TIMEOUT: Duration = Duration::from_secs(30);
const CLI_NOT_FOUND: &str = "redis-cli not found on PATH: install it with \
    `sudo apt-get install -y redis-tools` (Debian/Ubuntu; redis-server's package \
    pulls it in) or run scripts/test, which installs it";

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's id.
    pub id: String,
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
}

impl RedisCluster {
    /// Starts six nodes and joins them as 3 masters + 3 replicas; panics with
    /// what went wrong when it cannot.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..MASTERS * 2)
            .map(|_| {
                let bus = free_bus_port();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    NODE_TIMEOUT_MS,
                    "--cluster-port",
                    &bus.to_string(),
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{CLI_NOT_FOUND}"),
            Err(e) => panic!("cannot run redis-cli: {e}"),
        }
        let cluster = RedisCluster { nodes };
        assert!(
            cluster.wait_serving(SERVING_TIMEOUT),
            "the cluster did not serve every slot within {SERVING_TIMEOUT:?}: {:?}",
            cluster.topology()
        );
        cluster.wait_roles_agreed();
        cluster.wait_replicas_synced();
        cluster
    }

    /// Waits until every node's `CLUSTER NODES` shows three masters and
    /// three replicas: a new replica's role reaches the others by gossip, a
    /// moment after every slot is served. Panics after the start timeout.
    fn wait_roles_agreed(&self) {
        let end = Instant::now() + SERVING_TIMEOUT;
        loop {
            let views: Vec<(usize, usize)> = self
                .nodes
                .iter()
                .map(|node| {
                    let text: String =
                        query(node, redis::cmd("CLUSTER").arg("NODES")).unwrap_or_default();
                    let nodes: Vec<ClusterNode> = text.lines().filter_map(parse_node).collect();
                    let masters = nodes.iter().filter(|n| n.master).count();
                    (masters, nodes.len() - masters)
                })
                .collect();
            if views.iter().all(|&view| view == (MASTERS, MASTERS)) {
                return;
            }
            assert!(
                Instant::now() < end,
                "the nodes do not agree on 3 masters and 3 replicas within \
                 {SERVING_TIMEOUT:?}: (masters, replicas) per node {views:?}"
            );
            sleep(Duration::from_millis(20));
        }
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

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
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
        let text: String = query(self.live(), redis::cmd("CLUSTER").arg("NODES"))
            .expect("CLUSTER NODES on a live node");
        text.lines()
            .filter_map(parse_node)
            .filter_map(|node| self.index_of_port(node.port).map(|i| (i, node)))
            .collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`: hash tags count).
    pub fn slot(&self, key: &str) -> u16 {
        query(self.live(), redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
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
    /// live node sees it; it works on Redis 6 and 7).
    fn slot_masters(&self) -> Vec<(std::ops::RangeInclusive<u16>, usize)> {
        let slots: redis::Value = query(self.live(), redis::cmd("CLUSTER").arg("SLOTS"))
            .expect("CLUSTER SLOTS on a live node");
        let redis::Value::Array(ranges) = slots else {
            panic!("CLUSTER SLOTS answered {slots:?}");
        };
        let int = |v: Option<&redis::Value>| match v {
            Some(redis::Value::Int(n)) => u16::try_from(*n).ok(),
            _ => None,
        };
        ranges
            .iter()
            .filter_map(|range| {
                let redis::Value::Array(fields) = range else {
                    return None;
                };
                let redis::Value::Array(master) = fields.get(2)? else {
                    return None;
                };
                let (start, end, port) = (
                    int(fields.first())?,
                    int(fields.get(1))?,
                    int(master.get(1))?,
                );
                Some((start..=end, self.index_of_port(port)?))
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
        let _: String = query(&self.nodes[replica], redis::cmd("CLUSTER").arg("FAILOVER"))
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

    /// Waits until every running replica's link to its master is up (its
    /// first sync done): a replica that never synced refuses to fail over
    /// ("disconnected from master for longer than allowed"). Panics after 30 s.
    pub fn wait_replicas_synced(&self) {
        let end = Instant::now() + SERVING_TIMEOUT;
        let topology = self.topology();
        for (i, node) in &topology {
            let server = &self.nodes[*i];
            if node.master || !server.is_running() || server.is_paused() {
                continue;
            }
            loop {
                let info: String =
                    query(server, redis::cmd("INFO").arg("replication")).unwrap_or_default();
                if info.contains("master_link_status:up") {
                    break;
                }
                assert!(
                    Instant::now() < end,
                    "replica {i} did not sync with its master within {SERVING_TIMEOUT:?}:\n{info}"
                );
                sleep(Duration::from_millis(20));
            }
        }
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
            let ok = live.iter().all(|node| {
                query::<String>(node, redis::cmd("CLUSTER").arg("INFO")).is_ok_and(|info| {
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                })
            });
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

/// A port for a node's cluster bus: free now, and not one a client port
/// could take, since [`RedisServer`] draws its own ports the same way (a
/// clash makes that server's start retry on another port).
fn free_bus_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free loopback port")
}

/// One `CLUSTER NODES` line: `<id> <ip:port@bus> <flags> <master|-> ...`.
fn parse_node(line: &str) -> Option<ClusterNode> {
    let mut fields = line.split_whitespace();
    let id = fields.next()?.to_owned();
    let addr = fields.next()?;
    let port = addr.split('@').next()?.rsplit(':').next()?.parse().ok()?;
    let flags: Vec<&str> = fields.next()?.split(',').collect();
    let master_id = fields.next().filter(|m| *m != "-").map(str::to_owned);
    Some(ClusterNode {
        id,
        port,
        master: flags.contains(&"master"),
        master_id,
        failed: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
    })
}

/// One command on one node over a short-lived blocking connection.
fn query<T: redis::FromRedisValue>(node: &RedisServer, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut conn = node
        .client()
        .get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
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
