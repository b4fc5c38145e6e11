//! The outgoing scheduler shared by both sides: control frames first, then body
//! chunks of different streams round-robin, with bounded queues.

use super::local_map::LocalMap;
use super::StreamKey;
use crate::frame::{ControlFrame, Message, StreamId};
use bytes::Bytes;
use std::collections::VecDeque;

/// One stream's queued outgoing body.
#[derive(Debug)]
struct OutStream {
    id: StreamId,
    queue: VecDeque<Bytes>,
    queued: usize,
    end_pending: bool,
    abort_at_end: bool,
    in_ready: bool,
    blocked: bool,
}

fn end_frame(id: StreamId, abort: bool) -> ControlFrame {
    if abort {
        ControlFrame::Abort { id }
    } else {
        ControlFrame::End { id }
    }
}

/// Whether [`Outbound::abort`] sends an `abort` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendAbort {
    /// Send nothing (the peer ended the stream).
    Never,
    /// Always (the peer knows the stream).
    Always,
    /// Only if the stream's head went out (a relay request the worker never saw
    /// needs no abort).
    IfHeadSent,
}

/// What [`Outbound::poll_transmit`] produced besides the message.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    /// The stream whose `end` was just emitted (its output is complete).
    pub ended: Option<StreamKey>,
}

/// A queued control message, tagged with its stream so an abort can drop it.
#[derive(Debug)]
struct Control {
    msg: Message,
    key: Option<StreamKey>,
    ends: bool,
    /// A stream's head (`request` or `response`).
    head: bool,
}

/// Control queue + per-stream body queues, drained by [`Outbound::poll_transmit`].
#[derive(Debug)]
pub(crate) struct Outbound {
    control: VecDeque<Control>,
    streams: LocalMap<StreamKey, OutStream>,
    ready: VecDeque<StreamKey>,
    queued: usize,
    high_water: usize,
    stream_limit: usize,
    conn_limit: usize,
    chunk_size: usize,
    /// The configured chunk size: the most [`Outbound::set_chunk_size`] sets.
    max_chunk: usize,
    writable: Vec<StreamKey>,
    /// Streams refused bytes (`OutStream::blocked`), possibly some gone
    /// since: [`Outbound::wake_blocked`] looks at these, not every stream.
    blocked: Vec<StreamKey>,
    /// A pong is in `control`, not sent yet.
    pong_queued: bool,
}

impl Outbound {
    pub fn new(stream_limit: usize, conn_limit: usize, chunk_size: usize) -> Outbound {
        Outbound {
            control: VecDeque::new(),
            streams: LocalMap::default(),
            ready: VecDeque::new(),
            queued: 0,
            high_water: 0,
            stream_limit: stream_limit.max(1),
            conn_limit: conn_limit.max(1),
            chunk_size: chunk_size.clamp(1, crate::frame::MAX_CHUNK_BODY),
            max_chunk: chunk_size.clamp(1, crate::frame::MAX_CHUNK_BODY),
            writable: Vec::new(),
            pong_queued: false,
            blocked: Vec::new(),
        }
    }

    /// Queues a control message (no stream bookkeeping).
    #[cfg(test)]
    pub fn push_control(&mut self, msg: Message) {
        self.control.push_back(Control {
            msg,
            key: None,
            ends: false,
            head: false,
        });
    }

    /// Queues a pong ahead of everything, or, if one is queued and not
    /// sent yet, gives it this payload instead: the answer to the latest
    /// ping only, so a peer's ping flood costs one queued message.
    pub fn push_pong(&mut self, data: Bytes) {
        if self.pong_queued {
            // Near the front: only urgent messages go before it.
            if let Some(queued) = self.control.iter_mut().find_map(|c| match &mut c.msg {
                Message::Pong(queued) => Some(queued),
                _ => None,
            }) {
                *queued = data;
                return;
            }
        }
        self.pong_queued = true;
        self.push_urgent(Message::Pong(data));
    }

    /// Queues a message ahead of everything (a keepalive ping).
    pub fn push_urgent(&mut self, msg: Message) {
        self.control.push_front(Control {
            msg,
            key: None,
            ends: false,
            head: false,
        });
    }

    /// Queues a control frame of stream `key` (a head) that an abort drops.
    pub fn push_stream_control(&mut self, key: StreamKey, frame: &ControlFrame) {
        self.control.push_back(Control {
            msg: frame.to_message(),
            key: Some(key),
            ends: false,
            head: true,
        });
    }

    /// Queues stream `key`'s head message (a relay's `request`), which an
    /// abort drops and [`Outbound::head_queued`] looks for.
    pub fn push_head(&mut self, key: StreamKey, msg: Message) {
        self.control.push_back(Control {
            msg,
            key: Some(key),
            ends: false,
            head: true,
        });
    }

    /// Queues a message of stream `key` among the control messages (a tiny
    /// body that must not wait for, or be refused by, the body queue).
    pub fn push_stream_message(&mut self, key: StreamKey, msg: Message) {
        self.control.push_back(Control {
            msg,
            key: Some(key),
            ends: false,
            head: false,
        });
    }

    /// Queues a control frame of `key` whose emission ends the stream's output.
    fn push_end(&mut self, key: StreamKey, frame: ControlFrame) {
        self.control.push_back(Control {
            msg: frame.to_message(),
            key: Some(key),
            ends: true,
            head: false,
        });
    }

    /// Registers a stream that may queue body bytes.
    pub fn open(&mut self, key: StreamKey, id: StreamId) {
        self.streams.insert(
            key,
            OutStream {
                id,
                queue: VecDeque::new(),
                queued: 0,
                end_pending: false,
                abort_at_end: false,
                in_ready: false,
                blocked: false,
            },
        );
    }

    /// Bytes the stream may queue now.
    pub fn capacity(&self, key: StreamKey) -> usize {
        match self.streams.get(&key) {
            Some(s) if !s.end_pending => (self.stream_limit.saturating_sub(s.queued))
                .min(self.conn_limit.saturating_sub(self.queued)),
            _ => 0,
        }
    }

    /// Queues as much of `data` as the bounds allow (zero-copy); returns the count.
    pub fn write(&mut self, key: StreamKey, mut data: Bytes) -> usize {
        let cap = self.capacity(key);
        let Some(s) = self.streams.get_mut(&key) else {
            return 0;
        };
        if data.len() > cap {
            if !s.blocked {
                s.blocked = true;
                self.blocked.push(key);
            }
            data.truncate(cap);
        }
        let n = data.len();
        if n == 0 {
            return 0;
        }
        s.queued += n;
        s.queue.push_back(data);
        if !s.in_ready {
            s.in_ready = true;
            self.ready.push_back(key);
        }
        self.queued += n;
        self.high_water = self.high_water.max(self.queued);
        n
    }

    /// Ends the stream's output: `end` goes out after the queued body.
    pub fn finish(&mut self, key: StreamKey) {
        self.finish_with(key, false);
    }

    /// Ends the stream's output with `abort` after the queued body: what the
    /// application produced goes out, then the failure.
    pub fn finish_aborted(&mut self, key: StreamKey) {
        self.finish_with(key, true);
    }

    fn finish_with(&mut self, key: StreamKey, abort: bool) {
        let Some(s) = self.streams.get_mut(&key) else {
            return;
        };
        s.end_pending = true;
        s.abort_at_end = abort;
        if s.queue.is_empty() {
            let id = s.id;
            self.remove(key);
            self.push_end(key, end_frame(id, abort));
        }
    }

    /// Drops everything queued for the stream (body, head, `end`) and queues
    /// `abort` for `id` as `send_abort` says.
    pub fn abort(&mut self, key: StreamKey, id: StreamId, send_abort: SendAbort) {
        if let Some(s) = self.remove(key) {
            self.queued -= s.queued;
            if s.in_ready {
                self.ready.retain(|k| *k != key);
            }
            self.wake_blocked();
        }
        let before = self.control.len();
        self.control.retain(|c| c.key != Some(key) || c.ends);
        let head_unsent = self.control.len() != before;
        self.control.retain(|c| c.key != Some(key));
        if send_abort == SendAbort::Always || (send_abort == SendAbort::IfHeadSent && !head_unsent)
        {
            self.push_end(key, ControlFrame::Abort { id });
        }
    }

    /// Whether stream `key`'s head is still queued: the peer has not seen
    /// the stream.
    pub fn head_queued(&self, key: StreamKey) -> bool {
        self.control.iter().any(|c| c.head && c.key == Some(key))
    }

    /// Whether a message waits to be transmitted.
    pub fn has_queued(&self) -> bool {
        !self.control.is_empty() || !self.ready.is_empty()
    }

    /// Forgets every stream and everything queued (the connection is gone).
    pub fn clear(&mut self) {
        self.control.clear();
        self.pong_queued = false;
        self.streams.clear();
        self.ready.clear();
        self.queued = 0;
        self.writable.clear();
        self.blocked.clear();
    }

    /// Removes the stream, and its place in the blocked list: a stream that
    /// goes while the connection stays full must not stay listed there.
    fn remove(&mut self, key: StreamKey) -> Option<OutStream> {
        let s = self.streams.remove(&key)?;
        if s.blocked {
            self.blocked.retain(|k| *k != key);
        }
        Some(s)
    }

    fn wake_blocked(&mut self) {
        if self.queued >= self.conn_limit || self.blocked.is_empty() {
            return;
        }
        let (streams, writable) = (&mut self.streams, &mut self.writable);
        let stream_limit = self.stream_limit;
        self.blocked.retain(|k| {
            let Some(s) = streams.get_mut(k).filter(|s| s.blocked) else {
                return false; // gone, or woken another way
            };
            if s.end_pending {
                s.blocked = false;
                return false;
            }
            if s.queued < stream_limit {
                s.blocked = false;
                writable.push(*k);
                return false;
            }
            true
        });
    }

    /// Streams that were refused bytes and may queue again.
    pub fn take_writable(&mut self) -> Vec<StreamKey> {
        std::mem::take(&mut self.writable)
    }

    /// Sets the size of the chunks cut from now on: `n` within 1 and the
    /// configured size.
    pub fn set_chunk_size(&mut self, n: usize) {
        self.chunk_size = n.clamp(1, self.max_chunk);
    }

    /// The size of the chunks cut now.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Bytes queued, and their high-water mark.
    pub fn queued(&self) -> (usize, usize) {
        (self.queued, self.high_water)
    }

    /// The next message: control first, then one chunk of the next stream in turn.
    pub fn poll_transmit(&mut self) -> Option<(Message, Sent)> {
        if let Some(c) = self.control.pop_front() {
            if matches!(c.msg, Message::Pong(_)) {
                self.pong_queued = false;
            }
            let ended = if c.ends { c.key } else { None };
            return Some((c.msg, Sent { ended }));
        }
        let key = self.ready.pop_front()?;
        let s = self.streams.get_mut(&key).expect("ready streams are open");
        let front = s.queue.front_mut().expect("ready streams have data");
        let piece = if front.len() > self.chunk_size {
            front.split_to(self.chunk_size)
        } else {
            s.queue.pop_front().expect("checked")
        };
        let n = piece.len();
        s.queued -= n;
        self.queued -= n;
        let msg = Message::Binary(super::chunk_pool::encode(s.id, &piece));
        if !s.queue.is_empty() {
            self.ready.push_back(key);
        } else {
            s.in_ready = false;
            if s.end_pending {
                let (id, abort) = (s.id, s.abort_at_end);
                self.remove(key);
                self.push_end(key, end_frame(id, abort));
            }
        }
        self.wake_blocked();
        Some((msg, Sent::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode, Decoded};

    fn id(n: u32) -> StreamId {
        StreamId::new(n).unwrap()
    }

    fn drain(o: &mut Outbound) -> Vec<Decoded> {
        std::iter::from_fn(|| o.poll_transmit())
            .map(|(m, _)| decode(&m).unwrap().unwrap())
            .collect()
    }

    #[test]
    fn control_before_chunks_and_round_robin() {
        let mut o = Outbound::new(1 << 20, 1 << 20, 4);
        let (a, b) = (StreamKey(1), StreamKey(2));
        o.open(a, id(1));
        o.open(b, id(2));
        assert_eq!(o.write(a, Bytes::from_static(b"aaaaaaaa")), 8);
        assert_eq!(o.write(b, Bytes::from_static(b"bbbb")), 4);
        o.finish(b);
        o.push_control(ControlFrame::Abort { id: id(9) }.to_message());
        let out = drain(&mut o);
        let tags: Vec<String> = out
            .iter()
            .map(|d| match d {
                Decoded::Control(c) => format!("{}{}", c.type_name(), c.id()),
                Decoded::Chunk(c) => format!("chunk{}", c.id),
                Decoded::Unknown => "?".into(),
            })
            .collect();
        assert_eq!(tags, ["abort9", "chunk1", "chunk2", "end2", "chunk1"]);
    }

    #[test]
    fn the_chunk_size_changes_between_chunks_within_its_bounds() {
        let mut o = Outbound::new(1 << 20, 1 << 20, 8);
        let a = StreamKey(1);
        o.open(a, id(1));
        o.write(a, Bytes::from(vec![7u8; 40]));
        let len = |o: &mut Outbound| match o.poll_transmit().map(|(m, _)| decode(&m)) {
            Some(Some(Ok(Decoded::Chunk(c)))) => c.data.len(),
            other => panic!("{other:?}"),
        };
        assert_eq!(len(&mut o), 8);
        o.set_chunk_size(3);
        assert_eq!(len(&mut o), 3);
        o.set_chunk_size(0);
        assert_eq!(o.chunk_size(), 1);
        assert_eq!(len(&mut o), 1);
        o.set_chunk_size(usize::MAX);
        assert_eq!(o.chunk_size(), 8);
        assert_eq!(len(&mut o), 8);
    }

    #[test]
    fn bounds_and_writable() {
        let mut o = Outbound::new(6, 8, 4);
        let (a, b) = (StreamKey(1), StreamKey(2));
        o.open(a, id(1));
        o.open(b, id(2));
        assert_eq!(o.write(a, Bytes::from_static(b"0123456789")), 6);
        assert_eq!(o.capacity(a), 0);
        assert_eq!(o.capacity(b), 2);
        assert_eq!(o.write(b, Bytes::from_static(b"xyz")), 2);
        assert_eq!(o.queued(), (8, 8));
        assert!(o.take_writable().is_empty());
        o.poll_transmit().unwrap();
        let mut w = o.take_writable();
        w.sort();
        assert_eq!(w, vec![a, b]);
        assert_eq!(o.capacity(a), 4);
    }

    #[test]
    fn streams_that_go_while_the_connection_is_full_leave_the_blocked_list() {
        // The connection's bound is full (a peer that reads nothing); streams
        // are refused bytes, then aborted or finished: none stays listed.
        let mut o = Outbound::new(4, 4, 4);
        let filler = StreamKey(1);
        o.open(filler, id(1));
        assert_eq!(o.write(filler, Bytes::from_static(b"full")), 4);
        for n in 2..1000u32 {
            let key = StreamKey(u64::from(n));
            o.open(key, id(n));
            assert_eq!(o.write(key, Bytes::from_static(b"x")), 0);
            if n % 2 == 0 {
                o.abort(key, id(n), SendAbort::Always);
            } else {
                o.finish(key);
            }
            assert!(
                o.blocked.len() <= o.streams.len(),
                "at {n}: {}",
                o.blocked.len()
            );
        }
    }

    #[test]
    fn abort_drops_queue_and_pending_end() {
        let mut o = Outbound::new(100, 100, 4);
        let a = StreamKey(1);
        o.open(a, id(1));
        o.write(a, Bytes::from_static(b"abcdefgh"));
        o.abort(a, id(1), SendAbort::Always);
        assert_eq!(o.queued().0, 0);
        let out = drain(&mut o);
        assert_eq!(
            out,
            vec![Decoded::Control(ControlFrame::Abort { id: id(1) })]
        );
        o.open(a, id(1));
        o.finish(a);
        o.abort(a, id(1), SendAbort::Never);
        assert!(drain(&mut o).is_empty());
    }
}
