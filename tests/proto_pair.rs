//! Both machines together in the in-memory pair: ordering, fairness, counters.
mod common;

use bytes::Bytes;
use common::*;
use worker_relay::frame::{Headers, ResponseHead};
use worker_relay::proto::{BodyRead, RelayEnd, RelayEvent, WorkerEnd, WorkerEvent};

#[test]
fn a_small_request_completes_while_a_64_mib_upload_is_in_flight() {
    const UPLOAD: usize = 64 << 20;
    let mut p = Pair::default_pair();
    p.record = false;
    let big = p.relay.open_stream(post("/upload", Some(UPLOAD))).unwrap();
    let body = pattern(UPLOAD);
    let mut rest = body.clone();
    let mut small = None;
    let mut small_done_at = None;
    let mut answered = false;
    for _ in 0..100_000 {
        if !rest.is_empty() {
            let n = p.relay.send_body(big, rest.clone()).unwrap();
            let _ = rest.split_to(n);
            if rest.is_empty() {
                p.relay.finish(big).unwrap();
            }
        }
        // Once the upload is under way, the caller sends GET /health.
        if small.is_none() && rest.len() < UPLOAD - (2 << 20) {
            let k = p.relay.open_stream(get("/health")).unwrap();
            p.relay.finish(k).unwrap();
            small = Some(k);
        }
        p.step();
        if !answered {
            if let Some((wk, _)) = p
                .worker_requests()
                .into_iter()
                .find(|(_, h)| h.path() == "/health")
            {
                p.worker.respond(wk, ok_head()).unwrap();
                p.worker
                    .send_body(wk, Bytes::from_static(b"{\"status\":\"ok\"}"))
                    .unwrap();
                p.worker.finish(wk).unwrap();
                answered = true;
            }
        }
        if small_done_at.is_none() {
            let done = p.relay_events.iter().any(|e| {
                matches!(e, RelayEvent::Ended { key, reason: RelayEnd::Completed, .. } if Some(*key) == small)
            });
            if done {
                let received = p
                    .worker_bodies
                    .values()
                    .map(|(b, _)| b.len())
                    .max()
                    .unwrap_or(0);
                small_done_at = Some(received);
            }
        }
        if small_done_at.is_some() && rest.is_empty() {
            break;
        }
    }
    p.progress();
    let at = small_done_at.expect("the small request completed");
    assert!(
        at < UPLOAD / 4,
        "small request completed after {at} bytes of the upload"
    );
    let small = small.unwrap();
    assert_eq!(p.relay_bodies[&small].0, b"{\"status\":\"ok\"}");
    // The upload itself arrived byte-exact.
    let (wk, _) = p.worker_requests()[0].clone();
    let (got, end) = &p.worker_bodies[&wk];
    assert_eq!(end, &Some(BodyRead::End));
    assert!(got[..] == body[..], "upload corrupted");
    eprintln!("small request done after {at} of {UPLOAD} upload bytes");
}

#[test]
fn echo_round_trip_and_counters() {
    let mut p = Pair::default_pair();
    let body = pattern(3 << 20);
    let k = p
        .relay
        .open_stream(post("/echo", Some(body.len())))
        .unwrap();
    relay_send_all(&mut p, k, body.clone());
    p.relay.finish(k).unwrap();
    p.progress();
    let (wk, head) = p.worker_requests()[0].clone();
    assert_eq!(head.headers().content_length(), Ok(Some(body.len() as u64)));
    let received = p.worker_bodies[&wk].0.clone();
    assert_eq!(received.len(), body.len());
    p.worker
        .respond(wk, ResponseHead::new(200, Headers::new()).unwrap())
        .unwrap();
    let mut rest = Bytes::from(received);
    while !rest.is_empty() {
        let n = p.worker.send_body(wk, rest.clone()).unwrap();
        let _ = rest.split_to(n);
        p.step();
    }
    p.worker.finish(wk).unwrap();
    p.progress();
    assert_eq!(p.relay_bodies[&k].0, body);
    assert_eq!(p.relay_bodies[&k].1, Some(BodyRead::End));
    assert!(p.worker_events.contains(&WorkerEvent::Ended {
        key: wk,
        reason: WorkerEnd::Completed
    }));

    let rs = p.relay.stats();
    let ws = p.worker.stats();
    assert_eq!(
        (rs.streams_opened, rs.streams_open, rs.streams_closed),
        (1, 0, 1)
    );
    assert_eq!(
        (ws.streams_opened, ws.streams_open, ws.streams_closed),
        (1, 0, 1)
    );
    assert_eq!(rs.bytes_out, ws.bytes_in);
    assert_eq!(ws.bytes_out, rs.bytes_in);
    assert!(rs.bytes_out > body.len() as u64);
    assert!(ws.body_buffered_in_max > 0 && ws.body_buffered_in_max <= 16 << 20);
    assert!(rs.body_queued_out_max <= p.relay.config().max_queued() as u64);
    assert_eq!((rs.body_buffered_in, ws.body_buffered_in), (0, 0));
}

#[test]
fn caller_abort_reaches_the_worker_app() {
    let mut p = Pair::default_pair();
    let k = p.relay.open_stream(get("/sleep")).unwrap();
    p.relay.finish(k).unwrap();
    p.progress();
    let (wk, _) = p.worker_requests()[0].clone();
    p.relay.abort(k);
    p.progress();
    assert!(p.worker_events.contains(&WorkerEvent::Ended {
        key: wk,
        reason: WorkerEnd::ClientAborted
    }));
    // The app answers late: nothing reaches the relay.
    p.worker.respond(wk, ok_head()).unwrap();
    p.worker.finish(wk).unwrap();
    let before = p.worker_sent.len();
    p.progress();
    assert_eq!(p.worker_sent.len(), before);
    assert!(!p
        .relay_events
        .iter()
        .any(|e| matches!(e, RelayEvent::Response { .. })));
}

mod keepalive {
    use super::*;
    use std::time::Duration;
    use worker_relay::frame::Message;

    fn pings(p: &Pair) -> usize {
        p.worker_sent
            .iter()
            .filter(|m| matches!(m, Message::Ping(_)))
            .count()
    }

    #[test]
    fn the_worker_pings_every_20_s_and_a_pong_keeps_the_connection() {
        let mut p = Pair::default_pair();
        p.progress();
        assert_eq!(pings(&p), 0);
        assert_eq!(
            p.worker.poll_timeout(),
            Some(p.now + Duration::from_secs(20))
        );
        for n in 1..=5 {
            p.advance(Duration::from_secs(20));
            p.progress();
            assert_eq!(pings(&p), n, "ping {n}");
        }
        assert!(!p.worker.is_closed());
        // The relay pings too (issue 14): a frozen worker is noticed.
        let relay_pings = p
            .relay_sent
            .iter()
            .filter(|m| matches!(m, Message::Ping(_)))
            .count();
        assert_eq!(relay_pings, 5);
        assert!(!p.relay.is_closed());
    }

    #[test]
    fn a_missing_pong_closes_the_connection_after_20_s() {
        let mut p = Pair::default_pair();
        p.auto_pong = false;
        p.advance(Duration::from_secs(20));
        p.progress();
        assert_eq!(pings(&p), 1);
        p.advance(Duration::from_secs(19));
        p.progress();
        assert!(!p.worker.is_closed());
        p.advance(Duration::from_secs(1));
        p.progress();
        assert!(p.worker.is_closed());
        let Some(Message::Close(Some(c))) = p.worker_sent.last() else {
            panic!("no close")
        };
        assert_eq!(c.code.0, 1011);
    }

    #[test]
    fn a_long_upload_in_flight_does_not_delay_a_ping() {
        let mut p = Pair::default_pair();
        p.auto_read_worker = false; // the app is slow: the worker's socket stays paused
        let k = p.relay.open_stream(post("/upload", None)).unwrap();
        // Fill every queue with body.
        for _ in 0..100 {
            let _ = p.relay.send_body(k, pattern(1 << 20)).unwrap();
            p.step();
        }
        let (wk, _) = p.worker_requests()[0].clone();
        assert!(!p.worker.wants_read(), "upload is backed up");
        // The worker's response is also in flight, large, to make the ping's path busy.
        p.worker.respond(wk, ok_head()).unwrap();
        let _ = p.worker.send_body(wk, pattern(2 << 20)).unwrap();
        p.advance(Duration::from_secs(20));
        // The very next message the worker emits is the ping, ahead of queued body chunks.
        let next = p.worker.poll_transmit();
        assert!(matches!(next, Some(Message::Ping(_))), "{next:?}");
    }
}

mod keepalive_backpressure {
    use super::*;
    use std::time::Duration;
    use worker_relay::frame::Message;

    /// Issue 14, item 5: a slow app body reader pauses the worker's reading,
    /// as the spec says, and both keepalives survive it: the worker's pong
    /// waits unread behind body chunks (its own backpressure), and the
    /// relay's pings wait behind the body it sends, which the worker keeps
    /// taking (slowly): that progress is life.
    #[test]
    fn pings_go_on_while_reading_is_paused_and_the_connection_survives() {
        let mut p = Pair::default_pair();
        p.auto_read_worker = false; // a slow app: the worker stops reading
        let k = p.relay.open_stream(post("/upload", None)).unwrap();
        for _ in 0..100 {
            let _ = p.relay.send_body(k, pattern(1 << 20)).unwrap();
            p.step();
        }
        assert!(!p.worker.wants_read());
        let (wk, _) = p.worker_requests()[0].clone();
        // A minute of a slow app: one chunk read every 5 s.
        for _ in 0..12 {
            assert!(matches!(p.worker.read_body(wk), BodyRead::Data(_)));
            p.advance(Duration::from_secs(5));
            p.progress();
        }
        assert!(!p.worker.is_closed(), "closed by its own backpressure");
        assert!(
            !p.relay.is_closed(),
            "the relay took a slow reader for dead"
        );
        assert!(p.worker_sent.iter().any(|m| matches!(m, Message::Ping(_))));
        assert!(p.relay_sent.iter().any(|m| matches!(m, Message::Ping(_))));
        // The app reads again: the pong is read and the connection lives on.
        for _ in 0..10_000 {
            let (_, last) = worker_read_all(&mut p.worker, wk);
            if last != BodyRead::Pending || !p.step() {
                break;
            }
        }
        p.advance(Duration::from_secs(15));
        p.progress();
        assert!(!p.worker.is_closed());
        // And a peer that really stops answering still gets the connection closed.
        p.auto_pong = false;
        p.relay.abort(k);
        p.progress();
        for _ in 0..8 {
            p.advance(Duration::from_secs(10));
            p.progress();
        }
        assert!(p.worker.is_closed());
    }

    /// An app that reads nothing at all is indistinguishable from a frozen
    /// worker: the relay, whose body waits for a socket that takes nothing,
    /// gives up 20 s after the last message the worker took (Strata's worker
    /// would give up too: its WebSocket library stops reading, pongs included).
    #[test]
    fn a_worker_that_takes_nothing_at_all_is_dropped_by_the_relay() {
        let mut p = Pair::default_pair();
        p.auto_read_worker = false;
        let k = p.relay.open_stream(post("/upload", None)).unwrap();
        for _ in 0..100 {
            let _ = p.relay.send_body(k, pattern(1 << 20)).unwrap();
            p.step();
        }
        assert!(!p.worker.wants_read());
        for s in 1..=6 {
            p.advance(Duration::from_secs(10));
            p.progress();
            assert_eq!(p.relay.is_closed(), s >= 4, "after {} s", s * 10);
        }
        assert_eq!(
            p.relay.close_cause(),
            Some(&worker_relay::proto::CloseCause::KeepaliveTimeout)
        );
        assert!(!p.worker.is_closed(), "the worker's own keepalive forgives");
    }
}
