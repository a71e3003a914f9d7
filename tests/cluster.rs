//! Redis Cluster: every lock command routes by its key (key specs), works on every
//! master through a cluster-aware client, blocking hand-off works there, a node that does
//! not own the key's slot answers MOVED, and COMMAND GETKEYS names the key (a guard's:
//! the lock key and the wrapped command's keys, which must share its slot).

mod common;

use common::conn::{int, release};
use common::{key_slot, tok, wait_until, Cluster, Server};
use redis::{Connection, Value};
use std::collections::HashSet;
use std::time::Duration;

/// One key per master: `(key, owning node's port)`.
fn key_per_master(cluster: &Cluster, prefix: &str) -> Vec<(String, u16)> {
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    for i in 0..1000 {
        let k = format!("{prefix}:{i}");
        let port = cluster.node_for_key(&k).port;
        if seen.insert(port) {
            keys.push((k, port));
        }
        if keys.len() == cluster.nodes.len() {
            return keys;
        }
    }
    panic!("could not find a key for every master");
}

fn node(cluster: &Cluster, port: u16) -> &Server {
    cluster.nodes.iter().find(|n| n.port == port).unwrap()
}

/// LOCK.INFO field, from a RESP2 flat array or a RESP3 map; None when the reply is nil.
fn info_field(v: &Value, field: &str) -> Option<Value> {
    let pairs: Vec<(&Value, &Value)> = match v {
        Value::Nil => return None,
        Value::Array(items) => items.chunks(2).map(|p| (&p[0], &p[1])).collect(),
        Value::Map(kv) => kv.iter().map(|(k, v)| (k, v)).collect(),
        other => panic!("unexpected LOCK.INFO reply {other:?}"),
    };
    pairs
        .into_iter()
        .find(|(k, _)| redis::from_redis_value_ref::<String>(k).ok().as_deref() == Some(field))
        .map(|(_, v)| v.clone())
}

fn info_int(v: &Value, field: &str) -> i64 {
    let f = info_field(v, field).unwrap_or_else(|| panic!("no {field} in {v:?}"));
    redis::from_redis_value_ref(&f).unwrap()
}

fn waiters_on(server: &Server) -> Option<String> {
    server.info_field("lock", "lock_waiters")
}

#[test]
fn lock_commands_work_on_every_master_through_a_cluster_client() {
    let cluster = Cluster::start(3);
    let client = cluster.cluster_client();
    let mut cc = client.get_connection().unwrap();
    let keys = key_per_master(&cluster, "clock");

    for (i, (key, port)) in keys.iter().enumerate() {
        let owner = format!("owner-{i}");
        let token = tok(&format!("tok-{i}"));
        let (t, fence): (String, i64) = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg("PX")
            .arg(60000)
            .arg("TOKEN")
            .arg(&token)
            .arg("OWNER")
            .arg(&owner)
            .query(&mut cc)
            .unwrap();
        assert_eq!(t, token);
        assert!(fence > 0);

        // The lock lives on the node that owns the slot.
        let mut nc = node(&cluster, *port).conn();
        let on_node: Value = redis::cmd("LOCK.INFO").arg(key).query(&mut nc).unwrap();
        assert_eq!(info_int(&on_node, "fence"), fence, "{key} on its node");
        let ty: String = redis::cmd("TYPE").arg(key).query(&mut nc).unwrap();
        assert_eq!(ty, "redislock");

        // INFO through the cluster client.
        let info: Value = redis::cmd("LOCK.INFO").arg(key).query(&mut cc).unwrap();
        assert_eq!(info_int(&info, "fence"), fence);
        let o: String = redis::from_redis_value_ref(&info_field(&info, "owner").unwrap()).unwrap();
        assert_eq!(o, owner);

        // Held: another token does not get it.
        let other: Option<(String, i64)> = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg("PX")
            .arg(1000)
            .query(&mut cc)
            .unwrap();
        assert!(other.is_none(), "{key} granted twice");

        // EXTEND.
        let n: i64 = redis::cmd("LOCK.EXTEND")
            .arg(key)
            .arg(&token)
            .arg("PX")
            .arg(120000)
            .query(&mut cc)
            .unwrap();
        assert_eq!(n, 1);
        let info: Value = redis::cmd("LOCK.INFO").arg(key).query(&mut cc).unwrap();
        let ttl = info_int(&info, "ttl");
        assert!(ttl > 60000, "{key}: lease {ttl} after EXTEND PX 120000");
        // The lease is the module's: the key has no Redis expiry.
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut cc).unwrap();
        assert_eq!(pttl, -1, "{key}");

        // RELEASE.
        let n = release(&mut cc, key, token.as_bytes());
        assert_eq!(n, 1);
        let info: Value = redis::cmd("LOCK.INFO").arg(key).query(&mut cc).unwrap();
        assert_eq!(info, Value::Nil);

        // FORCERELEASE of a new grant with a greater fence.
        let (_, f2): (String, i64) = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg("PX")
            .arg(60000)
            .query(&mut cc)
            .unwrap();
        assert!(f2 > fence);
        let n: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(key)
            .query(&mut cc)
            .unwrap();
        assert_eq!(n, 1);
        let n: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(key)
            .query(&mut cc)
            .unwrap();
        assert_eq!(n, 0);
        let exists: i64 = redis::cmd("EXISTS").arg(key).query(&mut nc).unwrap();
        assert_eq!(exists, 0);
    }

    // Blocking hand-off on every master, the waiter on its own cluster connection.
    for (key, port) in &keys {
        let (ta, fa): (String, i64) = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg("PX")
            .arg(60000)
            .query(&mut cc)
            .unwrap();
        let mut wc = client.get_connection().unwrap();
        let wkey = key.clone();
        let wtok = tok("tok-waiter");
        let waiter = std::thread::spawn(move || -> Option<(String, i64)> {
            redis::cmd("LOCK.ACQUIRE")
                .arg(&wkey)
                .arg("TOKEN")
                .arg(&wtok)
                .arg("PX")
                .arg(60000)
                .arg("BLOCK")
                .arg(5000)
                .query(&mut wc)
                .unwrap()
        });
        let owner_node = node(&cluster, *port);
        assert!(
            wait_until(Duration::from_secs(5), || waiters_on(owner_node).as_deref()
                == Some("1")),
            "{key}: the waiter never queued on its node"
        );
        let n = release(&mut cc, key, ta.as_bytes());
        assert_eq!(n, 1);
        let (tb, fb) = waiter
            .join()
            .unwrap()
            .unwrap_or_else(|| panic!("{key}: the waiter was not handed the lock"));
        assert_eq!(tb, tok("tok-waiter"));
        assert!(fb > fa, "{key}: hand-off fence {fb} <= {fa}");
        let info: Value = redis::cmd("LOCK.INFO").arg(key).query(&mut cc).unwrap();
        assert_eq!(info_int(&info, "fence"), fb);
        let n: i64 = redis::cmd("LOCK.RELEASE")
            .arg(key)
            .arg(tok("tok-waiter"))
            .query(&mut cc)
            .unwrap();
        assert_eq!(n, 1);
    }

    // The guards, LOCK.CHECK and LOCK.WATCH route by the lock key; a guard's keys must
    // share its slot (a hash tag), else CROSSSLOT and nothing runs.
    let gtok = tok("tok-guard");
    let (_, gf): (String, i64) = redis::cmd("LOCK.ACQUIRE")
        .arg("{order:9001}:lock")
        .arg("PX")
        .arg(60000)
        .arg("TOKEN")
        .arg(&gtok)
        .query(&mut cc)
        .unwrap();
    let v: String = redis::cmd("LOCK.IFHELD")
        .arg("{order:9001}:lock")
        .arg(&gtok)
        .arg("SET")
        .arg("{order:9001}:stock")
        .arg("9")
        .query(&mut cc)
        .unwrap();
    assert_eq!(v, "OK");
    let v: i64 = redis::cmd("LOCK.IFFENCE")
        .arg("{order:9001}:lock")
        .arg(gf)
        .arg("INCR")
        .arg("{order:9001}:stock")
        .query(&mut cc)
        .unwrap();
    assert_eq!(v, 10);
    let other = (0..1000)
        .map(|i| format!("stock:{i}"))
        .find(|k| key_slot(k.as_bytes()) != key_slot(b"{order:9001}:lock"))
        .unwrap();
    for cmd in [
        redis::cmd("LOCK.IFHELD")
            .arg("{order:9001}:lock")
            .arg(&gtok)
            .arg("SET")
            .arg(&other)
            .arg("1")
            .clone(),
        redis::cmd("LOCK.IFFENCE")
            .arg("{order:9001}:lock")
            .arg(gf)
            .arg("MSET")
            .arg("{order:9001}:stock")
            .arg("1")
            .arg(&other)
            .arg("1")
            .clone(),
    ] {
        let r: redis::RedisResult<Value> = cmd.query(&mut cc);
        let e = r.expect_err("a guard on keys of two slots");
        assert_eq!(e.code(), Some("CROSSSLOT"), "{e}");
    }
    let stock: i64 = redis::cmd("GET")
        .arg("{order:9001}:stock")
        .query(&mut cc)
        .unwrap();
    assert_eq!(stock, 10, "a refused guard ran");
    let n = int(
        &mut cc,
        &["LOCK.CHECK", "{order:9001}:lock", &gf.to_string()],
    );
    assert_eq!(n, 1);
    let w: Value = redis::cmd("LOCK.WATCH")
        .arg("{order:9001}:lock")
        .query(&mut cc)
        .unwrap();
    assert_eq!(info_int(&w, "fence"), gf);
}

#[test]
fn wrong_node_answers_moved_and_getkeys_names_the_key() {
    let cluster = Cluster::start(3);
    let keys = key_per_master(&cluster, "cmoved");
    for (key, port) in &keys {
        let slot = key_slot(key.as_bytes());
        for other in cluster.nodes.iter().filter(|n| n.port != *port) {
            let mut c: Connection = other.conn();
            let cmds = [
                redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg("PX")
                    .arg(1000)
                    .clone(),
                redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg("BLOCK")
                    .arg(1000)
                    .clone(),
                redis::cmd("LOCK.RELEASE").arg(key).arg("t").clone(),
                redis::cmd("LOCK.EXTEND").arg(key).arg("t").clone(),
                redis::cmd("LOCK.INFO").arg(key).clone(),
                redis::cmd("LOCK.INFO")
                    .arg(key)
                    .arg("COUNT")
                    .arg(5)
                    .arg("AFTER")
                    .arg(1)
                    .clone(),
                redis::cmd("LOCK.FORCERELEASE").arg(key).clone(),
                redis::cmd("LOCK.CHECK").arg(key).arg(1).clone(),
                redis::cmd("LOCK.WATCH")
                    .arg(key)
                    .arg("BLOCK")
                    .arg(10)
                    .clone(),
                redis::cmd("LOCK.IFHELD")
                    .arg(key)
                    .arg("t")
                    .arg("PING")
                    .clone(),
                redis::cmd("LOCK.IFFENCE")
                    .arg(key)
                    .arg(1)
                    .arg("PING")
                    .clone(),
            ];
            for (i, cmd) in cmds.iter().enumerate() {
                let r: redis::RedisResult<Value> = cmd.query(&mut c);
                let e = match r {
                    Ok(v) => panic!("command #{i} on {key} at a wrong node answered {v:?}"),
                    Err(e) => e,
                };
                assert_eq!(e.code(), Some("MOVED"), "command #{i} on {key}: {e}");
                let detail = e.to_string();
                assert!(
                    detail.contains(&slot.to_string()) && detail.contains(&port.to_string()),
                    "MOVED should name slot {slot} and port {port}: {detail}"
                );
            }
            // Nothing was written on the wrong node.
            let n = int(&mut c, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
            assert_eq!(n, 0);
        }
    }

    let mut c = cluster.nodes[0].conn();
    let getkeys = |c: &mut Connection, args: &[&str]| -> Vec<String> {
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(args)
            .query(c)
            .unwrap()
    };
    assert_eq!(
        getkeys(&mut c, &["LOCK.ACQUIRE", "k", "PX", "10"]),
        vec!["k"]
    );
    // Option values that look like keys are not keys.
    assert_eq!(
        getkeys(
            &mut c,
            &[
                "LOCK.ACQUIRE",
                "lk",
                "TOKEN",
                "t",
                "OWNER",
                "o",
                "BLOCK",
                "0"
            ]
        ),
        vec!["lk"]
    );
    assert_eq!(getkeys(&mut c, &["LOCK.RELEASE", "rk", "tok"]), vec!["rk"]);
    assert_eq!(
        getkeys(&mut c, &["LOCK.EXTEND", "ek", "tok", "PX", "10"]),
        vec!["ek"]
    );
    assert_eq!(getkeys(&mut c, &["LOCK.INFO", "ik"]), vec!["ik"]);
    assert_eq!(
        getkeys(&mut c, &["LOCK.INFO", "ik", "COUNT", "5", "AFTER", "ak"]),
        vec!["ik"]
    );
    assert_eq!(getkeys(&mut c, &["LOCK.FORCERELEASE", "fk"]), vec!["fk"]);
    assert_eq!(
        getkeys(&mut c, &["LOCK.FORCERELEASE", "fk", "FENCE", "1"]),
        vec!["fk"]
    );
    assert_eq!(getkeys(&mut c, &["LOCK.CHECK", "ck", "1"]), vec!["ck"]);
    assert_eq!(
        getkeys(&mut c, &["LOCK.WATCH", "wk", "FENCE", "1", "OWNER", "o"]),
        vec!["wk"]
    );
    // A guard reports the lock key, then the keys of the command it wraps.
    assert_eq!(
        getkeys(
            &mut c,
            &["LOCK.IFHELD", "lk", "tok", "MSET", "a", "1", "b", "2"]
        ),
        vec!["lk", "a", "b"]
    );
    assert_eq!(
        getkeys(&mut c, &["LOCK.IFFENCE", "lk", "1", "GET", "g"]),
        vec!["lk", "g"]
    );
}
