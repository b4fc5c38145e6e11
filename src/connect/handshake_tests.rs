//! Tests of the handshake decisions (`decide_upgrade`, `Verdict`).

use super::*;

fn table() -> TokenTable {
    let mut t = TokenTable::new();
    t.insert(
        WorkerId::new("abc").unwrap(),
        Token::new("s3cret-0123456789").unwrap(),
    )
    .unwrap();
    t.insert(
        WorkerId::new("other").unwrap(),
        Token::new("0ther-0123456789").unwrap(),
    )
    .unwrap();
    t
}

fn decide(headers: &[(&str, &str)]) -> Result<String, Rejected> {
    decide_upgrade(&table(), headers.iter().copied()).map(|a| a.worker().to_string())
}

const P: (&str, &str) = ("Sec-WebSocket-Protocol", SUBPROTOCOL);

#[test]
fn worker_request_headers() {
    let none = WorkerHandshake::new(None).request_headers();
    assert_eq!(
        none.iter().collect::<Vec<_>>(),
        [("Sec-WebSocket-Protocol", "strata-worker-connect.v1")]
    );
    assert_eq!(none.len(), 1);
    let hs = WorkerHandshake::new(Some(Token::new("s3cret-0123456789").unwrap()));
    let with = hs.request_headers();
    assert_eq!(
        with.iter().collect::<Vec<_>>(),
        [
            ("Authorization", "Bearer s3cret-0123456789"),
            ("Sec-WebSocket-Protocol", "strata-worker-connect.v1")
        ]
    );
    assert_eq!(with.len(), 2);
    assert!(!with.is_empty());
    assert!(RequestHeaders::is_sensitive("authorization"));
    assert!(!RequestHeaders::is_sensitive("Sec-WebSocket-Protocol"));
    // What the worker sends is what the relay accepts.
    let accepted = decide_upgrade(&table(), with.iter()).unwrap();
    assert_eq!(accepted.worker(), &"abc");
}

#[test]
fn no_debug_or_display_shows_the_token() {
    let hs = WorkerHandshake::new(Some(Token::new("s3cret-0123456789").unwrap()));
    let headers = hs.request_headers();
    let accepted = decide_upgrade(&table(), headers.iter()).unwrap();
    let outputs = [
        format!("{hs:?}"),
        format!("{hs:#?}"),
        format!("{headers:?}"),
        format!("{headers:#?}"),
        format!("{accepted:?}"),
        format!("{:?}", table()),
        format!("{:?}", hs.token()),
        format!("{}", hs.token().unwrap()),
    ];
    for s in &outputs {
        assert!(!s.contains("s3cret-0123456789"), "{s}");
    }
    assert!(outputs[2].contains("Bearer <redacted>"), "{}", outputs[2]);
    for r in [
        Rejected::SubprotocolNotOffered,
        Rejected::MissingToken,
        Rejected::MalformedAuthorization,
        Rejected::UnknownToken,
    ] {
        assert!(!format!("{r} {r:?}").contains("s3cret-0123456789"));
    }
}

#[test]
fn verdict_on_101() {
    let v = |h: &[(&str, &str)]| Verdict::from_response(101, h.iter().copied());
    assert_eq!(v(&[P]), Verdict::Connected);
    assert_eq!(
        v(&[("sec-websocket-protocol", " strata-worker-connect.v1\t")]),
        Verdict::Connected
    );
    assert_eq!(v(&[]), Verdict::Refused(Refused::NoSubprotocol));
    assert_eq!(
        v(&[("Sec-WebSocket-Protocol", "")]),
        Verdict::Refused(Refused::NoSubprotocol)
    );
    assert_eq!(
        v(&[("Sec-WebSocket-Protocol", "strata-worker-connect.v2")]),
        Verdict::Refused(Refused::WrongSubprotocol("strata-worker-connect.v2".into()))
    );
    assert_eq!(
        v(&[("Sec-WebSocket-Protocol", "STRATA-WORKER-CONNECT.V1")]),
        Verdict::Refused(Refused::WrongSubprotocol("STRATA-WORKER-CONNECT.V1".into()))
    );
    // Exactly this one: not a list, not repeated.
    assert_eq!(
        v(&[("Sec-WebSocket-Protocol", "strata-worker-connect.v1, chat")]),
        Verdict::Refused(Refused::WrongSubprotocol(
            "strata-worker-connect.v1, chat".into()
        ))
    );
    assert!(v(&[P, P]).is_final());
    assert!(v(&[]).is_final());
    assert!(!v(&[P]).is_final());
    assert_eq!(
        Verdict::from_status(101),
        Verdict::Refused(Refused::NoSubprotocol)
    );
}

#[test]
fn verdict_on_status_and_errors() {
    let none: [(&str, &str); 0] = [];
    for s in [400, 401, 403, 404, 410, 426, 451, 499] {
        assert_eq!(
            Verdict::from_response(s, none),
            Verdict::Refused(Refused::Status(s)),
            "{s}"
        );
        assert_eq!(
            Verdict::from_status(s),
            Verdict::Refused(Refused::Status(s))
        );
    }
    for s in [
        408, 429, 500, 502, 503, 504, 599, 100, 200, 204, 301, 302, 307,
    ] {
        assert_eq!(
            Verdict::from_response(s, [P]),
            Verdict::Retry(RetryReason::Status(s)),
            "{s}"
        );
    }
    assert_eq!(
        Verdict::network_error(),
        Verdict::Retry(RetryReason::NetworkError)
    );
    assert_eq!(Verdict::closed(), Verdict::Retry(RetryReason::Closed));
    assert!(!Verdict::closed().is_final());
    assert_eq!(
        Refused::Status(403).to_string(),
        "the relay refused the worker with HTTP 403"
    );
    assert_eq!(
        RetryReason::Status(503).to_string(),
        "the relay answered HTTP 503"
    );
}

#[test]
fn relay_accepts_known_token_with_subprotocol() {
    assert_eq!(
        decide(&[P, ("Authorization", "Bearer s3cret-0123456789")]),
        Ok("abc".into())
    );
    assert_eq!(
        decide(&[("authorization", "bearer 0ther-0123456789"), P]),
        Ok("other".into())
    );
    assert_eq!(
        decide(&[P, ("AUTHORIZATION", "BEARER s3cret-0123456789")]),
        Ok("abc".into())
    );
    assert_eq!(
        decide(&[P, ("Authorization", "  BeArEr   s3cret-0123456789 \t")]),
        Ok("abc".into())
    );
    let a = decide_upgrade(&table(), [P, ("Authorization", "Bearer s3cret-0123456789")]).unwrap();
    assert_eq!(a.status(), 101);
    assert_eq!(a.subprotocol(), "strata-worker-connect.v1");
    assert_eq!(
        a.response_headers(),
        [("Sec-WebSocket-Protocol", "strata-worker-connect.v1")]
    );
    assert_eq!(a.into_worker().as_str(), "abc");
}

#[test]
fn relay_parses_offered_subprotocols() {
    let auth = ("Authorization", "Bearer s3cret-0123456789");
    let offers: &[&[(&str, &str)]] = &[
        &[("Sec-WebSocket-Protocol", "chat, strata-worker-connect.v1")],
        &[("sec-websocket-protocol", "strata-worker-connect.v1,chat")],
        &[
            ("Sec-WebSocket-Protocol", "chat"),
            ("Sec-WebSocket-Protocol", "strata-worker-connect.v1"),
        ],
        &[("Sec-WebSocket-Protocol", " ,\tstrata-worker-connect.v1\t, ")],
    ];
    for offer in offers {
        let mut h = offer.to_vec();
        h.push(auth);
        assert_eq!(decide(&h), Ok("abc".into()), "{offer:?}");
    }
    let refused: &[&[(&str, &str)]] = &[
        &[],
        &[("Sec-WebSocket-Protocol", "")],
        &[("Sec-WebSocket-Protocol", "chat")],
        &[("Sec-WebSocket-Protocol", "strata-worker-connect.v1x")],
        &[("Sec-WebSocket-Protocol", "strata-worker-connect.v1;q=1")],
        &[("Sec-WebSocket-Protocol", "STRATA-WORKER-CONNECT.V1")],
        &[("X-Sec-WebSocket-Protocol", "strata-worker-connect.v1")],
    ];
    for offer in refused {
        let mut h = offer.to_vec();
        h.push(auth);
        assert_eq!(
            decide(&h),
            Err(Rejected::SubprotocolNotOffered),
            "{offer:?}"
        );
    }
    assert_eq!(Rejected::SubprotocolNotOffered.status(), 400);
    assert!(Rejected::SubprotocolNotOffered
        .response_headers()
        .is_empty());
    // The subprotocol check comes first: a 400 even without a token.
    assert_eq!(decide(&[]), Err(Rejected::SubprotocolNotOffered));
}

#[test]
fn relay_refuses_missing_or_unknown_token() {
    assert_eq!(decide(&[P]), Err(Rejected::MissingToken));
    let bad = |v: &str| decide(&[P, ("Authorization", v)]);
    assert_eq!(bad("Bearer nope"), Err(Rejected::UnknownToken));
    assert_eq!(bad("Bearer s3cre"), Err(Rejected::UnknownToken));
    assert_eq!(
        bad("Bearer s3cret-0123456789t"),
        Err(Rejected::UnknownToken)
    );
    assert_eq!(bad("Bearer S3CRET-0123456789"), Err(Rejected::UnknownToken));
    for v in [
        "",
        "Bearer",
        "Bearer ",
        "s3cret-0123456789",
        "Basic s3cret-0123456789",
        "Bearers3cret-0123456789",
        "Bearer s3cret-0123456789 x",
        "Bearer\ts3cret-0123456789",
    ] {
        assert_eq!(bad(v), Err(Rejected::MalformedAuthorization), "{v:?}");
    }
    assert_eq!(
        decide(&[
            P,
            ("Authorization", "Bearer s3cret-0123456789"),
            ("Authorization", "Bearer s3cret-0123456789")
        ]),
        Err(Rejected::MalformedAuthorization)
    );
    for r in [
        Rejected::MissingToken,
        Rejected::MalformedAuthorization,
        Rejected::UnknownToken,
        Rejected::TokenTooLong,
    ] {
        assert_eq!(r.status(), 401);
        assert_eq!(r.response_headers(), [("WWW-Authenticate", "Bearer")]);
    }
    assert_eq!(
        decide_upgrade(
            &TokenTable::new(),
            [P, ("Authorization", "Bearer s3cret-0123456789")]
        ),
        Err(Rejected::UnknownToken)
    );
}

/// Issue 23: a bearer token over `MAX_PRESENTED_TOKEN` is refused (401)
/// from its length alone, before any lookup; one at the bound is looked up
/// as usual.
#[test]
fn a_token_over_the_cap_is_refused_before_any_lookup() {
    use crate::connect::token::work_done;
    use crate::connect::MAX_PRESENTED_TOKEN;
    let at_cap = "c".repeat(MAX_PRESENTED_TOKEN);
    let mut t = table();
    t.insert(WorkerId::new("big").unwrap(), Token::new(&at_cap).unwrap())
        .unwrap();
    let with = |auth: &str| {
        let before = work_done();
        let decision = decide_upgrade(&t, [P, ("Authorization", auth)]).map(|a| a.into_worker());
        (decision, work_done() - before)
    };

    // At the bound: an ordinary lookup, known or not.
    let (ok, _) = with(&format!("Bearer {at_cap}"));
    assert_eq!(ok.unwrap(), "big");
    let near = format!("{}d", &at_cap[1..]);
    assert_eq!(
        with(&format!("Bearer {near}")).0,
        Err(Rejected::UnknownToken)
    );
    // Surrounding white space does not count.
    assert_eq!(with(&format!("  Bearer   {at_cap} \t")).0.unwrap(), "big");

    // One byte over (even a valid token with one more byte), a 60 KiB
    // token, one with spaces in it: 401 without hashing or comparing a byte.
    let flood = "x".repeat(60 * 1024);
    for auth in [
        format!("Bearer {at_cap}c"),
        format!("Bearer {flood}"),
        format!("bearer {flood} {flood}"),
    ] {
        let (decision, work) = with(&auth);
        assert_eq!(
            decision,
            Err(Rejected::TokenTooLong),
            "{} bytes",
            auth.len()
        );
        assert_eq!(work, 0, "the lookup ran");
    }
    let r = Rejected::TokenTooLong;
    assert_eq!(r.status(), 401);
    assert_eq!(r.response_headers(), [("WWW-Authenticate", "Bearer")]);
    assert_eq!(
        r.to_string(),
        "the worker presented a token longer than 1024 bytes"
    );
    // Another scheme stays malformed, whatever its length.
    assert_eq!(
        with(&format!("Basic {flood}")).0,
        Err(Rejected::MalformedAuthorization)
    );
}
