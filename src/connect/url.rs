//! URL mapping for relays: `/w/<worker-id>/<rest>?<query>` → worker id, the
//! path the worker sees, and the raw query.

use crate::frame::{FrameError, Headers, RequestHead};
use std::fmt;
use std::str::FromStr;

/// The name of a worker, as it appears in the relay's URLs and token table.
///
/// One or more characters from `[A-Za-z0-9_-]`, at most
/// [`WorkerId::MAX_LEN`]. That rules out `/`, `%` (no percent-encoded
/// spelling of an id), `.` and `..`, so an id is always one literal path
/// segment and compares byte for byte (case-sensitively).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId(Box<str>);

impl WorkerId {
    /// The longest id accepted, in bytes.
    pub const MAX_LEN: usize = 255;

    /// A validated worker id.
    pub fn new(id: impl Into<String>) -> Result<WorkerId, WorkerIdError> {
        let id = id.into();
        check_worker_id(&id)?;
        Ok(WorkerId(id.into_boxed_str()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Maps keyed by worker id can be searched with a `&str` (the derived
/// `Eq`, `Ord` and `Hash` are those of the text).
impl std::borrow::Borrow<str> for WorkerId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

fn check_worker_id(id: &str) -> Result<(), WorkerIdError> {
    if id.is_empty() {
        return Err(WorkerIdError::Empty);
    }
    if is_dot_segment(id) {
        return Err(WorkerIdError::DotSegment);
    }
    if id.len() > WorkerId::MAX_LEN {
        return Err(WorkerIdError::TooLong);
    }
    if id.contains('%') {
        return Err(WorkerIdError::PercentEncoded);
    }
    match id
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    {
        Some(index) => Err(WorkerIdError::InvalidChar { index }),
        None => Ok(()),
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for WorkerId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for WorkerId {
    type Err = WorkerIdError;
    fn from_str(s: &str) -> Result<WorkerId, WorkerIdError> {
        WorkerId::new(s)
    }
}

impl TryFrom<&str> for WorkerId {
    type Error = WorkerIdError;
    fn try_from(s: &str) -> Result<WorkerId, WorkerIdError> {
        WorkerId::new(s)
    }
}

impl TryFrom<String> for WorkerId {
    type Error = WorkerIdError;
    fn try_from(s: String) -> Result<WorkerId, WorkerIdError> {
        WorkerId::new(s)
    }
}

impl PartialEq<str> for WorkerId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for WorkerId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// Why a worker id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerIdError {
    /// The id is empty (`/w/` or `/w//x`).
    #[error("worker id is empty")]
    Empty,
    /// The id is a dot segment (`.` or `..`, also percent-encoded).
    #[error("worker id is a dot segment")]
    DotSegment,
    /// The id holds a `%`: ids have no percent-encoded spelling.
    #[error("worker id is percent-encoded")]
    PercentEncoded,
    /// The id holds a character outside `[A-Za-z0-9_-]` (such as `/` or `.`).
    #[error("worker id has a character outside [A-Za-z0-9_-] at byte {index}")]
    InvalidChar {
        /// Byte offset of the first such character in the id.
        index: usize,
    },
    /// The id is longer than [`WorkerId::MAX_LEN`] bytes.
    #[error("worker id is longer than 255 bytes")]
    TooLong,
}

/// Why a request target was not mapped to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The configured prefix does not start and end with `/`, or holds a
    /// character outside visible ASCII, `?` or `#`.
    #[error(
        "URL prefix must start and end with `/` and hold only visible ASCII without `?` or `#`"
    )]
    InvalidPrefix,
    /// The target is not origin-form (`/path?query`) or holds a character
    /// outside visible ASCII.
    #[error("request target must start with `/` and hold only visible ASCII")]
    InvalidTarget,
    /// The target's path does not start with the prefix.
    #[error("request target is not under the relay's worker prefix")]
    NotUnderPrefix,
    /// The path segment after the prefix is not a valid worker id.
    #[error("invalid worker id: {0}")]
    InvalidWorkerId(#[from] WorkerIdError),
    /// The path after the worker id holds a dot segment (`.`, `..`, or a
    /// percent-encoded spelling of either).
    #[error("path after the worker id holds a `.` or `..` segment")]
    DotSegment,
}

/// Whether `seg` is `.` or `..`, with any dot possibly written `%2e`/`%2E`
/// (the WHATWG URL Standard's single- and double-dot path segments).
fn is_dot_segment(seg: &str) -> bool {
    [".", "%2e", "..", ".%2e", "%2e.", "%2e%2e"]
        .iter()
        .any(|d| seg.eq_ignore_ascii_case(d))
}

/// Where a request target goes: which worker, and what the worker sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route<'a> {
    /// The worker the request is for.
    pub worker: WorkerId,
    /// The path the worker sees: starts with `/`, percent-encoded exactly as
    /// it was in the target (`/` when nothing follows the id).
    pub path: &'a str,
    /// The raw query without the `?`, or `""`.
    pub query: &'a str,
}

impl Route<'_> {
    /// The `request` frame's head for this route: `method`, the route's path
    /// and query, and `headers` minus hop-by-hop ones.
    pub fn request_head(&self, method: &str, headers: &Headers) -> Result<RequestHead, FrameError> {
        RequestHead::new(method, self.path, self.query, headers.without_hop_by_hop())
    }

    /// [`Route::request_head`] taking the headers by value: no copy of them
    /// (hop-by-hop ones are dropped in place).
    pub fn into_request_head(
        &self,
        method: &str,
        mut headers: Headers,
    ) -> Result<RequestHead, FrameError> {
        headers.strip_hop_by_hop();
        RequestHead::from_strs(method, self.path, self.query, headers)
    }
}

/// Maps request targets under a per-worker prefix (default `/w/`) to workers.
///
/// `/w/<id>/<rest>?<query>` maps to worker `<id>`, path `/<rest>` and query
/// `<query>`:
///
/// | target | worker | path | query |
/// |---|---|---|---|
/// | `/w/abc/v1/execute` | `abc` | `/v1/execute` | `""` |
/// | `/w/abc/health?x=1` | `abc` | `/health` | `x=1` |
/// | `/w/abc` | `abc` | `/` | `""` |
/// | `/w/abc/` | `abc` | `/` | `""` |
/// | `/w/abc?x` | `abc` | `/` | `x` |
/// | `/w/abc/a%2Fb` | `abc` | `/a%2Fb` | `""` |
///
/// The id is the whole segment after the prefix, so `/w/abcd` is worker
/// `abcd`, never `abc`; ids are validated by [`WorkerId::new`], so a segment
/// such as `..`, `%61bc` or `a.b` is refused.
///
/// # Dot segments
///
/// A path holding a `.` or `..` segment after the id (`/w/abc/../other/x`,
/// `/w/abc/./x`, `/w/abc/%2e%2e/x`, or with `\` as the separator) is refused
/// with [`UrlError::DotSegment`], rather than forwarded as `/../other/x`.
/// Forwarding it could not reach another worker (the id is taken before the
/// rest is looked at), but anything between the caller and the worker that
/// normalises paths would read it differently from the relay, and no path of
/// the executor protocol has such a segment. Refusing is the safer choice;
/// answer it with 400 or 404.
///
/// Nothing is decoded: the path keeps its percent-encoding, the query is
/// passed through raw, and empty segments (`//`) are the worker's business.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlMap {
    prefix: Box<str>,
}

impl UrlMap {
    /// The default prefix, `/w/`.
    pub const DEFAULT_PREFIX: &'static str = "/w/";

    /// A map with the given prefix: it starts and ends with `/` (`/` alone
    /// puts the id first), holds only visible ASCII, and no `?` or `#`.
    /// It is matched literally and case-sensitively.
    pub fn new(prefix: impl Into<String>) -> Result<UrlMap, UrlError> {
        let prefix = prefix.into();
        let visible = prefix
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'?' && b != b'#');
        if !prefix.starts_with('/') || !prefix.ends_with('/') || !visible {
            return Err(UrlError::InvalidPrefix);
        }
        Ok(UrlMap {
            prefix: prefix.into_boxed_str(),
        })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Splits a raw request target (`/path` or `/path?query`) into a [`Route`].
    pub fn map<'a>(&self, target: &'a str) -> Result<Route<'a>, UrlError> {
        if !target.starts_with('/') || !target.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(UrlError::InvalidTarget);
        }
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let rest = path
            .strip_prefix(&*self.prefix)
            .ok_or(UrlError::NotUnderPrefix)?;
        let (id, rest) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let worker = WorkerId::new(id)?;
        if rest.split(['/', '\\']).any(is_dot_segment) {
            return Err(UrlError::DotSegment);
        }
        let path = if rest.is_empty() { "/" } else { rest };
        Ok(Route {
            worker,
            path,
            query,
        })
    }

    /// The path prefix a worker is presented at, without a trailing slash
    /// (`/w/abc`); the server's `config.url` is this under the relay's origin,
    /// followed by `/v1/execute`.
    pub fn worker_path(&self, worker: &WorkerId) -> String {
        format!("{}{}", self.prefix, worker)
    }
}

impl Default for UrlMap {
    fn default() -> UrlMap {
        UrlMap {
            prefix: UrlMap::DEFAULT_PREFIX.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(map: &UrlMap, target: &str) -> (String, String, String) {
        let r = map.map(target).unwrap_or_else(|e| panic!("{target}: {e}"));
        (
            r.worker.to_string(),
            r.path.to_string(),
            r.query.to_string(),
        )
    }

    fn t(w: &str, p: &str, q: &str) -> (String, String, String) {
        (w.into(), p.into(), q.into())
    }

    #[test]
    fn worker_ids() {
        for good in ["abc", "A-Z_0-9", "-", "_", &"x".repeat(255)] {
            assert_eq!(WorkerId::new(good).unwrap().as_str(), good);
        }
        let cases = [
            ("", WorkerIdError::Empty),
            (".", WorkerIdError::DotSegment),
            ("..", WorkerIdError::DotSegment),
            ("%2e%2E", WorkerIdError::DotSegment),
            ("%61bc", WorkerIdError::PercentEncoded),
            ("a/b", WorkerIdError::InvalidChar { index: 1 }),
            ("a.b", WorkerIdError::InvalidChar { index: 1 }),
            ("ab c", WorkerIdError::InvalidChar { index: 2 }),
            ("caf\u{e9}", WorkerIdError::InvalidChar { index: 3 }),
            ("a~", WorkerIdError::InvalidChar { index: 1 }),
        ];
        for (bad, err) in cases {
            assert_eq!(WorkerId::new(bad), Err(err), "{bad:?}");
        }
        assert_eq!(WorkerId::new("x".repeat(256)), Err(WorkerIdError::TooLong));
        let id: WorkerId = "abc".parse().unwrap();
        assert_eq!(id, "abc");
        assert_eq!(WorkerId::try_from("abc".to_string()), Ok(id));
    }

    #[test]
    fn maps_path_and_query() {
        let m = UrlMap::default();
        assert_eq!(m.prefix(), "/w/");
        assert_eq!(ok(&m, "/w/abc/v1/execute"), t("abc", "/v1/execute", ""));
        assert_eq!(ok(&m, "/w/abc/health?x=1&y"), t("abc", "/health", "x=1&y"));
        assert_eq!(
            ok(&m, "/w/abc/v1/executions/b-1/cancel"),
            t("abc", "/v1/executions/b-1/cancel", "")
        );
        assert_eq!(ok(&m, "/w/abc"), t("abc", "/", ""));
        assert_eq!(ok(&m, "/w/abc/"), t("abc", "/", ""));
        assert_eq!(ok(&m, "/w/abc?"), t("abc", "/", ""));
        assert_eq!(ok(&m, "/w/abc?a=/../b?c"), t("abc", "/", "a=/../b?c"));
        assert_eq!(ok(&m, "/w/abc/a%2Fb%20c"), t("abc", "/a%2Fb%20c", ""));
        assert_eq!(ok(&m, "/w/abc//x"), t("abc", "//x", ""));
        assert_eq!(
            ok(&m, "/w/abc/..x/.y/x../a.b"),
            t("abc", "/..x/.y/x../a.b", "")
        );
        assert_eq!(ok(&m, "/w/abcd/x"), t("abcd", "/x", ""));
        assert_eq!(m.worker_path(&WorkerId::new("abc").unwrap()), "/w/abc");
    }

    #[test]
    fn refuses_bad_ids_and_targets() {
        let m = UrlMap::default();
        let e = |target: &str| m.map(target).unwrap_err();
        assert_eq!(e("/w/"), UrlError::InvalidWorkerId(WorkerIdError::Empty));
        assert_eq!(e("/w//x"), UrlError::InvalidWorkerId(WorkerIdError::Empty));
        assert_eq!(e("/w/?q"), UrlError::InvalidWorkerId(WorkerIdError::Empty));
        assert_eq!(
            e("/w/../x"),
            UrlError::InvalidWorkerId(WorkerIdError::DotSegment)
        );
        assert_eq!(
            e("/w/./x"),
            UrlError::InvalidWorkerId(WorkerIdError::DotSegment)
        );
        assert_eq!(
            e("/w/%2E%2e/x"),
            UrlError::InvalidWorkerId(WorkerIdError::DotSegment)
        );
        assert_eq!(
            e("/w/%61bc/x"),
            UrlError::InvalidWorkerId(WorkerIdError::PercentEncoded)
        );
        assert_eq!(
            e("/w/ab%2Fc/x"),
            UrlError::InvalidWorkerId(WorkerIdError::PercentEncoded)
        );
        assert_eq!(
            e("/w/a.b/x"),
            UrlError::InvalidWorkerId(WorkerIdError::InvalidChar { index: 1 })
        );
        assert_eq!(
            e("/w/abc;v=1/x"),
            UrlError::InvalidWorkerId(WorkerIdError::InvalidChar { index: 3 })
        );
        assert_eq!(
            e("/w/abc\\..\\other"),
            UrlError::InvalidWorkerId(WorkerIdError::InvalidChar { index: 3 })
        );
        assert_eq!(e("/w"), UrlError::NotUnderPrefix);
        assert_eq!(e("/W/abc"), UrlError::NotUnderPrefix);
        assert_eq!(e("/x/w/abc"), UrlError::NotUnderPrefix);
        assert_eq!(e("/%77/abc"), UrlError::NotUnderPrefix);
        assert_eq!(e("w/abc"), UrlError::InvalidTarget);
        assert_eq!(e("*"), UrlError::InvalidTarget);
        assert_eq!(e(""), UrlError::InvalidTarget);
        assert_eq!(e("http://h/w/abc"), UrlError::InvalidTarget);
        assert_eq!(e("/w/abc/a b"), UrlError::InvalidTarget);
        assert_eq!(e("/w/abc/\u{e9}"), UrlError::InvalidTarget);
    }

    #[test]
    fn dot_segments_after_the_id_are_refused() {
        let m = UrlMap::default();
        for target in [
            "/w/abc/../other/x",
            "/w/abc/..",
            "/w/abc/.",
            "/w/abc/./x",
            "/w/abc/x/..",
            "/w/abc/x/../../other",
            "/w/abc/%2e%2e/other/x",
            "/w/abc/.%2E/other",
            "/w/abc/%2E./other",
            "/w/abc/%2e/x",
            "/w/abc/..\\other",
            "/w/abc/x\\..\\..\\other",
            "/w/abc/../other/x?q=1",
        ] {
            assert_eq!(m.map(target), Err(UrlError::DotSegment), "{target}");
        }
    }

    #[test]
    fn custom_prefix() {
        let m = UrlMap::new("/relay/workers/").unwrap();
        assert_eq!(ok(&m, "/relay/workers/abc/health"), t("abc", "/health", ""));
        assert_eq!(m.map("/w/abc/health"), Err(UrlError::NotUnderPrefix));
        let root = UrlMap::new("/").unwrap();
        assert_eq!(ok(&root, "/abc/v1/execute?x"), t("abc", "/v1/execute", "x"));
        for bad in ["", "w/", "/w", "/w?/", "/w#/", "/w x/", "/w\u{e9}/"] {
            assert_eq!(UrlMap::new(bad), Err(UrlError::InvalidPrefix), "{bad:?}");
        }
    }

    #[test]
    fn request_head_from_route() {
        let m = UrlMap::default();
        let r = m.map("/w/abc/v1/execute?x=1").unwrap();
        let headers = Headers::try_from_pairs([
            ("Authorization", "Bearer worker-token"),
            ("Connection", "keep-alive"),
            ("Content-Length", "3"),
        ])
        .unwrap();
        let head = r.request_head("POST", &headers).unwrap();
        assert_eq!(head.method(), "POST");
        assert_eq!(head.target(), "/v1/execute?x=1");
        let names: Vec<&str> = head.headers().iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["Authorization", "Content-Length"]);
        assert_eq!(
            r.request_head("BAD METHOD", &headers),
            Err(FrameError::InvalidMethod)
        );
    }
}
