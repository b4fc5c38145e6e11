//! Large reads from a socket whose reader asks for small ones, while the
//! peer keeps sending.
//!
//! The relay reads each worker's WebSocket through a 4 KiB buffer
//! ([`READ_BUFFER`](super::READ_BUFFER)), so that 5,000 idle workers cost
//! little; read straight from the socket, a busy one then costs a system
//! call per 4 KiB (a quarter of a million `recvfrom`s per GiB of response).
//! [`ReadAhead`] reads straight into the reader's buffer while the
//! connection is quiet, and once a read fills that buffer whole (the peer
//! has more), reads the socket in passes of [`AHEAD`] bytes into a buffer
//! of its own and hands them out from there. The buffer is freed as soon
//! as the socket has nothing more to read, so an idle connection holds
//! none of it.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The read-ahead pass: 64 KiB, loopback's segment size.
pub(crate) const AHEAD: usize = 64 << 10;

/// A transport that reads ahead while busy; writes pass through.
#[derive(Debug)]
pub(crate) struct ReadAhead<S> {
    inner: S,
    /// Read ahead: `buf[pos..len]` is not handed out yet. Empty (no
    /// allocation) while the connection is quiet.
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    /// The last read filled the reader's buffer whole: the peer has more.
    busy: bool,
}

impl<S> ReadAhead<S> {
    pub(crate) fn new(inner: S) -> ReadAhead<S> {
        ReadAhead {
            inner,
            buf: Vec::new(),
            pos: 0,
            len: 0,
            busy: false,
        }
    }

    /// Bytes of read-ahead buffer held now (0 while quiet).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.buf.capacity()
    }

    /// The socket has nothing more for now: give the buffer back.
    fn quiet(&mut self) {
        self.busy = false;
        self.buf = Vec::new();
        self.pos = 0;
        self.len = 0;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos < this.len {
            let n = out.remaining().min(this.len - this.pos);
            out.put_slice(&this.buf[this.pos..this.pos + n]);
            this.pos += n;
            return Poll::Ready(Ok(()));
        }
        let want = out.remaining();
        if !this.busy || want >= AHEAD || want == 0 {
            // Read straight: a buffer left from a busy spell goes.
            if !this.buf.is_empty() {
                this.quiet();
            }
            let before = out.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, out))?;
            this.busy = want > 0 && out.filled().len() - before == want;
            return Poll::Ready(Ok(()));
        }
        if this.buf.is_empty() {
            this.buf = vec![0; AHEAD];
        }
        let mut ahead = ReadBuf::new(&mut this.buf);
        match Pin::new(&mut this.inner).poll_read(cx, &mut ahead) {
            Poll::Pending => {
                this.quiet();
                Poll::Pending
            }
            Poll::Ready(Err(e)) => {
                this.quiet();
                Poll::Ready(Err(e))
            }
            Poll::Ready(Ok(())) => {
                let n = ahead.filled().len();
                if n == 0 {
                    // End of stream: `out` stays unfilled, as the socket's.
                    this.quiet();
                    return Poll::Ready(Ok(()));
                }
                let give = want.min(n);
                out.put_slice(&this.buf[..give]);
                this.pos = give;
                this.len = n;
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::future::poll_fn;

    /// A socket with a script: each entry is bytes available (served in
    /// reads of up to the reader's size), or a pause (one `Pending`), or
    /// an error; after the script, end of stream. Counts the reads.
    struct Script {
        steps: VecDeque<Step>,
        reads: usize,
        sizes: Vec<usize>,
    }

    enum Step {
        Data(Vec<u8>),
        Pause,
        Fail,
    }

    impl AsyncRead for Script {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.reads += 1;
            self.sizes.push(out.remaining());
            match self.steps.front_mut() {
                None => Poll::Ready(Ok(())),
                Some(Step::Pause) => {
                    self.steps.pop_front();
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                Some(Step::Fail) => Poll::Ready(Err(io::Error::other("reset"))),
                Some(Step::Data(d)) => {
                    let n = out.remaining().min(d.len());
                    out.put_slice(&d[..n]);
                    d.drain(..n);
                    if d.is_empty() {
                        self.steps.pop_front();
                    }
                    Poll::Ready(Ok(()))
                }
            }
        }
    }

    fn script(steps: Vec<Step>) -> ReadAhead<Script> {
        ReadAhead::new(Script {
            steps: steps.into(),
            reads: 0,
            sizes: Vec::new(),
        })
    }

    fn pattern(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| ((i * 7 + seed) % 253) as u8).collect()
    }

    /// Reads in `size` pieces until end of stream or an error; the
    /// `Pending`s are counted, with the buffer held at each.
    async fn read_all(r: &mut ReadAhead<Script>, size: usize) -> (Vec<u8>, Vec<usize>, bool) {
        let mut got = Vec::new();
        let mut held_at_pending = Vec::new();
        let mut piece = vec![0u8; size];
        loop {
            let mut pended = false;
            let res = poll_fn(|cx| {
                let mut rb = ReadBuf::new(&mut piece);
                match Pin::new(&mut *r).poll_read(cx, &mut rb) {
                    Poll::Pending => {
                        pended = true;
                        Poll::Ready(None)
                    }
                    Poll::Ready(res) => Poll::Ready(Some(res.map(|()| rb.filled().len()))),
                }
            })
            .await;
            match res {
                None => {
                    assert!(pended);
                    held_at_pending.push(r.held());
                }
                Some(Ok(0)) => return (got, held_at_pending, true),
                Some(Ok(n)) => got.extend_from_slice(&piece[..n]),
                Some(Err(_)) => return (got, held_at_pending, false),
            }
        }
    }

    #[tokio::test]
    async fn a_busy_socket_is_read_in_large_passes_and_every_byte_arrives_in_order() {
        let body = pattern(1 << 20, 1);
        let mut r = script(vec![Step::Data(body.clone())]);
        let (got, _, eof) = read_all(&mut r, 4096).await;
        assert!(eof);
        assert_eq!(got, body);
        // One 4 KiB read straight, then 64 KiB passes, then the end.
        let reads = r.inner.reads;
        assert!(reads <= 2 + (1 << 20) / AHEAD, "{reads} reads");
        assert_eq!(r.inner.sizes[0], 4096);
        assert_eq!(r.inner.sizes[1], AHEAD);
    }

    #[tokio::test]
    async fn a_quiet_socket_is_read_straight_and_holds_no_buffer() {
        // Small messages with pauses between them: never a full read.
        let steps = (0..10)
            .flat_map(|i| [Step::Data(pattern(100 + i, i)), Step::Pause])
            .collect();
        let mut r = script(steps);
        let (got, held, eof) = read_all(&mut r, 4096).await;
        assert!(eof);
        let expect: Vec<u8> = (0..10).flat_map(|i| pattern(100 + i, i)).collect();
        assert_eq!(got, expect);
        assert!(r.inner.sizes.iter().all(|&s| s == 4096));
        assert_eq!(held, vec![0; 10]);
    }

    #[tokio::test]
    async fn the_buffer_is_freed_when_the_socket_goes_quiet_and_taken_again_when_busy() {
        let a = pattern(200_000, 2);
        let b = pattern(300_000, 3);
        let mut r = script(vec![
            Step::Data(a.clone()),
            Step::Pause,
            Step::Data(b.clone()),
        ]);
        let (got, held, eof) = read_all(&mut r, 4096).await;
        assert!(eof);
        assert_eq!(got, [a, b].concat());
        assert_eq!(held, vec![0]);
        assert!(r.inner.reads < 20, "{} reads", r.inner.reads);
    }

    #[tokio::test]
    async fn an_error_while_busy_is_the_readers_and_the_buffer_goes() {
        let a = pattern(100_000, 4);
        let mut r = script(vec![Step::Data(a.clone()), Step::Fail]);
        let (got, _, eof) = read_all(&mut r, 4096).await;
        assert!(!eof);
        assert_eq!(got, a);
        assert_eq!(r.held(), 0);
    }

    /// One read into `piece` (the script never pauses here).
    async fn read_once(r: &mut ReadAhead<Script>, piece: &mut [u8]) -> usize {
        poll_fn(|cx| {
            let mut rb = ReadBuf::new(piece);
            Pin::new(&mut *r)
                .poll_read(cx, &mut rb)
                .map_ok(|()| rb.filled().len())
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_zero_length_read_while_busy_reads_nothing_and_keeps_no_buffer() {
        let a = pattern(100_000, 6);
        let mut r = script(vec![Step::Data(a.clone())]);
        let mut piece = vec![0u8; 4096];
        let mut got = Vec::new();
        // Busy after a full read; then hand out all that was read ahead.
        loop {
            let n = read_once(&mut r, &mut piece).await;
            got.extend_from_slice(&piece[..n]);
            if r.held() > 0 && r.pos == r.len {
                break;
            }
        }
        assert_eq!(read_once(&mut r, &mut []).await, 0);
        assert_eq!(r.held(), 0, "no buffer kept across a straight read");
        let (rest, _, eof) = read_all(&mut r, 4096).await;
        got.extend(rest);
        assert!(eof);
        assert_eq!(got, a);
    }

    /// Under the real tungstenite, with the relay's 4 KiB reads: large
    /// and small messages, in both directions, arrive whole and in order.
    #[tokio::test]
    async fn under_tungstenite_every_message_arrives_whole() {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::protocol::Role;
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::WebSocketStream;

        let (a, b) = tokio::io::duplex(256 << 10);
        let mut relay = WebSocketStream::from_raw_socket(
            ReadAhead::new(a),
            Role::Server,
            Some(super::super::config()),
        )
        .await;
        let mut worker = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
        let messages: Vec<Vec<u8>> = (0..40)
            .map(|i| {
                pattern(
                    if i % 3 == 0 {
                        (1 << 20) + 4
                    } else {
                        10 + i * 97
                    },
                    i,
                )
            })
            .collect();
        let sent = messages.clone();
        let send = tokio::spawn(async move {
            for m in sent {
                worker.send(Message::Binary(m.into())).await.unwrap();
            }
            worker
        });
        for (i, m) in messages.iter().enumerate() {
            let got = relay.next().await.unwrap().unwrap();
            assert_eq!(got.into_data().as_ref(), &m[..], "message {i}");
        }
        let mut worker = send.await.unwrap();
        // And back, while the worker reads: writes pass through.
        let echo = messages[0].clone();
        let (sent, back) = tokio::join!(relay.send(Message::Binary(echo.into())), worker.next());
        sent.unwrap();
        assert_eq!(
            back.unwrap().unwrap().into_data().as_ref(),
            &messages[0][..]
        );
    }

    #[tokio::test]
    async fn reads_of_any_size_see_the_same_bytes() {
        let body = pattern(333_333, 5);
        for size in [1, 13, 4096, AHEAD - 1, AHEAD, AHEAD + 1, 1 << 20] {
            let steps = body
                .chunks(50_000)
                .flat_map(|c| [Step::Data(c.to_vec()), Step::Pause])
                .collect();
            let mut r = script(steps);
            let (got, _, eof) = read_all(&mut r, size).await;
            assert!(eof, "size {size}");
            assert_eq!(got, body, "size {size}");
        }
    }
}
