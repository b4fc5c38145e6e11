//! Errors of the state machines' application commands.

use crate::frame::{FrameError, HeadLimitError, Message};

/// Why an application command on a stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The connection is closed; no stream can be opened or written.
    #[error("the connection is closed")]
    ConnectionClosed,
    /// The key was never handed out by this connection.
    #[error("unknown stream")]
    UnknownStream,
    /// The open-streams bound is reached.
    #[error("too many open streams (limit {limit})")]
    TooManyStreams {
        /// The configured bound.
        limit: usize,
    },
    /// A head that cannot be sent: it encodes to more than the message
    /// limit, or (worker) its status is not a final one in 200..=599.
    #[error("invalid head: {0}")]
    InvalidHead(#[from] FrameError),
    /// (Relay) the request head is over a bound of the relay's
    /// [`HeadLimits`](crate::frame::HeadLimits); answer the caller with
    /// [`HeadLimitError::status`] (431, 414 or 400).
    #[error("request head refused: {0}")]
    HeadOverLimit(#[from] HeadLimitError),
    /// (Relay) the request's method is one the relay refuses
    /// ([`RelayConfig::refused_methods`](super::RelayConfig::refused_methods),
    /// by default `CONNECT` and `TRACE`); answer 405.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The Content-Length header is not a number, or several disagree.
    #[error("invalid Content-Length")]
    InvalidContentLength,
    /// More body than the Content-Length announced.
    #[error("body longer than its Content-Length of {limit} bytes")]
    ContentLengthExceeded {
        /// The announced length.
        limit: u64,
    },
    /// The body ended before the Content-Length announced; the stream was aborted.
    #[error(
        "body of {sent} bytes is shorter than its Content-Length of {expected}; stream aborted"
    )]
    ContentLengthShort {
        /// The announced length.
        expected: u64,
        /// The bytes sent.
        sent: u64,
    },
    /// A response was already started on this stream.
    #[error("the response was already started")]
    AlreadyResponded,
    /// Body or finish before the response head.
    #[error("the response has not been started")]
    NotResponded,
    /// Body after the stream's output was finished.
    #[error("the stream's output is already finished")]
    AlreadyFinished,
    /// (Relay) `refill` with more bytes than the stream's overflow store holds.
    #[error("refill longer than the {stored} bytes in the overflow store")]
    RefillTooLong {
        /// The bytes the store holds for the stream.
        stored: u64,
    },
}

impl StreamError {
    /// The HTTP status a relay answers its caller with when
    /// [`open_stream`](super::RelayConnection::open_stream) refuses a request
    /// for this reason: 503 for too many streams (send `Retry-After`), 405
    /// for a refused method, 431/414/400 for a head over a bound, 400 for a
    /// bad Content-Length or head, 502 when the connection is closed.
    pub fn status(&self) -> u16 {
        match self {
            StreamError::TooManyStreams { .. } => 503,
            StreamError::MethodNotAllowed => 405,
            StreamError::HeadOverLimit(e) => e.status(),
            StreamError::ConnectionClosed => 502,
            StreamError::InvalidHead(FrameError::TooLarge { .. }) => 431,
            StreamError::InvalidHead(_)
            | StreamError::InvalidContentLength
            | StreamError::ContentLengthExceeded { .. }
            | StreamError::ContentLengthShort { .. } => 400,
            StreamError::UnknownStream
            | StreamError::RefillTooLong { .. }
            | StreamError::AlreadyResponded
            | StreamError::NotResponded
            | StreamError::AlreadyFinished => 500,
        }
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
