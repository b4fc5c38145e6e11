//! tokio-tungstenite ⇄ worker-relay glue: the WebSocket as a `Stream` + `Sink`
//! of the crate's `Message`, and a tokio `Timer`.
#![allow(dead_code)] // shared by several examples and tests, each using a part

use futures_util::{Sink, Stream};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio_tungstenite::tungstenite::{self, protocol::WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use worker_relay::frame::{CloseCode, CloseFrame, Message};
use worker_relay::rt::{Sleep, Timer};

/// The largest message tungstenite will buffer. Messages between the
/// protocol's limit (1 MiB + 4) and this one reach the state machine, which
/// closes with 1009; larger ones fail the socket.
pub const WS_MAX_MESSAGE: usize = 16 << 20;

/// tungstenite's settings for both sides.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(WS_MAX_MESSAGE))
        .max_frame_size(Some(WS_MAX_MESSAGE))
}

/// A tokio-tungstenite WebSocket seen as the crate's messages.
pub struct WsSocket<S>(pub WebSocketStream<S>);

fn to_tung(m: Message) -> tungstenite::Message {
    match m {
        Message::Text(t) => tungstenite::Message::Text(t.into()),
        Message::Binary(b) => tungstenite::Message::Binary(b),
        Message::Ping(b) => tungstenite::Message::Ping(b),
        Message::Pong(b) => tungstenite::Message::Pong(b),
        Message::Close(c) => {
            tungstenite::Message::Close(c.map(|c| tungstenite::protocol::CloseFrame {
                code: c.code.0.into(),
                reason: c.reason.into(),
            }))
        }
    }
}

fn from_tung(m: tungstenite::Message) -> Option<Message> {
    Some(match m {
        tungstenite::Message::Text(t) => Message::Text(t.as_str().to_owned()),
        tungstenite::Message::Binary(b) => Message::Binary(b),
        tungstenite::Message::Ping(b) => Message::Ping(b),
        tungstenite::Message::Pong(b) => Message::Pong(b),
        tungstenite::Message::Close(c) => Message::Close(c.map(|c| CloseFrame {
            code: CloseCode(c.code.into()),
            reason: c.reason.as_str().to_owned(),
        })),
        tungstenite::Message::Frame(_) => return None,
    })
}

impl<S> Stream for WsSocket<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    type Item = Result<Message, tungstenite::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match Pin::new(&mut self.0).poll_next(cx) {
                Poll::Ready(Some(Ok(m))) => match from_tung(m) {
                    Some(m) => Poll::Ready(Some(Ok(m))),
                    None => continue,
                },
                // A closed connection is the end of the stream, not an error.
                Poll::Ready(Some(Err(
                    tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed,
                ))) => Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

impl<S> Sink<Message> for WsSocket<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    type Error = tungstenite::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.0).poll_ready(cx)
    }
    fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        Pin::new(&mut self.0).start_send(to_tung(item))
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match Pin::new(&mut self.0).poll_close(cx) {
            Poll::Ready(Err(
                tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed,
            )) => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

/// tokio's clock and sleeps.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioTimer;

impl Timer for TokioTimer {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }
}
