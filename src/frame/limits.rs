//! The protocol's fixed size limits.

/// Largest body a single chunk may carry: 1 MiB (1,048,576 bytes).
pub const MAX_CHUNK_BODY: usize = 1024 * 1024;

/// Length of the stream-id prefix of a body chunk.
pub const CHUNK_HEADER_LEN: usize = 4;

/// Largest WebSocket message either side accepts: 1 MiB plus the 4-byte id.
///
/// A larger message (text or binary) is refused by closing the connection with
/// close code 1009 ([`CloseCode::MESSAGE_TOO_BIG`](super::CloseCode::MESSAGE_TOO_BIG)).
pub const MAX_MESSAGE_LEN: usize = MAX_CHUNK_BODY + CHUNK_HEADER_LEN;

/// The WebSocket subprotocol this version of the protocol is spoken under.
pub const SUBPROTOCOL: &str = "strata-worker-connect.v1";
