//! The independent check (issue 30): every lock call the fenced workload made, as a
//! history per key, checked for linearizability by the `stateright` crate's
//! `LinearizabilityTester` (not our code) against [`LockSpec`], a sequential specification
//! of a leased, fenced lock written from docs/commands.md, not from checker.rs.
//!
//! The specification, per key: holders (token, shared or not, lease bounds) and the
//! highest fence issued. An acquire is granted only when the key has room for it (an
//! exclusive acquire: no holder; `SHARED`: no exclusive holder; `LIMIT n`: fewer than n),
//! with a fence above every fence of the key and every fence its server returned before
//! the history began, and the token it asked for; it answers nil only while the key has a
//! holder (no barging: waiters make a free-looking key busy only while a holder is about
//! to be served); MAXWAITERS and UNBLOCKED change nothing. RELEASE and EXTEND answer 1
//! exactly when the token holds. A lease may end (the holder leaves without a call) once
//! `ttl` has certainly passed since the earliest moment the grant or extend could have
//! taken effect (`invoke + ttl - slack`), and must have ended `late` after the latest one
//! (`complete + ttl + slack`): leases never end early and at most `late` late. Since a
//! step's time is only known to lie in `[invoke, complete]` (and after every step
//! linearized before it), those bounds are what the spec compares.
//!
//! A call whose reply was lost (connection killed) is left pending on a thread of its own
//! (the tester may place it anywhere after its invoke, or nowhere); the spec lets it take
//! effect or not, and rejects a place after a call invoked once the client had seen the
//! connection fail (the server cannot run a command of a closed connection later).
//!
//! Histories are cut where the key is idle (no call in flight) and certainly free (every
//! lease released, answered 0, ended by an exclusive grant asked after it, or past its
//! latest end), so each piece starts from a known state and stays short: the tester's
//! search is exponential in the worst case. Each piece gets a step budget; a piece that
//! exhausts it is counted as not decided.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use crate::checker::Mode;
use crate::common::example;

/// A token as a 64-bit hash of its bytes.
pub type Token = u64;

pub fn token(bytes: &[u8]) -> Token {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `token`: the client's own (`TOKEN`), or `None` for one the server makes.
    Acquire {
        mode: Mode,
        ttl_ms: u64,
        token: Option<Token>,
    },
    Release {
        token: Token,
    },
    Extend {
        token: Token,
        ttl_ms: u64,
    },
}

/// A reply. `Unknown` is never recorded: it is what the spec answers for a pending call
/// that it applied with every possible effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ret {
    Granted {
        token: Token,
        group: u32,
        fence: u64,
    },
    Nil,
    /// `MAXWAITERS`, `UNBLOCKED`: not acquired.
    Refused,
    /// RELEASE, EXTEND: 1 or 0.
    Int(bool),
    Unknown,
}

/// One call of the history: `ret` is `None` when the reply was lost, and `complete` is
/// then when the client saw the connection fail.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub key: u32,
    pub client: u32,
    pub call: Call,
    pub invoke: u64,
    pub complete: u64,
    pub ret: Option<Ret>,
}

/// How far leases may stray from their nominal end: `slack` each way (clock
/// granularity), and up to `late` later than that.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    pub slack: u64,
    pub late: u64,
}

const MS: u64 = 1_000_000;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Holder {
    token: Token,
    shared: bool,
    /// The lease may have ended from `lo` on, and has ended after `hi + late`.
    lo: u64,
    hi: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct State {
    holders: Vec<Holder>,
    /// Highest fence of the key, and per server group, known to be issued.
    fence: u64,
    groups: Vec<(u32, u64)>,
}

impl State {
    fn group_max(&self, g: u32) -> u64 {
        self.groups.iter().find(|x| x.0 == g).map_or(0, |x| x.1)
    }

    fn position(&self, t: Token) -> Option<usize> {
        self.holders.iter().position(|h| h.token == t)
    }

    /// Every way to make room for `mode` by ending leases that may have ended by `by`,
    /// ending no more than needed.
    fn rooms(&self, mode: Mode, by: u64) -> Vec<State> {
        let may_end = |h: &Holder| h.lo <= by;
        let must_go = |h: &Holder| match mode {
            Mode::Exclusive => true,
            Mode::Shared => !h.shared,
            Mode::Permit(_) => false,
        };
        if let Mode::Permit(n) = mode {
            let over = (self.holders.len() + 1).saturating_sub(n as usize);
            let ending: Vec<usize> = (0..self.holders.len())
                .filter(|&i| may_end(&self.holders[i]))
                .collect();
            return combinations(&ending, over)
                .into_iter()
                .map(|gone| {
                    let mut s = self.clone();
                    for &i in gone.iter().rev() {
                        s.holders.remove(i);
                    }
                    s
                })
                .collect();
        }
        if self.holders.iter().any(|h| must_go(h) && !may_end(h)) {
            return vec![];
        }
        let mut s = self.clone();
        s.holders.retain(|h| !must_go(h));
        vec![s]
    }
}

/// The `k`-element subsets of `items`.
fn combinations(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for (i, &first) in items.iter().enumerate() {
        for mut rest in combinations(&items[i + 1..], k - 1) {
            rest.insert(0, first);
            out.push(rest);
        }
    }
    out
}

/// A call as the spec sees it: `unnamed` names the grant of a pending acquire whose
/// token the server would have made.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    call: Call,
    invoke: u64,
    complete: u64,
    unnamed: Token,
}

/// The sequential specification (see the module's comment), nondeterministic where a
/// lease may or may not have ended or a pending call may or may not have taken effect:
/// it keeps every state the lock may be in.
#[derive(Debug, Clone)]
pub struct LockSpec {
    states: Vec<State>,
    /// No step linearized so far began later than this.
    clock: u64,
    rules: Rules,
    /// Steps left for the search; at 0 every step fails.
    budget: Rc<Cell<u64>>,
}

/// More states than this at once: the piece is not decided.
const MAX_STATES: usize = 64;

impl LockSpec {
    fn new(fence: u64, groups: Vec<(u32, u64)>, rules: Rules, budget: u64) -> LockSpec {
        let s = State {
            holders: vec![],
            fence,
            groups,
        };
        LockSpec {
            states: vec![s],
            clock: 0,
            rules,
            budget: Rc::new(Cell::new(budget)),
        }
    }

    /// Applies `step` with reply `ret` (`None`: pending, every effect); false when no
    /// state allows it.
    fn apply(&mut self, step: &Step, ret: Option<Ret>) -> bool {
        let left = self.budget.get();
        if left == 0 || self.states.is_empty() {
            self.states.clear();
            return false;
        }
        self.budget.set(left - 1);
        let now = self.clock.max(step.invoke);
        if now > step.complete {
            // Placed after a call that began once this one was over.
            self.states.clear();
            return false;
        }
        self.clock = now;
        let mut next: Vec<State> = Vec::new();
        for s in &self.states {
            let mut s = s.clone();
            s.holders.retain(|h| h.hi + self.rules.late >= now);
            next.extend(self.successors(s, step, ret));
        }
        next.sort();
        next.dedup();
        if next.len() > MAX_STATES {
            self.budget.set(0);
            next.clear();
        }
        self.states = next;
        !self.states.is_empty()
    }

    fn successors(&self, s: State, step: &Step, ret: Option<Ret>) -> Vec<State> {
        let (slack, end) = (self.rules.slack, step.complete);
        // The call's own invoke, not `now`: bounds that do not depend on the order the
        // search tries keep a wrong guess from poisoning the leases of later steps.
        let start = step.invoke;
        let lease = |ttl: u64| {
            (
                (start + ttl * MS).saturating_sub(slack),
                end + ttl * MS + slack,
            )
        };
        // Answered 0 by `t`: it holds nothing, or its lease may have ended.
        let zero = |mut s: State, t| match s.position(t) {
            None => vec![s],
            Some(i) if s.holders[i].lo <= end => {
                s.holders.remove(i);
                vec![s]
            }
            Some(_) => vec![],
        };
        match (step.call, ret) {
            (
                Call::Acquire {
                    mode,
                    ttl_ms,
                    token,
                },
                ret,
            ) => {
                let (lo, hi) = lease(ttl_ms);
                let holder = |t| Holder {
                    token: t,
                    shared: mode == Mode::Shared,
                    lo,
                    hi,
                };
                match ret {
                    Some(Ret::Granted {
                        token: t,
                        group,
                        fence,
                    }) => {
                        let asked = token.is_none_or(|x| x == t);
                        if !asked || fence <= s.fence || fence <= s.group_max(group) {
                            return vec![];
                        }
                        let mut out = s.rooms(mode, end);
                        for r in &mut out {
                            r.holders.push(holder(t));
                            r.fence = fence;
                            r.groups.retain(|x| x.0 != group);
                            r.groups.push((group, fence));
                            r.groups.sort();
                        }
                        out
                    }
                    Some(Ret::Nil) if !s.holders.is_empty() => vec![s],
                    Some(Ret::Refused) => vec![s],
                    // Granted with a fence we never see (above all so far), or no effect.
                    None => {
                        let mut out = s.rooms(mode, end);
                        for r in &mut out {
                            r.holders.push(holder(token.unwrap_or(step.unnamed)));
                            r.fence += 1;
                        }
                        out.push(s);
                        out
                    }
                    _ => vec![],
                }
            }
            (Call::Release { token: t }, Some(Ret::Int(true))) => match s.position(t) {
                Some(i) => {
                    let mut s = s;
                    s.holders.remove(i);
                    vec![s]
                }
                None => vec![],
            },
            (Call::Extend { token: t, ttl_ms }, Some(Ret::Int(true))) => match s.position(t) {
                Some(i) => {
                    let mut s = s;
                    (s.holders[i].lo, s.holders[i].hi) = lease(ttl_ms);
                    vec![s]
                }
                None => vec![],
            },
            (Call::Release { token: t } | Call::Extend { token: t, .. }, Some(Ret::Int(false))) => {
                zero(s, t)
            }
            (Call::Release { token: t }, None) => {
                let mut out = vec![s.clone()];
                out.extend(s.position(t).map(|i| {
                    let mut s = s;
                    s.holders.remove(i);
                    s
                }));
                out
            }
            (Call::Extend { token: t, ttl_ms }, None) => {
                let mut out = vec![s.clone()];
                out.extend(s.position(t).map(|i| {
                    let mut s = s;
                    (s.holders[i].lo, s.holders[i].hi) = lease(ttl_ms);
                    s
                }));
                out
            }
            _ => vec![],
        }
    }
}

impl SequentialSpec for LockSpec {
    type Op = Step;
    type Ret = Ret;

    /// A pending call: every effect it may have had (the tester never compares this).
    fn invoke(&mut self, step: &Step) -> Ret {
        self.apply(step, None);
        Ret::Unknown
    }

    fn is_valid_step(&mut self, step: &Step, ret: &Ret) -> bool {
        self.apply(step, Some(*ret))
    }
}

/// A piece of one key's history that starts from a free key: the highest fence of the
/// key before it, and of each server group before it (all keys).
#[derive(Debug)]
pub struct Piece {
    pub key: u32,
    pub ops: Vec<Op>,
    pub fence: u64,
    pub groups: Vec<(u32, u64)>,
}

/// What may still hold a key, for cutting: a lease and its latest end (`hi + late`).
struct Open {
    token: Token,
    mode: Mode,
    granted: u64,
    end: u64,
}

/// Cuts each key's history where the key is idle and certainly free (see the module's
/// comment).
pub fn pieces(mut ops: Vec<Op>, rules: Rules) -> Vec<Piece> {
    // Per group: fences by completion, with the running maximum.
    let mut by_group: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for op in &ops {
        if let Some(Ret::Granted { group, fence, .. }) = op.ret {
            by_group
                .entry(group)
                .or_default()
                .push((op.complete, fence));
        }
    }
    for v in by_group.values_mut() {
        v.sort();
        let mut max = 0;
        v.iter_mut()
            .for_each(|x| (max, x.1) = (max.max(x.1), max.max(x.1)));
    }
    let before = |t: u64| -> Vec<(u32, u64)> {
        let max = |v: &Vec<(u64, u64)>| {
            v.partition_point(|x| x.0 < t)
                .checked_sub(1)
                .map(|i| v[i].1)
        };
        by_group
            .iter()
            .filter_map(|(g, v)| Some((*g, max(v)?)))
            .collect()
    };
    ops.sort_by_key(|o| (o.key, o.invoke));
    let mut out: Vec<Piece> = Vec::new();
    let mut unnamed = u64::MAX;
    let (mut key, mut busy, mut fence) = (u32::MAX, 0u64, 0u64);
    let mut open: Vec<Open> = Vec::new();
    for op in ops {
        let latest = |ttl: u64| op.complete + ttl * MS + rules.slack + rules.late;
        let first = op.key != key;
        if first {
            (key, busy, fence) = (op.key, 0, 0);
            open.clear();
        }
        open.retain(|l| l.end >= op.invoke);
        if first || (op.invoke > busy && open.is_empty()) {
            let groups = before(op.invoke);
            let ops = vec![];
            out.push(Piece {
                key,
                ops,
                fence,
                groups,
            });
        }
        busy = busy.max(op.complete);
        match (op.call, op.ret) {
            (
                Call::Acquire {
                    mode,
                    ttl_ms,
                    token,
                },
                ret,
            ) => {
                let t = match ret {
                    Some(Ret::Granted {
                        token, fence: f, ..
                    }) => {
                        fence = fence.max(f);
                        // It ends every lease its mode excludes granted before it was
                        // asked for.
                        let excludes = |l: &Open| match mode {
                            Mode::Exclusive => true,
                            Mode::Shared => l.mode != Mode::Shared,
                            Mode::Permit(_) => false,
                        };
                        open.retain(|l| l.granted >= op.invoke || !excludes(l));
                        Some(token)
                    }
                    None => Some(token.unwrap_or_else(|| (unnamed -= 1, unnamed).1)),
                    _ => None,
                };
                if let Some(token) = t {
                    let (granted, end) = (op.complete, latest(ttl_ms));
                    open.push(Open {
                        token,
                        mode,
                        granted,
                        end,
                    });
                }
            }
            (Call::Release { token } | Call::Extend { token, .. }, Some(Ret::Int(false)))
            | (Call::Release { token }, Some(Ret::Int(true))) => open.retain(|l| l.token != token),
            (Call::Extend { token, ttl_ms }, ret) => {
                for l in open.iter_mut().filter(|l| l.token == token) {
                    // Extended (or perhaps, when the reply was lost).
                    l.end = match ret {
                        None => l.end.max(latest(ttl_ms)),
                        _ => latest(ttl_ms),
                    };
                }
            }
            _ => {}
        }
        if let Some(p) = out.last_mut() {
            p.ops.push(op);
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    NotLinearizable,
    /// The search ran out of its step budget.
    Undecided,
}

/// Longer pieces are not searched (counted as undecided): each step of the tester
/// copies what is left of the piece with each call's predecessors, so a search costs at
/// least the cube of its length.
pub const MAX_CALLS: usize = 500;

/// Steps the search of a piece of `n` calls may take: fewer for long pieces, whose
/// steps cost more (a step copies about n²/4 entries: at most 5e7 copies, some seconds,
/// but always room for three passes).
fn budget(n: usize) -> u64 {
    let n = n.max(1) as u64;
    (200_000 + 200 * n).min(200_000_000 / (n * n)).max(3 * n)
}

/// The stateright verdict on one piece.
pub fn check_piece(p: &Piece, rules: Rules) -> Verdict {
    if p.ops.len() > MAX_CALLS {
        return Verdict::Undecided;
    }
    let spec = LockSpec::new(p.fence, p.groups.clone(), rules, budget(p.ops.len()));
    let steps = Rc::clone(&spec.budget);
    let mut t = LinearizabilityTester::new(spec);
    // Invokes and returns in time order (an invoke first at a tie: concurrent).
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, op) in p.ops.iter().enumerate() {
        events.push((op.invoke, false, i));
        if op.ret.is_some() {
            events.push((op.complete, true, i));
        }
    }
    events.sort();
    // Each call is a thread of its own (real-time order is kept: the tester orders a
    // call after every call that returned before it was invoked). The tester tries
    // threads in id order at every step, so the numbering is its search order (never its
    // verdict): acquires by their reply (grants come back in the server's order),
    // releases and extends by their invoke (placed early, they hand the key on before a
    // grant that would otherwise have to guess that a short lease ran out).
    let mut order: Vec<usize> = (0..p.ops.len()).collect();
    let rank = |o: &Op| match o.call {
        Call::Acquire { .. } => o.complete,
        _ => o.invoke,
    };
    order.sort_by_key(|&i| (rank(&p.ops[i]), i));
    let mut thread = vec![0u32; p.ops.len()];
    for (rank, &i) in order.iter().enumerate() {
        thread[i] = rank as u32;
    }
    for (_, is_return, i) in events {
        let op = &p.ops[i];
        let thread = thread[i];
        let recorded = match (is_return, op.ret) {
            (true, Some(ret)) => t.on_return(thread, ret).map(drop),
            _ => {
                let unnamed = u64::MAX - i as u64;
                let (call, invoke, complete) = (op.call, op.invoke, op.complete);
                let step = Step {
                    call,
                    invoke,
                    complete,
                    unnamed,
                };
                t.on_invoke(thread, step).map(drop)
            }
        };
        if recorded.is_err() {
            // A client with two calls at once: a recording fault, reported as one.
            return Verdict::NotLinearizable;
        }
    }
    match t.serialized_history() {
        Some(_) => Verdict::Linearizable,
        None if steps.get() == 0 => Verdict::Undecided,
        None => Verdict::NotLinearizable,
    }
}

/// What the independent check found, and how that compares with the checker's verdict
/// on the same runs (checker.rs: `runs`, its `checker_violations` of the lock's replies,
/// and every run where one of the two found a fault and the other did not).
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub runs: u64,
    pub checker_violations: u64,
    pub disagreements: Vec<String>,
    pub histories: u64,
    pub ops: u64,
    /// Calls whose reply was lost (left pending).
    pub pending: u64,
    pub longest: u64,
    pub not_linearizable: u64,
    pub undecided: u64,
    pub secs: f64,
    /// The first histories rejected (or undecided), written out.
    pub examples: Vec<String>,
}

impl Report {
    /// Sets the checker's verdict on the run this report checked.
    pub fn compare(&mut self, checker_violations: u64) {
        self.runs = 1;
        self.checker_violations = checker_violations;
        let (theirs, ours) = (checker_violations, self.not_linearizable);
        if (theirs > 0) != (ours > 0) {
            let d = format!("the checker found {theirs} violations, the independent check rejected {ours} histories");
            self.disagreements.push(d);
        }
    }

    pub fn absorb(&mut self, o: Report) {
        self.runs += o.runs;
        self.checker_violations += o.checker_violations;
        self.disagreements.extend(o.disagreements);
        self.histories += o.histories;
        self.ops += o.ops;
        self.pending += o.pending;
        self.longest = self.longest.max(o.longest);
        self.not_linearizable += o.not_linearizable;
        self.undecided += o.undecided;
        self.secs += o.secs;
        for e in o.examples {
            example(&mut self.examples, 4, || e);
        }
    }
}

/// One piece written out (at most 60 calls), times in ms from its first call.
fn show(p: &Piece, v: Verdict) -> String {
    let t0 = p.ops.first().map_or(0, |o| o.invoke);
    let ms = |t: u64| (t - t0) as f64 / MS as f64;
    let mut s = format!(
        "{v:?}: key {}, {} calls, fence before {}, groups {:?}:",
        p.key,
        p.ops.len(),
        p.fence,
        p.groups
    );
    for o in p.ops.iter().take(60) {
        let ret = o.ret.map_or("lost".into(), |r| format!("{r:?}"));
        let (a, b) = (ms(o.invoke), ms(o.complete));
        s += &format!("\n  c{} {a:.3}..{b:.3} {:?} -> {ret}", o.client, o.call);
    }
    s
}

/// Checks every piece of `ops` on `threads` threads.
pub fn check(ops: Vec<Op>, rules: Rules, threads: usize) -> Report {
    let t = std::time::Instant::now();
    let pieces = pieces(ops, rules);
    let mut r = Report {
        histories: pieces.len() as u64,
        ops: pieces.iter().map(|p| p.ops.len() as u64).sum(),
        pending: pieces
            .iter()
            .flat_map(|p| &p.ops)
            .filter(|o| o.ret.is_none())
            .count() as u64,
        longest: pieces.iter().map(|p| p.ops.len() as u64).max().unwrap_or(0),
        ..Report::default()
    };
    let next = AtomicUsize::new(0);
    let verdicts: Mutex<Vec<Option<Verdict>>> = Mutex::new(vec![None; pieces.len()]);
    std::thread::scope(|s| {
        let worker = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(p) = pieces.get(i) else { break };
            let v = check_piece(p, rules);
            if let Ok(mut all) = verdicts.lock() {
                all[i] = Some(v);
            }
        };
        for _ in 0..threads.max(1) {
            // The tester recurses once per call of a piece.
            let big = std::thread::Builder::new().stack_size(512 << 20);
            let _ = big.spawn_scoped(s, worker);
        }
    });
    // A piece no thread could check is not decided.
    let verdicts = verdicts.into_inner().unwrap_or_default();
    for (i, p) in pieces.iter().enumerate() {
        let v = verdicts
            .get(i)
            .copied()
            .flatten()
            .unwrap_or(Verdict::Undecided);
        match v {
            Verdict::Linearizable => continue,
            Verdict::NotLinearizable => r.not_linearizable += 1,
            Verdict::Undecided => r.undecided += 1,
        }
        example(&mut r.examples, 4, || show(p, v));
    }
    r.secs = t.elapsed().as_secs_f64();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Rules = Rules { slack: 0, late: 0 };
    const EXCLUSIVE: Mode = Mode::Exclusive;

    fn acquire(mode: Mode, ttl_ms: u64) -> Call {
        let token = None;
        Call::Acquire {
            mode,
            ttl_ms,
            token,
        }
    }

    fn granted(token: Token, fence: u64) -> Option<Ret> {
        let group = 0;
        Some(Ret::Granted {
            token,
            group,
            fence,
        })
    }

    /// Client `client`'s call on key 0 from `ms.0` to `ms.1` ms.
    fn op(client: u32, call: Call, ms: (u64, u64), ret: Option<Ret>) -> Op {
        let (invoke, complete) = (ms.0 * MS, ms.1 * MS);
        let key = 0;
        Op {
            key,
            client,
            call,
            invoke,
            complete,
            ret,
        }
    }

    fn release(client: u32, token: Token, ms: (u64, u64), ok: Option<bool>) -> Op {
        op(client, Call::Release { token }, ms, ok.map(Ret::Int))
    }

    /// (histories, rejected, undecided).
    fn verdict(ops: &[Op]) -> (u64, u64, u64) {
        let r = check(ops.to_vec(), RULES, 1);
        (r.histories, r.not_linearizable, r.undecided)
    }

    fn rejected(ops: &[Op]) -> bool {
        let (_, bad, undecided) = verdict(ops);
        assert_eq!(undecided, 0);
        bad > 0
    }

    /// Two clients take turns on a key; c1 waits (BLOCK) while c0 holds, and is granted
    /// as c0's release runs; c2's non-blocking acquire finds it busy; extends, and a
    /// release after the lease ended that answers 0. Three pieces: the key is idle and
    /// free at 40 and 42 ms.
    fn valid() -> Vec<Op> {
        vec![
            op(0, acquire(EXCLUSIVE, 1000), (0, 2), granted(1, 10)),
            op(1, acquire(EXCLUSIVE, 1000), (1, 9), granted(2, 11)),
            op(2, acquire(EXCLUSIVE, 1000), (3, 4), Some(Ret::Nil)),
            op(
                0,
                Call::Extend {
                    token: 1,
                    ttl_ms: 50,
                },
                (4, 5),
                Some(Ret::Int(true)),
            ),
            release(0, 1, (6, 8), Some(true)),
            op(
                1,
                Call::Extend {
                    token: 2,
                    ttl_ms: 20,
                },
                (10, 11),
                Some(Ret::Int(true)),
            ),
            release(1, 2, (40, 41), Some(false)),
            op(2, acquire(EXCLUSIVE, 1000), (42, 43), granted(3, 12)),
            release(2, 3, (44, 45), Some(true)),
        ]
    }

    #[test]
    fn a_correct_concurrent_history_is_accepted() {
        assert_eq!(verdict(&valid()), (3, 0, 0));
    }

    #[test]
    fn a_double_grant_is_rejected() {
        let mut h = valid();
        // c2 granted while c0 holds (its extend at 4 ms proves it).
        h[2].ret = granted(4, 20);
        assert!(rejected(&h));
        // A 50 ms lease may have ended after 50 ms, and must have ended after 51 ms.
        let first = op(0, acquire(EXCLUSIVE, 50), (0, 1), granted(1, 10));
        let second = |ms| op(1, acquire(EXCLUSIVE, 1000), ms, granted(2, 11));
        assert!(!rejected(&[first, second((50, 51))]));
        assert!(rejected(&[first, second((30, 31))]));
        let late = |ok| release(0, 1, (60, 61), Some(ok));
        assert!(!rejected(&[first, late(false)]));
        assert!(
            rejected(&[first, late(true)]),
            "released after its lease ended"
        );
    }

    #[test]
    fn a_fence_that_goes_back_is_rejected() {
        let mut h = valid();
        h[7].ret = granted(3, 11);
        assert!(rejected(&h), "equal to an earlier fence");
        h[7].ret = granted(3, 9);
        assert!(rejected(&h), "below an earlier fence");
        // Below a fence of another key of the same server returned before it was asked.
        let mut other = op(5, acquire(EXCLUSIVE, 1000), (0, 1), granted(9, 30));
        other.key = 1;
        let mut h = valid();
        h.push(other);
        assert!(rejected(&h));
        // Another server's fences are its own.
        if let Some(Ret::Granted { group, .. }) = &mut h.last_mut().unwrap().ret {
            *group = 1;
        }
        assert!(!rejected(&h));
    }

    #[test]
    fn a_release_by_a_non_holder_that_succeeds_is_rejected() {
        let mut h = valid();
        h.push(release(2, 99, (50, 51), Some(true)));
        assert!(rejected(&h), "a token never granted");
        let mut h = valid();
        h.push(release(0, 1, (50, 51), Some(true)));
        assert!(rejected(&h), "a token already released");
        let mut h = valid();
        let extend = Call::Extend {
            token: 1,
            ttl_ms: 1000,
        };
        h.push(op(0, extend, (50, 51), Some(Ret::Int(true))));
        assert!(rejected(&h), "an extend by a token that no longer holds");
        let mut h = valid();
        h[4].ret = Some(Ret::Int(false));
        assert!(rejected(&h), "the holder refused while its lease is live");
    }

    #[test]
    fn nil_needs_a_holder_unless_a_lost_acquire_may_hold() {
        let busy = op(1, acquire(EXCLUSIVE, 1000), (10, 11), Some(Ret::Nil));
        assert!(rejected(&[busy]), "nil on a free key");
        // A lost acquire (killed connection, seen at 5 ms) may have been granted.
        let lost = op(0, acquire(EXCLUSIVE, 1000), (0, 5), None);
        assert!(!rejected(&[lost, busy]));
        // ... but not one whose lease had certainly ended by then.
        let lost = op(0, acquire(EXCLUSIVE, 2), (0, 5), None);
        assert!(rejected(&[lost, busy]));
    }

    #[test]
    fn a_lost_call_takes_effect_before_the_client_saw_it_fail_or_never() {
        // c0's release is lost between 10 and 12 ms: at 20 ms c1 finds the key busy, at
        // 30 ms c2 is granted. The release cannot have run after 12 ms.
        let h = [
            op(0, acquire(EXCLUSIVE, 1000), (0, 1), granted(1, 10)),
            release(0, 1, (10, 12), None),
            op(1, acquire(EXCLUSIVE, 1000), (20, 21), Some(Ret::Nil)),
            op(2, acquire(EXCLUSIVE, 1000), (30, 31), granted(2, 11)),
        ];
        assert!(rejected(&h));
        assert!(!rejected(&[h[0], h[1], h[3]]), "released");
        assert!(!rejected(&[h[0], h[1], h[2]]), "not released");
    }

    #[test]
    fn shared_and_counted_keys() {
        let read = acquire(Mode::Shared, 1000);
        let mut h = vec![
            op(0, read, (0, 1), granted(1, 10)),
            op(1, read, (2, 3), granted(2, 11)),
            op(2, acquire(EXCLUSIVE, 1000), (4, 5), Some(Ret::Nil)),
            release(0, 1, (6, 7), Some(true)),
            release(1, 2, (8, 9), Some(true)),
        ];
        assert!(!rejected(&h));
        h[2].ret = granted(3, 12);
        assert!(rejected(&h), "a writer beside readers");
        let permit = acquire(Mode::Permit(2), 1000);
        let mut h = vec![
            op(0, permit, (0, 1), granted(1, 10)),
            op(1, permit, (2, 3), granted(2, 11)),
            op(2, permit, (4, 5), Some(Ret::Nil)),
        ];
        assert!(!rejected(&h));
        h[2].ret = granted(3, 12);
        assert!(rejected(&h), "three holders of LIMIT 2");
    }

    #[test]
    fn histories_are_cut_where_the_key_is_idle_and_free() {
        let mut h = valid();
        // A second round 1 s later: a piece of its own.
        let later: Vec<Op> = valid()
            .into_iter()
            .map(|mut o| {
                (o.invoke, o.complete) = (o.invoke + 1000 * MS, o.complete + 1000 * MS);
                if let Some(Ret::Granted { fence, .. }) = &mut o.ret {
                    *fence += 100;
                }
                o
            })
            .collect();
        h.extend(later.clone());
        assert_eq!(verdict(&h), (6, 0, 0));
        // Fences still may not go back across the cut.
        let mut h = valid();
        h.extend(later);
        if let Some(Ret::Granted { fence, .. }) = &mut h[9].ret {
            *fence = 12;
        }
        assert_eq!(verdict(&h), (6, 1, 0));
        // A lease left to run out keeps the history whole until it may have ended.
        let mut h = valid();
        h.truncate(8);
        h.push(op(
            2,
            acquire(EXCLUSIVE, 1000),
            (1000, 1001),
            Some(Ret::Nil),
        ));
        assert_eq!(verdict(&h), (3, 0, 0));
    }
}
