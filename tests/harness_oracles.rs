//! Tests of the fuzz harness's shared oracles (crate `worker-relay-harness`,
//! in `fuzz/harness`): with [`WireCheck`] a valid conversation passes and
//! each rule catches the message that breaks it; [`Expected`] takes exactly
//! the next bytes of a body. Both are what the fuzz targets and
//! `tests/proto_props.rs` judge the machines by, so they are tested here,
//! under the crate's test command.

use bytes::Bytes;
use worker_relay::frame::{
    self, CloseCode, CloseFrame, ControlFrame, Headers, Message, RequestHead, ResponseHead,
    StreamId, MAX_CHUNK_BODY,
};
use worker_relay_harness::{BodyKind, Expected, Seen, Side, WireCheck};

fn id(n: u32) -> StreamId {
    StreamId::new(n).expect("nonzero")
}

fn request(n: u32, content_length: Option<u64>) -> Message {
    let mut h = Headers::new();
    if let Some(cl) = content_length {
        h.try_push("content-length", cl.to_string()).expect("valid");
    }
    let head = RequestHead::new("POST", "/x", "", h).expect("valid");
    ControlFrame::Request { id: id(n), head }.to_message()
}

fn response(n: u32, status: u16) -> Message {
    let head = ResponseHead::new(status, Headers::new()).expect("valid");
    ControlFrame::Response { id: id(n), head }.to_message()
}

fn chunk(n: u32, data: &[u8]) -> Message {
    Message::Binary(frame::encode_chunk(id(n), data))
}

fn end(n: u32) -> Message {
    ControlFrame::End { id: id(n) }.to_message()
}

fn abort(n: u32) -> Message {
    ControlFrame::Abort { id: id(n) }.to_message()
}

/// A relay checker with a request under id 1 (tag 10) on the wire.
fn relay_with_request(content_length: Option<u64>) -> WireCheck<u32> {
    let mut w = WireCheck::new(Side::Relay, 4);
    assert!(matches!(
        w.observe(&request(1, content_length)),
        Seen::Request { .. }
    ));
    w.open(id(1), 10, BodyKind::Streamed);
    w
}

#[test]
fn a_valid_relay_conversation_passes() {
    let mut w = relay_with_request(Some(5));
    let seen = w.observe(&chunk(1, b"ab"));
    assert_eq!(
        seen,
        Seen::Chunk {
            id: id(1),
            data: Bytes::from_static(b"ab"),
            tag: 10
        }
    );
    w.observe(&chunk(1, b"cde"));
    assert_eq!(w.observe(&end(1)), Seen::End { id: id(1), tag: 10 });
    assert!(w.in_flight(id(1)), "the response may still come");
    // The worker's `end` arrives: the id is free for a new request.
    assert!(w.release_for(id(1), &10));
    w.observe(&request(1, None));
    w.open(id(1), 11, BodyKind::Streamed);
    // An abort after `end` and one for an id never on the wire.
    w.observe(&end(1));
    assert_eq!(
        w.observe(&abort(1)),
        Seen::Abort {
            id: id(1),
            tag: Some(11)
        }
    );
    assert_eq!(
        w.observe(&abort(2)),
        Seen::Abort {
            id: id(2),
            tag: None
        }
    );
    let close = Message::Close(Some(CloseFrame {
        code: CloseCode(1000),
        reason: "bye".into(),
    }));
    assert_eq!(
        w.observe(&close),
        Seen::Close {
            code: 1000,
            reason_len: 3
        }
    );
    assert!(w.is_closed());
}

#[test]
fn a_valid_worker_conversation_passes() {
    let mut w = WireCheck::new(Side::Worker, 4).pings(true);
    w.observe(&response(7, 200));
    w.open(id(7), 'a', BodyKind::Streamed);
    w.observe(&chunk(7, b"abcd"));
    assert_eq!(
        w.observe(&end(7)),
        Seen::End {
            id: id(7),
            tag: 'a'
        }
    );
    assert!(w.is_empty(), "the worker's end frees the id");
    // The worker's own answer: one chunk over the chunk size.
    w.observe(&response(7, 500));
    w.open(id(7), 'b', BodyKind::Answer);
    w.observe(&chunk(7, b"Internal Server Error"));
    w.observe(&end(7));
    w.observe(&response(8, 204));
    w.open(id(8), 'c', BodyKind::Empty);
    w.observe(&end(8));
    assert!(matches!(
        w.observe(&Message::Ping(Bytes::new())),
        Seen::Ping(_)
    ));
}

#[test]
#[should_panic(expected = "relay chunk for id 1 after its end")]
fn a_chunk_after_end_panics() {
    let mut w = relay_with_request(None);
    w.observe(&end(1));
    w.observe(&chunk(1, b"a"));
}

#[test]
#[should_panic(expected = "relay chunk for id 1, not on the wire")]
fn a_chunk_after_abort_panics() {
    let mut w = relay_with_request(None);
    w.observe(&abort(1));
    w.observe(&chunk(1, b"a"));
}

#[test]
#[should_panic(expected = "relay chunk for id 2, not on the wire")]
fn a_chunk_without_a_head_panics() {
    let mut w = relay_with_request(None);
    w.observe(&chunk(2, b"a"));
}

#[test]
#[should_panic(expected = "relay emitted a second head under id 1, still in flight")]
fn a_second_head_while_in_flight_panics() {
    let mut w = relay_with_request(None);
    w.observe(&end(1));
    w.observe(&request(1, None));
}

#[test]
#[should_panic(expected = "worker emitted a second head under id 3, still in flight")]
fn a_second_response_while_open_panics() {
    let mut w = WireCheck::new(Side::Worker, 4);
    w.observe(&response(3, 200));
    w.open(id(3), (), BodyKind::Streamed);
    w.observe(&response(3, 200));
}

#[test]
#[should_panic(expected = "relay sent a second end for id 1")]
fn a_second_end_panics() {
    let mut w = relay_with_request(None);
    w.observe(&end(1));
    w.observe(&end(1));
}

#[test]
#[should_panic(expected = "worker end for id 3, not on the wire")]
fn a_worker_end_after_its_end_panics() {
    let mut w = WireCheck::new(Side::Worker, 4);
    w.observe(&response(3, 200));
    w.open(id(3), (), BodyKind::Streamed);
    w.observe(&end(3));
    w.observe(&end(3));
}

#[test]
#[should_panic(expected = "relay emitted 1048581 bytes")]
fn an_oversize_message_panics() {
    let mut w = relay_with_request(None);
    w.observe(&chunk(1, &vec![0; MAX_CHUNK_BODY + 1]));
}

#[test]
#[should_panic(expected = "relay chunk of 5 bytes for id 1, over its limit of 4")]
fn a_chunk_over_the_chunk_size_panics() {
    let mut w = relay_with_request(None);
    w.observe(&chunk(1, b"abcde"));
}

#[test]
#[should_panic(expected = "relay emitted an empty chunk for id 1")]
fn an_empty_chunk_panics() {
    let mut w = relay_with_request(None);
    w.observe(&chunk(1, b""));
}

#[test]
#[should_panic(expected = "relay body of id 1 longer than its Content-Length 3")]
fn a_body_over_its_content_length_panics() {
    let mut w = relay_with_request(Some(3));
    w.observe(&chunk(1, b"ab"));
    w.observe(&chunk(1, b"cd"));
}

#[test]
#[should_panic(expected = "relay end for id 1 after 2 bytes of its Content-Length 3")]
fn an_end_short_of_the_content_length_panics() {
    let mut w = relay_with_request(Some(3));
    w.observe(&chunk(1, b"ab"));
    w.observe(&end(1));
}

#[test]
#[should_panic(expected = "worker chunk for id 8, which has no body")]
fn a_body_for_a_bodiless_response_panics() {
    let mut w = WireCheck::new(Side::Worker, 4);
    w.observe(&response(8, 204));
    w.open(id(8), (), BodyKind::Empty);
    w.observe(&chunk(8, b"a"));
}

#[test]
#[should_panic(expected = "worker emitted Control(Request")]
fn a_worker_request_panics() {
    WireCheck::<()>::new(Side::Worker, 4).observe(&request(1, None));
}

#[test]
#[should_panic(expected = "relay emitted Control(Response")]
fn a_relay_response_panics() {
    WireCheck::<()>::new(Side::Relay, 4).observe(&response(1, 200));
}

#[test]
#[should_panic(expected = "relay emitted an invalid frame")]
fn an_invalid_frame_panics() {
    WireCheck::<()>::new(Side::Relay, 4).observe(&Message::Text("{}".into()));
}

#[test]
#[should_panic(expected = "after its close")]
fn a_message_after_close_panics() {
    let mut w = relay_with_request(None);
    let close = Message::Close(Some(CloseFrame {
        code: CloseCode(1000),
        reason: String::new(),
    }));
    w.observe(&close);
    w.observe(&end(1));
}

#[test]
#[should_panic(expected = "worker closed without a code")]
fn a_close_without_a_code_panics() {
    WireCheck::<()>::new(Side::Worker, 4).observe(&Message::Close(None));
}

#[test]
#[should_panic(expected = "relay emitted a ping, which it may not")]
fn a_ping_without_keepalive_panics() {
    WireCheck::<()>::new(Side::Relay, 4).observe(&Message::Ping(Bytes::new()));
}

#[test]
#[should_panic(expected = "worker emitted a pong")]
fn a_pong_panics() {
    WireCheck::<()>::new(Side::Worker, 4)
        .pings(true)
        .observe(&Message::Pong(Bytes::new()));
}

#[test]
#[should_panic(expected = "model: opened id 2 without its head just seen")]
fn opening_another_id_than_the_head_panics() {
    let mut w = WireCheck::new(Side::Relay, 4);
    w.observe(&request(1, None));
    w.open(id(2), (), BodyKind::Streamed);
}

#[test]
fn exempt_ids_are_checked_as_single_messages_only() {
    let mut w = WireCheck::new(Side::Worker, 4);
    w.observe(&response(5, 200));
    w.open(id(5), (), BodyKind::Streamed);
    w.exempt(id(5));
    for m in [
        response(5, 200),
        chunk(5, b"abcdef"),
        end(5),
        end(5),
        abort(5),
    ] {
        assert!(matches!(w.observe(&m), Seen::Exempt(_)), "{m:?}");
    }
}

#[test]
#[should_panic(expected = "worker emitted an empty chunk for id 5")]
fn exempt_ids_still_get_no_empty_chunk() {
    let mut w = WireCheck::<()>::new(Side::Worker, 4);
    w.exempt(id(5));
    w.observe(&chunk(5, b""));
}

// Expected
#[test]
fn pieces_in_order_complete_a_whole_body() {
    let mut e = Expected::whole(Bytes::from_static(b"hello world"));
    e.take(b"hel", "t");
    e.take(b"lo w", "t");
    e.take(b"orld", "t");
    assert_eq!(e.taken(), 11);
    e.assert_complete("t");
}

#[test]
fn pieces_may_straddle_what_was_queued() {
    let mut e = Expected::new();
    e.push(Bytes::from_static(b"ab"));
    e.push(Bytes::from_static(b"cd"));
    e.take(b"abc", "t");
    assert!(!e.is_empty());
    e.take(b"d", "t");
    assert!(e.is_empty());
    e.seal();
    e.assert_complete("t");
}

#[test]
#[should_panic(expected = "t: bytes differ from the expected ones, at byte 3")]
fn a_wrong_byte_panics() {
    let mut e = Expected::whole(Bytes::from_static(b"abcd"));
    e.take(b"ab", "t");
    e.take(b"cx", "t");
}

#[test]
#[should_panic(expected = "t: 1 bytes more than expected, at byte 2")]
fn more_than_queued_panics() {
    let mut e = Expected::new();
    e.push(Bytes::from_static(b"ab"));
    e.take(b"abc", "t");
}

#[test]
#[should_panic(expected = "t: end after 1 bytes, 1 short of the body")]
fn a_short_body_is_not_complete() {
    let mut e = Expected::whole(Bytes::from_static(b"ab"));
    e.take(b"a", "t");
    e.assert_complete("t");
}

#[test]
#[should_panic(expected = "t: end before the body was finished")]
fn an_unsealed_body_is_not_complete() {
    Expected::new().assert_complete("t");
}
