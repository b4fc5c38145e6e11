//! Worker mode, `--app example`: the routes the kit's cases ask of the
//! worker's app. The crate's example worker (cli/src/worker_app.rs)
//! serves them; a worker in another language run against the kit with
//! `--app example` serves them too, or the cases that need a route it lacks
//! skip (a 404, 405 or 501 answer means the app has no such route).
//!
//! Every route needs `Authorization: Bearer <worker token>` if the worker
//! has one (the kit sends it when `STRATA_WORKER_TOKEN` is set) and answers
//! 401 without it, leaving the body unread; a case whose route answers 401
//! skips too (give the kit the worker's token).
//!
//! - `GET /health`: 200 with a short body (the example: `{"status":"ok"}`,
//!   with its Content-Length). Every mode (`--app` any) needs this one.
//! - `POST /echo`: 200, the request body back byte for byte, each piece
//!   echoed as it arrives (not once the body is complete); the response
//!   carries the request's `Content-Type` (or `application/octet-stream`)
//!   and, if the request had one, its `Content-Length`.
//! - `POST /slow-sink?mibps=N`: reads the body at N MiB/s (a slow disk),
//!   then 200 with its length in decimal. Only for the 16-chunk bound,
//!   which without it holds a body on `GET /sleep?ms=6000` instead.
//! - `GET /sleep?ms=N`: 200 after N milliseconds (`slept N ms`), never
//!   reading a body; the app learns if its client went first. For the abort
//!   case, and for the 16-chunk bound when there is no `/slow-sink`.
//! - `GET /fail-before`: the app fails before it has a response (the worker
//!   answers 500 with a short text body).
//! - `GET /fail-after?n=N`: 200, N bytes of body, then the app fails (the
//!   worker sends `abort`).
//! - any other path (the kit uses `POST /conformance/no-such-route`): 404
//!   at once, the body left unread. With no worker token known to the kit,
//!   this is how `worker.flow.discard-unread` gets an answer the app gives
//!   without reading the body.
//!
//! - `GET /bytes?n=N`: 200, N bytes the app makes up (any content), with
//!   their Content-Length. For the chunk limit on a body the app generates
//!   (`worker.body.generated-chunks`).
//!
//! The example app also has `POST /sha256`; no case needs it.
#![allow(dead_code)] // ROUTES: for --list and the README

use crate::report::Outcome;

/// The routes each `--app example` case uses (cases not listed use `GET
/// /health` only, or nothing from the app).
pub const ROUTES: &[(&str, &[&str])] = &[
    (
        "worker.concurrency.open-stream",
        &["POST /echo", "GET /health"],
    ),
    ("worker.interleave.echo", &["POST /echo"]),
    (
        "worker.flow.16-chunk-bound",
        &[
            "POST /slow-sink?mibps=1, or else GET /sleep?ms=6000 (its body never read)",
            "GET /health",
        ],
    ),
    (
        "worker.flow.discard-unread",
        &[
            "POST /echo (401 without the worker token) or POST /conformance/no-such-route (404)",
            "GET /health",
        ],
    ),
    ("worker.app.fail-before", &["GET /fail-before"]),
    ("worker.app.fail-after", &["GET /fail-after?n=1000"]),
    (
        "worker.abort.request",
        &["GET /sleep?ms=1500", "GET /health"],
    ),
    ("worker.upload.interactive", &["POST /echo"]),
    ("worker.body.empty-chunks", &["POST /echo"]),
    ("worker.body.large-response", &["POST /echo"]),
    ("worker.body.generated-chunks", &["GET /bytes?n=3145745"]),
    ("worker.app.echo-contract", &["POST /echo"]),
];

/// The path a worker's app does not have: answered 404 without reading.
pub const NO_SUCH_ROUTE: &str = "/conformance/no-such-route";

/// Whether `status` says the app cannot serve the case: it has no such
/// route (404, 405, 501), or wants a worker token the kit does not have
/// (401).
pub fn lacks_route(status: Option<u16>) -> bool {
    matches!(status, Some(401 | 404 | 405 | 501))
}

/// The skip for a case whose route the app lacks (see [`lacks_route`]).
pub fn skip_route(route: &str, status: Option<u16>) -> Outcome {
    if status == Some(401) {
        return Outcome::Skip(format!(
            "the app answered {route} with 401: give the kit the worker's token (STRATA_WORKER_TOKEN, --worker-token-env)"
        ));
    }
    Outcome::Skip(format!(
        "the app has no {route} (answered {}); see --app example's routes",
        status.map_or("nothing".into(), |s| s.to_string())
    ))
}
