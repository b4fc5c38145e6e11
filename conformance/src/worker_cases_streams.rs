//! Worker mode, the streams: requests and ids, interleaving, the 16-chunk
//! bound, discarded bodies, app failures, aborts, frames to ignore.

use crate::case;
use crate::cli::App;
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::worker_app_contract::{lacks_route, skip_route, NO_SUCH_ROUTE};
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
            "an app reading slowly: the worker stops reading the socket instead of buffering the body (all 64 MiB taken: FAIL; more than 16 chunks plus the sockets' buffers: WARN)", chunk_bound),
        case!(WorkerCtx, "worker.flow.discard-unread", CONCURRENCY, Needs::ExampleOrStrata, long = false, terminal = false,
            "the body of a request answered without reading it (401 without the worker token; with none known, 404 to a path the app lacks) is discarded, not held", discard_unread),
        case!(WorkerCtx, "worker.app.fail-before", W2R, Needs::Example, long = false, terminal = false,
            "an app failing before its response: 500 with a short body, then end", fail_before),
        case!(WorkerCtx, "worker.app.fail-after", W2R, Needs::Example, long = false, terminal = false,
            "an app failing after its response started: abort, no end", fail_after),
        case!(WorkerCtx, "worker.abort.request", R2W, Needs::ExampleOrStrata, long = false, terminal = false,
            "after the relay's abort the worker sends nothing more for the stream", abort_request),
        case!(WorkerCtx, "worker.ignore.malformed", FRAMES, Needs::Any, long = false, terminal = false,
            "malformed messages (not JSON, bad ids, short chunks), one at a time: no answer on id 0 or an id never opened (FAIL); echoing another malformed id, or closing on one, is WARN (the spec is silent)", malformed),
        case!(WorkerCtx, "worker.ignore.unknown", W2R, Needs::Any, long = false, terminal = false,
            "unknown types and frames for ids not open are ignored: no answer, no close (the spec: both sides ignore them)", unknown),
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
    if lacks_route(ra.status) {
        return skip_route("POST /echo", ra.status);
    }
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

/// The routes whose app holds a request body unread for a while, in the
/// order tried: the method, path, query, how fast the app reads (MiB/s),
/// and what the figure says of it.
const SLOW_READERS: [(&str, &str, &str, usize, &str); 2] = [
    (
        "POST",
        "/slow-sink",
        "mibps=1",
        1,
        "while its app read 1 MiB/s",
    ),
    (
        "GET",
        "/sleep",
        "ms=6000",
        0,
        "while its app slept without reading (no /slow-sink)",
    ),
];

/// The most the kernel's TCP buffers of one loopback connection may hold,
/// in whole MiB: the send buffer's maximum plus the receive buffer's
/// (Linux's `tcp_wmem` and `tcp_rmem`, third fields); 16 where they cannot
/// be read.
fn socket_buffers_mib() -> usize {
    let max = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
            .ok()
            .and_then(|t| t.split_whitespace().nth(2)?.parse::<usize>().ok())
    };
    match (max("tcp_wmem"), max("tcp_rmem")) {
        (Some(w), Some(r)) => (w + r).div_ceil(1 << 20),
        _ => 16,
    }
}

async fn chunk_bound(ctx: &mut WorkerCtx) -> Outcome {
    const CHUNKS: usize = 64;
    let size = frame::MAX_CHUNK_BODY;
    let window = Duration::from_secs(4);
    let mut h = ctx.auth();
    h.push(("content-length".into(), (CHUNKS * size).to_string()));
    let c = tryf!(ctx.conn().await);
    // An app without a route answers at once (404) without reading: the
    // next route is tried, and with none a skip, not a figure. The routes
    // answer only once they have the body, or after their sleep.
    let mut chosen = None;
    let mut lacked = Vec::new();
    for (method, path, query, rate, how) in SLOW_READERS {
        let id = c.fresh_id();
        tryf!(c.request(id, method, path, query, &h, b"", false).await);
        let k = id.get();
        c.until(Duration::from_millis(500), |m| {
            m.get(&k).is_some_and(|s| s.status.is_some())
        })
        .await;
        let early = c.streams.get(&k).and_then(|s| s.status);
        if lacks_route(early) {
            let _ = c.send_control(&ControlFrame::Abort { id }).await;
            lacked.push((format!("{method} {path}"), early));
            continue;
        }
        chosen = Some((id, method, path, rate, how));
        break;
    }
    let Some((id, method, path, rate, how)) = chosen else {
        let (route, status) = lacked.pop().unwrap_or_default();
        let _ = c.responsive(STEP).await;
        return skip_route(&format!("POST /slow-sink nor {route}"), status);
    };
    let k = id.get();
    let start = Instant::now();
    let sent = push_chunks(c, id, CHUNKS, size, window).await;
    let took = start.elapsed();
    // Let go of the stream: the worker drops what it holds and reads again.
    let _ = c.send_control(&ControlFrame::Abort { id }).await;
    let late = c.streams.get(&k).and_then(|s| s.status);
    if lacks_route(late) {
        let _ = c.responsive(STEP).await;
        return skip_route(&format!("{method} {path}"), late);
    }
    // The abort waits behind what the kit sent before it: chunks in the
    // sockets' buffers that the worker reads no faster than its app (it
    // holds 16 unread). The app's rate bounds how long that takes.
    let backlog = match rate {
        0 => Duration::ZERO,
        r => Duration::from_secs((sent.saturating_sub(16) / r) as u64),
    };
    let back = c.responsive(STEP * 2 + backlog).await;
    // 16 held + what the app read + what the sockets' buffers may take
    // (the kit's send buffer and the worker's receive buffer, which Linux
    // grows up to tcp_wmem's and tcp_rmem's maxima: 32 MiB on some hosts)
    // + a message in each WebSocket library.
    let bound = 16 + rate * window.as_secs() as usize + socket_buffers_mib() + 2;
    let figure = format!(
        "{method} {path}: the worker took {sent} of {CHUNKS} 1 MiB chunks in {:.1} s {how} (bound {bound}); after abort /health (given {} s) {}",
        took.as_secs_f64(),
        (STEP * 2 + backlog).as_secs(),
        back.map_or("did not answer".into(), |d| format!("answered in {} ms", d.as_millis()))
    );
    // No backpressure at all (every chunk taken) breaks the rule; more than
    // the bound but not all is a worker whose libraries queue more than the
    // spec's 16 (a WebSocket library's queue, a large socket buffer): a
    // warning, as the kit cannot tell the two apart exactly.
    if sent == CHUNKS || back.is_none() {
        Outcome::Fail(figure)
    } else if sent > bound {
        Outcome::Warn(format!(
            "{figure}: more than 16 held plus what the sockets' buffers take, but it stopped reading"
        ))
    } else {
        Outcome::Pass(figure)
    }
}

async fn discard_unread(ctx: &mut WorkerCtx) -> Outcome {
    const CHUNKS: usize = 40;
    let (path, mut headers) = slow_upload(ctx, CHUNKS * frame::MAX_CHUNK_BODY + 16);
    headers.retain(|(n, _)| n != "authorization");
    // With the worker token known, the app's 401 to a request without it;
    // without, its 404 to a path it has not (any app answers that without
    // reading the body; a worker with a token answers 401 first, as well).
    let token = ctx.t.worker_token.is_some();
    let path = if token { path } else { NO_SUCH_ROUTE };
    let want = if token {
        "401"
    } else {
        "an answer (404 or 401)"
    };
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
            "no response within {} s to POST {path} without a worker token, its body not sent yet (want {want})",
            STEP.as_secs()
        ));
    };
    if token && status != 401 {
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
            "POST {path}: {status} before its body, then {sent} of {CHUNKS} MiB of the body taken in {:.1} s; /health {}",
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
    if lacks_route(a.status) {
        return skip_route("GET /fail-before", a.status);
    }
    judge(
        a.status == Some(500) && a.ended && !a.body.is_empty() && a.body.len() < 4096,
        format!(
            "{}, body {:?}, {}",
            st(a.status),
            crate::worker_observe::preview(&a.body, &ctx.secrets(), 60),
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
    if lacks_route(a.status) {
        return skip_route("GET /fail-after", a.status);
    }
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
    let before = c.streams.get(&id.get()).cloned();
    if !strata && lacks_route(before.as_ref().and_then(|a| a.status)) {
        return skip_route("GET /sleep", before.and_then(|a| a.status));
    }
    tryf!(c.send_control(&ControlFrame::Abort { id }).await);
    if strata {
        // The rest of the body (short of its Content-Length) and `end`: a
        // worker that honoured the abort ignores them (no such stream); one
        // that kept the stream now answers or fails it, which shows.
        tryf!(c.send_chunk(id, b"--conformance--\r\n").await);
        tryf!(c.send_control(&ControlFrame::End { id }).await);
    }
    c.pump(Duration::from_millis(2500)).await;
    // What came for the stream after the abort (the same as before it: nothing).
    let after = c.streams.get(&id.get()).cloned().filter(|a| {
        before.as_ref().is_none_or(|b| {
            (a.status, a.body.len(), a.ended, a.aborted)
                != (b.status, b.body.len(), b.ended, b.aborted)
        })
    });
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
    let req = |id: &str| {
        format!(
            r#"{{"type":"request","id":{id},"method":"GET","path":"/health","query":"","headers":[]}}"#
        )
    };
    let msgs: Vec<(&str, WsMsg)> = vec![
        ("text that is not JSON", WsMsg::Text("not json".into())),
        ("JSON that is not an object", WsMsg::Text("[1,2,3]".into())),
        ("truncated JSON", WsMsg::Text("{\"type\":".into())),
        ("a request on id 0", WsMsg::Text(req("0").into())),
        ("a request on id \"77\" (a string)", WsMsg::Text(req("\"77\"").into())),
        ("a request on id 2^32", WsMsg::Text(req("4294967296").into())),
        ("a request on id -78", WsMsg::Text(req("-78").into())),
        ("a request on id 79.5", WsMsg::Text(req("79.5").into())),
        (
            "a request whose path has no leading '/'",
            WsMsg::Text(
                r#"{"type":"request","id":80,"method":"GET","path":"health","query":"","headers":[]}"#
                    .into(),
            ),
        ),
        ("an end on id -1", WsMsg::Text(r#"{"type":"end","id":-1}"#.into())),
        ("a binary message of 2 bytes", WsMsg::Binary(vec![0u8, 0].into())),
        (
            "a chunk on id 0",
            WsMsg::Binary(vec![0u8, 0, 0, 0, 1, 2, 3].into()),
        ),
    ];
    let n = msgs.len();
    let before: Vec<u32> = tryf!(ctx.conn().await).streams.keys().copied().collect();
    // One at a time, each followed by /health: what made the worker close
    // (or stop answering), if anything did, is named.
    let mut culprit = None;
    let mut answered = Vec::new();
    let mut bad_ids = Vec::new();
    let mut p80 = None;
    for (what, m) in msgs {
        let c = tryf!(ctx.conn().await);
        let sent = c.send(m).await;
        let back = if sent.is_ok() {
            c.responsive(STEP).await
        } else {
            None
        };
        let new: Vec<u32> = c
            .streams
            .keys()
            .copied()
            .filter(|k| *k != 80 && !before.contains(k) && !c.issued(*k) && !answered.contains(k))
            .collect();
        answered.extend(new);
        bad_ids.append(&mut c.obs.bad_ids);
        p80 = p80.or(c.streams.get(&80).and_then(|s| s.status));
        if back.is_none() {
            culprit = Some((what, c.closed.is_some() || sent.is_err()));
            break;
        }
    }
    let answers = if answered.is_empty() && bad_ids.is_empty() {
        "answered no malformed id".to_string()
    } else {
        let mut ids: Vec<String> = answered.iter().map(|k| k.to_string()).collect();
        ids.extend(bad_ids.iter().cloned());
        format!("answered on ids [{}]", ids.join(", "))
    };
    let p80_ok = p80.is_none_or(|s: u16| (400..500).contains(&s));
    let p80 = p80.map_or("ignored".into(), |s| format!("answered {s}"));
    if !answered.is_empty() {
        return Outcome::Fail(format!(
            "{answers} (an answer goes on the id the relay opened, 1 to 2^32-1; these it never opened); path without '/': {p80}"
        ));
    }
    if !bad_ids.is_empty() {
        // Echoing a malformed id back: the spec says what ids are, not what
        // a worker does with a request that has none.
        return Outcome::Warn(format!(
            "{answers}: a request without a valid id is best ignored (the spec defines ids as 1 to 2^32-1 and is silent on the rest); path without '/': {p80}"
        ));
    }
    if !p80_ok {
        return Outcome::Fail(format!(
            "a request whose path has no leading '/' was {p80}: refuse it (4xx) or ignore it"
        ));
    }
    match culprit {
        None => Outcome::Pass(format!(
            "{n} malformed messages, /health answered after each; {answers}; path without '/': {p80}; connection kept"
        )),
        Some((what, false)) => Outcome::Fail(format!(
            "after {what}, the worker kept the connection but stopped answering /health"
        )),
        Some((what, true)) => {
            ctx.conn = None;
            let back = match ctx.conn().await {
                Ok(c) => c.responsive(STEP).await,
                Err(_) => None,
            };
            match back {
                Some(_) => Outcome::Warn(format!(
                    "the worker closed the connection on {what}, then redialled and answered /health; \
                     the spec does not say what a worker does with a message that is not a frame, \
                     and this kit recommends ignoring it (one bad message ends every stream in flight)"
                )),
                None => Outcome::Fail(format!(
                    "the worker closed the connection on {what} and did not come back to answer /health"
                )),
            }
        }
    }
}

/// §Worker-to-relay, the rule `worker.ignore.unknown` checks.
const IGNORE_RULE: &str =
    "the spec: \"Both sides ignore a frame with an unknown type, and frames for an id that is not open\"";

async fn unknown(ctx: &mut WorkerCtx) -> Outcome {
    let c = tryf!(ctx.conn().await);
    let ghost = StreamId::new(555).expect("555");
    let msgs: Vec<(&str, WsMsg)> = vec![
        ("a frame of type \"hello\"", WsMsg::Text(r#"{"type":"hello","id":5}"#.into())),
        (
            "a frame of type \"REQUEST\"",
            WsMsg::Text(
                r#"{"type":"REQUEST","id":6,"method":"GET","path":"/health","query":"","headers":[]}"#
                    .into(),
            ),
        ),
        (
            "a response (a type the relay does not send)",
            WsMsg::Text(r#"{"type":"response","id":9,"status":200,"headers":[]}"#.into()),
        ),
        ("an end for id 555, not open", WsMsg::Text(ControlFrame::End { id: ghost }.encode().into())),
        ("an abort for id 555, not open", WsMsg::Text(ControlFrame::Abort { id: ghost }.encode().into())),
        ("a chunk for id 555, not open", WsMsg::Binary(frame::encode_chunk(ghost, b"nobody's body"))),
    ];
    let n = msgs.len();
    let mut culprit = None;
    for (what, m) in msgs {
        let sent = c.send(m).await;
        c.pump(Duration::from_millis(20)).await;
        if sent.is_err() || c.closed.is_some() {
            culprit = Some(what);
            break;
        }
    }
    let back = if culprit.is_none() {
        c.responsive(STEP).await
    } else {
        None
    };
    if culprit.is_none() && c.closed.is_some() {
        culprit = Some("the frames to ignore");
    }
    let answered: Vec<u32> = c
        .streams
        .keys()
        .copied()
        .filter(|k| matches!(k, 5 | 6 | 9 | 555))
        .collect();
    if let Some(what) = culprit {
        return Outcome::Fail(format!(
            "the worker closed the connection on {what} ({IGNORE_RULE})"
        ));
    }
    let ok = back.is_some() && answered.is_empty();
    judge(
        ok,
        format!(
            "{n} frames to ignore; answered ids {answered:?}; connection kept; /health {}{}",
            if back.is_some() {
                "answered"
            } else {
                "not answered"
            },
            if ok {
                String::new()
            } else {
                format!(" ({IGNORE_RULE})")
            }
        ),
    )
}
