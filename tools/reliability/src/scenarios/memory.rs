//! Memory safety: redis-server under valgrind memcheck with the module, through rounds of
//! waits, hand-offs, expiries, DUMP/RESTORE and errors (docs/RELIABILITY.md); used_memory
//! back to its baseline, and the valgrind log free of invalid accesses and module leaks.

use std::time::{Duration, Instant};

use crate::common::*;

/// used_memory may differ from the baseline by this much (allocator rounding, client
/// buffers of the INFO connection itself).
const MEMORY_SLACK: i64 = 32 * 1024;

/// `n` clients blocked in `LOCK.ACQUIRE key PX px BLOCK block` (replies not read).
fn waiters(s: &Server, n: usize, key: &str, px: u64, block: u64) -> Result<Vec<Conn>, String> {
    (0..n)
        .map(|_| {
            let mut w = connect_for(s, 60)?;
            w.queue(&args!["LOCK.ACQUIRE", key, "PX", px, "BLOCK", block]);
            w.flush().map_err(|e| e.to_string())?;
            Ok(w)
        })
        .collect()
}

fn workload(s: &Server, round: u64, rng: &mut Rng) -> Result<(), String> {
    let mut a = connect_for(s, 60)?;
    // 1. Waits that time out.
    let t = acquire(&mut a, "m:t", 60_000)?.0;
    let mut ws = waiters(s, 4, "m:t", 1000, 100)?;
    for w in &mut ws {
        let r = w.read().map_err(|e| e.to_string())?;
        if r != Reply::Nil {
            return Err(format!("a wait that should time out answered {r:?}"));
        }
    }
    cmd(&mut a, &args!["LOCK.RELEASE", "m:t", &t])?;
    // 2. Waiters that disconnect while queued.
    let t = acquire(&mut a, "m:d", 60_000)?.0;
    let ws = waiters(s, 4, "m:d", 1000, 30_000)?;
    std::thread::sleep(Duration::from_millis(200));
    drop(ws);
    std::thread::sleep(Duration::from_millis(200));
    cmd(&mut a, &args!["LOCK.RELEASE", "m:d", &t])?;
    // 3. Hand-offs down a queue, and 4. FORCERELEASE with waiters.
    for (key, force) in [("m:h", false), ("m:f", true)] {
        let t = acquire(&mut a, key, 60_000)?.0;
        let mut ws = waiters(s, 4, key, 60_000, 30_000)?;
        std::thread::sleep(Duration::from_millis(200));
        match force {
            true => cmd(&mut a, &args!["LOCK.FORCERELEASE", key])?,
            false => cmd(&mut a, &args!["LOCK.RELEASE", key, &t])?,
        };
        for w in &mut ws {
            let r = w.read().map_err(|e| e.to_string())?;
            let (tok, _) = r.grant().ok_or(format!("waiter answered {r:?}"))?;
            cmd(w, &args!["LOCK.RELEASE", key, &tok])?;
        }
    }
    // 5. A waiter handed the lock just as it disconnects.
    let t = acquire(&mut a, "m:g", 60_000)?.0;
    let w = waiters(s, 1, "m:g", 60_000, 30_000)?;
    std::thread::sleep(Duration::from_millis(100));
    a.queue(&args!["LOCK.RELEASE", "m:g", &t]);
    a.flush().map_err(|e| e.to_string())?;
    drop(w);
    a.read().map_err(|e| e.to_string())?;
    // The server may have answered the waiter before it saw it leave; then the waiter
    // holds the lock for its 60 s lease. Free it, so the next round's step 5 finds it free.
    cmd(&mut a, &args!["LOCK.FORCERELEASE", "m:g"])?;
    // 6. Expiries: leases that run out, one served to a waiter.
    for i in 0..8 {
        acquire(&mut a, &format!("m:e:{i}"), 40)?;
    }
    let mut w = connect_for(s, 60)?;
    let (tok, _) = grant(&mut w, &words("LOCK.ACQUIRE m:e:0 PX 60000 BLOCK 5000"))?;
    cmd(&mut w, &args!["LOCK.RELEASE", "m:e:0", &tok])?;
    // 7. A classic string lock, waited on, then taken over at its expiry.
    cmd(&mut a, &words("SET m:s classic PX 80"))?;
    let (tok, _) = grant(&mut a, &words("LOCK.ACQUIRE m:s PX 60000 BLOCK 5000"))?;
    cmd(&mut a, &args!["LOCK.RELEASE", "m:s", &tok])?;
    // 8. DUMP / RESTORE, and hostile payloads.
    let (tok, _) = grant(&mut a, &words("LOCK.ACQUIRE m:r PX 60000 OWNER w1"))?;
    let dump = cmd(&mut a, &args!["DUMP", "m:r"])?;
    let dump = dump.as_bytes().ok_or("DUMP returned nothing")?.to_vec();
    let r = cmd(&mut a, &args!["RESTORE", "m:r2", 0u64, &dump, "REPLACE"])?;
    if r.is_error() {
        return Err(format!("RESTORE of a real payload: {r:?}"));
    }
    cmd(&mut a, &words("LOCK.INFO m:r2"))?;
    for _ in 0..20 {
        let p = super::fuzz::mutate(&dump, rng);
        cmd(&mut a, &args!["RESTORE", "m:r3", 0u64, &p, "REPLACE"])?;
        cmd(&mut a, &args!["LOCK.INFO", "m:r3"])?;
        cmd(&mut a, &args!["DEL", "m:r3"])?;
    }
    cmd(&mut a, &args!["LOCK.RELEASE", "m:r", &tok])?;
    cmd(&mut a, &args!["DEL", "m:r2"])?;
    // 9. Errors and renewals.
    cmd(&mut a, &args!["LOCK.ACQUIRE", "m:x", "TOKEN", ""])?;
    let bad = "LOCK.ACQUIRE m:x PX -1; LOCK.EXTEND m:x; LOCK.SYNC m:x a 1 2 3 4 5; LPUSH m:l v;
        LOCK.ACQUIRE m:l; DEL m:l";
    for c in bad.split(';') {
        cmd(&mut a, &words(c))?;
    }
    let tok = format!("renew-token-{round:04}");
    let renew = args!["LOCK.ACQUIRE", "m:n", "PX", 1000u64, "TOKEN", &tok];
    for _ in 0..2 {
        grant(&mut a, &renew)?;
    }
    cmd(&mut a, &args!["LOCK.EXTEND", "m:n", &tok, "PX", 2000u64])?;
    cmd(&mut a, &args!["LOCK.RELEASE", "m:n", &tok])?;
    // Let every short lease end.
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..8 {
        cmd(&mut a, &args!["LOCK.INFO", format!("m:e:{i}")])?;
    }
    Ok(())
}

fn settled_memory(s: &Server) -> Result<i64, String> {
    // Idle clients, no locks, no waiters; let the server's cron tidy up.
    let idle = [
        ("lock", "lock_held", "0"),
        ("lock", "lock_waiters", "0"),
        ("clients", "connected_clients", "1"),
    ];
    let settled = || {
        idle.iter()
            .all(|(sec, f, v)| s.info_field(sec, f).as_deref() == Some(v))
    };
    if !wait_until(Duration::from_secs(30), settled) {
        let seen = idle.map(|(sec, f, _)| format!("{f} {:?}", s.info_field(sec, f)));
        return Err(format!("not settled: {}", seen.join(", ")));
    }
    let read = || {
        s.info_field("memory", "used_memory")
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    };
    match redis_lock_testkit::settled_memory(read) {
        Ok(m) if m >= 0 => Ok(m),
        Ok(_) => Err("no used_memory".into()),
        Err(r) => Err(format!("used_memory did not settle: {r:?}")),
    }
}

#[derive(Default, Debug, serde::Serialize)]
struct VgReport {
    invalid: u64,
    uninit: u64,
    module_lost_bytes: u64,
    module_lost_load_bytes: u64,
    module_lost_frames: Vec<String>,
    definitely_lost_total: u64,
    heap_allocs: u64,
}

/// The number that `s` begins with (`1,234 allocs`: 1234), else 0.
fn num(s: &str) -> u64 {
    let first = s.split_whitespace().next().unwrap_or("0");
    first.replace(',', "").parse().unwrap_or(0)
}

fn parse_vg(log: &str) -> VgReport {
    let mut r = VgReport::default();
    // Strip the ==pid== prefix.
    let lines: Vec<&str> = log
        .lines()
        .map(|l| match l.find("== ") {
            Some(i) if l.starts_with("==") => &l[i + 3..],
            _ => l,
        })
        .collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        let starts = |heads: &[&str]| u64::from(heads.iter().any(|h| l.starts_with(h)));
        r.invalid += starts(&[
            "Invalid read",
            "Invalid write",
            "Invalid free",
            "Mismatched free",
        ]);
        let uninit = [
            "Conditional jump or move depends on uninitialised",
            "Use of uninitialised value",
        ];
        r.uninit += starts(&uninit);
        if let Some(rest) = l.strip_prefix("total heap usage:") {
            r.heap_allocs = num(rest);
        }
        if let Some(rest) = l.strip_prefix("definitely lost:") {
            r.definitely_lost_total = num(rest);
        }
        if l.contains("are definitely lost in loss record") {
            // "456 (72 direct, 384 indirect) bytes in 1 blocks ..." or "72 bytes in ...":
            // valgrind's "definitely lost" is the direct part.
            let bytes = num(l.split_once('(').map_or(l, |(_, rest)| rest));
            let (mut j, mut module, mut load, mut frame) = (i + 1, false, false, String::new());
            while j < lines.len() && !lines[j].trim().is_empty() {
                let f = lines[j];
                if (f.contains("redis_lock") || f.contains("libredis_lock")) && !module {
                    (module, frame) = (true, f.trim().to_string());
                }
                load |= f.contains("RedisModule_OnLoad");
                j += 1;
            }
            if module {
                r.module_lost_bytes += bytes;
                r.module_lost_load_bytes += if load { bytes } else { 0 };
                let at = if load { " (at load)" } else { "" };
                r.module_lost_frames
                    .push(format!("{bytes} bytes{at}: {frame}"));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    r
}

pub const TITLE: &str = "Memory safety (valgrind memcheck)";
pub const TARGET: &str = "0 bytes definitely lost in module frames, 0 invalid reads/writes, used_memory back to baseline";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    if redis_lock_testkit::run_cmd(&["valgrind", "--version"]).is_err() {
        o.status = Status::NotRun("valgrind not found (bash scripts/deps-reliability.sh)".into());
        return Ok(());
    }
    let log = env.work.join("valgrind.log");
    let opts =
        "valgrind --leak-check=full --show-leak-kinds=definite --error-limit=no --num-callers=40";
    let mut wrapper: Vec<String> = words(opts).into_iter().map(String::from).collect();
    wrapper.push("--soname-synonyms=somalloc=libjemalloc.so*".into());
    wrapper.push(format!("--log-file={}", log.display()));
    let mut server = env
        .builder("memory")
        .wrapper(&wrapper)
        .start_timeout(Duration::from_secs(120))
        .try_start()?;
    let rounds = env.n(6.0, 3.0).max(2);
    let mut rng = Rng::new(env.seed ^ 0x006d_656d);
    let t = Instant::now();
    workload(&server, 0, &mut rng)?;
    let base = settled_memory(&server)?;
    for r in 1..rounds {
        workload(&server, r, &mut rng)?;
    }
    let after = settled_memory(&server)?;
    let fields = "lock_acquired lock_handed_off lock_wait_timeouts lock_expired lock_force_released lock_panics";
    let stats: Vec<(&str, String)> = (words(fields).into_iter())
        .map(|f| (f, server.info_field("lock", f).unwrap_or_default()))
        .collect();
    let workload_secs = t.elapsed().as_secs_f64();
    let mut c = connect(&server).map_err(|e| e.to_string())?;
    let _ = c.call(&args!["SHUTDOWN", "NOSAVE"]);
    if !server.wait_exit(Duration::from_secs(180)) {
        server.kill9();
        return Err("the server under valgrind did not exit after SHUTDOWN".into());
    }
    let text = std::fs::read_to_string(&log).map_err(|e| format!("valgrind log: {e}"))?;
    let vg = parse_vg(&text);
    if vg.heap_allocs == 0 {
        return Err("valgrind log has no heap summary (allocations not intercepted?)".into());
    }
    let delta = after - base;
    o.put("valgrind", &vg);
    o.put("rounds", (rounds, workload_secs));
    o.put("memory", [base, after]);
    let shown: Vec<_> = stats.iter().map(|(k, v)| format!("{k}={v}")).collect();
    o.put("stats", shown);
    let (lost, at_load) = (vg.module_lost_bytes, vg.module_lost_load_bytes);
    o.fail_if(
        lost > 0,
        format!("{lost} bytes definitely lost in module frames ({at_load} at load)"),
    );
    o.fail_if(
        vg.invalid > 0,
        format!("{} invalid reads/writes/frees", vg.invalid),
    );
    o.fail_if(
        delta.abs() > MEMORY_SLACK,
        format!("used_memory {delta:+} bytes from the baseline after everything was released"),
    );
    o.fail_if(
        stats.iter().any(|(k, v)| *k == "lock_panics" && v != "0"),
        "lock_panics > 0",
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_valgrind_log() {
        let log = "==7== Invalid read of size 8
==7==    at 0x1: f (a.c:1)
==7== 
==7== 456 (72 direct, 384 indirect) bytes in 1 blocks are definitely lost in loss record 1 of 3
==7==    at 0x2: malloc
==7==    by 0x3: redis_lock::cmdinfo::register (cmdinfo.rs:134)
==7==    by 0x4: RedisModule_OnLoad (macros.rs:446)
==7== 
==7== 16 bytes in 1 blocks are definitely lost in loss record 2 of 3
==7==    at 0x2: malloc
==7==    by 0x5: redis_lock::waiters::enqueue (waiters.rs:1)
==7== 
==7== 8 bytes in 1 blocks are definitely lost in loss record 3 of 3
==7==    at 0x2: malloc
==7==    by 0x6: zmalloc (zmalloc.c:1)
==7== 
==7==   total heap usage: 1,234 allocs, 1,200 frees, 99 bytes allocated
==7==    definitely lost: 96 bytes in 3 blocks
";
        let r = parse_vg(log);
        assert_eq!(r.invalid, 1);
        assert_eq!(r.module_lost_bytes, 88);
        assert_eq!(r.module_lost_load_bytes, 72);
        assert_eq!(r.definitely_lost_total, 96);
        assert_eq!(r.heap_allocs, 1234);
    }
}
