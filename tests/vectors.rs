//! Replays the golden vectors of `tests/vectors/frames.json` (documented in
//! `tests/vectors/README.md`) through the frame decoder and encoder.
//!
//! Every vector is checked and every failure reported at once; the test also
//! guards the file's coverage: at least 50 vectors, and every error kind that
//! `FrameError::kind` can return (read from `src/frame/error.rs`) is exercised
//! by at least one vector and documented in the file's `error_kinds`.

use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use worker_relay::frame::{
    self, ControlFrame, Decoded, FrameError, HeaderError, Headers, Message, MAX_MESSAGE_LEN,
};

const VECTORS: &str = include_str!("vectors/frames.json");
const ERROR_RS: &str = include_str!("../src/frame/error.rs");

fn load() -> Value {
    serde_json::from_str(VECTORS).expect("tests/vectors/frames.json is valid JSON")
}

fn vectors(doc: &Value) -> &Vec<Value> {
    doc["vectors"].as_array().expect("`vectors` is an array")
}

/// The kind strings `FrameError::kind` returns, read from its source so a new
/// kind added there without a vector fails this test.
fn kinds_in_error_rs() -> BTreeSet<String> {
    let start = ERROR_RS
        .find("pub fn kind(&self)")
        .expect("error.rs defines FrameError::kind");
    let body = &ERROR_RS[start..];
    let body = &body[..body.find("\n    }\n").expect("end of fn kind")];
    let kinds: BTreeSet<String> = body
        .split("=> \"")
        .skip(1)
        .map(|s| s[..s.find('"').expect("closing quote")].to_owned())
        .collect();
    assert!(kinds.len() >= 10, "parsed too few kinds: {kinds:?}");
    kinds
}

/// The WebSocket message a vector describes.
enum Input {
    Text(String),
    Binary(Bytes),
}

fn str_field<'a>(v: &'a Value, key: &str) -> Result<&'a str, String> {
    v[key]
        .as_str()
        .ok_or_else(|| format!("`{key}` must be a string"))
}

fn u64_field(v: &Value, key: &str) -> Result<u64, String> {
    v[key]
        .as_u64()
        .ok_or_else(|| format!("`{key}` must be an unsigned integer"))
}

fn input(v: &Value) -> Result<Input, String> {
    let obj = v.as_object().ok_or("vector is not an object")?;
    let sources: Vec<&str> = ["text", "text_fill", "hex", "fill"]
        .into_iter()
        .filter(|k| obj.contains_key(*k))
        .collect();
    if sources.len() != 1 {
        return Err(format!(
            "exactly one of text/text_fill/hex/fill, got {sources:?}"
        ));
    }
    let msg = match sources[0] {
        "text" => Input::Text(str_field(v, "text")?.to_owned()),
        "text_fill" => {
            let f = &v["text_fill"];
            let count = usize::try_from(u64_field(f, "count")?).map_err(|e| e.to_string())?;
            let mut s = str_field(f, "prefix")?.to_owned();
            s.push_str(&str_field(f, "repeat")?.repeat(count));
            s.push_str(str_field(f, "suffix")?);
            Input::Text(s)
        }
        "hex" => Input::Binary(
            hex::decode(str_field(v, "hex")?)
                .map_err(|e| format!("bad hex: {e}"))?
                .into(),
        ),
        _ => {
            let f = &v["fill"];
            let mut b = hex::decode(str_field(f, "prefix_hex")?).map_err(|e| e.to_string())?;
            let byte = fill_byte(v)?;
            let len = usize::try_from(u64_field(f, "len")?).map_err(|e| e.to_string())?;
            if len < b.len() {
                return Err("fill.len is shorter than the prefix".into());
            }
            b.resize(len, byte);
            Input::Binary(b.into())
        }
    };
    let kind = str_field(v, "kind")?;
    match (&msg, kind) {
        (Input::Text(_), "text") | (Input::Binary(_), "binary") => Ok(msg),
        _ => Err(format!("kind `{kind}` does not match the message given")),
    }
}

fn fill_byte(v: &Value) -> Result<u8, String> {
    let b = hex::decode(str_field(&v["fill"], "byte_hex")?).map_err(|e| e.to_string())?;
    match b[..] {
        [x] => Ok(x),
        _ => Err("fill.byte_hex must be one byte".into()),
    }
}

fn headers_value(h: &Headers) -> Value {
    Value::Array(h.iter().map(|(n, v)| json!([n, v])).collect())
}

/// The decoded frame as the canonical JSON object, built from the accessors
/// (independently of `encode`).
fn frame_value(f: &ControlFrame) -> Value {
    match f {
        ControlFrame::Request { id, head } => json!({
            "type": "request",
            "id": id.get(),
            "method": head.method(),
            "path": head.path(),
            "query": head.query(),
            "headers": headers_value(head.headers()),
        }),
        ControlFrame::Response { id, head } => json!({
            "type": "response",
            "id": id.get(),
            "status": head.status(),
            "headers": headers_value(head.headers()),
        }),
        ControlFrame::End { id } => json!({"type": "end", "id": id.get()}),
        ControlFrame::Abort { id } => json!({"type": "abort", "id": id.get()}),
        _ => unreachable!("a variant this test does not know"),
    }
}

fn decode(msg: &Input, v: &Value) -> Result<Decoded, FrameError> {
    match (v.get("limits").and_then(Value::as_str), msg) {
        (None, _) => {}
        (Some("default"), Input::Text(t)) => {
            return frame::decode_text_limited(t, &frame::HeadLimits::default());
        }
        (other, _) => panic!("limits {other:?}: only \"default\", on text vectors"),
    }
    let (direct, via_message) = match msg {
        Input::Text(t) => (
            frame::decode_text(t),
            frame::decode(&Message::Text(t.clone())),
        ),
        Input::Binary(b) => (
            frame::decode_binary(b.clone()),
            frame::decode(&Message::Binary(b.clone())),
        ),
    };
    assert_eq!(
        via_message.as_ref(),
        Some(&direct),
        "frame::decode disagrees with decode_text/decode_binary"
    );
    direct
}

fn check_frame(f: &ControlFrame, expect: &Value) -> Result<(), String> {
    let got = frame_value(f);
    if got != expect["frame"] {
        return Err(format!("decoded {got}, expected {}", expect["frame"]));
    }
    let encoded = str_field(expect, "encoded")?;
    let want_value: Value =
        serde_json::from_str(encoded).map_err(|e| format!("`encoded` is not JSON: {e}"))?;
    if want_value != expect["frame"] {
        return Err("the vector's `encoded` does not parse to its `frame`".into());
    }
    let ours = f.encode();
    if ours != encoded {
        return Err(format!("encoded as {ours:?}, expected {encoded:?}"));
    }
    if f.to_message() != Message::Text(ours.clone()) {
        return Err("to_message is not Message::Text(encode())".into());
    }
    match frame::decode_text(&ours) {
        Ok(Decoded::Control(back)) if &back == f => {}
        other => return Err(format!("re-decoding the encoding gave {other:?}")),
    }
    if let Some(cl) = expect.get("content_length") {
        let headers = match f {
            ControlFrame::Request { head, .. } => head.headers(),
            ControlFrame::Response { head, .. } => head.headers(),
            _ => return Err("content_length given for a frame without headers".into()),
        };
        let got = headers.content_length();
        let ok = match (cl, &got) {
            (Value::Null, Ok(None)) => true,
            (Value::Number(n), Ok(Some(v))) => n.as_u64() == Some(*v),
            (Value::Object(o), Err(e)) => {
                o.get("error").and_then(Value::as_str) == Some(FrameError::from(*e).kind())
            }
            _ => false,
        };
        if !ok {
            return Err(format!("content_length {got:?}, expected {cl}"));
        }
    }
    Ok(())
}

fn check_chunk(msg: &Input, v: &Value, d: &Decoded, expect: &Value) -> Result<(), String> {
    let (Input::Binary(wire), Decoded::Chunk(c)) = (msg, d) else {
        return Err(format!("expected a chunk, got {d:?}"));
    };
    if u64::from(c.id.get()) != u64_field(expect, "id")? {
        return Err(format!("chunk id {}, expected {}", c.id, expect["id"]));
    }
    if let Some(h) = expect.get("body_hex") {
        let body = hex::decode(h.as_str().ok_or("body_hex must be a string")?)
            .map_err(|e| e.to_string())?;
        if c.data[..] != body[..] {
            return Err(format!("chunk body {}, expected {h}", hex::encode(&c.data)));
        }
    } else {
        let len = usize::try_from(u64_field(expect, "body_len")?).map_err(|e| e.to_string())?;
        let byte = fill_byte(v)?;
        if c.data.len() != len || c.data.iter().any(|&b| b != byte) {
            return Err(format!("chunk body of {} bytes differs", c.data.len()));
        }
    }
    if !c.data.is_empty() && c.data.as_ptr() != wire[4..].as_ptr() {
        return Err("chunk body was copied, not sliced".into());
    }
    if c.encode() != *wire {
        return Err("re-encoding the chunk does not give the original bytes".into());
    }
    if d.to_message() != Some(Message::Binary(wire.clone())) {
        return Err("to_message is not the original binary message".into());
    }
    Ok(())
}

fn check_error(e: &FrameError, expect: &Value, doc: &Value) -> Result<(), String> {
    let kind = str_field(expect, "error")?;
    let code = u64_field(expect, "close_code")?;
    if e.kind() != kind || u64::from(e.close_code().0) != code {
        return Err(format!(
            "got {e:?} ({}, close {}), expected {kind} (close {code})",
            e.kind(),
            e.close_code().0
        ));
    }
    if doc["error_kinds"][kind]["close_code"].as_u64() != Some(code) {
        return Err(format!(
            "error_kinds.{kind}.close_code disagrees with {code}"
        ));
    }
    match e {
        FrameError::MissingField(f) | FrameError::WrongType(f) => {
            if expect["field"].as_str() != Some(*f) {
                return Err(format!("field `{f}`, expected {}", expect["field"]));
            }
        }
        FrameError::InvalidHeader(
            HeaderError::InvalidName { index }
            | HeaderError::NotLatin1 { index }
            | HeaderError::ForbiddenChar { index },
        ) => {
            if expect["header_index"].as_u64() != Some(*index as u64) {
                return Err(format!(
                    "header index {index}, expected {}",
                    expect["header_index"]
                ));
            }
        }
        _ => {
            if expect.get("field").is_some() || expect.get("header_index").is_some() {
                return Err("field/header_index given for an error that has none".into());
            }
        }
    }
    Ok(())
}

fn check(v: &Value, doc: &Value) -> Result<(), String> {
    let msg = input(v)?;
    let expect = &v["expect"];
    let outcomes: Vec<&str> = ["frame", "chunk", "ignored", "error", "accepted"]
        .into_iter()
        .filter(|k| expect.get(*k).is_some())
        .collect();
    if outcomes.len() != 1 {
        return Err(format!(
            "expect must hold exactly one of frame/chunk/ignored/error/accepted, got {outcomes:?}"
        ));
    }
    let got = decode(&msg, v);
    match (outcomes[0], &got) {
        ("frame", Ok(Decoded::Control(f))) => check_frame(f, expect),
        ("chunk", Ok(d @ Decoded::Chunk(_))) => check_chunk(&msg, v, d, &expect["chunk"]),
        ("ignored", Ok(Decoded::Unknown)) => {
            if expect["ignored"] != json!(true) {
                return Err("`ignored` must be true".into());
            }
            match Decoded::Unknown.to_message() {
                None => Ok(()),
                Some(m) => Err(format!("an ignored frame re-encodes to {m:?}")),
            }
        }
        ("error", Err(e)) => check_error(e, expect, doc),
        ("accepted", Ok(Decoded::Control(f))) => {
            if expect["accepted"].as_str() == Some(f.type_name()) {
                Ok(())
            } else {
                Err(format!(
                    "accepted {}, expected {}",
                    f.type_name(),
                    expect["accepted"]
                ))
            }
        }
        (want, got) => Err(format!("expected {want}, got {got:?}")),
    }
}

#[test]
fn replay_every_vector() {
    let doc = load();
    let mut failures = Vec::new();
    for v in vectors(&doc) {
        let name = v["name"].as_str().unwrap_or("<unnamed>");
        if let Err(e) = check(v, &doc) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} vector(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn file_is_documented_and_names_are_unique() {
    let doc = load();
    assert!(
        doc["description"].is_array() || doc["description"].is_string(),
        "top-level description"
    );
    assert_eq!(
        doc["limits"]["max_message_len"].as_u64(),
        Some(MAX_MESSAGE_LEN as u64)
    );
    let mut names = BTreeSet::new();
    for v in vectors(&doc) {
        let name = v["name"].as_str().expect("every vector has a name");
        assert!(names.insert(name), "duplicate vector name {name}");
    }
}

#[test]
fn coverage_cannot_silently_regress() {
    let doc = load();
    let vs = vectors(&doc);
    assert!(vs.len() >= 50, "only {} vectors", vs.len());

    let kinds = kinds_in_error_rs();
    let documented: BTreeSet<String> = doc["error_kinds"]
        .as_object()
        .expect("error_kinds is an object")
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        documented, kinds,
        "error_kinds in frames.json must list exactly the kinds of FrameError::kind"
    );

    // Which error kinds and which successful outcomes the vectors exercise.
    let mut errors: BTreeSet<String> = BTreeSet::new();
    let mut outcomes: BTreeSet<String> = BTreeSet::new();
    for v in vs {
        let e = &v["expect"];
        if let Some(k) = e["error"].as_str() {
            errors.insert(k.to_owned());
        } else if let Some(t) = e["frame"]["type"].as_str() {
            outcomes.insert(format!("valid {t}"));
            if let Some(k) = e["content_length"]["error"].as_str() {
                errors.insert(k.to_owned());
            }
        } else if e.get("chunk").is_some() {
            outcomes.insert("valid chunk".to_owned());
        } else if e.get("ignored").is_some() {
            outcomes.insert("ignored".to_owned());
        } else if let Some(t) = e["accepted"].as_str() {
            outcomes.insert(format!("accepted {t}"));
        } else {
            panic!("vector {} has no known outcome", v["name"]);
        }
    }
    for k in &kinds {
        assert!(errors.contains(k), "no vector exercises error kind `{k}`");
    }
    for k in &errors {
        assert!(kinds.contains(k), "`{k}` is not a kind of FrameError::kind");
    }
    for k in [
        "valid request",
        "valid response",
        "valid end",
        "valid abort",
        "valid chunk",
        "ignored",
    ] {
        assert!(outcomes.contains(k), "no vector for outcome `{k}`");
    }
    // The size limit is pinned from both sides, for text and for binary.
    for (kind, valid) in [("text", "frame"), ("binary", "chunk")] {
        let at = |len: usize, outcome: &str| {
            vs.iter().any(|v| {
                v["kind"] == kind
                    && v["expect"].get(outcome).is_some()
                    && match input(v) {
                        Ok(Input::Text(t)) => t.len() == len,
                        Ok(Input::Binary(b)) => b.len() == len,
                        Err(_) => false,
                    }
            })
        };
        assert!(
            at(MAX_MESSAGE_LEN, valid),
            "no valid {kind} vector of exactly the limit"
        );
        assert!(
            at(MAX_MESSAGE_LEN + 1, "error"),
            "no {kind} vector one byte over the limit"
        );
    }
    let binary_errors = vs
        .iter()
        .filter(|v| v["kind"] == "binary" && v["expect"].get("error").is_some())
        .count();
    assert!(binary_errors >= 4, "too few invalid binary vectors");
}
