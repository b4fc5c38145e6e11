//! Worker mode: the kit's lenient reading of what the worker sends. Every
//! message is decoded as far as it goes (JSON first, the frame's fields
//! one by one), recorded in the stream table under its raw id, and judged
//! against the spec separately: what the spec makes wrong is a violation
//! line (the runner fails a case that saw one, whatever the case checks),
//! what it leaves open (an unknown `type`) is a note.
//!
//! Violations (spec section):
//! - §Frames: a text message that is not JSON, or JSON that is not an
//!   object, or has no string `type`; an id that is not an integer from 1
//!   to 2³²−1; a binary message shorter than its 4-byte id; a message over
//!   1 MiB + 4 bytes (a chunk body over 1,048,576 bytes).
//! - §Worker-to-relay: a `response` whose status is not an integer in
//!   100..=999 or whose headers are not `[name, value]` pairs of Latin-1
//!   strings; a second `response`; a chunk or `end` before `response`;
//!   anything after `end`/`abort`; an answer on an id the kit never opened
//!   on this connection; a body that disagrees with the response's
//!   `Content-Length` at `end`.
//! - §Relay-to-worker: anything for a stream more than [`ABORT_GRACE`] after
//!   the kit aborted it ("it sends nothing more for the stream").
//! - §Connecting: a response that carries the worker's connect token, in a
//!   header or its body (the token "is the relay's credential for this
//!   worker and nothing else"), when the kit knows the token (see
//!   [`Observer::watching`]). The line says where, never the token.

use crate::worker_ctx::Answered;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as WsMsg;
use worker_relay::frame::{MAX_CHUNK_BODY, MAX_MESSAGE_LEN};

/// Frames the worker had in flight when the kit aborted a stream are not
/// its fault: only what comes later than this counts.
pub const ABORT_GRACE: Duration = Duration::from_secs(2);

/// At most this many violation lines per case (then a count).
pub const MAX_LINES: usize = 12;

/// The shortest connect token the observer looks for: a shorter one could
/// turn up in ordinary bodies by chance.
pub const MIN_SECRET: usize = 8;

/// What the observers of one kit run found, shared by its connections.
#[derive(Debug, Default)]
pub struct Shared {
    pub violations: Vec<String>,
    /// Violations left out past [`MAX_LINES`].
    pub more: usize,
    /// Observed, not judged (unknown types).
    pub notes: Vec<String>,
    /// The worker did not come back when `before_case` last waited for it.
    pub lost: bool,
}

pub type SharedRef = Arc<Mutex<Shared>>;

impl Shared {
    pub fn take_violations(&mut self) -> Vec<String> {
        let mut v = std::mem::take(&mut self.violations);
        if self.more > 0 {
            v.push(format!("and {} more", self.more));
            self.more = 0;
        }
        self.notes.clear();
        v
    }
}

/// A stream as the kit opened it.
#[derive(Debug, Clone)]
struct Opened {
    epoch: u64,
    method: String,
    aborted_at: Option<Instant>,
}

/// One connection's observer.
#[derive(Debug)]
pub struct Observer {
    shared: SharedRef,
    opened: HashMap<u32, Opened>,
    epoch: u64,
    /// Raw ids the worker used that are not u32 ("-1", "\"7\"", "4294967296", "1.5").
    pub bad_ids: Vec<String>,
    /// The worker's connect token, which no response may carry.
    secret: Option<Vec<u8>>,
}

fn snip(t: &str) -> String {
    let mut s: String = t.chars().take(40).collect();
    if s.len() < t.len() {
        s.push('…');
    }
    format!("{s:?}")
}

/// An id as the JSON had it: a u32 (0 included), or its raw text.
enum RawId {
    U32(u32),
    Bad(String, &'static str),
    Missing,
}

fn raw_id(v: Option<&Value>) -> RawId {
    match v {
        None => RawId::Missing,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) if u <= u32::MAX as u64 => RawId::U32(u as u32),
            (Some(_), _) => RawId::Bad(n.to_string(), "over 2^32-1"),
            (None, Some(_)) => RawId::Bad(n.to_string(), "negative"),
            _ => RawId::Bad(n.to_string(), "not an integer"),
        },
        Some(other) => RawId::Bad(other.to_string(), "not a number"),
    }
}

/// Where `needle` first occurs in `hay`.
/// The first `max` characters of a body, as text, for a report line, with
/// every secret in it (the worker's tokens) replaced by `<token>` before it
/// is cut, so that a report never shows a token, nor its start, even for a
/// worker that leaks one.
pub fn preview(body: &[u8], secrets: &[&str], max: usize) -> String {
    let mut text = String::from_utf8_lossy(body).into_owned();
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(s, "<token>");
    }
    text.chars().take(max).collect()
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .find(|&i| hay[i] == needle[0] && &hay[i..i + needle.len()] == needle)
}

fn latin1(s: &str) -> bool {
    s.chars().all(|c| (c as u32) <= 0xff)
}

fn headers_ok(v: Option<&Value>) -> Option<Vec<(String, String)>> {
    let Value::Array(pairs) = v? else {
        return None;
    };
    pairs
        .iter()
        .map(|p| match p.as_array().map(|a| a.as_slice()) {
            Some([Value::String(n), Value::String(v)]) if latin1(n) && latin1(v) => {
                Some((n.clone(), v.clone()))
            }
            _ => None,
        })
        .collect()
}

impl Observer {
    pub fn new(shared: SharedRef) -> Observer {
        Observer {
            shared,
            opened: HashMap::new(),
            epoch: 0,
            bad_ids: Vec::new(),
            secret: None,
        }
    }

    /// Also looks for `token`, the worker's connect token, in every
    /// response's headers and body, if it is at least [`MIN_SECRET`]
    /// bytes long.
    pub fn watching(mut self, token: Option<&str>) -> Observer {
        self.secret = token
            .filter(|t| t.len() >= MIN_SECRET)
            .map(|t| t.as_bytes().to_vec());
        self
    }

    /// Whether `text` holds the connect token.
    fn holds_secret(&self, text: &[u8]) -> bool {
        self.secret
            .as_deref()
            .is_some_and(|t| find(text, t).is_some())
    }

    fn violation(&self, line: String) {
        let mut s = self.shared.lock().expect("observer");
        if s.violations.contains(&line) {
            return;
        }
        if s.violations.len() >= MAX_LINES {
            s.more += 1;
        } else {
            s.violations.push(line);
        }
    }

    fn note(&self, line: String) {
        let mut s = self.shared.lock().expect("observer");
        if !s.notes.contains(&line) {
            s.notes.push(line);
        }
    }

    /// A new case: the streams opened so far belong to earlier cases, and
    /// what the worker still sends for them is not charged to this one.
    pub fn new_epoch(&mut self) {
        self.epoch += 1;
        self.bad_ids.clear();
    }

    /// The kit's streams of this case that neither side has finished.
    pub fn open_ids(&self, streams: &HashMap<u32, Answered>) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .opened
            .iter()
            .filter(|(k, o)| {
                o.aborted_at.is_none()
                    && streams
                        .get(k)
                        .is_none_or(|s: &Answered| !s.ended && !s.aborted)
            })
            .map(|(k, _)| *k)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// What the kit sends: a `request` with a valid id opens it, an `abort` ends it.
    pub fn sent(&mut self, m: &WsMsg, streams: &mut HashMap<u32, Answered>) {
        let WsMsg::Text(t) = m else {
            return;
        };
        let Ok(Value::Object(o)) = serde_json::from_str::<Value>(t.as_str()) else {
            return;
        };
        let RawId::U32(k) = raw_id(o.get("id")) else {
            return;
        };
        if k == 0 {
            return;
        }
        match o.get("type").and_then(|t| t.as_str()) {
            Some("request") => {
                streams.remove(&k);
                self.opened.insert(
                    k,
                    Opened {
                        epoch: self.epoch,
                        method: o
                            .get("method")
                            .and_then(|m| m.as_str())
                            .unwrap_or("")
                            .to_string(),
                        aborted_at: None,
                    },
                );
            }
            Some("abort") => {
                if let Some(o) = self.opened.get_mut(&k) {
                    o.aborted_at.get_or_insert_with(Instant::now);
                }
            }
            _ => {}
        }
    }

    /// Whether a frame of the worker's for `k` is this case's business; notes
    /// violations of id and order. `what` names the frame.
    fn admit(&self, k: u32, what: &str, streams: &HashMap<u32, Answered>) -> bool {
        if k == 0 {
            self.violation(format!("answered on id 0 (a {what}; ids are 1 to 2^32-1)"));
            return true;
        }
        match self.opened.get(&k) {
            None => {
                self.violation(format!(
                    "a {what} on id {k}, which the kit never opened on this connection"
                ));
                true
            }
            Some(o) if o.epoch < self.epoch => false,
            Some(o) => {
                if let Some(at) = o.aborted_at {
                    let after = at.elapsed();
                    if after > ABORT_GRACE {
                        self.violation(format!(
                            "a {what} on stream {k} {:.1} s after the kit aborted it",
                            after.as_secs_f64()
                        ));
                    }
                }
                if let Some(s) = streams.get(&k) {
                    if s.ended || s.aborted {
                        let by = if s.ended { "end" } else { "abort" };
                        self.violation(format!("a {what} on stream {k} after its {by}"));
                    }
                }
                true
            }
        }
    }

    /// Takes one of the worker's data messages into the stream table.
    pub fn take(&mut self, m: &WsMsg, streams: &mut HashMap<u32, Answered>) {
        match m {
            WsMsg::Text(t) => self.text(t.as_str(), streams),
            WsMsg::Binary(b) => self.binary(b, streams),
            _ => {}
        }
    }

    fn binary(&mut self, b: &[u8], streams: &mut HashMap<u32, Answered>) {
        if b.len() < 4 {
            self.violation(format!(
                "a binary message of {} bytes (a chunk starts with a 4-byte id)",
                b.len()
            ));
            return;
        }
        if b.len() > MAX_MESSAGE_LEN {
            self.violation(format!(
                "a chunk of {} body bytes (at most {MAX_CHUNK_BODY})",
                b.len() - 4
            ));
        }
        let k = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if !self.admit(k, "chunk", streams) {
            return;
        }
        let s = streams.entry(k).or_default();
        if s.status.is_none() || s.ended || s.aborted {
            s.out_of_order += 1;
        }
        let before_response = s.status.is_none() && !s.ended && !s.aborted;
        let from = s.body.len();
        s.body.extend_from_slice(&b[4..]);
        if let Some(t) = self.secret.as_deref() {
            // The new bytes, and the token's length less one before them (a
            // token cut across two chunks).
            let start = from.saturating_sub(t.len() - 1);
            if let Some(at) = find(&s.body[start..], t) {
                self.violation(format!(
                    "stream {k}'s body carries the worker's connect token (at byte {})",
                    start + at
                ));
            }
        }
        s.chunks += 1;
        s.max_chunk = s.max_chunk.max(b.len() - 4);
        if before_response {
            self.violation(format!("a chunk on stream {k} before its response"));
        }
    }

    fn text(&mut self, t: &str, streams: &mut HashMap<u32, Answered>) {
        if t.len() > MAX_MESSAGE_LEN {
            self.violation(format!(
                "a text message of {} bytes (over 1 MiB + 4)",
                t.len()
            ));
        }
        let v: Value = match serde_json::from_str(t) {
            Ok(v) => v,
            Err(_) => {
                return self.violation(format!("a text message that is not JSON: {}", snip(t)))
            }
        };
        let Value::Object(o) = v else {
            return self.violation(format!(
                "a text message that is JSON but not an object: {}",
                snip(t)
            ));
        };
        let ty = match o.get("type") {
            None => {
                return self.violation(format!("a control frame without \"type\": {}", snip(t)))
            }
            Some(Value::String(s)) => s.as_str(),
            Some(_) => {
                return self.violation(format!(
                    "a control frame whose \"type\" is not a string: {}",
                    snip(t)
                ))
            }
        };
        if !matches!(ty, "response" | "end" | "abort") {
            // The spec: both sides ignore a frame with an unknown type.
            return self.note(format!("a frame of type {ty:?} (ignored)"));
        }
        let k = match raw_id(o.get("id")) {
            RawId::U32(k) => k,
            RawId::Missing => {
                return self.violation(format!("a {ty} without an id: {}", snip(t)));
            }
            RawId::Bad(raw, why) => {
                // Only ever an answer to a request the kit sent on that bad
                // id: the spec does not say what a worker does with one, so
                // the case that sent it judges (a warning), not every case.
                self.note(format!("a {ty} on id {raw} ({why}; ids are 1 to 2^32-1)"));
                self.bad_ids.push(raw);
                return;
            }
        };
        if !self.admit(k, ty, streams) {
            return;
        }
        let method = self.opened.get(&k).map(|o| o.method.clone());
        let s = streams.entry(k).or_default();
        match ty {
            "response" => {
                if s.status.is_some() || s.ended || s.aborted {
                    s.out_of_order += 1;
                }
                let second = s.status.is_some() && !s.ended && !s.aborted;
                let status = o.get("status").and_then(|v| v.as_u64());
                let headers = headers_ok(o.get("headers"));
                match status {
                    Some(st) if (100..=999).contains(&st) => s.status = Some(st as u16),
                    _ => {
                        // Recorded as answered all the same (0: not a status).
                        s.status.get_or_insert(0);
                        self.violation(format!(
                            "a response on stream {k} with status {} (an integer 100..=999)",
                            o.get("status").map_or("missing".into(), |v| v.to_string())
                        ));
                    }
                }
                let leaked = match &headers {
                    Some(h) => h
                        .iter()
                        .filter(|(n, v)| {
                            self.holds_secret(n.as_bytes()) || self.holds_secret(v.as_bytes())
                        })
                        .map(|(n, _)| {
                            if self.holds_secret(n.as_bytes()) {
                                "a header's name".to_string()
                            } else {
                                format!("header {n:?}")
                            }
                        })
                        .collect(),
                    None if self.holds_secret(t.as_bytes()) => vec!["its headers".to_string()],
                    None => Vec::new(),
                };
                if !leaked.is_empty() {
                    self.violation(format!(
                        "a response on stream {k} carries the worker's connect token in {}",
                        leaked.join(", ")
                    ));
                }
                match headers {
                    Some(h) => s.headers = h,
                    None => self.violation(format!(
                        "a response on stream {k} whose headers are not [name, value] pairs of Latin-1 strings: {}",
                        o.get("headers").map_or("missing".into(), |v| snip(&v.to_string()))
                    )),
                }
                if second {
                    self.violation(format!("a second response on stream {k}"));
                }
            }
            "end" => {
                if s.status.is_none() || s.ended || s.aborted {
                    s.out_of_order += 1;
                }
                let before = s.status.is_none() && !s.ended && !s.aborted;
                let first_end = !s.ended && !s.aborted;
                s.ended = true;
                if before {
                    self.violation(format!("end on stream {k} before its response"));
                } else if first_end {
                    let s = s.clone();
                    self.content_length(k, &s, method.as_deref());
                }
            }
            _ => {
                if s.ended || s.aborted {
                    s.out_of_order += 1;
                }
                s.aborted = true;
            }
        }
    }

    /// §Worker-to-relay: "If headers carries Content-Length, the body has
    /// exactly that many bytes" (not for HEAD, 1xx, 204, 304).
    fn content_length(&self, k: u32, s: &Answered, method: Option<&str>) {
        let status = s.status.unwrap_or(0);
        if method == Some("HEAD") || status < 200 || status == 204 || status == 304 {
            return;
        }
        let values: Vec<&str> = s
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.trim())
            .collect();
        let Some(first) = values.first() else {
            return;
        };
        match first.parse::<u64>() {
            Ok(n) if values.iter().all(|v| v == first) => {
                if n != s.body.len() as u64 {
                    self.violation(format!(
                        "stream {k}: Content-Length {n}, but {} body bytes before its end",
                        s.body.len()
                    ));
                }
            }
            _ => self.violation(format!(
                "stream {k}: Content-Length {values:?} is not one number"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preview_shows_no_token_nor_its_start() {
        let token = "ct-0123456789abcdef0123456789abcdef";
        let body = format!("Internal Server Error: {token} was refused");
        let shown = preview(body.as_bytes(), &[token, ""], 30);
        assert_eq!(shown, "Internal Server Error: <token>");
        assert!(!shown.contains("ct-0123"), "{shown}");
        // Cut inside where the token stood: still none of it.
        assert_eq!(
            preview(body.as_bytes(), &[token], 25),
            "Internal Server Error: <t"
        );
        assert_eq!(preview(b"plain", &[], 60), "plain");
    }

    fn text(t: &str) -> WsMsg {
        WsMsg::Text(t.to_string().into())
    }

    fn chunk(id: u32, body: &[u8]) -> WsMsg {
        let mut b = id.to_be_bytes().to_vec();
        b.extend_from_slice(body);
        WsMsg::Binary(b.into())
    }

    /// The violations after the kit opened stream 101 and the worker sent `msgs`.
    fn seen(msgs: &[WsMsg]) -> (Vec<String>, HashMap<u32, Answered>, Vec<String>) {
        let shared = SharedRef::default();
        let mut o = Observer::new(shared.clone());
        let mut streams = HashMap::new();
        o.sent(
            &text(r#"{"type":"request","id":101,"method":"GET","path":"/health","query":"","headers":[]}"#),
            &mut streams,
        );
        for m in msgs {
            o.take(m, &mut streams);
        }
        let v = shared.lock().unwrap().take_violations();
        (v, streams, o.bad_ids)
    }

    #[test]
    fn a_sound_answer_is_no_violation() {
        let (v, streams, _) = seen(&[
            text(r#"{"type":"response","id":101,"status":200,"headers":[["content-length","2"]]}"#),
            chunk(101, b"ok"),
            chunk(101, b""),
            text(r#"{"type":"end","id":101}"#),
            text(r#"{"type":"hello"}"#),
        ]);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(streams[&101].body, b"ok");
        assert!(streams[&101].ended);
    }

    #[test]
    fn bad_ids_are_kept_and_named() {
        let (v, streams, bad) = seen(&[
            text(r#"{"type":"response","id":0,"status":200,"headers":[]}"#),
            text(r#"{"type":"end","id":"7"}"#),
            text(r#"{"type":"end","id":4294967296}"#),
            text(r#"{"type":"abort","id":-3}"#),
            text(r#"{"type":"abort","id":555}"#),
        ]);
        assert!(streams.contains_key(&0));
        // Kept by name for the case that sent them, not violations of every case.
        assert_eq!(bad, ["\"7\"", "4294967296", "-3"]);
        let all = v.join("\n");
        for want in ["answered on id 0", "id 555, which the kit never opened"] {
            assert!(all.contains(want), "{want}: {all}");
        }
        for not in ["id \"7\"", "id 4294967296", "id -3"] {
            assert!(!all.contains(not), "{not}: {all}");
        }
    }

    #[test]
    fn malformed_and_out_of_order_frames_are_violations() {
        let (v, _, _) = seen(&[
            text("not json"),
            text("[1]"),
            text(r#"{"id":101}"#),
            WsMsg::Binary(vec![0u8, 1].into()),
            chunk(101, b"early"),
            text(r#"{"type":"response","id":101,"status":99,"headers":[["a"]]}"#),
            text(r#"{"type":"response","id":101,"status":200,"headers":[]}"#),
            chunk(101, &vec![0u8; MAX_CHUNK_BODY + 1]),
            text(r#"{"type":"end","id":101}"#),
            chunk(101, b"late"),
        ]);
        let all = v.join("\n");
        for want in [
            "not JSON",
            "not an object",
            "without \"type\"",
            "binary message of 2 bytes",
            "before its response",
            "status 99",
            "not [name, value] pairs",
            "a second response",
            "1048577 body bytes",
            "after its end",
        ] {
            assert!(all.contains(want), "{want}: {all}");
        }
    }

    #[test]
    fn a_body_short_of_its_content_length_is_a_violation() {
        let (v, _, _) = seen(&[
            text(r#"{"type":"response","id":101,"status":200,"headers":[["Content-Length","5"]]}"#),
            chunk(101, b"1234"),
            text(r#"{"type":"end","id":101}"#),
        ]);
        assert_eq!(
            v,
            ["stream 101: Content-Length 5, but 4 body bytes before its end"]
        );
    }

    #[test]
    fn the_connect_token_in_a_header_or_a_body_is_named_never_shown() {
        const SECRET: &str = "ct-0123456789abcdef";
        let shared = SharedRef::default();
        let mut o = Observer::new(shared.clone()).watching(Some(SECRET));
        let mut streams = HashMap::new();
        for id in [101, 102, 103] {
            o.sent(
                &text(&format!(r#"{{"type":"request","id":{id},"method":"GET","path":"/x","query":"","headers":[]}}"#)),
                &mut streams,
            );
        }
        let (head, tail) = SECRET.split_at(7);
        for m in [
            text(&format!(
                r#"{{"type":"response","id":101,"status":404,"headers":[["X-Debug","token={SECRET}"]]}}"#
            )),
            text(r#"{"type":"end","id":101}"#),
            // The token cut across two chunks.
            text(r#"{"type":"response","id":102,"status":500,"headers":[]}"#),
            chunk(102, format!("config: connect_token={head}").as_bytes()),
            chunk(102, format!("{tail}\n").as_bytes()),
            text(r#"{"type":"end","id":102}"#),
            // Its prefix alone is not the token.
            text(r#"{"type":"response","id":103,"status":200,"headers":[["a","ct-0123"]]}"#),
            chunk(103, head.as_bytes()),
            text(r#"{"type":"end","id":103}"#),
        ] {
            o.take(&m, &mut streams);
        }
        let v = shared.lock().unwrap().take_violations();
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(
            v[0].contains("stream 101") && v[0].contains("header \"X-Debug\""),
            "{v:?}"
        );
        assert!(
            v[1].contains("stream 102's body") && v[1].contains("at byte 22"),
            "{v:?}"
        );
        assert!(
            v.iter().all(|l| !l.contains(SECRET) && !l.contains(tail)),
            "{v:?}"
        );
        // A kit that knows no token (or one too short to look for) looks for nothing.
        assert!(Observer::new(shared.clone())
            .watching(Some("short"))
            .secret
            .is_none());
    }

    #[test]
    fn earlier_cases_streams_are_not_this_cases_business() {
        let shared = SharedRef::default();
        let mut o = Observer::new(shared.clone());
        let mut streams = HashMap::new();
        o.sent(
            &text(r#"{"type":"request","id":9,"method":"GET","path":"/","query":"","headers":[]}"#),
            &mut streams,
        );
        o.new_epoch();
        o.take(
            &text(r#"{"type":"response","id":9,"status":200,"headers":[]}"#),
            &mut streams,
        );
        assert!(shared.lock().unwrap().take_violations().is_empty());
        assert!(streams.is_empty());
    }
}
