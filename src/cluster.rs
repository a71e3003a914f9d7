//! Fences that never go back anywhere in a Redis Cluster.
//!
//! Each node has its own fence counter; a key's next fence comes from whichever node
//! serves its slot then. The nodes share their counters over the cluster bus, and a node
//! grants on a slot only once every other node has said it no longer serves it:
//!
//! - every node broadcasts its state (its counter and the slots it serves: owned and not
//!   being migrated away, or being imported) ten times a second from the server's cron,
//!   and at once when its counter jumps (a MINFENCE lift, a start, a promotion);
//! - a node that begins serving a slot (found in the server's `CLUSTER NODES` at the cron,
//!   or at the first grant on it) holds the slot *pending*: it broadcasts its state and a
//!   request, and answers grants on that slot with TRYAGAIN (clients retry) and defers
//!   hand-offs, until every live master has answered the request with a state that does
//!   not serve the slot. Every counter it hears is observed, so its next fence on the slot
//!   is above every fence any node gave on it while serving it;
//! - the node that gives a slot away stops granting free keys on it when it starts
//!   migrating it (the server redirects them), and a key that moves carries its fences.
//!
//! Two nodes that both begin serving a slot wait for each other's answers, so at most one
//! of them grants. A master that does not answer within `ANSWER_WAIT_US` is taken at its
//! latest state; one that never spoke (an older module) at the server's view of its slots.
//! The wait lasts about one round trip on the cluster bus.

use std::collections::HashMap;

use crate::ffi::cluster::{self as bus, NodeId};
use crate::ffi::{self, Ctx};
use crate::lock::fence::FenceClock;

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
    /// Its latest state: the slots it serves, and the request it answered (0: none).
    said: Option<(Slots, u64)>,
}

pub struct Cluster {
    me: NodeId,
    serving: Slots,
    pending: Slots,
    pending_count: usize,
    /// When the current request went out (monotonic µs) and its id.
    asked_at: i64,
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
    pub fn new(me: NodeId) -> Cluster {
        Cluster {
            me,
            serving: Slots::new(),
            pending: Slots::new(),
            pending_count: 0,
            asked_at: 0,
            request: 0,
            masters: HashMap::new(),
            broadcast_at: i64::MIN,
            broadcast_counter: 0,
            view: String::new(),
            slots_sent: false,
            lost: false,
        }
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
        self.pending_count > 0 && self.pending.get(slot)
    }

    /// A state message: the counter, the request it answers (0: none) and, when `slots`,
    /// the slots this node serves (the periodic broadcast leaves them out: a node that
    /// needs them asks).
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
    pub fn refresh(&mut self, ctx: Ctx<'_>, fence: &FenceClock, now: i64) {
        let Some(text) = bus::nodes(ctx) else {
            return;
        };
        // Only ids, roles and slots matter (the rest of each line changes every ping).
        let view: String = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (id, flags, slots) = (f.first(), f.get(2), f.get(8..).unwrap_or(&[]));
                format!("{id:?} {flags:?} {}\n", slots.join(" "))
            })
            .collect();
        if view == self.view {
            return self.settle(now);
        }
        self.view = view;
        let mut serving = Slots::new();
        let mut masters = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(id), Some(flags)) = (f.first(), f.get(2)) else {
                continue;
            };
            let Ok(id): Result<NodeId, _> = id.as_bytes().try_into() else {
                continue;
            };
            let (mut owned, mut migrating, mut importing) =
                (Slots::new(), Slots::new(), Slots::new());
            parse_slots(
                f.get(8..).unwrap_or(&[]),
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
                let said = self.masters.remove(&id).and_then(|p| p.said);
                masters.insert(id, Peer { owned, said });
            }
        }
        self.masters = masters;
        let mut new = false;
        for s in 0..SLOTS {
            let (was, is) = (self.serving.get(s), serving.get(s));
            if is && !was {
                self.pending.set(s, true);
                new = true;
            } else if !is && self.pending.get(s) {
                self.pending.set(s, false);
            }
            if was && !is {
                self.lost = true;
            }
        }
        if self.serving != serving {
            self.slots_sent = false;
        }
        self.serving = serving;
        self.pending_count = (0..SLOTS).filter(|&s| self.pending.get(s)).count();
        if new {
            self.request += 1;
            self.asked_at = now;
            let mut req = MAGIC.to_vec();
            req.extend_from_slice(&self.request.to_le_bytes());
            self.broadcast(ctx, fence.last(), now);
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
        self.refresh(ctx, fence, now);
        self.maybe_broadcast(ctx, fence.last(), now);
    }

    pub fn maybe_broadcast(&mut self, ctx: Ctx<'_>, counter: u64, now: i64) {
        let due = now.saturating_sub(self.broadcast_at) >= BROADCAST_US;
        if due || !self.slots_sent || counter > self.broadcast_counter.saturating_add(JUMP) {
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
                bus::send(
                    ctx,
                    Some(from),
                    STATE,
                    &self.state_payload(counter, id, true),
                );
                None
            }
            STATE => {
                let peer_counter = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
                let answering = u64::from_le_bytes(body.get(8..16)?.try_into().ok()?);
                let slots = Slots::from_bytes(body.get(16..)?);
                if let Some(p) = self.masters.get_mut(from) {
                    let answered = if answering == self.request {
                        answering
                    } else {
                        p.said.as_ref().map_or(0, |(_, a)| *a)
                    };
                    // A state without slots keeps the slots said before.
                    match (slots, p.said.take()) {
                        (Some(s), _) => p.said = Some((s, answered)),
                        (None, Some((s, _))) => p.said = Some((s, answered)),
                        (None, None) => {}
                    }
                }
                self.settle(now);
                Some(peer_counter)
            }
            _ => None,
        }
    }

    /// Clears the pending slots every live master has let go of.
    fn settle(&mut self, now: i64) {
        if self.pending_count == 0 {
            return;
        }
        let waited = now.saturating_sub(self.asked_at) >= ANSWER_WAIT_US;
        let request = self.request;
        for s in 0..SLOTS {
            if !self.pending.get(s) {
                continue;
            }
            let free = self.masters.values().all(|p| match &p.said {
                Some((serves, answered)) if *answered == request || waited => !serves.get(s),
                Some(_) => false,
                None => !p.owned.get(s),
            });
            if free {
                self.pending.set(s, false);
                self.pending_count -= 1;
            }
        }
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
