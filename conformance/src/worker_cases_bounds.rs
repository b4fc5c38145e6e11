//! Worker mode, the edges of two rules: a message of exactly the largest
//! size is taken (one byte more is refused, `worker.oversize.1009`), and a
//! handshake that succeeds resets the reconnect delay to 1 s.

use crate::case;
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::worker_ctx::{Answer, WorkerCtx, STEP};
use crate::ws_send::WsSend;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as WsMsg;
use worker_relay::frame::{self, StreamId, MAX_MESSAGE_LEN};

const CONNECTING: &str = "§Connecting";
const FRAMES: &str = "§Frames";

pub fn cases() -> Vec<Case<WorkerCtx>> {
    vec![
        case!(WorkerCtx, "worker.oversize.exact-limit", FRAMES, Needs::Any, long = false, terminal = false,
            "a message of exactly 1 MiB + 4 bytes (a full chunk, for an id not open) is taken: no close, /health answered", exact_limit),
        case!(WorkerCtx, "worker.oversize.text-1009", FRAMES, Needs::Any, long = false, terminal = false,
            "a text message of 1 MiB + 5 bytes (the limit holds for every message, not only chunks) makes the worker close with 1009", text_oversize),
        case!(WorkerCtx, "worker.backoff.reset", CONNECTING, Needs::Any, long = false, terminal = false,
            "after refusals 503, 503 and a handshake that succeeds, a close is redialled within [0.5, 1] s: the delay went back to 1 s", backoff_reset),
    ]
}

macro_rules! tryf {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Outcome::Fail(e.to_string()),
        }
    };
}

async fn exact_limit(ctx: &mut WorkerCtx) -> Outcome {
    let c = tryf!(ctx.conn().await);
    let id = StreamId::new(4243).expect("id");
    let full = frame::encode_chunk(id, &vec![0x5a; MAX_MESSAGE_LEN - 4]);
    let len = full.len();
    tryf!(c.send(WsMsg::Binary(full)).await);
    let answered = c.responsive(STEP).await;
    match (answered, c.closed) {
        (Some(t), None) => Outcome::Pass(format!(
            "a {len}-byte message for an id not open: connection kept, /health answered in {} ms",
            t.as_millis()
        )),
        (_, Some(code)) => {
            ctx.conn = None;
            Outcome::Fail(format!(
                "a {len}-byte message (the largest the spec allows: 1 MiB of body + 4 bytes of id) closed the connection ({code:?})"
            ))
        }
        (None, None) => Outcome::Fail(format!(
            "after a {len}-byte message /health was not answered in {} s",
            STEP.as_secs()
        )),
    }
}

async fn text_oversize(ctx: &mut WorkerCtx) -> Outcome {
    // A JSON object of an unknown type, padded past the limit: only its size is wrong.
    let head = r#"{"type":"conformance-padding","pad":""#;
    let mut text = String::with_capacity(MAX_MESSAGE_LEN + 1);
    text.push_str(head);
    text.extend(std::iter::repeat_n(
        'x',
        MAX_MESSAGE_LEN + 1 - head.len() - 2,
    ));
    text.push_str("\"}");
    crate::worker_cases_conn::closes_with_1009(ctx, WsMsg::Text(text.into()), "text message").await
}

async fn backoff_reset(ctx: &mut WorkerCtx) -> Outcome {
    tryf!(ctx.conn().await);
    let mut last = ctx.hang_up().await.expect("connected");
    let mut gaps = Vec::new();
    for answer in [Answer::Refuse(503), Answer::Refuse(503), Answer::Accept] {
        let (s, hs) = tryf!(ctx.next_dial(Duration::from_secs(20)).await);
        gaps.push(hs.at.duration_since(last).as_secs_f64());
        if let Some(c) = tryf!(ctx.answer(s, &hs, answer).await) {
            ctx.conn = Some(c);
        }
        last = Instant::now();
    }
    // The handshake succeeded: let the worker see it, then close.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let closed = ctx.hang_up().await.unwrap_or(last);
    let (s, hs) = tryf!(ctx.next_dial(Duration::from_secs(20)).await);
    let gap = hs.at.duration_since(closed).as_secs_f64();
    ctx.conn = tryf!(ctx.answer(s, &hs, Answer::Accept).await);
    let figure = format!(
        "refused twice (gaps {:.2}, {:.2} s), accepted after {:.2} s; after a close it redialled in {gap:.2} s (window [0.5, 1])",
        gaps[0], gaps[1], gaps[2]
    );
    // As in worker.backoff.jitter: the dial's own latency is on top, 0.1 s
    // early is clock noise. A delay not reset would be 4 s: [2, 4].
    judge((0.4..=1.9).contains(&gap), figure)
}
