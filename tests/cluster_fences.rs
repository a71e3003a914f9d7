//! Regression tests for issue 20's cluster rows: a key's fence never goes back when its
//! (free) slot moves to another node, whatever MINFENCE did on the old node and whenever
//! each node started.

mod regress;

use redis_lock_testkit::{key_slot, Cluster};
use regress::*;
use std::thread::sleep;
use std::time::Duration;

/// A key whose slot node `i` serves.
fn key_on(cluster: &Cluster, i: usize, prefix: &str) -> (String, u16) {
    (0..100_000)
        .map(|n| format!("{prefix}:{n}"))
        .map(|k| {
            let slot = key_slot(k.as_bytes());
            (k, slot)
        })
        .find(|(_, slot)| cluster.slot_owner(*slot) == Some(i))
        .expect("a key for the node")
}

/// Acquires as a cluster client does (a TRYAGAIN is retried).
fn acquire_on(node: &Server, key: &str, args: &[&str]) -> (Vec<u8>, i64) {
    let r = redis_lock_testkit::lock::acquire_in_cluster(&mut conn(node), key, args, SETTLE);
    grant(&r).unwrap_or_else(|| panic!("LOCK.ACQUIRE {key} on {}: {r:?}", node.port))
}

/// Grants `k` on node `b` (with `extra` options), releases it, moves its free slot to
/// node `a` and grants it there: the fence there must be above the one `b` gave.
fn fence_after_slot_move(cluster: &Cluster, a: usize, b: usize, prefix: &str, extra: &[&str]) {
    let (k, slot) = key_on(cluster, b, prefix);
    let t = tok("cluster-b");
    let mut args = vec!["PX", "60000", "TOKEN", t.as_str()];
    args.extend_from_slice(extra);
    let (_, fence_b) = acquire_on(&cluster.nodes[b], &k, &args);
    let mut cb = conn(&cluster.nodes[b]);
    assert_eq!(cb.cmd(&["LOCK.RELEASE", &k, &t]), Resp::Int(1));
    cluster
        .migrate_slot(slot, a, Duration::from_millis(100))
        .unwrap_or_else(|e| panic!("moving slot {slot}: {e}"));
    let (_, fence_a) = acquire_on(&cluster.nodes[a], &k, &["PX", "60000"]);
    assert!(
        fence_a > fence_b,
        "{k}: fence {fence_a} on node {a} after its slot moved, node {b} had given {fence_b} \
         (back by {} ms of clock term)",
        (fence_b - fence_a) >> redis_lock_testkit::lock::FENCE_SHIFT
    );
}

#[test]
fn a_minfence_lift_is_not_lost_when_the_free_slot_moves() {
    let cluster = Cluster::start(3);
    // The highest lift this server takes: just under an hour ahead of its clock term.
    let lift = ((redis_lock_testkit::unix_ms() + 3_600_000 - 2_000) as u64)
        << redis_lock_testkit::lock::FENCE_SHIFT;
    fence_after_slot_move(&cluster, 0, 1, "lift", &["MINFENCE", &lift.to_string()]);
}

#[test]
fn a_later_started_node_s_fences_are_not_lost_when_the_free_slot_moves() {
    let mut cluster = Cluster::start(3);
    // Node 1 starts 2 s after node 0 (a restart with its cluster configuration).
    sleep(Duration::from_secs(2));
    cluster.nodes[1].kill9();
    cluster.nodes[1]
        .try_restart()
        .unwrap_or_else(|e| panic!("restarting node 1: {e}"));
    assert!(
        cluster.wait_ok(redis_lock_testkit::CLUSTER_TIMEOUT),
        "cluster not ok after the restart\n{}",
        cluster.describe()
    );
    fence_after_slot_move(&cluster, 0, 1, "later", &[]);
}

/// The same through LOCK.ACQUIREALL: its MINFENCE lift reaches the other nodes, so the
/// fences of its keys never go back when their free slot moves.
#[test]
fn an_acquireall_minfence_lift_is_not_lost_when_the_free_slot_moves() {
    let cluster = Cluster::start(3);
    let (a, b) = (0, 1);
    let lift = ((redis_lock_testkit::unix_ms() + 3_600_000 - 2_000) as u64)
        << redis_lock_testkit::lock::FENCE_SHIFT;
    let (tag, slot) = key_on(&cluster, b, "liftall");
    let (k1, k2) = (format!("{{{tag}}}:1"), format!("{{{tag}}}:2"));
    let t = tok("cluster-all");
    let mut cb = conn(&cluster.nodes[b]);
    let lift_s = lift.to_string();
    let mut r = Resp::Nil;
    assert!(wait_until(SETTLE, || {
        r = cb.cmd(&[
            "LOCK.ACQUIREALL",
            "2",
            &k1,
            &k2,
            "PX",
            "60000",
            "TOKEN",
            &t,
            "MINFENCE",
            &lift_s,
        ]);
        !is_err_with(&r, "TRYAGAIN")
    }));
    let fences: Vec<i64> = r.items()[1]
        .items()
        .iter()
        .filter_map(|f| f.as_int())
        .collect();
    assert_eq!(fences.len(), 2, "{r:?}");
    assert!(fences[0] as u64 >= lift, "{fences:?} below MINFENCE {lift}");
    assert_eq!(
        cb.cmd(&["LOCK.RELEASEALL", "2", &k1, &k2, &t]),
        Resp::Int(2)
    );
    cluster
        .migrate_slot(slot, a, Duration::from_millis(100))
        .unwrap_or_else(|e| panic!("moving slot {slot}: {e}"));
    let (_, fence_a) = acquire_on(&cluster.nodes[a], &k2, &["PX", "60000"]);
    assert!(
        fence_a > fences[1],
        "{k2}: fence {fence_a} on node {a} after its slot moved, node {b} had given {}",
        fences[1]
    );
}
