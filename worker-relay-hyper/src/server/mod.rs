//! A hardened accept loop for a relay (feature `server`): what `hyper`
//! leaves to its caller, with the defaults nginx has.
//!
//! - **HTTP/1.1 and HTTP/2** on one port: an HTTP/2 client is told apart
//!   by its connection preface (with prior knowledge on plain TCP, or after
//!   ALPN `h2` over TLS), which must come within the header-read timeout.
//! - **TLS** (feature `rustls`, `ServerConfig::tls`): a certificate from
//!   PEM files, replaced on `ServerTls::reload` for new handshakes while
//!   open connections go on; the handshake must end within the header-read
//!   timeout. Workers' WebSocket upgrades work over it (HTTP/1.1).
//! - **The peer's address** reaches the service as a [`PeerAddr`](crate::PeerAddr) request
//!   extension (for logs, `X-Forwarded-For`).
//! - **Accept errors do not end it.** Out of file descriptors (`EMFILE`),
//!   memory or buffers, it logs, waits (100 ms, doubling to 1 s while the
//!   errors last) and goes on; a connection reset before it was taken is
//!   skipped at once.
//! - **A connection cap** ([`ServerConfig::max_connections`]): at the cap it
//!   stops accepting (the kernel's backlog holds the rest) until a
//!   connection ends.
//! - **A header-read timeout** (10 s): a client that sends no complete
//!   request head in time, including an idle keep-alive connection, is
//!   closed (a slowloris holds nothing for long). An HTTP/2 connection is
//!   pinged every 20 s and closed when a ping goes unanswered for 20 s,
//!   and closed (GOAWAY) when it has had no stream open for 75 s
//!   ([`ServerConfig::h2_idle_timeout`]): a client that keeps it idle does
//!   not hold a connection slot for ever.
//! - **A send timeout** (60 s): a connection whose writes make no progress
//!   for that long is closed, as nginx's `send_timeout` (a caller or worker
//!   that stopped reading holds nothing for long).
//! - **Upgrades** are enabled, so a [`Gateway`](crate::gateway::Gateway)'s
//!   workers can connect.
//! - **A graceful stop drops no request**
//!   ([`serve_with_shutdown`]): it stops accepting only once every
//!   connection it accepted has brought its first request, serves one
//!   request on each connection still queued, and says when all of those
//!   are in ([`Intake`]), the moment for a gateway's drain.
//! - A failing connection only ends itself; logging goes through `tracing`
//!   and never panics. No configuration panics either (timeouts saturate
//!   at [`MAX_TIMEOUT`], the cap at [`MAX_CONNECTIONS`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use worker_relay::connect::TokenTable;
//! use worker_relay_hyper::gateway::Gateway;
//! use worker_relay_hyper::server::{serve, ServerConfig};
//!
//! let gateway = Gateway::new(TokenTable::parse("abc ct-abc-1f3a9c27d85e40b6")?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! // Runs until the process ends: `serve` never returns.
//! match serve(listener, gateway.service(), ServerConfig::default()).await {}
//! # }
//! ```

mod arrivals;
mod config;
mod conn_timer;
mod h2_idle;
mod peer;
mod sniff;
mod timed_io;
#[cfg(feature = "rustls")]
mod tls;

pub use config::{Intake, ServerConfig, H2_KEEPALIVE, MAX_CONNECTIONS, MAX_TIMEOUT};
#[cfg(feature = "rustls")]
pub use tls::{CertError, ServerTls};

use crate::BoxError;
use arrivals::{Arrivals, Counted, Pending};
use config::saturate;
use conn_timer::ConnectionTimer;
use h2_idle::{Streams, Tracked};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use peer::WithPeer;
use sniff::{sniff, Protocol};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use timed_io::TimedIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Serves `service` on every connection `listener` accepts, forever (drop
/// or abort the future to stop accepting; connections already open run on
/// their own tasks). Needs a tokio runtime. [`serve_with_shutdown`] stops
/// gracefully.
pub async fn serve<S, B>(listener: TcpListener, service: S, config: ServerConfig) -> Infallible
where
    S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    serve_with_shutdown(listener, service, config, std::future::pending()).await;
    unreachable!("a pending shutdown never comes")
}

/// [`serve`] until `shutdown` resolves, then a graceful stop, as hyper's
/// and axum's, that drops no request:
///
/// 1. It goes on accepting until every connection it has accepted has
///    brought its first request to `service` (at most
///    [`ServerConfig::arrival_wait`], 2 s: a client that connects and sends
///    nothing does not hold the stop up), then closes the listener. A
///    connection accepted just before the stop, its request on the way,
///    is served; behind a proxy that opens a connection per request, no
///    request fails for a restart.
/// 2. The connections the kernel has queued for the listener by then are
///    taken and serve one request each (closed after it).
/// 3. Each open HTTP connection finishes the request it is serving and
///    then closes (HTTP/1.1: `Connection: close` on its response, or
///    closed at once if idle; HTTP/2: GOAWAY, the streams in flight go
///    on); one still in its TLS handshake or before its first request is
///    dropped.
/// 4. Once the requests of the connections taken in step 2 are in the
///    service too (at most the arrival wait again), the
///    [`ServerConfig::intake`] signal is given: start
///    [`Gateway::drain`](crate::gateway::Gateway::drain) then, not before
///    (it answers later requests 503).
///
/// Resolves when every HTTP connection is closed. Workers' upgraded
/// connections are not HTTP connections any more: the gateway drains them.
pub async fn serve_with_shutdown<S, B, F>(
    listener: TcpListener,
    service: S,
    config: ServerConfig,
    shutdown: F,
) where
    S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    F: std::future::Future<Output = ()>,
{
    let max = config.cap();
    let slots = Arc::new(Semaphore::new(max));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let arrivals = Arrivals::default();
    let mut stopping = Stopping {
        shutdown: std::pin::pin!(shutdown),
        deadline: None,
        wait: saturate(config.arrival_wait),
    };
    let mut backoff = Duration::ZERO;
    loop {
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                tracing::warn!(
                    max,
                    "at the connection cap: not accepting until a connection ends"
                );
                // The semaphore is never closed: this waits for a slot.
                tokio::select! {
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => continue,
                    },
                    () = stopping.settled(&arrivals) => break,
                }
            }
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stopping.settled(&arrivals) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                backoff = Duration::ZERO;
                accepted
            }
            Err(e) if is_connection_error(&e) => {
                tracing::debug!("accept failed: {e}");
                continue;
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(1));
                tracing::warn!("accept failed: {e}; waiting {backoff:?}");
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        let connection = arrivals.connection();
        spawn_connection(
            stream,
            peer,
            &service,
            &config,
            stop.clone(),
            (permit, connection),
            false,
        );
    }
    // Connections the kernel completed for this listener but nobody has
    // taken yet would be reset when it closes: take them, and serve each
    // one request (it need not wait: the shutdown is for what comes later).
    // Asked of the kernel directly, not through the runtime's cached
    // readiness: a connection queued since the reactor last looked would
    // otherwise be missed, and reset when the listener closes.
    let mut queued = Vec::new();
    match listener.into_std() {
        Ok(std_listener) => {
            while let Ok((stream, peer)) = std_listener.accept() {
                queued.push((stream, peer));
            }
            drop(std_listener);
        }
        Err(e) => tracing::debug!("cannot take the queued connections: {e}"),
    }
    for (stream, peer) in queued {
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            break;
        };
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream));
        let Ok(stream) = stream else {
            continue;
        };
        let (_never, unstopped) = tokio::sync::watch::channel(false);
        let connection = arrivals.connection();
        spawn_connection(
            stream,
            peer,
            &service,
            &config,
            unstopped,
            (permit, connection),
            true,
        );
    }
    let _ = stop_tx.send(true);
    tracing::info!("stopped accepting; waiting for the open HTTP connections to finish");
    let intake = async {
        if tokio::time::timeout(stopping.wait, arrivals.settled())
            .await
            .is_err()
        {
            tracing::warn!("a queued connection sent no request in time; closing the intake");
        }
        if let Some(intake) = &config.intake {
            intake.close();
        }
    };
    // Every connection holds a slot until it is done.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    tokio::join!(intake, async {
        let _ = slots.acquire_many(all).await;
    });
}

/// The stop of [`serve_with_shutdown`]: the caller's signal, then a wait
/// for the connections accepted to bring their request.
struct Stopping<'a, F> {
    shutdown: Pin<&'a mut F>,
    /// Set when `shutdown` has resolved: the end of the wait.
    deadline: Option<tokio::time::Instant>,
    wait: Duration,
}

impl<F: std::future::Future<Output = ()>> Stopping<'_, F> {
    /// Resolves once the signal has come and no connection accepted is
    /// still to bring its first request, or the wait is over. Cancel-safe
    /// (the accept loop polls it anew each time round).
    async fn settled(&mut self, arrivals: &Arrivals) {
        let deadline = match self.deadline {
            Some(d) => d,
            None => {
                self.shutdown.as_mut().await;
                let d = tokio::time::Instant::now() + self.wait;
                self.deadline = Some(d);
                tracing::info!(
                    "stopping: accepting until every connection accepted has sent its request"
                );
                d
            }
        };
        if tokio::time::timeout_at(deadline, arrivals.settled())
            .await
            .is_err()
        {
            tracing::warn!("a connection sent no request in time; stopping anyway");
        }
    }
}

/// Serves an accepted connection on a task of its own, holding `permit`,
/// counted in the arrivals until its first request; `one_request`: taken
/// during the shutdown (HTTP/1.1 without keep-alive, HTTP/2 with a GOAWAY
/// at once).
fn spawn_connection<S, B>(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    service: &S,
    config: &ServerConfig,
    stop: tokio::sync::watch::Receiver<bool>,
    (permit, connection): (tokio::sync::OwnedSemaphorePermit, Arc<Pending>),
    one_request: bool,
) where
    S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let _ = stream.set_nodelay(true);
    let mut service = service.clone();
    let told = peer::tell(&mut service, peer);
    let service = Counted::new(service, connection);
    let config = config.clone();
    tokio::spawn(async move {
        // What waits to be sent stays with the application's scheduler (the
        // relay's `SendPacer`, hyper's body), not in a send buffer of
        // megabytes that a worker's cancel would queue behind.
        let io = TimedIo::new(
            crate::send_lowat::PacedTcp::new(stream),
            saturate(config.send_timeout),
        );
        #[cfg(feature = "rustls")]
        if let Some(tls) = &config.tls {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.rustls_config());
            let handshake = saturate(config.header_read_timeout);
            match tokio::time::timeout(handshake, acceptor.accept(io)).await {
                Ok(Ok(io)) => {
                    serve_connection(io, (peer, told), service, &config, stop, one_request).await
                }
                Ok(Err(e)) => tracing::debug!("TLS handshake with {peer} failed: {e}"),
                Err(_) => tracing::debug!("TLS handshake with {peer} timed out"),
            }
            drop(permit);
            return;
        }
        serve_connection(io, (peer, told), service, &config, stop, one_request).await;
        drop(permit);
    });
}

/// Serves one connection, HTTP/1.1 (with upgrades) or HTTP/2 as its
/// first bytes say, which must come within the header-read timeout.
async fn serve_connection<I, S, B>(
    io: I,
    (peer, told): (SocketAddr, bool),
    service: S,
    config: &ServerConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
    one_request: bool,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let header_read_timeout = saturate(config.header_read_timeout);
    let sniffing = tokio::time::timeout(header_read_timeout, sniff(io));
    let sniffed = tokio::select! {
        s = sniffing => s,
        () = stopped(&mut stop) => return,
    };
    let (protocol, io) = match sniffed {
        Ok(Ok(Some(sniffed))) => sniffed,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => return tracing::debug!("reading from {peer} failed: {e}"),
        Err(_) => return tracing::debug!("{peer} sent no request in time"),
    };
    let io = TokioIo::new(io);
    let service = WithPeer::new(service, peer, told);
    let served = match protocol {
        Protocol::Http1 => {
            let service = TowerToHyperService::new(service);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(ConnectionTimer::default())
                .header_read_timeout(header_read_timeout)
                .keep_alive(!one_request)
                .serve_connection(io, service)
                .with_upgrades();
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => r,
                () = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            }
        }
        Protocol::Http2 => {
            let streams = Streams::default();
            let service = TowerToHyperService::new(Tracked::new(service, streams.clone()));
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(H2_KEEPALIVE))
                .keep_alive_timeout(H2_KEEPALIVE)
                .max_header_list_size(64 << 10)
                .serve_connection(io, service);
            let mut conn = std::pin::pin!(conn);
            if one_request {
                // Taken during the shutdown: GOAWAY at once (hyper's waits a
                // ping's round trip before it names the last stream, so the
                // requests already sent are served), not when a stop that
                // never comes for it would say.
                conn.as_mut().graceful_shutdown();
                conn.await
            } else {
                let idle = saturate(config.h2_idle_timeout);
                tokio::select! {
                    r = conn.as_mut() => r,
                    () = stopped(&mut stop) => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                    () = streams.idle_for(idle) => {
                        tracing::debug!("closing the HTTP/2 connection with {peer}: idle for {idle:?}");
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                }
            }
        }
    };
    if let Err(e) = served {
        tracing::debug!("connection with {peer} ended with an error: {e}");
    }
}

/// Resolves when the server stops gracefully; never if it was dropped
/// instead (its connections then run on, as they always did).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Accept errors about one connection (it was reset or aborted before we
/// took it): skip it. Every other error (out of file descriptors, memory or
/// buffers) means waiting helps and retrying at once would spin.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}
