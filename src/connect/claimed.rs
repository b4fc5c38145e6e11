//! The worker named by the connect URL: `/connect/<id>`.
//!
//! Behind a load balancer that routes by worker id (nginx
//! `hash $worker consistent`, Envoy ring hash), the worker's connect and its
//! callers' requests (`/w/<id>/…`) must carry the same key, so the worker
//! dials a URL that names it. The relay then accepts the socket only if the
//! bearer token belongs to that id: a worker cannot register under an id
//! that is not its own, whatever the URL says.

use super::handshake::{decide_upgrade, Accepted, Rejected, WWW_AUTHENTICATE};
use super::token::TokenTable;
use super::url::{WorkerId, WorkerIdError};

/// Where a worker's upgrade request was sent, relative to the relay's
/// connect path (`/connect` by default).
///
/// Exhaustive on purpose: a path is the connect path or under it
/// (anything else is `None` from [`ConnectTarget::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectTarget<'a> {
    /// The connect path itself: the token alone names the worker
    /// ([`decide_upgrade`]), as with a single relay.
    Any,
    /// `<connect path>/<claimed>`: the text after the slash, exactly as it
    /// appears in the request's path (not yet validated, not decoded).
    Claimed(&'a str),
}

impl<'a> ConnectTarget<'a> {
    /// Where `path` (a request's raw path, without the query) points under
    /// `connect_path`: [`ConnectTarget::Any`] if they are equal,
    /// [`ConnectTarget::Claimed`] with the rest if `path` is
    /// `connect_path` followed by `/`, and `None` if `path` is not under
    /// `connect_path` at all.
    ///
    /// ```
    /// use worker_relay::connect::ConnectTarget;
    ///
    /// assert_eq!(ConnectTarget::parse("/connect", "/connect"), Some(ConnectTarget::Any));
    /// assert_eq!(
    ///     ConnectTarget::parse("/connect", "/connect/abc"),
    ///     Some(ConnectTarget::Claimed("abc"))
    /// );
    /// // The rest is taken as it is; `decide_upgrade_at` refuses it (400).
    /// assert_eq!(
    ///     ConnectTarget::parse("/connect", "/connect/abc/"),
    ///     Some(ConnectTarget::Claimed("abc/"))
    /// );
    /// assert_eq!(ConnectTarget::parse("/connect", "/connected"), None);
    /// assert_eq!(ConnectTarget::parse("/connect", "/w/abc/health"), None);
    /// ```
    pub fn parse(connect_path: &str, path: &'a str) -> Option<ConnectTarget<'a>> {
        if path == connect_path {
            return Some(ConnectTarget::Any);
        }
        let base = connect_path.strip_suffix('/').unwrap_or(connect_path);
        let rest = path.strip_prefix(base)?.strip_prefix('/')?;
        Some(ConnectTarget::Claimed(rest))
    }
}

/// Why the relay refused a worker's upgrade request at a connect URL:
/// answer [`ConnectRejected::status`] with
/// [`ConnectRejected::response_headers`].
///
/// No message includes the presented token, the text of the path, or the
/// worker the token belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectRejected {
    /// The handshake itself was refused (no subprotocol: 400; a missing,
    /// malformed or unknown token: 401), as [`decide_upgrade`] decides.
    #[error(transparent)]
    Handshake(#[from] Rejected),
    /// The path names no valid worker id (empty, a `.` or `..`, a
    /// percent-escape, a `/` such as a trailing slash, another character
    /// outside `[A-Za-z0-9_-]`, or too long): 400.
    #[error("the connect URL names no valid worker id: {0}")]
    InvalidWorkerId(WorkerIdError),
    /// The token is valid but belongs to another worker than the one the
    /// URL names (or the URL names a worker the relay does not know): 401.
    #[error("the token does not belong to the worker the connect URL names")]
    NotThisWorker,
}

impl ConnectRejected {
    /// The HTTP status to answer with: 400 for a missing subprotocol or an
    /// invalid id in the path, 401 for a token that is missing, malformed,
    /// unknown, or another worker's.
    pub fn status(&self) -> u16 {
        match self {
            ConnectRejected::Handshake(r) => r.status(),
            ConnectRejected::InvalidWorkerId(_) => 400,
            ConnectRejected::NotThisWorker => 401,
        }
    }

    /// Headers for the refusal: `WWW-Authenticate: Bearer` on a 401
    /// (RFC 6750), none on a 400.
    pub fn response_headers(&self) -> &'static [(&'static str, &'static str)] {
        match self.status() {
            401 => &[(WWW_AUTHENTICATE, "Bearer")],
            _ => &[],
        }
    }
}

/// The relay's decision on a worker's upgrade request sent to
/// `<connect path>/<claimed>`:
///
/// 1. `claimed` must be a valid [`WorkerId`], spelled literally (no
///    percent-escape, no trailing slash), else
///    [`ConnectRejected::InvalidWorkerId`] (400);
/// 2. the headers must pass [`decide_upgrade`] (400 or 401);
/// 3. the token must belong to `claimed`, else
///    [`ConnectRejected::NotThisWorker`] (401). A worker the table does
///    not know is refused the same way, so the answer does not tell which
///    ids exist.
///
/// The token is looked up in constant time over the whole table, as by
/// [`decide_upgrade`]; comparing the ids after it reveals nothing secret.
///
/// ```
/// use worker_relay::connect::{decide_upgrade_for, TokenTable};
///
/// let table = TokenTable::parse("abc ct-abc-1f3a9c27d85e40b6\nother ct-other-5b8e03d7c9f2a146\n")?;
/// let headers = |token: &str| {
///     [
///         ("Sec-WebSocket-Protocol", "strata-worker-connect.v1".to_string()),
///         ("Authorization", format!("Bearer {token}")),
///     ]
/// };
/// let accepted = decide_upgrade_for(&table, "abc", headers("ct-abc-1f3a9c27d85e40b6")).unwrap();
/// assert_eq!(accepted.worker(), &"abc");
/// // Another worker's valid token: 401.
/// let theirs = headers("ct-other-5b8e03d7c9f2a146");
/// assert_eq!(decide_upgrade_for(&table, "abc", theirs).unwrap_err().status(), 401);
/// // Not an id: 400.
/// let mine = headers("ct-abc-1f3a9c27d85e40b6");
/// assert_eq!(decide_upgrade_for(&table, "ab%63", mine).unwrap_err().status(), 400);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decide_upgrade_for<I, N, V>(
    table: &TokenTable,
    claimed: &str,
    headers: I,
) -> Result<Accepted, ConnectRejected>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<str>,
    V: AsRef<str>,
{
    let claimed = WorkerId::new(claimed).map_err(ConnectRejected::InvalidWorkerId)?;
    let accepted = decide_upgrade(table, headers)?;
    if *accepted.worker() != claimed {
        return Err(ConnectRejected::NotThisWorker);
    }
    Ok(accepted)
}

/// The relay's decision for an upgrade request sent to `target`:
/// [`decide_upgrade`] for [`ConnectTarget::Any`],
/// [`decide_upgrade_for`] for [`ConnectTarget::Claimed`].
pub fn decide_upgrade_at<I, N, V>(
    table: &TokenTable,
    target: ConnectTarget<'_>,
    headers: I,
) -> Result<Accepted, ConnectRejected>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<str>,
    V: AsRef<str>,
{
    match target {
        ConnectTarget::Any => Ok(decide_upgrade(table, headers)?),
        ConnectTarget::Claimed(claimed) => decide_upgrade_for(table, claimed, headers),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::{Token, WorkerHandshake};
    use crate::frame::SUBPROTOCOL;

    const SECRETS: [&str; 3] = [
        "s3cret-abc-0123456789",
        "s3cret-other-0123456789",
        "s3cret-z-0123456789",
    ];

    fn table() -> TokenTable {
        let mut t = TokenTable::new();
        for (id, token) in ["abc", "other", "z"].iter().zip(SECRETS) {
            t.insert(WorkerId::new(*id).unwrap(), Token::new(token).unwrap())
                .unwrap();
        }
        t
    }

    fn headers(token: &str) -> Vec<(&'static str, String)> {
        let handshake = WorkerHandshake::new(Some(Token::new(token).unwrap()));
        let headers = handshake.request_headers();
        headers.iter().map(|(n, v)| (n, v.to_string())).collect()
    }

    fn decide(claimed: &str, token: &str) -> Result<String, ConnectRejected> {
        decide_upgrade_for(&table(), claimed, headers(token)).map(|a| a.worker().to_string())
    }

    #[test]
    fn the_named_worker_with_its_own_token_is_accepted() {
        assert_eq!(decide("abc", "s3cret-abc-0123456789").unwrap(), "abc");
        assert_eq!(decide("other", "s3cret-other-0123456789").unwrap(), "other");
        assert_eq!(decide("z", "s3cret-z-0123456789").unwrap(), "z");
    }

    #[test]
    fn another_workers_valid_token_is_401() {
        for (claimed, token) in [
            ("abc", "s3cret-other-0123456789"),
            ("other", "s3cret-abc-0123456789"),
        ] {
            let e = decide(claimed, token).unwrap_err();
            assert_eq!(e, ConnectRejected::NotThisWorker);
            assert_eq!(e.status(), 401);
            assert_eq!(e.response_headers(), [("WWW-Authenticate", "Bearer")]);
        }
        // A worker the relay does not know: refused the same way as a
        // known one with the wrong token (the answer tells nothing).
        assert_eq!(
            decide("nobody", "s3cret-abc-0123456789").unwrap_err(),
            ConnectRejected::NotThisWorker
        );
    }

    #[test]
    fn an_unknown_or_missing_token_is_the_handshakes_401() {
        let e = decide("abc", "s3cret-nope-0123456789").unwrap_err();
        assert_eq!(e, ConnectRejected::Handshake(Rejected::UnknownToken));
        assert_eq!(e.status(), 401);
        let only_protocol = [("Sec-WebSocket-Protocol", SUBPROTOCOL)];
        let e = decide_upgrade_for(&table(), "abc", only_protocol).unwrap_err();
        assert_eq!(e, ConnectRejected::Handshake(Rejected::MissingToken));
        assert_eq!(e.response_headers(), [("WWW-Authenticate", "Bearer")]);
        // No subprotocol: the handshake's 400, before the token is looked at.
        let old = [
            ("Sec-WebSocket-Protocol", "chat"),
            ("Authorization", "Bearer s3cret-abc-0123456789"),
        ];
        let e = decide_upgrade_for(&table(), "abc", old).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.response_headers().is_empty());
    }

    #[test]
    fn a_path_that_names_no_valid_id_is_400() {
        let cases = [
            ("", WorkerIdError::Empty),
            ("abc/", WorkerIdError::InvalidChar { index: 3 }),
            ("abc/x", WorkerIdError::InvalidChar { index: 3 }),
            ("ab%63", WorkerIdError::PercentEncoded),
            ("%61bc", WorkerIdError::PercentEncoded),
            ("..", WorkerIdError::DotSegment),
            ("a.b", WorkerIdError::InvalidChar { index: 1 }),
            ("ab c", WorkerIdError::InvalidChar { index: 2 }),
            ("abc;x", WorkerIdError::InvalidChar { index: 3 }),
        ];
        for (claimed, why) in cases {
            // Even with the right token: the id is checked first.
            let e = decide(claimed, "s3cret-abc-0123456789").unwrap_err();
            assert_eq!(e, ConnectRejected::InvalidWorkerId(why), "{claimed:?}");
            assert_eq!(e.status(), 400);
            assert!(e.response_headers().is_empty());
        }
        let long = "a".repeat(WorkerId::MAX_LEN + 1);
        assert_eq!(
            decide(&long, "s3cret-abc-0123456789").unwrap_err(),
            ConnectRejected::InvalidWorkerId(WorkerIdError::TooLong)
        );
        // Ids compare byte for byte: no case folding.
        assert_eq!(
            decide("ABC", "s3cret-abc-0123456789").unwrap_err(),
            ConnectRejected::NotThisWorker
        );
    }

    #[test]
    fn targets_under_the_connect_path() {
        let p = |path| ConnectTarget::parse("/connect", path);
        assert_eq!(p("/connect"), Some(ConnectTarget::Any));
        assert_eq!(p("/connect/abc"), Some(ConnectTarget::Claimed("abc")));
        assert_eq!(p("/connect/"), Some(ConnectTarget::Claimed("")));
        assert_eq!(p("/connect/abc/"), Some(ConnectTarget::Claimed("abc/")));
        assert_eq!(p("/connect/ab%63"), Some(ConnectTarget::Claimed("ab%63")));
        assert_eq!(p("/connect//abc"), Some(ConnectTarget::Claimed("/abc")));
        for other in [
            "/",
            "",
            "/connectabc",
            "/connec",
            "/w/abc",
            "/CONNECT",
            "//connect",
        ] {
            assert_eq!(p(other), None, "{other:?}");
        }
        // A connect path given with a trailing slash.
        assert_eq!(
            ConnectTarget::parse("/ws/", "/ws/abc"),
            Some(ConnectTarget::Claimed("abc"))
        );
        assert_eq!(
            ConnectTarget::parse("/ws/", "/ws/"),
            Some(ConnectTarget::Any)
        );
    }

    #[test]
    fn decide_at_each_target() {
        let t = table();
        let at = |target, token| decide_upgrade_at(&t, target, headers(token));
        // Plain /connect: the token alone names the worker.
        assert_eq!(
            at(ConnectTarget::Any, "s3cret-other-0123456789")
                .unwrap()
                .worker(),
            &"other"
        );
        assert_eq!(
            at(ConnectTarget::Claimed("abc"), "s3cret-other-0123456789").unwrap_err(),
            ConnectRejected::NotThisWorker
        );
        let path = ConnectTarget::parse("/connect", "/connect/ab%2Fc").unwrap();
        assert_eq!(at(path, "s3cret-abc-0123456789").unwrap_err().status(), 400);
        assert_eq!(
            at(ConnectTarget::Any, "nope").unwrap_err(),
            ConnectRejected::Handshake(Rejected::UnknownToken)
        );
        // A token over the cap: the handshake's 401 at either target.
        let long = "x".repeat(crate::connect::MAX_PRESENTED_TOKEN + 1);
        for target in [ConnectTarget::Any, ConnectTarget::Claimed("abc")] {
            let e = at(target, &long).unwrap_err();
            assert_eq!(e, ConnectRejected::Handshake(Rejected::TokenTooLong));
            assert_eq!(e.status(), 401);
        }
    }

    #[test]
    fn no_message_shows_a_token_the_path_or_the_tokens_owner() {
        let mut outputs = Vec::new();
        for (claimed, token) in [
            ("abc", "s3cret-other-0123456789"),
            ("abc", "s3cret-nope-0123456789"),
            ("ab%63", "s3cret-abc-0123456789"),
            ("abc/", "s3cret-z-0123456789"),
        ] {
            let e = decide(claimed, token).unwrap_err();
            outputs.push(format!("{e} | {e:?} | {e:#?}"));
        }
        for s in &outputs {
            assert!(!s.contains("s3cret"), "{s}");
            assert!(!s.contains("other") && !s.contains("%63"), "{s}");
        }
        assert!(outputs[0].contains("does not belong"), "{}", outputs[0]);
        assert!(outputs[2].contains("percent-encoded"), "{}", outputs[2]);
    }
}
