//! Generators: values built from cursor bytes; and how a peer's message is classified.

use crate::prelude::*;

pub(crate) const TCHARS: &[u8] =
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A non-empty HTTP token (method or header name).
pub(crate) fn gen_token(c: &mut Cursor<'_>) -> String {
    let n = 1 + usize::from(c.u8() % 12);
    (0..n)
        .map(|_| char::from(TCHARS[usize::from(c.u8()) % TCHARS.len()]))
        .collect()
}

/// Visible ASCII (0x21..=0x7e), possibly empty.
pub(crate) fn gen_visible(c: &mut Cursor<'_>, max: usize) -> String {
    c.short_bytes(max)
        .iter()
        .map(|&b| char::from(0x21 + b % 94))
        .collect()
}

/// Latin-1 text from raw bytes (each byte one char: controls, CR, LF, NUL
/// and U+0080..U+00FF included, so some values are refused).
pub(crate) fn gen_latin1(c: &mut Cursor<'_>, max: usize) -> String {
    c.short_bytes(max).iter().map(|&b| char::from(b)).collect()
}

pub(crate) const HEADER_NAMES: &[&str] = &[
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

pub(crate) const HEADER_VALUES: &[&str] = &[
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

pub(crate) fn gen_headers(c: &mut Cursor<'_>) -> Headers {
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

pub(crate) const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "HEAD", "HEAD", "CONNECT", "TRACE",
];
pub(crate) const PATHS: &[&str] = &[
    "/health",
    "/v1/execute",
    "/v1/notebook-execute",
    "/v1/execute-manifest",
    "/v1/executions/b1/cancel",
    "/",
    "/a%2Fb",
];

pub(crate) fn gen_request_head(c: &mut Cursor<'_>) -> RequestHead {
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

pub(crate) fn gen_response_head(c: &mut Cursor<'_>) -> ResponseHead {
    let status = match c.u8() % 8 {
        0 | 1 => 100 + c.u16() % 900,
        2 => 500,
        3 => c.pick(&[101, 204, 304, 100, 599, 600]),
        _ => 200,
    };
    ResponseHead::new(status, gen_headers(c)).expect("generated heads are valid")
}

/// An id: mostly one of `pool`, else a small id, else any id.
pub(crate) fn gen_id(c: &mut Cursor<'_>, pool: &[StreamId]) -> StreamId {
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
pub(crate) fn gen_body(c: &mut Cursor<'_>, seq: &mut u32) -> Bytes {
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

pub(crate) fn gen_duration(c: &mut Cursor<'_>) -> Duration {
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

pub(crate) fn gen_keepalive(
    c: &mut Cursor<'_>,
    default: Option<KeepaliveConfig>,
) -> Option<KeepaliveConfig> {
    match c.u8() % 4 {
        0 => None,
        1 => Some(KeepaliveConfig::default()),
        2 => Some(
            KeepaliveConfig::new(
                Duration::from_secs(1 + u64::from(c.u8() % 30)),
                Duration::from_secs(1 + u64::from(c.u8() % 30)),
            )
            .expect("valid"),
        ),
        _ => default,
    }
}

/// A chunk for `id` of exactly the message limit (1 MiB + 4 bytes).
pub(crate) fn max_binary(id: StreamId) -> Message {
    let mut v = vec![0x5a; MAX_MESSAGE_LEN];
    v[..4].copy_from_slice(&id.get().to_be_bytes());
    Message::Binary(v.into())
}

/// One byte over the limit: refused on its length alone.
pub(crate) fn oversize_binary() -> Message {
    static BIG: OnceLock<Bytes> = OnceLock::new();
    Message::Binary(
        BIG.get_or_init(|| vec![0x5a; MAX_MESSAGE_LEN + 1].into())
            .clone(),
    )
}

/// A valid frame padded with spaces to `len` bytes (decodes if within the
/// limit; parsing 1 MiB of JSON is slow, so the fuzzer gets it rarely).
pub(crate) fn padded_text(len: usize) -> Message {
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
pub(crate) fn gen_misc_message(
    c: &mut Cursor<'_>,
    id: StreamId,
    last_ping: Option<&Bytes>,
) -> Message {
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
pub(crate) fn over_limit_head(ty: &str, id: StreamId, which: u8) -> Message {
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
pub(crate) enum Class {
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

pub(crate) fn classify(msg: &Message, worker_side: bool, limits: &HeadLimits) -> Class {
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
        Ok(_) => Class::Other,
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
pub(crate) fn bad_frame_id(text: &str, ty: &str) -> Option<StreamId> {
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
