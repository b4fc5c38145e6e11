//! Secrets: the worker's connect token, a constant-time byte compare, and the
//! relay's table of worker tokens.

use super::WorkerId;
use std::fmt;
use std::hint::black_box;

/// What [`Token`] prints in place of the secret, in `Debug` and `Display`.
pub const REDACTED: &str = "<redacted>";

/// A bearer token: the worker's `STRATA_WORKER_CONNECT_TOKEN`, the relay's
/// credential for one worker.
///
/// Neither `Debug` nor `Display` shows the secret (both print
/// [`REDACTED`]); read it with [`Token::expose_secret`] only where it goes on
/// the wire. Equality takes constant time.
///
/// A token is non-empty visible ASCII (`0x21..=0x7E`), so
/// `Authorization: Bearer <token>` is always a valid header value and the
/// relay can tell where it ends.
#[derive(Clone)]
pub struct Token(Box<str>);

impl Token {
    /// A token from its text; refused if empty or not visible ASCII.
    pub fn new(token: impl Into<String>) -> Result<Token, TokenError> {
        let token = token.into();
        if token.is_empty() {
            return Err(TokenError::Empty);
        }
        if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(TokenError::InvalidChar);
        }
        Ok(Token(token.into_boxed_str()))
    }

    /// A token from an environment variable's value, as Strata's worker reads
    /// `STRATA_WORKER_CONNECT_TOKEN`: unset or empty means no token (`Ok(None)`),
    /// anything else must be a valid token.
    ///
    /// Reading (and then removing) the variable is the caller's business: this
    /// crate does no I/O.
    pub fn from_env_value(value: Option<String>) -> Result<Option<Token>, TokenError> {
        match value {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => Token::new(v).map(Some),
        }
    }

    /// The secret itself. Use it only to put it on the wire.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, in time that depends only on
    /// `presented.len()`.
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(presented, self.0.as_bytes())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({REDACTED})")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for Token {}

/// Why a token was refused. The message never includes the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The token is empty.
    #[error("token is empty")]
    Empty,
    /// The token holds a space, a control character or a non-ASCII character.
    #[error("token must be visible ASCII")]
    InvalidChar,
}

/// Compares a presented byte string with a secret, without an early exit.
///
/// Every byte of `presented` is compared (against the secret repeated to its
/// length), the differences and the length difference are OR-ed together and
/// only the final accumulator is tested, so the running time depends on
/// `presented.len()` (which the caller already knows) and not on where the two
/// differ, nor on the secret's length. `std::hint::black_box` keeps the
/// optimiser from turning the loop into an early exit.
///
/// An empty secret equals only an empty input (tokens are never empty, so the
/// relay never takes that branch).
pub(crate) fn constant_time_eq(presented: &[u8], secret: &[u8]) -> bool {
    if secret.is_empty() {
        return presented.is_empty();
    }
    let mut diff: usize = presented.len() ^ secret.len();
    for (i, &p) in presented.iter().enumerate() {
        diff = black_box(diff | usize::from(p ^ secret[i % secret.len()]));
    }
    black_box(diff) == 0
}

/// The relay's credentials: which token belongs to which worker.
///
/// Each worker has one token and no two workers share one, so a token names
/// exactly one worker. [`TokenTable::lookup`] compares the presented token
/// against every entry in constant time, with no early exit on a match.
///
/// `Debug` lists the workers and never their tokens.
#[derive(Clone, Default)]
pub struct TokenTable {
    entries: Vec<(WorkerId, Token)>,
}

impl TokenTable {
    /// An empty table.
    pub fn new() -> TokenTable {
        TokenTable::default()
    }

    /// Sets `worker`'s token, returning the token it replaces.
    ///
    /// Refused if another worker already has this token: the token is what
    /// tells the relay which worker a socket is, so it must be unique.
    pub fn insert(
        &mut self,
        worker: WorkerId,
        token: Token,
    ) -> Result<Option<Token>, TokenTableError> {
        let mut shared = false;
        for (id, t) in &self.entries {
            shared |= *id != worker && *t == token;
        }
        if shared {
            return Err(TokenTableError::DuplicateToken { worker });
        }
        match self.entries.iter_mut().find(|(id, _)| *id == worker) {
            Some((_, t)) => Ok(Some(std::mem::replace(t, token))),
            None => {
                self.entries.push((worker, token));
                Ok(None)
            }
        }
    }

    /// Removes `worker` and returns its token.
    pub fn remove(&mut self, worker: &str) -> Option<Token> {
        let i = self
            .entries
            .iter()
            .position(|(id, _)| id.as_str() == worker)?;
        Some(self.entries.swap_remove(i).1)
    }

    /// Whether `worker` has a token.
    pub fn contains(&self, worker: &str) -> bool {
        self.entries.iter().any(|(id, _)| id.as_str() == worker)
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The workers, in no particular order.
    pub fn workers(&self) -> impl Iterator<Item = &WorkerId> {
        self.entries.iter().map(|(id, _)| id)
    }

    /// The worker whose token is `presented`, if any.
    ///
    /// Compares against every entry with a constant-time comparison and selects the
    /// match with a mask rather than a branch, so the time taken depends on the
    /// number of entries and the presented length, not on which entry (if any)
    /// matches.
    pub fn lookup(&self, presented: &str) -> Option<&WorkerId> {
        let presented = presented.as_bytes();
        // Index of the match plus one; 0 means none.
        let mut found: usize = 0;
        for (i, (_, token)) in self.entries.iter().enumerate() {
            let mask = usize::from(token.matches(presented)).wrapping_neg();
            found = black_box(found | (mask & (i + 1)));
        }
        found.checked_sub(1).map(|i| &self.entries[i].0)
    }
}

impl fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(id, t)| (id, t)))
            .finish()
    }
}

/// Why a [`TokenTable`] refused an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenTableError {
    /// Another worker already has this token.
    #[error("another worker already has the token given for worker {worker}")]
    DuplicateToken {
        /// The worker whose entry was refused.
        worker: WorkerId,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> WorkerId {
        WorkerId::new(s).unwrap()
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
        table
            .insert(id("abc"), Token::new("tok-abc").unwrap())
            .unwrap();
        table
            .insert(id("other"), Token::new("tok-other").unwrap())
            .unwrap();
        table.insert(id("z"), Token::new("tok").unwrap()).unwrap();
        assert_eq!(table.len(), 3);
        assert_eq!(table.lookup("tok-abc").map(WorkerId::as_str), Some("abc"));
        assert_eq!(
            table.lookup("tok-other").map(WorkerId::as_str),
            Some("other")
        );
        assert_eq!(table.lookup("tok").map(WorkerId::as_str), Some("z"));
        assert_eq!(table.lookup("tok-ab"), None);
        assert_eq!(table.lookup("tok-abcd"), None);
        assert_eq!(table.lookup(""), None);

        // A token names one worker.
        assert_eq!(
            table.insert(id("dup"), Token::new("tok-abc").unwrap()),
            Err(TokenTableError::DuplicateToken { worker: id("dup") })
        );
        // Re-keying a worker replaces its token (even with the same one).
        let old = table
            .insert(id("abc"), Token::new("tok-abc").unwrap())
            .unwrap();
        assert_eq!(old, Some(Token::new("tok-abc").unwrap()));
        let old = table.insert(id("abc"), Token::new("new").unwrap()).unwrap();
        assert_eq!(old, Some(Token::new("tok-abc").unwrap()));
        assert_eq!(table.lookup("tok-abc"), None);
        assert_eq!(table.lookup("new").map(WorkerId::as_str), Some("abc"));

        assert!(table.contains("other"));
        assert_eq!(
            table.remove("other"),
            Some(Token::new("tok-other").unwrap())
        );
        assert!(!table.contains("other"));
        assert_eq!(table.lookup("tok-other"), None);
        assert_eq!(table.remove("other"), None);
        let mut ws: Vec<&str> = table.workers().map(WorkerId::as_str).collect();
        ws.sort();
        assert_eq!(ws, ["abc", "z"]);
    }

    #[test]
    fn table_debug_hides_tokens() {
        let mut table = TokenTable::new();
        table
            .insert(id("abc"), Token::new("s3cret-abc").unwrap())
            .unwrap();
        let s = format!("{table:?} {table:#?}");
        assert!(s.contains("abc") && !s.contains("s3cret"), "{s}");
        let e = TokenTableError::DuplicateToken { worker: id("abc") };
        assert!(!format!("{e} {e:?}").contains("s3cret"));
    }

    mod props {
        use super::super::constant_time_eq;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn constant_time_eq_is_eq(a in prop::collection::vec(any::<u8>(), 0..24), b in prop::collection::vec(any::<u8>(), 0..24)) {
                prop_assert_eq!(constant_time_eq(&a, &b), a == b);
                prop_assert!(constant_time_eq(&a, &a));
            }
        }
    }
}
