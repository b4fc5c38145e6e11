//! Worker mode, issue 41's cases: what every response a worker sends must
//! hold whatever its app does, and the example app's contract the kit's
//! `--app example` cases rely on.
//!
//! - `worker.body.generated-chunks`: a body the app makes up (`GET
//!   /bytes`), not one it echoes, also goes out in chunks of at most
//!   1 MiB. (The observer measures every chunk of every response; this
//!   case makes sure one large generated body is among them.)
//! - `worker.token.not-in-responses`: no response carries the worker's
//!   connect token, in a header or its body. (The observer looks at every
//!   response of the run; this case asks for the answers a leak is most
//!   likely in: error pages.)
//! - `worker.app.echo-contract`: the example app's `/echo` sends the body
//!   back with the request's Content-Type (and Content-Length), as
//!   worker_app_contract.rs says. Not a rule of the spec but of `--app
//!   example`: an app that breaks it fails here by name, so a broken app is
//!   not mistaken for a conforming worker (or a conforming worker for a
//!   broken one) by the cases that read `/echo`'s answers.

use crate::case;
use crate::cli::App;
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::worker_app_contract::{lacks_route, skip_route, NO_SUCH_ROUTE};
use crate::worker_ctx::{Answered, WorkerCtx, STEP};
use crate::worker_observe::{find, MIN_SECRET};
use worker_relay::frame::MAX_CHUNK_BODY;

pub const CONNECTING: &str = "§Connecting";
pub const FRAMES: &str = "§Frames";
pub const W2R: &str = "§Worker-to-relay";

pub fn cases() -> Vec<Case<WorkerCtx>> {
    vec![
        case!(WorkerCtx, "worker.body.generated-chunks", FRAMES, Needs::Example, long = false, terminal = false,
            "a body of 3 MiB + 17 bytes the app makes up (GET /bytes?n=3145745) comes whole, in chunks of at most 1 MiB, matching its Content-Length", generated_chunks),
        case!(WorkerCtx, "worker.token.not-in-responses", CONNECTING, Needs::Any, long = false, terminal = false,
            "no response carries the worker's connect token, in a header or its body: /health, /health without the worker token, a 404 (with --app example also /fail-before's 500 and /fail-after) are looked at, as every response of the run is", token_not_in_responses),
        case!(WorkerCtx, "worker.app.echo-contract", W2R, Needs::Example, long = false, terminal = false,
            "the example app's contract, not the spec's: POST /echo sends the body back with the request's Content-Type (application/octet-stream without one) and Content-Length; FAIL names what the app breaks", echo_contract),
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

/// The answer's `Content-Length` (its first, trimmed).
fn content_length(a: &Answered) -> Option<String> {
    a.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim().to_string())
}

fn ended(a: &Answered) -> &'static str {
    match (a.ended, a.aborted) {
        (true, _) => "end",
        (_, true) => "abort",
        _ => "neither end nor abort",
    }
}

/// The size `worker.body.generated-chunks` asks of `/bytes`: three full
/// chunks and a short one, if the worker cuts at the limit.
pub const GENERATED: usize = 3 * MAX_CHUNK_BODY + 17;

async fn generated_chunks(ctx: &mut WorkerCtx) -> Outcome {
    let h = ctx.auth();
    let c = tryf!(ctx.conn().await);
    let id = c.fresh_id();
    let query = format!("n={GENERATED}");
    tryf!(c.request(id, "GET", "/bytes", &query, &h, b"", true).await);
    let a = c.finished(id, STEP * 2).await;
    if lacks_route(a.status) {
        return skip_route("GET /bytes", a.status);
    }
    let cl = content_length(&a);
    let cl_ok = cl
        .as_deref()
        .is_none_or(|v| v.parse::<usize>().ok() == Some(a.body.len()));
    let over = a.max_chunk > MAX_CHUNK_BODY;
    let figure = format!(
        "GET /bytes?{query}: {}, {} of {GENERATED} bytes in {} chunks (largest {}{}), Content-Length {}, {}",
        a.status.map_or("no response".into(), |s| s.to_string()),
        a.body.len(),
        a.chunks,
        a.max_chunk,
        if over {
            format!(", over the limit of {MAX_CHUNK_BODY}")
        } else {
            String::new()
        },
        cl.as_deref().unwrap_or("none"),
        ended(&a)
    );
    judge(
        a.status == Some(200)
            && a.body.len() == GENERATED
            && a.ended
            && !a.aborted
            && !over
            && cl_ok,
        figure,
    )
}

/// Whether `a` (its headers, its body) holds `token`.
fn carries(a: &Answered, token: &[u8]) -> bool {
    a.headers
        .iter()
        .any(|(n, v)| find(n.as_bytes(), token).is_some() || find(v.as_bytes(), token).is_some())
        || find(&a.body, token).is_some()
}

async fn token_not_in_responses(ctx: &mut WorkerCtx) -> Outcome {
    let Some(token) = ctx.t.token.clone() else {
        return Outcome::Skip(
            "the kit knows no connect token: give it the worker's (STRATA_WORKER_CONNECT_TOKEN, --token-env), or start the worker with --exec".into(),
        );
    };
    if token.len() < MIN_SECRET {
        return Outcome::Skip(format!(
            "the connect token has {} bytes: under {MIN_SECRET}, too short to look for in bodies without false alarms",
            token.len()
        ));
    }
    let auth = ctx.auth();
    // GET each target, with the worker token (if the kit has one) or not.
    let mut asks = vec![("/health", true), (NO_SUCH_ROUTE, true)];
    if !auth.is_empty() {
        // A 401 is an error page too.
        asks.push(("/health", false));
    }
    if ctx.t.app == App::Example {
        asks.push(("/fail-before", true));
        asks.push(("/fail-after?n=1000", true));
    }
    let c = tryf!(ctx.conn().await);
    let mut seen = Vec::new();
    let mut leaked = Vec::new();
    for (target, with_auth) in asks {
        let id = c.fresh_id();
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let headers = if with_auth { &auth[..] } else { &[] };
        tryf!(c.request(id, "GET", path, query, headers, b"", true).await);
        let a = c.finished(id, STEP).await;
        let status = a.status.map_or("no answer".into(), |s| s.to_string());
        let without = if with_auth || auth.is_empty() {
            ""
        } else {
            " without the worker token"
        };
        let what = format!("{status} to GET {target}{without}");
        if carries(&a, token.as_bytes()) {
            leaked.push(what.clone());
        }
        seen.push(what);
    }
    if leaked.is_empty() {
        Outcome::Pass(format!(
            "{} answers ({}): none carries the connect token",
            seen.len(),
            seen.join(", ")
        ))
    } else {
        Outcome::Fail(format!(
            "the worker's connect token came back in {} of {} answers ({}); the token is the relay's credential for this worker and nothing else",
            leaked.len(),
            seen.len(),
            leaked.join(", ")
        ))
    }
}

/// The Content-Type `worker.app.echo-contract` sends (one no app would
/// make up).
pub const ECHO_TYPE: &str = "application/x-worker-relay-conformance; echo=contract";

async fn echo_contract(ctx: &mut WorkerCtx) -> Outcome {
    let body = b"the body back, with its Content-Type and Content-Length\n";
    let mut broken = Vec::new();
    let mut figures = Vec::new();
    for ctype in [Some(ECHO_TYPE), None] {
        let mut h = ctx.auth();
        if let Some(t) = ctype {
            h.push(("content-type".into(), t.into()));
        }
        h.push(("content-length".into(), body.len().to_string()));
        let c = tryf!(ctx.conn().await);
        let id = c.fresh_id();
        tryf!(c.request(id, "POST", "/echo", "", &h, body, true).await);
        let a = c.finished(id, STEP).await;
        if lacks_route(a.status) {
            return skip_route("POST /echo", a.status);
        }
        let want = ctype.unwrap_or("application/octet-stream");
        let got: Vec<&str> = a
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.trim())
            .collect();
        let sent = ctype.map_or("no Content-Type".into(), |t| format!("Content-Type {t:?}"));
        let status = a.status.map_or("no response".into(), |s| s.to_string());
        let cl = content_length(&a);
        figures.push(format!(
            "POST /echo with {sent}: {status}, {} of {} bytes back, Content-Type {got:?}, Content-Length {}, {}",
            a.body.len(),
            body.len(),
            cl.as_deref().unwrap_or("none"),
            ended(&a)
        ));
        let mut wrong = Vec::new();
        if a.status != Some(200) {
            wrong.push(format!("answered {status}, not 200"));
        }
        if a.body != body {
            wrong.push(format!(
                "sent {} bytes back, not the {} bytes of the request",
                a.body.len(),
                body.len()
            ));
        }
        if !matches!(got[..], [g] if g.eq_ignore_ascii_case(want)) {
            wrong.push(format!("answered with Content-Type {got:?}, not {want:?}"));
        }
        if cl.is_none() {
            wrong.push("answered without the request's Content-Length".into());
        }
        if !a.ended || a.aborted {
            wrong.push(format!("ended the answer with {}", ended(&a)));
        }
        if !wrong.is_empty() {
            broken.push(format!("with {sent} it {}", wrong.join(", ")));
        }
    }
    if broken.is_empty() {
        return Outcome::Pass(figures.join("; "));
    }
    Outcome::Fail(format!(
        "app contract (--app example), not a rule of the spec: POST /echo {}. The kit's echo cases read /echo's answers as the example app's (the body back, with the request's Content-Type and Content-Length): fix the app, or run the kit with --app health-only. ({})",
        broken.join("; "),
        figures.join("; ")
    ))
}
