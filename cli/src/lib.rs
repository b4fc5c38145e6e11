//! The relay and the worker of the [Worker Relay Protocol] as programs:
//! what the binary `worker-relay` runs (`worker-relay relay …`,
//! `worker-relay worker …`), and what the repository's examples `relay` and
//! `worker` run too (each a few lines calling [`relay::main`] or
//! [`worker::main`]).
//!
//! This library exists for those programs (and the repository's demo,
//! tests and benchmarks, which share the worker's app and the log); it is
//! not an API to build on: use the crates `worker-relay` and
//! `worker-relay-hyper` for that.
//!
//! [Worker Relay Protocol]: https://docs.rs/worker-relay

pub mod relay;
pub mod worker;

pub mod logging;
pub mod worker_app;

mod admin;
mod runtime;
mod secrets;
mod shutdown;
mod tunnel_upstream;

/// A bad command line, as both programs answer it: the error and the
/// usage on stderr, status 2.
fn bad_command_line(program: &str, usage: &str, error: String) -> std::process::ExitCode {
    eprintln!("{program}: {error}\n{usage}\n({program} --help for more)");
    std::process::ExitCode::from(2)
}

/// `arg` unknown, or one of `with_value` without a valid value.
fn bad_option(
    program: &str,
    usage: &str,
    with_value: &[&str],
    arg: &str,
) -> std::process::ExitCode {
    if with_value.contains(&arg) {
        bad_command_line(program, usage, format!("{arg}: a missing or invalid value"))
    } else {
        bad_command_line(program, usage, format!("unknown option {arg}"))
    }
}
