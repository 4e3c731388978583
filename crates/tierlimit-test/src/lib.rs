//! Test support for tierlimit (never published).
//!
//! - [`RedisServer`]: a real `redis-server` child process on a free loopback
//!   port, with helpers to kill, restart, pause and inspect it.
//! - [`RedisCluster`]: a real Redis Cluster of 3 masters and 3 replicas, with
//!   helpers to find a key's master, fail over and wait until every slot is
//!   served again; [`cluster_nodes`], [`slot_masters`], [`cluster_ok`],
//!   [`create_cluster`], [`wait_cluster_ready`] and [`query_node`] do the same for nodes at any
//!   address (the chaos suite's containers).
//! - [`FaultProxy`]: an in-process TCP proxy in front of a server that can add
//!   latency, hang, refuse, reset or drop replies, switchable at run time.
//! - [`MemoryFiller`]: keeps a `noeviction` server full, so writes answer `-OOM`.
//! - [`Load`]: concurrent checks with every decision and latency recorded.
//! - [`serial`]: one test at a time in a binary whose tests measure latency.
//! - [`StallWatch`]: notes when the whole machine stalls, so a latency bound
//!   judged with [`Stalls::judge`] takes out only what no limiter could have
//!   answered through.
//!
//! It is meant for tests: most of it panics with a clear message on failure.
//! What the chaos suite's programs use as well returns errors instead
//! ([`MemoryFiller`], [`FaultProxy::listen`], [`FaultProxy::try_set`]).

mod cluster;
mod filler;
mod load;
mod proxy;
mod serial;
mod server;
mod stall;

pub use cluster::{
    ClusterNode, RedisCluster, cluster_nodes, cluster_ok, create_cluster, query_node, slot_masters,
    wait_cluster_ready,
};
pub use filler::MemoryFiller;
pub use load::{Live, Load, Sample, Samples, quantile};
pub use proxy::{Fault, FaultProxy};
pub use serial::{serial, serial_blocking};
pub use server::RedisServer;
pub use stall::{RESUME, STALL_MIN, Stall, StallWatch, Stalls, TICK, Timings, held_at_end, judged};
