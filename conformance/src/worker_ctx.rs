//! Worker mode: the kit plays the relay. It listens, answers the worker's
//! handshake itself (so it can refuse with any status, or leave out the
//! subprotocol), then talks frames over tokio-tungstenite.

use crate::cli::{App, WorkerTarget};
use crate::runner::{Context, Needs};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message as WsMsg;
use tokio_tungstenite::WebSocketStream;
use worker_relay::frame::{self, ControlFrame, Headers, RequestHead, StreamId, SUBPROTOCOL};

use crate::worker_observe::{Observer, SharedRef};
use crate::ws_send::WsSend;
pub use crate::ws_send::STEP;

/// The worker's upgrade request.
#[derive(Debug, Clone)]
pub struct Handshake {
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub at: Instant,
}

impl Handshake {
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// How to answer a dial.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    Accept,
    /// 101 without `Sec-WebSocket-Protocol`.
    AcceptWithoutProtocol,
    Refuse(u16),
}

/// A stream's answer as far as it came.
#[derive(Debug, Clone, Default)]
pub struct Answered {
    pub status: Option<u16>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub ended: bool,
    pub aborted: bool,
    /// Frames after `end`/`abort`, or before `response`.
    pub out_of_order: usize,
    /// Body chunks received, and the largest one's body.
    pub chunks: usize,
    pub max_chunk: usize,
}

/// One accepted worker connection.
pub struct Conn {
    pub ws: WebSocketStream<TcpStream>,
    pub streams: HashMap<u32, Answered>,
    pub closed: Option<Option<u16>>,
    pub pings: Vec<Instant>,
    next_id: u32,
    /// Reads what the worker sends leniently and notes what is wrong.
    pub obs: Observer,
}

pub struct WorkerCtx {
    pub t: WorkerTarget,
    pub listener: TcpListener,
    pub first: Option<Handshake>,
    pub conn: Option<Conn>,
    raw: std::sync::Mutex<Option<TcpStream>>,
    /// The worker the kit started (`--exec`), if it did.
    pub exec: Option<crate::exec::Exec>,
    /// What the connections' observers found (see `worker_observe`).
    pub observed: SharedRef,
}

impl Context for WorkerCtx {
    fn unmet(&self, needs: Needs) -> Option<String> {
        match (needs, self.t.app) {
            (Needs::Any, _) | (_, App::Example) | (Needs::ExampleOrStrata, App::Strata) => None,
            (Needs::Example, app) => Some(format!("needs the example worker's routes (/echo, /sleep, /fail-after, /slow-sink); --app {}", app.name())),
            (Needs::ExampleOrStrata, app) => Some(format!("needs the example's routes or Strata's /v1/execute; --app {}", app.name())),
        }
    }

    /// Each case starts from a known state: the streams the last case left
    /// open aborted, what is pending drained, a fresh stream table (ids
    /// keep increasing), and a worker that answers `/health`; a connection
    /// that is gone or wedged is dropped and the worker's next dial
    /// accepted (it redials with backoff), so a case fails for its own
    /// reason, not for the one before.
    async fn before_case(&mut self) {
        if let Some(c) = self.conn.as_mut() {
            let aborts = c
                .obs
                .open_ids(&c.streams)
                .into_iter()
                .filter_map(StreamId::new)
                .map(|id| WsMsg::Text(ControlFrame::Abort { id }.encode().into()))
                .collect();
            let _ = c.send_all(aborts).await;
            c.pump(Duration::from_millis(100)).await;
            c.obs.new_epoch();
            c.streams.clear();
            let fine = c.closed.is_none() && c.responsive(Duration::from_secs(5)).await.is_some();
            c.streams.clear();
            if fine {
                self.observed.lock().expect("observed").lost = false;
                return;
            }
            if c.closed.is_none() {
                c.close().await;
            }
            self.conn = None;
        }
        if self.first.is_none() {
            return; // not connected yet: the run accepts the first dial
        }
        let lost = self.observed.lock().expect("observed").lost;
        let wait = Duration::from_secs(if lost { 5 } else { 45 });
        let accepted = match self.next_dial(wait).await {
            Ok((s, hs)) => self.answer(s, &hs, Answer::Accept).await.ok().flatten(),
            Err(_) => None,
        };
        self.observed.lock().expect("observed").lost = accepted.is_none();
        if let Some(mut c) = accepted {
            c.pump(Duration::from_millis(100)).await;
            c.obs.new_epoch();
            c.streams.clear();
            self.conn = Some(c);
        }
    }

    fn take_violations(&mut self) -> Vec<String> {
        self.observed.lock().expect("observed").take_violations()
    }

    async fn fresh_peer(&mut self) -> Result<(), String> {
        self.restart_worker().await
    }
}

impl WorkerCtx {
    pub async fn bind(t: WorkerTarget) -> std::io::Result<WorkerCtx> {
        let addr: std::net::SocketAddr = t.listen.parse().map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "--listen must be IP:PORT")
        })?;
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        // A small send buffer on accepted sockets: what the worker does not
        // read stays with the kit, where it can be counted.
        socket.set_send_buffer_size(64 * 1024)?;
        socket.bind(addr)?;
        let listener = socket.listen(64)?;
        Ok(WorkerCtx {
            t,
            listener,
            first: None,
            conn: None,
            raw: std::sync::Mutex::new(None),
            exec: None,
            observed: SharedRef::default(),
        })
    }

    pub fn local_addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    /// The next dial's upgrade request, read but not yet answered.
    pub async fn next_dial(&self, within: Duration) -> Result<(TcpStream, Handshake), String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (mut s, _) = match tokio::time::timeout(left, self.listener.accept()).await {
                Err(_) => {
                    return Err(format!(
                        "the worker did not dial within {} s",
                        within.as_secs()
                    ))
                }
                Ok(Err(e)) => return Err(format!("accept failed: {e}")),
                Ok(Ok(x)) => x,
            };
            let at = Instant::now();
            let _ = s.set_nodelay(true);
            let mut buf = Vec::new();
            let mut tmp = [0u8; 4096];
            let read = tokio::time::timeout(STEP, async {
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 64 * 1024 {
                    match s.read(&mut tmp).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                true
            })
            .await;
            if read != Ok(true) {
                continue; // not a dial (a port probe): wait for the next
            }
            let text = String::from_utf8_lossy(&buf).into_owned();
            let mut lines = text.split("\r\n");
            let target = lines
                .next()
                .unwrap_or("")
                .split(' ')
                .nth(1)
                .unwrap_or("")
                .to_string();
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            return Ok((
                s,
                Handshake {
                    target,
                    headers,
                    at,
                },
            ));
        }
    }

    /// Answers a dial; a connection if it was accepted.
    pub async fn answer(
        &self,
        s: TcpStream,
        hs: &Handshake,
        answer: Answer,
    ) -> Result<Option<Conn>, String> {
        self.answer_with(s, hs, answer, false).await
    }

    /// Accepts a dial and hands back the bare socket after the 101: the
    /// kit then reads the worker's frames itself (no automatic pongs).
    pub async fn accept_raw(&self, s: TcpStream, hs: &Handshake) -> Result<TcpStream, String> {
        self.answer_with(s, hs, Answer::Accept, true).await?;
        self.raw
            .lock()
            .expect("raw")
            .take()
            .ok_or_else(|| "no socket".to_string())
    }

    async fn answer_with(
        &self,
        mut s: TcpStream,
        hs: &Handshake,
        answer: Answer,
        raw: bool,
    ) -> Result<Option<Conn>, String> {
        let key = hs
            .all("sec-websocket-key")
            .first()
            .map(|k| k.to_string())
            .unwrap_or_default();
        let head = match answer {
            Answer::Refuse(status) => {
                let refusal = format!(
                    "HTTP/1.1 {status} Refused\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = crate::http::write_all(&mut s, refusal.as_bytes(), STEP).await;
                let _ = tokio::time::timeout(STEP, s.shutdown()).await;
                return Ok(None);
            }
            Answer::Accept => format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\nsec-websocket-protocol: {SUBPROTOCOL}\r\n\r\n",
                derive_accept_key(key.as_bytes())
            ),
            Answer::AcceptWithoutProtocol => format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\n\r\n",
                derive_accept_key(key.as_bytes())
            ),
        };
        crate::http::write_all(&mut s, head.as_bytes(), STEP)
            .await
            .map_err(|e| format!("writing the 101 failed: {e}"))?;
        if raw {
            self.raw.lock().expect("raw").replace(s);
            return Ok(None);
        }
        let ws =
            WebSocketStream::from_raw_socket(s, Role::Server, Some(crate::ws_send::config())).await;
        Ok(Some(Conn {
            ws,
            streams: HashMap::new(),
            closed: None,
            pings: Vec::new(),
            next_id: 100,
            obs: Observer::new(self.observed.clone()).watching(self.t.token.as_deref()),
        }))
    }

    /// The live connection, accepting the worker's next dial if there is none.
    pub async fn conn(&mut self) -> Result<&mut Conn, String> {
        if self.conn.is_none() {
            let (s, hs) = self.next_dial(STEP * 3).await?;
            if self.first.is_none() {
                self.first = Some(hs.clone());
            }
            self.conn = self.answer(s, &hs, Answer::Accept).await?;
        }
        Ok(self.conn.as_mut().expect("accepted"))
    }

    /// Ends the current connection (close frame); the worker will redial.
    pub async fn hang_up(&mut self) -> Option<Instant> {
        let mut c = self.conn.take()?;
        c.close().await;
        Some(Instant::now())
    }

    /// The tokens the kit knows (connect, worker), for redacting report
    /// lines.
    pub fn secrets(&self) -> Vec<&str> {
        [self.t.token.as_deref(), self.t.worker_token.as_deref()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// `Authorization` for requests, if a worker token is known.
    pub fn auth(&self) -> Vec<(String, String)> {
        self.t
            .worker_token
            .iter()
            .map(|t| ("authorization".to_string(), format!("Bearer {t}")))
            .collect()
    }
}

impl Conn {
    /// Whether the kit handed out `id` on this connection (its ids start at 101).
    pub fn issued(&self, id: u32) -> bool {
        (101..=self.next_id).contains(&id)
    }

    pub fn fresh_id(&mut self) -> StreamId {
        self.next_id += 1;
        StreamId::new(self.next_id).expect("nonzero")
    }

    /// Opens a stream: `request`, then `body` (if any) and `end` if `end`.
    #[allow(clippy::too_many_arguments)] // the request frame's fields, then what follows it
    pub async fn request(
        &mut self,
        id: StreamId,
        method: &str,
        path: &str,
        query: &str,
        headers: &[(String, String)],
        body: &[u8],
        end: bool,
    ) -> Result<(), String> {
        let headers =
            Headers::try_from_pairs(headers.iter().cloned()).map_err(|e| e.to_string())?;
        let head = RequestHead::new(method, path, query, headers).map_err(|e| e.to_string())?;
        self.streams.remove(&id.get());
        self.send_control(&ControlFrame::Request { id, head })
            .await?;
        for piece in body.chunks(frame::MAX_CHUNK_BODY) {
            self.send_chunk(id, piece).await?;
        }
        if end {
            self.send_control(&ControlFrame::End { id }).await?;
        }
        Ok(())
    }

    /// Takes one message into the stream table; false on timeout or close.
    pub async fn step(&mut self, within: Duration) -> bool {
        if self.closed.is_some() {
            return false;
        }
        let m = match tokio::time::timeout(within, self.ws.next()).await {
            Err(_) => return false,
            Ok(None) | Ok(Some(Err(_))) => {
                self.closed = Some(None);
                return false;
            }
            Ok(Some(Ok(m))) => m,
        };
        match &m {
            WsMsg::Ping(_) => self.pings.push(Instant::now()),
            WsMsg::Close(c) => {
                self.closed = Some(c.as_ref().map(|c| u16::from(c.code)));
                return false;
            }
            WsMsg::Text(_) | WsMsg::Binary(_) => self.obs.take(&m, &mut self.streams),
            _ => {}
        }
        true
    }

    /// Reads for `quiet` (pings are answered, frames recorded).
    pub async fn pump(&mut self, quiet: Duration) {
        let deadline = Instant::now() + quiet;
        while Instant::now() < deadline
            && self
                .step(deadline.saturating_duration_since(Instant::now()))
                .await
        {}
    }

    /// Reads until `done` holds for the stream table, the connection closes or `within` passes.
    pub async fn until(
        &mut self,
        within: Duration,
        done: impl Fn(&HashMap<u32, Answered>) -> bool,
    ) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if done(&self.streams) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || (!self.step(left).await && self.closed.is_some()) {
                return done(&self.streams);
            }
        }
    }

    /// Waits for `id`'s `end` or `abort`.
    pub async fn finished(&mut self, id: StreamId, within: Duration) -> Answered {
        let k = id.get();
        self.until(within, |m| m.get(&k).is_some_and(|s| s.ended || s.aborted))
            .await;
        self.streams.get(&k).cloned().unwrap_or_default()
    }

    /// Asks `GET /health` and waits for its answer (proves the worker reads and serves).
    pub async fn responsive(&mut self, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        let id = self.fresh_id();
        if self
            .request(id, "GET", "/health", "", &[], b"", true)
            .await
            .is_err()
        {
            // Broken, most likely: read what is left (a close frame).
            self.pump(Duration::from_millis(500)).await;
            return None;
        }
        let a = self.finished(id, within).await;
        (a.status.is_some() && a.ended).then(|| start.elapsed())
    }

    pub async fn close(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.ws.close(None)).await;
    }
}

impl WsSend for Conn {
    type Socket = WebSocketStream<TcpStream>;
    const PEER: &'static str = "the worker";

    fn socket(&mut self) -> &mut WebSocketStream<TcpStream> {
        &mut self.ws
    }

    /// As the trait's, and the observer learns which streams the kit opens and aborts.
    async fn send(&mut self, m: WsMsg) -> Result<(), String> {
        self.obs.sent(&m, &mut self.streams);
        match tokio::time::timeout(STEP, futures_util::SinkExt::send(&mut self.ws, m)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("send failed: {e}")),
            Err(_) => Err(format!("send timed out ({} stopped reading)", Self::PEER)),
        }
    }
}
