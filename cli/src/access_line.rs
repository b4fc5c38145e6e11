//! The text of an access-log line (one per request, target
//! `worker_relay::access`), written without `tracing-subscriber`'s
//! general field formatter: the same bytes as its `DefaultFields`, with
//! the numbers written by hand and each field in one pass, rather than
//! several `fmt` calls per field through the formatter's writer. A line
//! per request is the relay's largest single cost after the system calls
//! (BENCHMARKS.md, issue 42). Any other event keeps `DefaultFields`.

use std::fmt::{self, Write};
use tracing::field::{Field, Visit};

/// Writes `event`'s fields as `DefaultFields` does: the message first
/// (as it is recorded first), then ` name=value` for each field, values
/// in their `Debug` form.
pub fn write_fields(writer: &mut dyn Write, event: &tracing::Event<'_>) -> fmt::Result {
    let mut fields = Fields {
        out: writer,
        first: true,
        result: Ok(()),
    };
    event.record(&mut fields);
    fields.result
}

struct Fields<'a> {
    out: &'a mut dyn Write,
    /// Nothing written yet: no space before the next field.
    first: bool,
    result: fmt::Result,
}

impl Fields<'_> {
    /// The separator and `name=` (nothing for the message).
    fn name(&mut self, field: &Field) -> fmt::Result {
        if !std::mem::take(&mut self.first) {
            self.out.write_char(' ')?;
        }
        match field.name() {
            "message" => Ok(()),
            name => {
                self.out.write_str(name)?;
                self.out.write_char('=')
            }
        }
    }

    fn field(&mut self, field: &Field, value: impl FnOnce(&mut dyn Write) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self.name(field).and_then(|()| value(&mut *self.out));
        }
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, |out| write!(out, "{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.field(field, |out| out.write_str(value));
        } else {
            self.field(field, |out| write!(out, "{value:?}"));
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field, |out| write_f64(out, value));
    }
}

/// `value` as its `Debug` form writes it. Milliseconds to the microsecond
/// (the access line's `duration_ms`) by hand: a value that is exactly the
/// nearest double to a number of thousandths below 10^12 is written as
/// that number, whose digits are then the shortest that read back as the
/// value (any shorter decimal is at least a thousandth away, far beyond
/// the double's spacing there), as `Debug` writes them, with `.0` when
/// whole. Anything else goes through `Debug`.
fn write_f64(out: &mut dyn Write, value: f64) -> fmt::Result {
    let thousandths = (value * 1000.0).round();
    if value.is_sign_negative() || thousandths >= 1e15 || thousandths / 1000.0 != value {
        return write!(out, "{value:?}");
    }
    let thousandths = thousandths as u64;
    let (whole, mut frac) = (thousandths / 1000, thousandths % 1000);
    out.write_str(itoa::Buffer::new().format(whole))?;
    out.write_char('.')?;
    if frac == 0 {
        return out.write_char('0');
    }
    let mut digits = 3;
    while frac % 10 == 0 {
        frac /= 10;
        digits -= 1;
    }
    write!(out, "{frac:0digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::FormatFields;

    /// Every event's fields, as `DefaultFields` writes them and as
    /// [`write_fields`] does.
    #[derive(Clone, Default)]
    struct Both(Arc<Mutex<Vec<(String, String)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Both {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut theirs = String::new();
            tracing_subscriber::fmt::format::DefaultFields::new()
                .format_fields(Writer::new(&mut theirs), event)
                .unwrap();
            let mut ours = String::new();
            write_fields(&mut ours, event).unwrap();
            self.0.lock().unwrap().push((theirs, ours));
        }
    }

    fn lines(emit: impl FnOnce()) -> Vec<(String, String)> {
        use tracing_subscriber::layer::SubscriberExt;
        let both = Both::default();
        let subscriber = tracing_subscriber::registry().with(both.clone());
        tracing::subscriber::with_default(subscriber, emit);
        let lines = both.0.lock().unwrap().clone();
        lines
    }

    #[test]
    fn fields_are_written_as_default_fields_writes_them() {
        let peer: std::net::SocketAddr = "127.0.0.1:50474".parse().unwrap();
        let v6: std::net::SocketAddr = "[::1]:8080".parse().unwrap();
        let seen = lines(|| {
            // The access line's own kinds of fields.
            for (micros, path) in [
                (1022u64, "/w/abc/health"),
                (0, "/"),
                (1, "/a b/\"q\"/\\/é"),
                (10, "/x"),
                (100, "/x"),
                (1000, "/x"),
                (123_456_789, "/x"),
                (999_999_999_999_999, "/x"),
                (u64::MAX, "/x"),
            ] {
                tracing::info!(
                    target: "worker_relay::access",
                    worker = %"abc",
                    method = %http::Method::GET,
                    path = %path,
                    status = %"200",
                    bytes_up = 0u64,
                    bytes_down = 15u64,
                    duration_ms = micros as f64 / 1000.0,
                    end = %"completed",
                    peer = %peer,
                    "access"
                );
            }
            // Every other kind of field, and none in the message's place.
            tracing::info!(peer = %v6, n = -3i64, big = i64::MIN, yes = true, s = "quoted \"s\"", d = ?Some(1), "message {}", 7);
            tracing::info!(r#type = "raw", first = 1u64);
            tracing::info!(
                x = 0.1f64,
                y = 1e-7f64,
                z = 1e300f64,
                w = f64::NAN,
                v = -2.5f64,
                u = 3.0f64,
                t = 1e16f64
            );
            tracing::info!("only a message");
        });
        assert_eq!(seen.len(), 13);
        for (theirs, ours) in &seen {
            assert_eq!(ours, theirs);
        }
        assert!(seen[0].1.starts_with("access worker=abc method=GET path=/w/abc/health status=200 bytes_up=0 bytes_down=15 duration_ms=1.022 end=completed peer=127.0.0.1:50474"), "{}", seen[0].1);
        assert!(seen[1].1.contains("duration_ms=0.0 "), "{}", seen[1].1);
    }

    #[test]
    fn milliseconds_are_written_as_debug_writes_them() {
        let mut n: u64 = 1;
        for micros in (0..20_000u64).chain((0..64).map(|_| {
            // A spread of large values too (a fixed sequence, no seed).
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            n >> 12
        })) {
            let v = micros as f64 / 1000.0;
            let mut ours = String::new();
            write_f64(&mut ours, v).unwrap();
            assert_eq!(ours, format!("{v:?}"), "{micros} µs");
        }
        for v in [
            0.1,
            0.3 - 0.2,
            1.0005,
            -0.0,
            -1.0,
            f64::INFINITY,
            f64::NAN,
            1e-300,
        ] {
            let mut ours = String::new();
            write_f64(&mut ours, v).unwrap();
            assert_eq!(ours, format!("{v:?}"), "{v}");
        }
    }
}
