//! The relay state machine, one test per behaviour of issue 3's "Relay side".
mod common;

use bytes::Bytes;
use common::*;
use worker_relay::frame::{
    decode, ControlFrame, Decoded, Headers, Message, RequestHead, StreamId, MAX_CHUNK_BODY,
};
use worker_relay::proto::{
    BodyRead, FinishError, OpenError, RelayConfig, RelayConnection, RelayEnd, RelayEvent,
    WorkerEvent, WriteError,
};

fn drain(r: &mut RelayConnection) -> Vec<Decoded> {
    std::iter::from_fn(|| r.poll_transmit())
        .map(|m| decode(&m).unwrap().unwrap())
        .collect()
}

fn now() -> std::time::Instant {
    std::time::Instant::now()
}

fn feed(r: &mut RelayConnection, f: ControlFrame) {
    r.handle_message(f.to_message(), now()).unwrap();
}

fn id(n: u32) -> StreamId {
    StreamId::new(n).unwrap()
}

fn r_id_of(out: &[Decoded]) -> StreamId {
    match &out[0] {
        Decoded::Control(c) => c.id(),
        Decoded::Chunk(c) => c.id,
        _ => unreachable!(),
    }
}

fn resp(n: u32) -> ControlFrame {
    ControlFrame::Response {
        id: id(n),
        head: ok_head(),
    }
}

#[test]
fn ids_are_unique_in_flight_and_skip_taken_ones_on_wrap() {
    let mut r = RelayConnection::default();
    let a = r.open_stream(get("/a")).unwrap();
    let b = r.open_stream(get("/b")).unwrap();
    assert_eq!((r.stream_id(a), r.stream_id(b)), (Some(id(1)), Some(id(2))));
    // End stream 1; the allocator moves on rather than reusing at once.
    drain(&mut r);
    feed(&mut r, resp(1));
    feed(&mut r, ControlFrame::End { id: id(1) });
    let c = r.open_stream(get("/c")).unwrap();
    assert_eq!(r.stream_id(c), Some(id(3)));
    // Wrap around: 4294967295, then 1 is free again (ended), 2 and 3 are not.
    r.set_next_stream_id(StreamId::MAX);
    let d = r.open_stream(get("/d")).unwrap();
    let e = r.open_stream(get("/e")).unwrap();
    let f = r.open_stream(get("/f")).unwrap();
    assert_eq!(r.stream_id(d), Some(StreamId::MAX));
    assert_eq!(r.stream_id(e), Some(id(1)));
    assert_eq!(r.stream_id(f), Some(id(4)));
}

#[test]
fn request_frame_strips_hop_by_hop_headers() {
    let mut r = RelayConnection::default();
    let h = Headers::try_from_pairs([
        ("Authorization", "Bearer w"),
        ("Connection", "close, X-Hop"),
        ("X-Hop", "1"),
        ("Transfer-Encoding", "chunked"),
        ("Proxy-Authorization", "p"),
        ("content-type", "text/plain"),
    ])
    .unwrap();
    r.open_stream(RequestHead::new("POST", "/v1/execute", "a=1", h).unwrap())
        .unwrap();
    let out = drain(&mut r);
    let Decoded::Control(ControlFrame::Request { head, .. }) = &out[0] else {
        panic!()
    };
    let names: Vec<&str> = head.headers().iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["Authorization", "content-type"]);
    assert_eq!(head.query(), "a=1");
}

#[test]
fn body_of_any_piece_size_goes_out_in_chunks_of_at_most_1_mib_then_end() {
    let mut r = RelayConnection::new(
        RelayConfig::builder()
            .max_queued_per_stream(8 << 20)
            .build()
            .unwrap(),
    );
    let k = r.open_stream(post("/echo", None)).unwrap();
    let body = pattern(3 * MAX_CHUNK_BODY + 17);
    // Pieces of odd sizes.
    let mut rest = body.clone();
    for size in [1usize, 1000, 2 * MAX_CHUNK_BODY, usize::MAX] {
        let piece = rest.split_to(size.min(rest.len()));
        assert_eq!(r.send_body(k, piece.clone()).unwrap(), piece.len());
    }
    r.finish(k).unwrap();
    let out = drain(&mut r);
    let mut got = Vec::new();
    let mut kinds = Vec::new();
    for d in &out {
        match d {
            Decoded::Chunk(c) => {
                assert!(c.data.len() <= MAX_CHUNK_BODY);
                got.extend_from_slice(&c.data);
                kinds.push("chunk");
            }
            Decoded::Control(c) => kinds.push(c.type_name()),
            _ => unreachable!(),
        }
    }
    assert_eq!(got, body);
    assert_eq!(kinds.first(), Some(&"request"));
    assert_eq!(kinds.last(), Some(&"end"));
}

#[test]
fn request_without_body_is_request_then_end() {
    let mut r = RelayConnection::default();
    let k = r.open_stream(get("/health")).unwrap();
    r.finish(k).unwrap();
    let out: Vec<String> = drain(&mut r)
        .into_iter()
        .map(|d| match d {
            Decoded::Control(c) => c.encode(),
            _ => "chunk".into(),
        })
        .collect();
    assert_eq!(
        out,
        [
            r#"{"type":"request","id":1,"method":"GET","path":"/health","query":"","headers":[]}"#,
            r#"{"type":"end","id":1}"#
        ]
    );
}

#[test]
fn content_length_is_enforced_both_ways() {
    let mut r = RelayConnection::default();
    let k = r.open_stream(post("/x", Some(5))).unwrap();
    assert_eq!(r.send_body(k, Bytes::from_static(b"abc")).unwrap(), 3);
    assert_eq!(
        r.send_body(k, Bytes::from_static(b"def")),
        Err(WriteError::ContentLengthExceeded { limit: 5 })
    );
    assert_eq!(
        r.finish(k),
        Err(FinishError::ContentLengthShort {
            expected: 5,
            sent: 3
        })
    );
    let out = drain(&mut r);
    // The stream was aborted before anything went out: nothing goes out at all.
    let tags: Vec<&str> = out
        .iter()
        .map(|d| match d {
            Decoded::Control(c) => c.type_name(),
            _ => "chunk",
        })
        .collect();
    assert!(tags.is_empty(), "{tags:?}");
    // Once the request went out, the short body aborts it on the wire.
    let k = r.open_stream(post("/x", Some(5))).unwrap();
    drain(&mut r);
    r.send_body(k, Bytes::from_static(b"abc")).unwrap();
    assert!(r.finish(k).is_err());
    let out = drain(&mut r);
    assert_eq!(
        out,
        [Decoded::Control(ControlFrame::Abort { id: r_id_of(&out) })]
    );
    // An exact body passes.
    let k = r.open_stream(post("/x", Some(3))).unwrap();
    r.send_body(k, Bytes::from_static(b"abc")).unwrap();
    assert_eq!(r.finish(k), Ok(()));
    // An invalid Content-Length is refused at open.
    let h = Headers::try_from_pairs([("content-length", "1"), ("content-length", "2")]).unwrap();
    let bad = RequestHead::new("POST", "/", "", h).unwrap();
    assert_eq!(r.open_stream(bad), Err(OpenError::InvalidContentLength));
}

#[test]
fn abort_sends_abort_and_nothing_more() {
    let mut r = RelayConnection::default();
    let k = r.open_stream(post("/x", None)).unwrap();
    drain(&mut r);
    r.send_body(k, pattern(100)).unwrap();
    r.abort(k);
    assert_eq!(r.send_body(k, pattern(10)), Ok(10), "swallowed");
    assert_eq!(r.finish(k), Ok(()));
    let out = drain(&mut r);
    assert_eq!(out, [Decoded::Control(ControlFrame::Abort { id: id(1) })]);
    // The worker's late frames for it are ignored; no event follows.
    feed(&mut r, resp(1));
    assert_eq!(r.poll_event(), None);
    assert_eq!(r.stats().messages_ignored, 1);
}

#[test]
fn worker_frames_become_events() {
    let mut r = RelayConnection::default();
    let k = r.open_stream(get("/bytes")).unwrap();
    r.finish(k).unwrap();
    drain(&mut r);
    feed(&mut r, resp(1));
    r.handle_message(
        Message::Binary(Bytes::from_static(b"\0\0\0\x01hello")),
        now(),
    )
    .unwrap();
    feed(&mut r, ControlFrame::End { id: id(1) });
    let evs: Vec<RelayEvent> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(
        matches!(&evs[0], RelayEvent::Response { key, head } if *key == k && head.status() == 200)
    );
    assert_eq!(evs[1], RelayEvent::Readable { key: k });
    assert_eq!(
        evs[2],
        RelayEvent::Ended {
            key: k,
            reason: RelayEnd::Completed,
            response_started: true
        }
    );
    assert_eq!(
        relay_read_all(&mut r, k),
        (b"hello".to_vec(), BodyRead::End)
    );
    assert_eq!(r.read_body(k), BodyRead::Gone, "forgotten after End");

    // Worker abort before and after the response head.
    let a = r.open_stream(get("/a")).unwrap();
    let b = r.open_stream(get("/b")).unwrap();
    let (ia, ib) = (r.stream_id(a).unwrap(), r.stream_id(b).unwrap());
    feed(&mut r, ControlFrame::Abort { id: ia });
    feed(
        &mut r,
        ControlFrame::Response {
            id: ib,
            head: ok_head(),
        },
    );
    feed(&mut r, ControlFrame::Abort { id: ib });
    let evs: Vec<RelayEvent> = std::iter::from_fn(|| r.poll_event()).collect();
    assert_eq!(
        evs[0],
        RelayEvent::Ended {
            key: a,
            reason: RelayEnd::WorkerAborted,
            response_started: false
        }
    );
    assert_eq!(
        evs[2],
        RelayEvent::Ended {
            key: b,
            reason: RelayEnd::WorkerAborted,
            response_started: true
        }
    );
}

#[test]
fn protocol_errors_fail_the_stream_and_abort_it() {
    let mut r = RelayConnection::default();
    let k = r.open_stream(get("/")).unwrap();
    drain(&mut r);
    r.handle_message(Message::Binary(Bytes::from_static(b"\0\0\0\x01x")), now())
        .unwrap();
    assert_eq!(
        r.poll_event(),
        Some(RelayEvent::Ended {
            key: k,
            reason: RelayEnd::ProtocolError,
            response_started: false
        })
    );
    assert_eq!(
        drain(&mut r),
        [Decoded::Control(ControlFrame::Abort { id: id(1) })]
    );
    let k = r.open_stream(get("/")).unwrap();
    let i = r.stream_id(k).unwrap();
    feed(&mut r, ControlFrame::End { id: i });
    assert!(matches!(
        r.poll_event(),
        Some(RelayEvent::Ended {
            reason: RelayEnd::ProtocolError,
            ..
        })
    ));
}

#[test]
fn after_the_response_ended_the_rest_of_the_request_body_is_not_sent() {
    let mut p = Pair::default_pair();
    let k = p.relay.open_stream(post("/upload", None)).unwrap();
    p.relay.send_body(k, pattern(1000)).unwrap();
    p.progress();
    let (wk, _) = p.worker_requests()[0].clone();
    // The worker answers 401 without reading.
    p.worker.discard_body(wk);
    p.worker
        .respond(
            wk,
            worker_relay::frame::ResponseHead::new(401, Headers::new()).unwrap(),
        )
        .unwrap();
    p.worker.finish(wk).unwrap();
    p.progress();
    let sent_before = p.relay_sent.len();
    assert_eq!(p.relay.send_body(k, pattern(5000)), Ok(5000), "swallowed");
    assert_eq!(p.relay.finish(k), Ok(()));
    p.progress();
    assert_eq!(p.relay_sent.len(), sent_before, "nothing more went out");
    assert!(p.relay_events.iter().any(|e| matches!(
        e,
        RelayEvent::Ended {
            reason: RelayEnd::Completed,
            ..
        }
    )));
}

#[test]
fn connection_loss_ends_every_stream_with_started_flag() {
    let mut p = Pair::default_pair();
    let a = p.relay.open_stream(get("/a")).unwrap();
    let b = p.relay.open_stream(get("/b")).unwrap();
    p.relay.finish(a).unwrap();
    p.relay.finish(b).unwrap();
    p.progress();
    let reqs = p.worker_requests();
    p.worker.respond(reqs[1].0, ok_head()).unwrap();
    p.progress();
    p.take_relay_events();
    p.lose();
    let evs = p.take_relay_events();
    assert!(evs.contains(&RelayEvent::Ended {
        key: a,
        reason: RelayEnd::ConnectionLost,
        response_started: false
    }));
    assert!(evs.contains(&RelayEvent::Ended {
        key: b,
        reason: RelayEnd::ConnectionLost,
        response_started: true
    }));
    assert_eq!(
        p.relay.open_stream(get("/c")),
        Err(OpenError::ConnectionClosed)
    );
    let ended = p
        .worker_events
        .iter()
        .filter(|e| matches!(e, WorkerEvent::Ended { .. }))
        .count();
    assert_eq!(ended, 2);
}

#[test]
fn bounds_on_streams_and_queued_bytes() {
    let mut r = RelayConnection::new(
        RelayConfig::builder()
            .max_streams(2)
            .reserved_streams(0)
            .max_queued_per_stream(1000)
            .max_queued(1500)
            .build()
            .unwrap(),
    );
    let a = r.open_stream(post("/a", None)).unwrap();
    let b = r.open_stream(post("/b", None)).unwrap();
    assert_eq!(
        r.open_stream(get("/c")),
        Err(OpenError::TooManyStreams { limit: 2 })
    );
    assert_eq!(r.send_body(a, pattern(4000)).unwrap(), 1000);
    assert_eq!(r.send_body(a, pattern(10)).unwrap(), 0);
    assert_eq!(r.send_capacity(b), 500);
    assert_eq!(r.send_body(b, pattern(4000)).unwrap(), 500);
    assert_eq!(r.stats().body_queued_out, 1500);
    // Draining frees room and says so.
    drain(&mut r);
    let evs: Vec<RelayEvent> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(evs.contains(&RelayEvent::Writable { key: a }));
    assert!(evs.contains(&RelayEvent::Writable { key: b }));
    assert_eq!(r.send_capacity(a), 1000);
    assert_eq!(r.stats().body_queued_out_max, 1500);
}

#[test]
fn unknown_types_and_ids_and_garbage_are_ignored() {
    let mut r = RelayConnection::default();
    let k = r.open_stream(get("/")).unwrap();
    drain(&mut r);
    for m in [
        Message::Text(r#"{"type":"hello","id":1}"#.into()),
        Message::Text("not json".into()),
        Message::Text(r#"{"type":"end","id":99}"#.into()),
        Message::Binary(Bytes::from_static(b"\0\0\0\x63data")),
        Message::Binary(Bytes::from_static(b"\0\0")),
        Message::Text(r#"{"type":"request","id":1,"method":"GET","path":"/"}"#.into()),
    ] {
        r.handle_message(m, now()).unwrap();
    }
    assert_eq!(r.poll_event(), None);
    assert_eq!(r.stats().messages_ignored, 6);
    assert_eq!(r.stream_id(k), Some(id(1)));
    // Too big closes with 1009.
    r.handle_message(
        Message::Binary(Bytes::from(vec![0; MAX_CHUNK_BODY + 5])),
        now(),
    )
    .unwrap();
    let Some(Message::Close(Some(c))) = r.poll_transmit() else {
        panic!()
    };
    assert_eq!(c.code.0, 1009);
    assert!(r.is_closed());
    assert!(matches!(
        r.poll_event(),
        Some(RelayEvent::Ended {
            reason: RelayEnd::ConnectionLost,
            ..
        })
    ));
}

#[test]
fn after_a_started_response_fails_what_arrived_is_still_read_then_gone() {
    let mut r = RelayConnection::default();
    let k = r.open_stream(get("/fail-after")).unwrap();
    r.finish(k).unwrap();
    drain(&mut r);
    feed(&mut r, resp(1));
    r.handle_message(
        Message::Binary(Bytes::from_static(b"\0\0\0\x01part")),
        now(),
    )
    .unwrap();
    feed(&mut r, ControlFrame::Abort { id: id(1) });
    let evs: Vec<RelayEvent> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(evs.contains(&RelayEvent::Ended {
        key: k,
        reason: RelayEnd::WorkerAborted,
        response_started: true
    }));
    assert_eq!(
        relay_read_all(&mut r, k),
        (b"part".to_vec(), BodyRead::Gone)
    );
    assert_eq!(r.open_streams(), 0, "forgotten once the failure was read");
    assert_eq!(r.stats().body_buffered_in, 0);
}

#[test]
fn letting_go_of_a_response_complete_by_its_content_length_is_not_an_abort() {
    let mut r = RelayConnection::default();
    let k = r.open_stream(get("/bytes")).unwrap();
    r.finish(k).unwrap();
    drain(&mut r);
    let h = Headers::try_from_pairs([("content-length", "5")]).unwrap();
    feed(
        &mut r,
        ControlFrame::Response {
            id: id(1),
            head: worker_relay::frame::ResponseHead::new(200, h).unwrap(),
        },
    );
    r.handle_message(
        Message::Binary(Bytes::from_static(b"\0\0\0\x01hello")),
        now(),
    )
    .unwrap();
    // The HTTP server has written all 5 bytes and drops the body before `end`.
    assert_eq!(relay_read_all(&mut r, k).0, b"hello");
    r.abort(k);
    assert!(drain(&mut r).is_empty(), "no abort for a complete response");
    assert_eq!(r.stream_id(k), None, "the application has let go");
    // The id stays taken until the worker's `end`: the next stream skips it.
    r.set_next_stream_id(id(1));
    let k2 = r.open_stream(get("/other")).unwrap();
    assert_eq!(r.stream_id(k2), Some(id(2)));
    r.abort(k2);
    drain(&mut r);
    feed(&mut r, ControlFrame::End { id: id(1) });
    assert_eq!(
        r.poll_event().map(|e| e.key()),
        None,
        "no event for a stream let go of"
    );
    assert_eq!(r.open_streams(), 0);
    assert_eq!(r.stats().streams_closed, 2);
    // A response short of its Content-Length is still aborted.
    let k = r.open_stream(get("/bytes")).unwrap();
    r.finish(k).unwrap();
    let i = r.stream_id(k).unwrap();
    drain(&mut r);
    let h = Headers::try_from_pairs([("content-length", "5")]).unwrap();
    feed(
        &mut r,
        ControlFrame::Response {
            id: i,
            head: worker_relay::frame::ResponseHead::new(200, h).unwrap(),
        },
    );
    r.abort(k);
    assert_eq!(
        drain(&mut r),
        [Decoded::Control(ControlFrame::Abort { id: i })]
    );
}

#[test]
fn a_stream_whose_head_never_went_out_ends_unsent_when_the_connection_goes() {
    let mut p = Pair::default_pair();
    let sent = p.relay.open_stream(get("/sent")).unwrap();
    p.relay.finish(sent).unwrap();
    p.progress();
    assert_eq!(p.worker_requests().len(), 1);
    // Opened but not transmitted yet: the worker never saw it.
    let queued = p.relay.open_stream(get("/queued")).unwrap();
    p.relay.finish(queued).unwrap();
    p.take_relay_events();
    p.relay
        .close(worker_relay::frame::CloseCode::GOING_AWAY, "bye");
    let mut evs = Vec::new();
    while let Some(e) = p.relay.poll_event() {
        evs.push(e);
    }
    assert!(
        evs.contains(&RelayEvent::Ended {
            key: sent,
            reason: RelayEnd::ConnectionLost,
            response_started: false
        }),
        "{evs:?}"
    );
    assert!(
        evs.contains(&RelayEvent::Ended {
            key: queued,
            reason: RelayEnd::Unsent,
            response_started: false
        }),
        "{evs:?}"
    );
    assert!(RelayEnd::Unsent.is_failure());
    // Nothing of it goes out after the close.
    p.progress();
    assert_eq!(p.worker_requests().len(), 1);
}
