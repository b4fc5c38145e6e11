//! Tests of tokens and the token table.

use super::*;

fn id(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

fn tok(s: &str) -> Token {
    Token::new(s).unwrap()
}

#[test]
fn token_validation() {
    assert_eq!(Token::new("").unwrap_err(), TokenError::Empty);
    assert_eq!(Token::new("a b").unwrap_err(), TokenError::InvalidChar);
    assert_eq!(Token::new("ab\n").unwrap_err(), TokenError::InvalidChar);
    assert_eq!(
        Token::new("caf\u{e9}").unwrap_err(),
        TokenError::InvalidChar
    );
    assert_eq!(
        Token::new("a-b_c.d~e+f/g=").unwrap().expose_secret(),
        "a-b_c.d~e+f/g="
    );
    // What a worker presents has no length floor: that is the relay's call.
    assert_eq!(Token::new("a").unwrap().expose_secret(), "a");
    assert_eq!(Token::from_env_value(None), Ok(None));
    assert_eq!(Token::from_env_value(Some(String::new())), Ok(None));
    assert_eq!(
        Token::from_env_value(Some("t0k".into())),
        Ok(Some(Token::new("t0k").unwrap()))
    );
    assert!(Token::from_env_value(Some(" ".into())).is_err());
}

#[test]
fn token_is_never_displayed() {
    let t = Token::new("hunter2-very-secret").unwrap();
    for s in [
        format!("{t:?}"),
        format!("{t:#?}"),
        format!("{t}"),
        format!("{:?}", Some(&t)),
        t.to_string(),
    ] {
        assert!(!s.contains("hunter2"), "{s}");
        assert!(s.contains(REDACTED), "{s}");
    }
    let e = TokenError::InvalidChar.to_string();
    assert!(!e.contains("hunter2"));
}

#[test]
fn constant_time_eq_agrees_with_eq() {
    let cases: &[(&[u8], &[u8])] = &[
        (b"", b""),
        (b"", b"a"),
        (b"a", b""),
        (b"abc", b"abc"),
        (b"abc", b"abd"),
        (b"abc", b"ab"),
        (b"ab", b"abc"),
        (b"abcabc", b"abc"),
        (b"abc", b"abcabc"),
        (b"xbc", b"abc"),
    ];
    for &(a, b) in cases {
        assert_eq!(constant_time_eq(a, b), a == b, "{a:?} vs {b:?}");
    }
}

#[test]
fn table_lookup_and_uniqueness() {
    let mut table = TokenTable::new();
    assert!(table.is_empty());
    assert_eq!(table.lookup("x"), None);
    table.insert(id("abc"), tok("tok-abc-0123456789")).unwrap();
    table
        .insert(id("other"), tok("tok-other-0123456789"))
        .unwrap();
    table.insert(id("z"), tok("tok-0123456789ab")).unwrap();
    assert_eq!(table.len(), 3);
    let found = |t: &TokenTable, s: &str| t.lookup(s).map(|w| w.as_str().to_owned());
    assert_eq!(found(&table, "tok-abc-0123456789").as_deref(), Some("abc"));
    assert_eq!(
        found(&table, "tok-other-0123456789").as_deref(),
        Some("other")
    );
    assert_eq!(found(&table, "tok-0123456789ab").as_deref(), Some("z"));
    assert_eq!(table.lookup("tok-abc-012345678"), None);
    assert_eq!(table.lookup("tok-abc-01234567890"), None);
    assert_eq!(table.lookup("TOK-abc-0123456789"), None);
    assert_eq!(table.lookup(""), None);

    // A token names one worker.
    assert_eq!(
        table.insert(id("dup"), tok("tok-abc-0123456789")),
        Err(TokenTableError::DuplicateToken { worker: id("dup") })
    );
    assert!(!table.contains("dup"));
    // Re-keying a worker replaces its token (even with the same one).
    let old = table.insert(id("abc"), tok("tok-abc-0123456789")).unwrap();
    assert_eq!(old, Some(tok("tok-abc-0123456789")));
    let old = table.insert(id("abc"), tok("new-token-for-abc")).unwrap();
    assert_eq!(old, Some(tok("tok-abc-0123456789")));
    assert_eq!(table.lookup("tok-abc-0123456789"), None);
    assert_eq!(found(&table, "new-token-for-abc").as_deref(), Some("abc"));
    // The old token is free again.
    table.insert(id("dup"), tok("tok-abc-0123456789")).unwrap();
    assert_eq!(table.remove("dup"), Some(tok("tok-abc-0123456789")));

    assert!(table.contains("other"));
    assert_eq!(table.remove("other"), Some(tok("tok-other-0123456789")));
    assert!(!table.contains("other"));
    assert_eq!(table.lookup("tok-other-0123456789"), None);
    assert_eq!(table.remove("other"), None);
    let mut ws: Vec<&str> = table.workers().map(WorkerId::as_str).collect();
    ws.sort();
    assert_eq!(ws, ["abc", "z"]);
    assert_eq!(table.len(), 2);
}

#[test]
fn a_table_refuses_tokens_outside_the_length_bounds() {
    let mut table = TokenTable::new();
    let short = "s".repeat(MIN_TABLE_TOKEN - 1);
    assert_eq!(
        table.insert(id("abc"), tok(&short)),
        Err(TokenTableError::TooShort {
            worker: id("abc"),
            min: 16
        })
    );
    let long = "L".repeat(MAX_PRESENTED_TOKEN + 1);
    assert_eq!(
        table.insert(id("abc"), tok(&long)),
        Err(TokenTableError::TooLong {
            worker: id("abc"),
            max: 1024
        })
    );
    assert!(table.is_empty());
    let e = TokenTableError::TooShort {
        worker: id("abc"),
        min: MIN_TABLE_TOKEN,
    };
    assert_eq!(
        e.to_string(),
        "the token given for worker abc is shorter than 16 bytes"
    );

    // The bounds themselves are accepted, and a refused re-key keeps the
    // worker's token.
    let shortest = "m".repeat(MIN_TABLE_TOKEN);
    let longest = "M".repeat(MAX_PRESENTED_TOKEN);
    table.insert(id("abc"), tok(&shortest)).unwrap();
    table.insert(id("big"), tok(&longest)).unwrap();
    assert!(table.insert(id("abc"), tok(&short)).is_err());
    assert_eq!(table.lookup(&shortest).unwrap().as_str(), "abc");
    assert_eq!(table.lookup(&longest).unwrap().as_str(), "big");
    assert_eq!(table.lookup(&format!("{longest}M")), None);
}

#[test]
fn each_table_has_its_own_secret_key() {
    let (a, b) = (TokenTable::new(), TokenTable::new());
    let token = b"the-same-token-in-two-tables";
    assert_ne!(a.digest(token), b.digest(token));
    // A clone is the same table: same key.
    assert_eq!(a.clone().digest(token), a.digest(token));
    // Both halves differ from each other (two domains, not one hash twice).
    let d = a.digest(token);
    assert_ne!(d >> 64, d & u128::from(u64::MAX));
}

fn table_of(n: usize) -> TokenTable {
    let mut table = TokenTable::new();
    for i in 0..n {
        table
            .insert(
                id(&format!("w{i}")),
                tok(&format!("ct-{i:010}-0123456789abcdef")),
            )
            .unwrap();
    }
    table
}

/// The bytes a lookup hashes and compares, and whether it found a worker.
fn work_of(table: &TokenTable, presented: &str) -> (usize, bool) {
    let before = work_done();
    let found = table.lookup(presented).is_some();
    (work_done() - before, found)
}

/// Issue 23: a lookup compared the presented token with every entry, so a
/// 60 KiB token against 10,000 entries cost 600 MB of compares. Counted,
/// not timed: the work is the same for 1 entry and 10,000, and at most two
/// passes over the presented token up to the cap.
#[test]
fn lookup_work_is_independent_of_table_size_and_bounded_by_the_presented_length() {
    let big = table_of(10_000);
    let small = table_of(1);
    let flood = "x".repeat(60 * 1024);
    let at_cap = "x".repeat(MAX_PRESENTED_TOKEN);
    let near_miss = "ct-0000009999-0123456789abcdeX".to_owned();
    for presented in [&flood, &at_cap, &near_miss] {
        let (on_big, found) = work_of(&big, presented);
        let (on_small, _) = work_of(&small, presented);
        assert!(!found);
        assert_eq!(on_big, on_small, "{} bytes", presented.len());
        let bound = 2 * presented.len().min(MAX_PRESENTED_TOKEN);
        assert!(on_big <= bound, "{on_big} > {bound}");
    }
    // Past the cap, nothing is hashed at all.
    assert_eq!(work_of(&big, &flood).0, 0);
    // A known token: its digest and one constant-time compare.
    let known = "ct-0000009999-0123456789abcdef";
    assert_eq!(work_of(&big, known), (3 * known.len(), true));
}

#[test]
fn table_debug_hides_tokens() {
    let mut table = TokenTable::new();
    table
        .insert(id("abc"), tok("s3cret-abc-0123456789"))
        .unwrap();
    let s = format!("{table:?} {table:#?}");
    assert!(s.contains("abc") && !s.contains("s3cret"), "{s}");
    let mut errors = vec![TokenTableError::DuplicateToken { worker: id("abc") }];
    errors.push(table.insert(id("x"), tok("s3cret")).unwrap_err());
    errors.push(
        table
            .insert(id("x"), tok(&"s3cret".repeat(200)))
            .unwrap_err(),
    );
    for e in errors {
        assert!(!format!("{e} {e:?}").contains("s3cret"), "{e:?}");
    }
}

mod props {
    use super::super::*;
    use super::{id, tok};
    use proptest::prelude::*;

    const WORKERS: [&str; 4] = ["a", "b", "c", "d"];

    /// Tokens that are prefixes, extensions and near misses of each
    /// other, and some outside the length bounds.
    fn pool() -> Vec<String> {
        let mut p: Vec<String> = [
            "token-0000000000",
            "token-00000000000",
            "token-0000000001",
            "Token-0000000000",
            "token-000000000",
            "1000000000-nekot",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        p.push("x".repeat(MAX_PRESENTED_TOKEN));
        p.push("x".repeat(MAX_PRESENTED_TOKEN + 1));
        p
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(usize, usize),
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..WORKERS.len(), 0..8usize).prop_map(|(w, t)| Op::Insert(w, t)),
            1 => (0..WORKERS.len()).prop_map(Op::Remove),
        ]
    }

    /// The table as a list, searched linearly: the semantics to keep.
    #[derive(Default)]
    struct Model(Vec<(String, String)>);

    impl Model {
        fn insert(&mut self, w: &str, t: &str) -> Result<Option<String>, TokenTableError> {
            if t.len() < MIN_TABLE_TOKEN {
                return Err(TokenTableError::TooShort {
                    worker: id(w),
                    min: MIN_TABLE_TOKEN,
                });
            }
            if t.len() > MAX_PRESENTED_TOKEN {
                return Err(TokenTableError::TooLong {
                    worker: id(w),
                    max: MAX_PRESENTED_TOKEN,
                });
            }
            if self.0.iter().any(|(ow, ot)| ow != w && ot == t) {
                return Err(TokenTableError::DuplicateToken { worker: id(w) });
            }
            match self.0.iter_mut().find(|(ow, _)| ow == w) {
                Some(e) => Ok(Some(std::mem::replace(&mut e.1, t.to_owned()))),
                None => {
                    self.0.push((w.to_owned(), t.to_owned()));
                    Ok(None)
                }
            }
        }

        fn remove(&mut self, w: &str) -> Option<String> {
            let i = self.0.iter().position(|(ow, _)| ow == w)?;
            Some(self.0.remove(i).1)
        }

        fn contains(&self, w: &str) -> bool {
            self.0.iter().any(|(ow, _)| ow == w)
        }

        fn lookup(&self, t: &str) -> Option<&str> {
            self.0
                .iter()
                .find(|(_, ot)| ot == t)
                .map(|(w, _)| w.as_str())
        }
    }

    proptest! {
        #[test]
        fn constant_time_eq_is_eq(a in prop::collection::vec(any::<u8>(), 0..24), b in prop::collection::vec(any::<u8>(), 0..24)) {
            prop_assert_eq!(constant_time_eq(&a, &b), a == b);
            prop_assert!(constant_time_eq(&a, &a));
        }

        #[test]
        fn table_agrees_with_a_linear_model(ops in prop::collection::vec(op(), 0..40)) {
            let pool = pool();
            let mut table = TokenTable::new();
            let mut model = Model::default();
            for op in ops {
                match op {
                    Op::Insert(w, t) => {
                        let got = table
                            .insert(id(WORKERS[w]), tok(&pool[t]))
                            .map(|old| old.map(|o| o.expose_secret().to_owned()));
                        prop_assert_eq!(got, model.insert(WORKERS[w], &pool[t]), "{:?}", op);
                    }
                    Op::Remove(w) => {
                        let got = table.remove(WORKERS[w]).map(|o| o.expose_secret().to_owned());
                        prop_assert_eq!(got, model.remove(WORKERS[w]));
                    }
                }
                prop_assert_eq!(table.len(), model.0.len());
                prop_assert_eq!(table.is_empty(), model.0.is_empty());
                for w in WORKERS {
                    prop_assert_eq!(table.contains(w), model.contains(w));
                }
                let mut ws: Vec<&str> = table.workers().map(WorkerId::as_str).collect();
                ws.sort_unstable();
                let mut mws: Vec<&str> = model.0.iter().map(|(w, _)| w.as_str()).collect();
                mws.sort_unstable();
                prop_assert_eq!(ws, mws);
                for t in &pool {
                    prop_assert_eq!(table.lookup(t).map(WorkerId::as_str), model.lookup(t));
                }
            }
        }
    }
}
