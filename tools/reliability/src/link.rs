//! A client connection that follows its server as a client library does: a pair's
//! current primary, a cluster's node for the key (`MOVED`, `ASK`, `TRYAGAIN`). Blocking
//! calls are timed against their `BLOCK`; the [`Kills`] register tells connections killed
//! on purpose from ones that broke by themselves.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::{cmd, must, now_ns, open, Conn, Counts, Reply};
use redis_lock_testkit::{args, key_slot};

/// How long a call may wait for its reply: `BLOCK` is at most 300 ms; pauses, `FAILOVER`
/// and `DEBUG RELOAD` add less than a second.
pub const READ_TIMEOUT: Duration = Duration::from_secs(8);
/// How late a blocking call may be answered (beyond its `BLOCK` time): 1 s in a full run
/// (on a quiet machine the slowest came 0.9 s late); 3 s in the short run
/// ([`short_run_grace`]), which `make test` runs on a loaded 2-core machine whose pauses
/// reach 1-2 s. A waiter never answered still fails there: no reply within
/// [`READ_TIMEOUT`] is a [`HANG`].
static GRACE_NS: AtomicU64 = AtomicU64::new(1_000_000_000);

/// The short run's grace (see [`GRACE_NS`]).
pub fn short_run_grace() {
    GRACE_NS.store(3_000_000_000, Ordering::Relaxed);
}

pub fn grace_ns() -> u64 {
    GRACE_NS.load(Ordering::Relaxed)
}
/// How long one call keeps following redirects, failovers and retries before it gives up.
const GIVE_UP: Duration = Duration::from_secs(20);

/// One server and db; a primary and a replica (which is which changes); cluster masters.
#[derive(Debug, Clone)]
pub enum Topo {
    Single(SocketAddr, u32),
    Pair([SocketAddr; 2]),
    Cluster(Vec<SocketAddr>),
}

impl Topo {
    pub fn nodes(&self) -> Vec<SocketAddr> {
        match self {
            Topo::Single(a, _) => vec![*a],
            Topo::Pair(p) => p.to_vec(),
            Topo::Cluster(n) => n.clone(),
        }
    }
}

/// What the run does to the servers that clients are excused for: connections killed
/// (node, client id or all, when) and write pauses (node, from, until; `u64::MAX`: open).
#[derive(Default)]
pub struct Kills {
    kills: Mutex<Vec<(usize, Option<u64>, u64)>>,
    pauses: Mutex<Vec<(usize, u64, u64)>>,
}

impl Kills {
    /// Call before the kill is sent.
    pub fn record(&self, node: usize, client: Option<u64>) {
        if let Ok(mut k) = self.kills.lock() {
            k.push((node, client, now_ns()));
        }
    }

    /// Whether connection `client` of `node` was killed on purpose, at `by` at the latest.
    pub fn killed(&self, node: usize, client: u64, by: u64) -> bool {
        self.kills.lock().is_ok_and(|k| {
            k.iter()
                .any(|&(n, c, at)| n == node && c.is_none_or(|c| c == client) && at <= by)
        })
    }

    /// A write pause of `node` begins now (call before sending its cause) for `ms`, or
    /// until [`pause_over`](Self::pause_over).
    pub fn pause(&self, node: usize, ms: Option<u64>) {
        let now = now_ns();
        let until = ms.map_or(u64::MAX, |ms| now + ms * 1_000_000);
        if let Ok(mut p) = self.pauses.lock() {
            p.push((node, now, until));
        }
    }

    pub fn pause_over(&self, node: usize) {
        let now = now_ns();
        if let Ok(mut p) = self.pauses.lock() {
            p.iter_mut()
                .filter(|x| x.0 == node && x.2 == u64::MAX)
                .for_each(|x| x.2 = now);
        }
    }

    /// How long a command sent to `node` at `sent` was held by pauses (capped at
    /// `answered`): one that arrives during a pause waits for its end; a queued waiter not.
    pub fn held_ns(&self, node: usize, sent: u64, answered: u64) -> u64 {
        let Ok(p) = self.pauses.lock() else { return 0 };
        let mut until = sent;
        while let Some(end) = p
            .iter()
            .filter(|x| x.0 == node && x.1 <= until && x.2 > until)
            .map(|x| x.2)
            .max()
        {
            until = end.min(answered);
            if until == answered {
                break;
            }
        }
        until - sent
    }
}

/// What one link saw: counts of `waits` (blocking calls, every attempt), `killed` (excused),
/// `late_by_pause` (late only because a pause of ours held them), redirects followed and
/// `reconnects`; the slowest waiter past its BLOCK, also net of pause time; violations
/// ([`LATE`], [`HANG`], [`BROKEN`]).
#[derive(Debug, Default, serde::Serialize)]
pub struct LinkLog {
    pub n: Counts,
    pub slowest_wait_over_block_ms: i64,
    pub slowest_net_ms: i64,
    pub bad: Vec<(&'static str, String)>,
}

pub const LATE: &str = "waiter answered later than BLOCK + the grace (1 s; 3 s in the short run)";
pub const HANG: &str = "call never answered";
pub const BROKEN: &str = "connection lost although nobody killed it";

impl LinkLog {
    /// Adds another link's figures (not its bad calls: they become violations).
    pub fn add(&mut self, o: &LinkLog) {
        self.n.add(&o.n);
        let slowest = &mut self.slowest_wait_over_block_ms;
        *slowest = (*slowest).max(o.slowest_wait_over_block_ms);
        self.slowest_net_ms = self.slowest_net_ms.max(o.slowest_net_ms);
    }
}

/// The outcome of one call with its retries: the replies, the first attempt's invoke and
/// the last one's completion; or lost (killed, a hang: unknown), with the invoke.
pub enum Answer {
    Reply(Vec<Reply>, u64, u64),
    Lost(u64),
}

struct Node {
    conn: Conn,
    id: u64,
}

pub struct Link {
    topo: Topo,
    addrs: Vec<SocketAddr>,
    conns: Vec<Option<Node>>,
    /// Pair: the primary; cluster: the node of each slot; the node of the last reply.
    primary: usize,
    slots: Vec<usize>,
    pub last_node: usize,
    read_timeout: Duration,
    pub log: LinkLog,
}

fn text(e: &Reply) -> Option<&str> {
    match e {
        Reply::Error(t) => Some(t),
        _ => None,
    }
}

fn shown(cmd: &[Vec<u8>]) -> String {
    let parts: Vec<_> = cmd.iter().map(|a| String::from_utf8_lossy(a)).collect();
    parts.join(" ")
}

impl Link {
    pub fn new(topo: &Topo, read_timeout: Duration) -> Link {
        let addrs = topo.nodes();
        Link {
            conns: addrs.iter().map(|_| None).collect(),
            addrs,
            topo: topo.clone(),
            primary: 0,
            slots: Vec::new(),
            last_node: 0,
            read_timeout,
            log: LinkLog::default(),
        }
    }

    fn index_of(&self, addr: &str) -> Option<usize> {
        let a: SocketAddr = addr.parse().ok()?;
        self.addrs.iter().position(|x| *x == a)
    }

    fn node(&mut self, i: usize) -> Result<&mut Node, String> {
        if self.conns[i].is_none() {
            let mut conn = open(self.addrs[i], Duration::from_secs(2), self.read_timeout)?;
            if let Topo::Single(_, db @ 1..) = self.topo {
                must(&mut conn, &args!["SELECT", db])?;
            }
            let id = cmd(&mut conn, &args!["CLIENT", "ID"])?
                .as_int()
                .unwrap_or(0) as u64;
            self.conns[i] = Some(Node { conn, id });
            self.log.n.bump("reconnects");
        }
        self.conns[i].as_mut().ok_or("no connection".into())
    }

    /// Pair: asks both servers for their role until one says it is the primary.
    fn find_primary(&mut self) {
        let deadline = Instant::now() + GIVE_UP;
        while Instant::now() < deadline {
            for i in 0..self.addrs.len() {
                let role = self.node(i).and_then(|n| cmd(&mut n.conn, &args!["ROLE"]));
                match role {
                    Ok(r) => {
                        let first = r.as_items().and_then(|v| v.first()?.as_text());
                        if first.as_deref() == Some("master") {
                            self.primary = i;
                            return;
                        }
                    }
                    Err(_) => self.conns[i] = None,
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Cluster: the slot table from `CLUSTER SLOTS` of any node.
    fn load_slots(&mut self) {
        for i in 0..self.addrs.len() {
            let Ok(r) = (self.node(i)).and_then(|n| cmd(&mut n.conn, &args!["CLUSTER", "SLOTS"]))
            else {
                self.conns[i] = None;
                continue;
            };
            let mut slots = vec![0usize; 16384];
            for range in r.as_items().unwrap_or_default() {
                let Some([lo, hi, master, ..]) = range.as_items() else {
                    continue;
                };
                let port = master.as_items().and_then(|m| m.get(1)?.as_int());
                let node = self
                    .addrs
                    .iter()
                    .position(|a| Some(i64::from(a.port())) == port);
                if let (Some(lo), Some(hi), Some(n)) = (lo.as_int(), hi.as_int(), node) {
                    for s in lo.max(0)..=hi.min(16383) {
                        slots[s as usize] = n;
                    }
                }
            }
            self.slots = slots;
            return;
        }
    }

    fn route(&mut self, key: &[u8]) -> usize {
        match self.topo {
            Topo::Single(..) => 0,
            Topo::Pair(_) => self.primary,
            Topo::Cluster(_) => {
                if self.slots.is_empty() {
                    self.load_slots();
                }
                *self.slots.get(usize::from(key_slot(key))).unwrap_or(&0)
            }
        }
    }

    /// Sends `cmds` (a command and perhaps a `WAIT`) for `key` as one pipeline to the
    /// node that serves it, following redirects and failovers. `block`: the BLOCK time of
    /// a blocking acquire (its first command), for the waiter check.
    pub fn call(
        &mut self,
        key: &[u8],
        cmds: &[Vec<Vec<u8>>],
        block: Option<u64>,
        kills: &Kills,
    ) -> Answer {
        let started = Instant::now();
        let mut first_t0 = None;
        let mut asking: Option<usize> = None;
        loop {
            let node = asking.unwrap_or_else(|| self.route(key));
            let t0 = now_ns();
            let first = *first_t0.get_or_insert(t0);
            let (what, ms) = (shown(&cmds[0]), |ns: u64| ns / 1_000_000);
            if started.elapsed() > GIVE_UP {
                let secs = GIVE_UP.as_secs();
                let why = format!("`{what}` found no server to answer it within {secs} s");
                self.log.bad.push((BROKEN, why));
                return Answer::Lost(first);
            }
            let n = match self.node(node) {
                Ok(n) => n,
                Err(_) => {
                    // Down (restarting) or refusing: find where to go, and try again.
                    if let Topo::Pair(_) = self.topo {
                        self.find_primary();
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            };
            let id = n.id;
            let asked = usize::from(asking.take().is_some());
            if asked == 1 {
                n.conn.queue(&args!["ASKING"]);
            }
            for c in cmds {
                n.conn.queue(c);
            }
            let mut replies = Vec::with_capacity(cmds.len() + asked);
            let mut failed = n.conn.flush().err();
            while failed.is_none() && replies.len() < cmds.len() + asked {
                match n.conn.read() {
                    Ok(r) => replies.push(r),
                    Err(e) => failed = Some(e),
                }
            }
            let t1 = now_ns();
            if asked == 1 && !replies.is_empty() {
                replies.remove(0);
            }
            // A server that turns into a replica answers its blocked clients UNBLOCKED and
            // then closes their connections (Redis and Valkey alike): expected.
            let first_error = replies.first().and_then(text).unwrap_or("").to_string();
            let unblocked = first_error.starts_with("UNBLOCKED");
            if unblocked && matches!(self.topo, Topo::Pair(_)) {
                self.conns[node] = None;
                if failed.is_some() {
                    replies.resize(cmds.len(), Reply::Nil);
                    failed = None;
                }
            }
            if let Some(e) = failed {
                self.conns[node] = None;
                use std::io::ErrorKind::{TimedOut, WouldBlock};
                let hang = matches!(e.kind(), WouldBlock | TimedOut);
                if kills.killed(node, id, t1) {
                    self.log.n.bump("killed");
                    // A waiter killed before its deadline is excused; one killed after
                    // it was late already.
                    if let Some(b) = block {
                        if !kills.killed(node, id, t0 + b * 1_000_000 + grace_ns()) {
                            self.late(cmds, t0, t1, b, "killed only after its deadline");
                        }
                    }
                } else if hang {
                    let secs = self.read_timeout.as_secs();
                    self.log
                        .bad
                        .push((HANG, format!("`{what}`: no reply within {secs} s")));
                } else {
                    let (at, after) = (ms(t0), ms(t1 - t0));
                    let why = format!("`{what}` on node {node} (client id {id}), sent at {at} ms, lost after {after} ms: {e}");
                    self.log.bad.push((BROKEN, why));
                }
                return Answer::Lost(first);
            }
            if let Some(b) = block {
                self.log.n.bump("waits");
                let over = (t1 - t0) as i64 / 1_000_000 - b as i64;
                self.log.slowest_wait_over_block_ms = self.log.slowest_wait_over_block_ms.max(over);
                let budget = b * 1_000_000 + grace_ns();
                let paused = kills.held_ns(node, t0, t1);
                let net = (t1 - t0 - paused) as i64 / 1_000_000 - b as i64;
                self.log.slowest_net_ms = self.log.slowest_net_ms.max(net);

                if t1 - t0 > budget {
                    if t1 - t0 - paused <= budget {
                        self.log.n.bump("late_by_pause");
                    } else {
                        self.late(cmds, t0, t1, b, "answered late");
                    }
                }
            }
            let mut words = first_error.split(' ');
            match (words.next().unwrap_or(""), &self.topo) {
                ("MOVED", _) => {
                    self.log.n.bump("moved");
                    let slot = words.next().and_then(|s| s.parse::<usize>().ok());
                    match (slot, self.index_of(words.next().unwrap_or(""))) {
                        (Some(slot), Some(i)) if slot < self.slots.len() => self.slots[slot] = i,
                        _ => self.load_slots(),
                    }
                }
                ("ASK", _) => {
                    self.log.n.bump("ask");
                    asking = self.index_of(words.nth(1).unwrap_or(""));
                    if asking.is_none() {
                        self.load_slots();
                    }
                }
                ("TRYAGAIN", _) => {
                    self.log.n.bump("tryagain");
                    std::thread::sleep(Duration::from_millis(5));
                }
                ("READONLY" | "UNBLOCKED", Topo::Pair(_)) => {
                    self.log.n.bump("rerouted");
                    self.find_primary();
                }
                ("LOADING" | "CLUSTERDOWN" | "MASTERDOWN", _) => {
                    self.log.n.bump("rerouted");
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    self.last_node = node;
                    return Answer::Reply(replies, first, t1);
                }
            }
        }
    }

    fn late(&mut self, cmds: &[Vec<Vec<u8>>], t0: u64, t1: u64, block: u64, why: &str) {
        self.log.bad.push((
            LATE,
            format!(
                "`{}` (BLOCK {block}): {why} after {} ms",
                shown(&cmds[0]),
                (t1 - t0) / 1_000_000
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_command_that_arrives_during_a_pause_is_held() {
        let k = Kills::default();
        let p = |node, from: u64, to: u64| k.pauses.lock().unwrap().push((node, from, to));
        p(0, 100, 300);
        p(0, 250, 500); // a second pause chained to the first
        p(1, 0, 10_000);
        for (sent, answered, held, why) in [
            (150, 1000, 350, "held until the chained pause ends"),
            (150, 400, 250, "capped at the answer"),
            (50, 1000, 0, "already running when the pause began"),
            (600, 700, 0, "after the pauses"),
        ] {
            assert_eq!(k.held_ns(0, sent, answered), held, "{why}");
        }
        k.pause(2, None);
        let t = now_ns();
        let held = k.held_ns(2, t, t + 5);
        assert_eq!(held, 5, "an open pause holds until the answer");
        k.pause_over(2);
        assert!(k.held_ns(2, now_ns() + 1, now_ns() + 10) == 0);
    }

    #[test]
    fn kills_excuse_only_their_connection_or_server() {
        let k = Kills::default();
        k.record(0, Some(7));
        k.record(1, None);
        let later = now_ns() + 1;
        assert!(k.killed(0, 7, later) && !k.killed(0, 8, later));
        assert!(k.killed(1, 8, later), "a server kill ends every connection");
        assert!(!k.killed(0, 7, 0), "not before it was recorded");
    }
}
