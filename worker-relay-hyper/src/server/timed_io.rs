//! A socket whose writes give up after making no progress for a while (as
//! nginx's `send_timeout`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `io` with a deadline on stuck writes: a write or flush that has been
/// pending for `timeout` without progress fails with `TimedOut`.
pub(super) struct TimedIo<T> {
    io: T,
    timeout: Duration,
    /// Running while a write is pending; reset by any progress.
    stuck: Option<Pin<Box<Sleep>>>,
}

impl<T> TimedIo<T> {
    pub fn new(io: T, timeout: Duration) -> TimedIo<T> {
        TimedIo {
            io,
            timeout,
            stuck: None,
        }
    }

    fn check<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if r.is_ready() {
            self.stuck = None;
            return r;
        }
        let timeout = self.timeout;
        let sleep = self
            .stuck
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "send timeout: the peer took nothing for too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.check(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.check(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.check(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_stuck_for_the_timeout_fails_and_progress_resets_it() {
        // A pipe of 64 bytes that nobody reads: the second write is stuck.
        let (a, mut b) = tokio::io::duplex(64);
        let mut io = TimedIo::new(a, Duration::from_secs(60));
        io.write_all(&[0; 64]).await.unwrap();
        let started = tokio::time::Instant::now();
        let err = io.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));

        // A reader that takes a little every 30 s keeps the writer alive.
        let mut io = TimedIo::new(io.io, Duration::from_secs(60));
        let reader = tokio::spawn(async move {
            let mut buf = [0; 16];
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_secs(30)).await;
                tokio::io::AsyncReadExt::read(&mut b, &mut buf)
                    .await
                    .unwrap();
            }
        });
        io.write_all(&[0; 100]).await.unwrap();
        reader.await.unwrap();
    }
}
