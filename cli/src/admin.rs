//! The programs' admin endpoint (`--admin HOST:PORT`), never on the public
//! listener: `GET /metrics` in the Prometheus text format (the library
//! records through the `metrics` facade; this installs the exporter), and
//! whatever other pages the program adds (the relay's `GET /workers`).
#![allow(dead_code)] // shared by several examples, each using a part

use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::time::Duration;

/// The histograms' buckets, in seconds: from a millisecond to ten minutes
/// (a cell may run that long).
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 600.0,
];

/// Installs the Prometheus recorder for the whole process (call once,
/// before any metric is recorded) and keeps its histograms drained.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Serves `/metrics` and `extra`'s routes on `addr` until the process
/// ends; logs `admin listening on <addr>`.
pub async fn serve(addr: &str, handle: PrometheusHandle, extra: Router) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!("admin listening on {}", listener.local_addr()?);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = handle.render();
                async move {
                    (
                        [(
                            http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        text,
                    )
                }
            }),
        )
        .merge(extra);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!("the admin endpoint stopped: {e}");
        }
    });
    Ok(())
}
