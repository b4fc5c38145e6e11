//! Command line: the mode, its target and the run's options. Tokens are
//! read from environment variables named on the command line, never given
//! on it.

use crate::runner::Selection;
use std::time::Duration;

pub const USAGE: &str = "\
usage:
  worker-relay-conformance relay  --url http://HOST:PORT --worker-id ID [--token-env VAR]
                                  [--connect-path /connect] [--prefix /w/] [options]
      plays a worker (dials ws://HOST:PORT/connect with the connect token in
      $VAR, default STRATA_WORKER_CONNECT_TOKEN) and the HTTP callers of
      http://HOST:PORT/w/ID/...
  worker-relay-conformance worker [--exec 'CMD {url}'] [--listen HOST:PORT] [--token-env VAR]
                                  [--worker-token-env VAR] [--app example|strata|health-only]
                                  [--wait SECS] [--final-wait SECS] [options]
      plays the relay: the worker under test dials ws://HOST:PORT/connect
      (--listen, default 127.0.0.1:0 with --exec, else 127.0.0.1:9000).
      --exec: the kit starts the worker itself with `sh -c CMD`, {url}
      replaced by the connect URL, and starts a fresh one for each terminal
      case; the worker gets STRATA_WORKER_CONNECT_TOKEN and
      STRATA_WORKER_TOKEN in its environment (made up if the variables
      below are unset), never on its command line.
      --token-env: the connect token the worker must present (default
      STRATA_WORKER_CONNECT_TOKEN); --worker-token-env: the worker token sent
      in each request's Authorization (default STRATA_WORKER_TOKEN);
      --app: which routes the worker's app has (default health-only);
      --wait: how long to wait for the worker's first dial (default 60);
      --final-wait: how long a worker refused with 401 must stay away
      (default 10; with --exec its exit ends the wait).
options:
  --case PATTERN   only the cases whose id contains PATTERN (* is a wildcard)
  --list           list the cases and exit
  --long           also run the long cases (~20-40 s each)
  --strict         a WARN (a recommendation, not a rule of the spec) fails the run
  --json FILE      write a JSON report to FILE
  --junit FILE     write a JUnit XML report to FILE
exit status: 0 no case failed (skips and warnings allowed, unless --strict),
1 a case failed, 2 bad usage or the peer could not be reached";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum App {
    /// The crate's example worker (examples/worker.rs): every route.
    Example,
    /// Strata's executor protocol: `/health`, `/v1/execute`.
    Strata,
    /// Only `GET /health`.
    HealthOnly,
}

impl App {
    pub fn name(self) -> &'static str {
        match self {
            App::Example => "example",
            App::Strata => "strata",
            App::HealthOnly => "health-only",
        }
    }
}

#[derive(Clone)]
pub struct RelayTarget {
    /// `host:port` of the relay.
    pub authority: String,
    pub worker_id: String,
    pub connect_path: String,
    pub prefix: String,
    /// The connect token (read from the environment).
    pub token: String,
}

#[derive(Clone)]
pub struct WorkerTarget {
    pub listen: String,
    /// The connect token the worker must present, if known.
    pub token: Option<String>,
    pub token_env: String,
    /// The worker token for requests' Authorization, if known.
    pub worker_token: Option<String>,
    pub app: App,
    pub wait: Duration,
    /// How long a refused worker must stay away (the final-refusal case).
    pub final_wait: Duration,
    /// `--exec`: the command that starts the worker under test (`{url}` for its connect URL).
    pub exec: Option<String>,
}

// Debug without the tokens: a `{:?}` in a log or a panic must not show them.
impl std::fmt::Debug for RelayTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayTarget")
            .field("authority", &self.authority)
            .field("worker_id", &self.worker_id)
            .field("connect_path", &self.connect_path)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for WorkerTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerTarget")
            .field("listen", &self.listen)
            .field("token_env", &self.token_env)
            .field("app", &self.app)
            .field("wait", &self.wait)
            .field("final_wait", &self.final_wait)
            .field("exec", &self.exec)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub enum Mode {
    Relay(RelayTarget),
    Worker(WorkerTarget),
}

#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub selection: Selection,
    pub list: bool,
    /// `--strict`: a WARN fails the run.
    pub strict: bool,
    pub json: Option<String>,
    pub junit: Option<String>,
}

fn env_token(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

pub fn parse(args: &[String]) -> Result<Config, String> {
    let mut it = args.iter();
    let mode = it.next().ok_or("no mode given")?.clone();
    let mut opts: Vec<(String, Option<String>)> = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--list" | "--long" | "--strict" => opts.push((a.clone(), None)),
            "--url" | "--worker-id" | "--token-env" | "--connect-path" | "--prefix"
            | "--listen" | "--worker-token-env" | "--app" | "--wait" | "--final-wait"
            | "--case" | "--json" | "--junit" | "--exec" => {
                let v = it.next().ok_or(format!("{a} needs a value"))?;
                opts.push((a.clone(), Some(v.clone())));
            }
            "--token" => {
                return Err("tokens are read from the environment: use --token-env VAR".into())
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    let get = |name: &str| {
        opts.iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.clone())
    };
    let has = |name: &str| opts.iter().any(|(n, _)| n == name);
    let list = has("--list");
    let selection = Selection {
        pattern: get("--case"),
        long: has("--long"),
    };
    let secs = |name: &str, default: u64| -> Result<Duration, String> {
        match get(name) {
            None => Ok(Duration::from_secs(default)),
            Some(v) => v
                .parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|_| format!("{name}: not a number of seconds")),
        }
    };
    let mode = match mode.as_str() {
        "relay" => {
            let url = get("--url").unwrap_or_else(|| "http://127.0.0.1:8080".into());
            let authority = url
                .strip_prefix("http://")
                .ok_or("--url must be http://HOST:PORT")?
                .trim_end_matches('/')
                .to_string();
            if authority.contains('/') || authority.is_empty() {
                return Err("--url must be http://HOST:PORT (no path)".into());
            }
            let token_env =
                get("--token-env").unwrap_or_else(|| "STRATA_WORKER_CONNECT_TOKEN".into());
            let token = match env_token(&token_env) {
                Some(t) => t,
                None if list => String::new(),
                None => {
                    return Err(format!(
                        "${token_env} is not set: the connect token the relay gives --worker-id"
                    ))
                }
            };
            let prefix = get("--prefix").unwrap_or_else(|| "/w/".into());
            if !prefix.starts_with('/') || !prefix.ends_with('/') {
                return Err("--prefix must start and end with /".into());
            }
            Mode::Relay(RelayTarget {
                authority,
                worker_id: get("--worker-id").unwrap_or_else(|| "abc".into()),
                connect_path: get("--connect-path").unwrap_or_else(|| "/connect".into()),
                prefix,
                token,
            })
        }
        "worker" => {
            let token_env =
                get("--token-env").unwrap_or_else(|| "STRATA_WORKER_CONNECT_TOKEN".into());
            let wt_env = get("--worker-token-env").unwrap_or_else(|| "STRATA_WORKER_TOKEN".into());
            let exec = get("--exec");
            if exec.as_deref().is_some_and(|e| !e.contains("{url}")) {
                return Err(
                    "--exec: the command must contain {url}, where the connect URL goes".into(),
                );
            }
            // With --exec the kit gives the worker its tokens: made up if the
            // environment has none, so every case runs.
            let made_up = |prefix: &str, var: &str| -> Result<Option<String>, String> {
                match (env_token(var), &exec) {
                    (Some(t), _) => Ok(Some(t)),
                    (None, Some(_)) if !list => crate::exec::random_token(prefix)
                        .map(Some)
                        .map_err(|e| format!("--exec: no random source for a token: {e}")),
                    (None, _) => Ok(None),
                }
            };
            let token = made_up("ct-", &token_env)?;
            let worker_token = made_up("wt-", &wt_env)?;
            let app = match get("--app").as_deref() {
                None | Some("health-only") => App::HealthOnly,
                Some("example") => App::Example,
                Some("strata") => App::Strata,
                Some(other) => {
                    return Err(format!(
                        "--app {other}: one of example, strata, health-only"
                    ))
                }
            };
            let listen = get("--listen").unwrap_or_else(|| {
                if exec.is_some() {
                    "127.0.0.1:0"
                } else {
                    "127.0.0.1:9000"
                }
                .into()
            });
            Mode::Worker(WorkerTarget {
                listen,
                token,
                token_env,
                worker_token,
                app,
                wait: secs("--wait", 60)?,
                final_wait: secs("--final-wait", 10)?,
                exec,
            })
        }
        other => return Err(format!("unknown mode {other}: relay or worker")),
    };
    Ok(Config {
        mode,
        selection,
        list,
        strict: has("--strict"),
        json: get("--json"),
        junit: get("--junit"),
    })
}
