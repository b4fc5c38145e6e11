//! Relay mode: the kit plays the worker (a raw WebSocket through
#![allow(dead_code)] // shared with tests/conformance.rs, which use a part
//! tokio-tungstenite, frames built and read with the crate's `frame` layer)
//! and the HTTP callers (`http`).

use crate::cli::RelayTarget;
use crate::runner::{Context, Needs};
use bytes::Bytes;
use futures_util::StreamExt;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message as WsMsg};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use worker_relay::frame::{
    self, ControlFrame, Decoded, Headers, RequestHead, ResponseHead, StreamId, SUBPROTOCOL,
};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

use crate::ws_send::WsSend;
/// How long a single step may wait.
pub use crate::ws_send::STEP;

pub struct RelayCtx {
    pub t: RelayTarget,
    worker: Option<FakeWorker>,
}

impl Context for RelayCtx {
    fn unmet(&self, _: Needs) -> Option<String> {
        None
    }

    /// Drains what a previous case left behind; every case starts with the
    /// worker connected (a caller sent first would meet a 503).
    async fn before_case(&mut self) {
        if let Some(w) = self.worker.as_mut() {
            if !w.drain(Duration::from_millis(50)).await {
                self.worker = None;
            }
        }
        let _ = self.worker().await;
    }
}

/// What a dial came to.
pub enum Dial {
    Connected(Box<FakeWorker>, Option<String>),
    Refused(u16),
    Failed(String),
}

impl RelayCtx {
    pub fn new(t: RelayTarget) -> RelayCtx {
        RelayCtx { t, worker: None }
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}{}", self.t.authority, self.t.connect_path)
    }

    /// The caller's target for `rest` (which starts with `/`) under the worker's prefix.
    pub fn target(&self, rest: &str) -> String {
        format!("{}{}{}", self.t.prefix, self.t.worker_id, rest)
    }

    pub async fn dial(&self, token: Option<&str>, protocol: Option<&str>) -> Dial {
        dial(&self.ws_url(), token, protocol).await
    }

    /// The connected worker, dialling if there is none.
    pub async fn worker(&mut self) -> Result<&mut FakeWorker, String> {
        if self.worker.is_none() {
            match self
                .dial(Some(&self.t.token.clone()), Some(SUBPROTOCOL))
                .await
            {
                Dial::Connected(w, _) => {
                    self.worker = Some(*w);
                    // Let the relay register the connection.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Dial::Refused(s) => {
                    return Err(format!("the relay refused the worker's dial with {s}"))
                }
                Dial::Failed(e) => return Err(format!("the worker's dial failed: {e}")),
            }
        }
        Ok(self.worker.as_mut().expect("connected"))
    }

    /// Forgets the worker connection (the case closed it or the relay did).
    pub fn drop_worker(&mut self) -> Option<FakeWorker> {
        self.worker.take()
    }

    pub fn set_worker(&mut self, w: FakeWorker) {
        self.worker = Some(w);
    }
}

/// The upgrade request for a dial.
fn upgrade_request(
    url: &str,
    token: Option<&str>,
    protocol: Option<&str>,
) -> Result<tungstenite::handshake::client::Request, String> {
    let mut req = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(t) = token {
        match HeaderValue::from_str(&format!("Bearer {t}")) {
            Ok(v) => req.headers_mut().insert("authorization", v),
            Err(_) => return Err("the token is not a valid header value".into()),
        };
    }
    if let Some(p) = protocol {
        req.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_str(p).expect("protocol"),
        );
    }
    Ok(req)
}

fn dialled(
    r: Result<
        Result<(Ws, tungstenite::handshake::client::Response), tungstenite::Error>,
        tokio::time::error::Elapsed,
    >,
) -> Dial {
    match r {
        Err(_) => Dial::Failed("the handshake timed out".into()),
        Ok(Ok((ws, resp))) => {
            let selected = resp
                .headers()
                .get("sec-websocket-protocol")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            Dial::Connected(Box::new(FakeWorker { ws }), selected)
        }
        Ok(Err(tungstenite::Error::Http(resp))) => Dial::Refused(resp.status().as_u16()),
        Ok(Err(e)) => Dial::Failed(e.to_string()),
    }
}

pub async fn dial(url: &str, token: Option<&str>, protocol: Option<&str>) -> Dial {
    let req = match upgrade_request(url, token, protocol) {
        Ok(r) => r,
        Err(e) => return Dial::Failed(e),
    };
    dialled(
        tokio::time::timeout(
            STEP,
            tokio_tungstenite::connect_async_with_config(
                req,
                Some(crate::ws_send::config()),
                false,
            ),
        )
        .await,
    )
}

/// A dial on a socket whose receive buffer is `rcvbuf` bytes (set before
/// connecting, so the kernel's autotuning cannot grow it): what the kit
/// does not read soon fills it, and the relay's writes block.
pub async fn dial_small_window(
    authority: &str,
    url: &str,
    token: Option<&str>,
    protocol: Option<&str>,
    rcvbuf: u32,
) -> Dial {
    let req = match upgrade_request(url, token, protocol) {
        Ok(r) => r,
        Err(e) => return Dial::Failed(e),
    };
    let connect = async {
        let addr = tokio::net::lookup_host(authority)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other("no address"))?;
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_recv_buffer_size(rcvbuf)?;
        let s = socket.connect(addr).await?;
        let _ = s.set_nodelay(true);
        Ok::<_, std::io::Error>(s)
    };
    let s = match tokio::time::timeout(STEP, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Dial::Failed(e.to_string()),
        Err(_) => return Dial::Failed("the connect timed out".into()),
    };
    dialled(
        tokio::time::timeout(
            STEP,
            tokio_tungstenite::client_async_with_config(
                req,
                MaybeTlsStream::Plain(s),
                Some(crate::ws_send::config()),
            ),
        )
        .await,
    )
}

/// One message from the relay.
#[derive(Debug)]
pub enum Got {
    Frame(Decoded),
    /// A data message the frame layer refuses.
    Malformed(String),
    Pong(Bytes),
    Closed(Option<u16>),
    Timeout,
}

/// The kit's worker connection.
pub struct FakeWorker {
    pub ws: Ws,
}

/// A stream's request as the relay sent it.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: StreamId,
    pub head: RequestHead,
    pub body: Vec<u8>,
    pub chunk_sizes: Vec<usize>,
    /// `end` (true) or `abort` (false) closed the request; `None`: neither in time.
    pub ended: Option<bool>,
}

impl FakeWorker {
    /// The TCP connection under the WebSocket (the kit dials plain `ws://`).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self.ws.get_ref() {
            MaybeTlsStream::Plain(s) => Some(s),
            _ => None,
        }
    }

    /// The next message (pings are answered by tungstenite and skipped).
    pub async fn next(&mut self, within: Duration) -> Got {
        let deadline = Instant::now() + within;
        loop {
            let m = match tokio::time::timeout_at(deadline.into(), self.ws.next()).await {
                Err(_) => return Got::Timeout,
                Ok(None) => return Got::Closed(None),
                Ok(Some(Err(_))) => return Got::Closed(None),
                Ok(Some(Ok(m))) => m,
            };
            return match m {
                WsMsg::Text(t) => match frame::decode_text(t.as_str()) {
                    Ok(d) => Got::Frame(d),
                    Err(e) => Got::Malformed(e.to_string()),
                },
                WsMsg::Binary(b) => match frame::decode_binary(b) {
                    Ok(d) => Got::Frame(d),
                    Err(e) => Got::Malformed(e.to_string()),
                },
                WsMsg::Pong(p) => Got::Pong(p),
                WsMsg::Close(c) => Got::Closed(c.map(|c| u16::from(c.code))),
                WsMsg::Ping(_) | WsMsg::Frame(_) => continue,
            };
        }
    }

    /// Reads what is pending until `quiet` passes without a message (at most
    /// `STEP` in all); false if the connection is gone.
    pub async fn drain(&mut self, quiet: Duration) -> bool {
        let until = tokio::time::Instant::now() + STEP;
        while tokio::time::Instant::now() < until {
            match self.next(quiet).await {
                Got::Timeout => return true,
                Got::Closed(_) => return false,
                _ => continue,
            }
        }
        true
    }

    /// Waits for a `request` whose path starts with `path`, skipping other frames.
    pub async fn expect_request(
        &mut self,
        path: &str,
        within: Duration,
    ) -> Result<(StreamId, RequestHead), String> {
        let deadline = Instant::now() + within;
        loop {
            match self
                .next(deadline.saturating_duration_since(Instant::now()))
                .await
            {
                Got::Frame(Decoded::Control(ControlFrame::Request { id, head }))
                    if head.path().starts_with(path) =>
                {
                    return Ok((id, head))
                }
                Got::Timeout => {
                    return Err(format!(
                        "no request for {path} reached the worker in {} s",
                        within.as_secs()
                    ))
                }
                Got::Closed(c) => {
                    return Err(format!("the relay closed the worker's connection ({c:?})"))
                }
                _ => continue,
            }
        }
    }

    /// Reads the request body of `id` until `end` or `abort`.
    pub async fn read_body(
        &mut self,
        id: StreamId,
        head: RequestHead,
        within: Duration,
    ) -> Received {
        let mut r = Received {
            id,
            head,
            body: Vec::new(),
            chunk_sizes: Vec::new(),
            ended: None,
        };
        let deadline = Instant::now() + within;
        loop {
            match self
                .next(deadline.saturating_duration_since(Instant::now()))
                .await
            {
                Got::Frame(Decoded::Chunk(c)) if c.id == id => {
                    r.chunk_sizes.push(c.data.len());
                    r.body.extend_from_slice(&c.data);
                }
                Got::Frame(Decoded::Control(ControlFrame::End { id: i })) if i == id => {
                    r.ended = Some(true);
                    return r;
                }
                Got::Frame(Decoded::Control(ControlFrame::Abort { id: i })) if i == id => {
                    r.ended = Some(false);
                    return r;
                }
                Got::Timeout | Got::Closed(_) => return r,
                _ => continue,
            }
        }
    }

    /// Waits for the relay's `abort` of `id` (its `end` of the request body is
    /// not an answer): true if it came in time.
    pub async fn wait_abort(&mut self, id: StreamId, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            match self
                .next(deadline.saturating_duration_since(Instant::now()))
                .await
            {
                Got::Frame(Decoded::Control(ControlFrame::Abort { id: i })) if i == id => {
                    return true
                }
                Got::Timeout | Got::Closed(_) => return false,
                _ => continue,
            }
        }
    }

    pub async fn respond_head(
        &mut self,
        id: StreamId,
        status: u16,
        headers: &[(&str, &str)],
    ) -> Result<(), String> {
        let headers =
            Headers::try_from_pairs(headers.iter().copied()).map_err(|e| e.to_string())?;
        let head = ResponseHead::new(status, headers).map_err(|e| e.to_string())?;
        self.send_control(&ControlFrame::Response { id, head })
            .await
    }

    /// A whole response: head, body in chunks of at most 1 MiB, `end`.
    pub async fn respond(
        &mut self,
        id: StreamId,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), String> {
        self.respond_head(id, status, headers).await?;
        for piece in body.chunks(frame::MAX_CHUNK_BODY) {
            self.send_chunk(id, piece).await?;
        }
        self.send_control(&ControlFrame::End { id }).await
    }
}

impl WsSend for FakeWorker {
    type Socket = Ws;
    const PEER: &'static str = "the relay";

    fn socket(&mut self) -> &mut Ws {
        &mut self.ws
    }
}
