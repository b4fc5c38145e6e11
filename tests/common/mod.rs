//! The in-memory relay <-> worker pair every integration test drives.
//!
//! `Pair::progress` moves messages both ways through a bounded "socket"
//! (at most `window` messages in flight per direction), honouring each side's
//! `wants_read`, and collects events, until nothing moves. Time is virtual.
#![allow(dead_code)]

pub mod clock;
pub mod mem;

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};
use worker_relay::frame::{Headers, Message, RequestHead, ResponseHead};
use worker_relay::proto::{
    BodyRead, RelayConnection, RelayEvent, StreamKey, WorkerConnection, WorkerEvent,
};

pub struct Pair {
    pub relay: RelayConnection,
    pub worker: WorkerConnection,
    pub now: Instant,
    pub to_worker: VecDeque<Message>,
    pub to_relay: VecDeque<Message>,
    pub window: usize,
    pub relay_events: Vec<RelayEvent>,
    pub worker_events: Vec<WorkerEvent>,
    /// Every message the relay emitted, in order.
    pub relay_sent: Vec<Message>,
    /// Every message the worker emitted, in order.
    pub worker_sent: Vec<Message>,
    pub record: bool,
    /// Answer pings with pongs, as a WebSocket library does.
    pub auto_pong: bool,
    /// Read every worker request body as it arrives (into `worker_bodies`).
    pub auto_read_worker: bool,
    /// Read every relay response body as it arrives (into `relay_bodies`).
    pub auto_read_relay: bool,
    pub worker_bodies: HashMap<StreamKey, (Vec<u8>, Option<BodyRead>)>,
    pub relay_bodies: HashMap<StreamKey, (Vec<u8>, Option<BodyRead>)>,
}

impl Pair {
    pub fn new(mut relay: RelayConnection, mut worker: WorkerConnection) -> Pair {
        let now = Instant::now();
        relay.handle_timeout(now);
        worker.handle_timeout(now);
        Pair {
            relay,
            worker,
            now,
            to_worker: VecDeque::new(),
            to_relay: VecDeque::new(),
            window: 4,
            relay_events: Vec::new(),
            worker_events: Vec::new(),
            relay_sent: Vec::new(),
            worker_sent: Vec::new(),
            record: true,
            auto_pong: true,
            auto_read_worker: true,
            auto_read_relay: true,
            worker_bodies: HashMap::new(),
            relay_bodies: HashMap::new(),
        }
    }

    pub fn default_pair() -> Pair {
        Pair::new(RelayConnection::default(), WorkerConnection::default())
    }

    /// One round: each side emits into its socket (up to the window) and reads
    /// what it may. Returns whether anything moved.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        while self.to_worker.len() < self.window {
            let Some(m) = self.relay.poll_transmit() else {
                break;
            };
            if self.record {
                self.relay_sent.push(m.clone());
            }
            self.to_worker.push_back(m);
            moved = true;
        }
        while self.to_relay.len() < self.window {
            let Some(m) = self.worker.poll_transmit() else {
                break;
            };
            if self.record {
                self.worker_sent.push(m.clone());
            }
            self.to_relay.push_back(m);
            moved = true;
        }
        while self.worker.wants_read() || self.worker.is_closed() {
            let Some(m) = self.to_worker.pop_front() else {
                break;
            };
            if let (Message::Ping(p), true) = (&m, self.auto_pong) {
                // The worker's WebSocket library answers.
                self.to_relay.push_back(Message::Pong(p.clone()));
            }
            self.worker
                .handle_message(m, self.now)
                .expect("worker wanted to read");
            moved = true;
        }
        while self.relay.wants_read() || self.relay.is_closed() {
            let Some(m) = self.to_relay.pop_front() else {
                break;
            };
            if let (Message::Ping(p), true) = (&m, self.auto_pong) {
                // The relay's WebSocket library answers.
                self.to_worker.push_back(Message::Pong(p.clone()));
            }
            self.relay
                .handle_message(m, self.now)
                .expect("relay wanted to read");
            moved = true;
        }
        while let Some(e) = self.relay.poll_event() {
            if let RelayEvent::Readable { key } | RelayEvent::Ended { key, .. } = e {
                if self.auto_read_relay {
                    drain_into(&mut self.relay_bodies, key, |k| self.relay.read_body(k));
                }
            }
            self.relay_events.push(e);
            moved = true;
        }
        while let Some(e) = self.worker.poll_event() {
            if let WorkerEvent::Readable { key } | WorkerEvent::Request { key, .. } = e {
                if self.auto_read_worker {
                    drain_into(&mut self.worker_bodies, key, |k| self.worker.read_body(k));
                }
            }
            self.worker_events.push(e);
            moved = true;
        }
        moved
    }

    /// Steps until nothing moves (bounded: panics after 1,000,000 rounds).
    pub fn progress(&mut self) {
        for _ in 0..1_000_000 {
            if !self.step() {
                return;
            }
        }
        panic!("pair did not quiesce");
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.relay.handle_timeout(self.now);
        self.worker.handle_timeout(self.now);
    }

    /// The socket dies: both sides learn it.
    pub fn lose(&mut self) {
        self.to_worker.clear();
        self.to_relay.clear();
        self.relay.handle_lost();
        self.worker.handle_lost();
        self.progress();
    }

    pub fn take_relay_events(&mut self) -> Vec<RelayEvent> {
        std::mem::take(&mut self.relay_events)
    }

    pub fn take_worker_events(&mut self) -> Vec<WorkerEvent> {
        std::mem::take(&mut self.worker_events)
    }

    /// Keys of the requests the worker has seen, in order.
    pub fn worker_requests(&self) -> Vec<(StreamKey, RequestHead)> {
        self.worker_events
            .iter()
            .filter_map(|e| match e {
                WorkerEvent::Request { key, head, .. } => Some((*key, head.clone())),
                _ => None,
            })
            .collect()
    }
}

pub fn get(path: &str) -> RequestHead {
    RequestHead::new("GET", path, "", Headers::new()).unwrap()
}

pub fn post(path: &str, len: Option<usize>) -> RequestHead {
    let mut h = Headers::new();
    if let Some(n) = len {
        h.try_push("content-length", n.to_string()).unwrap();
    }
    RequestHead::new("POST", path, "", h).unwrap()
}

pub fn ok_head() -> ResponseHead {
    ResponseHead::new(200, Headers::new()).unwrap()
}

/// Reads everything buffered for a worker request; returns (bytes, ended).
pub fn worker_read_all(w: &mut WorkerConnection, key: StreamKey) -> (Vec<u8>, BodyRead) {
    let mut out = Vec::new();
    loop {
        match w.read_body(key) {
            BodyRead::Data(d) => out.extend_from_slice(&d),
            other => return (out, other),
        }
    }
}

/// Reads everything buffered for a relay response; returns (bytes, last read).
pub fn relay_read_all(r: &mut RelayConnection, key: StreamKey) -> (Vec<u8>, BodyRead) {
    let mut out = Vec::new();
    loop {
        match r.read_body(key) {
            BodyRead::Data(d) => out.extend_from_slice(&d),
            other => return (out, other),
        }
    }
}

/// Sends all of `body` on a relay stream, stepping the pair while the queue is full.
pub fn relay_send_all(p: &mut Pair, key: StreamKey, body: Bytes) {
    let mut rest = body;
    while !rest.is_empty() {
        let n = p.relay.send_body(key, rest.clone()).unwrap();
        let _ = rest.split_to(n);
        if n == 0 {
            assert!(p.step(), "stuck sending the body");
        }
    }
}

/// A body whose byte i is i % 251.
pub fn pattern(n: usize) -> Bytes {
    (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()
}

fn drain_into(
    map: &mut HashMap<StreamKey, (Vec<u8>, Option<BodyRead>)>,
    key: StreamKey,
    mut read: impl FnMut(StreamKey) -> BodyRead,
) {
    let entry = map.entry(key).or_default();
    if entry.1.is_some() {
        return;
    }
    loop {
        match read(key) {
            BodyRead::Data(d) => entry.0.extend_from_slice(&d),
            BodyRead::Pending => return,
            done => {
                entry.1 = Some(done);
                return;
            }
        }
    }
}
