//! The programs' logs (the relay's, the worker's, the demo's): `tracing`
//! to stderr, `info` and up unless `RUST_LOG` says otherwise, as text or,
//! with `--log-format json`, one JSON object per line. A write error (stderr closed, a broken pipe) drops the line:
//! logging never panics and never stops the program. Nor does it wait for
//! a stderr nobody reads: past 4 MiB unwritten, lines are dropped, and the
//! log says how many once stderr moves again (`log_writer.rs`). The WebSocket
//! library's logs stay at `info` and above whatever `RUST_LOG` says: at
//! `trace` it logs the handshake's headers, the connect token among them.
#![allow(dead_code)] // shared by several programs and tests, each using a part

#[path = "access_line.rs"]
mod access_line;
#[path = "log_writer.rs"]
mod log_writer;
/// Counts in log lines (`1 worker`, `2 workers`).
#[path = "plural.rs"]
pub mod plural;

use tracing_subscriber::EnvFilter;

/// Whether the command line's options `args` ask for `--log-format json`
/// (`text`, the default, otherwise); `None` for another value.
pub fn json_requested(args: &[String]) -> Option<bool> {
    match args.iter().position(|a| a == "--log-format") {
        None => Some(false),
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("json") => Some(true),
            Some("text") => Some(false),
            _ => None,
        },
    }
}

/// The program's log, from [`init`]: keep it until the program ends,
/// dropping it writes what is left.
#[must_use = "dropping the log stops it"]
pub struct Log {
    _guard: log_writer::Guard,
    access: Option<std::sync::Arc<access_line::TextAccessLog>>,
}

impl Log {
    /// For a gateway's access records (`GatewayBuilder::access_log`): in
    /// text, its lines written straight into the log (the same lines as
    /// the `tracing` events'); `None` in JSON, where the events stay.
    pub fn access_log(&self) -> Option<std::sync::Arc<dyn worker_relay_hyper::gateway::AccessLog>> {
        self.access.clone().map(|a| a as _)
    }
}

/// Installs the subscriber (one JSON object per line if `json`); text
/// lines start with `name`. Lines are written by a thread of their own,
/// access-log lines in batches (`log_writer.rs`: a line per request must
/// cost the serving threads neither a write nor a wake-up).
pub fn init(name: &'static str, json: bool) -> Log {
    let (writer, guard) = log_writer::start(std::io::stderr(), dropped_notice(name, json));
    let access = (!json)
        .then(|| std::sync::Arc::new(access_line::TextAccessLog::new(name, writer.access_lines())));
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive("tungstenite=info".parse().expect("a valid directive"))
        .add_directive("tokio_tungstenite=info".parse().expect("a valid directive"));
    if json {
        let _ = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_env_filter(filter)
            .with_writer(writer)
            .log_internal_errors(false)
            .try_init();
    } else {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_target(false)
            .without_time()
            .with_ansi(false)
            .log_internal_errors(false)
            .fmt_fields(tracing_subscriber::fmt::format::DefaultFields::new())
            .event_format(Prefixed(name))
            .try_init();
    }
    Log {
        _guard: guard,
        access,
    }
}

/// The line saying that `n` lines were dropped, in the log's format:
/// `<name>: N log lines dropped: …`, or a JSON object (a warning with the
/// field `dropped`).
pub fn dropped_notice(name: &'static str, json: bool) -> log_writer::Notice {
    Box::new(move |n| {
        let message = format!(
            "{} dropped: the output (stderr) was not taking them",
            plural::count(n as usize, "log line")
        );
        if json {
            let line = serde_json::json!({
                "level": "WARN",
                "message": message,
                "dropped": n,
                "target": "log",
            });
            format!("{line}\n")
        } else {
            format!("{name}: {message}\n")
        }
    })
}

/// `<name>: <message> key=value …`, as the examples have always logged.
struct Prefixed(&'static str);

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Prefixed
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        // `write_str`, not `write!`: a line per request.
        writer.write_str(self.0)?;
        writer.write_str(": ")?;
        if event.metadata().target() == worker_relay_hyper::gateway::ACCESS_TARGET {
            access_line::write_fields(&mut writer, event)?;
        } else {
            ctx.field_format().format_fields(writer.by_ref(), event)?;
        }
        writer.write_char('\n')
    }
}
