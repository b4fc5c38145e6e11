//! Fuzz target `handshake_and_url`: see `worker_relay_harness::handshake_and_url` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worker_relay_harness::handshake_and_url(data));
