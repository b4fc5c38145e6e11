//! Where a finished request's access record goes: by default the `tracing`
//! event at [`ACCESS_TARGET`], or an [`AccessLog`] of the host's
//! ([`GatewayBuilder::access_log`](super::GatewayBuilder::access_log)), as
//! nginx's `access_log` and Envoy's access-log sinks let an operator choose
//! where a line per request goes and what it costs.

use super::access::ACCESS_TARGET;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// One request that reached [`Forward`](super::Forward) (or
/// [`Gateway::forward_request`](super::Gateway::forward_request)), recorded
/// once, when its response is over: the fields of the access line
/// ([`ACCESS_TARGET`]). No header value, so no token, is in it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AccessRecord<'a> {
    /// The worker's id if it is a known one, else `unknown`.
    pub worker: &'a str,
    /// The request's method.
    pub method: &'a str,
    /// The request's path, without the query, cut to 1,024 bytes.
    pub path: &'a str,
    /// The response's status (`200`), `-` if none was sent, or `aborted`
    /// (the response failed after it started).
    pub status: &'a str,
    /// The bytes of the caller's body read.
    pub bytes_up: u64,
    /// The bytes of the response body sent.
    pub bytes_down: u64,
    /// From the request's arrival to the end of its response.
    pub duration: Duration,
    /// How it ended: `completed`, `caller_gone`, `worker_abort`, `lost`,
    /// `stall`, `overflow`, `protocol_error`, `timeout`, `caller_failed`,
    /// or `answered` for the gateway's own answer.
    pub end: &'static str,
    /// The caller's address, if the server gave it
    /// ([`PeerAddr`](crate::PeerAddr)).
    pub peer: Option<SocketAddr>,
}

impl<'a> AccessRecord<'a> {
    /// A record of a `method` request for `path` to `worker`, with no
    /// status (`-`), no bytes, no duration, ended `answered`, no peer: for
    /// testing an [`AccessLog`] (the gateway fills in every field).
    pub fn new(worker: &'a str, method: &'a str, path: &'a str) -> AccessRecord<'a> {
        AccessRecord {
            worker,
            method,
            path,
            status: "-",
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::ZERO,
            end: "answered",
            peer: None,
        }
    }

    /// The duration in milliseconds to the microsecond (at most three
    /// decimals, never a float's noise), as the line's `duration_ms`.
    pub fn duration_ms(&self) -> f64 {
        self.duration.as_micros() as f64 / 1000.0
    }

    /// The caller's address as the line's `peer` writes it: its
    /// `SocketAddr` text, or `-` if unknown.
    pub fn peer_text(&self) -> impl fmt::Display {
        Peer(self.peer)
    }

    /// Emits the record as the `tracing` event at [`ACCESS_TARGET`], `info`,
    /// with the fields `worker`, `method`, `path`, `status`, `bytes_up`,
    /// `bytes_down`, `duration_ms`, `end` and `peer`: what the gateway does
    /// without an [`AccessLog`], and what one may do for the records it does
    /// not write itself.
    pub fn trace(&self) {
        tracing::info!(
            target: ACCESS_TARGET,
            worker = %self.worker,
            method = %self.method,
            path = %self.path,
            status = %self.status,
            bytes_up = self.bytes_up,
            bytes_down = self.bytes_down,
            duration_ms = self.duration_ms(),
            end = %self.end,
            peer = %self.peer_text(),
            "access"
        );
    }
}

/// Takes each request's [`AccessRecord`] when its response is over, on the
/// task that served it: keep it short (a copy into a buffer that a thread of
/// its own writes), never wait in it, and never panic. Set with
/// [`GatewayBuilder::access_log`](super::GatewayBuilder::access_log); the
/// default is [`AccessRecord::trace`]. The relay program's own writes its
/// text lines straight into its log's buffer, through no field formatter
/// (BENCHMARKS.md, issue 42).
pub trait AccessLog: Send + Sync + 'static {
    /// One request, over.
    fn record(&self, record: &AccessRecord<'_>);
}

/// A caller's address in the access line, `-` if unknown.
pub(super) struct Peer(pub(super) Option<SocketAddr>);

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            // What `SocketAddr` writes, in one piece: its own `Display`
            // formats each number through `fmt`, a line per request.
            Some(SocketAddr::V4(p)) => {
                let mut text = [0u8; 21]; // 255.255.255.255:65535
                let mut len = 0;
                for (i, octet) in p.ip().octets().into_iter().enumerate() {
                    if i > 0 {
                        text[len] = b'.';
                        len += 1;
                    }
                    len += decimal(octet.into(), &mut text[len..]);
                }
                text[len] = b':';
                len += 1;
                len += decimal(p.port().into(), &mut text[len..]);
                f.pad(std::str::from_utf8(&text[..len]).map_err(|_| fmt::Error)?)
            }
            Some(p) => p.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// Writes `n` (below 100,000) in decimal at the start of `out`; its length.
fn decimal(n: u32, out: &mut [u8]) -> usize {
    let mut digits = [0u8; 5];
    let (mut n, mut len) = (n, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (slot, digit) in out.iter_mut().zip(digits[..len].iter().rev()) {
        *slot = *digit;
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_written_as_its_socket_address_writes_itself() {
        let mut n: u64 = 7;
        let mut next = || {
            // A fixed sequence (no seed): octets and ports of every length.
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            n >> 16
        };
        let mut peers: Vec<SocketAddr> = vec![
            "0.0.0.0:0".parse().unwrap(),
            "255.255.255.255:65535".parse().unwrap(),
            "127.0.0.1:50474".parse().unwrap(),
            "10.0.0.9:8".parse().unwrap(),
            "[::1]:8080".parse().unwrap(),
            "[fe80::1%2]:1".parse().unwrap(),
        ];
        for _ in 0..2000 {
            let (ip, port) = (next() as u32, next() as u16);
            let ip = std::net::Ipv4Addr::from(ip >> (next() % 4 * 8));
            peers.push(SocketAddr::from((ip, port >> (next() % 16))));
        }
        for p in peers {
            assert_eq!(Peer(Some(p)).to_string(), p.to_string());
        }
        assert_eq!(Peer(None).to_string(), "-");
    }
}
