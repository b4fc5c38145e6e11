//! What the kernel holds below the driver: `TCP_NOTSENT_LOWAT`, set to a
//! few milliseconds of data at the rate the socket drains, and writes that
//! end their segment so that the mark holds ([`PacedTcp`]).
//!
//! Without it Linux lets a busy connection queue megabytes in its send
//! buffer (autotuned up to `net.ipv4.tcp_wmem`'s maximum, 4 MiB here), and
//! whatever sits there goes out before anything the application sends next:
//! on a 10 Mbit/s link, seconds. HTTP/2 servers set this option so that
//! their own scheduler, not the kernel, holds the queue; this crate's
//! driver does the same with [`SendPacer`](worker_relay::proto::pacer::SendPacer)
//! above it. The bytes in flight (sent, not yet acknowledged) are not
//! limited, so a link's throughput is unchanged.
//!
//! A fixed small mark costs a fast link: every few KiB drained wake the
//! writer. On loopback a 4 KiB mark took a 1 GiB upload through relay +
//! worker from 0.89–0.99 s to 1.02–1.11 s (BENCHMARKS.md, "On a slow
//! link"). So the mark follows the drain rate as the driver's chunk does,
//! with the same [`SendPacer`](worker_relay::proto::pacer::SendPacer): 4 ms of
//! data, between [`UNSENT_LOWAT`] and [`MAX_UNSENT_LOWAT`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;
#[cfg(any(target_os = "linux", target_os = "android"))]
use tokio::io::Interest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use worker_relay::proto::pacer::SendPacer;

/// The smallest mark, and the one a connection starts with: 2 KiB (8 ms at
/// 2 Mbit/s). HTTP/2 servers are commonly given a fixed 16 KiB; on a
/// 2 Mbit/s link that alone is 65 ms before a cancel's answer.
pub const UNSENT_LOWAT: u32 = 2 << 10;

/// The largest mark [`PacedTcp`] sets: 1 MiB (loopback, fast LANs).
pub const MAX_UNSENT_LOWAT: u32 = 1 << 20;

/// Sets `TCP_NOTSENT_LOWAT` on `tcp` to `bytes` (Linux and Android; a no-op
/// returning `Ok` elsewhere). For an accept loop of one's own in front of
/// a [`Gateway`](crate::gateway::Gateway) that does not wrap its sockets in
/// [`PacedTcp`]: without records the kernel may still hold one segment
/// (up to 64 KiB) past the mark.
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
/// segment this write ends; with `MSG_NOSIGNAL` (0x4000), as std and tokio
/// send: a write to a reset connection is an `EPIPE` error, never a
/// `SIGPIPE` that kills a host which restored the default handler.
#[cfg(any(target_os = "linux", target_os = "android"))]
const SEND_FLAGS: i32 = 0x80 | 0x4000;

/// At most this many slices per write (Linux's `IOV_MAX`); the rest goes
/// in the next write, as std and mio do.
#[cfg(any(target_os = "linux", target_os = "android"))]
const MAX_SLICES: usize = 1024;

/// A TCP stream that keeps what the kernel holds unsent a few milliseconds
/// long: the worker's dial ([`DialStream`](crate::ws::DialStream)) and the
/// [`server`](crate::server)'s accepted connections.
///
/// - Its `TCP_NOTSENT_LOWAT` follows the rate at which it drains (4 ms of
///   data, [`UNSENT_LOWAT`] to [`MAX_UNSENT_LOWAT`]), measured from its own
///   writes: how much the kernel took while it made the writer wait.
/// - Each write is a record (`MSG_EOR`, Linux). The mark is checked only
///   when the kernel starts a new segment; a write that fits in the unsent
///   tail segment (up to 64 KiB with GSO) is appended without the check.
///   Measured on a 10 Mbit/s link with a 4 KiB mark and plain writes: 2 to
///   65 KiB unsent, a saw-tooth of 20 to 75 ms on every answer behind it.
///
/// Elsewhere than Linux and Android it is the plain stream.
#[derive(Debug)]
pub struct PacedTcp {
    tcp: TcpStream,
    pacer: SendPacer,
    /// The mark set now.
    lowat: u32,
    /// The kernel refused a write since the last one it took.
    waited: bool,
    last_write: Option<Instant>,
}

impl PacedTcp {
    /// Wraps `tcp`, setting its mark to [`UNSENT_LOWAT`].
    pub fn new(tcp: TcpStream) -> PacedTcp {
        let _ = set_unsent_lowat(&tcp, UNSENT_LOWAT);
        PacedTcp {
            tcp,
            pacer: SendPacer::new(MAX_UNSENT_LOWAT as usize),
            lowat: UNSENT_LOWAT,
            waited: false,
            last_write: None,
        }
    }

    /// The TCP stream inside.
    // Public as `ws::PacedTcp` (feature `tungstenite`); the server alone
    // keeps its streams to itself.
    #[cfg_attr(not(feature = "tungstenite"), allow(dead_code))]
    pub fn get_ref(&self) -> &TcpStream {
        &self.tcp
    }

    /// The mark set now, in bytes (elsewhere than Linux and Android, where
    /// the option is not set, what it would be).
    #[cfg_attr(not(feature = "tungstenite"), allow(dead_code))]
    pub fn unsent_lowat(&self) -> u32 {
        self.lowat
    }

    /// The kernel took `n` bytes: feed the pacer, follow its size.
    fn took(&mut self, n: usize) {
        let now = Instant::now();
        if !self.waited
            && self.last_write.is_some_and(|t| {
                now.saturating_duration_since(t) >= worker_relay::proto::pacer::SAMPLE_SPAN
            })
        {
            // The writer had nothing to send for a while: that was not
            // the link's time.
            self.pacer.on_idle();
        }
        self.waited = false;
        self.last_write = Some(now);
        self.pacer.on_sent(n, now);
        self.pacer.on_flushed(now);
        let want = u32::try_from(self.pacer.chunk_size()).unwrap_or(MAX_UNSENT_LOWAT);
        if want != self.lowat && set_unsent_lowat(&self.tcp, want).is_ok() {
            self.lowat = want;
        }
    }

    fn poll_write_record(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            #[cfg(any(target_os = "linux", target_os = "android"))]
            let sent = self.tcp.try_io(Interest::WRITABLE, || {
                let bufs = &bufs[..bufs.len().min(MAX_SLICES)];
                socket2::SockRef::from(&self.tcp).send_vectored_with_flags(bufs, SEND_FLAGS)
            });
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            let sent = self.tcp.try_write_vectored(bufs);
            match sent {
                Ok(n) => {
                    self.took(n);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.waited = true;
                    self.pacer.on_blocked();
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncRead for PacedTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for PacedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_record(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_record(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
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
        let mut w = PacedTcp::new(tcp.unwrap());
        assert_eq!(w.unsent_lowat(), UNSENT_LOWAT);
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
            let lowat = w.unsent_lowat();
            let set = socket2::SockRef::from(w.get_ref())
                .tcp_notsent_lowat()
                .unwrap();
            assert_eq!(set, lowat);
            lowat
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        let lowat = writer.await.unwrap();
        // Loopback drains fast: the mark grew past the smallest.
        assert!(lowat > UNSENT_LOWAT, "{lowat}");
        assert_eq!(&got[..expect.len()], &expect[..]);
        assert_eq!(&got[expect.len()..], b"abcd");
    }
}
