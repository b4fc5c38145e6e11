//! The examples' logs: `tracing` to stderr, `info` and up unless `RUST_LOG`
//! says otherwise. A write error (stderr closed, a broken pipe) drops the
//! line: logging never panics and never stops the program.
#![allow(dead_code)] // shared by several examples, each using a part

use tracing_subscriber::EnvFilter;

/// Installs the subscriber; lines start with `name`.
pub fn init(name: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(false)
        .log_internal_errors(false)
        .fmt_fields(tracing_subscriber::fmt::format::DefaultFields::new())
        .event_format(Prefixed(name))
        .try_init();
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
