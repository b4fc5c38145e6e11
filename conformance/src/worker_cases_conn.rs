//! Worker mode, the connection: oversize messages, keepalive, reconnect
//! backoff with jitter, final refusals.

use crate::case;
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::worker_ctx::{Answer, WorkerCtx, STEP};
use crate::ws_send::WsSend;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMsg;
use worker_relay::frame::{self, StreamId, MAX_MESSAGE_LEN};

pub const CONNECTING: &str = "§Connecting";
pub const FRAMES: &str = "§Frames";

pub fn cases() -> Vec<Case<WorkerCtx>> {
    vec![
        case!(WorkerCtx, "worker.oversize.1009", FRAMES, Needs::Any, long = false, terminal = false,
            "a message of 1 MiB + 5 bytes makes the worker close with 1009", oversize),
        case!(WorkerCtx, "worker.keepalive.ping", CONNECTING, Needs::Any, long = true, terminal = false,
            "an idle worker pings within 25 s of connecting (the spec: every 20 s)", keepalive_ping),
        case!(WorkerCtx, "worker.keepalive.no-pong", CONNECTING, Needs::Any, long = false, terminal = false,
            "a relay that never answers pings is dropped within 20 s (+5 s) of the ping", keepalive_no_pong),
        case!(WorkerCtx, "worker.backoff.jitter", CONNECTING, Needs::Any, long = false, terminal = false,
            "after a close and refusals 503, 429, 408 the redials wait within [d/2, d] for d = 1, 2, 4, 8 s, with jitter", backoff),
        case!(WorkerCtx, "worker.refusal.final", CONNECTING, Needs::Any, long = false, terminal = true,
            "refused with 401, the worker does not dial again (it exits)", refusal_final),
        case!(WorkerCtx, "worker.handshake.subprotocol-required", CONNECTING, Needs::Any, long = false, terminal = true,
            "a 101 that selects no subprotocol is refused: the worker serves nothing on it", subprotocol_required),
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

async fn oversize(ctx: &mut WorkerCtx) -> Outcome {
    let id = StreamId::new(4242).expect("id");
    let big = frame::encode_chunk(id, &vec![0u8; MAX_MESSAGE_LEN + 1 - 4]);
    closes_with_1009(ctx, WsMsg::Binary(big), "message").await
}

/// Sends `msg` (over the limit) and judges how the worker closed: 1009, in
/// time. `what` names the message in the figure.
pub async fn closes_with_1009(ctx: &mut WorkerCtx, msg: WsMsg, what: &str) -> Outcome {
    let c = tryf!(ctx.conn().await);
    let len = msg.len();
    let start = Instant::now();
    // The worker may close before it has read all of it: a failed send is fine.
    let _ = c.send(msg).await;
    let deadline = Instant::now() + STEP;
    while c.closed.is_none() && Instant::now() < deadline {
        c.step(deadline.saturating_duration_since(Instant::now()))
            .await;
    }
    let closed = c.closed;
    ctx.conn = None;
    match closed {
        Some(Some(1009)) => Outcome::Pass(format!(
            "a {len}-byte {what}: closed with 1009 in {} ms",
            start.elapsed().as_millis()
        )),
        Some(Some(code)) => {
            Outcome::Fail(format!("a {len}-byte {what}: closed with {code}, not 1009"))
        }
        Some(None) => Outcome::Fail(format!(
            "a {len}-byte {what}: the connection dropped without a close frame"
        )),
        None => Outcome::Fail(format!(
            "a {len}-byte {what}: the connection stayed open (the limit is on every message)"
        )),
    }
}

async fn keepalive_ping(ctx: &mut WorkerCtx) -> Outcome {
    ctx.hang_up().await;
    let c = tryf!(ctx.conn().await);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(30);
    while c.pings.is_empty() && c.closed.is_none() && Instant::now() < deadline {
        c.step(deadline.saturating_duration_since(Instant::now()))
            .await;
    }
    match c.pings.first() {
        Some(at) => {
            let after = at.duration_since(start).as_secs_f64();
            judge(
                after <= 25.0,
                format!("first ping {after:.1} s after connecting"),
            )
        }
        None => Outcome::Fail("no ping within 30 s of connecting".into()),
    }
}

/// One frame a client sent: (opcode, unmasked payload).
async fn raw_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).await?;
    let opcode = h[0] & 0x0f;
    let masked = h[1] & 0x80 != 0;
    let mut len = (h[1] & 0x7f) as u64;
    if len == 126 {
        let mut b = [0u8; 2];
        s.read_exact(&mut b).await?;
        len = u16::from_be_bytes(b) as u64;
    } else if len == 127 {
        let mut b = [0u8; 8];
        s.read_exact(&mut b).await?;
        len = u64::from_be_bytes(b);
    }
    if len > 2 * MAX_MESSAGE_LEN as u64 {
        return Err(std::io::Error::other("frame too long"));
    }
    let mut key = [0u8; 4];
    if masked {
        s.read_exact(&mut key).await?;
    }
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload).await?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= key[i % 4];
        }
    }
    Ok((opcode, payload))
}

async fn keepalive_no_pong(ctx: &mut WorkerCtx) -> Outcome {
    ctx.hang_up().await;
    let (s, hs) = tryf!(ctx.next_dial(STEP * 3).await);
    let mut s = tryf!(ctx.accept_raw(s, &hs).await);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(75);
    let mut first_ping = None;
    let end = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, raw_frame(&mut s)).await {
            Err(_) => break None,
            Ok(Err(_)) => break Some((Instant::now(), None)),
            Ok(Ok((0x9, _))) => {
                first_ping.get_or_insert(Instant::now());
            }
            Ok(Ok((0x8, p))) => {
                let code = (p.len() >= 2).then(|| u16::from_be_bytes([p[0], p[1]]));
                break Some((Instant::now(), code));
            }
            Ok(Ok(_)) => {}
        }
    };
    let Some(ping) = first_ping else {
        return Outcome::Fail("no ping within the connection's life".into());
    };
    let ping_s = ping.duration_since(start).as_secs_f64();
    match end {
        None => Outcome::Fail(format!(
            "first ping at {ping_s:.1} s, never answered; the connection was still open at 75 s"
        )),
        Some((at, code)) => {
            let after = at.duration_since(ping).as_secs_f64();
            let code = code.map_or("without a close frame".into(), |c| format!("with {c}"));
            judge(
                after <= 25.0,
                format!(
                    "first ping at {ping_s:.1} s, unanswered; closed {code} {after:.1} s after it"
                ),
            )
        }
    }
}

async fn backoff(ctx: &mut WorkerCtx) -> Outcome {
    tryf!(ctx.conn().await);
    let mut last = ctx.hang_up().await.expect("connected");
    let mut gaps = Vec::new();
    for answer in [
        Answer::Refuse(503),
        Answer::Refuse(429),
        Answer::Refuse(408),
        Answer::Accept,
    ] {
        let (s, hs) = tryf!(ctx.next_dial(Duration::from_secs(20)).await);
        gaps.push(hs.at.duration_since(last).as_secs_f64());
        last = Instant::now();
        if let Some(c) = tryf!(ctx.answer(s, &hs, answer).await) {
            ctx.conn = Some(c);
        }
    }
    let windows = [1.0, 2.0, 4.0, 8.0];
    let ratios: Vec<f64> = gaps.iter().zip(windows).map(|(g, d)| g / d).collect();
    // The dial's own latency is on top of the wait; 0.1 s early is clock noise.
    let within = gaps
        .iter()
        .zip(windows)
        .all(|(g, d)| *g >= d / 2.0 - 0.1 && *g <= d + 0.75);
    let no_jitter =
        ratios.iter().all(|r| *r > 0.97) || ratios.iter().all(|r| (r - 0.5).abs() < 0.03);
    let figure = format!(
        "gaps {} s (windows [0.5,1] [1,2] [2,4] [4,8]); ratios {}",
        gaps.iter()
            .map(|g| format!("{g:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if no_jitter && within {
        return Outcome::Fail(format!(
            "{figure}: the same fraction of every delay, no jitter"
        ));
    }
    judge(within, figure)
}

async fn refusal_final(ctx: &mut WorkerCtx) -> Outcome {
    tryf!(ctx.conn().await);
    ctx.hang_up().await;
    let (s, hs) = tryf!(ctx.next_dial(Duration::from_secs(20)).await);
    tryf!(ctx.answer(s, &hs, Answer::Refuse(401)).await);
    let refused = Instant::now();
    let wait = ctx.t.final_wait;
    // A worker the kit started: its exit ends the wait (a dial before it
    // exits is still queued on the listener, and seen below).
    let exited = match ctx.exec.as_mut() {
        Some(x) => x.wait_exit(wait).await,
        None => None,
    };
    if let Some(status) = exited {
        return match ctx.next_dial(Duration::from_millis(300)).await {
            Ok((_, again)) => Outcome::Fail(format!(
                "refused with 401, it dialled again after {:.1} s, then exited ({status})",
                again.at.duration_since(refused).as_secs_f64()
            )),
            // The spec: strata-worker "exits with status 1".
            Err(_) if status.code() == Some(1) => Outcome::Pass(format!(
                "refused with 401: no dial again; the worker exited ({status}) after {:.1} s",
                refused.elapsed().as_secs_f64()
            )),
            Err(_) => Outcome::Warn(format!(
                "refused with 401: no dial again, but the worker exited with {status}, not 1 (strata-worker exits 1: a supervisor tells a refusal by it)"
            )),
        };
    }
    match ctx.next_dial(wait.saturating_sub(refused.elapsed())).await {
        Ok((_, again)) => Outcome::Fail(format!(
            "refused with 401, it dialled again after {:.1} s",
            again.at.duration_since(refused).as_secs_f64()
        )),
        Err(_) => Outcome::Pass(format!(
            "refused with 401: no dial in the next {} s",
            wait.as_secs()
        )),
    }
}

async fn subprotocol_required(ctx: &mut WorkerCtx) -> Outcome {
    tryf!(ctx.conn().await);
    ctx.hang_up().await;
    let (s, hs) = tryf!(ctx.next_dial(Duration::from_secs(20)).await);
    let Some(mut c) = tryf!(ctx.answer(s, &hs, Answer::AcceptWithoutProtocol).await) else {
        return Outcome::Fail("no connection".into());
    };
    let id = c.fresh_id();
    let _ = c
        .request(id, "GET", "/health", "", &ctx.auth(), b"", true)
        .await;
    let start = Instant::now();
    let deadline = start + STEP;
    while c.closed.is_none() && Instant::now() < deadline {
        c.step(deadline.saturating_duration_since(Instant::now()))
            .await;
    }
    let answered = c.streams.get(&id.get()).and_then(|a| a.status);
    let again = ctx
        .next_dial(Duration::from_secs(5))
        .await
        .ok()
        .map(|(_, h)| h.at.duration_since(start).as_secs_f64());
    let again = again.map_or("did not dial again within 5 s".into(), |t| {
        format!("dialled again after {t:.1} s")
    });
    match (answered, c.closed) {
        (None, Some(_)) => Outcome::Pass(format!(
            "101 without a subprotocol: the worker closed the connection unanswered; it {again}"
        )),
        (Some(s), _) => Outcome::Fail(format!(
            "101 without a subprotocol: the worker served /health ({s})"
        )),
        (None, None) => {
            Outcome::Fail("101 without a subprotocol: the connection stayed open".into())
        }
    }
}
