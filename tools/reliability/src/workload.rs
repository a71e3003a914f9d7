//! The fenced workload of the mutex, chaos and kinds rows (docs/RELIABILITY.md): clients
//! on exclusive, SHARED and LIMIT n keys through a [`Link`], critical sections against an
//! in-process fenced [`Store`], every call recorded for the checker (checker.rs).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::checker::{self, Call, Grant, Mode, StoreEvent, StoreEventKind};
use crate::common::{joined, now_ns, thousands, Counts, Env, Outcome, Reply, Verdict};
use crate::linear::{self, Ret};
use crate::link::{Answer, Kills, Link, LinkLog, Topo, READ_TIMEOUT};
use redis_lock_testkit::{args, Rng};

/// Lease of ordinary holders.
const LONG_TTL: u64 = 5000;
/// Slack on lease bounds: ms truncation of the server's clock plus wall vs monotonic.
pub const SLACK_NS: u64 = 2_000_000;

/// What a key is (SHARED: readers and writers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exclusive,
    Shared,
    Limit(u32),
}

impl Kind {
    pub fn name(self) -> String {
        match self {
            Kind::Exclusive => "exclusive".into(),
            Kind::Shared => "SHARED".into(),
            Kind::Limit(n) => format!("LIMIT {n}"),
        }
    }
}

/// A fence and the server (group) that issued it: fences of different cluster nodes may
/// be equal.
pub type Fence = (u32, u64);

#[derive(Default)]
struct Slot {
    /// Holders inside their critical section; highest fence accepted, of any / a writer.
    inside: Vec<(Fence, Mode)>,
    max_any: Fence,
    max_writer: Fence,
    value: u64,
    writes: u64,
}

/// The critical sections' store. Writers read, then write value + 1, refused after any
/// holder with a higher fence; readers are refused after a writer with a higher fence;
/// permits are counted. Entering beside holders the key's kind forbids is an overlap. It
/// compares fence values only, as a real store does (the server is for the checker).
pub struct Store {
    slots: Vec<Mutex<Slot>>,
    pub events: Mutex<Vec<StoreEvent>>,
}

impl Store {
    pub fn new(keys: usize) -> Store {
        Store {
            slots: (0..keys).map(|_| Mutex::new(Slot::default())).collect(),
            events: Mutex::new(Vec::new()),
        }
    }

    fn event(&self, key: u32, kind: StoreEventKind, earlier: Vec<Fence>, later: Fence) {
        let event = StoreEvent {
            key,
            kind,
            earlier,
            later,
        };
        if let Ok(mut e) = self.events.lock() {
            e.push(event);
        }
    }

    pub fn enter(&self, key: u32, mode: Mode, fence: Fence) -> u64 {
        let Ok(mut s) = self.slots[key as usize].lock() else {
            return 0;
        };
        let clashes = |h: &&(Fence, Mode)| match mode {
            Mode::Exclusive => true,
            Mode::Shared => h.1 != Mode::Shared,
            Mode::Permit(n) => s.inside.len() >= n as usize,
        };
        let clash: Vec<Fence> = s.inside.iter().filter(clashes).map(|h| h.0).collect();
        if !clash.is_empty() {
            self.event(key, StoreEventKind::Overlap, clash, fence);
        }
        s.inside.push((fence, mode));
        s.value
    }

    pub fn write(&self, key: u32, mode: Mode, fence: Fence, value: u64) {
        let Ok(mut s) = self.slots[key as usize].lock() else {
            return;
        };
        let bar = match mode {
            Mode::Exclusive => s.max_any,
            Mode::Shared => s.max_writer,
            Mode::Permit(_) => (0, 0),
        };
        if fence.1 < bar.1 {
            drop(s);
            self.event(key, StoreEventKind::StaleWrite, vec![bar], fence);
            return;
        }
        if fence.1 >= s.max_any.1 {
            s.max_any = fence;
        }
        if mode == Mode::Exclusive {
            s.max_writer = fence;
            s.value = value;
            s.writes += 1;
        }
    }

    pub fn exit(&self, key: u32, fence: Fence) {
        if let Ok(mut s) = self.slots[key as usize].lock() {
            s.inside.retain(|h| h.0 != fence);
        }
    }

    /// Writes lost per key (a writer read a value another writer then overwrote).
    pub fn lost_updates(&self) -> Vec<(u32, u64)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(k, s)| {
                let s = s.lock().ok()?;
                let lost = s.writes.saturating_sub(s.value);
                (lost > 0).then_some((k as u32, lost))
            })
            .collect()
    }
}

/// How the clients behave: percent of acquires that block (besides half of the short
/// leases); percent of holders that pause in their critical section, and for how long (ms;
/// `None`: they only yield); no TOKEN argument; how long a call may wait for its reply.
#[derive(Clone, Copy)]
pub struct Mix {
    pub blocking: u64,
    pub pause: (u64, Option<(u64, u64)>),
    pub server_tokens: bool,
    pub read_timeout: Duration,
}

impl Mix {
    /// Holders work a while, so keys are held (and waited for) when a fault comes.
    pub const FAULTS: Mix = Mix {
        blocking: 50,
        pause: (20, Some((1, 20))),
        server_tokens: false,
        read_timeout: READ_TIMEOUT,
    };
    /// As many grants as the server gives (the mutex run: a million).
    pub const FAST: Mix = Mix {
        blocking: 45,
        pause: (10, None),
        server_tokens: true,
        read_timeout: Duration::from_secs(5),
    };
}

/// One run of the workload: keys by checker index; clients run until `deadline`,
/// `stop_after` grants or a client error. `confirm`: every grant and extend confirmed with
/// `WAIT 1 100` (unconfirmed grants given back unused, extends unknown).
/// `group_per_node`: a checker server group per node (cluster). `late_end_ms`: how late
/// a lease may still be released or extended (counted, not a violation: where our pauses
/// hold expiries and reloads carry the time left, leases end late, never early).
/// `linear`: the history is also checked by the independent checker (linear.rs).
pub struct Plan {
    pub topo: Topo,
    pub keys: Vec<(String, Kind)>,
    pub clients: usize,
    pub deadline: Instant,
    pub stop_after: u64,
    pub mix: Mix,
    pub confirm: bool,
    pub group_per_node: bool,
    pub late_end_ms: u64,
    pub linear: bool,
}

impl Plan {
    /// [`Mix::FAULTS`], unconfirmed grants, one server group, leases up to 1 s late.
    pub fn new(topo: Topo, keys: Vec<(String, Kind)>, clients: usize, deadline: Instant) -> Plan {
        Plan {
            topo,
            keys,
            clients,
            deadline,
            stop_after: u64::MAX,
            mix: Mix::FAULTS,
            confirm: false,
            group_per_node: false,
            late_end_ms: 1000,
            linear: false,
        }
    }
}

pub struct Shared {
    pub plan: Plan,
    pub store: Store,
    pub stop: AtomicBool,
    pub kills: Arc<Kills>,
    granted: AtomicU64,
}

impl Shared {
    pub fn new(plan: Plan, kills: &Arc<Kills>) -> Arc<Shared> {
        Arc::new(Shared {
            store: Store::new(plan.keys.len()),
            plan,
            stop: AtomicBool::new(false),
            kills: Arc::clone(kills),
            granted: AtomicU64::new(0),
        })
    }
}

/// `exclusive` exclusive keys, then `shared` SHARED keys, then one LIMIT n key per entry
/// of `limits`, named `{prefix:i}`.
pub fn keys(prefix: &str, exclusive: usize, shared: usize, limits: &[u32]) -> Vec<(String, Kind)> {
    let kinds = std::iter::repeat_n(Kind::Exclusive, exclusive)
        .chain(std::iter::repeat_n(Kind::Shared, shared))
        .chain(limits.iter().map(|&n| Kind::Limit(n)));
    let named = |(i, k)| (format!("{{{prefix}:{i}}}"), k);
    kinds.enumerate().map(named).collect()
}

/// What a client recorded: its grants, every lock call (`history`), and counts (`calls`,
/// `releases`, `abandoned` leases left to run out, `lost_acquires` whose reply was lost
/// and never used, ...).
#[derive(Default)]
pub struct ClientLog {
    pub grants: Vec<Grant>,
    pub history: Vec<linear::Op>,
    pub n: Counts,
    pub errors: Vec<String>,
    pub link: LinkLog,
}

/// A grant as the client uses it: token, (checker server group, fence), the acquire's
/// invoke and complete.
type Got = Option<(Vec<u8>, Fence, u64, u64)>;

fn confirmed(r: &[Reply]) -> bool {
    r.get(1).and_then(Reply::as_int).unwrap_or(0) >= 1
}

/// An error reply to a command that answers 0 or 1 is a client error.
fn no_error(a: &Answer, what: &str) -> Result<(), String> {
    match a {
        Answer::Reply(r, ..) if r[0].is_error() => Err(format!("{what} answered {:?}", r[0])),
        _ => Ok(()),
    }
}

/// The times of a RELEASE or EXTEND and its reply for the history (`None`: lost).
fn int_reply(a: &Answer) -> ((u64, u64), Option<Ret>) {
    match a {
        Answer::Reply(r, t0, t1) => ((*t0, *t1), Some(Ret::Int(r[0].as_int() == Some(1)))),
        Answer::Lost(t0) => ((*t0, now_ns()), None),
    }
}

/// A call as the checker sees it: its outcome (`ok` of the replies) unknown when the
/// replies were lost.
fn as_call(a: Answer, ok: impl FnOnce(&[Reply]) -> Option<bool>) -> Call {
    match a {
        Answer::Reply(r, invoke, complete) => Call::new(invoke, complete, ok(&r)),
        Answer::Lost(invoke) => Call::new(invoke, now_ns(), None),
    }
}

struct Client<'a> {
    sh: &'a Shared,
    id: u32,
    link: Link,
    log: ClientLog,
}

impl Client<'_> {
    fn cmds(&self, cmd: Vec<Vec<u8>>) -> Vec<Vec<Vec<u8>>> {
        let mut v = vec![cmd];
        if self.sh.plan.confirm {
            v.push(args!["WAIT", 1u64, 100u64]);
        }
        v
    }

    fn call(&mut self, key: &str, cmds: &[Vec<Vec<u8>>], block: Option<u64>) -> Answer {
        self.log.n.bump("calls");
        self.link.call(key.as_bytes(), cmds, block, &self.sh.kills)
    }

    fn acquire(
        &mut self,
        k: usize,
        ttl: u64,
        block: Option<u64>,
        mode: Mode,
        n: u64,
    ) -> Result<Got, String> {
        let (name, kind) = self.sh.plan.keys[k].clone();
        let mut a = args!["LOCK.ACQUIRE", &name];
        match (kind, mode) {
            (_, Mode::Shared) => a.extend(args!["SHARED"]),
            (Kind::Limit(n), _) => a.extend(args!["LIMIT", n]),
            _ => {}
        }
        a.extend(args!["PX", ttl]);
        // The client's own token, unique to this client's `n`th acquire.
        let token =
            (!self.sh.plan.mix.server_tokens).then(|| format!("client-{:03}-{n:09}", self.id));
        if let Some(t) = &token {
            a.extend(args!["TOKEN", t]);
        }
        if let Some(b) = block {
            a.extend(args!["BLOCK", b]);
        }
        let cmds = self.cmds(a);
        let call = linear::Call::Acquire {
            mode,
            ttl_ms: ttl,
            token: token.map(|t| linear::token(t.as_bytes())),
        };
        let (r, t0, t1) = match self.call(&name, &cmds, block) {
            Answer::Reply(r, t0, t1) => (r, t0, t1),
            Answer::Lost(t0) => {
                self.record(k, call, (t0, now_ns()), None);
                self.log.n.bump("lost_acquires");
                return Ok(None);
            }
        };
        let ret = match &r[0] {
            Reply::Nil if block.is_some() => (Ret::Nil, "nil_blocking"),
            Reply::Nil => (Ret::Nil, "nil_nonblocking"),
            Reply::Error(e) if e.starts_with("MAXWAITERS") => (Ret::Refused, "maxwaiters"),
            Reply::Error(e) if e.starts_with("UNBLOCKED") => (Ret::Refused, "unblocked"),
            other => {
                let Some((token, fence)) = other.grant() else {
                    return Err(format!("unexpected acquire reply {other:?}"));
                };
                // The checker's server group of the reply.
                let group = self
                    .sh
                    .plan
                    .group_per_node
                    .then_some(self.link.last_node as u32);
                let group = group.unwrap_or(0);
                let ret = Ret::Granted {
                    token: linear::token(&token),
                    group,
                    fence,
                };
                self.record(k, call, (t0, t1), Some(ret));
                if self.sh.plan.confirm && !confirmed(&r) {
                    // Maybe not on the replica: do not use it, give it back.
                    self.log.n.bump("unconfirmed");
                    let rel = args!["LOCK.RELEASE", &name, &token];
                    let answer = self.call(&name, &[rel], None);
                    let (times, ret) = int_reply(&answer);
                    let call = linear::Call::Release {
                        token: linear::token(&token),
                    };
                    self.record(k, call, times, ret);
                    return Ok(None);
                }
                return Ok(Some((token, (group, fence), t0, t1)));
            }
        };
        self.record(k, call, (t0, t1), Some(ret.0));
        self.log.n.bump(ret.1);
        Ok(None)
    }

    /// Adds a call on key `k` to the history (`ret`: `None` when its reply was lost).
    fn record(&mut self, k: usize, call: linear::Call, times: (u64, u64), ret: Option<Ret>) {
        let (key, client) = (k as u32, self.id);
        let (invoke, complete) = times;
        self.log.history.push(linear::Op {
            key,
            client,
            call,
            invoke,
            complete,
            ret,
        });
    }

    /// Releases grant `idx` of the log and records how that went.
    fn release(&mut self, idx: usize, token: &[u8]) -> Result<(), String> {
        let k = self.log.grants[idx].key as usize;
        let name = self.sh.plan.keys[k].0.clone();
        let cmd = args!["LOCK.RELEASE", &name, token];
        self.log.n.bump("releases");
        let one = |r: &[Reply]| Some(r[0].as_int() == Some(1));
        let released = linear::Call::Release {
            token: linear::token(token),
        };
        let first = self.call(&name, std::slice::from_ref(&cmd), None);
        no_error(&first, "LOCK.RELEASE")?;
        let (times, ret) = int_reply(&first);
        self.record(k, released, times, ret);
        let call = match first {
            // Executed or not: ask again on a new connection; a 1 now is certain.
            Answer::Lost(t0) => {
                let again = self.call(&name, &[cmd], None);
                no_error(&again, "LOCK.RELEASE")?;
                let (times, ret) = int_reply(&again);
                self.record(k, released, times, ret);
                match as_call(again, one) {
                    c if c.ok == Some(true) => c,
                    _ => Call::new(t0, now_ns(), None),
                }
            }
            a => as_call(a, one),
        };
        self.log.grants[idx].release = Some(call);
        Ok(())
    }

    fn run(&mut self, rng: &mut Rng) -> Result<(), String> {
        let sh = self.sh;
        // Leases left to expire: (grant index, token, when the lease has surely ended).
        let mut abandoned: VecDeque<(usize, Vec<u8>, u64)> = VecDeque::new();
        let mut n = 0u64;
        while !sh.stop.load(Ordering::Relaxed) && Instant::now() < sh.plan.deadline {
            while abandoned.front().is_some_and(|a| a.2 <= now_ns()) {
                if let Some((idx, token, _)) = abandoned.pop_front() {
                    self.release(idx, &token)?;
                }
            }
            n += 1;
            let k = rng.below(sh.plan.keys.len() as u64) as usize;
            let kind = sh.plan.keys[k].1;
            let mode = match kind {
                Kind::Exclusive => Mode::Exclusive,
                Kind::Shared if rng.chance(70) => Mode::Shared,
                Kind::Shared => Mode::Exclusive,
                Kind::Limit(l) => Mode::Permit(l),
            };
            let dice = rng.below(100);
            let short = dice >= 88;
            let ttl = if short { rng.range(20, 100) } else { LONG_TTL };
            let block = match dice {
                d if d < sh.plan.mix.blocking => Some(rng.range(5, 300)),
                88..=99 if rng.chance(50) => Some(rng.range(5, 100)),
                _ => None,
            };
            let Some((token, at, t0, t1)) = self.acquire(k, ttl, block, mode, n)? else {
                continue;
            };
            if sh.granted.fetch_add(1, Ordering::Relaxed) + 1 >= sh.plan.stop_after {
                sh.stop.store(true, Ordering::Relaxed);
            }
            let mut g = Grant::new((self.id, k as u32), mode, at, ttl, (t0, t1));
            let cs0 = now_ns();
            let v = sh.store.enter(k as u32, mode, at);
            match sh.plan.mix.pause {
                (p, Some((lo, hi))) if rng.chance(p) => {
                    std::thread::sleep(Duration::from_millis(rng.range(lo, hi)))
                }
                (p, None) if rng.chance(p) => std::thread::yield_now(),
                _ => {}
            }
            let mut final_ttl = ttl;
            let mut last = t1;
            if rng.chance(15) {
                let ext = if short { rng.range(20, 100) } else { LONG_TTL };
                let name = sh.plan.keys[k].0.clone();
                let cmds = self.cmds(args!["LOCK.EXTEND", &name, &token, "PX", ext]);
                self.log.n.bump("extends");
                let answer = self.call(&name, &cmds, None);
                no_error(&answer, "LOCK.EXTEND")?;
                let (times, ret) = int_reply(&answer);
                let extended = linear::Call::Extend {
                    token: linear::token(&token),
                    ttl_ms: ext,
                };
                self.record(k, extended, times, ret);
                let call = as_call(answer, |r| {
                    let ok = r[0].as_int() == Some(1);
                    // Acknowledged but perhaps not replicated: unknown.
                    (!sh.plan.confirm || !ok || confirmed(r)).then_some(ok)
                });
                match call.ok {
                    Some(true) => (final_ttl, last) = (ext, call.complete),
                    None => (final_ttl, last) = (final_ttl.max(ext), call.complete),
                    Some(false) => {}
                }
                g.extends.push((call, ext));
            }
            sh.store.write(k as u32, mode, at, v + 1);
            sh.store.exit(k as u32, at);
            g.cs = Some((cs0, now_ns()));
            self.log.grants.push(g);
            let idx = self.log.grants.len() - 1;
            if short && rng.chance(10) {
                abandoned.push_back((idx, token, last + (final_ttl + 5) * 1_000_000));
                self.log.n.bump("abandoned");
            } else {
                self.release(idx, &token)?;
            }
        }
        // Settle what is left: wait out the leases, then check the release answers 0.
        while let Some((idx, token, due)) = abandoned.pop_front() {
            std::thread::sleep(Duration::from_nanos(due.saturating_sub(now_ns())));
            self.release(idx, &token)?;
        }
        Ok(())
    }
}

/// Starts the client threads (they stop at the target, the deadline, or a client error).
pub fn spawn(sh: &Arc<Shared>, rng: &mut Rng) -> Vec<std::thread::JoinHandle<ClientLog>> {
    (0..sh.plan.clients)
        .map(|i| {
            let sh = Arc::clone(sh);
            let mut r = rng.fork(i as u64);
            std::thread::spawn(move || {
                let link = Link::new(&sh.plan.topo, sh.plan.mix.read_timeout);
                let (sh, id, log) = (&sh, i as u32, ClientLog::default());
                let mut c = Client { sh, id, link, log };
                if let Err(e) = c.run(&mut r) {
                    c.log.errors.push(format!("client {i}: {e}"));
                    sh.stop.store(true, Ordering::Relaxed);
                }
                let Client { mut log, link, .. } = c;
                log.link = link.log;
                log
            })
        })
        .collect()
}

/// Everything the clients of one run saw, checked (the row's data): the checker's
/// report, with the clients' own counts, `grants` by mode (`exclusive` or writer, `shared`
/// readers, `permits`), `store_events` and `lost_updates` in `n`, and the violations of
/// the store, the links (late waiters, hangs) and lost updates not explained by a late
/// holder; the links' waiter and connection figures; the clients' errors; the
/// independent check's report (when the plan asks for it).
#[derive(Default, Serialize)]
pub struct Tally {
    #[serde(flatten)]
    pub report: checker::Report,
    pub link: LinkLog,
    pub errors: Vec<String>,
    pub linear: Option<linear::Report>,
}

impl std::ops::Deref for Tally {
    type Target = checker::Report;
    fn deref(&self) -> &checker::Report {
        &self.report
    }
}

impl std::ops::DerefMut for Tally {
    fn deref_mut(&mut self) -> &mut checker::Report {
        &mut self.report
    }
}

impl Tally {
    pub fn grants(&self) -> u64 {
        self.n.get("grants")
    }

    pub fn violations(&self) -> u64 {
        self.violations.total()
    }

    /// Adds another run's figures (a sub-run of the same server).
    pub fn absorb(&mut self, o: Tally) {
        self.n.add(&o.n);
        self.link.add(&o.link);
        self.report.violations.add(&o.violations);
        self.report.examples.extend(o.report.examples);
        self.max_late_end_ms = self.max_late_end_ms.max(o.report.max_late_end_ms);
        self.errors.extend(o.errors);
        match (&mut self.linear, o.linear) {
            (Some(l), Some(o)) => l.absorb(o),
            (l, o) => *l = l.take().or(o),
        }
    }

    /// The checker's violations that judge the lock's replies (not the store's, not the
    /// links'), with the per-key fence regressions: what the independent check judges.
    fn lock_violations(&self) -> u64 {
        let elsewhere = [
            "critical sections overlapped in the store",
            "store saw a write with a lower fence",
            "lost updates in the store",
            crate::link::LATE,
            crate::link::HANG,
            crate::link::BROKEN,
        ];
        let other: u64 = elsewhere.iter().map(|k| self.violations.get(k)).sum();
        self.violations() - other + self.n.get("key_fence_regressions")
    }
}

/// Joins the client threads.
pub fn join(handles: Vec<std::thread::JoinHandle<ClientLog>>) -> Result<Vec<ClientLog>, String> {
    joined(handles.into_iter().map(|h| h.join()))
}

/// Checks the clients' history (`fenced`: more fences to order-check).
pub fn check(
    sh: &Shared,
    logs: Vec<ClientLog>,
    fenced: &[checker::Fenced],
) -> Result<Tally, String> {
    let mut t = Tally::default();
    let (mut grants, mut history) = (Vec::new(), Vec::new());
    for l in logs {
        grants.extend(l.grants);
        history.extend(l.history);
        t.n.add(&l.n);
        t.errors.extend(l.errors);
        t.link.add(&l.link);
        for (kind, call) in l.link.bad {
            t.add(kind, || call);
        }
    }
    for g in &grants {
        t.n.bump(match g.mode {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Permit(_) => "permits",
        });
    }
    let (key_regressions, key_examples) = checker::key_fence_regressions(&grants);
    t.n.add_n("key_fence_regressions", key_regressions);
    let key_examples = key_examples
        .into_iter()
        .map(|e| format!("key fence regression: {e}"));
    t.report.examples.extend(key_examples);
    let events = std::mem::take(&mut *sh.store.events.lock().map_err(|e| e.to_string())?);
    let late_ns = sh.plan.late_end_ms * 1_000_000;
    checker::check_with(&mut t, &mut grants, fenced, &events, SLACK_NS, late_ns);
    // Lost updates, unless a late holder (client pause) explains them on that key.
    let excused: std::collections::BTreeSet<u32> = events.iter().map(|e| e.key).collect();
    let mut lost = sh.store.lost_updates();
    t.n.add_n("store_events", events.len() as u64);
    t.n.add_n("lost_updates", lost.iter().map(|l| l.1).sum());
    lost.retain(|(k, _)| !excused.contains(k));
    t.add_n(
        "lost updates in the store",
        lost.iter().map(|l| l.1).sum(),
        lost.iter().map(|(k, n)| format!("key {k}: {n}")),
    );
    if sh.plan.linear {
        let rules = linear::Rules {
            slack: SLACK_NS,
            late: late_ns,
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut r = linear::check(history, rules, threads);
        r.compare(t.lock_violations());
        t.linear = Some(r);
    }
    Ok(t)
}

/// The end of a fenced-workload scenario's row: what the checker found (the row's
/// `tally`, and the acquisitions asked for, `target`), and a failure on any violation, on
/// any client error, or (full runs) on fewer acquisitions than `target`.
pub fn verdict(o: &mut Outcome, env: &Env, t: &Tally, target: u64) {
    o.put("tally", t);
    o.put("target", target);
    o.put("violations", t.violations());
    o.fail_if(t.violations() > 0, format!("{} violations", t.violations()));
    if let Some(l) = &t.linear {
        let why = format!(
            "the independent check rejected {} histories",
            l.not_linearizable
        );
        o.fail_if(l.not_linearizable > 0, why);
    }
    if let Some(e) = t.errors.first() {
        o.fail(format!("{} client errors, first: {e}", t.errors.len()));
    }
    let (got, want) = (thousands(t.grants()), thousands(target));
    let few = format!("{got} acquisitions, below the {want} asked for");
    o.fail_if(t.grants() < target && !env.short, few);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(s: &Store) -> Vec<(StoreEventKind, Vec<Fence>, Fence)> {
        let e = s.events.lock().unwrap();
        e.iter()
            .map(|e| (e.kind, e.earlier.clone(), e.later))
            .collect()
    }

    #[test]
    fn the_store_knows_each_kind() {
        let s = Store::new(3);
        // Readers share; a writer beside a reader overlaps and, with a lower fence than
        // the reader's, is refused.
        s.enter(0, Mode::Shared, (0, 10));
        s.enter(0, Mode::Shared, (0, 11));
        s.write(0, Mode::Shared, (0, 11), 0);
        assert!(kinds(&s).is_empty());
        s.enter(0, Mode::Exclusive, (0, 9));
        s.write(0, Mode::Exclusive, (0, 9), 1);
        let ev = kinds(&s);
        assert_eq!(
            ev[0],
            (StoreEventKind::Overlap, vec![(0, 10), (0, 11)], (0, 9))
        );
        assert_eq!(ev[1], (StoreEventKind::StaleWrite, vec![(0, 11)], (0, 9)));
        // A reader older than the last writer is refused.
        s.exit(0, (0, 10));
        s.exit(0, (0, 11));
        s.exit(0, (0, 9));
        s.enter(0, Mode::Exclusive, (0, 20));
        s.write(0, Mode::Exclusive, (0, 20), 1);
        s.exit(0, (0, 20));
        s.write(0, Mode::Shared, (0, 12), 0);
        assert_eq!(kinds(&s).len(), 3);
        // LIMIT 2: the third holder inside overlaps; permits are not refused by fence.
        for f in [30, 31] {
            s.enter(1, Mode::Permit(2), (0, f));
        }
        s.write(1, Mode::Permit(2), (0, 29), 0);
        assert_eq!(kinds(&s).len(), 3);
        s.enter(1, Mode::Permit(2), (0, 32));
        assert_eq!(kinds(&s)[3].0, StoreEventKind::Overlap);
        // Lost updates: two writers read the same value.
        let v = s.enter(2, Mode::Exclusive, (0, 40));
        s.exit(2, (0, 40));
        s.write(2, Mode::Exclusive, (0, 40), v + 1);
        s.write(2, Mode::Exclusive, (0, 41), v + 1);
        assert_eq!(s.lost_updates(), vec![(2, 1)]);
    }
}
