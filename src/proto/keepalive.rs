//! Keepalive: a WebSocket ping every 20 s; no pong within 20 s of a ping
//! means the connection is dead.

use super::config::{positive, ConfigError};
use crate::frame::{CloseCode, CloseFrame, Message};
use bytes::Bytes;
use std::time::{Duration, Instant};

/// Keepalive settings. The defaults are the spec's: a ping every 20 s, dead
/// if no pong within 20 s.
///
/// ```
/// use std::time::Duration;
/// use worker_relay::proto::KeepaliveConfig;
///
/// let fast = KeepaliveConfig::new(Duration::from_secs(5), Duration::from_secs(5))?;
/// assert_eq!(fast.timeout(), Duration::from_secs(5));
/// assert!(KeepaliveConfig::new(Duration::ZERO, Duration::from_secs(5)).is_err());
/// # Ok::<(), worker_relay::proto::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepaliveConfig {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
}

impl KeepaliveConfig {
    /// A ping every `interval` (`Duration::MAX`: never), dead if no pong
    /// within `timeout` of one. Both must be longer than zero.
    pub fn new(interval: Duration, timeout: Duration) -> Result<KeepaliveConfig, ConfigError> {
        positive("interval", interval)?;
        positive("timeout", timeout)?;
        Ok(KeepaliveConfig { interval, timeout })
    }

    /// Time from one ping to the next (default 20 s).
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How long after a ping its pong may arrive (default 20 s).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Default for KeepaliveConfig {
    fn default() -> KeepaliveConfig {
        KeepaliveConfig {
            interval: Duration::from_secs(20),
            timeout: Duration::from_secs(20),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outstanding {
    payload: [u8; 8],
    /// `None` if `sent + timeout` is not representable: never times out.
    deadline: Option<Instant>,
}

/// The keepalive of one connection, sans-IO, for a state machine to embed.
///
/// # Inputs
/// - [`Keepalive::handle_timeout`]: the time is (at or past)
///   [`Keepalive::poll_timeout`]. Extra calls are harmless no-ops.
/// - [`Keepalive::handle_pong`]: a pong arrived.
///
/// # Outputs, drained after each input
/// - [`Keepalive::poll_ping`]: a ping to send. Send it ahead of queued body
///   chunks: the deadline runs from the `handle_timeout` that produced it.
/// - [`Keepalive::is_dead`] / [`Keepalive::close_frame`]: no pong came in
///   time; close the connection (with 1011 "keepalive ping timeout", as
///   Strata's worker's WebSocket library does) and reconnect.
/// - [`Keepalive::poll_timeout`]: when to call `handle_timeout` next.
///
/// Time only moves forward: an `Instant` earlier than one already seen is
/// taken as the latest one seen.
///
/// Only a pong carrying the payload of the outstanding ping counts (every
/// WebSocket implementation echoes it, RFC 6455 §5.5.3); other inbound
/// messages are not liveness, since the spec asks for a pong. One ping is
/// outstanding at a time: the next is due `interval` after the previous one
/// was sent, or when its pong arrives if that is later.
///
/// ```
/// use std::time::{Duration, Instant};
/// use worker_relay::proto::{Keepalive, KeepaliveConfig};
/// use worker_relay::frame::Message;
///
/// let t0 = Instant::now(); // the caller's clock, read outside the core
/// let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
/// assert_eq!(ka.poll_timeout(), Some(t0 + Duration::from_secs(20)));
///
/// ka.handle_timeout(t0 + Duration::from_secs(20));
/// let Some(Message::Ping(payload)) = ka.poll_ping() else { unreachable!() };
/// // ... send it; the relay's pong echoes the payload:
/// ka.handle_pong(t0 + Duration::from_secs(21), &payload);
/// assert!(!ka.is_dead());
/// assert_eq!(ka.poll_timeout(), Some(t0 + Duration::from_secs(40)));
///
/// ka.handle_timeout(t0 + Duration::from_secs(40));
/// assert!(ka.poll_ping().is_some());
/// ka.handle_timeout(t0 + Duration::from_secs(60)); // no pong
/// assert!(ka.is_dead());
/// ```
#[derive(Debug, Clone)]
pub struct Keepalive {
    config: KeepaliveConfig,
    /// The latest time seen.
    now: Instant,
    /// When the next ping is due (`None`: never).
    next_ping: Option<Instant>,
    outstanding: Option<Outstanding>,
    /// A ping produced and not yet taken by `poll_ping`.
    queued: Option<[u8; 8]>,
    sent: u64,
    dead: bool,
}

impl Keepalive {
    /// The close code for a connection whose pong did not come: 1011.
    pub const CLOSE_CODE: CloseCode = CloseCode::INTERNAL_ERROR;
    /// The close reason for a connection whose pong did not come.
    pub const CLOSE_REASON: &'static str = "keepalive ping timeout";

    /// The keepalive of a connection established at `now`: the first ping is
    /// due `interval` later.
    pub fn new(config: KeepaliveConfig, now: Instant) -> Keepalive {
        Keepalive {
            config,
            now,
            next_ping: now.checked_add(config.interval),
            outstanding: None,
            queued: None,
            sent: 0,
            dead: false,
        }
    }

    /// The settings.
    pub fn config(&self) -> &KeepaliveConfig {
        &self.config
    }

    /// Whether no pong came in time: the connection is to be closed.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// The close frame to send once [`Keepalive::is_dead`]: code 1011,
    /// reason "keepalive ping timeout". `None` while the connection is alive.
    pub fn close_frame(&self) -> Option<CloseFrame> {
        self.dead.then(|| CloseFrame {
            code: Self::CLOSE_CODE,
            reason: Self::CLOSE_REASON.to_owned(),
        })
    }

    /// Whether a ping was sent and its pong has not arrived yet.
    pub fn awaiting_pong(&self) -> bool {
        self.outstanding.is_some()
    }

    /// How many pings this keepalive has produced.
    pub fn pings_sent(&self) -> u64 {
        self.sent
    }

    fn advance(&mut self, now: Instant) -> Instant {
        if now > self.now {
            self.now = now;
        }
        self.now
    }

    /// Time has reached `now`: produce a ping if one is due, or declare the
    /// connection dead if a pong is overdue (`now` at or past its deadline).
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.advance(now);
        if self.dead {
            return;
        }
        if let Some(out) = self.outstanding {
            if out.deadline.is_some_and(|d| now >= d) {
                self.dead = true;
                self.queued = None;
            }
            return;
        }
        if self.next_ping.is_some_and(|t| now >= t) {
            let payload = self.sent.to_be_bytes();
            self.sent += 1;
            self.outstanding = Some(Outstanding {
                payload,
                deadline: now.checked_add(self.config.timeout),
            });
            self.queued = Some(payload);
            self.next_ping = now.checked_add(self.config.interval);
        }
    }

    /// A pong arrived at `now` with `payload`.
    ///
    /// It answers the outstanding ping if it carries that ping's payload and
    /// arrives by its deadline; a pong after the deadline finds the connection
    /// already dead. Other pongs (unsolicited, stale) are ignored.
    pub fn handle_pong(&mut self, now: Instant, payload: &[u8]) {
        let now = self.advance(now);
        if self.dead {
            return;
        }
        let Some(out) = self.outstanding else {
            return;
        };
        if out.deadline.is_some_and(|d| now > d) {
            self.dead = true;
            self.queued = None;
            return;
        }
        if payload == out.payload {
            self.outstanding = None;
            // The next ping is due `interval` after this one, but never in the past.
            self.next_ping = self.next_ping.map(|t| t.max(now));
        }
    }

    /// Restarts the outstanding ping's pong deadline at `now`. A state
    /// machine calls this while it has stopped reading the socket for
    /// backpressure: the pong may be sitting unread behind body chunks, which
    /// is not the peer's fault.
    pub fn extend_deadline(&mut self, now: Instant) {
        let now = self.advance(now);
        if self.dead {
            return;
        }
        if let Some(out) = self.outstanding.as_mut() {
            out.deadline = now.checked_add(self.config.timeout);
        }
    }

    /// Moves the outstanding ping's pong deadline to `until` if that is
    /// later. A state machine calls this while the peer is still taking our
    /// output (a message left for the socket recently): a peer that reads is
    /// alive, even when its pong waits behind what we sent.
    pub fn defer_deadline(&mut self, until: Instant) {
        if self.dead {
            return;
        }
        if let Some(out) = self.outstanding.as_mut() {
            if out.deadline.is_some_and(|d| d < until) {
                out.deadline = Some(until);
            }
        }
    }

    /// The ping to send, if one was produced (a [`Message::Ping`]).
    pub fn poll_ping(&mut self) -> Option<Message> {
        self.queued
            .take()
            .map(|p| Message::Ping(Bytes::copy_from_slice(&p)))
    }

    /// When to call [`Keepalive::handle_timeout`] next: the pong deadline
    /// while a ping is outstanding, else when the next ping is due. `None`
    /// once dead, or if no timer is pending.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.dead {
            return None;
        }
        match self.outstanding {
            Some(out) => out.deadline,
            None => self.next_ping,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ping_payload(ka: &mut Keepalive) -> Bytes {
        match ka.poll_ping() {
            Some(Message::Ping(p)) => p,
            other => panic!("expected a ping, got {other:?}"),
        }
    }

    /// Drives `ka` from timer to timer up to `end`, answering each ping after
    /// `rtt` (or never if `None`); returns the times pings were sent.
    fn run(ka: &mut Keepalive, t0: Instant, end: Duration, rtt: Option<Duration>) -> Vec<u64> {
        let mut pings = Vec::new();
        let mut pending_pong: Option<(Instant, Bytes)> = None;
        loop {
            let timer = ka.poll_timeout();
            let next = match (&pending_pong, timer) {
                (Some((at, _)), Some(t)) if *at <= t => *at,
                (Some((at, _)), None) => *at,
                (_, Some(t)) => t,
                (None, None) => break,
            };
            if next > t0 + end {
                break;
            }
            if pending_pong.as_ref().is_some_and(|(at, _)| *at == next) {
                let (at, p) = pending_pong.take().unwrap();
                ka.handle_pong(at, &p);
            } else {
                ka.handle_timeout(next);
            }
            if let Some(Message::Ping(p)) = ka.poll_ping() {
                pings.push((next - t0).as_secs());
                if let Some(rtt) = rtt {
                    pending_pong = Some((next + rtt, p));
                }
            }
        }
        pings
    }

    #[test]
    fn pings_at_the_interval() {
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        assert_eq!(ka.config(), &KeepaliveConfig::default());
        assert_eq!(ka.poll_timeout(), Some(t0 + secs(20)));
        assert!(ka.poll_ping().is_none());
        let pings = run(&mut ka, t0, secs(200), Some(Duration::from_millis(30)));
        assert_eq!(pings, [20, 40, 60, 80, 100, 120, 140, 160, 180, 200]);
        assert!(!ka.is_dead());
        assert_eq!(ka.pings_sent(), 10);
    }

    #[test]
    fn a_pong_in_time_keeps_the_connection() {
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        ka.handle_timeout(t0 + secs(20));
        let p = ping_payload(&mut ka);
        assert!(ka.awaiting_pong());
        assert_eq!(ka.poll_timeout(), Some(t0 + secs(40)));
        // A pong at the very deadline, handled before the timer, still counts.
        ka.handle_pong(t0 + secs(40), &p);
        assert!(!ka.awaiting_pong());
        assert!(!ka.is_dead());
        assert_eq!(ka.close_frame(), None);
        // The next ping is due at once (20 s after the last one).
        assert_eq!(ka.poll_timeout(), Some(t0 + secs(40)));
        ka.handle_timeout(t0 + secs(40));
        let p2 = ping_payload(&mut ka);
        assert_ne!(p, p2);
        ka.handle_pong(t0 + secs(41), &p2);
        // Pongs taking 19 s, forever: never dead.
        let pings = run(&mut ka, t0, secs(400), Some(secs(19)));
        assert!(!ka.is_dead());
        assert_eq!(pings, (3..=20).map(|k| k * 20).collect::<Vec<u64>>());
    }

    #[test]
    fn a_missing_pong_closes_the_connection() {
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        let pings = run(&mut ka, t0, secs(400), None);
        assert_eq!(pings, [20]);
        assert!(ka.is_dead());
        assert_eq!(ka.poll_timeout(), None);
        assert_eq!(
            ka.close_frame(),
            Some(CloseFrame {
                code: CloseCode(1011),
                reason: "keepalive ping timeout".into()
            })
        );
        // Dead at exactly 20 s after the ping, not before.
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        ka.handle_timeout(t0 + secs(20));
        let p = ping_payload(&mut ka);
        ka.handle_timeout(t0 + secs(39));
        assert!(!ka.is_dead());
        ka.handle_timeout(t0 + secs(40));
        assert!(ka.is_dead());
        // A late pong does not bring it back.
        ka.handle_pong(t0 + secs(41), &p);
        assert!(ka.is_dead());
        assert!(ka.poll_ping().is_none());
    }

    #[test]
    fn a_late_pong_is_a_dead_connection() {
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        ka.handle_timeout(t0 + secs(20));
        let p = ping_payload(&mut ka);
        // The timer was not called at the deadline; the pong comes after it.
        ka.handle_pong(t0 + secs(41), &p);
        assert!(ka.is_dead());
    }

    #[test]
    fn only_the_matching_pong_counts() {
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        // Unsolicited pongs before any ping change nothing.
        ka.handle_pong(t0 + secs(1), b"");
        assert_eq!(ka.poll_timeout(), Some(t0 + secs(20)));
        ka.handle_timeout(t0 + secs(20));
        let _p = ping_payload(&mut ka);
        ka.handle_pong(t0 + secs(21), b"other");
        ka.handle_pong(t0 + secs(22), b"");
        assert!(ka.awaiting_pong());
        ka.handle_timeout(t0 + secs(40));
        assert!(ka.is_dead());
    }

    #[test]
    fn extra_timeouts_are_noops_and_time_only_moves_forward() {
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        for s in [0, 5, 10, 19, 3] {
            ka.handle_timeout(t0 + secs(s));
            assert!(ka.poll_ping().is_none());
            assert_eq!(ka.poll_timeout(), Some(t0 + secs(20)));
        }
        ka.handle_timeout(t0 + secs(20));
        ka.handle_timeout(t0 + secs(20));
        ka.handle_timeout(t0 + secs(25));
        let p = ping_payload(&mut ka);
        assert!(ka.poll_ping().is_none(), "one ping, however many calls");
        // Going back in time is taken as "now is still 25 s".
        ka.handle_timeout(t0 + secs(1));
        ka.handle_pong(t0 + secs(2), &p);
        assert!(!ka.awaiting_pong());
        assert_eq!(ka.poll_timeout(), Some(t0 + secs(40)));
        assert_eq!(ka.pings_sent(), 1);
    }

    #[test]
    fn a_queued_ping_not_taken_is_dropped_when_dead() {
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        ka.handle_timeout(t0 + secs(20));
        ka.handle_timeout(t0 + secs(40));
        assert!(ka.is_dead());
        assert!(ka.poll_ping().is_none());
    }

    #[test]
    fn configurable_and_disabled() {
        let t0 = Instant::now();
        let config = KeepaliveConfig {
            interval: secs(5),
            timeout: secs(30),
        };
        let mut ka = Keepalive::new(config, t0);
        // A slow pong (12 s) delays the next ping until it arrives.
        let pings = run(&mut ka, t0, secs(60), Some(secs(12)));
        assert_eq!(pings, [5, 17, 29, 41, 53]);
        assert!(!ka.is_dead());

        let mut off = Keepalive::new(
            KeepaliveConfig {
                interval: Duration::MAX,
                timeout: Duration::MAX,
            },
            t0,
        );
        assert_eq!(off.poll_timeout(), None);
        off.handle_timeout(t0 + secs(1_000_000));
        assert!(off.poll_ping().is_none() && !off.is_dead());

        // A timeout too large to represent never fires.
        let mut patient = Keepalive::new(
            KeepaliveConfig {
                interval: secs(1),
                timeout: Duration::MAX,
            },
            t0,
        );
        patient.handle_timeout(t0 + secs(1));
        assert!(patient.poll_ping().is_some());
        assert_eq!(patient.poll_timeout(), None);
        patient.handle_timeout(t0 + secs(1_000_000));
        assert!(!patient.is_dead());
    }

    /// The issue's "a long upload in flight does not delay a ping": a sender
    /// that drains control output (the ping) before bulk chunks sends the
    /// ping at its due time however many chunks are queued, and inbound body
    /// chunks neither count as liveness nor delay it.
    #[test]
    fn a_long_upload_does_not_delay_a_ping() {
        use std::collections::VecDeque;
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        // 128 MiB queued as 1 MiB chunks, one chunk written every 500 ms.
        let mut bulk: VecDeque<usize> = (0..128).collect();
        let mut wire: Vec<(Duration, &'static str)> = Vec::new();
        let step = Duration::from_millis(500);
        let mut now = t0;
        while !bulk.is_empty() {
            now += step;
            ka.handle_timeout(now);
            if let Some(Message::Ping(_)) = ka.poll_ping() {
                wire.push((now - t0, "ping"));
            }
            bulk.pop_front();
            wire.push((now - t0, "chunk"));
        }
        let pings: Vec<Duration> = wire
            .iter()
            .filter(|(_, k)| *k == "ping")
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(pings, [secs(20)]);
        let i = wire.iter().position(|(_, k)| *k == "ping").unwrap();
        assert_eq!(
            wire[i + 1],
            (secs(20), "chunk"),
            "ping goes before that tick's chunk"
        );
        // No pong during the upload: the upload itself does not keep it alive.
        assert!(ka.is_dead());
        assert_eq!(now - t0, secs(64));
    }

    #[test]
    fn extend_deadline_restarts_the_pong_window() {
        let t0 = Instant::now();
        let mut ka = Keepalive::new(KeepaliveConfig::default(), t0);
        ka.handle_timeout(t0 + secs(20));
        let p = ping_payload(&mut ka);
        ka.extend_deadline(t0 + secs(35));
        assert_eq!(ka.poll_timeout(), Some(t0 + secs(55)));
        ka.handle_timeout(t0 + secs(40));
        assert!(!ka.is_dead(), "the old deadline no longer applies");
        ka.handle_pong(t0 + secs(50), &p);
        assert!(!ka.awaiting_pong());
        assert!(!ka.is_dead());
    }
}
