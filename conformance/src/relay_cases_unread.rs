//! Relay mode: a worker's connection that stops reading, then is replaced
//! (issue 23). The kit makes the relay queue an upload towards the worker's
//! connection and never reads that socket, so the relay's writes to it
//! block; then it dials again with the same token. The newer connection
//! must serve requests, and the relay must let go of the older one within a
//! deadline although the kit still does not read it: a relay that closes a
//! replaced connection with a close frame cannot wait for that frame to be
//! written, since a peer that never reads never takes it.
//!
//! How the kit sees the relay let go without reading (which would unblock a
//! relay waiting for its write to drain): its own socket, in the kernel.
//! When the relay closes its end, its FIN is queued behind the data the kit
//! did not read, so it cannot arrive; but the relay's kernel answers any
//! data sent to a closed socket with a reset (RFC 1122; Linux and the BSDs
//! do). So once a second the kit writes a small WebSocket ping on the older
//! connection (a write, never a read), and watches for the reset: the
//! socket's pending error (`SO_ERROR`), a failed write, or the connection
//! gone from `/proc/net/tcp` (or in CLOSE_WAIT, had a FIN arrived). A relay
//! still holding the socket takes the pings into its buffer, and nothing
//! happens. Whatever language the relay is written in, this is what its
//! kernel does.

use crate::case;
use crate::relay_cases_http::call;
use crate::relay_ctx::{dial_small_window, Dial, FakeWorker, RelayCtx, STEP};
use crate::report::Outcome;
use crate::runner::{Case, Needs};
use crate::tcp_state::{self, Seen};
use crate::{http, tcp_state::state_name};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use worker_relay::frame::SUBPROTOCOL;

pub const CONNECTING: &str = "§Connecting";
/// How long after the newer connection's 101 the relay may hold the older
/// one (the crate's relay closes a replaced connection within 5 s).
pub const LET_GO: Duration = Duration::from_secs(15);
/// The older connection's receive buffer: small, so the relay's writes
/// block after a few MiB whatever the kernel's autotuning would allow.
const RCVBUF: u32 = 16 * 1024;
/// The upload's announced length (the caller sends what the relay takes).
const UPLOAD: u64 = 64 << 20;

pub fn cases() -> Vec<Case<RelayCtx>> {
    vec![case!(RelayCtx, "relay.replace.unread-older", CONNECTING, Needs::Any, long = false, terminal = false,
        "a worker connection that stops reading (an upload queued to it) is replaced: the newer serves requests (FAIL if not), and the relay lets go of the older within 15 s though the kit never reads it (recommended: WARN)", unread_older)]
}

fn retryable(s: u16) -> bool {
    !(400..500).contains(&s) || s == 408 || s == 429
}

/// Dials until accepted, for at most 10 s while the relay answers a
/// retryable refusal (a relay that refuses duplicates, still holding a
/// connection the kit just closed).
async fn dial_until_accepted(ctx: &RelayCtx, small: bool) -> Result<FakeWorker, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let token = ctx.t.token.clone();
    loop {
        let d = if small {
            let url = ctx.ws_url();
            dial_small_window(
                &ctx.t.authority,
                &url,
                Some(&token),
                Some(SUBPROTOCOL),
                RCVBUF,
            )
            .await
        } else {
            ctx.dial(Some(&token), Some(SUBPROTOCOL)).await
        };
        match d {
            Dial::Connected(w, _) => return Ok(*w),
            Dial::Refused(s) if retryable(s) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            Dial::Refused(s) => return Err(format!("the worker's dial was refused with {s}")),
            Dial::Failed(e) => return Err(format!("the worker's dial failed: {e}")),
        }
    }
}

/// What the upload's caller saw (not judged: reported).
#[derive(Debug, Default)]
struct UploadEnd {
    sent: u64,
    status: Option<u16>,
    cut: bool,
}

impl UploadEnd {
    fn text(&self) -> String {
        let mib = self.sent as f64 / (1 << 20) as f64;
        match (self.status, self.cut) {
            (Some(s), _) => format!("the upload's caller got {s} after sending {mib:.1} MiB"),
            (None, true) => format!("the upload's caller was cut off after {mib:.1} MiB"),
            (None, false) => format!("the upload's caller, {mib:.1} MiB sent, had no answer"),
        }
    }
}

/// POSTs `total` bytes (as fast as the relay takes them) until the relay
/// answers or closes, or 60 s pass; the case aborts it before.
fn upload(authority: String, target: String, total: u64) -> JoinHandle<UploadEnd> {
    tokio::spawn(async move {
        let mut end = UploadEnd::default();
        let Ok(mut s) = http::connect(&authority, STEP).await else {
            end.cut = true;
            return end;
        };
        let len = total.to_string();
        let headers = [
            ("content-length", len.as_str()),
            ("content-type", "application/octet-stream"),
        ];
        let head = http::head("POST", &target, &authority, &headers);
        if http::write_all(&mut s, &head, STEP).await.is_err() {
            end.cut = true;
            return end;
        }
        let piece = vec![0x5au8; 256 * 1024];
        let (mut rd, mut wr) = s.split();
        let mut answer = Vec::new();
        let mut tmp = [0u8; 256];
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = (total - end.sent).min(piece.len() as u64) as usize;
            tokio::select! {
                r = rd.read(&mut tmp) => match r {
                    Ok(0) | Err(_) => { end.cut = true; break }
                    Ok(n) => {
                        answer.extend_from_slice(&tmp[..n]);
                        if let Some(line) = answer.split(|b| *b == b'\n').next().filter(|_| answer.contains(&b'\n')) {
                            end.status = String::from_utf8_lossy(line).split(' ').nth(1).and_then(|s| s.trim().parse().ok());
                            break;
                        }
                    }
                },
                w = wr.write(&piece[..left]), if left > 0 => match w {
                    Ok(n) => end.sent += n as u64,
                    Err(_) => { end.cut = true; break }
                },
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        end
    })
}

/// Waits until the relay's writes to the older connection are stuck: the
/// bytes the kit has not read stop growing (at most 10 s). The bytes held,
/// if the kernel shows them.
async fn wait_stuck(local: SocketAddr, peer: SocketAddr) -> Result<Option<u64>, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut last, mut same) = (0u64, 0);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        match tcp_state::lookup(local, peer) {
            Seen::Unknown => {
                // No /proc: give the relay time to fill the buffers.
                tokio::time::sleep(Duration::from_secs(3)).await;
                return Ok(None);
            }
            Seen::Gone => {
                return Err("the older connection was reset before it was replaced".into())
            }
            Seen::Found(e) => {
                same = if e.rx_queue == last { same + 1 } else { 0 };
                last = e.rx_queue;
                if last > 0 && same >= 4 {
                    return Ok(Some(last));
                }
            }
        }
        if Instant::now() >= deadline {
            return match last {
                0 => Err("nothing of the upload reached the worker's connection in 10 s".into()),
                n => Ok(Some(n)),
            };
        }
    }
}

/// A masked WebSocket ping (client to server), payload "kit".
const PING: [u8; 9] = [0x89, 0x83, 1, 2, 3, 4, b'k' ^ 1, b'i' ^ 2, b't' ^ 3];

/// Watches the older connection, never reading it, until the relay has let
/// go of it or `deadline`: how long after `t0`, and how it showed.
async fn watch_let_go(
    tcp: &TcpStream,
    local: SocketAddr,
    peer: SocketAddr,
    t0: Instant,
    deadline: Instant,
) -> Result<(Duration, String), String> {
    let mut next_probe = Instant::now();
    let mut probing = true;
    loop {
        if let Ok(Some(e)) = tcp.take_error() {
            return Ok((t0.elapsed(), format!("reset ({e})")));
        }
        let seen = tcp_state::lookup(local, peer);
        match seen {
            Seen::Gone => return Ok((t0.elapsed(), "reset".into())),
            Seen::Found(e) if e.state == tcp_state::CLOSE_WAIT => {
                return Ok((t0.elapsed(), "closed (FIN)".into()))
            }
            Seen::Found(e) if e.state == tcp_state::CLOSE => {
                return Ok((t0.elapsed(), "reset".into()))
            }
            _ => {}
        }
        if probing && Instant::now() >= next_probe {
            match tcp.try_write(&PING) {
                Ok(n) if n == PING.len() => {}
                // Half a frame went: write nothing more on it.
                Ok(_) => probing = false,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Ok((t0.elapsed(), format!("reset (a write failed: {e})"))),
            }
            next_probe += Duration::from_secs(1);
        }
        if Instant::now() >= deadline {
            return Err(match seen {
                Seen::Found(e) => format!(
                    "{}, {} bytes unread by the kit",
                    state_name(e.state),
                    e.rx_queue
                ),
                _ => "no reset seen".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A GET through the relay, answered on `newer`.
async fn served_by(ctx: &RelayCtx, newer: &mut FakeWorker) -> Result<(), String> {
    let path = "/conformance/unread-newer";
    let mut caller = call(ctx, "GET", &ctx.target(path), &[], Vec::new());
    let id = match newer.expect_request(path, Duration::from_secs(5)).await {
        Ok((id, _)) => id,
        Err(e) => {
            caller.abort();
            return Err(format!("a GET did not reach the newer connection: {e}"));
        }
    };
    if let Err(e) = newer
        .respond(id, 200, &[("content-length", "5")], b"newer")
        .await
    {
        caller.abort();
        return Err(e);
    }
    let answered = tokio::time::timeout(STEP, &mut caller).await;
    caller.abort();
    match answered {
        Ok(Ok(Ok(r))) if r.status == 200 && r.body == b"newer" => Ok(()),
        Ok(Ok(Ok(r))) => Err(format!(
            "the GET answered on the newer connection reached its caller as {} ({} bytes)",
            r.status,
            r.body.len()
        )),
        Ok(Ok(Err(e))) => Err(format!("the GET's caller failed: {e}")),
        Ok(Err(e)) => Err(format!("the GET's caller failed: {e}")),
        Err(_) => Err(format!(
            "the GET answered on the newer connection did not reach its caller in {} s",
            STEP.as_secs()
        )),
    }
}

async fn unread_older(ctx: &mut RelayCtx) -> Outcome {
    // Start from no connection of the kit's, closed properly.
    if let Some(mut w) = ctx.drop_worker() {
        let _ = tokio::time::timeout(Duration::from_secs(2), w.ws.close(None)).await;
        let _ = w.drain(Duration::from_millis(200)).await;
    }
    let older = match dial_until_accepted(ctx, true).await {
        Ok(w) => w,
        Err(e) => return Outcome::Fail(e),
    };
    let Some(tcp) = older.tcp() else {
        return Outcome::Fail("the older connection is not plain TCP".into());
    };
    let (Ok(local), Ok(peer)) = (tcp.local_addr(), tcp.peer_addr()) else {
        return Outcome::Fail("the older connection has no addresses".into());
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let up = upload(
        ctx.t.authority.clone(),
        ctx.target("/conformance/unread-older"),
        UPLOAD,
    );
    let held = match wait_stuck(local, peer).await {
        Ok(h) => h,
        Err(e) => {
            up.abort();
            drop(older);
            return Outcome::Fail(e);
        }
    };
    let held = held.map_or("the kit stopped reading the older connection".into(), |n| {
        format!(
            "the kit held {} KiB unread on the older connection",
            n / 1024
        )
    });
    let token = ctx.t.token.clone();
    let mut newer = match ctx.dial(Some(&token), Some(SUBPROTOCOL)).await {
        Dial::Connected(w, _) => *w,
        Dial::Refused(s) if retryable(s) => {
            // A relay that refuses duplicates: the spec leaves a second
            // connection to the relay. Let go of the older (the kit's close
            // resets it) and get connected again for the next cases.
            up.abort();
            drop(older);
            return match dial_until_accepted(ctx, false).await {
                Ok(w) => {
                    ctx.set_worker(w);
                    Outcome::Info(format!(
                        "{held}; the second connection was refused with {s} (retryable): the relay keeps the older one, so there is no replaced connection to let go"
                    ))
                }
                Err(e) => Outcome::Fail(format!(
                    "the second connection was refused with {s}, and after the kit closed the older one: {e}"
                )),
            };
        }
        Dial::Refused(s) => {
            up.abort();
            return Outcome::Warn(format!(
                "the second connection was refused with {s}: a reconnecting worker would exit (accepting it is recommended)"
            ));
        }
        Dial::Failed(e) => {
            up.abort();
            return Outcome::Fail(format!("the second dial failed: {e}"));
        }
    };
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let served = served_by(ctx, &mut newer).await;
    let tcp = older.tcp().expect("plain");
    let let_go = watch_let_go(tcp, local, peer, t0, t0 + LET_GO).await;
    let caller = if up.is_finished() {
        up.await.unwrap_or_default().text()
    } else {
        up.abort();
        "the upload's caller had no answer".into()
    };
    // The kit's close resets the older connection (it holds unread data).
    drop(older);
    ctx.set_worker(newer);
    let served_text = match &served {
        Ok(()) => "a GET was served by the newer connection".to_string(),
        Err(e) => e.clone(),
    };
    let let_go_text = match &let_go {
        Ok((after, how)) => format!(
            "the relay let go of the older {:.1} s after the newer's 101: {how} (bound {} s)",
            after.as_secs_f64(),
            LET_GO.as_secs()
        ),
        Err(state) => format!(
            "the relay still held the older {} s after the newer's 101 ({state})",
            LET_GO.as_secs()
        ),
    };
    // Serving the newer connection is what keeps the worker reachable
    // (FAIL if not); how soon the older is let go is this kit's
    // recommendation (the spec says nothing of a second connection).
    let text = format!("{held}; {served_text}; {let_go_text}; {caller}");
    if served.is_err() {
        Outcome::Fail(text)
    } else {
        crate::report::recommend(let_go.is_ok(), text)
    }
}
