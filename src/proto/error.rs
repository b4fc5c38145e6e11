//! Errors of the state machines' application commands.

use crate::frame::FrameError;

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
    /// A head that cannot be sent: it encodes to more than the message limit.
    #[error("invalid head: {0}")]
    InvalidHead(#[from] FrameError),
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
}

/// Why a message was not taken by `handle_message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// The machine asked not to be fed (`wants_read()` was false): a body
    /// has as many unread chunks as its bound. The message was not processed;
    /// feed it again once the application has read.
    #[error("reading is paused until the application reads buffered body")]
    ReadPaused,
}
