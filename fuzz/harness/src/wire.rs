//! [`WireCheck`]: the rules every message one machine emits must follow on
//! the wire, written once for the machine harnesses ([`relay_machine`],
//! [`worker_machine`]) and the crate's property test of whole conversations
//! (`tests/proto_props.rs`).
//!
//! [`relay_machine`]: crate::relay_machine
//! [`worker_machine`]: crate::worker_machine

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use worker_relay::frame::{
    self, ControlFrame, Decoded, Headers, Message, RequestHead, ResponseHead, StreamId,
    MAX_CHUNK_BODY, MAX_MESSAGE_LEN,
};

/// Which machine's output a [`WireCheck`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The relay: it sends `request` heads, chunks, `end` and `abort`.
    Relay,
    /// The worker: it sends `response` heads, chunks, `end` and `abort`.
    Worker,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Relay => "relay",
            Side::Worker => "worker",
        })
    }
}

/// What may follow a head on the wire: the model says, with
/// [`WireCheck::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// A body the application streams: chunks within the configured chunk
    /// size.
    Streamed,
    /// A machine's own short answer (the worker's 500, 400, 503): its body
    /// goes out as one chunk whatever the chunk size (at most
    /// [`MAX_CHUNK_BODY`] bytes).
    Answer,
    /// No body (a response to HEAD, a 204 or 304, or one the model knows is
    /// empty): any chunk is an error, and the head's Content-Length does not
    /// count.
    Empty,
}

/// One message a [`WireCheck`] let through, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen<T> {
    /// A `request` head (relay side) under an id not in flight, with a valid
    /// Content-Length. The model checks it, then puts it on the wire with
    /// [`WireCheck::open`].
    Request {
        /// The stream.
        id: StreamId,
        /// The head.
        head: RequestHead,
    },
    /// A `response` head (worker side) for an id with no response open, with
    /// a valid Content-Length. The model checks it (was it asked for?), then
    /// puts it on the wire with [`WireCheck::open`].
    Response {
        /// The stream.
        id: StreamId,
        /// The head.
        head: ResponseHead,
    },
    /// A chunk of a stream on the wire, before its `end`: not empty, within
    /// its size limit and its head's Content-Length. Whether the bytes are
    /// the right ones is the model's to check (see [`crate::Expected`]).
    Chunk {
        /// The stream.
        id: StreamId,
        /// The body bytes.
        data: Bytes,
        /// The stream's tag (see [`WireCheck::open`]).
        tag: T,
    },
    /// The `end` of a stream on the wire, its body complete by its head's
    /// Content-Length, if any. The relay's `end` ends the request: the id
    /// stays in flight until the model releases it
    /// ([`WireCheck::release`]) or the relay aborts it. The worker's `end`
    /// ends the stream: its id is free.
    End {
        /// The stream.
        id: StreamId,
        /// The stream's tag.
        tag: T,
    },
    /// An `abort`: nothing more may go out under its id until a new head.
    Abort {
        /// The stream.
        id: StreamId,
        /// The tag of the stream it ends; `None` if no head of that id was
        /// on the wire (the model decides whether that may be).
        tag: Option<T>,
    },
    /// A close with a code and a reason of at most 123 bytes: nothing may
    /// follow it.
    Close {
        /// The close code.
        code: u16,
        /// The reason's length in bytes.
        reason_len: usize,
    },
    /// A ping (refused unless [`WireCheck::pings`] allowed them).
    Ping(Bytes),
    /// A frame for an id the model exempted ([`WireCheck::exempt`]): only
    /// the rules of single messages were checked.
    Exempt(Decoded),
}

/// The state of one id on the wire.
#[derive(Debug, Clone)]
struct OnWire<T> {
    tag: T,
    kind: BodyKind,
    /// The head's Content-Length.
    length: Option<u64>,
    /// Body bytes sent.
    sent: u64,
    /// Its `end` went out (the relay's: the response may still come).
    ended: bool,
}

/// The wire rules of one machine's output, checked message by message.
///
/// Constructed for one [`Side`] and the configured chunk size, it reads every
/// message the machine emits ([`observe`](WireCheck::observe)) and panics
/// with a clear message as soon as one breaks a rule:
///
/// - at most [`MAX_MESSAGE_LEN`] bytes; nothing after the side's close; a
///   close carries a code and a reason of at most 123 bytes; no pong; pings
///   only where allowed;
/// - a valid frame this side may send (relay: `request`, chunk, `end`,
///   `abort`; worker: `response`, chunk, `end`, `abort`), a head with a valid
///   Content-Length;
/// - per id, the order: a head, then chunks, then `end`, with `abort` after
///   `end` or instead of it and nothing after `abort`; no second head while
///   the id is in flight; chunks and `end` only under a head on the wire;
/// - chunks not empty, within the chunk size ([`BodyKind`] says which), the
///   body not longer than its head's Content-Length and, at `end`, exactly
///   that long.
///
/// It returns what it decoded ([`Seen`]), so that the model only checks what
/// is its own: which stream a head belongs to, whether an `abort` was asked
/// for, whether the bytes are those the application queued. The model tags
/// each stream it puts on the wire with a `T` of its own (a key, a stream
/// index) that comes back with the stream's chunks, `end` and `abort`.
#[derive(Debug, Clone)]
pub struct WireCheck<T> {
    side: Side,
    chunk_limit: usize,
    pings: bool,
    closed: bool,
    on_wire: BTreeMap<StreamId, OnWire<T>>,
    /// The head just seen (its id and Content-Length), until it is opened.
    head: Option<(StreamId, Option<u64>)>,
    exempt: BTreeSet<StreamId>,
}

impl<T: Clone> WireCheck<T> {
    /// A checker of `side`'s output, chunks of [`BodyKind::Streamed`]
    /// bodies at most `chunk_limit` bytes (in `1..=MAX_CHUNK_BODY`); no ping
    /// allowed.
    pub fn new(side: Side, chunk_limit: usize) -> WireCheck<T> {
        assert!(
            (1..=MAX_CHUNK_BODY).contains(&chunk_limit),
            "model: a chunk limit of {chunk_limit}"
        );
        WireCheck {
            side,
            chunk_limit,
            pings: false,
            closed: false,
            on_wire: BTreeMap::new(),
            head: None,
            exempt: BTreeSet::new(),
        }
    }

    /// Whether the machine may send pings (its keepalive is on).
    pub fn pings(mut self, allowed: bool) -> WireCheck<T> {
        self.pings = allowed;
        self
    }

    /// Checks one message the machine emitted, and returns what it is.
    pub fn observe(&mut self, m: &Message) -> Seen<T> {
        let side = self.side;
        assert!(!self.closed, "{side} emitted {m:?} after its close");
        assert!(
            m.len() <= MAX_MESSAGE_LEN,
            "{side} emitted {} bytes",
            m.len()
        );
        self.head = None;
        let d = match m {
            Message::Close(Some(f)) => {
                let reason_len = f.reason.len();
                assert!(
                    reason_len <= 123,
                    "{side}: close reason of {reason_len} bytes"
                );
                self.closed = true;
                return Seen::Close {
                    code: f.code.0,
                    reason_len,
                };
            }
            Message::Close(None) => panic!("{side} closed without a code"),
            Message::Ping(p) => {
                assert!(self.pings, "{side} emitted a ping, which it may not");
                return Seen::Ping(p.clone());
            }
            Message::Pong(_) => panic!("{side} emitted a pong"),
            _ => frame::decode(m)
                .expect("a data message")
                .unwrap_or_else(|e| panic!("{side} emitted an invalid frame {m:?}: {e}")),
        };
        assert!(may_send(side, &d), "{side} emitted {d:?}");
        if let Some(id) = id_of(&d).filter(|id| self.exempt.contains(id)) {
            if let Decoded::Chunk(c) = &d {
                check_chunk(side, id, &c.data, MAX_CHUNK_BODY);
            }
            return Seen::Exempt(d);
        }
        match d {
            Decoded::Control(ControlFrame::Request { id, head }) => {
                self.on_head(id, head.headers());
                Seen::Request { id, head }
            }
            Decoded::Control(ControlFrame::Response { id, head }) => {
                self.on_head(id, head.headers());
                Seen::Response { id, head }
            }
            Decoded::Chunk(c) => self.on_chunk(c.id, c.data),
            Decoded::Control(ControlFrame::End { id }) => self.on_end(id),
            Decoded::Control(ControlFrame::Abort { id }) => Seen::Abort {
                id,
                tag: self.on_wire.remove(&id).map(|s| s.tag),
            },
            other => unreachable!("{side} may send {other:?}"),
        }
    }

    /// Puts the head just seen ([`Seen::Request`] or [`Seen::Response`] of
    /// the last [`observe`](WireCheck::observe)) on the wire under `id`,
    /// tagged `tag`, its body of `kind`. Panics if that was not the head of
    /// `id` (a mistake of the model).
    pub fn open(&mut self, id: StreamId, tag: T, kind: BodyKind) {
        let Some((_, length)) = self.head.take().filter(|h| h.0 == id) else {
            panic!("model: opened id {id} without its head just seen");
        };
        let s = OnWire {
            tag,
            kind,
            length,
            sent: 0,
            ended: false,
        };
        self.on_wire.insert(id, s);
    }

    /// The stream under `id` is over where the model sees it end (the
    /// peer's `end` or `abort` arrived, or the relay's `abort` at the worker,
    /// or the connection ended): nothing more may go out under `id` until a
    /// new head. Returns its tag, if `id` was on the wire.
    pub fn release(&mut self, id: StreamId) -> Option<T> {
        self.on_wire.remove(&id).map(|s| s.tag)
    }

    /// [`release`](WireCheck::release)s `id` if it is on the wire for the
    /// stream tagged `tag`; whether it was.
    pub fn release_for(&mut self, id: StreamId, tag: &T) -> bool
    where
        T: PartialEq,
    {
        let mine = self.tag(id) == Some(tag);
        if mine {
            self.on_wire.remove(&id);
        }
        mine
    }

    /// No promise of order holds for `id` any more (the peer reused it while
    /// in flight): its frames come back as [`Seen::Exempt`], checked only as
    /// single messages.
    pub fn exempt(&mut self, id: StreamId) {
        self.on_wire.remove(&id);
        self.exempt.insert(id);
    }

    /// The tag of the stream on the wire under `id`.
    pub fn tag(&self, id: StreamId) -> Option<&T> {
        self.on_wire.get(&id).map(|s| &s.tag)
    }

    /// Whether `id` is on the wire (its head went out, and it has not been
    /// aborted, ended by the worker, or released).
    pub fn in_flight(&self, id: StreamId) -> bool {
        self.on_wire.contains_key(&id)
    }

    /// The ids on the wire, with their tags, in order.
    pub fn iter(&self) -> impl Iterator<Item = (StreamId, &T)> + '_ {
        self.on_wire.iter().map(|(id, s)| (*id, &s.tag))
    }

    /// The ids on the wire, in order.
    pub fn ids(&self) -> Vec<StreamId> {
        self.on_wire.keys().copied().collect()
    }

    /// Whether no id is on the wire.
    pub fn is_empty(&self) -> bool {
        self.on_wire.is_empty()
    }

    /// Whether the machine's close went out.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    fn on_head(&mut self, id: StreamId, headers: &Headers) {
        let side = self.side;
        assert!(
            !self.in_flight(id),
            "{side} emitted a second head under id {id}, still in flight"
        );
        let length = headers.content_length().unwrap_or_else(|e| {
            panic!("{side} emitted a head for id {id} with an invalid Content-Length: {e}")
        });
        self.head = Some((id, length));
    }

    fn on_chunk(&mut self, id: StreamId, data: Bytes) -> Seen<T> {
        let (side, chunk_limit) = (self.side, self.chunk_limit);
        let s = self.on_wire.get_mut(&id).unwrap_or_else(|| {
            panic!("{side} chunk for id {id}, not on the wire (no head, or after its abort)")
        });
        assert!(!s.ended, "{side} chunk for id {id} after its end");
        let limit = match s.kind {
            BodyKind::Streamed => chunk_limit,
            BodyKind::Answer => MAX_CHUNK_BODY,
            BodyKind::Empty => panic!("{side} chunk for id {id}, which has no body"),
        };
        check_chunk(side, id, &data, limit);
        s.sent += data.len() as u64;
        if let Some(cl) = s.length {
            assert!(
                s.sent <= cl,
                "{side} body of id {id} longer than its Content-Length {cl}"
            );
        }
        let tag = s.tag.clone();
        Seen::Chunk { id, data, tag }
    }

    fn on_end(&mut self, id: StreamId) -> Seen<T> {
        let side = self.side;
        let s = self.on_wire.get_mut(&id).unwrap_or_else(|| {
            panic!("{side} end for id {id}, not on the wire (no head, or after its abort)")
        });
        assert!(!s.ended, "{side} sent a second end for id {id}");
        if let Some(cl) = s.length.filter(|_| s.kind != BodyKind::Empty) {
            assert!(
                s.sent == cl,
                "{side} end for id {id} after {} bytes of its Content-Length {cl}",
                s.sent
            );
        }
        s.ended = true;
        let tag = s.tag.clone();
        if side == Side::Worker {
            self.on_wire.remove(&id);
        }
        Seen::End { id, tag }
    }
}

/// Whether `side` may send a frame like `d` at all.
fn may_send(side: Side, d: &Decoded) -> bool {
    match d {
        Decoded::Chunk(_) => true,
        Decoded::Control(ControlFrame::Request { .. }) => side == Side::Relay,
        Decoded::Control(ControlFrame::Response { .. }) => side == Side::Worker,
        Decoded::Control(ControlFrame::End { .. } | ControlFrame::Abort { .. }) => true,
        _ => false,
    }
}

fn id_of(d: &Decoded) -> Option<StreamId> {
    match d {
        Decoded::Control(c) => Some(c.id()),
        Decoded::Chunk(c) => Some(c.id),
        _ => None,
    }
}

fn check_chunk(side: Side, id: StreamId, data: &[u8], limit: usize) {
    assert!(
        !data.is_empty(),
        "{side} emitted an empty chunk for id {id}"
    );
    assert!(
        data.len() <= limit,
        "{side} chunk of {} bytes for id {id}, over its limit of {limit}",
        data.len()
    );
}
