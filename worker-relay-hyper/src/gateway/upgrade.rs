//! A worker's WebSocket on a host that hands over an upgraded connection as
//! two byte streams (actix-web: the request's `Payload` in, a streaming
//! 101's body out) rather than as a socket: the gateway runs the WebSocket
//! itself (tungstenite, which answers pings), so the host needs no
//! WebSocket library and maps no messages.
//!
//! The bytes the WebSocket writes go through an in-memory pipe of
//! [`PIPE`] bytes to the 101's body, which the host polls as it writes to
//! its socket; the bytes the host reads arrive as the request body's
//! pieces. When the connection ends other than in good order (its close
//! deadline passed, the worker broke the protocol), the body ends with an
//! error rather than cleanly, so that a host that closes a connection
//! whose response failed (actix-web does) lets go of its socket.

use super::accept::{switching, websocket_key_of, Admission};
use super::{BoxError, GatewayBody};
use crate::ws::WsSocket;
use bytes::{Buf, Bytes};
use futures_core::Stream;
use http::Response;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::oneshot;
use worker_relay::rt::BodyError;

/// The pipe between the WebSocket's writes and the 101's body: what the
/// WebSocket may write ahead of the host.
const PIPE: usize = 64 << 10;

/// The most the 101's body hands the host in one piece.
const PIECE: usize = 16 << 10;

impl Admission {
    /// Answers the worker's upgrade request for a host that gives the
    /// upgraded connection as bytes: `incoming` is what the worker sends
    /// after the request's head (actix-web's `Payload` of an upgrade
    /// request), and the returned 101's body is what to send it (a
    /// streaming body that the host writes to the connection as is). The
    /// WebSocket runs on a task of the current thread's
    /// [`LocalSet`](tokio::task::LocalSet) (actix-web's workers run one),
    /// served as [`serve`](Self::serve) serves a socket; tungstenite
    /// answers the worker's pings. Refuses (400, 426) a request that is not
    /// a WebSocket upgrade of version 13, as [`Gateway::connect`](super::Gateway::connect) does.
    ///
    /// Its connection is let go when it ends, within its close deadline,
    /// even when the worker stops reading: the 101's body then ends with an
    /// error, which makes a host like actix-web drop the connection, and
    /// `socket` (the connection's TCP socket, if the host lets you have
    /// it: [`LetGo::of`]) is shut down, for a host that polls no body while
    /// its write buffer is full (actix-web would otherwise hold the
    /// connection until its peer reads or goes).
    ///
    /// # Panics
    /// Outside a `LocalSet`, as [`tokio::task::spawn_local`] does.
    pub fn upgrade_local<S, E>(self, incoming: S, socket: Option<&LetGo>) -> Response<GatewayBody>
    where
        S: Stream<Item = Result<Bytes, E>> + 'static,
        E: Into<BoxError>,
    {
        let key = match websocket_key_of(true, &self.handshake, self.decided.peer) {
            Ok(key) => key,
            Err(refusal) => return *refusal,
        };
        let (ours, theirs) = tokio::io::duplex(PIPE);
        let (ended_tx, ended) = oneshot::channel();
        let io = HostIo {
            incoming: Box::pin(incoming),
            pending: Bytes::new(),
            done: false,
            out: ours,
        };
        let let_go = socket.cloned();
        tokio::task::spawn_local(async move {
            let socket = WsSocket::server(io).await;
            let good = self.serve(socket).await.is_ok();
            if let (false, Some(socket)) = (good, let_go) {
                // Past its close deadline (or broken): the host may be
                // stuck writing to a peer that does not read.
                let _ = socket.0.shutdown(std::net::Shutdown::Both);
            }
            let _ = ended_tx.send(good);
        });
        switching(
            &key,
            GatewayBody::upgraded(Upgraded {
                out: theirs,
                ended: Some(ended),
                scratch: vec![0; PIECE].into_boxed_slice(),
            }),
        )
    }
}

/// The upgraded connection as the WebSocket sees it: reads from the host's
/// stream, writes into the pipe.
struct HostIo<S> {
    incoming: Pin<Box<S>>,
    /// What the last piece has left.
    pending: Bytes,
    /// The stream ended (or failed): reads return end of file.
    done: bool,
    out: DuplexStream,
}

impl<S, E> AsyncRead for HostIo<S>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Into<BoxError>,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.pending.is_empty() {
            if this.done {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.incoming.as_mut().poll_next(cx)) {
                Some(Ok(piece)) => this.pending = piece,
                Some(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Err(io::Error::other(e.into())));
                }
                None => this.done = true,
            }
        }
        let n = buf.remaining().min(this.pending.len());
        buf.put_slice(&this.pending[..n]);
        this.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S> AsyncWrite for HostIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().out).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().out).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().out).poll_shutdown(cx)
    }
}

/// The 101's body: what the WebSocket wrote, then its end, clean if the
/// connection ended in good order, [`BodyError::ConnectionLost`] if not.
pub(super) struct Upgraded {
    out: DuplexStream,
    /// Whether the connection ended in good order, once it has.
    ended: Option<oneshot::Receiver<bool>>,
    /// What one read takes from the pipe, copied out as a piece.
    scratch: Box<[u8]>,
}

impl Upgraded {
    pub(super) fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        if let Some(ended) = self.ended.as_mut() {
            let mut buf = ReadBuf::new(&mut self.scratch);
            match ready!(Pin::new(&mut self.out).poll_read(cx, &mut buf)) {
                Ok(()) if !buf.filled().is_empty() => {
                    return Poll::Ready(Some(Ok(Bytes::copy_from_slice(buf.filled()))));
                }
                // The WebSocket is gone (its end of the pipe dropped):
                // how did its connection end?
                _ => {
                    let good = ready!(Pin::new(ended).poll(cx)).unwrap_or(false);
                    self.ended = None;
                    if !good {
                        return Poll::Ready(Some(Err(BodyError::ConnectionLost)));
                    }
                }
            }
        }
        Poll::Ready(None)
    }
}

/// A duplicate of the TCP socket a host accepted a worker's connection on,
/// for [`Admission::upgrade_local`] to shut the connection down when its
/// close deadline has passed: the close deadline then holds whether or not
/// the host ever gets to close it. Cheap to clone. It is a second file
/// descriptor for the socket for as long as the host keeps it (with
/// actix-web's `on_connect`, for every connection, callers' too): count two
/// per connection against the process's limit.
#[derive(Clone, Debug)]
pub struct LetGo(Arc<std::net::TcpStream>);

impl LetGo {
    /// From a host's accepted connection (actix-web's `on_connect` gives it
    /// as `&dyn Any`): a tokio or a std `TcpStream`; `None` for anything
    /// else (TLS, a Unix socket) or if the socket cannot be duplicated.
    pub fn of(connection: &dyn std::any::Any) -> Option<LetGo> {
        let socket = if let Some(tcp) = connection.downcast_ref::<tokio::net::TcpStream>() {
            socket2::SockRef::from(tcp).try_clone().ok()?
        } else {
            let tcp = connection.downcast_ref::<std::net::TcpStream>()?;
            socket2::SockRef::from(tcp).try_clone().ok()?
        };
        Some(LetGo(Arc::new(socket.into())))
    }
}
