//! The byte stream under a dialled WebSocket: plain TCP, or TLS over it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::send_lowat::PacedTcp;

/// A dialled connection's bytes: `ws://` over TCP, or `wss://` over
/// rustls (feature `rustls`).
#[derive(Debug)]
#[non_exhaustive]
pub enum DialStream {
    /// `ws://`.
    Plain(PacedTcp),
    /// `wss://`.
    #[cfg(feature = "rustls")]
    Tls(Box<tokio_rustls::client::TlsStream<PacedTcp>>),
}

impl DialStream {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            DialStream::Plain(s) => s.get_ref(),
            #[cfg(feature = "rustls")]
            DialStream::Tls(s) => s.get_ref().0.get_ref(),
        }
    }

    /// Whether the bytes are encrypted (`wss://`).
    pub fn is_tls(&self) -> bool {
        !matches!(self, DialStream::Plain(_))
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            DialStream::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            #[cfg(feature = "rustls")]
            DialStream::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for DialStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for DialStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            DialStream::Plain(s) => s.is_write_vectored(),
            #[cfg(feature = "rustls")]
            DialStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_shutdown(cx))
    }
}
