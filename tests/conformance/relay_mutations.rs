//! Issue 27's relay cases against the forwarding fake (`fakes.rs`): each
//! new flaw is caught by the case written for it (FAIL), and the same fake
//! without the flaw passes that case (the control). And the cases that
//! became recommendations: the flaws they were written for now WARN, never
//! FAIL.

use crate::fakes::{self, ForwardFlaw};
use crate::report::{CaseResult, Outcome};
use crate::{assert_fails, assert_passes, lines, outcome, relay_config, run};

fn assert_warns(results: &[CaseResult], id: &str) {
    assert!(
        matches!(outcome(results, id), Outcome::Warn(_)),
        "{id} should WARN:\n{}",
        lines(results)
    );
}

/// `case` against the fake with `flaw` and against the fake without it, at once.
async fn broken_and_sound(flaw: ForwardFlaw, case: &str) -> (Vec<CaseResult>, Vec<CaseResult>) {
    let broken = relay_config(fakes::forwarding_relay(flaw).await, Some(case));
    let sound = relay_config(fakes::forwarding_relay(ForwardFlaw::None).await, Some(case));
    let (broken, sound) = tokio::join!(run(&broken), run(&sound));
    // Shown with --nocapture: what each fake came to.
    eprintln!("{flaw:?}:\n{}\ncontrol:\n{}", lines(&broken), lines(&sound));
    (broken, sound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_on_id_0_is_named_in_the_failure() {
    let (broken, _) =
        broken_and_sound(ForwardFlaw::ChunkOnIdZero, "relay.url.prefix-stripped").await;
    let o = outcome(&broken, "relay.url.prefix-stripped");
    assert!(
        matches!(o, Outcome::Fail(t) if t.contains("the relay sent a chunk on id 0")),
        "{o:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_closes_on_garbage_but_serves_a_redial_is_warned() {
    // The spec does not forbid closing a connection that sends garbage; a
    // relay that then serves the worker's redial gets a WARN, not a FAIL.
    let (broken, sound) =
        broken_and_sound(ForwardFlaw::CloseOnUnknown, "relay.robust.random-frames").await;
    assert_warns(&broken, "relay.robust.random-frames");
    assert_passes(&sound, "relay.robust.random-frames");
}

#[test]
fn the_observer_names_what_the_spec_makes_wrong() {
    use crate::relay_observe::Observer;
    use bytes::Bytes;
    let mut o = Observer::default();
    let sink = o.sink.clone();
    let req =
        r#"{"type":"request","id":7,"method":"GET","path":"/health","query":"","headers":[]}"#;
    // Allowed: a request, its end, an abort after the end, unknown types.
    o.text(req);
    o.text(r#"{"type":"end","id":7}"#);
    o.text(r#"{"type":"abort","id":7}"#);
    o.text(r#"{"type":"progress","id":0}"#);
    assert_eq!(Observer::take(&sink), Vec::<String>::new());
    // Wrong, each named.
    o.text("not json");
    o.text("[1]");
    o.text(r#"{"id":1}"#);
    o.text(r#"{"type":"end","id":0}"#);
    o.text(r#"{"type":"end","id":4294967296}"#);
    o.text(r#"{"type":"end","id":"7"}"#);
    o.text(r#"{"type":"end","id":8}"#);
    o.text(r#"{"type":"end","id":7}"#);
    o.binary(Bytes::from_static(&[0, 0, 0]));
    o.binary(Bytes::from_static(&[0, 0, 0, 0, 1]));
    o.binary(Bytes::from_static(&[0, 0, 0, 7, 1]));
    o.binary(Bytes::from_static(&[0, 0, 0, 9, 1]));
    o.text(req);
    let mut big = vec![0u8, 0, 0, 7];
    big.resize(4 + (1 << 20) + 1, b'x');
    o.binary(Bytes::from(big));
    let seen = Observer::take(&sink);
    let want = [
        "not JSON",
        "not an object",
        "without a type",
        "end on id 0",
        "with id 4294967296",
        "id is not a number",
        "end on id 8, which it never opened",
        "end on id 7 after that request's end or abort",
        "binary message of 3 bytes",
        "chunk on id 0",
        "chunk on id 7 after that request's end or abort",
        "chunk on id 9, which it never opened",
        "chunk of 1048577 bytes on id 7",
    ];
    assert_eq!(seen.len(), want.len(), "{seen:#?}");
    for (s, w) in seen.iter().zip(want) {
        assert!(s.contains(w), "{s:?} should name {w:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_desynchronised_by_a_workers_content_length_is_warned_not_failed() {
    // The worker broke the spec's rule; the relay's answer to it is this
    // kit's recommendation.
    let case = "relay.response.content-length-mismatch";
    let (broken, sound) = broken_and_sound(ForwardFlaw::DesyncOnMismatch, case).await;
    assert_warns(&broken, case);
    assert_passes(&sound, case);
}

/// The slow tier: `cargo test` skips these (`#[ignore]`, each says why);
/// `.ci/slow` runs them (`cargo test -- --ignored slow::`).
mod slow {
    use super::*;

    /// ~50 s: the kit's worker idles 45 s, pinging every 20 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_relay_that_drops_an_idle_worker_fails_the_keepalive_case() {
        let (broken, sound) = broken_and_sound(ForwardFlaw::DropIdle, "relay.keepalive.idle").await;
        assert_fails(&broken, "relay.keepalive.idle");
        assert_passes(&sound, "relay.keepalive.idle");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn each_new_relay_flaw_is_caught_by_its_case_and_its_control_passes() {
        use ForwardFlaw::*;
        let flaws = [
            (AllOk, "relay.response.status"),
            (DropResponseHeaders, "relay.response.headers"),
            (MergeRequestHeaders, "relay.request.headers"),
            (Latin1AsUtf8, "relay.request.latin1"),
            (Latin1AsUtf8, "relay.response.latin1"),
            (EmptyChunkEnds, "relay.body.empty-chunks"),
            (NoAbortMidUpload, "relay.abort.caller-mid-upload"),
            (DieOnGarbage, "relay.robust.random-frames"),
            (GiveUpAfter5s, "relay.timeout.slow-response"),
            // Caught through the lenient observer, whatever the case checks.
            (ChunkOnIdZero, "relay.framing.get-end"),
        ];
        // Each check boxed: on one stack, the cases' futures overflow a debug
        // build's test thread.
        let checks = flaws.map(|(flaw, case)| {
            Box::pin(async move {
                let (broken, sound) = broken_and_sound(flaw, case).await;
                (case, broken, sound)
            })
        });
        for (case, broken, sound) in futures_util::future::join_all(checks).await {
            assert_fails(&broken, case);
            assert_passes(&sound, case);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn a_fault_fails_its_own_case_and_not_the_next_ones() {
        // The fake wedges the worker connection on a frame of an unknown type
        // (it holds the socket, reading nothing). The case for that fails; the
        // next cases start on a fresh connection the kit proved routed, and pass.
        let addr = fakes::forwarding_relay(ForwardFlaw::WedgeOnUnknown).await;
        let results = run(&relay_config(addr, Some("relay.ignore.*"))).await;
        eprintln!("{}", lines(&results));
        assert_fails(&results, "relay.ignore.unknown-type");
        assert_passes(&results, "relay.ignore.unknown-id");
        let addr = fakes::forwarding_relay(ForwardFlaw::WedgeOnUnknown).await;
        let results = run(&relay_config(addr, Some("relay.*-end"))).await;
        assert_passes(&results, "relay.framing.get-end");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: the kit runs its cases on real time against a live peer (timeouts and holds of seconds)"]
    async fn what_the_spec_leaves_open_is_a_warning_not_a_failure() {
        use ForwardFlaw::*;
        // Dot segments forwarded as they were on the wire; a prefix match on
        // the worker id; a worker's older connection kept: the spec says
        // nothing of them, so the kit recommends and does not fail.
        let flaws = [
            (ForwardDotSegments, "relay.url.no-escape"),
            (PrefixMatch, "relay.url.exact-id"),
            (PrefixMatchKeep, "relay.url.exact-id"),
            (KeepOlder, "relay.replace.older-connection"),
        ];
        let checks = flaws.map(|(flaw, case)| async move {
            let (broken, sound) = broken_and_sound(flaw, case).await;
            (case, broken, sound)
        });
        for (case, broken, sound) in futures_util::future::join_all(checks).await {
            assert_warns(&broken, case);
            assert_passes(&sound, case);
        }
        // A plain GET of the connect path answered 200.
        let flaws = fakes::RelayFlaws {
            select_protocol: true,
            check_token: true,
            accept_plain_get: true,
            ..Default::default()
        };
        let addr = fakes::handshake_only_relay(flaws).await;
        let results = run(&relay_config(addr, Some("relay.handshake.non-upgrade"))).await;
        assert_warns(&results, "relay.handshake.non-upgrade");
        // A request lost with the worker's connection, failed by closing the
        // caller's connection instead of a 502: failed, as the spec asks.
        let addr = fakes::forwarding_relay(None).await;
        let results = run(&relay_config(addr, Some("relay.lost.before-response"))).await;
        assert_passes(&results, "relay.lost.before-response");
    }
}
