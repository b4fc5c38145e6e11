//! Telling HTTP/2 from HTTP/1.1 by the connection's first bytes, within a
//! deadline, and giving those bytes back to the server that takes it.
//!
//! hyper-util's `auto` server does the same without a deadline: a client
//! that connects and sends nothing (or half the HTTP/2 preface) would hold
//! its connection for ever, before HTTP/1.1's header-read timeout starts.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// What an HTTP/2 client sends first (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection speaks, as its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    Http1,
    Http2,
}

/// Reads until the first bytes tell HTTP/2's preface from anything else
/// (at most its 24 bytes; one byte for an HTTP/1.1 request). `None` for a
/// connection that closed first.
pub(super) async fn sniff<I>(mut io: I) -> io::Result<Option<(Protocol, Prefixed<I>)>>
where
    I: AsyncRead + Unpin,
{
    let mut seen = Vec::with_capacity(PREFACE.len());
    loop {
        let mut buf = [0u8; 24];
        let want = PREFACE.len() - seen.len();
        let n = io.read(&mut buf[..want]).await?;
        if n == 0 {
            return Ok(None);
        }
        seen.extend_from_slice(&buf[..n]);
        let protocol = if !PREFACE.starts_with(&seen) {
            Protocol::Http1
        } else if seen.len() == PREFACE.len() {
            Protocol::Http2
        } else {
            continue;
        };
        return Ok(Some((protocol, Prefixed { seen, at: 0, io })));
    }
}

/// `io` with the bytes the sniffing read put back in front.
pub(super) struct Prefixed<I> {
    seen: Vec<u8>,
    at: usize,
    io: I,
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.seen.len() {
            let n = (self.seen.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.seen[at..at + n]);
            self.at += n;
            if self.at == self.seen.len() {
                self.seen = Vec::new();
                self.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn sniffed(chunks: &[&[u8]]) -> Option<(Protocol, Vec<u8>)> {
        let (mut client, server) = tokio::io::duplex(1024);
        for c in chunks {
            client.write_all(c).await.unwrap();
        }
        drop(client);
        let (p, mut io) = sniff(server).await.unwrap()?;
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        Some((p, all))
    }

    #[tokio::test]
    async fn the_first_bytes_tell_the_protocol_and_are_given_back() {
        let h1 = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
        assert_eq!(sniffed(&[h1]).await, Some((Protocol::Http1, h1.to_vec())));
        let mut h2 = PREFACE.to_vec();
        h2.extend_from_slice(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
        assert_eq!(sniffed(&[&h2]).await, Some((Protocol::Http2, h2.clone())));
        // In pieces, byte by byte.
        let pieces: Vec<&[u8]> = h2.chunks(1).collect();
        assert_eq!(sniffed(&pieces).await, Some((Protocol::Http2, h2.clone())));
        // A prefix of the preface that turns into something else.
        assert_eq!(
            sniffed(&[b"PRI * HTTP/1.1\r\n"]).await,
            Some((Protocol::Http1, b"PRI * HTTP/1.1\r\n".to_vec()))
        );
        // Closed before it could tell.
        assert_eq!(sniffed(&[b"PRI * HT"]).await, None);
        assert_eq!(sniffed(&[]).await, None);
    }
}
