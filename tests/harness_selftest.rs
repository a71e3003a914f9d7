//! Proves the integration-test harness itself (no module needed): start/stop, restart on
//! the same port and dir with AOF, and a 3-master cluster.

mod common;

use common::{server_flavor, wait_until, Cluster, ServerBuilder};
use redis::Commands;
use std::time::Duration;

#[test]
fn plain_server_answers_ping_and_reports_its_flavor() {
    let flavor = server_flavor();
    let mut server = ServerBuilder::new().no_module().start();
    let mut c = server.conn();
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");

    let info: String = redis::cmd("INFO").arg("server").query(&mut c).unwrap();
    let version_field = if flavor.is_valkey() {
        "valkey_version:"
    } else {
        "redis_version:"
    };
    let expected = format!("{version_field}{}", flavor.version());
    assert!(
        info.lines().any(|l| l.trim_end() == expected),
        "INFO server lacks {expected:?} for {flavor}:\n{info}"
    );
    // DEBUG is enabled for tests.
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert!(server.log().contains("Ready to accept connections"));

    let pid = server.pid();
    server.stop();
    assert!(
        !server.is_running(),
        "server {pid} still running after stop()"
    );
}

#[test]
fn restart_after_kill9_keeps_aof_data_on_same_port_and_dir() {
    let mut server = ServerBuilder::new()
        .no_module()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let (port, dir) = (server.port, server.dir.clone());
    {
        let mut c = server.conn();
        let _: () = c.set("harness:key", "survives").unwrap();
        let _: () = c.set_ex("harness:ttl", "x", 1000).unwrap();
    }
    let old_pid = server.pid();
    server.kill9();
    assert!(!server.is_running());

    server.restart();
    assert_eq!(server.port, port);
    assert_eq!(server.dir, dir);
    assert_ne!(server.pid(), old_pid);
    let mut c = server.conn();
    let v: Option<String> = c.get("harness:key").unwrap();
    assert_eq!(v.as_deref(), Some("survives"));
    let ttl: i64 = c.ttl("harness:ttl").unwrap();
    assert!(ttl > 0 && ttl <= 1000, "ttl {ttl}");
    let aof: String = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query::<Vec<String>>(&mut c)
        .unwrap()
        .join(" ");
    assert_eq!(aof, "appendonly yes");

    // A second server may reuse a stopped server's dir and port explicitly.
    server.stop();
    let again = ServerBuilder::new()
        .no_module()
        .dir(dir.clone())
        .port(port)
        .arg("appendonly", "yes")
        .start();
    let v: Option<String> = again.conn().get("harness:key").unwrap();
    assert_eq!(v.as_deref(), Some("survives"));
}

#[test]
fn bad_option_is_reported_by_try_start() {
    let err = ServerBuilder::new()
        .no_module()
        .arg("no-such-option-for-harness", "1")
        .start_timeout(Duration::from_secs(5))
        .try_start()
        .expect_err("server should refuse an unknown option");
    assert!(
        err.contains("no-such-option-for-harness"),
        "error should quote the server's complaint:\n{err}"
    );
}

#[test]
fn three_master_cluster_routes_keys() {
    let cluster = Cluster::start_with(3, |b| b.no_module());
    assert_eq!(cluster.nodes.len(), 3);
    let client = cluster.cluster_client();
    let mut c = client.get_connection().unwrap();
    let keys: Vec<String> = (0..30).map(|i| format!("harness:cluster:{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let _: () = c.set(k, i).unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        let v: usize = c.get(k).unwrap();
        assert_eq!(v, i, "key {k}");
    }
    // The keys really are spread over the nodes, and node_for_key agrees with the server.
    let mut owners = std::collections::HashSet::new();
    for k in &keys {
        let node = cluster.node_for_key(k);
        owners.insert(node.port);
        let v: Option<usize> = node.conn().get(k).unwrap();
        assert!(v.is_some(), "{k} not on node {}", node.addr());
    }
    assert_eq!(owners.len(), 3, "30 keys should land on all 3 masters");
    assert!(wait_until(Duration::from_secs(1), || cluster
        .wait_ok(Duration::from_millis(100))));
}

#[test]
fn key_slot_matches_known_values() {
    // Values from the Redis cluster specification / CLUSTER KEYSLOT.
    assert_eq!(common::key_slot(b"foo"), 12182);
    assert_eq!(common::key_slot(b"{user1000}.following"), 3443);
    assert_eq!(
        common::key_slot(b"{user1000}.followers"),
        common::key_slot(b"user1000")
    );
    assert_eq!(
        common::key_slot(b"foo{}{bar}"),
        common::key_slot(b"foo{}{bar}")
    );
}
