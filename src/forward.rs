//! An HTTP request forwarded over the protocol, as the [`http`] crate's
//! types (feature `http`): what a relay and a worker built on hyper, axum or
//! any `http`-based stack convert at each end of a stream.
//!
//! | side | from | to | function |
//! |---|---|---|---|
//! | relay | a caller's request | the worker and its `request` frame head | [`request_head_from_parts`] |
//! | relay | the worker's `response` head | the caller's HTTP response | [`response_builder`] |
//! | worker | a `request` head | an HTTP request for the app | [`request_builder`] |
//! | worker | the app's HTTP response | a `response` head | [`response_head_from_parts`] |
//! | both | a `HeaderMap` | [`Headers`] (and back) | [`headers_from_map`], [`header_map_from_headers`] |
//!
//! Header values are Latin-1 both ways; hop-by-hop headers are dropped where
//! a hop ends (the relay's two conversions). The `gateway` and `tunnel`
//! features forward with exactly these. The handshake's conversions (the
//! upgrade request's headers, the answer's verdict) are in
//! [`connect::http`](crate::connect::http).
//!
//! ```
//! use worker_relay::connect::UrlMap;
//! use worker_relay::forward::{request_builder, request_head_from_parts};
//!
//! // The relay: a caller's request for worker `abc`, as the `request` frame's head ...
//! let caller = http::Request::post("/w/abc/v1/execute?x=1").header("x-a", "1").body(())?;
//! let (worker, head) = request_head_from_parts(&caller.into_parts().0, &UrlMap::default())?;
//! assert_eq!(worker.as_str(), "abc");
//! assert_eq!(head.target(), "/v1/execute?x=1");
//! // ... and the worker: that head as the request its app serves.
//! let app_request = request_builder(&head)?.body(())?;
//! assert_eq!(app_request.uri(), "/v1/execute?x=1");
//! assert_eq!(app_request.headers()["x-a"], "1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::connect::{UrlError, UrlMap, WorkerId};
use crate::frame::{
    is_hop_by_hop_name, string_to_latin1, FrameError, HeaderError, Headers, RequestHead,
    ResponseHead,
};
use ::http::header::{HeaderMap, HeaderName, HeaderValue};
use ::http::{request, response, Method, StatusCode, Uri};
use bytes::Bytes;

/// Why a conversion to or from an `http` type failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The request's URI was not mapped to a worker.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The head was refused by the frame layer.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A header was refused by [`Headers`].
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The request's URI has no path (authority-form, as in `CONNECT`).
    #[error("request URI has no path")]
    NoPath,
    /// A header name is not accepted by `http::HeaderName`.
    #[error("header {index}: name is not accepted by the http crate")]
    InvalidHeaderName {
        /// Position of the header in the list.
        index: usize,
    },
    /// A header value is not accepted by `http::HeaderValue` (a control
    /// character other than tab).
    #[error("header {index}: value is not accepted by the http crate")]
    InvalidHeaderValue {
        /// Position of the header in the list.
        index: usize,
    },
    /// The method is not accepted by `http::Method`.
    #[error("method is not accepted by the http crate")]
    InvalidMethod,
    /// The path and query are not accepted by `http::Uri`.
    #[error("path and query are not accepted by the http crate")]
    InvalidUri,
}

/// A `HeaderMap` as [`Headers`], values decoded as Latin-1.
///
/// `HeaderMap` groups the values of a name together (in the order they were
/// appended) and lowercases names, so that is the order and spelling here.
pub fn headers_from_map(map: &HeaderMap) -> Result<Headers, HeaderError> {
    headers_from_map_keeping(map, |_| true)
}

/// The headers of `map` that `keep` keeps, as [`Headers`]: sized once.
fn headers_from_map_keeping(
    map: &HeaderMap,
    keep: impl Fn(&HeaderName) -> bool,
) -> Result<Headers, HeaderError> {
    let (mut pairs, mut bytes) = (0, 0);
    for (n, v) in map.iter().filter(|(n, _)| keep(n)) {
        pairs += 1;
        bytes += n.as_str().len() + v.len();
    }
    // Room for the text when it is ASCII (Latin-1 above 0x7f takes two
    // bytes in UTF-8: the string then grows).
    let mut headers = Headers::with_capacity(pairs, bytes);
    headers.extend_raw(
        map.iter()
            .filter(|(n, _)| keep(n))
            .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
    )?;
    Ok(headers)
}

/// [`Headers`] as a `HeaderMap`, values encoded back to Latin-1; repeats are
/// appended in order.
pub fn header_map_from_headers(headers: &Headers) -> Result<HeaderMap, HttpError> {
    header_map_keeping(headers, |_| true)
}

/// The headers `keep` keeps as a `HeaderMap`. With three ASCII values or
/// more in the list, they are slices of one copy of the list's text (two allocations
/// for all of them: the copy, and its count of owners at the first slice);
/// with fewer, each is a copy of its own.
fn header_map_keeping(
    headers: &Headers,
    keep: impl Fn(&str) -> bool,
) -> Result<HeaderMap, HttpError> {
    let mut map = HeaderMap::with_capacity(headers.len());
    // Counted over the whole list: `keep` (a scan of `Connection` for each
    // name when it is there) runs once per header, below.
    let ascii = headers.iter().filter(|(_, v)| v.is_ascii()).count();
    let mut text: Option<Bytes> = None;
    for (index, (name, value, span)) in headers.iter_spans().enumerate() {
        if !keep(name) {
            continue;
        }
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| HttpError::InvalidHeaderName { index })?;
        let bytes = if value.is_ascii() && ascii >= 3 {
            text.get_or_insert_with(|| Bytes::copy_from_slice(headers.text().as_bytes()))
                .slice(span)
        } else if value.is_ascii() {
            Bytes::copy_from_slice(value.as_bytes())
        } else {
            Bytes::from(string_to_latin1(value).ok_or(HttpError::InvalidHeaderValue { index })?)
        };
        let value = HeaderValue::from_maybe_shared(bytes)
            .map_err(|_| HttpError::InvalidHeaderValue { index })?;
        map.append(name, value);
    }
    Ok(map)
}

/// Relay: the worker a caller's request is for, and the `request` frame head
/// to forward: method, path and query after [`UrlMap::map`], and the headers
/// minus hop-by-hop ones.
pub fn request_head_from_parts(
    parts: &request::Parts,
    map: &UrlMap,
) -> Result<(WorkerId, RequestHead), HttpError> {
    let target = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .filter(|t| t.starts_with('/'))
        .ok_or(HttpError::NoPath)?;
    let route = map.map(target)?;
    let headers = if connection_names_more(&parts.headers) {
        // It names more hop-by-hop headers: as `Headers` judges them.
        headers_from_map(&parts.headers)?
    } else {
        headers_from_map_keeping(&parts.headers, |n| !is_hop_by_hop_name(n.as_str()))?
    };
    let head = route.into_request_head(parts.method.as_str(), headers)?;
    Ok((route.worker, head))
}

/// Whether a `Connection` header lists a name that is not hop-by-hop by
/// itself (`keep-alive`, the usual one, is): only then does the list drop
/// more than [`is_hop_by_hop_name`] does. A value that is not visible ASCII
/// counts as naming more (the list judges it).
fn connection_names_more(map: &HeaderMap) -> bool {
    map.get_all(::http::header::CONNECTION)
        .iter()
        .any(|v| match v.to_str() {
            Ok(v) => v
                .split(',')
                .map(str::trim)
                .any(|t| !t.is_empty() && !is_hop_by_hop_name(t)),
            Err(_) => true,
        })
}

/// Relay: an HTTP response builder for the worker's `response` head: its
/// status, and its headers minus hop-by-hop ones (the relay frames the body
/// to its caller itself).
pub fn response_builder(head: &ResponseHead) -> Result<response::Builder, HttpError> {
    let status = StatusCode::from_u16(head.status()).map_err(|_| FrameError::InvalidStatus)?;
    let list = head.headers();
    // `Connection` names more hop-by-hop headers only when it is there.
    let listed = list.get("connection").is_some();
    let headers = header_map_keeping(list, |n| {
        !if listed {
            list.is_hop_by_hop(n)
        } else {
            is_hop_by_hop_name(n)
        }
    })?;
    let mut builder = response::Builder::new().status(status);
    if let Some(h) = builder.headers_mut() {
        *h = headers;
    }
    Ok(builder)
}

/// Worker: an HTTP request builder for a `request` head (method, path and
/// query as the URI, headers as they came).
pub fn request_builder(head: &RequestHead) -> Result<request::Builder, HttpError> {
    let method =
        Method::from_bytes(head.method().as_bytes()).map_err(|_| HttpError::InvalidMethod)?;
    let uri = Uri::try_from(head.target()).map_err(|_| HttpError::InvalidUri)?;
    let headers = header_map_from_headers(head.headers())?;
    let mut builder = request::Builder::new().method(method).uri(uri);
    if let Some(h) = builder.headers_mut() {
        *h = headers;
    }
    Ok(builder)
}

/// Worker: the `response` frame head for the app's response (status and
/// headers, as the app produced them).
pub fn response_head_from_parts(parts: &response::Parts) -> Result<ResponseHead, HttpError> {
    let headers = headers_from_map(&parts.headers)?;
    Ok(ResponseHead::new(parts.status.as_u16(), headers)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str, headers: &[(&str, &[u8])]) -> request::Parts {
        let mut b = request::Builder::new().method(method).uri(uri);
        for (n, v) in headers {
            b = b.header(*n, HeaderValue::from_bytes(v).unwrap());
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn request_parts_to_head() {
        let p = parts(
            "POST",
            "/w/abc/v1/execute?x=%20y",
            &[
                ("host", b"relay"),
                ("authorization", b"Bearer worker-token"),
                ("connection", b"keep-alive, x-private"),
                ("x-private", b"1"),
                ("transfer-encoding", b"chunked"),
                ("proxy-authorization", b"p"),
                ("x-latin", b"caf\xe9"),
                ("x-rep", b"1"),
                ("x-rep", b"2"),
            ],
        );
        let (worker, head) = request_head_from_parts(&p, &UrlMap::default()).unwrap();
        assert_eq!(worker, "abc");
        assert_eq!(head.method(), "POST");
        assert_eq!(head.path(), "/v1/execute");
        assert_eq!(head.query(), "x=%20y");
        let pairs: Vec<(&str, &str)> = head.headers().iter().collect();
        assert_eq!(
            pairs,
            [
                ("host", "relay"),
                ("authorization", "Bearer worker-token"),
                ("x-latin", "caf\u{e9}"),
                ("x-rep", "1"),
                ("x-rep", "2"),
            ]
        );
        // Absolute-form URIs map by their path.
        let p = parts("GET", "http://relay.example/w/abc", &[]);
        let (_, head) = request_head_from_parts(&p, &UrlMap::default()).unwrap();
        assert_eq!(head.target(), "/");
    }

    #[test]
    fn request_parts_refused() {
        let m = UrlMap::default();
        let p = parts("GET", "/w/abc/../other/x", &[]);
        assert_eq!(
            request_head_from_parts(&p, &m),
            Err(HttpError::Url(UrlError::DotSegment))
        );
        let p = parts("GET", "/elsewhere", &[]);
        assert_eq!(
            request_head_from_parts(&p, &m),
            Err(HttpError::Url(UrlError::NotUnderPrefix))
        );
        let p = parts("CONNECT", "relay.example:443", &[]);
        assert_eq!(request_head_from_parts(&p, &m), Err(HttpError::NoPath));
        let p = parts("OPTIONS", "*", &[]);
        assert_eq!(request_head_from_parts(&p, &m), Err(HttpError::NoPath));
    }

    #[test]
    fn response_head_to_builder_and_back() {
        let head = ResponseHead::new(
            200,
            Headers::try_from_pairs([
                ("Content-Type", "application/x-tar"),
                ("X-Strata-Executor-Protocol", "v1"),
                ("Transfer-Encoding", "chunked"),
                ("X-Latin", "caf\u{e9}"),
            ])
            .unwrap(),
        )
        .unwrap();
        let resp = response_builder(&head).unwrap().body(()).unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers().len(), 3);
        assert!(resp.headers().get("transfer-encoding").is_none());
        assert_eq!(resp.headers()["x-latin"].as_bytes(), b"caf\xe9");
        let (parts, ()) = resp.into_parts();
        let back = response_head_from_parts(&parts).unwrap();
        assert_eq!(back.status(), 200);
        assert_eq!(back.headers().get("X-Latin"), Some("caf\u{e9}"));
        assert_eq!(
            back.headers().get("content-type"),
            Some("application/x-tar")
        );

        let bad =
            ResponseHead::new(200, Headers::try_from_pairs([("x", "a\u{1}b")]).unwrap()).unwrap();
        assert_eq!(
            response_builder(&bad).unwrap_err(),
            HttpError::InvalidHeaderValue { index: 0 }
        );
    }

    #[test]
    fn request_head_to_builder() {
        let head = RequestHead::new(
            "POST",
            "/v1/execute",
            "a=1",
            Headers::try_from_pairs([("x-a", "1"), ("X-A", "2")]).unwrap(),
        )
        .unwrap();
        let req = request_builder(&head).unwrap().body(()).unwrap();
        assert_eq!(req.method(), Method::POST);
        assert_eq!(req.uri(), "/v1/execute?a=1");
        let values: Vec<&[u8]> = req
            .headers()
            .get_all("x-a")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        assert_eq!(values, [b"1", b"2"]);
    }

    /// Without `Connection`, hop-by-hop headers are dropped as the map is
    /// read (no second copy), in order otherwise.
    #[test]
    fn request_parts_without_connection_drop_hop_by_hop_headers() {
        let p = parts(
            "GET",
            "/w/abc/x",
            &[
                ("te", b"trailers"),
                ("x-a", b"1"),
                ("upgrade", b"websocket"),
                ("proxy-authorization", b"p"),
                ("x-latin", b"caf\xe9"),
                ("keep-alive", b"timeout=5"),
            ],
        );
        let (_, head) = request_head_from_parts(&p, &UrlMap::default()).unwrap();
        let pairs: Vec<(&str, &str)> = head.headers().iter().collect();
        assert_eq!(pairs, [("x-a", "1"), ("x-latin", "caf\u{e9}")]);
    }

    /// With `Connection`, the head holds what the whole list minus its
    /// hop-by-hop headers holds, whether `Connection` names more (the list
    /// judges) or only hop-by-hop names (dropped as the map is read).
    #[test]
    fn request_parts_with_connection_drop_what_the_list_drops() {
        let connections: [&[&[u8]]; 9] = [
            &[b"keep-alive"],
            &[b"Keep-Alive, Upgrade"],
            &[b" , te ,"],
            &[b"close"],
            &[b"x-a"],
            &[b"keep-alive", b"X-A"],
            &[b"keep-alive, x-b"],
            &[b"caf\xe9"],
            &[b""],
        ];
        for values in connections {
            let mut headers: Vec<(&str, &[u8])> = vec![
                ("x-a", b"1"),
                ("close", b"c"),
                ("te", b"trailers"),
                ("keep-alive", b"timeout=5"),
                ("x-b", b"2"),
                ("caf", b"3"),
                ("upgrade", b"h2c"),
            ];
            headers.extend(values.iter().map(|v| ("connection", *v)));
            let p = parts("GET", "/w/abc/x", &headers);
            let (_, head) = request_head_from_parts(&p, &UrlMap::default()).unwrap();
            let expected = headers_from_map(&p.headers).unwrap().without_hop_by_hop();
            assert_eq!(head.headers(), &expected, "Connection: {values:?}");
        }
    }

    /// A response head with values enough to share one copy of the text,
    /// Latin-1 ones beside them, and a header its `Connection` names.
    #[test]
    fn response_values_shared_or_copied_come_out_the_same() {
        let head = ResponseHead::new(
            200,
            Headers::try_from_pairs([
                ("Content-Type", "text/plain"),
                ("Connection", "x-hop"),
                ("X-Hop", "dropped"),
                ("X-Latin", "\u{e9}t\u{e9}"),
                ("X-A", "1"),
                ("x-a", "2"),
                ("Date", "Sun, 06 Dec 2026 15:00:00 GMT"),
            ])
            .unwrap(),
        )
        .unwrap();
        let resp = response_builder(&head).unwrap().body(()).unwrap();
        let got: Vec<(&str, &[u8])> = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect();
        assert_eq!(
            got,
            [
                ("content-type", &b"text/plain"[..]),
                ("x-latin", b"\xe9t\xe9"),
                ("x-a", b"1"),
                ("x-a", b"2"),
                ("date", b"Sun, 06 Dec 2026 15:00:00 GMT"),
            ]
        );
        // Two values: each a copy of its own.
        let two = Headers::try_from_pairs([("a", "1"), ("b", "\u{ff}"), ("c", "3")]).unwrap();
        let map = header_map_from_headers(&two).unwrap();
        assert_eq!(map["a"], "1");
        assert_eq!(map["b"].as_bytes(), b"\xff");
        assert_eq!(map["c"], "3");
    }

    /// A method RFC 9110 defines is kept as a static string; another one as
    /// it came. The head is the same however it was made.
    #[test]
    fn methods_known_or_not() {
        for method in ["GET", "PATCH", "PROPFIND", "get"] {
            let a = RequestHead::new(method, "/p", "q=1", Headers::new()).unwrap();
            let route = UrlMap::default().map("/w/abc/p?q=1").unwrap();
            let b = route.into_request_head(method, Headers::new()).unwrap();
            assert_eq!(a, b);
            assert_eq!(a.method(), method);
            assert_eq!(a.target(), "/p?q=1");
        }
        assert!(RequestHead::new("BAD METHOD", "/", "", Headers::new()).is_err());
    }

    #[test]
    fn header_map_round_trip() {
        let h = Headers::try_from_pairs([("a", "1"), ("B", "\u{ff}"), ("a", "2")]).unwrap();
        let map = header_map_from_headers(&h).unwrap();
        let back = headers_from_map(&map).unwrap();
        let pairs: Vec<(&str, &str)> = back.iter().collect();
        assert_eq!(pairs, [("a", "1"), ("a", "2"), ("b", "\u{ff}")]);
    }
}
