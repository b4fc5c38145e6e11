//! HTTP headers as the protocol carries them: ordered `[name, value]` pairs,
//! repeats allowed, values as Latin-1 strings.

use super::HeaderError;

/// Whether `b` is an HTTP token character (RFC 9110 `tchar`).
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[b as usize]
}

/// RFC 9110 `tchar`, as a table.
static TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        i += 1;
    }
    t
};

/// Whether `s` is a non-empty HTTP token (a valid method or header name).
pub fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

fn check_value(value: &str, index: usize) -> Result<(), HeaderError> {
    // The usual case first, without branches (the compiler vectorises it).
    let bad = value.bytes().fold(false, |bad, b| {
        bad | (b >= 0xc4) | (b == b'\r') | (b == b'\n') | (b == 0)
    });
    if !bad {
        return Ok(());
    }
    // Byte by byte on the UTF-8: a char above U+00FF is exactly one whose
    // lead byte is 0xC4 or more; CR, LF and NUL are single bytes. The first
    // offending char decides, as when walking chars.
    for &b in value.as_bytes() {
        if b >= 0xc4 {
            return Err(HeaderError::NotLatin1 { index });
        }
        if matches!(b, b'\r' | b'\n' | 0) {
            return Err(HeaderError::ForbiddenChar { index });
        }
    }
    Ok(())
}

/// Checks one header pair: the name is a token, the value is Latin-1 without
/// CR, LF or NUL. `index` is only used in the error.
pub fn check_header(name: &str, value: &str, index: usize) -> Result<(), HeaderError> {
    if !is_token(name) {
        return Err(HeaderError::InvalidName { index });
    }
    check_value(value, index)
}

/// Decodes raw header bytes as Latin-1: each byte becomes the char of the same value.
#[cfg(any(feature = "http", test))]
pub(crate) fn latin1_to_string(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

/// Encodes a Latin-1 string back to bytes, or `None` if a char is above U+00FF.
pub(crate) fn string_to_latin1(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

/// The hop-by-hop headers a relay never forwards (compared case-insensitively;
/// every `Proxy-*` header is hop-by-hop too).
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

/// An ordered list of header pairs whose every name is an HTTP token and whose
/// every value is Latin-1 without CR, LF or NUL.
///
/// The invariant is kept by every constructor, so a `Headers` can be written to
/// an HTTP message without risk of header injection.
///
/// The pairs live in one string, back to back, with the offsets where each
/// name and value ends: a list costs two allocations however many pairs it
/// holds (decoding, cloning and dropping a head stay cheap).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// Every name and value, back to back.
    text: String,
    /// For each pair, where its name ends and where its value ends in
    /// `text`; its name starts where the previous value ends.
    ends: Vec<(usize, usize)>,
}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Headers {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for pair in self.iter() {
            seq.serialize_element(&pair)?;
        }
        seq.end()
    }
}

impl Headers {
    /// The bytes its text has room for (what a decoder reserved).
    #[cfg(test)]
    pub(crate) fn text_capacity(&self) -> usize {
        self.text.capacity()
    }

    /// An empty list.
    pub fn new() -> Headers {
        Headers::default()
    }

    /// An empty list with room for `pairs` pairs of `bytes` bytes of text in all.
    pub fn with_capacity(pairs: usize, bytes: usize) -> Headers {
        Headers {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(pairs),
        }
    }

    /// Builds a list from pairs, validating each.
    pub fn try_from_pairs<I, N, V>(pairs: I) -> Result<Headers, HeaderError>
    where
        I: IntoIterator<Item = (N, V)>,
        N: AsRef<str>,
        V: AsRef<str>,
    {
        let pairs = pairs.into_iter();
        let mut h = Headers {
            text: String::new(),
            ends: Vec::with_capacity(pairs.size_hint().0),
        };
        for (n, v) in pairs {
            h.try_push(n, v)?;
        }
        Ok(h)
    }

    /// Builds a list from raw bytes (as an HTTP library holds them), decoding
    /// values as Latin-1. Names must be tokens; values must not hold CR, LF or NUL.
    pub fn try_from_raw<'a, I>(pairs: I) -> Result<Headers, HeaderError>
    where
        I: IntoIterator<Item = (&'a [u8], &'a [u8])>,
    {
        let mut h = Headers::new();
        h.extend_raw(pairs)?;
        Ok(h)
    }

    /// Appends raw pairs as [`Headers::try_from_raw`] reads them (`index`
    /// in an error counts from the first pair appended).
    pub(crate) fn extend_raw<'a, I>(&mut self, pairs: I) -> Result<(), HeaderError>
    where
        I: IntoIterator<Item = (&'a [u8], &'a [u8])>,
    {
        for (i, (n, v)) in pairs.into_iter().enumerate() {
            let name = std::str::from_utf8(n).map_err(|_| HeaderError::InvalidName { index: i })?;
            if !is_token(name) {
                return Err(HeaderError::InvalidName { index: i });
            }
            if v.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)) {
                return Err(HeaderError::ForbiddenChar { index: i });
            }
            self.text.push_str(name);
            let name_end = self.text.len();
            match std::str::from_utf8(v) {
                // ASCII is the same text in Latin-1 and UTF-8.
                Ok(ascii) if v.is_ascii() => self.text.push_str(ascii),
                _ => self.text.extend(v.iter().map(|&b| char::from(b))),
            }
            self.ends.push((name_end, self.text.len()));
        }
        Ok(())
    }

    /// Appends one pair after validating it.
    pub fn try_push(
        &mut self,
        name: impl AsRef<str>,
        value: impl AsRef<str>,
    ) -> Result<(), HeaderError> {
        let (name, value) = (name.as_ref(), value.as_ref());
        check_header(name, value, self.ends.len())?;
        self.text.push_str(name);
        let name_end = self.text.len();
        self.text.push_str(value);
        self.ends.push((name_end, self.text.len()));
        Ok(())
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&(name_end, value_end)| {
            let pair = (&self.text[start..name_end], &self.text[name_end..value_end]);
            start = value_end;
            pair
        })
    }

    /// The pairs in order, each with where its value is in [`Headers::text`].
    #[cfg(feature = "http")]
    pub(crate) fn iter_spans(&self) -> impl Iterator<Item = (&str, &str, std::ops::Range<usize>)> {
        let mut start = 0;
        self.ends.iter().map(move |&(name_end, value_end)| {
            let name = &self.text[start..name_end];
            start = value_end;
            (name, &self.text[name_end..value_end], name_end..value_end)
        })
    }

    /// Every name and value, back to back.
    #[cfg(feature = "http")]
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The pairs in order as raw bytes (values encoded back to Latin-1).
    pub fn iter_raw(&self) -> impl Iterator<Item = (&[u8], Vec<u8>)> {
        self.iter().map(|(n, v)| {
            let value = string_to_latin1(v).expect("Headers holds only Latin-1 values");
            (n.as_bytes(), value)
        })
    }

    /// The first value of the header `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// Every value of the header `name` (case-insensitive), in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// The pairs for which `keep` holds, in order.
    fn filtered(&self, mut keep: impl FnMut(&str) -> bool) -> Headers {
        let mut h = Headers::with_capacity(self.len(), self.text.len());
        for (n, v) in self.iter().filter(|(n, _)| keep(n)) {
            h.text.push_str(n);
            let name_end = h.text.len();
            h.text.push_str(v);
            h.ends.push((name_end, h.text.len()));
        }
        h
    }

    /// Removes every header named `name` (case-insensitive).
    pub fn remove(&mut self, name: &str) {
        if self.get(name).is_some() {
            *self = self.filtered(|n| !n.eq_ignore_ascii_case(name));
        }
    }

    /// The Content-Length, if any. Several values (repeated headers or a comma
    /// list) are accepted only if they all agree; a value that is not a decimal
    /// number is an error.
    pub fn content_length(&self) -> Result<Option<u64>, HeaderError> {
        let mut found: Option<u64> = None;
        for value in self.get_all("content-length") {
            for part in value.split(',') {
                let part = part.trim_matches(|c| c == ' ' || c == '\t');
                if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(HeaderError::InvalidContentLength);
                }
                let n: u64 = part
                    .parse()
                    .map_err(|_| HeaderError::InvalidContentLength)?;
                match found {
                    Some(prev) if prev != n => return Err(HeaderError::InvalidContentLength),
                    _ => found = Some(n),
                }
            }
        }
        Ok(found)
    }

    /// Whether `name` is hop-by-hop: one of [`HOP_BY_HOP`], any `Proxy-*`, or a
    /// name listed in one of this list's `Connection` headers.
    pub fn is_hop_by_hop(&self, name: &str) -> bool {
        is_hop_by_hop_name(name)
            || self
                .get_all("connection")
                .flat_map(|v| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(name))
    }

    /// Whether the list holds a hop-by-hop header (see
    /// [`Headers::is_hop_by_hop`]): whether [`Headers::without_hop_by_hop`]
    /// would drop one. Without an allocation.
    pub fn has_hop_by_hop(&self) -> bool {
        // A header `Connection` lists is hop-by-hop only when `Connection`
        // is there, and `Connection` is one by itself.
        self.iter().any(|(n, _)| is_hop_by_hop_name(n))
    }

    /// This list minus hop-by-hop headers (see [`Headers::is_hop_by_hop`]).
    pub fn without_hop_by_hop(&self) -> Headers {
        if !self.has_hop_by_hop() {
            return self.clone();
        }
        // `Connection` names more hop-by-hop headers only when it is there:
        // without it each name is judged by itself.
        let listed = self.get("connection").is_some();
        self.filtered(|n| {
            !if listed {
                self.is_hop_by_hop(n)
            } else {
                is_hop_by_hop_name(n)
            }
        })
    }

    /// Drops the hop-by-hop headers in place ([`Headers::without_hop_by_hop`]
    /// without a copy when there is none).
    pub fn strip_hop_by_hop(&mut self) {
        if self.has_hop_by_hop() {
            *self = self.without_hop_by_hop();
        }
    }

    /// The pairs, consuming the list.
    pub fn into_vec(self) -> Vec<(String, String)> {
        self.iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect()
    }
}

/// Whether a header name is hop-by-hop by itself (not counting `Connection` tokens).
pub fn is_hop_by_hop_name(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
        || name
            .get(..6)
            .is_some_and(|p| p.eq_ignore_ascii_case("proxy-"))
}

impl TryFrom<Vec<(String, String)>> for Headers {
    type Error = HeaderError;
    fn try_from(v: Vec<(String, String)>) -> Result<Headers, HeaderError> {
        Headers::try_from_pairs(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Headers {
        Headers::try_from_pairs(pairs.iter().copied()).unwrap()
    }

    #[test]
    fn tokens() {
        assert!(is_token("content-type"));
        assert!(is_token("X_Weird!#$%&'*+.^`|~9"));
        assert!(!is_token(""));
        assert!(!is_token("bad name"));
        assert!(!is_token("bad:name"));
        assert!(!is_token("naïve"));
    }

    #[test]
    fn values_must_be_latin1_without_crlf_nul() {
        let mut hs = Headers::new();
        assert_eq!(hs.try_push("a", "caf\u{e9}"), Ok(()));
        assert_eq!(hs.try_push("b", "tab\tok"), Ok(()));
        assert_eq!(
            hs.try_push("c", "\u{100}"),
            Err(HeaderError::NotLatin1 { index: 2 })
        );
        assert_eq!(
            hs.try_push("c", "x\r\ny: z"),
            Err(HeaderError::ForbiddenChar { index: 2 })
        );
        assert_eq!(
            hs.try_push("c", "x\ny"),
            Err(HeaderError::ForbiddenChar { index: 2 })
        );
        assert_eq!(
            hs.try_push("c", "x\0"),
            Err(HeaderError::ForbiddenChar { index: 2 })
        );
        assert_eq!(
            hs.try_push("c d", "x"),
            Err(HeaderError::InvalidName { index: 2 })
        );
        assert_eq!(hs.len(), 2);
    }

    #[test]
    fn raw_round_trip_latin1() {
        let raw: Vec<(&[u8], &[u8])> = vec![(b"x-a", b"\xe9t\xe9"), (b"x-b", b"plain")];
        let hs = Headers::try_from_raw(raw.iter().copied()).unwrap();
        assert_eq!(hs.get("X-A"), Some("\u{e9}t\u{e9}"));
        let back: Vec<(Vec<u8>, Vec<u8>)> = hs.iter_raw().map(|(n, v)| (n.to_vec(), v)).collect();
        assert_eq!(back[0], (b"x-a".to_vec(), b"\xe9t\xe9".to_vec()));
        assert_eq!(back[1].1, b"plain".to_vec());
        assert!(Headers::try_from_raw([(&b"a"[..], &b"x\r\n"[..])]).is_err());
        assert!(Headers::try_from_raw([(&b"\xff"[..], &b"x"[..])]).is_err());
    }

    #[test]
    fn repeats_keep_order() {
        let hs = h(&[("set-cookie", "a"), ("x", "1"), ("Set-Cookie", "b")]);
        assert_eq!(hs.get_all("SET-COOKIE").collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(
            serde_json::to_string(&hs).unwrap(),
            r#"[["set-cookie","a"],["x","1"],["Set-Cookie","b"]]"#
        );
    }

    #[test]
    fn hop_by_hop_filter() {
        let hs = h(&[
            ("Host", "x"),
            ("Connection", "keep-alive, X-Private"),
            ("Keep-Alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("UPGRADE", "websocket"),
            ("te", "trailers"),
            ("Trailer", "x"),
            ("Proxy-Authorization", "secret"),
            ("proxy-connection", "x"),
            ("x-private", "1"),
            ("Authorization", "Bearer t"),
            ("content-length", "3"),
        ]);
        let kept = hs.without_hop_by_hop();
        let names: Vec<&str> = kept.iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["Host", "Authorization", "content-length"]);
        assert!(!is_hop_by_hop_name("proxy"));
        assert!(is_hop_by_hop_name("PROXY-x"));
    }

    #[test]
    fn content_length() {
        assert_eq!(h(&[]).content_length(), Ok(None));
        assert_eq!(
            h(&[("Content-Length", "42")]).content_length(),
            Ok(Some(42))
        );
        assert_eq!(
            h(&[("content-length", "42"), ("CONTENT-LENGTH", "42")]).content_length(),
            Ok(Some(42))
        );
        assert_eq!(
            h(&[("content-length", "42, 42")]).content_length(),
            Ok(Some(42))
        );
        let bad = Err(HeaderError::InvalidContentLength);
        assert_eq!(
            h(&[("content-length", "42"), ("content-length", "43")]).content_length(),
            bad
        );
        assert_eq!(h(&[("content-length", "4x")]).content_length(), bad);
        assert_eq!(h(&[("content-length", "-1")]).content_length(), bad);
        assert_eq!(h(&[("content-length", "")]).content_length(), bad);
        assert_eq!(
            h(&[("content-length", "99999999999999999999999")]).content_length(),
            bad
        );
    }

    mod props {
        use super::super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;

        proptest! {
        #[test]
        fn latin1_round_trips(bytes in vec(any::<u8>(), 0..200)) {
            let s = latin1_to_string(&bytes);
            prop_assert_eq!(s.chars().count(), bytes.len());
            prop_assert!(s.chars().all(|c| u32::from(c) <= 0xff));
            prop_assert_eq!(string_to_latin1(&s), Some(bytes.clone()));

            let value: Vec<u8> = bytes.iter().copied().filter(|b| !matches!(b, b'\r' | b'\n' | 0)).collect();
            let h = Headers::try_from_raw([(&b"x-raw"[..], &value[..])]).unwrap();
            let back: Vec<(Vec<u8>, Vec<u8>)> = h.iter_raw().map(|(n, v)| (n.to_vec(), v)).collect();
            prop_assert_eq!(back, vec![(b"x-raw".to_vec(), value)]);
        }

        /// `strip_hop_by_hop` (in place, no copy when there is nothing to
        /// drop) drops exactly what `without_hop_by_hop` does, and
        /// `has_hop_by_hop` says whether there is any.
        #[test]
        fn stripping_in_place_drops_what_the_copy_drops(
            pairs in vec((prop::sample::select(vec![
                "connection", "Connection", "keep-alive", "te", "x-a", "X-A", "proxy-x",
                "content-length", "upgrade", "host", "x-b",
            ]), prop::sample::select(vec!["", "x-a", "close, X-B", "keep-alive", " x-a , te", "1"])), 0..8),
        ) {
            let h = Headers::try_from_pairs(pairs).unwrap();
            let copy = h.without_hop_by_hop();
            prop_assert_eq!(h.has_hop_by_hop(), copy != h);
            let mut stripped = h.clone();
            stripped.strip_hop_by_hop();
            prop_assert_eq!(stripped, copy);
        }

        #[test]
        fn string_to_latin1_refuses_wider_chars(s in any::<String>()) {
            let wide = s.chars().any(|c| u32::from(c) > 0xff);
            prop_assert_eq!(string_to_latin1(&s).is_none(), wide);
        }
            }
    }
}
