//! Sending to a body sink without `futures-util` (for the integration
//! layer).

use super::BodyError;
use bytes::Bytes;
use futures_sink::Sink;
use std::future::poll_fn;
use std::pin::Pin;

/// Waits until `sink` takes a piece, then gives it `data`.
pub(crate) async fn send<S>(sink: &mut S, data: Bytes) -> Result<(), BodyError>
where
    S: Sink<Bytes, Error = BodyError> + Unpin,
{
    poll_fn(|cx| Pin::new(&mut *sink).poll_ready(cx)).await?;
    Pin::new(&mut *sink).start_send(data)
}

/// Waits until `sink` has handed its last piece to the connection.
pub(crate) async fn flush<S>(sink: &mut S) -> Result<(), BodyError>
where
    S: Sink<Bytes, Error = BodyError> + Unpin,
{
    poll_fn(|cx| Pin::new(&mut *sink).poll_flush(cx)).await
}

/// Flushes `sink` and ends its body (`end` on the wire).
pub(crate) async fn close<S>(sink: &mut S) -> Result<(), BodyError>
where
    S: Sink<Bytes, Error = BodyError> + Unpin,
{
    poll_fn(|cx| Pin::new(&mut *sink).poll_close(cx)).await
}
