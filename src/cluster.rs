//! Fences that never go back anywhere in a Redis Cluster.
//!
//! Each node has its own fence counter; a key's next fence comes from whichever node
//! serves its slot then. The nodes share their counters over the cluster bus, and a node
//! grants on a slot only once every other master has said, after this node began serving
//! the slot, that it does not serve it:
//!
//! - a node that begins serving a slot (found in the server's `CLUSTER NODES` at the cron,
//!   at a command on a slot it did not know it serves, or when another node's request
//!   makes it look) holds the slot *pending*: it broadcasts a numbered request, answers
//!   grants on that slot with TRYAGAIN (clients retry) and defers hand-offs. Each pending
//!   slot remembers the request that made it pending;
//! - a master answers a request at once, with its counter and the slots it serves as the
//!   server says then. A pending slot is confirmed once each live master's latest state
//!   leaves it out and is its answer to the slot's request or a later one, or came after
//!   such an answer (one node's messages arrive in order): that state was sent after the
//!   slot became pending here, and its counter, observed with it, covers every fence the
//!   master gave while it served the slot. Slots confirm one by one: a slot that arrives
//!   does not hold up one that arrived before it, and a slot that does not move is never
//!   pending;
//! - every node also broadcasts its state ten times a second (its slots only once after
//!   each change), and at once when its counter moves ahead of the clock term (a MINFENCE
//!   lift, a start, a promotion). A grant sends nothing: fences that follow the clock are
//!   covered by every node's clock term;
//! - the node that gives a slot away stops granting free keys on it when it starts
//!   migrating it (the server redirects them), and a key that moves carries its fences.
//!
//! Two nodes that both begin serving a slot wait for each other's answers, so at most one
//! of them grants. A master that does not answer within `ANSWER_WAIT_US` is taken at its
//! latest state; one that never spoke (an older module) at the server's view of its slots.
//! The wait lasts about one round trip on the cluster bus. The bus cost does not depend on
//! the grants: a request and one answer per master each time slots arrive, and a
//! broadcast per node ten times a second.

use std::collections::HashMap;

use crate::ffi::cluster::{self as bus, NodeId};
use crate::ffi::{self, Ctx};
use crate::lock::fence::{clock_term, FenceClock};

/// Message types (unusual values: the bus tells modules apart by a name of exactly nine
/// characters, and this module's name is shorter). Payloads start with `MAGIC`.
pub const STATE: u8 = 0xB1;
pub const REQUEST: u8 = 0xB2;
const MAGIC: &[u8; 4] = b"RLK1";
const SLOTS: usize = 16384;
/// How often the state is broadcast, and how far a counter may move before it is at once.
const BROADCAST_US: i64 = 100_000;
const JUMP: u64 = 1024;
/// How long a pending slot waits for a master's answer before taking its latest state.
const ANSWER_WAIT_US: i64 = 1_000_000;

#[derive(Clone, PartialEq, Eq)]
struct Slots(Box<[u64; SLOTS / 64]>);

impl Slots {
    fn new() -> Slots {
        Slots(Box::new([0; SLOTS / 64]))
    }
    fn get(&self, s: usize) -> bool {
        self.0[s / 64] & (1 << (s % 64)) != 0
    }
    fn set(&mut self, s: usize, on: bool) {
        if on {
            self.0[s / 64] |= 1 << (s % 64);
        } else {
            self.0[s / 64] &= !(1 << (s % 64));
        }
    }
    fn to_bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
    fn from_bytes(b: &[u8]) -> Option<Slots> {
        if b.len() != SLOTS / 8 {
            return None;
        }
        let mut s = Slots::new();
        for (i, w) in b.chunks_exact(8).enumerate() {
            s.0[i] = u64::from_le_bytes(w.try_into().ok()?);
        }
        Some(s)
    }
}

/// What this node knows of another master.
struct Peer {
    /// Its slots in the server's view (for a master that never spoke).
    owned: Slots,
    /// The slots it said it serves in its latest message that carried them.
    said: Option<Slots>,
    /// The latest of this node's requests it answered (0: none). Its messages arrive in
    /// the order it sent them, so whatever it said since was said after that request.
    answered: u64,
}

/// A slot this node serves and is still confirming.
#[derive(Clone, Copy)]
struct Pending {
    /// The request that went out when it began serving the slot.
    request: u64,
    /// When (monotonic µs).
    since: i64,
}

pub struct Cluster {
    me: NodeId,
    serving: Slots,
    /// The slots being confirmed (few, and only while slots move).
    pending: HashMap<u16, Pending>,
    /// The latest request this node sent (ids rise across restarts: they start at the
    /// wall clock in µs).
    request: u64,
    masters: HashMap<NodeId, Peer>,
    broadcast_at: i64,
    broadcast_counter: u64,
    /// The part of the last `CLUSTER NODES` that matters, to skip an unchanged one.
    view: String,
    /// Whether the slots served now went out in a broadcast (they do once after each
    /// change, so that a node confirming a slot hears that this one let go of it).
    slots_sent: bool,
    /// This node stopped serving some slot since [`Cluster::take_lost`] was last asked.
    lost: bool,
    /// The slot ranges of Valkey atomic slot migrations this node exports now.
    exports: Vec<(u16, u16)>,
}

/// Whether `slot` lies in one of the inclusive `ranges`.
pub fn in_ranges(ranges: &[(u16, u16)], slot: usize) -> bool {
    ranges
        .iter()
        .any(|&(a, b)| (usize::from(a)..=usize::from(b)).contains(&slot))
}
/// The hash slot of a key (CRC16/XMODEM of the key or its `{hash tag}`, mod 16384).
pub fn key_slot(key: &[u8]) -> usize {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let data = tagged.unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    usize::from(crc) % SLOTS
}

/// `a-b` or `n` (slot ranges of CLUSTER NODES), and `[n->-id]` / `[n-<-id]` (migrating,
/// importing).
fn parse_slots(fields: &[&str], owned: &mut Slots, migrating: &mut Slots, importing: &mut Slots) {
    for f in fields {
        if let Some(inner) = f.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
            let (target, slot) = if let Some((s, _)) = inner.split_once("->-") {
                (&mut *migrating, s)
            } else if let Some((s, _)) = inner.split_once("-<-") {
                (&mut *importing, s)
            } else {
                continue;
            };
            if let Ok(s) = slot.parse::<usize>() {
                if s < SLOTS {
                    target.set(s, true);
                }
            }
            continue;
        }
        let (a, b) = f.split_once('-').unwrap_or((f, f));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            for s in a..=b.min(SLOTS - 1) {
                owned.set(s, true);
            }
        }
    }
}

impl Cluster {
    pub fn new(me: NodeId, wall_ms: i64) -> Cluster {
        Cluster {
            me,
            serving: Slots::new(),
            pending: HashMap::new(),
            request: u64::try_from(wall_ms).unwrap_or(0).saturating_mul(1000),
            masters: HashMap::new(),
            broadcast_at: i64::MIN,
            broadcast_counter: 0,
            view: String::new(),
            slots_sent: false,
            lost: false,
            exports: Vec::new(),
        }
    }

    /// A Valkey atomic slot migration began (`true`) or ended exporting `ranges`. While
    /// one runs, every change of a lock there must reach the replication stream: the
    /// server streams the changes of the migrating slots to the target from it.
    pub fn exporting(&mut self, ranges: &[(u16, u16)], on: bool) {
        if on {
            self.exports.extend_from_slice(ranges);
        } else {
            self.exports.retain(|r| !ranges.contains(r));
        }
    }

    /// Whether an atomic slot migration exports slots of this node now.
    pub fn exports(&self) -> bool {
        !self.exports.is_empty()
    }

    /// Whether an atomic slot migration exports `slot` now.
    pub fn exports_slot(&self, slot: usize) -> bool {
        in_ranges(&self.exports, slot)
    }

    /// Whether this node stopped serving some slot since the last call (the watchers of
    /// keys there are told to follow them).
    pub fn take_lost(&mut self) -> bool {
        std::mem::take(&mut self.lost)
    }

    /// Whether this node serves `slot` now (owned and not migrating away, or importing).
    pub fn serves(&self, slot: usize) -> bool {
        self.serving.get(slot)
    }

    /// Whether grants on `slot` must wait (this node does not serve it yet, or is still
    /// confirming it).
    pub fn pending(&self, slot: usize) -> bool {
        !self.serving.get(slot) || self.confirming(slot)
    }

    /// Whether this node serves `slot` and is still confirming it.
    pub fn confirming(&self, slot: usize) -> bool {
        !self.pending.is_empty() && self.pending.contains_key(&(slot as u16))
    }

    /// A state message: the counter, the request it answers (0: none) and, when `slots`,
    /// the slots this node serves (the periodic broadcast leaves them out once they went
    /// out after a change).
    fn state_payload(&self, counter: u64, answering: u64, slots: bool) -> Vec<u8> {
        let mut p = Vec::with_capacity(20 + SLOTS / 8);
        p.extend_from_slice(MAGIC);
        p.extend_from_slice(&counter.to_le_bytes());
        p.extend_from_slice(&answering.to_le_bytes());
        if slots {
            p.extend_from_slice(&self.serving.to_bytes());
        }
        p
    }

    /// Takes the server's view (`CLUSTER NODES`): the slots this node serves now and the
    /// live masters. Newly served slots become pending and a request goes out.
    pub fn refresh(&mut self, ctx: Ctx<'_>, counter: u64, now: i64) {
        let Some(text) = bus::nodes(ctx) else {
            return;
        };
        // Only ids, roles and slots matter (the rest of each line changes every ping).
        let mut view = String::with_capacity(text.len());
        for l in text.lines() {
            let mut f = l.split_whitespace();
            let (id, flags) = (f.next().unwrap_or(""), f.nth(1).unwrap_or(""));
            view.push_str(id);
            view.push(' ');
            view.push_str(flags);
            for slot in f.skip(5) {
                view.push(' ');
                view.push_str(slot);
            }
            view.push('\n');
        }
        if view == self.view {
            return self.settle(now);
        }
        let mut serving = Slots::new();
        let mut masters = HashMap::new();
        for line in view.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let (Some(id), Some(flags)) = (f.first(), f.get(1)) else {
                continue;
            };
            let Ok(id): Result<NodeId, _> = id.as_bytes().try_into() else {
                continue;
            };
            let (mut owned, mut migrating, mut importing) =
                (Slots::new(), Slots::new(), Slots::new());
            parse_slots(
                f.get(2..).unwrap_or(&[]),
                &mut owned,
                &mut migrating,
                &mut importing,
            );
            if flags.contains("myself") {
                for s in 0..SLOTS {
                    serving.set(s, (owned.get(s) && !migrating.get(s)) || importing.get(s));
                }
            } else if flags.contains("master")
                && !flags.contains("fail")
                && !flags.contains("noaddr")
            {
                let (said, answered) = match self.masters.remove(&id) {
                    Some(p) => (p.said, p.answered),
                    None => (None, 0),
                };
                masters.insert(
                    id,
                    Peer {
                        owned,
                        said,
                        answered,
                    },
                );
            }
        }
        self.view = view;
        self.masters = masters;
        let mut new = false;
        for s in 0..SLOTS {
            let (was, is) = (self.serving.get(s), serving.get(s));
            if is && !was {
                new = true;
            }
            if was && !is {
                self.pending.remove(&(s as u16));
                self.lost = true;
            }
        }
        if self.serving != serving {
            self.slots_sent = false;
        }
        if new {
            // One request for every slot that arrived since the last look.
            self.request += 1;
            let p = Pending {
                request: self.request,
                since: now,
            };
            for s in (0..SLOTS).filter(|&s| serving.get(s) && !self.serving.get(s)) {
                self.pending.insert(s as u16, p);
            }
        }
        self.serving = serving;
        if new {
            let mut req = MAGIC.to_vec();
            req.extend_from_slice(&self.request.to_le_bytes());
            self.broadcast(ctx, counter, now);
            bus::send(ctx, None, REQUEST, &req);
        }
        self.settle(now);
    }

    /// Broadcasts the state now (the cron calls it; also after a jump of the counter).
    pub fn broadcast(&mut self, ctx: Ctx<'_>, counter: u64, now: i64) {
        let payload = self.state_payload(counter, 0, !self.slots_sent);
        self.slots_sent = true;
        bus::send(ctx, None, STATE, &payload);
        self.broadcast_at = now;
        self.broadcast_counter = counter;
    }

    /// The cron's part: the view, and the state when it is due or the counter jumped.
    pub fn cron(&mut self, ctx: Ctx<'_>, fence: &FenceClock, now: i64) {
        self.refresh(ctx, fence.last(), now);
        self.maybe_broadcast(ctx, fence, now);
    }

    /// Broadcasts the state when it is due, when the slots served changed, or when the
    /// counter moved ahead of the clock term (a MINFENCE lift, a start, a promotion).
    /// Fences that follow the clock send nothing: every node's clock term covers them.
    pub fn maybe_broadcast(&mut self, ctx: Ctx<'_>, fence: &FenceClock, now: i64) {
        let counter = fence.last();
        let due = now.saturating_sub(self.broadcast_at) >= BROADCAST_US;
        let expected = (self.broadcast_counter)
            .max(clock_term(ffi::wall_ms(), fence.shift()))
            .saturating_add(JUMP);
        if due || !self.slots_sent || counter > expected {
            self.broadcast(ctx, counter, now);
        }
    }

    /// A message from another node. Returns a counter to observe.
    pub fn received(
        &mut self,
        ctx: Ctx<'_>,
        from: &NodeId,
        kind: u8,
        data: &[u8],
        counter: u64,
        now: i64,
    ) -> Option<u64> {
        if from == &self.me {
            return None;
        }
        let body = data.strip_prefix(MAGIC)?;
        match kind {
            REQUEST => {
                let id = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
                // The answer says what the server says now: a node that just gave the
                // slot away (its cluster config arrived before the request) says so at
                // once instead of at its next cron.
                self.refresh(ctx, counter, now);
                let answer = self.state_payload(counter, id, true);
                bus::send(ctx, Some(from), STATE, &answer);
                None
            }
            STATE => {
                let peer_counter = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
                let answering = u64::from_le_bytes(body.get(8..16)?.try_into().ok()?);
                self.heard(from, answering, Slots::from_bytes(body.get(16..)?), now);
                Some(peer_counter)
            }
            _ => None,
        }
    }

    /// A master's state: the request it answers (0: none) and the slots it serves (None:
    /// the same as before).
    fn heard(&mut self, from: &NodeId, answering: u64, slots: Option<Slots>, now: i64) {
        if let Some(p) = self.masters.get_mut(from) {
            // Only this node's own requests count (a later one answers for every earlier
            // one).
            if answering <= self.request {
                p.answered = p.answered.max(answering);
            }
            if let Some(s) = slots {
                p.said = Some(s);
            }
        }
        self.settle(now);
    }

    /// Confirms the pending slots every live master has let go of since they became
    /// pending (or, for a master silent for `ANSWER_WAIT_US`, at its latest state).
    fn settle(&mut self, now: i64) {
        if self.pending.is_empty() {
            return;
        }
        let masters = &self.masters;
        self.pending.retain(|&s, p| {
            let waited = now.saturating_sub(p.since) >= ANSWER_WAIT_US;
            let s = usize::from(s);
            let free = masters.values().all(|m| match &m.said {
                Some(serves) if m.answered >= p.request || waited => !serves.get(s),
                Some(_) => false,
                None => !m.owned.get(s),
            });
            !free
        });
    }
}

/// Whether this server runs in a cluster.
pub fn enabled(ctx: Ctx<'_>) -> bool {
    ctx.flags() & ffi::FLAG_CLUSTER != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_the_cluster_spec() {
        // Examples from the Redis Cluster specification and redis-cli.
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"{}x"), key_slot(b"{}x"));
    }

    const A: NodeId = [b'a'; 40];
    const B: NodeId = [b'b'; 40];

    /// This node (`me`) with masters A and B, serving nothing yet.
    fn node() -> Cluster {
        let mut c = Cluster::new([b'm'; 40], 1);
        for id in [A, B] {
            let peer = Peer {
                owned: Slots::new(),
                said: None,
                answered: 0,
            };
            c.masters.insert(id, peer);
        }
        c
    }

    /// Slots `on` begin to be served, as a refresh finds them: one request for them all.
    fn arrive(c: &mut Cluster, on: &[usize], now: i64) -> u64 {
        c.request += 1;
        for &s in on {
            c.serving.set(s, true);
            let p = Pending {
                request: c.request,
                since: now,
            };
            c.pending.insert(s as u16, p);
        }
        c.request
    }

    fn slots(on: &[usize]) -> Option<Slots> {
        let mut s = Slots::new();
        on.iter().for_each(|&x| s.set(x, true));
        Some(s)
    }

    #[test]
    fn an_arrived_slot_is_confirmed_by_answers_to_its_request_or_a_later_one() {
        let mut c = node();
        c.heard(&B, 0, slots(&[10, 11]), 0);
        let r1 = arrive(&mut c, &[10], 0);
        let r2 = arrive(&mut c, &[11], 5);
        // Both masters answer only the later request: it confirms both slots.
        c.heard(&A, r2, slots(&[]), 6);
        assert!(c.confirming(10) && c.confirming(11), "B has not answered");
        c.heard(&B, r2, slots(&[99]), 7);
        assert!(!c.confirming(10) && !c.confirming(11));
        assert!(r1 < r2);
    }

    #[test]
    fn a_slot_that_arrives_does_not_hold_up_one_that_arrived_before_it() {
        let mut c = node();
        let r1 = arrive(&mut c, &[10], 0);
        let r2 = arrive(&mut c, &[11], 1);
        // Answers to the first request come after the second went out.
        c.heard(&A, r1, slots(&[]), 2);
        c.heard(&B, r1, slots(&[]), 3);
        assert!(
            !c.confirming(10),
            "slot 10 waits for the answers to a later request"
        );
        assert!(
            c.confirming(11),
            "answers to an earlier request confirm a later slot"
        );
        c.heard(&A, r2, None, 4);
        c.heard(&B, r2, None, 4);
        assert!(!c.confirming(11));
    }

    #[test]
    fn a_state_said_before_the_request_confirms_nothing() {
        let mut c = node();
        // Both said long ago that they do not serve slot 10 (a periodic broadcast).
        c.heard(&A, 0, slots(&[]), 0);
        c.heard(&B, 0, slots(&[]), 0);
        arrive(&mut c, &[10], 1);
        c.settle(2);
        assert!(
            c.confirming(10),
            "an earlier state may predate grants on the slot"
        );
        // A broadcast after an answer was sent after the request: it counts.
        let r = c.request;
        c.heard(&A, r, slots(&[10]), 3);
        c.heard(&B, r, slots(&[]), 3);
        assert!(c.confirming(10), "A still serves it");
        c.heard(&A, 0, slots(&[]), 4);
        assert!(!c.confirming(10));
    }

    #[test]
    fn a_silent_master_is_taken_at_its_latest_state_after_the_wait() {
        let mut c = node();
        c.heard(&A, 0, slots(&[]), 0);
        let r = arrive(&mut c, &[10], 0);
        c.heard(&B, r, slots(&[]), 1);
        assert!(c.confirming(10));
        c.settle(ANSWER_WAIT_US);
        assert!(!c.confirming(10));
        // Answers to another node's requests (or forged ids) count for nothing.
        let r = arrive(&mut c, &[12], ANSWER_WAIT_US);
        c.heard(&A, r + 5, slots(&[]), ANSWER_WAIT_US + 1);
        c.heard(&B, r + 5, slots(&[]), ANSWER_WAIT_US + 1);
        assert!(c.confirming(12));
    }

    #[test]
    fn cluster_nodes_slot_fields_parse() {
        let (mut o, mut m, mut i) = (Slots::new(), Slots::new(), Slots::new());
        parse_slots(
            &["0-5", "9", "[7->-abc]", "[100-<-def]"],
            &mut o,
            &mut m,
            &mut i,
        );
        assert!(o.get(0) && o.get(5) && o.get(9) && !o.get(6));
        assert!(m.get(7) && !m.get(9));
        assert!(i.get(100));
        let back = Slots::from_bytes(&o.to_bytes()).unwrap();
        assert!(back == o);
    }
}
