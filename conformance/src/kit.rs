//! One run of the kit: the mode's context and cases, the report.

use crate::cli::{Config, Mode};
use crate::exec::Exec;
use crate::relay_ctx::RelayCtx;
use crate::report::{self, CaseResult};
use crate::runner::{self, Case};
use crate::worker_ctx::WorkerCtx;
use crate::{
    relay_cases_caller, relay_cases_conn, relay_cases_faults, relay_cases_http, worker_cases_conn,
    worker_cases_streams,
};
use crate::{
    relay_cases_interactive, relay_cases_token, relay_cases_unread, worker_cases_interactive,
};
use crate::{relay_cases_slow, worker_cases_bounds};

pub fn relay_cases() -> Vec<Case<RelayCtx>> {
    let mut c = relay_cases_conn::cases();
    // The handshake first, then the streams, then the cases that end the connection.
    let tail = c.split_off(7);
    c.extend(relay_cases_token::cases());
    c.extend(relay_cases_http::cases());
    c.extend(relay_cases_caller::cases());
    c.extend(relay_cases_faults::cases());
    c.extend(relay_cases_interactive::cases());
    c.extend(tail);
    c.extend(relay_cases_slow::cases());
    c.extend(relay_cases_unread::cases());
    c
}

pub fn worker_cases() -> Vec<Case<WorkerCtx>> {
    let mut c = worker_cases_streams::cases();
    c.extend(crate::worker_cases_responses::cases());
    c.extend(worker_cases_interactive::cases());
    c.extend(worker_cases_bounds::cases());
    c.extend(crate::worker_cases_robust::cases());
    c.extend(worker_cases_conn::cases());
    // The cases that leave the worker refused for good come last.
    c.sort_by_key(|c| c.terminal);
    c
}

/// What a run came to.
pub struct Run {
    pub mode: &'static str,
    pub target: String,
    pub results: Vec<CaseResult>,
}

/// Runs `cfg`, printing each line as it comes when `print`. `Err`: the
/// peer could not be reached at all (the listener could not bind, the
/// worker never dialled).
pub async fn run(cfg: &Config, print: bool) -> Result<Run, String> {
    let line = |r: &CaseResult| {
        if print {
            println!("{}", r.line());
        }
    };
    match &cfg.mode {
        Mode::Relay(t) => {
            let target = format!("http://{} worker {}", t.authority, t.worker_id);
            let mut ctx = RelayCtx::new(t.clone());
            let results = runner::run(&relay_cases(), &mut ctx, &cfg.selection, line).await;
            Ok(Run {
                mode: "relay",
                target,
                results,
            })
        }
        Mode::Worker(t) => {
            let mut ctx = WorkerCtx::bind(t.clone())
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", t.listen))?;
            let addr = ctx.local_addr();
            let url = format!("ws://{addr}/connect");
            if let Some(template) = &t.exec {
                let token = t.token.clone().unwrap_or_default();
                let mut exec = Exec::new(template.clone(), token, t.worker_token.clone());
                if print {
                    eprintln!("conformance: starting `{}`", exec.command_line(&url));
                }
                exec.start(&url).await?;
                ctx.exec = Some(exec);
            }
            if print {
                eprintln!(
                    "conformance: waiting up to {} s for the worker to dial {url}",
                    t.wait.as_secs()
                );
            }
            let first = match ctx.next_dial(t.wait).await {
                Ok(d) => d,
                Err(e) => {
                    let exited = ctx.exec.as_mut().and_then(|x| x.exited());
                    if let Some(x) = ctx.exec.as_mut() {
                        x.stop().await;
                    }
                    return Err(match exited {
                        Some(status) => format!("{e}: the worker exited ({status})"),
                        None => e,
                    });
                }
            };
            let (s, hs) = first;
            ctx.first = Some(hs.clone());
            ctx.conn = ctx
                .answer(s, &hs, crate::worker_ctx::Answer::Accept)
                .await?;
            let results = runner::run(&worker_cases(), &mut ctx, &cfg.selection, line).await;
            if let Some(x) = ctx.exec.as_mut() {
                x.stop().await;
            }
            Ok(Run {
                mode: "worker",
                target: format!("worker dialling {url} (app {})", t.app.name()),
                results,
            })
        }
    }
}

/// Writes the JSON report.
pub fn write_json(path: &str, run: &Run) -> std::io::Result<()> {
    let v = report::json(run.mode, &run.target, &run.results);
    std::fs::write(
        path,
        serde_json::to_string_pretty(&v).unwrap_or_default() + "\n",
    )
}

/// Writes the JUnit XML report.
pub fn write_junit(path: &str, run: &Run, strict: bool) -> std::io::Result<()> {
    std::fs::write(
        path,
        crate::junit::xml(run.mode, &run.target, &run.results, strict),
    )
}
