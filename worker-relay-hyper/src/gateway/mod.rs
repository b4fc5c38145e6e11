//! A relay inside any application: hyper, tower or axum (feature
//! `gateway`), or any other host (feature `registry`, no hyper, no tower).
//!
//! A [`Gateway`] holds the relay's state: who may connect (a
//! [`TokenTable`]), who is connected (one connection per worker id, with a
//! [`DuplicatePolicy`]), and the settings of each connection. It hands out
//! two `tower` services, cheap to clone:
//!
//! - [`Connect`] answers a worker's upgrade request (`GET /connect`, or
//!   `GET /connect/<id>` naming the worker): 400 without the subprotocol
//!   or for a path that names no valid id, 401 for a bad token or (at
//!   `/connect/<id>`) another worker's token, 101 otherwise; then the
//!   connection lives on its own task, registered under its worker.
//! - [`Forward`] forwards a caller's request `/w/<id>/<path>?<query>` to
//!   worker `<id>` and streams the answer back as a [`GatewayBody`]: 404 for
//!   an unknown worker or path, 503 (`Retry-After: 1`) for one that is not
//!   connected within [`GatewayBuilder::reconnect_wait`] (10 s) or busy, 400 for a caller's body that fails and 408 for one
//!   silent past [`GatewayBuilder::upload_timeout`] (unless the worker has
//!   answered by then), 502 when the worker fails, 504 when the worker
//!   takes none of the body for [`GatewayBuilder::send_timeout`] or sends
//!   no head within [`GatewayBuilder::response_head_timeout`] (none by
//!   default); a response the worker aborts after it
//!   started ends with an error, so the caller sees it fail.
//!
//! The caller's body goes up piece by piece as it arrives (each piece is
//! sent when the caller pauses, not when its next piece comes), on a task
//! the request owns: dropping the [`Forward`] future before the response
//! head (a timeout layer, a caller that hangs up) aborts the stream, and
//! after the head the [`GatewayBody`] owns the upload, so dropping it
//! aborts an unfinished upload too. What is left of the caller's body is
//! then read and discarded for at most
//! [`GatewayBuilder::lingering_time`] and
//! [`GatewayBuilder::lingering_bytes`], as nginx does, so that a caller
//! still sending (a large POST its worker answered 401) reads its answer
//! rather than a reset. The relay's own refusals (404, 503, 405, 400)
//! discard the body they leave unread the same way.
//!
//! [`Gateway::service`] is both behind one service (by path: the connect
//! path and everything under it to [`Connect`]), ready for
//! [`server::serve`](crate::server::serve) or hyper. Both services need a
//! tokio runtime; [`Connect`] needs a hyper server with upgrades enabled
//! (axum's `serve` has them).
//!
//! Embedding in an axum app with routes of its own:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{routing::get, Router};
//! use worker_relay::connect::TokenTable;
//! use worker_relay_hyper::gateway::Gateway;
//!
//! let gateway = Gateway::new(TokenTable::parse("abc ct-abc-1f3a9c27d85e40b6")?);
//! let app = Router::new()
//!     .route("/status", get(|| async { "fine" }))
//!     .route_service("/connect", gateway.connect())
//!     // Behind a load balancer that routes by worker id (docs/scale-out.md):
//!     // the token must be <id>'s.
//!     .route_service("/connect/{id}", gateway.connect())
//!     .route_service("/w/{*rest}", gateway.forward());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! [`Connect`] reads the id from the request's path when it is the
//! gateway's connect path followed by `/<id>`
//! ([`ConnectTarget`](worker_relay::connect::ConnectTarget)); routed at any other
//! path, it takes the worker from the token alone.
//!
//! Route with `route_service` (or a fallback): `nest_service` would strip
//! the `/w` prefix the gateway maps by.
//!
//! # Any other host
//!
//! Everything but the two tower services needs neither hyper nor tower
//! (feature `registry`): the registry, its duplicate policy and flap
//! damping, the reconnect wait, drain with 1012, revocation, the overflow
//! in temporary files, the access log and the metrics. A host brings a
//! worker's handshake and a caller's request:
//!
//! - [`Gateway::admit`] decides a worker's handshake from its path and
//!   headers (every rule of [`Connect`] but the WebSocket handshake). Then
//!   either [`Admission::serve`] serves the WebSocket the host accepted with
//!   a library of its own (mapped to [`Message`]s; two halves joined by
//!   [`HostSocket`]; turn on [`GatewayBuilder::answer_pings`] if the library
//!   leaves pings to the application, as actix-ws does), or
//!   [`Admission::upgrade_local`] runs the WebSocket itself over the
//!   upgraded connection's bytes (the request's body in, the 101's
//!   streaming body out: actix-web's way), with [`LetGo`] to hold the close
//!   deadline on a host that keeps a socket its peer does not read.
//! - [`Gateway::forward_request`] forwards a request whose body is an
//!   `http_body::Body`; [`Gateway::forward_local`] one whose body is a
//!   stream that is not `Send` (actix-web's `Payload`). The answer is an
//!   `http::Response<`[`GatewayBody`]`>`, whose body is also a `Stream` of
//!   bytes.
//!
//! `examples/actix.rs` in the repository is an actix-web 4 app with a route
//! of its own and the relay in 59 lines; the conformance kit's relay mode
//! runs against it in CI.

mod accept;
mod access;
mod access_log;
mod authorize;
mod body;
mod forget;
mod forward;
mod host_socket;
#[cfg(feature = "gateway")]
mod hyper_upgrade;
mod local;
#[cfg(feature = "metrics")]
mod meters;
mod overflow_log;
mod registry;
#[cfg(feature = "gateway")]
mod services;
#[cfg(all(test, feature = "gateway"))]
mod tests;
mod upgrade;
mod upload;

pub use accept::{Admission, AttachError};
pub use access::ACCESS_TARGET;
pub use access_log::{AccessLog, AccessRecord};
pub use authorize::{AuthorizeFuture, Presented};
pub use body::GatewayBody;
pub use forget::FORGET_AFTER;
pub use host_socket::HostSocket;
pub use registry::{
    DuplicatePolicy, Presence, WorkerInfo, FLAP_REPLACEMENTS, FLAP_WINDOW, MAX_PRESENCE_CAPACITY,
};
#[cfg(feature = "gateway")]
pub use services::{Connect, Forward, GatewayService, ResponseFuture};
pub use upgrade::LetGo;

use crate::TempFileOverflow;
use futures_core::Stream;
use futures_sink::Sink;
use http::{Request, Response, StatusCode};
use registry::Registry;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use worker_relay::connect::{TokenTable, UrlMap, WorkerId};
use worker_relay::frame::{CloseCode, Message};
use worker_relay::proto::{OverflowConfig, RelayConfig, Stats};
use worker_relay::rt::{self, Overflow, RelayHandle};

use crate::BoxError;

/// The path workers dial by default; `/connect/<id>` names the worker
/// (checked against its token).
pub const CONNECT_PATH: &str = "/connect";

/// How long a stream past its 256 KiB in memory waits for its caller
/// before its response goes to the overflow store, by default
/// ([`OverflowConfig::spill_after`]): long enough for a caller's task
/// waiting for a thread; a caller must read 256 KiB per millisecond
/// (256 MB/s) to hold the other streams to its pace.
const SPILL_AFTER: Duration = Duration::from_millis(1);

/// The same wait for a stream alone on its connection, by default
/// ([`OverflowConfig::spill_after_alone`]): reading paused then holds up
/// no other stream, and a caller a little slower at times than the worker
/// (a tunnel relaying a local server's `sendfile`) no longer sends its whole
/// response through the overflow store's two more copies (BENCHMARKS.md,
/// issue 42). A lone caller that does not catch up in this time spills as
/// before.
const SPILL_AFTER_ALONE: Duration = Duration::from_millis(50);

/// A relay's state, shared by its services. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    /// The token table now; replaced whole by [`Gateway::replace_tokens`].
    tokens: std::sync::RwLock<Arc<TokenTable>>,
    urls: UrlMap,
    connect_path: String,
    relay: RelayConfig,
    overflow: Arc<dyn Overflow>,
    upload_timeout: Duration,
    send_timeout: Duration,
    response_head_timeout: Option<Duration>,
    lingering_time: Duration,
    lingering_bytes: u64,
    reconnect_wait: Duration,
    /// The authorisation hook, for tokens the table does not hold.
    authorize: Option<authorize::Authorizer>,
    /// The workers the hook let in, and when to forget workers that left.
    forgetting: forget::Forgetting,
    registry: Registry,
    /// Set by [`Gateway::drain`]: no new worker, no new request.
    draining: std::sync::atomic::AtomicBool,
    /// One clone per worker connection's task, alive until it ends.
    alive: Arc<()>,
    /// Where each request's access record goes; `None`: the `tracing`
    /// event.
    access_log: Option<Arc<dyn AccessLog>>,
    /// The per-worker metric handles.
    #[cfg(feature = "metrics")]
    meters: meters::Meters,
}

/// Settings of a [`Gateway`]; from [`Gateway::builder`].
pub struct GatewayBuilder {
    tokens: TokenTable,
    urls: UrlMap,
    connect_path: String,
    relay: RelayConfig,
    overflow: Arc<dyn Overflow>,
    upload_timeout: Duration,
    send_timeout: Duration,
    response_head_timeout: Option<Duration>,
    lingering_time: Duration,
    lingering_bytes: u64,
    reconnect_wait: Duration,
    duplicates: DuplicatePolicy,
    presence_capacity: usize,
    flap: Option<(usize, Duration)>,
    replace_grace: Duration,
    authorize: Option<authorize::Authorizer>,
    authorize_timeout: Duration,
    forget_after: Duration,
    access_log: Option<Arc<dyn AccessLog>>,
}

impl GatewayBuilder {
    /// How caller URLs map to workers (default: under `/w/`).
    pub fn urls(mut self, urls: UrlMap) -> Self {
        self.urls = urls;
        self
    }

    /// The path [`Gateway::service`] sends to [`Connect`], with every
    /// `<path>/<id>` under it (default [`CONNECT_PATH`]).
    pub fn connect_path(mut self, path: impl Into<String>) -> Self {
        self.connect_path = path.into();
        self
    }

    /// Whether each connection answers its worker's pings itself
    /// ([`RelayConfig::answer_pings`]), keeping the rest of
    /// [`relay_config`](Self::relay_config): on for a host whose WebSocket
    /// library leaves pings to the application (actix-ws), off (the
    /// default) for one that answers them (tungstenite, which
    /// [`Gateway::connect`] uses). Unanswered, a worker's keepalive takes
    /// the connection for dead after 20 s.
    pub fn answer_pings(mut self, on: bool) -> Self {
        self.relay = (self.relay.to_builder().answer_pings(on).build())
            .expect("a valid configuration stays valid");
        self
    }

    /// Each worker connection's settings. The default is the crate's, with
    /// slow callers' responses overflowing: 256 KiB per stream in memory
    /// (not the machine's 1 MiB: with the file store behind it, memory is
    /// only a step on the way, and 20 slow callers then cost ~5 MiB, not
    /// 20), then, after a wait of at most 1 ms for the caller to catch up
    /// ([`OverflowConfig::spill_after`]; 50 ms for a stream alone on its
    /// connection, [`OverflowConfig::spill_after_alone`]), the overflow
    /// store.
    pub fn relay_config(mut self, config: RelayConfig) -> Self {
        self.relay = config;
        self
    }

    /// The connection settings as they stand: the default described at
    /// [`GatewayBuilder::relay_config`], or the last one given. To change
    /// one setting and keep the rest (the overflow's waits among them),
    /// start from these: `builder.current_relay_config().to_builder()`.
    pub fn current_relay_config(&self) -> &RelayConfig {
        &self.relay
    }

    /// Where slow callers' responses wait, one store for all the worker
    /// connections. Default: [`TempFileOverflow::default`], unlinked
    /// temporary files in [`std::env::temp_dir`] within one 8 GiB budget
    /// for the whole gateway (a runtime and a file system are at hand
    /// here, and RAM is the scarcer of the two); the per-response and
    /// per-connection bounds are [`RelayConfig::overflow`]'s. The store's
    /// work runs where its [`Overflow::spawn`] says, else on tokio's
    /// blocking pool, never under a worker connection's lock.
    pub fn overflow(mut self, overflow: Arc<dyn Overflow>) -> Self {
        self.overflow = overflow;
        self
    }

    /// How long a caller's request body may send nothing before the
    /// request is aborted and the caller answered 408 (default 60 s, as
    /// nginx's `client_body_timeout`).
    pub fn upload_timeout(mut self, timeout: Duration) -> Self {
        self.upload_timeout = timeout;
        self
    }

    /// How long the worker's side may take none of a request body that
    /// has bytes for it (the stream's queue full, the worker not reading)
    /// before the stream is aborted: the caller gets 504 if the response
    /// has not started, a failed response otherwise (default 60 s, as
    /// nginx's `proxy_send_timeout`). Any byte taken restarts it, so a slow
    /// reader is not cut off.
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// How long the worker may take to start its response once it has the
    /// whole request (its `end` queued; at once for a request without a
    /// body) before the stream is aborted and the caller answered 504.
    /// Default `None`, no limit: a worker answers a cell's dispatch only
    /// when the cell finishes, which may take hours. Put a timeout layer
    /// around [`Forward`] for a limit on the whole request instead.
    pub fn response_head_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.response_head_timeout = timeout;
        self
    }

    /// How long what is left of a caller's request body is read and
    /// discarded once the worker no longer needs it (it answered without
    /// reading it all, the stream failed, or the request was dropped),
    /// so that the caller reads its answer rather than a reset (default
    /// 30 s, as nginx's `lingering_time`); the body of a request the relay
    /// refuses itself (404, 503, 405, 400) too. It ends sooner when the
    /// body does, when the caller sends nothing for the upload timeout, or
    /// past [`GatewayBuilder::lingering_bytes`]; zero lets go of the body
    /// at once.
    pub fn lingering_time(mut self, time: Duration) -> Self {
        self.lingering_time = time;
        self
    }

    /// The most of a caller's request body read and discarded once the
    /// worker, or the relay, no longer needs it (default
    /// [`LINGERING_BYTES`], 1 GiB): past it, or for a body whose
    /// `Content-Length` is larger, the connection is let go at once (the
    /// caller may then see a reset rather than its answer). The relay's
    /// own refusals (404 for an unknown worker, 503 for one not connected
    /// or a draining relay, 405, 400) discard what the caller sends within
    /// this bound and [`GatewayBuilder::lingering_time`] too, so that a
    /// caller that writes its whole body before it reads (Python's
    /// `http.client`, many SDKs) reads its answer.
    pub fn lingering_bytes(mut self, bytes: u64) -> Self {
        self.lingering_bytes = bytes;
        self
    }

    /// What a second connection of a connected worker does (default
    /// [`DuplicatePolicy::Replace`]).
    pub fn duplicates(mut self, policy: DuplicatePolicy) -> Self {
        self.duplicates = policy;
        self
    }

    /// How long a connection replaced by a newer one of its worker
    /// ([`DuplicatePolicy::Replace`]) may take to finish the streams it
    /// has before it is closed, requests in flight on it failing (default
    /// 30 s, as the relay's drain). It is closed sooner once it has taken
    /// nothing of the data queued for it for 5 s (its peer stopped
    /// reading), and a dead one's streams end when its keepalive declares
    /// it dead.
    pub fn replace_grace(mut self, grace: Duration) -> Self {
        self.replace_grace = grace;
        self
    }

    /// How long a request for a known worker that is not connected waits
    /// for it to connect before it is answered 503 (`Retry-After: 1`):
    /// across a relay's or a worker's restart, requests wait for the
    /// worker's reconnect instead of failing. Default [`RECONNECT_WAIT`],
    /// 10 s (a worker reconnects within 1 s of a close, per the spec's
    /// backoff, and Strata's worker too); zero answers 503 at once. The
    /// relay example takes `--reconnect-wait SECS`.
    pub fn reconnect_wait(mut self, wait: Duration) -> Self {
        self.reconnect_wait = wait;
        self
    }

    /// Flap damping: once a worker's open connection has been replaced
    /// `replacements` times within `window` (two processes given one
    /// token), its new handshakes are answered 429 with `Retry-After` until
    /// the oldest of those is `window` old. Default
    /// `Some((FLAP_REPLACEMENTS, FLAP_WINDOW))`, 3 in 30 s; `None` turns it
    /// off.
    pub fn flap_damping(mut self, damping: Option<(usize, Duration)>) -> Self {
        self.flap = damping;
        self
    }

    /// An asynchronous authorisation hook, for workers that live in a
    /// database rather than in the token table: a handshake whose token the
    /// table does not hold (and not longer than
    /// [`MAX_PRESENTED_TOKEN`](worker_relay::connect::MAX_PRESENTED_TOKEN)) is
    /// decided by `hook`, given the token, the id the URL names
    /// (`/connect/<id>`) if any, and the peer's address. Its answer is the
    /// worker (refused 401 if the URL names another) or the status to
    /// refuse with; an answer later than
    /// [`GatewayBuilder::authorize_timeout`] is refused 503 (the worker
    /// retries). A worker the hook let in counts as known from then on,
    /// until it has been gone for [`GatewayBuilder::forget_after`]:
    /// callers' requests for it wait for its reconnect rather than get 404.
    /// A token table change never closes it ([`Gateway::replace_tokens`]):
    /// revoke one by closing its connection ([`Gateway::handle`]) and
    /// refusing it from then on.
    ///
    /// Any stranger can make the gateway call the hook, once per handshake:
    /// keep it cheap for unknown tokens (a keyed digest and an index look-up,
    /// as [`TokenTable`] does), never log the token, and rate-limit in front
    /// of the gateway if a look-up is costly.
    ///
    /// ```
    /// use http::StatusCode;
    /// use worker_relay::connect::{TokenTable, WorkerId};
    /// use worker_relay_hyper::gateway::{Gateway, Presented};
    ///
    /// /// Stands for a database query.
    /// async fn worker_of(token: &str) -> Option<String> {
    ///     token.strip_prefix("db-token-").map(str::to_owned)
    /// }
    ///
    /// let gateway = Gateway::builder(TokenTable::new())
    ///     .authorize(|p: Presented| async move {
    ///         let id = worker_of(&p.token).await.ok_or(StatusCode::UNAUTHORIZED)?;
    ///         WorkerId::new(id).map_err(|_| StatusCode::UNAUTHORIZED)
    ///     })
    ///     .build();
    /// # drop(gateway);
    /// ```
    pub fn authorize<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Presented) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<WorkerId, StatusCode>> + Send + 'static,
    {
        self.authorize = Some(authorize::Authorizer::new(hook, self.authorize_timeout));
        self
    }

    /// How long the authorisation hook may take before the handshake is
    /// refused 503 (default 5 s).
    pub fn authorize_timeout(mut self, timeout: Duration) -> Self {
        self.authorize_timeout = timeout;
        self
    }

    /// How many [`Presence`] events a slow subscriber may lag behind before
    /// it misses some (default 256, at most [`MAX_PRESENCE_CAPACITY`]: a
    /// larger number is that one).
    pub fn presence_capacity(mut self, n: usize) -> Self {
        self.presence_capacity = n;
        self
    }

    /// How long the gateway remembers a worker that is not connected
    /// (default [`FORGET_AFTER`], 1 hour): a worker the authorisation hook
    /// let in counts as known (its callers wait for its reconnect rather
    /// than get 404) until it has been gone this long, and what is kept
    /// per worker (why its last connection ended, its flap damping record,
    /// its metric handles) goes then too, so that a hook letting in ever
    /// new ids does not grow the gateway without bound. Measured from when
    /// its last connection ended, or when the hook let it in if it never
    /// connected.
    pub fn forget_after(mut self, after: Duration) -> Self {
        self.forget_after = after;
        self
    }

    /// Where each forwarded request's [`AccessRecord`] goes when its
    /// response is over (default: [`AccessRecord::trace`], the `tracing`
    /// event at [`ACCESS_TARGET`]). The metrics are recorded either way.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use worker_relay::connect::TokenTable;
    /// use worker_relay_hyper::gateway::{AccessLog, AccessRecord, Gateway};
    ///
    /// /// Counts each worker's answers by status, and logs as before.
    /// #[derive(Default)]
    /// struct Tally(Mutex<Vec<(String, String)>>);
    ///
    /// impl AccessLog for Tally {
    ///     fn record(&self, r: &AccessRecord<'_>) {
    ///         self.0.lock().unwrap().push((r.worker.into(), r.status.into()));
    ///         r.trace();
    ///     }
    /// }
    ///
    /// let gateway = Gateway::builder(TokenTable::new())
    ///     .access_log(Arc::new(Tally::default()))
    ///     .build();
    /// # drop(gateway);
    /// ```
    pub fn access_log(mut self, log: Arc<dyn AccessLog>) -> Self {
        self.access_log = Some(log);
        self
    }

    /// The gateway. With the `metrics` feature, its metrics are described
    /// (help texts, units) to the recorder installed now: install one
    /// first.
    pub fn build(self) -> Gateway {
        #[cfg(feature = "metrics")]
        crate::observe::describe(true);
        let authorize = self.authorize.map(|mut a| {
            a.timeout = self.authorize_timeout;
            a
        });
        Gateway {
            inner: Arc::new(Inner {
                tokens: std::sync::RwLock::new(Arc::new(self.tokens)),
                urls: self.urls,
                connect_path: self.connect_path,
                relay: self.relay,
                overflow: Arc::new(overflow_log::Logged(self.overflow)),
                upload_timeout: self.upload_timeout,
                send_timeout: self.send_timeout,
                response_head_timeout: self.response_head_timeout,
                lingering_time: self.lingering_time,
                lingering_bytes: self.lingering_bytes,
                reconnect_wait: self.reconnect_wait,
                authorize,
                forgetting: forget::Forgetting::new(self.forget_after),
                draining: Default::default(),
                alive: Arc::new(()),
                access_log: self.access_log,
                #[cfg(feature = "metrics")]
                meters: Default::default(),
                registry: Registry::new(
                    self.duplicates,
                    self.presence_capacity,
                    self.flap,
                    self.replace_grace,
                ),
            }),
        }
    }
}

impl Gateway {
    /// A gateway for the workers of `tokens`, with the default settings.
    pub fn new(tokens: TokenTable) -> Gateway {
        Gateway::builder(tokens).build()
    }

    /// Settings for a gateway for the workers of `tokens`.
    pub fn builder(tokens: TokenTable) -> GatewayBuilder {
        let mut overflow = OverflowConfig::default();
        overflow.memory_per_stream = 256 << 10;
        overflow.spill_after = SPILL_AFTER;
        overflow.spill_after_alone = SPILL_AFTER_ALONE;
        let relay = RelayConfig::builder()
            .overflow(Some(overflow))
            .build()
            .expect("the default settings are valid");
        GatewayBuilder {
            tokens,
            urls: UrlMap::default(),
            connect_path: CONNECT_PATH.into(),
            relay,
            overflow: Arc::new(TempFileOverflow::default()),
            upload_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            response_head_timeout: None,
            lingering_time: Duration::from_secs(30),
            lingering_bytes: LINGERING_BYTES,
            reconnect_wait: RECONNECT_WAIT,
            duplicates: DuplicatePolicy::default(),
            presence_capacity: 256,
            flap: Some((FLAP_REPLACEMENTS, FLAP_WINDOW)),
            replace_grace: Duration::from_secs(30),
            authorize: None,
            authorize_timeout: Duration::from_secs(5),
            forget_after: FORGET_AFTER,
            access_log: None,
        }
    }

    /// Serves `socket` as `worker`'s connection until it ends, registered
    /// until it starts closing (its close then takes at most the
    /// connection's `close_timeout`): for a WebSocket accepted some other way (axum's
    /// `WebSocketUpgrade` mapped to [`Message`]s, say) after your own
    /// handshake decision. Returns how the connection ended:
    /// [`AttachError::Duplicate`] if [`DuplicatePolicy::Refuse`] refused it,
    /// [`AttachError::Driver`] if it ended abnormally.
    pub async fn attach<S, E>(
        &self,
        worker: WorkerId,
        socket: S,
    ) -> Result<rt::Closed, AttachError<E>>
    where
        S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin + 'static,
        E: std::fmt::Display,
    {
        Admission::decided(&self.inner, worker, Default::default())
            .serve(socket)
            .await
    }

    /// Decides a worker's WebSocket handshake for a host that accepts the
    /// WebSocket its own way (not through hyper's upgrades, which
    /// [`connect`](Self::connect) uses): from the request's path (for
    /// `<connect path>/<id>`) and headers, and the peer's address if known
    /// (for the logs and flap damping), with every rule of
    /// [`connect`](Self::connect) but the WebSocket handshake itself (the
    /// host's library checks `Sec-WebSocket-Key` and the version):
    /// 503 while draining, 400/401 for the token (the authorisation hook
    /// asked for one the table does not hold), 429 while the worker's
    /// connection flaps, 503 under [`DuplicatePolicy::Refuse`]. The `Err`
    /// is the answer to send instead of 101; counted in the handshake
    /// metrics either way. On `Ok`, answer 101 with
    /// `Sec-WebSocket-Protocol: `[`SUBPROTOCOL`](worker_relay::frame::SUBPROTOCOL)
    /// and give the socket to [`Admission::serve`].
    pub async fn admit(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<Admission, Response<GatewayBody>> {
        let decided = accept::admission(&self.inner, path, headers, peer).await;
        crate::observe::relay::handshake(match &decided {
            Ok(_) => "accepted",
            Err(resp) => accept::outcome(resp.status()),
        });
        decided.map_err(|resp| *resp)
    }

    /// Forwards one caller's request (as [`forward`](Self::forward)'s
    /// service does) for a host that is not tower's: any request whose body
    /// is an [`http_body::Body`]. Never fails: a refusal is an HTTP answer.
    /// The future is `Send`; a body that is not, [`forward_local`](Self::forward_local) takes.
    pub fn forward_request<B>(
        &self,
        req: Request<B>,
    ) -> impl Future<Output = Response<GatewayBody>> + Send + 'static
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        forward::forward(self.inner.clone(), req, None)
    }

    /// [`forward_request`](Self::forward_request) for a host whose request
    /// bodies are streams that are not `Send` (actix-web's `Payload`),
    /// on a runtime that runs a [`LocalSet`](tokio::task::LocalSet)
    /// (actix-web's workers do): the body is read by a task of the current
    /// thread and handed over through a channel of two pieces, so its
    /// upload keeps every deadline and the discarding of what a refusal
    /// leaves unread. A request whose framing says it has no body (HTTP/1
    /// without `Content-Length` or `Transfer-Encoding`, or
    /// `Content-Length: 0`) starts no task, and is sent again on the
    /// worker's next connection if its connection goes first, as a
    /// body-less request is.
    ///
    /// # Panics
    /// Outside a `LocalSet` when the request has a body, as
    /// [`tokio::task::spawn_local`] does.
    pub fn forward_local<S, E>(
        &self,
        req: Request<S>,
    ) -> impl Future<Output = Response<GatewayBody>> + Send + 'static
    where
        S: Stream<Item = Result<bytes::Bytes, E>> + 'static,
        E: Into<BoxError>,
    {
        let (parts, stream) = req.into_parts();
        let body = if local::framed_empty(parts.version, &parts.headers) {
            local::LocalBody::empty()
        } else {
            local::LocalBody::spawn(stream)
        };
        forward::forward(self.inner.clone(), Request::from_parts(parts, body), None)
    }

    /// The connection of `worker`, if it is connected.
    pub fn handle(&self, worker: &str) -> Option<RelayHandle> {
        self.inner.registry.handle(worker)
    }

    /// Whether `worker` is connected now.
    pub fn is_connected(&self, worker: &str) -> bool {
        self.handle(worker).is_some()
    }

    /// The workers connected now.
    pub fn connected(&self) -> Vec<WorkerId> {
        self.inner.registry.workers()
    }

    /// Every connected worker: since when, from where, its connection's
    /// counters, and why its previous connection ended (for an admin page:
    /// the relay example's `GET /workers`).
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.inner.registry.infos()
    }

    /// The counters of `worker`'s connection, if it is connected.
    pub fn stats(&self, worker: &str) -> Option<Stats> {
        Some(self.handle(worker)?.stats())
    }

    /// News of workers connecting and disconnecting, from now on, in the
    /// order it happened (each event is sent while the registry is
    /// locked): the last event a subscriber got for a worker says whether
    /// it is connected.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Presence> {
        self.inner.registry.subscribe()
    }

    /// The token table now.
    pub fn tokens(&self) -> Arc<TokenTable> {
        self.inner.tokens()
    }

    /// Replaces the token table at once, for new handshakes and callers'
    /// requests (a worker no longer in it is unknown: 404, unless the
    /// authorisation hook let it in). Every connected worker whose token
    /// was revoked (in the old table, and no longer in the new one, or
    /// changed) is closed with 1008 ("token revoked") at once: revoking is
    /// a security action, so the requests in flight on that connection fail
    /// (502, or a response cut short), as the worker is cut off. Every other
    /// connection is untouched, the workers the authorisation hook let in
    /// too (no table decided them: revoke one by closing it,
    /// [`Gateway::handle`], and having the hook refuse it from then on).
    /// Returns the workers closed.
    pub fn replace_tokens(&self, tokens: TokenTable) -> Vec<WorkerId> {
        let new = Arc::new(tokens);
        let old = std::mem::replace(
            &mut *self.inner.tokens.write().unwrap_or_else(|e| e.into_inner()),
            new.clone(),
        );
        let mut revoked = Vec::new();
        for (worker, handle) in self.inner.registry.by_table() {
            let w = worker.as_str();
            if old.contains(w) && !old.same_token(&new, w) {
                tracing::info!("worker {worker}: its token was revoked; closing its connection");
                handle.close(CloseCode::POLICY_VIOLATION, REVOKED);
                revoked.push(worker);
            }
        }
        // What is kept about the workers the table dropped goes in time.
        for worker in old.workers().filter(|w| !new.contains(w.as_str())) {
            self.inner.forgetting.left(worker);
        }
        self.inner.sweep();
        revoked
    }
}

impl Gateway {
    /// Drains the gateway for a shutdown or restart: from now on a new
    /// worker handshake or caller request is answered 503 with
    /// `Retry-After: 1`; each worker connection is closed with `code`
    /// ([`CloseCode::SERVICE_RESTART`] or [`CloseCode::GOING_AWAY`]: its
    /// worker reconnects at once, per the spec) as soon as it has no stream
    /// in flight, or when `grace` has passed. Resolves when every worker
    /// connection has ended: at most `grace` plus the connections' close
    /// deadline. The protocol has no "go away" frame, so stop sending
    /// callers first ([`server::serve_with_shutdown`](crate::server::serve_with_shutdown)
    /// does), then drain.
    pub async fn drain(&self, grace: Duration, code: CloseCode) {
        use std::sync::atomic::Ordering;
        self.inner.draining.store(true, Ordering::SeqCst);
        // Requests waiting for a worker's reconnect: 503 now.
        self.inner.registry.release_waiters();
        let start = tokio::time::Instant::now();
        let deadline = upload::after(start, grace);
        let give_up = upload::after(
            deadline,
            self.inner.relay.close_timeout() + Duration::from_secs(1),
        );
        loop {
            let now = tokio::time::Instant::now();
            for worker in self.inner.registry.workers() {
                let Some(handle) = self.inner.registry.handle(worker.as_str()) else {
                    continue;
                };
                // Closing drops what is in the overflow store: wait for
                // slow callers to have taken their responses out of it.
                let stats = handle.stats();
                if (stats.streams_open == 0 && stats.overflow_bytes == 0) || now >= deadline {
                    tracing::info!("worker {worker}: closing its connection ({})", code.0);
                    handle.close(code, "the relay is shutting down");
                }
            }
            // Each connection's task holds a clone of `alive`.
            if Arc::strong_count(&self.inner.alive) == 1 || now >= give_up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether [`Gateway::drain`] has begun.
    pub fn is_draining(&self) -> bool {
        self.inner
            .draining
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The most of a caller's body discarded, by default (see
/// [`GatewayBuilder::lingering_bytes`]).
pub const LINGERING_BYTES: u64 = 1 << 30;

/// How long a request for a known worker that is not connected waits for
/// it, by default (see [`GatewayBuilder::reconnect_wait`]).
pub const RECONNECT_WAIT: Duration = Duration::from_secs(10);

/// The close reason of a connection whose token was revoked.
pub const REVOKED: &str = "token revoked";

impl Inner {
    /// The deadlines of a caller's upload, and of discarding what is left
    /// of it.
    fn deadlines(&self) -> upload::Deadlines {
        upload::Deadlines {
            upload: self.upload_timeout,
            send: self.send_timeout,
            linger: self.lingering_time,
            linger_bytes: self.lingering_bytes,
        }
    }

    /// Whether `worker` is one callers may ask for: in the token table, or
    /// let in by the authorisation hook before.
    fn knows(&self, worker: &str) -> bool {
        if self.tokens().contains(worker) {
            return true;
        }
        if self.authorize.is_none() {
            return false;
        }
        self.sweep();
        self.forgetting.admitted(worker)
    }

    /// Forgets the workers gone for the forget time (see
    /// [`GatewayBuilder::forget_after`]).
    fn sweep(&self) {
        for worker in self.forgetting.due(|w| self.registry.handle(w).is_some()) {
            tracing::debug!("worker {worker}: gone for a while; forgotten");
            self.registry.forget(&worker);
            #[cfg(feature = "metrics")]
            self.meters.forget(worker.as_str());
        }
    }

    fn tokens(&self) -> Arc<TokenTable> {
        self.tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("tokens", &self.inner.tokens())
            .field("connected", &self.connected())
            .finish()
    }
}

/// A short `text/plain` answer.
fn answer(status: StatusCode, text: &str) -> Response<GatewayBody> {
    let mut resp = Response::new(GatewayBody::full(format!("{text}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
