//! A TCP proxy that delays what flows from the upstream (a primary) to the downstream
//! (its replica), and can be cut: what is still in flight then never arrives, as when
//! the primary's machine fails with bytes on the way. The other direction is not
//! delayed. It can also be frozen: nothing passes either way and no connection closes,
//! as with a server that stopped answering (its lease deadlines still run).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

pub struct DelayProxy {
    pub port: u16,
    stop: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`,
    /// holding back upstream bytes for `delay`.
    pub fn start(upstream: SocketAddr, delay: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let frozen = Arc::new(AtomicBool::new(false));
        let (flag, cut_flag, frozen_flag) = (stop.clone(), cut.clone(), frozen.clone());
        thread::spawn(move || {
            // Connections accepted while frozen stay open and silent.
            let mut parked = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) if frozen_flag.load(Ordering::SeqCst) => parked.push(down),
                    Ok((down, _)) => {
                        let _ = down.set_nonblocking(false);
                        if let Ok(up) = TcpStream::connect(upstream) {
                            pipe(up, down, delay, cut_flag.clone(), frozen_flag.clone());
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        DelayProxy {
            port,
            stop,
            cut,
            frozen,
        }
    }

    /// A proxy that passes everything at once (until frozen or cut).
    pub fn plain(upstream: SocketAddr) -> DelayProxy {
        DelayProxy::start(upstream, Duration::ZERO)
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// From now on nothing passes in either direction and nothing is closed: the
    /// server looks stopped to the clients that use the proxy.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// From now on nothing more reaches the downstream side, queued bytes included.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits while `frozen` is set (what would be written is held back).
fn thaw(frozen: &AtomicBool) {
    while frozen.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(10));
    }
}

fn pipe(
    up: TcpStream,
    down: TcpStream,
    delay: Duration,
    cut: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    // Upstream -> queue (stamped with when it may go on); at the upstream's end of
    // stream the queue drains, then the downstream side is closed.
    let mut up_r = up.try_clone().unwrap();
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = up_r.read(&mut buf) {
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
    let mut down_w = down.try_clone().unwrap();
    let up_w = up.try_clone().unwrap();
    let frozen_up = frozen.clone();
    thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            thaw(&frozen_up);
            if cut.load(Ordering::SeqCst) || down_w.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = down_w.shutdown(Shutdown::Both);
        let _ = up_w.shutdown(Shutdown::Both);
    });
    // Downstream -> upstream, at once (unless frozen).
    let (mut down_r, mut up_w) = (down, up);
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = down_r.read(&mut buf) {
            thaw(&frozen);
            if up_w.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = up_w.shutdown(Shutdown::Write);
    });
}
