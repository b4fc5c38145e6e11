//! Replays the golden conversations of `tests/vectors/relay_responses.json`
//! (documented in `tests/vectors/README.md`) through a `RelayConnection`:
//! one request, the worker's messages, and what the caller gets and what the
//! relay sends back.

use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Instant;
use worker_relay::frame::{
    decode, encode_chunk, ControlFrame, Decoded, Headers, Message, RequestHead,
};
use worker_relay::proto::{BodyRead, RelayConnection, RelayEvent};

const CASES: &str = include_str!("vectors/relay_responses.json");

/// What the caller got, in the file's terms.
fn caller(r: &mut RelayConnection, events: &[RelayEvent]) -> Value {
    let status = events.iter().find_map(|e| match e {
        RelayEvent::Response { head, .. } => Some(head.status()),
        _ => None,
    });
    let Some(status) = status else {
        return Value::from(502);
    };
    let key = events[0].key();
    let mut body = Vec::new();
    let complete = loop {
        match r.read_body(key) {
            BodyRead::Data(d) => body.extend_from_slice(&d),
            BodyRead::End => break true,
            BodyRead::Gone => break false,
            BodyRead::Pending => panic!("the stream did not end"),
            _ => unreachable!("a variant this test does not know"),
        }
    };
    serde_json::json!({
        "status": status,
        "body": String::from_utf8(body).expect("UTF-8 bodies"),
        "complete": complete,
    })
}

fn run(case: &Value) -> Result<(), String> {
    let method = case["request"]["method"].as_str().ok_or("request.method")?;
    let mut r = RelayConnection::default();
    let key = r
        .open_stream(RequestHead::new(method, "/x", "", Headers::new()).unwrap())
        .map_err(|e| e.to_string())?;
    r.finish(key).map_err(|e| e.to_string())?;
    let sent: Vec<Decoded> = std::iter::from_fn(|| r.poll_transmit())
        .map(|m| decode(&m).unwrap().unwrap())
        .collect();
    let id = r.stream_id(key).ok_or("no id")?;
    if sent.len() != 2 {
        return Err(format!("expected request + end, sent {sent:?}"));
    }
    let now = Instant::now();
    for m in case["worker"].as_array().ok_or("worker")? {
        let msg = if let Some(t) = m["text"].as_str() {
            Message::Text(t.replace("{id}", &id.to_string()))
        } else if let Some(c) = m["chunk"].as_str() {
            Message::Binary(encode_chunk(id, c.as_bytes()))
        } else {
            return Err(format!("bad worker message {m}"));
        };
        r.handle_message(msg, now).map_err(|e| e.to_string())?;
    }
    let events: Vec<RelayEvent> = std::iter::from_fn(|| r.poll_event()).collect();
    let got = caller(&mut r, &events);
    if got != case["expect"]["caller"] {
        return Err(format!(
            "caller got {got}, expected {}",
            case["expect"]["caller"]
        ));
    }
    let back: Vec<String> = std::iter::from_fn(|| r.poll_transmit())
        .map(|m| match decode(&m).unwrap().unwrap() {
            Decoded::Control(ControlFrame::Abort { id: a }) if a == id => "abort".to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    let want: Vec<String> = serde_json::from_value(case["expect"]["relay_sends"].clone())
        .map_err(|e| format!("relay_sends: {e}"))?;
    if back != want {
        return Err(format!("relay sent {back:?}, expected {want:?}"));
    }
    Ok(())
}

#[test]
fn replay_every_conversation() {
    let doc: Value = serde_json::from_str(CASES).expect("valid JSON");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    let mut names = BTreeSet::new();
    let mut failures = Vec::new();
    for c in cases {
        let name = c["name"].as_str().expect("every case has a name");
        assert!(names.insert(name), "duplicate case name {name}");
        if let Err(e) = run(c) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
