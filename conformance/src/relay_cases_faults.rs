//! Relay mode, faults on either side (issue 27): a caller that hangs up
//! mid-upload, a worker whose Content-Length does not match its body, an
//! idle worker connection kept alive by pings, and a seeded burst of
//! random malformed frames from the worker.

use crate::case;
use crate::http;
use crate::relay_cases_http::{call, FRAMES, R2W, W2R};
use crate::relay_ctx::{Got, RelayCtx, STEP};
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::ws_send::WsSend;
use bytes::Bytes;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message as WsMsg;
use worker_relay::frame::{encode_chunk, ControlFrame, Decoded, StreamId};

pub const CONNECTING: &str = "§Connecting";
/// The seed of `relay.robust.random-frames` (printed in its figure).
pub const SEED: u64 = 0x5eed_2027_0000_0027;
/// How many random frames.
const RANDOM_FRAMES: usize = 300;
/// How long the idle case keeps the worker connection idle (pings only).
pub const IDLE: Duration = Duration::from_secs(45);
/// The kit's worker pings as the spec's worker does.
const PING_EVERY: Duration = Duration::from_secs(20);

pub fn cases() -> Vec<Case<RelayCtx>> {
    vec![
        case!(RelayCtx, "relay.abort.caller-mid-upload", R2W, Needs::Any, long = false, terminal = false,
            "a caller that sends half its Content-Length body and hangs up makes the relay send abort within 5 s (never end)", mid_upload),
        case!(RelayCtx, "relay.response.content-length-mismatch", W2R, Needs::Any, long = false, terminal = false,
            "a worker's Content-Length 10 with 5 bytes (and 5 with 10), which the spec forbids the worker: recommended (WARN otherwise) that the caller's keep-alive connection is not desynchronised, the response not left hanging nor delivered as complete", cl_mismatch),
        case!(RelayCtx, "relay.keepalive.idle", CONNECTING, Needs::Any, long = false, terminal = false,
            "a worker connection idle for 45 s, pinging every 20 s, gets every pong and is not dropped; then a request is routed to it", idle),
        case!(RelayCtx, "relay.robust.random-frames", FRAMES, Needs::Any, long = false, terminal = false,
            "300 seeded random malformed frames from the worker (bad JSON, types, ids, streams not open, short binaries); then /health through the relay is still answered", random_frames),
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

async fn mid_upload(ctx: &mut RelayCtx) -> Outcome {
    let path = "/conformance/mid-upload";
    let total = 256 * 1024;
    let half = vec![b'u'; total / 2];
    let mut s = tryf!(http::connect(&ctx.t.authority, STEP).await);
    let head = http::head(
        "POST",
        &ctx.target(path),
        &ctx.t.authority,
        &[
            ("content-length", &total.to_string()),
            ("content-type", "application/octet-stream"),
        ],
    );
    tryf!(http::write_all(&mut s, &head, STEP).await);
    tryf!(http::write_all(&mut s, &half, STEP).await);
    let w = tryf!(ctx.worker().await);
    // A relay may hold a body until it is whole: then nothing reaches the
    // worker and there is nothing to abort.
    let opened = w.expect_request(path, Duration::from_secs(3)).await;
    let _ = tokio::time::timeout(STEP, s.shutdown()).await;
    drop(s);
    let start = Instant::now();
    let (id, head) = match opened {
        Ok(r) => r,
        Err(_) => match w.expect_request(path, Duration::from_secs(2)).await {
            Ok(r) => r,
            Err(_) => {
                return Outcome::Pass(format!(
                    "the request had not reached the worker when the caller hung up after {} of {total} bytes (the relay holds bodies): nothing to abort",
                    total / 2
                ))
            }
        },
    };
    let got = w.read_body(id, head, Duration::from_secs(5)).await;
    let took = start.elapsed().as_millis();
    match got.ended {
        Some(false) => Outcome::Pass(format!(
            "abort {took} ms after the caller hung up ({} of {total} body bytes had reached the worker)",
            got.body.len()
        )),
        Some(true) => Outcome::Fail(format!(
            "end after {} of {total} bytes: the request's Content-Length {total} does not match the bytes sent; a caller that hung up is an abort",
            got.body.len()
        )),
        None => Outcome::Fail(format!(
            "no abort within 5 s of the caller hanging up mid-upload ({} of {total} bytes reached the worker)",
            got.body.len()
        )),
    }
}

/// One keep-alive caller connection: the mismatched response, then the
/// next request on the same connection.
async fn mismatch_once(
    ctx: &mut RelayCtx,
    label: &str,
    declared: usize,
    sent: &[u8],
) -> Result<(bool, String), String> {
    let path = format!("/conformance/cl-{label}");
    let next = format!("/conformance/cl-{label}-next");
    let s = http::connect(&ctx.t.authority, STEP)
        .await
        .map_err(|e| e.to_string())?;
    let mut r = http::Reader::new(s, Duration::from_secs(3));
    let head = http::head("GET", &ctx.target(&path), &ctx.t.authority, &[]);
    http::write_all(r.get_mut(), &head, STEP)
        .await
        .map_err(|e| e.to_string())?;
    let w = ctx.worker().await?;
    let (id, _) = w.expect_request(&path, STEP).await?;
    let len = declared.to_string();
    w.respond_head(id, 200, &[("content-length", &len)]).await?;
    w.send_chunk(id, sent).await?;
    w.send_control(&ControlFrame::End { id }).await?;
    let first = r.response(false).await;
    let first = match first {
        Err(e) => {
            return Ok((
                true,
                format!("{label}: the caller got no response ({e}): failed"),
            ))
        }
        Ok(f) => f,
    };
    let what = format!(
        "{label} (content-length {declared}, {} bytes sent): the caller got {} bytes by {} framing",
        sent.len(),
        first.body.len(),
        first.framing
    );
    if first.timed_out {
        return Ok((
            false,
            format!("{what}, left hanging (neither complete nor closed within 3 s): FAIL"),
        ));
    }
    if !first.complete {
        return Ok((true, format!("{what}, cut off (failed): good")));
    }
    // Complete: is the connection still in step? Ask again on it.
    let verdict_first = if first.body == sent {
        "complete"
    } else {
        "complete but not the bytes the worker sent"
    };
    if r.closed_within(Duration::from_millis(300)).await {
        return Ok((
            true,
            format!("{what}, {verdict_first}; then the relay closed the connection"),
        ));
    }
    let head = http::head("GET", &ctx.target(&next), &ctx.t.authority, &[]);
    if http::write_all(r.get_mut(), &head, STEP).await.is_err() {
        return Ok((
            true,
            format!("{what}, {verdict_first}; the connection was closed"),
        ));
    }
    r.deadline = Instant::now() + Duration::from_secs(5);
    let w = ctx.worker().await?;
    let reached = w.expect_request(&next, Duration::from_secs(3)).await;
    if let Ok((id2, _)) = &reached {
        w.respond(*id2, 200, &[("content-length", "4")], b"next")
            .await?;
    }
    match r.response(false).await {
        Ok(n) if n.status == 200 && n.body == b"next" && n.complete => Ok((
            true,
            format!("{what}, {verdict_first}; the next request on the connection got its own answer"),
        )),
        Ok(n) => Ok((
            false,
            format!(
                "{what}, {verdict_first}; the next request on the same connection got {} {:?} (desynchronised: FAIL)",
                n.status,
                String::from_utf8_lossy(&n.body[..n.body.len().min(40)])
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Ok((
            false,
            format!("{what}, {verdict_first}; the next response on the same connection did not parse ({e}): desynchronised, FAIL"),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut && reached.is_ok() => Ok((
            false,
            format!("{what}, {verdict_first}; the next request reached the worker but its answer never came back on the connection: FAIL"),
        )),
        Err(_) => Ok((
            true,
            format!("{what}, {verdict_first}; the connection was not used again"),
        )),
    }
}

async fn cl_mismatch(ctx: &mut RelayCtx) -> Outcome {
    let mut figures = Vec::new();
    let mut http_ok = true;
    let mut complete_wrong = false;
    for (label, declared, sent) in [
        ("short", 10usize, &b"12345"[..]),
        ("long", 5usize, &b"1234567890"[..]),
    ] {
        match mismatch_once(ctx, label, declared, sent).await {
            Ok((ok, fig)) => {
                http_ok &= ok;
                complete_wrong |= fig.contains(", complete");
                figures.push(fig);
            }
            // The worker broke the rule here; what a relay then does, the
            // spec does not say: every outcome below is a warning at most.
            Err(e) => return Outcome::Warn(format!("{label}: {e}")),
        }
    }
    let text = figures.join("; ");
    if !http_ok {
        Outcome::Warn(format!(
            "{text} (the spec holds the worker to its Content-Length and says nothing of a relay's answer when it does not; a caller left hanging or a desynchronised keep-alive connection is what this kit warns of)"
        ))
    } else if complete_wrong {
        Outcome::Warn(format!(
            "{text} (a response the worker broke delivered as complete: the caller cannot tell; closing the connection without completing it is recommended)"
        ))
    } else {
        Outcome::Pass(text)
    }
}

async fn idle(ctx: &mut RelayCtx) -> Outcome {
    let w = tryf!(ctx.worker().await);
    let start = Instant::now();
    let mut pings = 0u32;
    let mut worst = Duration::ZERO;
    while start.elapsed() < IDLE {
        pings += 1;
        let payload = Bytes::from(format!("idle-{pings}"));
        let sent = Instant::now();
        if let Err(e) = w.send(WsMsg::Ping(payload.clone())).await {
            return Outcome::Fail(format!(
                "after {} s idle the ping could not be sent: {e}",
                start.elapsed().as_secs()
            ));
        }
        // Answered within 20 s, as the spec's worker waits; then idle till the next.
        let next_ping = sent + PING_EVERY;
        let mut ponged = false;
        loop {
            let until = if ponged {
                next_ping.min(start + IDLE)
            } else {
                sent + PING_EVERY
            };
            if Instant::now() >= until {
                break;
            }
            match w.next(until.saturating_duration_since(Instant::now())).await {
                Got::Pong(p) if p == payload => {
                    ponged = true;
                    worst = worst.max(sent.elapsed());
                }
                Got::Closed(c) => {
                    return Outcome::Fail(format!(
                        "the relay closed the idle worker connection after {} s ({c:?}) although it pinged every {} s",
                        start.elapsed().as_secs(),
                        PING_EVERY.as_secs()
                    ))
                }
                Got::Timeout => break,
                _ => {}
            }
        }
        if !ponged {
            return Outcome::Fail(format!(
                "no pong within {} s for ping {pings} (a worker closes the connection then)",
                PING_EVERY.as_secs()
            ));
        }
    }
    let path = "/conformance/after-idle";
    let caller = call(ctx, "GET", &ctx.target(path), &[], Vec::new());
    let w = tryf!(ctx.worker().await);
    let routed = w.expect_request(path, STEP).await;
    let (id, _) = match routed {
        Ok(r) => r,
        Err(e) => return Outcome::Fail(format!("after {} s idle: {e}", start.elapsed().as_secs())),
    };
    tryf!(
        w.respond(id, 200, &[("content-length", "4")], b"idle")
            .await
    );
    let r = match tokio::time::timeout(STEP, caller).await {
        Ok(Ok(Ok(r))) => r,
        _ => return Outcome::Fail("the caller got no answer after the idle time".into()),
    };
    judge(
        r.status == 200 && r.body == b"idle",
        format!(
            "{pings} pings over {} s, each answered (slowest {} ms); then a request was routed to the connection and answered {}",
            start.elapsed().as_secs(),
            worst.as_millis(),
            r.status
        ),
    )
}

/// xorshift64*: small, seeded, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    #[allow(clippy::should_implement_trait)] // a seeded generator, never ending: not an iterator
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// One random malformed (or merely stray) frame: never a valid frame for a
/// stream that is open (none is during the burst).
pub fn random_frame(rng: &mut Rng) -> WsMsg {
    let bad_id = |rng: &mut Rng| -> String {
        match rng.below(9) {
            0 => "0".into(),
            1 => "-1".into(),
            2 => "1.5".into(),
            3 => "\"7\"".into(),
            4 => "4294967296".into(),
            5 => "1099511627776".into(),
            6 => "null".into(),
            7 => "[1]".into(),
            // Well formed but not open.
            _ => (1 + rng.below(u64::from(u32::MAX) - 1)).to_string(),
        }
    };
    let ty = |rng: &mut Rng| {
        rng.pick(&[
            "response", "end", "abort", "request", "trailer", "RESPONSE", "", "ping",
        ])
        .to_string()
    };
    match rng.below(14) {
        0 => WsMsg::Text(
            rng.pick(&[
                "{",
                "garbage",
                "{\"type\":",
                "\u{0}",
                "",
                "}{",
                "{\"type\":\"end\",\"id\":1",
            ])
            .to_string()
            .into(),
        ),
        1 => WsMsg::Text(
            rng.pick(&[
                "[]",
                "42",
                "\"end\"",
                "null",
                "true",
                "[{\"type\":\"end\",\"id\":1}]",
            ])
            .to_string()
            .into(),
        ),
        2 => WsMsg::Text(format!(r#"{{"id":{}}}"#, bad_id(rng)).into()),
        3 => WsMsg::Text(
            format!(
                r#"{{"type":{},"id":{}}}"#,
                rng.pick(&["1", "null", "[\"end\"]", "{}", "true"]),
                rng.below(100)
            )
            .into(),
        ),
        4 => WsMsg::Text(format!(r#"{{"type":"{}","id":{}}}"#, ty(rng), bad_id(rng)).into()),
        5 => WsMsg::Text(
            format!(
                r#"{{"type":"response","id":{},"status":{},"headers":[]}}"#,
                bad_id(rng),
                rng.pick(&["200", "\"200\"", "1000", "-1", "null", "99"])
            )
            .into(),
        ),
        6 => WsMsg::Text(
            format!(
                r#"{{"type":"response","id":{},"status":200,"headers":{}}}"#,
                1 + rng.below(1 << 31),
                rng.pick(&[
                    "{}",
                    "[[1,2]]",
                    "[[\"a\"]]",
                    "[[\"a\",\"b\",\"c\"]]",
                    "\"x\"",
                    "[[\"bad name\",\"v\"]]",
                    "[[\"x\",\"\\r\\n\"]]"
                ])
            )
            .into(),
        ),
        7 => WsMsg::Text(
            format!(
                r#"{{"type":"{}","id":{}}}"#,
                rng.pick(&["end", "abort"]),
                1 + rng.below(u64::from(u32::MAX) - 1)
            )
            .into(),
        ),
        8 => WsMsg::Text(
            format!(
                r#"{{"type":"{}","id":{},"extra":{}}}"#,
                ty(rng),
                1 + rng.below(1000),
                rng.below(1 << 40)
            )
            .into(),
        ),
        9 => WsMsg::Binary(Bytes::from(
            (0..rng.below(4)).map(|i| i as u8).collect::<Vec<u8>>(),
        )),
        10 => WsMsg::Binary(Bytes::from_static(&[0, 0, 0, 0, b'z'])),
        11 => {
            let id = StreamId::new(1 + rng.below(u64::from(u32::MAX) - 1) as u32)
                .unwrap_or(StreamId::MAX);
            let n = rng.below(64) as usize;
            WsMsg::Binary(encode_chunk(id, &vec![b'r'; n]))
        }
        12 => WsMsg::Text(
            format!(
                r#"{{"type":"response","id":{},"status":200,"headers":[["content-length","{}"]]}}"#,
                1 + rng.below(1000),
                rng.below(1 << 20)
            )
            .into(),
        ),
        _ => {
            // A long string value, bounded.
            let n = 256 + rng.below(2048) as usize;
            WsMsg::Text(
                format!(
                    r#"{{"type":"{}","id":{},"pad":"{}"}}"#,
                    ty(rng),
                    bad_id(rng),
                    "p".repeat(n)
                )
                .into(),
            )
        }
    }
}

/// `/health` through the relay, answered by the kit's worker.
async fn health(ctx: &mut RelayCtx) -> Result<u16, String> {
    // Connected first (a redial), then the caller: its request must find
    // the connection the relay has now.
    ctx.worker().await?;
    let caller = call(ctx, "GET", &ctx.target("/health"), &[], Vec::new());
    let w = ctx.worker().await?;
    let (id, _) = w.expect_request("/health", Duration::from_secs(5)).await?;
    w.respond(id, 200, &[("content-length", "2")], b"ok")
        .await?;
    match tokio::time::timeout(STEP, caller).await {
        Ok(Ok(Ok(r))) if r.status == 200 && r.body == b"ok" => Ok(r.status),
        Ok(Ok(Ok(r))) => Err(format!("/health got {}", r.status)),
        Ok(Ok(Err(e))) => Err(format!("/health failed: {e}")),
        _ => Err("/health got no answer".into()),
    }
}

async fn random_frames(ctx: &mut RelayCtx) -> Outcome {
    let mut rng = Rng::new(SEED);
    let w = tryf!(ctx.worker().await);
    let start = Instant::now();
    let mut sent = 0usize;
    let mut bytes = 0usize;
    let mut closed_at = None;
    for _ in 0..RANDOM_FRAMES {
        let m = random_frame(&mut rng);
        bytes += m.len();
        if w.send(m).await.is_err() {
            closed_at = Some(sent);
            break;
        }
        sent += 1;
        if start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    // Is the connection still there? A ping tells.
    let alive = closed_at.is_none()
        && w.send(WsMsg::Ping(Bytes::from_static(b"after-noise")))
            .await
            .is_ok()
        && loop {
            match w.next(Duration::from_secs(3)).await {
                Got::Pong(_) => break true,
                Got::Timeout | Got::Closed(_) => break false,
                Got::Frame(Decoded::Control(ControlFrame::Request { id, .. })) => {
                    let _ = w.send_control(&ControlFrame::Abort { id }).await;
                }
                _ => {}
            }
        };
    let what = format!(
        "seed {SEED:#x}: {sent} random frames ({bytes} bytes) in {} ms",
        start.elapsed().as_millis()
    );
    if alive {
        return match health(ctx).await {
            Ok(_) => Outcome::Pass(format!(
                "{what}; the connection stayed and /health through the relay was answered"
            )),
            Err(e) => Outcome::Fail(format!(
                "{what}; the connection stayed but the relay no longer serves: {e}"
            )),
        };
    }
    // Closed: the spec does not forbid closing on garbage; it must serve a redial.
    ctx.drop_worker();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < deadline {
        match health(ctx).await {
            Ok(_) => {
                return Outcome::Warn(format!(
                    "{what}; the relay closed the worker's connection (after {} frames); after a redial /health was answered (ignoring what it cannot use is recommended)",
                    closed_at.unwrap_or(sent)
                ))
            }
            Err(e) => {
                last = e;
                ctx.drop_worker();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    Outcome::Fail(format!(
        "{what}; the relay closed the worker's connection and after redialling for 20 s it does not serve: {last}"
    ))
}
