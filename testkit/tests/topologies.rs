//! The kit against real servers: the typed lock helpers, a replica pair, a restart, and
//! the raw-bytes mode (needs the module built: `cargo build --release`).

use std::time::Duration;

use redis_lock_testkit::lock::{self, lock_stat};
use redis_lock_testkit::{args, wait_until, Cluster, ReplicaPair, Resp, ServerBuilder};

#[test]
fn typed_helpers_follow_a_lock_through_its_life() {
    let server = ServerBuilder::new().start();
    let mut c = server.raw();
    let g = lock::acquire(&mut c, "kit:a", &["PX", "10000", "OWNER", "me"])
        .unwrap()
        .expect("free");
    assert!(
        lock::acquire(&mut c, "kit:a", &["PX", "10000"])
            .unwrap()
            .is_none(),
        "held"
    );
    let info = lock::info(&mut c, "kit:a").unwrap().expect("held");
    assert_eq!(
        (info.fence, info.owner.as_deref()),
        (Some(g.fence), Some("me"))
    );
    assert!(info.ttl.is_some_and(|t| t > 9000 && t <= 10000), "{info:?}");
    let extend = |t: &[u8]| args!["LOCK.EXTEND", "kit:a", t, "PX", 5000u64];
    assert_eq!(c.cmd(&extend(b"other")), Resp::Int(0));
    assert_eq!(c.cmd(&extend(&g.token)), Resp::Int(1));
    assert_eq!(
        c.cmd(&args!["LOCK.RELEASE", "kit:a", g.token]),
        Resp::Int(1)
    );
    assert_eq!(lock::info(&mut c, "kit:a").unwrap(), None);
    assert_eq!(lock_stat(&mut c, "released"), 1);
}

#[test]
fn a_pair_replicates_restarts_fails_over_and_a_killed_primary_rejoins() {
    let mut pair = ReplicaPair::try_start_with(ServerBuilder::new(), ServerBuilder::new()).unwrap();
    let mut p = pair.primary.raw();
    let g = lock::acquire(&mut p, "kit:r", &["PX", "60000"])
        .unwrap()
        .expect("free");
    let mut r = pair.replica.raw();
    assert!(wait_until(Duration::from_secs(5), || {
        lock::info(&mut r, "kit:r").unwrap().and_then(|i| i.fence) == Some(g.fence)
    }));
    let port = pair.replica.port;
    pair.replica.restart();
    assert_eq!(pair.replica.port, port);
    pair.replica.wait_synced(Duration::from_secs(20)).unwrap();
    let g = lock::acquire(&mut pair.primary.raw(), "kit:f", &["PX", "60000"])
        .unwrap()
        .expect("free");
    let old = pair.primary.port;
    pair.failover(Duration::from_secs(5)).unwrap();
    assert_eq!(pair.replica.port, old, "the old primary is the replica now");
    assert_eq!(pair.primary.role().as_deref(), Some("master"));
    assert_eq!(pair.replica.role().as_deref(), Some("slave"));
    let info = lock::info(&mut pair.primary.raw(), "kit:f").unwrap();
    assert_eq!(
        info.and_then(|i| i.fence),
        Some(g.fence),
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
fn a_slot_moves_with_its_lock_and_back() {
    let cluster = Cluster::start(3);
    let key = "{kit:m}lock";
    let slot = redis_lock_testkit::key_slot(key.as_bytes());
    let from = cluster.slot_owner(slot).expect("an owner");
    let g = lock::acquire(&mut cluster.nodes[from].raw(), key, &["PX", "60000"])
        .unwrap()
        .expect("free");
    let to = (from + 1) % 3;
    let pause = Duration::from_millis(5);
    assert_eq!(cluster.migrate_slot(slot, to, pause), Ok(1));
    assert_eq!(cluster.slot_owner(slot), Some(to));
    let info = lock::info(&mut cluster.nodes[to].raw(), key).unwrap();
    assert_eq!(info.and_then(|i| i.fence), Some(g.fence));
    assert_eq!(cluster.migrate_slot(slot, from, pause), Ok(1));
    assert_eq!(cluster.slot_owner(slot), Some(from));
    assert_eq!(
        cluster.migrate_slot(slot, from, pause),
        Ok(0),
        "already there"
    );
}
