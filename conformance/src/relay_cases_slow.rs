//! Relay mode, time: a response the worker sends late (a cell running).
//! The spec: "the relay holds its caller's request open meanwhile, so it
//! should allow at least as long as the longest cell timeout".

use crate::case;
use crate::http::Response;
use crate::relay_cases_http::call;
use crate::relay_ctx::{Got, RelayCtx, STEP};
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use std::io;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use worker_relay::frame::{ControlFrame, Decoded};

const W2R: &str = "§Worker-to-relay";
/// How long the kit's worker takes to answer.
const HOLD: Duration = Duration::from_secs(15);

pub fn cases() -> Vec<Case<RelayCtx>> {
    vec![case!(RelayCtx, "relay.timeout.slow-response", W2R, Needs::Any, long = false, terminal = false,
        "a response the worker sends 15 s after the request (a cell running) reaches the caller: no abort, no 5xx meanwhile", slow_response)]
}

macro_rules! tryf {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Outcome::Fail(e.to_string()),
        }
    };
}

fn early(caller: &JoinHandle<io::Result<Response>>, start: Instant) -> Option<String> {
    caller.is_finished().then(|| {
        format!(
            "the caller got its answer after {:.1} s, before the worker sent one",
            start.elapsed().as_secs_f64()
        )
    })
}

async fn slow_response(ctx: &mut RelayCtx) -> Outcome {
    let target = ctx.target("/v1/execute");
    let caller = call(
        ctx,
        "POST",
        &target,
        &[("content-length", "2")],
        b"{}".to_vec(),
    );
    let w = tryf!(ctx.worker().await);
    let (id, head) = tryf!(w.expect_request("/v1/execute", STEP).await);
    let start = Instant::now();
    let body = w.read_body(id, head, STEP).await;
    if body.ended != Some(true) {
        return Outcome::Fail(format!("the request's body did not end ({:?})", body.ended));
    }
    // Hold the answer, reading what the relay sends meanwhile.
    while start.elapsed() < HOLD {
        if let Some(why) = early(&caller, start) {
            return Outcome::Fail(why);
        }
        let left = HOLD
            .saturating_sub(start.elapsed())
            .min(Duration::from_millis(500));
        match w.next(left).await {
            Got::Frame(Decoded::Control(ControlFrame::Abort { id: i })) if i == id => {
                return Outcome::Fail(format!(
                    "the relay aborted the stream after {:.1} s without an answer",
                    start.elapsed().as_secs_f64()
                ))
            }
            Got::Closed(code) => {
                return Outcome::Fail(format!(
                    "the relay closed the worker's connection ({code:?}) after {:.1} s of waiting",
                    start.elapsed().as_secs_f64()
                ))
            }
            _ => continue,
        }
    }
    if let Some(why) = early(&caller, start) {
        return Outcome::Fail(why);
    }
    tryf!(
        w.respond(id, 200, &[("content-length", "4")], b"done")
            .await
    );
    let r = match tokio::time::timeout(STEP, caller).await {
        Ok(Ok(Ok(r))) => r,
        Ok(Ok(Err(e))) => return Outcome::Fail(format!("the caller failed: {e}")),
        Ok(Err(e)) => return Outcome::Fail(format!("the caller's task failed: {e}")),
        Err(_) => return Outcome::Fail("the caller got no answer in time".into()),
    };
    judge(
        r.status == 200 && r.body == b"done" && r.complete,
        format!(
            "answered after {:.1} s: the caller got {} with {} body bytes ({})",
            start.elapsed().as_secs_f64(),
            r.status,
            r.body.len(),
            if r.complete { "complete" } else { "cut off" }
        ),
    )
}
