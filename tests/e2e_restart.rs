//! Issue 25: an in-place restart of the relay example under a steady load.
//! A second relay takes the same port (`--reuse-port`) while the first
//! drains on `SIGTERM`; the worker moves over on its 1012; requests that
//! arrive before it has reconnected wait for it (`--reconnect-wait`).
//! Not one request fails.

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{auth, example_bin, tokens_file, worker_process, Proc, CONNECT_TOKEN};

/// The relay example on `port` (0: a port of its own); returns it and its
/// port once it listens.
fn relay(port: u16, tokens: &std::path::Path) -> (Proc, u16) {
    let mut cmd = Command::new(example_bin("relay"));
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--tokens")
        .arg(tokens)
        .args(["--reuse-port", "--reconnect-wait", "10", "--grace", "30"])
        .env("RUST_LOG", "info");
    let p = Proc::spawn(cmd);
    let port = p.listen_addr().port();
    (p, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_restart_under_load_fails_no_request() {
    let tokens = tokens_file(&format!("abc {CONNECT_TOKEN}\n"));
    let (mut old, port) = relay(0, &tokens);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        old.wait_log("worker abc connected", Duration::from_secs(20)),
        "{}",
        old.log()
    );

    // The load: 4 loops of small GETs on new connections, 1 of 1 s requests.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut loops = Vec::new();
    for i in 0..5 {
        let (stop, done, failures) = (stop.clone(), done.clone(), failures.clone());
        let target = if i == 4 {
            "/w/abc/sleep?ms=1000"
        } else {
            "/w/abc/health"
        };
        loops.push(tokio::spawn(async move {
            let a = auth();
            while !stop.load(Ordering::SeqCst) {
                let h = [("authorization", a.as_str())];
                let r = tokio::time::timeout(
                    Duration::from_secs(20),
                    client::request(addr, "GET", target, &h, Bytes::new()),
                )
                .await;
                match r {
                    Ok(Ok(a)) if a.status == 200 && a.complete => {
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(Ok(a)) => failures
                        .lock()
                        .unwrap()
                        .push(format!("{target}: {}", a.status)),
                    Ok(Err(e)) => failures.lock().unwrap().push(format!("{target}: {e}")),
                    Err(_) => failures
                        .lock()
                        .unwrap()
                        .push(format!("{target}: no answer in 20 s")),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The new relay on the same port, then the old one drains.
    let (new, _) = relay(port, &tokens);
    let restarted = Instant::now();
    assert_eq!(
        unsafe { libc::kill(old.child.id() as i32, libc::SIGTERM) },
        0
    );
    assert_eq!(
        old.wait_exit(Duration::from_secs(40)),
        Some(0),
        "{}",
        old.log()
    );
    assert!(
        new.wait_log("worker abc connected", Duration::from_secs(10)),
        "{}\n--- worker ---\n{}",
        new.log(),
        worker.log()
    );
    let moved = restarted.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        tokio::time::timeout(Duration::from_secs(30), l)
            .await
            .expect("the load ended")
            .unwrap();
    }
    let failures = failures.lock().unwrap();
    let done = done.load(Ordering::SeqCst);
    eprintln!(
        "e2e_restart: {done} requests answered, {} failed; the old relay drained and the worker \
         was on the new one {moved:?} after its start",
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert!(done >= 100, "{done} requests");
}
