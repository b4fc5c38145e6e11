//! The wire format: one WebSocket message at a time, no connection state.
//!
//! - [`Message`]: the crate's WebSocket message type.
//! - [`ControlFrame`]: the JSON text frames `request`, `response`, `end`, `abort`.
//! - [`Chunk`]: binary body chunks (4-byte big-endian stream id + ≤ 1 MiB body).
//! - [`Headers`]: ordered header pairs, Latin-1 values, hop-by-hop filtering.
//! - [`FrameError`]: what went wrong, and [`FrameError::close_code`].
//!
//! [`decode`] turns any message into a [`Decoded`] value.
//!
//! Use this layer alone to write a peer in your own style, to inspect
//! traffic, or to test another implementation against the same rules:
//!
//! ```
//! use worker_relay::frame::{self, Chunk, ControlFrame, Decoded, Headers, RequestHead, StreamId};
//!
//! let id = StreamId::new(1).unwrap();
//! let head = RequestHead::new("POST", "/v1/run", "x=1", Headers::new())?;
//! let request = ControlFrame::Request { id, head }.to_message();
//! let body = Chunk { id, data: "print(1)".into() }.to_message();
//!
//! // What the worker sees:
//! let Some(Ok(Decoded::Control(ControlFrame::Request { head, .. }))) = frame::decode(&request) else {
//!     panic!("a request frame");
//! };
//! assert_eq!(head.target(), "/v1/run?x=1");
//! let Some(Ok(Decoded::Chunk(chunk))) = frame::decode(&body) else {
//!     panic!("a body chunk");
//! };
//! assert_eq!((chunk.id, &chunk.data[..]), (id, &b"print(1)"[..]));
//! # Ok::<(), worker_relay::frame::FrameError>(())
//! ```

mod chunk;
mod control;
mod error;
mod fast;
mod head_limits;
mod headers;
mod id;
mod json_out;
mod limits;
mod message;
mod raw;

pub use chunk::{encode_chunk, split_body, Chunk, SplitBody};
pub(crate) use control::decode_control_limited;
pub use control::{ControlFrame, RequestHead, ResponseHead};
pub use error::{FrameError, HeaderError, IdError};
pub use head_limits::{HeadLimitError, HeadLimits};
pub use headers::{check_header, is_hop_by_hop_name, is_token, Headers, HOP_BY_HOP};
#[cfg(feature = "http")]
pub(crate) use headers::{latin1_to_string, string_to_latin1};
pub use id::StreamId;
pub use limits::{CHUNK_HEADER_LEN, MAX_CHUNK_BODY, MAX_MESSAGE_LEN, SUBPROTOCOL};
pub use message::{CloseCode, CloseFrame, Message};

use bytes::Bytes;

/// What one data message decodes to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decoded {
    /// A control frame.
    Control(ControlFrame),
    /// A body chunk.
    Chunk(Chunk),
    /// A JSON object whose `type` this version does not know: both sides ignore it.
    Unknown,
}

/// Decodes a text message (a JSON control frame).
///
/// An object with an unknown `type` is [`Decoded::Unknown`], not an error.
pub fn decode_text(text: &str) -> Result<Decoded, FrameError> {
    Ok(match control::decode_control(text)? {
        Some(f) => Decoded::Control(f),
        None => Decoded::Unknown,
    })
}

/// [`decode_text`] with `request` and `response` heads held to `limits`:
/// a head over a bound is [`FrameError::HeadOverLimit`]. A header list that
/// crosses a bound is skipped from that point without being collected, so
/// a 1 MiB frame of tiny headers costs a scan rather than a parse. This is
/// what the state machines use for every text message they read.
pub fn decode_text_limited(text: &str, limits: &HeadLimits) -> Result<Decoded, FrameError> {
    Ok(
        match control::decode_control_limited(text, Some(limits), None).map_err(|r| r.error)? {
            Some(f) => Decoded::Control(f),
            None => Decoded::Unknown,
        },
    )
}

/// [`decode_text`] (`limits: None`) or [`decode_text_limited`] by the
/// reference path alone: every text through `serde`, without the fast
/// scanner the other decoders try first for plain frames. Slower, and the
/// same answer for every input: for differential tests (this crate's
/// property tests and fuzz target use it) and for measuring the scanner.
// Hidden, and not covered by semver: the oracle of tests/frame_props.rs,
// fuzz/harness and benches/codec.rs, which reach it from outside the crate.
#[doc(hidden)]
pub fn decode_text_reference(
    text: &str,
    limits: Option<&HeadLimits>,
) -> Result<Decoded, FrameError> {
    Ok(
        match control::decode_control_with(text, limits, None, false).map_err(|r| r.error)? {
            Some(f) => Decoded::Control(f),
            None => Decoded::Unknown,
        },
    )
}

/// Decodes a binary message (a body chunk), slicing it without copying.
pub fn decode_binary(msg: Bytes) -> Result<Decoded, FrameError> {
    Chunk::decode(msg).map(Decoded::Chunk)
}

/// Decodes a data message; `None` for ping, pong and close, which carry no frame.
pub fn decode(msg: &Message) -> Option<Result<Decoded, FrameError>> {
    match msg {
        Message::Text(t) => Some(decode_text(t)),
        Message::Binary(b) => Some(decode_binary(b.clone())),
        _ => None,
    }
}

impl Decoded {
    /// Encodes the frame back to a message (`None` for [`Decoded::Unknown`]).
    pub fn to_message(&self) -> Option<Message> {
        match self {
            Decoded::Control(c) => Some(c.to_message()),
            Decoded::Chunk(c) => Some(c.to_message()),
            Decoded::Unknown => None,
        }
    }
}
