//! Issue 15, the relay example as an operator runs it: out of file
//! descriptors it keeps going and serves again as soon as it can; a
//! slowloris (a request head that never ends) and an idle connection are
//! closed by the header timeout; a broken stderr does not stop it.
#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// The relay example with `--header-timeout SECS`, optionally under a file
/// limit, on a port of its own; returns it and its address once it
/// accepts connections.
fn relay(file_limit: Option<u32>, header_timeout: u32, extra: &[&str]) -> (Proc, SocketAddr) {
    let tokens = tokens_file(&format!("abc {CONNECT_TOKEN}\n"));
    let bin = example_bin("relay");
    let mut cmd = match file_limit {
        Some(n) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(["--listen", "127.0.0.1:0"])
        .arg("--tokens")
        .arg(&tokens)
        .args(["--header-timeout", &header_timeout.to_string()])
        .args(extra);
    let p = Proc::spawn(cmd);
    let addr = p.listen_addr();
    (p, addr)
}

/// The worker example connected to the relay on `port`.
fn worker(port: u16, relay: &Proc) -> Proc {
    let w = worker_process(port, CONNECT_TOKEN);
    assert!(
        relay.wait_log("worker abc connected", Duration::from_secs(20)),
        "{}\n{}",
        relay.log(),
        w.log()
    );
    w
}

async fn health(addr: SocketAddr) -> Result<u16, String> {
    let h = [("authorization", auth())];
    let h: Vec<(&str, &str)> = h.iter().map(|(n, v)| (*n, v.as_str())).collect();
    match client::request(addr, "GET", "/w/abc/health", &h, Bytes::new()).await {
        Ok(a) if a.complete => Ok(a.status),
        Ok(a) => Err(format!("incomplete {}", a.status)),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether the server closes `s` within `within` (a read returns 0 or an
/// error), reading and discarding whatever it sends.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = Instant::now() + within;
    let mut buf = [0; 1024];
    while Instant::now() < end {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_relay_keeps_serving() {
    // The shortest header timeout (1 s): the flood's connections are
    // closed by it, a batch at a time.
    let (relay, addr) = relay(Some(64), 1, &[]);
    let _worker = worker(addr.port(), &relay);
    assert_eq!(health(addr).await, Ok(200));

    // One and a half times the file limit in idle connections: the relay
    // runs out of descriptors and its accept fails. (Each batch it takes
    // waits out the header timeout: more only takes longer.)
    let flood: Vec<TcpStream> = (0..96)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    assert!(
        relay.wait_log("accept failed", Duration::from_secs(10)),
        "the relay never ran out of descriptors: {}",
        relay.log()
    );
    // It stays up, and serves again once the header timeout has closed the
    // idle connections it took (the others wait in the backlog, then
    // time out in turn).
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        match health(addr).await {
            Ok(s) => break s,
            Err(e) => assert!(
                Instant::now() < end,
                "never served again: {e}\n{}",
                relay.log()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status, 200);
    drop(flood);
    for _ in 0..20 {
        assert_eq!(health(addr).await, Ok(200));
    }
    let mut relay = relay;
    assert_eq!(
        relay.wait_exit(Duration::from_millis(1)),
        None,
        "the relay exited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_idle_connections_are_closed_by_the_header_timeout() {
    let (relay, addr) = relay(None, 2, &[]);
    let _worker = worker(addr.port(), &relay);
    let started = Instant::now();
    // 100 slowloris connections: a head that grows a header every 500 ms
    // and never ends; and 100 that send nothing at all.
    let mut lorises: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /w/abc/health HTTP/1.1\r\nhost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    let mut idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        for s in &mut lorises {
            let _ = s.write_all(format!("x-drip-{round}: 1\r\n").as_bytes());
        }
        // Good requests are served meanwhile.
        assert_eq!(health(addr).await, Ok(200));
    }
    for (i, s) in lorises.iter_mut().chain(idle.iter_mut()).enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(5)),
            "connection {i} still open after {:?}",
            started.elapsed()
        );
    }
    // Generous for a loaded machine: the timeout closes them about 3.5 s
    // in (2 s after the last drip); a relay without a header timeout
    // never closes them (`closed_within` above fails first), and one that
    // timed out only on a later event would take minutes, not 30 s.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(health(addr).await, Ok(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stderr_does_not_stop_the_relay() {
    let tokens = tokens_file(&format!("abc {CONNECT_TOKEN}\n"));
    let mut relay = Command::new(example_bin("relay"))
        .args(["--listen", "127.0.0.1:0"])
        .arg("--tokens")
        .arg(&tokens)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its first line says where it listens; then stderr becomes a pipe
    // whose reader is gone: every later log line fails (EPIPE).
    let stderr = relay.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let addr = std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| addr_after(&l, "relay: listening on "));
        let _ = tx.send(addr);
        // The reader (and the pipe's read end) dropped here.
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(20))
        .ok()
        .flatten()
        .expect("the relay did not log where it listens within 20 s");
    let port = addr.port();
    let _worker = worker_process(port, CONNECT_TOKEN);
    // The worker connects (the relay logs it, into the broken pipe) and
    // stays reachable: nothing panicked, nothing was dropped.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if health(addr).await == Ok(200) {
            break;
        }
        assert!(Instant::now() < end, "the worker never became reachable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..10 {
        assert_eq!(health(addr).await, Ok(200));
    }
    assert!(relay.try_wait().unwrap().is_none(), "the relay exited");
    let _ = relay.kill();
    let _ = relay.wait();
}
