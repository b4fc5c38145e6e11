//! Issue 14 end to end, with the examples as processes on loopback: one slow
//! or stalled caller costs only itself; a frozen worker fails its callers
//! within 45 s and reconnects when it thaws; a frozen relay is noticed by a
//! worker with a write pending. Each test takes about a minute of real time:
//! all are in the slow tier (`mod slow`, run by `.ci/slow`); their in-process
//! versions on injected time run in `cargo test`.

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use client::request;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const N: u64 = 100 << 20;

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: sends a signal to a child process this test started.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// `VmHWM` (peak RSS) of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmHWM")
}

/// The relay's open overflow files (unlinked temporary files in the temporary
/// directory, `TempFileOverflow`) and their bytes.
fn overflow_files(pid: u32) -> (usize, u64) {
    let mut n = 0;
    let mut bytes = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        if target.starts_with(std::env::temp_dir())
            && target.to_string_lossy().ends_with(" (deleted)")
        {
            n += 1;
            bytes += std::fs::metadata(e.path()).map(|m| m.len()).unwrap_or(0);
        }
    }
    (n, bytes)
}

/// A raw HTTP/1.1 GET whose body is read at `bytes_per_sec` (0: not at all).
struct Downloader {
    stream: tokio::net::TcpStream,
    got: Vec<u8>,
}

impl Downloader {
    async fn start(addr: SocketAddr, target: &str) -> Downloader {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "GET {target} HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\r\n",
            auth()
        );
        stream.write_all(req.as_bytes()).await.unwrap();
        Downloader {
            stream,
            got: Vec::new(),
        }
    }

    /// Reads for `d` at about `rate` bytes/s; false once the peer closed.
    async fn read_for(&mut self, d: Duration, rate: usize) -> bool {
        let end = Instant::now() + d;
        let step = Duration::from_millis(100);
        let mut buf = vec![0u8; (rate / 10).max(1)];
        while Instant::now() < end {
            match tokio::time::timeout(step, self.stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return false,
                Ok(Ok(n)) => self.got.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
            tokio::time::sleep(step).await;
        }
        true
    }

    /// Reads to the end as fast as it can, within `limit`.
    async fn read_rest(&mut self, limit: Duration) {
        let mut buf = vec![0u8; 1 << 20];
        let _ = tokio::time::timeout(limit, async {
            loop {
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => self.got.extend_from_slice(&buf[..n]),
                }
                if self.body().map(|b| b.len() as u64) == Some(N) {
                    return;
                }
            }
        })
        .await;
    }

    fn body(&self) -> Option<&[u8]> {
        let at = self.got.windows(4).position(|w| w == b"\r\n\r\n")?;
        Some(&self.got[at + 4..])
    }
}

/// The relay and worker examples as processes, the worker connected.
fn processes() -> (Proc, Proc, SocketAddr) {
    processes_with(&[])
}

/// [`processes`], the relay with `args` besides its listen address and tokens.
fn processes_with(args: &[&str]) -> (Proc, Proc, SocketAddr) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let (relay, port) = relay_process_with(&args);
    let worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        worker.wait_log("connected to", Duration::from_secs(20)),
        "{}",
        worker.log()
    );
    (relay, worker, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// The slow tier: `cargo test` skips these (`#[ignore]`, each says why);
/// `.ci/slow` runs them (`cargo test -- --ignored slow::`).
mod slow {
    use super::*;

    #[test]
    #[ignore = "slow: real processes on real time: a caller paced over 60 s beside a stalled one (in process, on injected time: tests/proto_isolation.rs, tests/rt_isolation.rs)"]
    fn a_slow_and_a_stalled_caller_cost_only_themselves() {
        let (relay, worker, addr) = processes();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let relay_pid = relay.child.id();
        rt.block_on(async {
        let target = format!("/w/abc/bytes?n={N}");
        let mut slow = Downloader::start(addr, &target).await;
        let mut stalled = Downloader::start(addr, &target).await;
        let stalled_task = tokio::spawn(async move {
            // Takes the head and a little, then nothing at all.
            stalled.read_for(Duration::from_secs(1), 100_000).await;
            tokio::time::sleep(Duration::from_secs(66)).await;
            let open = stalled.read_for(Duration::from_secs(3), 1 << 30).await;
            (open, stalled.got.len())
        });
        let slow_task = tokio::spawn(async move {
            slow.read_for(Duration::from_secs(62), 100_000).await;
            slow
        });
        // /health every 200 ms while both downloads are on.
        let a = auth();
        let mut times = Vec::new();
        let mut files_seen = (0, 0);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) {
            let t = Instant::now();
            let r = request(addr, "GET", "/w/abc/health", &[("authorization", a.as_str())], Bytes::new())
                .await
                .unwrap();
            assert_eq!(r.status, 200, "health at {:?}", t0.elapsed());
            times.push(t.elapsed());
            let f = overflow_files(relay_pid);
            files_seen = (files_seen.0.max(f.0), files_seen.1.max(f.1));
            tokio::time::sleep(Duration::from_millis(200).saturating_sub(t.elapsed())).await;
        }
        times.sort();
        let p99 = times[times.len() * 99 / 100];
        eprintln!(
            "health: {} answered, p50 {:?}, p99 {:?}, max {:?}; overflow seen: {} files, {} MiB at most",
            times.len(),
            times[times.len() / 2],
            p99,
            times.last().unwrap(),
            files_seen.0,
            files_seen.1 >> 20
        );
        // Not performance figures (BENCHMARKS.md has those), and generous
        // for a loaded machine: a health check queued behind the slow
        // downloads would wait for them, tens of seconds (the stalled one
        // is given up only at 60 s), so a handful of checks would fit in
        // the minute, not 100, and their p99 would be far over 10 s (145 ms
        // seen unloaded; 300 checks when each takes under 200 ms).
        assert!(times.len() >= 100, "{} health checks", times.len());
        assert!(p99 <= Duration::from_secs(10), "health p99 {p99:?}");
        assert!(files_seen.0 >= 1, "the slow responses went to the overflow");
        assert!(files_seen.1 <= 2 * N, "overflow bounded: {}", files_seen.1);

        // The stalled caller was given up at its deadline (60 s).
        let (open, got) = stalled_task.await.unwrap();
        assert!(!open, "the stalled caller's connection must be closed");
        assert!((got as u64) < N, "the stalled caller got {got} bytes");
        // The slow caller was never given up: read the rest, all of it.
        let mut slow = slow_task.await.unwrap();
        let before = slow.body().map_or(0, |b| b.len());
        slow.read_rest(Duration::from_secs(60)).await;
        let body = slow.body().expect("a response");
        eprintln!("slow caller: {before} bytes in 62 s at ~100 KB/s, then the rest");
        assert_eq!(body.len() as u64, N, "the slow download completes");
        assert!(
            body.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
            "bytes differ"
        );
        // Overflow removed once both streams are done.
        let deadline = Instant::now() + Duration::from_secs(10);
        while overflow_files(relay_pid).0 > 0 {
            assert!(Instant::now() < deadline, "overflow files left open");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
        let rss = peak_rss_kib(relay_pid);
        eprintln!("relay peak RSS: {} MiB", rss >> 10);
        assert!(rss <= 64 << 10, "relay peak RSS {} KiB", rss);
        // The worker's connection lived throughout.
        let log = worker.log();
        assert!(
            !log.contains("disconnected")
                && !log.contains("keepalive")
                && !log.contains("lost the relay"),
            "{log}"
        );
        assert!(!relay.log().contains("disconnected"), "{}", relay.log());
    }

    #[test]
    #[ignore = "slow: the real 45 s keepalive against a worker process frozen with SIGSTOP (on injected time: proto_isolation a_frozen_worker_fails_every_caller_within_40_s)"]
    fn a_frozen_worker_fails_its_callers_within_45_s_and_comes_back() {
        let (relay, worker, addr) = processes();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let pid = worker.child.id();
        rt.block_on(async {
            let a = auth();
            let h = [("authorization", a.as_str())];
            let call = |target: &'static str| {
                let a = a.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = request(
                        addr,
                        "GET",
                        target,
                        &[("authorization", a.as_str())],
                        Bytes::new(),
                    )
                    .await;
                    (r.map(|r| r.status).unwrap_or(0), t.elapsed())
                })
            };
            let in_flight = call("/w/abc/sleep?ms=3000");
            tokio::time::sleep(Duration::from_millis(300)).await;
            let t_stop = Instant::now();
            signal(pid, libc::SIGSTOP);
            tokio::time::sleep(Duration::from_millis(300)).await;
            let new_caller = call("/w/abc/health");
            let (s1, _) = in_flight.await.unwrap();
            let failed_after = t_stop.elapsed();
            let (s2, _) = new_caller.await.unwrap();
            eprintln!(
                "frozen worker: in-flight caller {s1} after {failed_after:?}, new caller {s2}"
            );
            assert_eq!(s1, 502);
            assert_eq!(s2, 502);
            // The keepalive gives up at most 40 s in (a ping every 20 s, 20 s
            // for its pong; its exact timing is held on virtual time in
            // proto_pair.rs). Generous for a loaded machine: without it, the
            // callers of a frozen worker would wait for ever.
            assert!(failed_after <= Duration::from_secs(90), "{failed_after:?}");
            assert!(
                relay.wait_log("keepalive timeout", Duration::from_secs(5)),
                "{}",
                relay.log()
            );
            signal(pid, libc::SIGCONT);
            // It thaws, finds its connection gone, and reconnects.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let r = request(addr, "GET", "/w/abc/health", &h, Bytes::new())
                    .await
                    .unwrap();
                if r.status == 200 {
                    break;
                }
                assert!(Instant::now() < deadline, "the worker did not come back");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    #[test]
    #[ignore = "slow: a relay process frozen with SIGSTOP: the worker's real keepalive with a write pending (in process: rt_isolation a_frozen_peer_is_dropped_even_with_a_write_pending)"]
    fn a_frozen_relay_is_noticed_by_a_worker_with_a_write_pending() {
        let (relay, worker, addr) = processes();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let pid = relay.child.id();
        rt.block_on(async {
            // A large response the worker is busy writing when the relay freezes.
            let mut d = Downloader::start(addr, "/w/abc/bytes?n=4294967296").await;
            d.read_for(Duration::from_millis(500), 1 << 30).await;
            let t_stop = Instant::now();
            signal(pid, libc::SIGSTOP);
            let noticed = tokio::task::spawn_blocking({
                let stderr = worker.stderr.clone();
                move || {
                    let end = Instant::now() + Duration::from_secs(120);
                    while Instant::now() < end {
                        if stderr
                            .lock()
                            .unwrap()
                            .iter()
                            .any(|l| l.contains("keepalive timeout"))
                        {
                            return true;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    false
                }
            })
            .await
            .unwrap();
            let took = t_stop.elapsed();
            signal(pid, libc::SIGCONT);
            eprintln!("frozen relay noticed by the worker after {took:?}");
            assert!(noticed, "{}", worker.log());
            // At most 40 s by the keepalive (exact on virtual time in
            // proto_pair.rs); generous for a loaded machine: without it, a
            // worker with a write pending to a frozen relay waits for ever.
            assert!(took <= Duration::from_secs(90), "{took:?}");
        });
        // The relay thaws; the worker reconnects.
        assert!(worker.wait_log("connected to", Duration::from_secs(30)));
    }

    /// Issue 14, item 4, with the examples' stacks in this process: a user of
    /// `RelayHandle::send_request` writes a 200 MiB body to the worker's echo
    /// and only then awaits the answer. The echo piles up unread meanwhile: it
    /// waits in the relay's overflow (temporary files) and the exchange
    /// completes, byte for byte.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: 200 MiB echoed through real processes: bulk, bound by throughput"]
    async fn sequential_write_then_await_of_a_200_mib_echo_completes() {
        use futures_util::{SinkExt, StreamExt};
        use worker_relay::frame::{Headers, RequestHead};
        const SIZE: usize = 200 << 20;
        tokio::time::timeout(Duration::from_secs(300), async {
            let (_addr, relay) = in_process_stack().await;
            let handle = relay.handle("abc").expect("connected");
            let len = SIZE.to_string();
            let headers = Headers::try_from_pairs([
                ("authorization", auth().as_str()),
                ("content-length", len.as_str()),
            ])
            .unwrap();
            let head = RequestHead::new("POST", "/echo", "", headers).unwrap();
            let (mut sink, response) = handle.send_request(head).unwrap();
            let piece = pattern(1 << 20);
            let t0 = Instant::now();
            for i in 0..SIZE >> 20 {
                if let Err(e) = sink.send(piece.clone()).await {
                    panic!(
                        "the upload stopped at {i} MiB after {:?}: {e}; {:?}",
                        t0.elapsed(),
                        handle.stats()
                    );
                }
            }
            eprintln!("uploaded 200 MiB in {:?}", t0.elapsed());
            sink.close().await.unwrap();
            let resp = response.await.expect("the echo's head");
            assert_eq!(resp.head.status(), 200);
            let mut body = resp.body;
            let mut got = 0usize;
            while let Some(p) = body.next().await {
                let p = p.expect("the echo completes");
                // The echo is the body again: `piece` repeated.
                let mut at = 0;
                while at < p.len() {
                    let off = (got + at) % (1 << 20);
                    let n = (p.len() - at).min((1 << 20) - off);
                    assert!(
                        p[at..at + n] == piece[off..off + n],
                        "bytes differ at {}",
                        got + at
                    );
                    at += n;
                }
                got += p.len();
            }
            assert_eq!(got, SIZE);
            assert_eq!(handle.stats().overflow_bytes, 0);
        })
        .await
        .expect("took too long");
    }

    /// `--overflow-budget`: past it a stalled caller's stream is given up and
    /// the log says why (the access log's `end=overflow` alone does not); with
    /// 0 nothing goes to disk, and a caller that reads gets everything while a
    /// stalled one is given up at the read-pause bound. Each case: a stalled
    /// download of 100 MiB, a /health beside it.
    #[test]
    #[ignore = "slow: 100 MiB stalled downloads through real processes and the read-pause bound on real time (the budget in process: tests/rt_overflow_budget.rs)"]
    fn the_overflow_budget_bounds_the_disk_and_the_log_says_why_a_stream_ends() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let target = format!("/w/abc/bytes?n={N}");
        let health = |addr| async move {
            let a = auth();
            let r = request(
                addr,
                "GET",
                "/w/abc/health",
                &[("authorization", a.as_str())],
                Bytes::new(),
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200);
        };

        // 8 MiB on disk for everyone: the stalled stream is given up there.
        let (relay, _worker, addr) = processes_with(&["--overflow-budget", "8388608"]);
        rt.block_on(async {
            let mut stalled = Downloader::start(addr, &target).await;
            stalled.read_for(Duration::from_secs(1), 100_000).await;
            assert!(
                relay.wait_log("overflow store: cannot keep more", Duration::from_secs(30)),
                "the reason is logged: {}",
                relay.log()
            );
            health(addr).await;
            // Its caller learns when it reads again; the access log then.
            let _ = stalled.read_for(Duration::from_secs(1), 1 << 30).await;
            drop(stalled);
            assert!(
                relay.wait_log("end=overflow", Duration::from_secs(30)),
                "{}",
                relay.log()
            );
        });
        assert!(relay.log().contains("budget"), "{}", relay.log());
        assert_eq!(overflow_files(relay.child.id()).0, 0, "files freed");
        drop(relay);

        // None on disk: a caller that reads gets all of it, no file is made,
        // and a stalled one is given up when reading stays paused 10 s.
        let (relay, _worker, addr) = processes_with(&["--overflow-budget", "0"]);
        let pid = relay.child.id();
        rt.block_on(async {
            let mut stalled = Downloader::start(addr, &target).await;
            stalled.read_for(Duration::from_secs(1), 100_000).await;
            let mut reader = Downloader::start(addr, &target).await;
            let reading = tokio::spawn(async move {
                reader.read_rest(Duration::from_secs(60)).await;
                reader
            });
            let mut files = 0;
            while !reading.is_finished() {
                files = files.max(overflow_files(pid).0);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let reader = reading.await.unwrap();
            assert_eq!(files, 0, "nothing on disk");
            assert_eq!(
                reader.body().map(|b| b.len() as u64),
                Some(N),
                "{}",
                relay.log()
            );
            let _ = stalled.read_for(Duration::from_secs(1), 1 << 30).await;
            drop(stalled);
            assert!(
                relay.wait_log("end=stall", Duration::from_secs(30)),
                "{}",
                relay.log()
            );
            health(addr).await;
        });
    }
}
