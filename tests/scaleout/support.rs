//! What the scale-out tests share (`tests/e2e_scaleout.rs`,
//! `tests/e2e_rolling.rs`): the workers' connect tokens, a private
//! directory, the relay example processes behind nginx, and a caller's
//! health check.
#![allow(dead_code)] // each test uses a part

use crate::client::request;
use crate::support::{auth, example_bin, scratch_dir, Proc};
use bytes::Bytes;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use worker_relay::connect::Token;

/// A connect token per worker (`w00`, `w01`, …), drawn at random for this
/// run (never on a command line or in a log: the relays read them from a
/// file, the worker processes from their environment).
pub fn connect_tokens(n: usize) -> Vec<(String, String)> {
    use std::hash::{BuildHasher, Hasher};
    (0..n)
        .map(|i| {
            let mut secret = String::from("ct-");
            for _ in 0..2 {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_usize(i);
                secret.push_str(&format!("{:016x}", h.finish()));
            }
            (format!("w{i:02}"), secret)
        })
        .collect()
}

/// The relays' tokens file for `tokens`.
pub fn tokens_text(tokens: &[(String, String)]) -> String {
    tokens.iter().map(|(id, t)| format!("{id} {t}\n")).collect()
}

pub fn token(secret: &str) -> Option<Token> {
    Some(Token::new(secret).unwrap())
}

/// A private directory for nginx and the tokens file (removed at the end).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new() -> Scratch {
        Scratch(scratch_dir("scaleout"))
    }

    /// The relays' tokens file for `tokens`, readable by this user only
    /// (the directory is readable by nginx's workers, user nobody).
    pub fn tokens_file(&self, tokens: &[(String, String)]) -> PathBuf {
        let file = self.0.join("tokens.txt");
        std::fs::write(&file, tokens_text(tokens)).unwrap();
        let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&file, owner_only).unwrap();
        file
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Three relay examples, each on a port of its own, sharing a tokens file
/// of `tokens` in `scratch`, each with `args` besides; once they listen.
pub fn three_relays(
    scratch: &Scratch,
    tokens: &[(String, String)],
    args: &[&str],
) -> (Vec<Proc>, Vec<SocketAddr>) {
    let file = scratch.tokens_file(tokens);
    let mut relays = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let (relay, port) = relay(0, &file, args);
        relays.push(relay);
        addrs.push(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    (relays, addrs)
}

/// The relay example on `port` (0: a port of its own), reading `tokens`,
/// with `args` besides; returns it and its port once it says it listens
/// (at most 20 s). With `--reuse-port` the port may already be taken by
/// another relay started so: a connection could reach that one, so only
/// the log says that this one listens.
pub fn relay(port: u16, tokens: &Path, args: &[&str]) -> (Proc, u16) {
    let mut cmd = Command::new(example_bin("relay"));
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--tokens")
        .arg(tokens)
        .args(args)
        .env("RUST_LOG", "info");
    let p = Proc::spawn(cmd);
    let port = p.listen_addr().port();
    (p, port)
}

/// The status of `GET /w/<id>/health` at `addr` (0: no complete answer
/// within 5 s).
pub async fn health(addr: SocketAddr, id: &str) -> u16 {
    let a = auth();
    let target = format!("/w/{id}/health");
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        request(addr, "GET", &target, &[("authorization", &a)], Bytes::new()),
    )
    .await;
    match r {
        Ok(Ok(answer)) if answer.complete => answer.status,
        _ => 0,
    }
}

/// How long after `since` each of `ids` answers 200 through nginx again
/// (polled every 50 ms, at most 20 s; `Duration::MAX`: never), and the
/// statuses seen meanwhile.
pub async fn recovery(
    nginx: SocketAddr,
    ids: &[String],
    since: Instant,
) -> Vec<(String, Duration, Vec<u16>)> {
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let id = id.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let end = since + Duration::from_secs(20);
                while Instant::now() < end {
                    let status = health(nginx, &id).await;
                    if status == 200 {
                        return (id, since.elapsed(), seen);
                    }
                    if seen.last() != Some(&status) {
                        seen.push(status);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (id, Duration::MAX, seen)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}
