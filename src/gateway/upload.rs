//! The caller's request body on its way to the worker: a task owned by the
//! request (the forward future, then the response body), with its two
//! deadlines.
//!
//! It runs on a task of its own rather than inside the response body's
//! `poll_frame`, because the body must keep moving while nobody polls the
//! response: a caller that uploads everything before it reads, against a
//! worker that echoes as it reads, would otherwise deadlock (hyper polls
//! the response body only as the caller reads it). The task's handle is
//! [`Upload`], which aborts the task when dropped: whoever drops the
//! request (a timeout layer around the service, a caller that hangs up,
//! the server after the response) stops the upload, and the stream is
//! aborted unless its body was sent whole.

use crate::rt::pump::{Pump, PumpEnd};
use crate::rt::RequestSink;
use http_body::Body;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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

/// The upload's task. Dropping it aborts the task: the sink goes unclosed,
/// so the stream is aborted (the worker gets `abort`), unless the body was
/// sent whole.
pub(crate) struct Upload {
    task: JoinHandle<UploadEnd>,
    end: Option<UploadEnd>,
}

impl Upload {
    /// Starts pouring `body` into `sink`.
    pub(super) fn spawn<B>(body: B, sink: RequestSink, deadlines: Deadlines) -> Upload
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        Upload {
            task: tokio::spawn(run(body, sink, deadlines)),
            end: None,
        }
    }

    /// Resolves when the upload ends, with how (then at once, again).
    pub(super) async fn end(&mut self) -> UploadEnd {
        if let Some(end) = self.end {
            return end;
        }
        // A task that panicked or was aborted: its sink went unclosed.
        let end = (&mut self.task).await.unwrap_or(UploadEnd::Refused);
        self.end = Some(end);
        end
    }

    /// Whether the upload has ended (as far as [`Upload::end`] has seen).
    pub(super) fn has_ended(&self) -> bool {
        self.end.is_some()
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        self.task.abort(); // a no-op for a task that has ended
    }
}

/// Pours `body` into `sink` until it ends, fails or misses a deadline.
/// On any end but [`UploadEnd::Done`] the sink is dropped unclosed: the
/// stream is aborted.
async fn run<B>(body: B, sink: RequestSink, deadlines: Deadlines) -> UploadEnd
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut pump = Pump::new(body, sink);
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
        let at = match clocks.next_deadline(&pump, Instant::now(), deadlines) {
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
        S: crate::rt::pump::BodySink,
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
