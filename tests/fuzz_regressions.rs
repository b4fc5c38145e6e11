//! Regression tests for bugs the fuzz targets found (see `fuzz/README.md`).
//! A test marked `#[ignore = "bug: …"]` reproduces a bug not fixed yet.

mod common;

use common::{get, Pair};
use std::time::Instant;
use worker_relay::frame::{decode, ControlFrame, Decoded, Message, StreamId};
use worker_relay::proto::{WorkerConfig, WorkerConnection};

fn id(n: u32) -> StreamId {
    StreamId::new(n).unwrap()
}

/// Every frame the worker emits for `wire_id`.
fn frames_for(w: &mut WorkerConnection, wire_id: StreamId) -> Vec<Decoded> {
    std::iter::from_fn(|| w.poll_transmit())
        .filter_map(|m| decode(&m)?.ok())
        .filter(|d| match d {
            Decoded::Control(c) => c.id() == wire_id,
            Decoded::Chunk(c) => c.id == wire_id,
            _ => false,
        })
        .collect()
}

/// worker_machine: the worker answers a malformed `request` (usable id, bad
/// path) with 400; if the relay aborts that id before the answer has gone
/// out, the 400 must not go out: "it sends nothing more for the stream".
#[test]
fn no_400_answer_after_the_relays_abort() {
    let now = Instant::now();
    let mut w = WorkerConnection::default();
    let bad = r#"{"type":"request","id":3,"method":"GET","path":"nope"}"#;
    w.handle_message(Message::Text(bad.into()), now).unwrap();
    w.handle_message(ControlFrame::Abort { id: id(3) }.to_message(), now)
        .unwrap();
    let out = frames_for(&mut w, id(3));
    assert!(out.is_empty(), "worker sent {out:?} for an aborted stream");
}

/// worker_machine (issue 13): the `abort` the worker queues for a request
/// body longer than its Content-Length must not go out once the relay has
/// aborted that id itself: the relay may already have reused the id, and a
/// late `abort` would kill the new stream.
#[test]
fn no_protocol_error_abort_after_the_relays_abort() {
    let now = Instant::now();
    let mut w = WorkerConnection::default();
    let head = common::post("/v1/execute", Some(2));
    w.handle_message(ControlFrame::Request { id: id(1), head }.to_message(), now)
        .unwrap();
    let chunk = Message::Binary(worker_relay::frame::encode_chunk(id(1), b"abc"));
    w.handle_message(chunk, now).unwrap();
    w.handle_message(ControlFrame::Abort { id: id(1) }.to_message(), now)
        .unwrap();
    let out = frames_for(&mut w, id(1));
    assert!(out.is_empty(), "worker sent {out:?} for an aborted stream");
}

/// worker_machine: same for the 503 the worker answers when `max_streams`
/// requests are open.
#[test]
fn no_503_answer_after_the_relays_abort() {
    let now = Instant::now();
    let mut w = WorkerConnection::new(
        WorkerConfig::builder()
            .max_streams(1)
            .reserved_streams(0)
            .build()
            .unwrap(),
    );
    for n in [1, 2] {
        let head = get("/health");
        w.handle_message(ControlFrame::Request { id: id(n), head }.to_message(), now)
            .unwrap();
    }
    w.handle_message(ControlFrame::Abort { id: id(2) }.to_message(), now)
        .unwrap();
    let out = frames_for(&mut w, id(2));
    assert!(out.is_empty(), "worker sent {out:?} for an aborted stream");
}

// (A third case the fuzzer showed, a stale 503 taken by a stream that
// reuses the aborted stream's id at once, is the protocol's own hazard: the
// worker may have sent its answer before the `abort` reached it. Our relay
// never reuses an id so soon; ids are handed out in sequence, see
// `RelayConnection`'s allocator.)

/// The worker answers each request it refuses (400, 503) from a control
/// queue that no bound covers: a relay that keeps sending such requests and
/// does not read makes it grow without limit while `wants_read()` stays true
/// (DESIGN.md: "every buffer has a bound … never growth").
#[test]
fn refused_requests_do_not_grow_the_worker_queue_without_bound() {
    let now = Instant::now();
    let mut w = WorkerConnection::default();
    let mut n = 0u32;
    while w.wants_read() && n < 100_000 {
        n += 1;
        let bad = format!(r#"{{"type":"request","id":{n},"method":"GET","path":"nope"}}"#);
        w.handle_message(Message::Text(bad), now).unwrap();
    }
    let queued = std::iter::from_fn(|| w.poll_transmit()).count();
    assert!(
        queued < 10_000,
        "{n} refused requests read, {queued} messages queued for a relay that does not read"
    );
}

/// A caller letting go of a response complete by its Content-Length leaves
/// the stream waiting for the worker's `end`; commands on that key then act
/// as if the queue were full (`send_body` takes 0 bytes, and no `Writable`
/// follows), where a forgotten stream's commands are swallowed.
#[test]
fn send_body_after_letting_go_of_a_complete_response_is_swallowed() {
    use worker_relay::frame::{Headers, ResponseHead};
    use worker_relay::proto::BodyRead;
    let mut p = Pair::default_pair();
    p.auto_read_relay = false;
    let key = p.relay.open_stream(get("/v1/execute")).unwrap();
    p.progress();
    let (wkey, _) = p.worker_requests()[0].clone();
    let head = ResponseHead::new(
        200,
        Headers::try_from_pairs([("content-length", "2")]).unwrap(),
    )
    .unwrap();
    p.worker.respond(wkey, head).unwrap();
    p.worker.send_body(wkey, "ok".into()).unwrap();
    // Deliver the head and the body, not yet the `end`.
    while let Some(m) = p.worker.poll_transmit() {
        p.relay.handle_message(m, p.now).unwrap();
    }
    while p.relay.poll_event().is_some() {}
    assert_eq!(p.relay.read_body(key), BodyRead::Data("ok".into()));
    p.relay.abort(key);
    let data = worker_relay::Bytes::from_static(b"late");
    assert_eq!(p.relay.send_body(key, data), Ok(4), "forgotten: swallowed");
}

/// relay_machine (2026-12-06, CI's 30-second run): a second
/// `handle_timeout` at the same instant moved the pong deadline by a
/// second. The first call gave up a stalled stream, which queued its
/// `abort`; with output waiting for the socket the deadline runs from the
/// last message the socket took, but only the next call applied that.
/// "Extra calls are harmless": they change nothing.
#[test]
fn a_second_handle_timeout_at_the_same_instant_changes_nothing() {
    use std::time::Duration;
    use worker_relay::frame::{encode_chunk, Headers, ResponseHead};
    use worker_relay::proto::{KeepaliveConfig, RelayConfig, RelayConnection};
    let s = Duration::from_secs;
    let config = RelayConfig::builder()
        .keepalive(Some(KeepaliveConfig::new(s(20), s(20)).unwrap()))
        .stall_timeout(s(15))
        .build()
        .unwrap();
    let mut r = RelayConnection::new(config);
    let t0 = Instant::now();
    let drain = |r: &mut RelayConnection| while r.poll_transmit().is_some() {};
    r.handle_timeout(t0);
    r.handle_timeout(t0 + s(20));
    drain(&mut r); // the ping: its pong is due at t0 + 40 s
    r.handle_timeout(t0 + s(21));
    let key = r.open_stream(get("/")).unwrap();
    drain(&mut r); // the request, taken at t0 + 21 s
    let wire = r.stream_id(key).unwrap();
    let head = ResponseHead::new(200, Headers::default()).unwrap();
    r.handle_message(
        ControlFrame::Response { id: wire, head }.to_message(),
        t0 + s(21),
    )
    .unwrap();
    let chunk = Message::Binary(encode_chunk(wire, b"never read"));
    r.handle_message(chunk, t0 + s(21)).unwrap();
    while r.poll_event().is_some() {}
    // The body is never read: given up at t0 + 36 s, its abort queued.
    r.handle_timeout(t0 + s(36));
    let next = r.poll_timeout();
    assert_eq!(
        next,
        Some(t0 + s(41)),
        "the pong deadline runs from the last message taken"
    );
    r.handle_timeout(t0 + s(36));
    assert_eq!(r.poll_timeout(), next);
}
