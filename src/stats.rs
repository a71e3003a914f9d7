//! The `INFO lock` section: locks and waiters now, and totals since start.

use std::sync::atomic::Ordering;

use crate::ffi::events::InfoSink;
use crate::ffi::guard::PANICS;
use crate::state;

/// Registered with the server; field names get the `lock_` prefix.
pub fn info(out: &mut InfoSink) {
    let now = crate::ffi::mono_us();
    let Some((s, waiters, longest_wait, watchers, sessions, last_fence)) = state::with(|st| {
        (
            st.engine.stats,
            st.engine.waiting(),
            st.engine.longest_wait_anywhere(now),
            st.engine.watching(),
            st.engine.sessions(),
            st.engine.fence.last(),
        )
    }) else {
        return;
    };
    // The engine's counters, each under its own field name.
    macro_rules! counters {
        ($($field:ident),*) => {
            [$((stringify!($field), s.$field)),*]
        };
    }
    let counters = counters!(
        acquired,
        renewed,
        contended,
        released,
        extended,
        expired,
        removed,
        evicted,
        restored,
        handed_off,
        wait_timeouts,
        force_released,
        repaired,
        refused_eviction,
        sessions_opened,
        sessions_expired,
        sessions_closed,
        session_keepalives,
        sessions_moved
    );
    // Waits in ms: the longest going on now (what to alert on), and the total of those
    // that ended (with handed_off and wait_timeouts, the mean wait).
    let fields = [
        ("held", crate::state::live()),
        ("waiters", waiters as u64),
        ("longest_wait_ms", (longest_wait / 1000) as u64),
        ("watchers", watchers as u64),
        ("sessions", sessions as u64),
    ]
    .into_iter()
    .chain(counters)
    .chain([
        ("waited_ms", s.waited_us / 1000),
        ("panics", PANICS.load(Ordering::Relaxed)),
        (
            "eviction_risk",
            u64::from(crate::config::eviction_risk().is_some()),
        ),
        (
            "eviction_allowed",
            u64::from(crate::config::ALLOW_EVICTION.load(Ordering::Relaxed)),
        ),
        ("last_fence", last_fence),
    ]);
    for (name, v) in fields {
        out.add(name, v);
    }
}
