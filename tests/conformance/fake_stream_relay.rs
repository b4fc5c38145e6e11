//! A streaming fake relay for issue 23's cases: it serves worker `abc` with
//! concurrent streams, forwards request bodies as they arrive (Content-Length
//! or chunked) and responses as they come, and replaces a worker's older
//! connection by closing it with 1008 within 5 s. It runs on a thread of its
//! own with a single-threaded runtime, as a small relay would, so what it
//! does on that thread delays everything it serves. Each `Hole` breaks one
//! thing a case checks.

use crate::fakes::{get, read_head, status, switching};
use crate::TOKEN;
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message as WsMsg;
use tokio_tungstenite::WebSocketStream;
use worker_relay::frame::{
    self, is_hop_by_hop_name, ControlFrame, Decoded, Headers, RequestHead, StreamId,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Hole {
    None,
    /// Closes a replaced connection with a close frame and waits, without
    /// a deadline, for it to be written and answered.
    WaitOnReplaced,
    /// Spends 10 µs of its only thread per byte of a presented token.
    SlowPerTokenByte,
    /// Holds each piece of a chunked upload until the next one arrives.
    HoldPieces,
}

/// A worker connection: messages to it, frames from it routed by stream.
struct Link {
    to_worker: mpsc::Sender<WsMsg>,
    streams: Mutex<HashMap<u32, mpsc::UnboundedSender<Decoded>>>,
    replaced: Notify,
    next_id: AtomicU32,
}

type Current = Arc<Mutex<Option<Arc<Link>>>>;

/// Starts the relay on its own thread; its address.
pub fn streaming_relay(hole: Hole) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = TcpListener::from_std(l).unwrap();
            let current = Current::default();
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(connection(s, current.clone(), hole));
            }
        });
    });
    addr
}

async fn connection(mut s: TcpStream, current: Current, hole: Hole) {
    let Some((method, target, h, rest)) = read_head(&mut s).await else {
        return;
    };
    if target == "/connect" {
        let Some(key) = get(&h, "sec-websocket-key").map(str::to_string) else {
            return status(&mut s, 400).await;
        };
        let presented = get(&h, "authorization").unwrap_or("");
        if hole == Hole::SlowPerTokenByte {
            std::thread::sleep(Duration::from_micros(10 * presented.len() as u64));
        }
        if presented != format!("Bearer {TOKEN}") {
            return status(&mut s, 401).await;
        }
        let _ = s.write_all(switching(&key, true).as_bytes()).await;
        let ws = WebSocketStream::from_raw_socket(s, Role::Server, None).await;
        let older = current.lock().unwrap().replace(attach(ws, hole));
        if let Some(older) = older {
            older.replaced.notify_one();
        }
        return;
    }
    let Some(rest_path) = target.strip_prefix("/w/abc/") else {
        return status(&mut s, 404).await;
    };
    let link = current.lock().unwrap().clone();
    let Some(link) = link else {
        return status(&mut s, 503).await;
    };
    let (path, query) = rest_path.split_once('?').unwrap_or((rest_path, ""));
    let chunked = get(&h, "transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let len: u64 = get(&h, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let headers =
        Headers::try_from_pairs(h.into_iter().filter(|(n, _)| !is_hop_by_hop_name(n))).unwrap();
    let head = RequestHead::new(&method, format!("/{path}"), query, headers).unwrap();
    let id = StreamId::new(link.next_id.fetch_add(1, Ordering::Relaxed)).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    link.streams.lock().unwrap().insert(id.get(), tx);
    let request = WsMsg::Text(ControlFrame::Request { id, head }.encode().into());
    if link.to_worker.send(request).await.is_ok() {
        let (rd, wr) = s.into_split();
        let up = upload(rd, rest, &link, id, chunked.then_some(hole), len);
        tokio::select! {
            _ = download(wr, &mut rx) => {}
            _ = async { up.await; std::future::pending::<()>().await } => {}
        }
    }
    link.streams.lock().unwrap().remove(&id.get());
}

/// Owns the worker's socket until it ends, or until a newer connection
/// replaces it: then a close frame, within 5 s (or, with `WaitOnReplaced`,
/// however long it takes).
fn attach(ws: WebSocketStream<TcpStream>, hole: Hole) -> Arc<Link> {
    let (to_worker, mut outbox) = mpsc::channel::<WsMsg>(16);
    let link = Arc::new(Link {
        to_worker,
        streams: Mutex::default(),
        replaced: Notify::new(),
        next_id: AtomicU32::new(1),
    });
    let l = link.clone();
    tokio::spawn(async move {
        let (mut sink, mut stream) = ws.split();
        let replaced = {
            let pump = async {
                loop {
                    tokio::select! {
                        m = outbox.recv() => match m {
                            Some(m) => if sink.send(m).await.is_err() { return },
                            None => return,
                        },
                        m = stream.next() => match m {
                            Some(Ok(WsMsg::Text(t))) => route(&l, frame::decode_text(t.as_str()).ok()),
                            Some(Ok(WsMsg::Binary(b))) => route(&l, frame::decode_binary(b).ok()),
                            Some(Ok(WsMsg::Ping(p))) => if sink.send(WsMsg::Pong(p)).await.is_err() { return },
                            Some(Ok(_)) => {}
                            _ => return,
                        },
                    }
                }
            };
            tokio::select! {
                _ = pump => false,
                _ = l.replaced.notified() => true,
            }
        };
        if replaced {
            let close = async {
                let frame = CloseFrame {
                    code: CloseCode::Policy,
                    reason: "replaced by a new connection".into(),
                };
                let _ = sink.send(WsMsg::Close(Some(frame))).await;
                while let Some(Ok(_)) = stream.next().await {}
            };
            if hole == Hole::WaitOnReplaced {
                close.await;
            } else {
                let _ = tokio::time::timeout(Duration::from_secs(5), close).await;
            }
        }
        // Its callers in flight get 502 (or are cut off); the socket closes.
        l.streams.lock().unwrap().clear();
    });
    link
}

fn route(l: &Link, d: Option<Decoded>) {
    let id = match &d {
        Some(Decoded::Chunk(c)) => c.id,
        Some(Decoded::Control(
            ControlFrame::Response { id, .. }
            | ControlFrame::End { id }
            | ControlFrame::Abort { id },
        )) => *id,
        _ => return,
    };
    if let (Some(tx), Some(d)) = (l.streams.lock().unwrap().get(&id.get()), d) {
        let _ = tx.send(d);
    }
}

/// Reads more of the caller's request into `buf`; false at EOF.
async fn more(rd: &mut (impl AsyncRead + Unpin), buf: &mut Vec<u8>) -> bool {
    let mut tmp = vec![0u8; 64 * 1024];
    match tokio::time::timeout(Duration::from_secs(60), rd.read(&mut tmp)).await {
        Ok(Ok(n)) if n > 0 => {
            buf.extend_from_slice(&tmp[..n]);
            true
        }
        _ => false,
    }
}

/// One CRLF-terminated line of `buf`, reading more as needed.
async fn line(rd: &mut (impl AsyncRead + Unpin), buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
            let l = String::from_utf8_lossy(&buf[..at]).into_owned();
            buf.drain(..at + 2);
            return Some(l);
        }
        if !more(rd, buf).await {
            return None;
        }
    }
}

/// The caller's body to the worker as it arrives: `len` bytes, or chunked
/// (`Some(hole)`) piece by piece; then `end` (`abort` if the caller hangs up).
async fn upload(
    mut rd: impl AsyncRead + Unpin,
    mut buf: Vec<u8>,
    link: &Link,
    id: StreamId,
    chunked: Option<Hole>,
    len: u64,
) {
    let chunk = |data: &[u8]| WsMsg::Binary(frame::encode_chunk(id, data));
    let whole = async {
        let Some(hole) = chunked else {
            let mut left = len;
            while left > 0 {
                if buf.is_empty() && !more(&mut rd, &mut buf).await {
                    return false;
                }
                let k = (buf.len() as u64)
                    .min(left)
                    .min(frame::MAX_CHUNK_BODY as u64) as usize;
                if link.to_worker.send(chunk(&buf[..k])).await.is_err() {
                    return false;
                }
                buf.drain(..k);
                left -= k as u64;
            }
            return true;
        };
        let mut held: Option<Vec<u8>> = None;
        loop {
            let Some(size) = line(&mut rd, &mut buf).await else {
                return false;
            };
            let size = size.split(';').next().unwrap_or("").trim().to_string();
            let Ok(size) = usize::from_str_radix(&size, 16) else {
                return false;
            };
            if size == 0 {
                while line(&mut rd, &mut buf).await.is_some_and(|l| !l.is_empty()) {}
                break;
            }
            while buf.len() < size + 2 {
                if !more(&mut rd, &mut buf).await {
                    return false;
                }
            }
            let piece: Vec<u8> = buf.drain(..size + 2).take(size).collect();
            let send = match hole {
                Hole::HoldPieces => held.replace(piece),
                _ => Some(piece),
            };
            if let Some(p) = send {
                if link.to_worker.send(chunk(&p)).await.is_err() {
                    return false;
                }
            }
        }
        if let Some(p) = held {
            let _ = link.to_worker.send(chunk(&p)).await;
        }
        true
    };
    let last = if whole.await {
        ControlFrame::End { id }
    } else {
        ControlFrame::Abort { id }
    };
    let _ = link.to_worker.send(WsMsg::Text(last.encode().into())).await;
}

/// The worker's answer to the caller as it comes (chunked); 502 if the
/// stream fails before its response.
async fn download(
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    rx: &mut mpsc::UnboundedReceiver<Decoded>,
) {
    let mut started = false;
    loop {
        let out = match rx.recv().await {
            Some(Decoded::Control(ControlFrame::Response { head, .. })) if !started => {
                started = true;
                let mut out = format!(
                    "HTTP/1.1 {} X\r\ntransfer-encoding: chunked\r\n",
                    head.status()
                );
                for (n, v) in head.headers().iter() {
                    if !n.eq_ignore_ascii_case("content-length") && !is_hop_by_hop_name(n) {
                        out.push_str(&format!("{n}: {v}\r\n"));
                    }
                }
                out.push_str("\r\n");
                out.into_bytes()
            }
            Some(Decoded::Chunk(c)) if started && !c.data.is_empty() => {
                let mut out = format!("{:x}\r\n", c.data.len()).into_bytes();
                out.extend_from_slice(&c.data);
                out.extend_from_slice(b"\r\n");
                out
            }
            Some(Decoded::Control(ControlFrame::End { .. })) if started => {
                let _ = wr.write_all(b"0\r\n\r\n").await;
                return;
            }
            Some(Decoded::Control(ControlFrame::Abort { .. })) | None => {
                if !started {
                    let _ = wr
                        .write_all(
                            b"HTTP/1.1 502 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                }
                return;
            }
            _ => continue,
        };
        if wr.write_all(&out).await.is_err() {
            return;
        }
    }
}
