//! Issue 42 (third part): the conversions every forwarded request makes,
//! counted in allocations, so that a change that adds copies to the hot
//! path fails here rather than in a benchmark. Counted on the test's own
//! thread (tests run side by side), with the core's `http` conversions
//! and frame codec only (no dependency's internals beyond `http`).
//!
//! Before this part (`96bd28b`), with the same inputs: the caller's
//! request to a head 11 allocations (now 4), the worker's head to a
//! response 17 (now 5), a request frame read 4 (now 3), the head as the
//! app's request 7 (now 5): the headers copied twice to drop hop-by-hop
//! ones that were not there, a Latin-1 copy beside each value, the String
//! of each growth step, the method.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What `f` returns, and how many allocations (and reallocations) it made.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (out, ALLOCATIONS.with(Cell::get) - before)
}

use worker_relay::connect::UrlMap;
use worker_relay::forward::{request_builder, request_head_from_parts, response_builder};
use worker_relay::frame::{decode_text, ControlFrame, Decoded, Headers, ResponseHead};

fn caller_request() -> http::request::Parts {
    http::Request::get("/w/abc/health")
        .header("host", "127.0.0.1:8080")
        .header("authorization", "Bearer wt-0123456789")
        .header("user-agent", "wrk")
        .header("accept", "*/*")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

#[test]
fn a_callers_request_becomes_a_head_in_four_allocations() {
    let parts = caller_request();
    let map = UrlMap::default();
    let ((worker, head), n) = counted(|| request_head_from_parts(&parts, &map).unwrap());
    assert_eq!(
        (worker.as_str(), head.target().as_str()),
        ("abc", "/health")
    );
    assert_eq!(head.headers().len(), 4);
    // The worker's id, the path, the headers' text and their ends; the
    // method is a static string.
    assert!(n <= 4, "{n} allocations");
}

#[test]
fn a_workers_head_becomes_a_response_in_five_allocations() {
    let head = ResponseHead::new(
        200,
        Headers::try_from_pairs([
            ("content-type", "text/plain; charset=utf-8"),
            ("content-length", "3"),
            ("date", "Sun, 06 Dec 2026 15:00:00 GMT"),
            ("x-request-id", "7"),
        ])
        .unwrap(),
    )
    .unwrap();
    let (builder, n) = counted(|| response_builder(&head).unwrap());
    let resp = builder.body(()).unwrap();
    assert_eq!(resp.headers()["date"], "Sun, 06 Dec 2026 15:00:00 GMT");
    assert_eq!(resp.headers()["x-request-id"], "7");
    // The map's two tables, one copy of the values' text and its count of
    // owners, and the one name the http crate does not know.
    assert!(n <= 5, "{n} allocations");
}

#[test]
fn a_request_frame_is_read_without_a_copy_of_its_method() {
    let text = r#"{"type":"request","id":1,"method":"GET","path":"/health","query":"","headers":[["host","relay"],["accept","*/*"]]}"#;
    let (frame, n) = counted(|| decode_text(text).unwrap());
    let Decoded::Control(ControlFrame::Request { head, .. }) = frame else {
        panic!("{frame:?}")
    };
    assert_eq!(head.method(), "GET");
    // The path, the headers' text and their ends.
    assert!(n <= 3, "{n} allocations");
    // And as the app's request: the target, the map's two tables, and a
    // copy of each of the two values (no Latin-1 copy of each beside it).
    let (req, n) = counted(|| request_builder(&head).unwrap().body(()).unwrap());
    assert_eq!(req.uri(), "/health");
    assert_eq!(req.headers()["accept"], "*/*");
    assert!(n <= 5, "{n} allocations");
}
