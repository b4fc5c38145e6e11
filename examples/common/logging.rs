//! The examples' logs: `tracing` to stderr, `info` and up unless `RUST_LOG`
//! says otherwise, as text or, with `--log-format json`, one JSON object
//! per line. A write error (stderr closed, a broken pipe) drops the line:
//! logging never panics and never stops the program. The WebSocket
//! library's logs stay at `info` and above whatever `RUST_LOG` says: at
//! `trace` it logs the handshake's headers, the connect token among them.
#![allow(dead_code)] // shared by several examples, each using a part

#[path = "log_writer.rs"]
mod log_writer;

use tracing_subscriber::EnvFilter;

/// Whether the command line asks for `--log-format json` (`text`, the
/// default, otherwise); `None` for another value.
pub fn json_requested() -> Option<bool> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--log-format") {
        None => Some(false),
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("json") => Some(true),
            Some("text") => Some(false),
            _ => None,
        },
    }
}

/// Installs the subscriber; text lines start with `name`. Lines are
/// written by a thread of their own, access-log lines in batches
/// (`log_writer.rs`: a line per request must cost the serving threads
/// neither a write nor a wake-up): keep the guard until the program ends,
/// dropping it writes what is left.
#[must_use = "dropping the guard stops the log"]
pub fn init(name: &'static str) -> log_writer::Guard {
    let (writer, guard) = log_writer::start(std::io::stderr());
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive("tungstenite=info".parse().expect("a valid directive"))
        .add_directive("tokio_tungstenite=info".parse().expect("a valid directive"));
    if json_requested() == Some(true) {
        let _ = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_env_filter(filter)
            .with_writer(writer)
            .log_internal_errors(false)
            .try_init();
        return guard;
    }
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
    guard
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
        write!(writer, "{}: ", self.0)?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
