//! Relay mode: an interactive chunked upload (issue 23). A caller sends a
//! request body one piece at a time and waits for the worker's reaction
//! before sending the next, as an upload that is a conversation does. Each
//! piece must reach the worker as it comes: a relay that holds a piece
//! until the next one arrives (or until the body ends) stalls the exchange.

use crate::case;
use crate::http::{self, BodyPieces, Reader};
use crate::relay_ctx::{FakeWorker, Got, RelayCtx, STEP};
use crate::report::Outcome;
use crate::runner::{Case, Needs};
use crate::ws_send::WsSend;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use worker_relay::frame::{ControlFrame, Decoded, StreamId};

pub const R2W: &str = "§Relay-to-worker";
/// Round trips: a piece up, its echo down.
pub const ROUNDS: usize = 10;
/// How long a piece may take to reach the worker, and its echo the caller.
pub const PIECE_BOUND: Duration = Duration::from_secs(2);

pub fn cases() -> Vec<Case<RelayCtx>> {
    vec![case!(RelayCtx, "relay.upload.interactive", R2W, Needs::Any, long = false, terminal = false,
        "a chunked upload sent a piece at a time: each piece reaches the worker within 2 s, before the next is sent (recommended: WARN), and its echo the caller within 2 s (10 round trips)", interactive)]
}

/// Piece `i` of an interactive body: distinct bytes, lengths that differ.
pub fn piece(i: usize) -> Vec<u8> {
    let mut p = format!("piece {:02} of {ROUNDS}:", i + 1).into_bytes();
    p.extend((0..40 + 37 * i).map(|k| b'a' + ((i + k) % 26) as u8));
    p
}

/// `p50 X ms, max Y ms` of `times`.
pub fn spread(times: &mut [Duration]) -> String {
    times.sort();
    let p50 = times.get(times.len() / 2).copied().unwrap_or_default();
    let max = times.last().copied().unwrap_or_default();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!("p50 {:.1} ms, max {:.1} ms", ms(p50), ms(max))
}

/// Reads `id`'s frames until its `end` (true) or `abort` (false): how it
/// ended and how many more body bytes came first.
async fn rest_of(w: &mut FakeWorker, id: StreamId, within: Duration) -> (Option<bool>, usize) {
    let deadline = Instant::now() + within;
    let mut n = 0;
    loop {
        match w
            .next(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            Got::Frame(Decoded::Chunk(c)) if c.id == id => n += c.data.len(),
            Got::Frame(Decoded::Control(ControlFrame::End { id: e })) if e == id => {
                return (Some(true), n)
            }
            Got::Frame(Decoded::Control(ControlFrame::Abort { id: e })) if e == id => {
                return (Some(false), n)
            }
            Got::Timeout | Got::Closed(_) => return (None, n),
            _ => {}
        }
    }
}

macro_rules! tryf {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Outcome::Fail(e.to_string()),
        }
    };
}

async fn interactive(ctx: &mut RelayCtx) -> Outcome {
    let path = "/conformance/interactive";
    let target = ctx.target(path);
    let authority = ctx.t.authority.clone();
    let w = tryf!(ctx.worker().await);
    let mut s = tryf!(http::connect(&authority, STEP).await);
    let head = http::head(
        "POST",
        &target,
        &authority,
        &[
            ("transfer-encoding", "chunked"),
            ("content-type", "application/octet-stream"),
        ],
    );
    tryf!(http::write_all(&mut s, &head, STEP).await);
    let (rd, mut wr) = s.split();
    let mut reader = Some(Reader::new(rd, STEP));
    let mut pieces: Option<BodyPieces<_>> = None;
    let mut id: Option<StreamId> = None;
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        let n = i + 1;
        let piece = piece(i);
        let mut wire = format!("{:x}\r\n", piece.len()).into_bytes();
        wire.extend_from_slice(&piece);
        wire.extend_from_slice(b"\r\n");
        let sent = Instant::now();
        match tokio::time::timeout(STEP, wr.write_all(&wire)).await {
            Ok(Ok(())) => {}
            _ => return Outcome::Fail(format!("the relay did not take piece {n} from the caller")),
        }
        // The worker: the request (with the first piece, or before it), then the piece.
        let deadline = sent + PIECE_BOUND;
        let mut got = Vec::new();
        while got.len() < piece.len() {
            match w
                .next(deadline.saturating_duration_since(Instant::now()))
                .await
            {
                Got::Frame(Decoded::Control(ControlFrame::Request { id: i, head }))
                    if id.is_none() && head.path().starts_with(path) =>
                {
                    id = Some(i);
                    let h = [("content-type", "application/octet-stream")];
                    tryf!(w.respond_head(i, 200, &h).await);
                }
                Got::Frame(Decoded::Chunk(c)) if Some(c.id) == id => got.extend_from_slice(&c.data),
                Got::Frame(Decoded::Control(ControlFrame::End { id: e }))
                | Got::Frame(Decoded::Control(ControlFrame::Abort { id: e }))
                    if Some(e) == id =>
                {
                    return Outcome::Fail(format!(
                        "the relay ended the request after {} of piece {n}'s {} bytes",
                        got.len(),
                        piece.len()
                    ))
                }
                Got::Timeout => {
                    let what = match id {
                        None => "no request frame came".to_string(),
                        Some(_) => format!("{} of its {} bytes came", got.len(), piece.len()),
                    };
                    // The spec does not ask a relay to stream an upload
                    // piece by piece: a recommendation.
                    return Outcome::Warn(format!(
                        "piece {n} of {ROUNDS} did not reach the worker within {} s of the caller sending it ({what}): the relay holds the pieces of an upload (forwarding them as they come is recommended)",
                        PIECE_BOUND.as_secs()
                    ));
                }
                Got::Closed(c) => {
                    return Outcome::Fail(format!(
                        "the relay closed the worker's connection ({c:?})"
                    ))
                }
                _ => {}
            }
        }
        up.push(sent.elapsed());
        if got != piece {
            return Outcome::Fail(format!("piece {n} reached the worker altered"));
        }
        // Its echo, down to the caller.
        let id = id.expect("a request came");
        let echoed_at = Instant::now();
        tryf!(w.send_chunk(id, &piece).await);
        if let Some(mut r) = reader.take() {
            r.deadline = echoed_at + PIECE_BOUND;
            let h = match r.head().await {
                Ok(h) if h.status == 200 => h,
                Ok(h) => {
                    return Outcome::Fail(format!(
                        "the caller got {} for the worker's 200",
                        h.status
                    ))
                }
                Err(e) => {
                    return Outcome::Fail(format!("no response head reached the caller: {e}"))
                }
            };
            pieces = Some(BodyPieces::new(r, &h));
        }
        let p = pieces.as_mut().expect("a head");
        let mut echo = Vec::new();
        match p
            .read(
                piece.len(),
                &mut echo,
                PIECE_BOUND.saturating_sub(echoed_at.elapsed()),
            )
            .await
        {
            Ok(()) if echo == piece => down.push(echoed_at.elapsed()),
            Ok(()) => {
                return Outcome::Fail(format!(
                    "the echo of piece {n} reached the caller altered or cut ({} of {} bytes)",
                    echo.len(),
                    piece.len()
                ))
            }
            Err(e) => {
                return Outcome::Fail(format!(
                "the echo of piece {n} did not reach the caller within {} s ({} of {} bytes): {e}",
                PIECE_BOUND.as_secs(), echo.len(), piece.len()
            ))
            }
        }
    }
    // The end, both ways.
    match tokio::time::timeout(STEP, wr.write_all(b"0\r\n\r\n")).await {
        Ok(Ok(())) => {}
        _ => return Outcome::Fail("the relay did not take the upload's last chunk".into()),
    }
    let id = id.expect("a request came");
    let rest = rest_of(w, id, STEP).await;
    tryf!(w.send_control(&ControlFrame::End { id }).await);
    let p = pieces.as_mut().expect("a head");
    let mut after = Vec::new();
    let _ = p.read(usize::MAX, &mut after, STEP).await;
    let ok = rest == (Some(true), 0) && after.is_empty() && p.ended;
    let figure = format!(
        "{ROUNDS} round trips: each piece reached the worker in {}, its echo the caller in {} (bound {} s each); then the request {} and the response {}",
        spread(&mut up),
        spread(&mut down),
        PIECE_BOUND.as_secs(),
        match rest {
            (Some(true), 0) => "ended".to_string(),
            (Some(true), n) => format!("ended after {n} more bytes"),
            (Some(false), _) => "was aborted".into(),
            (None, _) => "never ended".into(),
        },
        if p.ended && after.is_empty() { "completed" } else { "did not complete" }
    );
    if ok {
        Outcome::Pass(figure)
    } else {
        Outcome::Fail(figure)
    }
}
