//! Relay mode, the connection: handshake, ping, frames to ignore, a lost
//! worker, a worker's second connection.

use crate::case;
use crate::http;
use crate::relay_cases_http::{call, request_id};
use crate::relay_ctx::{Dial, Got, RelayCtx, STEP};
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::ws_send::WsSend;
use bytes::Bytes;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as WsMsg;
use worker_relay::frame::{ControlFrame, StreamId, SUBPROTOCOL};

pub const CONNECTING: &str = "§Connecting";
pub const ROLES: &str = "§Worker-to-relay";

pub fn cases() -> Vec<Case<RelayCtx>> {
    vec![
        case!(RelayCtx, "relay.handshake.subprotocol", CONNECTING, Needs::Any, long = false, terminal = false,
            "a dial with the token and strata-worker-connect.v1 gets 101 selecting exactly that subprotocol", subprotocol),
        case!(RelayCtx, "relay.handshake.bad-token", CONNECTING, Needs::Any, long = false, terminal = false,
            "a dial with a wrong token is refused with an HTTP status, not 101 (a retryable 408/429/5xx WARNs: a final 4xx is recommended)", bad_token),
        case!(RelayCtx, "relay.handshake.missing-token", CONNECTING, Needs::Any, long = false, terminal = false,
            "a dial without Authorization is refused with an HTTP status, not 101 (a final 4xx is recommended)", missing_token),
        case!(RelayCtx, "relay.handshake.non-upgrade", CONNECTING, Needs::Any, long = false, terminal = false,
            "a plain GET of the connect path (no Upgrade) is refused with a 4xx (the spec says nothing of it: WARN)", non_upgrade),
        case!(RelayCtx, "relay.ping.answered", CONNECTING, Needs::Any, long = false, terminal = false,
            "a WebSocket ping from the worker is answered with a pong echoing its payload", ping),
        case!(RelayCtx, "relay.ignore.unknown-type", ROLES, Needs::Any, long = false, terminal = false,
            "frames of an unknown type (also on an open stream's id) are ignored", unknown_type),
        case!(RelayCtx, "relay.ignore.unknown-id", ROLES, Needs::Any, long = false, terminal = false,
            "response/chunk/end/abort for ids not in flight are ignored", unknown_id),
        case!(RelayCtx, "relay.lost.before-response", CONNECTING, Needs::Any, long = false, terminal = false,
            "a request in flight when the worker's connection drops fails (a 5xx or a failed response; never a 2xx)", lost_before_response),
        case!(RelayCtx, "relay.replace.older-connection", CONNECTING, Needs::Any, long = false, terminal = false,
            "a worker's second connection is accepted and serves requests, the older one replaced (the spec says nothing of it: WARN/INFO)", replace),
    ]
}

async fn subprotocol(ctx: &mut RelayCtx) -> Outcome {
    // The kit's connection goes first: this dial is not a second connection
    // (which a relay that refuses duplicates answers 503 until the first is
    // gone, so a retryable refusal is retried for a while).
    if let Some(mut w) = ctx.drop_worker() {
        let _ = tokio::time::timeout(Duration::from_secs(2), w.ws.close(None)).await;
        let _ = w.drain(Duration::from_millis(200)).await;
    }
    let token = ctx.t.token.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    let dialled = loop {
        match ctx.dial(Some(&token), Some(SUBPROTOCOL)).await {
            Dial::Refused(s) if (s >= 500 || s == 408 || s == 429) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            d => break d,
        }
    };
    match dialled {
        Dial::Connected(w, Some(p)) if p == SUBPROTOCOL => {
            ctx.set_worker(*w);
            Outcome::Pass(format!("101, Sec-WebSocket-Protocol: {p}"))
        }
        Dial::Connected(_, other) => Outcome::Fail(format!("101 selecting {other:?}")),
        Dial::Refused(s) => Outcome::Fail(format!("refused with {s}")),
        Dial::Failed(e) => Outcome::Fail(format!("handshake failed: {e}")),
    }
}

fn refusal(d: Dial) -> Outcome {
    match d {
        Dial::Refused(s) if (400..500).contains(&s) && s != 408 && s != 429 => {
            Outcome::Pass(format!("refused with {s}"))
        }
        Dial::Refused(s) => Outcome::Warn(format!(
            "refused with {s}, which a worker retries (a final 4xx is recommended)"
        )),
        Dial::Connected(..) => Outcome::Fail("accepted (101)".into()),
        Dial::Failed(e) => Outcome::Fail(format!("no HTTP refusal: {e}")),
    }
}

async fn bad_token(ctx: &mut RelayCtx) -> Outcome {
    // Nothing of the real token: a relay may log what it refuses.
    refusal(
        ctx.dial(Some("conformance-wrong-token"), Some(SUBPROTOCOL))
            .await,
    )
}

async fn missing_token(ctx: &mut RelayCtx) -> Outcome {
    refusal(ctx.dial(None, Some(SUBPROTOCOL)).await)
}

async fn non_upgrade(ctx: &mut RelayCtx) -> Outcome {
    let auth = format!("Bearer {}", ctx.t.token);
    let headers = [("authorization", auth.as_str()), ("connection", "close")];
    match http::exchange(
        &ctx.t.authority,
        "GET",
        &ctx.t.connect_path,
        &headers,
        b"",
        STEP,
    )
    .await
    {
        // The spec says nothing of a plain GET there: a recommendation.
        Ok(r) => crate::report::recommend(
            (400..500).contains(&r.status),
            format!("plain GET {} answered {}", ctx.t.connect_path, r.status),
        ),
        Err(e) => Outcome::Fail(format!("no answer: {e}")),
    }
}

async fn ping(ctx: &mut RelayCtx) -> Outcome {
    let w = match ctx.worker().await {
        Ok(w) => w,
        Err(e) => return Outcome::Fail(e),
    };
    let payload = Bytes::from_static(b"wrp-conformance-1");
    let start = Instant::now();
    if let Err(e) = w.send(WsMsg::Ping(payload.clone())).await {
        return Outcome::Fail(e);
    }
    loop {
        match w.next(Duration::from_secs(5)).await {
            Got::Pong(p) if p == payload => {
                return Outcome::Pass(format!("pong in {} ms", start.elapsed().as_millis()))
            }
            Got::Pong(p) => {
                return Outcome::Fail(format!("pong with another payload ({} bytes)", p.len()))
            }
            Got::Timeout => return Outcome::Fail("no pong within 5 s".into()),
            Got::Closed(c) => {
                return Outcome::Fail(format!("the relay closed the connection ({c:?})"))
            }
            _ => continue,
        }
    }
}

/// Sends `noise` on the worker connection while a request is open, then
/// answers it: the caller must get the answer complete and the connection stay.
async fn answered_despite(
    ctx: &mut RelayCtx,
    path: &str,
    noise: impl Fn(StreamId) -> Vec<WsMsg>,
) -> Outcome {
    let caller = call(ctx, "GET", &ctx.target(path), &[], Vec::new());
    let w = match ctx.worker().await {
        Ok(w) => w,
        Err(e) => return Outcome::Fail(e),
    };
    let (id, _) = match w.expect_request(path, STEP).await {
        Ok(r) => r,
        Err(e) => return Outcome::Fail(e),
    };
    let sent = noise(id);
    let n = sent.len();
    for m in sent {
        if let Err(e) = w.send(m).await {
            return Outcome::Fail(format!(
                "the connection broke after the ignorable frames: {e}"
            ));
        }
    }
    if let Err(e) = w
        .respond(
            id,
            200,
            &[("content-type", "text/plain"), ("content-length", "2")],
            b"ok",
        )
        .await
    {
        return Outcome::Fail(e);
    }
    match tokio::time::timeout(STEP, caller).await {
        Ok(Ok(Ok(r))) if r.status == 200 && r.body == b"ok" && r.complete => {
            // The connection is still there: a ping is answered.
            let alive = w
                .send(WsMsg::Ping(Bytes::from_static(b"still")))
                .await
                .is_ok()
                && loop {
                    match w.next(Duration::from_secs(3)).await {
                        Got::Pong(_) => break true,
                        Got::Timeout | Got::Closed(_) => break false,
                        _ => continue,
                    }
                };
            judge(
                alive,
                format!(
                    "{n} frames ignored; the stream answered 200 and the connection {}",
                    if alive { "stayed" } else { "was closed" }
                ),
            )
        }
        Ok(Ok(Ok(r))) => Outcome::Fail(format!(
            "after {n} ignorable frames the caller got {} ({} bytes, complete {})",
            r.status,
            r.body.len(),
            r.complete
        )),
        Ok(Ok(Err(e))) => {
            Outcome::Fail(format!("after {n} ignorable frames the caller failed: {e}"))
        }
        _ => Outcome::Fail("the caller got no answer in time".into()),
    }
}

async fn unknown_type(ctx: &mut RelayCtx) -> Outcome {
    answered_despite(ctx, "/conformance/unknown-type", |id| {
        vec![
            WsMsg::Text(format!(r#"{{"type":"trailer","id":{id},"headers":[["x","y"]]}}"#).into()),
            WsMsg::Text(format!(r#"{{"type":"END","id":{id}}}"#).into()),
            WsMsg::Text(format!(r#"{{"type":"progress","id":{id},"status":100}}"#).into()),
            WsMsg::Text(r#"{"type":"hello"}"#.into()),
        ]
    })
    .await
}

async fn unknown_id(ctx: &mut RelayCtx) -> Outcome {
    answered_despite(ctx, "/conformance/unknown-id", |id| {
        let other = request_id(id.get().wrapping_add(1000).max(1));
        vec![
            WsMsg::Text(
                format!(r#"{{"type":"response","id":{other},"status":200,"headers":[]}}"#).into(),
            ),
            WsMsg::Binary(worker_relay::frame::encode_chunk(other, b"stray")),
            WsMsg::Text(ControlFrame::End { id: other }.encode().into()),
            WsMsg::Text(ControlFrame::Abort { id: StreamId::MAX }.encode().into()),
            WsMsg::Text(r#"{"type":"end","id":4294967294}"#.into()),
        ]
    })
    .await
}

async fn lost_before_response(ctx: &mut RelayCtx) -> Outcome {
    let path = "/conformance/lost";
    let caller = call(ctx, "GET", &ctx.target(path), &[], Vec::new());
    let w = match ctx.worker().await {
        Ok(w) => w,
        Err(e) => return Outcome::Fail(e),
    };
    if let Err(e) = w.expect_request(path, STEP).await {
        return Outcome::Fail(e);
    }
    // Gone without a close handshake, as a crashed worker is.
    drop(ctx.drop_worker());
    crate::relay_cases_http::failed_request(caller, "after the worker was lost").await
}

async fn replace(ctx: &mut RelayCtx) -> Outcome {
    if let Err(e) = ctx.worker().await {
        return Outcome::Fail(e);
    }
    let mut older = ctx.drop_worker().expect("connected");
    let token = ctx.t.token.clone();
    let mut newer = match ctx.dial(Some(&token), Some(SUBPROTOCOL)).await {
        Dial::Connected(w, _) => *w,
        Dial::Refused(s) if (400..500).contains(&s) && s != 408 && s != 429 => {
            ctx.set_worker(older);
            return Outcome::Warn(format!(
                "the second connection was refused with {s}: a worker reconnecting before the relay saw its older connection go would exit (the spec leaves a second connection to the relay; accepting it is recommended)"
            ));
        }
        Dial::Refused(s) => {
            ctx.set_worker(older);
            return Outcome::Info(format!(
                "the second connection was refused with {s} (retryable): the older one is kept"
            ));
        }
        Dial::Failed(e) => return Outcome::Fail(format!("the second dial failed: {e}")),
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let path = "/conformance/replace";
    let caller = call(ctx, "GET", &ctx.target(path), &[], Vec::new());
    let (on_newer, on_older) = tokio::join!(
        newer.expect_request(path, Duration::from_secs(5)),
        older.expect_request(path, Duration::from_secs(5))
    );
    let out = match (on_newer, on_older) {
        (Ok((id, _)), Err(_)) => {
            let _ = newer
                .respond(id, 200, &[("content-length", "0")], b"")
                .await;
            let closed = match older.next(Duration::from_secs(3)).await {
                Got::Closed(c) => format!(
                    "the older connection was closed ({})",
                    c.map_or("no code".into(), |c| c.to_string())
                ),
                _ => "the older connection stayed open".into(),
            };
            Outcome::Pass(format!(
                "the request went to the newer connection; {closed}"
            ))
        }
        (Err(_), Ok((id, _))) => {
            let _ = older
                .respond(id, 200, &[("content-length", "0")], b"")
                .await;
            Outcome::Warn("the request went to the older connection, not the newer one (the spec says nothing of a second connection; serving the newer is recommended: a reconnecting worker's older one is usually dead)".into())
        }
        (Ok(_), Ok(_)) => Outcome::Fail("the request reached both connections".into()),
        (Err(e), Err(_)) => Outcome::Fail(format!("the request reached neither connection: {e}")),
    };
    drop(caller);
    ctx.set_worker(newer);
    out
}
