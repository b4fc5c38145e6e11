//! The deliberately broken worker for the conformance kit's mutation tests
//! (the broken relays are in `fakes.rs`): written straight on
//! tokio-tungstenite, with knobs that each break one rule of the protocol.

use crate::TOKEN;
use futures_util::{SinkExt, StreamExt};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message as WsMsg};
use tokio_tungstenite::WebSocketStream;
use worker_relay::frame::{
    self, ControlFrame, Decoded, Headers, ResponseHead, StreamId, SUBPROTOCOL,
};

#[derive(Clone, Copy, Default)]
pub struct WorkerFlaws {
    /// Dials again after a 401.
    pub redial_after_final: bool,
    /// Closes the connection on a message it cannot decode.
    pub close_on_malformed: bool,
    /// Closes the connection on a frame of an unknown type.
    pub close_on_unknown: bool,
    /// Answers a stream the relay aborted.
    pub answer_after_abort: bool,
    /// Offers no subprotocol.
    pub no_protocol: bool,
    /// Ignores requests whose id does not fit an i32.
    pub small_ids: bool,
    /// Ignores a request whose id was used before.
    pub no_id_reuse: bool,
    /// Ignores other requests while a request body is still arriving.
    pub serial: bool,
    /// Keeps every stream's body in one buffer.
    pub one_body: bool,
    /// Holds the body of a request it answered without reading, and stops
    /// reading the socket at 16 such chunks.
    pub hold_unread: bool,
    /// Ends a response whose app failed after it started (`end`, not `abort`).
    pub end_after_failure: bool,
    /// Sends `abort`, not a 500, when its app fails before the response.
    pub abort_before_response: bool,
    /// Echoes a body without Content-Length only once it has all of it
    /// (without the flaw, each piece as it comes).
    pub hold_echo: bool,
    /// Takes a request on id 0 (which it cannot decode) and answers it on id 0.
    pub id_zero: bool,
    /// Answers in chunks of 2 MiB (without the flaw, at most 1 MiB).
    pub big_chunks: bool,
    /// Takes an empty chunk for the end of the request body.
    pub empty_chunk_ends: bool,
    /// Says Content-Length one more than the body it sends.
    pub wrong_content_length: bool,
    /// Closes the connection 20 s after connecting, although its pings are answered.
    pub close_every_20s: bool,
    /// Stops answering (but keeps reading) after a message it cannot decode.
    pub wedge_on_garbage: bool,
    /// Has no `/slow-sink`: 404 at once, the body unread.
    pub no_slow_sink: bool,
    /// Has no `/sleep` either.
    pub no_sleep: bool,
    /// Takes messages up to 1 MiB + 3 bytes only: a full chunk (1 MiB + 4)
    /// ends the connection (an off-by-one limit).
    pub limit_one_short: bool,
    /// Keeps its reconnect delay growing after a handshake succeeds (no
    /// reset to 1 s).
    pub no_backoff_reset: bool,
    /// Sends the bodies it makes up (`/bytes`) in chunks of 2 MiB; what it
    /// echoes stays within 1 MiB a chunk.
    pub big_generated_chunks: bool,
    /// Its 404 and 500 answers carry its connect token in a header (a
    /// debugging aid left on).
    pub token_in_header: bool,
    /// Its 404 and 500 answers' bodies dump its configuration, connect
    /// token included.
    pub token_in_body: bool,
    /// `/echo` answers without the request's Content-Type.
    pub echo_drops_content_type: bool,
}

/// A worker that reads everything into memory (no 16-chunk bound) and has
/// no message size limit; it pings every 10 s but never checks for pongs.
/// Its app: `/health`, `/sleep?ms=`, `/echo` (401 at once without the
/// worker token; a body without Content-Length is echoed piece by piece;
/// the request's Content-Type back), `/fail-before`, `/fail-after?n=`,
/// `/slow-sink` (reads at once, answers the length at its end),
/// `/bytes?n=` (n bytes of a pattern), anything else 404 at once, the body
/// unread.
/// Broken further by `flaws`.
pub async fn worker(url: String, flaws: WorkerFlaws) {
    let mut delay = 1.0f64;
    for _ in 0..100 {
        let mut req = url.as_str().into_client_request().unwrap();
        if !flaws.no_protocol {
            req.headers_mut()
                .insert("sec-websocket-protocol", SUBPROTOCOL.parse().unwrap());
        }
        req.headers_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        let limit = flaws.limit_one_short.then_some(frame::MAX_MESSAGE_LEN - 1);
        let config = WebSocketConfig::default()
            .max_message_size(limit)
            .max_frame_size(limit);
        match tokio_tungstenite::connect_async_with_config(req, Some(config), true).await {
            Ok((ws, _)) => {
                if !flaws.no_backoff_reset {
                    delay = 1.0;
                }
                serve(ws, flaws).await;
            }
            Err(tungstenite::Error::Http(r)) if r.status() == 401 && !flaws.redial_after_final => {
                return
            }
            Err(_) => {}
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let jitter = (nanos % 1000) as f64 / 1000.0;
        tokio::time::sleep(Duration::from_secs_f64(delay * (0.5 + 0.5 * jitter))).await;
        delay = (delay * 2.0).min(60.0);
    }
}

async fn serve<S>(ws: WebSocketStream<S>, flaws: WorkerFlaws)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let (due_tx, mut due) = mpsc::unbounded_channel::<StreamId>();
    // Requests whose body is still arriving, by id.
    let mut open: HashMap<u32, String> = HashMap::new();
    let mut bodies: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut aborted: HashSet<u32> = HashSet::new();
    let mut used: HashSet<u32> = HashSet::new();
    // Answered without reading: chunks held since.
    let mut unread: HashMap<u32, usize> = HashMap::new();
    // Echoed as they come (a body without Content-Length).
    let mut echoing: HashSet<u32> = HashSet::new();
    // The Content-Type each `/echo` answers with.
    let mut echo_type: HashMap<u32, String> = HashMap::new();
    let auth = format!("Bearer {}", crate::WORKER_TOKEN);
    let answer = |id, status, body| answer(id, status, &[], body, flaws);
    let every = Duration::from_secs(10);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let doom = tokio::time::sleep(Duration::from_secs(20));
    tokio::pin!(doom);
    let mut wedged = false;
    loop {
        let m = tokio::select! {
            m = stream.next() => match m { Some(Ok(m)) => m, _ => return },
            Some(id) = due.recv() => {
                if aborted.contains(&id.get()) && !flaws.answer_after_abort {
                    continue;
                }
                for m in answer(id, 200, b"slept".to_vec()) {
                    if sink.send(m).await.is_err() { return; }
                }
                continue;
            }
            _ = ping.tick() => {
                if sink.send(WsMsg::Ping(Vec::new().into())).await.is_err() { return; }
                continue;
            }
            _ = &mut doom, if flaws.close_every_20s => return close(&mut sink).await,
        };
        let zero = match &m {
            WsMsg::Text(t) if flaws.id_zero => {
                serde_json::from_str::<serde_json::Value>(t.as_str())
                    .ok()
                    .filter(|v| v["type"] == "request" && v["id"] == 0)
            }
            _ => None,
        };
        if zero.is_some() {
            // Answers on id 0, as a lenient decoder that takes 0 for an id would.
            let mut chunk = vec![0u8; 4];
            chunk.extend_from_slice(br#"{"status":"ok"}"#);
            for m in [
                WsMsg::Text(r#"{"type":"response","id":0,"status":200,"headers":[]}"#.into()),
                WsMsg::Binary(chunk.into()),
                WsMsg::Text(r#"{"type":"end","id":0}"#.into()),
            ] {
                if sink.send(m).await.is_err() {
                    return;
                }
            }
            continue;
        }
        let decoded = match m {
            WsMsg::Text(t) => frame::decode_text(t.as_str()),
            WsMsg::Binary(b) => frame::decode_binary(b),
            WsMsg::Close(_) => return,
            _ => continue,
        };
        let d = match decoded {
            Ok(Decoded::Unknown) if flaws.close_on_unknown => return close(&mut sink).await,
            Ok(Decoded::Chunk(c)) if flaws.empty_chunk_ends && c.data.is_empty() => {
                Decoded::Control(ControlFrame::End { id: c.id })
            }
            Ok(d) => d,
            Err(_) if flaws.close_on_malformed => return close(&mut sink).await,
            Err(_) => {
                wedged |= flaws.wedge_on_garbage;
                continue;
            }
        };
        if wedged {
            continue;
        }
        let key = |id: u32| if flaws.one_body { 0 } else { id };
        let reply: Vec<WsMsg> = match d {
            Decoded::Control(ControlFrame::Request { id, head }) => {
                let k = id.get();
                if (flaws.small_ids && k > i32::MAX as u32)
                    || (flaws.no_id_reuse && used.contains(&k))
                    || (flaws.serial && !open.is_empty())
                {
                    continue;
                }
                used.insert(k);
                aborted.remove(&k);
                let t = head.target();
                let path = t.split('?').next().unwrap_or("").to_string();
                let known = [
                    "/health",
                    "/echo",
                    "/sleep",
                    "/fail-before",
                    "/fail-after",
                    "/slow-sink",
                    "/bytes",
                ];
                if t == "/echo" && !flaws.echo_drops_content_type {
                    let ctype = head.headers().get("content-type");
                    let ctype = ctype.unwrap_or("application/octet-stream");
                    echo_type.insert(k, ctype.to_string());
                }
                if t == "/echo" && head.headers().get("authorization") != Some(auth.as_str()) {
                    unread.insert(k, 0);
                    answer(id, 401, b"unauthorized".to_vec())
                } else if !known.contains(&path.as_str())
                    || (flaws.no_slow_sink && path == "/slow-sink")
                    || (flaws.no_sleep && path == "/sleep")
                {
                    unread.insert(k, 0);
                    answer(id, 404, b"not found".to_vec())
                } else if t == "/echo"
                    && head.headers().get("content-length").is_none()
                    && !flaws.hold_echo
                {
                    echoing.insert(k);
                    let ctype = echo_type.get(&k).map(|t| ("content-type", t.as_str()));
                    vec![response(id, 200, Headers::try_from_pairs(ctype).unwrap())]
                } else {
                    open.insert(k, t);
                    continue;
                }
            }
            Decoded::Chunk(c) if echoing.contains(&c.id.get()) => {
                vec![WsMsg::Binary(frame::encode_chunk(c.id, &c.data))]
            }
            Decoded::Control(ControlFrame::End { id }) if echoing.remove(&id.get()) => {
                echo_type.remove(&id.get());
                vec![WsMsg::Text(ControlFrame::End { id }.encode().into())]
            }
            Decoded::Chunk(c) => {
                if let Some(held) = unread.get_mut(&c.id.get()) {
                    *held += 1;
                    if flaws.hold_unread && *held >= 16 {
                        // Waits for an app that will never read: reads nothing more.
                        std::future::pending::<()>().await;
                    }
                    continue;
                }
                bodies
                    .entry(key(c.id.get()))
                    .or_default()
                    .extend_from_slice(&c.data);
                continue;
            }
            Decoded::Control(ControlFrame::Abort { id }) => {
                echo_type.remove(&id.get());
                open.remove(&id.get());
                bodies.remove(&key(id.get()));
                unread.remove(&id.get());
                echoing.remove(&id.get());
                aborted.insert(id.get());
                continue;
            }
            Decoded::Control(ControlFrame::End { id }) => {
                unread.remove(&id.get());
                let body = bodies.remove(&key(id.get())).unwrap_or_default();
                match open.remove(&id.get()) {
                    Some(t) if t.starts_with("/sleep") => {
                        let ms: u64 = t
                            .split("ms=")
                            .nth(1)
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let tx = due_tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            let _ = tx.send(id);
                        });
                        continue;
                    }
                    Some(t) if t == "/health" => answer(id, 200, br#"{"status":"ok"}"#.to_vec()),
                    Some(t) if t.starts_with("/slow-sink") => {
                        answer(id, 200, body.len().to_string().into_bytes())
                    }
                    Some(t) if t == "/echo" => {
                        let ctype = echo_type.remove(&id.get()).map(|t| ("content-type", t));
                        self::answer(id, 200, &Vec::from_iter(ctype), body, flaws)
                    }
                    Some(t) if t.starts_with("/bytes") => {
                        let n: usize = t
                            .split("n=")
                            .nth(1)
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let body = (0..n).map(|i| (i % 251) as u8).collect();
                        let mut f = flaws;
                        f.big_chunks |= flaws.big_generated_chunks;
                        self::answer(id, 200, &[], body, f)
                    }
                    Some(t) if t == "/fail-before" => {
                        if flaws.abort_before_response {
                            vec![WsMsg::Text(ControlFrame::Abort { id }.encode().into())]
                        } else {
                            answer(id, 500, b"Internal Server Error".to_vec())
                        }
                    }
                    Some(t) if t.starts_with("/fail-after") => {
                        let mut m = answer(id, 200, vec![b'x'; 1000]);
                        if !flaws.end_after_failure {
                            m[2] = WsMsg::Text(ControlFrame::Abort { id }.encode().into());
                        }
                        // No Content-Length: the body's end is not known in advance.
                        m[0] = response(id, 200, Headers::new());
                        m
                    }
                    Some(_) => answer(id, 404, b"not found".to_vec()),
                    None => continue,
                }
            }
            _ => continue,
        };
        for m in reply {
            if sink.send(m).await.is_err() {
                return;
            }
        }
    }
}

async fn close<S: futures_util::Sink<WsMsg> + Unpin>(sink: &mut S) {
    let frame = CloseFrame {
        code: CloseCode::Protocol,
        reason: "malformed".into(),
    };
    let _ = sink.send(WsMsg::Close(Some(frame))).await;
}

fn response(id: StreamId, status: u16, headers: Headers) -> WsMsg {
    let head = ResponseHead::new(status, headers).unwrap();
    WsMsg::Text(ControlFrame::Response { id, head }.encode().into())
}

/// `response` (with `headers` and Content-Length), the body in chunks of
/// at most 1 MiB (at least one chunk), `end`.
fn answer(
    id: StreamId,
    status: u16,
    headers: &[(&str, String)],
    mut body: Vec<u8>,
    flaws: WorkerFlaws,
) -> Vec<WsMsg> {
    let mut headers = headers.to_vec();
    if matches!(status, 404 | 500) {
        if flaws.token_in_header {
            headers.push(("x-debug-connect-token", TOKEN.to_string()));
        }
        if flaws.token_in_body {
            let dump = format!("\nconfig: connect_token={TOKEN} worker=conformance\n");
            body.extend_from_slice(dump.as_bytes());
        }
    }
    let said = body.len() + usize::from(flaws.wrong_content_length);
    headers.push(("content-length", said.to_string()));
    let headers = Headers::try_from_pairs(headers).unwrap();
    let size = if flaws.big_chunks {
        2 * frame::MAX_CHUNK_BODY
    } else {
        frame::MAX_CHUNK_BODY
    };
    let mut m = vec![response(id, status, headers)];
    if body.is_empty() {
        m.push(WsMsg::Binary(frame::encode_chunk(id, &body)));
    }
    for piece in body.chunks(size) {
        m.push(WsMsg::Binary(frame::encode_chunk(id, piece)));
    }
    m.push(WsMsg::Text(ControlFrame::End { id }.encode().into()));
    m
}
