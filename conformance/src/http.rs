//! A raw HTTP/1.1 client on a `TcpStream`: it writes exactly the bytes a
//! case asks for (dot segments, hop-by-hop headers, a body cut short) and
//! reads a response, telling a complete body from one cut off. Every read is
//! bounded by a deadline.

use std::io;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout_at;

/// A response as far as it was read.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body ended as its framing says (Content-Length reached, chunked
    /// terminator seen); false when the connection closed or the deadline
    /// passed first.
    pub complete: bool,
    /// How the body was framed: `length`, `chunked`, `close` or `none`.
    pub framing: &'static str,
    /// The deadline passed inside the body: the peer neither finished it
    /// nor closed the connection.
    pub timed_out: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub async fn connect(authority: &str, within: Duration) -> io::Result<TcpStream> {
    let s = tokio::time::timeout(within, TcpStream::connect(authority))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// The bytes of a request head: `Host` first, then `headers` as given.
pub fn head(method: &str, target: &str, host: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut h = format!("{method} {target} HTTP/1.1\r\nhost: {host}\r\n");
    for (n, v) in headers {
        h.push_str(&format!("{n}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h.into_bytes()
}

pub async fn write_all(s: &mut TcpStream, bytes: &[u8], within: Duration) -> io::Result<()> {
    match tokio::time::timeout(within, s.write_all(bytes)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "write timed out")),
    }
}

/// Buffered reads with a deadline (which a caller may move between reads).
pub struct Reader<S> {
    s: S,
    buf: Vec<u8>,
    pub deadline: Instant,
    eof: bool,
}

impl<S: AsyncRead + Unpin> Reader<S> {
    pub fn new(s: S, within: Duration) -> Reader<S> {
        Reader {
            s,
            buf: Vec::new(),
            deadline: Instant::now() + within,
            eof: false,
        }
    }

    /// Reads more; false at EOF or the deadline.
    async fn fill(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        let mut tmp = vec![0u8; 256 * 1024];
        match timeout_at(self.deadline.into(), self.s.read(&mut tmp)).await {
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no response in time",
            )),
            Ok(Ok(0)) => {
                self.eof = true;
                Ok(false)
            }
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&tmp[..n]);
                Ok(true)
            }
            // A reset after data is the end of what can be read.
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
                self.eof = true;
                Ok(false)
            }
            Ok(Err(e)) => Err(e),
        }
    }

    async fn line(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(at) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..at].to_vec();
                self.buf.drain(..at + 2);
                return Ok(Some(line));
            }
            if self.buf.len() > 64 * 1024 || !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// Up to `n` bytes (fewer at EOF).
    async fn take(&mut self, n: usize, out: &mut Vec<u8>) -> io::Result<bool> {
        let mut want = n;
        loop {
            let k = want.min(self.buf.len());
            out.extend_from_slice(&self.buf[..k]);
            self.buf.drain(..k);
            want -= k;
            if want == 0 {
                return Ok(true);
            }
            if !self.fill().await? {
                return Ok(false);
            }
        }
    }

    /// What is buffered, or (if nothing is) what the next read brings;
    /// empty at EOF.
    async fn some(&mut self, at_most: usize, out: &mut Vec<u8>) -> io::Result<usize> {
        if self.buf.is_empty() && !self.fill().await? {
            return Ok(0);
        }
        let k = at_most.min(self.buf.len());
        out.extend_from_slice(&self.buf[..k]);
        self.buf.drain(..k);
        Ok(k)
    }

    /// A response's status line and headers (no body).
    pub async fn head(&mut self) -> io::Result<Response> {
        let status_line = self.line().await?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "closed before a response")
        })?;
        let status_line = String::from_utf8_lossy(&status_line).into_owned();
        if !status_line.starts_with("HTTP/1.") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad status line {status_line:?}"),
            ));
        }
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad status line {status_line:?}"),
                )
            })?;
        let mut resp = Response {
            status,
            ..Response::default()
        };
        loop {
            let line = self.line().await?.ok_or_else(|| {
                io::Error::new(io::ErrorKind::UnexpectedEof, "closed inside the head")
            })?;
            if line.is_empty() {
                break;
            }
            // Latin-1: each byte is the char of the same value, so a value's
            // bytes are compared exactly (UTF-8 where Latin-1 was meant shows).
            let line: String = line.iter().map(|&b| b as char).collect();
            if let Some((n, v)) = line.split_once(':') {
                resp.headers.push((
                    n.trim().to_ascii_lowercase(),
                    v.trim_matches([' ', '\t']).to_string(),
                ));
            }
        }
        Ok(resp)
    }
}

/// Reads one response. A deadline reached inside the body is not an error:
/// the body is returned incomplete. `no_body`: the request was HEAD.
pub async fn read_response(
    s: &mut TcpStream,
    within: Duration,
    no_body: bool,
) -> io::Result<Response> {
    Reader::new(s, within).response(no_body).await
}

impl<S: AsyncRead + Unpin> Reader<S> {
    /// Reads one response from this reader, which keeps what came after it
    /// (the next response on a keep-alive connection).
    pub async fn response(&mut self, no_body: bool) -> io::Result<Response> {
        let r = self;
        let mut resp = r.head().await?;
        let status = resp.status;
        if no_body || status == 204 || status == 304 || (100..200).contains(&status) {
            resp.framing = "none";
            resp.complete = true;
            return Ok(resp);
        }
        let chunked = resp
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let result = if chunked {
            resp.framing = "chunked";
            read_chunked(r, &mut resp.body).await
        } else if let Some(len) = resp
            .header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
        {
            resp.framing = "length";
            r.take(len, &mut resp.body).await
        } else {
            resp.framing = "close";
            loop {
                let n = r.buf.len();
                r.take(n, &mut resp.body).await?;
                if !r.fill().await? {
                    break Ok(true);
                }
            }
        };
        resp.complete = match result {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                resp.timed_out = true;
                false
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => false,
            Err(e) => return Err(e),
        };
        Ok(resp)
    }

    /// Whether the peer closed the connection (EOF or reset) within
    /// `within` with nothing unread. What comes instead stays buffered for
    /// the next response.
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        self.deadline = Instant::now() + within;
        match self.fill().await {
            Ok(got) => !got,
            Err(e) => e.kind() != io::ErrorKind::TimedOut,
        }
    }

    /// The stream under the reader (to write the next request).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.s
    }
}

/// Latin-1: each char up to U+00FF as the byte of the same value (a
/// header value the kit means byte for byte); others as UTF-8.
pub fn latin1(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        if (c as u32) <= 0xFF {
            out.push(c as u32 as u8);
        } else {
            let mut b = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
        }
    }
    out
}

/// A request head like [`head`], each header value written as Latin-1
/// bytes ([`latin1`]).
pub fn head_latin1(method: &str, target: &str, host: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut h = format!("{method} {target} HTTP/1.1\r\nhost: {host}\r\n").into_bytes();
    for (n, v) in headers {
        h.extend_from_slice(n.as_bytes());
        h.extend_from_slice(b": ");
        h.extend_from_slice(&latin1(v));
        h.extend_from_slice(b"\r\n");
    }
    h.extend_from_slice(b"\r\n");
    h
}

async fn read_chunked<S: AsyncRead + Unpin>(
    r: &mut Reader<S>,
    out: &mut Vec<u8>,
) -> io::Result<bool> {
    loop {
        let Some(size_line) = r.line().await? else {
            return Ok(false);
        };
        let size_text = String::from_utf8_lossy(&size_line);
        let size_text = size_text.split(';').next().unwrap_or("").trim().to_string();
        let size = usize::from_str_radix(&size_text, 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                match r.line().await? {
                    Some(l) if l.is_empty() => return Ok(true),
                    Some(_) => continue,
                    None => return Ok(false),
                }
            }
        }
        if !r.take(size, out).await? {
            return Ok(false);
        }
        match r.line().await? {
            Some(l) if l.is_empty() => {}
            _ => return Ok(false),
        }
    }
}

/// A response body read piece by piece, for an interactive exchange:
/// chunked, or (without Transfer-Encoding) whatever arrives until EOF.
pub struct BodyPieces<S> {
    r: Reader<S>,
    chunked: bool,
    /// Bytes left in the current chunk.
    left: usize,
    /// A chunk's data was read: its CRLF is still to come.
    crlf: bool,
    /// The body's end was seen (the last chunk, or EOF).
    pub ended: bool,
}

impl<S: AsyncRead + Unpin> BodyPieces<S> {
    /// The body after `head` (read from `r`).
    pub fn new(r: Reader<S>, head: &Response) -> BodyPieces<S> {
        let chunked = head
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        BodyPieces {
            r,
            chunked,
            left: 0,
            crlf: false,
            ended: false,
        }
    }

    /// Reads into `out` until it holds `n` more bytes, the body ends or
    /// `within` passes (`Err` TimedOut; what came is in `out`).
    pub async fn read(&mut self, n: usize, out: &mut Vec<u8>, within: Duration) -> io::Result<()> {
        self.r.deadline = Instant::now() + within;
        let goal = out.len().saturating_add(n);
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        while out.len() < goal && !self.ended {
            if !self.chunked {
                if self.r.some(goal - out.len(), out).await? == 0 {
                    self.ended = true;
                }
                continue;
            }
            if self.left == 0 {
                if self.crlf {
                    if self.r.line().await?.is_none_or(|l| !l.is_empty()) {
                        return Err(bad("no CRLF after a chunk"));
                    }
                    self.crlf = false;
                }
                let line = self
                    .r
                    .line()
                    .await?
                    .ok_or_else(|| bad("closed in the body"))?;
                let text = String::from_utf8_lossy(&line);
                let text = text.split(';').next().unwrap_or("").trim().to_string();
                let size = usize::from_str_radix(&text, 16).map_err(|_| bad("bad chunk size"))?;
                if size == 0 {
                    while self.r.line().await?.is_some_and(|l| !l.is_empty()) {}
                    self.ended = true;
                    continue;
                }
                (self.left, self.crlf) = (size, true);
            }
            let k = self.r.some(self.left.min(goal - out.len()), out).await?;
            if k == 0 {
                return Err(bad("closed in a chunk"));
            }
            self.left -= k;
        }
        Ok(())
    }
}

/// One request on a new connection, read to the end.
pub async fn exchange(
    authority: &str,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    within: Duration,
) -> io::Result<Response> {
    let mut s = connect(authority, within).await?;
    let mut bytes = head(method, target, authority, headers);
    bytes.extend_from_slice(body);
    write_all(&mut s, &bytes, within).await?;
    read_response(&mut s, within, method == "HEAD").await
}
