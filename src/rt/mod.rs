//! Runtime-agnostic async adapters, built only on `futures-core` and
//! `futures-sink`: a driver future per connection that any executor can poll,
//! generic over any WebSocket that is a `Stream` of incoming [`Message`]s and
//! a `Sink` of outgoing ones, with bodies as `Stream`s and `Sink`s of
//! [`Bytes`](bytes::Bytes). Timers come from the caller through [`Timer`].
//! The socket keeps the `Stream` contract: after a read answered
//! `Pending`, a driver reads it again only once the waker of that read has
//! fired, not on each of its own wake-ups (a read that finds nothing is not
//! free: tungstenite zeroes its free read buffer before each one).
//!
//! - Relay: [`relay`] gives a [`RelayHandle`] (send requests, get
//!   [`WorkerResponse`]s or a [`RelayError`] such as [`RelayError::WorkerGone`],
//!   which the caller answers with 502) and a [`RelayDriver`] to spawn.
//! - Worker: [`worker`] gives [`Incoming`], a stream of [`IncomingRequest`]s (head,
//!   body stream, [`Responder`]) and a [`WorkerDriver`] to spawn.
//!
//! Backpressure is end to end: a body sink is not ready while the
//! connection's queue is full, and the driver stops reading the socket while
//! a body holds its bound of unread chunks, or, with
//! [`RelayConfig::overflow`](crate::proto::RelayConfig::overflow), sends a
//! slow reader's response to an [`Overflow`] store (with [`relay`], a
//! [`MemoryOverflow`] of 64 MiB; `TempFileOverflow`, feature `tempfile`,
//! keeps it in temporary files) so the other streams never wait.
//! The drivers end with [`Closed`] (who closed, with which code) or a
//! [`DriverError`] (socket error, keepalive timeout, oversized message, a
//! close that did not complete in time); a peer found dead by the
//! keepalive is dropped at once, even with a write pending.
//!
//! The close is a handshake (RFC 6455 §7.1.1): once its close message (or
//! the socket's answer to the peer's) is flushed, a driver reads on,
//! discarding what still comes, until the peer's close message (the relay,
//! the WebSocket server) or the end of the stream (the worker, the client:
//! the server ends the TCP connection first), and only then closes the
//! socket (`Sink::poll_close`; `ws::WsSocket` shuts its write side: TLS
//! `close_notify`, TCP FIN). A socket dropped with bytes unread would send
//! a TCP reset, which can erase the close message at the peer before it is
//! read. All of it is bounded by the close deadline (`close_timeout`, 5 s):
//! a peer that does not take the close, answer it or end the stream by
//! then has the transport dropped. The socket must answer a peer's close
//! message itself, as WebSocket libraries do (tungstenite does); the
//! machines do not queue that answer.
//!
//! # Who answers pings
//!
//! The peer's keepalive pings every 20 s and takes the connection for dead
//! when no pong comes within 20 s more. Most WebSocket libraries answer a
//! ping before the application sees it (tungstenite does, and so
//! `worker-relay-hyper`'s `ws::WsSocket`); then leave the configurations'
//! `answer_pings` off, the default. Over a library that hands pings to the
//! application and leaves the answer to it (actix-ws does), turn it on
//! ([`RelayConfig::answer_pings`](crate::proto::RelayConfig::answer_pings),
//! [`WorkerConfig::answer_pings`](crate::proto::WorkerConfig::answer_pings)):
//! the driver then sends the pong, ahead of body chunks. A relay that
//! leaves pings unanswered loses each worker about every 40 s.
//!
//! # Overflow on a server
//!
//! [`relay`] assumes no runtime and no file system, so a slow caller's
//! response waits in memory: 1 MiB per stream, then a [`MemoryOverflow`] of
//! 64 MiB for the connection. On a server with many callers that is the
//! wrong trade: a caller reading at 20 MB/s while the worker sends at 200
//! gets its response cut once 64 MiB wait (in issue 44's trial, a 100 MiB
//! download read at 20 MB/s ended at 11.5 MB), and each connection may
//! hold 65 MiB of RAM. Give a server's relays a store on disk, one budget for all
//! of them, with [`relay_with_overflow`]: `worker-relay-hyper`'s
//! `TempFileOverflow` (unlinked temporary files, 8 GiB by default, its work
//! on tokio's blocking pool), which is what its `gateway::Gateway` uses,
//! with 256 KiB per stream in memory first.
//!
//! Before each command a handle passes to the machine, the driver's clock
//! is read ([`Timer::now`]), so the deadlines a command restarts count from
//! when it was issued.
//!
//! Handles and driver share the machine behind one lock, which the driver
//! takes for each step on the machine and never across a call on the
//! socket: a handle on another thread of a multi-thread runtime (a caller
//! opening a request, a body read) never waits for the driver's `sendto` or
//! `recvfrom`. When a spilled stream's memory runs empty, its next body read
//! takes the next piece back from the [`Overflow`] store itself, in the
//! reader's task, without waiting for the driver to run (it may then also
//! append other streams' spilled chunks to their stores, as the driver
//! would have). A store that may block hands that work to a thread
//! ([`Overflow::spawn`]): nothing then waits for it but its own stream, and
//! the reader is woken when its bytes are back.
//!
//! # Sending a request with a body
//!
//! Write the body **while** awaiting the response: a worker may answer
//! while it reads (an echo, an early 401), and its answer needs a reader.
//! With an overflow the answer waits there (within its budget), and without
//! one the stream is given up past `read_pause_timeout`
//! ([`BodyError::Stalled`]), so a sequential write-then-await never hangs;
//! but only the concurrent form streams in constant memory:
//!
//! ```
//! use bytes::Bytes;
//! use futures::{SinkExt, Stream, StreamExt, TryStreamExt};
//! use worker_relay::frame::RequestHead;
//! use worker_relay::rt::RelayHandle;
//!
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//!
//! /// Forwards one request: the body goes up while the answer comes down.
//! async fn forward(
//!     handle: &RelayHandle,
//!     head: RequestHead,
//!     mut body: impl Stream<Item = Bytes> + Unpin,
//! ) -> Result<(u16, Vec<u8>), BoxError> {
//!     let (mut sink, response) = handle.send_request(head)?;
//!     let upload = async move {
//!         while let Some(piece) = body.next().await {
//!             sink.send(piece).await?;
//!         }
//!         sink.close().await // `end`; dropping the sink unclosed aborts
//!     };
//!     let download = async move {
//!         let resp = response.await?;
//!         let status = resp.head.status();
//!         let pieces: Vec<Bytes> = resp.body.try_collect().await?;
//!         Ok::<_, BoxError>((status, pieces.concat()))
//!     };
//!     let (up, down) = futures::join!(upload, download);
//!     up?;
//!     down
//! }
//! ```
//!
//! [`Message`]: crate::frame::Message

mod driver;
mod overflow;
mod overflow_io;
mod relay;
mod side;
mod timer;
mod worker;

pub use driver::{Closed, DriverError};
pub use overflow::{MemoryOverflow, Overflow, OverflowFile, OverflowJob};
pub use relay::{
    relay, relay_with_overflow, RelayDriver, RelayError, RelayHandle, RequestSink, ResponseBody,
    ResponseFuture, WorkerResponse,
};
pub use timer::{Sleep, Timer};
pub use worker::{
    worker, ClientGone, Incoming, IncomingRequest, RequestBody, Responder, ResponseSink,
    WorkerDriver,
};

use crate::proto::{FinishError, RelayEnd, WriteError};

/// Why a body stream or sink failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The worker aborted the response after it started.
    #[error("the worker aborted the response")]
    Aborted,
    /// The peer broke the protocol on this stream (relay side: the worker's
    /// body did not match its Content-Length, …; worker side: the relay's).
    #[error("the peer broke the protocol")]
    ProtocolError,
    /// (Relay side) the request's sink was dropped before it was closed, so
    /// the stream was aborted.
    #[error("the request was abandoned before its end")]
    RequestAborted,
    /// (Relay side) the response was given up because its reader took
    /// nothing for `RelayConfig::stall_timeout` (or held reading paused past
    /// `read_pause_timeout`); the worker was sent `abort`.
    #[error("the response was not read in time and was given up")]
    Stalled,
    /// (Relay side) the response outgrew the overflow's bounds, or the
    /// overflow store failed; the worker was sent `abort`.
    #[error("the response outgrew its overflow, or the overflow store failed")]
    Overflow,
    /// The connection was lost.
    #[error("the connection was lost")]
    ConnectionLost,
    /// (Worker side) the client has gone: the relay aborted the stream or the
    /// connection was lost.
    #[error("the client has gone")]
    ClientGone,
    /// The state machine refused the bytes (after the end, past the
    /// Content-Length, before the response head).
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The state machine refused to end the body (short of its
    /// Content-Length: the stream was aborted instead).
    #[error(transparent)]
    Finish(#[from] FinishError),
}

impl From<RelayEnd> for BodyError {
    fn from(e: RelayEnd) -> BodyError {
        match e {
            RelayEnd::WorkerAborted => BodyError::Aborted,
            RelayEnd::ProtocolError => BodyError::ProtocolError,
            RelayEnd::CallerStalled => BodyError::Stalled,
            RelayEnd::OverflowExceeded => BodyError::Overflow,
            _ => BodyError::ConnectionLost,
        }
    }
}
