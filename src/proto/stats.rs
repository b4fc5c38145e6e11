//! Counters a connection keeps for the application.

/// Counters of one connection, read with `stats()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Streams opened since the connection started.
    pub streams_opened: u64,
    /// Streams open now.
    pub streams_open: u64,
    /// Streams that have ended.
    pub streams_closed: u64,
    /// Bytes of WebSocket data messages received (text and binary payloads).
    pub bytes_in: u64,
    /// Bytes of WebSocket data messages emitted.
    pub bytes_out: u64,
    /// Received body bytes the application has not read yet.
    pub body_buffered_in: u64,
    /// High-water mark of `body_buffered_in`.
    pub body_buffered_in_max: u64,
    /// Body bytes queued to send.
    pub body_queued_out: u64,
    /// High-water mark of `body_queued_out`.
    pub body_queued_out_max: u64,
    /// Messages ignored: malformed, unknown type, or for a stream not open.
    pub messages_ignored: u64,
    /// Streams ended because the peer broke the protocol on them (a bad
    /// head, a body longer or shorter than its Content-Length, frames out of
    /// order); each is also counted in `streams_closed`.
    pub protocol_errors: u64,
    /// (Relay) response bytes in the overflow store now, or on their way to
    /// it (see `RelayConfig::overflow`).
    pub overflow_bytes: u64,
}
