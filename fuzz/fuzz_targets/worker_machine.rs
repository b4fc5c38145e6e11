//! Fuzz target `worker_machine`: see `worker_relay_harness::worker_machine` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worker_relay_harness::worker_machine(data));
