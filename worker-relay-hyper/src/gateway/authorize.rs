//! An asynchronous authorisation hook, for gateways whose workers live in a
//! database rather than in a [`TokenTable`](worker_relay::connect::TokenTable).

use http::StatusCode;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use worker_relay::connect::WorkerId;

/// What a worker presented in its handshake, for an authorisation hook
/// ([`GatewayBuilder::authorize`](super::GatewayBuilder::authorize)). Its
/// `Debug` never shows the token.
#[derive(Clone)]
#[non_exhaustive]
pub struct Presented {
    /// The bearer token, at most
    /// [`MAX_PRESENTED_TOKEN`](worker_relay::connect::MAX_PRESENTED_TOKEN) bytes,
    /// without whitespace. A secret: never log it.
    pub token: String,
    /// The worker its URL names (`/connect/<id>`), if any: the hook's
    /// answer must be this worker, or the handshake is refused 401.
    pub target: Option<WorkerId>,
    /// The peer's address, when the server knows it
    /// ([`PeerAddr`](crate::PeerAddr)).
    pub peer: Option<SocketAddr>,
}

impl std::fmt::Debug for Presented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presented")
            .field("token", &"<redacted>")
            .field("target", &self.target)
            .field("peer", &self.peer)
            .finish()
    }
}

/// The future an authorisation hook returns: the worker the token is, or
/// the status to refuse the handshake with (401 for an unknown token; a
/// 4xx other than 408 and 429 makes the worker give up for good, a 5xx,
/// 408 or 429 makes it retry with its backoff).
pub type AuthorizeFuture = Pin<Box<dyn Future<Output = Result<WorkerId, StatusCode>> + Send>>;

type Hook = dyn Fn(Presented) -> AuthorizeFuture + Send + Sync;

/// The hook and its time limit. The workers it let in are the gateway's
/// to remember (and forget: `forget.rs`).
pub(super) struct Authorizer {
    hook: Arc<Hook>,
    pub timeout: Duration,
}

impl Authorizer {
    pub fn new<F, Fut>(hook: F, timeout: Duration) -> Authorizer
    where
        F: Fn(Presented) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<WorkerId, StatusCode>> + Send + 'static,
    {
        Authorizer {
            hook: Arc::new(move |p| Box::pin(hook(p)) as AuthorizeFuture),
            timeout,
        }
    }

    /// The hook's decision within its time limit (503 past it), checked
    /// against the worker the URL names.
    pub async fn decide(&self, presented: Presented) -> Result<WorkerId, StatusCode> {
        let target = presented.target.clone();
        let decided = tokio::time::timeout(self.timeout, (self.hook)(presented)).await;
        let worker = match decided {
            Err(_) => {
                tracing::warn!(
                    "the authorisation hook did not answer within {} ms (503)",
                    self.timeout.as_millis()
                );
                return Err(StatusCode::SERVICE_UNAVAILABLE);
            }
            Ok(Err(status)) => return Err(refusal_status(status)),
            Ok(Ok(worker)) => worker,
        };
        if target.is_some_and(|t| t != worker) {
            return Err(StatusCode::UNAUTHORIZED);
        }
        Ok(worker)
    }
}

/// A hook's refusal as an answer: an error status as it is; anything else
/// (a success, a redirect, an interim status) is not a refusal, and
/// becomes 500.
fn refusal_status(status: StatusCode) -> StatusCode {
    if status.is_client_error() || status.is_server_error() {
        status
    } else {
        tracing::error!("the authorisation hook refused with {status}, not an error status (500)");
        StatusCode::INTERNAL_SERVER_ERROR
    }
}
