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

    o.put("jump_ms", JUMP_MS);
    o.put("lease_ms", LEASE_MS);
    o.put("vanished_ms", vanished_ms);
    o.put("ttls", [ttl_before, b_ttl_after]);
    o.put("fences", [fa, fb, fc, fd, fe]);
    o.put("fence_jump_ms", fence_jump_ms);
    o.put(
        "first_holder",
        [format!("{a_extend:?}"), format!("{a_release:?}")],
    );
    o.put(
        "regressions",
        [running_regression, !aof_replay_ok, rewrite_regression],
    );
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
