//! Sending to the peer under test, both modes: every send is bounded by
//! `STEP`, so a peer that stops reading fails the case instead of hanging it.

use futures_util::{Sink, SinkExt};
use std::time::Duration;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message as WsMsg};
use worker_relay::frame::{self, ControlFrame, StreamId};

/// How long one send may wait for the peer to take it.
pub const STEP: Duration = Duration::from_secs(10);

/// The largest message the kit takes from a peer: 16 times the protocol's
/// limit, so a message over 1 MiB + 4 bytes is received and reported by
/// name (the kit observes leniently and judges strictly) instead of ending
/// the connection.
pub const OBSERVE_LIMIT: usize = 16 * frame::MAX_MESSAGE_LEN;

/// The kit's WebSocket settings (see [`OBSERVE_LIMIT`]).
pub fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(OBSERVE_LIMIT))
        .max_frame_size(Some(OBSERVE_LIMIT))
}

/// The kit's side of a WebSocket to the peer under test.
pub trait WsSend {
    type Socket: Sink<WsMsg, Error = tungstenite::Error> + Unpin;
    /// The peer, as a failure names it ("the relay", "the worker").
    const PEER: &'static str;

    fn socket(&mut self) -> &mut Self::Socket;

    async fn send(&mut self, m: WsMsg) -> Result<(), String> {
        match tokio::time::timeout(STEP, self.socket().send(m)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("send failed: {e}")),
            Err(_) => Err(format!("send timed out ({} stopped reading)", Self::PEER)),
        }
    }

    /// Sends `msgs` in order; the first failure ends it.
    async fn send_all(&mut self, msgs: Vec<WsMsg>) -> Result<(), String> {
        for m in msgs {
            self.send(m).await?;
        }
        Ok(())
    }

    async fn send_text(&mut self, t: impl Into<String>) -> Result<(), String> {
        self.send(WsMsg::Text(t.into().into())).await
    }

    async fn send_control(&mut self, f: &ControlFrame) -> Result<(), String> {
        self.send_text(f.encode()).await
    }

    async fn send_chunk(&mut self, id: StreamId, body: &[u8]) -> Result<(), String> {
        self.send(WsMsg::Binary(frame::encode_chunk(id, body)))
            .await
    }
}
