//! Relay mode: the kit's worker reads what the relay sends LENIENTLY. The
//! crate's frame layer refuses a malformed message outright, which would
//! hide the relay's mistake from a case that skips what it cannot decode;
//! here every message is looked at, whatever it holds, and what the spec
//! makes wrong is written down as a violation line (taken by
//! `RelayCtx::take_violations`, which fails the case it happened in):
//! text that is not a JSON object, a missing or malformed `type`, a bad id
//! (0, above 2³²−1, not an integer), a binary message shorter than its
//! 4-byte id or longer than 1 MiB + 4 bytes, a frame on an id the relay
//! never opened on this connection, a chunk or `end` after the request's
//! `end` or `abort`, a `request` reusing an id whose request is still open.

use crate::relay_ctx::Got;
use bytes::Bytes;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use worker_relay::frame::{
    self, Chunk, ControlFrame, Decoded, StreamId, CHUNK_HEADER_LEN, MAX_CHUNK_BODY,
};

/// Where the violations of every connection a context dials are written.
pub type Sink = Arc<Mutex<Vec<String>>>;

/// What one worker connection saw of the relay's streams.
#[derive(Default)]
pub struct Observer {
    pub sink: Sink,
    /// Ids the relay sent a `request` for on this connection.
    opened: HashSet<u32>,
    /// Ids whose request body is still open (no `end` or `abort` yet).
    body_open: HashSet<u32>,
}

/// The first characters of `s`, for a message.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(60).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

impl Observer {
    fn violation(&self, v: String) {
        if let Ok(mut s) = self.sink.lock() {
            // Bounded: a relay spewing garbage does not fill the kit's memory.
            if s.len() < 50 {
                s.push(v);
            }
        }
    }

    /// A text message from the relay.
    pub fn text(&mut self, t: &str) -> Got {
        let v: serde_json::Value = match serde_json::from_str(t) {
            Ok(v) => v,
            Err(_) => {
                self.violation(format!(
                    "the relay sent a text message that is not JSON: {:?}",
                    clip(t)
                ));
                return Got::Malformed("not JSON".into());
            }
        };
        let Some(obj) = v.as_object() else {
            self.violation(format!(
                "the relay sent JSON that is not an object: {}",
                clip(t)
            ));
            return Got::Malformed("not an object".into());
        };
        let ty = match obj.get("type") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                self.violation(format!(
                    "the relay sent a frame whose type is not a string: {}",
                    clip(&other.to_string())
                ));
                return Got::Malformed("type not a string".into());
            }
            None => {
                self.violation(format!(
                    "the relay sent a frame without a type: {}",
                    clip(t)
                ));
                return Got::Malformed("no type".into());
            }
        };
        let known = matches!(ty.as_str(), "request" | "end" | "abort" | "response");
        if !known {
            // Both sides ignore unknown types: not wrong to send.
            return Got::Frame(Decoded::Unknown);
        }
        let id = match obj.get("id") {
            Some(serde_json::Value::Number(n)) => match n.as_u64() {
                Some(0) => {
                    self.violation(format!("the relay sent a {ty} on id 0"));
                    return Got::Malformed("id 0".into());
                }
                Some(i) if i <= u64::from(u32::MAX) => i as u32,
                _ => {
                    self.violation(format!(
                        "the relay sent a {ty} with id {n} (not an integer from 1 to 2^32-1)"
                    ));
                    return Got::Malformed("bad id".into());
                }
            },
            Some(other) => {
                self.violation(format!(
                    "the relay sent a {ty} whose id is not a number: {}",
                    clip(&other.to_string())
                ));
                return Got::Malformed("id not a number".into());
            }
            None => {
                self.violation(format!("the relay sent a {ty} without an id"));
                return Got::Malformed("no id".into());
            }
        };
        let d = match frame::decode_text(t) {
            Ok(d) => d,
            Err(e) => {
                self.violation(format!("the relay sent a malformed {ty} on id {id}: {e}"));
                return Got::Malformed(e.to_string());
            }
        };
        match &d {
            Decoded::Control(ControlFrame::Request { .. }) => {
                if self.body_open.contains(&id) {
                    self.violation(format!(
                        "the relay sent a request on id {id} while that id's request was still open"
                    ));
                }
                self.opened.insert(id);
                self.body_open.insert(id);
            }
            Decoded::Control(ControlFrame::End { .. }) => {
                if !self.opened.contains(&id) {
                    self.violation(format!(
                        "the relay sent end on id {id}, which it never opened"
                    ));
                } else if !self.body_open.remove(&id) {
                    self.violation(format!(
                        "the relay sent end on id {id} after that request's end or abort"
                    ));
                }
            }
            Decoded::Control(ControlFrame::Abort { .. }) => {
                // After its own end an abort is how a relay gives up on the
                // response: allowed. On an id never opened it is not.
                if !self.opened.contains(&id) {
                    self.violation(format!(
                        "the relay sent abort on id {id}, which it never opened"
                    ));
                }
                self.body_open.remove(&id);
            }
            _ => {}
        }
        Got::Frame(d)
    }

    /// A binary message from the relay: a chunk, however wrong (an
    /// oversized one is returned whole, named as a violation).
    pub fn binary(&mut self, b: Bytes) -> Got {
        if b.len() < CHUNK_HEADER_LEN {
            self.violation(format!(
                "the relay sent a binary message of {} bytes (shorter than the 4-byte id)",
                b.len()
            ));
            return Got::Malformed("short binary".into());
        }
        let raw = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let Some(id) = StreamId::new(raw) else {
            self.violation("the relay sent a chunk on id 0".to_string());
            return Got::Malformed("chunk on id 0".into());
        };
        let data = b.slice(CHUNK_HEADER_LEN..);
        if data.len() > MAX_CHUNK_BODY {
            self.violation(format!(
                "the relay sent a chunk of {} bytes on id {raw} (over 1 MiB; a message of {} bytes, over 1 MiB + 4)",
                data.len(),
                b.len()
            ));
        }
        if !self.opened.contains(&raw) {
            self.violation(format!(
                "the relay sent a chunk on id {raw}, which it never opened"
            ));
        } else if !self.body_open.contains(&raw) {
            self.violation(format!(
                "the relay sent a chunk on id {raw} after that request's end or abort"
            ));
        }
        Got::Frame(Decoded::Chunk(Chunk { id, data }))
    }

    /// Takes what was written down.
    pub fn take(sink: &Sink) -> Vec<String> {
        sink.lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }
}
