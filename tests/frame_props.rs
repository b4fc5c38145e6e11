//! Property tests of the wire format (`worker_relay::frame`):
//!
//! - encode → decode is the identity for every valid control frame and chunk;
//! - decoding never panics, on arbitrary bytes, arbitrary strings, JSON-ish
//!   strings built from protocol fragments, and generated JSON objects whose
//!   fields are each valid or broken in one known way (with the exact outcome
//!   predicted);
//! - `split_body` reassembles, slices without copying, respects the limit;
//! - the hop-by-hop filter, Content-Length lookup and Latin-1 conversions.

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Value};
use worker_relay::frame::{
    self, encode_chunk, is_hop_by_hop_name, split_body, Chunk, ControlFrame, Decoded, FrameError,
    HeaderError, Headers, Message, RequestHead, ResponseHead, StreamId, MAX_CHUNK_BODY,
    MAX_MESSAGE_LEN,
};

// ------------------------------------------------------------------ strategies

const TCHARS: &[u8] =
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Flips the ASCII case of the letters of `s` at random.
fn random_case(s: impl Into<String>) -> impl Strategy<Value = String> {
    let s = s.into();
    any::<u64>().prop_map(move |bits| {
        s.chars()
            .enumerate()
            .map(|(i, c)| {
                if bits >> (i % 64) & 1 == 1 {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    })
}

/// A non-empty HTTP token of at most `max` chars.
fn token(max: usize) -> impl Strategy<Value = String> {
    vec(select(TCHARS), 1..=max).prop_map(|b| String::from_utf8(b).unwrap())
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        select(&["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"][..])
            .prop_map(String::from),
        token(12),
    ]
}

/// Visible ASCII (U+0021..U+007E), as paths and queries hold on the wire.
fn visible(max: usize) -> impl Strategy<Value = String> {
    vec(0x21u8..=0x7e, 0..=max).prop_map(|b| String::from_utf8(b).unwrap())
}

fn path() -> impl Strategy<Value = String> {
    visible(40).prop_map(|s| format!("/{s}"))
}

/// One char a header value may hold: Latin-1 but not CR, LF or NUL.
fn value_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => 0x20u8..=0x7e,
        1 => Just(b'\t'),
        3 => 0x80u8..=0xff,
        1 => select(&[1u8, 2, 7, 8, 0x0b, 0x0c, 0x1b, 0x1f, 0x7f][..]),
    ]
    .prop_map(char::from)
}

fn header_value() -> impl Strategy<Value = String> {
    vec(value_char(), 0..=40).prop_map(|c| c.into_iter().collect())
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        select(
            &[
                "content-type",
                "Content-Length",
                "authorization",
                "Set-Cookie",
                "x-a"
            ][..]
        )
        .prop_map(String::from),
        token(24),
    ]
}

fn headers() -> impl Strategy<Value = Headers> {
    vec((header_name(), header_value()), 0..8)
        .prop_map(|pairs| Headers::try_from_pairs(pairs).expect("generated headers are valid"))
}

fn id_value() -> impl Strategy<Value = u32> {
    prop_oneof![
        1 => Just(1u32),
        1 => Just(u32::MAX),
        1 => Just(1u32 << 31),
        1 => 1u32..=255,
        6 => 1u32..=u32::MAX,
    ]
}

fn stream_id() -> impl Strategy<Value = StreamId> {
    id_value().prop_map(|v| StreamId::new(v).unwrap())
}

fn control_frame() -> impl Strategy<Value = ControlFrame> {
    prop_oneof![
        3 => (stream_id(), method(), path(), visible(30), headers()).prop_map(
            |(id, m, p, q, h)| ControlFrame::Request {
                id,
                head: RequestHead::new(m, p, q, h).expect("generated request head is valid"),
            }
        ),
        3 => (stream_id(), 100u16..=999, headers()).prop_map(|(id, s, h)| {
            ControlFrame::Response {
                id,
                head: ResponseHead::new(s, h).expect("generated status is valid"),
            }
        }),
        1 => stream_id().prop_map(|id| ControlFrame::End { id }),
        1 => stream_id().prop_map(|id| ControlFrame::Abort { id }),
    ]
}

// ------------------------------------------------------------------ outcome checks

/// What every decode outcome must satisfy, whatever the input.
fn check_any_outcome(r: &Result<Decoded, FrameError>) -> Result<(), TestCaseError> {
    match r {
        Ok(Decoded::Control(f)) => {
            // A decoded frame has a canonical encoding that decodes to itself.
            let text = f.encode();
            prop_assert_eq!(frame::decode_text(&text), Ok(Decoded::Control(f.clone())));
        }
        Ok(Decoded::Chunk(c)) => {
            prop_assert!(c.data.len() <= MAX_CHUNK_BODY);
        }
        Ok(Decoded::Unknown) => {}
        Err(e) => {
            prop_assert!([1002, 1007, 1009].contains(&e.close_code().0), "{:?}", e);
            prop_assert!(!e.kind().is_empty());
            prop_assert!(!e.to_string().is_empty());
        }
        _ => unreachable!("a variant this test does not know"),
    }
    Ok(())
}

// ------------------------------------------------------------------ JSON-ish fuzz input

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(&[
            "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\\", "\\u", "\\n", "\\r\\n",
            "\\u0000", "\\ud800", "\\u00e9", "\\u0100", "null", "true", "false", "-", ".",
            "e", "E+", "0", "1e30", "-0", "4294967295", "4294967296", "1e400", "NaN",
            "\"type\"", "\"id\"", "\"method\"", "\"path\"", "\"query\"", "\"status\"",
            "\"headers\"", "\"request\"", "\"response\"", "\"end\"", "\"abort\"", "\"GET\"",
            "\"/\"", "\"/v1/execute\"", "[\"content-length\",\"5\"]", "[\"a b\",\"x\"]",
            "\u{e9}", "\u{20ac}", "\u{1f600}", "\u{feff}",
        ][..]).prop_map(String::from),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|x| x.to_string()),
        1 => "[ -~]{0,6}",
        1 => any::<String>(),
    ]
}

/// A JSON string literal built from pieces that stress validation and escapes.
fn json_string() -> impl Strategy<Value = String> {
    vec(
        select(
            &[
                "a",
                "Z",
                "/",
                "-",
                " ",
                "\t",
                "%20",
                "?",
                ":",
                "\\\"",
                "\\\\",
                "\\/",
                "\\t",
                "\\r\\n",
                "\\u0000",
                "\\u0047",
                "\\u007f",
                "\\u00e9",
                "\\u00ff",
                "\\u0100",
                "\\ud83d\\ude00",
                "\\ud800",
                "\u{e9}",
                "\u{ff}",
                "\u{20ac}",
                "\\x",
            ][..],
        ),
        0..8,
    )
    .prop_map(|p| format!("\"{}\"", p.concat()))
}

/// A JSON-ish value: usually valid JSON, sometimes not.
fn json_ish_value() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|x| format!("{x:e}")),
        1 => (0u32..=1000).prop_map(|n| n.to_string()),
        1 => select(&["0", "-0", "1.0", "1e2", "4294967295", "4294967296", "1e400", "null", "true", "[]", "{}"][..])
            .prop_map(String::from),
        3 => json_string(),
        1 => vec(json_string(), 0..3).prop_map(|v| format!("[{}]", v.join(","))),
        1 => vec(fragment(), 1..4).prop_map(|v| v.concat()),
    ]
}

/// Strings that look like control frames: random fragment soup after a
/// plausible start, or a frame template with one JSON-ish value spliced in,
/// so fuzzing reaches past the first character and into field validation.
fn json_ish() -> impl Strategy<Value = String> {
    let start = select(
        &[
            "",
            "{",
            "{\"type\":\"request\",\"id\":",
            "{\"type\":\"request\",\"id\":1,\"method\":\"GET\",\"path\":",
            "{\"type\":\"request\",\"id\":1,\"method\":\"GET\",\"path\":\"/\",\"headers\":[",
            "{\"type\":\"response\",\"id\":",
            "{\"type\":\"response\",\"id\":1,\"status\":",
            "{\"type\":\"response\",\"id\":1,\"status\":200,\"headers\":[[",
            "{\"type\":\"end\",\"id\":",
            "{\"type\":\"abort\",\"id\":",
        ][..],
    );
    let end = select(&["", "}", "]}", "\"}", "\"]]}", "}}", " "][..]);
    let soup = (start, vec(fragment(), 0..24), end)
        .prop_map(|(s, mid, e)| format!("{s}{}{e}", mid.concat()));
    let template = select(
        &[
            ("{\"type\":", ",\"id\":1}"),
            ("{\"type\":\"end\",\"id\":", "}"),
            ("{\"type\":\"abort\",\"id\":", ",\"x\":1}"),
            ("{\"type\":\"response\",\"id\":1,\"status\":", "}"),
            (
                "{\"type\":\"response\",\"id\":2,\"status\":200,\"headers\":",
                "}",
            ),
            (
                "{\"type\":\"response\",\"id\":3,\"status\":200,\"headers\":[[\"x\",",
                "]]}",
            ),
            (
                "{\"type\":\"response\",\"id\":3,\"status\":200,\"headers\":[[",
                ",\"v\"]]}",
            ),
            (
                "{\"type\":\"request\",\"id\":4,\"method\":",
                ",\"path\":\"/\"}",
            ),
            (
                "{\"type\":\"request\",\"id\":5,\"method\":\"GET\",\"path\":",
                "}",
            ),
            (
                "{\"type\":\"request\",\"id\":6,\"method\":\"GET\",\"path\":\"/\",\"query\":",
                "}",
            ),
            (
                "{\"type\":\"request\",\"id\":7,\"method\":\"GET\",\"path\":\"/\",\"unknown\":",
                "}",
            ),
        ][..],
    );
    let spliced = (template, json_ish_value()).prop_map(|((a, b), v)| format!("{a}{v}{b}"));
    prop_oneof![1 => soup, 2 => spliced]
}

// ------------------------------------------------------------------ generated objects

/// A field value and the error kind it should cause (`None`: valid).
type Field = (Option<Value>, Option<&'static str>);

fn ok(v: Value) -> Field {
    (Some(v), None)
}
fn bad(v: Option<Value>, kind: &'static str) -> Field {
    (v, Some(kind))
}

fn id_field() -> impl Strategy<Value = Field> {
    prop_oneof![
        24 => id_value().prop_map(|v| ok(json!(v))),
        1 => Just(bad(Some(json!(0)), "id_zero")),
        1 => (i64::MIN..0).prop_map(|v| bad(Some(json!(v)), "id_negative")),
        1 => (0u32..1000).prop_map(|v| bad(Some(json!(v as f64 + 0.5)), "id_fractional")),
        1 => ((1u64 << 32)..=u64::MAX).prop_map(|v| bad(Some(json!(v)), "id_too_large")),
        1 => Just(bad(Some(json!(1e30)), "id_too_large")),
        1 => prop_oneof![Just(json!("7")), Just(json!(true)), Just(json!([1])), Just(json!({}))]
            .prop_map(|v| bad(Some(v), "id_not_a_number")),
        1 => prop_oneof![Just(None), Just(Some(Value::Null))].prop_map(|v| bad(v, "id_missing")),
    ]
}

fn method_field() -> impl Strategy<Value = Field> {
    prop_oneof![
        18 => method().prop_map(|m| ok(json!(m))),
        1 => prop_oneof![Just("".to_owned()), Just("G T".to_owned()), Just("G\u{c9}T".to_owned()),
                         token(6).prop_map(|t| format!("{t}:"))]
            .prop_map(|m| bad(Some(json!(m)), "invalid_method")),
        1 => Just(bad(Some(json!(7)), "wrong_type")),
        1 => Just(bad(None, "missing_field")),
    ]
}

fn path_field() -> impl Strategy<Value = Field> {
    prop_oneof![
        18 => path().prop_map(|p| ok(json!(p))),
        1 => (0x21u8..=0x7e, visible(10))
            .prop_filter("not a slash", |(c, _)| *c != b'/')
            .prop_map(|(c, rest)| bad(Some(json!(format!("{}{rest}", char::from(c)))), "invalid_path")),
        1 => (visible(5), select(&[" ", "\t", "\r\n", "\u{0}", "\u{7f}", "\u{e9}", "\u{20ac}"][..]))
            .prop_map(|(p, c)| bad(Some(json!(format!("/{p}{c}"))), "invalid_path")),
        1 => Just(bad(Some(json!(["/"])), "wrong_type")),
        1 => Just(bad(None, "missing_field")),
    ]
}

fn query_field() -> impl Strategy<Value = Field> {
    prop_oneof![
        12 => visible(20).prop_map(|q| ok(json!(q))),
        1 => Just((None, None)),
        1 => Just((Some(Value::Null), None)),
        1 => (visible(5), select(&[" ", "\n", "\u{0}", "\u{ff}"][..]))
            .prop_map(|(q, c)| bad(Some(json!(format!("{q}{c}"))), "invalid_query")),
        1 => Just(bad(Some(json!(5)), "wrong_type")),
    ]
}

fn status_field() -> impl Strategy<Value = Field> {
    prop_oneof![
        18 => (100u16..=999).prop_map(|s| ok(json!(s))),
        1 => (0u64..100).prop_map(|s| bad(Some(json!(s)), "invalid_status")),
        1 => (1000u64..).prop_map(|s| bad(Some(json!(s)), "invalid_status")),
        1 => prop_oneof![Just(json!(200.5)), Just(json!(200.0)), Just(json!(-200)), Just(json!("200"))]
            .prop_map(|s| bad(Some(s), "invalid_status")),
        1 => prop_oneof![Just(None), Just(Some(Value::Null))].prop_map(|v| bad(v, "missing_field")),
    ]
}

/// A header pair as JSON and the error kind it should cause.
fn header_pair() -> impl Strategy<Value = (Value, Option<&'static str>)> {
    prop_oneof![
        30 => (header_name(), header_value()).prop_map(|(n, v)| (json!([n, v]), None)),
        1 => (select(&["", "a b", "x:y", "na\u{ef}ve", "a\r\nb"][..]), header_value())
            .prop_map(|(n, v)| (json!([n, v]), Some("header_name"))),
        1 => (header_name(), header_value(), select(&['\u{100}', '\u{20ac}', '\u{1f600}'][..]))
            .prop_map(|(n, v, c)| (json!([n, format!("{v}{c}")]), Some("header_not_latin1"))),
        1 => (header_name(), header_value(), select(&['\r', '\n', '\0'][..]))
            .prop_map(|(n, v, c)| (json!([n, format!("{c}{v}")]), Some("header_forbidden_char"))),
        1 => prop_oneof![Just(json!(["a"])), Just(json!(["a", "b", "c"])), Just(json!(["a", 5])),
                         Just(Value::Null), Just(json!("a: b")), Just(json!({"a": "b"}))]
            .prop_map(|p| (p, Some("wrong_type"))),
    ]
}

/// The headers field and its expected fault: (kind, header index).
type HeadersField = (Option<Value>, Option<(&'static str, Option<usize>)>);

fn headers_field() -> impl Strategy<Value = HeadersField> {
    prop_oneof![
        16 => vec(header_pair(), 0..6).prop_map(|pairs| {
            // The first bad pair decides, as a list is checked in order; shape
            // errors (wrong_type) win over value errors since the whole list must
            // parse before any pair is checked.
            let first_shape = pairs.iter().position(|(_, k)| *k == Some("wrong_type"));
            let first_bad = pairs.iter().position(|(_, k)| k.is_some());
            let fault = match (first_shape, first_bad) {
                (Some(_), _) => Some(("wrong_type", None)),
                (None, Some(i)) => Some((pairs[i].1.unwrap(), Some(i))),
                (None, None) => None,
            };
            (Some(Value::Array(pairs.into_iter().map(|(p, _)| p).collect())), fault)
        }),
        1 => Just((None, None)),
        1 => Just((Some(Value::Null), None)),
        1 => prop_oneof![Just(json!({"a": "b"})), Just(json!("a: b")), Just(json!(5))]
            .prop_map(|v| (Some(v), Some(("wrong_type", None)))),
    ]
}

#[derive(Debug, Clone)]
struct GenObject {
    ty: Option<Value>,
    id: Field,
    method: Field,
    path: Field,
    query: Field,
    status: Field,
    headers: HeadersField,
    extra: Vec<(String, Value)>,
}

fn leaf_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|x| json!(x)),
        any::<String>().prop_map(Value::String),
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    leaf_json().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec(("[a-z]{1,4}", inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn gen_object() -> impl Strategy<Value = GenObject> {
    let ty = prop_oneof![
        4 => select(&["request", "response", "end", "abort"][..]).prop_map(|t| Some(json!(t))),
        1 => prop_oneof![Just("window_update"), Just("END"), Just("")].prop_map(|t| Some(json!(t))),
        1 => prop_oneof![Just(None), Just(Some(Value::Null)), Just(Some(json!(5))),
                         Just(Some(json!(["end"])))],
    ];
    let extra_key = "[a-z_]{1,8}".prop_filter("not a known field", |k| {
        !["type", "id", "method", "path", "query", "status", "headers"].contains(&k.as_str())
    });
    (
        ty,
        id_field(),
        method_field(),
        path_field(),
        query_field(),
        status_field(),
        headers_field(),
        vec((extra_key, any_json()), 0..3),
    )
        .prop_map(
            |(ty, id, method, path, query, status, headers, extra)| GenObject {
                ty,
                id,
                method,
                path,
                query,
                status,
                headers,
                extra,
            },
        )
}

impl GenObject {
    fn to_text(&self) -> String {
        let mut m = Map::new();
        let fields: [(&str, &Option<Value>); 7] = [
            ("type", &self.ty),
            ("id", &self.id.0),
            ("method", &self.method.0),
            ("path", &self.path.0),
            ("query", &self.query.0),
            ("status", &self.status.0),
            ("headers", &self.headers.0),
        ];
        for (k, v) in &self.extra {
            m.insert(k.clone(), v.clone());
        }
        for (k, v) in fields {
            if let Some(v) = v {
                m.insert(k.to_owned(), v.clone());
            }
        }
        Value::Object(m).to_string()
    }

    /// The faults of the fields that matter for this frame type, as
    /// (kind, field name for missing_field/wrong_type, header index).
    fn faults(&self, ty: &str) -> Vec<(&'static str, Option<&'static str>, Option<usize>)> {
        let mut out = Vec::new();
        let mut field = |f: &Field, name: &'static str| {
            if let Some(k) = f.1 {
                let named = matches!(k, "missing_field" | "wrong_type").then_some(name);
                out.push((k, named, None));
            }
        };
        field(&self.id, "id");
        if ty == "request" {
            field(&self.method, "method");
            field(&self.path, "path");
            field(&self.query, "query");
        }
        if ty == "response" {
            field(&self.status, "status");
        }
        if ty == "request" || ty == "response" {
            if let Some((k, idx)) = self.headers.1 {
                let named = (k == "wrong_type").then_some("headers");
                out.push((k, named, idx));
            }
        }
        out
    }
}

fn error_details(e: &FrameError) -> (Option<&'static str>, Option<usize>) {
    match e {
        FrameError::MissingField(f) | FrameError::WrongType(f) => (Some(*f), None),
        FrameError::InvalidHeader(
            HeaderError::InvalidName { index }
            | HeaderError::NotLatin1 { index }
            | HeaderError::ForbiddenChar { index },
        ) => (None, Some(*index)),
        _ => (None, None),
    }
}

fn check_generated(obj: &GenObject) -> Result<(), TestCaseError> {
    let text = obj.to_text();
    let got = frame::decode_text(&text);
    check_any_outcome(&got)?;
    let ty = match &obj.ty {
        None | Some(Value::Null) => {
            prop_assert_eq!(got, Err(FrameError::MissingField("type")));
            return Ok(());
        }
        Some(Value::String(t)) => t.as_str(),
        Some(_) => {
            prop_assert_eq!(got, Err(FrameError::WrongType("type")));
            return Ok(());
        }
    };
    if !["request", "response", "end", "abort"].contains(&ty) {
        prop_assert_eq!(got, Ok(Decoded::Unknown), "unknown type {}", ty);
        return Ok(());
    }
    let faults = obj.faults(ty);
    match got {
        Err(e) => {
            prop_assert!(!faults.is_empty(), "{} refused: {:?}", text, e);
            let (field, index) = error_details(&e);
            let found = faults.contains(&(e.kind(), field, index));
            prop_assert!(found, "{}: {:?} is not one of {:?}", text, e, faults);
            if faults.len() == 1 {
                prop_assert_eq!(e.kind(), faults[0].0);
            }
        }
        Ok(Decoded::Control(f)) => {
            prop_assert!(faults.is_empty(), "{} accepted despite {:?}", text, faults);
            prop_assert_eq!(f.type_name(), ty);
            prop_assert_eq!(Some(json!(f.id().get())), obj.id.0.clone());
            match &f {
                ControlFrame::Request { head, .. } => {
                    prop_assert_eq!(Some(json!(head.method())), obj.method.0.clone());
                    prop_assert_eq!(Some(json!(head.path())), obj.path.0.clone());
                    let q = obj.query.0.clone().filter(|q| !q.is_null());
                    prop_assert_eq!(json!(head.query()), q.unwrap_or(json!("")));
                    check_headers(head.headers(), &obj.headers.0)?;
                }
                ControlFrame::Response { head, .. } => {
                    prop_assert_eq!(Some(json!(head.status())), obj.status.0.clone());
                    check_headers(head.headers(), &obj.headers.0)?;
                }
                _ => {}
            }
        }
        other => prop_assert!(false, "{} decoded to {:?}", text, other),
    }
    Ok(())
}

fn check_headers(h: &Headers, sent: &Option<Value>) -> Result<(), TestCaseError> {
    let got = Value::Array(h.iter().map(|(n, v)| json!([n, v])).collect());
    let sent = sent.clone().filter(|v| !v.is_null()).unwrap_or(json!([]));
    prop_assert_eq!(got, sent);
    Ok(())
}

// ------------------------------------------------------------------ properties

fn escape_non_ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn control_frame_round_trips(f in control_frame()) {
        let text = f.encode();
        prop_assert!(text.len() <= MAX_MESSAGE_LEN);
        let prefix = format!("{{\"type\":\"{}\",\"id\":{},", f.type_name(), f.id());
        let prefix_end = format!("{{\"type\":\"{}\",\"id\":{}}}", f.type_name(), f.id());
        prop_assert!(text.starts_with(&prefix) || text == prefix_end, "{}", text);
        prop_assert_eq!(frame::decode_text(&text), Ok(Decoded::Control(f.clone())));
        prop_assert_eq!(frame::decode(&f.to_message()), Some(Ok(Decoded::Control(f.clone()))));
        prop_assert_eq!(Decoded::Control(f.clone()).to_message(), Some(Message::Text(text.clone())));

        // Formatting does not matter: pretty-printed with sorted keys, and with
        // every non-ASCII char written as a \u escape, decode to the same frame.
        let value: Value = serde_json::from_str(&text).unwrap();
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        prop_assert_eq!(frame::decode_text(&pretty), Ok(Decoded::Control(f.clone())));
        let escaped = escape_non_ascii(&text);
        prop_assert!(escaped.is_ascii());
        prop_assert_eq!(frame::decode_text(&escaped), Ok(Decoded::Control(f)));
    }

    #[test]
    fn chunk_round_trips(id in stream_id(), body in vec(any::<u8>(), 0..=4096)) {
        let chunk = Chunk { id, data: Bytes::from(body.clone()) };
        let wire = chunk.encode();
        prop_assert_eq!(wire.len(), 4 + body.len());
        prop_assert_eq!(&wire[..4], &id.get().to_be_bytes()[..]);
        prop_assert_eq!(&wire, &encode_chunk(id, &body));
        let Ok(Decoded::Chunk(back)) = frame::decode_binary(wire.clone()) else {
            return Err(TestCaseError::fail("not a chunk"));
        };
        prop_assert_eq!(&back, &chunk);
        if !body.is_empty() {
            prop_assert_eq!(back.data.as_ptr(), wire[4..].as_ptr(), "decode copied the body");
        }
        prop_assert_eq!(back.to_message(), Message::Binary(wire.clone()));
        prop_assert_eq!(frame::decode(&Message::Binary(wire)), Some(Ok(Decoded::Chunk(chunk))));
    }

    #[test]
    fn binary_decode_never_panics(bytes in vec(any::<u8>(), 0..600)) {
        let msg = Bytes::from(bytes.clone());
        let got = frame::decode_binary(msg.clone());
        check_any_outcome(&got)?;
        match got {
            Ok(Decoded::Chunk(c)) => {
                prop_assert!(bytes.len() >= 4);
                prop_assert_ne!(&bytes[..4], &[0, 0, 0, 0][..]);
                prop_assert_eq!(c.encode(), msg);
            }
            Err(e) if bytes.len() < 4 => prop_assert_eq!(e, FrameError::ChunkTooShort { len: bytes.len() }),
            Err(e) => prop_assert_eq!(e.kind(), "id_zero"),
            Ok(other) => prop_assert!(false, "binary decoded to {:?}", other),
        }
        // The same bytes as text.
        check_any_outcome(&frame::decode_text(&String::from_utf8_lossy(&bytes)))?;
    }

    #[test]
    fn text_decode_never_panics(s in any::<String>()) {
        check_any_outcome(&frame::decode_text(&s))?;
        check_any_outcome(&frame::decode_text(&format!("{{{s}}}")))?;
    }

    #[test]
    fn json_ish_decode_never_panics(s in json_ish()) {
        check_any_outcome(&frame::decode_text(&s))?;
    }

    #[test]
    fn generated_objects_decode_as_predicted(obj in gen_object()) {
        check_generated(&obj)?;
    }

    #[test]
    fn split_body_reassembles(len in 0usize..20_000, seed in any::<u8>(), max in prop_oneof![
        8 => 0usize..=5000,
        1 => Just(usize::MAX),
        1 => MAX_CHUNK_BODY - 1..=MAX_CHUNK_BODY + 1,
    ]) {
        let body = Bytes::from((0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect::<Vec<u8>>());
        check_split(&body, max)?;
    }

    #[test]
    fn content_length_agrees_with_one_value(
        n in prop_oneof![any::<u64>(), 0u64..1000, Just(u64::MAX)],
        reps in vec((random_case("content-length"), 0usize..4, 0usize..3, select(&["", " ", "\t", " \t"][..])), 1..4),
        others in vec((header_name().prop_filter("not content-length", |h| !h.eq_ignore_ascii_case("content-length")), header_value()), 0..4),
        other_value in any::<u64>(),
    ) {
        let mut pairs: Vec<(String, String)> = others.clone();
        for (i, (name, form, zeros, ows)) in reps.iter().enumerate() {
            let digits = format!("{}{n}", "0".repeat(*zeros));
            let value = match form {
                0 => digits,
                1 => format!("{ows}{digits}{ows}"),
                2 => format!("{digits}{ows},{ows}{n}"),
                _ => format!("{n},{digits}"),
            };
            pairs.insert(i.min(pairs.len()), (name.clone(), value));
        }
        let h = Headers::try_from_pairs(pairs.clone()).unwrap();
        prop_assert_eq!(h.content_length(), Ok(Some(n)));

        let none = Headers::try_from_pairs(others).unwrap();
        prop_assert_eq!(none.content_length(), Ok(None));

        if other_value != n {
            pairs.push(("Content-Length".to_owned(), other_value.to_string()));
            let h = Headers::try_from_pairs(pairs).unwrap();
            prop_assert_eq!(h.content_length(), Err(HeaderError::InvalidContentLength));
        }
    }

    #[test]
    fn hop_by_hop_headers_are_never_kept(entries in vec(hop_entry(), 0..12)) {
        let h = Headers::try_from_pairs(entries.clone()).unwrap();
        let listed: Vec<String> = entries
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, v)| v.split(','))
            .map(|t| t.trim_matches(|c| c == ' ' || c == '\t').to_ascii_lowercase())
            .filter(|t| !t.is_empty())
            .collect();
        let hop = |name: &str| {
            let l = name.to_ascii_lowercase();
            ["connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"]
                .contains(&l.as_str())
                || l.starts_with("proxy-")
                || listed.contains(&l)
        };
        let kept = h.without_hop_by_hop();
        for (name, _) in kept.iter() {
            prop_assert!(!hop(name), "kept hop-by-hop header {}", name);
            prop_assert!(!is_hop_by_hop_name(name));
            prop_assert!(!h.is_hop_by_hop(name));
        }
        let expected: Vec<(String, String)> = entries.into_iter().filter(|(n, _)| !hop(n)).collect();
        prop_assert_eq!(kept.clone().into_vec(), expected, "dropped an end-to-end header or reordered");
        prop_assert_eq!(kept.without_hop_by_hop(), kept);
    }

}

proptest! {
    // Bodies of several MiB: few cases, as each allocates and compares megabytes.
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn split_large_bodies_into_valid_chunks(
        len in prop_oneof![Just(MAX_CHUNK_BODY), Just(MAX_CHUNK_BODY + 1), 0usize..3 * MAX_CHUNK_BODY + 7],
        id in stream_id(),
    ) {
        let body = Bytes::from(vec![0x5a; len]);
        check_split(&body, usize::MAX)?;
        let mut total = 0;
        for piece in split_body(body.clone(), usize::MAX) {
            let wire = encode_chunk(id, &piece);
            prop_assert!(wire.len() <= MAX_MESSAGE_LEN);
            let Ok(Decoded::Chunk(c)) = frame::decode_binary(wire) else {
                return Err(TestCaseError::fail("a split piece does not decode as a chunk"));
            };
            prop_assert_eq!(c.id, id);
            total += c.data.len();
        }
        prop_assert_eq!(total, len);
    }
}

fn check_split(body: &Bytes, max: usize) -> Result<(), TestCaseError> {
    let limit = max.clamp(1, MAX_CHUNK_BODY);
    let it = split_body(body.clone(), max);
    let expected_count = body.len().div_ceil(limit);
    prop_assert_eq!(it.len(), expected_count);
    let pieces: Vec<Bytes> = it.collect();
    prop_assert_eq!(pieces.len(), expected_count);
    let mut offset = 0;
    for (i, p) in pieces.iter().enumerate() {
        prop_assert!(
            !p.is_empty() && p.len() <= limit,
            "piece of {} bytes",
            p.len()
        );
        if i + 1 < pieces.len() {
            prop_assert_eq!(p.len(), limit);
        }
        prop_assert_eq!(
            p.as_ptr(),
            body[offset..].as_ptr(),
            "piece {} was copied",
            i
        );
        offset += p.len();
    }
    prop_assert_eq!(offset, body.len());
    prop_assert_eq!(pieces.concat(), body.to_vec());
    Ok(())
}

/// One header for the hop-by-hop test: hop-by-hop names in any case, `Proxy-*`,
/// ordinary names, and `Connection` headers listing names with optional whitespace.
fn hop_entry() -> impl Strategy<Value = (String, String)> {
    let pool = &[
        "x-private",
        "X-Private",
        "host",
        "authorization",
        "content-length",
        "keep-alive",
        "te",
        "foo",
    ][..];
    let plain_name = prop_oneof![
        3 => select(&["keep-alive", "transfer-encoding", "upgrade", "te", "trailer", "proxy-authorization", "proxy-"][..])
            .prop_flat_map(random_case),
        1 => token(8).prop_flat_map(|t| random_case(format!("proxy-{t}"))),
        3 => select(pool).prop_flat_map(random_case),
        2 => token(10),
        1 => select(&["tee", "proxy", "connections", "xte", "upgrade-insecure-requests"][..]).prop_map(String::from),
    ];
    let listed = (
        prop_oneof![3 => select(pool).prop_map(String::from), 1 => token(6)],
        select(&["", " ", "\t", "  "][..]),
        select(&["", " ", "\t"][..]),
    )
        .prop_map(|(t, a, b)| format!("{a}{t}{b}"));
    prop_oneof![
        3 => (plain_name, header_value()),
        1 => (random_case("connection"), vec(listed, 0..4).prop_map(|ts| ts.join(","))),
    ]
}

// ------------------------------------------------------------------ deterministic edge cases

#[test]
fn deep_nesting_does_not_overflow_the_stack() {
    for open in ["[", "{\"a\":"] {
        for depth in [100, 127, 128, 129, 1_000, 100_000] {
            let text = format!("{{\"type\":\"end\",\"id\":1,\"x\":{}", open.repeat(depth));
            let got = frame::decode_text(&text);
            assert!(matches!(got, Err(FrameError::InvalidJson(_))), "{got:?}");
        }
    }
    // Balanced and deep (100,000 levels, within the size limit) anywhere in
    // the object: a defined outcome, no stack overflow.
    let nest = |d: usize| format!("{}{}", "[".repeat(d), "]".repeat(d));
    let deep = nest(100_000);
    let cases = [
        (format!("{{\"type\":\"end\",\"id\":1,\"x\":{deep}}}"), "ok"),
        (
            format!("{{\"type\":\"end\",\"id\":{deep}}}"),
            "id_not_a_number",
        ),
        (format!("{{\"type\":{deep},\"id\":1}}"), "wrong_type"),
        (
            format!("{{\"type\":\"response\",\"id\":1,\"status\":200,\"headers\":{deep}}}"),
            "wrong_type",
        ),
        (
            format!(
                "{{\"type\":\"response\",\"id\":1,\"status\":200,\"headers\":[[\"a\",{deep}]]}}"
            ),
            "wrong_type",
        ),
        (
            format!("{{\"type\":\"request\",\"id\":1,\"method\":\"GET\",\"path\":{deep}}}"),
            "wrong_type",
        ),
        (deep.clone(), "not_an_object"),
    ];
    for (text, want) in cases {
        let got = frame::decode_text(&text);
        let kind = got.as_ref().map_or_else(|e| e.kind(), |_| "ok");
        assert_eq!(kind, want, "{}...: {got:?}", &text[..40]);
    }
}

#[test]
fn many_headers_round_trip() {
    let pairs: Vec<(String, String)> = (0..5000)
        .map(|i| (format!("x-h{i}"), format!("v{i}\u{e9}")))
        .collect();
    let f = ControlFrame::Response {
        id: StreamId::MAX,
        head: ResponseHead::new(200, Headers::try_from_pairs(pairs).unwrap()).unwrap(),
    };
    assert_eq!(frame::decode_text(&f.encode()), Ok(Decoded::Control(f)));
}

// ------------------------------------------------------------------ differential: the decoder vs serde_json::Value

/// The reference decoder of a head's headers: `serde_json::Value`, then the
/// pairs checked one by one (the decoder writes them into one buffer as it
/// parses instead, issue 28). `Ok(None)`: no headers field.
fn reference_headers(text: &str) -> Result<Option<Vec<(String, String)>>, &'static str> {
    let v: Value = serde_json::from_str(text).map_err(|_| "not JSON")?;
    let Some(h) = v.get("headers") else {
        return Ok(None);
    };
    if h.is_null() {
        return Ok(None);
    }
    let list = h.as_array().ok_or("wrong type")?;
    let mut out = Vec::new();
    for p in list {
        match p.as_array().map(Vec::as_slice) {
            Some([Value::String(n), Value::String(v)]) => out.push((n.clone(), v.clone())),
            _ => return Err("wrong type"),
        }
    }
    Ok(Some(out))
}

/// A header name or value as a broken peer might send it: valid text, a
/// char above U+00FF, CR/LF, escapes JSON must undo.
fn wild_text() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            8 => value_char(),
            1 => Just('"'),
            1 => Just('\\'),
            1 => Just('\r'),
            1 => Just('\u{20ac}'),
            1 => Just(' '),
        ],
        0..=12,
    )
    .prop_map(|c| c.into_iter().collect())
}

proptest! {
    #[test]
    fn decoded_headers_match_the_value_reference(
        pairs in vec(
            prop_oneof![
                3 => (header_name(), header_value()).prop_map(|(n, v)| json!([n, v])),
                2 => (wild_text(), wild_text()).prop_map(|(n, v)| json!([n, v])),
                1 => (0usize..4).prop_map(|i| [json!(["a"]), json!(["a", "b", "c"]), json!([1, "b"]), json!("x")][i].clone()),
            ],
            0..10,
        ),
        escape_all in any::<bool>(),
    ) {
        let frame = json!({"type": "response", "id": 7, "status": 200, "headers": pairs});
        let mut text = frame.to_string();
        if escape_all {
            // The same text with every non-ASCII char as a \u escape.
            text = text.chars().map(|c| if c.is_ascii() { c.to_string() } else { format!("\\u{:04x}", c as u32) }).collect();
        }
        let reference = reference_headers(&text);
        let decoded = frame::decode_text(&text);
        match (&reference, &decoded) {
            (Ok(Some(expected)), Ok(Decoded::Control(ControlFrame::Response { head, .. }))) => {
                let got: Vec<(String, String)> = head.headers().clone().into_vec();
                prop_assert_eq!(&got, expected);
                let by_iter: Vec<(&str, &str)> = head.headers().iter().collect();
                prop_assert_eq!(by_iter.len(), expected.len());
                // Rebuilt from the reference's pairs, the list is equal, as is its JSON.
                let rebuilt = Headers::try_from_pairs(expected.iter().cloned()).unwrap();
                prop_assert_eq!(&rebuilt, head.headers());
                prop_assert_eq!(serde_json::to_value(head.headers()).unwrap(), serde_json::to_value(expected).unwrap());
            }
            (Ok(Some(expected)), Err(FrameError::InvalidHeader(e))) => {
                // The reference's pairs hold the same fault at the same index.
                prop_assert_eq!(Headers::try_from_pairs(expected.iter().cloned()).unwrap_err(), *e);
            }
            (Err("wrong type"), Err(FrameError::WrongType("headers"))) => {}
            (r, d) => prop_assert!(false, "reference {:?} but decoded {:?} for {}", r, d, text),
        }
    }
}

// ------------------------------------------------------------------ differential: the fast scanner vs the serde path

/// Ways to write a frame's text that a scanner may get wrong: another
/// peer's formatting (Python's `", "` and `": "`), escapes, an unknown
/// field, a repeated one, `null`, a float id, cut short, trailing bytes.
fn rewrite(text: &str, how: u8, at: usize) -> String {
    let cut = |s: &str| {
        let mut i = at % (s.len() + 1);
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    match how % 12 {
        0 => text.to_string(),
        1 => text
            .replace("\",\"", "\", \"")
            .replace("\":", "\": ")
            .replace(",[", ", ["),
        2 => format!(" \n{}\t\r\n", text.replace(',', " ,\n ")),
        3 => escape_non_ascii(text).replace("/", "\\/"),
        4 => text.replacen('{', "{\"x-extra\":[1,{\"a\":null}],", 1),
        5 => text.replacen("\"id\":", "\"id\":1,\"id\":", 1),
        6 => text.replacen("\"headers\":", "\"headers\":null,\"h\":", 1),
        7 => text.replacen("\"id\":", "\"id\":-", 1),
        8 => text.replacen("\"id\":", "\"id\":0", 1),
        9 => {
            let i = cut(text);
            text[..i].to_string()
        }
        10 => format!("{text}{}", &"},]x"[at % 4..]),
        _ => {
            let i = cut(text);
            format!("{}\u{1}{}", &text[..i], &text[i..])
        }
    }
}

fn tight_limits(n: usize, bytes: usize) -> frame::HeadLimits {
    let mut l = frame::HeadLimits::default();
    l.max_headers = n;
    l.max_head_bytes = bytes;
    l
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_fast_scanner_agrees_with_the_serde_path(
        text in prop_oneof![
            3 => (control_frame(), any::<u8>(), any::<usize>())
                .prop_map(|(f, how, at)| rewrite(&f.encode(), how, at)),
            2 => gen_object().prop_map(|o| o.to_text()),
            1 => json_ish(),
        ],
        n in 0usize..6,
        bytes in 0usize..400,
    ) {
        prop_assert_eq!(frame::decode_text(&text), frame::decode_text_reference(&text, None), "{}", text);
        let l = tight_limits(n, bytes);
        prop_assert_eq!(
            frame::decode_text_limited(&text, &l),
            frame::decode_text_reference(&text, Some(&l)),
            "{} with at most {} headers, {} bytes", text, n, bytes
        );
    }
}
