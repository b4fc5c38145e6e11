//! `TCP_NOTSENT_LOWAT`: how many unsent bytes the kernel holds for a socket
//! before it stops taking more.
//!
//! Without it Linux lets a busy connection queue megabytes in its send
//! buffer (autotuned up to `net.ipv4.tcp_wmem`'s maximum, 4 MiB here), and
//! whatever sits there goes out before anything the application sends next:
//! on a 10 Mbit/s link, seconds. HTTP/2 servers set this option so that
//! their own scheduler, not the kernel, holds the queue; this crate's
//! driver does the same with [`SendPacer`](crate::proto::pacer::SendPacer)
//! above it. The bytes in flight (sent, not yet acknowledged) are not
//! limited, so a link's throughput is unchanged.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
#[cfg(any(target_os = "linux", target_os = "android"))]
use tokio::io::Interest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The limit the worker's dial and the server's accepted sockets use:
/// 4 KiB (3 ms at 10 Mbit/s, 16 ms at 2). HTTP/2 servers are commonly given
/// 16 KiB; on a 2 Mbit/s link that alone is 65 ms before a cancel's answer,
/// and 4 KiB kept 40 Mbit/s links full (BENCHMARKS.md, "On a slow link").
pub const UNSENT_LOWAT: u32 = 4 << 10;

/// Sets `TCP_NOTSENT_LOWAT` on `tcp` to `bytes` (Linux and Android; a no-op
/// returning `Ok` elsewhere).
pub fn set_unsent_lowat(tcp: &TcpStream, bytes: u32) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        socket2::SockRef::from(tcp).set_tcp_notsent_lowat(bytes)
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = (tcp, bytes);
        Ok(())
    }
}

/// `MSG_EOR` (Linux's value): the kernel appends nothing more to the
/// segment this write ends.
#[cfg(any(target_os = "linux", target_os = "android"))]
const MSG_EOR: i32 = 0x80;

/// Writes `bufs` to `tcp` as one record (`MSG_EOR`).
///
/// Why: `TCP_NOTSENT_LOWAT` is checked only when the kernel starts a new
/// segment; a write that fits in the unsent tail segment (up to 64 KiB
/// with GSO) is appended without the check. Measured on a 10 Mbit/s link
/// with a 4 KiB mark: 2 to 65 KiB unsent, a saw-tooth of 20 to 75 ms on
/// every answer behind it. Ending each write's segment makes the next
/// write start a new one, where the mark holds.
pub(crate) fn poll_write_record(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    loop {
        ready!(tcp.poll_write_ready(cx))?;
        let sent = tcp.try_io(Interest::WRITABLE, || {
            socket2::SockRef::from(tcp).send_vectored_with_flags(bufs, MSG_EOR)
        });
        match sent {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    loop {
        ready!(tcp.poll_write_ready(cx))?;
        match tcp.try_write_vectored(bufs) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
}

/// A TCP stream whose every write is a record ([`poll_write_record`]), so
/// that its `TCP_NOTSENT_LOWAT` holds.
#[derive(Debug)]
pub(crate) struct RecordTcp(pub TcpStream);

impl AsyncRead for RecordTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RecordTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        poll_write_record(&self.0, cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        poll_write_record(&self.0, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_option_reaches_the_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tcp, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let (tcp, _accepted) = (tcp.unwrap(), accepted.unwrap());
        set_unsent_lowat(&tcp, UNSENT_LOWAT).unwrap();
        let got = socket2::SockRef::from(&tcp).tcp_notsent_lowat().unwrap();
        assert_eq!(got, UNSENT_LOWAT);
    }

    #[tokio::test]
    async fn records_arrive_whole_and_in_order() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tcp, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let mut w = RecordTcp(tcp.unwrap());
        set_unsent_lowat(&w.0, UNSENT_LOWAT).unwrap();
        let mut r = accepted.unwrap().0;
        let body: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
        let expect = body.clone();
        let writer = tokio::spawn(async move {
            for piece in body.chunks(100_000) {
                w.write_all(piece).await.unwrap();
            }
            let parts = [IoSlice::new(b"ab"), IoSlice::new(b"cd")];
            let n = w.write_vectored(&parts).await.unwrap();
            assert_eq!(n, 4);
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(&got[..expect.len()], &expect[..]);
        assert_eq!(&got[expect.len()..], b"abcd");
    }
}
