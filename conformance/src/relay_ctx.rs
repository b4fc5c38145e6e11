//! Relay mode: the kit plays the worker (a raw WebSocket through
//! tokio-tungstenite, frames built and read with the crate's `frame` layer)
//! and the HTTP callers (`http`).

use crate::cli::RelayTarget;
use crate::relay_observe::{Observer, Sink};
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
    /// The protocol violations every connection of this context saw.
    sink: Sink,
    /// Probes sent so far (each probe's query is unique).
    probes: u32,
}

impl Context for RelayCtx {
    fn unmet(&self, _: Needs) -> Option<String> {
        None
    }

    /// Every case starts from a known state: the previous case's worker
    /// connection is closed (close handshake, a brief wait for the relay's
    /// close), a fresh one is dialled, and a caller's probe answered by the
    /// kit's worker proves the relay routes to it. A fault one case found
    /// cannot then fail the next cases.
    async fn before_case(&mut self) {
        if let Some(mut w) = self.worker.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), w.ws.close(None)).await;
            let until = Instant::now() + Duration::from_secs(1);
            loop {
                match w
                    .next(until.saturating_duration_since(Instant::now()))
                    .await
                {
                    Got::Closed(_) | Got::Timeout => break,
                    _ => continue,
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(8);
        let mut failed_probes = 0;
        while Instant::now() < deadline {
            if self.worker().await.is_err() {
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
            match self.probe(Duration::from_secs(2)).await {
                Probe::Routed | Probe::NotHere => return,
                Probe::Retry => {
                    failed_probes += 1;
                    if failed_probes % 2 == 0 {
                        // Twice unrouted: a connection the relay does not use.
                        if let Some(mut w) = self.worker.take() {
                            let _ =
                                tokio::time::timeout(Duration::from_millis(500), w.ws.close(None))
                                    .await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    fn take_violations(&mut self) -> Vec<String> {
        Observer::take(&self.sink)
    }
}

/// What a probe came to.
enum Probe {
    /// The caller's request reached the kit's worker and its answer the caller.
    Routed,
    /// The relay answers the probe with a final 4xx itself: it does not
    /// route this URL (a handshake-only relay); waiting would not help.
    NotHere,
    /// Not yet: a 5xx, no answer, or no request on this connection.
    Retry,
}

/// What a dial came to.
pub enum Dial {
    Connected(Box<FakeWorker>, Option<String>),
    Refused(u16),
    Failed(String),
}

impl RelayCtx {
    pub fn new(t: RelayTarget) -> RelayCtx {
        RelayCtx {
            t,
            worker: None,
            sink: Sink::default(),
            probes: 0,
        }
    }

    /// A caller's GET under the prefix answered by the kit's worker.
    async fn probe(&mut self, within: Duration) -> Probe {
        self.probes += 1;
        let target = self.target(&format!("/conformance/probe?n={}", self.probes));
        let authority = self.t.authority.clone();
        let mut caller = tokio::spawn(async move {
            crate::http::exchange(&authority, "GET", &target, &[], b"", within).await
        });
        let Some(w) = self.worker.as_mut() else {
            caller.abort();
            return Probe::Retry;
        };
        let deadline = Instant::now() + within;
        let mut answered = false;
        let r = loop {
            tokio::select! {
                r = &mut caller => break r,
                got = w.next(deadline.saturating_duration_since(Instant::now())) => match got {
                    Got::Frame(Decoded::Control(ControlFrame::Request { id, head })) => {
                        let (status, body): (u16, &[u8]) =
                            if head.path().starts_with("/conformance/probe") {
                                answered = true;
                                (200, b"probe")
                            } else {
                                (503, b"")
                            };
                        let len = body.len().to_string();
                        if w.respond(id, status, &[("content-length", &len)], body).await.is_err() {
                            caller.abort();
                            self.worker = None;
                            return Probe::Retry;
                        }
                    }
                    Got::Closed(_) => {
                        caller.abort();
                        self.worker = None;
                        return Probe::Retry;
                    }
                    Got::Timeout => {
                        caller.abort();
                        return Probe::Retry;
                    }
                    _ => {}
                },
            }
        };
        match r {
            Ok(Ok(r)) if answered && r.status == 200 && r.body == b"probe" => Probe::Routed,
            Ok(Ok(r))
                if !answered
                    && (400..500).contains(&r.status)
                    && r.status != 408
                    && r.status != 429 =>
            {
                Probe::NotHere
            }
            _ => Probe::Retry,
        }
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}{}", self.t.authority, self.t.connect_path)
    }

    /// The caller's target for `rest` (which starts with `/`) under the worker's prefix.
    pub fn target(&self, rest: &str) -> String {
        format!("{}{}{}", self.t.prefix, self.t.worker_id, rest)
    }

    pub async fn dial(&self, token: Option<&str>, protocol: Option<&str>) -> Dial {
        match dial(&self.ws_url(), token, protocol).await {
            Dial::Connected(mut w, p) => {
                w.obs.sink = self.sink.clone();
                Dial::Connected(w, p)
            }
            d => d,
        }
    }

    /// The connected worker, dialling if there is none.
    pub async fn worker(&mut self) -> Result<&mut FakeWorker, String> {
        if self.worker.is_none() {
            match self
                .dial(Some(&self.t.token.clone()), Some(SUBPROTOCOL))
                .await
            {
                Dial::Connected(mut w, _) => {
                    w.obs.sink = self.sink.clone();
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

    pub fn set_worker(&mut self, mut w: FakeWorker) {
        w.obs.sink = self.sink.clone();
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
            Dial::Connected(
                Box::new(FakeWorker {
                    ws,
                    obs: Observer::default(),
                }),
                selected,
            )
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
    let d = dialled(
        tokio::time::timeout(
            STEP,
            tokio_tungstenite::connect_async_with_config(
                req,
                Some(crate::ws_send::config()),
                false,
            ),
        )
        .await,
    );
    match d {
        // The WebSocket client reads only HTTP/1.1 answers; a refusal in an
        // HTTP/1.0 status line (as some servers write their errors) is still
        // a refusal: ask again in raw HTTP to read its status.
        Dial::Failed(e) if e.contains("HTTP version") => {
            match raw_refusal(url, token, protocol).await {
                Some(status) => Dial::Refused(status),
                None => Dial::Failed(e),
            }
        }
        d => d,
    }
}

/// The status of the relay's answer to an upgrade request sent in raw
/// HTTP/1.1, if it is not a 101.
async fn raw_refusal(url: &str, token: Option<&str>, protocol: Option<&str>) -> Option<u16> {
    let rest = url.strip_prefix("ws://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    if let Some(b) = &bearer {
        headers.push(("authorization", b.as_str()));
    }
    if let Some(p) = protocol {
        headers.push(("sec-websocket-protocol", p));
    }
    let path = if path.is_empty() { "/" } else { path };
    let r = crate::http::exchange(authority, "GET", path, &headers, b"", STEP)
        .await
        .ok()?;
    (r.status != 101 && r.status != 0).then_some(r.status)
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
    /// Reads the relay's messages leniently, writing down its violations.
    pub obs: Observer,
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
                WsMsg::Text(t) => self.obs.text(t.as_str()),
                WsMsg::Binary(b) => self.obs.binary(b),
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
