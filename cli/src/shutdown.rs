//! The programs' shutdown signal.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// `SIGTERM` or `SIGINT` (Ctrl-C), whichever comes first.
///
/// The handlers are installed by [`Terminate::install`], before the
/// program says it is listening: a signal that came between that line and
/// the first `await` of [`Terminate::recv`] would otherwise find the
/// default action and kill the process without its drain.
pub struct Terminate {
    term: Option<Signal>,
    int: Option<Signal>,
}

impl Terminate {
    /// Installs both handlers now.
    pub fn install() -> Self {
        Terminate {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }

    /// Waits for either signal; says which.
    pub async fn recv(&mut self) -> &'static str {
        async fn next(s: &mut Option<Signal>) {
            match s.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.term) => "SIGTERM",
            () = next(&mut self.int) => "interrupted",
        }
    }
}
