//! The fenced-mutex model checker (the model of Jepsen's Hazelcast lock suite, with
//! leases): a grant is valid only if the lock has no live holder at that moment and its
//! fence exceeds every fence granted before it, on that key and across the server.
//!
//! Times are nanoseconds on one monotonic clock, taken by the clients around each call
//! (`invoke` before sending, `complete` after the reply). The server acts at some unknown
//! instant inside that window, so every check below only reports what is certain:
//!
//! - a lease is certainly live from its grant until `L` = the release's invoke (when a
//!   release succeeded) or else `invoke + ttl` of the acquire / last successful extend;
//! - a lease has certainly ended by `U` = `complete + ttl` of the acquire / last
//!   successful extend, or the completion of a release/extend that found it gone.
//!
//! Both get `slack` (millisecond truncation of the server's clock, and the wall clock
//! the server uses against the monotonic clock the clients use).

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub invoke: u64,
    pub complete: u64,
    /// 1 / true reply.
    pub ok: bool,
}

#[derive(Debug, Clone)]
pub struct Grant {
    pub client: u32,
    pub key: u32,
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

/// Something the store saw while clients worked: two critical sections inside each
/// other (by fence), or a write carrying a lower fence than one already accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreEvent {
    pub key: u32,
    pub kind: StoreEventKind,
    /// The fence that was inside (or accepted) first.
    pub earlier: u64,
    pub later: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreEventKind {
    Overlap,
    StaleWrite,
}

#[derive(Debug, Default)]
pub struct Report {
    pub grants: u64,
    /// Violations by kind.
    pub violations: BTreeMap<&'static str, u64>,
    /// Up to 20 examples.
    pub examples: Vec<String>,
    /// Critical sections that ran past their certain lease (client pauses, not lock
    /// faults: the store events they cause are counted here, not as violations).
    pub late_cs: u64,
    pub late_store_events: u64,
}

impl Report {
    pub fn total(&self) -> u64 {
        self.violations.values().sum()
    }

    fn add(&mut self, kind: &'static str, example: impl FnOnce() -> String) {
        *self.violations.entry(kind).or_insert(0) += 1;
        if self.examples.len() < 20 {
            self.examples.push(format!("{kind}: {}", example()));
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

fn check_grant(g: &Grant, slack: u64, r: &mut Report) -> Bounds {
    let mut lower = (g.invoke + g.ttl_ms * MS).saturating_sub(slack);
    let mut upper = g.complete + g.ttl_ms * MS + slack;
    for (e, ttl) in &g.extends {
        if e.ok {
            if e.invoke > upper {
                r.add("extend succeeded after the lease had ended", || {
                    format!("key {} fence {} client {}", g.key, g.fence, g.client)
                });
            }
            lower = (e.invoke + ttl * MS).saturating_sub(slack);
            upper = e.complete + ttl * MS + slack;
        } else {
            if e.complete < lower {
                r.add("extend refused while the lease was live", || {
                    format!("key {} fence {} client {}", g.key, g.fence, g.client)
                });
            }
            upper = upper.min(e.complete);
            lower = lower.min(e.invoke);
        }
    }
    let lease_until = lower;
    let live_until = match g.release {
        Some(rel) if rel.ok => {
            if rel.invoke > upper {
                r.add("release succeeded after the lease had ended", || {
                    format!(
                        "key {} fence {} client {}: release at +{} ms past the latest possible end",
                        g.key,
                        g.fence,
                        g.client,
                        (rel.invoke - upper) / MS
                    )
                });
            }
            rel.invoke.max(g.complete)
        }
        Some(rel) => {
            if rel.complete < lower {
                r.add("release refused while the lease was live", || {
                    format!("key {} fence {} client {}", g.key, g.fence, g.client)
                });
            }
            lower.min(rel.invoke)
        }
        None => lower,
    };
    if let Some((_, end)) = g.cs {
        if end > lease_until {
            r.late_cs += 1;
        }
    }
    Bounds {
        live_until,
        lease_until,
    }
}

/// Checks a history. `grants` is reordered (by fence).
pub fn check(grants: &mut [Grant], store: &[StoreEvent], slack_ns: u64) -> Report {
    let mut r = Report {
        grants: grants.len() as u64,
        ..Report::default()
    };
    grants.sort_by_key(|g| g.fence);

    // Across the server: fences unique, and ordered as real time orders the grants.
    for w in grants.windows(2) {
        if w[0].fence == w[1].fence {
            r.add("duplicate fence", || format!("fence {}", w[0].fence));
        }
    }
    // Walk down from the highest fence: a grant asked for after a higher-fenced grant
    // had already returned got a fence that went back.
    let mut min_complete = u64::MAX;
    let mut min_complete_fence = 0u64;
    for g in grants.iter().rev() {
        if g.invoke > min_complete {
            r.add("fence lower than a grant made before it", || {
                format!(
                    "fence {} (key {}) was asked for after fence {} had been returned",
                    g.fence, g.key, min_complete_fence
                )
            });
        }
        if g.complete < min_complete {
            min_complete = g.complete;
            min_complete_fence = g.fence;
        }
    }

    // Per key: nobody is granted the lock while an earlier holder is certainly live.
    let mut by_key: BTreeMap<u32, (u64, u64)> = BTreeMap::new(); // key -> (live_until, fence)
    let mut lease_end: BTreeMap<u64, (u64, Option<(u64, u64)>)> = BTreeMap::new();
    for g in grants.iter() {
        let b = check_grant(g, slack_ns, &mut r);
        let prev = by_key.entry(g.key).or_insert((0, 0));
        if g.complete < prev.0 {
            let (until, pf) = *prev;
            r.add("granted while another holder's lease was live", || {
                format!(
                    "key {}: fence {} granted {} us before fence {} could have ended",
                    g.key,
                    g.fence,
                    (until - g.complete) / 1000,
                    pf
                )
            });
        }
        if b.live_until > prev.0 {
            *prev = (b.live_until, g.fence);
        }
        if !store.is_empty() {
            lease_end.insert(g.fence, (b.lease_until, g.cs));
        }
    }

    // Store events: a fault of the lock unless the earlier holder ran past its lease.
    for ev in store {
        let late = lease_end
            .get(&ev.earlier)
            .is_some_and(|(until, cs)| cs.is_some_and(|(_, end)| end > *until))
            || lease_end
                .get(&ev.later)
                .is_some_and(|(until, cs)| cs.is_some_and(|(_, end)| end > *until));
        if late {
            r.late_store_events += 1;
        } else {
            let kind = match ev.kind {
                StoreEventKind::Overlap => "critical sections overlapped in the store",
                StoreEventKind::StaleWrite => "store saw a write with a lower fence",
            };
            r.add(kind, || {
                format!("key {}: fences {} and {}", ev.key, ev.earlier, ev.later)
            });
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLACK: u64 = 2 * MS;

    fn grant(key: u32, fence: u64, invoke_ms: u64, ttl_ms: u64, release_ms: Option<u64>) -> Grant {
        Grant {
            client: 0,
            key,
            fence,
            ttl_ms,
            invoke: invoke_ms * MS,
            complete: invoke_ms * MS + 100_000,
            extends: Vec::new(),
            release: release_ms.map(|t| Call {
                invoke: t * MS,
                complete: t * MS + 100_000,
                ok: true,
            }),
            cs: Some((invoke_ms * MS + 200_000, invoke_ms * MS + 300_000)),
        }
    }

    fn ev(key: u32, kind: StoreEventKind, earlier: u64, later: u64) -> StoreEvent {
        StoreEvent {
            key,
            kind,
            earlier,
            later,
        }
    }

    fn valid_history() -> Vec<Grant> {
        vec![
            grant(1, 10, 0, 1000, Some(5)),
            grant(1, 11, 6, 1000, Some(9)),
            grant(2, 12, 7, 50, None), // expires at ~57 ms
            grant(1, 13, 10, 1000, Some(12)),
            grant(2, 14, 60, 1000, Some(70)),
        ]
    }

    #[test]
    fn a_valid_history_has_no_violation() {
        let mut h = valid_history();
        let r = check(&mut h, &[], SLACK);
        assert_eq!(r.total(), 0, "{:?}", r.examples);
        assert_eq!(r.grants, 5);
    }

    #[test]
    fn detects_a_grant_while_the_holder_is_live() {
        let mut h = valid_history();
        h.push(grant(2, 15, 20, 1000, Some(21))); // key 2 is held by fence 12 until ~57 ms
        let r = check(&mut h, &[], SLACK);
        assert_eq!(
            r.violations
                .get("granted while another holder's lease was live"),
            Some(&1)
        );
    }

    #[test]
    fn detects_a_grant_before_an_earlier_release() {
        let mut h = vec![
            grant(1, 10, 0, 1000, Some(50)),
            grant(1, 11, 20, 1000, Some(60)),
        ];
        let r = check(&mut h, &[], SLACK);
        assert_eq!(r.total(), 1, "{:?}", r.examples);
    }

    #[test]
    fn detects_fence_order_regressions_and_duplicates() {
        let mut h = valid_history();
        // Key 3, made at 100 ms, long after fence 14 (at 10 ms), yet with a lower fence.
        h.push(grant(3, 9, 100, 1000, Some(101)));
        let r = check(&mut h, &[], SLACK);
        assert_eq!(
            r.violations.get("fence lower than a grant made before it"),
            Some(&1)
        );

        let mut h = valid_history();
        h.push(grant(3, 12, 100, 1000, Some(101)));
        let r = check(&mut h, &[], SLACK);
        assert_eq!(r.violations.get("duplicate fence"), Some(&1));
    }

    #[test]
    fn detects_a_release_after_the_lease_ended() {
        let mut h = vec![grant(1, 10, 0, 50, Some(80))];
        let r = check(&mut h, &[], SLACK);
        assert_eq!(
            r.violations
                .get("release succeeded after the lease had ended"),
            Some(&1)
        );
        // Refused inside the lease is a fault too.
        let mut g = grant(1, 10, 0, 1000, None);
        g.release = Some(Call {
            invoke: 10 * MS,
            complete: 11 * MS,
            ok: false,
        });
        let r = check(&mut [g], &[], SLACK);
        assert_eq!(
            r.violations.get("release refused while the lease was live"),
            Some(&1)
        );
    }

    #[test]
    fn extends_move_the_bounds() {
        // Lease 50 ms, extended at 40 ms by 1000 ms: a grant at 200 ms is a violation,
        // a release at 500 ms is fine.
        let mut a = grant(1, 10, 0, 50, Some(500));
        a.extends.push((
            Call {
                invoke: 40 * MS,
                complete: 41 * MS,
                ok: true,
            },
            1000,
        ));
        let b = grant(1, 11, 200, 1000, Some(600));
        let r = check(&mut [a.clone(), b], &[], SLACK);
        assert_eq!(r.total(), 1, "{:?}", r.examples);
        // An extend that succeeds after the lease ended is caught.
        a.extends[0].0.invoke = 60 * MS;
        a.extends[0].0.complete = 61 * MS;
        a.release = None;
        let r = check(&mut [a], &[], SLACK);
        assert_eq!(
            r.violations
                .get("extend succeeded after the lease had ended"),
            Some(&1)
        );
    }

    #[test]
    fn store_events_are_violations_unless_a_holder_was_late() {
        let mut h = valid_history();
        let r = check(&mut h, &[ev(1, StoreEventKind::Overlap, 10, 11)], SLACK);
        assert_eq!(r.total(), 1);
        // Fence 12's lease (50 ms) ended long before its critical section did.
        let mut h = valid_history();
        h[2].cs = Some((8 * MS, 200 * MS));
        let r = check(&mut h, &[ev(2, StoreEventKind::StaleWrite, 14, 12)], SLACK);
        assert_eq!(r.total(), 0, "{:?}", r.examples);
        assert_eq!(r.late_store_events, 1);
        assert_eq!(r.late_cs, 1);
    }
}
