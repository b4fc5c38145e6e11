//! A crate-owned WebSocket message type that any WebSocket library maps onto.

use bytes::Bytes;

/// A WebSocket close status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CloseCode(pub u16);

/// The code of a WebSocket library's own close type, as `tungstenite`'s and
/// actix-ws's convert to and from `u16`.
impl From<u16> for CloseCode {
    fn from(code: u16) -> CloseCode {
        CloseCode(code)
    }
}

impl CloseCode {
    /// 1000: normal closure.
    pub const NORMAL: CloseCode = CloseCode(1000);
    /// 1001: the endpoint is going away.
    pub const GOING_AWAY: CloseCode = CloseCode(1001);
    /// 1002: protocol error.
    pub const PROTOCOL_ERROR: CloseCode = CloseCode(1002);
    /// 1007: invalid payload data (for example a text frame that is not JSON).
    pub const INVALID_PAYLOAD: CloseCode = CloseCode(1007);
    /// 1008: policy violation.
    pub const POLICY_VIOLATION: CloseCode = CloseCode(1008);
    /// 1009: message too big.
    pub const MESSAGE_TOO_BIG: CloseCode = CloseCode(1009);
    /// 1011: internal error.
    pub const INTERNAL_ERROR: CloseCode = CloseCode(1011);
    /// 1012: service restart (the peer may reconnect at once).
    pub const SERVICE_RESTART: CloseCode = CloseCode(1012);
    /// 1013: try again later.
    pub const TRY_AGAIN_LATER: CloseCode = CloseCode(1013);
    /// 4000 (the range 4000–4999 is for private use; this crate's code):
    /// the relay replaced the connection by a newer one of the same worker,
    /// with the reason [`REPLACED`](crate::connect::REPLACED). A worker that
    /// gets it knows another process holds its token now (this crate's
    /// tunnel waits its longest backoff). Earlier versions of this crate
    /// sent 1008 with that reason, which the tunnel still honours for one
    /// release.
    pub const REPLACED: CloseCode = CloseCode(4000);
}

impl From<CloseCode> for u16 {
    fn from(c: CloseCode) -> u16 {
        c.0
    }
}

/// The payload of a WebSocket close message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseFrame {
    /// The close status code.
    pub code: CloseCode,
    /// A short human-readable reason (at most 123 bytes on the wire).
    pub reason: String,
}

/// One WebSocket message, as the sans-IO core consumes and produces it.
///
/// Map your WebSocket library's message type onto this one (for
/// tokio-tungstenite: `Text`, `Binary`, `Ping`, `Pong` and `Close` map one to
/// one; raw `Frame`s never reach an application).
///
/// Exhaustive on purpose: RFC 6455 has exactly these five kinds of
/// message, so a `match` on them needs no wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message: a JSON control frame.
    Text(String),
    /// A binary message: a body chunk (4-byte stream id, then body bytes).
    Binary(Bytes),
    /// A ping with its application data. Its answer is the WebSocket
    /// library's (tungstenite answers before the application sees the
    /// ping), or the machine's when its configuration's `answer_pings` is
    /// on, for a library that leaves it to the application (actix-ws); the
    /// `rt` module's docs say which to choose. A ping left unanswered makes
    /// the peer's keepalive drop the connection.
    Ping(Bytes),
    /// A pong with its application data.
    Pong(Bytes),
    /// A close message; `None` carries no status code.
    Close(Option<CloseFrame>),
}

impl Message {
    /// The payload length in bytes (0 for a close without a frame).
    pub fn len(&self) -> usize {
        match self {
            Message::Text(s) => s.len(),
            Message::Binary(b) | Message::Ping(b) | Message::Pong(b) => b.len(),
            Message::Close(c) => c.as_ref().map_or(0, |c| 2 + c.reason.len()),
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this message carries a protocol frame (text or binary).
    pub fn is_data(&self) -> bool {
        matches!(self, Message::Text(_) | Message::Binary(_))
    }
}
