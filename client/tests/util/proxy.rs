//! A TCP proxy that delays what flows from the upstream (a primary) to the downstream
//! (its replica), and can be cut: what is still in flight then never arrives, as when
//! the primary's machine fails with bytes on the way. The other direction is not
//! delayed.

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
        let (flag, cut_flag) = (stop.clone(), cut.clone());
        thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        let _ = down.set_nonblocking(false);
                        if let Ok(up) = TcpStream::connect(upstream) {
                            pipe(up, down, delay, cut_flag.clone());
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        DelayProxy { port, stop, cut }
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

fn pipe(up: TcpStream, down: TcpStream, delay: Duration, cut: Arc<AtomicBool>) {
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
    thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            if cut.load(Ordering::SeqCst) || down_w.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = down_w.shutdown(Shutdown::Both);
        let _ = up_w.shutdown(Shutdown::Both);
    });
    // Downstream -> upstream, at once.
    let (mut down_r, mut up_w) = (down, up);
    thread::spawn(move || {
        let _ = std::io::copy(&mut down_r, &mut up_w);
        let _ = up_w.shutdown(Shutdown::Write);
    });
}
