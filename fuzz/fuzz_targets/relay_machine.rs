//! Fuzz target `relay_machine`: see `worker_relay_harness::relay_machine` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worker_relay_harness::relay_machine(data));
