//! One body pump for both directions of the integration layer: an
//! `http_body::Body` poured into a body sink, the caller's request body
//! into a [`RequestSink`] (the gateway) and an app's response body into a
//! [`ResponseSink`] (the tunnel).
//!
//! The sinks keep a piece given to `start_send` until the next
//! `poll_ready` or `poll_flush` hands it to the connection, so a pump that
//! only sends holds each piece back until the next one arrives. This one
//! flushes whenever its source pauses: an interactive body (send a piece,
//! wait for the peer's reaction) goes out piece by piece.

use super::{BodyError, RequestSink, ResponseSink};
use crate::BoxError;
use bytes::{Buf, Bytes};
use futures_sink::Sink;
use http_body::Body;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Pieces one poll moves at most before it yields to the executor.
const PIECES_PER_POLL: usize = 32;

/// Bytes one poll of a [`Pump::yielding`] pump hands to the sink at most
/// before it flushes them and yields. The connection's driver, woken by
/// that flush, waits in the runtime's "next task" slot of this thread,
/// where tokio's other threads cannot take it (tokio issue 4941, still
/// open in tokio 1.54). A pump that went on making its next piece (an app
/// that computes its body) would keep it there, and the driver's writes
/// would follow the body's making on one core instead of running beside
/// it. Yielding puts the pump behind the driver, where an idle thread
/// takes it. A body smaller than this goes out in one poll.
pub(crate) const YIELD_AFTER: usize = 64 * 1024;

/// A body sink the pump can measure: the crate's [`RequestSink`] and
/// [`ResponseSink`].
pub(crate) trait BodySink: Sink<Bytes, Error = BodyError> + Unpin {
    /// Bytes the connection has taken from the sink so far.
    fn taken(&self) -> u64;
}

impl BodySink for RequestSink {
    fn taken(&self) -> u64 {
        RequestSink::bytes_taken(self)
    }
}

impl BodySink for ResponseSink {
    fn taken(&self) -> u64 {
        ResponseSink::bytes_taken(self)
    }
}

/// How a pump ended.
#[derive(Debug)]
pub(crate) enum PumpEnd {
    /// The source ended and the sink was closed (`end` is queued).
    Done,
    /// The source failed. The sink is neither flushed nor closed: the
    /// owner decides (drop it to abort, or flush and fail it).
    SourceFailed(BoxError),
    /// The sink refused a piece or the end: the stream is over on the
    /// peer's side (gone, aborted) or its bytes broke a rule.
    Refused(BodyError),
}

/// What a pending pump waits for (both at once: the source has nothing
/// new and the sink has not taken what it was given).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// The source has nothing new.
    pub source: bool,
    /// The sink has not taken what it was given.
    pub sink: bool,
}

/// Waiting for the sink only.
const SINK_WAITS: Waiting = Waiting {
    source: false,
    sink: true,
};

/// Pours `source` into `sink`; poll it with [`Pump::poll`].
pub(crate) struct Pump<B, S> {
    source: Pin<Box<B>>,
    sink: S,
    /// A piece of the source the sink was not ready for.
    held: Option<Bytes>,
    source_done: bool,
    /// Data pieces taken from the source so far.
    pieces: u64,
    waiting: Waiting,
    /// Bytes a poll hands on at most before it flushes and yields.
    yield_after: usize,
}

impl<B, S> Pump<B, S>
where
    B: Body,
    B::Error: Into<BoxError>,
    S: BodySink,
{
    /// A pump from `source` into `sink`.
    pub fn new(source: B, sink: S) -> Self {
        Pump {
            source: Box::pin(source),
            sink,
            held: None,
            source_done: false,
            pieces: 0,
            waiting: Waiting::default(),
            yield_after: usize::MAX,
        }
    }

    /// Makes each poll flush and yield once it has handed `bytes` on
    /// ([`YIELD_AFTER`]): for a source that computes its pieces, so that
    /// the connection's driver writes them out beside it.
    pub fn yielding(mut self, bytes: usize) -> Self {
        self.yield_after = bytes.max(1);
        self
    }

    /// Moves what it can. Pending while the source has nothing new (what
    /// it gave is flushed meanwhile) or the sink is not ready; see
    /// [`Pump::waiting`]. Trailers are dropped (the protocol has none).
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<PumpEnd> {
        let mut sink = Pin::new(&mut self.sink);
        let mut moved = 0;
        for _ in 0..PIECES_PER_POLL {
            if let Some(piece) = self.held.take() {
                match sink.as_mut().poll_ready(cx) {
                    Poll::Pending => {
                        self.held = Some(piece);
                        self.waiting = SINK_WAITS;
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(PumpEnd::Refused(e)),
                    Poll::Ready(Ok(())) => {
                        moved += piece.len();
                        if let Err(e) = sink.as_mut().start_send(piece) {
                            return Poll::Ready(PumpEnd::Refused(e));
                        }
                    }
                }
                if moved >= self.yield_after {
                    match sink.as_mut().poll_flush(cx) {
                        Poll::Pending => {
                            self.waiting = SINK_WAITS;
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(PumpEnd::Refused(e)),
                        Poll::Ready(Ok(())) => break, // flushed: yield
                    }
                }
            }
            if self.source_done {
                return match sink.as_mut().poll_close(cx) {
                    Poll::Pending => {
                        self.waiting = SINK_WAITS;
                        Poll::Pending
                    }
                    Poll::Ready(Ok(())) => Poll::Ready(PumpEnd::Done),
                    Poll::Ready(Err(e)) => Poll::Ready(PumpEnd::Refused(e)),
                };
            }
            match self.source.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(mut data) = frame.into_data() {
                        self.pieces += 1;
                        let piece = data.copy_to_bytes(data.remaining());
                        self.held = (!piece.is_empty()).then_some(piece);
                    }
                }
                Poll::Ready(None) => self.source_done = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(PumpEnd::SourceFailed(e.into())),
                Poll::Pending => {
                    // The source pauses: what it gave so far goes out now,
                    // not when its next piece comes.
                    let sink_waits = match sink.as_mut().poll_flush(cx) {
                        Poll::Pending => true,
                        Poll::Ready(Ok(())) => false,
                        Poll::Ready(Err(e)) => return Poll::Ready(PumpEnd::Refused(e)),
                    };
                    self.waiting = Waiting {
                        source: true,
                        sink: sink_waits,
                    };
                    return Poll::Pending;
                }
            }
        }
        // Still moving, or flushed after `yield_after` bytes: let the
        // others run, and come back at once.
        cx.waker().wake_by_ref();
        self.waiting = Waiting::default();
        Poll::Pending
    }
}

impl<B, S: BodySink> Pump<B, S> {
    /// What the last pending [`Pump::poll`] waited for.
    pub fn waiting(&self) -> Waiting {
        self.waiting
    }

    /// Data pieces taken from the source so far.
    pub fn pieces(&self) -> u64 {
        self.pieces
    }

    /// Bytes the connection has taken from the sink so far.
    pub fn taken(&self) -> u64 {
        self.sink.taken()
    }

    /// The sink (after [`PumpEnd::SourceFailed`], to flush and fail it).
    pub fn into_sink(self) -> S {
        self.sink
    }

    /// The source, with what is left of it, and the sink.
    pub fn into_parts(self) -> (Pin<Box<B>>, S) {
        (self.source, self.sink)
    }
}

/// Waits until `sink` has handed what it holds to the connection.
pub(crate) async fn flush<S: BodySink>(sink: &mut S) -> Result<(), BodyError> {
    std::future::poll_fn(|cx| Pin::new(&mut *sink).poll_flush(cx)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use futures::task::noop_waker_ref;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Waker;

    /// A sink like the crate's: a started piece waits until the next
    /// `poll_ready` or `poll_flush` hands it on (when `open`).
    #[derive(Default)]
    struct Held {
        open: bool,
        refuse: bool,
        pending: Option<Bytes>,
        out: Vec<Bytes>,
        closed: bool,
    }

    impl Held {
        fn push(&mut self) -> Poll<Result<(), BodyError>> {
            if self.refuse {
                return Poll::Ready(Err(BodyError::ClientGone));
            }
            match self.pending.take() {
                Some(p) if self.open => self.out.push(p),
                Some(p) => {
                    self.pending = Some(p);
                    return Poll::Pending;
                }
                None => {}
            }
            Poll::Ready(Ok(()))
        }
    }

    impl Sink<Bytes> for Held {
        type Error = BodyError;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
            self.get_mut().push()
        }
        fn start_send(self: Pin<&mut Self>, item: Bytes) -> Result<(), BodyError> {
            self.get_mut().pending = Some(item);
            Ok(())
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
            self.get_mut().push()
        }
        fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
            let this = self.get_mut();
            std::task::ready!(Pin::new(&mut *this).poll_flush(cx))?;
            this.closed = true;
            Poll::Ready(Ok(()))
        }
    }

    impl BodySink for Held {
        fn taken(&self) -> u64 {
            self.out.iter().map(|p| p.len() as u64).sum()
        }
    }

    type Item = Result<Frame<Bytes>, BoxError>;

    fn pump(
        sink: Held,
    ) -> (
        mpsc::UnboundedSender<Item>,
        Pump<StreamBody<mpsc::UnboundedReceiver<Item>>, Held>,
    ) {
        let (tx, rx) = mpsc::unbounded();
        (tx, Pump::new(StreamBody::new(rx), sink))
    }

    fn poll<B: Body<Error = BoxError>>(p: &mut Pump<B, Held>) -> Poll<PumpEnd> {
        p.poll(&mut Context::from_waker(noop_waker_ref()))
    }

    fn data(s: &'static str) -> Item {
        Ok(Frame::data(Bytes::from_static(s.as_bytes())))
    }

    #[test]
    fn a_piece_goes_out_when_the_source_pauses() {
        let (tx, mut p) = pump(Held {
            open: true,
            ..Held::default()
        });
        tx.unbounded_send(data("one")).unwrap();
        assert!(poll(&mut p).is_pending());
        // Not held back until the next piece comes.
        assert_eq!(p.sink.out, ["one"]);
        assert_eq!((p.taken(), p.pieces()), (3, 1));
        assert_eq!(
            p.waiting(),
            Waiting {
                source: true,
                sink: false
            }
        );
        // Trailers are dropped; the end closes the sink.
        tx.unbounded_send(data("two")).unwrap();
        tx.unbounded_send(Ok(Frame::trailers(http::HeaderMap::new())))
            .unwrap();
        drop(tx);
        assert!(matches!(poll(&mut p), Poll::Ready(PumpEnd::Done)));
        assert_eq!(p.sink.out, ["one", "two"]);
        assert!(p.sink.closed);
    }

    #[test]
    fn a_sink_not_ready_stops_the_source_and_is_waited_on() {
        let (tx, mut p) = pump(Held::default());
        for s in ["one", "two", "three"] {
            tx.unbounded_send(data(s)).unwrap();
        }
        assert!(poll(&mut p).is_pending());
        // "one" is in the sink, "two" held: "three" is not read yet.
        assert_eq!(
            p.waiting(),
            Waiting {
                source: false,
                sink: true
            }
        );
        assert_eq!((p.taken(), p.pieces()), (0, 2));
        p.sink.open = true;
        assert!(poll(&mut p).is_pending());
        assert_eq!(p.sink.out, ["one", "two", "three"]);
    }

    #[test]
    fn a_bulk_body_is_flushed_and_the_pump_yields_after_64_kib() {
        let (tx, p) = pump(Held {
            open: true,
            ..Held::default()
        });
        let mut p = p.yielding(YIELD_AFTER);
        let piece = Bytes::from(vec![7u8; 40 * 1024]);
        for _ in 0..4 {
            tx.unbounded_send(Ok(Frame::data(piece.clone()))).unwrap();
        }
        let woken = Arc::new(Woken(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let poll_counted = |p: &mut Pump<_, Held>| p.poll(&mut Context::from_waker(&waker));
        // Two pieces (80 KiB) reach the sink, flushed; the pump asks to be
        // polled again at once instead of reading the third piece now.
        assert!(poll_counted(&mut p).is_pending());
        assert_eq!((p.taken(), p.pieces()), (80 * 1024, 2));
        assert_eq!(p.waiting(), Waiting::default());
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(poll_counted(&mut p).is_pending());
        assert_eq!((p.taken(), p.pieces()), (160 * 1024, 4));
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        // A small body still goes out in one poll, without a wake.
        drop(tx);
        assert!(matches!(poll_counted(&mut p), Poll::Ready(PumpEnd::Done)));
        let (tx, p) = pump(Held {
            open: true,
            ..Held::default()
        });
        let mut p = p.yielding(YIELD_AFTER);
        for s in ["one", "two", "three"] {
            tx.unbounded_send(data(s)).unwrap();
        }
        assert!(poll_counted(&mut p).is_pending());
        assert_eq!(p.sink.out, ["one", "two", "three"]);
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        // A pump not made `yielding` moves the bulk body in one poll.
        let (tx, mut p) = pump(Held {
            open: true,
            ..Held::default()
        });
        for _ in 0..4 {
            tx.unbounded_send(Ok(Frame::data(piece.clone()))).unwrap();
        }
        assert!(poll_counted(&mut p).is_pending());
        assert_eq!((p.taken(), p.pieces()), (160 * 1024, 4));
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_yielding_pump_before_a_frozen_sink_waits_instead_of_spinning() {
        let (tx, p) = pump(Held::default()); // not open: nothing is handed on
        let mut p = p.yielding(YIELD_AFTER);
        let piece = Bytes::from(vec![7u8; 80 * 1024]);
        for _ in 0..3 {
            tx.unbounded_send(Ok(Frame::data(piece.clone()))).unwrap();
        }
        let woken = Arc::new(Woken(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        for taken_from_source in [1, 2, 2, 2] {
            assert!(p.poll(&mut Context::from_waker(&waker)).is_pending());
            // One piece started, its flush pending, then one more held at
            // most: the pump waits for the sink and does not wake itself.
            assert_eq!(p.waiting(), SINK_WAITS);
            assert_eq!(woken.0.load(Ordering::SeqCst), 0);
            assert_eq!((p.taken(), p.pieces()), (0, taken_from_source));
        }
        // The sink thaws: the pieces go on, flushed after each.
        p.sink.open = true;
        drop(tx);
        let mut polls = 0;
        while p.poll(&mut Context::from_waker(&waker)).is_pending() {
            polls += 1;
            assert!(polls < 10, "the pump does not end");
        }
        assert_eq!((p.taken(), p.pieces()), (240 * 1024, 3));
        assert!(p.sink.closed);
    }

    struct Woken(AtomicUsize);

    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_source_error_and_a_refusal_end_the_pump() {
        let (tx, mut p) = pump(Held::default());
        tx.unbounded_send(data("one")).unwrap();
        tx.unbounded_send(Err("broken".into())).unwrap();
        assert!(matches!(
            poll(&mut p),
            Poll::Ready(PumpEnd::SourceFailed(_))
        ));
        // What the source gave is still in the sink: the owner flushes or drops it.
        assert_eq!(p.into_sink().pending.as_deref(), Some(&b"one"[..]));

        let (tx, mut p) = pump(Held {
            refuse: true,
            ..Held::default()
        });
        tx.unbounded_send(data("one")).unwrap();
        assert!(matches!(
            poll(&mut p),
            Poll::Ready(PumpEnd::Refused(BodyError::ClientGone))
        ));
    }
}
