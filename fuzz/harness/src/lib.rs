//! The fuzz harness of `worker-relay`: the models of its invariants, shared by
//! the cargo-fuzz targets (`fuzz/fuzz_targets/`) and the stable replay of the
//! seed corpora (`tests/fuzz_corpus.rs` in the crate). Not published.
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
//!
//! [`WorkerConnection`]: worker_relay::proto::WorkerConnection
//! [`RelayConnection`]: worker_relay::proto::RelayConnection
//!
//! The wire rules both machine harnesses check on every message a machine
//! emits are written once, in [`WireCheck`] (with [`Expected`] for "the
//! bytes are exactly the next ones of the body"); the crate's property test
//! of whole conversations (`tests/proto_props.rs`) checks with them too.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::sync::atomic::{AtomicBool, Ordering};

/// Most operations one machine input runs (inputs are short anyway).
pub(crate) const MAX_STEPS: usize = 4096;

pub(crate) static TRACE: AtomicBool = AtomicBool::new(false);

/// Prints every step, message and event of the machine harnesses to stderr
/// (for reading a crash: `tests/fuzz_corpus.rs` turns it on when
/// `WORKER_RELAY_FUZZ_TRACE` is set).
pub fn set_trace(on: bool) {
    TRACE.store(on, Ordering::Relaxed);
}

macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::TRACE.load(::std::sync::atomic::Ordering::Relaxed) {
            eprintln!($($arg)*);
        }
    };
}

mod cursor;
mod expected;
mod frame_decode;
mod gen;
mod handshake;
mod model;
mod prelude;
mod relay;
mod wire;
mod worker;

pub use cursor::Cursor;
pub(crate) use cursor::*;
pub use expected::Expected;
pub use frame_decode::frame_decode;
pub(crate) use gen::*;
pub use handshake::handshake_and_url;
pub(crate) use model::*;
pub use relay::relay_machine;
pub use wire::{BodyKind, Seen, Side, WireCheck};
pub use worker::worker_machine;
