//! Secrets: the worker's connect token, a constant-time byte compare, and the
//! relay's table of worker tokens.

use super::WorkerId;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher, RandomState};
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
    count_work(presented.len());
    if secret.is_empty() {
        return presented.is_empty();
    }
    let mut diff: usize = presented.len() ^ secret.len();
    for (i, &p) in presented.iter().enumerate() {
        diff = black_box(diff | usize::from(p ^ secret[i % secret.len()]));
    }
    black_box(diff) == 0
}

/// The longest token a relay looks up, in bytes (1 KiB).
///
/// [`decide_upgrade`](super::decide_upgrade) (and so every relay built on
/// it) refuses a longer bearer token with
/// [`Rejected::TokenTooLong`](super::Rejected::TokenTooLong) (401) before
/// any lookup, and a [`TokenTable`] holds no longer token, so what a
/// stranger's handshake costs the relay is bounded by this, whatever the
/// size of the header it sent. Real tokens are far shorter: 32 random bytes
/// are 64 hex digits or 43 base64 characters.
pub const MAX_PRESENTED_TOKEN: usize = 1024;

/// The shortest token a [`TokenTable`] holds, in bytes (16).
///
/// A floor against placeholders and passwords (`s3cret`, `changeme`), not
/// a measure of randomness: even the weakest token that passes, 16 hex
/// digits (64 random bits), withstands a million guesses a second against
/// a table of 10,000 workers for decades (2⁶⁴ / (10⁶ · 10⁴) s ≈ 58
/// years). Make tokens of 16 random bytes or more (`openssl rand -hex 16`
/// gives 32 hex digits, 128 bits). A [`Token`] the worker presents has no
/// floor: that is the relay's to decide.
pub const MIN_TABLE_TOKEN: usize = 16;

/// The relay's credentials: which token belongs to which worker.
///
/// Each worker has one token and no two workers share one, so a token names
/// exactly one worker. Every token is [`MIN_TABLE_TOKEN`] to
/// [`MAX_PRESENTED_TOKEN`] bytes long.
///
/// # Lookup: O(1), and what its timing tells a stranger
///
/// Each table draws a secret key when it is created (std's `RandomState`:
/// keys from the operating system's randomness, drawn once per thread and
/// varied for each table) and files each token under its *digest*: std's
/// keyed hash (SipHash-1-3 today, the hash std relies on against HashDoS)
/// of a domain byte and the token, computed for two domains, 128 bits in
/// all. [`TokenTable::lookup`] digests the presented token once, finds at
/// most one entry with that digest in a hash map, and checks that
/// candidate with the constant-time compare of [`Token::matches`]. Its cost is one pass over the presented token for
/// the digest plus, only when a candidate is found, one for the compare;
/// it does not depend on the number of entries. Presented tokens longer
/// than [`MAX_PRESENTED_TOKEN`] (or shorter than [`MIN_TABLE_TOKEN`]) are
/// answered `None` at once: no entry can match them.
///
/// What can the running time reveal? The digest takes time that depends
/// only on the presented length, which the stranger chose. The hash map's
/// probe branches and compares early-exit, but only on digests: it can at
/// most tell whether some bits of the presented token's digest equal some
/// bits of a stored token's digest. Under a secret key those digests are
/// pseudo-random, and a new guess gets a fresh, unrelated digest whatever
/// it shares with the last one, so there is no byte-by-byte progress to
/// measure (the leak of an early-exit compare of the tokens themselves),
/// and knowing a digest would not give the token anyway. The final compare
/// runs only when the digests are equal, which for a wrong token happens
/// with probability 2⁻¹²⁸; it reads every presented byte. So a stranger
/// learns nothing about any token but what the answer (401 or 101) says.
///
/// Two tokens are the same token for the uniqueness check when their
/// digests are equal; two different tokens collide with probability about
/// n² / 2¹²⁹ (10⁻³⁰ for 10,000 tokens), and the later one would then be
/// refused as a duplicate.
///
/// `Debug` lists the workers and never their tokens.
#[derive(Clone, Default)]
pub struct TokenTable {
    /// The table's secret key for [`digest`](Self::digest).
    key: RandomState,
    /// Each token's digest → its worker and the token itself.
    by_digest: HashMap<Digest, (WorkerId, Token)>,
    /// Each worker → the digest of its token.
    by_worker: HashMap<WorkerId, Digest>,
}

/// A token's keyed digest (see [`TokenTable`]).
type Digest = u128;

impl TokenTable {
    /// An empty table, with a new secret key.
    pub fn new() -> TokenTable {
        TokenTable::default()
    }

    /// Sets `worker`'s token, returning the token it replaces.
    ///
    /// Refused if the token is shorter than [`MIN_TABLE_TOKEN`]
    /// ([`TokenTableError::TooShort`]) or longer than
    /// [`MAX_PRESENTED_TOKEN`] ([`TokenTableError::TooLong`]: no handshake
    /// could present it), or if another worker already has it
    /// ([`TokenTableError::DuplicateToken`]): the token is what tells the
    /// relay which worker a socket is, so it must be unique.
    pub fn insert(
        &mut self,
        worker: WorkerId,
        token: Token,
    ) -> Result<Option<Token>, TokenTableError> {
        let len = token.expose_secret().len();
        if len < MIN_TABLE_TOKEN {
            return Err(TokenTableError::TooShort {
                worker,
                min: MIN_TABLE_TOKEN,
            });
        }
        if len > MAX_PRESENTED_TOKEN {
            return Err(TokenTableError::TooLong {
                worker,
                max: MAX_PRESENTED_TOKEN,
            });
        }
        let digest = self.digest(token.expose_secret().as_bytes());
        if let Some((owner, _)) = self.by_digest.get(&digest) {
            if *owner != worker {
                return Err(TokenTableError::DuplicateToken { worker });
            }
        }
        let old = self
            .by_worker
            .insert(worker.clone(), digest)
            .and_then(|old| self.by_digest.remove(&old))
            .map(|(_, token)| token);
        self.by_digest.insert(digest, (worker, token));
        Ok(old)
    }

    /// Removes `worker` and returns its token.
    pub fn remove(&mut self, worker: &str) -> Option<Token> {
        let digest = self.by_worker.remove(worker)?;
        self.by_digest.remove(&digest).map(|(_, token)| token)
    }

    /// Whether `worker` has a token.
    pub fn contains(&self, worker: &str) -> bool {
        self.by_worker.contains_key(worker)
    }

    /// Whether `worker` has the same token in both tables (both without
    /// one counts as not the same: there is nothing to keep). Compared in
    /// constant time.
    pub fn same_token(&self, other: &TokenTable, worker: &str) -> bool {
        match (self.token_of(worker), other.token_of(worker)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    fn token_of(&self, worker: &str) -> Option<&Token> {
        let digest = self.by_worker.get(worker)?;
        self.by_digest.get(digest).map(|(_, token)| token)
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.by_worker.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.by_worker.is_empty()
    }

    /// The workers, in no particular order.
    pub fn workers(&self) -> impl Iterator<Item = &WorkerId> {
        self.by_worker.keys()
    }

    /// The worker whose token is `presented`, if any.
    ///
    /// O(1) in the number of entries and at most two passes over
    /// `presented` (none if it is longer than [`MAX_PRESENTED_TOKEN`]);
    /// its timing tells nothing about any token (see [`TokenTable`]).
    pub fn lookup(&self, presented: &str) -> Option<&WorkerId> {
        let presented = presented.as_bytes();
        if !(MIN_TABLE_TOKEN..=MAX_PRESENTED_TOKEN).contains(&presented.len()) {
            return None;
        }
        let (worker, token) = self.by_digest.get(&self.digest(presented))?;
        token.matches(presented).then_some(worker)
    }

    /// The digest of `token` under this table's key: std's keyed hash
    /// (`RandomState`'s `DefaultHasher`) of a domain byte and the token,
    /// for two domains, 128 bits. Its time depends only on `token.len()`.
    fn digest(&self, token: &[u8]) -> Digest {
        count_work(2 * token.len());
        let half = |domain: u8| {
            let mut h = self.key.build_hasher();
            h.write_u8(domain);
            h.write(token);
            h.finish()
        };
        (u128::from(half(0)) << 64) | u128::from(half(1))
    }
}

impl fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut entries: Vec<_> = self.by_digest.values().collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        f.debug_map()
            .entries(entries.into_iter().map(|(id, t)| (id, t)))
            .finish()
    }
}

/// Why a [`TokenTable`] refused an entry. The message names the worker,
/// never the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenTableError {
    /// Another worker already has this token.
    #[error("another worker already has the token given for worker {worker}")]
    DuplicateToken {
        /// The worker whose entry was refused.
        worker: WorkerId,
    },
    /// The token is shorter than [`MIN_TABLE_TOKEN`].
    #[error("the token given for worker {worker} is shorter than {min} bytes")]
    TooShort {
        /// The worker whose entry was refused.
        worker: WorkerId,
        /// The minimum length, in bytes ([`MIN_TABLE_TOKEN`]).
        min: usize,
    },
    /// The token is longer than [`MAX_PRESENTED_TOKEN`]: no handshake
    /// could present it.
    #[error("the token given for worker {worker} is longer than {max} bytes")]
    TooLong {
        /// The worker whose entry was refused.
        worker: WorkerId,
        /// The maximum length, in bytes ([`MAX_PRESENTED_TOKEN`]).
        max: usize,
    },
}

/// Counts bytes hashed or compared on behalf of a lookup. Tests read it
/// ([`work_done`]) to check the cost of a lookup without timing it.
#[inline]
fn count_work(bytes: usize) {
    #[cfg(test)]
    WORK.with(|w| w.set(w.get() + bytes));
    #[cfg(not(test))]
    let _ = bytes;
}

#[cfg(test)]
thread_local! {
    static WORK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Bytes hashed or compared so far on this thread (see [`count_work`]).
#[cfg(test)]
pub(crate) fn work_done() -> usize {
    WORK.with(std::cell::Cell::get)
}

#[cfg(test)]
#[path = "token_tests.rs"]
mod tests;
