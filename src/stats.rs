//! The `INFO lock` section: locks and waiters now, and totals since start.

use std::sync::atomic::Ordering;

use crate::events::{EVICTED, EXPIRED};
use crate::ffi::events::InfoSink;
use crate::ffi::guard::PANICS;
use crate::ffi::LIVE_LOCKS;
use crate::waiting::with_engine;

/// Registered with the server; field names get the `lock_` prefix.
pub fn info(out: &mut InfoSink) {
    let Some((s, last_fence)) = with_engine(|e| (e.stats, e.fence.last())) else {
        return;
    };
    let held = LIVE_LOCKS.load(Ordering::Relaxed).max(0) as u64;
    let expired = s.expired + EXPIRED.load(Ordering::Relaxed);
    let fields = [
        ("held", held),
        ("waiters", s.waiters),
        ("acquired", s.acquired),
        ("renewed", s.renewed),
        ("contended", s.contended),
        ("released", s.released),
        ("extended", s.extended),
        ("expired", expired),
        ("evicted", EVICTED.load(Ordering::Relaxed)),
        ("handed_off", s.handed_off),
        ("wait_timeouts", s.wait_timeouts),
        ("force_released", s.force_released),
        ("panics", PANICS.load(Ordering::Relaxed)),
        ("last_fence", last_fence),
    ];
    for (name, v) in fields {
        out.add(name, v);
    }
}
