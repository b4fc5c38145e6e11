//! Sans-IO pieces around a connection: handshake, reconnect backoff, URL
//! mapping, and the keepalive (re-exported from [`proto`](crate::proto),
//! where the machines embed it).
//!
//! Each piece is a plain value with no I/O, no clock and no randomness
//! inside: time comes in as a [`std::time::Instant`], randomness as a number
//! the caller drew. Together they cover the spec's "Connecting" and "Mapping
//! URLs" sections.
//!
//! | piece | side | what it does |
//! |---|---|---|
//! | [`WorkerHandshake`], [`Verdict`] | worker | the upgrade request's headers; what to make of the answer (connected, retry, or give up) |
//! | [`decide_upgrade`], [`TokenTable`], [`Accepted`], [`Rejected`] | relay | 101 naming the worker, 400 or 401, from the upgrade request's headers |
//! | [`decide_upgrade_for`], [`ConnectTarget`], [`ConnectRejected`] | relay | the same at a connect URL that names the worker (`/connect/<id>`): 401 for another worker's token |
//! | [`Token`] | both | the connect token; never shown by `Debug` or `Display`, compared in constant time |
//! | [`Backoff`] | worker | how long to wait before reconnecting: 1 s doubling to 60 s, with jitter |
//! | [`Keepalive`](crate::proto::Keepalive) | both | a ping every 20 s; dead if no pong within 20 s (defined in `proto`) |
//! | [`UrlMap`], [`Route`], [`WorkerId`] | relay | `/w/<id>/<path>?<query>` → worker, path and query |
//! | `connect::http` (feature `http`) | both | the handshake on the `http` crate's types (a forwarded request's conversions are in [`forward`](crate::forward)) |
//!
//! # Handshake
//!
//! The worker sends `Authorization: Bearer <token>` (only when it has a
//! token) and `Sec-WebSocket-Protocol: strata-worker-connect.v1`
//! ([`WorkerHandshake::request_headers`]). Its [`Verdict`] on the answer:
//! 101 selecting exactly that subprotocol is [`Verdict::Connected`]; 101
//! selecting none or another, or a 4xx other than 408 and 429, is
//! [`Verdict::Refused`], final (the worker exits with status 1); 408, 429,
//! 5xx, a network error or a close after connecting is [`Verdict::Retry`].
//!
//! The relay's [`decide_upgrade`] answers 400 if the subprotocol is not
//! offered, 401 if the bearer token is missing, malformed or unknown, and
//! otherwise 101 selecting the subprotocol, naming the worker the token
//! belongs to. A token longer than [`MAX_PRESENTED_TOKEN`] (1 KiB) is
//! refused (401) before any lookup. [`TokenTable::lookup`] costs O(1)
//! whatever the table's size: it finds the entry by a secret-keyed digest of
//! the presented token and checks it with a constant-time compare, so its
//! timing tells a stranger nothing about any token. A table holds tokens of
//! [`MIN_TABLE_TOKEN`] (16) to [`MAX_PRESENTED_TOKEN`] bytes.
//!
//! A worker behind a load balancer that routes by worker id dials a URL that
//! names it, `/connect/<id>` ([`ConnectTarget`]); [`decide_upgrade_for`]
//! then also refuses (401) a valid token that belongs to another worker, and
//! (400) a path that names no valid id.
//!
//! # Backoff and keepalive
//!
//! [`Backoff::next_wait`] gives the wait before each reconnect, a random time
//! in `[delay/2, delay]`; the delay doubles on each consecutive failure up to
//! 60 s and [`Backoff::reset`] puts it back to 1 s after a successful
//! handshake. [`Keepalive`](crate::proto::Keepalive) is a small struct a connection state machine
//! embeds: `handle_timeout(now)`, `handle_pong(now, payload)`,
//! `poll_ping()` (send it ahead of body chunks), `poll_timeout()` and
//! `is_dead()`.
//!
//! # URL mapping
//!
//! [`UrlMap::map`] splits a raw request target under the prefix (default
//! `/w/`) into the worker id, the path the worker sees (percent-encoding
//! untouched, `/` if nothing follows the id) and the raw query. The id must
//! be one segment of `[A-Za-z0-9_-]`; a `.` or `..` segment after it is
//! refused rather than forwarded (see [`UrlMap`]), so `/w/abc/../other/x`
//! reaches neither `abc` nor `other`.
//!
//! # A worker's connect loop
//!
//! The WebSocket dial and the sleep are the program's (a runtime's); here they
//! are fakes, so the loop runs as is: a network error, a 503, a successful
//! connection that later closes, then a 401, on which the worker exits 1.
//!
//! ```
//! use std::time::Duration;
//! use worker_relay::connect::{Backoff, Token, Verdict, WorkerHandshake};
//!
//! /// Stand-in for a WebSocket dial: the status and headers of the relay's
//! /// answer, or `Err` for a network error.
//! fn dial(attempt: u32, headers: &[(&str, &str)]) -> Result<(u16, Vec<(String, String)>), ()> {
//!     assert!(headers.contains(&("Authorization", "Bearer s3cret")));
//!     match attempt {
//!         0 => Err(()),
//!         1 => Ok((503, vec![])),
//!         2 => Ok((101, vec![("Sec-WebSocket-Protocol".into(), "strata-worker-connect.v1".into())])),
//!         _ => Ok((401, vec![])),
//!     }
//! }
//!
//! /// Caller-supplied randomness: any uniform source in [0, 1) will do.
//! fn random(state: &mut u64) -> f64 {
//!     *state ^= *state << 13;
//!     *state ^= *state >> 7;
//!     *state ^= *state << 17;
//!     (*state >> 11) as f64 / (1u64 << 53) as f64
//! }
//!
//! // The program reads STRATA_WORKER_CONNECT_TOKEN (and removes it from its
//! // environment); unset or empty means no Authorization header.
//! let token = Token::from_env_value(Some("s3cret".to_string()))?;
//! let handshake = WorkerHandshake::new(token);
//! let mut backoff = Backoff::default();
//! let mut rng = 0x2545_f491_4f6c_dd1d_u64;
//! let mut waits = Vec::new();
//!
//! let mut attempt = 0;
//! let exit_code = loop {
//!     let headers = handshake.request_headers();
//!     let pairs: Vec<(&str, &str)> = headers.iter().collect();
//!     let verdict = match dial(attempt, &pairs) {
//!         Ok((status, answer)) => {
//!             Verdict::from_response(status, answer.iter().map(|(n, v)| (n.as_str(), v.as_str())))
//!         }
//!         Err(()) => Verdict::network_error(),
//!     };
//!     attempt += 1;
//!     match verdict {
//!         Verdict::Connected => {
//!             backoff.reset();
//!             // Serve the connection (a state machine with an embedded
//!             // `Keepalive`) until it closes or the keepalive declares it dead;
//!             // then it is `Verdict::closed()`: retry.
//!         }
//!         Verdict::Retry(_reason) => {} // log it
//!         Verdict::Refused(why) => {
//!             eprintln!("strata-worker: {why}");
//!             break 1;
//!         }
//!         _ => {} // a verdict this version does not know: retry
//!     }
//!     let wait = backoff.next_wait(random(&mut rng));
//!     waits.push(wait); // a runtime would sleep here
//! };
//!
//! assert_eq!(exit_code, 1);
//! assert_eq!(waits.len(), 3);
//! let within = |w: Duration, delay: u64| {
//!     w >= Duration::from_secs(delay) / 2 && w <= Duration::from_secs(delay)
//! };
//! assert!(within(waits[0], 1)); // network error: delay 1 s
//! assert!(within(waits[1], 2)); // 503: delay 2 s
//! assert!(within(waits[2], 1)); // closed after connecting: back to 1 s
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # A relay's accept path
//!
//! The relay decides on the worker's upgrade request, registers the socket
//! under the worker it names, and then maps each caller's request to a worker
//! and the `request` frame to send it.
//!
//! ```
//! use worker_relay::connect::{decide_upgrade, Token, TokenTable, UrlError, UrlMap, WorkerId};
//! use worker_relay::frame::{ControlFrame, Headers, StreamId};
//!
//! let mut tokens = TokenTable::new();
//! tokens.insert(WorkerId::new("abc")?, Token::new("ct-abc-1f3a9c27d85e40b6")?)?;
//!
//! // 1. A worker's upgrade request (the WebSocket library checks the rest).
//! let upgrade = [
//!     ("Host", "relay.example.com"),
//!     ("Upgrade", "websocket"),
//!     ("Sec-WebSocket-Protocol", "strata-worker-connect.v1"),
//!     ("Authorization", "Bearer ct-abc-1f3a9c27d85e40b6"),
//! ];
//! let worker = match decide_upgrade(&tokens, upgrade) {
//!     Ok(accepted) => {
//!         // Answer 101 with these headers, then keep the socket under this id.
//!         assert_eq!(accepted.status(), 101);
//!         assert_eq!(
//!             accepted.response_headers(),
//!             [("Sec-WebSocket-Protocol", "strata-worker-connect.v1")]
//!         );
//!         accepted.into_worker()
//!     }
//!     Err(rejected) => {
//!         // Answer rejected.status() (400 or 401) with rejected.response_headers().
//!         panic!("refused: {} {rejected}", rejected.status());
//!     }
//! };
//! assert_eq!(worker, "abc");
//!
//! // An unknown token is a 401, a missing subprotocol a 400.
//! let bad = [("Sec-WebSocket-Protocol", "strata-worker-connect.v1"), ("Authorization", "Bearer nope")];
//! assert_eq!(decide_upgrade(&tokens, bad).unwrap_err().status(), 401);
//! let old = [("Sec-WebSocket-Protocol", "chat"), ("Authorization", "Bearer ct-abc-1f3a9c27d85e40b6")];
//! assert_eq!(decide_upgrade(&tokens, old).unwrap_err().status(), 400);
//!
//! // 2. A caller's request for the worker.
//! let urls = UrlMap::default(); // prefix "/w/"
//! let route = urls.map("/w/abc/v1/execute?trace=1")?;
//! assert_eq!((route.worker.as_str(), route.path, route.query), ("abc", "/v1/execute", "trace=1"));
//! // Forward it to the socket registered for `route.worker`, or answer 503 if none
//! // is connected (502 is for a worker lost while the request is in flight).
//! assert_eq!(route.worker, worker);
//! let caller_headers = Headers::try_from_pairs([
//!     ("Authorization", "Bearer worker-token"), // the worker's own token, forwarded
//!     ("Connection", "keep-alive"),             // hop-by-hop, dropped
//!     ("Content-Length", "0"),
//! ])?;
//! let head = route.request_head("POST", &caller_headers)?;
//! let frame = ControlFrame::Request { id: StreamId::MIN, head };
//! assert!(frame.encode().starts_with(r#"{"type":"request","id":1,"method":"POST","path":"/v1/execute""#));
//!
//! // A target that tries to climb out of the worker's prefix is refused (answer 400).
//! assert_eq!(urls.map("/w/abc/../other/x").unwrap_err(), UrlError::DotSegment);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod backoff;
mod claimed;
mod handshake;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod token;
mod token_file;
mod url;

/// The close reason (with [`CloseCode::REPLACED`](crate::frame::CloseCode::REPLACED),
/// 4000) of a connection that a relay replaced by a newer one of its
/// worker, sent once its streams are done (this crate's gateway with
/// `DuplicatePolicy::Replace`). A worker that gets it knows another process
/// holds its token now: this crate's `tunnel::Tunnel` then waits its
/// longest backoff before it dials again, so that a redeploy's old process
/// does not take the worker back. The tunnel reads the code; for one
/// release it also honours 1008 with this reason, which relays before
/// 4000 was given to it sent.
pub const REPLACED: &str = "replaced by a new connection";

pub use backoff::{Backoff, BackoffConfig, BackoffConfigBuilder};
pub use claimed::{decide_upgrade_at, decide_upgrade_for, ConnectRejected, ConnectTarget};
pub use handshake::{
    bearer_token, decide_upgrade, Accepted, Refused, Rejected, RequestHeaders, RetryReason,
    Verdict, WorkerHandshake, AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL, WWW_AUTHENTICATE,
};
pub use token::{
    Token, TokenError, TokenTable, TokenTableError, MAX_PRESENTED_TOKEN, MIN_TABLE_TOKEN, REDACTED,
};
pub use token_file::{TokenFileError, TokenLineError};
pub use url::{Route, UrlError, UrlMap, WorkerId, WorkerIdError};
