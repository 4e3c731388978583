//! The cluster harness: six real nodes serve every slot, keys spread over the
//! three masters, and a killed master or a manual failover hands its slots to
//! its replica.

use std::collections::BTreeSet;
use std::time::Duration;

use tierlimit_test::RedisCluster;

/// Keys whose hash tags land on each of the three masters.
fn one_key_per_master(cluster: &RedisCluster) -> Vec<(String, usize)> {
    let mut found: Vec<(String, usize)> = Vec::new();
    for i in 0..1000 {
        let key = format!("tl:{{user-{i}}}:api:g1000000");
        let master = cluster.master_of(&key);
        if found.iter().all(|(_, m)| *m != master) {
            found.push((key, master));
        }
        if found.len() == 3 {
            break;
        }
    }
    found
}

#[test]
fn a_cluster_serves_every_slot_and_hands_slots_to_replicas() {
    let mut cluster = RedisCluster::start();
    let topology = cluster.topology();
    let masters: BTreeSet<usize> = topology
        .iter()
        .filter(|(_, n)| n.master)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(masters.len(), 3, "{topology:?}");
    for &m in &masters {
        let replica = cluster.replica_of(m).expect("every master has a replica");
        assert!(!topology[&replica].master);
    }
    let keys = one_key_per_master(&cluster);
    assert_eq!(keys.len(), 3, "keys spread over the three masters");
    // One rule set's keys share a hash tag: one slot.
    assert_eq!(
        cluster.slot("tl:{user-1}:api:g1000000"),
        cluster.slot("tl:{user-1}:api:m60000000")
    );

    // Manual failover: the replica takes the slots, the old master follows it.
    let (key, master) = keys[0].clone();
    let replica = cluster.replica_of(master).expect("replica");
    cluster.failover(replica);
    assert_eq!(cluster.master_of(&key), replica);
    // The old master learns it was replaced by gossip: wait for it.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while cluster.topology()[&master].master {
        assert!(
            std::time::Instant::now() < end,
            "the old master was not a replica 10 s after the failover"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A killed master: its replica is promoted by the others' vote.
    let (key, master) = keys[1].clone();
    let replica = cluster.replica_of(master).expect("replica");
    cluster.node_mut(master).kill9();
    assert!(
        cluster.wait_serving(Duration::from_secs(30)),
        "slots unserved 30 s after a master died: {:?}\nits replica's log:\n{}",
        cluster.topology(),
        cluster.nodes()[replica].log_tail(400)
    );
    assert_eq!(cluster.master_of(&key), replica);
    assert!(cluster.topology()[&master].failed);
}
