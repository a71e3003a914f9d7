//! CMD never outlives its lock: it runs in a process group of its own, with a
//! parent-death signal, and a small watcher process kills that group when redis-lock
//! dies without a word (SIGKILL, the OOM killer), when nothing renews the lease any more.

use std::io;

/// Puts CMD in a process group of its own (so that signals reach the whole job, a shell
/// script and its children) and has the kernel SIGKILL it when redis-lock dies.
///
/// The parent-death signal belongs to the thread that forks: redis-lock runs on one
/// thread (a current-thread runtime), which lives as long as the process.
pub fn own_group_dying_with_us(cmd: &mut tokio::process::Command) {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid, raise), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            let sig = libc::SIGKILL as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // redis-lock died before the prctl took effect: no signal would come.
            if libc::getppid() != parent {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// The watcher of CMD's process group: a forked process that waits on a pipe from
/// redis-lock. A byte (redis-lock ends normally, [`Watcher::done`]) lets it exit; the
/// pipe's end without one (redis-lock died: the kernel closed its end) makes it SIGKILL
/// the group first. The parent-death signal reaches CMD's first process only; this
/// reaches what it started (`sh -c 'job & wait'`).
pub struct Watcher {
    pipe: libc::c_int,
    pid: libc::pid_t,
}

impl Watcher {
    pub fn start(pgid: libc::pid_t) -> io::Result<Watcher> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the array. O_CLOEXEC: CMD and its
        // children must not hold the write end (their exits would look like ours).
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let [read_end, write_end] = fds;
        // SAFETY: the child only calls async-signal-safe functions and never returns
        // (see `watch`); the parent closes the end it does not use.
        match unsafe { libc::fork() } {
            -1 => {
                let e = io::Error::last_os_error();
                // SAFETY: both descriptors are ours.
                unsafe {
                    libc::close(read_end);
                    libc::close(write_end);
                }
                Err(e)
            }
            0 => unsafe { watch(read_end, pgid) },
            pid => {
                // SAFETY: the read end is the watcher's now.
                unsafe { libc::close(read_end) };
                Ok(Watcher {
                    pipe: write_end,
                    pid,
                })
            }
        }
    }

    /// redis-lock ends normally: the watcher exits without touching the group.
    pub fn done(self) {
        let byte = 1u8;
        // SAFETY: a one-byte write from a live buffer into our pipe; then the watcher
        // exits at once and is reaped here.
        unsafe {
            libc::write(self.pipe, (&byte as *const u8).cast(), 1);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // SAFETY: our write end; closed once. Without a byte written first (`done`),
        // the watcher takes this for redis-lock's death.
        unsafe { libc::close(self.pipe) };
    }
}

/// The watcher's whole life, in the forked child of a multi-threaded process: only
/// async-signal-safe calls, no allocation.
unsafe fn watch(pipe: libc::c_int, pgid: libc::pid_t) -> ! {
    // Out of redis-lock's process group, so that a Ctrl-C meant for redis-lock does not
    // end it; holding none of redis-lock's files (its stdout may be a pipe that someone
    // reads to its end).
    libc::setpgid(0, 0);
    // The pipe out of the way first (it may be 0-2 if redis-lock ran with those closed).
    let high = libc::fcntl(pipe, libc::F_DUPFD, 10);
    if high < 0 {
        libc::_exit(1);
    }
    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
    for fd in 0..3 {
        if null >= 0 {
            libc::dup2(null, fd);
        }
    }
    let fd = libc::dup2(high, 3);
    if libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0 {
        for other in 4..1024 {
            libc::close(other);
        }
    }
    let mut byte = 0u8;
    let n = loop {
        let n = libc::read(fd, (&mut byte as *mut u8).cast(), 1);
        if n < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        break n;
    };
    if n != 1 {
        libc::kill(-pgid, libc::SIGKILL);
    }
    libc::_exit(0)
}
