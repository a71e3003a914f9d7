//! The `INFO lock` section: locks and waiters now, and totals since start.

use std::sync::atomic::Ordering;

use crate::ffi::events::InfoSink;
use crate::ffi::guard::PANICS;
use crate::state;

/// Registered with the server; field names get the `lock_` prefix.
pub fn info(out: &mut InfoSink) {
    let Some((s, waiters, watchers, last_fence)) = state::with(|st| {
        (
            st.engine.stats,
            st.engine.waiting(),
            st.engine.watching(),
            st.engine.fence.last(),
        )
    }) else {
        return;
    };
    let fields = [
        ("held", crate::state::live()),
        ("waiters", waiters as u64),
        ("watchers", watchers as u64),
        ("acquired", s.acquired),
        ("renewed", s.renewed),
        ("contended", s.contended),
        ("released", s.released),
        ("extended", s.extended),
        ("expired", s.expired),
        ("removed", s.removed),
        ("evicted", s.evicted),
        ("handed_off", s.handed_off),
        ("wait_timeouts", s.wait_timeouts),
        ("force_released", s.force_released),
        ("repaired", s.repaired),
        ("panics", PANICS.load(Ordering::Relaxed)),
        ("last_fence", last_fence),
    ];
    for (name, v) in fields {
        out.add(name, v);
    }
}
