//! Relay mode, what reaches the caller and what reaches the worker (issue
//! 27): statuses, repeated and mixed-case headers, Latin-1 header bytes
//! both ways, bodies of many sizes, empty chunks. The relay may remove
//! hop-by-hop headers and re-frame a body (Content-Length or chunked), and
//! header names compare case-insensitively; anything else it changes is a
//! failure.

use crate::case;
use crate::http::{self, Response};
use crate::relay_cases_http::{call, FRAMES, R2W, W2R};
use crate::relay_ctx::{RelayCtx, STEP};
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::ws_send::WsSend;
use std::io;
use std::time::Duration;
use tokio::task::JoinHandle;
use worker_relay::frame::{is_hop_by_hop_name, ControlFrame, MAX_CHUNK_BODY};

pub fn cases() -> Vec<Case<RelayCtx>> {
    vec![
        case!(RelayCtx, "relay.response.status", W2R, Needs::Any, long = false, terminal = false,
            "the worker's status reaches the caller unchanged (200, 201, 204, 302, 304, 404, 500, 503; HEAD too)", statuses),
        case!(RelayCtx, "relay.response.headers", W2R, Needs::Any, long = false, terminal = false,
            "the worker's response headers reach the caller in order, repeats kept (two Set-Cookie), mixed-case names, nothing merged or dropped", response_headers),
        case!(RelayCtx, "relay.response.latin1", W2R, Needs::Any, long = false, terminal = false,
            "a response header value holding U+0080..U+00FF reaches the caller as those single bytes (Latin-1), not UTF-8", response_latin1),
        case!(RelayCtx, "relay.response.body-sizes", FRAMES, Needs::Any, long = false, terminal = false,
            "response bodies of 0, 1, 1 MiB-1, 1 MiB, 1 MiB+1 and 3 MiB+17 bytes reach the caller byte for byte, complete", body_sizes),
        case!(RelayCtx, "relay.body.empty-chunks", FRAMES, Needs::Any, long = false, terminal = false,
            "empty chunks from the worker (at the start and in the middle of a body) are not the end of the body; whether the relay sends empty chunks is noted", empty_chunks),
        case!(RelayCtx, "relay.request.headers", R2W, Needs::Any, long = false, terminal = false,
            "a caller's repeated headers (X-Rep three times) and mixed-case names reach the worker in order, nothing merged", request_headers),
        case!(RelayCtx, "relay.request.latin1", R2W, Needs::Any, long = false, terminal = false,
            "a caller's header bytes 0x80..0xFF reach the worker as U+0080..U+00FF (Latin-1 strings), not re-encoded", request_latin1),
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

async fn finish(caller: JoinHandle<io::Result<Response>>) -> Result<Response, String> {
    match tokio::time::timeout(STEP * 3, caller).await {
        Ok(Ok(Ok(r))) => Ok(r),
        Ok(Ok(Err(e))) => Err(format!("the caller failed: {e}")),
        Ok(Err(e)) => Err(format!("the caller's task failed: {e}")),
        Err(_) => Err("the caller got no answer in time".into()),
    }
}

/// One caller request answered by the kit's worker with `status`,
/// `headers` and `body`: what the caller got.
async fn answered(
    ctx: &mut RelayCtx,
    method: &str,
    path: &str,
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, String> {
    let caller = call(ctx, method, &ctx.target(path), &[], Vec::new());
    let w = ctx.worker().await?;
    let (id, head) = w.expect_request(path, STEP).await?;
    w.respond(id, status, headers, body).await?;
    let r = finish(caller).await?;
    // The spec's `method`: the HTTP method, as the caller sent it.
    if head.method() != method {
        return Err(format!(
            "the caller's {method} reached the worker as method {:?}",
            head.method()
        ));
    }
    Ok(r)
}

async fn statuses(ctx: &mut RelayCtx) -> Outcome {
    let mut seen = Vec::new();
    let mut wrong = Vec::new();
    for (method, status) in [
        ("GET", 200),
        ("POST", 201),
        ("GET", 204),
        ("GET", 302),
        ("GET", 304),
        ("GET", 404),
        ("GET", 500),
        ("GET", 503),
        ("HEAD", 200),
        ("HEAD", 404),
    ] {
        let path = format!("/conformance/status-{status}-{}", method.to_lowercase());
        let no_body = method == "HEAD" || status == 204 || status == 304;
        let text = format!("status {status}");
        let len = text.len().to_string();
        let mut headers = vec![
            ("content-type", "text/plain"),
            ("content-length", len.as_str()),
        ];
        if status == 302 {
            headers.push(("location", "/elsewhere"));
        }
        // No Content-Length where no body is sent: the spec holds a worker's
        // Content-Length to the bytes it sends, HEAD included.
        if no_body {
            headers.retain(|(n, _)| *n != "content-length");
        }
        let body: &[u8] = if no_body { b"" } else { text.as_bytes() };
        let r = match answered(ctx, method, &path, status, &headers, body).await {
            Ok(r) => r,
            Err(e) => return Outcome::Fail(format!("{method} answered {status}: {e}")),
        };
        let ok = r.status == status && r.complete && r.body == body;
        seen.push(format!("{method} {status}→{}", r.status));
        if !ok {
            wrong.push(format!(
                "{method} answered {status} reached the caller as {} with {} body bytes (complete {})",
                r.status,
                r.body.len(),
                r.complete
            ));
        }
    }
    if wrong.is_empty() {
        Outcome::Pass(seen.join(", "))
    } else {
        Outcome::Fail(wrong.join("; "))
    }
}

/// The caller's headers that carry one of `names` (lowercased), in order.
fn among(r: &Response, names: &[String]) -> Vec<(String, String)> {
    r.headers
        .iter()
        .filter(|(n, _)| names.contains(&n.to_ascii_lowercase()))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
        .collect()
}

/// What the worker sent minus what a relay may remove or re-frame, lowercased.
fn expected(sent: &[(&str, &str)]) -> Vec<(String, String)> {
    sent.iter()
        .filter(|(n, _)| {
            !is_hop_by_hop_name(n)
                && !n.eq_ignore_ascii_case("content-length")
                && !n.eq_ignore_ascii_case("transfer-encoding")
        })
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
        .collect()
}

/// `got` against `want` (lowercased names): FAIL if a header is missing,
/// added, changed, merged or split, or repeats of one name are out of
/// order; WARN if only headers of different names were regrouped (the
/// spec says "in order"; HTTP says the order across different names is not
/// significant, RFC 9110 §5.3, and an HTTP library's header map groups them).
fn headers_verdict(want: &[(String, String)], got: &[(String, String)], text: String) -> Outcome {
    if got == want {
        return Outcome::Pass(text);
    }
    let by_name = |v: &[(String, String)]| {
        let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (n, val) in v {
            m.entry(n.clone()).or_default().push(val.clone());
        }
        m
    };
    if by_name(want) == by_name(got) {
        Outcome::Warn(format!(
            "{text} (headers of different names regrouped: each name's values kept in order, which HTTP allows, but the spec says in order)"
        ))
    } else {
        Outcome::Fail(text)
    }
}

fn compare_response(r: &Response, sent: &[(&str, &str)], body: &[u8]) -> Outcome {
    let want = expected(sent);
    let names: Vec<String> = want.iter().map(|(n, _)| n.clone()).collect();
    let got = among(r, &names);
    let added: Vec<&str> = r
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !names.iter().any(|m| m == n))
        .collect();
    let text = format!(
            "status {}, body {} of {} bytes (complete {}); the worker's headers {:?}, the caller's {:?} (others the relay set: {:?})",
            r.status,
            r.body.len(),
            body.len(),
            r.complete,
            want,
            got,
            added
        );
    if !(r.status == 200 && r.complete && r.body == body) {
        return Outcome::Fail(text);
    }
    headers_verdict(&want, &got, text)
}

async fn response_headers(ctx: &mut RelayCtx) -> Outcome {
    let sent = [
        ("content-type", "text/plain"),
        ("set-cookie", "a=1; Path=/"),
        ("X-Mixed-Case", "MiXeD vAlUe"),
        ("set-cookie", "b=2; HttpOnly"),
        ("x-list", "one, two"),
        ("x-list", "three"),
        ("content-length", "4"),
    ];
    let r = tryf!(answered(ctx, "GET", "/conformance/resp-headers", 200, &sent, b"body").await);
    compare_response(&r, &sent, b"body")
}

/// U+00E9, U+00FF, U+0080, U+00A0: each one byte on the wire as Latin-1,
/// two as UTF-8.
const LATIN1: &str = "caf\u{e9} \u{ff}\u{80}\u{a0}end";

async fn response_latin1(ctx: &mut RelayCtx) -> Outcome {
    let sent = [("x-latin1", LATIN1), ("content-length", "2")];
    let r = tryf!(answered(ctx, "GET", "/conformance/resp-latin1", 200, &sent, b"ok").await);
    let got = r.header("x-latin1").map(http::latin1);
    let want = http::latin1(LATIN1);
    let utf8 = got.as_deref() == Some(LATIN1.as_bytes());
    judge(
        got.as_deref() == Some(want.as_slice()),
        format!(
            "the caller got x-latin1 as bytes {:02x?}{} (sent {:02x?}: Latin-1, one byte per char)",
            got.unwrap_or_default(),
            if utf8 { " (re-encoded as UTF-8)" } else { "" },
            want
        ),
    )
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| ((i % 251) as u8) ^ salt).collect()
}

async fn body_sizes(ctx: &mut RelayCtx) -> Outcome {
    let mut seen = Vec::new();
    let mut wrong = Vec::new();
    let sizes = [
        0,
        1,
        MAX_CHUNK_BODY - 1,
        MAX_CHUNK_BODY,
        MAX_CHUNK_BODY + 1,
        3 * MAX_CHUNK_BODY + 17,
    ];
    for (i, n) in sizes.into_iter().enumerate() {
        let body = pattern(n, i as u8);
        let len = n.to_string();
        // Every other one without Content-Length (the relay frames it).
        let with_len = i % 2 == 0;
        let mut headers = vec![("content-type", "application/octet-stream")];
        if with_len {
            headers.push(("content-length", &len));
        }
        let path = format!("/conformance/size-{n}");
        let r = match answered(ctx, "GET", &path, 200, &headers, &body).await {
            Ok(r) => r,
            Err(e) => return Outcome::Fail(format!("{n} bytes: {e}")),
        };
        seen.push(format!("{n}{}", if with_len { " (length)" } else { "" }));
        if !(r.status == 200 && r.complete && r.body == body) {
            wrong.push(format!(
                "{n} bytes{}: the caller got {} with {} bytes, complete {}, {}",
                if with_len { " with content-length" } else { "" },
                r.status,
                r.body.len(),
                r.complete,
                if r.body.len() == n && r.body != body {
                    "different bytes"
                } else {
                    ""
                }
            ));
        }
    }
    if wrong.is_empty() {
        Outcome::Pass(format!("{} reached the caller whole", seen.join(", ")))
    } else {
        Outcome::Fail(wrong.join("; "))
    }
}

async fn empty_chunks(ctx: &mut RelayCtx) -> Outcome {
    let path = "/conformance/empty-chunks";
    // A POST with an empty body: does the relay send empty chunks itself?
    let caller = call(
        ctx,
        "POST",
        &ctx.target(path),
        &[("content-length", "0")],
        Vec::new(),
    );
    let w = tryf!(ctx.worker().await);
    let (id, head) = tryf!(w.expect_request(path, STEP).await);
    let got = w.read_body(id, head, STEP).await;
    tryf!(
        w.respond_head(id, 200, &[("content-type", "text/plain")])
            .await
    );
    for piece in [&b""[..], b"hello ", b"", b"", b"world"] {
        tryf!(w.send_chunk(id, piece).await);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    tryf!(w.send_chunk(id, b"!").await);
    tryf!(w.send_control(&ControlFrame::End { id }).await);
    let r = tryf!(finish(caller).await);
    let empties = got.chunk_sizes.iter().filter(|&&n| n == 0).count();
    let note = if empties > 0 {
        format!("the relay sent {empties} empty chunk(s) (allowed: need not be sent)")
    } else {
        "the relay sent no empty chunk".to_string()
    };
    judge(
        r.status == 200 && r.complete && r.body == b"hello world!",
        format!(
            "the caller got {} {:?} (complete {}) from chunks \"\", \"hello \", \"\", \"\", \"world\", \"!\"; {note}",
            r.status,
            String::from_utf8_lossy(&r.body),
            r.complete
        ),
    )
}

async fn request_headers(ctx: &mut RelayCtx) -> Outcome {
    let sent = [
        ("X-Rep", "one"),
        ("x-other", "o"),
        ("X-Rep", "two"),
        ("X-Mixed-Case", "MiXeD vAlUe"),
        ("x-rep", "three, four"),
    ];
    let path = "/conformance/req-headers";
    let caller = call(ctx, "GET", &ctx.target(path), &sent, Vec::new());
    let w = tryf!(ctx.worker().await);
    let (id, head) = tryf!(w.expect_request(path, STEP).await);
    tryf!(w.respond(id, 200, &[("content-length", "0")], b"").await);
    let _ = finish(caller).await;
    let want: Vec<(String, String)> = sent
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
        .collect();
    let got: Vec<(String, String)> = head
        .headers()
        .iter()
        .filter(|(n, _)| {
            ["x-rep", "x-other", "x-mixed-case"].contains(&n.to_ascii_lowercase().as_str())
        })
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
        .collect();
    headers_verdict(
        &want,
        &got,
        format!("the caller sent {want:?}; the worker got {got:?}"),
    )
}

async fn request_latin1(ctx: &mut RelayCtx) -> Outcome {
    let path = "/conformance/req-latin1";
    let mut s = tryf!(http::connect(&ctx.t.authority, STEP).await);
    let bytes = http::head_latin1(
        "GET",
        &ctx.target(path),
        &ctx.t.authority,
        &[("x-latin1", LATIN1), ("connection", "close")],
    );
    tryf!(http::write_all(&mut s, &bytes, STEP).await);
    let w = tryf!(ctx.worker().await);
    let (id, head) = tryf!(w.expect_request(path, STEP).await);
    tryf!(w.respond(id, 200, &[("content-length", "0")], b"").await);
    let _ = http::read_response(&mut s, STEP, false).await;
    let got = head.headers().get("x-latin1").map(str::to_string);
    let utf8 = got.as_deref().map(http::latin1).as_deref() == Some(LATIN1.as_bytes());
    judge(
        got.as_deref() == Some(LATIN1),
        format!(
            "the caller sent x-latin1 as bytes {:02x?}; the worker got {:?}{}",
            http::latin1(LATIN1),
            got,
            if utf8 {
                " (the UTF-8 bytes, each taken as a char: re-encoded, not \"as Latin-1 strings\")"
            } else {
                ""
            }
        ),
    )
}
