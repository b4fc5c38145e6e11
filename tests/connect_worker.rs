//! The worker's side of the connection lifecycle, end to end in virtual time:
//! handshake verdicts drive the backoff, the keepalive decides when a
//! connection is dead, and a final refusal ends the loop.

use std::time::{Duration, Instant};
use worker_relay::connect::{Backoff, RetryReason, Token, Verdict, WorkerHandshake};
use worker_relay::frame::{Message, SUBPROTOCOL};
use worker_relay::proto::{Keepalive, KeepaliveConfig};

/// What the fake relay does with one connection attempt.
#[derive(Debug, Clone, Copy)]
enum Attempt {
    /// The dial fails.
    NetworkError,
    /// The relay answers with this status instead of 101.
    Status(u16),
    /// 101 with this subprotocol (or none).
    Upgrade(Option<&'static str>),
    /// 101 with the subprotocol; the relay answers pings for this long, then
    /// stops answering (a dead NAT mapping).
    Serve(Duration),
}

#[derive(Debug, PartialEq)]
enum Event {
    Dial,
    Wait { delay: u64 },
    Connected,
    Dead { after: Duration },
    Exit(i32, String),
}

/// Runs the worker loop against a script, in virtual time. Returns the events
/// and the waits.
fn run(script: &[Attempt], randomness: &mut impl FnMut() -> f64) -> (Vec<Event>, Vec<Duration>) {
    let handshake = WorkerHandshake::new(Some(Token::new("s3cret").unwrap()));
    let mut backoff = Backoff::default();
    let mut now = Instant::now();
    let mut events = Vec::new();
    let mut waits = Vec::new();
    for attempt in script.iter().copied() {
        events.push(Event::Dial);
        let headers: Vec<(&str, String)> = handshake
            .request_headers()
            .iter()
            .map(|(n, v)| (n, v.to_string()))
            .collect();
        assert_eq!(headers[0], ("Authorization", "Bearer s3cret".to_string()));
        assert_eq!(
            headers[1],
            ("Sec-WebSocket-Protocol", SUBPROTOCOL.to_string())
        );
        let verdict = match attempt {
            Attempt::NetworkError => Verdict::network_error(),
            Attempt::Status(s) => Verdict::from_response(s, [("Content-Type", "text/plain")]),
            Attempt::Upgrade(p) => {
                Verdict::from_response(101, p.map(|p| ("Sec-WebSocket-Protocol", p)))
            }
            Attempt::Serve(_) => {
                Verdict::from_response(101, [("sec-websocket-protocol", SUBPROTOCOL)])
            }
        };
        match verdict {
            Verdict::Connected => {
                backoff.reset();
                events.push(Event::Connected);
                let Attempt::Serve(answering) = attempt else {
                    unreachable!()
                };
                // Serve: drive the keepalive timer by timer until it is dead.
                let start = now;
                let mut ka = Keepalive::new(KeepaliveConfig::default(), now);
                while let Some(t) = ka.poll_timeout() {
                    now = t;
                    ka.handle_timeout(now);
                    if let Some(Message::Ping(payload)) = ka.poll_ping() {
                        if now - start <= answering {
                            ka.handle_pong(now + Duration::from_millis(40), &payload);
                        }
                    }
                }
                assert!(ka.is_dead());
                events.push(Event::Dead { after: now - start });
                assert_eq!(Verdict::closed(), Verdict::Retry(RetryReason::Closed));
            }
            Verdict::Retry(_) => {}
            Verdict::Refused(why) => {
                events.push(Event::Exit(1, why.to_string()));
                break;
            }
            _ => unreachable!("a variant this test does not know"),
        }
        let delay = backoff.current_delay();
        let wait = backoff.next_wait(randomness());
        assert!(wait >= delay / 2 && wait <= delay);
        events.push(Event::Wait {
            delay: delay.as_secs(),
        });
        waits.push(wait);
        now += wait;
    }
    (events, waits)
}

#[test]
fn failures_back_off_and_a_successful_handshake_resets() {
    use Attempt::*;
    let script = [
        NetworkError,
        Status(503),
        Status(429),
        Status(408),
        NetworkError,
        Status(502),
        NetworkError,
        NetworkError,
        Serve(Duration::from_secs(100)),
        NetworkError,
        Status(500),
        Status(403),
    ];
    let mut r = 0.0;
    let (events, _) = run(&script, &mut || {
        r = (r + 0.37) % 1.0;
        r
    });
    let delays: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Wait { delay } => Some(*delay),
            _ => None,
        })
        .collect();
    // 8 failures: 1..60; the connection that dies: back to 1; then 2, 4.
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 1, 2, 4]);
    assert!(events.contains(&Event::Connected));
    // Pings at 20, 40, ..., 100 answered; the one at 120 is not: dead at 140 s.
    assert!(events.contains(&Event::Dead {
        after: Duration::from_secs(140)
    }));
    assert_eq!(
        events.last(),
        Some(&Event::Exit(
            1,
            "the relay refused the worker with HTTP 403".into()
        ))
    );
}

#[test]
fn a_relay_that_does_not_speak_the_protocol_is_final() {
    use Attempt::*;
    for (script, msg) in [
        (
            [NetworkError, Upgrade(None)],
            "the relay did not select the strata-worker-connect.v1 subprotocol",
        ),
        (
            [Status(503), Upgrade(Some("chat"))],
            "the relay selected subprotocol \"chat\", not strata-worker-connect.v1",
        ),
        (
            [Status(429), Status(401)],
            "the relay refused the worker with HTTP 401",
        ),
    ] {
        let (events, waits) = run(&script, &mut || 0.5);
        assert_eq!(waits.len(), 1);
        assert_eq!(
            events,
            [
                Event::Dial,
                Event::Wait { delay: 1 },
                Event::Dial,
                Event::Exit(1, msg.into())
            ]
        );
    }
}

#[test]
fn waits_over_many_draws_cover_the_range() {
    // A deterministic xorshift as the caller's randomness.
    let mut s = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let script = [Attempt::NetworkError; 12];
    let mut min_ratio = [f64::MAX; 12];
    let mut max_ratio = [0.0f64; 12];
    for _ in 0..500 {
        let (events, waits) = run(&script, &mut next);
        let delays: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Wait { delay } => Some(*delay),
                _ => None,
            })
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60]);
        for (i, (w, d)) in waits.iter().zip(&delays).enumerate() {
            let ratio = w.as_secs_f64() / *d as f64;
            assert!((0.5..=1.0).contains(&ratio), "{w:?} for {d} s");
            min_ratio[i] = min_ratio[i].min(ratio);
            max_ratio[i] = max_ratio[i].max(ratio);
        }
    }
    for i in 0..12 {
        assert!(min_ratio[i] < 0.55 && max_ratio[i] > 0.95, "{i}");
    }
}
