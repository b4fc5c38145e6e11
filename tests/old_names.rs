//! The 0.1 paths that 0.2 moved or renamed still name the same items (for
//! one release; CHANGELOG.md lists each with its replacement).
#![allow(deprecated)]

use std::any::TypeId;
use worker_relay::{connect, gateway, rt, server};

#[test]
fn moved_items_are_the_same_items_under_their_old_paths() {
    assert_eq!(
        TypeId::of::<rt::Request>(),
        TypeId::of::<rt::IncomingRequest>()
    );
    assert_eq!(
        TypeId::of::<rt::Response>(),
        TypeId::of::<rt::WorkerResponse>()
    );
    assert_eq!(
        TypeId::of::<gateway::BoxError>(),
        TypeId::of::<worker_relay::BoxError>()
    );
    assert_eq!(
        TypeId::of::<server::PeerAddr>(),
        TypeId::of::<worker_relay::PeerAddr>()
    );
    assert_eq!(gateway::REPLACED, connect::REPLACED);
}

#[test]
fn the_forwarding_conversions_still_answer_under_connect_http() {
    use worker_relay::connect::{http as old, UrlMap};
    use worker_relay::forward as new;
    assert_eq!(
        TypeId::of::<old::HttpError>(),
        TypeId::of::<new::HttpError>()
    );
    let caller = ::http::Request::get("/w/abc/x?y=1")
        .header("x-a", "cafe")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let map = UrlMap::default();
    let head = old::request_head_from_parts(&caller, &map).unwrap();
    assert_eq!(head, new::request_head_from_parts(&caller, &map).unwrap());
    let req = old::request_builder(&head.1).unwrap().body(()).unwrap();
    assert_eq!(req.uri(), "/x?y=1");
    assert_eq!(
        old::headers_from_map(req.headers()).unwrap(),
        new::headers_from_map(req.headers()).unwrap()
    );
    let h = new::headers_from_map(req.headers()).unwrap();
    assert_eq!(
        old::header_map_from_headers(&h).unwrap(),
        new::header_map_from_headers(&h).unwrap()
    );
    let resp = ::http::Response::builder()
        .status(201)
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let rhead = old::response_head_from_parts(&resp).unwrap();
    assert_eq!(rhead, new::response_head_from_parts(&resp).unwrap());
    assert_eq!(
        old::response_builder(&rhead)
            .unwrap()
            .body(())
            .unwrap()
            .status(),
        201
    );
}
