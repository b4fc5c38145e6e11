//! The relay machine's configuration, events and stream ends.

use super::KeepaliveConfig;
use super::StreamKey;
use crate::frame::{HeadLimits, ResponseHead, MAX_CHUNK_BODY};
use std::time::Duration;

/// Bounds of a [`RelayConnection`](super::RelayConnection). Every queue is finite.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Requests in flight at once on this connection (streams held, counting
    /// those whose response body is not read yet). Default 1024.
    pub max_streams: usize,
    /// Of `max_streams`, how many only the protocol's control routes may
    /// use (`GET /health` and `POST /v1/executions/{id}/cancel`, see
    /// [`is_control_route`](super::is_control_route)), so a burst of long
    /// dispatches cannot lock out a cancel or a health check. Other requests
    /// are refused past `max_streams - reserved_streams` (never less than 1).
    /// Default 16.
    pub reserved_streams: usize,
    /// Request body bytes queued per stream before its sink is not ready.
    /// Default 2 MiB.
    pub max_queued_per_stream: usize,
    /// Request body bytes queued over all streams. Default 8 MiB.
    pub max_queued: usize,
    /// Unread response chunks held in memory per stream. Without
    /// [`overflow`](Self::overflow), reading pauses when a stream holds this
    /// many (for at most [`read_pause_timeout`](Self::read_pause_timeout));
    /// with it, the stream's further chunks go to the overflow. Default 16.
    pub max_unread_chunks: usize,
    /// Unread response bytes held in memory over all streams (and chunks
    /// waiting for the overflow store) before reading pauses. Default 64 MiB.
    pub max_unread_bytes: usize,
    /// Largest body chunk emitted. Default and maximum 1 MiB.
    pub chunk_size: usize,
    /// Pings and the pong deadline (spec: every 20 s, dead after 20 s without
    /// a pong, here also without any progress of our output). Armed by the
    /// first `handle_timeout(now)`. Default: on, with the spec's values, so a
    /// frozen worker fails its callers within 40 s.
    pub keepalive: Option<KeepaliveConfig>,
    /// Bounds on every request head opened and every response head read.
    /// A request over them is refused by `open_stream`
    /// ([`StreamError::HeadOverLimit`](super::StreamError::HeadOverLimit):
    /// 431, 414 or 400); a response over them fails its stream
    /// ([`RelayEnd::ProtocolError`]: 502).
    pub head_limits: HeadLimits,
    /// Methods `open_stream` refuses
    /// ([`StreamError::MethodNotAllowed`](super::StreamError::MethodNotAllowed):
    /// 405), compared case-insensitively. Default `CONNECT` (a tunnel the
    /// protocol cannot carry) and `TRACE` (it would echo the caller's
    /// credentials back through the worker).
    pub refused_methods: Vec<String>,
    /// Where a response goes that its caller reads more slowly than the
    /// worker sends it: `None` (the default for the bare machine) holds it in
    /// memory only, and pauses reading for it; `Some` sends it to an overflow
    /// store the application provides (`poll_spill`, `refill`), as nginx
    /// buffers to temporary files, so the worker's other streams never wait.
    pub overflow: Option<OverflowConfig>,
    /// The longest the application may read nothing of a stream whose
    /// response data waits for it (nor send any of its request body), before
    /// that stream is given up
    /// ([`RelayEnd::CallerStalled`]: the caller's response ends failed, the
    /// worker gets `abort`, memory and overflow are freed). Also how long a
    /// response the application let go of may wait for the worker's `end`.
    /// Default 60 s (nginx's `send_timeout`).
    pub stall_timeout: Duration,
    /// The longest reading may stay paused because responses are not read:
    /// then the streams holding it are given up ([`RelayEnd::CallerStalled`]).
    /// Default 10 s: well inside a 20 s / 20 s keepalive, so a worker whose
    /// pings wait unread behind a slow caller's data never gives up on us.
    pub read_pause_timeout: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            max_streams: 1024,
            reserved_streams: 16,
            max_queued_per_stream: 2 << 20,
            max_queued: 8 << 20,
            max_unread_chunks: 16,
            max_unread_bytes: 64 << 20,
            chunk_size: MAX_CHUNK_BODY,
            keepalive: Some(KeepaliveConfig::default()),
            head_limits: HeadLimits::default(),
            refused_methods: vec!["CONNECT".into(), "TRACE".into()],
            overflow: None,
            stall_timeout: Duration::from_secs(60),
            read_pause_timeout: Duration::from_secs(10),
        }
    }
}

impl RelayConfig {
    /// Whether `open_stream` refuses `method` (see
    /// [`refused_methods`](Self::refused_methods)); a relay can ask before
    /// it maps the request (a `CONNECT` has no path to map).
    pub fn refuses_method(&self, method: &str) -> bool {
        self.refused_methods
            .iter()
            .any(|m| m.eq_ignore_ascii_case(method))
    }
}

/// Bounds of the overflow store, in the spirit of nginx's
/// `proxy_max_temp_file_size` (1 GiB per response by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OverflowConfig {
    /// A stream's unread bytes held in memory before its further chunks go
    /// to the overflow. Default 1 MiB.
    pub memory_per_stream: usize,
    /// A stream's bytes in the overflow; past it the stream is given up
    /// ([`RelayEnd::OverflowExceeded`]). Default 1 GiB.
    pub max_per_stream: u64,
    /// All streams' bytes in the overflow; past it the stream whose chunk
    /// would cross it is given up. Default 4 GiB.
    pub max_total: u64,
}

impl Default for OverflowConfig {
    fn default() -> OverflowConfig {
        OverflowConfig {
            memory_per_stream: 1 << 20,
            max_per_stream: 1 << 30,
            max_total: 4 << 30,
        }
    }
}

/// How a relay stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayEnd {
    /// The worker's response is complete (`end` received); read the rest of its body.
    Completed,
    /// The worker sent `abort`.
    WorkerAborted,
    /// The worker broke the protocol on this stream: body or `end` before a
    /// response, a second response, a response head that is malformed, over
    /// the [`HeadLimits`], not a final status in 200..=599 (1xx, 101
    /// included: the protocol has no interim responses) or with an invalid or
    /// conflicting Content-Length, or a body longer or shorter than its
    /// Content-Length. The relay sent `abort` unless the worker had ended
    /// the stream itself. Answer 502 before the response started, end the
    /// caller's response as failed after.
    ProtocolError,
    /// The connection closed or was lost.
    ConnectionLost,
    /// The application read nothing of the waiting response for
    /// [`stall_timeout`](RelayConfig::stall_timeout), or kept reading paused
    /// past [`read_pause_timeout`](RelayConfig::read_pause_timeout): the
    /// relay sent `abort` and dropped what was buffered.
    CallerStalled,
    /// The response outgrew the overflow's bounds: the relay sent `abort`
    /// and dropped what was buffered.
    OverflowExceeded,
}

impl RelayEnd {
    /// Whether the caller's request failed (every end but `Completed`).
    pub fn is_failure(self) -> bool {
        self != RelayEnd::Completed
    }

    /// Whether the relay dropped the buffered response (its caller did not
    /// keep up): nothing more is read, the stream is simply gone.
    pub fn drops_body(self) -> bool {
        matches!(self, RelayEnd::CallerStalled | RelayEnd::OverflowExceeded)
    }
}

/// What a [`RelayConnection`](super::RelayConnection) tells the application.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayEvent {
    /// The worker's response head.
    Response {
        /// The stream.
        key: StreamKey,
        /// The head.
        head: ResponseHead,
    },
    /// The response body has data, or its end, to read.
    Readable {
        /// The stream.
        key: StreamKey,
    },
    /// The request body sink may take bytes again.
    Writable {
        /// The stream.
        key: StreamKey,
    },
    /// The stream's next bytes are in the overflow store: read up to `max`
    /// of them (in the order `poll_spill` gave them) and pass them to
    /// [`refill`](super::RelayConnection::refill).
    Refill {
        /// The stream.
        key: StreamKey,
        /// The most to hand back at once.
        max: usize,
    },
    /// The stream ended on the wire; exactly once per stream not aborted by
    /// the application. Answer 502 if `!response_started && reason.is_failure()`;
    /// end the caller's response as failed if it started and failed.
    Ended {
        /// The stream.
        key: StreamKey,
        /// Why.
        reason: RelayEnd,
        /// Whether the response head had arrived.
        response_started: bool,
    },
}

impl RelayEvent {
    /// The stream the event is about.
    pub fn key(&self) -> StreamKey {
        match self {
            RelayEvent::Response { key, .. }
            | RelayEvent::Readable { key }
            | RelayEvent::Writable { key }
            | RelayEvent::Refill { key, .. }
            | RelayEvent::Ended { key, .. } => *key,
        }
    }
}
