//! The text of an access-log line (one per request, target
//! `worker_relay::access`), written without `tracing-subscriber`'s
//! general field formatter: the same bytes as its `DefaultFields`, with
//! the numbers written by hand and each field in one pass, rather than
//! several `fmt` calls per field through the formatter's writer. A line
//! per request is the relay's largest single cost after the system calls
//! (BENCHMARKS.md, issue 42). Any other event keeps `DefaultFields`.
//!
//! The relay program's text log does not even make the event:
//! [`TextAccessLog`] is the gateway's [`AccessLog`], and writes each
//! record's line, the same bytes, straight into the log's batch.

use super::log_writer::AccessLines;
use std::cell::RefCell;
use std::fmt::{self, Write};
use tracing::field::{Field, Visit};
use worker_relay_hyper::gateway::{AccessLog, AccessRecord, ACCESS_TARGET};

/// The text log's access lines, without a `tracing` event: `<name>: access
/// worker=… peer=…`, as [`write_fields`] writes the event after the
/// program's prefix. `RUST_LOG` still decides whether there are any (the
/// target [`ACCESS_TARGET`] at `info`).
pub struct TextAccessLog {
    name: &'static str,
    out: AccessLines,
}

impl TextAccessLog {
    pub fn new(name: &'static str, out: AccessLines) -> TextAccessLog {
        TextAccessLog { name, out }
    }
}

thread_local! {
    /// Each serving thread's line, reused.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl AccessLog for TextAccessLog {
    fn record(&self, record: &AccessRecord<'_>) {
        if !tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO) {
            return;
        }
        LINE.with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                return; // not reentered: nothing here logs
            };
            line.clear();
            if write_record(&mut line, self.name, record).is_ok() {
                self.out.push(line.as_bytes());
            }
            if line.capacity() > 4096 {
                *line = String::new(); // a rare long line is not kept
            }
        });
    }
}

/// `record`'s line, as `Prefixed` and [`write_fields`] write its event.
pub fn write_record(out: &mut String, name: &str, r: &AccessRecord<'_>) -> fmt::Result {
    let mut number = itoa::Buffer::new();
    out.push_str(name);
    out.push_str(": access worker=");
    out.push_str(r.worker);
    out.push_str(" method=");
    out.push_str(r.method);
    out.push_str(" path=");
    out.push_str(r.path);
    out.push_str(" status=");
    out.push_str(r.status);
    out.push_str(" bytes_up=");
    out.push_str(number.format(r.bytes_up));
    out.push_str(" bytes_down=");
    out.push_str(number.format(r.bytes_down));
    out.push_str(" duration_ms=");
    write_ms(out, r.duration.as_micros())?;
    out.push_str(" end=");
    out.push_str(r.end);
    out.push_str(" peer=");
    match r.peer {
        // As `SocketAddr` writes it, without `fmt`: the common case.
        Some(std::net::SocketAddr::V4(a)) => {
            for (i, octet) in a.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(number.format(octet));
            }
            out.push(':');
            out.push_str(number.format(a.port()));
        }
        _ => write!(out, "{}", r.peer_text())?,
    }
    out.push('\n');
    Ok(())
}

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
    write_thousandths(out, thousandths as u64)
}

/// `micros` µs in milliseconds, as [`write_f64`] writes `micros / 1000`
/// (a double), without the double below 10^15 µs.
fn write_ms(out: &mut dyn Write, micros: u128) -> fmt::Result {
    match u64::try_from(micros) {
        Ok(t) if t < 1_000_000_000_000_000 => write_thousandths(out, t),
        _ => write_f64(out, micros as f64 / 1000.0),
    }
}

/// `thousandths / 1000` with the digits `Debug` writes: the fraction without
/// its trailing zeros, `.0` when whole.
fn write_thousandths(out: &mut dyn Write, thousandths: u64) -> fmt::Result {
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
    // `frac` on `digits` places, zeros first.
    let mut text = [b'0'; 3];
    for place in text[..digits].iter_mut().rev() {
        *place = b'0' + (frac % 10) as u8;
        frac /= 10;
    }
    text[..digits]
        .iter()
        .try_for_each(|&d| out.write_char(char::from(d)))
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

    /// Records of every kind the gateway makes, and some it could.
    fn records() -> Vec<AccessRecord<'static>> {
        let mut all = Vec::new();
        let long: &'static str = format!("/w/abc/{}", "x".repeat(1017)).leak();
        let cut: &'static str = "é".repeat(511).leak();
        for (i, (worker, method, path)) in [
            ("abc", "GET", "/w/abc/health"),
            ("unknown", "POST", "/"),
            ("abc", "PURGE", "/a b/\"q\"/\\/é"),
            ("w-1_x", "HEAD", long),
            ("abc", "OPTIONS", cut),
        ]
        .into_iter()
        .enumerate()
        {
            for (j, (status, end)) in [
                ("200", "completed"),
                ("-", "caller_gone"),
                ("aborted", "worker_abort"),
                ("503", "answered"),
            ]
            .into_iter()
            .enumerate()
            {
                let mut r = AccessRecord::new(worker, method, path);
                r.status = status;
                r.end = end;
                r.bytes_up = [0, 1, 1 << 40, u64::MAX][j];
                r.bytes_down = [15, 0, u64::MAX, 7][(i + j) % 4];
                r.duration = std::time::Duration::from_micros(
                    [0, 1, 1022, 123_456_789, 999_999_999_999_999][(i + j) % 5],
                );
                r.peer = [
                    None,
                    Some("127.0.0.1:50474".parse().unwrap()),
                    Some("[::1]:8080".parse().unwrap()),
                    Some("255.255.255.255:65535".parse().unwrap()),
                    Some("0.0.0.0:0".parse().unwrap()),
                    Some("10.20.3.0:443".parse().unwrap()),
                ][(i * 3 + j) % 6];
                all.push(r);
            }
        }
        all
    }

    #[test]
    fn a_records_line_is_its_events_line() {
        let records = records();
        let seen = lines(|| records.iter().for_each(AccessRecord::trace));
        assert_eq!(seen.len(), records.len());
        for (r, (theirs, _)) in records.iter().zip(&seen) {
            let mut ours = String::new();
            write_record(&mut ours, "relay", r).unwrap();
            assert_eq!(ours, format!("relay: {theirs}\n"));
        }
        let mut first = String::new();
        write_record(&mut first, "relay", &records[0]).unwrap();
        assert_eq!(first, "relay: access worker=abc method=GET path=/w/abc/health status=200 bytes_up=0 bytes_down=15 duration_ms=0.0 end=completed peer=-\n");
    }

    /// The text log's access lines, through the log's batch, with
    /// `RUST_LOG`-style `filter`.
    fn logged(filter: &str, records: &[AccessRecord<'_>]) -> String {
        #[derive(Clone, Default)]
        struct Out(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Out {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Out::default();
        let (writer, guard) =
            super::super::log_writer::start(out.clone(), Box::new(|_| String::new()));
        let log = TextAccessLog::new("relay", writer.access_lines());
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(writer)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            records.iter().for_each(|r| log.record(r))
        });
        drop(guard); // writes the batch
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn the_text_log_writes_each_record_unless_told_not_to() {
        let records = records();
        let text = logged("info", &records);
        let mut expected = String::new();
        for r in &records {
            write_record(&mut expected, "relay", r).unwrap();
        }
        assert_eq!(text, expected);
        assert_eq!(logged("info,worker_relay::access=off", &records), "");
        assert_eq!(logged("warn", &records), "");
        assert_eq!(
            logged("worker_relay::access=info", &records[..1])
                .lines()
                .count(),
            1
        );
    }

    #[test]
    fn microseconds_are_written_as_their_milliseconds_double_is() {
        let around = |c: u128| c.saturating_sub(3)..c + 3;
        let edges = [
            0,
            1000,
            1 << 53,
            1_000_000_000_000_000,
            u64::MAX as u128,
            u128::MAX - 3,
        ];
        for micros in (0..5_000u128).chain(edges.into_iter().flat_map(around)) {
            let (mut direct, mut through) = (String::new(), String::new());
            write_ms(&mut direct, micros).unwrap();
            write_f64(&mut through, micros as f64 / 1000.0).unwrap();
            assert_eq!(direct, through, "{micros} µs");
        }
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
