//! A slow or stalled caller costs only its own stream (issue 14), in the
//! relay machine with virtual time: overflow (spill and refill, in order),
//! the stall deadline, the read-pause bound, budgets, and the keepalive that
//! tells a slow peer from a frozen one.
mod common;

use bytes::Bytes;
use common::*;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};
use worker_relay::frame::{decode, encode_chunk, ControlFrame, Decoded, Message, StreamId};
use worker_relay::proto::{
    BodyRead, CloseCause, OverflowConfig, RelayConfig, RelayConnection, RelayEnd, RelayEvent,
    StreamKey,
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A relay with a clock, a simple overflow store, and the worker's side
/// played by hand.
struct Relay {
    r: RelayConnection,
    now: Instant,
    store: HashMap<StreamKey, VecDeque<u8>>,
    events: Vec<RelayEvent>,
    sent: Vec<Decoded>,
}

impl Relay {
    fn new(config: RelayConfig) -> Relay {
        let now = Instant::now();
        let mut r = RelayConnection::new(config);
        r.handle_timeout(now);
        Relay {
            r,
            now,
            store: HashMap::new(),
            events: Vec::new(),
            sent: Vec::new(),
        }
    }

    fn with_overflow(memory_per_stream: usize, max_per_stream: u64, max_total: u64) -> Relay {
        let mut ov = OverflowConfig::default();
        ov.memory_per_stream = memory_per_stream;
        ov.max_per_stream = max_per_stream;
        ov.max_total = max_total;
        Relay::with(ov)
    }

    /// An overflow of `memory_per_stream` in memory that waits up to
    /// `spill_after` for a caller to catch up before it spills.
    fn with_wait(memory_per_stream: usize, spill_after: Duration) -> Relay {
        let mut ov = OverflowConfig::default();
        ov.memory_per_stream = memory_per_stream;
        ov.spill_after = spill_after;
        Relay::with(ov)
    }

    fn with(ov: OverflowConfig) -> Relay {
        Relay::new(
            RelayConfig::builder()
                .overflow(Some(ov))
                .keepalive(None)
                .build()
                .unwrap(),
        )
    }

    /// Opens a GET, answered 200 by the worker: returns (key, wire id).
    fn open(&mut self) -> (StreamKey, StreamId) {
        let k = self.r.open_stream(get("/bytes")).unwrap();
        self.r.finish(k).unwrap();
        let wid = self.r.stream_id(k).unwrap();
        self.feed(
            ControlFrame::Response {
                id: wid,
                head: ok_head(),
            }
            .to_message(),
        );
        (k, wid)
    }

    fn feed(&mut self, m: Message) {
        self.r.handle_message(m, self.now).unwrap();
        self.pump();
    }

    fn chunk(&mut self, wid: StreamId, data: &[u8]) {
        self.feed(Message::Binary(encode_chunk(wid, data)));
    }

    fn end(&mut self, wid: StreamId) {
        self.feed(ControlFrame::End { id: wid }.to_message());
    }

    /// The application's loop: spills to the store, refills from it,
    /// transmits, collects events.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some((k, d)) = self.r.poll_spill() {
                self.store.entry(k).or_default().extend(d.iter());
                moved = true;
            }
            while let Some(m) = self.r.poll_transmit() {
                if let Some(Ok(d)) = decode(&m) {
                    self.sent.push(d);
                }
                moved = true;
            }
            while let Some(e) = self.r.poll_event() {
                if let RelayEvent::Refill { key, max } = e {
                    let q = self.store.entry(key).or_default();
                    let n = q.len().min(max);
                    let data: Vec<u8> = q.drain(..n).collect();
                    self.r.refill(key, Bytes::from(data)).unwrap();
                }
                self.events.push(e);
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.r.handle_timeout(self.now);
        self.pump();
    }

    /// Reads everything readable now.
    fn read(&mut self, k: StreamKey) -> (Vec<u8>, BodyRead) {
        let mut out = Vec::new();
        loop {
            let r = self.r.read_body(k);
            self.pump();
            match r {
                BodyRead::Data(d) => out.extend_from_slice(&d),
                other => return (out, other),
            }
        }
    }

    fn ended(&self, k: StreamKey) -> Option<RelayEnd> {
        self.events.iter().find_map(|e| match e {
            RelayEvent::Ended { key, reason, .. } if *key == k => Some(*reason),
            _ => None,
        })
    }

    fn aborted(&self, wid: StreamId) -> bool {
        self.sent
            .contains(&Decoded::Control(ControlFrame::Abort { id: wid }))
    }
}

#[test]
fn a_slow_stream_spills_and_gets_everything_back_in_order() {
    let mut t = Relay::with_overflow(1000, 1 << 30, 1 << 30);
    let (k, wid) = t.open();
    let body = pattern(20_000);
    for piece in body.chunks(700) {
        t.chunk(wid, piece);
        assert!(t.r.wants_read(), "reading never pauses for one slow stream");
    }
    t.end(wid);
    assert_eq!(
        t.r.stats().body_buffered_in,
        700,
        "one chunk in memory, the rest spilled"
    );
    assert_eq!(t.r.spilled(k), 20_000 - 700);
    assert_eq!(t.r.stats().overflow_bytes, 20_000 - 700);
    // The caller reads at last: the store refills in order.
    let (got, last) = t.read(k);
    assert_eq!(last, BodyRead::End);
    assert!(got == body[..], "order or bytes differ");
    assert_eq!(t.r.stats().overflow_bytes, 0);
    assert!(t.store.values().all(VecDeque::is_empty));
    assert_eq!(t.r.open_streams(), 0);
}

#[test]
fn small_chunks_spill_before_they_pause_the_connection() {
    // A paced worker's 2 KiB chunks reach `max_unread_chunks` (16) long
    // before `memory_per_stream`: the relay spills rather than pause
    // reading for everyone (the chunk that would have spilled was never
    // read, until the read-pause bound gave the stream up).
    let mut t = Relay::with_overflow(1 << 20, 1 << 30, 1 << 30);
    let (k, wid) = t.open();
    let body = pattern(200 * 2048);
    for piece in body.chunks(2048) {
        t.chunk(wid, piece);
        assert!(t.r.wants_read(), "reading paused with an overflow at hand");
    }
    t.end(wid);
    assert!(t.r.stats().body_buffered_in < 16 * 2048);
    assert_eq!(
        t.r.spilled(k) + t.r.stats().body_buffered_in,
        body.len() as u64
    );
    let (got, last) = t.read(k);
    assert_eq!(last, BodyRead::End);
    assert!(got == body[..], "order or bytes differ");
}

const WAIT: Duration = Duration::from_millis(5);

#[test]
fn a_caller_that_catches_up_within_spill_after_is_not_sent_through_the_overflow() {
    let mut t = Relay::with_wait(1000, WAIT);
    let (k, wid) = t.open();
    let body = pattern(20_000);
    let mut got = Vec::new();
    for piece in body.chunks(700) {
        t.chunk(wid, piece);
        if !t.r.wants_read() {
            // Past its memory with an empty overflow: the chunk in hand is
            // held (one chunk over the bound), reading pauses, and the
            // wait has a deadline.
            assert_eq!(t.r.spilled(k), 0);
            assert!(t.r.stats().body_buffered_in <= 1000 + 700);
            assert_eq!(t.r.poll_timeout(), Some(t.now + WAIT));
            // A data message now is handed back, as for any pause.
            let m = Message::Binary(encode_chunk(wid, b"early"));
            assert!(t.r.handle_message(m, t.now).is_err());
            t.advance(WAIT / 2);
            assert!(!t.r.wants_read(), "still within the wait");
            // The caller catches up: reading resumes at once.
            got.extend(t.read(k).0);
            assert!(t.r.wants_read());
        }
    }
    t.end(wid);
    let (rest, last) = t.read(k);
    got.extend(rest);
    assert_eq!(last, BodyRead::End);
    assert!(got == body[..], "order or bytes differ");
    assert_eq!(t.r.stats().overflow_bytes, 0);
    assert!(t.store.is_empty(), "nothing went to the overflow");
}

#[test]
fn a_caller_that_does_not_catch_up_spills_after_the_wait_until_its_overflow_is_empty() {
    let mut t = Relay::with_wait(1000, WAIT);
    let (k, wid) = t.open();
    let (other, wother) = t.open();
    let body = pattern(20_000);
    let mut pieces = body.chunks(700);
    t.chunk(wid, pieces.next().unwrap());
    t.chunk(wid, pieces.next().unwrap());
    assert!(!t.r.wants_read());
    t.advance(WAIT - Duration::from_micros(1));
    assert!(!t.r.wants_read());
    t.advance(Duration::from_micros(1));
    assert!(t.r.wants_read(), "the wait is over, in vain");
    // Every further chunk spills at once; reading never pauses again for
    // this stream, and the other stream's data passes.
    for piece in pieces {
        t.chunk(wid, piece);
        assert!(t.r.wants_read());
    }
    t.chunk(wother, b"ok");
    t.end(wother);
    assert_eq!(t.read(other), (b"ok".to_vec(), BodyRead::End));
    assert_eq!(t.r.spilled(k), 20_000 - 1400);
    // The caller reads it all, in order; then, with its overflow empty, the
    // stream waits again before it would spill.
    let (got, last) = t.read(k);
    assert_eq!(last, BodyRead::Pending);
    assert!(got == body[..], "order or bytes differ");
    assert_eq!(t.r.stats().overflow_bytes, 0);
    t.chunk(wid, &pattern(700));
    t.chunk(wid, &pattern(700));
    assert!(!t.r.wants_read(), "waits again once caught up");
    assert_eq!(t.r.spilled(k), 0);
}

#[test]
fn a_wait_ends_when_its_stream_goes() {
    let mut t = Relay::with_wait(1000, WAIT);
    let (k, wid) = t.open();
    t.chunk(wid, &pattern(700));
    t.chunk(wid, &pattern(700));
    assert!(!t.r.wants_read());
    t.r.abort(k);
    t.pump();
    assert!(t.r.wants_read(), "the caller went: reading resumes");
    assert!(t.aborted(wid));
}

/// A caller that reads a little during each wait does not hold reading
/// paused wait after wait: a wait ends early only once the caller has read
/// all its stream holds.
#[test]
fn a_caller_that_reads_a_little_during_each_wait_still_spills() {
    let mut t = Relay::with_wait(1000, WAIT);
    let (k, wid) = t.open();
    t.chunk(wid, &pattern(700));
    t.chunk(wid, &pattern(700));
    assert!(!t.r.wants_read());
    match t.r.read_body(k) {
        BodyRead::Data(d) => assert_eq!(d.len(), 700),
        other => panic!("{other:?}"),
    }
    t.pump();
    assert!(!t.r.wants_read(), "700 bytes still held: still waiting");
    t.advance(WAIT);
    assert!(t.r.wants_read());
    t.chunk(wid, &pattern(700));
    t.chunk(wid, &pattern(700));
    assert!(t.r.wants_read(), "spills without waiting");
    assert_eq!(t.r.spilled(k), 1400);
}

#[test]
fn spill_after_must_be_shorter_than_the_read_pause_bound() {
    let mut ov = OverflowConfig::default();
    ov.spill_after = Duration::from_secs(10);
    let err = RelayConfig::builder()
        .overflow(Some(ov))
        .read_pause_timeout(Duration::from_secs(10))
        .build()
        .unwrap_err();
    assert_eq!(err.field, "overflow.spill_after");
    ov.spill_after = Duration::from_millis(1);
    assert!(RelayConfig::builder().overflow(Some(ov)).build().is_ok());
}

#[test]
fn a_stalled_stream_does_not_hold_up_another() {
    let mut t = Relay::with_overflow(1000, 1 << 30, 1 << 30);
    let (slow, wslow) = t.open();
    let (fast, wfast) = t.open();
    for i in 0..200 {
        t.chunk(wslow, &pattern(4096));
        if i % 50 == 0 {
            t.chunk(wfast, b"ok");
        }
    }
    t.end(wfast);
    assert!(t.r.wants_read());
    assert_eq!(t.read(fast), (b"okokokok".to_vec(), BodyRead::End));
    assert!(t.r.spilled(slow) > 700_000);
    assert_eq!(t.read(slow).0.len(), 200 * 4096);
}

#[test]
fn outgrowing_the_overflow_gives_up_that_stream_alone() {
    let mut t = Relay::with_overflow(1000, 10_000, 1 << 30);
    let (k, wid) = t.open();
    let (other, wother) = t.open();
    for _ in 0..20 {
        t.chunk(wid, &pattern(1000));
    }
    assert_eq!(t.ended(k), Some(RelayEnd::OverflowExceeded));
    assert!(t.aborted(wid));
    assert_eq!(
        t.read(k).1,
        BodyRead::Gone,
        "nothing is delivered after giving up"
    );
    assert_eq!(t.r.stats().overflow_bytes, 0, "its overflow is released");
    // The connection-wide budget counts all streams.
    t.chunk(wother, b"fine");
    t.end(wother);
    assert_eq!(t.read(other), (b"fine".to_vec(), BodyRead::End));
    let mut t = Relay::with_overflow(100, 1 << 30, 5_000);
    let (a, wa) = t.open();
    let (b, wb) = t.open();
    for _ in 0..3 {
        t.chunk(wa, &pattern(1000));
        t.chunk(wb, &pattern(1000));
    }
    // 4 × 1000 spilled (each stream keeps its first chunk in memory); the
    // next chunk crosses the 5,000-byte total.
    t.chunk(wa, &pattern(1000));
    t.chunk(wb, &pattern(1000));
    assert_eq!(t.ended(a), None);
    assert_eq!(t.ended(b), Some(RelayEnd::OverflowExceeded));
}

#[test]
fn a_caller_that_reads_nothing_for_the_stall_deadline_is_given_up() {
    let mut t = Relay::with_overflow(1000, 1 << 30, 1 << 30);
    let (k, wid) = t.open();
    let (reader, wreader) = t.open();
    t.chunk(wid, &pattern(5000));
    // The other caller reads every 30 s; the first never reads.
    for _ in 0..2 {
        t.chunk(wreader, b"x");
        t.advance(secs(30));
        t.read(reader);
    }
    assert_eq!(
        t.ended(k),
        Some(RelayEnd::CallerStalled),
        "60 s without a read"
    );
    assert!(t.aborted(wid));
    assert_eq!(
        t.ended(reader),
        None,
        "a caller that reads keeps its stream"
    );
    assert_eq!(t.read(k).1, BodyRead::Gone);
    assert_eq!(t.r.stats().overflow_bytes, 0);
    assert_eq!(t.r.stats().body_buffered_in, 0);
}

#[test]
fn a_slow_reader_is_never_stalled() {
    let mut t = Relay::with_overflow(1000, 1 << 30, 1 << 30);
    let (k, wid) = t.open();
    for _ in 0..100 {
        t.chunk(wid, &pattern(1000));
    }
    t.end(wid);
    // One read every 59 s for 100 pieces: over an hour and a half, never 60 s idle.
    let mut got = 0;
    for _ in 0..200 {
        match t.r.read_body(k) {
            BodyRead::Data(d) => got += d.len(),
            BodyRead::End => break,
            other => panic!("{other:?} after {got}"),
        }
        t.pump();
        t.advance(secs(59));
    }
    assert_eq!(got, 100_000);
    assert_eq!(t.ended(k), Some(RelayEnd::Completed));
}

#[test]
fn data_of_a_completed_response_left_unread_is_dropped_at_the_deadline() {
    let mut t = Relay::with_overflow(1000, 1 << 30, 1 << 30);
    let (k, wid) = t.open();
    t.chunk(wid, &pattern(3000));
    t.end(wid);
    assert_eq!(t.ended(k), Some(RelayEnd::Completed));
    t.advance(secs(61));
    assert!(
        !t.aborted(wid),
        "the worker's stream is over: nothing to abort"
    );
    assert_eq!(t.read(k), (vec![], BodyRead::Gone));
    assert_eq!(t.r.open_streams(), 0);
    assert_eq!(t.r.stats().overflow_bytes, 0);
}

#[test]
fn without_overflow_a_pause_never_outlasts_its_bound() {
    let mut t = Relay::new(RelayConfig::builder().keepalive(None).build().unwrap());
    let (k, wid) = t.open();
    let (other, wother) = t.open();
    for _ in 0..16 {
        t.chunk(wid, b"x");
    }
    assert!(!t.r.wants_read(), "16 unread chunks pause reading");
    t.advance(secs(9));
    assert!(!t.r.wants_read());
    assert_eq!(t.ended(k), None);
    t.advance(secs(1));
    assert_eq!(t.ended(k), Some(RelayEnd::CallerStalled));
    assert!(t.aborted(wid));
    assert!(t.r.wants_read(), "reading resumes for the others");
    t.chunk(wother, b"on");
    t.end(wother);
    assert_eq!(t.read(other), (b"on".to_vec(), BodyRead::End));
    // A caller that reads resets the pause.
    let (k2, w2) = t.open();
    for round in 0..5 {
        for _ in 0..16 {
            t.chunk(w2, b"y");
        }
        t.advance(secs(8));
        assert!(t.read(k2).0.len() == 16, "round {round}");
    }
    assert_eq!(t.ended(k2), None);
}

#[test]
fn an_orphan_waits_for_the_workers_end_no_longer_than_the_deadline() {
    let mut t = Relay::new(RelayConfig::builder().keepalive(None).build().unwrap());
    let k = t.r.open_stream(get("/x")).unwrap();
    t.r.finish(k).unwrap();
    let wid = t.r.stream_id(k).unwrap();
    let head = worker_relay::frame::ResponseHead::new(
        200,
        worker_relay::frame::Headers::try_from_pairs([("content-length", "2")]).unwrap(),
    )
    .unwrap();
    t.feed(ControlFrame::Response { id: wid, head }.to_message());
    t.chunk(wid, b"ok");
    assert_eq!(t.read(k).0, b"ok");
    t.r.abort(k);
    t.pump();
    assert!(!t.aborted(wid), "complete: no abort");
    assert_eq!(t.r.open_streams(), 1, "waiting for the worker's end");
    t.advance(secs(61));
    assert!(t.aborted(wid), "a worker that never ends is aborted");
    assert_eq!(t.r.open_streams(), 0);
}

#[test]
fn a_lost_connection_drops_what_is_in_the_overflow() {
    let mut t = Relay::with_overflow(100, 1 << 30, 1 << 30);
    let (k, wid) = t.open();
    for _ in 0..10 {
        t.chunk(wid, &pattern(100));
    }
    t.r.handle_lost();
    t.pump();
    // The overflow cannot come back once the driver stops: the reader must
    // not wait for it.
    assert_eq!(t.read(k), (vec![], BodyRead::Gone));
    assert_eq!(t.r.stats().overflow_bytes, 0);
}

#[test]
fn a_frozen_worker_fails_every_caller_within_40_s() {
    let mut t = Relay::new(RelayConfig::default());
    let (k, _) = t.open();
    let k2 = t.r.open_stream(get("/later")).unwrap();
    t.pump();
    // The worker answers nothing, pongs included.
    for _ in 0..39 {
        t.advance(secs(1));
    }
    assert!(!t.r.is_closed());
    t.advance(secs(1));
    assert!(t.r.is_closed(), "no pong 20 s after the 20 s ping");
    assert_eq!(t.r.close_cause(), Some(&CloseCause::KeepaliveTimeout));
    assert_eq!(t.ended(k), Some(RelayEnd::ConnectionLost));
    assert_eq!(t.ended(k2), Some(RelayEnd::ConnectionLost));
}

#[test]
fn reading_paused_for_a_slow_caller_never_takes_the_worker_for_dead() {
    let mut t = Relay::new(RelayConfig::default());
    let (k, wid) = t.open();
    // Our own pause (a slow caller) keeps the worker's pong unread.
    for _ in 0..16 {
        t.chunk(wid, b"z");
    }
    assert!(!t.r.wants_read());
    for _ in 0..5 {
        t.advance(secs(9));
        t.read(k);
        for _ in 0..16 {
            t.chunk(wid, b"z");
        }
    }
    assert!(!t.r.is_closed(), "45 s paused by our own backpressure");
}

mod overflow_props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// The worker sends `len` bytes on stream `s`.
        Chunk(usize, usize),
        /// The caller of stream `s` reads up to `n` pieces.
        Read(usize, usize),
        /// The application moves up to `n` spilled chunks to its store.
        Spill(usize),
        /// The application answers its oldest pending refill with up to `n` bytes.
        Refill(usize),
        /// The worker ends stream `s`.
        End(usize),
        /// Time passes, in milliseconds.
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..3usize, 0..3000usize).prop_map(|(s, n)| Op::Chunk(s, n)),
            3 => (0..3usize, 1..5usize).prop_map(|(s, n)| Op::Read(s, n)),
            2 => (0..6usize).prop_map(Op::Spill),
            2 => (1..4000usize).prop_map(Op::Refill),
            1 => (0..3usize).prop_map(Op::End),
            1 => (0..3u64).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Whatever the order of arrivals, reads, spill draining and
        /// partial refills: each caller gets exactly its stream's bytes in
        /// order, memory stays bounded, nothing is lost or left over.
        #[test]
        fn spill_and_refill_keep_every_stream_whole(ops in proptest::collection::vec(op(), 1..200)) {
            check(ops, Duration::ZERO)?;
        }

        /// The same with a wait before each spill
        /// (`OverflowConfig::spill_after`).
        #[test]
        fn spill_after_a_wait_keeps_every_stream_whole(ops in proptest::collection::vec(op(), 1..200)) {
            check(ops, Duration::from_millis(2))?;
        }
    }

    fn check(ops: Vec<Op>, spill_after: Duration) -> Result<(), TestCaseError> {
        {
            let mut ov = OverflowConfig::default();
            ov.memory_per_stream = 2000;
            ov.spill_after = spill_after;
            let mut r = RelayConnection::new(
                RelayConfig::builder()
                    .overflow(Some(ov))
                    .keepalive(None)
                    .max_unread_bytes(1 << 20)
                    .build()
                    .unwrap(),
            );
            let mut now = Instant::now();
            r.handle_timeout(now);
            let mut keys = Vec::new();
            let mut wids = Vec::new();
            for _ in 0..3 {
                let k = r.open_stream(get("/x")).unwrap();
                r.finish(k).unwrap();
                let w = r.stream_id(k).unwrap();
                r.handle_message(
                    ControlFrame::Response {
                        id: w,
                        head: ok_head(),
                    }
                    .to_message(),
                    now,
                )
                .unwrap();
                keys.push(k);
                wids.push(w);
            }
            while r.poll_transmit().is_some() {}
            let mut sent = vec![Vec::<u8>::new(); 3];
            let mut got = vec![Vec::<u8>::new(); 3];
            let mut ended = [false; 3];
            let mut done = [false; 3];
            let mut store: HashMap<StreamKey, VecDeque<u8>> = HashMap::new();
            let mut refills: VecDeque<(StreamKey, usize)> = VecDeque::new();
            let mut seq = 0u8;
            let events = |r: &mut RelayConnection, refills: &mut VecDeque<(StreamKey, usize)>| {
                while let Some(e) = r.poll_event() {
                    if let RelayEvent::Refill { key, max } = e {
                        refills.push_back((key, max));
                    }
                }
            };
            for op in ops {
                match op {
                    Op::Chunk(s, n) if !ended[s] => {
                        if !r.wants_read() {
                            continue;
                        }
                        let data: Vec<u8> = (0..n)
                            .map(|_| {
                                seq = seq.wrapping_add(1);
                                seq
                            })
                            .collect();
                        sent[s].extend_from_slice(&data);
                        r.handle_message(Message::Binary(encode_chunk(wids[s], &data)), now)
                            .unwrap();
                    }
                    Op::End(s) if !ended[s] => {
                        if !r.wants_read() {
                            continue;
                        }
                        ended[s] = true;
                        r.handle_message(ControlFrame::End { id: wids[s] }.to_message(), now)
                            .unwrap();
                    }
                    Op::Read(s, n) if !done[s] => {
                        for _ in 0..n {
                            match r.read_body(keys[s]) {
                                BodyRead::Data(d) => got[s].extend_from_slice(&d),
                                BodyRead::End => {
                                    done[s] = true;
                                    break;
                                }
                                BodyRead::Pending => break,
                                BodyRead::Gone => prop_assert!(false, "stream {s} gone"),
                                _ => unreachable!("a variant this test does not know"),
                            }
                        }
                    }
                    Op::Advance(ms) => {
                        now += Duration::from_millis(ms);
                        r.handle_timeout(now);
                    }
                    Op::Spill(n) => {
                        for _ in 0..n {
                            let Some((k, d)) = r.poll_spill() else { break };
                            store.entry(k).or_default().extend(d.iter());
                        }
                    }
                    Op::Refill(n) => {
                        if let Some((k, max)) = refills.pop_front() {
                            let q = store.entry(k).or_default();
                            let take = q.len().min(max).min(n);
                            if take == 0 {
                                // Nothing stored yet: ask again later.
                                refills.push_back((k, max));
                            } else {
                                let data: Vec<u8> = q.drain(..take).collect();
                                r.refill(k, Bytes::from(data)).unwrap();
                                // A partial refill leaves the rest for the next ask.
                            }
                        }
                    }
                    _ => {}
                }
                events(&mut r, &mut refills);
                let st = r.stats();
                prop_assert!(st.body_buffered_in <= 3 * (2000 + 3000) as u64, "{st:?}");
            }
            // Drain everything: each stream ends, whole and in order. A
            // wait before a spill ends at its deadline.
            if !r.wants_read() {
                now += spill_after;
                r.handle_timeout(now);
            }
            prop_assert!(r.wants_read());
            for s in 0..3 {
                if !ended[s] {
                    ended[s] = true;
                    r.handle_message(ControlFrame::End { id: wids[s] }.to_message(), now)
                        .unwrap();
                }
            }
            for _ in 0..100_000 {
                events(&mut r, &mut refills);
                while let Some((k, d)) = r.poll_spill() {
                    store.entry(k).or_default().extend(d.iter());
                }
                if let Some((k, max)) = refills.pop_front() {
                    let q = store.entry(k).or_default();
                    let take = q.len().min(max);
                    let data: Vec<u8> = q.drain(..take).collect();
                    r.refill(k, Bytes::from(data)).unwrap();
                }
                let mut progressed = false;
                for s in 0..3 {
                    while !done[s] {
                        match r.read_body(keys[s]) {
                            BodyRead::Data(d) => {
                                got[s].extend_from_slice(&d);
                                progressed = true;
                            }
                            BodyRead::End => {
                                done[s] = true;
                                progressed = true;
                            }
                            BodyRead::Pending => break,
                            BodyRead::Gone => prop_assert!(false, "stream {s} gone"),
                            _ => unreachable!("a variant this test does not know"),
                        }
                    }
                }
                if done.iter().all(|d| *d) {
                    break;
                }
                events(&mut r, &mut refills);
                if !progressed && refills.is_empty() {
                    prop_assert!(false, "stuck: {:?}", r.stats());
                }
            }
            for s in 0..3 {
                prop_assert!(done[s]);
                prop_assert_eq!(&got[s], &sent[s], "stream {}", s);
            }
            prop_assert_eq!(r.stats().overflow_bytes, 0);
            prop_assert_eq!(r.stats().body_buffered_in, 0);
            prop_assert!(store.values().all(VecDeque::is_empty));
            prop_assert!(r.wants_read());
        }
        Ok(())
    }
}

const ALONE: Duration = Duration::from_millis(50);

/// An overflow that waits `WAIT`, and `ALONE` for a stream alone on its
/// connection (issue 42: a tunnel's 256 MiB went through the overflow
/// store while its caller read as fast as it could).
fn with_alone_wait() -> Relay {
    let mut ov = OverflowConfig::default();
    ov.memory_per_stream = 1000;
    ov.spill_after = WAIT;
    ov.spill_after_alone = ALONE;
    Relay::with(ov)
}

#[test]
fn a_stream_alone_on_its_connection_waits_spill_after_alone() {
    let mut t = with_alone_wait();
    let (k, wid) = t.open();
    t.chunk(wid, &pattern(700));
    t.chunk(wid, &pattern(700));
    assert!(!t.r.wants_read());
    assert_eq!(t.r.poll_timeout(), Some(t.now + ALONE));
    t.advance(WAIT * 2);
    assert!(!t.r.wants_read(), "alone: still waiting past spill_after");
    // Its caller catches up: nothing went to the overflow.
    assert_eq!(t.read(k).0.len(), 1400);
    assert!(t.r.wants_read());
    // A caller that does not catch up spills at the longer deadline.
    t.chunk(wid, &pattern(700));
    t.chunk(wid, &pattern(700));
    assert!(!t.r.wants_read());
    t.advance(ALONE - Duration::from_micros(1));
    assert!(!t.r.wants_read());
    t.advance(Duration::from_micros(1));
    assert!(t.r.wants_read(), "the wait is over, in vain");
    t.chunk(wid, &pattern(700));
    assert_eq!(t.r.spilled(k), 700);
}

#[test]
fn a_stream_opened_during_a_lone_wait_ends_it_once_spill_after_has_passed() {
    let mut t = with_alone_wait();
    let (k, wid) = t.open();
    t.chunk(wid, &pattern(700));
    t.chunk(wid, &pattern(700));
    assert!(!t.r.wants_read());
    t.advance(WAIT * 2);
    assert!(!t.r.wants_read());
    // Another request goes out: its answer may wait behind this body, so
    // the wait is held to spill_after, which has passed.
    let other = t.r.open_stream(get("/health")).unwrap();
    t.r.finish(other).unwrap();
    assert!(t.r.poll_timeout().is_some_and(|d| d <= t.now));
    t.advance(Duration::ZERO);
    assert!(
        t.r.wants_read(),
        "reading resumes for the new stream's answer"
    );
    t.chunk(wid, &pattern(700));
    assert_eq!(t.r.spilled(k), 700);
}

#[test]
fn with_two_streams_in_flight_the_wait_is_spill_after() {
    let mut t = with_alone_wait();
    let (k, wid) = t.open();
    let _other = t.open();
    t.chunk(wid, &pattern(700));
    t.chunk(wid, &pattern(700));
    assert!(!t.r.wants_read());
    assert_eq!(t.r.poll_timeout(), Some(t.now + WAIT));
    t.advance(WAIT);
    assert!(t.r.wants_read());
    t.chunk(wid, &pattern(700));
    assert_eq!(t.r.spilled(k), 700);
}

#[test]
fn spill_after_alone_must_be_shorter_than_the_read_pause_bound() {
    let mut ov = OverflowConfig::default();
    ov.spill_after_alone = Duration::from_secs(10);
    let err = RelayConfig::builder()
        .overflow(Some(ov))
        .read_pause_timeout(Duration::from_secs(10))
        .build()
        .unwrap_err();
    assert_eq!(err.field, "overflow.spill_after_alone");
}
