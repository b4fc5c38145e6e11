//! Issue 25: a worker's redeploy, and two processes given one token, with
//! real relay and worker processes under a steady load. A new connection
//! of a connected worker replaces the old one as a GOAWAY would: new
//! requests go to the new one, the old one finishes its own and is then
//! closed (4000, "replaced by a new connection"), and the worker example
//! that gets that close waits its longest backoff (30-60 s) before it dials
//! again, so it does not take the worker back. Not one request fails.

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{auth, pattern, worker_process, Proc};
use support::{CONNECT_TOKEN, WORKER_TOKEN};

/// The relay example on a port of its own; returns it and its port.
fn relay() -> (Proc, u16) {
    support::relay_process()
}

fn sigterm(p: &Proc) {
    assert_eq!(unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) }, 0);
}

/// A steady load on worker `abc`: loops of small GETs, of 1 MiB uploads
/// echoed back (checked byte for byte), and of `long`-ms requests, each on
/// a new connection; every answer that is not a complete 200 with the
/// expected body is a failure.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, long_ms: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let mut loops = Vec::new();
        let long = format!("/w/abc/sleep?ms={long_ms}");
        let kinds = [
            ("GET", "/w/abc/health".to_string()),
            ("GET", "/w/abc/health".to_string()),
            ("GET", "/w/abc/health".to_string()),
            ("POST", "/w/abc/echo".to_string()),
            ("GET", long),
        ];
        for (method, target) in kinds {
            let (stop, done, failures) = (stop.clone(), done.clone(), failures.clone());
            loops.push(tokio::spawn(async move {
                let a = auth();
                let body = if method == "POST" {
                    pattern(1 << 20)
                } else {
                    Bytes::new()
                };
                while !stop.load(Ordering::SeqCst) {
                    let h = [("authorization", a.as_str())];
                    let r = tokio::time::timeout(
                        Duration::from_secs(40),
                        client::request(addr, method, &target, &h, body.clone()),
                    )
                    .await;
                    let fail = match r {
                        Ok(Ok(a)) if a.status == 200 && a.complete => {
                            if method == "POST" && a.body != body {
                                Some(format!("{target}: the echo differs"))
                            } else {
                                done.fetch_add(1, Ordering::SeqCst);
                                None
                            }
                        }
                        Ok(Ok(a)) => Some(format!(
                            "{target}: {} {}",
                            a.status,
                            String::from_utf8_lossy(&a.body).trim()
                        )),
                        Ok(Err(e)) => Some(format!("{target}: {e}")),
                        Err(_) => Some(format!("{target}: no answer in 40 s")),
                    };
                    if let Some(f) = fail {
                        failures.lock().unwrap().push(f);
                    }
                }
            }));
        }
        Load {
            stop,
            done,
            failures,
            loops,
        }
    }

    /// Stops the load once each loop's request in flight has ended: the
    /// requests answered, and the failures.
    async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for l in self.loops {
            tokio::time::timeout(Duration::from_secs(60), l)
                .await
                .expect("the load ended")
                .unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.done.load(Ordering::SeqCst), failures)
    }
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_redeploy_under_load_fails_no_request() {
    let (relay, port) = relay();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut old = worker_process(port, CONNECT_TOKEN);
    assert!(
        relay.wait_log("worker abc connected", Duration::from_secs(20)),
        "{}",
        relay.log()
    );
    let load = Load::start(addr, 3000);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The redeploy: the new process first; once it serves, SIGTERM to the
    // old one, whose long request is still in flight.
    let new = worker_process(port, CONNECT_TOKEN);
    assert!(
        relay.wait_log("worker abc reconnected", Duration::from_secs(20)),
        "{}",
        relay.log()
    );
    assert!(
        new.wait_log("connected to", Duration::from_secs(5)),
        "{}",
        new.log()
    );
    sigterm(&old);
    assert_eq!(
        old.wait_exit(Duration::from_secs(40)),
        Some(0),
        "{}",
        old.log()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (done, failures) = load.finish().await;
    let log = relay.log();
    eprintln!(
        "e2e_redeploy: {done} requests answered, {} failed, {} replacement(s)",
        failures.len(),
        count(&log, "worker abc reconnected")
    );
    assert!(failures.is_empty(), "{failures:?}\n--- relay ---\n{log}");
    assert!(done >= 50, "{done} requests");
    // One replacement: the old process did not take the worker back.
    assert_eq!(count(&log, "worker abc reconnected"), 1, "{log}");
    assert!(!log.contains(CONNECT_TOKEN) && !log.contains(WORKER_TOKEN));
    // The old connection ended as a replaced one (the worker is still
    // connected): by the relay once idle, or by the old process's own
    // drain (1001) if SIGTERM came first.
    assert!(
        relay.wait_log(
            "worker abc: its replaced connection ended",
            Duration::from_secs(5)
        ),
        "{}",
        relay.log()
    );
    assert!(
        !relay.log().contains("worker abc disconnected"),
        "{}",
        relay.log()
    );
}

/// The slow tier: `cargo test` skips these (`#[ignore]`, each says why);
/// `.ci/slow` runs them (`cargo test -- --ignored slow::`).
mod slow {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: two worker processes with one token for 60 s of real time: the flap damping's backoff between replacements is what is measured"]
    async fn two_processes_with_one_token_replace_each_other_rarely_and_lose_nothing() {
        let (relay, port) = relay();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let _first = worker_process(port, CONNECT_TOKEN);
        assert!(
            relay.wait_log("worker abc connected", Duration::from_secs(20)),
            "{}",
            relay.log()
        );
        let started = Instant::now();
        // A 20 s request on the serving connection, then the duplicate.
        let load = Load::start(addr, 20_000);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _second = worker_process(port, CONNECT_TOKEN);
        while started.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let (done, failures) = load.finish().await;
        let log = relay.log();
        let replaced = count(&log, "worker abc reconnected");
        eprintln!(
            "e2e_redeploy: two processes, one token, 60 s: {done} requests answered, {} failed, \
         {replaced} replacement(s)",
            failures.len()
        );
        assert!(failures.is_empty(), "{failures:?}\n--- relay ---\n{log}");
        assert!((1..=5).contains(&replaced), "{replaced}\n{log}");
        assert!(done >= 100, "{done} requests");
    }
}
