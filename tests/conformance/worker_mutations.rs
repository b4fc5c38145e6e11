//! Issue 27: the worker-mode cases added by the kit's second version, each
//! against a fake worker broken for it (it must FAIL) and the same fake
//! without the flaw (the control: it must PASS).
//!
//! The fakes' flaws (`WorkerFlaws` in fake_worker.rs) and the case each is
//! written for:
//! - `id_zero` (answers a request on id 0): `worker.ignore.malformed`;
//! - `big_chunks` (2 MiB chunks): `worker.body.large-response`;
//! - `empty_chunk_ends`: `worker.body.empty-chunks`;
//! - `wrong_content_length`: any answered stream (the observer's violation
//!   fails whatever case saw it; `worker.request.health` here);
//! - `close_every_20s` (although its pings are answered): `worker.idle.pongs`;
//! - `wedge_on_garbage`: `worker.robust.random-frames`;
//! - `hold_unread`, with the kit knowing no worker token:
//!   `worker.flow.discard-unread` still runs (a 404 to an unknown path);
//! - `no_slow_sink`: `worker.flow.16-chunk-bound` holds the body on
//!   `/sleep` instead (and skips, not a false FAIL, with `no_sleep` too);
//! - `close_on_malformed`: `worker.ignore.malformed` and
//!   `worker.robust.random-frames` WARN (the spec does not forbid it);
//!   `close_on_unknown`: `worker.ignore.unknown` FAILs.
//!
//! Issue 41's:
//! - `big_generated_chunks` (2 MiB chunks of the bodies it makes up, its
//!   echoes within 1 MiB): `worker.body.generated-chunks` (before it, the
//!   flaw passed every case: `worker.body.large-response` measures echoes);
//! - `token_in_header`, `token_in_body` (its 404 and 500 answers carry its
//!   connect token): `worker.token.not-in-responses`, and any case that saw
//!   such an answer (`worker.app.fail-before`, which passed before);
//! - `echo_drops_content_type` (its `/echo` answers without the request's
//!   Content-Type, which every echo case took before):
//!   `worker.app.echo-contract`, by name as the app's contract.

use crate::cli::App;
use crate::fakes::WorkerFlaws as F;
use crate::report::{CaseResult, Outcome};
use crate::{assert_fails, assert_passes, fake_worker_run, fakes, lines, outcome, run_worker};

fn d() -> F {
    F::default()
}

fn assert_is(results: &[CaseResult], id: &str, word: &str) {
    assert_eq!(
        outcome(results, id).word(),
        word,
        "{id} should be {word}:\n{}",
        lines(results)
    );
}

/// The flaw fails `case`, the fake without it passes `case`.
async fn caught_with_control(flaws: F, case: &str) {
    let (broken, sound) =
        futures_util::future::join(fake_worker_run(flaws, case), fake_worker_run(d(), case)).await;
    assert_fails(&broken, case);
    assert_passes(&sound, case);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_answering_on_id_0_fails_the_malformed_case_by_name() {
    let flaws = F {
        id_zero: true,
        ..d()
    };
    let (broken, sound) = futures_util::future::join(
        fake_worker_run(flaws, "worker.ignore.malformed"),
        fake_worker_run(d(), "worker.ignore.malformed"),
    )
    .await;
    assert_fails(&broken, "worker.ignore.malformed");
    let text = outcome(&broken, "worker.ignore.malformed").text();
    assert!(text.contains("answered on ids [0"), "{text}");
    assert!(text.contains("answered on id 0"), "{text}");
    assert_passes(&sound, "worker.ignore.malformed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sending_2_mib_chunks_fails_the_large_response_case() {
    caught_with_control(
        F {
            big_chunks: true,
            ..d()
        },
        "worker.body.large-response",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_taking_an_empty_chunk_for_the_end_fails_the_empty_chunk_case() {
    caught_with_control(
        F {
            empty_chunk_ends: true,
            ..d()
        },
        "worker.body.empty-chunks",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_that_disagrees_with_the_body_fails_the_case_that_saw_it() {
    let flaws = F {
        wrong_content_length: true,
        ..d()
    };
    caught_with_control(flaws, "worker.request.health").await;
    let broken = fake_worker_run(flaws, "worker.request.health").await;
    let text = outcome(&broken, "worker.request.health").text();
    assert!(
        text.contains("Content-Length 16, but 15 body bytes"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_on_garbage_is_a_warning_closing_on_unknown_types_a_failure() {
    let close = F {
        close_on_malformed: true,
        ..d()
    };
    let unknown = F {
        close_on_unknown: true,
        ..d()
    };
    let (malformed, random, unknown) = futures_util::future::join3(
        fake_worker_run(close, "worker.ignore.malformed"),
        fake_worker_run(close, "worker.robust.random-frames"),
        fake_worker_run(unknown, "worker.ignore.unknown"),
    )
    .await;
    assert_is(&malformed, "worker.ignore.malformed", "WARN");
    let text = outcome(&malformed, "worker.ignore.malformed").text();
    assert!(text.contains("text that is not JSON"), "{text}");
    assert_is(&random, "worker.robust.random-frames", "WARN");
    assert_fails(&unknown, "worker.ignore.unknown");
    let text = outcome(&unknown, "worker.ignore.unknown").text();
    assert!(text.contains("Both sides ignore"), "{text}");
}

/// The fake with `flaws`, and a kit that knows no worker token, running `case`.
async fn fake_worker_run_without_token(flaws: F, case: &str) -> Vec<CaseResult> {
    let mut cfg = crate::worker_config(App::Example, Some(case));
    if let crate::cli::Mode::Worker(t) = &mut cfg.mode {
        t.worker_token = None;
    }
    let (results, worker) = run_worker(&cfg, |port| {
        tokio::spawn(fakes::worker(
            format!("ws://127.0.0.1:{port}/connect"),
            flaws,
        ))
    })
    .await;
    worker.abort();
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_worker_token_the_echo_cases_skip_instead_of_failing() {
    // The fake's /echo wants the worker token: 401 to a kit that has none.
    let results = fake_worker_run_without_token(d(), "worker.body").await;
    for id in ["worker.body.empty-chunks", "worker.body.large-response"] {
        match outcome(&results, id) {
            Outcome::Skip(t) => assert!(t.contains("401"), "{t}"),
            o => panic!("{id} should SKIP: {o:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_without_the_slow_sink_is_held_to_the_16_chunk_bound_through_sleep() {
    // Without /slow-sink the case holds a body on GET /sleep (the app never
    // reads it): the fake, which buffers everything, is caught there.
    let case = "worker.flow.16-chunk-bound";
    let results = fake_worker_run(
        F {
            no_slow_sink: true,
            ..d()
        },
        case,
    )
    .await;
    match outcome(&results, case) {
        Outcome::Fail(t) => assert!(t.contains("GET /sleep"), "{t}"),
        o => panic!("{case} should FAIL: {o:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_without_the_slow_sink_and_sleep_skips_the_16_chunk_case() {
    let case = "worker.flow.16-chunk-bound";
    let results = fake_worker_run(
        F {
            no_slow_sink: true,
            no_sleep: true,
            ..d()
        },
        case,
    )
    .await;
    match outcome(&results, case) {
        Outcome::Skip(t) => assert!(t.contains("/slow-sink") && t.contains("404"), "{t}"),
        o => panic!("{case} should SKIP: {o:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refusing_a_full_chunk_fails_the_exact_limit_case() {
    let flaws = F {
        limit_one_short: true,
        ..d()
    };
    caught_with_control(flaws, "worker.oversize.exact-limit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sending_its_generated_bodies_in_2_mib_chunks_fails_the_generated_case() {
    let flaws = F {
        big_generated_chunks: true,
        ..d()
    };
    let case = "worker.body.generated-chunks";
    let (broken, sound, echoed) = futures_util::future::join3(
        fake_worker_run(flaws, case),
        fake_worker_run(d(), case),
        fake_worker_run(flaws, "worker.body.large-response"),
    )
    .await;
    assert_fails(&broken, case);
    let text = outcome(&broken, case).text();
    assert!(text.contains("largest 2097152, over the limit"), "{text}");
    assert_passes(&sound, case);
    // The hole the case closes: what the fake echoes stays within 1 MiB a chunk.
    assert_passes(&echoed, "worker.body.large-response");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_error_pages_carry_its_connect_token_fails_the_token_case() {
    let case = "worker.token.not-in-responses";
    let header = F {
        token_in_header: true,
        ..d()
    };
    let body = F {
        token_in_body: true,
        ..d()
    };
    let (in_header, in_body, sound, seen_elsewhere) = futures_util::future::join4(
        fake_worker_run(header, case),
        fake_worker_run(body, case),
        fake_worker_run(d(), case),
        fake_worker_run(body, "worker.app.fail-before"),
    )
    .await;
    // Shown with --nocapture: what each fake came to.
    for (name, r) in [
        ("token_in_header", &in_header),
        ("token_in_body", &in_body),
        ("control", &sound),
    ] {
        eprintln!("{name}:\n{}", lines(r));
    }
    for broken in [&in_header, &in_body] {
        assert_fails(broken, case);
        let text = outcome(broken, case).text();
        assert!(text.contains("came back in 2 of 5 answers"), "{text}");
        assert!(
            text.contains("404 to GET /conformance/no-such-route")
                && text.contains("500 to GET /fail-before"),
            "{text}"
        );
        // The report names where, never the token.
        assert!(!text.contains(crate::TOKEN), "{text}");
    }
    let text = outcome(&in_header, case).text();
    assert!(
        text.contains("in header \"x-debug-connect-token\""),
        "{text}"
    );
    let text = outcome(&in_body, case).text();
    assert!(
        text.contains("body carries the worker's connect token (at byte "),
        "{text}"
    );
    assert_passes(&sound, case);
    // Every response is looked at: the 500 fails the case that asked for it.
    assert_fails(&seen_elsewhere, "worker.app.fail-before");
    // Whose line, quoting the 500's body, shows no token either.
    let text = outcome(&seen_elsewhere, "worker.app.fail-before").text();
    assert!(
        text.contains("<token>") && !text.contains(crate::TOKEN),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_whose_echo_drops_the_content_type_fails_the_echo_contract() {
    let case = "worker.app.echo-contract";
    let flaws = F {
        echo_drops_content_type: true,
        ..d()
    };
    let (broken, sound, echoed) = futures_util::future::join3(
        fake_worker_run(flaws, case),
        fake_worker_run(d(), case),
        fake_worker_run(flaws, "worker.interleave.echo"),
    )
    .await;
    eprintln!("broken:\n{}\ncontrol:\n{}", lines(&broken), lines(&sound));
    assert_fails(&broken, case);
    let text = outcome(&broken, case).text();
    assert!(text.starts_with("app contract (--app example)"), "{text}");
    assert!(
        text.contains("answered with Content-Type [], not \"application/x-worker-relay-conformance; echo=contract\"")
            && text.contains("answered with Content-Type [], not \"application/octet-stream\""),
        "{text}"
    );
    assert_passes(&sound, case);
    // The hole the case closes: the echo cases take the broken app's answers.
    assert_passes(&echoed, "worker.interleave.echo");
}

/// The slow tier: `cargo test` skips these (`#[ignore]`, each says why);
/// `.ci/slow` runs them (`cargo test -- --ignored slow::`).
mod slow {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_worker_that_never_checks_for_pongs_fails_the_no_pong_case() {
        // The fake pings every 10 s and never misses a pong: a relay that stops
        // answering keeps it connected. (The crate's worker passes the case:
        // worker_mode_every_case_passes_against_the_crates_worker.)
        let case = "worker.keepalive.no-pong";
        let results = fake_worker_run(d(), case).await;
        assert_fails(&results, case);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_worker_closing_every_20_s_despite_pongs_fails_the_pong_case() {
        // ~45 s: the control holds the connection for 40 s.
        caught_with_control(
            F {
                close_every_20s: true,
                ..d()
            },
            "worker.idle.pongs",
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn the_discard_case_runs_without_a_worker_token() {
        let case = "worker.flow.discard-unread";
        let hold = F {
            hold_unread: true,
            ..d()
        };
        let (broken, sound) = futures_util::future::join(
            fake_worker_run_without_token(hold, case),
            fake_worker_run_without_token(d(), case),
        )
        .await;
        assert_fails(&broken, case);
        assert_passes(&sound, case);
        assert!(
            outcome(&sound, case).text().contains("404 before its body"),
            "{}",
            lines(&sound)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_wedged_worker_fails_its_own_case_and_not_the_next() {
        // The fake stops answering after the barrage; before the next case the
        // kit finds /health unanswered, hangs up and takes the worker's redial.
        use crate::worker_ctx::{Answer, WorkerCtx};
        let crate::cli::Mode::Worker(t) = crate::worker_config(App::Example, None).mode else {
            unreachable!()
        };
        let mut ctx = WorkerCtx::bind(t).await.unwrap();
        let port = ctx.listener.local_addr().unwrap().port();
        let worker = tokio::spawn(fakes::worker(
            format!("ws://127.0.0.1:{port}/connect"),
            F {
                wedge_on_garbage: true,
                ..d()
            },
        ));
        let (s, hs) = ctx
            .next_dial(std::time::Duration::from_secs(30))
            .await
            .unwrap();
        ctx.first = Some(hs.clone());
        ctx.conn = ctx.answer(s, &hs, Answer::Accept).await.unwrap();
        let order = [
            "worker.robust.random-frames",
            "worker.request.health",
            "worker.id.max",
        ];
        let mut all = crate::kit::worker_cases();
        let cases: Vec<_> = order
            .iter()
            .map(|id| all.remove(all.iter().position(|c| c.id == *id).unwrap()))
            .collect();
        let results = crate::runner::run(&cases, &mut ctx, &Default::default(), |_| {}).await;
        assert_fails(&results, "worker.robust.random-frames");
        assert_passes(&results, "worker.request.health");
        assert_passes(&results, "worker.id.max");
        worker.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_worker_that_stops_answering_after_garbage_fails_the_random_frames_case() {
        caught_with_control(
            F {
                wedge_on_garbage: true,
                ..d()
            },
            "worker.robust.random-frames",
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_worker_without_a_message_limit_fails_the_text_1009_case() {
        // The fake has no message limit at all; the crate's worker passes
        // (worker_mode_every_case_passes_against_the_crates_worker).
        let case = "worker.oversize.text-1009";
        assert_fails(&fake_worker_run(d(), case).await, case);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_worker_whose_delay_survives_a_handshake_fails_the_reset_case() {
        let flaws = F {
            no_backoff_reset: true,
            ..d()
        };
        caught_with_control(flaws, "worker.backoff.reset").await;
    }
}
