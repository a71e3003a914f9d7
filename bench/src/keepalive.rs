//! Keepalive traffic for [`LOCKS`] locks held by one process (issue 30): one session
//! renewed by one `LOCK.SESSION KEEPALIVE` per period, against each lock renewed by its
//! own `LOCK.EXTEND` per period. On the first server under callgrind, each side on a
//! server of its own: the commands, bytes in and out (the server's `INFO stats`) and
//! instructions of a run of periods sent back to back, per period.

use std::io;
use std::path::Path;

use redis_lock_report::perf::{Keepalive, KeepaliveSide};
use redis_lock_testkit::{encode, RawConn};

use crate::callgrind::{costs, Session, SETTLE};
use crate::config::Config;
use crate::load::{self, Shape};
use crate::ops::{key, TOKEN};
use crate::On;

pub const LOCKS: u64 = 1000;
/// The lease, and the renewal period (a third of it, as the client packages renew).
const TTL: &[u8] = b"30000";
const PERIOD_MS: u64 = 10_000;
const SESSION_ID: &[u8] = b"bench-session-0123456789abcdef";

/// `total_commands_processed`, `total_net_input_bytes`, `total_net_output_bytes`, from
/// one `INFO stats`.
fn net(c: &mut RawConn) -> io::Result<[f64; 3]> {
    let info = c.info("stats")?;
    let get = |f: &str| {
        let v = info
            .iter()
            .find(|(k, _)| k == f)
            .and_then(|(_, v)| v.parse().ok());
        v.ok_or_else(|| io::Error::other(format!("INFO stats has no {f}")))
    };
    Ok([
        get("total_commands_processed")?,
        get("total_net_input_bytes")?,
        get("total_net_output_bytes")?,
    ])
}

/// One side: `session` or per-lock renewal, `periods` periods measured.
fn side(bin: &Path, cfg: &Config, session: bool, periods: u64) -> io::Result<KeepaliveSide> {
    let name = if session { "session" } else { "per-lock" };
    let mut s = Session::start(
        bin,
        cfg,
        (On::Lock, false),
        &format!("keepalive-{name}"),
        false,
    )?;
    let (port, mut c) = (s.server.port, s.server.conn()?);
    if session {
        c.ok(&[b"LOCK.SESSION", b"OPEN", SESSION_ID, b"PX", TTL])?;
    }
    let hold = |_: usize, i: u64, out: &mut Vec<u8>| {
        let k = key(b"ka", 0, i);
        match session {
            true => encode(
                out,
                &[b"LOCK.ACQUIRE", &k, b"SESSION", SESSION_ID, b"TOKEN", TOKEN],
            ),
            false => encode(out, &[b"LOCK.ACQUIRE", &k, b"TOKEN", TOKEN, b"PX", TTL]),
        }
        Some(Shape::Array(2))
    };
    load::run(port, 1, 256, LOCKS, "hold", &hold)?;
    // A period's commands, each in its own round trip (as a per-lock timer sends it).
    let per_period = if session { 1 } else { LOCKS };
    let renew = |_: usize, i: u64, out: &mut Vec<u8>| {
        match session {
            true => encode(out, &[b"LOCK.SESSION", b"KEEPALIVE", SESSION_ID]),
            false => encode(
                out,
                &[b"LOCK.EXTEND", &key(b"ka", 0, i % LOCKS), TOKEN, b"PX", TTL],
            ),
        }
        Some(Shape::Int(1))
    };
    load::run(port, 1, 1, per_period * 2, "warm-up", &renew)?;
    s.settle(SETTLE);
    // What one INFO call counts by itself (two in a row), taken off the measured window.
    let (a, b) = (net(&mut c)?, net(&mut c)?);
    let before = net(&mut c)?;
    let dump = s.measure(
        &renew,
        per_period * periods,
        Some(load::Batch::Pipeline(1)),
        name,
    )?;
    let after = net(&mut c)?;
    let p = periods as f64;
    let [commands, bytes_in, bytes_out] =
        [0, 1, 2].map(|i| (after[i] - before[i] - (b[i] - a[i])) / p);
    let cg = costs(&dump, periods)?;
    let held = c.info_u64("lock", "lock_held")?;
    if held != LOCKS {
        bail!("keepalive {name}: {held} locks held after the run, not {LOCKS}");
    }
    eprintln!(
        "  [keepalive {}] {name}: per period {commands:.0} commands, {bytes_in:.0} B in, {bytes_out:.0} B out, {:.0} instructions ({:.0} in processCommand)",
        s.server.label, cg.total, cg.process
    );
    Ok(KeepaliveSide {
        name: name.into(),
        command: match session {
            true => "LOCK.SESSION KEEPALIVE <id>".into(),
            false => "LOCK.EXTEND k <36-byte token> PX 30000, once per lock".into(),
        },
        commands,
        bytes_in,
        bytes_out,
        instructions: cg.total,
        process: cg.process,
    })
}

pub fn run(bin: &Path, cfg: &Config, date: &str) -> io::Result<Keepalive> {
    let periods = (cfg.cg_ops / LOCKS).max(5);
    let sides = [true, false].map(|session| side(bin, cfg, session, periods));
    let [a, b] = sides;
    Ok(Keepalive {
        date: date.into(),
        server: redis_lock_testkit::flavor_of(bin).map_or_else(|e| e, |f| f.label()),
        locks: LOCKS,
        ttl_ms: 30_000,
        period_ms: PERIOD_MS,
        periods,
        sides: vec![a?, b?],
    })
}
