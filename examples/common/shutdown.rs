//! The examples' shutdown signal.

/// `SIGTERM` or `SIGINT` (Ctrl-C), whichever comes first; says which.
pub async fn terminated() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let sigterm = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = sigterm => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "interrupted",
    }
}
