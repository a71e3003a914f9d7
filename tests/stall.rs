//! A command that arrives while the module's timer is late (the server was busy: a long
//! command, DEBUG SLEEP, a loaded machine) must find what the timer would have done. Two
//! holes were found by the model once it let time pass without the timers (`Op::Stall`):
//! - a waiter whose BLOCK time ran out was handed the lock by the release that came
//!   before the timer's answer (its client may have given up: an orphaned lock);
//! - a command that found the holder's lease over (the holder's own late RELEASE, a
//!   FORCERELEASE, an EXTEND) removed the key and left the waiters queued on a free
//!   key: with BLOCK 0 they waited for ever.
//!
//! `DEBUG SLEEP` followed by the command in the same pipeline runs the command before
//! the server's timers.

mod regress;

use regress::*;
use std::time::Duration;

/// Pipelines `DEBUG SLEEP secs` and `cmd` on `c`; returns the reply to `cmd`.
fn after_stall(c: &mut RawConn, secs: &str, cmd: &[&str]) -> Resp {
    c.queue(&["DEBUG", "SLEEP", secs]);
    c.queue(cmd);
    c.flush().expect("send");
    assert_eq!(c.read().expect("DEBUG SLEEP"), Resp::Simple("OK".into()));
    c.read().expect("reply")
}

#[test]
fn a_release_after_a_stall_does_not_serve_a_waiter_whose_block_ran_out() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let t = tok("stall-holder");
    take(&mut c, "lock:st", &t, &[]);
    let mut w = Pending::send(s.port, &acq("lock:st", &["PX", "60000", "BLOCK", "100"]));
    wait_waiters(&mut c, "lock:st", 1);
    let r = after_stall(&mut c, "0.3", &["LOCK.RELEASE", "lock:st", &t]);
    k.eq(r, Resp::Int(1), "the holder's release");
    let got = w.reply_within(SETTLE).expect("the waiter's reply");
    k.eq(
        got,
        Resp::Nil,
        "a waiter whose BLOCK 100 ran out during the stall",
    );
    k.eq(
        c.cmd(&["EXISTS", "lock:st"]),
        Resp::Int(0),
        "nobody holds the key",
    );
    k.finish_alive(&s, "stalls");
}

#[test]
fn a_command_that_finds_the_lease_over_hands_the_lock_to_the_waiters() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    for (i, cmd) in ["RELEASE", "FORCERELEASE", "EXTEND", "ACQUIRE", "INFO"]
        .into_iter()
        .enumerate()
    {
        let key = format!("lock:late{i}");
        let t = tok(&format!("late-{i}"));
        // The lease must outlast the waiter's arrival (a loaded machine) and end in the
        // stall.
        take_px(&mut c, &key, &t, 600, &[]);
        let mut w = Pending::send(s.port, &acq(&key, &["PX", "60000", "BLOCK", "0"]));
        wait_waiters(&mut c, &key, 1);
        let other = tok("someone-else");
        let argv: Vec<&str> = match cmd {
            "RELEASE" => vec!["LOCK.RELEASE", &key, &t],
            "FORCERELEASE" => vec!["LOCK.FORCERELEASE", &key],
            "EXTEND" => vec!["LOCK.EXTEND", &key, &t, "PX", "1000"],
            "ACQUIRE" => vec!["LOCK.ACQUIRE", &key, "PX", "1000", "TOKEN", &other],
            _ => vec!["LOCK.INFO", &key],
        };
        let r = after_stall(&mut c, "0.7", &argv);
        if cmd != "INFO" {
            // The lease was over: nothing to release, extend or take ahead of the waiter.
            k.check(
                matches!(r, Resp::Int(0) | Resp::Nil),
                format!("{cmd} after the lease ended answered {r:?}"),
            );
        }
        let got = w.reply_within(Duration::from_secs(5));
        k.check(
            matches!(&got, Ok(Resp::Array(a)) if a.len() == 2),
            format!("after a late {cmd}, the BLOCK 0 waiter is granted: {got:?}"),
        );
    }
    k.finish_alive(&s, "stalls");
}
