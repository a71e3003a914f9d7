//! Issue 23's benchmarks (docs/BENCHMARKS.md, section 7). (1) Guarded writes:
//! `LOCK.IFHELD ... SET` against the classic `WATCH`/`MULTI` form and the plain `SET`,
//! 50 clients, pipeline 1, every form once per round in a rotating order, every reply
//! checked. (2) Observe hand-offs: release to the FIFO waiter's grant and to each of N
//! `LOCK.WATCH` clients' answers, against polling `LOCK.INFO`. (3) Both under callgrind.

use std::io;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_report::perf::{
    self, CgRelease, CgWrite, Guarded, GuardedCallgrind, GuardedRate, ObserveLevel, PollDelay,
    Spread,
};
use redis_lock_testkit::{args, lock, RawConn};

use crate::callgrind::{costs, server_name, Session, SETTLE};
use crate::config::Config;
use crate::load::{self, gather, Batch, Peer, Shape, STALL};
use crate::ops::{self, key, Op, Scripts, TOKEN};
use crate::stats::{median, quantiles};
use crate::{On, Rig, Server};

/// The forms compared: report name, op, server (a string lock's form: without the module).
pub const WRITES: [(&str, &Op, On); 7] = [
    (perf::G_SET, &ops::GUARD_SET, On::Lock),
    (perf::G_IFHELD, &ops::IFHELD, On::Lock),
    (perf::G_IFFENCE, &ops::IFFENCE, On::Lock),
    (perf::G_CHECK, &ops::CHECK, On::Lock),
    (perf::G_WATCH_CHECK, &ops::WATCH_CHECK, On::Lock),
    (perf::G_WATCH_GET, &ops::WATCH_GET, On::Plain),
    (perf::G_WATCH_GET_2RT, &ops::WATCH_GET_2RT, On::Plain),
];

/// The lock of connection `conn` (also the `{k}` of its writes).
fn lock_key(conn: usize) -> Vec<u8> {
    key(b"guard", conn, 0)
}

/// Holds one lock per connection on `s`, a module lock or a `SET NX PX` string lock;
/// returns each lock's fence (empty for a string lock).
fn hold(s: &Server, on: On, conns: usize) -> io::Result<Vec<Vec<u8>>> {
    let module = on == On::Lock;
    let cmds: Vec<Vec<Vec<u8>>> = (0..conns)
        .map(|i| match module {
            true => args!["LOCK.ACQUIRE", lock_key(i), "TOKEN", TOKEN, "PX", ops::TTL],
            false => args!["SET", lock_key(i), TOKEN, "NX", "PX", ops::TTL],
        })
        .collect();
    let replies = s.conn()?.pipeline(&cmds)?;
    replies
        .iter()
        .map(|r| match (module, r.grant(), r.as_bytes()) {
            (true, Some((_, fence)), _) => Ok(fence.to_string().into_bytes()),
            (false, _, Some(b"OK")) => Ok(vec![]),
            _ => Err(io::Error::other(format!(
                "could not hold a guard lock: {r:?}"
            ))),
        })
        .collect()
}

/// The batching of `op` at pipeline 1: its own round trips, else one command at a time.
fn batch(op: &Op) -> Batch<'_> {
    match op.trips {
        [] => Batch::Pipeline(1),
        trips => Batch::Trips(trips),
    }
}

/// The writes of `op` as a workload, each connection on its own lock (of fence `fences[conn]`).
fn writes_of<'a>(
    op: &'a Op,
    scripts: &'a Scripts,
    fences: &'a [Vec<u8>],
) -> impl Fn(usize, u64, &mut Vec<u8>) -> Option<Shape> + 'a {
    let per_op = op.commands_per_op();
    move |conn, i, out| {
        let fence = fences.get(conn).map_or(&b""[..], Vec::as_slice);
        op.put((i % per_op) as usize, &lock_key(conn), scripts, fence, out)
    }
}

/// Writes per second of `op` on `s`, `cmds` commands per connection (whole writes).
fn rate(s: &Server, op: &Op, fences: &[Vec<u8>], cmds: u64) -> io::Result<f64> {
    let per_op = op.commands_per_op();
    let per_conn = cmds.max(per_op) / per_op * per_op;
    let w = writes_of(op, &s.scripts, fences);
    let conns = fences.len();
    let per_sec = load::run(s.port, conns, batch(op), per_conn, &op.shown(), &w)?;
    Ok(per_sec / per_op as f64)
}

/// Part 1 on one binary: every form once per round, the order rotated round by round.
fn rates(rig: &Rig) -> io::Result<Vec<GuardedRate>> {
    let cfg = &rig.lock.cfg;
    let conns = cfg.clients;
    let fences = [
        hold(&rig.lock, On::Lock, conns)?,
        hold(&rig.plain, On::Plain, conns)?,
    ];
    let fences_on = |on: On| &fences[usize::from(on != On::Lock)];
    let cmds = (cfg.ops_p1 / conns as u64).max(1);
    for (_, op, on) in WRITES {
        rate(rig.on(on), op, fences_on(on), cmds / 10)?;
    }
    let mut rounds = vec![vec![]; WRITES.len()];
    for round in 0..cfg.rounds {
        for j in 0..WRITES.len() {
            let i = (j + round) % WRITES.len();
            let (_, op, on) = WRITES[i];
            rounds[i].push(rate(rig.on(on), op, fences_on(on), cmds)?);
        }
    }
    let rows = WRITES.iter().zip(rounds).map(|(&(name, op, on), rounds)| {
        eprintln!("  [guarded] {name}: {:.0} writes/s", median(&rounds));
        GuardedRate {
            name: name.into(),
            command: op.shown(),
            server: server_name((on, false)).into(),
            commands: op.commands_per_op(),
            round_trips: if op.trips.is_empty() {
                op.commands_per_op()
            } else {
                op.trips.len() as u64
            },
            rate: median(&rounds),
            rounds,
        }
    });
    Ok(rows.collect())
}

impl Peer {
    /// `LOCK.ACQUIRE k TOKEN holder PX LEASE`, with `BLOCK` when `block`.
    fn acquire(&mut self, k: &[u8], holder: &[u8], block: bool) -> io::Result<()> {
        let cmd: [&[u8]; 6] = [b"LOCK.ACQUIRE", k, b"TOKEN", holder, b"PX", LEASE];
        let wait: &[&[u8]] = if block { &[b"BLOCK", BLOCK] } else { &[] };
        self.send(&[&cmd[..], wait].concat())
    }

    /// `LOCK.RELEASE k holder`; returns when its reply (`:1`, else an error) was read.
    fn release(&mut self, k: &[u8], holder: &[u8]) -> io::Result<Instant> {
        self.send(&[b"LOCK.RELEASE", k, holder])?;
        match self.reply()?.0 {
            Shape::Int(1) => Ok(Instant::now()),
            other => Err(io::Error::other(format!("RELEASE answered {other:?}"))),
        }
    }

    fn watch(&mut self, k: &[u8], fence: &[u8]) -> io::Result<()> {
        self.send(&[b"LOCK.WATCH", k, b"FENCE", fence, b"BLOCK", BLOCK])
    }
}

/// The fence of a `[token, fence]` grant as its digits; `Err(what)` for another reply.
fn fence_of(grant: &[u8], what: &str) -> io::Result<Vec<u8>> {
    let digits = grant.strip_suffix(b"\r\n").and_then(|body| {
        let at = body.iter().rposition(|&b| b == b':')?;
        Some(&body[at + 1..]).filter(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit))
    });
    digits
        .map(<[u8]>::to_vec)
        .ok_or_else(|| io::Error::other(what.to_string()))
}

/// Waits (polling without a pause) until the server counts these waiters and watchers.
fn wait_counts(c: &mut RawConn, waiters: u64, watchers: u64) -> io::Result<()> {
    let want = [("lock_waiters", waiters), ("lock_watchers", watchers)];
    ops::wait_for(c, "lock", &want, Duration::ZERO, STALL)
}

/// Percentiles of the samples (all 0 with `n` 0 when there are none).
fn spread(mut v: Vec<f64>) -> Spread {
    if v.is_empty() {
        return Spread::default();
    }
    let [p50, p99, max] = quantiles(&mut v, [0.5, 0.99, 1.0]);
    Spread {
        p50,
        p99,
        max,
        n: v.len(),
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

const HOLDERS: [&[u8]; 2] = [b"observe-holder-a-0001", b"observe-holder-b-0001"];
const LEASE: &[u8] = b"600000";
const BLOCK: &[u8] = b"60000";

/// Two clients taking turns on `k`: one holds it, the other waits in the FIFO queue.
struct Turns {
    peers: [Peer; 2],
    key: Vec<u8>,
    /// Whose turn it is to hold, and the fence of that grant.
    holder: usize,
    fence: Vec<u8>,
}

impl Turns {
    fn start(port: u16, key: &str) -> io::Result<Turns> {
        let mut peers = [Peer::connect(port)?, Peer::connect(port)?];
        peers[0].acquire(key.as_bytes(), HOLDERS[0], false)?;
        let fence = fence_of(&peers[0].reply()?.1, "observe: first grant")?;
        Ok(Turns {
            peers,
            key: key.as_bytes().to_vec(),
            holder: 0,
            fence,
        })
    }

    /// The other client queues behind the holder (not waiting for it to queue).
    fn queue_waiter(&mut self) -> io::Result<()> {
        let w = 1 - self.holder;
        self.peers[w].acquire(&self.key, HOLDERS[w], true)
    }

    /// The holder releases: returns when it sent the RELEASE and when it read the reply.
    fn release(&mut self) -> io::Result<(Instant, Instant)> {
        let (h, t0) = (self.holder, Instant::now());
        Ok((t0, self.peers[h].release(&self.key, HOLDERS[h])?))
    }

    /// Takes the waiter's grant (read by the caller): it becomes the holder.
    fn granted(&mut self, reply: &[u8]) -> io::Result<()> {
        self.fence = fence_of(reply, "observe: the waiter was not granted")?;
        self.holder = 1 - self.holder;
        Ok(())
    }
}

/// Hand-offs at this many watchers: fewer above 100 (each re-arms every watcher), >= 20.
pub fn handoffs_at(cfg: &Config, watchers: u64) -> usize {
    let scaled = cfg.obs_handoffs as u64 * 100 / watchers.max(100);
    (scaled as usize).max(20).min(cfg.obs_handoffs)
}

/// Part 2 at one watcher count.
fn observe_level(s: &Server, n: u64, handoffs: usize) -> io::Result<ObserveLevel> {
    let mut ctl = s.conn()?;
    let mut turns = Turns::start(s.port, &format!("observe:{n}"))?;
    let mut watchers = Peer::many(s.port, n)?;
    let (mut release, mut grant, mut watch, mut last) = (vec![], vec![], vec![], vec![]);
    for _ in 0..handoffs {
        turns.queue_waiter()?;
        for w in &mut watchers {
            w.watch(&turns.key, &turns.fence)?;
        }
        wait_counts(&mut ctl, 1, n)?;
        let (t0, t1) = turns.release()?;
        release.push(micros(t1 - t0));
        let waiter = 1 - turns.holder;
        let mut peers: Vec<&mut Peer> = vec![&mut turns.peers[waiter]];
        peers.extend(watchers.iter_mut());
        let got = gather(&mut peers)?;
        let mut latest = 0.0f64;
        for (i, (t, shape, r)) in got.iter().enumerate() {
            let after = micros(t.saturating_duration_since(t1));
            if i == 0 {
                grant.push(after);
                continue;
            }
            // The new holder's summary, or nil if the pass ran before the grant.
            if !matches!(shape, Shape::Array(_) | Shape::Nil) {
                let text = String::from_utf8_lossy(r);
                bail!("observe: LOCK.WATCH answered {text}");
            }
            watch.push(after);
            latest = latest.max(after);
        }
        if n > 0 {
            last.push(latest);
        }
        let grant_reply = got.first().map(|g| g.2.clone()).unwrap_or_default();
        turns.granted(&grant_reply)?;
    }
    let level = ObserveLevel {
        watchers: n,
        handoffs,
        release: spread(release),
        grant: spread(grant),
        watch: spread(watch),
        last_watcher: spread(last),
    };
    eprintln!(
        "  [observe {}] {n} watchers, {handoffs} hand-offs: RELEASE {:.0} µs, grant +{:.0} µs, watcher +{:.0} µs (p50)",
        s.label, level.release.p50, level.grant.p50, level.watch.p50
    );
    Ok(level)
}

/// Sleeps until `t` (at once if it has passed).
fn sleep_until(t: Instant) {
    sleep(t.saturating_duration_since(Instant::now()));
}

/// The polling alternative: the same hand-offs seen by `LOCK.INFO` every `interval` ms,
/// each release at a pseudo-random point of an interval (the observer cannot know it).
fn poll_delay(s: &Server, interval_ms: u64, handoffs: usize) -> io::Result<PollDelay> {
    let mut ctl = s.conn()?;
    let mut poller = s.conn()?;
    let k = format!("poll:{interval_ms}");
    let mut turns = Turns::start(s.port, &k)?;
    let every = Duration::from_millis(interval_ms);
    let start = Instant::now();
    let (mut tick, mut rng) = (0u32, 0x2545_F491_4F6C_DD1Du64);
    let mut poll = |tick: &mut u32| -> io::Result<(Option<u64>, Instant)> {
        sleep_until(start + every * *tick);
        *tick += 1;
        let fence = lock::info(&mut poller, &k)?.and_then(|i| i.fence);
        Ok((fence, Instant::now()))
    };
    let mut delays = vec![];
    for _ in 0..handoffs {
        turns.queue_waiter()?;
        wait_counts(&mut ctl, 1, 0)?;
        let old: Option<u64> = std::str::from_utf8(&turns.fence)
            .ok()
            .and_then(|f| f.parse().ok());
        let (seen, _) = poll(&mut tick)?;
        if seen != old {
            bail!("poll: LOCK.INFO shows another holder");
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let at = (rng % 1_000_000) as f64 / 1e6;
        sleep_until(start + every * (tick - 1) + every.mul_f64(at));
        let (_, t1) = turns.release()?;
        let w = 1 - turns.holder;
        let (_, grant) = turns.peers[w].reply()?;
        turns.granted(&grant)?;
        loop {
            let (fence, t) = poll(&mut tick)?;
            if fence != old {
                delays.push(micros(t.saturating_duration_since(t1)));
                break;
            }
        }
    }
    let delay = spread(delays);
    eprintln!(
        "  [observe {}] polling LOCK.INFO every {interval_ms} ms: sees the hand-off {:.1} ms after the release (p50)",
        s.label,
        delay.p50 / 1e3
    );
    Ok(PollDelay {
        interval_ms,
        handoffs,
        delay,
    })
}

/// Parts 1 and 2 on one binary (polling only on the first: its delay is the interval's).
pub fn run(rig: &Rig, poll: bool, date: &str) -> io::Result<Guarded> {
    let cfg = &rig.lock.cfg;
    let rates = rates(rig)?;
    let observe = (cfg.obs_watchers.0.iter())
        .map(|&n| observe_level(&rig.lock, n, handoffs_at(cfg, n)))
        .collect::<io::Result<_>>()?;
    let intervals = if poll && cfg.poll_handoffs > 0 {
        &cfg.poll_ms.0[..]
    } else {
        &[]
    };
    let polls = (intervals.iter())
        .map(|&ms| poll_delay(&rig.lock, ms, cfg.poll_handoffs))
        .collect::<io::Result<_>>()?;
    Ok(Guarded {
        date: date.into(),
        clients: cfg.clients,
        rounds: cfg.rounds,
        commands_per_run: cfg.ops_p1 / cfg.clients as u64 * cfg.clients as u64,
        rates,
        observe,
        poll: polls,
    })
}

/// Repetitions of each RELEASE-with-watchers count under callgrind.
const CG_RELEASES: usize = 3;

/// Part 3 on `bin`: instructions per write of every form (one connection, its own round
/// trips, `cg_ops / 4` writes), then per RELEASE with each watcher count.
pub fn callgrind(bin: &Path, cfg: &Config, date: &str) -> io::Result<GuardedCallgrind> {
    let writes = (cfg.cg_ops / 4).max(100);
    let mut rows = vec![];
    let mut release = vec![];
    let mut label = String::new();
    for on in [On::Plain, On::Lock] {
        let mut s = Session::start(bin, cfg, (on, false), &format!("guarded-{on:?}"), false)?;
        label.clone_from(&s.server.label);
        let fences = hold(&s.server, on, 1)?;
        for (name, op, _) in WRITES.iter().filter(|w| w.2 == on) {
            let per_op = op.commands_per_op();
            let scripts = s.server.scripts.clone();
            let w = writes_of(op, &scripts, &fences);
            let b = batch(op);
            load::run(s.server.port, 1, b, writes / 10 * per_op, "warm-up", &w)?;
            s.settle(SETTLE);
            let c = costs(&s.measure(&w, writes * per_op, Some(b), name)?, writes)?;
            eprintln!(
                "  [callgrind {label}] {name}: {:.0} Ir per write, {:.0} in processCommand",
                c.total, c.process
            );
            rows.push(CgWrite {
                name: name.to_string(),
                command: op.shown(),
                server: server_name((on, false)).into(),
                total: c.total,
                process: c.process,
                inclusive: c.inclusive,
            });
        }
        if on == On::Lock {
            for &n in &cfg.obs_watchers.0 {
                release.push(release_with_watchers(&mut s, n)?);
            }
        }
    }
    // In the order of WRITES, whichever server each ran on.
    rows.sort_by_key(|r| WRITES.iter().position(|w| w.0 == r.name));
    Ok(GuardedCallgrind {
        date: date.into(),
        server: label,
        writes,
        rows,
        release,
    })
}

/// Instructions of a RELEASE of a lock `n` clients watch, no waiter: inside
/// `processCommand`, and until every watcher had its answer. Median of [`CG_RELEASES`].
fn release_with_watchers(s: &mut Session, n: u64) -> io::Result<CgRelease> {
    let port = s.server.port;
    let mut ctl = s.server.conn()?;
    let mut holder = Peer::connect(port)?;
    let mut watchers = Peer::many(port, n)?;
    let k = format!("cg-observe:{n}");
    let (mut process, mut total) = (vec![], vec![]);
    // The first round warms up (the first use of the key's watcher list), uncounted.
    for rep in 0..=CG_RELEASES {
        holder.acquire(k.as_bytes(), HOLDERS[0], false)?;
        let fence = fence_of(&holder.reply()?.1, "cg observe: not granted")?;
        for w in &mut watchers {
            w.watch(k.as_bytes(), &fence)?;
        }
        wait_counts(&mut ctl, 0, n)?;
        s.zero()?;
        holder.release(k.as_bytes(), HOLDERS[0])?;
        let mut peers: Vec<&mut Peer> = watchers.iter_mut().collect();
        gather(&mut peers)?;
        let dump = s.dump()?;
        if rep > 0 {
            let c = costs(&dump, 1)?;
            process.push(c.process);
            total.push(c.total);
        }
    }
    let r = CgRelease {
        watchers: n,
        reps: process.len(),
        process: median(&process),
        total: median(&total),
    };
    eprintln!(
        "  [callgrind {}] RELEASE with {n} watchers: {:.0} Ir in processCommand, {:.0} until every watcher was answered",
        s.server.label, r.process, r.total
    );
    Ok(r)
}
