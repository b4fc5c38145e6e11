//! The `handshake_and_url` target.

use crate::prelude::*;

pub(crate) const WORKER_IDS: &[&str] = &[
    "abc", "other", "w-1", "W_2", "..", "a.b", "%61bc", "a/b", "",
];
/// The first two are long enough for a table; the others are not, or are
/// not tokens at all.
pub(crate) const TOKENS: &[&str] = &[
    "s3cret-0123456789",
    "0ther-0123456789x",
    "tok",
    "Bearer",
    "a b",
    "",
    "x\u{e9}",
];

/// The relay's handshake decision and its URL mapping on arbitrary input,
/// against the spec's rules: `decide_upgrade` agrees with a plain reading of
/// the rules (400 without the subprotocol; 401 for a missing, repeated,
/// malformed, too long or unknown token; else 101 naming the token's
/// worker); the table refuses tokens outside its length bounds; a
/// refusal never shows a token; a mapped worker id is one segment of
/// `[A-Za-z0-9_-]` (no `/`, `.` or `%`), the path after it has no dot
/// segment, and target = prefix + id + path + query. Also the worker's
/// `Verdict` on a handshake answer, and `Backoff` bounds.
pub fn handshake_and_url(data: &[u8]) {
    let mut c = Cursor::new(data);

    // --- the token table
    let mut table = TokenTable::new();
    let mut entries: Vec<(WorkerId, String)> = Vec::new();
    for _ in 0..c.u8() % 5 {
        let id = match c.u8() % 3 {
            0 => String::from_utf8_lossy(c.short_bytes(12)).into_owned(),
            _ => c.pick(WORKER_IDS).to_owned(),
        };
        let token = match c.u8() % 3 {
            0 => String::from_utf8_lossy(c.short_bytes(24)).into_owned(),
            _ => c.pick(TOKENS).to_owned(),
        };
        let (Ok(id), Ok(tok)) = (WorkerId::new(id.clone()), Token::new(token.clone())) else {
            if let Ok(w) = WorkerId::new(id.clone()) {
                check_worker_id(w.as_str());
            }
            continue;
        };
        check_worker_id(id.as_str());
        assert!(!format!("{tok:?}").contains(&token) || "Token(<redacted>)".contains(&token));
        let shared = entries.iter().any(|(w, t)| *w != id && *t == token);
        let expected = if token.len() < MIN_TABLE_TOKEN {
            Err(TokenTableError::TooShort {
                worker: id.clone(),
                min: MIN_TABLE_TOKEN,
            })
        } else if token.len() > MAX_PRESENTED_TOKEN {
            Err(TokenTableError::TooLong {
                worker: id.clone(),
                max: MAX_PRESENTED_TOKEN,
            })
        } else if shared {
            Err(TokenTableError::DuplicateToken { worker: id.clone() })
        } else {
            Ok(())
        };
        match table.insert(id.clone(), tok) {
            Ok(_) => {
                assert_eq!(expected, Ok(()), "insert accepted");
                match entries.iter_mut().find(|(w, _)| *w == id) {
                    Some(e) => e.1 = token,
                    None => entries.push((id, token)),
                }
            }
            Err(e) => {
                // The message names the worker, never the token: the error
                // equals one built without the token (`expected`), so it
                // prints the same whatever the token was. (Looking for the
                // token in the text instead finds any short token that
                // spells part of it, "erId(" in `WorkerId(`.)
                let shown = format!("{e} {e:?}");
                assert_eq!(Err(e), expected, "insert refused");
                let Err(built) = &expected else {
                    unreachable!()
                };
                assert_eq!(shown, format!("{built} {built:?}"));
            }
        }
    }
    assert_eq!(table.len(), entries.len());
    let mut twin = TokenTable::new();
    for (i, (w, _)) in entries.iter().enumerate() {
        twin.insert(
            w.clone(),
            Token::new(format!("twin-token-{i:06}")).expect("valid"),
        )
        .expect("distinct tokens");
    }
    assert_eq!(
        format!("{table:?}"),
        format!("{twin:?}"),
        "Debug shows tokens"
    );
    for (w, t) in &entries {
        assert_eq!(table.lookup(t), Some(w));
        assert!(table.contains(w.as_str()));
    }

    // --- an upgrade request
    let mut headers: Vec<(String, String)> = Vec::new();
    for _ in 0..c.u8() % 6 {
        let name = match c.u8() % 6 {
            0 => "Sec-WebSocket-Protocol".to_owned(),
            1 => "sec-websocket-protocol".to_owned(),
            2 => "Authorization".to_owned(),
            3 => "AUTHORIZATION".to_owned(),
            4 => "Upgrade".to_owned(),
            _ => String::from_utf8_lossy(c.short_bytes(8)).into_owned(),
        };
        let token = match c.u8() % 2 {
            0 if !entries.is_empty() => entries[usize::from(c.u8()) % entries.len()].1.clone(),
            _ => c.pick(TOKENS).to_owned(),
        };
        let value = match c.u8() % 10 {
            0 => SUBPROTOCOL.to_owned(),
            1 => format!("chat, {SUBPROTOCOL}"),
            2 => format!("{SUBPROTOCOL}x"),
            3 => format!("Bearer {token}"),
            4 => format!("bearer   {token} "),
            5 => format!("Basic {token}"),
            6 => token,
            7 => format!("\t{SUBPROTOCOL} ,,"),
            // Over the cap by one byte (a known token with a tail).
            8 => {
                let tail = "x".repeat((MAX_PRESENTED_TOKEN + 1).saturating_sub(token.len()));
                format!("Bearer {token}{tail}")
            }
            _ => String::from_utf8_lossy(c.short_bytes(24)).into_owned(),
        };
        headers.push((name, value));
    }
    let decision = decide_upgrade(&table, headers.iter().map(|(n, v)| (n, v)));
    let expected = expected_upgrade(&entries, &headers);
    match (&decision, &expected) {
        (Ok(a), Ok(w)) => {
            assert_eq!(a.worker(), w);
            assert_eq!(a.status(), 101);
            assert_eq!(
                a.response_headers(),
                [(SEC_WEBSOCKET_PROTOCOL, SUBPROTOCOL)]
            );
        }
        (Err(r), Err(e)) => {
            assert_eq!(r, e, "{headers:?}");
            let status = r.status();
            assert_eq!(
                status,
                if *r == Rejected::SubprotocolNotOffered {
                    400
                } else {
                    401
                }
            );
            assert_eq!(r.response_headers().is_empty(), status == 400);
            // A refusal carries no token: it equals the one the rules
            // built without any (`e`), and prints the same. (Looking for
            // a token in the text instead finds any that spells part of
            // it.)
            assert_eq!(format!("{r} {r:?}"), format!("{e} {e:?}"));
        }
        _ => {
            panic!("decide_upgrade gave {decision:?}, the rules give {expected:?} for {headers:?}")
        }
    }

    // --- the worker's verdict on an answer
    let status = c.u16() % 700;
    let verdict = Verdict::from_response(status, headers.iter().map(|(n, v)| (n, v)));
    match status {
        101 => {
            let selected: Vec<&str> = headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(SEC_WEBSOCKET_PROTOCOL))
                .flat_map(|(_, v)| v.split(','))
                .map(|s| s.trim_matches([' ', '\t']))
                .filter(|s| !s.is_empty())
                .collect();
            assert_eq!(verdict == Verdict::Connected, selected == [SUBPROTOCOL]);
            assert_eq!(verdict.is_final(), selected != [SUBPROTOCOL]);
        }
        408 | 429 => assert!(!verdict.is_final()),
        400..=499 => assert!(verdict.is_final()),
        _ => assert!(!verdict.is_final(), "{status} is final"),
    }

    // --- backoff stays within [delay/2, delay] and under the cap
    let initial = Duration::from_millis(u64::from(c.u16()));
    let max = Duration::from_millis(1 + u64::from(c.u32() % 120_000));
    let multiplier = u32::from(c.u8() % 5);
    let built = BackoffConfig::builder()
        .initial(initial)
        .max(max)
        .multiplier(multiplier)
        .build();
    let nonsense = initial.is_zero() || max < initial || multiplier == 0;
    assert_eq!(built.is_err(), nonsense, "{built:?}");
    let mut backoff = Backoff::new(built.unwrap_or_default());
    for _ in 0..c.u8() % 8 {
        let delay = backoff.current_delay();
        assert!(delay <= backoff.config().max());
        let r = f64::from(c.u32()) / f64::from(u32::MAX);
        let r = if c.u8() == 255 {
            f64::NAN
        } else {
            r * 1.5 - 0.25
        };
        let wait = backoff.next_wait(r);
        assert!(wait >= delay / 2 && wait <= delay, "{wait:?} for {delay:?}");
        if c.u8() % 4 == 0 {
            backoff.reset();
        }
    }

    // --- URL mapping
    let map = match c.u8() % 4 {
        0 => match UrlMap::new(String::from_utf8_lossy(c.short_bytes(8)).into_owned()) {
            Ok(m) => {
                let p = m.prefix();
                assert!(p.starts_with('/') && p.ends_with('/'));
                m
            }
            Err(e) => {
                assert_eq!(e, UrlError::InvalidPrefix);
                UrlMap::default()
            }
        },
        1 => UrlMap::new("/").expect("`/` is a valid prefix"),
        _ => UrlMap::default(),
    };
    let target = match c.u8() % 3 {
        0 => String::from_utf8_lossy(c.short_bytes(48)).into_owned(),
        _ => {
            let mut t = map.prefix().to_owned();
            let id = c.pick(WORKER_IDS);
            t.push_str(id);
            for _ in 0..c.u8() % 5 {
                t.push_str(c.pick(&[
                    "/", "\\", "/.", "/..", "/%2e", "/%2E%2e", "/x", "/.x", "..", "%", "?",
                    "?a=1/../", "#",
                ]));
            }
            t
        }
    };
    match map.map(&target) {
        Ok(route) => {
            let id = route.worker.as_str();
            check_worker_id(id);
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            assert_eq!(route.query, query);
            let rest = path
                .strip_prefix(map.prefix())
                .and_then(|r| r.strip_prefix(id))
                .expect("target = prefix + id + rest");
            assert!(rest.is_empty() || rest.starts_with('/'), "{target}");
            assert_eq!(route.path, if rest.is_empty() { "/" } else { rest });
            for seg in route.path.split(['/', '\\']) {
                let lower = seg.to_ascii_lowercase().replace("%2e", ".");
                assert!(lower != "." && lower != "..", "dot segment in {target}");
            }
            assert_eq!(
                map.worker_path(&route.worker),
                format!("{}{id}", map.prefix())
            );
            let head = route
                .request_head("GET", &Headers::new())
                .expect("a mapped route makes a valid request head");
            assert_eq!((head.path(), head.query()), (route.path, route.query));
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// A worker id is one segment of `[A-Za-z0-9_-]`: no `/`, `.`, `%`.
pub(crate) fn check_worker_id(id: &str) {
    assert!(!id.is_empty() && id.len() <= WorkerId::MAX_LEN, "{id:?}");
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "worker id {id:?}"
    );
}

/// The spec's rules for the relay's handshake decision, read plainly.
pub(crate) fn expected_upgrade(
    entries: &[(WorkerId, String)],
    headers: &[(String, String)],
) -> Result<WorkerId, Rejected> {
    let offered = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-protocol"))
        .flat_map(|(_, v)| v.split(','))
        .any(|p| p.trim_matches([' ', '\t']) == SUBPROTOCOL);
    if !offered {
        return Err(Rejected::SubprotocolNotOffered);
    }
    let auths: Vec<&str> = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.as_str())
        .collect();
    let value = match auths[..] {
        [] => return Err(Rejected::MissingToken),
        [one] => one.trim_matches([' ', '\t']),
        _ => return Err(Rejected::MalformedAuthorization),
    };
    let Some((scheme, rest)) = value.split_once(' ') else {
        return Err(Rejected::MalformedAuthorization);
    };
    let token = rest.trim_start_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Rejected::MalformedAuthorization);
    }
    if token.len() > MAX_PRESENTED_TOKEN {
        return Err(Rejected::TokenTooLong);
    }
    if token.is_empty() || token.contains([' ', '\t']) {
        return Err(Rejected::MalformedAuthorization);
    }
    entries
        .iter()
        .find(|(_, t)| t == token)
        .map(|(w, _)| w.clone())
        .ok_or(Rejected::UnknownToken)
}
