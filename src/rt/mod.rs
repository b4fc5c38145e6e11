//! Runtime-agnostic async adapters, built only on `futures-core` and
//! `futures-sink`: a driver future per connection that any executor can poll,
//! generic over any WebSocket that is a `Stream` of incoming [`Message`]s and
//! a `Sink` of outgoing ones, with bodies as `Stream`s and `Sink`s of
//! [`Bytes`](bytes::Bytes). Timers come from the caller through [`Timer`].
//!
//! - Relay: [`relay`] gives a [`RelayHandle`] (send requests, get
//!   [`Response`]s or a [`RelayError`] such as [`RelayError::WorkerGone`],
//!   which the caller answers with 502) and a [`RelayDriver`] to spawn.
//! - Worker: [`worker`] gives [`Incoming`], a stream of [`Request`]s (head,
//!   body stream, [`Responder`]) and a [`WorkerDriver`] to spawn.
//!
//! Backpressure is end to end: a body sink is not ready while the
//! connection's queue is full, and the driver stops reading the socket while
//! a body holds its bound of unread chunks.
//!
//! [`Message`]: crate::frame::Message

mod driver;
mod relay;
mod side;
mod timer;
mod worker;

pub use driver::DriverError;
pub use relay::{
    relay, RelayDriver, RelayError, RelayHandle, RequestSink, Response, ResponseBody,
    ResponseFuture,
};
pub use timer::{Sleep, Timer};
pub use worker::{
    worker, ClientGone, Incoming, Request, RequestBody, Responder, ResponseSink, WorkerDriver,
};

use crate::proto::{RelayEnd, StreamError};

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
    /// The connection was lost.
    #[error("the connection was lost")]
    ConnectionLost,
    /// (Worker side) the client has gone: the relay aborted the stream or the
    /// connection was lost.
    #[error("the client has gone")]
    ClientGone,
    /// The state machine refused the command.
    #[error(transparent)]
    Stream(#[from] StreamError),
}

impl From<RelayEnd> for BodyError {
    fn from(e: RelayEnd) -> BodyError {
        match e {
            RelayEnd::WorkerAborted => BodyError::Aborted,
            RelayEnd::ProtocolError => BodyError::ProtocolError,
            _ => BodyError::ConnectionLost,
        }
    }
}
