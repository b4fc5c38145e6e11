//! The `http` feature: a caller's `http::Request` travels relay → frame →
//! worker → `http::Request`, and the app's `http::Response` travels back.
#![cfg(feature = "http")]

use worker_relay::connect::{UrlError, UrlMap};
use worker_relay::forward::{
    request_builder, request_head_from_parts, response_builder, response_head_from_parts, HttpError,
};
use worker_relay::frame::{self, ControlFrame, Decoded, StreamId};

fn through_the_wire(frame: ControlFrame) -> ControlFrame {
    match frame::decode_text(&frame.encode()).unwrap() {
        Decoded::Control(f) => f,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_request_and_its_response_round_trip() {
    let id = StreamId::new(7).unwrap();
    let caller = http::Request::builder()
        .method("POST")
        .uri("https://relay.example.com/w/abc/v1/execute?mode=x%20y")
        .header("Authorization", "Bearer worker-token")
        .header("Content-Type", "multipart/form-data; boundary=b")
        .header("Content-Length", "52133")
        .header("Connection", "keep-alive")
        .header("Upgrade", "h2c")
        .header("TE", "trailers")
        .header("Keep-Alive", "timeout=5")
        .header("Proxy-Connection", "x")
        .header("X-Name", http::HeaderValue::from_bytes(b"Ren\xe9").unwrap())
        .body(())
        .unwrap();
    let (parts, ()) = caller.into_parts();

    // Relay: map and forward.
    let (worker, head) = request_head_from_parts(&parts, &UrlMap::default()).unwrap();
    assert_eq!(worker, "abc");
    let frame = through_the_wire(ControlFrame::Request { id, head });
    assert!(frame
        .encode()
        .contains(r#""path":"/v1/execute","query":"mode=x%20y""#));
    let ControlFrame::Request { head, .. } = frame else {
        unreachable!()
    };

    // Worker: rebuild the request for the app.
    let req = request_builder(&head).unwrap().body(()).unwrap();
    assert_eq!(req.method(), http::Method::POST);
    assert_eq!(req.uri(), "/v1/execute?mode=x%20y");
    let names: Vec<&str> = req.headers().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        names,
        ["authorization", "content-type", "content-length", "x-name"]
    );
    assert_eq!(req.headers()["x-name"].as_bytes(), b"Ren\xe9");

    // Worker: the app's response, as a frame.
    let app = http::Response::builder()
        .status(http::StatusCode::CREATED)
        .header("Content-Type", "application/x-tar")
        .header("X-Strata-Executor-Protocol", "v1")
        .header("Connection", "close")
        .body(())
        .unwrap();
    let (parts, ()) = app.into_parts();
    let head = response_head_from_parts(&parts).unwrap();
    let frame = through_the_wire(ControlFrame::Response { id, head });
    let ControlFrame::Response { head, .. } = frame else {
        unreachable!()
    };

    // Relay: back to its caller, hop-by-hop headers dropped.
    let resp = response_builder(&head).unwrap().body(()).unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["content-type"], "application/x-tar");
    assert_eq!(resp.headers()["x-strata-executor-protocol"], "v1");
    assert!(resp.headers().get("connection").is_none());
}

#[test]
fn requests_outside_a_worker_are_refused() {
    let map = UrlMap::new("/relay/").unwrap();
    for (uri, err) in [
        ("/relay/abc/../other/v1/execute", UrlError::DotSegment),
        ("/w/abc/v1/execute", UrlError::NotUnderPrefix),
    ] {
        let (parts, ()) = http::Request::get(uri).body(()).unwrap().into_parts();
        assert_eq!(
            request_head_from_parts(&parts, &map),
            Err(HttpError::Url(err)),
            "{uri}"
        );
    }
    let (parts, ()) = http::Request::get("/relay/%61bc/health")
        .body(())
        .unwrap()
        .into_parts();
    assert!(matches!(
        request_head_from_parts(&parts, &map),
        Err(HttpError::Url(UrlError::InvalidWorkerId(_)))
    ));
}
