//! The kit against real servers: the reply helpers on a lock's life, a replica pair, a
//! restart, and the raw-bytes mode (needs the module built: `cargo build --release`).

use std::time::Duration;

use redis_lock_testkit::lock::lock_stat;
use redis_lock_testkit::{args, wait_until, Cluster, RawConn, ReplicaPair, Resp, ServerBuilder};

/// The fence of `LOCK.INFO key`, `None` when the key is free.
fn fence(c: &mut RawConn, key: &str) -> Option<i64> {
    c.cmd(&["LOCK.INFO", key]).get("fence")?.as_int()
}

/// `LOCK.ACQUIRE key PX 60000`, which must be granted: its fence.
fn acquire(c: &mut RawConn, key: &str) -> i64 {
    let (_, fence) = c
        .cmd(&["LOCK.ACQUIRE", key, "PX", "60000"])
        .grant()
        .expect("free");
    fence as i64
}

#[test]
fn reply_helpers_follow_a_lock_through_its_life() {
    let server = ServerBuilder::new().start();
    let mut c = server.raw();
    let acquire = ["LOCK.ACQUIRE", "kit:a", "PX", "10000", "OWNER", "me"];
    let (token, fence) = c.cmd(&acquire).grant().expect("free");
    assert_eq!(c.cmd(&acquire), Resp::Nil, "held");
    let info = c.cmd(&["LOCK.INFO", "kit:a"]);
    assert_eq!(info.get("FENCE"), Some(Resp::Int(fence as i64)));
    assert_eq!(info.field("owner").map(|o| o.text()).as_deref(), Some("me"));
    let ttl = info.get("ttl").and_then(|t| t.as_int());
    assert!(ttl.is_some_and(|t| t > 9000 && t <= 10000), "{info:?}");
    let extend = |t: &[u8]| args!["LOCK.EXTEND", "kit:a", t, "PX", 5000u64];
    assert_eq!(c.cmd(&extend(b"other")).int(), 0);
    assert_eq!(c.cmd(&extend(&token)).int(), 1);
    assert_eq!(c.cmd(&args!["LOCK.RELEASE", "kit:a", token]).int(), 1);
    assert_eq!(c.cmd(&["LOCK.INFO", "kit:a"]), Resp::Nil);
    assert_eq!(lock_stat(&mut c, "released"), 1);
}

#[test]
fn a_replica_pair_replicates_and_a_restart_keeps_the_port() {
    let mut pair = ReplicaPair::start();
    let fence_granted = acquire(&mut pair.primary.raw(), "kit:r");
    let mut r = pair.replica.raw();
    assert!(wait_until(Duration::from_secs(5), || {
        fence(&mut r, "kit:r") == Some(fence_granted)
    }));
    let port = pair.replica.port;
    pair.replica.restart();
    assert_eq!(pair.replica.port, port);
    pair.replica.wait_synced(Duration::from_secs(20)).unwrap();
}

#[test]
fn raw_bytes_reach_the_server_as_they_are() {
    let server = ServerBuilder::new().no_module().start();
    let mut c = server.raw();
    c.queue_raw(b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n");
    c.flush().unwrap();
    assert_eq!(c.read().unwrap(), Resp::Simple("PONG".into()));
    assert_eq!(c.read().unwrap().text(), "hi");
    let replies = c
        .pipeline(&[args!["SET", "k", 1u64], args!["INCRBY", "k", 41u64]])
        .unwrap();
    assert_eq!(replies[1], Resp::Int(42));
    // A malformed multibulk length: the server answers with a protocol error.
    c.queue_raw(b"*1\r\n$x\r\n");
    c.flush().unwrap();
    assert!(c.read().unwrap().err().contains("Protocol error"));
}

#[test]
fn failover_swaps_the_pair_and_a_killed_primary_rejoins_as_replica() {
    let mut pair = ReplicaPair::start();
    let granted = acquire(&mut pair.primary.raw(), "kit:f");
    let old = pair.primary.port;
    pair.failover(Duration::from_secs(5)).unwrap();
    assert_eq!(pair.replica.port, old, "the old primary is the replica now");
    assert_eq!(pair.primary.role().as_deref(), Some("master"));
    assert_eq!(pair.replica.role().as_deref(), Some("slave"));
    assert_eq!(
        fence(&mut pair.primary.raw(), "kit:f"),
        Some(granted),
        "the lock moved along"
    );
    // The primary dies; the replica is promoted; the dead one comes back as its replica.
    pair.primary.kill9();
    assert_eq!(
        pair.replica.raw().cmd(&["REPLICAOF", "NO", "ONE"]),
        Resp::Simple("OK".into())
    );
    let (dead, promoted) = (&mut pair.primary, &pair.replica);
    dead.try_restart_as_replica_of(promoted).unwrap();
    assert_eq!(dead.role().as_deref(), Some("slave"));
    dead.wait_synced(Duration::from_secs(20)).unwrap();
}

#[test]
fn a_slot_moves_with_its_lock_and_back() {
    let cluster = Cluster::start(3);
    let key = "{kit:m}lock";
    let slot = redis_lock_testkit::key_slot(key.as_bytes());
    let from = cluster.slot_owner(slot).expect("an owner");
    let granted = acquire(&mut cluster.nodes[from].raw(), key);
    let to = (from + 1) % 3;
    let pause = Duration::from_millis(5);
    assert_eq!(cluster.migrate_slot(slot, to, pause), Ok(1));
    assert_eq!(cluster.slot_owner(slot), Some(to));
    assert_eq!(fence(&mut cluster.nodes[to].raw(), key), Some(granted));
    assert_eq!(cluster.migrate_slot(slot, from, pause), Ok(1));
    assert_eq!(cluster.slot_owner(slot), Some(from));
    assert_eq!(
        cluster.migrate_slot(slot, from, pause),
        Ok(0),
        "already there"
    );
}
