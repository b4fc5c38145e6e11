//! What one open stream costs in memory, in each state machine: the basis of
//! the `max_streams` default (see BENCHMARKS.md). A plain harness:
//!
//! ```sh
//! cargo bench --bench stream_cost
//! ```
//!
//! A counting allocator measures the bytes held by a connection with N
//! requests in flight (relay: opened, finished and transmitted, waiting for
//! the worker; worker: received, handed to the application, not answered)
//! against the same connection with none (the baseline, measured in the same
//! run). Headers: 5 short ones per request, as Strata's dispatches carry.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;
use worker_relay::frame::{ControlFrame, Headers, RequestHead, StreamId};
use worker_relay::proto::{RelayConfig, RelayConnection, WorkerConfig, WorkerConnection};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn head() -> RequestHead {
    let h = Headers::try_from_pairs([
        ("authorization", "Bearer 0123456789abcdef0123456789abcdef"),
        ("content-type", "multipart/form-data; boundary=x"),
        ("content-length", "0"),
        ("x-strata-executor-protocol", "v1"),
        ("host", "relay.example.com"),
    ])
    .unwrap();
    RequestHead::new("POST", "/v1/execute", "", h).unwrap()
}

fn relay_bytes(n: usize) -> isize {
    let before = live();
    let mut r = RelayConnection::new(
        RelayConfig::builder()
            .max_streams(n + 1)
            .reserved_streams(0)
            .build()
            .unwrap(),
    );
    for _ in 0..n {
        let k = r.open_stream(head()).unwrap();
        r.finish(k).unwrap();
        while r.poll_transmit().is_some() {}
    }
    let used = live() - before;
    assert_eq!(r.open_streams(), n);
    drop(r);
    used
}

fn worker_bytes(n: usize) -> isize {
    let before = live();
    let mut w = WorkerConnection::new(
        WorkerConfig::builder()
            .max_streams(n + 1)
            .reserved_streams(0)
            .build()
            .unwrap(),
    );
    let now = Instant::now();
    for i in 0..n {
        let id = StreamId::new(i as u32 + 1).unwrap();
        w.handle_message(ControlFrame::Request { id, head: head() }.to_message(), now)
            .unwrap();
        w.handle_message(ControlFrame::End { id }.to_message(), now)
            .unwrap();
    }
    // The application takes the events (a runtime keeps the heads elsewhere).
    while w.poll_event().is_some() {}
    let used = live() - before;
    assert_eq!(w.stats().streams_open, n as u64);
    drop(w);
    used
}

fn main() {
    // `cargo bench` passes flags such as `--bench`; nothing to parse.
    println!(
        "| machine | streams in flight | bytes held | per stream (minus the empty connection) |"
    );
    println!("|---|---|---|---|");
    for (name, f) in [
        ("relay", relay_bytes as fn(usize) -> isize),
        ("worker", worker_bytes),
    ] {
        let base = f(0);
        println!("| {name} | 0 | {base} | (baseline) |");
        for n in [1_000, 10_000] {
            let used = f(n);
            println!("| {name} | {n} | {used} | {} |", (used - base) / n as isize);
        }
    }
}
