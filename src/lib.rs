//! # worker-relay
//!
//! A sans-IO implementation of the Worker Relay Protocol: a worker behind NAT
//! dials one WebSocket out to a relay, and the relay forwards each HTTP request
//! it receives for the worker over that socket as a stream of frames (JSON
//! control frames plus binary body chunks with a 4-byte stream id).
//!
//! ## Layers
//!
//! - [`frame`]: the wire format, one message at a time, no connection state.
//! - [`proto`]: the sans-IO state machines, [`RelayConnection`](proto::RelayConnection)
//!   and [`WorkerConnection`](proto::WorkerConnection), with the keepalive
//!   they embed. It uses only `frame`.
//! - [`connect`]: sans-IO pieces around a connection: handshake, reconnect
//!   backoff, URL mapping (and the keepalive, re-exported).
//! - `forward` (feature `http`): a forwarded request and response as the
//!   `http` crate's types, at the relay's end and at the worker's.
//! - [`rt`]: thin async adapters on `futures-core`/`futures-sink` only, for
//!   any runtime: [`rt::relay`] and [`rt::worker`] drive a machine over any
//!   `Stream + Sink` of [`frame::Message`] and hand out handles, futures
//!   and body streams/sinks. Each driver does bounded work per poll.
//!
//!
//! This crate depends only on bytes, serde, serde_json, thiserror,
//! futures-core and futures-sink (and `http` with the feature of that name).
//! Tokio, tokio-tungstenite and hyper come with the crate beside it,
//! `worker-relay-hyper`: its `ws` (WebSockets as [`frame::Message`]s and the
//! worker's dial), `gateway` (a relay as `tower` services in any
//! hyper/axum app), `server` (a hardened accept loop, TLS) and `tunnel`
//! (any `tower` service served as a worker), metrics and the access log.
//!
//! What each call can return, and how one failure looks from each layer
//! (a stream's end, the relay's errors before and after the head, the
//! gateway's answer and its access log): [`errors`].
//!
//! Each layer's page says what it is for and shows it in a short example;
//! no layer reaches up (`frame` ← `proto` ← `connect` ← `forward`, `rt`; then,
//! in `worker-relay-hyper`, `ws` ← `gateway`, `server`, `tunnel`).
//!
//! ## The run loop
//!
//! Both state machines have the same shape (after quinn-proto and str0m).
//! Nothing inside reads a clock, touches a socket or draws a random number;
//! the caller drives them:
//!
//! | kind | relay | worker |
//! |---|---|---|
//! | inputs from the socket | `handle_message(msg, now)`, `handle_lost()` | same |
//! | input from the clock | `handle_timeout(now)` (runs deadlines), `advance_time(now)` (only tells the time) | same |
//! | application commands | `open_stream`, `send_body`, `finish`, `abort`, `read_body`, `refill`, `close` | `respond`, `send_body`, `finish`, `fail`, `read_body`, `discard_body`, `close` |
//! | drains | `poll_transmit()`, `poll_event()`, `poll_spill()`, `poll_timeout()` | `poll_transmit()`, `poll_event()`, `poll_timeout()` |
//! | getters | `wants_read()`, `send_capacity(key)`, `is_closed()`, `close_cause()`, `close_timed_out()`, `stats()` | same |
//!
//! Each turn of the loop:
//!
//! 1. apply the application's commands (after `advance_time(now)` when time
//!    may have passed since the last input: a deadline a command restarts,
//!    such as a stream's stall deadline on `read_body`, counts from then);
//! 2. drain `poll_transmit()` into the socket until it returns `None` (or the
//!    socket is full: the messages wait inside the machine, bounded); a relay
//!    with an overflow configured also drains `poll_spill()` into its
//!    overflow store. On a real link, hand the socket at most one chunk's
//!    worth between two completed flushes and tell the machine the chunk
//!    size with `set_chunk_size`, both from a [`proto::pacer::SendPacer`]
//!    fed with what the socket did: whatever the socket holds, a cancel's
//!    answer waits behind (the `rt` drivers do this);
//! 3. drain `poll_event()` and act on each event (read bodies with
//!    `read_body` on `Readable`, answer requests, hand stored bytes back with
//!    `refill` on `Refill`, …);
//! 4. wait for whichever comes first: a message from the socket — **only if
//!    `wants_read()`** (this is the backpressure: a body with 16 unread
//!    chunks pauses reading), the deadline from `poll_timeout()`, or an
//!    application command; then feed it with `handle_message`,
//!    `handle_timeout` or the command, and go round again.
//!
//! Time only moves forward, and extra `handle_timeout` calls are harmless.
//! The deadlines behind `poll_timeout()` are the keepalive (both sides) and,
//! on the relay, each stream's stall deadline and the read-pause bound: a
//! caller that does not keep up costs only its own stream
//! ([`proto::RelayConnection`] has the details). Once a connection is
//! closed (by either side), the only deadline is its close deadline
//! (`close_timeout`, 5 s): past it `close_timed_out()` is true, and the
//! driver drops the transport without waiting any longer for a peer that
//! does not read its close, answer it, or end the stream (the drivers
//! complete the close as a handshake: [`rt`] says how).
//! A panic is a bug in this crate, never the result of peer input.
//!
//! Here is a complete loop: a relay and a worker connected by two in-memory
//! queues instead of a socket, serving `GET /health`.
//!
//! ```
//! use std::collections::VecDeque;
//! use std::time::Instant;
//! use worker_relay::frame::{Headers, Message, RequestHead, ResponseHead};
//! use worker_relay::proto::{BodyRead, RelayConnection, RelayEvent, WorkerConnection, WorkerEvent};
//! use worker_relay::Bytes;
//!
//! let mut relay = RelayConnection::default();
//! let mut worker = WorkerConnection::default();
//! let (mut to_worker, mut to_relay) = (VecDeque::<Message>::new(), VecDeque::<Message>::new());
//!
//! // The relay's caller: GET /health (no body: open, then finish).
//! let key = relay.open_stream(RequestHead::new("GET", "/health", "", Headers::new())?)?;
//! relay.finish(key)?;
//!
//! let mut answer = Vec::new();
//! let mut done = false;
//! for _turn in 0..100 {
//!     let now = Instant::now();
//!     // 2. transmit
//!     while let Some(m) = relay.poll_transmit() { to_worker.push_back(m); }
//!     while let Some(m) = worker.poll_transmit() { to_relay.push_back(m); }
//!     // 4. receive, honouring backpressure
//!     while worker.wants_read() {
//!         let Some(m) = to_worker.pop_front() else { break };
//!         worker.handle_message(m, now)?;
//!     }
//!     while relay.wants_read() {
//!         let Some(m) = to_relay.pop_front() else { break };
//!         relay.handle_message(m, now)?;
//!     }
//!     // 3. events: the worker's application answers, the relay's caller reads.
//!     while let Some(ev) = worker.poll_event() {
//!         if let WorkerEvent::Request { key, head, .. } = ev {
//!             assert_eq!(head.path(), "/health");
//!             let headers = Headers::try_from_pairs([("content-type", "application/json")])?;
//!             worker.respond(key, ResponseHead::new(200, headers)?)?;
//!             worker.send_body(key, Bytes::from_static(br#"{"status":"ok"}"#))?;
//!             worker.finish(key)?;
//!         }
//!     }
//!     while let Some(ev) = relay.poll_event() {
//!         match ev {
//!             RelayEvent::Response { head, .. } => assert_eq!(head.status(), 200),
//!             RelayEvent::Readable { key } => loop {
//!                 match relay.read_body(key) {
//!                     BodyRead::Data(d) => answer.extend_from_slice(&d),
//!                     BodyRead::End => { done = true; break }
//!                     _ => break, // Pending (more later) or Gone
//!                 }
//!             },
//!             _ => {}
//!         }
//!     }
//!     if done { break }
//! }
//! assert_eq!(answer, br#"{"status":"ok"}"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Decoding and encoding a frame
//!
//! ```
//! use worker_relay::frame::{self, ControlFrame, Decoded, Chunk, StreamId};
//! use bytes::Bytes;
//!
//! let text = r#"{"type":"request","id":7,"method":"GET","path":"/health","query":"","headers":[]}"#;
//! let Decoded::Control(ControlFrame::Request { id, head }) = frame::decode_text(text)? else {
//!     unreachable!()
//! };
//! assert_eq!((id.get(), head.method(), head.path()), (7, "GET", "/health"));
//!
//! let end = ControlFrame::End { id };
//! assert_eq!(end.encode(), r#"{"type":"end","id":7}"#);
//!
//! let chunk = Chunk { id, data: Bytes::from_static(b"hello") };
//! let wire = chunk.encode();
//! assert_eq!(&wire[..4], &[0, 0, 0, 7]);
//! assert_eq!(frame::decode_binary(wire)?, Decoded::Chunk(chunk));
//! # Ok::<(), worker_relay::frame::FrameError>(())
//! ```
//!
//! Peer input never panics this crate: every malformed message has a defined
//! outcome, an error that says what failed and which close code to use.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod connect;
pub mod errors;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod forward;
pub mod frame;
pub mod proto;
pub mod rt;

pub use bytes::Bytes;
