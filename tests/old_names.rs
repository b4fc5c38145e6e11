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
