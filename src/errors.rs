//! Errors and ends, layer by layer: what each call can return, and how
//! one failure looks from each layer. This page is documentation only; the
//! types live in their layers.
//!
//! # What each call returns
//!
//! | layer | call | on failure, or at its end | what the value says |
//! |---|---|---|---|
//! | `frame` | [`decode_text`](crate::frame::decode_text), [`decode_binary`](crate::frame::decode_binary), the encoders | [`FrameError`](crate::frame::FrameError) | a message that is malformed or over a limit; [`close_code`](crate::frame::FrameError::close_code) is the code to close with, if the layer above closes at all |
//! | `proto` | [`RelayConnection::open_stream`](crate::proto::RelayConnection::open_stream) | [`OpenError`](crate::proto::OpenError) | the request was refused before it went out; [`status`](crate::proto::OpenError::status) is the caller's answer |
//! | `proto` | `send_body`, `finish` | [`WriteError`](crate::proto::WriteError), [`FinishError`](crate::proto::FinishError) | the machine refused bytes or an end (over the Content-Length, a stream already over) |
//! | `proto` | the stream's last event | [`RelayEnd`](crate::proto::RelayEnd), [`WorkerEnd`](crate::proto::WorkerEnd) | how one stream ended, on each side |
//! | `proto` | `close_cause` | [`CloseCause`](crate::proto::CloseCause) | why the whole connection closed |
//! | `connect` | [`WorkerHandshake`](crate::connect::WorkerHandshake) (the worker's dial) | [`Verdict`](crate::connect::Verdict): `Retry` with a [`RetryReason`](crate::connect::RetryReason), or `Refused` with a [`Refused`](crate::connect::Refused) | whether to dial again after the backoff or to exit with status 1 |
//! | `connect` | [`decide_upgrade`](crate::connect::decide_upgrade) and its kin (the relay's side) | [`Rejected`](crate::connect::Rejected), [`ConnectRejected`](crate::connect::ConnectRejected) | the answer (400 or 401, [`status`](crate::connect::ConnectRejected::status)) instead of 101 |
//! | `rt` | a driver ([`RelayDriver`](crate::rt::RelayDriver), [`WorkerDriver`](crate::rt::WorkerDriver)) | `Result<`[`Closed`](crate::rt::Closed)`, `[`DriverError`](crate::rt::DriverError)`<E>>` | the connection's end: in good order (by the peer, end of stream, by this side) or not (the socket's error `E`, keepalive, 1009, a close that did not complete) |
//! | `rt` | a request's [`ResponseFuture`](crate::rt::ResponseFuture) (relay side) | [`RelayError`](crate::rt::RelayError) | the request failed before the worker's response head; [`status`](crate::rt::RelayError::status) is the caller's answer |
//! | `rt` | body streams and sinks, both sides | [`BodyError`](crate::rt::BodyError) | the body failed after the head |
//!
//! The integration crate beside this one, `worker-relay-hyper`, has a page
//! of the same name for its `ws`, `gateway` and `tunnel`.
//!
//! Every enum that may grow is `#[non_exhaustive]`, and the errors
//! implement `std::error::Error`. An error that wraps another keeps it:
//! `OpenError`'s head errors are its `source()`, and `RelayError::Open`
//! is its `OpenError`, shown as it is (its `source()` is the
//! `OpenError`'s).
//!
//! # One failure, seen from each layer (the relay's side)
//!
//! A stream's [`RelayEnd`](crate::proto::RelayEnd) becomes a
//! [`RelayError`](crate::rt::RelayError) if the response head has not
//! come yet, or a [`BodyError`](crate::rt::BodyError) if it has;
//! `worker-relay-hyper`'s gateway turns either into its answer and the access log's `end` (the
//! `reason` of `worker_relay_stream_ends_total`, `docs/operations.md`):
//!
//! | [`RelayEnd`](crate::proto::RelayEnd) | before the head: [`RelayError`](crate::rt::RelayError) → answer | after the head: [`BodyError`](crate::rt::BodyError) | `end` |
//! |---|---|---|---|
//! | `Completed` | — | — | `completed` |
//! | `WorkerAborted` | `WorkerAborted` → 502 | `Aborted` | `worker_abort` |
//! | `ProtocolError` | `ProtocolError` → 502 | `ProtocolError` | `protocol_error` |
//! | `ConnectionLost` | `WorkerGone` → 502 | `ConnectionLost` | `lost` |
//! | `Unsent` | `Unsent` → 503 (the worker never saw it; the gateway sends a request it can send again on the worker's next connection instead) | — | `lost` |
//! | `CallerStalled` | — | `Stalled` | `stall` |
//! | `OverflowExceeded` | — | `Overflow` | `overflow` |
//! | (the caller's body failed) | `RequestAborted` → 400 | `RequestAborted` | `caller_failed` |
//! | (refused at open) | `Open(`[`OpenError`](crate::proto::OpenError)`)` → its `status()` | — | `lost`; `answered` for what the gateway refuses before a stream (an unknown worker, one not connected, a refused method) |
//!
//! "The worker went away" is `RelayError::WorkerGone` before the head and
//! `BodyError::ConnectionLost` after it; the connection's own end is the
//! driver's `Closed` or `DriverError`.
//!
//! # The worker's side
//!
//! | [`WorkerEnd`](crate::proto::WorkerEnd) | the request body reads | the response sink refuses with |
//! |---|---|---|
//! | `Completed` | — | — |
//! | `ClientAborted`, `ConnectionLost` | [`BodyError::ClientGone`](crate::rt::BodyError::ClientGone) | `ClientGone` |
//! | `ProtocolError` (a body off its Content-Length) | `ProtocolError` | `ProtocolError` |
//! | `Failed` (the app failed after its head: `abort` sent) | — | — |
