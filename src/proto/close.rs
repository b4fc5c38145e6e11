//! Why a connection closed, as a state machine saw it.

use crate::frame::{CloseCode, CloseFrame};

/// Why a connection closed: [`RelayConnection::close_cause`](super::RelayConnection::close_cause)
/// and [`WorkerConnection::close_cause`](super::WorkerConnection::close_cause).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseCause {
    /// The application closed it with this code (`close`).
    Local(CloseCode),
    /// The peer sent a close message (its code and reason, if it gave them).
    Peer(Option<CloseFrame>),
    /// The socket was lost (`handle_lost`: end of stream or an error).
    Lost,
    /// No pong came within the keepalive timeout of a ping, and the socket
    /// took nothing from us in that time either: the peer is presumed frozen
    /// or gone. Closed with 1011; a driver drops the transport at once rather
    /// than wait to flush to a peer that does not read.
    KeepaliveTimeout,
    /// The peer sent a message over 1 MiB + 4 bytes: closed with 1009.
    MessageTooBig,
}

impl CloseCause {
    /// Whether the transport should be dropped without waiting to flush.
    pub fn is_abrupt(&self) -> bool {
        matches!(self, CloseCause::KeepaliveTimeout)
    }
}

impl std::fmt::Display for CloseCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseCause::Local(c) => write!(f, "closed by this side (code {})", c.0),
            CloseCause::Peer(Some(fr)) if fr.reason.is_empty() => {
                write!(f, "closed by the peer (code {})", fr.code.0)
            }
            CloseCause::Peer(Some(fr)) => {
                write!(f, "closed by the peer (code {}: {})", fr.code.0, fr.reason)
            }
            CloseCause::Peer(None) => write!(f, "closed by the peer (no code)"),
            CloseCause::Lost => write!(f, "the connection was lost"),
            CloseCause::KeepaliveTimeout => {
                write!(
                    f,
                    "keepalive timeout: no pong and no progress from the peer"
                )
            }
            CloseCause::MessageTooBig => write!(f, "the peer sent a message over 1 MiB + 4 bytes"),
        }
    }
}
