//! On a Redis Cluster: which master serves each hash slot, and which masters
//! failed a call lately.
//!
//! The tier routes every call itself by this map (see `cluster.rs`), so a
//! failed master holds up only the calls for its own slots. A call's outcome
//! counts for the master it was sent to ([`Nodes::master_of`] when it was
//! sent), not for whichever master serves its slot when the answer comes: a
//! call to a hung master that times out just after its replica took over
//! must not mark the replica down.
//! [`FAILURES_TO_MARK`] calls in a row that fail on a master mark it down
//! for a short while (one call that passed its deadline does not). Until
//! then, checks of keys in its slots fail at once, with no I/O
//! ([`RedisFailure::NodeDown`](tierlimit_core::RedisFailure::NodeDown)), so
//! they get their policy's answer without waiting, and keys on the other
//! masters go on to Redis as before. A master's failures are its own while
//! another master answers ([`Nodes::failing_alone`]): a circuit breaker
//! does not hear of them, so one master's fault never opens it, and a whole
//! cluster down does once every master failed. The map comes from `CLUSTER SLOTS` and
//! is read again while a master is down and after a `MOVED`, so once a
//! replica is promoted its slots' calls go to it.
//!
//! Any node may answer `CLUSTER SLOTS`, and one that has not yet heard of a
//! failover still names the old master. So a fresh map takes slots away
//! from a master that answers only on that master's own word
//! ([`Nodes::replace`]): a `MOVED`, or its own map, which the tier asks it
//! for first ([`Nodes::disputes`]); from a master that fails, or is down, at
//! once. A stale node can then never hand a promoted replica's slots back to
//! the hung master it replaced, and a master that failed over while the tier
//! sent it nothing fails that question instead of a check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::Value;

use crate::batch::Batcher;
use crate::cluster::SLOTS;

/// Calls in a row that must fail on a master before it is marked down.
pub(crate) const FAILURES_TO_MARK: u32 = 3;

/// No master is known for a slot.
const UNKNOWN: u16 = u16::MAX;

/// One master as `CLUSTER SLOTS` names it, shared by every map that names
/// it (see [`Nodes::replace`]).
#[derive(Debug)]
pub(crate) struct Master {
    /// `host:port` (`[host]:port` for an IPv6 address).
    addr: String,
    /// Until when (µs on the tier's monotonic clock) its slots fail at once;
    /// 0 when it is not down.
    down_until: AtomicU64,
    /// Calls that failed on it since the last that did not.
    failures: AtomicU32,
    /// It gave a slot up on its own word (a `MOVED`, or its own map) since
    /// a map last took one of its slots: the next map may take its slots
    /// though it answers.
    disowned: AtomicBool,
    /// The checks waiting for calls in flight to it (see `batch.rs`).
    batcher: Arc<Batcher>,
}

/// Slot -> master, as one `CLUSTER SLOTS` reply said.
#[derive(Debug)]
pub(crate) struct SlotMap {
    masters: Vec<Arc<Master>>,
    /// Index into `masters` for each slot, or [`UNKNOWN`].
    owner: Box<[u16]>,
}

impl SlotMap {
    /// No slot known yet: every check goes to Redis.
    pub(crate) fn empty() -> SlotMap {
        SlotMap {
            masters: Vec::new(),
            owner: vec![UNKNOWN; usize::from(SLOTS)].into_boxed_slice(),
        }
    }

    /// The map a `CLUSTER SLOTS` reply describes: each item is
    /// `[start, end, [host, port, id, ...], replicas...]`, each master with
    /// a batcher of batches of at most `max_batch`. None when the reply has
    /// another shape.
    pub(crate) fn from_cluster_slots(reply: &Value, max_batch: usize) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = SlotMap::empty();
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (start, end, master) = match fields.as_slice() {
                [Value::Int(start), Value::Int(end), Value::Array(master), ..] => {
                    (*start, *end, master)
                }
                _ => return None,
            };
            let addr = match master.as_slice() {
                [host, Value::Int(port), ..] => {
                    let host = text(host).filter(|h| !h.is_empty() && h != "?")?;
                    if host.contains(':') {
                        format!("[{host}]:{port}")
                    } else {
                        format!("{host}:{port}")
                    }
                }
                _ => return None,
            };
            let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
            if start > end || end >= usize::from(SLOTS) {
                return None;
            }
            let index = match map.masters.iter().position(|m| m.addr == addr) {
                Some(index) => index,
                None => {
                    map.masters.push(Arc::new(Master {
                        addr,
                        down_until: AtomicU64::new(0),
                        failures: AtomicU32::new(0),
                        disowned: AtomicBool::new(false),
                        batcher: Arc::new(Batcher::new(max_batch)),
                    }));
                    map.masters.len() - 1
                }
            };
            let index = u16::try_from(index).ok().filter(|&i| i != UNKNOWN)?;
            map.owner[start..=end].fill(index);
        }
        Some(map)
    }

    fn master(&self, slot: u16) -> Option<&Arc<Master>> {
        let index = *self.owner.get(usize::from(slot))?;
        self.masters.get(usize::from(index))
    }

    /// This map with `slot` served by `master` (added to the masters when
    /// it is not one of them).
    fn serve(&mut self, slot: u16, master: &Arc<Master>) {
        let index = match self.masters.iter().position(|m| Arc::ptr_eq(m, master)) {
            Some(index) => index,
            None => {
                self.masters.push(Arc::clone(master));
                self.masters.len() - 1
            }
        };
        // Never more masters than slots, so an index always fits.
        if let (Ok(index), Some(owner)) =
            (u16::try_from(index), self.owner.get_mut(usize::from(slot)))
        {
            *owner = index;
        }
    }

    /// This map without the masters that serve no slot.
    fn without_idle_masters(mut self) -> SlotMap {
        let mut serves = vec![false; self.masters.len()];
        for &index in self.owner.iter().filter(|&&i| i != UNKNOWN) {
            serves[usize::from(index)] = true;
        }
        if serves.iter().all(|&s| s) {
            return self;
        }
        let mut kept = 0;
        let renumbered: Vec<u16> = serves
            .iter()
            .map(|&serves| {
                kept += u16::from(serves);
                if serves { kept - 1 } else { UNKNOWN }
            })
            .collect();
        let mut serving = serves.iter();
        self.masters
            .retain(|_| serving.next().copied().unwrap_or(false));
        for owner in self.owner.iter_mut().filter(|o| **o != UNKNOWN) {
            *owner = renumbered[usize::from(*owner)];
        }
        self
    }
}

impl Master {
    /// True when a fresh map may take its slots at `now`: it gave a slot up
    /// on its own word, or its last call failed, or it is down.
    fn may_lose_slots(&self, now: u64) -> bool {
        self.disowned.load(Ordering::Acquire)
            || self.failures.load(Ordering::Acquire) > 0
            || self.down_until.load(Ordering::Acquire) > now
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The slot map in force and the masters' down marks.
#[derive(Debug)]
pub(crate) struct Nodes {
    map: ArcSwap<SlotMap>,
    /// How long a master that failed a call stays down.
    down_for: Duration,
    /// A node answered `MOVED`: the map is out of date.
    stale: AtomicBool,
    /// Turns of [`any_master`](Self::any_master).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    turn: AtomicUsize,
    /// The origin of the monotonic µs the down marks are kept in.
    origin: std::time::Instant,
}

impl Nodes {
    pub(crate) fn new(down_for: Duration) -> Nodes {
        Nodes {
            map: ArcSwap::from_pointee(SlotMap::empty()),
            down_for,
            stale: AtomicBool::new(false),
            turn: AtomicUsize::new(0),
            origin: std::time::Instant::now(),
        }
    }

    /// µs since these nodes were made, on the monotonic clock: the time the
    /// down marks are kept in.
    pub(crate) fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The batcher of `slot`'s master, `None` when no master is known for it.
    pub(crate) fn batcher(&self, slot: u16) -> Option<Arc<Batcher>> {
        let map = self.map.load();
        map.master(slot).map(|master| Arc::clone(&master.batcher))
    }

    /// The master that serves `slot` now, `None` when none is known: what a
    /// call for the slot, sent now, goes to, and what its outcome counts for
    /// ([`failed`](Self::failed), [`succeeded`](Self::succeeded)).
    pub(crate) fn master_of(&self, slot: u16) -> Option<Arc<Master>> {
        self.map.load().master(slot).map(Arc::clone)
    }

    /// `slot`'s master, asked for its own map (see
    /// [`disputes`](Self::disputes)), answered `own`: unless `own` still
    /// names it for `slot`, it gave its slots up, on its own word as by a
    /// `MOVED`.
    pub(crate) fn heard_from(&self, slot: u16, own: &SlotMap) {
        self.disown(slot, own.master(slot).map(|m| m.addr.as_str()));
    }

    /// The master of `slot` in the map in force said `slot` is served by
    /// `to` (none: by no master) now: unless that is the master itself, it
    /// may lose its slots to the next map. False when the map names `to`
    /// already.
    fn disown(&self, slot: u16, to: Option<&str>) -> bool {
        let map = self.map.load();
        match map.master(slot) {
            Some(master) if Some(master.addr.as_str()) == to => false,
            Some(master) => {
                master.disowned.store(true, Ordering::Release);
                true
            }
            None => true,
        }
    }

    /// One slot of each master that answers (see [`replace`](Self::replace))
    /// and that `fresh`, read at `now` (µs), would take slots from. The
    /// reader of `fresh` may be stale, or the master may have failed over
    /// while the tier sent it nothing: asked for its own map, it settles
    /// which ([`heard_from`](Self::heard_from), or its call fails) before
    /// `fresh` is taken.
    pub(crate) fn disputes(&self, fresh: &SlotMap, now: u64) -> Vec<u16> {
        let map = self.map.load();
        let mut disputed: Vec<(u16, &Arc<Master>)> = Vec::new();
        for slot in 0..SLOTS {
            let Some(before) = map.master(slot) else {
                continue;
            };
            if fresh
                .master(slot)
                .is_some_and(|after| after.addr == before.addr)
                || before.may_lose_slots(now)
                || disputed.iter().any(|(_, m)| Arc::ptr_eq(m, before))
            {
                continue;
            }
            disputed.push((slot, before));
        }
        disputed.into_iter().map(|(slot, _)| slot).collect()
    }

    /// True once after [`moved`](Self::moved).
    pub(crate) fn take_moved(&self) -> bool {
        self.stale.load(Ordering::Relaxed) && self.stale.swap(false, Ordering::AcqRel)
    }

    /// The address of the master down at `now` (µs) that serves `slot`, if it is.
    pub(crate) fn down(&self, slot: u16, now: u64) -> Option<String> {
        let map = self.map.load();
        let master = map.master(slot)?;
        (master.down_until.load(Ordering::Acquire) > now).then(|| master.addr.clone())
    }

    /// A call sent to `master` failed at `now` (µs): after
    /// [`FAILURES_TO_MARK`] in a row it is down for a while (and again at
    /// each failure after that, until a call succeeds). Answers its address
    /// when this failure marks it down and it was not down before. A master
    /// no map names any more keeps its count, which no check reads.
    pub(crate) fn failed<'m>(&self, master: &'m Master, now: u64) -> Option<&'m str> {
        if master.failures.fetch_add(1, Ordering::AcqRel) + 1 < FAILURES_TO_MARK {
            return None;
        }
        let down_for = u64::try_from(self.down_for.as_micros()).unwrap_or(u64::MAX);
        let was = master
            .down_until
            .fetch_max(now.saturating_add(down_for), Ordering::AcqRel);
        (was <= now).then_some(master.addr.as_str())
    }

    /// A call sent to `master` succeeded: its failures in a row start again.
    pub(crate) fn succeeded(&self, master: &Master) {
        if master.failures.load(Ordering::Relaxed) != 0 {
            master.failures.store(0, Ordering::Release);
        }
    }

    /// True when `master` failed its last call while another master of the
    /// map in force that is not down at `now` did not: one master's fault,
    /// which this map answers by marking that master down, not an outage of
    /// the deployment. False with one master, before the first map, and once
    /// every master fails.
    pub(crate) fn failing_alone(&self, master: &Master, now: u64) -> bool {
        master.failures.load(Ordering::Acquire) > 0
            && self.map.load().masters.iter().any(|m| {
                !std::ptr::eq(&**m, master)
                    && m.failures.load(Ordering::Acquire) == 0
                    && m.down_until.load(Ordering::Acquire) <= now
            })
    }

    /// True while some master that still serves slots is down at `now`.
    pub(crate) fn any_down(&self, now: u64) -> bool {
        let map = self.map.load();
        map.masters
            .iter()
            .any(|m| m.down_until.load(Ordering::Acquire) > now)
    }

    /// Takes `fresh`, read at `now` (µs), as the map in force, but for the
    /// slots it would take from a master that answers (its last call did not
    /// fail, it is not down, and it gave no slot up by a `MOVED` or its own
    /// map since a map last took one of its slots): those stay where they
    /// are, for `fresh` may come from a node that has not heard of a failover
    /// yet. A master in both maps is the same [`Master`],
    /// with its down mark, its failures in a row and its batcher (with the
    /// checks queued in it); a master that serves no slot any more (failed
    /// over) is gone with its mark, so its slots' new master is asked at once.
    pub(crate) fn replace(&self, mut fresh: SlotMap, now: u64) {
        let old = self.map.load();
        for master in &mut fresh.masters {
            if let Some(before) = old.masters.iter().find(|m| m.addr == master.addr) {
                *master = Arc::clone(before);
            }
        }
        let mut gave_up: Vec<&Arc<Master>> = Vec::new();
        for slot in 0..SLOTS {
            let Some(before) = old.master(slot) else {
                continue;
            };
            if fresh
                .master(slot)
                .is_some_and(|after| Arc::ptr_eq(after, before))
            {
                continue;
            }
            if !before.may_lose_slots(now) {
                fresh.serve(slot, before);
            } else if !gave_up.iter().any(|m| Arc::ptr_eq(m, before)) {
                gave_up.push(before);
            }
        }
        // A master's word is spent once a map took slots from it.
        for master in gave_up {
            master.disowned.store(false, Ordering::Release);
        }
        self.map.store(Arc::new(fresh.without_idle_masters()));
    }
}

/// What only the Cluster connection (`cluster/router.rs`) asks: where to
/// send a call, and what a `MOVED` told.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
impl Nodes {
    /// What `with` answers for the address of `slot`'s master, `None` when
    /// no master is known for it (no allocation: the address is lent).
    pub(crate) fn with_master<R>(&self, slot: u16, with: impl FnOnce(&str) -> R) -> Option<R> {
        let map = self.map.load();
        map.master(slot).map(|master| with(&master.addr))
    }

    /// A master that is not down at `now`, another at each call (all of
    /// them in turn when every one is down); `None` before the first map.
    pub(crate) fn any_master(&self, now: u64) -> Option<String> {
        let map = self.map.load();
        let count = map.masters.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed);
        let up = (0..count)
            .map(|i| &map.masters[(start + i) % count.max(1)])
            .find(|m| m.down_until.load(Ordering::Acquire) <= now);
        up.or_else(|| map.masters.get(start % count.max(1)))
            .map(|m| m.addr.clone())
    }

    /// Every master's address.
    pub(crate) fn masters(&self) -> Vec<String> {
        self.map
            .load()
            .masters
            .iter()
            .map(|m| m.addr.clone())
            .collect()
    }

    /// A node answered `MOVED`: `slot` (when its reply named one) is served
    /// by `to` now. Unless the map in force says so already (a call sent
    /// before it changed), read the map again soon, and let it take slots
    /// from the slot's master.
    pub(crate) fn moved(&self, slot: Option<u16>, to: &str) {
        if slot.is_none_or(|slot| self.disown(slot, Some(to))) {
            self.stale.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls of these tests, each sent to its slot's master of the map
    /// in force and answered at once.
    impl Nodes {
        fn fail_at(&self, slot: u16, now: u64) -> Option<String> {
            let master = self.master_of(slot)?;
            self.failed(&master, now).map(str::to_string)
        }

        fn answer_at(&self, slot: u16) {
            if let Some(master) = self.master_of(slot) {
                self.succeeded(&master);
            }
        }

        fn alone_at(&self, slot: u16, now: u64) -> bool {
            self.master_of(slot)
                .is_some_and(|master| self.failing_alone(&master, now))
        }
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]),
            Value::Array(vec![
                bulk("127.0.0.1"),
                Value::Int(port + 1),
                bulk("replica"),
            ]),
        ])
    }

    /// The map of `ranges`: (first slot, last slot, master's port).
    fn map_of(ranges: &[(i64, i64, i64)]) -> SlotMap {
        let ranges = ranges
            .iter()
            .map(|&(start, end, port)| range(start, end, port));
        SlotMap::from_cluster_slots(&Value::Array(ranges.collect()), 16)
            .expect("a CLUSTER SLOTS reply")
    }

    /// Three masters on `ports`, serving the slots in thirds.
    fn masters_on(ports: [i64; 3]) -> SlotMap {
        map_of(&[
            (0, 5460, ports[0]),
            (5461, 10922, ports[1]),
            (10923, 16383, ports[2]),
        ])
    }

    fn three_masters() -> SlotMap {
        masters_on([7000, 7002, 7004])
    }

    #[test]
    fn a_cluster_slots_reply_maps_every_slot_to_its_master() {
        let map = three_masters();
        let addr = |slot| map.master(slot).map(|m| m.addr.clone());
        assert_eq!(addr(0).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(addr(5460).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(addr(5461).as_deref(), Some("127.0.0.1:7002"));
        assert_eq!(addr(16383).as_deref(), Some("127.0.0.1:7004"));
        assert_eq!(map.masters.len(), 3);
    }

    #[test]
    fn replies_of_another_shape_are_refused() {
        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(10, 5, 7000)]),
            Value::Array(vec![range(0, i64::from(SLOTS), 7000)]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Array(vec![bulk("127.0.0.1")]),
            ])]),
        ] {
            assert!(SlotMap::from_cluster_slots(&bad, 16).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_failed_master_is_down_for_its_own_slots_only_and_for_a_while() {
        let nodes = Nodes::new(Duration::from_millis(500));
        assert_eq!(nodes.fail_at(0, 0), None, "no map yet: nothing to mark");
        nodes.replace(three_masters(), 0);
        for _ in 1..FAILURES_TO_MARK {
            assert_eq!(nodes.fail_at(100, 1_000), None, "not yet: fewer in a row");
            assert_eq!(nodes.down(100, 1_000), None, "not yet: fewer in a row");
        }
        assert_eq!(
            nodes.fail_at(100, 1_000).as_deref(),
            Some("127.0.0.1:7000"),
            "marked down by this failure"
        );
        assert_eq!(nodes.fail_at(100, 1_000), None, "already down");
        assert_eq!(nodes.down(5460, 1_000).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(nodes.down(5461, 1_000), None, "another master's slot");
        assert_eq!(nodes.down(16383, 1_000), None, "another master's slot");
        assert!(nodes.any_down(1_000));
        assert!(
            nodes.down(0, 500_999).is_some(),
            "still down just before the end"
        );
        assert_eq!(nodes.down(0, 501_000), None, "asked again after the while");
        assert!(!nodes.any_down(501_000));
        // Still failing after the while: down again at once.
        assert!(nodes.fail_at(0, 502_000).is_some(), "down again");
        assert!(nodes.down(0, 502_001).is_some());
    }

    #[test]
    fn a_success_between_failures_keeps_the_master_up() {
        let nodes = Nodes::new(Duration::from_secs(1));
        nodes.replace(three_masters(), 0);
        for _ in 0..10 {
            for _ in 1..FAILURES_TO_MARK {
                nodes.fail_at(0, 0);
            }
            nodes.answer_at(1);
        }
        assert_eq!(nodes.down(0, 1), None, "never {FAILURES_TO_MARK} in a row");
        // Another master's success does not reset this one's run.
        for _ in 1..FAILURES_TO_MARK {
            nodes.fail_at(0, 0);
        }
        nodes.answer_at(6_000);
        nodes.fail_at(0, 0);
        assert!(nodes.down(0, 1).is_some());
    }

    #[test]
    fn a_master_fails_alone_while_another_answers_and_not_once_all_fail() {
        let nodes = Nodes::new(Duration::from_secs(1));
        assert!(!nodes.alone_at(0, 0), "no map yet");
        nodes.replace(three_masters(), 0);
        assert!(!nodes.alone_at(0, 0), "no failure yet");
        nodes.fail_at(0, 0);
        assert!(nodes.alone_at(0, 0), "7000 failed, 7002 and 7004 did not");
        assert!(!nodes.alone_at(6_000, 0), "7002 did not fail");
        nodes.fail_at(6_000, 0);
        assert!(nodes.alone_at(0, 0), "7004 still answers");
        nodes.fail_at(12_000, 0);
        assert!(!nodes.alone_at(0, 0), "every master fails: an outage");
        assert!(!nodes.alone_at(12_000, 0), "every master fails: an outage");
        nodes.answer_at(12_000);
        assert!(nodes.alone_at(0, 0), "7004 answers again");
        // A master that answered last but is down does not count as answering.
        let nodes = Nodes::new(Duration::from_secs(1));
        nodes.replace(masters_on([7000, 7002, 7002]), 0);
        nodes.fail_at(0, 0);
        for _ in 0..FAILURES_TO_MARK {
            nodes.fail_at(6_000, 0);
        }
        nodes.answer_at(6_000);
        assert!(!nodes.alone_at(0, 10), "7002 answered, but is down");
        assert!(nodes.alone_at(0, 1_000_001), "7002 answered and is up");
        let one = Nodes::new(Duration::from_secs(1));
        one.replace(masters_on([7000, 7000, 7000]), 0);
        one.fail_at(0, 0);
        assert!(!one.alone_at(0, 0), "one master is the whole deployment");
    }

    #[test]
    fn any_master_takes_turns_and_skips_the_down_ones() {
        let nodes = Nodes::new(Duration::from_secs(1));
        assert_eq!(nodes.any_master(0), None, "no map yet");
        nodes.replace(three_masters(), 0);
        let mut seen: Vec<String> = (0..3).filter_map(|_| nodes.any_master(0)).collect();
        seen.sort();
        assert_eq!(seen, nodes.masters(), "each master in turn");
        for _ in 0..FAILURES_TO_MARK {
            nodes.fail_at(0, 0);
        }
        for _ in 0..6 {
            assert_ne!(nodes.any_master(1).as_deref(), Some("127.0.0.1:7000"));
        }
    }

    #[test]
    fn a_moved_reply_is_taken_once() {
        let nodes = Nodes::new(Duration::from_secs(1));
        assert!(!nodes.take_moved());
        nodes.moved(None, "127.0.0.1:7000");
        assert!(nodes.take_moved());
        assert!(!nodes.take_moved(), "taken");
    }

    #[test]
    fn ipv6_masters_are_bracketed() {
        let reply = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![bulk("::1"), Value::Int(7000), bulk("id")]),
        ])]);
        let map = SlotMap::from_cluster_slots(&reply, 16).expect("a CLUSTER SLOTS reply");
        assert_eq!(map.masters[0].addr, "[::1]:7000");
    }

    #[test]
    fn a_new_map_keeps_marks_of_masters_it_keeps_and_drops_failed_over_ones() {
        let nodes = Nodes::new(Duration::from_secs(1));
        nodes.replace(three_masters(), 0);
        for _ in 0..FAILURES_TO_MARK {
            nodes.fail_at(0, 0);
            nodes.fail_at(6_000, 0);
        }
        nodes.replace(three_masters(), 0);
        assert!(nodes.down(0, 10).is_some(), "the same map keeps the mark");
        // 7000's replica (7001) was promoted; 7002 is still down and serving.
        nodes.replace(masters_on([7001, 7002, 7004]), 0);
        assert_eq!(
            nodes.down(0, 10),
            None,
            "the promoted replica is asked at once"
        );
        assert_eq!(nodes.down(6_000, 10).as_deref(), Some("127.0.0.1:7002"));
    }

    /// A call sent before the map changed counts for the master it went to:
    /// the hung master's late timeouts never mark its promoted replica down,
    /// nor make its failures look like the replica's.
    #[test]
    fn a_late_answer_counts_for_the_master_it_was_sent_to() {
        let nodes = Nodes::new(Duration::from_secs(1));
        nodes.replace(three_masters(), 0);
        let sent = nodes.master_of(0).expect("a master");
        // 7000 hung: its first call failed, and its replica (7001) was
        // promoted while the others were in flight.
        nodes.failed(&sent, 0);
        nodes.replace(masters_on([7001, 7002, 7004]), 0);
        assert_eq!(
            nodes.with_master(0, str::to_string).as_deref(),
            Some("127.0.0.1:7001")
        );
        for _ in 1..FAILURES_TO_MARK {
            nodes.failed(&sent, 0);
        }
        assert_eq!(nodes.down(0, 1), None, "the replica was never asked");
        assert!(!nodes.alone_at(0, 1), "the replica has not failed");
        assert!(
            nodes.failing_alone(&sent, 1),
            "the old master's failures are its own while others answer"
        );
        // And a master both maps name is one master: its count goes on.
        let kept = nodes.master_of(6_000).expect("a master");
        nodes.failed(&kept, 0);
        nodes.replace(masters_on([7001, 7002, 7004]), 0);
        for _ in 1..FAILURES_TO_MARK {
            nodes.fail_at(6_000, 0);
        }
        assert!(
            nodes.down(6_000, 1).is_some(),
            "{FAILURES_TO_MARK} in a row"
        );
    }

    /// The port of the master of `slot` in the map in force.
    fn port_of(nodes: &Nodes, slot: u16) -> Option<String> {
        nodes.with_master(slot, |addr| {
            addr.trim_start_matches("127.0.0.1:").to_string()
        })
    }

    /// A node that has not heard of a failover yet names the old master: its
    /// map never hands the promoted replica's slots back to it.
    #[test]
    fn a_stale_map_never_takes_a_slot_from_a_master_that_answers() {
        let nodes = Nodes::new(Duration::from_secs(1));
        nodes.replace(three_masters(), 0);
        for _ in 0..FAILURES_TO_MARK {
            nodes.fail_at(0, 0);
        }
        // 7000 hung and is down; its replica 7001 was promoted.
        nodes.replace(masters_on([7001, 7002, 7004]), 10);
        assert_eq!(port_of(&nodes, 0).as_deref(), Some("7001"));
        // A stale node's map, read while 7001 answers.
        nodes.replace(three_masters(), 20);
        for slot in [0, 5460] {
            assert_eq!(
                port_of(&nodes, slot).as_deref(),
                Some("7001"),
                "slot {slot}"
            );
        }
        let mut masters = nodes.masters();
        masters.sort();
        assert_eq!(
            masters,
            ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7004"]
        );
        assert!(
            !nodes.any_down(20),
            "7000 serves nothing, so it is not counted"
        );
        // Once 7001 fails a call, the map in force is the best word there is.
        nodes.fail_at(0, 30);
        nodes.replace(three_masters(), 40);
        assert_eq!(port_of(&nodes, 0).as_deref(), Some("7000"));
    }

    /// Resharding, or a manual failover: slots leave a master that answers
    /// on that master's own word, a `MOVED`.
    #[test]
    fn slots_leave_a_master_that_answers_on_its_moved() {
        let nodes = Nodes::new(Duration::from_secs(1));
        nodes.replace(three_masters(), 0);
        let migrated = || {
            map_of(&[
                (0, 99, 7000),
                (100, 101, 7002),
                (102, 5460, 7000),
                (5461, 10922, 7002),
                (10923, 16383, 7004),
            ])
        };
        // Slots 100 and 101 were migrated from 7000 to 7002, but the map
        // was read (another call's refresh, say) before 7000 said so.
        nodes.replace(migrated(), 0);
        assert_eq!(
            port_of(&nodes, 100).as_deref(),
            Some("7000"),
            "7000 answers"
        );
        // A call for 100 meets the MOVED: the next map moves both.
        nodes.moved(Some(100), "127.0.0.1:7002");
        assert!(nodes.take_moved(), "read the map again");
        nodes.replace(migrated(), 0);
        for (slot, port) in [(99, "7000"), (100, "7002"), (101, "7002"), (102, "7000")] {
            assert_eq!(port_of(&nodes, slot).as_deref(), Some(port), "slot {slot}");
        }
        // The MOVED was spent by that move: a stale map cannot undo it.
        nodes.replace(three_masters(), 0);
        assert_eq!(port_of(&nodes, 100).as_deref(), Some("7002"));
        assert_eq!(port_of(&nodes, 200).as_deref(), Some("7000"));
        // A MOVED that names the master the map already has (a call sent
        // before the map changed) is old news.
        nodes.moved(Some(100), "127.0.0.1:7002");
        assert!(!nodes.take_moved(), "nothing to read again");
        // 7000 was failed over by hand to its replica, and says so.
        nodes.moved(Some(200), "127.0.0.1:7001");
        nodes.replace(masters_on([7001, 7002, 7004]), 0);
        assert_eq!(port_of(&nodes, 0).as_deref(), Some("7001"));
        assert_eq!(port_of(&nodes, 5460).as_deref(), Some("7001"));
    }

    /// A master whose last call failed is not answering: any fresh map may
    /// move its slots, before it is marked down.
    #[test]
    fn a_failing_master_gives_up_its_slots_to_a_fresh_map() {
        let nodes = Nodes::new(Duration::from_secs(1));
        nodes.replace(three_masters(), 0);
        nodes.fail_at(0, 0);
        assert_eq!(nodes.down(0, 1), None, "one failure does not mark it down");
        nodes.replace(masters_on([7001, 7002, 7004]), 1);
        assert_eq!(port_of(&nodes, 0).as_deref(), Some("7001"));
        // Slots no master serves in a fresh map stay with one that answers.
        nodes.replace(map_of(&[(5461, 10922, 7002), (10923, 16383, 7004)]), 2);
        assert_eq!(port_of(&nodes, 0).as_deref(), Some("7001"));
        assert_eq!(nodes.masters().len(), 3);
    }

    /// A fresh map that would take slots from masters that answer names
    /// them, one slot each, so each can be asked for its own map; masters
    /// that failed or answered `MOVED` are not asked, nor those it agrees on.
    #[test]
    fn a_fresh_map_disputes_only_the_masters_that_answer() {
        let nodes = Nodes::new(Duration::from_secs(1));
        assert!(nodes.disputes(&three_masters(), 0).is_empty(), "no map yet");
        nodes.replace(three_masters(), 0);
        assert!(nodes.disputes(&three_masters(), 0).is_empty(), "it agrees");
        let ports = |slots: Vec<u16>| -> Vec<String> {
            let ports = slots.iter().filter_map(|&slot| port_of(&nodes, slot));
            ports.collect()
        };
        // Every master replaced: each of the three is asked, once.
        assert_eq!(
            ports(nodes.disputes(&masters_on([7001, 7003, 7005]), 0)),
            ["7000", "7002", "7004"]
        );
        // Slots a fresh map leaves to no master are disputed too.
        assert_eq!(
            ports(nodes.disputes(&map_of(&[(5461, 10922, 7002), (10923, 16383, 7004)]), 0)),
            ["7000"]
        );
        // 7000 failed a call and 7002 answered MOVED: neither is asked.
        nodes.fail_at(0, 0);
        nodes.moved(Some(6_000), "127.0.0.1:7003");
        assert_eq!(
            ports(nodes.disputes(&masters_on([7001, 7003, 7005]), 0)),
            ["7004"]
        );
    }

    /// A master asked for its own map settles a dispute: it gives its slots
    /// up when its map names another master for them (it failed over while
    /// nothing was sent to it), and keeps them when it names itself (the
    /// fresh map was stale).
    #[test]
    fn a_master_asked_for_its_own_map_settles_the_dispute() {
        let nodes = Nodes::new(Duration::from_secs(1));
        nodes.replace(three_masters(), 0);
        let promoted = masters_on([7001, 7002, 7004]);
        // 7000 names itself: the fresh map takes nothing from it.
        nodes.heard_from(0, &three_masters());
        assert_eq!(nodes.disputes(&promoted, 0), [0]);
        nodes.replace(masters_on([7001, 7002, 7004]), 0);
        assert_eq!(port_of(&nodes, 0).as_deref(), Some("7000"));
        // 7000 names its replica: it was failed over, and gives its slots up.
        nodes.heard_from(0, &promoted);
        assert!(nodes.disputes(&promoted, 0).is_empty(), "settled");
        assert!(!nodes.take_moved(), "its answer was read in a map read");
        nodes.replace(promoted, 0);
        assert_eq!(port_of(&nodes, 0).as_deref(), Some("7001"));
        assert_eq!(port_of(&nodes, 5460).as_deref(), Some("7001"));
    }
}
