//! Deliberately broken relays for the conformance kit's mutation tests:
//! small relays written straight on tokio-tungstenite and raw TCP, each with
//! knobs that break one rule of the protocol (the worker is in
//! `fake_worker.rs`, re-exported here; the streaming relay for issue 23's
//! cases in `fake_stream_relay.rs`).

use crate::TOKEN;
use futures_util::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message as WsMsg;
use tokio_tungstenite::WebSocketStream;
use worker_relay::frame::{
    self, is_hop_by_hop_name, ControlFrame, Decoded, Headers, RequestHead, StreamId, SUBPROTOCOL,
};

/// Reads an HTTP head: (method, target, headers), and what came after it.
pub async fn read_head(
    s: &mut TcpStream,
) -> Option<(String, String, Vec<(String, String)>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = vec![0u8; 64 * 1024];
    let mut scanned = 0;
    let end = loop {
        // Only what came since the last look (a 64 KiB head arrives in pieces).
        if let Some(at) = buf[scanned..].windows(4).position(|w| w == b"\r\n\r\n") {
            break scanned + at;
        }
        scanned = buf.len().saturating_sub(3);
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp))
            .await
            .ok()?
            .ok()?;
        if n == 0 || buf.len() > 1 << 20 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    // Latin-1: each byte is the char of the same value (header values
    // 0x80..0xFF are Latin-1 strings in a request frame).
    let text: String = buf[..end].iter().map(|&b| b as char).collect();
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, target) = (first.next()?.to_string(), first.next()?.to_string());
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some((method, target, headers, buf[end + 4..].to_vec()))
}

pub fn get<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

pub fn switching(key: &str, protocol: bool) -> String {
    let p = if protocol {
        format!("sec-websocket-protocol: {SUBPROTOCOL}\r\n")
    } else {
        String::new()
    };
    format!("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\n{p}\r\n", derive_accept_key(key.as_bytes()))
}

pub async fn status(s: &mut TcpStream, code: u16) {
    let _ = s
        .write_all(
            format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
}

/// Checks a dial's token; answers 401 itself when it is wrong.
async fn token_ok(s: &mut TcpStream, h: &[(String, String)], check: bool) -> bool {
    if !check || get(h, "authorization") == Some(&format!("Bearer {TOKEN}")) {
        return true;
    }
    status(s, 401).await;
    false
}

#[derive(Clone, Copy, Default)]
pub struct RelayFlaws {
    pub select_protocol: bool,
    pub check_token: bool,
    /// Answers a plain GET of the connect path 200.
    pub accept_plain_get: bool,
    /// Never reads the socket after the handshake (no pongs).
    pub silent: bool,
}

/// A relay that only does the handshake (and then reads, answering pings).
pub async fn handshake_only_relay(flaws: RelayFlaws) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let Some((_, _, h, _)) = read_head(&mut s).await else {
                    return;
                };
                let Some(key) = get(&h, "sec-websocket-key").map(str::to_string) else {
                    return status(&mut s, if flaws.accept_plain_get { 200 } else { 400 }).await;
                };
                if !token_ok(&mut s, &h, flaws.check_token).await {
                    return;
                }
                let _ = s
                    .write_all(switching(&key, flaws.select_protocol).as_bytes())
                    .await;
                if flaws.silent {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    return;
                }
                let mut ws = WebSocketStream::from_raw_socket(s, Role::Server, None).await;
                while let Ok(Some(Ok(_))) =
                    tokio::time::timeout(Duration::from_secs(60), ws.next()).await
                {}
            });
        }
    });
    addr
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ForwardFlaw {
    None,
    /// Forwards Connection, Keep-Alive, TE, Proxy-* …
    KeepHopByHop,
    /// Forwards `/w/abc/../x` as path `/../x`.
    ForwardDotSegments,
    /// Says nothing to the worker when the caller hangs up.
    NoAbortOnHangup,
    /// Sends a whole request body as one chunk, however large.
    WholeBodyOneChunk,
    /// Completes the caller's response when the worker aborts it.
    CompleteAfterAbort,
    /// Decodes `%2F` in the path before forwarding it.
    DecodeSlash,
    /// Never sends `end` after a request body.
    NoEnd,
    /// Keeps sending requests to a worker's older connection.
    KeepOlder,
    /// Closes the worker's connection on a frame of an unknown type.
    CloseOnUnknown,
    /// Fails the caller's request on a frame for another id.
    FailOnStrayId,
    /// Takes `/w/abczz9/…` for worker `abc`, forwarding `/conformance/…`.
    PrefixMatch,
    /// Takes `/w/abczz9/…` for worker `abc`, forwarding `/zz9/conformance/…`.
    PrefixMatchKeep,
    /// Answers 200 when the worker aborts before its response.
    OkOnAbort,
    /// Ends a response after its first MiB as if it were complete.
    TruncateResponse,
    /// Answers every response 200, whatever the worker's status.
    AllOk,
    /// Drops the worker's response headers.
    DropResponseHeaders,
    /// Merges a caller's repeated headers into one, comma-joined.
    MergeRequestHeaders,
    /// Re-encodes Latin-1 header values as UTF-8, both ways.
    Latin1AsUtf8,
    /// Takes an empty chunk from the worker as the end of the body.
    EmptyChunkEnds,
    /// Forwards an upload as it arrives, and says nothing when its caller
    /// hangs up before the body is whole.
    NoAbortMidUpload,
    /// Forwards the worker's Content-Length and its bytes as they are, on
    /// a keep-alive connection: a mismatch desynchronises the caller.
    DesyncOnMismatch,
    /// Drops a worker connection after 30 s without a data frame, although
    /// the worker pings.
    DropIdle,
    /// Stops serving (drops every connection) once a worker sent a frame it
    /// cannot decode.
    DieOnGarbage,
    /// Sends a chunk on id 0 before each request.
    ChunkOnIdZero,
    /// Stops reading a worker connection (holding it open) after a frame
    /// of an unknown type: the connection is wedged until a new one comes.
    WedgeOnUnknown,
    /// Gives up on a response the worker has not started within 5 s: 504
    /// to the caller, `abort` to the worker (a proxy's default read timeout).
    GiveUpAfter5s,
}

struct Link {
    to_worker: mpsc::UnboundedSender<WsMsg>,
    from_worker: Mutex<mpsc::UnboundedReceiver<Decoded>>,
}

/// A minimal forwarding relay for worker `abc` (one stream at a time),
/// broken by `flaw`.
pub async fn forwarding_relay(flaw: ForwardFlaw) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let link: Arc<std::sync::Mutex<Option<Arc<Link>>>> = Arc::default();
    let dead = Arc::new(AtomicBool::new(false));
    tokio::spawn(async move {
        let next_id = Arc::new(std::sync::atomic::AtomicU32::new(1));
        while let Ok((mut s, _)) = l.accept().await {
            if dead.load(Ordering::Relaxed) {
                continue;
            }
            let (link, next_id, dead) = (link.clone(), next_id.clone(), dead.clone());
            tokio::spawn(async move {
                let Some((method, target, h, rest)) = read_head(&mut s).await else {
                    return;
                };
                if target == "/connect" {
                    let Some(key) = get(&h, "sec-websocket-key").map(str::to_string) else {
                        return status(&mut s, 400).await;
                    };
                    if token_ok(&mut s, &h, true).await {
                        let _ = s.write_all(switching(&key, true).as_bytes()).await;
                        let ws = WebSocketStream::from_raw_socket(s, Role::Server, None).await;
                        let new = attach(ws, flaw, dead);
                        let mut current = link.lock().unwrap();
                        let older_alive =
                            current.as_ref().is_some_and(|l| !l.to_worker.is_closed());
                        if !(flaw == ForwardFlaw::KeepOlder && older_alive) {
                            *current = Some(new);
                        }
                    }
                    return;
                }
                let current = link.lock().unwrap().clone();
                let Some(current) = current else {
                    return status(&mut s, 503).await;
                };
                let id = StreamId::new(next_id.fetch_add(1, Ordering::Relaxed)).unwrap();
                forward(&mut s, &current, id, flaw, &method, &target, h, rest).await;
                // Keep-alive, with this flaw only: the next request on the
                // same connection.
                if flaw != ForwardFlaw::DesyncOnMismatch {
                    return;
                }
                loop {
                    let Some((method, target, h, rest)) = read_head(&mut s).await else {
                        return;
                    };
                    let id = StreamId::new(next_id.fetch_add(1, Ordering::Relaxed)).unwrap();
                    forward(&mut s, &current, id, flaw, &method, &target, h, rest).await;
                }
            });
        }
    });
    addr
}

/// Owns the worker's socket: messages to it, decoded frames from it.
fn attach(ws: WebSocketStream<TcpStream>, flaw: ForwardFlaw, dead: Arc<AtomicBool>) -> Arc<Link> {
    let (to_worker, mut outbox) = mpsc::unbounded_channel::<WsMsg>();
    let (inbox, from_worker) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut sink, mut stream) = ws.split();
        let idle_limit = if flaw == ForwardFlaw::DropIdle {
            Duration::from_secs(30)
        } else {
            Duration::from_secs(24 * 3600)
        };
        let mut last_data = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(last_data + idle_limit) => return,
                m = outbox.recv() => match m {
                    Some(m) => {
                        last_data = tokio::time::Instant::now();
                        if sink.send(m).await.is_err() { return }
                    }
                    None => return,
                },
                m = stream.next() => match m {
                    Some(Ok(WsMsg::Text(t))) => {
                        last_data = tokio::time::Instant::now();
                        match frame::decode_text(t.as_str()) {
                            Ok(Decoded::Unknown) if flaw == ForwardFlaw::CloseOnUnknown => return,
                            Ok(Decoded::Unknown) if flaw == ForwardFlaw::WedgeOnUnknown => {
                                tokio::time::sleep(Duration::from_secs(120)).await;
                                return;
                            }
                            Ok(d) => { let _ = inbox.send(d); }
                            Err(_) if flaw == ForwardFlaw::DieOnGarbage => {
                                dead.store(true, Ordering::Relaxed);
                                return;
                            }
                            Err(_) => {}
                        }
                    }
                    Some(Ok(WsMsg::Binary(b))) => {
                        last_data = tokio::time::Instant::now();
                        if let Ok(d) = frame::decode_binary(b) { let _ = inbox.send(d); }
                    }
                    Some(Ok(WsMsg::Ping(p))) => { let _ = sink.send(WsMsg::Pong(p)).await; }
                    Some(Ok(_)) => {}
                    _ => return,
                },
            }
        }
    });
    Arc::new(Link {
        to_worker,
        from_worker: Mutex::new(from_worker),
    })
}

fn dot_segment(path: &str) -> bool {
    path.split('/').any(|s| {
        let s = s.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    })
}

#[allow(clippy::too_many_arguments)]
async fn forward(
    s: &mut TcpStream,
    link: &Link,
    id: StreamId,
    flaw: ForwardFlaw,
    method: &str,
    target: &str,
    h: Vec<(String, String)>,
    mut body: Vec<u8>,
) {
    let Some(mut rest) = target.strip_prefix("/w/abc") else {
        return status(s, 404).await;
    };
    let kept;
    if flaw == ForwardFlaw::PrefixMatch {
        rest = &rest[rest.find('/').unwrap_or(rest.len())..];
    } else if flaw == ForwardFlaw::PrefixMatchKeep && !rest.starts_with('/') {
        kept = format!("/{rest}");
        rest = &kept;
    }
    if !rest.starts_with('/') {
        return status(s, 404).await;
    }
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let decoded;
    let path = if flaw == ForwardFlaw::DecodeSlash {
        decoded = path.replace("%2F", "/").replace("%2f", "/");
        decoded.as_str()
    } else {
        path
    };
    if dot_segment(path) && flaw != ForwardFlaw::ForwardDotSegments {
        return status(s, 400).await;
    }
    let len: usize = get(&h, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut h = h;
    if flaw == ForwardFlaw::MergeRequestHeaders {
        h = merged(h);
    }
    if flaw == ForwardFlaw::Latin1AsUtf8 {
        h = h.into_iter().map(|(n, v)| (n, utf8_as_chars(&v))).collect();
    }
    let headers = Headers::try_from_pairs(
        h.into_iter()
            .filter(|(n, _)| flaw == ForwardFlaw::KeepHopByHop || !is_hop_by_hop_name(n)),
    )
    .unwrap();
    let head = RequestHead::new(method, path, query, headers).unwrap();
    let mut inbox = link.from_worker.lock().await;
    // Frames left from streams no longer open (or never opened) are ignored.
    while inbox.try_recv().is_ok() {}
    if flaw == ForwardFlaw::ChunkOnIdZero {
        let _ = link
            .to_worker
            .send(WsMsg::Binary(bytes::Bytes::from_static(&[
                0, 0, 0, 0, b'x',
            ])));
    }
    let send_chunk = |piece: &[u8]| {
        let _ = link
            .to_worker
            .send(WsMsg::Binary(frame::encode_chunk(id, piece)));
    };
    if flaw == ForwardFlaw::WholeBodyOneChunk {
        // The whole body first, then one chunk however large.
        while body.len() < len {
            let mut tmp = vec![0u8; 1 << 20];
            match s.read(&mut tmp).await {
                Ok(0) | Err(_) => return,
                Ok(n) => body.extend_from_slice(&tmp[..n]),
            }
        }
        let _ = link.to_worker.send(WsMsg::Text(
            ControlFrame::Request { id, head }.encode().into(),
        ));
        if !body.is_empty() {
            send_chunk(&body);
        }
    } else {
        // The request, then the body as it arrives.
        let _ = link.to_worker.send(WsMsg::Text(
            ControlFrame::Request { id, head }.encode().into(),
        ));
        body.truncate(len);
        let mut sent = body.len();
        for piece in body.chunks(frame::MAX_CHUNK_BODY) {
            send_chunk(piece);
        }
        while sent < len {
            let mut tmp = vec![0u8; (len - sent).min(frame::MAX_CHUNK_BODY)];
            match s.read(&mut tmp).await {
                Ok(0) | Err(_) => {
                    // The caller hung up mid-upload.
                    if flaw != ForwardFlaw::NoAbortMidUpload {
                        let _ = link
                            .to_worker
                            .send(WsMsg::Text(ControlFrame::Abort { id }.encode().into()));
                    }
                    return;
                }
                Ok(n) => {
                    send_chunk(&tmp[..n]);
                    sent += n;
                }
            }
        }
    }
    if flaw != ForwardFlaw::NoEnd {
        let _ = link
            .to_worker
            .send(WsMsg::Text(ControlFrame::End { id }.encode().into()));
    }
    let no_body = method == "HEAD";
    let raw = flaw == ForwardFlaw::DesyncOnMismatch;
    let mut started = false;
    let mut bodyless = false;
    let mut declared: Option<usize> = None;
    let mut sent = 0usize;
    let mut probe = [0u8; 1];
    let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let d = tokio::select! {
            d = inbox.recv() => match d { Some(d) => d, None => return },
            () = tokio::time::sleep_until(give_up), if !started && flaw == ForwardFlaw::GiveUpAfter5s => {
                let _ = link.to_worker.send(WsMsg::Text(ControlFrame::Abort { id }.encode().into()));
                let _ = s.write_all(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n\r\n").await;
                return;
            }
            r = s.read(&mut probe), if !started && !raw => {
                if matches!(r, Ok(0) | Err(_)) {
                    if flaw != ForwardFlaw::NoAbortOnHangup {
                        let _ = link.to_worker.send(WsMsg::Text(ControlFrame::Abort { id }.encode().into()));
                    }
                    return;
                }
                continue;
            }
        };
        match d {
            Decoded::Control(ControlFrame::Response { id: i, head }) if i == id => {
                started = true;
                let status = if flaw == ForwardFlaw::AllOk {
                    200
                } else {
                    head.status()
                };
                bodyless = no_body || status == 204 || status == 304;
                declared = head
                    .headers()
                    .get("content-length")
                    .and_then(|v| v.parse().ok());
                let mut out = format!("HTTP/1.1 {status} X\r\n").into_bytes();
                if raw {
                    if let Some(n) = declared {
                        out.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
                    }
                } else if !bodyless {
                    out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                }
                for (n, v) in head.headers().iter().filter(|(n, _)| {
                    flaw != ForwardFlaw::DropResponseHeaders
                        && !n.eq_ignore_ascii_case("content-length")
                        && !is_hop_by_hop_name(n)
                }) {
                    out.extend_from_slice(n.as_bytes());
                    out.extend_from_slice(b": ");
                    if flaw == ForwardFlaw::Latin1AsUtf8 {
                        out.extend_from_slice(v.as_bytes());
                    } else {
                        out.extend(v.chars().map(|c| c as u32 as u8));
                    }
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"\r\n");
                let _ = s.write_all(&out).await;
            }
            Decoded::Chunk(c)
                if c.id == id
                    && c.data.is_empty()
                    && flaw == ForwardFlaw::EmptyChunkEnds
                    && started =>
            {
                let _ = s.write_all(b"0\r\n\r\n").await;
                return;
            }
            Decoded::Chunk(c) if c.id == id && c.data.is_empty() => {}
            Decoded::Chunk(c) if c.id == id => {
                if flaw == ForwardFlaw::TruncateResponse && sent >= frame::MAX_CHUNK_BODY {
                    let _ = s.write_all(b"0\r\n\r\n").await;
                    return;
                }
                sent += c.data.len();
                if raw {
                    let _ = s.write_all(&c.data).await;
                    continue;
                }
                if bodyless {
                    continue;
                }
                if declared.is_some_and(|n| sent > n) {
                    // More than the worker said: cut the caller off.
                    return;
                }
                let _ = s
                    .write_all(format!("{:x}\r\n", c.data.len()).as_bytes())
                    .await;
                let _ = s.write_all(&c.data).await;
                let _ = s.write_all(b"\r\n").await;
            }
            Decoded::Control(ControlFrame::End { id: i }) if i == id => {
                if raw {
                    return;
                }
                if !bodyless && declared.is_none_or(|n| n == sent) {
                    let _ = s.write_all(b"0\r\n\r\n").await;
                }
                // Fewer bytes than the worker said: cut off, not completed.
                return;
            }
            Decoded::Control(ControlFrame::Abort { id: i }) if i == id => {
                if !started {
                    let code = if flaw == ForwardFlaw::OkOnAbort {
                        200
                    } else {
                        502
                    };
                    return status(s, code).await;
                }
                if flaw == ForwardFlaw::CompleteAfterAbort {
                    let _ = s.write_all(b"0\r\n\r\n").await;
                }
                return;
            }
            Decoded::Control(ControlFrame::Response { id: i, .. })
            | Decoded::Control(ControlFrame::End { id: i })
            | Decoded::Control(ControlFrame::Abort { id: i })
                if i != id && flaw == ForwardFlaw::FailOnStrayId && !started =>
            {
                return status(s, 502).await;
            }
            _ => {}
        }
    }
}

/// Repeated headers merged into the first of their name, comma-joined.
fn merged(h: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (n, v) in h {
        match out.iter_mut().find(|(m, _)| *m == n) {
            Some((_, w)) => {
                w.push_str(", ");
                w.push_str(&v);
            }
            None => out.push((n, v)),
        }
    }
    out
}

/// A Latin-1 string's chars written as UTF-8, each byte then taken as a
/// char: what a relay that re-encodes forwards.
fn utf8_as_chars(v: &str) -> String {
    v.as_bytes().iter().map(|&b| b as char).collect()
}

pub use crate::fake_worker::{worker, WorkerFlaws};
