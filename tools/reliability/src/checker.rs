//! The fenced-lock model checker (Jepsen's Hazelcast lock model, with leases) for all
//! three kinds of key: a grant is valid only if the holders certainly live at that moment
//! leave room for it, and its fence exceeds every fence granted before it on that server.
//!
//! Times are ns on one monotonic clock, taken by the clients around each call (`invoke`
//! .. `complete`); the server acts somewhere inside, so only what is certain is reported:
//! a lease is certainly live from its grant until `L` = the release's invoke (a release
//! that succeeded) or else `invoke + ttl` of the acquire / last successful extend, and has
//! certainly ended by `U` = `complete + ttl` of those, or the completion of a
//! release/extend that found it gone. A lost reply only widens the bounds; both get
//! `slack` (ms truncation of the server's clock, wall vs monotonic clock).
//!
//! A replica pair is one server group (its fences continue across failover), each cluster
//! node its own: fences and fence order are compared within a group; holders across
//! groups by their certainly-live intervals.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::{example, words, Counts};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub invoke: u64,
    pub complete: u64,
    /// 1 / true reply; `None`: the reply was lost, the outcome is unknown.
    pub ok: Option<bool>,
}

impl Call {
    pub fn new(invoke: u64, complete: u64, ok: Option<bool>) -> Call {
        Call {
            invoke,
            complete,
            ok,
        }
    }
}

/// How a grant holds its key: alone (an exclusive lock, or a SHARED key's writer), as a
/// SHARED key's reader, or as one of the permits of a LIMIT n key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Shared,
    Permit(u32),
}

#[derive(Debug, Clone)]
pub struct Grant {
    pub client: u32,
    pub key: u32,
    pub mode: Mode,
    /// The server (group) that issued the fence.
    pub server: u32,
    pub fence: u64,
    pub ttl_ms: u64,
    pub invoke: u64,
    pub complete: u64,
    /// Extends in order, with the TTL each one asked for.
    pub extends: Vec<(Call, u64)>,
    pub release: Option<Call>,
    /// The critical section (store read .. store write), if one ran.
    pub cs: Option<(u64, u64)>,
}

impl Grant {
    /// A grant as its acquire (`call`: invoke, complete) returned it.
    pub fn new(
        who: (u32, u32),
        mode: Mode,
        at: (u32, u64),
        ttl_ms: u64,
        call: (u64, u64),
    ) -> Grant {
        Grant {
            client: who.0,
            key: who.1,
            mode,
            server: at.0,
            fence: at.1,
            ttl_ms,
            invoke: call.0,
            complete: call.1,
            extends: Vec::new(),
            release: None,
            cs: None,
        }
    }
}

/// A fence seen outside the checked keys (only its order is checked).
#[derive(Debug, Clone, Copy)]
pub struct Fenced {
    pub server: u32,
    pub fence: u64,
    pub invoke: u64,
    pub complete: u64,
}

impl Fenced {
    pub fn new(server: u32, fence: u64, invoke: u64, complete: u64) -> Fenced {
        Fenced {
            server,
            fence,
            invoke,
            complete,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreEventKind {
    Overlap,
    StaleWrite,
}

/// What the store saw: a critical section begun beside holders it may not run with, or a
/// write with a lower fence than one already accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreEvent {
    pub key: u32,
    pub kind: StoreEventKind,
    /// The (server, fence) of the holders inside (or accepted) first.
    pub earlier: Vec<(u32, u64)>,
    pub later: (u32, u64),
}

/// What a history showed. `n` counts `grants`; `late_cs`, critical sections that ran past
/// their certain lease (client pauses, not lock faults), and the `late_store_events` they
/// cause; `cross_server_refusals`, stale writes refused because the key's earlier holder
/// had a higher fence from another server (the node that held the slot before);
/// `late_ends`, releases and extends that succeeded after the lease's latest possible end
/// within the allowance. Examples (`kind: what`): 3 per kind, 12 in all.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub n: Counts,
    pub violations: Counts,
    pub examples: Vec<String>,
    /// The latest late end, ms past the lease's latest possible end.
    pub max_late_end_ms: u64,
}

impl Report {
    pub fn add(&mut self, kind: &'static str, e: impl FnOnce() -> String) {
        if self.violations.get(kind) < 3 {
            example(&mut self.examples, 12, || format!("{kind}: {}", e()));
        }
        self.violations.bump(kind);
    }

    /// `n` violations of `kind` at once, with examples `ex`.
    pub fn add_n(&mut self, kind: &'static str, n: u64, ex: impl IntoIterator<Item = String>) {
        if n > 0 {
            let shown = self.violations.get(kind) as usize;
            for e in ex.into_iter().take(3usize.saturating_sub(shown)) {
                example(&mut self.examples, 12, || format!("{kind}: {e}"));
            }
            self.violations.add_n(kind, n);
        }
    }
}

const MS: u64 = 1_000_000;

struct Bounds {
    /// Certainly live until.
    live_until: u64,
    /// Lease alone (ignoring a release): for late critical sections.
    lease_until: u64,
}

/// A success `at` after the lease's latest possible end `upper`: within `late` a late
/// end (counted), else a violation `what`.
fn late_success(
    r: &mut Report,
    at: u64,
    upper: u64,
    late: u64,
    what: &'static str,
    who: impl FnOnce() -> String,
) {
    if at <= upper {
        return;
    }
    if at - upper <= late {
        r.n.bump("late_ends");
        r.max_late_end_ms = r.max_late_end_ms.max((at - upper) / MS);
        return;
    }
    let past = (at - upper) / MS;
    r.add(what, || {
        format!("{}: at +{past} ms past the latest possible end", who())
    });
}

fn check_grant(g: &Grant, slack: u64, late: u64, r: &mut Report) -> Bounds {
    let mut lower = (g.invoke + g.ttl_ms * MS).saturating_sub(slack);
    let mut upper = g.complete + g.ttl_ms * MS + slack;
    let who = || format!("key {} fence {} client {}", g.key, g.fence, g.client);
    for (e, ttl) in &g.extends {
        let lo = (e.invoke + ttl * MS).saturating_sub(slack);
        let up = e.complete + ttl * MS + slack;
        match e.ok {
            Some(true) => {
                let what = "extend succeeded after the lease had ended";
                late_success(r, e.invoke, upper, late, what, who);
                (lower, upper) = (lo, up);
            }
            Some(false) => {
                if e.complete < lower {
                    r.add("extend refused while the lease was live", who);
                }
                (lower, upper) = (lower.min(e.invoke), upper.min(e.complete));
            }
            // Applied or not: the lease ends at either deadline.
            None => (lower, upper) = (lower.min(lo), upper.max(up)),
        }
    }
    let lease_until = lower;
    let live_until = match g.release {
        Some(rel) if rel.ok == Some(true) => {
            let what = "release succeeded after the lease had ended";
            late_success(r, rel.invoke, upper, late, what, who);
            rel.invoke.max(g.complete)
        }
        Some(rel) => {
            if rel.ok == Some(false) && rel.complete < lower {
                r.add("release refused while the lease was live", who);
            }
            lower.min(rel.invoke)
        }
        None => lower,
    };
    if g.cs.is_some_and(|(_, end)| end > lease_until) {
        r.n.bump("late_cs");
    }
    Bounds {
        live_until,
        lease_until,
    }
}

/// The violation a grant of `mode` makes beside `readers` / `others` (exclusive holders
/// or permits) certainly live at that moment, if any.
fn crowded(mode: Mode, readers: usize, others: usize) -> Option<&'static str> {
    match mode {
        Mode::Exclusive if readers + others > 0 => {
            Some("granted while another holder's lease was live")
        }
        Mode::Shared if others > 0 => Some("reader granted beside a live writer"),
        Mode::Permit(n) if others >= n as usize => Some("more than LIMIT holders at once"),
        _ => None,
    }
}

/// One grant for an example: who, when (ms on the clients' clock), until when.
fn describe(g: &Grant, b: &Bounds) -> String {
    let ms = |t: u64| t / MS;
    format!(
        "fence {} ({:?}, server {}, client {}) granted {}..{} ms, ttl {} ms, extends {:?}, release {:?}, certainly live until {} ms, lease until {} ms, critical section {:?} ms",
        g.fence,
        g.mode,
        g.server,
        g.client,
        ms(g.invoke),
        ms(g.complete),
        g.ttl_ms,
        g.extends.iter().map(|(c, t)| (ms(c.invoke), ms(c.complete), c.ok, *t)).collect::<Vec<_>>(),
        g.release.map(|c| (ms(c.invoke), ms(c.complete), c.ok)),
        ms(b.live_until),
        ms(b.lease_until),
        g.cs.map(|(a, z)| (ms(a), ms(z)))
    )
}

/// Checks a history into `r`. `grants` is reordered (by server, then fence); `fenced` are further
/// fences whose order is checked with the grants'. A release or extend may succeed up to
/// `late_ns` after the lease's latest possible end (counted in `late_ends`, not a
/// violation): leases that end late, never early, because a pause of ours held the
/// expiry or a reload carried the time left (docs/commands.md, "Leases and time").
pub fn check_with(
    r: &mut Report,
    grants: &mut [Grant],
    fenced: &[Fenced],
    store: &[StoreEvent],
    slack_ns: u64,
    late_ns: u64,
) {
    for k in words("late_cs late_store_events cross_server_refusals late_ends") {
        r.n.add_n(k, 0);
    }
    r.n.add_n("grants", grants.len() as u64);
    grants.sort_by_key(|g| (g.server, g.fence));

    // Per server: fences unique, and ordered as real time orders the grants.
    let fence = |g: &Grant| Fenced::new(g.server, g.fence, g.invoke, g.complete);
    let mut all: Vec<Fenced> = grants
        .iter()
        .map(fence)
        .chain(fenced.iter().copied())
        .collect();
    all.sort_by_key(|f| (f.server, f.fence));
    for w in all.windows(2) {
        if w[0].server == w[1].server && w[0].fence == w[1].fence {
            r.add("duplicate fence", || format!("fence {}", w[0].fence));
        }
    }
    // Walk down from the highest fence: a grant asked for after a higher-fenced grant
    // had already returned got a fence that went back.
    let mut min_complete = u64::MAX;
    let mut min_complete_fence = 0u64;
    let mut server = None;
    for g in all.iter().rev() {
        if server != Some(g.server) {
            (server, min_complete) = (Some(g.server), u64::MAX);
        }
        if g.invoke > min_complete {
            r.add("fence lower than a grant made before it", || {
                format!(
                    "fence {} was asked for after fence {} had been returned",
                    g.fence, min_complete_fence
                )
            });
        }
        if g.complete < min_complete {
            min_complete = g.complete;
            min_complete_fence = g.fence;
        }
    }

    // Per server and key, in fence order: the holders granted before this one and
    // certainly live at its grant must leave room for it.
    let bounds: Vec<Bounds> = grants
        .iter()
        .map(|g| check_grant(g, slack_ns, late_ns, r))
        .collect();
    type Live = BTreeSet<(u64, u64)>; // (live_until, fence)
    let mut held: BTreeMap<(u32, u32), (Live, Live)> = BTreeMap::new(); // -> (readers, others)
    for (g, b) in grants.iter().zip(&bounds) {
        let (readers, others) = held.entry((g.server, g.key)).or_default();
        let from = (g.complete + 1, 0);
        let (nr, no) = (readers.range(from..).count(), others.range(from..).count());
        if let Some(kind) = crowded(g.mode, nr, no) {
            let prev = readers
                .range(from..)
                .chain(others.range(from..))
                .next()
                .copied();
            r.add(kind, || {
                let (until, pf) = prev.unwrap_or_default();
                format!(
                    "key {}: fence {} ({:?}) granted {} us before fence {} could have ended ({} readers, {} others live)",
                    g.key,
                    g.fence,
                    g.mode,
                    until.saturating_sub(g.complete) / 1000,
                    pf,
                    nr,
                    no
                )
            });
        }
        let set = if g.mode == Mode::Shared {
            readers
        } else {
            others
        };
        set.insert((b.live_until, g.fence));
    }

    // Across servers (a key that moved between cluster nodes): certainly-live intervals
    // [complete, live_until) of holders from different servers.
    let servers: BTreeSet<u32> = grants.iter().map(|g| g.server).collect();
    if servers.len() > 1 {
        let mut by_key: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, g) in grants.iter().enumerate() {
            if bounds[i].live_until > g.complete {
                by_key.entry(g.key).or_default().push(i);
            }
        }
        for idx in by_key.values_mut() {
            idx.sort_by_key(|&i| grants[i].complete);
            let mut active: Vec<usize> = Vec::new();
            for &i in idx.iter() {
                let g = &grants[i];
                active.retain(|&j| bounds[j].live_until > g.complete);
                let other = |j: &&usize| grants[**j].server != g.server;
                let nr = active
                    .iter()
                    .filter(other)
                    .filter(|&&j| grants[j].mode == Mode::Shared)
                    .count();
                let no = active.iter().filter(other).count() - nr;
                if let Some(kind) = crowded(g.mode, nr, no) {
                    r.add(kind, || {
                        format!(
                            "key {}: fence {} of server {} granted while {} holders of other servers were live",
                            g.key,
                            g.fence,
                            g.server,
                            nr + no
                        )
                    });
                }
                active.push(i);
            }
        }
    }

    // Store events: a fault of the lock unless a holder involved ran past its lease.
    let index: BTreeMap<(u32, u32, u64), usize> = if store.is_empty() {
        BTreeMap::new()
    } else {
        grants
            .iter()
            .enumerate()
            .map(|(i, g)| ((g.key, g.server, g.fence), i))
            .collect()
    };
    let late = |key: u32, (server, f): (u32, u64)| {
        index.get(&(key, server, f)).is_some_and(|&i| {
            grants[i]
                .cs
                .is_some_and(|(_, end)| end > bounds[i].lease_until)
        })
    };
    // Appended after the loop: these notes are not violations and take no example slot.
    let mut cross = Vec::new();
    for ev in store {
        if late(ev.key, ev.later) || ev.earlier.iter().any(|&f| late(ev.key, f)) {
            r.n.bump("late_store_events");
            continue;
        }
        let show = |&(server, f): &(u32, u64)| match index.get(&(ev.key, server, f)) {
            Some(&i) => describe(&grants[i], &bounds[i]),
            None => format!("fence {f} of server {server} (not in the history)"),
        };
        // A refusal because the key's earlier holder was on another server (a cluster
        // node that owned the slot before) with a higher counter.
        if ev.kind == StoreEventKind::StaleWrite && ev.earlier.iter().all(|e| e.0 != ev.later.0) {
            r.n.bump("cross_server_refusals");
            let brief = |&(server, f): &(u32, u64)| match index.get(&(ev.key, server, f)) {
                Some(&i) => format!(
                    "fence {f} of node {server}, granted at {} ms",
                    grants[i].complete / MS
                ),
                None => format!("fence {f} of node {server}"),
            };
            if r.n.get("cross_server_refusals") <= 5 {
                let earlier: Vec<String> = ev.earlier.iter().map(brief).collect();
                let (key, later) = (ev.key, brief(&ev.later));
                let e = format!("key {key}: {later} refused after {}", earlier.join(", "));
                cross.push(format!("cross-server refusal: {e}"));
            }
            continue;
        }
        let kind = match ev.kind {
            StoreEventKind::Overlap => "critical sections overlapped in the store",
            StoreEventKind::StaleWrite => "store saw a write with a lower fence",
        };
        r.add(kind, || {
            let who: Vec<String> = ev.earlier.iter().chain([&ev.later]).map(show).collect();
            format!("key {}: {}", ev.key, who.join("; then "))
        });
    }
    r.examples.extend(cross);
}

/// Per key, whichever server (cluster node) issued them: grants whose fence is not above
/// that of a grant of the same key answered before they were asked (a fence that went
/// back for that key), with up to 3 examples.
pub fn key_fence_regressions(grants: &[Grant]) -> (u64, Vec<String>) {
    let mut by_key: BTreeMap<u32, Vec<&Grant>> = BTreeMap::new();
    for g in grants {
        by_key.entry(g.key).or_default().push(g);
    }
    let (mut n, mut examples) = (0u64, Vec::new());
    for (key, mut asked) in by_key {
        asked.sort_by_key(|g| g.invoke);
        let mut answered = asked.clone();
        answered.sort_by_key(|g| g.complete);
        let (mut i, mut max): (usize, Option<&Grant>) = (0, None);
        for g in asked {
            while i < answered.len() && answered[i].complete < g.invoke {
                if max.is_none_or(|m| answered[i].fence > m.fence) {
                    max = Some(answered[i]);
                }
                i += 1;
            }
            if let Some(m) = max.filter(|m| g.fence <= m.fence) {
                n += 1;
                example(&mut examples, 3, || {
                    let (f, s) = (g.fence, g.server);
                    format!(
                        "key {key}: fence {f} of node {s} after fence {} of node {}",
                        m.fence, m.server
                    )
                });
            }
        }
    }
    (n, examples)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history checked with 2 ms of slack.
    fn run(h: &mut [Grant], fenced: &[Fenced], store: &[StoreEvent]) -> Report {
        let mut r = Report::default();
        check_with(&mut r, h, fenced, store, 2 * MS, 0);
        r
    }

    /// The violations of `kind` (all kinds: "") in `h`.
    fn seen(h: &mut [Grant], kind: &str) -> u64 {
        let v = run(h, &[], &[]).violations;
        if kind.is_empty() {
            v.total()
        } else {
            v.get(kind)
        }
    }

    fn call(invoke_ms: u64, complete_ms: u64, ok: Option<bool>) -> Call {
        Call::new(invoke_ms * MS, complete_ms * MS, ok)
    }

    fn grant(key: u32, fence: u64, invoke_ms: u64, ttl_ms: u64, release_ms: Option<u64>) -> Grant {
        let t = invoke_ms * MS;
        let (at, call) = ((0, fence), (t, t + 100_000));
        let mut g = Grant::new((0, key), Mode::Exclusive, at, ttl_ms, call);
        g.release = release_ms.map(|r| Call::new(r * MS, r * MS + 100_000, Some(true)));
        g.cs = Some((t + 200_000, t + 300_000));
        g
    }

    fn with(mut g: Grant, mode: Mode, server: u32) -> Grant {
        (g.mode, g.server) = (mode, server);
        g
    }

    fn ev(key: u32, kind: StoreEventKind, earlier: u64, later: u64) -> StoreEvent {
        let (earlier, later) = (vec![(0, earlier)], (0, later));
        StoreEvent {
            key,
            kind,
            earlier,
            later,
        }
    }

    /// A valid history, and `more`.
    fn valid_and(more: Option<Grant>) -> Vec<Grant> {
        let mut h = vec![
            grant(1, 10, 0, 1000, Some(5)),
            grant(1, 11, 6, 1000, Some(9)),
            grant(2, 12, 7, 50, None), // expires at ~57 ms
            grant(1, 13, 10, 1000, Some(12)),
            grant(2, 14, 60, 1000, Some(70)),
        ];
        h.extend(more);
        h
    }

    const OVERLAP: &str = "granted while another holder's lease was live";

    #[test]
    fn key_fences_are_ordered_across_servers() {
        let g = |server, fence, invoke, complete| {
            let at = (server, fence);
            Grant::new((0, 1), Mode::Exclusive, at, 100, (invoke, complete))
        };
        // Node 1 grants fence 50 after node 0 answered fence 60 for the same key.
        let grants = vec![g(0, 60, 0, 10), g(1, 50, 20, 30), g(1, 70, 40, 50)];
        let (n, ex) = key_fence_regressions(&grants);
        assert_eq!(n, 1, "{ex:?}");
        // Overlapping calls are not ordered; other keys do not count.
        let mut other = g(1, 10, 20, 30);
        other.key = 2;
        let grants = vec![g(0, 60, 0, 25), g(1, 50, 20, 30), other];
        assert_eq!(key_fence_regressions(&grants).0, 0);
    }

    #[test]
    fn grants_and_fences_of_one_server() {
        let r = run(&mut valid_and(None), &[], &[]);
        assert_eq!((r.violations.total(), r.n.get("grants")), (0, 5));
        // Key 2 is held by fence 12 until ~57 ms.
        assert_eq!(
            seen(
                &mut valid_and(Some(grant(2, 15, 20, 1000, Some(21)))),
                OVERLAP
            ),
            1
        );
        let mut h = [
            grant(1, 10, 0, 1000, Some(50)),
            grant(1, 11, 20, 1000, Some(60)),
        ];
        assert_eq!(seen(&mut h, ""), 1, "a grant before an earlier release");
        // Key 3, made at 100 ms, long after fence 14 (at 10 ms), yet with a lower fence.
        let lower = "fence lower than a grant made before it";
        assert_eq!(
            seen(
                &mut valid_and(Some(grant(3, 9, 100, 1000, Some(101)))),
                lower
            ),
            1
        );
        let mut h = valid_and(Some(grant(3, 12, 100, 1000, Some(101))));
        assert_eq!(seen(&mut h, "duplicate fence"), 1);
        // Another server's fences are its own business...
        let other = with(grant(3, 9, 100, 1000, Some(101)), Mode::Exclusive, 1);
        assert_eq!(seen(&mut valid_and(Some(other)), ""), 0);
        // ... and extra fences of the same server are ordered with the grants.
        let late = Fenced::new(0, 8, 200 * MS, 201 * MS);
        assert_eq!(
            run(&mut valid_and(None), &[late], &[]).violations.total(),
            1
        );
    }

    #[test]
    fn releases_and_extends_move_the_bounds() {
        let what = "release succeeded after the lease had ended";
        assert_eq!(seen(&mut [grant(1, 10, 0, 50, Some(80))], what), 1);
        // Refused inside the lease is a fault too; an unknown outcome is not.
        let mut g = grant(1, 10, 0, 1000, None);
        g.release = Some(call(10, 11, Some(false)));
        let refused = "release refused while the lease was live";
        assert_eq!(seen(&mut [g.clone()], refused), 1);
        g.release = g.release.map(|c| Call { ok: None, ..c });
        // A lost release leaves the lock possibly held from its invoke on: a grant at
        // 20 ms is not a violation, the holder was only certainly live until 10 ms.
        assert_eq!(seen(&mut [g, grant(1, 11, 20, 1000, Some(30))], ""), 0);
        // Lease 50 ms, extended at 40 ms by 1000 ms: a grant at 200 ms is a violation,
        // a release at 500 ms is fine.
        let mut a = grant(1, 10, 0, 50, Some(500));
        a.extends.push((call(40, 41, Some(true)), 1000));
        let b = grant(1, 11, 200, 1000, Some(600));
        assert_eq!(seen(&mut [a.clone(), b.clone()], ""), 1);
        // An extend whose reply was lost proves nothing by itself: no violation...
        a.extends[0].0.ok = None;
        let unknown = Grant {
            release: None,
            ..a.clone()
        };
        assert_eq!(seen(&mut [unknown, b.clone()], ""), 0);
        // ... but a release that answered 1 at 500 ms proves the lease lasted that long.
        assert_eq!(seen(&mut [a.clone(), b], ""), 1);
        // An extend that succeeds after the lease ended is caught.
        (a.extends[0].0, a.release) = (call(60, 61, Some(true)), None);
        assert_eq!(
            seen(&mut [a], "extend succeeded after the lease had ended"),
            1
        );
    }

    #[test]
    fn readers_share_writers_do_not_permits_are_counted() {
        let r1 = with(grant(1, 10, 0, 1000, Some(50)), Mode::Shared, 0);
        let r2 = with(grant(1, 11, 10, 1000, Some(60)), Mode::Shared, 0);
        assert_eq!(seen(&mut [r1.clone(), r2.clone()], ""), 0);
        // A writer while readers are live, and a reader while a writer is.
        let w = grant(1, 12, 20, 1000, Some(70));
        assert_eq!(seen(&mut [r1.clone(), r2, w], OVERLAP), 1);
        let w = grant(1, 9, 0, 1000, Some(40));
        assert_eq!(seen(&mut [w, r1], "reader granted beside a live writer"), 1);
        let p = |f, at, rel| with(grant(1, f, at, 1000, Some(rel)), Mode::Permit(2), 0);
        assert_eq!(
            seen(&mut [p(10, 0, 50), p(11, 10, 60), p(12, 70, 80)], ""),
            0
        );
        let mut h = [p(10, 0, 50), p(11, 10, 60), p(12, 20, 80)];
        assert_eq!(seen(&mut h, "more than LIMIT holders at once"), 1);
    }

    #[test]
    fn holders_of_different_servers_and_store_events() {
        // The key moved to server 1 while fence 10 still held it on server 0: server 1's
        // lower fence 5, granted at 20 ms, is a second holder.
        let a = grant(1, 10, 0, 1000, Some(50));
        let mut b = with(grant(1, 5, 20, 1000, Some(30)), Mode::Exclusive, 1);
        assert_eq!(seen(&mut [a.clone(), b.clone()], ""), 1);
        (b.invoke, b.complete) = (60 * MS, 61 * MS);
        b.release = b.release.map(|c| call(70, 71, c.ok));
        assert_eq!(seen(&mut [a, b], ""), 0);
        // The store refused server 1's lower fence: counted apart, not a violation.
        let b = with(grant(1, 5, 60, 1000, Some(70)), Mode::Exclusive, 1);
        let mut h = [grant(1, 10, 0, 1000, Some(50)), b];
        let mut e = ev(1, StoreEventKind::StaleWrite, 10, 5);
        e.later.0 = 1;
        let r = run(&mut h, &[], &[e]);
        assert_eq!(
            (r.violations.total(), r.n.get("cross_server_refusals")),
            (0, 1)
        );
        // Store events are violations unless a holder was late.
        let r = run(
            &mut valid_and(None),
            &[],
            &[ev(1, StoreEventKind::Overlap, 10, 11)],
        );
        assert_eq!(r.violations.total(), 1);
        // Fence 12's lease (50 ms) ended long before its critical section did.
        let mut h = valid_and(None);
        h[2].cs = Some((8 * MS, 200 * MS));
        let r = run(&mut h, &[], &[ev(2, StoreEventKind::StaleWrite, 14, 12)]);
        assert_eq!(r.violations.total(), 0);
        assert_eq!((r.n.get("late_store_events"), r.n.get("late_cs")), (1, 1));
    }
}
