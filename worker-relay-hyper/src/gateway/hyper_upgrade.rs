//! A worker's upgrade request through hyper's upgrades (feature
//! `gateway`): the WebSocket's headers checked, the handshake decided as
//! for any host ([`admission`]), the 101, and the connection on a task of
//! its own once hyper hands the upgraded connection over.

use super::accept::{admission, outcome, switching, websocket_key_of, Refusal};
use super::{answer, GatewayBody, Inner};
use crate::ws::read_ahead::ReadAhead;
use crate::ws::WsSocket;
use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;

/// Answers a worker's upgrade request and, on 101, spawns the connection's
/// task. Needs a hyper server with upgrades enabled (hyper's
/// `serve_connection(..).with_upgrades()`, axum's `serve`, this crate's
/// [`server::serve`](crate::server::serve)).
///
/// At `<connect path>/<id>` the token must be `<id>`'s
/// ([`decide_upgrade_for`](worker_relay::connect::decide_upgrade_for)); at the
/// connect path itself, or any path that is not under it (a `Connect`
/// service routed elsewhere), the token alone names the worker.
pub(super) async fn accept<B>(inner: &Arc<Inner>, req: Request<B>) -> Response<GatewayBody> {
    let resp = decide_and_upgrade(inner, req).await;
    crate::observe::relay::handshake(outcome(resp.status()));
    resp
}

async fn decide_and_upgrade<B>(inner: &Arc<Inner>, mut req: Request<B>) -> Response<GatewayBody> {
    let peer = req.extensions().get::<crate::PeerAddr>().map(|p| p.0);
    let key = match websocket_key(&req, peer) {
        Ok(key) => key,
        Err(refusal) => return *refusal,
    };
    let admission = match admission(inner, req.uri().path(), req.headers(), peer).await {
        Ok(admission) => admission,
        Err(refusal) => return *refusal,
    };
    if req
        .extensions()
        .get::<hyper::upgrade::OnUpgrade>()
        .is_none()
    {
        tracing::error!(
            "cannot upgrade: the server does not support upgrades (hyper: with_upgrades())"
        );
        return answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "upgrades are not enabled",
        );
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::info!("worker {}: upgrade failed: {e}", admission.worker);
                return;
            }
        };
        // Read in 4 KiB passes while the worker is quiet, larger ones while it
        // sends (a response body), without holding a large buffer per idle
        // worker.
        let socket = WsSocket::server(ReadAhead::new(TokioIo::new(upgraded))).await;
        let _ = admission.serve(socket).await;
    });
    switching(&key, GatewayBody::empty())
}

/// The `Sec-WebSocket-Key` of a WebSocket upgrade request (version 13), or
/// the answer refusing the request: 400 if it is not an upgrade, 426 for
/// another WebSocket version.
fn websocket_key<B>(req: &Request<B>, peer: Option<SocketAddr>) -> Result<HeaderValue, Refusal> {
    websocket_key_of(req.method() == http::Method::GET, req.headers(), peer)
}
