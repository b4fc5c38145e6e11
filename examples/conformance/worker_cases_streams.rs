//! Worker mode, the streams: requests and ids, interleaving, the 16-chunk
//! bound, discarded bodies, app failures, aborts, frames to ignore.

use crate::case;
use crate::cli::App;
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::worker_ctx::{Conn, WorkerCtx, STEP};
use crate::ws_send::WsSend;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as WsMsg;
use worker_relay::frame::{self, ControlFrame, StreamId, SUBPROTOCOL};

pub const CONNECTING: &str = "§Connecting";
pub const FRAMES: &str = "§Frames";
pub const R2W: &str = "§Relay-to-worker";
pub const W2R: &str = "§Worker-to-relay";
pub const CONCURRENCY: &str = "§Concurrency-and-flow-control";

pub fn cases() -> Vec<Case<WorkerCtx>> {
    vec![
        case!(WorkerCtx, "worker.handshake.subprotocol", CONNECTING, Needs::Any, long = false, terminal = false,
            "the worker offers Sec-WebSocket-Protocol: strata-worker-connect.v1", offers_subprotocol),
        case!(WorkerCtx, "worker.handshake.token", CONNECTING, Needs::Any, long = false, terminal = false,
            "the worker sends Authorization: Bearer <its connect token>", sends_token),
        case!(WorkerCtx, "worker.request.health", W2R, Needs::Any, long = false, terminal = false,
            "GET /health (request + end) is answered: response, body, end", health),
        case!(WorkerCtx, "worker.id.max", FRAMES, Needs::Any, long = false, terminal = false,
            "a stream with id 4294967295 is answered on that id", id_max),
        case!(WorkerCtx, "worker.id.reuse", FRAMES, Needs::Any, long = false, terminal = false,
            "an id is answered again once its stream has ended", id_reuse),
        case!(WorkerCtx, "worker.concurrency.open-stream", CONCURRENCY, Needs::ExampleOrStrata, long = false, terminal = false,
            "/health is answered while another stream's body is still arriving", open_stream),
        case!(WorkerCtx, "worker.interleave.echo", FRAMES, Needs::Example, long = false, terminal = false,
            "two uploads whose chunks interleave are each echoed whole", interleave),
        case!(WorkerCtx, "worker.flow.16-chunk-bound", CONCURRENCY, Needs::Example, long = false, terminal = false,
            "an app reading slowly: the worker stops reading the socket instead of buffering the body", chunk_bound),
        case!(WorkerCtx, "worker.flow.discard-unread", CONCURRENCY, Needs::ExampleOrStrata, long = false, terminal = false,
            "the body of a request answered without reading it (401) is discarded, not held", discard_unread),
        case!(WorkerCtx, "worker.app.fail-before", W2R, Needs::Example, long = false, terminal = false,
            "an app failing before its response: 500 with a short body, then end", fail_before),
        case!(WorkerCtx, "worker.app.fail-after", W2R, Needs::Example, long = false, terminal = false,
            "an app failing after its response started: abort, no end", fail_after),
        case!(WorkerCtx, "worker.abort.request", R2W, Needs::ExampleOrStrata, long = false, terminal = false,
            "after the relay's abort the worker sends nothing more for the stream", abort_request),
        case!(WorkerCtx, "worker.ignore.malformed", FRAMES, Needs::Any, long = false, terminal = false,
            "malformed messages (not JSON, bad ids, short chunks) are ignored: no answer, no close", malformed),
        case!(WorkerCtx, "worker.ignore.unknown", W2R, Needs::Any, long = false, terminal = false,
            "unknown types and frames for ids not open are ignored", unknown),
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

/// A status as a figure: `200`, or `no response`.
fn st(s: Option<u16>) -> String {
    s.map_or("no response".into(), |s| s.to_string())
}

fn ended(a: &crate::worker_ctx::Answered) -> &'static str {
    match (a.ended, a.aborted) {
        (true, _) => "end",
        (_, true) => "abort",
        _ => "neither end nor abort",
    }
}

async fn offers_subprotocol(ctx: &mut WorkerCtx) -> Outcome {
    tryf!(ctx.conn().await);
    let hs = ctx.first.clone().expect("a dial");
    let offered: Vec<String> = hs
        .all("sec-websocket-protocol")
        .iter()
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .collect();
    judge(
        offered.iter().any(|p| p == SUBPROTOCOL),
        format!("offered {offered:?}"),
    )
}

async fn sends_token(ctx: &mut WorkerCtx) -> Outcome {
    tryf!(ctx.conn().await);
    let hs = ctx.first.clone().expect("a dial");
    let var = ctx.t.token_env.clone();
    let Some(token) = ctx.t.token.clone() else {
        return Outcome::Skip(format!(
            "${var} is not set: give the kit the connect token the worker was given"
        ));
    };
    let auth = hs.all("authorization");
    let want = format!("Bearer {token}");
    match auth.as_slice() {
        [] => Outcome::Fail("no Authorization header".into()),
        [one] if *one == want => {
            Outcome::Pass(format!("Authorization: Bearer <the token in ${var}>"))
        }
        [one] if one.to_ascii_lowercase().starts_with("bearer ") => {
            Outcome::Fail(format!("a Bearer token other than ${var}'s"))
        }
        [_] => Outcome::Fail("Authorization is not Bearer".into()),
        _ => Outcome::Fail(format!("{} Authorization headers", auth.len())),
    }
}

async fn ask_health(
    ctx: &mut WorkerCtx,
    id: Option<StreamId>,
) -> Result<(StreamId, crate::worker_ctx::Answered, Duration), String> {
    let auth = ctx.auth();
    let c = ctx.conn().await?;
    let id = id.unwrap_or_else(|| c.fresh_id());
    let start = Instant::now();
    c.request(id, "GET", "/health", "", &auth, b"", true)
        .await?;
    let a = c.finished(id, STEP).await;
    Ok((id, a, start.elapsed()))
}

fn health_ok(a: &crate::worker_ctx::Answered) -> bool {
    a.ended
        && !a.aborted
        && a.status.is_some_and(|s| (200..300).contains(&s))
        && a.out_of_order == 0
}

async fn health(ctx: &mut WorkerCtx) -> Outcome {
    let (_, a, took) = tryf!(ask_health(ctx, None).await);
    let hint = if a.status == Some(401) {
        " (set the worker token's variable, --worker-token-env)"
    } else {
        ""
    };
    judge(
        health_ok(&a),
        format!(
            "{}, {} body bytes, {} in {} ms{hint}",
            st(a.status),
            a.body.len(),
            ended(&a),
            took.as_millis()
        ),
    )
}

async fn id_max(ctx: &mut WorkerCtx) -> Outcome {
    let (id, a, _) = tryf!(ask_health(ctx, Some(StreamId::MAX)).await);
    judge(
        health_ok(&a),
        format!("id {id}: {}, {}", st(a.status), ended(&a)),
    )
}

async fn id_reuse(ctx: &mut WorkerCtx) -> Outcome {
    let id = StreamId::new(7).expect("7");
    let (_, a1, _) = tryf!(ask_health(ctx, Some(id)).await);
    let (_, a2, _) = tryf!(ask_health(ctx, Some(id)).await);
    judge(
        health_ok(&a1) && health_ok(&a2),
        format!(
            "id 7 twice: {} {}, then {} {}",
            st(a1.status),
            ended(&a1),
            st(a2.status),
            ended(&a2)
        ),
    )
}

/// A request whose body the app waits for: (method, path, headers).
fn slow_upload(ctx: &WorkerCtx, len: usize) -> (&'static str, Vec<(String, String)>) {
    let mut h = ctx.auth();
    h.push(("content-length".into(), len.to_string()));
    match ctx.t.app {
        App::Strata => {
            h.push((
                "content-type".into(),
                "multipart/form-data; boundary=conformance".into(),
            ));
            ("/v1/execute", h)
        }
        _ => {
            h.push(("content-type".into(), "application/octet-stream".into()));
            ("/echo", h)
        }
    }
}

async fn open_stream(ctx: &mut WorkerCtx) -> Outcome {
    let (path, headers) = slow_upload(ctx, 1000);
    let auth = ctx.auth();
    let c = tryf!(ctx.conn().await);
    let a = c.fresh_id();
    tryf!(
        c.request(a, "POST", path, "", &headers, b"--conformance\r\n", false)
            .await
    );
    let b = c.fresh_id();
    let start = Instant::now();
    tryf!(c.request(b, "GET", "/health", "", &auth, b"", true).await);
    let hb = c.finished(b, STEP).await;
    let took = start.elapsed();
    let a_open = c
        .streams
        .get(&a.get())
        .is_none_or(|s| !s.ended && !s.aborted);
    tryf!(c.send_control(&ControlFrame::Abort { id: a }).await);
    judge(
        health_ok(&hb) && a_open,
        format!(
            "/health {} in {} ms while POST {path} (15 of 1000 bytes) was {}",
            st(hb.status),
            took.as_millis(),
            if a_open { "open" } else { "already over" }
        ),
    )
}

async fn interleave(ctx: &mut WorkerCtx) -> Outcome {
    let mut h = ctx.auth();
    let n = 300_000;
    h.push(("content-length".into(), n.to_string()));
    let c = tryf!(ctx.conn().await);
    let (a, b) = (c.fresh_id(), c.fresh_id());
    let body_a: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let body_b: Vec<u8> = (0..n).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    tryf!(c.request(a, "POST", "/echo", "", &h, b"", false).await);
    tryf!(c.request(b, "POST", "/echo", "", &h, b"", false).await);
    for (pa, pb) in body_a.chunks(100_000).zip(body_b.chunks(100_000)) {
        tryf!(c.send_chunk(a, pa).await);
        tryf!(c.send_chunk(b, pb).await);
    }
    tryf!(c.send_control(&ControlFrame::End { id: b }).await);
    tryf!(c.send_control(&ControlFrame::End { id: a }).await);
    let (ka, kb) = (a.get(), b.get());
    c.until(STEP, |m| {
        [ka, kb]
            .iter()
            .all(|k| m.get(k).is_some_and(|s| s.ended || s.aborted))
    })
    .await;
    let ra = c.streams.get(&ka).cloned().unwrap_or_default();
    let rb = c.streams.get(&kb).cloned().unwrap_or_default();
    judge(
        ra.body == body_a && rb.body == body_b && ra.ended && rb.ended,
        format!(
            "stream {a}: {} of {n} bytes echoed ({}); stream {b}: {} of {n} ({})",
            ra.body.len(),
            ended(&ra),
            rb.body.len(),
            ended(&rb)
        ),
    )
}

/// Sends `count` chunks of `size` bytes on `id` for at most `window`; how many went out.
async fn push_chunks(
    c: &mut Conn,
    id: StreamId,
    count: usize,
    size: usize,
    window: Duration,
) -> usize {
    let piece = vec![0x2au8; size];
    let deadline = Instant::now() + window;
    let mut sent = 0;
    while sent < count {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = WsMsg::Binary(frame::encode_chunk(id, &piece));
        match tokio::time::timeout(left, futures_util::SinkExt::send(&mut c.ws, msg)).await {
            Ok(Ok(())) => sent += 1,
            _ => break,
        }
    }
    sent
}

async fn chunk_bound(ctx: &mut WorkerCtx) -> Outcome {
    const CHUNKS: usize = 64;
    let size = frame::MAX_CHUNK_BODY;
    let window = Duration::from_secs(4);
    let mut h = ctx.auth();
    h.push(("content-length".into(), (CHUNKS * size).to_string()));
    let c = tryf!(ctx.conn().await);
    let id = c.fresh_id();
    tryf!(
        c.request(id, "POST", "/slow-sink", "mibps=1", &h, b"", false)
            .await
    );
    let start = Instant::now();
    let sent = push_chunks(c, id, CHUNKS, size, window).await;
    let took = start.elapsed();
    // Let go of the stream: the worker drops what it holds and reads again.
    let _ = c.send_control(&ControlFrame::Abort { id }).await;
    let back = c.responsive(STEP * 2).await;
    // 16 held + what the app read (1 MiB/s) + the sockets' buffers (a few MiB).
    let bound = 16 + window.as_secs() as usize + 16;
    let figure = format!(
        "the worker took {sent} of {CHUNKS} 1 MiB chunks in {:.1} s while its app read 1 MiB/s (bound {bound}); after abort /health {}",
        took.as_secs_f64(),
        back.map_or("did not answer".into(), |d| format!("answered in {} ms", d.as_millis()))
    );
    judge(sent < CHUNKS && sent <= bound && back.is_some(), figure)
}

async fn discard_unread(ctx: &mut WorkerCtx) -> Outcome {
    const CHUNKS: usize = 40;
    let (path, mut headers) = slow_upload(ctx, CHUNKS * frame::MAX_CHUNK_BODY + 16);
    headers.retain(|(n, _)| n != "authorization");
    let c = tryf!(ctx.conn().await);
    let id = c.fresh_id();
    tryf!(
        c.request(id, "POST", path, "", &headers, b"--conformance\r\n", false)
            .await
    );
    let k = id.get();
    c.until(STEP, |m| m.get(&k).is_some_and(|s| s.status.is_some()))
        .await;
    let status = c.streams.get(&k).and_then(|s| s.status);
    let Some(status) = status else {
        let _ = c.send_control(&ControlFrame::Abort { id }).await;
        return Outcome::Fail(format!(
            "no response within {} s to a request without a worker token",
            STEP.as_secs()
        ));
    };
    if status != 401 {
        let _ = c.send_control(&ControlFrame::Abort { id }).await;
        return Outcome::Skip(format!("the app answered {status:?} without a worker token (not 401): is the worker's STRATA_WORKER_TOKEN set?"));
    }
    let start = Instant::now();
    let sent = push_chunks(c, id, CHUNKS, frame::MAX_CHUNK_BODY, STEP).await;
    let took = start.elapsed();
    if sent == CHUNKS {
        let _ = c.send_control(&ControlFrame::End { id }).await;
    }
    let back = c.responsive(STEP).await;
    judge(
        sent == CHUNKS && back.is_some(),
        format!(
            "401, then {sent} of {CHUNKS} MiB of its body taken in {:.1} s; /health {}",
            took.as_secs_f64(),
            back.map_or("did not answer".into(), |d| format!(
                "answered in {} ms",
                d.as_millis()
            ))
        ),
    )
}

async fn fail_before(ctx: &mut WorkerCtx) -> Outcome {
    let auth = ctx.auth();
    let c = tryf!(ctx.conn().await);
    let id = c.fresh_id();
    tryf!(
        c.request(id, "GET", "/fail-before", "", &auth, b"", true)
            .await
    );
    let a = c.finished(id, STEP).await;
    judge(
        a.status == Some(500) && a.ended && !a.body.is_empty() && a.body.len() < 4096,
        format!(
            "{}, body {:?}, {}",
            st(a.status),
            String::from_utf8_lossy(&a.body[..a.body.len().min(60)]),
            ended(&a)
        ),
    )
}

async fn fail_after(ctx: &mut WorkerCtx) -> Outcome {
    let auth = ctx.auth();
    let c = tryf!(ctx.conn().await);
    let id = c.fresh_id();
    tryf!(
        c.request(id, "GET", "/fail-after", "n=1000", &auth, b"", true)
            .await
    );
    let a = c.finished(id, STEP).await;
    judge(
        a.status == Some(200) && a.aborted && !a.ended,
        format!(
            "{}, {} body bytes, then {}",
            st(a.status),
            a.body.len(),
            ended(&a)
        ),
    )
}

async fn abort_request(ctx: &mut WorkerCtx) -> Outcome {
    let strata = ctx.t.app == App::Strata;
    let (path, headers) = slow_upload(ctx, 1000);
    let auth = ctx.auth();
    let c = tryf!(ctx.conn().await);
    let id = c.fresh_id();
    if strata {
        tryf!(
            c.request(id, "POST", path, "", &headers, b"--conformance\r\n", false)
                .await
        );
    } else {
        tryf!(
            c.request(id, "GET", "/sleep", "ms=1500", &auth, b"", true)
                .await
        );
    }
    c.pump(Duration::from_millis(200)).await;
    tryf!(c.send_control(&ControlFrame::Abort { id }).await);
    if strata {
        // The rest of the body (short of its Content-Length) and `end`: a
        // worker that honoured the abort ignores them (no such stream); one
        // that kept the stream now answers or fails it, which shows.
        tryf!(c.send_chunk(id, b"--conformance--\r\n").await);
        tryf!(c.send_control(&ControlFrame::End { id }).await);
    }
    c.pump(Duration::from_millis(2500)).await;
    let after = c.streams.get(&id.get()).cloned();
    let back = c.responsive(STEP).await;
    match after {
        None => judge(
            back.is_some(),
            format!(
                "nothing sent for stream {id} in 2.5 s after abort; /health {}",
                if back.is_some() {
                    "answered"
                } else {
                    "not answered"
                }
            ),
        ),
        Some(a) => Outcome::Fail(format!(
            "after abort the worker sent for stream {id}: status {}, {} bytes, {}",
            st(a.status),
            a.body.len(),
            ended(&a)
        )),
    }
}

async fn malformed(ctx: &mut WorkerCtx) -> Outcome {
    let c = tryf!(ctx.conn().await);
    let req = |id: &str| {
        format!(
            r#"{{"type":"request","id":{id},"method":"GET","path":"/health","query":"","headers":[]}}"#
        )
    };
    let msgs = vec![
        WsMsg::Text("not json".into()),
        WsMsg::Text("[1,2,3]".into()),
        WsMsg::Text("{\"type\":".into()),
        WsMsg::Text(req("0").into()),
        WsMsg::Text(req("\"77\"").into()),
        WsMsg::Text(req("4294967296").into()),
        WsMsg::Text(req("-78").into()),
        WsMsg::Text(req("79.5").into()),
        WsMsg::Text(
            r#"{"type":"request","id":80,"method":"GET","path":"health","query":"","headers":[]}"#
                .into(),
        ),
        WsMsg::Text(r#"{"type":"end","id":-1}"#.into()),
        WsMsg::Binary(vec![0u8, 0].into()),
        WsMsg::Binary(vec![0u8, 0, 0, 0, 1, 2, 3].into()),
    ];
    let n = msgs.len();
    let before: Vec<u32> = c.streams.keys().copied().collect();
    if let Err(e) = c.send_all(msgs).await {
        return Outcome::Fail(format!("the connection broke: {e}"));
    }
    let back = c.responsive(STEP).await;
    // Only 80 (a path without /) may be answered, with a 400: any other new
    // stream is an answer to a malformed id (77, a wrapped -78, a truncated
    // 2^32, …), whatever the worker made of it.
    let answered: Vec<u32> = c
        .streams
        .keys()
        .copied()
        .filter(|k| *k != 80 && !before.contains(k) && !c.issued(*k))
        .collect();
    let p80 = c.streams.get(&80).and_then(|s| s.status);
    let closed = c.closed;
    judge(
        back.is_some() && answered.is_empty() && closed.is_none() && p80.is_none_or(|s| (400..500).contains(&s)),
        format!(
            "{n} malformed messages; answered ids {answered:?}; path without '/': {}; connection {}; /health {}",
            p80.map_or("ignored".into(), |s| format!("answered {s}")),
            if closed.is_none() { "kept" } else { "closed" },
            if back.is_some() { "answered" } else { "not answered" }
        ),
    )
}

async fn unknown(ctx: &mut WorkerCtx) -> Outcome {
    let c = tryf!(ctx.conn().await);
    let ghost = StreamId::new(555).expect("555");
    let msgs = vec![
        WsMsg::Text(r#"{"type":"hello","id":5}"#.into()),
        WsMsg::Text(
            r#"{"type":"REQUEST","id":6,"method":"GET","path":"/health","query":"","headers":[]}"#
                .into(),
        ),
        WsMsg::Text(r#"{"type":"response","id":9,"status":200,"headers":[]}"#.into()),
        WsMsg::Text(ControlFrame::End { id: ghost }.encode().into()),
        WsMsg::Text(ControlFrame::Abort { id: ghost }.encode().into()),
        WsMsg::Binary(frame::encode_chunk(ghost, b"nobody's body")),
    ];
    let n = msgs.len();
    if let Err(e) = c.send_all(msgs).await {
        return Outcome::Fail(format!("the connection broke: {e}"));
    }
    let back = c.responsive(STEP).await;
    let answered: Vec<u32> = c
        .streams
        .keys()
        .copied()
        .filter(|k| matches!(k, 5 | 6 | 9 | 555))
        .collect();
    judge(
        back.is_some() && answered.is_empty() && c.closed.is_none(),
        format!(
            "{n} frames to ignore; answered ids {answered:?}; /health {}",
            if back.is_some() {
                "answered"
            } else {
                "not answered"
            }
        ),
    )
}
