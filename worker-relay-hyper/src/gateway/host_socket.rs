//! A WebSocket that a host's library hands over as two halves (a stream of
//! its messages, a sink for them), joined into the one socket
//! [`Admission::serve`](super::Admission::serve) drives.

use super::BoxError;
use futures_core::Stream;
use futures_sink::Sink;
use std::pin::Pin;
use std::task::{Context, Poll};
use worker_relay::frame::Message;

/// A WebSocket as a stream of [`Message`]s and a sink for them, each with
/// an error of its own (both reported as a [`BoxError`]): what a host's
/// library gives once its messages are mapped to the crate's (actix-ws's
/// `MessageStream` and `Session`, say). Neither half needs to be `Send`
/// or `Unpin`: both are boxed here.
pub struct HostSocket<St, Si> {
    incoming: Pin<Box<St>>,
    outgoing: Pin<Box<Si>>,
}

impl<St, Si> HostSocket<St, Si> {
    /// Joins the halves of one WebSocket.
    pub fn new(incoming: St, outgoing: Si) -> HostSocket<St, Si> {
        HostSocket {
            incoming: Box::pin(incoming),
            outgoing: Box::pin(outgoing),
        }
    }
}

impl<St, Si> std::fmt::Debug for HostSocket<St, Si> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostSocket")
    }
}

impl<St, Si, E> Stream for HostSocket<St, Si>
where
    St: Stream<Item = Result<Message, E>>,
    E: Into<BoxError>,
{
    type Item = Result<Message, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.incoming
            .as_mut()
            .poll_next(cx)
            .map(|m| m.map(|m| m.map_err(Into::into)))
    }
}

impl<St, Si> Sink<Message> for HostSocket<St, Si>
where
    Si: Sink<Message>,
    Si::Error: Into<BoxError>,
{
    type Error = BoxError;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.outgoing.as_mut().poll_ready(cx).map_err(Into::into)
    }

    fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), BoxError> {
        self.outgoing.as_mut().start_send(item).map_err(Into::into)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.outgoing.as_mut().poll_flush(cx).map_err(Into::into)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.outgoing.as_mut().poll_close(cx).map_err(Into::into)
    }
}
