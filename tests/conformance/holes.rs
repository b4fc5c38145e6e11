//! Issue 23's cases: each fails on a fake with the flaw and passes on the
//! same fake without it.

use crate::fake_stream_relay::{streaming_relay, Hole};
use crate::fakes::WorkerFlaws;
use crate::{assert_fails, assert_passes, fake_worker_run, lines, relay_config, run};

/// `case` against the streaming relay with `hole` (must fail) and without
/// (must pass), at once.
async fn broken_and_sound(hole: Hole, case: &str) {
    let broken = relay_config(streaming_relay(hole), Some(case));
    let sound = relay_config(streaming_relay(Hole::None), Some(case));
    let (broken, sound) = tokio::join!(run(&broken), run(&sound));
    // Shown with --nocapture: what each fake came to.
    eprintln!("{}\n{}", lines(&broken), lines(&sound));
    assert_fails(&broken, case);
    assert_passes(&sound, case);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_spending_time_per_token_byte_fails_the_large_token_case() {
    broken_and_sound(Hole::SlowPerTokenByte, "relay.handshake.large-token").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_holding_each_upload_piece_fails_the_interactive_case() {
    broken_and_sound(Hole::HoldPieces, "relay.upload.interactive").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_echoing_only_a_whole_body_fails_the_interactive_case() {
    let case = "worker.upload.interactive";
    let held = WorkerFlaws {
        hold_echo: true,
        ..Default::default()
    };
    let (broken, sound) = tokio::join!(
        fake_worker_run(held, case),
        fake_worker_run(WorkerFlaws::default(), case)
    );
    eprintln!("{}\n{}", lines(&broken), lines(&sound));
    assert_fails(&broken, case);
    assert_passes(&sound, case);
}
