//! Issue 39, the examples' command lines and wording: `--help` prints the
//! help to stdout and exits 0 (the relay's and the worker's), an unknown
//! option still exits 2 with the error on stderr, and a count of one is
//! logged in the singular (`1 worker`, not `1 workers`).

#[path = "../cli/src/plural.rs"]
mod plural;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use std::process::{Command, Stdio};
use std::time::Duration;
use support::{example_bin, tokens_file, Proc, CONNECT_TOKEN};

/// Runs an example to its end (it exits at once for these arguments);
/// returns its status, stdout and stderr.
fn run(example: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(example_bin(example))
        .args(args)
        .stdin(Stdio::null())
        .env_remove("STRATA_WORKER_CONNECT_TOKEN")
        .env_remove("STRATA_WORKER_TOKEN")
        .output()
        .expect("run the example");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_goes_to_stdout_and_exits_0() {
    for example in ["relay", "worker"] {
        for flag in ["--help", "-h"] {
            let (code, stdout, stderr) = run(example, &[flag]);
            assert_eq!(code, Some(0), "{example} {flag}: {stderr}");
            assert!(
                stdout.contains(&format!("usage: {example} ")),
                "{example} {flag}: the usage on stdout: {stdout:?}"
            );
            assert!(
                stdout.contains("exit status"),
                "{example} {flag}: the exit statuses documented: {stdout}"
            );
            assert!(stderr.is_empty(), "{example} {flag}: stderr {stderr:?}");
        }
        // After other arguments too, even ones that are wrong.
        let (code, stdout, _) = run(example, &["--threads", "0", "--help"]);
        assert_eq!(code, Some(0), "{example}");
        assert!(stdout.contains("usage:"), "{example}: {stdout}");
    }
    // The relay documents the status of a drain its grace cut.
    let (_, stdout, _) = run("relay", &["--help"]);
    assert!(stdout.contains("--grace"), "{stdout}");
    assert!(stdout.contains("3 "), "{stdout}");
}

#[test]
fn an_unknown_option_exits_2_with_the_error_on_stderr() {
    for example in ["relay", "worker"] {
        let (code, stdout, stderr) = run(example, &["--no-such-option"]);
        assert_eq!(code, Some(2), "{example}: {stderr}");
        assert!(stdout.is_empty(), "{example}: stdout {stdout:?}");
        assert!(
            stderr.contains("--no-such-option"),
            "{example}: the error names the option: {stderr}"
        );
        assert!(stderr.contains("usage:"), "{example}: {stderr}");
        // A known option without its value.
        let (code, _, stderr) = run(example, &["--threads"]);
        assert_eq!(code, Some(2), "{example}: {stderr}");
        assert!(stderr.contains("--threads"), "{example}: {stderr}");
    }
}

#[test]
fn counts_are_singular_for_one() {
    assert_eq!(plural::count(0, "worker"), "0 workers");
    assert_eq!(plural::count(1, "worker"), "1 worker");
    assert_eq!(plural::count(2, "request"), "2 requests");
    assert_eq!(plural::count(1, "connection"), "1 connection");
}

#[test]
fn a_reload_of_one_worker_says_1_worker() {
    let tokens = tokens_file(&format!("abc {CONNECT_TOKEN}\nidle ct-idle-worker-token\n"));
    let mut cmd = Command::new(example_bin("relay"));
    cmd.arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--tokens")
        .arg(&tokens)
        .env("RUST_LOG", "info");
    let relay = Proc::spawn(cmd);
    // Up (it logged where it listens) before the signal.
    relay.listen_addr();
    let hup = |p: &Proc| {
        let pid = p.child.id() as i32;
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    };
    hup(&relay);
    assert!(
        relay.wait_log("2 workers;", Duration::from_secs(10)),
        "{}",
        relay.log()
    );
    std::fs::write(&tokens, format!("abc {CONNECT_TOKEN}\n")).unwrap();
    hup(&relay);
    assert!(
        relay.wait_log("reloaded", Duration::from_secs(10))
            && relay.wait_log(": 1 worker;", Duration::from_secs(10)),
        "{}",
        relay.log()
    );
    assert!(!relay.log().contains("1 workers"), "{}", relay.log());
}

/// A supervisor (or a test) that signals the relay as soon as it has read
/// the `listening on` line finds the handlers there: a `SIGHUP` reloads,
/// a `SIGTERM` drains (exit 0), neither kills the process with the
/// default action. The handlers used to be installed after that line, in
/// a task spawned later.
#[test]
fn a_signal_right_after_the_listening_line_is_handled() {
    use std::io::{BufRead, BufReader};
    let tokens = tokens_file(&format!("abc {CONNECT_TOKEN}\n"));
    for round in 0..20 {
        let mut child = Command::new(example_bin("relay"))
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--tokens")
            .arg(&tokens)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the relay");
        let pid = child.id() as i32;
        let (signal, expect) = if round % 2 == 0 {
            (libc::SIGHUP, "SIGHUP: reloaded")
        } else {
            (libc::SIGTERM, "SIGTERM: draining")
        };
        // Read by a thread of its own that hands each line over at once,
        // so the signal follows the line without a polling delay and every
        // wait below is bounded.
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let wait_for = |needle: &str| loop {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(l) if l.contains(needle) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        };
        assert!(
            wait_for("listening on"),
            "round {round}: the relay never said it listens"
        );
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        // The relay logs the line at once, or dies, which ends the stream.
        let seen = wait_for(expect);
        let _ = child.kill();
        let status = child.wait().unwrap();
        assert!(
            seen,
            "round {round}: signal {signal} was not handled (exit {status:?})"
        );
    }
}
