//! What crosses the relay is validated both ways (issue 13): response heads
//! and bodies at the relay, request heads and bodies at the worker, bodiless
//! responses (HEAD, 204, 304), the two halves of a stream, the control-route
//! reserve and the relay's refusals.
mod common;

use bytes::Bytes;
use common::*;
use std::time::Instant;
use worker_relay::frame::{
    decode, encode_chunk, ControlFrame, Decoded, HeadLimitError, Headers, Message, RequestHead,
    ResponseHead, StreamId,
};
use worker_relay::proto::{
    BodyRead, HandleError, OpenError, RelayConfig, RelayConnection, RelayEnd, RelayEvent,
    RespondError, StreamKey, WorkerConfig, WorkerConnection, WorkerEnd, WorkerEvent,
};

fn id(n: u32) -> StreamId {
    StreamId::new(n).unwrap()
}

fn now() -> Instant {
    Instant::now()
}

fn text(t: &str) -> Message {
    Message::Text(t.to_string())
}

fn drain(r: &mut RelayConnection) -> Vec<Decoded> {
    std::iter::from_fn(|| r.poll_transmit())
        .map(|m| decode(&m).unwrap().unwrap())
        .collect()
}

fn drain_w(w: &mut WorkerConnection) -> Vec<Decoded> {
    std::iter::from_fn(|| w.poll_transmit())
        .map(|m| decode(&m).unwrap().unwrap())
        .collect()
}

fn relay_events(r: &mut RelayConnection) -> Vec<RelayEvent> {
    std::iter::from_fn(|| r.poll_event()).collect()
}

fn worker_events(w: &mut WorkerConnection) -> Vec<WorkerEvent> {
    std::iter::from_fn(|| w.poll_event()).collect()
}

/// Feeds `head` as request `n` to the worker; the key its app gets.
fn worker_open(w: &mut WorkerConnection, n: u32, head: RequestHead) -> StreamKey {
    w.handle_message(
        ControlFrame::Request { id: id(n), head }.to_message(),
        now(),
    )
    .unwrap();
    worker_events(w)
        .iter()
        .find_map(|e| match e {
            WorkerEvent::Request { key, .. } => Some(*key),
            _ => None,
        })
        .expect("the request reaches the app")
}

fn abort(n: u32) -> Decoded {
    Decoded::Control(ControlFrame::Abort { id: id(n) })
}

fn end(n: u32) -> Decoded {
    Decoded::Control(ControlFrame::End { id: id(n) })
}

fn head_of(status: u16, pairs: &[(&str, &str)]) -> ResponseHead {
    ResponseHead::new(
        status,
        Headers::try_from_pairs(pairs.iter().copied()).unwrap(),
    )
    .unwrap()
}

/// A relay with one `method` request for `/x` on the wire as id 1 (its head
/// and `end` drained).
fn relay_with(method: &str) -> (RelayConnection, StreamKey) {
    let mut r = RelayConnection::default();
    let k = r
        .open_stream(RequestHead::new(method, "/x", "", Headers::new()).unwrap())
        .unwrap();
    r.finish(k).unwrap();
    drain(&mut r);
    (r, k)
}

fn ended(evs: &[RelayEvent]) -> Option<(RelayEnd, bool)> {
    evs.iter().find_map(|e| match e {
        RelayEvent::Ended {
            reason,
            response_started,
            ..
        } => Some((*reason, *response_started)),
        _ => None,
    })
}

// ----------------------------------------------------------------------
// The relay validates what the worker answers
// ----------------------------------------------------------------------

#[test]
fn interim_and_out_of_range_statuses_fail_the_stream_with_abort() {
    for status in [100, 101, 103, 199, 600, 999] {
        let (mut r, _) = relay_with("GET");
        r.handle_message(
            ControlFrame::Response {
                id: id(1),
                head: head_of(status, &[]),
            }
            .to_message(),
            now(),
        )
        .unwrap();
        let evs = relay_events(&mut r);
        assert_eq!(
            ended(&evs),
            Some((RelayEnd::ProtocolError, false)),
            "status {status}: {evs:?}"
        );
        assert!(!evs.iter().any(|e| matches!(e, RelayEvent::Response { .. })));
        assert_eq!(drain(&mut r), [abort(1)], "status {status}");
        assert_eq!(r.stats().protocol_errors, 1);
    }
    for status in [200, 204, 304, 404, 599] {
        let (mut r, _) = relay_with("GET");
        r.handle_message(
            ControlFrame::Response {
                id: id(1),
                head: head_of(status, &[]),
            }
            .to_message(),
            now(),
        )
        .unwrap();
        assert!(matches!(
            relay_events(&mut r)[..],
            [RelayEvent::Response { .. }]
        ));
    }
}

#[test]
fn invalid_or_conflicting_content_length_fails_the_stream() {
    for values in [&["5", "50"][..], &["5x"], &["5, 50"], &["-1"], &[""]] {
        let (mut r, _) = relay_with("GET");
        let pairs: Vec<(&str, &str)> = values.iter().map(|v| ("content-length", *v)).collect();
        r.handle_message(
            ControlFrame::Response {
                id: id(1),
                head: head_of(200, &pairs),
            }
            .to_message(),
            now(),
        )
        .unwrap();
        let evs = relay_events(&mut r);
        assert_eq!(
            ended(&evs),
            Some((RelayEnd::ProtocolError, false)),
            "{values:?}"
        );
        assert_eq!(drain(&mut r), [abort(1)]);
    }
}

#[test]
fn a_response_head_over_the_limits_fails_the_stream() {
    let many: Vec<String> = (0..101).map(|i| format!(r#"["x-{i}","v"]"#)).collect();
    let big = format!(r#"[["x-big","{}"]]"#, "v".repeat(64 << 10));
    for headers in [format!("[{}]", many.join(",")), big] {
        let (mut r, _) = relay_with("GET");
        let t = format!(r#"{{"type":"response","id":1,"status":200,"headers":{headers}}}"#);
        r.handle_message(text(&t), now()).unwrap();
        assert_eq!(
            ended(&relay_events(&mut r)),
            Some((RelayEnd::ProtocolError, false))
        );
        assert_eq!(drain(&mut r), [abort(1)]);
    }
    // Exactly at the bound is fine.
    let (mut r, _) = relay_with("GET");
    let ok: Vec<String> = (0..100).map(|i| format!(r#"["x-{i}","v"]"#)).collect();
    let t = format!(
        r#"{{"type":"response","id":1,"status":200,"headers":[{}]}}"#,
        ok.join(",")
    );
    r.handle_message(text(&t), now()).unwrap();
    assert!(matches!(
        relay_events(&mut r)[..],
        [RelayEvent::Response { .. }]
    ));
}

#[test]
fn a_malformed_response_for_a_stream_in_flight_fails_it_one_for_no_stream_is_ignored() {
    let bad = [
        r#"{"type":"response","id":1,"status":200,"headers":[["a","x\r\ny"]]}"#,
        r#"{"type":"response","id":1,"status":1000}"#,
        r#"{"type":"response","id":1,"status":"200"}"#,
    ];
    for t in bad {
        let (mut r, _) = relay_with("GET");
        r.handle_message(text(t), now()).unwrap();
        assert_eq!(
            ended(&relay_events(&mut r)),
            Some((RelayEnd::ProtocolError, false)),
            "{t}"
        );
        assert_eq!(drain(&mut r), [abort(1)]);
        // The same frame for an id not in flight costs nothing.
        let before = r.stats().messages_ignored;
        r.handle_message(text(&t.replace(r#""id":1"#, r#""id":9"#)), now())
            .unwrap();
        assert_eq!(r.stats().messages_ignored, before + 1);
        assert!(relay_events(&mut r).is_empty());
    }
}

#[test]
fn a_huge_head_for_an_unknown_id_is_ignored() {
    // 1 MiB of tiny headers: the decoder stops collecting past the bound.
    let pair = r#"["a",""],"#;
    let n = ((1 << 20) - 100) / pair.len();
    let t = format!(
        r#"{{"type":"response","id":9,"status":200,"headers":[{}["a",""]]}}"#,
        pair.repeat(n)
    );
    assert!(t.len() <= worker_relay::frame::MAX_MESSAGE_LEN);
    let (mut r, _) = relay_with("GET");
    r.handle_message(text(&t), now()).unwrap();
    assert!(relay_events(&mut r).is_empty());
    assert!(drain(&mut r).is_empty());
    assert_eq!(r.stats().messages_ignored, 1);
    assert!(!r.is_closed());
}

fn respond(r: &mut RelayConnection, status: u16, pairs: &[(&str, &str)]) {
    r.handle_message(
        ControlFrame::Response {
            id: id(1),
            head: head_of(status, pairs),
        }
        .to_message(),
        now(),
    )
    .unwrap();
}

fn chunk(r: &mut RelayConnection, data: &[u8]) {
    r.handle_message(Message::Binary(encode_chunk(id(1), data)), now())
        .unwrap();
}

#[test]
fn a_body_longer_than_its_content_length_fails_after_what_fit() {
    let (mut r, k) = relay_with("GET");
    respond(&mut r, 200, &[("content-length", "5")]);
    chunk(&mut r, b"abc");
    chunk(&mut r, b"def");
    let evs = relay_events(&mut r);
    assert_eq!(ended(&evs), Some((RelayEnd::ProtocolError, true)));
    assert_eq!(drain(&mut r), [abort(1)]);
    // The caller gets what fit, then the failure: never a completed response.
    assert_eq!(relay_read_all(&mut r, k), (b"abc".to_vec(), BodyRead::Gone));
    assert_eq!(r.stats().protocol_errors, 1);
}

#[test]
fn end_short_of_the_content_length_fails_without_abort() {
    let (mut r, k) = relay_with("GET");
    respond(&mut r, 200, &[("content-length", "5")]);
    chunk(&mut r, b"abc");
    r.handle_message(ControlFrame::End { id: id(1) }.to_message(), now())
        .unwrap();
    assert_eq!(
        ended(&relay_events(&mut r)),
        Some((RelayEnd::ProtocolError, true))
    );
    // The worker ended the stream itself: nothing to abort.
    assert!(drain(&mut r).is_empty());
    assert_eq!(relay_read_all(&mut r, k), (b"abc".to_vec(), BodyRead::Gone));
    assert_eq!(r.stats().protocol_errors, 1);
    // Exactly the Content-Length completes.
    let (mut r, k) = relay_with("GET");
    respond(&mut r, 200, &[("content-length", "5")]);
    chunk(&mut r, b"abc");
    chunk(&mut r, b"de");
    chunk(&mut r, b"");
    r.handle_message(ControlFrame::End { id: id(1) }.to_message(), now())
        .unwrap();
    assert_eq!(
        ended(&relay_events(&mut r)),
        Some((RelayEnd::Completed, true))
    );
    assert_eq!(
        relay_read_all(&mut r, k),
        (b"abcde".to_vec(), BodyRead::End)
    );
}

#[test]
fn head_204_and_304_have_no_body_whatever_their_content_length() {
    for (method, status) in [("HEAD", 200), ("HEAD", 404), ("GET", 204), ("GET", 304)] {
        let (mut r, k) = relay_with(method);
        respond(&mut r, status, &[("content-length", "1234")]);
        // A body the worker sends anyway is not forwarded.
        chunk(&mut r, b"stray");
        r.handle_message(ControlFrame::End { id: id(1) }.to_message(), now())
            .unwrap();
        let evs = relay_events(&mut r);
        assert_eq!(
            ended(&evs),
            Some((RelayEnd::Completed, true)),
            "{method} {status}: {evs:?}"
        );
        assert_eq!(relay_read_all(&mut r, k), (vec![], BodyRead::End));
        assert!(drain(&mut r).is_empty());
    }
}

#[test]
fn the_worker_answers_head_204_and_304_without_a_body() {
    for (method, status) in [("HEAD", 200), ("GET", 204), ("GET", 304)] {
        let mut w = WorkerConnection::default();
        let head = RequestHead::new(method, "/bytes", "n=1234", Headers::new()).unwrap();
        let k = worker_open(&mut w, 1, head);
        w.handle_message(ControlFrame::End { id: id(1) }.to_message(), now())
            .unwrap();
        w.respond(k, head_of(status, &[("content-length", "1234")]))
            .unwrap();
        // What the app writes anyway is swallowed; finish does not count it.
        assert_eq!(w.send_body(k, Bytes::from_static(b"ignored")), Ok(7));
        assert_eq!(w.finish(k), Ok(()), "{method} {status}");
        let out = drain_w(&mut w);
        assert_eq!(out.len(), 2, "{method} {status}: {out:?}");
        assert!(matches!(
            &out[0],
            Decoded::Control(ControlFrame::Response { head, .. })
                if head.headers().get("content-length") == Some("1234")
        ));
        assert_eq!(out[1], end(1));
        assert!(worker_events(&mut w).contains(&WorkerEvent::Ended {
            key: k,
            reason: WorkerEnd::Completed
        }));
    }
}

#[test]
fn the_worker_refuses_to_send_interim_or_invalid_statuses() {
    let mut w = WorkerConnection::default();
    let k = worker_open(&mut w, 1, get("/"));
    for status in [100, 101, 199, 600, 999] {
        assert_eq!(
            w.respond(k, head_of(status, &[])),
            Err(RespondError::InvalidHead(
                worker_relay::frame::FrameError::InvalidStatus
            ))
        );
    }
    assert_eq!(w.respond(k, head_of(200, &[])), Ok(()));
}

// ----------------------------------------------------------------------
// The two halves of a relay stream
// ----------------------------------------------------------------------

/// A POST with `len` bytes announced and `sent` of them queued, answered
/// early by the worker with a complete 401.
fn early_answer(len: usize, sent: usize) -> (RelayConnection, StreamKey) {
    let mut r = RelayConnection::default();
    let k = r.open_stream(post("/upload", Some(len))).unwrap();
    assert_eq!(r.send_body(k, pattern(sent)).unwrap(), sent);
    drain(&mut r);
    respond(&mut r, 401, &[("content-length", "4")]);
    chunk(&mut r, b"nope");
    relay_events(&mut r);
    assert_eq!(relay_read_all(&mut r, k).0, b"nope");
    (r, k)
}

#[test]
fn a_caller_leaving_mid_upload_after_a_complete_answer_aborts_the_stream() {
    let (mut r, k) = early_answer(100, 50);
    // The request half is still open: the worker's app would wait for the
    // rest of the body forever unless it is told.
    r.abort(k);
    assert_eq!(drain(&mut r), [abort(1)]);
    assert_eq!(r.open_streams(), 0, "the stream is gone, its slot free");
    // A late finish for it is swallowed; nothing more goes out.
    assert_eq!(r.finish(k), Ok(()));
    assert!(drain(&mut r).is_empty());
    // The worker's `end` that crossed the abort is ignored.
    r.handle_message(ControlFrame::End { id: id(1) }.to_message(), now())
        .unwrap();
    assert!(relay_events(&mut r).is_empty());
}

#[test]
fn letting_go_after_both_halves_are_complete_still_sends_the_queued_end() {
    let (mut r, k) = early_answer(100, 50);
    assert_eq!(r.send_body(k, pattern(50)).unwrap(), 50);
    r.finish(k).unwrap();
    // The caller lets go before the rest of the request went out: it is not
    // an abort, the request's end still goes, then the worker's `end` is
    // consumed quietly.
    r.abort(k);
    let out = drain(&mut r);
    assert!(matches!(out[0], Decoded::Chunk(ref c) if c.data.len() == 50));
    assert_eq!(out[1..], [end(1)]);
    assert_eq!(r.open_streams(), 1, "waiting for the worker's end");
    r.handle_message(ControlFrame::End { id: id(1) }.to_message(), now())
        .unwrap();
    assert!(relay_events(&mut r).is_empty());
    assert_eq!(r.open_streams(), 0);
    assert!(drain(&mut r).is_empty());
}

#[test]
fn the_stranded_upload_is_released_on_the_worker_side_too() {
    let mut p = Pair::default_pair();
    p.auto_read_worker = false;
    let k = p.relay.open_stream(post("/upload", Some(100))).unwrap();
    p.relay.send_body(k, pattern(50)).unwrap();
    p.progress();
    let (wk, _) = p.worker_requests()[0].clone();
    // The worker's app answers 401 at once, without reading.
    p.worker.discard_body(wk);
    p.worker
        .respond(wk, head_of(401, &[("content-length", "4")]))
        .unwrap();
    p.worker.send_body(wk, Bytes::from_static(b"nope")).unwrap();
    p.progress();
    assert_eq!(p.relay_bodies[&k].0, b"nope");
    // The caller goes away mid-upload: the worker's stream must end too.
    p.relay.abort(k);
    p.progress();
    assert!(p.worker_events.contains(&WorkerEvent::Ended {
        key: wk,
        reason: WorkerEnd::ClientAborted
    }));
    assert_eq!(p.worker.stats().streams_open, 0);
    assert_eq!(p.relay.open_streams(), 0);
}

#[test]
fn a_paused_relay_hands_the_message_back() {
    let (mut r, k) = relay_with("GET");
    respond(&mut r, 200, &[]);
    for _ in 0..16 {
        chunk(&mut r, b"x");
    }
    assert!(!r.wants_read());
    let m = Message::Binary(encode_chunk(id(1), b"y"));
    assert_eq!(
        r.handle_message(m.clone(), now()),
        Err(HandleError::ReadPaused(m.clone()))
    );
    assert_eq!(r.read_body(k), BodyRead::Data(Bytes::from_static(b"x")));
    r.handle_message(m, now()).unwrap();
    let (body, _) = relay_read_all(&mut r, k);
    assert_eq!(body, b"xxxxxxxxxxxxxxxy");
}

// ----------------------------------------------------------------------
// The relay's refusals: methods, head limits, the control-route reserve
// ----------------------------------------------------------------------

#[test]
fn connect_and_trace_are_refused_with_405_unless_configured() {
    let mut r = RelayConnection::default();
    for m in ["CONNECT", "TRACE", "trace"] {
        let e = r
            .open_stream(RequestHead::new(m, "/x", "", Headers::new()).unwrap())
            .unwrap_err();
        assert_eq!((e.clone(), e.status()), (OpenError::MethodNotAllowed, 405));
    }
    let mut r = RelayConnection::new(
        RelayConfig::builder()
            .refused_methods(Vec::<String>::new())
            .build()
            .unwrap(),
    );
    assert!(r
        .open_stream(RequestHead::new("TRACE", "/x", "", Headers::new()).unwrap())
        .is_ok());
}

#[test]
fn request_heads_over_the_limits_are_refused_with_431_414_400() {
    let mut r = RelayConnection::default();
    let many = Headers::try_from_pairs((0..101).map(|i| (format!("x-{i}"), "v"))).unwrap();
    let e = r
        .open_stream(RequestHead::new("GET", "/", "", many).unwrap())
        .unwrap_err();
    assert_eq!(
        e,
        OpenError::HeadOverLimit(HeadLimitError::TooManyHeaders { limit: 100 })
    );
    assert_eq!(e.status(), 431);
    let big = Headers::try_from_pairs([("cookie", "c".repeat(64 << 10))]).unwrap();
    let e = r
        .open_stream(RequestHead::new("GET", "/", "", big).unwrap())
        .unwrap_err();
    assert_eq!(e.status(), 431);
    let long = RequestHead::new(
        "GET",
        format!("/{}", "p".repeat(9 << 10)),
        "",
        Headers::new(),
    );
    assert_eq!(r.open_stream(long.unwrap()).unwrap_err().status(), 414);
    let method = RequestHead::new("M".repeat(100 << 10), "/", "", Headers::new()).unwrap();
    assert_eq!(r.open_stream(method).unwrap_err().status(), 400);
    assert_eq!(r.open_streams(), 0);
    assert!(drain(&mut r).is_empty());
}

#[test]
fn control_routes_keep_a_reserve_of_streams() {
    let mut r = RelayConnection::new(
        RelayConfig::builder()
            .max_streams(4)
            .reserved_streams(2)
            .build()
            .unwrap(),
    );
    r.open_stream(post("/v1/execute", None)).unwrap();
    r.open_stream(post("/v1/execute", None)).unwrap();
    let e = r.open_stream(post("/v1/execute", None)).unwrap_err();
    assert_eq!(e, OpenError::TooManyStreams { limit: 2 });
    assert_eq!(e.status(), 503);
    r.open_stream(get("/health")).unwrap();
    let cancel = RequestHead::new("POST", "/v1/executions/b-17/cancel", "", Headers::new());
    r.open_stream(cancel.unwrap()).unwrap();
    assert_eq!(
        r.open_stream(get("/health")),
        Err(OpenError::TooManyStreams { limit: 4 })
    );
    assert!(worker_relay::proto::is_control_route(&get("/health")));
    for (m, p) in [
        ("POST", "/health"),
        ("GET", "/v1/executions/b1/cancel"),
        ("POST", "/v1/executions//cancel"),
        ("POST", "/v1/executions/a/b/cancel"),
    ] {
        let h = RequestHead::new(m, p, "", Headers::new()).unwrap();
        assert!(!worker_relay::proto::is_control_route(&h), "{m} {p}");
    }
}

#[test]
fn the_worker_keeps_the_same_reserve_and_says_when_to_retry() {
    let mut w = WorkerConnection::new(
        WorkerConfig::builder()
            .max_streams(2)
            .reserved_streams(1)
            .build()
            .unwrap(),
    );
    let req = |w: &mut WorkerConnection, n: u32, method: &str, path: &str| {
        w.handle_message(
            ControlFrame::Request {
                id: id(n),
                head: RequestHead::new(method, path, "", Headers::new()).unwrap(),
            }
            .to_message(),
            now(),
        )
        .unwrap();
    };
    req(&mut w, 1, "POST", "/v1/execute");
    req(&mut w, 2, "POST", "/v1/execute");
    req(&mut w, 3, "GET", "/health");
    let requests = worker_events(&mut w)
        .into_iter()
        .filter(|e| matches!(e, WorkerEvent::Request { .. }))
        .count();
    assert_eq!(requests, 2, "the execute and the health check");
    let out = drain_w(&mut w);
    let Decoded::Control(ControlFrame::Response { id: rid, head }) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!((rid.get(), head.status()), (2, 503));
    assert_eq!(head.headers().get("retry-after"), Some("1"));
}

// ----------------------------------------------------------------------
// The worker validates what the relay sends
// ----------------------------------------------------------------------

fn worker_request(t: &str) -> (WorkerConnection, Vec<WorkerEvent>, Vec<Decoded>) {
    let mut w = WorkerConnection::default();
    w.handle_message(text(t), now()).unwrap();
    let evs = worker_events(&mut w);
    let out = drain_w(&mut w);
    (w, evs, out)
}

fn status_of(out: &[Decoded]) -> u16 {
    match out.first() {
        Some(Decoded::Control(ControlFrame::Response { head, .. })) => head.status(),
        other => panic!("no response: {other:?}"),
    }
}

#[test]
fn the_worker_answers_requests_over_its_limits_itself() {
    let many: Vec<String> = (0..101).map(|i| format!(r#"["x-{i}","v"]"#)).collect();
    let cases = [
        (
            format!(
                r#"{{"type":"request","id":1,"method":"GET","path":"/","headers":[{}]}}"#,
                many.join(",")
            ),
            431,
        ),
        (
            format!(
                r#"{{"type":"request","id":1,"method":"GET","path":"/{}"}}"#,
                "p".repeat(9 << 10)
            ),
            414,
        ),
        (
            format!(
                r#"{{"type":"request","id":1,"method":"{}","path":"/"}}"#,
                "M".repeat(100 << 10)
            ),
            400,
        ),
        (
            r#"{"type":"request","id":1,"method":"POST","path":"/","headers":[["content-length","5"],["content-length","50"]]}"#.to_string(),
            400,
        ),
    ];
    for (t, want) in cases {
        let (w, evs, out) = worker_request(&t);
        assert!(evs.is_empty(), "the app never sees it: {evs:?}");
        assert_eq!(status_of(&out), want);
        assert_eq!(out.last(), Some(&end(1)));
        assert_eq!(w.stats().streams_open, 0);
    }
}

fn worker_with_post(len: u64) -> (WorkerConnection, StreamKey) {
    let mut w = WorkerConnection::default();
    let k = worker_open(&mut w, 1, post("/upload", Some(len as usize)));
    (w, k)
}

#[test]
fn a_request_body_longer_than_its_content_length_fails_the_stream() {
    let (mut w, k) = worker_with_post(5);
    w.respond(k, head_of(200, &[])).unwrap();
    w.handle_message(Message::Binary(encode_chunk(id(1), b"abc")), now())
        .unwrap();
    w.handle_message(Message::Binary(encode_chunk(id(1), b"def")), now())
        .unwrap();
    let evs = worker_events(&mut w);
    assert!(evs.contains(&WorkerEvent::Ended {
        key: k,
        reason: WorkerEnd::ProtocolError
    }));
    // The queued response head is dropped; only `abort` goes out.
    assert_eq!(drain_w(&mut w), [abort(1)]);
    assert_eq!(w.read_body(k), BodyRead::Gone);
    assert_eq!(w.stats().protocol_errors, 1);
    assert_eq!(w.stats().streams_open, 0);
}

#[test]
fn a_request_body_ended_short_of_its_content_length_fails_the_stream() {
    let (mut w, k) = worker_with_post(5);
    w.handle_message(Message::Binary(encode_chunk(id(1), b"abc")), now())
        .unwrap();
    w.handle_message(ControlFrame::End { id: id(1) }.to_message(), now())
        .unwrap();
    assert!(worker_events(&mut w).contains(&WorkerEvent::Ended {
        key: k,
        reason: WorkerEnd::ProtocolError
    }));
    assert_eq!(drain_w(&mut w), [abort(1)]);
    // Exactly the Content-Length is a complete body.
    let (mut w, k) = worker_with_post(5);
    for piece in [&b"abc"[..], b"de"] {
        w.handle_message(Message::Binary(encode_chunk(id(1), piece)), now())
            .unwrap();
    }
    w.handle_message(ControlFrame::End { id: id(1) }.to_message(), now())
        .unwrap();
    assert_eq!(
        worker_read_all(&mut w, k),
        (b"abcde".to_vec(), BodyRead::End)
    );
    // A body the app no longer reads is not policed: its answer stands.
    let (mut w, k) = worker_with_post(5);
    w.respond(k, head_of(401, &[("content-length", "0")]))
        .unwrap();
    w.finish(k).unwrap();
    w.handle_message(Message::Binary(encode_chunk(id(1), b"abcdefgh")), now())
        .unwrap();
    let out = drain_w(&mut w);
    assert_eq!(status_of(&out), 401);
    assert_eq!(out.last(), Some(&end(1)));
    assert_eq!(w.stats().protocol_errors, 0);
}
