//! Issue 23's cases (a worker connection that stops reading and is then
//! replaced, a 64 KiB bearer token, an interactive upload): each fails on a
//! fake with the flaw and passes on the same fake without it; and the
//! crate's relay passes the replaced-connection case once something cuts a
//! write that makes no progress.

use crate::fake_stream_relay::{streaming_relay, Hole};
use crate::fakes::WorkerFlaws;
use crate::report::{CaseResult, Outcome};
use crate::{assert_fails, assert_passes, fake_worker_run, lines, relay_config, run, TOKEN};
use std::time::Duration;
use worker_relay::connect::TokenTable;
use worker_relay_hyper::gateway::{DuplicatePolicy, Gateway};
use worker_relay_hyper::server::{serve, ServerConfig};

/// `case` against the streaming relay with `hole` (must WARN: what it
/// breaks is this kit's recommendation, not a rule of the spec) and
/// without (must pass), at once.
async fn warned_and_sound(hole: Hole, case: &str) {
    let (broken, sound) = both(hole, case).await;
    assert!(
        matches!(crate::outcome(&broken, case), Outcome::Warn(_)),
        "{case} should WARN:\n{}",
        lines(&broken)
    );
    assert_passes(&sound, case);
}

async fn both(hole: Hole, case: &str) -> (Vec<CaseResult>, Vec<CaseResult>) {
    let broken = relay_config(streaming_relay(hole), Some(case));
    let sound = relay_config(streaming_relay(Hole::None), Some(case));
    let (broken, sound) = tokio::join!(run(&broken), run(&sound));
    // Shown with --nocapture: what each fake came to.
    eprintln!("{}\n{}", lines(&broken), lines(&sound));
    (broken, sound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_holding_each_upload_piece_is_warned_by_the_interactive_case() {
    warned_and_sound(Hole::HoldPieces, "relay.upload.interactive").await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refusing_duplicates_gets_info_from_the_replace_cases() {
    // The spec leaves a second connection to the relay: a retryable
    // refusal is reported, not failed; the kit is connected again after.
    let table = TokenTable::parse(&format!("abc {TOKEN}\n")).unwrap();
    let g = Gateway::builder(table)
        .duplicates(DuplicatePolicy::Refuse)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(serve(listener, g.service(), ServerConfig::default()));
    let results = run(&relay_config(addr.clone(), Some("relay.replace.*"))).await;
    eprintln!("{}", lines(&results));
    for id in [
        "relay.replace.older-connection",
        "relay.replace.unread-older",
    ] {
        assert!(
            matches!(crate::outcome(&results, id), Outcome::Info(_)),
            "{id} should be INFO:\n{}",
            lines(&results)
        );
    }
    // Nor does the handshake case ask it for a second connection.
    let case = "relay.handshake.subprotocol";
    assert_passes(&run(&relay_config(addr, Some(case))).await, case);
}

/// The slow tier: `cargo test` skips these (`#[ignore]`, each says why);
/// `.ci/slow` runs them (`cargo test -- --ignored slow::`).
mod slow {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_relay_waiting_on_a_replaced_connection_that_never_reads_is_warned_by_the_unread_case(
    ) {
        // It still serves the newer connection; holding the older is against
        // the kit's recommendation (the spec says nothing of a second connection).
        warned_and_sound(Hole::WaitOnReplaced, "relay.replace.unread-older").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_relay_spending_time_per_token_byte_is_warned_by_the_large_token_case() {
        warned_and_sound(Hole::SlowPerTokenByte, "relay.handshake.large-token").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn the_crates_relay_passes_the_unread_case_when_stuck_writes_are_cut() {
        // The server's send timeout (5 s here, 60 s by default) closes the
        // connection whose writes make no progress: the kit sees the reset.
        let g = Gateway::new(TokenTable::parse(&format!("abc {TOKEN}\n")).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let config = ServerConfig::default().send_timeout(Duration::from_secs(5));
        tokio::spawn(serve(listener, g.service(), config));
        let case = "relay.replace.unread-older";
        let results = run(&relay_config(addr, Some(case))).await;
        eprintln!("{}", lines(&results));
        assert_passes(&results, case);
    }
}
