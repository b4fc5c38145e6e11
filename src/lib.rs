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
pub mod frame;
pub mod proto;

pub use bytes::Bytes;
