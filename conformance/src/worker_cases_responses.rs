//! Worker mode, issue 41's cases: what every response a worker sends must
//! hold whatever its app does, and the example app's contract the kit's
//! `--app example` cases rely on.
//!
//! - `worker.body.generated-chunks`: a body the app makes up (`GET
//!   /bytes`), not one it echoes, also goes out in chunks of at most
//!   1 MiB. (The observer measures every chunk of every response; this
//!   case makes sure one large generated body is among them.)

use crate::case;
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::worker_app_contract::{lacks_route, skip_route};
use crate::worker_ctx::{Answered, WorkerCtx, STEP};
use worker_relay::frame::MAX_CHUNK_BODY;

pub const FRAMES: &str = "§Frames";

pub fn cases() -> Vec<Case<WorkerCtx>> {
    vec![
        case!(WorkerCtx, "worker.body.generated-chunks", FRAMES, Needs::Example, long = false, terminal = false,
            "a body of 3 MiB + 17 bytes the app makes up (GET /bytes?n=3145745) comes whole, in chunks of at most 1 MiB, matching its Content-Length", generated_chunks),
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

/// The stream's `Content-Length` values.
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
