//! Replays the committed fuzz seed corpora (`fuzz/corpus-seeds/<target>/`)
//! through the same checks the cargo-fuzz targets run, on stable Rust.
//!
//! `WORKER_RELAY_FUZZ_TRACE=1` prints every step of the machine harnesses;
//! `WORKER_RELAY_FUZZ_FILE=<path>` replays that one file through every
//! target instead (for reading a crash artifact).
use std::path::{Path, PathBuf};
use worker_relay_harness as fuzzing; // fuzz/harness: the models of the invariants

fn seeds(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus-seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no seed", dir.display());
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    fuzzing::set_trace(std::env::var_os("WORKER_RELAY_FUZZ_TRACE").is_some());
    let files = match std::env::var_os("WORKER_RELAY_FUZZ_FILE") {
        Some(f) => vec![PathBuf::from(f)],
        None => seeds(target),
    };
    for file in files {
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        eprintln!("{target}: {}", file.display());
        run(&data);
    }
}

#[test]
fn frame_decode_seeds() {
    replay("frame_decode", fuzzing::frame_decode);
}

#[test]
fn worker_machine_seeds() {
    replay("worker_machine", fuzzing::worker_machine);
}

#[test]
fn relay_machine_seeds() {
    replay("relay_machine", fuzzing::relay_machine);
}

#[test]
fn handshake_and_url_seeds() {
    replay("handshake_and_url", fuzzing::handshake_and_url);
}
