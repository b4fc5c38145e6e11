//! The handshake's conversions to and from the [`http`] crate's types
//! (feature `http`), for relays and workers built on hyper, axum or
//! tungstenite: [`RequestHeaders::to_header_map`] (the worker's upgrade
//! headers, `Authorization` marked sensitive), [`Verdict::from_http_response`]
//! (what the worker makes of the relay's answer) and [`decide_upgrade_http`]
//! (the relay's decision on an upgrade request's `HeaderMap`).
//!
//! The conversions of a forwarded request and response are in
//! [`forward`](crate::forward).

use super::{decide_upgrade, Accepted, Rejected, RequestHeaders, TokenTable, Verdict};
use crate::frame::latin1_to_string;
use ::http::header::{HeaderMap, HeaderName, HeaderValue};

impl RequestHeaders {
    /// The worker's upgrade headers as a `HeaderMap`, with `Authorization`
    /// marked sensitive (so `http`'s `Debug` hides it too).
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn to_header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.len());
        for (name, value) in self.iter() {
            // A token is visible ASCII, so both are always valid.
            let (Ok(n), Ok(mut v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) else {
                continue;
            };
            v.set_sensitive(RequestHeaders::is_sensitive(name));
            map.append(n, v);
        }
        map
    }
}

impl Verdict {
    /// [`Verdict::from_response`] on an `http` response (as tungstenite
    /// returns from a handshake, or carries in its `Http` error).
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn from_http_response<T>(response: &::http::Response<T>) -> Verdict {
        Verdict::from_response(
            response.status().as_u16(),
            response
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str(), latin1_to_string(v.as_bytes()))),
        )
    }
}

/// [`decide_upgrade`] on an upgrade request's `HeaderMap` (values read as
/// Latin-1).
pub fn decide_upgrade_http(table: &TokenTable, headers: &HeaderMap) -> Result<Accepted, Rejected> {
    decide_upgrade(
        table,
        headers.iter().map(|(n, v)| (n.as_str(), header_text(v))),
    )
}

/// A header value as text for the handshake decision, read as Latin-1:
/// borrowed when it is visible ASCII (`HeaderValue::to_str`, where Latin-1
/// and ASCII agree), decoded only otherwise. Borrowing spares a copy of
/// every header a stranger's upgrade request brings (decoding 60 KiB takes
/// about 60 µs; checking it, about 1 µs). A relay that reads the upgrade
/// request's headers itself (as this crate's gateway does, before
/// [`decide_upgrade_at`](super::decide_upgrade_at)) reads them with this.
pub fn header_text(value: &HeaderValue) -> std::borrow::Cow<'_, str> {
    match value.to_str() {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => std::borrow::Cow::Owned(latin1_to_string(value.as_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::{Token, WorkerHandshake, WorkerId};
    use crate::frame::SUBPROTOCOL;

    #[test]
    fn handshake_over_http_types() {
        let hs = WorkerHandshake::new(Some(Token::new("s3cret-0123456789").unwrap()));
        let map = hs.request_headers().to_header_map();
        assert!(map["authorization"].is_sensitive());
        assert_eq!(map["authorization"], "Bearer s3cret-0123456789");
        assert_eq!(map["sec-websocket-protocol"], SUBPROTOCOL);
        assert!(!format!("{map:?}").contains("s3cret-0123456789"));

        let mut table = TokenTable::new();
        table
            .insert(
                WorkerId::new("abc").unwrap(),
                Token::new("s3cret-0123456789").unwrap(),
            )
            .unwrap();
        assert_eq!(decide_upgrade_http(&table, &map).unwrap().worker(), &"abc");
        assert_eq!(
            decide_upgrade_http(
                &table,
                &WorkerHandshake::default().request_headers().to_header_map()
            ),
            Err(Rejected::MissingToken)
        );
        // Values are Latin-1, borrowed when they are ASCII.
        let ascii = HeaderValue::from_static("Bearer s3cret-0123456789");
        assert!(matches!(header_text(&ascii), std::borrow::Cow::Borrowed(_)));
        let latin1 = HeaderValue::from_bytes(b"Bearer caf\xe9-0123456789").unwrap();
        assert_eq!(header_text(&latin1), "Bearer caf\u{e9}-0123456789");

        let ok = ::http::Response::builder()
            .status(101)
            .header("sec-websocket-protocol", SUBPROTOCOL)
            .body(())
            .unwrap();
        assert_eq!(Verdict::from_http_response(&ok), Verdict::Connected);
        let no = ::http::Response::builder().status(101).body(()).unwrap();
        assert!(Verdict::from_http_response(&no).is_final());
        let busy = ::http::Response::builder().status(503).body(()).unwrap();
        assert!(!Verdict::from_http_response(&busy).is_final());
    }
}
