//! Hidden helpers shared by the fuzz targets and their corpus-replay tests.
//! Not a public API: enabled only by the `fuzzing` feature.
//!
//! Each entry point takes the raw bytes a fuzzer produced, decodes from them
//! whatever it needs with a tiny byte cursor ([`Cursor`]: "take a u8, take a
//! u32, take n bytes", zeros once the input runs out), drives one part of the
//! crate, and panics (`assert!`) as soon as an invariant breaks:
//!
//! | entry point | drives | checks |
//! |---|---|---|
//! | [`frame_decode`] | `frame::decode_text` / `decode_binary` | no panic; what decodes re-encodes and decodes to the same value; errors map to the right close code |
//! | [`worker_machine`] | [`WorkerConnection`] | the worker's invariants after every step (see the function) |
//! | [`relay_machine`] | [`RelayConnection`] | the relay's invariants after every step (see the function) |
//! | [`handshake_and_url`] | `decide_upgrade`, `TokenTable`, `UrlMap`, `Verdict`, `Backoff` | decisions agree with the spec's rules; a mapped worker id is one safe segment |
//!
//! The fuzz targets in `fuzz/` are one-liners around these functions, and
//! `tests/fuzz_corpus.rs` replays the committed seed corpora through them on
//! stable Rust.

use crate::connect::{
    decide_upgrade, Backoff, BackoffConfig, KeepaliveConfig, Rejected, Token, TokenTable, UrlError,
    UrlMap, Verdict, WorkerId, SEC_WEBSOCKET_PROTOCOL,
};
use crate::frame::{
    self, CloseCode, ControlFrame, Decoded, FrameError, HeadLimits, Headers, Message, RequestHead,
    ResponseHead, StreamId, MAX_CHUNK_BODY, MAX_MESSAGE_LEN, SUBPROTOCOL,
};
use crate::proto::{
    is_control_route, BodyRead, HandleError, RelayConfig, RelayConnection, RelayEnd, RelayEvent,
    StreamError, StreamKey, WorkerConfig, WorkerConnection, WorkerEnd, WorkerEvent,
    MAX_PENDING_REFUSALS,
};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Most operations one machine input runs (inputs are short anyway).
const MAX_STEPS: usize = 4096;

static TRACE: AtomicBool = AtomicBool::new(false);

/// Prints every step, message and event of the machine harnesses to stderr
/// (for reading a crash: `tests/fuzz_corpus.rs` turns it on when
/// `WORKER_RELAY_FUZZ_TRACE` is set).
pub fn set_trace(on: bool) {
    TRACE.store(on, Ordering::Relaxed);
}

macro_rules! trace {
    ($($arg:tt)*) => {
        if TRACE.load(Ordering::Relaxed) {
            eprintln!($($arg)*);
        }
    };
}

// =====================================================================
// The byte cursor
// =====================================================================

/// Reads fuzzer bytes as the values the harnesses need. Once the input is
/// exhausted every read returns zeros (or an empty slice), so any input,
/// however short, is a complete program.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// A cursor over `data`.
    pub fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte, or 0.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes, big-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, big-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// Whether the next byte is odd.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// Up to `n` bytes (fewer if the input ends).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// One of `items` (which must not be empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::from(self.u8()) % items.len()]
    }

    /// A length-prefixed byte string of at most `max` bytes.
    pub fn short_bytes(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u8()) % (max + 1);
        self.bytes(n)
    }
}

/// A fixed point every run measures its virtual time from. Only differences
/// matter to the machines, so one process-wide base keeps runs reproducible.
fn base_instant() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

// =====================================================================
// Generators: values built from cursor bytes
// =====================================================================

const TCHARS: &[u8] =
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A non-empty HTTP token (method or header name).
fn gen_token(c: &mut Cursor<'_>) -> String {
    let n = 1 + usize::from(c.u8() % 12);
    (0..n)
        .map(|_| char::from(TCHARS[usize::from(c.u8()) % TCHARS.len()]))
        .collect()
}

/// Visible ASCII (0x21..=0x7e), possibly empty.
fn gen_visible(c: &mut Cursor<'_>, max: usize) -> String {
    c.short_bytes(max)
        .iter()
        .map(|&b| char::from(0x21 + b % 94))
        .collect()
}

/// Latin-1 text from raw bytes (each byte one char: controls, CR, LF, NUL
/// and U+0080..U+00FF included, so some values are refused).
fn gen_latin1(c: &mut Cursor<'_>, max: usize) -> String {
    c.short_bytes(max).iter().map(|&b| char::from(b)).collect()
}

const HEADER_NAMES: &[&str] = &[
    "content-type",
    "content-length",
    "Content-Length",
    "authorization",
    "connection",
    "Keep-Alive",
    "transfer-encoding",
    "Proxy-Authorization",
    "te",
    "x-private",
    "x-strata-executor-protocol",
];

const HEADER_VALUES: &[&str] = &[
    "0",
    "3",
    "5",
    "16",
    "1, 1",
    "4x",
    "",
    "keep-alive, X-Private",
    "Bearer t0k",
    "application/json",
    "caf\u{e9}",
    "tab\there",
];

fn gen_headers(c: &mut Cursor<'_>) -> Headers {
    let mut h = Headers::new();
    let n = c.u8() % 5;
    for _ in 0..n {
        let name = match c.u8() % 4 {
            0 => gen_token(c),
            _ => c.pick(HEADER_NAMES).to_owned(),
        };
        let value = match c.u8() % 3 {
            0 => gen_latin1(c, 24),
            _ => c.pick(HEADER_VALUES).to_owned(),
        };
        // Invalid pairs are refused by `try_push`; the list stays valid.
        let _ = h.try_push(name, value);
    }
    h
}

const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "HEAD", "HEAD", "CONNECT", "TRACE",
];
const PATHS: &[&str] = &[
    "/health",
    "/v1/execute",
    "/v1/notebook-execute",
    "/v1/execute-manifest",
    "/v1/executions/b1/cancel",
    "/",
    "/a%2Fb",
];

fn gen_request_head(c: &mut Cursor<'_>) -> RequestHead {
    let method = match c.u8() % 8 {
        0 => gen_token(c),
        _ => c.pick(METHODS).to_owned(),
    };
    let path = match c.u8() % 6 {
        0 => format!("/{}", gen_visible(c, 16)),
        _ => c.pick(PATHS).to_owned(),
    };
    let query = match c.u8() % 4 {
        0 => gen_visible(c, 12),
        1 => "trace=1".to_owned(),
        _ => String::new(),
    };
    let headers = gen_headers(c);
    RequestHead::new(method, path, query, headers).expect("generated heads are valid")
}

fn gen_response_head(c: &mut Cursor<'_>) -> ResponseHead {
    let status = match c.u8() % 8 {
        0 | 1 => 100 + c.u16() % 900,
        2 => 500,
        3 => c.pick(&[101, 204, 304, 100, 599, 600]),
        _ => 200,
    };
    ResponseHead::new(status, gen_headers(c)).expect("generated heads are valid")
}

/// An id: mostly one of `pool`, else a small id, else any id.
fn gen_id(c: &mut Cursor<'_>, pool: &[StreamId]) -> StreamId {
    let b = c.u8();
    match b % 8 {
        0..=4 if !pool.is_empty() => pool[usize::from(c.u8()) % pool.len()],
        7 => StreamId::new(c.u32()).unwrap_or(StreamId::MAX),
        _ => StreamId::new(1 + u32::from(c.u8() % 8)).expect("nonzero"),
    }
}

/// A body piece: its length comes from the input, its bytes are a slice of
/// a fixed pattern at an offset that moves on with every piece (so pieces
/// differ and misordering shows), without copying.
fn gen_body(c: &mut Cursor<'_>, seq: &mut u32) -> Bytes {
    static PATTERN: OnceLock<Bytes> = OnceLock::new();
    let pattern = PATTERN.get_or_init(|| {
        (0..(1usize << 16) + 256)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into()
    });
    let n = match c.u8() % 8 {
        0 => 0,
        1..=4 => usize::from(c.u8() % 64),
        5 | 6 => usize::from(c.u8()) * 4,
        _ => usize::from(c.u16()),
    };
    *seq = seq.wrapping_add(1);
    let off = (*seq % 256) as usize;
    pattern.slice(off..off + n)
}

fn gen_duration(c: &mut Cursor<'_>) -> Duration {
    match c.u8() % 12 {
        0 => Duration::ZERO,
        1 => Duration::from_millis(1),
        2 => Duration::from_millis(999),
        3 => Duration::from_secs(1),
        4 => Duration::from_secs(5),
        5 => Duration::from_millis(19_999),
        6 => Duration::from_secs(20),
        7 => Duration::from_millis(20_001),
        8 => Duration::from_secs(40),
        9 => Duration::from_secs(3600),
        10 => Duration::from_millis(u64::from(c.u16())),
        _ => Duration::from_millis(u64::from(c.u32())),
    }
}

fn gen_keepalive(c: &mut Cursor<'_>, default: Option<KeepaliveConfig>) -> Option<KeepaliveConfig> {
    match c.u8() % 4 {
        0 => None,
        1 => Some(KeepaliveConfig::default()),
        2 => Some(KeepaliveConfig {
            interval: Duration::from_secs(1 + u64::from(c.u8() % 30)),
            timeout: Duration::from_secs(1 + u64::from(c.u8() % 30)),
        }),
        _ => default,
    }
}

/// A chunk for `id` of exactly the message limit (1 MiB + 4 bytes).
fn max_binary(id: StreamId) -> Message {
    let mut v = vec![0x5a; MAX_MESSAGE_LEN];
    v[..4].copy_from_slice(&id.get().to_be_bytes());
    Message::Binary(v.into())
}

/// One byte over the limit: refused on its length alone.
fn oversize_binary() -> Message {
    static BIG: OnceLock<Bytes> = OnceLock::new();
    Message::Binary(
        BIG.get_or_init(|| vec![0x5a; MAX_MESSAGE_LEN + 1].into())
            .clone(),
    )
}

/// A valid frame padded with spaces to `len` bytes (decodes if within the
/// limit; parsing 1 MiB of JSON is slow, so the fuzzer gets it rarely).
fn padded_text(len: usize) -> Message {
    static TEXTS: OnceLock<[String; 2]> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        [MAX_MESSAGE_LEN, MAX_MESSAGE_LEN + 1].map(|len| {
            let mut s = String::from(r#"{"type":"end","id":1}"#);
            let pad = len - s.len();
            s.push_str(&" ".repeat(pad));
            s
        })
    });
    Message::Text(texts[usize::from(len > MAX_MESSAGE_LEN)].clone())
}

/// Miscellaneous peer messages shared by both machines (`id` is a plausible
/// id for the frames that take one).
fn gen_misc_message(c: &mut Cursor<'_>, id: StreamId, last_ping: Option<&Bytes>) -> Message {
    match c.u8() % 15 {
        0 => Message::Text(format!(r#"{{"type":"window_update","id":{id}}}"#)),
        1 => Message::Text(String::from_utf8_lossy(c.short_bytes(64)).into_owned()),
        2 => Message::Binary(Bytes::copy_from_slice(c.short_bytes(64))),
        3 => Message::Ping(Bytes::copy_from_slice(c.short_bytes(8))),
        4 => Message::Pong(last_ping.cloned().unwrap_or_default()),
        5 => Message::Pong(Bytes::copy_from_slice(c.short_bytes(8))),
        6 => Message::Close(None),
        7 => match c.u8() % 16 {
            0..=5 => oversize_binary(),
            6..=11 => padded_text(MAX_MESSAGE_LEN + 1),
            12..=14 => max_binary(id),
            _ => padded_text(MAX_MESSAGE_LEN),
        },
        8 => {
            // A `request` whose id is usable and one other field is not.
            let bad = c.pick(&[
                r#""method":"GET","path":"nope""#,
                r#""method":"G T","path":"/""#,
                r#""path":"/""#,
                r#""method":"GET","path":"/","headers":[["a","x\r\ny"]]"#,
                r#""method":"GET","path":"/","query":7"#,
                r#""method":"GET","path":"/","headers":{"a":"b"}"#,
            ]);
            match c.u8() % 4 {
                0 => over_limit_head("request", id, c.u8()),
                _ => Message::Text(format!(r#"{{"type":"request","id":{id},{bad}}}"#)),
            }
        }
        13 => {
            // A `response` whose id is usable and one other field is not.
            let bad = c.pick(&[
                r#""status":1000"#,
                r#""status":"200""#,
                r#""status":200,"headers":[["a","x\r\ny"]]"#,
                r#""headers":[]"#,
            ]);
            match c.u8() % 4 {
                0 => over_limit_head("response", id, c.u8()),
                _ => Message::Text(format!(r#"{{"type":"response","id":{id},{bad}}}"#)),
            }
        }
        9 => Message::Text(format!(r#"{{"type":"end","id":{id},"extra":[1,{{}}]}}"#)),
        10 => Message::Text(format!(r#"{{"type":"abort","id":"{id}"}}"#)),
        11 => Message::Text(format!(r#"{{"type":"end","id":{id}.5}}"#)),
        12 => Message::Binary(Bytes::copy_from_slice(&id.get().to_be_bytes()[..3])),
        _ => Message::Text(format!(r#"{{"type":"END","id":{id}}}"#)),
    }
}

/// A well-formed head over a default [`HeadLimits`] bound: 101 headers, a
/// 64 KiB header, a 9 KiB target or a 40-byte method.
fn over_limit_head(ty: &str, id: StreamId, which: u8) -> Message {
    let headers = match which % 4 {
        0 => (0..101)
            .map(|i| format!(r#"["x-{i}","v"]"#))
            .collect::<Vec<_>>(),
        _ => vec![format!(r#"["x-big","{}"]"#, "v".repeat(64 << 10))],
    };
    let headers = headers.join(",");
    let rest = match (ty, which % 4) {
        ("response", _) => format!(r#""status":200,"headers":[{headers}]"#),
        (_, 2) => format!(r#""method":"GET","path":"/{}""#, "p".repeat(9 << 10)),
        (_, 3) => format!(r#""method":"{}","path":"/""#, "M".repeat(40)),
        _ => format!(r#""method":"GET","path":"/","headers":[{headers}]"#),
    };
    Message::Text(format!(r#"{{"type":"{ty}","id":{id},{rest}}}"#))
}

/// What a peer message means to the machine that reads it, classified with
/// the crate's own decoder (as the machine sees it).
#[derive(Debug)]
enum Class {
    /// A request; `Err(status)` when the worker refuses it itself (a
    /// malformed or over-limit head with a usable id).
    Request(StreamId, Result<RequestHead, u16>),
    Response(StreamId, ResponseHead),
    /// A `response` with a usable id whose head is malformed or over a limit.
    BadResponse(StreamId),
    End(StreamId),
    Abort(StreamId),
    Chunk(StreamId, Bytes),
    TooLarge,
    Close,
    Other,
}

fn classify(msg: &Message, worker_side: bool, limits: &HeadLimits) -> Class {
    let decoded = match msg {
        Message::Close(_) => return Class::Close,
        Message::Ping(_) | Message::Pong(_) => return Class::Other,
        Message::Text(t) => frame::decode_text_limited(t, limits),
        Message::Binary(b) => frame::decode_binary(b.clone()),
    };
    match decoded {
        Ok(Decoded::Control(ControlFrame::Request { id, head })) => Class::Request(id, Ok(head)),
        Ok(Decoded::Control(ControlFrame::Response { id, head })) => Class::Response(id, head),
        Ok(Decoded::Control(ControlFrame::End { id })) => Class::End(id),
        Ok(Decoded::Control(ControlFrame::Abort { id })) => Class::Abort(id),
        Ok(Decoded::Chunk(ch)) => Class::Chunk(ch.id, ch.data),
        Ok(Decoded::Unknown) => Class::Other,
        Err(FrameError::TooLarge { .. }) => Class::TooLarge,
        // Not JSON to the crate's parser (a repeated field): ignored.
        Err(FrameError::InvalidJson(_)) => Class::Other,
        Err(e) => match msg {
            // The worker answers 400 (431/414 over a limit) to a `request`
            // whose id is usable but whose other fields are not: to the
            // relay's view it is a request.
            Message::Text(t) => match (bad_frame_id(t, "request"), bad_frame_id(t, "response")) {
                (Some(id), _) if worker_side => Class::Request(
                    id,
                    Err(match e {
                        FrameError::HeadOverLimit(l) => l.status(),
                        _ => 400,
                    }),
                ),
                (_, Some(id)) if !worker_side => Class::BadResponse(id),
                _ => Class::Other,
            },
            _ => Class::Other,
        },
    }
}

/// The id of a frame of type `ty` that did not decode, if the id is usable.
fn bad_frame_id(text: &str, ty: &str) -> Option<StreamId> {
    let serde_json::Value::Object(obj) = serde_json::from_str::<serde_json::Value>(text).ok()?
    else {
        return None;
    };
    if obj.get("type").and_then(|t| t.as_str()) != Some(ty) {
        return None;
    }
    obj.get("id")
        .and_then(|v| v.as_u64())
        .and_then(|v| u32::try_from(v).ok())
        .and_then(StreamId::new)
}

// =====================================================================
// frame_decode
// =====================================================================

/// Decodes `data` as a text message and as a binary message, and builds a
/// frame from it: no panic; every frame that decodes re-encodes and decodes
/// to the same value; a decoded chunk re-encodes to the same bytes; every
/// error names a close code (1009 only for a message over the limit).
pub fn frame_decode(data: &[u8]) {
    // As a text message.
    let text = String::from_utf8_lossy(data);
    let res = frame::decode_text(&text);
    check_decoded(&res, text.len());
    if let Ok(d) = &res {
        if let Some(msg) = d.to_message() {
            assert_eq!(frame::decode(&msg).expect("a data message").as_ref(), Ok(d));
        }
    }

    // As a binary message.
    let bytes = Bytes::copy_from_slice(data);
    let res = frame::decode_binary(bytes.clone());
    check_decoded(&res, bytes.len());
    match &res {
        Ok(Decoded::Chunk(ch)) => {
            assert_eq!(ch.encode(), bytes, "a chunk re-encodes to its bytes");
            assert_eq!(ch.data.len() + 4, data.len());
            assert!(ch.data.len() <= MAX_CHUNK_BODY);
            let msg = Message::Binary(bytes.clone());
            assert_eq!(frame::decode(&msg), Some(Ok(Decoded::Chunk(ch.clone()))));
        }
        Ok(other) => panic!("a binary message decoded to {other:?}"),
        Err(_) => {}
    }

    // As the recipe of a frame: encode, decode, compare.
    let mut c = Cursor::new(data);
    let id = StreamId::new(c.u32()).unwrap_or(StreamId::MIN);
    let frame = match c.u8() % 4 {
        0 => ControlFrame::Request {
            id,
            head: gen_request_head(&mut c),
        },
        1 => ControlFrame::Response {
            id,
            head: gen_response_head(&mut c),
        },
        2 => ControlFrame::End { id },
        _ => ControlFrame::Abort { id },
    };
    let enc = frame.encode();
    assert_eq!(
        frame::decode_text(&enc),
        Ok(Decoded::Control(frame.clone())),
        "{enc}"
    );
    let chunk = frame::Chunk {
        id,
        data: Bytes::copy_from_slice(c.bytes(usize::MAX)),
    };
    assert_eq!(
        frame::decode_binary(chunk.encode()),
        Ok(Decoded::Chunk(chunk))
    );
}

fn check_decoded(res: &Result<Decoded, FrameError>, len: usize) {
    match res {
        Ok(Decoded::Control(c)) => {
            assert!(len <= MAX_MESSAGE_LEN);
            let enc = c.encode();
            assert_eq!(
                frame::decode_text(&enc),
                Ok(Decoded::Control(c.clone())),
                "re-encoded as {enc}"
            );
            assert_eq!(c.encode(), enc, "encoding is deterministic");
            assert_eq!(c.to_message(), Message::Text(enc));
            let headers = match c {
                ControlFrame::Request { head, .. } => {
                    assert!(head.path().starts_with('/'));
                    assert!(head.target().starts_with(head.path()));
                    Some(head.headers())
                }
                ControlFrame::Response { head, .. } => {
                    assert!((100..=999).contains(&head.status()));
                    Some(head.headers())
                }
                _ => None,
            };
            if let Some(h) = headers {
                // Every value is Latin-1: `iter_raw` must not panic, and the
                // bytes decode back to the same text.
                for ((n, v), (rn, rv)) in h.iter().zip(h.iter_raw()) {
                    assert_eq!(n.as_bytes(), rn);
                    assert_eq!(frame::latin1_to_string(&rv), v);
                    assert!(frame::check_header(n, v, 0).is_ok());
                }
                let _ = h.content_length();
                let kept = h.without_hop_by_hop();
                assert!(kept.iter().all(|(n, _)| !frame::is_hop_by_hop_name(n)));
            }
        }
        Ok(Decoded::Chunk(_)) | Ok(Decoded::Unknown) => {}
        Err(e) => {
            let code = e.close_code();
            let too_large = matches!(e, FrameError::TooLarge { .. });
            assert_eq!(code == CloseCode::MESSAGE_TOO_BIG, too_large, "{e:?}");
            assert_eq!(too_large, len > MAX_MESSAGE_LEN, "{e:?} for {len} bytes");
            assert!(
                [1002, 1007, 1009].contains(&code.0),
                "{e:?} closes with {code:?}"
            );
            assert!(!e.kind().is_empty());
            assert!(!e.to_string().is_empty());
        }
    }
}

// =====================================================================
// handshake_and_url
// =====================================================================

const WORKER_IDS: &[&str] = &[
    "abc", "other", "w-1", "W_2", "..", "a.b", "%61bc", "a/b", "",
];
const TOKENS: &[&str] = &["s3cret", "0ther", "tok", "Bearer", "a b", "", "x\u{e9}"];

/// The relay's handshake decision and its URL mapping on arbitrary input,
/// against the spec's rules: `decide_upgrade` agrees with a plain reading of
/// the rules (400 without the subprotocol; 401 for a missing, repeated,
/// malformed or unknown token; else 101 naming the token's worker); a
/// refusal never shows a token; a mapped worker id is one segment of
/// `[A-Za-z0-9_-]` (no `/`, `.` or `%`), the path after it has no dot
/// segment, and target = prefix + id + path + query. Also the worker's
/// `Verdict` on a handshake answer, and `Backoff` bounds.
pub fn handshake_and_url(data: &[u8]) {
    let mut c = Cursor::new(data);

    // --- the token table
    let mut table = TokenTable::new();
    let mut entries: Vec<(WorkerId, String)> = Vec::new();
    for _ in 0..c.u8() % 5 {
        let id = match c.u8() % 3 {
            0 => String::from_utf8_lossy(c.short_bytes(12)).into_owned(),
            _ => c.pick(WORKER_IDS).to_owned(),
        };
        let token = match c.u8() % 3 {
            0 => String::from_utf8_lossy(c.short_bytes(12)).into_owned(),
            _ => c.pick(TOKENS).to_owned(),
        };
        let (Ok(id), Ok(tok)) = (WorkerId::new(id.clone()), Token::new(token.clone())) else {
            if let Ok(w) = WorkerId::new(id.clone()) {
                check_worker_id(w.as_str());
            }
            continue;
        };
        check_worker_id(id.as_str());
        assert!(!format!("{tok:?}").contains(&token) || "Token(<redacted>)".contains(&token));
        let shared = entries.iter().any(|(w, t)| *w != id && *t == token);
        match table.insert(id.clone(), tok) {
            Ok(_) => {
                assert!(!shared, "two workers share a token");
                match entries.iter_mut().find(|(w, _)| *w == id) {
                    Some(e) => e.1 = token,
                    None => entries.push((id, token)),
                }
            }
            Err(_) => assert!(shared, "insert refused without a shared token"),
        }
    }
    assert_eq!(table.len(), entries.len());
    let mut twin = TokenTable::new();
    for (i, (w, _)) in entries.iter().enumerate() {
        twin.insert(w.clone(), Token::new(format!("twin{i}")).expect("valid"))
            .expect("distinct tokens");
    }
    assert_eq!(
        format!("{table:?}"),
        format!("{twin:?}"),
        "Debug shows tokens"
    );
    for (w, t) in &entries {
        assert_eq!(table.lookup(t), Some(w));
        assert!(table.contains(w.as_str()));
    }

    // --- an upgrade request
    let mut headers: Vec<(String, String)> = Vec::new();
    for _ in 0..c.u8() % 6 {
        let name = match c.u8() % 6 {
            0 => "Sec-WebSocket-Protocol".to_owned(),
            1 => "sec-websocket-protocol".to_owned(),
            2 => "Authorization".to_owned(),
            3 => "AUTHORIZATION".to_owned(),
            4 => "Upgrade".to_owned(),
            _ => String::from_utf8_lossy(c.short_bytes(8)).into_owned(),
        };
        let token = match c.u8() % 2 {
            0 if !entries.is_empty() => entries[usize::from(c.u8()) % entries.len()].1.clone(),
            _ => c.pick(TOKENS).to_owned(),
        };
        let value = match c.u8() % 9 {
            0 => SUBPROTOCOL.to_owned(),
            1 => format!("chat, {SUBPROTOCOL}"),
            2 => format!("{SUBPROTOCOL}x"),
            3 => format!("Bearer {token}"),
            4 => format!("bearer   {token} "),
            5 => format!("Basic {token}"),
            6 => token,
            7 => format!("\t{SUBPROTOCOL} ,,"),
            _ => String::from_utf8_lossy(c.short_bytes(24)).into_owned(),
        };
        headers.push((name, value));
    }
    let decision = decide_upgrade(&table, headers.iter().map(|(n, v)| (n, v)));
    let expected = expected_upgrade(&entries, &headers);
    match (&decision, &expected) {
        (Ok(a), Ok(w)) => {
            assert_eq!(a.worker(), w);
            assert_eq!(a.status(), 101);
            assert_eq!(
                a.response_headers(),
                [(SEC_WEBSOCKET_PROTOCOL, SUBPROTOCOL)]
            );
        }
        (Err(r), Err(e)) => {
            assert_eq!(r, e, "{headers:?}");
            let status = r.status();
            assert_eq!(
                status,
                if *r == Rejected::SubprotocolNotOffered {
                    400
                } else {
                    401
                }
            );
            assert_eq!(r.response_headers().is_empty(), status == 400);
            // A refusal carries no token; the table's Debug shows none.
            let shown = format!("{r} {r:?}");
            for (w, t) in &entries {
                assert!(
                    !shown.contains(t.as_str()) || shown_anyway(t),
                    "{w}: {shown}"
                );
            }
        }
        _ => {
            panic!("decide_upgrade gave {decision:?}, the rules give {expected:?} for {headers:?}")
        }
    }

    // --- the worker's verdict on an answer
    let status = c.u16() % 700;
    let verdict = Verdict::from_response(status, headers.iter().map(|(n, v)| (n, v)));
    match status {
        101 => {
            let selected: Vec<&str> = headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(SEC_WEBSOCKET_PROTOCOL))
                .flat_map(|(_, v)| v.split(','))
                .map(|s| s.trim_matches([' ', '\t']))
                .filter(|s| !s.is_empty())
                .collect();
            assert_eq!(verdict == Verdict::Connected, selected == [SUBPROTOCOL]);
            assert_eq!(verdict.is_final(), selected != [SUBPROTOCOL]);
        }
        408 | 429 => assert!(!verdict.is_final()),
        400..=499 => assert!(verdict.is_final()),
        _ => assert!(!verdict.is_final(), "{status} is final"),
    }

    // --- backoff stays within [delay/2, delay] and under the cap
    let mut backoff = Backoff::new(BackoffConfig {
        initial: Duration::from_millis(u64::from(c.u16())),
        max: Duration::from_millis(1 + u64::from(c.u32() % 120_000)),
        multiplier: u32::from(c.u8() % 5),
    });
    for _ in 0..c.u8() % 8 {
        let delay = backoff.current_delay();
        assert!(delay <= backoff.config().max);
        let r = f64::from(c.u32()) / f64::from(u32::MAX);
        let r = if c.u8() == 255 {
            f64::NAN
        } else {
            r * 1.5 - 0.25
        };
        let wait = backoff.next_wait(r);
        assert!(wait >= delay / 2 && wait <= delay, "{wait:?} for {delay:?}");
        if c.u8() % 4 == 0 {
            backoff.reset();
        }
    }

    // --- URL mapping
    let map = match c.u8() % 4 {
        0 => match UrlMap::new(String::from_utf8_lossy(c.short_bytes(8)).into_owned()) {
            Ok(m) => {
                let p = m.prefix();
                assert!(p.starts_with('/') && p.ends_with('/'));
                m
            }
            Err(e) => {
                assert_eq!(e, UrlError::InvalidPrefix);
                UrlMap::default()
            }
        },
        1 => UrlMap::new("/").expect("`/` is a valid prefix"),
        _ => UrlMap::default(),
    };
    let target = match c.u8() % 3 {
        0 => String::from_utf8_lossy(c.short_bytes(48)).into_owned(),
        _ => {
            let mut t = map.prefix().to_owned();
            let id = c.pick(WORKER_IDS);
            t.push_str(id);
            for _ in 0..c.u8() % 5 {
                t.push_str(c.pick(&[
                    "/", "\\", "/.", "/..", "/%2e", "/%2E%2e", "/x", "/.x", "..", "%", "?",
                    "?a=1/../", "#",
                ]));
            }
            t
        }
    };
    match map.map(&target) {
        Ok(route) => {
            let id = route.worker.as_str();
            check_worker_id(id);
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            assert_eq!(route.query, query);
            let rest = path
                .strip_prefix(map.prefix())
                .and_then(|r| r.strip_prefix(id))
                .expect("target = prefix + id + rest");
            assert!(rest.is_empty() || rest.starts_with('/'), "{target}");
            assert_eq!(route.path, if rest.is_empty() { "/" } else { rest });
            for seg in route.path.split(['/', '\\']) {
                let lower = seg.to_ascii_lowercase().replace("%2e", ".");
                assert!(lower != "." && lower != "..", "dot segment in {target}");
            }
            assert_eq!(
                map.worker_path(&route.worker),
                format!("{}{id}", map.prefix())
            );
            let head = route
                .request_head("GET", &Headers::new())
                .expect("a mapped route makes a valid request head");
            assert_eq!((head.path(), head.query()), (route.path, route.query));
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// A worker id is one segment of `[A-Za-z0-9_-]`: no `/`, `.`, `%`.
fn check_worker_id(id: &str) {
    assert!(!id.is_empty() && id.len() <= WorkerId::MAX_LEN, "{id:?}");
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "worker id {id:?}"
    );
}

/// Whether `token` is part of a refusal's fixed wording anyway.
fn shown_anyway(token: &str) -> bool {
    const FIXED: &str = "the worker presented no token the Authorization header is not a \
        single bearer token the worker presented an unknown token the worker did not offer \
        the strata-worker-connect.v1 subprotocol SubprotocolNotOffered MissingToken \
        MalformedAuthorization UnknownToken";
    FIXED.contains(token)
}

/// The spec's rules for the relay's handshake decision, read plainly.
fn expected_upgrade(
    entries: &[(WorkerId, String)],
    headers: &[(String, String)],
) -> Result<WorkerId, Rejected> {
    let offered = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-protocol"))
        .flat_map(|(_, v)| v.split(','))
        .any(|p| p.trim_matches([' ', '\t']) == SUBPROTOCOL);
    if !offered {
        return Err(Rejected::SubprotocolNotOffered);
    }
    let auths: Vec<&str> = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.as_str())
        .collect();
    let value = match auths[..] {
        [] => return Err(Rejected::MissingToken),
        [one] => one.trim_matches([' ', '\t']),
        _ => return Err(Rejected::MalformedAuthorization),
    };
    let Some((scheme, rest)) = value.split_once(' ') else {
        return Err(Rejected::MalformedAuthorization);
    };
    let token = rest.trim_start_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.contains([' ', '\t']) {
        return Err(Rejected::MalformedAuthorization);
    }
    entries
        .iter()
        .find(|(_, t)| t == token)
        .map(|(w, _)| w.clone())
        .ok_or(Rejected::UnknownToken)
}

// =====================================================================
// A model of one incoming body (what the application may read)
// =====================================================================

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BState {
    Open,
    Ended,
    Gone,
    Discarding,
}

/// The chunks received and not read yet, and whether more may come.
#[derive(Debug)]
struct BodyModel {
    state: BState,
    held: VecDeque<Bytes>,
    bytes: usize,
}

impl BodyModel {
    fn new() -> BodyModel {
        BodyModel {
            state: BState::Open,
            held: VecDeque::new(),
            bytes: 0,
        }
    }
    fn push(&mut self, data: Bytes) {
        if self.state == BState::Open && !data.is_empty() {
            self.bytes += data.len();
            self.held.push_back(data);
        }
    }
    fn end(&mut self) {
        if matches!(self.state, BState::Open | BState::Discarding) {
            self.state = BState::Ended;
        }
    }
    fn clear(&mut self) {
        self.held.clear();
        self.bytes = 0;
    }
    fn fail(&mut self) {
        self.state = BState::Gone;
        self.clear();
    }
    fn fail_after_data(&mut self) {
        if self.state != BState::Discarding {
            self.state = BState::Gone;
        }
    }
    fn discard(&mut self) {
        if self.state == BState::Open {
            self.state = BState::Discarding;
        }
        self.clear();
    }
    /// Checks one `read_body` result against the model, and applies it.
    fn read(&mut self, got: &BodyRead, who: &str) {
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

/// Takes `data` off the front of the bytes the application queued; false if
/// they differ (or there are not that many).
fn consume(out: &mut VecDeque<Bytes>, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        let Some(front) = out.front_mut() else {
            return false;
        };
        let n = front.len().min(data.len());
        if front[..n] != data[..n] {
            return false;
        }
        data = &data[n..];
        let _ = front.split_to(n);
        if front.is_empty() {
            out.pop_front();
        }
    }
    true
}

/// A message for a trace line: frames in full, chunks by id and length.
fn short(m: &Message) -> String {
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

fn short_read(r: &BodyRead) -> String {
    match r {
        BodyRead::Data(d) => format!("Data({} bytes)", d.len()),
        other => format!("{other:?}"),
    }
}

fn close_code_of(m: &Message) -> Option<(u16, usize)> {
    match m {
        Message::Close(Some(f)) => Some((f.code.0, f.reason.len())),
        _ => None,
    }
}

const APP_CLOSE_CODES: &[u16] = &[1000, 1001, 1011, 4000];

// =====================================================================
// worker_machine
// =====================================================================

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resp {
    NotStarted,
    Started,
    Finished,
}

/// The application's view of one worker request.
#[derive(Debug)]
struct WKey {
    id: StreamId,
    ended: Option<WorkerEnd>,
    body: BodyModel,
    resp: Resp,
    head: Option<ResponseHead>,
    /// `fail` before the response: the worker answers 500 itself.
    fail_before: bool,
    /// `fail` (or a short Content-Length) after the response started.
    failed: bool,
    cl: Option<u64>,
    sent: u64,
    /// Response bytes taken by `send_body` and not on the wire yet.
    out: VecDeque<Bytes>,
    wire_opened: bool,
    /// The request is a HEAD.
    head_request: bool,
    /// The request's Content-Length and the body bytes received while read.
    req_cl: Option<u64>,
    received: u64,
    /// The response has no body (HEAD, 204, 304): body bytes are swallowed.
    bodiless: bool,
}

/// A response open on the wire (between its `response` and its `end`/`abort`).
#[derive(Debug)]
struct WWire {
    owner: Option<StreamKey>,
    cl: Option<u64>,
    sent: u64,
    /// No body may follow (a response to HEAD, a 204 or 304 of the app).
    bodiless: bool,
}

struct WorkerHarness {
    w: WorkerConnection,
    cfg: WorkerConfig,
    now: Instant,
    seq: u32,
    // The relay's view: what it asked for on the wire.
    alive: BTreeSet<StreamId>,
    pending: BTreeMap<StreamId, u32>,
    tainted: BTreeSet<StreamId>,
    sent_heads: BTreeMap<StreamId, RequestHead>,
    just_requested: Option<StreamId>,
    wire: BTreeMap<StreamId, WWire>,
    // The application's view.
    keys: BTreeMap<StreamKey, WKey>,
    live_by_id: BTreeMap<StreamId, StreamKey>,
    /// The requests not ended yet (what the checks after each step look at).
    live_keys: BTreeSet<StreamKey>,
    /// Ids the worker answers itself (400, 503) whose `end` has not gone out.
    refusals: BTreeSet<StreamId>,
    /// Ids whose request body broke its Content-Length: an `abort` is due.
    proto_aborts: BTreeSet<StreamId>,
    protocol_errors: u64,
    expect_end: BTreeMap<StreamKey, WorkerEnd>,
    closed: bool,
    close_sent: bool,
    expect_close: Option<u16>,
    last_ping: Option<Bytes>,
    bytes_in: u64,
    bytes_out: u64,
    requests_seen: u64,
    ended_seen: u64,
}

/// Drives a [`WorkerConnection`] with an arbitrary sequence of operations —
/// messages from the relay (mostly well-formed frames, some garbage, pings,
/// pongs, closes, oversized messages), application commands (`respond`,
/// `send_body`, `finish`, `fail`, `read_body`, `discard_body`, `close`),
/// connection loss, virtual time moving forward and partial drains of
/// `poll_transmit` — and checks after every step:
///
/// - every emitted message is at most 1 MiB + 4 bytes and a valid frame the
///   worker may send (never a `request` or a pong), nothing after a close;
/// - a `response` only for a request the relay sent and has not aborted, at
///   most one per request; no chunk, `end` or `abort` for a stream after its
///   `end`/`abort` (the worker's or the relay's); chunk bytes are exactly
///   what the application queued, in order; `end` carries exactly the
///   Content-Length; the 500/400/503 answers are well-formed;
/// - unread chunks per request ≤ `max_unread_chunks` (≤ 16), unread bytes as
///   `stats()` reports them, refusals (400/503) waiting to go out ≤
///   [`MAX_PENDING_REFUSALS`]; `wants_read()` exactly when no bound is
///   reached, `ReadPaused` exactly when `wants_read()` was false;
/// - `read_body` returns exactly the bytes the relay sent, then the right end;
/// - command results follow the documented rules; `send_body` takes
///   `min(len, send_capacity)`; queued output within its bounds;
/// - events: a `Request` per request accepted with its head unchanged, fresh
///   keys, and `Ended` exactly once per request with the right reason.
///
/// At the end the connection is lost and every request must have ended.
pub fn worker_machine(data: &[u8]) {
    let mut c = Cursor::new(data);
    let mut h = WorkerHarness::new(&mut c);
    let mut steps = 0;
    while !c.is_empty() && steps < MAX_STEPS {
        h.step(&mut c);
        steps += 1;
    }
    h.finish();
}

impl WorkerHarness {
    fn new(c: &mut Cursor<'_>) -> WorkerHarness {
        let f = c.u8();
        let mut cfg = WorkerConfig::default();
        if f & 1 == 1 {
            let m = c.u8();
            cfg.max_streams = 1 + usize::from(m % 8);
            cfg.reserved_streams = usize::from(m / 8 % 4);
            cfg.max_unread_chunks = 1 + usize::from(c.u8() % 16);
            cfg.max_unread_bytes = 1 + usize::from(c.u16());
            cfg.max_queued_per_stream = usize::from(c.u16());
            cfg.max_queued = usize::from(c.u16());
            cfg.chunk_size = usize::from(c.u16() % 2048);
        }
        if f & 2 == 2 {
            cfg.keepalive = gen_keepalive(c, cfg.keepalive);
        }
        let now = base_instant();
        let mut w = WorkerConnection::new(cfg.clone());
        w.handle_timeout(now);
        WorkerHarness {
            w,
            cfg,
            now,
            seq: 0,
            alive: BTreeSet::new(),
            pending: BTreeMap::new(),
            tainted: BTreeSet::new(),
            sent_heads: BTreeMap::new(),
            just_requested: None,
            wire: BTreeMap::new(),
            keys: BTreeMap::new(),
            live_by_id: BTreeMap::new(),
            live_keys: BTreeSet::new(),
            refusals: BTreeSet::new(),
            proto_aborts: BTreeSet::new(),
            protocol_errors: 0,
            expect_end: BTreeMap::new(),
            closed: false,
            close_sent: false,
            expect_close: None,
            last_ping: None,
            bytes_in: 0,
            bytes_out: 0,
            requests_seen: 0,
            ended_seen: 0,
        }
    }

    fn chunk_limit(&self) -> usize {
        self.cfg.chunk_size.clamp(1, MAX_CHUNK_BODY)
    }

    fn alive_ids(&self) -> Vec<StreamId> {
        self.alive.iter().copied().collect()
    }

    /// A key for a command: mostly a live one, sometimes any issued one,
    /// rarely one never issued.
    fn pick_key(&self, c: &mut Cursor<'_>) -> StreamKey {
        let b = c.u8();
        let live = &self.live_keys;
        if b < 200 && !live.is_empty() {
            return *live
                .iter()
                .nth(usize::from(b) % live.len())
                .expect("in range");
        }
        if b < 250 && !self.keys.is_empty() {
            let i = usize::from(c.u8()) % self.keys.len();
            return *self.keys.keys().nth(i).expect("in range");
        }
        let next = self.keys.keys().next_back().map_or(1, |k| k.get() + 1);
        StreamKey::from_raw_for_tests(if b & 1 == 0 {
            0
        } else {
            next + u64::from(c.u8())
        })
    }

    fn is_unknown(&self, key: StreamKey) -> bool {
        !self.keys.contains_key(&key)
    }

    /// The result of a command on a key the application never saw: refused,
    /// or (for a key the worker used for its own answers) swallowed.
    fn check_unknown<T: PartialEq + std::fmt::Debug>(
        key: StreamKey,
        got: &Result<T, StreamError>,
        swallowed: T,
    ) {
        let refused = got == &Err(StreamError::UnknownStream);
        assert!(
            refused || (key.get() != 0 && got == &Ok(swallowed)),
            "command on unknown key {key:?}: {got:?}"
        );
    }

    fn step(&mut self, c: &mut Cursor<'_>) {
        self.just_requested = None;
        match c.u8() % 24 {
            // ----- the relay's frames
            0..=2 => {
                let id = self.fresh_id(c);
                let head = gen_request_head(c);
                self.feed(ControlFrame::Request { id, head }.to_message());
            }
            3..=5 => {
                let id = gen_id(c, &self.alive_ids());
                let body = gen_body(c, &mut self.seq);
                self.feed(Message::Binary(frame::encode_chunk(id, &body)));
            }
            6 => {
                let id = gen_id(c, &self.alive_ids());
                self.feed(ControlFrame::End { id }.to_message());
            }
            7 => {
                let id = gen_id(c, &self.alive_ids());
                self.feed(ControlFrame::Abort { id }.to_message());
            }
            8 => {
                let id = gen_id(c, &self.alive_ids());
                let msg = match c.u8() % 3 {
                    0 => ControlFrame::Response {
                        id,
                        head: gen_response_head(c),
                    }
                    .to_message(),
                    1 => {
                        // A second request for a stream in flight (a relay bug).
                        ControlFrame::Request {
                            id,
                            head: gen_request_head(c),
                        }
                        .to_message()
                    }
                    _ => gen_misc_message(c, id, self.last_ping.as_ref()),
                };
                self.feed(msg);
            }
            // ----- the application
            9 | 10 => {
                let key = self.pick_key(c);
                let head = gen_response_head(c);
                self.respond(key, head);
            }
            11..=13 => {
                let key = self.pick_key(c);
                let data = gen_body(c, &mut self.seq);
                self.send_body(key, data);
            }
            14 => {
                let key = self.pick_key(c);
                self.finish_cmd(key);
            }
            15 => {
                let key = self.pick_key(c);
                self.fail(key);
            }
            16 | 17 => {
                let key = self.pick_key(c);
                for _ in 0..1 + c.u8() % 20 {
                    self.read(key);
                }
            }
            18 => {
                let key = self.pick_key(c);
                self.w.discard_body(key);
                trace!("worker app: discard_body({key:?})");
                if let Some(k) = self.keys.get_mut(&key).filter(|k| k.ended.is_none()) {
                    k.body.discard();
                }
            }
            19 => match c.u8() % 8 {
                0 => {
                    let code = c.pick(APP_CLOSE_CODES);
                    self.w.close(CloseCode(code), "app closes");
                    trace!("worker app: close({code})");
                    if !self.closed {
                        self.expect_close = Some(code);
                    }
                }
                1 => {
                    trace!("worker: handle_lost");
                    self.w.handle_lost();
                }
                _ => self.advance(c),
            },
            20 => self.advance(c),
            // ----- the socket takes messages
            _ => {
                let n = match c.u8() {
                    0..=127 => 1 + usize::from(c.u8() % 8),
                    _ => usize::MAX,
                };
                self.transmit(n);
            }
        }
        self.after_step();
    }

    /// An id for a new request: one not in flight (as a relay picks), rarely
    /// any id.
    fn fresh_id(&self, c: &mut Cursor<'_>) -> StreamId {
        let b = c.u8();
        if b >= 240 {
            return StreamId::new(c.u32()).unwrap_or(StreamId::MAX);
        }
        let mut id = StreamId::new(1 + u32::from(b % 8)).expect("nonzero");
        for _ in 0..64 {
            if !self.alive.contains(&id) && !self.tainted.contains(&id) {
                break;
            }
            id = id.next_wrapping();
        }
        id
    }

    fn advance(&mut self, c: &mut Cursor<'_>) {
        let d = gen_duration(c);
        if c.u8() % 4 == 0 {
            if let Some(t) = self.w.poll_timeout() {
                self.now = self.now.max(t);
            }
        }
        self.now = self.now.checked_add(d).unwrap_or(self.now);
        let was_closed = self.w.is_closed();
        trace!("worker: handle_timeout(+{:?})", self.now - base_instant());
        self.w.handle_timeout(self.now);
        let t = self.w.poll_timeout();
        if let Some(t) = t {
            assert!(
                t > self.now,
                "timer at {t:?} not after now after handle_timeout"
            );
        }
        // Extra calls are harmless.
        self.w.handle_timeout(self.now);
        assert_eq!(self.w.poll_timeout(), t);
        if !was_closed && self.w.is_closed() {
            assert!(
                self.cfg.keepalive.is_some(),
                "closed on a timeout without keepalive"
            );
            self.expect_close = Some(1011);
        }
    }

    /// Feeds one message from the relay and updates the relay's view.
    fn feed(&mut self, msg: Message) {
        let was_closed = self.w.is_closed();
        let wants = self.w.wants_read();
        let is_data = msg.is_data();
        let len = msg.len() as u64;
        let class = classify(&msg, true, &self.cfg.head_limits);
        trace!("relay -> worker: {} = {class:?}", short(&msg));
        let fed = msg.clone();
        let r = self.w.handle_message(msg, self.now);
        if was_closed {
            assert_eq!(r, Ok(()), "a closed worker ignores input");
            return;
        }
        if is_data && !wants {
            assert!(
                matches!(&r, Err(HandleError::ReadPaused(m)) if m == &fed),
                "a paused worker hands the message back: {r:?}"
            );
            return;
        }
        assert_eq!(
            r,
            Ok(()),
            "handle_message refused a message while wants_read"
        );
        if is_data {
            self.bytes_in += len;
        }
        match class {
            Class::TooLarge => {
                assert!(self.w.is_closed(), "an oversized message must close");
                self.expect_close = Some(1009);
            }
            Class::Close => assert!(self.w.is_closed(), "a close must close"),
            Class::Request(id, head) => {
                let live = self.live_keys.len();
                let refused = match &head {
                    Err(_) => true,
                    Ok(h) => {
                        let limit = if is_control_route(h) {
                            self.cfg.max_streams
                        } else {
                            (self.cfg.max_streams)
                                .saturating_sub(self.cfg.reserved_streams)
                                .max(1)
                        };
                        h.headers().content_length().is_err() || live >= limit
                    }
                };
                if !self.live_by_id.contains_key(&id)
                    && !self.refusals.contains(&id)
                    && !self.proto_aborts.contains(&id)
                    && refused
                {
                    // Answered by the worker itself: 400, 431, 414 or 503.
                    self.refusals.insert(id);
                }
                if self.alive.contains(&id) || self.tainted.contains(&id) {
                    // The relay reused an id in flight: no promise holds for it.
                    self.tainted.insert(id);
                } else {
                    self.alive.insert(id);
                    *self.pending.entry(id).or_default() += 1;
                    if let Ok(head) = head {
                        self.sent_heads.insert(id, head);
                    }
                }
                self.just_requested = Some(id);
            }
            Class::End(id) => {
                if let Some(&key) = self.live_by_id.get(&id) {
                    let k = self.keys.get_mut(&key).expect("live key");
                    let short = k.req_cl.is_some_and(|cl| k.received < cl);
                    if k.body.state == BState::Open && short {
                        self.protocol_error(key);
                    } else {
                        k.body.end();
                    }
                }
            }
            Class::Abort(id) => {
                // The relay's stream is over: nothing more may go out for it,
                // not even the worker's own 400/503 answer or `abort`.
                self.refusals.remove(&id);
                self.proto_aborts.remove(&id);
                self.alive.remove(&id);
                self.pending.remove(&id);
                self.wire.remove(&id);
                self.sent_heads.remove(&id);
                if let Some(&k) = self.live_by_id.get(&id) {
                    self.keys.get_mut(&k).expect("live key").body.fail();
                    self.expect_end.insert(k, WorkerEnd::ClientAborted);
                }
            }
            Class::Chunk(id, data) => {
                if let Some(&key) = self.live_by_id.get(&id) {
                    let k = self.keys.get_mut(&key).expect("live key");
                    if k.body.state == BState::Open {
                        k.received += data.len() as u64;
                        if k.req_cl.is_some_and(|cl| k.received > cl) {
                            self.protocol_error(key);
                            return;
                        }
                    }
                    k.body.push(data);
                }
            }
            Class::Response(..) | Class::BadResponse(_) | Class::Other => {}
        }
    }

    /// The model of the worker failing a request whose body broke its
    /// Content-Length: body gone, queued response dropped, `abort` due.
    fn protocol_error(&mut self, key: StreamKey) {
        let k = self.keys.get_mut(&key).expect("live key");
        k.body.fail();
        k.out.clear();
        self.proto_aborts.insert(k.id);
        self.protocol_errors += 1;
        self.expect_end.insert(key, WorkerEnd::ProtocolError);
    }

    fn respond(&mut self, key: StreamKey, head: ResponseHead) {
        let r = self.w.respond(key, head.clone());
        trace!("worker app: respond({key:?}, {}) = {r:?}", head.status());
        if self.is_unknown(key) {
            return Self::check_unknown(key, &r, ());
        }
        let k = self.keys.get_mut(&key).expect("known");
        if k.ended.is_some() {
            assert_eq!(r, Ok(()), "commands on an ended request are swallowed");
            return;
        }
        if k.resp != Resp::NotStarted {
            assert_eq!(r, Err(StreamError::AlreadyResponded));
            return;
        }
        let status = head.status();
        if !(200..=599).contains(&status) {
            assert_eq!(r, Err(StreamError::InvalidHead(FrameError::InvalidStatus)));
            return;
        }
        match head.headers().content_length() {
            Err(_) => assert_eq!(r, Err(StreamError::InvalidContentLength)),
            Ok(cl) => {
                assert_eq!(r, Ok(()));
                k.resp = Resp::Started;
                k.bodiless = k.head_request || status == 204 || status == 304;
                k.cl = if k.bodiless { None } else { cl };
                k.head = Some(head);
            }
        }
    }

    fn send_body(&mut self, key: StreamKey, data: Bytes) {
        let cap = self.w.send_capacity(key);
        assert!(cap <= self.cfg.max_queued_per_stream.max(1));
        assert!(cap <= self.cfg.max_queued.max(1));
        let len = data.len();
        let r = self.w.send_body(key, data.clone());
        trace!("worker app: send_body({key:?}, {len} bytes) = {r:?} (capacity {cap})");
        if self.is_unknown(key) {
            return Self::check_unknown(key, &r, len);
        }
        let k = self.keys.get_mut(&key).expect("known");
        if k.ended.is_some() {
            assert_eq!(r, Ok(len));
            return;
        }
        match k.resp {
            Resp::NotStarted => assert_eq!(r, Err(StreamError::NotResponded)),
            Resp::Finished => assert_eq!(r, Err(StreamError::AlreadyFinished)),
            Resp::Started if k.bodiless => assert_eq!(r, Ok(len), "a bodiless body is swallowed"),
            Resp::Started => match k.cl {
                Some(limit) if k.sent + len as u64 > limit => {
                    assert_eq!(r, Err(StreamError::ContentLengthExceeded { limit }))
                }
                _ => {
                    let n = r.expect("send_body on a started response");
                    assert_eq!(
                        n,
                        len.min(cap),
                        "send_body took {n} of {len}, capacity {cap}"
                    );
                    k.sent += n as u64;
                    if n > 0 {
                        k.out.push_back(data.slice(..n));
                    }
                }
            },
        }
    }

    fn finish_cmd(&mut self, key: StreamKey) {
        let r = self.w.finish(key);
        trace!("worker app: finish({key:?}) = {r:?}");
        if self.is_unknown(key) {
            return Self::check_unknown(key, &r, ());
        }
        let k = self.keys.get_mut(&key).expect("known");
        if k.ended.is_some() {
            assert_eq!(r, Ok(()));
            return;
        }
        match k.resp {
            Resp::NotStarted => assert_eq!(r, Err(StreamError::NotResponded)),
            Resp::Finished => assert_eq!(r, Err(StreamError::AlreadyFinished)),
            Resp::Started => {
                match k.cl.filter(|&cl| k.sent < cl) {
                    Some(expected) => {
                        assert_eq!(
                            r,
                            Err(StreamError::ContentLengthShort {
                                expected,
                                sent: k.sent
                            })
                        );
                        k.failed = true;
                    }
                    None => assert_eq!(r, Ok(())),
                }
                k.resp = Resp::Finished;
                k.body.discard();
            }
        }
    }

    fn fail(&mut self, key: StreamKey) {
        let r = self.w.fail(key);
        trace!("worker app: fail({key:?}) = {r:?}");
        if self.is_unknown(key) {
            return Self::check_unknown(key, &r, ());
        }
        assert_eq!(r, Ok(()));
        let k = self.keys.get_mut(&key).expect("known");
        if k.ended.is_some() {
            return;
        }
        match k.resp {
            Resp::Finished => {}
            Resp::NotStarted => {
                k.resp = Resp::Finished;
                k.fail_before = true;
                k.body.discard();
            }
            Resp::Started => {
                k.resp = Resp::Finished;
                k.failed = true;
                k.body.discard();
            }
        }
    }

    fn read(&mut self, key: StreamKey) {
        let got = self.w.read_body(key);
        trace!("worker app: read_body({key:?}) = {}", short_read(&got));
        match self.keys.get_mut(&key) {
            Some(k) if k.ended.is_none() => k.body.read(&got, "worker"),
            _ => assert_eq!(got, BodyRead::Gone, "read_body of a request not open"),
        }
    }

    fn transmit(&mut self, n: usize) {
        for _ in 0..n {
            let Some(m) = self.w.poll_transmit() else {
                return;
            };
            self.on_emit(m);
        }
    }

    /// Checks one message the worker emitted.
    fn on_emit(&mut self, m: Message) {
        trace!("worker emits {}", short(&m));
        assert!(!self.close_sent, "worker emitted {m:?} after its close");
        assert!(
            m.len() <= MAX_MESSAGE_LEN,
            "worker emitted {} bytes",
            m.len()
        );
        if let Some((code, reason)) = close_code_of(&m) {
            assert!(self.w.is_closed(), "close emitted by an open worker");
            assert_eq!(Some(code), self.expect_close, "worker closed with {code}");
            assert!(reason <= 123, "close reason of {reason} bytes");
            self.close_sent = true;
            return;
        }
        assert!(!self.w.is_closed(), "worker emitted {m:?} while closed");
        self.bytes_out += m.len() as u64;
        let d = match &m {
            Message::Close(None) => panic!("worker closed without a code"),
            Message::Ping(p) => {
                assert!(self.cfg.keepalive.is_some(), "ping without keepalive");
                self.last_ping = Some(p.clone());
                return;
            }
            Message::Pong(_) => panic!("worker emitted a pong"),
            _ => frame::decode(&m)
                .expect("data message")
                .unwrap_or_else(|e| panic!("worker emitted an invalid frame {m:?}: {e}")),
        };
        match d {
            Decoded::Control(ControlFrame::Response { id, head }) => {
                if self.tainted.contains(&id) {
                    return;
                }
                assert!(
                    !self.wire.contains_key(&id),
                    "second response for id {id} while open"
                );
                let p = self.pending.entry(id).or_default();
                assert!(
                    *p > 0,
                    "response for id {id}, which the relay did not request or has aborted"
                );
                *p -= 1;
                let owner = self.live_by_id.get(&id).copied().filter(|k| {
                    let k = &self.keys[k];
                    k.resp != Resp::NotStarted && !k.wire_opened
                });
                let mut bodiless = false;
                match owner {
                    Some(key) => {
                        let k = self.keys.get_mut(&key).expect("live");
                        k.wire_opened = true;
                        if k.fail_before {
                            assert_eq!(head.status(), 500, "a failed request answers 500");
                        } else {
                            assert_eq!(Some(&head), k.head.as_ref(), "response head changed");
                            bodiless = k.bodiless;
                        }
                    }
                    None => {
                        let s = head.status();
                        assert!(
                            [400, 414, 431, 503].contains(&s),
                            "response {s} for id {id} nobody gave"
                        );
                        if s == 503 {
                            assert_eq!(head.headers().get("retry-after"), Some("1"));
                        }
                    }
                }
                let cl = head
                    .headers()
                    .content_length()
                    .expect("valid content-length")
                    .filter(|_| !bodiless);
                self.wire.insert(
                    id,
                    WWire {
                        owner,
                        cl,
                        sent: 0,
                        bodiless,
                    },
                );
            }
            Decoded::Chunk(ch) => {
                let id = ch.id;
                if self.tainted.contains(&id) {
                    return;
                }
                let chunk_limit = self.chunk_limit();
                let ww = self.wire.get_mut(&id).unwrap_or_else(|| {
                    panic!("worker chunk for id {id}, not open (after its end or abort?)")
                });
                assert!(!ch.data.is_empty(), "worker emitted an empty chunk");
                assert!(ch.data.len() <= MAX_CHUNK_BODY);
                assert!(!ww.bodiless, "a body for a response that has none");
                ww.sent += ch.data.len() as u64;
                if let Some(cl) = ww.cl {
                    assert!(ww.sent <= cl, "body longer than its Content-Length {cl}");
                }
                if let Some(key) = ww.owner {
                    let k = self.keys.get_mut(&key).expect("owner");
                    if k.fail_before {
                        assert_eq!(&ch.data[..], b"Internal Server Error");
                    } else {
                        assert!(ch.data.len() <= chunk_limit, "chunk over chunk_size");
                        assert!(
                            consume(&mut k.out, &ch.data),
                            "response bytes on the wire differ from what the app sent"
                        );
                    }
                }
            }
            Decoded::Control(ControlFrame::End { id }) => {
                // An id has a stream or a pending refusal, never both: this
                // `end` completes the refusal if there is one.
                let refusal = self.refusals.remove(&id);
                if self.tainted.contains(&id) {
                    return;
                }
                let ww = self.wire.remove(&id).unwrap_or_else(|| {
                    panic!("worker end for id {id}, not open (after its end or abort?)")
                });
                if let Some(cl) = ww.cl {
                    assert_eq!(ww.sent, cl, "end after {} of {cl} bytes", ww.sent);
                }
                assert_eq!(refusal, ww.owner.is_none(), "end of a refusal not pending");
                self.alive.remove(&id);
                self.sent_heads.remove(&id);
                if let Some(key) = ww.owner {
                    let k = &self.keys[&key];
                    assert_eq!(k.resp, Resp::Finished, "end before the app finished");
                    assert!(!k.failed, "end for a failed response");
                    assert!(k.out.is_empty() || k.fail_before, "end before the body");
                    self.expect_end.insert(key, WorkerEnd::Completed);
                }
            }
            Decoded::Control(ControlFrame::Abort { id }) => {
                let proto = self.proto_aborts.remove(&id);
                if self.tainted.contains(&id) {
                    return;
                }
                if proto {
                    // The relay broke the body's Content-Length: the stream
                    // is over, response or not.
                    self.wire.remove(&id);
                    self.alive.remove(&id);
                    self.pending.remove(&id);
                    self.sent_heads.remove(&id);
                    return;
                }
                let ww = self.wire.remove(&id).unwrap_or_else(|| {
                    panic!("worker abort for id {id}, not open (after its end or abort?)")
                });
                self.alive.remove(&id);
                self.sent_heads.remove(&id);
                let key = ww.owner.expect("the worker aborts only its own responses");
                assert!(
                    self.keys[&key].failed,
                    "abort for a response that did not fail"
                );
                self.expect_end.insert(key, WorkerEnd::Failed);
            }
            other => panic!("worker emitted {other:?}"),
        }
    }

    fn after_step(&mut self) {
        if self.w.is_closed() && !self.closed {
            self.closed = true;
            self.refusals.clear();
            self.proto_aborts.clear();
            for key in &self.live_keys {
                self.expect_end.insert(*key, WorkerEnd::ConnectionLost);
            }
        }
        while let Some(e) = self.w.poll_event() {
            self.on_event(e);
        }
        self.check();
    }

    fn on_event(&mut self, e: WorkerEvent) {
        trace!("worker event {e:?}");
        match e {
            WorkerEvent::Request { key, id, head } => {
                assert!(!self.keys.contains_key(&key), "key {key:?} reused");
                assert!(
                    self.keys.keys().next_back().map_or(true, |k| *k < key),
                    "keys must increase"
                );
                assert_eq!(
                    Some(id),
                    self.just_requested,
                    "Request event without a request"
                );
                if !self.tainted.contains(&id) {
                    assert_eq!(
                        self.sent_heads.get(&id),
                        Some(&head),
                        "the request head changed on its way"
                    );
                }
                assert!(
                    self.live_by_id.insert(id, key).is_none(),
                    "two requests open under id {id}"
                );
                self.requests_seen += 1;
                self.live_keys.insert(key);
                self.keys.insert(
                    key,
                    WKey {
                        id,
                        ended: None,
                        body: BodyModel::new(),
                        resp: Resp::NotStarted,
                        head: None,
                        fail_before: false,
                        failed: false,
                        cl: None,
                        sent: 0,
                        out: VecDeque::new(),
                        wire_opened: false,
                        head_request: head.method() == "HEAD",
                        req_cl: head.headers().content_length().expect("accepted requests"),
                        received: 0,
                        bodiless: false,
                    },
                );
            }
            WorkerEvent::Readable { key } | WorkerEvent::Writable { key } => {
                let k = self.keys.get(&key).expect("event for an unknown key");
                assert!(k.ended.is_none(), "{e:?} after Ended");
            }
            WorkerEvent::Ended { key, reason } => {
                let k = self.keys.get_mut(&key).expect("Ended for an unknown key");
                assert!(k.ended.is_none(), "request ended twice");
                k.ended = Some(reason);
                k.body.clear();
                self.live_keys.remove(&key);
                let id = k.id;
                self.ended_seen += 1;
                let want = self.expect_end.remove(&key);
                if !self.tainted.contains(&id) {
                    assert_eq!(want, Some(reason), "request {key:?} (id {id}) ended");
                }
                if self.live_by_id.get(&id) == Some(&key) {
                    self.live_by_id.remove(&id);
                }
            }
        }
    }

    fn check(&mut self) {
        // Ends of requests under a reused id are not predicted exactly.
        let (tainted, keys) = (&self.tainted, &self.keys);
        self.expect_end
            .retain(|k, _| !tainted.contains(&keys[k].id));
        assert!(
            self.expect_end.is_empty(),
            "missing Ended: {:?}",
            self.expect_end
        );
        let s = self.w.stats();
        let mut held_bytes = 0u64;
        let mut live = 0u64;
        let mut paused = false;
        for k in self.live_keys.iter().map(|key| &self.keys[key]) {
            live += 1;
            held_bytes += k.body.bytes as u64;
            let chunks = k.body.held.len();
            assert!(
                chunks <= self.cfg.max_unread_chunks && chunks <= 16,
                "{chunks} unread chunks held (bound {})",
                self.cfg.max_unread_chunks
            );
            paused |= chunks >= self.cfg.max_unread_chunks;
        }
        assert_eq!(s.body_buffered_in, held_bytes, "unread bytes");
        assert!(s.body_buffered_in < (self.cfg.max_unread_bytes + MAX_CHUNK_BODY) as u64);
        paused |= held_bytes >= self.cfg.max_unread_bytes as u64;
        let pending = self.refusals.len() + self.proto_aborts.len();
        paused |= pending >= MAX_PENDING_REFUSALS;
        assert!(pending <= MAX_PENDING_REFUSALS, "refusals pile up");
        assert_eq!(self.w.wants_read(), !self.closed && !paused, "wants_read");
        assert_eq!(s.streams_open, live, "streams open");
        assert_eq!(s.streams_opened, self.requests_seen);
        assert_eq!(s.streams_closed, self.ended_seen);
        assert_eq!(s.protocol_errors, self.protocol_errors, "protocol errors");
        assert_eq!(s.bytes_in, self.bytes_in);
        assert_eq!(s.bytes_out, self.bytes_out);
        assert!(s.body_queued_out <= self.cfg.max_queued.max(1) as u64);
        assert!(s.body_queued_out_max <= self.cfg.max_queued.max(1) as u64);
        assert!(s.body_buffered_in_max >= s.body_buffered_in);
        if self.closed {
            assert_eq!(live, 0);
            assert_eq!(self.w.poll_timeout(), None);
        }
    }

    fn finish(mut self) {
        // The socket takes everything: every finished or failed response
        // goes out completely.
        self.transmit(usize::MAX);
        self.after_step();
        if !self.closed {
            for (key, k) in &self.keys {
                if self.tainted.contains(&k.id) {
                    continue;
                }
                if k.ended.is_none() && k.resp == Resp::Started {
                    assert!(k.out.is_empty(), "{key:?}: queued body not sent");
                }
                assert!(
                    k.ended.is_some() || k.resp != Resp::Finished,
                    "{key:?}: finished but its end never went out"
                );
            }
        }
        // Then the connection goes: every request ends, nothing more goes out.
        self.w.handle_lost();
        self.transmit(usize::MAX);
        self.after_step();
        assert!(self.w.poll_transmit().is_none());
        for (key, k) in &self.keys {
            assert!(k.ended.is_some(), "{key:?} never ended");
        }
        assert_eq!(self.w.stats().streams_open, 0);
    }
}

// =====================================================================
// relay_machine
// =====================================================================

/// The relay's view of one stream (one caller's request).
#[derive(Debug)]
struct RKey {
    id: StreamId,
    /// The `request` frame's head as it must go out (hop-by-hop headers gone).
    head: RequestHead,
    /// In flight for the relay (its id is taken): `stream_id()` is `Some`.
    live: bool,
    /// The relay still holds the stream (`open_streams()` counts it).
    held: bool,
    /// The application aborted the stream or forgot it: no event may follow.
    forgotten: bool,
    /// The application aborted it while it was in flight: that is its end.
    aborted_live: bool,
    ended: Option<RelayEnd>,
    head_emitted: bool,
    /// The `request` frame must never go out (the stream ended first).
    head_dropped: bool,
    cl: Option<u64>,
    writing: bool,
    finished: bool,
    sent: u64,
    out: VecDeque<Bytes>,
    wire_sent: u64,
    end_emitted: bool,
    abort_expected: bool,
    abort_emitted: bool,
    started: bool,
    /// The response's Content-Length (none for a bodiless response), and
    /// the body bytes received.
    response_length: Option<u64>,
    received: u64,
    /// No response body is expected: a HEAD request, a 204 or 304.
    bodiless: bool,
    /// Since when data has waited for the application unread (or, orphaned,
    /// the worker's `end` has been awaited): the stall deadline's start.
    stall_since: Option<Instant>,
    /// The caller let go of a response complete by its Content-Length
    /// before the worker's `end`, its own request finished: the relay waits
    /// for that `end` quietly (no `abort`, no event; the id stays taken,
    /// `stream_id()` is `None`; what is queued of the request still goes).
    orphaned: bool,
    body: BodyModel,
}

impl RKey {
    fn response_complete(&self) -> bool {
        self.started && (self.bodiless || self.response_length == Some(self.received))
    }
}

struct RelayHarness {
    r: RelayConnection,
    cfg: RelayConfig,
    now: Instant,
    seq: u32,
    keys: BTreeMap<StreamKey, RKey>,
    /// The streams the relay still holds or has in flight (what the checks
    /// after each step look at; a stream leaves once checked gone).
    active: BTreeSet<StreamKey>,
    /// The relay's ids in flight.
    ids_live: BTreeMap<StreamId, StreamKey>,
    /// Ids whose `request` is on the wire and whose stream has not ended on
    /// the wire.
    wire: BTreeMap<StreamId, StreamKey>,
    expect_end: BTreeMap<StreamKey, (RelayEnd, bool)>,
    expect_response: BTreeMap<StreamKey, ResponseHead>,
    closed: bool,
    close_sent: bool,
    expect_close: Option<u16>,
    last_ping: Option<Bytes>,
    bytes_in: u64,
    bytes_out: u64,
    opened: u64,
    ends: u64,
    protocol_errors: u64,
    /// Since when reading has been paused (the read-pause bound's start).
    paused_since: Option<Instant>,
}

/// Drives a [`RelayConnection`] with an arbitrary sequence of operations —
/// callers opening streams (hop-by-hop headers, Content-Lengths), sending
/// body, finishing, going away, reading responses; messages from the worker
/// (responses, chunks, `end`, `abort`, out of order, for unknown ids,
/// garbage, pings, pongs, closes, oversized messages); connection loss;
/// virtual time; partial drains — and checks after every step:
///
/// - stream ids unique among streams in flight (`stream_id()` of live
///   streams distinct; a `request` never goes out under an id still in
///   flight on the wire), the id allocator wrapping past 2³²−1;
/// - every emitted message at most 1 MiB + 4 bytes, a valid frame the relay
///   may send; the `request` head is the caller's minus hop-by-hop headers;
///   chunk bytes are exactly what the caller queued, in order, within
///   `chunk_size`; `end` only after `finish` and the whole body, matching
///   the Content-Length; `abort` only for a stream the caller gave up on or
///   the worker broke; nothing for a stream after its `end`/`abort`;
/// - every stream ends exactly once: one `Ended` event with the reason and
///   `response_started` the worker's frames imply, or the caller's `abort`
///   while it was in flight; no event after the caller's `abort`;
/// - bounds: open streams ≤ `max_streams`, queued body ≤ `max_queued`,
///   `send_body` takes `min(len, send_capacity)`, unread chunks per stream ≤
///   `max_unread_chunks`, unread bytes as `stats()` reports them,
///   `wants_read()` exactly when no bound is reached;
/// - `read_body` returns exactly the bytes the worker sent, then `End`
///   (completed) or `Gone` (failed).
///
/// At the end the connection is lost and every stream must have ended.
pub fn relay_machine(data: &[u8]) {
    let mut c = Cursor::new(data);
    let mut h = RelayHarness::new(&mut c);
    let mut steps = 0;
    while !c.is_empty() && steps < MAX_STEPS {
        h.step(&mut c);
        steps += 1;
    }
    h.finish();
}

const HOP_BY_HOP_NAMES: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

impl RelayHarness {
    fn new(c: &mut Cursor<'_>) -> RelayHarness {
        let f = c.u8();
        let mut cfg = RelayConfig::default();
        if f & 1 == 1 {
            let m = c.u8();
            cfg.max_streams = 1 + usize::from(m % 8);
            cfg.reserved_streams = usize::from(m / 8 % 4);
            cfg.max_unread_chunks = 1 + usize::from(c.u8() % 16);
            cfg.max_unread_bytes = 1 + usize::from(c.u16());
            cfg.max_queued_per_stream = usize::from(c.u16());
            cfg.max_queued = usize::from(c.u16());
            cfg.chunk_size = usize::from(c.u16() % 2048);
        }
        if f & 2 == 2 {
            cfg.keepalive = gen_keepalive(c, cfg.keepalive);
        }
        if f & 8 == 8 {
            // Short deadlines, so stalls and pause bounds fire often.
            cfg.stall_timeout = Duration::from_secs(1 + u64::from(f >> 4));
            cfg.read_pause_timeout = Duration::from_secs(1 + u64::from((f >> 4) % 4));
        }
        let now = base_instant();
        let mut r = RelayConnection::new(cfg.clone());
        if f & 4 == 4 {
            // Start near the top of the id space: the allocator must wrap.
            let top = u32::MAX - u32::from(c.u8() % 4);
            r.__set_next_id(StreamId::new(top).expect("nonzero"));
        }
        r.handle_timeout(now);
        RelayHarness {
            r,
            cfg,
            now,
            seq: 0,
            keys: BTreeMap::new(),
            active: BTreeSet::new(),
            ids_live: BTreeMap::new(),
            wire: BTreeMap::new(),
            expect_end: BTreeMap::new(),
            expect_response: BTreeMap::new(),
            closed: false,
            close_sent: false,
            expect_close: None,
            last_ping: None,
            bytes_in: 0,
            bytes_out: 0,
            opened: 0,
            ends: 0,
            protocol_errors: 0,
            paused_since: None,
        }
    }

    fn chunk_limit(&self) -> usize {
        self.cfg.chunk_size.clamp(1, MAX_CHUNK_BODY)
    }

    /// Whether the relay must pause reading (no overflow in this model).
    fn model_paused(&self) -> bool {
        let mut bytes = 0usize;
        for key in &self.active {
            let k = &self.keys[key];
            if k.held {
                bytes += k.body.bytes;
                if k.body.held.len() >= self.cfg.max_unread_chunks {
                    return true;
                }
            }
        }
        bytes >= self.cfg.max_unread_bytes
    }

    fn track_pause(&mut self) {
        if self.closed || !self.model_paused() {
            self.paused_since = None;
        } else if self.paused_since.is_none() {
            self.paused_since = Some(self.now);
        }
    }

    /// The model of the relay giving up a stream whose application did not
    /// keep up: `abort` if in flight, and its data dropped.
    fn give_up(&mut self, key: StreamKey) {
        let k = self.keys.get_mut(&key).expect("a held stream");
        k.stall_since = None;
        if k.live {
            self.end_on_wire(key, RelayEnd::CallerStalled, true);
        } else {
            k.body.fail();
        }
    }

    /// The model of the deadlines `handle_timeout(now)` runs: stalls in
    /// order of their start, then the read-pause bound.
    fn run_deadlines(&mut self) {
        if self.closed {
            return;
        }
        let stall = self.cfg.stall_timeout;
        let mut due: Vec<(Instant, StreamKey)> = self
            .keys
            .iter()
            .filter_map(|(key, k)| k.stall_since.map(|t| (t, *key)))
            .filter(|(t, _)| t.checked_add(stall).is_some_and(|d| d <= self.now))
            .collect();
        due.sort();
        for (_, key) in due {
            trace!("model: {key:?} stalled");
            self.give_up(key);
        }
        self.track_pause();
        let over = self
            .paused_since
            .and_then(|p| p.checked_add(self.cfg.read_pause_timeout))
            .is_some_and(|d| d <= self.now);
        if over {
            let limit = self.cfg.max_unread_chunks;
            let held: Vec<StreamKey> = self
                .active
                .iter()
                .copied()
                .filter(|k| self.keys[k].held)
                .collect();
            let mut culprits: Vec<StreamKey> = held
                .iter()
                .copied()
                .filter(|k| self.keys[k].body.held.len() >= limit)
                .collect();
            if culprits.is_empty() {
                culprits.extend(
                    held.iter()
                        .copied()
                        .filter(|k| self.keys[k].body.bytes > 0)
                        .max_by_key(|k| (self.keys[k].body.bytes, std::cmp::Reverse(*k))),
                );
            }
            for key in culprits {
                trace!("model: {key:?} holds reading paused too long");
                self.give_up(key);
            }
        }
        self.track_pause();
    }

    fn wire_ids(&self) -> Vec<StreamId> {
        self.wire.keys().copied().collect()
    }

    fn pick_key(&self, c: &mut Cursor<'_>) -> StreamKey {
        let b = c.u8();
        let held = || self.active.iter().filter(|k| self.keys[k].held);
        let n = held().count();
        if b < 200 && n > 0 {
            return *held().nth(usize::from(b) % n).expect("in range");
        }
        if b < 250 && !self.keys.is_empty() {
            let i = usize::from(c.u8()) % self.keys.len();
            return *self.keys.keys().nth(i).expect("in range");
        }
        let next = self.keys.keys().next_back().map_or(1, |k| k.get() + 1);
        StreamKey::from_raw_for_tests(if b & 1 == 0 {
            0
        } else {
            next + u64::from(c.u8())
        })
    }

    fn step(&mut self, c: &mut Cursor<'_>) {
        match c.u8() % 24 {
            // ----- callers
            0..=3 => {
                let head = gen_request_head(c);
                self.open(head);
            }
            4..=6 => {
                let key = self.pick_key(c);
                let data = gen_body(c, &mut self.seq);
                self.send_body(key, data);
            }
            7 | 8 => {
                let key = self.pick_key(c);
                self.finish_cmd(key);
            }
            9 => {
                let key = self.pick_key(c);
                self.r.abort(key);
                trace!("relay app: abort({key:?})");
                self.app_abort(key);
            }
            10 | 11 => {
                let key = self.pick_key(c);
                for _ in 0..1 + c.u8() % 20 {
                    self.read(key);
                }
            }
            // ----- the worker's frames
            12 | 13 => {
                let id = gen_id(c, &self.wire_ids());
                let head = gen_response_head(c);
                self.feed(ControlFrame::Response { id, head }.to_message());
            }
            14..=16 => {
                let id = gen_id(c, &self.wire_ids());
                let body = gen_body(c, &mut self.seq);
                self.feed(Message::Binary(frame::encode_chunk(id, &body)));
            }
            17 => {
                let id = gen_id(c, &self.wire_ids());
                self.feed(ControlFrame::End { id }.to_message());
            }
            18 => {
                let id = gen_id(c, &self.wire_ids());
                self.feed(ControlFrame::Abort { id }.to_message());
            }
            19 => {
                let id = gen_id(c, &self.wire_ids());
                let msg = match c.u8() % 3 {
                    0 => ControlFrame::Request {
                        id,
                        head: gen_request_head(c),
                    }
                    .to_message(),
                    _ => gen_misc_message(c, id, self.last_ping.as_ref()),
                };
                self.feed(msg);
            }
            20 => match c.u8() % 8 {
                0 => {
                    let code = c.pick(APP_CLOSE_CODES);
                    self.r.close(CloseCode(code), "relay closes");
                    trace!("relay app: close({code})");
                    if !self.closed {
                        self.expect_close = Some(code);
                    }
                }
                1 => {
                    trace!("relay: handle_lost");
                    self.r.handle_lost();
                }
                _ => self.advance(c),
            },
            21 => self.advance(c),
            // ----- the socket takes messages
            _ => {
                let n = match c.u8() {
                    0..=127 => 1 + usize::from(c.u8() % 8),
                    _ => usize::MAX,
                };
                self.transmit(n);
            }
        }
        self.after_step();
    }

    fn advance(&mut self, c: &mut Cursor<'_>) {
        let d = gen_duration(c);
        if c.u8() % 4 == 0 {
            if let Some(t) = self.r.poll_timeout() {
                self.now = self.now.max(t);
            }
        }
        self.now = self.now.checked_add(d).unwrap_or(self.now);
        let was_closed = self.r.is_closed();
        trace!("relay: handle_timeout(+{:?})", self.now - base_instant());
        self.r.handle_timeout(self.now);
        if !was_closed && self.r.is_closed() {
            assert!(
                self.cfg.keepalive.is_some(),
                "closed on a timeout without keepalive"
            );
            self.expect_close = Some(1011);
        } else {
            self.run_deadlines();
        }
        let t = self.r.poll_timeout();
        if let Some(t) = t {
            assert!(
                t > self.now,
                "timer at {t:?} not after now after handle_timeout"
            );
        }
        self.r.handle_timeout(self.now);
        assert_eq!(self.r.poll_timeout(), t);
    }

    fn open(&mut self, head: RequestHead) {
        let before = self.r.open_streams();
        let filtered = head.headers().without_hop_by_hop();
        let res = self.r.open_stream(head.clone());
        trace!(
            "relay app: open_stream({} {}) = {res:?}",
            head.method(),
            head.path()
        );
        if self.closed {
            assert_eq!(res, Err(StreamError::ConnectionClosed));
            return;
        }
        if ["CONNECT", "TRACE"]
            .iter()
            .any(|m| m.eq_ignore_ascii_case(head.method()))
        {
            assert_eq!(res, Err(StreamError::MethodNotAllowed));
            return;
        }
        let expected = RequestHead::new(head.method(), head.path(), head.query(), filtered.clone())
            .expect("still valid");
        if let Err(e) = self.cfg.head_limits.check_request(&expected) {
            assert_eq!(res, Err(StreamError::HeadOverLimit(e)));
            return;
        }
        let Ok(cl) = filtered.content_length() else {
            assert_eq!(res, Err(StreamError::InvalidContentLength));
            return;
        };
        let limit = if is_control_route(&head) {
            self.cfg.max_streams
        } else {
            (self.cfg.max_streams)
                .saturating_sub(self.cfg.reserved_streams)
                .max(1)
        };
        if before >= limit {
            assert_eq!(res, Err(StreamError::TooManyStreams { limit }));
            return;
        }
        let key = res.expect("open_stream within the bounds");
        assert!(
            self.keys.keys().next_back().map_or(true, |k| *k < key),
            "keys must increase"
        );
        let id = self.r.stream_id(key).expect("a new stream is in flight");
        assert!(
            !self.ids_live.contains_key(&id),
            "id {id} handed out while in flight"
        );
        self.ids_live.insert(id, key);
        self.active.insert(key);
        self.opened += 1;
        self.keys.insert(
            key,
            RKey {
                id,
                head: expected,
                live: true,
                held: true,
                forgotten: false,
                aborted_live: false,
                ended: None,
                head_emitted: false,
                head_dropped: false,
                cl,
                writing: true,
                finished: false,
                sent: 0,
                out: VecDeque::new(),
                wire_sent: 0,
                end_emitted: false,
                abort_expected: false,
                abort_emitted: false,
                started: false,
                response_length: None,
                received: 0,
                bodiless: false,
                stall_since: None,
                orphaned: false,
                body: BodyModel::new(),
            },
        );
    }

    fn send_body(&mut self, key: StreamKey, data: Bytes) {
        let cap = self.r.send_capacity(key);
        assert!(cap <= self.cfg.max_queued_per_stream.max(1));
        assert!(cap <= self.cfg.max_queued.max(1));
        let len = data.len();
        let res = self.r.send_body(key, data.clone());
        trace!("relay app: send_body({key:?}, {len} bytes) = {res:?} (capacity {cap})");
        let Some(k) = self.keys.get_mut(&key) else {
            assert_eq!(res, Err(StreamError::UnknownStream));
            return;
        };
        if !k.live || k.orphaned {
            assert_eq!(res, Ok(len), "body for an ended stream is swallowed");
            return;
        }
        if !k.writing {
            assert_eq!(res, Err(StreamError::AlreadyFinished));
            return;
        }
        if let Some(limit) = k.cl.filter(|&l| k.sent + len as u64 > l) {
            assert_eq!(res, Err(StreamError::ContentLengthExceeded { limit }));
            return;
        }

        let n = res.expect("send_body on a stream in flight");
        assert_eq!(
            n,
            len.min(cap),
            "send_body took {n} of {len}, capacity {cap}"
        );
        k.sent += n as u64;
        if n > 0 {
            k.out.push_back(data.slice(..n));
            // Sending restarts a running stall deadline.
            if k.stall_since.is_some() {
                k.stall_since = Some(self.now);
            }
        }
    }

    fn finish_cmd(&mut self, key: StreamKey) {
        let res = self.r.finish(key);
        trace!("relay app: finish({key:?}) = {res:?}");
        let Some(k) = self.keys.get_mut(&key) else {
            assert_eq!(res, Err(StreamError::UnknownStream));
            return;
        };
        if !k.live || k.orphaned {
            assert_eq!(res, Ok(()));
            return;
        }
        if !k.writing {
            assert_eq!(res, Err(StreamError::AlreadyFinished));
            return;
        }
        match k.cl.filter(|&cl| k.sent < cl) {
            Some(expected) => {
                assert_eq!(
                    res,
                    Err(StreamError::ContentLengthShort {
                        expected,
                        sent: k.sent
                    })
                );
                // The relay aborted the stream.
                self.app_abort(key);
            }
            None => {
                assert_eq!(res, Ok(()));
                k.writing = false;
                k.finished = true;
            }
        }
    }

    /// The model of `RelayConnection::abort(key)`.
    fn app_abort(&mut self, key: StreamKey) {
        let Some(k) = self.keys.get_mut(&key) else {
            return;
        };
        if !k.held {
            return;
        }
        self.expect_end.remove(&key);
        self.expect_response.remove(&key);
        if k.live && !k.orphaned && !k.writing && k.response_complete() {
            // Complete for the caller, and the request is complete: wait for
            // the worker's `end` quietly (for at most the stall deadline);
            // the queued request still goes out.
            k.orphaned = true;
            k.stall_since = Some(self.now);
            k.forgotten = true;
            k.aborted_live = true;
            k.body.discard();
            return;
        }
        k.held = false;
        k.forgotten = true;
        k.body.clear();
        if k.live {
            k.live = false;
            k.aborted_live = true;
            k.writing = false;
            k.out.clear();
            self.ids_live.remove(&k.id);
            if k.head_emitted {
                k.abort_expected = true;
            } else {
                k.head_dropped = true;
            }
            self.ends += 1;
        }
    }

    /// The model of the relay ending a stream on the wire.
    fn end_on_wire(&mut self, key: StreamKey, reason: RelayEnd, send_abort: bool) {
        let k = self.keys.get_mut(&key).expect("live key");
        assert!(k.live);
        if reason == RelayEnd::ProtocolError {
            self.protocol_errors += 1;
        }
        if reason == RelayEnd::Completed {
            // Content-Length accounting: a response completes only with
            // every byte it announced.
            if let Some(cl) = k.response_length {
                assert_eq!(k.received, cl, "completed short of its Content-Length");
            }
        }
        if k.orphaned {
            // Let go of by the caller: it ends without an event; what is
            // still queued of the request is dropped.
            k.stall_since = None;
            k.live = false;
            k.held = false;
            k.writing = false;
            k.body.clear();
            k.out.clear();
            if !k.head_emitted {
                k.head_dropped = true;
            }
            self.ids_live.remove(&k.id);
            if send_abort {
                k.abort_expected = true;
            } else if self.wire.get(&k.id) == Some(&key) {
                self.wire.remove(&k.id);
            }
            self.ends += 1;
            return;
        }
        k.live = false;
        k.writing = false;
        k.out.clear();
        self.ids_live.remove(&k.id);
        if !k.head_emitted {
            k.head_dropped = true;
        }
        if send_abort {
            k.abort_expected = true;
        } else if self.wire.get(&k.id) == Some(&key) {
            self.wire.remove(&k.id);
        }
        if !reason.is_failure() {
            k.body.end();
        } else if k.started && !reason.drops_body() {
            k.body.fail_after_data();
        } else if k.started {
            k.body.fail();
            k.stall_since = None;
        } else {
            k.held = false;
            k.body.clear();
            k.stall_since = None;
        }
        self.expect_end.insert(key, (reason, k.started));
        self.ends += 1;
    }

    fn read(&mut self, key: StreamKey) {
        let got = self.r.read_body(key);
        trace!("relay app: read_body({key:?}) = {}", short_read(&got));
        match self.keys.get_mut(&key) {
            Some(k) if k.held => {
                k.body.read(&got, "relay");
                if !k.live && matches!(got, BodyRead::End | BodyRead::Gone) {
                    k.held = false;
                    k.stall_since = None;
                }
                if matches!(got, BodyRead::Data(_)) {
                    // The caller took something: its deadline restarts.
                    let waiting = !k.body.held.is_empty() && !self.closed;
                    k.stall_since = waiting.then_some(self.now);
                }
            }
            _ => assert_eq!(got, BodyRead::Gone, "read_body of a stream not held"),
        }
    }

    fn feed(&mut self, msg: Message) {
        let was_closed = self.r.is_closed();
        let wants = self.r.wants_read();
        let is_data = msg.is_data();
        let len = msg.len() as u64;
        let class = classify(&msg, false, &self.cfg.head_limits);
        trace!("worker -> relay: {} = {class:?}", short(&msg));
        let fed = msg.clone();
        let res = self.r.handle_message(msg, self.now);
        if was_closed {
            assert_eq!(res, Ok(()), "a closed relay ignores input");
            return;
        }
        if is_data && !wants {
            assert!(
                matches!(&res, Err(HandleError::ReadPaused(m)) if m == &fed),
                "a paused relay hands the message back: {res:?}"
            );
            return;
        }
        assert_eq!(
            res,
            Ok(()),
            "handle_message refused a message while wants_read"
        );
        if is_data {
            self.bytes_in += len;
        }
        let live_key = |id: &StreamId| self.ids_live.get(id).copied();
        match class {
            Class::TooLarge => {
                assert!(self.r.is_closed(), "an oversized message must close");
                self.expect_close = Some(1009);
            }
            Class::Close => assert!(self.r.is_closed(), "a close must close"),
            Class::Response(id, head) => {
                if let Some(key) = live_key(&id) {
                    let k = self.keys.get_mut(&key).expect("live");
                    let status = head.status();
                    match head.headers().content_length() {
                        Ok(cl) if !k.started && (200..=599).contains(&status) => {
                            k.started = true;
                            k.bodiless =
                                k.head.method() == "HEAD" || status == 204 || status == 304;
                            k.response_length = cl.filter(|_| !k.bodiless);
                            self.expect_response.insert(key, head);
                        }
                        _ => self.end_on_wire(key, RelayEnd::ProtocolError, true),
                    }
                }
            }
            Class::BadResponse(id) => {
                if let Some(key) = live_key(&id) {
                    self.end_on_wire(key, RelayEnd::ProtocolError, true);
                }
            }
            Class::End(id) => {
                if let Some(key) = live_key(&id) {
                    let k = &self.keys[&key];
                    if !k.started {
                        self.end_on_wire(key, RelayEnd::ProtocolError, true);
                    } else if k.response_length.is_some_and(|cl| k.received < cl) {
                        self.end_on_wire(key, RelayEnd::ProtocolError, false);
                    } else {
                        self.end_on_wire(key, RelayEnd::Completed, false);
                    }
                }
            }
            Class::Abort(id) => {
                if let Some(key) = live_key(&id) {
                    self.end_on_wire(key, RelayEnd::WorkerAborted, false);
                }
            }
            Class::Chunk(id, data) => {
                if let Some(key) = live_key(&id) {
                    let k = self.keys.get_mut(&key).expect("live");
                    let over = |k: &RKey| {
                        k.response_length
                            .is_some_and(|cl| k.received + data.len() as u64 > cl)
                    };
                    if !k.started || (!k.bodiless && over(k)) {
                        self.end_on_wire(key, RelayEnd::ProtocolError, true);
                    } else if !k.bodiless {
                        k.received += data.len() as u64;
                        let pushed = !data.is_empty() && k.body.state == BState::Open;
                        k.body.push(data);
                        if pushed && k.stall_since.is_none() {
                            k.stall_since = Some(self.now);
                        }
                    }
                }
            }
            Class::Request(..) | Class::Other => {}
        }
    }

    fn transmit(&mut self, n: usize) {
        for _ in 0..n {
            let Some(m) = self.r.poll_transmit() else {
                return;
            };
            self.on_emit(m);
        }
    }

    fn on_emit(&mut self, m: Message) {
        trace!("relay emits {}", short(&m));
        assert!(!self.close_sent, "relay emitted {m:?} after its close");
        assert!(
            m.len() <= MAX_MESSAGE_LEN,
            "relay emitted {} bytes",
            m.len()
        );
        if let Some((code, reason)) = close_code_of(&m) {
            assert!(self.r.is_closed(), "close emitted by an open relay");
            assert_eq!(Some(code), self.expect_close, "relay closed with {code}");
            assert!(reason <= 123, "close reason of {reason} bytes");
            self.close_sent = true;
            return;
        }
        assert!(!self.r.is_closed(), "relay emitted {m:?} while closed");
        self.bytes_out += m.len() as u64;
        let d = match &m {
            Message::Close(None) => panic!("relay closed without a code"),
            Message::Ping(p) => {
                assert!(self.cfg.keepalive.is_some(), "ping without keepalive");
                self.last_ping = Some(p.clone());
                return;
            }
            Message::Pong(_) => panic!("relay emitted a pong"),
            _ => frame::decode(&m)
                .expect("data message")
                .unwrap_or_else(|e| panic!("relay emitted an invalid frame {m:?}: {e}")),
        };
        match d {
            Decoded::Control(ControlFrame::Request { id, head }) => {
                let cands: Vec<StreamKey> = self
                    .keys
                    .iter()
                    .filter(|(_, k)| k.id == id && !k.head_emitted && !k.head_dropped)
                    .map(|(key, _)| *key)
                    .collect();
                assert_eq!(cands.len(), 1, "request for id {id}: streams {cands:?}");
                let key = cands[0];
                assert!(
                    !self.wire.contains_key(&id),
                    "request under id {id}, still in flight on the wire"
                );
                let k = self.keys.get_mut(&key).expect("candidate");
                assert!(k.live, "request of a stream that has ended");
                assert_eq!(head, k.head, "request head");
                for (n, _) in head.headers().iter() {
                    let hop = HOP_BY_HOP_NAMES.iter().any(|h| h.eq_ignore_ascii_case(n))
                        || n.len() >= 6 && n[..6].eq_ignore_ascii_case("proxy-");
                    assert!(!hop, "hop-by-hop header {n} forwarded");
                }
                k.head_emitted = true;
                self.wire.insert(id, key);
            }
            Decoded::Chunk(ch) => {
                let chunk_limit = self.chunk_limit();
                let key = *self
                    .wire
                    .get(&ch.id)
                    .unwrap_or_else(|| panic!("relay chunk for id {}, not in flight", ch.id));
                let k = self.keys.get_mut(&key).expect("on the wire");
                assert!(k.live, "chunk for a stream that has ended");
                assert!(!k.end_emitted, "chunk after end");
                assert!(!ch.data.is_empty(), "relay emitted an empty chunk");
                assert!(ch.data.len() <= chunk_limit, "chunk over chunk_size");
                assert!(
                    consume(&mut k.out, &ch.data),
                    "request bytes on the wire differ from what the caller sent"
                );
                k.wire_sent += ch.data.len() as u64;
                if let Some(cl) = k.cl {
                    assert!(k.wire_sent <= cl, "body longer than its Content-Length");
                }
            }
            Decoded::Control(ControlFrame::End { id }) => {
                let key = *self
                    .wire
                    .get(&id)
                    .unwrap_or_else(|| panic!("relay end for id {id}, not in flight"));
                let k = self.keys.get_mut(&key).expect("on the wire");
                assert!(k.live, "end for a stream that has ended");
                assert!(!k.end_emitted, "second end");
                assert!(k.finished, "end before finish");
                assert!(k.out.is_empty(), "end before the whole body");
                if let Some(cl) = k.cl {
                    assert_eq!(k.wire_sent, cl, "end short of the Content-Length");
                }
                k.end_emitted = true;
            }
            Decoded::Control(ControlFrame::Abort { id }) => {
                let key = self
                    .keys
                    .iter()
                    .find(|(_, k)| k.id == id && k.abort_expected && !k.abort_emitted)
                    .map(|(key, _)| *key)
                    .unwrap_or_else(|| panic!("relay abort for id {id} nobody asked for"));
                if let Some(&owner) = self.wire.get(&id) {
                    assert_eq!(owner, key, "abort for id {id} now owned by another stream");
                    self.wire.remove(&id);
                }
                self.keys.get_mut(&key).expect("found").abort_emitted = true;
            }
            other => panic!("relay emitted {other:?}"),
        }
    }

    fn after_step(&mut self) {
        if self.r.is_closed() && !self.closed {
            self.closed = true;
            let live: Vec<StreamKey> = self.ids_live.values().copied().collect();
            for key in live {
                self.end_on_wire(key, RelayEnd::ConnectionLost, false);
            }
            for k in self.keys.values_mut() {
                // Whatever was queued is gone with the connection, and no
                // deadline runs any more.
                k.abort_expected &= k.abort_emitted;
                k.stall_since = None;
            }
        }
        while let Some(e) = self.r.poll_event() {
            self.on_event(e);
        }
        self.check();
        self.track_pause();
    }

    fn on_event(&mut self, e: RelayEvent) {
        trace!("relay event {e:?}");
        let key = e.key();
        let k = self
            .keys
            .get_mut(&key)
            .unwrap_or_else(|| panic!("{e:?} for an unknown key"));
        assert!(!k.forgotten, "{e:?} after the caller aborted the stream");
        match e {
            RelayEvent::Response { head, .. } => {
                assert_eq!(
                    self.expect_response.remove(&key),
                    Some(head),
                    "Response event"
                );
            }
            RelayEvent::Readable { .. } | RelayEvent::Writable { .. } => {}
            RelayEvent::Refill { .. } => panic!("a refill without an overflow configured"),
            RelayEvent::Ended {
                reason,
                response_started,
                ..
            } => {
                assert!(k.ended.is_none(), "stream {key:?} ended twice");
                k.ended = Some(reason);
                assert_eq!(
                    self.expect_end.remove(&key),
                    Some((reason, response_started)),
                    "Ended event of {key:?}"
                );
            }
        }
    }

    fn check(&mut self) {
        assert!(
            self.expect_end.is_empty(),
            "missing Ended: {:?}",
            self.expect_end
        );
        assert!(
            self.expect_response.is_empty(),
            "missing Response: {:?}",
            self.expect_response
        );
        let s = self.r.stats();
        let mut held = 0usize;
        let mut held_bytes = 0u64;
        let mut paused = false;
        let mut live = 0;
        let mut gone = Vec::new();
        for key in &self.active {
            let k = &self.keys[key];
            live += usize::from(k.live);
            if !k.held && !k.live {
                gone.push(*key);
            }
            let id = self.r.stream_id(*key);
            assert_eq!(
                id,
                (k.live && !k.orphaned).then_some(k.id),
                "stream_id of {key:?}"
            );
            if k.held {
                held += 1;
                held_bytes += k.body.bytes as u64;
                let chunks = k.body.held.len();
                assert!(
                    chunks <= self.cfg.max_unread_chunks,
                    "{chunks} unread chunks held"
                );
                paused |= chunks >= self.cfg.max_unread_chunks;
            }
        }
        for key in gone {
            self.active.remove(&key);
        }
        assert_eq!(live, self.ids_live.len(), "ids in flight are unique");
        assert_eq!(self.r.open_streams(), held, "open_streams");
        assert!(
            held <= self.cfg.max_streams,
            "more streams than max_streams"
        );
        assert_eq!(s.body_buffered_in, held_bytes, "unread bytes");
        paused |= held_bytes >= self.cfg.max_unread_bytes as u64;
        assert_eq!(self.r.wants_read(), !self.closed && !paused, "wants_read");
        assert_eq!(s.streams_opened, self.opened);
        assert_eq!(s.streams_closed, self.ends);
        assert_eq!(s.protocol_errors, self.protocol_errors, "protocol errors");
        assert_eq!(s.streams_open, held as u64);
        assert_eq!(s.bytes_in, self.bytes_in);
        assert_eq!(s.bytes_out, self.bytes_out);
        assert!(s.body_queued_out <= self.cfg.max_queued.max(1) as u64);
        assert!(s.body_queued_out_max <= self.cfg.max_queued.max(1) as u64);
        if self.closed {
            assert_eq!(self.r.poll_timeout(), None);
        }
    }

    fn finish(mut self) {
        self.transmit(usize::MAX);
        self.after_step();
        if !self.closed {
            for (key, k) in &self.keys {
                if k.live {
                    assert!(k.out.is_empty(), "{key:?}: queued body not sent");
                    assert!(k.head_emitted, "{key:?}: request never sent");
                    assert_eq!(k.end_emitted, k.finished, "{key:?}: finish without end");
                }
                assert_eq!(
                    k.abort_expected, k.abort_emitted,
                    "{key:?}: abort never sent"
                );
            }
        }
        self.r.handle_lost();
        self.transmit(usize::MAX);
        self.after_step();
        assert!(self.r.poll_transmit().is_none());
        for (key, k) in &self.keys {
            assert!(
                k.ended.is_some() != k.aborted_live,
                "{key:?} must end exactly once: {:?}, aborted {}",
                k.ended,
                k.aborted_live
            );
        }
    }
}
