//! Upgrading from the format of commit 00e48ee ("v0.2": RDB encoding 2, LOCK.REPL in the
//! AOF): an RDB file, an AOF without and one with an RDB preamble, written by it
//! (`tests/fixtures/v0.2/`, made by `scripts/make-v0.2-fixtures.sh`), load on every
//! server with every lock as it was: fence, mode, limit, holders, owners, client ids and
//! addresses (IPv4, IPv6, unix socket), each lease with the time it still has by its
//! deadline (ten-year leases) or gone (a 60 s one), the lifted counter, the tokens.

mod common;
mod regress;

use common::{fixtures, with_fixture};
use regress::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `key field value` and `key holder<i> field value` lines.
struct Expected {
    fields: BTreeMap<(String, String), String>,
    counter: i64,
}

impl Expected {
    fn load(name: &str) -> Expected {
        let text = std::fs::read_to_string(fixtures("v0.2").join(name)).expect("fixture");
        let mut fields = BTreeMap::new();
        let mut counter = 0;
        for l in text.lines() {
            let p: Vec<&str> = l.split(' ').collect();
            match p.as_slice() {
                ["counter", v] => counter = v.parse().unwrap(),
                ["written-at", _] => {}
                [k, h, f, v] => {
                    fields.insert((k.to_string(), format!("{h}.{f}")), v.to_string());
                }
                [k, f, v] => {
                    fields.insert((k.to_string(), f.to_string()), v.to_string());
                }
                _ => panic!("bad fixture line {l:?}"),
            }
        }
        Expected { fields, counter }
    }

    fn get(&self, key: &str, field: &str) -> Option<&str> {
        self.fields
            .get(&(key.to_string(), field.to_string()))
            .map(String::as_str)
    }
}

/// A reply field as the fixture's text (`-` for nil).
fn text_of(v: &Resp) -> String {
    match v {
        Resp::Nil => "-".into(),
        Resp::Int(i) => i.to_string(),
        other => other.as_text().unwrap_or_else(|| format!("{other:?}")),
    }
}

const LOCKS: [&str; 4] = ["lock:excl", "lock:shared", "lock:limit", "lock:lifted"];
/// Fields compared exactly (ttl and expires-at are checked against the clock).
const EXACT: [&str; 6] = [
    "fence",
    "owner",
    "acquired-at",
    "client-id",
    "client-addr",
    "mode",
];

fn check_loaded(s: &Server, want: &Expected, what: &str) {
    let mut c = conn(s);
    let mut ck = Checks::new();
    let now = redis_lock_testkit::unix_ms();
    for key in LOCKS {
        let i = info(&mut c, key);
        if !ck.check(
            i != Resp::Nil,
            format!("{what}: {key} was not loaded\n{}", s.log_tail()),
        ) {
            continue;
        }
        for f in [
            "mode",
            "limit",
            "holders",
            "fence",
            "owner",
            "acquired-at",
            "client-id",
            "client-addr",
        ] {
            if let Some(w) = want.get(key, f) {
                let got = i.get(f).map(|v| text_of(&v));
                ck.eq(got.as_deref(), Some(w), &format!("{what}: {key} {f}"));
            }
        }
        let holders = i.get("holder-list").map(|l| l.items()).unwrap_or_default();
        let n: usize = want
            .get(key, "holders")
            .and_then(|h| h.parse().ok())
            .unwrap_or(0);
        ck.eq(
            holders.len(),
            n,
            &format!("{what}: {key} holder-list length"),
        );
        for (h, holder) in holders.iter().enumerate() {
            for f in EXACT.iter().filter(|f| **f != "mode") {
                let w = want.get(key, &format!("holder{h}.{f}"));
                let got = holder.get(f).map(|v| text_of(&v));
                ck.eq(got.as_deref(), w, &format!("{what}: {key} holder {h} {f}"));
            }
            // The lease has what its deadline leaves it (approximately: the test's clock
            // and the server's are the same machine's).
            let exp: i64 = want
                .get(key, &format!("holder{h}.expires-at"))
                .unwrap()
                .parse()
                .unwrap();
            let ttl = holder.get("ttl").and_then(|t| t.as_int());
            ck.check(
                ttl.is_some_and(|t| (t - (exp - now)).abs() <= 10_000),
                format!(
                    "{what}: {key} holder {h} ttl {ttl:?}, its deadline leaves {}",
                    exp - now
                ),
            );
        }
    }
    // The 60 s lease has ended (unless the fixture is younger than a minute).
    let short_exp: i64 = want
        .get("lock:short", "expires-at")
        .unwrap()
        .parse()
        .unwrap();
    if short_exp + 1000 < now {
        ck.eq(
            info(&mut c, "lock:short"),
            Resp::Nil,
            &format!("{what}: lock:short"),
        );
        ck.eq(
            c.cmd(&["EXISTS", "lock:short"]).int(),
            0,
            &format!("{what}: lock:short key"),
        );
    }
    // The classic string lock is a string with its expiry.
    let classic = info(&mut c, "lock:classic");
    ck.eq(
        classic.get("kind").map(|k| text_of(&k)),
        Some("string".into()),
        &format!("{what}: lock:classic kind"),
    );
    ck.check(
        c.cmd(&["PTTL", "lock:classic"]).int() > 0,
        format!("{what}: lock:classic lost its expiry"),
    );
    // The counter, lifted by MINFENCE, came back; the next fence is above it.
    let counter = c.cmd(&["LOCK.DEBUG", "FENCE"]).int();
    ck.check(
        counter >= want.counter,
        format!("{what}: counter {counter} < {} written", want.counter),
    );
    let (_, next) = granted(&c.cmd(&acq("lock:next", &["PX", "60000"])));
    ck.check(
        next > want.counter,
        format!("{what}: next fence {next} <= {}", want.counter),
    );
    // The tokens still work: a renew keeps the fence, a wrong token releases nothing.
    let excl_fence: i64 = want.get("lock:excl", "fence").unwrap().parse().unwrap();
    let renew = c.cmd(&acq(
        "lock:excl",
        &["PX", "60000", "TOKEN", "fixture-token-excl-0001"],
    ));
    ck.eq(
        grant(&renew).map(|g| g.1),
        Some(excl_fence),
        &format!("{what}: renew of lock:excl"),
    );
    for (key, token, released, name) in [
        ("lock:shared", "fixture-token-excl-0001", 0, "wrong token"),
        (
            "lock:shared",
            "fixture-token-shru-0002",
            1,
            "shared release",
        ),
        ("lock:limit", "fixture-token-lim2-0002", 1, "limit release"),
        ("lock:classic", "classic-token-0001", 1, "classic release"),
    ] {
        ck.eq(
            c.cmd(&["LOCK.RELEASE", key, token]),
            Resp::Int(released),
            &format!("{what}: {name}"),
        );
    }
    ck.finish();
}

fn server_for(dir: PathBuf) -> ServerBuilder {
    ServerBuilder::new()
        .dir(dir)
        .module_args(&["debug-commands", "yes", "max-ttl", "315360000000"])
}

#[test]
fn an_rdb_file_written_by_00e48ee_loads() {
    let dir = with_fixture("v0.2", "dump.rdb", "dump.rdb");
    let s = server_for(dir).start();
    check_loaded(&s, &Expected::load("rdb.expected"), "RDB");
}

#[test]
fn an_aof_without_preamble_written_by_00e48ee_loads() {
    let dir = with_fixture("v0.2", "aof-plain/appendonlydir", "appendonlydir");
    let s = server_for(dir).arg("appendonly", "yes").start();
    check_loaded(&s, &Expected::load("aof-plain.expected"), "AOF (LOCK.REPL)");
}

#[test]
fn an_aof_with_rdb_preamble_written_by_00e48ee_loads() {
    let dir = with_fixture("v0.2", "aof-preamble/appendonlydir", "appendonlydir");
    let s = server_for(dir).arg("appendonly", "yes").start();
    check_loaded(
        &s,
        &Expected::load("aof-preamble.expected"),
        "AOF (RDB preamble)",
    );
}
