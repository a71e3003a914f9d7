//! Scenario 5: wall-clock jumps. The server runs with the LD_PRELOAD shim
//! (scripts/reliability/clockshift.c) that adds an offset, read from a file we rewrite
//! while it runs, to CLOCK_REALTIME, gettimeofday and time. Measured: what a forward jump
//! does to a held lock (Redis expiry follows the wall clock), what a backward jump does,
//! and what both do to fences (next = max(last + 1, unix_ms << 10, start jump, MINFENCE)), also
//! across restarts.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

const JUMP_MS: i64 = 120_000;
const LEASE_MS: u64 = 60_000;

/// Rewrites the offset in place (never truncates: the shim has the file mapped).
fn set_offset(path: &Path, ms: i64) -> Result<(), String> {
    let text = format!("{ms:<31}\n");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("offset file: {e}"))?;
    f.write_all_at(text.as_bytes(), 0)
        .map_err(|e| format!("offset file: {e}"))
}

fn server_ms(c: &mut Conn) -> Result<i64, String> {
    let r = cmd(c, &args!["TIME"])?;
    let part = |i: usize| r.as_items()?.get(i)?.as_text()?.parse::<i64>().ok();
    match (part(0), part(1), r.as_items().map(<[Reply]>::len)) {
        (Some(s), Some(us), Some(2)) => Ok(s * 1000 + us / 1000),
        _ => Err(format!("TIME answered {r:?}")),
    }
}

pub const TITLE: &str = "Wall-clock jumps (LD_PRELOAD clock shim)";
pub const TARGET: &str = "measured baseline; fences never go back on a running server";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    if !env.shim.is_file() {
        let why = "not built (bash scripts/deps-reliability.sh)";
        o.status = Status::NotRun(format!("clock shim {} {why}", env.shim.display()));
        return Ok(());
    }
    // fsync always: the restarts below are about the fence counter, not about losing
    // unsynced writes (with everysec Redis may even postpone the write(2) itself while a
    // background fsync runs, and a SIGKILL then loses it).
    let offset = env.work.join("clock-offset");
    set_offset(&offset, 0)?;
    let mut server = env
        .builder("clock")
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .env("LD_PRELOAD", &env.shim.to_string_lossy())
        .env("CLOCKSHIFT_FILE", &offset.to_string_lossy())
        .try_start()
        .map_err(|e| format!("server with the clock shim: {e}"))?;
    let mut a = connect(&server)?;
    let mut b = connect(&server)?;

    // The shim moves the server's clock and nothing else breaks.
    let t0 = server_ms(&mut a)?;
    set_offset(&offset, 3_600_000)?;
    let t1 = server_ms(&mut a)?;
    set_offset(&offset, 0)?;
    let shifted = t1 - t0;
    if !(3_590_000..3_700_000).contains(&shifted) {
        return Err(format!(
            "the shim did not move TIME by +1 h (moved {shifted} ms)"
        ));
    }

    // Forward jump with a held lock.
    let (ta, fa) = acquire(&mut a, "rel:clk:a", LEASE_MS)?;
    let before = cmd(&mut a, &args!["LOCK.INFO", "rel:clk:a"])?;
    let ttl_before = before.get("ttl").and_then(|r| r.as_int()).unwrap_or(-1);
    set_offset(&offset, JUMP_MS)?;
    let jumped = Instant::now();
    let mut vanished_ms = None;
    while jumped.elapsed() < Duration::from_secs(5) {
        if cmd(&mut b, &args!["LOCK.INFO", "rel:clk:a"])? == Reply::Nil {
            vanished_ms = Some(jumped.elapsed().as_millis());
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (tb, fb) = acquire(&mut b, "rel:clk:a", LEASE_MS)
        .map_err(|e| format!("after the forward jump: {e}"))?;
    let a_extend = cmd(
        &mut a,
        &args!["LOCK.EXTEND", "rel:clk:a", &ta, "PX", LEASE_MS],
    )?;
    let a_release = cmd(&mut a, &args!["LOCK.RELEASE", "rel:clk:a", &ta])?;
    let shift = redis_lock_testkit::lock::FENCE_SHIFT;
    let fence_jump_ms = (fb >> shift).saturating_sub(fa >> shift);

    // Backward jump: back to the true time (a 120 s step back).
    set_offset(&offset, 0)?;
    let b_info = cmd(&mut b, &args!["LOCK.INFO", "rel:clk:a"])?;
    let b_ttl_after = b_info.get("ttl").and_then(|r| r.as_int()).unwrap_or(-1);
    let (tc, fc) = acquire(&mut a, "rel:clk:c", 10_000)?;
    let running_regression = fc <= fb;

    // Restarts after the correction, with no lock left held.
    for (k, t) in [("rel:clk:a", &tb), ("rel:clk:c", &tc)] {
        cmd(&mut a, &args!["LOCK.RELEASE", k, t])?;
    }
    drop((a, b));
    server.kill9();
    server.try_restart()?;
    let mut c = connect(&server)?;
    let (td, fd) = acquire(&mut c, "rel:clk:d", 1000)?;
    cmd(&mut c, &args!["LOCK.RELEASE", "rel:clk:d", &td])?;
    let aof_replay_ok = fd > fc;
    let r = cmd(&mut c, &args!["BGREWRITEAOF"])?;
    if r.is_error() {
        return Err(format!("BGREWRITEAOF: {r:?}"));
    }
    let idle = |f: &str| server.info_field("persistence", f).as_deref() == Some("0");
    let done = || idle("aof_rewrite_in_progress") && idle("aof_rewrite_scheduled");
    if !redis_lock_testkit::wait_until(Duration::from_secs(20), done) {
        return Err("AOF rewrite did not finish".into());
    }
    drop(c);
    server.kill9();
    server.try_restart()?;
    let mut c = connect(&server)?;
    let (_, fe) = acquire(&mut c, "rel:clk:e", 1000)?;
    let rewrite_regression = fe <= fd;

    o.figure = format!(
        "+{} s jump: a lock with {} s left vanished {} and was granted to another client; fences jumped by {} s worth and never went back while running",
        JUMP_MS / 1000,
        ttl_before / 1000,
        vanished_ms.map_or("only after more than 5 s".into(), |m| format!("at once ({m} ms after the jump)")),
        fence_jump_ms / 1000
    );
    if rewrite_regression {
        o.figure.push_str("; but after the jump was corrected, a restart from a rewritten AOF (or an RDB file) with no lock left issued a fence lower than one already issued");
    }
    o.trials = "1 forward + 1 backward jump of 120 s, 2 restarts".into();
    o.note(format!(
        "Forward jump (+{} s): Redis expires keys by the wall clock, so the lock acquired with a {} s lease (LOCK.INFO ttl {} ms) disappeared {} after the jump. A second client was granted it at once (fence {fb}, first holder's fence {fa}). The first holder, whose own timer still says ~{} s are left, got EXTEND -> {:?} and RELEASE -> {:?}: it can only learn it lost the lock by asking, or by having its writes refused by a fenced store.",
        JUMP_MS / 1000, LEASE_MS / 1000, ttl_before,
        vanished_ms.map_or("not within 5 s".into(), |m| format!("{m} ms")),
        LEASE_MS / 1000, a_extend, a_release
    ));
    o.note(format!(
        "Fences on a forward jump: the clock term (unix_ms << 10) jumps too, by {} ms worth ({} -> {}); less when the counter was still ahead of the clock from the start-up jump. Harmless for ordering, and the counter keeps it afterwards.",
        fence_jump_ms, fa, fb
    ));
    o.note(format!(
        "Backward jump (-{} s, back to true time): leases stretch by the jump. The lock granted during the jump now shows ttl {} ms for a {} s lease; it would be held {} s too long if its holder vanished. Fences keep rising on the running server (next fence {fc} > {fb}: {}).",
        JUMP_MS / 1000, b_ttl_after, LEASE_MS / 1000, JUMP_MS / 1000,
        if running_regression { "NO, it went back" } else { "yes" }
    ));
    o.note(format!(
        "Restart after the clock was corrected, all locks released: from the AOF as written (appendfsync always; it holds every grant and release since the last rewrite) the next fence is {} the highest issued ({fd} vs {fc}); after BGREWRITEAOF (the rewritten AOF, like an RDB file, only holds live locks) the next fence is {} ({fe} vs {fd}).{}",
        if aof_replay_ok { "above" } else { "NOT above" },
        if rewrite_regression { "LOWER than one already issued: a fence regression" } else { "still above" },
        if rewrite_regression { " Diagnosis: the fence counter is not persisted by itself: only the fences of locks still stored survive a rewrite or an RDB restart, and the clock term covers the rest only while the clock is not behind a time the server has already used. Persisting the counter (module aux data in RDB, a fence-floor record in the rewritten AOF) would remove this case." } else { "" }
    ));
    o.note("Plainly: a lease in this module is wall-clock time on the server. A forward step of the server's clock (NTP step, VM resume, operator) ends leases early and lets a second client in while the first still works; a backward step keeps locks held too long. Fencing tokens stay ordered on the running server, so a fenced store still refuses the first holder's late writes.");
    if running_regression {
        o.fail("fences went back on a running server after a backward jump");
    }
    if vanished_ms.is_none() {
        o.fail("the forward jump did not expire the lock (the shim or the measurement failed)");
    }
    if let Err(e) = health(&server, "the server") {
        o.fail(e);
    }
    Ok(())
}
