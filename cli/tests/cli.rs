//! The installed binary `worker-relay` (issue 43): its commands, `--help`
//! and `--version`, a bad command line's status, and a relay and a worker
//! of this binary serving a request on loopback, the worker's tokens gone
//! from its environment, both stopping with status 0 on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_worker-relay");
const CONNECT_TOKEN: &str = "ct-cli-0123456789abcdef0123456789";
const WORKER_TOKEN: &str = "wt-cli-fedcba9876543210fedcba9876";

/// `worker-relay ARGS`, run to its end (each of these exits at once), with
/// no token in its environment.
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .env_remove("STRATA_WORKER_CONNECT_TOKEN")
        .env_remove("STRATA_WORKER_TOKEN")
        .output()
        .expect("run worker-relay");
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn version_prints_the_crate_version() {
    for flag in ["--version", "-V"] {
        let (code, stdout, stderr) = run(&[flag]);
        assert_eq!(code, Some(0), "{flag}: {stderr}");
        assert_eq!(
            stdout,
            format!("worker-relay {}\n", env!("CARGO_PKG_VERSION"))
        );
        assert!(stderr.is_empty(), "{stderr:?}");
    }
}

#[test]
fn help_names_both_commands_and_exits_0() {
    for flag in ["--help", "-h", "help"] {
        let (code, stdout, stderr) = run(&[flag]);
        assert_eq!(code, Some(0), "{flag}: {stderr}");
        assert!(
            stdout.contains("usage: worker-relay relay --listen"),
            "{stdout}"
        );
        assert!(stdout.contains("worker-relay worker --connect"), "{stdout}");
        assert!(stdout.contains("exit status"), "{stdout}");
        assert!(stderr.is_empty(), "{flag}: stderr {stderr:?}");
    }
}

#[test]
fn each_commands_help_documents_its_options_and_exits_0() {
    let relay_options = [
        "--listen",
        "--tokens",
        "--tls-cert",
        "--tls-key",
        "--max-connections",
        "--header-timeout",
        "--grace",
        "--reconnect-wait",
        "--reuse-port",
        "--threads",
        "--stall-timeout",
        "--overflow-budget",
        "--admin",
        "--log-format",
    ];
    let worker_options = [
        "--connect",
        "--ca-file",
        "--allow-insecure",
        "--upstream",
        "--upstream-connections",
        "--listen",
        "--threads",
        "--admin",
        "--log-format",
    ];
    for (command, options) in [
        ("relay", &relay_options[..]),
        ("worker", &worker_options[..]),
    ] {
        for flag in ["--help", "-h"] {
            let (code, stdout, stderr) = run(&[command, flag]);
            assert_eq!(code, Some(0), "{command} {flag}: {stderr}");
            assert!(
                stdout.starts_with(&format!("usage: worker-relay {command} ")),
                "{command}: {stdout}"
            );
            assert!(stdout.contains("exit status"), "{command}: {stdout}");
            for option in options {
                assert!(
                    stdout.contains(&format!("\n  {option} ")),
                    "{command} --help documents {option}: {stdout}"
                );
            }
            assert!(stderr.is_empty(), "{command} {flag}: stderr {stderr:?}");
        }
    }
}

#[test]
fn a_bad_command_line_exits_2_with_the_usage_on_stderr() {
    for args in [&[][..], &["nonsense"], &["--listen"]] {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout:?}");
        assert!(
            stderr.contains("usage: worker-relay relay"),
            "{args:?}: {stderr}"
        );
    }
    for command in ["relay", "worker"] {
        let (code, stdout, stderr) = run(&[command, "--no-such-option"]);
        assert_eq!(code, Some(2), "{command}: {stderr}");
        assert!(stdout.is_empty(), "{command}: {stdout:?}");
        assert!(
            stderr.contains(&format!(
                "worker-relay {command}: unknown option --no-such-option"
            )),
            "{command}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("usage: worker-relay {command} ")),
            "{command}: {stderr}"
        );
        let (code, _, stderr) = run(&[command, "--threads"]);
        assert_eq!(code, Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains("--threads: a missing or invalid value"),
            "{stderr}"
        );
    }
}

/// A child process with its stderr collected; killed on drop.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn worker-relay");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (err, sink) = (child.stderr.take().expect("piped"), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Proc { child, lines }
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The first line holding `needle`, waiting at most `within`.
    fn wait_line(&self, needle: &str, within: Duration) -> Option<String> {
        let end = Instant::now() + within;
        loop {
            let found = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
                .cloned();
            if found.is_some() || Instant::now() >= end {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the exit status (at most `within`).
    fn terminate(&mut self, within: Duration) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET target` on a new connection, `Connection: close`; the status code.
fn get(addr: SocketAddr, target: &str) -> u16 {
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        tcp,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {WORKER_TOKEN}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).expect("read the answer");
    let head = String::from_utf8_lossy(&answer);
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{head}"))
}

#[test]
fn a_relay_and_a_worker_of_this_binary_serve_a_request() {
    let dir = std::env::temp_dir().join(format!("worker-relay-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens.txt");
    std::fs::write(&tokens, format!("abc {CONNECT_TOKEN}\n")).unwrap();

    let mut relay = Proc::spawn(
        Command::new(BIN)
            .args(["relay", "--listen", "127.0.0.1:0", "--tokens"])
            .arg(&tokens)
            .args(["--threads", "1"]),
    );
    let marker = "relay: listening on ";
    let line = relay
        .wait_line(marker, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no listening line: {}", relay.log()));
    let rest = &line[line.find(marker).unwrap() + marker.len()..];
    let addr: SocketAddr = rest.split(' ').next().unwrap().parse().expect("an address");

    let mut worker = Proc::spawn(
        Command::new(BIN)
            .args([
                "worker",
                "--connect",
                &format!("ws://{addr}/connect"),
                "--threads",
                "1",
            ])
            .env("STRATA_WORKER_CONNECT_TOKEN", CONNECT_TOKEN)
            .env("STRATA_WORKER_TOKEN", WORKER_TOKEN),
    );
    assert!(
        relay
            .wait_line("worker abc connected", Duration::from_secs(20))
            .is_some(),
        "--- relay ---\n{}\n--- worker ---\n{}",
        relay.log(),
        worker.log()
    );
    assert_eq!(get(addr, "/w/abc/health"), 200);
    assert_eq!(get(addr, "/w/nobody/health"), 404);

    // The installed worker wipes its tokens as the example does.
    let environ = std::fs::read(format!("/proc/{}/environ", worker.child.id())).unwrap();
    for token in [CONNECT_TOKEN, WORKER_TOKEN] {
        assert!(
            !environ.windows(token.len()).any(|w| w == token.as_bytes()),
            "a token is readable in the worker's /proc/<pid>/environ"
        );
    }

    assert_eq!(
        worker.terminate(Duration::from_secs(40)),
        Some(0),
        "{}",
        worker.log()
    );
    assert_eq!(
        relay.terminate(Duration::from_secs(40)),
        Some(0),
        "{}",
        relay.log()
    );
    for log in [relay.log(), worker.log()] {
        assert!(
            !log.contains(CONNECT_TOKEN) && !log.contains(WORKER_TOKEN),
            "{log}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
