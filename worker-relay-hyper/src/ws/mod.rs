//! tokio-tungstenite WebSockets as the crate's [`Message`]s (feature
//! `tungstenite`), and the worker's dial.
//!
//! - [`WsSocket`] wraps a `tokio_tungstenite::WebSocketStream` into the
//!   `Stream + Sink` of [`Message`] that [`rt::relay`](worker_relay::rt::relay) and
//!   [`rt::worker`](worker_relay::rt::worker) drive. Binary payloads (the body
//!   chunks) and pings cross without a copy; a text frame (a small control
//!   frame) is copied once on the way in.
//! - [`config`]: tungstenite's settings for this protocol, with a small read
//!   buffer so that an idle connection costs the relay little memory; the
//!   worker's dial reads in larger passes ([`DIAL_READ_BUFFER`]).
//! - [`Dialer`] (and [`dial`], its defaults): the worker's dial, `ws://`
//!   or (feature `rustls`) `wss://` trusting the platform's roots and any
//!   CA given; its answer judged into a [`Verdict`](worker_relay::connect::Verdict)
//!   (a 101 without the subprotocol is a final refusal, not a network error
//!   to retry), and a [`DialError`] that says what failed (DNS, TCP, TLS
//!   with rustls's reason, the relay's status, the time limit). A
//!   `wss://` URL in a build without TLS is a final refusal at once, and so
//!   is a connect token that would go over plain `ws://` to a host that is
//!   not loopback, unless [`Dialer::allow_cleartext_token`]. The TCP
//!   connection is Happy Eyeballs style (RFC 8305): addresses of both
//!   families in turn, a new attempt every [`ATTEMPT_DELAY`] beside the
//!   pending ones, the first to connect kept.
//! - [`Target`]: a relay URL's scheme, host and port, and whether the host
//!   is loopback, decided before any lookup (the dial refuses to send a
//!   token over plain `ws://` to anything else, unless told to).
//!
//! ```no_run
//! # async fn run() {
//! use worker_relay::connect::{Token, Verdict, WorkerHandshake};
//! use worker_relay::proto::WorkerConfig;
//! use worker_relay::rt;
//! use worker_relay_hyper::TokioTimer;
//! use worker_relay_hyper::ws;
//!
//! let handshake = WorkerHandshake::new(Token::new("s3cret").ok());
//! match ws::dial("ws://127.0.0.1:8080/connect", &handshake, ws::DIAL_TIMEOUT).await {
//!     Ok(socket) => {
//!         let (incoming, driver) = rt::worker(socket, TokioTimer, WorkerConfig::default());
//!         tokio::spawn(driver);
//!         // … serve `incoming`
//! #       drop(incoming);
//!     }
//!     Err(e) => match e.verdict() {
//!         Verdict::Refused(_) => eprintln!("refused for good: {e}"),
//!         _ => eprintln!("try again later: {e}"),
//!     },
//! }
//! # }
//! ```

mod dial;
mod happy;
#[cfg(feature = "gateway")]
pub(crate) mod read_ahead;
mod stream;
#[cfg(feature = "rustls")]
mod tls;

pub use crate::send_lowat::{set_unsent_lowat, PacedTcp, MAX_UNSENT_LOWAT, UNSENT_LOWAT};
#[cfg(feature = "tunnel")]
pub(crate) use dial::deadline_after;
pub use dial::{DialError, Dialer, Dialled, Target, TLS_COMPILED};
pub use happy::ATTEMPT_DELAY;
pub use stream::DialStream;
#[cfg(feature = "rustls")]
pub use tls::TlsError;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::{self, protocol::WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use worker_relay::connect::WorkerHandshake;
use worker_relay::frame::{CloseCode, CloseFrame, Message};

pub use tokio_tungstenite::tungstenite::Error;

/// The largest message tungstenite buffers. A message between the
/// protocol's limit (1 MiB + 4) and this one reaches the state machine,
/// which closes the connection with 1009 as the spec says; a larger one
/// fails the socket without being buffered.
pub const MAX_BUFFERED_MESSAGE: usize = 16 << 20;

/// The read buffer of a relay's connection: 4 KiB, allocated up front. An
/// idle connection costs about this much of it. Read straight from the
/// socket, a busy one would take a system call per 4 KiB; the
/// [`Gateway`](crate::gateway::Gateway) reads ahead in 64 KiB passes while
/// a worker sends, into a buffer it frees when the socket goes quiet.
pub const READ_BUFFER: usize = 4 << 10;

/// The read buffer of a dialled (worker's) connection, by default: 128 KiB,
/// tungstenite's own default. A worker holds one connection, and reads the
/// request bodies it is sent in passes of up to this much: a 1 GiB upload
/// through relay + worker took 1.20 s with 4 KiB passes (a quarter of a
/// million `recvfrom`s) and 0.97 s with these (BENCHMARKS.md, issue 28).
/// [`Dialer::read_buffer`] sets another.
pub const DIAL_READ_BUFFER: usize = 128 << 10;

/// How long [`dial`] waits for the TCP connection and the upgrade answer
/// together, by default. (A dial does not spend it all on one address that
/// never answers: see [`ATTEMPT_DELAY`].)
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// tungstenite's settings for this protocol, both sides: messages up to
/// [`MAX_BUFFERED_MESSAGE`], a [`READ_BUFFER`] read buffer, and writes
/// buffered up to 64 KiB before they go to the socket (a flush always
/// writes everything).
pub fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(64 << 10)
        .max_message_size(Some(MAX_BUFFERED_MESSAGE))
        .max_frame_size(Some(MAX_BUFFERED_MESSAGE))
}

/// A tokio-tungstenite WebSocket seen as a `Stream + Sink` of the crate's
/// [`Message`]s. A close by either side ends the stream cleanly (`None`),
/// not with an error.
#[derive(Debug)]
pub struct WsSocket<S>(pub WebSocketStream<S>);

impl<S> WsSocket<S> {
    /// The WebSocket inside.
    pub fn into_inner(self) -> WebSocketStream<S> {
        self.0
    }
}

impl<S> WsSocket<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// The server side of an upgraded connection (after a 101), with
    /// [`config`].
    pub async fn server(io: S) -> WsSocket<S> {
        let role = tungstenite::protocol::Role::Server;
        WsSocket(WebSocketStream::from_raw_socket(io, role, Some(config())).await)
    }
}

/// The crate's message as tungstenite's (no copy).
pub fn to_tungstenite(m: Message) -> tungstenite::Message {
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

/// tungstenite's message as the crate's; `None` for a raw frame (which a
/// reading WebSocket never yields). Text is copied once; the rest is not.
pub fn from_tungstenite(m: tungstenite::Message) -> Option<Message> {
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

fn is_closed(e: &WsError) -> bool {
    matches!(e, WsError::ConnectionClosed | WsError::AlreadyClosed)
}

impl<S> futures_core::Stream for WsSocket<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    type Item = Result<Message, WsError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match Pin::new(&mut self.0).poll_next(cx) {
                Poll::Ready(Some(Ok(m))) => match from_tungstenite(m) {
                    Some(m) => Poll::Ready(Some(Ok(m))),
                    None => continue,
                },
                Poll::Ready(Some(Err(e))) if is_closed(&e) => Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

impl<S> futures_sink::Sink<Message> for WsSocket<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    type Error = WsError;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        Pin::new(&mut self.0).poll_ready(cx)
    }

    fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), WsError> {
        Pin::new(&mut self.0).start_send(to_tungstenite(item))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    /// Sends the close message if none was (tungstenite's close), flushes,
    /// then shuts the write side of the byte stream: a TLS stream sends its
    /// `close_notify`, TCP its FIN (tungstenite itself only flushes).
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        match Pin::new(&mut self.0).poll_close(cx) {
            Poll::Ready(Err(e)) if is_closed(&e) => {}
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        match Pin::new(self.0.get_mut()).poll_shutdown(cx) {
            // Gone already: shut as well.
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::NotConnected => {
                Poll::Ready(Ok(()))
            }
            other => other.map_err(WsError::Io),
        }
    }
}

/// Dials `url` as a worker with a [`Dialer`] of the defaults and this
/// time limit: see [`Dialer::dial`].
pub async fn dial(
    url: &str,
    handshake: &WorkerHandshake,
    timeout: Duration,
) -> Result<Dialled, DialError> {
    Dialer::new().timeout(timeout).dial(url, handshake).await
}
