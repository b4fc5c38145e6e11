//! Worker mode, issue 27's cases: empty chunks in a request body, responses
//! of several MiB, a keepalive whose pongs arrive, and a seeded barrage of
//! random frames.

use crate::case;
use crate::report::{judge, Outcome};
use crate::runner::{Case, Needs};
use crate::worker_app_contract::{lacks_route, skip_route};
use crate::worker_ctx::{Answered, WorkerCtx, STEP};
use crate::ws_send::WsSend;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as WsMsg;
use worker_relay::frame::{ControlFrame, StreamId, MAX_CHUNK_BODY};

pub const CONNECTING: &str = "§Connecting";
pub const FRAMES: &str = "§Frames";
pub const W2R: &str = "§Worker-to-relay";

pub fn cases() -> Vec<Case<WorkerCtx>> {
    vec![
        case!(WorkerCtx, "worker.body.empty-chunks", FRAMES, Needs::Example, long = false, terminal = false,
            "a body to /echo with empty chunks (first, and between pieces) is echoed whole: an empty chunk carries nothing and does not end the body", empty_chunks),
        case!(WorkerCtx, "worker.body.large-response", W2R, Needs::Example, long = false, terminal = false,
            "5 MiB to /echo (1 MiB chunks, then odd sizes) comes back whole, in order, on its id, in chunks of at most 1 MiB, matching its Content-Length", large_response),
        case!(WorkerCtx, "worker.idle.pongs", CONNECTING, Needs::Any, long = false, terminal = false,
            "with its pings answered, the worker pings within 25 s, keeps the connection for 40 s (two pings) and then answers /health", pongs),
        case!(WorkerCtx, "worker.robust.random-frames", FRAMES, Needs::Any, long = false, terminal = false,
            "a seeded barrage of 300 malformed, unknown and misaddressed frames: the worker still answers /health (closing and redialling: WARN)", random_frames),
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

fn ended(a: &Answered) -> &'static str {
    match (a.ended, a.aborted) {
        (true, _) => "end",
        (_, true) => "abort",
        _ => "neither end nor abort",
    }
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ salt).collect()
}

async fn empty_chunks(ctx: &mut WorkerCtx) -> Outcome {
    let mut h = ctx.auth();
    h.push(("content-type".into(), "application/octet-stream".into()));
    let c = tryf!(ctx.conn().await);
    let id = c.fresh_id();
    let k = id.get();
    tryf!(c.request(id, "POST", "/echo", "", &h, b"", false).await);
    let pieces = [
        Vec::new(),
        pattern(10_000, 1),
        Vec::new(),
        Vec::new(),
        pattern(20_000, 2),
        Vec::new(),
        pattern(5_000, 3),
    ];
    let whole: Vec<u8> = pieces.concat();
    for p in &pieces {
        tryf!(c.send_chunk(id, p).await);
    }
    // The echo of all of it, before the kit's `end`: a worker that took an
    // empty chunk for the end has ended (or dropped) the stream by now.
    let n = whole.len();
    c.until(Duration::from_secs(3), |m| {
        m.get(&k)
            .is_some_and(|s| s.body.len() >= n || s.ended || s.aborted)
    })
    .await;
    let early = c.streams.get(&k).cloned().unwrap_or_default();
    if lacks_route(early.status) {
        let _ = c.send_control(&ControlFrame::Abort { id }).await;
        return skip_route("POST /echo", early.status);
    }
    let early_end = early.ended || early.aborted;
    tryf!(c.send_control(&ControlFrame::End { id }).await);
    let a = c.finished(id, STEP).await;
    let figure = format!(
        "4 empty chunks among 3 pieces ({n} bytes): {} bytes echoed{}, {}",
        a.body.len(),
        if a.body == whole {
            " byte for byte"
        } else {
            " (not the body sent)"
        },
        if early_end {
            format!(
                "the stream {} after {} bytes, before the kit's end",
                ended(&early),
                early.body.len()
            )
        } else {
            format!("then {}", ended(&a))
        }
    );
    judge(
        !early_end && a.body == whole && a.ended && !a.aborted,
        figure,
    )
}

/// Sends `body` to `/echo` in pieces of `sizes` (cycled), with its
/// Content-Length; the answer.
async fn echo_big(ctx: &mut WorkerCtx, body: &[u8], sizes: &[usize]) -> Result<Answered, String> {
    let mut h = ctx.auth();
    h.push(("content-type".into(), "application/octet-stream".into()));
    h.push(("content-length".into(), body.len().to_string()));
    let c = ctx.conn().await?;
    let id = c.fresh_id();
    c.request(id, "POST", "/echo", "", &h, b"", false).await?;
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at >= body.len() {
            break;
        }
        let end = (at + size).min(body.len());
        c.send_chunk(id, &body[at..end]).await?;
        at = end;
        // Take what is echoed meanwhile (no worker waits on a kit that does not read).
        c.pump(Duration::from_millis(2)).await;
    }
    c.send_control(&ControlFrame::End { id }).await?;
    Ok(c.finished(id, STEP * 2).await)
}

fn big_figure(what: &str, sent: &[u8], a: &Answered) -> (bool, String) {
    let cl = a
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.clone());
    let cl_ok = cl
        .as_deref()
        .is_none_or(|v| v.trim().parse::<usize>().ok() == Some(a.body.len()));
    let ok = a.status == Some(200)
        && a.body == sent
        && a.ended
        && !a.aborted
        && a.max_chunk <= MAX_CHUNK_BODY
        && cl_ok;
    let figure = format!(
        "{what}: {}, {} of {} bytes back{} in {} chunks (largest {}), Content-Length {}, {}",
        a.status.map_or("no response".into(), |s| s.to_string()),
        a.body.len(),
        sent.len(),
        if a.body == sent || a.body.is_empty() {
            ""
        } else {
            " (not the body sent)"
        },
        a.chunks,
        a.max_chunk,
        cl.unwrap_or("none".into()),
        ended(a)
    );
    (ok, figure)
}

async fn large_response(ctx: &mut WorkerCtx) -> Outcome {
    let body = pattern(5 * MAX_CHUNK_BODY, 7);
    let a = tryf!(echo_big(ctx, &body, &[MAX_CHUNK_BODY]).await);
    if lacks_route(a.status) {
        return skip_route("POST /echo", a.status);
    }
    let (ok1, f1) = big_figure("5 MiB in 1 MiB chunks", &body, &a);
    let odd = pattern(5 * MAX_CHUNK_BODY + 12_345, 9);
    let b = tryf!(echo_big(ctx, &odd, &[777_777, MAX_CHUNK_BODY, 3, 65_537, 1, 999_999]).await);
    let (ok2, f2) = big_figure("5 MiB + 12345 in odd sizes", &odd, &b);
    judge(ok1 && ok2, format!("{f1}; {f2}"))
}

async fn pongs(ctx: &mut WorkerCtx) -> Outcome {
    const FIRST: Duration = Duration::from_secs(25);
    const HOLD: Duration = Duration::from_secs(40);
    let c = tryf!(ctx.conn().await);
    let start = Instant::now();
    let n0 = c.pings.len();
    let at = |c: &crate::worker_ctx::Conn| -> Vec<f64> {
        c.pings[n0..]
            .iter()
            .map(|p| p.duration_since(start).as_secs_f64())
            .collect()
    };
    loop {
        let pings = at(c);
        let now = start.elapsed();
        if pings.len() >= 2 && now >= HOLD {
            break;
        }
        if c.closed.is_some() {
            return Outcome::Fail(format!(
                "the worker closed the connection {:.1} s into the case although the kit answered its pings (at {pings:.1?} s) with pongs",
                now.as_secs_f64()
            ));
        }
        let last = pings.last().copied().unwrap_or(0.0);
        if now.as_secs_f64() - last > FIRST.as_secs_f64() {
            return Outcome::Fail(format!(
                "no ping for {} s (pings at {pings:.1?} s; the spec: every 20 s)",
                FIRST.as_secs()
            ));
        }
        c.step(Duration::from_millis(500)).await;
    }
    let pings = at(c);
    let back = c.responsive(STEP).await;
    judge(
        back.is_some(),
        format!(
            "pings at {pings:.1?} s, each answered; the connection kept {:.0} s; then /health {}",
            start.elapsed().as_secs_f64(),
            back.map_or("not answered".into(), |d| format!(
                "answered in {} ms",
                d.as_millis()
            ))
        ),
    )
}

/// The barrage's seed (printed in the figure; change it to explore).
pub const SEED: u64 = 0x5eed_2027_0000_0027;
const BARRAGE: usize = 300;
const MAX_BYTES: usize = 1024 * 1024;

/// xorshift64: small, seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// One random frame: its label and the message. `open` are ids the kit
/// opened (with valid requests) during the barrage.
fn random_frame(r: &mut Rng, fresh: u32, open: &[u32]) -> (&'static str, WsMsg, bool) {
    const BAD_IDS: &[&str] = &[
        "0",
        "-1",
        "4294967296",
        "18446744073709551615",
        "1.5",
        "1e3",
        "\"12\"",
        "null",
        "[1]",
        "{}",
    ];
    const METHODS: &[&str] = &[
        "\"GET\"",
        "\"POST\"",
        "\"\"",
        "\"G E T\"",
        "\"get\"",
        "7",
        "null",
        "\"DELETE\"",
        "\"\\u0100\"",
    ];
    const PATHS: &[&str] = &[
        "\"/health\"",
        "\"health\"",
        "\"\"",
        "\"/%zz\"",
        "\"/../../etc/passwd\"",
        "\"/a b\"",
        "5",
        "null",
        "\"/\\u0000\"",
        "\"/conformance/no-such-route\"",
    ];
    const QUERIES: &[&str] = &["\"\"", "\"x=1\"", "\"%\"", "7", "null", "\"a=\\u0100\""];
    const HEADERS: &[&str] = &[
        "[]",
        "[[\"x-a\",\"b\"]]",
        "[[\"a\"]]",
        "[[1,2]]",
        "\"x\"",
        "{\"a\":\"b\"}",
        "[[\"content-length\",\"5\"]]",
        "[[\"content-length\",\"nope\"]]",
        "[[\"authorization\",\"Bearer nope\"]]",
        "[[\"x\",\"\\u0100\"]]",
        "null",
        "[[\"a\",\"b\",\"c\"]]",
    ];
    const TYPES: &[&str] = &[
        "\"hello\"",
        "\"REQUEST\"",
        "\"response\"",
        "\"\"",
        "5",
        "null",
        "[\"end\"]",
    ];
    const GARBAGE: &[&str] = &[
        "",
        "{",
        "null",
        "[]",
        "\"str\"",
        "{}",
        "{\"type\":\"request\"",
        "{\"id\":3}",
        "\u{1}\u{2}",
        "42",
        "{\"type\":\"end\",\"id\":1,\"id\":2}",
    ];
    let not_open = || 2_000_000_000 + (fresh % 1000);
    let any_id = |r: &mut Rng| -> String {
        match r.below(4) {
            0 => r.pick(BAD_IDS).to_string(),
            1 if !open.is_empty() => r.pick(open).to_string(),
            2 => not_open().to_string(),
            _ => (1 + r.below(5000)).to_string(),
        }
    };
    let field = |r: &mut Rng, name: &str, v: String| -> String {
        if r.below(8) == 0 {
            String::new() // left out
        } else {
            format!(",\"{name}\":{v}")
        }
    };
    match r.below(6) {
        0 => {
            // A request: a fresh valid id (the kit opens it) or a bad one.
            let valid = r.below(2) == 0;
            let id = if valid {
                fresh.to_string()
            } else {
                r.pick(BAD_IDS).to_string()
            };
            let m = r.pick(METHODS).to_string();
            let p = r.pick(PATHS).to_string();
            let q = r.pick(QUERIES).to_string();
            let h = r.pick(HEADERS).to_string();
            let text = format!(
                "{{\"type\":\"request\",\"id\":{id}{}{}{}{}}}",
                field(r, "method", m),
                field(r, "path", p),
                field(r, "query", q),
                field(r, "headers", h)
            );
            ("request", WsMsg::Text(text.into()), valid)
        }
        1 => {
            let ty = r.pick(&["end", "abort"]);
            let text = format!("{{\"type\":\"{ty}\",\"id\":{}}}", any_id(r));
            (
                if ty == "end" { "end" } else { "abort" },
                WsMsg::Text(text.into()),
                false,
            )
        }
        2 => {
            let text = format!(
                "{{\"type\":{},\"id\":{},\"status\":200,\"headers\":[]}}",
                r.pick(TYPES),
                any_id(r)
            );
            ("unknown type", WsMsg::Text(text.into()), false)
        }
        3 => (
            "garbage text",
            WsMsg::Text(r.pick(GARBAGE).to_string().into()),
            false,
        ),
        4 => {
            let len = r.below(4);
            let b: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            ("short binary", WsMsg::Binary(b.into()), false)
        }
        _ => {
            let id = match r.below(3) {
                0 if !open.is_empty() => r.pick(open),
                1 => 0,
                _ => not_open(),
            };
            let len = r.pick(&[0usize, 1, 100, 2000]);
            let body: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            let mut b = id.to_be_bytes().to_vec();
            b.extend_from_slice(&body);
            ("chunk", WsMsg::Binary(b.into()), false)
        }
    }
}

async fn random_frames(ctx: &mut WorkerCtx) -> Outcome {
    let mut r = Rng(SEED);
    let c = tryf!(ctx.conn().await);
    let start = Instant::now();
    let budget = Duration::from_secs(20);
    let mut open: Vec<u32> = Vec::new();
    let mut bytes = 0;
    let mut sent = 0;
    let mut broke: Option<(usize, &'static str, String)> = None;
    for i in 0..BARRAGE {
        if bytes > MAX_BYTES || start.elapsed() > budget {
            break;
        }
        let fresh = c.fresh_id().get();
        let (what, m, opens) = random_frame(&mut r, fresh, &open);
        bytes += m.len();
        if let Err(e) = c.send(m).await {
            broke = Some((i, what, e));
            break;
        }
        sent += 1;
        if opens {
            open.push(fresh);
        }
        if i % 20 == 19 {
            c.pump(Duration::from_millis(1)).await;
            if c.closed.is_some() {
                broke = Some((i, what, "the worker closed the connection".into()));
                break;
            }
        }
    }
    let took = start.elapsed();
    // Let go of the streams the barrage opened.
    if broke.is_none() {
        for k in c.obs.open_ids(&c.streams) {
            if let Some(id) = StreamId::new(k) {
                let _ = c.send_control(&ControlFrame::Abort { id }).await;
            }
        }
    }
    let figure = format!(
        "seed {SEED:#018x}: {sent} frames ({bytes} bytes) in {} ms",
        took.as_millis()
    );
    let back = if c.closed.is_none() && broke.is_none() {
        c.responsive(STEP).await
    } else {
        None
    };
    if let Some(d) = back {
        return Outcome::Pass(format!(
            "{figure}; connection kept; /health answered in {} ms",
            d.as_millis()
        ));
    }
    let closed = c.closed.is_some() || broke.is_some();
    if !closed {
        return Outcome::Fail(format!(
            "{figure}; the connection is open but /health was not answered within {} s",
            STEP.as_secs()
        ));
    }
    let when = broke.map_or("after the barrage".into(), |(i, what, _)| {
        format!("by frame {} (the last sent, a {what})", i + 1)
    });
    ctx.conn = None;
    let again = match ctx.conn().await {
        Ok(c) => c.responsive(STEP).await,
        Err(_) => None,
    };
    match again {
        Some(d) => Outcome::Warn(format!(
            "{figure}; the worker closed the connection {when}, redialled and answered /health in {} ms on the new one; \
             closing on garbage is not forbidden by the spec, but it fails every stream in flight",
            d.as_millis()
        )),
        None => Outcome::Fail(format!(
            "{figure}; the worker closed the connection {when} and did not come back to answer /health"
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_barrage_is_the_same_every_run() {
        let mut a = super::Rng(super::SEED);
        let mut b = super::Rng(super::SEED);
        for _ in 0..100 {
            assert_eq!(a.next(), b.next());
        }
    }
}
