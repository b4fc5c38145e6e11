//! Fuzz target `frame_decode`: see `worker_relay_harness::frame_decode` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worker_relay_harness::frame_decode(data));
