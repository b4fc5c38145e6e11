//! nginx for the scale-out test: its configuration from
//! `tests/scaleout/nginx.conf.template`, a private directory, and a guard
//! that stops it (and only it) on drop, panics included.
#![allow(dead_code)] // shared by the scale-out tests, each using a part

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../net/closed_port.rs"]
mod closed_port;
use closed_port::closed_port;

/// Whether process `pid` holds a TCP socket listening on `port` (Linux:
/// the inodes of `/proc/net/tcp`'s listening sockets on the port against
/// the sockets among the process's open files).
fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let local = format!(":{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local_address, st (0A: LISTEN), inode
            (f.len() > 9 && f[1].ends_with(&local) && f[3] == "0A").then(|| f[9].to_string())
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|link| {
            let link = link.to_string_lossy();
            inodes.iter().any(|i| link == format!("socket:[{i}]"))
        })
}

/// The template the test and `docs/scale-out.md` share.
pub const TEMPLATE: &str = include_str!("nginx.conf.template");

/// The configuration for nginx on `listen` in front of `relays`, every
/// file it writes under `dir`.
pub fn render(dir: &Path, listen: SocketAddr, relays: [SocketAddr; 3]) -> String {
    let mut conf = TEMPLATE
        .replace("@DIR@", &dir.display().to_string())
        .replace("@LISTEN@", &listen.to_string());
    for (i, relay) in relays.iter().enumerate() {
        conf = conf.replace(&format!("@RELAY{}@", i + 1), &relay.to_string());
    }
    assert!(!conf.contains('@'), "a placeholder was left: {conf}");
    conf
}

/// The `listen` line of the template, and what TLS at nginx makes of it
/// (`docs/scale-out.md` shows the same lines): `@CERT@` and `@KEY@` are the
/// PEM files of the certificate and its key.
pub const PLAIN_LISTEN: &str = "        listen @LISTEN@;\n";
pub const TLS_LISTEN: &str = "        listen @LISTEN@ ssl;
        ssl_certificate @CERT@;
        ssl_certificate_key @KEY@;
        ssl_protocols TLSv1.2 TLSv1.3;
";

/// [`render`]'s configuration with nginx terminating TLS on `listen`.
pub fn render_tls(
    dir: &Path,
    listen: SocketAddr,
    relays: [SocketAddr; 3],
    cert: &Path,
    key: &Path,
) -> String {
    let plain = PLAIN_LISTEN.replace("@LISTEN@", &listen.to_string());
    let tls = TLS_LISTEN
        .replace("@LISTEN@", &listen.to_string())
        .replace("@CERT@", &cert.display().to_string())
        .replace("@KEY@", &key.display().to_string());
    let conf = render(dir, listen, relays);
    assert!(conf.contains(&plain), "the template's listen line moved");
    conf.replace(&plain, &tls)
}

/// The nginx binary: `$NGINX`, else `nginx` on the PATH, else Debian's
/// `/usr/sbin/nginx` (not on a non-root PATH).
pub fn binary() -> PathBuf {
    let candidates = [
        std::env::var_os("NGINX").map(PathBuf::from),
        Some(PathBuf::from("nginx")),
        Some(PathBuf::from("/usr/sbin/nginx")),
    ];
    for bin in candidates.into_iter().flatten() {
        let ok = Command::new(&bin)
            .arg("-v")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return bin;
        }
    }
    panic!("nginx is not installed: run `bash .ci/scaleout` (it installs it with apt-get)");
}

/// A running nginx master (in the foreground: `daemon off;`), stopped on
/// drop: SIGTERM (nginx stops its workers), then SIGKILL for the master and
/// the workers it had if it is still there after 5 s.
pub struct Nginx {
    child: Child,
    pub dir: PathBuf,
}

impl Nginx {
    /// Starts nginx on a port of its own with the configuration `conf`
    /// makes for a listen address (`render`, `render_tls`), files under
    /// `dir`; returns it and that address once nginx itself listens there.
    ///
    /// nginx cannot listen on port 0, so the port is one where nothing
    /// listened a moment before ([`closed_port`]). If another process
    /// takes it first, nginx fails to bind and exits, and the next attempt
    /// takes another port; a connection that succeeds is not taken for
    /// nginx listening: only a listening socket of nginx's own process on
    /// the port is.
    pub fn start(dir: &Path, conf: impl Fn(SocketAddr) -> String) -> (Nginx, SocketAddr) {
        let mut failures = Vec::new();
        for _ in 0..5 {
            let addr = SocketAddr::from(([127, 0, 0, 1], closed_port()));
            match Nginx::start_on(dir, addr, &conf(addr)) {
                Ok(nginx) => return (nginx, addr),
                Err(why) => failures.push(format!("{addr}: {why}")),
            }
        }
        panic!("nginx did not start:\n{}", failures.join("\n"));
    }

    /// Starts nginx with `conf` written to `dir/nginx.conf`; returns once
    /// its master process holds a socket listening on `addr` (at most
    /// 10 s), or why not (it exited: the port taken, say).
    fn start_on(dir: &Path, addr: SocketAddr, conf: &str) -> Result<Nginx, String> {
        let file = dir.join("nginx.conf");
        std::fs::write(&file, conf).expect("write nginx.conf");
        let _ = std::fs::remove_file(dir.join("error.log"));
        let child = Command::new(binary())
            .arg("-c")
            .arg(&file)
            .arg("-p")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        let mut nginx = Nginx {
            child,
            dir: dir.to_path_buf(),
        };
        let end = Instant::now() + Duration::from_secs(10);
        while !listens_on(nginx.child.id(), addr.port()) {
            if let Ok(Some(status)) = nginx.child.try_wait() {
                let why = format!("nginx exited ({status}): {}", nginx.error_log());
                // Reaped: no signal to its pid (another process may have it).
                std::mem::forget(nginx);
                return Err(why);
            }
            assert!(
                Instant::now() < end,
                "nginx did not start: {}",
                nginx.error_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nginx)
    }

    /// nginx's error log so far (the last 4 KiB).
    pub fn error_log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
        let start = log.len().saturating_sub(4096);
        let start = (start..log.len())
            .find(|&i| log.is_char_boundary(i))
            .unwrap_or(log.len());
        log[start..].to_string()
    }

    /// The ids of the master's children (its worker processes).
    fn children(&self) -> Vec<u32> {
        let pid = self.child.id();
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid this test started; no memory is involved.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let workers = self.children();
        signal(self.child.id(), libc::SIGTERM);
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in workers {
            signal(pid, libc::SIGKILL);
        }
    }
}
