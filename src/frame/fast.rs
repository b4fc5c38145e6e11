//! The fast path of control-frame decoding (issue 28): a scanner for the
//! plain JSON objects peers actually send (known fields, each at most once,
//! strings without escapes, unsigned integers, headers as `[name, value]`
//! string pairs, whose strings may hold the escapes `\"`, `\\` and `\/`: an
//! ETag is quoted). Strings are borrowed from the message and the headers
//! written straight into their one buffer; no `serde` machinery runs.
//!
//! Anything else — an escape, an unknown or repeated field, a `null`, a
//! float, a wrong type, a header list over its [`HeadLimits`], malformed
//! JSON — makes the scanner give up (`None`), and the `serde` path
//! ([`RawFrame::parse`]) decodes the text: it stays the reference, and
//! every error comes from it. A differential test and the `frame_decode`
//! fuzz target hold the two to the same answers.

use super::head_limits::{header_line_len, HeadLimits};
use super::raw::{LHeaders, LNum, LStr, RawFrame, MAX_HEADER_PREALLOC};
use super::Headers;
use std::borrow::Cow;

/// Scans `text` as a control frame, or gives up (`None`).
pub(crate) fn scan<'a>(text: &'a str, limits: Option<&HeadLimits>) -> Option<RawFrame<'a>> {
    let mut s = Scanner {
        b: text.as_bytes(),
        text,
        at: 0,
    };
    let mut f = RawFrame::default();
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if s.peek()? == b'}' {
        s.at += 1;
    } else {
        loop {
            let key = s.string()?;
            s.ws();
            s.eat(b':')?;
            s.ws();
            match key {
                "type" if f.ty.is_none() => f.ty = Some(LStr::Str(Cow::Borrowed(s.string()?))),
                "id" if f.id.is_none() => f.id = Some(LNum::U(s.uint()?)),
                "method" if f.method.is_none() => {
                    f.method = Some(LStr::Str(Cow::Borrowed(s.string()?)))
                }
                "path" if f.path.is_none() => f.path = Some(LStr::Str(Cow::Borrowed(s.string()?))),
                "query" if f.query.is_none() => {
                    f.query = Some(LStr::Str(Cow::Borrowed(s.string()?)))
                }
                "status" if f.status.is_none() => f.status = Some(LNum::U(s.uint()?)),
                "headers" if f.headers.is_none() => f.headers = Some(s.headers(limits)?),
                _ => return None,
            }
            s.ws();
            match s.next()? {
                b',' => s.ws(),
                b'}' => break,
                _ => return None,
            }
        }
    }
    s.ws();
    (s.at == s.b.len()).then_some(f)
}

struct Scanner<'a> {
    b: &'a [u8],
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.at += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    /// JSON whitespace.
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A string without escapes or control characters, borrowed.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        let end = start + string_end(&self.b[start..])?;
        if self.b[end] != b'"' {
            return None; // an escape or a raw control character: the reference decides
        }
        self.at = end + 1;
        // Both ends are ASCII quotes, so both are char boundaries.
        Some(&self.text[start..end])
    }

    /// A string whose only escapes are `\"`, `\\` and `\/` (a quoted
    /// ETag, a file name in quotes), borrowed when it has none; a raw
    /// control character or another escape gives up.
    fn string_cow(&mut self) -> Option<Cow<'a, str>> {
        self.eat(b'"')?;
        let mut start = self.at;
        let mut end = start + string_end(&self.b[start..])?;
        if self.b[end] == b'"' {
            self.at = end + 1;
            return Some(Cow::Borrowed(&self.text[start..end]));
        }
        let mut out = String::new();
        loop {
            // `end` and `start` are at ASCII bytes: char boundaries.
            match self.b[end] {
                b'"' => {
                    out.push_str(&self.text[start..end]);
                    self.at = end + 1;
                    return Some(Cow::Owned(out));
                }
                b'\\' => {
                    let c = match self.b.get(end + 1)? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        _ => return None,
                    };
                    out.push_str(&self.text[start..end]);
                    out.push(c);
                    start = end + 2;
                }
                _ => return None,
            }
            end = start + string_end(self.b.get(start..)?)?;
        }
    }

    /// An unsigned JSON integer (no sign, fraction or exponent) that fits a u64.
    fn uint(&mut self) -> Option<u64> {
        let start = self.at;
        let mut v: u64 = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.at += 1;
        }
        let digits = self.at - start;
        if digits == 0 || (digits > 1 && self.b[start] == b'0') {
            return None;
        }
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(v)
    }

    /// `[[name, value], …]` into one [`Headers`] buffer, held to `limits`
    /// as the reference holds them (over a bound: give up, and let it say so).
    fn headers(&mut self, limits: Option<&HeadLimits>) -> Option<LHeaders> {
        self.eat(b'[')?;
        self.ws();
        // Room for the rest of the message's text (the pairs are in it),
        // within the reference's bound: a head kept while its request is
        // served does not hold on to a large message's length.
        let room = (self.b.len() - self.at).min(MAX_HEADER_PREALLOC);
        let mut h = Headers::with_capacity(16, room);
        let mut invalid = None;
        let (mut count, mut bytes) = (0usize, 0usize);
        if self.peek()? == b']' {
            self.at += 1;
            return Some(LHeaders::Ok(h));
        }
        loop {
            self.eat(b'[')?;
            self.ws();
            let name = self.string_cow()?;
            self.ws();
            self.eat(b',')?;
            self.ws();
            let value = self.string_cow()?;
            self.ws();
            self.eat(b']')?;
            count += 1;
            bytes += header_line_len(&name, &value);
            if limits.is_some_and(|l| l.header_fits(count, bytes).is_some()) {
                return None;
            }
            if invalid.is_none() {
                invalid = h.try_push(&*name, &*value).err();
            }
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b']' => break,
                _ => return None,
            }
        }
        Some(match invalid {
            Some(e) => LHeaders::Invalid(e),
            None => LHeaders::Ok(h),
        })
    }
}

/// Where the first `"`, `\\` or control character (below 0x20) of `b` is:
/// eight bytes at a time, then byte by byte.
fn string_end(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` is zero (or, for `below`, under `n`): its high bit is set
    // in the result. Bits above the first such byte may be set wrongly (a
    // borrow); the lowest one is right, and only it is used.
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGHS;
    let mut at = 0;
    while let Some(word) = b.get(at..at + 8) {
        let x = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        let hits = zero(x ^ (ONES * u64::from(b'"')))
            | zero(x ^ (ONES * u64::from(b'\\')))
            | below(x, 0x20);
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    b[at..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|i| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{ControlFrame, RequestHead, StreamId};

    fn request_text() -> String {
        let headers = Headers::try_from_pairs([
            ("authorization", "Bearer t"),
            ("x-a", "caf\u{e9}"),
            ("x-a", ""),
        ])
        .unwrap();
        ControlFrame::Request {
            id: StreamId::new(7).unwrap(),
            head: RequestHead::new("POST", "/v1/execute", "a=1", headers).unwrap(),
        }
        .encode()
    }

    #[test]
    fn plain_frames_are_scanned_as_this_crate_and_python_write_them() {
        let ours = request_text();
        let f = scan(&ours, None).expect("our encoding is scanned");
        assert!(matches!(f.ty, Some(LStr::Str(Cow::Borrowed("request")))));
        assert!(matches!(f.id, Some(LNum::U(7))));
        let Some(LHeaders::Ok(h)) = f.headers else {
            panic!("headers")
        };
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            [
                ("authorization", "Bearer t"),
                ("x-a", "caf\u{e9}"),
                ("x-a", "")
            ]
        );
        // json.dumps' default separators, with the keys in another order.
        let python = r#"{"id": 7, "type": "response", "headers": [["content-type", "text/plain"]], "status": 200}"#;
        assert!(matches!(
            scan(python, None),
            Some(RawFrame {
                status: Some(LNum::U(200)),
                ..
            })
        ));
        assert!(scan(r#" {"type":"end","id":4294967295} "#, None).is_some());
        assert!(scan("{}", None).is_some());
    }

    #[test]
    fn a_head_reserves_no_more_than_the_reference_bound() {
        // The headers first, then half a MiB of path: a head kept while its
        // request is served holds its pairs, not the message's length.
        let text = format!(
            r#"{{"type":"request","id":1,"headers":[["a","b"]],"method":"GET","path":"/{}","query":""}}"#,
            "p".repeat(512 << 10)
        );
        let Some(RawFrame {
            headers: Some(LHeaders::Ok(h)),
            ..
        }) = scan(&text, None)
        else {
            panic!("scanned")
        };
        assert!(
            h.text_capacity() <= MAX_HEADER_PREALLOC,
            "{} bytes reserved",
            h.text_capacity()
        );
    }

    #[test]
    fn anything_unusual_is_left_to_the_reference() {
        for text in [
            r#"{"type":"end","id":7,"x":1}"#,              // an unknown field
            r#"{"type":"end","id":7,"id":8}"#,             // a repeated one
            r#"{"type":"end","id":7.0}"#,                  // a float
            r#"{"type":"end","id":-7}"#,                   // a sign
            r#"{"type":"end","id":07}"#,                   // a leading zero
            r#"{"type":"end","id":99999999999999999999}"#, // over u64
            r#"{"type":"\u0065nd","id":7}"#,               // an escape
            r#"{"type":"end","id":null}"#,                 // null
            r#"{"type":"end","id":7,}"#,                   // a trailing comma
            r#"{"type":"end","id":7}x"#,                   // trailing bytes
            r#"{"type":"response","id":7,"status":200,"headers":[["a"]]}"#,
            r#"{"type":"response","id":7,"status":200,"headers":[["a","b","c"]]}"#,
            "{\"type\":\"end\",\"id\":7,\"method\":\"a\u{1}\"}", // a raw control char
            r#"{"type":"end","id":7"#,                           // cut short
        ] {
            assert!(scan(text, None).is_none(), "{text}");
        }
    }

    #[test]
    fn string_end_finds_the_first_stop_byte_as_a_plain_scan_does() {
        let plain = |b: &[u8]| b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..40 {
            for _ in 0..200 {
                let b: Vec<u8> = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        // Mostly text, sometimes a stop byte or a high one.
                        match seed % 16 {
                            0 => b'"',
                            1 => b'\\',
                            2 => (seed >> 8) as u8 % 0x20,
                            3 => 0x80 | (seed >> 8) as u8,
                            _ => 0x20 + (seed >> 8) as u8 % 0x5f,
                        }
                    })
                    .collect();
                assert_eq!(string_end(&b), plain(&b), "{b:?}");
            }
        }
    }

    #[test]
    fn quoted_header_strings_are_scanned_and_other_escapes_left_to_the_reference() {
        let text = r#"{"type":"response","id":3,"status":200,"headers":[["etag","\"66f-2\""],["x-path","a\/b\\c"],["content-type","text/plain"]]}"#;
        let Some(RawFrame {
            headers: Some(LHeaders::Ok(h)),
            ..
        }) = scan(text, None)
        else {
            panic!("scanned")
        };
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            [
                ("etag", "\"66f-2\""),
                ("x-path", "a/b\\c"),
                ("content-type", "text/plain")
            ]
        );
        assert_eq!(
            crate::frame::decode_text(text),
            crate::frame::decode_text_reference(text, None)
        );
        for other in [
            r#"{"type":"response","id":3,"status":200,"headers":[["x","a\nb"]]}"#,
            r#"{"type":"response","id":3,"status":200,"headers":[["x","\u0041"]]}"#,
            r#"{"type":"response","id":3,"status":200,"headers":[["x","a\"]]}"#,
            r#"{"type":"response","id":3,"status":200,"headers":[["x","a\"#,
            r#"{"type":"response","id":3,"status":200,"headers":[["\u0078","a"]]}"#,
        ] {
            assert!(scan(other, None).is_none(), "{other}");
        }
    }

    #[test]
    fn a_header_list_over_its_limits_is_left_to_the_reference() {
        let text = request_text();
        let mut l = HeadLimits {
            max_headers: 2,
            ..HeadLimits::default()
        };
        assert!(scan(&text, Some(&l)).is_none());
        l.max_headers = 3;
        assert!(scan(&text, Some(&l)).is_some());
    }
}
