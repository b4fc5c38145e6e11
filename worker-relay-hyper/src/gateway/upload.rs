//! The caller's request body on its way to the worker: a task owned by the
//! request (the forward future, then the response body), with its two
//! deadlines, and what is left of the body discarded once the worker no
//! longer needs it.
//!
//! It runs on a task of its own rather than inside the response body's
//! `poll_frame`, because the body must keep moving while nobody polls the
//! response: a caller that uploads everything before it reads, against a
//! worker that echoes as it reads, would otherwise deadlock (hyper polls
//! the response body only as the caller reads it). The task's handle is
//! [`Upload`]: whoever drops it (a timeout layer around the service, a
//! caller that hangs up, the server after the response) stops the upload,
//! and the stream is aborted unless its body was sent whole.
//!
//! What the caller has not sent yet is then read and discarded for a while
//! (nginx's lingering close), not dropped: hyper closes a connection whose
//! request body was dropped unread, and a caller still writing its body
//! then gets a reset, often before it has read the answer (a 401 to a
//! large POST reached the caller as `EPIPE` in about one run of three).
//! The discarding ends with the body, or when the caller sends nothing for
//! the upload timeout, or after [`Deadlines::linger`] in all, or once
//! [`Deadlines::linger_bytes`] are discarded. The relay's own refusals
//! (404, 503 and the like, given before any worker saw the request) discard
//! the body they leave unread the same way ([`discard`]).

use crate::pump::{Pump, PumpEnd};
use bytes::Buf;
use http_body::Body;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use worker_relay::rt::RequestSink;

use super::BoxError;

/// The upload's deadlines.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    /// The longest the caller may send nothing while the upload waits for
    /// it (then 408).
    pub upload: Duration,
    /// The longest the worker's side may take nothing while the upload has
    /// something for it (then 504).
    pub send: Duration,
    /// The longest what is left of the caller's body is read and discarded
    /// once the worker no longer needs it.
    pub linger: Duration,
    /// The most of the caller's body read and discarded once the worker
    /// (or the relay) no longer needs it.
    pub linger_bytes: u64,
}

/// How an upload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UploadEnd {
    /// Sent whole: `end` is queued.
    Done,
    /// The stream is over on the worker's side (it answered in full, or
    /// the stream failed): the response says how.
    Refused,
    /// The caller's body failed (a reset, a malformed chunked body).
    Failed,
    /// The caller sent nothing for the upload timeout.
    Stalled,
    /// The worker's side took nothing for the send timeout.
    SendTimedOut,
}

/// The upload's task. Dropping it stops the upload: the sink goes
/// unclosed, so the stream is aborted (the worker gets `abort`), unless the
/// body was sent whole; what is left of the body is then discarded.
pub(crate) struct Upload {
    /// How the upload ended, from the task.
    ended: oneshot::Receiver<UploadEnd>,
    end: Option<UploadEnd>,
    /// Dropped with the upload: the task stops pumping.
    _stop: oneshot::Sender<()>,
}

impl Upload {
    /// Starts pouring `body` into `sink`.
    pub(super) fn spawn<B>(body: B, sink: RequestSink, deadlines: Deadlines) -> Upload
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let (ended_tx, ended) = oneshot::channel();
        let (_stop, stop) = oneshot::channel();
        tokio::spawn(async move {
            let mut pump = Pump::new(body, sink);
            let end = tokio::select! {
                biased;
                end = run(&mut pump, deadlines) => Some(end),
                _ = stop => None,
            };
            if let Some(end) = end {
                let _ = ended_tx.send(end);
            }
            let (body, sink) = pump.into_parts();
            drop(sink); // unclosed unless `end` is queued: the stream is aborted
            match end {
                // Nothing left, or a caller that stalls or sends a broken
                // body: nothing worth reading.
                Some(UploadEnd::Done | UploadEnd::Stalled | UploadEnd::Failed) => {}
                _ => discard(body, deadlines).await,
            }
        });
        Upload {
            ended,
            end: None,
            _stop,
        }
    }

    /// Resolves when the upload ends, with how (then at once, again).
    pub(super) async fn end(&mut self) -> UploadEnd {
        if let Some(end) = self.end {
            return end;
        }
        // A task that panicked: its sink went unclosed.
        let end = (&mut self.ended).await.unwrap_or(UploadEnd::Refused);
        self.end = Some(end);
        end
    }

    /// Whether the upload has ended (as far as [`Upload::end`] has seen).
    pub(super) fn has_ended(&self) -> bool {
        self.end.is_some()
    }
}

/// Reads and discards what is left of `body`, until it ends or fails, the
/// caller sends nothing for the upload timeout, the linger time is up, or
/// the linger bytes are read (a body that says it is longer than that is
/// let go at once: reading it would only delay the reset).
pub(super) async fn discard<B>(mut body: B, deadlines: Deadlines)
where
    B: Body + Unpin,
{
    if body.size_hint().lower() > deadlines.linger_bytes {
        tracing::debug!(
            "let go of a request body longer than the {} bytes discarded at most",
            deadlines.linger_bytes
        );
        return;
    }
    let until = after(Instant::now(), deadlines.linger);
    let mut discarded = 0u64;
    while discarded <= deadlines.linger_bytes {
        let idle = after(Instant::now(), deadlines.upload);
        let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        match tokio::time::timeout_at(idle.min(until), frame).await {
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    discarded = discarded.saturating_add(data.remaining() as u64);
                }
                if body.is_end_stream() {
                    break;
                }
            }
            Ok(None) | Ok(Some(Err(_))) => break,
            Err(_) => {
                tracing::debug!("let go of a request body after discarding {discarded} bytes");
                return;
            }
        }
    }
    if discarded > deadlines.linger_bytes {
        tracing::debug!("let go of a request body after discarding {discarded} bytes");
        return;
    }
    tracing::debug!("discarded the last {discarded} bytes of a request body");
}

/// `now + d`, or a century on for a `d` too long to add (a configured
/// `Duration::MAX` means "no limit", never a panic).
pub(super) fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

/// What "for ever" is when a deadline would overflow.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Pours the pump's body into its sink until it ends, fails or misses a
/// deadline.
async fn run<B>(pump: &mut Pump<B, RequestSink>, deadlines: Deadlines) -> UploadEnd
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut clocks = Clocks::default();
    let mut timer = pin!(tokio::time::sleep(Duration::ZERO));
    poll_fn(|cx| loop {
        match pump.poll(cx) {
            Poll::Ready(PumpEnd::Done) => return Poll::Ready(UploadEnd::Done),
            Poll::Ready(PumpEnd::Refused(e)) => {
                tracing::debug!("the request body was refused: {e}");
                return Poll::Ready(UploadEnd::Refused);
            }
            Poll::Ready(PumpEnd::SourceFailed(e)) => {
                tracing::debug!("the caller's request body failed: {e}");
                return Poll::Ready(UploadEnd::Failed);
            }
            Poll::Pending => {}
        }
        let at = match clocks.next_deadline(pump, Instant::now(), deadlines) {
            Ok(Some(at)) => at,
            Ok(None) => return Poll::Pending,
            Err(end) => return Poll::Ready(end),
        };
        if timer.deadline() != at {
            timer.as_mut().reset(at);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        // The timer fired: look again (the pump may have moved meanwhile).
    })
    .await
}

/// When the pump started waiting on each side without progress.
#[derive(Default)]
struct Clocks {
    /// Since when the source has given nothing, and its piece count then.
    source: Option<(Instant, u64)>,
    /// Since when the sink has taken nothing, and its byte count then.
    sink: Option<(Instant, u64)>,
}

impl Clocks {
    /// Updates the clocks after a pending poll: the next deadline, or the
    /// end if one has passed.
    fn next_deadline<B, S>(
        &mut self,
        pump: &Pump<B, S>,
        now: Instant,
        deadlines: Deadlines,
    ) -> Result<Option<Instant>, UploadEnd>
    where
        S: crate::pump::BodySink,
    {
        let waiting = pump.waiting();
        let restart = |clock: Option<(Instant, u64)>, count: u64| match clock {
            Some((since, c)) if c == count => (since, c),
            _ => (now, count),
        };
        self.source = waiting.source.then(|| restart(self.source, pump.pieces()));
        self.sink = waiting.sink.then(|| restart(self.sink, pump.taken()));
        let sink_at = self.sink.and_then(|(t, _)| t.checked_add(deadlines.send));
        let source_at = self
            .source
            .and_then(|(t, _)| t.checked_add(deadlines.upload));
        if sink_at.is_some_and(|at| at <= now) {
            return Err(UploadEnd::SendTimedOut);
        }
        if source_at.is_some_and(|at| at <= now) {
            return Err(UploadEnd::Stalled);
        }
        Ok(sink_at.into_iter().chain(source_at).min())
    }
}
