//! # worker-relay-hyper
//!
//! The [Worker Relay Protocol](https://docs.rs/worker-relay) on tokio,
//! tokio-tungstenite and hyper: what a relay or a worker needs around the
//! protocol core [`worker_relay`] (re-exported here, so one dependency is
//! enough). The core is runtime-agnostic and depends on six small crates;
//! this crate follows the majors of tokio, hyper, tungstenite, rustls, tower
//! and metrics, so that the core need not.
//!
//! - [`ws`] (feature `tungstenite`, on with each of the three below):
//!   tokio-tungstenite WebSockets as [`frame::Message`](worker_relay::frame::Message)s,
//!   and the worker's dial with every refusal mapped to a
//!   [`connect::Verdict`](worker_relay::connect::Verdict) and every failure
//!   to its cause; `wss://` with feature `rustls`.
//! - `gateway` (feature `gateway`, default): a relay as two `tower`
//!   services (accept workers, forward callers) inside any hyper/tower/axum
//!   application.
//! - `server` (feature `server`, default): a hardened hyper accept loop
//!   (accept errors back off, a connection cap, header-read and send
//!   timeouts; HTTP/1.1 and HTTP/2; TLS with feature `rustls`).
//! - `tunnel` (feature `tunnel`, default): any `tower` HTTP service served
//!   as a worker, with the reconnect loop.
//! - Each of the three pulls only what it needs: `tunnel` brings no hyper,
//!   `server` no WebSocket library.
//! - Metrics (feature `metrics`): `gateway` and `tunnel` record requests,
//!   statuses, latencies, bytes, stream ends and connections through the
//!   [`metrics`](https://docs.rs/metrics) facade, for whatever exporter the
//!   program installs; every forwarded request is also one `tracing` event
//!   of the access log (`gateway::ACCESS_TARGET`). The names and what they
//!   mean: `docs/operations.md` in the repository.
//! - [`TokioTimer`]: the core's async drivers' clock on tokio;
//!   `TempFileOverflow` (feature `tempfile`): slow callers' responses in
//!   unlinked temporary files, with a budget.
//!
//! What each call of this crate can return: [`errors`]; the core's layers
//! have [their own page](worker_relay::errors).
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "registry", feature = "tunnel"))]
#[macro_use]
mod observe;

#[cfg(feature = "tempfile")]
mod budget;
pub mod errors;
#[cfg(feature = "registry")]
#[cfg_attr(docsrs, doc(cfg(feature = "registry")))]
pub mod gateway;
// Shared by the gateway and the tunnel, each using a part.
#[cfg(any(feature = "registry", feature = "tunnel"))]
#[cfg_attr(not(all(feature = "registry", feature = "tunnel")), allow(dead_code))]
mod pump;
#[cfg(any(feature = "tungstenite", feature = "server"))]
mod send_lowat;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod server;
#[cfg(feature = "tempfile")]
mod temp_file_overflow;
mod tokio_timer;
#[cfg(feature = "tunnel")]
#[cfg_attr(docsrs, doc(cfg(feature = "tunnel")))]
pub mod tunnel;
#[cfg(feature = "tungstenite")]
#[cfg_attr(docsrs, doc(cfg(feature = "tungstenite")))]
pub mod ws;

#[cfg(feature = "tempfile")]
#[cfg_attr(docsrs, doc(cfg(feature = "tempfile")))]
pub use temp_file_overflow::TempFileOverflow;
pub use tokio_timer::TokioTimer;
/// The protocol core this crate is built on, at the version it was built
/// with: its types appear in this crate's signatures.
pub use worker_relay;

/// The error type of this crate's bodies and services (as `tower` and
/// `hyper` box theirs): what the `gateway`, `server` and `tunnel` features
/// take from a service or a body, and what they pass on.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The address of the client a request came from, as the socket that
/// accepted it saw it (behind a load balancer: the balancer's): a request
/// extension (`req.extensions().get::<PeerAddr>()`) that `server::serve`
/// sets and the `gateway` reads for its access log and its refusals. An
/// application with an accept loop of its own inserts it the same way.
#[cfg(any(feature = "registry", feature = "server"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "registry", feature = "server"))))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub std::net::SocketAddr);
