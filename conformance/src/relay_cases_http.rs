//! Relay mode, the streams: URL mapping, hop-by-hop headers, request
//! framing, large bodies, concurrency, aborts both ways.

use crate::case;
use crate::http::{self, Response};
use crate::relay_ctx::{RelayCtx, STEP};
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::ws_send::WsSend;
use std::io;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use worker_relay::frame::{is_hop_by_hop_name, ControlFrame, StreamId, MAX_CHUNK_BODY};

pub const MAPPING: &str = "§Mapping-URLs";
pub const R2W: &str = "§Relay-to-worker";
pub const W2R: &str = "§Worker-to-relay";
pub const FRAMES: &str = "§Frames";
pub const CONCURRENCY: &str = "§Concurrency-and-flow-control";

pub fn cases() -> Vec<Case<RelayCtx>> {
    vec![
        case!(RelayCtx, "relay.url.prefix-stripped", MAPPING, Needs::Any, long = false, terminal = false,
            "GET /w/<id>/health reaches the worker as path /health, query \"\"", prefix_stripped),
        case!(RelayCtx, "relay.url.raw-path-query", R2W, Needs::Any, long = false, terminal = false,
            "percent-encoding and the raw query are forwarded as they were on the wire", raw_path_query),
        case!(RelayCtx, "relay.url.no-escape", MAPPING, Needs::Any, long = false, terminal = false,
            "dot segments (/w/<id>/../x, %2e%2e): forwarding them is allowed (\"as it was on the wire\"); refusing them is this kit's recommendation (WARN)", no_escape),
        case!(RelayCtx, "relay.url.exact-id", MAPPING, Needs::Any, long = false, terminal = false,
            "/w/<id>zz9/… is not worker <id> (the URL is the relay's choice: a recommendation, WARN)", exact_id),
        case!(RelayCtx, "relay.headers.hop-by-hop", R2W, Needs::Any, long = false, terminal = false,
            "Connection, Keep-Alive, TE, Trailer, Proxy-* are not forwarded; Authorization and others are", hop_by_hop),
        case!(RelayCtx, "relay.framing.get-end", R2W, Needs::Any, long = false, terminal = false,
            "a GET is a request frame followed by end, no body", get_end),
        case!(RelayCtx, "relay.framing.content-length", R2W, Needs::Any, long = false, terminal = false,
            "a 3 MiB body arrives in chunks of at most 1 MiB, then end; Content-Length matches the bytes", content_length),
        case!(RelayCtx, "relay.framing.chunked-request", R2W, Needs::Any, long = false, terminal = false,
            "a chunked upload arrives without Transfer-Encoding, whole, then end", chunked_request),
        case!(RelayCtx, "relay.body.large-response", FRAMES, Needs::Any, long = false, terminal = false,
            "a 5 MiB response in 1 MiB chunks reaches the caller complete", large_response),
        case!(RelayCtx, "relay.concurrency.second-stream", CONCURRENCY, Needs::Any, long = false, terminal = false,
            "a second request is forwarded and answered while the first is open", second_stream),
        case!(RelayCtx, "relay.abort.caller-disconnect", R2W, Needs::Any, long = false, terminal = false,
            "a caller that hangs up makes the relay send abort", caller_disconnect),
        case!(RelayCtx, "relay.abort.worker-before-response", W2R, Needs::Any, long = false, terminal = false,
            "a worker abort before the response fails the caller's request (a 5xx or a failed response; never a 2xx)", abort_before),
        case!(RelayCtx, "relay.abort.worker-after-response", W2R, Needs::Any, long = false, terminal = false,
            "a worker abort after the response started ends the caller's response as failed", abort_after),
    ]
}

pub fn request_id(v: u32) -> StreamId {
    StreamId::new(v).unwrap_or(StreamId::MIN)
}

/// One caller request in a task of its own (the relay answers only once the
/// kit's worker has).
pub fn call(
    ctx: &RelayCtx,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> JoinHandle<io::Result<Response>> {
    let authority = ctx.t.authority.clone();
    let (method, target) = (method.to_string(), target.to_string());
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    tokio::spawn(async move {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        http::exchange(&authority, &method, &target, &h, &body, STEP * 3).await
    })
}

async fn finish(caller: JoinHandle<io::Result<Response>>) -> Result<Response, String> {
    match tokio::time::timeout(STEP * 3, caller).await {
        Ok(Ok(Ok(r))) => Ok(r),
        Ok(Ok(Err(e))) => Err(format!("the caller failed: {e}")),
        Ok(Err(e)) => Err(format!("the caller's task failed: {e}")),
        Err(_) => Err("the caller got no answer in time".into()),
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

/// Sends GET `rest` under the prefix; the request head the worker got.
async fn forwarded(
    ctx: &mut RelayCtx,
    rest: &str,
    path_starts: &str,
) -> Result<(ControlFrame, Response), String> {
    let caller = call(
        ctx,
        "GET",
        &ctx.target(rest),
        &[("authorization", "Bearer conformance-worker-token")],
        Vec::new(),
    );
    let w = ctx.worker().await?;
    let (id, head) = w.expect_request(path_starts, STEP).await?;
    w.respond(id, 200, &[("content-length", "2")], b"ok")
        .await?;
    let r = finish(caller).await?;
    Ok((ControlFrame::Request { id, head }, r))
}

async fn prefix_stripped(ctx: &mut RelayCtx) -> Outcome {
    let target = ctx.target("/health");
    let caller = call(ctx, "GET", &target, &[], Vec::new());
    let w = tryf!(ctx.worker().await);
    let deadline = Instant::now() + STEP;
    // Whatever request comes first is the one the relay made of it.
    let (id, head) = loop {
        match w
            .next(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            crate::relay_ctx::Got::Frame(worker_relay::frame::Decoded::Control(
                ControlFrame::Request { id, head },
            )) => break (id, head),
            crate::relay_ctx::Got::Timeout | crate::relay_ctx::Got::Closed(_) => {
                return Outcome::Fail(format!("GET {target} reached no worker"))
            }
            _ => continue,
        }
    };
    tryf!(w.respond(id, 200, &[("content-length", "2")], b"ok").await);
    let r = tryf!(finish(caller).await);
    judge(
        head.path() == "/health" && head.query().is_empty() && r.status == 200,
        format!(
            "GET {target} reached the worker as path {:?} query {:?}; caller got {}",
            head.path(),
            head.query(),
            r.status
        ),
    )
}

async fn raw_path_query(ctx: &mut RelayCtx) -> Outcome {
    let (path, query) = ("/conformance/a%2Fb/c%20d;p=%7E", "x=1&y=%2F&z=a+b&&w");
    let (f, _) = tryf!(forwarded(ctx, &format!("{path}?{query}"), "/conformance/a").await);
    let ControlFrame::Request { head, .. } = f else {
        unreachable!()
    };
    judge(
        head.path() == path && head.query() == query,
        format!(
            "path {:?} query {:?} (sent {path:?} {query:?})",
            head.path(),
            head.query()
        ),
    )
}

fn has_dot_segment(path: &str) -> bool {
    path.split(['/', '\\']).any(|s| {
        let s = s.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    })
}

async fn no_escape(ctx: &mut RelayCtx) -> Outcome {
    let mut seen = Vec::new();
    for rest in [
        "/../x",
        "/%2e%2e/x",
        "/a/../../x",
        "/%2E%2E%2fx",
        "/conformance/./y",
    ] {
        let target = ctx.target(rest);
        let mut caller = call(ctx, "GET", &target, &[], Vec::new());
        let w = tryf!(ctx.worker().await);
        let deadline = Instant::now() + STEP;
        let mut reached = None;
        let r = loop {
            tokio::select! {
                r = &mut caller => break r,
                got = w.next(deadline.saturating_duration_since(Instant::now())) => match got {
                    crate::relay_ctx::Got::Frame(worker_relay::frame::Decoded::Control(ControlFrame::Request { id, head })) => {
                        reached = Some(head.target());
                        tryf!(w.respond(id, 200, &[("content-length", "7")], b"reached").await);
                    }
                    crate::relay_ctx::Got::Timeout => return Outcome::Fail(format!("GET {target}: no answer")),
                    crate::relay_ctx::Got::Closed(_) => return Outcome::Fail("the relay closed the worker's connection".into()),
                    _ => {}
                },
            }
        };
        let status = match r {
            Ok(Ok(r)) => r.status,
            _ => 0,
        };
        // The spec forwards the path "percent-encoded as it was on the
        // wire" and says nothing of dot segments: refusing them is this
        // kit's recommendation (a worker behind a path-routing proxy could
        // be reached elsewhere), never a failure.
        if let Some(t) = &reached {
            if has_dot_segment(t) {
                return Outcome::Warn(format!(
                    "GET {target} was forwarded to the worker as {t} (allowed by the spec; refusing dot segments is recommended)"
                ));
            }
        }
        if (200..300).contains(&status) && reached.is_none() {
            return Outcome::Warn(format!(
                "GET {target} was answered {status} by something else than this worker (not forbidden; refusing is recommended)"
            ));
        }
        seen.push(match reached {
            Some(t) => format!("{rest}→{t} ({status})"),
            None => format!("{rest}→{status}"),
        });
    }
    Outcome::Pass(seen.join(", "))
}

async fn exact_id(ctx: &mut RelayCtx) -> Outcome {
    let target = format!("{}{}zz9/conformance/exact", ctx.t.prefix, ctx.t.worker_id);
    let caller = call(ctx, "GET", &target, &[], Vec::new());
    let w = tryf!(ctx.worker().await);
    // Any request reaching this worker now is the caller's, whatever path
    // a broken prefix match made of it (`zz9/…`, `/zz9/…`, `/conformance/…`).
    if let Ok((id, head)) = w.expect_request("", Duration::from_secs(2)).await {
        let _ = w.respond(id, 200, &[("content-length", "0")], b"").await;
        return Outcome::Warn(format!(
            "GET {target} reached worker {} as {:?} (the URL mapping is the relay's choice; an exact id match is recommended)",
            ctx.t.worker_id,
            head.path()
        ));
    }
    match finish(caller).await {
        Ok(r) if r.status >= 400 => Outcome::Pass(format!(
            "not forwarded to {}; caller got {}",
            ctx.t.worker_id, r.status
        )),
        Ok(r) => Outcome::Warn(format!(
            "not forwarded to {}, but the caller got {} (not an error status; recommended: 404)",
            ctx.t.worker_id, r.status
        )),
        Err(e) => Outcome::Fail(format!("not forwarded, and no answer: {e}")),
    }
}

async fn hop_by_hop(ctx: &mut RelayCtx) -> Outcome {
    let sent = [
        ("connection", "keep-alive, x-conn-named"),
        ("keep-alive", "timeout=5"),
        ("te", "trailers"),
        ("trailer", "x-trailer"),
        ("proxy-authorization", "Basic Zm9vOmJhcg=="),
        ("proxy-connection", "keep-alive"),
        ("x-conn-named", "1"),
        ("x-keep", "kept"),
        ("authorization", "Bearer conformance-worker-token"),
    ];
    let caller = call(
        ctx,
        "GET",
        &ctx.target("/conformance/hop"),
        &sent,
        Vec::new(),
    );
    let w = tryf!(ctx.worker().await);
    let (id, head) = tryf!(w.expect_request("/conformance/hop", STEP).await);
    tryf!(w.respond(id, 200, &[("content-length", "0")], b"").await);
    let _ = finish(caller).await;
    let h = head.headers();
    let leaked: Vec<&str> = h
        .iter()
        .map(|(n, _)| n)
        .filter(|n| is_hop_by_hop_name(n))
        .collect();
    let auth_ok = h.get("authorization") == Some("Bearer conformance-worker-token");
    let keep_ok = h.get("x-keep") == Some("kept");
    let named = if h.get("x-conn-named").is_some() {
        "forwarded"
    } else {
        "dropped"
    };
    judge(
        leaked.is_empty() && auth_ok && keep_ok,
        format!(
            "hop-by-hop forwarded: {leaked:?}; authorization {}; x-keep {}; (x-conn-named, listed in Connection: {named})",
            if auth_ok { "kept" } else { "lost or changed" },
            if keep_ok { "kept" } else { "lost" }
        ),
    )
}

async fn get_end(ctx: &mut RelayCtx) -> Outcome {
    let caller = call(ctx, "GET", &ctx.target("/conformance/get"), &[], Vec::new());
    let w = tryf!(ctx.worker().await);
    let (id, head) = tryf!(w.expect_request("/conformance/get", STEP).await);
    let got = w.read_body(id, head, STEP).await;
    tryf!(w.respond(id, 204, &[], b"").await);
    let _ = finish(caller).await;
    judge(
        got.ended == Some(true) && got.body.is_empty(),
        format!(
            "request, {} body bytes, then {}",
            got.body.len(),
            match got.ended {
                Some(true) => "end",
                Some(false) => "abort",
                None => "nothing",
            }
        ),
    )
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

async fn content_length(ctx: &mut RelayCtx) -> Outcome {
    let n = 3 * MAX_CHUNK_BODY + 12_345;
    let body = pattern(n);
    let len = n.to_string();
    let caller = call(
        ctx,
        "POST",
        &ctx.target("/conformance/upload"),
        &[
            ("content-length", &len),
            ("content-type", "application/octet-stream"),
        ],
        body.clone(),
    );
    let w = tryf!(ctx.worker().await);
    let (id, head) = tryf!(w.expect_request("/conformance/upload", STEP).await);
    let cl = head.headers().get("content-length").map(str::to_string);
    let got = w.read_body(id, head, STEP * 2).await;
    tryf!(w.respond(id, 200, &[("content-length", "0")], b"").await);
    let _ = finish(caller).await;
    let max = got.chunk_sizes.iter().copied().max().unwrap_or(0);
    let figure = format!(
        "{} of {n} bytes in {} chunks (largest {max}), then {}; content-length {cl:?}",
        got.body.len(),
        got.chunk_sizes.len(),
        match got.ended {
            Some(true) => "end",
            Some(false) => "abort",
            None => "nothing",
        }
    );
    judge(
        got.body == body
            && max <= MAX_CHUNK_BODY
            && got.ended == Some(true)
            && cl.as_deref().is_none_or(|v| v == len),
        figure,
    )
}

async fn chunked_request(ctx: &mut RelayCtx) -> Outcome {
    let parts = [pattern(100 * 1024), vec![7u8], pattern(2 * MAX_CHUNK_BODY)];
    let whole: Vec<u8> = parts.concat();
    let mut wire = Vec::new();
    for p in &parts {
        wire.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
        wire.extend_from_slice(p);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    let caller = call(
        ctx,
        "POST",
        &ctx.target("/conformance/chunked"),
        &[("transfer-encoding", "chunked")],
        wire,
    );
    let w = tryf!(ctx.worker().await);
    let (id, head) = tryf!(w.expect_request("/conformance/chunked", STEP).await);
    let te = head.headers().get("transfer-encoding").map(str::to_string);
    let cl = head.headers().get("content-length").map(str::to_string);
    let got = w.read_body(id, head, STEP * 2).await;
    tryf!(w.respond(id, 200, &[("content-length", "0")], b"").await);
    let _ = finish(caller).await;
    let cl_ok = cl.as_deref().is_none_or(|v| v == whole.len().to_string());
    judge(
        te.is_none() && cl_ok && got.body == whole && got.ended == Some(true),
        format!(
            "transfer-encoding {te:?}, content-length {cl:?}, {} of {} bytes, ended {:?}",
            got.body.len(),
            whole.len(),
            got.ended
        ),
    )
}

async fn large_response(ctx: &mut RelayCtx) -> Outcome {
    let n = 5 * MAX_CHUNK_BODY + 7;
    let body = pattern(n);
    let caller = call(
        ctx,
        "GET",
        &ctx.target("/conformance/large"),
        &[],
        Vec::new(),
    );
    let w = tryf!(ctx.worker().await);
    let (id, _) = tryf!(w.expect_request("/conformance/large", STEP).await);
    let start = Instant::now();
    tryf!(
        w.respond(
            id,
            200,
            &[
                ("content-type", "application/octet-stream"),
                ("content-length", &n.to_string())
            ],
            &body
        )
        .await
    );
    let r = tryf!(finish(caller).await);
    judge(
        r.status == 200 && r.complete && r.body == body,
        format!(
            "{} of {n} bytes, complete {}, in {} ms",
            r.body.len(),
            r.complete,
            start.elapsed().as_millis()
        ),
    )
}

async fn second_stream(ctx: &mut RelayCtx) -> Outcome {
    let first = call(
        ctx,
        "GET",
        &ctx.target("/conformance/first"),
        &[],
        Vec::new(),
    );
    let w = tryf!(ctx.worker().await);
    let (id1, _) = tryf!(w.expect_request("/conformance/first", STEP).await);
    let start = Instant::now();
    let second = call(
        ctx,
        "GET",
        &ctx.target("/conformance/second"),
        &[],
        Vec::new(),
    );
    let w = tryf!(ctx.worker().await);
    let (id2, _) = tryf!(w.expect_request("/conformance/second", STEP).await);
    tryf!(
        w.respond(id2, 200, &[("content-length", "6")], b"second")
            .await
    );
    let r2 = tryf!(finish(second).await);
    let took = start.elapsed();
    let first_open = !first.is_finished();
    tryf!(
        w.respond(id1, 200, &[("content-length", "5")], b"first")
            .await
    );
    let r1 = tryf!(finish(first).await);
    judge(
        id1 != id2 && r2.body == b"second" && first_open && r1.body == b"first",
        format!(
            "stream {id2} answered in {} ms while stream {id1} was open; then {id1} answered {}",
            took.as_millis(),
            r1.status
        ),
    )
}

async fn caller_disconnect(ctx: &mut RelayCtx) -> Outcome {
    let mut s = tryf!(http::connect(&ctx.t.authority, STEP).await);
    let head = http::head(
        "GET",
        &ctx.target("/conformance/hangup"),
        &ctx.t.authority,
        &[],
    );
    tryf!(http::write_all(&mut s, &head, STEP).await);
    let w = tryf!(ctx.worker().await);
    let (id, _) = tryf!(w.expect_request("/conformance/hangup", STEP).await);
    let _ = tokio::time::timeout(STEP, s.shutdown()).await;
    drop(s);
    let start = Instant::now();
    if w.wait_abort(id, STEP).await {
        Outcome::Pass(format!(
            "abort {} ms after the caller hung up",
            start.elapsed().as_millis()
        ))
    } else {
        Outcome::Fail(format!(
            "no abort within {} s of the caller hanging up",
            STEP.as_secs()
        ))
    }
}

async fn abort_before(ctx: &mut RelayCtx) -> Outcome {
    let caller = call(
        ctx,
        "GET",
        &ctx.target("/conformance/abort-before"),
        &[],
        Vec::new(),
    );
    let w = tryf!(ctx.worker().await);
    let (id, _) = tryf!(w.expect_request("/conformance/abort-before", STEP).await);
    tryf!(w.send_control(&ControlFrame::Abort { id }).await);
    failed_request(caller, "after the worker's abort").await
}

/// The spec: the relay "should fail it, for example with 502". Any 5xx,
/// or a connection closed without a response, fails it (PASS); a 4xx
/// blames the caller (WARN); a 1xx-3xx is a success it never had, and no
/// answer at all leaves the caller hanging (FAIL).
pub async fn failed_request(caller: JoinHandle<io::Result<Response>>, when: &str) -> Outcome {
    let start = Instant::now();
    match tokio::time::timeout(STEP * 2, caller).await {
        Ok(Ok(Ok(r))) if r.status >= 500 => Outcome::Pass(format!(
            "caller got {} {} ms {when}",
            r.status,
            start.elapsed().as_millis()
        )),
        Ok(Ok(Ok(r))) if r.status >= 400 => Outcome::Warn(format!(
            "caller got {} {when}: a 4xx blames the caller (recommended: 502)",
            r.status
        )),
        Ok(Ok(Ok(r))) => Outcome::Fail(format!(
            "caller got {} {when}: a success the request never had",
            r.status
        )),
        Ok(Ok(Err(e))) if e.kind() == io::ErrorKind::TimedOut => {
            Outcome::Fail(format!("the caller got no answer {when} (left hanging)"))
        }
        Ok(Ok(Err(e))) => Outcome::Pass(format!(
            "the caller's request failed {when} ({e}; a 502 would tell it why)"
        )),
        _ => Outcome::Fail(format!("the caller got no answer within 20 s {when}")),
    }
}

async fn abort_after(ctx: &mut RelayCtx) -> Outcome {
    let mut figures = Vec::new();
    let mut ok = true;
    for (label, headers) in [
        ("no content-length", vec![]),
        ("content-length 5000", vec![("content-length", "5000")]),
    ] {
        let path = if headers.is_empty() {
            "/conformance/abort-after-a"
        } else {
            "/conformance/abort-after-b"
        };
        let caller = call(ctx, "GET", &ctx.target(path), &[], Vec::new());
        let w = tryf!(ctx.worker().await);
        let (id, _) = tryf!(w.expect_request(path, STEP).await);
        tryf!(w.respond_head(id, 200, &headers).await);
        tryf!(w.send_chunk(id, &[b'x'; 1000]).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        tryf!(w.send_control(&ControlFrame::Abort { id }).await);
        let r = tryf!(finish(caller).await);
        // Failed means cut off (closed or reset), not left hanging.
        ok &= r.status == 200 && !r.complete && !r.timed_out;
        figures.push(format!(
            "{label}: {} then {} bytes ({} framing), {}",
            r.status,
            r.body.len(),
            r.framing,
            if r.complete {
                "completed as if whole"
            } else if r.timed_out {
                "left hanging (neither ended nor closed)"
            } else {
                "failed"
            }
        ));
    }
    judge(ok, figures.join("; "))
}
