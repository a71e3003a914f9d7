//! The 48-byte holder (its compact form and its boxed one): holders in both forms (IPv6
//! clients, owner labels, sessions, lock-delay, shared locks with many holders, far
//! fences, fields at the compact form's limits) survive DEBUG RELOAD, DUMP/RESTORE, an AOF
//! rewrite and a replica's full sync with the same LOCK.INFO; the lease index keeps long
//! names (binary, empty, 200 bytes) and high dbs on time through RELEASE, EXTEND, RENAME,
//! MOVE, SWAPDB and expiry, and a name's length does not change what a lock costs.

mod common;

use common::conn::{acquire, durable, lock_info, release, Info};
use common::{debug_server, far_fence, start_replica_of, wait_until, Server, ServerBuilder};
use redis::{Connection, Value};
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(20);

/// Locks of every holder form, from an IPv4 and an IPv6 client; their durable LOCK.INFO.
fn make_all(c4: &mut Connection, c6: &mut Connection) -> Vec<(String, Info)> {
    let far = far_fence().to_string();
    let _: Value = redis::cmd("LOCK.SESSION")
        .arg(&["OPEN", "sess-review-0001", "PX", "600000"])
        .query(c4)
        .unwrap();
    let plans: Vec<(&str, bool, Vec<&str>)> = vec![
        ("v4:plain", false, vec!["PX", "600000"]),
        ("v6:plain", true, vec!["PX", "600000"]),
        ("v6:owner", true, vec!["PX", "600000", "OWNER", "svc-v6"]),
        ("v4:owner", false, vec!["PX", "600000", "OWNER", "o"]),
        ("v4:far", false, vec!["PX", "600000", "MINFENCE", &far]),
        (
            "v6:far",
            true,
            vec!["PX", "600000", "MINFENCE", &far, "OWNER", "x"],
        ),
        ("v4:delay", false, vec!["PX", "600000", "LOCKDELAY", "7000"]),
        ("v4:session", false, vec!["SESSION", "sess-review-0001"]),
    ];
    let mut out = vec![];
    for (k, six, args) in plans {
        let c = if six { &mut *c6 } else { &mut *c4 };
        assert!(acquire(c, k, &args).is_some(), "{k}");
        out.push(k.to_string());
    }
    // Shared and counted locks with many holders, half from each client.
    for (k, mode, n) in [
        ("shared:small", vec!["SHARED"], 3),
        ("shared:large", vec!["SHARED"], 40),
        ("limit:large", vec!["LIMIT", "50"], 50),
    ] {
        for i in 0..n {
            let owner = format!("own-{i}");
            let mut args = mode.clone();
            args.extend(["PX", "600000"]);
            if i % 3 == 0 {
                args.extend(["OWNER", owner.as_str()]);
            }
            let c = if i % 2 == 0 { &mut *c6 } else { &mut *c4 };
            assert!(acquire(c, k, &args).is_some(), "{k} #{i}");
        }
        out.push(k.to_string());
    }
    out.into_iter()
        .map(|k| {
            let i = info_now(c4, &k);
            (k, i)
        })
        .collect()
}

/// A LOCK.INFO COUNT reply without its clocked fields (ttl, expires-at).
fn strip(v: &Value) -> Value {
    match v {
        Value::Array(kv) => {
            let pairs = kv.len() % 2 == 0
                && kv
                    .chunks(2)
                    .all(|p| matches!(p[0], Value::BulkString(_) | Value::SimpleString(_)));
            if pairs {
                Value::Array(
                    kv.chunks(2)
                        .filter(|p| {
                            let k: String = redis::from_redis_value_ref(&p[0]).unwrap_or_default();
                            k != "ttl" && k != "expires-at" && k != "waited"
                        })
                        .flat_map(|p| [p[0].clone(), strip(&p[1])])
                        .collect(),
                )
            } else {
                Value::Array(kv.iter().map(strip).collect())
            }
        }
        Value::Map(kv) => Value::Map(
            kv.iter()
                .filter(|(k, _)| {
                    let k: String = redis::from_redis_value_ref(k).unwrap_or_default();
                    k != "ttl" && k != "expires-at"
                })
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn info_now(c: &mut Connection, k: &str) -> Info {
    let i = lock_info(c, k).unwrap_or_else(|| panic!("{k} free"));
    let page: Value = redis::cmd("LOCK.INFO")
        .arg(k)
        .arg("COUNT")
        .arg(100)
        .query(c)
        .unwrap();
    let mut i = durable(&i);
    i.insert("page".into(), strip(&page));
    i
}

/// A server listening on 127.0.0.1 and ::1, with a connection over each.
fn dual_stack(b: ServerBuilder) -> (Server, Connection, Connection) {
    let p = b.arg("bind", "127.0.0.1 ::1").start();
    let c4 = p.conn();
    let c6 = redis::Client::open(format!("redis://[::1]:{}/", p.port))
        .unwrap()
        .get_connection()
        .unwrap();
    (p, c4, c6)
}

#[test]
fn holders_of_both_forms_round_trip_reload_restore_and_sync() {
    let (p, mut c4, mut c6) = dual_stack(debug_server().arg("repl-diskless-sync-delay", "0"));
    let want = make_all(&mut c4, &mut c6);
    let addr6 = want
        .iter()
        .find(|(k, _)| k == "v6:owner")
        .and_then(|(_, i)| common::conn::bytes_field(i, "client-addr"))
        .unwrap();
    assert!(
        addr6.starts_with(b"::1:"),
        "{}",
        String::from_utf8_lossy(&addr6)
    );
    // DUMP/RESTORE into a copy.
    for (k, i) in &want {
        let d: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut c4).unwrap();
        let copy = format!("copy:{k}");
        let _: () = redis::cmd("RESTORE")
            .arg(&copy)
            .arg(0)
            .arg(d)
            .query(&mut c4)
            .unwrap();
        assert_eq!(&info_now(&mut c4, &copy), i, "RESTORE of {k}");
    }
    // A replica's full sync.
    let r = start_replica_of(&p, ServerBuilder::new());
    let mut rc = r.conn();
    assert!(
        wait_until(SETTLE, || lock_info(&mut rc, "limit:large").is_some()),
        "replica synced"
    );
    for (k, i) in &want {
        assert_eq!(&info_now(&mut rc, k), i, "replica of {k}");
    }
    // DEBUG RELOAD (RDB save and load).
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c4).unwrap();
    for (k, i) in &want {
        assert_eq!(&info_now(&mut c4, k), i, "DEBUG RELOAD of {k}");
    }
}

/// Names of every form the lease index files: inline, just too long, 200 bytes, binary,
/// empty.
fn names(n: usize) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![
        vec![],
        vec![0u8],
        vec![0xffu8; 18],
        vec![b'k'; 19],
        vec![0u8; 200],
    ];
    for i in 0..n {
        let mut name = format!("lease:{i}:").into_bytes();
        name.resize(if i % 3 == 0 { 12 } else { 200 }, (i % 251) as u8);
        v.push(name);
    }
    v
}

fn select(c: &mut Connection, db: i64) {
    let _: () = redis::cmd("SELECT").arg(db).query(c).unwrap();
}

fn acq(c: &mut Connection, k: &[u8], px: &str) -> Vec<u8> {
    let v: Value = redis::cmd("LOCK.ACQUIRE")
        .arg(k)
        .arg("PX")
        .arg(px)
        .query(c)
        .unwrap();
    common::conn::grant(&v)
        .unwrap_or_else(|| panic!("{:?} not granted", k))
        .0
}

fn dbsize(c: &mut Connection, db: i64) -> i64 {
    select(c, db);
    redis::cmd("DBSIZE").query(c).unwrap()
}

#[test]
fn long_names_and_high_dbs_end_on_time_and_leave_nothing_growing() {
    let s = ServerBuilder::new().arg("databases", "1000").start();
    let mut c = s.conn();
    let names = names(3000);
    let base = {
        // Once, so that the index's tables exist at the start of the measure.
        select(&mut c, 999);
        let t = acq(&mut c, b"warm", "60000");
        release(&mut c, "warm", &t);
        used_memory(&mut c)
    };
    let mut held_after = vec![];
    for round in 0..3 {
        // db 999 and db 0: short leases, in batches that end in the same millisecond.
        for db in [999i64, 0, 300] {
            select(&mut c, db);
            let mut pipe = redis::pipe();
            for n in &names {
                pipe.cmd("LOCK.ACQUIRE").arg(n).arg("PX").arg(400);
            }
            let _: Vec<Value> = pipe.query(&mut c).unwrap();
        }
        // A few released, extended, renamed, moved; then db 0 and 300 swapped.
        select(&mut c, 999);
        let t = acq(&mut c, &[7u8; 200], "400");
        assert_eq!(
            release(&mut c, std::str::from_utf8(&[7u8; 200]).unwrap(), &t),
            1
        );
        let keep = vec![9u8; 150];
        let t = acq(&mut c, &keep, "400");
        let one: i64 = redis::cmd("LOCK.EXTEND")
            .arg(&keep)
            .arg(&t)
            .arg("PX")
            .arg(60000)
            .query(&mut c)
            .unwrap();
        assert_eq!(one, 1);
        let _: () = redis::cmd("RENAME")
            .arg(&names[10])
            .arg(vec![3u8; 190])
            .query(&mut c)
            .unwrap();
        let moved: i64 = redis::cmd("MOVE")
            .arg(&names[11])
            .arg(998)
            .query(&mut c)
            .unwrap();
        assert_eq!(moved, 1);
        let _: () = redis::cmd("UNLINK").arg(&names[12]).query(&mut c).unwrap();
        let _: () = redis::cmd("SWAPDB").arg(0).arg(300).query(&mut c).unwrap();
        // Every short lease ends: every db but the kept key's empties by itself.
        assert!(
            wait_until(SETTLE, || {
                dbsize(&mut c, 0) == 0
                    && dbsize(&mut c, 300) == 0
                    && dbsize(&mut c, 998) == 0
                    && dbsize(&mut c, 999) == 1
            }),
            "round {round}: leases ended: db0 {} db300 {} db998 {} db999 {}",
            dbsize(&mut c, 0),
            dbsize(&mut c, 300),
            dbsize(&mut c, 998),
            dbsize(&mut c, 999)
        );
        select(&mut c, 999);
        let left: i64 = redis::cmd("EXISTS").arg(&keep).query(&mut c).unwrap();
        assert_eq!(left, 1, "the extended lease is still running");
        assert_eq!(release(&mut c, std::str::from_utf8(&keep).unwrap(), &t), 1);
        let settled = redis_lock_testkit::settled_memory(|| used_memory(&mut c))
            .unwrap_or_else(|r| panic!("used_memory did not settle: {r:?}"));
        held_after.push(settled - base);
    }
    // Nothing left held: the index keeps its high-water slab and chains (they go only
    // at FLUSHDB/SWAPDB), but a round of the same keys must not add to them (16 KiB: INFO's and the allocator's own movement).
    let (first, last) = (held_after[0], held_after[2]);
    assert!(
        last - first < 16 * 1024,
        "used_memory above the start after each round: {held_after:?}"
    );
}

/// Holders whose client id or grant time the compact form cannot keep (a client id of
/// 2^32 and more, a grant time far from its fence's clock term, as a value from another
/// server may carry), and those just inside its limits: RESTORE of an edited DUMP shows
/// them in LOCK.INFO as they were given, and DEBUG RELOAD and DUMP keep them.
#[test]
fn restored_holders_at_the_compact_limits_keep_their_fields() {
    use redis_lock_testkit::paths::{ModuleDump, Op};
    let s = debug_server().start();
    let mut c = s.conn();
    let (_, fence) = acquire(&mut c, "src", &["PX", "600000"]).unwrap();
    let d: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    let d = ModuleDump::parse(&d).unwrap();
    let term10 = (fence as u64 >> 10) as i64;
    let term20 = (fence as u64 >> 20) as i64;
    let u32max = u64::from(u32::MAX);
    let cases: Vec<(i64, u64)> = vec![
        (term10, u32max),
        (term10, u32max + 1),
        (term10, i64::MAX as u64),
        (term10 + (1 << 30) - 1, 0),
        (term10 + (1 << 30), 1),
        (term10 - (1 << 30), 1),
        (term10 - (1 << 30) - 1, 1),
        (term20 + (1 << 30) - 1, 1),
        (term20 + (1 << 30), 1),
        (term20 - (1 << 30) - 1, 1),
        (0, 1),
        (1, 1),
        (i64::MAX, 1),
    ];
    for (i, (at, client)) in cases.into_iter().enumerate() {
        let mut ops = d.ops.clone();
        ops[5] = Op::Uint(at as u64);
        ops[6] = Op::Uint(client);
        let payload = ModuleDump { ops, ..d.clone() }.encode();
        let key = format!("k{i}");
        let r: redis::RedisResult<()> = redis::cmd("RESTORE")
            .arg(&key)
            .arg(0)
            .arg(&payload)
            .query(&mut c);
        if let Err(e) = r {
            // Refused as a whole is fine; nothing else is.
            eprintln!("case {i} ({at}, {client}) refused: {e}");
            continue;
        }
        let check = |c: &mut Connection, what: &str| {
            let info = lock_info(c, &key).unwrap();
            assert_eq!(
                (
                    common::conn::int_field(&info, "acquired-at"),
                    common::conn::int_field(&info, "client-id") as u64
                ),
                (at, client),
                "case {i} {what}"
            );
            let again: Vec<u8> = redis::cmd("DUMP").arg(&key).query(c).unwrap();
            let again = ModuleDump::parse(&again).unwrap();
            assert_eq!(
                (&again.ops[5], &again.ops[6]),
                (&Op::Uint(at as u64), &Op::Uint(client)),
                "case {i} {what}: DUMP"
            );
        };
        check(&mut c, "restored");
        let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
        check(&mut c, "reloaded");
    }
}

/// The same holders through an AOF rewrite and a restart.
#[test]
fn holders_of_both_forms_survive_an_aof_rewrite_and_restart() {
    let (mut p, mut c4, mut c6) = dual_stack(
        debug_server()
            .arg("appendonly", "yes")
            .arg("appendfsync", "always"),
    );
    let want = make_all(&mut c4, &mut c6);
    let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c4).unwrap();
    common::wait_persistence_idle(&p, SETTLE);
    drop((c4, c6));
    p.restart();
    let mut c = p.conn();
    for (k, i) in &want {
        assert_eq!(&info_now(&mut c, k), i, "AOF rewrite and restart of {k}");
    }
}

/// Long names in a high db on the coarse level (an hour) and in the overflow (a day
/// and more), released, then taken again with short leases that end by themselves.
#[test]
fn long_names_on_the_coarse_level_and_overflow_release_and_end() {
    let s = ServerBuilder::new().arg("databases", "1000").start();
    let mut c = s.conn();
    select(&mut c, 777);
    let names = names(600);
    let mut held = vec![];
    for (i, n) in names.iter().enumerate() {
        let px = ["3600000", "80000000", "30000"][i % 3];
        held.push(acq(&mut c, n, px));
    }
    // Lengthen some (the index keeps the early entry), shorten others.
    for (i, (n, t)) in names.iter().zip(&held).enumerate().step_by(5) {
        let px = if i % 2 == 0 { "86000000" } else { "300" };
        let one: i64 = redis::cmd("LOCK.EXTEND")
            .arg(n)
            .arg(t)
            .arg("PX")
            .arg(px)
            .query(&mut c)
            .unwrap();
        assert_eq!(one, 1, "extend {i}");
    }
    for (i, (n, t)) in names.iter().zip(&held).enumerate() {
        if i % 5 == 0 && i % 2 == 1 {
            continue; // shortened: ends by itself
        }
        let one: i64 = redis::cmd("LOCK.RELEASE")
            .arg(n)
            .arg(t)
            .query(&mut c)
            .unwrap();
        assert_eq!(one, 1, "release {i}");
    }
    assert!(
        wait_until(SETTLE, || dbsize(&mut c, 777) == 0),
        "left: {}",
        dbsize(&mut c, 777)
    );
    select(&mut c, 777);
    for n in &names {
        acq(&mut c, n, "300");
    }
    assert!(
        wait_until(SETTLE, || dbsize(&mut c, 777) == 0),
        "left: {}",
        dbsize(&mut c, 777)
    );
    let mut raw = s.raw();
    assert_eq!(common::lock_stat(&mut raw, "lock_held"), 0);
}

/// The server's `used_memory`.
fn used_memory(c: &mut Connection) -> i64 {
    let i: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
    redis_lock_testkit::info_field(&i, "used_memory")
        .unwrap()
        .parse()
        .unwrap()
}

/// used_memory per held lock with `n` locks named `len` bytes, on a fresh server.
fn per_lock(len: usize, n: usize) -> i64 {
    let s = ServerBuilder::new().start();
    let mut c = s.conn();
    let before = redis_lock_testkit::settled_memory(|| used_memory(&mut c)).unwrap();
    let mut pipe = redis::pipe();
    for i in 0..n {
        let mut k = format!("k{i:06}:").into_bytes();
        k.resize(len, b'x');
        pipe.cmd("LOCK.ACQUIRE").arg(k).arg("PX").arg(600_000);
    }
    let _: Vec<Value> = pipe.query(&mut c).unwrap();
    let after = redis_lock_testkit::settled_memory(|| used_memory(&mut c)).unwrap();
    (after - before) / n as i64
}

/// A lock name of 19 bytes must not cost a held lock more than one of 18: the lease
/// index keeps names of up to 22 bytes in its node. A 40-byte node keeping only 18 (tried
/// for the memory goal, which the bench measures with 17-byte names) made every name of
/// 19-22 bytes cost a heap copy and a table slot besides: 202 -> 274 B on Redis 7.0.15.
#[test]
fn a_name_over_the_inline_limit_costs_no_more_than_its_byte() {
    let (short, long) = (per_lock(18, 20_000), per_lock(19, 20_000));
    assert!(
        long - short < 16,
        "used_memory per held lock: {short} B with 18-byte names, {long} B with 19"
    );
}
