//! The relay machine's configuration, events and stream ends.

use super::StreamKey;
use crate::frame::ResponseHead;
use crate::proto::config::{at_least_one, positive, Config, ConfigBuilder, ConfigError};
use crate::proto::side::Relay;
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
pub type RelayConfig = Config<Relay>;

/// Builds a [`RelayConfig`]: each setter is documented on the getter of
/// the same name.
pub type RelayConfigBuilder = ConfigBuilder<Relay>;

/// The settings only a relay has.
#[derive(Debug, Clone, Default)]
pub struct RelayExtra {
    pub(crate) refused_methods: RefusedMethods,
    pub(crate) overflow: Option<OverflowConfig>,
    pub(crate) stall_timeout: StallTimeout,
    pub(crate) read_pause_timeout: ReadPauseTimeout,
}

/// `CONNECT` and `TRACE` by default.
#[derive(Debug, Clone)]
pub(crate) struct RefusedMethods(pub Vec<String>);

impl Default for RefusedMethods {
    fn default() -> Self {
        RefusedMethods(vec!["CONNECT".into(), "TRACE".into()])
    }
}

/// 60 s by default.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StallTimeout(pub Duration);

impl Default for StallTimeout {
    fn default() -> Self {
        StallTimeout(Duration::from_secs(60))
    }
}

/// 10 s by default.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadPauseTimeout(pub Duration);

impl Default for ReadPauseTimeout {
    fn default() -> Self {
        ReadPauseTimeout(Duration::from_secs(10))
    }
}

impl Config<Relay> {
    /// Where a response goes that its caller reads more slowly than the
    /// worker sends it: `None` (the default for the bare machine) holds
    /// it in memory only, and pauses reading for it; `Some` sends it to
    /// an overflow store the application provides (`poll_spill`,
    /// `refill`), as nginx buffers to temporary files, so the worker's
    /// other streams never wait.
    pub fn overflow(&self) -> Option<OverflowConfig> {
        self.extra.overflow
    }

    /// The longest the application may read nothing of a stream whose
    /// response data waits for it (nor send any of its request body),
    /// before that stream is given up ([`RelayEnd::CallerStalled`]: the
    /// caller's response ends failed, the worker gets `abort`, memory and
    /// overflow are freed). Also how long a response the application let go
    /// of may wait for the worker's `end`. Default 60 s (nginx's
    /// `send_timeout`).
    pub fn stall_timeout(&self) -> Duration {
        self.extra.stall_timeout.0
    }

    /// The longest reading may stay paused because responses are not read:
    /// then the streams holding it are given up ([`RelayEnd::CallerStalled`]).
    /// Default 10 s: well inside a 20 s / 20 s keepalive, so a worker whose
    /// pings wait unread behind a slow caller's data never gives up on us.
    pub fn read_pause_timeout(&self) -> Duration {
        self.extra.read_pause_timeout.0
    }

    /// Methods `open_stream` refuses
    /// ([`OpenError::MethodNotAllowed`](super::OpenError::MethodNotAllowed):
    /// 405), compared case-insensitively. Default `CONNECT` (a tunnel the
    /// protocol cannot carry) and `TRACE` (it would echo the caller's
    /// credentials back through the worker).
    pub fn refused_methods(&self) -> &[String] {
        &self.extra.refused_methods.0
    }

    /// Whether `open_stream` refuses `method` (see
    /// [`refused_methods`](Self::refused_methods)); a relay can ask before
    /// it maps the request (a `CONNECT` has no path to map).
    pub fn refuses_method(&self, method: &str) -> bool {
        self.extra
            .refused_methods
            .0
            .iter()
            .any(|m| m.eq_ignore_ascii_case(method))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.common.validate()?;
        positive("stall_timeout", self.extra.stall_timeout.0)?;
        positive("read_pause_timeout", self.extra.read_pause_timeout.0)?;
        if let Some(ov) = &self.extra.overflow {
            at_least_one("overflow.memory_per_stream", ov.memory_per_stream as u64)?;
            at_least_one("overflow.max_per_stream", ov.max_per_stream)?;
            at_least_one("overflow.max_total", ov.max_total)?;
            if ov.spill_after >= self.extra.read_pause_timeout.0 {
                return Err(ConfigError::new(
                    "overflow.spill_after",
                    "must be shorter than read_pause_timeout",
                ));
            }
            if ov.spill_after_alone >= self.extra.read_pause_timeout.0 {
                return Err(ConfigError::new(
                    "overflow.spill_after_alone",
                    "must be shorter than read_pause_timeout",
                ));
            }
        }
        Ok(())
    }
}

impl ConfigBuilder<Relay> {
    /// Where a response goes that its caller reads more slowly than the
    /// worker sends it: `None` (the default for the bare machine) holds
    /// it in memory only, and pauses reading for it; `Some` sends it to
    /// an overflow store the application provides (`poll_spill`,
    /// `refill`), as nginx buffers to temporary files, so the worker's
    /// other streams never wait.
    pub fn overflow(mut self, value: Option<OverflowConfig>) -> Self {
        self.0.extra.overflow = value;
        self
    }

    /// See [`RelayConfig::refused_methods`].
    pub fn refused_methods<I, S>(mut self, methods: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.0.extra.refused_methods =
            RefusedMethods(methods.into_iter().map(Into::into).collect());
        self
    }

    /// See [`RelayConfig::stall_timeout`]; longer than zero.
    pub fn stall_timeout(mut self, value: Duration) -> Self {
        self.0.extra.stall_timeout = StallTimeout(value);
        self
    }

    /// See [`RelayConfig::read_pause_timeout`]; longer than zero.
    pub fn read_pause_timeout(mut self, value: Duration) -> Self {
        self.0.extra.read_pause_timeout = ReadPauseTimeout(value);
        self
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
    /// How long a stream past its memory bound, with nothing in the
    /// overflow yet, may hold reading paused for its caller to read all it
    /// holds before its chunks go to the overflow. Default zero: they go at
    /// once.
    ///
    /// A caller that reads as fast as the worker sends, but not at the
    /// very instant a chunk arrives (its task is waiting for a thread), is
    /// then not sent through the overflow store, whose file costs two more
    /// copies of every byte: over 8 s of 1 GiB downloads through the
    /// integration crate's `gateway::Gateway` (worker-relay-hyper), 1,601–2,224 temporary
    /// files were opened with the overflow at once, none with a wait of
    /// 1 ms (BENCHMARKS.md, issue 28).
    ///
    /// The price is the other streams': while one stream waits, reading
    /// pauses, for at most this long each time. Only a caller that reads
    /// at least `memory_per_stream` per `spill_after` (256 MB/s in a
    /// `Gateway`) can keep reading paused wait after wait; the others then
    /// share the connection at that pace. A stream that waited in vain
    /// spills without waiting until a chunk fits in its memory again. The
    /// chunk in hand during a wait is held in memory past the bound (one
    /// chunk per stream that waited, until its caller reads it), and only
    /// while that keeps within `max_unread_chunks` and `max_unread_bytes`.
    /// Shorter than `read_pause_timeout`.
    pub spill_after: Duration,
    /// The wait of a stream alone on its connection (no other stream in
    /// flight), if longer than `spill_after`. Default zero: the same wait.
    ///
    /// Reading paused for a lone stream holds up no other stream: what the
    /// worker sends next can only be more of this body (or control
    /// messages). A caller that reads fast but not at every instant (its
    /// task shares a thread with the connection's) then keeps its response
    /// out of the overflow store. A stream that opens meanwhile ends the
    /// wait at once if it has lasted `spill_after` already. Shorter than
    /// `read_pause_timeout`.
    pub spill_after_alone: Duration,
}

impl Default for OverflowConfig {
    fn default() -> OverflowConfig {
        OverflowConfig {
            memory_per_stream: 1 << 20,
            max_per_stream: 1 << 30,
            max_total: 4 << 30,
            spill_after: Duration::ZERO,
            spill_after_alone: Duration::ZERO,
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
    /// the [`HeadLimits`](crate::frame::HeadLimits), not a final status in 200..=599 (1xx, 101
    /// included: the protocol has no interim responses) or with an invalid or
    /// conflicting Content-Length, or a body longer or shorter than its
    /// Content-Length. The relay sent `abort` unless the worker had ended
    /// the stream itself. Answer 502 before the response started, end the
    /// caller's response as failed after.
    ProtocolError,
    /// The connection closed or was lost.
    ConnectionLost,
    /// The connection closed or was lost before the stream's `request`
    /// frame went out: the worker never saw the request, which may be sent
    /// again on another connection (if its body can be had again).
    Unsent,
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
    use crate::frame::{HeadLimits, MAX_CHUNK_BODY};

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
