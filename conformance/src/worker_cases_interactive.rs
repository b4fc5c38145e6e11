//! Worker mode: an interactive upload (issue 23), the worker's half. The
//! kit, as the relay, sends a body to the example app's `/echo` one piece at
//! a time, without Content-Length (as a relay forwards a chunked upload),
//! and waits for each piece's echo before sending the next: the worker must
//! hand each piece to its app as it comes, and send what the app answers as
//! it is produced.

use crate::case;
use crate::relay_cases_interactive::{piece, spread, PIECE_BOUND, ROUNDS};
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::worker_ctx::{WorkerCtx, STEP};
use crate::ws_send::WsSend;
use std::time::Instant;
use worker_relay::frame::ControlFrame;

pub const R2W: &str = "§Relay-to-worker";

pub fn cases() -> Vec<Case<WorkerCtx>> {
    vec![case!(WorkerCtx, "worker.upload.interactive", R2W, Needs::Example, long = false, terminal = false,
        "a body sent to /echo a piece at a time (no Content-Length): each piece's echo comes back within 2 s, before the next is sent (10 round trips)", interactive)]
}

async fn interactive(ctx: &mut WorkerCtx) -> Outcome {
    let mut h = ctx.auth();
    h.push(("content-type".into(), "application/octet-stream".into()));
    let c = match ctx.conn().await {
        Ok(c) => c,
        Err(e) => return Outcome::Fail(e),
    };
    let id = c.fresh_id();
    let k = id.get();
    if let Err(e) = c.request(id, "POST", "/echo", "", &h, b"", false).await {
        return Outcome::Fail(e);
    }
    let mut whole = Vec::new();
    let mut times = Vec::new();
    for i in 0..ROUNDS {
        let piece = piece(i);
        whole.extend_from_slice(&piece);
        let want = whole.len();
        let sent = Instant::now();
        if let Err(e) = c.send_chunk(id, &piece).await {
            return Outcome::Fail(e);
        }
        c.until(PIECE_BOUND, |m| {
            m.get(&k).is_some_and(|s| {
                s.body.len() >= want || s.ended || s.aborted || s.status.is_some_and(|s| s != 200)
            })
        })
        .await;
        let a = c.streams.get(&k).cloned().unwrap_or_default();
        if crate::worker_app_contract::lacks_route(a.status) {
            let _ = c.send_control(&ControlFrame::Abort { id }).await;
            return crate::worker_app_contract::skip_route("POST /echo", a.status);
        }
        if a.body.len() < want || a.status != Some(200) {
            let _ = c.send_control(&ControlFrame::Abort { id }).await;
            return Outcome::Fail(format!(
                "the echo of piece {} of {ROUNDS} did not come back within {} s of sending it (response {}, {} of {want} bytes echoed{})",
                i + 1,
                PIECE_BOUND.as_secs(),
                a.status.map_or("none yet".into(), |s| s.to_string()),
                a.body.len(),
                if a.ended || a.aborted { ", stream over" } else { "" }
            ));
        }
        times.push(sent.elapsed());
    }
    if let Err(e) = c.send_control(&ControlFrame::End { id }).await {
        return Outcome::Fail(e);
    }
    let a = c.finished(id, STEP).await;
    judge(
        a.body == whole && a.ended && !a.aborted,
        format!(
            "{ROUNDS} round trips, each piece's echo in {} (bound {} s); then {} of {} bytes in all, {}",
            spread(&mut times),
            PIECE_BOUND.as_secs(),
            a.body.len(),
            whole.len(),
            if a.ended { "end" } else if a.aborted { "abort" } else { "neither end nor abort" }
        ),
    )
}
