//! `worker --exec 'CMD {url}'`: the kit starts the worker under test itself
//! (and starts a fresh one for each terminal case), with the tokens in the
//! worker's environment, never on its command line.
//!
//! The command runs under `sh -c` in a process group of its own, so
//! stopping it stops everything it started: `SIGTERM` to the group, then
//! `SIGKILL` after 5 s. The worker's stdout and stderr go to the kit's
//! stderr (the kit's report lines are on stdout).

use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::process::{Child, Command};

/// The environment variable a worker reads its connect token from (the spec's name).
pub const CONNECT_TOKEN_VAR: &str = "STRATA_WORKER_CONNECT_TOKEN";
/// The environment variable a worker reads its worker token from.
pub const WORKER_TOKEN_VAR: &str = "STRATA_WORKER_TOKEN";

/// The worker under test, started by the kit.
pub struct Exec {
    template: String,
    env: Vec<(&'static str, String)>,
    child: Option<Child>,
    /// How many times a worker was started.
    pub starts: u32,
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("template", &self.template)
            .field("starts", &self.starts)
            .finish_non_exhaustive()
    }
}

/// A token of 32 hex digits from the system's random source: `--exec`
/// makes up the tokens the environment does not give.
pub fn random_token(prefix: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().fold(prefix.to_string(), |mut s, x| {
        s.push_str(&format!("{x:02x}"));
        s
    }))
}

impl Exec {
    /// `template` with `{url}` where the connect URL goes; the worker gets
    /// `connect_token` and `worker_token` (if any) in its environment.
    pub fn new(template: String, connect_token: String, worker_token: Option<String>) -> Exec {
        let mut env = vec![(CONNECT_TOKEN_VAR, connect_token)];
        if let Some(t) = worker_token {
            env.push((WORKER_TOKEN_VAR, t));
        }
        Exec {
            template,
            env,
            child: None,
            starts: 0,
        }
    }

    /// The shell command for `url`.
    pub fn command_line(&self, url: &str) -> String {
        self.template.replace("{url}", url)
    }

    /// Starts a worker dialling `url` (stopping the one running, if any).
    pub async fn start(&mut self, url: &str) -> Result<(), String> {
        self.stop().await;
        let line = self.command_line(url);
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(&line)
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr().as_fd_owned()?))
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("--exec: cannot start `{line}`: {e}"))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// The worker's exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Waits up to `within` for the worker to exit.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        tokio::time::timeout(within, child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Stops the worker and everything it started: `SIGTERM` to its
    /// process group, `SIGKILL` after 5 s.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        if let Some(pid) = child.id() {
            signal_group(pid, "TERM").await;
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_ok()
            {
                signal_group(pid, "KILL").await; // what the shell left behind
                return;
            }
            signal_group(pid, "KILL").await;
        }
        let _ = child.kill().await;
    }
}

/// `kill -SIG -- -PGID`, through the `kill` program (no libc needed).
async fn signal_group(pgid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

trait AsFdOwned {
    fn as_fd_owned(&self) -> Result<std::os::fd::OwnedFd, String>;
}

impl AsFdOwned for std::io::Stderr {
    fn as_fd_owned(&self) -> Result<std::os::fd::OwnedFd, String> {
        use std::os::fd::AsFd;
        self.as_fd()
            .try_clone_to_owned()
            .map_err(|e| format!("--exec: {e}"))
    }
}

impl crate::worker_ctx::WorkerCtx {
    /// A fresh worker for a terminal case: the running one (if any) is
    /// stopped, dials it left queued are dropped, a new one is started and
    /// its first dial accepted. `Err` without `--exec`: the kit cannot
    /// start a worker itself.
    pub async fn restart_worker(&mut self) -> Result<(), String> {
        let url = format!("ws://{}/connect", self.local_addr());
        let Some(exec) = self.exec.as_mut() else {
            return Err("the kit cannot start a fresh worker without --exec".into());
        };
        if let Some(mut c) = self.conn.take() {
            c.close().await;
        }
        exec.stop().await;
        // Dials the stopped worker left in the listener's queue are not the new one's.
        while let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(20), self.listener.accept()).await
        {}
        exec.start(&url).await?;
        let (s, hs) = self.next_dial(self.t.wait).await?;
        self.conn = self
            .answer(s, &hs, crate::worker_ctx::Answer::Accept)
            .await?;
        Ok(())
    }
}
