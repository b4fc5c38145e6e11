//! The examples' log writer (`cli/src/log_writer.rs`): ordinary
//! lines go out at once, access-log lines in batches, nothing is lost or
//! reordered, the guard writes the rest, and a stderr nobody reads never
//! holds a writer back: past the bound lines are dropped, counted, and the
//! count is written once the output moves again.
#[path = "../cli/src/log_writer.rs"]
mod log_writer;

use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker_relay_hyper::gateway::ACCESS_TARGET;

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

/// `N dropped`, as a line.
fn notice() -> log_writer::Notice {
    Box::new(|n| format!("{n} dropped\n"))
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
    let (writer, guard) = log_writer::start(sink.clone(), notice());
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
    let (writer, guard) = log_writer::start(sink.clone(), notice());
    tracing::subscriber::with_default(subscriber(writer), || {
        tracing::info!(target: ACCESS_TARGET, "the last request");
    });
    drop(guard);
    assert!(sink.text().contains("the last request"), "{}", sink.text());
}

#[test]
fn a_stuck_output_drops_lines_past_the_bound_and_counts_them() {
    let sink = Sink::default();
    let held = sink.gate.lock().unwrap();
    let (writer, guard) = log_writer::start(sink.clone(), notice());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        tracing::subscriber::with_default(subscriber(writer), || {
            let piece = "x".repeat(64 << 10);
            // 16 MiB against a bound of 4 MiB and a stuck output.
            for i in 0..256 {
                tracing::info!(target: ACCESS_TARGET, "{i} {piece}");
            }
        });
        let _ = tx.send(());
    });
    // The writer never waits for the output: 30 s is only a bound on the
    // test, far above the time of 256 copies under a lock.
    let returned = rx.recv_timeout(Duration::from_secs(30));
    assert!(returned.is_ok(), "a writer waited for a stuck output");
    drop(held);
    drop(guard);
    let text = sink.text();
    let written: Vec<u32> = text
        .lines()
        .filter(|l| l.ends_with('x'))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    let notices: Vec<&str> = text.lines().filter(|l| l.ends_with(" dropped")).collect();
    assert_eq!(notices.len(), 1, "one notice: {notices:?}");
    let dropped: usize = notices[0].split(' ').next().unwrap().parse().unwrap();
    // Within the bound: the batch the stuck write holds and the buffer,
    // each at most 4 MiB, so at most 128 lines of 64 KiB.
    assert!(written.len() < 128, "{} lines kept", written.len());
    assert!(dropped > 128, "{dropped} dropped");
    assert_eq!(
        written.len() + dropped,
        256,
        "every line written or counted"
    );
    // The lines kept are the first ones, in order; the notice follows them.
    assert_eq!(written, (0..written.len() as u32).collect::<Vec<_>>());
    let last = text.lines().last().unwrap();
    assert!(
        last.ends_with(" dropped"),
        "the notice after them: {last:.40}"
    );
}

#[test]
fn lines_after_the_notice_are_written_again() {
    let sink = Sink::default();
    let held = sink.gate.lock().unwrap();
    let (writer, guard) = log_writer::start(sink.clone(), notice());
    let dispatch = tracing::Dispatch::new(subscriber(writer));
    let (tx, rx) = std::sync::mpsc::channel();
    let pusher = dispatch.clone();
    std::thread::spawn(move || {
        tracing::dispatcher::with_default(&pusher, || {
            let piece = "y".repeat(1 << 20);
            for _ in 0..8 {
                tracing::info!("{piece}");
            }
        });
        let _ = tx.send(());
    });
    // 30 s: only a bound on the test (the writer never waits).
    let returned = rx.recv_timeout(Duration::from_secs(30));
    assert!(returned.is_ok(), "a writer waited for a stuck output");
    drop(held);
    let end = Instant::now() + Duration::from_secs(10);
    while !sink.text().contains(" dropped") {
        assert!(Instant::now() < end, "no notice once the output moved");
        std::thread::sleep(Duration::from_millis(5));
    }
    tracing::dispatcher::with_default(&dispatch, || tracing::info!("after the notice"));
    drop(guard);
    let text = sink.text();
    let notice = text.find(" dropped").unwrap();
    let after = text
        .find("after the notice")
        .expect("a line after the notice");
    assert!(after > notice);
}

#[test]
fn a_stuck_output_holds_the_guard_for_at_most_a_second_or_so() {
    let sink = Sink::default();
    let held = sink.gate.lock().unwrap();
    let (writer, guard) = log_writer::start(sink.clone(), notice());
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
