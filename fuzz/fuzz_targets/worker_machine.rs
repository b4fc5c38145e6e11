//! Fuzz target `worker_machine`: see `worker_relay::fuzzing::worker_machine` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worker_relay::fuzzing::worker_machine(data));
