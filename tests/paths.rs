//! Every lock command's scenarios through every path a command can take to the module
//! (issue 18 item 1; the kit's `paths` module): each command path (direct, pipelined,
//! MULTI/EXEC, EVAL, FCALL, RM_Call from another module) must answer what the direct
//! path answers and leave the state it leaves; the state a command made must arrive
//! unchanged by every way state travels (an attached replica's stream, AOF replay,
//! DUMP + RESTORE on another server, a new replica's full sync). Rows 2 and 3 of the
//! holes issue are what testing one path misses. Lean for CI: each scenario once per
//! path, the carried state checked for the paths whose replication can differ.

mod regress;

use regress::paths::{self, Carry, Path};
use regress::*;
use std::collections::BTreeMap;

/// One step: a command line (arguments split at spaces) whose `$F<i>` / `$T<i>`
/// arguments are the fence / token of step i's grant, `$X` the scenario's MINFENCE,
/// `$D` a data key beside the lock key (for the guarded writes, or a second lock key) and
/// `$S` a session id of the scenario's own.
type Step = &'static str;

/// (name, steps). Each runs on its own key (`$K`).
const SCENARIOS: &[(&str, &[Step])] = &[
    (
        "exclusive",
        &[
            "LOCK.ACQUIRE $K PX 60000 TOKEN paths-token-a-0001 OWNER svc-a",
            "LOCK.ACQUIRE $K PX 60000 TOKEN paths-token-a-0001",
            "LOCK.ACQUIRE $K TOKEN paths-token-b-0002",
            "LOCK.EXTEND $K paths-token-a-0001 PX 90000",
            "LOCK.EXTEND $K paths-token-b-0002 PX 1000",
            "LOCK.RELEASE $K paths-token-b-0002",
            "LOCK.INFO $K",
        ],
    ),
    (
        "shared",
        &[
            "LOCK.ACQUIRE $K SHARED PX 60000 TOKEN paths-token-a-0001",
            "LOCK.ACQUIRE $K SHARED PX 60000 TOKEN paths-token-b-0002 OWNER reader-b",
            "LOCK.ACQUIRE $K PX 1000",
            "LOCK.RELEASE $K paths-token-a-0001",
            "LOCK.INFO $K",
        ],
    ),
    (
        "limit",
        &[
            "LOCK.ACQUIRE $K LIMIT 2 PX 60000 TOKEN paths-token-a-0001",
            "LOCK.ACQUIRE $K LIMIT 2 PX 60000 TOKEN paths-token-b-0002",
            "LOCK.ACQUIRE $K LIMIT 2 TOKEN paths-token-c-0003",
            "LOCK.ACQUIRE $K LIMIT 3",
            "LOCK.EXTEND $K paths-token-b-0002 PX 90000",
            "LOCK.INFO $K",
        ],
    ),
    (
        "minfence",
        &[
            "LOCK.ACQUIRE $K PX 60000 TOKEN paths-token-a-0001 MINFENCE $X",
            "LOCK.INFO $K",
        ],
    ),
    (
        "forcerelease",
        &[
            "LOCK.ACQUIRE $K SHARED PX 60000 TOKEN paths-token-a-0001",
            "LOCK.ACQUIRE $K SHARED PX 60000 TOKEN paths-token-b-0002",
            "LOCK.FORCERELEASE $K FENCE $F0",
            "LOCK.INFO $K",
            "LOCK.ACQUIRE $K SHARED PX 60000 TOKEN paths-token-c-0003",
            "LOCK.FORCERELEASE $K",
            "LOCK.INFO $K",
            "LOCK.ACQUIRE $K PX 60000 TOKEN paths-token-d-0004",
        ],
    ),
    (
        "generated-token",
        &[
            "LOCK.ACQUIRE $K PX 60000",
            "LOCK.RELEASE $K $T0",
            "LOCK.ACQUIRE $K PX 60000 OWNER gen",
        ],
    ),
    (
        "guards-and-watch",
        &[
            "LOCK.ACQUIRE $K PX 60000 TOKEN paths-token-a-0001 OWNER guard",
            "LOCK.CHECK $K $F0",
            "LOCK.WATCH $K",
            "LOCK.WATCH $K FENCE $F0 BLOCK 10",
            "LOCK.IFHELD $K paths-token-a-0001 SET $D v1",
            "LOCK.IFFENCE $K $F0 GET $D",
            "LOCK.IFHELD $K paths-token-z-0009 SET $D v2",
            "GET $D",
            "LOCK.RELEASE $K paths-token-a-0001",
            "LOCK.CHECK $K $F0",
            "LOCK.WATCH $K BLOCK 10",
            "LOCK.IFFENCE $K $F0 SET $D v3",
            "GET $D",
        ],
    ),
    (
        "session",
        &[
            "LOCK.SESSION OPEN $S PX 60000 OWNER paths-job",
            "LOCK.ACQUIRE $K SESSION $S TOKEN paths-token-a-0001 OWNER in-session",
            "LOCK.ACQUIRE $K SESSION $S TOKEN paths-token-a-0001",
            "LOCK.ACQUIRE $K PX 60000 TOKEN paths-token-a-0001",
            "LOCK.EXTEND $K paths-token-a-0001 PX 1000",
            "LOCK.ACQUIRE $D SHARED SESSION $S TOKEN paths-token-b-0002",
            "LOCK.SESSION KEEPALIVE $S PX 90000",
            "LOCK.SESSION INFO $S",
            "LOCK.SESSION CLOSE $S",
            "LOCK.INFO $K",
            "LOCK.ACQUIRE $K SESSION $S",
            "LOCK.SESSION OPEN $S PX 60000",
            "LOCK.ACQUIRE $K SESSION $S TOKEN paths-token-c-0003",
            "LOCK.INFO $K",
        ],
    ),
    (
        "multi-key",
        &[
            "LOCK.ACQUIREALL 2 $K $D PX 60000 TOKEN paths-token-a-0001 OWNER both",
            "LOCK.ACQUIREALL 2 $K $D PX 60000 TOKEN paths-token-a-0001",
            "LOCK.ACQUIREALL 2 $D $K PX 1000",
            "LOCK.EXTENDALL 2 $K $D paths-token-a-0001 PX 90000",
            "LOCK.RELEASEALL 2 $K $D paths-token-a-0001",
            "LOCK.ACQUIREALL 2 $K $D MODES SHARED LIMIT=2 PX 60000 TOKEN paths-token-b-0002 LOCKDELAY 100",
            "LOCK.ACQUIREALL 2 $K $D MODES SHARED LIMIT=2 PX 60000 TOKEN paths-token-c-0003",
            "LOCK.RELEASEALL 2 $K $D paths-token-c-0003",
            "LOCK.INFO $K",
            "LOCK.INFO $D",
        ],
    ),
    (
        "classic-string",
        &[
            "SET $K classic-token-0001 NX PX 60000",
            "LOCK.ACQUIRE $K TOKEN classic-token-0001",
            "LOCK.INFO $K",
            "LOCK.EXTEND $K classic-token-0001 PX 90000",
            "LOCK.RELEASE $K classic-token-0001",
            "LOCK.INFO $K",
        ],
    ),
];

/// How a scenario's steps are sent: by one path, or reads from a read-only script and
/// writes directly (after checking that the script refuses them).
#[derive(Clone, Copy)]
enum Via {
    Path(Path),
    ReadOnly(paths::ReadOnlyPath),
}

/// The module's commands and the server's that only read.
fn reads_only(step: &str) -> bool {
    ["LOCK.INFO ", "LOCK.CHECK ", "LOCK.WATCH ", "GET "]
        .iter()
        .any(|p| step.starts_with(p))
}

/// Runs one scenario on `key` by `via`: every step's reply. A write refused by a
/// read-only script is recorded in `ck` (it must be refused, and then runs directly).
fn run_via(
    c: &mut RawConn,
    via: Via,
    key: &str,
    steps: &[Step],
    minfence: u64,
    ck: &mut Checks,
) -> Vec<Resp> {
    let mut replies: Vec<Resp> = Vec::new();
    let data = format!("{key}:data");
    let session = format!("{key}:session-id");
    for step in steps {
        let argv: Vec<String> = step
            .split(' ')
            .map(|a| {
                if a == "$K" {
                    key.to_string()
                } else if a == "$D" {
                    data.clone()
                } else if a == "$S" {
                    session.clone()
                } else if a == "$X" {
                    minfence.to_string()
                } else if let Some(i) = a.strip_prefix("$F") {
                    let i: usize = i.parse().unwrap();
                    grant(&replies[i]).map_or(String::new(), |g| g.1.to_string())
                } else if let Some(i) = a.strip_prefix("$T") {
                    let i: usize = i.parse().unwrap();
                    grant(&replies[i]).map_or(String::new(), |g| {
                        String::from_utf8_lossy(&g.0).into_owned()
                    })
                } else {
                    a.to_string()
                }
            })
            .collect();
        let reply = match via {
            Via::Path(path) => paths::send(c, path, &argv),
            Via::ReadOnly(ro) if reads_only(step) => paths::send_read_only(c, ro, &argv),
            Via::ReadOnly(ro) => {
                let refused = paths::send_read_only(c, ro, &argv);
                ck.check(
                    refused.is_error(),
                    format!("`{step}` from {}: {refused:?}, not refused", ro.name()),
                );
                paths::send(c, Path::Direct, &argv)
            }
        };
        replies.push(unkeyed(reply, key, &data));
    }
    replies
}

/// A reply with the scenario's key names (which differ by path) as `$K` and `$D`.
fn unkeyed(r: Resp, key: &str, data: &str) -> Resp {
    match r {
        Resp::Bulk(b) if b == key.as_bytes() => Resp::Bulk(b"$K".to_vec()),
        Resp::Bulk(b) if b == data.as_bytes() => Resp::Bulk(b"$D".to_vec()),
        Resp::Array(a) => Resp::Array(a.into_iter().map(|x| unkeyed(x, key, data)).collect()),
        other => other,
    }
}

fn run(c: &mut RawConn, path: Path, key: &str, steps: &[Step], minfence: u64) -> Vec<Resp> {
    run_via(c, Via::Path(path), key, steps, minfence, &mut Checks::new())
}

/// Fences are the integers above 1e14 (timestamps are ~1.8e12, ttls smaller).
const FENCE_FLOOR: i64 = 100_000_000_000_000;

fn collect_fences(r: &Resp, out: &mut Vec<i64>) {
    match r {
        Resp::Int(v) if *v > FENCE_FLOOR => out.push(*v),
        Resp::Array(a) | Resp::Set(a) | Resp::Push(a) => {
            a.iter().for_each(|x| collect_fences(x, out))
        }
        Resp::Map(m) => m.iter().for_each(|(k, v)| {
            collect_fences(k, out);
            collect_fences(v, out)
        }),
        _ => {}
    }
}

/// A reply with what legitimately differs between runs taken out: fences become their
/// rank among the run's fences, times and per-connection fields are dropped, a token the
/// server made becomes `<generated>`, an error keeps its code.
fn normalize(r: &Resp, ranks: &BTreeMap<i64, usize>) -> Resp {
    const DROPPED: [&str; 6] = [
        "ttl",
        "expires-at",
        "acquired-at",
        "client-id",
        "client-addr",
        "cursor",
    ];
    match r {
        Resp::Int(v) if *v > FENCE_FLOOR => Resp::Simple(format!("fence#{}", ranks[v])),
        Resp::Error(e) => Resp::Error(e.split_whitespace().next().unwrap_or("").to_string()),
        // A grant of a token the server made (no TOKEN given): whatever its format.
        Resp::Array(a)
            if matches!(a.as_slice(), [Resp::Bulk(t), Resp::Int(f)]
                if *f > FENCE_FLOOR && !t.starts_with(b"paths-token-") && !t.starts_with(b"classic-token-")) =>
        {
            Resp::Array(vec![
                Resp::Simple("<generated>".into()),
                normalize(&a[1], ranks),
            ])
        }
        Resp::Array(a) => {
            let is_fields = r.try_pairs().is_some_and(|p| {
                p.first()
                    .is_some_and(|(k, _)| ["state", "fence", "ttl"].contains(&k.as_str()))
            });
            if is_fields {
                let pairs = r.pairs();
                Resp::Array(
                    pairs
                        .into_iter()
                        .filter(|(k, _)| !DROPPED.contains(&k.as_str()))
                        .flat_map(|(k, v)| [Resp::Bulk(k.into_bytes()), normalize(&v, ranks)])
                        .collect(),
                )
            } else {
                Resp::Array(a.iter().map(|x| normalize(x, ranks)).collect())
            }
        }
        other => other.clone(),
    }
}

fn normalized(
    replies: &[Resp],
    state: &Option<Vec<(String, Resp)>>,
) -> (Vec<Resp>, Option<Vec<Resp>>) {
    let mut fences = Vec::new();
    replies.iter().for_each(|r| collect_fences(r, &mut fences));
    if let Some(s) = state {
        s.iter().for_each(|(_, v)| collect_fences(v, &mut fences));
    }
    fences.sort_unstable();
    fences.dedup();
    let ranks: BTreeMap<i64, usize> = fences.iter().enumerate().map(|(i, f)| (*f, i)).collect();
    let rs = replies.iter().map(|r| normalize(r, &ranks)).collect();
    let st = state.as_ref().map(|s| {
        s.iter()
            .filter(|(k, _)| {
                !["expires-at", "acquired-at", "client-id", "client-addr"].contains(&k.as_str())
            })
            .flat_map(|(k, v)| [Resp::Bulk(k.clone().into_bytes()), normalize(v, &ranks)])
            .collect()
    });
    (rs, st)
}

/// A MINFENCE ten minutes ahead of the clock term.
fn minfence() -> u64 {
    ((redis_lock_testkit::unix_ms() + 600_000) as u64) << redis_lock_testkit::lock::FENCE_SHIFT
}

#[test]
fn every_command_path_answers_and_leaves_what_the_direct_path_does() {
    let s = paths::with_helper_module(ServerBuilder::new()).start();
    let mut c = conn(&s);
    paths::load_function_library(&mut c);
    let x = minfence();
    let mut ck = Checks::new();
    let vias = Path::ALL
        .map(Via::Path)
        .into_iter()
        .chain(paths::ReadOnlyPath::ALL.map(Via::ReadOnly));
    let vias: Vec<Via> = vias.collect();
    for (name, steps) in SCENARIOS {
        let mut direct = None;
        for &via in &vias {
            let via_name = match via {
                Via::Path(p) => p.name(),
                Via::ReadOnly(p) => p.name(),
            };
            let key = format!("paths:{name}:{via_name}");
            let replies = run_via(&mut c, via, &key, steps, x, &mut ck);
            let state = paths::durable_info(&mut c, &key);
            if *name == "minfence" {
                let f = grant(&replies[0]).map(|g| g.1);
                ck.check(
                    f.is_some_and(|f| f as u64 >= x),
                    format!("{name} via {via_name}: fence {f:?} below MINFENCE {x}"),
                );
            }
            let got = normalized(&replies, &state);
            match &direct {
                None => direct = Some(got),
                Some(want) => {
                    for (i, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
                        ck.eq(
                            g,
                            w,
                            &format!("{name} step {i} `{}` via {via_name}", steps[i]),
                        );
                    }
                    ck.eq(
                        &got.1,
                        &want.1,
                        &format!("{name}: state left via {via_name}"),
                    );
                }
            }
        }
    }
    ck.finish();
}

#[test]
fn state_arrives_unchanged_by_every_way_it_travels() {
    let mut p = paths::with_helper_module(
        primary()
            .arg("appendonly", "yes")
            .arg("appendfsync", "always"),
    )
    .start();
    let attached = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    paths::load_function_library(&mut c);
    let x = minfence();
    // The command paths whose replication differs: a command alone, wrapped in MULTI, in
    // a script, and from another module.
    let sent_by = [Path::Direct, Path::Multi, Path::Eval, Path::ModuleCall];
    let mut keys = Vec::new();
    for (name, steps) in SCENARIOS {
        for path in sent_by {
            let key = format!("carry:{name}:{}", path.name());
            run(&mut c, path, &key, steps, x);
            keys.push(key);
        }
    }
    let want: Vec<_> = keys
        .iter()
        .map(|k| paths::durable_info(&mut c, k))
        .collect();
    let dumps: Vec<Resp> = keys.iter().map(|k| c.cmd(&["DUMP", k])).collect();
    let mut ck = Checks::new();
    let compare = |ck: &mut Checks, way: Carry, rc: &mut RawConn| {
        for (k, w) in keys.iter().zip(&want) {
            let got = paths::durable_info(rc, k);
            let same = paths::same_state(w, &got);
            ck.check(
                same.is_ok(),
                format!("{k} by {}: {}", way.name(), same.err().unwrap_or_default()),
            );
        }
    };
    // An attached replica's stream.
    caught_up(&p, &attached);
    compare(&mut ck, Carry::Replica, &mut conn(&attached));
    // A new replica's full sync.
    let fresh = replica_of(&p, ServerBuilder::new());
    compare(&mut ck, Carry::FullSync, &mut conn(&fresh));
    // DUMP + RESTORE on another server (string locks and free keys have nothing to move).
    let other = ServerBuilder::new().start();
    let mut oc = conn(&other);
    for (k, d) in keys.iter().zip(&dumps) {
        if let Resp::Bulk(payload) = d {
            let r = oc.cmd(&[b"RESTORE".as_slice(), k.as_bytes(), b"0", payload]);
            ck.check(!r.is_error(), format!("RESTORE {k}: {r:?}"));
        }
    }
    let restored: Vec<_> = keys
        .iter()
        .map(|k| paths::durable_info(&mut oc, k))
        .collect();
    for ((k, w), (g, d)) in keys.iter().zip(&want).zip(restored.iter().zip(&dumps)) {
        if matches!(d, Resp::Bulk(_)) && !k.starts_with("carry:classic-string") {
            let same = paths::same_state(w, g);
            ck.check(
                same.is_ok(),
                format!(
                    "{k} by {}: {}",
                    Carry::Restore.name(),
                    same.err().unwrap_or_default()
                ),
            );
        }
    }
    // AOF replay: restart the primary from its AOF.
    drop(c);
    p.kill9();
    p.try_restart()
        .unwrap_or_else(|e| panic!("restart from the AOF: {e}"));
    compare(&mut ck, Carry::AofReplay, &mut conn(&p));
    ck.finish();
}
