//! Watchers: clients blocked in LOCK.WATCH until a key is held (no FENCE), or until a
//! fence no longer holds it (FENCE f, and with OWNER o until its label is no longer o).
//!
//! A change never answers watchers itself: whatever changes a watched key (a command, a
//! lease ending, a hand-off, the server deleting or moving it, a replicated change) puts
//! one look at the key on the agenda, at once, and that look answers every watcher of
//! the key whose wait is over, in one pass. The command that changes a lock pays one
//! agenda entry at most, whatever the number of watchers. A watcher of a fence is also
//! looked at when that holder's lease ends, so that it is answered on time even where
//! nothing removes the holder (a replica whose primary is gone, paused writes).

use std::collections::HashMap;

use super::queue::Answer;
use super::timeline::{bring_forward, drop_idle, OnAgenda, Task};
use super::{keys_in, Engine, Gate, Keyspace, Name, QueueKey, Sched, Slot, WaiterId};
use crate::error::LockError;
use crate::lock::value::{LockValue, Mode};
use crate::reply::{Bytes, Reply};

/// What a watcher waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// Anyone holding the key.
    Held,
    /// The holder with this fence gone (or, with `owner`, labelled otherwise).
    Gone {
        fence: u64,
        owner: Option<Box<[u8]>>,
    },
}

/// A LOCK.WATCH as the engine needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchReq {
    pub want: Want,
    /// BLOCK ms (None or `Some(0)`: without limit).
    pub block: Option<u64>,
}

pub(super) struct Watcher<W> {
    id: WaiterId,
    want: Want,
    deadline: Option<i64>,
    /// The key moved to another server (MIGRATE) while this client watched it.
    moved: bool,
    handle: W,
}

pub(super) struct Watched<W> {
    list: Vec<Watcher<W>>,
    /// How many of them wait for a holder (no FENCE).
    held: usize,
    /// When a look at this key is on the agenda.
    look_at: Option<i64>,
}

impl<W> OnAgenda for Watched<W> {
    const TASK: fn(QueueKey) -> Task = Task::Look;
    fn on_agenda(&mut self) -> (&mut Option<i64>, bool) {
        (&mut self.look_at, self.list.is_empty())
    }
}

/// The watched keys of one db, by name.
pub(super) type DbWatches<W> = HashMap<Box<[u8]>, Watched<W>>;

/// The most holders a summary lists (LOCK.INFO pages the rest).
pub const SUMMARY_HOLDERS: usize = 10;

impl Want {
    /// Whether the key, as it is at `now`, ends this wait.
    fn met(&self, slot: &Slot<'_>, now: i64) -> bool {
        match (self, slot) {
            (Want::Held, Slot::Free) => false,
            (Want::Held, Slot::Classic(_)) => true,
            (Want::Held, Slot::Lock(v)) => v.live_count(now) > 0,
            (Want::Gone { .. }, Slot::Free | Slot::Classic(_)) => true,
            (Want::Gone { fence, owner }, Slot::Lock(v)) => match v.find_fence(*fence) {
                Some(h) if h.live(now) => owner.as_deref().is_some_and(|o| h.owner() != Some(o)),
                _ => true,
            },
        }
    }

    /// When this wait must be looked at again even if nothing changes the key: the end of
    /// the watched holder's lease.
    fn due(&self, slot: &Slot<'_>, now: i64) -> Option<i64> {
        match (self, slot) {
            (Want::Gone { fence, .. }, Slot::Lock(v)) => v
                .find_fence(*fence)
                .filter(|h| h.live(now))
                .map(|h| h.deadline),
            _ => None,
        }
    }
}

fn owned<'a>(b: Option<&[u8]>) -> Reply<'a> {
    b.map_or(Reply::Nil, |b| Reply::Bulk(Bytes::Own(b.to_vec())))
}

/// Who holds the key now, as LOCK.WATCH answers it: nil when nobody does; else its
/// state, kind, mode, the holder's fence and label (exclusive), the number of holders and
/// the first [`SUMMARY_HOLDERS`] of them by fence, each as its fence and label. Never a
/// token.
pub fn summary(slot: &Slot<'_>, now: i64) -> Reply<'static> {
    match slot {
        Slot::Free => Reply::Nil,
        Slot::Classic(_) => Reply::Map(vec![
            ("state", Reply::text("held")),
            ("kind", Reply::text("string")),
            ("mode", Reply::text(Mode::Exclusive.name())),
            ("fence", Reply::Nil),
            ("owner", Reply::Nil),
            ("holders", Reply::Int(1)),
            ("holder-list", Reply::Array(Vec::new())),
        ]),
        Slot::Lock(v) => lock_summary(v, now),
    }
}

fn lock_summary(v: &LockValue, now: i64) -> Reply<'static> {
    let holders = v.live_count(now);
    if holders == 0 {
        return Reply::Nil;
    }
    let mut m: Vec<(&'static str, Reply<'static>)> = vec![
        ("state", Reply::text("held")),
        ("kind", Reply::text("module")),
        ("mode", Reply::text(v.mode().name())),
    ];
    if let (Mode::Exclusive, Some(h)) = (v.mode(), v.iter().next()) {
        m.push(("fence", Reply::Int(h.fence as i64)));
        m.push(("owner", owned(h.owner())));
    }
    let list = v
        .iter_after(0)
        .filter(|h| h.live(now))
        .take(SUMMARY_HOLDERS)
        .map(|h| {
            Reply::Map(vec![
                ("fence", Reply::Int(h.fence as i64)),
                ("owner", owned(h.owner())),
            ])
        })
        .collect();
    m.push(("holders", Reply::Int(holders as i64)));
    m.push(("holder-list", Reply::Array(list)));
    Reply::Map(m)
}

impl<W> Engine<W> {
    /// Clients watching now.
    pub fn watching(&self) -> usize {
        self.watch_ids.len()
    }

    pub(super) fn watched_any(&self) -> bool {
        !self.watch_ids.is_empty()
    }

    /// Whether clients watch this key.
    pub fn is_watched(&self, db: i32, name: &[u8]) -> bool {
        self.watched(db, name).is_some()
    }

    fn watched(&self, db: i32, name: &[u8]) -> Option<&Watched<W>> {
        if self.watch_ids.is_empty() {
            return None;
        }
        self.watches.get(&db)?.get(name)
    }

    fn watched_mut(&mut self, db: i32, name: &[u8]) -> Option<&mut Watched<W>> {
        self.watches.get_mut(&db)?.get_mut(name)
    }

    /// Every watched key of `db` (or of every db).
    pub fn watched_keys(&self, db: Option<i32>) -> Vec<QueueKey> {
        keys_in(&self.watches, db)
    }

    /// LOCK.WATCH: the summary now if the wait is over already (or the caller may not
    /// block), else the caller waits (`Ok(None)`).
    pub(super) fn watch<'a, S: Sched<Waiter = W>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        req: WatchReq,
    ) -> Result<Option<Reply<'a>>, LockError> {
        let now = ks.clock().mono;
        let deadline = crate::args::block_deadline(now, req.block.unwrap_or(0))?;
        let (met, answer, due) = {
            let slot = ks.read()?;
            (
                req.want.met(&slot, now),
                summary(&slot, now),
                req.want.due(&slot, now),
            )
        };
        if met {
            return Ok(Some(answer));
        }
        let (db, name) = (ks.db(), Name::of(ks.name()));
        let count = self.watched(db, &name).map_or(0, |w| w.list.len());
        if count as u64 >= self.settings.max_waiters {
            return Err(LockError::TooManyWaiters(self.settings.max_waiters));
        }
        let Some((id, handle)) = sched.block() else {
            // MULTI, a script: a wait that cannot wait answers as if its time was up.
            return Ok(Some(answer));
        };
        self.watch_ids.insert(id, (db, Box::from(&*name)));
        if let Some(at) = deadline {
            self.agenda.insert((at, Task::Timeout(id)));
        }
        let w = self
            .watches
            .entry(db)
            .or_default()
            .entry(Box::from(&*name))
            .or_insert_with(|| Watched {
                list: Vec::new(),
                held: 0,
                look_at: None,
            });
        w.held += usize::from(req.want == Want::Held);
        w.list.push(Watcher {
            id,
            want: req.want,
            deadline,
            moved: false,
            handle,
        });
        if let Some(at) = due {
            self.note(db, &name, at);
        }
        Ok(None)
    }

    /// Puts a look at the key's watchers on the agenda no later than `at` (nothing when
    /// nobody watches it).
    pub(super) fn note(&mut self, db: i32, name: &[u8], at: i64) {
        if let Some(w) = self.watches.get_mut(&db).and_then(|m| m.get_mut(name)) {
            bring_forward(&mut self.agenda, w, at, (db, name));
        }
    }

    /// A lock value left a key by the server's hand: it may have arrived under another
    /// name or in another db (RENAME, MOVE), which the server tells no module. Every key
    /// watched for a holder is looked at (one agenda entry per such key; keys watched only
    /// with FENCE are not).
    pub(super) fn note_held(&mut self, now: i64) {
        if !self.watched_any() {
            return;
        }
        let keys: Vec<QueueKey> = self
            .watches
            .iter()
            .flat_map(|(d, m)| {
                m.iter()
                    .filter(|(_, w)| w.held > 0)
                    .map(move |(k, _)| (*d, k.clone()))
            })
            .collect();
        for (db, name) in keys {
            self.note(db, &name, now);
        }
    }

    /// MIGRATE moved the key away: its watchers are told so at the next look.
    pub(super) fn mark_watch_moved(&mut self, db: i32, name: &[u8]) {
        if let Some(w) = self.watched_mut(db, name) {
            w.list.iter_mut().for_each(|x| x.moved = true);
        }
    }

    /// Takes a watcher out (disconnect, BLOCK timeout, CLIENT UNBLOCK): its handle and
    /// the key it watched.
    pub fn unwatch(&mut self, id: WaiterId) -> Option<(W, QueueKey)> {
        let key = self.watch_ids.remove(&id)?;
        let w = self.watched_mut(key.0, &key.1)?;
        let at = w.list.iter().position(|x| x.id == id)?;
        let x = w.list.swap_remove(at);
        w.held -= usize::from(x.want == Want::Held);
        if let Some(t) = x.deadline {
            self.agenda.remove(&(t, Task::Timeout(id)));
        }
        self.gc_watch(key.0, &key.1);
        Some((x.handle, key))
    }

    /// The key a watcher watches.
    pub(super) fn watch_key(&self, id: WaiterId) -> Option<QueueKey> {
        self.watch_ids.get(&id).cloned()
    }

    /// Takes every watcher of a key out.
    pub(super) fn take_watchers(&mut self, db: i32, name: &[u8]) -> Vec<W> {
        let ids: Vec<WaiterId> = self
            .watched(db, name)
            .map_or(Vec::new(), |w| w.list.iter().map(|x| x.id).collect());
        ids.into_iter()
            .filter_map(|id| self.unwatch(id).map(|(w, _)| w))
            .collect()
    }

    /// Drops a key's watch list once nobody is left on it.
    fn gc_watch(&mut self, db: i32, name: &[u8]) {
        drop_idle(&mut self.watches, &mut self.agenda, (db, name));
    }

    /// A watcher's BLOCK time is up: it is answered with the key as it is now.
    pub(super) fn watch_timed_out<S: Sched<Waiter = W>>(
        &mut self,
        ks: &mut impl Keyspace,
        id: WaiterId,
        sched: &mut S,
    ) {
        let ks = &mut self.kept(ks);
        let now = ks.clock().mono;
        let answer = match ks.read() {
            Ok(slot) => Answer::State(summary(&slot, now)),
            Err(e) => Answer::Failed(e),
        };
        if let Some((w, _)) = self.unwatch(id) {
            sched.answer(w, answer);
        }
    }

    /// The key as a watcher sees it (for a CLIENT UNBLOCK the shell answers itself).
    pub fn summary_of(&self, ks: &mut impl Keyspace) -> Reply<'static> {
        let ks = &mut self.kept(ks);
        let now = ks.clock().mono;
        match ks.read() {
            Ok(slot) => summary(&slot, now),
            Err(e) => Reply::Error(e),
        }
    }

    /// Looks at a watched key: answers every watcher whose wait is over (all with the
    /// same summary), and plans the next look for those whose holder's lease runs.
    pub(super) fn look<S: Sched<Waiter = W>>(&mut self, ks: &mut impl Keyspace, sched: &mut S) {
        self.restore_pending(ks);
        let ks = &mut self.kept(ks);
        let (db, name) = (ks.db(), Name::of(ks.name()));
        let Some(w) = self.watched_mut(db, &name) else {
            return;
        };
        w.look_at = None;
        let list = std::mem::take(&mut w.list);
        let now = ks.clock().mono;
        let mut done: Vec<(Watcher<W>, Answer)> = Vec::new();
        let mut keep: Vec<Watcher<W>> = Vec::new();
        let mut next: Option<i64> = None;
        let failed = if list.iter().any(|x| x.moved) {
            None
        } else {
            match ks.gate() {
                // A cluster node that no longer serves the key: the client follows it.
                Gate::NotHere => Some(LockError::TryAgain),
                _ => None,
            }
        };
        match (failed, ks.read()) {
            (Some(e), _) | (None, Err(e)) => {
                done.extend(list.into_iter().map(|x| (x, Answer::Failed(e.clone()))));
            }
            (None, Ok(slot)) => {
                let answer = summary(&slot, now);
                for x in list {
                    if x.moved {
                        done.push((x, Answer::Failed(LockError::Moved)));
                    } else if x.want.met(&slot, now) {
                        done.push((x, Answer::State(answer.clone())));
                    } else {
                        if let Some(t) = x.want.due(&slot, now) {
                            next = Some(next.map_or(t, |n| n.min(t)));
                        }
                        keep.push(x);
                    }
                }
            }
        }
        if let Some(w) = self.watched_mut(db, &name) {
            w.held = keep.iter().filter(|x| x.want == Want::Held).count();
            w.list = keep;
        }
        for (x, answer) in done {
            self.watch_ids.remove(&x.id);
            if let Some(t) = x.deadline {
                self.agenda.remove(&(t, Task::Timeout(x.id)));
            }
            sched.answer(x.handle, answer);
        }
        if let Some(at) = next {
            self.note(db, &name, at);
        }
        self.gc_watch(db, &name);
    }
}
