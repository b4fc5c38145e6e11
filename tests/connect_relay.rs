//! The relay's side: upgrade decisions against a token table, and URL
//! mapping properties over arbitrary targets.

use proptest::prelude::*;
use worker_relay::connect::{
    decide_upgrade, Rejected, Token, TokenTable, UrlError, UrlMap, WorkerHandshake, WorkerId,
};
use worker_relay::frame::SUBPROTOCOL;

fn table(n: usize) -> TokenTable {
    let mut t = TokenTable::new();
    for i in 0..n {
        t.insert(
            WorkerId::new(format!("w{i}")).unwrap(),
            Token::new(format!("token-0123456789-{i}")).unwrap(),
        )
        .unwrap();
    }
    t
}

#[test]
fn every_worker_is_named_by_its_own_token() {
    let t = table(50);
    for i in 0..50 {
        let hs = WorkerHandshake::new(Some(Token::new(format!("token-0123456789-{i}")).unwrap()));
        let accepted = decide_upgrade(&t, hs.request_headers().iter()).unwrap();
        assert_eq!(accepted.worker().as_str(), format!("w{i}"));
    }
    let stranger = WorkerHandshake::new(Some(Token::new("token-0123456789-50").unwrap()));
    assert_eq!(
        decide_upgrade(&t, stranger.request_headers().iter()),
        Err(Rejected::UnknownToken)
    );
    let anonymous = WorkerHandshake::new(None);
    assert_eq!(
        decide_upgrade(&t, anonymous.request_headers().iter()),
        Err(Rejected::MissingToken)
    );
}

/// The id segment: valid ids, and near misses of every refused kind.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_-]{1,12}",
        Just("abc".to_string()),
        Just("abcd".to_string()),
        Just("other".to_string()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("%2e%2e".to_string()),
        Just(String::new()),
        "[!-~&&[^/?]]{0,8}",
    ]
}

fn rest() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("..".to_string()),
            Just(".".to_string()),
            Just("%2E%2e".to_string()),
            Just("other".to_string()),
            Just(String::new()),
            "[!-~&&[^/?]]{0,6}",
        ],
        0..6,
    )
    .prop_map(|segs| segs.iter().map(|s| format!("/{s}")).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever follows `/w/<id>`, a target maps to worker `<id>` or to nothing.
    #[test]
    fn a_target_reaches_only_the_worker_it_names(
        id in segment(),
        rest in rest(),
        query in proptest::option::of("[!-~]{0,10}"),
    ) {
        let mut target = format!("/w/{id}{rest}");
        if let Some(q) = &query {
            target.push('?');
            target.push_str(q);
        }
        match UrlMap::default().map(&target) {
            Ok(route) => {
                prop_assert_eq!(route.worker.as_str(), id.as_str());
                prop_assert!(WorkerId::new(id.as_str()).is_ok());
                prop_assert!(route.path.starts_with('/'));
                // The path is the rest as it was, or `/` for nothing at all.
                let expected_path = if rest.is_empty() { "/" } else { rest.as_str() };
                prop_assert_eq!(route.path, expected_path);
                prop_assert_eq!(route.query, query.as_deref().unwrap_or(""));
                // No dot segment reaches a worker.
                for seg in route.path.split(['/', '\\']) {
                    let lower = seg.to_ascii_lowercase().replace("%2e", ".");
                    prop_assert!(lower != "." && lower != "..", "{}", target);
                }
            }
            Err(UrlError::InvalidWorkerId(_)) => prop_assert!(WorkerId::new(id.as_str()).is_err()),
            Err(UrlError::DotSegment) => prop_assert!(WorkerId::new(id.as_str()).is_ok()),
            Err(UrlError::InvalidTarget) | Err(UrlError::NotUnderPrefix) => {}
            Err(e) => prop_assert!(false, "unexpected {:?}", e),
        }
    }

    /// Mapping never panics, and whatever it accepts is a valid request head.
    #[test]
    fn any_target_maps_or_is_refused(target in "\\PC{0,40}") {
        if let Ok(route) = UrlMap::default().map(&target) {
            prop_assert!(route.request_head("GET", &Default::default()).is_ok());
        }
    }

    /// The table's constant-time lookup agrees with a plain search.
    #[test]
    fn lookup_agrees_with_a_plain_search(n in 0usize..20, presented in "token-0123456789-[0-9]{1,2}|[!-~]{0,20}") {
        let t = table(n);
        let plain = (0..n).find(|i| format!("token-0123456789-{i}") == presented).map(|i| format!("w{i}"));
        prop_assert_eq!(t.lookup(&presented).map(|w| w.to_string()), plain);
    }

    /// Any offered list with the subprotocol somewhere in it is accepted.
    #[test]
    fn offered_lists(before in prop::collection::vec("[a-z.0-9]{1,8}", 0..3), after in prop::collection::vec("[a-z.0-9]{1,8}", 0..3), split in any::<bool>()) {
        let t = table(1);
        let mut items = before.clone();
        items.push(SUBPROTOCOL.to_string());
        items.extend(after);
        let mut headers: Vec<(String, String)> = if split {
            items.iter().map(|i| ("sec-websocket-protocol".to_string(), i.clone())).collect()
        } else {
            vec![("Sec-WebSocket-Protocol".to_string(), items.join(", "))]
        };
        headers.push(("authorization".into(), "bearer token-0123456789-0".into()));
        prop_assert_eq!(decide_upgrade(&t, headers).map(|a| a.into_worker().to_string()), Ok("w0".to_string()));
    }
}
