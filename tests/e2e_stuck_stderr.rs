//! Issue 39, the examples' log writer: a relay whose stderr is a pipe
//! nobody reads keeps serving. With the access log on, every request
//! produces a line; past the writer's bound (4 MiB unwritten) lines are
//! dropped, not waited for, and once stderr is read again the relay says
//! how many it dropped.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "support/example_bin.rs"]
mod example_bin;
use example_bin::example_bin;

/// Kills the relay when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The port in the relay's first `listening on 127.0.0.1:PORT` line on
/// `stderr`, read a byte at a time so that nothing after that line is
/// consumed (at most 20 s); returns it and the unread rest of `stderr`.
fn listening_port(mut stderr: std::process::ChildStderr) -> (u16, std::process::ChildStderr) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while let Ok(1) = stderr.read(&mut byte) {
            if byte[0] != b'\n' {
                line.push(byte[0]);
                continue;
            }
            let text = String::from_utf8_lossy(&line).into_owned();
            if let Some(rest) = text.split("listening on 127.0.0.1:").nth(1) {
                let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                let _ = tx.send(port.parse::<u16>().ok().map(|p| (p, stderr)));
                return;
            }
            line.clear();
        }
        let _ = tx.send(None);
    });
    rx.recv_timeout(Duration::from_secs(20))
        .ok()
        .flatten()
        .expect("the relay did not log where it listens within 20 s")
}

/// Requests on one connection: paths of 1000 bytes (the access log keeps
/// up to 1024), so each line is over a KiB.
async fn requests(port: u16, n: usize) -> Result<(), String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let path = format!("/w/nobody/{}", "p".repeat(1000));
    for i in 0..n {
        let req = http::Request::get(path.as_str())
            .header("host", "relay")
            .body(Empty::<Bytes>::new())
            .unwrap();
        // A relay that stopped serving: 10 s is far above the time of a
        // request answered at once, even on a loaded machine.
        let answer = tokio::time::timeout(Duration::from_secs(10), async {
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            Ok::<_, hyper::Error>(status)
        })
        .await;
        match answer {
            Ok(Ok(status)) if status == 404 => {}
            Ok(Ok(status)) => return Err(format!("request {i}: {status}")),
            Ok(Err(e)) => return Err(format!("request {i}: {e}")),
            Err(_) => return Err(format!("request {i}: no answer in 10 s")),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_stderr_nobody_reads_keeps_serving() {
    let dir =
        std::env::temp_dir().join(format!("worker-relay-stuck-stderr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens.txt");
    std::fs::write(&tokens, "abc ct-0123456789abcdef0123456789abcdef\n").unwrap();
    let mut child = Command::new(example_bin("relay"))
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--tokens")
        .arg(&tokens)
        .args(["--threads", "2"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read up to the line that says where it listens, then held, never
    // read until the requests are done.
    let stderr = child.stderr.take().unwrap();
    let _relay = Killed(child);
    let (port, mut stderr) = listening_port(stderr);

    // 8000 access lines of over a KiB: 8 MiB, twice the writer's bound
    // and far more than a pipe holds.
    let tasks: Vec<_> = (0..4).map(|_| tokio::spawn(requests(port, 2000))).collect();
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            panic!("the relay stopped serving while its stderr was stuck: {e}");
        }
    }

    // Read stderr again: the relay says how many lines it dropped.
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 << 10];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let end = Instant::now() + Duration::from_secs(30);
    let notice = loop {
        let text = String::from_utf8_lossy(&got.lock().unwrap()).into_owned();
        if let Some(line) = text.lines().find(|l| l.contains("log lines dropped")) {
            break line.to_owned();
        }
        assert!(
            Instant::now() < end,
            "no notice of the dropped lines in {} bytes of stderr",
            text.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("e2e_stuck_stderr: {notice}");
    assert!(notice.starts_with("relay: "), "{notice}");
    let dropped: u64 = notice
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .expect("a count");
    assert!(dropped > 0, "{notice}");
}
