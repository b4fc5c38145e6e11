//! The worker state machine, one test per behaviour of issue 3's "Worker side".
mod common;

use bytes::Bytes;
use common::*;
use std::time::Instant;
use worker_relay::frame::{
    decode, encode_chunk, ControlFrame, Decoded, Headers, Message, ResponseHead, StreamId,
    MAX_CHUNK_BODY,
};
use worker_relay::proto::{
    BodyRead, FinishError, RespondError, StreamKey, WorkerConfig, WorkerConnection, WorkerEnd,
    WorkerEvent, WriteError,
};

fn id(n: u32) -> StreamId {
    StreamId::new(n).unwrap()
}

fn text(w: &mut WorkerConnection, t: &str) {
    w.handle_message(Message::Text(t.into()), Instant::now())
        .unwrap();
}

fn request(w: &mut WorkerConnection, n: i64, path: &str) {
    text(
        w,
        &format!(
            r#"{{"type":"request","id":{n},"method":"GET","path":"{path}","query":"","headers":[]}}"#
        ),
    );
}

fn chunk(
    w: &mut WorkerConnection,
    n: u32,
    data: &[u8],
) -> Result<(), worker_relay::proto::HandleError> {
    w.handle_message(Message::Binary(encode_chunk(id(n), data)), Instant::now())
}

fn events(w: &mut WorkerConnection) -> Vec<WorkerEvent> {
    std::iter::from_fn(|| w.poll_event()).collect()
}

fn drain(w: &mut WorkerConnection) -> Vec<String> {
    std::iter::from_fn(|| w.poll_transmit())
        .map(|m| match decode(&m) {
            Some(Ok(Decoded::Control(c))) => c.encode(),
            Some(Ok(Decoded::Chunk(c))) => {
                format!("chunk{}:{}", c.id, String::from_utf8_lossy(&c.data))
            }
            _ => format!("{m:?}"),
        })
        .collect()
}

fn request_key(evs: &[WorkerEvent]) -> StreamKey {
    evs.iter()
        .find_map(|e| match e {
            WorkerEvent::Request { key, .. } => Some(*key),
            _ => None,
        })
        .expect("a request event")
}

#[test]
fn request_frame_opens_a_stream_and_bad_ones_are_ignored() {
    let mut w = WorkerConnection::default();
    request(&mut w, 7, "/health");
    let evs = events(&mut w);
    let WorkerEvent::Request { id: got, head, .. } = &evs[0] else {
        panic!()
    };
    assert_eq!((got.get(), head.path()), (7, "/health"));
    // Already open, 0, out of range, negative, malformed: ignored.
    request(&mut w, 7, "/dup");
    request(&mut w, 0, "/zero");
    request(&mut w, 4294967296, "/big");
    request(&mut w, -1, "/neg");
    text(&mut w, r#"{"type":"request","id":8,"#);
    text(&mut w, r#"[1,2,3]"#);
    text(
        &mut w,
        r#"{"type":"request","id":8,"method":"GET","path":"/","headers":[["a","b\r\nc: d"]]}"#,
    );
    assert_eq!(events(&mut w), []);
    assert_eq!(w.stats().messages_ignored, 7);
    assert_eq!(w.stats().streams_open, 1);
    // Nothing is answered for ignored frames, except the request with a usable
    // id and a refused header: 400, so its caller does not wait forever.
    assert_eq!(
        drain(&mut w),
        [
            r#"{"type":"response","id":8,"status":400,"headers":[["content-type","text/plain; charset=utf-8"]]}"#,
            "chunk8:Bad Request: header 0: value contains CR, LF or NUL",
            r#"{"type":"end","id":8}"#
        ]
    );
}

#[test]
fn at_16_unread_chunks_reading_pauses_until_the_app_reads() {
    let mut w = WorkerConnection::default();
    request(&mut w, 1, "/upload");
    let k = request_key(&events(&mut w));
    for i in 0..16 {
        assert!(w.wants_read(), "chunk {i}");
        chunk(&mut w, 1, b"x").unwrap();
    }
    assert!(!w.wants_read());
    // A message fed anyway is handed back untouched, not lost (issue 13).
    let y = Message::Binary(encode_chunk(id(1), b"y"));
    let Err(worker_relay::proto::HandleError::ReadPaused(back)) =
        w.handle_message(y.clone(), Instant::now())
    else {
        panic!("a paused worker must refuse the message");
    };
    assert_eq!(back, y);
    assert_eq!(w.read_body(k), BodyRead::Data(Bytes::from_static(b"x")));
    assert!(w.wants_read());
    assert_eq!(w.stats().body_buffered_in, 15);
    assert_eq!(w.stats().body_buffered_in_max, 16);
    // Fed again, it is the body's 17th chunk.
    w.handle_message(back, Instant::now()).unwrap();
    for _ in 0..15 {
        assert_eq!(w.read_body(k), BodyRead::Data(Bytes::from_static(b"x")));
    }
    assert_eq!(w.read_body(k), BodyRead::Data(Bytes::from_static(b"y")));
}

#[test]
fn answered_without_reading_discards_the_rest_of_the_body() {
    let mut w = WorkerConnection::default();
    request(&mut w, 1, "/v1/execute");
    let k = request_key(&events(&mut w));
    for _ in 0..16 {
        chunk(&mut w, 1, &[0; 1000]).unwrap();
    }
    assert!(!w.wants_read());
    w.respond(k, ResponseHead::new(401, Headers::new()).unwrap())
        .unwrap();
    w.finish(k).unwrap();
    assert!(w.wants_read(), "held chunks were dropped");
    assert_eq!(w.stats().body_buffered_in, 0);
    // Chunks still arriving are dropped, not held.
    chunk(&mut w, 1, &[0; 1000]).unwrap();
    assert_eq!(w.stats().body_buffered_in, 0);
    // The app may also discard explicitly before answering.
    request(&mut w, 2, "/x");
    let k2 = request_key(&events(&mut w));
    chunk(&mut w, 2, b"abc").unwrap();
    w.discard_body(k2);
    chunk(&mut w, 2, b"def").unwrap();
    assert_eq!(w.stats().body_buffered_in, 0);
    assert_eq!(w.read_body(k2), BodyRead::Gone);
}

#[test]
fn relay_abort_drops_the_body_and_swallows_the_later_response() {
    let mut w = WorkerConnection::default();
    request(&mut w, 3, "/sleep");
    let k = request_key(&events(&mut w));
    chunk(&mut w, 3, b"abc").unwrap();
    text(&mut w, r#"{"type":"abort","id":3}"#);
    let evs = events(&mut w);
    assert!(evs.contains(&WorkerEvent::Ended {
        key: k,
        reason: WorkerEnd::ClientAborted
    }));
    assert_eq!(w.read_body(k), BodyRead::Gone);
    assert_eq!(w.stats().body_buffered_in, 0);
    assert_eq!(w.respond(k, ok_head()), Ok(()));
    assert_eq!(w.send_body(k, Bytes::from_static(b"late")), Ok(4));
    assert_eq!(w.finish(k), Ok(()));
    assert_eq!(w.fail(k), Ok(()));
    assert!(
        drain(&mut w).is_empty(),
        "nothing is sent for an aborted stream"
    );
    // A key never handed out (here, one from another connection) is an
    // error, not swallowed.
    let mut other = worker_relay::proto::RelayConnection::default();
    let foreign = (0..99)
        .map(|_| {
            let k = other.open_stream(common::get("/")).unwrap();
            other.abort(k);
            k
        })
        .last()
        .unwrap();
    assert_eq!(foreign.get(), 99);
    assert_eq!(w.finish(foreign), Err(FinishError::UnknownStream));
}

#[test]
fn respond_send_finish() {
    let mut w = WorkerConnection::default();
    request(&mut w, 5, "/echo");
    let k = request_key(&events(&mut w));
    assert_eq!(
        w.send_body(k, Bytes::from_static(b"x")),
        Err(WriteError::NotResponded)
    );
    w.respond(
        k,
        ResponseHead::new(
            200,
            Headers::try_from_pairs([("content-type", "text/plain")]).unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(w.respond(k, ok_head()), Err(RespondError::AlreadyResponded));
    w.send_body(k, Bytes::from_static(b"hello")).unwrap();
    w.finish(k).unwrap();
    assert_eq!(
        w.send_body(k, Bytes::from_static(b"x")),
        Err(WriteError::AlreadyFinished)
    );
    assert_eq!(
        drain(&mut w),
        [
            r#"{"type":"response","id":5,"status":200,"headers":[["content-type","text/plain"]]}"#,
            "chunk5:hello",
            r#"{"type":"end","id":5}"#
        ]
    );
    assert_eq!(
        events(&mut w),
        [WorkerEvent::Ended {
            key: k,
            reason: WorkerEnd::Completed
        }]
    );
}

#[test]
fn large_response_is_split_into_chunks_of_at_most_1_mib() {
    let mut w = WorkerConnection::new(
        WorkerConfig::builder()
            .max_queued_per_stream(4 << 20)
            .build()
            .unwrap(),
    );
    request(&mut w, 1, "/bytes");
    let k = request_key(&events(&mut w));
    w.respond(k, ok_head()).unwrap();
    let body = pattern(3 * MAX_CHUNK_BODY + 1);
    assert_eq!(w.send_body(k, body.clone()).unwrap(), body.len());
    w.finish(k).unwrap();
    let mut got = Vec::new();
    while let Some(m) = w.poll_transmit() {
        if let Some(Ok(Decoded::Chunk(c))) = decode(&m) {
            assert!(c.data.len() <= MAX_CHUNK_BODY);
            got.extend_from_slice(&c.data);
        }
    }
    assert_eq!(got, body);
}

#[test]
fn fail_before_response_is_500_after_is_abort() {
    let mut w = WorkerConnection::default();
    request(&mut w, 1, "/fail-before");
    request(&mut w, 2, "/fail-after");
    let evs = events(&mut w);
    let keys: Vec<StreamKey> = evs
        .iter()
        .filter_map(|e| match e {
            WorkerEvent::Request { key, .. } => Some(*key),
            _ => None,
        })
        .collect();
    w.fail(keys[0]).unwrap();
    w.respond(keys[1], ok_head()).unwrap();
    w.send_body(keys[1], Bytes::from_static(b"par")).unwrap();
    let first = drain(&mut w);
    w.fail(keys[1]).unwrap();
    let second = drain(&mut w);
    assert_eq!(
        first[0],
        r#"{"type":"response","id":1,"status":500,"headers":[["content-type","text/plain; charset=utf-8"]]}"#
    );
    assert!(first.contains(&"chunk1:Internal Server Error".to_string()));
    assert!(first.contains(&r#"{"type":"end","id":1}"#.to_string()));
    assert_eq!(second, [r#"{"type":"abort","id":2}"#]);
    let evs = events(&mut w);
    assert!(evs.contains(&WorkerEvent::Ended {
        key: keys[0],
        reason: WorkerEnd::Completed
    }));
    assert!(evs.contains(&WorkerEvent::Ended {
        key: keys[1],
        reason: WorkerEnd::Failed
    }));
}

#[test]
fn response_content_length_is_enforced() {
    let mut w = WorkerConnection::default();
    request(&mut w, 1, "/bytes");
    let k = request_key(&events(&mut w));
    let h = Headers::try_from_pairs([("content-length", "4")]).unwrap();
    w.respond(k, ResponseHead::new(200, h).unwrap()).unwrap();
    assert_eq!(
        w.send_body(k, pattern(5)),
        Err(WriteError::ContentLengthExceeded { limit: 4 })
    );
    w.send_body(k, pattern(3)).unwrap();
    assert_eq!(
        w.finish(k),
        Err(FinishError::ContentLengthShort {
            expected: 4,
            sent: 3
        })
    );
    let out = drain(&mut w);
    assert_eq!(out.last().unwrap(), r#"{"type":"abort","id":1}"#);
}

#[test]
fn oversize_message_closes_with_1009() {
    let mut w = WorkerConnection::default();
    request(&mut w, 1, "/x");
    let k = request_key(&events(&mut w));
    let big = vec![b' '; MAX_CHUNK_BODY + 5];
    w.handle_message(
        Message::Text(String::from_utf8(big).unwrap()),
        Instant::now(),
    )
    .unwrap();
    let Some(Message::Close(Some(c))) = w.poll_transmit() else {
        panic!("no close")
    };
    assert_eq!(c.code.0, 1009);
    assert_eq!(w.poll_transmit(), None);
    assert!(w.is_closed() && !w.wants_read());
    assert_eq!(
        events(&mut w),
        [WorkerEvent::Ended {
            key: k,
            reason: WorkerEnd::ConnectionLost
        }]
    );
    // Exactly 1 MiB + 4 is fine.
    let mut w = WorkerConnection::default();
    request(&mut w, 1, "/x");
    chunk(&mut w, 1, &vec![1; MAX_CHUNK_BODY]).unwrap();
    assert!(!w.is_closed());
}

#[test]
fn unknown_types_and_ids_not_open_are_ignored() {
    let mut w = WorkerConnection::default();
    text(&mut w, r#"{"type":"ping","id":1}"#);
    text(&mut w, r#"{"type":"end","id":1}"#);
    text(&mut w, r#"{"type":"abort","id":1}"#);
    text(&mut w, r#"{"type":"response","id":1,"status":200}"#);
    chunk(&mut w, 9, b"x").unwrap();
    w.handle_message(
        Message::Binary(Bytes::from_static(b"\0\0\0\0x")),
        Instant::now(),
    )
    .unwrap();
    w.handle_message(Message::Binary(Bytes::from_static(b"\0\0")), Instant::now())
        .unwrap();
    assert_eq!(events(&mut w), []);
    assert_eq!(w.stats().messages_ignored, 7);
    assert!(!w.is_closed());
}

#[test]
fn connection_closed_tells_every_open_stream() {
    let mut w = WorkerConnection::default();
    request(&mut w, 1, "/a");
    request(&mut w, 2, "/b");
    let evs = events(&mut w);
    let keys: Vec<StreamKey> = evs
        .iter()
        .filter_map(|e| match e {
            WorkerEvent::Request { key, .. } => Some(*key),
            _ => None,
        })
        .collect();
    w.respond(keys[1], ok_head()).unwrap();
    w.handle_message(Message::Close(None), Instant::now())
        .unwrap();
    let evs = events(&mut w);
    assert_eq!(
        evs,
        [
            WorkerEvent::Ended {
                key: keys[0],
                reason: WorkerEnd::ConnectionLost
            },
            WorkerEvent::Ended {
                key: keys[1],
                reason: WorkerEnd::ConnectionLost
            }
        ]
    );
    assert_eq!(w.poll_transmit(), None);
    assert_eq!(w.read_body(keys[0]), BodyRead::Gone);
}

#[test]
fn too_many_requests_are_refused_with_503() {
    let mut w = WorkerConnection::new(
        WorkerConfig::builder()
            .max_streams(1)
            .reserved_streams(0)
            .build()
            .unwrap(),
    );
    request(&mut w, 1, "/a");
    request(&mut w, 2, "/b");
    assert_eq!(events(&mut w).len(), 1);
    assert_eq!(
        drain(&mut w),
        [
            r#"{"type":"response","id":2,"status":503,"headers":[["content-length","0"],["retry-after","1"]]}"#,
            r#"{"type":"end","id":2}"#
        ]
    );
    let _ = ControlFrame::End { id: id(1) };
}
