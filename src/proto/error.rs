//! Errors of the state machines' application commands: one type per
//! command, holding only what that command can return (as quinn-proto's
//! `WriteError` / `FinishError` / `ClosedStream`).
//!
//! | command | error |
//! |---|---|
//! | `RelayConnection::open_stream` | [`OpenError`] (with the HTTP status to answer) |
//! | `send_body` (both sides) | [`WriteError`] |
//! | `finish` (both sides) | [`FinishError`] |
//! | `WorkerConnection::respond` | [`RespondError`] |
//! | `WorkerConnection::fail` | [`UnknownStream`] |
//! | `RelayConnection::refill` | [`RefillError`] |
//!
//! A command on a stream that existed and has ended is swallowed (`Ok`); only
//! a key the connection never handed out is [`UnknownStream`].

use crate::frame::{FrameError, HeadLimitError, Message};

/// The key was never handed out by this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown stream")]
pub struct UnknownStream;

/// Why [`RelayConnection::open_stream`](super::RelayConnection::open_stream)
/// refused a request; [`OpenError::status`] is the answer for its caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The connection is closed (502).
    #[error("the connection is closed")]
    ConnectionClosed,
    /// The open-streams bound is reached, for this kind of request (503).
    #[error("too many open streams (limit {limit})")]
    TooManyStreams {
        /// The bound that applied (`max_streams`, less the reserve for
        /// requests that are not control routes).
        limit: usize,
    },
    /// The method is one the relay refuses (405).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The head is over a bound of the relay's head limits (431, 414, 400).
    #[error("request head refused: {0}")]
    HeadOverLimit(#[from] HeadLimitError),
    /// The Content-Length header is not a number, or several disagree (400).
    #[error("invalid Content-Length")]
    InvalidContentLength,
    /// The `request` frame would be over the 1 MiB message limit (431).
    #[error("invalid head: {0}")]
    InvalidHead(#[from] FrameError),
}

impl OpenError {
    /// The HTTP status a relay answers its caller with: 502 (closed), 503
    /// (too many streams: send `Retry-After`), 405 (method), 431/414/400 (a
    /// head over a bound), 400 (Content-Length), 431 (a head too large for
    /// one frame).
    pub fn status(&self) -> u16 {
        match self {
            OpenError::ConnectionClosed => 502,
            OpenError::TooManyStreams { .. } => 503,
            OpenError::MethodNotAllowed => 405,
            OpenError::HeadOverLimit(e) => e.status(),
            OpenError::InvalidContentLength => 400,
            OpenError::InvalidHead(_) => 431,
        }
    }
}

/// Why `send_body` refused bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The key was never handed out by this connection.
    #[error("unknown stream")]
    UnknownStream,
    /// (Worker) body before the response head.
    #[error("the response has not been started")]
    NotResponded,
    /// Body after the stream's output was finished.
    #[error("the stream's output is already finished")]
    AlreadyFinished,
    /// More body than the Content-Length announced.
    #[error("body longer than its Content-Length of {limit} bytes")]
    ContentLengthExceeded {
        /// The announced length.
        limit: u64,
    },
}

/// Why `finish` refused to end a stream's output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FinishError {
    /// The key was never handed out by this connection.
    #[error("unknown stream")]
    UnknownStream,
    /// (Worker) `finish` before the response head.
    #[error("the response has not been started")]
    NotResponded,
    /// The stream's output was already finished.
    #[error("the stream's output is already finished")]
    AlreadyFinished,
    /// The body ended before the Content-Length announced: the stream was
    /// aborted (relay) or failed (worker) instead.
    #[error(
        "body of {sent} bytes is shorter than its Content-Length of {expected}; stream aborted"
    )]
    ContentLengthShort {
        /// The announced length.
        expected: u64,
        /// The bytes sent.
        sent: u64,
    },
}

/// Why [`WorkerConnection::respond`](super::WorkerConnection::respond)
/// refused a response head.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RespondError {
    /// The key was never handed out by this connection.
    #[error("unknown stream")]
    UnknownStream,
    /// A response was already started on this stream.
    #[error("the response was already started")]
    AlreadyResponded,
    /// The head cannot be sent: a status outside 200..=599 (the protocol
    /// has no interim responses), or over the 1 MiB message limit.
    #[error("invalid head: {0}")]
    InvalidHead(#[from] FrameError),
    /// The Content-Length header is not a number, or several disagree.
    #[error("invalid Content-Length")]
    InvalidContentLength,
}

/// Why [`RelayConnection::refill`](super::RelayConnection::refill) refused bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefillError {
    /// The key was never handed out by this connection.
    #[error("unknown stream")]
    UnknownStream,
    /// More bytes than the stream's overflow store holds.
    #[error("refill longer than the {stored} bytes in the overflow store")]
    TooLong {
        /// The bytes the store holds for the stream.
        stored: u64,
    },
}

impl From<UnknownStream> for WriteError {
    fn from(_: UnknownStream) -> WriteError {
        WriteError::UnknownStream
    }
}

impl From<UnknownStream> for FinishError {
    fn from(_: UnknownStream) -> FinishError {
        FinishError::UnknownStream
    }
}

impl From<UnknownStream> for RespondError {
    fn from(_: UnknownStream) -> RespondError {
        RespondError::UnknownStream
    }
}

impl From<UnknownStream> for RefillError {
    fn from(_: UnknownStream) -> RefillError {
        RefillError::UnknownStream
    }
}

/// Why a message was not taken by `handle_message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// The machine asked not to be fed (`wants_read()` was false): a body
    /// has as many unread chunks as its bound. The message was not processed
    /// and is handed back; feed it again once `wants_read()` is true.
    #[error("reading is paused until the application reads buffered body")]
    ReadPaused(Message),
}
