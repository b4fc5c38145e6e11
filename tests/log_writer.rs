//! The examples' log writer (`examples/common/log_writer.rs`): ordinary
//! lines go out at once, access-log lines in batches, nothing is lost or
//! reordered, the guard writes the rest, and a stderr nobody reads holds
//! the writers back at the bound instead of growing without end.
#[path = "../examples/common/log_writer.rs"]
mod log_writer;

use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker_relay::gateway::ACCESS_TARGET;

/// A sink recording what it got and in how many writes; `gate` held
/// blocks it.
#[derive(Clone, Default)]
struct Sink {
    got: Arc<Mutex<(Vec<u8>, usize)>>,
    gate: Arc<Mutex<()>>,
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let _open = self.gate.lock().unwrap();
        let mut g = self.got.lock().unwrap();
        g.0.extend_from_slice(b);
        g.1 += 1;
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Sink {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.got.lock().unwrap().0).into_owned()
    }
    fn writes(&self) -> usize {
        self.got.lock().unwrap().1
    }
}

fn subscriber(writer: log_writer::BatchWriter) -> impl tracing::Subscriber {
    tracing_subscriber::fmt()
        .with_writer(writer)
        .without_time()
        .with_ansi(false)
        .with_target(false)
        .finish()
}

#[test]
fn ordinary_lines_go_out_at_once_and_access_lines_in_batches() {
    let sink = Sink::default();
    let (writer, guard) = log_writer::start(sink.clone());
    tracing::subscriber::with_default(subscriber(writer), || {
        tracing::info!("worker abc connected");
        let end = Instant::now() + Duration::from_secs(10);
        while !sink.text().contains("worker abc connected") {
            assert!(Instant::now() < end, "an ordinary line waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        let before = sink.writes();
        for i in 0..1000 {
            tracing::info!(target: ACCESS_TARGET, "access n={i}");
        }
        let end = Instant::now() + Duration::from_secs(10);
        while !sink.text().contains("access n=999") {
            assert!(Instant::now() < end, "access lines never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        let writes = sink.writes() - before;
        assert!(writes <= 100, "1000 access lines took {writes} writes");
    });
    drop(guard);
    let text = sink.text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("access n=")).collect();
    assert_eq!(lines.len(), 1000, "none lost");
    for (i, l) in lines.iter().enumerate() {
        assert!(l.ends_with(&format!("access n={i}")), "in order: {l}");
    }
}

#[test]
fn the_guard_writes_what_is_left() {
    let sink = Sink::default();
    let (writer, guard) = log_writer::start(sink.clone());
    tracing::subscriber::with_default(subscriber(writer), || {
        tracing::info!(target: ACCESS_TARGET, "the last request");
    });
    drop(guard);
    assert!(sink.text().contains("the last request"), "{}", sink.text());
}

#[test]
fn writers_wait_at_the_bound_when_the_output_is_stuck() {
    let sink = Sink::default();
    let held = sink.gate.lock().unwrap();
    let (writer, guard) = log_writer::start(sink.clone());
    let done = Arc::new(Mutex::new(false));
    let pusher = {
        let done = done.clone();
        std::thread::spawn(move || {
            tracing::subscriber::with_default(subscriber(writer), || {
                let piece = "x".repeat(64 << 10);
                // 8 MiB against a bound of 4 MiB and a stuck output.
                for _ in 0..128 {
                    tracing::info!(target: ACCESS_TARGET, "{piece}");
                }
            });
            *done.lock().unwrap() = true;
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !*done.lock().unwrap(),
        "8 MiB went into memory past the bound"
    );
    drop(held);
    pusher.join().unwrap();
    drop(guard);
    let lines = sink.text().lines().filter(|l| l.ends_with('x')).count();
    assert_eq!(lines, 128, "every line written once the output moved");
}

#[test]
fn a_stuck_output_holds_the_guard_for_at_most_a_second_or_so() {
    let sink = Sink::default();
    let held = sink.gate.lock().unwrap();
    let (writer, guard) = log_writer::start(sink.clone());
    tracing::subscriber::with_default(subscriber(writer), || {
        tracing::info!("a line the stuck output never takes");
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(guard);
        let _ = tx.send(());
    });
    // The guard gives up after CLOSE_WAIT (1 s); 30 s is only a bound on
    // the test, far above any scheduling delay.
    let returned = rx.recv_timeout(Duration::from_secs(30));
    drop(held);
    assert!(
        returned.is_ok(),
        "dropping the guard waited for a stuck output"
    );
}
