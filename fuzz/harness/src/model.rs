//! A model of one incoming body (what the application may read), and small helpers.

use crate::prelude::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BState {
    Open,
    Ended,
    Gone,
    Discarding,
}

/// The chunks received and not read yet, and whether more may come.
#[derive(Debug)]
pub(crate) struct BodyModel {
    pub(crate) state: BState,
    pub(crate) held: VecDeque<Bytes>,
    pub(crate) bytes: usize,
}

impl BodyModel {
    pub(crate) fn new() -> BodyModel {
        BodyModel {
            state: BState::Open,
            held: VecDeque::new(),
            bytes: 0,
        }
    }
    pub(crate) fn push(&mut self, data: Bytes) {
        if self.state == BState::Open && !data.is_empty() {
            self.bytes += data.len();
            self.held.push_back(data);
        }
    }
    pub(crate) fn end(&mut self) {
        if matches!(self.state, BState::Open | BState::Discarding) {
            self.state = BState::Ended;
        }
    }
    pub(crate) fn clear(&mut self) {
        self.held.clear();
        self.bytes = 0;
    }
    pub(crate) fn fail(&mut self) {
        self.state = BState::Gone;
        self.clear();
    }
    pub(crate) fn fail_after_data(&mut self) {
        if self.state != BState::Discarding {
            self.state = BState::Gone;
        }
    }
    pub(crate) fn discard(&mut self) {
        if self.state == BState::Open {
            self.state = BState::Discarding;
        }
        self.clear();
    }
    /// Checks one `read_body` result against the model, and applies it.
    pub(crate) fn read(&mut self, got: &BodyRead, who: &str) {
        match self.held.pop_front() {
            Some(want) => {
                self.bytes -= want.len();
                assert_eq!(
                    got,
                    &BodyRead::Data(want),
                    "{who}: body bytes differ from what was sent"
                );
            }
            None => {
                let want = match self.state {
                    BState::Open => BodyRead::Pending,
                    BState::Ended => BodyRead::End,
                    BState::Gone | BState::Discarding => BodyRead::Gone,
                };
                assert_eq!(got, &want, "{who}: read_body in state {:?}", self.state);
            }
        }
    }
}

/// A message for a trace line: frames in full, chunks by id and length.
pub(crate) fn short(m: &Message) -> String {
    match m {
        Message::Text(t) if t.len() > 200 => format!("Text({} bytes)", t.len()),
        Message::Text(t) => format!("Text({t})"),
        Message::Binary(b) if b.len() >= 4 => format!(
            "Binary(id {}, {} bytes)",
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            b.len() - 4
        ),
        other => format!("{other:?}"),
    }
}

pub(crate) fn short_read(r: &BodyRead) -> String {
    match r {
        BodyRead::Data(d) => format!("Data({} bytes)", d.len()),
        other => format!("{other:?}"),
    }
}

pub(crate) const APP_CLOSE_CODES: &[u16] = &[1000, 1001, 1011, 4000];

/// Stream keys a connection under test never handed out: keys are numbers
/// each connection counts up from 1, so a scratch connection's keys stand
/// for "a key from somewhere else" (the crate has no way to make one from a
/// number, and needs none).
#[derive(Default)]
pub(crate) struct KeyMint {
    scratch: RelayConnection,
}

impl KeyMint {
    /// A key numbered at least `at_least`.
    pub(crate) fn key(&mut self, at_least: u64) -> StreamKey {
        loop {
            let head = RequestHead::new("GET", "/", "", Headers::new()).expect("valid");
            let k = self
                .scratch
                .open_stream(head)
                .expect("the scratch relay opens");
            self.scratch.abort(k);
            if k.get() >= at_least {
                return k;
            }
        }
    }
}
