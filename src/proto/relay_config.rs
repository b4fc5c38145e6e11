//! The relay machine's configuration, events and stream ends.

use super::config::{at_least_one, config_builder, positive, ConfigError};
use super::KeepaliveConfig;
use super::StreamKey;
use crate::frame::{HeadLimits, ResponseHead, MAX_CHUNK_BODY};
use std::time::Duration;

/// Bounds of a [`RelayConnection`](super::RelayConnection). Every queue is
/// finite. Built with [`RelayConfig::builder`], which refuses nonsense
/// (a zero bound, a reserve as large as `max_streams`, a chunk size over
/// 1 MiB, …) with a [`ConfigError`]; read back with the getters.
///
/// ```
/// use std::time::Duration;
/// use worker_relay::proto::{OverflowConfig, RelayConfig};
///
/// let config = RelayConfig::builder()
///     .max_streams(64)
///     .overflow(Some(OverflowConfig::default()))
///     .stall_timeout(Duration::from_secs(30))
///     .build()?;
/// assert_eq!(config.max_streams(), 64);
/// assert!(RelayConfig::builder().max_streams(0).build().is_err());
/// # Ok::<(), worker_relay::proto::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub(crate) max_streams: usize,
    pub(crate) reserved_streams: usize,
    pub(crate) max_queued_per_stream: usize,
    pub(crate) max_queued: usize,
    pub(crate) max_unread_chunks: usize,
    pub(crate) max_unread_bytes: usize,
    pub(crate) chunk_size: usize,
    pub(crate) keepalive: Option<KeepaliveConfig>,
    pub(crate) head_limits: HeadLimits,
    pub(crate) refused_methods: Vec<String>,
    pub(crate) overflow: Option<OverflowConfig>,
    pub(crate) stall_timeout: Duration,
    pub(crate) read_pause_timeout: Duration,
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

config_builder! {
    /// Builds a [`RelayConfig`]: each setter is documented on the getter of
    /// the same name.
    RelayConfigBuilder for RelayConfig {
        /// Requests in flight at once on this connection (streams held,
        /// counting those whose response body is not read yet). Default 1024.
        max_streams: usize,
        /// Of `max_streams`, how many only the protocol's control routes may
        /// use (`GET /health` and `POST /v1/executions/{id}/cancel`, see
        /// [`is_control_route`](super::is_control_route)), so a burst of long
        /// dispatches cannot lock out a cancel or a health check. Other
        /// requests are refused past `max_streams - reserved_streams`.
        /// Default 16; must be below `max_streams`.
        reserved_streams: usize,
        /// Request body bytes queued per stream before its sink is not ready.
        /// Default 2 MiB; at most `max_queued`.
        max_queued_per_stream: usize,
        /// Request body bytes queued over all streams. Default 8 MiB.
        max_queued: usize,
        /// Unread response chunks held in memory per stream. Without
        /// [`overflow`](RelayConfig::overflow), reading pauses when a stream
        /// holds this many (for at most
        /// [`read_pause_timeout`](RelayConfig::read_pause_timeout)); with it,
        /// the stream's further chunks go to the overflow. Default 16.
        max_unread_chunks: usize,
        /// Unread response bytes held in memory over all streams (and chunks
        /// waiting for the overflow store) before reading pauses. Default 64 MiB.
        max_unread_bytes: usize,
        /// Largest body chunk emitted. Default and maximum 1 MiB.
        chunk_size: usize,
        /// Pings and the pong deadline (spec: every 20 s, dead after 20 s
        /// without a pong, here also without any progress of our output).
        /// Armed by the first `handle_timeout(now)`. Default: on, with the
        /// spec's values, so a frozen worker fails its callers within 40 s.
        keepalive: Option<KeepaliveConfig>,
        /// Bounds on every request head opened and every response head read.
        /// A request over them is refused by `open_stream`
        /// ([`OpenError::HeadOverLimit`](super::OpenError::HeadOverLimit):
        /// 431, 414 or 400); a response over them fails its stream
        /// ([`RelayEnd::ProtocolError`]: 502). Every bound must be at least 1.
        head_limits: HeadLimits,
        /// Where a response goes that its caller reads more slowly than the
        /// worker sends it: `None` (the default for the bare machine) holds
        /// it in memory only, and pauses reading for it; `Some` sends it to
        /// an overflow store the application provides (`poll_spill`,
        /// `refill`), as nginx buffers to temporary files, so the worker's
        /// other streams never wait.
        overflow: Option<OverflowConfig>,
        /// The longest the application may read nothing of a stream whose
        /// response data waits for it (nor send any of its request body),
        /// before that stream is given up ([`RelayEnd::CallerStalled`]: the
        /// caller's response ends failed, the worker gets `abort`, memory and
        /// overflow are freed). Also how long a response the application let
        /// go of may wait for the worker's `end`. Default 60 s (nginx's
        /// `send_timeout`).
        stall_timeout: Duration,
        /// The longest reading may stay paused because responses are not
        /// read: then the streams holding it are given up
        /// ([`RelayEnd::CallerStalled`]). Default 10 s: well inside a
        /// 20 s / 20 s keepalive, so a worker whose pings wait unread behind
        /// a slow caller's data never gives up on us.
        read_pause_timeout: Duration,
    }
}

impl RelayConfig {
    /// Methods `open_stream` refuses
    /// ([`OpenError::MethodNotAllowed`](super::OpenError::MethodNotAllowed):
    /// 405), compared case-insensitively. Default `CONNECT` (a tunnel the
    /// protocol cannot carry) and `TRACE` (it would echo the caller's
    /// credentials back through the worker).
    pub fn refused_methods(&self) -> &[String] {
        &self.refused_methods
    }

    /// Whether `open_stream` refuses `method` (see
    /// [`refused_methods`](Self::refused_methods)); a relay can ask before
    /// it maps the request (a `CONNECT` has no path to map).
    pub fn refuses_method(&self, method: &str) -> bool {
        self.refused_methods
            .iter()
            .any(|m| m.eq_ignore_ascii_case(method))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let c = self;
        at_least_one("max_streams", c.max_streams as u64)?;
        if c.reserved_streams >= c.max_streams {
            return Err(ConfigError::new(
                "reserved_streams",
                "(16 by default) must be below max_streams: set both",
            ));
        }
        validate_queues(c.max_queued_per_stream, c.max_queued, c.chunk_size)?;
        at_least_one("max_unread_chunks", c.max_unread_chunks as u64)?;
        at_least_one("max_unread_bytes", c.max_unread_bytes as u64)?;
        validate_head_limits(&c.head_limits)?;
        if let Some(ov) = &c.overflow {
            at_least_one("overflow.memory_per_stream", ov.memory_per_stream as u64)?;
            at_least_one("overflow.max_per_stream", ov.max_per_stream)?;
            at_least_one("overflow.max_total", ov.max_total)?;
        }
        positive("stall_timeout", c.stall_timeout)?;
        positive("read_pause_timeout", c.read_pause_timeout)
    }
}

impl RelayConfigBuilder {
    /// See [`RelayConfig::refused_methods`].
    pub fn refused_methods<I, S>(mut self, methods: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.0.refused_methods = methods.into_iter().map(Into::into).collect();
        self
    }
}

/// The send queues' bounds and the chunk size, as both sides have them.
pub(crate) fn validate_queues(
    per_stream: usize,
    total: usize,
    chunk_size: usize,
) -> Result<(), ConfigError> {
    at_least_one("max_queued_per_stream", per_stream as u64)?;
    if per_stream > total {
        return Err(ConfigError::new(
            "max_queued_per_stream",
            "must not exceed max_queued",
        ));
    }
    if !(1..=MAX_CHUNK_BODY).contains(&chunk_size) {
        return Err(ConfigError::new("chunk_size", "must be in 1..=1 MiB"));
    }
    Ok(())
}

/// Every head bound must be at least 1.
pub(crate) fn validate_head_limits(l: &HeadLimits) -> Result<(), ConfigError> {
    at_least_one("head_limits.max_headers", l.max_headers as u64)?;
    at_least_one("head_limits.max_head_bytes", l.max_head_bytes as u64)?;
    at_least_one("head_limits.max_target_len", l.max_target_len as u64)?;
    at_least_one("head_limits.max_method_len", l.max_method_len as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_refuses_nonsense_by_name() {
        let refused = |b: RelayConfigBuilder| b.build().unwrap_err().field;
        let b = RelayConfig::builder;
        assert_eq!(refused(b().max_streams(0)), "max_streams");
        assert_eq!(refused(b().max_streams(16)), "reserved_streams");
        assert_eq!(
            refused(b().max_queued_per_stream(0)),
            "max_queued_per_stream"
        );
        assert_eq!(
            refused(b().max_queued_per_stream(9 << 20)),
            "max_queued_per_stream"
        );
        assert_eq!(refused(b().chunk_size(0)), "chunk_size");
        assert_eq!(refused(b().chunk_size(MAX_CHUNK_BODY + 1)), "chunk_size");
        assert_eq!(refused(b().max_unread_chunks(0)), "max_unread_chunks");
        assert_eq!(refused(b().max_unread_bytes(0)), "max_unread_bytes");
        let l = HeadLimits {
            max_headers: 0,
            ..HeadLimits::default()
        };
        assert_eq!(refused(b().head_limits(l)), "head_limits.max_headers");
        let ov = OverflowConfig {
            max_total: 0,
            ..OverflowConfig::default()
        };
        assert_eq!(refused(b().overflow(Some(ov))), "overflow.max_total");
        assert_eq!(refused(b().stall_timeout(Duration::ZERO)), "stall_timeout");
        assert_eq!(
            refused(b().read_pause_timeout(Duration::ZERO)),
            "read_pause_timeout"
        );
        // What is accepted reads back; the rest stays at its default.
        let c = b()
            .max_streams(8)
            .reserved_streams(2)
            .refused_methods(["CONNECT"])
            .build()
            .unwrap();
        assert_eq!((c.max_streams(), c.reserved_streams()), (8, 2));
        assert!(!c.refuses_method("TRACE"));
        assert_eq!(c.max_unread_chunks(), 16);
        let again = c.to_builder().max_streams(9).build().unwrap();
        assert_eq!((again.max_streams(), again.reserved_streams()), (9, 2));
        let e = b().max_streams(0).build().unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid configuration: `max_streams` must be at least 1"
        );
    }
}
